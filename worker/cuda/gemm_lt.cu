/* gemm_lt.cu - the 16-bit gemms of 9..lt_tune_n tokens (batched decode) through
 * cuBLASLt, on the algorithm measured fastest for the shape.
 *
 * cuBLAS's first heuristic choice for a decode-shaped gemm (64 tokens against 14336 x 4096
 * bf16 weights) is not its fastest: on the H200 the heuristic's second or third candidate
 * reads the weights 4-9 % faster (gate 34.4 us against 31.7, gate and up as one 60.6 against
 * 64.4, down 35.3 against 33.8; CUDA-graph-timed, cold L2). So the first eager call of a shape
 * times the heuristic's candidates on the live stream (each after an L2 flush, best of three)
 * and keeps the fastest when it beats the first by more than 3 %, so that near-ties keep the
 * heuristic's order from run to run. A step being recorded as a graph never tunes: an untuned
 * shape there keeps the cublasGemmEx path (matmul.cu), and the next eager step tunes it. */
#include <cublasLt.h>

#include "worker/cuda/cuda_ops.cuh"

#define LT_CANDIDATES 8
#define LT_SLOTS      1024        /* shapes kept; past that, new shapes stay on cublasGemmEx */
#define LT_FLUSH      (64u << 20) /* bytes written between timed runs: more than the L2 */

struct lt_shape {
    uint32_t n_out, n_in, n, wt; /* wt: 1 f16, 2 bf16 */
    uint32_t add;                /* beta 1 (the output accumulates) */
    int used;
    int bad; /* its algorithm failed to run once: the shape stays on cublasGemmEx */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

struct cuda_lt {
    cublasLtHandle_t h;
    struct lt_shape *tab; /* LT_SLOTS, open addressing */
    uint32_t n_used;
    int full_warned;
    cudaEvent_t ev[2];
};

/* a shape's descriptors (NULL ones skipped: a describe that failed part way) */
static void lt_shape_fini(struct lt_shape *s)
{
    cublasLtMatrixLayout_t l[3] = {s->la, s->lb, s->lc};
    for (int i = 0; i < 3; i++)
        if (l[i])
            cublasLtMatrixLayoutDestroy(l[i]);
    if (s->op)
        cublasLtMatmulDescDestroy(s->op);
    s->op = NULL;
    s->la = s->lb = s->lc = NULL;
}

void cuda_lt_free(struct cuda_ctx *c)
{
    struct cuda_lt *lt = c->lt;
    if (!lt)
        return;
    for (uint32_t i = 0; lt->tab && i < LT_SLOTS; i++)
        if (lt->tab[i].used)
            lt_shape_fini(&lt->tab[i]);
    free(lt->tab);
    for (int i = 0; i < 2; i++)
        if (lt->ev[i])
            cudaEventDestroy(lt->ev[i]);
    if (lt->h)
        cublasLtDestroy(lt->h);
    free(lt);
    c->lt = NULL;
}

static struct cuda_lt *lt_get(struct cuda_ctx *c)
{
    if (c->lt)
        return c->lt;
    struct cuda_lt *lt = (struct cuda_lt *)calloc(1, sizeof(*lt));
    if (!lt)
        return NULL;
    c->lt = lt;
    lt->tab = (struct lt_shape *)calloc(LT_SLOTS, sizeof(*lt->tab));
    if (!lt->tab || cublasLtCreate(&lt->h) != CUBLAS_STATUS_SUCCESS ||
        cudaEventCreate(&lt->ev[0]) != cudaSuccess || cudaEventCreate(&lt->ev[1]) != cudaSuccess) {
        cudaGetLastError();
        log_warn("cuda: cuBLASLt is not usable; batched decode gemms keep cublasGemmEx's "
                 "algorithms (RKV_CUDA_TUNE=lt_tune_n=0 says so without this warning)");
        cuda_lt_free(c);
        c->tune.lt_tune_n = 0;
        return NULL;
    }
    return lt;
}

static uint32_t lt_hash(uint32_t n_out, uint32_t n_in, uint32_t n, uint32_t wt, uint32_t add)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    const uint32_t v[] = {n_out, n_in, n, wt, add};
    for (int i = 0; i < 5; i++)
        h = (h ^ v[i]) * 0x100000001b3ULL;
    return (uint32_t)(h >> 20) % LT_SLOTS;
}

/* the descriptors of one shape: row-major out (n, n_out) = x (n, n_in) . w^T, as column-major
 * out (n_out, n) = w^T . x, f32 accumulate and output */
static int lt_describe(struct lt_shape *s, cudaDataType wt)
{
    const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
    s->op = NULL;
    s->la = s->lb = s->lc = NULL;
    if (cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof(T)) ||
        cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof(N)) ||
        cublasLtMatrixLayoutCreate(&s->la, wt, s->n_in, s->n_out, s->n_in) ||
        cublasLtMatrixLayoutCreate(&s->lb, wt, s->n_in, s->n, s->n_in) ||
        cublasLtMatrixLayoutCreate(&s->lc, CUDA_R_32F, s->n_out, s->n, s->n_out)) {
        lt_shape_fini(s);
        return -1;
    }
    return 0;
}

static cublasStatus_t lt_run(struct cuda_ctx *c, const struct lt_shape *s,
                             const cublasLtMatmulAlgo_t *algo, float *out, const void *w,
                             const void *x)
{
    const float one = 1.0f, beta = s->add ? 1.0f : 0.0f;
    return cublasLtMatmul(c->lt->h, s->op, &one, w, s->la, x, s->lb, &beta, out, s->lc, out, s->lc,
                          algo, c->blas_ws, c->blas_ws_bytes, c->stream);
}

