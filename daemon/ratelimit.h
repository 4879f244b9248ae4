/* ratelimit.h - per-API-key limits: requests and tokens per window (token buckets), concurrent
 * requests; the clock is a parameter, so the arithmetic is testable without sleeping. */
#ifndef RKV_RATELIMIT_H
#define RKV_RATELIMIT_H

#include <stddef.h>
#include <stdint.h>

/* what one key may do; 0 = unlimited */
struct rl_limits {
    int64_t rpm;            /* requests per window */
    int64_t tpm;            /* prompt + completion tokens per window */
    int64_t max_concurrent; /* requests in flight */
    int64_t max_tokens;     /* largest max_tokens of one request (the api layer applies it) */
    int64_t max_prompt;     /* tokens of one prompt (the scheduler applies it) */
};

enum rl_kind { RL_OK = 0, RL_REQUESTS, RL_TOKENS, RL_CONCURRENT };

/* the answer to one admission, and what the x-ratelimit-* headers report */
struct rl_verdict {
    enum rl_kind refused;             /* RL_OK when admitted */
    uint64_t retry_ms;                /* refused: when trying again can succeed */
    int64_t limit_req, remaining_req; /* limit 0: requests are not limited */
    uint64_t reset_req_ms;            /* until the request bucket is full again */
    int64_t limit_tok, remaining_tok; /* limit 0: tokens are not limited */
    uint64_t reset_tok_ms;
    int64_t in_flight; /* concurrent: requests of the key running (refused: the limit) */
};

struct rl;

/* window_ms: the "minute" of rpm/tpm (60000; tests shorten it) */
int rl_create(uint64_t window_ms, struct rl **out);
void rl_destroy(struct rl *rl);
uint64_t rl_window_ms(const struct rl *rl);

/* admit one request of key (limits may differ from the last call: a live
 * change keeps what was used). admitted: 0, the request counted and in
 * flight until rl_done. refused: RKV_EBUSY and v says which limit and when
 * to retry; nothing is counted. */
int rl_admit(struct rl *rl, int64_t key, const struct rl_limits *lim, uint64_t now_ms,
             struct rl_verdict *v);
/* an admitted request ended: tokens (prompt + completion) are charged now,
 * since they are known only at the end; the bucket may go below zero and
 * then refuses until it has refilled */
void rl_done(struct rl *rl, int64_t key, uint64_t tokens, uint64_t now_ms);
/* keys with state (for tests and leak checks) */
size_t rl_keys(const struct rl *rl);

/* "250ms", "7s", "1m30s": the x-ratelimit-reset-* format OpenAI sends */
void rl_format_duration(uint64_t ms, char *buf, size_t cap);

#endif
