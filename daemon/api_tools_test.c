/* api_tools_test.c - tool calling and reasoning: request validation, the call formats, and the
 * streaming parser fed every example split at every byte against its one-shot parse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "daemon/api.h"
#include "daemon/api_tools.h"

/* --- the parser ------------------------------------------------------------------------------ */

/* what the events of one output add up to */
struct got {
    char content[2048], reasoning[2048], calls[2048]; /* calls: "name args|name args|" */
    int n_calls, next_index, bad_id;
};

static void cat(char *dst, size_t cap, const char *s, size_t n)
{
    size_t l = strlen(dst);
    assert_true(l + n < cap);
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static int collect(void *ud, const struct api_tev *ev)
{
    struct got *g = ud;
    assert_true(ev->kind != API_TEV_CONTENT || ev->len > 0);
    if (ev->kind == API_TEV_CONTENT) {
        cat(g->content, sizeof g->content, ev->text, ev->len);
    } else if (ev->kind == API_TEV_REASONING) {
        cat(g->reasoning, sizeof g->reasoning, ev->text, ev->len);
    } else {
        g->bad_id |= strncmp(ev->id, "call_", 5) != 0 || strlen(ev->id) != API_TOOL_ID_LEN;
        g->bad_id |= ev->index != g->next_index++;
        cat(g->calls, sizeof g->calls, ev->name, strlen(ev->name));
        cat(g->calls, sizeof g->calls, " ", 1);
        cat(g->calls, sizeof g->calls, ev->arguments, strlen(ev->arguments));
        cat(g->calls, sizeof g->calls, "|", 1);
        g->n_calls++;
    }
    return 0;
}

struct example {
    enum api_tool_format fmt;
    int flags; /* R: reasoning template, O: prompt opens <think>, S: no parallel calls, N: no
                * tools (tool_choice none) */
    const char *text;
    const char *content, *reasoning, *calls;
};
enum { R = 1, O = 2, S = 4, N = 8 };

static const struct example examples[] = {
    /* hermes / qwen */
    {API_TOOL_FMT_HERMES, 0, "Hello there", "Hello there", "", ""},
    {API_TOOL_FMT_HERMES, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "", "", "get_weather {\"city\":\"Paris\"}|"},
    {API_TOOL_FMT_HERMES, 0,
     "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"b_2\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
     "Let me check.\n", "", "a {}|b_2 {\"x\":[1,2]}|"},
    {API_TOOL_FMT_HERMES, S,
     "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", "
     "\"arguments\": {}}</tool_call>",
     "", "", "a {}|"},
    /* not a call: stays content, every byte */
    {API_TOOL_FMT_HERMES, 0, "x <tool_call>\n{not json}\n</tool_call> y",
     "x <tool_call>\n{not json}\n</tool_call> y", "", ""},
    {API_TOOL_FMT_HERMES, 0, "a <tool_ca", "a <tool_ca", "", ""},
    {API_TOOL_FMT_HERMES, 0, "<tool_call>\n{\"name\": \"a\"", "<tool_call>\n{\"name\": \"a\"", "",
     ""},
    /* no closing tag at the end of the output: still a call */
    {API_TOOL_FMT_HERMES, 0, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": \"v\"}}\n", "",
     "", "f {\"k\":\"v\"}|"},
    /* arguments as a JSON string are accepted */
    {API_TOOL_FMT_HERMES, 0,
     "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>", "", "",
     "f {\"k\":1}|"},
    /* tool_choice none: markup is content */
    {API_TOOL_FMT_HERMES, N, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
     "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "", ""},
    /* qwen3 thinking, then a call */
    {API_TOOL_FMT_HERMES, R,
     "<think>\nI should call f.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
     "{}}\n</tool_call>",
     "", "\nI should call f.\n", "f {}|"},
    {API_TOOL_FMT_HERMES, R, "<think>hmm</think>\n\nThe answer is 4.", "The answer is 4.", "hmm",
     ""},
    {API_TOOL_FMT_HERMES, R, "No thinking here <think>", "No thinking here <think>", "", ""},
    {API_TOOL_FMT_HERMES, R, "<thin", "<thin", "", ""},
    /* deepseek-r1: the prompt opened <think> */
    {API_TOOL_FMT_NONE, R | O, "step 1, step 2</think>\n\n42", "42", "step 1, step 2", ""},
    {API_TOOL_FMT_NONE, R | O, "still thinking </thi", "", "still thinking </thi", ""},
    /* llama 3 */
    {API_TOOL_FMT_LLAMA3, 0, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
     "", "", "get_weather {\"city\":\"Oslo\"}|"},
    {API_TOOL_FMT_LLAMA3, 0,
     "  {\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", \"parameters\": {}}", "",
     "", "a {\"n\":1}|b {}|"},
    {API_TOOL_FMT_LLAMA3, 0, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}", "", "",
     "a {}|"},
    {API_TOOL_FMT_LLAMA3, 0, "{\"answer\": 42}", "{\"answer\": 42}", "", ""},
    {API_TOOL_FMT_LLAMA3, 0, "Sure: {\"name\": \"a\", \"parameters\": {}}",
     "Sure: {\"name\": \"a\", \"parameters\": {}}", "", ""},
    {API_TOOL_FMT_LLAMA3, 0, "{\"name\": \"a\", \"parameters\": {}} and more",
     "{\"name\": \"a\", \"parameters\": {}} and more", "", ""},
    {API_TOOL_FMT_LLAMA3, 0, "   ", "   ", "", ""},
    /* mistral */
    {API_TOOL_FMT_MISTRAL, 0,
     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", "
     "\"arguments\": {}}]",
     "", "", "a {\"q\":\"x\"}|b {}|"},
    {API_TOOL_FMT_MISTRAL, 0, "Calling.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}",
     "Calling.", "", "get_weather {\"city\":\"Rome\"}|"},
    {API_TOOL_FMT_MISTRAL, 0,
     "[TOOL_CALLS]a[CALL_ID]abc123XYZ[ARGS]{\"n\": 1}[TOOL_CALLS]b[ARGS]{}", "", "",
     "a {\"n\":1}|b {}|"},
    {API_TOOL_FMT_MISTRAL, 0, "[TOOL_CALLS]a[ARGS]{broken", "[TOOL_CALLS]a[ARGS]{broken", "", ""},
    {API_TOOL_FMT_MISTRAL, 0, "text [TOOL_CA", "text [TOOL_CA", "", ""},
    /* multi-byte text around markers */
    {API_TOOL_FMT_HERMES, 0,
     "Température: 20°C. <tool_call>{\"name\": \"météo\", \"arguments\": {}}</tool_call>",
     "Température: 20°C. <tool_call>{\"name\": \"météo\", \"arguments\": {}}</tool_call>", "", ""},
    {API_TOOL_FMT_HERMES, 0,
     "日本語 <tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"東京\"}}</tool_call>", "日本語 ",
     "", "f {\"s\":\"東京\"}|"},
};

static struct api_tools tools_for(const struct example *e)
{
    struct api_tools t = {0};
    t.format = e->fmt;
    t.parse_calls = !(e->flags & N) && e->fmt != API_TOOL_FMT_NONE;
    t.reasoning = (e->flags & R) != 0;
    t.starts_in_reasoning = (e->flags & O) != 0;
    t.parallel = !(e->flags & S);
    return t;
}

/* feeds text cut at the given offsets (sorted, in (0, len)) */
static void run_cuts(const struct example *e, const size_t *cuts, size_t n_cuts, struct got *g)
{
    struct api_tools t = tools_for(e);
    struct api_tparse *p;
    memset(g, 0, sizeof *g);
    assert_int_equal(api_tparse_create(&t, &p), 0);
    size_t len = strlen(e->text), at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        assert_int_equal(api_tparse_feed(p, e->text + at, end - at, collect, g), 0);
        at = end;
    }
    assert_int_equal(api_tparse_finish(p, collect, g), 0);
    assert_int_equal(api_tparse_calls(p), g->n_calls);
    api_tparse_destroy(p);
    assert_false(g->bad_id);
}

