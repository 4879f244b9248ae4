/* gpu_model_test.c - whole-model logits, cuda vs cpu backend, for device-only, host-only and split
 * kv. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/quant.h"
#include "tests/gpu/gpu_model.h"
#include "worker/cpu/cpu_quant.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/forward.h"

/* one backend's side of a run: model, kv pools, forward state */
struct side {
    struct backend *be;
    struct model *m;
    struct fwd *f;
    struct kv_local *kl; /* cpu pools */
    void *dev_pool, *host_pool;
};

static int side_init_n(struct side *s, struct backend *be, int is_gpu,
                       const struct model_hparams *hp, const struct gm_src *src,
                       const struct kv_layout *l, uint32_t n_blocks, uint32_t max_tokens,
                       uint32_t max_seqs)
{
    memset(s, 0, sizeof(*s));
    s->be = be;
    char err[256];
    if (model_create(be, hp, &src->src, &s->m, err, sizeof(err)) < 0) {
        printf("    model_create: %s\n", err);
        return -1;
    }
    struct kv_pools p;
    if (is_gpu) {
        size_t bytes = (size_t)n_blocks * kv_block_bytes(l);
        if (rkv_cuda_dev_alloc(0, bytes, &s->dev_pool) < 0)
            return -1;
        s->host_pool = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
        p = (struct kv_pools){{s->dev_pool, s->host_pool}, {n_blocks, n_blocks}};
    } else {
        if (kv_local_create(&s->kl, l, n_blocks, n_blocks) < 0)
            return -1;
        p = *kv_local_pools(s->kl);
    }
    return fwd_create(&s->f, s->m, l, &p, max_tokens, max_seqs);
}

static int side_init(struct side *s, struct backend *be, int is_gpu, const struct model_hparams *hp,
                     const struct gm_src *src, const struct kv_layout *l, uint32_t n_blocks)
{
    return side_init_n(s, be, is_gpu, hp, src, l, n_blocks, 64, 4);
}

