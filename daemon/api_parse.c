/* api_parse.c - OpenAI request bodies (completions, chat) into struct api_request, strictly
 * validated. */
#include "daemon/api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/json_schema.h"
#include "common/util.h"
#include "daemon/api_tools.h"
#include "proto/json.h"

void api_limits_default(struct api_limits *l)
{
    l->max_tokens = 32768;
    l->default_max_tokens = 16;
    l->max_prompt_tokens = 32768;
    l->vocab_size = 0;
}

void api_error_set(struct api_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
}

/* messages quote client bytes cut to a length, which can split a
 * character: the copy has '?' for bytes that are not valid UTF-8 */
static const char *utf8_copy(char *dst, const char *src, size_t cap)
{
    snprintf(dst, cap, "%s", src);
    size_t len = strlen(dst), at = 0, off = 0;
    while (!api_utf8_valid(dst + off, len - off, &at)) {
        dst[off + at] = '?';
        off += at + 1;
    }
    return dst;
}

char *api_error_json(const struct api_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (!err) {
        cJSON_Delete(root);
        return NULL;
    }
    char msg[sizeof(e->message)], param[sizeof(e->param)];
    cJSON_AddStringToObject(err, "message", utf8_copy(msg, e->message, sizeof(msg)));
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", utf8_copy(param, e->param, sizeof(param)));
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

int api_utf8_valid(const char *s, size_t len, size_t *bad_at)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            n = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            goto bad;
        }
        if (len - i <= n)
            goto bad;
        for (size_t k = 1; k <= n; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                goto bad;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            goto bad;
        i += n + 1;
    }
    return 1;
bad:
    if (bad_at)
        *bad_at = i;
    return 0;
}

/* --- validation helpers ---------------------------------------------------------------- */

struct parse {
    const struct api_limits *lim;
    struct api_error *err;
    enum api_endpoint ep;
};

/* the offending value, short, for "got ..." */
static void describe(const cJSON *v, char *buf, size_t cap)
{
    if (!v) {
        snprintf(buf, cap, "nothing");
        return;
    }
    if (cJSON_IsNumber(v)) {
        snprintf(buf, cap, "%.17g", v->valuedouble);
        return;
    }
    char *s = cJSON_PrintUnformatted(v);
    if (!s) {
        snprintf(buf, cap, "?");
        return;
    }
    if (strlen(s) > 60)
        snprintf(buf, cap, "%.57s...", s);
    else
        snprintf(buf, cap, "%s", s);
    free(s);
}

static int bad(struct parse *p, const char *param, const cJSON *v, const char *what)
{
    char got[80];
    describe(v, got, sizeof(got));
    api_error_set(p->err, 400, param, "%s must be %s, got %s", param, what, got);
    return RKV_EINVAL;
}

static int unsupported(struct parse *p, const char *param, const char *how)
{
    api_error_set(p->err, 400, param, "%s is not supported by rkv; %s", param, how);
    p->err->code = "unsupported_parameter";
    return RKV_EINVAL;
}

static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int is_int(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= lo &&
           v->valuedouble <= hi;
}

static int get_int(struct parse *p, const cJSON *obj, const char *name, long lo, long hi, int *out)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return 0;
    if (!is_int(v, (double)lo, (double)hi)) {
        char what[64];
        snprintf(what, sizeof(what), "an integer in [%ld, %ld]", lo, hi);
        return bad(p, name, v, what);
    }
    *out = (int)v->valuedouble;
    return 0;
}

/* a number in [lo, hi], or (lo, hi] when lo_open */
static int get_num(struct parse *p, const cJSON *obj, const char *name, double lo, int lo_open,
                   double hi, float *out)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d <= hi && (lo_open ? d > lo : d >= lo))) {
        char what[64];
        snprintf(what, sizeof(what), "a number in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
        return bad(p, name, v, what);
    }
    *out = (float)d;
    return 0;
}

static int get_bool(struct parse *p, const cJSON *obj, const char *name, bool *out)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return bad(p, name, v, "true or false");
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_str(struct parse *p, const cJSON *obj, const char *name, char **out)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return 0;
    if (!cJSON_IsString(v))
        return bad(p, name, v, "a string");
    *out = strdup(v->valuestring);
    if (!*out) {
        api_error_set(p->err, 500, NULL, "out of memory");
        return RKV_ENOMEM;
    }
    return 0;
}

/* --- which fields exist ---------------------------------------------------------------- */

#define EP_C   (1u << API_COMPLETIONS)
#define EP_CH  (1u << API_CHAT)
#define EP_ALL (EP_C | EP_CH)

