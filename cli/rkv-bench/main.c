/* main.c - rkv-bench SUITE [--json FILE]: runs one benchmark suite, prints a table, writes JSON. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/rkv-bench/bench.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/kv.h"

#define PROG "rkv-bench"

/* suites by name; a gpu suite joins this table */
static const struct {
    const char *name;
    const char *what;
    int (*run)(const struct bench_opts *o, cJSON *out);
} suites[] = {
    {"cpu", "cpu backend: prefill/decode tok/s (tiny, small), attention with a 50% host split",
     bench_cpu},
    {"migrate", "kv block migration: kvpool_copy device <-> host, 1..64 blocks, vs a plain copy",
     bench_migrate},
    {"plan", "tactic planner: plan time of 10k sessions on 8 gpus (cold, steady, churn)",
     bench_plan},
    {"ipc", "nng req/rep round trip over ipc://: empty, and a kv_prep's sizes at batch 1 and 64",
     bench_ipc},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " SUITE [--json FILE] [--plot FILE] [--threads N] [--quick]\n"
               "          [--models-dir DIR] [--kv-dtype " KV_DTYPE_NAMES " (f16)]\nsuites:\n");
    for (size_t i = 0; i < RKV_ARRAY_LEN(suites); i++)
        fprintf(f, "  %-8s %s\n", suites[i].name, suites[i].what);
}

double bench_now_s(void)
{
    return (double)rkv_now_ns() / 1e9;
}

int bench_model(const struct bench_opts *o, const char *preset, const char *dtype, char *path,
                size_t len)
{
    snprintf(path, len, "%s/%s-%s.gguf", o->models_dir, preset, dtype);
    struct stat st;
    if (stat(path, &st) == 0)
        return 0;
    if (mkdir(o->models_dir, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", o->models_dir, strerror(errno));
        return -errno;
    }
    char mk[4096], tmp[4200];
    snprintf(mk, sizeof(mk), "%s/rkv-mkmodel", o->exe_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    char *argv[] = {mk,       "--preset", (char *)preset, "--dtype", (char *)dtype,
                    "--seed", "1",        "--out",        tmp,       NULL};
    log_info("generating %s with rkv-mkmodel", path);
    pid_t pid;
    int rc = rkv_spawn(mk, argv, NULL, &pid), status = 0;
    if (rc < 0) {
        fprintf(stderr, PROG ": cannot run %s (build it: make): %s\n", mk, rkv_strerror(rc));
        return rc;
    }
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        rename(tmp, path) < 0) {
        fprintf(stderr, PROG ": %s --preset %s --dtype %s failed\n", mk, preset, dtype);
        unlink(tmp);
        return RKV_EIO;
    }
    return 0;
}

int main(int argc, char **argv)
{
    rkv_log_init(PROG, RKV_LOG_WARN);
    static const struct option lo[] = {
        {"json", 1, 0, 'j'},       {"plot", 1, 0, 'p'},
        {"threads", 1, 0, 't'},    {"quick", 0, 0, 'q'},
        {"models-dir", 1, 0, 'm'}, {"help", 0, 0, 'h'},
        {"kv-dtype", 1, 0, 'k'},   {0, 0, 0, 0},
    };
    const char *json_path = NULL, *plot_path = NULL;
    char exe_dir[4096], models_dir[4200];
    struct bench_opts o = {0, 0, NULL, exe_dir, KV_F16};
    if (rkv_exe_dir(exe_dir, sizeof(exe_dir)) < 0)
        snprintf(exe_dir, sizeof(exe_dir), ".");
    /* build/bin/rkv-bench -> build/models */
    snprintf(models_dir, sizeof(models_dir), "%s/../models", exe_dir);
    o.models_dir = models_dir;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'j': json_path = optarg; break;
        case 'p': plot_path = optarg; break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 1024) {
                fprintf(stderr, PROG ": --threads: '%s' is not a count in [1, 1024]\n", optarg);
                return 1;
            }
            o.threads = (uint32_t)v;
            break;
        }
        case 'q': o.quick = 1; break;
        case 'm': o.models_dir = optarg; break;
        case 'k': {
            enum kv_dtype t;
            if (kv_dtype_parse(optarg, &t) < 0) {
                fprintf(stderr, PROG ": --kv-dtype: '%s' is not one of " KV_DTYPE_NAMES "\n",
                        optarg);
                return 1;
            }
            o.kv_dtype = (int)t;
            break;
        }
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, PROG ": unknown flag or missing value: %s (see --help)\n",
                    argv[optind - 1]);
            return 1;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 1;
    }
    const char *name = argv[optind];
    for (size_t i = 0; i < RKV_ARRAY_LEN(suites); i++) {
        if (strcmp(name, suites[i].name))
            continue;
        if (plot_path) {
            fprintf(stderr, PROG ": --plot: the %s suite draws no plot\n", name);
            return 1;
        }
        cJSON *out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "suite", name);
        int rc = suites[i].run(&o, out);
        if (rc == 0 && json_path) {
            char *text = cJSON_Print(out);
            FILE *f = fopen(json_path, "w");
            if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
                fprintf(stderr, PROG ": --json: cannot write %s: %s\n", json_path, strerror(errno));
                rc = RKV_EIO;
            }
            free(text);
        }
        cJSON_Delete(out);
        return rc < 0 ? 1 : 0;
    }
    fprintf(stderr, PROG ": unknown suite '%s'\n", name);
    usage(stderr);
    return 1;
}
