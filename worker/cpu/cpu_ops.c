/* cpu_ops.c - cpu kernels: weight dequant, fma dot products, matmul rows, attention. */
#include "worker/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

#include "common/quant.h"
#include "worker/cpu/cpu_quant.h"

#include <immintrin.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CPU_AVX2 1
#endif

float cpu_f16_to_f32(uint16_t h)
{
#ifdef CPU_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

uint16_t cpu_f32_to_f16(float f)
{
#ifdef CPU_AVX2
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) /* inf / nan */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is right */
    return (uint16_t)(sign | h);
#endif
}

float cpu_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void f16_row(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
#ifdef CPU_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++)
        dst[i] = cpu_f16_to_f32(src[i]);
}

void cpu_dequant_row(enum be_type t, const void *src, float *dst, size_t n)
{
    switch (t) {
    case BE_F32: memcpy(dst, src, n * sizeof(float)); break;
    case BE_F16: f16_row(src, dst, n); break;
    case BE_BF16: {
        const uint16_t *s = src;
        size_t i = 0;
#ifdef CPU_AVX2
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
#endif
        for (; i < n; i++)
            dst[i] = cpu_bf16_to_f32(s[i]);
        break;
    }
    case BE_Q8_0: {
        const uint8_t *b = src;
        for (size_t i = 0; i < n; i += BE_Q8_0_BLOCK, b += 2 + BE_Q8_0_BLOCK) {
            uint16_t dh;
            memcpy(&dh, b, 2);
            float d = cpu_f16_to_f32(dh);
            const int8_t *q = (const int8_t *)(b + 2);
#ifdef CPU_AVX2
            __m256 dv = _mm256_set1_ps(d);
            for (int j = 0; j < BE_Q8_0_BLOCK; j += 8) {
                __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + j)));
                _mm256_storeu_ps(dst + i + j, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(w)));
            }
#else
            for (int j = 0; j < BE_Q8_0_BLOCK; j++)
                dst[i + j] = d * (float)q[j];
#endif
        }
        break;
    }
    default: cpu_q_dequant(t, src, dst, n, cpu_q_isa()); break;
    }
}

void cpu_store_kv(enum kv_dtype t, void *dst, const float *src, size_t n)
{
    if (t == KV_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = dst;
    size_t i = 0;
#ifdef CPU_AVX2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++)
        d[i] = cpu_f32_to_f16(src[i]);
}

void cpu_kv_load_rows(const struct kv_layout *l, const void *slice, uint32_t head, uint32_t pos,
                      uint32_t n, float *dst)
{
    const uint32_t hd = l->head_dim;
#ifdef CPU_AVX2
    if (kv_dtype_is_8bit(l->dtype)) {
        /* head_dim is a multiple of 8: eight levels a step, one f32 multiply each, the bits of
         * kv_row_load. A head's rows follow each other, each its levels then its scales */
        const uint8_t *q = kv_row_ptr(l, (void *)slice, head, pos);
        const size_t rb = kv_row_bytes(l);
        for (uint32_t r = 0; r < n; r++, q += rb) {
            const char *sc = (const char *)q + hd;
            float *y = dst + (size_t)r * hd;
            if (l->dtype == KV_Q8) {
                const uint16_t *d = (const uint16_t *)sc;
                for (uint32_t i = 0; i < hd; i += 8) {
                    const __m256 dv = _mm256_castsi256_ps(
                        _mm256_set1_epi32((int)((uint32_t)d[i / KV_Q8_GROUP] << 16)));
                    const __m256i w =
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
                    _mm256_storeu_ps(y + i, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(w)));
                }
            } else {
                /* e4m3 is f16 with the top exponent bit and 7 mantissa bits cut: its bits
                 * shifted into an f16 are the value times 2^-8, exactly */
                float s;
                memcpy(&s, sc, sizeof s);
                const __m256 sv = _mm256_set1_ps(s * 256.0f);
                const __m128i sgn = _mm_set1_epi16((short)0x80), mag = _mm_set1_epi16(0x7f);
                for (uint32_t i = 0; i < hd; i += 8) {
                    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(q + i)));
                    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, sgn), 8),
                                                   _mm_slli_epi16(_mm_and_si128(b, mag), 7));
                    _mm256_storeu_ps(y + i, _mm256_mul_ps(sv, _mm256_cvtph_ps(h)));
                }
            }
        }
        return;
    }
#endif
    for (uint32_t r = 0; r < n; r++)
        kv_row_load(l, slice, head, pos + r, dst + (size_t)r * hd);
}

#ifdef CPU_AVX2
/* glibc's vector expf (libmvec, which libm's link script brings in): eight lanes, within 1 ulp
 * of expf. A scalar expf a score was most of the f16 attention chunk's time (a call per head
 * and key: one thread's attention 5.4 -> 7.3 GB/s with it, llama3-8b shape, 4k keys) */
extern __m256 _ZGVdN8v_expf(__m256 x);

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum8 of four vectors at once, as one vector: the same additions in the same order (each
 * lane's halves, then lanes 0 + 2 and 1 + 3, then those two), so the same bits */
static inline __m128 hsum8x4(const __m256 v[4])
{
    __m128 s[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        s[k] = _mm_add_ps(_mm256_castps256_ps128(v[k]), _mm256_extractf128_ps(v[k], 1));
    const __m128 ab = _mm_add_ps(_mm_movelh_ps(s[0], s[1]), _mm_movehl_ps(s[1], s[0]));
    const __m128 cd = _mm_add_ps(_mm_movelh_ps(s[2], s[3]), _mm_movehl_ps(s[3], s[2]));
    return _mm_hadd_ps(ab, cd);
}
#endif

float cpu_dot(const float *a, const float *b, size_t n)
{
    size_t i = 0;
    float sum = 0.0f;
#ifdef CPU_AVX2
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    sum = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#endif
    for (; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* an element / eight elements of a row of f32 or (f16 != 0) f16; f16 -> f32 is exact, so a sum
 * over either gives the same bits for the same values */
static inline float row_elem(const void *r, size_t i, int f16)
{
    return f16 ? cpu_f16_to_f32(((const uint16_t *)r)[i]) : ((const float *)r)[i];
}

#ifdef CPU_AVX2
static inline __m256 row_load8(const void *r, size_t i, int f16)
{
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)r + i)))
               : _mm256_loadu_ps((const float *)r + i);
}
#endif

