/* linear_wide.cu - the fused linears of batched decode steps past the decode kernels (9..64
 * tokens, RKV_CUDA_LIN_WIDE) with 16-bit weights, on tensor cores (mma.sync m16n8k16). Off by
 * default: it still loses to cuBLAS, b=64 0.616-0.638 of the bound against 0.759-0.770 on the
 * H200 (third form; the first 0.612, the second 0.599). Each block moves only ~7-14 GB/s of
 * weights with ~48 KB of them in flight, and SMs sit idle for ~45 % of o's launch: see
 * tests/gpu/NOTES.md for what is ruled out. One launch takes a whole fused linear: q/k/v together,
 * gate/up with silu(gate)*up as the epilogue, o and down adding into the residual. cuBLAS runs them
 * as one gemm a matrix and a separate kernel for each epilogue; at batch 64 its q/k/v took 33 us
 * for 11 us of weight bytes on the H200, mostly the small k and v gemms' ramp and tile
 * quantization.
 *
 * x comes in the weights' 16-bit type (the norm's 16-bit twin, or a conversion), as for the
 * cuBLAS path. A block takes a tile of 128 weight rows (SWIGLU: 64 gate rows, then the same 64
 * up rows) over a span of k; its warps take 32 rows each (RKV_CUDA_LIN_WIDE_WR=16: 16) against
 * every token, so one weight fragment meets up to 8 token columns of x, which all the block's
 * warps share. The weights and x of each 64-wide k chunk come through a ring of shared-memory
 * stages by cp.async. With several k spans a tile (few tiles for the SMs: q/k/v, o and down),
 * the tile's blocks run as one cluster (sm_90): each keeps its span's sums in shared memory and
 * finishes 1/ks of the tile's outputs, adding the spans' sums in span order over the cluster's
 * shared memory, so the result does not depend on timing. RKV_CUDA_LIN_WIDE_TMA=1 moves the
 * stages by tensor copies from a producer warp instead (lw_tma_kernel): b=64 0.721 against
 * 0.636 in one call, before a mend of its tensor-map cache that has not run on a GPU yet. */
#include <cooperative_groups.h>

#include "worker/cuda/cuda_ops.cuh"

namespace cg = cooperative_groups;

#define LW_ROWS   128         /* weight rows a tile */
#define LW_KC     64          /* k a stage */
#define LW_LD     (LW_KC + 8) /* a stage row in 16-bit elements: ldmatrix's rows in distinct banks */
#define LW_STAGES 4           /* the cp.async form's ring */
#define LW_MAX_ST 8           /* the tensor-copy form's deepest ring */
#define LW_MAX_KS 8
#define LW_EPI    4 /* outputs a thread has in flight in the epilogue */

struct lw_kargs {
    const void *w[BE_LIN_MAX];
    const float *bias[BE_LIN_MAX];
    float *out[BE_LIN_MAX];
    uint32_t end[BE_LIN_MAX];   /* cumulative tiles of the matrices (SET) */
    uint32_t n_out[BE_LIN_MAX]; /* rows of each */
    const void *x;              /* (n, n_in) in the weights' type */
    uint32_t n_in, n, n_tiles;
    uint32_t n_st; /* the tensor-copy form's ring stages, 2..LW_MAX_ST */
};

/* 16 bytes from global to shared memory; zeros when !on (a token past n). Weights are read
 * once a step: evict-first */
__device__ __forceinline__ void lw_cp(void *dst, const void *src, bool on, uint64_t policy,
                                      bool hint)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst), sz = on ? 16 : 0;
    if (hint)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(d),
                     "l"(src), "r"(sz), "l"(policy)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(sz)
                     : "memory");
}

/* bytes of one stage: the tile's weight rows, then 8 * NT token rows of x */
__host__ __device__ constexpr size_t lw_stage_bytes(int nt)
{
    return (size_t)(LW_ROWS + 8 * nt) * LW_LD * 2;
}

/* the tile's matrix m and first row; SWIGLU's second half are the up rows */
template <int MODE>
__device__ __forceinline__ void lw_tile(const lw_kargs &a, uint32_t tile, uint32_t &m,
                                        uint32_t &row0)
{
    m = 0;
    if (MODE == BE_LIN_SWIGLU) {
        row0 = tile * (LW_ROWS / 2);
    } else {
        if (MODE == BE_LIN_SET && tile >= a.end[0])
            m = tile >= a.end[1] ? 2 : 1;
        row0 = (tile - (m == 0 ? 0 : m == 1 ? a.end[0] : a.end[1])) * LW_ROWS;
    }
}

/* a block's end, once nothing reads its stages: the consumer warps' sums d of the span (the
 * first LW_ROWS / WR warps) into shared memory, then the block's share of the tile's outputs,
 * NTHR threads */
