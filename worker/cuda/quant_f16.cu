/* quant_f16.cu - rows of block-type weights dequantized to f16 for the tensor-core gemms of
 * prefill, a block of threads a run of the weight blocks staged in shared memory. */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/quant.cuh"

#define QF_THREADS 256
#define QF_UNITS   2 /* 32-value units a thread */

/* rows [r0, r1) of a block-type matrix are one array of blocks, and their f16 rows the same
 * values in the same order: a block of threads copies its share of the blocks into shared
 * memory (16-byte loads where the share is aligned), then each thread dequantizes its units
 * from there and stores them 16 bytes at a time */
template <int T>
__global__ void __launch_bounds__(QF_THREADS)
    quant_f16_kernel(__half *dst, const uint8_t *w, uint64_t n_blocks)
{
    constexpr int V = qfmt<T>::values, B = qfmt<T>::bytes;
    constexpr int NB = QF_THREADS * QF_UNITS * 32 / V; /* blocks a thread block */
    __shared__ __align__(16) uint8_t sm[NB * B];
    const uint64_t b0 = (uint64_t)blockIdx.x * NB;
    const uint32_t nb = (uint32_t)(n_blocks - b0 < NB ? n_blocks - b0 : NB);
    const uint8_t *src = w + b0 * B;
    const uint32_t bytes = nb * B;
    if ((((uintptr_t)src | bytes) & 15) == 0) {
        for (uint32_t i = threadIdx.x; i < bytes / 16; i += QF_THREADS)
            ((uint4 *)sm)[i] = __ldcs((const uint4 *)src + i);
    } else {
        for (uint32_t i = threadIdx.x; i < bytes / 2; i += QF_THREADS) /* blocks are 2-aligned */
            ((uint16_t *)sm)[i] = __ldcs((const unsigned short *)src + i);
    }
    __syncthreads();
    const uint32_t units = nb * (V / 32);
    for (uint32_t u = threadIdx.x; u < units; u += QF_THREADS) {
        float v[32];
        dq32<T>(sm + (u / (V / 32)) * B, u % (V / 32), v);
        uint4 *o = (uint4 *)(dst + (b0 * V + (uint64_t)u * 32));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            __half2 h[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                h[j] = __floats2half2_rn(v[8 * k + 2 * j], v[8 * k + 2 * j + 1]);
            o[k] = *(const uint4 *)h;
        }
    }
}

struct qf_launch {
    template <int T>
    static void run(cudaStream_t st, __half *dst, const struct be_tensor *w, uint32_t r0,
                    uint32_t r1)
    {
        constexpr int V = qfmt<T>::values, NB = QF_THREADS * QF_UNITS * 32 / V;
        const uint64_t n_blocks = (uint64_t)(r1 - r0) * (w->cols / V);
        const unsigned grid = (unsigned)((n_blocks + NB - 1) / NB);
        quant_f16_kernel<T><<<grid, QF_THREADS, 0, st>>>(
            dst, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, n_blocks);
    }
};

int cuda_quant_to_f16(struct cuda_ctx *c, __half *dst, const struct be_tensor *w, uint32_t r0,
                      uint32_t r1)
{
    if (r1 <= r0)
        return 0;
    if (w->cols % quant_block_values((uint32_t)w->type) || r1 > w->rows)
        return RKV_EINVAL;
    if (quant_dispatch<qf_launch>((int)w->type, c->stream, dst, w, r0, r1))
        return RKV_EUNSUPPORTED;
    CU_LAUNCHED();
    return 0;
}