static const struct {
    const char *name;
    unsigned eps;
} known_fields[] = {
    /* implemented */
    {"model", EP_ALL},
    {"prompt", EP_C},
    {"messages", EP_CH},
    {"max_tokens", EP_ALL},
    {"max_completion_tokens", EP_CH},
    {"temperature", EP_ALL},
    {"top_p", EP_ALL},
    {"top_k", EP_ALL},
    {"min_p", EP_ALL},
    {"seed", EP_ALL},
    {"stop", EP_ALL},
    {"presence_penalty", EP_ALL},
    {"frequency_penalty", EP_ALL},
    {"repetition_penalty", EP_ALL},
    {"logprobs", EP_ALL},
    {"top_logprobs", EP_CH},
    {"n", EP_ALL},
    {"stream", EP_ALL},
    {"stream_options", EP_ALL},
    {"user", EP_ALL},
    {"session_id", EP_ALL},
    {"ignore_eos", EP_ALL},
    /* ignored: they do not change the tokens */
    {"metadata", EP_ALL},
    {"store", EP_ALL},
    {"service_tier", EP_ALL},
    {"prompt_cache_key", EP_ALL},
    {"safety_identifier", EP_ALL},
    {"echo", EP_C},
    /* tool calling and reasoning (api_tools_parse) */
    {"tools", EP_CH},
    {"tool_choice", EP_CH},
    {"parallel_tool_calls", EP_CH},
    {"functions", EP_CH},
    {"function_call", EP_CH},
    {"chat_template_kwargs", EP_CH},
    {"reasoning_effort", EP_CH},
    /* unsupported unless "off" (checked in check_unsupported) */
    {"best_of", EP_C},
    {"suffix", EP_C},
    {"logit_bias", EP_ALL},
    {"response_format", EP_ALL},
    {"modalities", EP_CH},
    {"audio", EP_CH},
    {"prediction", EP_CH},
    {"web_search_options", EP_CH},
    /* vLLM extensions, accepted at their default (vllm_defaults below) */
    {"skip_special_tokens", EP_ALL},
    {"spaces_between_special_tokens", EP_ALL},
    {"include_stop_str_in_output", EP_ALL},
    {"min_tokens", EP_ALL},
    {"stop_token_ids", EP_ALL},
    {"add_generation_prompt", EP_CH},
};

static int check_known(struct parse *p, const cJSON *root)
{
    for (const cJSON *c = root->child; c; c = c->next) {
        int ok = 0;
        for (size_t i = 0; i < sizeof(known_fields) / sizeof(known_fields[0]); i++)
            if ((known_fields[i].eps & (1u << p->ep)) &&
                strcmp(c->string, known_fields[i].name) == 0)
                ok = 1;
        if (!ok) {
            char param[64];
            snprintf(param, sizeof(param), "%.63s", c->string);
            api_error_set(p->err, 400, param,
                          "unknown field '%.80s' for %s; rkv rejects fields it does not know so "
                          "that a typo cannot pass silently (see docs/api.md for the list)",
                          c->string,
                          p->ep == API_CHAT ? "/v1/chat/completions" : "/v1/completions");
            return RKV_EINVAL;
        }
    }
    return 0;
}

static int is_str(const cJSON *v, const char *s)
{
    return cJSON_IsString(v) && strcmp(v->valuestring, s) == 0;
}

/* fields rkv knows but cannot honour: fine when "off", 400 otherwise */
static int check_unsupported(struct parse *p, const cJSON *root)
{
    const cJSON *v;
    if ((v = field(root, "modalities")) &&
        !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && is_str(v->child, "text")))
        return unsupported(p, "modalities", "rkv serves text only; send [\"text\"]");
    if (field(root, "audio"))
        return unsupported(p, "audio", "rkv serves text only; leave it out");
    if (field(root, "prediction"))
        return unsupported(p, "prediction", "leave it out");
    if (field(root, "web_search_options"))
        return unsupported(p, "web_search_options", "leave it out");
    /* clients written for vLLM often send its extensions at their defaults */
    static const struct {
        const char *name;
        int want; /* 1: true, 0: false, 2: the number 0, 3: [] */
    } vllm_defaults[] = {
        {"skip_special_tokens", 1},
        {"spaces_between_special_tokens", 1},
        {"add_generation_prompt", 1},
        {"include_stop_str_in_output", 0},
        {"min_tokens", 2},
        {"stop_token_ids", 3},
    };
    for (size_t i = 0; i < sizeof(vllm_defaults) / sizeof(vllm_defaults[0]); i++) {
        if (!(v = field(root, vllm_defaults[i].name)))
            continue;
        int w = vllm_defaults[i].want;
        int ok = w == 1   ? cJSON_IsTrue(v)
                 : w == 0 ? cJSON_IsFalse(v)
                 : w == 2 ? is_int(v, 0, 0)
                          : cJSON_IsArray(v) && !v->child;
        if (!ok) {
            static const char *const dflt[] = {"false", "true", "0", "[]"};
            char how[64];
            snprintf(how, sizeof(how), "leave it out or send %s", dflt[w]);
            return unsupported(p, vllm_defaults[i].name, how);
        }
    }
    return 0;
}

/* --- the fields both endpoints share ---------------------------------------------------- */

static int add_stop(struct parse *p, struct api_request *r, const char *s)
{
    r->stop[r->n_stop] = strdup(s);
    if (!r->stop[r->n_stop]) {
        api_error_set(p->err, 500, NULL, "out of memory");
        return RKV_ENOMEM;
    }
    r->n_stop++;
    return 0;
}

static int parse_stop(struct parse *p, const cJSON *root, struct api_request *r)
{
    const cJSON *v = field(root, "stop");
    if (!v)
        return 0;
    static const char what[] = "a string or an array of at most 8 non-empty strings "
                               "of at most 256 bytes";
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0] || strlen(v->valuestring) > API_MAX_STOP_BYTES)
            return bad(p, "stop", v, what);
        return add_stop(p, r, v->valuestring);
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > API_MAX_STOP)
        return bad(p, "stop", v, what);
    for (const cJSON *s = v->child; s; s = s->next) {
        if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) > API_MAX_STOP_BYTES)
            return bad(p, "stop", v, what);
        if (add_stop(p, r, s->valuestring))
            return RKV_ENOMEM;
    }
    return 0;
}

/* response_format: text, json_object or json_schema, as OpenAI takes it; the JSON modes
 * become the GBNF grammar every sampled token must keep the answer a prefix of */
