/* attn_kernel.cuh - the paged attention kernels behind attn_decode.cu and attn_prefill.cu. */
#pragma once

#include <math.h>

#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/kv8.cuh"

#define ATTN_THREADS 128

/* what one launch reads; passed by value */
struct attn_kargs {
    const float *q;   /* (n_tokens, n_head*D) */
    const char *pool; /* device-visible base of the residency's pool */
    size_t block_bytes, k_off, v_off;
    uint32_t B, D, n_head, g, R; /* R: query rows per tile (tile tokens * g) */
    float scale;
    const int32_t *pos;               /* (n_tokens) */
    const struct cuda_seq_meta *seqs; /* (n_seqs) */
    const struct cuda_blk *blks;
    const struct cuda_qtile *qtiles;
    int res;
    uint32_t ups; /* chunk units per split */
    uint32_t n_tokens;
    float *part; /* (n_split, n_tokens, n_head, D + 2): unnormalized o, then m, l */
    /* the split merge folded into the launch (attn_merge_last); cnt NULL: the partials stay in
     * part for the block-order merge (attn_fixed) */
    uint32_t *cnt;    /* (n_qtiles, n_kv_head) thread blocks done, back to 0 after each launch */
    float *o, *m, *l; /* (n_tokens, n_head*D) normalized, (n_tokens, n_head) x2 */
    uint32_t window;  /* be_attn.window: 0, or keys at positions > p - window only */
};

/* a query at position p sees the key at kp: causal, and inside a sliding window (win 0: none) */
__device__ __forceinline__ bool attn_sees(long long kp, long long p, uint32_t win)
{
    return kp <= p && (win == 0 || kp > p - (long long)win);
}

__device__ __forceinline__ void attn_cp16(void *smem, const void *gmem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void attn_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void attn_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float attn_f(__half x)
{
    return __half2float(x);
}
__device__ __forceinline__ float attn_f(float x)
{
    return x;
}

/* where a thread block's key chunks come from: unit u of its split is chunk
 * u % cpb of block-list entry u / cpb (units are in position order). DT: the pools' 8-bit
 * kv dtype (KV_Q8, KV_FP8), whose rows load dequantized into f32 stages (T float), or 0 */
template <typename T, int CH, int DT = 0> struct attn_src {
    const struct cuda_blk *list;
    const char *pool;
    size_t block_bytes, k_off, v_off, head_off;
    uint32_t cpb, u0, u1, B, D, DP, rb; /* rb: bytes a row */
    long long max_pos;

    __device__ attn_src(const struct attn_kargs &a, const struct cuda_seq_meta &sq, uint32_t kvh,
                        uint32_t split, int max_pos_, uint32_t dp)
    {
        cpb = (a.B + CH - 1) / CH;
        list = a.blks + sq.list_off[a.res];
        uint32_t n_units = sq.list_len[a.res] * cpb;
        u0 = split * a.ups;
        u1 = min(n_units, u0 + a.ups);
        pool = a.pool;
        block_bytes = a.block_bytes;
        k_off = a.k_off;
        v_off = a.v_off;
        rb = DT ? a.D + kv8_scale_bytes(DT, a.D) : a.D * (uint32_t)sizeof(T);
        head_off = (size_t)kvh * a.B * rb;
        B = a.B;
        D = a.D;
        DP = dp;
        max_pos = max_pos_;
    }
    /* the unit's first key position, or -1 when it is past every query (and
     * so is everything after it) */
    __device__ long long start(uint32_t u) const
    {
        if (u >= u1)
            return -1;
        struct cuda_blk b = list[u / cpb];
        long long kp0 = (long long)b.j * B + (u % cpb) * CH;
        return kp0 > max_pos ? -1 : kp0;
    }
    /* keys of unit u (first key kp0) some query reads; later ones were never
     * written */
    __device__ uint32_t keys(uint32_t u, long long kp0) const
    {
        uint32_t c0 = (u % cpb) * CH;
        return (uint32_t)min((long long)min((uint32_t)CH, B - c0), max_pos - kp0 + 1);
    }
    /* 8-bit: the unit's nk rows of one slice from rows (each D levels, then its scales) as
     * f32 into d (CH, DP), four levels a thread a step; plain loads and stores, which the
     * barrier after the stage's wait (next) publishes like the copies */
    __device__ void load8(const char *rows, uint32_t nk, float *d) const
    {
        const uint32_t row_q = D / 4;
        for (uint32_t i = threadIdx.x; i < nk * row_q; i += ATTN_THREADS) {
            const uint32_t c = i / row_q, x = (i % row_q) * 4;
            const uint8_t *q = (const uint8_t *)rows + (size_t)c * rb + x;
            const char *s = rows + (size_t)c * rb + D;
            float4 f;
            if constexpr (DT == KV_Q8) {
                const float dq = kv8_bf16(s + x / 32 * 2);
                f = make_float4((float)(int8_t)q[0] * dq, (float)(int8_t)q[1] * dq,
                                (float)(int8_t)q[2] * dq, (float)(int8_t)q[3] * dq);
            } else {
                const float sf = *(const float *)s;
                f = make_float4(kv8_fp8_value(q[0], sf), kv8_fp8_value(q[1], sf),
                                kv8_fp8_value(q[2], sf), kv8_fp8_value(q[3], sf));
            }
            *(float4 *)(d + c * DP + x) = f;
        }
    }
    /* queues the unit's K and V rows into kd, vd (CH, DP) */
    __device__ void load(uint32_t u, T *kd, T *vd) const
    {
        if constexpr (DT != 0) {
            static_assert(std::is_same<T, float>::value, "8-bit kv loads into f32 stages");
            struct cuda_blk b = list[u / cpb];
            const uint32_t c0 = (u % cpb) * CH, nk = keys(u, (long long)b.j * B + c0);
            const char *blk = pool + (size_t)b.index * block_bytes + head_off + (size_t)c0 * rb;
            load8(blk + k_off, nk, kd);
            load8(blk + v_off, nk, vd);
            return;
        }
        constexpr int VEC = 16 / sizeof(T);
        struct cuda_blk b = list[u / cpb];
        uint32_t c0 = (u % cpb) * CH;
        uint32_t nk = keys(u, (long long)b.j * B + c0);
        const char *blk =
            pool + (size_t)b.index * block_bytes + head_off + (size_t)c0 * D * sizeof(T);
        const char *K = blk + k_off, *V = blk + v_off;
        const uint32_t row_vecs = D / VEC;
        for (uint32_t i = threadIdx.x; i < nk * row_vecs; i += ATTN_THREADS) {
            uint32_t c = i / row_vecs, x = (i % row_vecs) * VEC;
            attn_cp16(kd + c * DP + x, K + ((size_t)c * D + x) * sizeof(T));
            attn_cp16(vd + c * DP + x, V + ((size_t)c * D + x) * sizeof(T));
        }
    }
    /* the pipeline's first stage: queues unit u0 into stage 0; its first key
     * or -1 when the split has nothing to read */
    __device__ long long first(T *ks, T *vs) const
    {
        long long kp = start(u0);
        if (kp >= 0)
            load(u0, ks, vs);
        attn_commit();
        return kp;
    }
    /* queues unit u + 1 into the other stage, then waits until unit u's stage
     * has landed for the whole block; returns the next unit's first key */
    __device__ long long next(uint32_t u, int stage, T *ks, T *vs) const
    {
        long long kp = start(u + 1);
        if (kp >= 0)
            load(u + 1, ks + (stage ^ 1) * CH * DP, vs + (stage ^ 1) * CH * DP);
        attn_commit();
        attn_wait<1>();
        __syncthreads();
        return kp;
    }
};

/* one online-softmax step of a row (a warp, KPL scores per lane, -inf =
 * masked): s becomes p, m and l move on; returns the rescale of the old o */
template <int KPL>
__device__ __forceinline__ float attn_softmax(float (&s)[KPL], float &m, float &l)
{
    float smax = -INFINITY;
#pragma unroll
    for (int j = 0; j < KPL; j++)
        smax = fmaxf(smax, s[j]);
    for (int o = 16; o > 0; o >>= 1)
        smax = fmaxf(smax, __shfl_xor_sync(0xffffffff, smax, o));
    float mnew = fmaxf(m, smax), corr = 1.0f, psum = 0.0f;
    if (mnew != -INFINITY) {
        corr = m == -INFINITY ? 0.0f : expf(m - mnew);
#pragma unroll
        for (int j = 0; j < KPL; j++) {
            s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - mnew);
            psum += s[j];
        }
    } else {
#pragma unroll
        for (int j = 0; j < KPL; j++)
            s[j] = 0.0f;
    }
    for (int o = 16; o > 0; o >>= 1)
        psum += __shfl_xor_sync(0xffffffff, psum, o);
    l = l * corr + psum;
    m = mnew;
    return corr;
}