static void side_fini(struct side *s)
{
    fwd_destroy(s->f);
    model_destroy(s->m);
    if (s->dev_pool) {
        /* detach before the pools go */
        struct kv_layout l;
        kv_layout_init(&l, 16, 1, 1, 32, KV_F32);
        struct kv_pools none = {{NULL, NULL}, {0, 0}};
        backend_set_kv(s->be, &l, &none);
    }
    rkv_cuda_dev_free(s->dev_pool);
    free(s->host_pool);
    kv_local_destroy(s->kl);
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* the small test model: 256 wide, 8 heads of 32 over 2 kv heads, 512 tokens of vocabulary;
 * qwen2 with its rope base and neox rotation */
#define CUDA_TEST_FF 64

static struct model_hparams test_hp(enum model_arch arch, uint32_t n_layer, uint32_t ffn)
{
    const int neox = arch != MODEL_LLAMA;
    struct model_hparams hp =
        gm_hparams(arch, n_layer, 256, ffn, 8, 2, 32, 512, 1e-5f, neox ? 1000000.0f : 10000.0f);
    hp.n_ctx = 1024;
    if (arch == MODEL_GEMMA3) {
        /* every other layer local, its window of 16 positions crossed by the cases' 40-token
         * prompts and 24 steps */
        hp.n_swa = 16;
        hp.swa_period = 2;
        hp.rope_base_swa = 10000.0f;
    }
    return hp;
}

/* one model (random weights of type t from seed) run on two backends: a (the cpu's or a gpu's
 * side) and b (a gpu's), each with n_blocks kv blocks of kvt */
struct duo {
    struct model_hparams hp;
    struct gm_src src;
    struct kv_layout l;
    struct side a, b;
};

static void duo_fini(struct duo *d)
{
    side_fini(&d->a);
    side_fini(&d->b);
    gm_src_fini(&d->src);
}

/* < 0 when a side cannot be made (nothing is left to free then) */
/* 1: the models carry llama 3.1's rope_freqs (frequency divisors over half of each head) */
static int g_rope_freqs;

static int duo_init(struct duo *d, const struct model_hparams *hp, enum be_type t,
                    enum be_type t_more, enum kv_dtype kvt, uint64_t seed, struct backend *a,
                    int a_gpu, struct backend *b, uint32_t n_blocks)
{
    memset(d, 0, sizeof(*d));
    d->hp = *hp;
    if (gm_src_init_mix(&d->src, &d->hp, t, t_more, seed, 1) < 0)
        return -1;
    static float ff[CUDA_TEST_FF];
    if (g_rope_freqs && hp->n_rot / 2 <= CUDA_TEST_FF) {
        for (uint32_t i = 0; i < hp->n_rot / 2; i++)
            ff[i] = 1.0f + 7.0f * (float)i / (float)(hp->n_rot / 2 - 1);
        d->src.src.rope_freqs = (struct model_tensor_src){BE_F32, 1, hp->n_rot / 2, ff};
    }
    kv_layout_init(&d->l, 16, hp->n_layer, hp->n_kv_head, hp->head_dim, kvt);
    int rc = side_init(&d->a, a, a_gpu, &d->hp, &d->src, &d->l, n_blocks);
    if (rc == 0)
        rc = side_init(&d->b, b, 1, &d->hp, &d->src, &d->l, n_blocks);
    if (rc < 0)
        duo_fini(d);
    return rc < 0 ? rc : 0;
}

/* two sequences prefilled, then decoded together with the cpu's greedy
 * tokens fed to both; returns the worst nmse seen, the argmax agreement */
static int run_case(struct backend *cpu, struct backend *gpu, enum model_arch arch, enum be_type t,
                    enum kv_dtype kvt, int placement, double *worst, double *agree)
{
    const uint32_t NB = 5; /* blocks per sequence: 80 positions */
    const struct model_hparams hp = test_hp(arch, 2, 512);
    *worst = *agree = 0.0;
    struct duo d;
    int rc = duo_init(&d, &hp, t, t, kvt, 42, cpu, 0, gpu, 2 * NB);
    if (rc < 0)
        return rc;
    struct side *c = &d.a, *g = &d.b;
    struct kv_block_ref tab[2][5];
    struct gu_rng r;
    gu_seed(&r, 7 + placement);
    uint32_t next[2] = {0, 0};
    for (int s = 0; s < 2; s++)
        for (uint32_t j = 0; j < NB; j++) {
            /* 3: a window of recent blocks on device, the oldest on host */
            int res = placement == 2 ? (int)gu_below(&r, 2) : placement == 3 ? (j == 0) : placement;
            tab[s][j] = (struct kv_block_ref){next[res]++, (uint8_t)res};
        }
    const uint32_t V = hp.n_vocab, plen[2] = {40, 23};
    int32_t prompt[2][40];
    for (int s = 0; s < 2; s++)
        for (uint32_t i = 0; i < plen[s]; i++)
            prompt[s][i] = (int32_t)gu_below(&r, V);
    float *lc = malloc(2 * V * sizeof(float)), *lg = malloc(2 * V * sizeof(float));
    int n_same = 0, n_tok = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        rc = fwd_prefill(c->f, prompt[s], plen[s], 0, tab[s], NB, 16, lc + s * V);
        if (rc == 0)
            rc = fwd_prefill(g->f, prompt[s], plen[s], 0, tab[s], NB, 16, lg + s * V);
    }
    uint32_t n_past[2] = {plen[0], plen[1]};
    for (int step = 0; step < 24 && rc == 0; step++) {
        double e = gu_nmse(lg, lc, 2 * (size_t)V);
        *worst = e > *worst ? e : *worst;
        int32_t tok[2];
        for (int s = 0; s < 2; s++) {
            tok[s] = (int32_t)argmax(lc + s * V, V);
            n_same += argmax(lg + s * V, V) == (uint32_t)tok[s];
            n_tok++;
        }
        struct fwd_seq fs[2];
        for (int s = 0; s < 2; s++)
            fs[s] = (struct fwd_seq){&tok[s], 1, n_past[s], tab[s], NB};
        rc = fwd_step(c->f, fs, 2, 0, lc);
        if (rc == 0)
            rc = fwd_step(g->f, fs, 2, 0, lg);
        n_past[0]++;
        n_past[1]++;
    }
    *agree = n_tok ? (double)n_same / n_tok : 0.0;
    free(lc);
    free(lg);
    duo_fini(&d);
    return rc;
}

