/* fill.cu - random tensor contents made on the device (benchmark models, no host upload). */
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_ctx.cuh"

/* splitmix64 of the element index: the same values for a seed everywhere */
__device__ __forceinline__ float fill_uniform(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

__global__ void fill_kernel(void *dst, int type, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = fill_uniform(seed, i) * scale;
        switch (type) {
        case BE_F32: ((float *)dst)[i] = v; break;
        case BE_F16: ((__half *)dst)[i] = __float2half_rn(v); break;
        case BE_BF16: ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v); break;
        default: { /* q8_0: block i/32 gets scale/127, value i%32 a random int8 */
            uint8_t *b = (uint8_t *)dst + (i / 32) * 34;
            if (i % 32 == 0) {
                __half d = __float2half_rn(scale / 127.0f);
                unsigned short u = __half_as_ushort(d);
                b[0] = (uint8_t)(u & 0xff);
                b[1] = (uint8_t)(u >> 8);
            }
            b[2 + i % 32] = (uint8_t)(int8_t)__float2int_rn(fill_uniform(seed, i) * 127.0f);
        }
        }
    }
}

extern "C" int rkv_cuda_fill_random(void *dev, int type, size_t n, uint64_t seed, float scale)
{
    if (type != BE_F32 && type != BE_F16 && type != BE_BF16 && !(type == BE_Q8_0 && n % 32 == 0))
        return RKV_EINVAL;
    fill_kernel<<<4096, 256>>>(dev, type, n, seed, scale);
    CU_LAUNCHED();
    CU_TRY(cudaDeviceSynchronize());
    return 0;
}
