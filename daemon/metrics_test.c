/* metrics_test.c - exact Prometheus text for counters, gauges, labelled histograms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/metrics.h"

static void test_render(void **state)
{
    (void)state;
    struct metrics *m;
    assert_int_equal(metrics_create(&m), 0);
    static const char *const model[] = {"model_name", NULL};
    static const double b[] = {0.1, 1};
    struct metric *c = metrics_add(m, METRIC_COUNTER, "rkv:prompt_tokens_total",
                                   "Prompt tokens processed.", model, NULL, 0);
    struct metric *g = metrics_add(m, METRIC_GAUGE, "rkv:num_requests_running",
                                   "Requests running.", NULL, NULL, 0);
    struct metric *h = metrics_add(m, METRIC_HISTOGRAM, "rkv:time_to_first_token_seconds",
                                   "TTFT.", model, b, 2);
    const char *lv[] = {"tiny \"q\"\n"};
    metric_inc(c, lv, 5);
    metric_inc(c, lv, 2);
    metric_set(g, NULL, 3);
    metric_observe(h, lv, 0.05);
    metric_observe(h, lv, 0.5);
    metric_observe(h, lv, 7.25);
    assert_true(metric_get(c, lv) == 7);
    assert_true(metric_count(h, lv) == 3);
    char *out;
    size_t len;
    assert_int_equal(metrics_render(m, &out, &len), 0);
    const char *want =
        "# HELP rkv:prompt_tokens_total Prompt tokens processed.\n"
        "# TYPE rkv:prompt_tokens_total counter\n"
        "rkv:prompt_tokens_total{model_name=\"tiny \\\"q\\\"\\n\"} 7\n"
        "# HELP rkv:num_requests_running Requests running.\n"
        "# TYPE rkv:num_requests_running gauge\n"
        "rkv:num_requests_running 3\n"
        "# HELP rkv:time_to_first_token_seconds TTFT.\n"
        "# TYPE rkv:time_to_first_token_seconds histogram\n"
        "rkv:time_to_first_token_seconds_bucket{model_name=\"tiny \\\"q\\\"\\n\",le=\"0.1\"} 1\n"
        "rkv:time_to_first_token_seconds_bucket{model_name=\"tiny \\\"q\\\"\\n\",le=\"1\"} 2\n"
        "rkv:time_to_first_token_seconds_bucket{model_name=\"tiny \\\"q\\\"\\n\",le=\"+Inf\"} 3\n"
        "rkv:time_to_first_token_seconds_sum{model_name=\"tiny \\\"q\\\"\\n\"} 7.8\n"
        "rkv:time_to_first_token_seconds_count{model_name=\"tiny \\\"q\\\"\\n\"} 3\n";
    assert_string_equal(out, want);
    assert_int_equal(len, strlen(want));
    free(out);
    metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_render)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
