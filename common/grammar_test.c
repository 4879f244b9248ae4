/* grammar_test.c - GBNF parsing and errors, byte-level matching, masks vs brute force, eog. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/grammar.h"

static const char JSON_GBNF[] =
    "# a small JSON grammar\n"
    "root   ::= value\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)* )? "
    "\"}\"\n"
    "array  ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) "
    ")* \"\\\"\"\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
    "ws     ::= | \" \" | \"\\n\" [ \\t]{0,8}\n";

static struct grammar *compile_ok(const char *src)
{
    struct grammar *g = NULL;
    char err[256];
    int rc = grammar_compile(src, strlen(src), &g, err, sizeof err);
    if (rc)
        print_error("compile: %s\n", err);
    assert_int_equal(rc, 0);
    return g;
}

/* a one-token-per-byte vocab: token i is byte i, plus an eog token 256 */
static struct grammar_vocab *byte_vocab(void)
{
    static char bytes[256];
    const char *p[257];
    uint32_t lens[257];
    uint8_t eog[257] = {0};
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        p[i] = &bytes[i];
        lens[i] = 1;
    }
    p[256] = NULL;
    lens[256] = 0;
    eog[256] = 1;
    struct grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(&v, 257, p, lens, eog), 0);
    return v;
}

/* 1 when text is a complete sentence of src, 0 when a prefix only, -1 when not a prefix */
static int match(const char *src, const char *text, size_t len)
{
    struct grammar *g = compile_ok(src);
    struct grammar_vocab *v = byte_vocab();
    struct grammar_matcher *m = NULL;
    assert_int_equal(grammar_matcher_create(&m, g, v), 0);
    int r;
    if (grammar_matcher_accept_bytes(m, text, len))
        r = -1;
    else
        r = grammar_matcher_can_end(m);
    grammar_matcher_destroy(m);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
    return r;
}
#define M(src, text) match(src, text, strlen(text))

static void expect_error(const char *src, int code, const char *want)
{
    struct grammar *g = NULL;
    char err[256] = "";
    int rc = grammar_compile(src, strlen(src), &g, err, sizeof err);
    if (rc != code || !strstr(err, want))
        print_error("grammar %s: rc %d, error \"%s\", want %d \"%s\"\n", src, rc, err, code, want);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err, want));
    assert_null(g);
}

static void test_parse_errors(void **state)
{
    expect_error("root \"x\"", RKV_EFORMAT, "line 1, column 6: expected ::= after rule name");
    expect_error("root ::= \"abc\n", RKV_EFORMAT, "line 1, column 14: unterminated literal");
    expect_error("root ::= a\n\nb ::= \"x\"", RKV_EFORMAT,
                 "line 1, column 10: rule \"a\" is not defined");
    expect_error("a ::= \"x\"", RKV_EFORMAT, "no rule named \"root\"");
    expect_error("root ::= [a-", RKV_EFORMAT, "unterminated character class");
    expect_error("root ::= [z-a]", RKV_EFORMAT, "line 1, column 14: character range is reversed");
    expect_error("root ::= \"\\q\"", RKV_EFORMAT, "line 1, column 12: unknown escape '\\q'");
    expect_error("root ::= \"a\"{3,1}", RKV_EFORMAT, "with n < m");
    expect_error("root ::= \"a\"{99999}", RKV_EFORMAT, "repetition count above");
    expect_error("root ::= * \"a\"", RKV_EFORMAT,
                 "line 1, column 10: expected a symbol before '*'");
    expect_error("root ::= ( \"a\" ", RKV_EFORMAT, "expected ')'");
    expect_error("root ::= \"a\" )", RKV_EFORMAT, "unmatched ')'");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", RKV_EFORMAT,
                 "line 2, column 1: rule \"root\" is defined twice");
    expect_error("root ::= \"\\x4\"", RKV_EFORMAT, "expected 2 hex digits after \\x");
    char deep[700] = "root ::= ";
    for (int i = 0; i < 300; i++)
        strcat(deep, "(");
    expect_error(deep, RKV_EFORMAT, "groups nested deeper than 256");
    expect_error("root ::= root \"a\" | \"b\"", RKV_EUNSUPPORTED, "left recursion: root -> root");
    expect_error("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"", RKV_EUNSUPPORTED,
                 "left recursion: a -> a");
    expect_error("root ::= expr\nexpr ::= term | expr \"+\" term\nterm ::= [0-9]", RKV_EUNSUPPORTED,
                 "left recursion: expr -> expr");
}

