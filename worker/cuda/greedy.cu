/* greedy.cu - the greedy pick of logits rows on the device: the argmax (ties: the lowest id; nan
 * never wins) and its log-softmax, what worker/sample.c's sample_greedy returns, so a greedy step
 * sends back two numbers a row instead of its logits. */
#include "worker/cuda/cuda_ops.cuh"

#define GREEDY_THREADS 1024

/* (value, id) that wins: the larger value, then the lower id */
__device__ __forceinline__ void greedy_better(float &v, int32_t &id, float v2, int32_t id2)
{
    if (v2 > v || (v2 == v && id2 < id)) {
        v = v2;
        id = id2;
    }
}

/* one block per row: the max and its first id, then sum exp(x - max) in double, as the cpu */
__global__ void __launch_bounds__(GREEDY_THREADS)
    greedy_kernel(const float *logits, uint32_t n_vocab, int32_t *ids, float *logprobs)
{
    __shared__ float s_v[GREEDY_THREADS / 32];
    __shared__ int32_t s_id[GREEDY_THREADS / 32];
    __shared__ double s_sum[GREEDY_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v = -INFINITY;
    int32_t id = INT32_MAX;
    for (uint32_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        float x = row[i];
        if (!isnan(x))
            greedy_better(v, id, x, (int32_t)i);
    }
    for (int o = 16; o > 0; o >>= 1)
        greedy_better(v, id, __shfl_xor_sync(0xffffffff, v, o), __shfl_xor_sync(0xffffffff, id, o));
    if (lane == 0) {
        s_v[warp] = v;
        s_id[warp] = id;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < blockDim.x / 32 ? s_v[lane] : -INFINITY;
        id = lane < blockDim.x / 32 ? s_id[lane] : INT32_MAX;
        for (int o = 16; o > 0; o >>= 1)
            greedy_better(v, id, __shfl_xor_sync(0xffffffff, v, o),
                          __shfl_xor_sync(0xffffffff, id, o));
        if (lane == 0) {
            s_v[0] = v;
            s_id[0] = id;
        }
    }
    __syncthreads();
    const float mx = s_v[0];
    const int32_t best = s_id[0] == INT32_MAX ? 0 : s_id[0]; /* every logit nan: id 0 */
    if (mx == -INFINITY || mx == INFINITY) {
        /* nothing finite, or an infinite logit: the cpu reports these too without a sum */
        if (threadIdx.x == 0) {
            ids[blockIdx.x] = best;
            logprobs[blockIdx.x] = mx == INFINITY ? 0.0f : -logf((float)n_vocab);
        }
        return;
    }
    double sum = 0.0;
    for (uint32_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        float x = row[i];
        if (!isnan(x))
            sum += (double)expf(x - mx);
    }
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffff, sum, o);
    if (lane == 0)
        s_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (uint32_t w = 0; w < blockDim.x / 32; w++)
            t += s_sum[w];
        ids[blockIdx.x] = best;
        logprobs[blockIdx.x] = (float)(-log(t)); /* logit - (max + log sum), logit = max */
    }
}

int cuda_greedy(struct cuda_ctx *c, const float *logits, uint32_t n, uint32_t n_vocab,
                int32_t *d_ids, float *d_logprobs)
{
    if (n == 0)
        return 0;
    greedy_kernel<<<n, GREEDY_THREADS, 0, c->stream>>>(logits, n_vocab, d_ids, d_logprobs);
    CU_LAUNCHED();
    return 0;
}
