/* kv8.cuh - the 8-bit kv rows (q8, fp8) on the gpu: the rounding of worker/kv.c step for step,
 * so a row the gpu writes has the bytes the cpu writes, and the reads' f32 values. */
#pragma once

#include "worker/cuda/cuda_ctx.cuh"

/* kv_f32_to_e4m3: nearest even, saturating at 448, NaN 0x7f */
__device__ __forceinline__ uint8_t kv8_e4m3(float x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (isnan(a))
        return 0x7f;
    if (a >= 448.0f)
        return sign | 0x7e;
    if (a < 0x1p-6f)
        return sign | (uint8_t)rintf(a * 512.0f);
    int e;
    frexpf(a, &e);
    int q = (int)rintf(ldexpf(a, 4 - e));
    if (q == 16) {
        q = 8;
        e++;
    }
    const int code = ((e - 1 + 7) << 3) | (q - 8);
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

/* e4m3 times s: its bits shifted into an f16 are the value times 2^-8, exactly (kv_e4m3_to_f32
 * for every code rkv writes) */
__device__ __forceinline__ float kv8_fp8_value(uint8_t b, float s)
{
    const unsigned short h = (unsigned short)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
    return __half2float(__ushort_as_half(h)) * 256.0f * s;
}

__device__ __forceinline__ float kv8_bf16(const char *p)
{
    const uint32_t bits = *(const uint16_t *)p;
    return __uint_as_float(bits << 16);
}

/* row (h, pos) of a slice: D levels, then the row's scales (worker/kv.h) */
__device__ __forceinline__ uint8_t *kv8_row(char *slice, uint32_t B, uint32_t row_bytes, uint32_t h,
                                            uint32_t pos)
{
    return (uint8_t *)slice + ((size_t)h * B + pos) * row_bytes;
}

/* bytes of a row's scales: a bf16 per 32 values (q8), one f32 (fp8) */
__host__ __device__ __forceinline__ uint32_t kv8_scale_bytes(int dt, uint32_t D)
{
    return dt == KV_Q8 ? 2 * ((D + 31) / 32) : 4;
}

/* one warp quantizes row x (D values) into levels lv and scales sc (kv_q8_quantize,
 * kv_fp8_quantize): max |x| over each group (q8) or the row (fp8) by shuffles, then every
 * division one IEEE operation */
template <int DT>
__device__ __forceinline__ void kv8_store_row(const float *x, uint32_t D, uint8_t *lv, char *sc,
                                              uint32_t lane)
{
    if constexpr (DT == KV_Q8) {
        for (uint32_t g0 = 0; g0 < D; g0 += 32) {
            const bool in = g0 + lane < D;
            const float xv = in ? x[g0 + lane] : 0.0f;
            float am = fmaxf(0.0f, fabsf(xv)); /* a NaN passed over, as the cpu's max */
            for (int o = 16; o > 0; o >>= 1)
                am = fmaxf(am, __shfl_xor_sync(0xffffffff, am, o));
            const __nv_bfloat16 db = __float2bfloat16_rn(__fdiv_rn(am, 127.0f));
            const float df = __bfloat162float(db);
            if (in) {
                float r = df == 0.0f ? 0.0f : rintf(__fdiv_rn(xv, df));
                if (r != r)
                    r = 0.0f; /* a NaN is stored as 0 */
                lv[g0 + lane] = (uint8_t)(int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
            }
            if (lane == 0)
                *(__nv_bfloat16 *)(sc + g0 / 32 * 2) = db;
        }
    } else {
        float am = 0.0f;
        for (uint32_t i = lane; i < D; i += 32)
            am = fmaxf(am, fabsf(x[i]));
        for (int o = 16; o > 0; o >>= 1)
            am = fmaxf(am, __shfl_xor_sync(0xffffffff, am, o));
        const float s = __fdiv_rn(am, 448.0f);
        for (uint32_t i = lane; i < D; i += 32) {
            const float v = s == 0.0f ? 0.0f : __fdiv_rn(x[i], s);
            lv[i] = v != v ? 0 : kv8_e4m3(v); /* a NaN is stored as 0 */
        }
        if (lane == 0)
            *(float *)sc = s;
    }
}
