/* cuda_ops.cuh - host launchers of the cuda kernels, one .cu file each; all queue on c->stream. */
#pragma once

#include <type_traits>

#include "worker/cuda/cuda_ctx.cuh"

/* launches fn on stream s with programmatic stream serialization: its blocks may be scheduled
 * while the kernel before it ends, so fn must execute griddepcontrol.wait (cuda_grid_wait)
 * before it touches memory that kernel writes */
template <typename... P, typename... A>
static inline cudaError_t cuda_launch_pdl(const struct cuda_ctx *c, void (*fn)(P...), dim3 grid,
                                          dim3 block, size_t smem, cudaStream_t s, A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, fn, static_cast<A &&>(args)...);
}

/* a kernel launched by cuda_launch_pdl waits here for the kernel before it (a no-op otherwise) */
__device__ __forceinline__ void cuda_grid_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* --- shared device pieces ------------------------------------------------------------------ */

/* the swiglu gate of one element: silu(g) * u */
__device__ __forceinline__ float cuda_silu_mul1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* cp.async groups: close the copies issued since the last commit; wait until all but the
 * newest N groups landed */
__device__ __forceinline__ void cuda_cp_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void cuda_cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* d += a (16 x 16, row) . b (16 x 8, col), W f16 or bf16, f32 accumulate (mma.sync m16n8k16,
 * sm_80+) */
#define CUDA_MMA16816(T)                                                                           \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 "                          \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                           \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                  \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
template <typename W>
__device__ __forceinline__ void cuda_mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1)
{
    if constexpr (std::is_same_v<W, __half>)
        CUDA_MMA16816("f16");
    else
        CUDA_MMA16816("bf16");
}
#undef CUDA_MMA16816

/* --- four elements a thread ------------------------------------------------------------- */

/* r rounded to t16 (BE_BF16 or BE_F16) into elements 4i..4i+3 of dst, one 8-byte store (the
 * rounding of convert.cu's f32_to_16) */
__device__ __forceinline__ void cuda_store16x4(void *dst, int t16, size_t i, float4 r)
{
    uint2 u;
    if (t16 == BE_BF16) {
        __nv_bfloat162 a = __floats2bfloat162_rn(r.x, r.y), b = __floats2bfloat162_rn(r.z, r.w);
        u.x = *(const uint32_t *)&a;
        u.y = *(const uint32_t *)&b;
    } else {
        __half2 a = __floats2half2_rn(r.x, r.y), b = __floats2half2_rn(r.z, r.w);
        u.x = *(const uint32_t *)&a;
        u.y = *(const uint32_t *)&b;
    }
    ((uint2 *)dst)[i] = u;
}

/* may an elementwise op over n elements take float4 loads and stores of p (16-byte aligned
 * floats) and 8-byte stores of q (16-bit twin or output; NULL: none)? */
static inline bool cuda_vec4_ok(size_t n, const void *p0, const void *p1, const void *p2,
                                const void *q)
{
    return n % 4 == 0 && (((uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2) & 15) == 0 &&
           ((uintptr_t)q & 7) == 0;
}

/* ldmatrix: four 8x8 b16 tiles from shared memory, row addresses from lanes 8i..8i+7 for tile
 * i; TRANS transposes each tile */
template <bool TRANS>
__device__ __forceinline__ void cuda_ldsm4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                           const void *p)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                     : "r"(addr));
}

/* --- mbarriers and tensor copies (sm_90) ---------------------------------------------------- */

__device__ __forceinline__ uint32_t cuda_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cuda_bar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(cuda_smem(bar)), "r"(count));
}

__device__ __forceinline__ void cuda_bar_expect(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(cuda_smem(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void cuda_bar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(cuda_smem(bar)) : "memory");
}

__device__ __forceinline__ void cuda_bar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n\t.reg .pred p;\n"
                 "CUDA_BAR_WAIT%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra CUDA_BAR_WAIT%=;\n}" ::"r"(cuda_smem(bar)),
                 "r"(parity)
                 : "memory");
}

/* the box of tensor map tm at (x, y, z) into shared dst (aligned as its swizzle asks), counted
 * on bar, under L2 cache policy (createpolicy; 0: none); tm must be a __grid_constant__ kernel
 * parameter (or constant / global memory) */