static int parse_response_format(struct parse *p, const cJSON *root, struct api_request *r)
{
    const cJSON *v = field(root, "response_format");
    if (!v)
        return 0;
    if (!cJSON_IsObject(v))
        return bad(p, "response_format", v,
                   "an object: {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                   "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., "
                   "\"schema\": {...}}}");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    for (const cJSON *c = v->child; c; c = c->next)
        if (strcmp(c->string, "type") && strcmp(c->string, "json_schema")) {
            api_error_set(p->err, 400, "response_format",
                          "response_format has an unknown field '%.80s' (it takes type and, for "
                          "json_schema, json_schema)",
                          c->string);
            return RKV_EINVAL;
        }
    if (is_str(t, "text"))
        return 0;
    const char *gbnf = NULL;
    char *made = NULL;
    if (is_str(t, "json_object")) {
        gbnf = json_schema_any_object_gbnf();
    } else if (is_str(t, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
        if (!cJSON_IsObject(js))
            return bad(p, "response_format.json_schema", js ? js : v,
                       "an object {\"name\": ..., \"schema\": {...}, \"strict\": true}");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        size_t nl = cJSON_IsString(name) ? strlen(name->valuestring) : 0;
        int name_ok = nl >= 1 && nl <= 64;
        for (size_t i = 0; name_ok && i < nl; i++) {
            char c = name->valuestring[i];
            name_ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-';
        }
        if (!name_ok)
            return bad(p, "response_format.json_schema.name", name ? name : js,
                       "a string of 1 to 64 letters, digits, '_' or '-'");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return bad(p, "response_format.json_schema.strict", strict, "a boolean");
        for (const cJSON *c = js->child; c; c = c->next)
            if (strcmp(c->string, "name") && strcmp(c->string, "schema") &&
                strcmp(c->string, "strict") && strcmp(c->string, "description")) {
                api_error_set(p->err, 400, "response_format.json_schema",
                              "response_format.json_schema has an unknown field '%.80s' (it "
                              "takes name, description, schema and strict)",
                              c->string);
                return RKV_EINVAL;
            }
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!schema || cJSON_IsNull(schema)) {
            gbnf = json_schema_any_object_gbnf(); /* no schema: any JSON object */
        } else {
            if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
                return bad(p, "response_format.json_schema.schema", schema,
                           "a JSON Schema object (docs/structured-output.md lists what rkv "
                           "supports)");
            char *text = cJSON_PrintUnformatted(schema);
            if (!text) {
                api_error_set(p->err, 500, NULL, "out of memory");
                return RKV_ENOMEM;
            }
            char why[400];
            int rc = json_schema_to_gbnf(text, strlen(text), &made, why, sizeof why);
            free(text);
            if (rc == RKV_ENOMEM) {
                api_error_set(p->err, 500, NULL, "out of memory");
                return rc;
            }
            if (rc) {
                api_error_set(p->err, 400, "response_format.json_schema.schema",
                              "response_format.json_schema.schema: %s (docs/structured-output.md "
                              "lists the JSON Schema rkv supports)",
                              why);
                return RKV_EINVAL;
            }
            if (strlen(made) > API_MAX_GRAMMAR) {
                free(made);
                api_error_set(p->err, 400, "response_format.json_schema.schema",
                              "response_format.json_schema.schema makes a grammar over %d "
                              "bytes; send a smaller schema",
                              API_MAX_GRAMMAR);
                return RKV_EINVAL;
            }
            gbnf = made;
        }
    } else {
        return bad(p, "response_format.type", t ? t : v,
                   "\"text\", \"json_object\" or \"json_schema\"");
    }
    r->grammar = made ? made : strdup(gbnf);
    if (!r->grammar) {
        api_error_set(p->err, 500, NULL, "out of memory");
        return RKV_ENOMEM;
    }
    return 0;
}

/* logit_bias: {"token id": bias}, as OpenAI takes it */
static int parse_logit_bias(struct parse *p, const cJSON *root, struct api_request *r)
{
    const cJSON *v = field(root, "logit_bias");
    if (!v)
        return 0;
    if (!cJSON_IsObject(v))
        return bad(p, "logit_bias", v,
                   "an object mapping token ids (strings) to a bias in [-100, 100]");
    size_t n = (size_t)cJSON_GetArraySize(v);
    if (n > API_MAX_LOGIT_BIAS) {
        api_error_set(p->err, 400, "logit_bias",
                      "logit_bias has %zu entries; the limit is %d (keep the tokens that matter)",
                      n, API_MAX_LOGIT_BIAS);
        return RKV_EINVAL;
    }
    if (n == 0)
        return 0;
    r->logit_bias = malloc(n * sizeof(*r->logit_bias));
    if (!r->logit_bias) {
        api_error_set(p->err, 500, NULL, "out of memory");
        return RKV_ENOMEM;
    }
    double hi = p->lim->vocab_size > 0 ? p->lim->vocab_size - 1 : 2147483647.0;
    for (const cJSON *e = v->child; e; e = e->next) {
        const char *k = e->string;
        char key[40];
        utf8_copy(key, k, sizeof key);
        /* decimal digits only, no sign, no leading zero: one spelling per id */
        size_t len = strlen(k), digits = strspn(k, "0123456789");
        double id = len && digits == len && len <= 10 && (k[0] != '0' || len == 1) ? atof(k) : -1;
        if (id < 0 || id > hi) {
            api_error_set(p->err, 400, "logit_bias",
                          "logit_bias key \"%s\" is not a token id: keys must be integers in "
                          "[0, %.0f] written as strings (POST /tokenize gives a text's ids)",
                          key, hi);
            return RKV_EINVAL;
        }
        double b = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(b >= -100 && b <= 100)) {
            char got[80];
            describe(e, got, sizeof(got));
            api_error_set(p->err, 400, "logit_bias",
                          "logit_bias[\"%s\"] must be a number in [-100, 100], got %s", key, got);
            return RKV_EINVAL;
        }
        for (size_t j = 0; j < r->n_logit_bias; j++)
            if (r->logit_bias[j].id == (int32_t)id) {
                api_error_set(p->err, 400, "logit_bias",
                              "logit_bias names token id %.0f twice; give each id once", id);
                return RKV_EINVAL;
            }
        r->logit_bias[r->n_logit_bias++] = (struct proto_bias){(int32_t)id, (float)b};
    }
    return 0;
}

