/* cpu_backend.c - the backend vtable on the cpu: plain memory tensors, ops split over a pool. */
#include "worker/cpu/cpu_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "worker/backend_impl.h"
#include "worker/cpu/cpu_ops.h"
#include "worker/cpu/cpu_quant.h"
#include "worker/pool.h"
#include "worker/sample.h"

struct cpu_ctx {
    struct pool *pool;
    float **scratch;       /* (n_threads) per-thread work areas */
    size_t scratch_floats; /* size of each */
    struct kv_layout layout;
    struct kv_pools pools;
    int have_kv;
    float *seg_buf; /* attention segment partials, grown on demand */
    size_t seg_floats;
    struct sampler **smp; /* (n_threads) cpu_sample's scratch samplers, of smp_vocab logits */
    int32_t smp_vocab;
    uint8_t *qx; /* (n, cpu_qx_row_bytes) a matmul's activations quantized, grown on demand */
    size_t qx_bytes;
    /* a layer's view of a step's tables when a position block has several parts */
    struct be_seq *view_seqs;       /* (view_n_seqs) */
    struct kv_block_ref *view_refs; /* (view_n_refs) */
    size_t view_n_seqs, view_n_refs;
};

/* every thread gets at least n floats of scratch; grown on the caller's
 * thread before a job starts */
static int ensure_scratch(struct cpu_ctx *c, size_t n)
{
    if (n <= c->scratch_floats)
        return 0;
    n = (n + 15) & ~(size_t)15;
    for (uint32_t i = 0; i < pool_n_threads(c->pool); i++) {
        free(c->scratch[i]);
        c->scratch[i] = aligned_alloc(64, n * sizeof(float));
        if (!c->scratch[i]) {
            c->scratch_floats = 0;
            return RKV_ENOMEM;
        }
    }
    c->scratch_floats = n;
    return 0;
}

static void cpu_destroy(void *ctx)
{
    struct cpu_ctx *c = ctx;
    if (!c)
        return;
    if (c->scratch)
        for (uint32_t i = 0; i < pool_n_threads(c->pool); i++)
            free(c->scratch[i]);
    free(c->scratch);
    free(c->seg_buf);
    if (c->smp)
        for (uint32_t i = 0; i < pool_n_threads(c->pool); i++)
            sampler_destroy(c->smp[i]);
    free(c->smp);
    free(c->qx);
    free(c->view_seqs);
    free(c->view_refs);
    pool_destroy(c->pool);
    free(c);
}

static int cpu_tensor_alloc(void *ctx, enum be_type type, uint32_t rows, uint32_t cols,
                            struct be_tensor **out)
{
    struct be_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        return RKV_ENOMEM;
    t->type = type;
    t->rows = rows;
    t->cols = cols;
    t->row_bytes = be_type_size(type, cols);
    if (!t->row_bytes && cols) {
        free(t);
        return RKV_EINVAL; /* an unknown type, or a row that is not whole blocks */
    }
    t->nbytes = t->row_bytes * rows;
    t->data = aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63);
    if (!t->data) {
        free(t);
        return RKV_ENOMEM;
    }
    memset(t->data, 0, t->nbytes);
    *out = t;
    return 0;
}

static void cpu_tensor_free(void *ctx, struct be_tensor *t)
{
    free(t->data);
    free(t);
}

static int cpu_tensor_set(void *ctx, struct be_tensor *t, const void *src, size_t off, size_t n)
{
    memcpy((char *)t->data + off, src, n);
    return 0;
}

static int cpu_tensor_get(void *ctx, const struct be_tensor *t, void *dst, size_t off, size_t n)
{
    memcpy(dst, (const char *)t->data + off, n);
    return 0;
}

static int cpu_set_kv(void *ctx, const struct kv_layout *l, const struct kv_pools *p)
{
    struct cpu_ctx *c = ctx;
    c->layout = *l;
    c->pools = *p;
    c->have_kv = 1;
    return 0;
}

