/* fuzz_api.c - arbitrary bodies through both OpenAI request parsers; accepted ones render back. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "daemon/api.h"
#include "daemon/api_tools.h"

static void check_json(char *s)
{
    if (s && !api_utf8_valid(s, strlen(s), NULL))
        __builtin_trap();
    /* what we render must be valid JSON */
    if (!s)
        return;
    cJSON *o = cJSON_Parse(s);
    if (!o)
        __builtin_trap();
    cJSON_Delete(o);
    free(s);
}

static void render(const struct api_request *r, const uint8_t *data, size_t size)
{
    /* the input bytes as generated text and tokens: arbitrary, often not UTF-8 */
    size_t half = size / 2;
    struct api_top_logprob top[2] = {{(const char *)data, half, -1.0f},
                                     {(const char *)data + half, size - half, -2.0f}};
    struct api_token_logprob lp[2] = {{(const char *)data, half, -0.5f, top, 2},
                                      {(const char *)data + half, size - half, -1e30f, top, 1}};
    struct api_result res = {(const char *)data, size, lp, 2, API_FINISH_STOP, {1, 2, 0}};
    check_json(api_render_response(r, "cmpl-x", "m", 1, &res));
    struct api_result two[2] = {res, res};
    two[1].finish = API_FINISH_LENGTH;
    check_json(api_render_choices(r, "cmpl-x", "m", 1, two, 2, &res.usage));
    struct api_stream s;
    api_stream_init(&s, r, "cmpl-x", "m", 1);
    s.index = r->n > 1 ? (uint32_t)r->n - 1 : 0;
    size_t n;
    char *ev = api_stream_begin(&s, &n);
    free(ev);
    ev = api_stream_delta(&s, (const char *)data, size, lp, 2, &n);
    if (!ev || n < 8 || memcmp(ev, "data: ", 6) != 0 || memcmp(ev + n - 2, "\n\n", 2) != 0)
        __builtin_trap();
    ev[n - 2] = '\0';
    cJSON *o = cJSON_Parse(ev + 6);
    if (!o)
        __builtin_trap();
    cJSON_Delete(o);
    free(ev);
    free(api_stream_finish(&s, API_FINISH_LENGTH, NULL, 0, &n));
}

static int check_event(void *ud, const struct api_tev *ev)
{
    if (ev->kind == API_TEV_CALL) {
        cJSON *a = cJSON_Parse(ev->arguments);
        /* a call's arguments are a JSON object, its id call_ + 24 */
        if (!cJSON_IsObject(a) || strlen(ev->id) != API_TOOL_ID_LEN)
            __builtin_trap();
        cJSON_Delete(a);
    }
    for (int part = 0; part < 2; part++) {
        cJSON *d = api_tev_delta(ev, part);
        if (!d)
            __builtin_trap();
        cJSON_Delete(d);
    }
    return api_tout_collect(ud, ev);
}

/* the input as a model's answer, through the output parser of each format, in two pieces */
static void parse_output(const uint8_t *data, size_t size)
{
    for (int fmt = API_TOOL_FMT_NONE; fmt <= API_TOOL_FMT_MISTRAL; fmt++) {
        struct api_tools t = {.format = (enum api_tool_format)fmt,
                              .parse_calls = fmt != 0,
                              .reasoning = true,
                              .starts_in_reasoning = size & 1,
                              .parallel = true};
        struct api_tparse *p;
        struct api_tout o = {0};
        if (api_tparse_create(&t, &p))
            return;
        size_t half = size / 3;
        api_tparse_feed(p, (const char *)data, half, check_event, &o);
        api_tparse_feed(p, (const char *)data + half, size - half, check_event, &o);
        api_tparse_finish(p, check_event, &o);
        /* never lose text: content and reasoning are at most the input */
        if (o.content.n + o.reasoning.n > size)
            __builtin_trap();
        cJSON *m = cJSON_CreateObject();
        api_tout_message(&o, m);
        cJSON_Delete(m);
        api_tout_fini(&o);
        api_tparse_destroy(p);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.vocab_size = 1000;
    /* completions, chat, then /tokenize and /detokenize (which render nothing) */
    for (int ep = 0; ep < 4; ep++) {
        struct api_request r;
        struct api_error e;
        memset(&e, 0, sizeof(e));
        const char *d = (const char *)data;
        int rc = ep == 0   ? api_parse_completions(d, size, &lim, &r, &e)
                 : ep == 1 ? api_parse_chat(d, size, &lim, &r, &e)
                 : ep == 2 ? api_parse_tokenize(d, size, &lim, &r, &e)
                           : api_parse_detokenize(d, size, &lim, &r, &e);
        if (rc == 0 && ep >= 2) {
            for (size_t i = 0; i < r.n_prompt_tokens; i++)
                if (r.prompt_tokens[i] < 0 || r.prompt_tokens[i] >= lim.vocab_size)
                    __builtin_trap();
            api_request_fini(&r);
        } else if (rc == 0) {
            if (r.max_tokens < 1 || r.max_tokens > lim.max_tokens || r.n_stop > API_MAX_STOP)
                __builtin_trap();
            /* choices within their ranges; every prompt of a list non-empty, ids in range */
            if (r.n < 1 || r.best_of < r.n || r.best_of > API_MAX_N ||
                api_request_seqs(&r) > API_MAX_SEQS || api_request_prompts(&r) > API_MAX_PROMPTS ||
                (r.suffix && !r.suffix[0]))
                __builtin_trap();
            for (size_t i = 0; ep == 0 && i < api_request_prompts(&r); i++) {
                const char *text;
                const int32_t *ids;
                size_t n_ids;
                api_request_prompt(&r, i, &text, &ids, &n_ids);
                if (text ? !text[0] : !ids || !n_ids)
                    __builtin_trap();
                for (size_t k = 0; !text && k < n_ids; k++)
                    if (ids[k] < 0 || ids[k] >= lim.vocab_size)
                        __builtin_trap();
            }
            render(&r, data, size);
            api_request_fini(&r);
        } else {
            if (e.status < 400 || !e.message[0])
                __builtin_trap();
            char *j = api_error_json(&e);
            /* the error a client sees is valid UTF-8 whatever it sent */
            if (!j || !api_utf8_valid(j, strlen(j), NULL))
                __builtin_trap();
            check_json(j);
        }
    }
    parse_output(data, size);
    return 0;
}
