/* bench.h - rkv-bench's suites and what they share (options, clock, models on disk). */
#ifndef RKV_BENCH_H
#define RKV_BENCH_H

#include <cjson/cJSON.h>
#include <stdint.h>

struct bench_opts {
    uint32_t threads;       /* 0 = online cpus */
    int quick;              /* small sizes: a smoke run for tests */
    const char *models_dir; /* where generated models live */
    const char *exe_dir;    /* this binary's folder (sibling tools) */
    int kv_dtype;           /* enum kv_dtype of the model runs (cpu suite), f16 by default */
};

/* a suite fills `out` (its JSON result) and prints a table to stdout */
int bench_cpu(const struct bench_opts *o, cJSON *out);
/* kvpool_copy between a device and a host pool (shm; cuda when a gpu answers), 1..64 blocks */
int bench_migrate(const struct bench_opts *o, cJSON *out);
/* the tactic planner's time on a synthetic load (kvmgr/plan_bench.h) */
int bench_plan(const struct bench_opts *o, cJSON *out);
/* one nng request/reply round trip over ipc://, empty and at a kv_prep's sizes */
int bench_ipc(const struct bench_opts *o, cJSON *out);

double bench_now_s(void);
/* models_dir/<preset>-<dtype>.gguf, made with rkv-mkmodel when absent */
int bench_model(const struct bench_opts *o, const char *preset, const char *dtype, char *path,
                size_t len);

#endif