/* 256 greedy decode steps of one sequence (the batch-1 path: fused layers,
 * the packed decode attention), the cpu's tokens fed to both: argmax
 * agreement per step; *free_run: steps until the two backends' own greedy
 * choices would first differ */
static int run_greedy(struct backend *cpu, struct backend *gpu, enum be_type t, enum be_type t_more,
                      double *agree, double *worst, int *free_run)
{
    enum { NB = 18, PLEN = 16, STEPS = 256 }; /* 288 positions */
    const struct model_hparams hp = test_hp(MODEL_LLAMA, 4, 768);
    *agree = *worst = 0.0;
    *free_run = 0;
    struct duo d;
    int rc = duo_init(&d, &hp, t, t_more, KV_F16, 99, cpu, 0, gpu, NB);
    if (rc < 0)
        return rc;
    struct side *c = &d.a, *g = &d.b;
    struct kv_block_ref tab[NB];
    for (uint32_t j = 0; j < NB; j++)
        tab[j] = (struct kv_block_ref){j, KV_DEVICE};
    const uint32_t V = hp.n_vocab;
    int32_t prompt[PLEN];
    for (uint32_t i = 0; i < PLEN; i++)
        prompt[i] = (int32_t)((i * 7919u + 13u) % V);
    float *lc = malloc(V * sizeof(float)), *lg = malloc(V * sizeof(float));
    if (rc == 0)
        rc = fwd_prefill(c->f, prompt, PLEN, 0, tab, NB, 16, lc);
    if (rc == 0)
        rc = fwd_prefill(g->f, prompt, PLEN, 0, tab, NB, 16, lg);
    int n_same = 0, diverged = 0;
    for (int step = 0; step < STEPS && rc == 0; step++) {
        int32_t tok = (int32_t)argmax(lc, V);
        int same = argmax(lg, V) == (uint32_t)tok;
        double e = gu_nmse(lg, lc, V);
        *worst = e > *worst ? e : *worst;
        n_same += same;
        diverged |= !same;
        *free_run += !diverged;
        struct fwd_seq fs = {&tok, 1, PLEN + (uint32_t)step, tab, NB};
        rc = fwd_step(c->f, &fs, 1, 0, lc);
        if (rc == 0)
            rc = fwd_step(g->f, &fs, 1, 0, lg);
    }
    *agree = (double)n_same / STEPS;
    free(lc);
    free(lg);
    duo_fini(&d);
    return rc;
}

/* batch invariance: sequence A's logits from a run of its own (prefilled in chunks of 16, all
 * its blocks on the device, decoded alone) against a run where its prompt is prefilled in
 * chunks of 13 beside other prompts, its last prompt token comes as a decode row (a cached
 * prefix), every other block of it is on the host, and it decodes in batches of 3 and 12 rows
 * (past the 8-token kernels). Counts the steps whose logits are the same bits (*same of *n) */