/* out[j] = dot(x, w[j]) for 4 rows of f32, or f16 converted as they are loaded (f16 != 0, a
 * constant where it is inlined): the same sums in the same order either way */
static inline __attribute__((always_inline)) void dot4_rows(const float *x, const void *const w[4],
                                                            size_t n, float out[4], const int f16)
{
    size_t i = 0;
    float s[4] = {0, 0, 0, 0};
#ifdef CPU_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(xv, row_load8(w[0], i, f16), a0);
        a1 = _mm256_fmadd_ps(xv, row_load8(w[1], i, f16), a1);
        a2 = _mm256_fmadd_ps(xv, row_load8(w[2], i, f16), a2);
        a3 = _mm256_fmadd_ps(xv, row_load8(w[3], i, f16), a3);
    }
    const __m256 acc[4] = {a0, a1, a2, a3};
    _mm_storeu_ps(s, hsum8x4(acc));
#endif
    for (; i < n; i++)
        for (int j = 0; j < 4; j++)
            s[j] += x[i] * row_elem(w[j], i, f16);
    memcpy(out, s, sizeof(s));
}

void cpu_dot4(const float *x, const float *w0, const float *w1, const float *w2, const float *w3,
              size_t n, float out[4])
{
    const void *const w[4] = {w0, w1, w2, w3};
    dot4_rows(x, w, n, out, 0);
}

#ifdef CPU_AVX2
/* a[k] += xa * w[k], b[k] += xb * w[k] for the four k: eight independent sums */
static inline void fma2x4(__m256 a[4], __m256 b[4], __m256 xa, __m256 xb, const __m256 w[4])
{
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        a[k] = _mm256_fmadd_ps(xa, w[k], a[k]);
        b[k] = _mm256_fmadd_ps(xb, w[k], b[k]);
    }
}
#endif

/* -O2's cheap vectorizer leaves loops with a remainder scalar: spelled out */
/* 4 rows x 2 tokens: 6 loads feed 8 fmas. each sum runs in the same order
 * as cpu_dot4's, so a token's result does not depend on its neighbour. The rows are f32, or f16
 * converted as they are loaded (f16 != 0, a constant where it is inlined) */
static inline __attribute__((always_inline)) void dot4x2_rows(const float *x0, const float *x1,
                                                              const void *const w[4], size_t n,
                                                              float o0[4], float o1[4],
                                                              const int f16)
{
    size_t i = 0;
    float s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
#ifdef CPU_AVX2
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        a[k] = b[k] = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 wv[4] = {row_load8(w[0], i, f16), row_load8(w[1], i, f16),
                              row_load8(w[2], i, f16), row_load8(w[3], i, f16)};
        fma2x4(a, b, _mm256_loadu_ps(x0 + i), _mm256_loadu_ps(x1 + i), wv);
    }
    _mm_storeu_ps(s0, hsum8x4(a));
    _mm_storeu_ps(s1, hsum8x4(b));
#endif
    for (; i < n; i++)
        for (int j = 0; j < 4; j++) {
            const float wf = row_elem(w[j], i, f16);
            s0[j] += x0[i] * wf;
            s1[j] += x1[i] * wf;
        }
    memcpy(o0, s0, sizeof(s0));
    memcpy(o1, s1, sizeof(s1));
}

static void dot4x2(const float *x0, const float *x1, const float *const w[4], size_t n, float o0[4],
                   float o1[4])
{
    dot4x2_rows(x0, x1, (const void *const *)w, n, o0, o1, 0);
}

void cpu_axpy(float *y, float a, const float *x, size_t n)
{
    size_t i = 0;
#ifdef CPU_AVX2
    __m256 av = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] += a * x[i];
}

void cpu_scale(float *y, float a, size_t n)
{
    size_t i = 0;
#ifdef CPU_AVX2
    __m256 av = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] *= a;
}

void cpu_silu_mul_row(float *y, const float *g, const float *u, size_t n)
{
#ifdef CPU_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        float tg[8] = {0}, tu[8] = {0}, ty[8];
        const size_t k = n - i < 8 ? n - i : 8;
        const int whole = k == 8;
        if (!whole) { /* the row's last lanes, padded: the same exp as every other element */
            memcpy(tg, g + i, k * sizeof(float));
            memcpy(tu, u + i, k * sizeof(float));
        }
        const __m256 gv = _mm256_loadu_ps(whole ? g + i : tg);
        const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(zero, gv));
        const __m256 yv = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)),
                                        _mm256_loadu_ps(whole ? u + i : tu));
        _mm256_storeu_ps(whole ? y + i : ty, yv);
        if (!whole)
            memcpy(y + i, ty, k * sizeof(float));
    }
#else
    for (size_t i = 0; i < n; i++)
        y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
#endif
}

