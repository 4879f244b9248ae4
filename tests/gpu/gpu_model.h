/* gpu_model.h - random-weight llama/qwen2 models built in memory for the gpu test and benchmark. */
#ifndef RKV_GPU_MODEL_H
#define RKV_GPU_MODEL_H

#include "tests/gpu/gpu_util.h"
#include "worker/model.h"

/* host weights for hp in type t (norms and biases f32); layers_distinct = 0
 * makes every layer share layer 0's bytes (big benchmark models) */
struct gm_src {
    struct model_src src;
    struct model_layer_src *layers;
    void **bufs;
    size_t n_bufs;
};
/* a model's hyper-parameters: rope over the whole head, neox rotation but for llama, no
 * scaling, 131072 positions of context */
struct model_hparams gm_hparams(enum model_arch arch, uint32_t n_layer, uint32_t dim, uint32_t ffn,
                                uint32_t n_head, uint32_t n_kv_head, uint32_t head_dim,
                                uint32_t n_vocab, float norm_eps, float rope_base);
int gm_src_init(struct gm_src *g, const struct model_hparams *hp, enum be_type t, uint64_t seed,
                int layers_distinct);
/* the same with attn_v, ffn_down and output in t_more (BE_Q6_K under BE_Q4_K: a q4_k_m file's
 * heavier tensors) */
int gm_src_init_mix(struct gm_src *g, const struct model_hparams *hp, enum be_type t,
                    enum be_type t_more, uint64_t seed, int layers_distinct);
void gm_src_fini(struct gm_src *g);

#endif
