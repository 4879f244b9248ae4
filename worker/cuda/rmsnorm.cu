/* rmsnorm.cu - row-wise rms normalization times a weight, one thread block per row. */
#include "worker/cuda/cuda_ops.cuh"

// in, out (n, dim); w (dim)
__global__ void rmsnorm_kernel(float *out, const float *in, const float *w, uint32_t dim, float eps)
{
    const float *x = in + (size_t)blockIdx.x * dim;
    float *y = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x)
        ss += x[i] * x[i];
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffff, ss, o);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffff, ss, o);
        if (threadIdx.x == 0)
            red[0] = ss;
    }
    __syncthreads();
    float scale = rsqrtf(red[0] / (float)dim + eps);
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x)
        y[i] = x[i] * scale * w[i];
}

int cuda_rmsnorm(struct cuda_ctx *c, float *out, const float *in, const float *w, uint32_t n,
                 uint32_t dim, float eps)
{
    if (n == 0)
        return 0;
    rmsnorm_kernel<<<n, 256, 0, c->stream>>>(out, in, w, dim, eps);
    CU_LAUNCHED();
    return 0;
}