static int parse_stream(struct parse *p, const cJSON *root, struct api_request *r)
{
    int rc = get_bool(p, root, "stream", &r->stream);
    if (rc)
        return rc;
    const cJSON *so = field(root, "stream_options");
    if (!so)
        return 0;
    if (!r->stream) {
        api_error_set(p->err, 400, "stream_options",
                      "stream_options is only allowed when stream is true");
        return RKV_EINVAL;
    }
    if (!cJSON_IsObject(so))
        return bad(p, "stream_options", so, "an object like {\"include_usage\": true}");
    for (const cJSON *c = so->child; c; c = c->next) {
        if (strcmp(c->string, "include_usage") != 0) {
            api_error_set(p->err, 400, "stream_options",
                          "unknown field 'stream_options.%.60s'; rkv knows include_usage",
                          c->string);
            return RKV_EINVAL;
        }
    }
    const cJSON *iu = field(so, "include_usage");
    if (iu && !cJSON_IsBool(iu))
        return bad(p, "stream_options.include_usage", iu, "true or false");
    r->include_usage = cJSON_IsTrue(iu);
    return 0;
}

static int parse_common(struct parse *p, const cJSON *root, struct api_request *r)
{
    const struct api_limits *lim = p->lim;
    int rc;
    const cJSON *v;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->top_k = -1;
    r->repetition_penalty = 1.0f;
    if ((rc = get_str(p, root, "model", &r->model)))
        return rc;
    if (r->model && !r->model[0])
        return bad(p, "model", field(root, "model"), "a model name from GET /v1/models");
    /* chat: max_completion_tokens is the current name, max_tokens the old one */
    const char *mt = p->ep == API_CHAT && field(root, "max_completion_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens";
    r->max_tokens = p->ep == API_CHAT || lim->default_max_tokens <= 0
                        ? lim->max_tokens
                        : RKV_MIN(lim->default_max_tokens, lim->max_tokens);
    if ((rc = get_int(p, root, mt, 1, lim->max_tokens, &r->max_tokens)))
        return rc;
    r->has_max_tokens = field(root, mt) != NULL;
    int old_mt = 0; /* the old name beside the new one: checked too, though the new one wins */
    if (strcmp(mt, "max_tokens") != 0 &&
        (rc = get_int(p, root, "max_tokens", 1, lim->max_tokens, &old_mt)))
        return rc;
    if ((rc = get_num(p, root, "temperature", 0, 0, 2, &r->temperature)) ||
        (rc = get_num(p, root, "top_p", 0, 1, 1, &r->top_p)) ||
        (rc = get_int(p, root, "top_k", -1, 1000000, &r->top_k)) ||
        (rc = get_num(p, root, "min_p", 0, 0, 1, &r->min_p)) ||
        (rc = get_num(p, root, "presence_penalty", -2, 0, 2, &r->presence_penalty)) ||
        (rc = get_num(p, root, "frequency_penalty", -2, 0, 2, &r->frequency_penalty)) ||
        (rc = get_num(p, root, "repetition_penalty", 0, 1, 10, &r->repetition_penalty)))
        return rc;
    if ((v = field(root, "seed"))) {
        /* doubles hold integers exactly up to 2^53 */
        if (!is_int(v, -9007199254740992.0, 9007199254740992.0))
            return bad(p, "seed", v, "an integer in [-2^53, 2^53]");
        r->has_seed = true;
        r->seed = (int64_t)v->valuedouble;
    }
    if ((rc = parse_stop(p, root, r)) || (rc = parse_logit_bias(p, root, r)) ||
        (rc = parse_response_format(p, root, r)) || (rc = parse_stream(p, root, r)) ||
        (rc = get_bool(p, root, "ignore_eos", &r->ignore_eos)) ||
        (rc = get_str(p, root, "user", &r->user)) ||
        (rc = get_str(p, root, "session_id", &r->session_id)))
        return rc;
    if (r->grammar && r->ignore_eos) {
        api_error_set(p->err, 400, "ignore_eos",
                      "ignore_eos cannot go with a JSON response_format: the answer ends where "
                      "its JSON ends; send one of them");
        return RKV_EINVAL;
    }
    if (r->session_id && !api_session_id_ok(r->session_id))
        return bad(p, "session_id", field(root, "session_id"),
                   "a string of 1 to 128 bytes without control characters");
    /* logprobs: an integer for completions, a boolean (+ top_logprobs) for chat */
    if (p->ep == API_COMPLETIONS) {
        if ((v = field(root, "logprobs"))) {
            if ((rc = get_int(p, root, "logprobs", 0, API_MAX_LOGPROBS, &r->top_logprobs)))
                return rc;
            r->logprobs = true;
        }
        if ((rc = get_bool(p, root, "echo", &r->echo)))
            return rc;
        /* OpenAI's echo with logprobs scores the prompt's tokens too */
        if (r->echo && r->logprobs)
            return unsupported(p, "echo",
                               "echo with logprobs needs the prompt's logprobs, which rkv does "
                               "not compute; send one of them");
    } else {
        if ((rc = get_bool(p, root, "logprobs", &r->logprobs)) ||
            (rc = get_int(p, root, "top_logprobs", 0, API_MAX_LOGPROBS, &r->top_logprobs)))
            return rc;
        if (r->top_logprobs > 0 && !r->logprobs) {
            api_error_set(p->err, 400, "top_logprobs",
                          "top_logprobs needs logprobs: true in the same request");
            return RKV_EINVAL;
        }
    }
    return 0;
}

/* --- completions: the prompt ------------------------------------------------------------ */

/* name: the field the ids came in ("prompt", "prompt[2]", "tokens") */
static int parse_ids(struct parse *p, const char *name, const cJSON *arr, int32_t **out,
                     size_t *n_out)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n > p->lim->max_prompt_tokens) {
        api_error_set(p->err, 400, name, "%s has %zu token ids; the limit is %zu", name, n,
                      p->lim->max_prompt_tokens);
        return RKV_EINVAL;
    }
    *out = malloc((n ? n : 1) * sizeof(int32_t));
    if (!*out) {
        api_error_set(p->err, 500, NULL, "out of memory");
        return RKV_ENOMEM;
    }
    double hi = p->lim->vocab_size > 0 ? p->lim->vocab_size - 1 : 2147483647.0;
    size_t i = 0;
    for (const cJSON *t = arr->child; t; t = t->next, i++) {
        if (!is_int(t, 0, hi)) {
            char what[96], param[48];
            snprintf(param, sizeof(param), "%s[%zu]", name, i);
            snprintf(what, sizeof(what), "a token id in [0, %.0f]", hi);
            return bad(p, param, t, what);
        }
        (*out)[i] = (int32_t)t->valuedouble;
    }
    *n_out = n;
    return 0;
}