static int cpu_embed(void *ctx, struct be_tensor *out, const struct be_tensor *w,
                     const int32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        cpu_dequant_row(w->type, (const char *)w->data + (size_t)ids[i] * w->row_bytes,
                        (float *)out->data + (size_t)i * out->cols, w->cols);
    return 0;
}

/* row-wise elementwise ops, split over rows when there is enough of them */
struct rows_arg {
    struct be_tensor *out;
    const struct be_tensor *a, *b;
    float eps; /* rmsnorm's epsilon; scale's factor */
    /* the gated unit's row (silu_mul, gelu_mul) */
    void (*glu_row)(float *y, const float *g, const float *u, size_t n);
};

/* y (d) = x / sqrt(mean(x^2) + eps) * w; y may be x */
static void rmsnorm_row(float *y, const float *x, const float *w, uint32_t d, float eps)
{
    float ss = cpu_dot(x, x, d) / (float)d;
    float sc = 1.0f / sqrtf(ss + eps);
    for (uint32_t j = 0; j < d; j++)
        y[j] = x[j] * sc * w[j];
}

static void rmsnorm_rows(void *v, uint32_t r0, uint32_t r1, uint32_t thread)
{
    struct rows_arg *ra = v;
    const uint32_t d = ra->a->cols;
    for (uint32_t i = r0; i < r1; i++)
        rmsnorm_row((float *)ra->out->data + (size_t)i * d,
                    (const float *)ra->a->data + (size_t)i * d, ra->b->data, d, ra->eps);
}

/* y = act(gate) * up, a, b the gate and up */
static void glu_rows(void *v, uint32_t r0, uint32_t r1, uint32_t thread)
{
    struct rows_arg *ra = v;
    const size_t c = ra->a->cols;
    const float *g = ra->a->data, *u = ra->b->data;
    float *y = ra->out->data;
    for (size_t r = r0; r < r1; r++)
        ra->glu_row(y + r * c, g + r * c, u + r * c, c);
}

/* rows here are (token, head) pairs: eps, w (1, head_dim), a the tensor in place */
static void rmsnorm_heads_rows(void *v, uint32_t r0, uint32_t r1, uint32_t thread)
{
    struct rows_arg *ra = v;
    const uint32_t d = ra->b->cols;
    for (uint32_t i = r0; i < r1; i++) {
        float *x = (float *)ra->out->data + (size_t)i * d;
        rmsnorm_row(x, x, ra->b->data, d, ra->eps);
    }
}

static void scale_rows(void *v, uint32_t r0, uint32_t r1, uint32_t thread)
{
    struct rows_arg *ra = v;
    const size_t c = ra->out->cols;
    for (size_t r = r0; r < r1; r++)
        cpu_scale((float *)ra->out->data + r * c, ra->eps, c);
}

static void add_rows(void *v, uint32_t r0, uint32_t r1, uint32_t thread)
{
    struct rows_arg *ra = v;
    const size_t c = ra->a->cols, b = r0 * c, e = r1 * c;
    const float *x = ra->a->data, *y = ra->b->data;
    float *z = ra->out->data;
    for (size_t i = b; i < e; i++)
        z[i] = x[i] + y[i];
}

/* rows per chunk: ~32k elements, enough to pay for a hand-off */
static uint32_t rows_grain(uint32_t cols)
{
    return 32768 / (cols ? cols : 1) + 1;
}

static int cpu_rmsnorm(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                       const struct be_tensor *w, uint32_t n, float eps)
{
    struct cpu_ctx *c = ctx;
    struct rows_arg ra = {out, in, w, eps};
    pool_run(c->pool, rmsnorm_rows, &ra, n, rows_grain(in->cols));
    return 0;
}

struct matmul_arg {
    struct cpu_ctx *c;
    float *y;
    const float *x;
    const struct be_tensor *w;
    const float *bias;
    uint32_t n_tok;
    size_t qx_stride; /* bytes of a quantized activation row (the integer path) */
};

