/* api_tools.c - tool calling and reasoning content for chat: request fields, template variables,
 * the call formats, and the output parser (a state machine fed text in any pieces). */
#include "daemon/api_tools.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/err.h"
#include "common/tok.h"
#include "common/util.h"
#include "daemon/api.h"

const char *api_tool_format_name(enum api_tool_format f)
{
    switch (f) {
    case API_TOOL_FMT_HERMES: return "hermes";
    case API_TOOL_FMT_LLAMA3: return "llama3_json";
    case API_TOOL_FMT_MISTRAL: return "mistral";
    default: return "none";
    }
}

/* --- request fields ------------------------------------------------------------------------ */

/* a 400 naming param: "PARAM must be WHAT, got VALUE" (v NULL: "got nothing") */
static int must(struct api_error *err, const char *param, const cJSON *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int must(struct api_error *err, const char *param, const cJSON *v, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char *got = v ? cJSON_PrintUnformatted(v) : NULL;
    api_error_set(err, 400, param, "%s must be %s, got %.60s%s", param, what, got ? got : "nothing",
                  got && strlen(got) > 60 ? "..." : "");
    free(got);
    return RKV_EINVAL;
}

/* a 400 naming param, with its own message */
#define fail(err, param, v, ...) (api_error_set(err, 400, param, __VA_ARGS__), RKV_EINVAL)

static const cJSON *get(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* keys of o outside ok[] (NULL-terminated): a 400 naming the first */
static int only_keys(struct api_error *err, const cJSON *o, const char *param,
                     const char *const *ok, const char *list)
{
    for (const cJSON *c = o->child; c; c = c->next) {
        int known = 0;
        for (size_t k = 0; ok[k]; k++)
            known |= !strcmp(c->string, ok[k]);
        if (!known) {
            char p[192];
            snprintf(p, sizeof p, "%s.%.60s", param, c->string);
            api_error_set(err, 400, p, "unknown field '%s'; rkv knows %s", p, list);
            return RKV_EINVAL;
        }
    }
    return 0;
}

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > API_TOOL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-')
            return 0;
    return 1;
}

static int parse_tool(const cJSON *tv, size_t i, struct api_tools *t, struct api_error *err)
{
    static const char *const tool_keys[] = {"type", "function", NULL};
    static const char *const fn_keys[] = {"name", "description", "parameters", "strict", NULL};
    char param[64], fp[96];
    snprintf(param, sizeof param, "tools[%zu]", i);
    if (!cJSON_IsObject(tv))
        return must(err, param, tv, "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    int rc = only_keys(err, tv, param, tool_keys, "type and function");
    if (rc)
        return rc;
    const cJSON *type = get(tv, "type");
    snprintf(fp, sizeof fp, "%s.type", param);
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return must(err, fp, type, "\"function\" (the only tool type rkv serves)");
    const cJSON *fn = get(tv, "function");
    snprintf(fp, sizeof fp, "%s.function", param);
    if (!cJSON_IsObject(fn))
        return must(err, fp, fn, "an object {\"name\", \"description\", \"parameters\"}");
    if ((rc = only_keys(err, fn, fp, fn_keys, "name, description, parameters, strict")))
        return rc;
    const cJSON *name = get(fn, "name");
    snprintf(fp, sizeof fp, "%s.function.name", param);
    if (!cJSON_IsString(name) || !valid_name(name->valuestring))
        return must(err, fp, name, "1 to 64 characters of a-z, A-Z, 0-9, _ and -");
    for (size_t k = 0; k < t->n_tools; k++)
        if (!strcmp(t->names[k], name->valuestring))
            return fail(err, fp, NULL,
                        "%s: the name '%s' is also tools[%zu]'s; give each tool its own name", fp,
                        name->valuestring, k);
    const cJSON *v = get(fn, "description");
    snprintf(fp, sizeof fp, "%s.function.description", param);
    if (v && !cJSON_IsString(v))
        return must(err, fp, v, "a string");
    v = get(fn, "parameters");
    snprintf(fp, sizeof fp, "%s.function.parameters", param);
    if (v && !cJSON_IsObject(v))
        return must(err, fp, v, "a JSON schema object like {\"type\": \"object\", ...}");
    v = get(fn, "strict");
    snprintf(fp, sizeof fp, "%s.function.strict", param);
    if (v && !cJSON_IsBool(v))
        return must(err, fp, v, "true or false");
    t->names[t->n_tools] = strdup(name->valuestring);
    if (!t->names[t->n_tools])
        return RKV_ENOMEM;
    t->n_tools++;
    return 0;
}

static int parse_tools(const cJSON *root, struct api_tools *t, struct api_error *err)
{
    const cJSON *v = get(root, "tools");
    if (!v)
        return 0;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > API_TOOLS_MAX)
        return must(err, "tools", v, "an array of at most %d tools", API_TOOLS_MAX);
    if (n == 0)
        return 0;
    t->names = calloc((size_t)n, sizeof *t->names);
    if (!t->names)
        return RKV_ENOMEM;
    size_t i = 0;
    for (const cJSON *tv = v->child; tv; tv = tv->next, i++) {
        int rc = parse_tool(tv, i, t, err);
        if (rc)
            return rc;
    }
    t->tools_json = cJSON_PrintUnformatted(v);
    return t->tools_json ? 0 : RKV_ENOMEM;
}

static int parse_choice(const cJSON *root, struct api_tools *t, struct api_error *err)
{
    const cJSON *v = get(root, "tool_choice");
    t->choice = t->n_tools ? API_TOOL_CHOICE_AUTO : API_TOOL_CHOICE_NONE;
    if (!v)
        return 0;
    static const char *const names[] = {"auto", "none", "required"};
    int named = 0;
    if (cJSON_IsString(v)) {
        int k = 0;
        while (k < 3 && strcmp(v->valuestring, names[k]))
            k++;
        if (k == 3)
            return must(err, "tool_choice", v,
                        "\"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}");
        t->choice = (enum api_tool_choice)k;
    } else if (cJSON_IsObject(v)) {
        const cJSON *type = get(v, "type"), *fn = get(v, "function");
        const cJSON *name = cJSON_IsObject(fn) ? get(fn, "name") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            return must(err, "tool_choice", v,
                        "{\"type\": \"function\", \"function\": {\"name\": NAME}}");
        size_t k = 0;
        while (k < t->n_tools && strcmp(t->names[k], name->valuestring))
            k++;
        if (k == t->n_tools)
            return fail(err, "tool_choice.function.name", NULL,
                        "tool_choice.function.name '%.64s' is not one of the request's tools; "
                        "name a function listed in tools",
                        name->valuestring);
        if (!(t->choice_name = strdup(name->valuestring)))
            return RKV_ENOMEM;
        t->choice = API_TOOL_CHOICE_NAMED;
        named = 1;
    } else {
        return must(err, "tool_choice", v, "a string or an object");
    }
    if ((named || t->choice == API_TOOL_CHOICE_REQUIRED) && !t->n_tools)
        return fail(err, "tool_choice", NULL,
                    "tool_choice \"%s\" needs tools; send tools or tool_choice \"auto\"",
                    named ? "function" : "required");
    if (t->choice == API_TOOL_CHOICE_AUTO && !t->n_tools)
        t->choice = API_TOOL_CHOICE_NONE;
    return 0;
}

static int parse_kwargs(const cJSON *root, struct api_tools *t, struct api_error *err)
{
    static const char *const reserved[] = {"messages",  "tools",     "add_generation_prompt",
                                           "bos_token", "eos_token", NULL};
    const cJSON *v = get(root, "chat_template_kwargs");
    if (v) {
        if (!cJSON_IsObject(v))
            return must(err, "chat_template_kwargs", v,
                        "an object of template variables like {\"enable_thinking\": false}");
        for (const cJSON *c = v->child; c; c = c->next)
            for (size_t k = 0; reserved[k]; k++)
                if (!strcmp(c->string, reserved[k])) {
                    char p[96];
                    snprintf(p, sizeof p, "chat_template_kwargs.%s", reserved[k]);
                    return fail(err, p, NULL,
                                "%s: '%s' is set by rkv from the request itself; send it as its "
                                "own field, not as a template variable",
                                p, reserved[k]);
                }
        if (v->child && !(t->kwargs_json = cJSON_PrintUnformatted(v)))
            return RKV_ENOMEM;
    }
    v = get(root, "reasoning_effort");
    if (v) {
        if (!cJSON_IsString(v) ||
            (strcmp(v->valuestring, "low") && strcmp(v->valuestring, "medium") &&
             strcmp(v->valuestring, "high")))
            return must(err, "reasoning_effort", v, "\"low\", \"medium\" or \"high\"");
        if (!(t->reasoning_effort = strdup(v->valuestring)))
            return RKV_ENOMEM;
    }
    return 0;
}

int api_tools_parse(const cJSON *root, struct api_request *r, struct api_error *err)
{
    const cJSON *v;
    if ((v = get(root, "functions")) && !(cJSON_IsArray(v) && !v->child)) {
        api_error_set(err, 400, "functions",
                      "functions (OpenAI's old function calling) is not supported by rkv; send "
                      "the same functions as tools: [{\"type\": \"function\", \"function\": "
                      "{...}}]");
        err->code = "unsupported_parameter";
        return RKV_EINVAL;
    }
    if ((v = get(root, "function_call")) &&
        !(cJSON_IsString(v) &&
          (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto")))) {
        api_error_set(err, 400, "function_call",
                      "function_call is not supported by rkv; use tool_choice with tools");
        err->code = "unsupported_parameter";
        return RKV_EINVAL;
    }
    struct api_tools *t = calloc(1, sizeof *t);
    if (!t)
        return RKV_ENOMEM;
    r->tools = t;
    t->parallel = true;
    int rc;
    if ((rc = parse_tools(root, t, err)) || (rc = parse_choice(root, t, err)) ||
        (rc = parse_kwargs(root, t, err)))
        return rc;
    if ((v = get(root, "parallel_tool_calls"))) {
        if (!cJSON_IsBool(v))
            return must(err, "parallel_tool_calls", v, "true or false");
        t->parallel = cJSON_IsTrue(v);
    }
    return 0;
}

void api_tools_free(struct api_tools *t)
{
    if (!t)
        return;
    free(t->tools_json);
    for (size_t i = 0; i < t->n_tools; i++)
        free(t->names[i]);
    free(t->names);
    free(t->choice_name);
    free(t->kwargs_json);
    free(t->reasoning_effort);
    free(t);
}

/* one entry of an assistant message's tool_calls, into the template's shape */
static int parse_msg_call(const cJSON *cv, const char *param, cJSON *calls, struct api_error *err)
{
    static const char *const keys[] = {"id", "type", "function", NULL};
    char fp[192];
    if (!cJSON_IsObject(cv))
        return must(err, param, cv,
                    "{\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    int rc = only_keys(err, cv, param, keys, "id, type, function");
    if (rc)
        return rc;
    const cJSON *id = get(cv, "id"), *type = get(cv, "type"), *fn = get(cv, "function");
    snprintf(fp, sizeof fp, "%s.id", param);
    if (!cJSON_IsString(id))
        return must(err, fp, id, "a string (the id a tool message answers with tool_call_id)");
    snprintf(fp, sizeof fp, "%s.type", param);
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function")))
        return must(err, fp, type, "\"function\"");
    snprintf(fp, sizeof fp, "%s.function", param);
    const cJSON *name = cJSON_IsObject(fn) ? get(fn, "name") : NULL;
    const cJSON *args = cJSON_IsObject(fn) ? get(fn, "arguments") : NULL;
    if (!cJSON_IsString(name))
        return must(err, fp, fn, "{\"name\": NAME, \"arguments\": \"{...}\"}");
    snprintf(fp, sizeof fp, "%s.function.arguments", param);
    cJSON *parsed = NULL;
    if (cJSON_IsString(args))
        parsed = cJSON_Parse(args->valuestring);
    else if (!args)
        parsed = cJSON_CreateObject();
    if (!parsed)
        return must(err, fp, args, "a string holding a JSON value (the call's arguments)");
    cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
    if (!o || !f || !cJSON_AddItemToArray(calls, o)) {
        cJSON_Delete(o);
        cJSON_Delete(f);
        cJSON_Delete(parsed);
        return RKV_ENOMEM;
    }
    cJSON_AddStringToObject(o, "id", id->valuestring);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddItemToObject(o, "function", f);
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON_AddItemToObject(f, "arguments", parsed);
    return 0;
}

int api_tools_parse_message(const cJSON *mo, const char *param, struct api_message *m,
                            struct api_error *err)
{
    const cJSON *tc = get(mo, "tool_calls"), *tid = get(mo, "tool_call_id"),
                *name = get(mo, "name");
    char fp[160];
    if (!(tc && !(cJSON_IsArray(tc) && !tc->child)) && !tid && !name)
        return 0;
    cJSON *extra = cJSON_CreateObject();
    if (!extra)
        return RKV_ENOMEM;
    int rc = 0;
    if (tc && !(cJSON_IsArray(tc) && !tc->child)) {
        snprintf(fp, sizeof fp, "%s.tool_calls", param);
        cJSON *calls = cJSON_AddArrayToObject(extra, "tool_calls");
        if (m->role != API_ROLE_ASSISTANT)
            rc = fail(err, fp, NULL, "%s: only an assistant message carries tool_calls", fp);
        else if (!cJSON_IsArray(tc))
            rc = must(err, fp, tc, "an array of {\"id\", \"type\", \"function\"}");
        size_t i = 0;
        for (const cJSON *cv = tc->child; !rc && cv; cv = cv->next, i++) {
            char cp[176];
            snprintf(cp, sizeof cp, "%s[%zu]", fp, i);
            rc = calls ? parse_msg_call(cv, cp, calls, err) : RKV_ENOMEM;
        }
    }
    if (!rc && tid) {
        snprintf(fp, sizeof fp, "%s.tool_call_id", param);
        if (m->role != API_ROLE_TOOL)
            rc = fail(err, fp, NULL, "%s: only a tool message carries tool_call_id", fp);
        else if (!cJSON_IsString(tid))
            rc = must(err, fp, tid, "a string (the id of the call this message answers)");
        else if (!cJSON_AddStringToObject(extra, "tool_call_id", tid->valuestring))
            rc = RKV_ENOMEM;
    }
    if (!rc && name) {
        snprintf(fp, sizeof fp, "%s.name", param);
        if (!cJSON_IsString(name))
            rc = must(err, fp, name, "a string");
        else if (!cJSON_AddStringToObject(extra, "name", name->valuestring))
            rc = RKV_ENOMEM;
    }
    if (!rc && !(m->extra_json = cJSON_PrintUnformatted(extra)))
        rc = RKV_ENOMEM;
    cJSON_Delete(extra);
    return rc;
}

/* --- rendering ----------------------------------------------------------------------------- */

enum api_tool_format api_tools_detect(const char *tmpl)
{
    if (!tmpl)
        return API_TOOL_FMT_NONE;
    if (strstr(tmpl, "<tool_call>"))
        return API_TOOL_FMT_HERMES;
    if (strstr(tmpl, "[TOOL_CALLS]"))
        return API_TOOL_FMT_MISTRAL;
    if (strstr(tmpl, "<|python_tag|>") ||
        (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "tools")))
        return API_TOOL_FMT_LLAMA3;
    return API_TOOL_FMT_NONE;
}

/* {"tools": [...], "reasoning_effort": ..., chat_template_kwargs...}, NULL when empty */
static int template_vars(const struct api_tools *t, char **out)
{
    *out = NULL;
    if (!t || (!t->tools_json && !t->reasoning_effort && !t->kwargs_json))
        return 0;
    cJSON *o = t->kwargs_json ? cJSON_Parse(t->kwargs_json) : cJSON_CreateObject();
    if (!o)
        return RKV_ENOMEM;
    cJSON *tools = t->tools_json ? cJSON_Parse(t->tools_json) : NULL;
    if (tools)
        cJSON_AddItemToObject(o, "tools", tools);
    if (t->reasoning_effort && !get(o, "reasoning_effort"))
        cJSON_AddStringToObject(o, "reasoning_effort", t->reasoning_effort);
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return *out ? 0 : RKV_ENOMEM;
}

/* 1 when the prompt ends inside an open <think> block (DeepSeek-R1's templates open it) */
static int ends_in_think(const char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    return n >= 7 && !memcmp(s + n - 7, "<think>", 7);
}

int api_tools_render(const struct tok *t, const struct api_request *r, char **text, int *status,
                     char *why, size_t whylen)
{
    struct api_tools *tl = r->tools;
    const char *src = tok_chat_template_src(t);
    *status = 400;
    if (tl && tl->tools_json && (!src || !strstr(src, "tools"))) {
        snprintf(why, whylen,
                 "tools: the model's chat template has no tool support (it never reads the "
                 "'tools' variable%s); start rkvd with a template that renders tools "
                 "(--chat-template FILE, the chat_template config key; see docs/operations.md) "
                 "or leave tools out",
                 src ? "" : ": the model has no Jinja template and renders a built-in family");
        return RKV_EUNSUPPORTED;
    }
    struct tok_chat_msg *m = calloc(r->n_messages ? r->n_messages : 1, sizeof *m);
    char *vars = NULL;
    int rc = m ? template_vars(tl, &vars) : RKV_ENOMEM;
    for (size_t i = 0; rc == 0 && i < r->n_messages; i++) {
        m[i].role = r->messages[i].role_name;
        m[i].content = r->messages[i].content;
        m[i].extra_json = r->messages[i].extra_json;
    }
    char err[400] = "";
    if (rc == 0)
        rc = tok_chat_render_vars(t, m, r->n_messages, r->add_generation_prompt, vars, text, err,
                                  sizeof err);
    free(m);
    free(vars);
    if (rc) {
        if (rc == RKV_ENOMEM)
            *status = 500;
        snprintf(why, whylen, "cannot render the chat template for these messages: %s",
                 err[0] ? err : rkv_strerror(rc));
        return rc;
    }
    if (tl) {
        tl->format = api_tools_detect(src);
        tl->parse_calls =
            tl->tools_json && tl->choice != API_TOOL_CHOICE_NONE && tl->format != API_TOOL_FMT_NONE;
        tl->reasoning = src && strstr(src, "<think>") && strstr(src, "</think>");
        tl->starts_in_reasoning = tl->reasoning && ends_in_think(*text);
    }
    return 0;
}

/* --- constrained decoding ------------------------------------------------------------------ */

int api_tools_forces_call(const struct api_tools *t)
{
    return t && t->n_tools &&
           (t->choice == API_TOOL_CHOICE_REQUIRED || t->choice == API_TOOL_CHOICE_NAMED);
}

/* the schema of one call object of tool k: {"name": const, args: its parameters} */
static cJSON *call_schema(const cJSON *tool, const char *args_key)
{
    const cJSON *fn = get(tool, "function");
    const cJSON *params = get(fn, "parameters");
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(s, "properties");
    cJSON *name = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(name, "const", get(fn, "name")->valuestring);
    cJSON_AddItemToObject(props, args_key,
                          params ? cJSON_Duplicate(params, 1)
                                 : cJSON_Parse("{\"type\":\"object\"}"));
    cJSON *req = cJSON_AddArrayToObject(s, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
    cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

int api_tools_constraint(const struct api_tools *t, struct api_tool_constraint *out)
{
    memset(out, 0, sizeof *out);
    if (!t || !t->tools_json ||
        (t->choice != API_TOOL_CHOICE_REQUIRED && t->choice != API_TOOL_CHOICE_NAMED))
        return RKV_EINVAL;
    const char *args_key = "arguments";
    switch (t->format) {
    case API_TOOL_FMT_HERMES:
        out->prefix = "<tool_call>\n";
        out->suffix = "\n</tool_call>";
        break;
    case API_TOOL_FMT_LLAMA3:
        out->prefix = "";
        out->suffix = "";
        args_key = "parameters";
        break;
    case API_TOOL_FMT_MISTRAL:
        /* the JSON-list form: one call in the list */
        out->prefix = "[TOOL_CALLS][";
        out->suffix = "]";
        break;
    default: return RKV_EINVAL;
    }
    cJSON *tools = cJSON_Parse(t->tools_json);
    if (!tools)
        return RKV_ENOMEM;
    cJSON *schema = NULL;
    if (t->choice == API_TOOL_CHOICE_NAMED) {
        for (const cJSON *tv = tools->child; tv && !schema; tv = tv->next)
            if (!strcmp(get(get(tv, "function"), "name")->valuestring, t->choice_name))
                schema = call_schema(tv, args_key);
    } else {
        schema = cJSON_CreateObject();
        cJSON *any = cJSON_AddArrayToObject(schema, "anyOf");
        for (const cJSON *tv = tools->child; tv; tv = tv->next)
            cJSON_AddItemToArray(any, call_schema(tv, args_key));
    }
    cJSON_Delete(tools);
    out->schema = schema ? cJSON_PrintUnformatted(schema) : NULL;
    cJSON_Delete(schema);
    return out->schema ? 0 : RKV_ENOMEM;
}

void api_tools_call_id(char *buf, size_t cap)
{
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static uint64_t counter;
    unsigned char rnd[24];
    if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        uint64_t c = ++counter;
        memset(rnd, 0, sizeof rnd);
        memcpy(rnd, &c, sizeof c);
    }
    int n = snprintf(buf, cap, "call_");
    for (size_t i = 0; i < sizeof rnd && (size_t)n + 1 < cap; i++)
        buf[n++] = al[rnd[i] % (sizeof al - 1)];
    if (cap)
        buf[(size_t)n < cap ? (size_t)n : cap - 1] = 0;
}

/* --- the output parser ------------------------------------------------------------------------
 *
 * states: START (the output's first bytes: an opening <think>?), REASON (inside <think>),
 * CONTENT (text; a call marker switches to CALL), CALL (the call's text, until its end marker
 * or the end of the output). buf holds what is not decided yet: a possible marker's start in
 * REASON/CONTENT, the whole call in CALL, since a call that does not parse goes out as content.
 */

enum { S_START, S_REASON, S_CONTENT, S_CALL };

struct api_tparse {
    enum api_tool_format fmt;
    bool calls, reasoning, starts_in_reasoning, parallel;
    int state;
    char *buf;
    size_t len, cap;
    const char *open; /* the marker that opened the call ("" for a bare llama3 call) */
    bool emitted;     /* content sent since the output started */
    bool skip_ws;     /* drop whitespace before the next content (after </think>, a call) */
    size_t scanned;   /* CALL: bytes of buf already searched for the end marker */
    int n_calls;
};

int api_tparse_create(const struct api_tools *t, struct api_tparse **out)
{
    struct api_tparse *p = calloc(1, sizeof *p);
    if (!p)
        return RKV_ENOMEM;
    if (t) {
        p->fmt = t->format;
        p->calls = t->parse_calls;
        p->reasoning = t->reasoning;
        p->starts_in_reasoning = t->starts_in_reasoning;
        p->parallel = t->parallel;
    }
    p->state = S_START;
    *out = p;
    return 0;
}

void api_tparse_destroy(struct api_tparse *p)
{
    if (p) {
        free(p->buf);
        free(p);
    }
}

int api_tparse_calls(const struct api_tparse *p)
{
    return p->n_calls;
}

static void consume(struct api_tparse *p, size_t n)
{
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
}

/* bytes at the end of s that start marker m (a proper prefix of it) */
static size_t partial_tail(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k))
            return k;
    return 0;
}

static int emit_text(enum api_tev_kind kind, const char *s, size_t n, api_tev_fn fn, void *ud)
{
    if (!n)
        return 0;
    struct api_tev ev = {.kind = kind, .text = s, .len = n};
    return fn(ud, &ev);
}

/* the call object {"name", "arguments" | "parameters"} -> name and arguments text */
static int call_of(const cJSON *o, const char **name, char **args)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!a)
        a = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(n) || !valid_name(n->valuestring))
        return -1;
    cJSON *parsed = NULL;
    if (cJSON_IsString(a)) {
        parsed = cJSON_Parse(a->valuestring);
        if (!cJSON_IsObject(parsed)) {
            cJSON_Delete(parsed);
            return -1;
        }
        a = parsed;
    } else if (a && !cJSON_IsObject(a)) {
        return -1;
    }
    *name = n->valuestring;
    *args = a ? cJSON_PrintUnformatted(a) : strdup("{}");
    cJSON_Delete(parsed);
    return *args ? 0 : RKV_ENOMEM;
}