/* m, l of this warp's rows (w, w+4, ...) into the split's partial row tails */
template <int RPW>
__device__ __forceinline__ void attn_store_ml(const struct attn_kargs &a, float *part,
                                              const float *m_r, const float *l_r, uint32_t warp,
                                              uint32_t rows, uint32_t tok0, uint32_t kvh)
{
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        uint32_t r = warp + 4 * k;
        if (r < rows) {
            uint32_t t = tok0 + r / a.g, h = kvh * a.g + r % a.g;
            float *p = part + ((size_t)t * a.n_head + h) * (a.D + 2) + a.D;
            p[0] = m_r[k];
            p[1] = l_r[k];
        }
    }
}

/* the split merge folded into the launch: the last thread block of a (query tile, kv head) to
 * finish merges every split's partial of its rows into o (normalized), m and l, and puts the
 * tile's counter back to 0 for the next launch on the stream. The block counts itself done with
 * one release atomic; the last block reads the others' partials past L1.
 * A decode step saves the merge launch (~10 us of a 4k layer's ~150 on the H200).
 * Four dims of o a thread (two 8-byte loads: a partial's rows are D + 2 floats, D a power of two
 * >= 8), with every split's (m, l) beside them, so a round of SR splits is one L2 round trip.
 * Within a round the max comes first; a later round rescales what was summed. The splits'
 * weights first, in shared memory, took two more round trips and a barrier: isolated attention
 * at 512 / 4k keys read 0.042 / 0.242 of HBM that way, 0.049 / 0.276 this way (H200) */
__device__ __forceinline__ void attn_merge_last(const struct attn_kargs &a, uint32_t tok0,
                                                uint32_t rows, uint32_t kvh)
{
    __shared__ uint32_t last;
    if (!a.cnt)
        return;
    /* the block's partial writes happen before thread 0's release through the barrier; its
     * acquire, and the barrier after it, order the merge's reads after every other block's
     * release (the CUTLASS semaphore's pattern: one gpu-scope atomic, no fence a thread; a
     * fence a thread before and after measured the same at batch 1, 0.5 % slower at 64) */
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t *cnt = a.cnt + (size_t)blockIdx.z * gridDim.x + blockIdx.x, old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                     : "=r"(old)
                     : "l"(cnt)
                     : "memory");
        last = old == gridDim.y - 1;
        if (last)
            *cnt = 0;
    }
    __syncthreads();
    if (!last)
        return;
    const uint32_t D = a.D, PD = D + 2, n_split = gridDim.y, g = a.g, tid = threadIdx.x;
    const size_t ss = (size_t)a.n_tokens * a.n_head * PD;
    constexpr int SR = 16;
    const uint32_t nq = rows * D / 4;
    for (uint32_t qi = tid; qi < nq; qi += blockDim.x) {
        const uint32_t r = qi / (D / 4), d0 = qi % (D / 4) * 4, t = tok0 + r / g,
                       h = kvh * g + r % g;
        const float *p = a.part + ((size_t)t * a.n_head + h) * PD;
        float M = -INFINITY, L = 0.0f, O[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t s0 = 0; s0 < n_split; s0 += SR) {
            float mm[SR], ll[SR];
            float2 oa[SR], ob[SR];
#pragma unroll
            for (int k = 0; k < SR; k++) {
                const float *ps = p + (s0 + k) * ss;
                const bool in = s0 + k < n_split;
                mm[k] = in ? __ldcg(ps + D) : -INFINITY;
                ll[k] = in ? __ldcg(ps + D + 1) : 0.0f;
                oa[k] = in ? __ldcg((const float2 *)(ps + d0)) : make_float2(0.0f, 0.0f);
                ob[k] = in ? __ldcg((const float2 *)(ps + d0 + 2)) : make_float2(0.0f, 0.0f);
            }
            float Mr = M;
#pragma unroll
            for (int k = 0; k < SR; k++)
                if (ll[k] > 0.0f)
                    Mr = fmaxf(Mr, mm[k]);
            if (Mr == -INFINITY)
                continue; /* no keys yet */
            const float c = M == -INFINITY ? 0.0f : expf(M - Mr);
            L *= c;
#pragma unroll
            for (int j = 0; j < 4; j++)
                O[j] *= c;
#pragma unroll
            for (int k = 0; k < SR; k++)
                if (ll[k] > 0.0f) { /* an empty split's o may be stale */
                    const float w = expf(mm[k] - Mr);
                    L += w * ll[k];
                    O[0] += w * oa[k].x;
                    O[1] += w * oa[k].y;
                    O[2] += w * ob[k].x;
                    O[3] += w * ob[k].y;
                }
            M = Mr;
        }
        *(float4 *)(a.o + ((size_t)t * a.n_head + h) * D + d0) =
            L > 0.0f ? make_float4(O[0] / L, O[1] / L, O[2] / L, O[3] / L)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (d0 == 0) {
            a.m[(size_t)t * a.n_head + h] = L > 0.0f ? M : -INFINITY;
            a.l[(size_t)t * a.n_head + h] = L;
        }
    }
}

/* grid (n_kv_head, n_split, n_qtiles), ATTN_THREADS threads.
 * T: kv element type; CH: keys per chunk (32 per lane group); RMAX: query
 * rows per tile; RPT: accumulator rows per thread. D is a power of two in
 * 8..128 so thread (d = tid % D, rg = tid / D) owns rows rg, rg + 128/D, ...;
 * with CP > 1, D is CP * 128 and thread tid owns columns tid, tid + 128, ... of
 * every row (Gemma 3's head_dim 256: CP 2).
 * smem: ks, vs (2 stages, CH, D + pad) of T; qs (R, D) f32; ps (R, CH) f32;
 * cs (R) f32; rp (R) int. */
template <typename T, int CH, int RMAX, int RPT, int CP = 1, int DT = 0>
__global__ void __launch_bounds__(ATTN_THREADS) attn_kernel(struct attn_kargs a)
{
    constexpr int VEC = 16 / sizeof(T); /* elements per 16-byte copy */
    constexpr int KPL = CH / 32;        /* keys per lane in the score phase */
    constexpr int RPW = RMAX / 4;       /* rows per warp in the score phase */
    extern __shared__ __align__(16) char smem[];
    const uint32_t D = a.D, DP = D + VEC, R = a.R, tid = threadIdx.x;
    const uint32_t lane = tid & 31, warp = tid >> 5;
    T *ks = (T *)smem;                       /* (2, CH, DP) */
    T *vs = ks + 2 * CH * DP;                /* (2, CH, DP) */
    float *qs = (float *)(vs + 2 * CH * DP); /* (R, D) */
    float *ps = qs + R * D;                  /* (R, CH) */
    float *cs = ps + R * CH;                 /* (R) */
    int *rp = (int *)(cs + R);               /* (R) row positions */

    cuda_grid_wait(); /* q and the newest keys come from the kernels before */
    const struct cuda_qtile qt = a.qtiles[blockIdx.z];
    const struct cuda_seq_meta sq = a.seqs[qt.seq];
    const uint32_t kvh = blockIdx.x, split = blockIdx.y, g = a.g;
    const uint32_t tok0 = sq.tok_off + qt.t0;
    const uint32_t rows = qt.nt * g;

    /* query rows of this tile, pre-scaled: row r = token r / g, head kvh*g + r % g */
    for (uint32_t e = tid; e < rows * D; e += ATTN_THREADS) {
        uint32_t r = e / D, d = e % D;
        uint32_t t = tok0 + r / g, h = kvh * g + r % g;
        qs[e] = a.q[((size_t)t * a.n_head + h) * D + d] * a.scale;
    }
    int max_pos = -1;
    for (uint32_t r = tid; r < rows; r += ATTN_THREADS)
        rp[r] = a.pos[tok0 + r / g];
    for (uint32_t i = 0; i < qt.nt; i++)
        max_pos = max(max_pos, a.pos[tok0 + i]);

    const attn_src<T, CH, DT> src(a, sq, kvh, split, max_pos, DP);

    float m_r[RPW], l_r[RPW];
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        m_r[k] = -INFINITY;
        l_r[k] = 0.0f;
    }
    const uint32_t dcol = tid % D, rg = CP > 1 ? 0 : tid / D, n_rg = CP > 1 ? 1 : ATTN_THREADS / D;
    float acc[CP][RPT];
#pragma unroll
    for (int p = 0; p < CP; p++)