static void same(const struct got *a, const struct got *b, const struct example *e, size_t cut)
{
    if (strcmp(a->content, b->content) || strcmp(a->reasoning, b->reasoning) ||
        strcmp(a->calls, b->calls))
        fail_msg("'%s' cut at %zu: content '%s' vs '%s', reasoning '%s' vs '%s', calls '%s' vs "
                 "'%s'",
                 e->text, cut, a->content, b->content, a->reasoning, b->reasoning, a->calls,
                 b->calls);
}

static void test_parse_one_shot(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
        const struct example *e = &examples[i];
        struct got g;
        run_cuts(e, NULL, 0, &g);
        if (strcmp(g.content, e->content) || strcmp(g.reasoning, e->reasoning) ||
            strcmp(g.calls, e->calls))
            fail_msg("example %zu '%s': content '%s' (want '%s'), reasoning '%s' (want '%s'), "
                     "calls '%s' (want '%s')",
                     i, e->text, g.content, e->content, g.reasoning, e->reasoning, g.calls,
                     e->calls);
    }
}

/* every example split at every byte, in two and in three pieces, and byte by byte */
static void test_parse_every_split(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
        const struct example *e = &examples[i];
        size_t len = strlen(e->text);
        struct got whole, g;
        run_cuts(e, NULL, 0, &whole);
        for (size_t a = 1; a < len; a++) {
            run_cuts(e, &a, 1, &g);
            same(&whole, &g, e, a);
            for (size_t b = a + 1; b < len; b++) {
                size_t cuts[2] = {a, b};
                run_cuts(e, cuts, 2, &g);
                same(&whole, &g, e, a * 1000 + b);
            }
        }
        size_t *bytes = malloc(len * sizeof *bytes);
        for (size_t k = 1; k < len; k++)
            bytes[k - 1] = k;
        run_cuts(e, bytes, len ? len - 1 : 0, &g);
        same(&whole, &g, e, 0);
        free(bytes);
    }
}

