/* tok.c - tokenizer: vocabulary from GGUF, special tokens, encode dispatch, decode, detok. */
#include "common/tok.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jinja.h"
#include "common/log.h"
#include "common/tok_int.h"

/* control tokens that end a turn even when eos/eot ids name others */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>",
    "</s>",       "<|eom_id|>", "<end_of_turn>",   "<|end|>",
};

static int fail(char *errbuf, size_t errlen, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *errbuf, size_t errlen, int err, const char *fmt, ...)
{
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return err;
}

static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* fnv-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

int32_t tok_find(const struct tok *t, const char *s, size_t len)
{
    size_t i = hash_bytes(s, len) & t->map_mask;
    for (;;) {
        int32_t id = t->map[i];
        if (id < 0)
            return -1;
        if (t->ent[id].text_len == len && memcmp(tok_text(t, id), s, len) == 0)
            return id;
        i = (i + 1) & t->map_mask;
    }
}

static int map_build(struct tok *t)
{
    t->map_mask = pow2_at_least((size_t)t->n_vocab * 2) - 1;
    t->map = malloc((t->map_mask + 1) * sizeof *t->map);
    if (!t->map)
        return RKV_ENOMEM;
    memset(t->map, 0xff, (t->map_mask + 1) * sizeof *t->map);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = tok_text(t, id);
        size_t len = t->ent[id].text_len;
        if (tok_find(t, s, len) >= 0)
            continue; /* duplicate text: the first id wins */
        size_t i = hash_bytes(s, len) & t->map_mask;
        while (t->map[i] >= 0)
            i = (i + 1) & t->map_mask;
        t->map[i] = id;
    }
    return 0;
}

/* --- utf-8 ------------------------------------------------------------------ */

enum tok_utf8 tok_utf8_scan(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t b = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b < 0x80) {
        *len = 1;
        return TOK_UTF8_OK;
    }
    if (b < 0xc2 || b > 0xf4) {
        *len = 1;
        return TOK_UTF8_BAD;
    }
    if (b < 0xe0) {
        need = 2;
    } else if (b < 0xf0) {
        need = 3;
        lo = b == 0xe0 ? 0xa0 : 0x80; /* no overlongs */
        hi = b == 0xed ? 0x9f : 0xbf; /* no surrogates */
    } else {
        need = 4;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf; /* <= U+10FFFF */
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            *len = k;
            return TOK_UTF8_SHORT;
        }
        uint8_t c = s[k];
        if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) {
            *len = k;
            return TOK_UTF8_BAD;
        }
    }
    *len = need;
    return TOK_UTF8_OK;
}

uint32_t tok_utf8_decode(const uint8_t *s, size_t len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    case 3: return (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
               (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
    }
}

/* --- loading ---------------------------------------------------------------- */

static int get_opt_id(const struct gguf_ctx *g, const char *key, int32_t n_vocab, int32_t *out,
                      char *errbuf, size_t errlen)
{
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == RKV_ENOTFOUND)
        return 0;
    if (rc < 0) {
        int64_t sv;
        /* some converters store -1 for "none" */
        if (gguf_get_i64(g, key, &sv) == 0 && sv < 0) {
            *out = -1;
            return 0;
        }
        return fail(errbuf, errlen, RKV_EFORMAT, "%s: expected an unsigned integer token id", key);
    }
    if (v >= (uint32_t)n_vocab)
        return fail(errbuf, errlen, RKV_ERANGE,
                    "%s = %u is outside the vocabulary (%d tokens); fix the id or drop the key",
                    key, v, n_vocab);
    *out = (int32_t)v;
    return 0;
}

/* a required array of strings: its length, or an error naming the key */
static int str_array(const struct gguf_ctx *g, const char *key, const char *why_needed, uint64_t *n,
                     char *errbuf, size_t errlen)
{
    enum gguf_value_type et;
    int rc = gguf_get_arr_info(g, key, &et, n);
    if (rc == RKV_ENOTFOUND)
        return fail(errbuf, errlen, rc, "%s is missing: %s", key, why_needed);
    if (rc < 0 || et != GGUF_VAL_STRING)
        return fail(errbuf, errlen, RKV_EFORMAT, "%s: expected an array of strings", key);
    return 0;
}

