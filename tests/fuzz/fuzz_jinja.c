/* fuzz_jinja.c - libFuzzer: parse and render arbitrary templates with a fixed chat context under
 * small limits. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jinja.h"

static struct jinja_ctx *g_ctx;

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You are terse.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9 \\\"q\\\"\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c0\","
    " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"ok\\\": true}\", \"tool_call_id\": \"c0\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false, \"n\": 3, \"xs\": [3, 1, 2], \"d\": {\"a\": [true, null]}}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char err[256];
    if (jinja_ctx_create(&g_ctx) != 0 ||
        jinja_ctx_set_json(g_ctx, CONTEXT, strlen(CONTEXT), err, sizeof err) != 0)
        abort();
    jinja_ctx_set_now(g_ctx, 1721995200);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    struct jinja_tmpl *t = NULL;
    int rc = jinja_parse((const char *)data, size, "chat template", &t, err, sizeof err);
    if (rc < 0) {
        /* every failure is a negative code with a message naming the template */
        if (t || rc >= 0 || strncmp(err, "chat template", 13))
            abort();
        return 0;
    }
    /* small limits: no template may run long, write much or recurse deep */
    struct jinja_limits lim = {
        .max_steps = 200000, .max_output = 1 << 16, .max_memory = 32 << 20, .max_depth = 300};
    char *out = NULL;
    size_t n = 0;
    rc = jinja_render(t, g_ctx, &lim, &out, &n, err, sizeof err);
    if (rc == 0) {
        if (!out || n > lim.max_output || out[n] != 0)
            abort();
        /* a template renders the same twice: no state leaks between renders */
        char *again = NULL;
        size_t n2 = 0;
        if (jinja_render(t, g_ctx, &lim, &again, &n2, err, sizeof err) != 0 || n2 != n ||
            memcmp(out, again, n))
            abort();
        free(again);
    } else if (out || strncmp(err, "chat template", 13)) {
        abort();
    }
    free(out);
    jinja_destroy(t);
    return 0;
}
