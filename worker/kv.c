/* kv.c - paged KV geometry and a small local block allocator over plain memory. */
#include "worker/kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/quant.h"

static const char *const dtype_names[KV_N_DTYPES] = {"f32", "f16", "q8", "fp8"};

int kv_layout_init(struct kv_layout *l, uint32_t block_size, uint32_t n_layer, uint32_t n_kv_head,
                   uint32_t head_dim, enum kv_dtype dtype)
{
    if (block_size == 0 || block_size > 65536 || n_layer == 0 || n_kv_head == 0 || head_dim == 0 ||
        (unsigned)dtype >= KV_N_DTYPES || (kv_dtype_is_8bit(dtype) && head_dim % 8))
        return RKV_EINVAL;
    l->block_size = block_size;
    l->n_layer = n_layer;
    l->n_kv_head = n_kv_head;
    l->head_dim = head_dim;
    l->dtype = dtype;
    l->n_parts = 1;
    l->part_layers = n_layer;
    l->n_swa = 0;
    l->swa_period = 0;
    return 0;
}

int kv_layout_set_window(struct kv_layout *l, uint32_t n_swa, uint32_t swa_period)
{
    if (n_swa && swa_period == 0)
        return RKV_EINVAL;
    uint32_t n_global = n_swa ? l->n_layer / swa_period : l->n_layer,
             n_local = l->n_layer - n_global;
    l->n_parts = 1;
    l->part_layers = l->n_layer;
    l->n_swa = 0;
    l->swa_period = 0;
    if (n_global == 0 || n_local == 0)
        return 0; /* nothing to drop apart from the rest */
    /* blocks as large as the global layers: a position block that left the window keeps one */
    l->part_layers = n_global;
    l->n_parts = 1 + (n_local + n_global - 1) / n_global;
    l->n_swa = n_swa;
    l->swa_period = swa_period;
    return 0;
}

int kv_layer_local(const struct kv_layout *l, uint32_t layer)
{
    return l->n_parts > 1 && layer % l->swa_period != l->swa_period - 1;
}

uint32_t kv_layer_part(const struct kv_layout *l, uint32_t layer)
{
    if (!kv_layer_local(l, layer))
        return 0;
    return 1 + (layer - layer / l->swa_period) / l->part_layers;
}

/* the layer's slot inside the block of its part */
static uint32_t layer_slot(const struct kv_layout *l, uint32_t layer)
{
    if (l->n_parts == 1)
        return layer;
    if (!kv_layer_local(l, layer))
        return layer / l->swa_period;
    return (layer - layer / l->swa_period) % l->part_layers;
}

uint32_t kv_window_first(const struct kv_layout *l, uint64_t n_past)
{
    if (l->n_parts == 1)
        return 0;
    uint64_t lo = n_past + 1 > l->n_swa ? n_past + 1 - l->n_swa : 0;
    return (uint32_t)(lo / l->block_size);
}

uint64_t kv_live_blocks(const struct kv_layout *l, uint64_t n_pos)
{
    uint64_t n = (n_pos + l->block_size - 1) / l->block_size, first = kv_window_first(l, n_pos);
    return n + (n > first ? n - first : 0) * (l->n_parts - 1);
}

uint64_t kv_live_bytes(const struct kv_layout *l, uint64_t n_pos)
{
    return kv_live_blocks(l, n_pos) * kv_block_bytes(l);
}

uint64_t kv_all_global_bytes(const struct kv_layout *l, uint64_t n_pos)
{
    uint64_t n = (n_pos + l->block_size - 1) / l->block_size;
    return n * 2 * l->n_layer * kv_slice_bytes(l);
}

int kv_window_live(const struct kv_layout *l, const struct kv_block_ref *blocks, uint32_t n_refs,
                   uint64_t n_pos)
{
    const uint64_t n = (n_pos + l->block_size - 1) / l->block_size;
    if (n * l->n_parts > n_refs)
        return 0;
    for (uint64_t j = 0; j < n; j++)
        for (uint32_t p = 0; p < l->n_parts; p++)
            if (blocks[j * l->n_parts + p].index == KV_REF_NONE &&
                (p == 0 || j >= kv_window_first(l, n_pos)))
                return 0;
    return 1;
}

