/* quant.cuh - ggml's weight block formats on the device: 32 values of a row at a time, the same
 * bits as common/quant.c. */
#ifndef RKV_CUDA_QUANT_CUH
#define RKV_CUDA_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "common/quant.h"
}

/*
 * A row of a block type is units of 32 values (every block is 1 or 8 units). dq32<T>(row, u,
 * y) writes values [32u, 32u + 32) of the row: every product and difference one f32 operation
 * in common/quant.c's order (the __f*_rn intrinsics keep nvcc from fusing them), so a
 * dequantized weight is the CPU's bit for bit. Dot products over them are the kernels' own.
 */

template <int T> struct qfmt;
/* clang-format off */
template <> struct qfmt<QUANT_Q4_0> { static constexpr int values = 32, bytes = 18; };
template <> struct qfmt<QUANT_Q4_1> { static constexpr int values = 32, bytes = 20; };
template <> struct qfmt<QUANT_Q5_0> { static constexpr int values = 32, bytes = 22; };
template <> struct qfmt<QUANT_Q5_1> { static constexpr int values = 32, bytes = 24; };
template <> struct qfmt<QUANT_Q8_0> { static constexpr int values = 32, bytes = 34; };
template <> struct qfmt<QUANT_IQ4_NL> { static constexpr int values = 32, bytes = 18; };
template <> struct qfmt<QUANT_Q2_K> { static constexpr int values = 256, bytes = 84; };
template <> struct qfmt<QUANT_Q3_K> { static constexpr int values = 256, bytes = 110; };
template <> struct qfmt<QUANT_Q4_K> { static constexpr int values = 256, bytes = 144; };
template <> struct qfmt<QUANT_Q5_K> { static constexpr int values = 256, bytes = 176; };
template <> struct qfmt<QUANT_Q6_K> { static constexpr int values = 256, bytes = 210; };
template <> struct qfmt<QUANT_IQ4_XS> { static constexpr int values = 256, bytes = 136; };
/* clang-format on */

__device__ __forceinline__ float qd_f16(const uint8_t *p)
{
    return __half2float(__ushort_as_half((unsigned short)(p[0] | p[1] << 8)));
}

__device__ __forceinline__ float qd_iq4(int q)
{
    /* ggml's kvalues_iq4nl */
    const int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                           1,    13,   25,  38,  53,  69,  89,  113};
    return (float)kv[q & 15];
}