static void matmul_chunk(void *v, uint32_t b, uint32_t e, uint32_t thread)
{
    struct matmul_arg *a = v;
    /* items are groups of 4 output rows */
    uint32_t r0 = b * 4, r1 = e * 4 < a->w->rows ? e * 4 : a->w->rows;
    if (a->qx_stride)
        cpu_qmatmul_rows(a->y, a->c->qx, a->qx_stride, a->w->data, a->w->type, a->w->row_bytes,
                         a->bias, a->n_tok, a->w->cols, a->w->rows, r0, r1);
    else
        cpu_matmul_rows(a->y, a->x, a->w->data, a->w->type, a->w->row_bytes, a->bias, a->n_tok,
                        a->w->cols, a->w->rows, r0, r1, a->c->scratch[thread]);
}

/* tokens [b, e) of the matmul's input quantized for its weight type */
static void quantize_chunk(void *v, uint32_t b, uint32_t e, uint32_t thread)
{
    struct matmul_arg *a = v;
    const enum cpu_isa isa = cpu_q_isa();
    for (uint32_t t = b; t < e; t++)
        cpu_qx_quantize(a->w->type, a->x + (size_t)t * a->w->cols, a->w->cols,
                        a->c->qx + (size_t)t * a->qx_stride, isa);
}

static int cpu_matmul(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                      const struct be_tensor *w, const struct be_tensor *bias, uint32_t n)
{
    struct cpu_ctx *c = ctx;
    struct matmul_arg a = {c, out->data, in->data, w, bias ? bias->data : NULL, n, 0};
    if (!cpu_q_int(w->type, n)) { /* f32 sums: 4 weight rows as f32 a thread */
        int rc = ensure_scratch(c, 4 * (size_t)w->cols);
        if (rc < 0)
            return rc;
    } else {
        /* the integer path: every token's row quantized once, then every weight row's dots */
        a.qx_stride = cpu_qx_row_bytes(w->type, w->cols);
        const size_t need = a.qx_stride * (n ? n : 1);
        if (need > c->qx_bytes) {
            free(c->qx);
            c->qx = aligned_alloc(64, need);
            c->qx_bytes = c->qx ? need : 0;
            if (!c->qx)
                return RKV_ENOMEM;
        }
        pool_run(c->pool, quantize_chunk, &a, n, (uint32_t)(65536 / (w->cols ? w->cols : 1)) + 1);
    }
    uint32_t groups = (w->rows + 3) / 4;
    /* enough work per chunk to beat the hand-off: ~64k multiply-adds */
    uint64_t per_group = 4ull * w->cols * (n ? n : 1);
    uint32_t grain = (uint32_t)(65536 / per_group) + 1;
    pool_run(c->pool, matmul_chunk, &a, groups, grain);
    return 0;
}

struct rope_arg {
    struct be_tensor *x;
    const struct be_batch *b;
    uint32_t n_heads, head_dim;
    const struct be_rope *r;
    struct cpu_ctx *c;
};