enum { INV_PLEN = 40, INV_STEPS = 12, INV_OTHERS = 11, INV_NB = 5 };
static int run_invariance(struct backend *be, enum be_type t, enum kv_dtype kvt, int *same, int *n,
                          double *worst)
{
    const struct model_hparams hp = test_hp(MODEL_LLAMA, 2, 512);
    struct gm_src src;
    if (gm_src_init(&src, &hp, t, 5, 1) < 0)
        return -1;
    struct kv_layout l;
    kv_layout_init(&l, 16, hp.n_layer, hp.n_kv_head, hp.head_dim, kvt);
    const uint32_t V = hp.n_vocab, NS = 1 + INV_OTHERS;
    struct side g;
    int rc = side_init_n(&g, be, 1, &hp, &src, &l, 2 * NS * INV_NB, 128, 16);
    struct gu_rng r;
    gu_seed(&r, 11);
    int32_t prompt[1 + INV_OTHERS][INV_PLEN], tok[1 + INV_OTHERS];
    memset(tok, 0, sizeof tok);
    for (uint32_t s = 0; s < NS; s++)
        for (uint32_t i = 0; i < INV_PLEN; i++)
            prompt[s][i] = (int32_t)gu_below(&r, V);
    float *ref = malloc((size_t)(INV_STEPS + 1) * V * sizeof(float));
    float *lg = malloc((size_t)NS * V * sizeof(float));
    int32_t ref_tok[INV_STEPS];
    /* the run of its own: blocks 0.. on the device */
    struct kv_block_ref ta[INV_NB], tb[1 + INV_OTHERS][INV_NB];
    for (uint32_t j = 0; j < INV_NB; j++)
        ta[j] = (struct kv_block_ref){j, KV_DEVICE};
    if (rc == 0)
        rc = fwd_prefill(g.f, prompt[0], INV_PLEN, 0, ta, INV_NB, 16, ref);
    for (int k = 0; k < INV_STEPS && rc == 0; k++) {
        ref_tok[k] = (int32_t)argmax(ref + (size_t)k * V, V);
        struct fwd_seq fs = {&ref_tok[k], 1, INV_PLEN + (uint32_t)k, ta, INV_NB};
        rc = fwd_step(g.f, &fs, 1, 0, ref + (size_t)(k + 1) * V);
    }
    /* the crowded run: A's blocks alternate host and device, the others' anywhere else */
    uint32_t next[2] = {INV_NB, 0};
    for (uint32_t s = 0; s < NS; s++)
        for (uint32_t j = 0; j < INV_NB; j++) {
            int res = s == 0 ? (int)(j % 2) : (int)gu_below(&r, 2);
            tb[s][j] = (struct kv_block_ref){next[res]++, (uint8_t)res};
        }
    *same = *n = 0;
    *worst = 0.0;
    /* prompts: A's first 39 tokens in chunks of 13 beside three others' chunks */
    for (uint32_t c0 = 0; c0 < INV_PLEN - 1 && rc == 0; c0 += 13) {
        struct fwd_seq fs[4];
        for (uint32_t s = 0; s < 4; s++)
            fs[s] = (struct fwd_seq){prompt[s] + c0, 13, c0, tb[s], INV_NB};
        rc = fwd_step(g.f, fs, 4, 0, lg);
    }
    for (uint32_t s = 4; s < NS && rc == 0; s++)
        rc = fwd_prefill(g.f, prompt[s], INV_PLEN - 1, 0, tb[s], INV_NB, 32, lg);
    /* then A's last prompt token decodes among the others' last prompt tokens, and A decodes in
     * steps of all the rows or of the first three */
    uint32_t past[1 + INV_OTHERS];
    for (uint32_t s = 0; s < NS; s++) {
        past[s] = INV_PLEN - 1;
        tok[s] = prompt[s][INV_PLEN - 1];
    }
    for (int k = -1; k < INV_STEPS && rc == 0; k++) {
        const uint32_t rows = k >= 0 && k < INV_STEPS / 2 ? 3 : NS;
        struct fwd_seq fs[1 + INV_OTHERS];
        if (k >= 0)
            tok[0] = ref_tok[k];
        for (uint32_t s = 0; s < rows; s++)
            fs[s] = (struct fwd_seq){&tok[s], 1, past[s], tb[s], INV_NB};
        rc = fwd_step(g.f, fs, rows, 0, lg);
        if (rc != 0)
            break;
        const float *want = ref + (size_t)(k + 1) * V;
        (*n)++;
        *same += memcmp(lg, want, (size_t)V * sizeof(float)) == 0;
        for (uint32_t i = 0; i < V; i++) {
            double d = fabs((double)lg[i] - want[i]);
            *worst = d > *worst ? d : *worst;
        }
        for (uint32_t s = 0; s < rows; s++) {
            past[s]++;
            if (s > 0)
                tok[s] = (int32_t)argmax(lg + (size_t)s * V, V);
        }
    }
    free(ref);
    free(lg);
    side_fini(&g);
    gm_src_fini(&src);
    return rc;
}

