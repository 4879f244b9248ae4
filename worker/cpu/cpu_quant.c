/* cpu_quant.c - quantized weights on the cpu: 8-bit activations, integer dots, dequantization. */
#include "worker/cpu/cpu_quant.h"

#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "common/quant.h"
#include "worker/cpu/cpu_ops.h"

/* every float product and sum below is one f32 operation: a fused multiply-add would round once
 * where the reference (common/quant.c, and the scalar dot products) rounds twice */
#pragma GCC optimize("fp-contract=off")

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q_AVX2 1
#endif
#if defined(Q_AVX2) && defined(__x86_64__) && defined(__GNUC__)
/* the avx-512 kernels, picked at run time: the build targets x86-64-v3 */
#define Q_512 1
#define T512Q __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")))
#endif

#define QX_SUM 16 /* activations a sum of the activation row covers */

/* --- isa, switch -------------------------------------------------------------------------- */

int cpu_q_isa_ok(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_SCALAR: return 1;
#ifdef Q_AVX2
    case CPU_ISA_AVX2: return 1;
#endif
#ifdef Q_512
    case CPU_ISA_AVX512: {
        static int have = -1;
        if (have < 0)
            have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        return have;
    }
#endif
    default: return 0;
    }
}

enum cpu_isa cpu_q_isa(void)
{
    if (cpu_ops_avx512() && cpu_q_isa_ok(CPU_ISA_AVX512))
        return CPU_ISA_AVX512;
    return cpu_q_isa_ok(CPU_ISA_AVX2) ? CPU_ISA_AVX2 : CPU_ISA_SCALAR;
}

static int g_exact;

void cpu_q_use_exact(int mode)
{
    g_exact = mode;
}

int cpu_q_int(enum be_type t, uint32_t n_tok)
{
    if (g_exact == 2)
        return n_tok <= 8 && quant_is_block((uint32_t)t) && t != BE_Q2_K && t != BE_Q3_K;
    return !g_exact && quant_is_block((uint32_t)t);
}

/* --- the activation row ----------------------------------------------------------------- */

/* an activation row of n values: q (n) int8, then d (n / blk) f32 scales, then s (n / 16) int16
 * sums of 16 q; blk is 256 for the 256-value weight types, else 32 */
struct qx {
    const int8_t *q;
    const float *d;
    const int16_t *s;
};

static uint32_t qx_blk(enum be_type t)
{
    return quant_block_values((uint32_t)t) == QUANT_QK_K ? QUANT_QK_K : QUANT_QK;
}

size_t cpu_qx_row_bytes(enum be_type t, uint32_t n)
{
    size_t b = (size_t)n + 4 * (n / qx_blk(t)) + 2 * (n / QX_SUM);
    return (b + 63) & ~(size_t)63;
}

static struct qx qx_view(const void *row, uint32_t n, uint32_t blk)
{
    const uint8_t *r = row;
    return (struct qx){(const int8_t *)r, (const float *)(r + n),
                       (const int16_t *)(r + n + 4 * (n / blk))};
}

/* a block's 1 / step: 0 where the block is all zero (or its step underflows) */
static float qx_inv_step(float amax)
{
    const float id = 127.0f / amax;
    return amax > 0.0f && id <= 3.4e38f ? id : 0.0f;
}

/* x * id to the nearest integer (half to even), clamped to [-127, 127] (NaN: -127) */
static int8_t qx_round(float v)
{
    if (!(v >= -127.0f))
        v = -127.0f;
    if (v > 127.0f)
        v = 127.0f;
    return (int8_t)(int)nearbyintf(v);
}

static void qx_quantize_scalar(const float *x, uint32_t n, uint32_t blk, uint8_t *row)
{
    int8_t *q = (int8_t *)row;
    float *d = (float *)(row + n);
    int16_t *s = (int16_t *)(row + n + 4 * (n / blk));
    for (uint32_t b = 0; b < n / blk; b++) {
        const float *xb = x + (size_t)b * blk;
        float amax = 0.0f;
        for (uint32_t i = 0; i < blk; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax; /* NaN is passed over */
        }
        const float id = qx_inv_step(amax);
        d[b] = amax / 127.0f;
        for (uint32_t i = 0; i < blk; i++)
            q[(size_t)b * blk + i] = qx_round(xb[i] * id);
    }
    for (uint32_t g = 0; g < n / QX_SUM; g++) {
        int sum = 0;
        for (int i = 0; i < QX_SUM; i++)
            sum += q[g * QX_SUM + i];
        s[g] = (int16_t)sum;
    }
}

#ifdef Q_AVX2
static inline int32_t hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* the same rounding as qx_quantize_scalar, eight lanes at a time: the same bytes */
static void qx_quantize_avx2(const float *x, uint32_t n, uint32_t blk, uint8_t *row)
{
    int8_t *q = (int8_t *)row;
    float *d = (float *)(row + n);
    int16_t *s = (int16_t *)(row + n + 4 * (n / blk));
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f),
                 hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (uint32_t b = 0; b < n / blk; b++) {
        const float *xb = x + (size_t)b * blk;
        __m256 mx = _mm256_setzero_ps();
        for (uint32_t i = 0; i < blk; i += 8) /* a NaN lane keeps mx (max_ps' second operand) */
            mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)), mx);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4), id = qx_inv_step(amax);
        d[b] = amax / 127.0f;
        const __m256 iv = _mm256_set1_ps(id);
        for (uint32_t i = 0; i < blk; i += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) { /* max_ps(NaN, lo) is lo, as qx_round */
                __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), iv);
                t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
                v[k] = _mm256_cvtps_epi32(t);
            }
            const __m256i r =
                _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            const __m256i qv = _mm256_permutevar8x32_epi32(r, order);
            _mm256_storeu_si256((__m256i *)(q + (size_t)b * blk + i), qv);
            /* the two sums of 16: sums of 4 in eight lanes, then of lanes 0-3 and 4-7 */
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qv),
                                          _mm256_set1_epi16(1));
            p = _mm256_hadd_epi32(p, p);
            p = _mm256_hadd_epi32(p, p);
            const size_t g = ((size_t)b * blk + i) / QX_SUM;
            s[g] = (int16_t)_mm256_cvtsi256_si32(p);
            s[g + 1] = (int16_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(p, 1));
        }
    }
}
#endif

void cpu_qx_quantize(enum be_type t, const float *x, uint32_t n, void *row, enum cpu_isa isa)
{
#ifdef Q_AVX2
    if (isa != CPU_ISA_SCALAR) {
        qx_quantize_avx2(x, n, qx_blk(t), row);
        return;
    }
#endif
    qx_quantize_scalar(x, n, qx_blk(t), row);
}

/* --- the scalar reference: exact integer sums, the float part in the contract's order --- */

static const int8_t g_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

static inline float h2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef Q_AVX2
    return _cvtsh_ss(h); /* inline; the same value as quant_f16_to_f32 */
#else
    return quant_f16_to_f32(h);
#endif
}

/* bytes a block (common/quant.c's table), a constant where t is one: the kernels' strides */
static inline uint32_t blk_bytes(enum be_type t)
{
    switch (t) {
    case BE_Q4_0:
    case BE_IQ4_NL: return 18;
    case BE_Q4_1: return 20;
    case BE_Q5_0: return 22;
    case BE_Q5_1: return 24;
    case BE_Q8_0: return 34;
    case BE_Q2_K: return 84;
    case BE_Q3_K: return 110;
    case BE_Q4_K: return 144;
    case BE_Q5_K: return 176;
    case BE_Q6_K: return 210;
    case BE_IQ4_XS: return 136;
    default: return (uint32_t)quant_row_bytes((uint32_t)t, quant_block_values((uint32_t)t));
    }
}

