/* tok_bpe.c - byte-level BPE: gpt-2 byte mapping, pcre2 pre-tokenizer regexes, ranked merges. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include "common/err.h"
#include "common/log.h"
#include "common/tok_int.h"

/* pre-tokenizer regexes as the models' tokenizer.json spell them: pcre2 has
 * the unicode classes (\p{Lu}, \p{M}) that llama.cpp's own regex engine lacks
 * and rewrites around, so the originals run as hf tokenizers runs them */
#define RE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define RE_GPT2         "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* tekken and o200k: a word is caps then lower case (CamelCase splits) */
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER             \
    "+" RE_LOWER "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTRACTIONS                             \
    "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER "*" RE_CONTRACTIONS                           \
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* deepseek's cased letters of many scripts (unicode's LC), its ascii and
 * fullwidth punctuation, and cjk/hangul runs */
#define RE_DEEPSEEK_LETTERS                                                                        \
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"            \
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"         \
    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}" \
    "\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}"  \
    "\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}"                 \
    "\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}"                 \
    "\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}"         \
    "\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}"        \
    "\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}"                 \
    "\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}"                   \
    "\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}"         \
    "\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}"                  \
    "\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}"                 \
    "\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}"                 \
    "\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}"           \
    "\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+"
#define RE_DEEPSEEK_PUNCT                                                                          \
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+"
#define RE_DEEPSEEK_CJK "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"

/* one pre-tokenizer: its regexes run in order, each splitting every piece
 * the one before left (hf's Sequence of Split "isolated", Digits and
 * ByteLevel's own regex) */
struct bpe_pre {
    const char *name; /* what tok_pre_name reports */
    const char *re[TOK_PRE_MAX_RE];
};

static const struct bpe_pre pres[] = {
    {"gpt2", {RE_GPT2}},
    {"llama3", {RE_LLAMA3}},
    {"qwen2", {RE_QWEN2}},
    {"tekken", {RE_TEKKEN}},
    {"gpt-4o", {RE_GPT4O}},
    /* Digits(individual) then gpt-2's ByteLevel regex */
    {"smollm", {"\\p{N}", RE_GPT2}},
    {"deepseek-llm",
     {"[\\r\\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"}},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}},
};

/* tokenizer.ggml.pre values (as llama.cpp's converter writes them) and the
 * pre-tokenizer each names */
static const struct {
    const char *value;
    const char *pre;
    int ignore_merges; /* the tokenizer.json sets ignore_merges */
} pre_names[] = {
    {"default", "gpt2", 0},
    {"gpt2", "gpt2", 0},
    {"llama-bpe", "llama3", 1},
    {"llama3", "llama3", 1},
    {"llama-v3", "llama3", 1},
    {"falcon3", "llama3", 1},
    {"pixtral", "llama3", 1},
    {"smaug-bpe", "llama3", 0},
    {"dbrx", "llama3", 0},
    {"qwen2", "qwen2", 0},
    {"deepseek-r1-qwen", "qwen2", 0},
    {"stablelm2", "qwen2", 0},
    {"tekken", "tekken", 1},
    {"gpt-4o", "gpt-4o", 0},
    {"smollm", "smollm", 0},
    {"starcoder", "smollm", 0},
    {"refact", "smollm", 0},
    {"codeshell", "smollm", 0},
    {"deepseek-llm", "deepseek-llm", 0},
    {"deepseek-coder", "deepseek-coder", 0},
    {"minerva-7b", "smollm", 0},
};

/* gpt-2's bytes_to_unicode: printable latin-1 bytes stand for themselves, the
 * other 68 map in order to U+0100.. */
static uint32_t byte_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33 + (b - 127u);
    return 256u + 67; /* 173, the soft hyphen */
}

