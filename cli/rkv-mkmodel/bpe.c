/* bpe.c - byte-level BPE trainer: split, count pairs, merge the most frequent, repeat. */
#include "cli/rkv-mkmodel/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* --- the llama3 pre-tokenizer, approximated without unicode tables --------- */

enum cls { C_LETTER, C_DIGIT, C_SPACE, C_NEWLINE, C_OTHER };

/* code point at text[i] and its byte length (invalid bytes count as one) */
static uint32_t cp_at(const char *text, size_t len, size_t i, size_t *n)
{
    const uint8_t *s = (const uint8_t *)text + i;
    size_t left = len - i;
    uint8_t c = s[0];
    size_t want = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (want > left)
        want = 1;
    for (size_t k = 1; k < want; k++)
        if ((s[k] & 0xc0) != 0x80)
            want = 1;
    *n = want;
    if (want == 1)
        return c;
    uint32_t cp = c & (0x7f >> want);
    for (size_t k = 1; k < want; k++)
        cp = cp << 6 | (s[k] & 0x3f);
    return cp;
}

static enum cls cp_class(uint32_t cp)
{
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
        return C_LETTER;
    if (cp >= '0' && cp <= '9')
        return C_DIGIT;
    if (cp == '\n' || cp == '\r')
        return C_NEWLINE;
    if (cp == ' ' || cp == '\t' || cp == '\v' || cp == '\f')
        return C_SPACE;
    /* latin, greek, cyrillic ... ; kana and cjk; hangul */
    if ((cp >= 0xc0 && cp <= 0x24f && cp != 0xd7 && cp != 0xf7) || (cp >= 0x370 && cp <= 0x1fff) ||
        (cp >= 0x3040 && cp <= 0x9fff) || (cp >= 0xac00 && cp <= 0xd7af))
        return C_LETTER;
    return C_OTHER;
}

static enum cls class_at(const char *text, size_t len, size_t i, size_t *n)
{
    return cp_class(cp_at(text, len, i, n));
}

static int is_space(enum cls c)
{
    return c == C_SPACE || c == C_NEWLINE;
}

/* end of a run of class-predicate chars starting at i */
static size_t run_end(const char *text, size_t len, size_t i, int (*pred)(enum cls))
{
    while (i < len) {
        size_t n;
        if (!pred(class_at(text, len, i, &n)))
            break;
        i += n;
    }
    return i;
}

static int is_letter(enum cls c)
{
    return c == C_LETTER;
}

static int is_other(enum cls c)
{
    return c == C_OTHER;
}

static int is_newline(enum cls c)
{
    return c == C_NEWLINE;
}

static size_t contraction(const char *t, size_t len, size_t i)
{
    if (t[i] != '\'' || i + 1 >= len)
        return 0;
    char a = (char)(t[i + 1] | 0x20), b = i + 2 < len ? (char)(t[i + 2] | 0x20) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

size_t bpe_split_next(const char *t, size_t len, size_t i)
{
    size_t n, n2;
    size_t c = contraction(t, len, i);
    if (c)
        return c;
    enum cls k = class_at(t, len, i, &n);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (k == C_LETTER)
        return run_end(t, len, i, is_letter) - i;
    if (k != C_DIGIT && k != C_NEWLINE && i + n < len && class_at(t, len, i + n, &n2) == C_LETTER)
        return run_end(t, len, i + n, is_letter) - i;
    /* \p{N}{1,3} */
    if (k == C_DIGIT) {
        size_t j = i;
        for (int d = 0; d < 3 && j < len && t[j] >= '0' && t[j] <= '9'; d++)
            j++;
        return j - i;
    }
    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    size_t j = i;
    if (t[j] == ' ' && j + 1 < len && class_at(t, len, j + 1, &n2) == C_OTHER)
        j++;
    if (class_at(t, len, j, &n2) == C_OTHER) {
        j = run_end(t, len, j, is_other);
        return run_end(t, len, j, is_newline) - i;
    }
    /* whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+ */
    size_t end = run_end(t, len, i, is_space);
    size_t last_nl = 0;
    for (size_t p = i; p < end; p++)
        if (t[p] == '\n' || t[p] == '\r')
            last_nl = p + 1;
    if (last_nl)
        return last_nl - i;
    if (end < len && end - i > 1)
        return end - i - 1;
    return end - i;
}

/* --- training ------------------------------------------------------------- */

struct word {
    uint32_t *ids; /* current tokens */
    uint32_t n;
    uint64_t count;
    const char *text; /* first occurrence, for dedup */
    uint32_t len;
};

struct tokens {
    char **raw; /* raw bytes of each token, NUL-terminated */
    uint32_t *raw_len;
    uint32_t n, cap;
    /* raw text -> id + 1, open addressing */
    uint32_t *map;
    uint32_t map_mask;
};

static uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static uint32_t *tok_slot(struct tokens *tk, const char *s, uint32_t n)
{
    uint32_t h = (uint32_t)fnv(s, n) & tk->map_mask;
    while (tk->map[h]) {
        uint32_t id = tk->map[h] - 1;
        if (tk->raw_len[id] == n && memcmp(tk->raw[id], s, n) == 0)
            break;
        h = (h + 1) & tk->map_mask;
    }
    return &tk->map[h];
}

static int tok_add(struct tokens *tk, const char *s, uint32_t n)
{
    char *copy = malloc(n + 1);
    if (!copy)
        return RKV_ENOMEM;
    memcpy(copy, s, n);
    copy[n] = 0;
    tk->raw[tk->n] = copy;
    tk->raw_len[tk->n] = n;
    *tok_slot(tk, s, n) = tk->n + 1;
    tk->n++;
    return 0;
}

/* pair counts for one round: open addressing over (a << 32 | b) + 1 */
struct pairs {
    uint64_t *keys;
    uint64_t *counts;
    uint32_t *used; /* slots in use, to clear cheaply */
    uint32_t n_used;
    uint32_t mask;
};

static void pair_add(struct pairs *pc, uint64_t key, uint64_t count)
{
    uint32_t h = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & pc->mask;
    while (pc->keys[h] && pc->keys[h] != key)
        h = (h + 1) & pc->mask;
    if (!pc->keys[h]) {
        pc->keys[h] = key;
        pc->used[pc->n_used++] = h;
    }
    pc->counts[h] += count;
}

/* gpt-2's byte -> code point map: printable bytes keep their value, the
 * rest move to 256.. in byte order */
static uint32_t byte_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    uint32_t k = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174))
            k++;
    return 256 + k;
}

