/* forward.c - the llama/qwen2/qwen3/gemma3 forward pass as a flat list of backend ops. */
#include "worker/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

struct fwd {
    struct model *m;
    struct backend *be;
    struct kv_layout layout;
    uint32_t max_tokens, max_seqs;
    /* activations, T = max_tokens */
    struct be_tensor *x;     /* (T, dim) residual stream */
    struct be_tensor *h;     /* (T, dim) normed input of a sub-block */
    struct be_tensor *q;     /* (T, n_head*head_dim) */
    struct be_tensor *k;     /* (T, n_kv_head*head_dim) */
    struct be_tensor *v;     /* (T, n_kv_head*head_dim) */
    struct be_partial dev;   /* o (T, n_head*head_dim), m, l (T, n_head): device blocks */
    struct be_partial host;  /* same shapes: host blocks */
    struct be_tensor *proj;  /* (T, dim) output of wo / w_down */
    struct be_tensor *gate;  /* (T, ffn) */
    struct be_tensor *up;    /* (T, ffn) */
    struct be_tensor *xo;    /* (S, dim) rows whose logits are wanted, S = max_seqs */
    struct be_tensor *logit; /* (S, n_vocab) */
    /* host-side batch description, sized T and S */
    int32_t *ids, *pos;
    uint32_t *seq_of, *rows;
    uint32_t kept; /* rows whose logits fwd_step_keep left on the backend */
    struct be_seq *seqs;
};

int fwd_kv_layout(const struct model *m, uint32_t block_size, enum kv_dtype dtype,
                  struct kv_layout *out)
{
    return kv_layout_init(out, block_size, m->hp.n_layer, m->hp.n_kv_head, m->hp.head_dim, dtype);
}

int fwd_kv_layout_window(const struct model *m, struct kv_layout *l)
{
    return kv_layout_set_window(l, m->hp.n_swa, m->hp.swa_period);
}

void fwd_destroy(struct fwd *f)
{
    if (!f)
        return;
    struct be_tensor *ts[] = {f->x,     f->h,     f->q,      f->k,      f->v,      f->dev.o,
                              f->dev.m, f->dev.l, f->host.o, f->host.m, f->host.l, f->proj,
                              f->gate,  f->up,    f->xo,     f->logit};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        backend_tensor_free(f->be, ts[i]);
    free(f->ids);
    free(f->pos);
    free(f->seq_of);
    free(f->rows);
    free(f->seqs);
    free(f);
}