#pragma unroll
        for (int k = 0; k < RPT; k++)
            acc[p][k] = 0.0f;

    long long kp_cur = src.first(ks, vs);
    __syncthreads(); /* qs, rp */
    int stage = 0;
    for (uint32_t u = src.u0; kp_cur >= 0; u++) {
        long long kp_next = src.next(u, stage, ks, vs);

        const uint32_t nk = src.keys(u, kp_cur);
        const T *kd = ks + stage * CH * DP, *vd = vs + stage * CH * DP;
        /* scores: warp w takes rows w, w+4, ...; lane takes keys lane, lane+32.. */
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            uint32_t r = warp + 4 * k;
            if (r >= rows)
                break;
            const float *qr = qs + r * D;
            float s[KPL];
#pragma unroll
            for (int j = 0; j < KPL; j++) {
                uint32_t c = lane + 32 * j;
                s[j] = -INFINITY;
                if (c < nk && attn_sees(kp_cur + c, rp[r], a.window)) {
                    const T *kr = kd + c * DP;
                    float dot = 0.0f;
                    for (uint32_t x = 0; x < D; x += VEC) {
                        float kf[VEC];
                        cuda_unpack16(*(const uint4 *)(kr + x), kr, kf);
#pragma unroll
                        for (int v = 0; v < VEC; v++)
                            dot += qr[x + v] * kf[v];
                    }
                    s[j] = dot;
                }
            }
            float corr = attn_softmax<KPL>(s, m_r[k], l_r[k]);
#pragma unroll
            for (int j = 0; j < KPL; j++)
                ps[r * CH + lane + 32 * j] = s[j];
            if (lane == 0)
                cs[r] = corr;
        }
        __syncthreads();
        /* o += p . v: thread owns column dcol (+ 128 p) of rows rg, rg + n_rg, ... */
        if (rg < n_rg) {
#pragma unroll
            for (int p = 0; p < CP; p++)
#pragma unroll
                for (int k = 0; k < RPT; k++) {
                    uint32_t r = rg + n_rg * k;
                    if (r < rows)
                        acc[p][k] *= cs[r];
                }
            for (uint32_t c = 0; c < nk; c++) {
#pragma unroll
                for (int p = 0; p < CP; p++) {
                    float v = attn_f(vd[c * DP + dcol + ATTN_THREADS * p]);
#pragma unroll
                    for (int k = 0; k < RPT; k++) {
                        uint32_t r = rg + n_rg * k;
                        if (r < rows)
                            acc[p][k] += ps[r * CH + c] * v;
                    }
                }
            }
        }
        __syncthreads(); /* stage and ps are rewritten next */
        stage ^= 1;
        kp_cur = kp_next;
    }
    attn_wait<0>();

    /* partial out: unnormalized o, m, l per (token, head) */
    const uint32_t PD = D + 2;
    float *part = a.part + (size_t)split * a.n_tokens * a.n_head * PD;
    if (rg < n_rg) {
#pragma unroll
        for (int p = 0; p < CP; p++)
#pragma unroll
            for (int k = 0; k < RPT; k++) {
                uint32_t r = rg + n_rg * k;
                if (r < rows) {
                    uint32_t t = tok0 + r / g, h = kvh * g + r % g;
                    part[((size_t)t * a.n_head + h) * PD + dcol + ATTN_THREADS * p] = acc[p][k];
                }
            }
    }
    if (lane == 0)
        attn_store_ml<RPW>(a, part, m_r, l_r, warp, rows, tok0, kvh);
    attn_merge_last(a, tok0, rows, kvh);
}

/* value rows [from, to) of a key chunk set to zero by threads i0, i0 + step, ...: the p.v mma
 * reads up to the next 16-key step, where p is 0 but 0 * a stale nan would not be */
__device__ __forceinline__ void attn_zero_rows(__half *vd, uint32_t from, uint32_t to, uint32_t D,
                                               uint32_t DP, uint32_t i0, uint32_t step)
{
    for (uint32_t i = i0; i < (to - from) * D; i += step)
        vd[(from + i / D) * DP + i % D] = __float2half_rn(0.0f);
}

