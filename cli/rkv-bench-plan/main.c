/* rkv-bench-plan - times the tactic planner on a synthetic load (10k sessions
 * by default) and prints the result, optionally as json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kvmgr/plan_bench.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: rkv-bench-plan [--sessions N] [--gpus N] [--rounds N] [--seed N]\n"
               "                      [--max-blocks N] [--active-pct N] [--json FILE]\n");
}

static int parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s ? s : "", &end, 10);
    if (!s || !*s || *end) {
        fprintf(stderr, "rkv-bench-plan: %s needs a whole number, got '%s'\n", flag, s ? s : "");
        return RKV_EINVAL;
    }
    *out = v;
    return 0;
}

static void write_json(FILE *f, const struct plan_bench_config *c,
                       const struct plan_bench_result *r)
{
    fprintf(f,
            "{\"suite\":\"plan\",\"sessions\":%zu,\"gpus\":%u,\"rounds\":%u,"
            "\"cold_ms\":%.3f,\"steady_ms\":%.3f,\"churn_ms\":%.3f,\"churn_ms_max\":%.3f,"
            "\"steady_moves\":%u,\"tactics\":{",
            c->n_sessions, c->n_gpus, c->rounds, r->cold_ms_median, r->steady_ms_median,
            r->churn_ms_median, r->churn_ms_max, r->steady_moves);
    for (int t = 0; t < PLAN_N_TACTICS; t++)
        fprintf(f, "%s\"%s\":%u", t ? "," : "", plan_tactic_name((enum plan_tactic)t),
                r->tactic_sessions[t]);
    fprintf(f, "},\"host_used_blocks\":%u,\"host_cap_blocks\":%u}\n", r->last.host_used,
            r->last.host_cap);
}

int main(int argc, char **argv)
{
    struct plan_bench_config cfg;
    plan_bench_config_default(&cfg);
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        uint64_t v = 0;
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = val;
        } else if (!strcmp(a, "--sessions")) {
            rc = parse_u64(a, val, &v), cfg.n_sessions = v;
        } else if (!strcmp(a, "--gpus")) {
            rc = parse_u64(a, val, &v), cfg.n_gpus = (uint32_t)v;
        } else if (!strcmp(a, "--rounds")) {
            rc = parse_u64(a, val, &v), cfg.rounds = (uint32_t)v;
        } else if (!strcmp(a, "--seed")) {
            rc = parse_u64(a, val, &v), cfg.seed = v;
        } else if (!strcmp(a, "--max-blocks")) {
            rc = parse_u64(a, val, &v), cfg.max_blocks = (uint32_t)v;
        } else if (!strcmp(a, "--active-pct")) {
            rc = parse_u64(a, val, &v), cfg.active_pct = (uint32_t)v;
        } else {
            fprintf(stderr, "rkv-bench-plan: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (rc || !val)
            return 2;
        i++;
    }
    if (cfg.n_gpus == 0 || cfg.n_gpus > 16) {
        fprintf(stderr, "rkv-bench-plan: --gpus must be 1..16\n");
        return 2;
    }
    struct plan_bench_result res;
    int rc = plan_bench_run(&cfg, &res);
    if (rc) {
        fprintf(stderr, "rkv-bench-plan: %s\n", rkv_strerror(rc));
        return 1;
    }
    printf("plan: %zu sessions on %u gpus, median of %u plans\n", cfg.n_sessions, cfg.n_gpus,
           cfg.rounds);
    printf("  cold   %8.3f ms\n  steady %8.3f ms (moves %u)\n  churn  %8.3f ms (max %.3f)\n",
           res.cold_ms_median, res.steady_ms_median, res.steady_moves, res.churn_ms_median,
           res.churn_ms_max);
    printf("  tactics:");
    for (int t = 0; t < PLAN_N_TACTICS; t++)
        printf(" %s=%u", plan_tactic_name((enum plan_tactic)t), res.tactic_sessions[t]);
    printf("\n  host blocks %u of %u\n", res.last.host_used, res.last.host_cap);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "rkv-bench-plan: cannot write %s\n", json);
            return 1;
        }
        write_json(f, &cfg, &res);
        fclose(f);
    }
    return res.steady_moves == 0 ? 0 : 1;
}
