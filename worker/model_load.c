/* model_load.c - model_load_gguf: hyper-parameters and tensors from a GGUF file's metadata. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/quant.h"
#include "worker/model.h"

#define MODEL_ARCHS "llama, qwen2, qwen3, gemma3, phi3"

struct loader {
    const struct gguf_ctx *g;
    const char *file;
    char arch[16];
    char *errbuf;
    size_t errlen;
};

/* <arch>.<key> as u32: required keys fail when absent */
static int get_u32(struct loader *ld, const char *key, int required, uint32_t def, uint32_t *out)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", ld->arch, key);
    int rc = gguf_get_u32(ld->g, full, out);
    if (rc == RKV_ENOTFOUND && !required) {
        *out = def;
        return 0;
    }
    if (rc == RKV_ENOTFOUND)
        snprintf(ld->errbuf, ld->errlen, "%s: metadata key %s is missing", ld->file, full);
    else if (rc < 0)
        snprintf(ld->errbuf, ld->errlen, "%s: metadata key %s is not an unsigned integer", ld->file,
                 full);
    return rc;
}

static int get_f32(struct loader *ld, const char *key, int required, float def, float *out)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", ld->arch, key);
    int rc = gguf_get_f32(ld->g, full, out);
    if (rc == RKV_ENOTFOUND && !required) {
        *out = def;
        return 0;
    }
    if (rc == RKV_ENOTFOUND)
        snprintf(ld->errbuf, ld->errlen, "%s: metadata key %s is missing", ld->file, full);
    else if (rc < 0)
        snprintf(ld->errbuf, ld->errlen, "%s: metadata key %s is not a float", ld->file, full);
    return rc;
}

