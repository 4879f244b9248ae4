/* sample.cu - token sampling on the device: each row's penalties, greedy pick, top-k, top-p,
 * min-p and temperature draw as worker/sample.c's sampler_sample, bit for bit, so a sampled
 * step sends back a token and a few numbers a row instead of its logits.
 *
 * sample.c's arithmetic is copied, not approximated: the same exp polynomial (fma where the
 * avx2 build fuses), float sums of eight strided lanes in each 64-block then the same tree,
 * double sums across blocks in block order, the same double bucket math for top-p. The top-p
 * buckets' double masses are exact whatever the order of their terms (a bucket's weights are
 * within a factor 1.09 of each other, so 2^17 of them need 42 of the 53 bits), so they are
 * summed as integers by shared-memory atomics (32-bit ones, native on sm_90, with a carry
 * word). What the cpu takes from libm (log) stays on the host: the
 * row brings log(min_p), and the logprobs come from raw_max / raw_sum there.
 *
 * One block of 1024 threads a row, or, for a step of few rows (the sample_cl_rows knob), a
 * cluster of sample_cl blocks a row: each block streams its share of every pass over
 * the vocab and gathers the others' partials from their shared memory (the max, the 64-block
 * sums, the integer bucket masses, each tile's kept counts), then computes the same in-order
 * totals from them as one block would, so every block takes the same path to the same bits;
 * the cut bucket's sort and walk run in the row's first block. Rows with top_k, min_p or
 * top logprobs take one block of the cluster. Each pass over the vocab loads ahead (vector loads,
 * several in flight a thread) and computes the weights again rather than reading them back, and the
 * kept tokens are compacted a warp at a time so stores form runs. A row's logits are penalized in
 * place for the pick and put back before the kernel ends. Rows it cannot take (top_k or a top-p cut
 * bucket above SMP_SORT_MAX tokens, a vocab past 262144) come back with status 1, and the host
 * samples their logits. */
#include <cooperative_groups.h>
#include <float.h>

#include "worker/cuda/cuda_ops.cuh"
#include "worker/sample.h"

#define SMP_THREADS  1024
#define SMP_WARPS    (SMP_THREADS / 32)
#define SMP_SORT_MAX 8192 /* candidates sorted in shared memory: top_k, a top-p cut bucket */
#define SMP_BLOCK    64   /* sample.c's EXP_BLOCK */
#define SMP_BUCKETS  1024 /* sample.c's TOP_P_BUCKETS */
#define SMP_FLOOR    -87.0f
#define SMP_BSUM_MAX 4096 /* 64-block sums in shared memory: vocabs to 262144 (larger: host) */
#define SMP_TILE     (8 * SMP_THREADS) /* the top-p collect's tile of tokens */
#define SMP_TILES    (SMP_BSUM_MAX * SMP_BLOCK / SMP_TILE)
#define SMP_CL_MAX   8 /* blocks a row at most (the portable cluster size) */

namespace cg = cooperative_groups;

/* a row as the kernel reads it (cuda_sample_row, uploaded with the penalty ids) */
struct smp_row {
    float temperature, top_p, min_p, rep, pres, freq;
    int32_t top_k, n_top;
    double log_min_p, u;
    uint32_t row;  /* its row of logits */
    uint32_t pen0; /* its penalty ids at pen[pen0 ..] */
    uint32_t n_pen;
    uint32_t pad;
};

struct smp_sh {
    unsigned long long sort[SMP_SORT_MAX]; /* (desc key << 32 | id), ascending */
    float gw[SMP_SORT_MAX];                /* weights gathered for a sequential walk */
    float bs[SMP_BSUM_MAX];                /* 64-block sums */
    double pre[SMP_BSUM_MAX + 1];          /* their running total before each, in order */
    double mass[SMP_BUCKETS];
    uint32_t mlo[SMP_BUCKETS], mhi[SMP_BUCKETS]; /* the masses in their buckets' units, as the
                                                  * low and high words of 64-bit sums */
    double unit[SMP_BUCKETS];              /* those units, 2^smp_unit(b) */
    double uscale[SMP_BUCKETS];            /* and their inverses */
    unsigned long long *st;                /* the row's phase stamps (RKV_DEBUG_SAMPLE_STAMPS) */
    struct smp_row row; /* read from here, not held in registers through the kernel */
    uint32_t hist[256];
    uint32_t tc[SMP_TILES][2]; /* a cluster's collect: each tile's tokens above / in the cut */
    uint32_t to[SMP_TILES][2]; /* and the counts of the tiles before it */
    uint32_t cx;               /* a block's partial for a cluster-wide least */
    uint32_t wa[SMP_WARPS], wb[SMP_WARPS];
    double d[4];
    float f[4];
    uint32_t u[8];
};

#define SMP_STAMPS 16 /* phase stamps a row (RKV_DEBUG_SAMPLE_STAMPS) */

/* the blocks taking part in a row's passes: this one is r of n (n 1: the block alone) */
struct smp_g {
    uint32_t r, n;
};

/* every thread of the row's n blocks; a no-op for a block alone. barrier.cluster's arrive
 * releases and its wait acquires at cluster scope: the blocks' shared and global writes before
 * it are seen after it */
__device__ __forceinline__ void smp_csync(const smp_g g)
{
    if (g.n > 1)
        cg::this_cluster().sync();
}

/* p in block q's shared memory (the same offset) */
template <typename T> __device__ __forceinline__ T *smp_at(T *p, uint32_t q)
{
    return cg::this_cluster().map_shared_rank(p, q);
}

__device__ __forceinline__ void smp_stamp(smp_sh &sh, int k)
{
    if (threadIdx.x == 0 && sh.st) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        sh.st[k] = t;
    }
}

/* --- sample.c's scalar pieces ---------------------------------------------------------- */

__device__ __forceinline__ float smp_sanitize(float v)
{
    if (isnan(v))
        return -INFINITY;
    if (v > FLT_MAX)
        return FLT_MAX;
    return v;
}

/* exp(x) for x <= 0 as sample.c's exp_neg with fma (its avx2 build): 0 below -87 and for nan */
__device__ __forceinline__ float smp_exp_neg(float x)
{
    if (!(x >= SMP_FLOOR))
        return 0.0f;
    x = x < 0.0f ? x : 0.0f;
    const float n = rintf(__fmul_rn(x, 1.44269504f));
    const float r = __fmaf_rn(-n, 1.42860677e-6f, __fmaf_rn(-n, 0.693145752f, x));
    float q = __fmaf_rn(r, 1.0f / 720, 1.0f / 120);
    q = __fmaf_rn(q, r, 1.0f / 24);
    q = __fmaf_rn(q, r, 1.0f / 6);
    q = __fmaf_rn(q, r, 0.5f);
    q = __fmaf_rn(q, r, 1.0f);
    q = __fmaf_rn(q, r, 1.0f);
    return __fmul_rn(q, __uint_as_float((uint32_t)((int32_t)n + 127) << 23));
}

