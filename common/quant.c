/* quant.c - ggml's block formats: the layouts, exact dequantization and round-to-nearest quantization. */
#include "common/quant.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

/* every product and difference below is one f32 operation, as numpy does it: a fused
 * multiply-add would round once where the reference rounds twice */
#pragma GCC optimize("fp-contract=off")

struct qtraits {
    const char *name;
    uint32_t values; /* per block */
    uint32_t bytes;  /* per block */
};

static const struct qtraits g_traits[] = {
    [QUANT_F32] = {"F32", 1, 4},           [QUANT_F16] = {"F16", 1, 2},
    [QUANT_Q4_0] = {"Q4_0", 32, 18},       [QUANT_Q4_1] = {"Q4_1", 32, 20},
    [QUANT_Q5_0] = {"Q5_0", 32, 22},       [QUANT_Q5_1] = {"Q5_1", 32, 24},
    [QUANT_Q8_0] = {"Q8_0", 32, 34},       [QUANT_Q2_K] = {"Q2_K", 256, 84},
    [QUANT_Q3_K] = {"Q3_K", 256, 110},     [QUANT_Q4_K] = {"Q4_K", 256, 144},
    [QUANT_Q5_K] = {"Q5_K", 256, 176},     [QUANT_Q6_K] = {"Q6_K", 256, 210},
    [QUANT_IQ4_NL] = {"IQ4_NL", 32, 18},   [QUANT_IQ4_XS] = {"IQ4_XS", 256, 136},
    [QUANT_BF16] = {"BF16", 1, 2},
};

static const struct qtraits *traits(uint32_t type)
{
    if (type >= sizeof g_traits / sizeof g_traits[0] || !g_traits[type].name)
        return NULL;
    return &g_traits[type];
}

int quant_supported(uint32_t type)
{
    return traits(type) != NULL;
}

int quant_is_block(uint32_t type)
{
    const struct qtraits *t = traits(type);
    return t && t->values > 1;
}

const char *quant_name(uint32_t type)
{
    const struct qtraits *t = traits(type);
    return t ? t->name : NULL;
}

uint32_t quant_block_values(uint32_t type)
{
    const struct qtraits *t = traits(type);
    return t ? t->values : 0;
}

size_t quant_row_bytes(uint32_t type, size_t n)
{
    const struct qtraits *t = traits(type);
    if (!t || n % t->values)
        return 0;
    return n / t->values * t->bytes;
}

/* --- f16 ------------------------------------------------------------------------------ */

float quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant) {
        /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) /* NaN: quiet, keep the top payload bits */
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000) /* rounds to 65520 or more: infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000) { /* below the smallest normal: a subnormal or zero */
        if (ax < 0x33000000) /* below half the smallest subnormal */
            return sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1)))
            q++;
        return sign | (uint16_t)q;
    }
    uint32_t h = ((ax >> 13) - (112u << 10)), rest = ax & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* a carry into the exponent is right */
    return sign | (uint16_t)h;
}

static float rd16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return quant_f16_to_f32(h);
}