size_t tok_bpe_byte_char(uint8_t b, char out[2])
{
    uint32_t cp = byte_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

int tok_bpe_char_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_cp((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 67)
        return (int)(cp - 256 - 33 + 127);
    if (cp == 256 + 67)
        return 173;
    return -1;
}

static int compile(struct tok *t, const char *pattern, void **out, char *errbuf, size_t errlen)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "tokenizer: pcre2 cannot compile the %s regex: %s",
                     t->pre_name, (const char *)msg);
        return RKV_EINTERNAL;
    }
    /* jit is optional: the interpreter gives the same matches, slower. Under valgrind the
     * interpreter: memcheck cannot see what the jit's generated code initializes and reports
     * its reads (the valgrind client request, where the headers are installed) */
    if (RUNNING_ON_VALGRIND)
        log_debug("tokenizer: under valgrind, pcre2's interpreter");
    else if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) != 0)
        log_debug("tokenizer: pcre2 jit unavailable, using the interpreter");
    *out = re;
    return 0;
}

int tok_bpe_init(struct tok *t, const char *pre, char *errbuf, size_t errlen)
{
    size_t n_names = sizeof pre_names / sizeof pre_names[0];
    size_t i = 0;
    if (!pre[0])
        pre = "default"; /* files older than the key: gpt-2's regex, as llama.cpp */
    while (i < n_names && strcmp(pre_names[i].value, pre))
        i++;
    if (i == n_names) {
        /* a wrong regex gives wrong ids without any other sign: refuse */
        size_t k = 0;
        if (errbuf && errlen)
            k = (size_t)snprintf(
                errbuf, errlen, "tokenizer.ggml.pre '%s' is not supported by rkv (supported:", pre);
        for (size_t j = 0; j < n_names && errbuf && k < errlen; j++)
            k +=
                (size_t)snprintf(errbuf + k, errlen - k, "%s %s", j ? "," : "", pre_names[j].value);
        if (errbuf && k < errlen)
            snprintf(errbuf + k, errlen - k, ")");
        return RKV_EUNSUPPORTED;
    }
    const struct bpe_pre *p = pres;
    while (strcmp(p->name, pre_names[i].pre))
        p++;
    t->pre_name = p->name;
    t->ignore_merges = pre_names[i].ignore_merges;
    for (int k = 0; k < TOK_PRE_MAX_RE && p->re[k]; k++) {
        int rc = compile(t, p->re[k], &t->re[k], errbuf, errlen);
        if (rc < 0)
            return rc;
        t->n_re = k + 1;
    }
    return 0;
}

const char *tok_pre_name(const struct tok *t)
{
    return t->model == TOK_MODEL_BPE ? t->pre_name : "spm";
}

void tok_bpe_fini(struct tok *t)
{
    for (int k = 0; k < t->n_re; k++)
        pcre2_code_free(t->re[k]);
    t->n_re = 0;
}

static uint64_t merge_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key;
}

int tok_bpe_add_merge(struct tok *t, int32_t left, int32_t right, int32_t rank, int32_t result)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    size_t i = merge_hash(key) & t->merge_mask;
    while (t->merges[i].key) {
        if (t->merges[i].key == key)
            return RKV_EINVAL; /* a repeated pair keeps its first (best) rank */
        i = (i + 1) & t->merge_mask;
    }
    t->merges[i] = (struct tok_merge_slot){.key = key, .rank = rank, .result = result};
    return 0;
}

static const struct tok_merge_slot *merge_find(const struct tok *t, int32_t left, int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    size_t i = merge_hash(key) & t->merge_mask;
    while (t->merges[i].key) {
        if (t->merges[i].key == key)
            return &t->merges[i];
        i = (i + 1) & t->merge_mask;
    }
    return NULL;
}

static int bpe_pair(const struct tok_enc *e, const struct tok_sym *l, const struct tok_sym *r,
                    double *key, int32_t *id)
{
    if (l->id < 0 || r->id < 0)
        return 0;
    const struct tok_merge_slot *m = merge_find(e->t, l->id, r->id);
    if (!m)
        return 0;
    *key = m->rank;
    *id = m->result;
    return 1;
}

