/* quant_f16.cu - rows of block-type weights dequantized to f16 for the tensor-core gemms of
 * prefill: a thread a 32-value unit. */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/quant.cuh"

template <int T>
__global__ void quant_f16_kernel(__half *dst, const uint8_t *w, size_t row_bytes, uint32_t units,
                                 uint64_t n_units)
{
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_units;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = i / units, u = i % units;
        float v[32];
        dq32<T>(w + r * row_bytes, (uint32_t)u, v);
        __half2 *o = (__half2 *)(dst + r * units * 32 + u * 32);
#pragma unroll
        for (int k = 0; k < 16; k++)
            o[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    }
}

struct qf_launch {
    template <int T>
    static void run(cudaStream_t st, __half *dst, const struct be_tensor *w, uint32_t r0,
                    uint32_t r1)
    {
        const uint32_t units = w->cols / 32;
        const uint64_t n_units = (uint64_t)(r1 - r0) * units;
        const unsigned blocks = (unsigned)((n_units + 255) / 256 < 65536 ? (n_units + 255) / 256
                                                                          : 65536);
        quant_f16_kernel<T><<<blocks, 256, 0, st>>>(
            dst, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, units,
            n_units);
    }
};

int cuda_quant_to_f16(struct cuda_ctx *c, __half *dst, const struct be_tensor *w, uint32_t r0,
                      uint32_t r1)
{
    if (r1 <= r0)
        return 0;
    if (w->cols % 32 || r1 > w->rows)
        return RKV_EINVAL;
    if (quant_dispatch<qf_launch>((int)w->type, c->stream, dst, w, r0, r1))
        return RKV_EUNSUPPORTED;
    CU_LAUNCHED();
    return 0;
}
