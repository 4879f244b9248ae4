/* api_test.c - OpenAI layer tests: malformed bodies, parsed structs, rendered JSON, endpoints end
 * to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/err.h"
#include "common/util.h"
#include "daemon/api.h"
#include "daemon/http/server.h"
#include "daemon/http/test_client.h"

enum { C = API_COMPLETIONS, H = API_CHAT };

static int parse(int ep, const char *body, size_t len, const struct api_limits *lim,
                 struct api_request *r, struct api_error *e)
{
    return ep == H ? api_parse_chat(body, len, lim, r, e)
                   : api_parse_completions(body, len, lim, r, e);
}

/* --- malformed bodies ------------------------------------------------------------------------ */

struct bad_case {
    int ep;
    const char *body;
    const char *param; /* NULL: "param": null */
    const char *msg;   /* a part of the message */
};

static const struct bad_case bad_cases[] = {
    {C, "", NULL, "request body is empty"},
    {C, "{", NULL, "not valid JSON"},
    {C, "[1,2]", "body", "body must be a JSON object, got [1,2]"},
    {C, "\"str\"", "body", "must be a JSON object"},
    {C, "{\"prompt\":\"hi\"} junk", NULL, "not valid JSON (near byte 16"},
    /* a key twice is refused: cJSON would keep the first, a gateway the last */
    {C, "{\"prompt\":\"x\",\"max_tokens\":1,\"temperature\":0,\"max_tokens\":3}", "max_tokens",
     "the key \"max_tokens\" appears twice"},
    {C, "{\"prompt\":\"x\",\"temperature\":0,\"temperature\":7}", "temperature", "appears twice"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"role\":"
     "\"system\",\"content\":\"b\"}]}",
     "messages[1].role", "the key \"messages[1].role\" appears twice"},
    {C,
     "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true,\"include_usage\":false},"
     "\"stream\":true}",
     "stream_options.include_usage", "appears twice"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":-5}", "max_tokens",
     "max_tokens must be an integer in [1, 32768], got -5"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":0}", "max_tokens", "got 0"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":1e9}", "max_tokens", "got 1000000000"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":1.5}", "max_tokens", "got 1.5"},
    {C, "{\"prompt\":\"hi\",\"max_tokens\":\"10\"}", "max_tokens", "got \"10\""},
    {C, "{\"prompt\":\"hi\",\"temperature\":3.5}", "temperature",
     "temperature must be a number in [0, 2], got 3.5"},
    {C, "{\"prompt\":\"hi\",\"temperature\":-0.1}", "temperature", "got -0.1"},
    {C, "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", "temperature", "got \"hot\""},
    {C, "{\"prompt\":\"hi\",\"top_p\":0}", "top_p", "top_p must be a number in (0, 1], got 0"},
    {C, "{\"prompt\":\"hi\",\"top_p\":1.5}", "top_p", "got 1.5"},
    {C, "{\"prompt\":\"hi\",\"top_k\":-2}", "top_k", "top_k must be an integer in [-1, "},
    {C, "{\"prompt\":\"hi\",\"min_p\":2}", "min_p", "min_p must be a number in [0, 1], got 2"},
    {C, "{\"prompt\":\"hi\",\"presence_penalty\":3}", "presence_penalty", "in [-2, 2], got 3"},
    {C, "{\"prompt\":\"hi\",\"frequency_penalty\":-2.5}", "frequency_penalty", "got -2.5"},
    {C, "{\"prompt\":\"hi\",\"repetition_penalty\":0}", "repetition_penalty", "in (0, 10], got 0"},
    {C, "{\"prompt\":\"hi\",\"seed\":1.5}", "seed", "seed must be an integer"},
    {C, "{\"prompt\":\"hi\",\"seed\":\"x\"}", "seed", "got \"x\""},
    {C, "{\"prompt\":\"hi\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}",
     "stop", "at most 8"},
    {C, "{\"prompt\":\"hi\",\"stop\":[\"\"]}", "stop", "non-empty"},
    {C, "{\"prompt\":\"hi\",\"stop\":5}", "stop", "got 5"},
    {C, "{\"prompt\":\"hi\",\"stop\":[1]}", "stop", "got [1]"},
    {C, "{\"prompt\":\"hi\",\"n\":17}", "n", "n must be an integer in [1, 16], got 17"},
    {C, "{\"prompt\":\"hi\",\"n\":0}", "n", "got 0"},
    {C, "{\"prompt\":\"hi\",\"n\":1.5}", "n", "got 1.5"},
    {C, "{\"prompt\":\"hi\",\"best_of\":17}", "best_of", "in [1, 16], got 17"},
    {C, "{\"prompt\":\"hi\",\"n\":3,\"best_of\":2}", "best_of",
     "best_of (2) must be at least n (3)"},
    {C, "{\"prompt\":\"hi\",\"n\":2,\"best_of\":3,\"stream\":true}", "best_of",
     "best_of > n cannot be streamed"},
    {C,
     "{\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
     "\"a\",\"a\",\"a\",\"a\"],\"n\":16,\"max_tokens\":1}",
     "n", "17 prompts x best_of 16 is 272 sequences"},
    {C, "{\"prompt\":[\"a\",[1,2]]}", "prompt[1]", "a string, as prompt[0] is"},
    {C, "{\"prompt\":[[1,2],\"a\"]}", "prompt[1]", "an array of token ids, as prompt[0] is"},
    {C, "{\"prompt\":[\"a\",\"\"]}", "prompt[1]",
     "prompt[1] must be a non-empty string or a non-empty array of token ids, got \"\""},
    {C, "{\"prompt\":[[1],[]]}", "prompt[1]", "got []"},
    {C, "{\"prompt\":[[1],[2,-3]]}", "prompt[1][1]", "prompt[1][1] must be a token id"},
    {C, "{\"prompt\":[[1],[2,3.5]]}", "prompt[1][1]", "got 3.5"},
    {C, "{\"prompt\":[\"a\",5]}", "prompt[1]", "got 5"},
    {C, "{\"prompt\":\"hi\",\"suffix\":5}", "suffix", "suffix must be a string, got 5"},
    {C, "{\"prompt\":\"hi\",\"suffix\":\"x\",\"echo\":true}", "echo", "echo with suffix"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"best_of\":2}", "best_of",
     "unknown field 'best_of'"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"x\"}", "suffix",
     "unknown field 'suffix'"},
    {C, "{\"prompt\":\"hi\",\"echo\":true,\"logprobs\":1}", "echo", "echo is not supported"},
    {C, "{\"prompt\":\"hi\",\"echo\":1}", "echo", "echo must be true or false"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":[1]}", "logit_bias",
     "logit_bias must be an object mapping token ids (strings) to a bias in [-100, 100], got [1]"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logit_bias\":{\"x\":1}}",
     "logit_bias", "logit_bias key \"x\" is not a token id"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"-1\":1}}", "logit_bias", "key \"-1\""},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"07\":1}}", "logit_bias", "key \"07\""},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":100.5}}", "logit_bias",
     "logit_bias[\"5\"] must be a number in [-100, 100], got 100.5"},
    {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":\"1\"}}", "logit_bias", "got \"1\""},
    {C, "{\"prompt\":\"hi\",\"temprature\":0.5}", "temprature", "unknown field 'temprature'"},
    {C, "{\"max_tokens\":5}", "prompt", "prompt is required"},
    {C, "{\"prompt\":\"\"}", "prompt", "prompt must be a non-empty string"},
    {C, "{\"prompt\":5}", "prompt", "got 5"},
    {C,
     "{\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
     "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
     "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
     "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
     "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}",
     "prompt", "prompt holds 65 prompts; send at most 64"},
    {C, "{\"prompt\":[]}", "prompt", "got []"},
    {C, "{\"prompt\":[1,-1]}", "prompt[1]", "prompt[1] must be a token id in [0, "},
    {C, "{\"prompt\":[1,\"a\"]}", "prompt[1]", "got \"a\""},
    {C, "{\"prompt\":\"hi\",\"logprobs\":21}", "logprobs", "in [0, 20], got 21"},
    {C, "{\"prompt\":\"hi\",\"logprobs\":true}", "logprobs", "got true"},
    {C, "{\"prompt\":\"hi\",\"stream\":\"yes\"}", "stream", "stream must be true or false"},
    {C, "{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":true}}", "stream_options",
     "only allowed when stream is true"},
    {C, "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
     "stream_options.include_usage", "got 1"},
    {C, "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"foo\":true}}", "stream_options",
     "unknown field 'stream_options.foo'"},
    {C, "{\"prompt\":\"\xff\"}", NULL, "not valid UTF-8 (byte 0xff at offset 11)"},
    {C, "{\"prompt\":\"\xc0\xaf\"}", NULL, "not valid UTF-8"},
    {C, "{\"prompt\":\"\xed\xa0\x80\"}", NULL, "not valid UTF-8"},
    {C, "{\"prompt\":\"a\xe2\x82\"}", NULL, "not valid UTF-8"},
    {C, "{\"prompt\":\"a\\u0000b\"}", NULL, "\\u0000"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":5,"
     "\"max_tokens\":\"abc\"}",
     "max_tokens", "max_tokens must be an integer"},
    {C, "{\"prompt\":\"\\ud800\"}", NULL, "not valid JSON"},
    {C, "{\"prompt\":\"hi\",\"model\":5}", "model", "model must be a string, got 5"},
    {C, "{\"prompt\":\"hi\",\"model\":\"\"}", "model", "a model name"},
    {C, "{\"prompt\":\"hi\",\"session_id\":\"\"}", "session_id", "1 to 128 bytes"},
    {C, "{\"prompt\":\"hi\",\"session_id\":\"a\\nb\"}", "session_id", "control characters"},
    {C, "{\"prompt\":\"hi\",\"user\":5}", "user", "user must be a string"},
    {C, "{\"prompt\":\"hi\",\"ignore_eos\":\"true\"}", "ignore_eos", "true or false"},
    {C, "{\"prompt\":\"hi\",\"messages\":[]}", "messages", "unknown field 'messages'"},
    {H, "{}", "messages", "messages is required"},
    {H, "{\"messages\":[]}", "messages", "an array of 1 to 4096 messages, got []"},
    {H, "{\"messages\":\"hi\"}", "messages", "got \"hi\""},
    {H, "{\"messages\":[5]}", "messages[0]", "messages[0] must be an object"},
    {H, "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", "messages[0].role",
     "messages[0].role must be one of system, developer, user, assistant, tool, got \"bot\""},
    {H, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "is required"},
    {H, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content",
     "messages[0].content is required for role 'user'"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content", "got 5"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     "messages[0].content[0].type", "'image_url' is not supported"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
     "messages[0].content[0]", "{\"type\": \"text\""},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"foo\":1}]}", "messages[0].foo",
     "unknown field 'messages[0].foo'"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
     "\"tool_calls\":[{\"id\":\"1\"}]}]}",
     "messages[1].tool_calls[0].function", "must be {\"name\": NAME, \"arguments\""},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":5}", "logprobs",
     "logprobs must be true or false, got 5"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", "top_logprobs",
     "needs logprobs: true"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
     "\"top_logprobs\":21}",
     "top_logprobs", "got 21"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
     "tools[0].function", "tools[0].function must be an object"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
     "\"yaml\"}}",
     "response_format.type", "\"json_object\" or \"json_schema\""},
    {C,
     "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
     "\"name\":\"a\",\"schema\":{\"type\":\"object\",\"patternProperties\":{}}}}}",
     "response_format.json_schema.schema", "patternProperties"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
     "max_completion_tokens", "max_completion_tokens must be an integer in [1, 32768], got 0"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt\":\"x\"}", "prompt",
     "unknown field 'prompt' for /v1/chat/completions"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}",
     "tool_choice", "tool_choice \"required\" needs tools"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":30}", "n", "got 30"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":false}", "echo",
     "unknown field 'echo'"},
    {C, "{\"prompt\":\"hi\",\"skip_special_tokens\":false}", "skip_special_tokens",
     "skip_special_tokens is not supported by rkv; leave it out or send true"},
    {C, "{\"prompt\":\"hi\",\"min_tokens\":5}", "min_tokens", "send 0"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_token_ids\":[2]}",
     "stop_token_ids", "send []"},
};

