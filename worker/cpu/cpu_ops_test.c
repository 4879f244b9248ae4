/* cpu_ops_test.c - every cpu op through the backend against a naive scalar reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/quant.h"
#include "worker/backend.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/cpu/cpu_ops.h"
#include "worker/cpu/cpu_quant.h"
#include "worker/pool.h"
#include "worker/kv.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}

/* the reference f16 decode, written from the IEEE definition */
static double ref_f16(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0)
        return s * ldexp(m, -24);
    if (e == 31)
        return m ? NAN : s * INFINITY;
    return s * ldexp(1024 + m, e - 25);
}

/* atol + rtol*|ref|, printing the first mismatches */
static int check_close(const char *what, const float *got, const double *ref, size_t n, double atol,
                       double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= atol + rtol * fabs(ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s[%zu]: got %.9g want %.9g (diff %.3g)\n", what, i, got[i],
                        ref[i], d);
            bad++;
        }
    }
    return bad;
}

static struct backend *be;

static int setup(void **state)
{
    (void)state;
    return cpu_backend_create(3, &be);
}
static int teardown(void **state)
{
    (void)state;
    backend_destroy(be);
    return 0;
}

static struct be_tensor *tensor_f32(uint32_t rows, uint32_t cols, const float *data)
{
    struct be_tensor *t;
    assert_int_equal(backend_tensor_alloc(be, BE_F32, rows, cols, &t), 0);
    if (data)
        assert_int_equal(backend_tensor_set(be, t, data, 0, sizeof(float) * rows * cols), 0);
    return t;
}
static void get_f32(struct be_tensor *t, float *dst, size_t n)
{
    assert_int_equal(backend_tensor_get(be, t, dst, 0, n * sizeof(float)), 0);
}

static void test_f16_conversions(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double r = ref_f16((uint16_t)h);
        float g = cpu_f16_to_f32((uint16_t)h);
        if (isnan(r)) {
            assert_true(isnan(g));
            continue;
        }
        assert_true((double)g == r);
        /* every finite f16 survives the trip back */
        assert_int_equal(cpu_f32_to_f16(g), h);
    }
    /* round to nearest even between 1 and the next f16 (1 + 2^-10) */
    assert_int_equal(cpu_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(cpu_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(cpu_f32_to_f16(65520.0f), 0x7c00);
    assert_true(cpu_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(cpu_bf16_to_f32(0xc040) == -3.0f);
}

/* a weight matrix (rows, cols) encoded in type t, plus its exact decoded values */
static void *encode(enum be_type t, const float *w, size_t rows, size_t cols, double *dec)
{
    size_t rb = be_type_size(t, cols);
    uint8_t *buf = malloc(rb * rows);
    for (size_t r = 0; r < rows; r++) {
        const float *src = w + r * cols;
        uint8_t *dst = buf + r * rb;
        double *dd = dec + r * cols;
        for (size_t i = 0; i < cols; i++) {
            if (t == BE_F32) {
                memcpy(dst + 4 * i, &src[i], 4);
                dd[i] = src[i];
            } else if (t == BE_F16) {
                uint16_t h = cpu_f32_to_f16(src[i]);
                memcpy(dst + 2 * i, &h, 2);
                dd[i] = ref_f16(h);
            } else if (t == BE_BF16) {
                uint32_t bits;
                memcpy(&bits, &src[i], 4);
                uint16_t h = (uint16_t)(bits >> 16);
                memcpy(dst + 2 * i, &h, 2);
                bits = (uint32_t)h << 16;
                float f;
                memcpy(&f, &bits, 4);
                dd[i] = f;
            }
        }
        if (t == BE_Q8_0) {
            for (size_t b = 0; b < cols / 32; b++) {
                float amax = 0;
                for (int j = 0; j < 32; j++)
                    amax = fmaxf(amax, fabsf(src[b * 32 + j]));
                uint16_t dh = cpu_f32_to_f16(amax / 127.0f);
                double d = ref_f16(dh);
                uint8_t *blk = dst + b * 34;
                memcpy(blk, &dh, 2);
                for (int j = 0; j < 32; j++) {
                    int q = d > 0 ? (int)lround(src[b * 32 + j] / d) : 0;
                    q = q > 127 ? 127 : q < -127 ? -127 : q;
                    blk[2 + j] = (uint8_t)(int8_t)q;
                    dd[b * 32 + j] = d * q;
                }
            }
        }
    }
    return buf;
}

static void run_matmul(enum be_type t, uint32_t n_tok, uint32_t n_in, uint32_t n_out, int bias)
{
    float *w = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * n_tok * n_in);
    float *b = malloc(sizeof(float) * n_out), *y = malloc(sizeof(float) * n_tok * n_out);
    double *wd = malloc(sizeof(double) * n_in * n_out),
           *ref = malloc(sizeof(double) * n_tok * n_out);
    fill(w, (size_t)n_in * n_out, 1.0f);
    fill(x, (size_t)n_tok * n_in, 1.0f);
    fill(b, n_out, 1.0f);
    void *enc = encode(t, w, n_out, n_in, wd);
    struct be_tensor *tw, *tx = tensor_f32(n_tok, n_in, x), *ty = tensor_f32(n_tok, n_out, NULL);
    struct be_tensor *tb = bias ? tensor_f32(1, n_out, b) : NULL;
    assert_int_equal(backend_tensor_alloc(be, t, n_out, n_in, &tw), 0);
    assert_int_equal(backend_tensor_set(be, tw, enc, 0, be_type_size(t, n_in) * n_out), 0);
    assert_int_equal(matmul_forward(be, ty, tx, tw, tb, n_tok), 0);
    get_f32(ty, y, (size_t)n_tok * n_out);
    for (uint32_t i = 0; i < n_tok; i++)
        for (uint32_t o = 0; o < n_out; o++) {
            double s = bias ? b[o] : 0.0;
            for (uint32_t k = 0; k < n_in; k++)
                s += wd[(size_t)o * n_in + k] * x[(size_t)i * n_in + k];
            ref[(size_t)i * n_out + o] = s;
        }
    char what[64];
    snprintf(what, sizeof(what), "matmul %s %ux%ux%u", be_type_name(t), n_tok, n_in, n_out);
    assert_int_equal(check_close(what, y, ref, (size_t)n_tok * n_out, 1e-4, 1e-4), 0);
    backend_tensor_free(be, tw);
    backend_tensor_free(be, tx);
    backend_tensor_free(be, ty);
    backend_tensor_free(be, tb);
    free(w), free(x), free(b), free(y), free(wd), free(ref), free(enc);
}

/* a token's output row is bit-identical whether it ran alone or inside a
 * batch (any position in the 4- and 2-token kernel blocks) */
static void run_matmul_batch_invariant(uint32_t n_in, uint32_t n_out)
{
    const uint32_t T = 7;
    float *w = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * T * n_in);
    float *yb = malloc(sizeof(float) * T * n_out), *y1 = malloc(sizeof(float) * n_out);
    fill(w, (size_t)n_in * n_out, 1.0f);
    fill(x, (size_t)T * n_in, 1.0f);
    struct be_tensor *tw = tensor_f32(n_out, n_in, w), *tx = tensor_f32(T, n_in, x),
                     *ty = tensor_f32(T, n_out, NULL), *t1 = tensor_f32(1, n_in, NULL);
    assert_int_equal(matmul_forward(be, ty, tx, tw, NULL, T), 0);
    get_f32(ty, yb, (size_t)T * n_out);
    for (uint32_t t = 0; t < T; t++) {
        assert_int_equal(backend_tensor_set(be, t1, x + (size_t)t * n_in, 0, sizeof(float) * n_in),
                         0);
        assert_int_equal(matmul_forward(be, ty, t1, tw, NULL, 1), 0);
        get_f32(ty, y1, n_out);
        assert_memory_equal(y1, yb + (size_t)t * n_out, sizeof(float) * n_out);
    }
    backend_tensor_free(be, tw);
    backend_tensor_free(be, tx);
    backend_tensor_free(be, ty);
    backend_tensor_free(be, t1);
    free(w), free(x), free(yb), free(y1);
}

static void test_matmul(void **state)
{
    (void)state;
    enum be_type types[] = {BE_F32, BE_F16, BE_BF16, BE_Q8_0};
    /* the f32 sums of every type (Q8_0 dequantized); test_quant_matmul checks the integer path */
    cpu_q_use_exact(1);
    /* both kernel families: avx-512 (when this cpu has it) and avx2 */
    for (int mode = -1; mode <= 0; mode++) {
        cpu_ops_use_avx512(mode);
        for (size_t i = 0; i < 4; i++) {
            run_matmul(types[i], 1, 64, 37, 0);
            run_matmul(types[i], 3, 96, 5, 1);
            run_matmul(types[i], 70, 160, 64, 1);
            run_matmul(types[i], 2, 2048, 9, 0); /* token tile smaller than the batch */
            run_matmul(types[i], 200, 1024, 3, 0);
            run_matmul(types[i], 9, 4128, 6, 0); /* tile of 31 tokens */
        }
        run_matmul(BE_F32, 5, 77, 6, 1); /* rows not a multiple of 8 or 16 */
        run_matmul_batch_invariant(64, 9);
        run_matmul_batch_invariant(100, 13);
    }
    cpu_ops_use_avx512(-1);
    cpu_q_use_exact(0);
    /* a shape mismatch is refused, not computed */
    struct be_tensor *w = tensor_f32(4, 8, NULL), *x = tensor_f32(2, 7, NULL),
                     *y = tensor_f32(2, 4, NULL);
    assert_int_equal(matmul_forward(be, y, x, w, NULL, 2), RKV_EINVAL);
    backend_tensor_free(be, w);
    backend_tensor_free(be, x);
    backend_tensor_free(be, y);
}

