/* convert.cu - activations f32 -> f16/bf16 for cublas; q8_0 weights -> f16 for prefill. */
#include "worker/cuda/cuda_ops.cuh"

__global__ void f32_to_f16_kernel(__half *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* four elements a thread (cuda_vec4_ok): n4 = n / 4 */
__global__ void f32_to_16x4_kernel(void *dst, int t16, const float4 *src, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x)
        cuda_store16x4(dst, t16, i, src[i]);
}

// the rounding residual: dst = round(src - round(src)), so hi + lo carries ~16 more bits
__global__ void f32_to_16_lo_kernel(void *dst, int bf, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = src[i];
        if (bf) {
            float hi = __bfloat162float(__float2bfloat16_rn(x));
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x - hi);
        } else {
            float hi = __half2float(__float2half_rn(x));
            ((__half *)dst)[i] = __float2half_rn(x - hi);
        }
    }
}

// dst (rows, cols) f16 from q8_0 rows of cols/32 34-byte blocks
__global__ void q8_0_to_f16_kernel(__half *dst, const uint8_t *src, size_t row_bytes, uint32_t cols,
                                   size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols;
        uint32_t k = (uint32_t)(i % cols);
        dst[i] = __float2half_rn(cuda_q8_0(src + r * row_bytes, k));
    }
}

static unsigned grid_for(size_t n)
{
    size_t blocks = (n + 255) / 256;
    return blocks < 65535 ? (unsigned)blocks : 65535;
}

int cuda_convert_f32(struct cuda_ctx *c, void *dst, enum be_type type, const float *src, size_t n)
{
    if (n == 0)
        return 0;
    if ((type == BE_F16 || type == BE_BF16) && cuda_vec4_ok(n, src, NULL, NULL, dst))
        f32_to_16x4_kernel<<<grid_for(n / 4), 256, 0, c->stream>>>(dst, (int)type,
                                                                   (const float4 *)src, n / 4);
    else if (type == BE_F16)
        f32_to_f16_kernel<<<grid_for(n), 256, 0, c->stream>>>((__half *)dst, src, n);
    else if (type == BE_BF16)
        f32_to_bf16_kernel<<<grid_for(n), 256, 0, c->stream>>>((__nv_bfloat16 *)dst, src, n);
    else
        return RKV_EUNSUPPORTED;
    CU_LAUNCHED();
    return 0;
}

int cuda_convert_f32_lo(struct cuda_ctx *c, void *dst, enum be_type type, const float *src,
                        size_t n)
{
    if (n == 0)
        return 0;
    f32_to_16_lo_kernel<<<grid_for(n), 256, 0, c->stream>>>(dst, type == BE_BF16, src, n);
    CU_LAUNCHED();
    return 0;
}

int cuda_dequant_q8_0_f16(struct cuda_ctx *c, __half *dst, const void *src, uint32_t rows,
                          uint32_t cols)
{
    size_t n = (size_t)rows * cols;
    if (n == 0)
        return 0;
    size_t row_bytes = (size_t)cols / 32 * 34;
    q8_0_to_f16_kernel<<<grid_for(n), 256, 0, c->stream>>>(dst, (const uint8_t *)src, row_bytes,
                                                           cols, n);
    CU_LAUNCHED();
    return 0;
}
