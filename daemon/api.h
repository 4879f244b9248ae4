/* api.h - the OpenAI-compatible JSON layer: request parsing/validation, response and SSE rendering,
 * and the interface between the HTTP endpoints and the scheduler. */
#ifndef RKV_API_H
#define RKV_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/ratelimit.h"
#include "proto/wire.h"

struct http_req;
struct cJSON;
struct api_tout;

/* --- parsed requests ----------------------------------------------------------------
 *
 * Field policy (strict, so a typo never silently changes what a user gets):
 *  - implemented: model, prompt (completions), messages (chat), max_tokens,
 *    max_completion_tokens (chat), temperature, top_p, top_k, min_p, seed,
 *    stop, presence_penalty, frequency_penalty, repetition_penalty, logprobs,
 *    top_logprobs (chat), n, best_of (completions, not streamed), suffix (completions,
 *    models with FIM tokens), stream, stream_options.include_usage, user,
 *    session_id (not with several sequences), ignore_eos, echo (completions, not with
 *    logprobs or suffix), logit_bias, response_format (text, json_object, json_schema);
 *    chat: tools, tool_choice, parallel_tool_calls, chat_template_kwargs,
 *    reasoning_effort (api_tools.h).
 *  - accepted and ignored, because they do not change the tokens produced:
 *    metadata, store, service_tier, prompt_cache_key, safety_identifier, and
 *    each "off" value of the unsupported ones below (functions [], function_call
 *    "none"/"auto", modalities ["text"]).
 *  - unsupported, 400 naming the field: anything that would change the output
 *    rkv cannot honour: functions/function_call, audio, prediction, web_search_options.
 *  - vLLM extensions at their defaults only (skip_special_tokens true,
 *    spaces_between_special_tokens true, add_generation_prompt true,
 *    include_stop_str_in_output false, min_tokens 0, stop_token_ids []).
 *  - any other field: 400 "unknown field 'x'" (docs/api.md lists them all).
 */

#define API_MAX_STOP       8   /* stop sequences (OpenAI allows 4; vLLM more) */
#define API_MAX_STOP_BYTES 256 /* bytes in one stop sequence */
#define API_MAX_LOGPROBS   20  /* completions logprobs, chat top_logprobs */
#define API_MAX_MESSAGES   4096
#define API_MAX_SESSION_ID 128
#define API_MAX_LOGIT_BIAS PROTO_MAX_LOGIT_BIAS /* logit_bias entries (OpenAI allows 300) */
#define API_MAX_GRAMMAR    (256 * 1024)         /* bytes of the grammar a response_format makes */
#define API_MAX_N          16                   /* n and best_of */
#define API_MAX_PROMPTS    64                   /* prompts in one completions request */
#define API_MAX_SEQS       256                  /* sequences of one request: prompts x best_of */

enum api_endpoint { API_COMPLETIONS, API_CHAT };

enum api_role { API_ROLE_SYSTEM, API_ROLE_USER, API_ROLE_ASSISTANT, API_ROLE_TOOL };

struct api_message {
    enum api_role role;    /* "developer" arrives as SYSTEM */
    const char *role_name; /* "system" | "user" | "assistant" | "tool" (static) */
    char *content;         /* parts of an array content joined; "" when null */
    char *extra_json;      /* NULL, or the template's other keys: tool_calls (arguments parsed),
                            * tool_call_id, name (api_tools_parse_message) */
};

/* one prompt of a completions prompt list: text or token ids */
struct api_prompt {
    char *text;
    int32_t *tokens;
    size_t n_tokens;
};

struct api_tools;

