/* attn.cu - attention over one residency's blocks: picks the kernel shape and the key split, then
 * merges the splits. */
#include "worker/cuda/cuda_ops.cuh"

/* chunk units of one block: keys per chunk is 64 for f16, 32 for f32 */
static uint32_t units_per_block(const struct kv_layout *l)
{
    uint32_t ch = l->dtype == KV_F16 ? 64 : 32;
    return (l->block_size + ch - 1) / ch;
}

/* the split of units chunk units over base thread blocks (kv heads x query tiles) that finishes
 * first when slots blocks run at once: each wave costs its blocks' chunk units plus fixed_cost
 * for the prologue and the partial's write, so a last wave that leaves most of the gpu idle
 * counts whole; ties: fewer splits. Short lists first take one block an SM (n_sm / base splits)
 * when that leaves at most one_wave units a split: every block then starts beside the q/k/v
 * linear's and queues its keys before its wait, and the splits merge in one round */
static uint32_t attn_pick_split(uint32_t units, uint32_t base, uint32_t slots, uint32_t max_split,
                                uint32_t fixed_cost, uint32_t n_sm, uint32_t one_wave)
{
    const uint32_t wave = n_sm / base;
    if (one_wave && wave >= 2 && units <= wave * one_wave)
        return wave < max_split ? wave : max_split;
    uint32_t best = 1;
    uint64_t best_cost = UINT64_MAX;
    for (uint32_t n = 1; n <= max_split; n++) {
        uint32_t ups = (units + n - 1) / n, n_eff = (units + ups - 1) / ups;
        uint64_t waves = ((uint64_t)n_eff * base + slots - 1) / slots;
        uint64_t cost = waves * (ups + fixed_cost);
        if (cost < best_cost) {
            best_cost = cost;
            best = n_eff;
        }
        if ((uint64_t)n * base > 8ull * slots)
            break; /* past a few waves nothing gets better */
    }
    return best;
}

/* chunk units one attention thread block costs beyond its own (its prologue, partial and merge)
 * when the key split is picked; and the most units a split may have where the launch takes one
 * block an SM (attn_pick_split) */
#define ATTN_SPLIT_COST 1
#define ATTN_ONE_WAVE   4

/* n zeroed split counters of the residency's launches (they leave them zeroed) */
static int split_counters(struct cuda_ctx *c, int res, size_t n, cudaStream_t s)
{
    size_t need = n * sizeof(uint32_t), cap = c->cnt_cap[res];
    int rc = cuda_scratch(c, &c->cnt[res], &c->cnt_cap[res], need);
    if (rc < 0)
        return rc;
    if (c->cnt_cap[res] != cap)
        CU_TRY(cudaMemsetAsync(c->cnt[res], 0, c->cnt_cap[res], s));
    return 0;
}

/* the launch of the kernel shape for the batch: few query rows per kv head (decode) or tiles */
static int attn_launch_shape(struct cuda_ctx *c, const struct cuda_attn_args *a, uint32_t n_split,
                             uint32_t ups, float *part, uint32_t *cnt)
{
    uint32_t g = a->at->n_head / a->at->n_kv_head;
    return a->meta->qt == 1 && g <= 16 ? cuda_attn_decode_launch(c, a, n_split, ups, part, cnt)
                                       : cuda_attn_prefill_launch(c, a, n_split, ups, part, cnt);
}

/* the most bytes of per-block partials one residency may hold (the attn_fixed knob): past it
 * (long prefills) attention splits as usual */
#define ATTN_FIXED_MAX_BYTES (512ull << 20)

/* one split per kv block, partials kept for cu_attn_merge, and this residency's own result
 * merged block by block: 1 when done so, 0 when the launch does not fit that mode */
static int attn_fixed(struct cuda_ctx *c, const struct cuda_attn_args *a, int *rc)
{
    const struct cuda_meta *m = a->meta;
    const struct be_attn *at = a->at;
    uint32_t n_split = m->max_units[a->list] ? m->max_units[a->list] : 1;
    size_t need = (size_t)n_split * m->n_tokens * at->n_head * (at->head_dim + 2) * sizeof(float);
    if (m->n_pass > 1 || need > ATTN_FIXED_MAX_BYTES)
        return 0;
    *rc = cuda_scratch(c, &c->part[a->residency], &c->part_cap[a->residency], need);
    if (*rc < 0)
        return 1;
    float *part = (float *)c->part[a->residency];
    *rc = attn_launch_shape(c, a, n_split, units_per_block(&c->layout), part, NULL);
    if (*rc == 0)
        *rc = cuda_attn_merge_blocks(c, m, a->list, part, -1, NULL, at->n_head, at->head_dim,
                                     a->o, a->m, a->l, a->s);
    if (*rc == 0) {
        c->fixed[a->residency].valid = 1;
        c->fixed[a->residency].list = a->list;
        c->fixed[a->residency].n_split = n_split;
        c->fixed[a->residency].layer = a->layer;
        c->fixed[a->residency].gen = m->gen;
    }
    return 1;
}

int cuda_attn(struct cuda_ctx *c, const struct cuda_attn_args *a)
{
    const struct cuda_meta *m = a->meta;
    const struct be_attn *at = a->at;
    c->fixed[a->residency].valid = 0;
    if (m->n_tokens == 0)
        return 0;
    int frc = 0;
    if (c->tune.attn_fixed && attn_fixed(c, a, &frc))
        return frc;
    uint32_t units = m->max_units[a->list] * units_per_block(&c->layout);
    uint32_t base = c->layout.n_kv_head * m->n_qtiles;
    uint32_t max_split = (units + 1) / 2; /* at least 2 chunk units (128 keys) per split */
    if (c->tune.max_split && max_split > c->tune.max_split)
        max_split = c->tune.max_split; /* the max_split knob: long splits (tests) */
    uint32_t g = at->n_head / at->n_kv_head;
    uint32_t n_split, slots = (uint32_t)cuda_attn_decode_slots(c, m->qt, g, base);
    if (slots)
        n_split = attn_pick_split(units, base, slots, max_split, ATTN_SPLIT_COST, (uint32_t)c->n_sm,
                                  ATTN_ONE_WAVE);
    else {
        /* two waves of ~3 thread blocks per SM (the split merge is parallel over splits) */
        n_split = (6 * (uint32_t)c->n_sm + base - 1) / base;
        if (n_split > max_split)
            n_split = max_split;
    }
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
    /* the launch's last thread block of each tile merges its splits */
    rc = split_counters(c, a->residency, (size_t)m->n_qtiles * c->layout.n_kv_head, a->s);
    if (rc < 0)
        return rc;
    return attn_launch_shape(c, a, n_split, ups, part, (uint32_t *)c->cnt[a->residency]);
}
