/* pool.c - kv block pools in shared memory or behind the gpu hooks, and
 * batched copies between them. */
#include "kvmgr/pool.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/shm.h"

struct kvpool {
    struct kvpool_desc desc;
    struct rkv_shm shm;        /* shared memory pools */
    uint8_t *base;             /* block 0: shm mapping or device pointer */
    int owner;                 /* created here */
    size_t reg_chunk;          /* host pool pinned through gpu_ops in pieces of this many */
    size_t reg_bytes;          /* bytes pinned so far (0: none) */
    struct kvpool_gpu_ops ops; /* zero when none */
};

/* pins the host pool in pieces of whole blocks, about KVPOOL_PIN_CHUNK each. one
 * cudaHostRegister of 40 GiB faults in and pins every page while it holds the process's
 * memory map lock: any other thread that maps memory (malloc, nng) waits, and the queue
 * behind it stops every page fault of the process too: kvmgr answered nothing for 15 s and
 * rkvd's watchdog killed it. between pieces the other threads get the lock. a block never
 * spans two pieces, so each copy of a block stays within one registration. */
#define KVPOOL_PIN_CHUNK ((size_t)1 << 30)
static int host_pin(struct kvpool *p, size_t bytes, size_t chunk)
{
    size_t bb = p->desc.block_bytes ? p->desc.block_bytes : bytes;
    size_t per = (chunk ? chunk : KVPOOL_PIN_CHUNK) / bb;
    p->reg_chunk = (per ? per : 1) * bb;
    for (size_t off = 0; off < bytes; off += p->reg_chunk) {
        size_t n = bytes - off < p->reg_chunk ? bytes - off : p->reg_chunk;
        int rc = p->ops.host_register(p->ops.ctx, p->base + off, n);
        if (rc)
            return rc; /* kvpool_destroy unpins what was pinned */
        p->reg_bytes = off + n;
        sched_yield();
    }
    return 0;
}

int kvpool_make_name(char *buf, size_t len, int pid, enum kvpool_kind kind, uint32_t gpu)
{
    int n = kind == KVPOOL_HOST ? snprintf(buf, len, "/rkv-%d-host", pid)
                                : snprintf(buf, len, "/rkv-%d-dev%u", pid, gpu);
    return n > 0 && (size_t)n < len ? 0 : RKV_ERANGE;
}

int kvpool_reap_stale(uint32_t *n_removed)
{
    uint32_t n = 0;
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return -errno;
    struct dirent *e;
    while ((e = readdir(dir))) {
        int pid = 0, end = 0;
        unsigned gpu;
        /* "rkv-<pid>-host" or "rkv-<pid>-dev<gpu>", nothing else */
        if (!((sscanf(e->d_name, "rkv-%d-host%n", &pid, &end) == 1 && !e->d_name[end]) ||
              (sscanf(e->d_name, "rkv-%d-dev%u%n", &pid, &gpu, &end) == 2 && !e->d_name[end])))
            continue;
        if (pid <= 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) {
            log_info("removed %s, left by a kvmgr (pid %d) that is gone", name, pid);
            n++;
        }
    }
    closedir(dir);
    if (n_removed)
        *n_removed = n;
    return 0;
}

static size_t pool_bytes(const struct kvpool_desc *d)
{
    return (size_t)d->block_bytes * d->n_blocks;
}

static int check_layout(const struct kvpool_desc *d)
{
    uint64_t unit = (uint64_t)d->n_slices * d->block_tokens;
    if (d->kind > KVPOOL_DEVICE_CUDA || d->block_bytes == 0 || unit == 0 || d->block_bytes % unit) {
        log_error("kv pool: block of %llu bytes does not split into %u slices of %u positions;"
                  " check the model's kv sizes and --block-size",
                  (unsigned long long)d->block_bytes, d->n_slices, d->block_tokens);
        return RKV_EINVAL;
    }
    if (d->n_blocks && pool_bytes(d) / d->n_blocks != d->block_bytes)
        return RKV_ETOOBIG;
    return 0;
}

