/* ratelimit_test.c - token buckets and in-flight counts, on a clock the test moves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "daemon/ratelimit.h"

static void test_requests_per_window(void **state)
{
    (void)state;
    struct rl *rl;
    assert_int_equal(rl_create(60000, &rl), 0);
    struct rl_limits lim = {.rpm = 3};
    struct rl_verdict v;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rl_admit(rl, 7, &lim, 1000, &v), 0);
        assert_int_equal(v.refused, RL_OK);
        assert_int_equal(v.limit_req, 3);
        assert_int_equal(v.remaining_req, 2 - i);
        assert_int_equal(v.limit_tok, 0);
        rl_done(rl, 7, 100, 1000);
    }
    /* the 4th in the same instant: one request refills in 20 s */
    assert_int_equal(rl_admit(rl, 7, &lim, 1000, &v), RKV_EBUSY);
    assert_int_equal(v.refused, RL_REQUESTS);
    assert_int_equal(v.retry_ms, 20001);
    assert_int_equal(v.remaining_req, 0);
    assert_int_equal(v.reset_req_ms, 60001);
    /* another key is not affected */
    assert_int_equal(rl_admit(rl, 8, &lim, 1000, &v), 0);
    rl_done(rl, 8, 0, 1000);
    /* 19.9 s later still refused, at 20 s admitted */
    assert_int_equal(rl_admit(rl, 7, &lim, 20900, &v), RKV_EBUSY);
    assert_int_equal(v.retry_ms, 101);
    assert_int_equal(rl_admit(rl, 7, &lim, 21000, &v), 0);
    assert_int_equal(v.remaining_req, 0);
    rl_done(rl, 7, 0, 21000);
    /* a full window later the bucket is full, not fuller */
    assert_int_equal(rl_admit(rl, 7, &lim, 500000, &v), 0);
    assert_int_equal(v.remaining_req, 2);
    rl_done(rl, 7, 0, 500000);
    assert_int_equal(rl_keys(rl), 2);
    rl_destroy(rl);
}

static void test_tokens_charged_at_the_end(void **state)
{
    (void)state;
    struct rl *rl;
    assert_int_equal(rl_create(1000, &rl), 0);
    struct rl_limits lim = {.tpm = 100};
    struct rl_verdict v;
    assert_int_equal(rl_admit(rl, 1, &lim, 0, &v), 0);
    assert_int_equal(v.remaining_tok, 100);
    assert_int_equal(v.limit_req, 0);
    /* prompt 30 + completion 120: the bucket goes 50 into debt */
    rl_done(rl, 1, 150, 0);
    assert_int_equal(rl_admit(rl, 1, &lim, 0, &v), RKV_EBUSY);
    assert_int_equal(v.refused, RL_TOKENS);
    assert_int_equal(v.remaining_tok, 0);
    /* 51 tokens to refill at 100 per 1000 ms */
    assert_int_equal(v.retry_ms, 511);
    assert_int_equal(v.reset_tok_ms, 1501);
    assert_int_equal(rl_admit(rl, 1, &lim, 505, &v), RKV_EBUSY);
    assert_int_equal(rl_admit(rl, 1, &lim, 510, &v), 0);
    assert_int_equal(v.remaining_tok, 1);
    rl_done(rl, 1, 1, 510);
    rl_destroy(rl);
}

static void test_concurrent(void **state)
{
    (void)state;
    struct rl *rl;
    assert_int_equal(rl_create(60000, &rl), 0);
    struct rl_limits lim = {.max_concurrent = 2};
    struct rl_verdict v;
    assert_int_equal(rl_admit(rl, 3, &lim, 0, &v), 0);
    assert_int_equal(v.in_flight, 1);
    assert_int_equal(rl_admit(rl, 3, &lim, 0, &v), 0);
    assert_int_equal(rl_admit(rl, 3, &lim, 0, &v), RKV_EBUSY);
    assert_int_equal(v.refused, RL_CONCURRENT);
    assert_int_equal(v.in_flight, 2);
    assert_true(v.retry_ms > 0);
    rl_done(rl, 3, 0, 0);
    assert_int_equal(rl_admit(rl, 3, &lim, 0, &v), 0);
    rl_done(rl, 3, 0, 0);
    rl_done(rl, 3, 0, 0);
    /* a done without an admit (unknown key) changes nothing */
    rl_done(rl, 99, 5, 0);
    assert_int_equal(rl_keys(rl), 1);
    rl_destroy(rl);
}

static void test_live_change(void **state)
{
    (void)state;
    struct rl *rl;
    assert_int_equal(rl_create(60000, &rl), 0);
    struct rl_limits lim = {.rpm = 10};
    struct rl_verdict v;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(rl_admit(rl, 1, &lim, 0, &v), 0);
        rl_done(rl, 1, 0, 0);
    }
    /* lowered to 3: what was used (5) already exceeds the room left */
    lim.rpm = 3;
    assert_int_equal(rl_admit(rl, 1, &lim, 0, &v), 0);
    assert_int_equal(v.remaining_req, 2);
    rl_done(rl, 1, 0, 0);
    /* unlimited: admitted, headers report no limit */
    lim.rpm = 0;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(rl_admit(rl, 1, &lim, 0, &v), 0);
        assert_int_equal(v.limit_req, 0);
        rl_done(rl, 1, 0, 0);
    }
    /* limited again: starts full */
    lim.rpm = 2;
    assert_int_equal(rl_admit(rl, 1, &lim, 0, &v), 0);
    assert_int_equal(v.remaining_req, 1);
    rl_done(rl, 1, 0, 0);
    rl_destroy(rl);
}

static void test_duration_format(void **state)
{
    (void)state;
    char b[32];
    rl_format_duration(0, b, sizeof b);
    assert_string_equal(b, "0ms");
    rl_format_duration(250, b, sizeof b);
    assert_string_equal(b, "250ms");
    rl_format_duration(1000, b, sizeof b);
    assert_string_equal(b, "1s");
    rl_format_duration(7001, b, sizeof b);
    assert_string_equal(b, "8s");
    rl_format_duration(90000, b, sizeof b);
    assert_string_equal(b, "1m30s");
    struct rl *rl;
    assert_int_equal(rl_create(0, &rl), RKV_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_per_window),
        cmocka_unit_test(test_tokens_charged_at_the_end),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_live_change),
        cmocka_unit_test(test_duration_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