void cpu_gelu_mul_row(float *y, const float *g, const float *u, size_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        const float x = g[i];
        y[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__AVX512F__)
/* avx-512 kernels picked at run time: the build targets x86-64-v3, and the
 * 32 zmm registers hold a 4 rows x 4 tokens block of sums */
#define CPU_DISPATCH_512 1
#endif
#if defined(__AVX512F__)
#define CPU_DISPATCH_512 1
#endif

static int avx512_mode = -1; /* -1: auto, 0: off, 1: on when the cpu has it */

void cpu_ops_use_avx512(int mode)
{
    avx512_mode = mode;
}

int cpu_ops_avx512(void)
{
#ifdef CPU_DISPATCH_512
    static int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return have && avx512_mode != 0;
#else
    return 0;
#endif
}

#ifdef CPU_DISPATCH_512
/* s (nt, 4) = x (nt, n) . w[0..3]; every sum in the same order whether its
 * token ran in a block of 4 or alone, so batching never changes a result */
__attribute__((target("avx512f,fma"))) static void
rows4_avx512(const float *x, size_t n, uint32_t nt, const float *const w[4], float *s)
{
    const size_t n16 = n & ~(size_t)15;
    uint32_t t = 0;
    for (; t + 4 <= nt; t += 4) {
        const float *xs[4] = {x + (size_t)t * n, x + (size_t)(t + 1) * n, x + (size_t)(t + 2) * n,
                              x + (size_t)(t + 3) * n};
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
        __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
        for (size_t i = 0; i < n16; i += 16) {
            __m512 w0 = _mm512_loadu_ps(w[0] + i), w1 = _mm512_loadu_ps(w[1] + i);
            __m512 w2 = _mm512_loadu_ps(w[2] + i), w3 = _mm512_loadu_ps(w[3] + i);
            __m512 xv = _mm512_loadu_ps(xs[0] + i);
            a00 = _mm512_fmadd_ps(xv, w0, a00);
            a01 = _mm512_fmadd_ps(xv, w1, a01);
            a02 = _mm512_fmadd_ps(xv, w2, a02);
            a03 = _mm512_fmadd_ps(xv, w3, a03);
            xv = _mm512_loadu_ps(xs[1] + i);
            a10 = _mm512_fmadd_ps(xv, w0, a10);
            a11 = _mm512_fmadd_ps(xv, w1, a11);
            a12 = _mm512_fmadd_ps(xv, w2, a12);
            a13 = _mm512_fmadd_ps(xv, w3, a13);
            xv = _mm512_loadu_ps(xs[2] + i);
            a20 = _mm512_fmadd_ps(xv, w0, a20);
            a21 = _mm512_fmadd_ps(xv, w1, a21);
            a22 = _mm512_fmadd_ps(xv, w2, a22);
            a23 = _mm512_fmadd_ps(xv, w3, a23);
            xv = _mm512_loadu_ps(xs[3] + i);
            a30 = _mm512_fmadd_ps(xv, w0, a30);
            a31 = _mm512_fmadd_ps(xv, w1, a31);
            a32 = _mm512_fmadd_ps(xv, w2, a32);
            a33 = _mm512_fmadd_ps(xv, w3, a33);
        }
        __m512 acc[4][4] = {
            {a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) {
                float v = _mm512_reduce_add_ps(acc[k][j]);
                for (size_t i = n16; i < n; i++)
                    v += xs[k][i] * w[j][i];
                s[(size_t)(t + k) * 4 + j] = v;
            }
    }
    for (; t < nt; t++) {
        const float *xt = x + (size_t)t * n;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = 0; i < n16; i += 16) {
            __m512 xv = _mm512_loadu_ps(xt + i);
            a0 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w[0] + i), a0);
            a1 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w[1] + i), a1);
            a2 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w[2] + i), a2);
            a3 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w[3] + i), a3);
        }
        __m512 acc[4] = {a0, a1, a2, a3};
        for (int j = 0; j < 4; j++) {
            float v = _mm512_reduce_add_ps(acc[j]);
            for (size_t i = n16; i < n; i++)
                v += xt[i] * w[j][i];
            s[(size_t)t * 4 + j] = v;
        }
    }
}
#endif

/* s (nt, 4) = x (nt, n) . w[0..3] with the avx2 kernels */
static void rows4_avx2(const float *x, size_t n, uint32_t nt, const float *const w[4], float *s)
{
    uint32_t t = 0;
    for (; t + 2 <= nt; t += 2)
        dot4x2(x + (size_t)t * n, x + (size_t)(t + 1) * n, w, n, s + (size_t)t * 4,
               s + (size_t)(t + 1) * 4);
    for (; t < nt; t++)
        cpu_dot4(x + (size_t)t * n, w[0], w[1], w[2], w[3], n, s + (size_t)t * 4);
}

/* tokens per tile: x of a tile stays in L2 while 4 weight rows are reused
 * across it, so prefill reads (and dequantizes) each row n_tok/tile times */
#define MM_TILE_FLOATS 131072
#define MM_TILE_MAX    128

void cpu_matmul_rows(float *y, const float *x, const void *w, enum be_type t, size_t row_bytes,
                     const float *bias, uint32_t n_tok, uint32_t n_in, uint32_t n_out, uint32_t r0,
                     uint32_t r1, float *scratch)
{
    uint32_t tile = MM_TILE_FLOATS / (n_in ? n_in : 1);
    tile = tile < 1 ? 1 : tile > MM_TILE_MAX ? MM_TILE_MAX : tile;
    float s[MM_TILE_MAX * 4]; /* (tile, 4) sums of one row group */
    const int use512 = cpu_ops_avx512();
    for (uint32_t t0 = 0; t0 < n_tok; t0 += tile) {
        uint32_t nt = n_tok - t0 < tile ? n_tok - t0 : tile;
        for (uint32_t r = r0; r < r1; r += 4) {
            uint32_t nr = r1 - r < 4 ? r1 - r : 4;
            const float *wr[4];
            for (uint32_t j = 0; j < 4; j++) {
                /* a short group repeats its first row; the extra sums are dropped */
                uint32_t row = r + (j < nr ? j : 0);
                const char *src = (const char *)w + (size_t)row * row_bytes;
                if (t == BE_F32) {
                    wr[j] = (const float *)src;
                } else if (j < nr) {
                    cpu_dequant_row(t, src, scratch + (size_t)j * n_in, n_in);
                    wr[j] = scratch + (size_t)j * n_in;
                } else {
                    wr[j] = wr[0];
                }
            }
            const float *xt = x + (size_t)t0 * n_in;
#ifdef CPU_DISPATCH_512
            if (use512)
                rows4_avx512(xt, n_in, nt, wr, s);
            else
#endif
                rows4_avx2(xt, n_in, nt, wr, s);
            (void)use512;
            for (uint32_t k = 0; k < nt; k++) {
                float *yo = y + (size_t)(t0 + k) * n_out + r;
                for (uint32_t j = 0; j < nr; j++)
                    yo[j] = s[k * 4 + j] + (bias ? bias[r + j] : 0.0f);
            }
        }
    }
}

