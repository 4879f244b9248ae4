/* cuda_ctx.cuh - the cuda backend's context, error checks and small device helpers. */
#pragma once

#include <cublas_v2.h>
#include <cuda.h> /* CUtensorMap only: the driver is reached through cudart */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/backend.h"
#include "worker/backend_impl.h"
#include "worker/kv.h"
}

/* returns RKV_ECUDA from the calling function, logging the call that failed */
#define CU_TRY(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            log_error("cuda: %s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__,      \
                      __LINE__);                                                                   \
            return RKV_ECUDA;                                                                      \
        }                                                                                          \
    } while (0)

#define CUBLAS_TRY(call)                                                                           \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            log_error("cuda: %s failed: cublas status %d (%s:%d)", #call, (int)s_, __FILE__,       \
                      __LINE__);                                                                   \
            return RKV_ECUDA;                                                                      \
        }                                                                                          \
    } while (0)

/* checks the launch just queued */
#define CU_LAUNCHED() CU_TRY(cudaGetLastError())

/* device-side view of one step's batch, built on the host once per distinct
 * batch and kept on the device (every layer of a step reuses it) */
/* block lists per sequence: device blocks, host blocks (zero-copy), and the
 * host blocks renumbered by staging slot (copy path) */
#define CUDA_LIST_STAGED 2
#define CUDA_N_LISTS     3
struct cuda_seq_meta {
    uint32_t tok_off, n_tokens, n_past, pad;
    uint32_t list_off[CUDA_N_LISTS]; /* into the block lists */
    uint32_t list_len[CUDA_N_LISTS];
    uint32_t pad2[2];
};

/* one query tile: up to qt tokens of one sequence */
struct cuda_qtile {
    uint32_t seq, t0, nt, pad; /* t0 relative to the sequence's first token */
};

/* block list entry: position-order index j in the table, index in its pool */
/* decode steps of up to this many rows run as cuda graphs by default (RKV_CUDA_GRAPH=1): there
 * the launches weigh most, and a small batch keeps its shape for many steps; a large one changes
 * as sessions come and go, and each new shape costs a recording */
#define CUDA_GRAPH_ROWS 16

struct cuda_blk {
    uint32_t j, index;
};

struct cuda_meta {
    /* device arrays (one allocation, dev points at its start) */
    void *dev;
    size_t dev_cap;
    int32_t *d_pos;               /* (n_tokens) */
    uint32_t *d_slot;             /* (n_tokens) pool index | residency << 31 */
    /* (n_tokens) the staging slot a token's k, v go to instead (its host block is written
     * back from there: stage_w 2), or ~0u */
    uint32_t *d_wslot;
    struct cuda_seq_meta *d_seqs; /* (n_seqs) */
    struct cuda_blk *d_blks;      /* (sum of list lengths) */
    struct cuda_qtile *d_qtiles;  /* (n_qtiles) */
    /* host copy of what was uploaded, to see whether the next batch differs */
    void *host;
    size_t host_len, host_cap;
    uint32_t n_tokens, n_seqs, n_qtiles, qt;
    uint32_t max_units[CUDA_N_LISTS]; /* most blocks of one list in one sequence */
    uint32_t *stage_src;              /* (n_slots) host pool index copied into each staging slot */
    /* (n_slots) 0: no token of the batch writes that block; 1: the kv write stores its new
     * rows in the mapped pool (copied after the write); 2: in its staging slot (copied up
     * before the write with its old rows, the slot copied back to the pool after it: a prefill
     * chunk's rows, which the mapped pool takes at a seventh of the link's speed); 3: as 2,
     * but the write fills the block from its first row (no old rows: nothing copied up) */
    uint8_t *stage_w;
    uint32_t *stage_rows; /* (2 n_slots) rows [r0, r1) of its block the batch writes */
    uint32_t n_slots, stage_cap;
    uint32_t n_wb, n_wb_old; /* slots with stage_w 2 or 3, and with 2 */
    int host_writes;         /* some token of the batch stores into the mapped pool */
    /* a layer's host blocks past the staging limit go in passes of whole sequences (each
     * sequence's slots are contiguous): pass p stages slots [pass_slot0[p], + pass_nslots[p])
     * and attends with d_seqs_pass[p * n_seqs ...], where the staged lists of the other
     * sequences are empty. n_pass 0: one pass (or zero-copy, when one sequence is too big) */
    uint32_t n_pass, pass_cap;
    uint32_t *pass_slot0, *pass_nslots;
    struct cuda_seq_meta *d_seqs_pass;
    /* the split host read (c->host_split): sequence s's oldest cpu_k[s] read host blocks are
     * attended on the cpu, the gpu's host lists leave them out; any: some sequence has one */
    uint32_t *cpu_k, cpu_k_cap;
    int cpu_any;
    int split_gated; /* the split is on, but these decode rows' host tails are too short */
    int split_async; /* the split's cpu part runs as a host function (c->split_async) */
    uint64_t cpu_blocks; /* the cpu's blocks a layer (the cpu_k sum) */
    int decode_only;     /* every row one token: its split layers teach the learned share */
    uint64_t gen; /* bumped at every upload */
    int valid;
};

