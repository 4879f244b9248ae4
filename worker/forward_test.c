/* forward_test.c - forward-pass exactness on an in-memory random model: kv splits, batches, chunks.
 */
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
#include "worker/backend.h"
#include "worker/backend_impl.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/cpu/cpu_ops.h"
#include "worker/forward.h"
#include "worker/kv.h"
#include "worker/model.h"

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float frand(void) /* [-1, 1) */
{
    return (float)((rnd() >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

/* a random model held in host memory */
struct tmodel {
    struct model_hparams hp;
    struct model_layer_src layers[4];
    struct model_src src;
    void *bufs[128];
    int n_bufs;
};

static void *keep(struct tmodel *t, void *p)
{
    assert_true(t->n_bufs < 128);
    t->bufs[t->n_bufs++] = p;
    return p;
}

static struct model_tensor_src rand_tensor(struct tmodel *t, enum be_type type, uint32_t rows,
                                           uint32_t cols, float scale, float offset)
{
    size_t n = (size_t)rows * cols;
    float *f = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        f[i] = offset + frand() * scale;
    void *data = f;
    if (type != BE_F32) {
        uint8_t *enc = malloc(be_type_size(type, cols) * rows);
        for (size_t r = 0; r < rows; r++) {
            const float *src = f + r * cols;
            uint8_t *dst = enc + r * be_type_size(type, cols);
            if (type == BE_F16) {
                for (size_t i = 0; i < cols; i++) {
                    uint16_t h = cpu_f32_to_f16(src[i]);
                    memcpy(dst + 2 * i, &h, 2);
                }
            } else { /* q8_0 */
                for (size_t b = 0; b < cols / 32; b++) {
                    float amax = 0;
                    for (int j = 0; j < 32; j++)
                        amax = fmaxf(amax, fabsf(src[b * 32 + j]));
                    uint16_t dh = cpu_f32_to_f16(amax / 127.0f);
                    float d = cpu_f16_to_f32(dh);
                    memcpy(dst + b * 34, &dh, 2);
                    for (int j = 0; j < 32; j++)
                        dst[b * 34 + 2 + j] = (uint8_t)(int8_t)lroundf(src[b * 32 + j] / d);
                }
            }
        }
        free(f);
        data = enc;
    }
    keep(t, data);
    return (struct model_tensor_src){type, rows, cols, data};
}

/* the test models' shape: two layers of 64, four heads of 16 over two kv heads */
static struct model_hparams test_hp(enum model_arch arch)
{
    return (struct model_hparams){.arch = arch,
                                  .n_layer = 2,
                                  .dim = 64,
                                  .ffn = 160,
                                  .n_head = 4,
                                  .n_kv_head = 2,
                                  .head_dim = 16,
                                  .n_rot = 16,
                                  .n_vocab = 96,
                                  .n_ctx = 2048,
                                  .norm_eps = 1e-5f,
                                  .rope_base = 10000.0f,
                                  .rope_scale = 1.0f,
                                  .rope_neox = arch != MODEL_LLAMA};
}

static void tmodel_init_hp(struct tmodel *t, struct model_hparams hp, enum be_type wt,
                           uint64_t seed)
{
    memset(t, 0, sizeof(*t));
    rng_state = seed * 2654435761u + 1;
    t->hp = hp;
    const enum model_arch arch = hp.arch;
    const struct model_hparams *h = &t->hp;
    const uint32_t qd = h->n_head * h->head_dim, kvd = h->n_kv_head * h->head_dim;
    t->src.tok_embd = rand_tensor(t, wt, h->n_vocab, h->dim, 1.0f, 0);
    t->src.output_norm = rand_tensor(t, BE_F32, 1, h->dim, 0.2f, 1.0f);
    if (arch == MODEL_LLAMA) /* qwen2 variant ties the lm head to the embedding */
        t->src.output = rand_tensor(t, wt, h->n_vocab, h->dim, 0.3f, 0);
    for (uint32_t l = 0; l < h->n_layer; l++) {
        struct model_layer_src *L = &t->layers[l];
        /* big q/k weights give peaked attention, which stresses the merge */
        L->attn_norm = rand_tensor(t, BE_F32, 1, h->dim, 0.2f, 1.0f);
        L->wq = rand_tensor(t, wt, qd, h->dim, 0.5f, 0);
        L->wk = rand_tensor(t, wt, kvd, h->dim, 0.5f, 0);
        L->wv = rand_tensor(t, wt, kvd, h->dim, 0.3f, 0);
        if (arch == MODEL_QWEN2) {
            L->bq = rand_tensor(t, BE_F32, 1, qd, 0.5f, 0);
            L->bk = rand_tensor(t, BE_F32, 1, kvd, 0.5f, 0);
            L->bv = rand_tensor(t, BE_F32, 1, kvd, 0.5f, 0);
        }
        L->wo = rand_tensor(t, wt, h->dim, qd, 0.15f, 0);
        L->ffn_norm = rand_tensor(t, BE_F32, 1, h->dim, 0.2f, 1.0f);
        L->w_gate = rand_tensor(t, wt, h->ffn, h->dim, 0.2f, 0);
        L->w_up = rand_tensor(t, wt, h->ffn, h->dim, 0.2f, 0);
        L->w_down = rand_tensor(t, wt, h->dim, h->ffn, 0.1f, 0);
        if (arch == MODEL_GEMMA3) {
            L->q_norm = rand_tensor(t, BE_F32, 1, h->head_dim, 0.2f, 1.0f);
            L->k_norm = rand_tensor(t, BE_F32, 1, h->head_dim, 0.2f, 1.0f);
            L->post_attn_norm = rand_tensor(t, BE_F32, 1, h->dim, 0.2f, 1.0f);
            L->post_ffn_norm = rand_tensor(t, BE_F32, 1, h->dim, 0.2f, 1.0f);
        }
    }
    t->src.layers = t->layers;
}

static void tmodel_init(struct tmodel *t, enum model_arch arch, enum be_type wt, uint64_t seed)
{
    tmodel_init_hp(t, test_hp(arch), wt, seed);
}

/* gemma3's shape in four layers: local 0 and 2 (a window of 6), global 1 and 3 */
static void tmodel_gemma3(struct tmodel *t, uint64_t seed)
{
    struct model_hparams hp = test_hp(MODEL_GEMMA3);
    hp.n_layer = 4;
    hp.n_swa = 6;
    hp.swa_period = 2;
    hp.rope_base_swa = 1e4f;
    hp.rope_base = 1e6f;
    tmodel_init_hp(t, hp, BE_F32, seed);
}

static void tmodel_fini(struct tmodel *t)
{
    for (int i = 0; i < t->n_bufs; i++)
        free(t->bufs[i]);
}

/* an engine over one model with its own kv pools */
struct eng {
    struct backend *be;
    struct model *m;
    struct kv_layout l;
    struct kv_local *kv;
    struct fwd *f;
};

/* window: the local layers' kv in parts of their own, dropped out of the window */
static void eng_init_layout(struct eng *e, const struct tmodel *t, uint32_t B, enum kv_dtype dt,
                            uint32_t max_tokens, uint32_t max_seqs, uint32_t threads, int window)
{
    char err[256] = "";
    assert_int_equal(cpu_backend_create(threads, &e->be), 0);
    int rc = model_create(e->be, &t->hp, &t->src, &e->m, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(fwd_kv_layout(e->m, B, dt, &e->l), 0);
    if (window)
        assert_int_equal(fwd_kv_layout_window(e->m, &e->l), 0);
    uint32_t n = (4096 / B + 64) * e->l.n_parts;
    assert_int_equal(kv_local_create(&e->kv, &e->l, n, n), 0);
    assert_int_equal(fwd_create(&e->f, e->m, &e->l, kv_local_pools(e->kv), max_tokens, max_seqs),
                     0);
}

static void eng_init(struct eng *e, const struct tmodel *t, uint32_t B, enum kv_dtype dt,
                     uint32_t max_tokens, uint32_t max_seqs, uint32_t threads)
{
    eng_init_layout(e, t, B, dt, max_tokens, max_seqs, threads, 0);
}

static void eng_fini(struct eng *e)
{
    fwd_destroy(e->f);
    kv_local_destroy(e->kv);
    model_destroy(e->m);
    backend_destroy(e->be);
}

/* a session: its block table (n_parts entries a position block) grows as positions are
 * written; the first n_shared position blocks are another session's, never released here */
struct sess {
    struct kv_block_ref blocks[512];
    uint32_t n_blocks;
    uint32_t n_past;
    uint32_t n_shared;
};

/* the local parts no step from n_past on reads are dropped */
static void sess_drop(struct eng *e, struct sess *s)
{
    const uint32_t P = e->l.n_parts, dead = kv_window_first(&e->l, s->n_past);
    for (uint32_t j = 0; j < dead && j * P < s->n_blocks; j++)
        for (uint32_t p = 1; p < P; p++) {
            if (j >= s->n_shared)
                kv_local_release(e->kv, s->blocks[j * P + p]);
            s->blocks[j * P + p].index = KV_REF_NONE;
        }
}

enum split { SPLIT_NONE, SPLIT_ALL_HOST, SPLIT_ALTERNATE, SPLIT_ONE, SPLIT_RANDOM };

/* makes room for n_new positions; blocks being written are on the device,
 * every older block gets the residency the split pattern says */
static void sess_prepare(struct eng *e, struct sess *s, uint32_t n_new, enum split sp,
                         uint64_t *split_rng)
{
    const uint32_t P = e->l.n_parts, need = kv_blocks_for(&e->l, s->n_past + n_new) * P;
    while (s->n_blocks < need) {
        assert_int_equal(kv_local_alloc(e->kv, KV_DEVICE, &s->blocks[s->n_blocks]), 0);
        s->n_blocks++;
    }
    sess_drop(e, s);
    uint32_t first_written = s->n_past / e->l.block_size;
    int host = 0; /* one residency for the parts of a position block */
    for (uint32_t i = s->n_shared * P; i < s->n_blocks; i++) {
        const uint32_t j = i / P;
        if (i % P == 0)
            host = 0;
        if (i % P == 0 && j < first_written) {
            switch (sp) {
            case SPLIT_NONE: host = 0; break;
            case SPLIT_ALL_HOST: host = 1; break;
            case SPLIT_ALTERNATE: host = j % 2 == 0; break;
            case SPLIT_ONE: host = j == first_written / 2; break;
            case SPLIT_RANDOM:
                *split_rng = *split_rng * 6364136223846793005ull + 1442695040888963407ull;
                host = (*split_rng >> 33) & 1;
                break;
            }
        }
        assert_int_equal(kv_local_migrate(e->kv, &s->blocks[i], host ? KV_HOST : KV_DEVICE), 0);
    }
}

static void sess_release(struct eng *e, struct sess *s)
{
    for (uint32_t i = s->n_shared * e->l.n_parts; i < s->n_blocks; i++)
        kv_local_release(e->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_past = 0;
    s->n_shared = 0;
}

static int argmax(const float *x, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int)i;
    return best;
}

/* |got - ref| <= rel * max|ref| per row; returns the worst ratio seen */
static double row_err(const float *got, const float *ref, uint32_t n)
{
    double mx = 0, worst = 0;
    for (uint32_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(ref[i]));
    for (uint32_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)got[i] - ref[i]) / (mx > 0 ? mx : 1));
    return worst;
}

/* one session: prefill (in chunks) then n_gen greedy decode steps. with
 * forced tokens the decode inputs are given (so a split run follows the
 * reference exactly); logits (n_gen+1, n_vocab) are recorded. */
static void generate(struct eng *e, const int32_t *prompt, uint32_t n_prompt, uint32_t chunk,
                     uint32_t n_gen, enum split sp, uint64_t split_seed, const int32_t *forced,
                     int32_t *tokens_out, float *logits)
{
    struct sess *s = calloc(1, sizeof(*s));
    const uint32_t V = e->m->hp.n_vocab;
    uint64_t srng = split_seed;
    for (uint32_t i = 0; i < n_prompt; i += chunk) {
        uint32_t n = n_prompt - i < chunk ? n_prompt - i : chunk;
        sess_prepare(e, s, n, sp, &srng);
        struct fwd_seq q = {prompt + i, n, s->n_past, s->blocks, s->n_blocks};
        assert_int_equal(fwd_step(e->f, &q, 1, 0, logits), 0);
        s->n_past += n;
    }
    for (uint32_t k = 0; k < n_gen; k++) {
        int32_t tok = forced ? forced[k] : argmax(logits + (size_t)k * V, V);
        if (tokens_out)
            tokens_out[k] = tok;
        sess_prepare(e, s, 1, sp, &srng);
        struct fwd_seq q = {&tok, 1, s->n_past, s->blocks, s->n_blocks};
        assert_int_equal(fwd_step(e->f, &q, 1, 0, logits + (size_t)(k + 1) * V), 0);
        s->n_past++;
    }
    if (e->l.n_parts > 1) { /* at rest the session holds what kv_live_blocks counts */
        sess_drop(e, s);
        assert_int_equal(kv_local_used(e->kv, KV_DEVICE) + kv_local_used(e->kv, KV_HOST),
                         kv_live_blocks(&e->l, s->n_past));
    }
    sess_release(e, s);
    free(s);
}

static void make_prompt(int32_t *p, uint32_t n, uint32_t V, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((x >> 33) % V);
    }
}

/* (a) any device/host split gives the unsplit logits at every step. an f16
 * cache gets a looser bound: a 1e-7 change in a k value can round to the
 * neighbouring f16 (a 5e-4 step), which the merge's reordering may cause. */
static void run_splits(enum model_arch arch, enum be_type wt, enum kv_dtype dt)
{
    const double tol = dt == KV_F16 ? 1e-4 : 1e-5;
    struct tmodel t;
    tmodel_init(&t, arch, wt, 1 + arch * 10 + wt);
    const uint32_t n_prompt = 45, n_gen = 12, V = t.hp.n_vocab;
    int32_t prompt[45], toks[12];
    make_prompt(prompt, n_prompt, V, 3);
    uint32_t Bs[] = {1, 3, 16, 256};
    enum split sps[] = {SPLIT_ALL_HOST, SPLIT_ALTERNATE, SPLIT_ONE, SPLIT_RANDOM};
    float *ref = malloc(sizeof(float) * (n_gen + 1) * V),
          *got = malloc(sizeof(float) * (n_gen + 1) * V);
    double worst_err = 0;
    for (size_t bi = 0; bi < 4; bi++) {
        struct eng e;
        eng_init(&e, &t, Bs[bi], dt, 64, 8, 2);
        generate(&e, prompt, n_prompt, 64, n_gen, SPLIT_NONE, 0, NULL, toks, ref);
        for (size_t si = 0; si < 4; si++) {
            for (uint64_t seed = 1; seed <= (sps[si] == SPLIT_RANDOM ? 3u : 1u); seed++) {
                generate(&e, prompt, n_prompt, 64, n_gen, sps[si], seed, toks, NULL, got);
                for (uint32_t k = 0; k <= n_gen; k++) {
                    double err = row_err(got + (size_t)k * V, ref + (size_t)k * V, V);
                    if (err > worst_err)
                        worst_err = err;
                    if (err > tol)
                        fprintf(stderr, "arch %d type %d B %u split %zu step %u: rel err %.3g\n",
                                arch, wt, Bs[bi], si, k, err);
                    assert_true(err <= tol);
                    /* the greedy token is the same too */
                    if (k < n_gen)
                        assert_int_equal(argmax(got + (size_t)k * V, V), toks[k]);
                }
            }
        }
        eng_fini(&e);
    }
    fprintf(stderr, "splits arch %d type %d kv %d: worst rel err %.3g\n", arch, wt, dt, worst_err);
    free(ref);
    free(got);
    tmodel_fini(&t);
}

static void test_splits_llama_f32(void **state)
{
    (void)state;
    run_splits(MODEL_LLAMA, BE_F32, KV_F32);
}
static void test_splits_qwen2_f16(void **state)
{
    (void)state;
    run_splits(MODEL_QWEN2, BE_F16, KV_F32);
}
static void test_splits_llama_q8(void **state)
{
    (void)state;
    run_splits(MODEL_LLAMA, BE_Q8_0, KV_F32);
    run_splits(MODEL_LLAMA, BE_Q8_0, KV_F16);
}
static void test_splits_kv_8bit(void **state)
{
    (void)state;
    run_splits(MODEL_LLAMA, BE_F32, KV_Q8);
    run_splits(MODEL_QWEN2, BE_F16, KV_FP8);
}

/* (b) a batch of sessions with different prompts and lengths, prefills
 * interleaved with other sessions' decode steps, gives each session the
 * logits it gets alone */
static void test_batch_equals_alone(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_init(&t, MODEL_QWEN2, BE_F32, 42);
    enum { N = 5, GEN = 6 };
    const uint32_t V = t.hp.n_vocab, lens[N] = {1, 9, 33, 17, 70}, chunk = 8;
    int32_t prompts[N][70], toks[N][GEN];
    float *ref = malloc(sizeof(float) * N * (GEN + 1) * V);
    struct eng e;
    eng_init(&e, &t, 16, KV_F32, 128, N, 2);
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], lens[i], V, 100 + i);
        generate(&e, prompts[i], lens[i], 128, GEN, SPLIT_NONE, 0, NULL, toks[i],
                 ref + (size_t)i * (GEN + 1) * V);
    }
    /* session i joins at step i, prefills `chunk` tokens per step, then decodes */
    struct sess *s = calloc(N, sizeof(*s));
    uint32_t done_prompt[N] = {0}, n_out[N] = {0};
    uint64_t srng = 9;
    float *logits = malloc(sizeof(float) * N * V);
    for (int step = 0;; step++) {
        struct fwd_seq q[N];
        int who[N], nq = 0, active = 0;
        int32_t dec_tok[N];
        for (int i = 0; i < N; i++) {
            if (step < i || n_out[i] == GEN + 1)
                continue;
            active = 1;
            uint32_t n;
            const int32_t *toks_in;
            if (done_prompt[i] < lens[i]) {
                n = lens[i] - done_prompt[i] < chunk ? lens[i] - done_prompt[i] : chunk;
                toks_in = prompts[i] + done_prompt[i];
            } else {
                n = 1;
                dec_tok[i] = toks[i][n_out[i] - 1];
                toks_in = &dec_tok[i];
            }
            /* later sessions also keep part of their kv on the host */
            sess_prepare(&e, &s[i], n, i % 2 ? SPLIT_RANDOM : SPLIT_NONE, &srng);
            q[nq] = (struct fwd_seq){toks_in, n, s[i].n_past, s[i].blocks, s[i].n_blocks};
            who[nq++] = i;
        }
        if (!active)
            break;
        assert_int_equal(fwd_step(e.f, q, (uint32_t)nq, 0, logits), 0);
        for (int j = 0; j < nq; j++) {
            int i = who[j];
            s[i].n_past += q[j].n_tokens;
            if (done_prompt[i] < lens[i]) {
                done_prompt[i] += q[j].n_tokens;
                if (done_prompt[i] < lens[i])
                    continue; /* a middle chunk: its logits are not a step */
            }
            double err =
                row_err(logits + (size_t)j * V, ref + ((size_t)i * (GEN + 1) + n_out[i]) * V, V);
            if (err > 1e-5)
                fprintf(stderr, "session %d output %u: rel err %.3g\n", i, n_out[i], err);
            assert_true(err <= 1e-5);
            n_out[i]++;
        }
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(n_out[i], GEN + 1);
        sess_release(&e, &s[i]);
    }
    free(s);
    free(logits);
    free(ref);
    eng_fini(&e);
    tmodel_fini(&t);
}