static void test_literals_and_classes(void **state)
{
    assert_int_equal(M("root ::= \"abc\"", "abc"), 1);
    assert_int_equal(M("root ::= \"abc\"", "ab"), 0);
    assert_int_equal(M("root ::= \"abc\"", "abd"), -1);
    assert_int_equal(M("root ::= \"abc\"", "abcd"), -1);
    assert_int_equal(M("root ::= \"a\\n\\t\\\"\\\\\"", "a\n\t\"\\"), 1);
    assert_int_equal(M("root ::= \"\\x41\\u00e9\\U0001F600\"", "A\xc3\xa9\xf0\x9f\x98\x80"), 1);
    assert_int_equal(M("root ::= [a-c0-9]+", "ab09c"), 1);
    assert_int_equal(M("root ::= [a-c0-9]+", "abd"), -1);
    assert_int_equal(M("root ::= [^a-c]", "d"), 1);
    assert_int_equal(M("root ::= [^a-c]", "b"), -1);
    /* a negated class covers every other code point, as utf-8 */
    assert_int_equal(M("root ::= [^a]", "\xe2\x82\xac"), 1);
    assert_int_equal(M("root ::= [^a]", "\xe2\x82"), 0);
    assert_int_equal(M("root ::= [^a]", "\xed\xa0\x80"), -1); /* a surrogate is not utf-8 */
    assert_int_equal(M("root ::= [^a]", "\xc0\x80"), -1);     /* nor an overlong form */
    assert_int_equal(M("root ::= [а-я]+", "привет"), 1);
    assert_int_equal(M("root ::= [а-я]+", "hello"), -1);
    assert_int_equal(M("root ::= [\\x00-\\U0010FFFF]", "\xf4\x8f\xbf\xbf"), 1);
    assert_int_equal(M("root ::= [\\]\\-x]+", "]-x"), 1);
    assert_int_equal(M("root ::= .", "\xf0\x9f\x98\x80"), 1);
    assert_int_equal(M("root ::= .", "ab"), -1);
}

static void test_structure(void **state)
{
    const char *g = "root ::= greeting (\" \" name)? \"!\"  # a comment\n"
                    "greeting ::= \"hi\" | \"hello\"\n"
                    "name ::=\n"
                    "  [A-Z] [a-z]*\n";
    assert_int_equal(M(g, "hi!"), 1);
    assert_int_equal(M(g, "hello Bob!"), 1);
    assert_int_equal(M(g, "hello bob!"), -1);
    assert_int_equal(M(g, "hello B"), 0);
    const char *rep = "root ::= \"a\"{2,4} \"b\"{3} \"c\"{1,}";
    assert_int_equal(M(rep, "aabbbc"), 1);
    assert_int_equal(M(rep, "aaaabbbccc"), 1);
    assert_int_equal(M(rep, "abbbc"), -1);
    assert_int_equal(M(rep, "aaaaabbbc"), -1);
    assert_int_equal(M(rep, "aabbbbc"), -1);
    assert_int_equal(M("root ::= (\"ab\" | \"c\"){0,2}", ""), 1);
    assert_int_equal(M("root ::= (\"ab\" | \"c\"){0,2}", "abc"), 1);
    assert_int_equal(M("root ::= (\"ab\" | \"c\"){0,2}", "abcc"), -1);
    /* right recursion nests without limit of its own */
    const char *nest = "root ::= \"(\" root \")\" | \"x\"";
    char deep[401];
    memset(deep, '(', 200);
    deep[200] = 'x';
    memset(deep + 201, ')', 200);
    assert_int_equal(match(nest, deep, 401), 1);
    assert_int_equal(match(nest, deep, 400), 0);
    /* an empty root matches the empty text only */
    assert_int_equal(M("root ::= ", ""), 1);
    assert_int_equal(M("root ::= ", "a"), -1);
    /* ambiguity: every parse is followed */
    assert_int_equal(M("root ::= (\"a\" | \"a\" \"b\")* \"b\"", "abab"), 1);
    assert_int_equal(M("root ::= (\"a\" | \"a\" \"b\")* \"b\"", "aba"), 0);
    assert_int_equal(M("root ::= (\"a\" | \"a\" \"b\")* \"b\"", "abb"), 1);
    assert_int_equal(M(JSON_GBNF, "{\"a\": [1, 2.5e3, -0], \"b\\u00e9\": {\"c\": null}}"), 1);
    assert_int_equal(M(JSON_GBNF, "{\"a\": 01}"), -1);
    assert_int_equal(M(JSON_GBNF, "\"raw\x01\""), -1);
}

