/* config_test.c - config keys from defaults, file, env and flags; bad input refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/err.h"

struct conf {
    char model[64];
    int64_t block_size;
    uint64_t vram_target;
    double host_frac;
    int verbose;
    int backend;
    int rotation;
};

static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
static const char *const rotations[] = {"off", "auto", "always", NULL};
static const struct cfg_key keys[] = {
    {"model", CFG_STR, offsetof(struct conf, model), 64, .def = "m.gguf", .help = "model"},
    {"block_size", CFG_INT, offsetof(struct conf, block_size), .min = 1, .max = 4096,
     .def = "256"},
    {"vram_target", CFG_SIZE, offsetof(struct conf, vram_target), .min = 0,
     .max = 1ll << 50, .def = "1GiB"},
    {"host_frac", CFG_DOUBLE, offsetof(struct conf, host_frac), .dmin = 0, .dmax = 1},
    {"verbose", CFG_BOOL, offsetof(struct conf, verbose)},
    {"backend", CFG_ENUM, offsetof(struct conf, backend), .names = backends, .def = "auto"},
    {"rotation", CFG_ENUM, offsetof(struct conf, rotation), .names = rotations, .def = "auto"},
};
static const struct cfg_spec spec = {"t", NULL, keys, 7, NULL};

static int load(struct conf *c, char *err, int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    int pos;
    return cfg_load(&spec, c, argc, argv, &pos, err, 512);
}

static void test_defaults_and_flags(void **state)
{
    (void)state;
    struct conf c;
    char err[512];
    char *a1[] = {"t", NULL};
    assert_int_equal(load(&c, err, 1, a1), 0);
    assert_string_equal(c.model, "m.gguf");
    assert_int_equal(c.block_size, 256);
    assert_int_equal(c.vram_target, 1ull << 30);
    char *a2[] = {"t", "--block-size", "16", "--vram-target=512MiB", "--verbose",
                  "--backend", "cpu", "--host-frac", "0.25", NULL};
    assert_int_equal(load(&c, err, 9, a2), 0);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.vram_target, 512ull << 20);
    assert_int_equal(c.verbose, 1);
    assert_int_equal(c.backend, 1);
    assert_true(c.host_frac == 0.25);
}

/* --no-KEY: a bool to false, an enum with "off" to off; other keys have no such form */
static void test_no_switch(void **state)
{
    (void)state;
    struct conf c;
    char err[512];
    char *a1[] = {"t", "--verbose", "--no-verbose", "--no-rotation", NULL};
    assert_int_equal(load(&c, err, 4, a1), 0);
    assert_int_equal(c.verbose, 0);
    assert_int_equal(c.rotation, 0);
    char *a2[] = {"t", "--no-rotation", "--rotation", "always", NULL};
    assert_int_equal(load(&c, err, 4, a2), 0);
    assert_int_equal(c.rotation, 2);
    char *a3[] = {"t", "--no-backend", NULL}; /* an enum without "off" */
    assert_int_equal(load(&c, err, 2, a3), RKV_ENOTFOUND);
    assert_non_null(strstr(err, "--no-backend"));
    char *a4[] = {"t", "--no-block-size", NULL};
    assert_int_equal(load(&c, err, 2, a4), RKV_ENOTFOUND);
    char *a5[] = {"t", "--no_verbose", NULL}; /* flags spell keys with dashes */
    assert_int_equal(load(&c, err, 2, a5), RKV_ENOTFOUND);
}

static void test_bad_values_named(void **state)
{
    (void)state;
    struct conf c;
    char err[512];
    char *a1[] = {"t", "--block-size", "0", NULL};
    assert_int_equal(load(&c, err, 3, a1), RKV_ERANGE);
    assert_non_null(strstr(err, "--block-size"));
    assert_non_null(strstr(err, "1..4096"));
    char *a2[] = {"t", "--vram-target", "lots", NULL};
    assert_int_equal(load(&c, err, 3, a2), RKV_EINVAL);
    assert_non_null(strstr(err, "--vram-target"));
    char *a3[] = {"t", "--backnd", "cpu", NULL};
    assert_int_equal(load(&c, err, 3, a3), RKV_ENOTFOUND);
    assert_non_null(strstr(err, "did you mean --backend"));
    char *a4[] = {"t", "--backend", "tpu", NULL};
    assert_int_equal(load(&c, err, 3, a4), RKV_EINVAL);
    assert_non_null(strstr(err, "auto|cpu|cuda"));
    char *a5[] = {"t", "--block-size", NULL};
    assert_int_equal(load(&c, err, 2, a5), RKV_EINVAL);
    char *a6[] = {"t", "--host-frac", "nan", NULL};
    assert_int_equal(load(&c, err, 3, a6), RKV_EINVAL);
}