/* (c) chunked prefill equals one-shot prefill, and all_logits of a one-shot
 * prefill equals the per-token decode logits */
static void test_chunked_prefill(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_init(&t, MODEL_LLAMA, BE_F16, 7);
    const uint32_t n_prompt = 150, n_gen = 4, V = t.hp.n_vocab;
    int32_t prompt[150], toks[4];
    make_prompt(prompt, n_prompt, V, 5);
    float *ref = malloc(sizeof(float) * (n_gen + 1) * V),
          *got = malloc(sizeof(float) * (n_gen + 1) * V);
    struct eng e;
    eng_init(&e, &t, 16, KV_F32, 256, 8, 2);
    generate(&e, prompt, n_prompt, 256, n_gen, SPLIT_NONE, 0, NULL, toks, ref);
    uint32_t chunks[] = {1, 7, 64};
    for (size_t c = 0; c < 3; c++) {
        generate(&e, prompt, n_prompt, chunks[c], n_gen, SPLIT_NONE, 0, toks, NULL, got);
        for (uint32_t k = 0; k <= n_gen; k++) {
            double err = row_err(got + (size_t)k * V, ref + (size_t)k * V, V);
            if (err > 1e-5)
                fprintf(stderr, "chunk %u step %u: rel err %.3g\n", chunks[c], k, err);
            assert_true(err <= 1e-5);
        }
    }
    /* fwd_prefill does the chunking itself */
    struct sess s = {0};
    uint64_t srng = 0;
    sess_prepare(&e, &s, n_prompt, SPLIT_NONE, &srng);
    assert_int_equal(fwd_prefill(e.f, prompt, n_prompt, 0, s.blocks, s.n_blocks, 7, got), 0);
    assert_true(row_err(got, ref, V) <= 1e-5);
    sess_release(&e, &s);

    /* all logits of a 20-token prefill: row i is what decoding token i gives */
    float *all = malloc(sizeof(float) * 20 * V), *one = malloc(sizeof(float) * V);
    sess_prepare(&e, &s, 20, SPLIT_NONE, &srng);
    struct fwd_seq q = {prompt, 20, 0, s.blocks, s.n_blocks};
    assert_int_equal(fwd_step(e.f, &q, 1, 1, all), 0);
    sess_release(&e, &s);
    for (uint32_t i = 0; i < 20; i++) {
        sess_prepare(&e, &s, 1, SPLIT_NONE, &srng);
        struct fwd_seq d = {prompt + i, 1, s.n_past, s.blocks, s.n_blocks};
        assert_int_equal(fwd_step(e.f, &d, 1, 0, one), 0);
        s.n_past++;
        assert_true(row_err(all + (size_t)i * V, one, V) <= 1e-5);
    }
    sess_release(&e, &s);
    free(all);
    free(one);
    free(ref);
    free(got);
    eng_fini(&e);
    tmodel_fini(&t);
}

