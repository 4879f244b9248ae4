/* gpu_model.c - random-weight model sources (scaled so activations stay O(1)). */
#include "tests/gpu/gpu_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int add_buf(struct gm_src *g, void *p)
{
    void **nb = realloc(g->bufs, (g->n_bufs + 1) * sizeof(void *));
    if (!nb || !p) {
        free(p);
        return -1;
    }
    g->bufs = nb;
    g->bufs[g->n_bufs++] = p;
    return 0;
}

/* one tensor: values uniform in [-scale, scale) (or 1 +- scale for norms) */
static int make(struct gm_src *g, struct gu_rng *r, struct model_tensor_src *s, enum be_type t,
                uint32_t rows, uint32_t cols, float scale, float offset)
{
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof(float));
    if (!x)
        return -1;
    for (size_t i = 0; i < n; i++)
        x[i] = offset + gu_uniform(r) * scale;
    void *p = gu_pack(t, x, rows, cols);
    free(x);
    if (add_buf(g, p) < 0)
        return -1;
    *s = (struct model_tensor_src){t, rows, cols, p};
    return 0;
}

struct model_hparams gm_hparams(enum model_arch arch, uint32_t n_layer, uint32_t dim, uint32_t ffn,
                                uint32_t n_head, uint32_t n_kv_head, uint32_t head_dim,
                                uint32_t n_vocab, float norm_eps, float rope_base)
{
    return (struct model_hparams){.arch = arch,
                                  .n_layer = n_layer,
                                  .dim = dim,
                                  .ffn = ffn,
                                  .n_head = n_head,
                                  .n_kv_head = n_kv_head,
                                  .head_dim = head_dim,
                                  .n_rot = head_dim,
                                  .n_vocab = n_vocab,
                                  .n_ctx = 131072,
                                  .norm_eps = norm_eps,
                                  .rope_base = rope_base,
                                  .rope_scale = 1.0f,
                                  .rope_neox = arch != MODEL_LLAMA};
}

int gm_src_init(struct gm_src *g, const struct model_hparams *hp, enum be_type t, uint64_t seed,
                int layers_distinct)
{
    return gm_src_init_mix(g, hp, t, t, seed, layers_distinct);
}

int gm_src_init_mix(struct gm_src *g, const struct model_hparams *hp, enum be_type t,
                    enum be_type t_more, uint64_t seed, int layers_distinct)
{
    memset(g, 0, sizeof(*g));
    struct gu_rng r;
    gu_seed(&r, seed);
    const uint32_t D = hp->dim, qd = hp->n_head * hp->head_dim, kvd = hp->n_kv_head * hp->head_dim;
    g->layers = calloc(hp->n_layer, sizeof(*g->layers));
    if (!g->layers)
        return -1;
    int rc = make(g, &r, &g->src.tok_embd, t, hp->n_vocab, D, 1.0f, 0.0f) |
             make(g, &r, &g->src.output_norm, BE_F32, 1, D, 0.1f, 1.0f) |
             make(g, &r, &g->src.output, t_more, hp->n_vocab, D, 1.0f / sqrtf((float)D), 0.0f);
    for (uint32_t l = 0; l < hp->n_layer && rc == 0; l++) {
        struct model_layer_src *L = &g->layers[l];
        if (l > 0 && !layers_distinct) {
            *L = g->layers[0];
            continue;
        }
        float sd = 1.0f / sqrtf((float)D), sf = 1.0f / sqrtf((float)hp->ffn),
              sq = 1.0f / sqrtf((float)qd);
        rc |= make(g, &r, &L->attn_norm, BE_F32, 1, D, 0.1f, 1.0f);
        rc |= make(g, &r, &L->wq, t, qd, D, 2.0f * sd, 0.0f);
        rc |= make(g, &r, &L->wk, t, kvd, D, 2.0f * sd, 0.0f);
        rc |= make(g, &r, &L->wv, t_more, kvd, D, sd, 0.0f);
        rc |= make(g, &r, &L->wo, t, D, qd, sq, 0.0f);
        rc |= make(g, &r, &L->ffn_norm, BE_F32, 1, D, 0.1f, 1.0f);
        rc |= make(g, &r, &L->w_gate, t, hp->ffn, D, sd, 0.0f);
        rc |= make(g, &r, &L->w_up, t, hp->ffn, D, sd, 0.0f);
        rc |= make(g, &r, &L->w_down, t_more, D, hp->ffn, sf, 0.0f);
        if (hp->arch == MODEL_QWEN3 || hp->arch == MODEL_GEMMA3) {
            rc |= make(g, &r, &L->q_norm, BE_F32, 1, hp->head_dim, 0.1f, 1.0f);
            rc |= make(g, &r, &L->k_norm, BE_F32, 1, hp->head_dim, 0.1f, 1.0f);
        }
        if (hp->arch == MODEL_GEMMA3) {
            rc |= make(g, &r, &L->post_attn_norm, BE_F32, 1, D, 0.1f, 1.0f);
            rc |= make(g, &r, &L->post_ffn_norm, BE_F32, 1, D, 0.1f, 1.0f);
        }
        if (hp->arch == MODEL_QWEN2) {
            rc |= make(g, &r, &L->bq, BE_F32, 1, qd, 0.1f, 0.0f);
            rc |= make(g, &r, &L->bk, BE_F32, 1, kvd, 0.1f, 0.0f);
            rc |= make(g, &r, &L->bv, BE_F32, 1, kvd, 0.1f, 0.0f);
        }
    }
    g->src.layers = g->layers;
    if (rc) {
        gm_src_fini(g);
        return -1;
    }
    return 0;
}

void gm_src_fini(struct gm_src *g)
{
    for (size_t i = 0; i < g->n_bufs; i++)
        free(g->bufs[i]);
    free(g->bufs);
    free(g->layers);
    memset(g, 0, sizeof(*g));
}
