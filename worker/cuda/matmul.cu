/* matmul.cu - out = in . w^T + bias: gemv for decode, cublas gemms (f32 accumulate) for prefill. */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/quant.cuh"

/* row-major out (n, n_out) = in (n, n_in) . w^T is, column-major,
 * out (n_out, n) = w^T (n_out, n_in) . in (n_in, n) with w stored (n_in, n_out) */
static int gemm_ex(struct cuda_ctx *c, float *out, const void *w, enum be_type t, const void *x,
                   uint32_t n, uint32_t n_in, uint32_t n_out, float beta)
{
    /* batched decode: the algorithm timed fastest for the shape (gemm_lt.cu) */
    int rc = cuda_gemm_lt(c, out, w, t, x, n, n_in, n_out, beta);
    if (rc != 1)
        return rc;
    const float one = 1.0f;
    const cudaDataType wt = t == BE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n, (int)n_in, &one,
                            w, wt, (int)n_in, x, wt, (int)n_in, &beta, out, CUDA_R_32F, (int)n_out,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

void act16_written(struct cuda_ctx *c, const float *out, size_t n)
{
    if (c->act16_ok && out < c->act16_src + c->act16_elems && c->act16_src < out + n)
        c->act16_ok = 0;
}

int cuda_act16(struct cuda_ctx *c, const float *in, size_t elems, enum be_type t)
{
    int rc = 0;
    if (!(c->act16_ok && c->act16_src == in && c->act16_elems == elems && c->act16_type == t)) {
        c->act16_ok = 0;
        rc = cuda_scratch(c, &c->act16, &c->act16_cap, elems * 2);
        if (rc == 0)
            rc = cuda_convert_f32(c, c->act16, t, in, elems);
        if (rc == 0) {
            c->act16_src = in;
            c->act16_elems = elems;
            c->act16_type = t;
            c->act16_ok = !c->tune.precise; /* precise leaves the residual there */
            c->act16_twin = 0;
            c->hst.act16_conv++;
        }
    } else if (c->act16_twin) {
        c->hst.act16_twin++;
    }
    return rc;
}

/* activations rounded to the weight's 16-bit type (cuda_act16); with precise, the rounding
 * error is carried by a second gemm (x = hi + lo) */
static int gemm_16(struct cuda_ctx *c, float *out, const float *in, const void *w, enum be_type t,
                   uint32_t n, uint32_t n_in, uint32_t n_out, float beta)
{
    size_t elems = (size_t)n * n_in;
    int rc = cuda_act16(c, in, elems, t);
    if (rc == 0)
        rc = gemm_ex(c, out, w, t, c->act16, n, n_in, n_out, beta);
    if (rc == 0 && c->tune.precise) {
        rc = cuda_convert_f32_lo(c, c->act16, t, in, elems);
        if (rc == 0)
            rc = gemm_ex(c, out, w, t, c->act16, n, n_in, n_out, 1.0f);
    }
    act16_written(c, out, (size_t)n * n_out); /* over this call's input, say */
    return rc;
}

int cuda_matmul(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                const float *bias, uint32_t n)
{
    if (n == 0)
        return 0;
    act16_written(c, out, (size_t)n * w->rows); /* the paths that leave act16 alone too */
    if (quant_is_block(w->type) && w->type != BE_Q8_0 && n > c->tune.gemv_max_n &&
        !c->deterministic)
        return cuda_matmul_quant(c, out, in, w, bias, n);
    if (n <= c->tune.gemv_max_n) {
        int rc = cuda_matmul_mma(c, out, in, w, bias, n);
        return rc != 1 ? rc : cuda_gemv(c, out, in, w, bias, n);
    }
    if (c->deterministic) {
        /* the decode kernel over every 8 tokens: a token's numbers do not depend on the batch */
        for (uint32_t t0 = 0; t0 < n; t0 += CUDA_GEMV_MAX_N) {
            uint32_t k = n - t0 < CUDA_GEMV_MAX_N ? n - t0 : CUDA_GEMV_MAX_N;
            int rc =
                cuda_gemv(c, out + (size_t)t0 * w->rows, in + (size_t)t0 * w->cols, w, bias, k);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    const uint32_t n_in = w->cols, n_out = w->rows;
    int rc = 0;
    switch (w->type) {
    case BE_F32: {
        const float one = 1.0f, zero = 0.0f;
        CUBLAS_TRY(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n, (int)n_in,
                               &one, (const float *)w->data, (int)n_in, in, (int)n_in, &zero, out,
                               (int)n_out));
        break;
    }
    case BE_F16:
    case BE_BF16: rc = gemm_16(c, out, in, w->data, w->type, n, n_in, n_out, 0.0f); break;
    case BE_Q8_0:
        rc = cuda_scratch(c, &c->wdeq, &c->wdeq_cap, (size_t)n_out * n_in * 2);
        if (rc == 0)
            rc = cuda_dequant_q8_0_f16(c, (__half *)c->wdeq, w->data, n_out, n_in);
        if (rc == 0)
            rc = gemm_16(c, out, in, c->wdeq, BE_F16, n, n_in, n_out, 0.0f);
        break;
    default: return RKV_EUNSUPPORTED;
    }
    if (rc == 0 && bias)
        rc = cuda_add_bias(c, out, bias, n, n_out);
    return rc;
}

int cuda_matmul2(struct cuda_ctx *c, float *out0, float *out1, const float *in,
                 const struct be_tensor *w0, const struct be_tensor *w1, const float *bias0,
                 const float *bias1, uint32_t n)
{
    const enum be_type t = w0->type;
    if (n <= c->tune.gemv_max_n || n > c->tune.pair_n || c->deterministic || c->tune.precise ||
        (t != BE_F16 && t != BE_BF16))
        return 1;
    /* one strided batch of two: the weights, and the outputs, one stride apart in the same
     * order (cudaMalloc's order: the model's k before v, the forward's gate before up) */
    const uint32_t n_in = w0->cols, n_out = w0->rows;
    const void *wa = w0->data;
    float *oa = out0;
    long long sa = ((const char *)w1->data - (const char *)w0->data) / 2, sc = out1 - out0;
    if (sa < 0 && sc < 0) { /* both the other way round: the batch starts at the second */
        wa = w1->data;
        oa = out1;
        sa = -sa;
        sc = -sc;
    }
    if (sa < (long long)n_out * n_in || sc < (long long)n * n_out ||
        ((uintptr_t)w0->data | (uintptr_t)w1->data) % 2)
        return 1; /* they overlap, or the weights are not whole elements apart */
    act16_written(c, out0, (size_t)n * n_out);
    act16_written(c, out1, (size_t)n * n_out);
    int rc = cuda_act16(c, in, (size_t)n * n_in, t);
    if (rc < 0)
        return rc;
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType wt = t == BE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n,
                                          (int)n_in, &one, wa, wt, (int)n_in, sa, c->act16, wt,
                                          (int)n_in, 0, &zero, oa, CUDA_R_32F, (int)n_out, sc, 2,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    c->hst.mm_pair++;
    if (bias0)
        rc = cuda_add_bias(c, out0, bias0, n, n_out);
    if (rc == 0 && bias1)
        rc = cuda_add_bias(c, out1, bias1, n, n_out);
    return rc;
}

int cuda_matmul_add(struct cuda_ctx *c, float *out, const float *in, const struct be_tensor *w,
                    uint32_t n)
{
    if (n <= c->tune.gemv_max_n || c->deterministic || c->tune.precise ||
        (w->type != BE_F16 && w->type != BE_BF16))
        return 1;
    return gemm_16(c, out, in, w->data, w->type, n, w->cols, w->rows, 1.0f);
}