/* one pre-tokenized word: bytes -> byte-level symbols -> merges */
static int bpe_word(struct tok_enc *e, const uint8_t *s, size_t n)
{
    const struct tok *t = e->t;
    int rc;
    if (n == 0)
        return 0;
    if (t->ignore_merges && n > 1) {
        if ((rc = tok_enc_grow((void **)&e->buf, &e->buf_cap, 2 * n, 1)) < 0)
            return rc;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += tok_bpe_byte_char(s[i], e->buf + m);
        int32_t id = tok_find(t, e->buf, m);
        if (id >= 0) {
            tok_enc_push(e, id);
            return 0;
        }
    }
    if (n > INT32_MAX / 2)
        return RKV_ETOOBIG;
    if ((rc = tok_enc_grow(&e->sym, &e->sym_cap, n, sizeof(struct tok_sym))) < 0)
        return rc;
    struct tok_sym *sym = e->sym;
    for (size_t i = 0; i < n; i++)
        sym[i] = (struct tok_sym){.id = t->byte_tok[s[i]],
                                  .prev = (int32_t)i - 1,
                                  .next = i + 1 < n ? (int32_t)i + 1 : -1,
                                  .start = (uint32_t)i,
                                  .len = 1};
    if ((rc = tok_merge_run(e, n, bpe_pair)) < 0)
        return rc;
    sym = e->sym;
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0)
            tok_enc_push(e, sym[i].id);
        else if (t->unk >= 0)
            tok_enc_push(e, t->unk); /* a byte the vocabulary lacks */
    }
    return 0;
}

/* the next match of re in s[off..n): 1 with [*ms, *me), 0 for none, or an error */
static int next_match(struct tok_enc *e, const pcre2_code *re, const uint8_t *s, size_t n,
                      size_t off, size_t *ms, size_t *me)
{
    for (;;) {
        int m = pcre2_match(re, s, n, off, 0, e->md, e->mctx);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && !e->jstack) {
            e->jstack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, NULL);
            e->mctx = pcre2_match_context_create(NULL);
            if (!e->jstack || !e->mctx)
                return RKV_ENOMEM;
            pcre2_jit_stack_assign(e->mctx, NULL, e->jstack);
            continue;
        }
        if (m == PCRE2_ERROR_NOMATCH)
            return 0;
        if (m < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(m, msg, sizeof msg);
            log_error("tokenizer: pcre2 match failed at byte %zu: %s", off, (const char *)msg);
            return RKV_EINTERNAL;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        *ms = ov[0];
        *me = ov[1];
        return 1;
    }
}

/* splits s with regex k; every match is a piece, and so is any text between
 * matches (bytes that are not valid utf-8 match nothing), as hf's Split with
 * "isolated". each piece goes to regex k + 1, after the last to the merges.
 * a piece is its own subject, so anchors and lookarounds stop at its ends */
static int bpe_split(struct tok_enc *e, int k, const uint8_t *s, size_t len)
{
    const struct tok *t = e->t;
    if (k == t->n_re)
        return bpe_word(e, s, len);
    size_t off = 0, gap = 0, ms, me;
    int rc;
    while (off < len && (rc = next_match(e, t->re[k], s, len, off, &ms, &me)) != 0) {
        if (rc < 0)
            return rc;
        if (me <= ms) {
            off = ms + 1; /* an empty match (none of the regexes make one) */
            continue;
        }
        if (ms > gap && (rc = bpe_split(e, k + 1, s + gap, ms - gap)) < 0)
            return rc;
        if ((rc = bpe_split(e, k + 1, s + ms, me - ms)) < 0)
            return rc;
        gap = off = me;
    }
    if (gap < len && (rc = bpe_split(e, k + 1, s + gap, len - gap)) < 0)
        return rc;
    return 0;
}

int tok_bpe_encode(struct tok_enc *e, const char *text, size_t len)
{
    if (!e->md && !(e->md = pcre2_match_data_create(1, NULL)))
        return RKV_ENOMEM;
    return bpe_split(e, 0, (const uint8_t *)text, len);
}

void tok_bpe_enc_fini(struct tok_enc *e)
{
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jstack);
    e->md = e->mctx = e->jstack = NULL;
}
