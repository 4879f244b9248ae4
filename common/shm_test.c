/* shm_test.c - two mappings of one region share bytes; names and sizes are checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/shm.h"

static void test_share(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof name, "/rkv-test-%d", (int)getpid());
    struct rkv_shm a, b;
    assert_int_equal(rkv_shm_create(&a, name, 1 << 20), 0);
    assert_int_equal(rkv_shm_open(&b, name, 1 << 20), 0);
    memcpy(a.base, "kv bytes", 9);
    assert_string_equal(b.base, "kv bytes");
    rkv_shm_close(&b);
    struct rkv_shm c;
    assert_int_equal(rkv_shm_open(&c, name, 2 << 20), RKV_EFORMAT);
    rkv_shm_close(&a);
    assert_true(rkv_shm_open(&c, name, 1 << 20) < 0); /* the owner removed it */
    assert_int_equal(rkv_shm_create(&a, "no-slash", 10), RKV_EINVAL);
    assert_int_equal(rkv_shm_create(&a, "/a/b", 10), RKV_EINVAL);
    assert_int_equal(rkv_shm_create(&a, name, 0), RKV_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_share)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
