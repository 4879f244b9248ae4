/* attn_prefill.cu - tiled causal prefill attention: tiles of tokens x query group share each key
 * chunk. */
#include "worker/cuda/attn_kernel.cuh"

int cuda_attn_prefill_launch(struct cuda_ctx *c, const struct cuda_attn_args *a, uint32_t n_split,
                             uint32_t units_per_split, float *part, uint32_t *cnt)
{
    struct attn_kargs k = attn_kargs_of(c, a, units_per_split, part, cnt);
    /* 64 query rows (tokens x group) per tile */
    return attn_launch<64, 64>(c, a, k, n_split);
}
