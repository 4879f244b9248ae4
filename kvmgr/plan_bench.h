/* plan_bench.h - planning-time benchmark: a synthetic load of many sessions
 * planned repeatedly (cold, steady state, after churn); rkv-bench calls it. */
#ifndef RKV_KVMGR_PLAN_BENCH_H
#define RKV_KVMGR_PLAN_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "kvmgr/plan.h"

struct plan_bench_config {
    size_t n_sessions;    /* e.g. 10000 */
    uint32_t n_gpus;      /* 1..16 */
    uint32_t rounds;      /* plans timed per phase */
    uint64_t seed;        /* the synthetic load */
    uint64_t vram_target; /* bytes per gpu */
    uint64_t weights_bytes;
    uint64_t reserve_bytes;
    uint64_t host_budget; /* bytes */
    uint64_t block_bytes;
    uint32_t max_blocks; /* per session, uniform in 1..max_blocks */
    uint32_t active_pct; /* share of active sessions */
};

struct plan_bench_result {
    double cold_ms_median;   /* no previous plan */
    double steady_ms_median; /* previous plan applied, inputs unchanged */
    double churn_ms_median;  /* 1% of sessions changed between plans */
    double churn_ms_max;
    struct plan_summary last;                 /* of the final plan; gpu pointer not kept */
    uint32_t tactic_sessions[PLAN_N_TACTICS]; /* over all gpus, final plan */
    uint32_t steady_moves;                    /* must be 0 */
};

/* an H200-like default: 8 gpus, 10k sessions, llama-3-8b blocks of 256 */
void plan_bench_config_default(struct plan_bench_config *cfg);
int plan_bench_run(const struct plan_bench_config *cfg, struct plan_bench_result *res);

#endif
