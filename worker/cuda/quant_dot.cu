/* quant_dot.cu - decode matmuls (n <= 8 tokens) over block-type weights by integer dots: the
 * activations rounded to 8 bits in shared memory as the cpu backend rounds them, the weights'
 * levels read 16 bytes a lane and multiplied four at a time (dp4a). */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/gemv.cuh"
#include "worker/cuda/quant.cuh"

/*
 * The activation rows are worker/cpu/cpu_quant.c's: per block of blk values (256 for the
 * 256-value types, else 32) a scale d = amax / 127 and levels round(x * 127 / amax), half to
 * even, and per 16 values the sum of the levels. Each weight block's integer sums are the
 * cpu's exactly; the float part is the cpu's formula over a lane's share of the block, summed
 * in a different order (a few ulp of the row's result).
 *
 * A block is read by LPB lanes (its parts), so a warp reads 32 / LPB neighbouring blocks at
 * once; a CTA's eight warps take the rows of one tile after the CTA rounded the activations
 * into shared memory. Launched with programmatic serialization: the first weights are in
 * flight before the activations of the kernel before are waited for.
 */

#define QD_WARPS  8
#define QD_UNROLL 4

/* the activation rows in shared memory: q (n, K) int8, d (n, K / blk) f32, s (n, K / 16) i16 */
struct qd_act {
    const int8_t *q;
    const float *d;
    const int16_t *s;
    uint32_t k; /* values a row */
};

/* 8 and 16 activation bytes in one shared load (i a multiple of 8, 16): a lane's words of a part
 * in one instruction rather than two or four, with fewer bank conflicts */
__device__ __forceinline__ uint2 qd_x8(const int8_t *q, uint32_t i)
{
    return *(const uint2 *)(q + i);
}

__device__ __forceinline__ uint4 qd_x16(const int8_t *q, uint32_t i)
{
    return *(const uint4 *)(q + i);
}

/* 4 bytes at a 2-aligned address */
__device__ __forceinline__ uint32_t qd_ld2(const uint8_t *p)
{
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
}

__device__ __forceinline__ float qd_h2f(uint32_t u)
{
    return __half2float(__ushort_as_half((unsigned short)(u & 0xffff)));
}

/* bits 0..3 of b to bit 4 of bytes 0..3 */
__device__ __forceinline__ uint32_t qd_bit4(uint32_t b)
{
    return ((b & 1) | (b & 2) << 7 | (b & 4) << 14 | (b & 8) << 21) << 4;
}

/* the four nibbles' levels of ggml's iq4_nl table, one a byte (v: four nibbles, one a byte) */
__device__ __forceinline__ int qd_iq4_lut(uint32_t v)
{
    /* kvalues_iq4nl: -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113 */
    const uint32_t t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;
    const uint32_t sel = v & 0x07070707u;
    const uint32_t sel16 = (sel & 0xFFu) | (sel >> 8 & 0xFFu) << 4 | (sel >> 16 & 0xFFu) << 8 |
                           (sel >> 24 & 0xFFu) << 12;
    const uint32_t lo = __byte_perm(t0, t1, sel16), hi = __byte_perm(t2, t3, sel16);
    const uint32_t h = v & 0x08080808u; /* the upper half's bytes */
    const uint32_t pick =
        (h >> 3 & 1) << 2 | (h >> 11 & 1) << 6 | (h >> 19 & 1) << 10 | (h >> 27 & 1) << 14;
    return (int)__byte_perm(lo, hi, 0x3210u + pick);
}

/* the types, each: LPB (lanes a block), its part's registers, load and dot */
template <int T> struct qd;

/* Q4_0 / IQ4_NL: 18 bytes (d, 16 bytes of nibbles: value j low, value j + 16 high); a part is 8
 * of the nibble bytes, values [8p, 8p + 8) and [16 + 8p, 24 + 8p) */
