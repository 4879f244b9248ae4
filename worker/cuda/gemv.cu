/* gemv.cu - decode matmuls (n <= 8 tokens): one warp per output row, weights read once at HBM
 * speed. */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/gemv.cuh"
#include "worker/cuda/quant.cuh"

#define GEMV_WARPS  8
#define GEMV_UNROLL 4

/* acc[t] += the VEC weights f . x[t][i..i+VEC) for the first n tokens */
template <int VEC, int NT>
__device__ __forceinline__ void gemv_fma(float (&acc)[NT], const float *f, const float *x,
                                         uint32_t n_in, uint32_t i, uint32_t n)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < (int)n) {
            const float4 *xv = (const float4 *)(x + (size_t)t * n_in + i);
#pragma unroll
            for (int v = 0; v < VEC / 4; v++) {
                float4 xx = xv[v];
                acc[t] += f[4 * v] * xx.x + f[4 * v + 1] * xx.y + f[4 * v + 2] * xx.z +
                          f[4 * v + 3] * xx.w;
            }
        }
    }
}

// y (n, n_out) = x (n, n_in) . w^T + bias; w (n_out, n_in) of W, n_in % VEC == 0
template <typename W, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const W *w, const float *x, uint32_t n_in, float *y, uint32_t n_out,
                const float *bias, uint32_t n)
{
    constexpr int VEC = 16 / sizeof(W);
    uint32_t row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_out)
        return;
    const W *wr = w + (size_t)row * n_in;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    const uint32_t step = 32 * VEC;
    uint32_t i = lane * VEC;
    /* GEMV_UNROLL loads in flight per lane before the first use */
    for (; i + (GEMV_UNROLL - 1) * step < n_in; i += GEMV_UNROLL * step) {
        uint4 u[GEMV_UNROLL];
#pragma unroll
        for (int k = 0; k < GEMV_UNROLL; k++)
            u[k] = __ldcs((const uint4 *)(wr + i + k * step));
#pragma unroll
        for (int k = 0; k < GEMV_UNROLL; k++) {
            float f[VEC];
            cuda_unpack16(u[k], wr, f);
            gemv_fma<VEC, NT>(acc, f, x, n_in, i + k * step, n);
        }
    }
    for (; i < n_in; i += step) {
        float f[VEC];
        cuda_unpack16(*(const uint4 *)(wr + i), wr, f);
        gemv_fma<VEC, NT>(acc, f, x, n_in, i, n);
    }
    gemv_store<NT>(acc, y, n_out, row, bias, n, lane);
}

// q8_0 rows: lane takes whole 32-value blocks
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_q8_0_kernel(const uint8_t *w, size_t row_bytes, const float *x, uint32_t n_in, float *y,
                     uint32_t n_out, const float *bias, uint32_t n)
{
    uint32_t row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_out)
        return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (uint32_t b = lane; b < n_in / 32; b += 32) {
        const unsigned short *blk = (const unsigned short *)(wr + (size_t)b * 34);
        unsigned short hw[17];
#pragma unroll
        for (int k = 0; k < 17; k++)
            hw[k] = blk[k];
        float d = __half2float(__ushort_as_half(hw[0]));
        float q[32], s[NT];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            q[2 * k] = (float)(int8_t)(hw[1 + k] & 0xff);
            q[2 * k + 1] = (float)(int8_t)(hw[1 + k] >> 8);
        }
        gemv_dot32<NT>(s, q, x, n_in, (size_t)b * 32, n);
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[t] += d * s[t];
    }
    gemv_store<NT>(acc, y, n_out, row, bias, n, lane);
}

// any type, any n_in: the slow path for odd shapes
__global__ void gemv_generic_kernel(const char *w, size_t row_bytes, int type, const float *x,
                                    uint32_t n_in, float *y, uint32_t n_out, const float *bias,
                                    uint32_t n)
{
    uint32_t row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_out)
        return;
    const char *wr = w + (size_t)row * row_bytes;
    for (uint32_t t = 0; t < n; t++) {
        float s = 0.0f;
        for (uint32_t i = lane; i < n_in; i += 32)
            s += cuda_row_value(type, wr, i) * x[(size_t)t * n_in + i];
        s = gemv_warp_sum(s);
        if (lane == 0)
            y[(size_t)t * n_out + row] = s + (bias ? bias[row] : 0.0f);
    }
}

template <typename W>
static void gemv_typed(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                       const float *bias, uint32_t n)
{
    dim3 grid((w->rows + GEMV_WARPS - 1) / GEMV_WARPS);
    const W *wp = (const W *)w->data;
    /* deterministic: always the 8-token instantiation */
    gemv_nt(c->deterministic ? 8 : n, [&](auto nt) {
        gemv_kernel<W, decltype(nt)::value>
            <<<grid, GEMV_WARPS * 32, 0, c->stream>>>(wp, in, w->cols, out, w->rows, bias, n);
    });
}

int cuda_gemv(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
              const float *bias, uint32_t n)
{
    if (n == 0)
        return 0;
    dim3 grid((w->rows + GEMV_WARPS - 1) / GEMV_WARPS);
    if (w->type != BE_Q8_0 && w->cols % 8) {
        gemv_generic_kernel<<<grid, GEMV_WARPS * 32, 0, c->stream>>>(
            (const char *)w->data, w->row_bytes, (int)w->type, in, w->cols, out, w->rows, bias, n);
        CU_LAUNCHED();
        return 0;
    }
    switch (w->type) {
    case BE_F32: gemv_typed<float>(c, out, in, w, bias, n); break;
    case BE_F16: gemv_typed<__half>(c, out, in, w, bias, n); break;
    case BE_BF16: gemv_typed<__nv_bfloat16>(c, out, in, w, bias, n); break;
    case BE_Q8_0: {
        int rc = c->tune.qdot ? cuda_quant_dot(c, out, in, w, bias, n) : 1;
        if (rc != 1)
            return rc;
        const uint8_t *wp = (const uint8_t *)w->data;
        gemv_nt(c->deterministic ? 8 : n, [&](auto nt) {
            gemv_q8_0_kernel<decltype(nt)::value><<<grid, GEMV_WARPS * 32, 0, c->stream>>>(
                wp, w->row_bytes, in, w->cols, out, w->rows, bias, n);
        });
        break;
    }
    default: return cuda_quant_gemv(c, out, in, w, bias, n); /* the other block formats */
    }
    CU_LAUNCHED();
    return 0;
}