__device__ __forceinline__ float smp_weight(float x, float shift, float scale)
{
    return smp_exp_neg(__fmul_rn(__fsub_rn(x, shift), scale));
}

/* the float order key, descending, -0 as +0 (sample.c's desc_key) */
__device__ __forceinline__ uint32_t smp_desc_key(float v)
{
    uint32_t u = __float_as_uint(__fadd_rn(v, 0.0f));
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ~u;
}

__device__ __forceinline__ uint32_t smp_ord(float v)
{
    uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float smp_of_ord(uint32_t u)
{
    return __uint_as_float((u & 0x80000000u) ? u & 0x7fffffffu : ~u);
}

__device__ __forceinline__ int smp_bucket(float v, float mx)
{
    const double scale = (SMP_BUCKETS - 1) / -(double)SMP_FLOOR;
    const double b = __dmul_rn(__dsub_rn((double)mx, (double)v), scale);
    return b < SMP_BUCKETS - 1 ? (int)b : SMP_BUCKETS - 1;
}

/* the exponent of bucket b's integer unit: 22 below the binade two under the bucket's nominal
 * least weight exp(-(b + 1) * 87 / 1023) */
__device__ __forceinline__ int smp_unit(uint32_t b)
{
    return (int)floor(-(double)(b + 1) * (-(double)SMP_FLOOR / (SMP_BUCKETS - 1)) / M_LN2) - 2 - 22;
}

/* the least float v with bucket(v) < b (sample.c's bucket_floor) */
__device__ float smp_bucket_floor(float mx, int b)
{
    if (b <= 0)
        return INFINITY;
    if (b >= SMP_BUCKETS)
        return -INFINITY;
    uint32_t lo = smp_ord(-FLT_MAX), hi = smp_ord(mx);
    if (smp_bucket(-FLT_MAX, mx) < b)
        return -FLT_MAX;
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (smp_bucket(smp_of_ord(mid), mx) < b)
            hi = mid;
        else
            lo = mid;
    }
    return smp_of_ord(hi);
}

/* the smallest float f with (double)f >= d */
__device__ __forceinline__ float smp_at_least(double d)
{
    float f = __double2float_rn(d);
    if ((double)f < d)
        f = nextafterf(f, INFINITY);
    return f;
}

/* four floats from x[i ..] (fill past n): one 16-byte load when vec (x 16-byte aligned) and
 * all four are in the row */
__device__ __forceinline__ float4 smp_ld4(const float *x, uint32_t i, uint32_t n, bool vec,
                                          float fill)
{
    if (vec && i + 4 <= n)
        return *(const float4 *)(x + i);
    float4 r;
    r.x = i < n ? x[i] : fill;
    r.y = i + 1 < n ? x[i + 1] : fill;
    r.z = i + 2 < n ? x[i + 2] : fill;
    r.w = i + 3 < n ? x[i + 3] : fill;
    return r;
}

__device__ __forceinline__ bool smp_aligned(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* bucket b's mass += q: a 32-bit shared atomic (native, where a 64-bit add is not), its carry
 * into the high word by the thread whose add wrapped */
__device__ __forceinline__ void smp_mass_add(smp_sh &sh, uint32_t b, uint32_t q)
{
    const uint32_t old = atomicAdd(&sh.mlo[b], q);
    if (old + q < old)
        atomicAdd(&sh.mhi[b], 1u);
}

/* --- block-wide pieces (every thread calls them) ------------------------------------------ */

/* the cross-warp stage of a block scan: sh.wa / sh.wb hold each warp's totals on entry
 * and each warp's exclusive offset on return; the block's totals land in sh.u[6], sh.u[7] */
__device__ void smp_scan_warps(smp_sh &sh)
{
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (warp == 0) {
        uint32_t s = sh.wa[lane], t = sh.wb[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t ps = __shfl_up_sync(0xffffffffu, s, o);
            const uint32_t pt = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= (uint32_t)o) {
                s += ps;
                t += pt;
            }
        }
        sh.wa[lane] = s - sh.wa[lane];
        sh.wb[lane] = t - sh.wb[lane];
        if (lane == 31) {
            sh.u[6] = s;
            sh.u[7] = t;
        }
    }
    __syncthreads();
}

/* exclusive prefix over the block's threads of two 0/1 flags; totals to ta, tb */
__device__ void smp_scan2(smp_sh &sh, bool a, bool b, uint32_t &pa, uint32_t &pb, uint32_t &ta,
                          uint32_t &tb)
{
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ma = __ballot_sync(0xffffffffu, a), mb = __ballot_sync(0xffffffffu, b);
    const unsigned lt = (1u << lane) - 1;
    if (lane == 0) {
        sh.wa[warp] = __popc(ma);
        sh.wb[warp] = __popc(mb);
    }
    smp_scan_warps(sh);
    pa = sh.wa[warp] + __popc(ma & lt);
    pb = sh.wb[warp] + __popc(mb & lt);
    ta = sh.u[6];
    tb = sh.u[7];
    __syncthreads();
}

/* the least v over the block's threads; every thread gets it */
__device__ uint32_t smp_min(smp_sh &sh, uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh.wa[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        uint32_t w = sh.wa[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1)
            w = min(w, __shfl_xor_sync(0xffffffffu, w, o));
        if (threadIdx.x == 0)
            sh.u[0] = w;
    }
    __syncthreads();
    const uint32_t r = sh.u[0];
    __syncthreads();
    return r;
}

/* the least v over the threads of the row's blocks; every thread gets it */
__device__ uint32_t smp_cmin(smp_sh &sh, const smp_g g, uint32_t v)
{
    uint32_t r = smp_min(sh, v);
    if (g.n == 1)
        return r;
    if (threadIdx.x == 0)
        sh.cx = r;
    smp_csync(g);
    if (threadIdx.x == 0) {
        for (uint32_t q = 0; q < g.n; q++)
            r = min(r, *smp_at(&sh.cx, q));
        sh.u[0] = r;
    }
    smp_csync(g); /* every block's reads of cx are done, and u[0] is seen by its threads */
    r = sh.u[0];
    __syncthreads();
    return r;
}