template <int MODE, int NT, int WR, int NTHR>
__device__ __forceinline__ void lw_finish(const lw_kargs &a, unsigned char *smem,
                                          const float (&d)[WR / 16][NT][4], uint32_t m,
                                          uint32_t row0)
{
    constexpr int NA = WR / 16, TS = 8 * NT + 1; /* the sums' row in shared memory, in floats */
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t span = blockIdx.y, ks = gridDim.y;
    /* accumulator i of fragment h and group j: row warp * WR + h * 16 + lane / 4 (+ 8 for
     * i >= 2), token j * 8 + 2 * (lane % 4) + (i & 1) */
    float *sum = (float *)smem; /* (LW_ROWS, TS) */
    const uint32_t r_lo = warp * WR + (lane >> 2), t_lo = 2 * (lane & 3);
    if (NTHR == LW_ROWS / WR * 32 || warp < LW_ROWS / WR) /* a producer warp has none */
#pragma unroll
        for (int h = 0; h < NA; h++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    sum[(r_lo + h * 16 + (i >= 2 ? 8 : 0)) * TS + j * 8 + t_lo + (i & 1)] =
                        d[h][j][i];

    /* several spans: the cluster's blocks each finish 1/ks of the tile's outputs, summing the
     * spans' sums from their blocks' shared memory in span order, so the result does not
     * depend on timing (the second form's last block read them back from global memory one
     * span at a time: o took 56 us for 7.5 us of weight bytes) */
    constexpr uint32_t OR = MODE == BE_LIN_SWIGLU ? LW_ROWS / 2 : LW_ROWS; /* output rows */
    const float *ps[LW_MAX_KS];
    uint32_t r_beg = 0, r_cnt = OR;
    cg::cluster_group cl = cg::this_cluster();
    if (ks > 1) {
        cl.sync(); /* every span's sums are in its block's shared memory */
#pragma unroll
        for (uint32_t s = 0; s < LW_MAX_KS; s++)
            ps[s] = s < ks ? cl.map_shared_rank(sum, s) : sum;
        r_cnt = OR / ks;
        r_beg = span * r_cnt;
    } else {
        __syncthreads();
    }
    auto total = [&](uint32_t at) {
        if (ks == 1)
            return sum[at];
        float v[LW_MAX_KS];
#pragma unroll
        for (uint32_t s = 0; s < LW_MAX_KS; s++)
            v[s] = s < ks ? ps[s][at] : 0.0f;
        float t = v[0];
#pragma unroll
        for (uint32_t s = 1; s < LW_MAX_KS; s++)
            if (s < ks) /* in span order */
                t += v[s];
        return t;
    };

    /* the epilogue: consecutive threads take consecutive rows of one token, LW_EPI outputs a
     * thread at once, so their loads (the spans' sums, the residual) are in flight together */
    float *om = m == 0 ? a.out[0] : m == 1 ? a.out[1] : a.out[2];
    const float *bm = m == 0 ? a.bias[0] : m == 1 ? a.bias[1] : a.bias[2];
    const uint32_t nm = m == 0 ? a.n_out[0] : m == 1 ? a.n_out[1] : a.n_out[2];
    const uint32_t n_e = r_cnt * a.n;
    for (uint32_t e0 = tid; e0 < n_e; e0 += LW_EPI * NTHR) {
        float v[LW_EPI], had[LW_EPI];
        float *y[LW_EPI];
#pragma unroll
        for (int i = 0; i < LW_EPI; i++) {
            const uint32_t e = e0 + i * NTHR;
            y[i] = nullptr;
            v[i] = 0.0f;
            if (e < n_e) {
                const uint32_t r = r_beg + e % r_cnt, t = e / r_cnt;
                y[i] = om + (size_t)t * nm + row0 + r;
                if constexpr (MODE == BE_LIN_SWIGLU)
                    v[i] = cuda_silu_mul1(total(r * TS + t), total((r + OR) * TS + t));
                else
                    v[i] = total(r * TS + t) + (bm ? bm[row0 + r] : 0.0f);
            }
        }
        if constexpr (MODE == BE_LIN_ADD) {
#pragma unroll
            for (int i = 0; i < LW_EPI; i++)
                had[i] = y[i] ? *y[i] : 0.0f;
#pragma unroll
            for (int i = 0; i < LW_EPI; i++)
                v[i] += had[i];
        }
#pragma unroll
        for (int i = 0; i < LW_EPI; i++)
            if (y[i])
                *y[i] = v[i];
    }
    if (ks > 1)
        cl.sync(); /* the sums stay until every block of the cluster has read them */
}

/* grid (n_tiles, ks), clusters of the ks blocks of a tile when ks > 1: block (t, s) multiplies
 * tile t's rows by x over span s of k; NT groups of 8 tokens (n <= 8 * NT); n_in % (LW_KC * ks)
 * == 0, every matrix's rows a multiple of the tile (SWIGLU: of half of it). A warp takes WR
 * rows (16 or 32): with 32, each x fragment read from shared memory serves two weight
 * fragments (at 64 tokens the warps' x reads were 4x the weights' bytes with 16). Each thread
 * copies the same 16-byte pieces of every stage: their addresses are worked out once (the
 * second form spent ~200 of a warp's ~370 instructions a chunk on them, and ran at 0.31
 * instructions a cycle a scheduler) */
template <typename W, int MODE, int NT, int WR>
__global__ void __launch_bounds__(LW_ROWS / WR * 32, 2) lw_kernel(lw_kargs a)
{
    constexpr int LW_WARPS = LW_ROWS / WR, NA = WR / 16; /* weight fragments a warp and k step */
    constexpr int NTHR = LW_WARPS * 32, RSTEP = NTHR / 8; /* rows one round of pieces covers */
    constexpr int NTOK = 8 * NT;
    constexpr int JW = LW_ROWS / RSTEP;            /* weight pieces a thread and stage */
    constexpr int JX = (NTOK + RSTEP - 1) / RSTEP; /* x pieces a thread and stage (some idle) */
    extern __shared__ __align__(128) unsigned char lw_sm[];
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t tile = blockIdx.x, span = blockIdx.y, ks = gridDim.y;
    const uint32_t n_in = a.n_in, k_len = n_in / ks, k0 = span * k_len, chunks = k_len / LW_KC;

    uint32_t m, row0;
    lw_tile<MODE>(a, tile, m, row0);
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

    /* this thread's pieces: row (tid / 8) + j * RSTEP of the stage, 16 bytes (tid % 8) of its
     * 64-wide k chunk; the sources at k0 */
    const uint32_t pr = tid >> 3, pk = (tid & 7) * 8;
    const W *ws[JW];
#pragma unroll
    for (int j = 0; j < JW; j++) {
        const uint32_t r = pr + j * RSTEP;
        const W *wm;
        uint32_t row;
        if (MODE == BE_LIN_SWIGLU) { /* RSTEP divides the gate half: j decides the matrix */
            wm = (const W *)a.w[j < JW / 2 ? 0 : 1];
            row = row0 + (r & (LW_ROWS / 2 - 1));
        } else {
            wm = (const W *)(m == 0 ? a.w[0] : m == 1 ? a.w[1] : a.w[2]);
            row = row0 + r;
        }
        ws[j] = wm + (size_t)row * n_in + k0 + pk;
    }
    const W *xs[JX];
    bool xon[JX];
#pragma unroll
    for (int j = 0; j < JX; j++) {
        const uint32_t t = pr + j * RSTEP;
        xon[j] = t < a.n;
        xs[j] = (const W *)a.x + (size_t)(xon[j] ? t : 0) * n_in + k0 + pk;
    }
    const uint32_t s_off = pr * LW_LD + pk; /* the first piece's place in a stage, in elements */
    auto load_w = [&](uint32_t c, uint32_t st) {
        W *sw = (W *)(lw_sm + st * lw_stage_bytes(NT)) + s_off;
        const uint32_t kc = c * LW_KC;
#pragma unroll
        for (int j = 0; j < JW; j++)
            lw_cp(sw + j * RSTEP * LW_LD, ws[j] + kc, true, policy, true);
    };
    auto load_x = [&](uint32_t c, uint32_t st) {
        W *sx = (W *)(lw_sm + st * lw_stage_bytes(NT)) + LW_ROWS * LW_LD + s_off;
        const uint32_t kc = c * LW_KC;
#pragma unroll
        for (int j = 0; j < JX; j++)
            if (NTOK % RSTEP == 0 || pr + j * RSTEP < NTOK)
                lw_cp(sx + j * RSTEP * LW_LD, xs[j] + kc, xon[j], 0, false);
    };

    /* the weights do not depend on the kernel before: their first stages go out before the
     * wait, x and the residual after it */
    for (uint32_t s = 0; s + 1 < LW_STAGES; s++)
        if (s < chunks)
            load_w(s, s);
    cuda_grid_wait();
    for (uint32_t s = 0; s + 1 < LW_STAGES; s++) {
        if (s < chunks)
            load_x(s, s);
        cuda_cp_commit();
    }

    float d[NA][NT][4] = {};
    /* ldmatrix addresses: A (rows warp * 16.., row lane & 15, k half lane >> 4), B (token
     * group pair, token lane & 7, k half (lane >> 3) & 1) */
    const uint32_t a_off = (warp * WR + (lane & 15)) * LW_LD + (lane >> 4) * 8;
    const uint32_t b_off = (LW_ROWS + (lane >> 4) * 8 + (lane & 7)) * LW_LD + ((lane >> 3) & 1) * 8;
    for (uint32_t c = 0; c < chunks; c++) {
        cuda_cp_wait<LW_STAGES - 2>();
        __syncthreads(); /* stage c landed for every thread; stage c - 1 is free */
        const uint32_t nc = c + LW_STAGES - 1;
        if (nc < chunks) {
            load_w(nc, nc % LW_STAGES);
            load_x(nc, nc % LW_STAGES);
        }
        cuda_cp_commit(); /* empty past the end: one group a turn */
        const W *st = (const W *)(lw_sm + (c % LW_STAGES) * lw_stage_bytes(NT));
#pragma unroll
        for (int kk = 0; kk < LW_KC / 16; kk++) {
            uint32_t af[NA][4];
#pragma unroll
            for (int h = 0; h < NA; h++)
                cuda_ldsm4<false>(af[h][0], af[h][1], af[h][2], af[h][3],
                                  st + a_off + h * 16 * LW_LD + kk * 16);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint32_t bf[4];
                cuda_ldsm4<false>(bf[0], bf[1], bf[2], bf[3], st + b_off + j * 8 * LW_LD + kk * 16);
#pragma unroll
                for (int h = 0; h < NA; h++) {
                    cuda_mma16816<W>(d[h][j], af[h][0], af[h][1], af[h][2], af[h][3], bf[0], bf[1]);
                    cuda_mma16816<W>(d[h][j + 1], af[h][0], af[h][1], af[h][2], af[h][3], bf[2],
                                     bf[3]);
                }
            }
        }
    }
    cuda_cp_wait<0>();
    __syncthreads(); /* the stages become the span's sums */

    lw_finish<MODE, NT, WR, NTHR>(a, lw_sm, d, m, row0);
}

