/* silu_mul.cu - the gated units: out = silu(gate) * up (swiglu) or gelu(gate) * up (gemma's
 * geglu, the tanh gelu), elementwise; and out *= s. */
#include "worker/cuda/cuda_ops.cuh"

/* gelu(g) * u, gelu the tanh approximation, as cpu_gelu_mul_row computes it */
__device__ __forceinline__ float cuda_gelu_mul1(float g, float u)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
}

template <int GELU> __device__ __forceinline__ float glu1(float g, float u)
{
    return GELU ? cuda_gelu_mul1(g, u) : cuda_silu_mul1(g, u);
}

/* one element a thread: any n or alignment */
template <int GELU>
__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, size_t n,
                                void *twin, int t16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float r = glu1<GELU>(gate[i], up[i]);
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
template <int GELU>
__global__ void silu_mul4_kernel(float4 *out, const float4 *gate, const float4 *up, size_t n4,
                                 void *twin, int t16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 g = gate[i], u = up[i];
        const float4 r = make_float4(glu1<GELU>(g.x, u.x), glu1<GELU>(g.y, u.y),
                                     glu1<GELU>(g.z, u.z), glu1<GELU>(g.w, u.w));
        out[i] = r;
        if (twin)
            cuda_store16x4(twin, t16, i, r);
    }
}

int cuda_glu(struct cuda_ctx *c, int gelu, float *out, const float *gate, const float *up, size_t n,
             void *twin, enum be_type t16)
{
    if (n == 0)
        return 0;
    const bool v4 = cuda_vec4_ok(n, out, gate, up, twin);
    const size_t items = v4 ? n / 4 : n, blocks = (items + 255) / 256;
    const unsigned grid = blocks < 65535 ? (unsigned)blocks : 65535;
    auto k4 = gelu ? silu_mul4_kernel<1> : silu_mul4_kernel<0>;
    auto k1 = gelu ? silu_mul_kernel<1> : silu_mul_kernel<0>;
    if (v4)
        k4<<<grid, 256, 0, c->stream>>>((float4 *)out, (const float4 *)gate, (const float4 *)up,
                                        n / 4, twin, (int)t16);
    else
        k1<<<grid, 256, 0, c->stream>>>(out, gate, up, n, twin, (int)t16);
    CU_LAUNCHED();
    return 0;
}

__global__ void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

int cuda_scale(struct cuda_ctx *c, float *x, float s, size_t n)
{
    if (n == 0)
        return 0;
    const size_t blocks = (n + 255) / 256;
    const unsigned grid = blocks < 65535 ? (unsigned)blocks : 65535;
    scale_kernel<<<grid, 256, 0, c->stream>>>(x, s, n);
    CU_LAUNCHED();
    return 0;
}