/* a block of an f16 scale then level bytes: a part's scale and its 8 bytes [8p, 8p + 8) */
struct qd_d8 {
    struct raw {
        uint32_t w[2], d;
    };
    static __device__ __forceinline__ void load(raw &r, const uint8_t *b, int p)
    {
        r.d = __ldg((const uint16_t *)b);
        r.w[0] = qd_ld2(b + 2 + 8 * p);
        r.w[1] = qd_ld2(b + 6 + 8 * p);
    }
};

template <int T> struct qd_nl : qd_d8 {
    static constexpr int LPB = 2;
    static __device__ __forceinline__ float dot(const raw &r, const qd_act &x, uint32_t blk, int p)
    {
        const uint32_t i = blk * 32 + 8 * p;
        const uint2 x0 = qd_x8(x.q, i), x1 = qd_x8(x.q, i + 16);
        const uint32_t xl[2] = {x0.x, x0.y}, xh[2] = {x1.x, x1.y};
        int s = 0;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t lo = r.w[k] & 0x0F0F0F0Fu, hi = r.w[k] >> 4 & 0x0F0F0F0Fu;
            int a = T == QUANT_IQ4_NL ? qd_iq4_lut(lo) : (int)__vsub4(lo, 0x08080808u);
            int c = T == QUANT_IQ4_NL ? qd_iq4_lut(hi) : (int)__vsub4(hi, 0x08080808u);
            s = __dp4a(a, (int)xl[k], s);
            s = __dp4a(c, (int)xh[k], s);
        }
        return __fmul_rn(__fmul_rn(qd_h2f(r.d), x.d[blk]), (float)s);
    }
};
template <> struct qd<QUANT_Q4_0> : qd_nl<QUANT_Q4_0> {
};
template <> struct qd<QUANT_IQ4_NL> : qd_nl<QUANT_IQ4_NL> {
};

/* Q4_1 / Q5_0 / Q5_1: d (and m), the fifth bits qh, 16 nibble bytes; parts as Q4_0's */
template <int T> struct qd_32 {
    static constexpr int LPB = 2;
    static constexpr int MIN = T != QUANT_Q5_0, FIVE = T != QUANT_Q4_1;
    static constexpr int QS = 2 + 2 * MIN + 4 * FIVE; /* the nibbles' offset */
    struct raw {
        uint32_t w[2], dm, qh;
    };
    static __device__ __forceinline__ void load(raw &r, const uint8_t *b, int p)
    {
        r.dm = MIN ? qd_ld2(b) : __ldg((const uint16_t *)b);
        r.qh = FIVE ? qd_ld2(b + 2 + 2 * MIN) : 0;
        r.w[0] = qd_ld2(b + QS + 8 * p);
        r.w[1] = qd_ld2(b + QS + 4 + 8 * p);
    }
    static __device__ __forceinline__ float dot(const raw &r, const qd_act &x, uint32_t blk, int p)
    {
        const uint32_t i = blk * 32 + 8 * p;
        const uint2 x0 = qd_x8(x.q, i), x1 = qd_x8(x.q, i + 16);
        const uint32_t xl[2] = {x0.x, x0.y}, xh[2] = {x1.x, x1.y};
        int s = 0, sx = 0;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t lo = r.w[k] & 0x0F0F0F0Fu, hi = r.w[k] >> 4 & 0x0F0F0F0Fu;
            if (FIVE) {
                lo |= qd_bit4(r.qh >> (8 * p + 4 * k) & 15);
                hi |= qd_bit4(r.qh >> (16 + 8 * p + 4 * k) & 15);
                if (!MIN) {
                    lo = __vsub4(lo, 0x10101010u);
                    hi = __vsub4(hi, 0x10101010u);
                }
            }
            const int xa = (int)xl[k], xb = (int)xh[k];
            s = __dp4a((int)lo, xa, s);
            s = __dp4a((int)hi, xb, s);
            if (MIN) {
                sx = __dp4a(0x01010101, xa, sx);
                sx = __dp4a(0x01010101, xb, sx);
            }
        }
        const float dx = x.d[blk];
        float t = __fmul_rn(__fmul_rn(qd_h2f(r.dm), dx), (float)s);
        if (MIN)
            t = __fadd_rn(t, __fmul_rn(__fmul_rn(qd_h2f(r.dm >> 16), dx), (float)sx));
        return t;
    }
};
template <> struct qd<QUANT_Q4_1> : qd_32<QUANT_Q4_1> {
};
template <> struct qd<QUANT_Q5_0> : qd_32<QUANT_Q5_0> {
};
template <> struct qd<QUANT_Q5_1> : qd_32<QUANT_Q5_1> {
};

