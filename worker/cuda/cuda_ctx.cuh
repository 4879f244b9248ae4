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

#include "worker/cuda/graph.cuh"
#include "worker/cuda/host_cpu.cuh"
#include "worker/cuda/meta.cuh"
#include "worker/cuda/quant.cuh"
#include "worker/cuda/sample_host.cuh"
#include "worker/cuda/stage.cuh"
#include "worker/cuda/tuning.h"

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

/* counters since the last stats call (cu_stats): how host blocks were read, then the gemms'
 * 16-bit inputs and the decode graphs */
struct cuda_stats {
    uint64_t prefetched;   /* layers whose copies the previous layer queued */
    uint64_t inline_;      /* layers copied when asked (after the stream's work so far) */
    uint64_t host_write;   /* ... of which the step wrote into a host block */
    uint64_t zero_copy;    /* layers too big to stage, read in place */
    uint64_t grown;        /* staging buffer reallocations (each waits for the gpu) */
    uint64_t wb_layers;    /* layers whose kv write went to staging slots (write-back) */
    uint64_t wb_slots;     /* ... and the block slices copied back to the pool */
    uint64_t slots;        /* host block slices staged */
    uint64_t copies;       /* ... in this many copies (runs of consecutive blocks) */
    uint64_t cpu_layers;   /* layers whose host blocks the cpu attended (CPU_TAIL) */
    uint64_t split_layers; /* layers whose host blocks the cpu and the gpu shared */
    uint64_t split_gated;  /* ... and those left to the gpu: the tail was too short */
    uint64_t split_async;  /* split layers whose cpu part ran as a host function */
    double tail_us;        /* the sum of the split-on batches' decode tails, in link us a
                              layer, over tail_n batches (what the gates compare) */
    uint64_t tail_n;
    uint64_t passes; /* layers staged in several passes, and the passes */
    uint64_t pass_n;
    /* cublas gemms over 16-bit activations: inputs converted for them, and inputs whose
     * 16-bit copy the op that wrote them left in act16 (rmsnorm, silu_mul) */
    uint64_t act16_conv, act16_twin;
    /* gemm_lt.cu: gemms run, shapes tuned, and those whose fastest was not the
     * heuristic's first */
    uint64_t lt_gemm, lt_tuned, lt_faster;
    uint64_t graph_rec, graph_replay, graph_fail; /* decode steps' layers as a graph */
    uint64_t lin_mma;  /* linears and matmuls linear_mma.cu ran (replays not counted) */
    uint64_t dec_tma;  /* decode attention launches by tensor copies (replays not counted) */
    uint64_t mm_pair;  /* gemm pairs run as one strided batch (cuda_matmul2; the same) */
    uint64_t smp_rows; /* rows sampled on the device (cu_sample) */
    uint64_t smp_back; /* of those, rows it gave back to the host's sampler */
};

/* the backend's state: the device and its streams, the kv pools, scratch, and one part per
 * concern (each in its own file) */
struct cuda_ctx {
    int dev;
    int n_sm;
    int cc_major;             /* compute capability */
    cudaStream_t stream;      /* every op runs here, in call order */
    cudaStream_t side;        /* host-block attention, overlapping device attention */
    cudaEvent_t ev_pre_attn;  /* on stream, before the last device attention */
    cudaEvent_t ev_side_done; /* on side, after host attention */
    int side_pending;         /* stream must wait for ev_side_done before its next op */
    int last_was_dev_attn;
    cublasHandle_t blas;
    void *blas_ws; /* cublas's workspace, ours so graph capture keeps its algorithms */
    size_t blas_ws_bytes;
    struct cuda_lt *lt; /* gemm_lt.cu's tuned algorithms */
    struct cuda_tune tune;
    /* batch-invariant kernels (backend_opts.deterministic, or the deterministic knob, which
     * holds the mode in effect): each row's numbers do not depend on the other rows of the
     * step, the placement of its blocks or prefill against decode. The packed decode
     * attention, the prefill flash kernel and the streamed linears are off then */
    int deterministic;

    struct kv_layout layout;
    int have_kv;
    char *pool[KV_N_POOLS]; /* device-visible base per residency */
    char *host_base;        /* the host pool's host address */
    uint32_t n_blocks[KV_N_POOLS];
    void *registered[KV_N_POOLS]; /* host ranges this backend registered */
    /* the device pool as a tensor map for decode attention's key chunks (a CUtensorMap's
     * bytes, set_kv encodes it when the layout allows) */
    int kv_tma;
    uint64_t kv_tmap[16];

    struct cuda_meta meta;     /* meta.cu */
    struct cuda_graph graph;   /* graph.cu */
    struct cuda_stage stage;   /* stage.cu */
    struct cuda_host_cpu hcpu; /* host_cpu.cu */
    struct cuda_sampling smp;  /* sample_host.cu */

