/* linear_stream.cu - the fused decode linears for one token with 16-bit weights, streamed
 * through shared memory. One persistent block per SM takes tiles of whole weight rows: its first
 * ring's worth by block number, then the next tile left (a counter), so a block that starts late
 * beside another kernel's does less instead of holding up the launch. The adding ones (o, down)
 * read the outputs they add to beside each tile's dot products. Its producer warp moves the
 * tiles with bulk copies (cp.async.bulk, completion counted on an mbarrier) into a ring of
 * stages, so the bytes in flight do not cost registers. Each consumer warp owns a fixed column
 * slice of every row and keeps that slice of x (normed, when the norm is folded in) in
 * registers; the four dot products of a 4-row tile are summed over the lanes together (6
 * shuffles, not 20). A finisher warp sums the warps' partials of each tile in a fixed order (the
 * result does not depend on timing) and writes the outputs, off the producer's path. Launched
 * with programmatic serialization, the next launch's producer prefetches its weights while this
 * one ends. */
#include "worker/cuda/cuda_ops.cuh"

#define LS_MAX_WARPS  16 /* consumer warps per block */
#define LS_MAX_STAGES 8
#define LS_MAX_ROWS   8 /* rows per tile (per matrix) */
/* bytes of a stage (a target) and of the ring: a ring under half an SM's shared memory, so the
 * next launch's block fits beside this one */
#define LS_STAGE_BYTES (32u << 10)
#define LS_RING_BYTES  (96u << 10)

struct ls_kargs {
    const char *w[BE_LIN_MAX];
    const float *bias[BE_LIN_MAX];
    float *out[BE_LIN_MAX];
    uint32_t end[BE_LIN_MAX];   /* cumulative rows (SET); end[0] = rows otherwise */
    uint32_t n_out[BE_LIN_MAX]; /* rows of each */
    const float *x;             /* (n, n_in) */
    const float *nw;            /* (n_in) norm weight, NORM only */
    float eps;
    uint32_t n_in, n, n_rows, n_mat;
    uint32_t row_bytes, rows_per_tile, n_stages, stage_bytes;
    uint32_t red_off, bar_off; /* byte offsets into dynamic shared memory */
    /* tiles of rows_per_tile rows per matrix, tend[m] cumulative; a block takes tiles
     * j * grid + block for j < n_stages, then ctr[0]'s next (ctr: tiles taken, blocks done, zero
     * between launches) */
    uint32_t n_tiles, tend[BE_LIN_MAX];
    uint32_t *ctr;
};

/* what the producer queued as tile k (slot k % 2S): its matrix, first row and rows; 0 rows:
 * the end */
struct ls_tinfo {
    uint32_t m, row, cnt, pad;
};

/* a role's place in the ring: stage s of S (parity ph of its barriers) and partials slot h of
 * 2S (parity hph) */
struct ls_pos {
    uint32_t s = 0, ph = 0, h = 0, hph = 0;
    __device__ __forceinline__ void next(uint32_t S)
    {
        if (++s == S) {
            s = 0;
            ph ^= 1;
        }
        if (++h == 2 * S) {
            h = 0;
            hph ^= 1;
        }
    }
};

/* --- mbarrier and bulk copy (sm_90) ------------------------------------------------------- */

/* bytes (a multiple of 16) from global src to shared dst, counted on bar; evict-first in L2 */
__device__ __forceinline__ void ls_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar,
                                        uint64_t policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(cuda_smem(dst)),
                 "l"(src), "r"(bytes), "r"(cuda_smem(bar)), "l"(policy)
                 : "memory");
}

/* tile t: its matrix, first row and rows */
__device__ __forceinline__ void ls_tile(const ls_kargs &a, uint32_t t, uint32_t &m, uint32_t &row,
                                        uint32_t &cnt)
{
    m = a.n_mat > 1 && t >= a.tend[0] ? (a.n_mat > 2 && t >= a.tend[1] ? 2 : 1) : 0;
    const uint32_t rows = m == 0 ? a.end[0] : a.end[m] - a.end[m - 1];
    row = (t - (m == 0 ? 0 : a.tend[m - 1])) * a.rows_per_tile;
    cnt = rows - row < a.rows_per_tile ? rows - row : a.rows_per_tile;
}

__device__ __forceinline__ float ls_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

