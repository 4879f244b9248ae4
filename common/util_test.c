/* util_test.c - clocks, spawn, growable array, u64 map and integer environment variables. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/util.h"

static void test_clock(void **state)
{
    (void)state;
    uint64_t a = rkv_now_ns();
    rkv_sleep_ms(2);
    assert_true(rkv_now_ns() - a >= 2000000);
    assert_true(rkv_wall_ms() > 1600000000000ull);
}

static void test_spawn(void **state)
{
    (void)state;
    pid_t pid;
    char *argv[] = {"/bin/sh", "-c", "exit 7", NULL};
    assert_int_equal(rkv_spawn("/bin/sh", argv, NULL, &pid), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 7);
    char *bad[] = {"/nonexistent/rkv", NULL};
    int rc = rkv_spawn("/nonexistent/rkv", bad, NULL, &pid);
    if (rc == 0 && getenv("RKV_VALGRIND")) {
        /* valgrind runs posix_spawn's vfork as a plain fork: the exec error comes back as the
         * child's exit status 127, not from posix_spawn */
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 127);
    } else {
        assert_true(rc < 0);
    }
    char dir[4096];
    assert_int_equal(rkv_exe_dir(dir, sizeof dir), 0);
    assert_true(dir[0] == '/');
    assert_int_equal(access(dir, X_OK), 0);
}

/* doubling from the first size, the buffer's bytes kept, nothing done when it fits */
static void test_grow(void **state)
{
    (void)state;
    char *b = NULL;
    size_t cap = 0;
    assert_int_equal(rkv_grow((void **)&b, &cap, 0, 16), 0);
    assert_null(b);
    assert_int_equal(rkv_grow((void **)&b, &cap, 5, 16), 0);
    assert_int_equal(cap, 16);
    memcpy(b, "abcd", 5);
    assert_int_equal(rkv_grow((void **)&b, &cap, 40, 16), 0);
    assert_int_equal(cap, 64);
    assert_string_equal(b, "abcd");
    char *same = b;
    assert_int_equal(rkv_grow((void **)&b, &cap, 64, 16), 0);
    assert_ptr_equal(b, same);
    assert_int_equal(rkv_grow((void **)&b, &cap, SIZE_MAX, 16), RKV_ENOMEM);
    assert_ptr_equal(b, same);
    free(b);
}

static void test_vec(void **state)
{
    (void)state;
    struct rkv_vec v;
    rkv_vec_init(&v, sizeof(int));
    for (int i = 0; i < 1000; i++)
        assert_non_null(rkv_vec_push(&v, &i));
    assert_int_equal(v.len, 1000);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(*rkv_vec_at(&v, int, i), i);
    rkv_vec_fini(&v);
}

static void test_map_against_array(void **state)
{
    (void)state;
    /* random puts/deletes mirrored in a plain array */
    enum { N = 4096 };
    static void *mirror[N];
    memset(mirror, 0, sizeof mirror);
    struct rkv_map m;
    rkv_map_init(&m);
    uint64_t x = 12345;
    for (int step = 0; step < 200000; step++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = 1 + (x >> 33) % (N - 1);
        if ((x >> 20) & 1) {
            void *val = (void *)(uintptr_t)(step + 1);
            assert_int_equal(rkv_map_put(&m, k, val), 0);
            mirror[k] = val;
        } else {
            assert_ptr_equal(rkv_map_del(&m, k), mirror[k]);
            mirror[k] = NULL;
        }
    }
    size_t count = 0;
    for (uint64_t k = 1; k < N; k++) {
        assert_ptr_equal(rkv_map_get(&m, k), mirror[k]);
        count += mirror[k] != NULL;
    }
    assert_int_equal(m.len, count);
    size_t it = 0, seen = 0;
    uint64_t key;
    void *val;
    while (rkv_map_next(&m, &it, &key, &val)) {
        assert_ptr_equal(mirror[key], val);
        seen++;
    }
    assert_int_equal(seen, count);
    assert_int_equal(rkv_map_put(&m, 0, NULL), RKV_EINVAL);
    rkv_map_fini(&m);
}

/* unset: the default; a number in range: it; anything else: the default */
/* a file whole, NUL-terminated; a missing one by errno, one past the limit refused */
static void test_read_file(void **state)
{
    (void)state;
    char path[] = "/tmp/rkv-util-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    char big[100000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)('a' + i % 26);
    assert_int_equal(write(fd, big, sizeof big), (ssize_t)sizeof big);
    close(fd);
    char *buf = NULL;
    size_t n = 0;
    assert_int_equal(rkv_read_file(path, 0, &buf, &n), 0);
    assert_int_equal(n, sizeof big);
    assert_memory_equal(buf, big, n);
    assert_int_equal(buf[n], 0);
    free(buf);
    assert_int_equal(rkv_read_file(path, 1000, &buf, &n), RKV_ETOOBIG);
    assert_int_equal(rkv_read_file(path, sizeof big, &buf, &n), 0);
    free(buf);
    unlink(path);
    assert_int_equal(rkv_read_file(path, 0, &buf, &n), -ENOENT);
}

static void test_env_u64(void **state)
{
    (void)state;
    const char *n = "RKV_UTIL_TEST_MS";
    unsetenv(n);
    assert_int_equal(rkv_env_u64(n, 10000, 100, 3600000), 10000);
    setenv(n, "250", 1);
    assert_int_equal(rkv_env_u64(n, 10000, 100, 3600000), 250);
    setenv(n, "100", 1);
    assert_int_equal(rkv_env_u64(n, 10000, 100, 3600000), 100);
    static const char *bad[] = {"", "99", "3600001", "-5", "12ms", "1e3", " 5",
                                "99999999999999999999"};
    for (size_t i = 0; i < RKV_ARRAY_LEN(bad); i++) {
        setenv(n, bad[i], 1);
        assert_int_equal(rkv_env_u64(n, 10000, 100, 3600000), 10000);
    }
    unsetenv(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clock),
        cmocka_unit_test(test_grow),
        cmocka_unit_test(test_spawn),
        cmocka_unit_test(test_vec),
        cmocka_unit_test(test_map_against_array),
        cmocka_unit_test(test_env_u64),
        cmocka_unit_test(test_read_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
