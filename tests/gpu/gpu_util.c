/* gpu_util.c - random data, type packing and tolerance comparisons for the gpu programs. */
#include "tests/gpu/gpu_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/quant.h"
#include "worker/cpu/cpu_ops.h"

void gu_seed(struct gu_rng *r, uint64_t seed)
{
    r->s = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
}

static uint64_t next(struct gu_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

float gu_uniform(struct gu_rng *r)
{
    return (float)(next(r) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

uint32_t gu_below(struct gu_rng *r, uint32_t n)
{
    return (uint32_t)((next(r) >> 32) % n);
}

void gu_fill(struct gu_rng *r, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = gu_uniform(r) * scale;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

void *gu_pack(enum be_type t, const float *x, uint32_t rows, uint32_t cols)
{
    size_t rb = be_type_size(t, cols);
    uint8_t *out = malloc(rb * rows);
    if (!out)
        return NULL;
    for (uint32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        uint8_t *o = out + (size_t)r * rb;
        switch (t) {
        case BE_F32: memcpy(o, xr, 4 * (size_t)cols); break;
        case BE_F16:
            for (uint32_t i = 0; i < cols; i++) {
                uint16_t h = cpu_f32_to_f16(xr[i]);
                memcpy(o + 2 * i, &h, 2);
            }
            break;
        case BE_BF16:
            for (uint32_t i = 0; i < cols; i++) {
                uint16_t h = f32_to_bf16(xr[i]);
                memcpy(o + 2 * i, &h, 2);
            }
            break;
        case BE_Q8_0:
            for (uint32_t b = 0; b < cols / 32; b++) {
                float amax = 0.0f;
                for (int i = 0; i < 32; i++)
                    amax = fmaxf(amax, fabsf(xr[b * 32 + i]));
                float d = amax / 127.0f;
                uint16_t dh = cpu_f32_to_f16(d);
                uint8_t *blk = o + (size_t)b * 34;
                memcpy(blk, &dh, 2);
                for (int i = 0; i < 32; i++)
                    blk[2 + i] = (uint8_t)(int8_t)(d > 0 ? lrintf(xr[b * 32 + i] / d) : 0);
            }
            break;
        default: quant_quantize_row((uint32_t)t, xr, o, cols); break;
        }
    }
    return out;
}

void gu_unpack(enum be_type t, const void *src, float *dst, uint32_t rows, uint32_t cols)
{
    size_t rb = be_type_size(t, cols);
    for (uint32_t r = 0; r < rows; r++)
        cpu_dequant_row(t, (const uint8_t *)src + r * rb, dst + (size_t)r * cols, cols);
}

size_t gu_compare(const char *what, const float *ref, const float *got, size_t n, float atol,
                  float rtol)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - ref[i]);
        int same_inf = isinf(ref[i]) && got[i] == ref[i];
        if (same_inf)
            continue;
        if (!(d <= atol + rtol * fabsf(ref[i]))) {
            if (bad < 5)
                printf("    %s: mismatch at %zu: ref %.7g got %.7g (|d| %.3g > %.3g)\n", what, i,
                       ref[i], got[i], d, atol + rtol * fabsf(ref[i]));
            bad++;
        }
    }
    if (bad)
        printf("    %s: %zu of %zu elements differ\n", what, bad, n);
    return bad;
}

double gu_nmse(const float *got, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

double gu_rms(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0.0;
}

double gu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct be_tensor *gu_tensor(struct backend *be, enum be_type t, uint32_t rows, uint32_t cols,
                            const float *x)
{
    struct be_tensor *bt = NULL;
    if (backend_tensor_alloc(be, t, rows, cols, &bt) < 0)
        return NULL;
    if (x) {
        void *p = gu_pack(t, x, rows, cols);
        int rc = p ? backend_tensor_set(be, bt, p, 0, be_type_size(t, cols) * rows) : -1;
        free(p);
        if (rc < 0) {
            backend_tensor_free(be, bt);
            return NULL;
        }
    }
    return bt;
}

int gu_read(struct backend *be, const struct be_tensor *t, float *dst, size_t n)
{
    int rc = backend_sync(be);
    return rc < 0 ? rc : backend_tensor_get(be, t, dst, 0, n * sizeof(float));
}
