/* gguf_test.c - the GGUF reader on images built here: every getter, truncation, hostile fields. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/gguf.h"

/* --- a tiny test-only GGUF builder ------------------------------------------- */

struct tb {
    uint8_t *p;
    size_t len, cap;
};

static void tb_put(struct tb *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void tb_u8(struct tb *b, uint8_t v)
{
    tb_put(b, &v, 1);
}

static void tb_u32(struct tb *b, uint32_t v)
{
    tb_put(b, &v, 4);
}

static void tb_u64(struct tb *b, uint64_t v)
{
    tb_put(b, &v, 8);
}

static void tb_str(struct tb *b, const char *s)
{
    tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
}

/* key + value type */
static void tb_key(struct tb *b, const char *key, uint32_t type)
{
    tb_str(b, key);
    tb_u32(b, type);
}

static void tb_pad(struct tb *b, size_t align)
{
    while (b->len % align)
        tb_u8(b, 0);
}

static void patch_u32(struct tb *b, size_t at, uint32_t v)
{
    memcpy(b->p + at, &v, 4);
}

static void patch_u64(struct tb *b, size_t at, uint64_t v)
{
    memcpy(b->p + at, &v, 8);
}

/* where the fields that the hostile tests corrupt sit in the valid image */
struct layout {
    size_t n_tensors, n_kv;
    size_t key0_len;   /* length field of key 0's name */
    size_t str_len;    /* length field of k.str's value */
    size_t astr_n;     /* element count of k.astr */
    size_t nest_type;  /* element type of k.nest */
    size_t align_val;  /* value of general.align */
    size_t align_type; /* value type of general.alignment */
    size_t key_i8;     /* name bytes of "k.i8" */
    size_t ta_ndims;   /* tensor ta: n_dims, ne[0], ne[1], type, offset */
    size_t ta_ne0, ta_ne1, ta_type, ta_off;
    size_t tb_name; /* name bytes of tensor "tb" */
    size_t tb_ne0;
    size_t td_ne0;
    size_t data; /* data section start */
};

#define N_KV      18
#define N_TENSORS 4
#define ALIGN     64

static const float ta_vals[16] = {0,  0.5f, 1,  1.5f, 2, 2.5f, 3,  3.5f,
                                  -1, -2,   -3, -4,   8, 16,   32, 64};

static void tensor_info(struct tb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                        uint32_t type, uint64_t off)
{
    tb_str(b, name);
    tb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        tb_u64(b, ne[d]);
    tb_u32(b, type);
    tb_u64(b, off);
}

/* a valid v3 image: every value type, arrays (nested too), and tensors of
 * types F32, Q8_0, an id ggml does not know, and BF16 (the last one ends
 * exactly at the end of the file) */
static void build_valid(struct tb *b, struct layout *L)
{
    memset(b, 0, sizeof *b);
    tb_put(b, "GGUF", 4);
    tb_u32(b, 3);
    L->n_tensors = b->len;
    tb_u64(b, N_TENSORS);
    L->n_kv = b->len;
    tb_u64(b, N_KV);

    L->key0_len = b->len;
    tb_key(b, "general.architecture", GGUF_VAL_STRING);
    tb_str(b, "llama");
    tb_key(b, "general.alignment", GGUF_VAL_UINT32);
    L->align_type = b->len - 4;
    L->align_val = b->len;
    tb_u32(b, ALIGN);
    tb_key(b, "k.u8", GGUF_VAL_UINT8);
    tb_u8(b, 200);
    L->key_i8 = b->len + 8;
    tb_key(b, "k.i8", GGUF_VAL_INT8);
    tb_u8(b, (uint8_t)-5);
    tb_key(b, "k.u16", GGUF_VAL_UINT16);
    uint16_t u16 = 60000;
    tb_put(b, &u16, 2);
    tb_key(b, "k.i16", GGUF_VAL_INT16);
    int16_t i16 = -300;
    tb_put(b, &i16, 2);
    tb_key(b, "k.u32", GGUF_VAL_UINT32);
    tb_u32(b, 4000000000u);
    tb_key(b, "k.i32", GGUF_VAL_INT32);
    tb_u32(b, (uint32_t)-70000);
    tb_key(b, "k.f32", GGUF_VAL_FLOAT32);
    float f32 = 0.5f;
    tb_put(b, &f32, 4);
    tb_key(b, "k.bool", GGUF_VAL_BOOL);
    tb_u8(b, 1);
    tb_key(b, "k.u64", GGUF_VAL_UINT64);
    tb_u64(b, UINT64_MAX);
    tb_key(b, "k.i64", GGUF_VAL_INT64);
    tb_u64(b, (uint64_t)INT64_C(-9000000000000000000));
    tb_key(b, "k.f64", GGUF_VAL_FLOAT64);
    double f64 = -2.25;
    tb_put(b, &f64, 8);
    tb_key(b, "k.str", GGUF_VAL_STRING);
    L->str_len = b->len;
    tb_str(b, "h\xc3\xa9llo");
    tb_key(b, "k.astr", GGUF_VAL_ARRAY);
    tb_u32(b, GGUF_VAL_STRING);
    L->astr_n = b->len;
    tb_u64(b, 3);
    tb_str(b, "a");
    tb_str(b, "");
    tb_str(b, "xyz");
    tb_key(b, "k.ai32", GGUF_VAL_ARRAY);
    tb_u32(b, GGUF_VAL_INT32);
    tb_u64(b, 3);
    tb_u32(b, 1);
    tb_u32(b, (uint32_t)-2);
    tb_u32(b, 3);
    tb_key(b, "k.af32", GGUF_VAL_ARRAY);
    tb_u32(b, GGUF_VAL_FLOAT32);
    tb_u64(b, 2);
    float af[2] = {1.5f, -0.25f};
    tb_put(b, af, 8);
    tb_key(b, "k.nest", GGUF_VAL_ARRAY); /* [[1, 2], [3]] */
    tb_u32(b, GGUF_VAL_ARRAY);
    tb_u64(b, 2);
    L->nest_type = b->len;
    tb_u32(b, GGUF_VAL_UINT8);
    tb_u64(b, 2);
    tb_u8(b, 1);
    tb_u8(b, 2);
    tb_u32(b, GGUF_VAL_UINT8);
    tb_u64(b, 1);
    tb_u8(b, 3);

    uint64_t ne_a[2] = {8, 2}, ne_b[2] = {32, 2}, ne_c[1] = {5}, ne_d[1] = {4};
    tensor_info(b, "ta", 2, ne_a, GGUF_TYPE_F32, 0);
    L->ta_ndims = b->len - 8 - 4 - 16 - 4;
    L->ta_ne0 = L->ta_ndims + 4;
    L->ta_ne1 = L->ta_ne0 + 8;
    L->ta_type = L->ta_ne1 + 8;
    L->ta_off = L->ta_type + 4;
    L->tb_name = b->len + 8;
    tensor_info(b, "tb", 2, ne_b, GGUF_TYPE_Q8_0, 64);
    L->tb_ne0 = L->tb_name + 2 + 4;
    tensor_info(b, "tc", 1, ne_c, 99, 192);
    tensor_info(b, "td", 1, ne_d, GGUF_TYPE_BF16, 256);
    L->td_ne0 = b->len - 8 - 4 - 8;
    tb_pad(b, ALIGN);
    L->data = b->len;

    tb_put(b, ta_vals, sizeof ta_vals); /* 64 bytes */
    for (int blk = 0; blk < 2; blk++) { /* q8_0: f16 scale 1.0, q = i - 16 */
        tb_u8(b, 0x00);
        tb_u8(b, 0x3c);
        for (int i = 0; i < 32; i++)
            tb_u8(b, (uint8_t)(int8_t)(i - 16 + blk));
    }
    while (b->len < L->data + 256) /* tc has no known size; td at 256 */
        tb_u8(b, 0);
    uint16_t bf[4] = {0x3f80, 0x4000, 0xbf80, 0x0000}; /* 1, 2, -1, 0 */
    tb_put(b, bf, 8);
}

/* opens a copy of exactly len bytes so ASan sees any read past the end */
static int open_copy(const uint8_t *p, size_t len, struct gguf_ctx **g, char *err, size_t errlen)
{
    void *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, p, len);
    int rc = gguf_open_mem(copy, len, g, err, errlen);
    if (rc == 0) {
        gguf_close(*g); /* the caller only wanted the verdict */
        *g = NULL;
    }
    free(copy);
    return rc;
}