static int read_hparams(struct loader *ld, struct model_hparams *hp)
{
    struct gguf_str s;
    int rc = gguf_get_str(ld->g, "general.architecture", &s);
    if (rc < 0) {
        snprintf(ld->errbuf, ld->errlen, "%s: metadata key general.architecture is missing",
                 ld->file);
        return RKV_EFORMAT;
    }
    static const struct {
        const char *name;
        enum model_arch arch;
    } archs[] = {{"llama", MODEL_LLAMA},
                 {"qwen2", MODEL_QWEN2},
                 {"qwen3", MODEL_QWEN3},
                 {"gemma3", MODEL_GEMMA3},
                 {"phi3", MODEL_PHI3}};
    /* mixture-of-experts families, named so the refusal says why */
    static const char *const moe[] = {"qwen2moe", "qwen3moe", "mixtral",   "deepseek2",
                                      "dbrx",     "olmoe",    "grok",      "llama4",
                                      "gpt-oss",  "phimoe",   "granitemoe"};
    size_t k = 0;
    while (k < sizeof(archs) / sizeof(archs[0]) &&
           !(s.len == strlen(archs[k].name) && !memcmp(s.ptr, archs[k].name, s.len)))
        k++;
    if (k == sizeof(archs) / sizeof(archs[0])) {
        const char *why = "is not supported by rkv";
        for (size_t j = 0; j < sizeof(moe) / sizeof(moe[0]); j++)
            if (s.len == strlen(moe[j]) && !memcmp(s.ptr, moe[j], s.len))
                why = "is a mixture-of-experts architecture, which is not supported by rkv";
        snprintf(ld->errbuf, ld->errlen, "%s: general.architecture '%.*s' %s (" MODEL_ARCHS ")",
                 ld->file, (int)(s.len > 64 ? 64 : s.len), s.ptr, why);
        return RKV_EUNSUPPORTED;
    }
    hp->arch = archs[k].arch;
    snprintf(ld->arch, sizeof(ld->arch), "%.*s", (int)s.len, s.ptr);
    hp->rope_neox = hp->arch != MODEL_LLAMA;
    uint32_t n_expert = 0;
    if ((rc = get_u32(ld, "expert_count", 0, 0, &n_expert)) < 0)
        return rc;
    if (n_expert > 0) {
        snprintf(ld->errbuf, ld->errlen,
                 "%s: %s.expert_count is %u: mixture-of-experts models are not supported by rkv "
                 "(" MODEL_ARCHS ", dense)",
                 ld->file, ld->arch, n_expert);
        return RKV_EUNSUPPORTED;
    }

    if ((rc = get_u32(ld, "block_count", 1, 0, &hp->n_layer)) < 0 ||
        (rc = get_u32(ld, "embedding_length", 1, 0, &hp->dim)) < 0 ||
        (rc = get_u32(ld, "feed_forward_length", 1, 0, &hp->ffn)) < 0 ||
        (rc = get_u32(ld, "attention.head_count", 1, 0, &hp->n_head)) < 0)
        return rc;
    if (hp->n_head == 0 || hp->dim % hp->n_head) {
        snprintf(ld->errbuf, ld->errlen,
                 "%s: %s.attention.head_count %u does not divide embedding_length %u", ld->file,
                 ld->arch, hp->n_head, hp->dim);
        return RKV_EFORMAT;
    }
    uint32_t hd = hp->dim / hp->n_head, vl;
    if ((rc = get_u32(ld, "attention.head_count_kv", 0, hp->n_head, &hp->n_kv_head)) < 0 ||
        (rc = get_u32(ld, "attention.key_length", 0, hd, &hp->head_dim)) < 0 ||
        (rc = get_u32(ld, "attention.value_length", 0, hp->head_dim, &vl)) < 0 ||
        (rc = get_u32(ld, "rope.dimension_count", 0, hp->head_dim, &hp->n_rot)) < 0 ||
        (rc = get_u32(ld, "context_length", 0, 4096, &hp->n_ctx)) < 0 ||
        (rc = get_f32(ld, "attention.layer_norm_rms_epsilon", 1, 0.0f, &hp->norm_eps)) < 0 ||
        (rc = get_f32(ld, "rope.freq_base", 0, 10000.0f, &hp->rope_base)) < 0)
        return rc;
    if (vl != hp->head_dim) {
        snprintf(ld->errbuf, ld->errlen,
                 "%s: %s.attention.value_length %u differs from key_length %u, which rkv does "
                 "not support",
                 ld->file, ld->arch, vl, hp->head_dim);
        return RKV_EUNSUPPORTED;
    }
    hp->rope_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", ld->arch);
    if (gguf_get_str(ld->g, key, &s) == 0 && !(s.len == 4 && !memcmp(s.ptr, "none", 4))) {
        int yarn = s.len == 4 && !memcmp(s.ptr, "yarn", 4);
        if (!yarn && !(s.len == 6 && !memcmp(s.ptr, "linear", 6))) {
            snprintf(ld->errbuf, ld->errlen,
                     "%s: %s '%.*s' is not supported by rkv (none, linear, yarn)", ld->file, key,
                     (int)(s.len > 64 ? 64 : s.len), s.ptr);
            return RKV_EUNSUPPORTED;
        }
        if (yarn) {
            /* llama.cpp's defaults: the trained context, no extra attention factor, and the
             * 0.1 of YaRN's paper as the magnitude's log multiplier */
            if ((rc = get_f32(ld, "rope.scaling.factor", 1, 0.0f, &hp->yarn_factor)) < 0 ||
                (rc = get_u32(ld, "rope.scaling.original_context_length", 0, hp->n_ctx,
                              &hp->yarn_orig_ctx)) < 0 ||
                (rc = get_f32(ld, "rope.scaling.attn_factor", 0, 1.0f, &hp->yarn_attn_factor)) <
                    0 ||
                (rc = get_f32(ld, "rope.scaling.yarn_log_multiplier", 0, 0.1f, &hp->yarn_log_mul)) <
                    0)
                return rc;
        } else if ((rc = get_f32(ld, "rope.scaling.factor", 0, 1.0f, &hp->rope_scale)) < 0) {
            return rc;
        }
    }
    if (hp->arch == MODEL_GEMMA3) {
        /* llama.cpp's gemma3: five local layers (window, rope base 10k, no scaling) to one
         * global; the scores scaled by query_pre_attn_scalar, which is key_length except for
         * the 27B (62 layers), where it is embedding_length / head_count */
        if ((rc = get_u32(ld, "attention.sliding_window", 1, 0, &hp->n_swa)) < 0)
            return rc;
        hp->swa_period = 6;
        hp->rope_base_swa = 10000.0f;
        hp->attn_scale =
            1.0f / sqrtf((float)(hp->n_layer == 62 ? hp->dim / hp->n_head : hp->head_dim));
    }
    enum gguf_value_type et;
    uint64_t n_tok = 0;
    if (gguf_get_arr_info(ld->g, "tokenizer.ggml.tokens", &et, &n_tok) == 0 && n_tok > 0) {
        hp->n_vocab = (uint32_t)n_tok;
    } else {
        /* no tokenizer: the embedding's row count is the vocabulary */
        const struct gguf_tensor *t = gguf_find_tensor(ld->g, "token_embd.weight");
        hp->n_vocab = t ? (uint32_t)t->ne[1] : 0;
    }
    return model_hparams_check(hp, ld->errbuf, ld->errlen);
}