/* max of x[0..n), nan skipped (-inf when none); every thread gets it. the max as the least
 * complement of the float order (the sign of a zero max does not matter to its users) */
__device__ float smp_max(smp_sh &sh, const smp_g g, const float *x, uint32_t n)
{
    const bool vec = smp_aligned(x);
    float m = -INFINITY;
#pragma unroll 8
    for (uint32_t i = 4 * (g.r * SMP_THREADS + threadIdx.x); i < n; i += 4 * SMP_THREADS * g.n) {
        const float4 v = smp_ld4(x, i, n, vec, -INFINITY);
        m = v.x > m ? v.x : m;
        m = v.y > m ? v.y : m;
        m = v.z > m ? v.z : m;
        m = v.w > m ? v.w : m;
    }
    return smp_of_ord(~smp_cmin(sh, g, ~smp_ord(m)));
}

/* the first i with x[i] == v, or n */
__device__ uint32_t smp_find(smp_sh &sh, const smp_g g, const float *x, uint32_t n, float v)
{
    uint32_t first = n;
    for (uint32_t i = g.r * SMP_THREADS + threadIdx.x; i < n; i += SMP_THREADS * g.n)
        if (x[i] == v) {
            first = i;
            break;
        }
    return smp_cmin(sh, g, first);
}

/* sample.c's argmax: the first index of the max (nan never wins; 0 when all are nan) */
__device__ uint32_t smp_argmax(smp_sh &sh, const smp_g g, const float *x, uint32_t n)
{
    const uint32_t i = smp_find(sh, g, x, n, smp_max(sh, g, x, n));
    return i < n ? i : 0;
}

/* sample.c's exp_weights: w[i] = exp((x[i] - shift) * scale) (w may be null), sh.bs[b] the
 * float sum of 64-block b (full blocks as its eight avx2 lanes and their tree, the last part
 * block in order), the total over the blocks in order in double. every thread gets it. the
 * row's blocks take 256 64-blocks in turn (the last part block is the first one's), then each
 * copies the others' sums and adds them all up in order itself */
__device__ double smp_exp_weights(smp_sh &sh, const smp_g g, const float *x, uint32_t n,
                                  float shift, float scale, float *w)
{
    const uint32_t nb = (n + SMP_BLOCK - 1) / SMP_BLOCK, full = n / SMP_BLOCK;
    /* four threads a 64-block: thread q holds avx2 lanes 2q and 2q + 1, so each of its eight
     * rows of the block is one 8-byte load, all eight issued before the first exp */
    const bool vec = smp_aligned(x) && (!w || smp_aligned(w));
    const uint32_t gi = threadIdx.x >> 2, q = threadIdx.x & 3;
    for (uint32_t b0 = g.r * (SMP_THREADS / 4); b0 < full; b0 += g.n * (SMP_THREADS / 4)) {
        const uint32_t b = b0 + gi;
        float a0 = 0.0f, a1 = 0.0f;
        if (b < full) {
            const uint32_t base = b * SMP_BLOCK + 2 * q;
            float2 xv[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                xv[j] = vec ? *(const float2 *)(x + base + j * 8)
                            : make_float2(x[base + j * 8], x[base + j * 8 + 1]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 e = make_float2(smp_weight(xv[j].x, shift, scale),
                                             smp_weight(xv[j].y, shift, scale));
                if (w) {
                    if (vec) {
                        *(float2 *)(w + base + j * 8) = e;
                    } else {
                        w[base + j * 8] = e.x;
                        w[base + j * 8 + 1] = e.y;
                    }
                }
                a0 = __fadd_rn(a0, e.x);
                a1 = __fadd_rn(a1, e.y);
            }
        }
        /* hsum8's order: s_k = lane k + lane k + 4 (threads 0, 1 take 2, 3's), then
         * (s0 + s2) + (s1 + s3) */
        const float s0 = __fadd_rn(a0, __shfl_down_sync(0xffffffffu, a0, 2));
        const float s1 = __fadd_rn(a1, __shfl_down_sync(0xffffffffu, a1, 2));
        const float u0 = __fadd_rn(s0, __shfl_down_sync(0xffffffffu, s0, 1));
        const float u1 = __fadd_rn(s1, __shfl_down_sync(0xffffffffu, s1, 1));
        if (b < full && q == 0)
            sh.bs[b] = __fadd_rn(u0, u1);
    }
    if (full < nb && threadIdx.x == 0 && g.r == 0) {
        float a = 0.0f;
        for (uint32_t i = full * SMP_BLOCK; i < n; i++) {
            const float e = smp_weight(x[i], shift, scale);
            if (w)
                w[i] = e;
            a = __fadd_rn(a, e);
        }
        sh.bs[full] = a;
    }
    __syncthreads();
    if (g.n > 1) {
        smp_csync(g);
        for (uint32_t b = threadIdx.x; b < nb; b += SMP_THREADS) {
            const uint32_t q = b < full ? b / (SMP_THREADS / 4) % g.n : 0;
            if (q != g.r)
                sh.bs[b] = *smp_at(&sh.bs[b], q);
        }
        smp_csync(g); /* no block writes its sums again before every copy is done */
    }
    if (threadIdx.x == 0) {
        /* in order, one add after another; eight sums are loaded ahead of their adds */
        double t = 0.0;
        uint32_t b = 0;
        for (; b + 8 <= nb; b += 8) {
            const float4 a = *(const float4 *)&sh.bs[b], c = *(const float4 *)&sh.bs[b + 4];
            const float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
            double p[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                p[k] = t;
                t = __dadd_rn(t, (double)v[k]);
            }
#pragma unroll
            for (int k = 0; k < 8; k++)
                sh.pre[b + k] = p[k];
        }
        for (; b < nb; b++) {
            sh.pre[b] = t;
            t = __dadd_rn(t, (double)sh.bs[b]);
        }
        sh.pre[nb] = t;
        sh.d[0] = t;
    }
    __syncthreads();
    const double t = sh.d[0];
    __syncthreads();
    return t;
}

/* the bitonic network's stages j = j0 .. 1 of merge size k over a warp's 256 keys in
 * registers: thread t holds positions 8t .. 8t + 7; j >= 8 pairs lanes by shuffles, j < 8
 * pairs a thread's own keys */
__device__ __forceinline__ void smp_sort_regs(unsigned long long (&a)[8], uint32_t k, uint32_t j0)
{
    const uint32_t t = threadIdx.x, lane = t & 31;
    for (uint32_t j = j0; j >= 8; j >>= 1) {
        const uint32_t lm = j >> 3;
        const bool upper = (lane & lm) != 0; /* this thread holds the pair's higher position */
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const bool up = ((8 * t + r) & k) == 0; /* ascending there */
            const unsigned long long o = __shfl_xor_sync(0xffffffffu, a[r], lm);
            a[r] = (up != upper) ? min(a[r], o) : max(a[r], o);
        }
    }
#pragma unroll
    for (uint32_t j = 4; j >= 1; j >>= 1) {
        if (j > j0)
            continue;
#pragma unroll
        for (int r = 0; r < 8; r++)
            if ((r & j) == 0) {
                const bool up = ((8 * t + r) & k) == 0;
                const unsigned long long lo = min(a[r], a[r | j]), hi = max(a[r], a[r | j]);
                a[r] = up ? lo : hi;
                a[r | j] = up ? hi : lo;
            }
    }
}

