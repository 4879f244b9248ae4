/* model.c - checks hyper-parameters and weight shapes, uploads weights to the backend. */
#include "worker/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/quant.h"

const char *model_arch_name(enum model_arch a)
{
    switch (a) {
    case MODEL_LLAMA: return "llama";
    case MODEL_QWEN2: return "qwen2";
    case MODEL_QWEN3: return "qwen3";
    case MODEL_GEMMA3: return "gemma3";
    case MODEL_PHI3: return "phi3";
    }
    return "unknown";
}

int model_layer_local(const struct model_hparams *hp, uint32_t l)
{
    return hp->n_swa && l % hp->swa_period != hp->swa_period - 1;
}

int model_hparams_check(struct model_hparams *hp, char *errbuf, size_t errlen)
{
    const char *bad = NULL;
    if (hp->attn_scale == 0.0f && hp->head_dim)
        hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
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
    else if (hp->yarn_factor != 0.0f &&
             (!(hp->yarn_factor >= 1.0f) || !isfinite(hp->yarn_factor) || !hp->yarn_orig_ctx ||
              !(hp->yarn_attn_factor > 0.0f) || !isfinite(hp->yarn_attn_factor) ||
              !(hp->yarn_log_mul >= 0.0f) || !isfinite(hp->yarn_log_mul)))
        bad = "rope.scaling.* (yarn: factor >= 1, original_context_length, attn_factor > 0)";
    else if (!(hp->rope_mscale >= 0.0f) || !isfinite(hp->rope_mscale))
        bad = "rope.scaling.attn_factor";
    else if (!(hp->attn_scale > 0.0f) || !isfinite(hp->attn_scale))
        bad = "attention scale";
    else if (hp->n_swa && (hp->swa_period == 0 || !(hp->rope_base_swa > 0.0f)))
        bad = "attention.sliding_window (its layer pattern or rope base)";
    if (bad) {
        snprintf(errbuf, errlen, "model: hyper-parameter %s has an invalid value", bad);
        return RKV_EFORMAT;
    }
    return 0;
}

