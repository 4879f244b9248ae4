/* sched.h - rkvd's scheduler: admission, continuous batching, sessions, token streaming. */
#ifndef RKV_SCHED_H
#define RKV_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/api.h"
#include "daemon/fim.h"
#include "proto/wire.h"

/*
 * Everything here runs on rkvd's loop thread, except the driver (the code
 * that talks to kvmgr and a worker), which gets one step_job at a time per
 * worker and hands it back with sched_job_done() on the loop thread.
 *
 * A step for one worker batches every running sequence: decoding ones feed
 * their last sampled token, prefilling ones a chunk of their prompt (at most
 * prefill_chunk tokens each, at most max_batch_tokens in all, and at most
 * prefill_beside_decode prompt tokens in all when the step has a decoding
 * sequence), so new requests join between steps and long prompts never stall
 * decodes for long. When a
 * step returns, tokens are detokenized, checked against stop strings and
 * streamed; then the next step is built at once.
 *
 * A session (session_id in the body or X-Session-Id) keeps its KV in kvmgr
 * between requests: the next request's tokens are compared with the
 * session's history and only the part after the common prefix is
 * prefilled. Requests without a session use a private one, released when
 * they finish.
 *
 * A request of several sequences (n, best_of, a prompt list) runs one sequence per choice,
 * each in a private session, as sequences of the same steps. A prompt's first sequence
 * prefills it; the others of that prompt wait until it has, then open in kvmgr with the
 * prompt's tokens and map its full blocks (the prefix index), computing only the prompt's
 * last partial block again (fewer than block_size tokens each, in one step). Choice k of a
 * prompt with a seed samples with sched_choice_seed(seed, k).
 */

/* a worker's step sizes */
struct sched_steps {
    uint32_t max_batch_tokens; /* tokens in one step */
    uint32_t prefill_chunk;    /* prompt tokens of one sequence per step */
    /* prompt tokens of all sequences in a step that also carries a decoding sequence: what
     * one decoding stream waits for a token beside a long prompt */
    uint32_t prefill_beside_decode;
};

struct sched_config {
    uint32_t n_workers;
    uint32_t ctx_size;         /* positions per sequence (prompt + generated) */
    uint32_t max_running;      /* sequences in one worker's batch */
    uint32_t max_waiting;      /* queued requests before 429 */
    struct sched_steps steps;  /* a worker's, until its sched_worker_up */
    uint32_t max_sessions;     /* named sessions remembered */
    uint32_t max_retries;      /* attempts of a failed step before its requests fail */
    const char *model_name;    /* for metrics labels */
    /* a step of decoding sequences that ask for no top alternatives, with nothing waiting,
     * runs up to decode_steps decode steps in one request to the worker (each feeding the
     * token the one before sampled), at most decode_steps_ms long at the last step's pace; 0
     * or 1: one */
    uint32_t decode_steps;
    uint32_t decode_steps_ms;
    /* a step that also decodes takes the prompt tokens that make it about this long, learned
     * from the steps before (from prefill_beside_decode, between 64 and prefill_chunk); 0:
     * prefill_beside_decode tokens always */
    uint32_t beside_decode_ms;
    /* cached prompt prefixes are shared by every request (else only by those of one API
     * key; without keys every request has key 0, so all share) */
    int prefix_global;
    /* the model's fill-in-the-middle markers, for a completions suffix (without them a
     * suffix is a 400) */
    int has_fim;
    struct fim_tokens fim;
    /* a streamed request with no token for this long gets an SSE comment (then again after
     * as long); 0: never */
    uint32_t keepalive_ms;
};

