/* api.c - the OpenAI endpoints on the HTTP server, and the calls they hand to the scheduler. */
#include "daemon/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "daemon/api_tools.h"
#include "daemon/http/server.h"

struct api {
    char **models;
    size_t n_models;
    int max_model_len;
    struct api_limits limits;
    char *cors_origin; /* NULL: no CORS */
    struct api_sched sched;
    uint64_t created; /* reported as the models' creation time */
    size_t n_calls;
    struct rl *rl;
    struct rl_limits key_defaults;
    api_key_lookup_fn key_lookup;
    void *key_lookup_ud;
    char *test_output; /* tests only: api_config.test_output */
};

/* one sequence of a call (prompt i's k-th of best_of is i * best_of + k) */
struct api_choice {
    /* non-stream: what is returned at the end; streaming: an echo not sent yet */
    struct strbuf text;
    struct api_token_logprob *lp;
    size_t n_lp, cap_lp;
    enum api_finish finish; /* API_FINISH_NONE while it runs */
    double score;           /* best_of: its mean logprob per token */
    struct api_stream stream;
    /* chat with tools or a thinking template: the output split into content,
     * reasoning_content and tool_calls */
    struct api_call *call;
    struct api_tparse *tp;
    struct api_tout tout; /* non-stream: the parts */
    /* streaming through the parser, lp holds the logprobs of tokens fed that no chunk has
     * carried yet (the parser holds text back): the next chunk of any kind carries them */
    int ev_slow;  /* stream: a write said the client reads slowly */
    int test_fed; /* tests only: the scripted answer went out */
};

struct api_call {
    struct api *api;
    struct http_req *http;
    struct api_request req;
    char id[64];
    const char *model; /* the served name reported back */
    uint64_t created;
    void *data;
    int closed;            /* the client is gone */
    int in_api;            /* inside an api_call_* function: cancel is not called then */
    int started;           /* SSE head sent */
    struct api_choice *ch; /* (n_ch) = api_request_seqs */
    size_t n_ch;
    int64_t key;     /* the api key's id when its limits apply, else 0 */
    uint64_t charge; /* tokens the key is charged when the call ends */
};

int api_create(const struct api_config *cfg, const struct api_sched *sched, struct api **out)
{
    if (!cfg->n_models || !sched->submit)
        return RKV_EINVAL;
    struct api *a = calloc(1, sizeof(*a));
    if (!a)
        return RKV_ENOMEM;
    a->models = calloc(cfg->n_models, sizeof(char *));
    if (!a->models) {
        free(a);
        return RKV_ENOMEM;
    }
    for (size_t i = 0; i < cfg->n_models; i++) {
        a->models[i] = strdup(cfg->models[i]);
        a->n_models++;
        if (!a->models[i]) {
            api_destroy(a);
            return RKV_ENOMEM;
        }
    }
    a->max_model_len = cfg->max_model_len;
    if (cfg->cors_origin && !(a->cors_origin = strdup(cfg->cors_origin))) {
        api_destroy(a);
        return RKV_ENOMEM;
    }
    if (cfg->test_output && !(a->test_output = strdup(cfg->test_output))) {
        api_destroy(a);
        return RKV_ENOMEM;
    }
    a->limits = cfg->limits;
    if (!a->limits.max_tokens)
        api_limits_default(&a->limits);
    a->sched = *sched;
    a->key_defaults = cfg->key_defaults;
    int rc = rl_create(cfg->rate_window_ms ? cfg->rate_window_ms : 60000, &a->rl);
    if (rc) {
        api_destroy(a);
        return rc;
    }
    a->created = (uint64_t)time(NULL);
    *out = a;
    return 0;
}

void api_destroy(struct api *api)
{
    if (!api)
        return;
    if (api->n_calls)
        log_warn("api: freed with %zu calls in flight", api->n_calls);
    for (size_t i = 0; i < api->n_models; i++)
        free(api->models[i]);
    free(api->models);
    free(api->cors_origin);
    free(api->test_output);
    rl_destroy(api->rl);
    free(api);
}

void api_set_key_lookup(struct api *api, api_key_lookup_fn fn, void *ud)
{
    api->key_lookup = fn;
    api->key_lookup_ud = ud;
}

size_t api_calls(const struct api *api)
{
    return api->n_calls;
}

/* --- answers that need no scheduler --------------------------------------------------------- */

static void send_error(struct http_req *req, const struct api_error *e)
{
    char *j = api_error_json(e);
    if (e->status == 405)
        http_resp_header(req, "Allow",
                         strncmp(http_req_path(req), "/v1/models", 10) ? "POST" : "GET");
    if (e->status == 401)
        http_resp_header(req, "WWW-Authenticate", "Bearer");
    if (e->status == 429 || e->status == 503)
        http_resp_header(req, "Retry-After", "1"); /* queue full / not ready: soon */
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    http_respond(req, e->status, "application/json", j ? j : oom, strlen(j ? j : oom));
    free(j);
}

__attribute__((format(printf, 5, 6))) static int respond_error(struct http_req *req, int status,
                                                               const char *param, const char *code,
                                                               const char *fmt, ...)
{
    struct api_error e;
    api_error_set(&e, status, param, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof(e.message), fmt, ap);
    va_end(ap);
    e.code = code;
    send_error(req, &e);
    return 1;
}