/* small vocab: every byte pair of an alphabet, some longer JSON pieces, split utf-8 */
static struct grammar_vocab *mixed_vocab(int32_t *n_out, char ***bytes_out, uint32_t **lens_out)
{
    static const char *pieces[] = {
        "{",    "}",    "[",    "]",   ",",   ":",    " ",     "\n",       "\"",     "\\",
        "{\"",  "\":",  "\": ", "\",", "\"}", "true", "false", "null",     "nul",    "l",
        "0",    "1",    "12",   "-",   ".",   "e",    "E+",    "5",        "\\u",    "00e9",
        "\\n",  "a",    "b",    "ab",  "abc", "\xc3", "\xa9",  "\xc3\xa9", "\xa9\"", "\xe2\x82",
        "\xac", "x\"}", "]}",   "}]",  "  ",  "\n  ", "\t",    "\x01",     "[1, 2]", "{}"};
    int32_t np = (int32_t)(sizeof pieces / sizeof pieces[0]);
    int32_t n = np + 3;
    char **b = calloc((size_t)n, sizeof *b);
    uint32_t *l = calloc((size_t)n, sizeof *l);
    uint8_t *eog = calloc((size_t)n, 1);
    for (int32_t i = 0; i < np; i++) {
        b[i] = strdup(pieces[i]);
        l[i] = (uint32_t)strlen(pieces[i]);
    }
    /* a control token (never allowed), an eog, and a duplicate of "a" */
    eog[np + 1] = 1;
    b[np + 2] = strdup("a");
    l[np + 2] = 1;
    struct grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(&v, n, (const char *const *)b, l, eog), 0);
    free(eog);
    *n_out = n;
    *bytes_out = b;
    *lens_out = l;
    return v;
}

static void free_pieces(char **bytes, uint32_t *lens, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        free(bytes[i]);
    free(bytes);
    free(lens);
}

static int bit(const uint32_t *mask, int32_t id)
{
    return (int)(mask[id >> 5] >> (id & 31) & 1);
}

/* from random states, the mask equals trying every token on its own */
static void test_mask_vs_brute_force(void **state)
{
    struct grammar *g = compile_ok(JSON_GBNF);
    int32_t n;
    char **bytes;
    uint32_t *lens;
    struct grammar_vocab *v = mixed_vocab(&n, &bytes, &lens);
    int32_t eog_id = n - 2, ctl_id = n - 3;
    uint32_t *mask = calloc((size_t)(n + 31) / 32, 4), *mask2 = calloc((size_t)(n + 31) / 32, 4);
    char text[4096];
    unsigned seed = 12345;
    /* m2 follows m: its masks come from the grammar's shared cache that m filled */
    struct grammar_matcher *m = NULL, *ref = NULL, *m2 = NULL;
    assert_int_equal(grammar_matcher_create(&m, g, v), 0);
    assert_int_equal(grammar_matcher_create(&ref, g, v), 0);
    assert_int_equal(grammar_matcher_create(&m2, g, v), 0);
    int checked = 0;
    for (int walk = 0; walk < 40; walk++) {
        grammar_matcher_reset(m);
        grammar_matcher_reset(m2);
        size_t tl = 0;
        for (int step = 0; step < 60; step++) {
            assert_int_equal(grammar_matcher_mask(m, mask), 0);
            assert_int_equal(grammar_matcher_mask(m2, mask2), 0);
            assert_memory_equal(mask, mask2, (size_t)(n + 31) / 32 * 4);
            int32_t allowed[256] = {0};
            int na = 0;
            for (int32_t id = 0; id < n; id++) {
                int want;
                if (id == eog_id) {
                    want = grammar_matcher_can_end(m);
                } else if (id == ctl_id) {
                    want = 0;
                } else {
                    /* brute force: a fresh parse of text + token */
                    grammar_matcher_reset(ref);
                    want = grammar_matcher_accept_bytes(ref, text, tl) == 0 &&
                           grammar_matcher_accept_bytes(ref, bytes[id], lens[id]) == 0;
                }
                if (bit(mask, id) != want)
                    print_error("walk %d step %d text \"%.*s\" token %d \"%s\": mask %d want %d\n",
                                walk, step, (int)tl, text, id, bytes[id] ? bytes[id] : "",
                                bit(mask, id), want);
                assert_int_equal(bit(mask, id), want);
                if (want)
                    allowed[na++] = id;
                checked++;
            }
            assert_true(na > 0);
            /* finish sometimes once it can; otherwise a random allowed token */
            seed = seed * 1103515245u + 12345u;
            int32_t pick = allowed[(seed >> 8) % (unsigned)na];
            if (pick == eog_id) {
                assert_int_equal(grammar_matcher_accept(m, pick), 0);
                assert_int_equal(grammar_matcher_mask(m, mask), 0);
                for (int32_t id = 0; id < n; id++)
                    assert_int_equal(bit(mask, id), 0);
                break;
            }
            /* a token not allowed is refused and leaves the state alone */
            for (int32_t id = 0; id < n; id++) {
                if (!bit(mask, id)) {
                    assert_int_equal(grammar_matcher_accept(m, id), RKV_EINVAL);
                    break;
                }
            }
            assert_int_equal(grammar_matcher_accept(m, pick), 0);
            assert_int_equal(grammar_matcher_accept(m2, pick), 0);
            memcpy(text + tl, bytes[pick], lens[pick]);
            tl += lens[pick];
        }
    }
    assert_true(checked > 1000);
    grammar_matcher_destroy(m);
    grammar_matcher_destroy(ref);
    grammar_matcher_destroy(m2);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
    free_pieces(bytes, lens, n);
    free(mask);
    free(mask2);
}