/* how host blocks reach the attention kernel */
enum cuda_host_read {
    CUDA_HOST_ZEROCOPY = 0, /* the kernel reads the mapped pool over pcie */
    CUDA_HOST_COPY = 1,     /* copy engine into staging, one layer ahead */
};

struct cuda_ctx {
    int dev;
    int n_sm;
    cudaStream_t stream;      /* every op runs here, in call order */
    cudaStream_t side;        /* host-block attention, overlapping device attention */
    cudaEvent_t ev_pre_attn;  /* on stream, before the last device attention */
    cudaEvent_t ev_side_done; /* on side, after host attention */
    int side_pending;         /* stream must wait for ev_side_done before its next op */
    int last_was_dev_attn;
    cublasHandle_t blas;
    void *blas_ws; /* cublas's workspace, ours so graph capture keeps its algorithms */
    size_t blas_ws_bytes;
    /* gemm_lt.cu: 16-bit gemms of 9..lt_tune_n tokens on the cuBLASLt algorithm measured
     * fastest (env RKV_CUDA_LT_TUNE_N, 0: cublasGemmEx's choice) */
    struct cuda_lt *lt;
    uint32_t lt_tune_n;
    int no_mma;  /* env RKV_CUDA_NO_MMA=1: f16-kv attention on the cuda cores (a/b check) */
    int precise; /* prefill gemms carry the activations' 16-bit rounding error (2 gemms) */

    struct kv_layout layout;
    int have_kv;
    char *pool[KV_N_POOLS]; /* device-visible base per residency */
    /* decode attention's key chunks by the tensor memory accelerator (env RKV_CUDA_DEC_TMA):
     * the device pool as rows of head_dim f16, 64-column boxes of 64 rows, 128-byte swizzle
     * (a CUtensorMap's bytes; set_kv encodes it when the layout allows) */
    int dec_tma;
    int kv_tma;
    uint64_t kv_tmap[16];
    uint32_t n_blocks[KV_N_POOLS];
    void *registered[KV_N_POOLS]; /* host ranges this backend registered */

    struct cuda_meta meta;