/* --- getters ------------------------------------------------------------------ */

static void check_valid(const struct gguf_ctx *g, const struct layout *L, const uint8_t *base)
{
    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), ALIGN);
    assert_int_equal(gguf_data_offset(g), L->data);
    assert_int_equal(gguf_n_kv(g), N_KV);
    assert_int_equal(gguf_n_tensors(g), N_TENSORS);

    struct gguf_str k = gguf_key_name(g, 2);
    assert_int_equal(k.len, 4);
    assert_memory_equal(k.ptr, "k.u8", 4);
    assert_int_equal(gguf_kv_type(g, 2), GGUF_VAL_UINT8);
    assert_int_equal(gguf_kv_type(g, 17), GGUF_VAL_ARRAY);
    assert_null(gguf_key_name(g, N_KV).ptr);
    assert_int_equal((int)gguf_kv_type(g, N_KV), -1);
    assert_int_equal(gguf_find_key(g, "general.architecture"), 0);
    assert_int_equal(gguf_find_key(g, "k.nest"), 17);
    assert_int_equal(gguf_find_key(g, "k.nope"), -1);
    assert_int_equal(gguf_find_key(g, ""), -1);

    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    int bl;
    struct gguf_str s;
    assert_int_equal(gguf_get_u32(g, "general.alignment", &u32), 0);
    assert_int_equal(u32, ALIGN);
    assert_int_equal(gguf_get_u32(g, "k.u8", &u32), 0);
    assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_u32(g, "k.u16", &u32), 0);
    assert_int_equal(u32, 60000);
    assert_int_equal(gguf_get_u32(g, "k.u32", &u32), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_u32(g, "k.i8", &u32), RKV_ERANGE);
    assert_int_equal(gguf_get_u32(g, "k.u64", &u32), RKV_ERANGE);
    assert_int_equal(gguf_get_u32(g, "k.f32", &u32), RKV_EFORMAT);
    assert_int_equal(gguf_get_u32(g, "k.str", &u32), RKV_EFORMAT);
    assert_int_equal(gguf_get_u32(g, "k.bool", &u32), RKV_EFORMAT);
    assert_int_equal(gguf_get_u32(g, "nope", &u32), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_u64(g, "k.u64", &u64), 0);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(gguf_get_u64(g, "k.i16", &u64), RKV_ERANGE);
    assert_int_equal(gguf_get_u64(g, "nope", &u64), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_i64(g, "k.i8", &i64), 0);
    assert_int_equal(i64, -5);
    assert_int_equal(gguf_get_i64(g, "k.i16", &i64), 0);
    assert_int_equal(i64, -300);
    assert_int_equal(gguf_get_i64(g, "k.i32", &i64), 0);
    assert_int_equal(i64, -70000);
    assert_int_equal(gguf_get_i64(g, "k.i64", &i64), 0);
    assert_true(i64 == INT64_C(-9000000000000000000));
    assert_int_equal(gguf_get_i64(g, "k.u32", &i64), 0);
    assert_int_equal(i64, 4000000000);
    assert_int_equal(gguf_get_i64(g, "k.u64", &i64), RKV_ERANGE);
    assert_int_equal(gguf_get_i64(g, "k.f64", &i64), RKV_EFORMAT);
    assert_int_equal(gguf_get_i64(g, "nope", &i64), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_f32(g, "k.f32", &f), 0);
    assert_true(f == 0.5f);
    assert_int_equal(gguf_get_f32(g, "k.f64", &f), 0);
    assert_true(f == -2.25f);
    assert_int_equal(gguf_get_f32(g, "k.i32", &f), 0);
    assert_true(f == -70000.0f);
    assert_int_equal(gguf_get_f32(g, "k.str", &f), RKV_EFORMAT);
    assert_int_equal(gguf_get_f32(g, "nope", &f), RKV_ENOTFOUND);
    double d;
    assert_int_equal(gguf_get_f64(g, "k.f64", &d), 0);
    assert_true(d == -2.25);
    assert_int_equal(gguf_get_f64(g, "k.i64", &d), 0);
    assert_true(d == -9e18);
    assert_int_equal(gguf_get_f64(g, "k.str", &d), RKV_EFORMAT);
    assert_int_equal(gguf_get_f64(g, "nope", &d), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_bool(g, "k.bool", &bl), 0);
    assert_int_equal(bl, 1);
    assert_int_equal(gguf_get_bool(g, "k.u8", &bl), RKV_EFORMAT);
    assert_int_equal(gguf_get_bool(g, "nope", &bl), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_str(g, "k.str", &s), 0);
    assert_int_equal(s.len, 6);
    assert_memory_equal(s.ptr, "h\xc3\xa9llo", 6);
    assert_ptr_equal(s.ptr, (const char *)base + L->str_len + 8); /* points into the buffer */
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), 0);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.ptr, "llama", 5);
    assert_int_equal(gguf_get_str(g, "k.astr", &s), RKV_EFORMAT);
    assert_int_equal(gguf_get_str(g, "nope", &s), RKV_ENOTFOUND);

    /* arrays */
    enum gguf_value_type et;
    uint64_t n;
    assert_int_equal(gguf_get_arr_info(g, "k.astr", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_STRING);
    assert_int_equal(n, 3);
    assert_int_equal(gguf_get_arr_str(g, "k.astr", 0, &s), 0);
    assert_int_equal(s.len, 1);
    assert_memory_equal(s.ptr, "a", 1);
    assert_int_equal(gguf_get_arr_str(g, "k.astr", 1, &s), 0);
    assert_int_equal(s.len, 0);
    assert_int_equal(gguf_get_arr_str(g, "k.astr", 2, &s), 0);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "xyz", 3);
    assert_int_equal(gguf_get_arr_str(g, "k.astr", 3, &s), RKV_ERANGE);
    assert_int_equal(gguf_get_arr_str(g, "k.ai32", 0, &s), RKV_EFORMAT);
    assert_int_equal(gguf_get_arr_str(g, "k.str", 0, &s), RKV_EFORMAT);
    assert_int_equal(gguf_get_arr_str(g, "nope", 0, &s), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_arr_info(g, "k.ai32", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_INT32);
    assert_int_equal(n, 3);
    const int64_t want_i[3] = {1, -2, 3};
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(gguf_get_arr_i64(g, "k.ai32", i, &i64), 0);
        assert_int_equal(i64, want_i[i]);
        assert_int_equal(gguf_get_arr_f32(g, "k.ai32", i, &f), 0);
        assert_true(f == (float)want_i[i]);
    }
    assert_int_equal(gguf_get_arr_i64(g, "k.ai32", 3, &i64), RKV_ERANGE);
    assert_int_equal(gguf_get_arr_f32(g, "k.af32", 0, &f), 0);
    assert_true(f == 1.5f);
    assert_int_equal(gguf_get_arr_f32(g, "k.af32", 1, &f), 0);
    assert_true(f == -0.25f);
    assert_int_equal(gguf_get_arr_i64(g, "k.af32", 0, &i64), 0);
    assert_int_equal(i64, 1);
    assert_int_equal(gguf_get_arr_f32(g, "k.af32", 2, &f), RKV_ERANGE);
    assert_int_equal(gguf_get_arr_f32(g, "k.astr", 0, &f), RKV_EFORMAT);
    assert_int_equal(gguf_get_arr_f32(g, "k.f32", 0, &f), RKV_EFORMAT);
    assert_int_equal(gguf_get_arr_f32(g, "nope", 0, &f), RKV_ENOTFOUND);
    assert_int_equal(gguf_get_arr_info(g, "k.nest", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_ARRAY);
    assert_int_equal(n, 2);
    assert_int_equal(gguf_get_arr_i64(g, "k.nest", 0, &i64), RKV_EFORMAT);
    assert_int_equal(gguf_get_arr_info(g, "k.u8", &et, &n), RKV_EFORMAT);
    assert_int_equal(gguf_get_arr_info(g, "nope", &et, &n), RKV_ENOTFOUND);

    /* tensors */
    const struct gguf_tensor *t = gguf_tensor_at(g, 0);
    assert_non_null(t);
    assert_string_equal(t->name, "ta");
    assert_int_equal(t->type, GGUF_TYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 8);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->ne[3], 1);
    assert_int_equal(t->n_elements, 16);
    assert_int_equal(t->n_bytes, 64);
    assert_int_equal(t->offset, L->data);
    assert_ptr_equal(t->data, base + L->data);
    assert_memory_equal(t->data, ta_vals, 64);
    assert_ptr_equal(gguf_find_tensor(g, "ta"), t);

    t = gguf_find_tensor(g, "tb");
    assert_ptr_equal(t, gguf_tensor_at(g, 1));
    assert_int_equal(t->type, GGUF_TYPE_Q8_0);
    assert_int_equal(t->n_elements, 64);
    assert_int_equal(t->n_bytes, 68);
    assert_int_equal(t->offset, L->data + 64);
    const uint8_t *q = t->data;
    assert_int_equal(q[0], 0x00);
    assert_int_equal(q[1], 0x3c);
    assert_int_equal((int8_t)q[2], -16);
    assert_int_equal((int8_t)q[34 + 2 + 31], 16);

    t = gguf_find_tensor(g, "tc"); /* unknown type: passed on, no size */
    assert_int_equal(t->type, 99);
    assert_int_equal(t->n_elements, 5);
    assert_int_equal(t->n_bytes, 0);
    assert_int_equal(t->offset, L->data + 192);

    t = gguf_find_tensor(g, "td");
    assert_ptr_equal(t, gguf_tensor_at(g, 3));
    assert_int_equal(t->type, GGUF_TYPE_BF16);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->n_bytes, 8);
    const uint16_t *bf = t->data;
    assert_int_equal(bf[0], 0x3f80);
    assert_int_equal(bf[2], 0xbf80);
    assert_null(gguf_tensor_at(g, N_TENSORS));
    assert_null(gguf_find_tensor(g, "t"));
    assert_null(gguf_find_tensor(g, "tdx"));
}

