/* tok_bpe.c - byte-level BPE: gpt-2 byte mapping, pcre2 pre-tokenizer regexes, ranked merges. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/tok_int.h"

/* pre-tokenizer regexes exactly as the models' tokenizer.json spell them */
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                               " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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

int tok_bpe_init(struct tok *t, const char *pre, char *errbuf, size_t errlen)
{
    const char *pattern = re_gpt2;
    t->pre_name = "gpt2";
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3") ||
        !strcmp(pre, "smaug-bpe") || !strcmp(pre, "falcon3")) {
        pattern = re_llama3;
        t->pre_name = "llama3";
        t->ignore_merges = 1; /* llama 3's tokenizer.json sets ignore_merges */
    } else if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen")) {
        pattern = re_qwen2;
        t->pre_name = "qwen2";
    } else if (pre[0] && strcmp(pre, "default") && strcmp(pre, "gpt2")) {
        log_warn("tokenizer.ggml.pre = \"%s\" is not known to rkv; splitting words with GPT-2's "
                 "regex, so token ids may differ from the model's own tokenizer",
                 pre);
    }
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
    /* jit is optional: the interpreter gives the same matches, slower */
    if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) != 0)
        log_debug("tokenizer: pcre2 jit unavailable, using the interpreter");
    t->re = re;
    return 0;
}

void tok_bpe_fini(struct tok *t)
{
    pcre2_code_free(t->re);
    t->re = NULL;
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

int tok_bpe_encode(struct tok_enc *e, const char *text, size_t len)
{
    const struct tok *t = e->t;
    const uint8_t *s = (const uint8_t *)text;
    pcre2_match_data *md = e->md;
    if (!md && !(md = e->md = pcre2_match_data_create(1, NULL)))
        return RKV_ENOMEM;
    size_t off = 0, gap = 0;
    int rc;
    /* every match is a word, and so is any text between matches (bytes that
     * are not valid utf-8 match nothing): as HF's Split with "isolated" */
    while (off < len) {
        int m = pcre2_match(t->re, s, len, off, 0, md, e->mctx);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && !e->jstack) {
            e->jstack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, NULL);
            e->mctx = pcre2_match_context_create(NULL);
            if (!e->jstack || !e->mctx)
                return RKV_ENOMEM;
            pcre2_jit_stack_assign(e->mctx, NULL, e->jstack);
            continue;
        }
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(m, msg, sizeof msg);
            log_error("tokenizer: pcre2 match failed at byte %zu: %s", off, (const char *)msg);
            return RKV_EINTERNAL;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] <= ov[0]) {
            off = ov[0] + 1; /* an empty match (none of the regexes make one) */
            continue;
        }
        if (ov[0] > gap && (rc = bpe_word(e, s + gap, ov[0] - gap)) < 0)
            return rc;
        if ((rc = bpe_word(e, s + ov[0], ov[1] - ov[0])) < 0)
            return rc;
        gap = off = ov[1];
    }
    if (gap < len && (rc = bpe_word(e, s + gap, len - gap)) < 0)
        return rc;
    return 0;
}

void tok_bpe_enc_fini(struct tok_enc *e)
{
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jstack);
    e->md = e->mctx = e->jstack = NULL;
}
