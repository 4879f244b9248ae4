/* model.c - checks hyper-parameters and weight shapes, uploads weights to the backend. */
#include "worker/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/quant.h"

int model_hparams_check(struct model_hparams *hp, char *errbuf, size_t errlen)
{
    const char *bad = NULL;
    if (hp->n_layer == 0 || hp->n_layer > 4096)
        bad = "block_count";
    else if (hp->dim == 0 || hp->dim > 65536)
        bad = "embedding_length";
    else if (hp->ffn == 0 || hp->ffn > 262144)
        bad = "feed_forward_length";
    else if (hp->n_head == 0 || hp->n_head > 1024)
        bad = "attention.head_count";
    else if (hp->n_kv_head == 0 || hp->n_head % hp->n_kv_head)
        bad = "attention.head_count_kv (must divide head_count)";
    else if (hp->head_dim == 0 || hp->head_dim > 1024)
        bad = "attention.key_length";
    else if (hp->n_rot == 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        bad = "rope.dimension_count (even, at most the head size)";
    else if (hp->n_vocab == 0 || hp->n_vocab > (1u << 24))
        bad = "vocabulary size";
    else if (!(hp->norm_eps > 0.0f))
        bad = "attention.layer_norm_rms_epsilon";
    else if (!(hp->rope_base > 0.0f))
        bad = "rope.freq_base";
    else if (!(hp->rope_scale > 0.0f))
        bad = "rope.scaling.factor";
    if (bad) {
        snprintf(errbuf, errlen, "model: hyper-parameter %s has an invalid value", bad);
        return RKV_EFORMAT;
    }
    return 0;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    free(m->rope_freqs);
    struct backend *be = m->be;
    if (m->layers) {
        for (uint32_t i = 0; i < m->hp.n_layer; i++) {
            struct model_layer *L = &m->layers[i];
            struct be_tensor *ts[] = {L->attn_norm, L->wq,     L->wk,   L->wv,
                                      L->bq,        L->bk,     L->bv,   L->wo,
                                      L->ffn_norm,  L->w_gate, L->w_up, L->w_down};
            for (size_t j = 0; j < sizeof(ts) / sizeof(ts[0]); j++)
                backend_tensor_free(be, ts[j]);
        }
        free(m->layers);
    }
    if (m->output != m->tok_embd)
        backend_tensor_free(be, m->output);
    backend_tensor_free(be, m->tok_embd);
    backend_tensor_free(be, m->output_norm);
    free(m);
}

/* checks one source tensor and uploads it. optional: absent is fine (*dst = NULL) */
static int upload(struct model *m, const char *name, const struct model_tensor_src *s,
                  uint32_t rows, uint32_t cols, int f32_only, int optional, struct be_tensor **dst,
                  char *errbuf, size_t errlen)
{
    *dst = NULL;
    if (!s->data) {
        if (optional)
            return 0;
        snprintf(errbuf, errlen, "model: tensor %s is missing", name);
        return RKV_ENOTFOUND;
    }
    if (f32_only ? s->type != BE_F32 : !backend_reads_weights(m->be, s->type)) {
        char types[200] = "F32";
        if (!f32_only)
            backend_weight_types(m->be, types, sizeof types);
        int known = quant_supported((uint32_t)s->type);
        snprintf(errbuf, errlen,
                 "model: tensor %s has type %s, which %s (%s)%s", name,
                 known ? be_type_name(s->type) : "unknown",
                 f32_only ? "rkv does not support here"
                 : known  ? "this backend does not run"
                          : "rkv does not support",
                 types, known && !f32_only ? ": use --backend cpu" : "");
        return RKV_EUNSUPPORTED;
    }
    if (s->rows != rows || s->cols != cols) {
        snprintf(errbuf, errlen,
                 "model: tensor %s has shape [%u, %u], expected [%u, %u] (ne0, ne1)", name, s->cols,
                 s->rows, cols, rows);
        return RKV_EFORMAT;
    }
    uint32_t blk = be_type_block(s->type);
    if (cols % blk) {
        snprintf(errbuf, errlen,
                 "model: tensor %s is %s with a row of %u values, not a multiple of its block "
                 "of %u",
                 name, be_type_name(s->type), cols, blk);
        return RKV_EFORMAT;
    }
    size_t bad;
    if (quant_row_bad_scale((uint32_t)s->type, s->data, (size_t)rows * cols, &bad)) {
        snprintf(errbuf, errlen,
                 "model: tensor %s (%s) has a NaN or infinite scale in block %zu (row %zu): the "
                 "file is damaged; download or convert it again",
                 name, be_type_name(s->type), bad, bad * blk / cols);
        return RKV_EFORMAT;
    }
    int rc = backend_tensor_alloc(m->be, s->type, rows, cols, dst);
    if (rc == 0)
        rc = backend_tensor_set(m->be, *dst, s->data, 0, be_type_size(s->type, cols) * rows);
    if (rc < 0) {
        snprintf(errbuf, errlen, "model: cannot upload tensor %s: %s", name, rkv_strerror(rc));
        return rc;
    }
    m->weight_bytes += be_type_size(s->type, cols) * rows;
    return 0;
}

/* llama3's rope scaling: n_rot/2 positive factors, each dividing one pair's frequency, kept on
 * the host for the rope op */
static int take_rope_freqs(struct model *m, const struct model_tensor_src *s, char *errbuf,
                           size_t errlen)
{
    const uint32_t half = m->hp.n_rot / 2;
    if (s->type != BE_F32 || s->rows != 1 || s->cols != half) {
        snprintf(errbuf, errlen,
                 "model: tensor rope_freqs.weight is %s [%u, %u], expected F32 [%u] (half the "
                 "rotated dims)",
                 be_type_name(s->type), s->cols, s->rows, half);
        return RKV_EFORMAT;
    }
    if (!backend_rope_freq_factors(m->be)) {
        snprintf(errbuf, errlen,
                 "model: the %s backend does not apply rope_freqs.weight (llama 3.1 rope "
                 "scaling) yet: use --backend cpu",
                 backend_name(m->be));
        return RKV_EUNSUPPORTED;
    }
    m->rope_freqs = malloc(half * sizeof(float));
    if (!m->rope_freqs)
        return RKV_ENOMEM;
    memcpy(m->rope_freqs, s->data, half * sizeof(float));
    for (uint32_t i = 0; i < half; i++)
        if (!(m->rope_freqs[i] > 0.0f) || !isfinite(m->rope_freqs[i])) {
            snprintf(errbuf, errlen,
                     "model: rope_freqs.weight[%u] is %g; each factor must be finite and above 0",
                     i, (double)m->rope_freqs[i]);
            return RKV_EFORMAT;
        }
    return 0;
}

int model_create(struct backend *be, const struct model_hparams *hp, const struct model_src *src,
                 struct model **out, char *errbuf, size_t errlen)
{
    struct model_hparams h = *hp;
    int rc = model_hparams_check(&h, errbuf, errlen);
    if (rc < 0)
        return rc;
    struct model *m = calloc(1, sizeof(*m));
    if (!m)
        return RKV_ENOMEM;
    m->hp = h;
    m->be = be;
    m->layers = calloc(h.n_layer, sizeof(*m->layers));
    if (!m->layers) {
        free(m);
        return RKV_ENOMEM;
    }
    const uint32_t qd = h.n_head * h.head_dim, kvd = h.n_kv_head * h.head_dim;
    rc = upload(m, "token_embd.weight", &src->tok_embd, h.n_vocab, h.dim, 0, 0, &m->tok_embd,
                errbuf, errlen);
    if (rc == 0)
        rc = upload(m, "output_norm.weight", &src->output_norm, 1, h.dim, 1, 0, &m->output_norm,
                    errbuf, errlen);
    if (rc == 0)
        rc = upload(m, "output.weight", &src->output, h.n_vocab, h.dim, 0, 1, &m->output, errbuf,
                    errlen);
    if (rc == 0 && !m->output)
        m->output = m->tok_embd; /* tied embeddings */
    if (rc == 0 && src->rope_freqs.data)
        rc = take_rope_freqs(m, &src->rope_freqs, errbuf, errlen);
    for (uint32_t i = 0; rc == 0 && i < h.n_layer; i++) {
        const struct model_layer_src *s = &src->layers[i];
        struct model_layer *L = &m->layers[i];
        struct {
            const char *name;
            const struct model_tensor_src *src;
            uint32_t rows, cols;
            int f32_only, optional;
            struct be_tensor **dst;
        } t[] = {
            {"attn_norm.weight", &s->attn_norm, 1, h.dim, 1, 0, &L->attn_norm},
            {"attn_q.weight", &s->wq, qd, h.dim, 0, 0, &L->wq},
            {"attn_k.weight", &s->wk, kvd, h.dim, 0, 0, &L->wk},
            {"attn_v.weight", &s->wv, kvd, h.dim, 0, 0, &L->wv},
            {"attn_q.bias", &s->bq, 1, qd, 1, 1, &L->bq},
            {"attn_k.bias", &s->bk, 1, kvd, 1, 1, &L->bk},
            {"attn_v.bias", &s->bv, 1, kvd, 1, 1, &L->bv},
            {"attn_output.weight", &s->wo, h.dim, qd, 0, 0, &L->wo},
            {"ffn_norm.weight", &s->ffn_norm, 1, h.dim, 1, 0, &L->ffn_norm},
            {"ffn_gate.weight", &s->w_gate, h.ffn, h.dim, 0, 0, &L->w_gate},
            {"ffn_up.weight", &s->w_up, h.ffn, h.dim, 0, 0, &L->w_up},
            {"ffn_down.weight", &s->w_down, h.dim, h.ffn, 0, 0, &L->w_down},
        };
        for (size_t j = 0; rc == 0 && j < sizeof(t) / sizeof(t[0]); j++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.%s", i, t[j].name);
            rc = upload(m, name, t[j].src, t[j].rows, t[j].cols, t[j].f32_only, t[j].optional,
                        t[j].dst, errbuf, errlen);
        }
    }
    if (rc < 0) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}