struct api_request {
    enum api_endpoint endpoint;
    char *model; /* NULL when the client sent none */
    /* completions: exactly one of prompt / prompt_tokens */
    char *prompt;
    int32_t *prompt_tokens;
    size_t n_prompt_tokens;
    /* completions: a prompt list's prompts after the first (the first is prompt /
     * prompt_tokens); api_request_prompts() counts them all */
    struct api_prompt *more_prompts;
    size_t n_more_prompts;
    char *suffix; /* completions: fill in the middle (PRE prompt SUF suffix MID); NULL if none */
    /* choices: n per prompt, the best n of best_of sequences (best_of: completions, not
     * streamed); 1..API_MAX_N, best_of >= n */
    int n;
    int best_of;
    /* chat */
    struct api_message *messages;
    size_t n_messages;
    struct api_tools *tools; /* chat: tools, tool_choice, template variables (api_tools.h) */
    /* sampling */
    int max_tokens;      /* [1, limits.max_tokens]; limits.default_max_tokens when absent */
    bool has_max_tokens; /* the client sent max_tokens (or max_completion_tokens) */
    float temperature;   /* [0, 2], default 1; 0 = greedy */
    float top_p;         /* (0, 1], default 1 */
    int top_k;           /* -1 or 0 = off, default -1 */
    float min_p;         /* [0, 1], default 0 */
    bool has_seed;
    int64_t seed;
    char *stop[API_MAX_STOP];
    size_t n_stop;
    float presence_penalty;        /* [-2, 2], default 0 */
    float frequency_penalty;       /* [-2, 2], default 0 */
    float repetition_penalty;      /* (0, 10], default 1 */
    struct proto_bias *logit_bias; /* (n_logit_bias) token ids in the vocabulary, biases in
                                    * [-100, 100], each id once */
    size_t n_logit_bias;           /* <= API_MAX_LOGIT_BIAS */
    /* response_format json_object / json_schema: the GBNF grammar (common/grammar.h) the answer
     * follows, token by token; NULL: free text */
    char *grammar;
    /* logprobs: completions "logprobs": N -> logprobs=true, top_logprobs=N;
     * chat "logprobs": true + "top_logprobs": N */
    bool logprobs;
    int top_logprobs; /* [0, 20] alternatives per token */
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    bool ignore_eos;
    bool add_generation_prompt; /* chat: true; POST /tokenize may send false */
    bool echo;                  /* completions: the prompt's text starts the answer */
    char *user;
    char *session_id; /* body field, else the X-Session-Id header (set by api_handle) */
    /* the API key's prompt cap in tokens (0 = only the context's); api_handle sets it, the
     * scheduler refuses a longer prompt with 400 */
    uint32_t max_prompt_tokens;
    int64_t key_id; /* the API key: owns its sessions and cached prefixes (0 = none) */
};

struct api_limits {
    int max_tokens;           /* the largest max_tokens accepted (32768) */
    int default_max_tokens;   /* completions without max_tokens get this (16, as OpenAI);
                               * chat without one gets max_tokens (the scheduler caps
                               * it by what is left of the context) */
    size_t max_prompt_tokens; /* length of a token-id prompt (32768) */
    int32_t vocab_size;       /* token ids must be below it; 0 = unchecked */
};
void api_limits_default(struct api_limits *l);

/* an error in the OpenAI shape:
 * {"error":{"message":..., "type":..., "param":..., "code":...}} */
