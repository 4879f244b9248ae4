/* json_schema_test.c - schema -> GBNF: the texts each schema's grammar accepts, and the errors. */
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
#include "common/json_schema.h"

struct g {
    struct grammar *g;
    struct grammar_vocab *v;
    struct grammar_matcher *m;
};

static struct g load(const char *schema)
{
    struct g x = {0};
    char *gbnf = NULL;
    char err[512];
    int rc = json_schema_to_gbnf(schema, strlen(schema), &gbnf, err, sizeof err);
    if (rc)
        print_error("schema %s: %s\n", schema, err);
    assert_int_equal(rc, 0);
    rc = grammar_compile(gbnf, strlen(gbnf), &x.g, err, sizeof err);
    if (rc)
        print_error("gbnf %s: %s\n", gbnf, err);
    assert_int_equal(rc, 0);
    free(gbnf);
    const char *p[] = {"x"};
    uint32_t l[] = {1};
    assert_int_equal(grammar_vocab_create(&x.v, 1, p, l, NULL), 0);
    assert_int_equal(grammar_matcher_create(&x.m, x.g, x.v), 0);
    return x;
}

static void unload(struct g *x)
{
    grammar_matcher_destroy(x->m);
    grammar_vocab_destroy(x->v);
    grammar_destroy(x->g);
}

/* 1 when text is a complete value of the grammar */
static int ok(struct g *x, const char *text)
{
    grammar_matcher_reset(x->m);
    return grammar_matcher_accept_bytes(x->m, text, strlen(text)) == 0 &&
           grammar_matcher_can_end(x->m);
}

static void expect(const char *schema, const char *const *yes, const char *const *no)
{
    struct g x = load(schema);
    for (size_t i = 0; yes && yes[i]; i++) {
        if (!ok(&x, yes[i]))
            print_error("schema %s refuses %s\n", schema, yes[i]);
        assert_true(ok(&x, yes[i]));
    }
    for (size_t i = 0; no && no[i]; i++) {
        if (ok(&x, no[i]))
            print_error("schema %s accepts %s\n", schema, no[i]);
        assert_false(ok(&x, no[i]));
    }
    unload(&x);
}
#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_primitives(void **state)
{
    expect("{\"type\":\"string\"}", L("\"\"", "\"a\\\"b\\\\ \\u00e9 \\n\"", "\"caf\xc3\xa9\""),
           L("\"a", "\"\x01\"", "\"\\x\"", "\"\\u12\"", "a", "\"\xc3\"", "\"\\ud83d\\ude00\"",
             "\"\\uDFFF\""));
    expect("{\"type\":\"string\"}", L("\"\\uD7FF\\uE000\\uffff\\u0000\""), NULL);
    expect("{\"type\":\"integer\"}", L("0", "-7", "1234567890123456"),
           L("01", "-0.5", "+1", "1e3", "12345678901234567", "-"));
    expect("{\"type\":\"number\"}", L("0", "-0.5", "1e3", "2.5E-10", "7"),
           L(".5", "1.", "1e", "--1", "0x1"));
    expect("{\"type\":\"boolean\"}", L("true", "false"), L("True", "1"));
    expect("{\"type\":\"null\"}", L("null"), L("nil", "\"null\""));
    expect("{\"type\":[\"string\",\"null\"]}", L("null", "\"s\""), L("1"));
    expect("true", L("1", "{\"a\": [null]}", "\"x\""), L("{", "nul"));
    expect("{}", L("[1, 2]", "{}"), L("[1,]"));
}