/* tokens that split a utf-8 character are allowed exactly when the rest can follow */
static void test_utf8_split(void **state)
{
    struct grammar *g = compile_ok("root ::= \"\\\"\" [^\"]* \"\\\"\"");
    const char *p[] = {"\"", "\xc3", "\xa9", "\xc3\xa9", "\xa9\"", "\xe2\x82", "\xac", "x"};
    uint32_t l[] = {1, 1, 1, 2, 2, 2, 1, 1};
    struct grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(&v, 8, p, l, NULL), 0);
    struct grammar_matcher *m = NULL;
    assert_int_equal(grammar_matcher_create(&m, g, v), 0);
    uint32_t mask[1];
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], 1u << 0);
    assert_int_equal(grammar_matcher_accept(m, 0), 0);
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    /* inside the string: no continuation byte may start a character */
    assert_int_equal(mask[0], (1u << 0) | (1u << 1) | (1u << 3) | (1u << 5) | (1u << 7));
    assert_int_equal(grammar_matcher_accept(m, 1), 0);
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], (1u << 2) | (1u << 4) | (1u << 6));
    assert_int_equal(grammar_matcher_accept(m, 5), RKV_EINVAL); /* a lead byte mid-character */
    assert_int_equal(grammar_matcher_accept(m, 4), 0);
    assert_true(grammar_matcher_must_end(m));
    grammar_matcher_destroy(m);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
}

static void test_eog_and_must_end(void **state)
{
    struct grammar *g = compile_ok("root ::= \"a\" \"b\"?");
    const char *p[] = {"a", "b", "ab", NULL, "abc"};
    uint32_t l[] = {1, 1, 2, 0, 3};
    uint8_t eog[] = {0, 0, 0, 1, 0};
    struct grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(&v, 5, p, l, eog), 0);
    assert_int_equal(grammar_vocab_n(v), 5);
    struct grammar_matcher *m = NULL;
    assert_int_equal(grammar_matcher_create(&m, g, v), 0);
    uint32_t mask[1];
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], 0x5u); /* a, ab: no eog before the grammar can end */
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept(m, 3), RKV_EINVAL);
    assert_int_equal(grammar_matcher_accept(m, 0), 0);
    assert_true(grammar_matcher_can_end(m));
    assert_false(grammar_matcher_must_end(m));
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], 0xAu); /* b or eog */
    assert_int_equal(grammar_matcher_accept(m, 1), 0);
    assert_true(grammar_matcher_must_end(m));
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], 0x8u);
    assert_int_equal(grammar_matcher_accept(m, 3), 0);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], 0u);
    assert_int_equal(grammar_matcher_accept(m, 1), RKV_EINVAL);
    grammar_matcher_destroy(m);
    /* no token continues "q": the mask falls back to eog so sampling cannot stall */
    struct grammar *g2 = compile_ok("root ::= \"q\"");
    assert_int_equal(grammar_matcher_create(&m, g2, v), 0);
    assert_int_equal(grammar_matcher_mask(m, mask), 0);
    assert_int_equal(mask[0], 0x8u);
    assert_int_equal(grammar_matcher_accept(m, 3), 0);
    grammar_matcher_destroy(m);
    grammar_destroy(g2);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
}

