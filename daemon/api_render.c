/* api_render.c - OpenAI response JSON and SSE chunks (completions, chat, models), as vLLM sends
 * them. */
#include "daemon/api.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/util.h"
#include "daemon/api_tools.h"

const char *api_finish_name(enum api_finish f)
{
    switch (f) {
    case API_FINISH_STOP: return "stop";
    case API_FINISH_LENGTH: return "length";
    case API_FINISH_ABORT: return "abort";
    case API_FINISH_TOOL_CALLS: return "tool_calls";
    default: return NULL;
    }
}

void api_make_id(enum api_endpoint ep, char *buf, size_t cap)
{
    static uint64_t counter;
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd)) {
        /* no entropy yet (early boot): unique within this process is enough */
        uint64_t c = ++counter;
        memset(rnd, 0, sizeof(rnd));
        memcpy(rnd, &c, sizeof(c));
    }
    int n = snprintf(buf, cap, "%s", ep == API_CHAT ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof(rnd) && (size_t)n + 2 < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%02x", rnd[i]);
}

/* characters (code points) in s, as Python's len() counts them: text_offset
 * must match what a Python client sees */
static size_t utf8_chars(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

/* feeds bytes to c: Unicode's table 3-7 of well-formed sequences decides where a character
 * ends and where an invalid subpart does */
static void chars_feed(struct api_chars *c, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        if (c->need) {
            if (b >= c->lo && b <= c->hi) {
                c->need--;
                c->lo = 0x80;
                c->hi = 0xbf;
                continue;
            }
            c->need = 0; /* the open sequence ends here as one U+FFFD */
        }
        c->n++;
        c->lo = 0x80;
        c->hi = 0xbf;
        if (b >= 0xc2 && b <= 0xdf) {
            c->need = 1;
        } else if (b >= 0xe0 && b <= 0xef) {
            c->need = 2;
            c->lo = b == 0xe0 ? 0xa0 : 0x80;
            c->hi = b == 0xed ? 0x9f : 0xbf;
        } else if (b >= 0xf0 && b <= 0xf4) {
            c->need = 3;
            c->lo = b == 0xf0 ? 0x90 : 0x80;
            c->hi = b == 0xf4 ? 0x8f : 0xbf;
        }
    }
}

/* a NUL-terminated copy with invalid UTF-8 replaced by U+FFFD, so the JSON
 * stays valid when a token is part of a multi-byte character; a NUL byte (a
 * model's <0x00> token) becomes U+FFFD too, since a C string would end there */
static char *utf8_sanitize(const char *s, size_t len)
{
    char *out = malloc(len * 3 + 1);
    if (!out)
        return NULL;
    size_t o = 0, i = 0;
    while (i < len) {
        size_t bad_at = 0;
        if (api_utf8_valid(s + i, len - i, &bad_at))
            bad_at = len - i;
        const char *nul = memchr(s + i, 0, bad_at);
        if (nul)
            bad_at = (size_t)(nul - (s + i));
        memcpy(out + o, s + i, bad_at);
        o += bad_at;
        i += bad_at;
        if (i < len) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

static cJSON *add_text(cJSON *obj, const char *name, const char *s, size_t len)
{
    char *t = utf8_sanitize(s ? s : "", s ? len : 0);
    cJSON *v = t ? cJSON_AddStringToObject(obj, name, t) : NULL;
    free(t);
    return v;
}

/* logprobs as short decimals (float precision), and -inf as vLLM's -9999 */
static double lp_value(float lp)
{
    if (!(lp > -9999.0f))
        return -9999.0;
    char b[32];
    snprintf(b, sizeof(b), "%.7g", (double)lp);
    return strtod(b, NULL);
}

static cJSON *bytes_array(const char *s, size_t len)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < len; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* chat: {"content":[{"token","logprob","bytes","top_logprobs":[...]}],"refusal":null} */
static cJSON *chat_logprobs(const struct api_token_logprob *lp, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    for (size_t i = 0; content && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(content, e);
        add_text(e, "token", lp[i].token, lp[i].len);
        cJSON_AddNumberToObject(e, "logprob", lp_value(lp[i].logprob));
        cJSON_AddItemToObject(e, "bytes", bytes_array(lp[i].token, lp[i].len));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (size_t k = 0; top && k < lp[i].n_top; k++) {
            const struct api_top_logprob *t = &lp[i].top[k];
            cJSON *te = cJSON_CreateObject();
            cJSON_AddItemToArray(top, te);
            add_text(te, "token", t->token, t->len);
            cJSON_AddNumberToObject(te, "logprob", lp_value(t->logprob));
            cJSON_AddItemToObject(te, "bytes", bytes_array(t->token, t->len));
        }
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* completions: {"tokens","token_logprobs","top_logprobs":[{tok: lp}],"text_offset"}. A token's
 * offset is the first character of the text that starts at or after its first byte (chars
 * counts those the tokens before started); never past limit, the text's length so far: a
 * token that renders to nothing (a control token), starts inside a character or whose text a
 * stop string took has the offset of the next character */
static cJSON *completion_logprobs(const struct api_token_logprob *lp, size_t n,
                                  struct api_chars *chars, size_t limit)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    if (!tokens || !lps || !tops || !offs)
        return o;
    for (size_t i = 0; i < n; i++) {
        char *t = utf8_sanitize(lp[i].token, lp[i].len);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(t ? t : ""));
        free(t);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(lp[i].logprob)));
        cJSON *d = cJSON_CreateObject();
        for (size_t k = 0; d && k < lp[i].n_top; k++) {
            char *tt = utf8_sanitize(lp[i].top[k].token, lp[i].top[k].len);
            /* two alternatives that decode alike keep the first, as a dict must */
            if (tt && !cJSON_GetObjectItemCaseSensitive(d, tt))
                cJSON_AddNumberToObject(d, tt, lp_value(lp[i].top[k].logprob));
            free(tt);
        }
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)RKV_MIN(chars->n, limit)));
        chars_feed(chars, lp[i].token, lp[i].len);
    }
    return o;
}