    /* host-block staging (copy path): two buffers, layer parity */
    int host_read;   /* enum cuda_host_read, measured at set_kv */
    /* CPU_TAIL: host blocks attended by a cpu backend over the host pool (host_attn_cpu, env
     * RKV_CUDA_HOST_READ=cpu), q down and the partial up over pcie */
    int host_cpu;
    uint32_t cpu_threads;
    struct backend *cpu_be;
    int cpu_kv_set;             /* cpu_be has this set_kv's pools */
    struct be_tensor *cpu_t[4]; /* q, o, m, l on the cpu backend */
    /* the split host read (env RKV_CUDA_HOST_SPLIT=P, 1..100): P % of each sequence's host
     * blocks (the oldest) attended by cpu_be while the gpu reads the rest over pcie, the two
     * partials merged by lse; 0: off. q comes down into qdown (pinned), ev_qdown after it */
    uint32_t host_split;
    /* ... only for a batch whose decode rows read host blocks taking at least split_min_us of
     * the link a layer (env RKV_CUDA_HOST_SPLIT_MIN_US, default 1000): the cpu's part stands on
     * the layer's critical path beside the gpu's own work, which a short tail does not hide;
     * link_gbps: the copy engine's measured rate (50 when not measured) */
    uint32_t split_min_us;
    double link_gbps;
    /* the learned share (RKV_CUDA_HOST_SPLIT_LEARN=1 with the worker's host_split -1):
     * host_split is then the share of the measured rates, where the cpu's rate starts; each
     * step's share comes from split_l (kv_split_share), which the split layers teach
     * (kv_split_observe): the time from a layer's q on the host to the next layer's, the cpu's
     * part of it, whether the gpu's part was done first. split_fix0_us: the chain it starts
     * from (RKV_CUDA_HOST_SPLIT_FIX_US) */
    int split_learn, split_learn_env, split_l_init;
    /* the split's cpu part as a host function (RKV_CUDA_HOST_SPLIT_ASYNC): queued on cpu_s
     * behind q's copy down (ev_qdown), so the launching thread queues the rest of the layer at
     * once; the side stream waits for ev_cpu_done before the partial (split_up, pinned) goes
     * up. split_jobs: one per layer (the launching thread runs ahead of them); split_v: the
     * step's cpu view, built once a step (split_v_gen: the meta it was built for, 0 none);
     * split_async_rc: a job's error, returned at the next sync. split_async 0: never, 1:
     * always, 2 (the default): for a batch whose decode rows' host tail takes at least
     * split_async_us of the link a layer (RKV_CUDA_HOST_SPLIT_ASYNC_US); a shorter one waits
     * on the launching thread, where it came out faster on the H200 */
    int split_async;
    uint32_t split_async_us;
    cudaStream_t cpu_s;
    cudaEvent_t ev_cpu_done;
    struct split_job *split_jobs;
    uint32_t split_jobs_n;
    struct be_batch split_v;
    uint64_t split_v_gen;
    float *split_up;
    size_t split_up_cap;
    int split_async_rc;
    struct kv_split_learn split_l;
    uint32_t split_fix0_us;
    struct {
        int valid;      /* a split layer waits for the next one's q to close its period */
        uint32_t layer; /* its layer */
        uint64_t q_ns;  /* when its q was on the host */
        double cpu_us;  /* the cpu's attention */
        int gpu_first;  /* the gpu's part was done when the cpu's ended */
    } split_prev;
    void *qdown;
    size_t qdown_cap;
    cudaEvent_t ev_qdown;
    struct be_seq *split_seqs; /* the cpu's view of the batch: the gpu's host blocks hidden */
    struct kv_block_ref *split_tab;
    size_t split_seqs_cap, split_tab_cap;
    char *host_base; /* the host pool's host address */
    cudaStream_t copy;
    cudaEvent_t ev_copy_done[2];  /* on copy: staging buffer filled */
    cudaEvent_t ev_stage_free[2]; /* on side: attention done with it */
    /* write-back (meta stage_w 2): the kv write stores a prefill chunk's rows of a host block
     * in its staging slot, and the wb stream copies the slot back to the pool; the staging
     * copy queues those slots first and records ev_wready after them (stg_wready), the kv write
     * waits for it; ev_kvw (stream) after the kv write, ev_wb_done (wb) after the copies back,
     * which the stream joins at its next op (wb_pending) and the next copy into the buffer
     * waits for (wb_used). wb_on: env RKV_CUDA_HOST_WB (1; 0 off) */
    int wb_on;
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
    size_t stage_limit; /* bytes per staging buffer; larger tails read zero-copy */
    size_t pass_limit;  /* bytes of one staging pass (RKV_CUDA_STAGE_PASS_KB); 0 (env
                         * RKV_CUDA_STAGE_PASSES=0): no passes, larger tails zero-copy */
    int stage_batch;    /* one cudaMemcpyBatchAsync a layer (env RKV_CUDA_STAGE_BATCH=0: a
                         * copy per run of consecutive blocks; off when the driver refuses) */
    void **bat_dst;     /* its copies' destinations, sources and sizes */
    const void **bat_src;
    size_t *bat_size;
    uint32_t bat_cap;
    void *pass_part; /* the partial of a pass after the first, merged into the host one */
    size_t pass_part_cap;
    int dev_greedy;   /* greedy rows picked on the device (env RKV_CUDA_DEV_GREEDY=0: on the
                       * host, by the worker's sampler) */
    void *greedy_buf; /* its ids and logprobs */
    size_t greedy_cap;
    int dev_sample; /* sampled rows picked on the device (env RKV_CUDA_DEV_SAMPLE=0: on the
                     * host, from their logits) */
    void *smp_dev;  /* its rows, penalty ids, saved logits, picks and scratch */
    size_t smp_dev_cap;
    int smp_stamps; /* each sampled row's phase times to stderr (RKV_CUDA_SAMPLE_STAMPS) */
    uint32_t smp_min; /* the fewest rows a step samples here (RKV_CUDA_DEV_SAMPLE_MIN) */
    uint32_t smp_cl;  /* blocks a row for a step of few rows (RKV_CUDA_SAMPLE_CL: 1, 2, 4, 8) */
    uint32_t smp_cl_rows; /* the most rows a step has for that (RKV_CUDA_SAMPLE_CL_ROWS) */
    void *smp_host; /* pinned: the rows and penalty ids up, the picks down */
    size_t smp_host_cap;