static void test_strings(void **state)
{
    expect("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
           L("\"ab\"", "\"abc\"", "\"\\u00e9\\n\"", "\"\xe6\x97\xa5\xe6\x9c\xac\""),
           L("\"a\"", "\"abcd\""));
    expect("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}\\\\d(x|yz)?$\"}",
           L("\"AB1\"", "\"CD9x\"", "\"EF0yz\""), L("\"AB\"", "\"ab1\"", "\"AB1y\"", "\"zAB1\""));
    /* unanchored: other characters around (at most 16 on each side) */
    expect("{\"type\":\"string\",\"pattern\":\"ab+c\"}",
           L("\"abc\"", "\"xxabbbcyy\"", "\"\\\"abc\""), L("\"ac\"", "\"abx\""));
    expect("{\"type\":\"string\",\"pattern\":\"^[^a-c]\\\\.\\\\w\\\\s$\"}",
           L("\"z.a \"", "\"\\\".9\\t\"", "\"\\\\._\\n\""), L("\"a.a \"", "\"z.a\""));
    expect("{\"type\":\"string\",\"format\":\"date\"}", L("\"2024-02-28\"", "\"1999-12-31\""),
           L("\"2024-02-30\"", "\"2024-13-01\"", "\"0999-01-01\"", "\"2024-4-01\""));
    expect("{\"type\":\"string\",\"format\":\"date-time\"}",
           L("\"2024-06-30T23:59:59Z\"", "\"2024-01-01T00:00:00.123+05:30\""),
           L("\"2024-06-31T00:00:00Z\"", "\"2024-06-30T24:00:00Z\"", "\"2024-06-30 12:00:00Z\""));
    expect("{\"type\":\"string\",\"format\":\"uuid\"}",
           L("\"123e4567-e89b-12d3-a456-426614174000\""),
           L("\"123e4567e89b12d3a456426614174000\""));
    expect("{\"type\":\"string\",\"format\":\"email\"}", L("\"a.b+c@ex.com\""),
           L("\"a@b\"", "\"@b.c\""));
}

static void test_integer_ranges(void **state)
{
    static const long long ranges[][2] = {{-123, 4567}, {0, 0},    {-50, -3}, {7, 7},
                                          {10, 99},     {1, 1000}, {-9, 9},   {95, 205}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}",
                 ranges[r][0], ranges[r][1]);
        struct g x = load(schema);
        for (long long v = -300; v <= 5000; v++) {
            char t[32];
            snprintf(t, sizeof t, "%lld", v);
            int want = v >= ranges[r][0] && v <= ranges[r][1];
            if (ok(&x, t) != want)
                print_error("%s: %s gives %d\n", schema, t, !want);
            assert_int_equal(ok(&x, t), want);
        }
        assert_false(ok(&x, "007"));
        assert_false(ok(&x, "-0"));
        unload(&x);
    }
    expect("{\"type\":\"integer\",\"exclusiveMinimum\":7,\"exclusiveMaximum\":10}", L("8", "9"),
           L("7", "10"));
    expect("{\"type\":\"integer\",\"minimum\":17}", L("17", "9999999999999999"),
           L("16", "-17", "10000000000000000"));
}

static void test_number_bounds(void **state)
{
    expect("{\"type\":\"number\",\"minimum\":-5,\"maximum\":5}",
           L("-5", "5", "4.999", "-4.5", "0", "-0.25", "3"), L("5.5", "-5.5", "6", "-6", "1e2"));
    expect("{\"type\":\"number\",\"minimum\":2,\"maximum\":3}", L("2", "2.5", "3"),
           L("1.9", "3.1", "-2"));
    expect("{\"type\":\"number\",\"minimum\":-10,\"maximum\":-2}", L("-10", "-2", "-2.5", "-9.9"),
           L("-1.5", "-10.5", "2"));
}

static void test_objects(void **state)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                    "\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"boolean\"}},"
                    "\"required\":[\"b\"]}";
    expect(s,
           L("{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{\"a\": 1, \"b\": \"\", \"c\": true}",
             "{ \"b\" : \"x\" ,\n  \"c\":false }", "{\"b\":\"x\",\"c\":true}"),
           L("{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",}", "{\"b\":\"x\",\"d\":1}",
             "{\"b\":\"x\" \"c\":true}"));
    /* additional properties: any key but the declared ones, after them */
    expect("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},"
           "\"additionalProperties\":{\"type\":\"null\"}}",
           L("{}", "{\"ab\":1}", "{\"ab\":1,\"x\":null}", "{\"a\":null}", "{\"abc\":null}",
             "{\"x\":null,\"y\":null}", "{\"\":null}"),
           L("{\"ab\":null}", "{\"x\":1}", "{\"x\":null,\"ab\":1}"));
    expect("{\"type\":\"object\",\"additionalProperties\":false}", L("{}"), L("{\"a\":1}"));
    expect("{\"type\":\"object\"}", L("{}", "{\"a\":[1,{\"b\":null}]}"), L("[]"));
    expect("{\"required\":[\"q\"]}", L("{\"q\":[1]}"), L("{}"));
    /* whitespace: nothing, a space, or a newline and up to 20 blanks */
    expect("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}}}",
           L("{\n                    \"a\":null}", "{ \"a\" : null }"),
           L("{\n                     \"a\":null}", "{  \"a\":null}", " {}", "{}\n"));
    expect("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},"
           "\"required\":[\"a\"]},{\"properties\":{\"b\":{\"const\":2}},\"required\":[\"b\"]}]}",
           L("{\"a\":1,\"b\":2}"), L("{\"a\":1}", "{\"b\":2}"));
}