/* Q8_0: 34 bytes (d, 32 int8); a part is 8 of them */
template <> struct qd<QUANT_Q8_0> : qd_d8 {
    static constexpr int LPB = 4;
    static __device__ __forceinline__ float dot(const raw &r, const qd_act &x, uint32_t blk, int p)
    {
        const uint2 xv = qd_x8(x.q, blk * 32 + 8 * p);
        int s = __dp4a((int)r.w[0], (int)xv.x, 0);
        s = __dp4a((int)r.w[1], (int)xv.y, s);
        return __fmul_rn(__fmul_rn(qd_h2f(r.d), x.d[blk]), (float)s);
    }
};

/* a Q4_K / Q5_K sub-block's 6-bit scale and min from the header h (its 12 scale bytes sc in
 * h.y, h.z, h.w; j a lane's own value, so shifts rather than indexing) */
__device__ __forceinline__ void qd_k_sm(const uint4 &h, int j, int &s, int &m)
{
    const int sh = 8 * (j & 3);
    const int y = h.y >> sh & 0xff, z = h.z >> sh & 0xff, w = h.w >> sh & 0xff;
    if (j < 4) {
        s = y & 63; /* sc[j] */
        m = z & 63; /* sc[j + 4] */
    } else {
        s = (w & 15) | (y >> 6) << 4; /* sc[j + 4], sc[j - 4] */
        m = (w >> 4) | (z >> 6) << 4; /* sc[j + 4], sc[j] */
    }
}

/* Q4_K / Q5_K: 16 header bytes (d, dmin, 12 of scales), Q5_K's 32 bytes of fifth bits, 128 of
 * nibbles; part t of 8 is nibble bytes [16t, 16t + 16): sub-blocks 2j (low) and 2j + 1 (high)
 * of j = t / 2 at their values [16 (t % 2), + 16) */
template <int T> struct qd_k45 {
    static constexpr int LPB = 8, FIVE = T == QUANT_Q5_K;
    struct raw {
        uint4 h, q, qh;
    };
    static __device__ __forceinline__ void load(raw &r, const uint8_t *b, int p)
    {
        r.h = __ldg((const uint4 *)b);
        r.q = __ldcs((const uint4 *)(b + 16 + 32 * FIVE + 16 * p));
        if (FIVE)
            r.qh = __ldcs((const uint4 *)(b + 16 + 16 * (p & 1)));
    }
    static __device__ __forceinline__ float dot(const raw &r, const qd_act &x, uint32_t blk, int p)
    {
        const int j = p >> 1, k0 = 16 * (p & 1);
        int sl, ml, sh, mh;
        qd_k_sm(r.h, 2 * j, sl, ml);
        qd_k_sm(r.h, 2 * j + 1, sh, mh);
        const uint32_t i = blk * 256 + 64 * j + k0;
        const uint32_t w[4] = {r.q.x, r.q.y, r.q.z, r.q.w},
                       hb[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
        const uint4 x0 = qd_x16(x.q, i), x1 = qd_x16(x.q, i + 32);
        const uint32_t xl[4] = {x0.x, x0.y, x0.z, x0.w}, xh[4] = {x1.x, x1.y, x1.z, x1.w};
        int dl = 0, dh = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = w[k] & 0x0F0F0F0Fu, hi = w[k] >> 4 & 0x0F0F0F0Fu;
            if (FIVE) {
                lo |= (hb[k] >> (2 * j) & 0x01010101u) << 4;
                hi |= (hb[k] >> (2 * j + 1) & 0x01010101u) << 4;
            }
            dl = __dp4a((int)lo, (int)xl[k], dl);
            dh = __dp4a((int)hi, (int)xh[k], dh);
        }
        const int isum = sl * dl + sh * dh;
        const int imin = ml * x.s[i / 16] + mh * x.s[(i + 32) / 16];
        const float dx = x.d[blk];
        const float t = __fmul_rn(__fmul_rn(qd_h2f(r.h.x), dx), (float)isum);
        return __fsub_rn(t, __fmul_rn(__fmul_rn(qd_h2f(r.h.x >> 16), dx), (float)imin));
    }
};
template <> struct qd<QUANT_Q4_K> : qd_k45<QUANT_Q4_K> {
};
template <> struct qd<QUANT_Q5_K> : qd_k45<QUANT_Q5_K> {
};