__device__ __forceinline__ void cuda_tma_3d(void *dst, const CUtensorMap *tm, int32_t x, int32_t y,
                                            int32_t z, uint64_t *bar, uint64_t policy)
{
    if (policy)
        asm volatile(
            "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::"
            "bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(cuda_smem(dst)),
            "l"(tm), "r"(x), "r"(y), "r"(z), "r"(cuda_smem(bar)), "l"(policy)
            : "memory");
    else
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::"
                     "bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(cuda_smem(dst)),
                     "l"(tm), "r"(x), "r"(y), "r"(z), "r"(cuda_smem(bar))
                     : "memory");
}

/* out (n, cols) = rows ids[i] of w dequantized; d_ids on the device */
int cuda_embed(struct cuda_ctx *c, float *out, const struct be_tensor *w, const int32_t *d_ids,
               uint32_t n);
/* out (n, dim) = in / sqrt(mean(in^2) + eps) * w; twin (NULL: none): the same rounded to t16
 * (BE_F16 or BE_BF16); 1 when out was written but a twin asked for was not (widths the vector
 * kernel does not take) */
int cuda_rmsnorm(struct cuda_ctx *c, float *out, const float *in, const float *w, uint32_t n,
                 uint32_t dim, float eps, void *twin, enum be_type t16);
/* r's frequency divisors for a kernel's parameters: RKV_EUNSUPPORTED past CUDA_ROPE_FF_MAX pairs */
int cuda_rope_ff_of(const struct be_rope *r, struct cuda_rope_ff *ff);
/* x (n_tokens, n_heads*head_dim) rotated in place at d_pos (r's frequency divisors too) */
int cuda_rope(struct cuda_ctx *c, float *x, const int32_t *d_pos, uint32_t n_tokens,
              uint32_t n_heads, uint32_t head_dim, const struct be_rope *r);
/* out = silu(gate) * up (gelu 0) or gelu(gate) * up (gelu 1, the tanh gelu) over n elements;
 * twin as cuda_rmsnorm's (always written) */
int cuda_glu(struct cuda_ctx *c, int gelu, float *out, const float *gate, const float *up, size_t n,
             void *twin, enum be_type t16);
/* an op wrote n floats at out: a 16-bit conversion of what lay there is stale */
void act16_written(struct cuda_ctx *c, const float *out, size_t n);
/* x *= s over n elements */
int cuda_scale(struct cuda_ctx *c, float *x, float s, size_t n);
/* out = a + b over n elements */
int cuda_add(struct cuda_ctx *c, float *out, const float *a, const float *b, size_t n);
/* out row i = in row d_rows[i], (n, cols) f32 */
int cuda_get_rows(struct cuda_ctx *c, float *out, const float *in, const uint32_t *d_rows,
                  uint32_t n, uint32_t cols);
/* k, v (n_tokens, n_kv_head*head_dim) into each token's block slot (meta d_slot, d_pos); stg:
 * NULL, or the layer's staging buffer, where the tokens with a meta d_wslot go instead */
int cuda_kv_write(struct cuda_ctx *c, const struct cuda_meta *m, uint32_t layer, const float *k,
                  const float *v, char *stg);

/* rope on q and k (in place), then k, v into their blocks (or staging slots, as
 * cuda_kv_write), in one launch */
int cuda_rope_kv_write(struct cuda_ctx *c, const struct cuda_meta *m, uint32_t layer, float *q,
                       float *k, const float *v, uint32_t n_head, const struct be_rope *r,
                       char *stg);
/* the fused linear layer (decode, n <= CUDA_GEMV_MAX_N, 16-bit or f32 weights);
 * 1 when this call should be composed of the plain ops instead */
int cuda_linear(struct cuda_ctx *c, const struct be_linear *l, uint32_t n);
/* the same for 1-2 tokens and 16-bit weights on sm_90+, the weights streamed through shared
 * memory by bulk copies (linear_stream.cu); 1 when it does not apply */
int cuda_linear_stream(struct cuda_ctx *c, const struct be_linear *l, uint32_t n);
/* the same and the decode matmul (one matrix, set) for c->tune.lin_mma..8 tokens, 16-bit weights,
 * on tensor cores (linear_mma.cu); 1 when it does not apply */