/* thread count does not change the result */
static void test_threads_same(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_init(&t, MODEL_LLAMA, BE_Q8_0, 11);
    const uint32_t V = t.hp.n_vocab;
    int32_t prompt[30];
    make_prompt(prompt, 30, V, 1);
    float a[3 * 96], b[3 * 96];
    struct eng e1, e4;
    eng_init(&e1, &t, 8, KV_F32, 32, 4, 1);
    eng_init(&e4, &t, 8, KV_F32, 32, 4, 4);
    generate(&e1, prompt, 30, 32, 2, SPLIT_NONE, 0, NULL, NULL, a);
    generate(&e4, prompt, 30, 32, 2, SPLIT_NONE, 0, NULL, NULL, b);
    assert_memory_equal(a, b, sizeof(a));
    eng_fini(&e1);
    eng_fini(&e4);
    tmodel_fini(&t);
}

/* (e) a step's logits kept on the backend and sampled there (fwd_step_keep, fwd_sample): a row
 * given to the sample op comes back as sample.c's twin picks it from the same logits, a row
 * the host wants is downloaded, a row nobody wants is left alone; a backend without the op
 * downloads every row; fwd_sample needs a kept step before it */
static void test_sample_keep(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_init(&t, MODEL_LLAMA, BE_F32, 7);
    enum { N = 3 };
    const uint32_t V = t.hp.n_vocab;
    struct eng e;
    eng_init(&e, &t, 16, KV_F32, 64, N, 2);
    int32_t prompts[N][12];
    struct sess s[N];
    memset(s, 0, sizeof(s));
    struct fwd_seq q[N];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], 12, V, 300 + i);
        sess_prepare(&e, &s[i], 12, SPLIT_NONE, NULL);
        q[i] = (struct fwd_seq){prompts[i], 12, 0, s[i].blocks, s[i].n_blocks};
    }
    float *ref = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    assert_int_equal(fwd_step(e.f, q, N, 0, ref), 0);
    struct sample_dev_row row = {0};
    struct sample_dev_out outs[N], want_out;
    uint8_t want[N] = {0, 1, 0};
    assert_int_equal(fwd_sample(e.f, N, (const struct sample_dev_row *const[N]){NULL}, outs, want,
                                got, &(int){0}),
                     RKV_ESTATE); /* the step was not kept */
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.9f;
    p.n_top_logprobs = 3;
    p.seed = 5;
    struct sampler *a, *b;
    assert_int_equal(sampler_create(&a, &p, (int32_t)V), 0);
    assert_int_equal(sampler_create(&b, &p, (int32_t)V), 0);
    int32_t pen[2];
    assert_int_equal(sampler_dev_row(a, &row, pen, pen + 1, 1), 0);
    const struct sample_dev_row *rows[N] = {&row, NULL, NULL};

    /* the cpu backend's op */
    for (size_t i = 0; i < (size_t)N * V; i++)
        got[i] = -1.0f;
    int used = 0;
    assert_int_equal(fwd_step_keep(e.f, q, N), 0);
    assert_int_equal(fwd_sample(e.f, N, rows, outs, want, got, &used), 0);
    assert_int_equal(used, 1);
    sampler_sample_dev(b, ref, &want_out);
    assert_memory_equal(&outs[0], &want_out, sizeof(want_out));
    assert_memory_equal(got + V, ref + V, sizeof(float) * V); /* wanted: downloaded */
    for (uint32_t i = 0; i < V; i++) {                        /* neither: left alone */
        assert_true(got[i] == -1.0f);
        assert_true(got[2 * V + i] == -1.0f);
    }

    /* a backend without the op: every row downloaded, nothing sampled */
    const struct backend_i *iface = e.be->iface;
    struct backend_i none = *iface;
    none.sample = NULL;
    e.be->iface = &none;
    assert_int_equal(fwd_step_keep(e.f, q, N), 0);
    assert_int_equal(fwd_sample(e.f, N, rows, outs, want, got, &used), 0);
    e.be->iface = iface;
    assert_int_equal(used, 0);
    assert_memory_equal(got, ref, sizeof(float) * N * V);

    sampler_destroy(a);
    sampler_destroy(b);
    for (int i = 0; i < N; i++)
        sess_release(&e, &s[i]);
    free(ref);
    free(got);
    eng_fini(&e);
    tmodel_fini(&t);
}