/* the outputs of one tile from its warps' partials red [nw][per]: lanes (output, warp) each load
 * one partial, summed by a shuffle tree within groups of np2 lanes (np2 = nw rounded up to a power
 * of two), the same order every time, so the result does not depend on timing. ti: the tile's
 * matrix, first row and rows; output o is row o / NT of token o % NT; res: an adding tile's
 * outputs as they were (one token) */
template <int NT, int MODE>
__device__ __forceinline__ void ls_finish(const ls_kargs &a, const float *red, const ls_tinfo &ti,
                                          uint32_t nw, uint32_t np2, uint32_t lane,
                                          const float *res)
{
    constexpr int NR = MODE == BE_LIN_SWIGLU ? 2 : 1;
    const uint32_t m = ti.m, row = ti.row, n_o = ti.cnt * NT, per = a.rows_per_tile * NR * NT;
    const uint32_t w = lane & (np2 - 1), group = 32 / np2;
    const float *bm = m == 0 ? a.bias[0] : m == 1 ? a.bias[1] : a.bias[2];
    float *om = m == 0 ? a.out[0] : m == 1 ? a.out[1] : a.out[2];
    const uint32_t nm = m == 0 ? a.n_out[0] : m == 1 ? a.n_out[1] : a.n_out[2];
    for (uint32_t o0 = 0; o0 < n_o; o0 += group) {
        const uint32_t o = o0 + lane / np2, r = o / NT, t = o % NT;
        float v[NR];
#pragma unroll
        for (int q = 0; q < NR; q++) {
            v[q] = o < n_o && w < nw ? red[(size_t)w * per + (r * NR + q) * NT + t] : 0.0f;
            for (uint32_t off = np2 / 2; off > 0; off >>= 1)
                v[q] += __shfl_xor_sync(0xffffffff, v[q], off);
        }
        if (w != 0 || o >= n_o)
            continue;
        float *y = om + (size_t)t * nm + row + r;
        const float b = bm ? bm[row + r] : 0.0f;
        if constexpr (MODE == BE_LIN_SET)
            *y = v[0] + b;
        else if constexpr (MODE == BE_LIN_ADD)
            *y = res[r] + (v[0] + b);
        else
            *y = cuda_silu_mul1(v[0], v[NR - 1]);
    }
}

/* acc += this lane's V 16-byte vectors of a weight row (wr: its first) . x's (xr) */
template <typename W, int V>
__device__ __forceinline__ void ls_dot(const W *wr, const float *xr, float &acc)
{
    constexpr int VEC = 16 / sizeof(W);
#pragma unroll
    for (int j = 0; j < V; j++) {
        float f[VEC];
        cuda_unpack16(*(const uint4 *)(wr + j * 32 * VEC), (const W *)nullptr, f);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            acc += f[e] * xr[j * VEC + e];
    }
}

/* the producer's tile k: waits for its stage and partials slot, notes the tile for the
 * consumers and the finisher, and queues its rows (0 rows: the end, an arrival with no bytes) */
template <int NR>
__device__ __forceinline__ void ls_put(const ls_kargs &a, unsigned char *sm, uint64_t *full,
                                       const uint64_t *empty, const uint64_t *fin, ls_tinfo *info,
                                       const ls_pos &p, uint32_t k, uint32_t m, uint32_t row,
                                       uint32_t cnt, uint32_t lane, uint64_t policy)
{
    const uint32_t S = a.n_stages;
    if (k >= S)
        cuda_bar_wait((uint64_t *)&empty[p.s], p.ph ^ 1);
    if (k >= 2 * S)
        cuda_bar_wait((uint64_t *)&fin[p.h], p.hph ^ 1);
    if (lane == 0) {
        info[p.h] = {m, row, cnt, 0};
        if (cnt == 0) {
            cuda_bar_arrive(&full[p.s]);
        } else {
            const uint32_t bytes = cnt * a.row_bytes, R = a.rows_per_tile;
            const char *wm = m == 0 ? a.w[0] : m == 1 ? a.w[1] : a.w[2];
            char *st = (char *)sm + (size_t)p.s * a.stage_bytes;
            cuda_bar_expect(&full[p.s], bytes * NR);
            ls_copy(st, wm + (size_t)row * a.row_bytes, bytes, &full[p.s], policy);
            if constexpr (NR == 2)
                ls_copy(st + (size_t)R * a.row_bytes, a.w[1] + (size_t)row * a.row_bytes, bytes,
                        &full[p.s], policy);
        }
    }
    __syncwarp();
}