static const char *served_model(struct api *api, const char *name)
{
    if (!name)
        return api->models[0];
    for (size_t i = 0; i < api->n_models; i++)
        if (strcmp(api->models[i], name) == 0)
            return api->models[i];
    return NULL;
}

/* a 404 model_not_found naming name (param: where it came from) */
static void send_no_model(struct api *api, struct http_req *req, const char *param,
                          const char *name)
{
    struct api_error e;
    api_error_set(&e, 404, param,
                  "the model '%.100s' does not exist; GET /v1/models lists what this server "
                  "serves (e.g. '%.100s')",
                  name, api->models[0]);
    e.code = "model_not_found";
    send_error(req, &e);
}

/* 1 when the body is JSON (or says nothing); else answers 415 */
static int json_body(struct http_req *req)
{
    const char *ct = http_req_header(req, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16) == 0 || strstr(ct, "+json"))
        return 1;
    respond_error(req, 415, NULL, NULL,
                  "Content-Type must be application/json, got '%.60s' (with curl, add -H "
                  "'Content-Type: application/json')",
                  ct);
    return 0;
}

static void respond_json(struct http_req *req, char *j)
{
    if (!j) {
        respond_error(req, 500, NULL, NULL, "%s", "out of memory");
        return;
    }
    http_respond(req, 200, "application/json", j, strlen(j));
    free(j);
}

/* POST /tokenize and POST /detokenize, vLLM's shapes */
static int handle_tokenize(struct api *api, struct http_req *hreq, int detok)
{
    if (!json_body(hreq))
        return 1;
    size_t len;
    const char *body = http_req_body(hreq, &len);
    struct api_request r;
    struct api_error e;
    int rc = detok ? api_parse_detokenize(body, len, &api->limits, &r, &e)
                   : api_parse_tokenize(body, len, &api->limits, &r, &e);
    if (rc) {
        send_error(hreq, &e);
        return 1;
    }
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    int status = 500;
    if (!served_model(api, r.model)) {
        send_no_model(api, hreq, "model", r.model);
    } else if (detok) {
        size_t n_text = 0;
        rc = api->sched.detokenize(api->sched.ctx, r.prompt_tokens, r.n_prompt_tokens, &text,
                                   &n_text);
        if (rc)
            respond_error(hreq, 500, NULL, NULL, "cannot detokenize: %s", rkv_strerror(rc));
        else
            respond_json(hreq, api_render_detokenized(text, n_text));
    } else if ((rc = api->sched.tokenize(api->sched.ctx, &r, &ids, &n, &status, err, sizeof err))) {
        respond_error(hreq, status, NULL, NULL, "%s", err[0] ? err : rkv_strerror(rc));
    } else {
        respond_json(hreq, api_render_tokens(ids, n, api->max_model_len));
    }
    free(ids);
    free(text);
    api_request_fini(&r);
    return 1;
}

/* --- calls ----------------------------------------------------------------------------------- */

static void lp_free(struct api_token_logprob *lp)
{
    free((char *)lp->token);
    for (size_t k = 0; k < lp->n_top; k++)
        free((char *)lp->top[k].token);
    free((void *)lp->top);
}

static void call_destroy(struct api_call *c)
{
    c->api->n_calls--;
    if (c->key)
        rl_done(c->api->rl, c->key, c->charge, rkv_now_ms());
    api_request_fini(&c->req);
    for (size_t k = 0; k < c->n_ch; k++) {
        for (size_t i = 0; i < c->ch[k].n_lp; i++)
            lp_free(&c->ch[k].lp[i]);
        free(c->ch[k].lp);
        api_tparse_destroy(c->ch[k].tp);
        api_tout_fini(&c->ch[k].tout);
        strbuf_fini(&c->ch[k].text);
    }
    free(c->ch);
    free(c);
}

static void call_on_close(struct http_req *req, void *arg)
{
    struct api_call *c = arg;
    c->closed = 1;
    /* inside an api_call_* function the caller learns it from RKV_ECLOSED */
    if (!c->in_api && c->api->sched.cancel)
        c->api->sched.cancel(c->api->sched.ctx, c);
}

static void call_on_drain(struct http_req *req, void *arg)
{
    (void)req;
    struct api_call *c = arg;
    if (!c->closed && c->api->sched.resume)
        c->api->sched.resume(c->api->sched.ctx, c);
}

static int submit_status(int rc, const char **msg)
{
    switch (rc) {
    case RKV_EBUSY: *msg = "the server is at capacity; retry later"; return 429;
    case RKV_ESTATE:
    case RKV_ENODEV:
    case RKV_ECLOSED:
        *msg = "no worker is ready to serve the model; retry later (see GET /health)";
        return 503;
    case RKV_ETOOBIG:
        *msg = "the prompt is longer than the model's context; shorten it";
        return 400;
    default: *msg = "internal error while queueing the request"; return 500;
    }
}

/* --- per-key limits ----------------------------------------------------------------------- */