static void rope_chunk(void *v, uint32_t b, uint32_t e, uint32_t thread)
{
    struct rope_arg *a = v;
    const uint32_t half = a->r->n_rot / 2, hd = a->head_dim;
    float *cs = a->c->scratch[thread]; /* (half) cos then (half) sin */
    float *sn = cs + half;
    const double ms = a->r->mscale > 0.0f ? a->r->mscale : 1.0;
    for (uint32_t t = b; t < e; t++) {
        double p = (double)a->b->pos[t] * a->r->freq_scale;
        for (uint32_t i = 0; i < half; i++) {
            double th = p * pow(a->r->freq_base, -2.0 * i / a->r->n_rot);
            if (a->r->freq_factors)
                th /= a->r->freq_factors[i];
            cs[i] = (float)(cos(th) * ms);
            sn[i] = (float)(sin(th) * ms);
        }
        float *row = (float *)a->x->data + (size_t)t * a->x->cols;
        for (uint32_t h = 0; h < a->n_heads; h++) {
            float *x = row + (size_t)h * hd;
            for (uint32_t i = 0; i < half; i++) {
                /* normal rotates adjacent pairs, neox the two halves */
                uint32_t i0 = a->r->neox ? i : 2 * i, i1 = a->r->neox ? i + half : 2 * i + 1;
                float x0 = x[i0], x1 = x[i1];
                x[i0] = x0 * cs[i] - x1 * sn[i];
                x[i1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

static int cpu_rope(void *ctx, struct be_tensor *x, const struct be_batch *b, uint32_t n_heads,
                    uint32_t head_dim, const struct be_rope *r)
{
    struct cpu_ctx *c = ctx;
    int rc = ensure_scratch(c, r->n_rot);
    if (rc < 0)
        return rc;
    struct rope_arg a = {x, b, n_heads, head_dim, r, c};
    pool_run(c->pool, rope_chunk, &a, b->n_tokens, 16);
    return 0;
}

/* the batch as layer sees it: each table reduced to the layer's part of every position block
 * (kv_layer_view; the batch itself when a position block is one block) */
static int layer_batch(struct cpu_ctx *c, const struct be_batch *b, uint32_t layer,
                       struct be_batch *out)
{
    *out = *b;
    const uint32_t P = c->layout.n_parts;
    if (P == 1)
        return 0;
    size_t n_refs = 0;
    for (uint32_t i = 0; i < b->n_seqs; i++)
        n_refs += b->seqs[i].n_blocks / P;
    if (b->n_seqs > c->view_n_seqs) {
        struct be_seq *v = realloc(c->view_seqs, b->n_seqs * sizeof(*v));
        if (!v)
            return RKV_ENOMEM;
        c->view_seqs = v;
        c->view_n_seqs = b->n_seqs;
    }
    if (n_refs > c->view_n_refs) {
        struct kv_block_ref *v = realloc(c->view_refs, n_refs * sizeof(*v));
        if (!v)
            return RKV_ENOMEM;
        c->view_refs = v;
        c->view_n_refs = n_refs;
    }
    struct kv_block_ref *r = c->view_refs;
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        c->view_seqs[i] = b->seqs[i];
        c->view_seqs[i].blocks = r;
        if (b->seqs[i].n_blocks % P)
            return RKV_EINVAL;
        c->view_seqs[i].n_blocks =
            kv_layer_view(&c->layout, b->seqs[i].blocks, b->seqs[i].n_blocks, layer, r);
        r += c->view_seqs[i].n_blocks;
    }
    out->seqs = c->view_seqs;
    return 0;
}

/* every token's position lies in its sequence's table (a layer's view) and every block it
 * may read is inside its pool; a local layer's blocks before its window may be dropped */
static int check_batch(const struct cpu_ctx *c, const struct be_batch *b, uint32_t layer)
{
    if (!c->have_kv || layer >= c->layout.n_layer)
        return RKV_ESTATE;
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        if (b->seq_of[t] >= b->n_seqs || b->pos[t] < 0)
            return RKV_EINVAL;
        const struct be_seq *s = &b->seqs[b->seq_of[t]];
        if ((uint64_t)b->pos[t] >= (uint64_t)s->n_blocks * c->layout.block_size)
            return RKV_ERANGE;
    }
    const int local = kv_layer_local(&c->layout, layer);
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const struct be_seq *s = &b->seqs[i];
        const uint32_t first = local ? kv_window_first(&c->layout, s->n_past) : 0;
        for (uint32_t j = first; j < s->n_blocks; j++)
            if (!kv_slice_ptr(&c->layout, &c->pools, s->blocks[j], layer, 0))
                return RKV_ERANGE;
    }
    return 0;
}

static int cpu_kv_write(void *ctx, const struct be_batch *batch, uint32_t layer,
                        const struct be_tensor *k, const struct be_tensor *v)
{
    struct cpu_ctx *c = ctx;
    const struct kv_layout *l = &c->layout;
    if (k->cols != l->n_kv_head * l->head_dim)
        return RKV_EINVAL;
    struct be_batch lb, *b = &lb;
    int rc = layer_batch(c, batch, layer, &lb);
    if (rc == 0)
        rc = check_batch(c, b, layer);
    if (rc < 0)
        return rc;
    const size_t es = kv_dtype_size(l->dtype), hd = l->head_dim;
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        const struct be_seq *s = &b->seqs[b->seq_of[t]];
        uint32_t pos = (uint32_t)b->pos[t];
        struct kv_block_ref ref = s->blocks[pos / l->block_size];
        uint32_t off = pos % l->block_size;
        char *K = kv_slice_ptr(l, &c->pools, ref, layer, 0);
        char *V = kv_slice_ptr(l, &c->pools, ref, layer, 1);
        for (uint32_t h = 0; h < l->n_kv_head; h++) {
            size_t dst = ((size_t)h * l->block_size + off) * hd * es;
            const float *kr = (const float *)k->data + (size_t)t * k->cols + h * hd;
            const float *vr = (const float *)v->data + (size_t)t * v->cols + h * hd;
            if (kv_dtype_is_8bit(l->dtype)) {
                kv_row_store(l, K, h, off, kr);
                kv_row_store(l, V, h, off, vr);
                continue;
            }
            cpu_store_kv(l->dtype, K + dst, kr, hd);
            cpu_store_kv(l->dtype, V + dst, vr, hd);
        }
    }
    return 0;
}

/* attention splits each token's context into segments of SEG_POS positions
 * (whole blocks), attended as separate tasks and merged by lse: a long
 * decode uses every thread. the split depends only on positions, never on
 * the thread count or the batch, so results do not either. */
#define SEG_POS 2048

struct attn_arg {
    struct cpu_ctx *c;
    struct cpu_attn_job job;
    const struct be_batch *b;
    const struct be_tensor *q;
    const struct be_partial *out;
    uint32_t seg_blocks; /* blocks per segment */
    uint32_t max_seg;    /* segments of the longest token */
    float *seg_o;        /* (n_tokens, max_seg, n_head*head_dim) when max_seg > 1 */
    float *seg_m;        /* (n_tokens, max_seg, n_head) */
    float *seg_l;        /* (n_tokens, max_seg, n_head) */
};

static uint32_t n_segments(const struct attn_arg *a, uint32_t t)
{
    uint32_t n_blk = (uint32_t)a->b->pos[t] / a->job.layout->block_size + 1;
    return (n_blk + a->seg_blocks - 1) / a->seg_blocks;
}

static void attn_chunk(void *v, uint32_t b, uint32_t e, uint32_t thread)
{
    struct attn_arg *a = v;
    const uint32_t nkv = a->job.a->n_kv_head, H = a->job.a->n_head, qd = H * a->job.a->head_dim;
    for (uint32_t i = b; i < e; i++) {
        /* one task = (token, segment, kv head): the kv head's group of query
         * heads shares each key and value row it loads */
        uint32_t kvh = i % nkv, seg = i / nkv % a->max_seg, t = i / nkv / a->max_seg;
        if (seg >= n_segments(a, t))
            continue;
        const struct be_seq *s = &a->b->seqs[a->b->seq_of[t]];
        uint32_t first = seg * a->seg_blocks;
        uint32_t n = s->n_blocks - first < a->seg_blocks ? s->n_blocks - first : a->seg_blocks;
        float *o, *m, *l;
        if (a->max_seg == 1) {
            o = (float *)a->out->o->data + (size_t)t * a->out->o->cols;
            m = (float *)a->out->m->data + (size_t)t * a->out->m->cols;
            l = (float *)a->out->l->data + (size_t)t * a->out->l->cols;
        } else {
            size_t row = (size_t)t * a->max_seg + seg;
            o = a->seg_o + row * qd;
            m = a->seg_m + row * H;
            l = a->seg_l + row * H;
        }
        cpu_attn_task(&a->job, s->blocks + first, first, n, (uint32_t)a->b->pos[t], kvh,
                      (const float *)a->q->data + (size_t)t * a->q->cols, o, m, l,
                      a->c->scratch[thread]);
    }
}

/* out = merge of a token's segments, in segment order */
static void seg_merge_chunk(void *v, uint32_t b, uint32_t e, uint32_t thread)
{
    struct attn_arg *a = v;
    const uint32_t H = a->job.a->n_head, hd = a->job.a->head_dim;
    for (uint32_t t = b; t < e; t++) {
        uint32_t ns = n_segments(a, t);
        float *o = (float *)a->out->o->data + (size_t)t * a->out->o->cols;
        float *m = (float *)a->out->m->data + (size_t)t * a->out->m->cols;
        float *l = (float *)a->out->l->data + (size_t)t * a->out->l->cols;
        size_t row = (size_t)t * a->max_seg;
        memcpy(o, a->seg_o + row * H * hd, sizeof(float) * H * hd);
        memcpy(m, a->seg_m + row * H, sizeof(float) * H);
        memcpy(l, a->seg_l + row * H, sizeof(float) * H);
        for (uint32_t sg = 1; sg < ns; sg++)
            for (uint32_t h = 0; h < H; h++)
                cpu_lse_merge(o + (size_t)h * hd, &m[h], &l[h],
                              a->seg_o + ((row + sg) * H + h) * hd, a->seg_m[(row + sg) * H + h],
                              a->seg_l[(row + sg) * H + h], hd);
    }
}

static int cpu_attn_partial(void *ctx, const struct be_batch *batch, uint32_t layer,
                            enum kv_residency residency, const struct be_tensor *q,
                            const struct be_attn *at, const struct be_partial *out)
{
    struct cpu_ctx *c = ctx;
    if (at->n_kv_head != c->layout.n_kv_head || at->head_dim != c->layout.head_dim ||
        (kv_layer_local(&c->layout, layer) && at->window != c->layout.n_swa))
        return RKV_EINVAL; /* a local layer's dropped parts are safe only behind its window */
    struct be_batch lb, *b = &lb;
    int rc = layer_batch(c, batch, layer, &lb);
    if (rc == 0)
        rc = check_batch(c, b, layer);
    if (rc == 0)
        rc = ensure_scratch(c, cpu_attn_scratch_floats(&c->layout, at));
    if (rc < 0)
        return rc;
    struct attn_arg a = {c, {&c->layout, &c->pools, at, layer, residency}, b, q, out};
    a.seg_blocks = SEG_POS / c->layout.block_size ? SEG_POS / c->layout.block_size : 1;
    a.max_seg = 1;
    uint64_t keys = 0;
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        keys += (uint64_t)b->pos[t] + 1;
        uint32_t ns = n_segments(&a, t);
        a.max_seg = ns > a.max_seg ? ns : a.max_seg;
    }
    if (a.max_seg > 1) {
        size_t rows = (size_t)b->n_tokens * a.max_seg;
        size_t need = rows * at->n_head * (at->head_dim + 2);
        if (need > c->seg_floats) {
            free(c->seg_buf);
            c->seg_buf = malloc(need * sizeof(float));
            c->seg_floats = c->seg_buf ? need : 0;
            if (!c->seg_buf)
                return RKV_ENOMEM;
        }
        a.seg_o = c->seg_buf;
        a.seg_m = a.seg_o + rows * at->n_head * at->head_dim;
        a.seg_l = a.seg_m + rows * at->n_head;
    }
    /* short contexts are not worth waking threads */
    uint32_t items = b->n_tokens * a.max_seg * at->n_kv_head;
    uint64_t work = keys * at->n_head * at->head_dim;
    pool_run(c->pool, attn_chunk, &a, items, work < 65536 ? items : 1);
    if (a.max_seg > 1)
        pool_run(c->pool, seg_merge_chunk, &a, b->n_tokens, 16);
    return 0;
}

