/* fuzz_tok.c - libFuzzer: encode, decode and detok arbitrary bytes with a small bpe and spm vocab.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/log.h"
#include "common/tok.h"
#include "common/tok_test_gguf.h"

static struct tok *g_bpe, *g_spm;

static struct tok *load(struct tgg *b)
{
    struct gguf_ctx *g = NULL;
    struct tok *t = NULL;
    char err[256];
    if (gguf_open_mem(b->p, b->n, &g, err, sizeof err) != 0 ||
        tok_load_gguf(g, &t, err, sizeof err) != 0)
        abort();
    gguf_close(g);
    free(b->p);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    struct tgg b;
    rkv_log_init("fuzz_tok", RKV_LOG_ERROR);
    tgg_bpe(&b, "llama-bpe", "llama", NULL);
    g_bpe = load(&b);
    tgg_spm(&b, 1, "llama", NULL);
    g_spm = load(&b);
    return 0;
}

/* an independent utf-8 validator (the detok output must pass it) */
static int valid_utf8(const uint8_t *s, size_t n)
{
    static const uint32_t min_cp[] = {0, 0x80, 0x800, 0x10000};
    static const uint8_t mask[] = {0x7f, 0x1f, 0x0f, 0x07};
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t need;
        if (c < 0x80)
            need = 0;
        else if (c >= 0xc0 && c < 0xe0)
            need = 1;
        else if (c >= 0xe0 && c < 0xf0)
            need = 2;
        else if (c >= 0xf0 && c < 0xf8)
            need = 3;
        else
            return 0;
        if (i + need >= n && need)
            return 0;
        uint32_t cp = c & mask[need];
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min_cp[need] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += need + 1;
    }
    return 1;
}

/* bytes of all ids concatenated (render_special as given); malloc'd */
static uint8_t *decode(const struct tok *t, const int32_t *ids, size_t n, int special, size_t *len)
{
    size_t cap = 64, o = 0;
    uint8_t *out = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        int k = tok_token_bytes(t, ids[i], special, NULL, 0);
        if (k < 0)
            abort();
        while (o + (size_t)k > cap)
            out = realloc(out, cap *= 2);
        tok_token_bytes(t, ids[i], special, (char *)out + o, cap - o);
        o += (size_t)k;
    }
    *len = o;
    return out;
}

static uint8_t *detok(const struct tok *t, const int32_t *ids, size_t n, size_t *len)
{
    struct tok_detok d;
    uint8_t *out = malloc(64 * (n + 1));
    size_t o = 0, k;
    tok_detok_init(&d, t);
    for (size_t i = 0; i < n; i++) {
        if (tok_detok_push(&d, ids[i], (char *)out + o, 64, &k) != 0)
            abort(); /* the fuzz vocabularies have no piece longer than 64 / 3 bytes */
        o += k;
    }
    if (tok_detok_flush(&d, (char *)out + o, 64, &k) != 0)
        abort();
    *len = o + k;
    return out;
}

static void check_bpe(const uint8_t *data, size_t size, int special)
{
    size_t n = 0;
    int32_t *ids = malloc((size + 2) * sizeof *ids);
    if (tok_encode(g_bpe, (const char *)data, size, 1, special, ids, size + 2, &n) != 0)
        abort();
    size_t dl, tl;
    /* ids[0] is bos: skip it; control tokens render back to their text */
    uint8_t *dec = decode(g_bpe, ids + 1, n - 1, 1, &dl);
    if (dl != size || memcmp(dec, data, size) != 0)
        abort();
    uint8_t *txt = detok(g_bpe, ids, n, &tl);
    if (!valid_utf8(txt, tl))
        abort();
    if (!special && valid_utf8(data, size) && (tl != size || memcmp(txt, data, size) != 0))
        abort();
    free(dec);
    free(txt);
    free(ids);
}

static void check_spm(const uint8_t *data, size_t size)
{
    size_t n = 0;
    int32_t *ids = malloc((size + 2) * sizeof *ids);
    if (tok_encode(g_spm, (const char *)data, size, 1, 0, ids, size + 2, &n) != 0)
        abort();
    size_t dl, tl;
    uint8_t *dec = decode(g_spm, ids, n, 0, &dl);
    /* spm adds one leading space and writes ' ' as U+2581, which decodes as ' ' */
    uint8_t *want = malloc(size + 1);
    size_t wl = 0;
    for (size_t i = 0; i < size; i++) {
        if (i + 2 < size && !memcmp(data + i, "\xe2\x96\x81", 3)) {
            want[wl++] = ' ';
            i += 2;
        } else {
            want[wl++] = data[i];
        }
    }
    if (size && (dl != wl + 1 || dec[0] != ' ' || memcmp(dec + 1, want, wl) != 0))
        abort();
    uint8_t *txt = detok(g_spm, ids, n, &tl);
    if (!valid_utf8(txt, tl))
        abort();
    free(want);
    free(dec);
    free(txt);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    check_bpe(data, size, 0);
    check_bpe(data, size, 1);
    check_spm(data, size);

    /* chat rendering with the input as content */
    char *content = malloc(size + 1), *s = NULL;
    memcpy(content, data, size);
    content[size] = 0;
    struct tok_chat_msg m[2] = {{"system", content}, {"user", content}};
    if (tok_chat_apply(g_bpe, m, 2, 1, &s) != 0 || !s)
        abort();
    free(s);
    if (tok_chat_apply(g_spm, m, 2, 1, &s) != 0 || !s)
        abort();
    free(s);
    free(content);
    return 0;
}