static void wr16(uint8_t *p, float f)
{
    uint16_t h = quant_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static const int8_t g_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

/* --- dequantization (gguf.quants' order of operations) ---------------------------------- */

/* a Q4_K / Q5_K sub-block's 6-bit scale and min, j in 0..7 */
static void k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void dq_block(uint32_t type, const uint8_t *b, float *y)
{
    switch (type) {
    case QUANT_Q4_0: {
        float d = rd16(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xf) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        break;
    }
    case QUANT_Q4_1: {
        float d = rd16(b), m = rd16(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0xf) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case QUANT_Q5_0:
    case QUANT_Q5_1: {
        int one = type == QUANT_Q5_1;
        float d = rd16(b), m = one ? rd16(b + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * one, 4);
        const uint8_t *qs = b + 6 + 2 * one;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            if (one) {
                y[j] = d * (float)lo + m;
                y[j + 16] = d * (float)hi + m;
            } else {
                y[j] = d * (float)(lo - 16);
                y[j + 16] = d * (float)(hi - 16);
            }
        }
        break;
    }
    case QUANT_Q8_0: {
        float d = rd16(b);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case QUANT_IQ4_NL: {
        float d = rd16(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)g_iq4nl[b[2 + j] & 0xf];
            y[j + 16] = d * (float)g_iq4nl[b[2 + j] >> 4];
        }
        break;
    }
    case QUANT_Q2_K: {
        /* scales[16] qs[64] d dmin; value e: half e/128, shift (e/32)%4, byte half*32+e%32 */
        const uint8_t *sc = b, *qs = b + 16;
        float d = rd16(b + 80), dmin = rd16(b + 82);
        for (int g = 0; g < 16; g++) {
            float dl = d * (float)(sc[g] & 0xf), ml = dmin * (float)(sc[g] >> 4);
            for (int k = 0; k < 16; k++) {
                int e = g * 16 + k, half = e / 128, s = (e / 32) % 4, l = e % 32;
                int q = (qs[half * 32 + l] >> (2 * s)) & 3;
                y[e] = dl * (float)q - ml;
            }
        }
        break;
    }
    case QUANT_Q3_K: {
        /* hmask[32] qs[64] scales[12] d */
        const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
        float d = rd16(b + 108);
        for (int g = 0; g < 16; g++) {
            int lo = g < 8 ? s[g] & 0xf : s[g - 8] >> 4;
            int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
            float dl = d * (float)(int8_t)((lo | hi << 4) - 32);
            for (int k = 0; k < 16; k++) {
                int e = g * 16 + k, half = e / 128, sh = (e / 32) % 4, l = e % 32;
                int ql = (qs[half * 32 + l] >> (2 * sh)) & 3;
                int bit = (hm[l] >> (e / 32)) & 1;
                y[e] = dl * (float)(ql - ((bit ^ 1) << 2));
            }
        }
        break;
    }
    case QUANT_Q4_K:
    case QUANT_Q5_K: {
        /* d dmin scales[12] (qh[32]) qs[128]; sub-block j: bytes (j/2)*32.., nibble j%2 */
        int five = type == QUANT_Q5_K;
        float d = rd16(b), dmin = rd16(b + 2);
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + 16 + 32 * five;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            k_scale_min(s, j, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xf;
                if (five)
                    q |= ((qh[l] >> j) & 1) << 4;
                y[j * 32 + l] = dl * (float)q - ml;
            }
        }
        break;
    }
    case QUANT_Q6_K: {
        /* ql[128] qh[64] scales[16] (int8) d; value e: half h, nibble (e%128)/64, 2-bit
         * pair (e%128)/32 of qh */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = rd16(b + 208);
        for (int g = 0; g < 16; g++) {
            float dl = d * (float)sc[g];
            for (int k = 0; k < 16; k++) {
                int e = g * 16 + k, h = e / 128, r = e % 128;
                int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xf;
                int hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                y[e] = dl * (float)((lo | hi << 4) - 32);
            }
        }
        break;
    }
    case QUANT_IQ4_XS: {
        /* d scales_h(u16) scales_l[4] qs[128]; sub-block j: 16 bytes, low then high nibbles */
        float d = rd16(b);
        uint16_t sh;
        memcpy(&sh, b + 2, 2);
        const uint8_t *sl = b + 4, *qs = b + 8;
        for (int j = 0; j < 8; j++) {
            int lo = (sl[j / 2] >> (4 * (j % 2))) & 0xf, hi = (sh >> (2 * j)) & 3;
            float dl = d * (float)(int8_t)((lo | hi << 4) - 32);
            for (int l = 0; l < 16; l++) {
                y[j * 32 + l] = dl * (float)g_iq4nl[qs[j * 16 + l] & 0xf];
                y[j * 32 + 16 + l] = dl * (float)g_iq4nl[qs[j * 16 + l] >> 4];
            }
        }
        break;
    }
    }
}

int quant_dequantize_row(uint32_t type, const void *src, float *dst, size_t n)
{
    const struct qtraits *t = traits(type);
    if (!t || n % t->values)
        return RKV_EINVAL;
    const uint8_t *s = src;
    switch (type) {
    case QUANT_F32: memcpy(dst, src, n * 4); return 0;
    case QUANT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = quant_f16_to_f32(h);
        }
        return 0;
    case QUANT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    }
    for (size_t i = 0; i < n / t->values; i++)
        dq_block(type, s + i * t->bytes, dst + i * t->values);
    return 0;
}

