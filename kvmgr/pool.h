/* pool.h - kv memory: fixed-size block pools in named shared memory that
 * workers map, a cuda hook point for device pools, batched block copies. */
#ifndef RKV_KVMGR_POOL_H
#define RKV_KVMGR_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvmgr/blocks.h"

/*
 * A pool is n_blocks blocks of block_bytes. The host pool (and, on the cpu
 * backend, each "device" pool) is POSIX shared memory named "/rkv-...": the
 * kvmgr creates it, a worker maps the same bytes by name (common/shm.h,
 * rkv_shm_open) and a restarted worker maps it again. On a gpu the device
 * pool is allocated through struct kvpool_gpu_ops (cudaMalloc +
 * cudaIpcGetMemHandle), and the host pool is registered for dma through it;
 * this module calls those hooks and contains no cuda code.
 *
 * Block layout: a block holds block_tokens positions in n_slices equal runs,
 * each position-major (position 0's bytes first). Copying the first n
 * positions of a block copies the first n/block_tokens of every run
 * (copy-on-write of a split block). For the worker's layout (worker/kv.h: per
 * layer a K then a V slice, each (n_kv_head, block_size, head_dim)) the runs
 * are the heads: n_slices = 2 * part_layers * n_kv_head. Whole-block copies do
 * not depend on it.
 */

enum kvpool_kind {
    KVPOOL_HOST = 0,    /* shared memory, pinned through gpu_ops when given */
    KVPOOL_DEVICE_SHM,  /* cpu backend: the device pool is shared memory too */
    KVPOOL_DEVICE_CUDA, /* device memory through gpu_ops */
};

#define KVPOOL_IPC_BYTES 64 /* sizeof(cudaIpcMemHandle_t) */

/* the gpu issue's functions; ctx is passed back unchanged. Return 0 or a
 * negative rkv code (RKV_ECUDA). */
struct kvpool_gpu_ops {
    void *ctx;
    int (*device_alloc)(void *ctx, uint32_t gpu, size_t bytes, void **dptr,
                        uint8_t ipc_handle[KVPOOL_IPC_BYTES]);
    void (*device_free)(void *ctx, uint32_t gpu, void *dptr);
    int (*host_register)(void *ctx, void *base, size_t bytes);
    void (*host_unregister)(void *ctx, void *base);
    /* one contiguous run; either side may be device memory of gpu */
    int (*copy)(void *ctx, uint32_t gpu, void *dst, const void *src, size_t bytes);
    /* optional: the same run queued on a lane of gpu (enum kvpool_lane), done by copy_wait
     * (which waits for every lane of gpu and answers a failed copy). Runs of one lane keep
     * their order; runs of different lanes may overlap (a copy engine each way) */
    int (*copy_async)(void *ctx, uint32_t gpu, int lane, void *dst, const void *src, size_t bytes);
    int (*copy_wait)(void *ctx, uint32_t gpu);
};

enum kvpool_lane { KVPOOL_LANE_D2H, KVPOOL_LANE_H2D, KVPOOL_LANE_D2D };

/* the cuda hook point (kvmgr/pool_gpu.c over common/gpu.h, which loads the cuda
 * runtime at run time): device_alloc = cudaSetDevice + cudaMalloc +
 * cudaIpcGetMemHandle, host_register = cudaHostRegister(portable, mapped),
 * copy = cudaMemcpy, copy_async = cudaMemcpyAsync on a stream per lane. kvmgr/main.c passes it in
 * kvpool_config when the pools are cuda ones; the calls fail with RKV_ENODEV where there is no gpu.
 */
const struct kvpool_gpu_ops *kvpool_cuda_ops(void);

struct kvpool_config {
    enum kvpool_kind kind;
    uint32_t gpu;         /* device pools */
    const char *name;     /* "/rkv-..." for shared memory pools (kvpool_make_name) */
    uint64_t block_bytes; /* a multiple of n_slices * block_tokens */
    uint32_t n_blocks;    /* 0: an empty pool, nothing mapped */
    uint32_t block_tokens;
    uint32_t n_slices;                    /* equal runs of a block (above); 1 = one opaque run */
    const struct kvpool_gpu_ops *gpu_ops; /* NULL on the cpu backend */
    size_t pin_chunk; /* a host pool is pinned in pieces of about this many bytes (whole
                         blocks); 0 = 1 GiB */
};

/* what a peer needs to map the pool; crosses processes as plain bytes */
struct kvpool_desc {
    uint32_t kind; /* enum kvpool_kind */
    uint32_t gpu;
    char name[64]; /* shared memory name, "" for cuda device pools */
    uint64_t block_bytes;
    uint32_t n_blocks;
    uint32_t block_tokens;
    uint32_t n_slices;
    uint8_t ipc_handle[KVPOOL_IPC_BYTES]; /* cuda device pools */
};

/* one block copy: the first n_tokens positions (block_tokens = whole) */
struct kvpool_op {
    uint32_t src;
    uint32_t dst;
    uint32_t n_tokens;
};

struct kvpool;

/* "/rkv-<pid>-host" or "/rkv-<pid>-dev<gpu>"; 0 or RKV_ERANGE */
int kvpool_make_name(char *buf, size_t len, int pid, enum kvpool_kind kind, uint32_t gpu);

/* removes pools in /dev/shm that a kvmgr which no longer runs left behind
 * (killed before it could clean up); *n_removed may be NULL */
int kvpool_reap_stale(uint32_t *n_removed);
/* creates the pool (the name is replaced if a dead kvmgr left it) */
int kvpool_create(const struct kvpool_config *cfg, struct kvpool **out);
/* maps a pool another process created (what a worker does; used by tests) */
int kvpool_open(const struct kvpool_desc *desc, struct kvpool **out);
/* unmaps; the creator also removes the name and frees device memory */
void kvpool_destroy(struct kvpool *p);

const struct kvpool_desc *kvpool_get_desc(const struct kvpool *p);
/* address of block idx in this process; NULL for cuda device pools or idx out of range */
void *kvpool_block(const struct kvpool *p, uint32_t idx);

/* copies blocks src -> dst (same block size and layout), batched: runs of
 * consecutive source and destination blocks move in one copy. Done on return. */
int kvpool_copy(struct kvpool *dst, const struct kvpool *src, const struct kvpool_op *ops,
                size_t n);
/* executes copies returned by kvb_demote / kvb_promote / kvb_session_fork;
 * dev[gpu] are the device pools, host the host pool. Done on return. */
int kvpool_run_copies(struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
                      const struct kvb_copy *ops, size_t n);
/* kvpool_run_copies in two halves: _start queues the copies (on a gpu, device -> host,
 * host -> device and device -> device on lanes of their own, so the directions overlap and
 * no run waits for the one before; a group of copies that reads or writes a block an
 * earlier group of the same call writes, or writes one it reads, waits for it first);
 * _wait waits for everything queued on dev[0..n_gpus). Shared memory pools copy at once.
 * After a failed _start some copies may be queued: call _wait before freeing any
 * destination. Copies of separate calls are not ordered until a _wait. */
int kvpool_copies_start(struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
                        const struct kvb_copy *ops, size_t n);
int kvpool_copies_wait(struct kvpool *const *dev, uint32_t n_gpus);

#endif
