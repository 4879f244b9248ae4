/* gpu_ops_test.c - every cuda op against its cpu twin on random inputs (atol + rtol*|ref|), kv
 * splits included. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "tests/gpu/gpu_util.h"
#include "worker/backend.h"
#include "worker/backend_impl.h"
#include "worker/cpu/cpu_ops.h"
#include "worker/cpu/cpu_quant.h"
#include "worker/cuda/cuda_backend.h"

static struct backend *cpu, *gpu;
static struct gu_rng rng;
static int n_fail, n_pass;

#define CHECK(name, cond)                                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            printf("  FAIL %s\n", name);                                                           \
        }                                                                                          \
    } while (0)

/* the same host values on both backends */
struct pair {
    struct be_tensor *c, *g;
    float *x; /* host values (n floats) */
    size_t n;
};

static struct pair pair_new(enum be_type t, uint32_t rows, uint32_t cols, float scale)
{
    struct pair p = {0};
    p.n = (size_t)rows * cols;
    p.x = malloc(p.n * sizeof(float));
    gu_fill(&rng, p.x, p.n, scale);
    p.c = gu_tensor(cpu, t, rows, cols, p.x);
    p.g = gu_tensor(gpu, t, rows, cols, p.x);
    if (!p.c || !p.g) {
        fprintf(stderr, "tensor allocation failed\n");
        exit(1);
    }
    return p;
}

static void pair_free(struct pair *p)
{
    backend_tensor_free(cpu, p->c);
    backend_tensor_free(gpu, p->g);
    free(p->x);
}

/* compares the first n floats of an f32 pair */
static size_t pair_cmp(const char *what, struct pair *p, size_t n, float atol, float rtol)
{
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    size_t bad = n;
    if (gu_read(cpu, p->c, a, n) == 0 && gu_read(gpu, p->g, b, n) == 0)
        bad = gu_compare(what, a, b, n, atol, rtol);
    free(a);
    free(b);
    return bad;
}

static const enum be_type all_types[] = {BE_F32, BE_F16, BE_BF16, BE_Q8_0};

static void test_embed(void)
{
    for (int ti = 0; ti < 4; ti++) {
        enum be_type t = all_types[ti];
        struct pair w = pair_new(t, 50, 96, 1.0f), out = pair_new(BE_F32, 7, 96, 1.0f);
        int32_t ids[7] = {0, 49, 3, 3, 17, 25, 8};
        int rc = embed_forward(cpu, out.c, w.c, ids, 7) | embed_forward(gpu, out.g, w.g, ids, 7);
        char name[64];
        snprintf(name, sizeof(name), "embed %s", be_type_name(t));
        CHECK(name, rc == 0 && pair_cmp(name, &out, 7 * 96, 0, 0) == 0);
        pair_free(&w);
        pair_free(&out);
    }
}

static void test_rmsnorm(void)
{
    uint32_t dims[] = {96, 4096};
    for (int i = 0; i < 2; i++) {
        uint32_t d = dims[i];
        struct pair in = pair_new(BE_F32, 5, d, 3.0f), w = pair_new(BE_F32, 1, d, 1.0f),
                    out = pair_new(BE_F32, 5, d, 1.0f);
        int rc = rmsnorm_forward(cpu, out.c, in.c, w.c, 5, 1e-5f) |
                 rmsnorm_forward(gpu, out.g, in.g, w.g, 5, 1e-5f);
        /* in place as the forward pass uses it */
        rc |= rmsnorm_forward(cpu, in.c, in.c, w.c, 5, 1e-5f) |
              rmsnorm_forward(gpu, in.g, in.g, w.g, 5, 1e-5f);
        CHECK("rmsnorm", rc == 0 && pair_cmp("rmsnorm", &out, 5 * (size_t)d, 1e-6f, 1e-5f) == 0 &&
                             pair_cmp("rmsnorm in place", &in, 5 * (size_t)d, 1e-6f, 1e-5f) == 0);
        pair_free(&in);
        pair_free(&w);
        pair_free(&out);
    }
}

/* the tensor-core decode kernels (lin_mma) of the backend under test take 16-bit
 * weights of mma_from..mma_max tokens (0: none), rows in 16s and widths in 128s (linear_mma.cu's
 * lm_fits) */
static uint32_t mma_from = 2, mma_max = 8;

static int mma_expected(enum be_type t, uint32_t n, uint32_t n_in, const uint32_t *rows, int n_rows)
{
    int fits = (t == BE_BF16 || t == BE_F16) && mma_from && n >= mma_from && n <= mma_max &&
               n_in % 128 == 0;
    for (int i = 0; i < n_rows; i++)
        fits = fits && rows[i] % 16 == 0;
    return fits;
}

/* the backend's tensor-core linear launches since the last call */
static unsigned long long mma_runs(struct backend *g)
{
    char st[1024] = "";
    backend_stats(g, st, sizeof(st));
    const char *p = strstr(st, "decode linears on tensor cores: ");
    return p ? strtoull(p + strlen("decode linears on tensor cores: "), NULL, 10) : 0;
}

/* the kernel that ran is the one expected: names it when not */
static int mma_check(const char *name, struct backend *g, int expect)
{
    unsigned long long runs = mma_runs(g);
    if ((runs > 0) == (expect != 0))
        return 1;
    printf("  %s: %llu tensor-core launches, expected %s\n", name, runs, expect ? "some" : "none");
    return 0;
}

/* matmul tolerance: gemv (n <= 8) is f32 math; gemms round activations to
 * the weight's 16-bit type unless precise */
static void matmul_case(struct backend *g, enum be_type t, uint32_t n, uint32_t n_in,
                        uint32_t n_out, int bias, float rel_tol, const char *tag)
{
    struct backend *save = gpu;
    gpu = g;
    float ws = 1.0f / sqrtf((float)n_in);
    struct pair w = pair_new(t, n_out, n_in, ws), x = pair_new(BE_F32, n, n_in, 1.0f),
                out = pair_new(BE_F32, n, n_out, 1.0f), b = pair_new(BE_F32, 1, n_out, 1.0f);
    mma_runs(gpu);
    int rc = matmul_forward(cpu, out.c, x.c, w.c, bias ? b.c : NULL, n) |
             matmul_forward(gpu, out.g, x.g, w.g, bias ? b.g : NULL, n);
    const int path_ok = mma_check("matmul", gpu, mma_expected(t, n, n_in, &n_out, 1));
    float *ref = malloc(out.n * 4), *got = malloc(out.n * 4);
    size_t bad = out.n;
    if (rc == 0 && gu_read(cpu, out.c, ref, out.n) == 0 && gu_read(gpu, out.g, got, out.n) == 0) {
        float atol = (float)(rel_tol * gu_rms(ref, out.n));
        char name[96];
        snprintf(name, sizeof(name), "matmul%s %s n=%u %ux%u%s", tag, be_type_name(t), n, n_out,
                 n_in, bias ? " +bias" : "");
        bad = gu_compare(name, ref, got, out.n, atol, rel_tol);
        CHECK(name, bad == 0 && path_ok);
        if (bad == 0)
            printf("  ok %-40s nmse %.2e\n", name, gu_nmse(got, ref, out.n));
    } else {
        CHECK("matmul run", 0);
    }
    free(ref);
    free(got);
    pair_free(&w);
    pair_free(&x);
    pair_free(&out);
    pair_free(&b);
    gpu = save;
}

/* the backend's gemm pairs run as one strided batch since the last call (cuda_matmul2) */
static unsigned long long pair_runs(struct backend *g)
{
    char st[2048] = "";
    backend_stats(g, st, sizeof(st));
    const char *p = strstr(st, "gemm pairs as one batch: ");
    return p ? strtoull(p + strlen("gemm pairs as one batch: "), NULL, 10) : 0;
}

/* matmul2 (two weights of one shape over one input: k and v, gate and up) on backend g against
 * the cpu's two matmuls. order: 0 every tensor of the pair allocated first to second, 1 second
 * to first (the batch starts at the second), 2 the weights one way and the outputs the other
 * (no single stride: two gemms). Past the decode rows the batch must have run exactly when
 * the pointers allow it */
static void matmul2_case(struct backend *g, uint32_t pair_n, enum be_type t, uint32_t n,
                         uint32_t n_in, uint32_t n_out, int bias, int order)
{
    struct backend *save = gpu;
    gpu = g;
    const float ws = 1.0f / sqrtf((float)n_in);
    struct pair x = pair_new(BE_F32, n, n_in, 1.0f), w[2], out[2], b[2];
    for (int k = 0; k < 2; k++) { /* the weights first to second, but for order 1 */
        const int i = order == 1 ? 1 - k : k;
        w[i] = pair_new(t, n_out, n_in, ws);
        b[i] = pair_new(BE_F32, 1, n_out, 1.0f);
    }
    for (int k = 0; k < 2; k++) /* the outputs first to second for order 0 */
        out[order ? 1 - k : k] = pair_new(BE_F32, n, n_out, 1.0f);
    pair_runs(gpu);
    int rc = matmul2_forward(gpu, out[0].g, out[1].g, x.g, w[0].g, w[1].g, bias ? b[0].g : NULL,
                             bias ? b[1].g : NULL, n);
    const unsigned long long runs = pair_runs(gpu);
    for (int i = 0; i < 2; i++)
        rc |= matmul_forward(cpu, out[i].c, x.c, w[i].c, bias ? b[i].c : NULL, n);
    /* one stride for both, in the same direction, and no overlap: what cuda_matmul2 takes */
    const long long sa = ((const char *)w[1].g->data - (const char *)w[0].g->data) / 2,
                    sc = (const float *)out[1].g->data - (const float *)out[0].g->data;
    const int one_batch = n > 8 && n <= pair_n && ((sa > 0 && sc > 0) || (sa < 0 && sc < 0));
    const float tol = n <= 8 ? 1e-4f : t == BE_BF16 ? 3e-2f : 4e-3f;
    char name[112];
    snprintf(name, sizeof(name), "matmul2 %s n=%u %ux%u%s order %d (%s)", be_type_name(t), n, n_out,
             n_in, bias ? " +bias" : "", order, one_batch ? "one batch" : "two gemms");
    size_t bad = 1;
    if (rc == 0) {
        bad = 0;
        for (int i = 0; i < 2 && !bad; i++) {
            float *ref = malloc(out[i].n * 4), *got = malloc(out[i].n * 4);
            if (gu_read(cpu, out[i].c, ref, out[i].n) || gu_read(gpu, out[i].g, got, out[i].n))
                bad = 1;
            else
                bad =
                    gu_compare(name, ref, got, out[i].n, (float)(tol * gu_rms(ref, out[i].n)), tol);
            free(ref);
            free(got);
        }
    }
    if (runs != (one_batch ? 1u : 0u))
        printf("  %s: %llu batched pairs, expected %d\n", name, runs, one_batch);
    CHECK(name, bad == 0 && runs == (one_batch ? 1u : 0u));
    pair_free(&x);
    for (int i = 0; i < 2; i++) {
        pair_free(&w[i]);
        pair_free(&out[i]);
        pair_free(&b[i]);
    }
    gpu = save;
}