/* Q6_K: 210 bytes (128 of low nibbles ql, 64 of high pairs qh, 16 int8 scales, d); part t of 8
 * is half hf = t / 4 at l in [8 (t % 4), + 8): values 128 hf + l + {0, 32, 64, 96} */
template <> struct qd<QUANT_Q6_K> {
    static constexpr int LPB = 8;
    struct raw {
        uint32_t a[2], b[2], h[2], sc, d;
    };
    static __device__ __forceinline__ void load(raw &r, const uint8_t *b, int p)
    {
        const int hf = p >> 2, l0 = 8 * (p & 3);
        const uint8_t *ql = b + 64 * hf + l0, *qh = b + 128 + 32 * hf + l0;
        r.a[0] = qd_ld2(ql);
        r.a[1] = qd_ld2(ql + 4);
        r.b[0] = qd_ld2(ql + 32);
        r.b[1] = qd_ld2(ql + 36);
        r.h[0] = qd_ld2(qh);
        r.h[1] = qd_ld2(qh + 4);
        const uint8_t *sc = b + 192 + 8 * hf + l0 / 16;
        r.sc = (uint32_t)__ldg(sc) | (uint32_t)__ldg(sc + 2) << 8 | (uint32_t)__ldg(sc + 4) << 16 |
               (uint32_t)__ldg(sc + 6) << 24;
        r.d = __ldg((const uint16_t *)(b + 208));
    }
    static __device__ __forceinline__ float dot(const raw &r, const qd_act &x, uint32_t blk, int p)
    {
        const int hf = p >> 2, l0 = 8 * (p & 3);
        const uint32_t i = blk * 256 + 128 * hf + l0;
        int g[4] = {0, 0, 0, 0};
        const uint2 x0 = qd_x8(x.q, i), x1 = qd_x8(x.q, i + 32), x2 = qd_x8(x.q, i + 64),
                    x3 = qd_x8(x.q, i + 96);
        const uint32_t xs[4][2] = {{x0.x, x0.y}, {x1.x, x1.y}, {x2.x, x2.y}, {x3.x, x3.y}};
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const uint32_t a = r.a[k], b = r.b[k], h = r.h[k];
            const uint32_t v0 = (a & 0x0F0F0F0Fu) | (h & 0x03030303u) << 4;
            const uint32_t v1 = (b & 0x0F0F0F0Fu) | (h >> 2 & 0x03030303u) << 4;
            const uint32_t v2 = (a >> 4 & 0x0F0F0F0Fu) | (h >> 4 & 0x03030303u) << 4;
            const uint32_t v3 = (b >> 4 & 0x0F0F0F0Fu) | (h >> 6 & 0x03030303u) << 4;
            g[0] = __dp4a((int)__vsub4(v0, 0x20202020u), (int)xs[0][k], g[0]);
            g[1] = __dp4a((int)__vsub4(v1, 0x20202020u), (int)xs[1][k], g[1]);
            g[2] = __dp4a((int)__vsub4(v2, 0x20202020u), (int)xs[2][k], g[2]);
            g[3] = __dp4a((int)__vsub4(v3, 0x20202020u), (int)xs[3][k], g[3]);
        }
        int isum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++)
            isum += (int)(int8_t)(r.sc >> (8 * k) & 0xff) * g[k];
        return __fmul_rn(__fmul_rn(qd_h2f(r.d), x.d[blk]), (float)isum);
    }
};

