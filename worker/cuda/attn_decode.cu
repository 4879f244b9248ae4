/* attn_decode.cu - paged decode attention: one token per sequence, the kv head's query group per
 * thread block. */
#include "worker/cuda/attn_kernel.cuh"

int cuda_attn_decode_launch(struct cuda_ctx *c, const struct cuda_attn_args *a, uint32_t n_split,
                            uint32_t units_per_split, float *part, uint32_t *cnt)
{
    struct attn_kargs k = attn_kargs_of(c, a, units_per_split, part, cnt);
    /* up to 16 query rows (the gqa group of one token) per kv head */
    return attn_launch<16, 16>(c, a, k, n_split);
}

int cuda_attn_decode_slots(struct cuda_ctx *c, uint32_t qt, uint32_t g, uint32_t base)
{
    const uint32_t D = c->layout.head_dim;
    if (!attn_takes_dec(c, qt, g, D))
        return 0;
    const int st = cuda_dec_stages(c, base);
    int per_sm = D == 128  ? attn_dec_per_sm<16>(st)
                 : D == 64 ? attn_dec_per_sm<8>(st)
                 : D == 32 ? attn_dec_per_sm<4>(st)
                           : attn_dec_per_sm<2>(st);
    return per_sm * c->n_sm;
}
