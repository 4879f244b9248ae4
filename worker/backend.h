/* backend.h - the compute backend vtable (cpu, cuda) the forward pass calls through. */
#ifndef RKV_BACKEND_H
#define RKV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "worker/kv.h"
#include "worker/sample.h"

/* element types of backend tensors; the ids are ggml's (as in GGUF, common/quant.h has the
 * block layouts) so model weights keep their file type. activations are always BE_F32. */
enum be_type {
    BE_F32 = 0,
    BE_F16 = 1,
    BE_Q4_0 = 2,
    BE_Q4_1 = 3,
    BE_Q5_0 = 6,
    BE_Q5_1 = 7,
    BE_Q8_0 = 8, /* blocks of 32: f16 scale d, 32 int8 q; value = d*q */
    BE_Q2_K = 10,
    BE_Q3_K = 11,
    BE_Q4_K = 12,
    BE_Q5_K = 13,
    BE_Q6_K = 14,
    BE_IQ4_NL = 20,
    BE_IQ4_XS = 23,
    BE_BF16 = 30,
};
#define BE_Q8_0_BLOCK 32
/* the weight types every backend reads (a backend's weight_types adds to them) */
#define BE_TYPES_BASE ((1ull << BE_F32) | (1ull << BE_F16) | (1ull << BE_BF16) | (1ull << BE_Q8_0))

/* a 2-d row-major array (rows, cols) in backend memory (device memory for
 * cuda). opaque: only the backend that allocated it reads it. */
struct be_tensor;
struct backend;

/* one sequence of a batched step. its tokens are rows tok_off..tok_off+n_tokens-1
 * of every activation; token i sits at absolute position n_past + i. */
struct be_seq {
    uint32_t tok_off;
    uint32_t n_tokens;
    uint32_t n_past;
    const struct kv_block_ref *blocks; /* block table, position order */
    uint32_t n_blocks;                 /* covers n_past + n_tokens positions */
};

/* a step's sequences (host memory; a device backend stages what it needs) */
struct be_batch {
    const struct be_seq *seqs;
    uint32_t n_seqs;
    uint32_t n_tokens;      /* sum of seqs[i].n_tokens */
    const int32_t *pos;     /* (n_tokens) absolute position of each token */
    const uint32_t *seq_of; /* (n_tokens) sequence index of each token */
};

struct be_rope {
    uint32_t n_rot;   /* rotated dims per head (even, <= head_dim) */
    float freq_base;  /* theta_i = pos * freq_scale * base^(-2i/n_rot) */
    float freq_scale; /* 1/factor for linear scaling */
    int neox;         /* 0: pairs (2i, 2i+1); 1: pairs (i, i + n_rot/2) */
    /* (n_rot/2) host values dividing each pair's frequency (llama3's rope_freqs), or NULL; a
     * backend reads them only when its rope_freq_factors says so */
    const float *freq_factors;
    /* magnitude of the rotation: cos and sin are multiplied by it, so q.k scales by its square
     * (YaRN's attention factor, attn_factor * (1 + 0.1 ln(factor))); 0 or 1 = none. A backend
     * reads it only when its rope_mscale says so */
    float mscale;
};

/* attention geometry; a query head hq reads kv head hq / (n_head/n_kv_head) */
struct be_attn {
    uint32_t n_head;
    uint32_t n_kv_head;
    uint32_t head_dim;
    float scale; /* 1/sqrt(head_dim) */
    /* a sliding window (gemma3's local layers): a query at position p reads keys at positions
     * > p - window only; 0 = every earlier position. A backend honours it only when its
     * attn_window says so (the forward sets it only then) */
    uint32_t window;
};

/* attention over the host pool on the host, for a device backend: q (n_tokens,
 * n_head*head_dim) over the blocks of b tagged KV_HOST into o (n_tokens, n_head*head_dim), m, l
 * (n_tokens, n_head), all host memory, as attn_partial computes them. Called from the thread
 * that queues the layers or the device runtime's host-function thread, one call at a time */
struct be_host_attend {
    int (*attend)(void *ctx, const struct be_batch *b, uint32_t layer, const float *q,
                  const struct be_attn *at, float *o, float *m, float *l);
    void *ctx;
};

/* a partial attention result over some set of kv blocks, per (token, head):
 * o normalized by l, m the max scaled score, l = sum exp(score - m).
 * an empty set has o = 0, m = -inf, l = 0. */