static void test_bad_bodies(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    assert_true(RKV_ARRAY_LEN(bad_cases) >= 40);
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad_case *bc = &bad_cases[i];
        struct api_request r;
        struct api_error e;
        memset(&e, 0, sizeof(e));
        int rc = parse(bc->ep, bc->body, strlen(bc->body), &lim, &r, &e);
        if (rc != RKV_EINVAL || e.status != 400 ||
            strcmp(e.param, bc->param ? bc->param : "") != 0 || !strstr(e.message, bc->msg)) {
            print_error("case %zu %s: rc %d status %d param '%s' message '%s'\n", i, bc->body, rc,
                        e.status, e.param, e.message);
            fail();
        }
        /* the error JSON parses back in the OpenAI shape */
        char *j = api_error_json(&e);
        cJSON *root = cJSON_Parse(j);
        assert_non_null(root);
        cJSON *err = cJSON_GetObjectItem(root, "error");
        assert_string_equal(cJSON_GetObjectItem(err, "message")->valuestring, e.message);
        assert_string_equal(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error");
        cJSON *param = cJSON_GetObjectItem(err, "param");
        if (bc->param)
            assert_string_equal(param->valuestring, bc->param);
        else
            assert_true(cJSON_IsNull(param));
        assert_non_null(cJSON_GetObjectItem(err, "code"));
        cJSON_Delete(root);
        free(j);
    }
}