int fwd_create(struct fwd **out, struct model *m, const struct kv_layout *l,
               const struct kv_pools *pools, uint32_t max_tokens, uint32_t max_seqs)
{
    const struct model_hparams *hp = &m->hp;
    if (max_tokens == 0 || max_seqs == 0 || max_seqs > max_tokens || l->n_layer != hp->n_layer ||
        l->n_kv_head != hp->n_kv_head || l->head_dim != hp->head_dim ||
        (l->n_parts > 1 && (l->n_swa != hp->n_swa || l->swa_period != hp->swa_period)))
        return RKV_EINVAL;
    struct fwd *f = calloc(1, sizeof(*f));
    if (!f)
        return RKV_ENOMEM;
    f->m = m;
    f->be = m->be;
    f->layout = *l;
    f->max_tokens = max_tokens;
    f->max_seqs = max_seqs;
    const uint32_t T = max_tokens, S = max_seqs, qd = hp->n_head * hp->head_dim,
                   kvd = hp->n_kv_head * hp->head_dim;
    struct {
        struct be_tensor **t;
        uint32_t rows, cols;
    } a[] = {
        {&f->x, T, hp->dim},
        {&f->h, T, hp->dim},
        {&f->q, T, qd},
        {&f->k, T, kvd},
        {&f->v, T, kvd},
        {&f->dev.o, T, qd},
        {&f->dev.m, T, hp->n_head},
        {&f->dev.l, T, hp->n_head},
        {&f->host.o, T, qd},
        {&f->host.m, T, hp->n_head},
        {&f->host.l, T, hp->n_head},
        {&f->proj, T, hp->dim},
        {&f->gate, T, hp->ffn},
        {&f->up, T, hp->ffn},
        {&f->xo, S, hp->dim},
        {&f->logit, S, hp->n_vocab},
    };
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(a) / sizeof(a[0]); i++)
        rc = backend_tensor_alloc(f->be, BE_F32, a[i].rows, a[i].cols, a[i].t);
    f->ids = calloc(T, sizeof(int32_t));
    f->pos = calloc(T, sizeof(int32_t));
    f->seq_of = calloc(T, sizeof(uint32_t));
    f->rows = calloc(T, sizeof(uint32_t));
    f->seqs = calloc(S, sizeof(struct be_seq));
    if (rc == 0 && (!f->ids || !f->pos || !f->seq_of || !f->rows || !f->seqs))
        rc = RKV_ENOMEM;
    if (rc == 0)
        rc = backend_set_kv(f->be, l, pools);
    if (rc < 0) {
        fwd_destroy(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* fills the host batch description; 1 when some block of the batch is on
 * the host (else the host pass is skipped: it would be empty). A table holds n_parts
 * entries a position block; a dropped one (KV_REF_NONE) counts nowhere */
static int build_batch(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs,
                       struct be_batch *b)
{
    uint32_t t = 0;
    int any_host = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const struct fwd_seq *q = &seqs[s];
        if (q->n_tokens == 0 || q->n_tokens > f->max_tokens - t || !q->tokens || !q->blocks ||
            q->n_blocks % f->layout.n_parts ||
            (uint64_t)(q->n_blocks / f->layout.n_parts) * f->layout.block_size <
                (uint64_t)q->n_past + q->n_tokens ||
            (uint64_t)q->n_past + q->n_tokens > INT32_MAX)
            return RKV_EINVAL;
        f->seqs[s] = (struct be_seq){t, q->n_tokens, q->n_past, q->blocks, q->n_blocks};
        for (uint32_t i = 0; i < q->n_blocks; i++)
            any_host |= q->blocks[i].residency == KV_HOST && q->blocks[i].index != KV_REF_NONE;
        for (uint32_t i = 0; i < q->n_tokens; i++, t++) {
            f->ids[t] = q->tokens[i];
            f->pos[t] = (int32_t)(q->n_past + i);
            f->seq_of[t] = s;
        }
    }
    *b = (struct be_batch){f->seqs, n_seqs, t, f->pos, f->seq_of};
    return any_host;
}

/* a linear layer: the backend's fused op, else composed from plain ops
 * with the forward's scratch (h: the normed input, proj, up) */
static int fwd_linear(struct fwd *f, const struct be_linear *l, uint32_t T)
{
    struct backend *be = f->be;
    int rc = linear_forward(be, l, T);
    if (rc != 1)
        return rc;
    const struct be_tensor *in = l->in;
    if (l->norm_w) {
        if ((rc = rmsnorm_forward(be, f->h, in, l->norm_w, T, l->eps)) < 0) /* h (T, dim) */
            return rc;
        in = f->h;
    }
    switch (l->mode) {
    case BE_LIN_SET:
        if (l->n_w == 3) /* q, then k and v: one shape */
            return (rc = matmul_forward(be, l->out[0], in, l->w[0], l->bias[0], T)) < 0
                       ? rc
                       : matmul2_forward(be, l->out[1], l->out[2], in, l->w[1], l->w[2], l->bias[1],
                                         l->bias[2], T);
        for (uint32_t i = 0; i < l->n_w; i++)
            if ((rc = matmul_forward(be, l->out[i], in, l->w[i], l->bias[i], T)) < 0)
                return rc;
        return 0;
    case BE_LIN_ADD: /* proj (T, dim) */
        if ((rc = matmul_forward(be, f->proj, in, l->w[0], l->bias[0], T)) < 0)
            return rc;
        return add_forward(be, l->out[0], l->out[0], f->proj, T);
    case BE_LIN_SWIGLU: /* out, up (T, ffn) */
        if ((rc = matmul2_forward(be, l->out[0], f->up, in, l->w[0], l->w[1], NULL, NULL, T)) < 0)
            return rc;
        return silu_mul_forward(be, l->out[0], l->out[0], f->up, T);
    }
    return RKV_EINVAL;
}

/* logits of `n` rows of the residual stream: the final norm and the lm head as one linear
 * (on the cuda backend the streamed kernel with the norm in its prologue at one row), over
 * x itself when the rows are its first n (a decode step), else over the rows gathered */
static int logits_forward(struct fwd *f, const uint32_t *rows, uint32_t n, float *logits)
{
    const struct model *m = f->m;
    struct backend *be = f->be;
    int rc;
    const struct be_tensor *in = f->x;
    uint32_t i = 0;
    while (i < n && rows[i] == i)
        i++;
    if (i < n) {
        if ((rc = get_rows_forward(be, f->xo, f->x, rows, n)) < 0) /* (n, dim) */
            return rc;
        in = f->xo;
    }
    const struct be_linear head = {BE_LIN_SET, in,          m->output_norm, m->hp.norm_eps,
                                   1,          {m->output}, {NULL},         {f->logit}};
    if ((rc = fwd_linear(f, &head, n)) < 0) /* (n, n_vocab) */
        return rc;
    if (!logits)
        return 0; /* they stay on the backend (fwd_step_greedy) */
    if ((rc = backend_sync(be)) < 0)
        return rc;
    return backend_tensor_get(be, f->logit, logits, 0, (size_t)n * m->hp.n_vocab * sizeof(float));
}

/* x += rmsnorm(in . w^T, norm): gemma3's sub-block outputs, normed before the residual add
 * (proj, h (T, dim) the scratch) */
static int fwd_add_normed(struct fwd *f, const struct be_tensor *in, const struct be_tensor *w,
                          const struct be_tensor *norm, uint32_t T)
{
    struct backend *be = f->be;
    int rc;
    if ((rc = matmul_forward(be, f->proj, in, w, NULL, T)) < 0 || /* proj (T, dim) */
        (rc = rmsnorm_forward(be, f->h, f->proj, norm, T, f->m->hp.norm_eps)) < 0)
        return rc;
    return add_forward(be, f->x, f->x, f->h, T);
}

/* the decoder layers of a step over batch b: x (T, dim) in, x out. rope[1] and at[1] are the
 * local layers' (model_layer_local), rope[0] and at[0] every other's */
static int fwd_layers(struct fwd *f, const struct be_batch *b, int any_host,
                      const struct be_rope rope[2], const struct be_attn at[2])
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    struct backend *be = f->be;
    const uint32_t T = b->n_tokens;
    int rc;
#define RUN(call)                                                                                  \
    if ((rc = (call)) < 0)                                                                         \
        return rc;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        const int local = model_layer_local(hp, l);
        const struct be_rope *r = &rope[local];
        const struct be_attn *a = &at[local];
        /* attention: q, k, v = norm(x) . wq, wk, wv; x += attn . wo */
        const struct be_linear qkv = {BE_LIN_SET,
                                      f->x,
                                      L->attn_norm,
                                      hp->norm_eps,
                                      3,
                                      {L->wq, L->wk, L->wv},
                                      {L->bq, L->bk, L->bv},
                                      {f->q, f->k, f->v}};
        RUN(fwd_linear(f, &qkv, T));
        if (L->q_norm) { /* qwen3, gemma3: each head normed before rope */
            RUN(rmsnorm_heads_forward(be, f->q, L->q_norm, T, hp->n_head, hp->norm_eps));
            RUN(rmsnorm_heads_forward(be, f->k, L->k_norm, T, hp->n_kv_head, hp->norm_eps));
        }
        if ((rc = rope_kv_write_forward(be, b, l, f->q, f->k, f->v, a, r)) == 1) {
            RUN(rope_forward(be, f->q, b, hp->n_head, hp->head_dim, r));
            RUN(rope_forward(be, f->k, b, hp->n_kv_head, hp->head_dim, r));
            RUN(kv_write_forward(be, b, l, f->k, f->v));
        } else if (rc < 0)
            return rc;
        /* device blocks and host blocks attend separately, merged by lse */
        RUN(attn_partial_forward(be, b, l, KV_DEVICE, f->q, a, &f->dev)); /* o (T, n_head*hd) */
        if (any_host) {
            RUN(attn_partial_forward(be, b, l, KV_HOST, f->q, a, &f->host));
            RUN(attn_merge_forward(be, &f->dev, &f->host, T, a));
        }
        if (L->post_attn_norm) {
            RUN(fwd_add_normed(f, f->dev.o, L->wo, L->post_attn_norm, T));
        } else {
            const struct be_linear wo = {BE_LIN_ADD, f->dev.o, NULL, 0, 1, {L->wo}, {NULL}, {f->x}};
            RUN(fwd_linear(f, &wo, T));
        }
        if (hp->arch == MODEL_GEMMA3) {
            /* x += norm((gelu(norm(x) . w_gate) * (norm(x) . w_up)) . w_down) */
            const struct be_linear gu = {
                BE_LIN_SET,           f->x,         L->ffn_norm,     hp->norm_eps, 2,
                {L->w_gate, L->w_up}, {NULL, NULL}, {f->gate, f->up}};
            RUN(fwd_linear(f, &gu, T));
            RUN(gelu_mul_forward(be, f->gate, f->gate, f->up, T)); /* gate (T, ffn) */
            RUN(fwd_add_normed(f, f->gate, L->w_down, L->post_ffn_norm, T));
            continue;
        }
        /* feed-forward: x += (silu(norm(x) . w_gate) * (norm(x) . w_up)) . w_down */
        const struct be_linear gu = {BE_LIN_SWIGLU, f->x,     L->ffn_norm,
                                     hp->norm_eps,  2,        {L->w_gate, L->w_up},
                                     {NULL, NULL},  {f->gate}};
        RUN(fwd_linear(f, &gu, T));
        const struct be_linear down = {BE_LIN_ADD, f->gate,     NULL,   0,
                                       1,          {L->w_down}, {NULL}, {f->x}};
        RUN(fwd_linear(f, &down, T));
    }