/* sorts sh.sort[0..m) ascending (m <= SMP_SORT_MAX; bitonic over the next power of two, at
 * least 8): merges up to 256 keys in each warp's registers, longer ones through shared memory
 * down to j = 256 and then in registers again. not inlined: its 16 registers of keys spill
 * the callers' loops otherwise (64 a thread at 1024 threads) */
__device__ __noinline__ void smp_sort(smp_sh &sh, uint32_t m)
{
    uint32_t p = 8;
    while (p < m)
        p <<= 1;
    const uint32_t t = threadIdx.x;
    const bool on = (t >> 5) < (p + 255) / 256; /* whole warps: their shuffles need all lanes */
    unsigned long long a[8];
#pragma unroll
    for (int r = 0; r < 8; r++)
        a[r] = ~0ull;
    if (on) {
#pragma unroll
        for (int r = 0; r < 8; r++)
            if (8 * t + r < m)
                a[r] = sh.sort[8 * t + r];
        for (uint32_t k = 2; k <= p && k <= 256; k <<= 1)
            smp_sort_regs(a, k, k >> 1);
    }
    for (uint32_t k = 512; k <= p; k <<= 1) {
        __syncthreads(); /* every read of the positions this thread writes is done */
        if (on)
#pragma unroll
            for (int r = 0; r < 8; r++)
                sh.sort[8 * t + r] = a[r];
        __syncthreads();
        for (uint32_t j = k >> 1; j >= 256; j >>= 1) {
            for (uint32_t q = t; q < p / 2; q += SMP_THREADS) {
                const uint32_t lo = ((q & ~(j - 1)) << 1) | (q & (j - 1)), hi = lo | j;
                const unsigned long long x = sh.sort[lo], y = sh.sort[hi];
                if ((x > y) == ((lo & k) == 0)) {
                    sh.sort[lo] = y;
                    sh.sort[hi] = x;
                }
            }
            __syncthreads();
        }
        if (on) {
#pragma unroll
            for (int r = 0; r < 8; r++)
                a[r] = sh.sort[8 * t + r];
            smp_sort_regs(a, k, 128);
        }
    }
    __syncthreads();
    if (on)
#pragma unroll
        for (int r = 0; r < 8; r++)
            sh.sort[8 * t + r] = a[r];
    __syncthreads();
}

/* the k best of v[0..n) (sanitized, higher first, ties to the lower id; k <= SMP_SORT_MAX,
 * k <= n) into x / ids best first: a radix select of the k-th key, then the keys below it
 * and the first of its ties, sorted */
__device__ void smp_top_k(smp_sh &sh, const float *v, uint32_t n, uint32_t k, float *x,
                          int32_t *ids)
{
    uint32_t prefix = 0, mask = 0, want = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint32_t i = threadIdx.x; i < 256; i += SMP_THREADS)
            sh.hist[i] = 0;
        __syncthreads();
        for (uint32_t t0 = 0; t0 < n; t0 += SMP_THREADS) {
            /* one atomic a digit a warp: near-equal logits share their high digits */
            const uint32_t i = t0 + threadIdx.x;
            uint32_t d = 256;
            if (i < n) {
                const uint32_t key = smp_desc_key(smp_sanitize(v[i]));
                if ((key & mask) == prefix)
                    d = (key >> shift) & 255;
            }
            const unsigned peers = __match_any_sync(0xffffffffu, d);
            if (d < 256 && (threadIdx.x & 31) == (uint32_t)(__ffs(peers) - 1))
                atomicAdd(&sh.hist[d], (uint32_t)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t cum = 0, d = 0;
            for (; d < 255 && cum + sh.hist[d] < want; d++)
                cum += sh.hist[d];
            sh.u[0] = d;
            sh.u[1] = want - cum;
        }
        __syncthreads();
        prefix |= sh.u[0] << shift;
        mask |= 255u << shift;
        want = sh.u[1];
        __syncthreads();
    }
    /* keys below prefix: k - want of them, all taken; of those equal, the first want */
    const uint32_t n_lt = k - want;
    uint32_t base_lt = 0, base_eq = 0;
    for (uint32_t t0 = 0; t0 < n; t0 += SMP_THREADS) {
        const uint32_t i = t0 + threadIdx.x;
        uint32_t key = 0;
        if (i < n)
            key = smp_desc_key(smp_sanitize(v[i]));
        const bool lt = i < n && key < prefix, eq = i < n && key == prefix;
        uint32_t pl, pe, tl, te;
        smp_scan2(sh, lt, eq, pl, pe, tl, te);
        if (lt)
            sh.sort[base_lt + pl] = ((unsigned long long)key << 32) | i;
        else if (eq && base_eq + pe < want)
            sh.sort[n_lt + base_eq + pe] = ((unsigned long long)key << 32) | i;
        base_lt += tl;
        base_eq += te;
    }
    __syncthreads();
    smp_sort(sh, k);
    for (uint32_t j = threadIdx.x; j < k; j += SMP_THREADS) {
        const int32_t id = (int32_t)(sh.sort[j] & 0xffffffffu);
        x[j] = smp_sanitize(v[id]);
        ids[j] = id;
    }
    __syncthreads();
}

/* the entries of (v, id)[0..n) with v >= f into (x, ids) in order (id null: the index);
 * in place when x == v. returns the count */
__device__ uint32_t smp_keep(smp_sh &sh, const float *v, const int32_t *id, uint32_t n, float f,
                             float *x, int32_t *ids)
{
    uint32_t base = 0;
    for (uint32_t t0 = 0; t0 < n; t0 += SMP_THREADS) {
        const uint32_t i = t0 + threadIdx.x;
        float val = 0.0f;
        int32_t who = 0;
        bool keep = false;
        if (i < n) {
            val = v[i];
            who = id ? id[i] : (int32_t)i;
            keep = val >= f;
        }
        uint32_t p, q, t, u;
        smp_scan2(sh, keep, false, p, q, t, u); /* every read of the tile before a write */
        if (keep) {
            x[base + p] = val;
            ids[base + p] = who;
        }
        base += t;
    }
    __syncthreads();
    return base;
}