static void test_getters(void **state)
{
    (void)state;
    struct tb b;
    struct layout L;
    build_valid(&b, &L);
    struct gguf_ctx *g;
    char err[256] = "untouched";
    assert_int_equal(gguf_open_mem(b.p, b.len, &g, err, sizeof err), 0);
    assert_string_equal(err, "");
    assert_int_equal(gguf_file_size(g), b.len);
    check_valid(g, &L, b.p);
    gguf_close(g);
    free(b.p);
}

static void test_open_file(void **state)
{
    (void)state;
    struct tb b;
    struct layout L;
    build_valid(&b, &L);
    char path[] = "/tmp/rkv-gguf-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.len), (ssize_t)b.len);
    close(fd);

    struct gguf_ctx *g;
    char err[512];
    assert_int_equal(gguf_open(path, &g, err, sizeof err), 0);
    check_valid(g, &L, (const uint8_t *)gguf_tensor_at(g, 0)->data - L.data);
    gguf_close(g);

    /* the same file cut inside td's data */
    assert_int_equal(truncate(path, (off_t)b.len - 1), 0);
    assert_int_equal(gguf_open(path, &g, err, sizeof err), RKV_EFORMAT);
    assert_null(g);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "tensor 3 \"td\""));
    assert_non_null(strstr(err, "truncated"));
    char want[128];
    snprintf(want, sizeof want, "data extends to byte %zu but the file has %zu bytes", b.len,
             b.len - 1);
    assert_non_null(strstr(err, want));

    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(gguf_open(path, &g, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "too small"));
    unlink(path);

    assert_int_equal(gguf_open(path, &g, err, sizeof err), -ENOENT);
    assert_non_null(strstr(err, path));
    assert_int_equal(gguf_open("/tmp", &g, err, sizeof err), RKV_EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
    /* no error buffer is fine too */
    assert_int_equal(gguf_open(path, &g, NULL, 0), -ENOENT);
    free(b.p);
}

