/* greedy.cu - the greedy pick of logits rows on the device: the argmax (ties: the lowest id; nan
 * never wins) and its log-softmax, what worker/sample.c's sample_greedy returns, so a greedy step
 * sends back two numbers a row instead of its logits. Two launches: the slices of every row at
 * once (max, first id, sum exp(x - max) in double), then a warp a row merges its slices in a
 * fixed order (one block a row read 128k logits one at a time: 59 us a step on the H200). */
#include "worker/cuda/cuda_ops.cuh"

#define GREEDY_PART_THREADS 256
#define GREEDY_PER_THREAD   8 /* logits a thread reads, at most GREEDY_MAX_PARTS parts */
#define GREEDY_MAX_PARTS    128

/* the pick of one slice of a row: its max v (nan never counts), the first id holding it, and
 * sum exp(x - v) over the slice in double */
struct greedy_part {
    float v;
    int32_t id;
    double sum;
};

/* (v, id, s) taking in (v2, id2, s2): the larger value wins, then the lower id; each sum is
 * over exp(x - its own max), so the smaller side's is rescaled to the larger max */
__device__ __forceinline__ void greedy_take(float &v, int32_t &id, double &s, float v2, int32_t id2,
                                            double s2)
{
    if (v2 > v) {
        s = s2 + (v > -INFINITY ? s * exp((double)v - (double)v2) : 0.0);
        v = v2;
        id = id2;
        return;
    }
    if (v2 == v) {
        s += s2;
        id = id2 < id ? id2 : id;
    } else if (v2 > -INFINITY) {
        s += s2 * exp((double)v2 - (double)v);
    }
}

/* (v, id, s) from every lane of the warp, in the same order every time */
__device__ __forceinline__ void greedy_warp(float &v, int32_t &id, double &s)
{
    for (int o = 16; o > 0; o >>= 1)
        greedy_take(v, id, s, __shfl_xor_sync(0xffffffff, v, o), __shfl_xor_sync(0xffffffff, id, o),
                    __shfl_xor_sync(0xffffffff, s, o));
}

/* block (p, r): slice p of row r's logits into part[r * gridDim.x + p] */
__global__ void __launch_bounds__(GREEDY_PART_THREADS)
    greedy_part_kernel(const float *logits, uint32_t n_vocab, struct greedy_part *part)
{
    __shared__ struct greedy_part s_p[GREEDY_PART_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.y * n_vocab;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t per = (n_vocab + gridDim.x - 1) / gridDim.x;
    const uint32_t beg = blockIdx.x * per, end = min(n_vocab, beg + per);
    float v = -INFINITY;
    int32_t id = INT32_MAX;
    double sum = 0.0;
#pragma unroll 4
    for (uint32_t i = beg + threadIdx.x; i < end; i += blockDim.x) {
        const float x = row[i];
        if (!isnan(x))
            greedy_take(v, id, sum, x, (int32_t)i, x > -INFINITY ? 1.0 : 0.0);
    }
    greedy_warp(v, id, sum);
    if (lane == 0)
        s_p[warp] = {v, id, sum};
    __syncthreads();
    if (threadIdx.x == 0) {
        for (uint32_t w = 1; w < blockDim.x / 32; w++)
            greedy_take(v, id, sum, s_p[w].v, s_p[w].id, s_p[w].sum);
        part[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = {v, id, sum};
    }
}

/* one warp per row: lane i takes parts i, i + 32, ..., then a shuffle tree (the same order
 * every time); the pick and its log-softmax as the cpu's */
__global__ void greedy_merge_kernel(const struct greedy_part *part, uint32_t n_parts,
                                    uint32_t n_vocab, int32_t *ids, float *logprobs)
{
    const struct greedy_part *p = part + (size_t)blockIdx.x * n_parts;
    const uint32_t lane = threadIdx.x;
    float v = -INFINITY;
    int32_t id = INT32_MAX;
    double t = 0.0;
    for (uint32_t i = lane; i < n_parts; i += 32)
        greedy_take(v, id, t, p[i].v, p[i].id, p[i].sum);
    greedy_warp(v, id, t);
    if (lane != 0)
        return;
    ids[blockIdx.x] = id == INT32_MAX ? 0 : id; /* every logit nan: id 0 */
    /* nothing finite, or an infinite logit: the cpu reports these too without a sum */
    if (v == -INFINITY || v == INFINITY)
        logprobs[blockIdx.x] = v == INFINITY ? 0.0f : -logf((float)n_vocab);
    else
        logprobs[blockIdx.x] = (float)(-log(t)); /* logit - (max + log sum), logit = max */
}

/* parts of a row: GREEDY_PER_THREAD logits a thread, GREEDY_MAX_PARTS at most */
static uint32_t greedy_parts(uint32_t n_vocab)
{
    uint32_t p = n_vocab / (GREEDY_PART_THREADS * GREEDY_PER_THREAD);
    return p < 1 ? 1 : p > GREEDY_MAX_PARTS ? GREEDY_MAX_PARTS : p;
}

size_t cuda_greedy_scratch(uint32_t n, uint32_t n_vocab)
{
    return (size_t)n * greedy_parts(n_vocab) * sizeof(struct greedy_part);
}

int cuda_greedy(struct cuda_ctx *c, const float *logits, uint32_t n, uint32_t n_vocab,
                int32_t *d_ids, float *d_logprobs, void *scratch)
{
    if (n == 0)
        return 0;
    const uint32_t np = greedy_parts(n_vocab);
    struct greedy_part *part = (struct greedy_part *)scratch;
    greedy_part_kernel<<<dim3(np, n), GREEDY_PART_THREADS, 0, c->stream>>>(logits, n_vocab, part);
    CU_LAUNCHED();
    greedy_merge_kernel<<<n, 32, 0, c->stream>>>(part, np, n_vocab, d_ids, d_logprobs);
    CU_LAUNCHED();
    return 0;
}