/* a gguf tensor as a model source; absent tensors stay empty (the caller
 * decides whether that is an error) */
static int find(struct loader *ld, const char *name, struct model_tensor_src *dst)
{
    memset(dst, 0, sizeof(*dst));
    const struct gguf_tensor *t = gguf_find_tensor(ld->g, name);
    if (!t)
        return 0;
    if (!quant_supported(t->type)) {
        snprintf(ld->errbuf, ld->errlen,
                 "%s: tensor %s has type %s, which rkv does not support (" QUANT_SUPPORTED ")",
                 ld->file, name, gguf_type_name(t->type));
        return RKV_EUNSUPPORTED;
    }
    if (t->n_dims > 2 || t->ne[0] > UINT32_MAX || t->ne[1] > UINT32_MAX) {
        snprintf(ld->errbuf, ld->errlen, "%s: tensor %s has %u dimensions, expected at most 2",
                 ld->file, name, t->n_dims);
        return RKV_EFORMAT;
    }
    dst->type = (enum be_type)t->type;
    dst->cols = (uint32_t)t->ne[0];
    dst->rows = (uint32_t)t->ne[1];
    dst->data = t->data;
    return 0;
}

/* rows [r0, r0 + n) of a matrix as a matrix of its own (its rows are whole blocks) */
static struct model_tensor_src rows_of(const struct model_tensor_src *t, uint32_t r0, uint32_t n)
{
    const size_t rb = quant_row_bytes((uint32_t)t->type, t->cols);
    return (struct model_tensor_src){t->type, n, t->cols, (const uint8_t *)t->data + r0 * rb};
}

/* phi3's fused matrices as views: attn_qkv (q, k, v rows one after another) and ffn_up (gate
 * rows, then up rows, as the HF model chunks gate_up_proj); files with the matrices apart load
 * as they are */
static int phi3_split(struct loader *ld, const struct model_hparams *hp, uint32_t i,
                      struct model_layer_src *L)
{
    char name[64];
    struct model_tensor_src qkv;
    snprintf(name, sizeof(name), "blk.%u.attn_qkv.weight", i);
    int rc = find(ld, name, &qkv);
    const uint32_t q = hp->n_head * hp->head_dim, kv = hp->n_kv_head * hp->head_dim;
    if (rc == 0 && !L->wq.data) {
        if (!qkv.data || qkv.rows != q + 2 * kv || qkv.cols != hp->dim) {
            snprintf(ld->errbuf, ld->errlen,
                     "%s: phi3 tensor %s is %s: expected %u rows (q %u, k and v %u each) of %u",
                     ld->file, name, qkv.data ? "the wrong shape" : "missing", q + 2 * kv, q, kv,
                     hp->dim);
            return RKV_EFORMAT;
        }
        L->wq = rows_of(&qkv, 0, q);
        L->wk = rows_of(&qkv, q, kv);
        L->wv = rows_of(&qkv, q + kv, kv);
    }
    if (rc == 0 && !L->w_gate.data) {
        const struct model_tensor_src up = L->w_up;
        if (!up.data || up.rows != 2 * hp->ffn || up.cols != hp->dim) {
            snprintf(ld->errbuf, ld->errlen,
                     "%s: phi3 tensor blk.%u.ffn_up.weight is %s: expected %u rows (gate and up "
                     "%u each) of %u",
                     ld->file, i, up.data ? "the wrong shape" : "missing", 2 * hp->ffn, hp->ffn,
                     hp->dim);
            return RKV_EFORMAT;
        }
        L->w_gate = rows_of(&up, 0, hp->ffn);
        L->w_up = rows_of(&up, hp->ffn, hp->ffn);
    }
    return rc;
}

/* the 128k Phi-3 models' LongRoPE: per-pair frequency divisors for contexts past the original
 * one (rope_factors_long) and short ones within it, and a magnitude on cos and sin. rkv serves
 * the model's whole context, so it takes the long factors at every position, as llama.cpp does
 * with a context longer than the original (HF switches to them past it) */
