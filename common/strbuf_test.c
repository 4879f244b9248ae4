/* strbuf_test.c - the growing text buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/strbuf.h"

/* appends of every kind, growing past the first allocation */
static void test_append(void **state)
{
    (void)state;
    struct strbuf b = {0};
    assert_string_equal(strbuf_str(&b), "");
    assert_int_equal(strbuf_puts(&b, "root ::= "), 0);
    assert_int_equal(strbuf_add(&b, "abc", 2), 0);
    assert_int_equal(strbuf_printf(&b, " %d|%s", 42, "x"), 0);
    assert_string_equal(b.s, "root ::= ab 42|x");
    assert_int_equal(b.n, strlen(b.s));
    /* a printf longer than the room left, and than the first allocation */
    char big[1000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    strbuf_printf(&b, "<%s>", big);
    assert_int_equal(b.n, 16 + 2 + 999);
    assert_true(b.cap > b.n);
    assert_int_equal(b.s[16], '<');
    assert_int_equal(b.s[b.n - 1], '>');
    assert_int_equal(b.s[b.n], 0);
    assert_int_equal(b.err, 0);
    /* bytes with a NUL among them */
    struct strbuf z = {0};
    strbuf_add(&z, "a\0b", 3);
    assert_int_equal(z.n, 3);
    assert_memory_equal(z.s, "a\0b", 4);
    strbuf_fini(&z);
    strbuf_fini(&b);
    assert_null(b.s);
    assert_int_equal(b.n, 0);
}

/* one buffer into another: its text, and its error */
static void test_append_buf(void **state)
{
    (void)state;
    struct strbuf a = {0}, c = {0}, e = {0};
    strbuf_puts(&a, "(");
    strbuf_puts(&c, "x y");
    strbuf_append(&a, &c);
    strbuf_append(&a, &e); /* an empty one adds nothing */
    strbuf_puts(&a, ")");
    assert_string_equal(a.s, "(x y)");
    assert_int_equal(a.err, 0);
    e.err = RKV_ENOMEM;
    strbuf_append(&a, &e);
    assert_int_equal(a.err, RKV_ENOMEM);
    /* after an error every append does nothing */
    assert_int_equal(strbuf_puts(&a, "more"), RKV_ENOMEM);
    assert_int_equal(strbuf_printf(&a, "%d", 7), RKV_ENOMEM);
    assert_int_equal(strbuf_append(&a, &c), RKV_ENOMEM);
    assert_string_equal(a.s, "(x y)");
    char *out = (char *)"untouched";
    assert_int_equal(strbuf_take(&a, &out, NULL), RKV_ENOMEM);
    assert_string_equal(out, "untouched");
    assert_null(a.s);
    assert_int_equal(a.err, 0);
    strbuf_fini(&c);
}

/* the text handed over: allocated even when empty; the buffer empty after */
static void test_take(void **state)
{
    (void)state;
    struct strbuf b = {0};
    char *out = NULL;
    size_t len = 99;
    assert_int_equal(strbuf_take(&b, &out, &len), 0);
    assert_non_null(out);
    assert_string_equal(out, "");
    assert_int_equal(len, 0);
    free(out);
    strbuf_add(&b, "", 0); /* no bytes: still a valid "" */
    assert_non_null(b.s);
    assert_string_equal(b.s, "");
    strbuf_puts(&b, "hi");
    assert_int_equal(strbuf_take(&b, &out, &len), 0);
    assert_string_equal(out, "hi");
    assert_int_equal(len, 2);
    assert_null(b.s);
    assert_int_equal(b.n, 0);
    free(out);
}

/* reset: empty text, the allocation kept for what comes next */
static void test_reset(void **state)
{
    (void)state;
    struct strbuf b = {0};
    strbuf_reset(&b); /* nothing allocated: still empty */
    assert_null(b.s);
    strbuf_puts(&b, "echo");
    const size_t cap = b.cap;
    strbuf_reset(&b);
    assert_int_equal(b.n, 0);
    assert_int_equal(b.cap, cap);
    assert_string_equal(strbuf_str(&b), "");
    strbuf_puts(&b, "next");
    assert_string_equal(b.s, "next");
    strbuf_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append),
        cmocka_unit_test(test_append_buf),
        cmocka_unit_test(test_take),
        cmocka_unit_test(test_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