static int load_tokens(struct tok *t, const struct gguf_ctx *g, char *errbuf, size_t errlen)
{
    const char *key = "tokenizer.ggml.tokens";
    enum gguf_value_type et;
    uint64_t n;
    int rc = str_array(g, key, "the model has no vocabulary", &n, errbuf, errlen);
    if (rc < 0)
        return rc;
    if (n == 0 || n > (1u << 24))
        return fail(errbuf, errlen, RKV_ERANGE, "%s: %llu tokens (rkv takes 1 to 16M)", key,
                    (unsigned long long)n);
    t->n_vocab = (int32_t)n;
    t->ent = calloc(n, sizeof *t->ent);
    if (!t->ent)
        return RKV_ENOMEM;
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        if (gguf_get_arr_str(g, key, i, &s) < 0)
            return fail(errbuf, errlen, RKV_EFORMAT, "%s[%llu] is unreadable", key,
                        (unsigned long long)i);
        total += s.len + 1;
    }
    if (total > UINT32_MAX / 2)
        return fail(errbuf, errlen, RKV_ETOOBIG, "%s: token texts are too large", key);
    t->text = malloc(total);
    if (!t->text)
        return RKV_ENOMEM;
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        gguf_get_arr_str(g, key, i, &s);
        memcpy(t->text + off, s.ptr, s.len);
        t->text[off + s.len] = 0;
        t->ent[i].text_off = off;
        t->ent[i].text_len = (uint32_t)s.len;
        t->ent[i].type = TOK_TYPE_NORMAL;
        off += (uint32_t)s.len + 1;
    }

    key = "tokenizer.ggml.token_type";
    rc = gguf_get_arr_info(g, key, &et, &n);
    if (rc == 0) {
        if (n != (uint64_t)t->n_vocab)
            return fail(errbuf, errlen, RKV_EFORMAT, "%s has %llu entries, tokens has %d", key,
                        (unsigned long long)n, t->n_vocab);
        for (uint64_t i = 0; i < n; i++) {
            int64_t v;
            if (gguf_get_arr_i64(g, key, i, &v) < 0 || v < 0 || v > 6)
                return fail(errbuf, errlen, RKV_EFORMAT, "%s[%llu]: expected a token type 0..6",
                            key, (unsigned long long)i);
            t->ent[i].type = (uint8_t)v;
        }
    }
    key = "tokenizer.ggml.scores";
    rc = gguf_get_arr_info(g, key, &et, &n);
    if (rc == 0) {
        if (n != (uint64_t)t->n_vocab)
            return fail(errbuf, errlen, RKV_EFORMAT, "%s has %llu entries, tokens has %d", key,
                        (unsigned long long)n, t->n_vocab);
        for (uint64_t i = 0; i < n; i++)
            if (gguf_get_arr_f32(g, key, i, &t->ent[i].score) < 0)
                return fail(errbuf, errlen, RKV_EFORMAT, "%s[%llu]: expected a number", key,
                            (unsigned long long)i);
    }
    return 0;
}