/* value i of a 32-value block is d * level (+ m for Q4_1 and Q5_1) */
static int level32(enum be_type t, const uint8_t *b, int i)
{
    const int nib = i / 16 * 4;
    switch (t) {
    case BE_Q4_0: return ((b[2 + i % 16] >> nib) & 0xf) - 8;
    case BE_Q4_1: return (b[4 + i % 16] >> nib) & 0xf;
    case BE_Q5_0:
    case BE_Q5_1: {
        const int one = t == BE_Q5_1;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * one, 4);
        const int u = ((b[6 + 2 * one + i % 16] >> nib) & 0xf) | (int)((qh >> i) & 1) << 4;
        return one ? u : u - 16;
    }
    case BE_Q8_0: return (int8_t)b[2 + i];
    case BE_IQ4_NL: return g_kvalues[(b[2 + i % 16] >> nib) & 0xf];
    default: return 0;
    }
}

static int has_min32(enum be_type t)
{
    return t == BE_Q4_1 || t == BE_Q5_1;
}

/* the four partial sums' end: (l0 + l2) + (l1 + l3) */
static inline float fin4_scalar(const float a[4])
{
    return (a[0] + a[2]) + (a[1] + a[3]);
}

static float dot32_scalar(enum be_type t, const uint8_t *w, struct qx x, uint32_t nb)
{
    const uint32_t bytes = blk_bytes(t);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint32_t b = 0; b < (nb + 3) / 4 * 4; b++) {
        float term = 0.0f; /* a group's missing blocks add +0, as the SIMD lanes do */
        if (b < nb) {
            const uint8_t *blk = w + (size_t)b * bytes;
            const int8_t *q = x.q + (size_t)b * QUANT_QK;
            int32_t isum = 0;
            for (int i = 0; i < QUANT_QK; i++)
                isum += level32(t, blk, i) * q[i];
            const float dx = x.d[b];
            term = (h2f(blk) * dx) * (float)isum;
            if (has_min32(t))
                term = term + (h2f(blk + 2) * dx) * (float)(x.s[2 * b] + x.s[2 * b + 1]);
        }
        acc[b % 4] = acc[b % 4] + term;
    }
    return fin4_scalar(acc);
}

/* a super-block's float part, the same in every isa (dmin 0 and imin 0 for the types without
 * mins: t - 0 is t) */
static inline float kfin(float sumf, float d, float dmin, float dx, int32_t isum, int32_t imin)
{
    float t = (d * dx) * (float)isum;
    t = t - (dmin * dx) * (float)imin;
    return sumf + t;
}

/* a Q4_K / Q5_K sub-block's 6-bit scale and min (common/quant.c's k_scale_min) */
static inline void k_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0xf) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

/* Q3_K's 16 6-bit scales, less 32 */
static inline void q3k_scales(const uint8_t *s, int16_t sc[16])
{
    for (int g = 0; g < 16; g++) {
        const int lo = g < 8 ? s[g] & 0xf : s[g - 8] >> 4;
        const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = (int16_t)((lo | hi << 4) - 32);
    }
}

/* IQ4_XS's 8 6-bit scales, less 32 */
static inline void iq4xs_scales(const uint8_t *b, int16_t sc[8])
{
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    for (int j = 0; j < 8; j++) {
        const int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 0xf, hi = (sh >> (2 * j)) & 3;
        sc[j] = (int16_t)((lo | hi << 4) - 32);
    }
}

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q4_K / Q5_K's scales and mins as bytes sc[0..7], m[0..7] of four 32-bit words (k_scales in
 * word operations, as ggml does it) */
static inline void k_scales_words(const uint8_t *s, uint32_t u[4])
{
    const uint32_t a = ld32(s), b = ld32(s + 4), c = ld32(s + 8);
    u[0] = a & 0x3f3f3f3f;
    u[1] = (c & 0x0f0f0f0f) | (((a >> 6) & 0x03030303) << 4);
    u[2] = b & 0x3f3f3f3f;
    u[3] = ((c >> 4) & 0x0f0f0f0f) | (((b >> 6) & 0x03030303) << 4);
}

/* Q3_K's 16 6-bit scales (before their -32) as the bytes of four words (q3k_scales in word
 * operations) */
static inline void q3k_scales_words(const uint8_t *s, uint32_t u[4])
{
    const uint32_t a = ld32(s), b = ld32(s + 4), c = ld32(s + 8);
    u[0] = (a & 0x0f0f0f0f) | ((c & 0x03030303) << 4);
    u[1] = (b & 0x0f0f0f0f) | (((c >> 2) & 0x03030303) << 4);
    u[2] = ((a >> 4) & 0x0f0f0f0f) | (((c >> 4) & 0x03030303) << 4);
    u[3] = ((b >> 4) & 0x0f0f0f0f) | (((c >> 6) & 0x03030303) << 4);
}

/* the unsigned level of value e of a 256-value block, before its offset (Q3_K: level - 4 is
 * the weight's, Q6_K: level - 32); IQ4_XS: the signed table value */
static int level256(enum be_type t, const uint8_t *b, int e)
{
    const int half = e / 128, sh = (e / 32) % 4, l = e % 32;
    switch (t) {
    case BE_Q2_K: return (b[16 + half * 32 + l] >> (2 * sh)) & 3;
    case BE_Q3_K: return ((b[32 + half * 32 + l] >> (2 * sh)) & 3) | ((b[l] >> (e / 32)) & 1) << 2;
    case BE_Q4_K: return (b[16 + (e / 64) * 32 + l] >> (4 * ((e / 32) % 2))) & 0xf;
    case BE_Q5_K:
        return ((b[48 + (e / 64) * 32 + l] >> (4 * ((e / 32) % 2))) & 0xf) |
               ((b[16 + l] >> (e / 32)) & 1) << 4;
    case BE_Q6_K: {
        const int r = e % 128;
        const int lo = (b[half * 64 + r % 64] >> (4 * (r / 64))) & 0xf;
        const int hi = (b[128 + half * 32 + r % 32] >> (2 * (r / 32))) & 3;
        return lo | hi << 4;
    }
    case BE_IQ4_XS:
        return g_kvalues[(b[8 + (e / 32) * 16 + e % 16] >> (4 * ((e % 32) / 16))) & 0xf];
    default: return 0;
    }
}

static float dot256_scalar(enum be_type t, const uint8_t *w, struct qx x, uint32_t nb)
{
    const uint32_t bytes = blk_bytes(t);
    float sumf = 0.0f;
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * bytes;
        const int8_t *q = x.q + (size_t)i * QUANT_QK_K;
        const int16_t *bs = x.s + (size_t)i * 16;
        int32_t sub[16]; /* sum of level x q over each 16 values */
        for (int g = 0; g < 16; g++) {
            sub[g] = 0;
            for (int k = 0; k < 16; k++)
                sub[g] += level256(t, b, g * 16 + k) * q[g * 16 + k];
        }
        int32_t isum = 0, imin = 0;
        float d = 0.0f, dmin = 0.0f;
        switch (t) {
        case BE_Q2_K:
            for (int g = 0; g < 16; g++) {
                isum += (b[g] & 0xf) * sub[g];
                imin += (b[g] >> 4) * bs[g];
            }
            d = h2f(b + 80), dmin = h2f(b + 82);
            break;
        case BE_Q3_K: {
            int16_t sc[16];
            q3k_scales(b + 96, sc);
            for (int g = 0; g < 16; g++)
                isum += sc[g] * (sub[g] - 4 * bs[g]);
            d = h2f(b + 108);
            break;
        }
        case BE_Q4_K:
        case BE_Q5_K: {
            uint8_t sc[8], m[8];
            k_scales(b + 4, sc, m);
            for (int j = 0; j < 8; j++) {
                isum += sc[j] * (sub[2 * j] + sub[2 * j + 1]);
                imin += m[j] * (bs[2 * j] + bs[2 * j + 1]);
            }
            d = h2f(b), dmin = h2f(b + 2);
            break;
        }
        case BE_Q6_K:
            for (int g = 0; g < 16; g++)
                isum += (int8_t)b[192 + g] * (sub[g] - 32 * bs[g]);
            d = h2f(b + 208);
            break;
        case BE_IQ4_XS: {
            int16_t sc[8];
            iq4xs_scales(b, sc);
            for (int j = 0; j < 8; j++)
                isum += sc[j] * (sub[2 * j] + sub[2 * j + 1]);
            d = h2f(b);
            break;
        }
        default: break;
        }
        sumf = kfin(sumf, d, dmin, x.d[i], isum, imin);
    }
    return sumf;
}

