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

/* the learned split share against a layer of the model it assumes, max(fix + s h / cpu,
 * (1 - s) h / link), with other rates than it starts from; blocks of 1 MiB */
struct split_sys {
    double fix_us, cpu_gbps, link_gbps;
};

static double split_layer_us(const struct split_sys *y, double h, double s, int *gpu_first)
{
    const double cpu_side = s > 0 ? y->fix_us + s * h / (y->cpu_gbps * 1e3) : 0,
                 gpu_side = (1 - s) * h / (y->link_gbps * 1e3);
    *gpu_first = gpu_side <= cpu_side;
    return cpu_side > gpu_side ? cpu_side : gpu_side;
}

/* runs n layers of h bytes in blocks of 1 MiB; returns the last layer's time */
static double split_run(struct kv_split_learn *l, const struct split_sys *y, double h, int n)
{
    const double blk = 1 << 20;
    double t = 0;
    for (int i = 0; i < n; i++) {
        const uint32_t nb = (uint32_t)(h / blk);
        const uint32_t k = (uint32_t)(kv_split_share(l, h, 0.9) * nb + 0.5);
        const double s = (double)k / nb;
        int first = 0;
        t = split_layer_us(y, h, s, &first);
        if (k)
            kv_split_observe(l, t, s * h / (y->cpu_gbps * 1e3), s * h, (1 - s) * h, first);
    }
    return t;
}

/* the best share's layer time, by search */
static double split_best_us(const struct split_sys *y, double h)
{
    double best = 1e30;
    for (int i = 0; i <= 900; i++) {
        int first;
        double t = split_layer_us(y, h, i / 1000.0, &first);
        best = t < best ? t : best;
    }
    return best;
}

static void test_split_share(void **state)
{
    (void)state;
    struct kv_split_learn l;
    kv_split_learn_init(&l, 400, 18.67, 50);
    /* a 46 MB layer tail (ramp just past the device on the H200): (920 - 400) / (920 + 2464) */
    assert_true(fabs(kv_split_share(&l, 46e6, 0.9) - 520.0 / 3384.0) < 1e-3);
    /* no gain: the chain alone as long as the link; a long tail: toward cpu / (cpu + link) */
    assert_true(kv_split_share(&l, 20e6, 0.9) == 0);
    assert_true(kv_split_share(&l, 0, 0.9) == 0);
    assert_true(fabs(kv_split_share(&l, 4e9, 0.9) - 18.67 / 68.67) < 2e-3);
    assert_true(kv_split_share(&l, 4e9, 0.1) == 0.1);
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

static void test_split_learns(void **state)
{
    (void)state;
    struct kv_split_learn l;
    /* a slower cpu and a longer chain than it starts from: it learns both and lands within 5 %
     * of the best share's layer time, under no split's */
    const struct split_sys y = {520, 14, 53};
    kv_split_learn_init(&l, 400, 18.67, 50);
    const double h = 46e6, t = split_run(&l, &y, h, 400), best = split_best_us(&y, h);
    assert_true(t <= best * 1.05);
    assert_true(t < 0.96 * h / (y.link_gbps * 1e3)); /* 795 us against 868 at best */
    assert_true(fabs(l.fix_us - 520) < 10 && fabs(l.cpu_gbps - 14) < 0.5);
    assert_true(l.n_cpu > 0);
    /* a link slower than it assumes (the cpu's reads share host memory with the copies): the
     * layers the gpu's part held up teach it the link, and the share grows */
    const struct split_sys slow = {400, 18.67, 35};
    kv_split_learn_init(&l, 400, 18.67, 50);
    const double s0 = kv_split_share(&l, 200e6, 0.9);
    const double t2 = split_run(&l, &slow, 200e6, 400);
    assert_true(l.n_link > 0 && fabs(l.link_gbps - 35) < 3);
    assert_true(kv_split_share(&l, 200e6, 0.9) > s0);
    assert_true(t2 <= split_best_us(&slow, 200e6) * 1.05);
    /* a link figure far too low (a few early layers held up by something else): the share
     * starts too high and every layer's cpu part is the slower; what the gpu's parts took at
     * most raises the figure and the share comes down, if not all the way */
    const struct split_sys fast = {300, 38, 50};
    kv_split_learn_init(&l, 300, 38, 23.6);
    const double s_low = kv_split_share(&l, 190e6, 0.9);
    split_run(&l, &fast, 190e6, 400);
    assert_true(l.link_gbps > 23.6 && kv_split_share(&l, 190e6, 0.9) < s_low);
    /* a chain too long for the split to pay: after the first layers it stays off, and a layer
     * takes what the link alone takes */
    const struct split_sys hopeless = {3000, 18.67, 50};
    kv_split_learn_init(&l, 400, 18.67, 50);
    const double t3 = split_run(&l, &hopeless, 46e6, 200);
    assert_true(kv_split_share(&l, 46e6, 0.9) * 43 < 0.5); /* not one block */
    assert_true(fabs(t3 - 46e6 / 50e3) < 1);
    /* samples from a stalled layer are dropped */
    kv_split_learn_init(&l, 400, 18.67, 50);
    kv_split_observe(&l, 2e5, 100, 1e6, 1e6, 1);
    kv_split_observe(&l, 500, 600, 1e6, 1e6, 1);
    assert_true(l.fix_us == 400 && l.n_cpu == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),       cmocka_unit_test(test_local_alloc_migrate),
        cmocka_unit_test(test_local_mem_ops),  cmocka_unit_test(test_stage_passes),
        cmocka_unit_test(test_host_cpu_share), cmocka_unit_test(test_split_share),
        cmocka_unit_test(test_split_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
