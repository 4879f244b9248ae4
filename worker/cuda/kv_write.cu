/* kv_write.cu - stores one layer's new k, v rows into their paged kv blocks (device or mapped
 * host). */
#include "worker/cuda/cuda_ops.cuh"

template <typename T> __device__ __forceinline__ T kv_cast(float x);
template <> __device__ __forceinline__ float kv_cast<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __half kv_cast<__half>(float x)
{
    return __float2half_rn(x);
}

// k, v (n_tokens, n_kv_head*head_dim); a block's layer slice is (n_kv_head, B, head_dim)
template <typename T>
__global__ void kv_write_kernel(char *pool0, char *pool1, size_t block_bytes, size_t k_off,
                                size_t v_off, uint32_t B, uint32_t n_kv_head, uint32_t head_dim,
                                const int32_t *pos, const uint32_t *slot, const float *k,
                                const float *v)
{
    uint32_t t = blockIdx.x;
    uint32_t s = slot[t];
    char *blk = ((s >> 31) ? pool1 : pool0) + (size_t)(s & 0x7fffffffu) * block_bytes;
    uint32_t off = (uint32_t)pos[t] % B;
    uint32_t row = n_kv_head * head_dim;
    T *K = (T *)(blk + k_off), *V = (T *)(blk + v_off);
    for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) {
        uint32_t h = e / head_dim, d = e % head_dim;
        size_t dst = ((size_t)h * B + off) * head_dim + d;
        K[dst] = kv_cast<T>(k[(size_t)t * row + e]);
        V[dst] = kv_cast<T>(v[(size_t)t * row + e]);
    }
}

int cuda_kv_write(struct cuda_ctx *c, const struct cuda_meta *m, uint32_t layer, const float *k,
                  const float *v)
{
    const struct kv_layout *l = &c->layout;
    if (m->n_tokens == 0)
        return 0;
    size_t bb = kv_block_bytes(l), ko = kv_slice_offset(l, layer, 0),
           vo = kv_slice_offset(l, layer, 1);
    if (l->dtype == KV_F16)
        kv_write_kernel<__half><<<m->n_tokens, 128, 0, c->stream>>>(
            c->pool[0], c->pool[1], bb, ko, vo, l->block_size, l->n_kv_head, l->head_dim, m->d_pos,
            m->d_slot, k, v);
    else
        kv_write_kernel<float><<<m->n_tokens, 128, 0, c->stream>>>(
            c->pool[0], c->pool[1], bb, ko, vo, l->block_size, l->n_kv_head, l->head_dim, m->d_pos,
            m->d_slot, k, v);
    CU_LAUNCHED();
    return 0;
}
