/* quant_matmul.cu - out = in . w^T + bias for block-type weights past the decode kernel's 8
 * tokens: shared-memory tiles on tensor cores for batches, f16 slabs of rows through L2 into
 * cuBLAS for prefill. */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/quant.cuh"

/* the most tokens the tiled kernel takes; more are a prefill chunk, where cuBLAS on a slab
 * of dequantized rows outruns it */
#define QMM_TILED_MAX 256
/* a slab's f16 bytes: small enough to stay in L2 between its dequantization and its gemm */
#define QMM_SLAB_BYTES (24u << 20)

static int slab_gemm(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                     uint32_t n)
{
    const uint32_t n_in = w->cols, n_out = w->rows;
    uint32_t slab = QMM_SLAB_BYTES / (n_in * 2u);
    slab = slab < 16 ? 16 : slab / 16 * 16;
    if (slab > n_out)
        slab = n_out;
    int rc = cuda_scratch(c, &c->wdeq, &c->wdeq_cap, (size_t)slab * n_in * 2);
    if (rc == 0)
        rc = cuda_act16(c, in, (size_t)n * n_in, BE_F16);
    const float one = 1.0f, zero = 0.0f;
    for (uint32_t r0 = 0; rc == 0 && r0 < n_out; r0 += slab) {
        const uint32_t m = n_out - r0 < slab ? n_out - r0 : slab;
        rc = cuda_quant_to_f16(c, (__half *)c->wdeq, w, r0, r0 + m);
        if (rc == 0)
            CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)n_in,
                                    &one, c->wdeq, CUDA_R_16F, (int)n_in, c->act16, CUDA_R_16F,
                                    (int)n_in, &zero, out + r0, CUDA_R_32F, (int)n_out,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return rc;
}

int cuda_matmul_quant(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                      const float *bias, uint32_t n)
{
    if (n <= QMM_TILED_MAX)
        return cuda_quant_mma(c, out, in, w, bias, n);
    int rc = slab_gemm(c, out, in, w, n);
    if (rc == 0 && bias)
        rc = cuda_add_bias(c, out, bias, n, w->rows);
    return rc;
}
