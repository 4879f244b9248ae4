/* backend_ops.c - tensor and op entry points: shape checks, then the backend's vtable. */
#include <stdlib.h>

#include "common/err.h"
#include "worker/attn_route.h"
#include "worker/backend.h"
#include "worker/backend_impl.h"

int backend_tensor_alloc(struct backend *be, enum be_type type, uint32_t rows, uint32_t cols,
                         struct be_tensor **out)
{
    if (rows == 0 || cols == 0 || be_type_size(type, cols) == 0)
        return RKV_EINVAL;
    return be->iface->tensor_alloc(be->ctx, type, rows, cols, out);
}

void backend_tensor_free(struct backend *be, struct be_tensor *t)
{
    if (t)
        be->iface->tensor_free(be->ctx, t);
}

int backend_tensor_set(struct backend *be, struct be_tensor *t, const void *src, size_t off,
                       size_t n)
{
    if (off > t->nbytes || n > t->nbytes - off)
        return RKV_ERANGE;
    return be->iface->tensor_set(be->ctx, t, src, off, n);
}

int backend_tensor_get(struct backend *be, const struct be_tensor *t, void *dst, size_t off,
                       size_t n)
{
    if (off > t->nbytes || n > t->nbytes - off)
        return RKV_ERANGE;
    return be->iface->tensor_get(be->ctx, t, dst, off, n);
}

int backend_set_kv(struct backend *be, const struct kv_layout *l, const struct kv_pools *p)
{
    int rc = be->iface->set_kv(be->ctx, l, p);
    if (rc == 0 && be->route)
        rc = attn_route_set_kv(be->route, l, p);
    return rc;
}

/* shape checks shared by every backend, so a bad call fails the same way
 * everywhere */
static int rows_ok(const struct be_tensor *t, uint32_t n, uint32_t cols)
{
    return t && t->type == BE_F32 && n <= t->rows && t->cols == cols;
}

int embed_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *w,
                  const int32_t *ids, uint32_t n)
{
    if (!rows_ok(out, n, w->cols))
        return RKV_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= w->rows)
            return RKV_ERANGE;
    return be->iface->embed(be->ctx, out, w, ids, n);
}

int rmsnorm_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *in,
                    const struct be_tensor *w, uint32_t n, float eps)
{
    if (!rows_ok(out, n, in->cols) || !rows_ok(in, n, in->cols) || !rows_ok(w, 1, in->cols))
        return RKV_EINVAL;
    return be->iface->rmsnorm(be->ctx, out, in, w, n, eps);
}

int matmul_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *in,
                   const struct be_tensor *w, const struct be_tensor *bias, uint32_t n)
{
    if (!rows_ok(in, n, w->cols) || !rows_ok(out, n, w->rows) ||
        (bias && !rows_ok(bias, 1, w->rows)))
        return RKV_EINVAL;
    return be->iface->matmul(be->ctx, out, in, w, bias, n);
}

int matmul2_forward(struct backend *be, struct be_tensor *out0, struct be_tensor *out1,
                    const struct be_tensor *in, const struct be_tensor *w0,
                    const struct be_tensor *w1, const struct be_tensor *bias0,
                    const struct be_tensor *bias1, uint32_t n)
{
    if (be->iface->matmul2 && w0->rows == w1->rows && w0->cols == w1->cols &&
        w0->type == w1->type && rows_ok(in, n, w0->cols) && rows_ok(out0, n, w0->rows) &&
        rows_ok(out1, n, w1->rows) && (!bias0 || rows_ok(bias0, 1, w0->rows)) &&
        (!bias1 || rows_ok(bias1, 1, w1->rows))) {
        int rc = be->iface->matmul2(be->ctx, out0, out1, in, w0, w1, bias0, bias1, n);
        if (rc != 1)
            return rc;
    }
    int rc = matmul_forward(be, out0, in, w0, bias0, n);
    return rc < 0 ? rc : matmul_forward(be, out1, in, w1, bias1, n);
}

int rope_forward(struct backend *be, struct be_tensor *x, const struct be_batch *b,
                 uint32_t n_heads, uint32_t head_dim, const struct be_rope *r)
{
    if (!rows_ok(x, b->n_tokens, n_heads * head_dim) || r->n_rot % 2 || r->n_rot > head_dim)
        return RKV_EINVAL;
    return be->iface->rope(be->ctx, x, b, n_heads, head_dim, r);
}