static struct backend *backend_tuned(const char *knobs);

/* matmul2 at pair_n=64: k / v and gate / up shapes at 9..64 tokens, each order, and past its
 * tokens (65: two gemms); then a backend with it off */
static void test_matmul2(void)
{
    struct backend *g = backend_tuned("pair_n=64");
    if (!g)
        return;
    printf("ops: gemm pairs as one strided batch (pair_n=64)\n");
    static const uint32_t ns[] = {4, 9, 33, 64, 65};
    for (int ti = 0; ti < 2; ti++) {
        const enum be_type t = ti ? BE_F16 : BE_BF16;
        for (int ni = 0; ni < 5; ni++)
            for (int order = 0; order < 3; order++)
                matmul2_case(g, 64, t, ns[ni], 4096, 1024, order == 1, order);
        matmul2_case(g, 64, t, 64, 4096, 14336, 0, 0);
        matmul2_case(g, 64, t, 17, 512, 40, 1, 0);
    }
    backend_destroy(g);
    /* off: two gemms */
    struct backend *off = backend_tuned("pair_n=0");
    if (off)
        matmul2_case(off, 0, BE_BF16, 64, 512, 256, 1, 0);
    backend_destroy(off);
}

/* gemv_max: the rows up to which the backend takes its decode kernel (f32 sums of the f32
 * input), past them cublas over the input rounded to 16 bits */
/* every block format beside Q8_0 on every path: the integer-dot decode kernel (1-8 tokens)
 * against the cpu's integer dots over the same 8-bit activations, the exact decode kernel
 * (qdot=exact), the tensor-core tiles (9-256), the f16 slabs into cuBLAS (prefill) against the
 * cpu's exact dequantization and f32 sums (the 16-bit paths round the activations to f16).
 * Embedding rows dequantize to the same bits. */
static const enum be_type quant_types[] = {BE_Q4_0, BE_Q4_1, BE_Q5_0, BE_Q5_1,   BE_Q2_K,  BE_Q3_K,
                                           BE_Q4_K, BE_Q5_K, BE_Q6_K, BE_IQ4_NL, BE_IQ4_XS};

/* the types the integer-dot decode kernel takes (quant_dot.cu); Q2_K and Q3_K stay exact */
static int qd_int(enum be_type t)
{
    return t != BE_Q2_K && t != BE_Q3_K;
}

static void test_quant(void)
{
    struct backend *exact = backend_tuned("qdot=exact");
    if (!exact)
        return;
    const uint32_t ns[] = {1, 2, 5, 8, 9, 64, 100, 300};
    for (size_t ti = 0; ti < sizeof quant_types / sizeof quant_types[0]; ti++) {
        enum be_type t = quant_types[ti];
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            uint32_t n = ns[ni], n_out = n == 300 ? 272 : 200;
            if (n <= 8) {
                /* Q2_K and Q3_K decode on the exact kernel whatever qdot says */
                cpu_q_use_exact(!qd_int(t));
                matmul_case(gpu, t, n, 512, n_out, ni & 1, qd_int(t) ? 2e-5f : 1e-4f, " int");
                cpu_q_use_exact(1);
                matmul_case(exact, t, n, 512, n_out, ni & 1, 1e-4f, " exact");
            } else {
                matmul_case(gpu, t, n, 512, n_out, ni & 1, 4e-3f, " quant");
            }
        }
        /* a row of one 256-value block and an odd count of rows */
        matmul_case(exact, t, 3, 256, 37, 1, 1e-4f, " exact");
        cpu_q_use_exact(!qd_int(t));
        matmul_case(gpu, t, 3, 256, 37, 1, qd_int(t) ? 2e-5f : 1e-4f, " int");
        cpu_q_use_exact(1);
        struct pair w = pair_new(t, 40, 512, 1.0f), out = pair_new(BE_F32, 5, 512, 1.0f);
        int32_t ids[5] = {0, 39, 7, 7, 21};
        int rc = embed_forward(cpu, out.c, w.c, ids, 5) | embed_forward(gpu, out.g, w.g, ids, 5);
        char name[64];
        snprintf(name, sizeof name, "embed %s", be_type_name(t));
        CHECK(name, rc == 0 && pair_cmp(name, &out, 5 * 512, 0, 0) == 0);
        pair_free(&w);
        pair_free(&out);
    }
    /* the integer-dot kernel at model shapes: llama3-8b's widths (the activation rows of 8
     * tokens of 14336 values fill most of shared memory), Gemma 3 270M's 640 over 32-value
     * blocks, and Q8_0 */
    static const struct {
        enum be_type t;
        uint32_t n_in, n_out;
    } shapes[] = {{BE_Q4_K, 4096, 1024}, {BE_Q6_K, 14336, 512}, {BE_Q4_K, 14336, 256},
                  {BE_Q5_0, 640, 1024},  {BE_Q8_0, 640, 300},   {BE_Q8_0, 4096, 512},
                  {BE_IQ4_XS, 4096, 64}, {BE_Q4_0, 4096, 4096}};
    cpu_q_use_exact(0);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (uint32_t n = 1; n <= 8; n *= 2)
            matmul_case(gpu, shapes[i].t, n == 8 ? 7 : n, shapes[i].n_in, shapes[i].n_out, n & 1,
                        2e-5f, " int");
    cpu_q_use_exact(1);
    backend_destroy(exact);
}

static void test_matmul(struct backend *precise, uint32_t gemv_max)
{
    uint32_t ns[] = {1, 3, 8, 9, 33};
    for (int ti = 0; ti < 4; ti++)
        for (int ni = 0; ni < 5; ni++) {
            enum be_type t = all_types[ti];
            uint32_t n = ns[ni];
            float tol = n <= gemv_max || t == BE_F32 ? 1e-4f : t == BE_BF16 ? 3e-2f : 4e-3f;
            /* Q8_0's decode rows take the integer dots (qdot=int): the cpu's integer twin */
            const int q8 = t == BE_Q8_0 && n <= gemv_max;
            if (q8)
                cpu_q_use_exact(0);
            matmul_case(gpu, t, n, 512, 256, ni & 1, q8 ? 2e-5f : tol, q8 ? " int" : "");
            cpu_q_use_exact(1);
        }
    /* odd widths take the generic kernel / cublas with odd leading dims */
    matmul_case(gpu, BE_F32, 2, 100, 33, 1, 1e-4f, "");
    matmul_case(gpu, BE_F16, 1, 100, 33, 0, 1e-4f, "");
    matmul_case(gpu, BE_BF16, 4, 4096, 1024, 0, 4 <= gemv_max ? 1e-4f : 3e-2f, "");
    /* 9 x 33 inputs: the one-element f32 -> 16-bit conversion, and a width cuBLASLt may
     * refuse (gemm_lt.cu then falls back to cublasGemmEx) */
    matmul_case(gpu, BE_BF16, 9, 33, 40, 0, 9 <= gemv_max ? 1e-4f : 3e-2f, "");
    matmul_case(gpu, BE_F16, 9, 33, 40, 1, 9 <= gemv_max ? 1e-4f : 4e-3f, "");
    if (precise) {
        matmul_case(precise, BE_BF16, 33, 512, 256, 1, 1e-4f, " precise");
        matmul_case(precise, BE_F16, 40, 512, 256, 0, 1e-4f, " precise");
    }
}

/* more than 8 rows of 16-bit weights run on the tuned cuBLASLt algorithms (gemm_lt.cu) by
 * default and on cublasGemmEx's choice with lt_tune_n=0 (test_matmul checks both
 * against the cpu): the backend's counter must say which ran one 33-row gemm, twice (the
 * second on the shape's cached algorithm) */
static void lt_check(const char *what, int want)
{
    struct pair w = pair_new(BE_BF16, 256, 512, 0.05f), x = pair_new(BE_F32, 33, 512, 1.0f),
                y = pair_new(BE_F32, 33, 256, 1.0f);
    char st[2048] = "", name[128];
    backend_stats(gpu, st, sizeof(st)); /* counts from here */
    int rc =
        matmul_forward(gpu, y.g, x.g, w.g, NULL, 33) | matmul_forward(gpu, y.g, x.g, w.g, NULL, 33);
    backend_stats(gpu, st, sizeof(st));
    const char *key = "gemms on tuned cuBLASLt algorithms: ", *p = strstr(st, key);
    const unsigned long long ran = p ? strtoull(p + strlen(key), NULL, 10) : 0;
    snprintf(name, sizeof(name), "matmul, %s: %s cuBLASLt gemm", what, want ? "two a" : "no");
    if (!p || ran != (want ? 2u : 0u))
        printf("  %s: %s\n", name, st);
    CHECK(name, rc == 0 && p && ran == (want ? 2u : 0u));
    struct pair *ps[] = {&w, &x, &y};
    for (int i = 0; i < 3; i++)
        pair_free(ps[i]);
}

/* h = rmsnorm(x) or silu(x) * x2, on be's side of the pairs */
static int twin_op(struct backend *be, int silu, struct pair *h, struct pair *x, struct pair *x2,
                   struct pair *nw, uint32_t n)
{
    const int g = be == gpu;
    return silu
               ? silu_mul_forward(be, g ? h->g : h->c, g ? x->g : x->c, g ? x2->g : x2->c, n)
               : rmsnorm_forward(be, g ? h->g : h->c, g ? x->g : x->c, g ? nw->g : nw->c, n, 1e-5f);
}

/* rmsnorm and silu_mul on the gemm path (more than 8 rows, widths of 1024..8192) also write the
 * 16-bit copy the next matmul reads in place of converting its input: the product must be the
 * same bits as after a conversion (any op in between drops the copy; a tensor read is one), the
 * backend must say it used the copy, and the product must be as close to the cpu's as a
 * converted one (test_matmul's bounds) */