/* bad input is refused with a message naming the tensor */
static void test_model_errors(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_init(&t, MODEL_LLAMA, BE_F32, 3);
    struct backend *be;
    struct model *m = NULL;
    char err[256];
    assert_int_equal(cpu_backend_create(1, &be), 0);
    t.layers[1].wk.rows = 31;
    assert_int_equal(model_create(be, &t.hp, &t.src, &m, err, sizeof(err)), RKV_EFORMAT);
    assert_non_null(strstr(err, "blk.1.attn_k.weight"));
    t.layers[1].wk.rows = 32;
    t.layers[0].attn_norm.type = BE_F16;
    assert_int_equal(model_create(be, &t.hp, &t.src, &m, err, sizeof(err)), RKV_EUNSUPPORTED);
    assert_non_null(strstr(err, "blk.0.attn_norm.weight"));
    t.layers[0].attn_norm.type = BE_F32;
    t.src.tok_embd.type = (enum be_type)19; /* IQ1_S: a ggml type rkv does not read */
    assert_int_equal(model_create(be, &t.hp, &t.src, &m, err, sizeof(err)), RKV_EUNSUPPORTED);
    assert_non_null(strstr(err, "token_embd.weight"));
    t.src.tok_embd.type = BE_Q4_K; /* a row of 64 values is not a whole 256-value block */
    assert_int_equal(model_create(be, &t.hp, &t.src, &m, err, sizeof(err)), RKV_EFORMAT);
    assert_non_null(strstr(err, "token_embd.weight is Q4_K with a row of"));
    t.src.tok_embd.type = BE_F32;
    t.hp.n_kv_head = 3;
    assert_int_equal(model_create(be, &t.hp, &t.src, &m, err, sizeof(err)), RKV_EFORMAT);
    assert_non_null(strstr(err, "head_count_kv"));
    assert_null(m);
    /* a step whose block table does not cover its positions */
    t.hp.n_kv_head = 2;
    assert_int_equal(model_create(be, &t.hp, &t.src, &m, err, sizeof(err)), 0);
    struct kv_layout l;
    struct kv_local *kv;
    struct fwd *f;
    assert_int_equal(fwd_kv_layout(m, 4, KV_F32, &l), 0);
    assert_int_equal(kv_local_create(&kv, &l, 4, 4), 0);
    assert_int_equal(fwd_create(&f, m, &l, kv_local_pools(kv), 16, 2), 0);
    struct kv_block_ref blk = {0, KV_DEVICE};
    int32_t toks[5] = {1, 2, 3, 4, 5};
    float logits[96];
    struct fwd_seq q = {toks, 5, 0, &blk, 1};
    assert_int_equal(fwd_step(f, &q, 1, 0, logits), RKV_EINVAL);
    struct kv_block_ref bad = {9, KV_DEVICE};
    q = (struct fwd_seq){toks, 1, 0, &bad, 1};
    assert_int_equal(fwd_step(f, &q, 1, 0, logits), RKV_ERANGE);
    fwd_destroy(f);
    kv_local_destroy(kv);
    model_destroy(m);
    backend_destroy(be);
    tmodel_fini(&t);
}