/* an output without any text: nothing but the end */
static void test_parse_empty(void **state)
{
    (void)state;
    struct api_tools t = {.format = API_TOOL_FMT_LLAMA3, .parse_calls = true, .reasoning = true};
    struct api_tparse *p;
    struct got g = {0};
    assert_int_equal(api_tparse_create(&t, &p), 0);
    assert_int_equal(api_tparse_finish(p, collect, &g), 0);
    assert_string_equal(g.content, "");
    assert_int_equal(g.n_calls, 0);
    api_tparse_destroy(p);
}

/* nothing that opens a call leaks into content before the call is decided */
static void test_parse_no_markup_leak(void **state)
{
    (void)state;
    struct api_tools t = tools_for(&examples[2]);
    struct api_tparse *p;
    struct got g = {0};
    assert_int_equal(api_tparse_create(&t, &p), 0);
    const char *text = examples[2].text;
    for (size_t i = 0; text[i]; i++) {
        assert_int_equal(api_tparse_feed(p, text + i, 1, collect, &g), 0);
        assert_null(strstr(g.content, "<tool"));
    }
    /* the text before the call came out as soon as it could not start one */
    assert_int_equal(api_tparse_finish(p, collect, &g), 0);
    assert_string_equal(g.content, "Let me check.\n");
    api_tparse_destroy(p);
    /* content streams without waiting when no marker is possible */
    memset(&g, 0, sizeof g);
    assert_int_equal(api_tparse_create(&t, &p), 0);
    assert_int_equal(api_tparse_feed(p, "Hello <", 7, collect, &g), 0);
    assert_string_equal(g.content, "Hello ");
    assert_int_equal(api_tparse_feed(p, "b>", 2, collect, &g), 0);
    assert_string_equal(g.content, "Hello <b>");
    assert_int_equal(api_tparse_finish(p, collect, &g), 0);
    api_tparse_destroy(p);
}

/* --- the stream and message shapes ------------------------------------------------------------ */

