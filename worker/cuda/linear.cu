/* linear.cu - fused decode linear layers (n <= 8 tokens): q/k/v in one launch with the rms norm
 * folded in, gate/up with silu(gate)*up as the epilogue, o/down adding into the residual. */
#include "worker/cuda/cuda_ops.cuh"

#define LIN_WARPS  8
#define LIN_UNROLL 4 /* 16-byte loads in flight per lane and row (8 with swiglu's pair) */

/* what one launch reads; passed by value */
struct lin_kargs {
    const void *w[BE_LIN_MAX];
    const float *bias[BE_LIN_MAX];
    float *out[BE_LIN_MAX];
    uint32_t end[BE_LIN_MAX];   /* cumulative rows of the matrices (SET) */
    uint32_t n_out[BE_LIN_MAX]; /* rows of each */
    const float *x;             /* (n, n_in) */
    const float *nw;            /* (n_in) norm weight, NORM only */
    float eps;
    uint32_t n_in, n, n_tasks; /* a task: one output row (SWIGLU: a gate row and its up row) */
};

__device__ __forceinline__ float lin_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

/* one VEC-wide slice i of NR weight rows (raw in u) against the first n tokens of x */
template <typename W, int VEC, int NT, int NR, bool NORM>
__device__ __forceinline__ void lin_slice(float (&acc)[NR][NT], float (&ss)[NT],
                                          const uint4 (&u)[NR], const lin_kargs &a, uint32_t i)
{
    float f[NR][VEC];
#pragma unroll
    for (int r = 0; r < NR; r++)
        cuda_unpack16(u[r], (const W *)nullptr, f[r]);
    if constexpr (NORM) {
        /* the norm weight folds into the weights: sum (w * nw) * x, scaled at the end */
        const float4 *nv = (const float4 *)(a.nw + i);
#pragma unroll
        for (int v = 0; v < VEC / 4; v++) {
            float4 g = nv[v];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                f[r][4 * v] *= g.x;
                f[r][4 * v + 1] *= g.y;
                f[r][4 * v + 2] *= g.z;
                f[r][4 * v + 3] *= g.w;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < (int)a.n) {
            const float4 *xv = (const float4 *)(a.x + (size_t)t * a.n_in + i);
#pragma unroll
            for (int v = 0; v < VEC / 4; v++) {
                float4 xx = xv[v];
#pragma unroll
                for (int r = 0; r < NR; r++)
                    acc[r][t] += f[r][4 * v] * xx.x + f[r][4 * v + 1] * xx.y +
                                 f[r][4 * v + 2] * xx.z + f[r][4 * v + 3] * xx.w;
                if constexpr (NORM)
                    ss[t] += xx.x * xx.x + xx.y * xx.y + xx.z * xx.z + xx.w * xx.w;
            }
        }
    }
}

/* grid-stride over tasks; a task's row is split in KS slices of n_in / KS, one warp each, summed
 * in a fixed order through shared memory (KS = 1: one warp per task, no shared memory). more
 * warps per row put more of the matrix in flight at once: a 4096-wide bf16 row is 8 KB, and one
 * warp keeps 2 KB of it in flight. n_in % VEC == 0; with KS > 1, n_in % (KS * 32 * VEC) == 0 */
