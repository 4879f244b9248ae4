/* gguf_write.c - GGUF v3 header writer: metadata and tensor infos as little-endian bytes. */
#include "cli/rkv-mkmodel/gguf_write.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/strbuf.h"

struct gw {
    uint32_t alignment;
    struct strbuf kv;     /* metadata entries */
    struct strbuf tinfo;  /* tensor infos */
    struct strbuf header; /* assembled by gw_header */
    uint64_t n_kv;
    uint64_t n_tensors;
    uint64_t data_len; /* data section so far, padded */
};

static void put_u32(struct strbuf *b, uint32_t v)
{
    strbuf_add(b, &v, 4);
}

static void put_u64(struct strbuf *b, uint64_t v)
{
    strbuf_add(b, &v, 8);
}

static void put_str(struct strbuf *b, const char *s)
{
    size_t n = strlen(s);
    put_u64(b, n);
    strbuf_add(b, s, n);
}

int gw_create(struct gw **out, uint32_t alignment)
{
    struct gw *w = calloc(1, sizeof *w);
    if (!w)
        return RKV_ENOMEM;
    w->alignment = alignment;
    *out = w;
    return 0;
}

void gw_destroy(struct gw *w)
{
    if (!w)
        return;
    strbuf_fini(&w->kv);
    strbuf_fini(&w->tinfo);
    strbuf_fini(&w->header);
    free(w);
}

static void kv_head(struct gw *w, const char *key, uint32_t type)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, type);
    w->n_kv++;
}

void gw_kv_u32(struct gw *w, const char *key, uint32_t v)
{
    kv_head(w, key, GGUF_VAL_UINT32);
    put_u32(&w->kv, v);
}

void gw_kv_i32(struct gw *w, const char *key, int32_t v)
{
    kv_head(w, key, GGUF_VAL_INT32);
    strbuf_add(&w->kv, &v, 4);
}

void gw_kv_f32(struct gw *w, const char *key, float v)
{
    kv_head(w, key, GGUF_VAL_FLOAT32);
    strbuf_add(&w->kv, &v, 4);
}

void gw_kv_bool(struct gw *w, const char *key, int v)
{
    uint8_t b = v != 0;
    kv_head(w, key, GGUF_VAL_BOOL);
    strbuf_add(&w->kv, &b, 1);
}

void gw_kv_str(struct gw *w, const char *key, const char *s)
{
    kv_head(w, key, GGUF_VAL_STRING);
    put_str(&w->kv, s);
}

void gw_kv_arr_str(struct gw *w, const char *key, const char *const *s, uint64_t n)
{
    kv_head(w, key, GGUF_VAL_ARRAY);
    put_u32(&w->kv, GGUF_VAL_STRING);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++)
        put_str(&w->kv, s[i]);
}

void gw_kv_arr_i32(struct gw *w, const char *key, const int32_t *v, uint64_t n)
{
    kv_head(w, key, GGUF_VAL_ARRAY);
    put_u32(&w->kv, GGUF_VAL_INT32);
    put_u64(&w->kv, n);
    strbuf_add(&w->kv, v, n * 4);
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

uint64_t gw_tensor(struct gw *w, const char *name, uint32_t type, uint32_t n_dims,
                   const uint64_t *ne, uint64_t n_bytes)
{
    uint64_t off = w->data_len;
    put_str(&w->tinfo, name);
    put_u32(&w->tinfo, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        put_u64(&w->tinfo, ne[d]);
    put_u32(&w->tinfo, type);
    put_u64(&w->tinfo, off);
    w->n_tensors++;
    w->data_len = align_up(off + n_bytes, w->alignment);
    return off;
}

int gw_header(struct gw *w, const uint8_t **buf, size_t *len, uint64_t *data_bytes)
{
    struct strbuf *h = &w->header;
    strbuf_reset(h);
    strbuf_add(h, "GGUF", 4);
    put_u32(h, 3);
    put_u64(h, w->n_tensors);
    put_u64(h, w->n_kv);
    strbuf_append(h, &w->kv);
    strbuf_append(h, &w->tinfo);
    static const uint8_t zeros[64];
    while (!h->err && h->n % w->alignment) {
        size_t pad = w->alignment - h->n % w->alignment;
        strbuf_add(h, zeros, pad < sizeof zeros ? pad : sizeof zeros);
    }
    if (h->err)
        return h->err;
    *buf = (const uint8_t *)h->s;
    *len = h->n;
    *data_bytes = w->data_len;
    return 0;
}
