/* tok_test.c - tokenizer: bpe and spm encoding, round trips, special tokens, detok, chat templates.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/log.h"
#include "common/tok.h"
#include "common/tok_test_gguf.h"

static int load_image(struct tgg *b, struct tok **t, char *err, size_t errlen)
{
    struct gguf_ctx *g = NULL;
    int rc = gguf_open_mem(b->p, b->n, &g, err, errlen);
    if (rc == 0) {
        rc = tok_load_gguf(g, t, err, errlen);
        gguf_close(g); /* the tokenizer keeps copies of what it needs */
    }
    free(b->p);
    return rc;
}

static struct tok *bpe(const char *pre, const char *arch, const char *tmpl)
{
    struct tgg b;
    struct tok *t = NULL;
    char err[256];
    tgg_bpe(&b, pre, arch, tmpl);
    int rc = load_image(&b, &t, err, sizeof err);
    if (rc)
        print_error("load: %s\n", err);
    assert_int_equal(rc, 0);
    return t;
}

static struct tok *spm(int with_bytes, const char *arch, const char *tmpl)
{
    struct tgg b;
    struct tok *t = NULL;
    char err[256];
    tgg_spm(&b, with_bytes, arch, tmpl);
    int rc = load_image(&b, &t, err, sizeof err);
    if (rc)
        print_error("load: %s\n", err);
    assert_int_equal(rc, 0);
    return t;
}

/* encodes s and checks the ids */
static void expect_ids(const struct tok *t, const char *s, int add_bos, int special,
                       const int32_t *want, size_t n_want)
{
    int32_t ids[256];
    size_t n = 0;
    assert_int_equal(tok_encode(t, s, strlen(s), add_bos, special, ids, 256, &n), 0);
    if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
        print_error("\"%s\": got", s);
        for (size_t i = 0; i < n; i++)
            print_error(" %d", ids[i]);
        print_error("\n");
    }
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, n * sizeof *ids);
}
#define EXPECT(t, s, bos, special, ...)                                                            \
    do {                                                                                           \
        const int32_t w_[] = {__VA_ARGS__};                                                        \
        expect_ids(t, s, bos, special, w_, sizeof w_ / sizeof *w_);                                \
    } while (0)

/* concatenated bytes of ids; returns malloc'd text, *len */
static char *decode_all(const struct tok *t, const int32_t *ids, size_t n, int special, size_t *len)
{
    size_t cap = 64, o = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        int k = tok_token_bytes(t, ids[i], special, NULL, 0);
        assert_true(k >= 0);
        while (o + (size_t)k > cap)
            out = realloc(out, cap *= 2);
        assert_int_equal(tok_token_bytes(t, ids[i], special, out + o, cap - o), k);
        o += (size_t)k;
    }
    *len = o;
    return out;
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* random text: raw bytes, ascii words, multi-byte chars, spaces and digits */
static size_t random_text(uint64_t *rng, char *buf, size_t cap)
{
    static const char *const parts[] = {
        "hello",
        " world",
        "  ",
        "\t",
        "\n",
        "don't",
        "123456",
        "\xc3\xa9",
        "\xe2\x82\xac",
        "\xf0\x9f\x98\x80",
        "\xe4\xb8\xad\xe6\x96\x87",
        " ",
        "'S",
        "\r\n",
        "<|x|",
    };
    size_t n = 0, parts_n = rng_next(rng) % 12;
    for (size_t i = 0; i < parts_n; i++) {
        if (rng_next(rng) % 3 == 0) {
            size_t k = rng_next(rng) % 4 + 1;
            for (size_t j = 0; j < k && n < cap; j++)
                buf[n++] = (char)(rng_next(rng) & 0xff);
        } else {
            const char *p = parts[rng_next(rng) % (sizeof parts / sizeof *parts)];
            size_t k = strlen(p);
            if (n + k > cap)
                break;
            memcpy(buf + n, p, k);
            n += k;
        }
    }
    return n;
}