int cuda_linear_mma(struct cuda_ctx *c, const struct be_linear *l, uint32_t n);
int cuda_matmul_mma(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                    const float *bias, uint32_t n);
/* thread blocks of 8 warps for warp_tasks warp tasks of a grid-stride kernel with max_per_sm
 * blocks resident per SM (linear.cu) */
unsigned cuda_lin_grid(const struct cuda_ctx *c, uint32_t warp_tasks, int max_per_sm,
                       int min_per_sm);

/* d_ids, d_logprobs (n) = the argmax of each logits row (n, n_vocab), ties to the lowest id,
 * and its log-softmax (worker/sample.c's sample_greedy); scratch: cuda_greedy_scratch bytes on
 * the device */
int cuda_greedy(struct cuda_ctx *c, const float *logits, uint32_t n, uint32_t n_vocab,
                int32_t *d_ids, float *d_logprobs, void *scratch);
/* bytes of cuda_greedy's scratch for n rows */
size_t cuda_greedy_scratch(uint32_t n, uint32_t n_vocab);

/* n_rows rows of logits (n_vocab floats each) sampled as worker/sample.c's sampler_sample
 * (sample.cu): d_rows n_rows rows of cuda_sample_row_bytes, each made by cuda_sample_row; d_pen
 * each row's penalty ids then their counts from 2 * its pen0; d_saved a float per penalty id;
 * scratch cuda_sample_scratch bytes; d_outs n_rows picks. The logits end as they began */
struct sample_dev_row;
struct sample_dev_out;
int cuda_sample(struct cuda_ctx *c, float *logits, uint32_t n_vocab, uint32_t n_rows,
                const void *d_rows, const int32_t *d_pen, float *d_saved, void *scratch,
                struct sample_dev_out *d_outs, unsigned long long *d_stamps);
/* d_stamps (NULL: none): cuda_sample_stamps() globaltimer stamps a row, at the phases of
 * sample.cu's kernel (0 where a row did not pass one) */
size_t cuda_sample_stamps(void);
size_t cuda_sample_scratch(uint32_t n_rows, uint32_t n_vocab);
size_t cuda_sample_row_bytes(void);
/* the kernel's row for r over logits row `row`, its penalty ids at pen0 */
void cuda_sample_row(void *dst, const struct sample_dev_row *r, uint32_t row, uint32_t pen0);

/* matmul: out (n, n_out) = in (n, n_in) . w^T + bias */
/* in (elems floats) rounded to t (BE_F16 or BE_BF16) in c->act16, once for the gemms in a row
 * that share an input (act16_ok), or the 16-bit twin the op that wrote in left there
 * (matmul.cu) */
int cuda_act16(struct cuda_ctx *c, const float *in, size_t elems, enum be_type t);
int cuda_matmul(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                const float *bias, uint32_t n);
/* out0, out1 = in . w0^T (+ bias0), in . w1^T (+ bias1) as one strided batch of two gemms, for
 * gemv_max_n < n <= c->tune.pair_n tokens over 16-bit weights of one shape whose weights and
 * outputs lie in the same order; 1 when it does not apply (two cuda_matmul calls) */
int cuda_matmul2(struct cuda_ctx *c, float *out0, float *out1, const float *in,
                 const struct be_tensor *w0, const struct be_tensor *w1, const float *bias0,
                 const float *bias1, uint32_t n);
/* out += in . w^T in the gemm's epilogue (prefill, 16-bit weights, not deterministic or precise:
 * no projection buffer and no add kernel); 1 when the caller should compose it instead */
int cuda_matmul_add(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                    uint32_t n);
/* gemm_lt.cu: row-major out (n, n_out) = x (n, n_in) . w^T (+ out when beta is 1), x and w
 * 16-bit of type t, on the cuBLASLt algorithm measured fastest for the shape; 1 when the
 * shape is not its (more than lt_tune_n tokens, another type or beta, or being recorded
 * before it was tuned) and the caller should use cublasGemmEx */
int cuda_gemm_lt(struct cuda_ctx *c, float *out, const void *w, enum be_type t, const void *x,
                 uint32_t n, uint32_t n_in, uint32_t n_out, float beta);