/* V: 16-byte vectors of a row per lane; the block has n_in / (V * 32 * VEC) consumer warps */
template <typename W, int NT, int MODE, bool NORM, int V>
__global__ void __launch_bounds__((LS_MAX_WARPS + 2) * 32, V *NT <= 2 ? 2 : 1) ls_kernel(ls_kargs a)
{
    constexpr int VEC = 16 / sizeof(W);
    constexpr int NR = MODE == BE_LIN_SWIGLU ? 2 : 1;
    extern __shared__ __align__(128) unsigned char sm[];
    const uint32_t S = a.n_stages, nw = blockDim.x / 32 - 2;
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t per = a.rows_per_tile * NR * NT; /* partials of one warp and tile */
    float *red = (float *)(sm + a.red_off);         /* [2S][nw][per] */
    uint64_t *full = (uint64_t *)(sm + a.bar_off);  /* [S] the stage's bytes landed */
    uint64_t *empty = full + LS_MAX_STAGES;         /* [S] its consumers are done */
    uint64_t *done = empty + LS_MAX_STAGES;   /* [2S] the partials of slot k % 2S are written */
    uint64_t *fin = done + 2 * LS_MAX_STAGES; /* [2S] ... and summed: the slot is free */
    float *ssq = (float *)(fin + 2 * LS_MAX_STAGES);       /* [nw][NT] sums of squares */
    ls_tinfo *info = (ls_tinfo *)(ssq + LS_MAX_WARPS * 2); /* [2S] the tiles queued */
    /* [2S][LS_MAX_ROWS] an adding tile's outputs as they were (ADD) */
    float *rsb = (float *)(info + 2 * LS_MAX_STAGES);

    if (threadIdx.x == 0) {
        for (uint32_t s = 0; s < S; s++) {
            cuda_bar_init(&full[s], 1);
            cuda_bar_init(&empty[s], nw);
        }
        for (uint32_t h = 0; h < 2 * S; h++) {
            cuda_bar_init(&done[h], nw);
            cuda_bar_init(&fin[h], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* a launch that follows with programmatic serialization may start its prefetch now */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    if (warp == nw) {
        /* producer: tile k into stage k % S once tile k - S is consumed and the partials slot
         * k % 2S that its consumers will write is summed (tile k - 2S) */
        /* evict-first: the weights are read once a step (evict-normal measured slower) */
        uint64_t policy = 0;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        ls_pos p;
        uint32_t k = 0, m, row, cnt;
        /* the first ring's tiles by block, the rest from the counter. The counter is
         * first taken after the launch before has ended (it zeroes the counter at its
         * end), when this block's ring is full anyway */
        const uint32_t first = S * gridDim.x;
        bool took = false;
        uint32_t nx = 0;
        for (;; k++, p.next(S)) {
            uint32_t t;
            if (k < S) {
                t = k * gridDim.x + blockIdx.x;
            } else {
                if (!took) {
                    asm volatile("griddepcontrol.wait;" ::: "memory");
                    if (lane == 0)
                        nx = atomicAdd(&a.ctr[0], 1);
                    took = true;
                }
                t = first + __shfl_sync(0xffffffff, nx, 0);
                /* the next one is asked for now; its answer is read a tile later */
                if (t < a.n_tiles && lane == 0)
                    nx = atomicAdd(&a.ctr[0], 1);
            }
            if (t >= a.n_tiles)
                break;
            ls_tile(a, t, m, row, cnt);
            ls_put<NR>(a, sm, full, empty, fin, info, p, k, m, row, cnt, lane, policy);
        }
        if (took && lane == 0) {
            /* every take of this block has answered; the last block to take zeroes the
             * counter (blocks take once their first ring's tiles all exist) */
            const uint32_t rest = a.n_tiles - (S - 1) * gridDim.x;
            const uint32_t takers = rest < gridDim.x ? rest : gridDim.x;
            __threadfence();
            if (atomicAdd(&a.ctr[1], 1) == takers - 1) {
                atomicExch(&a.ctr[0], 0);
                atomicExch(&a.ctr[1], 0);
            }
        }
        ls_put<NR>(a, sm, full, empty, fin, info, p, k, 0, 0, 0, lane, policy);
        return;
    }
    if (warp == nw + 1) {
        /* finisher: the outputs of each tile from its warps' partials, off the producer's path */
        uint32_t np2 = 1;
        while (np2 < nw)
            np2 *= 2;
        for (ls_pos p;; p.next(S)) {
            cuda_bar_wait(&done[p.h], p.hph);
            const ls_tinfo ti = info[p.h];
            if (ti.cnt == 0)
                return;
            /* an adding tile's outputs: its consumers read them (one token) */
            ls_finish<NT, MODE>(a, red + (size_t)p.h * nw * per, ti, nw, np2, lane,
                                rsb + p.h * LS_MAX_ROWS);
            __syncwarp();
            if (lane == 0)
                cuda_bar_arrive(&fin[p.h]);
        }
    }

    /* consumers: x of this warp's columns into registers, after the kernel that wrote it; the
     * norm's weights before that (no kernel writes them: q/k/v's and gate/up's first tile came
     * ~1 us sooner after the wait, b=1 512 / 4k +0.4 %) */
    const uint32_t col0 = warp * (V * 32 * VEC) + lane * VEC;
    float gw[NORM ? V * VEC : 1];
    if constexpr (NORM) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float4 *gv = (const float4 *)(a.nw + col0 + j * 32 * VEC);
#pragma unroll
            for (int e = 0; e < VEC / 4; e++) {
                float4 g = gv[e];
                gw[j * VEC + 4 * e] = g.x;
                gw[j * VEC + 4 * e + 1] = g.y;
                gw[j * VEC + 4 * e + 2] = g.z;
                gw[j * VEC + 4 * e + 3] = g.w;
            }
        }
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    float xr[NT][V * VEC];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float4 *xv = (const float4 *)(a.x + (size_t)t * a.n_in + col0 + j * 32 * VEC);
#pragma unroll
            for (int e = 0; e < VEC / 4; e++) {
                float4 f = xv[e];
                xr[t][j * VEC + 4 * e] = f.x;
                xr[t][j * VEC + 4 * e + 1] = f.y;
                xr[t][j * VEC + 4 * e + 2] = f.z;
                xr[t][j * VEC + 4 * e + 3] = f.w;
            }
        }
    if constexpr (NORM) {
        /* rms of each token over the whole row: the warps' sums, added in order */
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < V * VEC; i++)
                s += xr[t][i] * xr[t][i];
            s = ls_warp_sum(s);
            if (lane == 0)
                ssq[warp * NT + t] = s;
        }
        asm volatile("bar.sync 1, %0;" ::"r"(nw * 32) : "memory");
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = 0.0f;
            for (uint32_t w = 0; w < nw; w++)
                s += ssq[w * NT + t];
            const float sc = rsqrtf(s / (float)a.n_in + a.eps);
#pragma unroll
            for (int i = 0; i < V * VEC; i++)
                xr[t][i] *= gw[i] * sc;
        }
    }
    const uint32_t R = a.rows_per_tile;
    for (ls_pos p;; p.next(S)) {
        cuda_bar_wait(&full[p.s], p.ph);
        const uint32_t cnt = info[p.h].cnt;
        if (cnt == 0) {
            /* the end: the finisher learns it from the same slot */
            __syncwarp();
            if (lane == 0)
                cuda_bar_arrive(&done[p.h]);
            return;
        }
        const char *st = (const char *)sm + (size_t)p.s * a.stage_bytes;
        float *rp = red + ((size_t)p.h * nw + warp) * per;
        /* an adding tile: the outputs it adds to, loaded now by warp 0 and handed to the
         * finisher beside the partials, so the load's latency hides under the dot products */
        const bool rd = MODE == BE_LIN_ADD && NT == 1 && warp == 0 && lane < cnt;
        float rv = 0.0f;
        if (rd)
            rv = __ldcg(a.out[0] + info[p.h].row + lane);
        if (NT == 1 && R * NR == 4) {
            /* four dot products a tile (4 rows, or 2 rows of gate and up): summed over the
             * lanes by halving them, 6 shuffles instead of 20. Lanes 8j hold product j */
            float d[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t r = i / NR, q = i % NR;
                d[i] = 0.0f;
                if (r < cnt)
                    ls_dot<W, V>((const W *)(st + (size_t)(q * R + r) * a.row_bytes) + col0, xr[0],
                                 d[i]);
            }
            const bool hi = lane & 16, h8 = lane & 8;
            float k0 = hi ? d[2] : d[0], k1 = hi ? d[3] : d[1];
            k0 += __shfl_xor_sync(0xffffffff, hi ? d[0] : d[2], 16);
            k1 += __shfl_xor_sync(0xffffffff, hi ? d[1] : d[3], 16);
            float v = h8 ? k1 : k0;
            v += __shfl_xor_sync(0xffffffff, h8 ? k0 : k1, 8);
            v += __shfl_xor_sync(0xffffffff, v, 4);
            v += __shfl_xor_sync(0xffffffff, v, 2);
            v += __shfl_xor_sync(0xffffffff, v, 1);
            if ((lane & 7) == 0)
                rp[lane >> 3] = v;
        } else {
            for (uint32_t r = 0; r < cnt; r++) {
#pragma unroll
                for (int q = 0; q < NR; q++) {
                    const W *wr = (const W *)(st + (size_t)(q * R + r) * a.row_bytes) + col0;
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        float acc = 0.0f;
                        ls_dot<W, V>(wr, xr[t], acc);
                        const float v = ls_warp_sum(acc);
                        if (lane == 0)
                            rp[(r * NR + q) * NT + t] = v;
                    }
                }
            }
        }
        if (rd)
            rsb[p.h * LS_MAX_ROWS + lane] = rv;
        __syncwarp();
        if (lane == 0) {
            cuda_bar_arrive(&empty[p.s]);
            cuda_bar_arrive(&done[p.h]);
        }
    }
}