template <typename W, int NT, int MODE, bool NORM, int KS>
__global__ void __launch_bounds__(LIN_WARPS * 32) lin_kernel(lin_kargs a)
{
    constexpr int VEC = 16 / sizeof(W);
    constexpr int NR = MODE == BE_LIN_SWIGLU ? 2 : 1;
    constexpr int TPB = LIN_WARPS / KS; /* tasks per block and round */
    /* each warp's partial sums: NR rows x NT tokens, then NT sums of squares */
    __shared__ float red[KS > 1 ? LIN_WARPS : 1][NR * NT + NT];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t sub = warp % KS, slot = warp / KS;
    const uint32_t n_in = a.n_in, step = 32 * VEC, span = n_in / KS;
    const uint32_t k_beg = sub * span, k_end = k_beg + span;
    /* the loop bound is the same for every warp of the block (it syncs inside) */
    for (uint32_t base = blockIdx.x * TPB; base < a.n_tasks; base += gridDim.x * TPB) {
        const uint32_t task = base + slot;
        const bool live = task < a.n_tasks;
        int m = 0;
        uint32_t row = live ? task : 0;
        if (MODE == BE_LIN_SET && row >= a.end[0]) {
            m = row >= a.end[1] ? 2 : 1;
            row = row - (m == 1 ? a.end[0] : a.end[1]);
        }
        /* selects, not a dynamic index into the parameters (which spills them to local memory) */
        const void *wm = m == 0 ? a.w[0] : m == 1 ? a.w[1] : a.w[2];
        float *om = m == 0 ? a.out[0] : m == 1 ? a.out[1] : a.out[2];
        const float *bm = m == 0 ? a.bias[0] : m == 1 ? a.bias[1] : a.bias[2];
        const uint32_t nm = m == 0 ? a.n_out[0] : m == 1 ? a.n_out[1] : a.n_out[2];
        const W *wr[NR];
        wr[0] = (const W *)wm + (size_t)row * n_in;
        if constexpr (NR == 2)
            wr[1] = (const W *)a.w[1] + (size_t)row * n_in;
        float acc[NR][NT], ss[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            ss[t] = 0.0f;
#pragma unroll
            for (int r = 0; r < NR; r++)
                acc[r][t] = 0.0f;
        }
        uint32_t i = k_beg + lane * VEC;
        /* LIN_UNROLL x NR loads of 16 bytes in flight per lane before the first use */
        for (; live && i + (LIN_UNROLL - 1) * step < k_end; i += LIN_UNROLL * step) {
            uint4 u[LIN_UNROLL][NR];
#pragma unroll
            for (int k = 0; k < LIN_UNROLL; k++)
#pragma unroll
                for (int r = 0; r < NR; r++)
                    u[k][r] = __ldcs((const uint4 *)(wr[r] + i + k * step));
#pragma unroll
            for (int k = 0; k < LIN_UNROLL; k++)
                lin_slice<W, VEC, NT, NR, NORM>(acc, ss, u[k], a, i + k * step);
        }
        for (; live && i < k_end; i += step) {
            uint4 u[NR];
#pragma unroll
            for (int r = 0; r < NR; r++)
                u[r] = __ldcs((const uint4 *)(wr[r] + i));
            lin_slice<W, VEC, NT, NR, NORM>(acc, ss, u, a, i);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int r = 0; r < NR; r++)
                acc[r][t] = lin_warp_sum(acc[r][t]);
            if constexpr (NORM)
                ss[t] = lin_warp_sum(ss[t]);
        }
        if constexpr (KS > 1) {
            if (lane == 0) {
#pragma unroll
                for (int t = 0; t < NT; t++) {
#pragma unroll
                    for (int r = 0; r < NR; r++)
                        red[warp][r * NT + t] = acc[r][t];
                    red[warp][NR * NT + t] = ss[t];
                }
            }
            __syncthreads();
            if (sub == 0 && lane == 0) {
                /* slices summed in order: the result does not depend on timing */
#pragma unroll
                for (int t = 0; t < NT; t++) {
#pragma unroll
                    for (int r = 0; r < NR; r++) {
                        float v = 0.0f;
                        for (int k = 0; k < KS; k++)
                            v += red[warp + k][r * NT + t];
                        acc[r][t] = v;
                    }
                    float v = 0.0f;
                    for (int k = 0; k < KS; k++)
                        v += red[warp + k][NR * NT + t];
                    ss[t] = v;
                }
            }
            __syncthreads(); /* red is reused by the next round */
        }
        if (!live || sub != 0 || lane != 0)
            continue;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= (int)a.n)
                break;
            float s0 = acc[0][t], s1 = NR == 2 ? acc[NR - 1][t] : 0.0f;
            if constexpr (NORM) {
                float sc = rsqrtf(ss[t] / (float)n_in + a.eps);
                s0 *= sc;
                s1 *= sc;
            }
            float *y = om + (size_t)t * nm + row;
            const float b = bm ? bm[row] : 0.0f;
            if constexpr (MODE == BE_LIN_SET)
                *y = s0 + b;
            else if constexpr (MODE == BE_LIN_ADD)
                *y += s0 + b;
            else
                *y = cuda_silu_mul1(s0, s1);
        }
    }
}

/* thread blocks for n_tasks warp tasks, at most max_per_sm resident per SM (the kernel's
 * occupancy): enough warps per SM to keep the loads in flight, and the fewest idle warps in the
 * last round of the grid-stride loop */