void cuda_lt_free(struct cuda_ctx *c);
/* the decode path of cuda_matmul: n <= CUDA_GEMV_MAX_N tokens, weights read once */
#define CUDA_GEMV_MAX_N 8
int cuda_gemv(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
              const float *bias, uint32_t n);
/* dst (n) f16 or bf16 (type) from f32 src */
int cuda_convert_f32(struct cuda_ctx *c, void *dst, enum be_type type, const float *src, size_t n);
/* dst (n) = the rounding residual of that conversion (for precise gemms) */
int cuda_convert_f32_lo(struct cuda_ctx *c, void *dst, enum be_type type, const float *src,
                        size_t n);
/* dst (rows, cols) f16 from q8_0 rows */
int cuda_dequant_q8_0_f16(struct cuda_ctx *c, __half *dst, const void *src, uint32_t rows,
                          uint32_t cols);
/* out (n, cols) += bias (cols) per row */
int cuda_add_bias(struct cuda_ctx *c, float *out, const float *bias, uint32_t n, uint32_t cols);

/* attention of q over the blocks of one residency -> one partial set (o, m, l),
 * on stream s. flash-decoding: keys split across thread blocks, merged by lse. */
struct cuda_attn_args {
    const struct cuda_meta *meta;
    uint32_t layer;
    int residency;
    int list;         /* which block list: residency or CUDA_LIST_STAGED */
    const char *pool; /* device-visible blocks the list indexes */
    size_t block_bytes, k_off, v_off;
    const float *q; /* (n_tokens, n_head*head_dim) */
    const struct be_attn *at;
    float *o, *m, *l; /* (n_tokens, n_head*head_dim), (n_tokens, n_head) x2 */
    cudaStream_t s;
};
int cuda_attn(struct cuda_ctx *c, const struct cuda_attn_args *a);
/* the two kernel shapes cuda_attn picks from: few query rows per kv head
 * (decode) or tiles of tokens (prefill) */
/* thread blocks of the decode kernel resident on the whole gpu, 0 when a
 * launch of this shape (tile tokens qt, gqa group g, base = kv heads x query tiles
 * thread blocks before the key split) takes another kernel */
int cuda_attn_decode_slots(struct cuda_ctx *c, uint32_t qt, uint32_t g, uint32_t base);
/* the decode kernel's key chunk stages for base thread blocks before the split: 3 (two chunks
 * in flight, 2 blocks an SM) when the split spreads few rows over the gpu, 2 (one chunk in
 * flight, 3 blocks an SM) when there are blocks enough to fill it */
static inline int cuda_dec_stages(const struct cuda_ctx *c, uint32_t base)
{
    return base < (uint32_t)c->n_sm ? 3 : 2;
}
/* cnt: the (n_qtiles, n_kv_head) counters of the merge folded into the launch, all 0 (the
 * launch leaves them so); NULL: the launch leaves the splits' partials in part */
int cuda_attn_decode_launch(struct cuda_ctx *c, const struct cuda_attn_args *a, uint32_t n_split,
                            uint32_t units_per_split, float *part, uint32_t *cnt);
int cuda_attn_prefill_launch(struct cuda_ctx *c, const struct cuda_attn_args *a, uint32_t n_split,
                             uint32_t units_per_split, float *part, uint32_t *cnt);
/* out (o, m, l) = lse-merge of the per-block partials two launches of one split per block left
 * (list0 over part0, list1 over part1; list1 < 0: none), block by block in position order: the
 * same numbers whichever list each block was in (the attn_fixed knob) */
int cuda_attn_merge_blocks(struct cuda_ctx *c, const struct cuda_meta *m, int list0,
                           const float *part0, int list1, const float *part1, uint32_t n_head,
                           uint32_t head_dim, float *o, float *ml, float *l, cudaStream_t s);
/* a = lse-merge(a, b), n tokens, on stream s */
int cuda_attn_merge(struct cuda_ctx *c, float *oa, float *ma, float *la, const float *ob,
                    const float *mb, const float *lb, uint32_t n, uint32_t n_head,
                    uint32_t head_dim, cudaStream_t s);