/* a list of parsed calls, emitted together once the whole body parsed */
struct calls {
    cJSON *objs; /* array of {"name", "arguments"} with arguments as text */
};

static int calls_add(struct calls *c, const char *name, const char *args, size_t args_len)
{
    cJSON *o = cJSON_CreateObject();
    char *a = strndup(args, args_len);
    if (!o || !a || !cJSON_AddItemToArray(c->objs, o)) {
        cJSON_Delete(o);
        free(a);
        return RKV_ENOMEM;
    }
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "arguments", a);
    free(a);
    return 0;
}

static int calls_add_obj(struct calls *c, const cJSON *o)
{
    const char *name;
    char *args;
    int rc = call_of(o, &name, &args);
    if (rc)
        return rc;
    rc = calls_add(c, name, args, strlen(args));
    free(args);
    return rc;
}

/* one JSON value at the start of s[0..n): its end in *end; NULL when it does not parse */
static cJSON *json_prefix(const char *s, size_t n, const char **end)
{
    const char *e = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &e, 0);
    *end = e;
    return v;
}

static const char *skip_ws(const char *s, const char *e)
{
    while (s < e && isspace((unsigned char)*s))
        s++;
    return s;
}

/* a whole JSON value filling s[0..n) but for blanks */
static cJSON *json_whole(const char *s, size_t n)
{
    const char *b = skip_ws(s, s + n), *end;
    cJSON *v = json_prefix(b, (size_t)(s + n - b), &end);
    if (v && skip_ws(end, s + n) != s + n) {
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

/* hermes: one {"name", "arguments"} object */
static int body_hermes(const char *s, size_t n, struct calls *c)
{
    cJSON *v = json_whole(s, n);
    int rc = v ? calls_add_obj(c, v) : -1;
    cJSON_Delete(v);
    return rc;
}

/* llama 3: objects separated by ';' */
static int body_llama3(const char *s, size_t n, struct calls *c)
{
    const char *p = s, *e = s + n;
    for (;;) {
        p = skip_ws(p, e);
        const char *end;
        cJSON *v = p < e && *p == '{' ? json_prefix(p, (size_t)(e - p), &end) : NULL;
        int rc = v ? calls_add_obj(c, v) : -1;
        cJSON_Delete(v);
        if (rc)
            return rc;
        p = skip_ws(end, e);
        if (p == e)
            return 0;
        if (*p != ';')
            return -1;
        p++;
    }
}

/* mistral: a JSON list, or NAME[ARGS]{...} (NAME[CALL_ID]ID[ARGS]{...}) repeated, each after
 * an optional [TOOL_CALLS] */
static int body_mistral(const char *s, size_t n, struct calls *c)
{
    const char *p = skip_ws(s, s + n), *e = s + n;
    if (p < e && *p == '[') {
        cJSON *v = json_whole(p, (size_t)(e - p));
        int rc = cJSON_IsArray(v) && v->child ? 0 : -1;
        for (const cJSON *o = v ? v->child : NULL; !rc && o; o = o->next)
            rc = calls_add_obj(c, o);
        cJSON_Delete(v);
        return rc;
    }
    while (p < e) {
        const char *name = p;
        while (p < e && (isalnum((unsigned char)*p) || *p == '_' || *p == '-'))
            p++;
        size_t name_len = (size_t)(p - name);
        if (!name_len || name_len > API_TOOL_NAME_MAX)
            return -1;
        if ((size_t)(e - p) >= 9 && !memcmp(p, "[CALL_ID]", 9)) {
            p += 9;
            while (p < e && *p != '[')
                p++;
        }
        if ((size_t)(e - p) < 6 || memcmp(p, "[ARGS]", 6))
            return -1;
        p += 6;
        const char *end;
        cJSON *v = json_prefix(p, (size_t)(e - p), &end);
        int ok = cJSON_IsObject(v);
        cJSON_Delete(v);
        if (!ok)
            return -1;
        char nm[API_TOOL_NAME_MAX + 1];
        memcpy(nm, name, name_len);
        nm[name_len] = 0;
        /* the arguments as the model wrote them, re-printed compact */
        cJSON *a = json_whole(p, (size_t)(end - p));
        char *txt = a ? cJSON_PrintUnformatted(a) : NULL;
        cJSON_Delete(a);
        int rc = txt ? calls_add(c, nm, txt, strlen(txt)) : RKV_ENOMEM;
        free(txt);
        if (rc)
            return rc;
        p = skip_ws(end, e);
        if ((size_t)(e - p) >= 12 && !memcmp(p, "[TOOL_CALLS]", 12))
            p = skip_ws(p + 12, e);
    }
    return 0;
}

/* the call region buf[0..n) is over: its calls, or, when it does not parse, its text (with
 * the marker that opened it) as content */
static int close_call(struct api_tparse *p, size_t n, const char *close, api_tev_fn fn, void *ud)
{
    struct calls c = {cJSON_CreateArray()};
    if (!c.objs)
        return RKV_ENOMEM;
    int rc;
    switch (p->fmt) {
    case API_TOOL_FMT_HERMES: rc = body_hermes(p->buf, n, &c); break;
    case API_TOOL_FMT_LLAMA3: rc = body_llama3(p->buf, n, &c); break;
    default: rc = body_mistral(p->buf, n, &c); break;
    }
    if (rc == RKV_ENOMEM) {
        cJSON_Delete(c.objs);
        return rc;
    }
    if (rc) {
        /* never lose text: what looked like a call is content */
        rc = emit_text(API_TEV_CONTENT, p->open, strlen(p->open), fn, ud);
        if (!rc)
            rc = emit_text(API_TEV_CONTENT, p->buf, n, fn, ud);
        if (!rc && close)
            rc = emit_text(API_TEV_CONTENT, close, strlen(close), fn, ud);
        p->emitted = true;
    } else {
        for (const cJSON *o = c.objs->child; !rc && o; o = o->next) {
            if (!p->parallel && p->n_calls > 0)
                break;
            char id[API_TOOL_ID_LEN + 1];
            api_tools_call_id(id, sizeof id);
            struct api_tev ev = {.kind = API_TEV_CALL, .index = p->n_calls, .id = id};
            ev.name = cJSON_GetObjectItemCaseSensitive(o, "name")->valuestring;
            ev.arguments = cJSON_GetObjectItemCaseSensitive(o, "arguments")->valuestring;
            p->n_calls++;
            rc = fn(ud, &ev);
        }
        p->skip_ws = true;
    }
    cJSON_Delete(c.objs);
    return rc;
}

static const char *call_marker(enum api_tool_format f)
{
    switch (f) {
    case API_TOOL_FMT_HERMES: return "<tool_call>";
    case API_TOOL_FMT_MISTRAL: return "[TOOL_CALLS]";
    case API_TOOL_FMT_LLAMA3: return "<|python_tag|>";
    default: return NULL;
    }
}

int api_tools_keeps_token(const struct api_tools *t, const char *s, size_t n)
{
    static const struct {
        enum api_tool_format fmt; /* NONE: reasoning markup */
        const char *text;
    } marks[] = {
        {API_TOOL_FMT_HERMES, "<tool_call>"},   {API_TOOL_FMT_HERMES, "</tool_call>"},
        {API_TOOL_FMT_MISTRAL, "[TOOL_CALLS]"}, {API_TOOL_FMT_MISTRAL, "[ARGS]"},
        {API_TOOL_FMT_MISTRAL, "[CALL_ID]"},    {API_TOOL_FMT_LLAMA3, "<|python_tag|>"},
        {API_TOOL_FMT_NONE, "<think>"},         {API_TOOL_FMT_NONE, "</think>"},
    };
    if (!t)
        return 0;
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        int on = marks[i].fmt == API_TOOL_FMT_NONE ? t->reasoning
                                                   : t->parse_calls && t->format == marks[i].fmt;
        if (on && strlen(marks[i].text) == n && !memcmp(marks[i].text, s, n))
            return 1;
    }
    return 0;
}

/* one step of the machine: 1 to step again, 0 to wait for more text, < 0 an error */
static int step(struct api_tparse *p, int final, api_tev_fn fn, void *ud)
{
    static const char think_open[] = "<think>", think_close[] = "</think>";
    if (p->state == S_START) {
        if (p->starts_in_reasoning) {
            p->state = S_REASON;
            return 1;
        }
        if (p->reasoning) {
            size_t k = p->len < 7 ? p->len : 7;
            if (!memcmp(p->buf, think_open, k) && k < 7 && !final)
                return 0;
            if (k == 7 && !memcmp(p->buf, think_open, 7)) {
                consume(p, 7);
                p->state = S_REASON;
                return 1;
            }
        }
        p->state = S_CONTENT;
        return 1;
    }
    if (p->state == S_REASON) {
        char *at = memmem(p->buf, p->len, think_close, 8);
        if (at) {
            size_t k = (size_t)(at - p->buf);
            int rc = emit_text(API_TEV_REASONING, p->buf, k, fn, ud);
            consume(p, k + 8);
            p->state = S_CONTENT;
            p->skip_ws = true;
            return rc < 0 ? rc : 1;
        }
        size_t hold = final ? 0 : partial_tail(p->buf, p->len, think_close);
        int rc = emit_text(API_TEV_REASONING, p->buf, p->len - hold, fn, ud);
        consume(p, p->len - hold);
        return rc < 0 ? rc : 0;
    }
    if (p->state == S_CONTENT) {
        if (p->skip_ws) {
            size_t k = 0;
            while (k < p->len && isspace((unsigned char)p->buf[k]))
                k++;
            consume(p, k);
            if (!p->len)
                return 0;
            p->skip_ws = false;
        }
        const char *m = p->calls ? call_marker(p->fmt) : NULL;
        if (m && p->fmt == API_TOOL_FMT_LLAMA3 && !p->emitted && p->n_calls == 0) {
            /* llama 3 writes a bare JSON call as the whole answer */
            const char *s = skip_ws(p->buf, p->buf + p->len);
            if (s == p->buf + p->len && !final)
                return 0;
            if (s < p->buf + p->len && *s == '{') {
                p->open = "";
                p->state = S_CALL;
                return 1;
            }
        }
        char *at = m ? memmem(p->buf, p->len, m, strlen(m)) : NULL;
        if (at) {
            size_t k = (size_t)(at - p->buf);
            int rc = emit_text(API_TEV_CONTENT, p->buf, k, fn, ud);
            p->emitted |= k > 0;
            consume(p, k + strlen(m));
            p->open = m;
            p->state = S_CALL;
            return rc < 0 ? rc : 1;
        }
        size_t hold = m && !final ? partial_tail(p->buf, p->len, m) : 0;
        int rc = emit_text(API_TEV_CONTENT, p->buf, p->len - hold, fn, ud);
        p->emitted |= p->len > hold;
        consume(p, p->len - hold);
        return rc < 0 ? rc : 0;
    }
    /* S_CALL */
    if (p->fmt == API_TOOL_FMT_HERMES) {
        static const char close[] = "</tool_call>";
        /* a long call comes in many pieces: search only what may hold a new end marker */
        size_t from = p->scanned > sizeof close - 2 ? p->scanned - (sizeof close - 2) : 0;
        char *at = memmem(p->buf + from, p->len - from, close, sizeof close - 1);
        p->scanned = p->len;
        if (!at && !final)
            return 0;
        p->scanned = 0;
        size_t k = at ? (size_t)(at - p->buf) : p->len;
        int rc = close_call(p, k, at ? close : NULL, fn, ud);
        consume(p, at ? k + sizeof close - 1 : k);
        p->state = S_CONTENT;
        return rc < 0 ? rc : 1;
    }
    if (!final)
        return 0;
    int rc = close_call(p, p->len, NULL, fn, ud);
    consume(p, p->len);
    p->state = S_CONTENT;
    return rc < 0 ? rc : 0;
}

static int run(struct api_tparse *p, int final, api_tev_fn fn, void *ud)
{
    int rc;
    while ((rc = step(p, final, fn, ud)) == 1)
        ;
    return rc;
}

int api_tparse_feed(struct api_tparse *p, const char *text, size_t len, api_tev_fn fn, void *ud)
{
    if (rkv_grow((void **)&p->buf, &p->cap, p->len + len + 1, 256) < 0)
        return RKV_ENOMEM;
    memcpy(p->buf + p->len, text, len);
    p->len += len;
    return run(p, 0, fn, ud);
}

int api_tparse_finish(struct api_tparse *p, api_tev_fn fn, void *ud)
{
    /* an output without text still steps the machine, over an empty buffer */
    if (!p->buf && rkv_grow((void **)&p->buf, &p->cap, 1, 256) < 0)
        return RKV_ENOMEM;
    return run(p, 1, fn, ud);
}

/* --- what the parser's events become ----------------------------------------------------- */

/* {"id", "type": "function", "function": {"name", "arguments"}} (part 0: arguments "";
 * with index for a stream) */
static cJSON *call_json(const struct api_tev *ev, int index, int head, const char *args)
{
    cJSON *o = cJSON_CreateObject();
    if (index)
        cJSON_AddNumberToObject(o, "index", ev->index);
    if (head) {
        cJSON_AddStringToObject(o, "id", ev->id);
        cJSON_AddStringToObject(o, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(o, "function");
    if (head)
        cJSON_AddStringToObject(f, "name", ev->name);
    if (!cJSON_AddStringToObject(f, "arguments", args)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int api_tout_collect(void *ud, const struct api_tev *ev)
{
    struct api_tout *o = ud;
    if (ev->kind == API_TEV_CONTENT)
        return strbuf_add(&o->content, ev->text, ev->len);
    if (ev->kind == API_TEV_REASONING)
        return strbuf_add(&o->reasoning, ev->text, ev->len);
    if (!o->calls && !(o->calls = cJSON_CreateArray()))
        return RKV_ENOMEM;
    cJSON *c = call_json(ev, 0, 1, ev->arguments);
    return c && cJSON_AddItemToArray(o->calls, c) ? 0 : RKV_ENOMEM;
}

void api_tout_fini(struct api_tout *o)
{
    strbuf_fini(&o->content);
    strbuf_fini(&o->reasoning);
    cJSON_Delete(o->calls);
    memset(o, 0, sizeof *o);
}

int api_tout_message(const struct api_tout *o, cJSON *m)
{
    int ok;
    if (!o->content.n && (o->calls || o->reasoning.n))
        ok = cJSON_AddNullToObject(m, "content") != NULL;
    else
        ok = cJSON_AddStringToObject(m, "content", strbuf_str(&o->content)) != NULL;
    if (ok && o->reasoning.n)
        ok = cJSON_AddStringToObject(m, "reasoning_content", o->reasoning.s) != NULL;
    if (ok && o->calls)
        ok = cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(o->calls, 1));
    return ok ? 0 : RKV_ENOMEM;
}

cJSON *api_tev_delta(const struct api_tev *ev, int part)
{
    cJSON *d = cJSON_CreateObject();
    if (!d)
        return NULL;
    if (ev->kind != API_TEV_CALL) {
        char *s = strndup(ev->text, ev->len);
        cJSON *ok = s ? cJSON_AddStringToObject(
                            d, ev->kind == API_TEV_REASONING ? "reasoning_content" : "content", s)
                      : NULL;
        free(s);
        if (ok)
            return d;
    } else {
        cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
        cJSON *c = call_json(ev, 1, part == 0, part == 0 ? "" : ev->arguments);
        if (arr && c && cJSON_AddItemToArray(arr, c))
            return d;
        cJSON_Delete(c);
    }
    cJSON_Delete(d);
    return NULL;
}
