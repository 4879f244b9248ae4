/* hosttail_test.c - the host-tail tactic's rules (the rate rules' cases are in util_test.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/hosttail.h"

/* a split step's tail against its two gates: 1 ms to split, 1.2 ms to split off the thread */
static void test_split_mode(void **state)
{
    (void)state;
    assert_int_equal(hosttail_split_mode(999.9, 1000, 1200), HOSTTAIL_SPLIT_OFF);
    assert_int_equal(hosttail_split_mode(1000.0, 1000, 1200), HOSTTAIL_SPLIT_INLINE);
    assert_int_equal(hosttail_split_mode(1199.9, 1000, 1200), HOSTTAIL_SPLIT_INLINE);
    assert_int_equal(hosttail_split_mode(1200.0, 1000, 1200), HOSTTAIL_SPLIT_ASYNC);
    /* no gates: every tail splits off the thread; a gate past the other: never async first */
    assert_int_equal(hosttail_split_mode(0.0, 0, 0), HOSTTAIL_SPLIT_ASYNC);
    assert_int_equal(hosttail_split_mode(1500.0, 2000, 1200), HOSTTAIL_SPLIT_OFF);
    assert_int_equal(hosttail_split_mode(2500.0, 2000, 1200), HOSTTAIL_SPLIT_ASYNC);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
