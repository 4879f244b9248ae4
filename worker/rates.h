/* rates.h - start-up measurement of the rates the kvmgr planner compares (GB/s of kv moved). */
#ifndef RKV_WORKER_RATES_H
#define RKV_WORKER_RATES_H

#include <stdint.h>

#include "worker/backend.h"
#include "worker/kv.h"

/*
 * What each rate means (GB/s = 1e9 bytes per second, of kv read or moved). The
 * planner (kvmgr/plan.h) spills a session as CPU_TAIL only where attn_cpu_gbps
 * beats the streamed rate min(pcie_h2d_gbps, attn_host_gbps).
 *
 *  cuda backend:
 *   pcie_h2d_gbps     pinned host pool -> device copies (the copy engine)
 *   attn_device_gbps  the backend's decode attention over device-tagged blocks
 *   attn_host_gbps    the backend's attention over host-tagged blocks (the
 *                     host-stream rate: copies or zero-copy reads, whichever
 *                     the backend chose)
 *   attn_cpu_gbps     the cpu backend's attention over host blocks, on
 *                     cpu_threads threads (what a CPU_TAIL would run)
 *  cpu backend (no gpu, no link):
 *   pcie_h2d_gbps     0: there is no link between the pools
 *   attn_device_gbps  cpu attention over device-tagged blocks
 *   attn_host_gbps    the host-stream rate: memcpy bandwidth out of the host
 *                     pool (what moving a tail to the "device" pool costs),
 *                     so the planner's comparison stays meaningful
 *   attn_cpu_gbps     cpu attention over host-tagged blocks
 *
 * Attention is timed on decode-shaped work: one query token per sequence,
 * a pass's blocks split over up to 16 sequences (64 on a gpu), every layer,
 * reading at most RATES_MAX_BYTES per pass on the cpu (512 MiB on a gpu, so
 * launches do not dominate). Successive passes read up to 16 disjoint windows
 * of the pool, so a pass streams memory rather than what the last one left in
 * the caches; a pool smaller than about twice the last-level cache still reads
 * faster than a large one would. The blocks are only read (they may hold live
 * sessions' kv after a restart); a pool with no blocks gives 0 (unknown, never
 * chosen by the planner).
 */

#define RATES_MAX_BYTES ((uint64_t)16 << 20)

/*
 * The split host read's rates (cuda backend; rates_split): the cpu backend's attention over one
 * decode row of up to 1 GiB of host blocks (a tail as long as those the split takes), timed
 * while a second thread keeps the link reading the same host pool into device memory, as a split
 * layer runs them. Both share the host's memory, so each is measured beside the other. Not sent
 * to kvmgr: the worker sets the split's share from them (tail_split_share).
 */
struct split_rates {
    double cpu_gbps;      /* the cpu's attention meanwhile */
    double link_gbps;     /* what the link moved meanwhile */
    uint32_t link_pieces; /* its 64 MiB copies in that time (after the first) */
};

struct rates {
    double pcie_h2d_gbps;
    double attn_device_gbps;
    double attn_host_gbps;
    double attn_cpu_gbps;
    struct split_rates split; /* cuda only; 0 where not measured */
    double elapsed_ms;        /* the whole measurement */
};

struct rates_opts {
    const struct kv_layout *layout;
    const struct kv_pools *pools; /* mapped; device pool in device memory on cuda */
    struct be_attn attn;          /* the model's attention geometry */
    int gpu;                      /* cuda device ordinal; -1: be is the cpu backend */
    uint32_t cpu_threads;         /* threads of the cpu attention on a gpu worker; 0 = all */
    double budget_ms;             /* time per rate (about); 0 = 20 ms */
};

/* measures every rate with be (the worker's backend, set_kv already done on
 * o->pools). 0 or a negative RKV_E* code; rates it could not measure are 0. */
int rates_measure(struct backend *be, const struct rates_opts *o, struct rates *out);

/* the split's rates alone, over o->pools' host pool (o->gpu -1: the link's stand-in is a
 * memcpy, for tests). 0 or a negative RKV_E* code; a link that cannot run leaves out at 0 */
int rates_split(const struct rates_opts *o, struct split_rates *out);

#endif
