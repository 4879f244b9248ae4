/* get_rows.cu - gathers f32 rows by index (the rows whose logits are wanted). */
#include "worker/cuda/cuda_ops.cuh"

// out (n, cols) = in rows[i]
__global__ void get_rows_kernel(float *out, const float *in, const uint32_t *rows, uint32_t cols)
{
    const float *src = in + (size_t)rows[blockIdx.x] * cols;
    float *dst = out + (size_t)blockIdx.x * cols;
    for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x)
        dst[i] = src[i];
}

int cuda_get_rows(struct cuda_ctx *c, float *out, const float *in, const uint32_t *d_rows,
                  uint32_t n, uint32_t cols)
{
    if (n == 0)
        return 0;
    get_rows_kernel<<<n, 256, 0, c->stream>>>(out, in, d_rows, cols);
    CU_LAUNCHED();
    return 0;
}