    /* growable scratch (stream-ordered reuse) */
    void *act16; /* activations converted to f16/bf16 */
    size_t act16_cap;
    /* act16 holds act16_src (act16_elems floats) in act16_type, and no op but matmuls over
     * that input came since (the q, k, v and the gate, up gemms of a prefill share one) */
    const float *act16_src;
    size_t act16_elems;
    int act16_type, act16_ok;
    int act16_twin; /* act16 was written by the op that wrote act16_src, not converted */
    /* a decode step's layers as a cuda graph (cu_graph_begin; env RKV_CUDA_GRAPH: 1, the
     * default, steps of up to CUDA_GRAPH_ROWS rows; 2 every decode step; 0 none): recorded when
     * a step repeats the last one's shape, replayed while it holds */
    int graph_on;
    struct {
        cudaGraphExec_t exec; /* the recording of key, or NULL */
        uint64_t key;
        uint64_t seen;  /* the shape of the last step run as usual */
        uint64_t rec;   /* the shape being recorded */
        uint64_t bad;   /* a shape whose recording failed: run as usual */
        int capturing;  /* the stream is recording */
        int cap_failed; /* an op could not take part in the recording */
    } graph;
    uint64_t scratch_gen; /* cuda_scratch reallocations: a recording holds the old pointers */
    void *wdeq; /* q8_0 weights dequantized to f16 for prefill */
    size_t wdeq_cap;
    void *part[KV_N_POOLS]; /* attention split partials, per residency (two streams) */
    size_t part_cap[KV_N_POOLS];
    void *cnt[KV_N_POOLS]; /* split counters of the merge folded into attention, per residency */
    size_t cnt_cap[KV_N_POOLS];
    void *small; /* token ids, row indexes */
    size_t small_cap;
    void *lin_h; /* normed input of a fused linear layer (3+ tokens) */
    size_t lin_h_cap;
    int vec4; /* silu_mul and the f32 -> 16-bit conversion four elements a thread where n and the
               * pointers allow (env RKV_CUDA_VEC4=0: one) */
    uint32_t pair_n;   /* the most tokens whose same-shaped gemm pairs (k and v, gate and up) run
                        * as one strided batch (cuda_matmul2); 0 off (env RKV_CUDA_PAIR_N, 64) */
    int merge_in_attn; /* the last thread block of an attention launch merges its splits (env
                        * RKV_CUDA_MERGE_IN_ATTN=0: a separate merge kernel) */
    /* placement-independent attention (env RKV_CUDA_ATTN_FIXED=1): one split per kv block, the
     * splits merged in position order across both residencies, so a session's output does not
     * depend on which of its blocks are on the host (cuda_attn, cu_attn_merge) */
    int attn_fixed;
    struct {
        int valid, list; /* this residency's last launch left per-block partials of list */
        uint32_t n_split, layer;
        uint64_t gen; /* of the meta it ran over */
    } fixed[KV_N_POOLS];
    int dec;        /* the packed decode attention kernel (env RKV_CUDA_DEC=0: the general one) */
    int fa;         /* prefill tiles on attn_fa_kernel (1, the default: f32-accurate products;
                     * 2: p plain f16, 3: q and p too; env RKV_CUDA_FA=0: attn_mma_kernel) */
    int fuse;       /* fused decode ops (env RKV_CUDA_FUSE=0 turns them off, for a/b checks) */
    int lin_ks;     /* warps per weight row of the fused linears, 1/2/4/8 (env RKV_CUDA_LIN_KS) */
    int lin_stream; /* 1-token linears stream weights through shared memory (sm_90+; env
                     * RKV_CUDA_LIN_STREAM=0: the register kernel) */
    int lin_mma;    /* the fewest tokens (1..8) whose decode linears and matmuls over 16-bit
                     * weights run on tensor cores (linear_mma.cu); 0 off (env RKV_CUDA_LIN_MMA) */
    int pdl;        /* streamed linears launched with programmatic serialization: the next one
                     * prefetches its weights while this one ends (env RKV_CUDA_PDL=0: off) */
    int dec_stages; /* attn_dec_kernel's key chunk stages: 0 by shape (cuda_dec_stages), 2, 3
                     * (env RKV_CUDA_DEC_STAGES) */
    int early;      /* 1: rope/kv write lets decode attention start at once, and attention
                     * queues the keys no kernel of the step writes before it waits; 2: attention
                     * lets the o linear start at once too (env RKV_CUDA_EARLY, 0 off) */
    /* 0, or the most key splits of an attention launch (env RKV_CUDA_MAX_SPLIT) */
    uint32_t max_split;
    /* rows up to which matmuls and linears take the decode kernels (env RKV_CUDA_GEMV_MAX_N,
     * 1..CUDA_GEMV_MAX_N); more rows go to cublas */
    uint32_t gemv_max_n;
    uint32_t split_cost; /* chunk units one attention thread block costs beyond its own (its
                          * prologue, partial and merge) when the key split is picked (env
                          * RKV_CUDA_SPLIT_COST, default 1) */
    /* batch-invariant kernels (backend_opts.deterministic): each row's numbers do not depend on
     * the other rows of the step, the placement of its blocks or prefill against decode */
    int deterministic;
    int cc_major;               /* compute capability */
    uint32_t ls_stage, ls_ring; /* streamed linears: bytes per stage (target) and of the ring
                                 * (env RKV_CUDA_LS_STAGE_KB, RKV_CUDA_LS_RING_KB) */
    /* streamed linears' tiles: after its first ring of tiles a block takes the next one from
     * ls_ctr (tiles taken, blocks done; zero between launches) instead of a fixed range of
     * rows, so a block that starts late does less. Env RKV_CUDA_LS_DYN: 1 (default) all (the
     * adding ones, o and down, read the outputs they add to beside each tile's dot products),
     * 2 all but the adding ones (those then read their outputs once at the start), 0 none */
    int ls_dyn;
    uint32_t *ls_ctr;
    int ls_t4; /* env RKV_CUDA_LS_T4=1: a tile's four dot products summed over the lanes at once */
    /* RKV_CUDA_EARLY=2: the streamed linear after decode attention (o) asks for more than half
     * an SM's shared memory, so that its blocks, landing as attention's drain, never share an
     * SM (gate/up's block still fits beside one); env RKV_CUDA_LS_ALONE=0: its own ring only */
    int ls_alone;
    int after_attn; /* the launch before was decode attention letting its dependents start */
    size_t smem_sm; /* shared memory of an SM, and what the runtime keeps of it a block */
    size_t smem_rsv;
    /* decode attention takes one block an SM when that leaves at most this many 64-key units
     * a split (env RKV_CUDA_ONE_WAVE, default 4; 0: the split cost model alone) */
    uint32_t one_wave;
    /* counters since the last stats call (cu_stats): how host blocks were read, then the
     * gemms' 16-bit inputs and the decode graphs */
    struct {
        uint64_t prefetched; /* layers whose copies the previous layer queued */
        uint64_t inline_;    /* layers copied when asked (after the stream's work so far) */
        uint64_t host_write; /* ... of which the step wrote into a host block */
        uint64_t zero_copy;  /* layers too big to stage, read in place */
        uint64_t grown;      /* staging buffer reallocations (each waits for the gpu) */
        uint64_t wb_layers;  /* layers whose kv write went to staging slots (write-back) */
        uint64_t wb_slots;   /* ... and the block slices copied back to the pool */
        uint64_t slots;      /* host block slices staged */
        uint64_t copies;     /* ... in this many copies (runs of consecutive blocks) */
        uint64_t cpu_layers; /* layers whose host blocks the cpu attended (CPU_TAIL) */
        uint64_t split_layers; /* layers whose host blocks the cpu and the gpu shared */
        uint64_t split_gated;  /* ... and those left to the gpu: the tail was too short */
        uint64_t split_async;  /* split layers whose cpu part ran as a host function */
        double split_share;    /* the sum of the split steps' shares (learned) */
        double tail_us;        /* the sum of the split-on batches' decode tails, in link us a
                                  layer, over tail_n batches (what the gates compare) */
        uint64_t tail_n;
        uint64_t split_steps;  /* ... and those steps */
        uint64_t passes;     /* layers staged in several passes, and the passes */
        uint64_t pass_n;
        /* cublas gemms over 16-bit activations: inputs converted for them, and inputs whose
         * 16-bit copy the op that wrote them left in act16 (rmsnorm, silu_mul) */
        uint64_t act16_conv, act16_twin;
        /* gemm_lt.cu: gemms run, shapes tuned, and those whose fastest was not the
         * heuristic's first */
        uint64_t lt_gemm, lt_tuned, lt_faster;
        uint64_t graph_rec, graph_replay, graph_fail; /* decode steps' layers as a graph */
        uint64_t lin_mma; /* linears and matmuls linear_mma.cu ran (replays not counted) */
        uint64_t dec_tma; /* decode attention launches by tensor copies (replays not counted) */
        uint64_t mm_pair; /* gemm pairs run as one strided batch (cuda_matmul2; the same) */
        uint64_t smp_rows; /* rows sampled on the device (cu_sample) */
        uint64_t smp_back; /* of those, rows it gave back to the host's sampler */
    } hst;
};