static int cpu_attn_merge(void *ctx, const struct be_partial *a, const struct be_partial *b,
                          uint32_t n, const struct be_attn *at)
{
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < at->n_head; h++) {
            size_t mi = (size_t)t * at->n_head + h;
            size_t oi = mi * at->head_dim;
            cpu_lse_merge((float *)a->o->data + oi, (float *)a->m->data + mi,
                          (float *)a->l->data + mi, (const float *)b->o->data + oi,
                          ((const float *)b->m->data)[mi], ((const float *)b->l->data)[mi],
                          at->head_dim);
        }
    return 0;
}

/* a gated unit's rows (row: silu or gelu of the gate, times up) over the pool */
static int glu(struct cpu_ctx *c, struct be_tensor *out, const struct be_tensor *gate,
               const struct be_tensor *up, uint32_t n,
               void (*row)(float *, const float *, const float *, size_t))
{
    struct rows_arg ra = {out, gate, up, 0, row};
    /* expf / tanhf dominate: a smaller grain */
    pool_run(c->pool, glu_rows, &ra, n, rows_grain(gate->cols) / 4 + 1);
    return 0;
}

static int cpu_silu_mul(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                        const struct be_tensor *up, uint32_t n)
{
    return glu(ctx, out, gate, up, n, cpu_silu_mul_row);
}

