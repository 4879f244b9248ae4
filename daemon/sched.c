/* sched.c - sequences, sessions and continuous batching on rkvd's loop. */
#include "daemon/sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/err.h"
#include "common/json_schema.h"
#include "common/log.h"
#include "common/stop.h"
#include "common/tok.h"
#include "common/util.h"
#include "daemon/api_tools.h"
#include "daemon/metrics.h"
#include "daemon/store.h"
#include "proto/kvwire.h"

enum seq_state { SEQ_WAITING, SEQ_RUNNING };

struct session;
struct seq;

/* a request's sequences (prompts x best_of) and their one api_call */
struct fan {
    struct api_call *call; /* NULL once the call failed: its sequences end without it */
    struct seq **seqs;     /* (n_seqs) NULL once gone */
    uint32_t n_seqs, n_live;
    uint32_t per_prompt;    /* best_of */
    struct api_usage usage; /* each prompt once, every sequence's completion */
    enum api_finish last;
    uint64_t t_arrival_ns, t_first_ns;
    /* the grammar every sequence samples under: the request's response_format, or for
     * tool_choice "required" / a named tool the call's markup around its JSON (made here,
     * where the chat template says which markup); NULL: free text */
    const char *grammar;
    char *tool_grammar;  /* owned, when grammar is a tool call's */
    uint64_t t_alive_ns; /* the last token or keep-alive the client got */
    int gone;            /* a keep-alive found the client gone: being aborted */
    /* a stream's write found the client behind (its connection holds more than the write
     * high-water mark): its sequences wait for it to read, until SCHED_SLOW_CLIENT_MS; 0 while
     * it keeps up */
    uint64_t slow_since_ms;
};

/* a stream client that reads nothing for this long after its buffer filled loses its request
 * (its sequences hold running slots and kv while they wait) */
#define SCHED_SLOW_CLIENT_MS 60000

/* one sequence of a request */
struct seq {
    struct sched *s;
    struct fan *fan;
    uint32_t index;   /* in fan->seqs: prompt i's k-th is i * per_prompt + k */
    struct seq *lead; /* its prompt's first sequence, while that one prefills */
    double sum_lp;    /* logprobs of its tokens (best_of ranks by their mean) */
    const struct api_request *req;
    struct session *sess;
    enum seq_state state;
    uint32_t worker;
    uint32_t n_prompt; /* session history length when generation starts */
    uint32_t n_gen;
    uint32_t max_tokens;
    uint32_t cached; /* prompt tokens whose KV was reused */
    struct proto_sampling sp;
    struct tok_detok detok;
    struct stop *stop;
    int in_flight; /* part of the job now running */
    int cancelled;
    int stalled; /* kvmgr had no room for it last step */
    uint64_t t_arrival_ns, t_first_ns, t_last_ns;
    uint64_t max_gap_ns;     /* the longest wait between two of its tokens (a rotation turn) */
    struct seq *prev, *next; /* the waiting queue or a worker's running list */
};

/* a KV-holding conversation; private ones live for one request */
struct session {
    uint64_t sid;
    char ext_id[API_MAX_SESSION_ID + 1]; /* "" for a private session */
    /* the API key that made it (0 without keys): another key naming the same ext_id
     * gets a session of its own */
    int64_t owner;
    int32_t *tokens; /* (n_tokens) prompt and generated tokens */
    uint32_t n_tokens, cap;
    uint32_t n_kv;     /* positions whose KV kvmgr holds */
    uint32_t n_owed;   /* ids before position n_kv kvmgr was not told yet (a step of
                        * several decode steps picked them): the next prep brings them */
    uint32_t worker;   /* where its sampler state lives */
    int worker_knows;  /* the worker has a sampler for it */
    int kvmgr_knows;   /* kvmgr has blocks for it (else the next prep says NEW) */
    int kv_unsure;     /* a step of it failed: kvmgr may hold positions nothing wrote */
    int pinned;        /* operator pinned: kvmgr keeps it resident */
    uint64_t kv_bytes; /* the bytes of its blocks in its last step's table */
    struct seq *busy;  /* the request using it, or NULL */
    uint64_t last_use_ms;
    struct session *lru_prev, *lru_next; /* named sessions, most recent first */
};

struct seq_list {
    struct seq *head, *tail;
    uint32_t n;
};

struct worker_slot {
    int up;
    int busy;                  /* a job is with the driver */
    int drained;               /* operator drain: no new sessions */
    uint32_t failures;         /* consecutive failed steps */
    uint64_t first_failure_ms; /* when the run of failures began */
    struct seq_list running;
    struct rkv_vec closes;  /* uint64_t sids to release before the next step */
    struct rkv_vec forgets; /* uint64_t sids whose sampler this worker drops (moved away) */
    struct rkv_vec idles;
    struct rkv_vec picks;     /* struct pick: kick's scratch */
    double step_ms;           /* the last step's time per decode step (decode_steps_ms) */
    struct sched_steps steps; /* its step sizes (sched_worker_up) */
    uint32_t beside;          /* beside_decode_ms's learned size (0: steps' own) */
    uv_timer_t retry;
};

/* one sequence a step takes and how many of its tokens */
struct pick {
    struct seq *q;
    uint32_t take;
};

struct sched {
    uv_loop_t *loop;
    struct sched_config cfg;
    const struct tok *tok;
    struct sched_driver drv;
    struct metrics *metrics;
    struct store *store;
    struct worker_slot *workers;
    struct seq_list waiting;
    struct rkv_map by_sid;   /* sid -> seq (running) */
    struct rkv_map sessions; /* sid -> session */
    struct session *lru_head, *lru_tail;
    uint32_t n_named;
    uint64_t next_sid;
    int draining;
    int serving;        /* a worker has been up (later, requests wait for a restarted one) */
    uint32_t kvmgr_pid; /* the kvmgr holding the sessions' KV (0: not seen yet) */
    uint32_t kv_gen;    /* bumped when kvmgr restarts: steps of older ones are stale */
    uint32_t n_closing;
    struct sched_stats st;
    int (*authorize)(void *ud, const char *bearer);
    void *authorize_ud;
    /* metric families */
    struct metric *m_stall; /* each stream's longest gap between two tokens */
    struct metric *m_running, *m_waiting, *m_prompt, *m_gen, *m_ttft, *m_itl, *m_e2e, *m_queue,
        *m_hits, *m_queries, *m_prefill, *m_success, *m_sessions, *m_sess_moved, *m_ahead, *m_multi,
        *m_iter;
};

/* failing steps go on being retried at least this long (a child's restart) */
#define SCHED_GIVE_UP_MS 10000

static void kick(struct sched *s, uint32_t w);
static void finish_seq(struct seq *q, enum api_finish f);
static int kvmgr_adopt(struct sched *s, uint32_t pid);

/* --- small helpers -------------------------------------------------------- */

static void list_push(struct seq_list *l, struct seq *q)
{
    q->next = NULL;
    q->prev = l->tail;
    if (l->tail)
        l->tail->next = q;
    else
        l->head = q;
    l->tail = q;
    l->n++;
}

static void list_remove(struct seq_list *l, struct seq *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        l->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        l->tail = q->prev;
    q->prev = q->next = NULL;
    l->n--;
}

static const char *const *model_label(struct sched *s)
{
    static const char *lv[1];
    lv[0] = s->cfg.model_name ? s->cfg.model_name : "rkv";
    return lv;
}

static void update_gauges(struct sched *s)
{
    uint32_t running = 0;
    for (uint32_t w = 0; w < s->cfg.n_workers; w++)
        running += s->workers[w].running.n;
    s->st.running = running;
    s->st.waiting = s->waiting.n;
    s->st.sessions = s->n_named;
    metric_set(s->m_running, model_label(s), running);
    metric_set(s->m_waiting, model_label(s), s->waiting.n);
    metric_set(s->m_sessions, model_label(s), s->n_named);
}

static int session_append(struct session *se, const int32_t *t, uint32_t n)
{
    if (se->n_tokens + n > se->cap) {
        uint32_t cap = se->cap ? se->cap : 64;
        while (cap < se->n_tokens + n)
            cap *= 2;
        int32_t *nt = realloc(se->tokens, cap * sizeof *nt);
        if (!nt)
            return RKV_ENOMEM;
        se->tokens = nt;
        se->cap = cap;
    }
    memcpy(se->tokens + se->n_tokens, t, n * sizeof *t);
    se->n_tokens += n;
    return 0;
}

static void lru_unlink(struct sched *s, struct session *se)
{
    if (se->lru_prev)
        se->lru_prev->lru_next = se->lru_next;
    else if (s->lru_head == se)
        s->lru_head = se->lru_next;
    if (se->lru_next)
        se->lru_next->lru_prev = se->lru_prev;
    else if (s->lru_tail == se)
        s->lru_tail = se->lru_prev;
    se->lru_prev = se->lru_next = NULL;
}

static void lru_touch(struct sched *s, struct session *se)
{
    lru_unlink(s, se);
    se->lru_next = s->lru_head;
    if (s->lru_head)
        s->lru_head->lru_prev = se;
    s->lru_head = se;
    if (!s->lru_tail)
        s->lru_tail = se;
    se->last_use_ms = rkv_now_ms();
}

static void queue_close(struct sched *s, struct session *se)
{
    rkv_vec_push(&s->workers[se->worker].closes, &se->sid);
}

static void session_destroy(struct sched *s, struct session *se, int release_kv)
{
    if (release_kv)
        queue_close(s, se);
    rkv_map_del(&s->sessions, se->sid);
    if (se->ext_id[0]) {
        lru_unlink(s, se);
        s->n_named--;
    }
    free(se->tokens);
    free(se);
}