int kvpool_create(const struct kvpool_config *cfg, struct kvpool **out)
{
    *out = NULL;
    struct kvpool *p = calloc(1, sizeof(*p));
    if (!p)
        return RKV_ENOMEM;
    p->desc = (struct kvpool_desc){.kind = cfg->kind,
                                   .gpu = cfg->gpu,
                                   .block_bytes = cfg->block_bytes,
                                   .n_blocks = cfg->n_blocks,
                                   .block_tokens = cfg->block_tokens,
                                   .n_slices = cfg->n_slices};
    p->owner = 1;
    if (cfg->gpu_ops)
        p->ops = *cfg->gpu_ops;
    int rc = check_layout(&p->desc);
    size_t bytes = pool_bytes(&p->desc);
    if (rc == 0 && cfg->kind == KVPOOL_DEVICE_CUDA) {
        /* the hook point: cudaMalloc + cudaIpcGetMemHandle live with the gpu code */
        if (!p->ops.device_alloc) {
            log_error("kv pool: gpu %u needs the cuda backend; run with --backend cpu or a "
                      "build with CUDA=1",
                      cfg->gpu);
            rc = RKV_ENODEV;
        } else if (bytes) {
            void *dptr = NULL;
            rc = p->ops.device_alloc(p->ops.ctx, cfg->gpu, bytes, &dptr, p->desc.ipc_handle);
            p->base = dptr;
        }
    } else if (rc == 0 && bytes) {
        if (!cfg->name || snprintf(p->desc.name, sizeof(p->desc.name), "%s", cfg->name) >=
                              (int)sizeof(p->desc.name))
            rc = RKV_EINVAL;
        if (rc == 0)
            rc = rkv_shm_create(&p->shm, p->desc.name, bytes);
        if (rc == RKV_EINVAL)
            log_error("kv pool: name %s is not a shared memory name; use \"/rkv-...\" "
                      "(kvpool_make_name)",
                      cfg->name ? cfg->name : "(none)");
        else if (rc)
            log_error("kv pool %s: cannot create %zu bytes of shared memory: %s; check the "
                      "free space of /dev/shm and the host budget",
                      cfg->name, bytes, rkv_strerror(rc));
        p->base = p->shm.base;
        if (rc == 0 && cfg->kind == KVPOOL_HOST && p->ops.host_register)
            rc = host_pin(p, bytes, cfg->pin_chunk);
    }
    if (rc) {
        kvpool_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int kvpool_open(const struct kvpool_desc *desc, struct kvpool **out)
{
    *out = NULL;
    if (desc->kind == KVPOOL_DEVICE_CUDA)
        return RKV_EUNSUPPORTED; /* peers open ipc handles in the worker's cuda code */
    struct kvpool *p = calloc(1, sizeof(*p));
    if (!p)
        return RKV_ENOMEM;
    p->desc = *desc;
    p->desc.name[sizeof(p->desc.name) - 1] = 0;
    int rc = check_layout(&p->desc);
    if (rc == 0 && p->desc.n_blocks)
        rc = rkv_shm_open(&p->shm, p->desc.name, pool_bytes(&p->desc));
    if (rc) {
        free(p);
        return rc;
    }
    p->base = p->shm.base;
    *out = p;
    return 0;
}

void kvpool_destroy(struct kvpool *p)
{
    if (!p)
        return;
    if (p->reg_bytes && p->ops.host_unregister)
        for (size_t off = 0; off < p->reg_bytes; off += p->reg_chunk)
            p->ops.host_unregister(p->ops.ctx, p->base + off);
    if (p->desc.kind == KVPOOL_DEVICE_CUDA && p->owner && p->base && p->ops.device_free)
        p->ops.device_free(p->ops.ctx, p->desc.gpu, p->base);
    if (p->shm.base)
        rkv_shm_close(&p->shm);
    free(p);
}

const struct kvpool_desc *kvpool_get_desc(const struct kvpool *p)
{
    return &p->desc;
}

void *kvpool_block(const struct kvpool *p, uint32_t idx)
{
    if (p->desc.kind == KVPOOL_DEVICE_CUDA || idx >= p->desc.n_blocks)
        return NULL;
    return p->base + (size_t)idx * p->desc.block_bytes;
}

static int op_cmp(const void *a, const void *b)
{
    const struct kvpool_op *x = a, *y = b;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    return x->dst < y->dst ? -1 : x->dst > y->dst;
}

/* the pool whose gpu ops move between dst and src: the cuda device side, or NULL */
static const struct kvpool *cuda_side(const struct kvpool *dst, const struct kvpool *src)
{
    return dst->desc.kind == KVPOOL_DEVICE_CUDA   ? dst
           : src->desc.kind == KVPOOL_DEVICE_CUDA ? src
                                                  : NULL;
}

/* one run; queued on a lane where the ops can, else done now */
static int run_copy(struct kvpool *dst, const struct kvpool *src, size_t dst_off, size_t src_off,
                    size_t bytes)
{
    const struct kvpool *dev = cuda_side(dst, src);
    if (!dev) {
        memmove(dst->base + dst_off, src->base + src_off, bytes); /* d2d may overlap */
        return 0;
    }
    const struct kvpool_gpu_ops *ops = dst->ops.copy ? &dst->ops : &src->ops;
    if (ops->copy_async && ops->copy_wait) {
        int lane = dst->desc.kind != KVPOOL_DEVICE_CUDA   ? KVPOOL_LANE_D2H
                   : src->desc.kind != KVPOOL_DEVICE_CUDA ? KVPOOL_LANE_H2D
                                                          : KVPOOL_LANE_D2D;
        return ops->copy_async(ops->ctx, dev->desc.gpu, lane, dst->base + dst_off,
                               src->base + src_off, bytes);
    }
    if (!ops->copy)
        return RKV_ENODEV;
    return ops->copy(ops->ctx, dev->desc.gpu, dst->base + dst_off, src->base + src_off, bytes);
}

/* waits for the runs queued on pool p's gpu (a cuda device pool with async ops) */
static int pool_wait(const struct kvpool *p)
{
    if (!p || p->desc.kind != KVPOOL_DEVICE_CUDA || !p->ops.copy_async || !p->ops.copy_wait)
        return 0;
    return p->ops.copy_wait(p->ops.ctx, p->desc.gpu);
}

/* blocks a and b of p lie in one pinned piece (always, for an unpinned pool) */
static int same_piece(const struct kvpool *p, uint32_t a, uint32_t b)
{
    if (!p->reg_chunk)
        return 1;
    size_t per = p->reg_chunk / p->desc.block_bytes;
    return a / per == b / per;
}

static int copy_batch(struct kvpool *dst, const struct kvpool *src, const struct kvpool_op *ops,
                      size_t n)
{
    const struct kvpool_desc *d = &dst->desc, *s = &src->desc;
    if (d->block_bytes != s->block_bytes || d->block_tokens != s->block_tokens ||
        d->n_slices != s->n_slices)
        return RKV_EINVAL;
    for (size_t k = 0; k < n; k++)
        if (ops[k].src >= s->n_blocks || ops[k].dst >= d->n_blocks ||
            ops[k].n_tokens > s->block_tokens)
            return RKV_ERANGE;
    struct kvpool_op *sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (!sorted)
        return RKV_ENOMEM;
    memcpy(sorted, ops, n * sizeof(*ops));
    qsort(sorted, n, sizeof(*sorted), op_cmp);
    size_t bb = d->block_bytes, slice = bb / d->n_slices, tok = slice / d->block_tokens;
    int rc = 0;
    for (size_t k = 0; k < n && rc == 0;) {
        const struct kvpool_op *o = &sorted[k];
        if (o->n_tokens < s->block_tokens) {
            /* part of a block: the first positions of every slice */
            for (uint32_t sl = 0; sl < d->n_slices && rc == 0; sl++)
                rc = run_copy(dst, src, o->dst * bb + sl * slice, o->src * bb + sl * slice,
                              o->n_tokens * tok);
            k++;
            continue;
        }
        /* whole blocks: extend the run while both sides stay consecutive and
         * within one pinned piece of a host pool (host_pin) */
        size_t run = 1;
        while (k + run < n && sorted[k + run].n_tokens == s->block_tokens &&
               sorted[k + run].src == o->src + run && sorted[k + run].dst == o->dst + run &&
               same_piece(src, o->src, o->src + run) && same_piece(dst, o->dst, o->dst + run))
            run++;
        rc = run_copy(dst, src, (size_t)o->dst * bb, (size_t)o->src * bb, run * bb);
        k += run;
    }
    free(sorted);
    return rc;
}

int kvpool_copy(struct kvpool *dst, const struct kvpool *src, const struct kvpool_op *ops, size_t n)
{
    /* queued runs, one wait: the runs do not wait for each other */
    int rc = copy_batch(dst, src, ops, n);
    int wrc = pool_wait(cuda_side(dst, src));
    return rc ? rc : wrc;
}

static int copy_group_cmp(const void *a, const void *b)
{
    const struct kvb_copy *x = a, *y = b;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    return x->gpu < y->gpu ? -1 : x->gpu > y->gpu;
}

/* a block as one key: pool 0 the host pool, g + 1 gpu g's device pool */
static uint64_t blk_key(uint32_t pool, uint32_t idx)
{
    return (uint64_t)pool << 32 | idx;
}

static int key_cmp(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int key_in(const uint64_t *keys, size_t n, uint64_t k)
{
    return n && bsearch(&k, keys, n, sizeof(*keys), key_cmp) != NULL;
}

int kvpool_copies_start(struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
                        const struct kvb_copy *ops, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (ops[k].gpu >= n_gpus || ops[k].kind > KVB_COPY_D2D)
            return RKV_EINVAL;
    /* grouped by (kind, gpu): each group is one batched copy on one lane. A group's runs keep
     * their order on the lane; groups on other lanes (or gpus) do not, so a group that reads a
     * block an earlier group of the batch writes (a rehome stages device blocks through host
     * blocks), or writes one an earlier group reads or writes, waits for them first. rd and
     * wr hold the blocks the groups in flight read and write, sorted */
    struct kvb_copy *sorted = malloc((n ? n : 1) * sizeof(*sorted));
    struct kvpool_op *batch = malloc((n ? n : 1) * sizeof(*batch));
    uint64_t *rd = malloc((n ? n : 1) * sizeof(*rd)), *wr = malloc((n ? n : 1) * sizeof(*wr));
    size_t n_rd = 0, n_wr = 0;
    int rc = sorted && batch && rd && wr ? 0 : RKV_ENOMEM;
    if (rc == 0) {
        memcpy(sorted, ops, n * sizeof(*ops));
        qsort(sorted, n, sizeof(*sorted), copy_group_cmp);
    }
    for (size_t k = 0; k < n && rc == 0;) {
        const uint32_t kind = sorted[k].kind, gp = sorted[k].gpu + 1;
        const uint32_t src_pool = kind == KVB_COPY_H2D ? 0 : gp,
                       dst_pool = kind == KVB_COPY_D2H ? 0 : gp;
        size_t nb = 0;
        int hazard = 0;
        for (size_t j = k; j < n && copy_group_cmp(&sorted[j], &sorted[k]) == 0; j++, nb++) {
            batch[nb] = (struct kvpool_op){sorted[j].src, sorted[j].dst, sorted[j].n_tokens};
            const uint64_t s = blk_key(src_pool, sorted[j].src),
                           d = blk_key(dst_pool, sorted[j].dst);
            hazard |= key_in(wr, n_wr, s) || key_in(rd, n_rd, d) || key_in(wr, n_wr, d);
        }
        if (hazard) {
            if ((rc = kvpool_copies_wait(dev, n_gpus)) != 0)
                break;
            n_rd = n_wr = 0;
        }
        struct kvpool *g = dev[sorted[k].gpu];
        switch (kind) {
        case KVB_COPY_D2H: rc = copy_batch(host, g, batch, nb); break;
        case KVB_COPY_H2D: rc = copy_batch(g, host, batch, nb); break;
        case KVB_COPY_D2D: rc = copy_batch(g, g, batch, nb); break;
        }
        for (size_t j = 0; j < nb; j++) {
            rd[n_rd++] = blk_key(src_pool, batch[j].src);
            wr[n_wr++] = blk_key(dst_pool, batch[j].dst);
        }
        qsort(rd, n_rd, sizeof(*rd), key_cmp);
        qsort(wr, n_wr, sizeof(*wr), key_cmp);
        k += nb;
    }
    free(sorted);
    free(batch);
    free(rd);
    free(wr);
    return rc;
}

int kvpool_copies_wait(struct kvpool *const *dev, uint32_t n_gpus)
{
    int rc = 0;
    for (uint32_t g = 0; g < n_gpus; g++) {
        int e = pool_wait(dev[g]);
        if (e && !rc)
            rc = e;
    }
    return rc;
}

int kvpool_run_copies(struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
                      const struct kvb_copy *ops, size_t n)
{
    int rc = kvpool_copies_start(dev, n_gpus, host, ops, n);
    int wrc = kvpool_copies_wait(dev, n_gpus);
    return rc ? rc : wrc;
}