int quant_row_bad_scale(uint32_t type, const void *src, size_t n, size_t *bad)
{
    const struct qtraits *t = traits(type);
    if (!t || t->values == 1 || n % t->values)
        return 0;
    /* where each format keeps its f16 scales */
    int at[2] = {0, -1};
    switch (type) {
    case QUANT_Q4_1:
    case QUANT_Q5_1:
    case QUANT_Q4_K:
    case QUANT_Q5_K: at[1] = 2; break;
    case QUANT_Q2_K: at[0] = 80, at[1] = 82; break;
    case QUANT_Q3_K: at[0] = 108; break;
    case QUANT_Q6_K: at[0] = 208; break;
    }
    const uint8_t *s = src;
    for (size_t i = 0; i < n / t->values; i++)
        for (int k = 0; k < 2; k++)
            if (at[k] >= 0 && !isfinite(rd16(s + i * t->bytes + at[k]))) {
                *bad = i;
                return 1;
            }
    return 0;
}

/* --- quantization ---------------------------------------------------------------------- */

/* the value of largest magnitude (its sign kept; the first of equals) */
static float signed_absmax(const float *x, int n)
{
    float m = 0.0f, am = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > am) {
            am = fabsf(x[i]);
            m = x[i];
        }
    return m;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* the 32-value formats, as gguf.quants.quantize writes them */
static void q_block32(uint32_t type, const float *x, uint8_t *b)
{
    uint8_t q[32] = {0};
    switch (type) {
    case QUANT_Q4_0:
    case QUANT_Q5_0: {
        int five = type == QUANT_Q5_0;
        float d = signed_absmax(x, 32) / (five ? -16.0f : -8.0f);
        float id = d == 0.0f ? 0.0f : 1.0f / d, off = five ? 16.5f : 8.5f;
        for (int j = 0; j < 32; j++) {
            float t = x[j] * id;
            t = t + off;
            q[j] = (uint8_t)clampi((int)truncf(t), 0, five ? 31 : 15);
        }
        wr16(b, d);
        break;
    }
    case QUANT_Q4_1:
    case QUANT_Q5_1: {
        int five = type == QUANT_Q5_1;
        float mx = x[0], mn = x[0];
        for (int j = 1; j < 32; j++) {
            mx = fmaxf(mx, x[j]);
            mn = fminf(mn, x[j]);
        }
        float d = (mx - mn) / (five ? 31.0f : 15.0f), id = d == 0.0f ? 0.0f : 1.0f / d;
        for (int j = 0; j < 32; j++) {
            float t = x[j] - mn;
            t = t * id;
            t = t + 0.5f;
            q[j] = (uint8_t)clampi((int)truncf(t), 0, five ? 31 : 15);
        }
        wr16(b, d);
        wr16(b + 2, mn);
        break;
    }
    case QUANT_Q8_0: {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
        wr16(b, d);
        for (int j = 0; j < 32; j++)
            b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id); /* half away from zero */
        return;
    }
    case QUANT_IQ4_NL: {
        float d = signed_absmax(x, 32) / (float)g_iq4nl[0];
        wr16(b, d);
        float dq = rd16(b), id = dq == 0.0f ? 0.0f : 1.0f / dq;
        for (int j = 0; j < 32; j++) {
            float v = x[j] * id;
            int best = 0;
            for (int k = 1; k < 16; k++)
                if (fabsf(v - g_iq4nl[k]) < fabsf(v - g_iq4nl[best]))
                    best = k;
            q[j] = (uint8_t)best;
        }
        for (int j = 0; j < 16; j++)
            b[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        return;
    }
    }
    int five = type == QUANT_Q5_0 || type == QUANT_Q5_1, one = type == QUANT_Q4_1 || type == QUANT_Q5_1;
    uint8_t *qs = b + 2 + 2 * one + 4 * five;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 0xf) | (q[j + 16] & 0xf) << 4);
    if (five) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++)
            qh |= (uint32_t)(q[j] >> 4) << j;
        memcpy(b + 2 + 2 * one, &qh, 4);
    }
}

/* the nearest of levels 0..nmax to (x + min) / d; 0 when d is 0 */
static int level(float x, float d, float min, int nmax)
{
    return d == 0.0f ? 0 : clampi((int)lrintf((x + min) / d), 0, nmax);
}

