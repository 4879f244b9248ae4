/* stop_test.c - stop matcher: chunk boundaries, match rule, UTF-8 hold-back, chunking invariance.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/stop.h"

/* feeds chunks (NULL-terminated), collects everything emitted (plus the flush
 * when nothing matched) into out; returns stop_matched() */
static int run_chunks(struct stop *s, const char *const *chunks, char *out, size_t cap)
{
    size_t n = 0;
    const char *e;
    size_t el;
    int rc = 0;
    for (size_t i = 0; chunks[i] && rc == 0; i++) {
        rc = stop_feed(s, chunks[i], strlen(chunks[i]), &e, &el);
        assert_true(rc == 0 || rc == 1);
        assert_true(n + el < cap);
        memcpy(out + n, e, el);
        n += el;
    }
    stop_flush(s, &e, &el);
    assert_true(rc == 0 || el == 0);
    memcpy(out + n, e, el);
    n += el;
    out[n] = 0;
    return stop_matched(s);
}

static struct stop *make(const char *const *strs, size_t n)
{
    struct stop *s = NULL;
    assert_int_equal(stop_create(&s, strs, n), 0);
    return s;
}

static void test_whole_chunk(void **state)
{
    (void)state;
    const char *stops[] = {"END", "\n\nUser:"};
    struct stop *s = make(stops, 2);
    const char *e;
    size_t el;
    const char *text = "Hello world. END more END";
    assert_int_equal(stop_feed(s, text, strlen(text), &e, &el), 1);
    assert_int_equal(el, 13);
    assert_memory_equal(e, "Hello world. ", 13);
    assert_int_equal(stop_matched(s), 0);
    /* stopped: later feeds and the flush emit nothing */
    assert_int_equal(stop_feed(s, "abc", 3, &e, &el), 1);
    assert_int_equal(el, 0);
    stop_flush(s, &e, &el);
    assert_int_equal(el, 0);
    assert_int_equal(stop_held(s), 0);
    stop_destroy(s);
}

static void test_across_chunks(void **state)
{
    (void)state;
    const char *stops[] = {"END", "\n\nUser:"};
    struct stop *s = make(stops, 2);
    const char *e;
    size_t el;
    assert_int_equal(stop_feed(s, "abc\n", 4, &e, &el), 0);
    assert_int_equal(el, 3); /* "\n" held: it may start "\n\nUser:" */
    assert_memory_equal(e, "abc", 3);
    assert_int_equal(stop_held(s), 1);
    assert_int_equal(stop_feed(s, "\nUs", 3, &e, &el), 0);
    assert_int_equal(el, 0);
    assert_int_equal(stop_held(s), 4);
    assert_int_equal(stop_feed(s, "er:", 3, &e, &el), 1);
    assert_int_equal(el, 0);
    assert_int_equal(stop_matched(s), 1);
    stop_destroy(s);

    /* a false start is released as soon as it cannot match */
    s = make(stops, 2);
    assert_int_equal(stop_feed(s, "xxEN", 4, &e, &el), 0);
    assert_int_equal(el, 2);
    assert_int_equal(stop_feed(s, "x", 1, &e, &el), 0);
    assert_int_equal(el, 3);
    assert_memory_equal(e, "ENx", 3);
    /* end of stream releases what is held */
    assert_int_equal(stop_feed(s, "\n\nU", 3, &e, &el), 0);
    assert_int_equal(el, 0);
    stop_flush(s, &e, &el);
    assert_int_equal(el, 3);
    assert_memory_equal(e, "\n\nU", 3);
    assert_int_equal(stop_matched(s), -1);
    stop_destroy(s);
}

static void test_match_rule(void **state)
{
    (void)state;
    char out[128];
    /* the first stop string to end wins, even if another started earlier */
    const char *a[] = {"abcd", "bc"};
    struct stop *s = make(a, 2);
    assert_int_equal(run_chunks(s, (const char *[]){"xabcd", NULL}, out, sizeof(out)), 1);
    assert_string_equal(out, "xa");
    stop_destroy(s);
    /* same end: the longest */
    const char *b[] = {"bc", "abc"};
    s = make(b, 2);
    assert_int_equal(run_chunks(s, (const char *[]){"x", "a", "b", "c", NULL}, out, sizeof(out)),
                     1);
    assert_string_equal(out, "x");
    stop_destroy(s);
    /* self-overlapping stop string */
    const char *c[] = {"aab"};
    s = make(c, 1);
    assert_int_equal(
        run_chunks(s, (const char *[]){"a", "a", "a", "b", "zz", NULL}, out, sizeof(out)), 0);
    assert_string_equal(out, "a");
    stop_destroy(s);
}