struct be_partial {
    struct be_tensor *o; /* (n_tokens, n_head*head_dim) */
    struct be_tensor *m; /* (n_tokens, n_head) */
    struct be_tensor *l; /* (n_tokens, n_head) */
};

/* a fused linear layer (decode): for each i < n_w,
 *   SET:    out[i] (n, w[i] rows) = norm(in) . w[i]^T + bias[i]
 *   ADD:    out[0] += in . w[0]^T + bias[0]                    (n_w 1, no norm)
 *   SWIGLU: out[0] = silu(norm(in) . w[0]^T) * (norm(in) . w[1]^T)  (n_w 2, no bias)
 * norm(in) = rmsnorm(in, norm_w, eps) when norm_w, else in. */
enum be_lin_mode { BE_LIN_SET = 0, BE_LIN_ADD, BE_LIN_SWIGLU };
#define BE_LIN_MAX 3
struct be_linear {
    enum be_lin_mode mode;
    const struct be_tensor *in;     /* (n, n_in) f32 */
    const struct be_tensor *norm_w; /* (1, n_in) or NULL */
    float eps;
    uint32_t n_w;
    const struct be_tensor *w[BE_LIN_MAX];    /* (n_out_i, n_in) */
    const struct be_tensor *bias[BE_LIN_MAX]; /* (1, n_out_i) or NULL */
    struct be_tensor *out[BE_LIN_MAX];        /* (n, n_out_i) */
};

/* the vtable a backend fills. ops work on the first n rows of their tensors;
 * they return 0 or a negative RKV_E* code. */
struct backend_i {
    void (*destroy)(void *ctx);

    int (*tensor_alloc)(void *ctx, enum be_type type, uint32_t rows, uint32_t cols,
                        struct be_tensor **out);
    void (*tensor_free)(void *ctx, struct be_tensor *t);
    /* bytes [off, off+n) of the tensor's storage (in its own type) */
    int (*tensor_set)(void *ctx, struct be_tensor *t, const void *src, size_t off, size_t n);
    int (*tensor_get)(void *ctx, const struct be_tensor *t, void *dst, size_t off, size_t n);

    /* the kv pools kv_write/attn_partial address; set before the first step */
    int (*set_kv)(void *ctx, const struct kv_layout *l, const struct kv_pools *p);

    /* out (n, cols) = rows ids[i] of w (n_vocab, cols), dequantized */
    int (*embed)(void *ctx, struct be_tensor *out, const struct be_tensor *w, const int32_t *ids,
                 uint32_t n);
    /* out = in / sqrt(mean(in^2) + eps) * w, row-wise; in, out (n, dim), w (1, dim) */
    int (*rmsnorm)(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                   const struct be_tensor *w, uint32_t n, float eps);
    /* out (n, n_out) = in (n, n_in) . w^T + bias; w (n_out, n_in) any type,
     * bias (1, n_out) f32 or NULL */
    int (*matmul)(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                  const struct be_tensor *w, const struct be_tensor *bias, uint32_t n);
    /* rotates x (n_tokens, n_heads*head_dim) in place at the batch positions */
    int (*rope)(void *ctx, struct be_tensor *x, const struct be_batch *b, uint32_t n_heads,
                uint32_t head_dim, const struct be_rope *r);
    /* writes k, v (n_tokens, n_kv_head*head_dim) into the blocks of each
     * token's position for one layer */
    int (*kv_write)(void *ctx, const struct be_batch *b, uint32_t layer, const struct be_tensor *k,
                    const struct be_tensor *v);
    /* attention of q (n_tokens, n_head*head_dim) over the blocks tagged
     * `residency` only, causal by absolute position -> one partial set */
    int (*attn_partial)(void *ctx, const struct be_batch *b, uint32_t layer,
                        enum kv_residency residency, const struct be_tensor *q,
                        const struct be_attn *a, const struct be_partial *out);
    /* a = lse-merge(a, b) exactly, per (token, head) */
    int (*attn_merge)(void *ctx, const struct be_partial *a, const struct be_partial *b, uint32_t n,
                      const struct be_attn *at);
    /* out = silu(gate) * up, (n, cols) */
    int (*silu_mul)(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                    const struct be_tensor *up, uint32_t n);
    /* out = a + b, (n, cols) */
    int (*add)(void *ctx, struct be_tensor *out, const struct be_tensor *a,
               const struct be_tensor *b, uint32_t n);
    /* out row i = in row rows[i], f32 (the rows whose logits are wanted) */
    int (*get_rows)(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                    const uint32_t *rows, uint32_t n);
    /* waits for queued work (no-op for cpu) */
    int (*sync)(void *ctx);