/* d += a . b on the tensor cores: m16n8k16, f16 in, f32 accumulate */
__device__ __forceinline__ void attn_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t attn_pack(__half lo, __half hi)
{
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

/* two f32 values as f16 pairs: hi = round(x), lo = round(x - hi), so hi + lo
 * keeps ~22 bits and the tensor-core products stay near f32 accuracy */
__device__ __forceinline__ void attn_split2(float x, float y, uint32_t &hi, uint32_t &lo)
{
    __half hx = __float2half_rn(x), hy = __float2half_rn(y);
    hi = attn_pack(hx, hy);
    lo = attn_pack(__float2half_rn(x - __half2float(hx)), __float2half_rn(y - __half2float(hy)));
}

/* the f16-kv kernel: the same tiles, pipeline and online softmax as
 * attn_kernel, with q.k^T and p.v on the tensor cores (q and p split hi/lo).
 * grid (n_kv_head, n_split, n_qtiles), ATTN_THREADS threads; MT 16-row tiles.
 * smem: ks, vs (2, 64, D + 8) f16; qh, ql (16*MT, D + 8) f16 (MT > 1); ps
 * (16*MT, 72) f32 scores, rewritten in place as p hi, lo (72 f16 each); cs,
 * rp (16*MT). */
template <int MT>
__global__ void __launch_bounds__(ATTN_THREADS) attn_mma_kernel(struct attn_kargs a)
{
    constexpr int CH = 64, PS = CH + 8, RMAX = 16 * MT, RPW = RMAX / 4;
    extern __shared__ __align__(16) char smem[];
    const uint32_t D = a.D, DP = D + 8, tid = threadIdx.x;
    const uint32_t lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    __half *ks = (__half *)smem;   /* (2, CH, DP) */
    __half *vs = ks + 2 * CH * DP; /* (2, CH, DP) */
    /* one m tile (decode) keeps q's fragments in registers; more stage q in smem */
    constexpr int QS = MT == 1 ? 0 : RMAX;
    __half *qh = vs + 2 * CH * DP;       /* (QS, DP) */
    __half *ql = qh + QS * DP;           /* (QS, DP) */
    float *ps = (float *)(ql + QS * DP); /* (RMAX, PS) */
    float *cs = ps + RMAX * PS;          /* (RMAX) */
    int *rp = (int *)(cs + RMAX);        /* (RMAX) */

    cuda_grid_wait(); /* q and the newest keys come from the kernels before */
    const struct cuda_qtile qt = a.qtiles[blockIdx.z];
    const struct cuda_seq_meta sq = a.seqs[qt.seq];
    const uint32_t kvh = blockIdx.x, split = blockIdx.y, g = a.g;
    const uint32_t tok0 = sq.tok_off + qt.t0;
    const uint32_t rows = qt.nt * g;
    const uint32_t n_mt = (rows + 15) / 16;

    /* q fragments (MT == 1): [k step][a0..a3], hi and lo */
    uint32_t fqh[MT == 1 ? 8 : 1][4], fql[MT == 1 ? 8 : 1][4];
    if constexpr (MT == 1) {
        auto qv = [&](uint32_t r, uint32_t d) -> float {
            if (r >= rows)
                return 0.0f;
            uint32_t t = tok0 + r / g, h = kvh * g + r % g;
            return a.q[((size_t)t * a.n_head + h) * D + d] * a.scale;
        };
#pragma unroll
        for (int ks = 0; ks < 8; ks++) {
            uint32_t k0 = ks * 16 + 2 * tq;
            if ((uint32_t)ks * 16 < D) {
                attn_split2(qv(gq, k0), qv(gq, k0 + 1), fqh[ks][0], fql[ks][0]);
                attn_split2(qv(gq + 8, k0), qv(gq + 8, k0 + 1), fqh[ks][1], fql[ks][1]);
                attn_split2(qv(gq, k0 + 8), qv(gq, k0 + 9), fqh[ks][2], fql[ks][2]);
                attn_split2(qv(gq + 8, k0 + 8), qv(gq + 8, k0 + 9), fqh[ks][3], fql[ks][3]);
            }
        }
    } else {
        for (uint32_t e = tid; e < n_mt * 16 * D; e += ATTN_THREADS) {
            uint32_t r = e / D, d = e % D;
            float x = 0.0f;
            if (r < rows) {
                uint32_t t = tok0 + r / g, h = kvh * g + r % g;
                x = a.q[((size_t)t * a.n_head + h) * D + d] * a.scale;
            }
            __half hx = __float2half_rn(x);
            qh[r * DP + d] = hx;
            ql[r * DP + d] = __float2half_rn(x - __half2float(hx));
        }
    }
    for (uint32_t r = tid; r < RMAX; r += ATTN_THREADS) {
        rp[r] = r < rows ? a.pos[tok0 + r / g] : -1;
        cs[r] = 1.0f;
    }
    int max_pos = -1;
    for (uint32_t i = 0; i < qt.nt; i++)
        max_pos = max(max_pos, a.pos[tok0 + i]);

    const attn_src<__half, CH> src(a, sq, kvh, split, max_pos, DP);

    float m_r[RPW], l_r[RPW];
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        m_r[k] = -INFINITY;
        l_r[k] = 0.0f;
    }
    /* o accumulators: (m tile, this warp's n tiles of 8 dims, c fragment) */
    constexpr int NTW = 4; /* n tiles per warp at D = 128 */
    float acc[MT][NTW][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NTW; j++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc[i][j][k] = 0.0f;
    const uint32_t n_nt = D / 8; /* n tiles of the output */

    long long kp_cur = src.first(ks, vs);
    __syncthreads();
    int stage = 0;
    for (uint32_t u = src.u0; kp_cur >= 0; u++) {
        long long kp_next = src.next(u, stage, ks, vs);

        const uint32_t nk = src.keys(u, kp_cur);
        const __half *kd = ks + stage * CH * DP, *vd = vs + stage * CH * DP;
        attn_zero_rows(vs + stage * CH * DP, nk, (nk + 15) & ~15u, D, DP, tid, ATTN_THREADS);
        /* scores: warp w takes keys 16w..16w+15 (two n tiles) of every m tile */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (mt >= (int)n_mt)
                break;
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const uint32_t key = warp * 16 + nt * 8 + gq; /* this lane's b column */
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (warp * 16 + nt * 8 < nk) {
                    if constexpr (MT == 1) {
#pragma unroll
                        for (int ks = 0; ks < 8; ks++) {
                            if ((uint32_t)ks * 16 >= D)
                                break;
                            const __half *kb = kd + key * DP + ks * 16 + 2 * tq;
                            uint32_t b0 = key < nk ? *(const uint32_t *)kb : 0u;
                            uint32_t b1 = key < nk ? *(const uint32_t *)(kb + 8) : 0u;
                            attn_mma(c, fqh[ks][0], fqh[ks][1], fqh[ks][2], fqh[ks][3], b0, b1);
                            attn_mma(c, fql[ks][0], fql[ks][1], fql[ks][2], fql[ks][3], b0, b1);
                        }
                    } else {
                        for (uint32_t k0 = 0; k0 < D; k0 += 16) {
                            const __half *qa = qh + (mt * 16 + gq) * DP + k0 + 2 * tq;
                            const __half *qb = ql + (mt * 16 + gq) * DP + k0 + 2 * tq;
                            uint32_t ah0 = *(const uint32_t *)qa,
                                     ah1 = *(const uint32_t *)(qa + 8 * DP),
                                     ah2 = *(const uint32_t *)(qa + 8),
                                     ah3 = *(const uint32_t *)(qa + 8 * DP + 8);
                            uint32_t al0 = *(const uint32_t *)qb,
                                     al1 = *(const uint32_t *)(qb + 8 * DP),
                                     al2 = *(const uint32_t *)(qb + 8),
                                     al3 = *(const uint32_t *)(qb + 8 * DP + 8);
                            const __half *kb = kd + key * DP + k0 + 2 * tq;
                            uint32_t b0 = key < nk ? *(const uint32_t *)kb : 0u;
                            uint32_t b1 = key < nk ? *(const uint32_t *)(kb + 8) : 0u;
                            attn_mma(c, ah0, ah1, ah2, ah3, b0, b1);
                            attn_mma(c, al0, al1, al2, al3, b0, b1);
                        }
                    }
                }
                /* c: rows mt*16 + gq (+8), keys warp*16 + nt*8 + 2tq (+1) */
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    uint32_t r = mt * 16 + gq + (e >= 2 ? 8 : 0);
                    uint32_t kc = warp * 16 + nt * 8 + 2 * tq + (e & 1);
                    bool ok = r < rows && kc < nk && attn_sees(kp_cur + kc, rp[r], a.window);
                    ps[r * PS + kc] = ok ? c[e] : -INFINITY;
                }
            }
        }
        __syncthreads();
        /* online softmax: warp w takes rows w, w+4, ... */
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            uint32_t r = warp + 4 * k;
            if (r >= rows)
                break;
            float sc[2] = {ps[r * PS + lane], ps[r * PS + lane + 32]};
            float corr = attn_softmax<2>(sc, m_r[k], l_r[k]);
            float s0 = sc[0], s1 = sc[1];
            __syncwarp(); /* every lane read its scores before the row is rewritten */
            __half *ph = (__half *)(ps + r * PS), *pl = ph + PS;
            __half h0 = __float2half_rn(s0), h1 = __float2half_rn(s1);
            ph[lane] = h0;
            ph[lane + 32] = h1;
            pl[lane] = __float2half_rn(s0 - __half2float(h0));
            pl[lane + 32] = __float2half_rn(s1 - __half2float(h1));
            if (lane == 0)
                cs[r] = corr;
        }
        __syncthreads();
        /* o = o * corr + p . v: warp w takes output n tiles w, w+4, ... */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (mt >= (int)n_mt)
                break;
            float c_lo = cs[mt * 16 + gq], c_hi = cs[mt * 16 + gq + 8];
#pragma unroll
            for (int j = 0; j < NTW; j++) {
                acc[mt][j][0] *= c_lo;
                acc[mt][j][1] *= c_lo;
                acc[mt][j][2] *= c_hi;
                acc[mt][j][3] *= c_hi;
            }
            for (uint32_t k0 = 0; k0 < nk; k0 += 16) {
                /* a fragments of p (hi, lo) for rows gq, gq + 8, keys k0.. */
                const __half *r0 = (const __half *)(ps + (mt * 16 + gq) * PS) + k0 + 2 * tq;
                const __half *r1 = r0 + 8 * 2 * PS;
                uint32_t h0 = *(const uint32_t *)r0, h1 = *(const uint32_t *)r1,
                         h2 = *(const uint32_t *)(r0 + 8), h3 = *(const uint32_t *)(r1 + 8);
                uint32_t l0 = *(const uint32_t *)(r0 + PS), l1 = *(const uint32_t *)(r1 + PS),
                         l2 = *(const uint32_t *)(r0 + PS + 8),
                         l3 = *(const uint32_t *)(r1 + PS + 8);
#pragma unroll
                for (int j = 0; j < NTW; j++) {
                    uint32_t nt = warp + 4 * j;
                    if (nt >= n_nt)
                        break;
                    /* b fragments of v (keys k0..k0+15, dims nt*8..) transposed
                     * out of the row-major tile */
                    uint32_t b0, b1;
                    unsigned addr =
                        (unsigned)__cvta_generic_to_shared(vd + (k0 + (lane & 15)) * DP + nt * 8);
                    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                                 : "=r"(b0), "=r"(b1)
                                 : "r"(addr));
                    attn_mma(acc[mt][j], h0, h1, h2, h3, b0, b1);
                    attn_mma(acc[mt][j], l0, l1, l2, l3, b0, b1);
                }
            }
        }
        __syncthreads();
        stage ^= 1;
        kp_cur = kp_next;
    }
    attn_wait<0>();

    const uint32_t PD = D + 2;
    float *part = a.part + (size_t)split * a.n_tokens * a.n_head * PD;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (mt >= (int)n_mt)
            break;
#pragma unroll
        for (int j = 0; j < NTW; j++) {
            uint32_t nt = warp + 4 * j;
            if (nt >= n_nt)
                break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                uint32_t r = mt * 16 + gq + (e >= 2 ? 8 : 0);
                uint32_t d = nt * 8 + 2 * tq + (e & 1);
                if (r < rows) {
                    uint32_t t = tok0 + r / g, h = kvh * g + r % g;
                    part[((size_t)t * a.n_head + h) * PD + d] = acc[mt][j][e];
                }
            }
        }
    }
    if (lane == 0)
        attn_store_ml<RPW>(a, part, m_r, l_r, warp, rows, tok0, kvh);
    attn_merge_last(a, tok0, rows, kvh);
}

/* d += a . b (m16n8k16, f16 in, f32 accumulate), left to the compiler to schedule */
__device__ __forceinline__ void fa_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* prefill tiles over f16 kv, flash-attention 2 style: warp w owns rows 16w..16w+15 of the
 * 64-row tile (tokens x gqa group) and keeps everything of them in registers: q (hi and lo
 * halves, so q.k^T is f32-accurate), the 16 x 64 scores of a key chunk, their online softmax
 * (a row lives in the four lanes of a quad: two shuffles), p as the a operand of p.v (hi and lo)
 * and the 16 x D output. The key chunks stream through two shared-memory stages; the only
 * barriers are the pipeline's. attn_mma_kernel staged the scores in shared memory between three
 * barriers per chunk with 4 warps per SM. grid (n_kv_head, n_split, n_qtiles), ATTN_THREADS
 * threads, D = 8 * ND (64 or 128); smem: ks, vs (2, 64, D + 8) f16. Partials as attn_mma_kernel
 * (unnormalized o, m, l in the natural log domain).
 * Both products carry the f16 rounding residual of q and p (a second mma each), so they are
 * f32 accurate, as attn_mma_kernel's */
