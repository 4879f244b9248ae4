/* quant_gemv.cu - decode matmuls (n <= 8 tokens) over block-type weights: a warp a row, each lane
 * dequantizing 32-value units in registers as it reads them. */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/gemv.cuh"
#include "worker/cuda/quant.cuh"

#define QG_WARPS 8

/* y (n, n_out) = x (n, n_in) . w^T + bias; lane l takes units l, l + 32, ... of its row, so
 * neighbouring lanes read neighbouring bytes */
template <int T, int NT>
__global__ void __launch_bounds__(QG_WARPS * 32)
    quant_gemv_kernel(const uint8_t *w, size_t row_bytes, const float *x, uint32_t n_in, float *y,
                      uint32_t n_out, const float *bias, uint32_t n)
{
    const uint32_t row = blockIdx.x * QG_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_out)
        return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (uint32_t u = lane; u < n_in / 32; u += 32) {
        float v[32], s[NT];
        dq32<T>(wr, u, v);
        gemv_dot32<NT>(s, v, x, n_in, (size_t)u * 32, n);
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[t] += s[t];
    }
    gemv_store<NT>(acc, y, n_out, row, bias, n, lane);
}

struct qg_launch {
    template <int T>
    static void run(cudaStream_t st, const struct be_tensor *w, const float *in, float *out,
                    const float *bias, uint32_t n, uint32_t nt)
    {
        dim3 grid((w->rows + QG_WARPS - 1) / QG_WARPS), block(QG_WARPS * 32);
        const uint8_t *wp = (const uint8_t *)w->data;
        gemv_nt(nt, [&](auto k) {
            quant_gemv_kernel<T, decltype(k)::value>
                <<<grid, block, 0, st>>>(wp, w->row_bytes, in, w->cols, out, w->rows, bias, n);
        });
    }
};

int cuda_quant_gemv(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                    const float *bias, uint32_t n)
{
    if (n == 0)
        return 0;
    if (n > 8 || w->cols % 32)
        return RKV_EINVAL;
    int rc = c->tune.qdot ? cuda_quant_dot(c, out, in, w, bias, n) : 1;
    if (rc != 1)
        return rc;
    /* token counts rounded up to 1, 2, 4, 8 instantiations (deterministic: always 8) */
    const uint32_t nt = c->deterministic ? 8 : n;
    if (quant_dispatch<qg_launch>((int)w->type, c->stream, w, in, out, bias, n, nt))
        return RKV_EUNSUPPORTED;
    CU_LAUNCHED();
    return 0;
}