/* one instantiation: the shared memory it may use (set once), the launch */
template <typename W, int NT, int MODE, bool NORM, int V>
static int ls_run(struct cuda_ctx *c, ls_kargs &a, unsigned grid, uint32_t n_warps, size_t smem)
{
    auto fn = ls_kernel<W, NT, MODE, NORM, V>;
    static size_t smem_set;
    if (smem > smem_set) {
        CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3((n_warps + 2) * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CU_TRY(cudaLaunchKernelEx(&cfg, fn, a));
    return 0;
}

template <typename W, int MODE, bool NORM>
static int ls_run_v(struct cuda_ctx *c, ls_kargs &a, uint32_t v, unsigned grid, uint32_t n_warps,
                    size_t smem)
{
    switch (v) {
    case 1: return ls_run<W, 1, MODE, NORM, 1>(c, a, grid, n_warps, smem);
    case 2: return ls_run<W, 1, MODE, NORM, 2>(c, a, grid, n_warps, smem);
    default: return ls_run<W, 1, MODE, NORM, 4>(c, a, grid, n_warps, smem);
    }
}

template <typename W>
static int ls_launch(struct cuda_ctx *c, ls_kargs &a, int mode, bool norm, uint32_t v,
                     unsigned grid, uint32_t n_warps, size_t smem)
{
    /* the combinations a decoder layer uses: q/k/v and gate/up with the norm folded in, o and
     * down adding into the residual; others take the register kernel (linear.cu) */
    if (mode == BE_LIN_SET && norm)
        return ls_run_v<W, BE_LIN_SET, true>(c, a, v, grid, n_warps, smem);
    if (mode == BE_LIN_SWIGLU && norm)
        return ls_run_v<W, BE_LIN_SWIGLU, true>(c, a, v, grid, n_warps, smem);
    if (mode == BE_LIN_ADD && !norm)
        return ls_run_v<W, BE_LIN_ADD, false>(c, a, v, grid, n_warps, smem);
    return 1;
}

int cuda_linear_stream(struct cuda_ctx *c, const struct be_linear *l, uint32_t n)
{
    const enum be_type t = l->w[0]->type;
    const uint32_t n_in = l->in->cols;
    /* two tokens ran slower than on the register kernel; deterministic mode keeps one linear
     * kernel for every token count */
    if (c->deterministic || c->cc_major < 9 || n != 1 || (t != BE_F16 && t != BE_BF16))
        return 1;
    const bool norm = l->norm_w != NULL;
    if (!((l->mode == BE_LIN_SET && norm) || (l->mode == BE_LIN_SWIGLU && norm) ||
          (l->mode == BE_LIN_ADD && !norm)))
        return 1;
    for (uint32_t i = 1; i < l->n_w; i++)
        if (l->w[i]->type != t || l->w[i]->cols != n_in)
            return 1;
    /* a warp's slice: V vectors of 16 bytes per lane, V in 1, 2, 4: at most 16 warps and
     * V * 8 <= 32 floats of x in registers */
    const uint32_t units = n_in / 256; /* 32 lanes x 8 elements */
    if (n_in % 256 || units == 0)
        return 1;
    uint32_t v = 1;
    while (v <= 4 && (units % v || units / v > LS_MAX_WARPS))
        v *= 2;
    if (v > 4)
        return 1;
    const uint32_t n_warps = units / v;
    const int nr = l->mode == BE_LIN_SWIGLU ? 2 : 1;
    const uint32_t row_bytes = n_in * 2;
    uint32_t rpt = LS_STAGE_BYTES / (row_bytes * nr);
    rpt = rpt < 1 ? 1 : rpt > LS_MAX_ROWS ? LS_MAX_ROWS : rpt;
    const uint32_t stage = rpt * row_bytes * nr;
    uint32_t n_st = LS_RING_BYTES / stage;
    n_st = n_st > LS_MAX_STAGES ? LS_MAX_STAGES : n_st;
    if (n_st < 2)
        return 1; /* rows too wide for two stages */
    ls_kargs a = {};
    uint32_t rows = 0;
    for (uint32_t i = 0; i < l->n_w; i++) {
        a.w[i] = (const char *)l->w[i]->data;
        a.bias[i] = l->bias[i] ? (const float *)l->bias[i]->data : NULL;
        a.out[i] = l->mode == BE_LIN_SWIGLU ? (float *)l->out[0]->data : (float *)l->out[i]->data;
        a.n_out[i] = l->w[i]->rows;
        if (((uintptr_t)a.w[i] & 15) != 0)
            return 1; /* bulk copies need 16-byte aligned sources */
        rows += l->w[i]->rows;
        a.end[i] = rows;
    }
    a.n_mat = l->mode == BE_LIN_SET ? l->n_w : 1;
    a.n_rows = l->mode == BE_LIN_SET ? rows : l->w[0]->rows;
    if (l->mode != BE_LIN_SET)
        a.end[0] = a.n_rows;
    if (a.n_rows == 0)
        return 0;
    a.x = (const float *)l->in->data;
    a.nw = norm ? (const float *)l->norm_w->data : NULL;
    a.eps = l->eps;
    a.n_in = n_in;
    a.n = n;
    a.row_bytes = row_bytes;
    a.rows_per_tile = rpt;
    a.n_stages = n_st;
    a.stage_bytes = stage;
    a.red_off = n_st * stage;
    size_t bar = a.red_off + (size_t)2 * n_st * n_warps * rpt * nr * n * sizeof(float);
    bar = (bar + 15) & ~(size_t)15;
    a.bar_off = (uint32_t)bar;
    size_t smem = bar + 6 * LS_MAX_STAGES * sizeof(uint64_t) + LS_MAX_WARPS * 2 * sizeof(float) +
                  2 * LS_MAX_STAGES * sizeof(ls_tinfo) +
                  2 * LS_MAX_STAGES * LS_MAX_ROWS * sizeof(float);
    /* tiles of each matrix (SET), or of the one */
    uint32_t tiles = 0;
    for (uint32_t i = 0; i < a.n_mat; i++) {
        const uint32_t r = a.n_mat > 1 ? l->w[i]->rows : a.n_rows;
        tiles += (r + rpt - 1) / rpt;
        a.tend[i] = tiles;
    }
    a.n_tiles = tiles;
    a.ctr = c->ls_ctr;
    /* a block an SM, or one a tile when there are fewer */
    const unsigned grid = a.n_tiles < (uint32_t)c->n_sm ? a.n_tiles : (unsigned)c->n_sm;
    return t == BE_BF16 ? ls_launch<__nv_bfloat16>(c, a, l->mode, norm, v, grid, n_warps, smem)
                        : ls_launch<__half>(c, a, l->mode, norm, v, grid, n_warps, smem);
}