static void twin_case(enum be_type t, uint32_t n, uint32_t d, int silu)
{
    const uint32_t rows = 256;
    const float tol = t == BE_BF16 ? 3e-2f : 4e-3f;
    struct pair x = pair_new(BE_F32, n, d, 2.0f), x2 = pair_new(BE_F32, n, d, 1.0f),
                nw = pair_new(BE_F32, 1, d, 1.0f), h = pair_new(BE_F32, n, d, 1.0f),
                w = pair_new(t, rows, d, 1.0f / sqrtf((float)d)),
                y = pair_new(BE_F32, n, rows, 1.0f), y2 = pair_new(BE_F32, n, rows, 1.0f);
    char name[96], st[1024] = "";
    snprintf(name, sizeof(name), "%s then matmul %s n=%u d=%u: the 16-bit copy",
             silu ? "silu_mul" : "rmsnorm", be_type_name(t), n, d);
    /* a conversion to this type first: the type the op writes its copy in */
    int rc = matmul_forward(gpu, y2.g, x.g, w.g, NULL, n);
    backend_stats(gpu, st, sizeof(st)); /* counts from here */
    rc |= twin_op(gpu, silu, &h, &x, &x2, &nw, n) | matmul_forward(gpu, y.g, h.g, w.g, NULL, n);
    backend_stats(gpu, st, sizeof(st));
    const int used = strstr(st, " 0 from the op's 16-bit copy") == NULL;
    float probe;
    rc |= twin_op(gpu, silu, &h, &x, &x2, &nw, n) | gu_read(gpu, nw.g, &probe, 1) |
          matmul_forward(gpu, y2.g, h.g, w.g, NULL, n);
    rc |= twin_op(cpu, silu, &h, &x, &x2, &nw, n) | matmul_forward(cpu, y.c, h.c, w.c, NULL, n);
    const size_t m = (size_t)n * rows;
    float *a = malloc(m * sizeof(float)), *b = malloc(m * sizeof(float));
    int same = a && b && gu_read(gpu, y.g, a, m) == 0 && gu_read(gpu, y2.g, b, m) == 0 &&
               memcmp(a, b, m * sizeof(float)) == 0;
    if (!used)
        printf("  %s was not used: %s\n", name, st);
    CHECK(name, rc == 0 && used && same && pair_cmp(name, &y, m, tol, tol) == 0);
    free(a);
    free(b);
    struct pair *ps[] = {&x, &x2, &nw, &h, &w, &y, &y2};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        pair_free(ps[i]);
}

static void test_twin(void)
{
    static const enum be_type t16[] = {BE_BF16, BE_F16};
    for (int ti = 0; ti < 2; ti++)
        for (int silu = 0; silu < 2; silu++) {
            twin_case(t16[ti], 16, 1024, silu);
            twin_case(t16[ti], 33, 4096, silu);
        }
}

/* the fused linear layer against the cpu ops it stands for (rmsnorm, matmul,
 * add, silu_mul); n 1..2 folds the norm into the gemv, 3..8 runs it first,
 * more tokens are composed by the forward pass (the op declines with 1).
 * widths of 4096 and more split each row over several warps (LIN_KS in linear.cu) */
static void linear_case_rows(enum be_type t, enum be_lin_mode mode, uint32_t n, int norm,
                             uint32_t n_in, const uint32_t rows[3])
{
    const uint32_t n_w = mode == BE_LIN_SET ? 3 : mode == BE_LIN_ADD ? 1 : 2;
    const float ws = 1.0f / sqrtf((float)n_in);
    struct pair x = pair_new(BE_F32, n, n_in, 2.0f), nw = pair_new(BE_F32, 1, n_in, 1.0f),
                h = pair_new(BE_F32, n, n_in, 1.0f), w[3], b[3], out[3], tmp[3];
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t r = mode == BE_LIN_SWIGLU ? rows[0] : rows[i];
        w[i] = pair_new(t, r, n_in, ws);
        b[i] = pair_new(BE_F32, 1, r, 1.0f);
        out[i] = pair_new(BE_F32, n, r, 1.0f); /* ADD: the residual it adds to */
        tmp[i] = pair_new(BE_F32, n, r, 1.0f);
    }
    struct be_linear gl = {mode, x.g, norm ? nw.g : NULL, 1e-5f, n_w, {0}, {0}, {0}};
    for (uint32_t i = 0; i < n_w; i++) {
        gl.w[i] = w[i].g;
        gl.bias[i] = mode != BE_LIN_SWIGLU && i == 0 ? b[i].g : NULL;
        gl.out[i] = out[i].g;
    }
    mma_runs(gpu);
    int rc = linear_forward(gpu, &gl, n);
    /* one token may take the streamed kernel first */
    const int path_ok =
        n == 1 ||
        mma_check("linear", gpu, mma_expected(t, n, n_in, rows, mode == BE_LIN_SET ? 3 : 1));
    /* the reference, composed on the cpu */
    const struct be_tensor *in = x.c;
    if (norm) {
        rc |= rmsnorm_forward(cpu, h.c, x.c, nw.c, n, 1e-5f);
        in = h.c;
    }
    if (mode == BE_LIN_SET)
        for (uint32_t i = 0; i < 3; i++)
            rc |= matmul_forward(cpu, out[i].c, in, w[i].c, i == 0 ? b[0].c : NULL, n);
    else if (mode == BE_LIN_ADD)
        rc |= matmul_forward(cpu, tmp[0].c, in, w[0].c, b[0].c, n) |
              add_forward(cpu, out[0].c, out[0].c, tmp[0].c, n);
    else
        rc |= matmul_forward(cpu, out[0].c, in, w[0].c, NULL, n) |
              matmul_forward(cpu, tmp[0].c, in, w[1].c, NULL, n) |
              silu_mul_forward(cpu, out[0].c, out[0].c, tmp[0].c, n);
    static const char *modes[] = {"set", "add", "swiglu"};
    char name[96];
    snprintf(name, sizeof(name), "linear %s %s n=%u in=%u rows=%u%s", modes[mode], be_type_name(t),
             n, n_in, rows[0], norm ? " +norm" : "");
    if (rc == 1) {
        printf("  FAIL %s: the cuda backend declined the fused op\n", name);
        n_fail++;
    } else {
        size_t bad = rc ? 1 : 0;
        for (uint32_t i = 0; i < (mode == BE_LIN_SET ? 3u : 1u) && !bad; i++)
            bad = pair_cmp(name, &out[i], out[i].n, 1e-4f, 1e-4f);
        CHECK(name, rc == 0 && bad == 0 && path_ok);
    }
    pair_free(&x);
    pair_free(&nw);
    pair_free(&h);
    for (uint32_t i = 0; i < 3; i++) {
        pair_free(&w[i]);
        pair_free(&b[i]);
        pair_free(&out[i]);
        pair_free(&tmp[i]);
    }
}

static void linear_case(enum be_type t, enum be_lin_mode mode, uint32_t n, int norm, uint32_t n_in)
{
    static const uint32_t rows[3] = {256, 64, 64};
    linear_case_rows(t, mode, n, norm, n_in, rows);
}

/* llama3-8b's layer shapes and odd row counts: the streamed kernel's blocks take tens of rows
 * each, so its ring of stages wraps many times and tiles stop at matrix and block edges */
static void test_linear_shapes(void)
{
    static const uint32_t qkv[3] = {4096, 1024, 1024}, ffn[3] = {14336, 64, 64},
                          o[3] = {4096, 64, 64}, odd[3] = {1000, 130, 70};
    static const enum be_type t16[] = {BE_BF16, BE_F16};
    static const uint32_t ns[] = {1, 2, 5, 8};
    for (int ti = 0; ti < 2; ti++)
        for (int ni = 0; ni < 4; ni++) {
            const uint32_t n = ns[ni];
            linear_case_rows(t16[ti], BE_LIN_SET, n, 1, 4096, qkv);
            linear_case_rows(t16[ti], BE_LIN_SWIGLU, n, 1, 4096, ffn);
            linear_case_rows(t16[ti], BE_LIN_ADD, n, 0, 14336, o);
            linear_case_rows(t16[ti], BE_LIN_ADD, n, 0, 4096, o);
            linear_case_rows(t16[ti], BE_LIN_SET, n, 1, 2048, odd);
            linear_case_rows(t16[ti], BE_LIN_SWIGLU, n, 1, 768, odd);
        }
}

/* the greedy pick of logits rows on the device against the cpu's sample_greedy: the same ids
 * (ties to the lowest id, nan never wins) and logprobs within 2e-6 */
static void test_greedy(struct backend *g)
{
    static const uint32_t vocabs[] = {1000, 32000, 128256};
    for (int vi = 0; vi < 3; vi++) {
        const uint32_t n = 9, V = vocabs[vi];
        float *x = malloc((size_t)n * V * sizeof(float));
        gu_fill(&rng, x, (size_t)n * V, 4.0f);
        x[1 * V + 7] = x[1 * V + 3] = 50.0f; /* a tie: id 3 */
        x[2 * V + 0] = NAN;                  /* nan never wins */
        x[2 * V + V - 1] = 60.0f;            /* the last id */
        for (uint32_t i = 0; i < V; i++)     /* a row of equal logits: id 0, -log V */
            x[3 * V + i] = 1.5f;
        x[4 * V + 5] = -INFINITY;
        struct be_tensor *tc = gu_tensor(cpu, BE_F32, n, V, x),
                         *tg = gu_tensor(gpu, BE_F32, n, V, x);
        int32_t ic[9], ig[9];
        float lc[9], lg[9];
        int rc = greedy_forward(cpu, tc, n, ic, lc);
        rc |= greedy_forward(g, tg, n, ig, lg);
        int bad = rc != 0;
        for (uint32_t r = 0; r < n && !bad; r++)
            if (ic[r] != ig[r] || fabsf(lc[r] - lg[r]) > 2e-6f + 1e-6f * fabsf(lc[r])) {
                printf("  row %u: cpu %d %.8g, cuda %d %.8g\n", r, ic[r], lc[r], ig[r], lg[r]);
                bad = 1;
            }
        char name[64];
        snprintf(name, sizeof(name), "greedy rows of %u logits", V);
        CHECK(name, !bad && ic[1] == 3 && ic[2] == (int32_t)V - 1 && ic[3] == 0);
        backend_tensor_free(cpu, tc);
        backend_tensor_free(gpu, tg);
        free(x);
    }
}

/* sampled rows on the device against sample.c's own twin of what the backend computes
 * (sampler_sample_dev): every field bit for bit, then the token and logprob sampler_sample
 * gives, and the logits as they were. Rows the device cannot take (top_k above its 8192, a
 * flat row's top-p cut bucket over the vocab) must come back with status 1 */
