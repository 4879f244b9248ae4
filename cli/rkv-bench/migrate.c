/* migrate.c - the migrate suite: kvpool_copy throughput between a device and a host pool, as a
 * ratio to a plain copy ceiling measured in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/rkv-bench/bench.h"
#include "common/err.h"
#include "common/gpu.h"
#include "kvmgr/pool.h"

/*
 * Each measurement moves a batch of 1..64 whole blocks between the pools with
 * kvpool_copy, in both directions (demote: device -> host, promote: host ->
 * device). The blocks of a batch are scattered (source block i goes to
 * destination block n-1-i), so no two of them merge into one copy: the cost
 * per block is what the kvmgr pays for a real migration. Each batch's ceiling
 * is one plain copy of the same bytes, contiguous, in the same run: memcpy
 * between the two shared memory pools on the cpu, one pinned host -> device
 * cudaMemcpy on a gpu (the cpu's small batches sit in its caches, both ways). A turnover row
 * (batches up to 32) moves n blocks out and n other blocks in with one kvpool_run_copies, as
 * a rotation's pass does: on a gpu the two directions run on their own copy lanes at once.
 * Its ceiling is the same two plain copies, contiguous, queued on the lanes together
 * (rkv_gpu_copy_async; on the cpu one memcpy after the other), and its overlap is the time
 * of the demote and the promote one after the other over the turnover's. Block sizes:
 * llama3-8b's 131072 bytes/token x 256 positions = 32 MiB on a gpu; 2 MiB on the cpu (the
 * tiny/small presets' blocks are smaller still).
 */

#define MAX_BATCH 64
static const uint32_t batches[] = {1, 2, 4, 8, 16, 32, 64};
#define N_BATCHES (sizeof(batches) / sizeof(batches[0]))

struct side {
    const char *name; /* "cpu" | "gpu" */
    uint64_t block_bytes;
    double min_s;                   /* time per measurement */
    double ceiling_gbps[N_BATCHES]; /* the plain copy of the same bytes, contiguous */
    double gbps[2][N_BATCHES];      /* [demote, promote][batch] */
    /* turnover rows (n <= MAX_BATCH / 2; 0 where not measured): both directions' bytes */
    double turn_gbps[N_BATCHES], turn_ceiling_gbps[N_BATCHES], turn_overlap[N_BATCHES];
};

struct turn_run {
    struct kvpool *dev, *host;
    struct kvb_copy ops[MAX_BATCH];
    size_t n;
};

static int turn_run(void *u)
{
    struct turn_run *t = u;
    return kvpool_run_copies(&t->dev, 1, t->host, t->ops, t->n);
}

/* the turnover's ceiling: one contiguous copy each way, together */
struct duplex_run {
    void *d2h_dst, *h2d_dst;
    const void *d2h_src, *h2d_src;
    size_t n;
    int gpu; /* -1: memcpy */
};

static int duplex_run(void *u)
{
    struct duplex_run *p = u;
    if (p->gpu < 0) {
        memcpy(p->d2h_dst, p->d2h_src, p->n);
        memcpy(p->h2d_dst, p->h2d_src, p->n);
        return 0;
    }
    int rc = rkv_gpu_copy_async((uint32_t)p->gpu, RKV_GPU_LANE_D2H, p->d2h_dst, p->d2h_src, p->n);
    if (rc == 0)
        rc = rkv_gpu_copy_async((uint32_t)p->gpu, RKV_GPU_LANE_H2D, p->h2d_dst, p->h2d_src, p->n);
    int wrc = rkv_gpu_copy_wait((uint32_t)p->gpu);
    return rc ? rc : wrc;
}

struct copy_run {
    struct kvpool *dst;
    const struct kvpool *src;
    struct kvpool_op ops[MAX_BATCH];
    size_t n;
};

static int copy_run(void *u)
{
    struct copy_run *c = u;
    return kvpool_copy(c->dst, c->src, c->ops, c->n);
}

struct plain_run {
    void *dst;
    const void *src;
    size_t n;
    int gpu; /* -1: memcpy */
};

static int plain_run(void *u)
{
    struct plain_run *p = u;
    if (p->gpu >= 0)
        return rkv_gpu_copy((uint32_t)p->gpu, p->dst, p->src, p->n);
    memcpy(p->dst, p->src, p->n);
    return 0;
}

/* per batch, the ceiling, a demote, a promote and (up to half the pool) the turnover and its
 * ceiling in turn (so a busy machine slows them alike) for at least min_s and 3 rounds; each
 * one's fastest run counts (the least disturbed). ceil_dst / ceil_src: a device buffer of the
 * pool's size and the host pool's first block, in the plain copy's direction (host -> device
 * on a gpu) */
