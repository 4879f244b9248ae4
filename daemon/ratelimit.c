/* ratelimit.c - per-key token buckets for requests and tokens, and in-flight counts. */
#include "daemon/ratelimit.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/util.h"

/* a bucket holds up to cap units and refills cap per window, continuously */
struct bucket {
    double level;
    int64_t cap; /* 0: not limited */
    uint64_t at_ms;
};

struct rl_key {
    struct bucket req, tok;
    int64_t in_flight;
};

struct rl {
    uint64_t window_ms;
    struct rkv_map keys; /* key id -> struct rl_key */
};

int rl_create(uint64_t window_ms, struct rl **out)
{
    if (!window_ms)
        return RKV_EINVAL;
    struct rl *rl = calloc(1, sizeof *rl);
    if (!rl)
        return RKV_ENOMEM;
    rl->window_ms = window_ms;
    rkv_map_init(&rl->keys);
    *out = rl;
    return 0;
}

void rl_destroy(struct rl *rl)
{
    if (!rl)
        return;
    uint64_t k;
    void *v;
    for (size_t it = 0; rkv_map_next(&rl->keys, &it, &k, &v);)
        free(v);
    rkv_map_fini(&rl->keys);
    free(rl);
}

uint64_t rl_window_ms(const struct rl *rl)
{
    return rl->window_ms;
}

size_t rl_keys(const struct rl *rl)
{
    size_t n = 0;
    uint64_t k;
    void *v;
    for (size_t it = 0; rkv_map_next(&rl->keys, &it, &k, &v);)
        n++;
    return n;
}

/* refill to now under a possibly new cap; a new or newly limited bucket starts full */
static void bucket_sync(struct bucket *b, int64_t cap, uint64_t window_ms, uint64_t now_ms)
{
    if (cap <= 0) {
        b->cap = 0;
        return;
    }
    if (b->cap == 0) {
        b->level = (double)cap;
    } else {
        if (now_ms > b->at_ms)
            b->level += (double)cap * (double)(now_ms - b->at_ms) / (double)window_ms;
        if (b->level > (double)cap)
            b->level = (double)cap;
    }
    b->cap = cap;
    b->at_ms = now_ms;
}

/* ms until the bucket holds `want` units */
static uint64_t bucket_wait(const struct bucket *b, double want, uint64_t window_ms)
{
    if (!b->cap || b->level >= want)
        return 0;
    double ms = (want - b->level) * (double)window_ms / (double)b->cap;
    return (uint64_t)ms + 1;
}

static struct rl_key *key_get(struct rl *rl, int64_t key, int create)
{
    struct rl_key *k = rkv_map_get(&rl->keys, (uint64_t)key);
    if (k || !create)
        return k;
    k = calloc(1, sizeof *k);
    if (k && rkv_map_put(&rl->keys, (uint64_t)key, k)) {
        free(k);
        return NULL;
    }
    return k;
}

static void fill_verdict(const struct rl *rl, const struct rl_key *k, struct rl_verdict *v)
{
    v->limit_req = k->req.cap;
    v->remaining_req = k->req.cap ? (int64_t)(k->req.level > 0 ? k->req.level : 0) : 0;
    v->reset_req_ms = bucket_wait(&k->req, (double)k->req.cap, rl->window_ms);
    v->limit_tok = k->tok.cap;
    v->remaining_tok = k->tok.cap ? (int64_t)(k->tok.level > 0 ? k->tok.level : 0) : 0;
    v->reset_tok_ms = bucket_wait(&k->tok, (double)k->tok.cap, rl->window_ms);
    v->in_flight = k->in_flight;
}

int rl_admit(struct rl *rl, int64_t key, const struct rl_limits *lim, uint64_t now_ms,
             struct rl_verdict *v)
{
    *v = (struct rl_verdict){0};
    struct rl_key *k = key_get(rl, key, 1);
    if (!k)
        return RKV_ENOMEM;
    bucket_sync(&k->req, lim->rpm, rl->window_ms, now_ms);
    bucket_sync(&k->tok, lim->tpm, rl->window_ms, now_ms);
    if (lim->max_concurrent > 0 && k->in_flight >= lim->max_concurrent) {
        v->refused = RL_CONCURRENT;
        v->retry_ms = 1000; /* when one finishes: unknown, so soon */
    } else if (k->req.cap && k->req.level < 1.0) {
        v->refused = RL_REQUESTS;
        v->retry_ms = bucket_wait(&k->req, 1.0, rl->window_ms);
    } else if (k->tok.cap && k->tok.level < 1.0) {
        v->refused = RL_TOKENS;
        v->retry_ms = bucket_wait(&k->tok, 1.0, rl->window_ms);
    }
    if (v->refused) {
        fill_verdict(rl, k, v);
        if (v->refused == RL_CONCURRENT)
            v->in_flight = lim->max_concurrent;
        return RKV_EBUSY;
    }
    if (k->req.cap)
        k->req.level -= 1.0;
    k->in_flight++;
    fill_verdict(rl, k, v);
    return 0;
}

void rl_done(struct rl *rl, int64_t key, uint64_t tokens, uint64_t now_ms)
{
    struct rl_key *k = key_get(rl, key, 0);
    if (!k)
        return;
    if (k->in_flight > 0)
        k->in_flight--;
    if (k->tok.cap) {
        bucket_sync(&k->tok, k->tok.cap, rl->window_ms, now_ms);
        k->tok.level -= (double)tokens;
    }
}

void rl_format_duration(uint64_t ms, char *buf, size_t cap)
{
    if (ms < 1000) {
        snprintf(buf, cap, "%llums", (unsigned long long)ms);
        return;
    }
    uint64_t s = (ms + 999) / 1000;
    if (s < 60)
        snprintf(buf, cap, "%llus", (unsigned long long)s);
    else
        snprintf(buf, cap, "%llum%llus", (unsigned long long)(s / 60),
                 (unsigned long long)(s % 60));
}
