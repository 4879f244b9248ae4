/* plan.c - the plan suite: planning time of the tactic planner on a synthetic load (plan_bench). */
#include <stdio.h>

#include "cli/rkv-bench/bench.h"
#include "common/err.h"
#include "kvmgr/plan_bench.h"

int bench_plan(const struct bench_opts *o, cJSON *out)
{
    struct plan_bench_config cfg;
    plan_bench_config_default(&cfg);
    if (o->quick) {
        cfg.n_sessions = 1000;
        cfg.rounds = 3;
    }
    struct plan_bench_result r;
    int rc = plan_bench_run(&cfg, &r);
    if (rc) {
        fprintf(stderr, "rkv-bench: plan: %s\n", rkv_strerror(rc));
        return rc;
    }
    printf("plan: %zu sessions on %u gpus, %u rounds per phase\n", cfg.n_sessions, cfg.n_gpus,
           cfg.rounds);
    printf("  %-22s %10.3f ms\n", "cold (median)", r.cold_ms_median);
    printf("  %-22s %10.3f ms\n", "steady (median)", r.steady_ms_median);
    printf("  %-22s %10.3f ms\n", "1% churn (median)", r.churn_ms_median);
    printf("  %-22s %10.3f ms\n", "1% churn (max)", r.churn_ms_max);
    printf("  %-22s %10u (must be 0)\n", "moves when steady", r.steady_moves);
    printf("  tactics:");
    for (int t = 0; t < PLAN_N_TACTICS; t++)
        printf(" %s %u", plan_tactic_name((enum plan_tactic)t), r.tactic_sessions[t]);
    printf("\n  host blocks used %u of %u\n", r.last.host_used, r.last.host_cap);

    cJSON_AddNumberToObject(out, "sessions", (double)cfg.n_sessions);
    cJSON_AddNumberToObject(out, "gpus", cfg.n_gpus);
    cJSON_AddNumberToObject(out, "rounds", cfg.rounds);
    cJSON_AddNumberToObject(out, "cold_ms", r.cold_ms_median);
    cJSON_AddNumberToObject(out, "steady_ms", r.steady_ms_median);
    cJSON_AddNumberToObject(out, "churn_ms", r.churn_ms_median);
    cJSON_AddNumberToObject(out, "churn_ms_max", r.churn_ms_max);
    cJSON_AddNumberToObject(out, "steady_moves", r.steady_moves);
    cJSON *t = cJSON_AddObjectToObject(out, "tactics");
    for (int i = 0; i < PLAN_N_TACTICS; i++)
        cJSON_AddNumberToObject(t, plan_tactic_name((enum plan_tactic)i), r.tactic_sessions[i]);
    cJSON_AddNumberToObject(out, "host_used_blocks", r.last.host_used);
    cJSON_AddNumberToObject(out, "host_cap_blocks", r.last.host_cap);
    return r.steady_moves == 0 ? 0 : RKV_ESTATE;
}