unsigned cuda_lin_grid(const struct cuda_ctx *c, uint32_t n_tasks, int max_per_sm, int min_per_sm)
{
    unsigned need = (n_tasks + LIN_WARPS - 1) / LIN_WARPS, best = need;
    double best_eff = 0.0;
    if (min_per_sm > max_per_sm)
        min_per_sm = max_per_sm;
    for (int per_sm = max_per_sm; per_sm >= min_per_sm; per_sm--) {
        unsigned blocks = (unsigned)(c->n_sm * per_sm);
        if (blocks >= need)
            return need; /* one round */
        uint32_t warps = blocks * LIN_WARPS, rounds = (n_tasks + warps - 1) / warps;
        double eff = (double)n_tasks / ((double)rounds * warps);
        if (eff > best_eff + 0.02) {
            best_eff = eff;
            best = blocks;
        }
    }
    return best;
}

/* one instantiation: its occupancy (asked once), the grid, the launch */
template <typename W, int NT, int MODE, bool NORM, int KS>
static int lin_run_ks(struct cuda_ctx *c, const lin_kargs &a)
{
    auto fn = lin_kernel<W, NT, MODE, NORM, KS>;
    static int per_sm; /* resident blocks per SM; the same on every gpu of one kind */
    if (!per_sm) {
        int nb = 0;
        CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, LIN_WARPS * 32, 0));
        per_sm = nb > 0 ? nb : 1;
    }
    /* cuda_lin_grid counts warp tasks: a block takes LIN_WARPS / KS tasks per round */
    uint32_t warp_tasks = a.n_tasks * KS;
    unsigned grid = cuda_lin_grid(c, warp_tasks, per_sm, MODE == BE_LIN_SWIGLU ? 2 : 3);
    fn<<<grid, LIN_WARPS * 32, 0, c->stream>>>(a);
    CU_LAUNCHED();
    return 0;
}

/* warps per row: the most (up to LIN_KS) that leave each warp at least LIN_KS_MIN_SPAN elements
 * in whole 32-lane vectors */
#define LIN_KS          2
#define LIN_KS_MIN_SPAN 1024
template <typename W, int NT, int MODE, bool NORM>
static int lin_run(struct cuda_ctx *c, const lin_kargs &a)
{
    const uint32_t step = 32 * (16 / sizeof(W));
    int ks = LIN_KS;
    while (ks > 1 && (a.n_in % (ks * step) || a.n_in / ks < LIN_KS_MIN_SPAN))
        ks /= 2;
    switch (ks) {
    case 2: return lin_run_ks<W, NT, MODE, NORM, 2>(c, a);
    default: return lin_run_ks<W, NT, MODE, NORM, 1>(c, a);
    }
}

template <typename W, int MODE, bool NORM>
static int lin_launch_nt(struct cuda_ctx *c, const lin_kargs &a)
{
    if constexpr (!NORM)
        if (c->deterministic)
            return lin_run<W, 8, MODE, false>(c, a); /* one instantiation for every count */
    /* token counts rounded up to 1, 2, 4, 8 instantiations; the norm is folded
     * in for 1 or 2 tokens only (each warp sums the squares of x itself) */
    if (a.n == 1)
        return lin_run<W, 1, MODE, NORM>(c, a);
    if (a.n == 2)
        return lin_run<W, 2, MODE, NORM>(c, a);
    if constexpr (!NORM)
        return a.n <= 4 ? lin_run<W, 4, MODE, false>(c, a) : lin_run<W, 8, MODE, false>(c, a);
    return RKV_EINVAL;
}

template <typename W>
static int lin_launch(struct cuda_ctx *c, const lin_kargs &a, int mode, bool norm)
{
    if (mode == BE_LIN_ADD)
        return lin_launch_nt<W, BE_LIN_ADD, false>(c, a);
    if (mode == BE_LIN_SWIGLU)
        return norm ? lin_launch_nt<W, BE_LIN_SWIGLU, true>(c, a)
                    : lin_launch_nt<W, BE_LIN_SWIGLU, false>(c, a);
    return norm ? lin_launch_nt<W, BE_LIN_SET, true>(c, a)
                : lin_launch_nt<W, BE_LIN_SET, false>(c, a);
}

/* the launch arguments of l over n tokens (the norm not folded in) */
static lin_kargs lin_kargs_of(const struct be_linear *l, uint32_t n)
{
    lin_kargs a = {};
    uint32_t rows = 0;
    for (uint32_t i = 0; i < l->n_w; i++) {
        a.w[i] = l->w[i]->data;
        a.bias[i] = l->bias[i] ? (const float *)l->bias[i]->data : NULL;
        a.out[i] = l->mode == BE_LIN_SWIGLU ? (float *)l->out[0]->data : (float *)l->out[i]->data;
        a.n_out[i] = l->w[i]->rows;
        rows += l->w[i]->rows;
        a.end[i] = rows;
    }
    a.n_tasks = l->mode == BE_LIN_SWIGLU ? l->w[0]->rows : rows;
    a.x = (const float *)l->in->data;
    a.n_in = l->in->cols;
    a.n = n;
    a.eps = l->eps;
    return a;
}