static int load_merges(struct tok *t, const struct gguf_ctx *g, char *errbuf, size_t errlen)
{
    const char *key = "tokenizer.ggml.merges";
    uint64_t n;
    int rc = str_array(g, key, "byte-level BPE (tokenizer.ggml.model = gpt2) needs it", &n, errbuf,
                       errlen);
    if (rc < 0)
        return rc;
    if (n > (1u << 26))
        return fail(errbuf, errlen, RKV_ERANGE, "%s: too many merges (%llu)", key,
                    (unsigned long long)n);
    t->merge_mask = pow2_at_least(n * 2 + 1) - 1;
    t->merges = calloc(t->merge_mask + 1, sizeof *t->merges);
    if (!t->merges)
        return RKV_ENOMEM;
    char stackbuf[512];
    size_t skipped = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        if (gguf_get_arr_str(g, key, i, &s) < 0)
            return fail(errbuf, errlen, RKV_EFORMAT, "%s[%llu] is unreadable", key,
                        (unsigned long long)i);
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            skipped++;
            continue;
        }
        size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
        int32_t l = tok_find(t, s.ptr, ll), r = tok_find(t, sp + 1, rl), res = -1;
        if (l >= 0 && r >= 0 && ll + rl <= sizeof stackbuf) {
            memcpy(stackbuf, s.ptr, ll);
            memcpy(stackbuf + ll, sp + 1, rl);
            res = tok_find(t, stackbuf, ll + rl);
        }
        /* a merge whose parts or result are not tokens can never fire */
        if (res < 0 || tok_bpe_add_merge(t, l, r, (int32_t)i, res) != 0)
            skipped++;
    }
    if (skipped)
        log_debug("tokenizer: %zu of %llu merges name tokens not in the vocabulary", skipped,
                  (unsigned long long)n);
    return 0;
}

/* decoded bytes of every token: what tok_token_bytes returns without render_special */
static int build_pieces(struct tok *t)
{
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += t->ent[i].text_len + 3;
    t->pieces = malloc(total + 1);
    if (!t->pieces)
        return RKV_ENOMEM;
    uint32_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        struct tok_entry *e = &t->ent[id];
        const uint8_t *s = (const uint8_t *)tok_text(t, id);
        char *o = t->pieces + off;
        size_t n = 0;
        switch (e->type) {
        case TOK_TYPE_CONTROL:
        case TOK_TYPE_UNUSED: break;
        case TOK_TYPE_USER:
            memcpy(o, s, e->text_len);
            n = e->text_len;
            break;
        case TOK_TYPE_UNKNOWN:
            if (t->model == TOK_MODEL_SPM) {
                memcpy(o, "\xef\xbf\xbd", 3);
                n = 3;
                break;
            }
            /* bpe vocabularies mark odd tokens unknown: decode them as text */
            /* fall through */
        default:
            if (t->model == TOK_MODEL_SPM && e->type == TOK_TYPE_BYTE && e->text_len == 6 &&
                memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
                unsigned v;
                if (sscanf((const char *)s + 3, "%2x", &v) == 1) {
                    o[n++] = (char)v;
                    break;
                }
            }
            for (size_t i = 0; i < e->text_len;) {
                size_t cl;
                enum tok_utf8 u = tok_utf8_scan(s + i, e->text_len - i, &cl);
                if (u == TOK_UTF8_OK && t->model == TOK_MODEL_BPE) {
                    int b = tok_bpe_char_byte(tok_utf8_decode(s + i, cl));
                    if (b >= 0) {
                        o[n++] = (char)b;
                        i += cl;
                        continue;
                    }
                } else if (u == TOK_UTF8_OK && cl == 3 && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    o[n++] = ' '; /* spm's U+2581 stands for a space */
                    i += cl;
                    continue;
                }
                memcpy(o + n, s + i, cl);
                n += cl;
                i += cl;
            }
        }
        e->piece_off = off;
        e->piece_len = (uint32_t)n;
        off += (uint32_t)n;
    }
    return 0;
}

static int special_allowed(const struct tok *t, int32_t id, int parse_special)
{
    return t->ent[id].type == TOK_TYPE_USER || parse_special;
}

static int trie_child(const struct tok *t, int32_t node, uint8_t b)
{
    for (int32_t c = t->trie[node].child; c >= 0; c = t->trie[c].sibling)
        if (t->trie[c].byte == b)
            return c;
    return -1;
}