    /* optional fused ops; NULL, or a return of 1, means "compose it from the
     * ops above" (the forward pass does). */
    int (*linear)(void *ctx, const struct be_linear *l, uint32_t n);
    /* rope on q (n_tokens, n_head*head_dim) and k in place, then kv_write of
     * k, v: what rope(q), rope(k), kv_write(k, v) do */
    int (*rope_kv_write)(void *ctx, const struct be_batch *b, uint32_t layer, struct be_tensor *q,
                         struct be_tensor *k, const struct be_tensor *v, const struct be_attn *a,
                         const struct be_rope *r);
    /* optional: device bytes the backend may still allocate that a step over
     * device blocks does not show (staging for host blocks); NULL = 0 */
    size_t (*scratch_reserve)(void *ctx);
    /* optional: host memory the backend copies to and from fastest (pinned
     * for cuda); NULL = malloc/free */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* optional: one line of counters since the last call (how host blocks
     * were read, ...) for the worker's periodic step line; returns its length */
    int (*stats)(void *ctx, char *buf, size_t len);
    /* optional: the greedy pick of each of the first n rows of logits (n, n_vocab) f32: the
     * argmax (ties: the lowest id) and its log-softmax, into host ids and logprobs (what a
     * plain greedy sampler returns), so the logits need not leave the backend; NULL or a
     * return of 1: not provided */
    int (*greedy)(void *ctx, const struct be_tensor *logits, uint32_t n, int32_t *ids,
                  float *logprobs);
    /* optional: on 1, attn_partial over host blocks runs on cpu threads over the host pool
     * (the CPU_TAIL tactic) while the device attends its own blocks; 0 reads them on the
     * device. NULL or a return of 1: not provided */
    int (*host_attn_cpu)(void *ctx, int on);
    /* optional: pct (0..100) of each decode row's host blocks, the oldest, attended on cpu
     * threads while the device reads the rest (the split host read, worker/tail_policy.h); 0
     * off. NULL or a return of 1: not provided */
    int (*host_split)(void *ctx, uint32_t pct);
    /* optional: the decoder layers of a step as a recording replayed while the batch keeps its
     * shape (a cuda graph). Called before a step's layers (owner: the caller, whose tensors the
     * layers use): 0 run them as usual; 1 run them (they are being recorded), then graph_end;
     * 2 they are queued already (a recording of this shape replayed): skip them. NULL: 0 */
    int (*graph_begin)(void *ctx, const struct be_batch *b, const struct be_attn *a,
                       const void *owner);
    /* after the layers that graph_begin's 1 asked for (failed: one of them failed): 0 the
     * recording is queued; 1 it could not be recorded, the layers must run again as usual */
    int (*graph_end)(void *ctx, int failed);
    /* optional: out0 = in . w0^T + bias0 and out1 = in . w1^T + bias1 for two weights of one
     * shape and type (k and v, gate and up), as one launch where the backend can; NULL or a
     * return of 1: two matmul calls */
    int (*matmul2)(void *ctx, struct be_tensor *out0, struct be_tensor *out1,
                   const struct be_tensor *in, const struct be_tensor *w0,
                   const struct be_tensor *w1, const struct be_tensor *bias0,
                   const struct be_tensor *bias1, uint32_t n);
    /* optional: rows of logits (n, n_vocab) f32 sampled where they are, as the rows' samplers
     * would (worker/sample.h's sample_dev_row / sample_dev_out): rows[i] NULL leaves row i,
     * outs[i] status 1 says the caller must sample row i from its logits. The logits are left
     * as they were. NULL or a return of 1: not provided */
    int (*sample)(void *ctx, const struct be_tensor *logits, uint32_t n,
                  const struct sample_dev_row *const *rows, struct sample_dev_out *outs);
    /* bit t set: embed and matmul read weights of be_type t; BE_TYPES_BASE are read by
     * every backend (0 = only those) */
    uint64_t weight_types;
    /* 1: rope and rope_kv_write apply be_rope.freq_factors (0: a model that has them is
     * refused at load) */
    int rope_freq_factors;

