/* plan_bench.c - planning-time benchmark over a synthetic session load. */
#include "kvmgr/plan_bench.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

#define GIB (1024ull * 1024 * 1024)
#define MIB (1024ull * 1024)

void plan_bench_config_default(struct plan_bench_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_sessions = 10000;
    cfg->n_gpus = 8;
    cfg->rounds = 20;
    cfg->seed = 1;
    cfg->vram_target = 130 * GIB;
    cfg->weights_bytes = 16 * GIB;
    cfg->reserve_bytes = 4 * GIB;
    cfg->host_budget = 1536 * GIB;
    /* llama-3-8b f16: 128 KiB per position, 256 positions per block */
    cfg->block_bytes = 32 * MIB;
    cfg->max_blocks = 16; /* up to 4k positions: a mix that parks, windows and queues */
    cfg->active_pct = 60;
}

static uint64_t next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void apply(struct plan_session *ss, size_t n, const struct plan *p)
{
    for (size_t i = 0; i < n; i++) {
        const struct plan_assign *a = plan_assign_at(p, i);
        ss[i].cur_tactic = a->tactic;
        ss[i].cur_dev = a->n_dev;
        ss[i].cur_host = a->n_host;
    }
}

/* times `rounds` plans; each round first calls mutate (may be NULL) */
static int time_phase(struct plan_input *in, struct plan_session *ss, struct plan **prev,
                      uint32_t rounds, uint64_t *rng, int churn, double *ms, uint32_t *moves)
{
    for (uint32_t r = 0; r < rounds; r++) {
        if (churn) {
            /* 1% of the sessions grow, go idle or come back */
            for (size_t k = 0; k < in->n_sessions / 100 + 1; k++) {
                struct plan_session *s = &ss[next(rng) % in->n_sessions];
                if (next(rng) % 2)
                    s->n_blocks++;
                else
                    s->active = !s->active;
                s->last_use++;
            }
        }
        struct plan *p = NULL;
        uint64_t t0 = rkv_now_ns();
        int rc = plan_compute(in, *prev, &p);
        ms[r] = (double)(rkv_now_ns() - t0) / 1e6;
        if (rc)
            return rc;
        if (moves)
            *moves += plan_get_summary(p)->n_moves;
        apply(ss, in->n_sessions, p);
        plan_destroy(*prev);
        *prev = p;
    }
    qsort(ms, rounds, sizeof(*ms), dbl_cmp);
    return 0;
}

int plan_bench_run(const struct plan_bench_config *cfg, struct plan_bench_result *res)
{
    memset(res, 0, sizeof(*res));
    if (cfg->n_sessions == 0 || cfg->n_gpus == 0 || cfg->rounds == 0 || cfg->max_blocks == 0)
        return RKV_EINVAL;
    struct plan_session *ss = calloc(cfg->n_sessions, sizeof(*ss));
    struct plan_gpu *gpus = calloc(cfg->n_gpus, sizeof(*gpus));
    double *ms = calloc(cfg->rounds, sizeof(*ms));
    if (!ss || !gpus || !ms) {
        free(ss), free(gpus), free(ms);
        return RKV_ENOMEM;
    }
    uint64_t rng = cfg->seed ? cfg->seed : 1;
    for (uint32_t g = 0; g < cfg->n_gpus; g++) {
        gpus[g].vram_target = cfg->vram_target;
        gpus[g].weights_bytes = cfg->weights_bytes;
        gpus[g].compute_reserve_bytes = cfg->reserve_bytes;
        gpus[g].pcie_h2d_gbps = 55.4;
        gpus[g].host_stream_gbps = 51;
        gpus[g].dev_attn_gbps = 4200;
        gpus[g].cpu_attn_gbps = 30;
    }
    for (size_t i = 0; i < cfg->n_sessions; i++) {
        ss[i].id = i + 1;
        ss[i].gpu = (uint32_t)(i % cfg->n_gpus);
        ss[i].n_blocks = 1 + (uint32_t)(next(&rng) % cfg->max_blocks);
        ss[i].active = next(&rng) % 100 < cfg->active_pct;
        ss[i].pinned = next(&rng) % 1000 == 0;
        ss[i].cur_tactic = PLAN_WAIT;
        ss[i].last_use = next(&rng) % 100000;
    }
    struct plan_input in;
    plan_input_init(&in);
    in.block_bytes = cfg->block_bytes;
    in.host_budget = cfg->host_budget;
    in.n_gpus = cfg->n_gpus;
    in.gpus = gpus;
    in.n_sessions = cfg->n_sessions;
    in.sessions = ss;

    struct plan *prev = NULL;
    int rc = 0;
    /* cold: every round from nothing */
    for (uint32_t r = 0; r < cfg->rounds && rc == 0; r++) {
        struct plan *p = NULL;
        uint64_t t0 = rkv_now_ns();
        rc = plan_compute(&in, NULL, &p);
        ms[r] = (double)(rkv_now_ns() - t0) / 1e6;
        if (r + 1 < cfg->rounds)
            plan_destroy(p);
        else
            prev = p;
    }
    if (rc == 0) {
        qsort(ms, cfg->rounds, sizeof(*ms), dbl_cmp);
        res->cold_ms_median = ms[cfg->rounds / 2];
        apply(ss, cfg->n_sessions, prev);
        rc = time_phase(&in, ss, &prev, cfg->rounds, &rng, 0, ms, &res->steady_moves);
    }
    if (rc == 0) {
        res->steady_ms_median = ms[cfg->rounds / 2];
        rc = time_phase(&in, ss, &prev, cfg->rounds, &rng, 1, ms, NULL);
    }
    if (rc == 0) {
        res->churn_ms_median = ms[cfg->rounds / 2];
        res->churn_ms_max = ms[cfg->rounds - 1];
        res->last = *plan_get_summary(prev);
        for (uint32_t g = 0; g < cfg->n_gpus; g++)
            for (int t = 0; t < PLAN_N_TACTICS; t++)
                res->tactic_sessions[t] += res->last.gpu[g].sessions[t];
        res->last.gpu = NULL;
    }
    plan_destroy(prev);
    free(ss), free(gpus), free(ms);
    return rc;
}
