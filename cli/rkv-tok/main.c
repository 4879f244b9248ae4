/* rkv-tok - tokenize or detokenize with a model's GGUF tokenizer (tests, debugging). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/log.h"
#include "common/tok.h"
#include "common/util.h"

static const char usage[] =
    "usage: rkv-tok --model FILE [options] TEXT | --file F | --decode IDS\n"
    "  TEXT             text to tokenize; prints its ids as a JSON array\n"
    "  --file F         tokenize the bytes of file F (\"-\" = stdin)\n"
    "  --lines          with --file: one JSON array per line (the newline left out)\n"
    "  --ids            print ids as a JSON array (the default)\n"
    "  --pieces         print one \"id<TAB>piece\" line per token instead\n"
    "  --bos            add BOS when the model wants one\n"
    "  --special        parse special-token texts (<|eot_id|>) in the input; with --decode,\n"
    "                   render control tokens\n"
    "  --decode IDS     print the text of IDS (\"1,2,3\" or \"[1, 2, 3]\")\n"
    "  --chat FILE      render a JSON array of {role, content} messages with the model's\n"
    "                   chat template (add --gen for the assistant prefix)\n"
    "  --chat-template F  with --chat: render with the Jinja template in file F instead\n"
    "  --info           print vocabulary facts as JSON\n"
    "  --time           report tokenizing speed on stderr\n"
    "  --verbose        log at info level\n";

struct opts {
    const char *model, *file, *decode, *chat, *chat_template, *text;
    int lines, pieces, bos, special, gen, info, time, verbose;
};

/* JSON string body with escapes */
static void put_json_str(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static int encode_print(const struct tok *t, const struct opts *o, const char *s, size_t len,
                        double *secs)
{
    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return RKV_ENOMEM;
    uint64_t t0 = rkv_now_ns();
    int rc = tok_encode(t, s, len, o->bos, o->special, ids, cap, &n);
    *secs += (double)(rkv_now_ns() - t0) / 1e9;
    if (rc < 0) {
        free(ids);
        return rc;
    }
    if (o->pieces) {
        for (size_t i = 0; i < n; i++) {
            char buf[1024];
            int k = tok_token_bytes(t, ids[i], 1, buf, sizeof buf);
            printf("%d\t", ids[i]);
            put_json_str(buf, k > 0 && (size_t)k <= sizeof buf ? (size_t)k : 0);
            putchar('\n');
        }
    } else {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
    }
    free(ids);
    return 0;
}

static int decode_print(const struct tok *t, const struct opts *o)
{
    struct tok_detok d;
    tok_detok_init(&d, t);
    const char *p = o->decode;
    char out[4096];
    size_t n;
    while (*p) {
        if (strchr("[], \t\n", *p)) {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= tok_n_vocab(t)) {
            fprintf(stderr, "rkv-tok: --decode: \"%.20s\" is not a token id (0..%d)\n", p,
                    tok_n_vocab(t) - 1);
            return RKV_EINVAL;
        }
        p = end;
        if (o->special) {
            /* raw bytes, control tokens rendered */
            int k = tok_token_bytes(t, (int32_t)v, 1, out, sizeof out);
            if (k > 0 && (size_t)k <= sizeof out)
                fwrite(out, 1, (size_t)k, stdout);
            continue;
        }
        int rc = tok_detok_push(&d, (int32_t)v, out, sizeof out, &n);
        if (rc < 0)
            return rc;
        fwrite(out, 1, n, stdout);
    }
    if (!o->special && tok_detok_flush(&d, out, sizeof out, &n) == 0)
        fwrite(out, 1, n, stdout);
    return 0;
}

static int info_print(const struct tok *t)
{
    printf("{\"n_vocab\": %d, \"bos\": %d, \"eos\": %d, \"add_bos\": %s, \"chat\": \"%s\", "
           "\"pre\": \"%s\", \"eog\": [",
           tok_n_vocab(t), tok_bos(t), tok_eos(t), tok_add_bos(t) ? "true" : "false",
           tok_chat_kind_name(tok_chat_kind(t)), tok_pre_name(t));
    int first = 1;
    for (int32_t i = 0; i < tok_n_vocab(t); i++)
        if (tok_is_eog(t, i)) {
            printf(first ? "%d" : ", %d", i);
            first = 0;
        }
    puts("]}");
    return 0;
}

/* the --chat file: [{"role": "...", "content": "..."}, ...] */
static int chat_print(const struct tok *t, const struct opts *o)
{
    char *json;
    size_t len;
    int rc = rkv_read_file(o->chat, 0, &json, &len);
    if (rc < 0) {
        fprintf(stderr, "rkv-tok: cannot read %s: %s\n", o->chat, rkv_strerror(rc));
        return rc;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    free(json);
    int n = cJSON_IsArray(root) ? cJSON_GetArraySize(root) : -1;
    if (n < 0) {
        fprintf(stderr, "rkv-tok: %s: expected a JSON array of {\"role\", \"content\"}\n", o->chat);
        cJSON_Delete(root);
        return RKV_EFORMAT;
    }
    struct tok_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
    for (int i = 0; m && i < n; i++) {
        cJSON *it = cJSON_GetArrayItem(root, i);
        m[i].role = cJSON_GetStringValue(cJSON_GetObjectItem(it, "role"));
        m[i].content = cJSON_GetStringValue(cJSON_GetObjectItem(it, "content"));
    }
    char *s = NULL, why[512] = "";
    rc = m ? tok_chat_render(t, m, (size_t)n, o->gen, &s, why, sizeof why) : RKV_ENOMEM;
    if (rc == 0)
        fputs(s, stdout);
    else if (why[0])
        fprintf(stderr, "rkv-tok: %s\n", why);
    free(s);
    free(m);
    cJSON_Delete(root);
    return rc;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--model") && has_val)
            o->model = argv[++i];
        else if (!strcmp(a, "--file") && has_val)
            o->file = argv[++i];
        else if (!strcmp(a, "--decode") && has_val)
            o->decode = argv[++i];
        else if (!strcmp(a, "--chat") && has_val)
            o->chat = argv[++i];
        else if (!strcmp(a, "--chat-template") && has_val)
            o->chat_template = argv[++i];
        else if (!strcmp(a, "--lines"))
            o->lines = 1;
        else if (!strcmp(a, "--ids"))
            o->pieces = 0;
        else if (!strcmp(a, "--pieces"))
            o->pieces = 1;
        else if (!strcmp(a, "--bos"))
            o->bos = 1;
        else if (!strcmp(a, "--special"))
            o->special = 1;
        else if (!strcmp(a, "--gen"))
            o->gen = 1;
        else if (!strcmp(a, "--info"))
            o->info = 1;
        else if (!strcmp(a, "--time"))
            o->time = 1;
        else if (!strcmp(a, "--verbose"))
            o->verbose = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            exit(0);
        } else if (a[0] == '-' && a[1] == '-' && !o->text) {
            fprintf(stderr, "rkv-tok: unknown option %s (or it lacks its value)\n%s", a, usage);
            return -1;
        } else if (!o->text) {
            o->text = a;
        } else {
            fprintf(stderr, "rkv-tok: give one TEXT (quote it); \"%s\" is extra\n", a);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "rkv-tok: --model FILE is required\n%s", usage);
        return -1;
    }
    if (!o->text && !o->file && !o->decode && !o->chat && !o->info) {
        fprintf(stderr, "rkv-tok: nothing to do: give TEXT, --file, --decode, --chat or --info\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {0};
    if (parse_args(argc, argv, &o) < 0)
        return 2;
    rkv_log_init("rkv-tok", o.verbose ? RKV_LOG_INFO : RKV_LOG_WARN);

    char err[512];
    struct gguf_ctx *g = NULL;
    struct tok *t = NULL;
    int rc = gguf_open(o.model, &g, err, sizeof err);
    if (rc == 0)
        rc = tok_load_gguf(g, &t, err, sizeof err);
    gguf_close(g);
    if (rc < 0) {
        fprintf(stderr, "rkv-tok: %s\n", err[0] ? err : rkv_strerror(rc));
        return 1;
    }
    if (o.chat_template) {
        char *src;
        size_t len;
        err[0] = 0;
        if ((rc = rkv_read_file(o.chat_template, 0, &src, &len)) < 0) {
            snprintf(err, sizeof err, "cannot read %s: %s", o.chat_template, rkv_strerror(rc));
        } else {
            rc = tok_chat_set_template(t, src, len, o.chat_template, err, sizeof err);
            free(src);
        }
        if (rc < 0) {
            fprintf(stderr, "rkv-tok: %s\n", err[0] ? err : rkv_strerror(rc));
            tok_destroy(t);
            return 1;
        }
    }

    double secs = 0;
    size_t bytes = 0;
    if (o.info) {
        rc = info_print(t);
    } else if (o.decode) {
        rc = decode_print(t, &o);
    } else if (o.chat) {
        rc = chat_print(t, &o);
    } else if (o.file) {
        char *buf;
        size_t len;
        rc = rkv_read_file(o.file, 0, &buf, &len);
        if (rc < 0) {
            fprintf(stderr, "rkv-tok: cannot read %s: %s\n", o.file, rkv_strerror(rc));
        } else if (o.lines) {
            for (size_t s = 0; s < len && rc == 0;) {
                const char *nl = memchr(buf + s, '\n', len - s);
                size_t e = nl ? (size_t)(nl - buf) : len;
                rc = encode_print(t, &o, buf + s, e - s, &secs);
                s = e + 1;
            }
            bytes = len;
            free(buf);
        } else {
            rc = encode_print(t, &o, buf, len, &secs);
            bytes = len;
            free(buf);
        }
    } else {
        bytes = strlen(o.text);
        rc = encode_print(t, &o, o.text, bytes, &secs);
    }
    if (rc < 0 && rc != RKV_EINVAL)
        fprintf(stderr, "rkv-tok: %s\n", rkv_strerror(rc));
    if (o.time && secs > 0)
        fprintf(stderr, "rkv-tok: %zu bytes in %.3f s (%.1f MB/s)\n", bytes, secs,
                (double)bytes / secs / 1e6);
    tok_destroy(t);
    fflush(stdout);
    return rc < 0 ? 1 : 0;
}