static struct session *session_create(struct sched *s, int64_t owner, const char *ext_id,
                                      uint32_t worker)
{
    struct session *se = calloc(1, sizeof *se);
    if (!se)
        return NULL;
    se->sid = s->next_sid++;
    se->owner = owner;
    se->worker = worker;
    if (ext_id)
        snprintf(se->ext_id, sizeof se->ext_id, "%s", ext_id);
    if (rkv_map_put(&s->sessions, se->sid, se) != 0) {
        free(se);
        return NULL;
    }
    if (se->ext_id[0]) {
        s->n_named++;
        lru_touch(s, se);
        /* forget the least recently used idle sessions beyond the limit */
        for (struct session *v = s->lru_tail; v && s->n_named > s->cfg.max_sessions;) {
            struct session *prev = v->lru_prev;
            if (!v->busy && v != se)
                session_destroy(s, v, 1);
            v = prev;
        }
    }
    return se;
}

static struct session *session_find(struct sched *s, int64_t owner, const char *ext_id)
{
    for (struct session *se = s->lru_head; se; se = se->lru_next)
        if (se->owner == owner && strcmp(se->ext_id, ext_id) == 0)
            return se;
    return NULL;
}

static uint32_t pick_worker(struct sched *s)
{
    uint32_t best = 0, best_n = UINT32_MAX;
    for (uint32_t w = 0; w < s->cfg.n_workers; w++) {
        uint32_t n = s->workers[w].running.n + (s->workers[w].up ? 0 : 1000000) +
                     (s->workers[w].drained ? 2000000 : 0);
        if (n < best_n) {
            best_n = n;
            best = w;
        }
    }
    return best;
}

/* --- requests in -------------------------------------------------------------- */

/* text's ids (add_bos as the model wants, or not) appended to out */
static int encode_text(struct sched *s, const char *src, int add_bos, int parse_special,
                       struct rkv_vec *out)
{
    size_t len = strlen(src), cap = len + 16, n = 0;
    /* never more tokens than bytes + bos */
    int rc = rkv_vec_reserve(out, out->len + cap);
    if (rc == 0)
        rc = tok_encode(s->tok, src, len, add_bos, parse_special, (int32_t *)out->data + out->len,
                        cap, &n);
    if (rc == 0)
        out->len += n;
    return rc;
}

/* fill in the middle: out's ids (the prompt, no bos) become [bos] PRE prompt SUF suffix MID */
static int fim_wrap(struct sched *s, const char *suffix, struct rkv_vec *out, char *err,
                    size_t errlen, int *status)
{
    if (!s->cfg.has_fim) {
        *status = 400;
        snprintf(err, errlen,
                 "suffix: this model's vocabulary has no fill-in-the-middle tokens (such as "
                 "<|fim_prefix|> <|fim_suffix|> <|fim_middle|>), so it cannot complete "
                 "between a prompt and a suffix; leave suffix out or serve a FIM model");
        return RKV_EUNSUPPORTED;
    }
    struct rkv_vec suf;
    rkv_vec_init(&suf, sizeof(int32_t));
    int rc = encode_text(s, suffix, 0, 0, &suf);
    struct rkv_vec all;
    rkv_vec_init(&all, sizeof(int32_t));
    size_t cap = out->len + suf.len + 4;
    if (rc == 0)
        rc = rkv_vec_reserve(&all, cap);
    if (rc == 0) {
        int32_t bos = tok_add_bos(s->tok) ? tok_bos(s->tok) : -1;
        int n = fim_build(&s->cfg.fim, bos, out->data, out->len, suf.data, suf.len, all.data, cap);
        rc = n < 0 ? n : 0;
        all.len = n < 0 ? 0 : (size_t)n;
    }
    rkv_vec_fini(&suf);
    if (rc) {
        rkv_vec_fini(&all);
        snprintf(err, errlen, "cannot tokenize the suffix: %s", rkv_strerror(rc));
        return rc;
    }
    rkv_vec_fini(out);
    *out = all;
    return 0;
}

/* prompt i's ids (chat: the messages rendered). *status: the HTTP status of a failure; a
 * template that fails on this conversation (raise_exception, a value it cannot use, a limit)
 * is the client's to fix: 400 */
static int tokenize_prompt(struct sched *s, const struct api_request *r, size_t i,
                           struct rkv_vec *out, char *err, size_t errlen, int *status)
{
    *status = 500;
    const char *ptext = NULL;
    const int32_t *ids = NULL;
    size_t n_ids = 0;
    if (r->endpoint != API_CHAT)
        api_request_prompt(r, i, &ptext, &ids, &n_ids);
    int rc = 0;
    if (ids) {
        for (size_t k = 0; k < n_ids; k++)
            if (!rkv_vec_push(out, &ids[k]))
                return RKV_ENOMEM;
        return r->suffix ? fim_wrap(s, r->suffix, out, err, errlen, status) : 0;
    }
    char *text = NULL;
    if (r->endpoint == API_CHAT &&
        (rc = api_tools_render(s->tok, r, &text, status, err, errlen)) != 0)
        return rc;
    /* control tokens written as text (<|im_start|>, <|eot_id|>) are those tokens, in a
     * completion's prompt as in a rendered chat, as vLLM and llama.cpp's server read them */
    size_t at = out->len;
    rc = encode_text(s, text ? text : (ptext ? ptext : ""), !r->suffix, 1, out);
    free(text);
    if (rc) {
        snprintf(err, errlen, "cannot tokenize the prompt: %s", rkv_strerror(rc));
        return rc;
    }
    /* a prompt that writes the bos itself gets it once, not after the one the model adds */
    const int32_t *got = (const int32_t *)out->data + at;
    if (!r->suffix && out->len - at >= 2 && got[0] == got[1] && got[0] == tok_bos(s->tok)) {
        memmove((int32_t *)out->data + at, got + 1, (out->len - at - 1) * sizeof *got);
        out->len--;
    }
    return r->suffix ? fim_wrap(s, r->suffix, out, err, errlen, status) : 0;
}

static int tokenize(struct sched *s, const struct api_request *r, struct rkv_vec *out, char *err,
                    size_t errlen, int *status)
{
    return tokenize_prompt(s, r, 0, out, err, errlen, status);
}

static void fill_sampling(const struct api_request *r, struct proto_sampling *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->temperature = r->temperature;
    sp->top_p = r->top_p;
    sp->min_p = r->min_p;
    sp->presence_penalty = r->presence_penalty;
    sp->frequency_penalty = r->frequency_penalty;
    sp->repetition_penalty = r->repetition_penalty;
    sp->top_k = r->top_k > 0 ? r->top_k : 0;
    if (r->has_seed) {
        sp->seed = (uint64_t)r->seed;
    } else if (getrandom(&sp->seed, sizeof sp->seed, 0) != sizeof sp->seed) {
        sp->seed = rkv_now_ns();
    }
    sp->want_logits = r->logprobs ? 1 : 0;
    sp->n_top_logprobs = r->logprobs ? (uint8_t)r->top_logprobs : 0;
}

