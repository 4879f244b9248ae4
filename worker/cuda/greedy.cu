/* greedy.cu - the greedy pick of logits rows on the device: the argmax (ties: the lowest id; nan
 * never wins) and its log-softmax, what worker/sample.c's sample_greedy returns, so a greedy step
 * sends back two numbers a row instead of its logits. Two launches: the slices of every row at
 * once (max, first id, sum exp(x - max) in double), then a warp a row merges its slices in a
 * fixed order (one block a row read 128k logits one at a time: 59 us a step on the H200). */
#include "worker/cuda/cuda_ops.cuh"

/* (value, id) that wins: the larger value, then the lower id */
__device__ __forceinline__ void greedy_better(float &v, int32_t &id, float v2, int32_t id2)
{
    if (v2 > v || (v2 == v && id2 < id)) {
        v = v2;
        id = id2;
    }
}

#define GREEDY_PART_THREADS 256
#define GREEDY_PER_THREAD   8 /* logits a thread reads, at most GREEDY_MAX_PARTS parts */
#define GREEDY_MAX_PARTS    128

/* the partial pick of one slice of a row: its max (nan never counts) and first id, and
 * sum exp(x - max) over it in double */
struct greedy_part {
    float v;
    int32_t id;
    double sum;
};

/* (m, s) with s = sum exp(x - m) taking in (m2, s2): the larger max, the other sum rescaled */
__device__ __forceinline__ void greedy_lse(float &m, double &s, float m2, double s2)
{
    if (m2 > m) {
        s = s * exp((double)m - (double)m2) + s2;
        m = m2;
    } else if (m2 > -INFINITY) {
        s += s2 * exp((double)m2 - (double)m);
    }
}

/* block (p, r): slice p of row r's logits into part[r * gridDim.x + p] */
__global__ void __launch_bounds__(GREEDY_PART_THREADS)
    greedy_part_kernel(const float *logits, uint32_t n_vocab, struct greedy_part *part)
{
    __shared__ float s_v[GREEDY_PART_THREADS / 32], s_m[GREEDY_PART_THREADS / 32];
    __shared__ int32_t s_id[GREEDY_PART_THREADS / 32];
    __shared__ double s_s[GREEDY_PART_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.y * n_vocab;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t per = (n_vocab + gridDim.x - 1) / gridDim.x;
    const uint32_t beg = blockIdx.x * per, end = min(n_vocab, beg + per);
    float v = -INFINITY, m = -INFINITY;
    int32_t id = INT32_MAX;
    double sum = 0.0;
#pragma unroll 4
    for (uint32_t i = beg + threadIdx.x; i < end; i += blockDim.x) {
        const float x = row[i];
        if (isnan(x))
            continue;
        greedy_better(v, id, x, (int32_t)i);
        if (x > m) {
            sum = sum * exp((double)m - (double)x) + 1.0;
            m = x;
        } else if (x > -INFINITY) {
            sum += (double)expf(x - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        greedy_better(v, id, __shfl_xor_sync(0xffffffff, v, o), __shfl_xor_sync(0xffffffff, id, o));
        greedy_lse(m, sum, __shfl_xor_sync(0xffffffff, m, o), __shfl_xor_sync(0xffffffff, sum, o));
    }
    if (lane == 0) {
        s_v[warp] = v;
        s_id[warp] = id;
        s_m[warp] = m;
        s_s[warp] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (uint32_t w = 1; w < blockDim.x / 32; w++) {
            greedy_better(v, id, s_v[w], s_id[w]);
            greedy_lse(m, sum, s_m[w], s_s[w]);
        }
        part[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = {v, id, m == v ? sum : 0.0};
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
    for (uint32_t i = lane; i < n_parts; i += 32)
        greedy_better(v, id, p[i].v, p[i].id);
    for (int o = 16; o > 0; o >>= 1)
        greedy_better(v, id, __shfl_xor_sync(0xffffffff, v, o), __shfl_xor_sync(0xffffffff, id, o));
    if (v == -INFINITY || v == INFINITY) {
        /* nothing finite, or an infinite logit: the cpu reports these too without a sum */
        if (lane == 0) {
            ids[blockIdx.x] = id == INT32_MAX ? 0 : id; /* every logit nan: id 0 */
            logprobs[blockIdx.x] = v == INFINITY ? 0.0f : -logf((float)n_vocab);
        }
        return;
    }
    double t = 0.0;
    for (uint32_t i = lane; i < n_parts; i += 32)
        if (p[i].v > -INFINITY)
            t += p[i].sum * exp((double)p[i].v - (double)v);
    for (int o = 16; o > 0; o >>= 1)
        t += __shfl_xor_sync(0xffffffff, t, o);
    if (lane == 0) {
        ids[blockIdx.x] = id;
        logprobs[blockIdx.x] = (float)(-log(t)); /* logit - (max + log sum), logit = max */
    }
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
