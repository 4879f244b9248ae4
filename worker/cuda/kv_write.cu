/* kv_write.cu - stores one layer's new k, v rows into their paged kv blocks (device or mapped
 * host). */
#include "worker/cuda/cuda_ops.cuh"
#include "worker/cuda/kv8.cuh"

template <typename T> __device__ __forceinline__ T kv_cast(float x);
template <> __device__ __forceinline__ float kv_cast<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __half kv_cast<__half>(float x)
{
    return __float2half_rn(x);
}

/* where token t's rows go: its kv block's k and v slices of the layer, or (stg, and a wslot
 * for t) its block's staging slot, the layer's k slice then its v slice (stg_bb bytes) */
struct kv_dst {
    char *pool0, *pool1;
    size_t block_bytes, k_off, v_off;
    char *stg;
    size_t stg_bb;
    const uint32_t *wslot;
};

struct kv_rows {
    char *k, *v; /* the layer's k and v slices of the block */
};

__device__ __forceinline__ kv_rows kv_dst_block(const kv_dst &d, uint32_t slot, uint32_t t)
{
    const uint32_t w = d.stg ? d.wslot[t] : ~0u;
    if (w != ~0u) {
        char *s = d.stg + (size_t)w * d.stg_bb;
        return kv_rows{s, s + d.stg_bb / 2};
    }
    char *blk = cuda_kv_block(d.pool0, d.pool1, slot, d.block_bytes);
    return kv_rows{blk + d.k_off, blk + d.v_off};
}

static kv_dst kv_dst_of(struct cuda_ctx *c, const struct cuda_meta *m, uint32_t layer, char *stg)
{
    const struct kv_layout *l = &c->layout;
    return kv_dst{c->pool[0],
                  c->pool[1],
                  kv_block_bytes(l),
                  kv_slice_offset(l, layer, 0),
                  kv_slice_offset(l, layer, 1),
                  stg,
                  2 * kv_slice_bytes(l),
                  m->d_wslot};
}

// k, v (n_tokens, n_kv_head*head_dim); a block's layer slice is (n_kv_head, B, head_dim)
template <typename T>
__global__ void kv_write_kernel(kv_dst dst, uint32_t B, uint32_t n_kv_head, uint32_t head_dim,
                                const int32_t *pos, const uint32_t *slot, const float *k,
                                const float *v)
{
    uint32_t t = blockIdx.x;
    const kv_rows kr = kv_dst_block(dst, slot[t], t);
    uint32_t off = (uint32_t)pos[t] % B;
    uint32_t row = n_kv_head * head_dim;
    T *K = (T *)kr.k, *V = (T *)kr.v;
    for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) {
        uint32_t h = e / head_dim, d = e % head_dim;
        size_t dst = ((size_t)h * B + off) * head_dim + d;
        K[dst] = kv_cast<T>(k[(size_t)t * row + e]);
        V[dst] = kv_cast<T>(v[(size_t)t * row + e]);
    }
}

/* 8-bit rows (kv8.cuh): a warp per (kv head, K or V) row of token blockIdx.x */
template <int DT>
__global__ void kv_write8_kernel(kv_dst dst, uint32_t B, uint32_t n_kv_head, uint32_t D,
                                 const int32_t *pos, const uint32_t *slot, const float *k,
                                 const float *v)
{
    const uint32_t t = blockIdx.x, lane = threadIdx.x & 31, rb = D + kv8_scale_bytes(DT, D);
    const kv_rows kr = kv_dst_block(dst, slot[t], t);
    const uint32_t off = (uint32_t)pos[t] % B;
    for (uint32_t r = threadIdx.x >> 5; r < 2 * n_kv_head; r += blockDim.x >> 5) {
        const uint32_t h = r >> 1;
        uint8_t *row = kv8_row(r & 1 ? kr.v : kr.k, B, rb, h, off);
        const float *x = (r & 1 ? v : k) + ((size_t)t * n_kv_head + h) * D;
        kv8_store_row<DT>(x, D, row, (char *)row + D, lane);
    }
}

static int kv_write8(struct cuda_ctx *c, const struct cuda_meta *m, const kv_dst &d, const float *k,
                     const float *v)
{
    const struct kv_layout *l = &c->layout;
    auto fn = l->dtype == KV_Q8 ? kv_write8_kernel<KV_Q8> : kv_write8_kernel<KV_FP8>;
    fn<<<m->n_tokens, 128, 0, c->stream>>>(d, l->block_size, l->n_kv_head, l->head_dim, m->d_pos,
                                           m->d_slot, k, v);
    CU_LAUNCHED();
    return 0;
}

int cuda_kv_write(struct cuda_ctx *c, const struct cuda_meta *m, uint32_t layer, const float *k,
                  const float *v, char *stg)
{
    const struct kv_layout *l = &c->layout;
    if (m->n_tokens == 0)
        return 0;
    const kv_dst d = kv_dst_of(c, m, layer, stg);
    if (kv_dtype_is_8bit(l->dtype))
        return kv_write8(c, m, d, k, v);
    if (l->dtype == KV_F16)
        kv_write_kernel<__half><<<m->n_tokens, 128, 0, c->stream>>>(
            d, l->block_size, l->n_kv_head, l->head_dim, m->d_pos, m->d_slot, k, v);
    else
        kv_write_kernel<float><<<m->n_tokens, 128, 0, c->stream>>>(
            d, l->block_size, l->n_kv_head, l->head_dim, m->d_pos, m->d_slot, k, v);
    CU_LAUNCHED();
    return 0;
}