uint64_t sched_choice_seed(int64_t seed, uint32_t k)
{
    if (k == 0)
        return (uint64_t)seed;
    /* splitmix64 of the pair: nearby seeds and choices give unrelated streams */
    uint64_t z = (uint64_t)seed + 0x9e3779b97f4a7c15ull * ((uint64_t)k + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* a prompt's ids checked against the context and the key's cap: 0, or the message and the
 * status of the refusal in err and *status */
static int check_prompt(struct sched *s, const struct api_request *r, size_t i, size_t np,
                        char *err, size_t errlen, int *status)
{
    char which[32] = "";
    if (api_request_prompts(r) > 1)
        snprintf(which, sizeof which, "prompt[%zu]: ", i);
    *status = 400;
    if (np == 0) {
        snprintf(err, errlen, "%sthe prompt is empty after tokenization: send some text", which);
        return RKV_EINVAL;
    }
    if (np >= s->cfg.ctx_size) {
        snprintf(err, errlen,
                 "%sthe prompt has %zu tokens but the context size is %u: shorten the prompt "
                 "(at most %u tokens, leaving room for one generated token)",
                 which, np, s->cfg.ctx_size, s->cfg.ctx_size - 1);
        return RKV_ETOOBIG;
    }
    if (r->max_prompt_tokens && np > r->max_prompt_tokens) {
        snprintf(err, errlen,
                 "%sthe prompt has %zu tokens but API key %lld may send at most %u: shorten it, "
                 "or ask the operator to raise it (rkvctl keys limits %lld --max-prompt N)",
                 which, np, (long long)r->key_id, r->max_prompt_tokens, (long long)r->key_id);
        return RKV_ETOOBIG;
    }
    return 0;
}

static void fan_free(struct fan *f)
{
    free(f->tool_grammar);
    free(f->seqs);
    free(f);
}

static void seq_free(struct seq *q)
{
    stop_destroy(q->stop);
    free(q);
}

/* a new sequence of f for prompt ids pt (np of them), in a session of its own (or the named
 * one); *status/err on a refusal the client must see */
static int seq_start(struct sched *s, struct fan *f, uint32_t index, const int32_t *pt, uint32_t np,
                     struct seq *lead, char *err, size_t errlen, int *status)
{
    const struct api_request *r = api_call_request(f->call);
    *status = 500;
    struct seq *q = calloc(1, sizeof *q);
    if (!q)
        return RKV_ENOMEM;
    q->s = s;
    q->fan = f;
    q->index = index;
    q->lead = lead;
    q->req = r;
    q->t_arrival_ns = f->t_arrival_ns;
    fill_sampling(r, &q->sp);
    uint32_t k = index % f->per_prompt;
    if (r->has_seed)
        q->sp.seed = sched_choice_seed(r->seed, k);
    if (r->best_of > r->n)
        q->sp.want_logits = 1; /* best_of ranks by the sampled tokens' logprobs */
    tok_detok_init(&q->detok, s->tok);
    q->detok.first = 0; /* a continuation keeps its leading space */
    if (r->n_stop && stop_create(&q->stop, (const char *const *)r->stop, r->n_stop) != 0) {
        free(q);
        *status = 400;
        snprintf(err, errlen, "invalid stop sequences");
        return RKV_EINVAL;
    }

    /* bind the session; reuse the KV of the common prefix */
    struct session *se = NULL;
    if (r->session_id && r->session_id[0]) {
        se = session_find(s, r->key_id, r->session_id);
        if (se && se->busy) {
            seq_free(q);
            *status = 409;
            snprintf(err, errlen,
                     "session \"%s\" is busy with another request: wait for it to finish or "
                     "use another session_id",
                     r->session_id);
            return RKV_EBUSY;
        }
        if (!se) {
            se = session_create(s, r->key_id, r->session_id, pick_worker(s));
            int32_t *hist = NULL;
            size_t nh = 0;
            /* a session from before a restart: its tokens are known, its KV is not */
            if (se && s->store &&
                store_session_load(s->store, r->session_id, r->key_id, &hist, &nh) == 0) {
                session_append(se, hist, (uint32_t)nh);
                free(hist);
            }
        }
    } else {
        /* beside its prompt's first sequence: kvmgr shares blocks within one gpu */
        se = session_create(s, r->key_id, NULL, lead ? lead->sess->worker : pick_worker(s));
    }
    if (!se) {
        seq_free(q);
        return RKV_ENOMEM;
    }
    uint32_t lcp = 0;
    while (lcp < np && lcp < se->n_kv && se->tokens[lcp] == pt[lcp])
        lcp++;
    if (lcp == np)
        lcp = np - 1; /* the last prompt token must run to give logits */
    /* the rest of the old history goes; the kv beyond lcp is overwritten */
    se->n_tokens = lcp;
    if (se->n_kv > lcp)
        se->n_kv = lcp;
    int rc = session_append(se, pt + lcp, np - lcp);
    if (rc) {
        seq_free(q);
        if (!se->ext_id[0])
            session_destroy(s, se, 0);
        return RKV_ENOMEM;
    }
    q->cached = lcp;
    q->sess = se;
    se->busy = q;
    /* the worker's sampler for this session holds the previous request's
     * parameters and rng: rebuild it from this one's and the history */
    se->worker_knows = 0;
    q->n_prompt = np;
    uint32_t room = s->cfg.ctx_size - np;
    q->max_tokens = (uint32_t)r->max_tokens < room ? (uint32_t)r->max_tokens : room;
    q->worker = se->worker;
    q->state = SEQ_WAITING;
    list_push(&s->waiting, q);
    f->seqs[index] = q;
    f->n_live++;

    if (k == 0) {
        s->st.prompt_tokens += np;
        metric_inc(s->m_prompt, model_label(s), np);
    }
    s->st.cached_tokens += lcp;
    metric_inc(s->m_queries, model_label(s), np);
    metric_inc(s->m_hits, model_label(s), lcp);
    return 0;
}

static void fan_fail(struct fan *f, int status, const char *msg);
static void fan_abort(struct fan *f);

/* tool_choice "required" or a named tool: the grammar of one call in the format the rendered
 * template implies (api_tools_render set it) */
static int tool_grammar(const struct api_request *r, char **out, char *err, size_t errlen,
                        int *status)
{
    struct api_tool_constraint tc;
    *out = NULL;
    if (!api_tools_forces_call(r->tools))
        return 0;
    *status = 400; /* api_parse refused a response_format beside it */
    int rc = api_tools_constraint(r->tools, &tc);
    if (rc == RKV_EINVAL) {
        snprintf(err, errlen,
                 "tool_choice: this model's chat template has no tool call markup rkv knows "
                 "(Hermes <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS]), so a call cannot be "
                 "forced; send tool_choice \"auto\"");
        return rc;
    }
    if (rc == 0) {
        char why[400] = "";
        rc = json_schema_to_gbnf_framed(tc.schema, strlen(tc.schema), tc.prefix, tc.suffix, out,
                                        why, sizeof why);
        if (rc && rc != RKV_ENOMEM)
            snprintf(err, errlen, "tools: a function's parameters: %s", why);
        free(tc.schema);
    }
    if (rc == RKV_ENOMEM)
        *status = 500;
    return rc;
}

static int submit_cb(void *ctx, struct api_call *call, const struct api_request *r)
{
    struct sched *s = ctx;
    char err[320] = "";
    if (s->draining)
        return RKV_ESTATE;
    int any_up = 0;
    for (uint32_t w = 0; w < s->cfg.n_workers; w++)
        any_up |= s->workers[w].up;
    /* before the model is loaded: 503; while a worker restarts: queue */
    if (!any_up && !s->serving)
        return RKV_ENODEV;
    if (s->waiting.n >= s->cfg.max_waiting)
        return RKV_EBUSY;

    size_t n_p = api_request_prompts(r);
    struct rkv_vec *toks = calloc(n_p, sizeof *toks);
    struct fan *f = calloc(1, sizeof *f);
    uint32_t n_seqs = (uint32_t)api_request_seqs(r);
    if (f)
        f->seqs = calloc(n_seqs, sizeof *f->seqs);
    if (!toks || !f || !f->seqs) {
        free(toks);
        if (f)
            fan_free(f);
        return RKV_ENOMEM;
    }
    f->call = call;
    f->n_seqs = n_seqs;
    f->per_prompt = (uint32_t)(r->best_of > 0 ? r->best_of : 1);
    f->t_arrival_ns = rkv_now_ns();
    int status = 500, rc = 0;
    for (size_t i = 0; i < n_p; i++)
        rkv_vec_init(&toks[i], sizeof(int32_t));
    for (size_t i = 0; i < n_p && rc == 0; i++) {
        rc = tokenize_prompt(s, r, i, &toks[i], err, sizeof err, &status);
        if (rc == 0)
            rc = check_prompt(s, r, i, toks[i].len, err, sizeof err, &status);
    }
    if (rc == 0)
        rc = tool_grammar(r, &f->tool_grammar, err, sizeof err, &status);
    f->grammar = f->tool_grammar ? f->tool_grammar : r->grammar;
    /* every prompt's sequences; a refusal of one is the request's */
    api_call_set_data(call, f);
    for (uint32_t j = 0; j < n_seqs && rc == 0; j++) {
        const struct rkv_vec *t = &toks[j / f->per_prompt];
        struct seq *lead = j % f->per_prompt ? f->seqs[j - j % f->per_prompt] : NULL;
        rc = seq_start(s, f, j, t->data, (uint32_t)t->len, lead, err, sizeof err, &status);
    }
    for (size_t i = 0; i < n_p; i++)
        rkv_vec_fini(&toks[i]);
    free(toks);
    if (rc) {
        if (f->n_live) {
            fan_fail(f, status, err[0] ? err : rkv_strerror(rc)); /* frees f */
        } else {
            api_call_set_data(call, NULL);
            fan_free(f);
            if (rc == RKV_ENOMEM && !err[0])
                return RKV_ENOMEM;
            api_call_fail(call, status, err[0] ? err : rkv_strerror(rc));
        }
        update_gauges(s);
        return 0;
    }
    update_gauges(s);
    kick(s, f->seqs[0]->worker);
    return 0;
}

static int authorize_cb(void *ctx, const char *bearer)
{
    struct sched *s = ctx;
    return s->authorize ? s->authorize(s->authorize_ud, bearer) : 0;
}

/* a slow client read what was written: its sequences go on */
static void resume_cb(void *ctx, struct api_call *call)
{
    struct sched *s = ctx;
    struct fan *f = api_call_data(call);
    if (!f || !f->slow_since_ms)
        return;
    f->slow_since_ms = 0;
    for (uint32_t w = 0; w < s->cfg.n_workers; w++)
        kick(s, w);
}

static void cancel_cb(void *ctx, struct api_call *call)
{
    (void)ctx;
    struct fan *f = api_call_data(call);
    if (f)
        fan_abort(f);
}

/* POST /tokenize: what submit would prefill */
static int tokenize_cb(void *ctx, const struct api_request *r, int32_t **ids, size_t *n,
                       int *status, char *err, size_t errlen)
{
    struct sched *s = ctx;
    struct rkv_vec toks;
    rkv_vec_init(&toks, sizeof(int32_t));
    int rc = tokenize(s, r, &toks, err, errlen, status);
    if (rc) {
        rkv_vec_fini(&toks);
        return rc;
    }
    *n = toks.len;
    *ids = toks.data; /* the vector's buffer, handed over */
    return 0;
}

/* POST /detokenize: the text as a generation's would read */
static int detokenize_cb(void *ctx, const int32_t *ids, size_t n, char **text, size_t *n_text)
{
    struct sched *s = ctx;
    struct tok_detok d;
    tok_detok_init(&d, s->tok);
    size_t cap = 64 + 4 * n, len = 0;
    char *out = malloc(cap);
    for (size_t i = 0; out && i <= n; i++) {
        size_t got = 0;
        int rc;
        /* a piece may need more room than is left: grow, then push again */
        while ((rc = i < n ? tok_detok_push(&d, ids[i], out + len, cap - len - 1, &got)
                           : tok_detok_flush(&d, out + len, cap - len - 1, &got)) == RKV_ETOOBIG) {
            char *bigger = realloc(out, cap * 2);
            if (!bigger)
                break;
            out = bigger;
            cap *= 2;
        }
        if (rc) {
            free(out);
            return rc == RKV_ETOOBIG ? RKV_ENOMEM : rc;
        }
        len += got;
    }
    if (!out)
        return RKV_ENOMEM;
    out[len] = '\0';
    *text = out;
    *n_text = len;
    return 0;
}

void sched_api(struct sched *s, struct api_sched *out)
{
    memset(out, 0, sizeof *out);
    out->submit = submit_cb;
    out->cancel = cancel_cb;
    out->resume = resume_cb;
    out->authorize = authorize_cb;
    out->tokenize = tokenize_cb;
    out->detokenize = detokenize_cb;
    out->ctx = s;
}

/* --- finishing ------------------------------------------------------------------- */

static void emit_text(struct seq *q, const char *text, size_t len,
                      const struct api_token_logprob *lp, size_t n_lp)
{
    /* 1: the client reads slower than it is written to: pause its sequences (resume_cb) rather
     * than buffer the whole answer in rkvd */
    if ((len || n_lp) && q->fan->call &&
        api_call_choice_token(q->fan->call, q->index, text, len, lp, n_lp) == 1 &&
        !q->fan->slow_since_ms)
        q->fan->slow_since_ms = rkv_now_ms();
}

/* the request's last sequence ended: its answer (unless it failed) and its accounting */
static void fan_end(struct sched *s, struct fan *f)
{
    uint64_t now = rkv_now_ns();
    if (f->call && f->last != API_FINISH_ABORT) {
        metric_observe(s->m_e2e, model_label(s), (double)(now - f->t_arrival_ns) / 1e9);
        static const char *lv[2];
        lv[0] = model_label(s)[0];
        lv[1] = api_finish_name(f->last);
        metric_inc(s->m_success, lv, 1);
    }
    if (f->call && s->store) {
        const struct api_request *r = api_call_request(f->call);
        struct store_usage su = {
            .ts_ms = (int64_t)rkv_wall_ms(),
            .status = 200,
            .prompt_tokens = f->usage.prompt_tokens,
            .completion_tokens = f->usage.completion_tokens,
            .ttft_ms = f->t_first_ns ? (double)(f->t_first_ns - f->t_arrival_ns) / 1e6 : 0,
            .e2e_ms = (double)(now - f->t_arrival_ns) / 1e6};
        snprintf(su.endpoint, sizeof su.endpoint, "%s",
                 r->endpoint == API_CHAT ? "chat/completions" : "completions");
        store_usage_add(s->store, &su);
    }
    if (f->call)
        api_call_finish(f->call, f->last, &f->usage);
    fan_free(f);
}

static void finish_seq(struct seq *q, enum api_finish f)
{
    struct sched *s = q->s;
    struct session *se = q->sess;
    struct fan *fan = q->fan;
    if (f != API_FINISH_ABORT) {
        /* what detok and the stop matcher still hold */
        char tail[64];
        size_t n = 0;
        const char *emit;
        size_t elen;
        tok_detok_flush(&q->detok, tail, sizeof tail, &n);
        if (q->stop) {
            if (stop_matched(q->stop) < 0) {
                if (n)
                    stop_feed(q->stop, tail, n, &emit, &elen), emit_text(q, emit, elen, NULL, 0);
                if (stop_matched(q->stop) < 0) {
                    stop_flush(q->stop, &emit, &elen);
                    emit_text(q, emit, elen, NULL, 0);
                }
            }
        } else {
            emit_text(q, tail, n, NULL, 0);
        }
    }
    if (q->state == SEQ_WAITING)
        list_remove(&s->waiting, q);
    else {
        list_remove(&s->workers[q->worker].running, q);
        rkv_map_del(&s->by_sid, se->sid);
    }

    /* each stream's longest gap between two tokens (a rotation turn shows here) */
    if (f != API_FINISH_ABORT && q->n_gen >= 2)
        metric_observe(s->m_stall, model_label(s), (double)q->max_gap_ns / 1e9);
    /* the prompt once, every sequence's tokens */
    if (q->index % fan->per_prompt == 0) {
        fan->usage.prompt_tokens += q->n_prompt;
        fan->usage.cached_tokens += q->cached;
    }
    fan->usage.completion_tokens += q->n_gen;
    if (q->t_first_ns && (!fan->t_first_ns || q->t_first_ns < fan->t_first_ns))
        fan->t_first_ns = q->t_first_ns;
    fan->last = f;
    if (fan->call)
        api_call_choice_end(fan->call, q->index, f, q->n_gen ? q->sum_lp / q->n_gen : -INFINITY);
    fan->seqs[q->index] = NULL;
    /* those that waited for it to prefill go now (or prefill it themselves) */
    for (uint32_t j = q->index + 1; j < fan->n_seqs && j % fan->per_prompt; j++)
        if (fan->seqs[j] && fan->seqs[j]->lead == q)
            fan->seqs[j]->lead = NULL;

    se->busy = NULL;
    if (se->ext_id[0]) {
        lru_touch(s, se);
        if (se->kv_unsure && se->kvmgr_knows) {
            /* its last step failed: kvmgr may hold positions of it nothing wrote, which an
             * idle would publish for other prompts to share. Forgotten instead; the next turn
             * prefills its history (its published full blocks are shared) */
            rkv_vec_push(&s->workers[se->worker].closes, &se->sid);
            se->kvmgr_knows = 0;
            se->worker_knows = 0;
            se->n_kv = 0;
            se->n_owed = 0;
            se->kv_unsure = 0;
        } else {
            rkv_vec_push(&s->workers[se->worker].idles, &se->sid);
        }
        if (s->store)
            store_session_save(s->store, se->ext_id, se->owner, se->tokens, se->n_tokens);
    } else {
        session_destroy(s, se, 1);
    }
    seq_free(q);
    if (--fan->n_live == 0)
        fan_end(s, fan);
    update_gauges(s);
}

/* every sequence of f stops: now, or those in a step when it returns (f is gone once the
 * last has ended) */
static void fan_abort(struct fan *f)
{
    /* the last one to finish frees f: pick them out first */
    struct seq *now[API_MAX_SEQS];
    uint32_t n = 0;
    for (uint32_t j = 0; j < f->n_seqs; j++) {
        struct seq *q = f->seqs[j];
        if (!q)
            continue;
        q->cancelled = 1;
        if (!q->in_flight)
            now[n++] = q;
    }
    for (uint32_t k = 0; k < n; k++)
        finish_seq(now[k], API_FINISH_ABORT);
}

/* the call fails (status, msg) once; its sequences end without it (those in a step when
 * the step returns) */
static void fan_fail(struct fan *f, int status, const char *msg)
{
    if (f->call) {
        api_call_set_data(f->call, NULL);
        api_call_fail(f->call, status, msg);
        f->call = NULL;
    }
    fan_abort(f);
}

/* the part of a sampled token the next step needs: the session's history and the counts */
static void take_state(struct seq *q, int32_t token)
{
    struct sched *s = q->s;
    uint64_t now = rkv_now_ns();
    if (!q->t_first_ns) {
        q->t_first_ns = now;
        metric_observe(s->m_ttft, model_label(s), (double)(now - q->t_arrival_ns) / 1e9);
    } else {
        metric_observe(s->m_itl, model_label(s), (double)(now - q->t_last_ns) / 1e9);
        q->max_gap_ns = RKV_MAX(q->max_gap_ns, now - q->t_last_ns);
    }
    q->t_last_ns = now;
    session_append(q->sess, &token, 1);
    q->n_gen++;
    s->st.gen_tokens++;
    metric_inc(s->m_gen, model_label(s), 1);
}

/* the rest, after take_state: detok, stop strings, the client's text, limits; 1 when it
 * finished the request (q is gone then) */
static int take_text(struct seq *q, int32_t token, float logprob, const struct proto_logprob *alts,
                     uint8_t n_alts)
{
    struct sched *s = q->s;
    const struct tok *t = s->tok;
    int eog = tok_is_eog(t, token) && !q->req->ignore_eos;
    q->sum_lp += logprob;
    struct api_token_logprob lp = {0};
    struct api_top_logprob top[PROTO_MAX_TOP_LOGPROBS];
    char tbuf[128], topbuf[PROTO_MAX_TOP_LOGPROBS][128];
    size_t n_lp = 0;
    if (q->req->logprobs) {
        /* the chosen token as the text has it (a control token renders to nothing), so
         * its bytes add up to the text; the alternatives show control tokens by name */
        int n = tok_token_bytes(t, token, 0, tbuf, sizeof tbuf);
        lp.token = tbuf;
        lp.len = n > 0 && (size_t)n <= sizeof tbuf ? (size_t)n : 0;
        lp.logprob = logprob;
        for (uint8_t i = 0; i < n_alts; i++) {
            int m = tok_token_bytes(t, alts[i].id, 1, topbuf[i], sizeof topbuf[i]);
            top[i].token = topbuf[i];
            top[i].len = m > 0 && (size_t)m <= sizeof topbuf[i] ? (size_t)m : 0;
            top[i].logprob = alts[i].logprob;
        }
        lp.top = top;
        lp.n_top = n_alts;
        n_lp = 1;
    }
    if (eog) {
        emit_text(q, "", 0, &lp, n_lp);
        finish_seq(q, API_FINISH_STOP);
        return 1;
    }
    char piece[256];
    size_t n = 0;
    tok_detok_push(&q->detok, token, piece, sizeof piece, &n);
    if (!n && q->req->tools && tok_is_control(t, token)) {
        /* a call marker or <think> that is a control token: the output parser needs it */
        int m = tok_token_bytes(t, token, 1, piece, sizeof piece);
        if (m > 0 && (size_t)m <= sizeof piece &&
            api_tools_keeps_token(q->req->tools, piece, (size_t)m))
            n = (size_t)m;
    }
    if (q->stop) {
        const char *emit;
        size_t elen;
        int m = stop_feed(q->stop, piece, n, &emit, &elen);
        emit_text(q, emit, elen, &lp, n_lp);
        if (m == 1) {
            finish_seq(q, API_FINISH_STOP);
            return 1;
        }
    } else {
        emit_text(q, piece, n, &lp, n_lp);
    }
    if (q->n_gen >= q->max_tokens) {
        finish_seq(q, API_FINISH_LENGTH);
        return 1;
    }
    return 0;
}

/* a sampled token (its logprob and alternatives), all of it; 1 when it finished the request */
static int take_token(struct seq *q, int32_t token, float logprob, const struct proto_logprob *alts,
                      uint8_t n_alts)
{
    take_state(q, token);
    return take_text(q, token, logprob, alts, n_alts);
}

/* whether a step's tokens for q end nothing (no stop strings to match, no end of generation,
 * below max_tokens): then only their state must be taken before the next step is built, and
 * their text can follow once it is on its way */
static int text_can_wait(const struct seq *q, const struct job_seq *js)
{
    const struct tok *t = q->s->tok;
    if (q->stop || q->cancelled || q->n_gen + 1u + js->n_more >= q->max_tokens)
        return 0;
    if (q->req->ignore_eos)
        return 1;
    if (tok_is_eog(t, js->token))
        return 0;
    for (uint8_t m = 0; m < js->n_more; m++)
        if (tok_is_eog(t, js->more[m].id))
            return 0;
    return 1;
}

/* a sequence whose text waits for the next step to be sent */
struct text_later {
    uint64_t sid;
    struct seq *q;
    const struct job_seq *js;
};

/* --- steps ------------------------------------------------------------------------ */

static void retry_timer_cb(uv_timer_t *t)
{
    struct sched *s = t->data;
    uint32_t w;
    for (w = 0; w < s->cfg.n_workers; w++)
        if (&s->workers[w].retry == t)
            break;
    kick(s, w);
}

/* token arena: the job, its seqs and copies of their tokens in one block */
static struct step_job *job_alloc(uint32_t n_seqs, size_t n_tokens, uint32_t n_closes,
                                  uint32_t n_idles)
{
    size_t sz = sizeof(struct step_job) + n_seqs * sizeof(struct job_seq) +
                (n_closes + n_idles) * sizeof(uint64_t) + n_tokens * sizeof(int32_t);
    struct step_job *j = calloc(1, sz);
    if (!j)
        return NULL;
    char *p = (char *)(j + 1);
    j->seqs = (struct job_seq *)p;
    p += n_seqs * sizeof(struct job_seq);
    j->closes = (uint64_t *)p;
    p += n_closes * sizeof(uint64_t);
    j->idles = (uint64_t *)p;
    return j;
}

/* how many decode steps job runs (sched_config.decode_steps): several only when every
 * sequence decodes one token, asks for no top alternatives, has room for them (its max_tokens and
 * the context), kvmgr knows it, and nothing waits to be admitted; at most decode_steps_ms at the
 * pace of the step before */
static uint32_t decode_steps(const struct sched *s, const struct worker_slot *ws,
                             const struct step_job *j)
{
    /* j->seqs[i] was built from ws->picks[i] */
    uint32_t k = s->cfg.decode_steps;
    if (k <= 1 || !j->n_seqs || s->waiting.n)
        return 1;
    if (ws->step_ms > 0) {
        double fit = s->cfg.decode_steps_ms / ws->step_ms;
        k = fit < 1 ? 1 : fit < k ? (uint32_t)fit : k;
    }
    for (uint32_t i = 0; i < j->n_seqs && k > 1; i++) {
        const struct job_seq *js = &j->seqs[i];
        const struct seq *q = rkv_vec_at(&ws->picks, struct pick, i)->q;
        if (js->n_tokens != 1 || !js->sample || js->is_new || q->cancelled ||
            js->sp.n_top_logprobs || q->n_gen >= q->max_tokens)
            return 1;
        /* the tokens it may still take, the last one alone (that step's prep tells kvmgr
         * the ids the steps before it picked, so their blocks become shareable), and the
         * positions the context still has */
        uint32_t left = q->max_tokens - q->n_gen;
        k = RKV_MIN(k, left > 1 ? left - 1 : 1);
        uint64_t end = (uint64_t)js->n_past + js->n_tokens;
        k = end >= s->cfg.ctx_size ? 1 : (uint32_t)RKV_MIN((uint64_t)k, s->cfg.ctx_size - end + 1);
    }
    return k;
}

/* the prompt tokens a step that also decodes may take now */
static uint32_t worker_beside(const struct sched *s, const struct worker_slot *ws)
{
    return s->cfg.beside_decode_ms && ws->beside ? ws->beside : ws->steps.prefill_beside_decode;
}

uint32_t sched_beside_next(uint32_t cur, double step_ms, double target_ms, uint32_t lo, uint32_t hi)
{
    if (hi < lo)
        hi = lo;
    if (!(step_ms > 0) || !(target_ms > 0) || cur == 0)
        return RKV_MAX(lo, RKV_MIN(cur, hi));
    double next = cur * sqrt(target_ms / step_ms);
    return next <= lo ? lo : next >= hi ? hi : (uint32_t)next;
}

uint32_t sched_worker_beside(const struct sched *s, uint32_t worker)
{
    return worker < s->cfg.n_workers ? worker_beside(s, &s->workers[worker]) : 0;
}

static void kick(struct sched *s, uint32_t w)
{
    struct worker_slot *ws = &s->workers[w];
    if (!ws->up || ws->busy)
        return;
    /* admit waiting requests bound to this worker */
    for (struct seq *q = s->waiting.head, *nx; q && ws->running.n < s->cfg.max_running; q = nx) {
        nx = q->next;
        if (q->worker != w)
            continue;
        /* a prompt's other sequences wait for its first one to prefill it: then kvmgr maps
         * its full blocks for them */
        if (q->lead && q->lead->n_gen == 0)
            continue;
        list_remove(&s->waiting, q);
        q->state = SEQ_RUNNING;
        list_push(&ws->running, q);
        rkv_map_put(&s->by_sid, q->sess->sid, q);
        metric_observe(s->m_queue, model_label(s), (double)(rkv_now_ns() - q->t_arrival_ns) / 1e9);
    }
    /* the gauges follow every admission, not only arrivals and finishes */
    update_gauges(s);
    /* decodes first (one token each), then prompt chunks in arrival order, fewer of them
     * when a decode shares the step (its stream waits for the whole step); picked once,
     * then sized and copied into the job */
    ws->picks.len = 0;
    uint32_t budget = ws->steps.max_batch_tokens, beside_cap = 0, beside_tokens = 0;
    size_t n_tok = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && ws->picks.len) {
            beside_cap = RKV_MIN(budget, worker_beside(s, ws));
            budget = beside_cap;
        }
        for (struct seq *q = ws->running.head; q && budget; q = q->next) {
            struct session *se = q->sess;
            uint32_t pending = se->n_tokens - se->n_kv;
            if (q->fan->slow_since_ms)
                continue; /* its client has not read what it has */
            if ((pass == 0) != (pending == 1) || pending == 0)
                continue;
            uint32_t take = RKV_MIN(RKV_MIN(pending, ws->steps.prefill_chunk), budget);
            budget -= take;
            beside_tokens += pass == 1 && beside_cap ? take : 0;
            struct pick pk = {q, take};
            if (!rkv_vec_push(&ws->picks, &pk))
                break;
            /* and the tokens before that kvmgr may not know yet */
            n_tok += take + RKV_MAX(1u, se->n_owed);
            if (!se->worker_knows) /* history, logit bias and grammar for the sampler */
                n_tok += se->n_kv + 2 * q->req->n_logit_bias +
                         (q->fan->grammar ? (uint32_t)strlen(q->fan->grammar) / 4 + 1 : 0);
            if (!se->kvmgr_knows)
                n_tok += se->n_tokens; /* every token: kvmgr looks for a shared prefix */
        }
    }
    uint32_t n_seqs = (uint32_t)ws->picks.len;
    if (n_seqs == 0 && ws->closes.len == 0 && ws->idles.len == 0 && ws->forgets.len == 0)
        return;
    struct step_job *j = job_alloc(n_seqs, n_tok, (uint32_t)(ws->closes.len + ws->forgets.len),
                                   (uint32_t)ws->idles.len);
    if (!j) {
        log_error("scheduler: out of memory building a step; retrying");
        uv_timer_start(&ws->retry, retry_timer_cb, 10, 0);
        return;
    }
    j->worker = w;
    j->kv_gen = s->kv_gen;
    j->beside_tokens = beside_tokens;
    j->beside_cap = beside_tokens ? beside_cap : 0;
    j->n_closes = (uint32_t)ws->closes.len;
    j->n_forgets = (uint32_t)ws->forgets.len;
    /* an empty vector's data is NULL: memcpy must not see it */
    if (ws->closes.len)
        memcpy(j->closes, ws->closes.data, ws->closes.len * sizeof(uint64_t));
    if (ws->forgets.len)
        memcpy(j->closes + j->n_closes, ws->forgets.data, ws->forgets.len * sizeof(uint64_t));
    ws->forgets.len = 0;
    /* kvmgr may move a session only where the scheduler can follow: not while
     * the operator drains a worker or one is down */
    int nomove = 0;
    for (uint32_t o = 0; o < s->cfg.n_workers; o++)
        nomove |= !s->workers[o].up || s->workers[o].drained;
    j->n_idles = (uint32_t)ws->idles.len;
    if (ws->idles.len)
        memcpy(j->idles, ws->idles.data, ws->idles.len * sizeof(uint64_t));
    ws->closes.len = 0;
    ws->idles.len = 0;
    int32_t *arena = (int32_t *)(j->idles + j->n_idles);
    for (uint32_t i = 0; i < n_seqs; i++) {
        const struct pick *pk = rkv_vec_at(&ws->picks, struct pick, i);
        struct seq *q = pk->q;
        struct session *se = q->sess;
        struct job_seq *js = &j->seqs[j->n_seqs++];
        js->sid = se->sid;
        js->n_past = se->n_kv;
        js->n_tokens = pk->take;
        js->n_prev = RKV_MIN(se->n_kv, RKV_MAX(1u, se->n_owed));
        memcpy(arena, se->tokens + se->n_kv - js->n_prev, js->n_prev * sizeof(int32_t));
        arena += js->n_prev;
        js->tokens = arena;
        memcpy(arena, se->tokens + se->n_kv, pk->take * sizeof(int32_t));
        arena += pk->take;
        js->sample = se->n_kv + pk->take == se->n_tokens;
        js->sp = q->sp;
        js->pinned = (uint8_t)se->pinned;
        js->nomove = (uint8_t)nomove;
        if (!se->worker_knows) {
            js->reset = 1;
            js->n_history = se->n_kv;
            /* the answer so far is the end of the history only where this step reaches the
             * end: a re-prefill's earlier chunks replay none of it (sched_job_done) */
            js->n_drawn = js->sample ? q->n_gen : 0;
            js->history = arena;
            if (se->n_kv)
                memcpy(arena, se->tokens, se->n_kv * sizeof(int32_t));
            arena += se->n_kv;
            /* an id and a float each, two arena slots */
            struct proto_bias *bias = (struct proto_bias *)arena;
            for (size_t b = 0; b < q->req->n_logit_bias; b++)
                bias[b] = q->req->logit_bias[b];
            js->sp.n_bias = (uint16_t)q->req->n_logit_bias;
            js->sp.bias = js->sp.n_bias ? bias : NULL;
            arena += 2 * q->req->n_logit_bias;
            /* the grammar a copy in the job: a request that fails (the drain's deadline, a
             * sibling prompt's error) is freed while its step is still with the driver */
            js->sp.grammar = NULL;
            js->sp.grammar_len = 0;
            if (q->fan->grammar) {
                size_t glen = strlen(q->fan->grammar);
                memcpy(arena, q->fan->grammar, glen + 1);
                js->sp.grammar = (const char *)arena;
                js->sp.grammar_len = (uint32_t)glen;
                arena += glen / 4 + 1;
            }
        }
        if (!se->kvmgr_knows) {
            js->is_new = 1;
            js->scope = s->cfg.prefix_global ? 0 : (uint64_t)se->owner;
            js->n_all = se->n_tokens;
            js->all = arena;
            memcpy(arena, se->tokens, se->n_tokens * sizeof(int32_t));
            arena += se->n_tokens;
        }
        q->in_flight = 1;
    }
    j->n_steps = decode_steps(s, ws, j);
    ws->busy = 1;
    s->st.steps++;
    int rc = s->drv.submit(s->drv.ctx, j);
    if (rc) {
        /* the driver could not even queue it: as a failed step */
        j->rc = rc;
        snprintf(j->err, sizeof j->err, "%s", rkv_strerror(rc));
        sched_job_done(s, j);
    }
}