static int build_trie(struct tok *t)
{
    size_t cap = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->ent[id].type;
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER || ty == TOK_TYPE_UNKNOWN)
            cap += t->ent[id].text_len;
    }
    t->trie = malloc(cap * sizeof *t->trie);
    if (!t->trie)
        return RKV_ENOMEM;
    t->trie[0] = (struct tok_trie_node){.child = -1, .sibling = -1, .id = -1};
    t->n_trie = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->ent[id].type;
        uint32_t len = t->ent[id].text_len;
        if (!(ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER || ty == TOK_TYPE_UNKNOWN) || !len)
            continue;
        const uint8_t *s = (const uint8_t *)tok_text(t, id);
        int32_t node = 0;
        for (uint32_t i = 0; i < len; i++) {
            int32_t c = trie_child(t, node, s[i]);
            if (c < 0) {
                c = t->n_trie++;
                t->trie[c] = (struct tok_trie_node){
                    .child = -1, .sibling = t->trie[node].child, .id = -1, .byte = s[i]};
                t->trie[node].child = c;
            }
            node = c;
        }
        if (t->trie[node].id < 0)
            t->trie[node].id = id;
        t->special_first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
    }
    return 0;
}

/* longest special token at s that parse_special allows; its length or 0 */
static size_t trie_match(const struct tok *t, const uint8_t *s, size_t n, int parse_special,
                         int32_t *id)
{
    size_t best = 0;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        node = trie_child(t, node, s[i]);
        if (node < 0)
            break;
        int32_t tid = t->trie[node].id;
        if (tid >= 0 && special_allowed(t, tid, parse_special)) {
            best = i + 1;
            *id = tid;
        }
    }
    return best;
}

static void mark_eog(struct tok *t)
{
    if (t->eos >= 0)
        t->ent[t->eos].flags |= TOK_F_EOG;
    if (t->eot >= 0)
        t->ent[t->eot].flags |= TOK_F_EOG;
    if (t->eom >= 0)
        t->ent[t->eom].flags |= TOK_F_EOG;
    for (size_t i = 0; i < sizeof eog_texts / sizeof *eog_texts; i++) {
        int32_t id = tok_find(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && t->ent[id].type == TOK_TYPE_CONTROL)
            t->ent[id].flags |= TOK_F_EOG;
    }
}

static int get_opt_bool(const struct gguf_ctx *g, const char *key, int *out, char *errbuf,
                        size_t errlen)
{
    int v, rc = gguf_get_bool(g, key, &v);
    if (rc == RKV_ENOTFOUND)
        return 0;
    if (rc < 0)
        return fail(errbuf, errlen, RKV_EFORMAT, "%s: expected a bool", key);
    *out = v;
    return 0;
}