static void test_truncation(void **state)
{
    (void)state;
    struct tb b;
    struct layout L;
    build_valid(&b, &L);
    for (size_t len = 0; len < b.len; len++) {
        struct gguf_ctx *g = (struct gguf_ctx *)1;
        char err[256] = "";
        int rc = open_copy(b.p, len, &g, err, sizeof err);
        if (rc != RKV_EFORMAT)
            fail_msg("length %zu: rc %d", len, rc);
        assert_null(g);
        assert_true(strncmp(err, "(memory): ", 10) == 0);
        assert_true(strlen(err) > 20);
    }
    struct gguf_ctx *g;
    assert_int_equal(open_copy(b.p, b.len, &g, NULL, 0), 0);
    free(b.p);
}

/* --- hostile fields ------------------------------------------------------------ */

enum { P_U32, P_U64, P_BYTES };

struct corruption {
    const char *what;
    int kind;
    size_t layout_field; /* offsetof(struct layout, ...) */
    size_t delta;        /* added to the field's offset */
    uint64_t value;
    const char *bytes;
    const char *expect; /* substring of the message */
};

#define AT(f) offsetof(struct layout, f)

static const struct corruption corruptions[] = {
    {"huge n_tensors", P_U64, AT(n_tensors), 0, UINT64_MAX, NULL, "tensor count"},
    {"n_tensors > room", P_U64, AT(n_tensors), 0, 1000, NULL, "cannot fit"},
    {"huge n_kv", P_U64, AT(n_kv), 0, UINT64_C(1) << 60, NULL, "metadata key count"},
    {"huge key length", P_U64, AT(key0_len), 0, UINT64_MAX - 3, NULL, "key 0: key name"},
    {"huge string length", P_U64, AT(str_len), 0, UINT64_C(1) << 40, NULL, "\"k.str\": string"},
    {"huge array length", P_U64, AT(astr_n), 0, UINT64_MAX / 4, NULL, "\"k.astr\": array"},
    {"nested element type", P_U32, AT(nest_type), 0, 77, NULL, "unknown element type 77"},
    {"alignment 48", P_U32, AT(align_val), 0, 48, NULL, "power of two"},
    {"alignment 0", P_U32, AT(align_val), 0, 0, NULL,
     "\"general.alignment\": value 0 must be a power of two"},
    {"alignment as float", P_U32, AT(align_type), 0, GGUF_VAL_FLOAT32, NULL,
     "\"general.alignment\": must be an unsigned integer"},
    {"unknown value type", P_U32, AT(align_type), 0, 13, NULL, "unknown value type 13"},
    {"duplicate key", P_BYTES, AT(key_i8), 0, 0, "k.u8", "\"k.u8\": duplicate key (also key 2)"},
    {"n_dims 5", P_U32, AT(ta_ndims), 0, 5, NULL, "n_dims 5"},
    {"dims overflow", P_U64, AT(ta_ne0), 0, UINT64_C(1) << 62, NULL, "dimension"},
    {"dims product overflow", P_U64, AT(ta_ne1), 0, UINT64_C(1) << 62, NULL,
     "element count overflows"},
    {"dim above int64", P_U64, AT(ta_ne0), 0, UINT64_MAX, NULL, "too large"},
    {"q8_0 partial block", P_U64, AT(tb_ne0), 0, 33, NULL, "not a multiple of the Q8_0 block"},
    {"misaligned offset", P_U64, AT(ta_off), 0, 32, NULL, "not a multiple of the alignment 64"},
    {"offset past eof", P_U64, AT(ta_off), 0, UINT64_C(1) << 20, NULL,
     "tensor 0 \"ta\": data starts"},
    {"offset overflow", P_U64, AT(ta_off), 0, UINT64_MAX - 63, NULL, "data starts"},
    {"data past eof", P_U64, AT(td_ne0), 0, 64, NULL, "\"td\": data extends to byte"},
    {"duplicate tensor", P_BYTES, AT(tb_name), 0, 0, "ta", "\"ta\": duplicate tensor name"},
    {"nul in tensor name", P_BYTES, AT(tb_name), 1, 0, "\0", "NUL"},
    {"bad magic", P_BYTES, AT(n_tensors), (size_t)-8, 0, "GGML", "not a GGUF file"},
    {"version 1", P_U32, AT(n_tensors), (size_t)-4, 1, NULL, "version 1 is not supported"},
    {"version 4", P_U32, AT(n_tensors), (size_t)-4, 4, NULL, "version 4 is not supported"},
    {"big-endian", P_U32, AT(n_tensors), (size_t)-4, 0x03000000, NULL, "big-endian"},
};