/* o (hd) = o * corr + sum_c p[c] * v[c]; the sums of 32 columns stay in
 * registers across the chunk's keys instead of a load and store per key. The rows are f32, or
 * f16 converted as they are loaded (f16 != 0, a constant where it is inlined) */
static inline __attribute__((always_inline)) void accumulate1_rows(float *o, float corr,
                                                                   const float *p, const void *v,
                                                                   uint32_t nc, uint32_t hd,
                                                                   const int f16)
{
    uint32_t d0 = 0;
#ifdef CPU_AVX2
    const __m256 cv = _mm256_set1_ps(corr);
    for (; d0 + 32 <= hd; d0 += 32) {
        __m256 a0 = _mm256_mul_ps(cv, _mm256_loadu_ps(o + d0));
        __m256 a1 = _mm256_mul_ps(cv, _mm256_loadu_ps(o + d0 + 8));
        __m256 a2 = _mm256_mul_ps(cv, _mm256_loadu_ps(o + d0 + 16));
        __m256 a3 = _mm256_mul_ps(cv, _mm256_loadu_ps(o + d0 + 24));
        for (uint32_t c = 0; c < nc; c++) {
            const size_t r = (size_t)c * hd + d0;
            __m256 pv = _mm256_set1_ps(p[c]);
            a0 = _mm256_fmadd_ps(pv, row_load8(v, r, f16), a0);
            a1 = _mm256_fmadd_ps(pv, row_load8(v, r + 8, f16), a1);
            a2 = _mm256_fmadd_ps(pv, row_load8(v, r + 16, f16), a2);
            a3 = _mm256_fmadd_ps(pv, row_load8(v, r + 24, f16), a3);
        }
        _mm256_storeu_ps(o + d0, a0);
        _mm256_storeu_ps(o + d0 + 8, a1);
        _mm256_storeu_ps(o + d0 + 16, a2);
        _mm256_storeu_ps(o + d0 + 24, a3);
    }
#endif
    for (uint32_t d = d0; d < hd; d++) {
        float a = o[d] * corr;
        for (uint32_t c = 0; c < nc; c++)
            a += p[c] * row_elem(v, (size_t)c * hd + d, f16);
        o[d] = a;
    }
}

/* accumulate1_rows for two heads of the group at once: each value row loaded once feeds both,
 * and eight independent sums keep the fma units busy (four waited on each other's latency).
 * Every sum runs in accumulate1_rows' order: the same bits. The rows are f32, or f16 converted
 * as they are loaded (f16 != 0, a constant where it is inlined) */
static inline __attribute__((always_inline)) void
accumulate2_rows(float *o0, float *o1, float corr0, float corr1, const float *p0, const float *p1,
                 const void *v, uint32_t nc, uint32_t hd, const int f16)
{
    uint32_t d0 = 0;
#ifdef CPU_AVX2
    const __m256 c0 = _mm256_set1_ps(corr0), c1 = _mm256_set1_ps(corr1);
    for (; d0 + 32 <= hd; d0 += 32) {
        __m256 a[4], b[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            a[k] = _mm256_mul_ps(c0, _mm256_loadu_ps(o0 + d0 + 8 * k));
            b[k] = _mm256_mul_ps(c1, _mm256_loadu_ps(o1 + d0 + 8 * k));
        }
        for (uint32_t c = 0; c < nc; c++) {
            const size_t r = (size_t)c * hd + d0;
            const __m256 vv[4] = {row_load8(v, r, f16), row_load8(v, r + 8, f16),
                                  row_load8(v, r + 16, f16), row_load8(v, r + 24, f16)};
            fma2x4(a, b, _mm256_set1_ps(p0[c]), _mm256_set1_ps(p1[c]), vv);
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            _mm256_storeu_ps(o0 + d0 + 8 * k, a[k]);
            _mm256_storeu_ps(o1 + d0 + 8 * k, b[k]);
        }
    }
#endif
    for (uint32_t d = d0; d < hd; d++) { /* accumulate1_rows' scalar tail, both heads */
        float a = o0[d] * corr0, b = o1[d] * corr1;
        for (uint32_t c = 0; c < nc; c++) {
            const float vf = row_elem(v, (size_t)c * hd + d, f16);
            a += p0[c] * vf;
            b += p1[c] * vf;
        }
        o0[d] = a;
        o1[d] = b;
    }
}

#ifdef CPU_AVX2
/* scores of two f16 keys for four heads (q rows x[0..3]): each key row converted once for the
 * four (dot4x2_rows converts it once a pair); every sum in dot4x2's order, so the same bits */
static void dot2x4h_f16(const float *const x[4], const uint16_t *k0, const uint16_t *k1, size_t n,
                        float *s0, float *s1, float *s2, float *s3)
{
    size_t i = 0;
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++)
        a[h] = b[h] = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = row_load8(k0, i, 1), w1 = row_load8(k1, i, 1);
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const __m256 xv = _mm256_loadu_ps(x[h] + i);
            a[h] = _mm256_fmadd_ps(xv, w0, a[h]);
            b[h] = _mm256_fmadd_ps(xv, w1, b[h]);
        }
    }
    float r0[4], r1[4];
    _mm_storeu_ps(r0, hsum8x4(a));
    _mm_storeu_ps(r1, hsum8x4(b));
    for (; i < n; i++) {
        const float w0 = cpu_f16_to_f32(k0[i]), w1 = cpu_f16_to_f32(k1[i]);
        for (int h = 0; h < 4; h++) {
            r0[h] += x[h][i] * w0;
            r1[h] += x[h][i] * w1;
        }
    }
    float *const s[4] = {s0, s1, s2, s3};
    for (int h = 0; h < 4; h++) {
        s[h][0] = r0[h];
        s[h][1] = r1[h];
    }
}