static void test_bpe_encode(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", NULL);
    assert_int_equal(tok_n_vocab(t), TBPE_N);
    assert_int_equal(tok_bos(t), TBPE_BOT);
    assert_int_equal(tok_eos(t), TBPE_EOT);
    assert_int_equal(tok_add_bos(t), 1); /* llama 3 adds bos */
    EXPECT(t, "hello world", 0, 0, TBPE_HELLO, TBPE_GWORLD);
    EXPECT(t, "hello world", 1, 0, TBPE_BOT, TBPE_HELLO, TBPE_GWORLD);
    tok_destroy(t);
}

static void roundtrip(const struct tok *t, int spm_mode, uint64_t seed);

static void test_bpe_words(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", NULL);
    /* "  world": the first space stands alone (\s+(?!\S)); byte 0x20 is token 32 */
    EXPECT(t, "  world", 0, 0, ' ', TBPE_GWORLD);
    EXPECT(t, "hello\nworld", 0, 0, TBPE_HELLO, '\n', 'w', TBPE_OR, 'l', 'd');
    EXPECT(t, "he", 0, 0, TBPE_HE);
    EXPECT(t, "", 1, 0, TBPE_BOT);
    size_t n = 99;
    assert_int_equal(tok_encode(t, "", 0, 0, 0, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    /* llama 3 ignores merges for a word that is a token */
    EXPECT(t, "xyz xyz", 0, 0, TBPE_XYZ, ' ', 'x', 'y', 'z');
    tok_destroy(t);

    /* gpt-2 style pre-tokenizer: no bos by default, merges always */
    t = bpe(NULL, NULL, NULL);
    assert_int_equal(tok_add_bos(t), 0);
    EXPECT(t, "hello world", 1, 0, TBPE_HELLO, TBPE_GWORLD);
    EXPECT(t, "xyz", 0, 0, 'x', 'y', 'z');
    tok_destroy(t);
    /* an unknown pre value refuses to load, naming it and the known ones */
    struct tgg b;
    char err[1024];
    tgg_bpe(&b, "no-such-pre", NULL, NULL);
    t = NULL;
    assert_int_equal(load_image(&b, &t, err, sizeof err), RKV_EUNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer.ggml.pre 'no-such-pre' is not supported"));
    assert_non_null(strstr(err, "llama-bpe"));
    assert_non_null(strstr(err, "tekken"));
    t = bpe("qwen2", "qwen2", NULL);
    EXPECT(t, "hello world", 0, 0, TBPE_HELLO, TBPE_GWORLD);
    assert_string_equal(tok_pre_name(t), "qwen2");
    tok_destroy(t);
    /* sequences of regexes: digits alone first, then gpt-2's words */
    t = bpe("smollm", "llama", NULL);
    assert_string_equal(tok_pre_name(t), "smollm");
    EXPECT(t, "hello world", 0, 0, TBPE_HELLO, TBPE_GWORLD);
    tok_destroy(t);
    const char *all[] = {"tekken", "gpt-4o", "deepseek-llm", "deepseek-coder", "deepseek-r1-qwen"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        t = bpe(all[i], "llama", NULL);
        roundtrip(t, 0, 7 + i);
        tok_destroy(t);
    }
}

static void test_bpe_too_small(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", NULL);
    int32_t ids[1];
    size_t n = 0;
    assert_int_equal(tok_encode(t, "hello world", 11, 1, 0, ids, 1, &n), RKV_ETOOBIG);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], TBPE_BOT);
    assert_int_equal(tok_encode(t, "x", 1, 0, 0, NULL, 0, NULL), RKV_EINVAL);
    tok_destroy(t);
}

static void roundtrip(const struct tok *t, int spm_mode, uint64_t seed)
{
    uint64_t rng = seed;
    char text[512];
    int32_t ids[2048];
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = random_text(&rng, text, sizeof text);
        size_t n = 0;
        assert_int_equal(tok_encode(t, text, len, 0, 0, ids, 2048, &n), 0);
        size_t dl;
        char *dec = decode_all(t, ids, n, 0, &dl);
        const char *got = dec;
        if (spm_mode && dl && dec[0] == ' ') {
            got++; /* the space prefix spm added */
            dl--;
        }
        /* spm writes ' ' as U+2581, so inputs holding U+2581 come back as ' ' */
        if (dl != len || memcmp(got, text, len) != 0) {
            print_error("round trip failed at iteration %d (len %zu -> %zu)\n", iter, len, dl);
            fail();
        }
        free(dec);
    }
}

