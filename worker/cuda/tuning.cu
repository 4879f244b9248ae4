/* tuning.cu - the cuda backend's switches, read from the environment once at start. */
#include <stdlib.h>

#include "worker/cuda/cuda_ops.cuh"

/* a size in KiB, and a 0/1 switch, from the environment (common/util's reading: def when
 * unset, a warning naming the variable and def when not a number in range) */
static uint32_t cu_env_kb(const char *name, uint32_t def, uint32_t lo, uint32_t hi)
{
    return (uint32_t)rkv_env_u64(name, def, lo, hi);
}
static int cu_env_flag(const char *name, int def)
{
    return (int)rkv_env_u64(name, (uint64_t)def, 0, 1);
}

void cuda_tune_read(struct cuda_tune *t, const struct backend_opts *o)
{
    /* staging per buffer: env RKV_CUDA_STAGE_MB, default 512 MiB (a 128k host tail of
     * llama3-8b's f16 kv per layer); both buffers count in the compute reserve the worker
     * reports, larger tails are read zero-copy */
    t->stage_limit = (size_t)rkv_env_u64("RKV_CUDA_STAGE_MB", 512, 0, 1u << 20) << 20;
    /* a prefill chunk's rows of a staged host block (an eighth of the block or more) go
     * into its staging slot and are copied back, not stored over pcie by the kv write (a
     * 512-token chunk of llama3-8b: 282 us a layer into the mapped pool, 19 into device
     * memory); env RKV_CUDA_HOST_WB=0: the kv write stores them in the mapped pool */
    t->wb_on = cu_env_flag("RKV_CUDA_HOST_WB", 1);
    /* greedy rows picked on the device (env RKV_CUDA_DEV_GREEDY=0: on the host) */
    t->dev_greedy = cu_env_flag("RKV_CUDA_DEV_GREEDY", 1);
    /* sampled rows picked on the device (env RKV_CUDA_DEV_SAMPLE=0: on the host) */
    t->dev_sample = cu_env_flag("RKV_CUDA_DEV_SAMPLE", 1);
    t->smp_stamps = cu_env_flag("RKV_CUDA_SAMPLE_STAMPS", 0);
    t->smp_min = (uint32_t)rkv_env_u64("RKV_CUDA_DEV_SAMPLE_MIN", 1, 1, 1u << 20);
    /* a step of up to 8 sampled rows: a cluster of 8 blocks (8 SMs) a row, since one
     * block streams a 128k vocab at ~30 GB/s; a power of two to 8 (1: a block a row) */
    t->smp_cl = (uint32_t)rkv_env_u64("RKV_CUDA_SAMPLE_CL", 8, 1, 8);
    if (t->smp_cl & (t->smp_cl - 1)) {
        rkv_log(RKV_LOG_WARN, "RKV_CUDA_SAMPLE_CL=%u is not 1, 2, 4 or 8; using 8", t->smp_cl);
        t->smp_cl = 8;
    }
    t->smp_cl_rows = (uint32_t)rkv_env_u64("RKV_CUDA_SAMPLE_CL_ROWS", 8, 0, 1u << 20);
    /* a layer's host blocks staged by one batched copy call (H200: 40 window sessions at
     * 53 GB/s, 0.97 of the pcie bound, against 47 GB/s in a copy per run of blocks; env
     * RKV_CUDA_STAGE_BATCH=0: the copies per run) */
    t->stage_batch = cu_env_flag("RKV_CUDA_STAGE_BATCH", 1);
    /* staging passes: a layer's host tails past RKV_CUDA_STAGE_PASS_KB (default: the
     * staging limit) go in passes of whole sequences instead of zero-copy reads (H200, 40
     * window sessions of ~32k: 0.85 of the pcie bound, against 0.2-0.4 read zero-copy) */
    if (cu_env_flag("RKV_CUDA_STAGE_PASSES", 1)) {
        uint32_t kb = cu_env_kb("RKV_CUDA_STAGE_PASS_KB", 0, 0, 1u << 30);
        t->pass_limit = kb ? (size_t)kb << 10 : t->stage_limit;
        if (t->pass_limit > t->stage_limit)
            t->pass_limit = t->stage_limit;
    }
    /* a workspace of our own: under stream capture cublas does not use its default pool
     * and may take other algorithms (the split-k ones of a 64-row gemm); 32 MiB is cublas's
     * advice for Hopper. RKV_CUDA_BLAS_WS_MB=0: cublas's own pool (a/b) */
    t->blas_ws = (size_t)rkv_env_u64("RKV_CUDA_BLAS_WS_MB", 32, 0, 1024) << 20;
    /* gemms of 9..N tokens (batched decode) on the cuBLASLt algorithm timed fastest at
     * the shape's first eager call (gemm_lt.cu); 0: cublasGemmEx's heuristic choice */
    t->lt_tune_n = (uint32_t)rkv_env_u64("RKV_CUDA_LT_TUNE_N", 256, 0, 1u << 16);
    t->precise = cu_env_flag("RKV_CUDA_PRECISE", 0);
    t->fuse = cu_env_flag("RKV_CUDA_FUSE", 1);
    t->dec = cu_env_flag("RKV_CUDA_DEC", 1);
    /* 1: f32-accurate products; 2, 3: p, then q and p, plain f16 (a/b of the cost); 0: the
     * older attn_mma_kernel (2.5x slower at 4k, 5.4x at 32k on the H200, tenth session) */
    t->fa = (int)rkv_env_u64("RKV_CUDA_FA", 1, 0, 3);
    /* the split host read: percent of each sequence's host blocks on the cpu (0: off) */
    t->host_split = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT", 0, 0, 100);
    /* the split's cpu part off the launching thread: 0 never, 1 always, 2 for a tail of at
     * least split_async_us of the link a layer (not with the learned share, whose samples
     * are the launching thread's waits). H200, llama3-8b batch 16 at 4k, of the link's
     * bound: at 25 / 50 / 87.5 % host 0.992 / 1.110 / 1.231 against 0.906 / 0.975 / 1.053
     * waiting on the launching thread; the ramp at 24-40 sessions +7-19 % tok/s, at 20
     * (about 1 ms a layer) -9-12 % (thirty-second session) */
    t->split_async = (int)rkv_env_u64("RKV_CUDA_HOST_SPLIT_ASYNC", 2, 0, 2);
    t->split_async_us = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT_ASYNC_US", 1200, 0, 1000000);
    /* the learned share (a/b runs; tests: from the environment's share) */
    t->split_learn_env = cu_env_flag("RKV_CUDA_HOST_SPLIT_LEARN", 0);
    t->split_min_us = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT_MIN_US", 1000, 0, 1000000);
    /* the learned share's first chain: the H200's at batch 20 (400-475 us a layer) */
    t->split_fix0_us = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT_FIX_US", 400, 0, 100000);
    t->merge_in_attn = cu_env_flag("RKV_CUDA_MERGE_IN_ATTN", 1);
    /* batch 64 at 4k: 4557 / 4624 tok/s against 4468 / 4453 with two gemms; prefill 4k / 32k
     * 24624 / 10278 against 24063 / 10150 (H200) */
    t->pair_n = (uint32_t)rkv_env_u64("RKV_CUDA_PAIR_N", 1u << 16, 0, 1u << 16);
    t->vec4 = cu_env_flag("RKV_CUDA_VEC4", 1);
    t->attn_fixed = cu_env_flag("RKV_CUDA_ATTN_FIXED", 0);
    t->no_mma = cu_env_flag("RKV_CUDA_NO_MMA", 0);
    /* warps per weight row in the fused decode linears (for a/b runs) */
    const char *ke = getenv("RKV_CUDA_LIN_KS");
    t->lin_ks = 2;
    if (ke) {
        int v = atoi(ke);
        if (v == 1 || v == 2 || v == 4 || v == 8)
            t->lin_ks = v;
        else
            log_warn("RKV_CUDA_LIN_KS=%.20s is not 1, 2, 4 or 8: using 2", ke);
    }
    t->lin_stream = cu_env_flag("RKV_CUDA_LIN_STREAM", 1);
    /* decode linears and matmuls of up to 8 tokens on tensor cores from this many tokens (0:
     * the register kernels; one token takes the streamed kernel first) */
    t->lin_mma = (int)rkv_env_u64("RKV_CUDA_LIN_MMA", 2, 0, 8);
    t->pdl = cu_env_flag("RKV_CUDA_PDL", 1);
    /* 2: o's blocks take half an SM's shared memory (ls_alone), else they double up on
     * the SMs attention frees first (0.61 of the hbm bound at 4k against 0.76, eighth
     * session); with that, 2 reads the same as 1 (b=1 32k +0.3-0.8 %, 4k -0.6-0 %,
     * twenty-seventh session): o's weights streamed beside attention slow its keys */
    t->early = (int)rkv_env_u64("RKV_CUDA_EARLY", 1, 0, 2);
    /* decode attention's key chunk stages: 0 by the launch's shape (cuda_dec_stages), 2
     * or 3 for every launch (a/b) */
    t->dec_stages = (int)rkv_env_u64("RKV_CUDA_DEC_STAGES", 0, 0, 3);
    if (t->dec_stages == 1) {
        log_warn("RKV_CUDA_DEC_STAGES=1 is not 0 (by shape), 2 or 3: using 0");
        t->dec_stages = 0;
    }
    /* decode attention's device key chunks: 2 by tensor copies read evict-first in L2, 1 by
     * tensor copies, 0 by cp.async (kv_tmap_encode). H200, llama3-8b, same call: isolated
     * attention 32k / 128k / b=64 x 4k 0.671 / 0.836 / 0.884 of HBM with 1 against 0.618 /
     * 0.798 / 0.836 with 0; decode b=1 32k 0.869-0.871 against 0.863-0.864, b=64
     * 0.753-0.763 against 0.732-0.736. 2 against 1 (next call): 32k / 128k / b=64 0.691 /
     * 0.854 / 0.893 against 0.661 / 0.844 / 0.876, decode b=1 4k 0.879 against 0.870-0.876 */
    t->dec_tma = (int)rkv_env_u64("RKV_CUDA_DEC_TMA", 2, 0, 2);
    t->split_cost = (uint32_t)rkv_env_u64("RKV_CUDA_SPLIT_COST", 1, 0, 64);
    t->max_split = (uint32_t)rkv_env_u64("RKV_CUDA_MAX_SPLIT", 0, 0, 1u << 16);
    /* steps of up to this many rows on the decode kernels (weights read once, x from
     * registers); more rows on cublas. Deterministic mode keeps 8-row chunks */
    t->gemv_max_n =
        (uint32_t)rkv_env_u64("RKV_CUDA_GEMV_MAX_N", CUDA_GEMV_MAX_N, 1, CUDA_GEMV_MAX_N);
    /* env RKV_CUDA_DETERMINISTIC=1: the same for programs without the option (gpu_bench) */
    t->deterministic = o->deterministic || cu_env_flag("RKV_CUDA_DETERMINISTIC", 0);
    if (t->deterministic) {
        /* one split per kv block merged in block order, decode on the prefill kernel's
         * arithmetic, one linear kernel for every token count */
        t->attn_fixed = 1;
        t->dec = 0;
        t->fa = 0; /* a prefilled row would not round as the same row decoded */
        t->lin_stream = 0;
    }
    /* streamed linears: 32 KiB stages (16 KiB: 0.56 of hbm on gate/up, 32: 0.89), a ring
     * under half an SM's shared memory, so the next launch's block fits beside this one */
    t->ls_stage = cu_env_kb("RKV_CUDA_LS_STAGE_KB", 32, 4, 64) << 10;
    t->ls_ring = cu_env_kb("RKV_CUDA_LS_RING_KB", 96, 16, 200) << 10;
    t->ls_dyn = (int)rkv_env_u64("RKV_CUDA_LS_DYN", 1, 0, 2);
    t->ls_t4 = cu_env_flag("RKV_CUDA_LS_T4", 1);
    t->ls_alone = cu_env_flag("RKV_CUDA_LS_ALONE", 1);
    /* one attention block an SM up to 4 key units a split (b=1 4k: 0.842 / 0.849 of the
     * bound against 0.842 / 0.838; every block starts beside q/k/v's: attn_pick_split) */
    t->one_wave = (uint32_t)rkv_env_u64("RKV_CUDA_ONE_WAVE", 4, 0, 64);
    /* 1: steps of up to CUDA_GRAPH_ROWS rows, 2: every decode step, 0: none */
    t->graph_on = (int)rkv_env_u64("RKV_CUDA_GRAPH", 1, 0, 2);
}