/* a raw NUL byte inside a string would cut it short: refused, not read up to it */
static void test_raw_nul_byte(void **state)
{
    (void)state;
    struct api_limits lim;
    api_limits_default(&lim);
    static const char body[] = "{\"prompt\":\"Say hi\0 and more\",\"max_tokens\":5}";
    struct api_request r;
    struct api_error e;
    memset(&e, 0, sizeof(e));
    assert_int_equal(api_parse_completions(body, sizeof body - 1, &lim, &r, &e), RKV_EINVAL);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "NUL byte at offset 17"));
}

typedef int (*parse_fn)(const char *, size_t, const struct api_limits *, struct api_request *,
                        struct api_error *);

/* completions' "prompt" and /detokenize's "tokens" check ids alike */
static void test_token_prompt_limits(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.vocab_size = 10;
    lim.max_prompt_tokens = 3;
    static const struct {
        parse_fn parse;
        const char *name;
    } eps[] = {{api_parse_completions, "prompt"}, {api_parse_detokenize, "tokens"}};
    for (size_t k = 0; k < 2; k++) {
        struct api_request r;
        struct api_error e;
        char b[64], want[96];
        snprintf(b, sizeof b, "{\"%s\":[0,9]}", eps[k].name);
        assert_int_equal(eps[k].parse(b, strlen(b), &lim, &r, &e), 0);
        assert_int_equal(r.n_prompt_tokens, 2);
        assert_int_equal(r.prompt_tokens[1], 9);
        api_request_fini(&r);
        snprintf(b, sizeof b, "{\"%s\":[0,10]}", eps[k].name);
        assert_int_equal(eps[k].parse(b, strlen(b), &lim, &r, &e), RKV_EINVAL);
        snprintf(want, sizeof want, "%s[1] must be a token id in [0, 9], got 10", eps[k].name);
        assert_string_equal(e.message, want);
        snprintf(b, sizeof b, "{\"%s\":[1,2,3,4]}", eps[k].name);
        assert_int_equal(eps[k].parse(b, strlen(b), &lim, &r, &e), RKV_EINVAL);
        snprintf(want, sizeof want, "%s has 4 token ids; the limit is 3", eps[k].name);
        assert_string_equal(e.message, want);
    }
}