/* every token's position must fall inside its sequence's block table */
static int batch_ok(const struct be_batch *b)
{
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        if ((uint64_t)q->tok_off + q->n_tokens > b->n_tokens || !q->blocks)
            return 0;
    }
    return 1;
}

int kv_write_forward(struct backend *be, const struct be_batch *b, uint32_t layer,
                     const struct be_tensor *k, const struct be_tensor *v)
{
    if (!batch_ok(b) || !rows_ok(k, b->n_tokens, k->cols) || !rows_ok(v, b->n_tokens, k->cols))
        return RKV_EINVAL;
    return be->iface->kv_write(be->ctx, b, layer, k, v);
}

static int partial_ok(const struct be_partial *p, uint32_t n, const struct be_attn *a)
{
    return rows_ok(p->o, n, a->n_head * a->head_dim) && rows_ok(p->m, n, a->n_head) &&
           rows_ok(p->l, n, a->n_head);
}

int attn_partial_forward(struct backend *be, const struct be_batch *b, uint32_t layer,
                         enum kv_residency residency, const struct be_tensor *q,
                         const struct be_attn *a, const struct be_partial *out)
{
    if (!batch_ok(b) || a->n_kv_head == 0 || a->n_head % a->n_kv_head ||
        !rows_ok(q, b->n_tokens, a->n_head * a->head_dim) || !partial_ok(out, b->n_tokens, a))
        return RKV_EINVAL;
    if (a->window && !be->iface->attn_window)
        return RKV_EUNSUPPORTED;
    return be->iface->attn_partial(be->ctx, b, layer, residency, q, a, out);
}

int attn_merge_forward(struct backend *be, const struct be_partial *a, const struct be_partial *b,
                       uint32_t n, const struct be_attn *at)
{
    if (!partial_ok(a, n, at) || !partial_ok(b, n, at))
        return RKV_EINVAL;
    return be->iface->attn_merge(be->ctx, a, b, n, at);
}

int silu_mul_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *gate,
                     const struct be_tensor *up, uint32_t n)
{
    if (!rows_ok(out, n, gate->cols) || !rows_ok(gate, n, gate->cols) ||
        !rows_ok(up, n, gate->cols))
        return RKV_EINVAL;
    return be->iface->silu_mul(be->ctx, out, gate, up, n);
}

int add_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *a,
                const struct be_tensor *b, uint32_t n)
{
    if (!rows_ok(out, n, a->cols) || !rows_ok(a, n, a->cols) || !rows_ok(b, n, a->cols))
        return RKV_EINVAL;
    return be->iface->add(be->ctx, out, a, b, n);
}

int rmsnorm_heads_forward(struct backend *be, struct be_tensor *x, const struct be_tensor *w,
                          uint32_t n, uint32_t n_heads, float eps)
{
    if (!be->iface->rmsnorm_heads)
        return RKV_EUNSUPPORTED;
    if (n_heads == 0 || !rows_ok(x, n, n_heads * w->cols) || !rows_ok(w, 1, w->cols))
        return RKV_EINVAL;
    return be->iface->rmsnorm_heads(be->ctx, x, w, n, n_heads, eps);
}

int gelu_mul_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *gate,
                     const struct be_tensor *up, uint32_t n)
{
    if (!be->iface->gelu_mul)
        return RKV_EUNSUPPORTED;
    if (!rows_ok(out, n, gate->cols) || !rows_ok(gate, n, gate->cols) ||
        !rows_ok(up, n, gate->cols))
        return RKV_EINVAL;
    return be->iface->gelu_mul(be->ctx, out, gate, up, n);
}

int scale_forward(struct backend *be, struct be_tensor *x, float s, uint32_t n)
{
    if (!be->iface->scale)
        return RKV_EUNSUPPORTED;
    if (!rows_ok(x, n, x->cols))
        return RKV_EINVAL;
    return be->iface->scale(be->ctx, x, s, n);
}

int get_rows_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *in,
                     const uint32_t *rows, uint32_t n)
{
    if (!rows_ok(out, n, in->cols) || in->type != BE_F32)
        return RKV_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (rows[i] >= in->rows)
            return RKV_ERANGE;
    return be->iface->get_rows(be->ctx, out, in, rows, n);
}