static void test_bpe_roundtrip(void **state)
{
    (void)state;
    const char *pres[] = {"llama-bpe", "qwen2", "gpt2"};
    for (int i = 0; i < 3; i++) {
        struct tok *t = bpe(pres[i], NULL, NULL);
        roundtrip(t, 0, 42 + (uint64_t)i);
        /* every single byte alone, including invalid utf-8 */
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            int32_t id;
            size_t n;
            assert_int_equal(tok_encode(t, &c, 1, 0, 0, &id, 1, &n), 0);
            assert_int_equal(n, 1);
            assert_int_equal(id, b);
        }
        tok_destroy(t);
    }
}

static void test_bpe_special(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", NULL);
    EXPECT(t, "he<|eot_id|>he", 0, 1, TBPE_HE, TBPE_EOTID, TBPE_HE);
    /* parse_special off: the text is just text */
    int32_t ids[64];
    size_t n;
    assert_int_equal(tok_encode(t, "he<|eot_id|>he", 14, 0, 0, ids, 64, &n), 0);
    assert_int_equal(n, 2 + 10 + 0); /* he, then 10 single bytes + "he" */
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], TBPE_EOTID);
    size_t dl;
    char *d = decode_all(t, ids, n, 0, &dl);
    assert_int_equal(dl, 14);
    assert_memory_equal(d, "he<|eot_id|>he", 14);
    free(d);
    /* user-defined tokens match with or without parse_special */
    EXPECT(t, "he<tool>", 0, 0, TBPE_HE, TBPE_TOOL);
    EXPECT(t, "he<tool>", 0, 1, TBPE_HE, TBPE_TOOL);
    /* longest match first */
    EXPECT(t, "<|x|>y<|x|>", 0, 1, TBPE_XY, TBPE_X);
    EXPECT(t, "<|x|<|x|>", 0, 1, '<', '|', 'x', '|', TBPE_X);
    EXPECT(t, "<|begin_of_text|>he", 1, 1, TBPE_BOT, TBPE_BOT, TBPE_HE);
    /* control tokens render only on request */
    char buf[64];
    assert_int_equal(tok_token_bytes(t, TBPE_EOTID, 0, buf, sizeof buf), 0);
    assert_int_equal(tok_token_bytes(t, TBPE_EOTID, 1, buf, sizeof buf), 10);
    assert_memory_equal(buf, "<|eot_id|>", 10);
    assert_int_equal(tok_token_bytes(t, TBPE_TOOL, 0, buf, sizeof buf), 6);
    assert_int_equal(tok_token_bytes(t, TBPE_EOTID, 1, buf, 3), 10); /* too small: size only */
    assert_int_equal(tok_token_bytes(t, TBPE_N, 0, buf, sizeof buf), RKV_EINVAL);
    assert_true(tok_is_control(t, TBPE_EOTID));
    assert_false(tok_is_control(t, TBPE_TOOL));
    assert_false(tok_is_control(t, 'a'));
    tok_destroy(t);
}

static void test_eog(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", NULL);
    assert_true(tok_is_eog(t, TBPE_EOT));   /* eos_token_id */
    assert_true(tok_is_eog(t, TBPE_EOTID)); /* by name */
    assert_true(tok_is_eog(t, TBPE_IME));   /* by name */
    assert_false(tok_is_eog(t, TBPE_BOT));
    assert_false(tok_is_eog(t, TBPE_IMS));
    assert_false(tok_is_eog(t, TBPE_HELLO));
    assert_false(tok_is_eog(t, -1));
    assert_false(tok_is_eog(t, TBPE_N));
    tok_destroy(t);
    t = spm(1, "llama", NULL);
    assert_true(tok_is_eog(t, TSPM_EOS));
    assert_false(tok_is_eog(t, TSPM_BOS));
    assert_false(tok_is_eog(t, TSPM_UNK));
    tok_destroy(t);
}

