/* pool_gpu.c - struct kvpool_gpu_ops over common/gpu.h: cuda device pools and pinned host pools. */
#include "common/gpu.h"
#include "kvmgr/pool.h"

/* KVPOOL_IPC_BYTES and RKV_GPU_IPC_BYTES are both sizeof(cudaIpcMemHandle_t) */
_Static_assert(KVPOOL_IPC_BYTES == RKV_GPU_IPC_BYTES, "ipc handle sizes differ");

static int dev_alloc(void *ctx, uint32_t gpu, size_t bytes, void **dptr,
                     uint8_t ipc_handle[KVPOOL_IPC_BYTES])
{
    (void)ctx;
    return rkv_gpu_alloc(gpu, bytes, dptr, ipc_handle);
}

static void dev_free(void *ctx, uint32_t gpu, void *dptr)
{
    (void)ctx;
    rkv_gpu_free(gpu, dptr);
}

static int host_register(void *ctx, void *base, size_t bytes)
{
    (void)ctx;
    return rkv_gpu_host_register(base, bytes);
}

static void host_unregister(void *ctx, void *base)
{
    (void)ctx;
    rkv_gpu_host_unregister(base);
}

static int copy(void *ctx, uint32_t gpu, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    return rkv_gpu_copy(gpu, dst, src, bytes);
}

_Static_assert((int)KVPOOL_LANE_D2H == (int)RKV_GPU_LANE_D2H &&
                   (int)KVPOOL_LANE_H2D == (int)RKV_GPU_LANE_H2D &&
                   (int)KVPOOL_LANE_D2D == (int)RKV_GPU_LANE_D2D,
               "copy lanes differ");

static int copy_async(void *ctx, uint32_t gpu, int lane, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    return rkv_gpu_copy_async(gpu, lane, dst, src, bytes);
}

static int copy_wait(void *ctx, uint32_t gpu)
{
    (void)ctx;
    return rkv_gpu_copy_wait(gpu);
}

const struct kvpool_gpu_ops *kvpool_cuda_ops(void)
{
    static const struct kvpool_gpu_ops ops = {
        NULL, dev_alloc, dev_free, host_register, host_unregister, copy, copy_async, copy_wait};
    return &ops;
}
