/* linear_mma.cu - the decode linears and matmuls of 2-8 tokens with 16-bit weights on tensor
 * cores (mma.sync m16n8k16, sm_80+). The tokens are the mma's 8 columns, so one 16-row weight
 * tile meets every token's x in one instruction: the register kernel (linear.cu) instead reloads
 * each token's x for every weight row, which bound it at 8 tokens (0.28 of the hbm bound against
 * cublas's 0.62, H200 llama3-8b b=8).
 *
 * Each lane turns its slice of x into two 16-bit parts as it goes, the rounding and its residual
 * (x = hi + lo to 16 bits of mantissa), so the products keep close to the register kernel's f32
 * sums; a folded norm multiplies x by the norm weight on the way and scales the sums by each
 * token's 1 / rms at the end (the task's warps see all of x between them). Each lane copies 16
 * contiguous bytes of a weight row into shared memory (cp.async) and reads them back as its A
 * fragment; the k order inside a 32-wide slice is permuted the same way for x, which leaves
 * every dot product as it was. */
#include "worker/cuda/cuda_ops.cuh"

#define LM_WARPS  8
#define LM_STAGES 2 /* groups of slices a warp has in flight or in use */

/* 32-wide k slices a group takes: 4 KiB of weights a warp and group with SWIGLU's pair, and
 * 2 KiB with a folded norm (its weights prefetched beside x cost 32 registers more) */
static constexpr int lm_slices(int mode, bool norm)
{
    return mode == BE_LIN_SWIGLU || norm ? 2 : 4;
}

struct lm_kargs {
    const void *w[BE_LIN_MAX];
    const float *bias[BE_LIN_MAX];
    float *out[BE_LIN_MAX];
    uint32_t end[BE_LIN_MAX];   /* cumulative 16-row tiles of the matrices (SET) */
    uint32_t n_out[BE_LIN_MAX]; /* rows of each */
    const float *x;             /* (n, n_in) */
    const float *nw;            /* (n_in) norm weight, NORM only */
    float eps;
    uint32_t n_in, n, n_tiles; /* a task: one tile (SWIGLU: a gate tile and its up tile) */
};

/* --- the tensor-core kernel ----------------------------------------------------------------- */

/* 16 bytes of weights from global to this lane's landing slot in shared memory, evict-first
 * in L2: the bytes in flight cost no registers, and the compiler cannot sink the loads behind
 * the mma chain (with plain loads it did, and the kernel read 2.2 TB/s) */
__device__ __forceinline__ void lm_cp(uint4 *dst, const void *src, uint64_t policy)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "l"(policy)
                 : "memory");
}

