/* silu_mul.cu - the swiglu gate: out = silu(gate) * up, elementwise. */
#include "worker/cuda/cuda_ops.cuh"

__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, size_t n,
                                void *twin, int t16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        const float r = g / (1.0f + expf(-g)) * up[i];
        out[i] = r;
        if (twin) {
            /* the rounding of convert.cu's f32_to_16 */
            if (t16 == BE_BF16)
                ((__nv_bfloat16 *)twin)[i] = __float2bfloat16_rn(r);
            else
                ((__half *)twin)[i] = __float2half_rn(r);
        }
    }
}

int cuda_silu_mul(struct cuda_ctx *c, float *out, const float *gate, const float *up, size_t n,
                  void *twin, enum be_type t16)
{
    if (n == 0)
        return 0;
    size_t blocks = (n + 255) / 256;
    unsigned grid = blocks < 65535 ? (unsigned)blocks : 65535;
    silu_mul_kernel<<<grid, 256, 0, c->stream>>>(out, gate, up, n, twin, (int)t16);
    CU_LAUNCHED();
    return 0;
}