/* sample.c's draw_index over x[0..n) (max mx, which the caller knows) at 1 / temperature
 * with the row's u. *drew 0 when an infinite max decides without a draw */
__device__ uint32_t smp_draw(smp_sh &sh, const smp_g g, const float *x, uint32_t n, float mx,
                             float temperature, double u, int32_t *drew)
{
    smp_stamp(sh, 10);
    *drew = 0;
    if (mx == -INFINITY)
        return 0;
    if (mx == INFINITY)
        return smp_find(sh, g, x, n, INFINITY);
    const float scale = __fdiv_rn(1.0f, temperature);
    const double total = smp_exp_weights(sh, g, x, n, mx, scale, nullptr);
    smp_stamp(sh, 11);
    *drew = 1;
    /* sample.c's walk over the blocks, from the running totals: the first block with weight
     * whose total passes t (its sum before it is acc), else the last block with weight (acc
     * past it, or before it when it is the last block) */
    const double t = __dmul_rn(u, total);
    const uint32_t nb = (n + SMP_BLOCK - 1) / SMP_BLOCK;
    uint32_t first = ~0u, last = ~0u;
    for (uint32_t b = threadIdx.x; b < nb; b += SMP_THREADS)
        if (sh.bs[b] > 0.0f) {
            if (first == ~0u && t < sh.pre[b + 1])
                first = b;
            last = ~(b + 1); /* the largest b + 1 as the least ~(b + 1); none: ~0u */
        }
    first = smp_min(sh, first);
    last = ~smp_min(sh, last); /* 0: no block has weight, else the last one + 1 */
    if (threadIdx.x == 0) {
        uint32_t pick = 0;
        double acc = 0.0;
        if (first != ~0u) {
            pick = first;
            acc = sh.pre[first];
        } else if (last != 0u) {
            pick = last - 1;
            acc = pick + 1 < nb ? sh.pre[pick + 1] : sh.pre[pick];
        }
        sh.u[1] = pick;
        sh.d[2] = acc;
        sh.d[3] = t;
    }
    __syncthreads();
    /* the picked block's weights (the same exps again) into shared memory, then the walk
     * inside it */
    const uint32_t b0 = sh.u[1] * SMP_BLOCK, end = min(n, b0 + SMP_BLOCK);
    if (threadIdx.x < end - b0)
        sh.gw[threadIdx.x] = smp_weight(x[b0 + threadIdx.x], mx, scale);
    __syncthreads();
    if (threadIdx.x == 0) {
        double acc = sh.d[2];
        const double t = sh.d[3];
        uint32_t last = b0, got = n;
        for (uint32_t i = b0; i < end; i++) {
            const float e = sh.gw[i - b0];
            if (!(e > 0.0f))
                continue;
            last = i;
            acc = __dadd_rn(acc, (double)e);
            if (t < acc) {
                got = i;
                break;
            }
        }
        sh.u[0] = got < n ? got : last;
    }
    __syncthreads();
    smp_stamp(sh, 12);
    const uint32_t r = sh.u[0];
    __syncthreads();
    return r;
}

/* one thread: acc plus sh.gw[0..n) in order until it reaches want; how many it took (n when
 * it never does). eight weights are loaded ahead of their adds */
__device__ uint32_t smp_walk(smp_sh &sh, uint32_t n, double acc, double want)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float4 a = *(const float4 *)&sh.gw[i], c = *(const float4 *)&sh.gw[i + 4];
        const float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        double p[8]; /* the eight running sums first, then their tests (off the add chain) */
#pragma unroll
        for (int k = 0; k < 8; k++) {
            acc = __dadd_rn(acc, (double)v[k]);
            p[k] = acc;
        }
        if (acc >= want) {
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (p[k] >= want)
                    return i + k + 1;
        }
    }
    for (; i < n; i++) {
        acc = __dadd_rn(acc, (double)sh.gw[i]);
        if (acc >= want)
            return i + 1;
    }
    return n;
}

/* sample.c's top_p_sorted over x[0..n) sorted best first */
__device__ uint32_t smp_top_p_sorted(smp_sh &sh, const float *x, uint32_t n, float top_p, float *w)
{
    if (n == 0 || x[0] == -INFINITY)
        return n;
    const smp_g one = {0, 1};
    const double want = __dmul_rn((double)top_p, smp_exp_weights(sh, one, x, n, x[0], 1.0f, w));
    for (uint32_t i = threadIdx.x; i < n; i += SMP_THREADS)
        sh.gw[i] = w[i]; /* n <= SMP_SORT_MAX (a top-k) */
    __syncthreads();
    if (threadIdx.x == 0)
        sh.u[0] = smp_walk(sh, n, 0.0, want);
    __syncthreads();
    const uint32_t r = sh.u[0];
    __syncthreads();
    return r;
}

/* one tile of the top-p collect from token t0: warp k takes 256 consecutive tokens (eight a
 * lane, 32 apart, so every load and store of a warp is one run), the warps' counts scanned
 * once. the tokens above the cut to (x, ids) from position front in id order, the cut
 * bucket's keys to sort from position m (those past SMP_SORT_MAX dropped: the caller gives
 * the row back); with write false only the counts. the tile's two counts to th, tl */
__device__ __forceinline__ void smp_collect_tile(smp_sh &sh, const float *v, uint32_t n, float mx,
                                                 float above, float at, uint32_t t0, uint32_t front,
                                                 uint32_t m, bool write, float *x, int32_t *ids,
                                                 unsigned long long *sort, uint32_t &th,
                                                 uint32_t &tl)
{
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned lt = (1u << lane) - 1;
    const uint32_t c0 = t0 + warp * 256 + lane;
    float ve[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t i = c0 + 32 * k;
        ve[k] = i < n ? v[i] : -INFINITY;
    }
    unsigned ma[8], mc[8]; /* the warp's tokens above the cut / in it, row k */
    uint32_t nh = 0, nl = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        /* a weight above 0 (smp_exp_neg's floor), not past n */
        const bool live = __fsub_rn(ve[k], mx) >= SMP_FLOOR;
        ma[k] = __ballot_sync(0xffffffffu, live && ve[k] >= above);
        mc[k] = __ballot_sync(0xffffffffu, live && ve[k] < above && ve[k] >= at);
        nh += __popc(ma[k]);
        nl += __popc(mc[k]);
    }
    __syncwarp(); /* the lanes' reads of the last tile's offsets are done */
    if (lane == 0) {
        sh.wa[warp] = nh;
        sh.wb[warp] = nl;
    }
    smp_scan_warps(sh);
    uint32_t ph = front + sh.wa[warp], pl = m + sh.wb[warp];
    th = sh.u[6];
    tl = sh.u[7];
    if (!write)
        return;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t i = c0 + 32 * k;
        if ((ma[k] >> lane) & 1) {
            const uint32_t p = ph + __popc(ma[k] & lt);
            x[p] = ve[k];
            ids[p] = (int32_t)i;
        } else if ((mc[k] >> lane) & 1) {
            const uint32_t p = pl + __popc(mc[k] & lt);
            if (p < SMP_SORT_MAX)
                sort[p] = ((unsigned long long)smp_desc_key(ve[k]) << 32) | i;
        }
        ph += __popc(ma[k]);
        pl += __popc(mc[k]);
    }
}