static int run_batches(struct side *s, struct kvpool *dev, struct kvpool *host, uint8_t *ceil_dst,
                       uint8_t *ceil_src, int gpu)
{
    for (size_t b = 0; b < N_BATCHES; b++) {
        uint32_t n = batches[b];
        size_t bytes = (size_t)n * s->block_bytes;
        struct plain_run p = {ceil_dst, ceil_src, bytes, gpu};
        struct copy_run c[2] = {{host, dev, {{0}}, n}, {dev, host, {{0}}, n}};
        for (uint32_t i = 0; i < n; i++)
            c[0].ops[i] = c[1].ops[i] = (struct kvpool_op){i, n - 1 - i, 256};
        /* the turnover: device blocks 0..n-1 out to host n-1..0 while host n..2n-1 come in to
         * device 2n-1..n; its ceiling the same bytes each way, contiguous */
        int turn = 2 * n <= MAX_BATCH;
        struct turn_run t = {dev, host, {{0}}, turn ? 2 * n : 0};
        for (uint32_t i = 0; turn && i < n; i++) {
            t.ops[i] = (struct kvb_copy){KVB_COPY_D2H, 0, i, n - 1 - i, 256};
            t.ops[n + i] = (struct kvb_copy){KVB_COPY_H2D, 0, n + i, 2 * n - 1 - i, 256};
        }
        struct duplex_run dx = {ceil_src, ceil_dst + bytes, ceil_dst, ceil_src + bytes, bytes, gpu};
        int n_runs = turn ? 5 : 3;
        double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
        double start = bench_now_s();
        for (int round = 0; round < 4 || bench_now_s() - start < s->min_s; round++) {
            for (int k = 0; k < n_runs; k++) {
                double t0 = bench_now_s();
                int rc = k == 0   ? plain_run(&p)
                         : k < 3  ? copy_run(&c[k - 1])
                         : k == 3 ? turn_run(&t)
                                  : duplex_run(&dx);
                if (rc)
                    return rc;
                double dt = bench_now_s() - t0;
                /* round 0 warms up: first touch of the pages */
                if (round > 0 && dt < best[k])
                    best[k] = dt > 1e-9 ? dt : 1e-9;
            }
        }
        s->ceiling_gbps[b] = (double)bytes / best[0] / 1e9;
        s->gbps[0][b] = (double)bytes / best[1] / 1e9;
        s->gbps[1][b] = (double)bytes / best[2] / 1e9;
        if (turn) {
            s->turn_gbps[b] = 2.0 * (double)bytes / best[3] / 1e9;
            s->turn_ceiling_gbps[b] = 2.0 * (double)bytes / best[4] / 1e9;
            s->turn_overlap[b] = (best[1] + best[2]) / best[3];
        }
    }
    return 0;
}

static int make_pool(enum kvpool_kind kind, uint64_t block_bytes, const struct kvpool_gpu_ops *ops,
                     struct kvpool **out)
{
    char name[64];
    int rc = kvpool_make_name(name, sizeof name, (int)getpid(), kind, 0);
    if (rc)
        return rc;
    if (kind == KVPOOL_DEVICE_SHM) /* distinct from a kvmgr's own pools of this pid */
        strncat(name, "-bench", sizeof name - strlen(name) - 1);
    struct kvpool_config cfg = {
        kind, 0, kind == KVPOOL_DEVICE_CUDA ? NULL : name, block_bytes, MAX_BATCH, 256, 1, ops};
    return kvpool_create(&cfg, out);
}

static int side_cpu(struct side *s)
{
    struct kvpool *dev = NULL, *host = NULL;
    int rc = make_pool(KVPOOL_DEVICE_SHM, s->block_bytes, NULL, &dev);
    if (rc == 0)
        rc = make_pool(KVPOOL_HOST, s->block_bytes, NULL, &host);
    if (rc == 0)
        rc = run_batches(s, dev, host, kvpool_block(host, 0), kvpool_block(dev, 0), -1);
    kvpool_destroy(dev);
    kvpool_destroy(host);
    return rc;
}

/* cudaMalloc slab <-> pinned shared memory through kvpool_cuda_ops; RKV_ENODEV without a gpu */
static int side_gpu(struct side *s)
{
    if (rkv_gpu_count() <= 0)
        return RKV_ENODEV;
    const struct kvpool_gpu_ops *ops = kvpool_cuda_ops();
    struct kvpool *dev = NULL, *host = NULL;
    void *dbuf = NULL;
    uint8_t handle[RKV_GPU_IPC_BYTES];
    size_t run = (size_t)MAX_BATCH * s->block_bytes;
    int rc = make_pool(KVPOOL_DEVICE_CUDA, s->block_bytes, ops, &dev);
    if (rc == 0)
        rc = make_pool(KVPOOL_HOST, s->block_bytes, ops, &host);
    if (rc == 0)
        rc = rkv_gpu_alloc(0, run, &dbuf, handle);
    if (rc == 0) {
        memset(kvpool_block(host, 0), 1, run);
        rc = run_batches(s, dev, host, dbuf, kvpool_block(host, 0), 0);
    }
    if (dbuf)
        rkv_gpu_free(0, dbuf);
    kvpool_destroy(dev);
    kvpool_destroy(host);
    return rc;
}