/* a backend without qwen3's and gemma3's ops refuses those architectures at load, naming the
 * architecture and the op */
static void test_missing_ops_refused(void **state)
{
    (void)state;
    struct backend *cpu, *be;
    assert_int_equal(cpu_backend_create(1, &cpu), 0);
    struct backend_i iface = *cpu->iface;
    iface.rmsnorm_heads = NULL;
    iface.gelu_mul = NULL;
    iface.attn_window = 0;
    assert_int_equal(backend_wrap("lean", &iface, cpu->ctx, &be), 0);
    struct model_hparams hp = test_hp(MODEL_QWEN3);
    struct model_src src = {0};
    struct model *m = NULL;
    char err[256];
    assert_int_equal(model_create(be, &hp, &src, &m, err, sizeof(err)), RKV_EUNSUPPORTED);
    assert_non_null(strstr(err, "the lean backend does not run qwen3 models"));
    assert_non_null(strstr(err, "rmsnorm_heads"));
    iface.rmsnorm_heads = cpu->iface->rmsnorm_heads;
    hp.arch = MODEL_GEMMA3;
    hp.n_swa = 8;
    hp.swa_period = 6;
    hp.rope_base_swa = 1e4f;
    assert_int_equal(model_create(be, &hp, &src, &m, err, sizeof(err)), RKV_EUNSUPPORTED);
    assert_non_null(strstr(err, "gemma3 models yet (it has no gelu_mul op)"));
    iface.gelu_mul = cpu->iface->gelu_mul;
    assert_int_equal(model_create(be, &hp, &src, &m, err, sizeof(err)), RKV_EUNSUPPORTED);
    assert_non_null(strstr(err, "attn_window"));
    assert_null(m);
    /* and a window through attn_partial is refused by such a backend, not ignored */
    struct be_attn at = {4, 2, 32, 0.1f, 8};
    struct be_seq seq = {0, 1, 0, NULL, 0};
    int32_t pos = 0;
    uint32_t seq_of = 0;
    struct kv_block_ref blk = {0, KV_DEVICE};
    seq.blocks = &blk;
    struct be_batch b = {&seq, 1, 1, &pos, &seq_of};
    struct be_tensor *q, *o, *mm, *l;
    assert_int_equal(backend_tensor_alloc(be, BE_F32, 1, 128, &q), 0);
    assert_int_equal(backend_tensor_alloc(be, BE_F32, 1, 128, &o), 0);
    assert_int_equal(backend_tensor_alloc(be, BE_F32, 1, 4, &mm), 0);
    assert_int_equal(backend_tensor_alloc(be, BE_F32, 1, 4, &l), 0);
    struct be_partial p = {o, mm, l};
    assert_int_equal(attn_partial_forward(be, &b, 0, KV_DEVICE, q, &at, &p), RKV_EUNSUPPORTED);
    backend_tensor_free(be, q);
    backend_tensor_free(be, o);
    backend_tensor_free(be, mm);
    backend_tensor_free(be, l);
    free(be); /* shares cpu's context: freed with cpu */
    backend_destroy(cpu);
}

