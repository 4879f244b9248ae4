/* model.h - model hyper-parameters and weights on a backend, loaded from GGUF or memory. */
#ifndef RKV_MODEL_H
#define RKV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/gguf.h"
#include "worker/backend.h"

enum model_arch {
    MODEL_LLAMA = 0,  /* normal rope */
    MODEL_QWEN2 = 1,  /* neox rope, bias on q, k, v */
    MODEL_QWEN3 = 2,  /* neox rope, rmsnorm of each q and k head before rope */
    MODEL_GEMMA3 = 3, /* qwen3's q/k norm, embeddings by sqrt(dim), GeGLU, post-attention and
                       * post-ffn norms, local (sliding window) and global layers */
    MODEL_PHI3 = 4,   /* llama's layers with neox rope; the file fuses q/k/v (attn_qkv) and
                       * gate/up (ffn_up), which the loader splits into views */
};
/* "llama", "qwen2", "qwen3", "gemma3", "phi3" */
const char *model_arch_name(enum model_arch a);

struct model_hparams {
    enum model_arch arch;
    uint32_t n_layer;
    uint32_t dim; /* embedding_length */
    uint32_t ffn; /* feed_forward_length */
    uint32_t n_head;
    uint32_t n_kv_head;
    uint32_t head_dim; /* attention.key_length (= value_length) */
    uint32_t n_rot;    /* rope.dimension_count */
    uint32_t n_vocab;
    uint32_t n_ctx; /* context_length */
    float norm_eps;
    float rope_base;
    float rope_scale; /* linear scaling factor; 1 = none */
    /* YaRN (rope.scaling.type yarn): the factor (0 = no YaRN), the context the model was
     * trained at, the attention factor and the log multiplier of its magnitude scale */
    float yarn_factor;
    uint32_t yarn_orig_ctx;
    float yarn_attn_factor;
    float yarn_log_mul;
    int rope_neox;
    float attn_scale; /* the scores' scale; 0 = 1/sqrt(head_dim) (model_hparams_check fills it) */
    /* local layers (gemma3): a sliding window of n_swa positions and their own rope base
     * (linear scaling applies to the global layers only); layer l is global when
     * l % swa_period == swa_period - 1. n_swa 0: every layer global */
    uint32_t n_swa;
    uint32_t swa_period;
    float rope_base_swa;
    /* the magnitude of every rotation, multiplying cos and sin (phi3's LongRoPE attention
     * factor; YaRN computes its own); 0 = 1 */
    float rope_mscale;
};

/* 1 when layer l of hp attends through a sliding window */
int model_layer_local(const struct model_hparams *hp, uint32_t l);

/* a weight in host memory, in its file type: rows of cols values */
struct model_tensor_src {
    enum be_type type;
    uint32_t rows, cols;
    const void *data; /* NULL = absent (biases, tied output) */
};

struct model_layer_src {
    struct model_tensor_src attn_norm, wq, wk, wv, bq, bk, bv, wo;
    struct model_tensor_src ffn_norm, w_gate, w_up, w_down;
    struct model_tensor_src q_norm, k_norm;                /* qwen3, gemma3 */
    struct model_tensor_src post_attn_norm, post_ffn_norm; /* gemma3 */
};

struct model_src {
    struct model_tensor_src tok_embd, output_norm, output;
    struct model_tensor_src rope_freqs;   /* (1, n_rot/2) f32, llama3 rope scaling, or absent */
    const struct model_layer_src *layers; /* (n_layer) */
};

/* the weights on the backend, shapes as (rows, cols) = (n_out, n_in) */
struct model_layer {
    struct be_tensor *attn_norm;      /* (1, dim) f32 */
    struct be_tensor *wq;             /* (n_head*head_dim, dim) */
    struct be_tensor *wk;             /* (n_kv_head*head_dim, dim) */
    struct be_tensor *wv;             /* (n_kv_head*head_dim, dim) */
    struct be_tensor *bq;             /* (1, n_head*head_dim) f32 or NULL */
    struct be_tensor *bk;             /* (1, n_kv_head*head_dim) f32 or NULL */
    struct be_tensor *bv;             /* (1, n_kv_head*head_dim) f32 or NULL */
    struct be_tensor *wo;             /* (dim, n_head*head_dim) */
    struct be_tensor *ffn_norm;       /* (1, dim) f32 */
    struct be_tensor *w_gate;         /* (ffn, dim) */
    struct be_tensor *w_up;           /* (ffn, dim) */
    struct be_tensor *w_down;         /* (dim, ffn) */
    struct be_tensor *q_norm;         /* (1, head_dim) f32 (qwen3, gemma3) or NULL */
    struct be_tensor *k_norm;         /* (1, head_dim) f32 (qwen3, gemma3) or NULL */
    struct be_tensor *post_attn_norm; /* (1, dim) f32 (gemma3) or NULL */
    struct be_tensor *post_ffn_norm;  /* (1, dim) f32 (gemma3) or NULL */
};

struct model {
    struct model_hparams hp;
    struct backend *be;
    struct be_tensor *tok_embd;    /* (n_vocab, dim) */
    struct be_tensor *output_norm; /* (1, dim) f32 */
    struct be_tensor *output;      /* (n_vocab, dim); == tok_embd when tied */
    struct model_layer *layers;    /* (n_layer) */
    float *rope_freqs;             /* (n_rot/2) host copy (times YaRN's factors), or NULL */
    float rope_mscale;             /* the global layers' be_rope.mscale; 1 = none */
    size_t weight_bytes;
};

/* checks hp and every tensor's type and shape, uploads them. errors name
 * the tensor ("blk.3.attn_q.weight") and what was expected. */
int model_create(struct backend *be, const struct model_hparams *hp, const struct model_src *src,
                 struct model **out, char *errbuf, size_t errlen);
/* reads hyper-parameters and tensors per docs/model-format.md; `file` names
 * the model in messages */
int model_load_gguf(struct backend *be, const struct gguf_ctx *g, const char *file,
                    struct model **out, char *errbuf, size_t errlen);
void model_destroy(struct model *m);

/* fills the derived defaults (n_kv_head, head_dim, n_rot, rope) and checks
 * the values fit together; message names the field */
int model_hparams_check(struct model_hparams *hp, char *errbuf, size_t errlen);

#endif
