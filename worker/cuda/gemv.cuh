/* gemv.cuh - what the decode matmul kernels share: a warp's sums for up to 8 tokens of a row. */
#pragma once

#include <stdint.h>
#include <type_traits>

__device__ __forceinline__ float gemv_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

/* s[t] = v[0..32) . x[t][col, col + 32) for the first n tokens (x rows of n_in floats) */
template <int NT>
__device__ __forceinline__ void gemv_dot32(float (&s)[NT], const float (&v)[32], const float *x,
                                           uint32_t n_in, size_t col, uint32_t n)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        s[t] = 0.0f;
        if (t < (int)n) {
            const float4 *xv = (const float4 *)(x + (size_t)t * n_in + col);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float4 xx = xv[k];
                s[t] += v[4 * k] * xx.x + v[4 * k + 1] * xx.y + v[4 * k + 2] * xx.z +
                        v[4 * k + 3] * xx.w;
            }
        }
    }
}

/* y[t][row] = the warp's sum of acc[t] (+ bias[row]) for the first n tokens */
template <int NT>
__device__ __forceinline__ void gemv_store(const float (&acc)[NT], float *y, uint32_t n_out,
                                           uint32_t row, const float *bias, uint32_t n,
                                           uint32_t lane)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < (int)n) {
            float s = gemv_warp_sum(acc[t]);
            if (lane == 0)
                y[(size_t)t * n_out + row] = s + (bias ? bias[row] : 0.0f);
        }
    }
}

/* launch(std::integral_constant<int, NT>) for NT the token count rounded up to 1, 2, 4 or 8:
 * the instantiations the decode kernels keep */
template <typename L> void gemv_nt(uint32_t nt, L launch)
{
    if (nt == 1)
        launch(std::integral_constant<int, 1>());
    else if (nt == 2)
        launch(std::integral_constant<int, 2>());
    else if (nt <= 4)
        launch(std::integral_constant<int, 4>());
    else
        launch(std::integral_constant<int, 8>());
}