    /* growable scratch (stream-ordered reuse) */
    void *act16; /* activations converted to f16/bf16 */
    size_t act16_cap;
    /* act16 holds act16_src (act16_elems floats) in act16_type, and no op but matmuls over
     * that input came since (the q, k, v and the gate, up gemms of a prefill share one) */
    const float *act16_src;
    size_t act16_elems;
    int act16_type, act16_ok;
    int act16_twin;       /* act16 was written by the op that wrote act16_src, not converted */
    uint64_t scratch_gen; /* cuda_scratch reallocations: a recording holds the old pointers */
    void *wdeq;           /* q8_0 weights dequantized to f16 for prefill */
    size_t wdeq_cap;
    void *part[KV_N_POOLS]; /* attention split partials, per residency (two streams) */
    size_t part_cap[KV_N_POOLS];
    void *cnt[KV_N_POOLS]; /* split counters of the merge folded into attention, per residency */
    size_t cnt_cap[KV_N_POOLS];
    void *small; /* token ids, row indexes */
    size_t small_cap;
    void *lin_h; /* normed input of a fused linear layer (3+ tokens) */
    size_t lin_h_cap;
    void *pass_part; /* a staging pass's partial, or the split cpu part's, merged into the host
                      * one */
    size_t pass_part_cap;
    /* per-block partials of tune.attn_fixed */
    struct {
        int valid, list; /* this residency's last launch left per-block partials of list */
        uint32_t n_split, layer;
        uint64_t gen; /* of the meta it ran over */
    } fixed[KV_N_POOLS];
    uint32_t *ls_ctr; /* the streamed linears' tile counters (tiles taken, blocks done) */
    struct cuda_stats hst;
};

/* an event without timing, a non-blocking stream: 0 or RKV_ECUDA */
static inline int cuda_event_create(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDisableTiming) == cudaSuccess ? 0 : RKV_ECUDA;
}
static inline int cuda_stream_create(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) == cudaSuccess ? 0 : RKV_ECUDA;
}
/* ... given back, when it was made */
static inline void cuda_event_destroy(cudaEvent_t e)
{
    if (e)
        cudaEventDestroy(e);
}
static inline void cuda_stream_destroy(cudaStream_t s)
{
    if (s)
        cudaStreamDestroy(s);
}

/* the stream waits for host-block attention queued on the side stream */
static inline void cuda_join_side(struct cuda_ctx *c)
{
    if (c->side_pending) {
        cudaStreamWaitEvent(c->stream, c->ev_side_done, 0);
        c->side_pending = 0;
    }
}

/* the stream waits for the kv write's copies back to the host pool (cuda_wb_after) */
static inline void cuda_join_wb(struct cuda_ctx *c)
{
    if (c->stage.wb_pending) {
        cudaStreamWaitEvent(c->stream, c->stage.ev_wb_done[c->stage.wb_last], 0);
        c->stage.wb_pending = 0;
    }
}

/* every op but device attention starts here */
/* a matmul's start: the activations converted for the last one stay valid */
static inline void cuda_op_begin_keep(struct cuda_ctx *c)
{
    cuda_join_side(c);
    cuda_join_wb(c);
    c->last_was_dev_attn = 0;
}

/* every other op's: it may write what the last matmul converted */
static inline void cuda_op_begin(struct cuda_ctx *c)
{
    cuda_op_begin_keep(c);
    c->act16_ok = 0;
}

/* host -> device rates over the two paths, GB/s (set_kv picks by these) */
int cuda_measure_host_paths(double *copy_gbps, double *zerocopy_gbps);

/* grows a scratch buffer to at least `need` bytes */
int cuda_scratch(struct cuda_ctx *c, void **buf, size_t *cap, size_t need);
/* kv_pools.cu: the vtable's set_kv (struct backend_i), and the host ranges it registered
 * given back */
int cu_set_kv(void *ctx, const struct kv_layout *l, const struct kv_pools *p);
void cuda_pools_unregister(struct cuda_ctx *c);

/* the kv block a step's write slot names (pool index | residency << 31) */
__device__ __forceinline__ char *cuda_kv_block(char *pool0, char *pool1, uint32_t slot,
                                               size_t block_bytes)
{
    return ((slot >> 31) ? pool1 : pool0) + (size_t)(slot & 0x7fffffffu) * block_bytes;
}

/* rotation of pair i (of n_rot/2) at position pos: theta = pos * scale *
 * base^(-2i/n_rot) in double (positions reach 1e5+ radians), reduced to
 * [-pi, pi] before a float sincos */
/* a rotation's per-pair frequency divisors (llama3's rope_freqs, YaRN's ramp) and magnitude,
 * passed by value so a graph replay keeps them; on 0: no divisors */
#define CUDA_ROPE_FF_MAX 128
struct cuda_rope_ff {
    float f[CUDA_ROPE_FF_MAX];
    int on;
    float mscale; /* be_rope.mscale: cos and sin times it (YaRN), 1 none */
};

__device__ __forceinline__ void cuda_rope_sincos(int32_t pos, uint32_t i, uint32_t n_rot,
                                                 float base, float scale,
                                                 const struct cuda_rope_ff &ff, float *sn,
                                                 float *cs)
{
    double theta = (double)pos * scale * exp2(-2.0 * i / (double)n_rot * log2((double)base));
    if (ff.on)
        theta /= ff.f[i];
    const double two_pi = 6.283185307179586;
    float red = (float)(theta - two_pi * rint(theta / two_pi));
    sincosf(red, sn, cs);
    *sn *= ff.mscale;
    *cs *= ff.mscale;
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
    case BE_Q8_0: return cuda_q8_0((const uint8_t *)row, i);
    default: return quant_value(type, (const uint8_t *)row, i);
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
