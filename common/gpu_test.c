/* gpu_test.c - handle hex round trip; without a gpu every call says RKV_ENODEV; with one,
 * a slab, a pinned pool and copies between them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/gpu.h"

static void test_handle_hex(void **state)
{
    (void)state;
    uint8_t h[RKV_GPU_IPC_BYTES], back[RKV_GPU_IPC_BYTES];
    for (int i = 0; i < RKV_GPU_IPC_BYTES; i++)
        h[i] = (uint8_t)(i * 37 + 5);
    char hex[RKV_GPU_HEX_LEN + 1];
    rkv_gpu_handle_hex(h, hex);
    assert_int_equal(strlen(hex), RKV_GPU_HEX_LEN);
    assert_memory_equal(hex, "052a4f74", 8);
    assert_int_equal(rkv_gpu_handle_parse(hex, back), 0);
    assert_memory_equal(h, back, sizeof h);
    /* upper case is taken too */
    hex[0] = 'A';
    assert_int_equal(rkv_gpu_handle_parse(hex, back), 0);
    assert_int_equal(back[0], 0xA5);
    hex[5] = 'g';
    assert_int_equal(rkv_gpu_handle_parse(hex, back), RKV_EFORMAT);
    assert_int_equal(rkv_gpu_handle_parse("00ff", back), RKV_EFORMAT);
    assert_int_equal(rkv_gpu_handle_parse(NULL, back), RKV_EFORMAT);
}

static void test_no_gpu(void **state)
{
    (void)state;
    if (rkv_gpu_count() > 0)
        skip();
    assert_int_equal(rkv_gpu_count(), RKV_ENODEV);
    assert_true(strlen(rkv_gpu_why()) > 10);
    void *p = (void *)1;
    uint8_t h[RKV_GPU_IPC_BYTES];
    assert_int_equal(rkv_gpu_alloc(0, 4096, &p, h), RKV_ENODEV);
    assert_null(p);
    assert_int_equal(rkv_gpu_ipc_open(0, h, &p), RKV_ENODEV);
    char buf[64];
    assert_int_equal(rkv_gpu_host_register(buf, sizeof buf), RKV_ENODEV);
    assert_int_equal(rkv_gpu_copy(0, buf, buf + 32, 32), RKV_ENODEV);
    assert_int_equal(rkv_gpu_copy_async(0, RKV_GPU_LANE_H2D, buf, buf + 32, 32), RKV_ENODEV);
    assert_int_equal(rkv_gpu_copy_wait(0), RKV_ENODEV);
    rkv_gpu_free(0, NULL);
    rkv_gpu_host_unregister(buf);
}

static void test_slab_and_copies(void **state)
{
    (void)state;
    if (rkv_gpu_count() <= 0)
        skip();
    size_t n = 4 << 20;
    void *d = NULL;
    uint8_t h[RKV_GPU_IPC_BYTES] = {0}, zero[RKV_GPU_IPC_BYTES] = {0};
    assert_int_equal(rkv_gpu_alloc(0, n, &d, h), 0);
    assert_non_null(d);
    assert_memory_not_equal(h, zero, sizeof h);
    uint8_t *host = aligned_alloc(4096, n), *back = aligned_alloc(4096, n);
    for (size_t i = 0; i < n; i++)
        host[i] = (uint8_t)(i * 7);
    assert_int_equal(rkv_gpu_host_register(host, n), 0);
    assert_int_equal(rkv_gpu_copy(0, d, host, n), 0);
    assert_int_equal(rkv_gpu_copy(0, (uint8_t *)d + n / 2, d, n / 2), 0); /* d2d */
    assert_int_equal(rkv_gpu_copy(0, back, d, n), 0);
    assert_memory_equal(back, host, n / 2);
    assert_memory_equal(back + n / 2, host, n / 2);
    /* the lanes: host -> device of the second half while the first half goes back; one wait
     * finishes both */
    uint8_t *host2 = aligned_alloc(4096, n);
    for (size_t i = 0; i < n; i++)
        host2[i] = (uint8_t)(i * 13 + 1);
    assert_int_equal(rkv_gpu_host_register(host2, n), 0);
    memset(back, 0, n);
    assert_int_equal(rkv_gpu_host_register(back, n), 0);
    assert_int_equal(rkv_gpu_copy_async(0, RKV_GPU_LANE_D2H, back, d, n / 2), 0);
    assert_int_equal(
        rkv_gpu_copy_async(0, RKV_GPU_LANE_H2D, (uint8_t *)d + n / 2, host2 + n / 2, n / 2), 0);
    assert_int_equal(rkv_gpu_copy_wait(0), 0);
    assert_int_equal(
        rkv_gpu_copy_async(0, RKV_GPU_LANE_D2H, back + n / 2, (uint8_t *)d + n / 2, n / 2), 0);
    assert_int_equal(rkv_gpu_copy_wait(0), 0);
    assert_memory_equal(back, host, n / 2);
    assert_memory_equal(back + n / 2, host2 + n / 2, n / 2);
    assert_int_equal(rkv_gpu_copy_async(0, RKV_GPU_LANES, back, d, 16), RKV_EINVAL);
    rkv_gpu_host_unregister(back);
    rkv_gpu_host_unregister(host2);
    free(host2);
    size_t fr = 0, tot = 0;
    assert_int_equal(rkv_gpu_mem_info(0, &fr, &tot), 0);
    assert_true(fr > 0 && fr < tot);
    void *d99 = NULL;
    assert_int_equal(rkv_gpu_alloc(99, n, &d99, h), RKV_ENODEV);
    assert_null(d99);
    rkv_gpu_host_unregister(host);
    rkv_gpu_free(0, d);
    free(host);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handle_hex),
        cmocka_unit_test(test_no_gpu),
        cmocka_unit_test(test_slab_and_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