/* x-ratelimit-{limit,remaining,reset}-<what> */
static void ratelimit_header3(struct http_req *req, const char *what, int64_t limit,
                              int64_t remaining, uint64_t reset_ms)
{
    char name[48], v[32];
    snprintf(name, sizeof name, "x-ratelimit-limit-%s", what);
    snprintf(v, sizeof v, "%lld", (long long)limit);
    http_resp_header(req, name, v);
    snprintf(name, sizeof name, "x-ratelimit-remaining-%s", what);
    snprintf(v, sizeof v, "%lld", (long long)remaining);
    http_resp_header(req, name, v);
    snprintf(name, sizeof name, "x-ratelimit-reset-%s", what);
    rl_format_duration(reset_ms, v, sizeof v);
    http_resp_header(req, name, v);
}

static void ratelimit_headers(struct http_req *req, const struct rl_verdict *v)
{
    if (v->limit_req)
        ratelimit_header3(req, "requests", v->limit_req, v->remaining_req, v->reset_req_ms);
    if (v->limit_tok)
        ratelimit_header3(req, "tokens", v->limit_tok, v->remaining_tok, v->reset_tok_ms);
}

/* 429 in the shape OpenAI sends (type "requests"/"tokens", code "rate_limit_exceeded") */
static void send_rate_limited(struct api *api, struct http_req *req, int64_t key,
                              const struct rl_verdict *v)
{
    struct api_error e;
    char wait[32], retry[32], win[32];
    rl_format_duration(v->retry_ms, wait, sizeof wait);
    rl_format_duration(rl_window_ms(api->rl), win, sizeof win);
    switch (v->refused) {
    case RL_CONCURRENT:
        api_error_set(&e, 429, NULL,
                      "Rate limit reached for API key %lld on concurrent requests: limit %lld, "
                      "in flight %lld. Wait for a request to finish, or ask the operator to "
                      "raise it (rkvctl keys limits %lld --max-concurrent N)",
                      (long long)key, (long long)v->in_flight, (long long)v->in_flight,
                      (long long)key);
        e.type = "requests";
        break;
    case RL_TOKENS:
        api_error_set(&e, 429, NULL,
                      "Rate limit reached for API key %lld on tokens per %s: limit %lld, "
                      "remaining %lld. Please try again in %s, or ask the operator to raise it "
                      "(rkvctl keys limits %lld --tpm N)",
                      (long long)key, win, (long long)v->limit_tok, (long long)v->remaining_tok,
                      wait, (long long)key);
        e.type = "tokens";
        break;
    default:
        api_error_set(&e, 429, NULL,
                      "Rate limit reached for API key %lld on requests per %s: limit %lld. "
                      "Please try again in %s, or ask the operator to raise it "
                      "(rkvctl keys limits %lld --rpm N)",
                      (long long)key, win, (long long)v->limit_req, wait, (long long)key);
        e.type = "requests";
        break;
    }
    e.code = "rate_limit_exceeded";
    ratelimit_headers(req, v);
    /* whole seconds, rounded up, never 0 */
    snprintf(retry, sizeof retry, "%llu",
             (unsigned long long)(v->retry_ms >= 1000 ? (v->retry_ms + 999) / 1000 : 1));
    http_resp_header(req, "Retry-After", retry);
    char *j = api_error_json(&e);
    if (j)
        http_respond(req, 429, "application/json", j, strlen(j));
    else
        http_respond(req, 500, NULL, NULL, 0);
    free(j);
}

/* a key's limits with its unset fields from the configured defaults */
static struct rl_limits key_limits(const struct api *api, const struct rl_limits *k)
{
    const struct rl_limits *d = &api->key_defaults;
    return (struct rl_limits){k->rpm < 0 ? d->rpm : k->rpm, k->tpm < 0 ? d->tpm : k->tpm,
                              k->max_concurrent < 0 ? d->max_concurrent : k->max_concurrent,
                              k->max_tokens < 0 ? d->max_tokens : k->max_tokens,
                              k->max_prompt < 0 ? d->max_prompt : k->max_prompt};
}

static int keep_text(struct api_choice *ch, const char *text, size_t len);

/* echo: each prompt's text starts its choices (ids read back as /detokenize reads them) */
static int echo_prompt(struct api *api, struct api_call *c)
{
    const struct api_request *r = &c->req;
    size_t per = (size_t)c->req.best_of;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < api_request_prompts(r); i++) {
        const char *ptext;
        const int32_t *ids;
        size_t n_ids;
        api_request_prompt(r, i, &ptext, &ids, &n_ids);
        char *text = NULL;
        size_t n_text = ptext ? strlen(ptext) : 0;
        if (!ptext)
            rc = api->sched.detokenize
                     ? api->sched.detokenize(api->sched.ctx, ids, n_ids, &text, &n_text)
                     : RKV_EUNSUPPORTED;
        for (size_t k = 0; rc == 0 && k < per; k++)
            rc = keep_text(&c->ch[i * per + k], ptext ? ptext : text, n_text);
        free(text);
    }
    return rc;
}