struct samp_case {
    float t, top_p, min_p, rep, pres, freq;
    int32_t top_k, n_top;
};

static const struct samp_case samp_cases[] = {
    {1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 0},    /* the whole vocab */
    {0.7f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 0},    /* top-p over the vocab */
    {1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 40, 3},   /* top-k */
    {0.8f, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 50, 0}, /* top-k, top-p, min-p */
    {1.0f, 1.0f, 0.1f, 1.0f, 0.0f, 0.0f, 0, 0},    /* min-p alone */
    {0.0f, 1.0f, 0.0f, 1.3f, 0.5f, 0.2f, 0, 5},    /* greedy with penalties */
    {1.2f, 0.5f, 0.0f, 1.1f, -0.4f, 0.3f, 0, 20},  /* top-p with penalties */
    {1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 5000, 0}, /* a large top-k */
    {0.5f, 0.999f, 0.01f, 1.0f, 0.0f, 0.0f, 0, 1}, /* top-p near 1, min-p */
    {1.0f, 0.8f, 0.0f, 0.9f, 0.0f, 0.0f, 0, 0},    /* top-p, a penalty below 1 */
    {1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 9000, 0}, /* top-k past the device's 8192 */
    /* no top alternatives, so a cluster of blocks a row takes them (test_sample_cluster) */
    {0.0f, 1.0f, 0.0f, 1.2f, 0.3f, 0.1f, 0, 0}, /* greedy with penalties */
    {0.7f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 1, 0}, /* top_k 1: the greedy pick */
};
#define SAMP_N_CASES (sizeof(samp_cases) / sizeof(samp_cases[0]))
#define SAMP_N_DISTS 5

/* row d of a vocab: spread 4, spread 12, flat, with nan / +-inf, peaked */
static void samp_fill(float *x, uint32_t V, int d)
{
    gu_fill(&rng, x, V, d == 1 ? 12.0f : 4.0f);
    if (d == 2)
        for (uint32_t i = 0; i < V; i++)
            x[i] = 0.25f;
    if (d == 3 && V > 8) {
        x[1] = NAN;
        x[V / 2] = -INFINITY;
        x[V - 1] = -INFINITY;
        if (V > 1000)
            x[V / 3] = INFINITY;
    }
    if (d == 4)
        for (uint32_t i = 0; i < V; i += 97)
            x[i] += 9.0f;
}

static int samp_same_out(const struct sample_dev_out *a, const struct sample_dev_out *b)
{
    if (a->id != b->id || a->drew != b->drew || a->n_top != b->n_top ||
        a->raw_max != b->raw_max || /* a zero max may carry either sign */
        memcmp(&a->raw_sum, &b->raw_sum, sizeof(double)) ||
        memcmp(&a->raw_logit, &b->raw_logit, sizeof(float)))
        return 0;
    for (int32_t k = 0; k < a->n_top; k++)
        if (a->top_id[k] != b->top_id[k] || memcmp(&a->top_v[k], &b->top_v[k], sizeof(float)))
            return 0;
    return 1;
}

static void test_sample(struct backend *g, const char *how)
{
    if (!sample_dev_supported()) {
        printf("ops: sampling on the device skipped (this build's sampler is not the avx2 one "
               "the device copies)\n");
        return;
    }
    /* 7 and 50257: rows off 16-byte alignment and a part 64-block at the end */
    static const uint32_t vocabs[] = {7, 64, 1000, 32000, 50257, 128256};
    const uint32_t n = SAMP_N_CASES * SAMP_N_DISTS;
    for (int vi = 0; vi < 6; vi++) {
        const uint32_t V = vocabs[vi];
        float *x = malloc((size_t)n * V * sizeof(float)), *back = malloc((size_t)n * V * 4);
        struct sampler **sd = calloc(n, sizeof(*sd)), **sr = calloc(n, sizeof(*sr)),
                       **ss = calloc(n, sizeof(*ss));
        struct sample_dev_row *rows = calloc(n, sizeof(*rows));
        const struct sample_dev_row **rp = calloc(n, sizeof(*rp));
        struct sample_dev_out *outs = calloc(n, sizeof(*outs)), ref;
        int32_t *pen = malloc((size_t)n * 2 * 256 * sizeof(int32_t));
        int bad = 0, n_dev = 0, n_back = 0, n_draw = 0;
        for (uint32_t r = 0; r < n; r++) {
            const struct samp_case *c = &samp_cases[r / SAMP_N_DISTS];
            samp_fill(x + (size_t)r * V, V, (int)(r % SAMP_N_DISTS));
            struct sample_params p;
            sample_params_default(&p);
            p.temperature = c->t;
            p.top_k = c->top_k;
            p.top_p = c->top_p;
            p.min_p = c->min_p;
            p.repetition_penalty = c->rep;
            p.presence_penalty = c->pres;
            p.frequency_penalty = c->freq;
            p.n_top_logprobs = c->n_top;
            p.seed = 1000 + r;
            if (sampler_create(&sd[r], &p, (int32_t)V) || sampler_create(&sr[r], &p, (int32_t)V) ||
                sampler_create(&ss[r], &p, (int32_t)V)) {
                CHECK("sampling: sampler_create", 0);
                return;
            }
            for (int h = 0; h < 40; h++) { /* a history with repeats */
                const int32_t id = (int32_t)gu_below(&rng, V < 50 ? V : 50) * (V > 50 ? 7 : 1);
                sampler_accept(sd[r], id % (int32_t)V);
                sampler_accept(sr[r], id % (int32_t)V);
                sampler_accept(ss[r], id % (int32_t)V);
            }
            int32_t *pr = pen + (size_t)r * 2 * 256;
            if (sampler_dev_row(sd[r], &rows[r], pr, pr + 256, 256)) {
                CHECK("sampling: the penalty window fits 256 ids", 0);
                return;
            }
            rp[r] = &rows[r];
        }
        struct be_tensor *tg = gu_tensor(g, BE_F32, n, V, x);
        int rc = sample_forward(g, tg, n, rp, outs);
        if (rc != 0) {
            printf("  sample_forward: %d\n", rc);
            bad = 1;
        }
        for (uint32_t r = 0; r < n && !bad; r++) {
            const struct samp_case *c = &samp_cases[r / SAMP_N_DISTS];
            const int flat_top_p = r % SAMP_N_DISTS == 2 && c->top_p < 1.0f && c->top_k == 0 &&
                                   c->t > 0.0f && V > 8192;
            const int expect_back = (c->top_k > 8192 && (uint32_t)c->top_k < V) || flat_top_p;
            sampler_sample_dev(sr[r], x + (size_t)r * V, &ref);
            if (outs[r].status != 0) {
                n_back++;
                if (!expect_back) {
                    printf("  row %u (case %u, rows like %d): given back to the host\n", r,
                           r / SAMP_N_DISTS, (int)(r % SAMP_N_DISTS));
                    bad++;
                }
                continue;
            }
            if (expect_back && c->top_k > 8192) {
                printf("  row %u: top_k %d sampled on the device\n", r, c->top_k);
                bad++;
            }
            n_dev++;
            n_draw += outs[r].drew;
            if (!samp_same_out(&outs[r], &ref)) {
                if (bad < 8)
                    printf("  row %u (case %u, rows like %d): cuda id %d drew %d max %.9g sum "
                           "%.17g logit %.9g; cpu id %d drew %d max %.9g sum %.17g logit %.9g\n",
                           r, r / SAMP_N_DISTS, (int)(r % SAMP_N_DISTS), outs[r].id, outs[r].drew,
                           outs[r].raw_max, outs[r].raw_sum, outs[r].raw_logit, ref.id, ref.drew,
                           ref.raw_max, ref.raw_sum, ref.raw_logit);
                bad++;
                continue;
            }
            /* through sampler_dev_finish: what sampler_sample returns, and the rng after */
            float lp_d, lp_s;
            struct sample_top td[SAMPLE_DEV_MAX_TOP], ts[SAMPLE_DEV_MAX_TOP];
            const int32_t id_d = sampler_dev_finish(sd[r], &outs[r], &lp_d, td);
            const int32_t id_s = sampler_sample(ss[r], x + (size_t)r * V, &lp_s, ts);
            int same = id_d == id_s && memcmp(&lp_d, &lp_s, sizeof(float)) == 0;
            for (int32_t k = 0; k < c->n_top && k < (int32_t)V && same; k++)
                same = td[k].id == ts[k].id &&
                       memcmp(&td[k].logprob, &ts[k].logprob, sizeof(float)) == 0;
            const int32_t nx_d = sampler_sample(sd[r], x + (size_t)r * V, NULL, NULL),
                          nx_s = sampler_sample(ss[r], x + (size_t)r * V, NULL, NULL);
            if (!same || nx_d != nx_s) {
                printf("  row %u: finished %d %.9g, sampler_sample %d %.9g; next %d / %d\n", r,
                       id_d, lp_d, id_s, lp_s, nx_d, nx_s);
                bad++;
            }
        }
        /* the penalized logits were put back */
        if (!bad && gu_read(g, tg, back, (size_t)n * V) == 0 &&
            memcmp(back, x, (size_t)n * V * sizeof(float)) != 0) {
            printf("  the logits changed\n");
            bad++;
        }
        char name[96];
        snprintf(name, sizeof(name),
                 "sampling rows of %u logits on the device%s (%d there, %d drew,"
                 " %d given back)",
                 V, how, n_dev, n_draw, n_back);
        CHECK(name, !bad && n_dev > 0);
        backend_tensor_free(g, tg);
        for (uint32_t r = 0; r < n; r++) {
            sampler_destroy(sd[r]);
            sampler_destroy(sr[r]);
            sampler_destroy(ss[r]);
        }
        free(sd);
        free(sr);
        free(ss);
        free(rows);
        free(rp);
        free(outs);
        free(pen);
        free(x);
        free(back);
    }
}

/* the sampling cases with a cluster of cl blocks a row for every row (sample_cl, and
 * sample_cl_rows past the cases' rows): the row's passes split over the blocks must give the
 * same bits as one block */
static void test_sample_cluster(const char *cl)
{
    char knobs[64];
    snprintf(knobs, sizeof(knobs), "sample_cl=%s,sample_cl_rows=100000", cl);
    struct backend *g = backend_tuned(knobs);
    if (!g)
        return;
    char how[48];
    snprintf(how, sizeof(how), ", %s blocks a row", cl);
    test_sample(g, how);
    backend_destroy(g);
}