static void test_logit_bias(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.vocab_size = 10;
    struct api_request r;
    struct api_error e;
    const char *ok = "{\"prompt\":\"x\",\"logit_bias\":{\"0\":-100,\"9\":2.5}}";
    assert_int_equal(api_parse_completions(ok, strlen(ok), &lim, &r, &e), 0);
    assert_int_equal(r.n_logit_bias, 2);
    assert_int_equal(r.logit_bias[0].id, 0);
    assert_true(r.logit_bias[0].bias == -100.0f);
    assert_int_equal(r.logit_bias[1].id, 9);
    assert_true(r.logit_bias[1].bias == 2.5f);
    api_request_fini(&r);
    const char *none = "{\"prompt\":\"x\",\"logit_bias\":{}}";
    assert_int_equal(api_parse_completions(none, strlen(none), &lim, &r, &e), 0);
    assert_int_equal(r.n_logit_bias, 0);
    api_request_fini(&r);
    const char *out = "{\"prompt\":\"x\",\"logit_bias\":{\"10\":1}}";
    assert_int_equal(api_parse_completions(out, strlen(out), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(e.param, "logit_bias");
    assert_non_null(strstr(e.message, "logit_bias key \"10\" is not a token id: keys must be "
                                      "integers in [0, 9]"));
    /* the limit on entries */
    char big[8192];
    size_t n = (size_t)snprintf(big, sizeof big, "{\"prompt\":\"x\",\"logit_bias\":{");
    lim.vocab_size = 1000;
    for (int i = 0; i <= API_MAX_LOGIT_BIAS; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, "%s\"%d\":1", i ? "," : "", i);
    snprintf(big + n, sizeof big - n, "}}");
    assert_int_equal(api_parse_completions(big, strlen(big), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(
        e.message, "logit_bias has 301 entries; the limit is 300 (keep the tokens that matter)");
    /* 300 is fine */
    char *last = strrchr(big, ',');
    snprintf(last, sizeof big - (size_t)(last - big), "}}");
    assert_int_equal(api_parse_completions(big, strlen(big), &lim, &r, &e), 0);
    assert_int_equal(r.n_logit_bias, API_MAX_LOGIT_BIAS);
    api_request_fini(&r);
}

static void test_parse_tokenize(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.vocab_size = 10;
    struct api_request r;
    struct api_error e;
    const char *p = "{\"model\":\"m\",\"prompt\":\"Hi\"}";
    assert_int_equal(api_parse_tokenize(p, strlen(p), &lim, &r, &e), 0);
    assert_int_equal(r.endpoint, API_COMPLETIONS);
    assert_string_equal(r.prompt, "Hi");
    assert_string_equal(r.model, "m");
    api_request_fini(&r);
    const char *m = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                    "\"add_generation_prompt\":false}";
    assert_int_equal(api_parse_tokenize(m, strlen(m), &lim, &r, &e), 0);
    assert_int_equal(r.endpoint, API_CHAT);
    assert_int_equal(r.n_messages, 1);
    assert_false(r.add_generation_prompt);
    api_request_fini(&r);
    const char *both = "{\"prompt\":\"a\",\"messages\":[]}";
    assert_int_equal(api_parse_tokenize(both, strlen(both), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(e.param, "prompt");
    const char *unk = "{\"prompt\":\"a\",\"stream\":true}";
    assert_int_equal(api_parse_tokenize(unk, strlen(unk), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(e.param, "stream");
    const char *dnone = "{\"model\":\"m\"}";
    assert_int_equal(api_parse_detokenize(dnone, strlen(dnone), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(e.param, "tokens");
    char *j = api_render_tokens((const int32_t[]){1, 2}, 2, 64);
    assert_string_equal(j, "{\"tokens\":[1,2],\"count\":2,\"max_model_len\":64}");
    free(j);
    j = api_render_detokenized("a\"b", 3);
    assert_string_equal(j, "{\"prompt\":\"a\\\"b\"}");
    free(j);
    /* a <0x00> token's byte does not cut the text: U+FFFD stands for it */
    j = api_render_detokenized("a\0b", 3);
    assert_string_equal(j, "{\"prompt\":\"a\xef\xbf\xbd"
                           "b\"}");
    free(j);
}

/* --- valid requests --------------------------------------------------------------------------- */

static void test_parse_completions_full(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    const char *b =
        "{\"model\":\"m\",\"prompt\":\"Hello\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":42,\"stop\":[\"\\n\",\"END\"],"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,"
        "\"logprobs\":3,\"n\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"user\":\"u1\",\"session_id\":\"s1\",\"ignore_eos\":true,\"metadata\":{\"a\":\"b\"},"
        "\"logit_bias\":{},\"echo\":false,\"best_of\":1,\"suffix\":null,\"store\":false,"
        "\"skip_special_tokens\":true,\"min_tokens\":0,\"stop_token_ids\":[],"
        "\"include_stop_str_in_output\":false}";
    struct api_request r;
    struct api_error e;
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.endpoint, API_COMPLETIONS);
    assert_string_equal(r.model, "m");
    assert_string_equal(r.prompt, "Hello");
    assert_null(r.prompt_tokens);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.5f);
    assert_true(r.top_p == 0.9f);
    assert_int_equal(r.top_k, 40);
    assert_true(r.min_p == 0.05f);
    assert_true(r.has_seed);
    assert_int_equal(r.seed, 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_string_equal(r.stop[1], "END");
    assert_true(r.presence_penalty == 0.5f);
    assert_true(r.frequency_penalty == -0.5f);
    assert_true(r.repetition_penalty == 1.1f);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_string_equal(r.user, "u1");
    assert_string_equal(r.session_id, "s1");
    assert_true(r.ignore_eos);
    api_request_fini(&r);
}

static void test_parse_defaults_and_prompt_forms(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    struct api_request r;
    struct api_error e;
    const char *b = "{\"prompt\":\"x\"}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_null(r.model);
    assert_int_equal(r.max_tokens, 16);
    assert_true(r.temperature == 1.0f && r.top_p == 1.0f && r.min_p == 0.0f);
    assert_int_equal(r.top_k, -1);
    assert_true(r.repetition_penalty == 1.0f);
    assert_false(r.has_seed || r.stream || r.logprobs || r.include_usage || r.ignore_eos);
    assert_int_equal(r.n_stop, 0);
    api_request_fini(&r);

    b = "{\"prompt\":[\"one\"],\"stop\":\"\\n\\n\",\"seed\":-7,\"temperature\":null}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_string_equal(r.prompt, "one");
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n\n");
    assert_int_equal(r.seed, -7);
    assert_true(r.temperature == 1.0f);
    api_request_fini(&r);

    b = "{\"prompt\":[1,2,3]}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_tokens, 3);
    assert_int_equal(r.prompt_tokens[2], 3);
    api_request_fini(&r);

    b = "{\"prompt\":[[4,5]],\"logprobs\":0}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.n_prompt_tokens, 2);
    assert_int_equal(r.prompt_tokens[0], 4);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    api_request_fini(&r);
}

static void test_parse_fanout_and_prompt_lists(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.vocab_size = 100;
    struct api_request r;
    struct api_error e;
    const char *b = "{\"prompt\":\"x\"}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.best_of, 1);
    assert_int_equal(api_request_prompts(&r), 1);
    assert_int_equal(api_request_seqs(&r), 1);
    assert_null(r.suffix);
    assert_false(r.has_max_tokens);
    api_request_fini(&r);

    /* strings: the first in prompt, the rest in more_prompts */
    b = "{\"prompt\":[\"a\",\"bb\",\"ccc\"],\"n\":2,\"best_of\":3,\"max_tokens\":4,"
        "\"suffix\":\"end\"}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.best_of, 3);
    assert_true(r.has_max_tokens);
    assert_string_equal(r.suffix, "end");
    assert_int_equal(api_request_prompts(&r), 3);
    assert_int_equal(api_request_seqs(&r), 9);
    const char *text;
    const int32_t *ids;
    size_t n_ids;
    api_request_prompt(&r, 2, &text, &ids, &n_ids);
    assert_string_equal(text, "ccc");
    assert_null(ids);
    api_request_prompt(&r, 0, &text, &ids, &n_ids);
    assert_string_equal(text, "a");
    api_request_fini(&r);

    /* arrays of ids; an empty suffix is none */
    b = "{\"prompt\":[[1,2],[3],[4,5,6]],\"suffix\":\"\",\"n\":16}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), 0);
    assert_null(r.suffix);
    assert_int_equal(r.best_of, 16);
    assert_int_equal(api_request_seqs(&r), 48);
    api_request_prompt(&r, 2, &text, &ids, &n_ids);
    assert_null(text);
    assert_int_equal(n_ids, 3);
    assert_int_equal(ids[2], 6);
    api_request_prompt(&r, 0, &text, &ids, &n_ids);
    assert_int_equal(n_ids, 2);
    assert_int_equal(ids[1], 2);
    api_request_fini(&r);

    /* ids beyond the vocabulary name their place */
    b = "{\"prompt\":[[1,2],[3,100]]}";
    assert_int_equal(api_parse_completions(b, strlen(b), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(e.param, "prompt[1][1]");
    assert_non_null(strstr(e.message, "a token id in [0, 99], got 100"));

    /* chat: n, and no best_of */
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":5}";
    assert_int_equal(api_parse_chat(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.n, 5);
    assert_int_equal(r.best_of, 5);
    assert_int_equal(api_request_seqs(&r), 5);
    api_request_fini(&r);

    /* /tokenize takes one prompt */
    b = "{\"prompt\":[\"a\",\"b\"]}";
    assert_int_equal(api_parse_tokenize(b, strlen(b), &lim, &r, &e), RKV_EINVAL);
    assert_string_equal(e.param, "prompt");
    assert_non_null(strstr(e.message, "takes one prompt"));
}

static void test_parse_chat(void **state)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.max_tokens = 4096;
    struct api_request r;
    struct api_error e;
    const char *b =
        "{\"model\":\"m\",\"messages\":["
        "{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"h\xc3\xa9llo\"},"
        "{\"type\":\"text\",\"text\":\"\xf0\x9f\x98\x80\"}],\"name\":\"ann\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
        "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"}],"
        "\"max_tokens\":9,\"max_completion_tokens\":11,\"logprobs\":true,\"top_logprobs\":5,"
        "\"tool_choice\":\"none\",\"response_format\":{\"type\":\"text\"},"
        "\"parallel_tool_calls\":true}";
    assert_int_equal(api_parse_chat(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.endpoint, API_CHAT);
    assert_int_equal(r.n_messages, 4);
    assert_int_equal(r.messages[0].role, API_ROLE_SYSTEM);
    assert_string_equal(r.messages[0].role_name, "system");
    assert_string_equal(r.messages[0].content, "be brief");
    assert_string_equal(r.messages[1].role_name, "user");
    assert_string_equal(r.messages[1].content, "h\xc3\xa9llo\n\xf0\x9f\x98\x80");
    assert_int_equal(r.messages[2].role, API_ROLE_ASSISTANT);
    assert_string_equal(r.messages[2].content, "");
    assert_string_equal(r.messages[3].role_name, "tool");
    assert_int_equal(r.max_tokens, 11);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 5);
    api_request_fini(&r);

    /* chat without max_tokens gets the limit: the scheduler caps it by the context */
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    assert_int_equal(api_parse_chat(b, strlen(b), &lim, &r, &e), 0);
    assert_int_equal(r.max_tokens, 4096);
    assert_false(r.logprobs);
    api_request_fini(&r);
}

static void test_utf8_validator(void **state)
{
    size_t at = 99;
    assert_true(api_utf8_valid("plain \xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80", 17, &at));
    assert_false(api_utf8_valid("ab\x80", 3, &at));
    assert_int_equal(at, 2);
    assert_false(api_utf8_valid("\xf4\x90\x80\x80", 4, &at)); /* > U+10FFFF */
    assert_false(api_utf8_valid("\xe0\x80\x80", 3, &at));     /* overlong */
    assert_false(api_utf8_valid("\xf0\x9f\x98", 3, &at));     /* truncated */
    assert_true(api_utf8_valid("", 0, &at));
}

/* --- rendering ------------------------------------------------------------------------------- */

static struct api_request req_of(int ep, int logprobs, int stream, int usage)
{
    struct api_request r;
    memset(&r, 0, sizeof(r));
    r.endpoint = ep;
    r.logprobs = logprobs;
    r.top_logprobs = 2;
    r.stream = stream;
    r.include_usage = usage;
    return r;
}

static const struct api_top_logprob top0[] = {{"Hello", 5, -0.25f}, {"Hi", 2, -1.5f}};
static const struct api_top_logprob top1[] = {{" world", 6, -0.5f}, {" there", 6, -2.0f}};
static const struct api_token_logprob lps[] = {
    {"Hello", 5, -0.25f, top0, 2},
    {" world", 6, -0.5f, top1, 2},
};

static void test_render_completion(void **state)
{
    struct api_request r = req_of(C, 1, 0, 0);
    struct api_result res = {"Hello world", 11, lps, 2, API_FINISH_LENGTH, {4, 2, 0}};
    char *j = api_render_response(&r, "cmpl-abc", "tiny", 1700000000, &res);
    cJSON *o = cJSON_Parse(j);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "id")->valuestring, "cmpl-abc");
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "text_completion");
    assert_int_equal(cJSON_GetObjectItem(o, "created")->valuedouble, 1700000000);
    assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "tiny");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_int_equal(cJSON_GetObjectItem(c, "index")->valueint, 0);
    assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, "Hello world");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "length");
    cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 1)->valuestring,
                        " world");
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 0)->valuedouble ==
                -0.25);
    cJSON *top = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0);
    assert_true(cJSON_GetObjectItem(top, "Hi")->valuedouble == -1.5);
    cJSON *off = cJSON_GetObjectItem(lp, "text_offset");
    assert_int_equal(cJSON_GetArrayItem(off, 0)->valueint, 0);
    assert_int_equal(cJSON_GetArrayItem(off, 1)->valueint, 5);
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 6);
    cJSON_Delete(o);
    free(j);
}