static void fail_running(struct sched *s, uint32_t w, int status, const char *msg)
{
    struct worker_slot *ws = &s->workers[w];
    while (ws->running.head) {
        struct seq *q = ws->running.head;
        q->in_flight = 0;
        fan_fail(q->fan, status, msg); /* ends q, and its request's other sequences */
    }
    update_gauges(s);
}

/* kvmgr put q's session on gpu `to`: it goes on on that worker; the old one
 * drops its sampler, the new one rebuilds it from the history, no KV
 * position is computed again */
static void seq_rebind(struct sched *s, struct seq *q, uint32_t to)
{
    struct session *se = q->sess;
    uint32_t from = q->worker;
    if (to >= s->cfg.n_workers || to == from) {
        log_warn("kvmgr moved session %llu to gpu %u, which rkvd does not run; it stays on "
                 "worker %u",
                 (unsigned long long)se->sid, to, from);
        return;
    }
    list_remove(&s->workers[from].running, q);
    list_push(&s->workers[to].running, q);
    q->worker = to;
    if (se->worker_knows)
        rkv_vec_push(&s->workers[from].forgets, &se->sid);
    se->worker = to;
    se->worker_knows = 0;
    if (se->kvmgr_knows) {
        /* with its KV (a placement of a new session moves nothing) */
        char f[16], t[16];
        snprintf(f, sizeof f, "%u", from);
        snprintf(t, sizeof t, "%u", to);
        const char *lv[2] = {f, t};
        metric_inc(s->m_sess_moved, lv, 1);
        log_debug("session %llu: runs on worker %u now (was %u)", (unsigned long long)se->sid, to,
                  from);
    }
}