#undef RUN
    return 0;
}

/* fwd_step, and with ids set fwd_step_greedy: the greedy pick of each sequence's last row
 * on the backend when it can (*used 1), else its logits as fwd_step */
static int fwd_run(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs, int all_logits,
                   float *logits, int32_t *ids, float *logprobs, int *used, int keep)
{
    if (n_seqs == 0 || n_seqs > f->max_seqs)
        return RKV_EINVAL;
    f->kept = 0;
    struct be_batch b;
    int any_host = build_batch(f, seqs, n_seqs, &b);
    if (any_host < 0)
        return any_host;
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    struct backend *be = f->be;
    const uint32_t T = b.n_tokens;
    /* [0] the global layers, [1] the local ones (their own base, unscaled, a window) */
    const struct be_rope rope[2] = {
        {hp->n_rot, hp->rope_base, 1.0f / hp->rope_scale, hp->rope_neox, f->m->rope_freqs,
         f->m->rope_mscale},
        {hp->n_rot, hp->rope_base_swa, 1.0f, hp->rope_neox, f->m->rope_freqs, 1.0f}};
    const struct be_attn at[2] = {
        {hp->n_head, hp->n_kv_head, hp->head_dim, hp->attn_scale, 0},
        {hp->n_head, hp->n_kv_head, hp->head_dim, hp->attn_scale, hp->n_swa}};
    int rc;
#define RUN(call)                                                                                  \
    if ((rc = (call)) < 0)                                                                         \
        goto fail;

    RUN(embed_forward(be, f->x, m->tok_embd, f->ids, T)); /* x (T, dim) */
    if (hp->arch == MODEL_GEMMA3) /* gemma's embeddings are scaled by sqrt(dim) */
        RUN(scale_forward(be, f->x, sqrtf((float)hp->dim), T));
    /* the layers: recorded once and replayed while the batch keeps its shape, where the
     * backend can (graph_begin); a recording that fails runs them again as usual */
    int g = any_host ? 0 : graph_begin_forward(be, &b, &at[0], f);
    if (g < 0) {
        rc = g;
        goto fail;
    }
    if (g != 2) {
        rc = fwd_layers(f, &b, any_host, rope, at);
        if (g == 1) {
            int e = graph_end_forward(be, rc < 0);
            if (e < 0 && rc == 0)
                rc = e;
            else if (e == 1)
                rc = fwd_layers(f, &b, any_host, rope, at);
        }
        if (rc < 0)
            goto fail;
    }
    if (all_logits) {
        /* every token, max_seqs rows at a time */
        for (uint32_t t0 = 0; t0 < T; t0 += f->max_seqs) {
            uint32_t n = T - t0 < f->max_seqs ? T - t0 : f->max_seqs;
            for (uint32_t i = 0; i < n; i++)
                f->rows[i] = t0 + i;
            RUN(logits_forward(f, f->rows, n, logits + (size_t)t0 * hp->n_vocab));
        }
    } else {
        for (uint32_t s = 0; s < n_seqs; s++)
            f->rows[s] = f->seqs[s].tok_off + f->seqs[s].n_tokens - 1;
        RUN(logits_forward(f, f->rows, n_seqs, ids || keep ? NULL : logits));
        f->kept = keep ? n_seqs : 0;
        if (ids) {
            RUN(greedy_forward(be, f->logit, n_seqs, ids, logprobs));
            *used = rc == 0;
            if (!*used) {
                RUN(backend_sync(be));
                RUN(backend_tensor_get(be, f->logit, logits, 0,
                                       (size_t)n_seqs * hp->n_vocab * sizeof(float)));
            }
        }
    }
#undef RUN
    return 0;
fail:
    log_ratelimited(RKV_LOG_ERROR, 1000, 5, "forward: step of %u tokens failed: %s", T,
                    rkv_strerror(rc));
    return rc;
}