/* --- avx2 -------------------------------------------------------------------------------- */

/* activation rows a kernel takes at once: a weight row's levels and scales are unpacked once for
 * them, and each row's sums run as the one-row kernel's (the same bits) */
#define QN 4

/* an isa's row drivers, the same for each: the 32-value types in groups of four blocks (the
 * last few on their own), every type's kernel by type, QN activation rows at once or
 * fewer one at a time */
#define Q_DRIVERS(ISA, ATTR)                                                                       \
    static inline __attribute__((always_inline))                                                   \
    ATTR void dot32_##ISA(const uint8_t *w, const struct qx *x, uint32_t nb, float *out,           \
                          const enum be_type t, const int nt)                                      \
    {                                                                                              \
        const uint32_t bytes = blk_bytes(t);                                                       \
        __m128 acc[QN];                                                                            \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) acc[j] = _mm_setzero_ps();            \
        uint32_t b0 = 0;                                                                           \
        for (; b0 + 4 <= nb; b0 += 4)                                                              \
            group32_##ISA(t, w + (size_t)b0 * bytes, xg_at(x, nt, b0), acc, nt);                   \
        if (b0 < nb)                                                                               \
            tail32(t, w + (size_t)b0 * bytes, xg_at(x, nt, b0), (int)(nb - b0), acc, nt);          \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) out[j] = fin4(acc[j]);                \
    }                                                                                              \
    static inline __attribute__((always_inline)) ATTR void dotn_##ISA##_of(                        \
        enum be_type t, const void *w, const struct qx *x, uint32_t n, float *out, const int nt)   \
    {                                                                                              \
        const uint32_t nb = n / QUANT_QK, nk = n / QUANT_QK_K;                                     \
        switch (t) {                                                                               \
        case BE_Q4_0: dot32_##ISA(w, x, nb, out, BE_Q4_0, nt); break;                              \
        case BE_Q4_1: dot32_##ISA(w, x, nb, out, BE_Q4_1, nt); break;                              \
        case BE_Q5_0: dot32_##ISA(w, x, nb, out, BE_Q5_0, nt); break;                              \
        case BE_Q5_1: dot32_##ISA(w, x, nb, out, BE_Q5_1, nt); break;                              \
        case BE_Q8_0: dot32_##ISA(w, x, nb, out, BE_Q8_0, nt); break;                              \
        case BE_IQ4_NL: dot32_##ISA(w, x, nb, out, BE_IQ4_NL, nt); break;                          \
        case BE_Q2_K: dot_q2k_##ISA(w, x, nk, out, nt); break;                                     \
        case BE_Q3_K: dot_q3k_##ISA(w, x, nk, out, nt); break;                                     \
        case BE_Q4_K: dot_q45k_##ISA(w, x, nk, out, 0, nt); break;                                 \
        case BE_Q5_K: dot_q45k_##ISA(w, x, nk, out, 1, nt); break;                                 \
        case BE_Q6_K: dot_q6k_##ISA(w, x, nk, out, nt); break;                                     \
        case BE_IQ4_XS: dot_iq4xs_##ISA(w, x, nk, out, nt); break;                                 \
        default: break;                                                                            \
        }                                                                                          \
    }                                                                                              \
    static ATTR void dotn_##ISA(enum be_type t, const void *w, const struct qx *x, uint32_t n,     \
                                float *out, int nt)                                                \
    {                                                                                              \
        if (nt == QN)                                                                              \
            dotn_##ISA##_of(t, w, x, n, out, QN);                                                  \
        else                                                                                       \
            for (int j = 0; j < nt; j++)                                                           \
                dotn_##ISA##_of(t, w, x + j, n, out + j, 1);                                       \
    }

#ifdef Q_AVX2
/* 16 bytes of nibbles -> 32 bytes: the low nibbles (values 0-15), then the high (16-31) */
static inline __m256i nib32(const uint8_t *p)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes, 0xff where the bit is set */
static inline __m256i bits32(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

static inline __m256i kvalues256(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)g_kvalues));
}

/* eight int32 lanes of sums of u * q (u unsigned and at most 128, so no pair saturates) */
static inline __m256i sum_u8(__m256i u, __m256i q)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
}

/* four vectors of eight int32 lanes -> their four sums */
static inline __m128i hsum4_i32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

static inline short ld16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return (short)h;
}

/* the weight side of four 32-value blocks at b (bytes apart): their f16 scales (and mins) */
struct w4 {
    __m128 d, m;
};

static inline __attribute__((always_inline)) struct w4 w4_of(const uint8_t *b, uint32_t bytes,
                                                             const int min)
{
    struct w4 r;
    r.d = _mm_cvtph_ps(_mm_setr_epi16(ld16(b), ld16(b + bytes), ld16(b + 2 * bytes),
                                      ld16(b + 3 * bytes), 0, 0, 0, 0));
    r.m =
        min ? _mm_cvtph_ps(_mm_setr_epi16(ld16(b + 2), ld16(b + bytes + 2), ld16(b + 2 * bytes + 2),
                                          ld16(b + 3 * bytes + 2), 0, 0, 0, 0))
            : _mm_setzero_ps();
    return r;
}

/* the float part of four blocks for one activation row: (dw * dx) * isum [+ (m * dx) * sum], as
 * dot32_scalar */
static inline __attribute__((always_inline)) __m128 term4(struct w4 w, __m128 dxv, __m128i isum,
                                                          __m128i sum, const int min)
{
    __m128 t = _mm_mul_ps(_mm_mul_ps(w.d, dxv), _mm_cvtepi32_ps(isum));
    if (min)
        t = _mm_add_ps(t, _mm_mul_ps(_mm_mul_ps(w.m, dxv), _mm_cvtepi32_ps(sum)));
    return t;
}

static inline float fin4(__m128 acc)
{
    acc = _mm_add_ps(acc, _mm_movehl_ps(acc, acc)); /* l0 + l2, l1 + l3 */
    return _mm_cvtss_f32(_mm_add_ss(acc, _mm_shuffle_ps(acc, acc, 0x55)));
}

/* the offset the levels of t carry in a kernel (level - off is the weight's), as a shift */
static inline int off_shift(enum be_type t, int vnni)
{
    switch (t) {
    case BE_Q4_0: return 3;
    case BE_Q5_0: return 4;
    case BE_Q8_0:
    case BE_IQ4_NL: return vnni ? 7 : 0; /* avx2 sums them signed */
    default: return 0;
    }
}

static inline int signed32(enum be_type t)
{
    return t == BE_Q8_0 || t == BE_IQ4_NL;
}

