/* weights.h - seeded random tensor values as F32/F16/BF16 or quantized bytes, any slice on its own. */
#ifndef RKV_MKMODEL_WEIGHTS_H
#define RKV_MKMODEL_WEIGHTS_H

#include <stdint.h>

/* element e of a tensor is center + half * (2u - 1), u uniform in [0, 1)
 * from a counter-based stream keyed by key: any slice can be made alone,
 * so threads split a tensor without changing a byte */
struct wt_dist {
    uint64_t key;
    float center;
    float half;
};

uint64_t wt_splitmix64(uint64_t x);
/* key for tensor name under a run's seed */
uint64_t wt_tensor_key(uint64_t seed, const char *name);

/* elements [first, first + n) as ggml type (F32, F16, BF16 or a block format of
 * common/quant.h) into out; for a block format first and n are whole blocks */
void wt_fill(const struct wt_dist *d, uint32_t type, uint64_t first, uint64_t n, void *out);

uint16_t wt_f32_to_f16(float f);
uint16_t wt_f32_to_bf16(float f);

#endif
