/* weights.c - counter-based PRNG, f16/bf16 rounding (nearest even), quantized blocks. */
#include "cli/rkv-mkmodel/weights.h"

#include <math.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "common/gguf.h"
#include "common/quant.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

uint64_t wt_splitmix64(uint64_t x)
{
    x += GOLDEN;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t wt_tensor_key(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull; /* fnv-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return wt_splitmix64(wt_splitmix64(seed) ^ h);
}

uint16_t wt_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)(x >> 16 | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);         /* round to nearest even */
    return (uint16_t)(x >> 16);
}

uint16_t wt_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
    uint32_t abs = x & 0x7fffffff;
    if (abs > 0x7f800000)
        return sign | 0x7e00;
    if (abs >= 0x477ff000) /* rounds to >= 65520: inf */
        return sign | 0x7c00;
    if (abs < 0x38800000) { /* below 2^-14: subnormal half */
        /* value / 2^-24, rounded to nearest even, via the fpu */
        float v;
        memcpy(&v, &abs, 4);
        float q = v * 16777216.0f; /* exact: power of two */
        return sign | (uint16_t)lrintf(q);
    }
    uint32_t mant = abs & 0x7fffff;
    uint32_t exp = (abs >> 23) - 127 + 15;
    uint32_t h = exp << 10 | mant >> 13;
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* carries into the exponent correctly */
    return sign | (uint16_t)h;
}

/* 32 values starting at element first (even) */
static void gen32(const struct wt_dist *d, uint64_t first, float *v)
{
    /* one 64-bit draw gives two 24-bit uniforms */
    uint64_t ctr = d->key + (first / 2) * GOLDEN;
    const float scale = 2.0f / 16777216.0f;
    for (int i = 0; i < 32; i += 2) {
        ctr += GOLDEN;
        uint64_t z = ctr;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u0 = (float)(uint32_t)(z >> 40) * scale - 1.0f;
        float u1 = (float)(uint32_t)(z & 0xffffff) * scale - 1.0f;
        v[i] = d->center + d->half * u0;
        v[i + 1] = d->center + d->half * u1;
    }
}

void wt_fill(const struct wt_dist *d, uint32_t type, uint64_t first, uint64_t n, void *out)
{
    uint8_t *o = out;
    if (quant_is_block(type)) {
        /* whole blocks, quantized by the reference formulas */
        uint32_t bv = quant_block_values(type);
        size_t bb = quant_row_bytes(type, bv);
        float blk[QUANT_QK_K];
        for (uint64_t b = first; b < first + n; b += bv, o += bb) {
            for (uint32_t k = 0; k < bv; k += 32)
                gen32(d, b + k, blk + k);
            quant_quantize_row(type, blk, o, bv);
        }
        return;
    }
    float v[32];
    /* an odd start or a tail shorter than 32 takes the slow path by element */
    uint64_t e = first;
    uint64_t end = first + n;
    while (e < end) {
        uint64_t base = e & ~(uint64_t)31;
        gen32(d, base, v);
        uint64_t lo = e - base;
        uint64_t hi = end - base < 32 ? end - base : 32;
        switch (type) {
        case GGUF_TYPE_F32:
            memcpy(o, v + lo, (hi - lo) * 4);
            o += (hi - lo) * 4;
            break;
#ifdef __F16C__
        case GGUF_TYPE_F16:
            if (lo == 0 && hi == 32) {
                /* same rounding (nearest even) as wt_f32_to_f16, 8 at a time */
                for (int i = 0; i < 32; i += 8) {
                    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT);
                    _mm_storeu_si128((__m128i *)(o + 2 * i), h);
                }
                o += 64;
                break;
            }
            __attribute__((fallthrough)); /* partial block: scalar */
#else
        case GGUF_TYPE_F16:
#endif
        case GGUF_TYPE_BF16:
            for (uint64_t i = lo; i < hi; i++) {
                uint16_t h = type == GGUF_TYPE_F16 ? wt_f32_to_f16(v[i]) : wt_f32_to_bf16(v[i]);
                memcpy(o, &h, 2);
                o += 2;
            }
            break;
        default: return;
        }
        e = base + hi;
    }
}