static void test_hostile(void **state)
{
    (void)state;
    struct tb b;
    struct layout L;
    build_valid(&b, &L);
    uint8_t *orig = malloc(b.len);
    memcpy(orig, b.p, b.len);
    for (size_t i = 0; i < sizeof corruptions / sizeof corruptions[0]; i++) {
        const struct corruption *c = &corruptions[i];
        memcpy(b.p, orig, b.len);
        size_t at = *(const size_t *)((const char *)&L + c->layout_field) + c->delta;
        if (c->kind == P_U32)
            patch_u32(&b, at, (uint32_t)c->value);
        else if (c->kind == P_U64)
            patch_u64(&b, at, c->value);
        else
            memcpy(b.p + at, c->bytes, c->bytes[0] ? strlen(c->bytes) : 1);
        struct gguf_ctx *g;
        char err[512] = "";
        int rc = open_copy(b.p, b.len, &g, err, sizeof err);
        if (rc != RKV_EFORMAT || !strstr(err, c->expect))
            fail_msg("%s: rc %d, message \"%s\", expected \"%s\"", c->what, rc, err, c->expect);
        assert_true(strncmp(err, "(memory): ", 10) == 0);
    }
    free(orig);
    free(b.p);
}

/* minimal files: no tensors, no keys; default alignment; deep nesting */
static void test_minimal_and_nesting(void **state)
{
    (void)state;
    struct tb b = {0};
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, 2);
    tb_u64(&b, 0);
    tb_u64(&b, 0);
    struct gguf_ctx *g;
    char err[256];
    assert_int_equal(gguf_open_mem(b.p, b.len, &g, err, sizeof err), 0);
    assert_int_equal(gguf_version(g), 2);
    assert_int_equal(gguf_alignment(g), 32);
    assert_int_equal(gguf_n_kv(g), 0);
    assert_int_equal(gguf_n_tensors(g), 0);
    assert_int_equal(gguf_find_key(g, "x"), -1);
    assert_null(gguf_find_tensor(g, "x"));
    gguf_close(g);

    /* arrays nested 9 deep are refused, 8 deep are read */
    for (int depth = 8; depth <= 9; depth++) {
        b.len = 0;
        tb_put(&b, "GGUF", 4);
        tb_u32(&b, 3);
        tb_u64(&b, 0);
        tb_u64(&b, 1);
        tb_key(&b, "deep", GGUF_VAL_ARRAY);
        for (int d = 1; d < depth; d++) {
            tb_u32(&b, GGUF_VAL_ARRAY);
            tb_u64(&b, 1);
        }
        tb_u32(&b, GGUF_VAL_UINT8);
        tb_u64(&b, 1);
        tb_u8(&b, 7);
        int rc = gguf_open_mem(b.p, b.len, &g, err, sizeof err);
        if (depth == 8) {
            assert_int_equal(rc, 0);
            gguf_close(g);
        } else {
            assert_int_equal(rc, RKV_EFORMAT);
            assert_non_null(strstr(err, "nested deeper than 8"));
        }
    }
    free(b.p);
}

