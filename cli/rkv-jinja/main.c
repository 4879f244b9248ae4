/* rkv-jinja - render a Jinja chat template with a JSON context (tests, debugging). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/jinja.h"
#include "common/util.h"

static const char usage[] =
    "usage: rkv-jinja --template FILE [--context JSON | --context-file FILE] [options]\n"
    "       rkv-jinja --batch FILE [options]\n"
    "  --template FILE      the template (\"-\" = stdin); prints the rendered text as it is\n"
    "  --context JSON       a JSON object: each key becomes a variable (messages, tools,\n"
    "                       add_generation_prompt, bos_token, ...)\n"
    "  --context-file FILE  the same, read from FILE\n"
    "  --now UNIX           the clock strftime_now reads (seconds; local time)\n"
    "  --batch FILE         one JSON object per line, {\"template\": T, \"context\": {...},\n"
    "                       \"now\": N}; prints one line per case, {\"out\": TEXT} or\n"
    "                       {\"error\": MESSAGE, \"code\": N}\n"
    "  --max-steps N        the render's step budget\n"
    "  --max-output N       the render's output limit in bytes\n"
    "errors name the template line and column; the exit status is 1 after one.\n";

/* parses and renders one case; *text is the output or the error message (malloc'd) */
static int render_one(const char *tmpl, size_t tlen, const char *ctx_json, size_t clen,
                      int have_now, long long now, const struct jinja_limits *lim, char **text,
                      size_t *text_len)
{
    char err[512] = "";
    struct jinja_tmpl *t = NULL;
    struct jinja_ctx *c = NULL;
    char *out = NULL;
    size_t n = 0;
    int rc = jinja_parse(tmpl, tlen, "template", &t, err, sizeof err);
    if (rc == 0)
        rc = jinja_ctx_create(&c);
    if (rc == 0 && ctx_json)
        rc = jinja_ctx_set_json(c, ctx_json, clen, err, sizeof err);
    if (rc == 0) {
        if (have_now)
            jinja_ctx_set_now(c, (time_t)now);
        rc = jinja_render(t, c, lim, &out, &n, err, sizeof err);
    }
    jinja_ctx_destroy(c);
    jinja_destroy(t);
    if (rc < 0) {
        if (!err[0])
            snprintf(err, sizeof err, "%s", rkv_strerror(rc));
        *text = strdup(err);
        *text_len = strlen(err);
        return rc;
    }
    *text = out;
    *text_len = n;
    return 0;
}

static int run_batch(const char *path, const struct jinja_limits *lim)
{
    char *buf;
    size_t len;
    int rc = rkv_read_file(path, 0, &buf, &len);
    if (rc < 0) {
        fprintf(stderr, "rkv-jinja: %s: %s\n", path, rkv_strerror(rc));
        return 1;
    }
    char *line = buf;
    while (line < buf + len) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        if (ll) {
            cJSON *j = cJSON_ParseWithLength(line, ll);
            cJSON *tj = cJSON_GetObjectItemCaseSensitive(j, "template");
            cJSON *cj = cJSON_GetObjectItemCaseSensitive(j, "context");
            cJSON *nj = cJSON_GetObjectItemCaseSensitive(j, "now");
            cJSON *res = cJSON_CreateObject();
            if (!cJSON_IsString(tj)) {
                cJSON_AddStringToObject(res, "error", "batch line without a template string");
                cJSON_AddNumberToObject(res, "code", RKV_EINVAL);
            } else {
                char *ctx = cj ? cJSON_PrintUnformatted(cj) : NULL;
                char *text;
                size_t tl;
                int r = render_one(tj->valuestring, strlen(tj->valuestring), ctx,
                                   ctx ? strlen(ctx) : 0, cJSON_IsNumber(nj),
                                   cJSON_IsNumber(nj) ? (long long)nj->valuedouble : 0, lim, &text,
                                   &tl);
                free(ctx);
                if (r < 0) {
                    cJSON_AddStringToObject(res, "error", text ? text : "out of memory");
                    cJSON_AddNumberToObject(res, "code", r);
                } else if (memchr(text, 0, tl)) {
                    cJSON_AddStringToObject(res, "error", "the output holds a NUL byte");
                    cJSON_AddNumberToObject(res, "code", RKV_EFORMAT);
                } else {
                    cJSON_AddStringToObject(res, "out", text);
                }
                free(text);
            }
            char *s = cJSON_PrintUnformatted(res);
            puts(s ? s : "{\"error\": \"out of memory\", \"code\": -4098}");
            free(s);
            cJSON_Delete(res);
            cJSON_Delete(j);
        }
        line += ll + 1;
    }
    free(buf);
    return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *tpath = NULL, *ctx = NULL, *cpath = NULL, *batch = NULL;
    long long now = 0;
    int have_now = 0;
    struct jinja_limits lim = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "rkv-jinja: %s needs a value\n%s", a, usage);
            return 2;
        }
        if (!strcmp(a, "--template"))
            tpath = v;
        else if (!strcmp(a, "--context"))
            ctx = v;
        else if (!strcmp(a, "--context-file"))
            cpath = v;
        else if (!strcmp(a, "--batch"))
            batch = v;
        else if (!strcmp(a, "--now"))
            now = strtoll(v, NULL, 10), have_now = 1;
        else if (!strcmp(a, "--max-steps"))
            lim.max_steps = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-output"))
            lim.max_output = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "rkv-jinja: unknown option %s\n%s", a, usage);
            return 2;
        }
        i++;
    }
    if (batch)
        return run_batch(batch, &lim);
    if (!tpath) {
        fputs(usage, stderr);
        return 2;
    }
    char *tmpl, *cbuf = NULL;
    size_t tlen, clen = ctx ? strlen(ctx) : 0;
    int rc = rkv_read_file(tpath, 0, &tmpl, &tlen);
    if (rc < 0) {
        fprintf(stderr, "rkv-jinja: %s: %s\n", tpath, rkv_strerror(rc));
        return 1;
    }
    if (cpath) {
        rc = rkv_read_file(cpath, 0, &cbuf, &clen);
        if (rc < 0) {
            fprintf(stderr, "rkv-jinja: %s: %s\n", cpath, rkv_strerror(rc));
            free(tmpl);
            return 1;
        }
        ctx = cbuf;
    }
    char *text;
    size_t tl;
    rc = render_one(tmpl, tlen, ctx, clen, have_now, now, &lim, &text, &tl);
    free(tmpl);
    free(cbuf);
    if (rc < 0) {
        fprintf(stderr, "rkv-jinja: %s\n", text ? text : rkv_strerror(rc));
        free(text);
        return 1;
    }
    fwrite(text, 1, tl, stdout);
    free(text);
    return fflush(stdout) == 0 ? 0 : 1;
}