/* the heuristic's candidates timed on scratch outputs; s->algo the chosen one. 0, or -1 when
 * the shape has no candidate (the caller then keeps cublasGemmEx) */
static int lt_tune(struct cuda_ctx *c, struct lt_shape *s, const void *w, const void *x)
{
    struct cuda_lt *lt = c->lt;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
    int nres = 0;
    size_t ws = c->blas_ws_bytes;
    if (cublasLtMatmulPreferenceCreate(&pref))
        return -1;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt->h, s->op, s->la, s->lb, s->lc, s->lc,
                                                       pref, LT_CANDIDATES, res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || nres < 1)
        return -1;
    s->algo = res[0].algo;
    if (nres == 1)
        return 0;
    /* the timing runs' output and the L2 flush live only while the shape is timed (the lm
     * head's output at 256 tokens is 131 MB): no room, and the heuristic's first stays or the
     * runs go unflushed */
    float *scratch = NULL;
    void *flush = NULL;
    if (cudaMalloc(&scratch, (size_t)s->n * s->n_out * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (cudaMalloc(&flush, LT_FLUSH) != cudaSuccess) {
        cudaGetLastError();
        flush = NULL;
    }
    float t[LT_CANDIDATES];
    for (int i = 0; i < nres; i++) {
        t[i] = INFINITY;
        if (lt_run(c, s, &res[i].algo, scratch, w, x) != CUBLAS_STATUS_SUCCESS)
            continue; /* not runnable after all: never chosen */
        for (int r = 0; r < 3; r++) {
            if (flush)
                cudaMemsetAsync(flush, r, LT_FLUSH, c->stream);
            float ms = INFINITY;
            if (cudaEventRecord(lt->ev[0], c->stream) == cudaSuccess &&
                lt_run(c, s, &res[i].algo, scratch, w, x) == CUBLAS_STATUS_SUCCESS &&
                cudaEventRecord(lt->ev[1], c->stream) == cudaSuccess &&
                cudaEventSynchronize(lt->ev[1]) == cudaSuccess)
                cudaEventElapsedTime(&ms, lt->ev[0], lt->ev[1]);
            t[i] = ms < t[i] ? ms : t[i];
        }
    }
    cudaStreamSynchronize(c->stream);
    cudaFree(flush);
    cudaFree(scratch);
    cudaGetLastError();
    int best = 0;
    for (int i = 1; i < nres; i++)
        if (t[i] < t[best])
            best = i;
    if (t[best] == INFINITY)
        return -1; /* none ran */
    if (t[0] == INFINITY)
        s->algo = res[best].algo;
    if (best != 0 && t[best] < 0.97f * t[0]) {
        s->algo = res[best].algo;
        c->hst.lt_faster++;
    }
    return 0;
}

int cuda_gemm_lt(struct cuda_ctx *c, float *out, const void *w, enum be_type t, const void *x,
                 uint32_t n, uint32_t n_in, uint32_t n_out, float beta)
{
    if (n > c->tune.lt_tune_n || (t != BE_F16 && t != BE_BF16) || (beta != 0.0f && beta != 1.0f))
        return 1;
    if (!c->lt && c->graph.capturing)
        return 1; /* no handle created inside a recording */
    struct cuda_lt *lt = lt_get(c);
    if (!lt)
        return 1;
    const uint32_t wt = t == BE_F16 ? 1 : 2, add = beta != 0.0f;
    /* open addressing; the table always keeps a free slot (n_used < LT_SLOTS - 1), so a
     * probe ends at the shape or at a free slot */
    uint32_t i = lt_hash(n_out, n_in, n, wt, add);
    struct lt_shape *s = &lt->tab[i];
    while (s->used &&
           !(s->n_out == n_out && s->n_in == n_in && s->n == n && s->wt == wt && s->add == add)) {
        i = (i + 1) % LT_SLOTS;
        s = &lt->tab[i];
    }
    if (!s->used) {
        if (c->graph.capturing)
            return 1; /* no timing while recording: the next eager step tunes it */
        if (lt->n_used + 1 >= LT_SLOTS) {
            if (!lt->full_warned)
                log_warn("cuda: %u gemm shapes tuned, no room for more: new shapes keep "
                         "cublasGemmEx's algorithms",
                         lt->n_used);
            lt->full_warned = 1;
            return 1;
        }
        *s = (struct lt_shape){n_out, n_in, n, wt, add, 0, 0, NULL, NULL, NULL, NULL, {}};
        if (lt_describe(s, t == BE_F16 ? CUDA_R_16F : CUDA_R_16BF) < 0)
            return 1;
        if (lt_tune(c, s, w, x) < 0) {
            lt_shape_fini(s);
            return 1;
        }
        s->used = 1;
        lt->n_used++;
        c->hst.lt_tuned++;
    } else if (s->bad) {
        return 1;
    }
    cublasStatus_t st = lt_run(c, s, &s->algo, out, w, x);
    if (st != CUBLAS_STATUS_SUCCESS) {
        /* nothing was queued: this call and the shape's next ones take cublasGemmEx */
        log_warn("cuda: cublasLtMatmul refused its tuned algorithm (cublas status %d, %u x %u by "
                 "%u tokens); the shape falls back to cublasGemmEx",
                 (int)st, n_out, n_in, n);
        s->bad = 1;
        return 1;
    }
    c->hst.lt_gemm++;
    return 0;
}