/* one activation row's part of a group of four blocks: the blocks' exact sums isum less the
 * levels' offset (s: the activations' sums of 32), then their float terms into acc (every isa) */
static inline __attribute__((always_inline)) __m128 group_acc(const enum be_type t, const int vnni,
                                                              struct w4 ws, __m128 dx, __m128i s,
                                                              __m128i isum, __m128 acc)
{
    if (off_shift(t, vnni))
        isum = _mm_sub_epi32(isum, _mm_slli_epi32(s, off_shift(t, vnni)));
    return _mm_add_ps(acc, term4(ws, dx, isum, s, has_min32(t)));
}

/* the activations' four sums of 32 from their eight sums of 16 */
static inline __m128i sums32(const int16_t *s16)
{
    return _mm_madd_epi16(_mm_loadu_si128((const __m128i *)s16), _mm_set1_epi16(1));
}

/* a 32-value block's levels: unsigned, or signed (Q8_0, IQ4_NL) */
static inline __attribute__((always_inline)) __m256i lev32_avx2(enum be_type t, const uint8_t *b)
{
    const __m256i h = _mm256_set1_epi8(0x10);
    switch (t) {
    case BE_Q4_0: return nib32(b + 2);
    case BE_Q4_1: return nib32(b + 4);
    case BE_Q5_0: return _mm256_or_si256(nib32(b + 6), _mm256_and_si256(bits32(b + 2), h));
    case BE_Q5_1: return _mm256_or_si256(nib32(b + 8), _mm256_and_si256(bits32(b + 4), h));
    case BE_Q8_0: return _mm256_loadu_si256((const __m256i *)(b + 2));
    case BE_IQ4_NL: return _mm256_shuffle_epi8(kvalues256(), nib32(b + 2));
    default: return _mm256_setzero_si256();
    }
}

/* the activation rows of a group: nt rows' q, dx and sums of 16 at the group's first block */
struct xg {
    const int8_t *q[QN];
    const float *d[QN];
    const int16_t *s[QN];
};

/* the eight lanes of sums of a block's levels wl (lev32_avx2) times the activations q */
static inline __attribute__((always_inline)) __m256i block_sum(const enum be_type t, __m256i wl,
                                                               const int8_t *q)
{
    const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
    if (signed32(t)) /* |w| against q with w's sign */
        return sum_u8(_mm256_sign_epi8(wl, wl), _mm256_sign_epi8(qv, wl));
    return sum_u8(wl, qv);
}

/* four whole blocks at w against nt activation rows, into acc[0..nt-1] */
static inline __attribute__((always_inline)) void
group32_avx2(const enum be_type t, const uint8_t *w, struct xg g, __m128 acc[QN], const int nt)
{
    const uint32_t bytes = blk_bytes(t);
    __m256i wl[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        wl[k] = lev32_avx2(t, w + (size_t)k * bytes);
    const struct w4 ws = w4_of(w, bytes, has_min32(t));
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) {
        const __m128i isum =
            hsum4_i32(block_sum(t, wl[0], g.q[j]), block_sum(t, wl[1], g.q[j] + 32),
                      block_sum(t, wl[2], g.q[j] + 64), block_sum(t, wl[3], g.q[j] + 96));
        acc[j] = group_acc(t, 0, ws, _mm_loadu_ps(g.d[j]), sums32(g.s[j]), isum, acc[j]);
    }
}

/* a row's last nv (1-3) blocks at w against nt activation rows, read where they are: each block's
 * sum on its own, the missing lanes zero, so they add +0 as dot32_scalar's (every isa: the
 * integer sums are the same) */
static inline __attribute__((always_inline)) void
tail32(const enum be_type t, const uint8_t *w, struct xg g, int nv, __m128 acc[QN], const int nt)
{
    const uint32_t bytes = blk_bytes(t);
    const int min = has_min32(t);
    const uint8_t *b1 = w + bytes, *b2 = w + 2 * bytes;
    struct w4 ws;
    ws.d = _mm_cvtph_ps(
        _mm_setr_epi16(ld16(w), nv > 1 ? ld16(b1) : 0, nv > 2 ? ld16(b2) : 0, 0, 0, 0, 0, 0));
    ws.m = min ? _mm_cvtph_ps(_mm_setr_epi16(ld16(w + 2), nv > 1 ? ld16(b1 + 2) : 0,
                                             nv > 2 ? ld16(b2 + 2) : 0, 0, 0, 0, 0, 0))
               : _mm_setzero_ps();
    const __m256i z = _mm256_setzero_si256();
    const __m256i wl0 = lev32_avx2(t, w), wl1 = nv > 1 ? lev32_avx2(t, b1) : z,
                  wl2 = nv > 2 ? lev32_avx2(t, b2) : z;
    for (int j = 0; j < nt; j++) {
        const int8_t *q = g.q[j];
        const int16_t *sg = g.s[j];
        const float *d = g.d[j];
        const __m128i isum = hsum4_i32(block_sum(t, wl0, q), nv > 1 ? block_sum(t, wl1, q + 32) : z,
                                       nv > 2 ? block_sum(t, wl2, q + 64) : z, z);
        const __m128i s = _mm_setr_epi32(sg[0] + sg[1], nv > 1 ? sg[2] + sg[3] : 0,
                                         nv > 2 ? sg[4] + sg[5] : 0, 0);
        const __m128 dx = _mm_setr_ps(d[0], nv > 1 ? d[1] : 0.0f, nv > 2 ? d[2] : 0.0f, 0.0f);
        acc[j] = group_acc(t, 0, ws, dx, s, isum, acc[j]);
    }
}

static inline struct xg xg_at(const struct qx *x, int nt, uint32_t b0)
{
    struct xg g;
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) {
        g.q[j] = x[j].q + (size_t)b0 * 32;
        g.d[j] = x[j].d + b0;
        g.s[j] = x[j].s + 2 * (size_t)b0;
    }
    return g;
}

/* lanes 0-7 = v[2k], lanes 8-15 = v[2k+1] of sixteen int16 v */
static inline __m256i pick2_i16(__m256i v, int k)
{
    const __m256i d = _mm256_permutevar8x32_epi32(v, _mm256_set1_epi32(k));
    return _mm256_shuffle_epi8(d, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                   2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}

/* broadcast masks: int16 lane j % 8 of each half in every lane */
static inline __m256i lane16_mask(int j)
{
    const int lo = 2 * (j % 8), hi = lo + 1;
    return _mm256_setr_epi8(lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi,
                            lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi);
}

static inline const int8_t *xq256(const struct qx *x, int j, uint32_t i)
{
    return x[j].q + (size_t)i * 256;
}

static inline const int16_t *xs256(const struct qx *x, int j, uint32_t i)
{
    return x[j].s + (size_t)i * 16;
}

/* acc[j] += maddubs(u, the 32 activations at 32 k of row j) . sk, for the nt rows */
/* sum_j m[j] * (bs[2j] + bs[2j+1]) of eight int16 m and row j's sixteen int16 sums bs, for the
 * nt rows of super-block i (lane j: row j): the mins' part */
static inline __m128i kmins_rows(__m128i m16, const struct qx *x, uint32_t i, const int nt)
{
    __m128i v[QN];
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) {
        const int16_t *bs = xs256(x, j, i);
        const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs),
                                             _mm_loadu_si128((const __m128i *)(bs + 8)));
        v[j] = _mm_madd_epi16(m16, pairs);
    }
    if (nt == QN)
        return _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]));
    __m128i a = _mm_add_epi32(v[0], _mm_shuffle_epi32(v[0], 0x4e));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xb1));
    return _mm_cvtsi32_si128(_mm_cvtsi128_si32(a));
}