/* matmul2_forward: on a backend without the fused op, exactly the two matmuls (biases, two
 * shapes that are not one: each its own), and a bad shape refused */
static void test_matmul2(void **state)
{
    (void)state;
    const uint32_t T = 5, K = 48, R = 12;
    float x[5 * 48], w[2][12 * 48], b[2][12], y2[2][5 * 12], y1[5 * 12];
    fill(x, T * K, 1.0f);
    fill(w[0], R * K, 1.0f);
    fill(w[1], R * K, 1.0f);
    fill(b[0], R, 1.0f);
    fill(b[1], R, 1.0f);
    struct be_tensor *tx = tensor_f32(T, K, x), *tw[2], *tb[2], *ty[2];
    for (int i = 0; i < 2; i++) {
        tw[i] = tensor_f32(i ? R / 2 : R, K, w[i]);
        tb[i] = tensor_f32(1, i ? R / 2 : R, b[i]);
        ty[i] = tensor_f32(T, i ? R / 2 : R, NULL);
    }
    for (int same = 0; same < 2; same++) {
        if (same) { /* one shape */
            backend_tensor_free(be, tw[1]);
            backend_tensor_free(be, tb[1]);
            backend_tensor_free(be, ty[1]);
            tw[1] = tensor_f32(R, K, w[1]);
            tb[1] = tensor_f32(1, R, b[1]);
            ty[1] = tensor_f32(T, R, NULL);
        }
        assert_int_equal(matmul2_forward(be, ty[0], ty[1], tx, tw[0], tw[1], tb[0], tb[1], T), 0);
        for (int i = 0; i < 2; i++) {
            const size_t n = (size_t)T * (same || i == 0 ? R : R / 2);
            get_f32(ty[i], y2[i], n);
            assert_int_equal(matmul_forward(be, ty[i], tx, tw[i], tb[i], T), 0);
            get_f32(ty[i], y1, n);
            assert_memory_equal(y1, y2[i], n * sizeof(float));
        }
    }
    /* an input of the wrong width: refused, as matmul_forward refuses it */
    struct be_tensor *bad = tensor_f32(T, K - 1, NULL);
    assert_int_equal(matmul2_forward(be, ty[0], ty[1], bad, tw[0], tw[1], NULL, NULL, T),
                     RKV_EINVAL);
    backend_tensor_free(be, bad);
    backend_tensor_free(be, tx);
    for (int i = 0; i < 2; i++) {
        backend_tensor_free(be, tw[i]);
        backend_tensor_free(be, tb[i]);
        backend_tensor_free(be, ty[i]);
    }
}

static void test_embed_rmsnorm_silu_add_rows(void **state)
{
    (void)state;
    const uint32_t V = 11, D = 40, N = 5;
    enum be_type types[] = {BE_F32, BE_F16, BE_BF16, BE_Q8_0};
    float *w = malloc(sizeof(float) * V * 64);
    double *wd = malloc(sizeof(double) * V * 64), ref[5 * 64];
    float got[5 * 64];
    int32_t ids[5] = {3, 0, 10, 3, 7};
    for (size_t ti = 0; ti < 4; ti++) {
        uint32_t d = types[ti] == BE_Q8_0 ? 64 : D;
        fill(w, (size_t)V * d, 2.0f);
        void *enc = encode(types[ti], w, V, d, wd);
        struct be_tensor *tw, *out = tensor_f32(N, d, NULL);
        assert_int_equal(backend_tensor_alloc(be, types[ti], V, d, &tw), 0);
        assert_int_equal(backend_tensor_set(be, tw, enc, 0, be_type_size(types[ti], d) * V), 0);
        assert_int_equal(embed_forward(be, out, tw, ids, N), 0);
        get_f32(out, got, (size_t)N * d);
        for (uint32_t i = 0; i < N; i++)
            for (uint32_t j = 0; j < d; j++)
                ref[i * d + j] = wd[(size_t)ids[i] * d + j];
        assert_int_equal(check_close("embed", got, ref, (size_t)N * d, 0, 0), 0);
        int32_t bad_id = (int32_t)V;
        assert_int_equal(embed_forward(be, out, tw, &bad_id, 1), RKV_ERANGE);
        backend_tensor_free(be, tw);
        backend_tensor_free(be, out);
        free(enc);
    }

    float x[5 * 40], g[5 * 40], nw[40];
    fill(x, N * D, 3.0f);
    fill(g, N * D, 4.0f);
    fill(nw, D, 1.0f);
    struct be_tensor *tx = tensor_f32(N, D, x), *tg = tensor_f32(N, D, g),
                     *tn = tensor_f32(1, D, nw), *ty = tensor_f32(N, D, NULL);
    assert_int_equal(rmsnorm_forward(be, ty, tx, tn, N, 1e-5f), 0);
    get_f32(ty, got, N * D);
    for (uint32_t i = 0; i < N; i++) {
        double ss = 0;
        for (uint32_t j = 0; j < D; j++)
            ss += (double)x[i * D + j] * x[i * D + j];
        double sc = 1.0 / sqrt(ss / D + 1e-5);
        for (uint32_t j = 0; j < D; j++)
            ref[i * D + j] = x[i * D + j] * sc * nw[j];
    }
    assert_int_equal(check_close("rmsnorm", got, ref, N * D, 1e-6, 1e-5), 0);

    assert_int_equal(silu_mul_forward(be, ty, tx, tg, N), 0);
    get_f32(ty, got, N * D);
    for (uint32_t i = 0; i < N * D; i++)
        ref[i] = x[i] / (1.0 + exp(-(double)x[i])) * g[i];
    assert_int_equal(check_close("silu_mul", got, ref, N * D, 1e-6, 1e-5), 0);

    assert_int_equal(add_forward(be, ty, tx, tg, N), 0);
    get_f32(ty, got, N * D);
    for (uint32_t i = 0; i < N * D; i++)
        ref[i] = (double)(x[i] + g[i]);
    assert_int_equal(check_close("add", got, ref, N * D, 0, 0), 0);

    uint32_t rows[3] = {4, 0, 4};
    assert_int_equal(get_rows_forward(be, ty, tx, rows, 3), 0);
    get_f32(ty, got, 3 * D);
    for (uint32_t i = 0; i < 3; i++)
        for (uint32_t j = 0; j < D; j++)
            ref[i * D + j] = x[rows[i] * D + j];
    assert_int_equal(check_close("get_rows", got, ref, 3 * D, 0, 0), 0);

    backend_tensor_free(be, tx);
    backend_tensor_free(be, tg);
    backend_tensor_free(be, tn);
    backend_tensor_free(be, ty);
    free(w);
    free(wd);
}

/* silu(g) * u by rows of any length: against double, with the exp's extremes, and every element
 * the same bits whether it stands in a row's vectors or in its padded last lanes */
static void test_silu_row(void **state)
{
    (void)state;
    enum { N = 19 };
    float g[N], u[N], whole[N], part[N];
    fill(g, N, 6.0f);
    fill(u, N, 2.0f);
    g[3] = -100.0f; /* exp overflows: -0 */
    g[9] = 100.0f;  /* exp underflows: g itself */
    g[17] = 88.0f;
    g[18] = -88.5f;
    cpu_silu_mul_row(whole, g, u, N);
    double ref[N];
    for (int i = 0; i < N; i++)
        ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    assert_int_equal(check_close("silu row", whole, ref, N, 1e-30, 1e-6), 0);
    assert_true(whole[3] == 0.0f && whole[9] == 100.0f * u[9]);
    for (int n = 1; n <= N; n++) {
        memset(part, 0xff, sizeof part);
        cpu_silu_mul_row(part, g, u, (size_t)n);
        assert_memory_equal(part, whole, (size_t)n * sizeof(float));
        for (int i = n; i < N; i++) /* nothing past the row written */
            assert_true(isnan(part[i]));
        /* and from any start: the element's bits, not its lane */
        cpu_silu_mul_row(part, g + N - n, u + N - n, (size_t)n);
        assert_memory_equal(part, whole + N - n, (size_t)n * sizeof(float));
    }
}

