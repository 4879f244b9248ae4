/* tok_test_gguf.h - test-only: GGUF images built in memory and the small vocabularies tok tests
 * use. */
#ifndef RKV_TOK_TEST_GGUF_H
#define RKV_TOK_TEST_GGUF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a GGUF v3 image with metadata only (no tensors), grown in memory */
struct tgg {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
};

static inline void tgg_bytes(struct tgg *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->n + n)
            c *= 2;
        b->p = realloc(b->p, c);
        if (!b->p)
            abort(); /* test helper: no recovery */
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static inline void tgg_u32raw(struct tgg *b, uint32_t v)
{
    tgg_bytes(b, &v, 4); /* gguf is little-endian, as is every host rkv runs on */
}

static inline void tgg_u64raw(struct tgg *b, uint64_t v)
{
    tgg_bytes(b, &v, 8);
}

static inline void tgg_strraw(struct tgg *b, const char *s)
{
    tgg_u64raw(b, strlen(s));
    tgg_bytes(b, s, strlen(s));
}

static inline void tgg_init(struct tgg *b)
{
    memset(b, 0, sizeof *b);
    tgg_bytes(b, "GGUF", 4);
    tgg_u32raw(b, 3);
    tgg_u64raw(b, 0); /* tensors */
    tgg_u64raw(b, 0); /* kv count, patched by tgg_finish */
}

static inline void tgg_key(struct tgg *b, const char *key, uint32_t type)
{
    tgg_strraw(b, key);
    tgg_u32raw(b, type);
    b->n_kv++;
}

static inline void tgg_str(struct tgg *b, const char *key, const char *v)
{
    tgg_key(b, key, 8);
    tgg_strraw(b, v);
}

static inline void tgg_u32(struct tgg *b, const char *key, uint32_t v)
{
    tgg_key(b, key, 4);
    tgg_u32raw(b, v);
}

static inline void tgg_bool(struct tgg *b, const char *key, int v)
{
    uint8_t x = (uint8_t)(v != 0);
    tgg_key(b, key, 7);
    tgg_bytes(b, &x, 1);
}

static inline void tgg_arr_str(struct tgg *b, const char *key, char *const *v, size_t n)
{
    tgg_key(b, key, 9);
    tgg_u32raw(b, 8);
    tgg_u64raw(b, n);
    for (size_t i = 0; i < n; i++)
        tgg_strraw(b, v[i]);
}

static inline void tgg_arr_f32(struct tgg *b, const char *key, const float *v, size_t n)
{
    tgg_key(b, key, 9);
    tgg_u32raw(b, 6);
    tgg_u64raw(b, n);
    tgg_bytes(b, v, n * sizeof *v);
}

static inline void tgg_arr_i32(struct tgg *b, const char *key, const int32_t *v, size_t n)
{
    tgg_key(b, key, 9);
    tgg_u32raw(b, 5);
    tgg_u64raw(b, n);
    tgg_bytes(b, v, n * sizeof *v);
}

static inline void tgg_finish(struct tgg *b)
{
    memcpy(b->p + 16, &b->n_kv, 8);
}

/* --- vocabularies ---------------------------------------------------------- */

/* a list of owned strings */
struct tgg_list {
    char **s;
    size_t n;
};

static inline void tgg_list_add(struct tgg_list *l, const char *s)
{
    l->s = realloc(l->s, (l->n + 1) * sizeof *l->s);
    if (!l->s)
        abort();
    l->s[l->n++] = strdup(s);
}

static inline void tgg_list_fini(struct tgg_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->s[i]);
    free(l->s);
}

/* gpt-2's bytes_to_unicode, written the python way (independent of tok_bpe.c) */
static inline void tgg_byte_char(int byte, char out[3])
{
    int n = 0, cp = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        if (b == byte)
            cp = printable ? b : 256 + n;
        if (!printable)
            n++;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

/* ids of the test bpe vocabulary: 0..255 are the bytes themselves */
enum {
    TBPE_HE = 256,
    TBPE_LL,
    TBPE_HELL,
    TBPE_HELLO,
    TBPE_GW, /* "Ġw" = " w" */
    TBPE_OR,
    TBPE_GWOR,
    TBPE_GWORL,
    TBPE_GWORLD,
    TBPE_BOT, /* <|begin_of_text|> */
    TBPE_EOT, /* <|end_of_text|> */
    TBPE_EOTID,
    TBPE_TOOL, /* <tool>, user-defined */
    TBPE_X,    /* <|x|> */
    TBPE_XY,   /* <|x|>y */
    TBPE_SHI,  /* <|start_header_id|> */
    TBPE_EHI,  /* <|end_header_id|> */
    TBPE_IMS,  /* <|im_start|> */
    TBPE_IME,  /* <|im_end|> */
    TBPE_XYZ,  /* "xyz": a token no merge makes */
    TBPE_N,
};

/* byte-level bpe gguf. pre/arch/tmpl may be NULL (key left out) */
static inline void tgg_bpe(struct tgg *b, const char *pre, const char *arch, const char *tmpl)
{
    static const char *const merges[][2] = {
        {"h", "e"}, {"l", "l"},   {"he", "ll"},  {"hell", "o"},  {"Ġ", "w"},
        {"o", "r"}, {"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"},
    };
    static const char *const specials[] = {
        "<|begin_of_text|>",   "<|end_of_text|>",   "<|eot_id|>",   "<tool>",     "<|x|>", "<|x|>y",
        "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>",
    };
    struct tgg_list toks = {0}, mer = {0};
    int32_t types[TBPE_N];
    for (int i = 0; i < 256; i++) {
        char c[3];
        tgg_byte_char(i, c);
        tgg_list_add(&toks, c);
        types[i] = 1;
    }
    for (size_t i = 0; i < sizeof merges / sizeof *merges; i++) {
        char m[64];
        snprintf(m, sizeof m, "%s %s", merges[i][0], merges[i][1]);
        tgg_list_add(&mer, m);
        snprintf(m, sizeof m, "%s%s", merges[i][0], merges[i][1]);
        types[toks.n] = 1;
        tgg_list_add(&toks, m);
    }
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        types[toks.n] = toks.n == TBPE_TOOL ? 4 : 3;
        tgg_list_add(&toks, specials[i]);
    }
    types[toks.n] = 1;
    tgg_list_add(&toks, "xyz");
    tgg_init(b);
    if (arch)
        tgg_str(b, "general.architecture", arch);
    tgg_str(b, "tokenizer.ggml.model", "gpt2");
    if (pre)
        tgg_str(b, "tokenizer.ggml.pre", pre);
    tgg_arr_str(b, "tokenizer.ggml.tokens", toks.s, toks.n);
    tgg_arr_i32(b, "tokenizer.ggml.token_type", types, toks.n);
    tgg_arr_str(b, "tokenizer.ggml.merges", mer.s, mer.n);
    tgg_u32(b, "tokenizer.ggml.bos_token_id", TBPE_BOT);
    tgg_u32(b, "tokenizer.ggml.eos_token_id", TBPE_EOT);
    if (tmpl)
        tgg_str(b, "tokenizer.chat_template", tmpl);
    tgg_finish(b);
    tgg_list_fini(&toks);
    tgg_list_fini(&mer);
}