static int load(struct tok *t, const struct gguf_ctx *g, char *errbuf, size_t errlen)
{
    struct gguf_str s;
    const char *key = "tokenizer.ggml.model";
    int rc = gguf_get_str(g, key, &s);
    if (rc == RKV_ENOTFOUND)
        return fail(errbuf, errlen, rc, "%s is missing: the model carries no tokenizer", key);
    if (rc < 0)
        return fail(errbuf, errlen, RKV_EFORMAT, "%s: expected a string", key);
    if (s.len == 5 && memcmp(s.ptr, "llama", 5) == 0)
        t->model = TOK_MODEL_SPM;
    else if (s.len == 4 && memcmp(s.ptr, "gpt2", 4) == 0)
        t->model = TOK_MODEL_BPE;
    else
        return fail(errbuf, errlen, RKV_EUNSUPPORTED,
                    "%s = \"%.*s\" is not supported (rkv reads \"llama\" (SentencePiece) and "
                    "\"gpt2\" (byte-level BPE))",
                    key, (int)(s.len > 64 ? 64 : s.len), s.ptr);

    if ((rc = load_tokens(t, g, errbuf, errlen)) < 0 || (rc = map_build(t)) < 0)
        return rc;

    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    if (t->model == TOK_MODEL_SPM) {
        /* llama.cpp's defaults for sentencepiece vocabularies */
        t->unk = 0 < t->n_vocab ? 0 : -1;
        t->bos = 1 < t->n_vocab ? 1 : -1;
        t->eos = 2 < t->n_vocab ? 2 : -1;
    }
    if ((rc = get_opt_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, errbuf, errlen)) <
            0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, errbuf, errlen)) <
            0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, errbuf, errlen)) <
            0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, errbuf, errlen)) <
            0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, errbuf,
                         errlen)) < 0)
        return rc;

    char pre[64] = "";
    if (t->model == TOK_MODEL_BPE) {
        key = "tokenizer.ggml.pre";
        rc = gguf_get_str(g, key, &s);
        if (rc == 0)
            snprintf(pre, sizeof pre, "%.*s", (int)(s.len > 63 ? 63 : s.len), s.ptr);
        else if (rc != RKV_ENOTFOUND)
            return fail(errbuf, errlen, RKV_EFORMAT, "%s: expected a string", key);
        if ((rc = tok_bpe_init(t, pre, errbuf, errlen)) < 0)
            return rc;
        if ((rc = load_merges(t, g, errbuf, errlen)) < 0)
            return rc;
        for (int b = 0; b < 256; b++) {
            char c[2];
            size_t n = tok_bpe_byte_char((uint8_t)b, c);
            t->byte_tok[b] = tok_find(t, c, n);
        }
        t->add_bos = t->ignore_merges; /* llama 3 wants bos; gpt-2 style models do not */
    } else {
        for (int b = 0; b < 256; b++) {
            char c[8];
            snprintf(c, sizeof c, "<0x%02X>", b);
            t->byte_tok[b] = tok_find(t, c, 6);
        }
        t->add_bos = 1;
        t->add_space_prefix = 1;
    }
    if ((rc = get_opt_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, errbuf, errlen)) < 0 ||
        (rc = get_opt_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, errbuf,
                           errlen)) < 0)
        return rc;
    if (t->bos < 0)
        t->add_bos = 0;

    if ((rc = build_pieces(t)) < 0 || (rc = build_trie(t)) < 0)
        return rc;
    mark_eog(t);

    if (gguf_get_str(g, "general.architecture", &s) == 0) {
        t->arch = strndup(s.ptr, s.len);
        if (!t->arch)
            return RKV_ENOMEM;
    }
    const char *tmpl = NULL;
    size_t tmpl_len = 0;
    if (gguf_get_str(g, "tokenizer.chat_template", &s) == 0) {
        tmpl = s.ptr;
        tmpl_len = s.len;
    }
    return tok_chat_detect(t, tmpl, tmpl_len);
}

int tok_load_gguf(const struct gguf_ctx *g, struct tok **out, char *errbuf, size_t errlen)
{
    if (!g || !out)
        return RKV_EINVAL;
    *out = NULL;
    if (errbuf && errlen)
        errbuf[0] = 0;
    struct tok *t = calloc(1, sizeof *t);
    if (!t)
        return RKV_ENOMEM;
    int rc = load(t, g, errbuf, errlen);
    if (rc < 0) {
        if (errbuf && errlen && !errbuf[0])
            fail(errbuf, errlen, rc, "tokenizer: %s", rkv_strerror(rc));
        tok_destroy(t);
        return rc;
    }
    log_debug("tokenizer: %s, %d tokens, bos %d eos %d eot %d",
              t->model == TOK_MODEL_SPM ? "spm" : t->pre_name, t->n_vocab, t->bos, t->eos, t->eot);
    *out = t;
    return 0;
}

void tok_destroy(struct tok *t)
{
    if (!t)
        return;
    tok_bpe_fini(t);
    free(t->ent);
    free(t->text);
    free(t->pieces);
    free(t->map);
    free(t->merges);
    free(t->trie);
    free(t->chat_default_system);
    jinja_destroy(t->chat_tmpl);
    free(t->chat_src);
    free(t->arch);
    free(t);
}