/* --- the tensor-copy form (RKV_CUDA_LIN_WIDE_TMA=1) ------------------------------------------- */

/* byte offset of row r's 16-byte column c in a stage area the tensor copies fill: rows of 128
 * bytes, the columns permuted by the 128-byte swizzle (column ^ row % 8) */
__device__ __forceinline__ uint32_t lw_sw(uint32_t r, uint32_t c)
{
    return r * 128 + ((c ^ (r & 7)) << 4);
}

/* bytes of one stage of the tensor-copy form: the tile's 128 weight rows, then NTOK token rows
 * of x, 128 bytes (64 k) each, unpadded */
__host__ __device__ constexpr uint32_t lw_tstage_bytes(int nt)
{
    return (LW_ROWS + 8 * nt) * 128;
}

/* the same product as lw_kernel, each stage moved by tensor copies (TMA) that one producer warp
 * queues onto the stage's full mbarrier: two boxes of 64 weight rows x 64 k (tw[m]; SWIGLU: gate
 * rows from tw0, then the same up rows from tw1) and one of NT * 8 tokens x 64 k (tx; tokens
 * past n arrive as zeros). The consumer warps wait on the stage alone and release it on its
 * empty mbarrier, with no barrier of the block a chunk. The cp.async form moved 7-14 GB/s a
 * block with ~48 KB in flight; linear_stream.cu's ring of bulk copies reaches ~0.9 of hbm at
 * one token. Launch: LW_ROWS / WR + 1 warps, the last the producer */
