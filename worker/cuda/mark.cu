/* mark.cu - a stream's progress told to the host: a word of mapped pinned memory set once the
 * work queued before it on the stream is done (the split host read's balance reads it). */
#include "worker/cuda/cuda_ops.cuh"

__global__ void mark_kernel(uint32_t *word, uint32_t v)
{
    *(volatile uint32_t *)word = v;
    __threadfence_system(); /* the store reaches host memory before the stream moves on */
}

int cuda_mark(uint32_t *word, uint32_t v, cudaStream_t s)
{
    mark_kernel<<<1, 1, 0, s>>>(word, v);
    CU_LAUNCHED();
    return 0;
}

/* n floats from device memory into mapped pinned memory by the sms (no copy engine: a small copy
 * there queues behind a big one in the same direction, or stalls behind the link's) */
__global__ void to_host_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
    __threadfence_system();
}

int cuda_to_host(float *dst, const float *src, size_t n, cudaStream_t s)
{
    if (n == 0)
        return 0;
    const size_t want = (n + 255) / 256;
    const unsigned blocks = want < 132 ? (unsigned)want : 132;
    to_host_kernel<<<blocks, 256, 0, s>>>(dst, src, n);
    CU_LAUNCHED();
    return 0;
}