static void test_arrays(void **state)
{
    expect("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
           L("[1,2]", "[1, 2, 3]", "[ 1 ,2 ]"), L("[]", "[1]", "[1,2,3,4]", "[1,,2]"));
    expect("{\"type\":\"array\",\"items\":{\"type\":\"null\"}}", L("[]", "[null]", "[null,null]"),
           L("[1]", "[null,]"));
    expect("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
           "\"items\":false}",
           L("[]", "[\"a\"]", "[\"a\",1]"), L("[1]", "[\"a\",1,2]"));
    expect("{\"type\":\"array\",\"prefixItems\":[{\"const\":\"h\"}],\"items\":{\"type\":"
           "\"boolean\"},\"minItems\":2,\"maxItems\":3}",
           L("[\"h\",true]", "[\"h\",true,false]"), L("[\"h\"]", "[\"h\",true,true,true]"));
    expect("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"}]}",
           L("[]", "[null]", "[null,{\"a\":1}]"), L("[1]"));
    expect("{\"type\":\"array\",\"maxItems\":0}", L("[]"), L("[1]"));
}

static void test_enum_const_anyof_refs(void **state)
{
    expect("{\"enum\":[\"a\\\"b\",1.5,null,[1,{\"x\":true}],\"\xc3\xa9\"]}",
           L("\"a\\\"b\"", "1.5", "null", "[1,{\"x\":true}]", "\"\xc3\xa9\""),
           L("\"a\"", "1", "[1, {\"x\":true}]"));
    expect("{\"const\":{\"k\":\"v\"}}", L("{\"k\":\"v\"}"), L("{\"k\": \"v\"}"));
    expect("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}",
           L("1", "\"a\""), L("\"ab\"", "null"));
    expect("{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"}]}", L("null", "true"), L("1"));
    const char *tree = "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":"
                       "\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"k\"]}},"
                       "\"$ref\":\"#/$defs/t\"}";
    expect(tree, L("{\"k\":[]}", "{\"k\":[{\"k\":[{\"k\":[]}]},{\"k\":[]}]}"),
           L("{\"k\":[{}]}", "{}"));
    expect("{\"definitions\":{\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":3}},"
           "\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/n\"}}",
           L("[1,2,3]"), L("[0]", "[4]"));
    expect("{\"type\":\"object\",\"properties\":{\"self\":{\"anyOf\":[{\"$ref\":\"#\"},"
           "{\"type\":\"null\"}]}},\"required\":[\"self\"]}",
           L("{\"self\":null}", "{\"self\":{\"self\":null}}"), L("{\"self\":{}}"));
}

static void expect_err(const char *schema, int code, const char *want)
{
    char *gbnf = NULL;
    char err[512] = "";
    int rc = json_schema_to_gbnf(schema, strlen(schema), &gbnf, err, sizeof err);
    if (rc != code || !strstr(err, want))
        print_error("schema %s: rc %d \"%s\", want %d \"%s\"\n", schema, rc, err, code, want);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err, want));
    assert_null(gbnf);
}