/* host -> device rates over the two paths, GB/s (set_kv picks by these) */
int cuda_measure_host_paths(double *copy_gbps, double *zerocopy_gbps);

/* grows a scratch buffer to at least `need` bytes */
int cuda_scratch(struct cuda_ctx *c, void **buf, size_t *cap, size_t need);

/* the kv block a step's write slot names (pool index | residency << 31) */
__device__ __forceinline__ char *cuda_kv_block(char *pool0, char *pool1, uint32_t slot,
                                               size_t block_bytes)
{
    return ((slot >> 31) ? pool1 : pool0) + (size_t)(slot & 0x7fffffffu) * block_bytes;
}

/* rotation of pair i (of n_rot/2) at position pos: theta = pos * scale *
 * base^(-2i/n_rot) in double (positions reach 1e5+ radians), reduced to
 * [-pi, pi] before a float sincos */
__device__ __forceinline__ void cuda_rope_sincos(int32_t pos, uint32_t i, uint32_t n_rot,
                                                 float base, float scale, float *sn, float *cs)
{
    double theta = (double)pos * scale * exp2(-2.0 * i / (double)n_rot * log2((double)base));
    const double two_pi = 6.283185307179586;
    float red = (float)(theta - two_pi * rint(theta / two_pi));
    sincosf(red, sn, cs);
}