/* several sequences in one request: within the key's limits, not with a session */
static int check_fanout(struct http_req *hreq, struct api_request *r, int64_t key,
                        const struct rl_limits *kl)
{
    size_t seqs = api_request_seqs(r);
    const char *param = r->best_of > r->n ? "best_of" : r->n > 1 ? "n" : "prompt";
    if (seqs > 1 && r->session_id)
        return respond_error(hreq, 400, param, NULL,
                             "%s asks for %zu sequences, but a session continues one "
                             "conversation: leave out session_id (and X-Session-Id), or send "
                             "one prompt with n = 1",
                             param, seqs);
    if (!key || seqs == 1)
        return 0;
    /* a request without max_tokens gets the key's cap shared by its sequences, or its own
     * default where that is less (completions' 16) */
    if (kl->max_tokens > 0 && !r->has_max_tokens)
        r->max_tokens =
            (int)RKV_MIN((int64_t)r->max_tokens, RKV_MAX(1, kl->max_tokens / (int64_t)seqs));
    int64_t want = (int64_t)seqs * r->max_tokens;
    const struct {
        int64_t cap;
        const char *what, *flag;
    } caps[] = {{kl->max_tokens, "generate in one request", "--max-tokens"},
                {kl->tpm, "use in a whole window", "--tpm"}};
    for (size_t i = 0; i < RKV_ARRAY_LEN(caps); i++)
        if (caps[i].cap > 0 && want > caps[i].cap)
            return respond_error(hreq, 400, param, NULL,
                                 "%zu sequences x max_tokens %d = %lld tokens, more than API "
                                 "key %lld may %s (%lld): lower n, best_of or max_tokens, or "
                                 "ask the operator to raise it (rkvctl keys limits %lld %s N)",
                                 seqs, r->max_tokens, (long long)want, (long long)key, caps[i].what,
                                 (long long)caps[i].cap, (long long)key, caps[i].flag);
    return 0;
}

static int handle_generate(struct api *api, struct http_req *hreq, enum api_endpoint ep,
                           int64_t key, const struct rl_limits *klim)
{
    if (!json_body(hreq))
        return 1;
    struct rl_limits kl = key ? key_limits(api, klim) : (struct rl_limits){0};
    struct api_limits lim = api->limits;
    int capped = kl.max_tokens > 0 && kl.max_tokens < lim.max_tokens;
    if (capped) {
        lim.max_tokens = (int)kl.max_tokens;
        if (lim.default_max_tokens > lim.max_tokens)
            lim.default_max_tokens = lim.max_tokens;
    }
    int limited = key && (kl.rpm > 0 || kl.tpm > 0 || kl.max_concurrent > 0);
    struct rl_verdict v;
    if (limited && rl_admit(api->rl, key, &kl, rkv_now_ms(), &v) != 0) {
        send_rate_limited(api, hreq, key, &v);
        return 1;
    }
    struct api_call *c = calloc(1, sizeof(*c));
    if (!c) {
        if (limited)
            rl_done(api->rl, key, 0, rkv_now_ms());
        return respond_error(hreq, 500, NULL, NULL, "%s", "out of memory");
    }
    c->api = api;
    api->n_calls++;
    if (limited) {
        /* every answer of this call, errors included, reports the key's budget */
        c->key = key;
        ratelimit_headers(hreq, &v);
    }
    size_t len;
    const char *body = http_req_body(hreq, &len);
    struct api_error e;
    int rc = ep == API_CHAT ? api_parse_chat(body, len, &lim, &c->req, &e)
                            : api_parse_completions(body, len, &lim, &c->req, &e);
    if (rc) {
        if (capped &&
            (!strcmp(e.param, "max_tokens") || !strcmp(e.param, "max_completion_tokens"))) {
            size_t n = strlen(e.message);
            snprintf(e.message + n, sizeof e.message - n,
                     " (the limit of this API key; the operator raises it with rkvctl keys "
                     "limits %lld --max-tokens N)",
                     (long long)key);
        }
        send_error(hreq, &e);
        call_destroy(c);
        return 1;
    }
    /* whose request: its sessions and cached prefixes are that key's */
    c->req.key_id = key;
    if (key && kl.max_prompt > 0)
        c->req.max_prompt_tokens = (uint32_t)kl.max_prompt;
    c->model = served_model(api, c->req.model);
    if (!c->model) {
        send_no_model(api, hreq, "model", c->req.model);
        call_destroy(c);
        return 1;
    }
    const char *sid = http_req_header(hreq, "X-Session-Id");
    if (!c->req.session_id && sid) {
        if (!api_session_id_ok(sid)) {
            api_error_set(&e, 400, "X-Session-Id",
                          "X-Session-Id must be 1 to 128 bytes without control characters, got "
                          "%zu bytes",
                          strlen(sid));
            send_error(hreq, &e);
            call_destroy(c);
            return 1;
        }
        c->req.session_id = strdup(sid);
    }
    if (check_fanout(hreq, &c->req, key, &kl)) {
        call_destroy(c);
        return 1;
    }
    c->n_ch = api_request_seqs(&c->req);
    c->ch = calloc(c->n_ch, sizeof *c->ch);
    if (!c->ch) {
        c->n_ch = 0;
        respond_error(hreq, 500, NULL, NULL, "%s", "out of memory");
        call_destroy(c);
        return 1;
    }
    for (size_t k = 0; k < c->n_ch; k++)
        c->ch[k].call = c;
    if (c->req.echo && echo_prompt(api, c) != 0) {
        respond_error(hreq, 500, NULL, NULL, "%s", "out of memory");
        call_destroy(c);
        return 1;
    }
    c->http = hreq;
    c->created = (uint64_t)time(NULL);
    api_make_id(ep, c->id, sizeof(c->id));
    for (size_t k = 0; k < c->n_ch; k++) {
        api_stream_init(&c->ch[k].stream, &c->req, c->id, c->model, c->created);
        c->ch[k].stream.index = (uint32_t)k; /* streamed: best_of = n, every one is a choice */
    }
    http_req_set_callbacks(hreq, call_on_close, call_on_drain, c);
    /* submit may finish the call itself (api_call_fail): c is not touched
     * after it unless it refused */
    rc = api->sched.submit(api->sched.ctx, c, &c->req);
    if (rc < 0) {
        const char *msg;
        int status = submit_status(rc, &msg);
        api_error_set(&e, status, NULL, "%s", msg);
        send_error(hreq, &e);
        call_destroy(c);
    }
    return 1;
}