/* enough rows that the elementwise ops split across threads */
static void test_rows_parallel(void **state)
{
    (void)state;
    const uint32_t N = 700, D = 256;
    float *x = malloc(sizeof(float) * N * D), *g = malloc(sizeof(float) * N * D);
    float *got = malloc(sizeof(float) * N * D), nw[256];
    double *ref = malloc(sizeof(double) * N * D);
    fill(x, (size_t)N * D, 3.0f);
    fill(g, (size_t)N * D, 3.0f);
    fill(nw, D, 1.0f);
    struct be_tensor *tx = tensor_f32(N, D, x), *tg = tensor_f32(N, D, g),
                     *tn = tensor_f32(1, D, nw), *ty = tensor_f32(N, D, NULL);
    assert_int_equal(rmsnorm_forward(be, ty, tx, tn, N, 1e-6f), 0);
    get_f32(ty, got, (size_t)N * D);
    for (uint32_t i = 0; i < N; i++) {
        double ss = 0;
        for (uint32_t j = 0; j < D; j++)
            ss += (double)x[i * D + j] * x[i * D + j];
        for (uint32_t j = 0; j < D; j++)
            ref[i * D + j] = x[i * D + j] / sqrt(ss / D + 1e-6) * nw[j];
    }
    assert_int_equal(check_close("rmsnorm rows", got, ref, (size_t)N * D, 1e-6, 1e-5), 0);
    assert_int_equal(silu_mul_forward(be, ty, tx, tg, N), 0);
    get_f32(ty, got, (size_t)N * D);
    for (size_t i = 0; i < (size_t)N * D; i++)
        ref[i] = x[i] / (1.0 + exp(-(double)x[i])) * g[i];
    assert_int_equal(check_close("silu_mul rows", got, ref, (size_t)N * D, 1e-6, 1e-5), 0);
    assert_int_equal(add_forward(be, ty, tx, tg, N), 0);
    get_f32(ty, got, (size_t)N * D);
    for (size_t i = 0; i < (size_t)N * D; i++)
        ref[i] = (double)(x[i] + g[i]);
    assert_int_equal(check_close("add rows", got, ref, (size_t)N * D, 0, 0), 0);
    backend_tensor_free(be, tx);
    backend_tensor_free(be, tg);
    backend_tensor_free(be, tn);
    backend_tensor_free(be, ty);
    free(x), free(g), free(got), free(ref);
}

static void test_rope(void **state)
{
    (void)state;
    const uint32_t T = 6, H = 3, HD = 16;
    float x[6 * 48], got[6 * 48];
    double ref[6 * 48];
    int32_t pos[6] = {0, 1, 2, 17, 300, 4095};
    uint32_t seq_of[6] = {0};
    struct kv_block_ref blk = {0, KV_DEVICE};
    struct be_seq seq = {0, T, 0, &blk, 1};
    struct be_batch b = {&seq, 1, T, pos, seq_of};
    /* per-pair divisors and a magnitude (YaRN's) on the second pass of each shape */
    const float ff[8] = {1.0f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 4.0f, 4.0f};
    for (int pass = 0; pass < 4; pass++)
        for (uint32_t n_rot = 8; n_rot <= HD; n_rot += 8) {
            const int neox = pass & 1, yarn = pass >> 1;
            struct be_rope r = {n_rot, 10000.0f,         neox ? 0.25f : 1.0f,
                                neox,  yarn ? ff : NULL, yarn ? 1.1386f : 0.0f};
            fill(x, T * H * HD, 1.0f);
            struct be_tensor *tx = tensor_f32(T, H * HD, x);
            assert_int_equal(rope_forward(be, tx, &b, H, HD, &r), 0);
            get_f32(tx, got, T * H * HD);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t h = 0; h < H; h++) {
                    const float *xi = x + (t * H + h) * HD;
                    double *ro = ref + (t * H + h) * HD;
                    for (uint32_t d = 0; d < HD; d++)
                        ro[d] = xi[d];
                    for (uint32_t i = 0; i < n_rot / 2; i++) {
                        double th = pos[t] * r.freq_scale * pow(10000.0, -2.0 * i / n_rot);
                        double ms = yarn ? r.mscale : 1.0;
                        if (yarn)
                            th /= ff[i];
                        uint32_t a = neox ? i : 2 * i, c = neox ? i + n_rot / 2 : 2 * i + 1;
                        ro[a] = ms * (xi[a] * cos(th) - xi[c] * sin(th));
                        ro[c] = ms * (xi[a] * sin(th) + xi[c] * cos(th));
                    }
                }
            assert_int_equal(check_close("rope", got, ref, T * H * HD, 1e-6, 1e-5), 0);
            backend_tensor_free(be, tx);
        }
}

/* attention fixture: one or two sequences over a local kv pool */
struct attn_fx {
    struct kv_layout l;
    struct kv_local *kv;
    struct be_attn a;
    uint32_t n_tok;
    float *q, *k, *v; /* (n_tok, ...) all positions 0..n_tok-1 of one sequence */
    struct kv_block_ref blocks[512];
    uint32_t n_blocks;
    int32_t pos[6000];
    uint32_t seq_of[6000];
    struct be_seq seq;
    struct be_batch b;
};

static void attn_fx_init(struct attn_fx *f, uint32_t B, uint32_t n_tok, enum kv_dtype dt,
                         uint32_t n_head, uint32_t n_kv, uint32_t hd)
{
    memset(f, 0, sizeof(*f));
    assert_int_equal(kv_layout_init(&f->l, B, 2, n_kv, hd, dt), 0);
    f->n_blocks = kv_blocks_for(&f->l, n_tok);
    assert_true(f->n_blocks <= 512 && n_tok <= 6000);
    assert_int_equal(kv_local_create(&f->kv, &f->l, 512, 512), 0);
    f->a = (struct be_attn){n_head, n_kv, hd, 1.0f / sqrtf((float)hd)};
    f->n_tok = n_tok;
    f->q = malloc(sizeof(float) * n_tok * n_head * hd);
    f->k = malloc(sizeof(float) * n_tok * n_kv * hd);
    f->v = malloc(sizeof(float) * n_tok * n_kv * hd);
    fill(f->q, (size_t)n_tok * n_head * hd, 2.0f);
    fill(f->k, (size_t)n_tok * n_kv * hd, 2.0f);
    fill(f->v, (size_t)n_tok * n_kv * hd, 1.0f);
    /* a shuffled block order: the engine must not assume index order */
    for (uint32_t j = 0; j < f->n_blocks; j++)
        assert_int_equal(kv_local_alloc(f->kv, KV_DEVICE, &f->blocks[j]), 0);
    for (uint32_t j = f->n_blocks; j > 1; j--) {
        uint32_t r = (uint32_t)((frand() + 1.0f) * 0.5f * j) % j;
        struct kv_block_ref t = f->blocks[j - 1];
        f->blocks[j - 1] = f->blocks[r];
        f->blocks[r] = t;
    }
    for (uint32_t t = 0; t < n_tok; t++)
        f->pos[t] = (int32_t)t;
    f->seq = (struct be_seq){0, n_tok, 0, f->blocks, f->n_blocks};
    f->b = (struct be_batch){&f->seq, 1, n_tok, f->pos, f->seq_of};
    assert_int_equal(backend_set_kv(be, &f->l, kv_local_pools(f->kv)), 0);
    struct be_tensor *tk = tensor_f32(n_tok, n_kv * hd, f->k),
                     *tv = tensor_f32(n_tok, n_kv * hd, f->v);
    assert_int_equal(kv_write_forward(be, &f->b, 1, tk, tv), 0);
    backend_tensor_free(be, tk);
    backend_tensor_free(be, tv);
}

static void attn_fx_fini(struct attn_fx *f)
{
    kv_local_destroy(f->kv);
    free(f->q), free(f->k), free(f->v);
}

static void partial_alloc(struct be_partial *p, uint32_t n, const struct be_attn *a)
{
    p->o = tensor_f32(n, a->n_head * a->head_dim, NULL);
    p->m = tensor_f32(n, a->n_head, NULL);
    p->l = tensor_f32(n, a->n_head, NULL);
}
static void partial_free(struct be_partial *p)
{
    backend_tensor_free(be, p->o);
    backend_tensor_free(be, p->m);
    backend_tensor_free(be, p->l);
}

/* naive causal softmax attention over every position, in double; the kv
 * values are the ones the cache holds (f16-rounded when the cache is f16) */
static void ref_attention(const struct attn_fx *f, double *out)
{
    const uint32_t H = f->a.n_head, hd = f->a.head_dim, g = H / f->a.n_kv_head;
    const uint32_t kvd = f->a.n_kv_head * hd;
    double *s = malloc(sizeof(double) * f->n_tok);
    for (uint32_t t = 0; t < f->n_tok; t++)
        for (uint32_t h = 0; h < H; h++) {
            uint32_t kvh = h / g;
            double mx = -INFINITY, sum = 0;
            for (uint32_t p = 0; p <= t; p++) {
                double d = 0;
                for (uint32_t i = 0; i < hd; i++) {
                    float kf = f->k[p * kvd + kvh * hd + i];
                    double kk = f->l.dtype == KV_F16 ? ref_f16(cpu_f32_to_f16(kf)) : kf;
                    d += (double)f->q[(t * H + h) * hd + i] * kk;
                }
                s[p] = d * f->a.scale;
                mx = fmax(mx, s[p]);
            }
            double *o = out + (t * H + h) * hd;
            memset(o, 0, sizeof(double) * hd);
            for (uint32_t p = 0; p <= t; p++) {
                double e = exp(s[p] - mx);
                sum += e;
                for (uint32_t i = 0; i < hd; i++) {
                    float vf = f->v[p * kvd + kvh * hd + i];
                    o[i] += e * (f->l.dtype == KV_F16 ? ref_f16(cpu_f32_to_f16(vf)) : vf);
                }
            }
            for (uint32_t i = 0; i < hd; i++)
                o[i] /= sum;
        }
    free(s);
}