template <typename W, int MODE, int NT, int WR>
__global__ void __launch_bounds__((LW_ROWS / WR + 1) * 32, 2)
    lw_tma_kernel(lw_kargs a, const __grid_constant__ CUtensorMap tw0,
                  const __grid_constant__ CUtensorMap tw1, const __grid_constant__ CUtensorMap tw2,
                  const __grid_constant__ CUtensorMap tx)
{
    constexpr int LW_WARPS = LW_ROWS / WR, NA = WR / 16;
    constexpr uint32_t SB = lw_tstage_bytes(NT), XOFF = LW_ROWS * 128;
    extern __shared__ __align__(128) unsigned char lw_sm[];
    /* the swizzle's pattern needs 1024-byte aligned boxes */
    unsigned char *sm = lw_sm + ((1024 - (cuda_smem(lw_sm) & 1023)) & 1023);
    const uint32_t S = a.n_st;
    uint64_t *full = (uint64_t *)(sm + S * SB), *empty = full + LW_MAX_ST;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t tile = blockIdx.x, span = blockIdx.y, ks = gridDim.y;
    const uint32_t k_len = a.n_in / ks, k0 = span * k_len, chunks = k_len / LW_KC;
    uint32_t m, row0;
    lw_tile<MODE>(a, tile, m, row0);
    if (tid == 0) {
        for (uint32_t s = 0; s < S; s++) {
            cuda_bar_init(&full[s], 1);
            cuda_bar_init(&empty[s], LW_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    float d[NA][NT][4] = {};
    if (warp == LW_WARPS) {
        /* the producer: chunk c into stage c % S once chunk c - S is consumed; the weights of
         * the first stages before the wait for the kernel before, x after it */
        if (lane == 0) {
            uint64_t policy;
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
            const CUtensorMap *tm = m == 0 ? &tw0 : m == 1 ? &tw1 : &tw2;
            const CUtensorMap *tm2 = MODE == BE_LIN_SWIGLU ? &tw1 : tm;
            const int32_t y2 = (int32_t)(MODE == BE_LIN_SWIGLU ? row0 : row0 + LW_ROWS / 2);
            const uint32_t pre = chunks < S ? chunks : S;
            for (uint32_t c = 0; c < pre; c++) {
                unsigned char *st = sm + c * SB;
                const int32_t kc = (int32_t)(k0 + c * LW_KC);
                cuda_bar_expect(&full[c], SB);
                cuda_tma_2d(st, tm, kc, (int32_t)row0, &full[c], policy);
                cuda_tma_2d(st + XOFF / 2, tm2, kc, y2, &full[c], policy);
            }
            cuda_grid_wait();
            for (uint32_t c = 0; c < pre; c++)
                cuda_tma_2d(sm + c * SB + XOFF, &tx, (int32_t)(k0 + c * LW_KC), 0, &full[c], 0);
            /* chunk c (from S on) goes to stage s = c % S once the stage's use c - S is
             * released: phase ph = (c / S - 1) % 2 of its empty barrier */
            uint32_t s = 0, ph = 0;
            for (uint32_t c = S; c < chunks; c++) {
                unsigned char *st = sm + s * SB;
                const int32_t kc = (int32_t)(k0 + c * LW_KC);
                cuda_bar_wait(&empty[s], ph);
                cuda_bar_expect(&full[s], SB);
                cuda_tma_2d(st, tm, kc, (int32_t)row0, &full[s], policy);
                cuda_tma_2d(st + XOFF / 2, tm2, kc, y2, &full[s], policy);
                cuda_tma_2d(st + XOFF, &tx, kc, 0, &full[s], 0);
                if (++s == S) {
                    s = 0;
                    ph ^= 1;
                }
            }
        }
        __syncwarp();
        cuda_grid_wait(); /* every lane writes outputs in the epilogue */
    } else {
        cuda_grid_wait(); /* the epilogue reads and writes what the kernel before may write */
        /* ldmatrix rows: A (rows warp * WR + h * 16 + lane % 16, column pair lane / 16), B
         * (tokens j * 8 + lane / 16 * 8 + lane % 8, column (lane / 8) % 2); a row's % 8 is the
         * lane's, so the swizzle of column 2 kk + h is (2 kk) ^ (h ^ lane % 8) */
        const uint32_t ra = warp * WR + (lane & 15), ma = (lane >> 4) ^ (lane & 7);
        const uint32_t rb = (lane >> 4) * 8 + (lane & 7), mb = ((lane >> 3) & 1) ^ (lane & 7);
        uint32_t s = 0, ph = 0; /* chunk c's stage, c % S, and its full phase, c / S % 2 */
        for (uint32_t c = 0; c < chunks; c++) {
            cuda_bar_wait(&full[s], ph);
            const unsigned char *st = sm + s * SB;
#pragma unroll
            for (int kk = 0; kk < LW_KC / 16; kk++) {
                uint32_t af[NA][4];
#pragma unroll
                for (int h = 0; h < NA; h++)
                    cuda_ldsm4<false>(af[h][0], af[h][1], af[h][2], af[h][3],
                                      st + (ra + h * 16) * 128 + (((2 * kk) ^ ma) << 4));
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    uint32_t bf[4];
                    cuda_ldsm4<false>(bf[0], bf[1], bf[2], bf[3],
                                      st + XOFF + (rb + j * 8) * 128 + (((2 * kk) ^ mb) << 4));
#pragma unroll
                    for (int h = 0; h < NA; h++) {
                        cuda_mma16816<W>(d[h][j], af[h][0], af[h][1], af[h][2], af[h][3], bf[0],
                                         bf[1]);
                        cuda_mma16816<W>(d[h][j + 1], af[h][0], af[h][1], af[h][2], af[h][3], bf[2],
                                         bf[3]);
                    }
                }
            }
            __syncwarp(); /* the warp's reads of the stage are done (ldmatrix returned) */
            if (lane == 0)
                cuda_bar_arrive(&empty[s]);
            if (++s == S) {
                s = 0;
                ph ^= 1;
            }
        }
    }
    __syncthreads(); /* every stage consumed: they become the span's sums */
    lw_finish<MODE, NT, WR, (LW_ROWS / WR + 1) * 32>(a, sm, d, m, row0);
}

/* shared memory of a tensor-copy launch of ns stages: the stages and their barriers (or the
 * tile's sums if larger), and room to align them to 1024 bytes */
static size_t lw_tsmem(int nt, uint32_t ns)
{
    const size_t st = ns * (size_t)lw_tstage_bytes(nt) + 2 * LW_MAX_ST * sizeof(uint64_t),
                 sums = (size_t)LW_ROWS * (8 * nt + 1) * 4;
    return (st > sums ? st : sums) + 1024;
}

/* the deepest ring (2..LW_MAX_ST) whose launch fits in budget bytes of shared memory a block */
static uint32_t lw_tstages_in(int nt, size_t budget)
{
    uint32_t ns = 2;
    while (ns < LW_MAX_ST && lw_tsmem(nt, ns + 1) <= budget)
        ns++;
    return ns;
}

/* shared memory of a launch: the stages, or the tile's sums if larger */
static size_t lw_smem(int nt)
{
    const size_t st = LW_STAGES * lw_stage_bytes(nt), sums = (size_t)LW_ROWS * (8 * nt + 1) * 4;
    return st > sums ? st : sums;
}

/* the launch of a (n_tiles, ks) grid: clusters of a tile's ks blocks (the first attribute),
 * programmatic serialization when c->pdl (at: room for both attributes) */
static cudaLaunchConfig_t lw_config(const struct cuda_ctx *c, uint32_t n_tiles, uint32_t ks,
                                    uint32_t threads, size_t smem, cudaLaunchAttribute *at)
{
    return cuda_launch_cfg(c, dim3(n_tiles, ks), dim3(threads), smem, c->stream, at, ks);
}

/* clusters of 2, 4 and 8 blocks of fn that run at once with smem bytes each, into fit[1..3]
 * (fit[0]: one block, no limit); the same on every gpu of one kind, so once a kernel and size
 * (fn's dynamic shared memory attribute set before, to at least smem) */
template <typename F>
static int lw_fit(struct cuda_ctx *c, F fn, uint32_t threads, size_t smem, int (&fit)[4])
{
    if (fit[0] >= 0)
        return 0;
    fit[0] = 1 << 30;
    for (int i = 1; i < 4; i++) {
        cudaLaunchAttribute at[2];
        cudaLaunchConfig_t cfg = lw_config(c, 8, 1u << i, threads, smem, at);
        cfg.numAttrs = 1; /* the cluster's shape alone */
        if (cudaOccupancyMaxActiveClusters(&fit[i], fn, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            fit[i] = 0;
        }
    }
    return 0;
}

/* spans the grid's choice (not RKV_CUDA_LIN_WIDE_KS's) halves until the clusters run in one
 * wave: a second wave of clusters would double the launch */
static uint32_t lw_fit_spans(const struct cuda_ctx *c, const int (&fit)[4], uint32_t n_tiles,
                             uint32_t ks)
{
    if (!c->lw_ks)
        while (ks > 1 && (uint32_t)fit[ks == 2 ? 1 : ks == 4 ? 2 : 3] < n_tiles)
            ks /= 2;
    return ks;
}

/* --- tensor maps of the tensor-copy form, cached by tensor (weights are mapped once) -------- */

#define LW_TMAPS 1024 /* slots; a model's matrices, and the x shapes seen */

struct lw_tmap {
    const void *p;
    uint32_t rows, cols, box_rows, type;
    CUtensorMap tm; /* aligned as its type asks: the table comes from aligned_alloc */
};

/* *tm = the map of p as (rows, cols) 16-bit elements of type t in boxes of 64 columns x box_rows
 * rows, the 128-byte swizzle, zeros past the rows; 1 when the driver cannot encode it. A copy:
 * a later call may reuse the slot it came from (the first try returned pointers into the
 * table, and the next lookup of the same launch could overwrite them: 23 cases failed on the
 * H200) */
static int lw_tmap_get(struct cuda_ctx *c, const void *p, uint32_t rows, uint32_t cols,
                       uint32_t box_rows, enum be_type t, CUtensorMap *tm)
{
    const cuda_tmap_encode_fn enc = cuda_tmap_encoder();
    if (!enc)
        return 1;
    if (!c->lw_tmaps) {
        const size_t bytes = LW_TMAPS * sizeof(struct lw_tmap);
        if (!(c->lw_tmaps = aligned_alloc(alignof(struct lw_tmap), bytes)))
            return RKV_ENOMEM;
        memset(c->lw_tmaps, 0, bytes);
    }
    struct lw_tmap *tab = (struct lw_tmap *)c->lw_tmaps;
    /* splitmix64's finalizer over the key: device pointers share their low bits */
    uint64_t h = (uint64_t)(uintptr_t)p ^ ((uint64_t)rows << 40) ^ ((uint64_t)box_rows << 32) ^
                 ((uint64_t)t << 60);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    struct lw_tmap *slot = NULL;
    for (uint32_t i = 0; i < 16; i++) {
        struct lw_tmap *e = &tab[(h + i) % LW_TMAPS];
        if (e->p == p && e->rows == rows && e->cols == cols && e->box_rows == box_rows &&
            e->type == (uint32_t)t) {
            *tm = e->tm;
            return 0;
        }
        if (!slot && !e->p)
            slot = e;
    }
    if (!slot)
        slot = &tab[h % LW_TMAPS]; /* crowded here: replaced */
    const cuuint64_t dim[2] = {cols, rows}, stride[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {LW_KC, box_rows}, one[2] = {1, 1};
    CUresult r = enc(
        &slot->tm,
        t == BE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
        (void *)p, dim, stride, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        slot->p = NULL;
        log_warn("cuda: cuTensorMapEncodeTiled refused a %ux%u matrix (error %d); the wide "
                 "linears copy with cp.async",
                 rows, cols, (int)r);
        return 1;
    }
    slot->p = p;
    slot->rows = rows;
    slot->cols = cols;
    slot->box_rows = box_rows;
    slot->type = (uint32_t)t;
    *tm = slot->tm;
    return 0;
}

template <typename W, int MODE, int NT, int WR>
static int lw_run_nt(struct cuda_ctx *c, const lw_kargs &a, uint32_t ks)
{
    cudaLaunchAttribute at[2];
    if (c->lw_tma) {
        /* the tensor-copy form, when every matrix and x map */
        const enum be_type t = std::is_same<W, __half>::value ? BE_F16 : BE_BF16;
        CUtensorMap tw[BE_LIN_MAX], tx;
        int rc = lw_tmap_get(c, a.x, a.n, a.n_in, 8 * NT, t, &tx);
        for (int i = 0; rc == 0 && i < BE_LIN_MAX; i++) {
            if (a.w[i])
                rc = lw_tmap_get(c, a.w[i], a.n_out[i], a.n_in, LW_ROWS / 2, t, &tw[i]);
            else
                tw[i] = tw[0]; /* unused: the kernel takes three */
        }
        if (rc < 0)
            return rc;
        if (rc == 0) {
            auto fn = lw_tma_kernel<W, MODE, NT, WR>;
            const uint32_t threads = (LW_ROWS / WR + 1) * 32;
            /* rings as deep as two blocks an SM allow (s2), or one (s1); with the clusters
             * that fit, the same on every gpu of one kind, so once a kernel */
            static uint32_t s1, s2;
            static int fit[LW_MAX_ST + 1][4];
            if (!s1) {
                const uint32_t deep = lw_tstages_in(
                    NT, c->smem_block < c->smem_sm - 1024 ? c->smem_block : c->smem_sm - 1024);
                CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)lw_tsmem(NT, deep)));
                for (auto &f : fit)
                    f[0] = -1;
                s2 = lw_tstages_in(NT, c->smem_sm / 2 - 1024);
                s1 = deep; /* last: a failed attribute is tried again next launch */
            }
            uint32_t ns = c->lw_stages ? (c->lw_stages < s1 ? c->lw_stages : s1) : s2;
            if ((rc = lw_fit(c, fn, threads, lw_tsmem(NT, ns), fit[ns])) < 0)
                return rc;
            ks = lw_fit_spans(c, fit[ns], a.n_tiles, ks);
            /* a grid of one block an SM or fewer takes the deeper ring when its clusters still
             * run in one wave: o and down at b=64 run 32 tiles x 4 spans (128 blocks) */
            if (!c->lw_stages && s1 > s2 && a.n_tiles * ks <= (uint32_t)c->n_sm) {
                if ((rc = lw_fit(c, fn, threads, lw_tsmem(NT, s1), fit[s1])) < 0)
                    return rc;
                if (ks == 1 || (uint32_t)fit[s1][ks == 2 ? 1 : ks == 4 ? 2 : 3] >= a.n_tiles)
                    ns = s1;
            }
            lw_kargs b = a;
            b.n_st = ns;
            const cudaLaunchConfig_t cfg =
                lw_config(c, a.n_tiles, ks, threads, lw_tsmem(NT, ns), at);
            CU_TRY(cudaLaunchKernelEx(&cfg, fn, b, tw[0], tw[1], tw[2], tx));
            c->hst.lin_wide++;
            c->hst.lin_wide_tma++;
            return 0;
        }
    }
    auto fn = lw_kernel<W, MODE, NT, WR>;
    const size_t smem = lw_smem(NT);
    const uint32_t threads = LW_ROWS / WR * 32;
    static int fit[4] = {-1, -1, -1, -1};
    if (fit[0] < 0)
        CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int rc = lw_fit(c, fn, threads, smem, fit);
    if (rc < 0)
        return rc;
    ks = lw_fit_spans(c, fit, a.n_tiles, ks);
    const cudaLaunchConfig_t cfg = lw_config(c, a.n_tiles, ks, threads, smem, at);
    CU_TRY(cudaLaunchKernelEx(&cfg, fn, a));
    c->hst.lin_wide++;
    return 0;
}

template <typename W, int MODE, int WR>
static int lw_run_wr(struct cuda_ctx *c, const lw_kargs &a, uint32_t ks)
{
    if (a.n <= 16)
        return lw_run_nt<W, MODE, 2, WR>(c, a, ks);
    if (a.n <= 32)
        return lw_run_nt<W, MODE, 4, WR>(c, a, ks);
    return lw_run_nt<W, MODE, 8, WR>(c, a, ks);
}

template <typename W, int MODE>
static int lw_run(struct cuda_ctx *c, const lw_kargs &a, uint32_t ks)
{
    return c->lw_wr == 16 ? lw_run_wr<W, MODE, 16>(c, a, ks) : lw_run_wr<W, MODE, 32>(c, a, ks);
}

template <typename W> static int lw_go(struct cuda_ctx *c, const lw_kargs &a, int mode, uint32_t ks)
{
    if (mode == BE_LIN_SWIGLU)
        return lw_run<W, BE_LIN_SWIGLU>(c, a, ks);
    if (mode == BE_LIN_ADD)
        return lw_run<W, BE_LIN_ADD>(c, a, ks);
    return lw_run<W, BE_LIN_SET>(c, a, ks);
}

/* k spans a tile (c->lw_ks when set and it divides the chunks): the most that keep the grid
 * in one wave of two blocks an SM, each span whole chunks and at least 4 of them. The first
 * form took spans until the grid passed two blocks an SM: q/k/v ran in 1.45 waves of 8-chunk
 * blocks */
static uint32_t lw_spans(const struct cuda_ctx *c, uint32_t n_tiles, uint32_t n_in)
{
    const uint32_t chunks = n_in / LW_KC;
    if (c->lw_ks && chunks % c->lw_ks == 0)
        return c->lw_ks;
    uint32_t ks = 1;
    while (ks < LW_MAX_KS && (uint64_t)n_tiles * ks * 2 <= 2 * (uint64_t)c->n_sm &&
           chunks % (2 * ks) == 0 && chunks / (2 * ks) >= 4)
        ks *= 2;
    return ks;
}

/* x for the kernel in type t: the norm first, with its 16-bit twin, when the linear folds one;
 * else matmul.cu's act16 (a twin left there, or a conversion) */
static int lw_input(struct cuda_ctx *c, const struct be_linear *l, uint32_t n, enum be_type t,
                    const void **x)
{
    const uint32_t n_in = l->in->cols;
    const size_t elems = (size_t)n * n_in;
    const float *in = (const float *)l->in->data;
    if (!l->norm_w) {
        int rc = cuda_act16(c, in, elems, t);
        *x = c->act16;
        return rc;
    }
    /* act16 is to hold no copy of a tensor the matmuls know; the normed rows go to lin_h in
     * f32 too (scratch, which nothing reads after) */
    c->act16_ok = 0;
    int rc = cuda_scratch(c, &c->act16, &c->act16_cap, elems * 2);
    if (rc == 0)
        rc = cuda_scratch(c, &c->lin_h, &c->lin_h_cap, elems * sizeof(float));
    if (rc == 0)
        rc = cuda_rmsnorm(c, (float *)c->lin_h, in, (const float *)l->norm_w->data, n, n_in, l->eps,
                          c->act16, t);
    if (rc == 1) /* that width's kernel writes no twin */
        rc = cuda_convert_f32(c, c->act16, t, (const float *)c->lin_h, elems);
    *x = c->act16;
    return rc;
}

int cuda_linear_wide(struct cuda_ctx *c, const struct be_linear *l, uint32_t n)
{
    const uint32_t n_in = l->in->cols;
    const enum be_type t = l->w[0]->type;
    if (!c->lin_wide || n > (uint32_t)c->lin_wide || n > 64 || c->cc_major < 9 ||
        (t != BE_BF16 && t != BE_F16) || n_in % LW_KC || l->n_w > BE_LIN_MAX)
        return 1;
    const uint32_t tr = l->mode == BE_LIN_SWIGLU ? LW_ROWS / 2 : LW_ROWS;
    lw_kargs a = {};
    uint32_t tiles = 0;
    for (uint32_t i = 0; i < l->n_w; i++) {
        const struct be_tensor *w = l->w[i];
        if (w->type != t || w->cols != n_in || w->rows % tr || ((uintptr_t)w->data & 15))
            return 1;
        a.w[i] = w->data;
        a.bias[i] = l->bias[i] ? (const float *)l->bias[i]->data : NULL;
        a.out[i] = l->mode == BE_LIN_SWIGLU ? (float *)l->out[0]->data : (float *)l->out[i]->data;
        a.n_out[i] = w->rows;
        tiles += w->rows / tr;
        a.end[i] = tiles;
    }
    a.n_tiles = l->mode == BE_LIN_SWIGLU ? l->w[0]->rows / tr : tiles;
    if (!a.n_tiles)
        return 0;
    const uint32_t ks = lw_spans(c, a.n_tiles, n_in);
    int rc = lw_input(c, l, n, t, &a.x);
    if (rc < 0)
        return rc;
    a.n_in = n_in;
    a.n = n;
    rc = t == BE_BF16 ? lw_go<__nv_bfloat16>(c, a, l->mode, ks) : lw_go<__half>(c, a, l->mode, ks);
    c->act16_ok = 0; /* the outputs are written without matmul.cu's overlap test */
    return rc;
}