/* raw bytes -> mapped utf-8 text (each byte becomes 1 or 2 utf-8 bytes) */
static char *map_text(const char *raw, uint32_t n, const char *sep, const char *raw2, uint32_t n2)
{
    char *out = malloc(2 * ((size_t)n + n2) + 2);
    if (!out)
        return NULL;
    size_t o = 0;
    for (int part = 0; part < 2; part++) {
        const char *s = part ? raw2 : raw;
        uint32_t len = part ? n2 : n;
        if (part && sep)
            out[o++] = *sep;
        for (uint32_t i = 0; s && i < len; i++) {
            uint32_t cp = byte_cp((uint8_t)s[i]);
            if (cp < 0x80) {
                out[o++] = (char)cp;
            } else {
                out[o++] = (char)(0xc0 | cp >> 6);
                out[o++] = (char)(0x80 | (cp & 0x3f));
            }
        }
    }
    out[o] = 0;
    return out;
}

static void words_free(struct word *w, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        free(w[i].ids);
    free(w);
}

/* distinct pre-tokens of text with their counts */
static int collect_words(const char *text, size_t len, struct word **out, uint32_t *n_out,
                         uint64_t *n_ids)
{
    uint32_t cap = 1024, n = 0;
    struct word *w = calloc(cap, sizeof *w);
    uint32_t mask = (1u << 16) - 1;
    uint32_t *map = calloc(mask + 1, sizeof *map);
    if (!w || !map) {
        free(w);
        free(map);
        return RKV_ENOMEM;
    }
    *n_ids = 0;
    int rc = 0;
    for (size_t i = 0; i < len;) {
        size_t l = bpe_split_next(text, len, i);
        uint32_t h = (uint32_t)fnv(text + i, l) & mask;
        while (map[h] && !(w[map[h] - 1].len == l && !memcmp(w[map[h] - 1].text, text + i, l)))
            h = (h + 1) & mask;
        if (map[h]) {
            w[map[h] - 1].count++;
        } else {
            if (n == cap || n * 2 > mask) {
                rc = RKV_ETOOBIG; /* the built-in text is far below this */
                break;
            }
            struct word *nw = &w[n];
            nw->text = text + i;
            nw->len = (uint32_t)l;
            nw->count = 1;
            nw->n = (uint32_t)l;
            nw->ids = malloc(l * sizeof *nw->ids);
            if (!nw->ids) {
                rc = RKV_ENOMEM;
                break;
            }
            for (size_t k = 0; k < l; k++)
                nw->ids[k] = (uint8_t)text[i + k];
            *n_ids += l;
            map[h] = ++n;
            if (n == cap) {
                struct word *bigger = realloc(w, 2 * cap * sizeof *w);
                if (!bigger) {
                    rc = RKV_ENOMEM;
                    break;
                }
                w = bigger;
                memset(w + cap, 0, cap * sizeof *w);
                cap *= 2;
            }
        }
        i += l;
    }
    free(map);
    if (rc) {
        words_free(w, n);
        return rc;
    }
    *out = w;
    *n_out = n;
    return 0;
}

/* replaces every (a, b) in w by c, left to right */
static void word_merge(struct word *w, uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t o = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        if (i + 1 < w->n && w->ids[i] == a && w->ids[i + 1] == b) {
            w->ids[o++] = c;
            i++;
        } else {
            w->ids[o++] = w->ids[i];
        }
    }
    w->n = o;
}

