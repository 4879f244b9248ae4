/* hosttail_test.c - CPU_TAIL's rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/hosttail.h"

/* the cpu must beat the slower of the link and the host-pool read rate */
static void test_cpu_tail_rule(void **state)
{
    (void)state;
    assert_false(hosttail_cpu_faster(55.0, 51.0, 35.0, 0)); /* the H200's host: the link wins */
    assert_true(hosttail_cpu_faster(12.0, 51.0, 35.0, 0));  /* a slow link */
    assert_true(hosttail_cpu_faster(55.0, 20.0, 35.0, 0));  /* slow host-pool reads */
    assert_true(hosttail_cpu_faster(0.0, 20.0, 35.0, 0));   /* no link: the read rate alone */
    assert_false(hosttail_cpu_faster(0.0, 0.0, 35.0, 0));   /* nothing known: never */
    assert_false(hosttail_cpu_faster(12.0, 51.0, 0.0, 0));  /* cpu unknown */
    assert_false(hosttail_cpu_faster(35.0, 51.0, 35.0, 0)); /* a tie keeps the gpu */
    /* a cpu faster than the link still loses to the split, where the two rates add up */
    assert_true(hosttail_cpu_faster(55.0, 51.0, 62.0, 0));
    assert_false(hosttail_cpu_faster(55.0, 51.0, 62.0, 110.0));
    assert_true(hosttail_cpu_faster(12.0, 12.0, 62.0, 60.0)); /* a split slower than the cpu */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_tail_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