static void test_render_choices(void **state)
{
    struct api_request r = req_of(C, 0, 0, 0);
    struct api_result res[2] = {{"A", 1, NULL, 0, API_FINISH_STOP, {0}},
                                {"BB", 2, NULL, 0, API_FINISH_LENGTH, {0}}};
    struct api_usage u = {5, 7, 2};
    char *j = api_render_choices(&r, "cmpl-n", "tiny", 1, res, 2, &u);
    cJSON *o = cJSON_Parse(j);
    assert_non_null(o);
    cJSON *ch = cJSON_GetObjectItem(o, "choices");
    assert_int_equal(cJSON_GetArraySize(ch), 2);
    for (int i = 0; i < 2; i++) {
        cJSON *c = cJSON_GetArrayItem(ch, i);
        assert_int_equal(cJSON_GetObjectItem(c, "index")->valueint, i);
        assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, res[i].text);
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "logprobs")));
    }
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "finish_reason")->valuestring, "length");
    cJSON *us = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(us, "total_tokens")->valueint, 12);
    cJSON_Delete(o);
    free(j);
    /* a stream's chunks carry their choice's index */
    struct api_stream st;
    api_stream_init(&st, &r, "cmpl-n", "tiny", 1);
    st.index = 3;
    size_t n;
    char *ev = api_stream_delta(&st, "x", 1, NULL, 0, &n);
    assert_non_null(strstr(ev, "\"choices\":[{\"index\":3,\"text\":\"x\""));
    free(ev);
    ev = api_stream_finish(&st, API_FINISH_STOP, NULL, 0, &n);
    assert_non_null(strstr(ev, "\"index\":3,"));
    free(ev);
}

static void test_render_chat(void **state)
{
    struct api_request r = req_of(H, 1, 0, 0);
    /* a token that is half of a UTF-8 character: token text sanitized, bytes exact */
    static const struct api_token_logprob half[] = {{"\xe2\x9c", 2, -0.125f, NULL, 0}};
    struct api_result res = {"ok \xe2\x9c\x93", 6, half, 1, API_FINISH_STOP, {3, 1, 2}};
    char *j = api_render_response(&r, "chatcmpl-1", "tiny", 5, &res);
    cJSON *o = cJSON_Parse(j);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *m = cJSON_GetObjectItem(c, "message");
    assert_string_equal(cJSON_GetObjectItem(m, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "ok \xe2\x9c\x93");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    cJSON *e0 =
        cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "content"), 0);
    assert_string_equal(cJSON_GetObjectItem(e0, "token")->valuestring, "\xef\xbf\xbd\xef\xbf\xbd");
    cJSON *bytes = cJSON_GetObjectItem(e0, "bytes");
    assert_int_equal(cJSON_GetArraySize(bytes), 2);
    assert_int_equal(cJSON_GetArrayItem(bytes, 0)->valueint, 0xe2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(e0, "top_logprobs")), 0);
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")
            ->valueint,
        2);
    cJSON_Delete(o);
    free(j);
    /* without logprobs: "logprobs": null */
    r.logprobs = 0;
    j = api_render_response(&r, "chatcmpl-1", "tiny", 5, &res);
    assert_non_null(strstr(j, "\"logprobs\":null,\"finish_reason\":\"stop\""));
    free(j);
}

