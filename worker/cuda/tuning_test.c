/* tuning_test.c - the cuda knob table: defaults, RKV_CUDA_TUNE's reading, and docs/operations.md
 * listing exactly the table's knobs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "worker/cuda/tuning.h"

#define OPS_DOC     "docs/operations.md"
#define OPS_SECTION "## CUDA backend tuning"

static void test_defaults(void **state)
{
    (void)state;
    struct cuda_tune t;
    cuda_tune_defaults(&t);
    assert_int_equal(t.host_read, CUDA_READ_MEASURE);
    assert_int_equal(t.stage_mb, 512);
    assert_int_equal(t.graph, 1);
    assert_int_equal(t.pair_n, 65536);
    assert_int_equal(t.sample_stamps, 0);
    for (size_t i = 0; i < cuda_n_knobs; i++) {
        const struct cuda_knob *k = &cuda_knobs[i];
        assert_true(k->lo <= k->def && k->def <= k->hi);
        assert_non_null(k->doc);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(k->name, cuda_knobs[j].name);
    }
}

static void test_parse(void **state)
{
    (void)state;
    struct cuda_tune t;
    cuda_tune_defaults(&t);
    assert_int_equal(cuda_tune_parse(&t, "pair_n=64,host_read=copy,graph=0"), 0);
    assert_int_equal(t.pair_n, 64);
    assert_int_equal(t.host_read, CUDA_READ_COPY);
    assert_int_equal(t.graph, 0);
    /* a named knob takes its names' numbers too; empty parts say nothing */
    assert_int_equal(cuda_tune_parse(&t, "host_read=3,,"), 0);
    assert_int_equal(t.host_read, CUDA_READ_CPU);
    assert_int_equal(cuda_tune_parse(&t, NULL), 0);
    assert_int_equal(cuda_tune_parse(&t, ""), 0);
    /* what is wrong is left out, the rest still read */
    assert_int_equal(cuda_tune_parse(&t, "nope=1,graph=3,host_read=4,stage_mb=-1,max_split=2"), 4);
    assert_int_equal(t.graph, 0);
    assert_int_equal(t.host_read, CUDA_READ_CPU);
    assert_int_equal(t.stage_mb, 512);
    assert_int_equal(t.max_split, 2);
    assert_int_equal(cuda_tune_parse(&t, "graph,host_read=fast,gemv_max_n=1x"), 3);
    assert_int_equal(t.gemv_max_n, 8);
    /* a cluster is a power of two */
    assert_int_equal(cuda_tune_parse(&t, "sample_cl=3"), 1);
    assert_int_equal(t.sample_cl, 8);
    assert_int_equal(cuda_tune_parse(&t, "sample_cl=4"), 0);
    assert_int_equal(t.sample_cl, 4);
}

static void test_read(void **state)
{
    (void)state;
    struct cuda_tune t;
    setenv(CUDA_TUNE_ENV, "lin_mma=0,stage_pass_kb=112", 1);
    setenv(CUDA_DEBUG_STAMPS_ENV, "1", 1);
    cuda_tune_read(&t);
    assert_int_equal(t.lin_mma, 0);
    assert_int_equal(t.stage_pass_kb, 112);
    assert_int_equal(t.sample_stamps, 1);
    assert_int_equal(t.lt_tune_n, 256);
    unsetenv(CUDA_TUNE_ENV);
    unsetenv(CUDA_DEBUG_STAMPS_ENV);
    cuda_tune_read(&t);
    assert_int_equal(t.lin_mma, 2);
    assert_int_equal(t.sample_stamps, 0);
}

/* a knob's default and range as the doc writes them: numbers, or `name` for a named knob */
static void knob_cells(const struct cuda_knob *k, char *def, size_t dlen, char *range, size_t rlen)
{
    if (!k->names) {
        snprintf(def, dlen, "%u", k->def);
        snprintf(range, rlen, "%u..%u", k->lo, k->hi);
        return;
    }
    size_t n = 0;
    uint32_t idx = 0;
    range[0] = 0;
    for (const char *p = k->names; *p; idx++) {
        const char *bar = strchr(p, '|');
        const int len = bar ? (int)(bar - p) : (int)strlen(p);
        if (idx == k->def)
            snprintf(def, dlen, "`%.*s`", len, p);
        n += (size_t)snprintf(range + n, rlen - n, "%s`%.*s`", n ? ", " : "", len, p);
        p += len + (bar != NULL);
    }
}

/* the rows of the doc's knob table, in order, as they must read */
static void test_doc_lists_the_knobs(void **state)
{
    (void)state;
    FILE *f = fopen(OPS_DOC, "r");
    if (!f)
        fail_msg("%s: cannot open it (run the test from the repository's top folder)", OPS_DOC);
    char line[2048];
    int in = 0;
    size_t row = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "## ", 3)) {
            if (in)
                break;
            in = !strcmp(line, OPS_SECTION);
            continue;
        }
        if (!in || strncmp(line, "| `", 3))
            continue;
        if (row >= cuda_n_knobs)
            fail_msg("%s: a row past the table's %zu knobs: %s", OPS_DOC, cuda_n_knobs, line);
        const struct cuda_knob *k = &cuda_knobs[row++];
        char def[64], range[160], want[2048];
        knob_cells(k, def, sizeof def, range, sizeof range);
        snprintf(want, sizeof want, "| `%s` | %s | %s | %s |", k->name, def, range, k->doc);
        if (strcmp(line, want))
            fail_msg("%s, section \"%s\", row %zu reads\n  %s\nworker/cuda/tuning.h says\n  %s",
                     OPS_DOC, OPS_SECTION, row, line, want);
    }
    fclose(f);
    if (!in && row == 0)
        fail_msg("%s: no section \"%s\"", OPS_DOC, OPS_SECTION);
    if (row != cuda_n_knobs)
        fail_msg("%s lists %zu knobs; worker/cuda/tuning.h has %zu (the first missing: %s)",
                 OPS_DOC, row, cuda_n_knobs, cuda_knobs[row].name);
}

int main(void)
{
    rkv_log_init("tuning_test", RKV_LOG_ERROR); /* the bad values' warnings are expected */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_doc_lists_the_knobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