int32_t tok_n_vocab(const struct tok *t)
{
    return t->n_vocab;
}
int32_t tok_bos(const struct tok *t)
{
    return t->bos;
}
int32_t tok_eos(const struct tok *t)
{
    return t->eos;
}
int tok_add_bos(const struct tok *t)
{
    return t->add_bos;
}
int tok_is_eog(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->ent[id].flags & TOK_F_EOG);
}
int tok_is_control(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->ent[id].type == TOK_TYPE_CONTROL;
}

/* --- encode ------------------------------------------------------------------- */

int tok_enc_grow(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return RKV_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static void encode_raw(struct tok_enc *e, const char *s, size_t len)
{
    if (!len || e->err)
        return;
    int rc = e->t->model == TOK_MODEL_BPE ? tok_bpe_encode(e, s, len) : tok_spm_encode(e, s, len);
    if (rc < 0)
        e->err = rc;
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, size_t cap, size_t *n)
{
    if (!t || (!text && len) || (!ids && cap) || !n)
        return RKV_EINVAL;
    struct tok_enc e = {.t = t, .ids = ids, .cap = cap};
    if (add_bos && t->add_bos && t->bos >= 0)
        tok_enc_push(&e, t->bos);
    /* split at special tokens (leftmost, longest); the text between them is
     * tokenized on its own, as llama.cpp and HF tokenizers do */
    const uint8_t *s = (const uint8_t *)text;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t m;
        if ((t->special_first[s[i] >> 3] & (1u << (s[i] & 7))) &&
            (m = trie_match(t, s + i, len - i, parse_special, &id)) > 0) {
            encode_raw(&e, text + seg, i - seg);
            tok_enc_push(&e, id);
            i += m;
            seg = i;
            continue;
        }
        i++;
    }
    encode_raw(&e, text + seg, len - seg);
    tok_enc_fini(&e);
    *n = e.n;
    if (e.err)
        return e.err;
    return e.n > cap ? RKV_ETOOBIG : 0;
}

/* --- the merge loop both models share ----------------------------------------- */

static int cand_less(const struct tok_cand *a, const struct tok_cand *b)
{
    return a->key < b->key || (a->key == b->key && a->l < b->l);
}

static int heap_push(struct tok_enc *e, size_t *n, const struct tok_cand *c)
{
    if (tok_enc_grow(&e->heap, &e->heap_cap, *n + 1, sizeof *c) < 0)
        return RKV_ENOMEM;
    struct tok_cand *h = e->heap;
    size_t i = (*n)++;
    while (i > 0 && cand_less(c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = *c;
    return 0;
}

static struct tok_cand heap_pop(struct tok_enc *e, size_t *n)
{
    struct tok_cand *h = e->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c]))
            c++;
        if (!cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static int try_pair(struct tok_enc *e, size_t *hn, int32_t l, int32_t r, tok_pair_fn fn)
{
    struct tok_sym *sym = e->sym;
    if (l < 0 || r < 0)
        return 0;
    struct tok_cand c = {.l = l, .r = r, .size = sym[l].len + sym[r].len};
    if (!fn(e, &sym[l], &sym[r], &c.key, &c.id))
        return 0;
    return heap_push(e, hn, &c);
}

int tok_merge_run(struct tok_enc *e, size_t nsym, tok_pair_fn fn)
{
    size_t hn = 0;
    int rc;
    for (size_t i = 0; i + 1 < nsym; i++)
        if ((rc = try_pair(e, &hn, (int32_t)i, (int32_t)i + 1, fn)) < 0)
            return rc;
    while (hn) {
        struct tok_cand c = heap_pop(e, &hn);
        struct tok_sym *sym = e->sym, *l = &sym[c.l], *r = &sym[c.r];
        /* lengths only grow, so an unchanged sum means both sides are as queued */
        if (!l->len || !r->len || l->len + r->len != c.size)
            continue;
        l->len += r->len;
        l->id = c.id;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0)
            sym[l->next].prev = c.l;
        if ((rc = try_pair(e, &hn, l->prev, c.l, fn)) < 0 ||
            (rc = try_pair(e, &hn, c.l, l->next, fn)) < 0)
            return rc;
    }
    return 0;
}

