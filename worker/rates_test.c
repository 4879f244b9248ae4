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

static void test_cpu_rates(void **state)
{
    (void)state;
    struct backend_opts bo = {"cpu", 2, 0};
    struct backend *be;
    char err[256];
    assert_int_equal(backend_create(&bo, &be, err, sizeof err), 0);
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
    assert_int_equal(backend_set_kv(be, &l, p), 0);
    struct rates_opts o = {&l, p, {4, 2, 16, 0.25f}, -1, 2, 10};
    struct rates r;
    assert_int_equal(rates_measure(be, &o, &r), 0);
    check_rate(r.attn_device_gbps);
    check_rate(r.attn_host_gbps);
    check_rate(r.attn_cpu_gbps);
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

/* an empty device pool: its rate is unknown (0), the rest still measured */
static void test_empty_pool(void **state)
{
    (void)state;
    struct backend_opts bo = {"cpu", 1, 0};
    struct backend *be;
    char err[256];
    assert_int_equal(backend_create(&bo, &be, err, sizeof err), 0);
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
        cmocka_unit_test(test_empty_pool),
        cmocka_unit_test(test_split_rates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
