/* kv_test.c - kv block geometry and the local block allocator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "common/err.h"
#include "worker/kv.h"

static void test_geometry(void **state)
{
    (void)state;
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 0, 2, 2, 16, KV_F32), RKV_EINVAL);
    assert_int_equal(kv_layout_init(&l, 256, 2, 2, 16, (enum kv_dtype)7), RKV_EINVAL);
    assert_int_equal(kv_layout_init(&l, 256, 3, 2, 16, KV_F16), 0);
    /* one slice: (n_kv_head, B, head_dim) halves */
    assert_int_equal(kv_slice_bytes(&l), 2 * 256 * 16 * 2);
    assert_int_equal(kv_block_bytes(&l), 3 * 2 * kv_slice_bytes(&l));
    /* layer l's K then V */
    assert_int_equal(kv_slice_offset(&l, 0, 0), 0);
    assert_int_equal(kv_slice_offset(&l, 0, 1), kv_slice_bytes(&l));
    assert_int_equal(kv_slice_offset(&l, 2, 1), 5 * kv_slice_bytes(&l));
    assert_int_equal(kv_blocks_for(&l, 0), 0);
    assert_int_equal(kv_blocks_for(&l, 256), 1);
    assert_int_equal(kv_blocks_for(&l, 257), 2);

    static char dev[8192], host[8192];
    assert_int_equal(kv_layout_init(&l, 4, 2, 1, 8, KV_F32), 0); /* slice 128 bytes, block 512 */
    struct kv_pools p = {{dev, host}, {16, 16}};
    struct kv_block_ref r = {3, KV_HOST};
    assert_ptr_equal(kv_slice_ptr(&l, &p, r, 1, 1), host + 3 * 512 + 3 * 128);
    r.index = 16;
    assert_null(kv_slice_ptr(&l, &p, r, 0, 0));
    r.index = 0;
    assert_null(kv_slice_ptr(&l, &p, r, 2, 0));
    r.residency = 2;
    assert_null(kv_slice_ptr(&l, &p, r, 0, 0));
}

static void test_geometry_8bit(void **state)
{
    (void)state;
    struct kv_layout l;
    /* llama3-8b's shape: a row of 128 is 128 levels + 4 bf16 scales (q8), + one f32 (fp8) */
    assert_int_equal(kv_layout_init(&l, 256, 32, 8, 128, KV_Q8), 0);
    assert_int_equal(kv_row_scales(&l), 4);
    assert_int_equal(kv_row_bytes(&l), 136);
    assert_int_equal(kv_slice_bytes(&l), 8 * 256 * 136);
    assert_int_equal(kv_token_bytes(&l), 2 * 32 * 8 * 136);
    assert_int_equal(kv_block_bytes(&l), 256 * kv_token_bytes(&l));
    assert_int_equal(kv_slice_offset(&l, 3, 1), 7 * kv_slice_bytes(&l));
    assert_int_equal(kv_layout_init(&l, 256, 32, 8, 128, KV_FP8), 0);
    assert_int_equal(kv_row_scales(&l), 1);
    assert_int_equal(kv_row_bytes(&l), 132);
    assert_int_equal(kv_block_bytes(&l), 2 * 32 * 8 * 256 * 132);
    /* the float dtypes keep their geometry */
    assert_int_equal(kv_layout_init(&l, 256, 32, 8, 128, KV_F16), 0);
    assert_int_equal(kv_row_bytes(&l), 256);
    assert_int_equal(kv_token_bytes(&l), 2 * 32 * 8 * 256);
    /* a last group shorter than 32: 40 = 32 + 8 */
    assert_int_equal(kv_layout_init(&l, 16, 2, 2, 40, KV_Q8), 0);
    assert_int_equal(kv_row_scales(&l), 2);
    assert_int_equal(kv_row_bytes(&l), 44);
    /* 8-bit rows need head_dim a multiple of 8 */
    assert_int_equal(kv_layout_init(&l, 16, 2, 2, 12, KV_Q8), RKV_EINVAL);
    assert_int_equal(kv_layout_init(&l, 16, 2, 2, 12, KV_FP8), RKV_EINVAL);
    assert_int_equal(kv_layout_init(&l, 16, 2, 2, 12, KV_F16), 0);
    /* rows (kvh, B) of 64 levels then 2 bf16 scales, position-major within a head */
    assert_int_equal(kv_layout_init(&l, 4, 1, 2, 64, KV_Q8), 0);
    static char slice[4096];
    assert_ptr_equal(kv_row_ptr(&l, slice, 1, 2), slice + (1 * 4 + 2) * 68);
    assert_ptr_equal(kv_row_scale_ptr(&l, slice, 1, 2), slice + (1 * 4 + 2) * 68 + 64);
    assert_ptr_equal(kv_row_ptr(&l, slice, 0, 0), slice);
    assert_int_equal(kv_slice_bytes(&l), 2 * 4 * (64 + 4));
    /* f16 rows as before: (kvh, B, hd) elements */
    assert_int_equal(kv_layout_init(&l, 4, 1, 2, 64, KV_F16), 0);
    assert_ptr_equal(kv_row_ptr(&l, slice, 1, 2), slice + (1 * 4 + 2) * 128);

    enum kv_dtype t;
    assert_int_equal(kv_dtype_parse("q8", &t), 0);
    assert_int_equal(t, KV_Q8);
    assert_int_equal(kv_dtype_parse("fp8", &t), 0);
    assert_int_equal(t, KV_FP8);
    assert_int_equal(kv_dtype_parse("f16", &t), 0);
    assert_int_equal(t, KV_F16);
    assert_int_equal(kv_dtype_parse("int8", &t), RKV_EINVAL);
    assert_string_equal(kv_dtype_name(KV_FP8), "fp8");
    assert_string_equal(kv_dtype_name((enum kv_dtype)9), "?");
}