uint32_t kv_layer_view(const struct kv_layout *l, const struct kv_block_ref *in, uint32_t n_refs,
                       uint32_t layer, struct kv_block_ref *out)
{
    const uint32_t n = n_refs / l->n_parts, part = kv_layer_part(l, layer);
    for (uint32_t j = 0; j < n; j++)
        out[j] = in[(size_t)j * l->n_parts + part];
    return n;
}

size_t kv_dtype_size(enum kv_dtype t)
{
    return t == KV_F32 ? 4 : t == KV_F16 ? 2 : 1;
}

const char *kv_dtype_name(enum kv_dtype t)
{
    return (unsigned)t < KV_N_DTYPES ? dtype_names[t] : "?";
}

int kv_dtype_parse(const char *name, enum kv_dtype *out)
{
    for (int t = 0; t < KV_N_DTYPES; t++)
        if (name && strcmp(name, dtype_names[t]) == 0) {
            *out = (enum kv_dtype)t;
            return 0;
        }
    return RKV_EINVAL;
}

int kv_dtype_is_8bit(enum kv_dtype t)
{
    return t == KV_Q8 || t == KV_FP8;
}

uint32_t kv_row_scales(const struct kv_layout *l)
{
    if (l->dtype == KV_Q8)
        return (l->head_dim + KV_Q8_GROUP - 1) / KV_Q8_GROUP;
    return l->dtype == KV_FP8 ? 1 : 0;
}

/* bytes of one row's scales */
static size_t row_scale_bytes(const struct kv_layout *l)
{
    return kv_row_scales(l) * (l->dtype == KV_Q8 ? sizeof(uint16_t) : sizeof(float));
}

size_t kv_row_bytes(const struct kv_layout *l)
{
    return (size_t)l->head_dim * kv_dtype_size(l->dtype) + row_scale_bytes(l);
}

size_t kv_token_bytes(const struct kv_layout *l)
{
    return 2 * (size_t)l->n_layer * l->n_kv_head * kv_row_bytes(l);
}

size_t kv_slice_bytes(const struct kv_layout *l)
{
    return (size_t)l->n_kv_head * l->block_size * kv_row_bytes(l);
}

void *kv_row_ptr(const struct kv_layout *l, void *slice, uint32_t head, uint32_t pos)
{
    return (char *)slice + ((size_t)head * l->block_size + pos) * kv_row_bytes(l);
}

void *kv_row_scale_ptr(const struct kv_layout *l, void *slice, uint32_t head, uint32_t pos)
{
    return (char *)kv_row_ptr(l, slice, head, pos) + l->head_dim;
}

float kv_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t kv_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0; /* nan */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float kv_e4m3_to_f32(uint8_t v)
{
    const int e = (v >> 3) & 15, m = v & 7;
    float a = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    if ((v & 0x7f) == 0x7f)
        a = NAN;
    return v & 0x80 ? -a : a;
}