/* the nt rows' sums of eight int32 lanes each (lane j: row j, the rest 0) */
static inline __m128i rows_sum8(const __m256i v[QN], const int nt)
{
    return nt == QN ? hsum4_i32(v[0], v[1], v[2], v[3]) : _mm_cvtsi32_si128(hsum_i32x8(v[0]));
}

/* a super-block's float part for the nt rows at once, lane j row j: kfin's operations lane by
 * lane, so the same bits */
static inline __m128 kfin_rows(__m128 sumf, float d, float dmin, const struct qx *x, uint32_t i,
                               __m128i isum, __m128i imin, const int nt)
{
    const __m128 dx =
        nt == QN ? _mm_setr_ps(x[0].d[i], x[1].d[i], x[2].d[i], x[3].d[i]) : _mm_set_ss(x[0].d[i]);
    __m128 t = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(d), dx), _mm_cvtepi32_ps(isum));
    t = _mm_sub_ps(t, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dmin), dx), _mm_cvtepi32_ps(imin)));
    return _mm_add_ps(sumf, t);
}

static inline void rows_out(__m128 sumf, float *out, const int nt)
{
    float t[4];
    _mm_storeu_ps(t, sumf);
    for (int j = 0; j < nt; j++)
        out[j] = t[j];
}

static inline __attribute__((always_inline)) void k32_avx2(__m256i acc[QN], __m256i u, __m256i sk,
                                                           const struct qx *x, uint32_t i, int k,
                                                           const int nt)
{
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) {
        const __m256i qv = _mm256_loadu_si256((const __m256i *)(xq256(x, j, i) + 32 * k));
        acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, qv), sk));
    }
}

static inline __attribute__((always_inline)) void
dot_q2k_avx2(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 84;
        const __m256i sc = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
        const __m256i scl = _mm256_and_si256(sc, _mm256_set1_epi16(15)),
                      mn = _mm256_srli_epi16(sc, 4);
        __m256i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            acc[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (k / 4)));
            const __m256i u = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * (k % 4)), m3);
            const __m256i sk = pick2_i16(scl, k);
            k32_avx2(acc, u, sk, x, i, k, nt);
        }
        const float d = h2f(b + 80), dmin = h2f(b + 82);
        __m256i mv[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            mv[j] = _mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i *)xs256(x, j, i)));
        sumf = kfin_rows(sumf, d, dmin, x, i, rows_sum8(acc, nt), rows_sum8(mv, nt), nt);
    }
    rows_out(sumf, out, nt);
}

/* Q3_K's 16 scales less 32 as int16 */
static inline __m256i q3k_scales16(const uint8_t *b)
{
    uint32_t u[4];
    q3k_scales_words(b + 96, u);
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(
        _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]), _mm_set1_epi8(32)));
}

/* Q3_K and Q6_K: the offset's part (-off * sum_g sc[g] * bs[g]) as eight int32 lanes */
static inline __m256i koff(__m256i sc, const int16_t *bs, int shift)
{
    const __m256i v = _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i *)bs));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(v, shift));
}

static inline __attribute__((always_inline)) void
dot_q3k_avx2(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 110;
        const __m256i sc = q3k_scales16(b);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
        __m256i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) /* the offset: level - 4 is the weight's */
            acc[j] = koff(sc, xs256(x, j, i), 2);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * (k / 4)));
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * (k % 4)), m3);
            const __m256i hb =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, k), one), 2);
            const __m256i u = _mm256_or_si256(lo, hb), sk = pick2_i16(sc, k);
            k32_avx2(acc, u, sk, x, i, k, nt);
        }
        const float d = h2f(b + 108);
        sumf = kfin_rows(sumf, d, 0.0f, x, i, rows_sum8(acc, nt), _mm_setzero_si128(), nt);
    }
    rows_out(sumf, out, nt);
}

/* Q4_K / Q5_K's scales (int16 lanes 0-7) and mins (8-15) */
static inline __m256i k_scales16(const uint8_t *b)
{
    uint32_t u[4];
    k_scales_words(b + 4, u);
    return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]));
}

/* Q4_K (five 0) and Q5_K (five 1) */
static inline __attribute__((always_inline)) void dot_q45k_avx2(const uint8_t *w,
                                                                const struct qx *x, uint32_t nb,
                                                                float *out, const int five,
                                                                const int nt)
{
    const uint32_t bytes = five ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * bytes, *qs = b + 16 + 32 * five;
        const __m256i sm = k_scales16(b);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        const __m256i hb =
            five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m256i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            acc[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j2 = 0; j2 < 4; j2++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * j2));
            __m256i ulo = _mm256_and_si256(qb, m4),
                    uhi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
            if (five) {
                ulo = _mm256_or_si256(
                    ulo,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j2), one), 4));
                uhi = _mm256_or_si256(
                    uhi,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j2 + 1), one), 4));
            }
            k32_avx2(acc, ulo, _mm256_shuffle_epi8(sc, lane16_mask(2 * j2)), x, i, 2 * j2, nt);
            k32_avx2(acc, uhi, _mm256_shuffle_epi8(sc, lane16_mask(2 * j2 + 1)), x, i, 2 * j2 + 1,
                     nt);
        }
        const float d = h2f(b), dmin = h2f(b + 2);
        const __m128i mn = _mm256_extracti128_si256(sm, 1);
        sumf = kfin_rows(sumf, d, dmin, x, i, rows_sum8(acc, nt), kmins_rows(mn, x, i, nt), nt);
    }
    rows_out(sumf, out, nt);
}

/* IQ4_XS's eight scales less 32 as int16 (iq4xs_scales: the low nibbles, then two high bits
 * each spread by pdep) */
static inline __m128i iq4xs_scales16(const uint8_t *b)
{
    const uint32_t sl = ld32(b + 4);
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    const __m128i lo = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(sl & 0x0f0f0f0f)),
                                         _mm_cvtsi32_si128((int)((sl >> 4) & 0x0f0f0f0f)));
    const __m128i hi = _mm_cvtsi64_si128((long long)_pdep_u64(sh, 0x0303030303030303ull) << 4);
    return _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_or_si128(lo, hi)), _mm_set1_epi16(32));
}

static inline __attribute__((always_inline)) void
dot_q6k_avx2(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 210;
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        __m256i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) /* the offset: level - 32 is the weight's */
            acc[j] = koff(sc, xs256(x, j, i), 5);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const int h = k / 4, k4 = k % 4;
            const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (k4 % 2)));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (k4 / 2)), m4);
            const __m256i hi =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k4), m3), 4);
            const __m256i u = _mm256_or_si256(lo, hi), sk = pick2_i16(sc, k);
            k32_avx2(acc, u, sk, x, i, k, nt);
        }
        const float d = h2f(b + 208);
        sumf = kfin_rows(sumf, d, 0.0f, x, i, rows_sum8(acc, nt), _mm_setzero_si128(), nt);
    }
    rows_out(sumf, out, nt);
}

static inline __attribute__((always_inline)) void
dot_iq4xs_avx2(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m256i tbl = kvalues256();
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 136;
        const __m256i sc = _mm256_broadcastsi128_si256(iq4xs_scales16(b));
        __m256i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            acc[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i wv = _mm256_shuffle_epi8(tbl, nib32(b + 8 + 16 * k));
            const __m256i aw = _mm256_sign_epi8(wv, wv),
                          sk = _mm256_shuffle_epi8(sc, lane16_mask(k));
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                const __m256i qv = _mm256_loadu_si256((const __m256i *)(xq256(x, j, i) + 32 * k));
                const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(qv, wv));
                acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(p, sk));
            }
        }
        const float d = h2f(b);
        sumf = kfin_rows(sumf, d, 0.0f, x, i, rows_sum8(acc, nt), _mm_setzero_si128(), nt);
    }
    rows_out(sumf, out, nt);
}

