/* log_test.c - journald prefixes vs timestamps, levels, one line per event, rate limit. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/log.h"

/* runs fn with stderr redirected to a temp file and returns what it wrote */
static char *capture(void (*fn)(void), int journal)
{
    char path[] = "/tmp/rkv-log-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    if (journal) {
        struct stat st;
        fstat(STDERR_FILENO, &st);
        char js[64];
        snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
        setenv("JOURNAL_STREAM", js, 1);
    } else {
        unsetenv("JOURNAL_STREAM");
    }
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    static char buf[8192];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n < 0 ? 0 : n] = '\0';
    close(fd);
    unlink(path);
    unsetenv("JOURNAL_STREAM");
    return buf;
}

static void emit(void)
{
    rkv_log_init("rkvtest", RKV_LOG_INFO);
    log_info("hello %d", 42);
    log_debug("hidden");
    log_error("two\nlines");
}

static void test_journal_prefix(void **state)
{
    (void)state;
    char *out = capture(emit, 1);
    assert_string_equal(out, "<6>hello 42\n<3>two lines\n");
}

static void test_timestamps(void **state)
{
    (void)state;
    char *out = capture(emit, 0);
    assert_non_null(strstr(out, "rkvtest["));
    assert_non_null(strstr(out, "] info: hello 42\n"));
    assert_non_null(strstr(out, "] error: two lines\n"));
    assert_null(strstr(out, "hidden"));
    assert_true(out[4] == '-' && out[10] == 'T'); /* ISO 8601 */
}

static void burst(void)
{
    rkv_log_init("rkvtest", RKV_LOG_INFO);
    for (int i = 0; i < 100; i++)
        log_ratelimited(RKV_LOG_WARN, 60000, 3, "hot %d", i);
}

static void test_ratelimit(void **state)
{
    (void)state;
    char *out = capture(burst, 1);
    assert_string_equal(out, "<4>hot 0\n<4>hot 1\n<4>hot 2\n");
}

static void test_levels(void **state)
{
    (void)state;
    enum rkv_log_level l;
    assert_int_equal(rkv_log_parse_level("debug", &l), 0);
    assert_int_equal(l, RKV_LOG_DEBUG);
    assert_int_equal(rkv_log_parse_level("loud", &l), RKV_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_journal_prefix),
        cmocka_unit_test(test_timestamps),
        cmocka_unit_test(test_ratelimit),
        cmocka_unit_test(test_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