/* naive attention of one query row q (n_head*hd) at position pos, over the positions
 * > pos - window (window 0: all) */
static void ref_attention_one(const struct attn_fx *f, const float *q, uint32_t pos, double *out)
{
    const uint32_t H = f->a.n_head, hd = f->a.head_dim, g = H / f->a.n_kv_head;
    const uint32_t kvd = f->a.n_kv_head * hd, w = f->a.window;
    const uint32_t lo = w && pos + 1 > w ? pos + 1 - w : 0;
    double *s = malloc(sizeof(double) * (pos + 1));
    for (uint32_t h = 0; h < H; h++) {
        uint32_t kvh = h / g;
        double mx = -INFINITY, sum = 0;
        for (uint32_t p = lo; p <= pos; p++) {
            double d = 0;
            for (uint32_t i = 0; i < hd; i++)
                d += (double)q[h * hd + i] * f->k[(size_t)p * kvd + kvh * hd + i];
            s[p] = d * f->a.scale;
            mx = fmax(mx, s[p]);
        }
        double *o = out + h * hd;
        memset(o, 0, sizeof(double) * hd);
        for (uint32_t p = lo; p <= pos; p++) {
            double e = exp(s[p] - mx);
            sum += e;
            for (uint32_t i = 0; i < hd; i++)
                o[i] += e * f->v[(size_t)p * kvd + kvh * hd + i];
        }
        for (uint32_t i = 0; i < hd; i++)
            o[i] /= sum;
    }
    free(s);
}

/* attention of single-token sequences at positions qpos over f's table (its query rows), the
 * device and host partials merged: got (n_q, n_head*hd) */
static void attn_at_positions(struct attn_fx *f, const uint32_t *qpos, uint32_t n_q, float *q,
                              float *got)
{
    const uint32_t H = f->a.n_head, hd = f->a.head_dim;
    struct be_seq seqs[8];
    int32_t pos[8];
    uint32_t seq_of[8];
    assert_true(n_q <= 8);
    for (uint32_t i = 0; i < n_q; i++) {
        seqs[i] = (struct be_seq){i, 1, qpos[i], f->blocks, f->n_blocks};
        pos[i] = (int32_t)qpos[i];
        seq_of[i] = i;
        memcpy(q + i * H * hd, f->q + (size_t)qpos[i] * H * hd, sizeof(float) * H * hd);
    }
    struct be_batch b = {seqs, n_q, n_q, pos, seq_of};
    struct be_partial dev, host;
    partial_alloc(&dev, n_q, &f->a);
    partial_alloc(&host, n_q, &f->a);
    struct be_tensor *tq = tensor_f32(n_q, H * hd, q);
    assert_int_equal(attn_partial_forward(be, &b, 1, KV_DEVICE, tq, &f->a, &dev), 0);
    assert_int_equal(attn_partial_forward(be, &b, 1, KV_HOST, tq, &f->a, &host), 0);
    assert_int_equal(attn_merge_forward(be, &dev, &host, n_q, &f->a), 0);
    get_f32(dev.o, got, n_q * H * hd);
    backend_tensor_free(be, tq);
    partial_free(&dev);
    partial_free(&host);
}

/* every block of f moved to the host with probability one half */
static void attn_fx_split(struct attn_fx *f)
{
    for (uint32_t j = 0; j < f->n_blocks; j++)
        if (frand() > 0.0f)
            assert_int_equal(kv_local_migrate(f->kv, &f->blocks[j], KV_HOST), 0);
}

/* single-token queries at positions qpos over n_pos positions in blocks of B (half of them on
 * the host with split), through a window (0: none), against the naive attention; a window
 * must change the first query's result */
static void check_attention_at(uint32_t B, uint32_t n_pos, const uint32_t *qpos, uint32_t n_q,
                               uint32_t window, int split)
{
    const uint32_t H = 4, KVH = 2, hd = 16;
    struct attn_fx f;
    attn_fx_init(&f, B, n_pos, KV_F32, H, KVH, hd);
    f.a.window = window;
    if (split)
        attn_fx_split(&f);
    float *q = malloc(sizeof(float) * n_q * H * hd);
    float got[8 * 64];
    double ref[8 * 64];
    attn_at_positions(&f, qpos, n_q, q, got);
    for (uint32_t i = 0; i < n_q; i++)
        ref_attention_one(&f, q + i * H * hd, qpos[i], ref + i * H * hd);
    assert_int_equal(check_close("attention", got, ref, n_q * H * hd, 1e-5, 1e-4), 0);
    if (window) {
        f.a.window = 0;
        ref_attention_one(&f, q, qpos[0], ref);
        double far = 0;
        for (uint32_t i = 0; i < H * hd; i++)
            far = fmax(far, fabs(got[i] - ref[i]));
        assert_true(far > 1e-2);
    }
    free(q);
    attn_fx_fini(&f);
}

/* contexts longer than one attention segment (2048 positions): segments
 * attended separately and merged, also with part of the blocks on the host */
static void test_attention_long(void **state)
{
    (void)state;
    const uint32_t qpos[5] = {4999, 2047, 2048, 3001, 100};
    for (uint32_t B = 16; B <= 256; B *= 16)
        for (int split = 0; split < 2; split++)
            check_attention_at(B, 5000, qpos, 5, 0, split);
}

/* a sliding window (gemma3's local layers): a query reads only the last `window` positions,
 * whatever the block size, the cut within a block, and where its blocks live */
static void test_attention_window(void **state)
{
    (void)state;
    const uint32_t qpos[7] = {2599, 2100, 2048, 99, 100, 101, 0};
    const uint32_t wins[3] = {100, 37, 1};
    for (uint32_t B = 16; B <= 256; B *= 16)
        for (int wi = 0; wi < 3; wi++)
            for (int split = 0; split < 2; split++)
                check_attention_at(B, 2600, qpos, 7, wins[wi], split);
}

/* qwen3/gemma3's ops: each head's rmsnorm in place, GeGLU (tanh gelu), scale */
static void test_head_norm_gelu_scale(void **state)
{
    (void)state;
    const uint32_t N = 5, NH = 3, HD = 24, C = NH * HD;
    float x[5 * 72], u[5 * 72], w[24], got[5 * 72];
    double ref[5 * 72];
    fill(x, N * C, 3.0f);
    fill(u, N * C, 2.0f);
    fill(w, HD, 1.5f);
    struct be_tensor *tx = tensor_f32(N, C, x), *tw = tensor_f32(1, HD, w),
                     *tu = tensor_f32(N, C, u), *ty = tensor_f32(N, C, NULL);
    assert_int_equal(rmsnorm_heads_forward(be, tx, tw, N, NH, 1e-6f), 0);
    get_f32(tx, got, N * C);
    for (uint32_t r = 0; r < N * NH; r++) {
        double ss = 0;
        for (uint32_t j = 0; j < HD; j++)
            ss += (double)x[r * HD + j] * x[r * HD + j];
        double sc = 1.0 / sqrt(ss / HD + 1e-6);
        for (uint32_t j = 0; j < HD; j++)
            ref[r * HD + j] = x[r * HD + j] * sc * w[j];
    }
    assert_int_equal(check_close("rmsnorm_heads", got, ref, N * C, 1e-6, 1e-5), 0);
    /* a norm weight that is not one head wide is refused */
    assert_int_equal(rmsnorm_heads_forward(be, tx, tw, N, NH + 1, 1e-6f), RKV_EINVAL);

    struct be_tensor *tg = tensor_f32(N, C, x);
    assert_int_equal(gelu_mul_forward(be, ty, tg, tu, N), 0);
    get_f32(ty, got, N * C);
    for (uint32_t i = 0; i < N * C; i++) {
        double g = x[i];
        ref[i] = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u[i];
    }
    assert_int_equal(check_close("gelu_mul", got, ref, N * C, 1e-6, 1e-5), 0);

    assert_int_equal(scale_forward(be, tg, 25.5f, N - 1), 0);
    get_f32(tg, got, N * C);
    for (uint32_t i = 0; i < N * C; i++)
        ref[i] = i < (N - 1) * C ? (double)x[i] * 25.5f : x[i]; /* the last row untouched */
    assert_int_equal(check_close("scale", got, ref, N * C, 0, 1e-7), 0);
    backend_tensor_free(be, tx);
    backend_tensor_free(be, tw);
    backend_tensor_free(be, tu);
    backend_tensor_free(be, ty);
    backend_tensor_free(be, tg);
}

