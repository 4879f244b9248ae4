/* embed.cu - embedding gather: rows of a weight of any type, dequantized to f32. */
#include "worker/cuda/cuda_ops.cuh"

// out (n, cols) = w rows ids[i]; w rows of row_bytes in `type`
__global__ void embed_kernel(float *out, const char *w, size_t row_bytes, int type,
                             const int32_t *ids, uint32_t cols)
{
    const char *row = w + (size_t)ids[blockIdx.x] * row_bytes;
    float *dst = out + (size_t)blockIdx.x * cols;
    for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x)
        dst[i] = cuda_row_value(type, row, i);
}

int cuda_embed(struct cuda_ctx *c, float *out, const struct be_tensor *w, const int32_t *d_ids,
               uint32_t n)
{
    if (n == 0)
        return 0;
    embed_kernel<<<n, 256, 0, c->stream>>>(out, (const char *)w->data, w->row_bytes, (int)w->type,
                                           d_ids, w->cols);
    CU_LAUNCHED();
    return 0;
}