static int phi3_longrope(struct loader *ld, struct model_hparams *hp, struct model_src *src)
{
    int rc = find(ld, "rope_factors_long.weight", &src->rope_freqs);
    if (rc < 0 || !src->rope_freqs.data)
        return rc;
    uint32_t orig = 0;
    if ((rc = get_u32(ld, "rope.scaling.original_context_length", 0, 4096, &orig)) < 0 ||
        (rc = get_f32(ld, "rope.scaling.attn_factor", 0, 0.0f, &hp->rope_mscale)) < 0)
        return rc;
    if (hp->rope_mscale == 0.0f && orig > 1 && hp->n_ctx > orig) /* the converter's formula */
        hp->rope_mscale = sqrtf(1.0f + logf((float)hp->n_ctx / orig) / logf((float)orig));
    return 0;
}

int model_load_gguf(struct backend *be, const struct gguf_ctx *g, const char *file,
                    struct model **out, char *errbuf, size_t errlen)
{
    struct loader ld = {g, file ? file : "model", "", errbuf, errlen};
    struct model_hparams hp;
    memset(&hp, 0, sizeof(hp));
    int rc = read_hparams(&ld, &hp);
    if (rc < 0)
        return rc;
    /* expert tensors without an expert_count: a mixture of experts all the same */
    if (gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight") ||
        gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight")) {
        snprintf(errbuf, errlen,
                 "%s: the model has expert tensors (blk.0.ffn_gate_inp.weight): "
                 "mixture-of-experts models are not supported by rkv (" MODEL_ARCHS ", dense)",
                 ld.file);
        return RKV_EUNSUPPORTED;
    }
    struct model_src src;
    memset(&src, 0, sizeof(src));
    struct model_layer_src *layers = calloc(hp.n_layer, sizeof(*layers));
    if (!layers)
        return RKV_ENOMEM;
    src.layers = layers;
    rc = find(&ld, "token_embd.weight", &src.tok_embd);
    if (rc == 0)
        rc = find(&ld, "output_norm.weight", &src.output_norm);
    if (rc == 0)
        rc = find(&ld, "output.weight", &src.output);
    if (rc == 0)
        rc = find(&ld, "rope_freqs.weight", &src.rope_freqs);
    static const char *const names[] = {
        "attn_norm.weight",     "attn_q.weight",      "attn_k.weight",
        "attn_v.weight",        "attn_q.bias",        "attn_k.bias",
        "attn_v.bias",          "attn_output.weight", "ffn_norm.weight",
        "ffn_gate.weight",      "ffn_up.weight",      "ffn_down.weight",
        "attn_q_norm.weight",   "attn_k_norm.weight", "post_attention_norm.weight",
        "post_ffw_norm.weight",
    };
    for (uint32_t i = 0; rc == 0 && i < hp.n_layer; i++) {
        struct model_tensor_src *dst[] = {
            &layers[i].attn_norm,
            &layers[i].wq,
            &layers[i].wk,
            &layers[i].wv,
            &layers[i].bq,
            &layers[i].bk,
            &layers[i].bv,
            &layers[i].wo,
            &layers[i].ffn_norm,
            &layers[i].w_gate,
            &layers[i].w_up,
            &layers[i].w_down,
            &layers[i].q_norm,
            &layers[i].k_norm,
            &layers[i].post_attn_norm,
            &layers[i].post_ffn_norm,
        };
        for (size_t j = 0; rc == 0 && j < sizeof(names) / sizeof(names[0]); j++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.%s", i, names[j]);
            rc = find(&ld, name, dst[j]);
        }
    }
    for (uint32_t i = 0; rc == 0 && hp.arch == MODEL_PHI3 && i < hp.n_layer; i++)
        rc = phi3_split(&ld, &hp, i, &layers[i]);
    if (rc == 0 && hp.arch == MODEL_PHI3)
        rc = phi3_longrope(&ld, &hp, &src);
    if (rc == 0) {
        rc = model_create(be, &hp, &src, out, errbuf, errlen);
        /* model_create names tensors without the file: put it in front */
        if (rc < 0 && errbuf && !strncmp(errbuf, "model: ", 7)) {
            char tmp[512];
            snprintf(tmp, sizeof(tmp), "%s: %s", ld.file, errbuf + 7);
            snprintf(errbuf, errlen, "%s", tmp);
        }
    }
    free(layers);
    return rc;
}