static void run_attention(uint32_t B, uint32_t n_tok, enum kv_dtype dt, uint32_t H, uint32_t KVH,
                          uint32_t hd)
{
    struct attn_fx f;
    attn_fx_init(&f, B, n_tok, dt, H, KVH, hd);
    struct be_partial p;
    partial_alloc(&p, n_tok, &f.a);
    struct be_tensor *tq = tensor_f32(n_tok, H * hd, f.q);
    assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_DEVICE, tq, &f.a, &p), 0);
    size_t n = (size_t)n_tok * H * hd;
    float *got = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    get_f32(p.o, got, n);
    ref_attention(&f, ref);
    assert_int_equal(check_close("attention", got, ref, n, 1e-5, 1e-4), 0);
    /* nothing is host-tagged: the host partial is the empty set */
    assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_HOST, tq, &f.a, &p), 0);
    float m[16], l[16];
    assert_true(H <= 16);
    get_f32(p.m, m, H);
    get_f32(p.l, l, H);
    for (uint32_t h = 0; h < H; h++) {
        assert_true(isinf(m[h]) && m[h] < 0);
        assert_true(l[h] == 0.0f);
    }
    free(got), free(ref);
    backend_tensor_free(be, tq);
    partial_free(&p);
    attn_fx_fini(&f);
}

static void test_attention(void **state)
{
    (void)state;
    run_attention(4, 19, KV_F32, 4, 2, 8);
    run_attention(1, 7, KV_F32, 2, 2, 16);
    run_attention(16, 130, KV_F32, 8, 2, 32);
    run_attention(256, 300, KV_F32, 4, 1, 16); /* chunks of 64 inside a block */
    run_attention(3, 40, KV_F16, 6, 3, 8);
    run_attention(64, 130, KV_F16, 8, 2, 128); /* llama3-8b's group of 4 and head_dim */
    run_attention(16, 70, KV_F32, 6, 2, 40);   /* a group of 3; 32 + 8 columns */
    run_attention(32, 90, KV_F16, 10, 2, 56);  /* a group of 5: 4 and 1; 32 + 16 + 8 */
}

/* f16 keys and values are converted as the sums load them (no f32 copy of the chunk): the
 * outputs are the same bits as the same values held as f32 (whose heads go in pairs, never four
 * at a time). Heads four at a time, in pairs and alone; chunks that end inside a group of four
 * keys; head_dim 8 to 128 with and without a scalar tail */
static void test_attention_f16_bits(void **state)
{
    (void)state;
    static const uint32_t shapes[][5] = {
        /* B, n_tok, H, KVH, hd */
        {256, 150, 8, 2, 128}, /* g 4: four heads a pass; queries at 1..150 keys */
        {64, 90, 16, 2, 48},   /* g 8: two passes of four; hd 48: 32 by vectors, 16 scalar */
        {32, 50, 12, 2, 32},   /* g 6: four heads, then a pair */
        {16, 45, 8, 2, 20},    /* g 4, hd 20: the dot's scalar tail, no column by vectors */
        {16, 77, 4, 2, 8},     /* g 2, head_dim below one 32-wide slice */
        {64, 70, 6, 2, 40},    /* g 3: a pair and one head; hd not a multiple of 32 */
        {16, 60, 14, 2, 64},   /* g 7: four, a pair and one head */
        {8, 33, 3, 3, 16},     /* g 1: one head a kv head */
        {32, 131, 2, 1, 72},   /* g 2, hd 72: a 32-wide slice and a scalar tail */
    };
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const uint32_t B = shapes[si][0], n_tok = shapes[si][1], H = shapes[si][2],
                       KVH = shapes[si][3], hd = shapes[si][4];
        const size_t nq = (size_t)n_tok * H * hd, nkv = (size_t)n_tok * KVH * hd;
        float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nkv),
              *v = malloc(sizeof(float) * nkv);
        float *o[2], *m[2], *l[2];
        for (int pass = 0; pass < 2; pass++) { /* 0: f16 kv, 1: its values as f32 */
            struct attn_fx f;
            attn_fx_init(&f, B, n_tok, pass ? KV_F32 : KV_F16, H, KVH, hd);
            if (pass == 0) {
                memcpy(q, f.q, sizeof(float) * nq);
                for (size_t i = 0; i < nkv; i++) {
                    k[i] = cpu_f16_to_f32(cpu_f32_to_f16(f.k[i]));
                    v[i] = cpu_f16_to_f32(cpu_f32_to_f16(f.v[i]));
                }
            } else {
                struct be_tensor *tk = tensor_f32(n_tok, KVH * hd, k),
                                 *tv = tensor_f32(n_tok, KVH * hd, v);
                assert_int_equal(kv_write_forward(be, &f.b, 1, tk, tv), 0);
                backend_tensor_free(be, tk);
                backend_tensor_free(be, tv);
            }
            struct be_partial p;
            partial_alloc(&p, n_tok, &f.a);
            struct be_tensor *tq = tensor_f32(n_tok, H * hd, q);
            assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_DEVICE, tq, &f.a, &p), 0);
            o[pass] = malloc(sizeof(float) * nq);
            m[pass] = malloc(sizeof(float) * n_tok * H);
            l[pass] = malloc(sizeof(float) * n_tok * H);
            get_f32(p.o, o[pass], nq);
            get_f32(p.m, m[pass], (size_t)n_tok * H);
            get_f32(p.l, l[pass], (size_t)n_tok * H);
            backend_tensor_free(be, tq);
            partial_free(&p);
            attn_fx_fini(&f);
        }
        for (size_t i = 0; i < nq; i++)
            if (memcmp(&o[0][i], &o[1][i], sizeof(float)) != 0)
                fail_msg("shape %zu: o[%zu] f16 %.9g against f32 %.9g", si, i, o[0][i], o[1][i]);
        assert_memory_equal(m[0], m[1], sizeof(float) * n_tok * H);
        assert_memory_equal(l[0], l[1], sizeof(float) * n_tok * H);
        for (int pass = 0; pass < 2; pass++)
            free(o[pass]), free(m[pass]), free(l[pass]);
        free(q), free(k), free(v);
    }
}

/* x (n rows of hd) replaced by what a kv cache of dtype t holds for it */
static void kv_round_rows(enum kv_dtype t, float *x, size_t n, uint32_t hd)
{
    struct kv_layout row;
    assert_int_equal(kv_layout_init(&row, 1, 1, 1, hd, t), 0);
    char *slice = malloc(kv_slice_bytes(&row));
    for (size_t r = 0; r < n; r++) {
        kv_row_store(&row, slice, 0, 0, x + r * hd);
        kv_row_load(&row, slice, 0, 0, x + r * hd);
    }
    free(slice);
}

/* cpu_kv_load_rows (eight levels a step) gives kv_row_load's bits for every row of a slice:
 * q8 rows of one short group (8), one whole (32), several with a short last one (72), fp8 rows
 * over the whole e4m3 range and a zero row */
static void test_kv_load_rows(void **state)
{
    (void)state;
    const uint32_t hds[] = {8, 32, 72, 128};
    for (int dt = KV_Q8; dt <= KV_FP8; dt++)
        for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
            const uint32_t hd = hds[hi], B = 5, KVH = 3;
            struct kv_layout l;
            assert_int_equal(kv_layout_init(&l, B, 1, KVH, hd, (enum kv_dtype)dt), 0);
            char *slice = calloc(1, kv_slice_bytes(&l));
            float *row = malloc(sizeof(float) * hd), *want = malloc(sizeof(float) * hd * B),
                  *got = malloc(sizeof(float) * hd * B);
            for (uint32_t h = 0; h < KVH; h++)
                for (uint32_t p = 0; p < B; p++) {
                    for (uint32_t i = 0; i < hd; i++) /* magnitudes 2^-12 .. 2^10 */
                        row[i] = frand() * ldexpf(1.0f, (int)((i * 7 + p) % 23) - 12);
                    if (h == 1 && p == 2)
                        memset(row, 0, sizeof(float) * hd);
                    kv_row_store(&l, slice, h, p, row);
                }
            for (uint32_t h = 0; h < KVH; h++) {
                for (uint32_t p = 0; p < B; p++)
                    kv_row_load(&l, slice, h, p, want + (size_t)p * hd);
                cpu_kv_load_rows(&l, slice, h, 0, B, got);
                assert_memory_equal(got, want, sizeof(float) * hd * B);
                cpu_kv_load_rows(&l, slice, h, 3, 2, got); /* from inside the head */
                assert_memory_equal(got, want + 3 * hd, sizeof(float) * hd * 2);
            }
            free(slice), free(row), free(want), free(got);
        }
}

/* 8-bit keys and values are dequantized a chunk at a time into f32 rows: the outputs are the
 * same bits as those values held as f32 kv, on the device and host blocks of a split table; and
 * they stay near the attention over the unrounded f32 values (nmse bound per dtype) */