template <int T>
__device__ __forceinline__ void dq32(const uint8_t *row, uint32_t u, float (&y)[32])
{
    constexpr int V = qfmt<T>::values, B = qfmt<T>::bytes;
    const uint8_t *b = row + (size_t)(u * 32 / V) * B;
    const int s = (int)(u % (V / 32)); /* the unit within a 256-value block */
    if constexpr (T == QUANT_Q4_0 || T == QUANT_IQ4_NL) {
        float d = qd_f16(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int lo = b[2 + j] & 15, hi = b[2 + j] >> 4;
            y[j] = T == QUANT_Q4_0 ? __fmul_rn(d, (float)(lo - 8)) : __fmul_rn(d, qd_iq4(lo));
            y[j + 16] = T == QUANT_Q4_0 ? __fmul_rn(d, (float)(hi - 8)) : __fmul_rn(d, qd_iq4(hi));
        }
    } else if constexpr (T == QUANT_Q4_1) {
        float d = qd_f16(b), m = qd_f16(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            y[j] = __fadd_rn(__fmul_rn(d, (float)(b[4 + j] & 15)), m);
            y[j + 16] = __fadd_rn(__fmul_rn(d, (float)(b[4 + j] >> 4)), m);
        }
    } else if constexpr (T == QUANT_Q5_0 || T == QUANT_Q5_1) {
        constexpr int one = T == QUANT_Q5_1;
        float d = qd_f16(b), m = one ? qd_f16(b + 2) : 0.0f;
        const uint8_t *h = b + 2 + 2 * one, *qs = b + 6 + 2 * one;
        uint32_t qh =
            (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            if (one) {
                y[j] = __fadd_rn(__fmul_rn(d, (float)lo), m);
                y[j + 16] = __fadd_rn(__fmul_rn(d, (float)hi), m);
            } else {
                y[j] = __fmul_rn(d, (float)(lo - 16));
                y[j + 16] = __fmul_rn(d, (float)(hi - 16));
            }
        }
    } else if constexpr (T == QUANT_Q8_0) {
        float d = qd_f16(b);
#pragma unroll
        for (int j = 0; j < 32; j++)
            y[j] = __fmul_rn((float)(int8_t)b[2 + j], d);
    } else if constexpr (T == QUANT_Q2_K) {
        const uint8_t *sc = b, *qs = b + 16;
        float d = qd_f16(b + 80), dmin = qd_f16(b + 82);
#pragma unroll
        for (int k = 0; k < 32; k++) {
            int g = 2 * s + k / 16;
            float dl = __fmul_rn(d, (float)(sc[g] & 15)), ml = __fmul_rn(dmin, (float)(sc[g] >> 4));
            int q = (qs[(s / 4) * 32 + k] >> (2 * (s % 4))) & 3;
            y[k] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    } else if constexpr (T == QUANT_Q3_K) {
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        float d = qd_f16(b + 108);
#pragma unroll
        for (int k = 0; k < 32; k++) {
            int g = 2 * s + k / 16;
            int lo = g < 8 ? sc[g] & 15 : sc[g - 8] >> 4, hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
            float dl = __fmul_rn(d, (float)((lo | hi << 4) - 32));
            int ql = (qs[(s / 4) * 32 + k] >> (2 * (s % 4))) & 3, bit = (hm[k] >> s) & 1;
            y[k] = __fmul_rn(dl, (float)(ql - ((bit ^ 1) << 2)));
        }
    } else if constexpr (T == QUANT_Q4_K || T == QUANT_Q5_K) {
        constexpr int five = T == QUANT_Q5_K;
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + 16 + 32 * five;
        float d = qd_f16(b), dmin = qd_f16(b + 2);
        int scale, min;
        if (s < 4) {
            scale = sc[s] & 63;
            min = sc[s + 4] & 63;
        } else {
            scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
            min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
        }
        float dl = __fmul_rn(d, (float)scale), ml = __fmul_rn(dmin, (float)min);
#pragma unroll
        for (int k = 0; k < 32; k++) {
            int q = (qs[(s / 2) * 32 + k] >> (4 * (s % 2))) & 15;
            if (five)
                q |= ((qh[k] >> s) & 1) << 4;
            y[k] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    } else if constexpr (T == QUANT_Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = qd_f16(b + 208);
        const int h = s / 4, r0 = (s % 4) * 32;
#pragma unroll
        for (int k = 0; k < 32; k++) {
            int r = r0 + k;
            int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 15;
            int hi = (qh[h * 32 + k] >> (2 * (s % 4))) & 3;
            float dl = __fmul_rn(d, (float)sc[2 * s + k / 16]);
            y[k] = __fmul_rn(dl, (float)((lo | hi << 4) - 32));
        }
    } else if constexpr (T == QUANT_IQ4_XS) {
        float d = qd_f16(b);
        int sh = b[2] | b[3] << 8;
        int lo = (b[4 + s / 2] >> (4 * (s % 2))) & 15, hi = (sh >> (2 * s)) & 3;
        float dl = __fmul_rn(d, (float)((lo | hi << 4) - 32));
        const uint8_t *qs = b + 8 + s * 16;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            y[k] = __fmul_rn(dl, qd_iq4(qs[k] & 15));
            y[k + 16] = __fmul_rn(dl, qd_iq4(qs[k] >> 4));
        }
    }
}

/* calls F::template run<T>(args...) for the block type t; 1 when t is not one */
template <typename F, typename... A> __host__ int quant_dispatch(int t, A... a)
{
    switch (t) {
    case QUANT_Q4_0: F::template run<QUANT_Q4_0>(a...); return 0;
    case QUANT_Q4_1: F::template run<QUANT_Q4_1>(a...); return 0;
    case QUANT_Q5_0: F::template run<QUANT_Q5_0>(a...); return 0;
    case QUANT_Q5_1: F::template run<QUANT_Q5_1>(a...); return 0;
    case QUANT_Q8_0: F::template run<QUANT_Q8_0>(a...); return 0;
    case QUANT_Q2_K: F::template run<QUANT_Q2_K>(a...); return 0;
    case QUANT_Q3_K: F::template run<QUANT_Q3_K>(a...); return 0;
    case QUANT_Q4_K: F::template run<QUANT_Q4_K>(a...); return 0;
    case QUANT_Q5_K: F::template run<QUANT_Q5_K>(a...); return 0;
    case QUANT_Q6_K: F::template run<QUANT_Q6_K>(a...); return 0;
    case QUANT_IQ4_NL: F::template run<QUANT_IQ4_NL>(a...); return 0;
    case QUANT_IQ4_XS: F::template run<QUANT_IQ4_XS>(a...); return 0;
    }
    return 1;
}

/* one value of a block-type row (embedding rows, odd shapes): its unit dequantized */
__device__ __forceinline__ float quant_value(int type, const uint8_t *row, uint32_t i)
{
    float y[32];
    switch (type) {
    case QUANT_Q4_0: dq32<QUANT_Q4_0>(row, i / 32, y); break;
    case QUANT_Q4_1: dq32<QUANT_Q4_1>(row, i / 32, y); break;
    case QUANT_Q5_0: dq32<QUANT_Q5_0>(row, i / 32, y); break;
    case QUANT_Q5_1: dq32<QUANT_Q5_1>(row, i / 32, y); break;
    case QUANT_Q8_0: dq32<QUANT_Q8_0>(row, i / 32, y); break;
    case QUANT_Q2_K: dq32<QUANT_Q2_K>(row, i / 32, y); break;
    case QUANT_Q3_K: dq32<QUANT_Q3_K>(row, i / 32, y); break;
    case QUANT_Q4_K: dq32<QUANT_Q4_K>(row, i / 32, y); break;
    case QUANT_Q5_K: dq32<QUANT_Q5_K>(row, i / 32, y); break;
    case QUANT_Q6_K: dq32<QUANT_Q6_K>(row, i / 32, y); break;
    case QUANT_IQ4_NL: dq32<QUANT_IQ4_NL>(row, i / 32, y); break;
    case QUANT_IQ4_XS: dq32<QUANT_IQ4_XS>(row, i / 32, y); break;
    default: return 0.0f;
    }
    return y[i % 32];
}

struct cuda_ctx;
struct be_tensor;

/* out (n, rows) = in (n, cols) . w^T + bias for a block-type w and n <= 8: a warp a row, the
 * lanes over its 32-value units, each dequantized in registers */
int cuda_quant_gemv(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                    const float *bias, uint32_t n);
/* the same by integer dots over the activations rounded to 8 bits as the cpu backend's are
 * (quant_dot.cu): 1 when the type or shape is not one it takes */
int cuda_quant_dot(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                   const float *bias, uint32_t n);
/* the same for 9 to a few hundred tokens: 64-row weight tiles dequantized once into shared
 * memory as f16 for 64 tokens at a time on tensor cores (activations rounded to f16) */
int cuda_quant_mma(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                   const float *bias, uint32_t n);
/* out (n, rows) = in (n, cols) . w^T + bias for a block-type w (not Q8_0, which matmul.cu
 * runs) and more than the decode kernel's tokens: the kernel for the count (batch, prefill) */
int cuda_matmul_quant(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                      const float *bias, uint32_t n);
/* rows [r0, r1) of a block-type w as f16, (r1 - r0, cols) at dst */
int cuda_quant_to_f16(struct cuda_ctx *c, __half *dst, const struct be_tensor *w, uint32_t r0,
                      uint32_t r1);

#endif