/* 4 floats of x or the norm weight; zeros when !on */
__device__ __forceinline__ float4 lm_ld_x(const float *p, bool on)
{
    return on ? __ldg((const float4 *)p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* two floats as a packed 16-bit pair of W (the first in the low half) and the pair of
 * residuals */
template <typename W>
__device__ __forceinline__ void lm_split2(float a, float b, uint32_t &h, uint32_t &l)
{
    if constexpr (std::is_same_v<W, __half>) {
        const __half2 hh = __floats2half2_rn(a, b);
        const float2 r = __half22float2(hh);
        const __half2 ll = __floats2half2_rn(a - r.x, b - r.y);
        h = *(const uint32_t *)&hh;
        l = *(const uint32_t *)&ll;
    } else {
        const __nv_bfloat162 hh = __floats2bfloat162_rn(a, b);
        const float2 r = __bfloat1622float2(hh);
        const __nv_bfloat162 ll = __floats2bfloat162_rn(a - r.x, b - r.y);
        h = *(const uint32_t *)&hh;
        l = *(const uint32_t *)&ll;
    }
}

/* 8 values of x in two 16-bit parts, in memory order (xh.x holds values 0 and 1) */
template <typename W>
__device__ __forceinline__ void lm_split8(const float4 &a, const float4 &b, uint4 &xh, uint4 &xl)
{
    lm_split2<W>(a.x, a.y, xh.x, xl.x);
    lm_split2<W>(a.z, a.w, xh.y, xl.y);
    lm_split2<W>(b.x, b.y, xh.z, xl.z);
    lm_split2<W>(b.z, b.w, xh.w, xl.w);
}

/* one 32-wide k slice: lane (g, q) holds 8 weights of rows g and g+8 (w0, w1) and 8 x values of
 * token g at the same k (xh, xl). The fragments want k 2q, 2q+1 and 2q+8, 2q+9 of a 16-wide
 * step; taking the lane's 8 contiguous values as two such steps permutes k alike in a and b.
 * The high and low parts go to separate sums (dh, dl): two shorter mma chains */
template <typename W>
__device__ __forceinline__ void lm_slice(float (&dh)[4], float (&dl)[4], const uint4 &w0,
                                         const uint4 &w1, const uint4 &xh, const uint4 &xl)
{
    cuda_mma16816<W>(dh, w0.x, w1.x, w0.y, w1.y, xh.x, xh.y);
    cuda_mma16816<W>(dl, w0.x, w1.x, w0.y, w1.y, xl.x, xl.y);
    cuda_mma16816<W>(dh, w0.z, w1.z, w0.w, w1.w, xh.z, xh.w);
    cuda_mma16816<W>(dl, w0.z, w1.z, w0.w, w1.w, xl.z, xl.w);
}

/* x of the U slices at k (zeros unless on) and the norm weight's (NORM, when g_on) */
template <int U, bool NORM>
__device__ __forceinline__ void lm_ld_group(float4 (&x)[U][2], float4 (&gw)[NORM ? U : 1][2],
                                            const float *xr, const float *nr, uint32_t k, bool on,
                                            bool g_on)
{
#pragma unroll
    for (int j = 0; j < U; j++) {
        x[j][0] = lm_ld_x(xr + k + j * 32, on);
        x[j][1] = lm_ld_x(xr + k + j * 32 + 4, on);
        if constexpr (NORM) {
            gw[j][0] = lm_ld_x(nr + k + j * 32, g_on);
            gw[j][1] = lm_ld_x(nr + k + j * 32 + 4, g_on);
        }
    }
}

/* x of U slices (times the norm weight with NORM; ss: the sum of squares of x) into the sums */
template <typename W, int U, int NM, bool NORM>
__device__ __forceinline__ void lm_group(float (&dh)[NM][4], float (&dl)[NM][4], float &ss,
                                         const uint4 (&u)[U][NM][2], const float4 (&x)[U][2],
                                         const float4 (&g)[NORM ? U : 1][2])
{
#pragma unroll
    for (int j = 0; j < U; j++) {
        float4 a = x[j][0], b = x[j][1];
        if constexpr (NORM) {
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y +
                  b.z * b.z + b.w * b.w;
            a.x *= g[j][0].x, a.y *= g[j][0].y, a.z *= g[j][0].z, a.w *= g[j][0].w;
            b.x *= g[j][1].x, b.y *= g[j][1].y, b.z *= g[j][1].z, b.w *= g[j][1].w;
        }
        uint4 xh, xl;
        lm_split8<W>(a, b, xh, xl);
#pragma unroll
        for (int t = 0; t < NM; t++)
            lm_slice<W>(dh[t], dl[t], u[j][t][0], u[j][t][1], xh, xl);
    }
}

/* grid-stride over tasks; a task's k range is split in KS spans, one warp each, summed in a
 * fixed order through shared memory. A warp moves its weights in groups of U slices through a
 * ring of LM_STAGES groups in shared memory, each lane reading back only what it copied.
 * n_in % (32 * U * KS) == 0 */
template <typename W, int MODE, bool NORM, int KS, int U>
__global__ void __launch_bounds__(LM_WARPS * 32) lm_kernel(lm_kargs a)
{
    constexpr int NM = MODE == BE_LIN_SWIGLU ? 2 : 1; /* tiles a task takes: gate and up */
    constexpr int TPB = LM_WARPS / KS;
    constexpr int NV = NM * 4 + 1; /* a lane's values to sum over the spans: sums, then ss */
    constexpr int SL = U * NM * 2; /* 16-byte pieces a lane lands per group */
    __shared__ float red[KS > 1 ? LM_WARPS : 1][NV][32];
    extern __shared__ uint4 lm_ring[];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t sub = warp % KS, slot = warp / KS, g = lane >> 2, q = lane & 3;
    const uint32_t n_in = a.n_in, span = n_in / KS, k_beg = sub * span;
    const uint32_t groups = span / (32 * U);
    const bool tok = g < a.n; /* this lane's x column is a token of the step */
    const float *xr = a.x + (size_t)(tok ? g : 0) * n_in + q * 8;
    const float *nr = NORM ? a.nw + q * 8 : nullptr;
    uint4 *ring = lm_ring + (size_t)warp * LM_STAGES * SL * 32 + lane; /* [stage][piece][lane] */
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    for (uint32_t base = blockIdx.x * TPB; base < a.n_tiles; base += gridDim.x * TPB) {
        const uint32_t task = base + slot;
        const bool live = task < a.n_tiles;
        uint32_t m = 0, tile = live ? task : 0;
        if (MODE == BE_LIN_SET && tile >= a.end[0]) {
            m = tile >= a.end[1] ? 2 : 1;
            tile -= m == 1 ? a.end[0] : a.end[1];
        }
        const uint32_t row0 = tile * 16;
        const void *wm = m == 0 ? a.w[0] : m == 1 ? a.w[1] : a.w[2];
        const W *wr[NM];
        wr[0] = (const W *)wm + (size_t)(row0 + g) * n_in + q * 8 + k_beg;
        if constexpr (NM == 2)
            wr[1] = (const W *)a.w[1] + (size_t)(row0 + g) * n_in + q * 8 + k_beg;
        const size_t r8 = (size_t)8 * n_in; /* row g + 8 */
        /* group gi's slices into its stage */
        auto issue = [&](uint32_t gi) {
            uint4 *st = ring + (gi % LM_STAGES) * SL * 32;
#pragma unroll
            for (int j = 0; j < U; j++)
#pragma unroll
                for (int t = 0; t < NM; t++) {
                    const W *p = wr[t] + gi * U * 32 + j * 32;
                    lm_cp(st + ((j * NM + t) * 2) * 32, p, policy);
                    lm_cp(st + ((j * NM + t) * 2 + 1) * 32, p + r8, policy);
                }
        };
        float dh[NM][4], dl[NM][4], ss = 0.0f;
#pragma unroll
        for (int t = 0; t < NM; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                dh[t][i] = dl[t][i] = 0.0f;
        if (live) {
#pragma unroll
            for (int s = 0; s < LM_STAGES - 1; s++) {
                if ((uint32_t)s < groups)
                    issue(s);
                cuda_cp_commit();
            }
        }
        /* x (and the norm weight) of a group come from l2 at l2's latency, which stalled the
         * conversions when loaded in the group's own turn (two thirds of the warp samples,
         * ncu): each turn loads the next group's */
        float4 x[U][2], gw[NORM ? U : 1][2];
        lm_ld_group<U, NORM>(x, gw, xr, nr, k_beg, live && tok, live);
        for (uint32_t gi = 0; live && gi < groups; gi++) {
            if (gi + LM_STAGES - 1 < groups)
                issue(gi + LM_STAGES - 1);
            cuda_cp_commit(); /* empty past the end: the count stays one group a turn */
            const bool more = gi + 1 < groups;
            float4 xn[U][2], gn[NORM ? U : 1][2];
            lm_ld_group<U, NORM>(xn, gn, xr, nr, k_beg + (gi + 1) * U * 32, more && tok, more);
            cuda_cp_wait<LM_STAGES - 1>();
            const uint4 *st = ring + (gi % LM_STAGES) * SL * 32;
            uint4 u[U][NM][2];
#pragma unroll
            for (int j = 0; j < U; j++)
#pragma unroll
                for (int t = 0; t < NM; t++) {
                    u[j][t][0] = st[((j * NM + t) * 2) * 32];
                    u[j][t][1] = st[((j * NM + t) * 2 + 1) * 32];
                }
            lm_group<W, U, NM, NORM>(dh, dl, ss, u, x, gw);
#pragma unroll
            for (int j = 0; j < U; j++) {
                x[j][0] = xn[j][0];
                x[j][1] = xn[j][1];
                if constexpr (NORM) {
                    gw[j][0] = gn[j][0];
                    gw[j][1] = gn[j][1];
                }
            }
        }
        cuda_cp_wait<0>(); /* the ring is free for the next task */
#pragma unroll
        for (int t = 0; t < NM; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                dh[t][i] += dl[t][i];
        if constexpr (NORM) { /* over the 4 lanes of token g */
            ss += __shfl_xor_sync(0xffffffff, ss, 1);
            ss += __shfl_xor_sync(0xffffffff, ss, 2);
        }
        if constexpr (KS > 1) {
#pragma unroll
            for (int t = 0; t < NM; t++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    red[warp][t * 4 + i][lane] = dh[t][i];
            red[warp][NV - 1][lane] = ss;
            __syncthreads();
            if (sub == 0) {
                /* spans summed in order: the result does not depend on timing */
#pragma unroll
                for (int v = 0; v < NV; v++) {
                    float sum = 0.0f;
                    for (int s = 0; s < KS; s++)
                        sum += red[warp + s][v][lane];
                    if (v < NV - 1)
                        dh[v / 4][v % 4] = sum;
                    else
                        ss = sum;
                }
            }
            __syncthreads(); /* red is reused by the next round */
        }
        if (sub != 0)
            continue;
        /* accumulator i: row g (i < 2) or g + 8, token 2q + (i & 1); its scale from the lanes
         * of that token (every lane shuffles) */
        float sc[2] = {1.0f, 1.0f};
        if constexpr (NORM) {
            const float s0 = __shfl_sync(0xffffffff, ss, 8 * q),
                        s1 = __shfl_sync(0xffffffff, ss, 8 * q + 4);
            sc[0] = rsqrtf(s0 / (float)n_in + a.eps);
            sc[1] = rsqrtf(s1 / (float)n_in + a.eps);
        }
        if (!live)
            continue;
        float *om = m == 0 ? a.out[0] : m == 1 ? a.out[1] : a.out[2];
        const float *bm = m == 0 ? a.bias[0] : m == 1 ? a.bias[1] : a.bias[2];
        const uint32_t nm = m == 0 ? a.n_out[0] : m == 1 ? a.n_out[1] : a.n_out[2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t t = 2 * q + (i & 1), row = row0 + g + (i >= 2 ? 8 : 0);
            if (t >= a.n)
                continue;
            float *y = om + (size_t)t * nm + row;
            if constexpr (MODE == BE_LIN_SWIGLU) {
                const float s0 = dh[0][i] * sc[i & 1], s1 = dh[NM - 1][i] * sc[i & 1];
                *y = cuda_silu_mul1(s0, s1);
            } else {
                const float v = dh[0][i] * sc[i & 1] + (bm ? bm[row] : 0.0f);
                if constexpr (MODE == BE_LIN_SET)
                    *y = v;
                else
                    *y += v;
            }
        }
    }
}

template <typename W, int MODE, bool NORM, int KS>
static int lm_run_ks(struct cuda_ctx *c, const lm_kargs &a)
{
    constexpr int U = lm_slices(MODE, NORM);
    auto fn = lm_kernel<W, MODE, NORM, KS, U>;
    const size_t smem =
        (size_t)LM_WARPS * LM_STAGES * U * (MODE == BE_LIN_SWIGLU ? 2 : 1) * 2 * 32 * sizeof(uint4);
    static int per_sm; /* resident blocks per SM; the same on every gpu of one kind */
    if (!per_sm) {
        CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int nb = 0;
        CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, LM_WARPS * 32, smem));
        per_sm = nb > 0 ? nb : 1;
    }
    unsigned grid = cuda_lin_grid(c, a.n_tiles * KS, per_sm, 2);
    fn<<<grid, LM_WARPS * 32, smem, c->stream>>>(a);
    CU_LAUNCHED();
    c->hst.lin_mma++;
    return 0;
}

/* warps per task: enough tasks for about 32 warps an SM, each span at least 512 wide and
 * whole groups of slices */
template <typename W, int MODE, bool NORM> static int lm_run(struct cuda_ctx *c, const lm_kargs &a)
{
    const uint32_t grp = 32 * lm_slices(MODE, NORM);
    uint32_t ks = 1;
    while (ks < 8 && (uint64_t)a.n_tiles * ks < (uint64_t)c->n_sm * 32 &&
           a.n_in % (grp * 2 * ks) == 0 && a.n_in / (2 * ks) >= 512)
        ks *= 2;
    switch (ks) {
    case 8: return lm_run_ks<W, MODE, NORM, 8>(c, a);
    case 4: return lm_run_ks<W, MODE, NORM, 4>(c, a);
    case 2: return lm_run_ks<W, MODE, NORM, 2>(c, a);
    default: return lm_run_ks<W, MODE, NORM, 1>(c, a);
    }
}

/* the instantiation for the mode: the combinations a decoder layer uses (q/k/v and gate/up
 * with the norm folded in, o and down adding into the residual) and the plain matmul */
template <typename W> static int lm_go(struct cuda_ctx *c, const lm_kargs &a, int mode)
{
    const bool norm = a.nw != NULL;
    if (mode == BE_LIN_SWIGLU)
        return norm ? lm_run<W, BE_LIN_SWIGLU, true>(c, a) : lm_run<W, BE_LIN_SWIGLU, false>(c, a);
    if (mode == BE_LIN_ADD)
        return norm ? 1 : lm_run<W, BE_LIN_ADD, false>(c, a);
    return norm ? lm_run<W, BE_LIN_SET, true>(c, a) : lm_run<W, BE_LIN_SET, false>(c, a);
}

/* does the tensor-core path take n tokens over these weights? */
static bool lm_fits(const struct cuda_ctx *c, const struct be_tensor *w, uint32_t n_in, uint32_t n)
{
    return c->tune.lin_mma && n >= (uint32_t)c->tune.lin_mma && n <= 8 && !c->deterministic &&
           c->cc_major >= 8 && (w->type == BE_BF16 || w->type == BE_F16) && w->cols == n_in &&
           n_in % 128 == 0 && w->rows % 16 == 0 && ((uintptr_t)w->data & 15) == 0;
}

/* float4 loads of x and the norm weight */
static bool lm_aligned(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

static int lm_go_type(struct cuda_ctx *c, const lm_kargs &a, enum be_type t, int mode)
{
    return t == BE_BF16 ? lm_go<__nv_bfloat16>(c, a, mode) : lm_go<__half>(c, a, mode);
}

int cuda_linear_mma(struct cuda_ctx *c, const struct be_linear *l, uint32_t n)
{
    const uint32_t n_in = l->in->cols;
    const enum be_type t = l->w[0]->type;
    lm_kargs a = {};
    uint32_t tiles = 0;
    for (uint32_t i = 0; i < l->n_w; i++) {
        if (!lm_fits(c, l->w[i], n_in, n) || l->w[i]->type != t)
            return 1;
        a.w[i] = l->w[i]->data;
        a.bias[i] = l->bias[i] ? (const float *)l->bias[i]->data : NULL;
        a.out[i] = l->mode == BE_LIN_SWIGLU ? (float *)l->out[0]->data : (float *)l->out[i]->data;
        a.n_out[i] = l->w[i]->rows;
        tiles += l->w[i]->rows / 16;
        a.end[i] = tiles;
    }
    if ((l->mode == BE_LIN_SWIGLU && (l->n_w != 2 || l->w[1]->rows != l->w[0]->rows)) ||
        !lm_aligned(l->in->data) || (l->norm_w && !lm_aligned(l->norm_w->data)))
        return 1;
    a.n_tiles = l->mode == BE_LIN_SWIGLU ? l->w[0]->rows / 16 : tiles;
    a.x = (const float *)l->in->data;
    a.nw = l->norm_w ? (const float *)l->norm_w->data : NULL;
    a.eps = l->eps;
    a.n_in = n_in;
    a.n = n;
    return a.n_tiles ? lm_go_type(c, a, t, l->mode) : 0;
}

int cuda_matmul_mma(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                    const float *bias, uint32_t n)
{
    if (!lm_fits(c, w, w->cols, n) || !lm_aligned(in))
        return 1;
    lm_kargs a = {};
    a.w[0] = w->data;
    a.bias[0] = bias;
    a.out[0] = out;
    a.n_out[0] = w->rows;
    a.end[0] = a.n_tiles = w->rows / 16;
    a.x = in;
    a.n_in = w->cols;
    a.n = n;
    return a.n_tiles ? lm_go_type(c, a, w->type, BE_LIN_SET) : 0;
}