static void test_linear(void)
{
    static const uint32_t ns[] = {1, 2, 3, 8}, widths[] = {512, 4096, 14336};
    for (int wi = 0; wi < 3; wi++)
        for (int ti = 0; ti < 3; ti++)
            for (int ni = 0; ni < 4; ni++) {
                uint32_t n_in = widths[wi];
                linear_case(all_types[ti], BE_LIN_SET, ns[ni], 1, n_in);
                linear_case(all_types[ti], BE_LIN_SET, ns[ni], 0, n_in);
                linear_case(all_types[ti], BE_LIN_ADD, ns[ni], 0, n_in);
                linear_case(all_types[ti], BE_LIN_SWIGLU, ns[ni], 1, n_in);
            }
}

static void test_rope(void)
{
    /* llama3's frequency divisors: 1 for the high frequencies, 8 for the low, a ramp between */
    float ff[32];
    for (int i = 0; i < 32; i++)
        ff[i] = i < 12 ? 1.0f : i > 22 ? 8.0f : 1.0f + 7.0f * (float)(i - 12) / 10.0f;
    for (int neox = 0; neox < 2; neox++)
        for (int part = 0; part < 3; part++) {
            const uint32_t T = 6, H = 4, hd = 64;
            struct pair x = pair_new(BE_F32, T, H * hd, 2.0f);
            int32_t pos[6] = {0, 1, 7, 255, 4096, 100000};
            uint32_t seq_of[6] = {0};
            struct kv_block_ref blk = {0, 0};
            struct be_seq s = {0, T, 0, &blk, 1};
            struct be_batch b = {&s, 1, T, pos, seq_of};
            struct be_rope r = {part == 1 ? 32 : hd, 500000.0f, part == 1 ? 0.25f : 1.0f, neox,
                                part == 2 ? ff : NULL};
            int rc = rope_forward(cpu, x.c, &b, H, hd, &r) | rope_forward(gpu, x.g, &b, H, hd, &r);
            char name[64];
            snprintf(name, sizeof(name), "rope %s n_rot=%u%s", neox ? "neox" : "normal", r.n_rot,
                     part == 2 ? " rope_freqs" : "");
            CHECK(name, rc == 0 && pair_cmp(name, &x, x.n, 1e-5f, 1e-5f) == 0);
            pair_free(&x);
        }
}

static void test_elementwise(void)
{
    const uint32_t n = 9, cols = 1000;
    struct pair a = pair_new(BE_F32, n, cols, 8.0f), b = pair_new(BE_F32, n, cols, 2.0f),
                o = pair_new(BE_F32, n, cols, 1.0f);
    int rc = silu_mul_forward(cpu, o.c, a.c, b.c, n) | silu_mul_forward(gpu, o.g, a.g, b.g, n);
    CHECK("silu_mul", rc == 0 && pair_cmp("silu_mul", &o, o.n, 1e-6f, 1e-5f) == 0);
    {
        /* 999 elements: the one-element kernel (the four-wide one takes multiples of 4) */
        struct pair a3 = pair_new(BE_F32, 3, 333, 8.0f), b3 = pair_new(BE_F32, 3, 333, 2.0f),
                    o3 = pair_new(BE_F32, 3, 333, 1.0f);
        rc =
            silu_mul_forward(cpu, o3.c, a3.c, b3.c, 3) | silu_mul_forward(gpu, o3.g, a3.g, b3.g, 3);
        CHECK("silu_mul 3x333",
              rc == 0 && pair_cmp("silu_mul 3x333", &o3, o3.n, 1e-6f, 1e-5f) == 0);
        pair_free(&a3);
        pair_free(&b3);
        pair_free(&o3);
    }
    rc = gelu_mul_forward(cpu, o.c, a.c, b.c, n) | gelu_mul_forward(gpu, o.g, a.g, b.g, n);
    CHECK("gelu_mul", rc == 0 && pair_cmp("gelu_mul", &o, o.n, 1e-6f, 1e-5f) == 0);
    {
        /* rmsnorm of each head: 9 tokens of 4 heads of 250 (the plain kernel) and 2 of 8 of
         * 128; gemma's embedding scale */
        static const uint32_t hs[2][3] = {{9, 4, 250}, {2, 8, 128}};
        for (int i = 0; i < 2; i++) {
            struct pair x = pair_new(BE_F32, hs[i][0], hs[i][1] * hs[i][2], 3.0f),
                        w = pair_new(BE_F32, 1, hs[i][2], 1.0f);
            rc = rmsnorm_heads_forward(cpu, x.c, w.c, hs[i][0], hs[i][1], 1e-6f) |
                 rmsnorm_heads_forward(gpu, x.g, w.g, hs[i][0], hs[i][1], 1e-6f);
            CHECK("rmsnorm_heads",
                  rc == 0 && pair_cmp("rmsnorm_heads", &x, x.n, 1e-6f, 1e-5f) == 0);
            pair_free(&x);
            pair_free(&w);
        }
        struct pair x = pair_new(BE_F32, 3, 640, 1.0f);
        rc = scale_forward(cpu, x.c, 25.298221f, 3) | scale_forward(gpu, x.g, 25.298221f, 3);
        CHECK("scale", rc == 0 && pair_cmp("scale", &x, x.n, 0, 0) == 0);
        pair_free(&x);
    }
    rc = add_forward(cpu, o.c, a.c, b.c, n) | add_forward(gpu, o.g, a.g, b.g, n);
    CHECK("add", rc == 0 && pair_cmp("add", &o, o.n, 0, 0) == 0);
    /* in place: x = x + y */
    rc = add_forward(cpu, a.c, a.c, b.c, n) | add_forward(gpu, a.g, a.g, b.g, n);
    CHECK("add in place", rc == 0 && pair_cmp("add in place", &a, a.n, 0, 0) == 0);
    struct pair r = pair_new(BE_F32, 3, cols, 1.0f);
    uint32_t rows[3] = {8, 0, 8};
    rc = get_rows_forward(cpu, r.c, a.c, rows, 3) | get_rows_forward(gpu, r.g, a.g, rows, 3);
    CHECK("get_rows", rc == 0 && pair_cmp("get_rows", &r, r.n, 0, 0) == 0);
    pair_free(&a);
    pair_free(&b);
    pair_free(&o);
    pair_free(&r);
}

/* --- kv_write + attention over random device/host splits ------------------ */

struct attn_case {
    uint32_t B, D, n_kv, g, n_layer;
    enum kv_dtype dt;
    uint32_t n_seqs;
    uint32_t n_past[6], n_tok[6];
    int placement;   /* 0 all device, 1 all host, 2 random */
    uint32_t window; /* be_attn.window: 0, or a sliding window of this many positions */
};

/* a case's layout, its blocks per sequence, and all its blocks and tokens */
static void attn_case_size(const struct attn_case *ac, struct kv_layout *l, uint32_t *n_blk,
                           uint32_t *total, uint32_t *T)
{
    kv_layout_init(l, ac->B, ac->n_layer, ac->n_kv, ac->D, ac->dt);
    *total = *T = 0;
    for (uint32_t s = 0; s < ac->n_seqs; s++) {
        n_blk[s] = kv_blocks_for(l, ac->n_past[s] + ac->n_tok[s]);
        *total += n_blk[s];
        *T += ac->n_tok[s];
    }
}

/* the gpu's pools of total blocks each: the device pool in device memory, the host pool in host
 * memory the backend registers */
static int gpu_pools_init(struct kv_pools *gp, uint32_t total, size_t bb)
{
    *gp = (struct kv_pools){{NULL, NULL}, {total, total}};
    if (rkv_cuda_dev_alloc(0, total * bb, &gp->base[KV_DEVICE]) < 0)
        return -1;
    gp->base[KV_HOST] = aligned_alloc(4096, (total * bb + 4095) & ~(size_t)4095);
    return 0;
}

/* detaches the pools from the gpu backend, then frees them */
static void gpu_pools_fini(struct kv_pools *gp, const struct kv_layout *l)
{
    struct kv_pools none = {{NULL, NULL}, {0, 0}};
    backend_set_kv(gpu, l, &none);
    rkv_cuda_dev_free(gp->base[KV_DEVICE]);
    free(gp->base[KV_HOST]);
}

/* (o, m, l) of the device [0] and host [1] partials, T tokens, H heads of qd / H dims */
struct attn_outs {
    struct pair o[2], m[2], l[2];
};

static void attn_outs_init(struct attn_outs *x, uint32_t T, uint32_t qd, uint32_t H)
{
    for (int r = 0; r < 2; r++) {
        x->o[r] = pair_new(BE_F32, T, qd, 1.0f);
        x->m[r] = pair_new(BE_F32, T, H, 1.0f);
        x->l[r] = pair_new(BE_F32, T, H, 1.0f);
    }
}

static void attn_outs_fini(struct attn_outs *x)
{
    for (int r = 0; r < 2; r++) {
        pair_free(&x->o[r]);
        pair_free(&x->m[r]);
        pair_free(&x->l[r]);
    }
}

/* random kv contents of n_blocks blocks at base in the layout's dtype: the elements of every
 * slice, or (8-bit) every (head, position) row quantized with its scales */
static void kv_fill(const struct kv_layout *l, void *base, uint32_t n_blocks)
{
    const size_t bb = kv_block_bytes(l);
    if (!kv_dtype_is_8bit(l->dtype)) {
        size_t n_el = n_blocks * bb / kv_dtype_size(l->dtype);
        float *tmp = malloc(n_el * sizeof(float));
        gu_fill(&rng, tmp, n_el, 1.0f);
        cpu_store_kv(l->dtype, base, tmp, n_el);
        free(tmp);
        return;
    }
    float *row = malloc(l->head_dim * sizeof(float));
    for (size_t s = 0; s < (size_t)n_blocks * 2 * l->n_layer; s++) {
        char *slice = (char *)base + s * kv_slice_bytes(l);
        for (uint32_t h = 0; h < l->n_kv_head; h++)
            for (uint32_t p = 0; p < l->block_size; p++) {
                gu_fill(&rng, row, l->head_dim, 1.0f);
                kv_row_store(l, slice, h, p, row);
            }
    }
    free(row);
}