/* enough keys and tensors that the name indexes are rebuilt a few times */
static void build_many(struct tb *b, int n_kv, int n_t, int dup_key, int dup_tensor)
{
    char name[32];
    b->len = 0;
    tb_put(b, "GGUF", 4);
    tb_u32(b, 3);
    tb_u64(b, (uint64_t)n_t);
    tb_u64(b, (uint64_t)n_kv);
    for (int i = 0; i < n_kv; i++) {
        snprintf(name, sizeof name, "key.%d", i == dup_key ? 7 : i);
        tb_key(b, name, GGUF_VAL_UINT32);
        tb_u32(b, (uint32_t)i * 3);
    }
    for (int i = 0; i < n_t; i++) {
        uint64_t ne = 8;
        snprintf(name, sizeof name, "t.%d", i == dup_tensor ? 5 : i);
        tensor_info(b, name, 1, &ne, GGUF_TYPE_F32, (uint64_t)i * 32);
    }
    tb_pad(b, 32);
    for (int i = 0; i < n_t; i++)
        for (int k = 0; k < 8; k++) {
            float v = (float)(i * 8 + k);
            tb_put(b, &v, 4);
        }
}

static void test_many_names(void **state)
{
    (void)state;
    struct tb b = {0};
    struct gguf_ctx *g;
    char err[256], name[32];
    build_many(&b, 1000, 700, -1, -1);
    assert_int_equal(gguf_open_mem(b.p, b.len, &g, err, sizeof err), 0);
    for (int i = 0; i < 1000; i++) {
        uint32_t v;
        snprintf(name, sizeof name, "key.%d", i);
        assert_int_equal(gguf_find_key(g, name), i);
        assert_int_equal(gguf_get_u32(g, name, &v), 0);
        assert_int_equal(v, i * 3);
    }
    for (int i = 0; i < 700; i++) {
        snprintf(name, sizeof name, "t.%d", i);
        const struct gguf_tensor *t = gguf_find_tensor(g, name);
        assert_ptr_equal(t, gguf_tensor_at(g, (uint64_t)i));
        assert_string_equal(t->name, name);
        assert_true(((const float *)t->data)[7] == (float)(i * 8 + 7));
    }
    assert_int_equal(gguf_find_key(g, "key.1000"), -1);
    assert_null(gguf_find_tensor(g, "t.700"));
    gguf_close(g);

    build_many(&b, 1000, 700, 900, -1);
    assert_int_equal(gguf_open_mem(b.p, b.len, &g, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "key 900 \"key.7\": duplicate key (also key 7)"));
    build_many(&b, 1000, 700, -1, 600);
    assert_int_equal(gguf_open_mem(b.p, b.len, &g, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "tensor 600 \"t.5\": duplicate tensor name (also tensor 5)"));
    free(b.p);
}