int greedy_forward(struct backend *be, const struct be_tensor *logits, uint32_t n, int32_t *ids,
                   float *logprobs)
{
    if (!be->iface->greedy)
        return 1;
    if (!rows_ok(logits, n, logits->cols) || logits->type != BE_F32 || !ids || !logprobs)
        return RKV_EINVAL;
    return be->iface->greedy(be->ctx, logits, n, ids, logprobs);
}

int sample_forward(struct backend *be, const struct be_tensor *logits, uint32_t n,
                   const struct sample_dev_row *const *rows, struct sample_dev_out *outs)
{
    if (!be->iface->sample)
        return 1;
    if (!rows_ok(logits, n, logits->cols) || logits->type != BE_F32 || !rows || !outs)
        return RKV_EINVAL;
    return be->iface->sample(be->ctx, logits, n, rows, outs);
}

int backend_sync(struct backend *be)
{
    return be->iface->sync(be->ctx);
}

int linear_forward(struct backend *be, const struct be_linear *l, uint32_t n)
{
    if (!be->iface->linear)
        return 1;
    if (l->n_w == 0 || l->n_w > BE_LIN_MAX || !l->in ||
        (l->mode == BE_LIN_ADD && (l->n_w != 1 || l->norm_w)) ||
        (l->mode == BE_LIN_SWIGLU && (l->n_w != 2 || l->bias[0] || l->bias[1])))
        return RKV_EINVAL;
    const uint32_t n_in = l->in->cols;
    if (!rows_ok(l->in, n, n_in) || (l->norm_w && !rows_ok(l->norm_w, 1, n_in)))
        return RKV_EINVAL;
    for (uint32_t i = 0; i < l->n_w; i++) {
        const struct be_tensor *w = l->w[i];
        if (!w || w->cols != n_in || (l->bias[i] && !rows_ok(l->bias[i], 1, w->rows)))
            return RKV_EINVAL;
        if (l->mode == BE_LIN_SWIGLU ? w->rows != l->w[0]->rows || !rows_ok(l->out[0], n, w->rows)
                                     : !rows_ok(l->out[i], n, w->rows))
            return RKV_EINVAL;
    }
    return be->iface->linear(be->ctx, l, n);
}

int backend_host_attn_cpu(struct backend *be, int on)
{
    return be->iface->host_attn_cpu ? be->iface->host_attn_cpu(be->ctx, on) : 1;
}

int graph_begin_forward(struct backend *be, const struct be_batch *b, const struct be_attn *a,
                        const void *owner)
{
    return be->iface->graph_begin ? be->iface->graph_begin(be->ctx, b, a, owner) : 0;
}

int graph_end_forward(struct backend *be, int failed)
{
    return be->iface->graph_end ? be->iface->graph_end(be->ctx, failed) : 1;
}

int backend_host_split(struct backend *be, uint32_t pct)
{
    if (pct > 100)
        return RKV_EINVAL;
    return be->iface->host_split ? be->iface->host_split(be->ctx, pct) : 1;
}

int rope_kv_write_forward(struct backend *be, const struct be_batch *b, uint32_t layer,
                          struct be_tensor *q, struct be_tensor *k, const struct be_tensor *v,
                          const struct be_attn *a, const struct be_rope *r)
{
    if (!be->iface->rope_kv_write)
        return 1;
    const uint32_t kvd = a->n_kv_head * a->head_dim;
    if (!batch_ok(b) || !rows_ok(q, b->n_tokens, a->n_head * a->head_dim) ||
        !rows_ok(k, b->n_tokens, kvd) || !rows_ok(v, b->n_tokens, kvd) || r->n_rot % 2 ||
        r->n_rot > a->head_dim)
        return RKV_EINVAL;
    return be->iface->rope_kv_write(be->ctx, b, layer, q, k, v, a, r);
}

void *backend_host_alloc(struct backend *be, size_t bytes)
{
    if (be->iface->host_alloc)
        return be->iface->host_alloc(be->ctx, bytes);
    return malloc(bytes);
}

void backend_host_free(struct backend *be, void *p)
{
    if (!p)
        return;
    if (be->iface->host_free)
        be->iface->host_free(be->ctx, p);
    else
        free(p);
}

void backend_stats(struct backend *be, char *buf, size_t len)
{
    if (len)
        buf[0] = 0;
    if (be->iface->stats && len)
        be->iface->stats(be->ctx, buf, len);
}

size_t backend_scratch_reserve(struct backend *be)
{
    return be->iface->scratch_reserve ? be->iface->scratch_reserve(be->ctx) : 0;
}
