/* fim_test.c - FIM markers from a vocabulary, and the FIM prompt's order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "daemon/fim.h"

static void test_qwen_markers(void **state)
{
    (void)state;
    const char *v[] = {"a", "<|fim_middle|>", "b", "<|fim_prefix|>", NULL, "<|fim_suffix|>"};
    struct fim_tokens f;
    assert_int_equal(fim_from_vocab(v, 6, &f), 1);
    assert_int_equal(f.pre, 3);
    assert_int_equal(f.suf, 5);
    assert_int_equal(f.mid, 1);
}

static void test_starcoder_and_codellama(void **state)
{
    (void)state;
    const char *sc[] = {"<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"};
    struct fim_tokens f;
    assert_int_equal(fim_from_vocab(sc, 4, &f), 1);
    assert_int_equal(f.pre, 0);
    assert_int_equal(f.suf, 2);
    assert_int_equal(f.mid, 1);
    /* CodeLlama's sentencepiece names carry the word-start mark */
    const char *cl[] = {"<s>", "\xe2\x96\x81<PRE>", "\xe2\x96\x81<MID>", "\xe2\x96\x81<SUF>"};
    assert_int_equal(fim_from_vocab(cl, 4, &f), 1);
    assert_int_equal(f.pre, 1);
    assert_int_equal(f.suf, 3);
    assert_int_equal(f.mid, 2);
}

static void test_incomplete_family_is_none(void **state)
{
    (void)state;
    /* two of one family and one of another make no set */
    const char *v[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<fim_middle>", "<PRE>"};
    struct fim_tokens f = {7, 7, 7};
    assert_int_equal(fim_from_vocab(v, 4, &f), 0);
    assert_int_equal(f.pre, -1);
    assert_int_equal(f.suf, -1);
    assert_int_equal(f.mid, -1);
    assert_int_equal(fim_find(NULL, &f), 0);
    assert_int_equal(f.mid, -1);
}

static void test_build_order(void **state)
{
    (void)state;
    struct fim_tokens f = {100, 101, 102};
    int32_t pre[] = {5, 6}, suf[] = {7}, out[8];
    int n = fim_build(&f, 1, pre, 2, suf, 1, out, 8);
    assert_int_equal(n, 7);
    int32_t want[] = {1, 100, 5, 6, 101, 7, 102};
    assert_memory_equal(out, want, sizeof want);
    /* no bos, an empty suffix */
    n = fim_build(&f, -1, pre, 2, NULL, 0, out, 8);
    assert_int_equal(n, 5);
    int32_t want2[] = {100, 5, 6, 101, 102};
    assert_memory_equal(out, want2, sizeof want2);
    assert_int_equal(fim_build(&f, 1, pre, 2, suf, 1, out, 6), RKV_ETOOBIG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen_markers),
        cmocka_unit_test(test_starcoder_and_codellama),
        cmocka_unit_test(test_incomplete_family_is_none),
        cmocka_unit_test(test_build_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