/* sample.c's top_p_vocab over v[0..n) (max mx, finite): the kept tokens into (x, ids), those
 * of buckets above the cut in id order, then the cut bucket's prefix best first; total: the
 * weights' at mx. each pass computes the weights again from v (cheaper than reading them). ~0u: the
 * cut bucket is too large here. the row's blocks take the masses' tokens and the collect's
 * tiles in turn; the first block sorts and walks the cut bucket. not inlined, so the kernel's
 * own live values do not spill its loops */
__device__ __noinline__ uint32_t smp_top_p_vocab(smp_sh &sh, const smp_g g, const float *v,
                                                 uint32_t n, float mx, float top_p, double total,
                                                 float *x, int32_t *ids)
{
    const double want = __dmul_rn((double)top_p, total);
    /* each bucket's mass exactly, as integers: bucket b's weights lie within a factor 1.09
     * of each other, so in units of 2^(smp_unit(b)) each is an integer below 2^27 (one binade
     * of slack below the nominal least weight); a bucket's sum fits 2^44 (2^47 over 8 blocks) */
    for (uint32_t b = threadIdx.x; b < SMP_BUCKETS; b += SMP_THREADS) {
        sh.mlo[b] = 0;
        sh.mhi[b] = 0;
        const int u = smp_unit(b); /* 2^u and 2^-u, exact doubles: scaling by them is exact */
        sh.uscale[b] = ldexp(1.0, -u);
        sh.unit[b] = ldexp(1.0, u);
    }
    if (threadIdx.x == 0)
        sh.u[2] = 0;
    __syncthreads();
    /* four tokens a thread a pass, by one 16-byte load; their weights computed again */
    const bool vec = smp_aligned(v);
    bool inexact = false;
#pragma unroll 2
    for (uint32_t i0 = 4 * (g.r * SMP_THREADS + threadIdx.x); i0 < n; i0 += 4 * SMP_THREADS * g.n) {
        const float4 va = smp_ld4(v, i0, n, vec, -INFINITY);
        const float ve[4] = {va.x, va.y, va.z, va.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float e = smp_weight(ve[k], mx, 1.0f); /* 0 past n */
            if (e > 0.0f) {
                const uint32_t b = (uint32_t)smp_bucket(ve[k], mx);
                const double sc = __dmul_rn((double)e, sh.uscale[b]);
                const uint32_t q = (uint32_t)sc;
                inexact |= sc >= 4294967296.0 || (double)q != sc;
                smp_mass_add(sh, b, q);
            }
        }
    }
    if (inexact)
        sh.u[2] = 1;
    __syncthreads();
    if (g.n == 1) {
        if (sh.u[2])
            return ~0u; /* a weight off its bucket's grid: the host samples the row */
        for (uint32_t b = threadIdx.x; b < SMP_BUCKETS; b += SMP_THREADS)
            sh.mass[b] =
                __dmul_rn((double)(((unsigned long long)sh.mhi[b] << 32) | sh.mlo[b]), sh.unit[b]);
    } else {
        /* the blocks' integer masses summed: exact, so the same as one block's */
        smp_csync(g);
        for (uint32_t b = threadIdx.x; b < SMP_BUCKETS; b += SMP_THREADS) {
            unsigned long long t = 0;
            for (uint32_t q = 0; q < g.n; q++)
                t += ((unsigned long long)*smp_at(&sh.mhi[b], q) << 32) | *smp_at(&sh.mlo[b], q);
            sh.mass[b] = __dmul_rn((double)t, sh.unit[b]);
        }
        if (threadIdx.x == 0) {
            uint32_t any = 0;
            for (uint32_t q = 0; q < g.n; q++)
                any |= *smp_at(&sh.u[2], q);
            sh.u[3] = any;
        }
        smp_csync(g); /* every read of the others' masses is done */
        if (sh.u[3])
            return ~0u;
    }
    __syncthreads();
    smp_stamp(sh, 5);
    if (threadIdx.x == 0) {
        double acc = 0.0;
        int cut = SMP_BUCKETS - 1;
        for (int b = 0; b < SMP_BUCKETS; b++) {
            if (__dadd_rn(acc, sh.mass[b]) >= want) {
                cut = b;
                break;
            }
            acc = __dadd_rn(acc, sh.mass[b]);
        }
        sh.d[1] = acc;
        sh.f[1] = smp_bucket_floor(mx, cut);
        sh.f[2] = smp_bucket_floor(mx, cut + 1);
    }
    __syncthreads();
    smp_stamp(sh, 6);
    const float above = sh.f[1], at = sh.f[2];
    uint32_t front = 0, m = 0, th, tl;
    if (g.n == 1) {
        for (uint32_t t0 = 0; t0 < n; t0 += SMP_TILE) {
            smp_collect_tile(sh, v, n, mx, above, at, t0, front, m, true, x, ids, sh.sort, th, tl);
            front += th;
            m += tl;
        }
        __syncthreads();
    } else {
        /* each block counts its tiles, then every block has every tile's offsets, and each
         * writes its own tiles there: the cut bucket's keys into the first block's sort */
        const uint32_t nt = (n + SMP_TILE - 1) / SMP_TILE;
        for (uint32_t ti = g.r; ti < nt; ti += g.n) {
            smp_collect_tile(sh, v, n, mx, above, at, ti * SMP_TILE, 0, 0, false, x, ids, sh.sort,
                             th, tl);
            if (threadIdx.x == 0) {
                sh.tc[ti][0] = th;
                sh.tc[ti][1] = tl;
            }
        }
        smp_csync(g);
        if (threadIdx.x == 0) {
            uint32_t a = 0, c = 0;
            for (uint32_t ti = 0; ti < nt; ti++) {
                const uint32_t q = ti % g.n;
                sh.to[ti][0] = a;
                sh.to[ti][1] = c;
                a += *smp_at(&sh.tc[ti][0], q);
                c += *smp_at(&sh.tc[ti][1], q);
            }
            sh.u[4] = a;
            sh.u[5] = c;
        }
        smp_csync(g); /* every read of the counts is done; the offsets are seen */
        front = sh.u[4];
        m = sh.u[5];
        if (m <= SMP_SORT_MAX) {
            unsigned long long *sort = smp_at(sh.sort, 0);
            for (uint32_t ti = g.r; ti < nt; ti += g.n)
                smp_collect_tile(sh, v, n, mx, above, at, ti * SMP_TILE, sh.to[ti][0], sh.to[ti][1],
                                 true, x, ids, sort, th, tl);
        }
        smp_csync(g); /* the kept tokens and the keys are seen by every block */
    }
    smp_stamp(sh, 7);
    if (m > SMP_SORT_MAX)
        return ~0u;
    uint32_t r = 0;
    if (g.r == 0) {
        smp_sort(sh, m);
        smp_stamp(sh, 8);
        for (uint32_t j = threadIdx.x; j < m; j += SMP_THREADS)
            sh.gw[j] = smp_weight(v[sh.sort[j] & 0xffffffffu], mx, 1.0f);
        __syncthreads();
        if (threadIdx.x == 0)
            sh.u[0] = smp_walk(sh, m, sh.d[1], want);
        smp_stamp(sh, 9);
        __syncthreads();
        r = sh.u[0];
        for (uint32_t j = threadIdx.x; j < r; j += SMP_THREADS) {
            const uint32_t id = (uint32_t)(sh.sort[j] & 0xffffffffu);
            x[front + j] = v[id];
            ids[front + j] = (int32_t)id;
        }
    }
    if (g.n > 1) {
        smp_csync(g); /* the first block's count and its tokens */
        if (g.r != 0 && threadIdx.x == 0)
            sh.u[0] = *smp_at(&sh.u[0], 0);
        smp_csync(g); /* read before the first block writes u[0] again */
        r = sh.u[0];
    }
    __syncthreads();
    return front + r;
}