static void test_events_json(void **state)
{
    (void)state;
    struct api_tev ev = {
        .kind = API_TEV_CALL, .index = 1, .id = "call_x", .name = "f", .arguments = "{\"a\":1}"};
    cJSON *d = api_tev_delta(&ev, 0);
    char *s = cJSON_PrintUnformatted(d);
    assert_string_equal(s, "{\"tool_calls\":[{\"index\":1,\"id\":\"call_x\",\"type\":\"function\","
                           "\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}");
    free(s);
    cJSON_Delete(d);
    d = api_tev_delta(&ev, 1);
    s = cJSON_PrintUnformatted(d);
    assert_string_equal(s, "{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":"
                           "\"{\\\"a\\\":1}\"}}]}");
    free(s);
    cJSON_Delete(d);
    struct api_tev r = {.kind = API_TEV_REASONING, .text = "hmm", .len = 3};
    d = api_tev_delta(&r, 0);
    s = cJSON_PrintUnformatted(d);
    assert_string_equal(s, "{\"reasoning_content\":\"hmm\"}");
    free(s);
    cJSON_Delete(d);

    struct api_tout o = {0};
    assert_int_equal(api_tout_collect(&o, &r), 0);
    assert_int_equal(api_tout_collect(&o, &ev), 0);
    cJSON *m = cJSON_CreateObject();
    assert_int_equal(api_tout_message(&o, m), 0);
    s = cJSON_PrintUnformatted(m);
    assert_string_equal(s,
                        "{\"content\":null,\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":"
                        "\"call_x\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"arguments\":\"{\\\"a\\\":1}\"}}]}");
    free(s);
    cJSON_Delete(m);
    api_tout_fini(&o);
    /* no calls, no reasoning: content is a string even when empty */
    m = cJSON_CreateObject();
    assert_int_equal(api_tout_message(&o, m), 0);
    s = cJSON_PrintUnformatted(m);
    assert_string_equal(s, "{\"content\":\"\"}");
    free(s);
    cJSON_Delete(m);

    char id[API_TOOL_ID_LEN + 1], id2[API_TOOL_ID_LEN + 1];
    api_tools_call_id(id, sizeof id);
    api_tools_call_id(id2, sizeof id2);
    assert_int_equal(strlen(id), API_TOOL_ID_LEN);
    assert_memory_equal(id, "call_", 5);
    assert_string_not_equal(id, id2);
}

/* --- request fields ------------------------------------------------------------------------------
 */

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL(n)                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"" n "\",\"parameters\":{\"type\":\"object\"}" \
                                                         "}}"

static int chat(const char *body, struct api_request *r, struct api_error *e)
{
    struct api_limits lim;
    api_limits_default(&lim);
    memset(e, 0, sizeof *e);
    return api_parse_chat(body, strlen(body), &lim, r, e);
}

static void test_request_fields(void **state)
{
    (void)state;
    struct api_request r;
    struct api_error e;
    assert_int_equal(chat("{" MSG ",\"tools\":[" TOOL("get_weather") "," TOOL(
                              "b-2") "],"
                                     "\"parallel_tool_calls\":false,\"chat_template_kwargs\":"
                                     "{\"enable_thinking\":false},\"reasoning_effort\":\"low\"}",
                          &r, &e),
                     0);
    assert_non_null(r.tools);
    assert_int_equal(r.tools->n_tools, 2);
    assert_string_equal(r.tools->names[1], "b-2");
    assert_int_equal(r.tools->choice, API_TOOL_CHOICE_AUTO);
    assert_false(r.tools->parallel);
    assert_string_equal(r.tools->kwargs_json, "{\"enable_thinking\":false}");
    assert_string_equal(r.tools->reasoning_effort, "low");
    assert_non_null(strstr(r.tools->tools_json, "\"name\":\"get_weather\""));
    api_request_fini(&r);
    /* tool_choice none keeps the tools for the template */
    assert_int_equal(chat("{" MSG ",\"tools\":[" TOOL("a") "],\"tool_choice\":\"none\"}", &r, &e),
                     0);
    assert_int_equal(r.tools->choice, API_TOOL_CHOICE_NONE);
    assert_non_null(r.tools->tools_json);
    api_request_fini(&r);
    /* an empty list is no tools */
    assert_int_equal(chat("{" MSG ",\"tools\":[],\"tool_choice\":\"auto\"}", &r, &e), 0);
    assert_null(r.tools->tools_json);
    api_request_fini(&r);
}

struct bad {
    const char *body;
    const char *param;
    const char *msg;
};