/* a step whose work does not count: its sequences are free for the next one,
 * the worker rebuilds their samplers */
static void job_drop(struct sched *s, const struct step_job *j)
{
    for (uint32_t i = 0; i < j->n_seqs; i++) {
        struct seq *q = rkv_map_get(&s->by_sid, j->seqs[i].sid);
        if (!q)
            continue;
        q->in_flight = 0;
        q->sess->worker_knows = 0;
        q->sess->kv_unsure = 1; /* its prep may have grown it for positions never written */
        if (q->cancelled)
            finish_seq(q, API_FINISH_ABORT);
    }
}

void sched_job_done(struct sched *s, struct step_job *j)
{
    struct worker_slot *ws = &s->workers[j->worker];
    ws->busy = 0;
    int restarted = j->rc == 0 && j->kv_gen == s->kv_gen && kvmgr_adopt(s, j->kvmgr_pid);
    if (j->kv_gen != s->kv_gen) {
        /* built before kvmgr restarted (or placed by the new one while the
         * sessions still counted the old one's KV): its tokens came from KV
         * that no longer exists, and its closes went to the wrong kvmgr */
        job_drop(s, j);
        free(j);
        for (uint32_t w = 0; w < s->cfg.n_workers; w++)
            if (restarted || w == (uint32_t)(ws - s->workers))
                kick(s, w);
        return;
    }
    if (j->rc < 0) {
        /* nothing of the step counts: n_kv is unchanged, the same step runs
         * again once the worker (or kvmgr) is back; the closes are resent */
        for (uint32_t i = 0; i < j->n_closes; i++)
            rkv_vec_push(&ws->closes, &j->closes[i]);
        for (uint32_t i = 0; i < j->n_forgets; i++)
            rkv_vec_push(&ws->forgets, &j->closes[j->n_closes + i]);
        for (uint32_t i = 0; i < j->n_idles; i++)
            rkv_vec_push(&ws->idles, &j->idles[i]);
        job_drop(s, j);
        if (ws->failures++ == 0)
            ws->first_failure_ms = rkv_now_ms();
        uint32_t w = j->worker;
        log_ratelimited(RKV_LOG_WARN, 5000, 5, "step on worker %u failed (%s); attempt %u of %u", w,
                        j->err, ws->failures, s->cfg.max_retries);
        free(j);
        /* a restarting child (kvmgr: backoff, then pools once a worker says
         * hello) fails steps for a second or more: give up only after a
         * while, not after max_retries quick attempts */
        if (ws->failures >= s->cfg.max_retries &&
            rkv_now_ms() - ws->first_failure_ms >= SCHED_GIVE_UP_MS) {
            char msg[400];
            snprintf(msg, sizeof msg,
                     "the model worker failed %u steps in a row: try again later; the "
                     "operator can check `rkvctl status` and the server log",
                     ws->failures);
            ws->failures = 0;
            fail_running(s, w, 503, msg);
        } else if (ws->up) {
            uint64_t backoff = 50u << (ws->failures < 5 ? ws->failures : 5);
            uv_timer_start(&ws->retry, retry_timer_cb, backoff < 1000 ? backoff : 1000, 0);
        }
        return;
    }
    ws->failures = 0;
    if (j->prep_ahead)
        metric_inc(s->m_ahead, model_label(s), 1);
    int progress = 0;
    uint64_t moved_to = 0; /* workers that got sequences (bit per worker) */
    /* texts rendered and streamed after the next step is sent (NULL: all now) */
    struct text_later *later = j->n_seqs ? malloc(j->n_seqs * sizeof *later) : NULL;
    uint32_t n_later = 0;
    /* the tokens each of the job's steps computed: the first step's prompt and decode
     * tokens, then one a sequence that took part in each later decode step */
    uint32_t step_tokens[PROTO_MAX_DECODE_STEPS] = {0};
    for (uint32_t i = 0; i < j->n_seqs; i++) {
        struct job_seq *js = &j->seqs[i];
        struct seq *q = rkv_map_get(&s->by_sid, js->sid);
        if (!q)
            continue;
        q->in_flight = 0;
        if (PROTO_KV_IS_MOVED(js->status)) {
            seq_rebind(s, q, PROTO_KV_MOVED_GPU(js->status));
            moved_to |= q->worker < 64 ? 1ull << q->worker : 0;
            progress = 1;
            if (q->cancelled)
                finish_seq(q, API_FINISH_ABORT);
            continue;
        }
        if (js->status == RKV_ESTALE) {
            /* cut back before its live window (a sliding-window model keeps only the
             * window of its local layers): kvmgr forgot the session, so its whole history
             * is prefilled again, as after a kvmgr restart */
            log_info("session %llu: its kv before position %u is gone: prefilling its %u "
                     "tokens again",
                     (unsigned long long)q->sess->sid, js->n_past, q->sess->n_tokens);
            q->sess->n_kv = 0;
            q->sess->kvmgr_knows = 0;
            q->sess->worker_knows = 0;
            progress = 1;
            if (q->cancelled)
                finish_seq(q, API_FINISH_ABORT);
            continue;
        }
        if (js->status == RKV_ESTATE) {
            /* the worker has no sampler for it (it restarted, or swept it): the next step
             * rebuilds it from the history; nothing of this one counts */
            q->sess->worker_knows = 0;
            progress = 1;
            if (q->cancelled)
                finish_seq(q, API_FINISH_ABORT);
            continue;
        }
        if (js->status == RKV_ENOSPACE) {
            q->stalled = 1;
            if (q->cancelled)
                finish_seq(q, API_FINISH_ABORT);
            continue;
        }
        if (js->status < 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "the worker could not run this request: %s",
                     rkv_strerror(js->status));
            fan_fail(q->fan, 500, msg); /* ends q without rendering, and its siblings */
            continue;
        }
        progress = 1;
        q->stalled = 0;
        step_tokens[0] += js->n_tokens;
        for (uint8_t m = 0; js->sample && m < js->n_more; m++) /* the proto checks n_more */
            step_tokens[m + 1]++;
        /* it ran there (not all found shared). A reset chunk that does not sample did not
         * replay the answer so far into the sampler's grammar (the answer ends the history,
         * past this chunk): the chunk that samples resets it again */
        if (js->n_tokens && (js->sample || !q->n_gen))
            q->sess->worker_knows = 1;
        q->sess->kvmgr_knows = 1;
        q->sess->kv_unsure = 0;
        q->sess->n_kv = js->n_past + js->n_tokens;
        q->sess->kv_bytes = js->kv_bytes;
        q->sess->n_owed = 0; /* the prep of this step brought them */
        if (js->n_cached) {
            /* kvmgr found these positions in blocks another session wrote */
            q->cached += js->n_cached;
            s->st.cached_tokens += js->n_cached;
            metric_inc(s->m_hits, model_label(s), js->n_cached);
        }
        s->st.prefill_tokens += js->sample && js->n_tokens == 1 ? 0 : js->n_tokens;
        if (!(js->sample && js->n_tokens == 1))
            metric_inc(s->m_prefill, model_label(s), js->n_tokens);
        if (q->cancelled) {
            finish_seq(q, API_FINISH_ABORT);
            continue;
        }
        if (!js->sample)
            continue;
        /* the later decode steps: each one wrote the KV of the token before it (kvmgr learns
         * their ids with the next prep); a token that ends the request drops the rest */
        struct session *se = q->sess;
        const int wait = later && text_can_wait(q, js); /* none of them finishes it then */
        if (wait) {
            later[n_later++] = (struct text_later){js->sid, q, js};
            take_state(q, js->token);
        } else if (take_token(q, js->token, js->logprob, js->top, js->n_top))
            continue;
        if (js->n_more)
            metric_inc(s->m_multi, model_label(s), js->n_more);
        for (uint8_t m = 0; m < js->n_more; m++) {
            se->n_kv++;
            se->n_owed = m + 1u;
            if (wait)
                take_state(q, js->more[m].id);
            else if (take_token(q, js->more[m].id, js->more[m].logprob, NULL, 0))
                break;
        }
    }
    for (uint32_t k = 0; k < PROTO_MAX_DECODE_STEPS && step_tokens[k]; k++)
        metric_observe(s->m_iter, model_label(s), step_tokens[k]);
    if (j->n_steps && j->step_ms > 0)
        ws->step_ms = j->step_ms / j->n_steps;
    /* a step the prompt tokens beside its decodes filled says how long such tokens take */
    if (s->cfg.beside_decode_ms && j->beside_cap && j->beside_tokens >= j->beside_cap &&
        j->n_steps == 1 && j->step_ms > 0)
        ws->beside =
            sched_beside_next(j->beside_cap, j->step_ms, s->cfg.beside_decode_ms,
                              RKV_MIN(64u, ws->steps.prefill_chunk), ws->steps.prefill_chunk);
    for (uint32_t w = 0; w < s->cfg.n_workers && w < 64; w++)
        if (moved_to & (1ull << w) && w != (uint32_t)(ws - s->workers))
            kick(s, w);
    if (!progress && ws->running.n && !ws->closes.len) {
        /* kvmgr had no room for anyone: wait for a drain instead of spinning */
        uv_timer_start(&ws->retry, retry_timer_cb, 20, 0);
    } else {
        kick(s, (uint32_t)(ws - s->workers));
    }
    /* the next step is on its way: now the texts that waited for it (a step the driver
     * refused fails at once inside kick, and a sequence failed there is gone) */
    for (uint32_t k = 0; k < n_later; k++) {
        const struct job_seq *js = later[k].js;
        struct seq *q = rkv_map_get(&s->by_sid, later[k].sid);
        if (q != later[k].q)
            continue;
        take_text(q, js->token, js->logprob, js->top, js->n_top);
        for (uint8_t m = 0; m < js->n_more; m++)
            take_text(q, js->more[m].id, js->more[m].logprob, NULL, 0);
    }
    free(later);
    free(j);
}