/* --- the kernel -------------------------------------------------------------------------- */

struct smp_scratch {
    float *w;     /* (rows, SMP_SORT_MAX) a top-k list's weights */
    float *x;     /* (rows, n_vocab) kept logits */
    int32_t *ids; /* (rows, n_vocab) their ids */
};

/* cl blocks a row (a cluster of cl, or 1): block blockIdx.x % cl of row blockIdx.x / cl */
__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel(float *logits, uint32_t n, const struct smp_row *rows, const int32_t *pen,
                  float *saved, struct smp_scratch s, struct sample_dev_out *outs,
                  unsigned long long *stamps, uint32_t cl)
{
    extern __shared__ __align__(16) unsigned char smem[];
    smp_sh &sh = *(smp_sh *)smem;
    const uint32_t row = blockIdx.x / cl;
    smp_g g = {cl > 1 ? cg::this_cluster().block_rank() : 0, cl};
    if (threadIdx.x == 0) {
        sh.st = stamps && g.r == 0 ? stamps + (size_t)row * SMP_STAMPS : nullptr;
        sh.row = rows[row];
    }
    __syncthreads();
    smp_stamp(sh, 0);
    const struct smp_row &r = sh.row;
    /* the paths a cluster shares: the greedy pick, a draw over the vocab, top-p over it;
     * the rest (top_k, min_p, top logprobs) run in the first block alone */
    const bool greedy = r.temperature == 0.0f || r.top_k == 1;
    if (g.n > 1 &&
        (r.n_top > 0 || (!greedy && (r.min_p > 0.0f || (r.top_k > 0 && (uint32_t)r.top_k < n))))) {
        if (g.r)
            return;
        g.n = 1;
    }
    float *v = logits + (size_t)r.row * n;
    float *w = s.w + (size_t)row * SMP_SORT_MAX, *x = s.x + (size_t)row * n;
    int32_t *ids = s.ids + (size_t)row * n;
    struct sample_dev_out *o = outs + row;
    if ((n + SMP_BLOCK - 1) / SMP_BLOCK > SMP_BSUM_MAX) {
        /* more 64-blocks than shared memory holds: the host samples the row */
        if (threadIdx.x == 0 && g.r == 0) {
            memset(o, 0, sizeof(*o));
            o->status = 1;
        }
        return;
    }

    /* the raw logits' max, weight sum and best few, for the logprobs */
    const float raw_max = smp_max(sh, g, v, n), mxs = smp_sanitize(raw_max);
    smp_stamp(sh, 1);
    double raw_sum = 0.0;
    if (mxs != -INFINITY)
        raw_sum = smp_exp_weights(sh, g, v, n, mxs, 1.0f, nullptr);
    smp_stamp(sh, 2);
    const uint32_t n_top = min((uint32_t)r.n_top, n);
    if (n_top) {
        smp_top_k(sh, v, n, n_top, x, ids);
        if (threadIdx.x < n_top) {
            o->top_id[threadIdx.x] = ids[threadIdx.x];
            o->top_v[threadIdx.x] = x[threadIdx.x];
        }
    }
    /* penalties in place (sample.c's sampler_penalize), by the first block; the raw values
     * are put back below */
    const int32_t *pid = pen + 2 * r.pen0, *pcnt = pid + r.n_pen;
    float *sv = saved + r.pen0;
    for (uint32_t j = threadIdx.x; j < r.n_pen && g.r == 0; j += SMP_THREADS) {
        const float l0 = v[pid[j]];
        sv[j] = l0;
        float l = l0 <= 0.0f ? __fmul_rn(l0, r.rep) : __fdiv_rn(l0, r.rep);
        l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)pcnt[j], r.freq), r.pres));
        v[pid[j]] = l;
    }
    __syncthreads();
    if (r.n_pen)
        smp_csync(g); /* the other blocks read the penalized logits */
    smp_stamp(sh, 3);

    int32_t id = 0, drew = 0, status = 0;
    const bool top_k = r.top_k > 0 && (uint32_t)r.top_k < n;
    if (greedy) {
        id = (int32_t)smp_argmax(sh, g, v, n);
    } else if (!top_k && r.top_p >= 1.0f && r.min_p <= 0.0f) {
        id = (int32_t)smp_draw(sh, g, v, n, r.n_pen ? smp_max(sh, g, v, n) : raw_max, r.temperature,
                               r.u, &drew);
    } else {
        uint32_t cnt = 0;
        float mx;
        bool done = false;
        if (top_k) {
            if ((uint32_t)r.top_k > SMP_SORT_MAX) {
                status = 1;
                done = true;
            } else {
                cnt = (uint32_t)r.top_k;
                smp_top_k(sh, v, n, cnt, x, ids);
                if (r.top_p < 1.0f)
                    cnt = smp_top_p_sorted(sh, x, cnt, r.top_p, w);
            }
            mx = x[0];
        } else {
            mx = r.n_pen ? smp_max(sh, g, v, n) : raw_max; /* no penalty: v is as it was */
            smp_stamp(sh, 4);
            if (mx == INFINITY || mx == -INFINITY) {
                id = (int32_t)smp_find(sh, g, v, n, mx);
                id = (uint32_t)id < n ? id : 0;
                done = true;
            } else if (r.top_p < 1.0f) {
                /* the raw pass's total serves when no penalty moved a logit */
                double total = raw_sum;
                if (r.n_pen)
                    total = smp_exp_weights(sh, g, v, n, mx, 1.0f, nullptr);
                cnt = smp_top_p_vocab(sh, g, v, n, mx, r.top_p, total, x, ids);
                if (cnt == ~0u) {
                    status = 1;
                    done = true;
                }
            } else {
                cnt = smp_keep(sh, v, nullptr, n, smp_at_least((double)mx + r.log_min_p), x, ids);
            }
        }
        if (!done) {
            if (r.min_p > 0.0f && (top_k || r.top_p < 1.0f))
                cnt = smp_keep(sh, x, ids, cnt, smp_at_least((double)mx + r.log_min_p), x, ids);
            /* x holds the best token kept (each filter keeps it), so its max is mx */
            const uint32_t k = smp_draw(sh, g, x, cnt, mx, r.temperature, r.u, &drew);
            id = ids[k];
        }
    }
    __syncthreads();
    smp_csync(g); /* every block is done with the logits and every other's shared memory */
    if (g.r)
        return;
    for (uint32_t j = threadIdx.x; j < r.n_pen; j += SMP_THREADS)
        v[pid[j]] = sv[j];
    __syncthreads();
    smp_stamp(sh, 13);
    if (threadIdx.x == 0) {
        o->id = id;
        o->status = status;
        o->drew = status ? 0 : drew;
        o->raw_max = raw_max;
        o->raw_sum = raw_sum;
        o->raw_logit = v[id];
        o->n_top = (int32_t)n_top;
    }
}