static void test_attention_8bit(void **state)
{
    (void)state;
    static const uint32_t shapes[][5] = {
        /* B, n_tok, H, KVH, hd */
        {256, 150, 8, 2, 128}, /* llama3-8b's head: four groups of 32 */
        {16, 77, 4, 2, 8},     /* one short group */
        {64, 70, 6, 2, 40},    /* a group of 32 and one of 8 */
        {32, 131, 2, 1, 72},   /* two groups of 32 and one of 8 */
    };
    const enum kv_dtype dts[] = {KV_Q8, KV_FP8};
    const double bound[] = {1e-4, 2e-3}; /* nmse against the unrounded values */
    for (size_t di = 0; di < 2; di++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            const uint32_t B = shapes[si][0], n_tok = shapes[si][1], H = shapes[si][2],
                           KVH = shapes[si][3], hd = shapes[si][4];
            const size_t nq = (size_t)n_tok * H * hd, nkv = (size_t)n_tok * KVH * hd;
            float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nkv),
                  *v = malloc(sizeof(float) * nkv), *k0 = malloc(sizeof(float) * nkv),
                  *v0 = malloc(sizeof(float) * nkv);
            float *o[3];
            for (int pass = 0; pass < 3; pass++) { /* 8-bit kv; its values as f32; exact f32 */
                struct attn_fx f;
                attn_fx_init(&f, B, n_tok, pass ? KV_F32 : dts[di], H, KVH, hd);
                if (pass == 0) {
                    memcpy(q, f.q, sizeof(float) * nq);
                    memcpy(k, f.k, sizeof(float) * nkv);
                    memcpy(v, f.v, sizeof(float) * nkv);
                    memcpy(k0, f.k, sizeof(float) * nkv);
                    memcpy(v0, f.v, sizeof(float) * nkv);
                    kv_round_rows(dts[di], k, nkv / hd, hd);
                    kv_round_rows(dts[di], v, nkv / hd, hd);
                    /* a split table: every other block on the host */
                    for (uint32_t j = 0; j < f.n_blocks; j += 2)
                        assert_int_equal(kv_local_migrate(f.kv, &f.blocks[j], KV_HOST), 0);
                } else {
                    struct be_tensor *tk = tensor_f32(n_tok, KVH * hd, pass == 1 ? k : k0),
                                     *tv = tensor_f32(n_tok, KVH * hd, pass == 1 ? v : v0);
                    assert_int_equal(kv_write_forward(be, &f.b, 1, tk, tv), 0);
                    backend_tensor_free(be, tk);
                    backend_tensor_free(be, tv);
                    for (uint32_t j = 0; j < f.n_blocks; j += 2)
                        assert_int_equal(kv_local_migrate(f.kv, &f.blocks[j], KV_HOST), 0);
                }
                struct be_partial dev, host;
                partial_alloc(&dev, n_tok, &f.a);
                partial_alloc(&host, n_tok, &f.a);
                struct be_tensor *tq = tensor_f32(n_tok, H * hd, q);
                assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_DEVICE, tq, &f.a, &dev), 0);
                assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_HOST, tq, &f.a, &host), 0);
                assert_int_equal(attn_merge_forward(be, &dev, &host, n_tok, &f.a), 0);
                o[pass] = malloc(sizeof(float) * nq);
                get_f32(dev.o, o[pass], nq);
                backend_tensor_free(be, tq);
                partial_free(&dev);
                partial_free(&host);
                attn_fx_fini(&f);
            }
            for (size_t i = 0; i < nq; i++)
                if (memcmp(&o[0][i], &o[1][i], sizeof(float)) != 0)
                    fail_msg("%s shape %zu: o[%zu] %.9g against f32 %.9g", kv_dtype_name(dts[di]),
                             si, i, o[0][i], o[1][i]);
            double err = 0, ref = 0;
            for (size_t i = 0; i < nq; i++) {
                err += ((double)o[0][i] - o[2][i]) * ((double)o[0][i] - o[2][i]);
                ref += (double)o[2][i] * o[2][i];
            }
            if (err / ref > bound[di])
                fail_msg("%s shape %zu: nmse %.3g against f32 kv, bound %.3g",
                         kv_dtype_name(dts[di]), si, err / ref, bound[di]);
            print_message("%s shape %zu: nmse %.3g\n", kv_dtype_name(dts[di]), si, err / ref);
            for (int pass = 0; pass < 3; pass++)
                free(o[pass]);
            free(q), free(k), free(v), free(k0), free(v0);
        }
}

/* random device/host splits merged by lse equal the one-pass softmax */
static void test_lse_merge_splits(void **state)
{
    (void)state;
    const uint32_t n_tok = 90, H = 4, KVH = 2, hd = 16;
    uint32_t Bs[] = {1, 3, 16};
    for (size_t bi = 0; bi < 3; bi++)
        for (int trial = 0; trial < 6; trial++) {
            struct attn_fx f;
            attn_fx_init(&f, Bs[bi], n_tok, KV_F32, H, KVH, hd);
            struct be_partial one, dev, host;
            partial_alloc(&one, n_tok, &f.a);
            partial_alloc(&dev, n_tok, &f.a);
            partial_alloc(&host, n_tok, &f.a);
            struct be_tensor *tq = tensor_f32(n_tok, H * hd, f.q);
            assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_DEVICE, tq, &f.a, &one), 0);
            for (uint32_t j = 0; j < f.n_blocks; j++) {
                int to_host = trial == 0   ? 1                     /* all host */
                              : trial == 1 ? (j % 2)               /* alternating */
                              : trial == 2 ? (j == f.n_blocks / 2) /* one block */
                                           : frand() > 0.0f;       /* random */
                if (to_host)
                    assert_int_equal(kv_local_migrate(f.kv, &f.blocks[j], KV_HOST), 0);
            }
            assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_DEVICE, tq, &f.a, &dev), 0);
            assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_HOST, tq, &f.a, &host), 0);
            /* merge order must not matter either */
            struct be_partial *a = trial % 2 ? &host : &dev, *b = trial % 2 ? &dev : &host;
            assert_int_equal(attn_merge_forward(be, a, b, n_tok, &f.a), 0);
            size_t n = (size_t)n_tok * H * hd;
            float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
            double *ref = malloc(sizeof(double) * n);
            get_f32(a->o, got, n);
            get_f32(one.o, want, n);
            for (size_t i = 0; i < n; i++)
                ref[i] = want[i];
            assert_int_equal(check_close("lse merge", got, ref, n, 1e-6, 1e-5), 0);
            float m1[90 * 4], m2[90 * 4], l1[90 * 4], l2[90 * 4];
            get_f32(one.m, m1, n_tok * H);
            get_f32(a->m, m2, n_tok * H);
            get_f32(one.l, l1, n_tok * H);
            get_f32(a->l, l2, n_tok * H);
            for (uint32_t i = 0; i < n_tok * H; i++) {
                assert_true(m1[i] == m2[i]);
                assert_true(fabsf(l1[i] - l2[i]) <= 1e-5f * l1[i]);
            }
            free(got), free(want), free(ref);
            backend_tensor_free(be, tq);
            partial_free(&one);
            partial_free(&dev);
            partial_free(&host);
            attn_fx_fini(&f);
        }
}

static void test_kv_write_layout(void **state)
{
    (void)state;
    /* f16 cache: K of position p, head h lands at [h][p % B][:] of block p / B */
    struct attn_fx f;
    attn_fx_init(&f, 3, 10, KV_F16, 2, 2, 8);
    for (uint32_t p = 0; p < 10; p++)
        for (uint32_t h = 0; h < 2; h++) {
            const uint16_t *K = kv_slice_ptr(&f.l, kv_local_pools(f.kv), f.blocks[p / 3], 1, 0);
            const uint16_t *V = kv_slice_ptr(&f.l, kv_local_pools(f.kv), f.blocks[p / 3], 1, 1);
            for (uint32_t i = 0; i < 8; i++) {
                size_t at = ((size_t)h * 3 + p % 3) * 8 + i;
                assert_int_equal(K[at], cpu_f32_to_f16(f.k[(p * 2 + h) * 8 + i]));
                assert_int_equal(V[at], cpu_f32_to_f16(f.v[(p * 2 + h) * 8 + i]));
            }
        }
    /* layer 0 was never written */
    const uint16_t *K0 = kv_slice_ptr(&f.l, kv_local_pools(f.kv), f.blocks[0], 0, 0);
    assert_int_equal(K0[0], 0);
    attn_fx_fini(&f);

    /* q8 cache: row [h][p % B] of 40 levels and two bf16 scales */
    attn_fx_init(&f, 3, 10, KV_Q8, 2, 2, 40);
    for (uint32_t p = 0; p < 10; p++)
        for (uint32_t h = 0; h < 2; h++) {
            const char *K = kv_slice_ptr(&f.l, kv_local_pools(f.kv), f.blocks[p / 3], 1, 0);
            int8_t lv[40];
            uint16_t d[2];
            kv_q8_quantize(f.k + (p * 2 + h) * 40, 40, lv, d);
            assert_memory_equal(K + ((size_t)h * 3 + p % 3) * 44, lv, 40);
            assert_memory_equal(K + ((size_t)h * 3 + p % 3) * 44 + 40, d, 4);
        }
    attn_fx_fini(&f);
}