uint8_t kv_f32_to_e4m3(float x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (isnan(a))
        return 0x7f;
    if (a >= 448.0f)
        return sign | 0x7e; /* saturate at the largest finite value */
    if (a < 0x1p-6f)        /* subnormal: steps of 2^-9; 8 steps is 2^-6, code 0x08 */
        return sign | (uint8_t)rintf(a * 512.0f);
    int e;
    frexpf(a, &e);                        /* a = f * 2^e, f in [0.5, 1): its exponent is e - 1 */
    int q = (int)rintf(ldexpf(a, 4 - e)); /* 8..16: the implicit bit and 3 mantissa bits */
    if (q == 16) {
        q = 8;
        e++;
    }
    const int code = ((e - 1 + 7) << 3) | (q - 8);
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

void kv_q8_quantize(const float *x, uint32_t n, int8_t *q, uint16_t *d)
{
    for (uint32_t g0 = 0; g0 < n; g0 += KV_Q8_GROUP) {
        const uint32_t g1 = g0 + KV_Q8_GROUP < n ? g0 + KV_Q8_GROUP : n;
        float amax = 0.0f;
        for (uint32_t i = g0; i < g1; i++)
            amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        const uint16_t db = kv_f32_to_bf16(amax / 127.0f);
        const float df = kv_bf16_to_f32(db);
        d[g0 / KV_Q8_GROUP] = db;
        for (uint32_t i = g0; i < g1; i++) {
            float r = df == 0.0f ? 0.0f : rintf(x[i] / df);
            if (r != r)
                r = 0.0f; /* a NaN is stored as 0 (amax passed over it) */
            q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
        }
    }
}

void kv_fp8_quantize(const float *x, uint32_t n, uint8_t *q, float *s)
{
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    *s = amax / 448.0f;
    /* a NaN is stored as 0 (amax passed over it), so the NaN codes are never written */
    for (uint32_t i = 0; i < n; i++) {
        const float v = *s == 0.0f ? 0.0f : x[i] / *s;
        q[i] = v != v ? 0 : kv_f32_to_e4m3(v);
    }
}

void kv_row_store(const struct kv_layout *l, void *slice, uint32_t head, uint32_t pos,
                  const float *src)
{
    void *row = kv_row_ptr(l, slice, head, pos);
    const uint32_t hd = l->head_dim;
    switch (l->dtype) {
    case KV_F32: memcpy(row, src, sizeof(float) * hd); break;
    case KV_F16:
        for (uint32_t i = 0; i < hd; i++)
            ((uint16_t *)row)[i] = quant_f32_to_f16(src[i]);
        break;
    case KV_Q8: kv_q8_quantize(src, hd, row, kv_row_scale_ptr(l, slice, head, pos)); break;
    case KV_FP8: kv_fp8_quantize(src, hd, row, kv_row_scale_ptr(l, slice, head, pos)); break;
    }
}

void kv_row_load(const struct kv_layout *l, const void *slice, uint32_t head, uint32_t pos,
                 float *dst)
{
    const void *row = kv_row_ptr(l, (void *)slice, head, pos);
    const void *sc = kv_row_scale_ptr(l, (void *)slice, head, pos);
    const uint32_t hd = l->head_dim;
    for (uint32_t i = 0; i < hd; i++) {
        switch (l->dtype) {
        case KV_F32: dst[i] = ((const float *)row)[i]; break;
        case KV_F16: dst[i] = quant_f16_to_f32(((const uint16_t *)row)[i]); break;
        case KV_Q8:
            dst[i] = (float)((const int8_t *)row)[i] *
                     kv_bf16_to_f32(((const uint16_t *)sc)[i / KV_Q8_GROUP]);
            break;
        case KV_FP8: dst[i] = kv_e4m3_to_f32(((const uint8_t *)row)[i]) * *(const float *)sc; break;
        }
    }
}

size_t kv_block_bytes(const struct kv_layout *l)
{
    return 2 * (size_t)l->part_layers * kv_slice_bytes(l);
}

size_t kv_slice_offset(const struct kv_layout *l, uint32_t layer, int is_v)
{
    return (2 * (size_t)layer_slot(l, layer) + (is_v ? 1 : 0)) * kv_slice_bytes(l);
}

uint32_t kv_blocks_for(const struct kv_layout *l, uint32_t n_pos)
{
    return (n_pos + l->block_size - 1) / l->block_size;
}

void *kv_slice_ptr(const struct kv_layout *l, const struct kv_pools *p, struct kv_block_ref ref,
                   uint32_t layer, int is_v)
{
    if (ref.index == KV_REF_NONE || ref.residency >= KV_N_POOLS ||
        ref.index >= p->n_blocks[ref.residency] || layer >= l->n_layer || !p->base[ref.residency])
        return NULL;
    return (char *)p->base[ref.residency] + (size_t)ref.index * kv_block_bytes(l) +
           kv_slice_offset(l, layer, is_v);
}

struct kv_local {
    struct kv_layout layout;
    struct kv_pools pools;
    struct kv_mem mem;               /* alloc == NULL: plain memory */
    uint32_t *free_list[KV_N_POOLS]; /* stack of free indexes */
    uint32_t n_free[KV_N_POOLS];
};

int kv_local_create(struct kv_local **out, const struct kv_layout *l, uint32_t n_device,
                    uint32_t n_host)
{
    return kv_local_init_mem(out, l, n_device, n_host, NULL);
}

int kv_local_init_mem(struct kv_local **out, const struct kv_layout *l, uint32_t n_device,
                      uint32_t n_host, const struct kv_mem *mem)
{
    struct kv_local *k = calloc(1, sizeof(*k));
    if (!k)
        return RKV_ENOMEM;
    k->layout = *l;
    if (mem)
        k->mem = *mem;
    uint32_t n[KV_N_POOLS] = {n_device, n_host};
    for (int r = 0; r < KV_N_POOLS; r++) {
        size_t bytes = (size_t)n[r] * kv_block_bytes(l);
        int rc = 0;
        k->free_list[r] = malloc(sizeof(uint32_t) * (n[r] ? n[r] : 1));
        if (bytes && k->mem.alloc) {
            rc = k->mem.alloc(k->mem.u, (enum kv_residency)r, bytes, &k->pools.base[r]);
        } else if (bytes) {
            /* 64-byte alignment keeps every slice on a cache line for the cpu loops */
            k->pools.base[r] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
            if (k->pools.base[r])
                memset(k->pools.base[r], 0, bytes);
        }
        if (rc == 0 && ((bytes && !k->pools.base[r]) || !k->free_list[r]))
            rc = RKV_ENOMEM;
        if (rc < 0) {
            kv_local_destroy(k);
            return rc;
        }
        k->pools.n_blocks[r] = n[r];
        /* hand blocks out in index order from the top of the stack */
        for (uint32_t i = 0; i < n[r]; i++)
            k->free_list[r][i] = n[r] - 1 - i;
        k->n_free[r] = n[r];
    }
    *out = k;
    return 0;
}

void kv_local_destroy(struct kv_local *k)
{
    if (!k)
        return;
    for (int r = 0; r < KV_N_POOLS; r++) {
        if (k->mem.alloc && k->pools.base[r])
            k->mem.free(k->mem.u, (enum kv_residency)r, k->pools.base[r]);
        else
            free(k->pools.base[r]);
        free(k->free_list[r]);
    }
    free(k);
}

const struct kv_pools *kv_local_pools(const struct kv_local *k)
{
    return &k->pools;
}

int kv_local_alloc(struct kv_local *k, enum kv_residency r, struct kv_block_ref *out)
{
    if ((unsigned)r >= KV_N_POOLS)
        return RKV_EINVAL;
    if (k->n_free[r] == 0)
        return RKV_ENOSPACE;
    out->index = k->free_list[r][--k->n_free[r]];
    out->residency = (uint8_t)r;
    return 0;
}

uint32_t kv_local_used(const struct kv_local *k, enum kv_residency r)
{
    return (unsigned)r < KV_N_POOLS ? k->pools.n_blocks[r] - k->n_free[r] : 0;
}

void kv_local_release(struct kv_local *k, struct kv_block_ref ref)
{
    if (ref.residency >= KV_N_POOLS || ref.index >= k->pools.n_blocks[ref.residency])
        return;
    k->free_list[ref.residency][k->n_free[ref.residency]++] = ref.index;
}

int kv_local_migrate(struct kv_local *k, struct kv_block_ref *ref, enum kv_residency to)
{
    if (ref->residency == to || ref->index == KV_REF_NONE)
        return 0;
    struct kv_block_ref dst;
    int rc = kv_local_alloc(k, to, &dst);
    if (rc < 0)
        return rc;
    size_t bb = kv_block_bytes(&k->layout);
    void *to_p = (char *)k->pools.base[dst.residency] + (size_t)dst.index * bb;
    const void *from_p = (char *)k->pools.base[ref->residency] + (size_t)ref->index * bb;
    if (k->mem.copy) {
        rc = k->mem.copy(k->mem.u, to_p, from_p, bb);
        if (rc < 0) {
            kv_local_release(k, dst);
            return rc;
        }
    } else {
        memcpy(to_p, from_p, bb);
    }
    kv_local_release(k, *ref);
    *ref = dst;
    return 0;
}

uint32_t kv_stage_passes(const uint32_t *slots, uint32_t n_seqs, uint64_t cap, uint32_t *pass_of,
                         uint32_t *first, uint32_t *count, uint32_t max_pass)
{
    for (uint32_t s = 0; s < n_seqs; s++)
        if (slots[s] > cap)
            return 0;
    uint32_t n = 0, slot = 0;
    uint64_t cur = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        if (n == 0 || cur + slots[s] > cap) {
            if (n < max_pass) {
                first[n] = slot;
                count[n] = 0;
            }
            n++;
            cur = 0;
        }
        cur += slots[s];
        slot += slots[s];
        if (pass_of)
            pass_of[s] = n - 1;
        if (n - 1 < max_pass)
            count[n - 1] += slots[s];
    }
    return n;
}
