/* mark.cu - a stream's progress told to the host: a word of mapped pinned memory set once the
 * work queued before it on the stream is done (the split host read's cpu thread waits on it). */
#include "worker/cuda/cuda_ops.cuh"

__global__ void mark_kernel(uint32_t *word, uint32_t v)
{
    __threadfence_system(); /* what the stream wrote to host memory before lands first */
    *(volatile uint32_t *)word = v;
    __threadfence_system();
}

int cuda_mark(uint32_t *word, uint32_t v, cudaStream_t s)
{
    mark_kernel<<<1, 1, 0, s>>>(word, v);
    CU_LAUNCHED();
    return 0;
}
