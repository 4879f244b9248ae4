/* silu_mul.cu - the swiglu gate: out = silu(gate) * up, elementwise. */
#include "worker/cuda/cuda_ops.cuh"

/* one element a thread: any n or alignment */
__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, size_t n,
                                void *twin, int t16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float r = cuda_silu_mul1(gate[i], up[i]);
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

/* four elements a thread (cuda_vec4_ok): n4 = n / 4 float4s. At batch 64 the one-element
 * kernel took 7.6 us for ~3 us of bytes on the H200 */
__global__ void silu_mul4_kernel(float4 *out, const float4 *gate, const float4 *up, size_t n4,
                                 void *twin, int t16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 g = gate[i], u = up[i];
        const float4 r = make_float4(cuda_silu_mul1(g.x, u.x), cuda_silu_mul1(g.y, u.y),
                                     cuda_silu_mul1(g.z, u.z), cuda_silu_mul1(g.w, u.w));
        out[i] = r;
        if (twin)
            cuda_store16x4(twin, t16, i, r);
    }
}

int cuda_silu_mul(struct cuda_ctx *c, float *out, const float *gate, const float *up, size_t n,
                  void *twin, enum be_type t16)
{
    if (n == 0)
        return 0;
    const bool v4 = cuda_vec4_ok(n, out, gate, up, twin);
    const size_t items = v4 ? n / 4 : n, blocks = (items + 255) / 256;
    const unsigned grid = blocks < 65535 ? (unsigned)blocks : 65535;
    if (v4)
        silu_mul4_kernel<<<grid, 256, 0, c->stream>>>((float4 *)out, (const float4 *)gate,
                                                      (const float4 *)up, n / 4, twin, (int)t16);
    else
        silu_mul_kernel<<<grid, 256, 0, c->stream>>>(out, gate, up, n, twin, (int)t16);
    CU_LAUNCHED();
    return 0;
}