struct sum_arg {
    uint64_t *hits;
};
static void count_chunk(void *v, uint32_t b, uint32_t e, uint32_t thread)
{
    struct sum_arg *a = v;
    (void)thread;
    for (uint32_t i = b; i < e; i++)
        a->hits[i]++;
}

static void test_pool(void **state)
{
    (void)state;
    struct pool *p;
    assert_int_equal(pool_create(&p, 4), 0);
    assert_int_equal(pool_n_threads(p), 4);
    uint64_t *hits = calloc(10007, sizeof(uint64_t));
    struct sum_arg a = {hits};
    for (int r = 0; r < 200; r++)
        pool_run(p, count_chunk, &a, 10007, 1 + r % 7);
    for (uint32_t i = 0; i < 10007; i++)
        assert_int_equal(hits[i], 200);
    free(hits);
    pool_destroy(p);
}

/* --- block-quantized weights (cpu_quant.h) ----------------------------------------------- */

static const enum be_type qtypes[] = {BE_Q4_0, BE_Q4_1, BE_Q5_0, BE_Q5_1, BE_Q8_0, BE_IQ4_NL,
                                      BE_Q2_K, BE_Q3_K, BE_Q4_K, BE_Q5_K, BE_Q6_K, BE_IQ4_XS};
#define N_QTYPES (sizeof(qtypes) / sizeof(qtypes[0]))

static const enum cpu_isa isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512};
static const char *const isa_names[] = {"scalar", "avx2", "avx-512"};

static uint8_t rbyte(void)
{
    frand();
    return (uint8_t)(rng_state >> 29);
}

/* nb random blocks of t: random bytes (every level, sub-block scale, min and sign pattern) under
 * finite f16 scales of either sign up to `scale`, a sixteenth of them zero */
static void rand_blocks(enum be_type t, uint8_t *buf, size_t nb, float scale)
{
    const size_t bytes = be_type_size(t, be_type_block(t));
    int at[2] = {0, -1}; /* where the format keeps its f16 scales */
    switch (t) {
    case BE_Q4_1:
    case BE_Q5_1:
    case BE_Q4_K:
    case BE_Q5_K: at[1] = 2; break;
    case BE_Q2_K: at[0] = 80, at[1] = 82; break;
    case BE_Q3_K: at[0] = 108; break;
    case BE_Q6_K: at[0] = 208; break;
    default: break;
    }
    for (size_t i = 0; i < nb * bytes; i++)
        buf[i] = rbyte();
    for (size_t b = 0; b < nb; b++)
        for (int k = 0; k < 2; k++)
            if (at[k] >= 0) {
                const uint16_t h = cpu_f32_to_f16(rbyte() % 16 ? frand() * scale : 0.0f);
                memcpy(buf + b * bytes + at[k], &h, 2);
            }
}

/* SIMD dequantization gives common/quant.c's bits, for every type and isa, on rows of one block,
 * a few and many */
static void test_quant_dequant(void **state)
{
    (void)state;
    static const size_t counts[] = {1, 3, 37};
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const enum be_type t = qtypes[ti];
        for (size_t ci = 0; ci < 3; ci++) {
            const size_t n = counts[ci] * be_type_block(t);
            uint8_t *w = malloc(be_type_size(t, n));
            float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
            rand_blocks(t, w, counts[ci], 1.0f);
            assert_int_equal(quant_dequantize_row((uint32_t)t, w, ref, n), 0);
            for (int ii = 0; ii < 4; ii++) { /* each isa, then the backend's own pick */
                if (ii < 3 && !cpu_q_isa_ok(isas[ii]))
                    continue;
                memset(got, 0xff, sizeof(float) * n);
                if (ii < 3)
                    cpu_q_dequant(t, w, got, n, isas[ii]);
                else
                    cpu_dequant_row(t, w, got, n);
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&got[i], &ref[i], sizeof(float)))
                        fail_msg("%s %s, %zu blocks: value %zu is %.9g, common/quant.c's %.9g",
                                 be_type_name(t), ii < 3 ? isa_names[ii] : "cpu_dequant_row",
                                 counts[ci], i, got[i], ref[i]);
            }
            free(w), free(ref), free(got);
        }
    }
}

/* an activation row quantized for t: the bytes cpu_qx_quantize writes (q, scales, sums) */
static size_t qx_used(enum be_type t, uint32_t n)
{
    const uint32_t blk = be_type_block(t) == 256 ? 256 : 32;
    return n + 4 * (n / blk) + 2 * (n / 16);
}

/* the activation rounding: d = amax / 127 and q = round(x / d) within half a step, sums of 16,
 * the same bytes from the scalar and avx2 forms; special blocks (all zero, one value, NaN and
 * infinity) give the same bytes too */
static void test_quant_activation(void **state)
{
    (void)state;
    const enum be_type ts[] = {BE_Q4_0, BE_Q4_K}; /* blocks of 32 and of 256 */
    const uint32_t n = 1024;
    float *x = malloc(sizeof(float) * n);
    for (int k = 0; k < 2; k++) {
        const enum be_type t = ts[k];
        const uint32_t blk = be_type_block(t) == 256 ? 256 : 32;
        fill(x, n, 3.0f);
        memset(x, 0, sizeof(float) * blk);               /* block 0: all zero */
        x[blk + 5] = 1e3f;                               /* block 1: one large value */
        x[2 * blk + 1] = NAN, x[2 * blk + 2] = INFINITY; /* block 2: NaN and inf */
        const size_t rb = cpu_qx_row_bytes(t, n);
        uint8_t *a = aligned_alloc(64, rb), *b = aligned_alloc(64, rb);
        cpu_qx_quantize(t, x, n, a, CPU_ISA_SCALAR);
        if (cpu_q_isa_ok(CPU_ISA_AVX2)) {
            cpu_qx_quantize(t, x, n, b, CPU_ISA_AVX2);
            assert_memory_equal(a, b, qx_used(t, n));
        }
        const int8_t *q = (const int8_t *)a;
        const float *d = (const float *)(a + n);
        const int16_t *sums = (const int16_t *)(a + n + 4 * (n / blk));
        for (uint32_t bl = 0; bl < n / blk; bl++) {
            if (bl == 2)
                continue;
            float amax = 0.0f;
            for (uint32_t i = 0; i < blk; i++)
                amax = fmaxf(amax, fabsf(x[bl * blk + i]));
            assert_true(d[bl] == amax / 127.0f);
            for (uint32_t i = 0; i < blk; i++) {
                const float v = x[bl * blk + i];
                assert_true(fabs((double)v - (double)d[bl] * q[bl * blk + i]) <=
                            d[bl] * 0.5 * (1 + 1e-5) + 1e-30);
            }
        }
        for (uint32_t g = 0; g < n / 16; g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++)
                sum += q[g * 16 + i];
            assert_int_equal(sums[g], sum);
        }
        free(a), free(b);
    }
    free(x);
}

/* the contract of one dot: every isa the scalar kernel's bits; those equal the exact sum of the
 * dequantized weights times the rounded activations to f32 rounding, and the exact sum with the
 * f32 activations to within half an activation step a value */
static void check_qdot(enum be_type t, const uint8_t *w, const float *x, const uint8_t *xq,
                       uint32_t n, const char *what)
{
    const uint32_t blk = be_type_block(t) == 256 ? 256 : 32;
    float *wd = malloc(sizeof(float) * n);
    quant_dequantize_row((uint32_t)t, w, wd, n);
    const int8_t *q = (const int8_t *)xq;
    const float *d = (const float *)(xq + n);
    double exact = 0, rounded = 0, mag = 0, step = 0;
    for (uint32_t i = 0; i < n; i++) {
        const double xr = (double)d[i / blk] * q[i];
        exact += (double)wd[i] * x[i];
        rounded += (double)wd[i] * xr;
        mag += fabs((double)wd[i] * xr);
        step += fabs((double)wd[i]) * d[i / blk] * 0.5;
    }
    const float s = cpu_q_dot(t, w, xq, n, CPU_ISA_SCALAR);
    for (int ii = 1; ii < 3; ii++)
        if (cpu_q_isa_ok(isas[ii])) {
            const float v = cpu_q_dot(t, w, xq, n, isas[ii]);
            if (memcmp(&v, &s, sizeof(float)))
                fail_msg("%s: %s gives %.9g, scalar %.9g", what, isa_names[ii], v, s);
        }
    if (!(fabs(s - rounded) <= 1e-5 * mag + 1e-6))
        fail_msg("%s: %.9g, the rounded activations' exact sum %.9g", what, s, rounded);
    if (!(fabs(s - exact) <= step * (1 + 1e-5) + 1e-5 * mag + 1e-6))
        fail_msg("%s: %.9g is %.3g from the f32 sum %.9g (bound %.3g)", what, s, fabs(s - exact),
                 exact, step);
    free(wd);
}