static cJSON *usage_json(const struct api_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens",
                            (double)u->prompt_tokens + (double)u->completion_tokens);
    if (u->cached_tokens) {
        cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
        cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    }
    return o;
}

static cJSON *envelope(const char *id, const char *object, uint64_t created, const char *model)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model ? model : "");
    return o;
}

static void add_finish(cJSON *choice, enum api_finish f)
{
    const char *name = api_finish_name(f);
    if (name)
        cJSON_AddStringToObject(choice, "finish_reason", name);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

static char *print_free(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* one choice of a response */
static cJSON *choice_json(const struct api_request *req, const struct api_result *res, size_t index)
{
    int chat = req->endpoint == API_CHAT;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", (double)index);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (res->tout)
            api_tout_message(res->tout, m);
        else
            add_text(m, "content", res->text, res->len);
    } else {
        add_text(c, "text", res->text, res->len);
    }
    struct api_chars chars = {0};
    if (req->logprobs)
        cJSON_AddItemToObject(c, "logprobs",
                              chat ? chat_logprobs(res->lp, res->n_lp)
                                   : completion_logprobs(res->lp, res->n_lp, &chars,
                                                         utf8_chars(res->text, res->len)));
    else
        cJSON_AddNullToObject(c, "logprobs");
    add_finish(c, res->finish);
    return c;
}

char *api_render_choices(const struct api_request *req, const char *id, const char *model,
                         uint64_t created, const struct api_result *res, size_t n,
                         const struct api_usage *usage)
{
    int chat = req->endpoint == API_CHAT;
    cJSON *o = envelope(id, chat ? "chat.completion" : "text_completion", created, model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(choices, choice_json(req, &res[i], i));
    cJSON_AddItemToObject(o, "usage", usage_json(usage));
    return print_free(o);
}

char *api_render_response(const struct api_request *req, const char *id, const char *model,
                          uint64_t created, const struct api_result *res)
{
    return api_render_choices(req, id, model, created, res, 1, &res->usage);
}

/* --- streaming ----------------------------------------------------------------------------- */

void api_stream_init(struct api_stream *s, const struct api_request *req, const char *id,
                     const char *model, uint64_t created)
{
    memset(s, 0, sizeof(*s));
    s->req = req;
    snprintf(s->id, sizeof(s->id), "%s", id);
    snprintf(s->model, sizeof(s->model), "%s", model ? model : "");
    s->created = created;
}

char *api_sse_event(const char *json, size_t *len)
{
    size_t n = strlen(json);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, json, n);
        memcpy(out + 6 + n, "\n\n", 3);
        *len = n + 8;
    }
    return out;
}

