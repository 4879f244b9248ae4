/* tail_policy.h - the worker's host-tail decisions: whether a spilled session's host KV blocks
 * are attended by cpu threads (CPU_TAIL), the split host read's share and the rate it reads at,
 * whether a backend in a given state can split, and per batch which host blocks the cpu takes.
 * Functions of measured rates, knobs and sizes: the cuda backend calls them and keeps only the
 * mechanism. CPU_TAIL's rate rule, which kvmgr's planner applies too, is common/hosttail.h.
 * Rates in GB/s, 0 = unknown; shares in percent of a decode row's host blocks. */
#ifndef RKV_TAIL_POLICY_H
#define RKV_TAIL_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"
#include "worker/kv.h"
#include "worker/rates.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- at attach: from the measured rates and the worker's settings ---- */

/* the split's automatic share: the cpu's part of the two rates a tail is read at together (the
 * gpu's host-block attention rate, the cpu's), rounded; 0 when either is unknown */
uint32_t tail_split_auto(double gpu_host_gbps, double cpu_gbps);
/* the rate a tail is read at with pct percent of it on the cpu and the rest on the gpu, both at
 * once: the tail over the longer of the two parts' times; 0 when pct is 0 or a rate unknown */
double tail_split_gbps(uint32_t pct, double gpu_host_gbps, double cpu_gbps);
/* the split's automatic share from r: the cpu's and the link's rates measured side by side where
 * there are some (the gpu's part at the slower of the link beside the cpu and the gpu's own host
 * attention), else the rates measured apart; 0 where a rate is unknown. The rates it used go to
 * *cpu_gbps / *gpu_gbps (may be NULL) */
uint32_t tail_split_share(const struct rates *r, double *cpu_gbps, double *gpu_gbps);

/* the split a worker asks its backend for: the share (host_split: 1..100 as given, -1 the
 * automatic share, 0 off; the automatic one stays 0 under deterministic, where the split cannot
 * run), the two rates the automatic share came from, and the rate it reads a long tail at (0 no
 * split, and none under deterministic) */
struct tail_split_plan {
    uint32_t pct;
    double cpu_gbps, gpu_gbps;
    double gbps;
};
void tail_split_plan(const struct rates *r, int64_t host_split, int deterministic,
                     struct tail_split_plan *out);
/* host blocks the gpu reads reach it by copies into staging (1) rather than zero-copy reads of
 * pinned host memory (0), from the two paths' measured rates: the attention kernel reaches about
 * 0.55 of the stream-read rate over zero-copy, and copies also overlap the layer before, so
 * each is compared by what it delivers. Zero-copy where neither rate is known */
int tail_gpu_copies(double copy_gbps, double zero_copy_gbps);
/* CPU_TAIL wanted: host_attn 2 forces it, 1 forbids it, 0 applies common/hosttail.h's rule to
 * r and the split's rate split_gbps (the cpu must beat both the link and the split) */
int tail_cpu_wanted(const struct rates *r, int64_t host_attn, double split_gbps);

/* ---- in a backend ---- */

/* the split runs for a backend in this state: a share pct and a router for the cpu's part, not
 * with CPU_TAIL (the cpu takes every host block), nor deterministic or with one key split per
 * block (attn_fixed: the cpu's partial spans many blocks, which the block-order merge cannot
 * take apart), nor without device blocks (the cpu's view hides the gpu's host blocks behind
 * device block 0) */
int tail_split_on(uint32_t pct, int have_router, int cpu_tail, int deterministic, int attn_fixed,
                  uint32_t n_device_blocks);

/* how a step with the split on reads its decode rows' host tails, from the link time of one
 * layer's tail (tail_us): a tail under min_us is left to the gpu (the cpu's part would stand on
 * the layer's critical path beside the gpu's own work, which a short tail does not hide); one
 * of at least async_us runs the cpu's part off the thread that launches the layers */
enum tail_split_mode {
    TAIL_SPLIT_OFF = 0,
    TAIL_SPLIT_INLINE = 1,
    TAIL_SPLIT_ASYNC = 2,
};
enum tail_split_mode tail_split_mode(double tail_us, uint32_t min_us, uint32_t async_us);

/* a sequence's share: of its host blocks that a token reads (block j with j * block_size <=
 * last, the last position read; *n_read gets how many), the oldest pct % (rounded) go to the
 * cpu. Only a row of one token splits (a decode row: one query per head reads each key once, so
 * the cpu streams like the link; a prefill chunk's hundreds of queries would make it compute):
 * 0 otherwise */
uint32_t tail_seq_share(const struct kv_block_ref *blocks, uint32_t n_blocks, uint32_t block_size,
                        uint64_t last, uint32_t n_tokens, uint32_t pct, uint32_t *n_read);
/* the cpu's view of a table of n blocks whose first k host blocks are the cpu's: those stay,
 * later host blocks become device block 0 (a pass over host blocks skips them) */
void tail_cpu_view(const struct kv_block_ref *in, uint32_t n, uint32_t k, struct kv_block_ref *out);

/* a batch's split: the share (0 when tail_split_on says no), a layer's kv slice bytes (K or V),
 * the link's rate and the two gates of tail_split_mode */
struct tail_split_cfg {
    uint32_t pct;
    size_t slice_bytes;
    double link_gbps;
    uint32_t min_us, async_us;
};
/* what tail_batch decided for a batch */
struct tail_batch_out {
    uint64_t staged;     /* host blocks the gpu reads, all sequences */
    uint64_t dec_blocks; /* host blocks the decode rows read (before the cpu's share) */
    double tail_us;      /* the link time of those blocks' K and V of one layer */
    int cpu_any;         /* some sequence has blocks on the cpu */
    int async;           /* the cpu's part runs off the launching thread */
    int gated;           /* the split is on, but these decode tails are too short */
};
/* per sequence s of b: cpu_k[s] the oldest host blocks the cpu attends, gpu_k[s] the host blocks
 * some token reads that the gpu attends (block_size 0: no kv, no host blocks read) */
void tail_batch(const struct be_batch *b, uint32_t block_size, const struct tail_split_cfg *cfg,
                uint32_t *cpu_k, uint32_t *gpu_k, struct tail_batch_out *out);

#ifdef __cplusplus
}
#endif

#endif