static int attn_run(const struct attn_case *ac, int idx)
{
    struct kv_layout l;
    uint32_t n_blk_seq[6], total, T;
    attn_case_size(ac, &l, n_blk_seq, &total, &T);
    /* cpu pools: plain memory; gpu: device pool in device memory, host pool
     * a separate host copy the backend registers */
    const size_t bb = kv_block_bytes(&l);
    struct kv_local *kl = NULL;
    if (kv_local_create(&kl, &l, total, total) < 0)
        return -1;
    const struct kv_pools *cp = kv_local_pools(kl);
    struct kv_pools gp;
    if (gpu_pools_init(&gp, total, bb) < 0)
        return -1;
    /* random kv contents in the element type */
    for (int r = 0; r < KV_N_POOLS; r++)
        kv_fill(&l, cp->base[r], total);
    rkv_cuda_copy(gp.base[KV_DEVICE], cp->base[KV_DEVICE], total * bb);
    memcpy(gp.base[KV_HOST], cp->base[KV_HOST], total * bb);
    /* block tables: each table entry a distinct block of its residency */
    struct kv_block_ref *tables = calloc(total, sizeof(*tables));
    struct be_seq seqs[6];
    int32_t *pos = calloc(T, sizeof(int32_t));
    uint32_t *seq_of = calloc(T, sizeof(uint32_t));
    uint32_t next[2] = {0, 0}, bi = 0, t = 0;
    for (uint32_t s = 0; s < ac->n_seqs; s++) {
        seqs[s] = (struct be_seq){t, ac->n_tok[s], ac->n_past[s], tables + bi, n_blk_seq[s]};
        for (uint32_t j = 0; j < n_blk_seq[s]; j++, bi++) {
            int r = ac->placement == 2 ? (int)gu_below(&rng, 2) : ac->placement;
            tables[bi] = (struct kv_block_ref){next[r]++, (uint8_t)r};
        }
        for (uint32_t i = 0; i < ac->n_tok[s]; i++, t++) {
            pos[t] = (int32_t)(ac->n_past[s] + i);
            seq_of[t] = s;
        }
    }
    struct be_batch b = {seqs, ac->n_seqs, T, pos, seq_of};
    int rc = backend_set_kv(cpu, &l, cp) | backend_set_kv(gpu, &l, &gp);
    const uint32_t H = ac->n_kv * ac->g, qd = H * ac->D, kvd = ac->n_kv * ac->D;
    struct be_attn at = {H, ac->n_kv, ac->D, 1.0f / sqrtf((float)ac->D), ac->window};
    struct pair q = pair_new(BE_F32, T, qd, 1.0f), k = pair_new(BE_F32, T, kvd, 1.0f),
                v = pair_new(BE_F32, T, kvd, 1.0f);
    struct attn_outs ao;
    attn_outs_init(&ao, T, qd, H);
    struct pair *po = ao.o, *pm = ao.m, *pl = ao.l;
    char name[160];
    snprintf(name, sizeof(name), "attn case %d: B=%u D=%u kv=%u g=%u %s %s window %u", idx, ac->B,
             ac->D, ac->n_kv, ac->g, kv_dtype_name(ac->dt),
             ac->placement == 0   ? "device"
             : ac->placement == 1 ? "host"
                                  : "split",
             ac->window);
    uint32_t layer = ac->n_layer - 1;
    rc |= kv_write_forward(cpu, &b, layer, k.c, v.c) | kv_write_forward(gpu, &b, layer, k.g, v.g);
    /* the pools after the write: byte for byte the same kv */
    backend_sync(gpu);
    uint8_t *dev_copy = malloc(total * bb);
    rkv_cuda_copy(dev_copy, gp.base[KV_DEVICE], total * bb);
    int same = !memcmp(dev_copy, cp->base[KV_DEVICE], total * bb) &&
               !memcmp(gp.base[KV_HOST], cp->base[KV_HOST], total * bb);
    free(dev_copy);
    CHECK("kv_write pools equal", rc == 0 && same);
    size_t bad = 0;
    for (int r = 0; r < 2; r++) {
        struct be_partial oc = {po[r].c, pm[r].c, pl[r].c}, og = {po[r].g, pm[r].g, pl[r].g};
        rc |= attn_partial_forward(cpu, &b, layer, (enum kv_residency)r, q.c, &at, &oc) |
              attn_partial_forward(gpu, &b, layer, (enum kv_residency)r, q.g, &at, &og);
        bad += pair_cmp(r ? "o host" : "o device", &po[r], po[r].n, 2e-5f, 1e-4f);
        bad += pair_cmp(r ? "m host" : "m device", &pm[r], pm[r].n, 2e-5f, 1e-5f);
        bad += pair_cmp(r ? "l host" : "l device", &pl[r], pl[r].n, 1e-5f, 1e-4f);
    }
    struct be_partial ac_ = {po[0].c, pm[0].c, pl[0].c}, bc = {po[1].c, pm[1].c, pl[1].c};
    struct be_partial ag = {po[0].g, pm[0].g, pl[0].g}, bg = {po[1].g, pm[1].g, pl[1].g};
    rc |= attn_merge_forward(cpu, &ac_, &bc, T, &at) | attn_merge_forward(gpu, &ag, &bg, T, &at);
    bad += pair_cmp("o merged", &po[0], po[0].n, 2e-5f, 1e-4f);
    CHECK(name, rc == 0 && bad == 0);
    if (rc == 0 && bad == 0)
        printf("  ok %s (%u tokens, %u blocks)\n", name, T, total);
    attn_outs_fini(&ao);
    pair_free(&q);
    pair_free(&k);
    pair_free(&v);
    gpu_pools_fini(&gp, &l);
    kv_local_destroy(kl);
    free(tables);
    free(pos);
    free(seq_of);
    return 0;
}

