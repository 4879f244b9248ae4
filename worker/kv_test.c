/* kv_test.c - kv block geometry and the local block allocator. */
#include <math.h>
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
    assert_int_equal(kv_local_init(&k, &l, 2, 1), 0);
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
    kv_local_free(k);
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
    kv_local_free(k);
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

/* the split host read: the oldest share of the host blocks a decode row reads goes to the
 * cpu, whose view keeps exactly those and hides the rest behind device block 0 */
static void test_host_cpu_share(void **state)
{
    (void)state;
    const struct kv_block_ref t[] = {{7, KV_DEVICE}, {3, KV_HOST}, {4, KV_HOST}, {9, KV_DEVICE},
                                     {5, KV_HOST},   {6, KV_HOST}, {8, KV_HOST}};
    uint32_t n_read = 0;
    /* block size 16, last position 95: blocks 0..5 are read, host blocks 1, 2, 4, 5 */
    assert_int_equal(kv_host_cpu_share(t, 7, 16, 95, 1, 40, &n_read), 2); /* 1.6 rounds to 2 */
    assert_int_equal(n_read, 4);
    assert_int_equal(kv_host_cpu_share(t, 7, 16, 95, 1, 100, NULL), 4);
    assert_int_equal(kv_host_cpu_share(t, 7, 16, 95, 1, 10, NULL), 0);
    assert_int_equal(kv_host_cpu_share(t, 7, 16, 95, 1, 0, NULL), 0);
    assert_int_equal(kv_host_cpu_share(t, 7, 16, 95, 1, 250, NULL), 4); /* at most all */
    /* a prefill row never splits, but its read blocks are still counted */
    assert_int_equal(kv_host_cpu_share(t, 7, 16, 111, 64, 40, &n_read), 0);
    assert_int_equal(n_read, 5);
    struct kv_block_ref v[7];
    kv_host_cpu_view(t, 7, 2, v);
    const struct kv_block_ref want[] = {{7, KV_DEVICE}, {3, KV_HOST},   {4, KV_HOST},
                                        {9, KV_DEVICE}, {0, KV_DEVICE}, {0, KV_DEVICE},
                                        {0, KV_DEVICE}};
    for (int j = 0; j < 7; j++) {
        assert_int_equal(v[j].index, want[j].index);
        assert_int_equal(v[j].residency, want[j].residency);
    }
    /* no share: every host block hidden; all of them: the table as it is */
    kv_host_cpu_view(t, 7, 0, v);
    for (int j = 0; j < 7; j++)
        assert_int_equal(v[j].residency, KV_DEVICE);
    kv_host_cpu_view(t, 7, 5, v);
    for (int j = 0; j < 7; j++) {
        assert_int_equal(v[j].index, t[j].index);
        assert_int_equal(v[j].residency, t[j].residency);
    }
}

/* the balanced split share against a simulated step: 32 layers of a tail of nb blocks of 8 MiB,
 * the cpu's part k blocks at cpu GB/s, the gpu's the rest at link GB/s, each side's time off by up
 * to +-noise (a fixed-seed lcg); a layer takes the longer side */
struct bal_sys {
    double cpu_gbps, link_gbps, noise;
    uint32_t nb;
    uint64_t seed;
};

static double bal_rand(struct bal_sys *y) /* -1..1 */
{
    y->seed = y->seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(y->seed >> 11) / (double)(1ull << 52) - 1;
}

/* one step at b's share; returns its time in us */
static double bal_step(struct kv_split_bal *b, struct bal_sys *y)
{
    const double blk = 8 << 20;
    const uint32_t k = (uint32_t)(b->share * y->nb + 0.5);
    uint32_t cpu_last = 0;
    double t = 0;
    for (int layer = 0; layer < 32; layer++) {
        const double tc = k * blk / (y->cpu_gbps * 1e3) * (1 + y->noise * bal_rand(y)),
                     tg = (y->nb - k) * blk / (y->link_gbps * 1e3) * (1 + y->noise * bal_rand(y));
        cpu_last += tc > tg;
        t += tc > tg ? tc : tg;
    }
    kv_split_bal_step(b, 32, cpu_last);
    return t;
}

/* the best share's step time without noise: cpu / (cpu + link) of the blocks, rounded either
 * way */
static double bal_best_us(const struct bal_sys *y)
{
    const double blk = 8 << 20, s = y->cpu_gbps / (y->cpu_gbps + y->link_gbps);
    double best = 1e30;
    for (uint32_t k = (uint32_t)(s * y->nb); k <= (uint32_t)(s * y->nb) + 1; k++) {
        const double tc = k * blk / (y->cpu_gbps * 1e3),
                     tg = (y->nb - k) * blk / (y->link_gbps * 1e3);
        best = fmin(best, 32 * fmax(tc, tg));
    }
    return best;
}

