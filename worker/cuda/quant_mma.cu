/* quant_mma.cu - matmuls of 9 to a few hundred tokens over block-type weights on tensor cores:
 * each 32-value unit of a 64-row weight tile dequantized once into shared memory as f16 and
 * met there by 64 tokens (mma.sync m16n8k16, f32 accumulate). */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/quant.cuh"

#define QM_ROWS  64 /* weight rows of a block: a warp 16 */
#define QM_TOK   64 /* tokens of a block: a warp's 8 mma columns, 8 times */
#define QM_WARPS 4
#define QM_KS    64 /* values of k a step: two units */
#define QM_PAD   8  /* halves past each shared row: the fragment loads miss each other's banks */

/* the f16 pair at p as the 32-bit register mma takes */
__device__ __forceinline__ uint32_t qm_pair(const __half *p)
{
    return *(const uint32_t *)p;
}

template <int T>
__global__ void __launch_bounds__(QM_WARPS * 32)
    quant_mma_kernel(const uint8_t *w, size_t row_bytes, const float *x, uint32_t n_in, float *y,
                     uint32_t n_out, const float *bias, uint32_t n)
{
    __shared__ __align__(16) __half ws[QM_ROWS][QM_KS + QM_PAD];
    __shared__ __align__(16) __half xs[QM_TOK][QM_KS + QM_PAD];
    const uint32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t g = lane >> 2, q = lane & 3; /* the fragments' group and its thread */
    const uint32_t row0 = blockIdx.x * QM_ROWS, tok0 = blockIdx.y * QM_TOK;
    float acc[QM_TOK / 8][4];
#pragma unroll
    for (int j = 0; j < QM_TOK / 8; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    for (uint32_t k0 = 0; k0 < n_in; k0 += QM_KS) {
        const uint32_t units = n_in - k0 >= QM_KS ? QM_KS / 32 : 1;
        /* the weight tile: a thread a (row, unit) pair, zeros past the last row */
        for (uint32_t i = tid; i < QM_ROWS * units; i += QM_WARPS * 32) {
            const uint32_t r = i / units, u = i % units;
            float v[32];
            if (row0 + r < n_out)
                dq32<T>(w + (size_t)(row0 + r) * row_bytes, k0 / 32 + u, v);
            else
#pragma unroll
                for (int k = 0; k < 32; k++)
                    v[k] = 0.0f;
            __half2 *o = (__half2 *)&ws[r][u * 32];
#pragma unroll
            for (int k = 0; k < 16; k++)
                o[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        }
        /* the activations: 64 tokens x the step's values, rounded to f16 */
        for (uint32_t i = tid; i < QM_TOK * units * 8; i += QM_WARPS * 32) {
            const uint32_t t = i / (units * 8), c4 = i % (units * 8);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (tok0 + t < n)
                v = *(const float4 *)(x + (size_t)(tok0 + t) * n_in + k0 + c4 * 4);
            __half2 *o = (__half2 *)&xs[t][c4 * 4];
            o[0] = __floats2half2_rn(v.x, v.y);
            o[1] = __floats2half2_rn(v.z, v.w);
        }
        __syncthreads();
        for (uint32_t kk = 0; kk < units * 32; kk += 16) {
            const uint32_t r = warp * 16 + g;
            uint32_t a0 = qm_pair(&ws[r][kk + 2 * q]), a1 = qm_pair(&ws[r + 8][kk + 2 * q]);
            uint32_t a2 = qm_pair(&ws[r][kk + 8 + 2 * q]), a3 = qm_pair(&ws[r + 8][kk + 8 + 2 * q]);
#pragma unroll
            for (int j = 0; j < QM_TOK / 8; j++) {
                uint32_t b0 = qm_pair(&xs[j * 8 + g][kk + 2 * q]);
                uint32_t b1 = qm_pair(&xs[j * 8 + g][kk + 8 + 2 * q]);
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                             : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            }
        }
        __syncthreads();
    }
    /* c0, c1: row g, tokens 2q, 2q + 1 of the n-tile; c2, c3: row g + 8 */
#pragma unroll
    for (int j = 0; j < QM_TOK / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint32_t r = row0 + warp * 16 + g + (e >= 2 ? 8 : 0);
            const uint32_t t = tok0 + j * 8 + 2 * q + (e & 1);
            if (r < n_out && t < n)
                y[(size_t)t * n_out + r] = acc[j][e] + (bias ? bias[r] : 0.0f);
        }
    }
}

struct qm_launch {
    template <int T>
    static void run(cudaStream_t st, const struct be_tensor *w, const float *in, float *out,
                    const float *bias, uint32_t n)
    {
        dim3 grid((w->rows + QM_ROWS - 1) / QM_ROWS, (n + QM_TOK - 1) / QM_TOK);
        quant_mma_kernel<T><<<grid, QM_WARPS * 32, 0, st>>>(
            (const uint8_t *)w->data, w->row_bytes, in, w->cols, out, w->rows, bias, n);
    }
};

int cuda_quant_mma(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                   const float *bias, uint32_t n)
{
    if (n == 0)
        return 0;
    if (w->cols % 32 || n > 65535 * QM_TOK)
        return RKV_EINVAL;
    if (quant_dispatch<qm_launch>((int)w->type, c->stream, w, in, out, bias, n))
        return RKV_EUNSUPPORTED;
    CU_LAUNCHED();
    return 0;
}
