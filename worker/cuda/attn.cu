/* attn.cu - attention over one residency's blocks: picks the kernel shape and the key split, then
 * merges the splits. */
#include "worker/cuda/cuda_ops.cuh"

/* chunk units of one block: keys per chunk is 64 for f16, 32 for f32 */
static uint32_t units_per_block(const struct kv_layout *l)
{
    uint32_t ch = l->dtype == KV_F16 ? 64 : 32;
    return (l->block_size + ch - 1) / ch;
}

int cuda_attn(struct cuda_ctx *c, const struct cuda_attn_args *a)
{
    const struct cuda_meta *m = a->meta;
    const struct be_attn *at = a->at;
    if (m->n_tokens == 0)
        return 0;
    uint32_t units = m->max_units[a->list] * units_per_block(&c->layout);
    /* two waves of ~3 thread blocks per SM, at least 2 chunk units (128 keys)
     * each so the prologue stays small (the split merge is parallel over splits) */
    uint32_t base = c->layout.n_kv_head * m->n_qtiles;
    uint32_t target = 6 * (uint32_t)c->n_sm;
    uint32_t n_split = (target + base - 1) / base;
    uint32_t max_split = (units + 1) / 2;
    if (n_split > max_split)
        n_split = max_split;
    if (n_split < 1)
        n_split = 1;
    uint32_t ups = units ? (units + n_split - 1) / n_split : 0;
    if (ups)
        n_split = (units + ups - 1) / ups;
    size_t need = (size_t)n_split * m->n_tokens * at->n_head * (at->head_dim + 2) * sizeof(float);
    int rc = cuda_scratch(c, &c->part[a->residency], &c->part_cap[a->residency], need);
    if (rc < 0)
        return rc;
    float *part = (float *)c->part[a->residency];
    uint32_t g = at->n_head / at->n_kv_head;
    if (m->qt == 1 && g <= 16)
        rc = cuda_attn_decode_launch(c, a, n_split, ups, part);
    else
        rc = cuda_attn_prefill_launch(c, a, n_split, ups, part);
    if (rc < 0)
        return rc;
    return cuda_attn_merge_splits(c, part, n_split, m->n_tokens, at->n_head, at->head_dim, a->o,
                                  a->m, a->l, a->s);
}
