/* cpu_quant.h - quantized weights on the cpu: 8-bit activations, integer dots, dequantization. */
#ifndef RKV_CPU_QUANT_H
#define RKV_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"

/*
 * Numeric contract, per weight type (common/quant.h names the block formats).
 *
 * Exact: dequantization (cpu_q_dequant, every isa; embeddings and the exact path) gives
 * common/quant.c's bits, so gguf.quants.dequantize's: each value is the reference's f32 products
 * and differences in its order (no fused multiply-add).
 *
 * Rounded: the integer path (cpu_q_int: every block type unless RKV_CPU_EXACT=1) rounds each
 * activation row once to 8 bits per block of 32 (B 32) or 256 (B 256) values:
 * dx = amax / 127 (f32), q = round_half_even(x * (127 / amax)), so |x - dx q| <= dx / 2; then
 * sums in integers, exactly (int32), and combines them in f32 in a fixed order:
 *
 *   type    B    exact integer sum of a block                      float part
 *   Q4_0    32   isum = sum (nib - 8) q                            (d dx) isum
 *   Q4_1    32   isum = sum nib q                                  (d dx) isum + (m dx) sum q
 *   Q5_0    32   isum = sum (nib5 - 16) q                          (d dx) isum
 *   Q5_1    32   isum = sum nib5 q                                 (d dx) isum + (m dx) sum q
 *   Q8_0    32   isum = sum w8 q                                   (d dx) isum
 *   IQ4_NL  32   isum = sum kvalues[nib] q                         (d dx) isum
 *   Q2_K    256  isum = sum_g sc_g sum_16 u2 q, imin = sum_g m_g s_g  (d dx) isum - (dmin dx) imin
 *   Q3_K    256  isum = sum_g (sc_g - 32) (sum_16 u3 q - 4 s_g)    (d dx) isum
 *   Q4_K    256  isum = sum_j sc_j sum_32 nib q, imin = sum_j m_j s_j  (d dx) isum - (dmin dx) imin
 *   Q5_K    256  the same with 5-bit levels                        the same
 *   Q6_K    256  isum = sum_g sc_g (sum_16 u6 q - 32 s_g)          (d dx) isum
 *   IQ4_XS  256  isum = sum_j (sc_j - 32) sum_32 kvalues[nib] q    (d dx) isum
 *
 * (s_g: the activations' sum over sub-block g.) A 32-value block's term goes to lane b % 4 of
 * four partial sums, which end as (l0 + l2) + (l1 + l3); a super-block's term is added to one
 * running sum. So scalar, avx2 and avx-512 give the same bits, for any batch, thread count or
 * token tile, and a token's logits do not depend on the batch it ran in (the backend stays
 * batch-invariant). A dot differs from the exact sum over the dequantized weights and the f32
 * activations by at most sum_i |w_i| dx_i / 2 plus the f32 rounding of the terms. On rkv-mkmodel's
 * tiny models the logits move by 1.1-2.0e-2 of a step's max |logit| against the f32 reference
 * (tests/integration/test_reference.py's RTOL_CPU lists each type's).
 */

enum cpu_isa { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2 };

/* 1 when this build and cpu run kernels of isa (avx-512: avx512f/bw/vl/vnni) */
int cpu_q_isa_ok(enum cpu_isa isa);
/* the isa the backend runs: avx-512 where cpu_ops_avx512() and the cpu's vnni allow */
enum cpu_isa cpu_q_isa(void);

/* on 1 every block type is dequantized to f32 and summed as f32 weights are (RKV_CPU_EXACT=1;
 * tests and a/b); 0: the integer path; 2: the cuda backend's twin (gpu tests only): integer
 * dots for matmuls of at most 8 tokens over the types its decode kernel takes, dequantized
 * past them (its tensor-core tiles) and for Q2_K / Q3_K (its exact kernel). 2 gives up the
 * batch invariance of 0 and 1 */
void cpu_q_use_exact(int mode);
/* 1 when a matmul of n_tok tokens over weights of type t quantizes its activations to 8 bits
 * (the integer path), 0 when it dequantizes the weights to f32 */
int cpu_q_int(enum be_type t, uint32_t n_tok);

/* bytes of one activation row of n values (a multiple of t's block) quantized for t */
size_t cpu_qx_row_bytes(enum be_type t, uint32_t n);
/* x (n) quantized for dot products with rows of type t into row (cpu_qx_row_bytes) */
void cpu_qx_quantize(enum be_type t, const float *x, uint32_t n, void *row, enum cpu_isa isa);
/* dot(a row of n values of type t, a row that cpu_qx_quantize made) */
float cpu_q_dot(enum be_type t, const void *w, const void *xrow, uint32_t n, enum cpu_isa isa);
/* dst (n) = the row of type t at src, dequantized (any supported type) */
void cpu_q_dequant(enum be_type t, const void *src, float *dst, size_t n, enum cpu_isa isa);

/* out rows [r0, r1) of y (n_tok, n_out) = xq . w^T + bias: xq n_tok activation rows of
 * xq_stride bytes (cpu_qx_row_bytes), w n_out rows of row_bytes in type t */
void cpu_qmatmul_rows(float *y, const void *xq, size_t xq_stride, const void *w, enum be_type t,
                      size_t row_bytes, const float *bias, uint32_t n_tok, uint32_t n_in,
                      uint32_t n_out, uint32_t r0, uint32_t r1);

#endif