void model_destroy(struct model *m)
{
    if (!m)
        return;
    free(m->rope_freqs);
    struct backend *be = m->be;
    if (m->layers) {
        for (uint32_t i = 0; i < m->hp.n_layer; i++) {
            struct model_layer *L = &m->layers[i];
            struct be_tensor *ts[] = {
                L->attn_norm,    L->wq,     L->wk,     L->wv,       L->bq,
                L->bk,           L->bv,     L->wo,     L->ffn_norm, L->w_gate,
                L->w_up,         L->w_down, L->q_norm, L->k_norm,   L->post_attn_norm,
                L->post_ffn_norm};
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
        snprintf(errbuf, errlen, "model: tensor %s has type %s, which %s (%s)%s", name,
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
                 "model: the rope's frequency factors (rope_freqs.weight, or a phi3's "
                 "rope_factors_long.weight) are %s [%u, %u], expected F32 [%u] (half the "
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

/* llama.cpp's YaRN correction dim: the pair whose wavelength turns n_rot_turns times over the
 * original context */
static double yarn_corr_dim(uint32_t n_rot, uint32_t orig_ctx, double n_turns, double base)
{
    return n_rot * log(orig_ctx / (n_turns * 2 * M_PI)) / (2 * log(base));
}

/* YaRN as per-pair divisors of the frequency: pairs that turn more than beta_fast = 32 times over
 * the original context keep theirs (extrapolate), pairs turning less than beta_slow = 1 time
 * are divided by the factor (interpolate), a linear ramp between; plus the magnitude scale
 * attn_factor * (1 + log_mul ln(factor)) that multiplies cos and sin, as llama.cpp's rope_yarn
 * with ext_factor 1 */
static int take_yarn(struct model *m, char *errbuf, size_t errlen)
{
    const struct model_hparams *hp = &m->hp;
    const uint32_t half = hp->n_rot / 2;
    if (hp->n_swa) {
        snprintf(errbuf, errlen,
                 "model: yarn rope scaling on a model with sliding-window layers is not "
                 "supported by rkv");
        return RKV_EUNSUPPORTED;
    }
    if (!backend_rope_freq_factors(m->be) || !backend_rope_mscale(m->be)) {
        snprintf(errbuf, errlen,
                 "model: the %s backend does not apply yarn rope scaling (rope.scaling.type "
                 "yarn) yet: use --backend cpu",
                 backend_name(m->be));
        return RKV_EUNSUPPORTED;
    }
    if (!m->rope_freqs) {
        m->rope_freqs = malloc(half * sizeof(float));
        if (!m->rope_freqs)
            return RKV_ENOMEM;
        for (uint32_t i = 0; i < half; i++)
            m->rope_freqs[i] = 1.0f;
    }
    double lo = floor(yarn_corr_dim(hp->n_rot, hp->yarn_orig_ctx, 32.0, hp->rope_base));
    double hi = ceil(yarn_corr_dim(hp->n_rot, hp->yarn_orig_ctx, 1.0, hp->rope_base));
    lo = lo > 0 ? lo : 0;
    hi = hi < hp->n_rot - 1 ? hi : hp->n_rot - 1;
    const double factor = hp->yarn_factor;
    for (uint32_t i = 0; i < half; i++) {
        double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
        double extrap = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y); /* 1: keep the frequency */
        /* theta = theta_i / factor * (1 - extrap) + theta_i * extrap */
        m->rope_freqs[i] = (float)(m->rope_freqs[i] / ((1.0 - extrap) / factor + extrap));
    }
    m->rope_mscale = (float)(hp->yarn_attn_factor * (1.0 + hp->yarn_log_mul * log(factor)));
    return 0;
}

/* the optional backend ops an architecture runs on (BE_NEED_*) */
static unsigned arch_needs(const struct model_hparams *hp)
{
    switch (hp->arch) {
    case MODEL_QWEN3: return BE_NEED_HEAD_NORM;
    case MODEL_GEMMA3:
        return BE_NEED_HEAD_NORM | BE_NEED_GELU | BE_NEED_SCALE |
               (hp->n_swa ? BE_NEED_ATTN_WINDOW : 0);
    default: return 0;
    }
}

int model_create(struct backend *be, const struct model_hparams *hp, const struct model_src *src,
                 struct model **out, char *errbuf, size_t errlen)
{
    struct model_hparams h = *hp;
    int rc = model_hparams_check(&h, errbuf, errlen);
    if (rc < 0)
        return rc;
    const char *op = backend_missing_op(be, arch_needs(&h));
    if (op) {
        snprintf(errbuf, errlen,
                 "model: the %s backend does not run %s models yet (it has no %s op): use "
                 "--backend cpu",
                 backend_name(be), model_arch_name(h.arch), op);
        return RKV_EUNSUPPORTED;
    }
    const int qk_norm = h.arch == MODEL_QWEN3 || h.arch == MODEL_GEMMA3,
              post_norm = h.arch == MODEL_GEMMA3;
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
    m->rope_mscale = h.rope_mscale > 0.0f ? h.rope_mscale : 1.0f;
    if (rc == 0 && m->rope_mscale != 1.0f && !backend_rope_mscale(be)) {
        snprintf(errbuf, errlen,
                 "model: the %s backend does not scale the rope's magnitude "
                 "(rope.scaling.attn_factor) yet: use --backend cpu",
                 backend_name(be));
        rc = RKV_EUNSUPPORTED;
    }
    if (rc == 0 && h.yarn_factor != 0.0f)
        rc = take_yarn(m, errbuf, errlen);
    for (uint32_t i = 0; rc == 0 && i < h.n_layer; i++) {
        const struct model_layer_src *s = &src->layers[i];
        struct model_layer *L = &m->layers[i];
        struct {
            const char *name;
            const struct model_tensor_src *src;
            uint32_t rows, cols;
            int f32_only, optional;
            struct be_tensor **dst;
            int use; /* the architecture has this tensor */
        } t[] = {
            {"attn_norm.weight", &s->attn_norm, 1, h.dim, 1, 0, &L->attn_norm, 1},
            {"attn_q.weight", &s->wq, qd, h.dim, 0, 0, &L->wq, 1},
            {"attn_k.weight", &s->wk, kvd, h.dim, 0, 0, &L->wk, 1},
            {"attn_v.weight", &s->wv, kvd, h.dim, 0, 0, &L->wv, 1},
            {"attn_q.bias", &s->bq, 1, qd, 1, 1, &L->bq, 1},
            {"attn_k.bias", &s->bk, 1, kvd, 1, 1, &L->bk, 1},
            {"attn_v.bias", &s->bv, 1, kvd, 1, 1, &L->bv, 1},
            {"attn_output.weight", &s->wo, h.dim, qd, 0, 0, &L->wo, 1},
            {"ffn_norm.weight", &s->ffn_norm, 1, h.dim, 1, 0, &L->ffn_norm, 1},
            {"ffn_gate.weight", &s->w_gate, h.ffn, h.dim, 0, 0, &L->w_gate, 1},
            {"ffn_up.weight", &s->w_up, h.ffn, h.dim, 0, 0, &L->w_up, 1},
            {"ffn_down.weight", &s->w_down, h.dim, h.ffn, 0, 0, &L->w_down, 1},
            {"attn_q_norm.weight", &s->q_norm, 1, h.head_dim, 1, 0, &L->q_norm, qk_norm},
            {"attn_k_norm.weight", &s->k_norm, 1, h.head_dim, 1, 0, &L->k_norm, qk_norm},
            {"post_attention_norm.weight", &s->post_attn_norm, 1, h.dim, 1, 0, &L->post_attn_norm,
             post_norm},
            {"post_ffw_norm.weight", &s->post_ffn_norm, 1, h.dim, 1, 0, &L->post_ffn_norm,
             post_norm},
        };
        for (size_t j = 0; rc == 0 && j < sizeof(t) / sizeof(t[0]); j++) {
            if (!t[j].use)
                continue;
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.%s", i, t[j].name);
            rc = upload(m, name, t[j].src, t[j].rows, t[j].cols, t[j].f32_only, t[j].optional,
                        t[j].dst, errbuf, errlen);
        }
    }
    if (rc < 0) {
        model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}