static void test_render_stream_chat_exact(void **state)
{
    struct api_request r = req_of(H, 0, 1, 1);
    struct api_stream s;
    api_stream_init(&s, &r, "chatcmpl-1", "tiny", 1700000000);
    size_t n;
    char *ev = api_stream_begin(&s, &n);
    assert_string_equal(ev, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                            "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                            "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                            "\"finish_reason\":null}]}\n\n");
    assert_int_equal(n, strlen(ev));
    free(ev);
    ev = api_stream_delta(&s, "Hi", 2, NULL, 0, &n);
    assert_string_equal(ev, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                            "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                            "\"delta\":{\"content\":\"Hi\"},\"logprobs\":null,"
                            "\"finish_reason\":null}]}\n\n");
    free(ev);
    ev = api_stream_finish(&s, API_FINISH_STOP, NULL, 0, &n);
    assert_string_equal(ev, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                            "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,"
                            "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n");
    free(ev);
    struct api_usage u = {3, 1, 0};
    ev = api_stream_usage(&s, &u, &n);
    assert_string_equal(ev, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                            "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[],"
                            "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,"
                            "\"total_tokens\":4}}\n\n");
    free(ev);
    assert_string_equal(API_SSE_DONE, "data: [DONE]\n\n");
}

static void test_render_stream_completions_offsets(void **state)
{
    struct api_request r = req_of(C, 1, 1, 0);
    struct api_stream s;
    api_stream_init(&s, &r, "cmpl-1", "tiny", 7);
    size_t n;
    assert_null(api_stream_begin(&s, &n));
    /* "é" is one character, two bytes: offsets count characters as Python does */
    static const struct api_token_logprob a[] = {{"\xc3\xa9t\xc3\xa9", 5, -1.0f, NULL, 0}};
    char *ev = api_stream_delta(&s, "\xc3\xa9t\xc3\xa9", 5, a, 1, &n);
    free(ev);
    ev = api_stream_delta(&s, " world", 6, &lps[1], 1, &n);
    assert_true(strncmp(ev, "data: ", 6) == 0 && strcmp(ev + n - 2, "\n\n") == 0);
    ev[n - 2] = '\0';
    cJSON *o = cJSON_Parse(ev + 6);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "text_completion");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, " world");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")));
    cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "text_offset");
    assert_int_equal(cJSON_GetArrayItem(off, 0)->valueint, 3);
    cJSON_Delete(o);
    free(ev);
    ev = api_stream_finish(&s, API_FINISH_LENGTH, NULL, 0, &n);
    assert_non_null(strstr(ev, "\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\""));
    free(ev);
}

/* offsets index the text: a token that renders to nothing (a control token) and one whose
 * text a stop string took have the offset of the next character, never one past the text */
static void test_render_offsets_within_text(void **state)
{
    static const struct api_token_logprob t[] = {{"Hi", 2, -1.0f, NULL, 0},
                                                 {"", 0, -2.0f, NULL, 0},
                                                 {" there", 6, -1.0f, NULL, 0},
                                                 {"", 0, -3.0f, NULL, 0},
                                                 {"STOP", 4, -1.0f, NULL, 0}};
    struct api_request r = req_of(C, 1, 0, 0);
    struct api_result res = {"Hi there", 8, t, 5, API_FINISH_STOP, {4, 5, 0}};
    char *j = api_render_response(&r, "cmpl-abc", "tiny", 1700000000, &res);
    cJSON *o = cJSON_Parse(j);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "text_offset");
    static const int want[] = {0, 2, 2, 8, 8};
    assert_int_equal(cJSON_GetArraySize(off), 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(cJSON_GetArrayItem(off, i)->valueint, want[i]);
    cJSON_Delete(o);
    free(j);
    /* a character split over tokens and an invalid byte (one U+FFFD in the text) */
    static const struct api_token_logprob u[] = {{"\xc3", 1, -1.0f, NULL, 0},
                                                 {"\xa9t", 2, -1.0f, NULL, 0},
                                                 {"\x80\x80", 2, -1.0f, NULL, 0},
                                                 {"\xe2\x82", 2, -1.0f, NULL, 0},
                                                 {" x", 2, -1.0f, NULL, 0}};
    struct api_result ru = {
        "\xc3\xa9t\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd x", 15, u, 5, API_FINISH_LENGTH, {4, 5, 0}};
    j = api_render_response(&r, "cmpl-abc", "tiny", 1700000000, &ru);
    o = cJSON_Parse(j);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    off = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "text_offset");
    static const int want_u[] = {0, 1, 2, 4, 5}; /* "é", "t", two U+FFFD, one U+FFFD, " x" */
    for (int i = 0; i < 5; i++)
        assert_int_equal(cJSON_GetArrayItem(off, i)->valueint, want_u[i]);
    cJSON_Delete(o);
    free(j);
    /* streamed: the same offsets, each within the text sent so far */
    struct api_request rs = req_of(C, 1, 1, 0);
    struct api_stream s;
    api_stream_init(&s, &rs, "cmpl-1", "tiny", 7);
    static const char *texts[] = {"Hi", "", " there", "", ""};
    size_t n;
    for (int i = 0; i < 5; i++) {
        char *ev = api_stream_delta(&s, texts[i], strlen(texts[i]), &t[i], 1, &n);
        ev[n - 2] = '\0';
        cJSON *e = cJSON_Parse(ev + 6);
        cJSON *ec = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "choices"), 0);
        cJSON *eo = cJSON_GetObjectItem(cJSON_GetObjectItem(ec, "logprobs"), "text_offset");
        assert_int_equal(cJSON_GetArrayItem(eo, 0)->valueint, want[i]);
        cJSON_Delete(e);
        free(ev);
    }
}

static void test_render_models_and_error(void **state)
{
    const char *names[] = {"tiny", "tiny-chat"};
    char *j = api_render_models(names, 2, 123, 4096);
    assert_string_equal(j, "{\"object\":\"list\",\"data\":["
                           "{\"id\":\"tiny\",\"object\":\"model\",\"created\":123,"
                           "\"owned_by\":\"rkv\",\"root\":\"tiny\",\"max_model_len\":4096},"
                           "{\"id\":\"tiny-chat\",\"object\":\"model\",\"created\":123,"
                           "\"owned_by\":\"rkv\",\"root\":\"tiny-chat\",\"max_model_len\":4096}]}");
    free(j);
    struct api_error e;
    api_error_set(&e, 400, "max_tokens", "max_tokens must be an integer in [1, %d], got %d", 32768,
                  -5);
    j = api_error_json(&e);
    assert_string_equal(j, "{\"error\":{\"message\":\"max_tokens must be an integer in [1, "
                           "32768], got -5\",\"type\":\"invalid_request_error\","
                           "\"param\":\"max_tokens\",\"code\":null}}");
    free(j);
    char id[64];
    api_make_id(API_CHAT, id, sizeof(id));
    assert_int_equal(strlen(id), 9 + 32);
    assert_true(strncmp(id, "chatcmpl-", 9) == 0);
}