/* element loads of every weight type as f32 */
__device__ __forceinline__ float cuda_ld(const float *p, size_t i)
{
    return p[i];
}
__device__ __forceinline__ float cuda_ld(const __half *p, size_t i)
{
    return __half2float(p[i]);
}
__device__ __forceinline__ float cuda_ld(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}

/* one q8_0 value: row of 34-byte blocks (f16 scale, 32 int8) */
__device__ __forceinline__ float cuda_q8_0(const uint8_t *row, uint32_t i)
{
    const uint8_t *b = row + (size_t)(i / 32) * 34;
    __half d = __ushort_as_half((unsigned short)(b[0] | (b[1] << 8)));
    return __half2float(d) * (float)(int8_t)b[2 + i % 32];
}

/* value i of a row of any be_type */
__device__ __forceinline__ float cuda_row_value(int type, const void *row, uint32_t i)
{
    switch (type) {
    case BE_F32: return ((const float *)row)[i];
    case BE_F16: return __half2float(((const __half *)row)[i]);
    case BE_BF16: return __bfloat162float(((const __nv_bfloat16 *)row)[i]);
    default: return cuda_q8_0((const uint8_t *)row, i);
    }
}

/* 16 bytes of a row -> 16/sizeof(T) floats (the pointer only picks the type) */
__device__ __forceinline__ void cuda_unpack16(const uint4 &u, const float *, float *f)
{
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void cuda_unpack16(const uint4 &u, const __half *, float *f)
{
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 x = __half22float2(h[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}
__device__ __forceinline__ void cuda_unpack16(const uint4 &u, const __nv_bfloat16 *, float *f)
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