/* the local layers' kv dropped outside their window (kv_layout_set_window) gives the logits of
 * the layout that keeps every position, bit for bit: prefill in chunks shorter and longer than
 * the window, decode past it, blocks split between device and host */
static void test_window_layout_exact(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_gemma3(&t, 11);
    const uint32_t n_prompt = 45, n_gen = 12, V = t.hp.n_vocab;
    int32_t prompt[45], toks[12];
    make_prompt(prompt, n_prompt, V, 5);
    float *ref = malloc(sizeof(float) * (n_gen + 1) * V),
          *got = malloc(sizeof(float) * (n_gen + 1) * V);
    const uint32_t Bs[] = {1, 4, 16}, chunks[] = {5, 64};
    const enum split sps[] = {SPLIT_NONE, SPLIT_ALL_HOST, SPLIT_ALTERNATE, SPLIT_RANDOM};
    for (size_t bi = 0; bi < 3; bi++) {
        struct eng full, win;
        eng_init_layout(&full, &t, Bs[bi], KV_F32, 64, 8, 2, 0);
        eng_init_layout(&win, &t, Bs[bi], KV_F32, 64, 8, 2, 1);
        assert_int_equal(full.l.n_parts, 1);
        assert_int_equal(win.l.n_parts, 2);
        assert_int_equal(kv_block_bytes(&win.l) * 2, kv_block_bytes(&full.l));
        for (size_t ci = 0; ci < 2; ci++)
            for (size_t si = 0; si < 4; si++) {
                generate(&full, prompt, n_prompt, chunks[ci], n_gen, sps[si], 7, NULL, toks, ref);
                generate(&win, prompt, n_prompt, chunks[ci], n_gen, sps[si], 7, toks, NULL, got);
                if (memcmp(ref, got, sizeof(float) * (n_gen + 1) * V))
                    fprintf(stderr, "B %u chunk %u split %zu: logits differ\n", Bs[bi], chunks[ci],
                            si);
                assert_memory_equal(ref, got, sizeof(float) * (n_gen + 1) * V);
            }
        eng_fini(&full);
        eng_fini(&win);
    }
    free(ref);
    free(got);
    tmodel_fini(&t);
}

