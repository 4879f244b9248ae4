/* attn_merge.cu - log-sum-exp merges: two partial sets, and per-block partials in block order. */
#include <math.h>

#include "worker/cuda/cuda_ops.cuh"

// a = lse-merge(a, b) per (token, head); o (n, n_head*D)
__global__ void merge_kernel(float *oa, float *ma, float *la, const float *ob, const float *mb,
                             const float *lb, uint32_t D)
{
    uint32_t th = blockIdx.x;
    float m_a = ma[th], l_a = la[th], m_b = mb[th], l_b = lb[th];
    if (m_b == -INFINITY || l_b == 0.0f)
        return;
    float ca = 0.0f, cb = 1.0f, mx = m_b, lsum = l_b;
    if (m_a != -INFINITY && l_a != 0.0f) {
        mx = fmaxf(m_a, m_b);
        float wa = l_a * expf(m_a - mx), wb = l_b * expf(m_b - mx);
        lsum = wa + wb;
        ca = wa / lsum;
        cb = wb / lsum;
    }
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        size_t i = (size_t)th * D + d;
        oa[i] = ca == 0.0f ? ob[i] : oa[i] * ca + ob[i] * cb;
    }
    __syncthreads(); /* every thread read ma, la before they change */
    if (threadIdx.x == 0) {
        ma[th] = mx;
        la[th] = lsum;
    }
}

int cuda_attn_merge(struct cuda_ctx *c, float *oa, float *ma, float *la, const float *ob,
                    const float *mb, const float *lb, uint32_t n, uint32_t n_head,
                    uint32_t head_dim, cudaStream_t s)
{
    if (n == 0)
        return 0;
    unsigned threads = head_dim < 128 ? head_dim : 128;
    (void)c;
    merge_kernel<<<n * n_head, threads, 0, s>>>(oa, ma, la, ob, mb, lb, head_dim);
    CU_LAUNCHED();
    return 0;
}

// (o, m, l) of each (token, head) from the per-block partials of up to two launches of one split
// per block (part_i's split p holds entry p of list_i), merged block by block in position order,
// every sum in that order on every thread: the numbers do not depend on which list a block was
// in. Blocks past the token's position and blocks in neither list count as empty. Grid (token x
// head, head_dim / 32), 32 threads: each block redoes the (cheap) weights and sums 32 dims, with
// the blocks' m and l in shared memory and the o loads unrolled, so the serial sums do not wait
// on one global load at a time.
#define MB_THREADS 32
__global__ void __launch_bounds__(MB_THREADS)
    merge_blocks_kernel(const struct cuda_seq_meta *seqs, uint32_t n_seqs,
                        const struct cuda_blk *blks, const int32_t *pos, uint32_t B, int list0,
                        const float *part0, int list1, const float *part1, uint32_t n_th,
                        uint32_t n_head, uint32_t D, float *o, float *m, float *l)
{
    extern __shared__ float msm[];
    const uint32_t th = blockIdx.x, t = th / n_head, tid = threadIdx.x;
    const uint32_t PD = D + 2;
    /* the token's sequence: the last one starting at or before it */
    uint32_t lo = 0, hi = n_seqs;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (seqs[mid].tok_off <= t)
            lo = mid;
        else
            hi = mid;
    }
    const struct cuda_seq_meta sq = seqs[lo];
    const uint32_t nl = (uint32_t)pos[t] / B + 1; /* the blocks the token attends to */
    const float **src = (const float **)msm;
    float *bm = (float *)(src + nl), *bl_ = bm + nl, *w = bl_ + nl;
    for (uint32_t j = tid; j < nl; j += MB_THREADS)
        src[j] = NULL;
    __syncthreads();
    for (int which = 0; which < 2; which++) {
        int li = which ? list1 : list0;
        const float *pt = which ? part1 : part0;
        if (li < 0)
            continue;
        const struct cuda_blk *bl = blks + sq.list_off[li];
        for (uint32_t i = tid; i < sq.list_len[li]; i += MB_THREADS)
            if (bl[i].j < nl)
                src[bl[i].j] = pt + ((size_t)i * n_th + th) * PD;
    }
    __syncthreads();
    for (uint32_t j = tid; j < nl; j += MB_THREADS) {
        const float *p = src[j];
        float lv = p ? p[D + 1] : 0.0f;
        bl_[j] = lv > 0.0f ? lv : 0.0f;
        bm[j] = lv > 0.0f ? p[D] : -INFINITY;
    }
    __syncthreads();
    float M = -INFINITY;
    for (uint32_t j = 0; j < nl; j++)
        M = fmaxf(M, bm[j]);
    for (uint32_t j = tid; j < nl; j += MB_THREADS)
        w[j] = bl_[j] > 0.0f ? expf(bm[j] - M) : 0.0f;
    __syncthreads();
    float L = 0.0f;
    for (uint32_t j = 0; j < nl; j++)
        L += w[j] * bl_[j];
    const uint32_t d = blockIdx.y * MB_THREADS + tid;
    if (d < D) {
        float acc = 0.0f;
#pragma unroll 8
        for (uint32_t j = 0; j < nl; j++) {
            float wj = w[j];
            float v = wj != 0.0f ? src[j][d] : 0.0f;
            acc += v * wj;
        }
        o[(size_t)th * D + d] = L > 0.0f ? acc / L : 0.0f;
    }
    if (tid == 0 && blockIdx.y == 0) {
        m[th] = L > 0.0f ? M : -INFINITY;
        l[th] = L;
    }
}

int cuda_attn_merge_blocks(struct cuda_ctx *c, const struct cuda_meta *m, int list0,
                           const float *part0, int list1, const float *part1, uint32_t n_head,
                           uint32_t head_dim, float *o, float *ml, float *l, cudaStream_t s)
{
    uint32_t n_th = m->n_tokens * n_head;
    if (n_th == 0)
        return 0;
    /* a token attends to at most its sequence's blocks: its device and host lists */
    uint32_t max_nl = m->max_units[KV_DEVICE] + m->max_units[KV_HOST] + 1;
    size_t sm = (size_t)max_nl * (sizeof(float *) + 3 * sizeof(float));
    if (sm > 48 * 1024) {
        static size_t sm_set;
        if (sm > sm_set) {
            CU_TRY(cudaFuncSetAttribute(merge_blocks_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            sm_set = sm;
        }
    }
    dim3 grid(n_th, (head_dim + MB_THREADS - 1) / MB_THREADS);
    merge_blocks_kernel<<<grid, MB_THREADS, sm, s>>>(m->d_seqs, m->n_seqs, m->d_blks, m->d_pos,
                                                     c->layout.block_size, list0, part0, list1,
                                                     part1, n_th, n_head, head_dim, o, ml, l);
    CU_LAUNCHED();
    return 0;
}