/* o[h] (hd) = o[h] * corr[h] + sum_c p[h][c] * v[c] for four heads over f16 value rows, 16
 * columns at a time: each value row converted once for the four; every element summed in
 * accumulate1_rows' order, so the same bits */
static void attn_accumulate4_f16(float *const o[4], const float corr[4], const float *const p[4],
                                 const uint16_t *v, uint32_t nc, uint32_t hd)
{
    /* the columns accumulate2_rows sums by vectors (whole 32s); the rest as its scalar tail */
    const uint32_t hv = hd & ~31u;
    uint32_t d0 = 0;
    for (; d0 + 16 <= hv; d0 += 16) {
        __m256 a[4], b[4];
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const __m256 cv = _mm256_set1_ps(corr[h]);
            a[h] = _mm256_mul_ps(cv, _mm256_loadu_ps(o[h] + d0));
            b[h] = _mm256_mul_ps(cv, _mm256_loadu_ps(o[h] + d0 + 8));
        }
        for (uint32_t c = 0; c < nc; c++) {
            const uint16_t *vr = v + (size_t)c * hd + d0;
            const __m256 v0 = row_load8(vr, 0, 1), v1 = row_load8(vr, 8, 1);
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                const __m256 pv = _mm256_broadcast_ss(p[h] + c);
                a[h] = _mm256_fmadd_ps(pv, v0, a[h]);
                b[h] = _mm256_fmadd_ps(pv, v1, b[h]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            _mm256_storeu_ps(o[h] + d0, a[h]);
            _mm256_storeu_ps(o[h] + d0 + 8, b[h]);
        }
    }
    for (uint32_t d = d0; d < hd; d++)
        for (int h = 0; h < 4; h++) {
            float a = o[h][d] * corr[h];
            for (uint32_t c = 0; c < nc; c++)
                a += p[h][c] * cpu_f16_to_f32(v[(size_t)c * hd + d]);
            o[h][d] = a;
        }
}

#endif

/* keys scored per online-softmax update */
#define ATTN_CHUNK 64

/* the next chunk's keys and values come from memory while this chunk computes: a few cache
 * lines of each at every step of the score loop (a burst of them all at once stalls on the
 * core's fill buffers, and then the chunk waits as it did without) */
struct attn_pf {
    const char *k, *v;
    size_t off, len;
};

#define ATTN_PF_STEP 256 /* bytes of each per step: 4 lines */

static inline void attn_pf_step(struct attn_pf *pf)
{
    if (pf->off >= pf->len)
        return;
    for (size_t i = 0; i < ATTN_PF_STEP; i += 64) {
        __builtin_prefetch(pf->k + pf->off + i, 0, 3);
        __builtin_prefetch(pf->v + pf->off + i, 0, 3);
    }
    pf->off += ATTN_PF_STEP;
}

#ifdef CPU_AVX2
/* eight scores from sh + c, lanes past nc padded with pad */
static inline __m256 score_load8(const float *sh, uint32_t c, uint32_t nc, float pad)
{
    if (c + 8 <= nc)
        return _mm256_loadu_ps(sh + c);
    float t[8];
    for (uint32_t i = 0; i < 8; i++)
        t[i] = c + i < nc ? sh[c + i] : pad;
    return _mm256_loadu_ps(t);
}