/* decode steps with the layers recorded as a cuda graph and replayed (a backend made with
 * graph=1) against the same steps run as usual on another: the same logits bits at
 * every step while the rows' positions cross block boundaries (a replay reads the new positions
 * and write slots from the meta) and their tables grow (recorded again); *same of *n steps
 * matched; st: the graph backend's counter line after the run */
static int run_graph(struct backend *plain, struct backend *graph, enum be_type t, int *same,
                     int *n, char *st, size_t stlen)
{
    enum { NB = 8, STEPS = 40 };
    const struct model_hparams hp = test_hp(MODEL_LLAMA, 2, 512);
    *same = *n = 0;
    struct duo d;
    int rc = duo_init(&d, &hp, t, t, KV_F16, 5, plain, 1, graph, 2 * NB);
    if (rc < 0)
        return rc;
    struct side *a = &d.a, *b = &d.b;
    struct kv_block_ref tab[2][NB];
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t j = 0; j < NB; j++)
            tab[s][j] = (struct kv_block_ref){s * NB + j, KV_DEVICE};
    const uint32_t V = hp.n_vocab, plen[2] = {20, 9};
    int32_t prompt[2][20];
    struct gu_rng r;
    gu_seed(&r, 77);
    for (int s = 0; s < 2; s++)
        for (uint32_t i = 0; i < plen[s]; i++)
            prompt[s][i] = (int32_t)gu_below(&r, V);
    float *la = malloc(2 * V * sizeof(float)), *lb = malloc(2 * V * sizeof(float));
    for (int s = 0; s < 2 && rc == 0; s++) {
        rc = fwd_prefill(a->f, prompt[s], plen[s], 0, tab[s], NB, 16, la + s * V);
        if (rc == 0)
            rc = fwd_prefill(b->f, prompt[s], plen[s], 0, tab[s], NB, 16, lb + s * V);
    }
    if (rc == 0)
        backend_stats(graph, st, stlen); /* counts from here */
    uint32_t n_past[2] = {plen[0], plen[1]};
    for (int step = 0; step < STEPS && rc == 0; step++) {
        int32_t tok[2];
        struct fwd_seq fs[2];
        for (int s = 0; s < 2; s++) {
            tok[s] = (int32_t)argmax(la + s * V, V);
            /* the table as long as the position needs, as kvmgr grows it: the longest list
             * grows, and the graph records again (its launches change with it) */
            fs[s] = (struct fwd_seq){&tok[s], 1, n_past[s], tab[s], n_past[s] / 16 + 1};
            n_past[s]++;
        }
        rc = fwd_step(a->f, fs, 2, 0, la);
        if (rc == 0)
            rc = fwd_step(b->f, fs, 2, 0, lb);
        *same += rc == 0 && memcmp(la, lb, 2 * V * sizeof(float)) == 0;
        (*n)++;
    }
    if (rc == 0)
        backend_stats(graph, st, stlen);
    free(la);
    free(lb);
    duo_fini(&d);
    return rc;
}

int gpu_model_graph_tests(struct backend *plain, struct backend *graph, int *pass, int *fail)
{
    printf("model: decode layers as a cuda graph against the same steps run as usual\n");
    static const enum be_type ts[] = {BE_BF16, BE_F32};
    for (int i = 0; i < 2; i++) {
        int same = 0, n = 0;
        char st[1024] = "";
        int rc = run_graph(plain, graph, ts[i], &same, &n, st, sizeof st);
        const int replayed = strstr(st, " 0 replayed") == NULL && strstr(st, "replayed");
        const int ok = rc == 0 && n > 0 && same == n && replayed && strstr(st, " 0 failed");
        printf("  %s w=%-4s %d of %d steps the same bits; %s\n", ok ? "ok  " : "FAIL",
               be_type_name(ts[i]), same, n, st);
        if (ok)
            (*pass)++;
        else
            (*fail)++;
    }
    return 0;
}