/* runs n steps; returns the mean step time of the last half */
static double bal_run(struct kv_split_bal *b, struct bal_sys *y, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const double t = bal_step(b, y);
        sum += i >= n / 2 ? t : 0;
    }
    return sum / (n - n / 2);
}

static void test_split_balance(void **state)
{
    (void)state;
    struct kv_split_bal b;
    /* the H200 host's rates (cpu 58 GB/s beside the link's 54) over a b=1 32k tail of 115
     * blocks, 5 % noise: from a share too low (a probe that met a busy cpu) and one too high,
     * it lands on the even one (58 / 112 = 0.518) within a dozen steps and then stays within
     * 3 % of the best step time */
    const double starts[] = {0.30, 0.42, 0.80};
    for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
        struct bal_sys y = {58, 54, 0.05, 115, 1 + i};
        kv_split_bal_init(&b, starts[i], 0.9);
        for (int s = 0; s < 12; s++)
            bal_step(&b, &y);
        assert_true(fabs(b.share - 58.0 / 112) < 0.04);
        assert_true(bal_run(&b, &y, 200) <= 1.03 * bal_best_us(&y));
        assert_true(fabs(b.share - 58.0 / 112) < 0.04);
        assert_int_equal(b.steps, 212);
    }
    /* the cpu halves (another process took it) and comes back: the share follows each way */
    struct bal_sys y = {58, 54, 0.05, 115, 7};
    kv_split_bal_init(&b, 0.52, 0.9);
    bal_run(&b, &y, 40);
    y.cpu_gbps = 29;
    for (int s = 0; s < 15; s++)
        bal_step(&b, &y);
    assert_true(fabs(b.share - 29.0 / 83) < 0.04);
    assert_true(bal_run(&b, &y, 100) <= 1.03 * bal_best_us(&y));
    y.cpu_gbps = 58;
    for (int s = 0; s < 15; s++)
        bal_step(&b, &y);
    assert_true(fabs(b.share - 58.0 / 112) < 0.04);
    /* a cpu far slower than the link: down to the floor, not off (the layers keep telling);
     * one far faster: up to the cap */
    y.cpu_gbps = 0.5;
    bal_run(&b, &y, 40);
    assert_true(b.share == KV_SPLIT_BAL_MIN);
    y.cpu_gbps = 5000;
    bal_run(&b, &y, 40);
    assert_true(b.share == 0.9);
    /* an update moves it by the step x the layers' margin; the step grows by half while the
     * sign holds and halves when it turns, within its bounds; nothing told, nothing moves; a
     * count past n is taken as n */
    kv_split_bal_init(&b, 0.5, 0.9);
    assert_true(fabs(kv_split_bal_step(&b, 32, 0) - 0.55) < 1e-12); /* 0.05 x 1 */
    assert_true(fabs(kv_split_bal_step(&b, 32, 16) - 0.55) < 1e-12);
    assert_true(fabs(kv_split_bal_step(&b, 32, 8) - (0.55 + 0.075 * 0.5)) < 1e-12);
    assert_true(fabs(kv_split_bal_step(&b, 32, 99) - (0.5875 - 0.0375)) < 1e-12);
    assert_true(kv_split_bal_step(&b, 0, 0) == b.share && b.steps == 4);
    for (int i = 0; i < 20; i++)
        kv_split_bal_step(&b, 32, i % 2 ? 0 : 32);
    assert_true(b.step == KV_SPLIT_BAL_STEP_MIN);
    for (int i = 0; i < 20; i++)
        kv_split_bal_step(&b, 32, 32);
    assert_true(b.step == KV_SPLIT_BAL_STEP_MAX && b.share == KV_SPLIT_BAL_MIN);
    /* the start and the cap are clamped */
    kv_split_bal_init(&b, 0, 0.9);
    assert_true(b.share == KV_SPLIT_BAL_MIN);
    kv_split_bal_init(&b, 0.95, 0.6);
    assert_true(b.share == 0.6 && b.max == 0.6);
}

static void test_split_spread(void **state)
{
    (void)state;
    uint32_t n[] = {2, 3, 0, 2, 1}, out[5];
    for (uint32_t k = 0; k <= 9; k++) {
        kv_split_spread(n, 5, k, out);
        uint32_t sum = 0;
        for (int s = 0; s < 5; s++) {
            assert_true(out[s] <= n[s]);
            sum += out[s];
        }
        assert_int_equal(sum, k > 8 ? 8 : k); /* at most every block */
    }
    kv_split_spread(n, 5, 4, out); /* half of each, the halves rounded along the way */
    assert_int_equal(out[0] + out[1], 2 + (out[1] == 2));
    assert_int_equal(out[2], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),       cmocka_unit_test(test_local_alloc_migrate),
        cmocka_unit_test(test_local_mem_ops),  cmocka_unit_test(test_stage_passes),
        cmocka_unit_test(test_host_cpu_share), cmocka_unit_test(test_split_balance),
        cmocka_unit_test(test_split_spread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
