/* cpu.c - the cpu suite: prefill and decode tok/s per model and weight type, kernels, attention. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/rkv-bench/bench.h"
#include "common/err.h"
#include "common/quant.h"
#include "worker/backend.h"
#include "worker/backend_impl.h" /* a tensor's bytes, and a view of its first rows */
#include "worker/cpu/cpu_ops.h"
#include "worker/cpu/cpu_quant.h"
#include "worker/engine.h"
#include "worker/forward.h"
#include "worker/kv.h"
#include "worker/pool.h"

#define BATCH 8

struct run_result {
    double prefill_tok_s, decode_tok_s, decode_b8_tok_s;
    double weight_mib, kv_mib; /* what one decode step reads: every matrix but the embedding table
                                  (one row of it), and the kv at the mean decode position */
};

static size_t tensor_bytes(const struct be_tensor *t)
{
    return t ? t->nbytes : 0;
}

/* bytes a decode step reads of m's weights: every layer's matrices, norms and biases and the lm
 * head; the embedding table gives one row */
static size_t step_weight_bytes(const struct model *m)
{
    size_t b = tensor_bytes(m->output) + tensor_bytes(m->output_norm) +
               (m->tok_embd ? m->tok_embd->row_bytes : 0);
    for (uint32_t i = 0; i < m->hp.n_layer; i++) {
        const struct model_layer *l = &m->layers[i];
        const struct be_tensor *t[] = {l->attn_norm, l->wq,     l->wk,   l->wv,
                                       l->bq,        l->bk,     l->bv,   l->wo,
                                       l->ffn_norm,  l->w_gate, l->w_up, l->w_down};
        for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++)
            b += tensor_bytes(t[k]);
    }
    return b;
}