/* one logits-vs-cpu case of run_case on backend g, printed and counted; label names the
 * backend's variant */
static void model_case(struct backend *cpu_be, struct backend *g, const char *label,
                       enum model_arch arch, enum be_type t, enum kv_dtype kv, int pl, double bound,
                       double min_agree, int *pass, int *fail)
{
    static const char *pl_name[] = {"device", "host", "split", "window"};
    double worst = 0, agree = 0;
    int rc = run_case(cpu_be, g, arch, t, kv, pl, &worst, &agree);
    int ok = rc == 0 && worst <= bound && agree >= min_agree;
    printf("  %s %-5s %-8s w=%-4s kv=%s %-6s nmse %.2e (<= %.0e) argmax agree %.1f%%%s\n",
           ok ? "ok  " : "FAIL", model_arch_name(arch), label, be_type_name(t), kv_dtype_name(kv),
           pl_name[pl], worst, bound, agree * 100.0, rc ? " (run failed)" : "");
    if (ok)
        (*pass)++;
    else
        (*fail)++;
}

/* a kv layout whose position blocks are several blocks (local layers' kv dropped outside their
 * window, which the cpu backend reads) is refused at set_kv; the one-block layout attaches */
static void split_layout_refused(struct backend *gpu_be, int *pass, int *fail)
{
    struct kv_layout l;
    struct kv_pools none = {{NULL, NULL}, {0, 0}};
    kv_layout_init(&l, 16, 7, 1, 32, KV_F16);
    kv_layout_set_window(&l, 8, 6);
    int ok = l.n_parts == 7 && backend_set_kv(gpu_be, &l, &none) == RKV_EUNSUPPORTED;
    kv_layout_init(&l, 16, 7, 1, 32, KV_F16);
    ok = ok && backend_set_kv(gpu_be, &l, &none) == 0;
    printf("  %s a kv layout of 7 blocks a position block refused at set_kv\n",
           ok ? "ok  " : "FAIL");
    if (ok)
        (*pass)++;
    else
        (*fail)++;
}

/* Block-type weights are checked twice. With qdot=exact (qexact) against the cpu's dequantized
 * weights: the same sums, so the logits agree to f32 rounding (and the tiles' f16 activations).
 * With the default integer dots against the cpu's integer path (cpu_q_use_exact(2): integer dots
 * up to 8 tokens, dequantized weights past them, as the cuda paths): each side rounds its
 * activations to 8 bits, but from inputs that differ in the last bits (the norms and attention
 * sum in other orders), so a level here and there rounds the other way and the logits differ by
 * 8-bit rounding noise, not f32's: bounded by INT_NMSE and INT_AGREE */
#define INT_NMSE  5e-4
#define INT_AGREE 0.95