    /* the ops of qwen3 and gemma3, optional: a backend without one refuses those
     * architectures at load (model_create names the op) */
    /* x (n, n_heads*head_dim) in place: each head's head_dim values rmsnorm'd with w
     * (1, head_dim) (qwen3's and gemma3's q/k norm) */
    int (*rmsnorm_heads)(void *ctx, struct be_tensor *x, const struct be_tensor *w, uint32_t n,
                         uint32_t n_heads, float eps);
    /* out = gelu(gate) * up, (n, cols), gelu the tanh approximation (gemma's GeGLU) */
    int (*gelu_mul)(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                    const struct be_tensor *up, uint32_t n);
    /* x (n, cols) *= s in place (gemma's embeddings by sqrt(dim)) */
    int (*scale)(void *ctx, struct be_tensor *x, float s, uint32_t n);
    /* 1: attn_partial honours be_attn.window (0: a model with sliding windows is refused) */
    int attn_window;
    /* 1: rope and rope_kv_write multiply cos and sin by be_rope.mscale (0: a model whose
     * mscale is not 1, a YaRN-scaled one, is refused at load) */
    int rope_mscale;
    /* optional: where the host blocks go that this (device) backend attends on cpu threads
     * (CPU_TAIL, the split host read); without it those tactics are refused. backend_create
     * sets the worker's router (worker/attn_route.h) */
    int (*set_host_attend)(void *ctx, const struct be_host_attend *h);
};

struct backend_opts {
    const char *kind;   /* "auto" | "cpu" | "cuda"; NULL = auto */
    uint32_t n_threads; /* cpu threads; 0 = online cpus */
    int gpu;            /* cuda device ordinal */
    /* batch-invariant numbers: a sequence's logits do not depend on the other sequences of its
     * step, where its blocks live or whether a token was prefilled or decoded (cuda: one split
     * per kv block, one linear kernel for every token count, slower; the cpu backend is so
     * always) */
    int deterministic;
};

/* picks and starts a backend. auto: cuda when built with RKV_CUDA and a gpu
 * answers, else cpu (with a log line). cuda forced without a gpu: an error
 * in errbuf saying so. */
int backend_create(const struct backend_opts *o, struct backend **out, char *errbuf, size_t errlen);
void backend_destroy(struct backend *be);
/* wraps a filled vtable (for backend implementations) */
int backend_wrap(const char *name, const struct backend_i *iface, void *ctx, struct backend **out);
const char *backend_name(const struct backend *be);

/* bytes of n elements of type (n a multiple of the type's block); 0 if unknown or not */
size_t be_type_size(enum be_type t, size_t n);
const char *be_type_name(enum be_type t);
/* values per block of t (1 for the float types, 0 if unknown) */
uint32_t be_type_block(enum be_type t);
/* 1 when be's embed and matmul read weights of type t */
int backend_reads_weights(const struct backend *be, enum be_type t);
/* 1 when be's rope applies be_rope.freq_factors */
int backend_rope_freq_factors(const struct backend *be);
/* 1 when be's rope applies be_rope.mscale */
int backend_rope_mscale(const struct backend *be);
/* the name of the first op an architecture needs that be lacks ("gelu_mul", ...), NULL when
 * it has them all; needs is a set of BE_NEED_* bits */
#define BE_NEED_HEAD_NORM   1u /* rmsnorm_heads */
#define BE_NEED_GELU        2u /* gelu_mul */
#define BE_NEED_SCALE       4u /* scale */
#define BE_NEED_ATTN_WINDOW 8u /* attn_window */
const char *backend_missing_op(const struct backend *be, unsigned needs);
/* the weight types be reads, as text ("F32, F16, ...") into buf */
void backend_weight_types(const struct backend *be, char *buf, size_t len);

int backend_tensor_alloc(struct backend *be, enum be_type type, uint32_t rows, uint32_t cols,
                         struct be_tensor **out);
void backend_tensor_free(struct backend *be, struct be_tensor *t);
int backend_tensor_set(struct backend *be, struct be_tensor *t, const void *src, size_t off,
                       size_t n);