static void test_bad_args(void **state)
{
    struct grammar *g = NULL;
    assert_int_equal(grammar_compile(NULL, 3, &g, NULL, 0), RKV_EINVAL);
    struct grammar_vocab *v = NULL;
    const char *p[] = {"a"};
    uint32_t l[] = {1};
    assert_int_equal(grammar_vocab_create(&v, 0, p, l, NULL), RKV_EINVAL);
    assert_int_equal(grammar_vocab_create(&v, 1, p, l, NULL), 0);
    g = compile_ok("root ::= \"a\"");
    struct grammar_matcher *m = NULL;
    assert_int_equal(grammar_matcher_create(&m, g, v), 0);
    assert_int_equal(grammar_matcher_accept(m, -1), RKV_EINVAL);
    assert_int_equal(grammar_matcher_accept(m, 1), RKV_EINVAL);
    grammar_matcher_destroy(m);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
}

/* matchers on several threads share one grammar (and its mask cache) and one vocab */
struct thread_arg {
    const struct grammar *g;
    const struct grammar_vocab *v;
    char **bytes;
    uint32_t *lens;
    int32_t n;
    unsigned seed;
    int bad;
};

static void *thread_walks(void *p)
{
    struct thread_arg *a = p;
    struct grammar_matcher *m = NULL, *ref = NULL;
    uint32_t mask[8];
    char text[2048];
    if (grammar_matcher_create(&m, a->g, a->v) || grammar_matcher_create(&ref, a->g, a->v)) {
        a->bad = 1;
        return NULL;
    }
    for (int walk = 0; walk < 30 && !a->bad; walk++) {
        grammar_matcher_reset(m);
        size_t tl = 0;
        for (int step = 0; step < 40 && !a->bad; step++) {
            if (grammar_matcher_mask(m, mask)) {
                a->bad = 1;
                break;
            }
            int32_t allowed[256] = {0};
            int na = 0;
            for (int32_t id = 0; id < a->n - 3; id++) {
                grammar_matcher_reset(ref);
                int want = grammar_matcher_accept_bytes(ref, text, tl) == 0 &&
                           grammar_matcher_accept_bytes(ref, a->bytes[id], a->lens[id]) == 0;
                if (bit(mask, id) != want)
                    a->bad = 1;
                if (want)
                    allowed[na++] = id;
            }
            if (!na || grammar_matcher_must_end(m))
                break;
            a->seed = a->seed * 1103515245u + 12345u;
            int32_t pick = allowed[(a->seed >> 8) % (unsigned)na];
            if (grammar_matcher_accept(m, pick) || tl + a->lens[pick] > sizeof text) {
                a->bad = 1;
                break;
            }
            memcpy(text + tl, a->bytes[pick], a->lens[pick]);
            tl += a->lens[pick];
        }
    }
    grammar_matcher_destroy(m);
    grammar_matcher_destroy(ref);
    return NULL;
}

static void test_threads_share_grammar(void **state)
{
    struct grammar *g = compile_ok(JSON_GBNF);
    int32_t n;
    char **bytes;
    uint32_t *lens;
    struct grammar_vocab *v = mixed_vocab(&n, &bytes, &lens);
    assert_true(n <= 256);
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){g, v, bytes, lens, n, 777u + (unsigned)i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_walks, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    grammar_vocab_destroy(v);
    grammar_destroy(g);
    free_pieces(bytes, lens, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_errors), cmocka_unit_test(test_literals_and_classes),
        cmocka_unit_test(test_structure),    cmocka_unit_test(test_mask_vs_brute_force),
        cmocka_unit_test(test_utf8_split),   cmocka_unit_test(test_eog_and_must_end),
        cmocka_unit_test(test_bad_args),     cmocka_unit_test(test_threads_share_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