/* --- lifecycle ------------------------------------------------------------------ */

void sched_worker_down(struct sched *s, uint32_t w)
{
    if (w >= s->cfg.n_workers)
        return;
    s->workers[w].up = 0;
    /* its sampler state is gone with it */
    size_t it = 0;
    void *v;
    while (rkv_map_next(&s->sessions, &it, NULL, &v)) {
        struct session *se = v;
        if (se->worker == w)
            se->worker_knows = 0;
    }
    update_gauges(s);
}

/* a 32k prompt through HTTP on an H200 (llama3-8b bf16): 11706 tok/s in steps and chunks of
 * 2048, 8825 in steps of 512 and chunks of 256; a stream decoding beside it waited 169 ms a
 * token in steps of 2048 prompt tokens, 49 in steps of 512 (which prefilled at 10425, 0.92 of
 * 2048's) */
void sched_step_sizes(const struct sched_steps *cfg, uint32_t worker_mbt, int on_gpu,
                      struct sched_steps *out)
{
    /* the worker picks 2048 on a gpu */
    uint32_t mbt = cfg->max_batch_tokens ? cfg->max_batch_tokens : worker_mbt ? worker_mbt : 512;
    if (worker_mbt && mbt > worker_mbt)
        mbt = worker_mbt;
    uint32_t chunk = cfg->prefill_chunk ? cfg->prefill_chunk : on_gpu ? mbt : 256;
    chunk = RKV_MIN(chunk, mbt);
    uint32_t beside = cfg->prefill_beside_decode ? cfg->prefill_beside_decode
                      : on_gpu                   ? 512
                                                 : chunk;
    out->max_batch_tokens = mbt;
    out->prefill_chunk = chunk;
    out->prefill_beside_decode = RKV_MIN(beside, mbt);
}