int gpu_model_tests(struct backend *cpu_be, struct backend *gpu_be, struct backend *precise,
                    struct backend *qexact, struct backend *det, int *pass, int *fail)
{
    printf("model: kv layouts\n");
    split_layout_refused(gpu_be, pass, fail);
    printf("model: batch invariance, a sequence alone vs crowded, chunked differently, its last "
           "prompt token decoded, half its blocks on the host\n");
    static const struct {
        enum be_type t;
        enum kv_dtype kv;
    } inv[] = {{BE_BF16, KV_F16}, {BE_F16, KV_F16}, {BE_F32, KV_F32},
               {BE_Q8_0, KV_F16}, {BE_BF16, KV_Q8}, {BE_BF16, KV_FP8}};
    for (size_t i = 0; i < sizeof(inv) / sizeof(inv[0]); i++) {
        int same = 0, n = 0;
        double worst = 0;
        int rc = det ? run_invariance(det, inv[i].t, inv[i].kv, &same, &n, &worst) : -1;
        int ok = rc == 0 && n == INV_STEPS + 1 && same == n;
        printf("  %s deterministic w=%-4s kv=%s: %d of %d steps the same bits (largest "
               "difference %.3g)%s\n",
               ok ? "ok  " : "FAIL", be_type_name(inv[i].t), kv_dtype_name(inv[i].kv), same, n,
               worst, rc ? " (run failed)" : "");
        if (ok)
            (*pass)++;
        else
            (*fail)++;
        /* the default kernels, for the record (not asserted: they trade this for speed) */
        if (run_invariance(gpu_be, inv[i].t, inv[i].kv, &same, &n, &worst) == 0)
            printf("  info default kernels w=%-4s: %d of %d steps the same bits (largest "
                   "difference %.3g)\n",
                   be_type_name(inv[i].t), same, n, worst);
    }
    printf("model: 256 greedy decode steps, batch 1, kv f16 (cpu tokens fed to both)\n");
    /* the block formats too, Q4_K with Q6_K where a q4_k_m file has it (and Q5_K likewise) */
    static const struct {
        enum be_type t, more;
    } gt[] = {{BE_BF16, BE_BF16}, {BE_F16, BE_F16},   {BE_F32, BE_F32},   {BE_Q4_K, BE_Q6_K},
              {BE_Q5_K, BE_Q6_K}, {BE_Q6_K, BE_Q6_K}, {BE_Q4_0, BE_Q4_0}, {BE_IQ4_XS, BE_IQ4_XS}};
    for (size_t i = 0; i < sizeof(gt) / sizeof(gt[0]); i++) {
        const int blk = quant_is_block((uint32_t)gt[i].t);
        /* 16-bit and f32 weights once; block types by integer dots, then exactly */
        for (int pass_i = 0; pass_i < 1 + blk; pass_i++) {
            const int exact = !blk || pass_i == 1;
            struct backend *g = blk && exact ? qexact : gpu_be;
            if (!g)
                continue;
            double agree = 0, worst = 0;
            int free_run = 0;
            cpu_q_use_exact(exact ? 1 : 2);
            int rc = run_greedy(cpu_be, g, gt[i].t, gt[i].more, &agree, &worst, &free_run);
            cpu_q_use_exact(1);
            const double bound = !blk ? 1.0 : exact ? 1e-5 : INT_NMSE;
            int ok = rc == 0 && agree >= (exact ? 0.99 : INT_AGREE) && worst <= bound;
            char w[24];
            snprintf(w, sizeof w, "%s%s%s", be_type_name(gt[i].t), gt[i].more != gt[i].t ? "+" : "",
                     gt[i].more != gt[i].t ? be_type_name(gt[i].more) : "");
            printf("  %s w=%-4s%s argmax agree %.1f%% over 256 steps, nmse worst %.2e, same "
                   "greedy tokens for the first %d steps%s\n",
                   ok ? "ok  " : "FAIL", w,
                   !blk    ? ""
                   : exact ? " qdot=exact"
                           : " qdot=int",
                   agree * 100.0, worst, free_run, rc ? " (run failed)" : "");
            if (ok)
                (*pass)++;
            else
                (*fail)++;
        }
    }
    struct {
        enum model_arch arch;
        enum be_type t;
        enum kv_dtype kv;
    } cfg[] = {
        {MODEL_LLAMA, BE_F32, KV_F32},    {MODEL_LLAMA, BE_BF16, KV_F16},
        {MODEL_LLAMA, BE_F16, KV_F16},    {MODEL_LLAMA, BE_Q8_0, KV_F16},
        {MODEL_QWEN2, BE_BF16, KV_F16},   {MODEL_LLAMA, BE_Q4_K, KV_F16},
        {MODEL_QWEN2, BE_IQ4_XS, KV_F16}, {MODEL_QWEN3, BE_BF16, KV_F16},
        {MODEL_GEMMA3, BE_BF16, KV_F16},  {MODEL_GEMMA3, BE_Q4_K, KV_F16},
        {MODEL_GEMMA3, BE_F32, KV_F32},   {MODEL_LLAMA, BE_BF16, KV_Q8},
        {MODEL_QWEN3, BE_BF16, KV_FP8},   {MODEL_LLAMA, BE_F32, KV_Q8},
    };
    printf("model: logits vs cpu (nmse worst over prefill + 24 batched decode steps)\n");
    for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++)
        for (int pl = 0; pl < 4; pl++)
            for (int pm = 0; pm < 2; pm++) {
                /* the second backend: precise (16-bit weights: prefill gemms keep f32
                 * activations, bound 1e-5) or, for block types, qdot=exact (bound 1e-5 against
                 * the dequantized twin); the first, the defaults (16-bit activations in the
                 * gemms: 1e-3; block types: integer dots, INT_NMSE and INT_AGREE) */
                const int blk = quant_is_block((uint32_t)cfg[i].t);
                struct backend *g = !pm ? gpu_be : blk ? qexact : precise;
                if (!g)
                    continue;
                /* block types under integer dots: INT_NMSE. 8-bit kv: a k or v value the two
                 * backends compute a few ulps apart may round to neighbouring levels (a step
                 * of amax / 127 in q8, 1/16 of the value in fp8): the bounds the dtypes keep
                 * against f16 kv */
                double bound = pm || cfg[i].t == BE_F32 ? 1e-5 : blk ? INT_NMSE : 1e-3;
                if (kv_dtype_is_8bit(cfg[i].kv))
                    bound = cfg[i].kv == KV_Q8 ? 1e-3 : 3e-3;
                cpu_q_use_exact(blk && !pm ? 2 : 1);
                model_case(cpu_be, g,
                           !pm   ? "fast"
                           : blk ? "exact"
                                 : "prec",
                           cfg[i].arch, cfg[i].t, cfg[i].kv, pl, bound,
                           blk && !pm ? INT_AGREE : 0.99, pass, fail);
                cpu_q_use_exact(1);
            }
    /* llama 3.1's rope_freqs through the fused rope and kv write */
    g_rope_freqs = 1;
    model_case(cpu_be, gpu_be, "ropefreq", MODEL_LLAMA, BE_BF16, KV_F16, 2, 1e-3, 0.99, pass, fail);
    g_rope_freqs = 0;
    return 0;
}

