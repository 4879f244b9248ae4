/* fuzz_gguf.c - any bytes are opened or refused by the GGUF reader; getters stay in bounds. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/quant.h"

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n)
{
    if (n) /* first and last byte: ASan flags anything outside the input */
        sink += ((const uint8_t *)p)[0] + ((const uint8_t *)p)[n - 1];
}

static void array_elems(const struct gguf_ctx *g, const char *key, uint64_t n)
{
    /* the first few, the last, and one past the end */
    uint64_t idx[6] = {0, 1, 2, n ? n - 1 : 0, n, UINT64_MAX};
    for (int k = 0; k < 6; k++) {
        struct gguf_str s;
        float f;
        int64_t i;
        if (gguf_get_arr_str(g, key, idx[k], &s) == 0)
            touch(s.ptr, s.len);
        if (gguf_get_arr_f32(g, key, idx[k], &f) == 0)
            sink += (uint64_t)(f == f);
        if (gguf_get_arr_i64(g, key, idx[k], &i) == 0)
            sink += (uint64_t)i;
        if (idx[k] >= n && gguf_get_arr_str(g, key, idx[k], &s) == 0)
            abort(); /* past the end must be refused */
    }
}

static void kv_all(const struct gguf_ctx *g)
{
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k = gguf_key_name(g, i);
        touch(k.ptr, k.len);
        char *key = malloc(k.len + 1);
        if (!key)
            return;
        memcpy(key, k.ptr, k.len);
        key[k.len] = 0;
        /* keys with a NUL inside are found by their prefix, if at all */
        int64_t found = gguf_find_key(g, key);
        if (strlen(key) == k.len && found != (int64_t)i)
            abort();
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f;
        int b;
        struct gguf_str s;
        enum gguf_value_type et;
        uint64_t n;
        sink += (uint64_t)gguf_kv_type(g, i);
        sink += (uint64_t)gguf_get_u32(g, key, &u32) + (uint64_t)gguf_get_u64(g, key, &u64) +
                (uint64_t)gguf_get_i64(g, key, &i64) + (uint64_t)gguf_get_f32(g, key, &f) +
                (uint64_t)gguf_get_bool(g, key, &b);
        double d;
        if (gguf_get_f64(g, key, &d) == 0)
            sink += (uint64_t)(d == d);
        if (gguf_get_str(g, key, &s) == 0)
            touch(s.ptr, s.len);
        if (gguf_get_arr_info(g, key, &et, &n) == 0)
            array_elems(g, key, n);
        free(key);
    }
    if (gguf_key_name(g, gguf_n_kv(g)).ptr != NULL)
        abort();
}

/* a tensor of a type rkv reads dequantizes row by row inside its extent, whatever its
 * scales hold (NaN and infinities included) */
static void dequant_all(const struct gguf_tensor *t)
{
    uint64_t n = t->ne[0];
    size_t rb = quant_row_bytes(t->type, n);
    if (!rb || !n || n > t->n_elements || t->n_elements > (1u << 20))
        return;
    if (rb * (t->n_elements / n) != t->n_bytes)
        abort(); /* the reader's size and the formats' agree */
    float *row = malloc(n * sizeof *row);
    if (!row)
        return;
    size_t bad;
    for (uint64_t r = 0; r < t->n_elements / n; r++) {
        const uint8_t *src = (const uint8_t *)t->data + r * rb;
        if (quant_dequantize_row(t->type, src, row, n) != 0)
            abort();
        sink += (uint64_t)quant_row_bad_scale(t->type, src, n, &bad) + (row[n - 1] == row[0]);
    }
    free(row);
}

static void tensors_all(const struct gguf_ctx *g)
{
    uint64_t size = gguf_file_size(g);
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        if (!t || t->n_dims > GGUF_MAX_DIMS)
            abort();
        if (gguf_find_tensor(g, t->name) != t)
            abort(); /* names are unique and contain no NUL */
        if (t->offset % gguf_alignment(g))
            abort();
        if (t->offset > size || t->n_bytes > size - t->offset)
            abort();
        touch(t->data, t->n_bytes);
        sink += strlen(gguf_type_name(t->type)) + gguf_type_size(t->type, t->n_elements);
        dequant_all(t);
    }
    if (gguf_tensor_at(g, gguf_n_tensors(g)) != NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_ctx *g;
    char err[256];
    int rc = gguf_open_mem(data, size, &g, err, sizeof err);
    if (rc) {
        if (rc != RKV_EFORMAT && rc != RKV_ENOMEM)
            abort(); /* a buffer can only be malformed */
        if (rc == RKV_EFORMAT && strncmp(err, "(memory): ", 10) != 0)
            abort(); /* every refusal explains itself */
        return 0;
    }
    if (gguf_version(g) != 2 && gguf_version(g) != 3)
        abort();
    kv_all(g);
    tensors_all(g);
    gguf_close(g);
    return 0;
}