static inline void score_store8(float *sh, uint32_t c, uint32_t nc, __m256 v)
{
    if (c + 8 <= nc) {
        _mm256_storeu_ps(sh + c, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    for (uint32_t i = 0; c + i < nc; i++)
        sh[c + i] = t[i];
}
#endif

/* one online-softmax step of a head over a chunk's nc scores: scaled, they become the weights p;
 * *m and *l move on; returns the rescale of the output so far. Every score takes the same path
 * (a chunk's last lanes padded), so a key's weight does not depend on where its chunk ends */
static float attn_softmax_chunk(float *sh, uint32_t nc, float scale, float *m, float *l)
{
    float cmax = -INFINITY;
#ifdef CPU_AVX2
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (uint32_t c = 0; c < nc; c += 8) {
        const __m256 x = _mm256_mul_ps(score_load8(sh, c, nc, -INFINITY), sv);
        score_store8(sh, c, nc, x);
        mv = _mm256_max_ps(mv, x);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    cmax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#else
    for (uint32_t c = 0; c < nc; c++) {
        sh[c] *= scale;
        cmax = sh[c] > cmax ? sh[c] : cmax;
    }
#endif
    float mnew = cmax > *m ? cmax : *m;
    float corr = *m == -INFINITY ? 0.0f : expf(*m - mnew);
    float lsum = 0.0f;
#ifdef CPU_AVX2
    const __m256 mn = _mm256_set1_ps(mnew);
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t c = 0; c < nc; c += 8) {
        /* padded lanes: exp(-inf) = 0 */
        const __m256 p = _ZGVdN8v_expf(_mm256_sub_ps(score_load8(sh, c, nc, -INFINITY), mn));
        score_store8(sh, c, nc, p); /* now the weights p */
        acc = _mm256_add_ps(acc, p);
    }
    lsum = hsum8(acc);
#else
    for (uint32_t c = 0; c < nc; c++) {
        sh[c] = expf(sh[c] - mnew); /* now the weights p */
        lsum += sh[c];
    }
#endif
    *l = *l * corr + lsum;
    *m = mnew;
    return corr;
}

/* one chunk of nc keys K and values V (rows of hd, f32, or f16 converted as the sums load them:
 * f16 != 0, a constant where it is inlined) for the group's heads: four at a time for f16 (each
 * row converted once for the four), then in pairs (a key row loaded once feeds both), then an
 * odd group's last head alone. Every sum in cpu_dot4's and accumulate1_rows' order, so f16 gives
 * the same bits as its values held as f32. Keys past the last multiple of 4 are scored by cpu_dot
 * (from f32 rows in kb for f16) */
static inline __attribute__((always_inline)) void
attn_chunk(const struct cpu_attn_job *j, const void *K, const void *V, uint32_t nc, const float *qg,
           float *og, float *s, float *kb, float *mr, float *lr, struct attn_pf *pf, const int f16)
{
    const uint32_t g = j->a->n_head / j->a->n_kv_head, hd = j->layout->head_dim, nc4 = nc & ~3u;
    const size_t row = (size_t)hd * (f16 ? sizeof(uint16_t) : sizeof(float)); /* bytes a key */
    const float *kt = K; /* the tail keys as f32 */
    if (f16 && nc4 < nc) {
        f16_row((const uint16_t *)K + (size_t)nc4 * hd, kb + (size_t)nc4 * hd,
                (size_t)(nc - nc4) * hd);
        kt = kb;
    }
    uint32_t h = 0;
#ifdef CPU_AVX2
    for (; f16 && h + 4 <= g; h += 4) {
        float *const sh[4] = {s + (size_t)h * ATTN_CHUNK, s + (size_t)(h + 1) * ATTN_CHUNK,
                              s + (size_t)(h + 2) * ATTN_CHUNK, s + (size_t)(h + 3) * ATTN_CHUNK};
        const float *const qh[4] = {qg + (size_t)h * hd, qg + (size_t)(h + 1) * hd,
                                    qg + (size_t)(h + 2) * hd, qg + (size_t)(h + 3) * hd};
        for (uint32_t c = 0; c < nc4; c += 2) {
            attn_pf_step(pf);
            attn_pf_step(pf);
            dot2x4h_f16(qh, (const uint16_t *)K + (size_t)c * hd,
                        (const uint16_t *)K + (size_t)(c + 1) * hd, hd, sh[0] + c, sh[1] + c,
                        sh[2] + c, sh[3] + c);
        }
        float corr[4];
        for (int i = 0; i < 4; i++) {
            for (uint32_t c = nc4; c < nc; c++)
                sh[i][c] = cpu_dot(qh[i], kt + (size_t)c * hd, hd);
            corr[i] = attn_softmax_chunk(sh[i], nc, j->a->scale, &mr[h + i], &lr[h + i]);
        }
        float *const oh[4] = {og + (size_t)h * hd, og + (size_t)(h + 1) * hd,
                              og + (size_t)(h + 2) * hd, og + (size_t)(h + 3) * hd};
        attn_accumulate4_f16(oh, corr, (const float *const *)sh, V, nc, hd);
    }
#endif
    for (; h < g; h += 2) {
        const int two = h + 1 < g;
        float *s0 = s + (size_t)h * ATTN_CHUNK, *s1 = s0 + ATTN_CHUNK;
        const float *q0 = qg + (size_t)h * hd, *q1 = q0 + hd;
        for (uint32_t c = 0; c < nc4; c += 4) {
            const char *k0 = (const char *)K + c * row;
            const void *const kw[4] = {k0, k0 + row, k0 + 2 * row, k0 + 3 * row};
            attn_pf_step(pf);
            if (two) {
                attn_pf_step(pf);
                dot4x2_rows(q0, q1, kw, hd, s0 + c, s1 + c, f16);
            } else {
                dot4_rows(q0, kw, hd, s0 + c, f16);
            }
        }
        for (uint32_t c = nc4; c < nc; c++) {
            s0[c] = cpu_dot(q0, kt + (size_t)c * hd, hd);
            if (two)
                s1[c] = cpu_dot(q1, kt + (size_t)c * hd, hd);
        }
        const float corr0 = attn_softmax_chunk(s0, nc, j->a->scale, &mr[h], &lr[h]);
        if (two) {
            const float corr1 = attn_softmax_chunk(s1, nc, j->a->scale, &mr[h + 1], &lr[h + 1]);
            accumulate2_rows(og + (size_t)h * hd, og + (size_t)(h + 1) * hd, corr0, corr1, s0, s1,
                             V, nc, hd, f16);
        } else {
            accumulate1_rows(og + (size_t)h * hd, corr0, s0, V, nc, hd, f16);
        }
    }
}

#ifdef CPU_DISPATCH_512
/* the attention chunk on avx-512, picked at run time (cpu_ops_avx512): 16 lanes a fma, so twice
 * the avx2 form's work an instruction where its fma units bound it (a 16-vcpu host of 8 cores
 * read a 32k row at 61.8 GB/s with the avx2 form, under half its memory's 132). f16 and f32 rows
 * go through the same code (f16 != 0 converts as it loads), so they give the same bits; the
 * bits differ from the avx2 form's (the scores' sums are in another order), as the avx-512
 * matmul's do */
#define T512 __attribute__((target("avx512f,avx2,fma,f16c")))

static inline T512 __m512 row_load16(const void *r, size_t i, const int f16)
{
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)r + i)))
               : _mm512_loadu_ps((const float *)r + i);
}

/* the sums of eight vectors, into r[0..7]: every vector through the same tree (its halves,
 * then its quarters, then lanes 0 + 2 and 1 + 3, then those two), so a sum's bits do not depend
 * on the slot it took */
static inline T512 void hsum16x8(const __m512 v[8], float r[8])
{
    __m512 u[4], w[2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* (v[2k] lo256 + hi256, v[2k+1] lo256 + hi256) */
        u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) /* four 128-bit blocks: v[4k], v[4k+1], v[4k+2], v[4k+3] */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], 0xdd));
    /* in block b: (x0 + x2, y0 + y2, x1 + x3, y1 + y3) of x = v[b], y = v[4 + b] */
    const __m512 t = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
    const __m512 s = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4e));
    float o[16];
    _mm512_storeu_ps(o, s);
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) {
        r[b] = o[4 * b];
        r[4 + b] = o[4 * b + 1];
    }
}

/* scores of keys k0 and k1 (k1 NULL: one key) for heads x[0..nh-1] (nh <= 4) into s[h][c],
 * s[h][c + 1]: 16 lanes a sum, then hsum16x8, then the columns past the last 16 in order */