static const char *ceiling_name(const struct side *s)
{
    return strcmp(s->name, "gpu") ? "memcpy between the pools" : "pinned h2d cudaMemcpy";
}

static cJSON *side_json(const struct side *s)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "block_bytes", (double)s->block_bytes);
    cJSON_AddStringToObject(j, "ceiling", ceiling_name(s));
    cJSON *rows = cJSON_AddArrayToObject(j, "rows");
    static const char *const dirs[2] = {"demote", "promote"};
    for (int dir = 0; dir < 2; dir++)
        for (size_t b = 0; b < N_BATCHES; b++) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "direction", dirs[dir]);
            cJSON_AddNumberToObject(r, "blocks", batches[b]);
            cJSON_AddNumberToObject(r, "bytes", (double)batches[b] * s->block_bytes);
            cJSON_AddNumberToObject(r, "gbps", s->gbps[dir][b]);
            cJSON_AddNumberToObject(r, "ceiling_gbps", s->ceiling_gbps[b]);
            cJSON_AddNumberToObject(r, "ratio", s->gbps[dir][b] / s->ceiling_gbps[b]);
            cJSON_AddItemToArray(rows, r);
        }
    cJSON *turns = cJSON_AddArrayToObject(j, "turnover");
    for (size_t b = 0; b < N_BATCHES; b++) {
        if (s->turn_gbps[b] <= 0)
            continue;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "blocks_each_way", batches[b]);
        cJSON_AddNumberToObject(r, "bytes", 2.0 * batches[b] * (double)s->block_bytes);
        cJSON_AddNumberToObject(r, "gbps", s->turn_gbps[b]);
        cJSON_AddNumberToObject(r, "ceiling_gbps", s->turn_ceiling_gbps[b]);
        cJSON_AddNumberToObject(r, "ratio", s->turn_gbps[b] / s->turn_ceiling_gbps[b]);
        cJSON_AddNumberToObject(r, "overlap", s->turn_overlap[b]);
        cJSON_AddItemToArray(turns, r);
    }
    return j;
}

static void side_print(const struct side *s)
{
    printf("%s: blocks of %.1f MiB, scattered; ceiling: %s of the same bytes\n", s->name,
           (double)s->block_bytes / (1 << 20), ceiling_name(s));
    printf("  %-7s %12s %12s %8s %12s %8s\n", "blocks", "ceiling GB/s", "demote GB/s", "ratio",
           "promote GB/s", "ratio");
    for (size_t b = 0; b < N_BATCHES; b++)
        printf("  %-7u %12.2f %12.2f %8.3f %12.2f %8.3f\n", batches[b], s->ceiling_gbps[b],
               s->gbps[0][b], s->gbps[0][b] / s->ceiling_gbps[b], s->gbps[1][b],
               s->gbps[1][b] / s->ceiling_gbps[b]);
    printf("  turnover: n blocks out and n in by one kvpool_run_copies; ceiling: the same plain "
           "copies %s; overlap: demote + promote time / turnover time\n",
           strcmp(s->name, "gpu") ? "one after the other" : "on the two copy lanes at once");
    printf("  %-7s %12s %12s %8s %8s\n", "each", "ceiling GB/s", "turn GB/s", "ratio", "overlap");
    for (size_t b = 0; b < N_BATCHES; b++)
        if (s->turn_gbps[b] > 0)
            printf("  %-7u %12.2f %12.2f %8.3f %8.2f\n", batches[b], s->turn_ceiling_gbps[b],
                   s->turn_gbps[b], s->turn_gbps[b] / s->turn_ceiling_gbps[b], s->turn_overlap[b]);
}

int bench_migrate(const struct bench_opts *o, cJSON *out)
{
    struct side cpu = {"cpu", o->quick ? 256 << 10 : 2 << 20, o->quick ? 0.01 : 0.2};
    int rc = side_cpu(&cpu);
    if (rc) {
        fprintf(stderr, "rkv-bench: migrate (cpu pools): %s\n", rkv_strerror(rc));
        return rc;
    }
    side_print(&cpu);
    cJSON_AddItemToObject(out, "cpu", side_json(&cpu));

    struct side gpu = {"gpu", o->quick ? 8 << 20 : 32 << 20, o->quick ? 0.01 : 0.2};
    rc = side_gpu(&gpu);
    if (rc == RKV_ENODEV) {
        printf("gpu: skipped (%s)\n", rkv_gpu_why());
        cJSON_AddStringToObject(out, "gpu_skipped", rkv_gpu_why());
        return 0;
    }
    if (rc) {
        fprintf(stderr, "rkv-bench: migrate (gpu pools): %s\n", rkv_strerror(rc));
        return rc;
    }
    side_print(&gpu);
    cJSON_AddItemToObject(out, "gpu", side_json(&gpu));
    return 0;
}