/* the norm as its own pass: *x (n tokens of l's input) becomes the normed copy */
static int lin_norm_pass(struct cuda_ctx *c, const struct be_linear *l, uint32_t n, const float **x)
{
    const uint32_t n_in = l->in->cols;
    int rc = cuda_scratch(c, &c->lin_h, &c->lin_h_cap, (size_t)n * n_in * sizeof(float));
    if (rc == 0)
        rc = cuda_rmsnorm(c, (float *)c->lin_h, *x, (const float *)l->norm_w->data, n, n_in, l->eps,
                          NULL, BE_F32);
    if (rc == 0)
        *x = (const float *)c->lin_h;
    return rc;
}

/* the instantiation for the weight type */
static int lin_launch_type(struct cuda_ctx *c, const lin_kargs &a, enum be_type t, int mode,
                           bool norm)
{
    switch (t) {
    case BE_F32: return lin_launch<float>(c, a, mode, norm);
    case BE_F16: return lin_launch<__half>(c, a, mode, norm);
    default: return lin_launch<__nv_bfloat16>(c, a, mode, norm);
    }
}

/* deterministic: the norm as its own pass, then the 8-token kernel over every 8 tokens, so
 * each token's numbers are the same in a step of 1 or of 500 tokens */
static int linear_chunked(struct cuda_ctx *c, const struct be_linear *l, uint32_t n)
{
    lin_kargs a = lin_kargs_of(l, n);
    int rc = l->norm_w ? lin_norm_pass(c, l, n, &a.x) : 0;
    const lin_kargs all = a;
    for (uint32_t t0 = 0; t0 < n && rc == 0; t0 += CUDA_GEMV_MAX_N) {
        a.n = n - t0 < CUDA_GEMV_MAX_N ? n - t0 : CUDA_GEMV_MAX_N;
        a.x = all.x + (size_t)t0 * a.n_in;
        for (uint32_t i = 0; i < l->n_w; i++)
            a.out[i] = all.out[i] + (size_t)t0 * a.n_out[l->mode == BE_LIN_SWIGLU ? 0 : i];
        rc = lin_launch_type(c, a, l->w[0]->type, l->mode, false);
    }
    return rc < 0 ? rc : 0;
}

int cuda_linear(struct cuda_ctx *c, const struct be_linear *l, uint32_t n)
{
    if (n == 0)
        return 0;
    const enum be_type t = l->w[0]->type;
    const uint32_t n_in = l->in->cols;
    if (n > c->tune.gemv_max_n && !c->deterministic && l->mode == BE_LIN_ADD && !l->bias[0] &&
        !l->norm_w) {
        /* prefill's o and down: the residual add in the gemm's epilogue */
        int rc =
            cuda_matmul_add(c, (float *)l->out[0]->data, (const float *)l->in->data, l->w[0], n);
        if (rc != 1)
            return rc;
    }
    /* the kernels below write their outputs without matmul.cu's overlap test */
    c->act16_ok = 0;
    if ((n > c->tune.gemv_max_n && !c->deterministic) ||
        (t != BE_F32 && t != BE_F16 && t != BE_BF16) || n_in % 8)
        return 1; /* prefill (cublas), q8_0 and odd widths: composed of the plain ops */
    for (uint32_t i = 1; i < l->n_w; i++)
        if (l->w[i]->type != t)
            return 1;
    if (c->deterministic)
        return linear_chunked(c, l, n);
    int rc = cuda_linear_stream(c, l, n);
    if (rc == 1)
        rc = cuda_linear_mma(c, l, n);
    if (rc != 1)
        return rc;
    lin_kargs a = lin_kargs_of(l, n);
    bool norm = l->norm_w != NULL;
    if (norm && n > 2) {
        /* more tokens: the norm is its own pass */
        if ((rc = lin_norm_pass(c, l, n, &a.x)) < 0)
            return rc;
        norm = false;
    } else if (norm)
        a.nw = (const float *)l->norm_w->data;
    return lin_launch_type(c, a, t, l->mode, norm);
}