/* rope_kv_write_kernel's T for the 8-bit dtypes: it ropes q and k only, and kv_write8 stores the
 * rows after it (a row's scale needs the whole row) */
struct kv_rope_only {
};

/* one launch for rope(q), rope(k), kv_write(k, v). grid (ceil(items / 128), n_tokens); items per
 * token: n_head * n_rot/2 q pairs, then n_kv_head * head_dim/2 k/v items (item j < n_rot/2
 * rotates k's pair j; later ones carry k's unrotated dims; each writes two k and two v values) */
template <typename T>
__global__ void rope_kv_write_kernel(kv_dst dst, uint32_t B, uint32_t n_kv_head, uint32_t head_dim,
                                     const int32_t *pos, const uint32_t *slot, float *q, float *k,
                                     const float *v, uint32_t n_head, uint32_t n_rot, float base,
                                     float scale, int neox, const cuda_rope_ff ff)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* the attention after this may start its prologue (it waits for this grid before it reads
     * q or the new keys) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const uint32_t t = blockIdx.y, half = n_rot / 2, hd2 = head_dim / 2;
    const uint32_t n_q = n_head * half, item = blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= n_q + n_kv_head * hd2)
        return;
    /* before the wait, what the step's upload holds (the position, the kv slot) and the
     * rotation it gives (double-precision exp2 and log2): only q, k and v come from the
     * projection before. b=1 0.828 / 0.840 at 4k / 32k against 0.827 / 0.834 after the wait */
    const bool is_q = item < n_q;
    const uint32_t e = is_q ? 0 : item - n_q, h = is_q ? item / half : e / hd2;
    const uint32_t j = is_q ? item % half : e % hd2;
    const int32_t p = pos[t];
    float sn = 0.0f, cs = 1.0f;
    if (j < half)
        cuda_rope_sincos(p, j, n_rot, base, scale, ff, &sn, &cs);
    const kv_rows kr = is_q ? kv_rows{nullptr, nullptr} : kv_dst_block(dst, slot[t], t);
    cuda_grid_wait(); /* q, k, v come from the projection before */
    if (is_q) {
        float *hx = q + ((size_t)t * n_head + h) * head_dim;
        uint32_t i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
        float a = hx[i0], b = hx[i1];
        hx[i0] = a * cs - b * sn;
        hx[i1] = a * sn + b * cs;
        return;
    }
    float *kx = k + ((size_t)t * n_kv_head + h) * head_dim;
    const float *vx = v + ((size_t)t * n_kv_head + h) * head_dim;
    uint32_t d0, d1;
    float k0, k1;
    if (j < half) {
        d0 = neox ? j : 2 * j;
        d1 = neox ? j + half : 2 * j + 1;
        float a = kx[d0], b = kx[d1];
        k0 = a * cs - b * sn;
        k1 = a * sn + b * cs;
        kx[d0] = k0;
        kx[d1] = k1;
    } else {
        d0 = n_rot + 2 * (j - half);
        d1 = d0 + 1;
        k0 = kx[d0];
        k1 = kx[d1];
    }
    if constexpr (!std::is_same<T, kv_rope_only>::value) {
        const size_t row = ((size_t)h * B + (uint32_t)p % B) * head_dim;
        T *K = (T *)kr.k + row, *V = (T *)kr.v + row;
        K[d0] = kv_cast<T>(k0);
        K[d1] = kv_cast<T>(k1);
        V[2 * j] = kv_cast<T>(vx[2 * j]);
        V[2 * j + 1] = kv_cast<T>(vx[2 * j + 1]);
    }
}

int cuda_rope_kv_write(struct cuda_ctx *c, const struct cuda_meta *m, uint32_t layer, float *q,
                       float *k, const float *v, uint32_t n_head, const struct be_rope *r,
                       char *stg)
{
    const struct kv_layout *l = &c->layout;
    if (m->n_tokens == 0)
        return 0;
    cuda_rope_ff ff;
    int rc = cuda_rope_ff_of(r, &ff);
    if (rc < 0)
        return rc;
    const kv_dst d = kv_dst_of(c, m, layer, stg);
    uint32_t items = n_head * (r->n_rot / 2) + l->n_kv_head * (l->head_dim / 2);
    dim3 grid((items + 127) / 128, m->n_tokens);
    const int q8 = kv_dtype_is_8bit(l->dtype);
    auto fn = q8                   ? rope_kv_write_kernel<kv_rope_only>
              : l->dtype == KV_F16 ? rope_kv_write_kernel<__half>
                                   : rope_kv_write_kernel<float>;
    CU_TRY(cuda_launch_pdl(c, fn, grid, dim3(128), 0, c->stream, d, l->block_size, l->n_kv_head,
                           l->head_dim, m->d_pos, m->d_slot, q, k, v, n_head, r->n_rot,
                           r->freq_base, r->freq_scale, r->neox, ff));
    /* a plain launch: it starts once the rope's grid is done, and the attention after it waits
     * for it in turn */
    return q8 ? kv_write8(c, m, d, k, v) : 0;
}