static inline __attribute__((always_inline)) T512 void scores512(const float *const x[4], int nh,
                                                                 const void *k0, const void *k1,
                                                                 uint32_t n, float *const s[4],
                                                                 uint32_t c, const int f16)
{
    __m512 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 w0 = row_load16(k0, i, f16), w1 = k1 ? row_load16(k1, i, f16) : w0;
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++)
            if (h < nh) {
                const __m512 xv = _mm512_loadu_ps(x[h] + i);
                a[h] = _mm512_fmadd_ps(xv, w0, a[h]);
                if (k1)
                    a[4 + h] = _mm512_fmadd_ps(xv, w1, a[4 + h]);
            }
    }
    float r[8];
    hsum16x8(a, r);
    for (int h = 0; h < nh; h++) {
        float r0 = r[h], r1 = r[4 + h];
        for (uint32_t t = i; t < n; t++) {
            r0 += x[h][t] * row_elem(k0, t, f16);
            if (k1)
                r1 += x[h][t] * row_elem(k1, t, f16);
        }
        s[h][c] = r0;
        if (k1)
            s[h][c + 1] = r1;
    }
}

/* accumulate512's columns d0 .. d0 + 16 * nv of heads 0..nh-1 (nv 1 or 2, a constant where it is
 * inlined): their sums in registers across the chunk's keys, each value row loaded once for the
 * heads */
static inline __attribute__((always_inline)) T512 void
accumulate512_cols(float *const o[4], const float corr[4], const float *const p[4], int nh,
                   const void *v, uint32_t nc, uint32_t hd, uint32_t d0, const int nv,
                   const int f16)
{
    __m512 a[4][2];
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++)
        a[h][0] = a[h][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++)
        if (h < nh)
            for (int k = 0; k < nv; k++)
                a[h][k] =
                    _mm512_mul_ps(_mm512_set1_ps(corr[h]), _mm512_loadu_ps(o[h] + d0 + 16 * k));
    for (uint32_t c = 0; c < nc; c++) {
        const size_t r = (size_t)c * hd + d0;
        __m512 vv[2];
        for (int k = 0; k < nv; k++)
            vv[k] = row_load16(v, r + 16 * k, f16);
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++)
            if (h < nh) {
                const __m512 pv = _mm512_set1_ps(p[h][c]);
                for (int k = 0; k < nv; k++)
                    a[h][k] = _mm512_fmadd_ps(pv, vv[k], a[h][k]);
            }
    }
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++)
        if (h < nh)
            for (int k = 0; k < nv; k++)
                _mm512_storeu_ps(o[h] + d0 + 16 * k, a[h][k]);
}

/* o[h] (hd) = o[h] * corr[h] + sum_c p[h][c] * v[c] for heads 0..nh-1: 32 columns a pass (eight
 * sums in flight for four heads), then 16; an element's sum is one fma a key in key order,
 * whatever the vector width, then the columns past the last 16 as scalars */
static inline __attribute__((always_inline)) T512 void
accumulate512(float *const o[4], const float corr[4], const float *const p[4], int nh,
              const void *v, uint32_t nc, uint32_t hd, const int f16)
{
    uint32_t d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32)
        accumulate512_cols(o, corr, p, nh, v, nc, hd, d0, 2, f16);
    for (; d0 + 16 <= hd; d0 += 16)
        accumulate512_cols(o, corr, p, nh, v, nc, hd, d0, 1, f16);
    for (uint32_t d = d0; d < hd; d++)
        for (int h = 0; h < nh; h++) {
            float a = o[h][d] * corr[h];
            for (uint32_t c = 0; c < nc; c++)
                a += p[h][c] * row_elem(v, (size_t)c * hd + d, f16);
            o[h][d] = a;
        }
}

/* attn_chunk on avx-512: the group's heads four at a time (the last few fewer), every key in
 * pairs (an odd last one alone, through the same sums) */
static inline __attribute__((always_inline)) T512 void
attn_chunk512_of(const struct cpu_attn_job *j, const void *K, const void *V, uint32_t nc,
                 const float *qg, float *og, float *s, float *mr, float *lr, struct attn_pf *pf,
                 const int f16)
{
    const uint32_t g = j->a->n_head / j->a->n_kv_head, hd = j->layout->head_dim;
    const size_t row = (size_t)hd * (f16 ? sizeof(uint16_t) : sizeof(float)); /* bytes a key */
    for (uint32_t h = 0; h < g; h += 4) {
        const int nh = g - h < 4 ? (int)(g - h) : 4;
        float *sh[4];
        const float *qh[4];
        float *oh[4];
        for (int i = 0; i < 4; i++) { /* heads past nh alias the first: never read or written */
            const uint32_t hi = h + (uint32_t)(i < nh ? i : 0);
            sh[i] = s + (size_t)hi * ATTN_CHUNK;
            qh[i] = qg + (size_t)hi * hd;
            oh[i] = og + (size_t)hi * hd;
        }
        for (uint32_t c = 0; c < nc; c += 2) {
            attn_pf_step(pf);
            attn_pf_step(pf);
            const char *k0 = (const char *)K + c * row;
            scores512(qh, nh, k0, c + 1 < nc ? k0 + row : NULL, hd, sh, c, f16);
        }
        float corr[4] = {0, 0, 0, 0};
        for (int i = 0; i < nh; i++)
            corr[i] = attn_softmax_chunk(sh[i], nc, j->a->scale, &mr[h + i], &lr[h + i]);
        accumulate512(oh, corr, (const float *const *)sh, nh, V, nc, hd, f16);
    }
}

static T512 void attn_chunk512(const struct cpu_attn_job *j, const void *K, const void *V,
                               uint32_t nc, const float *qg, float *og, float *s, float *mr,
                               float *lr, struct attn_pf *pf)
{
    if (j->layout->dtype == KV_F16)
        attn_chunk512_of(j, K, V, nc, qg, og, s, mr, lr, pf, 1);
    else
        attn_chunk512_of(j, K, V, nc, qg, og, s, mr, lr, pf, 0);
}
#endif