/* --- host side --------------------------------------------------------------------------- */

size_t cuda_sample_scratch(uint32_t n_rows, uint32_t n_vocab)
{
    /* each row's kept logits and ids (a vocab each) and a top-k list's weights */
    return (size_t)n_rows * ((size_t)n_vocab * 8 + SMP_SORT_MAX * 4);
}

size_t cuda_sample_stamps(void)
{
    return SMP_STAMPS;
}

size_t cuda_sample_row_bytes(void)
{
    return sizeof(struct smp_row);
}

void cuda_sample_row(void *dst, const struct sample_dev_row *r, uint32_t row, uint32_t pen0)
{
    struct smp_row d = {r->temperature,
                        r->top_p,
                        r->min_p,
                        r->repetition_penalty,
                        r->presence_penalty,
                        r->frequency_penalty,
                        r->top_k,
                        r->n_top,
                        r->log_min_p,
                        r->u,
                        row,
                        pen0,
                        r->n_pen,
                        0};
    memcpy(dst, &d, sizeof(d));
}

int cuda_sample(struct cuda_ctx *c, float *logits, uint32_t n_vocab, uint32_t n_rows,
                const void *d_rows, const int32_t *d_pen, float *d_saved, void *scratch,
                struct sample_dev_out *d_outs, unsigned long long *d_stamps)
{
    if (n_rows == 0)
        return 0;
    const size_t smem = sizeof(smp_sh);
    static int smem_set; /* the shared memory it may use, set once (as linear_stream.cu's) */
    if (!smem_set) {
        CU_TRY(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
        smem_set = 1;
    }
    char *p = (char *)scratch;
    struct smp_scratch s;
    s.w = (float *)p;
    p += (size_t)n_rows * SMP_SORT_MAX * 4;
    s.x = (float *)p;
    p += (size_t)n_rows * n_vocab * 4;
    s.ids = (int32_t *)p;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(SMP_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at = {};
    at.id = cudaLaunchAttributeClusterDimension;
    cfg.attrs = &at;
    /* cl blocks a row: a cluster of cl along x, or one block without the attribute */
    auto shape = [&](uint32_t cl) {
        cfg.gridDim = dim3(n_rows * cl);
        at.val.clusterDim.x = cl;
        at.val.clusterDim.y = 1;
        at.val.clusterDim.z = 1;
        cfg.numAttrs = cl > 1 ? 1 : 0;
    };
    auto launch = [&](uint32_t cl) {
        shape(cl);
        return cudaLaunchKernelEx(&cfg, sample_kernel, logits, n_vocab,
                                  (const struct smp_row *)d_rows, d_pen, d_saved, s, d_outs,
                                  d_stamps, cl);
    };
    /* a few rows: a cluster of blocks a row, when the gpu holds one (asked once a size) and
     * launches it (a sharing mode may refuse); else, and from then on, a block a row */
    const uint32_t cl = n_rows <= c->tune.sample_cl_rows ? c->tune.sample_cl : 1;
    static int cl_ok[SMP_CL_MAX + 1]; /* 0 not asked yet, 1 it runs, -1 refused (said once) */
    cudaError_t e = cudaErrorNotSupported;
    if (cl > 1 && cl_ok[cl] >= 0) {
        int k = 0;
        shape(cl);
        if (!cl_ok[cl] &&
            (e = cudaOccupancyMaxActiveClusters(&k, sample_kernel, &cfg)) == cudaSuccess && k < 1)
            e = cudaErrorLaunchOutOfResources;
        if (cl_ok[cl] || e == cudaSuccess)
            e = launch(cl);
        cl_ok[cl] = e == cudaSuccess ? 1 : -1;
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            rkv_log(RKV_LOG_WARN,
                    "cuda: sampling: this gpu does not run a cluster of %u blocks of %zu bytes "
                    "of shared memory (%s); one block a row from now on",
                    cl, smem, cudaGetErrorString(e));
        }
    }
    if (e != cudaSuccess)
        e = launch(1);
    CU_TRY(e);
    CU_LAUNCHED();
    return 0;
}