static char *sse(cJSON *o, size_t *len)
{
    char *j = print_free(o);
    char *out = j ? api_sse_event(j, len) : NULL;
    free(j);
    return out;
}

static cJSON *chunk(struct api_stream *s, cJSON **choice)
{
    int chat = s->req->endpoint == API_CHAT;
    cJSON *o =
        envelope(s->id, chat ? "chat.completion.chunk" : "text_completion", s->created, s->model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, *choice);
    cJSON_AddNumberToObject(*choice, "index", s->index);
    return o;
}

char *api_stream_begin(struct api_stream *s, size_t *len)
{
    if (s->req->endpoint != API_CHAT)
        return NULL;
    cJSON *c;
    cJSON *o = chunk(s, &c);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    return sse(o, len);
}

char *api_stream_delta(struct api_stream *s, const char *text, size_t text_len,
                       const struct api_token_logprob *lp, size_t n_lp, size_t *len)
{
    int chat = s->req->endpoint == API_CHAT;
    cJSON *c;
    cJSON *o = chunk(s, &c);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        add_text(d, "content", text, text_len);
    } else {
        add_text(c, "text", text, text_len);
    }
    s->text_offset += utf8_chars(text, text_len);
    if (s->req->logprobs && n_lp)
        cJSON_AddItemToObject(c, "logprobs",
                              chat
                                  ? chat_logprobs(lp, n_lp)
                                  : completion_logprobs(lp, n_lp, &s->token_chars, s->text_offset));
    else
        cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    return sse(o, len);
}

/* a chat chunk's logprobs: those of the tokens it carries, or null */
static void chunk_logprobs(const struct api_stream *s, cJSON *c, const struct api_token_logprob *lp,
                           size_t n_lp)
{
    if (s->req->logprobs && n_lp && s->req->endpoint == API_CHAT)
        cJSON_AddItemToObject(c, "logprobs", chat_logprobs(lp, n_lp));
    else
        cJSON_AddNullToObject(c, "logprobs");
}

char *api_stream_delta_json(struct api_stream *s, cJSON *delta, const struct api_token_logprob *lp,
                            size_t n_lp, size_t *len)
{
    if (!delta)
        return NULL;
    cJSON *c;
    cJSON *o = chunk(s, &c);
    cJSON_AddItemToObject(c, "delta", delta);
    chunk_logprobs(s, c, lp, n_lp);
    cJSON_AddNullToObject(c, "finish_reason");
    return sse(o, len);
}

char *api_stream_finish(struct api_stream *s, enum api_finish finish,
                        const struct api_token_logprob *lp, size_t n_lp, size_t *len)
{
    cJSON *c;
    cJSON *o = chunk(s, &c);
    if (s->req->endpoint == API_CHAT)
        cJSON_AddObjectToObject(c, "delta");
    else
        cJSON_AddStringToObject(c, "text", "");
    chunk_logprobs(s, c, lp, n_lp);
    add_finish(c, finish);
    return sse(o, len);
}

char *api_stream_usage(struct api_stream *s, const struct api_usage *u, size_t *len)
{
    int chat = s->req->endpoint == API_CHAT;
    cJSON *o =
        envelope(s->id, chat ? "chat.completion.chunk" : "text_completion", s->created, s->model);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(u));
    return sse(o, len);
}

/* the OpenAI model object, with vLLM's root and max_model_len */
static void model_fill(cJSON *m, const char *name, uint64_t created, int max_model_len)
{
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "rkv");
    cJSON_AddStringToObject(m, "root", name);
    if (max_model_len > 0)
        cJSON_AddNumberToObject(m, "max_model_len", max_model_len);
}

char *api_render_models(const char *const *names, size_t n, uint64_t created, int max_model_len)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (size_t i = 0; data && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(data, m);
        model_fill(m, names[i], created, max_model_len);
    }
    return print_free(o);
}

char *api_render_model(const char *name, uint64_t created, int max_model_len)
{
    cJSON *o = cJSON_CreateObject();
    model_fill(o, name, created, max_model_len);
    return print_free(o);
}

char *api_render_tokens(const int32_t *ids, size_t n, int max_model_len)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", max_model_len);
    return print_free(o);
}

char *api_render_detokenized(const char *text, size_t len)
{
    cJSON *o = cJSON_CreateObject();
    add_text(o, "prompt", text, len);
    return print_free(o);
}