static int cpu_gelu_mul(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                        const struct be_tensor *up, uint32_t n)
{
    return glu(ctx, out, gate, up, n, cpu_gelu_mul_row);
}

static int cpu_rmsnorm_heads(void *ctx, struct be_tensor *x, const struct be_tensor *w, uint32_t n,
                             uint32_t n_heads, float eps)
{
    struct cpu_ctx *c = ctx;
    struct rows_arg ra = {x, NULL, w, eps};
    pool_run(c->pool, rmsnorm_heads_rows, &ra, n * n_heads, rows_grain(w->cols));
    return 0;
}

static int cpu_scale_op(void *ctx, struct be_tensor *x, float s, uint32_t n)
{
    struct cpu_ctx *c = ctx;
    struct rows_arg ra = {x, NULL, NULL, s};
    pool_run(c->pool, scale_rows, &ra, n, rows_grain(x->cols));
    return 0;
}

static int cpu_add(void *ctx, struct be_tensor *out, const struct be_tensor *a,
                   const struct be_tensor *b, uint32_t n)
{
    struct cpu_ctx *c = ctx;
    struct rows_arg ra = {out, a, b, 0};
    pool_run(c->pool, add_rows, &ra, n, rows_grain(a->cols));
    return 0;
}

static int cpu_get_rows(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                        const uint32_t *rows, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        memmove((char *)out->data + (size_t)i * out->row_bytes,
                (const char *)in->data + (size_t)rows[i] * in->row_bytes, in->row_bytes);
    return 0;
}