static const struct bad bad_fields[] = {
    {"{" MSG ",\"tools\":{}}", "tools", "an array of at most 128 tools"},
    {"{" MSG ",\"tools\":[1]}", "tools[0]", "tools[0] must be {\"type\": \"function\""},
    {"{" MSG ",\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"a\"}}]}",
     "tools[0].type", "\"function\""},
    {"{" MSG ",\"tools\":[{\"type\":\"function\"}]}", "tools[0].function",
     "must be an object {\"name\", \"description\", \"parameters\"}, got nothing"},
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
     "tools[0].function.name", "1 to 64 characters of a-z"},
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}",
     "tools[0].function.name", "got \"\""},
    {"{" MSG ",\"tools\":[" TOOL("a") "," TOOL("a") "]}", "tools[1].function.name",
     "also tools[0]'s"},
    {"{" MSG
     ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]}",
     "tools[0].function.parameters", "a JSON schema object"},
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"strict\":1}}]}",
     "tools[0].function.strict", "true or false"},
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"extra\":1}}]}",
     "tools[0].function.extra", "unknown field"},
    {"{" MSG ",\"tool_choice\":\"sometimes\"}", "tool_choice", "\"none\", \"auto\", \"required\""},
    {"{" MSG ",\"tool_choice\":\"required\"}", "tool_choice", "needs tools"},
    {"{" MSG ",\"tools\":[" TOOL("a") "],\"tool_choice\":{\"type\":\"function\",\"function\":"
                                      "{\"name\":\"b\"}}}",
     "tool_choice.function.name", "'b' is not one of the request's tools"},
    {"{" MSG ",\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls", "true or false"},
    {"{" MSG ",\"chat_template_kwargs\":[]}", "chat_template_kwargs", "an object of template"},
    {"{" MSG ",\"chat_template_kwargs\":{\"tools\":[]}}", "chat_template_kwargs.tools",
     "set by rkv from the request"},
    {"{" MSG ",\"reasoning_effort\":\"max\"}", "reasoning_effort", "\"low\", \"medium\" or"},
    {"{" MSG ",\"functions\":[{\"name\":\"a\"}]}", "functions", "send the same functions as tools"},
    {"{" MSG ",\"function_call\":{\"name\":\"a\"}}", "function_call", "use tool_choice"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"tool_calls\":[]},"
     "{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[{\"id\":\"c\",\"function\":"
     "{\"name\":\"a\",\"arguments\":\"{}\"}}]}]}",
     "messages[1].tool_calls", "only an assistant message"},
    {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":"
     "{\"name\":\"a\",\"arguments\":\"{}\"}}]}]}",
     "messages[0].tool_calls[0].id", "a string"},
    {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
     "\"function\":{\"name\":\"a\",\"arguments\":\"{oops\"}}]}]}",
     "messages[0].tool_calls[0].function.arguments", "a string holding a JSON value"},
    {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":{}}]}",
     "messages[0].tool_calls", "an array of"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_call_id\":\"c\"}]}",
     "messages[0].tool_call_id", "only a tool message"},
    {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":5}]}",
     "messages[0].tool_call_id", "a string"},
};

static void test_request_bad(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_fields / sizeof *bad_fields; i++) {
        struct api_request r;
        struct api_error e;
        int rc = chat(bad_fields[i].body, &r, &e);
        if (rc != RKV_EINVAL || e.status != 400 || strcmp(e.param, bad_fields[i].param) ||
            !strstr(e.message, bad_fields[i].msg))
            fail_msg("case %zu: rc %d status %d param '%s' message '%s' (want '%s', '%s')", i, rc,
                     e.status, e.param, e.message, bad_fields[i].param, bad_fields[i].msg);
    }
}

static void test_message_extra(void **state)
{
    (void)state;
    struct api_request r;
    struct api_error e;
    assert_int_equal(
        chat("{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
             "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"20C\"}]}",
             &r, &e),
        0);
    assert_null(r.messages[0].extra_json);
    assert_string_equal(r.messages[1].content, "");
    /* arguments reach the template as an object, as vLLM hands them */
    assert_string_equal(r.messages[1].extra_json,
                        "{\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":"
                        "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]}");
    assert_string_equal(r.messages[2].extra_json, "{\"tool_call_id\":\"call_1\"}");
    api_request_fini(&r);
}

/* --- constrained decoding's inputs --------------------------------------------------------------
 */