static int parse_token_ids(struct parse *p, const char *name, const cJSON *arr,
                           struct api_request *r)
{
    return parse_ids(p, name, arr, &r->prompt_tokens, &r->n_prompt_tokens);
}

/* one prompt: a non-empty string or a non-empty array of token ids */
static int parse_one_prompt(struct parse *p, const char *name, const cJSON *v,
                            struct api_prompt *out)
{
    if (cJSON_IsString(v) && v->valuestring[0]) {
        out->text = strdup(v->valuestring);
        return out->text ? 0 : RKV_ENOMEM;
    }
    if (cJSON_IsArray(v) && v->child && cJSON_IsNumber(v->child))
        return parse_ids(p, name, v, &out->tokens, &out->n_tokens);
    return bad(p, name, v, "a non-empty string or a non-empty array of token ids");
}

/* a list of prompts: strings, or arrays of token ids, all of one kind */
static int parse_prompt_list(struct parse *p, const cJSON *v, struct api_request *r)
{
    size_t n = (size_t)cJSON_GetArraySize(v);
    if (n > API_MAX_PROMPTS) {
        api_error_set(p->err, 400, "prompt",
                      "prompt holds %zu prompts; send at most %d per request", n, API_MAX_PROMPTS);
        return RKV_EINVAL;
    }
    r->more_prompts = calloc(n - 1, sizeof *r->more_prompts);
    if (!r->more_prompts)
        return RKV_ENOMEM;
    int strings = cJSON_IsString(v->child);
    size_t i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        char name[32];
        snprintf(name, sizeof name, "prompt[%zu]", i);
        if (strings != cJSON_IsString(e))
            return bad(p, name, e,
                       strings ? "a string, as prompt[0] is (a list holds prompts of one kind)"
                               : "an array of token ids, as prompt[0] is (a list holds "
                                 "prompts of one kind)");
        struct api_prompt one = {0};
        int rc = parse_one_prompt(p, name, e, i ? &r->more_prompts[i - 1] : &one);
        if (i == 0) {
            r->prompt = one.text;
            r->prompt_tokens = one.tokens;
            r->n_prompt_tokens = one.n_tokens;
        } else {
            r->n_more_prompts = i;
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_prompt(struct parse *p, const cJSON *root, struct api_request *r)
{
    static const char what[] = "a non-empty string, an array of strings, an array of token ids, "
                               "or an array of arrays of token ids";
    const cJSON *v = field(root, "prompt");
    if (!v) {
        api_error_set(p->err, 400, "prompt", "prompt is required");
        return RKV_EINVAL;
    }
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
        (cJSON_IsString(v->child) || cJSON_IsArray(v->child))) {
        v = v->child; /* a batch of one */
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 1 &&
               (cJSON_IsString(v->child) || cJSON_IsArray(v->child))) {
        return parse_prompt_list(p, v, r);
    }
    if (cJSON_IsString(v) && v->valuestring[0]) {
        r->prompt = strdup(v->valuestring);
        return r->prompt ? 0 : RKV_ENOMEM;
    }
    if (cJSON_IsArray(v) && v->child && cJSON_IsNumber(v->child))
        return parse_token_ids(p, "prompt", v, r);
    return bad(p, "prompt", v, what);
}

/* n, best_of and suffix, after the prompt and the rest: they depend on stream and echo */
static int parse_fanout(struct parse *p, const cJSON *root, struct api_request *r)
{
    int rc;
    r->n = 1;
    if ((rc = get_int(p, root, "n", 1, API_MAX_N, &r->n)))
        return rc;
    r->best_of = r->n;
    if (p->ep != API_COMPLETIONS)
        return 0;
    if ((rc = get_int(p, root, "best_of", 1, API_MAX_N, &r->best_of)))
        return rc;
    if (r->best_of < r->n) {
        api_error_set(p->err, 400, "best_of",
                      "best_of (%d) must be at least n (%d): the n best of best_of sequences "
                      "are returned",
                      r->best_of, r->n);
        return RKV_EINVAL;
    }
    if (r->best_of > r->n && r->stream) {
        api_error_set(p->err, 400, "best_of",
                      "best_of > n cannot be streamed (the best are known only at the end); "
                      "send stream: false or best_of = n");
        return RKV_EINVAL;
    }
    size_t seqs = api_request_seqs(r);
    if (seqs > API_MAX_SEQS) {
        api_error_set(p->err, 400, r->best_of > r->n ? "best_of" : "n",
                      "%zu prompts x best_of %d is %zu sequences; one request may run at most "
                      "%d: send fewer prompts or a smaller n/best_of",
                      api_request_prompts(r), r->best_of, seqs, API_MAX_SEQS);
        return RKV_EINVAL;
    }
    if ((rc = get_str(p, root, "suffix", &r->suffix)))
        return rc;
    if (r->suffix && !r->suffix[0]) {
        free(r->suffix);
        r->suffix = NULL;
    }
    if (r->suffix && r->echo)
        return unsupported(p, "echo",
                           "echo with suffix has no single prompt text to echo; "
                           "send one of them");
    return 0;
}

size_t api_request_prompts(const struct api_request *r)
{
    return 1 + r->n_more_prompts;
}

void api_request_prompt(const struct api_request *r, size_t i, const char **text,
                        const int32_t **tokens, size_t *n_tokens)
{
    if (i == 0) {
        *text = r->prompt;
        *tokens = r->prompt_tokens;
        *n_tokens = r->n_prompt_tokens;
    } else {
        *text = r->more_prompts[i - 1].text;
        *tokens = r->more_prompts[i - 1].tokens;
        *n_tokens = r->more_prompts[i - 1].n_tokens;
    }
}

size_t api_request_seqs(const struct api_request *r)
{
    return api_request_prompts(r) * (size_t)(r->best_of > 0 ? r->best_of : 1);
}

/* --- chat: the messages ----------------------------------------------------------------- */

static int parse_content(struct parse *p, const cJSON *c, const char *param, struct api_message *m)
{
    if (cJSON_IsString(c)) {
        m->content = strdup(c->valuestring);
        return m->content ? 0 : RKV_ENOMEM;
    }
    if (!c || cJSON_IsNull(c)) {
        /* an assistant turn may carry no text (it called a tool, or refused) */
        if (m->role == API_ROLE_ASSISTANT) {
            m->content = strdup("");
            return m->content ? 0 : RKV_ENOMEM;
        }
        api_error_set(p->err, 400, param, "%s is required for role '%s'", param, m->role_name);
        return RKV_EINVAL;
    }
    if (!cJSON_IsArray(c))
        return bad(p, param, c, "a string or an array of {\"type\": \"text\", \"text\": ...}");
    /* text parts joined by newlines, as vLLM does */
    size_t total = 1, i = 0;
    for (const cJSON *part = c->child; part; part = part->next, i++) {
        char pp[136];
        snprintf(pp, sizeof(pp), "%s[%zu]", param, i);
        const cJSON *type =
            cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
        const cJSON *text =
            cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (cJSON_IsString(type) && !is_str(type, "text")) {
            char tp[144];
            snprintf(tp, sizeof(tp), "%s.type", pp);
            api_error_set(p->err, 400, tp,
                          "%s '%.40s' is not supported; rkv serves text models (use type "
                          "'text')",
                          tp, type->valuestring);
            p->err->code = "unsupported_parameter";
            return RKV_EINVAL;
        }
        if (!is_str(type, "text") || !cJSON_IsString(text))
            return bad(p, pp, part, "{\"type\": \"text\", \"text\": \"...\"}");
        total += strlen(text->valuestring) + 1;
    }
    m->content = malloc(total);
    if (!m->content)
        return RKV_ENOMEM;
    size_t off = 0;
    for (const cJSON *part = c->child; part; part = part->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        if (off)
            m->content[off++] = '\n';
        size_t n = strlen(t);
        memcpy(m->content + off, t, n);
        off += n;
    }
    m->content[off] = '\0';
    return 0;
}

static const struct {
    const char *name;
    const char *canon;
    enum api_role role;
} roles[] = {
    {"system", "system", API_ROLE_SYSTEM}, {"developer", "system", API_ROLE_SYSTEM},
    {"user", "user", API_ROLE_USER},       {"assistant", "assistant", API_ROLE_ASSISTANT},
    {"tool", "tool", API_ROLE_TOOL},
};

static int parse_message(struct parse *p, const cJSON *mo, size_t i, struct api_message *m)
{
    char param[96];
    snprintf(param, sizeof(param), "messages[%zu]", i);
    if (!cJSON_IsObject(mo))
        return bad(p, param, mo, "an object with role and content");
    for (const cJSON *c = mo->child; c; c = c->next) {
        static const char *const ok[] = {"role",       "content", "name",         "tool_call_id",
                                         "tool_calls", "refusal", "function_call"};
        int known = 0;
        for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++)
            known |= strcmp(c->string, ok[k]) == 0;
        if (!known) {
            char fp[160];
            snprintf(fp, sizeof(fp), "%s.%.60s", param, c->string);
            api_error_set(p->err, 400, fp,
                          "unknown field '%s' in a message; rkv knows role, "
                          "content, name, tool_calls, tool_call_id",
                          fp);
            return RKV_EINVAL;
        }
    }
    char rp[112];
    snprintf(rp, sizeof(rp), "%s.role", param);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(mo, "role");
    if (!role) {
        api_error_set(p->err, 400, rp, "%s is required", rp);
        return RKV_EINVAL;
    }
    m->role_name = NULL;
    for (size_t k = 0; k < sizeof(roles) / sizeof(roles[0]); k++) {
        if (is_str(role, roles[k].name)) {
            m->role = roles[k].role;
            m->role_name = roles[k].canon;
        }
    }
    if (!m->role_name)
        return bad(p, rp, role, "one of system, developer, user, assistant, tool");
    const cJSON *fc = field(mo, "function_call");
    if (fc) {
        char tp[112];
        snprintf(tp, sizeof(tp), "%s.function_call", param);
        return unsupported(p, tp, "function calling is not implemented; leave it out");
    }
    const cJSON *name = field(mo, "name");
    if (name && !cJSON_IsString(name)) {
        char np[112];
        snprintf(np, sizeof(np), "%s.name", param);
        return bad(p, np, name, "a string");
    }
    char cp[112];
    snprintf(cp, sizeof(cp), "%s.content", param);
    int rc = parse_content(p, cJSON_GetObjectItemCaseSensitive(mo, "content"), cp, m);
    if (rc == 0)
        rc = api_tools_parse_message(mo, param, m, p->err);
    if (rc == RKV_ENOMEM)
        api_error_set(p->err, 500, NULL, "out of memory");
    return rc;
}

