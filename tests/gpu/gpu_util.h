/* gpu_util.h - what the gpu test and benchmark programs share: random data, type packing,
 * comparisons. */
#ifndef RKV_GPU_UTIL_H
#define RKV_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"

struct gu_rng {
    uint64_t s;
};
void gu_seed(struct gu_rng *r, uint64_t seed);
/* uniform in [-1, 1) */
float gu_uniform(struct gu_rng *r);
uint32_t gu_below(struct gu_rng *r, uint32_t n);
void gu_fill(struct gu_rng *r, float *x, size_t n, float scale);

/* packs n f32 values (rows of cols) into type t; returns a malloc'd buffer of
 * be_type_size(t, cols) * rows bytes */
void *gu_pack(enum be_type t, const float *x, uint32_t rows, uint32_t cols);
/* the values the packed buffer holds, back in f32 */
void gu_unpack(enum be_type t, const void *src, float *dst, uint32_t rows, uint32_t cols);

/* counts elements where |got - ref| > atol + rtol*|ref| (nan counts), prints
 * the first few with their index; returns the count */
size_t gu_compare(const char *what, const float *ref, const float *got, size_t n, float atol,
                  float rtol);
/* sum (a-b)^2 / sum b^2 */
double gu_nmse(const float *got, const float *ref, size_t n);
double gu_rms(const float *x, size_t n);
double gu_now(void);

/* a tensor on the backend filled with host data (f32 values packed to t) */
struct be_tensor *gu_tensor(struct backend *be, enum be_type t, uint32_t rows, uint32_t cols,
                            const float *x);
/* reads an f32 tensor's first n floats */
int gu_read(struct backend *be, const struct be_tensor *t, float *dst, size_t n);

#endif