void bpe_vocab_fini(struct bpe_vocab *v)
{
    for (uint32_t i = 0; v->tokens && i < v->n_tokens; i++)
        free(v->tokens[i]);
    for (uint32_t i = 0; v->merges && i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

int bpe_train(const char *text, size_t len, uint32_t max_tokens, struct bpe_vocab *out)
{
    memset(out, 0, sizeof *out);
    if (max_tokens < 256)
        return RKV_EINVAL;
    struct word *words = NULL;
    uint32_t n_words = 0;
    uint64_t n_ids = 0;
    int rc = collect_words(text, len, &words, &n_words, &n_ids);
    if (rc)
        return rc;

    /* each merge leaves at most max_tokens - 256 merges */
    uint32_t max_merges = max_tokens - 256;
    struct tokens tk = {0};
    struct pairs pc = {0};
    uint32_t(*merges)[2] = malloc(((size_t)max_merges + 1) * sizeof *merges);
    tk.cap = max_tokens;
    tk.raw = calloc(max_tokens, sizeof *tk.raw);
    tk.raw_len = calloc(max_tokens, sizeof *tk.raw_len);
    tk.map_mask = 1;
    while (tk.map_mask < 2 * max_tokens)
        tk.map_mask = tk.map_mask * 2 + 1;
    tk.map = calloc((size_t)tk.map_mask + 1, sizeof *tk.map);
    pc.mask = 1;
    while (pc.mask < 2 * n_ids + 16)
        pc.mask = pc.mask * 2 + 1;
    pc.keys = calloc((size_t)pc.mask + 1, sizeof *pc.keys);
    pc.counts = calloc((size_t)pc.mask + 1, sizeof *pc.counts);
    pc.used = calloc((size_t)pc.mask + 1, sizeof *pc.used);
    rc = RKV_ENOMEM;
    if (!merges || !tk.raw || !tk.raw_len || !tk.map || !pc.keys || !pc.counts || !pc.used)
        goto done;
    for (uint32_t b = 0; b < 256; b++) {
        char c = (char)b;
        if ((rc = tok_add(&tk, &c, 1)))
            goto done;
    }

    uint32_t n_merges = 0;
    while (tk.n < max_tokens && n_merges < max_merges) {
        for (uint32_t w = 0; w < n_words; w++)
            for (uint32_t i = 0; i + 1 < words[w].n; i++)
                pair_add(&pc, ((uint64_t)words[w].ids[i] << 32 | words[w].ids[i + 1]) + 1,
                         words[w].count);
        /* most frequent pair; ties go to the smaller (left, right) ids */
        uint64_t best = 0, best_count = 0;
        for (uint32_t u = 0; u < pc.n_used; u++) {
            uint32_t h = pc.used[u];
            if (pc.counts[h] > best_count || (pc.counts[h] == best_count && pc.keys[h] < best)) {
                best = pc.keys[h];
                best_count = pc.counts[h];
            }
            pc.keys[h] = 0;
            pc.counts[h] = 0;
        }
        pc.n_used = 0;
        if (!best)
            break;
        uint32_t a = (uint32_t)((best - 1) >> 32), b = (uint32_t)(best - 1);
        uint32_t la = tk.raw_len[a], lb = tk.raw_len[b];
        char *cat = malloc((size_t)la + lb);
        if (!cat)
            goto done;
        memcpy(cat, tk.raw[a], la);
        memcpy(cat + la, tk.raw[b], lb);
        /* the same text can come from two different splits: one token */
        uint32_t c = *tok_slot(&tk, cat, la + lb);
        rc = 0;
        if (c)
            c--;
        else if (!(rc = tok_add(&tk, cat, la + lb)))
            c = tk.n - 1;
        free(cat);
        if (rc)
            goto done;
        merges[n_merges][0] = a;
        merges[n_merges][1] = b;
        n_merges++;
        for (uint32_t w = 0; w < n_words; w++)
            word_merge(&words[w], a, b, c);
    }

    rc = RKV_ENOMEM;
    out->tokens = calloc(tk.n, sizeof *out->tokens);
    out->merges = calloc(n_merges ? n_merges : 1, sizeof *out->merges);
    if (!out->tokens || !out->merges)
        goto fail;
    for (uint32_t i = 0; i < tk.n; i++, out->n_tokens++)
        if (!(out->tokens[i] = map_text(tk.raw[i], tk.raw_len[i], NULL, NULL, 0)))
            goto fail;
    for (uint32_t i = 0; i < n_merges; i++, out->n_merges++) {
        uint32_t a = merges[i][0], b = merges[i][1];
        out->merges[i] = map_text(tk.raw[a], tk.raw_len[a], " ", tk.raw[b], tk.raw_len[b]);
        if (!out->merges[i])
            goto fail;
    }
    rc = 0;
    goto done;
fail:
    bpe_vocab_fini(out);
done:
    for (uint32_t i = 0; tk.raw && i < tk.n; i++)
        free(tk.raw[i]);
    free(tk.raw);
    free(tk.raw_len);
    free(tk.map);
    free(pc.keys);
    free(pc.counts);
    free(pc.used);
    free(merges);
    words_free(words, n_words);
    return rc;
}