template <int ND>
__global__ void __launch_bounds__(ATTN_THREADS) attn_fa_kernel(struct attn_kargs a)
{
    constexpr int CH = 64, D = 8 * ND, DP = D + 8, KS = D / 16;
    extern __shared__ __align__(16) char smem[];
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2,
                   tq = lane & 3;
    __half *ks = (__half *)smem;   /* (2, CH, DP) */
    __half *vs = ks + 2 * CH * DP; /* (2, CH, DP) */

    cuda_grid_wait(); /* q and the newest keys come from the kernels before */
    const struct cuda_qtile qt = a.qtiles[blockIdx.z];
    const struct cuda_seq_meta sq = a.seqs[qt.seq];
    const uint32_t kvh = blockIdx.x, split = blockIdx.y, g = a.g;
    const uint32_t tok0 = sq.tok_off + qt.t0, rows = qt.nt * g;
    /* this lane's two rows: gq and gq + 8 of the warp's 16 */
    const uint32_t r0 = warp * 16 + gq, r1 = r0 + 8;
    const int p0 = r0 < rows ? a.pos[tok0 + r0 / g] : -1;
    const int p1 = r1 < rows ? a.pos[tok0 + r1 / g] : -1;
    int max_pos = -1;
    for (uint32_t i = 0; i < qt.nt; i++)
        max_pos = max(max_pos, a.pos[tok0 + i]);

    /* q fragments: a0 (row gq, dims 2tq..), a1 (row gq + 8), a2 (dims + 8), a3 (both); q carries
     * log2(e), so the softmax runs on exp2 (one MUFU op) and m is in the log2 domain until the
     * partial is written */
    const float qscale = a.scale * 1.4426950408889634f;
    uint32_t qh[KS][4], ql[KS][4];
    {
        auto qv = [&](uint32_t r, uint32_t d) -> float {
            if (r >= rows)
                return 0.0f;
            const uint32_t t = tok0 + r / g, h = kvh * g + r % g;
            return a.q[((size_t)t * a.n_head + h) * D + d] * qscale;
        };
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const uint32_t d0 = k * 16 + 2 * tq;
            attn_split2(qv(r0, d0), qv(r0, d0 + 1), qh[k][0], ql[k][0]);
            attn_split2(qv(r1, d0), qv(r1, d0 + 1), qh[k][1], ql[k][1]);
            attn_split2(qv(r0, d0 + 8), qv(r0, d0 + 9), qh[k][2], ql[k][2]);
            attn_split2(qv(r1, d0 + 8), qv(r1, d0 + 9), qh[k][3], ql[k][3]);
        }
    }

    const attn_src<__half, CH> src(a, sq, kvh, split, max_pos, DP);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[j][e] = 0.0f;

    long long kp_cur = src.first(ks, vs);
    int stage = 0;
    for (uint32_t u = src.u0; kp_cur >= 0; u++) {
        const long long kp_next = src.next(u, stage, ks, vs); /* unit u landed, block-wide */
        const uint32_t nk = src.keys(u, kp_cur);
        const __half *kd = ks + stage * CH * DP;
        __half *vd = vs + stage * CH * DP;
        if (nk < CH) { /* nk is the same for the whole block */
            attn_zero_rows(vd, nk, (nk + 15) & ~15u, D, DP, tid, ATTN_THREADS);
            __syncthreads();
        }
        /* s = q . k^T: n tile j holds keys 8j..8j+7; c0, c1 row gq keys 8j + 2tq (+1), c2, c3
         * row gq + 8 */
        /* every n tile, also past nk (stale or unset rows, masked below by a select, which drops
         * a NaN): no branch between the tiles, so their eight mma chains interleave (with a
         * branch per tile each chain of KS (x2) dependent mmas ran alone) */
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[j][e] = 0.0f;
#pragma unroll
        for (int k = 0; k < KS; k++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const __half *kb = kd + (j * 8 + gq) * DP + 2 * tq + k * 16;
                const uint32_t b0 = *(const uint32_t *)kb;
                const uint32_t b1 = *(const uint32_t *)(kb + 8);
                fa_mma(s[j], qh[k], b0, b1);
                fa_mma(s[j], ql[k], b0, b1);
            }
        /* causal mask and chunk end where the chunk needs them (warp-uniform: a full chunk
         * at or before both rows of every lane has none), then each row's max over its quad */
        const bool inside = nk == CH && kp_cur + CH - 1 <= (long long)min(p0, p1) &&
                            (a.window == 0 || kp_cur > (long long)max(p0, p1) - a.window);
        float mx0 = -INFINITY, mx1 = -INFINITY;
        if (__all_sync(0xffffffff, inside)) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t kc = j * 8 + 2 * tq + (e & 1);
                    const int pr = e < 2 ? p0 : p1;
                    const bool ok = kc < nk && attn_sees(kp_cur + kc, pr, a.window);
                    s[j][e] = ok ? s[j][e] : -INFINITY;
                    if (e < 2)
                        mx0 = fmaxf(mx0, s[j][e]);
                    else
                        mx1 = fmaxf(mx1, s[j][e]);
                }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = mn0 == -INFINITY ? 1.0f : m0 == -INFINITY ? 0.0f : exp2f(m0 - mn0);
        const float c1 = mn1 == -INFINITY ? 1.0f : m1 == -INFINITY ? 0.0f : exp2f(m1 - mn1);
        /* a row with every key masked so far: its scores are -inf, exp2(-inf - 0) = 0 */
        const float ms0 = mn0 == -INFINITY ? 0.0f : mn0, ms1 = mn1 == -INFINITY ? 0.0f : mn1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[j][e] - (e < 2 ? ms0 : ms1));
                s[j][e] = p;
                if (e < 2)
                    ps0 += p;
                else
                    ps1 += p;
            }
        ps0 += __shfl_xor_sync(0xffffffff, ps0, 1);
        ps0 += __shfl_xor_sync(0xffffffff, ps0, 2);
        ps1 += __shfl_xor_sync(0xffffffff, ps1, 1);
        ps1 += __shfl_xor_sync(0xffffffff, ps1, 2);
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int j = 0; j < ND; j++) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
        /* o += p . v over 16-key steps: p's a fragment is the c fragments of score tiles 2k and
         * 2k + 1; v's b fragments for two output tiles at once out of the row-major chunk */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if ((uint32_t)k * 16 >= nk)
                break;
            uint32_t ph[4], pl[4];
            attn_split2(s[2 * k][0], s[2 * k][1], ph[0], pl[0]);
            attn_split2(s[2 * k][2], s[2 * k][3], ph[1], pl[1]);
            attn_split2(s[2 * k + 1][0], s[2 * k + 1][1], ph[2], pl[2]);
            attn_split2(s[2 * k + 1][2], s[2 * k + 1][3], ph[3], pl[3]);
            const __half *vr = vd + (k * 16 + (lane & 15)) * DP + (lane >> 4) * 8;
#pragma unroll
            for (int j = 0; j < ND; j += 2) {
                uint32_t b0, b1, b2, b3;
                cuda_ldsm4<true>(b0, b1, b2, b3, vr + j * 8);
                fa_mma(o[j], ph, b0, b1);
                fa_mma(o[j + 1], ph, b2, b3);
                fa_mma(o[j], pl, b0, b1);
                fa_mma(o[j + 1], pl, b2, b3);
            }
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
        stage ^= 1;
        kp_cur = kp_next;
    }
    attn_wait<0>();

    const uint32_t PD = D + 2;
    float *part = a.part + (size_t)split * a.n_tokens * a.n_head * PD;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const uint32_t r = half ? r1 : r0;
        if (r >= rows)
            continue;
        const uint32_t t = tok0 + r / g, h = kvh * g + r % g;
        float *pr = part + ((size_t)t * a.n_head + h) * PD;
#pragma unroll
        for (int j = 0; j < ND; j++)
            *(float2 *)(pr + j * 8 + 2 * tq) = make_float2(o[j][2 * half], o[j][2 * half + 1]);
        if (tq == 0) {
            pr[D] = (half ? m1 : m0) * 0.6931471805599453f; /* back to the natural log domain */
            pr[D + 1] = half ? l1 : l0;
        }
    }
    attn_merge_last(a, tok0, rows, kvh);
}