static void test_file_env_precedence(void **state)
{
    (void)state;
    char path[] = "/tmp/rkv-config-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# comment\nblock_size = 32\nmodel = \"x.gguf\"\n\nvram_target=2GiB\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct conf c;
    char err[512];
    setenv("RKV_BLOCK_SIZE", "64", 1);
    char *a1[] = {"t", "--config", path, NULL};
    assert_int_equal(load(&c, err, 3, a1), 0);
    assert_int_equal(c.block_size, 64); /* env beats file */
    assert_string_equal(c.model, "x.gguf");
    assert_int_equal(c.vram_target, 2ull << 30);
    char *a2[] = {"t", "--config", path, "--block-size", "128", NULL};
    assert_int_equal(load(&c, err, 5, a2), 0);
    assert_int_equal(c.block_size, 128); /* flag beats env */
    unsetenv("RKV_BLOCK_SIZE");

    FILE *f = fopen(path, "w");
    fputs("block_size = 32\nvram_targt = 1GiB\n", f);
    fclose(f);
    assert_int_equal(load(&c, err, 3, a1), RKV_ENOTFOUND);
    assert_non_null(strstr(err, ":2: unknown key \"vram_targt\" (did you mean vram_target?)"));
    f = fopen(path, "w");
    fputs("block_size 32\n", f);
    fclose(f);
    assert_int_equal(load(&c, err, 3, a1), RKV_EFORMAT);
    assert_non_null(strstr(err, ":1:"));
    unlink(path);
    char *a3[] = {"t", "--config", path, NULL};
    assert_true(load(&c, err, 3, a3) < 0); /* an explicit file must exist */
    assert_non_null(strstr(err, path));
}

static void test_sizes(void **state)
{
    (void)state;
    uint64_t b;
    assert_int_equal(cfg_parse_size("512MiB", &b), 0);
    assert_int_equal(b, 512ull << 20);
    assert_int_equal(cfg_parse_size("24GiB", &b), 0);
    assert_int_equal(b, 24ull << 30);
    assert_int_equal(cfg_parse_size("24000", &b), 0);
    assert_int_equal(b, 24000ull << 20);
    assert_int_equal(cfg_parse_size("1.5GiB", &b), 0);
    assert_int_equal(b, 3ull << 29);
    assert_int_equal(cfg_parse_size("100B", &b), 0);
    assert_int_equal(b, 100);
    assert_int_equal(cfg_parse_size("1.5", &b), RKV_EINVAL);
    assert_int_equal(cfg_parse_size("-1GiB", &b), RKV_EINVAL);
    assert_int_equal(cfg_parse_size("12 parsecs", &b), RKV_EINVAL);
    assert_int_equal(cfg_parse_size("", &b), RKV_EINVAL);
    assert_int_equal(cfg_parse_size("1e30TiB", &b), RKV_ERANGE);
    char buf[32];
    cfg_format_size(1536ull << 20, buf, sizeof buf);
    assert_string_equal(buf, "1.50 GiB");
    cfg_format_size(10, buf, sizeof buf);
    assert_string_equal(buf, "10 B");
}

static void test_positionals(void **state)
{
    (void)state;
    struct conf c;
    char err[512];
    int pos;
    char *a[] = {"t", "--verbose", "budget", "set", "--vram-target", "1GiB", NULL};
    memset(&c, 0, sizeof c);
    assert_int_equal(cfg_load(&spec, &c, 6, a, &pos, err, sizeof err), 0);
    assert_int_equal(pos, 2);
    assert_int_equal(c.verbose, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_flags), cmocka_unit_test(test_no_switch),
        cmocka_unit_test(test_bad_values_named),
        cmocka_unit_test(test_file_env_precedence), cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_positionals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