static void test_type_names(void **state)
{
    (void)state;
    assert_string_equal(gguf_type_name(GGUF_TYPE_F32), "F32");
    assert_string_equal(gguf_type_name(GGUF_TYPE_F16), "F16");
    assert_string_equal(gguf_type_name(GGUF_TYPE_BF16), "BF16");
    assert_string_equal(gguf_type_name(GGUF_TYPE_Q8_0), "Q8_0");
    assert_string_equal(gguf_type_name(2), "Q4_0");
    assert_string_equal(gguf_type_name(12), "Q4_K");
    assert_string_equal(gguf_type_name(14), "Q6_K");
    assert_string_equal(gguf_type_name(4), "type 4"); /* removed from ggml */
    assert_string_equal(gguf_type_name(99), "type 99");
    assert_int_equal(gguf_type_size(GGUF_TYPE_F32, 10), 40);
    assert_int_equal(gguf_type_size(GGUF_TYPE_BF16, 10), 20);
    assert_int_equal(gguf_type_size(GGUF_TYPE_Q8_0, 64), 68);
    assert_int_equal(gguf_type_size(GGUF_TYPE_Q8_0, 33), 0);
    assert_int_equal(gguf_type_size(12, 512), 288);
    assert_int_equal(gguf_type_size(99, 4), 0);
    assert_int_equal(gguf_type_size(GGUF_TYPE_F32, UINT64_MAX / 2), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_minimal_and_nesting),
        cmocka_unit_test(test_many_names),
        cmocka_unit_test(test_type_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
