/* silu_mul.cu - the swiglu gate: out = silu(gate) * up, elementwise. */
#include "worker/cuda/cuda_ops.cuh"

__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

int cuda_silu_mul(struct cuda_ctx *c, float *out, const float *gate, const float *up, size_t n)
{
    if (n == 0)
        return 0;
    size_t blocks = (n + 255) / 256;
    unsigned grid = blocks < 65535 ? (unsigned)blocks : 65535;
    silu_mul_kernel<<<grid, 256, 0, c->stream>>>(out, gate, up, n);
    CU_LAUNCHED();
    return 0;
}