/* ids of the test spm vocabulary: 3 + b is <0xb> when byte tokens are on */
enum {
    TSPM_UNK = 0,
    TSPM_BOS = 1,
    TSPM_EOS = 2,
    TSPM_BYTE0 = 3,
};
/* with_bytes = 0 leaves the <0xXX> tokens out (unk fallback); then the word
 * ids below shift down by 256 */
static inline int32_t tspm_id(int with_bytes, int i)
{
    return (with_bytes ? 259 : 3) + i;
}
enum {
    TSPM_SP,
    TSPM_H,
    TSPM_E,
    TSPM_L,
    TSPM_O,
    TSPM_W,
    TSPM_R,
    TSPM_D,
    TSPM_SPH,
    TSPM_LL,
    TSPM_SPHE,
    TSPM_LLO,
    TSPM_SPHELLO,
    TSPM_SPW,
    TSPM_OR,
    TSPM_SPWOR,
    TSPM_LD,
    TSPM_SPWORLD,
    TSPM_EACUTE,
    TSPM_N
};

static inline void tgg_spm(struct tgg *b, int with_bytes, const char *arch, const char *tmpl)
{
    static const struct {
        const char *s;
        float score;
    } words[TSPM_N] = {
        {"\xe2\x96\x81", -1},
        {"h", -2},
        {"e", -2},
        {"l", -2},
        {"o", -2},
        {"w", -2},
        {"r", -2},
        {"d", -2},
        {"\xe2\x96\x81h", -3},
        {"ll", -3},
        {"\xe2\x96\x81he", -4},
        {"llo", -4},
        {"\xe2\x96\x81hello", -5},
        {"\xe2\x96\x81w", -6},
        {"or", -6},
        {"\xe2\x96\x81wor", -7},
        {"ld", -7},
        {"\xe2\x96\x81world", -8},
        {"\xc3\xa9", -2},
    };
    struct tgg_list toks = {0};
    float scores[3 + 256 + TSPM_N];
    int32_t types[3 + 256 + TSPM_N];
    tgg_list_add(&toks, "<unk>");
    tgg_list_add(&toks, "<s>");
    tgg_list_add(&toks, "</s>");
    types[0] = 2;
    types[1] = types[2] = 3;
    scores[0] = scores[1] = scores[2] = 0;
    for (int i = 0; with_bytes && i < 256; i++) {
        char c[8];
        snprintf(c, sizeof c, "<0x%02X>", i);
        scores[toks.n] = 0;
        types[toks.n] = 6;
        tgg_list_add(&toks, c);
    }
    for (int i = 0; i < TSPM_N; i++) {
        scores[toks.n] = words[i].score;
        types[toks.n] = 1;
        tgg_list_add(&toks, words[i].s);
    }
    tgg_init(b);
    if (arch)
        tgg_str(b, "general.architecture", arch);
    tgg_str(b, "tokenizer.ggml.model", "llama");
    tgg_arr_str(b, "tokenizer.ggml.tokens", toks.s, toks.n);
    tgg_arr_f32(b, "tokenizer.ggml.scores", scores, toks.n);
    tgg_arr_i32(b, "tokenizer.ggml.token_type", types, toks.n);
    tgg_u32(b, "tokenizer.ggml.bos_token_id", TSPM_BOS);
    tgg_u32(b, "tokenizer.ggml.eos_token_id", TSPM_EOS);
    tgg_u32(b, "tokenizer.ggml.unknown_token_id", TSPM_UNK);
    if (tmpl)
        tgg_str(b, "tokenizer.chat_template", tmpl);
    tgg_finish(b);
    tgg_list_fini(&toks);
}

#endif