Q_DRIVERS(avx2, )
#endif

/* --- avx-512 (bw, vl, vnni) -------------------------------------------------------------- */

#ifdef Q_512
/* two 32-value blocks' nibbles (16 bytes at p0, 16 at p1) -> 64 levels: p0's low nibbles, its
 * high ones, then p1's */
static inline T512Q __m512i nib64(const uint8_t *p0, const uint8_t *p1)
{
    const __m256i y =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                _mm_loadu_si128((const __m128i *)p1), 1);
    const __m512i z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                               _mm512_castsi256_si512(y));
    const long long four = 0x0004000400040004ll;
    const __m512i sh = _mm512_setr_epi64(0, 0, four, four, 0, 0, four, four);
    return _mm512_and_si512(_mm512_srlv_epi16(z, sh), _mm512_set1_epi8(0x0f));
}

/* two 32-value blocks at b and b + bytes as 64 unsigned levels for vpdpbusd: Q8_0 and IQ4_NL
 * offset by 128; Q5's fifth bit added under a mask (the nibble below it is clear) */
static inline __attribute__((always_inline)) T512Q __m512i lev64_512(const enum be_type t,
                                                                     const uint8_t *b,
                                                                     uint32_t bytes)
{
    const __m512i h = _mm512_set1_epi8(0x10), flip = _mm512_set1_epi8((char)0x80);
    const uint8_t *c = b + bytes;
    switch (t) {
    case BE_Q4_0: return nib64(b + 2, c + 2);
    case BE_Q4_1: return nib64(b + 4, c + 4);
    case BE_Q5_0:
    case BE_Q5_1: {
        const int one = t == BE_Q5_1;
        const __m512i u = nib64(b + 6 + 2 * one, c + 6 + 2 * one);
        const __mmask64 k = ld32(b + 2 + 2 * one) | (uint64_t)ld32(c + 2 + 2 * one) << 32;
        return _mm512_mask_add_epi8(u, k, u, h);
    }
    case BE_Q8_0: {
        const __m512i u =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2))),
                               _mm256_loadu_si256((const __m256i *)(c + 2)), 1);
        return _mm512_xor_si512(u, flip);
    }
    case BE_IQ4_NL: {
        const __m512i tbl = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)g_kvalues)), flip);
        return _mm512_shuffle_epi8(tbl, nib64(b + 2, c + 2));
    }
    default: return _mm512_setzero_si512();
    }
}

/* the sums of each 128-bit chunk's four int32 lanes, chunk c's in lane c */
static inline T512Q __m128i chunk_sums(__m512i a)
{
    a = _mm512_add_epi32(a, _mm512_shuffle_epi32(a, (_MM_PERM_ENUM)0x4e));
    a = _mm512_add_epi32(a, _mm512_shuffle_epi32(a, (_MM_PERM_ENUM)0xb1));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), a));
}

/* the four blocks' sums of two vpdpbusd vectors (128-bit chunks: b0 b0 b1 b1, b2 b2 b3 b3) */
static inline T512Q __m128i hsum4_512(__m512i z0, __m512i z1)
{
    return chunk_sums(
        _mm512_add_epi32(_mm512_shuffle_i32x4(z0, z1, 0x88), _mm512_shuffle_i32x4(z0, z1, 0xdd)));
}

/* the nt rows' sums of sixteen int32 lanes each (lane j: row j, the rest 0) */
static inline T512Q __m128i rows_sum16(const __m512i v[QN], const int nt)
{
    if (nt != QN)
        return _mm_cvtsi32_si128(_mm512_reduce_add_epi32(v[0]));
    /* each vector's halves folded, then the pairs' chunks: row j's four partial sums in chunk j */
    const __m512i ab = _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x44),
                                        _mm512_shuffle_i32x4(v[0], v[1], 0xee));
    const __m512i cd = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2], v[3], 0x44),
                                        _mm512_shuffle_i32x4(v[2], v[3], 0xee));
    return chunk_sums(
        _mm512_add_epi32(_mm512_shuffle_i32x4(ab, cd, 0x88), _mm512_shuffle_i32x4(ab, cd, 0xdd)));
}

static inline __attribute__((always_inline)) T512Q void
group32_512(const enum be_type t, const uint8_t *w, struct xg g, __m128 acc[QN], const int nt)
{
    const uint32_t bytes = blk_bytes(t);
    const __m512i u0 = lev64_512(t, w, bytes), u1 = lev64_512(t, w + 2 * bytes, bytes);
    const struct w4 ws = w4_of(w, bytes, has_min32(t));
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) {
        const __m512i z = _mm512_setzero_si512();
        const __m128i isum = hsum4_512(_mm512_dpbusd_epi32(z, u0, _mm512_loadu_si512(g.q[j])),
                                       _mm512_dpbusd_epi32(z, u1, _mm512_loadu_si512(g.q[j] + 64)));
        acc[j] = group_acc(t, 1, ws, _mm_loadu_ps(g.d[j]), sums32(g.s[j]), isum, acc[j]);
    }
}

/* permutexvar_epi16 indices: lane l takes base + l / per (per: lanes a scale covers, 8 or 16) */
static inline T512Q __m512i pick_idx(int base, int per)
{
    static const int16_t ramp[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                     11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                     22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
    const __m512i r = _mm512_loadu_si512(ramp);
    return _mm512_add_epi16(_mm512_set1_epi16((short)base),
                            per == 8 ? _mm512_srli_epi16(r, 3) : _mm512_srli_epi16(r, 4));
}

/* int16 lanes 0-15 shifted right by a, 16-31 by b */
static inline T512Q __m512i srl2_i16(__m512i v, int a, int b)
{
    const __m512i sh =
        _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
    return _mm512_srlv_epi16(v, sh);
}

static inline T512Q __m512i bcast256(const uint8_t *p)
{
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* an int32 vector of eight lanes as the low half of a zeroed zmm */
static inline T512Q __m512i zext256(__m256i v)
{
    return _mm512_inserti64x4(_mm512_setzero_si512(), v, 0);
}

/* acc[j] += maddubs(u, the 64 activations at 64 m of row j) . sk, for the nt rows */
static inline __attribute__((always_inline)) T512Q void
k64_512(__m512i acc[QN], __m512i u, __m512i sk, const struct qx *x, uint32_t i, int m, const int nt)
{
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) {
        const __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(xq256(x, j, i) + 64 * m));
        acc[j] = _mm512_dpwssd_epi32(acc[j], p, sk);
    }
}

static inline __attribute__((always_inline)) T512Q void
dot_q2k_512(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i idx[4] = {pick_idx(0, 8), pick_idx(4, 8), pick_idx(8, 8), pick_idx(12, 8)};
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 84;
        const __m256i sc = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
        const __m512i scl = _mm512_castsi256_si512(_mm256_and_si256(sc, _mm256_set1_epi16(15)));
        const __m256i mn = _mm256_srli_epi16(sc, 4);
        __m512i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            acc[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) { /* values 64m..: groups k = 2m, 2m+1 */
            const int k = 2 * m;
            const __m512i qb = bcast256(b + 16 + 32 * (k / 4));
            const __m512i u = _mm512_and_si512(srl2_i16(qb, 2 * (k % 4), 2 * (k % 4) + 2), m3);
            k64_512(acc, u, _mm512_permutexvar_epi16(idx[m], scl), x, i, m, nt);
        }
        const float d = h2f(b + 80), dmin = h2f(b + 82);
        __m256i mv[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            mv[j] = _mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i *)xs256(x, j, i)));
        sumf = kfin_rows(sumf, d, dmin, x, i, rows_sum16(acc, nt), rows_sum8(mv, nt), nt);
    }
    rows_out(sumf, out, nt);
}

