/* err_test.c - rkv_strerror covers rkv codes and errno values. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"

static void test_known_codes(void **state)
{
    (void)state;
    for (int e = RKV_ESTALE; e <= RKV_EINVAL; e++)
        assert_string_not_equal(rkv_strerror(e), "unknown error");
    assert_string_equal(rkv_strerror(0), "success");
    assert_string_equal(rkv_strerror(-ENOENT), strerror(ENOENT));
    assert_string_equal(rkv_strerror(-5000), "unknown error");
    assert_string_equal(rkv_strerror(7), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