/* IQ4_XS: 136 bytes (d, 2 bytes of high scale bits, 4 of low, 128 of nibbles); part t of 8 is
 * sub-block t: its 16 nibble bytes, values [32t, 32t + 16) low and [32t + 16, 32t + 32) high */
template <> struct qd<QUANT_IQ4_XS> {
    static constexpr int LPB = 8;
    struct raw {
        uint2 h;
        uint4 q;
    };
    static __device__ __forceinline__ void load(raw &r, const uint8_t *b, int p)
    {
        r.h = __ldg((const uint2 *)b);
        const uint2 *q = (const uint2 *)(b + 8 + 16 * p);
        const uint2 q0 = __ldcs(q), q1 = __ldcs(q + 1);
        r.q = make_uint4(q0.x, q0.y, q1.x, q1.y);
    }
    static __device__ __forceinline__ float dot(const raw &r, const qd_act &x, uint32_t blk, int p)
    {
        const int sc = (int)((r.h.y >> (4 * p) & 15) | (r.h.x >> (16 + 2 * p) & 3) << 4) - 32;
        const uint32_t i = blk * 256 + 32 * p;
        const uint32_t w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const uint4 x0 = qd_x16(x.q, i), x1 = qd_x16(x.q, i + 16);
        const uint32_t xl[4] = {x0.x, x0.y, x0.z, x0.w}, xh[4] = {x1.x, x1.y, x1.z, x1.w};
        int s = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s = __dp4a(qd_iq4_lut(w[k] & 0x0F0F0F0Fu), (int)xl[k], s);
            s = __dp4a(qd_iq4_lut(w[k] >> 4 & 0x0F0F0F0Fu), (int)xh[k], s);
        }
        return __fmul_rn(__fmul_rn(qd_h2f(r.h.x), x.d[blk]), (float)(sc * s));
    }
};

/* --- the activations ------------------------------------------------------------------------ */

/* bytes of the shared activation rows of n tokens of k values (blk values a scale) */
__host__ __device__ __forceinline__ size_t qd_act_bytes(uint32_t n, uint32_t k, uint32_t blk)
{
    return (size_t)n * k + (size_t)n * (k / blk) * 4 + (size_t)n * (k / 16) * 2;
}

/* rounds x (n, k) f32 into the shared rows as cpu_quant.c's qx_quantize does: a thread 8
 * values, blk / 8 threads a scale's block (within one warp) */