void tok_enc_fini(struct tok_enc *e)
{
    free(e->sym);
    free(e->heap);
    free(e->buf);
    tok_bpe_enc_fini(e);
}

/* --- decode ------------------------------------------------------------------- */

int tok_token_bytes(const struct tok *t, int32_t id, int render_special, char *buf, size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab || (!buf && cap))
        return RKV_EINVAL;
    const struct tok_entry *e = &t->ent[id];
    const char *p = t->pieces + e->piece_off;
    size_t n = e->piece_len;
    if (render_special && e->type == TOK_TYPE_CONTROL) {
        p = tok_text(t, id);
        n = e->text_len;
    }
    if (n <= cap)
        memcpy(buf, p, n);
    return (int)n;
}

void tok_detok_init(struct tok_detok *d, const struct tok *t)
{
    memset(d, 0, sizeof *d);
    d->t = t;
    d->first = t->model == TOK_MODEL_SPM && t->add_space_prefix;
}

/* writes the complete characters of in[0..n) to out, replacing invalid
 * subparts with U+FFFD; *keep = bytes of an incomplete tail left over.
 * returns the bytes written or RKV_ETOOBIG (nothing to rely on in out). */
static int utf8_emit(const uint8_t *in, size_t n, char *out, size_t cap, size_t *keep)
{
    size_t o = 0;
    *keep = 0;
    for (size_t i = 0; i < n;) {
        size_t cl;
        enum tok_utf8 u = tok_utf8_scan(in + i, n - i, &cl);
        if (u == TOK_UTF8_SHORT) {
            *keep = n - i;
            break;
        }
        const void *src = u == TOK_UTF8_OK ? (const void *)(in + i) : "\xef\xbf\xbd";
        size_t sl = u == TOK_UTF8_OK ? cl : 3;
        if (o + sl > cap)
            return RKV_ETOOBIG;
        memcpy(out + o, src, sl);
        o += sl;
        i += cl;
    }
    return (int)o;
}

int tok_detok_push(struct tok_detok *d, int32_t id, char *out, size_t cap, size_t *n)
{
    if (!d || !d->t || !n || (!out && cap))
        return RKV_EINVAL;
    *n = 0;
    const struct tok *t = d->t;
    if (id < 0 || id >= t->n_vocab)
        return RKV_EINVAL;
    const struct tok_entry *e = &t->ent[id];
    const char *p = t->pieces + e->piece_off;
    size_t pl = e->piece_len;
    if (!pl)
        return 0;
    int strip = d->first && p[0] == ' ';
    p += strip;
    pl -= (size_t)strip;

    uint8_t small[256];
    uint8_t *buf = small;
    size_t total = d->n_pending + pl;
    if (total > sizeof small && !(buf = malloc(total)))
        return RKV_ENOMEM;
    memcpy(buf, d->pending, d->n_pending);
    memcpy(buf + d->n_pending, p, pl);
    size_t keep;
    int w = utf8_emit(buf, total, out, cap, &keep);
    if (w >= 0) {
        memcpy(d->pending, buf + total - keep, keep);
        d->n_pending = keep;
        d->first = 0;
        *n = (size_t)w;
    }
    if (buf != small)
        free(buf);
    return w < 0 ? w : 0;
}

int tok_detok_flush(struct tok_detok *d, char *out, size_t cap, size_t *n)
{
    if (!d || !n || (!out && cap))
        return RKV_EINVAL;
    *n = 0;
    if (!d->n_pending)
        return 0;
    /* a pending tail is one incomplete sequence: one replacement char */
    if (cap < 3)
        return RKV_ETOOBIG;
    memcpy(out, "\xef\xbf\xbd", 3);
    *n = 3;
    d->n_pending = 0;
    return 0;
}
