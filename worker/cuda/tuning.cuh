/* tuning.cuh - the cuda backend's switches, read from the environment once at start. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct backend_opts;

struct cuda_tune {
    /* staging */
    size_t stage_limit; /* bytes per staging buffer; larger tails read zero-copy */
    size_t pass_limit;  /* bytes of one staging pass (RKV_CUDA_STAGE_PASS_KB); 0 (env
                         * RKV_CUDA_STAGE_PASSES=0): no passes, larger tails zero-copy */
    int wb_on;          /* write-back of a prefill chunk's rows (env RKV_CUDA_HOST_WB) */
    int stage_batch;    /* one batched copy call a layer (env RKV_CUDA_STAGE_BATCH) */
    /* sampling */
    int dev_greedy;       /* greedy rows picked on the device (env RKV_CUDA_DEV_GREEDY=0: on the
                           * host, by the worker's sampler) */
    int dev_sample;       /* sampled rows picked on the device (env RKV_CUDA_DEV_SAMPLE=0: on the
                           * host, from their logits) */
    int smp_stamps;       /* each sampled row's phase times to stderr (RKV_CUDA_SAMPLE_STAMPS) */
    uint32_t smp_min;     /* the fewest rows a step samples here (RKV_CUDA_DEV_SAMPLE_MIN) */
    uint32_t smp_cl;      /* blocks a row for a step of few rows (RKV_CUDA_SAMPLE_CL: 1, 2, 4, 8) */
    uint32_t smp_cl_rows; /* the most rows a step has for that (RKV_CUDA_SAMPLE_CL_ROWS) */
    /* gemms */
    size_t blas_ws; /* cublas's workspace bytes (env RKV_CUDA_BLAS_WS_MB; 0: cublas's pool) */
    /* gemm_lt.cu: 16-bit gemms of 9..lt_tune_n tokens on the cuBLASLt algorithm measured
     * fastest (env RKV_CUDA_LT_TUNE_N, 0: cublasGemmEx's choice) */
    uint32_t lt_tune_n;
    int precise;     /* prefill gemms carry the activations' 16-bit rounding error (2 gemms) */
    uint32_t pair_n; /* the most tokens whose same-shaped gemm pairs (k and v, gate and up) run
                      * as one strided batch (cuda_matmul2); 0 off (env RKV_CUDA_PAIR_N) */
    int vec4; /* silu_mul and the f32 -> 16-bit conversion four elements a thread where n and the
               * pointers allow (env RKV_CUDA_VEC4=0: one) */
    /* rows up to which matmuls and linears take the decode kernels (env RKV_CUDA_GEMV_MAX_N,
     * 1..CUDA_GEMV_MAX_N); more rows go to cublas */
    uint32_t gemv_max_n;
    /* decode linears */
    int fuse;       /* fused decode ops (env RKV_CUDA_FUSE=0 turns them off, for a/b checks) */
    int lin_ks;     /* warps per weight row of the fused linears, 1/2/4/8 (env RKV_CUDA_LIN_KS) */
    int lin_stream; /* 1-token linears stream weights through shared memory (sm_90+; env
                     * RKV_CUDA_LIN_STREAM=0: the register kernel) */
    int lin_mma;    /* the fewest tokens (1..8) whose decode linears and matmuls over 16-bit
                     * weights run on tensor cores (linear_mma.cu); 0 off (env RKV_CUDA_LIN_MMA) */
    int pdl;        /* streamed linears launched with programmatic serialization: the next one
                     * prefetches its weights while this one ends (env RKV_CUDA_PDL=0: off) */
    uint32_t ls_stage, ls_ring; /* streamed linears: bytes per stage (target) and of the ring
                                 * (env RKV_CUDA_LS_STAGE_KB, RKV_CUDA_LS_RING_KB) */
    /* streamed linears' tiles: after its first ring of tiles a block takes the next one from
     * ls_ctr (tiles taken, blocks done; zero between launches) instead of a fixed range of
     * rows, so a block that starts late does less. Env RKV_CUDA_LS_DYN: 1 (default) all (the
     * adding ones, o and down, read the outputs they add to beside each tile's dot products),
     * 2 all but the adding ones (those then read their outputs once at the start), 0 none */
    int ls_dyn;
    int ls_t4; /* env RKV_CUDA_LS_T4=1: a tile's four dot products summed over the lanes at once */
    /* RKV_CUDA_EARLY=2: the streamed linear after decode attention (o) asks for more than half
     * an SM's shared memory, so that its blocks, landing as attention's drain, never share an
     * SM (gate/up's block still fits beside one); env RKV_CUDA_LS_ALONE=0: its own ring only */
    int ls_alone;
    /* attention */
    int no_mma; /* env RKV_CUDA_NO_MMA=1: f16-kv attention on the cuda cores (a/b check) */
    /* decode attention's key chunks by the tensor memory accelerator (env RKV_CUDA_DEC_TMA):
     * the device pool as rows of head_dim f16, 64-column boxes of 64 rows, 128-byte swizzle
     * (set_kv encodes it when the layout allows) */
    int dec_tma;
    int merge_in_attn; /* the last thread block of an attention launch merges its splits (env
                        * RKV_CUDA_MERGE_IN_ATTN=0: a separate merge kernel) */
    /* placement-independent attention (env RKV_CUDA_ATTN_FIXED=1): one split per kv block, the
     * splits merged in position order across both residencies, so a session's output does not
     * depend on which of its blocks are on the host (cuda_attn, cu_attn_merge) */
    int attn_fixed;
    int dec;        /* the packed decode attention kernel (env RKV_CUDA_DEC=0: the general one) */
    int fa;         /* prefill tiles on attn_fa_kernel (1, the default: f32-accurate products;
                     * 2: p plain f16, 3: q and p too; env RKV_CUDA_FA=0: attn_mma_kernel) */
    int dec_stages; /* attn_dec_kernel's key chunk stages: 0 by shape (cuda_dec_stages), 2, 3
                     * (env RKV_CUDA_DEC_STAGES) */
    int early;      /* 1: rope/kv write lets decode attention start at once, and attention
                     * queues the keys no kernel of the step writes before it waits; 2: attention
                     * lets the o linear start at once too (env RKV_CUDA_EARLY, 0 off) */
    /* 0, or the most key splits of an attention launch (env RKV_CUDA_MAX_SPLIT) */
    uint32_t max_split;
    uint32_t split_cost; /* chunk units one attention thread block costs beyond its own (its
                          * prologue, partial and merge) when the key split is picked (env
                          * RKV_CUDA_SPLIT_COST, default 1) */
    /* decode attention takes one block an SM when that leaves at most this many 64-key units
     * a split (env RKV_CUDA_ONE_WAVE, default 4; 0: the split cost model alone) */
    uint32_t one_wave;
    int deterministic; /* backend_opts.deterministic, or env RKV_CUDA_DETERMINISTIC=1 */
    int graph_on; /* decode steps as cuda graphs (env RKV_CUDA_GRAPH; struct cuda_graph) */
    /* the split host read */
    uint32_t host_split; /* the share from the environment (RKV_CUDA_HOST_SPLIT) */
    /* ... only for a batch whose decode rows read host blocks taking at least split_min_us of
     * the link a layer (env RKV_CUDA_HOST_SPLIT_MIN_US, default 1000) */
    uint32_t split_min_us;
    /* the split's cpu part as a host function (RKV_CUDA_HOST_SPLIT_ASYNC): 0 never, 1 always,
     * 2 (the default) for a batch whose decode rows' host tail takes at least split_async_us of
     * the link a layer (RKV_CUDA_HOST_SPLIT_ASYNC_US); a shorter one waits on the launching
     * thread, where it came out faster on the H200 */
    int split_async;
    uint32_t split_async_us;
    int split_learn_env;    /* the learned share (RKV_CUDA_HOST_SPLIT_LEARN) */
    uint32_t split_fix0_us; /* the learned share's first chain (RKV_CUDA_HOST_SPLIT_FIX_US) */
};

/* fills t from the environment (a warning naming a variable whose value is out of range,
 * and its default) and o (deterministic) */
void cuda_tune_read(struct cuda_tune *t, const struct backend_opts *o);
