/* stage.cuh - host kv blocks on the gpu: staging copies a layer ahead, passes, write-back. */
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

struct cuda_ctx;
struct cuda_attn_args;

/* how host blocks reach the attention kernel */
enum cuda_host_read {
    CUDA_HOST_ZEROCOPY = 0, /* the kernel reads the mapped pool over pcie */
    CUDA_HOST_COPY = 1,     /* copy engine into staging, one layer ahead */
};

/* host-block staging (copy path): two buffers, layer parity */
struct cuda_stage {
    int host_read; /* enum cuda_host_read, measured at set_kv */
    cudaStream_t copy;
    cudaEvent_t ev_copy_done[2];  /* on copy: staging buffer filled */
    cudaEvent_t ev_stage_free[2]; /* on side: attention done with it */
    /* write-back (meta stage_w 2): the kv write stores a prefill chunk's rows of a host block
     * in its staging slot, and the wb stream copies the slot back to the pool; the staging
     * copy queues those slots first and records ev_wready after them (stg_wready), the kv write
     * waits for it; ev_kvw (stream) after the kv write, ev_wb_done (wb) after the copies back,
     * which the stream joins at its next op (wb_pending) and the next copy into the buffer
     * waits for (wb_used) */
    cudaStream_t wb;
    cudaEvent_t ev_kvw;
    cudaEvent_t ev_wready[2];
    cudaEvent_t ev_wb_done[2];
    int stg_wready[2];
    int wb_used[2];
    int wb_pending, wb_last;
    void *stg[2];
    size_t stg_cap[2];
    uint32_t stg_layer[2];
    uint64_t stg_gen[2];
    int stg_valid[2];
    int stage_batch;    /* one cudaMemcpyBatchAsync a layer (off when the driver refuses: then a
                         * copy per run of consecutive blocks) */
    size_t stage_limit; /* bytes per staging buffer (stage_mb); larger tails read zero-copy */
    size_t pass_limit;  /* bytes of one staging pass (stage_pass_kb, at most stage_limit) */
    void **bat_dst;  /* its copies' destinations, sources and sizes */
    const void **bat_src;
    size_t *bat_size;
    uint32_t bat_cap;
};

/* the copy and write-back streams and their events; fini waits for them and frees all */
int cuda_stage_init(struct cuda_stage *s);
void cuda_stage_fini(struct cuda_stage *s);
/* copy engine or zero-copy for host blocks: whichever moves bytes faster here (at set_kv) */
void cuda_host_read_choose(struct cuda_ctx *c);
/* write-back around layer's kv write: *stg gets the staging buffer the write stores the
 * write-back slots' rows in (NULL: none), wb_after copies them back to the host pool */
int cuda_wb_before(struct cuda_ctx *c, uint32_t layer, char **stg);
int cuda_wb_after(struct cuda_ctx *c, uint32_t layer, const char *stg);
/* the host blocks the gpu reads, on the side stream (which waits for ev_pre_attn already):
 * staged in passes, staged one layer ahead, or read zero-copy */
int cuda_attn_host_gpu(struct cuda_ctx *c, struct cuda_attn_args *a, uint32_t layer);