struct api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... (static) */
    const char *code; /* static, or NULL for null */
    char param[96];   /* "" for null */
    char message[512];
};
void api_error_set(struct api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* malloc'd JSON; NULL only when out of memory */
char *api_error_json(const struct api_error *e);

/* parse and validate a body. 0, or RKV_EINVAL with err filled (status 400,
 * message naming the field, the value and what is allowed). On error the
 * request holds nothing to free; on success free it with api_request_fini. */
int api_parse_completions(const char *body, size_t len, const struct api_limits *lim,
                          struct api_request *out, struct api_error *err);
int api_parse_chat(const char *body, size_t len, const struct api_limits *lim,
                   struct api_request *out, struct api_error *err);
void api_request_fini(struct api_request *r);
/* a session id (body session_id or X-Session-Id): 1 to API_MAX_SESSION_ID bytes, no control
 * characters */
int api_session_id_ok(const char *id);
/* prompts in a completions request (1 for chat) */
size_t api_request_prompts(const struct api_request *r);
/* prompt i of api_request_prompts(r): its text, or its ids (*text NULL) */
void api_request_prompt(const struct api_request *r, size_t i, const char **text,
                        const int32_t **tokens, size_t *n_tokens);
/* the sequences a request generates: prompts x best_of */
size_t api_request_seqs(const struct api_request *r);
/* POST /tokenize, vLLM's shape: {"model", "prompt"} (as /v1/completions takes it) or
 * {"model", "messages", "add_generation_prompt"}; endpoint says which. POST /detokenize:
 * {"model", "tokens": [ids]}, the ids in prompt_tokens. Errors as api_parse_chat's. */
int api_parse_tokenize(const char *body, size_t len, const struct api_limits *lim,
                       struct api_request *out, struct api_error *err);
int api_parse_detokenize(const char *body, size_t len, const struct api_limits *lim,
                         struct api_request *out, struct api_error *err);

/* 1 when s[0..len) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF);
 * *bad_at: offset of the first bad byte */
int api_utf8_valid(const char *s, size_t len, size_t *bad_at);

/* --- rendering ------------------------------------------------------------------------- */

enum api_finish {
    API_FINISH_NONE = 0,   /* still running */
    API_FINISH_STOP,       /* EOS or a stop sequence */
    API_FINISH_LENGTH,     /* max_tokens or the context ran out */
    API_FINISH_ABORT,      /* cancelled (client gone, shutdown) */
    API_FINISH_TOOL_CALLS, /* chat: stopped after tool calls (api_call_finish maps STOP) */
};
const char *api_finish_name(enum api_finish f); /* "stop", "length", "abort", NULL */

/* one alternative at a token position */
struct api_top_logprob {
    const char *token; /* the token's bytes (may be part of a UTF-8 character) */
    size_t len;
    float logprob;
};
/* the sampled token at one position and its alternatives */
struct api_token_logprob {
    const char *token;
    size_t len;
    float logprob;
    const struct api_top_logprob *top;
    size_t n_top;
};

struct api_usage {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens; /* prompt tokens served from a reused KV prefix */
};

/* a finished non-stream generation */
struct api_result {
    const char *text;
    size_t len;
    const struct api_token_logprob *lp; /* one per generated token when logprobs */
    size_t n_lp;
    enum api_finish finish;
    struct api_usage usage;
    const struct api_tout *tout; /* chat with tools or reasoning: the message's parts, else NULL */
};

/* "cmpl-<32 hex>" / "chatcmpl-<32 hex>" into buf (>= 48 bytes) */
void api_make_id(enum api_endpoint ep, char *buf, size_t cap);

/* the whole response body (malloc'd JSON); model: the name to report */
char *api_render_response(const struct api_request *req, const char *id, const char *model,
                          uint64_t created, const struct api_result *res);
/* the same with n choices, res[i] as index i, and the request's usage (each res's is unused) */
char *api_render_choices(const struct api_request *req, const char *id, const char *model,
                         uint64_t created, const struct api_result *res, size_t n,
                         const struct api_usage *usage);

/* counts the characters a byte stream starts, as its text decodes it: a valid sequence is one,
 * so is each maximal invalid subpart (one U+FFFD); a sequence still open counts as started */
struct api_chars {
    size_t n;
    uint8_t need, lo, hi; /* continuation bytes the open sequence wants, the next one's range */
};

/* streaming: one api_stream per request renders each SSE event,
 * "data: {json}\n\n" (malloc'd; *len set), in the order OpenAI/vLLM send:
 *   chat:  role chunk (begin), content chunks, finish chunk, [usage chunk], [DONE]
 *   compl: text chunks, finish chunk, [usage chunk], [DONE] */
struct api_stream {
    const struct api_request *req;
    char id[64];
    char model[256];
    uint64_t created;
    size_t text_offset;           /* characters sent so far (completions text_offset) */
    struct api_chars token_chars; /* the characters the tokens sent so far start */
    uint32_t index;               /* the choice's index its chunks carry (0 after init) */
};
void api_stream_init(struct api_stream *s, const struct api_request *req, const char *id,
                     const char *model, uint64_t created);
/* chat: {"delta":{"role":"assistant","content":""}}; completions: NULL */
char *api_stream_begin(struct api_stream *s, size_t *len);
char *api_stream_delta(struct api_stream *s, const char *text, size_t text_len,
                       const struct api_token_logprob *lp, size_t n_lp, size_t *len);
/* lp: chat only, the logprobs of tokens whose text no chunk carried (a tool call's tail) */
char *api_stream_finish(struct api_stream *s, enum api_finish finish,
                        const struct api_token_logprob *lp, size_t n_lp, size_t *len);
/* chat: a chunk with this delta object (a struct cJSON *, consumed), and the logprobs of the
 * tokens that made it */
char *api_stream_delta_json(struct api_stream *s, struct cJSON *delta,
                            const struct api_token_logprob *lp, size_t n_lp, size_t *len);
/* only when req->include_usage */
char *api_stream_usage(struct api_stream *s, const struct api_usage *u, size_t *len);
#define API_SSE_DONE "data: [DONE]\n\n"
/* "data: <json>\n\n" (malloc'd) */
char *api_sse_event(const char *json, size_t *len);

/* GET /v1/models */
char *api_render_models(const char *const *names, size_t n, uint64_t created, int max_model_len);
/* GET /v1/models/{id}: the one model object */
char *api_render_model(const char *name, uint64_t created, int max_model_len);
/* POST /tokenize: {"tokens": [...], "count": n, "max_model_len": m} */
char *api_render_tokens(const int32_t *ids, size_t n, int max_model_len);
/* POST /detokenize: {"prompt": text}, invalid UTF-8 and NUL bytes as U+FFFD */
char *api_render_detokenized(const char *text, size_t len);

/* --- the endpoints and the scheduler ---------------------------------------------------
 *
 * api_handle() serves POST /v1/completions, POST /v1/chat/completions,
 * GET /v1/models[/{id}], POST /tokenize and POST /detokenize on the HTTP
 * server: auth, content type, parsing, then the scheduler's submit(). The
 * scheduler answers through the api_call:
 *
 *   submit(ctx, call, req)       -> 0: accepted; negative: refused (see below)
 *   api_call_token(call, ...)    -> text of newly final tokens (0..n times)
 *   api_call_finish(call, ...)   -> exactly once, or api_call_fail() instead
 *   cancel(ctx, call)            <- the client left: stop, then still finish
 *                                   (from the loop, never inside api_call_*)
 *   resume(ctx, call)            <- a stream's client, behind (a token write
 *                                   returned 1), caught up: go on
 *
 * All on the loop thread. The request given to submit stays valid until the
 * call finishes. The scheduler owns detokenization (text it sends is whole
 * UTF-8 characters) and stop sequences (it holds back text that could be the
 * start of a stop string and never sends the stop string itself), because it
 * must stop generating when one matches.
 */
struct api_call;

struct api_sched {
    /* a validated request. 0 when accepted; refusals: RKV_EBUSY -> 429
     * (queue full), RKV_ESTATE/RKV_ENODEV -> 503 (no worker / model not
     * loaded), RKV_ETOOBIG -> 400 (prompt longer than the context), other -> 500.
     * submit may also call api_call_fail() itself (then return 0). */
    int (*submit)(void *ctx, struct api_call *call, const struct api_request *req);
    /* the client is gone (disconnect, shutdown): stop generating and finish */
    void (*cancel)(void *ctx, struct api_call *call);
    /* optional: 0 when bearer (NULL when absent) may use the API, else
     * RKV_EAUTH -> 401 */
    int (*authorize)(void *ctx, const char *bearer);
    void *ctx;
    /* optional, POST /tokenize: the ids a generation of req would prefill (the chat
     * template applied, BOS added as the model wants). 0 with *ids (malloc'd) and *n, or
     * negative with *status and err naming the cause and the fix. without it: 404 */
    int (*tokenize)(void *ctx, const struct api_request *req, int32_t **ids, size_t *n, int *status,
                    char *err, size_t errlen);
    /* optional, POST /detokenize: the text of ids (malloc'd, n_text bytes and a NUL; a <0x00>
     * token's byte among them), control tokens as nothing */
    int (*detokenize)(void *ctx, const int32_t *ids, size_t n, char **text, size_t *n_text);
    /* optional: a stream whose token write returned 1 (the client is behind) was read down
     * to half the high-water mark; its sequences may go on */
    void (*resume)(void *ctx, struct api_call *call);
};

struct api_config {
    const char *const *models; /* served names; the first is the default */
    size_t n_models;
    int max_model_len; /* context size, reported by /v1/models */
    struct api_limits limits;
    /* browsers: the Access-Control-Allow-Origin to send ("*" as vLLM does,
     * or one origin); NULL sends no CORS headers and refuses preflights */
    const char *cors_origin;
    /* per-key limits: what a key without its own value gets (0 = unlimited),
     * and the window of rpm/tpm in ms (0 = 60000) */
    struct rl_limits key_defaults;
    uint64_t rate_window_ms;
    /* tests only (rkvd's test_scripted_output): every chat answer's text is this, fed to the
     * output parser a few characters at a time, instead of the model's; NULL when serving */
    const char *test_output;
};

struct api;
int api_create(const struct api_config *cfg, const struct api_sched *sched, struct api **out);
void api_destroy(struct api *api);
/* 1 when path is an API route (answered or handed to the scheduler), 0 when
 * the caller should route it elsewhere */
int api_handle(struct api *api, struct http_req *req);
/* calls in flight */
size_t api_calls(const struct api *api);

/* the key check with limits, used instead of api_sched.authorize when set:
 * 0 with *key (its id; 0 when the API is open, which has no limits) and
 * *lim (a field < 0 follows api_config.key_defaults), or RKV_EAUTH -> 401 */
typedef int (*api_key_lookup_fn)(void *ud, const char *bearer, int64_t *key, struct rl_limits *lim);
void api_set_key_lookup(struct api *api, api_key_lookup_fn fn, void *ud);

const struct api_request *api_call_request(const struct api_call *call);
void api_call_set_data(struct api_call *call, void *data);
void *api_call_data(const struct api_call *call);
/* newly final text and, when the request asked for logprobs, one entry per
 * token it covers (copied). 0: sent; 1: sent but the client reads slowly;
 * RKV_ECLOSED: the client is gone: finish with API_FINISH_ABORT. cancel()
 * is never called from inside an api_call_* function, so a departure seen
 * during this call is reported only by this return value. */
int api_call_token(struct api_call *call, const char *text, size_t len,
                   const struct api_token_logprob *lp, size_t n_lp);
/* the same for sequence seq of a request of several (api_request_seqs: prompt i's k-th of
 * best_of is i * best_of + k); api_call_token is seq 0's. RKV_EINVAL: no such seq */
int api_call_choice_token(struct api_call *call, uint32_t seq, const char *text, size_t len,
                          const struct api_token_logprob *lp, size_t n_lp);
/* sequence seq ended (score: its mean logprob per token, which best_of ranks by); streaming
 * sends its finish chunk now. Then api_call_finish once all have ended ends the call; a
 * sequence not ended by then takes api_call_finish's finish. 0, RKV_ECLOSED as above */
int api_call_choice_end(struct api_call *call, uint32_t seq, enum api_finish finish, double score);
/* a streamed call with nothing to send for a while: an SSE comment line (": keep-alive"),
 * which clients skip, so proxies and client read timeouts do not end a stream that waits (for
 * its rotation turn, a long prefill, the queue); the SSE head goes first if it has not yet.
 * nothing for a call that does not stream. 0, RKV_ECLOSED as above */
int api_call_keepalive(struct api_call *call);
/* the end: renders the response (or the last SSE events) and frees the call */
void api_call_finish(struct api_call *call, enum api_finish finish, const struct api_usage *usage);
/* the end with an error: status and a message naming the cause and the fix;
 * mid-stream it is sent as an SSE error event. frees the call */
void api_call_fail(struct api_call *call, int status, const char *message);

#endif