static void test_spm_encode(void **state)
{
    (void)state;
    struct tok *t = spm(1, "llama", NULL);
#define W(i) tspm_id(1, i)
    assert_int_equal(tok_add_bos(t), 1);
    EXPECT(t, "hello world", 0, 0, W(TSPM_SPHELLO), W(TSPM_SPWORLD));
    EXPECT(t, "hello world", 1, 0, TSPM_BOS, W(TSPM_SPHELLO), W(TSPM_SPWORLD));
    /* é is a piece, € falls back to its three bytes */
    EXPECT(t, "h\xc3\xa9\xe2\x82\xac", 0, 0, W(TSPM_SPH), W(TSPM_EACUTE), TSPM_BYTE0 + 0xe2,
           TSPM_BYTE0 + 0x82, TSPM_BYTE0 + 0xac);
    EXPECT(t, "\xff", 0, 0, W(TSPM_SP), TSPM_BYTE0 + 0xff);
    EXPECT(t, " w", 0, 0, W(TSPM_SP), W(TSPM_SPW));
    /* specials: each text fragment gets the space prefix */
    EXPECT(t, "hello</s>world", 0, 1, W(TSPM_SPHELLO), TSPM_EOS, W(TSPM_SPWORLD));
    EXPECT(t, "<s>hello", 0, 1, TSPM_BOS, W(TSPM_SPHELLO));
    EXPECT(t, "</s>", 0, 0, W(TSPM_SP), TSPM_BYTE0 + '<', TSPM_BYTE0 + '/', TSPM_BYTE0 + 's',
           TSPM_BYTE0 + '>');
    roundtrip(t, 1, 7);
#undef W
    tok_destroy(t);

    /* no byte tokens: unknown chars become <unk> */
    t = spm(0, "llama", NULL);
    EXPECT(t, "h\xe2\x82\xac", 0, 0, tspm_id(0, TSPM_SPH), TSPM_UNK);
    EXPECT(t, "\xff\xfe", 0, 0, tspm_id(0, TSPM_SP), TSPM_UNK, TSPM_UNK);
    tok_destroy(t);
}

/* pushes ids through a detokenizer and returns everything it wrote */
static char *detok_all(const struct tok *t, const int32_t *ids, size_t n, size_t *len)
{
    struct tok_detok d;
    tok_detok_init(&d, t);
    char *out = malloc(64 * (n + 1)), tmp[64];
    size_t o = 0, k;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(tok_detok_push(&d, ids[i], tmp, sizeof tmp, &k), 0);
        memcpy(out + o, tmp, k);
        o += k;
    }
    assert_int_equal(tok_detok_flush(&d, tmp, sizeof tmp, &k), 0);
    memcpy(out + o, tmp, k);
    *len = o + k;
    out[*len] = 0;
    return out;
}