int api_handle(struct api *api, struct http_req *req)
{
    const char *path = http_req_path(req);
    const char *method = http_req_method(req);
    /* vLLM serves these two outside /v1/ */
    int is_tok = strcmp(path, "/tokenize") == 0 && api->sched.tokenize;
    int is_detok = strcmp(path, "/detokenize") == 0 && api->sched.detokenize;
    if (strncmp(path, "/v1/", 4) != 0 && !is_tok && !is_detok)
        return 0;
    int is_models = strcmp(path, "/v1/models") == 0;
    const char *model_id = strncmp(path, "/v1/models/", 11) == 0 ? path + 11 : NULL;
    int is_compl = strcmp(path, "/v1/completions") == 0;
    int is_chat = strcmp(path, "/v1/chat/completions") == 0;
    if (api->cors_origin) {
        /* every answer below carries it, errors included, so a browser
         * shows the error rather than a CORS failure */
        http_resp_header(req, "Access-Control-Allow-Origin", api->cors_origin);
        if (strcmp(method, "OPTIONS") == 0) {
            /* a preflight: no auth (browsers send no credentials with it) */
            http_resp_header(req, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            /* whatever headers the client's library sends (openai-node adds X-Stainless-*,
             * OpenAI-Organization, OpenAI-Project): the origin is what is checked */
            const char *asked = http_req_header(req, "Access-Control-Request-Headers");
            http_resp_header(req, "Access-Control-Allow-Headers",
                             asked && asked[0] ? asked
                                               : "Authorization, Content-Type, X-Session-Id");
            http_resp_header(req, "Access-Control-Max-Age", "600");
            http_respond(req, 204, NULL, NULL, 0);
            return 1;
        }
    }
    if (!is_models && !model_id && !is_compl && !is_chat && !is_tok && !is_detok)
        return respond_error(req, 404, NULL, NULL,
                             "no route %.100s; rkv serves POST /v1/completions, POST "
                             "/v1/chat/completions, GET /v1/models[/{id}], POST /tokenize and "
                             "POST /detokenize",
                             path);
    int64_t key = 0;
    struct rl_limits klim = {0};
    int denied = api->key_lookup
                     ? api->key_lookup(api->key_lookup_ud, http_req_bearer(req), &key, &klim)
                 : api->sched.authorize ? api->sched.authorize(api->sched.ctx, http_req_bearer(req))
                                        : 0;
    if (denied)
        return respond_error(req, 401, NULL, "invalid_api_key", "%s",
                             "missing or invalid API key; send Authorization: Bearer <key> "
                             "(keys are managed with rkvctl)");
    if (is_models || model_id) {
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
            return respond_error(req, 405, NULL, NULL, "%s %.100s is not allowed; use GET", method,
                                 path);
        const char *m = model_id ? served_model(api, model_id) : NULL;
        if (model_id && !m)
            send_no_model(api, req, "model", model_id);
        else if (m)
            respond_json(req, api_render_model(m, api->created, api->max_model_len));
        else
            respond_json(req, api_render_models((const char *const *)api->models, api->n_models,
                                                api->created, api->max_model_len));
        return 1;
    }
    if (strcmp(method, "POST") != 0)
        return respond_error(req, 405, NULL, NULL, "%s %s is not allowed; use POST", method, path);
    if (is_tok || is_detok)
        return handle_tokenize(api, req, is_detok);
    return handle_generate(api, req, is_chat ? API_CHAT : API_COMPLETIONS, key, &klim);
}

/* --- the scheduler's side -----------------------------------------------------------------------
 */

const struct api_request *api_call_request(const struct api_call *call)
{
    return &call->req;
}
void api_call_set_data(struct api_call *call, void *data)
{
    call->data = data;
}
void *api_call_data(const struct api_call *call)
{
    return call->data;
}

/* SSE head, and each choice's chat role chunk, before the first event */
static int stream_start(struct api_call *c)
{
    if (c->started)
        return 0;
    c->started = 1;
    int rc = http_resp_start(c->http, 200, "text/event-stream");
    for (size_t k = 0; rc >= 0 && k < c->n_ch; k++) {
        size_t n;
        char *ev = api_stream_begin(&c->ch[k].stream, &n);
        if (!ev)
            break; /* completions send none */
        rc = http_resp_write(c->http, ev, n);
        free(ev);
    }
    return rc;
}

static int stream_send(struct api_call *c, char *ev, size_t n)
{
    if (!ev)
        return RKV_ENOMEM;
    int rc = http_resp_write(c->http, ev, n);
    free(ev);
    return rc;
}

static int keep_logprobs(struct api_choice *c, const struct api_token_logprob *lp, size_t n)
{
    if (c->n_lp + n > c->cap_lp) {
        size_t cap = c->cap_lp ? c->cap_lp * 2 : 64;
        while (cap < c->n_lp + n)
            cap *= 2;
        struct api_token_logprob *p = realloc(c->lp, cap * sizeof(*p));
        if (!p)
            return RKV_ENOMEM;
        c->lp = p;
        c->cap_lp = cap;
    }
    for (size_t i = 0; i < n; i++) {
        struct api_token_logprob *d = &c->lp[c->n_lp];
        memset(d, 0, sizeof(*d));
        d->token = strndup(lp[i].token ? lp[i].token : "", lp[i].len);
        d->len = lp[i].len;
        d->logprob = lp[i].logprob;
        struct api_top_logprob *top = calloc(lp[i].n_top ? lp[i].n_top : 1, sizeof(*top));
        d->top = top;
        c->n_lp++;
        if (!d->token || !top)
            return RKV_ENOMEM;
        for (size_t k = 0; k < lp[i].n_top; k++) {
            top[k].token = strndup(lp[i].top[k].token ? lp[i].top[k].token : "", lp[i].top[k].len);
            top[k].len = lp[i].top[k].len;
            top[k].logprob = lp[i].top[k].logprob;
            d->n_top = k + 1;
            if (!top[k].token)
                return RKV_ENOMEM;
        }
    }
    return 0;
}

/* appends to the text a non-stream answer returns (or, streaming, the echo not sent yet) */
static int keep_text(struct api_choice *c, const char *text, size_t len)
{
    return strbuf_add(&c->text, text, len);
}

/* one text chunk of a choice; an echoed prompt still held goes first, in the same chunk */
static int stream_text(struct api_call *c, struct api_choice *ch, const char *text, size_t len,
                       const struct api_token_logprob *lp, size_t n_lp)
{
    int rc = stream_start(c);
    if (rc < 0)
        return rc;
    if (ch->text.n) {
        if ((rc = keep_text(ch, text, len)) < 0)
            return rc;
        text = ch->text.s;
        len = ch->text.n;
    }
    size_t n = 0;
    char *ev = api_stream_delta(&ch->stream, text, len, lp, n_lp, &n);
    strbuf_reset(&ch->text); /* the echo is sent */
    return stream_send(c, ev, n);
}

/* 1 when the choice's output goes through the tool/reasoning parser (made on first use) */
static int parsed(struct api_choice *ch)
{
    const struct api_tools *t = ch->call->req.tools;
    if (ch->tp)
        return 1;
    if (ch->call->req.endpoint != API_CHAT || !t || !(t->parse_calls || t->reasoning))
        return 0;
    return api_tparse_create(t, &ch->tp) == 0 ? 1 : RKV_ENOMEM;
}

/* the queued logprobs went out with a chunk */
static void sent_logprobs(struct api_choice *ch)
{
    for (size_t i = 0; i < ch->n_lp; i++)
        lp_free(&ch->lp[i]);
    ch->n_lp = 0;
}

/* a parser event as stream chunks: content, reasoning, or a tool call's head and arguments;
 * the first carries the logprobs of the tokens fed since the last chunk, so that a stream's
 * logprobs are the non-stream answer's, in order */
static int stream_event(void *ud, const struct api_tev *ev)
{
    struct api_choice *ch = ud;
    struct api_call *c = ch->call;
    size_t n = 0;
    int rc;
    if (ev->kind == API_TEV_CONTENT) {
        char *e = api_stream_delta(&ch->stream, ev->text, ev->len, ch->lp, ch->n_lp, &n);
        rc = stream_send(c, e, n);
    } else {
        char *e = api_stream_delta_json(&ch->stream, api_tev_delta(ev, 0), ch->lp, ch->n_lp, &n);
        rc = stream_send(c, e, n);
        if (rc >= 0 && ev->kind == API_TEV_CALL) {
            ch->ev_slow |= rc > 0;
            e = api_stream_delta_json(&ch->stream, api_tev_delta(ev, 1), NULL, 0, &n);
            rc = stream_send(c, e, n);
        }
    }
    sent_logprobs(ch);
    ch->ev_slow |= rc > 0;
    return rc < 0 ? rc : 0;
}

static int parse_text(struct api_choice *ch, const char *text, size_t len,
                      const struct api_token_logprob *lp, size_t n_lp)
{
    if (!ch->call->req.stream)
        return api_tparse_feed(ch->tp, text, len, api_tout_collect, &ch->tout);
    int rc = stream_start(ch->call);
    if (rc < 0)
        return rc;
    if (ch->call->req.logprobs && (rc = keep_logprobs(ch, lp, n_lp)) < 0)
        return rc;
    ch->ev_slow = 0;
    rc = api_tparse_feed(ch->tp, text, len, stream_event, ch);
    return rc < 0 ? rc : ch->ev_slow;
}

static int call_text(struct api_call *c, struct api_choice *ch, const char *text, size_t len,
                     const struct api_token_logprob *lp, size_t n_lp)
{
    int rc;
    if ((rc = parsed(ch)) < 0) {
        /* out of memory */
    } else if (rc == 1) {
        rc = parse_text(ch, text, len, lp, n_lp);
        if (rc >= 0 && !c->req.stream)
            rc = keep_logprobs(ch, lp, n_lp);
    } else if (c->req.stream) {
        rc = stream_text(c, ch, text, len, lp, n_lp);
    } else {
        rc = keep_text(ch, text, len);
        if (rc == 0)
            rc = keep_logprobs(ch, lp, n_lp);
    }
    return rc;
}

/* tests only: the scripted answer instead of the model's text, three characters a piece so
 * that streams split it at many places */
static int test_text(struct api_call *c, struct api_choice *ch)
{
    const char *s = c->api->test_output;
    int rc = 0;
    ch->test_fed = 1;
    while (*s && rc >= 0) {
        size_t n = 0;
        for (int k = 0; k < 3 && s[n]; k++)
            do
                n++;
            while (((unsigned char)s[n] & 0xc0) == 0x80);
        rc = call_text(c, ch, s, n, NULL, 0);
        s += n;
    }
    return rc;
}

/* tests only: a choice ending with the script not fed yet gets it whole, and ends as the
 * model had stopped */
static enum api_finish test_end(struct api_call *c, struct api_choice *ch, enum api_finish f)
{
    if (!c->api->test_output || c->req.endpoint != API_CHAT)
        return f;
    if (!ch->test_fed && !c->closed)
        test_text(c, ch);
    return f == API_FINISH_LENGTH ? API_FINISH_STOP : f;
}

/* a parsed choice that called tools ends with tool_calls rather than stop */
static enum api_finish calls_finish(const struct api_choice *ch, enum api_finish f)
{
    return ch->tp && api_tparse_calls(ch->tp) > 0 && f == API_FINISH_STOP ? API_FINISH_TOOL_CALLS
                                                                          : f;
}

int api_call_choice_token(struct api_call *c, uint32_t seq, const char *text, size_t len,
                          const struct api_token_logprob *lp, size_t n_lp)
{
    if (c->closed)
        return RKV_ECLOSED;
    if (seq >= c->n_ch)
        return RKV_EINVAL;
    struct api_choice *ch = &c->ch[seq];
    if (!c->req.logprobs)
        n_lp = 0;
    int rc;
    c->in_api = 1;
    if (c->api->test_output && c->req.endpoint == API_CHAT)
        rc = ch->test_fed ? 0 : test_text(c, ch);
    else
        rc = call_text(c, ch, text, len, lp, n_lp);
    c->in_api = 0;
    if (c->closed)
        return RKV_ECLOSED;
    return rc;
}

int api_call_token(struct api_call *c, const char *text, size_t len,
                   const struct api_token_logprob *lp, size_t n_lp)
{
    return api_call_choice_token(c, 0, text, len, lp, n_lp);
}

/* streaming: the choice's last chunks (an echo still held, then its finish) */
static int stream_end_choice(struct api_call *c, struct api_choice *ch)
{
    size_t n = 0;
    ch->finish = test_end(c, ch, ch->finish);
    int rc = ch->text.n ? stream_text(c, ch, "", 0, NULL, 0) : stream_start(c);
    if (rc >= 0 && parsed(ch) == 1)
        rc = api_tparse_finish(ch->tp, stream_event, ch);
    ch->finish = calls_finish(ch, ch->finish);
    if (rc >= 0) {
        /* logprobs of a tail no chunk carried (held back, then not text: a call's end) */
        char *ev = api_stream_finish(&ch->stream, ch->finish, ch->lp, ch->n_lp, &n);
        rc = stream_send(c, ev, n);
        sent_logprobs(ch);
    }
    return rc;
}

#define API_SSE_KEEPALIVE ": keep-alive\n\n"

int api_call_keepalive(struct api_call *c)
{
    if (c->closed)
        return RKV_ECLOSED;
    if (!c->req.stream)
        return 0;
    c->in_api = 1;
    int rc = stream_start(c);
    if (rc >= 0)
        rc = http_resp_write(c->http, API_SSE_KEEPALIVE, strlen(API_SSE_KEEPALIVE));
    c->in_api = 0;
    return c->closed ? RKV_ECLOSED : rc < 0 ? rc : 0;
}

int api_call_choice_end(struct api_call *c, uint32_t seq, enum api_finish finish, double score)
{
    if (c->closed)
        return RKV_ECLOSED;
    if (seq >= c->n_ch || c->ch[seq].finish != API_FINISH_NONE)
        return RKV_EINVAL;
    struct api_choice *ch = &c->ch[seq];
    ch->finish = finish == API_FINISH_NONE ? API_FINISH_ABORT : finish;
    ch->score = score;
    if (!c->req.stream)
        return 0;
    c->in_api = 1;
    int rc = stream_end_choice(c, ch);
    c->in_api = 0;
    return c->closed ? RKV_ECLOSED : rc;
}

/* the seqs a non-stream answer returns, in order: all of them, or each prompt's n best of
 * best_of by score (ties: the earlier sequence) */
static void pick_choices(const struct api_call *c, uint32_t *out)
{
    size_t per = (size_t)c->req.best_of, n = (size_t)c->req.n, o = 0;
    if (per == n) {
        for (size_t k = 0; k < c->n_ch; k++)
            out[k] = (uint32_t)k;
        return;
    }
    for (size_t p = 0; p * per < c->n_ch; p++) {
        uint32_t *sel = out + o;
        for (size_t k = 0; k < per; k++) {
            uint32_t j = (uint32_t)(p * per + k);
            /* insertion into the ranked list of the best n so far */
            size_t at = RKV_MIN(k, n);
            while (at > 0 && c->ch[sel[at - 1]].score < c->ch[j].score) {
                if (at < n)
                    sel[at] = sel[at - 1];
                at--;
            }
            if (at < n)
                sel[at] = j;
        }
        o += n;
    }
}

static void respond_choices(struct api_call *c, const struct api_usage *usage)
{
    size_t n_out = api_request_prompts(&c->req) * (size_t)c->req.n;
    uint32_t *pick = calloc(c->n_ch, sizeof *pick);
    struct api_result *res = calloc(n_out, sizeof *res);
    char *j = NULL;
    if (pick && res) {
        pick_choices(c, pick);
        int ok = 1;
        for (size_t i = 0; i < n_out; i++) {
            struct api_choice *ch = &c->ch[pick[i]];
            res[i] = (struct api_result){
                strbuf_str(&ch->text), ch->text.n, ch->lp, ch->n_lp, ch->finish, *usage, NULL};
            int rc = parsed(ch);
            if (rc == 1 && api_tparse_finish(ch->tp, api_tout_collect, &ch->tout) >= 0) {
                res[i].tout = &ch->tout;
                res[i].finish = calls_finish(ch, ch->finish);
            } else if (rc != 0) {
                ok = 0; /* out of memory */
            }
        }
        if (ok)
            j = api_render_choices(&c->req, c->id, c->model, c->created, res, n_out, usage);
    }
    free(pick);
    free(res);
    if (j) {
        http_respond(c->http, 200, "application/json", j, strlen(j));
        free(j);
    } else {
        struct api_error e;
        api_error_set(&e, 500, NULL, "out of memory rendering the response");
        send_error(c->http, &e);
    }
}

void api_call_finish(struct api_call *c, enum api_finish finish, const struct api_usage *usage)
{
    static const struct api_usage none;
    if (!usage)
        usage = &none;
    /* counted as OpenAI bills: prompt (cached included) + completion */
    c->charge = (uint64_t)usage->prompt_tokens + usage->completion_tokens;
    c->in_api = 1;
    if (c->closed) {
        /* the client is gone; this only releases the http request */
        if (c->started)
            http_resp_end(c->http);
        else
            http_respond(c->http, 499, NULL, NULL, 0);
    } else if (c->req.stream) {
        int rc = 0;
        /* choices not ended yet end with finish */
        for (size_t k = 0; rc >= 0 && k < c->n_ch; k++) {
            if (c->ch[k].finish != API_FINISH_NONE)
                continue;
            c->ch[k].finish = finish;
            rc = stream_end_choice(c, &c->ch[k]);
        }
        if (rc >= 0)
            rc = stream_start(c); /* no choices: still a well-formed stream */
        if (rc >= 0 && c->req.include_usage) {
            size_t n = 0;
            char *ev = api_stream_usage(&c->ch[0].stream, usage, &n);
            rc = stream_send(c, ev, n);
        }
        if (rc >= 0)
            http_resp_write(c->http, API_SSE_DONE, strlen(API_SSE_DONE));
        http_resp_end(c->http);
    } else {
        for (size_t k = 0; k < c->n_ch; k++) {
            if (c->ch[k].finish == API_FINISH_NONE)
                c->ch[k].finish = finish;
            c->ch[k].finish = test_end(c, &c->ch[k], c->ch[k].finish);
        }
        respond_choices(c, usage);
    }
    call_destroy(c);
}

void api_call_fail(struct api_call *c, int status, const char *message)
{
    struct api_error e;
    api_error_set(&e, status, NULL, "%s", message ? message : "internal error");
    c->in_api = 1;
    if (c->closed) {
        if (c->started)
            http_resp_end(c->http);
        else
            http_respond(c->http, 499, NULL, NULL, 0);
    } else if (c->started) {
        /* the status line is gone: the error travels as an event, as vLLM sends it */
        char *j = api_error_json(&e);
        size_t n = 0;
        char *ev = j ? api_sse_event(j, &n) : NULL;
        if (ev)
            http_resp_write(c->http, ev, n);
        free(ev);
        free(j);
        http_resp_write(c->http, API_SSE_DONE, strlen(API_SSE_DONE));
        http_resp_end(c->http);
    } else {
        send_error(c->http, &e);
    }
    call_destroy(c);
}