/* the model cases on a backend made with other settings (what names them), every placement */
int gpu_model_cases_with(struct backend *cpu_be, struct backend *be, const char *what, int *pass,
                         int *fail)
{
    printf("model: logits vs cpu, %s\n", what);
    static const struct {
        enum be_type t;
        enum kv_dtype kv;
    } cfg[] = {{BE_BF16, KV_F16}, {BE_F16, KV_F16}, {BE_F32, KV_F32}};
    for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++)
        for (int pl = 0; pl < 4; pl++)
            model_case(cpu_be, be, "with", MODEL_LLAMA, cfg[i].t, cfg[i].kv, pl,
                       cfg[i].t == BE_F32 ? 1e-5 : 1e-3, 0.99, pass, fail);
    return 0;
}

/* CPU_TAIL (or the split host read): the same cases with (a share of the) host blocks attended
 * by the cpu inside the cuda backend; what names the way in the output */
int gpu_model_cpu_tail_tests(struct backend *cpu_be, struct backend *tail_be, const char *what,
                             int *pass, int *fail)
{
    printf("model: logits vs cpu with host blocks attended on the cpu (%s)\n", what);
    static const struct {
        enum be_type t;
        enum kv_dtype kv;
    } cfg[] = {{BE_BF16, KV_F16}, {BE_F32, KV_F32}};
    for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++)
        for (int pl = 1; pl < 4; pl++)
            model_case(cpu_be, tail_be, what, MODEL_LLAMA, cfg[i].t, cfg[i].kv, pl,
                       cfg[i].t == BE_F32 ? 1e-5 : 1e-3, 0.99, pass, fail);
    return 0;
}