static void test_detok_utf8(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", NULL);
    struct tok_detok d;
    char out[64];
    size_t n;
    tok_detok_init(&d, t);
    /* "€" split over three byte tokens comes out whole, once */
    assert_int_equal(tok_detok_push(&d, 0xe2, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tok_detok_push(&d, 0x82, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tok_detok_push(&d, 0xac, out, sizeof out, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xe2\x82\xac", 3);
    /* control tokens are not rendered; normal ones are */
    assert_int_equal(tok_detok_push(&d, TBPE_EOTID, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tok_detok_push(&d, TBPE_HELLO, out, sizeof out, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "hello", 5);
    /* a sequence that cannot complete becomes U+FFFD, then the rest */
    assert_int_equal(tok_detok_push(&d, 0xf0, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tok_detok_push(&d, 0x9f, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tok_detok_push(&d, 'a', out, sizeof out, &n), 0);
    assert_int_equal(n, 4);
    assert_memory_equal(out,
                        "\xef\xbf\xbd"
                        "a",
                        4);
    /* a lone continuation byte is replaced at once */
    assert_int_equal(tok_detok_push(&d, 0x80, out, sizeof out, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    /* an incomplete tail is flushed as U+FFFD */
    assert_int_equal(tok_detok_push(&d, 0xe4, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tok_detok_flush(&d, out, sizeof out, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    assert_int_equal(tok_detok_flush(&d, out, sizeof out, &n), 0);
    assert_int_equal(n, 0);
    /* a buffer too small leaves the state alone */
    assert_int_equal(tok_detok_push(&d, TBPE_HELLO, out, 2, &n), RKV_ETOOBIG);
    assert_int_equal(tok_detok_push(&d, TBPE_HELLO, out, sizeof out, &n), 0);
    assert_int_equal(n, 5);
    assert_int_equal(tok_detok_push(&d, -1, out, sizeof out, &n), RKV_EINVAL);

    /* every multi-byte text, tokenized byte by byte, detoks to itself */
    const char *texts[] = {"\xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9",
                           "hello world \xe2\x82\xac\xe2\x82\xac"};
    for (int i = 0; i < 2; i++) {
        int32_t ids[128];
        size_t k, len;
        assert_int_equal(tok_encode(t, texts[i], strlen(texts[i]), 1, 0, ids, 128, &k), 0);
        char *s = detok_all(t, ids, k, &len);
        assert_string_equal(s, texts[i]);
        free(s);
    }
    tok_destroy(t);
}

static void test_detok_spm(void **state)
{
    (void)state;
    struct tok *t = spm(1, "llama", NULL);
    int32_t ids[64];
    size_t k, len;
    const char *text = " hello world h\xc3\xa9\xe2\x82\xac\xff";
    assert_int_equal(tok_encode(t, text, strlen(text), 1, 0, ids, 64, &k), 0);
    assert_int_equal(ids[0], TSPM_BOS);
    char *s = detok_all(t, ids, k, &len);
    assert_string_equal(s, " hello world h\xc3\xa9\xe2\x82\xac\xef\xbf\xbd");
    free(s);
    assert_int_equal(tok_encode(t, "hello", 5, 0, 0, ids, 64, &k), 0);
    s = detok_all(t, ids, k, &len);
    assert_string_equal(s, "hello");
    free(s);
    char buf[16];
    assert_int_equal(tok_token_bytes(t, tspm_id(1, TSPM_SPHELLO), 0, buf, sizeof buf), 6);
    assert_memory_equal(buf, " hello", 6);
    assert_int_equal(tok_token_bytes(t, TSPM_BYTE0 + 0x41, 0, buf, sizeof buf), 1);
    assert_int_equal(buf[0], 'A');
    tok_destroy(t);
}

static const char *render(const struct tok *t, const struct tok_chat_msg *m, size_t n, int gen)
{
    static char keep[4096];
    char *s = NULL;
    assert_int_equal(tok_chat_apply(t, m, n, gen, &s), 0);
    snprintf(keep, sizeof keep, "%s", s);
    free(s);
    return keep;
}

static const struct tok_chat_msg conv[] = {
    {"system", "You are helpful."},
    {"user", " Hi! "},
    {"assistant", "Hello."},
    {"user", "Bye"},
};

/* the real llama 3 template (abridged to what detection looks at) */
static const char llama3_tmpl[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char qwen2_tmpl[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char llama2_tmpl[] =
    "{% if messages[0]['role'] == 'system' %}...{{ bos_token + '[INST] ' + content.strip() + "
    "' [/INST]' }}...";

static void test_chat_llama3(void **state)
{
    (void)state;
    struct tok *t = bpe("llama-bpe", "llama", llama3_tmpl);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_LLAMA3);
    assert_string_equal(tok_chat_kind_name(TOK_CHAT_LLAMA3), "llama3");
    assert_string_equal(render(t, conv, 4, 1),
                        "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    assert_string_equal(render(t, conv + 3, 1, 0),
                        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>");
    /* the rendered text encodes to the control tokens */
    const char *s = render(t, conv + 3, 1, 0);
    int32_t ids[64];
    size_t n;
    assert_int_equal(tok_encode(t, s, strlen(s), 1, 1, ids, 64, &n), 0);
    assert_int_equal(ids[0], TBPE_BOT);
    assert_int_equal(ids[1], TBPE_SHI);
    assert_int_equal(ids[n - 1], TBPE_EOTID);
    tok_destroy(t);
    /* no template: architecture llama with <|eot_id|> means llama 3 */
    t = bpe("llama-bpe", "llama", NULL);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_LLAMA3);
    tok_destroy(t);
}

static void test_chat_chatml(void **state)
{
    (void)state;
    struct tok *t = bpe("qwen2", "qwen2", qwen2_tmpl);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_CHATML);
    assert_string_equal(render(t, conv, 4, 1), "<|im_start|>system\nYou are helpful.<|im_end|>\n"
                                               "<|im_start|>user\n Hi! <|im_end|>\n"
                                               "<|im_start|>assistant\nHello.<|im_end|>\n"
                                               "<|im_start|>user\nBye<|im_end|>\n"
                                               "<|im_start|>assistant\n");
    /* qwen's template adds its default system message */
    assert_string_equal(render(t, conv + 3, 1, 1),
                        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    tok_destroy(t);
    /* by architecture: plain chatml, no default system */
    t = bpe("qwen2", "qwen2", NULL);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_CHATML);
    assert_string_equal(render(t, conv + 3, 1, 0), "<|im_start|>user\nBye<|im_end|>\n");
    tok_destroy(t);
    t = bpe("qwen2", "qwen3", NULL);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_CHATML);
    tok_destroy(t);
}

static void test_chat_llama2(void **state)
{
    (void)state;
    struct tok *t = spm(1, "llama", llama2_tmpl);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_LLAMA2);
    /* strip() applies to the whole first turn, system block included */
    assert_string_equal(render(t, conv, 4, 1),
                        "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\n Hi! [/INST] Hello. </s>"
                        "<s>[INST] Bye [/INST]");
    assert_string_equal(render(t, conv + 1, 1, 1), "[INST] Hi! [/INST]");
    tok_destroy(t);
}

static void test_chat_gemma(void **state)
{
    (void)state;
    /* gemma 3 files carry no template: the architecture picks the family */
    struct tok *t = spm(1, "gemma3", NULL);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_GEMMA);
    assert_string_equal(tok_chat_kind_name(TOK_CHAT_GEMMA), "gemma");
    /* the system message opens the first turn; contents are trimmed */
    assert_string_equal(render(t, conv, 4, 1), "<start_of_turn>user\nYou are helpful.\n\nHi!"
                                               "<end_of_turn>\n"
                                               "<start_of_turn>model\nHello.<end_of_turn>\n"
                                               "<start_of_turn>user\nBye<end_of_turn>\n"
                                               "<start_of_turn>model\n");
    assert_string_equal(render(t, conv + 1, 2, 0), "<start_of_turn>user\nHi!<end_of_turn>\n"
                                                   "<start_of_turn>model\nHello.<end_of_turn>\n");
    tok_destroy(t);
    t = spm(1, "llama", "{% for m in messages %}<start_of_turn>{{ m.role }}{% endfor %}");
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_GEMMA);
    tok_destroy(t);
}

static void test_chat_fallback(void **state)
{
    (void)state;
    struct tok *t = spm(1, "llama", NULL); /* llama without <|eot_id|>: no default */
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_FALLBACK);
    assert_string_equal(tok_chat_kind_name(TOK_CHAT_FALLBACK), "fallback");
    assert_string_equal(render(t, conv, 2, 1),
                        "system: You are helpful.\n\nuser:  Hi! \n\nassistant:");
    assert_string_equal(render(t, NULL, 0, 0), "");
    tok_destroy(t);
    t = bpe(NULL, "gpt2", "{{ messages }}");
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_FALLBACK);
    tok_destroy(t);
}

static void test_chat_jinja(void **state)
{
    (void)state;
    char err[256];
    char *s = NULL;
    /* the file's template renders, not the family's */
    static const char own[] = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                              "{% endfor %}{% if add_generation_prompt %}>{% endif %}"
                              "{{ eos_token }}";
    struct tok *t = bpe("llama-bpe", "llama", own);
    assert_int_equal(tok_chat_kind(t), TOK_CHAT_LLAMA3); /* the fallback family */
    assert_true(tok_chat_has_template(t));
    /* llama 3 adds bos when encoding: the template's leading one is dropped */
    assert_string_equal(render(t, conv + 2, 2, 1), "<assistant>Hello.<user>Bye><|end_of_text|>");
    int32_t ids[64];
    size_t n;
    const char *r = render(t, conv + 3, 1, 0);
    assert_int_equal(tok_encode(t, r, strlen(r), 1, 1, ids, 64, &n), 0);
    assert_int_equal(ids[0], TBPE_BOT);
    for (size_t i = 1; i < n; i++)
        assert_int_not_equal(ids[i], TBPE_BOT);
    assert_int_equal(ids[n - 1], TBPE_EOT);

    /* raise_exception comes back with its message */
    static const char refuse[] = "{% if messages[0].role == 'system' %}"
                                 "{{ raise_exception('System role not supported') }}{% endif %}ok";
    assert_int_equal(
        tok_chat_set_template(t, refuse, strlen(refuse), "refuse.jinja", err, sizeof err), 0);
    assert_string_equal(render(t, conv + 1, 1, 1), "ok");
    assert_int_equal(tok_chat_render(t, conv, 1, 1, &s, err, sizeof err), RKV_EFORMAT);
    assert_null(s);
    assert_non_null(strstr(err, "System role not supported"));

    /* a file that does not parse names the line and column; the template stays */
    static const char bad[] = "{% for m in messages %}\n{{ m | frobnicate }}{% endfor %}";
    assert_int_not_equal(tok_chat_set_template(t, bad, strlen(bad), "bad.jinja", err, sizeof err),
                         0);
    assert_non_null(strstr(err, "bad.jinja line 2, column"));
    assert_string_equal(render(t, conv + 1, 1, 1), "ok");
    tok_destroy(t);

    /* a model that adds no bos keeps the template's */
    t = bpe("qwen2", "qwen2", own);
    assert_int_equal(tok_add_bos(t), 0);
    assert_string_equal(render(t, conv + 3, 1, 0), "<|begin_of_text|><user>Bye<|end_of_text|>");
    tok_destroy(t);

    /* a template that does not parse leaves the family */
    t = spm(1, "llama", llama2_tmpl);
    assert_false(tok_chat_has_template(t));
    tok_destroy(t);
}

static void test_load_errors(void **state)
{
    (void)state;
    struct tgg b;
    struct tok *t = (struct tok *)1;
    char err[256];
    tgg_init(&b);
    tgg_str(&b, "general.architecture", "llama");
    tgg_finish(&b);
    assert_int_equal(load_image(&b, &t, err, sizeof err), RKV_ENOTFOUND);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer.ggml.model"));

    tgg_init(&b);
    tgg_str(&b, "tokenizer.ggml.model", "bert");
    tgg_finish(&b);
    assert_int_equal(load_image(&b, &t, err, sizeof err), RKV_EUNSUPPORTED);
    assert_non_null(strstr(err, "\"bert\""));

    char *toks[] = {"a", "b"};
    tgg_init(&b);
    tgg_str(&b, "tokenizer.ggml.model", "llama");
    tgg_arr_str(&b, "tokenizer.ggml.tokens", toks, 2);
    tgg_u32(&b, "tokenizer.ggml.bos_token_id", 5);
    tgg_finish(&b);
    assert_int_equal(load_image(&b, &t, err, sizeof err), RKV_ERANGE);
    assert_non_null(strstr(err, "tokenizer.ggml.bos_token_id"));

    tgg_init(&b);
    tgg_str(&b, "tokenizer.ggml.model", "gpt2");
    tgg_arr_str(&b, "tokenizer.ggml.tokens", toks, 2);
    tgg_finish(&b);
    assert_int_equal(load_image(&b, &t, err, sizeof err), RKV_ENOTFOUND);
    assert_non_null(strstr(err, "tokenizer.ggml.merges"));
}

int main(void)
{
    rkv_log_init("tok_test", RKV_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_encode),    cmocka_unit_test(test_bpe_words),
        cmocka_unit_test(test_bpe_too_small), cmocka_unit_test(test_bpe_roundtrip),
        cmocka_unit_test(test_bpe_special),   cmocka_unit_test(test_eog),
        cmocka_unit_test(test_spm_encode),    cmocka_unit_test(test_detok_utf8),
        cmocka_unit_test(test_detok_spm),     cmocka_unit_test(test_chat_llama3),
        cmocka_unit_test(test_chat_chatml),   cmocka_unit_test(test_chat_llama2),
        cmocka_unit_test(test_chat_gemma),    cmocka_unit_test(test_chat_fallback),
        cmocka_unit_test(test_chat_jinja),    cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
