/* host_cpu.cuh - host kv blocks attended by cpu threads: all of them (CPU_TAIL) or a share
 * beside the gpu's read of the rest (the split host read). */
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "worker/backend.h"
#include "worker/kv.h"
}

struct cuda_ctx;
struct split_job;

struct cuda_host_cpu {
    /* where host blocks are attended on cpu threads: the worker's router (set_host_attend);
     * without it CPU_TAIL and the split are refused */
    struct be_host_attend attend;
    /* CPU_TAIL: every host block attended through attend (host_attn_cpu, or the host_read
     * knob's cpu), q down and the partial up over pcie through hbuf (pinned: q, o, m, l) */
    int host_cpu;
    float *hbuf;
    size_t hbuf_cap;
    /* the split host read (the worker's host_split, or the host_split knob: P in 1..100): P % of
     * each decode row's host blocks (the oldest) attended by cpu_be while the gpu reads the
     * rest over pcie, the two partials merged by lse; 0: off. q comes down into qdown (pinned),
     * ev_qdown after it. Only for a batch whose decode rows read host blocks taking at least
     * the split_min_us knob of the link a layer: the cpu's part stands on the layer's critical
     * path beside the gpu's own work, which a short tail does not hide; link_gbps: the copy
     * engine's measured rate (50 when not measured) */
    uint32_t host_split;
    double link_gbps;
    /* the split's cpu part as a host function (a tail of at least the split_async_us knob):
     * queued on cpu_s behind q's copy down (ev_qdown), so the launching thread queues the rest
     * of the layer at once; the side stream waits for ev_cpu_done before the partial (split_up,
     * pinned) goes up. split_jobs: one per layer (the launching thread runs ahead of them);
     * split_v: the step's cpu view, built once a step (split_v_gen: the meta it was built for,
     * 0 none); split_async_rc: a job's error, returned at the next sync. A shorter tail waits on
     * the launching thread, which is faster there */
    cudaStream_t cpu_s;
    cudaEvent_t ev_cpu_done;
    struct split_job *split_jobs;
    uint32_t split_jobs_n;
    struct be_batch split_v;
    uint64_t split_v_gen;
    float *split_up;
    size_t split_up_cap;
    int split_async_rc;
    void *qdown;
    size_t qdown_cap;
    cudaEvent_t ev_qdown;
    struct be_seq *split_seqs; /* the cpu's view of the batch: the gpu's host blocks hidden */
    struct kv_block_ref *split_tab;
    size_t split_seqs_cap, split_tab_cap;
};

/* the cpu part's stream and events; fini waits for its jobs and frees all */
int cuda_host_cpu_init(struct cuda_host_cpu *h);
void cuda_host_cpu_fini(struct cuda_host_cpu *h);
/* the vtable's host_attn_cpu, host_split and set_host_attend (struct backend_i) */
int cu_host_attn_cpu(void *ctx, int on);
int cu_set_host_attend(void *ctx, const struct be_host_attend *h);
int cu_host_split(void *ctx, uint32_t pct);
/* the split host read is on for this backend's state (tail_split_on) */
int cuda_host_split_on(const struct cuda_ctx *c);
/* the batch's shares (tail_batch's): sc[s] the host blocks of sequence s the gpu stages, meta
 * cpu_k[s] the oldest ones the cpu attends when the host read is split; the staged slots of all
 * in *all */
int cuda_split_shares(struct cuda_ctx *c, const struct be_batch *b, uint32_t *sc, uint64_t *all);
/* CPU_TAIL: the host blocks' partial from cpu threads over the host pool */
int cuda_attn_host_cpu(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                       const struct be_tensor *q, const struct be_attn *at,
                       const struct be_partial *out);
/* the split host read's parts: q down before the gpu's host part is queued, then the cpu's part
 * (on the launching thread, or as a host function) merged into the gpu's host partial out */
int cuda_split_q_down(struct cuda_ctx *c, const struct be_tensor *q, size_t bytes);
int cuda_split_host_cpu(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                        const struct be_attn *at, const struct be_partial *out);
int cuda_split_host_cpu_async(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                              const struct be_attn *at, const struct be_partial *out);
/* an error of a split job since the last call (0: none), cleared */
int cuda_split_async_err(struct cuda_ctx *c);
/* how the split ran since the last stats call, for the stats line */
void cuda_split_stats(const struct cuda_ctx *c, char *buf, size_t len);
