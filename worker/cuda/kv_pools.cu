/* kv_pools.cu - the kv pools as the gpu sees them: device memory, mapped host memory, and the
 * device pool's tensor map for decode attention. */
#include <string.h>

#include "worker/cuda/cuda_ops.cuh"

void cuda_pools_unregister(struct cuda_ctx *c)
{
    for (int r = 0; r < KV_N_POOLS; r++) {
        if (c->registered[r])
            cudaHostUnregister(c->registered[r]);
        c->registered[r] = NULL;
        c->pool[r] = NULL;
        c->n_blocks[r] = 0;
    }
}

/* a device-visible address for a pool: device memory as is, host memory
 * registered mapped (zero-copy reads by the attention kernel) */
static int map_pool(struct cuda_ctx *c, int r, void *base, size_t bytes)
{
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, base) != cudaSuccess) {
        cudaGetLastError();
        at.type = cudaMemoryTypeUnregistered;
    }
    if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) {
        c->pool[r] = (char *)base;
        return 0;
    }
    if (at.type == cudaMemoryTypeUnregistered) {
        cudaError_t e =
            cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
        if (e != cudaSuccess) {
            log_error("cuda: cannot register the %s kv pool (%zu bytes at %p) with the gpu: %s; "
                      "check the memlock limit (ulimit -l)",
                      r == KV_HOST ? "host" : "device", bytes, base, cudaGetErrorString(e));
            cudaGetLastError();
            return RKV_ECUDA;
        }
        c->registered[r] = base;
    }
    void *dptr = NULL;
    CU_TRY(cudaHostGetDevicePointer(&dptr, base, 0));
    c->pool[r] = (char *)dptr;
    if (r == KV_DEVICE)
        log_warn("cuda: the device kv pool is host memory; device blocks are read over PCIe");
    return 0;
}

/* cuTensorMapEncodeTiled (cuda.h's signature), reached through cudart's driver entry point so
 * the worker links no libcuda */
typedef CUresult (*tmap_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                   const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                   const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* the driver's encoder, looked up once; NULL when the driver has none */
static tmap_encode_fn tmap_encoder(void)
{
    static const tmap_encode_fn fn = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            f = NULL;
        }
        return (tmap_encode_fn)f;
    }();
    return fn;
}

/* the device pool as a tensor map for decode attention (cuda_ctx.kv_tmap): dims (64 columns,
 * head_dim / 64 halves, rows of head_dim f16), boxes of 64 rows of one half. Off (kv_tma 0)
 * when the layout is not f16 with head_dim 64 or 128 and blocks of whole 64-key chunks, the
 * pool is not device memory or has too many rows, or the driver refuses */
static void kv_tmap_encode(struct cuda_ctx *c, const struct kv_layout *l)
{
    c->kv_tma = 0;
    const uint32_t D = l->head_dim;
    const size_t row = (size_t)D * 2, bytes = (size_t)c->n_blocks[KV_DEVICE] * kv_block_bytes(l);
    if (!c->pool[KV_DEVICE] || l->dtype != KV_F16 || (D != 64 && D != 128) || l->block_size % 64 ||
        kv_block_bytes(l) % row || bytes / row > INT32_MAX)
        return;
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, c->pool[KV_DEVICE]) != cudaSuccess ||
        pa.type != cudaMemoryTypeDevice) {
        cudaGetLastError();
        return;
    }
    const tmap_encode_fn fn = tmap_encoder();
    if (!fn) {
        log_warn("cuda: the driver has no cuTensorMapEncodeTiled; decode attention loads keys "
                 "with cp.async");
        return;
    }
    alignas(64) CUtensorMap tm;
    const cuuint64_t dim[3] = {64, D / 64, bytes / row}, stride[2] = {128, row};
    const cuuint32_t box[3] = {64, 1, 64}, one[3] = {1, 1, 1};
    CUresult r = fn(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, c->pool[KV_DEVICE], dim, stride, box,
                    one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        log_warn("cuda: cuTensorMapEncodeTiled refused the kv pool (error %d); decode attention "
                 "loads keys with cp.async",
                 (int)r);
        return;
    }
    memcpy(c->kv_tmap, &tm, sizeof(tm));
    c->kv_tma = 1;
}

int cu_set_kv(void *ctx, const struct kv_layout *l, const struct kv_pools *p)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    CU_TRY(cudaStreamSynchronize(c->stream));
    CU_TRY(cudaStreamSynchronize(c->side));
    cuda_graph_drop(c); /* it reads the old pools */
    if (l->n_parts != 1) {
        /* its kernels address a layer at a fixed offset of one block a position block */
        log_error("cuda: a kv layout of %u blocks a position block (local layers' kv dropped "
                  "outside their window) is read by the cpu backend only: use --backend cpu, "
                  "or one block a position block",
                  l->n_parts);
        return RKV_EUNSUPPORTED;
    }
    uint32_t hd = l->head_dim;
    if (hd < 8 || hd > 256 || (hd & (hd - 1))) {
        log_error("cuda: head_dim %u is not supported by the cuda attention (8, 16, 32, 64, 128, "
                  "256); use --backend cpu",
                  hd);
        return RKV_EUNSUPPORTED;
    }
    if ((unsigned)l->dtype >= KV_N_DTYPES) {
        log_error("cuda: kv dtype %d is not one of " KV_DTYPE_NAMES, (int)l->dtype);
        return RKV_EUNSUPPORTED;
    }
    cuda_pools_unregister(c);
    c->have_kv = 0;
    c->meta.valid = 0;
    c->layout = *l;
    for (int r = 0; r < KV_N_POOLS; r++) {
        if (!p->base[r] || p->n_blocks[r] == 0)
            continue;
        int rc = map_pool(c, r, p->base[r], (size_t)p->n_blocks[r] * kv_block_bytes(l));
        if (rc < 0) {
            cuda_pools_unregister(c);
            return rc;
        }
        c->n_blocks[r] = p->n_blocks[r];
    }
    c->host_base = (char *)p->base[KV_HOST];
    c->stage.stg_valid[0] = c->stage.stg_valid[1] = 0;
    if (c->host_base && c->n_blocks[KV_HOST])
        cuda_host_read_choose(c);
    kv_tmap_encode(c, l);
    c->have_kv = 1;
    return 0;
}