static void test_errors(void **state)
{
    expect_err("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"object\","
               "\"patternProperties\":{}}}}",
               RKV_EUNSUPPORTED,
               "schema/properties/tags: keyword \"patternProperties\" is not supported "
               "(supported: type, properties,");
    expect_err("{\"type\":\"array\",\"items\":{\"not\":{}}}", RKV_EUNSUPPORTED,
               "schema/items: keyword \"not\" is not supported");
    expect_err("{\"anyOf\":[{\"type\":\"null\"},{\"if\":{}}]}", RKV_EUNSUPPORTED,
               "schema/anyOf/1: keyword \"if\" is not supported");
    expect_err("{\"type\":\"strnig\"}", RKV_EINVAL, "schema: keyword \"type\": \"strnig\" is not");
    expect_err("{\"type\":3}", RKV_EINVAL, "schema: keyword \"type\" must be a string");
    expect_err("{\"$ref\":\"#/$defs/nope\"}", RKV_EINVAL,
               "schema: $ref \"#/$defs/nope\" does not resolve");
    expect_err("{\"$ref\":\"https://example.com/s.json\"}", RKV_EUNSUPPORTED,
               "local references only");
    expect_err("{\"type\":\"string\",\"format\":\"ipv6\"}", RKV_EUNSUPPORTED,
               "keyword \"format\": \"ipv6\" is not supported (supported: date, time");
    expect_err("{\"type\":\"string\",\"pattern\":\"a\\\\1\"}", RKV_EUNSUPPORTED,
               "keyword \"pattern\": an unsupported escape");
    expect_err("{\"type\":\"string\",\"pattern\":\"a(?<n>b)\"}", RKV_EUNSUPPORTED,
               "a lookaround or named group at offset 1");
    expect_err("{\"type\":\"string\",\"pattern\":\"a^b\"}", RKV_EUNSUPPORTED,
               "an anchor inside the pattern");
    expect_err("{\"type\":\"string\",\"pattern\":\"(ab\"}", RKV_EUNSUPPORTED, "a missing ')'");
    expect_err("{\"type\":\"string\",\"pattern\":\"[:alpha:]x{2,1}\"}", RKV_EUNSUPPORTED,
               "a bad {m,n}");
    char deep[700] = "{\"pattern\":\"";
    for (int i = 0; i < 300; i++)
        strcat(deep, "(");
    strcat(deep, "\"}");
    expect_err(deep, RKV_EUNSUPPORTED, "groups nested too deep");
    expect_err("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", RKV_EINVAL,
               "minItems 3 is above the most items allowed (2)");
    expect_err("{\"type\":\"string\",\"minLength\":-1}", RKV_EINVAL,
               "keyword \"minLength\" must be a non-negative integer");
    expect_err("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", RKV_EINVAL,
               "no integer lies between minimum and maximum");
    expect_err("{\"type\":\"number\",\"minimum\":0.5}", RKV_EUNSUPPORTED,
               "keywords \"minimum\"/\"maximum\" on numbers must be integers");
    expect_err("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", RKV_EUNSUPPORTED,
               "do not combine");
    expect_err("false", RKV_EUNSUPPORTED, "schema: the schema false allows no value");
    expect_err("[1]", RKV_EINVAL, "schema: a schema must be an object or a boolean");
    expect_err("{\"type\":", RKV_EFORMAT, "schema: not valid JSON");
    expect_err("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", RKV_EUNSUPPORTED,
               "the parts disagree on \"type\"");
    expect_err("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
               RKV_EUNSUPPORTED, "left recursion");
    expect_err("{\"$ref\":\"#/$defs/a\",\"type\":\"string\",\"$defs\":{\"a\":{}}}",
               RKV_EUNSUPPORTED, "keyword \"type\" beside \"$ref\" is not supported");
}

static void test_any_object(void **state)
{
    const char *t = json_schema_any_object_gbnf();
    struct g x = {0};
    assert_int_equal(grammar_compile(t, strlen(t), &x.g, NULL, 0), 0);
    const char *p[] = {"x"};
    uint32_t l[] = {1};
    assert_int_equal(grammar_vocab_create(&x.v, 1, p, l, NULL), 0);
    assert_int_equal(grammar_matcher_create(&x.m, x.g, x.v), 0);
    assert_true(ok(&x, "{}"));
    assert_true(ok(&x, "{\"a\": [1, -2.5e3, \"x\", {\"b\": null}], \"c\": true}"));
    assert_false(ok(&x, "[]"));
    assert_false(ok(&x, "{\"a\"}"));
    assert_false(ok(&x, "\"x\""));
    unload(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_primitives),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_number_bounds),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_enum_const_anyof_refs),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_any_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