void sched_worker_up(struct sched *s, uint32_t w, const struct sched_steps *steps)
{
    if (w >= s->cfg.n_workers)
        return;
    s->workers[w].steps = *steps;
    s->workers[w].beside = 0; /* learned again for these sizes */
    s->workers[w].up = 1;
    s->workers[w].failures = 0;
    s->serving = 1;
    kick(s, w);
}

/* 1 when pid is a new kvmgr: every session's KV is gone, rebuilt from token
 * histories; the caller kicks the workers */
static int kvmgr_adopt(struct sched *s, uint32_t pid)
{
    if (!pid || pid == s->kvmgr_pid)
        return 0;
    uint32_t old = s->kvmgr_pid;
    s->kvmgr_pid = pid;
    if (!old)
        return 0; /* first contact */
    s->kv_gen++;
    log_warn("kvmgr restarted (pid %u -> %u): rebuilding every session's KV from its token "
             "history",
             old, pid);
    size_t it = 0;
    void *v;
    while (rkv_map_next(&s->sessions, &it, NULL, &v)) {
        struct session *se = v;
        se->n_kv = 0;
        se->worker_knows = 0;
        se->kvmgr_knows = 0;
    }
    for (uint32_t w = 0; w < s->cfg.n_workers; w++) {
        s->workers[w].closes.len = 0;
        s->workers[w].idles.len = 0;
        s->workers[w].failures = 0;
    }
    return 1;
}

void sched_kvmgr_seen(struct sched *s, uint32_t pid)
{
    if (kvmgr_adopt(s, pid))
        for (uint32_t w = 0; w < s->cfg.n_workers; w++)
            kick(s, w);
}

void sched_drain(struct sched *s)
{
    s->draining = 1;
}

void sched_fail_all(struct sched *s, const char *msg)
{
    if (!s)
        return;
    while (s->waiting.head)
        fan_fail(s->waiting.head->fan, 503, msg);
    for (uint32_t w = 0; w < s->cfg.n_workers; w++)
        fail_running(s, w, 503, msg);
    update_gauges(s);
}

/* a request's stream quiet for keepalive_ms gets a comment; 1 when its client is gone (the
 * caller aborts it once it no longer walks the lists) */
static int keepalive(struct sched *s, struct seq *q, uint64_t now)
{
    struct fan *f = q->fan;
    uint64_t last = RKV_MAX(RKV_MAX(f->t_arrival_ns, f->t_alive_ns), q->t_last_ns);
    if (!f->call || f->gone || !q->req->stream ||
        now - last < (uint64_t)s->cfg.keepalive_ms * 1000000)
        return 0;
    f->t_alive_ns = now;
    f->gone = api_call_keepalive(f->call) == RKV_ECLOSED;
    return f->gone;
}

void sched_tick(struct sched *s)
{
    uint64_t now = rkv_now_ns(), now_ms = rkv_now_ms();
    struct rkv_vec gone; /* struct fan *: each once */
    rkv_vec_init(&gone, sizeof(struct fan *));
    for (uint32_t w = 0; w <= s->cfg.n_workers; w++) {
        struct seq *q = w < s->cfg.n_workers ? s->workers[w].running.head : s->waiting.head;
        for (; q; q = q->next) {
            struct fan *f = q->fan;
            if (!f->gone && f->slow_since_ms && now_ms - f->slow_since_ms > SCHED_SLOW_CLIENT_MS) {
                log_warn("a stream's client read nothing for %d s with its buffer full: its "
                         "request is cancelled",
                         SCHED_SLOW_CLIENT_MS / 1000);
                f->gone = 1;
                rkv_vec_push(&gone, &f);
            } else if (s->cfg.keepalive_ms && keepalive(s, q, now)) {
                rkv_vec_push(&gone, &q->fan); /* out of memory: its next token learns it */
            }
        }
    }
    for (size_t i = 0; i < gone.len; i++)
        fan_abort(*rkv_vec_at(&gone, struct fan *, i));
    rkv_vec_fini(&gone);
}