template <int BLK>
__device__ __forceinline__ qd_act qd_round(uint8_t *sm, const float *x, uint32_t n, uint32_t k)
{
    constexpr int G = BLK / 8; /* threads a block */
    int8_t *q = (int8_t *)sm;
    float *d = (float *)(sm + (size_t)n * k);
    int16_t *s = (int16_t *)(sm + (size_t)n * k + (size_t)n * (k / BLK) * 4);
    /* whole warps go round (the shuffles), lanes past the end with zeros */
    const uint32_t chunks = n * k / 8, warps_end = (chunks + 31) / 32 * 32;
    for (uint32_t c = threadIdx.x; c < warps_end; c += blockDim.x) {
        const bool on = c < chunks;
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 a = on ? ((const float4 *)x)[2 * c] : z,
                     b = on ? ((const float4 *)x)[2 * c + 1] : z;
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float f = fabsf(v[i]);
            amax = f > amax ? f : amax; /* NaN is passed over */
        }
#pragma unroll
        for (int o = 1; o < G; o <<= 1) {
            const float f = __shfl_xor_sync(0xffffffff, amax, o);
            amax = f > amax ? f : amax;
        }
        float id = 127.0f / amax;
        id = amax > 0.0f && id <= 3.4e38f ? id : 0.0f;
        uint32_t pk[2] = {0, 0};
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float f = __fmul_rn(v[i], id);
            if (!(f >= -127.0f))
                f = -127.0f;
            if (f > 127.0f)
                f = 127.0f;
            const int l = __float2int_rn(f);
            sum += l;
            pk[i / 4] |= (uint32_t)(l & 0xff) << (8 * (i % 4));
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        if (!on)
            continue;
        ((uint2 *)q)[c] = make_uint2(pk[0], pk[1]);
        if ((c & 1) == 0)
            s[c / 2] = (int16_t)sum;
        if (c % G == 0)
            d[c / G] = amax / 127.0f;
    }
    return qd_act{q, d, s, k};
}

/* --- the kernel ----------------------------------------------------------------------------- */

/* y (n, n_out) = x (n, k) . w^T + bias for rows [R blockIdx.x, + R) */
template <int T, int NT>
__global__ void __launch_bounds__(QD_WARPS * 32)
    quant_dot_kernel(const uint8_t *w, size_t row_bytes, const float *x, uint32_t k, float *y,
                     uint32_t n_out, const float *bias, uint32_t n, uint32_t rows)
{
    extern __shared__ __align__(16) uint8_t qd_sm[];
    using Q = qd<T>;
    constexpr int BV = qfmt<T>::values, BB = qfmt<T>::bytes, BPW = 32 / Q::LPB;
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t part = lane % Q::LPB, sub = lane / Q::LPB, nb = k / BV;
    const uint32_t r0 = blockIdx.x * rows, r1 = min(r0 + rows, n_out);
    uint32_t row = r0 + warp;

    /* the first unrolled weights of the warp's first row, before the activations are ready */
    typename Q::raw r[QD_UNROLL];
    auto load_row = [&](uint32_t rr, uint32_t b0) {
        const uint8_t *wr = w + (size_t)rr * row_bytes;
#pragma unroll
        for (int u = 0; u < QD_UNROLL; u++) {
            const uint32_t b = b0 + u * BPW + sub;
            if (b < nb)
                Q::load(r[u], wr + (size_t)b * BB, (int)part);
        }
    };
    if (row < r1)
        load_row(row, 0);
    cuda_grid_wait();
    qd_act xa[NT];
    {
        const qd_act a = qd_round < BV == 256 ? 256 : 32 > (qd_sm, x, n, k);
#pragma unroll
        for (int t = 0; t < NT; t++)
            xa[t] = qd_act{a.q + (size_t)t * k, a.d + (size_t)t * (k / BV),
                           a.s + (size_t)t * (k / 16), k};
    }
    __syncthreads();

    for (; row < r1; row += QD_WARPS) {
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[t] = 0.0f;
        for (uint32_t b0 = 0; b0 < nb; b0 += QD_UNROLL * BPW) {
            if (b0)
                load_row(row, b0);
#pragma unroll
            for (int u = 0; u < QD_UNROLL; u++) {
                const uint32_t b = b0 + u * BPW + sub;
                if (b < nb) {
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (t < (int)n)
                            acc[t] += Q::dot(r[u], xa[t], b, (int)part);
                }
            }
        }
        gemv_store<NT>(acc, y, n_out, row, bias, n, lane);
        if (row + QD_WARPS < r1)
            load_row(row + QD_WARPS, 0);
    }
}