/* --- the endpoints end to end: http server + api + a fake scheduler ----------------------------
 */

struct e2e {
    uv_loop_t loop;
    uv_async_t client_done;
    struct http_server *srv;
    struct api *api;
    int port;
    int submits, cancels, shut_done;
    int auth; /* require "sk-1" */
    struct resp r[16];
    int rc[16];
    char *raw;
};

static struct e2e *ge;

/* one generation: a token per timer tick */
struct gen {
    uv_timer_t timer;
    struct api_call *call;
    int step;
    int forever, failmid;
};

static void gen_closed(uv_handle_t *h)
{
    free(h->data);
}

static void gen_end(struct gen *g, enum api_finish f)
{
    struct api_usage u = {3, (uint32_t)g->step, 0};
    uv_timer_stop(&g->timer);
    api_call_finish(g->call, f, &u);
    uv_close((uv_handle_t *)&g->timer, gen_closed);
}

static void gen_tick(uv_timer_t *t)
{
    struct gen *g = t->data;
    static const struct api_top_logprob tops[] = {{"Hello", 5, -0.5f}};
    static const char *words[] = {"Hello", " world"};
    if (g->failmid && g->step == 1) {
        uv_timer_stop(t);
        api_call_fail(g->call, 500, "worker 0 died; retry the request");
        uv_close((uv_handle_t *)&g->timer, gen_closed);
        return;
    }
    if (!g->forever && g->step == 2) {
        gen_end(g, API_FINISH_STOP);
        return;
    }
    const char *w = words[g->step % 2];
    struct api_token_logprob lp = {w, strlen(w), -0.5f, tops, 1};
    g->step++;
    if (api_call_token(g->call, w, strlen(w), &lp, 1) == RKV_ECLOSED)
        gen_end(g, API_FINISH_ABORT);
}

static const char *prompt_of(const struct api_request *r)
{
    return r->endpoint == API_CHAT ? r->messages[r->n_messages - 1].content : r->prompt;
}

static int fake_submit(void *ctx, struct api_call *call, const struct api_request *r)
{
    struct e2e *x = ctx;
    x->submits++;
    const char *p = prompt_of(r);
    if (strcmp(p, "busy") == 0)
        return RKV_EBUSY;
    if (strcmp(p, "reject") == 0) {
        api_call_fail(call, 400, "the prompt has 9000 tokens; the context holds 4096");
        return 0;
    }
    struct gen *g = calloc(1, sizeof(*g));
    g->call = call;
    g->forever = strcmp(p, "forever") == 0;
    g->failmid = strcmp(p, "failmid") == 0;
    uv_timer_init(&x->loop, &g->timer);
    g->timer.data = g;
    uv_timer_start(&g->timer, gen_tick, 1, 1);
    api_call_set_data(call, g);
    assert_ptr_equal(api_call_request(call), r);
    return 0;
}

static void fake_cancel(void *ctx, struct api_call *call)
{
    struct e2e *x = ctx;
    x->cancels++;
    gen_end(api_call_data(call), API_FINISH_ABORT);
}

static int fake_authorize(void *ctx, const char *bearer)
{
    struct e2e *x = ctx;
    if (!x->auth)
        return 0;
    return bearer && strcmp(bearer, "sk-1") == 0 ? 0 : RKV_EAUTH;
}

static void e2e_handler(struct http_req *req, void *arg)
{
    struct e2e *x = arg;
    if (!api_handle(x->api, req))
        http_respond(req, 404, "text/plain", "not api", 7);
}

static void e2e_shutdown_done(void *arg)
{
    struct e2e *x = arg;
    x->shut_done = 1;
}

static void e2e_client_done(uv_async_t *a)
{
    struct e2e *x = a->data;
    http_server_shutdown(x->srv, 2000, e2e_shutdown_done, x);
    uv_close((uv_handle_t *)a, NULL);
}

static void (*e2e_client)(struct e2e *);

static void *e2e_thread(void *arg)
{
    struct e2e *x = arg;
    e2e_client(x);
    uv_async_send(&x->client_done);
    return NULL;
}

static void e2e_run(struct e2e *x, void (*client)(struct e2e *))
{
    ge = x;
    assert_int_equal(uv_loop_init(&x->loop), 0);
    const char *models[] = {"tiny"};
    struct api_config acfg = {models, 1, 4096, {0}, "*"};
    api_limits_default(&acfg.limits);
    struct api_sched sched = {
        .submit = fake_submit, .cancel = fake_cancel, .authorize = fake_authorize, .ctx = x};
    assert_int_equal(api_create(&acfg, &sched, &x->api), 0);
    struct http_server_config cfg = {.host = "127.0.0.1", .on_request = e2e_handler, .arg = x};
    http_limits_default(&cfg.limits);
    assert_int_equal(http_server_start(&x->loop, &cfg, &x->srv), 0);
    x->port = http_server_port(x->srv);
    uv_async_init(&x->loop, &x->client_done, e2e_client_done);
    x->client_done.data = x;
    e2e_client = client;
    pthread_t th;
    pthread_create(&th, NULL, e2e_thread, x);
    assert_int_equal(uv_run(&x->loop, UV_RUN_DEFAULT), 0);
    pthread_join(th, NULL);
    assert_int_equal(x->shut_done, 1);
    assert_int_equal(api_calls(x->api), 0);
    api_destroy(x->api);
    assert_int_equal(uv_loop_close(&x->loop), 0);
}

static void e2e_fini(struct e2e *x)
{
    for (size_t i = 0; i < 16; i++)
        free(x->r[i].body);
    free(x->raw);
}

static void post(struct client *c, const char *path, const char *ctype, const char *body)
{
    char head[512];
    snprintf(head, sizeof(head),
             "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n", path,
             ctype, strlen(body));
    SEND(c, head);
    SEND(c, body);
}