void sched_get_stats(const struct sched *s, struct sched_stats *out)
{
    *out = s->st;
}

int sched_create(uv_loop_t *loop, const struct sched_config *cfg, const struct tok *tok,
                 const struct sched_driver *drv, struct metrics *metrics, struct store *store,
                 struct sched **out, char *errbuf, size_t errlen)
{
    if (!cfg->n_workers || !cfg->ctx_size || !cfg->max_running || !cfg->steps.max_batch_tokens ||
        !cfg->steps.prefill_chunk || !cfg->steps.prefill_beside_decode) {
        snprintf(errbuf, errlen,
                 "scheduler: workers, ctx_size, max_running, max_batch_tokens, "
                 "prefill_chunk and prefill_beside_decode must be positive");
        return RKV_EINVAL;
    }
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return RKV_ENOMEM;
    s->loop = loop;
    s->cfg = *cfg;
    if (!s->cfg.max_retries)
        s->cfg.max_retries = 5;
    if (!s->cfg.max_sessions)
        s->cfg.max_sessions = 1024;
    s->tok = tok;
    s->drv = *drv;
    s->metrics = metrics;
    s->store = store;
    s->next_sid = 1;
    s->workers = calloc(cfg->n_workers, sizeof *s->workers);
    if (!s->workers) {
        free(s);
        return RKV_ENOMEM;
    }
    for (uint32_t w = 0; w < cfg->n_workers; w++) {
        rkv_vec_init(&s->workers[w].closes, sizeof(uint64_t));
        s->workers[w].steps = cfg->steps;
        rkv_vec_init(&s->workers[w].forgets, sizeof(uint64_t));
        rkv_vec_init(&s->workers[w].picks, sizeof(struct pick));
        rkv_vec_init(&s->workers[w].idles, sizeof(uint64_t));
        uv_timer_init(loop, &s->workers[w].retry);
        s->workers[w].retry.data = s;
    }
    rkv_map_init(&s->by_sid);
    rkv_map_init(&s->sessions);
    if (metrics) {
        static const char *const ml[] = {"model_name", NULL};
        static const char *const mf[] = {"model_name", "finished_reason", NULL};
        static const double lat[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
        static const double itl[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                     0.3,   0.4,   0.5,  0.75,  1.0,  2.5,   5.0, 7.5,  10.0};
        static const double iter[] = {1,   8,    16,   32,   64,   128,  256,
                                      512, 1024, 2048, 4096, 8192, 16384};
        size_t nl = sizeof lat / sizeof lat[0], ni = sizeof itl / sizeof itl[0];
        s->m_running = metrics_add(metrics, METRIC_GAUGE, "rkv:num_requests_running",
                                   "Requests in a running batch.", ml, NULL, 0);
        s->m_waiting = metrics_add(metrics, METRIC_GAUGE, "rkv:num_requests_waiting",
                                   "Requests waiting to be scheduled.", ml, NULL, 0);
        s->m_sessions = metrics_add(metrics, METRIC_GAUGE, "rkv:num_sessions",
                                    "Named sessions whose KV rkv keeps.", ml, NULL, 0);
        s->m_prompt = metrics_add(metrics, METRIC_COUNTER, "rkv:prompt_tokens_total",
                                  "Prompt tokens received.", ml, NULL, 0);
        s->m_gen = metrics_add(metrics, METRIC_COUNTER, "rkv:generation_tokens_total",
                               "Tokens generated.", ml, NULL, 0);
        s->m_prefill =
            metrics_add(metrics, METRIC_COUNTER, "rkv:prefill_tokens_total",
                        "Prompt tokens computed (not served from a reused prefix).", ml, NULL, 0);
        s->m_hits = metrics_add(metrics, METRIC_COUNTER, "rkv:prefix_cache_hits_total",
                                "Prompt tokens served from reused KV.", ml, NULL, 0);
        s->m_ahead = metrics_add(metrics, METRIC_COUNTER, "rkv:kv_prep_ahead_steps_total",
                                 "Steps whose block tables kvmgr placed while the step before "
                                 "them ran (prep_ahead).",
                                 ml, NULL, 0);
        s->m_multi = metrics_add(metrics, METRIC_COUNTER, "rkv:decode_steps_extra_total",
                                 "Tokens picked by the later decode steps of steps that ran "
                                 "several (decode_steps).",
                                 ml, NULL, 0);
        s->m_iter = metrics_add(metrics, METRIC_HISTOGRAM, "rkv:iteration_tokens_total",
                                "Tokens computed by each engine step (prompt and decode).", ml,
                                iter, sizeof iter / sizeof iter[0]);
        s->m_queries = metrics_add(metrics, METRIC_COUNTER, "rkv:prefix_cache_queries_total",
                                   "Prompt tokens looked up in reusable KV.", ml, NULL, 0);
        s->m_ttft = metrics_add(metrics, METRIC_HISTOGRAM, "rkv:time_to_first_token_seconds",
                                "Time to first token.", ml, lat, nl);
        s->m_itl = metrics_add(metrics, METRIC_HISTOGRAM, "rkv:inter_token_latency_seconds",
                               "Time between consecutive tokens of a request.", ml, itl, ni);
        static const double stall[] = {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30};
        s->m_stall = metrics_add(metrics, METRIC_HISTOGRAM, "rkv:stream_stall_seconds",
                                 "The longest gap between two tokens of each finished request "
                                 "(a wait for its rotation turn shows here).",
                                 ml, stall, sizeof stall / sizeof stall[0]);
        s->m_e2e = metrics_add(metrics, METRIC_HISTOGRAM, "rkv:e2e_request_latency_seconds",
                               "End-to-end request latency.", ml, lat, nl);
        s->m_queue = metrics_add(metrics, METRIC_HISTOGRAM, "rkv:request_queue_time_seconds",
                                 "Time requests wait before they run.", ml, lat, nl);
        s->m_success = metrics_add(metrics, METRIC_COUNTER, "rkv:request_success_total",
                                   "Finished requests by finish reason.", mf, NULL, 0);
        static const char *const ft[] = {"from_gpu", "to_gpu", NULL};
        s->m_sess_moved = metrics_add(metrics, METRIC_COUNTER, "rkv:kv_sessions_moved_total",
                                      "Sessions kvmgr moved to another GPU with their KV "
                                      "(rebalance).",
                                      ft, NULL, 0);
    }
    update_gauges(s);
    *out = s;
    return 0;
}

/* the retry timers close on a later loop turn; the last one frees */
static void retry_closed(uv_handle_t *h)
{
    struct sched *s = h->data;
    if (--s->n_closing > 0)
        return;
    free(s->workers);
    free(s);
}

void sched_destroy(struct sched *s)
{
    if (!s)
        return;
    while (s->waiting.head)
        fan_fail(s->waiting.head->fan, 503, "rkvd is shutting down");
    for (uint32_t w = 0; w < s->cfg.n_workers; w++) {
        fail_running(s, w, 503, "rkvd is shutting down");
        rkv_vec_fini(&s->workers[w].closes);
        rkv_vec_fini(&s->workers[w].forgets);
        rkv_vec_fini(&s->workers[w].picks);
        rkv_vec_fini(&s->workers[w].idles);
    }
    s->n_closing = s->cfg.n_workers;
    for (uint32_t w = 0; w < s->cfg.n_workers; w++)
        uv_close((uv_handle_t *)&s->workers[w].retry, retry_closed);
    size_t it = 0;
    void *v;
    while (rkv_map_next(&s->sessions, &it, NULL, &v)) {
        struct session *se = v;
        free(se->tokens);
        free(se);
    }
    rkv_map_fini(&s->sessions);
    rkv_map_fini(&s->by_sid);
}

/* --- operator controls ------------------------------------------------------------ */

void sched_sessions_foreach(struct sched *s, sched_session_fn fn, void *ud)
{
    size_t it = 0;
    void *v;
    while (rkv_map_next(&s->sessions, &it, NULL, &v)) {
        const struct session *se = v;
        struct sched_session_info si = {se->sid,    se->ext_id,
                                        se->owner,  se->n_tokens,
                                        se->n_kv,   se->kv_bytes,
                                        se->worker, se->busy != NULL,
                                        se->pinned, se->ext_id[0] ? se->last_use_ms : 0};
        fn(ud, &si);
    }
}

int sched_session_evict(struct sched *s, uint64_t sid)
{
    struct session *se = rkv_map_get(&s->sessions, sid);
    if (!se)
        return RKV_ENOTFOUND;
    if (se->busy)
        return RKV_EBUSY;
    uint32_t w = se->worker;
    session_destroy(s, se, 1);
    update_gauges(s);
    kick(s, w); /* sends the close now when the worker is idle */
    return 0;
}

int sched_session_pin(struct sched *s, uint64_t sid, int pinned)
{
    struct session *se = rkv_map_get(&s->sessions, sid);
    if (!se)
        return RKV_ENOTFOUND;
    se->pinned = pinned != 0;
    return 0;
}

int sched_worker_drain(struct sched *s, uint32_t worker, int drain)
{
    if (worker >= s->cfg.n_workers)
        return RKV_EINVAL;
    s->workers[worker].drained = drain != 0;
    return 0;
}

int sched_worker_draining(const struct sched *s, uint32_t worker)
{
    return worker < s->cfg.n_workers && s->workers[worker].drained;
}

void sched_worker_steps(const struct sched *s, uint32_t worker, struct sched_steps *out)
{
    static const struct sched_steps none;
    *out = worker < s->cfg.n_workers ? s->workers[worker].steps : none;
}

void sched_set_authorize(struct sched *s, int (*fn)(void *ud, const char *bearer), void *ud)
{
    s->authorize = fn;
    s->authorize_ud = ud;
}