static int cpu_sync(void *ctx)
{
    return 0;
}

static int cpu_greedy(void *ctx, const struct be_tensor *logits, uint32_t n, int32_t *ids,
                      float *logprobs)
{
    (void)ctx;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = sample_greedy((const float *)((const char *)logits->data + i * logits->row_bytes),
                               (int32_t)logits->cols, &logprobs[i]);
    return 0;
}

struct sample_job {
    struct cpu_ctx *c;
    const struct be_tensor *logits;
    const struct sample_dev_row *const *rows;
    struct sample_dev_out *outs;
};

static void sample_rows_chunk(void *arg, uint32_t begin, uint32_t end, uint32_t thread)
{
    struct sample_job *j = arg;
    for (uint32_t i = begin; i < end; i++)
        if (j->rows[i])
            sample_dev_run(
                j->c->smp[thread], j->rows[i],
                (const float *)((const char *)j->logits->data + i * j->logits->row_bytes),
                &j->outs[i]);
}

/* the rows picked here as the worker's samplers would (sample_dev_run: each row from its
 * parameters, penalty ids and uniform), a row a thread */
static int cpu_sample(void *ctx, const struct be_tensor *logits, uint32_t n,
                      const struct sample_dev_row *const *rows, struct sample_dev_out *outs)
{
    struct cpu_ctx *c = ctx;
    const uint32_t nt = pool_n_threads(c->pool);
    if (!c->smp && !(c->smp = calloc(nt, sizeof(*c->smp))))
        return RKV_ENOMEM;
    if (c->smp_vocab != (int32_t)logits->cols) {
        struct sample_params p;
        sample_params_default(&p);
        for (uint32_t i = 0; i < nt; i++) {
            sampler_destroy(c->smp[i]);
            c->smp[i] = NULL;
        }
        c->smp_vocab = 0;
        for (uint32_t i = 0; i < nt; i++) {
            int rc = sampler_create(&c->smp[i], &p, (int32_t)logits->cols);
            if (rc < 0)
                return rc;
        }
        c->smp_vocab = (int32_t)logits->cols;
    }
    struct sample_job j = {c, logits, rows, outs};
    pool_run(c->pool, sample_rows_chunk, &j, n, 1);
    return 0;
}