/* byte offset of row r's 16-byte column c in a chunk tile the tensor copies load: 64-column
 * halves of CH rows of 128 bytes each, the 16-byte columns of a row permuted by the 128-byte
 * swizzle (column ^ row % 8), so the eight rows of an ldmatrix tile hit eight bank groups */
template <int CH> __device__ __forceinline__ uint32_t attn_sw(uint32_t r, uint32_t c)
{
    return (c >> 3) * (CH * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

/* queues unit u's K and V chunks (the full CH rows; keys past the sequence's end come too and
 * are masked) into kd, vd by tensor copies from tm (the device pool as rows of D f16, set_kv's
 * kv_tmap_encode), counted on bar; one thread */
template <int D, int CH>
__device__ __forceinline__ void attn_tma_load(const attn_src<__half, CH> &src, uint32_t u,
                                              __half *kd, __half *vd, uint64_t *bar,
                                              const CUtensorMap *tm, uint64_t policy)
{
    const struct cuda_blk b = src.list[u / src.cpb];
    const size_t off = (size_t)b.index * src.block_bytes + src.head_off +
                       (size_t)(u % src.cpb) * CH * D * sizeof(__half);
    const int32_t rk = (int32_t)((off + src.k_off) / (D * sizeof(__half)));
    const int32_t rv = (int32_t)((off + src.v_off) / (D * sizeof(__half)));
    cuda_bar_expect(bar, 2 * CH * D * sizeof(__half));
#pragma unroll
    for (int h = 0; h < D / 64; h++) {
        cuda_tma_3d((char *)kd + h * CH * 128, tm, 0, h, rk, bar, policy);
        cuda_tma_3d((char *)vd + h * CH * 128, tm, 0, h, rv, bar, policy);
    }
}

/* decode over f16 kv: one token per tile, gqa group g <= 8, D = 8 * ND (16..128).
 * The m16 tile holds q in rows 0..g-1 and its f16 rounding residual in rows 8..8+g-1, so one
 * mma yields both halves of the f32-accurate product (summed in registers), and p.v likewise
 * with p split the same way. Each warp takes 16 keys of every 64-key chunk and keeps its own
 * online softmax in registers (no shared scores, one barrier per chunk); the four warps'
 * (m, l, o) are merged at the end. grid (n_kv_head, n_split, n_qtiles), ATTN_THREADS threads;
 * smem: ks, vs (NST, 64, D + 8) f16 (reused for the warp merge): NST stages, so NST - 1 chunks
 * are in flight while one is computed (cuda_dec_stages); a fifth warp queueing the chunks
 * while the four wait on mbarriers ran slower (docs/cuda-design.md).
 * TMA (D 64 or 128, device pool): one thread queues each chunk as 2 * D / 64 tensor copies of
 * 64 x 64 f16 (tm, swizzled rows of D, attn_sw) counted on the stage's mbarrier, which every
 * thread waits on; no padding, and the stages start 1024-byte aligned */
template <int ND, int NST, bool TMA>
__global__ void __launch_bounds__(ATTN_THREADS)
    attn_dec_kernel(struct attn_kargs a, const __grid_constant__ CUtensorMap tm)
{
    constexpr int CH = 64, D = ND * 8, DP = TMA ? D : D + 8, KS = D / 16;
    static_assert(!TMA || D == 64 || D == 128, "tensor copies take 64-column halves");
    extern __shared__ __align__(16) char smem[];
    __shared__ uint64_t bars[NST]; /* TMA: stage i's chunk landed */
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2,
                   tq = lane & 3;
    char *sb = TMA ? smem + ((1024 - (cuda_smem(smem) & 1023)) & 1023) : smem;
    __half *ks = (__half *)sb;       /* (NST, CH, DP) */
    __half *vs = ks + NST * CH * DP; /* (NST, CH, DP) */
    uint32_t par = 0;                /* TMA: bit i, the parity stage i's next wait is for */
    uint64_t policy = 0;             /* TMA: the copies' L2 policy (0: none) */
    if constexpr (TMA) {
        if (tid == 0) {
            /* the keys are read once a step: evict-first in L2 */
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#pragma unroll
            for (int i = 0; i < NST; i++)
                cuda_bar_init(&bars[i], 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }

    /* before the wait: what the step's upload holds (tiles, block lists, positions) and the
     * first NST key chunks when no kernel of this step writes them (every chunk key before the
     * sequence's first new token). The kernels before rewrite only q and the new keys */
    const struct cuda_qtile qt = a.qtiles[blockIdx.z];
    const struct cuda_seq_meta sq = a.seqs[qt.seq];
    const uint32_t kvh = blockIdx.x, split = blockIdx.y, g = a.g;
    const uint32_t tok = sq.tok_off + qt.t0;
    const int pos = a.pos[tok];
    const long long first_new = min((long long)sq.n_past, (long long)a.pos[sq.tok_off]);
    const attn_src<__half, CH> src(a, sq, kvh, split, pos, DP);
    /* queues unit u into stage st */
    auto load = [&](uint32_t u, int st) {
        if constexpr (TMA) {
            if (tid == 0)
                attn_tma_load<D, CH>(src, u, ks + st * CH * DP, vs + st * CH * DP, &bars[st], &tm,
                                     policy);
        } else {
            src.load(u, ks + st * CH * DP, vs + st * CH * DP);
        }
    };
    /* kp[i]: the first key of the loop's unit u + i below (-1: none) */
    long long kp[NST];
    bool pre[NST];
#pragma unroll
    for (int i = 0; i < NST; i++) {
        kp[i] = i == 0 || kp[i - 1] >= 0 ? src.start(src.u0 + i) : -1;
        pre[i] = kp[i] >= 0 && kp[i] + CH <= first_new && (i == 0 || pre[i - 1]);
        if (pre[i]) {
            load(src.u0 + i, i);
            if constexpr (!TMA)
                attn_commit();
        }
    }
    cuda_grid_wait(); /* q and the newest keys come from the kernels before */
#pragma unroll
    for (int i = 0; i < NST; i++)
        if (!pre[i]) {
            if (kp[i] >= 0)
                load(src.u0 + i, i);
            if constexpr (!TMA)
                attn_commit();
        }

    /* a fragments of q: a0/a2 row gq (q), a1/a3 row gq + 8 (residual) */
    uint32_t fq[KS][4];
    {
        const float *qr = a.q + ((size_t)tok * a.n_head + kvh * g + gq) * D;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            float x0 = 0, x1 = 0, x2 = 0, x3 = 0;
            if (gq < g) {
                uint32_t k0 = k * 16 + 2 * tq;
                x0 = qr[k0] * a.scale;
                x1 = qr[k0 + 1] * a.scale;
                x2 = qr[k0 + 8] * a.scale;
                x3 = qr[k0 + 9] * a.scale;
            }
            attn_split2(x0, x1, fq[k][0], fq[k][1]);
            attn_split2(x2, x3, fq[k][2], fq[k][3]);
        }
    }
    float m_r = -INFINITY, l_r = 0.0f;
    float acc[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[j][e] = 0.0f;

    /* NST stages: chunk u computes from stage u % NST while chunks u + 1 .. u + NST - 1 land
     * in the others, and chunk u + NST is queued into stage u % NST once every warp is done
     * reading it */
    int stage = 0;
    for (uint32_t u = src.u0; kp[0] >= 0; u++) {
        if constexpr (TMA) {
            cuda_bar_wait(&bars[stage], (par >> stage) & 1);
            par ^= 1u << stage;
        } else {
            attn_wait<NST - 1>();
            __syncthreads();
        }
        const long long kp_cur = kp[0];
        const uint32_t nk = src.keys(u, kp_cur), kw = warp * 16;
        const __half *kd = ks + stage * CH * DP;
        __half *vd = vs + stage * CH * DP;
        if (kw < nk) {
            if (kw + 16 > nk) {
                if constexpr (TMA) {
                    /* rows past the sequence's end landed too: zeroed 16 bytes at a time where
                     * the swizzle put them; the proxy fence orders these writes before the
                     * stage's next tensor copy */
                    for (uint32_t i = lane; i < (kw + 16 - nk) * (D / 8); i += 32)
                        *(uint4 *)((char *)vd + attn_sw<CH>(nk + i / (D / 8), i % (D / 8))) =
                            make_uint4(0, 0, 0, 0);
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                } else {
                    attn_zero_rows(vd, nk, kw + 16, D, DP, lane, 32);
                }
                __syncwarp();
            }
            /* scores of keys kw..kw+15: two n tiles of 8 */
            float c[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    c[nt][e] = 0.0f;
                /* b fragments for two k steps per ldmatrix: tiles (k, lo 8 dims),
                 * (k, hi 8), (k + 1, lo), (k + 1, hi) */
                const __half *kb =
                    kd + (kw + nt * 8 + (lane & 7)) * DP + (lane >> 4) * 16 + ((lane >> 3) & 1) * 8;
                const uint32_t kr_sw = kw + nt * 8 + (lane & 7),
                               kc_sw = (lane >> 4) * 2 + ((lane >> 3) & 1);
#pragma unroll
                for (int k = 0; k < KS; k += 2) {
                    uint32_t b0, b1, b2, b3;
                    if (TMA || k + 1 < KS) {
                        cuda_ldsm4<false>(b0, b1, b2, b3,
                                          TMA ? (const __half *)((const char *)kd +
                                                                 attn_sw<CH>(kr_sw, kc_sw + 2 * k))
                                              : kb + k * 16);
                        attn_mma(c[nt], fq[k][0], fq[k][1], fq[k][2], fq[k][3], b0, b1);
                        attn_mma(c[nt], fq[k + 1][0], fq[k + 1][1], fq[k + 1][2], fq[k + 1][3], b2,
                                 b3);
                    } else {
                        const __half *kr = kd + (kw + nt * 8 + gq) * DP + k * 16 + 2 * tq;
                        b0 = *(const uint32_t *)kr;
                        b1 = *(const uint32_t *)(kr + 8);
                        attn_mma(c[nt], fq[k][0], fq[k][1], fq[k][2], fq[k][3], b0, b1);
                    }
                }
            }
            /* s: row gq, keys kw + nt*8 + 2tq + e = q part + residual part */
            float s[2][2], smax = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    uint32_t kc = kw + nt * 8 + 2 * tq + e;
                    bool ok = kc < nk && attn_sees(kp_cur + kc, pos, a.window);
                    s[nt][e] = ok ? c[nt][e] + c[nt][e + 2] : -INFINITY;
                    smax = fmaxf(smax, s[nt][e]);
                }
            smax = fmaxf(smax, __shfl_xor_sync(0xffffffff, smax, 1));
            smax = fmaxf(smax, __shfl_xor_sync(0xffffffff, smax, 2));
            const float mnew = fmaxf(m_r, smax);
            if (mnew != -INFINITY) {
                const float corr = m_r == -INFINITY ? 0.0f : __expf(m_r - mnew);
                float psum = 0.0f;
                uint32_t ph[2], pl[2];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    float p0 = s[nt][0] == -INFINITY ? 0.0f : __expf(s[nt][0] - mnew);
                    float p1 = s[nt][1] == -INFINITY ? 0.0f : __expf(s[nt][1] - mnew);
                    psum += p0 + p1;
                    attn_split2(p0, p1, ph[nt], pl[nt]);
                }
                psum += __shfl_xor_sync(0xffffffff, psum, 1);
                psum += __shfl_xor_sync(0xffffffff, psum, 2);
                l_r = l_r * corr + psum;
                m_r = mnew;
                if (corr != 1.0f)
#pragma unroll
                    for (int j = 0; j < ND; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[j][e] *= corr;
                /* o += p . v: a0/a2 p of row gq, a1/a3 its residual; b from v by
                 * transposing ldmatrix, two n tiles per load */
                const __half *vb = vd + (kw + (lane & 15)) * DP + (lane >> 4) * 8;
#pragma unroll
                for (int j = 0; j < ND; j += 2) {
                    uint32_t b0, b1, b2, b3;
                    cuda_ldsm4<true>(
                        b0, b1, b2, b3,
                        TMA ? (const __half *)((const char *)vd +
                                               attn_sw<CH>(kw + (lane & 15), (lane >> 4) + j))
                            : vb + j * 8);
                    attn_mma(acc[j], ph[0], pl[0], ph[1], pl[1], b0, b1);
                    if (j + 1 < ND)
                        attn_mma(acc[j + 1], ph[0], pl[0], ph[1], pl[1], b2, b3);
                }
            }
        }
        const long long kp_n = kp[NST - 1] >= 0 ? src.start(u + NST) : -1;
        __syncthreads(); /* the stage is free */
        if (kp_n >= 0)
            load(u + NST, stage);
        if constexpr (!TMA)
            attn_commit();
#pragma unroll
        for (int i = 0; i + 1 < NST; i++)
            kp[i] = kp[i + 1];
        kp[NST - 1] = kp_n;
        stage = stage + 1 == NST ? 0 : stage + 1;
    }
    if constexpr (!TMA)
        attn_wait<0>(); /* tensor copies: every chunk queued was waited for in the loop */
    __syncthreads();    /* the stages are reused for the merge */

    /* merge the four warps: row gq's (m, l) per warp, then o summed with weights */
    float *wm = (float *)sb; /* (4, 8) */
    float *wl = wm + 32;     /* (4, 8) */
    float *wo = wl + 32;     /* (4, 8, D) */
    if (tq == 0 && gq < 8) {
        wm[warp * 8 + gq] = m_r;
        wl[warp * 8 + gq] = l_r;
    }
#pragma unroll
    for (int j = 0; j < ND; j++) {
        float *o = wo + ((size_t)warp * 8 + gq) * D + j * 8 + 2 * tq;
        o[0] = acc[j][0] + acc[j][2];
        o[1] = acc[j][1] + acc[j][3];
    }
    __syncthreads();
    const uint32_t PD = D + 2;
    float *part = a.part + (size_t)split * a.n_tokens * a.n_head * PD;
    for (uint32_t e = tid; e < g * D; e += ATTN_THREADS) {
        uint32_t r = e / D, d = e % D;
        float M = -INFINITY;
        for (int w = 0; w < 4; w++)
            if (wl[w * 8 + r] > 0.0f)
                M = fmaxf(M, wm[w * 8 + r]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < 4; w++) {
                if (wl[w * 8 + r] > 0.0f) {
                    float f = __expf(wm[w * 8 + r] - M);
                    L += wl[w * 8 + r] * f;
                    O += wo[((size_t)w * 8 + r) * D + d] * f;
                }
            }
        float *p = part + ((size_t)tok * a.n_head + kvh * g + r) * PD;
        p[d] = O;
        if (d == 0) {
            p[D] = M;
            p[D + 1] = L;
        }
    }
    attn_merge_last(a, tok, g, kvh);
}

/* dynamic shared memory of one launch */
static inline size_t attn_smem_bytes(size_t es, uint32_t ch, uint32_t D, uint32_t R)
{
    size_t dp = D + 16 / es;
    return 4 * ch * dp * es + (size_t)R * D * 4 + (size_t)R * ch * 4 + (size_t)R * 8;
}

/* raises fn's dynamic shared memory limit to sm when *set (its last value) is lower */
template <typename F> static int attn_smem_limit(F fn, size_t sm, size_t *set)
{
    if (sm > *set) {
        CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        *set = sm;
    }
    return 0;
}

/* one launch of an attention kernel with sm bytes of dynamic shared memory; *sm_set: the limit
 * its kernel was raised to (one per instantiation, kept by the caller) */
template <typename F, typename... A>
static int attn_launch_fn(const struct cuda_ctx *c, F fn, size_t *sm_set, dim3 grid, size_t sm,
                          cudaStream_t s, A &&...args)
{
    if (attn_smem_limit(fn, sm, sm_set) < 0)
        return RKV_ECUDA;
    CU_TRY(cuda_launch_pdl(c, fn, grid, dim3(ATTN_THREADS), sm, s, static_cast<A &&>(args)...));
    return 0;
}

/* dynamic shared memory of attn_dec_kernel: nst stages of 64 keys' k and v rows (d + 8) */
static inline size_t attn_dec_smem(uint32_t nst, uint32_t D)
{
    return (size_t)nst * 2 * 64 * (D + 8) * sizeof(__half);
}

/* the shared memory limit attn_dec_kernel<ND, NST, TMA> was raised to (one per instantiation) */
template <int ND, int NST, bool TMA> static size_t *attn_dec_sm_set()
{
    static size_t sm_set;
    return &sm_set;
}

/* tm: the device pool's tensor map when TMA (set_kv's kv_tmap_encode) */
template <int ND, int NST, bool TMA>
static int attn_dec_launch_st(const struct cuda_ctx *c, dim3 grid, cudaStream_t s,
                              const struct attn_kargs &k, const CUtensorMap &tm)
{
    /* tensor copies: unpadded rows, and room to align the stages to 1024 bytes */
    const size_t sm =
        TMA ? (size_t)NST * 2 * 64 * ND * 8 * sizeof(__half) + 1024 : attn_dec_smem(NST, ND * 8);
    return attn_launch_fn(c, attn_dec_kernel<ND, NST, TMA>, attn_dec_sm_set<ND, NST, TMA>(), grid,
                          sm, s, k, tm);
}

template <int ND, bool TMA>
static int attn_dec_launch_tma(const struct cuda_ctx *c, dim3 grid, cudaStream_t s,
                               const struct attn_kargs &k, const CUtensorMap &tm)
{
    return cuda_dec_stages(c, grid.x * grid.z) == 3
               ? attn_dec_launch_st<ND, 3, TMA>(c, grid, s, k, tm)
               : attn_dec_launch_st<ND, 2, TMA>(c, grid, s, k, tm);
}

/* by tensor copies when tma (D 64 and 128 only) */
template <int ND>
static int attn_dec_launch(const struct cuda_ctx *c, dim3 grid, cudaStream_t s,
                           const struct attn_kargs &k, bool tma)
{
    alignas(64) CUtensorMap tm;
    static_assert(sizeof(tm) == sizeof(c->kv_tmap), "cuda_ctx.kv_tmap holds a CUtensorMap");
    memcpy(&tm, c->kv_tmap, sizeof(tm));
    if constexpr (ND == 8 || ND == 16)
        if (tma)
            return attn_dec_launch_tma<ND, true>(c, grid, s, k, tm);
    return attn_dec_launch_tma<ND, false>(c, grid, s, k, tm);
}

template <int ND>
static int attn_fa_launch_nd(const struct cuda_ctx *c, dim3 grid, size_t sm, cudaStream_t s,
                             const struct attn_kargs &k)
{
    static size_t sm_set;
    return attn_launch_fn(c, attn_fa_kernel<ND>, &sm_set, grid, sm, s, k);
}

/* do the 64-row tiles of this launch take attn_fa_kernel? */
template <int RMAX> static inline bool attn_takes_fa(const struct cuda_ctx *c, uint32_t D)
{
    return RMAX == 64 && !c->deterministic && c->layout.dtype == KV_F16 && (D == 64 || D == 128);
}

/* only the prefill shape instantiates the kernel */
template <int RMAX>
static int attn_fa_launch(const struct cuda_ctx *c, dim3 grid, size_t sm, cudaStream_t s,
                          const struct attn_kargs &k)
{
    if constexpr (RMAX != 64)
        return RKV_EINTERNAL;
    else
        return k.D == 128 ? attn_fa_launch_nd<16>(c, grid, sm, s, k)
                          : attn_fa_launch_nd<8>(c, grid, sm, s, k);
}

/* does a launch of this shape take attn_dec_kernel (attn_launch's first case)? */
static inline bool attn_takes_dec(const struct cuda_ctx *c, uint32_t qt, uint32_t g, uint32_t D)
{
    return !c->deterministic && c->layout.dtype == KV_F16 && qt == 1 && g <= 8 &&
           (D == 16 || D == 32 || D == 64 || D == 128);
}

/* thread blocks of attn_dec_kernel<ND> resident per SM (asked once) */
template <int ND, int NST> static int attn_dec_per_sm_st()
{
    static int per_sm;
    if (!per_sm) {
        const size_t sm = attn_dec_smem(NST, ND * 8);
        int nb = 0;
        if (attn_smem_limit(attn_dec_kernel<ND, NST, false>, sm,
                            attn_dec_sm_set<ND, NST, false>()) < 0 ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, attn_dec_kernel<ND, NST, false>,
                                                          ATTN_THREADS, sm) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        per_sm = nb;
    }
    return per_sm;
}

template <int ND> static int attn_dec_per_sm(int nst)
{
    return nst == 3 ? attn_dec_per_sm_st<ND, 3>() : attn_dec_per_sm_st<ND, 2>();
}

/* the generic kernel over kv of type T (CH keys a chunk): a column a thread, two past 128 dims
 * (head_dim 256); DT an 8-bit kv dtype read into f32 stages (T float), or 0 */
template <typename T, int CH, int RMAX, int RPT, int DT = 0>
static int attn_generic_launch(const struct cuda_ctx *c, dim3 grid, cudaStream_t s,
                               const struct attn_kargs &k)
{
    const size_t sm = attn_smem_bytes(sizeof(T), CH, k.D, k.R);
    static size_t sm_set, sm_set_wide; /* each kernel's raised limit */
    if (k.D > ATTN_THREADS)
        return attn_launch_fn(c, attn_kernel<T, CH, RMAX, RPT, 2, DT>, &sm_set_wide, grid, sm, s,
                              k);
    return attn_launch_fn(c, attn_kernel<T, CH, RMAX, RPT, 1, DT>, &sm_set, grid, sm, s, k);
}

/* launches one instantiation for the kv dtype: f16 on the tensor cores,
 * f32 (the reference cache type) on the cuda cores */
template <int RMAX, int RPT>
static int attn_launch(struct cuda_ctx *c, const struct cuda_attn_args *a, struct attn_kargs k,
                       uint32_t n_split)
{
    dim3 grid(c->layout.n_kv_head, n_split, a->meta->n_qtiles);
    if (RMAX == 16 && attn_takes_dec(c, a->meta->qt, k.g, k.D)) {
        /* decode: the packed q/residual kernel */
        /* tensor copies read the device pool set_kv mapped, at whole rows */
        const size_t row = (size_t)k.D * sizeof(__half);
        const bool tma = c->kv_tma && a->list == KV_DEVICE && a->pool == c->pool[KV_DEVICE] &&
                         (k.block_bytes | k.k_off | k.v_off) % row == 0;
        c->hst.dec_tma += tma && (k.D == 64 || k.D == 128);
        int rc = k.D == 128  ? attn_dec_launch<16>(c, grid, a->s, k, tma)
                 : k.D == 64 ? attn_dec_launch<8>(c, grid, a->s, k, tma)
                 : k.D == 32 ? attn_dec_launch<4>(c, grid, a->s, k, tma)
                             : attn_dec_launch<2>(c, grid, a->s, k, tma);
        if (rc < 0)
            return rc;
    } else if (attn_takes_fa<RMAX>(c, k.D)) {
        size_t sm = 4 * 64 * (size_t)(k.D + 8) * 2;
        int rc = attn_fa_launch<RMAX>(c, grid, sm, a->s, k);
        if (rc < 0)
            return rc;
    } else if (c->layout.dtype == KV_F16 && k.D >= 16 && k.D <= 128) {
        /* its q fragments and o tiles cover 128 dims */
        constexpr int MT = RMAX / 16;
        size_t dp = k.D + 8;
        size_t sm = 4 * 64 * dp * 2 + (MT == 1 ? 0 : 2 * (size_t)RMAX * dp * 2) +
                    (size_t)RMAX * 72 * 4 + (size_t)RMAX * 8;
        static size_t sm_set;
        int rc = attn_launch_fn(c, attn_mma_kernel<MT>, &sm_set, grid, sm, a->s, k);
        if (rc < 0)
            return rc;
    } else {
        const int dt = c->layout.dtype;
        int rc = dt == KV_F16  ? attn_generic_launch<__half, 64, RMAX, RPT>(c, grid, a->s, k)
                 : dt == KV_Q8 ? attn_generic_launch<float, 32, RMAX, RPT, KV_Q8>(c, grid, a->s, k)
                 : dt == KV_FP8
                     ? attn_generic_launch<float, 32, RMAX, RPT, KV_FP8>(c, grid, a->s, k)
                     : attn_generic_launch<float, 32, RMAX, RPT>(c, grid, a->s, k);
        if (rc < 0)
            return rc;
    }
    CU_LAUNCHED();
    return 0;
}

/* the launch arguments common to both shapes */
static inline struct attn_kargs attn_kargs_of(struct cuda_ctx *c, const struct cuda_attn_args *a,
                                              uint32_t ups, float *part, uint32_t *cnt)
{
    const struct kv_layout *l = &c->layout;
    struct attn_kargs k;
    k.q = a->q;
    k.pool = a->pool;
    k.block_bytes = a->block_bytes;
    k.k_off = a->k_off;
    k.v_off = a->v_off;
    k.B = l->block_size;
    k.D = l->head_dim;
    k.n_head = a->at->n_head;
    k.g = a->at->n_head / a->at->n_kv_head;
    k.R = a->meta->qt * k.g;
    k.scale = a->at->scale;
    k.pos = a->meta->d_pos;
    k.seqs = a->meta->d_seqs;
    k.blks = a->meta->d_blks;
    k.qtiles = a->meta->d_qtiles;
    k.res = a->list;
    k.ups = ups;
    k.n_tokens = a->meta->n_tokens;
    k.part = part;
    k.cnt = cnt;
    k.o = a->o;
    k.m = a->m;
    k.l = a->l;
    k.window = a->at->window;
    return k;
}
