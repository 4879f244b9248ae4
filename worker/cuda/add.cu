/* add.cu - elementwise residual add and the per-row bias add after cublas. */
#include "worker/cuda/cuda_ops.cuh"

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

// out (n, cols) += bias (cols)
__global__ void add_bias_kernel(float *out, const float *bias, size_t total, uint32_t cols)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % cols];
}

static unsigned grid_for(size_t n)
{
    size_t blocks = (n + 255) / 256;
    return blocks < 65535 ? (unsigned)blocks : 65535;
}

int cuda_add(struct cuda_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    if (n == 0)
        return 0;
    add_kernel<<<grid_for(n), 256, 0, c->stream>>>(out, a, b, n);
    CU_LAUNCHED();
    return 0;
}

int cuda_add_bias(struct cuda_ctx *c, float *out, const float *bias, uint32_t n, uint32_t cols)
{
    size_t total = (size_t)n * cols;
    if (total == 0)
        return 0;
    add_bias_kernel<<<grid_for(total), 256, 0, c->stream>>>(out, bias, total, cols);
    CU_LAUNCHED();
    return 0;
}