int backend_tensor_get(struct backend *be, const struct be_tensor *t, void *dst, size_t off,
                       size_t n);
int backend_set_kv(struct backend *be, const struct kv_layout *l, const struct kv_pools *p);
/* host buffers for tensor_get/tensor_set of large results (the logits):
 * pinned on cuda, so a copy runs at the link's speed; NULL on failure */
void *backend_host_alloc(struct backend *be, size_t bytes);
void backend_host_free(struct backend *be, void *p);
/* the backend's counters since the last call as one line ("" when it keeps none) */
void backend_stats(struct backend *be, char *buf, size_t len);

/* the ops, named as the forward pass reads them */
int embed_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *w,
                  const int32_t *ids, uint32_t n);
int rmsnorm_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *in,
                    const struct be_tensor *w, uint32_t n, float eps);
int matmul_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *in,
                   const struct be_tensor *w, const struct be_tensor *bias, uint32_t n);
/* matmul_forward of (out0, w0, bias0) and (out1, w1, bias1) over one input: the backend's
 * matmul2 when it has one for the call, else the two matmuls */
int matmul2_forward(struct backend *be, struct be_tensor *out0, struct be_tensor *out1,
                    const struct be_tensor *in, const struct be_tensor *w0,
                    const struct be_tensor *w1, const struct be_tensor *bias0,
                    const struct be_tensor *bias1, uint32_t n);
int rope_forward(struct backend *be, struct be_tensor *x, const struct be_batch *b,
                 uint32_t n_heads, uint32_t head_dim, const struct be_rope *r);
int kv_write_forward(struct backend *be, const struct be_batch *b, uint32_t layer,
                     const struct be_tensor *k, const struct be_tensor *v);
int attn_partial_forward(struct backend *be, const struct be_batch *b, uint32_t layer,
                         enum kv_residency residency, const struct be_tensor *q,
                         const struct be_attn *a, const struct be_partial *out);
int attn_merge_forward(struct backend *be, const struct be_partial *a, const struct be_partial *b,
                       uint32_t n, const struct be_attn *at);
int silu_mul_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *gate,
                     const struct be_tensor *up, uint32_t n);
int add_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *a,
                const struct be_tensor *b, uint32_t n);
/* the optional ops: RKV_EUNSUPPORTED where the backend has none (a model needing one is
 * refused at load before) */
int rmsnorm_heads_forward(struct backend *be, struct be_tensor *x, const struct be_tensor *w,
                          uint32_t n, uint32_t n_heads, float eps);
int gelu_mul_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *gate,
                     const struct be_tensor *up, uint32_t n);
int scale_forward(struct backend *be, struct be_tensor *x, float s, uint32_t n);
int get_rows_forward(struct backend *be, struct be_tensor *out, const struct be_tensor *in,
                     const uint32_t *rows, uint32_t n);
int backend_sync(struct backend *be);
/* bytes the backend may allocate later beyond what steps so far took (0 for cpu) */
size_t backend_scratch_reserve(struct backend *be);
/* the fused ops: 1 when the backend has none for this call (compose instead) */
int linear_forward(struct backend *be, const struct be_linear *l, uint32_t n);
/* the backend's greedy op (1 when it has none) */
int greedy_forward(struct backend *be, const struct be_tensor *logits, uint32_t n, int32_t *ids,
                   float *logprobs);
/* the backend's sample op (1 when it has none) */
int sample_forward(struct backend *be, const struct be_tensor *logits, uint32_t n,
                   const struct sample_dev_row *const *rows, struct sample_dev_out *outs);
/* the backend's host_attn_cpu switch: 0 set, 1 when the backend has none, < 0 an error */
int backend_host_attn_cpu(struct backend *be, int on);
/* the backend's graph_begin / graph_end (struct backend_i); 0 / 1 when it has none */
int graph_begin_forward(struct backend *be, const struct be_batch *b, const struct be_attn *a,
                        const void *owner);
int graph_end_forward(struct backend *be, int failed);
/* the backend's host_split share: 0 set, 1 when the backend has none, < 0 an error */
int backend_host_split(struct backend *be, uint32_t pct);
int rope_kv_write_forward(struct backend *be, const struct be_batch *b, uint32_t layer,
                          struct be_tensor *q, struct be_tensor *k, const struct be_tensor *v,
                          const struct be_attn *a, const struct be_rope *r);

#endif