/* blocks for n positions of one session, all on the device */
static int take_blocks(struct kv_local *kv, const struct kv_layout *l, uint32_t n_pos,
                       struct kv_block_ref *out, uint32_t *n_blocks)
{
    *n_blocks = kv_blocks_for(l, n_pos);
    for (uint32_t j = 0; j < *n_blocks; j++) {
        int rc = kv_local_alloc(kv, KV_DEVICE, &out[j]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void give_blocks(struct kv_local *kv, struct kv_block_ref *b, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++)
        kv_local_release(kv, b[j]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* prefill of n_prompt tokens (one chunk, the best of three), n_dec decode steps (their median) of
 * one session, then n_dec/4 steps of BATCH sessions */
static int run_model(const struct bench_opts *o, const char *path, uint32_t n_prompt,
                     uint32_t n_dec, struct run_result *r)
{
    char err[512] = "";
    struct backend_opts bo = {"cpu", o->threads, 0};
    struct engine e;
    int rc = engine_open(&e, path, &bo, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rkv-bench: %s\n", err);
        return rc;
    }
    const uint32_t V = e.m->hp.n_vocab, n_pos = n_prompt + n_dec;
    struct kv_layout l;
    struct kv_local *kv = NULL;
    struct fwd *f = NULL;
    int32_t *toks = malloc(sizeof(int32_t) * n_pos * BATCH);
    float *logits = malloc(sizeof(float) * V * BATCH);
    uint32_t per = kv_blocks_for(&(struct kv_layout){256}, n_pos) + 1, nb[BATCH];
    struct kv_block_ref *blocks = calloc((size_t)per * BATCH, sizeof(*blocks));
    rc = fwd_kv_layout(e.m, 256, (enum kv_dtype)o->kv_dtype, &l);
    if (rc == 0)
        rc = kv_local_create(&kv, &l, per * BATCH, 1);
    if (rc == 0)
        rc = fwd_create(&f, e.m, &l, kv_local_pools(kv), n_prompt, BATCH);
    if (rc < 0 || !toks || !logits || !blocks)
        goto out;
    for (uint32_t i = 0; i < n_pos * BATCH; i++)
        toks[i] = (int32_t)((i * 2654435761u) % V);

    /* warm-up: first touch of activations and scratch */
    if ((rc = take_blocks(kv, &l, 16, blocks, &nb[0])) < 0 ||
        (rc = fwd_step(f, &(struct fwd_seq){toks, 16, 0, blocks, nb[0]}, 1, 0, logits)) < 0)
        goto out;
    give_blocks(kv, blocks, nb[0]);

    if ((rc = take_blocks(kv, &l, n_pos, blocks, &nb[0])) < 0)
        goto out;
    /* a shared host's other work only slows a pass: the best of a few prefills, and the fastest
     * decode step */
    double pf = 1e30, *step = calloc(n_dec ? n_dec : 1, sizeof(double));
    if (!step)
        rc = RKV_ENOMEM;
    for (int rep = 0; rc == 0 && rep < (o->quick ? 1 : 3); rep++) {
        double t0 = bench_now_s();
        rc = fwd_step(f, &(struct fwd_seq){toks, n_prompt, 0, blocks, nb[0]}, 1, 0, logits);
        pf = fmin(pf, bench_now_s() - t0);
    }
    for (uint32_t k = 0; rc == 0 && k < n_dec; k++) {
        double t0 = bench_now_s();
        rc = fwd_step(f, &(struct fwd_seq){&toks[n_prompt + k], 1, n_prompt + k, blocks, nb[0]}, 1,
                      0, logits);
        step[k] = bench_now_s() - t0;
    }
    give_blocks(kv, blocks, nb[0]);
    if (rc < 0) {
        free(step);
        goto out;
    }
    qsort(step, n_dec, sizeof(double), cmp_double);
    r->prefill_tok_s = n_prompt / pf;
    r->decode_tok_s = n_dec ? 1.0 / step[0] : 0;
    free(step);
    r->weight_mib = (double)step_weight_bytes(e.m) / (1 << 20);
    r->kv_mib = (double)l.n_layer * 2 * l.n_kv_head * l.head_dim * sizeof(float) *
                (n_prompt + n_dec / 2.0) / (1 << 20);

    /* batched decode: BATCH sessions with a short context each */
    const uint32_t ctx = n_prompt / BATCH, steps = n_dec / 4 ? n_dec / 4 : 1;
    struct fwd_seq seqs[BATCH];
    for (uint32_t s = 0; rc == 0 && s < BATCH; s++) {
        struct kv_block_ref *b = blocks + (size_t)s * per;
        rc = take_blocks(kv, &l, ctx + steps, b, &nb[s]);
        seqs[s] = (struct fwd_seq){toks + (size_t)s * n_pos, ctx, 0, b, nb[s]};
    }
    if (rc == 0)
        rc = fwd_step(f, seqs, BATCH, 0, logits);
    double t3 = bench_now_s();
    for (uint32_t k = 0; rc == 0 && k < steps; k++) {
        for (uint32_t s = 0; s < BATCH; s++) {
            seqs[s].n_past = ctx + k;
            seqs[s].tokens = toks + (size_t)s * n_pos + ctx + k;
            seqs[s].n_tokens = 1;
        }
        rc = fwd_step(f, seqs, BATCH, 0, logits);
    }
    r->decode_b8_tok_s = (double)steps * BATCH / (bench_now_s() - t3);
out:
    if (rc < 0)
        fprintf(stderr, "rkv-bench: %s: %s\n", path, rkv_strerror(rc));
    fwd_destroy(f);
    kv_local_destroy(kv);
    free(blocks);
    free(toks);
    free(logits);
    engine_close(&e);
    return rc;
}

struct attn_result {
    double resident_ms, split_ms, kv_mib;
    uint32_t n_seq, ctx;
};

/* a cpu backend of o's threads and a local pool pair of n_dev + n_host blocks, one layer of
 * n_kv heads of dimension hd in blocks of B positions */
static int attn_bench_init(const struct bench_opts *o, uint32_t B, uint32_t n_kv, uint32_t hd,
                           enum kv_dtype dt, uint32_t n_dev, uint32_t n_host, struct backend **be,
                           struct kv_layout *l, struct kv_local **kv)
{
    struct backend_opts bo = {"cpu", o->threads, 0};
    char err[256];
    int rc = backend_create(&bo, be, err, sizeof(err));
    if (rc == 0)
        rc = kv_layout_init(l, B, 1, n_kv, hd, dt);
    if (rc == 0)
        rc = kv_local_create(kv, l, n_dev, n_host);
    return rc;
}

/* decode-shaped attention (BATCH sequences x 1 token at the end of ctx
 * positions, small's heads): all blocks device vs every other block host
 * (two partial passes and a merge). median of reps. */
static int run_attention(const struct bench_opts *o, struct attn_result *r)
{
    const uint32_t ctx = o->quick ? 1024 : 4096, B = 256, n_head = 12, n_kv = 4, hd = 64;
    const int reps = o->quick ? 5 : 21;
    struct backend *be = NULL;
    struct kv_layout l;
    struct kv_local *kv = NULL;
    const uint32_t nb = ctx / B;
    struct kv_block_ref *blocks = calloc((size_t)nb * BATCH, sizeof(*blocks));
    struct be_seq seqs[BATCH];
    int32_t pos[BATCH];
    uint32_t seq_of[BATCH];
    const struct be_attn at = {n_head, n_kv, hd, 1.0f / sqrtf((float)hd)};
    struct be_tensor *q = NULL, *t[6] = {0};
    double *times = calloc((size_t)reps * 2, sizeof(double));
    int rc = attn_bench_init(o, B, n_kv, hd, KV_F32, nb * BATCH, nb * BATCH, &be, &l, &kv);
    if (rc < 0 || !blocks || !times)
        goto out;
    /* random keys and values in both pools */
    const struct kv_pools *p = kv_local_pools(kv);
    uint64_t x = 1;
    for (int pool = 0; pool < KV_N_POOLS; pool++) {
        float *v = p->base[pool];
        size_t n = (size_t)p->n_blocks[pool] * kv_block_bytes(&l) / sizeof(float);
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (float)((x >> 40) / (double)(1 << 24)) - 0.5f;
        }
    }
    for (uint32_t s = 0; s < BATCH; s++) {
        for (uint32_t j = 0; j < nb; j++)
            blocks[s * nb + j] = (struct kv_block_ref){s * nb + j, KV_DEVICE};
        seqs[s] = (struct be_seq){s, 1, ctx - 1, blocks + (size_t)s * nb, nb};
        pos[s] = (int32_t)(ctx - 1);
        seq_of[s] = s;
    }
    struct be_batch b = {seqs, BATCH, BATCH, pos, seq_of};
    const uint32_t qd = n_head * hd;
    uint32_t shapes[6] = {qd, n_head, n_head, qd, n_head, n_head};
    rc = backend_set_kv(be, &l, p);
    if (rc == 0)
        rc = backend_tensor_alloc(be, BE_F32, BATCH, qd, &q);
    for (int i = 0; rc == 0 && i < 6; i++)
        rc = backend_tensor_alloc(be, BE_F32, BATCH, shapes[i], &t[i]);
    if (rc < 0)
        goto out;
    struct be_partial dev = {t[0], t[1], t[2]}, host = {t[3], t[4], t[5]};
    float *qv = calloc((size_t)BATCH * qd, sizeof(float));
    for (uint32_t i = 0; qv && i < BATCH * qd; i++)
        qv[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    rc = qv ? backend_tensor_set(be, q, qv, 0, sizeof(float) * BATCH * qd) : RKV_ENOMEM;
    free(qv);
    for (int split = 0; rc == 0 && split < 2; split++) {
        /* the split case tags every other block host: the same bytes, now
         * in the other pool (which holds the same random data) */
        for (uint32_t s = 0; s < BATCH; s++)
            for (uint32_t j = 0; j < nb; j++)
                blocks[s * nb + j].residency = split && j % 2 ? KV_HOST : KV_DEVICE;
        for (int i = 0; rc == 0 && i < reps + 1; i++) {
            double t0 = bench_now_s();
            rc = attn_partial_forward(be, &b, 0, KV_DEVICE, q, &at, &dev);
            if (split && rc == 0)
                rc = attn_partial_forward(be, &b, 0, KV_HOST, q, &at, &host);
            if (split && rc == 0)
                rc = attn_merge_forward(be, &dev, &host, BATCH, &at);
            if (i > 0) /* the first is a warm-up */
                times[split * reps + i - 1] = (bench_now_s() - t0) * 1e3;
        }
        qsort(times + split * reps, (size_t)reps, sizeof(double), cmp_double);
    }
    r->resident_ms = times[reps / 2];
    r->split_ms = times[reps + reps / 2];
    r->kv_mib = (double)BATCH * ctx * n_kv * hd * 2 * sizeof(float) / (1 << 20);
    r->n_seq = BATCH;
    r->ctx = ctx;
out:
    if (rc < 0)
        fprintf(stderr, "rkv-bench: attention: %s\n", rkv_strerror(rc));
    for (int i = 0; i < 6; i++)
        if (t[i])
            backend_tensor_free(be, t[i]);
    if (q)
        backend_tensor_free(be, q);
    backend_destroy(be);
    kv_local_destroy(kv);
    free(blocks);
    free(times);
    return rc;
}

struct tail_result {
    double ms, gbps, memcpy_gbps, read_gbps;
    uint32_t ctx, read_threads;
};

/* a parallel read of the pool: item i is the i-th of n slices of words 64-bit words */
struct pool_read {
    const uint64_t *p;
    size_t words;
    uint32_t n;
    uint64_t sink;
};

static void pool_read_chunk(void *v, uint32_t begin, uint32_t end, uint32_t thread)
{
    struct pool_read *r = v;
    const size_t per = (r->words + r->n - 1) / r->n;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (uint32_t k = begin; k < end; k++) {
        const size_t a = (size_t)k * per < r->words ? (size_t)k * per : r->words;
        const size_t e = a + per < r->words ? a + per : r->words;
        size_t i = a;
        for (; i + 4 <= e; i += 4) {
            s0 += r->p[i];
            s1 += r->p[i + 1];
            s2 += r->p[i + 2];
            s3 += r->p[i + 3];
        }
        for (; i < e; i++)
            s0 += r->p[i];
    }
    /* kept, so the reads are not dropped */
    __atomic_fetch_add(&r->sink, s0 + s1 + s2 + s3, __ATOMIC_RELAXED);
}

/* the host's read ceiling for the cpu's attention: bytes at base read by n_th threads at once
 * (the worker's thread pool, a slice each), best of reps, GB/s; 0 when the threads cannot
 * start */
static double pool_read_gbps(const void *base, size_t bytes, uint32_t n_th, int reps)
{
    struct pool *pl;
    if (n_th == 0 || pool_create(&pl, n_th) != 0)
        return 0;
    struct pool_read r = {base, bytes / 8, n_th, 0};
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        double t0 = bench_now_s();
        pool_run(pl, pool_read_chunk, &r, n_th, 1);
        double dt = bench_now_s() - t0;
        best = dt < best ? dt : best;
    }
    pool_destroy(pl);
    return best < 1e30 ? (double)bytes / best / 1e9 : 0;
}

/* what CPU_TAIL (and the split host read) ask of the cpu: one decode row of a llama3-8b-shaped
 * layer (32 query heads over 8 kv heads, d 128, f16 kv) over ctx positions in host blocks, best
 * of reps (128 MiB, past the caches of the hosts measured so far). The ceiling: the same bytes
 * read out of the same pool by the backend's thread count at once; beside it one memcpy (one
 * thread) */
static int run_attn_tail(const struct bench_opts *o, struct tail_result *r, uint32_t threads)
{
    const uint32_t ctx = 32768, B = 256, n_head = 32, n_kv = 8, hd = 128;
    const int reps = o->quick ? 3 : 9;
    struct backend *be = NULL;
    struct kv_layout l;
    struct kv_local *kv = NULL;
    struct be_tensor *t[4] = {0};
    const uint32_t nb = ctx / B;
    struct kv_block_ref *tab = calloc(nb, sizeof(*tab));
    size_t bytes = 0;
    void *copy = NULL;
    int rc = attn_bench_init(o, B, n_kv, hd, KV_F16, 1, nb, &be, &l, &kv);
    if (rc < 0 || !tab)
        goto out;
    const struct kv_pools *p = kv_local_pools(kv);
    bytes = (size_t)nb * kv_block_bytes(&l);
    uint16_t *h = p->base[KV_HOST];
    for (size_t i = 0; i < bytes / 2; i++) /* f16 values in [1, 2): finite, not denormal */
        h[i] = (uint16_t)(0x3c00 | ((i * 2654435761u) >> 22));
    for (uint32_t j = 0; j < nb; j++)
        tab[j] = (struct kv_block_ref){j, KV_HOST};
    struct be_seq seq = {0, 1, ctx - 1, tab, nb};
    int32_t pos = (int32_t)(ctx - 1);
    uint32_t seq_of = 0;
    struct be_batch b = {&seq, 1, 1, &pos, &seq_of};
    const struct be_attn at = {n_head, n_kv, hd, 1.0f / sqrtf((float)hd)};
    uint32_t cols[4] = {n_head * hd, n_head * hd, n_head, n_head};
    rc = backend_set_kv(be, &l, p);
    for (int i = 0; rc == 0 && i < 4; i++)
        rc = backend_tensor_alloc(be, BE_F32, 1, cols[i], &t[i]);
    float qv[32 * 128];
    for (uint32_t i = 0; i < n_head * hd; i++)
        qv[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    if (rc == 0)
        rc = backend_tensor_set(be, t[0], qv, 0, sizeof(qv));
    struct be_partial part = {t[1], t[2], t[3]};
    double best = 1e30, best_copy = 1e30;
    copy = malloc(bytes);
    if (rc == 0 && !copy)
        rc = RKV_ENOMEM;
    for (int i = 0; rc == 0 && i < reps + 1; i++) {
        double t0 = bench_now_s();
        rc = attn_partial_forward(be, &b, 0, KV_HOST, t[0], &at, &part);
        double dt = bench_now_s() - t0;
        if (i > 0 && dt < best) /* the first is a warm-up */
            best = dt;
        t0 = bench_now_s();
        memcpy(copy, p->base[KV_HOST], bytes);
        dt = bench_now_s() - t0;
        if (i > 0 && dt < best_copy)
            best_copy = dt;
    }
    if (rc == 0) {
        r->ctx = ctx;
        r->ms = best * 1e3;
        r->gbps = (double)bytes / best / 1e9;
        r->memcpy_gbps = (double)bytes / best_copy / 1e9;
        r->read_threads = threads;
        r->read_gbps = pool_read_gbps(p->base[KV_HOST], bytes, threads, reps + 1);
        if (r->read_gbps <= 0) {
            fprintf(stderr,
                    "rkv-bench: cannot start %u threads to read the pool (the ceiling); "
                    "try fewer with --threads\n",
                    threads);
            rc = RKV_ENOMEM;
        }
    }
out:
    if (rc < 0)
        fprintf(stderr, "rkv-bench: host-tail attention: %s\n", rkv_strerror(rc));
    for (int i = 0; i < 4; i++)
        if (t[i])
            backend_tensor_free(be, t[i]);
    backend_destroy(be);
    kv_local_destroy(kv);
    free(tab);
    free(copy);
    return rc;
}

/* one weight type's decode matmul (one token) on a matrix past the last-level cache, through the
 * backend on o's threads: weight GB/s of the integer path on avx-512 and on avx2 and of the exact
 * path (dequantized to f32), best of reps; and a 64-token matmul (prefill's shape) on both paths,
 * in multiply-adds per second */
struct kern_result {
    enum be_type type;
    uint32_t n_in, n_out;
    double mib, int512_gbps, int2_gbps, exact_gbps, pf_int_gmacs, pf_exact_gmacs;
};

#define KERN_IN  4096
#define KERN_MIB 96 /* past the L3 of the hosts measured so far */
#define KERN_PF  64

static double time_matmul(struct backend *be, struct be_tensor *y, struct be_tensor *x,
                          struct be_tensor *w, uint32_t n, int reps)
{
    double best = 1e30;
    for (int i = 0; i < reps + 1; i++) {
        double t0 = bench_now_s();
        if (matmul_forward(be, y, x, w, NULL, n) < 0)
            return 0;
        double dt = bench_now_s() - t0;
        if (i > 0 && dt < best) /* the first is a warm-up */
            best = dt;
    }
    return best;
}

static int run_kernel(const struct bench_opts *o, enum be_type t, struct kern_result *r)
{
    const int reps = o->quick ? 3 : 15;
    const size_t rb = be_type_size(t, KERN_IN);
    const uint32_t n_out = (uint32_t)(((size_t)(o->quick ? 16 : KERN_MIB) << 20) / rb + 3) & ~3u;
    struct backend_opts bo = {"cpu", o->threads, 0};
    struct backend *be = NULL;
    struct be_tensor *w = NULL, *x = NULL, *y = NULL;
    char err[256];
    float *row = malloc(sizeof(float) * KERN_PF * KERN_IN);
    uint8_t *enc = malloc(rb);
    int rc = row && enc ? backend_create(&bo, &be, err, sizeof(err)) : RKV_ENOMEM;
    if (rc == 0)
        rc = backend_tensor_alloc(be, t, n_out, KERN_IN, &w);
    if (rc == 0)
        rc = backend_tensor_alloc(be, BE_F32, KERN_PF, KERN_IN, &x);
    if (rc == 0)
        rc = backend_tensor_alloc(be, BE_F32, KERN_PF, n_out, &y);
    if (rc < 0)
        goto out;
    /* one quantized row of random values, repeated: the kernels' speed does not depend on them */
    for (uint32_t i = 0; i < KERN_PF * KERN_IN; i++)
        row[i] = (float)((i * 2654435761u) >> 8) / (float)(1 << 24) - 0.5f;
    quant_quantize_row((uint32_t)t, row, enc, KERN_IN);
    for (uint32_t i = 0; rc == 0 && i < n_out; i++)
        rc = backend_tensor_set(be, w, enc, (size_t)i * rb, rb);
    if (rc == 0)
        rc = backend_tensor_set(be, x, row, 0, sizeof(float) * KERN_PF * KERN_IN);
    if (rc < 0)
        goto out;
    const double bytes = (double)rb * n_out, macs = (double)KERN_PF * KERN_IN * n_out / 4;
    *r = (struct kern_result){t, KERN_IN, n_out, bytes / (1 << 20), 0, 0, 0, 0, 0};
    const uint32_t pf_rows = n_out / 4; /* the prefill shape on a quarter of the rows */
    struct be_tensor wq = *w, yq = *y;
    wq.rows = pf_rows;
    wq.nbytes = wq.row_bytes * pf_rows;
    yq.cols = pf_rows;
    yq.row_bytes = sizeof(float) * pf_rows;
    yq.nbytes = yq.row_bytes * KERN_PF;
    const int q = quant_is_block((uint32_t)t), exact = !cpu_q_int(BE_Q4_0, 1); /* RKV_CPU_EXACT */
    cpu_q_use_exact(0);
    if (q && cpu_q_isa_ok(CPU_ISA_AVX512)) {
        cpu_ops_use_avx512(1);
        r->int512_gbps = bytes / time_matmul(be, y, x, w, 1, reps) / 1e9;
    }
    if (q) {
        cpu_ops_use_avx512(0);
        r->int2_gbps = bytes / time_matmul(be, y, x, w, 1, reps) / 1e9;
        cpu_ops_use_avx512(-1);
        r->pf_int_gmacs = macs / time_matmul(be, &yq, x, &wq, KERN_PF, reps) / 1e9;
    }
    cpu_q_use_exact(1);
    r->exact_gbps = bytes / time_matmul(be, y, x, w, 1, reps) / 1e9;
    r->pf_exact_gmacs = macs / time_matmul(be, &yq, x, &wq, KERN_PF, reps) / 1e9;
    cpu_q_use_exact(exact);
out:
    cpu_ops_use_avx512(-1);
    if (rc < 0)
        fprintf(stderr, "rkv-bench: %s kernels: %s\n", be_type_name(t), rkv_strerror(rc));
    if (y)
        backend_tensor_free(be, y);
    if (x)
        backend_tensor_free(be, x);
    if (w)
        backend_tensor_free(be, w);
    backend_destroy(be);
    free(row);
    free(enc);
    return rc;
}

/* the threads' read ceiling: 128 MiB (past the caches) read by n_th threads at once (the
 * attention tail's measure), the best of reps passes 40 ms apart (other work on a shared host
 * only lowers it), GB/s */
static double read_ceiling_gbps(uint32_t n_th, int reps)
{
    const size_t bytes = (size_t)128 << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf)
        return 0;
    for (size_t i = 0; i < bytes / 8; i++)
        buf[i] = i * 2654435761u;
    double g = 0;
    for (int k = 0; k < reps; k++) {
        g = fmax(g, pool_read_gbps(buf, bytes, n_th, 2));
        usleep(40000);
    }
    free(buf);
    return g;
}

/* every weight type rkv reads, on tiny256 (the tiny shape with rows of whole 256-value blocks)
 * and small; --quick: a smoke run on two tiny models */
static const char *const dtypes[] = {"f32",  "f16",    "bf16",   "q8_0",  "q4_0", "q4_1",
                                     "q5_0", "q5_1",   "q2_k",   "q3_k",  "q4_k", "q5_k",
                                     "q6_k", "iq4_nl", "iq4_xs", "q4_k_m"};
#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))
static const char *const presets[] = {"tiny256", "small"};
static const char *const quick_models[2][2] = {{"tiny", "f32"}, {"tiny-qwen2", "q8_0"}};

static const char *model_preset(const struct bench_opts *o, size_t i)
{
    return o->quick ? quick_models[i][0] : presets[i / N_DTYPES];
}

static const char *model_dtype(const struct bench_opts *o, size_t i)
{
    return o->quick ? quick_models[i][1] : dtypes[i % N_DTYPES];
}

int bench_cpu(const struct bench_opts *o, cJSON *out)
{
    static const enum be_type ktypes[] = {BE_F32,  BE_F16,  BE_BF16, BE_Q8_0,   BE_Q4_0,
                                          BE_Q4_1, BE_Q5_0, BE_Q5_1, BE_Q2_K,   BE_Q3_K,
                                          BE_Q4_K, BE_Q5_K, BE_Q6_K, BE_IQ4_NL, BE_IQ4_XS};
    const size_t n_models = o->quick ? 2 : 2 * N_DTYPES;
    const uint32_t n_prompt = o->quick ? 64 : 512, n_dec = o->quick ? 8 : 64;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t threads = o->threads ? o->threads : (uint32_t)(online > 0 ? online : 1);
    const char *kernels = getenv("RKV_CPU_AVX512") && !strcmp(getenv("RKV_CPU_AVX512"), "0")
                              ? "avx2"
                          : cpu_ops_avx512() ? "avx-512"
                                             : "avx2";
    struct backend *probe = NULL; /* a backend reads RKV_CPU_EXACT as it starts */
    char err[256];
    if (backend_create(&(struct backend_opts){"cpu", 1, 0}, &probe, err, sizeof(err)) == 0)
        backend_destroy(probe);
    const char *qkernels = !cpu_q_int(BE_Q4_0, 1)           ? "exact (dequantized to f32)"
                           : cpu_q_isa() == CPU_ISA_AVX512 ? "avx-512 vnni integer"
                           : cpu_q_isa() == CPU_ISA_AVX2   ? "avx2 integer"
                                                           : "scalar integer";
    double read_gbps = read_ceiling_gbps(threads, o->quick ? 3 : 25);
    cJSON_AddNumberToObject(out, "threads", threads);
    cJSON_AddStringToObject(out, "kernels", kernels);
    cJSON_AddStringToObject(out, "quant_kernels", qkernels);
    cJSON_AddNumberToObject(out, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(out, "decode_steps", n_dec);
    struct run_result res[2 * N_DTYPES];
    for (size_t i = 0; i < n_models; i++) {
        char path[4300];
        int rc = bench_model(o, model_preset(o, i), model_dtype(o, i), path, sizeof(path));
        res[i] = (struct run_result){0};
        if (rc == 0)
            rc = run_model(o, path, n_prompt, n_dec, &res[i]);
        if (rc < 0)
            return rc;
    }
    /* measured before and after the models: the higher */
    read_gbps = fmax(read_gbps, read_ceiling_gbps(threads, o->quick ? 3 : 25));
    cJSON_AddNumberToObject(out, "read_gbps", read_gbps);
    printf("cpu backend, %u threads, %s kernels (matmul, attention), %s dots for block types; %u "
           "threads read %.2f GB/s\n",
           threads, kernels, qkernels, threads, read_gbps);
    printf("decode: one sequence and 8, the bound (the weights and kv a step reads at the read "
           "rate) and the ratio; prefill of %u tokens, and over f32's\n",
           n_prompt);
    printf("%-10s %-6s %13s %6s %12s %9s %9s %11s %6s\n", "model", "dtype", "prefill tok/s",
           "x f32", "decode tok/s", "x8 tok/s", "MiB/step", "bound tok/s", "ratio");
    cJSON *arr = cJSON_AddArrayToObject(out, "models");
    double pf_f32 = 0;
    for (size_t i = 0; i < n_models; i++) {
        const char *preset = model_preset(o, i), *dtype = model_dtype(o, i);
        const struct run_result r = res[i];
        if (i == 0 || strcmp(preset, model_preset(o, i - 1)))
            pf_f32 = 0; /* a new model shape: f32's prefill is its own */
        if (!strcmp(dtype, "f32"))
            pf_f32 = r.prefill_tok_s;
        const double pf_ratio = pf_f32 > 0 ? r.prefill_tok_s / pf_f32 : 0;
        const double bound = read_gbps * 1e9 / ((r.weight_mib + r.kv_mib) * (1 << 20));
        printf("%-10s %-6s %13.1f %6.2f %12.1f %9.1f %9.2f %11.1f %6.2f\n", preset, dtype,
               r.prefill_tok_s, pf_ratio, r.decode_tok_s, r.decode_b8_tok_s,
               r.weight_mib + r.kv_mib, bound, r.decode_tok_s / bound);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "model", preset);
        cJSON_AddStringToObject(m, "dtype", dtype);
        cJSON_AddNumberToObject(m, "prefill_tok_s", r.prefill_tok_s);
        cJSON_AddNumberToObject(m, "prefill_over_f32", pf_ratio);
        cJSON_AddNumberToObject(m, "decode_tok_s", r.decode_tok_s);
        cJSON_AddNumberToObject(m, "decode_batch8_tok_s", r.decode_b8_tok_s);
        cJSON_AddNumberToObject(m, "weight_mib_per_token", r.weight_mib);
        cJSON_AddNumberToObject(m, "kv_mib_per_token", r.kv_mib);
        cJSON_AddNumberToObject(m, "decode_bound_tok_s", bound);
        cJSON_AddNumberToObject(m, "decode_over_bound", r.decode_tok_s / bound);
        cJSON_AddItemToArray(arr, m);
    }
    fflush(stdout);
    /* the paths side by side: integer dots (avx-512, avx2) against dequantized f32 */
    const size_t n_k = o->quick ? 2 : sizeof(ktypes) / sizeof(ktypes[0]);
    cJSON *karr = cJSON_AddArrayToObject(out, "kernels_per_type");
    printf("kernels: decode matmul of 1 token over %u x rows (%s MiB), weight GB/s and the best "
           "over the read rate; prefill %u tokens, G multiply-adds/s; int: 8-bit activations, "
           "exact: dequantized to f32\n",
           KERN_IN, o->quick ? "16" : "96", KERN_PF);
    printf("%-7s %9s %9s %9s %8s %9s %9s %9s\n", "type", "int 512", "int avx2", "exact", "ratio",
           "int/exact", "pf int", "pf exact");
    for (size_t i = 0; i < n_k; i++) {
        const enum be_type t = o->quick ? (i ? BE_Q4_K : BE_Q8_0) : ktypes[i];
        struct kern_result k = {0};
        int rc = run_kernel(o, t, &k);
        if (rc < 0)
            return rc;
        const double best_int = fmax(k.int512_gbps, k.int2_gbps);
        const double best = fmax(best_int, k.exact_gbps);
        char i512[16] = "-", i2[16] = "-", rel[16] = "-", pfi[16] = "-";
        if (k.int2_gbps > 0) { /* the block types */
            snprintf(i512, sizeof(i512), "%.2f", k.int512_gbps);
            snprintf(i2, sizeof(i2), "%.2f", k.int2_gbps);
            snprintf(rel, sizeof(rel), "%.2f", best_int / k.exact_gbps);
            snprintf(pfi, sizeof(pfi), "%.2f", k.pf_int_gmacs);
        }
        printf("%-7s %9s %9s %9.2f %8.2f %9s %9s %9.2f\n", be_type_name(t), i512, i2, k.exact_gbps,
               best / read_gbps, rel, pfi, k.pf_exact_gmacs);
        fflush(stdout);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", be_type_name(t));
        cJSON_AddNumberToObject(m, "n_in", k.n_in);
        cJSON_AddNumberToObject(m, "n_out", k.n_out);
        cJSON_AddNumberToObject(m, "weight_mib", k.mib);
        cJSON_AddNumberToObject(m, "decode_int_avx512_gbps", k.int512_gbps);
        cJSON_AddNumberToObject(m, "decode_int_avx2_gbps", k.int2_gbps);
        cJSON_AddNumberToObject(m, "decode_exact_gbps", k.exact_gbps);
        cJSON_AddNumberToObject(m, "decode_over_read", best / read_gbps);
        cJSON_AddNumberToObject(m, "prefill_int_gmacs", k.pf_int_gmacs);
        cJSON_AddNumberToObject(m, "prefill_exact_gmacs", k.pf_exact_gmacs);
        cJSON_AddItemToArray(karr, m);
    }
    struct attn_result a = {0};
    int rc = run_attention(o, &a);
    if (rc < 0)
        return rc;
    printf("attention, %u seqs x %u ctx (12/4 heads, hd 64, %.0f MiB kv): resident %.3f ms "
           "(%.1f GB/s), 50%% host %.3f ms (x%.2f)\n",
           a.n_seq, a.ctx, a.kv_mib, a.resident_ms,
           a.kv_mib * 1048576.0 / (a.resident_ms * 1e-3) / 1e9, a.split_ms,
           a.split_ms / a.resident_ms);
    cJSON *at = cJSON_AddObjectToObject(out, "attention");
    cJSON_AddNumberToObject(at, "n_seq", a.n_seq);
    cJSON_AddNumberToObject(at, "ctx", a.ctx);
    cJSON_AddNumberToObject(at, "kv_mib", a.kv_mib);
    cJSON_AddNumberToObject(at, "resident_ms", a.resident_ms);
    cJSON_AddNumberToObject(at, "host_half_ms", a.split_ms);
    cJSON_AddNumberToObject(at, "host_half_over_resident", a.split_ms / a.resident_ms);
    struct tail_result tr = {0};
    if ((rc = run_attn_tail(o, &tr, threads)) < 0)
        return rc;
    printf("host-tail attention (CPU_TAIL's work), 1 decode row x %u ctx (32/8 heads, hd 128, f16 "
           "kv): %.3f ms, %.2f GB/s = %.2f of the pool read by %u threads (%.2f GB/s); a "
           "one-thread memcpy %.2f GB/s\n",
           tr.ctx, tr.ms, tr.gbps, tr.gbps / tr.read_gbps, tr.read_threads, tr.read_gbps,
           tr.memcpy_gbps);
    cJSON *ta = cJSON_AddObjectToObject(out, "attention_tail");
    cJSON_AddNumberToObject(ta, "ctx", tr.ctx);
    cJSON_AddNumberToObject(ta, "ms", tr.ms);
    cJSON_AddNumberToObject(ta, "gbps", tr.gbps);
    cJSON_AddNumberToObject(ta, "read_gbps", tr.read_gbps);
    cJSON_AddNumberToObject(ta, "read_threads", tr.read_threads);
    cJSON_AddNumberToObject(ta, "over_read", tr.gbps / tr.read_gbps);
    cJSON_AddNumberToObject(ta, "memcpy_gbps", tr.memcpy_gbps);
    cJSON_AddNumberToObject(ta, "over_memcpy", tr.gbps / tr.memcpy_gbps);
    return 0;
}