static const struct backend_i cpu_iface = {
    .destroy = cpu_destroy,
    .tensor_alloc = cpu_tensor_alloc,
    .tensor_free = cpu_tensor_free,
    .tensor_set = cpu_tensor_set,
    .tensor_get = cpu_tensor_get,
    .set_kv = cpu_set_kv,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attn_partial = cpu_attn_partial,
    .attn_merge = cpu_attn_merge,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .sync = cpu_sync,
    .greedy = cpu_greedy,
    .sample = cpu_sample,
    /* every block format of common/quant.h: integer dots on 8-bit activations (cpu_quant.h) */
    .weight_types = (1ull << BE_Q4_0) | (1ull << BE_Q4_1) | (1ull << BE_Q5_0) | (1ull << BE_Q5_1) |
                    (1ull << BE_Q2_K) | (1ull << BE_Q3_K) | (1ull << BE_Q4_K) | (1ull << BE_Q5_K) |
                    (1ull << BE_Q6_K) | (1ull << BE_IQ4_NL) | (1ull << BE_IQ4_XS),
    .rope_freq_factors = 1,
    .rope_mscale = 1,
    .rmsnorm_heads = cpu_rmsnorm_heads,
    .gelu_mul = cpu_gelu_mul,
    .scale = cpu_scale_op,
    .attn_window = 1,
};

int cpu_backend_create(uint32_t n_threads, struct backend **out)
{
    struct cpu_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return RKV_ENOMEM;
    int rc = pool_create(&c->pool, n_threads);
    if (rc < 0)
        goto fail;
    rc = RKV_ENOMEM;
    c->scratch = calloc(pool_n_threads(c->pool), sizeof(float *));
    if (!c->scratch)
        goto fail;
    rc = backend_wrap("cpu", &cpu_iface, c, out);
    if (rc < 0)
        goto fail;
    /* RKV_CPU_AVX512=0 keeps the avx2 kernels (comparisons, benchmarks) */
    const char *isa = getenv("RKV_CPU_AVX512");
    if (isa && (!strcmp(isa, "0") || !strcmp(isa, "1")))
        cpu_ops_use_avx512(isa[0] - '0');
    /* RKV_CPU_EXACT=1 dequantizes every block type to f32 (cpu_quant.h's contract) */
    const char *exact = getenv("RKV_CPU_EXACT");
    if (exact && (!strcmp(exact, "0") || !strcmp(exact, "1")))
        cpu_q_use_exact(exact[0] - '0');
    log_debug("backend: cpu with %u threads, %s kernels, block types %s", pool_n_threads(c->pool),
              cpu_ops_avx512() ? "avx-512" : "avx2",
              cpu_q_int(BE_Q4_0, 1) ? "by integer dots" : "dequantized (RKV_CPU_EXACT=1)");
    return 0;
fail:
    cpu_destroy(c);
    return rc;
}
