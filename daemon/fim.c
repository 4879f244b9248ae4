/* fim.c - fill-in-the-middle tokens and prompts. */
#include "daemon/fim.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"

/* the marker families, in the order they are looked for */
static const char *const families[][3] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
    {"\xe2\x96\x81<PRE>", "\xe2\x96\x81<SUF>", "\xe2\x96\x81<MID>"},
    {"<PRE>", "<SUF>", "<MID>"},
};

static void fim_none(struct fim_tokens *out)
{
    out->pre = out->suf = out->mid = -1;
}

int fim_from_vocab(const char *const *tokens, size_t n, struct fim_tokens *out)
{
    size_t n_fam = sizeof families / sizeof families[0];
    for (size_t f = 0; f < n_fam; f++) {
        int32_t id[3] = {-1, -1, -1};
        for (size_t i = 0; i < n && i <= INT32_MAX; i++)
            for (int k = 0; k < 3; k++)
                if (id[k] < 0 && tokens[i] && strcmp(tokens[i], families[f][k]) == 0)
                    id[k] = (int32_t)i;
        if (id[0] >= 0 && id[1] >= 0 && id[2] >= 0) {
            *out = (struct fim_tokens){id[0], id[1], id[2]};
            return 1;
        }
    }
    fim_none(out);
    return 0;
}

int fim_find(const struct gguf_ctx *g, struct fim_tokens *out)
{
    fim_none(out);
    enum gguf_value_type et;
    uint64_t n = 0;
    if (!g || gguf_get_arr_info(g, "tokenizer.ggml.tokens", &et, &n) != 0 || n == 0)
        return 0;
    static const char *const keys[3] = {"tokenizer.ggml.fim_pre_token_id",
                                        "tokenizer.ggml.fim_suf_token_id",
                                        "tokenizer.ggml.fim_mid_token_id"};
    uint32_t id[3];
    int found = 0;
    for (int k = 0; k < 3; k++)
        found += gguf_get_u32(g, keys[k], &id[k]) == 0 && id[k] < n;
    if (found == 3) {
        *out = (struct fim_tokens){(int32_t)id[0], (int32_t)id[1], (int32_t)id[2]};
        return 1;
    }
    /* short names only: no marker is longer than 15 bytes */
    char **names = calloc(n, sizeof *names);
    int rc = 0;
    if (names) {
        for (uint64_t i = 0; i < n; i++) {
            struct gguf_str s;
            if (gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s) == 0 && s.len < 16 &&
                s.len > 0 && (s.ptr[0] == '<' || (unsigned char)s.ptr[0] == 0xe2))
                names[i] = strndup(s.ptr, s.len);
        }
        rc = fim_from_vocab((const char *const *)names, n, out);
        for (uint64_t i = 0; i < n; i++)
            free(names[i]);
    }
    free(names);
    return rc;
}

int fim_build(const struct fim_tokens *f, int32_t bos, const int32_t *prefix, size_t n_prefix,
              const int32_t *suffix, size_t n_suffix, int32_t *out, size_t cap)
{
    size_t need = (bos >= 0) + 3 + n_prefix + n_suffix, n = 0;
    if (need > cap)
        return RKV_ETOOBIG;
    if (bos >= 0)
        out[n++] = bos;
    out[n++] = f->pre;
    if (n_prefix)
        memcpy(out + n, prefix, n_prefix * sizeof *out);
    n += n_prefix;
    out[n++] = f->suf;
    if (n_suffix)
        memcpy(out + n, suffix, n_suffix * sizeof *out);
    n += n_suffix;
    out[n++] = f->mid;
    return (int)n;
}