/* 1 for the types quant_dot_kernel has */
static int qd_has(int t)
{
    switch (t) {
    case QUANT_Q4_0:
    case QUANT_Q4_1:
    case QUANT_Q5_0:
    case QUANT_Q5_1:
    case QUANT_Q8_0:
    case QUANT_Q4_K:
    case QUANT_Q5_K:
    case QUANT_Q6_K:
    case QUANT_IQ4_NL:
    case QUANT_IQ4_XS: return 1;
    default: return 0;
    }
}

template <int T> struct qd_has_t : std::integral_constant<bool, false> {
};
#define QD_HAS(t)                                                                                  \
    template <> struct qd_has_t<t> : std::integral_constant<bool, true> {                          \
    };
QD_HAS(QUANT_Q4_0)
QD_HAS(QUANT_Q4_1)
QD_HAS(QUANT_Q5_0)
QD_HAS(QUANT_Q5_1)
QD_HAS(QUANT_Q8_0)
QD_HAS(QUANT_Q4_K)
QD_HAS(QUANT_Q5_K)
QD_HAS(QUANT_Q6_K)
QD_HAS(QUANT_IQ4_NL)
QD_HAS(QUANT_IQ4_XS)
#undef QD_HAS

struct qd_launch {
    template <int T>
    static void run(const struct cuda_ctx *c, const struct be_tensor *w, const float *in,
                    float *out, const float *bias, uint32_t n, uint32_t nt, cudaError_t *err)
    {
        if constexpr (qd_has_t<T>::value) {
            constexpr int BV = qfmt<T>::values;
            const size_t smem = qd_act_bytes(nt, w->cols, BV == 256 ? 256 : 32);
            /* tiles of rows: two or more CTAs an SM where the matrix has them, at least 8
             * rows a tile so the activations' rounding is shared */
            const uint32_t sms = c->n_sm ? (uint32_t)c->n_sm : 132;
            uint32_t rows = (w->rows + 2 * sms - 1) / (2 * sms);
            rows = rows < QD_WARPS ? QD_WARPS : rows > 4 * QD_WARPS ? 4 * QD_WARPS : rows;
            const dim3 grid((w->rows + rows - 1) / rows), block(QD_WARPS * 32);
            const uint8_t *wp = (const uint8_t *)w->data;
            gemv_nt(nt, [&](auto k) {
                auto fn = quant_dot_kernel<T, decltype(k)::value>;
                if (smem > 48 * 1024)
                    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
                *err = cuda_launch_pdl(c, fn, grid, block, smem, c->stream, wp, w->row_bytes, in,
                                       w->cols, out, w->rows, bias, n, rows);
            });
        }
    }
};

int cuda_quant_dot(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                   const float *bias, uint32_t n)
{
    if (n == 0)
        return 0;
    const uint32_t bv = quant_block_values((uint32_t)w->type);
    /* the 256-value types load 16-byte words, but for Q6_K (210-byte blocks) and IQ4_XS (136:
     * 8-byte words) rows of any block count are aligned enough */
    if (n > 8 || !qd_has((int)w->type) || !bv || w->cols % (bv == 256 ? 256 : 32) ||
        ((uintptr_t)w->data & 15) ||
        (bv == 256 && w->row_bytes % 16 && w->type != BE_Q6_K && w->type != BE_IQ4_XS))
        return 1;
    /* token counts rounded up to 1, 2, 4, 8 instantiations (deterministic: always 8); the
     * activation rows of the instantiation's tokens must fit in shared memory */
    const uint32_t nt = c->deterministic ? 8 : n <= 2 ? n : n <= 4 ? 4 : 8;
    if (qd_act_bytes(nt, w->cols, bv == 256 ? 256 : 32) > 200 * 1024)
        return 1;
    cudaError_t err = cudaSuccess;
    quant_dispatch<qd_launch>((int)w->type, (const struct cuda_ctx *)c, w, in, out, bias, n, nt,
                              &err);
    CU_TRY(err);
    return 0;
}