static void test_attention(void)
{
    static const struct attn_case cases[] = {
        /* decode batches (one token per sequence) */
        {16, 64, 2, 4, 2, KV_F16, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 2},
        {16, 64, 2, 4, 2, KV_F16, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 0},
        {16, 64, 2, 4, 2, KV_F16, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 1},
        {32, 128, 2, 2, 1, KV_F32, 3, {5, 100, 300}, {1, 1, 1}, 2},
        {256, 128, 8, 4, 1, KV_F16, 2, {1000, 3000}, {1, 1}, 2},
        {16, 32, 4, 1, 1, KV_F16, 2, {40, 70}, {1, 1}, 2},
        /* blocks of whole 64-key chunks, all on the device: what decode attention loads by
         * tensor copies (a last chunk cut short, a block's last key, a long list) */
        {64, 64, 2, 4, 1, KV_F16, 3, {63, 64, 700}, {1, 1, 1}, 0},
        {256, 128, 8, 4, 1, KV_F16, 2, {255, 9000}, {1, 1}, 0},
        /* ~800 key chunks over one kv head: hundreds of splits, more weights than the merge
         * folded into the launch keeps in shared memory (its other path) */
        {256, 16, 1, 8, 1, KV_F16, 1, {52000}, {1}, 0},
        {256, 16, 1, 8, 1, KV_F16, 1, {52000}, {1}, 2},
        /* prefill and mixed batches */
        {16, 64, 2, 4, 2, KV_F16, 3, {0, 20, 100}, {37, 1, 70}, 2},
        {32, 128, 2, 8, 1, KV_F32, 2, {0, 33}, {64, 20}, 2},
        {256, 128, 8, 4, 1, KV_F16, 1, {0}, {300}, 0},
        {64, 128, 8, 4, 1, KV_F16, 1, {100}, {200}, 1},
        {16, 16, 1, 16, 1, KV_F16, 2, {3, 0}, {9, 5}, 2},
        /* sliding windows (gemma3's local layers): decode and prefill rows whose window starts
         * inside a block, spans device and host blocks, or leaves whole splits empty; Gemma's
         * head_dim of 256 */
        {16, 64, 2, 4, 2, KV_F16, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 2, 20},
        {256, 128, 8, 4, 1, KV_F16, 2, {1000, 3000}, {1, 1}, 0, 512},
        {256, 128, 8, 4, 1, KV_F16, 2, {1000, 3000}, {1, 1}, 2, 512},
        {256, 16, 1, 8, 1, KV_F16, 1, {52000}, {1}, 0, 700},
        {16, 64, 2, 4, 2, KV_F16, 3, {0, 20, 100}, {37, 1, 70}, 2, 33},
        {256, 128, 8, 4, 1, KV_F16, 1, {0}, {300}, 0, 64},
        {32, 128, 2, 8, 1, KV_F32, 2, {0, 33}, {64, 20}, 2, 10},
        {16, 256, 1, 4, 1, KV_F16, 2, {30, 600}, {1, 1}, 2, 512},
        {16, 256, 1, 4, 1, KV_F16, 2, {0, 500}, {40, 100}, 2, 64},
        {16, 256, 1, 4, 1, KV_F16, 1, {0}, {40}, 0, 0},
        /* 8-bit kv (q8, fp8): the write's bytes are the cpu's, and the reads of device blocks,
         * of host blocks (zero-copy and staged) and of splits agree with the cpu's; decode,
         * prefill, a window, short q8 groups (head_dim 8, 16), head_dim 256 */
        {16, 64, 2, 4, 2, KV_Q8, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 2},
        {16, 64, 2, 4, 2, KV_FP8, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 2},
        {256, 128, 8, 4, 1, KV_Q8, 2, {1000, 3000}, {1, 1}, 0},
        {256, 128, 8, 4, 1, KV_Q8, 2, {1000, 3000}, {1, 1}, 1},
        {256, 128, 8, 4, 1, KV_FP8, 2, {1000, 3000}, {1, 1}, 2},
        {16, 16, 1, 16, 1, KV_Q8, 2, {3, 0}, {9, 5}, 2},
        {32, 8, 2, 2, 2, KV_Q8, 2, {0, 33}, {64, 20}, 2},
        {16, 64, 2, 4, 2, KV_Q8, 3, {0, 20, 100}, {37, 1, 70}, 2},
        {256, 128, 8, 4, 1, KV_FP8, 1, {0}, {300}, 0},
        {256, 128, 8, 4, 1, KV_Q8, 2, {1000, 3000}, {1, 1}, 2, 512},
        {16, 256, 1, 4, 1, KV_Q8, 2, {30, 600}, {1, 1}, 2, 512},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (attn_run(&cases[i], (int)i) < 0)
            CHECK("attention setup", 0);
}

/* attn_fixed: the same kv content of each sequence placed four ways (all on the device,
 * a random split, the older half on the host, all but the newest block on the host) gives the
 * same attention output bit for bit, and agrees with the cpu backend */
static void attn_fixed_identity(const struct attn_case *ac, int idx)
{
    struct kv_layout l;
    uint32_t n_blk[6], total, T;
    attn_case_size(ac, &l, n_blk, &total, &T);
    const size_t bb = kv_block_bytes(&l);
    /* the logical content: block i of the concatenated tables */
    uint8_t *content = malloc(total * bb);
    kv_fill(&l, content, total);
    struct kv_pools gp;
    if (gpu_pools_init(&gp, total, bb) < 0) {
        CHECK("fixed attention setup", 0);
        free(content);
        return;
    }
    struct kv_local *kl = NULL;
    kv_local_create(&kl, &l, total, total);
    const struct kv_pools *cp = kv_local_pools(kl);
    memcpy(cp->base[KV_DEVICE], content, total * bb); /* the cpu reads everything on device */
    int rc = backend_set_kv(gpu, &l, &gp) | backend_set_kv(cpu, &l, cp);
    const uint32_t H = ac->n_kv * ac->g, qd = H * ac->D;
    struct be_attn at = {H, ac->n_kv, ac->D, 1.0f / sqrtf((float)ac->D)};
    struct pair q = pair_new(BE_F32, T, qd, 1.0f);
    struct attn_outs ao;
    attn_outs_init(&ao, T, qd, H);
    struct pair *po = ao.o, *pm = ao.m, *pl = ao.l;
    struct kv_block_ref *tab = calloc(total, sizeof(*tab));
    struct be_seq seqs[6];
    int32_t *pos = calloc(T, sizeof(int32_t));
    uint32_t *seq_of = calloc(T, sizeof(uint32_t));
    float *first = malloc((size_t)T * qd * sizeof(float)),
          *got = malloc((size_t)T * qd * sizeof(float));
    uint32_t layer = ac->n_layer - 1;
    int same = 1, close_ = 1;
    for (int way = 0; way < 4 && rc == 0; way++) {
        uint32_t bi = 0, t = 0, next[2] = {0, 0};
        int any_host = 0;
        for (uint32_t s = 0; s < ac->n_seqs; s++) {
            seqs[s] = (struct be_seq){t, ac->n_tok[s], ac->n_past[s], tab + bi, n_blk[s]};
            for (uint32_t j = 0; j < n_blk[s]; j++, bi++) {
                int r = way == 0   ? 0
                        : way == 1 ? (int)gu_below(&rng, 2)
                        : way == 2 ? j < n_blk[s] / 2
                                   : j + 1 < n_blk[s];
                any_host |= r;
                tab[bi] = (struct kv_block_ref){next[r]++, (uint8_t)r};
                /* the block's content goes where this placement puts it */
                if (r)
                    memcpy((uint8_t *)gp.base[KV_HOST] + tab[bi].index * bb, content + bi * bb, bb);
                else
                    rkv_cuda_copy((uint8_t *)gp.base[KV_DEVICE] + tab[bi].index * bb,
                                  content + bi * bb, bb);
            }
            for (uint32_t i = 0; i < ac->n_tok[s]; i++, t++) {
                pos[t] = (int32_t)(ac->n_past[s] + i);
                seq_of[t] = s;
            }
        }
        struct be_batch b = {seqs, ac->n_seqs, T, pos, seq_of};
        struct be_partial od = {po[0].g, pm[0].g, pl[0].g}, oh = {po[1].g, pm[1].g, pl[1].g};
        rc |= attn_partial_forward(gpu, &b, layer, KV_DEVICE, q.g, &at, &od);
        if (any_host)
            rc |= attn_partial_forward(gpu, &b, layer, KV_HOST, q.g, &at, &oh) |
                  attn_merge_forward(gpu, &od, &oh, T, &at);
        rc |= backend_sync(gpu) | backend_tensor_get(gpu, po[0].g, way ? got : first, 0,
                                                     (size_t)T * qd * sizeof(float));
        if (way && memcmp(first, got, (size_t)T * qd * sizeof(float)) != 0) {
            size_t i = 0;
            while (i < (size_t)T * qd && first[i] == got[i])
                i++;
            printf("  FAIL fixed attention case %d, placement %d: element %zu %.9g vs %.9g\n", idx,
                   way, i, first[i], got[i]);
            same = 0;
        }
        if (way == 0) {
            /* the cpu over the same blocks, all on its device pool */
            for (uint32_t i = 0; i < total; i++)
                tab[i] = (struct kv_block_ref){i, KV_DEVICE};
            struct be_partial oc = {po[0].c, pm[0].c, pl[0].c};
            rc |= attn_partial_forward(cpu, &b, layer, KV_DEVICE, q.c, &at, &oc);
            float *want = (float *)po[0].c->data;
            for (size_t i = 0; i < (size_t)T * qd; i++)
                if (fabsf(first[i] - want[i]) > 2e-5f + 1e-4f * fabsf(want[i])) {
                    printf("  FAIL fixed attention case %d: element %zu %.7g vs cpu %.7g\n", idx, i,
                           first[i], want[i]);
                    close_ = 0;
                    break;
                }
        }
    }
    char name[96];
    snprintf(name, sizeof(name), "fixed attention case %d: same output in 4 placements", idx);
    CHECK(name, rc == 0 && same && close_);
    if (rc == 0 && same && close_)
        printf("  ok %s (%u tokens, %u blocks)\n", name, T, total);
    attn_outs_fini(&ao);
    pair_free(&q);
    gpu_pools_fini(&gp, &l);
    kv_local_destroy(kl);
    free(content);
    free(tab);
    free(pos);
    free(seq_of);
    free(first);
    free(got);
}

static void test_attention_fixed(void)
{
    static const struct attn_case cases[] = {
        {16, 64, 2, 4, 2, KV_F16, 6, {0, 1, 15, 16, 17, 200}, {1, 1, 1, 1, 1, 1}, 0},
        {256, 128, 8, 4, 1, KV_F16, 2, {1000, 4100}, {1, 1}, 0},
        {32, 128, 2, 2, 1, KV_F32, 3, {5, 100, 300}, {1, 1, 1}, 0},
        {16, 64, 2, 4, 2, KV_F16, 3, {0, 20, 100}, {37, 1, 70}, 0},
        {16, 64, 2, 4, 2, KV_Q8, 3, {0, 20, 100}, {37, 1, 70}, 0},
        {256, 128, 8, 4, 1, KV_FP8, 2, {1000, 4100}, {1, 1}, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        attn_fixed_identity(&cases[i], (int)i);
}

/* the attention cases again on a backend built now, from the environment as the caller set it
 * (an a/b switch of the cuda backend); with stats, the backend's counter line after them */
static void attention_with(const char *what, char *stats, size_t len)
{
    struct backend_opts go = {"cuda", 0, 0};
    struct backend *alt = NULL, *save = gpu;
    char err[256];
    if (backend_create(&go, &alt, err, sizeof(err)) < 0) {
        fprintf(stderr, "gpu-test: %s: %s\n", what, err);
        CHECK(what, 0);
        return;
    }
    printf("ops: attention with %s\n", what);
    if (stats)
        backend_stats(alt, stats, len); /* counts from here */
    gpu = alt;
    test_attention();
    gpu = save;
    if (stats) {
        backend_stats(alt, stats, len);
        printf("  %s\n", stats);
    }
    backend_destroy(alt);
}

/* the backends made from here on tuned by knobs ("name=value,...", worker/cuda/tuning.h);
 * NULL: the defaults */
static void tune(const char *knobs)
{
    if (knobs)
        setenv("RKV_CUDA_TUNE", knobs, 1);
    else
        unsetenv("RKV_CUDA_TUNE");
}

/* a cuda backend tuned by knobs; NULL, counted as a failure, when it cannot be made */
static struct backend *backend_tuned(const char *knobs)
{
    struct backend_opts go = {"cuda", 0, 0};
    struct backend *b = NULL;
    char err[256];
    tune(knobs);
    if (backend_create(&go, &b, err, sizeof(err)) < 0) {
        fprintf(stderr, "gpu-test: a backend with %s: %s\n", knobs, err);
        CHECK(knobs, 0);
        b = NULL;
    }
    tune(NULL);
    return b;
}

/* attention_with on a backend tuned by knobs; its host-read counters must not contain absent,
 * and must contain present (NULL: not checked) */
static void attention_env(const char *what, const char *knobs, const char *absent,
                          const char *present)
{
    tune(knobs);
    char st[2048] = "";
    attention_with(what, absent || present ? st : NULL, sizeof(st));
    char check[200];
    if (absent) {
        snprintf(check, sizeof(check), "attention: %s: not \"%s\" in the counters", what, absent);
        CHECK(check, strstr(st, absent) == NULL);
    }
    if (present) {
        snprintf(check, sizeof(check), "attention: %s: \"%s\" in the counters", what, present);
        CHECK(check, strstr(st, present) != NULL);
    }
    tune(NULL);
}

int gpu_model_tests(struct backend *cpu_be, struct backend *gpu_be, struct backend *precise,
                    struct backend *qexact, struct backend *det, int *pass, int *fail);
int gpu_model_cpu_tail_tests(struct backend *cpu_be, struct backend *tail_be, const char *what,
                             int *pass, int *fail);
int gpu_model_graph_tests(struct backend *plain, struct backend *graph, int *pass, int *fail);
int gpu_model_cases_with(struct backend *cpu_be, struct backend *be, const char *what, int *pass,
                         int *fail);

int main(int argc, char **argv)
{
    rkv_log_init("gpu-test", RKV_LOG_WARN);
    uint64_t seed = 1;
    int ops = 1, model = 1, attn_only = 0, sample_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--ops-only"))
            model = 0;
        else if (!strcmp(argv[i], "--model-only"))
            ops = 0;
        else if (!strcmp(argv[i], "--attn-only"))
            ops = model = 0, attn_only = 1; /* the attention cases alone (compute-sanitizer) */
        else if (!strcmp(argv[i], "--sample-only"))
            ops = model = 0, sample_only = 1; /* sampling on the device alone */
        else {
            fprintf(stderr,
                    "gpu-test: unknown argument '%s'; usage: gpu_ops_test [--seed N] "
                    "[--ops-only | --model-only | --attn-only | --sample-only]\n",
                    argv[i]);
            return 2;
        }
    }
    gu_seed(&rng, seed);
    if (rkv_cuda_backend_probe() <= 0) {
        printf("gpu-test: no CUDA device; skipped\n");
        return 77;
    }
    char err[256];
    /* the reference dequantizes block-type weights to f32 (the cpu backend's exact path)
     * rather than rounding activations to 8 bits for its integer dots */
    setenv("RKV_CPU_EXACT", "1", 1);
    struct backend_opts co = {"cpu", 0, 0}, go = {"cuda", 0, 0};
    if (backend_create(&co, &cpu, err, sizeof(err)) < 0 ||
        backend_create(&go, &gpu, err, sizeof(err)) < 0) {
        fprintf(stderr, "gpu-test: %s\n", err);
        return 1;
    }
    tune("precise=1");
    struct backend *precise = NULL;
    if (backend_create(&go, &precise, err, sizeof(err)) < 0)
        precise = NULL;
    tune(NULL);
    if (attn_only) {
        printf("ops: attention (seed %llu)\n", (unsigned long long)seed);
        test_attention();
    }
    if (sample_only) {
        printf("ops: sampling (seed %llu)\n", (unsigned long long)seed);
        test_sample(gpu, "");
        test_sample_cluster("8");
        test_sample_cluster("2");
    }
    if (ops) {
        printf("ops (seed %llu)\n", (unsigned long long)seed);
        test_embed();
        test_rmsnorm();
        test_quant();
        test_matmul(precise, 8);
        test_matmul2();
        lt_check("default", 1);
        {
            struct backend *lt0 = backend_tuned("lt_tune_n=0"), *save = gpu;
            if (lt0) {
                printf("ops: matmul, rows past 8 on cublasGemmEx (lt_tune_n=0)\n");
                gpu = lt0;
                test_matmul(NULL, 8);
                lt_check("lt_tune_n=0", 0);
                gpu = save;
            }
            backend_destroy(lt0);
        }
        test_twin();
        test_linear();
        test_linear_shapes();
        {
            /* the matmul cases with rows past one on cublas (gemv_max_n; the fused linears
             * decline such rows: the forward composes them of the plain ops) */
            struct backend *gm1 = backend_tuned("gemv_max_n=1"), *save = gpu;
            if (gm1) {
                printf("ops: matmul, rows past 1 on cublas\n");
                gpu = gm1;
                mma_max = 1;
                test_matmul(NULL, 1);
                mma_max = 8;
                gpu = save;
            }
            backend_destroy(gm1);
            /* the register kernels in place of the tensor-core ones (lin_mma=0) */
            struct backend *reg = backend_tuned("lin_mma=0");
            if (reg) {
                printf("ops: matmul and linear on the register kernels\n");
                gpu = reg;
                mma_from = 0;
                test_matmul(NULL, 8);
                test_linear();
                test_linear_shapes();
                gpu = save;
            }
            backend_destroy(reg);
            mma_from = 1; /* every token count on tensor cores (lin_mma=1) */
            struct backend *m1 = backend_tuned("lin_mma=1");
            if (m1) {
                printf("ops: matmul and linear on tensor cores from one token\n");
                gpu = m1;
                test_matmul(NULL, 8);
                test_linear();
                gpu = save;
            }
            backend_destroy(m1);
            mma_from = 2;
        }
        test_rope();
        test_elementwise();
        test_attention();
        /* the other host-block path than the measured choice: both must agree */
        attention_env("host blocks read by zerocopy", "host_read=zerocopy", NULL, NULL);
        attention_env("host blocks read by copy", "host_read=copy", NULL, NULL);
        /* CPU_TAIL: host blocks attended by cpu threads over the host pool, merged with the
         * device part by lse */
        {
            tune("host_read=cpu");
            char cs[1024] = "";
            attention_with("host blocks attended on the cpu (CPU_TAIL)", cs, sizeof(cs));
            CHECK("attention: the cpu attended host blocks", strstr(cs, " 0 attended") == NULL);
            tune(NULL);
        }
        /* a layer's host blocks staged in passes of whole sequences: a pass of 112 KiB makes
         * the first cases (8 KiB per block and layer, 20 host blocks) take two; the results
         * must not change, and the passes must have run */
        attention_env("host blocks staged in passes of 112 KiB", "host_read=copy,stage_pass_kb=112",
                      " 0 in 0 passes", NULL);
        /* greedy and sampled rows picked on the device */
        struct backend *gb = NULL;
        if (backend_create(&go, &gb, err, sizeof(err)) == 0) {
            test_greedy(gb);
            test_sample(gb, "");
            backend_destroy(gb);
        }
        test_sample_cluster("8");
        test_sample_cluster("4");
        /* decode attention's device chunks by tensor copies; at most 2 splits: hundreds of
         * chunks a thread block */
        attention_env("decode attention", NULL, "attention by tensor copies: 0", NULL);
        attention_env("decode attention, 2 splits", "max_split=2", NULL, NULL);
        /* the deterministic kernels: prefill tiles (64 rows, d 64 and 128) on attn_mma_kernel,
         * decode on the general kernel, one split per block, host blocks read both ways */
        attention_env("deterministic kernels, host blocks read by zerocopy",
                      "deterministic=1,host_read=zerocopy", NULL, NULL);
        attention_env("deterministic kernels, host blocks read by copy",
                      "deterministic=1,host_read=copy", NULL, NULL);
        /* host blocks copied: a prefill's rows of a host block go into its staging slot and
         * are copied back to the pool (the pools are compared after the kv write) */
        attention_env("host blocks copied, prefill rows written back from staging",
                      "host_read=copy", " 0 with the kv write into staging", NULL);
        /* the split host read: a share of each decode row's host blocks (the oldest) attended on
         * the cpu, the rest read by the gpu, merged by lse; 100: every host block of a decode
         * row on the cpu through the split path. The cases' tails are far below the default
         * split_async_us: the cpu's part waits on the launching thread */
        attention_env("host blocks split, 40 % on the cpu, the rest copied",
                      "host_split=40,split_min_us=0,host_read=copy", " 0 split",
                      "(0 off the launching");
        attention_env("host blocks split, 40 % on the cpu, the rest zero-copy",
                      "host_split=40,split_min_us=0,host_read=zerocopy", " 0 split", NULL);
        attention_env("host blocks split, off the launching thread from a 0 us tail",
                      "host_split=40,split_min_us=0,split_async_us=0,host_read=copy",
                      "(0 off the launching", "off the launching thread");
        attention_env("host blocks of decode rows all on the cpu by the split",
                      "host_split=100,split_min_us=0", " 0 split", NULL);
        /* one key split per block (placement-independent numbers) keeps the split off */
        attention_env("host blocks split asked, one key split per block",
                      "host_split=40,split_min_us=0,attn_fixed=1", NULL, " 0 split");
        /* the cases' host tails (a few KiB a layer) are far below the default gate (1 ms of the
         * link a layer): the gpu reads them alone */
        attention_env("host blocks split asked, tails too short", "host_split=40",
                      " 0 tails too short", " 0 split");
        /* placement-independent attention: the cases against the cpu, then the same kv placed
         * four ways, bit for bit */
        tune("attn_fixed=1");
        attention_with("one split per block, merged in position order", NULL, 0);
        {
            struct backend *fb = NULL, *save = gpu;
            if (backend_create(&go, &fb, err, sizeof(err)) == 0) {
                gpu = fb;
                test_attention_fixed();
                gpu = save;
                backend_destroy(fb);
            } else {
                CHECK("fixed attention backend", 0);
            }
        }
        tune(NULL);
    }
    if (model) {
        struct backend_opts dopt = {"cuda", 0, 0, 1};
        struct backend *det = NULL;
        if (backend_create(&dopt, &det, err, sizeof(err)) < 0)
            det = NULL;
        struct backend *qexact = backend_tuned("qdot=exact");
        gpu_model_tests(cpu, gpu, precise, qexact, det, &n_pass, &n_fail);
        backend_destroy(qexact);
        backend_destroy(det);
        /* graphs are on by default: the same steps on a backend without them */
        tune("graph=0");
        struct backend *plain = NULL, *graph = NULL;
        int prc = backend_create(&go, &plain, err, sizeof(err));
        tune("graph=1");
        if (prc == 0 && backend_create(&go, &graph, err, sizeof(err)) == 0) {
            gpu_model_graph_tests(plain, graph, &n_pass, &n_fail);
        } else {
            CHECK("graph backend", 0);
        }
        backend_destroy(graph);
        backend_destroy(plain);
        tune(NULL);
        /* the model's cases on a backend with one knob set (graph replays included) */
        static const struct {
            const char *knobs, *what;
        } alts[] = {
            /* decode rows past one on cublas instead of the decode kernels */
            {"gemv_max_n=1", "decode rows past 1 on cublas"},
            /* k / v and gate / up as two gemms, prefill chunks included */
            {"pair_n=0", "gemm pairs as two gemms"},
        };
        for (size_t i = 0; i < sizeof(alts) / sizeof(alts[0]); i++) {
            struct backend *alt = backend_tuned(alts[i].knobs);
            if (alt)
                gpu_model_cases_with(cpu, alt, alts[i].what, &n_pass, &n_fail);
            backend_destroy(alt);
        }
        /* host blocks copied (the device's own choice may be zero-copy): a prefill's rows of a
         * host block written into its staging slot and copied back, then read by the decode
         * steps from the pool */
        struct backend *wb = backend_tuned("host_read=copy");
        if (wb) {
            char st[1536] = "";
            backend_stats(wb, st, sizeof(st)); /* counts from here */
            gpu_model_cases_with(cpu, wb, "host blocks copied, prefill rows written back", &n_pass,
                                 &n_fail);
            backend_stats(wb, st, sizeof(st));
            printf("  %s\n", st);
            CHECK("model: the kv write went to staging slots",
                  strstr(st, " 0 with the kv write into staging") == NULL);
            backend_destroy(wb);
        }
        struct backend *tail = backend_tuned("host_read=cpu");
        if (tail)
            gpu_model_cpu_tail_tests(cpu, tail, "cpu_tail", &n_pass, &n_fail);
        backend_destroy(tail);
        /* the split host read: 40 % of each decode row's host blocks on the cpu (the test
         * model's tails are tiny: no gate) */
        struct backend *split = backend_tuned("host_split=40,split_min_us=0");
        if (split) {
            gpu_model_cpu_tail_tests(cpu, split, "split", &n_pass, &n_fail);
            char st[1024] = "";
            backend_stats(split, st, sizeof(st));
            printf("  %s\n", st);
            CHECK("model: the split host read ran", strstr(st, " 0 split") == NULL);
            backend_destroy(split);
        }
        /* ... its cpu part as a host function on a stream of its own */
        split = backend_tuned("host_split=40,split_min_us=0,split_async_us=0");
        if (split) {
            gpu_model_cpu_tail_tests(cpu, split, "split, async", &n_pass, &n_fail);
            char st[2048] = "";
            backend_stats(split, st, sizeof(st));
            printf("  %s\n", st);
            CHECK("model: the async split ran",
                  strstr(st, " 0 split") == NULL && strstr(st, "(0 off the launching") == NULL);
            backend_destroy(split);
        }
    }
    backend_destroy(precise);
    backend_destroy(gpu);
    backend_destroy(cpu);
    printf("gpu-test: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
