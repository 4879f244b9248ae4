/* rope.cu - rotary position embedding in place, normal (adjacent pairs) and neox (halves). */
#include "worker/cuda/cuda_ops.cuh"

// x (n_tokens, n_heads*head_dim); one thread per rotated pair
__global__ void rope_kernel(float *x, const int32_t *pos, uint32_t n_heads, uint32_t head_dim,
                            uint32_t n_rot, float base, float scale, int neox,
                            const cuda_rope_ff ff)
{
    uint32_t t = blockIdx.y;
    uint32_t half = n_rot / 2;
    uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; /* (head, pair) */
    if (k >= n_heads * half)
        return;
    uint32_t h = k / half, i = k % half;
    float sn, cs;
    cuda_rope_sincos(pos[t], i, n_rot, base, scale, ff, &sn, &cs);
    float *hx = x + ((size_t)t * n_heads + h) * head_dim;
    uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float a = hx[i0], b = hx[i1];
    hx[i0] = a * cs - b * sn;
    hx[i1] = a * sn + b * cs;
}

int cuda_rope(struct cuda_ctx *c, float *x, const int32_t *d_pos, uint32_t n_tokens,
              uint32_t n_heads, uint32_t head_dim, const struct be_rope *r)
{
    uint32_t pairs = n_heads * (r->n_rot / 2);
    if (n_tokens == 0 || pairs == 0)
        return 0;
    cuda_rope_ff ff;
    int rc = cuda_rope_ff_of(r, &ff);
    if (rc < 0)
        return rc;
    dim3 grid((pairs + 127) / 128, n_tokens);
    rope_kernel<<<grid, 128, 0, c->stream>>>(x, d_pos, n_heads, head_dim, r->n_rot, r->freq_base,
                                             r->freq_scale, r->neox, ff);
    CU_LAUNCHED();
    return 0;
}

int cuda_rope_ff_of(const struct be_rope *r, struct cuda_rope_ff *ff)
{
    ff->on = r->freq_factors != NULL;
    ff->mscale = r->mscale > 0.0f ? r->mscale : 1.0f;
    if (!ff->on)
        return 0;
    if (r->n_rot / 2 > CUDA_ROPE_FF_MAX)
        return RKV_EUNSUPPORTED;
    for (uint32_t i = 0; i < r->n_rot / 2; i++)
        ff->f[i] = r->freq_factors[i];
    return 0;
}
