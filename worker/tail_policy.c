/* tail_policy.c - the worker's host-tail decisions (tail_policy.h). */
#include "worker/tail_policy.h"

#include "common/hosttail.h"

uint32_t tail_split_auto(double gpu_host_gbps, double cpu_gbps)
{
    if (!(gpu_host_gbps > 0) || !(cpu_gbps > 0))
        return 0;
    return (uint32_t)(100.0 * cpu_gbps / (cpu_gbps + gpu_host_gbps) + 0.5);
}

double tail_split_gbps(uint32_t pct, double gpu_host_gbps, double cpu_gbps)
{
    if (pct == 0 || !(gpu_host_gbps > 0) || !(cpu_gbps > 0))
        return 0;
    const double p = pct > 100 ? 1.0 : pct / 100.0, tc = p / cpu_gbps,
                 tg = (1.0 - p) / gpu_host_gbps;
    return 1.0 / (tc > tg ? tc : tg);
}

uint32_t tail_split_share(const struct rates *r, double *cpu_gbps, double *gpu_gbps)
{
    double cpu = r->split.cpu_gbps > 0 ? r->split.cpu_gbps : r->attn_cpu_gbps,
           gpu = r->attn_host_gbps;
    if (r->split.cpu_gbps > 0 && r->split.link_gbps > 0 && (gpu <= 0 || r->split.link_gbps < gpu))
        gpu = r->split.link_gbps;
    if (cpu_gbps)
        *cpu_gbps = cpu;
    if (gpu_gbps)
        *gpu_gbps = gpu;
    return tail_split_auto(gpu, cpu);
}

void tail_split_plan(const struct rates *r, int64_t host_split, int deterministic,
                     struct tail_split_plan *out)
{
    const uint32_t auto_pct = tail_split_share(r, &out->cpu_gbps, &out->gpu_gbps);
    out->pct = 0;
    out->gbps = 0;
    if (host_split == 0 || (host_split < 0 && deterministic))
        return;
    out->pct = host_split > 0 ? (uint32_t)host_split : auto_pct;
    if (!deterministic)
        out->gbps = tail_split_gbps(out->pct, out->gpu_gbps, out->cpu_gbps);
}

int tail_gpu_copies(double copy_gbps, double zero_copy_gbps)
{
    return copy_gbps > 0.55 * zero_copy_gbps;
}

int tail_cpu_wanted(const struct rates *r, int64_t host_attn, double split_gbps)
{
    return host_attn == 2 ||
           (host_attn == 0 &&
            hosttail_cpu_faster(r->pcie_h2d_gbps, r->attn_host_gbps, r->attn_cpu_gbps, split_gbps));
}

int tail_split_on(uint32_t pct, int have_router, int cpu_tail, int deterministic, int attn_fixed,
                  uint32_t n_device_blocks)
{
    return pct && have_router && !cpu_tail && !deterministic && !attn_fixed && n_device_blocks > 0;
}

enum tail_split_mode tail_split_mode(double tail_us, uint32_t min_us, uint32_t async_us)
{
    if (tail_us < (double)min_us)
        return TAIL_SPLIT_OFF;
    return tail_us >= (double)async_us ? TAIL_SPLIT_ASYNC : TAIL_SPLIT_INLINE;
}

uint32_t tail_seq_share(const struct kv_block_ref *blocks, uint32_t n_blocks, uint32_t block_size,
                        uint64_t last, uint32_t n_tokens, uint32_t pct, uint32_t *n_read)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < n_blocks; j++)
        n += blocks[j].residency == KV_HOST && (uint64_t)j * block_size <= last;
    if (n_read)
        *n_read = n;
    if (n_tokens > 1 || pct == 0)
        return 0;
    return (uint32_t)(((uint64_t)n * (pct > 100 ? 100 : pct) + 50) / 100);
}

void tail_cpu_view(const struct kv_block_ref *in, uint32_t n, uint32_t k, struct kv_block_ref *out)
{
    for (uint32_t j = 0; j < n; j++) {
        out[j] = in[j];
        if (in[j].residency != KV_HOST)
            continue;
        if (k)
            k--;
        else
            out[j] = (struct kv_block_ref){0, KV_DEVICE};
    }
}

void tail_batch(const struct be_batch *b, uint32_t block_size, const struct tail_split_cfg *cfg,
                uint32_t *cpu_k, uint32_t *gpu_k, struct tail_batch_out *out)
{
    *out = (struct tail_batch_out){0};
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        const uint64_t last = (uint64_t)q->n_past + (q->n_tokens ? q->n_tokens - 1 : 0);
        cpu_k[s] = tail_seq_share(q->blocks, q->n_blocks, block_size, last, q->n_tokens, cfg->pct,
                                  &gpu_k[s]);
        out->dec_blocks += q->n_tokens <= 1 ? gpu_k[s] : 0;
    }
    out->tail_us = (double)out->dec_blocks * 2 * cfg->slice_bytes / (cfg->link_gbps * 1e3);
    const enum tail_split_mode mode = tail_split_mode(out->tail_us, cfg->min_us, cfg->async_us);
    const int gated = !cfg->pct || mode == TAIL_SPLIT_OFF;
    out->async = !gated && mode == TAIL_SPLIT_ASYNC;
    out->gated = cfg->pct && gated && out->dec_blocks;
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        if (gated)
            cpu_k[s] = 0;
        out->cpu_any |= cpu_k[s] > 0;
        gpu_k[s] -= cpu_k[s];
        out->staged += gpu_k[s];
    }
}