/* one sequence of a step: input filled by the scheduler, output by the driver */
struct job_seq {
    uint64_t sid;       /* kvmgr/worker session id */
    uint32_t n_past;    /* positions already in the KV */
    uint32_t n_tokens;  /* tokens fed this step */
    int32_t *tokens;    /* (n_tokens); tokens[-n_prev..-1] are the tokens before */
    /* ids before the step's, for kvmgr: the one before (it may have got that position from
     * a prep ahead without its id) or those a step of several decode steps picked */
    uint32_t n_prev;
    uint8_t sample;     /* sample a token from the last position */
    uint8_t reset;      /* the worker must rebuild its sampler from history */
    uint8_t pinned;     /* operator pinned the session: kvmgr keeps it resident */
    uint8_t nomove;     /* kvmgr must not move it to another gpu now */
    uint32_t n_history; /* with reset: every token before this step's */
    int32_t *history;
    uint32_t n_drawn;   /* with reset: tokens this request sampled already */
    uint8_t is_new;     /* kvmgr has no blocks for it: it may map a shared prefix */
    uint32_t n_all;     /* with is_new: every token the session has */
    int32_t *all;
    uint64_t scope;     /* with is_new: the prefix partition it may share blocks in */
    /* out (the driver moves n_past/tokens past what kvmgr found shared) */
    uint32_t n_cached;
    /* out: the bytes of the blocks kvmgr's table names for it (a sliding-window model's dropped
     * local parts name none) */
    uint64_t kv_bytes;
    struct proto_sampling sp;
    /* out */
    int32_t status; /* 0, RKV_ENOSPACE: kvmgr could not place it yet (wait), or
                     * PROTO_KV_MOVED(g): it runs on worker g from now on */
    int32_t token;
    float logprob;
    uint8_t n_top;
    struct proto_logprob top[PROTO_MAX_TOP_LOGPROBS];
    uint8_t n_more; /* tokens of the job's later decode steps, in order */
    struct proto_logprob more[PROTO_MAX_DECODE_STEPS - 1];
};

struct step_job {
    uint32_t worker;
    uint32_t kv_gen; /* the scheduler's kvmgr generation when built */
    struct job_seq *seqs;
    uint32_t n_seqs;
    uint64_t *closes; /* sessions to release in kvmgr before the step, then
                       * n_forgets more whose sampler only the worker drops
                       * (they moved to another worker) */
    uint32_t n_closes;
    uint32_t n_forgets;
    uint64_t *idles;  /* sessions that went idle (kept, parkable) */
    uint32_t n_idles;
    uint32_t n_steps; /* decode steps the worker runs (>= 1; see sched_config) */
    /* out: 0, or the whole step failed (worker or kvmgr unreachable) */
    int rc;
    int kvmgr_failed; /* the failure was kvmgr's (its KV is gone) */
    uint32_t kvmgr_pid; /* the kvmgr that placed this step's KV (0: unknown) */
    int prep_ahead;     /* its tables were asked for while the step before it ran */
    /* prompt tokens it carries beside decoding sequences, and the most it could (0, 0: it
     * decodes nothing or prefills nothing) */
    uint32_t beside_tokens, beside_cap;
    char err[256];
    double step_ms;
};

struct sched_driver {
    /* runs job for its worker (one at a time per worker); must end with
     * sched_job_done(job) on the loop thread, also on failure */
    int (*submit)(void *ctx, struct step_job *job);
    void *ctx;
};

struct sched;
struct tok;
struct metrics;
struct store;

int sched_create(uv_loop_t *loop, const struct sched_config *cfg, const struct tok *tok,
                 const struct sched_driver *drv, struct metrics *metrics, struct store *store,
                 struct sched **out, char *errbuf, size_t errlen);
/* fails every request still queued or running (503) and frees */
void sched_destroy(struct sched *s);
/* the api_sched rkvd's API layer calls */
void sched_api(struct sched *s, struct api_sched *out);
void sched_job_done(struct sched *s, struct step_job *job);

/* Several workers: kvmgr may answer a sequence "moved to gpu g" (it placed a
 * new session there, or moved the session's KV there to rebalance). The
 * scheduler then runs it on worker g without the client noticing: the
 * request keeps its place, the KV positions stay, worker g rebuilds the
 * sampler from the history (n_drawn keeps seeded sampling reproducible) and
 * the old worker drops its sampler. Moves are counted in
 * rkv:kv_sessions_moved_total. While a worker is drained or down nothing
 * moves (PROTO_KV_NOMOVE), so a drain holds. */

/* supervisor news: a worker went down / came back; kvmgr answers with pid.
 * A pid other than the one the sessions' KV lives in means kvmgr restarted:
 * its KV is gone, every sequence is re-prefilled from its token history and
 * results of steps placed by the old one are dropped. */