static inline __attribute__((always_inline)) T512Q void
dot_q3k_512(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
    const __m512i idx[4] = {pick_idx(0, 8), pick_idx(4, 8), pick_idx(8, 8), pick_idx(12, 8)};
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 110;
        const __m256i sc = q3k_scales16(b);
        const __m512i hm = bcast256(b), sc512 = _mm512_castsi256_si512(sc);
        __m512i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) /* the offset: level - 4 is the weight's */
            acc[j] = zext256(koff(sc, xs256(x, j, i), 2));
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            const int k = 2 * m;
            const __m512i qb = bcast256(b + 32 + 32 * (k / 4));
            const __m512i lo = _mm512_and_si512(srl2_i16(qb, 2 * (k % 4), 2 * (k % 4) + 2), m3);
            const __m512i hb = _mm512_slli_epi16(_mm512_and_si512(srl2_i16(hm, k, k + 1), one), 2);
            k64_512(acc, _mm512_or_si512(lo, hb), _mm512_permutexvar_epi16(idx[m], sc512), x, i, m,
                    nt);
        }
        const float d = h2f(b + 108);
        sumf = kfin_rows(sumf, d, 0.0f, x, i, rows_sum16(acc, nt), _mm_setzero_si128(), nt);
    }
    rows_out(sumf, out, nt);
}

static inline __attribute__((always_inline)) T512Q void dot_q45k_512(const uint8_t *w,
                                                                     const struct qx *x,
                                                                     uint32_t nb, float *out,
                                                                     const int five, const int nt)
{
    const uint32_t bytes = five ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    const __m512i idx[4] = {pick_idx(0, 16), pick_idx(2, 16), pick_idx(4, 16), pick_idx(6, 16)};
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * bytes, *qs = b + 16 + 32 * five;
        const __m256i sm = k_scales16(b);
        const __m512i scv = _mm512_castsi256_si512(sm); /* lanes 0-7: the scales */
        const __m512i hb = five ? bcast256(b + 16) : _mm512_setzero_si512();
        __m512i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            acc[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j2 = 0; j2 < 4; j2++) {
            __m512i u = _mm512_and_si512(srl2_i16(bcast256(qs + 32 * j2), 0, 4), m4);
            if (five)
                u = _mm512_or_si512(
                    u,
                    _mm512_slli_epi16(_mm512_and_si512(srl2_i16(hb, 2 * j2, 2 * j2 + 1), one), 4));
            k64_512(acc, u, _mm512_permutexvar_epi16(idx[j2], scv), x, i, j2, nt);
        }
        const float d = h2f(b), dmin = h2f(b + 2);
        const __m128i mn = _mm256_extracti128_si256(sm, 1);
        sumf = kfin_rows(sumf, d, dmin, x, i, rows_sum16(acc, nt), kmins_rows(mn, x, i, nt), nt);
    }
    rows_out(sumf, out, nt);
}

static inline __attribute__((always_inline)) T512Q void
dot_q6k_512(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3);
    const __m512i idx[4] = {pick_idx(0, 8), pick_idx(4, 8), pick_idx(8, 8), pick_idx(12, 8)};
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 210;
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        const __m512i sc512 = _mm512_castsi256_si512(sc);
        __m512i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) /* the offset: level - 32 is the weight's */
            acc[j] = zext256(koff(sc, xs256(x, j, i), 5));
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) { /* groups k = 2m, 2m+1: h = m / 2, k % 4 = 2 (m % 2) + 0, 1 */
            const int h = m / 2, sh = m % 2;
            const __m512i ql = _mm512_loadu_si512(b + 64 * h);
            const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(ql, 4 * sh), m4);
            const __m512i hi = _mm512_slli_epi16(
                _mm512_and_si512(srl2_i16(bcast256(b + 128 + 32 * h), 4 * sh, 4 * sh + 2), m3), 4);
            k64_512(acc, _mm512_or_si512(lo, hi), _mm512_permutexvar_epi16(idx[m], sc512), x, i, m,
                    nt);
        }
        const float d = h2f(b + 208);
        sumf = kfin_rows(sumf, d, 0.0f, x, i, rows_sum16(acc, nt), _mm_setzero_si128(), nt);
    }
    rows_out(sumf, out, nt);
}

static inline __attribute__((always_inline)) T512Q void
dot_iq4xs_512(const uint8_t *w, const struct qx *x, uint32_t nb, float *out, const int nt)
{
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)g_kvalues));
    const __m512i z = _mm512_setzero_si512();
    const __m512i idx[4] = {pick_idx(0, 16), pick_idx(2, 16), pick_idx(4, 16), pick_idx(6, 16)};
    __m128 sumf = _mm_setzero_ps(); /* lane j: row j */
    for (uint32_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * 136;
        const __m512i scv = _mm512_castsi128_si512(iq4xs_scales16(b));
        __m512i acc[QN];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            acc[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) { /* sub-blocks 2m, 2m+1: 32 bytes of nibbles */
            const uint8_t *qs = b + 8 + 32 * m;
            const __m512i wv = _mm512_shuffle_epi8(tbl, nib64(qs, qs + 16));
            const __mmask64 neg = _mm512_movepi8_mask(wv);
            const __m512i aw = _mm512_abs_epi8(wv), sk = _mm512_permutexvar_epi16(idx[m], scv);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) { /* |w| against q with w's sign */
                const __m512i qv = _mm512_loadu_si512(xq256(x, j, i) + 64 * m);
                const __m512i p = _mm512_maddubs_epi16(aw, _mm512_mask_sub_epi8(qv, neg, z, qv));
                acc[j] = _mm512_dpwssd_epi32(acc[j], p, sk);
            }
        }
        const float d = h2f(b);
        sumf = kfin_rows(sumf, d, 0.0f, x, i, rows_sum16(acc, nt), _mm_setzero_si128(), nt);
    }
    rows_out(sumf, out, nt);
}

Q_DRIVERS(512, T512Q)
#endif

static void dotn_scalar(enum be_type t, const void *w, const struct qx *x, uint32_t n, float *out,
                        int nt)
{
    for (int j = 0; j < nt; j++)
        out[j] = qx_blk(t) == QUANT_QK ? dot32_scalar(t, w, x[j], n / QUANT_QK)
                                       : dot256_scalar(t, w, x[j], n / QUANT_QK_K);
}

/* out[j] = dot(w, activation row j) for nt rows (nt at most QN) */
typedef void (*dotn_fn)(enum be_type t, const void *w, const struct qx *x, uint32_t n, float *out,
                        int nt);

static dotn_fn dotn_for(enum cpu_isa isa)
{
#ifdef Q_512
    if (isa == CPU_ISA_AVX512 && cpu_q_isa_ok(CPU_ISA_AVX512))
        return dotn_512;
#endif
#ifdef Q_AVX2
    if (isa != CPU_ISA_SCALAR)
        return dotn_avx2;
#endif
    return dotn_scalar;
}

float cpu_q_dot(enum be_type t, const void *w, const void *xrow, uint32_t n, enum cpu_isa isa)
{
    const struct qx x = qx_view(xrow, n, qx_blk(t));
    float out;
    dotn_for(isa)(t, w, &x, n, &out, 1);
    return out;
}

/* --- dequantization ---------------------------------------------------------------------- */

#ifdef Q_AVX2
/* y[0..15] = dl * L (mode 0), dl * L - ml (mode 1) or dl * L + ml (mode 2) of sixteen int8
 * levels L: common/quant.c's products and differences, one rounding each */