size_t cpu_attn_scratch_floats(const struct kv_layout *l, const struct be_attn *a)
{
    uint32_t g = a->n_head / a->n_kv_head;
    /* scores (g, CHUNK) + f32 key rows (CHUNK, head_dim) + m, l (g); 8-bit kv: f32 value rows
     * (CHUNK, head_dim) too */
    return (size_t)g * ATTN_CHUNK +
           (size_t)ATTN_CHUNK * l->head_dim * (kv_dtype_is_8bit(l->dtype) ? 2 : 1) + 2 * (size_t)g;
}

void cpu_attn_task(const struct cpu_attn_job *j, const struct kv_block_ref *blocks,
                   uint32_t first_block, uint32_t n_blocks, uint32_t pos, uint32_t kvh,
                   const float *q, float *o, float *m, float *l, float *scratch)
{
    const struct kv_layout *ly = j->layout;
    const uint32_t g = j->a->n_head / j->a->n_kv_head, hd = ly->head_dim, B = ly->block_size;
    const size_t rb = kv_row_bytes(ly); /* a key's bytes: f32, f16 elements or 8-bit levels */
    const int q8bit = kv_dtype_is_8bit(ly->dtype);
    float *s = scratch;                       /* (g, CHUNK) scaled scores */
    float *kb = s + (size_t)g * ATTN_CHUNK;   /* (CHUNK, hd) f16 tail keys or 8-bit keys, f32 */
    float *vb = kb + (size_t)ATTN_CHUNK * hd; /* (CHUNK, hd) 8-bit values as f32 */
    float *mr = vb + (q8bit ? (size_t)ATTN_CHUNK * hd : 0); /* (g) running max */
    float *lr = mr + g;                                     /* (g) running sum */
    const float *qg = q + (size_t)kvh * g * hd;             /* (g, hd) this group's queries */
    float *og = o + (size_t)kvh * g * hd;                   /* (g, hd) unnormalized until the end */

    const int use512 = cpu_ops_avx512();
    (void)use512;
    memset(og, 0, sizeof(float) * g * hd);
    for (uint32_t h = 0; h < g; h++) {
        mr[h] = -INFINITY;
        lr[h] = 0.0f;
    }
    /* a sliding window reads positions lo..pos only */
    const uint64_t win = j->a->window, lo = win && pos + 1ull > win ? pos + 1ull - win : 0;
    for (uint32_t bj = 0; bj < n_blocks; bj++) {
        uint64_t start = (uint64_t)(first_block + bj) * B;
        if (start > pos)
            break;
        if (blocks[bj].residency != j->residency || start + B <= lo)
            continue;
        uint32_t n_valid = pos - start + 1 < B ? (uint32_t)(pos - start + 1) : B;
        const uint32_t c_lo = lo > start ? (uint32_t)(lo - start) : 0;
        const void *Ks = kv_slice_ptr(ly, j->pools, blocks[bj], j->layer, 0);
        const void *Vs = kv_slice_ptr(ly, j->pools, blocks[bj], j->layer, 1);
        /* the head's rows (8-bit: dequantized a chunk at a time) */
        const char *K = (const char *)Ks + (size_t)kvh * B * rb;
        const char *V = (const char *)Vs + (size_t)kvh * B * rb;
        for (uint32_t c0 = c_lo; c0 < n_valid; c0 += ATTN_CHUNK) {
            uint32_t nc = n_valid - c0 < ATTN_CHUNK ? n_valid - c0 : ATTN_CHUNK;
            struct attn_pf pf = {K + (size_t)(c0 + ATTN_CHUNK) * rb,
                                 V + (size_t)(c0 + ATTN_CHUNK) * rb, 0, 0};
            if (c0 + ATTN_CHUNK < n_valid) {
                uint32_t nn = n_valid - c0 - ATTN_CHUNK;
                pf.len = (size_t)(nn < ATTN_CHUNK ? nn : ATTN_CHUNK) * rb;
            }
            const char *kc = K + (size_t)c0 * rb, *vc = V + (size_t)c0 * rb;
            if (q8bit) {
                /* the f32 path over the dequantized rows: the bits of f32 kv holding them */
                cpu_kv_load_rows(ly, Ks, kvh, c0, nc, kb);
                cpu_kv_load_rows(ly, Vs, kvh, c0, nc, vb);
                kc = (const char *)kb;
                vc = (const char *)vb;
            }
#ifdef CPU_DISPATCH_512
            if (use512) {
                attn_chunk512(j, kc, vc, nc, qg, og, s, mr, lr, &pf);
                continue;
            }
#endif
            if (ly->dtype == KV_F16 && !q8bit)
                attn_chunk(j, kc, vc, nc, qg, og, s, kb, mr, lr, &pf, 1);
            else
                attn_chunk(j, kc, vc, nc, qg, og, s, kb, mr, lr, &pf, 0);
        }
    }
    for (uint32_t h = 0; h < g; h++) {
        if (lr[h] > 0.0f)
            cpu_scale(og + (size_t)h * hd, 1.0f / lr[h], hd);
        m[kvh * g + h] = mr[h];
        l[kvh * g + h] = lr[h];
    }
}

void cpu_lse_merge(float *o_a, float *m_a, float *l_a, const float *o_b, float m_b, float l_b,
                   uint32_t head_dim)
{
    if (m_b == -INFINITY || l_b == 0.0f)
        return;
    if (*m_a == -INFINITY || *l_a == 0.0f) {
        memcpy(o_a, o_b, sizeof(float) * head_dim);
        *m_a = m_b;
        *l_a = l_b;
        return;
    }
    float mx = *m_a > m_b ? *m_a : m_b;
    float wa = *l_a * expf(*m_a - mx), wb = l_b * expf(m_b - mx);
    float lsum = wa + wb, ca = wa / lsum, cb = wb / lsum;
    for (uint32_t d = 0; d < head_dim; d++)
        o_a[d] = o_a[d] * ca + o_b[d] * cb;
    *m_a = mx;
    *l_a = lsum;
}