static void test_constraint(void **state)
{
    (void)state;
    struct api_tools t = {0};
    t.tools_json = "[" TOOL("a") ",{\"type\":\"function\",\"function\":{\"name\":\"b\"}}]";
    t.n_tools = 2;
    t.choice = API_TOOL_CHOICE_NAMED;
    t.choice_name = "b";
    t.format = API_TOOL_FMT_HERMES;
    struct api_tool_constraint c;
    assert_int_equal(api_tools_constraint(&t, &c), 0);
    assert_string_equal(c.prefix, "<tool_call>\n");
    assert_string_equal(c.suffix, "\n</tool_call>");
    assert_string_equal(c.schema, "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"b\"},"
                                  "\"arguments\":{\"type\":\"object\"}},\"required\":[\"name\","
                                  "\"arguments\"],\"additionalProperties\":false}");
    free(c.schema);
    t.choice = API_TOOL_CHOICE_REQUIRED;
    t.format = API_TOOL_FMT_LLAMA3;
    assert_int_equal(api_tools_constraint(&t, &c), 0);
    assert_string_equal(c.prefix, "");
    assert_string_equal(c.schema,
                        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":"
                        "\"a\"},\"parameters\":{\"type\":\"object\"}},\"required\":[\"name\","
                        "\"parameters\"],\"additionalProperties\":false},{\"type\":\"object\","
                        "\"properties\":{\"name\":{\"const\":\"b\"},\"parameters\":{\"type\":"
                        "\"object\"}},\"required\":[\"name\",\"parameters\"],"
                        "\"additionalProperties\":false}]}");
    free(c.schema);
    t.choice = API_TOOL_CHOICE_AUTO;
    assert_int_equal(api_tools_constraint(&t, &c), RKV_EINVAL);
    assert_false(api_tools_forces_call(&t));
    t.choice = API_TOOL_CHOICE_REQUIRED;
    assert_true(api_tools_forces_call(&t));
}

/* control tokens the scheduler keeps as text: this request's markers only */
static void test_keeps_token(void **state)
{
    (void)state;
    struct api_tools t = {.format = API_TOOL_FMT_MISTRAL, .parse_calls = true};
    assert_true(api_tools_keeps_token(&t, "[TOOL_CALLS]", 12));
    assert_true(api_tools_keeps_token(&t, "[ARGS]", 6));
    assert_false(api_tools_keeps_token(&t, "[TOOL_CALLS", 11));
    assert_false(api_tools_keeps_token(&t, "<|python_tag|>", 14));
    assert_false(api_tools_keeps_token(&t, "<think>", 7));
    assert_false(api_tools_keeps_token(&t, "</s>", 4));
    t.parse_calls = false; /* tool_choice none */
    assert_false(api_tools_keeps_token(&t, "[TOOL_CALLS]", 12));
    t.format = API_TOOL_FMT_LLAMA3;
    t.parse_calls = true;
    t.reasoning = true;
    assert_true(api_tools_keeps_token(&t, "<|python_tag|>", 14));
    assert_true(api_tools_keeps_token(&t, "</think>", 8));
    assert_false(api_tools_keeps_token(NULL, "<think>", 7));
}

static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(api_tools_detect("{{ '<tool_call>' }}"), API_TOOL_FMT_HERMES);
    assert_int_equal(api_tools_detect("[TOOL_CALLS]"), API_TOOL_FMT_MISTRAL);
    assert_int_equal(api_tools_detect("<|start_header_id|>{% if tools %}"), API_TOOL_FMT_LLAMA3);
    assert_int_equal(api_tools_detect("<|start_header_id|>"), API_TOOL_FMT_NONE);
    assert_int_equal(api_tools_detect(NULL), API_TOOL_FMT_NONE);
    assert_string_equal(api_tool_format_name(API_TOOL_FMT_MISTRAL), "mistral");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_one_shot),
        cmocka_unit_test(test_parse_every_split),
        cmocka_unit_test(test_parse_no_markup_leak),
        cmocka_unit_test(test_events_json),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_request_bad),
        cmocka_unit_test(test_message_extra),
        cmocka_unit_test(test_constraint),
        cmocka_unit_test(test_parse_empty),
        cmocka_unit_test(test_keeps_token),
        cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