static void cl_endpoints(struct e2e *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    int i = 0;
    post(&c, "/v1/completions", "application/json", "{\"prompt\":\"hi\",\"logprobs\":1}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/chat/completions", "application/json",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
         "\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    SEND(&c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/completions", "application/json", "{");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/completions", "application/json", "{\"prompt\":\"hi\",\"model\":\"nope\"}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    SEND(&c, "GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/completions", "text/plain", "{\"prompt\":\"hi\"}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/completions", "application/json", "{\"prompt\":\"busy\"}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/completions", "application/json", "{\"prompt\":\"reject\"}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    SEND(&c, "GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    post(&c, "/v1/completions", "application/json", "{\"prompt\":\"failmid\",\"stream\":true}");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    SEND(&c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    SEND(&c, "DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[i] = client_read(&c, &x->r[i]), i++;
    SEND(&c, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://ui\r\n"
             "Access-Control-Request-Method: POST\r\n\r\n");
    x->raw = client_read_until(&c, "\r\n\r\n");
    client_close(&c);
}

static cJSON *body_json(const struct resp *r)
{
    cJSON *o = cJSON_Parse(r->body);
    assert_non_null(o);
    return o;
}

static const char *error_field(cJSON *o, const char *name)
{
    cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void test_endpoints_end_to_end(void **state)
{
    struct e2e x = {0};
    e2e_run(&x, cl_endpoints);
    for (int i = 0; i < 13; i++)
        assert_int_equal(x.rc[i], 0);
    /* non-stream completion */
    assert_int_equal(x.r[0].status, 200);
    assert_string_equal(x.r[0].ctype, "application/json");
    cJSON *o = body_json(&x.r[0]);
    assert_true(strncmp(cJSON_GetObjectItem(o, "id")->valuestring, "cmpl-", 5) == 0);
    assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "tiny");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, "Hello world");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    cJSON *toks = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "tokens");
    assert_int_equal(cJSON_GetArraySize(toks), 2);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint,
                     5);
    cJSON_Delete(o);
    /* stream: role, two deltas, finish, usage, [DONE] */
    assert_int_equal(x.r[1].status, 200);
    assert_string_equal(x.r[1].ctype, "text/event-stream");
    assert_string_equal(x.r[1].te, "chunked");
    const char *b = x.r[1].body;
    int events = 0;
    for (const char *p = b; (p = strstr(p, "data: ")); p += 6)
        events++;
    if (events != 6)
        print_error("stream body: %s\n", b);
    assert_int_equal(events, 6);
    assert_non_null(strstr(b, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    assert_non_null(strstr(b, "\"delta\":{\"content\":\"Hello\"}"));
    assert_non_null(strstr(b, "\"delta\":{\"content\":\" world\"}"));
    assert_non_null(strstr(b, "\"finish_reason\":\"stop\""));
    assert_non_null(strstr(b, "\"choices\":[],\"usage\":{\"prompt_tokens\":3,"
                              "\"completion_tokens\":2,\"total_tokens\":5}"));
    assert_int_equal(strlen(b) >= 14, 1);
    assert_string_equal(b + strlen(b) - 14, "data: [DONE]\n\n");
    /* models */
    assert_int_equal(x.r[2].status, 200);
    assert_non_null(strstr(x.r[2].body, "\"id\":\"tiny\""));
    /* errors */
    int want[] = {0, 0, 0, 400, 404, 405, 415, 429, 400, 404, 200, 404};
    for (int i = 3; i < 12; i++)
        assert_int_equal(x.r[i].status, want[i]);
    o = body_json(&x.r[4]);
    assert_string_equal(error_field(o, "code"), "model_not_found");
    assert_string_equal(error_field(o, "param"), "model");
    cJSON_Delete(o);
    o = body_json(&x.r[6]);
    assert_non_null(strstr(error_field(o, "message"), "Content-Type must be application/json"));
    cJSON_Delete(o);
    o = body_json(&x.r[8]);
    assert_string_equal(error_field(o, "message"),
                        "the prompt has 9000 tokens; the context holds 4096");
    cJSON_Delete(o);
    /* an error mid-stream travels as an event, then [DONE] */
    assert_non_null(strstr(x.r[10].body, "\"text\":\"Hello\""));
    assert_non_null(strstr(x.r[10].body, "data: {\"error\":{\"message\":\"worker 0 died; retry "
                                         "the request\",\"type\":\"server_error\""));
    assert_string_equal(x.r[11].body, "not api");
    assert_int_equal(x.r[12].status, 405);
    o = body_json(&x.r[12]);
    assert_string_equal(error_field(o, "message"), "DELETE /v1/models is not allowed; use GET");
    cJSON_Delete(o);
    o = body_json(&x.r[5]);
    assert_string_equal(error_field(o, "message"), "GET /v1/completions is not allowed; use POST");
    cJSON_Delete(o);
    /* CORS: the preflight and the header on every answer */
    assert_true(strncmp(x.raw, "HTTP/1.1 204 No Content\r\n", 25) == 0);
    assert_non_null(strstr(x.raw, "Access-Control-Allow-Origin: *\r\n"));
    assert_non_null(strstr(x.raw, "Access-Control-Allow-Headers: Authorization, Content-Type"));
    assert_null(strstr(x.raw, "Content-Length"));
    assert_int_equal(x.cancels, 0);
    e2e_fini(&x);
}

static void cl_auth_and_disconnect(struct e2e *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    SEND(&c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-2\r\n\r\n");
    x->rc[1] = client_read(&c, &x->r[1]);
    SEND(&c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-1\r\n\r\n");
    x->rc[2] = client_read(&c, &x->r[2]);
    /* a stream that never ends: leaving cancels it */
    const char *body = "{\"prompt\":\"forever\",\"stream\":true}";
    char head[256];
    snprintf(head, sizeof(head),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-1\r\n"
             "Content-Length: %zu\r\n\r\n",
             strlen(body));
    SEND(&c, head);
    SEND(&c, body);
    x->raw = client_read_until(&c, "\" world\"");
    client_close(&c);
}

static void test_auth_and_disconnect_cancels(void **state)
{
    struct e2e x = {0};
    x.auth = 1;
    e2e_run(&x, cl_auth_and_disconnect);
    assert_int_equal(x.r[0].status, 401);
    assert_int_equal(x.r[1].status, 401);
    cJSON *o = body_json(&x.r[1]);
    assert_string_equal(error_field(o, "code"), "invalid_api_key");
    cJSON_Delete(o);
    assert_int_equal(x.r[2].status, 200);
    assert_non_null(strstr(x.raw, "\"text\":\" world\""));
    assert_int_equal(x.submits, 1);
    assert_int_equal(x.cancels, 1);
    e2e_fini(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_raw_nul_byte),
        cmocka_unit_test(test_token_prompt_limits),
        cmocka_unit_test(test_parse_completions_full),
        cmocka_unit_test(test_parse_defaults_and_prompt_forms),
        cmocka_unit_test(test_parse_fanout_and_prompt_lists),
        cmocka_unit_test(test_parse_chat),
        cmocka_unit_test(test_utf8_validator),
        cmocka_unit_test(test_render_completion),
        cmocka_unit_test(test_render_choices),
        cmocka_unit_test(test_render_chat),
        cmocka_unit_test(test_render_stream_chat_exact),
        cmocka_unit_test(test_render_stream_completions_offsets),
        cmocka_unit_test(test_render_offsets_within_text),
        cmocka_unit_test(test_render_models_and_error),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_parse_tokenize),
        cmocka_unit_test(test_endpoints_end_to_end),
        cmocka_unit_test(test_auth_and_disconnect_cancels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
