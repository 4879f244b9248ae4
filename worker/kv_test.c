/* kv_test.c - kv block geometry and the local block allocator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_local_alloc_migrate),
        cmocka_unit_test(test_local_mem_ops),
        cmocka_unit_test(test_stage_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