static void test_e4m3(void **state)
{
    (void)state;
    /* every finite code decodes and encodes back to itself */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f)
            continue;
        float v = kv_e4m3_to_f32((uint8_t)c);
        assert_false(isnan(v));
        if (c != 0x80) /* -0 */
            assert_int_equal(kv_f32_to_e4m3(v), c);
    }
    assert_true(isnan(kv_e4m3_to_f32(0x7f)));
    assert_true(kv_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(kv_e4m3_to_f32(0x08) == 0x1p-6f); /* smallest normal */
    assert_true(kv_e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
    assert_true(kv_e4m3_to_f32(0x38) == 1.0f);
    assert_true(kv_e4m3_to_f32(0xb9) == -1.125f);
    /* ties to the even mantissa */
    assert_int_equal(kv_f32_to_e4m3(1.0625f), 0x38); /* 1 | 1.125 */
    assert_int_equal(kv_f32_to_e4m3(1.1875f), 0x3a); /* 1.125 | 1.25 */
    assert_int_equal(kv_f32_to_e4m3(-1.1875f), 0xba);
    assert_int_equal(kv_f32_to_e4m3(1.5f * 0x1p-9f), 0x02);   /* subnormal 1 | 2 */
    assert_int_equal(kv_f32_to_e4m3(0.5f * 0x1p-9f), 0x00);   /* 0 | 1 */
    assert_int_equal(kv_f32_to_e4m3(15.5f * 0x1p-10f), 0x08); /* 7.75 steps: up to the normal */
    assert_int_equal(kv_f32_to_e4m3(1.96875f), 0x40);         /* 1.875 | 2: carries to 2 */
    /* saturation */
    assert_int_equal(kv_f32_to_e4m3(460.0f), 0x7e);
    assert_int_equal(kv_f32_to_e4m3(1e9f), 0x7e);
    assert_int_equal(kv_f32_to_e4m3(-1e9f), 0xfe);
    /* bf16: nearest even */
    assert_int_equal(kv_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kv_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);            /* tie: even */
    assert_int_equal(kv_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);        /* tie: even */
    assert_int_equal(kv_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* past the tie */
    assert_true(kv_bf16_to_f32(0xbf80) == -1.0f);
}

static void test_q8_levels(void **state)
{
    (void)state;
    /* amax 63.5: d = 0.5 exactly, so levels are x / 0.5 rounded half to even */
    float x[40] = {63.5f, 0.25f, 0.75f, -0.75f, 1.25f, -63.5f, 10.0f, -0.2f};
    for (int i = 8; i < 32; i++)
        x[i] = 0.5f * (float)(i - 20);
    for (int i = 32; i < 40; i++) /* a second group of 8: amax 0.127 */
        x[i] = 0.127f * (i % 2 ? -1.0f : 1.0f) * (float)(i - 32) / 7.0f;
    int8_t q[40];
    uint16_t d[2];
    kv_q8_quantize(x, 40, q, d);
    assert_true(kv_bf16_to_f32(d[0]) == 0.5f);
    const int8_t want[8] = {127, 0, 2, -2, 2, -127, 20, 0};
    for (int i = 0; i < 8; i++)
        assert_int_equal(q[i], want[i]);
    for (int i = 8; i < 32; i++)
        assert_int_equal(q[i], i - 20);
    /* the second group's scale is its own: the bf16 of 0.127 / 127 */
    assert_int_equal(d[1], kv_f32_to_bf16(0.127f / 127.0f));
    const float d1 = kv_bf16_to_f32(d[1]);
    for (int i = 32; i < 40; i++) {
        assert_true(fabsf(x[i] - q[i] * d1) <= 0.5f * d1 * 1.0001f);
        assert_true(abs(q[i]) <= 127);
    }
    /* all zero: scale 0, levels 0 */
    float z[8] = {0};
    kv_q8_quantize(z, 8, q, d);
    assert_int_equal(d[0], 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(q[i], 0);
}

/* a NaN in a row is passed over by the scale and stored as 0, in both 8-bit forms (the fp8
 * NaN codes are never written), and the row's other values keep their levels */
static void test_8bit_nan(void **state)
{
    (void)state;
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = 0.5f * (float)(i - 16);
    float y[32];
    memcpy(y, x, sizeof y);
    y[3] = y[30] = NAN;
    int8_t q[32], qr[32];
    uint16_t d, dr;
    kv_q8_quantize(x, 32, qr, &dr);
    kv_q8_quantize(y, 32, q, &d);
    assert_int_equal(d, dr); /* amax 8 either way */
    for (int i = 0; i < 32; i++)
        assert_int_equal(q[i], i == 3 || i == 30 ? 0 : qr[i]);
    uint8_t e[32], er[32];
    float s, sr;
    kv_fp8_quantize(x, 32, er, &sr);
    kv_fp8_quantize(y, 32, e, &s);
    assert_true(s == sr);
    for (int i = 0; i < 32; i++) {
        assert_int_equal(e[i], i == 3 || i == 30 ? 0 : er[i]);
        assert_true((e[i] & 0x7f) != 0x7f);
    }
    /* a group of NaN only: scale 0, levels 0 */
    for (int i = 0; i < 32; i++)
        y[i] = NAN;
    kv_q8_quantize(y, 32, q, &d);
    assert_int_equal(d, 0);
    kv_fp8_quantize(y, 32, e, &s);
    assert_true(s == 0.0f);
    for (int i = 0; i < 32; i++)
        assert_true(q[i] == 0 && e[i] == 0);
}

/* rows written by kv_row_store read back as their levels times their scales, and leave every
 * other row of the slice alone */
static void round_trip(enum kv_dtype t)
{
    struct kv_layout l;
    const uint32_t B = 4, KVH = 2, HD = 48;
    assert_int_equal(kv_layout_init(&l, B, 1, KVH, HD, t), 0);
    char *slice = calloc(1, kv_slice_bytes(&l));
    char *zero = calloc(1, kv_slice_bytes(&l));
    float src[48], back[48];
    for (uint32_t i = 0; i < HD; i++)
        src[i] = sinf(0.37f * (float)i) * (i < 32 ? 3.0f : 0.01f);
    kv_row_store(&l, slice, 1, 2, src);
    kv_row_load(&l, slice, 1, 2, back);
    const int8_t *q = kv_row_ptr(&l, slice, 1, 2);
    const void *sc = kv_row_scale_ptr(&l, slice, 1, 2);
    for (uint32_t i = 0; i < HD; i++) {
        if (t == KV_Q8) {
            float d = kv_bf16_to_f32(((const uint16_t *)sc)[i / 32]);
            assert_true(back[i] == (float)q[i] * d);
            assert_true(fabsf(back[i] - src[i]) <= 0.5f * d * 1.0001f);
        } else {
            float s = *(const float *)sc;
            assert_true(back[i] == kv_e4m3_to_f32((uint8_t)q[i]) * s);
            /* 3 mantissa bits: within 1/16 of the value, or a subnormal step */
            assert_true(fabsf(back[i] - src[i]) <= fabsf(src[i]) / 16 + s * 0x1p-10f);
        }
    }
    /* the row's bytes (levels and scales) are the only ones written */
    const size_t rb = kv_row_bytes(&l), row_at = (size_t)(1 * B + 2) * rb;
    assert_int_equal(rb, HD + 4); /* q8: two bf16 (groups of 32 and 16); fp8: one f32 */
    for (size_t i = 0; i < kv_slice_bytes(&l); i++)
        if (i < row_at || i >= row_at + rb)
            assert_int_equal(slice[i], zero[i]);
    /* the same row again gives the same bytes */
    char *again = calloc(1, kv_slice_bytes(&l));
    kv_row_store(&l, again, 1, 2, src);
    assert_memory_equal(again, slice, kv_slice_bytes(&l));
    free(again);
    free(zero);
    free(slice);
}

static void test_row_round_trip(void **state)
{
    (void)state;
    round_trip(KV_Q8);
    round_trip(KV_FP8);
}

static void test_local_alloc_migrate(void **state)
{
    (void)state;
    struct kv_layout l;
    struct kv_local *k;
    assert_int_equal(kv_layout_init(&l, 8, 2, 2, 4, KV_F32), 0);
    assert_int_equal(kv_local_create(&k, &l, 2, 1), 0);
    struct kv_block_ref a, b, c;
    assert_int_equal(kv_local_alloc(k, KV_DEVICE, &a), 0);
    assert_int_equal(kv_local_alloc(k, KV_DEVICE, &b), 0);
    assert_int_equal(a.index, 0);
    assert_int_equal(b.index, 1);
    assert_int_equal(kv_local_alloc(k, KV_DEVICE, &c), RKV_ENOSPACE);
    /* a block's bytes move with it */
    const struct kv_pools *p = kv_local_pools(k);
    float *s = kv_slice_ptr(&l, p, b, 1, 1);
    for (int i = 0; i < 64; i++)
        s[i] = (float)i;
    assert_int_equal(kv_local_migrate(k, &b, KV_HOST), 0);
    assert_int_equal(b.residency, KV_HOST);
    float *t = kv_slice_ptr(&l, p, b, 1, 1);
    for (int i = 0; i < 64; i++)
        assert_true(t[i] == (float)i);
    /* the host pool is full now; the freed device block is reusable */
    assert_int_equal(kv_local_migrate(k, &a, KV_HOST), RKV_ENOSPACE);
    assert_int_equal(a.residency, KV_DEVICE);
    assert_int_equal(kv_local_alloc(k, KV_DEVICE, &c), 0);
    assert_int_equal(c.index, 1);
    assert_int_equal(kv_local_migrate(k, &b, KV_DEVICE), RKV_ENOSPACE);
    kv_local_release(k, a);
    assert_int_equal(kv_local_migrate(k, &b, KV_DEVICE), 0);
    assert_int_equal(b.index, 0);
    t = kv_slice_ptr(&l, p, b, 1, 1);
    assert_true(t[63] == 63.0f);
    kv_local_destroy(k);
}

/* pool memory from outside: every alloc, free and copy goes through the ops */
struct mem_log {
    int allocs[KV_N_POOLS], frees[KV_N_POOLS], copies;
};
static int log_alloc(void *u, enum kv_residency r, size_t bytes, void **out)
{
    ((struct mem_log *)u)->allocs[r]++;
    *out = calloc(1, bytes);
    return *out ? 0 : RKV_ENOMEM;
}
static void log_free(void *u, enum kv_residency r, void *p)
{
    ((struct mem_log *)u)->frees[r]++;
    free(p);
}
static int log_copy(void *u, void *dst, const void *src, size_t n)
{
    ((struct mem_log *)u)->copies++;
    memcpy(dst, src, n);
    return 0;
}
static int fail_alloc(void *u, enum kv_residency r, size_t bytes, void **out)
{
    return r == KV_HOST ? RKV_ECUDA : log_alloc(u, r, bytes, out);
}

static void test_local_mem_ops(void **state)
{
    (void)state;
    struct kv_layout l;
    struct kv_local *k;
    struct mem_log ml = {{0}};
    struct kv_mem mem = {log_alloc, log_free, log_copy, &ml};
    assert_int_equal(kv_layout_init(&l, 4, 1, 1, 4, KV_F32), 0);
    assert_int_equal(kv_local_init_mem(&k, &l, 3, 2, &mem), 0);
    assert_int_equal(ml.allocs[KV_DEVICE], 1);
    assert_int_equal(ml.allocs[KV_HOST], 1);
    struct kv_block_ref b;
    assert_int_equal(kv_local_alloc(k, KV_DEVICE, &b), 0);
    float *s = kv_slice_ptr(&l, kv_local_pools(k), b, 0, 0);
    s[5] = 42.0f;
    assert_int_equal(kv_local_migrate(k, &b, KV_HOST), 0);
    assert_int_equal(ml.copies, 1);
    assert_true(((float *)kv_slice_ptr(&l, kv_local_pools(k), b, 0, 0))[5] == 42.0f);
    kv_local_destroy(k);
    assert_int_equal(ml.frees[KV_DEVICE], 1);
    assert_int_equal(ml.frees[KV_HOST], 1);
    /* a failing alloc unwinds what was allocated and reports its code */
    mem.alloc = fail_alloc;
    assert_int_equal(kv_local_init_mem(&k, &l, 3, 2, &mem), RKV_ECUDA);
    assert_int_equal(ml.frees[KV_DEVICE], 2);
}

/* passes of whole sequences: in order, as many as fit, each sequence in exactly one pass and
 * the passes' slot ranges back to back; a sequence over the cap: no passes */
static void test_stage_passes(void **state)
{
    (void)state;
    const uint32_t slots[] = {3, 0, 5, 2, 8, 0, 1, 4};
    uint32_t pass_of[8], first[8], count[8];
    uint32_t n = kv_stage_passes(slots, 8, 8, pass_of, first, count, 8);
    /* 3+0+5 = 8 | 2 (+8 no) | 8+0 | 1+4 */
    assert_int_equal(n, 4);
    const uint32_t want_of[] = {0, 0, 0, 1, 2, 2, 3, 3};
    assert_memory_equal(pass_of, want_of, sizeof want_of);
    const uint32_t want_first[] = {0, 8, 10, 18}, want_count[] = {8, 2, 8, 5};
    assert_memory_equal(first, want_first, sizeof want_first);
    assert_memory_equal(count, want_count, sizeof want_count);
    /* the count alone (no arrays), and a cap that holds everything: one pass */
    assert_int_equal(kv_stage_passes(slots, 8, 8, NULL, NULL, NULL, 0), 4);
    assert_int_equal(kv_stage_passes(slots, 8, 100, pass_of, first, count, 8), 1);
    assert_int_equal(count[0], 23);
    /* one sequence over the cap: nothing to split */
    assert_int_equal(kv_stage_passes(slots, 8, 7, pass_of, first, count, 8), 0);
    /* more passes than described: the count is still right */
    assert_int_equal(kv_stage_passes(slots, 8, 8, pass_of, first, count, 2), 4);
    assert_int_equal(pass_of[7], 3);
}

/* Gemma 3 270M's shape: 18 layers, every 6th global, a window of 512 */
static void gemma3_270m(struct kv_layout *l, uint32_t n_layer)
{
    assert_int_equal(kv_layout_init(l, 256, n_layer, 1, 256, KV_F16), 0);
    assert_int_equal(kv_layout_set_window(l, 512, 6), 0);
}

static void test_window_geometry(void **state)
{
    (void)state;
    struct kv_layout l;
    gemma3_270m(&l, 18);
    /* globals 5, 11, 17 in part 0; 15 local layers three to a part */
    assert_int_equal(l.part_layers, 3);
    assert_int_equal(l.n_parts, 6);
    assert_int_equal(kv_block_bytes(&l), 3 * 2 * kv_slice_bytes(&l));
    assert_int_equal(kv_layer_part(&l, 5), 0);
    assert_int_equal(kv_layer_part(&l, 17), 0);
    assert_int_equal(kv_slice_offset(&l, 11, 1), 3 * kv_slice_bytes(&l));
    assert_int_equal(kv_layer_part(&l, 0), 1);
    assert_int_equal(kv_layer_part(&l, 4), 2);
    assert_int_equal(kv_slice_offset(&l, 4, 0), 2 * kv_slice_bytes(&l));
    assert_int_equal(kv_layer_part(&l, 6), 2); /* local index 5 */
    assert_int_equal(kv_slice_offset(&l, 6, 0), 4 * kv_slice_bytes(&l));
    assert_int_equal(kv_layer_part(&l, 16), 5);
    assert_true(kv_layer_local(&l, 16));
    assert_false(kv_layer_local(&l, 11));
    /* every (part, slot) holds exactly one layer */
    uint8_t seen[6][3] = {{0}};
    for (uint32_t i = 0; i < 18; i++) {
        size_t slot = kv_slice_offset(&l, i, 0) / (2 * kv_slice_bytes(&l));
        assert_true(slot < 3);
        seen[kv_layer_part(&l, i)][slot]++;
    }
    for (int p = 0; p < 6; p++)
        for (int s = 0; s < 3; s++)
            assert_int_equal(seen[p][s], 1);

    /* Gemma 3 1B: 26 layers, 4 global; 22 local fill 6 parts of 4 (two slots unused) */
    gemma3_270m(&l, 26);
    assert_int_equal(l.part_layers, 4);
    assert_int_equal(l.n_parts, 7);
    assert_int_equal(kv_layer_part(&l, 24), 6); /* local index 20 */

    /* nothing to split: no window, no global or no local layer; a window needs a period */
    assert_int_equal(kv_layout_init(&l, 16, 4, 1, 8, KV_F32), 0);
    assert_int_equal(kv_layout_set_window(&l, 0, 6), 0);
    assert_int_equal(l.n_parts, 1);
    assert_int_equal(kv_layout_set_window(&l, 8, 6), 0); /* 4 layers, all local */
    assert_int_equal(l.n_parts, 1);
    assert_int_equal(kv_block_bytes(&l), 4 * 2 * kv_slice_bytes(&l));
    assert_int_equal(kv_layout_set_window(&l, 8, 1), 0); /* all global */
    assert_int_equal(l.n_parts, 1);
    assert_int_equal(kv_window_first(&l, 1000), 0);
    assert_int_equal(kv_layout_set_window(&l, 8, 0), RKV_EINVAL);
}

static void test_window_bytes(void **state)
{
    (void)state;
    struct kv_layout l;
    gemma3_270m(&l, 18);
    /* queries from n_past on see positions > pos - 512 */
    assert_int_equal(kv_window_first(&l, 0), 0);
    assert_int_equal(kv_window_first(&l, 767), 1);
    assert_int_equal(kv_window_first(&l, 766), 0);
    assert_int_equal(kv_window_first(&l, 32768), 126);
    /* 32k: 128 global parts and the 2 position blocks of the window's 5 local parts */
    assert_int_equal(kv_live_blocks(&l, 32768), 128 + 2 * 5);
    uint64_t live = kv_live_bytes(&l, 32768), full = kv_all_global_bytes(&l, 32768);
    assert_int_equal(full, 128ull * 18 * 2 * kv_slice_bytes(&l));
    assert_true(live * 4 <= full);
    /* short sessions keep every part */
    assert_int_equal(kv_live_blocks(&l, 300), 2 * 6);
    assert_int_equal(kv_live_bytes(&l, 300), kv_all_global_bytes(&l, 300));
    gemma3_270m(&l, 26);
    assert_true(kv_live_bytes(&l, 32768) * 4 <= kv_all_global_bytes(&l, 32768));
    /* without a split a session's bytes are the all-global ones */
    assert_int_equal(kv_layout_init(&l, 256, 18, 1, 256, KV_F16), 0);
    assert_int_equal(kv_live_bytes(&l, 32768), kv_all_global_bytes(&l, 32768));
}

static void test_window_tables(void **state)
{
    (void)state;
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 4, 4, 1, 8, KV_F32), 0);
    assert_int_equal(kv_layout_set_window(&l, 6, 2), 0); /* globals 1, 3; locals 0, 2 */
    assert_int_equal(l.n_parts, 2);
    /* 4 position blocks; the first two's local parts dropped */
    struct kv_block_ref t[8], v[4];
    for (uint32_t i = 0; i < 8; i++)
        t[i] = (struct kv_block_ref){i, i % 3 == 0 ? KV_HOST : KV_DEVICE};
    t[1].index = t[3].index = KV_REF_NONE;
    assert_int_equal(kv_layer_view(&l, t, 8, 3, v), 4);
    for (uint32_t j = 0; j < 4; j++)
        assert_int_equal(v[j].index, 2 * j);
    assert_int_equal(kv_layer_view(&l, t, 8, 2, v), 4);
    assert_int_equal(v[0].index, KV_REF_NONE);
    assert_int_equal(v[2].index, 5);
    assert_int_equal(v[3].residency, KV_DEVICE);
    /* a prefix continues exactly where the window's local parts are there: from 13 on a
     * query reads positions 8.. (block 2); from 12, position 7 (block 1, dropped) */
    assert_int_equal(kv_window_first(&l, 13), 2);
    assert_true(kv_window_live(&l, t, 8, 13));
    assert_true(kv_window_live(&l, t, 8, 16));
    assert_false(kv_window_live(&l, t, 8, 12));
    assert_false(kv_window_live(&l, t, 8, 17)); /* past the table */
    t[4].index = KV_REF_NONE;                   /* a global part is never optional */
    assert_false(kv_window_live(&l, t, 8, 16));
    /* slices of a dropped part resolve to nothing */
    static char dev[4096], host[4096];
    struct kv_pools p = {{dev, host}, {8, 8}};
    assert_null(kv_slice_ptr(&l, &p, t[1], 0, 0));
    assert_ptr_equal(kv_slice_ptr(&l, &p, t[5], 2, 1),
                     dev + 5 * kv_block_bytes(&l) + 3 * kv_slice_bytes(&l));
    /* the local allocator counts blocks in use; a dropped ref releases nothing */
    struct kv_local *k;
    assert_int_equal(kv_local_create(&k, &l, 3, 2), 0);
    struct kv_block_ref a;
    assert_int_equal(kv_local_alloc(k, KV_DEVICE, &a), 0);
    assert_int_equal(kv_local_used(k, KV_DEVICE), 1);
    kv_local_release(k, t[1]);
    struct kv_block_ref none = {KV_REF_NONE, KV_DEVICE};
    assert_int_equal(kv_local_migrate(k, &none, KV_HOST), 0);
    assert_int_equal(none.index, KV_REF_NONE);
    assert_int_equal(kv_local_used(k, KV_HOST), 0);
    kv_local_release(k, a);
    assert_int_equal(kv_local_used(k, KV_DEVICE), 0);
    kv_local_destroy(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_local_alloc_migrate),
        cmocka_unit_test(test_local_mem_ops),
        cmocka_unit_test(test_stage_passes),
        cmocka_unit_test(test_window_geometry),
        cmocka_unit_test(test_window_bytes),
        cmocka_unit_test(test_window_tables),
        cmocka_unit_test(test_geometry_8bit),
        cmocka_unit_test(test_e4m3),
        cmocka_unit_test(test_q8_levels),
        cmocka_unit_test(test_8bit_nan),
        cmocka_unit_test(test_row_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