/* a prefix taken over from another session's table continues exactly where the local parts of
 * its window are still there (kv_window_live), and the session that wrote them is untouched */
static void test_window_prefix_reuse(void **state)
{
    (void)state;
    struct tmodel t;
    tmodel_gemma3(&t, 12);
    const uint32_t B = 4, n_prompt = 45, n_gen = 10, V = t.hp.n_vocab;
    int32_t prompt[45], toks[10];
    make_prompt(prompt, n_prompt, V, 6);
    float *ref = malloc(sizeof(float) * (n_gen + 1) * V),
          *got = malloc(sizeof(float) * (n_gen + 1) * V), *la = malloc(sizeof(float) * V);
    struct eng e;
    eng_init_layout(&e, &t, B, KV_F32, 64, 8, 2, 1);
    generate(&e, prompt, n_prompt, 5, n_gen, SPLIT_NONE, 0, NULL, toks, ref);

    /* session a: the first 40 tokens in chunks of 5; its last step read from position 30 on */
    struct sess *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    for (uint32_t i = 0; i < 40; i += 5) {
        sess_prepare(&e, a, 5, SPLIT_NONE, NULL);
        struct fwd_seq q = {prompt + i, 5, a->n_past, a->blocks, a->n_blocks};
        assert_int_equal(fwd_step(e.f, &q, 1, 0, la), 0);
        a->n_past += 5;
    }
    assert_int_equal(kv_window_first(&e.l, 35), 7);
    assert_int_equal(a->blocks[6 * 2 + 1].index, KV_REF_NONE);
    assert_true(kv_window_live(&e.l, a->blocks, a->n_blocks, 36));
    assert_false(kv_window_live(&e.l, a->blocks, a->n_blocks, 32));

    /* a prefix of 32 would need block 6's local part: the step is refused at layer 0 (local),
     * before it reads or writes anything */
    struct fwd_seq qc = {prompt + 32, 4, 32, a->blocks, 9 * 2};
    assert_int_equal(fwd_step(e.f, &qc, 1, 0, la), RKV_ERANGE);

    /* session b takes a's 9 full position blocks (36 positions) and goes on */
    memcpy(b->blocks, a->blocks, sizeof(struct kv_block_ref) * 9 * 2);
    b->n_blocks = 9 * 2;
    b->n_shared = 9;
    b->n_past = 36;
    sess_prepare(&e, b, n_prompt - 36, SPLIT_NONE, NULL);
    struct fwd_seq q = {prompt + 36, n_prompt - 36, b->n_past, b->blocks, b->n_blocks};
    assert_int_equal(fwd_step(e.f, &q, 1, 0, got), 0);
    b->n_past = n_prompt;
    for (uint32_t k = 0; k < n_gen; k++) {
        sess_prepare(&e, b, 1, SPLIT_NONE, NULL);
        q = (struct fwd_seq){&toks[k], 1, b->n_past, b->blocks, b->n_blocks};
        assert_int_equal(fwd_step(e.f, &q, 1, 0, got + (size_t)(k + 1) * V), 0);
        b->n_past++;
    }
    for (uint32_t k = 0; k <= n_gen; k++)
        assert_true(row_err(got + (size_t)k * V, ref + (size_t)k * V, V) <= 1e-6);
    /* a's own next step still sees its kv */
    float *la2 = malloc(sizeof(float) * V);
    sess_prepare(&e, a, 5, SPLIT_NONE, NULL);
    q = (struct fwd_seq){prompt + 40, 5, a->n_past, a->blocks, a->n_blocks};
    assert_int_equal(fwd_step(e.f, &q, 1, 0, la2), 0);
    assert_true(row_err(la2, ref, V) <= 1e-6); /* the prompt's last token, as in ref row 0 */
    sess_release(&e, b);
    sess_release(&e, a);
    assert_int_equal(kv_local_used(e.kv, KV_DEVICE), 0);
    eng_fini(&e);
    free(a);
    free(b);
    free(ref);
    free(got);
    free(la);
    free(la2);
    tmodel_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits_llama_f32),    cmocka_unit_test(test_splits_qwen2_f16),
        cmocka_unit_test(test_splits_llama_q8),
        cmocka_unit_test(test_splits_kv_8bit),     cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_chunked_prefill),     cmocka_unit_test(test_threads_same),
        cmocka_unit_test(test_model_errors),        cmocka_unit_test(test_sample_keep),
        cmocka_unit_test(test_missing_ops_refused), cmocka_unit_test(test_window_layout_exact),
        cmocka_unit_test(test_window_prefix_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