int fwd_step(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs, int all_logits,
             float *logits)
{
    return fwd_run(f, seqs, n_seqs, all_logits, logits, NULL, NULL, NULL, 0);
}

int fwd_step_keep(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs)
{
    return fwd_run(f, seqs, n_seqs, 0, NULL, NULL, NULL, NULL, 1);
}

int fwd_sample(struct fwd *f, uint32_t n, const struct sample_dev_row *const *rows,
               struct sample_dev_out *outs, const uint8_t *want, float *logits, int *used)
{
    *used = 0;
    if (n == 0 || n != f->kept)
        return RKV_ESTATE; /* no fwd_step_keep of these rows before */
    struct backend *be = f->be;
    const size_t row = (size_t)f->m->hp.n_vocab * sizeof(float);
    int rc = sample_forward(be, f->logit, n, rows, outs);
    if (rc < 0)
        return rc;
    int all = rc == 1;
    if ((rc = backend_sync(be)) < 0)
        return rc;
    if (all)
        return backend_tensor_get(be, f->logit, logits, 0, n * row);
    *used = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (rows[i] ? outs[i].status == 0 : !want[i])
            continue;
        if ((rc = backend_tensor_get(be, f->logit, (char *)logits + i * row, i * row, row)) < 0)
            return rc;
    }
    return 0;
}

int fwd_step_greedy(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs, float *logits,
                    int32_t *ids, float *logprobs, int *used)
{
    *used = 0;
    return fwd_run(f, seqs, n_seqs, 0, logits, ids, logprobs, used, 0);
}

int fwd_prefill(struct fwd *f, const int32_t *tokens, uint32_t n_tokens, uint32_t n_past,
                const struct kv_block_ref *blocks, uint32_t n_blocks, uint32_t chunk, float *logits)
{
    if (n_tokens == 0 || chunk == 0)
        return RKV_EINVAL;
    if (chunk > f->max_tokens)
        chunk = f->max_tokens;
    for (uint32_t i = 0; i < n_tokens; i += chunk) {
        uint32_t n = n_tokens - i < chunk ? n_tokens - i : chunk;
        struct fwd_seq s = {tokens + i, n, n_past + i, blocks, n_blocks};
        int rc = fwd_step(f, &s, 1, 0, logits);
        if (rc < 0)
            return rc;
    }
    return 0;
}