void sched_worker_down(struct sched *s, uint32_t worker);
/* a worker's step sizes from the config's (0: by its backend) and what its hello said (the
 * tokens it sized its buffers for, 0 = not said: 512; whether it is on a gpu): the worker's
 * own step (2048 on a gpu, 512 on the cpu); prompt chunks as long on a gpu, 256 on the cpu;
 * beside a decoding sequence 512 prompt tokens a step on a gpu, a chunk on the cpu. Never
 * more than the worker's own size, a chunk never more than the step, the prompt tokens beside
 * a decode never more than the step either */
void sched_step_sizes(const struct sched_steps *cfg, uint32_t worker_max_batch_tokens, int on_gpu,
                      struct sched_steps *out);
/* the prompt tokens beside a decode for the next step, from this step's: cur tokens took
 * step_ms against target_ms; half the way (in ratio) to the size that would take target_ms if
 * time grew with the tokens, within [lo, hi] */
uint32_t sched_beside_next(uint32_t cur, double step_ms, double target_ms, uint32_t lo,
                           uint32_t hi);
/* that worker's step sizes from now on (sched_step_sizes) */
void sched_worker_up(struct sched *s, uint32_t worker, const struct sched_steps *steps);
void sched_kvmgr_seen(struct sched *s, uint32_t pid);
/* stop taking requests (SIGTERM); running ones go on */
void sched_drain(struct sched *s);
/* the drain deadline: every request not finished yet is answered 503 with msg (a started
 * stream gets an SSE error event), so none is cut off without an answer when the
 * connections close */
void sched_fail_all(struct sched *s, const char *msg);

struct sched_stats {
    uint32_t running;
    uint32_t waiting;
    uint32_t sessions;
    uint64_t steps;
    uint64_t prompt_tokens;
    uint64_t cached_tokens;   /* prompt tokens served from a reused prefix */
    uint64_t prefill_tokens;  /* prompt tokens actually computed */
    uint64_t gen_tokens;
};
void sched_get_stats(const struct sched *s, struct sched_stats *out);
/* periodic work (rkvd's cron, once a second): keep-alives of streams that wait */
void sched_tick(struct sched *s);
/* the seed of a prompt's choice k: the request's for k = 0 (one choice samples as n = 1
 * does), a mix of both otherwise */
uint64_t sched_choice_seed(int64_t seed, uint32_t k);

/* --- operator controls (rkvctl, through daemon/admin.c) --- */

/* one session as the admin API shows it; ext_id is "" for a private one */
struct sched_session_info {
    uint64_t sid;
    const char *ext_id;
    int64_t owner;     /* the API key that made it (0 without keys) */
    uint32_t n_tokens; /* history: prompt + generated */
    uint32_t n_kv;     /* positions whose KV kvmgr holds */
    uint64_t kv_bytes; /* what its blocks hold, as of its last step */
    uint32_t worker;
    int busy;          /* a request is running or queued on it */
    int pinned;
    uint64_t last_use_ms; /* rkv_now_ms clock; 0 for a private session */
};
typedef void (*sched_session_fn)(void *ud, const struct sched_session_info *si);
void sched_sessions_foreach(struct sched *s, sched_session_fn fn, void *ud);
/* frees the session's KV and forgets it: RKV_ENOTFOUND, RKV_EBUSY while a
 * request uses it */
int sched_session_evict(struct sched *s, uint64_t sid);
/* pinned sessions ask kvmgr to keep their KV resident (PROTO_KV_PINNED)
 * from their next step on; RKV_ENOTFOUND */
int sched_session_pin(struct sched *s, uint64_t sid, int pinned);
/* a drained worker gets no new sessions; its sessions finish there.
 * RKV_EINVAL for a worker that does not exist */
int sched_worker_drain(struct sched *s, uint32_t worker, int drain);
int sched_worker_draining(const struct sched *s, uint32_t worker);
/* the step sizes a worker runs with (the config's until its first sched_worker_up) */
void sched_worker_steps(const struct sched *s, uint32_t worker, struct sched_steps *out);
/* the prompt tokens its next step that also decodes may take (beside_decode_ms learns it) */
uint32_t sched_worker_beside(const struct sched *s, uint32_t worker);
/* the API's key check (api_sched.authorize) goes to fn; NULL lets everyone in */
void sched_set_authorize(struct sched *s, int (*fn)(void *ud, const char *bearer), void *ud);

#endif
