/* cpu_ops.h - the cpu backend's kernels: conversions, dot products and row/task loops. */
#ifndef RKV_CPU_OPS_H
#define RKV_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"

float cpu_f16_to_f32(uint16_t h);
uint16_t cpu_f32_to_f16(float f);
float cpu_bf16_to_f32(uint16_t h);

/* dst (n) = row of type t starting at src, dequantized exactly (n a multiple of t's block) */
void cpu_dequant_row(enum be_type t, const void *src, float *dst, size_t n);
/* f32 -> the kv cache's element type (f32, f16; the 8-bit dtypes go by rows: kv_row_store) */
void cpu_store_kv(enum kv_dtype t, void *dst, const float *src, size_t n);
/* dst (n, head_dim) = rows pos .. pos + n - 1 of kv head `head` of a slice, as f32: the bits of
 * kv_row_load, vectorized */
void cpu_kv_load_rows(const struct kv_layout *l, const void *slice, uint32_t head, uint32_t pos,
                      uint32_t n, float *dst);

float cpu_dot(const float *a, const float *b, size_t n);
/* out[j] = dot(x, w[j]) for 4 rows at once, sharing the loads of x */
void cpu_dot4(const float *x, const float *w0, const float *w1, const float *w2, const float *w3,
              size_t n, float out[4]);
/* y += a * x */
void cpu_axpy(float *y, float a, const float *x, size_t n);
void cpu_scale(float *y, float a, size_t n);
/* y = silu(g) * u = g / (1 + exp(-g)) * u, every element by the same exp (glibc's vector expf
 * where the cpu has avx2), so an element's bits do not depend on where its row is cut */
void cpu_silu_mul_row(float *y, const float *g, const float *u, size_t n);
/* y = gelu(g) * u, gelu the tanh approximation 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) */
void cpu_gelu_mul_row(float *y, const float *g, const float *u, size_t n);

/* matmul kernels: avx-512 when the cpu has it (mode -1, the default), or
 * never (0) / whenever possible (1); for tests and benchmarks */
void cpu_ops_use_avx512(int mode);
int cpu_ops_avx512(void);

/* out rows [r0, r1) of y (n_tok, n_out) = x (n_tok, n_in) . w^T + bias, w
 * n_out rows of row_bytes in type t; scratch holds 4*n_in floats */
void cpu_matmul_rows(float *y, const float *x, const void *w, enum be_type t, size_t row_bytes,
                     const float *bias, uint32_t n_tok, uint32_t n_in, uint32_t n_out, uint32_t r0,
                     uint32_t r1, float *scratch);

/* one attention task: token t (absolute position pos), kv head kvh, its
 * group of query heads, over the blocks tagged residency among n_blocks
 * table entries starting at entry first_block (blocks points at that entry).
 * q (n_head*head_dim) is the token's query row; writes the group's o, m, l. */
struct cpu_attn_job {
    const struct kv_layout *layout;
    const struct kv_pools *pools;
    const struct be_attn *a;
    uint32_t layer;
    enum kv_residency residency;
};
/* scratch: cpu_attn_scratch_floats() floats */
size_t cpu_attn_scratch_floats(const struct kv_layout *l, const struct be_attn *a);
void cpu_attn_task(const struct cpu_attn_job *j, const struct kv_block_ref *blocks,
                   uint32_t first_block, uint32_t n_blocks, uint32_t pos, uint32_t kvh,
                   const float *q, float *o, float *m, float *l, float *scratch);
/* a = lse-merge(a, b) for one (token, head): o (head_dim) */
void cpu_lse_merge(float *o_a, float *m_a, float *l_a, const float *o_b, float m_b, float l_b,
                   uint32_t head_dim);

#endif