static int parse_messages(struct parse *p, const cJSON *root, struct api_request *r)
{
    const cJSON *v = field(root, "messages");
    if (!v) {
        api_error_set(p->err, 400, "messages", "messages is required");
        return RKV_EINVAL;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 1 || n > API_MAX_MESSAGES)
        return bad(p, "messages", v, "an array of 1 to 4096 messages");
    r->messages = calloc((size_t)n, sizeof(*r->messages));
    if (!r->messages) {
        api_error_set(p->err, 500, NULL, "out of memory");
        return RKV_ENOMEM;
    }
    size_t i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        r->n_messages = i + 1;
        int rc = parse_message(p, m, i, &r->messages[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* --- entry points ------------------------------------------------------------------------- */

/* a "\u0000" escape would cut the C string short: refuse it */
static int has_nul_escape(const char *s, size_t len)
{
    for (size_t i = 0; i + 6 <= len; i++) {
        if (s[i] != '\\')
            continue;
        if (s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
            return 1;
        i++; /* skip the escaped character */
    }
    return 0;
}

int api_session_id_ok(const char *id)
{
    size_t n = strlen(id);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return 0;
    return n > 0 && n <= API_MAX_SESSION_ID;
}

void api_request_fini(struct api_request *r)
{
    free(r->model);
    free(r->prompt);
    free(r->prompt_tokens);
    for (size_t i = 0; i < r->n_more_prompts; i++) {
        free(r->more_prompts[i].text);
        free(r->more_prompts[i].tokens);
    }
    free(r->more_prompts);
    free(r->suffix);
    for (size_t i = 0; i < r->n_messages; i++) {
        free(r->messages[i].content);
        free(r->messages[i].extra_json);
    }
    free(r->messages);
    api_tools_free(r->tools);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->logit_bias);
    free(r->grammar);
    free(r->user);
    free(r->session_id);
    memset(r, 0, sizeof(*r));
}

/* the body as a JSON object: valid UTF-8, no NUL byte or \u0000, nothing after the value, no
 * key twice. NULL with err filled otherwise */
static cJSON *parse_root(const char *body, size_t len, struct api_error *err)
{
    size_t bad_at = 0;
    if (!api_utf8_valid(body, len, &bad_at)) {
        api_error_set(err, 400, NULL,
                      "request body is not valid UTF-8 (byte 0x%02x at offset %zu); send "
                      "UTF-8 JSON",
                      (unsigned char)body[bad_at], bad_at);
        return NULL;
    }
    const char *nul = memchr(body, 0, len);
    if (nul) {
        /* JSON strings escape control characters; a raw one would cut a C string short */
        api_error_set(err, 400, NULL,
                      "request body has a NUL byte at offset %zu; JSON strings must escape "
                      "control characters",
                      (size_t)(nul - body));
        return NULL;
    }
    if (has_nul_escape(body, len)) {
        api_error_set(err, 400, NULL, "strings must not contain \\u0000");
        return NULL;
    }
    const char *end = NULL, *junk = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (root && end) {
        /* cJSON stops after the value; anything but blanks after it is junk */
        while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
            end++;
        if (end < body + len) {
            cJSON_Delete(root);
            root = NULL;
            junk = end;
        }
    }
    if (!root) {
        const char *at = junk ? junk : cJSON_GetErrorPtr();
        size_t off = at && at >= body && at <= body + len ? (size_t)(at - body) : len;
        if (len == 0)
            api_error_set(err, 400, NULL, "request body is empty; send a JSON object");
        else
            api_error_set(err, 400, NULL, "request body is not valid JSON (near byte %zu: '%.*s')",
                          off, (int)RKV_MIN(len - off, (size_t)20), body + off);
        return NULL;
    }
    struct parse p = {NULL, err, API_COMPLETIONS};
    char dup[160];
    if (!cJSON_IsObject(root)) {
        bad(&p, "body", root, "a JSON object");
    } else if (proto_json_dup_key(root, dup, sizeof dup)) {
        api_error_set(err, 400, dup,
                      "the key \"%s\" appears twice in the request body; send each key once", dup);
    } else {
        return root;
    }
    cJSON_Delete(root);
    return NULL;
}

/* frees root; on failure r holds nothing to free */
static int parse_end(cJSON *root, int rc, struct api_error *err, struct api_request *r,
                     enum api_endpoint ep)
{
    if (rc == RKV_ENOMEM)
        api_error_set(err, 500, NULL, "out of memory");
    cJSON_Delete(root);
    if (rc)
        api_request_fini(r);
    r->endpoint = ep;
    return rc ? (rc == RKV_ENOMEM ? RKV_ENOMEM : RKV_EINVAL) : 0;
}

static int parse_body(enum api_endpoint ep, const char *body, size_t len,
                      const struct api_limits *lim, struct api_request *r, struct api_error *err)
{
    struct parse p = {lim, err, ep};
    memset(r, 0, sizeof(*r));
    r->endpoint = ep;
    r->add_generation_prompt = true;
    cJSON *root = parse_root(body, len, err);
    if (!root)
        return RKV_EINVAL;
    int rc;
    if ((rc = check_known(&p, root)) || (rc = check_unsupported(&p, root)) ||
        (rc = parse_common(&p, root, r)))
        goto out;
    rc = ep == API_CHAT ? parse_messages(&p, root, r) : parse_prompt(&p, root, r);
    if (!rc)
        rc = parse_fanout(&p, root, r);
    if (rc == 0 && ep == API_CHAT)
        rc = api_tools_parse(root, r, err);
    if (rc == 0 && r->grammar && api_tools_forces_call(r->tools)) {
        api_error_set(err, 400, "tool_choice",
                      "a forced tool call and a JSON response_format cannot both shape the "
                      "answer; send one of them");
        rc = RKV_EINVAL;
    }
out:
    return parse_end(root, rc, err, r, ep);
}

int api_parse_completions(const char *body, size_t len, const struct api_limits *lim,
                          struct api_request *out, struct api_error *err)
{
    return parse_body(API_COMPLETIONS, body, len, lim, out, err);
}

int api_parse_chat(const char *body, size_t len, const struct api_limits *lim,
                   struct api_request *out, struct api_error *err)
{
    return parse_body(API_CHAT, body, len, lim, out, err);
}

/* a field outside allowed[] is a 400 naming it */
static int check_fields(struct parse *p, const cJSON *root, const char *const *allowed, size_t n,
                        const char *list)
{
    for (const cJSON *c = root->child; c; c = c->next) {
        int known = 0;
        for (size_t k = 0; k < n; k++)
            known |= strcmp(c->string, allowed[k]) == 0;
        if (!known) {
            api_error_set(p->err, 400, c->string, "unknown field '%.60s'; this endpoint takes %s",
                          c->string, list);
            return RKV_EINVAL;
        }
    }
    return 0;
}

int api_parse_tokenize(const char *body, size_t len, const struct api_limits *lim,
                       struct api_request *out, struct api_error *err)
{
    static const char *const allowed[] = {
        "model", "prompt", "messages", "add_generation_prompt", "tools", "chat_template_kwargs"};
    struct parse p = {lim, err, API_COMPLETIONS};
    memset(out, 0, sizeof(*out));
    out->add_generation_prompt = true;
    cJSON *root = parse_root(body, len, err);
    if (!root)
        return RKV_EINVAL;
    int rc = check_fields(&p, root, allowed, 6,
                          "model, and prompt or messages (with add_generation_prompt, tools, "
                          "chat_template_kwargs)");
    int chat = field(root, "messages") != NULL;
    if (!rc && chat && field(root, "prompt")) {
        api_error_set(err, 400, "prompt", "send prompt or messages, not both");
        rc = RKV_EINVAL;
    }
    if (!rc && !chat && field(root, "add_generation_prompt")) {
        api_error_set(err, 400, "add_generation_prompt",
                      "add_generation_prompt goes with messages; leave it out with prompt");
        rc = RKV_EINVAL;
    }
    p.ep = chat ? API_CHAT : API_COMPLETIONS;
    if (!rc && !(rc = get_str(&p, root, "model", &out->model)) &&
        !(rc = get_bool(&p, root, "add_generation_prompt", &out->add_generation_prompt)))
        rc = chat ? parse_messages(&p, root, out) : parse_prompt(&p, root, out);
    if (!rc && out->n_more_prompts) {
        api_error_set(err, 400, "prompt",
                      "POST /tokenize takes one prompt, got a list of %zu: send one request "
                      "per prompt",
                      api_request_prompts(out));
        rc = RKV_EINVAL;
    }
    out->n = out->best_of = 1;
    if (!rc && !chat && (field(root, "tools") || field(root, "chat_template_kwargs"))) {
        api_error_set(err, 400, field(root, "tools") ? "tools" : "chat_template_kwargs",
                      "tools and chat_template_kwargs go with messages; leave them out with "
                      "prompt");
        rc = RKV_EINVAL;
    }
    if (!rc && chat)
        rc = api_tools_parse(root, out, err);
    return parse_end(root, rc, err, out, p.ep);
}

int api_parse_detokenize(const char *body, size_t len, const struct api_limits *lim,
                         struct api_request *out, struct api_error *err)
{
    static const char *const allowed[] = {"model", "tokens"};
    struct parse p = {lim, err, API_COMPLETIONS};
    memset(out, 0, sizeof(*out));
    cJSON *root = parse_root(body, len, err);
    if (!root)
        return RKV_EINVAL;
    int rc = check_fields(&p, root, allowed, 2, "model and tokens");
    const cJSON *v = field(root, "tokens");
    if (!rc && !(rc = get_str(&p, root, "model", &out->model))) {
        if (!v) {
            api_error_set(err, 400, "tokens", "tokens is required (an array of token ids)");
            rc = RKV_EINVAL;
        } else if (!cJSON_IsArray(v)) {
            rc = bad(&p, "tokens", v, "an array of token ids");
        } else {
            rc = parse_token_ids(&p, "tokens", v, out);
        }
    }
    return parse_end(root, rc, err, out, API_COMPLETIONS);
}
