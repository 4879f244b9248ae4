/* quant.h - ggml's weight block formats: sizes, exact dequantization, round-to-nearest quantization. */
#ifndef RKV_QUANT_H
#define RKV_QUANT_H

#include <stddef.h>
#include <stdint.h>

/*
 * The types are ggml's ids as GGUF stores them (enum gguf_tensor_type). rkv
 * reads the float types and the block formats below; a block holds QUANT_QK
 * (32) or QUANT_QK_K (256) values of one row:
 *
 *   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL     32 values, one f16 scale (and min)
 *   Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS     256 values, sub-block scales under an
 *                                       f16 super-block scale (and min)
 *
 * Numeric contract: quant_dequantize_row gives the bits gguf.quants.dequantize
 * (the gguf Python package) gives: every product and difference is one f32
 * operation in the reference's order, f16 scales convert exactly.
 * quant_quantize_row rounds to nearest by the reference block formulas (for
 * Q4_0..Q8_0 the same bits as gguf.quants.quantize; the k-quants and IQ4 by
 * a plain max/min scale per sub-block, no search), deterministic.
 */

#define QUANT_QK   32
#define QUANT_QK_K 256

enum quant_type {
    QUANT_F32 = 0,
    QUANT_F16 = 1,
    QUANT_Q4_0 = 2,
    QUANT_Q4_1 = 3,
    QUANT_Q5_0 = 6,
    QUANT_Q5_1 = 7,
    QUANT_Q8_0 = 8,
    QUANT_Q2_K = 10,
    QUANT_Q3_K = 11,
    QUANT_Q4_K = 12,
    QUANT_Q5_K = 13,
    QUANT_Q6_K = 14,
    QUANT_IQ4_NL = 20,
    QUANT_IQ4_XS = 23,
    QUANT_BF16 = 30,
};

/* the types rkv reads, as text for messages: "F32, F16, BF16, Q4_0, ..." */
#define QUANT_SUPPORTED \
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS"

/* 1 for a type rkv reads (QUANT_SUPPORTED), else 0 */
int quant_supported(uint32_t type);
/* 1 for the block formats (not F32/F16/BF16) */
int quant_is_block(uint32_t type);
/* "Q4_K"; NULL for a type rkv does not read */
const char *quant_name(uint32_t type);
/* values per block (1 for the float types); 0 for an unsupported type */
uint32_t quant_block_values(uint32_t type);
/* bytes of one row of n values (n a multiple of the block); 0 if not */
size_t quant_row_bytes(uint32_t type, size_t n);

/* n values (a multiple of the block) of a row of type into dst */
int quant_dequantize_row(uint32_t type, const void *src, float *dst, size_t n);
/* n values of src into a row of type (the block formats and F32/F16/BF16) */
int quant_quantize_row(uint32_t type, const float *src, void *dst, size_t n);
/* the first block of the row whose f16 scale (or min) is NaN or infinite: 0 when every
 * block is finite, else 1 and its index in *bad */
int quant_row_bad_scale(uint32_t type, const void *src, size_t n, size_t *bad);

float quant_f16_to_f32(uint16_t h);
/* round to nearest even, as numpy's astype(float16) and the F16C instructions */
uint16_t quant_f32_to_f16(float f);

#endif
