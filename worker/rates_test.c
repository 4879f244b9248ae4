/* rates_test.c - start-up rate measurement on the cpu backend over local pools. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "worker/backend.h"
#include "worker/kv.h"
#include "worker/rates.h"

static void check_rate(double r)
{
    assert_true(isfinite(r));
    assert_true(r > 0);
    assert_true(r < 1e5); /* GB/s: nothing here moves 100 TB/s */
}

/* the cpu backend with its threads */
static struct backend *cpu_backend(uint32_t threads)
{
    struct backend_opts bo = {"cpu", threads, 0};
    struct backend *be = NULL;
    char err[256];
    assert_int_equal(backend_create(&bo, &be, err, sizeof err), 0);
    return be;
}

/* every rate of be over pools p (set as its kv), each a plausible GB/s */
static struct rates measured(struct backend *be, const struct kv_layout *l,
                             const struct kv_pools *p, struct be_attn at)
{
    assert_int_equal(backend_set_kv(be, l, p), 0);
    struct rates_opts o = {l, p, at, -1, 2, 10};
    struct rates r;
    assert_int_equal(rates_measure(be, &o, &r), 0);
    check_rate(r.attn_device_gbps);
    check_rate(r.attn_host_gbps);
    check_rate(r.attn_cpu_gbps);
    return r;
}

static void test_cpu_rates(void **state)
{
    (void)state;
    struct backend *be = cpu_backend(2);
    /* the tiny preset's geometry: 4 layers, 2 kv heads of 16, f32, blocks of 64 */
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 64, 4, 2, 16, KV_F32), 0);
    struct kv_local *k;
    assert_int_equal(kv_local_create(&k, &l, 24, 40), 0);
    const struct kv_pools *p = kv_local_pools(k);
    /* the pools hold finite kv, as a live session's would */
    for (int r = 0; r < KV_N_POOLS; r++) {
        float *f = p->base[r];
        size_t n = (size_t)p->n_blocks[r] * kv_block_bytes(&l) / sizeof(float);
        for (size_t i = 0; i < n; i++)
            f[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    }
    struct rates r = measured(be, &l, p, (struct be_attn){4, 2, 16, 0.25f});
    assert_true(r.pcie_h2d_gbps == 0); /* cpu backend: no link */
    print_message("attn device %.2f host-stream %.2f cpu %.2f GB/s in %.1f ms\n",
                  r.attn_device_gbps, r.attn_host_gbps, r.attn_cpu_gbps, r.elapsed_ms);
    assert_true(r.elapsed_ms > 0 && r.elapsed_ms < 1000);

    /* the pools' contents are only read */
    const float *f = p->base[KV_HOST];
    assert_true(f[5] == (float)(((size_t)5 * 2654435761u) % 1000) / 1000.0f - 0.5f);
    kv_local_destroy(k);
    backend_destroy(be);
}

/* a sliding-window layout (a position block is a global part and local ones, a table n_parts
 * entries a position block): every rate is measured, as with one block a position block */
static void test_window_layout_rates(void **state)
{
    (void)state;
    struct backend *be = cpu_backend(2);
    /* gemma3-tiny's geometry: 7 layers, the sixth global, one kv head of 32, a window of 8 */
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 16, 7, 1, 32, KV_F32), 0);
    assert_int_equal(kv_layout_set_window(&l, 8, 6), 0);
    assert_true(l.n_parts > 1);
    struct kv_local *k;
    /* pools of a count no multiple of the parts: the passes round down */
    assert_int_equal(kv_local_create(&k, &l, 6 * l.n_parts + 1, 9 * l.n_parts + 2), 0);
    const struct kv_pools *p = kv_local_pools(k);
    for (int r = 0; r < KV_N_POOLS; r++)
        memset(p->base[r], 0, (size_t)p->n_blocks[r] * kv_block_bytes(&l));
    measured(be, &l, p, (struct be_attn){4, 1, 32, 0.18f});
    kv_local_destroy(k);
    backend_destroy(be);
}

/* an empty device pool: its rate is unknown (0), the rest still measured */
static void test_empty_pool(void **state)
{
    (void)state;
    struct backend *be = cpu_backend(1);
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 16, 2, 1, 8, KV_F16), 0);
    struct kv_local *k;
    assert_int_equal(kv_local_create(&k, &l, 4, 4), 0);
    struct kv_pools p = *kv_local_pools(k);
    memset(p.base[KV_HOST], 0, (size_t)p.n_blocks[KV_HOST] * kv_block_bytes(&l));
    p.n_blocks[KV_DEVICE] = 0;
    assert_int_equal(backend_set_kv(be, &l, &p), 0);
    struct rates_opts o = {&l, &p, {2, 1, 8, 0.35f}, -1, 1, 2};
    struct rates r;
    assert_int_equal(rates_measure(be, &o, &r), 0);
    assert_true(r.attn_device_gbps == 0);
    check_rate(r.attn_host_gbps);
    check_rate(r.attn_cpu_gbps);
    kv_local_destroy(k);
    backend_destroy(be);
}

/* the split's rates: the cpu attends one long row of the host pool while a second thread keeps
 * the link (here its stand-in, a memcpy out of the same pool) reading it */
static void test_split_rates(void **state)
{
    (void)state;
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 64, 4, 2, 16, KV_F16), 0);
    struct kv_local *k;
    assert_int_equal(kv_local_create(&k, &l, 4, 48), 0);
    struct kv_pools p = *kv_local_pools(k);
    uint16_t *h = p.base[KV_HOST];
    size_t n = (size_t)p.n_blocks[KV_HOST] * kv_block_bytes(&l) / sizeof *h;
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)(0x3000 + i % 0x800); /* finite f16 values */
    struct rates_opts o = {&l, &p, {4, 2, 16, 0.25f}, -1, 2, 10};
    struct split_rates sr;
    assert_int_equal(rates_split(&o, &sr), 0);
    check_rate(sr.cpu_gbps);
    check_rate(sr.link_gbps);
    /* the link ran beside the cpu: pieces landed while the cpu attended */
    assert_true(sr.link_pieces >= 1);
    print_message("split: cpu %.2f GB/s beside the link's stand-in %.2f (%u pieces)\n", sr.cpu_gbps,
                  sr.link_gbps, sr.link_pieces);
    assert_true(h[7] == (uint16_t)(0x3000 + 7) && h[n - 1] == (uint16_t)(0x3000 + (n - 1) % 0x800));

    /* no host pool: nothing to measure, nothing failed */
    p.n_blocks[KV_HOST] = 0;
    assert_int_equal(rates_split(&o, &sr), 0);
    assert_true(sr.cpu_gbps == 0 && sr.link_gbps == 0 && sr.link_pieces == 0);
#if RKV_CUDA
    /* a link that cannot run (no such gpu): the rates stay 0, so the worker falls back on the
     * rates measured apart, and the call does not fail */
    p.n_blocks[KV_HOST] = kv_local_pools(k)->n_blocks[KV_HOST];
    o.gpu = 9999;
    assert_int_equal(rates_split(&o, &sr), 0);
    assert_true(sr.cpu_gbps == 0 && sr.link_gbps == 0);
#endif
    kv_local_destroy(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_rates),
        cmocka_unit_test(test_window_layout_rates),
        cmocka_unit_test(test_empty_pool),
        cmocka_unit_test(test_split_rates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
