/* reserve.c - the device memory a step of the worker's model takes, measured on its real graph
 * before kvmgr sizes the device pool. */
#include "worker/reserve.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gpu.h"
#include "common/log.h"
#include "worker/forward.h"

/* a margin for what the measured steps do not show (a longer batch's block tables, attention
 * split partials of long contexts: a few MiB each) */
#define RESERVE_SLACK (64ull << 20)
/* positions per block of the scratch pool: small blocks keep it small */
#define RESERVE_BLOCK 16

static size_t mem_free(int gpu)
{
    size_t fr = 0, tot = 0;
    return rkv_gpu_mem_info((uint32_t)gpu, &fr, &tot) == 0 ? fr : 0;
}

int reserve_measure(struct backend *be, struct model *m, enum kv_dtype dt, uint32_t max_tokens,
                    uint32_t max_seqs, int gpu, uint64_t *out)
{
    *out = 0;
    if (max_tokens == 0 || max_seqs == 0 || max_seqs > max_tokens)
        return RKV_EINVAL;
    struct kv_layout l;
    int rc = fwd_kv_layout(m, RESERVE_BLOCK, dt, &l);
    if (rc)
        return rc;
    /* one block per decoding sequence, then the prefill chunk's blocks */
    const uint32_t n_pre = (max_tokens + RESERVE_BLOCK - 1) / RESERVE_BLOCK;
    const uint32_t n_dev = max_seqs + n_pre;
    const size_t bb = kv_block_bytes(&l), dev_bytes = (size_t)n_dev * bb;
    const size_t free0 = mem_free(gpu);
    void *dev = NULL, *host = aligned_alloc(4096, (bb + 4095) & ~(size_t)4095);
    uint8_t handle[RKV_GPU_IPC_BYTES];
    struct fwd *f = NULL;
    int32_t *toks = calloc(max_tokens, sizeof(int32_t));
    struct kv_block_ref *tab = calloc(n_dev, sizeof(*tab));
    struct fwd_seq *seqs = calloc(max_seqs, sizeof(*seqs));
    float *logits = malloc((size_t)max_seqs * m->hp.n_vocab * sizeof(float));
    const struct sample_dev_row **rows = calloc(max_seqs, sizeof(*rows));
    struct sample_dev_out *outs = calloc(max_seqs, sizeof(*outs));
    uint8_t *want = calloc(max_seqs, 1);
    if (!host || !toks || !tab || !seqs || !logits || !rows || !outs || !want) {
        rc = RKV_ENOMEM;
        goto done;
    }
    if ((rc = rkv_gpu_alloc((uint32_t)gpu, dev_bytes, &dev, handle)))
        goto done;
    struct kv_pools p = {{dev, host}, {n_dev, 1}};
    if ((rc = fwd_create(&f, m, &l, &p, max_tokens, max_seqs)))
        goto done;
    for (uint32_t j = 0; j < n_dev; j++)
        tab[j] = (struct kv_block_ref){j, KV_DEVICE};
    for (uint32_t i = 0; i < max_tokens; i++)
        toks[i] = (int32_t)(i % m->hp.n_vocab);
    /* the largest prefill chunk (every row's activations, the gemms' scratch) ... */
    struct fwd_seq pre = {toks, max_tokens, 0, tab + max_seqs, n_pre};
    if ((rc = fwd_step(f, &pre, 1, 0, logits)))
        goto done;
    /* ... and the widest decode step (max_seqs logits rows), every row sampled where the
     * logits are, so the sampling scratch is the backend's kept scratch too */
    for (uint32_t s = 0; s < max_seqs; s++)
        seqs[s] = (struct fwd_seq){toks + s, 1, 0, tab + s, 1};
    if ((rc = fwd_step_keep(f, seqs, max_seqs)))
        goto done;
    const struct sample_dev_row row = {.temperature = 1.0f, .top_p = 1.0f, .u = 0.5,
                                       .repetition_penalty = 1.0f};
    for (uint32_t s = 0; s < max_seqs; s++)
        rows[s] = &row;
    int used = 0;
    if ((rc = fwd_sample(f, max_seqs, rows, outs, want, logits, &used)) ||
        (rc = backend_sync(be)))
        goto done;
    const size_t free_peak = mem_free(gpu);
    fwd_destroy(f);
    f = NULL;
    struct kv_pools none = {{NULL, NULL}, {0, 0}};
    backend_set_kv(be, &l, &none);
    rkv_gpu_free((uint32_t)gpu, dev);
    dev = NULL;
    const size_t free_after = mem_free(gpu);
    if (!free0 || !free_peak || !free_after || free_after < free_peak + dev_bytes) {
        rc = RKV_EIO;
        log_warn("compute reserve: the gpu's free memory did not add up (%zu, %zu, %zu bytes): "
                 "kvmgr uses its default",
                 free0, free_peak, free_after);
        goto done;
    }
    /* what the steps took and gave back (activations, logits): the scratch the
     * backend keeps is on the gpu when kvmgr looks, so it is not counted twice */
    const uint64_t steps = free_after - free_peak - dev_bytes;
    const uint64_t later = backend_scratch_reserve(be);
    *out = steps + later + RESERVE_SLACK;
    log_info("compute reserve %.0f MiB measured on the model (%u-token prefill chunk, %u "
             "sequences): steps %.0f MiB, the backend's scratch kept %.0f MiB, staging up to "
             "%.0f MiB, margin %.0f MiB",
             *out / 1048576.0, max_tokens, max_seqs, steps / 1048576.0,
             (double)(free0 > free_after ? free0 - free_after : 0) / 1048576.0, later / 1048576.0,
             RESERVE_SLACK / 1048576.0);
done:
    fwd_destroy(f);
    if (dev)
        rkv_gpu_free((uint32_t)gpu, dev);
    free(host);
    free(toks);
    free(rows);
    free(outs);
    free(want);
    free(tab);
    free(seqs);
    free(logits);
    return rc;
}
