/* attn_kernel.cuh - the paged attention kernel template behind attn_decode.cu and attn_prefill.cu. */
#pragma once

#include <math.h>

#include "worker/cuda/cuda_ops.cuh"

#define ATTN_THREADS 128

/* what one launch reads; passed by value */
struct attn_kargs {
    const float *q;       /* (n_tokens, n_head*D) */
    const char *pool;     /* device-visible base of the residency's pool */
    size_t block_bytes, k_off, v_off;
    uint32_t B, D, n_head, g, R; /* R: query rows per tile (tile tokens * g) */
    float scale;
    const int32_t *pos;               /* (n_tokens) */
    const struct cuda_seq_meta *seqs; /* (n_seqs) */
    const struct cuda_blk *blks;
    const struct cuda_qtile *qtiles;
    int res;
    uint32_t ups;      /* chunk units per split */
    uint32_t n_tokens;
    float *part;       /* (n_split, n_tokens, n_head, D + 2): unnormalized o, then m, l */
};

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

__device__ __forceinline__ void attn_unpack(const uint4 &u, const __half *, float *f)
{
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 x = __half22float2(h[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}
__device__ __forceinline__ void attn_unpack(const uint4 &u, const float *, float *f)
{
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ float attn_f(__half x)
{
    return __half2float(x);
}
__device__ __forceinline__ float attn_f(float x)
{
    return x;
}

/* grid (n_kv_head, n_split, n_qtiles), ATTN_THREADS threads.
 * T: kv element type; CH: keys per chunk (32 per lane group); RMAX: query
 * rows per tile; RPT: accumulator rows per thread. D is a power of two in
 * 8..128 so thread (d = tid % D, rg = tid / D) owns rows rg, rg + 128/D, ...
 * smem: ks, vs (2 stages, CH, D + pad) of T; qs (R, D) f32; ps (R, CH) f32;
 * cs (R) f32; rp (R) int. */
template <typename T, int CH, int RMAX, int RPT> __global__ void __launch_bounds__(ATTN_THREADS)
attn_kernel(struct attn_kargs a)
{
    constexpr int VEC = 16 / sizeof(T); /* elements per 16-byte copy */
    constexpr int KPL = CH / 32;        /* keys per lane in the score phase */
    constexpr int RPW = RMAX / 4;       /* rows per warp in the score phase */
    extern __shared__ __align__(16) char smem[];
    const uint32_t D = a.D, DP = D + VEC, R = a.R, tid = threadIdx.x;
    const uint32_t lane = tid & 31, warp = tid >> 5;
    T *ks = (T *)smem;                  /* (2, CH, DP) */
    T *vs = ks + 2 * CH * DP;           /* (2, CH, DP) */
    float *qs = (float *)(vs + 2 * CH * DP); /* (R, D) */
    float *ps = qs + R * D;             /* (R, CH) */
    float *cs = ps + R * CH;            /* (R) */
    int *rp = (int *)(cs + R);          /* (R) row positions */

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

    const uint32_t cpb = (a.B + CH - 1) / CH; /* chunks per block */
    const uint32_t n_units = sq.list_len[a.res] * cpb;
    const struct cuda_blk *list = a.blks + sq.list_off[a.res];
    uint32_t u0 = split * a.ups, u1 = min(n_units, u0 + a.ups);
    const size_t head_off = (size_t)kvh * a.B * D * sizeof(T);
    const uint32_t row_vecs = D / VEC;

    /* the unit's first key position, or -1 when it is past every query (units
     * are in position order, so nothing after it is wanted either) */
    auto unit_start = [&](uint32_t u) -> long long {
        if (u >= u1)
            return -1;
        struct cuda_blk b = list[u / cpb];
        long long kp0 = (long long)b.j * a.B + (u % cpb) * CH;
        return kp0 > max_pos ? -1 : kp0;
    };
    auto load_unit = [&](uint32_t u, int stage) {
        struct cuda_blk b = list[u / cpb];
        uint32_t c0 = (u % cpb) * CH;
        /* keys past the tile's last position were never written: not loaded */
        long long left = (long long)max_pos - ((long long)b.j * a.B + c0) + 1;
        uint32_t nk = (uint32_t)min((long long)min((uint32_t)CH, a.B - c0), left);
        const char *blk = a.pool + (size_t)b.index * a.block_bytes + head_off +
                          (size_t)c0 * D * sizeof(T);
        const char *K = blk + a.k_off, *V = blk + a.v_off;
        T *kd = ks + stage * CH * DP, *vd = vs + stage * CH * DP;
        for (uint32_t i = tid; i < nk * row_vecs; i += ATTN_THREADS) {
            uint32_t c = i / row_vecs, x = (i % row_vecs) * VEC;
            attn_cp16(kd + c * DP + x, K + ((size_t)c * D + x) * sizeof(T));
            attn_cp16(vd + c * DP + x, V + ((size_t)c * D + x) * sizeof(T));
        }
    };

    float m_r[RPW], l_r[RPW];
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        m_r[k] = -INFINITY;
        l_r[k] = 0.0f;
    }
    const uint32_t dcol = tid % D, rg = tid / D, n_rg = ATTN_THREADS / D;
    float acc[RPT];
#pragma unroll
    for (int k = 0; k < RPT; k++)
        acc[k] = 0.0f;

    long long kp_cur = unit_start(u0);
    if (kp_cur >= 0)
        load_unit(u0, 0);
    attn_commit();
    __syncthreads(); /* qs, rp */
    int stage = 0;
    for (uint32_t u = u0; kp_cur >= 0; u++) {
        long long kp_next = unit_start(u + 1);
        if (kp_next >= 0)
            load_unit(u + 1, stage ^ 1);
        attn_commit();
        attn_wait<1>();
        __syncthreads();

        const uint32_t c0 = (u % cpb) * CH;
        const uint32_t nk =
            (uint32_t)min((long long)min((uint32_t)CH, a.B - c0), (long long)max_pos - kp_cur + 1);
        const T *kd = ks + stage * CH * DP, *vd = vs + stage * CH * DP;
        /* scores: warp w takes rows w, w+4, ...; lane takes keys lane, lane+32.. */
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            uint32_t r = warp + 4 * k;
            if (r >= rows)
                break;
            const float *qr = qs + r * D;
            float s[KPL];
            float smax = -INFINITY;
#pragma unroll
            for (int j = 0; j < KPL; j++) {
                uint32_t c = lane + 32 * j;
                s[j] = -INFINITY;
                if (c < nk && kp_cur + c <= rp[r]) {
                    const T *kr = kd + c * DP;
                    float dot = 0.0f;
                    for (uint32_t x = 0; x < D; x += VEC) {
                        float kf[VEC];
                        attn_unpack(*(const uint4 *)(kr + x), kr, kf);
#pragma unroll
                        for (int v = 0; v < VEC; v++)
                            dot += qr[x + v] * kf[v];
                    }
                    s[j] = dot;
                }
                smax = fmaxf(smax, s[j]);
            }
            for (int o = 16; o > 0; o >>= 1)
                smax = fmaxf(smax, __shfl_xor_sync(0xffffffff, smax, o));
            float mnew = fmaxf(m_r[k], smax), corr = 1.0f, psum = 0.0f;
            if (mnew != -INFINITY) {
                corr = m_r[k] == -INFINITY ? 0.0f : expf(m_r[k] - mnew);
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
            l_r[k] = l_r[k] * corr + psum;
            m_r[k] = mnew;
#pragma unroll
            for (int j = 0; j < KPL; j++)
                ps[r * CH + lane + 32 * j] = s[j];
            if (lane == 0)
                cs[r] = corr;
        }
        __syncthreads();
        /* o += p . v: thread owns column dcol of rows rg, rg + n_rg, ... */
        if (rg < n_rg) {
#pragma unroll
            for (int k = 0; k < RPT; k++) {
                uint32_t r = rg + n_rg * k;
                if (r < rows)
                    acc[k] *= cs[r];
            }
            for (uint32_t c = 0; c < nk; c++) {
                float v = attn_f(vd[c * DP + dcol]);
#pragma unroll
                for (int k = 0; k < RPT; k++) {
                    uint32_t r = rg + n_rg * k;
                    if (r < rows)
                        acc[k] += ps[r * CH + c] * v;
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
        for (int k = 0; k < RPT; k++) {
            uint32_t r = rg + n_rg * k;
            if (r < rows) {
                uint32_t t = tok0 + r / g, h = kvh * g + r % g;
                part[((size_t)t * a.n_head + h) * PD + dcol] = acc[k];
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            uint32_t r = warp + 4 * k;
            if (r < rows) {
                uint32_t t = tok0 + r / g, h = kvh * g + r % g;
                float *p = part + ((size_t)t * a.n_head + h) * PD + D;
                p[0] = m_r[k];
                p[1] = l_r[k];
            }
        }
    }
}

/* dynamic shared memory of one launch */
static inline size_t attn_smem_bytes(size_t es, uint32_t ch, uint32_t D, uint32_t R)
{
    size_t dp = D + 16 / es;
    return 4 * ch * dp * es + (size_t)R * D * 4 + (size_t)R * ch * 4 + (size_t)R * 8;
}

/* launches one instantiation for the kv dtype */
template <int RMAX, int RPT>
static int attn_launch(struct cuda_ctx *c, const struct cuda_attn_args *a, struct attn_kargs k,
                       uint32_t n_split)
{
    dim3 grid(c->layout.n_kv_head, n_split, a->meta->n_qtiles);
    if (c->layout.dtype == KV_F16) {
        size_t sm = attn_smem_bytes(2, 64, k.D, k.R);
        auto fn = attn_kernel<__half, 64, RMAX, RPT>;
        CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        fn<<<grid, ATTN_THREADS, sm, a->s>>>(k);
    } else {
        size_t sm = attn_smem_bytes(4, 32, k.D, k.R);
        auto fn = attn_kernel<float, 32, RMAX, RPT>;
        CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        fn<<<grid, ATTN_THREADS, sm, a->s>>>(k);
    }
    CU_LAUNCHED();
    return 0;
}

/* the launch arguments common to both shapes */
static inline struct attn_kargs attn_kargs_of(struct cuda_ctx *c, const struct cuda_attn_args *a,
                                              uint32_t ups, float *part)
{
    const struct kv_layout *l = &c->layout;
    struct attn_kargs k;
    k.q = a->q;
    k.pool = c->pool[a->residency];
    k.block_bytes = kv_block_bytes(l);
    k.k_off = kv_slice_offset(l, a->layer, 0);
    k.v_off = kv_slice_offset(l, a->layer, 1);
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
    k.res = a->residency;
    k.ups = ups;
    k.n_tokens = a->meta->n_tokens;
    k.part = part;
    return k;
}