static void pack_k_scales(uint8_t *s, const uint8_t *sc, const uint8_t *m)
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | (m[j + 4] & 0xf) << 4);
    }
}

/* n sub-blocks of len values with levels 0..nmax above a min (never above 0): each one's
 * scale and negated min, and the largest of each */
static void asym_scales(const float *x, int n, int len, int nmax, float *scale, float *mins,
                        float *max_scale, float *max_min)
{
    *max_scale = *max_min = 0.0f;
    for (int j = 0; j < n; j++) {
        float mx = x[j * len], mn = x[j * len];
        for (int l = 1; l < len; l++) {
            mx = fmaxf(mx, x[j * len + l]);
            mn = fminf(mn, x[j * len + l]);
        }
        mn = fminf(mn, 0.0f);
        scale[j] = (mx - mn) / (float)nmax;
        mins[j] = -mn;
        *max_scale = fmaxf(*max_scale, scale[j]);
        *max_min = fmaxf(*max_min, mins[j]);
    }
}

/* the 256-value formats: a scale (and min) per sub-block, those quantized under the
 * super-block's f16 scale, then every value to the nearest level of its sub-block */
static void q_block256(uint32_t type, const float *x, uint8_t *b)
{
    memset(b, 0, quant_row_bytes(type, QUANT_QK_K));
    switch (type) {
    case QUANT_Q4_K:
    case QUANT_Q5_K: {
        int five = type == QUANT_Q5_K, nmax = five ? 31 : 15;
        float scale[8], mins[8], ms, mm;
        asym_scales(x, 8, 32, nmax, scale, mins, &ms, &mm);
        wr16(b, ms / 63.0f);
        wr16(b + 2, mm / 63.0f);
        float d = rd16(b), dmin = rd16(b + 2);
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = (uint8_t)(d == 0.0f ? 0 : clampi((int)lrintf(scale[j] / d), 0, 63));
            m[j] = (uint8_t)(dmin == 0.0f ? 0 : clampi((int)lrintf(mins[j] / dmin), 0, 63));
        }
        pack_k_scales(b + 4, sc, m);
        uint8_t *qh = b + 16, *qs = b + 16 + 32 * five;
        for (int j = 0; j < 8; j++) {
            float dl = d * (float)sc[j], ml = dmin * (float)m[j];
            for (int l = 0; l < 32; l++) {
                int q = level(x[j * 32 + l], dl, ml, nmax);
                qs[(j / 2) * 32 + l] |= (uint8_t)((q & 0xf) << (4 * (j % 2)));
                if (five)
                    qh[l] |= (uint8_t)((q >> 4) << j);
            }
        }
        break;
    }
    case QUANT_Q2_K: {
        float scale[16], mins[16], ms, mm;
        asym_scales(x, 16, 16, 3, scale, mins, &ms, &mm);
        wr16(b + 80, ms / 15.0f);
        wr16(b + 82, mm / 15.0f);
        float d = rd16(b + 80), dmin = rd16(b + 82);
        for (int g = 0; g < 16; g++) {
            int sc = d == 0.0f ? 0 : clampi((int)lrintf(scale[g] / d), 0, 15);
            int m = dmin == 0.0f ? 0 : clampi((int)lrintf(mins[g] / dmin), 0, 15);
            b[g] = (uint8_t)(sc | m << 4);
            float dl = d * (float)sc, ml = dmin * (float)m;
            for (int k = 0; k < 16; k++) {
                int e = g * 16 + k, q = level(x[e], dl, ml, 3);
                b[16 + (e / 128) * 32 + e % 32] |= (uint8_t)(q << (2 * ((e / 32) % 4)));
            }
        }
        break;
    }
    case QUANT_Q3_K:
    case QUANT_Q6_K: {
        /* symmetric: 16 sub-blocks, levels -4..3 (Q3_K) or -32..31 (Q6_K) */
        int six = type == QUANT_Q6_K, half = six ? 32 : 4;
        float scale[16], ms = 0.0f;
        for (int g = 0; g < 16; g++) {
            scale[g] = signed_absmax(x + g * 16, 16) / (float)-half;
            if (fabsf(scale[g]) > fabsf(ms))
                ms = scale[g];
        }
        /* the sub-block scales: int8 (Q6_K) or 6 bits (Q3_K) under d */
        int smax = six ? 127 : 31;
        float d = ms / (float)(six ? -128 : -32);
        wr16(six ? b + 208 : b + 108, d);
        float dq = rd16(six ? b + 208 : b + 108);
        for (int g = 0; g < 16; g++) {
            int sc = dq == 0.0f ? 0 : clampi((int)lrintf(scale[g] / dq), -smax - 1, smax);
            float dl = dq * (float)sc;
            if (six)
                b[192 + g] = (uint8_t)(int8_t)sc;
            else {
                int u = sc + 32;
                if (g < 8)
                    b[96 + g] |= (uint8_t)(u & 0xf);
                else
                    b[96 + g - 8] |= (uint8_t)((u & 0xf) << 4);
                b[104 + g % 4] |= (uint8_t)(((u >> 4) & 3) << (2 * (g / 4)));
            }
            for (int k = 0; k < 16; k++) {
                int e = g * 16 + k;
                int q = dl == 0.0f ? half : clampi((int)lrintf(x[e] / dl), -half, half - 1) + half;
                int h = e / 128, r = e % 128;
                if (six) {
                    b[h * 64 + r % 64] |= (uint8_t)((q & 0xf) << (4 * (r / 64)));
                    b[128 + h * 32 + r % 32] |= (uint8_t)((q >> 4) << (2 * (r / 32)));
                } else {
                    b[32 + h * 32 + r % 32] |= (uint8_t)((q & 3) << (2 * (r / 32)));
                    b[r % 32] |= (uint8_t)((q >> 2) << (e / 32));
                }
            }
        }
        break;
    }
    case QUANT_IQ4_XS: {
        float scale[8], ms = 0.0f;
        for (int j = 0; j < 8; j++) {
            scale[j] = signed_absmax(x + j * 32, 32) / (float)g_iq4nl[0];
            if (fabsf(scale[j]) > fabsf(ms))
                ms = scale[j];
        }
        wr16(b, ms / -32.0f);
        float d = rd16(b);
        uint16_t sh = 0;
        for (int j = 0; j < 8; j++) {
            int sc = d == 0.0f ? 0 : clampi((int)lrintf(scale[j] / d), -32, 31);
            int u = sc + 32;
            b[4 + j / 2] |= (uint8_t)((u & 0xf) << (4 * (j % 2)));
            sh |= (uint16_t)(((u >> 4) & 3) << (2 * j));
            float dl = d * (float)sc, id = dl == 0.0f ? 0.0f : 1.0f / dl;
            for (int l = 0; l < 32; l++) {
                float v = x[j * 32 + l] * id;
                int best = 0;
                for (int k = 1; k < 16; k++)
                    if (fabsf(v - g_iq4nl[k]) < fabsf(v - g_iq4nl[best]))
                        best = k;
                b[8 + j * 16 + l % 16] |= (uint8_t)(best << (4 * (l / 16)));
            }
        }
        memcpy(b + 2, &sh, 2);
        break;
    }
    }
}

int quant_quantize_row(uint32_t type, const float *src, void *dst, size_t n)
{
    const struct qtraits *t = traits(type);
    if (!t || n % t->values)
        return RKV_EINVAL;
    uint8_t *d = dst;
    switch (type) {
    case QUANT_F32: memcpy(dst, src, n * 4); return 0;
    case QUANT_F16:
        for (size_t i = 0; i < n; i++)
            wr16(d + 2 * i, src[i]);
        return 0;
    case QUANT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t x;
            memcpy(&x, &src[i], 4);
            if ((x & 0x7fffffff) > 0x7f800000)
                x = (x & 0xffff0000) | (64u << 16); /* quiet NaN, as ggml */
            else
                x = x + 0x7fff + ((x >> 16) & 1);
            uint16_t h = (uint16_t)(x >> 16);
            memcpy(d + 2 * i, &h, 2);
        }
        return 0;
    }
    for (size_t i = 0; i < n / t->values; i++) {
        if (t->values == QUANT_QK)
            q_block32(type, src + i * QUANT_QK, d + i * t->bytes);
        else
            q_block256(type, src + i * QUANT_QK_K, d + i * t->bytes);
    }
    return 0;
}