static void test_utf8(void **state)
{
    (void)state;
    const char *e;
    size_t el;
    /* no stop strings: only a cut character is held */
    struct stop *s = make(NULL, 0);
    const char *text = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80!";
    size_t tl = strlen(text);
    char out[64];
    size_t n = 0;
    for (size_t i = 0; i < tl; i++) {
        assert_int_equal(stop_feed(s, text + i, 1, &e, &el), 0);
        memcpy(out + n, e, el);
        n += el;
        /* what is out so far never ends inside a character */
        if (n > 0)
            assert_true(((unsigned char)out[n - 1] & 0xc0) != 0xc0);
        if (i + 1 < tl && ((unsigned char)text[i + 1] & 0xc0) == 0x80)
            assert_true(stop_held(s) > 0);
        else
            assert_int_equal(stop_held(s), 0);
    }
    assert_int_equal(n, tl);
    assert_memory_equal(out, text, tl);
    stop_destroy(s);

    /* a multibyte stop string split inside its characters */
    const char *st[] = {"\xe2\x82\xac!"};
    s = make(st, 1);
    assert_int_equal(run_chunks(s, (const char *[]){"price 5\xe2", "\x82", "\xac", "! ok", NULL},
                                out, sizeof(out)),
                     0);
    assert_string_equal(out, "price 5");
    stop_destroy(s);

    /* an incomplete sequence at the end of the stream still comes out */
    s = make(NULL, 0);
    assert_int_equal(stop_feed(s, "ab\xe2\x82", 4, &e, &el), 0);
    assert_int_equal(el, 2);
    stop_flush(s, &e, &el);
    assert_int_equal(el, 2);
    assert_memory_equal(e, "\xe2\x82", 2);
    stop_destroy(s);
}

static void test_init_errors(void **state)
{
    (void)state;
    struct stop *s = (struct stop *)1;
    const char *nine[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    assert_int_equal(stop_create(&s, nine, 9), RKV_ETOOBIG);
    assert_null(s);
    const char *empty[] = {"a", ""};
    assert_int_equal(stop_create(&s, empty, 2), RKV_EINVAL);
    char big[STOP_MAX_LEN + 2];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    const char *toolong[] = {big};
    assert_int_equal(stop_create(&s, toolong, 1), RKV_ETOOBIG);
    big[STOP_MAX_LEN] = 0; /* exactly the limit is fine */
    assert_int_equal(stop_create(&s, toolong, 1), 0);
    stop_destroy(s);
    assert_int_equal(stop_create(&s, nine, 8), 0);
    stop_destroy(s);
}

/* independent whole-text rule: scan ends in order, longest at the first end */
static int whole_match(const char *text, size_t tl, const char *const *stops, size_t ns,
                       size_t *cut)
{
    for (size_t e = 1; e <= tl; e++) {
        int which = -1;
        size_t best = 0;
        for (size_t i = 0; i < ns; i++) {
            size_t l = strlen(stops[i]);
            if (l <= e && memcmp(text + e - l, stops[i], l) == 0 && (which < 0 || e - l < best)) {
                which = (int)i;
                best = e - l;
            }
        }
        if (which >= 0) {
            *cut = best;
            return which;
        }
    }
    *cut = tl;
    return -1;
}

static uint64_t rnd(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void test_random_chunkings(void **state)
{
    (void)state;
    uint64_t x = 42;
    const char alpha[] = "ab\n\xc3\xa9";
    for (int round = 0; round < 3000; round++) {
        char sbuf[4][8];
        const char *stops[4];
        size_t ns = rnd(&x) % 5;
        for (size_t i = 0; i < ns; i++) {
            size_t l = 1 + rnd(&x) % 6;
            for (size_t j = 0; j < l; j++)
                sbuf[i][j] = alpha[rnd(&x) % 5];
            sbuf[i][l] = 0;
            stops[i] = sbuf[i];
        }
        char text[80];
        size_t tl = rnd(&x) % 60;
        for (size_t j = 0; j < tl; j++)
            text[j] = alpha[rnd(&x) % 5];
        size_t cut;
        int want = whole_match(text, tl, stops, ns, &cut);

        struct stop *s = make(stops, ns);
        char out[80];
        size_t n = 0, pos = 0;
        const char *e;
        size_t el;
        int rc = 0;
        while (pos < tl && rc == 0) {
            size_t step = 1 + rnd(&x) % 7;
            if (step > tl - pos)
                step = tl - pos;
            rc = stop_feed(s, text + pos, step, &e, &el);
            memcpy(out + n, e, el);
            n += el;
            pos += step;
        }
        stop_flush(s, &e, &el);
        memcpy(out + n, e, el);
        n += el;
        assert_int_equal(stop_matched(s), want);
        assert_int_equal(n, cut);
        assert_memory_equal(out, text, n);
        stop_destroy(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_chunk), cmocka_unit_test(test_across_chunks),
        cmocka_unit_test(test_match_rule),  cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_init_errors), cmocka_unit_test(test_random_chunkings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