static void test_quant_dots(void **state)
{
    (void)state;
    static const uint32_t counts[] = {1, 3, 5, 130}; /* blocks a row: 130 leaves a tail of 2 */
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const enum be_type t = qtypes[ti];
        for (size_t ci = 0; ci < 4; ci++) {
            const uint32_t n = counts[ci] * be_type_block(t);
            uint8_t *w = malloc(be_type_size(t, n)),
                    *xq = aligned_alloc(64, cpu_qx_row_bytes(t, n));
            float *x = malloc(sizeof(float) * n);
            rand_blocks(t, w, counts[ci], 0.05f);
            fill(x, n, 2.0f);
            cpu_qx_quantize(t, x, n, xq, CPU_ISA_SCALAR);
            char what[64];
            snprintf(what, sizeof(what), "%s dot of %u blocks", be_type_name(t), counts[ci]);
            check_qdot(t, w, x, xq, n, what);
            free(w), free(xq), free(x);
        }
    }
}

/* matmul_forward on the integer path: every output is the one-row dot of its token's rounded
 * activations plus the bias, the same bits whatever the token count, tile, thread or isa; on the
 * exact path (dequantized, f32 sums) the double sums to f32 rounding */
static void run_quant_matmul(enum be_type t, uint32_t n_tok, uint32_t blocks, uint32_t n_out,
                             int bias)
{
    const uint32_t n_in = blocks * be_type_block(t);
    const size_t rb = be_type_size(t, n_in), xb = cpu_qx_row_bytes(t, n_in);
    uint8_t *w = malloc(rb * n_out), *xq = aligned_alloc(64, xb);
    float *x = malloc(sizeof(float) * n_tok * n_in), *b = malloc(sizeof(float) * n_out);
    float *y = malloc(sizeof(float) * n_tok * n_out), *wd = malloc(sizeof(float) * n_in * n_out);
    rand_blocks(t, w, (size_t)blocks * n_out, 0.05f);
    fill(x, (size_t)n_tok * n_in, 1.0f);
    fill(b, n_out, 1.0f);
    for (uint32_t o = 0; o < n_out; o++)
        quant_dequantize_row((uint32_t)t, w + o * rb, wd + (size_t)o * n_in, n_in);
    struct be_tensor *tw, *tx = tensor_f32(n_tok, n_in, x), *ty = tensor_f32(n_tok, n_out, NULL);
    struct be_tensor *tb = bias ? tensor_f32(1, n_out, b) : NULL;
    assert_int_equal(backend_tensor_alloc(be, t, n_out, n_in, &tw), 0);
    assert_int_equal(backend_tensor_set(be, tw, w, 0, rb * n_out), 0);
    for (int mode = -1; mode <= 0; mode++) { /* avx-512 where the cpu has it, then avx2 */
        cpu_ops_use_avx512(mode);
        assert_int_equal(matmul_forward(be, ty, tx, tw, tb, n_tok), 0);
        get_f32(ty, y, (size_t)n_tok * n_out);
        for (uint32_t k = 0; k < n_tok; k++) {
            cpu_qx_quantize(t, x + (size_t)k * n_in, n_in, xq, CPU_ISA_SCALAR);
            for (uint32_t o = 0; o < n_out; o++) {
                const float want =
                    cpu_q_dot(t, w + o * rb, xq, n_in, CPU_ISA_SCALAR) + (bias ? b[o] : 0.0f);
                const float got = y[(size_t)k * n_out + o];
                if (memcmp(&got, &want, sizeof(float)))
                    fail_msg("%s matmul %ux%ux%u (%s): [%u][%u] %.9g, its one-row dot %.9g",
                             be_type_name(t), n_tok, n_in, n_out, mode ? "auto" : "avx2", k, o, got,
                             want);
            }
        }
    }
    cpu_ops_use_avx512(-1);
    cpu_q_use_exact(1);
    assert_int_equal(matmul_forward(be, ty, tx, tw, tb, n_tok), 0);
    cpu_q_use_exact(0);
    get_f32(ty, y, (size_t)n_tok * n_out);
    /* f32 sums of n_in products: within their rounding, 1e-5 of the sum of |products| */
    for (uint32_t k = 0; k < n_tok; k++)
        for (uint32_t o = 0; o < n_out; o++) {
            double s = bias ? b[o] : 0.0, mag = fabs(s);
            for (uint32_t i = 0; i < n_in; i++) {
                const double p = (double)wd[(size_t)o * n_in + i] * x[(size_t)k * n_in + i];
                s += p;
                mag += fabs(p);
            }
            const float got = y[(size_t)k * n_out + o];
            if (!(fabs(got - s) <= 1e-5 * mag + 1e-6))
                fail_msg("exact %s matmul %ux%ux%u: [%u][%u] %.9g, double sums %.9g (|p| %.3g)",
                         be_type_name(t), n_tok, n_in, n_out, k, o, got, s, mag);
        }
    backend_tensor_free(be, tw);
    backend_tensor_free(be, tx);
    backend_tensor_free(be, ty);
    backend_tensor_free(be, tb);
    free(w), free(xq), free(x), free(b), free(y), free(wd);
}

static void test_quant_matmul(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const enum be_type t = qtypes[ti];
        const uint32_t per = be_type_block(t) == 256 ? 1 : 8; /* blocks in 256 values */
        run_quant_matmul(t, 1, 1, 5, 1);         /* one block a row, rows not a multiple of 4 */
        run_quant_matmul(t, 3, 3, 37, 0);        /* 3 tokens: not a whole group of 4 */
        run_quant_matmul(t, 9, 5 * per, 6, 1);   /* two groups of 4 and one token */
        run_quant_matmul(t, 70, 32 * per, 6, 0); /* tiles of 24 tokens: three, the last short */
    }
}

/* a test again on the avx2 kernels (the first run took avx-512 where this cpu has it) */
static int on_avx2(void **state)
{
    (void)state;
    cpu_ops_use_avx512(0);
    return 0;
}

static int isa_auto(void **state)
{
    (void)state;
    cpu_ops_use_avx512(-1);
    return 0;
}

#define AVX2_TOO(f)                                                                                \
    {                                                                                              \
#f " (avx2)", f, on_avx2, isa_auto, NULL                                                   \
    }

/* the attention's two forms side by side on one shape (llama3-8b's group and head_dim, a long
 * row and a short one): each is checked against double sums by test_attention; here, that a
 * cpu with avx-512 runs it by default and that the forms agree to within rounding */
static void test_attention_isa_forms(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512f"))
        skip();
    assert_true(cpu_ops_avx512());
    static const uint32_t lens[] = {300, 29};
    for (int li = 0; li < 2; li++) {
        const uint32_t n_tok = lens[li], H = 8, KVH = 2, hd = 128;
        const size_t nq = (size_t)n_tok * H * hd;
        float *o[2];
        struct attn_fx f;
        attn_fx_init(&f, 256, n_tok, KV_F16, H, KVH, hd);
        struct be_tensor *tq = tensor_f32(n_tok, H * hd, f.q);
        for (int mode = 0; mode < 2; mode++) {
            cpu_ops_use_avx512(mode ? -1 : 0);
            struct be_partial p;
            partial_alloc(&p, n_tok, &f.a);
            assert_int_equal(attn_partial_forward(be, &f.b, 1, KV_DEVICE, tq, &f.a, &p), 0);
            o[mode] = malloc(sizeof(float) * nq);
            get_f32(p.o, o[mode], nq);
            partial_free(&p);
        }
        cpu_ops_use_avx512(-1);
        backend_tensor_free(be, tq);
        attn_fx_fini(&f);
        size_t differ = 0;
        for (size_t i = 0; i < nq; i++) {
            differ += memcmp(&o[0][i], &o[1][i], sizeof(float)) != 0;
            if (fabsf(o[0][i] - o[1][i]) > 1e-5f + 1e-4f * fabsf(o[0][i]))
                fail_msg("%u keys: o[%zu] avx2 %.9g, avx-512 %.9g", n_tok, i, o[0][i], o[1][i]);
        }
        print_message("%u keys: %zu of %zu outputs differ in their last bits\n", n_tok, differ, nq);
        free(o[0]), free(o[1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_conversions),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul2),
        cmocka_unit_test(test_embed_rmsnorm_silu_add_rows),
        cmocka_unit_test(test_silu_row),
        cmocka_unit_test(test_rows_parallel),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_f16_bits),
        cmocka_unit_test(test_attention_8bit),
        cmocka_unit_test(test_kv_load_rows),
        cmocka_unit_test(test_lse_merge_splits),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_head_norm_gelu_scale),
        AVX2_TOO(test_attention),
        AVX2_TOO(test_attention_f16_bits),
        AVX2_TOO(test_attention_8bit),
        AVX2_TOO(test_lse_merge_splits),
        AVX2_TOO(test_attention_long),
        AVX2_TOO(test_attention_window),
        cmocka_unit_test(test_attention_isa_forms),
        cmocka_unit_test(test_kv_write_layout),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_quant_dequant),
        cmocka_unit_test(test_quant_activation),
        cmocka_unit_test(test_quant_dots),
        cmocka_unit_test(test_quant_matmul),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