static inline void deq16(float *y, __m128i L, float dl, float ml, int mode)
{
    const __m256 dv = _mm256_set1_ps(dl), mv = _mm256_set1_ps(ml);
    __m256 a = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(L)));
    __m256 b = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(L, 8))));
    if (mode == 1) {
        a = _mm256_sub_ps(a, mv);
        b = _mm256_sub_ps(b, mv);
    } else if (mode == 2) {
        a = _mm256_add_ps(a, mv);
        b = _mm256_add_ps(b, mv);
    }
    _mm256_storeu_ps(y, a);
    _mm256_storeu_ps(y + 8, b);
}

static inline void deq32(float *y, __m256i L, float dl, float ml, int mode)
{
    deq16(y, _mm256_castsi256_si128(L), dl, ml, mode);
    deq16(y + 16, _mm256_extracti128_si256(L, 1), dl, ml, mode);
}

static inline __m128i half128(__m256i v, int hi)
{
    return hi ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
}

static void dq_block_avx2(enum be_type t, const uint8_t *s, float *y)
{
    const __m256i h = _mm256_set1_epi8(0x10), m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0f),
                  one = _mm256_set1_epi8(1);
    switch (t) {
    case BE_Q4_0: deq32(y, _mm256_sub_epi8(nib32(s + 2), _mm256_set1_epi8(8)), h2f(s), 0, 0); break;
    case BE_Q4_1: deq32(y, nib32(s + 4), h2f(s), h2f(s + 2), 2); break;
    case BE_Q5_0: {
        const __m256i u = _mm256_or_si256(nib32(s + 6), _mm256_and_si256(bits32(s + 2), h));
        deq32(y, _mm256_sub_epi8(u, _mm256_set1_epi8(16)), h2f(s), 0, 0);
        break;
    }
    case BE_Q5_1:
        deq32(y, _mm256_or_si256(nib32(s + 8), _mm256_and_si256(bits32(s + 4), h)), h2f(s),
              h2f(s + 2), 2);
        break;
    case BE_Q8_0: deq32(y, _mm256_loadu_si256((const __m256i *)(s + 2)), h2f(s), 0, 0); break;
    case BE_IQ4_NL: deq32(y, _mm256_shuffle_epi8(kvalues256(), nib32(s + 2)), h2f(s), 0, 0); break;
    case BE_Q2_K: {
        const float d = h2f(s + 80), dmin = h2f(s + 82);
        for (int k = 0; k < 8; k++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(s + 16 + 32 * (k / 4)));
            const __m256i L = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * (k % 4)), m3);
            for (int hh = 0; hh < 2; hh++) {
                const int g = 2 * k + hh;
                deq16(y + 16 * g, half128(L, hh), d * (float)(s[g] & 0xf),
                      dmin * (float)(s[g] >> 4), 1);
            }
        }
        break;
    }
    case BE_Q3_K: {
        int16_t sc[16];
        q3k_scales(s + 96, sc);
        const float d = h2f(s + 108);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)s);
        for (int k = 0; k < 8; k++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(s + 32 + 32 * (k / 4)));
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * (k % 4)), m3);
            const __m256i hb =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, k), one), 2);
            const __m256i L = _mm256_sub_epi8(_mm256_or_si256(lo, hb), _mm256_set1_epi8(4));
            for (int hh = 0; hh < 2; hh++)
                deq16(y + 32 * k + 16 * hh, half128(L, hh), d * (float)sc[2 * k + hh], 0, 0);
        }
        break;
    }
    case BE_Q4_K:
    case BE_Q5_K: {
        const int five = t == BE_Q5_K;
        uint8_t sc[8], m[8];
        k_scales(s + 4, sc, m);
        const float d = h2f(s), dmin = h2f(s + 2);
        const uint8_t *qs = s + 16 + 32 * five;
        const __m256i hb =
            five ? _mm256_loadu_si256((const __m256i *)(s + 16)) : _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            __m256i L = _mm256_and_si256(_mm256_srli_epi16(qb, 4 * (j % 2)), m4);
            if (five)
                L = _mm256_or_si256(
                    L, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, j), one), 4));
            deq32(y + 32 * j, L, d * (float)sc[j], dmin * (float)m[j], 1);
        }
        break;
    }
    case BE_Q6_K: {
        const float d = h2f(s + 208);
        const int8_t *sc = (const int8_t *)(s + 192);
        for (int k = 0; k < 8; k++) {
            const int hf = k / 4, k4 = k % 4;
            const __m256i ql = _mm256_loadu_si256((const __m256i *)(s + 64 * hf + 32 * (k4 % 2)));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * hf));
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (k4 / 2)), m4);
            const __m256i hi =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k4), m3), 4);
            const __m256i L = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
            for (int hh = 0; hh < 2; hh++)
                deq16(y + 32 * k + 16 * hh, half128(L, hh), d * (float)sc[2 * k + hh], 0, 0);
        }
        break;
    }
    case BE_IQ4_XS: {
        int16_t sc[8];
        iq4xs_scales(s, sc);
        const float d = h2f(s);
        for (int j = 0; j < 8; j++)
            deq32(y + 32 * j, _mm256_shuffle_epi8(kvalues256(), nib32(s + 8 + 16 * j)),
                  d * (float)sc[j], 0, 0);
        break;
    }
    default: break;
    }
}
#endif

void cpu_q_dequant(enum be_type t, const void *src, float *dst, size_t n, enum cpu_isa isa)
{
#ifdef Q_AVX2
    if (isa != CPU_ISA_SCALAR && quant_is_block((uint32_t)t)) {
        const uint32_t vals = quant_block_values((uint32_t)t), bytes = blk_bytes(t);
        const uint8_t *s = src;
        for (size_t i = 0; i < n / vals; i++)
            dq_block_avx2(t, s + i * bytes, dst + i * vals);
        return;
    }
#endif
    quant_dequantize_row((uint32_t)t, src, dst, n);
}

/* --- matmul rows ------------------------------------------------------------------------- */

/* activation rows a token tile holds: they stay in L2 while each weight row (in L1) is read
 * across them, so prefill reads a weight row once a tile */
#define QM_TILE_BYTES (256 * 1024)

void cpu_qmatmul_rows(float *y, const void *xq, size_t xq_stride, const void *w, enum be_type t,
                      size_t row_bytes, const float *bias, uint32_t n_tok, uint32_t n_in,
                      uint32_t n_out, uint32_t r0, uint32_t r1)
{
    const dotn_fn f = dotn_for(cpu_q_isa());
    const uint32_t blk = qx_blk(t);
    uint32_t tile = (uint32_t)(QM_TILE_BYTES / (xq_stride ? xq_stride : 1));
    tile = tile < QN ? QN : tile / QN * QN;
    for (uint32_t t0 = 0; t0 < n_tok; t0 += tile) {
        const uint32_t nt = n_tok - t0 < tile ? n_tok - t0 : tile;
        for (uint32_t r = r0; r < r1; r++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
            const float b = bias ? bias[r] : 0.0f;
            for (uint32_t k = 0; k < nt; k += QN) {
                const int m = nt - k < QN ? (int)(nt - k) : QN;
                struct qx x[QN];
                float out[QN];
                for (int j = 0; j < m; j++)
                    x[j] =
                        qx_view((const uint8_t *)xq + (size_t)(t0 + k + j) * xq_stride, n_in, blk);
                f(t, wr, x, n_in, out, m);
                for (int j = 0; j < m; j++)
                    y[(size_t)(t0 + k + j) * n_out + r] = out[j] + b;
            }
        }
    }
}
