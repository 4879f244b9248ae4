/* grammar.c - GBNF compiler to byte-level rules, vocab tries, stack-set matchers, token masks. */
#include "common/grammar.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

/* ---- compiled grammar ---- */

enum { E_END = 0, E_BYTES = 1, E_REF = 2 };

struct gelem {
    uint32_t kind; /* E_* */
    uint32_t arg;  /* E_BYTES: byte set index; E_REF: rule index */
};

struct grammar {
    struct gelem *elems; /* every alternative's elements, each run ended by E_END */
    uint32_t n_elems;
    uint32_t *rule_alt;  /* rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r + 1]) */
    uint32_t *alt_start; /* first element of each alternative */
    uint32_t n_rules;
    uint32_t (*sets)[8]; /* 256-bit byte sets */
    uint32_t n_sets;
    uint32_t root;
    /* masks shared by every matcher of this grammar, keyed by the top KEY_DEPTH frames of
     * each stack; the only mutable part, behind the lock */
    pthread_mutex_t lock;
    struct gcache *cache;
    size_t n_cache, cap_cache;
};

/* a context-independent mask: the tokens a state allows whatever lies below its top
 * KEY_DEPTH frames (bits), and the tokens that reach below them (deps: each matcher tries
 * those from its own state) */
struct gcache {
    uint64_t vocab_id;
    uint32_t *key;
    uint32_t key_len, hash;
    uint32_t *bits;
    int32_t *deps;
    uint32_t n_deps;
};

#define KEY_DEPTH     3
#define CACHE_ENTRIES 256

/* ---- parser / builder ---- */

struct evec {
    struct gelem *v;
    size_t n, cap; /* cap in bytes (rkv_grow) */
};

struct brule {
    char *name;
    struct evec *alts;
    size_t n_alts, cap_alts; /* cap in bytes */
    int defined;
    uint32_t ref_line, ref_col; /* first use, for "not defined" */
};

struct builder {
    const char *src, *p, *end;
    struct brule *rules;
    size_t n_rules, cap_rules;
    uint32_t (*sets)[8];
    size_t n_sets, cap_sets;
    size_t n_elems;
    uint32_t n_anon;
    int depth; /* ( ) nesting */
    char *err;
    size_t errlen;
    int rc;
};

static void b_fail(struct builder *b, int rc, const char *fmt, ...)
{
    if (b->rc)
        return;
    b->rc = rc;
    if (!b->err || !b->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, b->errlen, fmt, ap);
    va_end(ap);
}

static void b_pos(const struct builder *b, const char *at, uint32_t *line, uint32_t *col)
{
    *line = 1;
    *col = 1;
    for (const char *q = b->src; q < at && q < b->end; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* a parse error at the cursor: "line L, column C: what" */
static void b_perr(struct builder *b, const char *fmt, ...)
{
    if (b->rc)
        return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint32_t line, col;
    b_pos(b, b->p, &line, &col);
    b_fail(b, RKV_EFORMAT, "line %u, column %u: %s", line, col, msg);
}

static int ev_push(struct builder *b, struct evec *e, uint32_t kind, uint32_t arg)
{
    if (b->rc)
        return b->rc;
    if (++b->n_elems > GRAMMAR_MAX_ELEMS) {
        b_fail(b, RKV_ETOOBIG, "grammar too large (more than %u elements)", GRAMMAR_MAX_ELEMS);
        return b->rc;
    }
    if (rkv_grow((void **)&e->v, &e->cap, (e->n + 1) * sizeof *e->v, 8 * sizeof *e->v)) {
        b_fail(b, RKV_ENOMEM, "out of memory");
        return b->rc;
    }
    e->v[e->n].kind = kind;
    e->v[e->n].arg = arg;
    e->n++;
    return 0;
}

static int ev_append(struct builder *b, struct evec *dst, const struct gelem *src, size_t n)
{
    for (size_t i = 0; i < n && !b->rc; i++)
        ev_push(b, dst, src[i].kind, src[i].arg);
    return b->rc;
}

static uint32_t b_set(struct builder *b, const uint32_t set[8])
{
    for (size_t i = 0; i < b->n_sets; i++)
        if (!memcmp(b->sets[i], set, 32))
            return (uint32_t)i;
    if (rkv_grow((void **)&b->sets, &b->cap_sets, (b->n_sets + 1) * 32, 64 * 32)) {
        b_fail(b, RKV_ENOMEM, "out of memory");
        return 0;
    }
    memcpy(b->sets[b->n_sets], set, 32);
    return (uint32_t)b->n_sets++;
}

static uint32_t b_range(struct builder *b, unsigned lo, unsigned hi)
{
    uint32_t set[8] = {0};
    for (unsigned c = lo; c <= hi; c++)
        set[c >> 5] |= 1u << (c & 31);
    return b_set(b, set);
}

static uint32_t b_rule(struct builder *b, const char *name, size_t len)
{
    if (name) {
        for (size_t i = 0; i < b->n_rules; i++)
            if (b->rules[i].name && strlen(b->rules[i].name) == len &&
                !memcmp(b->rules[i].name, name, len))
                return (uint32_t)i;
    }
    if (rkv_grow((void **)&b->rules, &b->cap_rules, (b->n_rules + 1) * sizeof *b->rules,
                 16 * sizeof *b->rules)) {
        b_fail(b, RKV_ENOMEM, "out of memory");
        return 0;
    }
    struct brule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    char tmp[32];
    if (!name) {
        len = (size_t)snprintf(tmp, sizeof tmp, "_%u", b->n_anon++);
        name = tmp;
    }
    r->name = malloc(len + 1);
    if (!r->name) {
        b_fail(b, RKV_ENOMEM, "out of memory");
        return 0;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    return (uint32_t)b->n_rules++;
}

/* adds an alternative (moves e) */
static void b_add_alt(struct builder *b, uint32_t r, struct evec *e)
{
    struct brule *ru = &b->rules[r];
    if (b->rc || rkv_grow((void **)&ru->alts, &ru->cap_alts, (ru->n_alts + 1) * sizeof *ru->alts,
                          2 * sizeof *ru->alts)) {
        b_fail(b, RKV_ENOMEM, "out of memory");
        free(e->v);
        memset(e, 0, sizeof *e);
        return;
    }
    ru->alts[ru->n_alts++] = *e;
    memset(e, 0, sizeof *e);
}

/* a new helper rule of the given alternatives (each (elems, n)); returns its index */
static uint32_t b_helper(struct builder *b, const struct gelem *x, size_t nx, int kind)
{
    /* kind 0: R ::= x ; 1: R ::= x R | "" ; 2: R ::= x | "" */
    uint32_t r = b_rule(b, NULL, 0);
    if (b->rc)
        return 0;
    struct evec a = {0};
    ev_append(b, &a, x, nx);
    if (kind == 1)
        ev_push(b, &a, E_REF, r);
    b_add_alt(b, r, &a);
    if (kind) {
        struct evec empty = {0};
        b_add_alt(b, r, &empty);
    }
    return r;
}

/* ---- utf-8 ---- */

static int utf8_encode(uint32_t c, uint8_t *out)
{
    if (c < 0x80) {
        out[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (uint8_t)(0xC0 | (c >> 6));
        out[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (c >> 12));
        out[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (c >> 18));
    out[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* decodes one utf-8 character of [p, end); returns its length, 0 when invalid */
static int utf8_decode(const char *p, const char *end, uint32_t *c)
{
    const uint8_t *s = (const uint8_t *)p;
    size_t left = (size_t)(end - p);
    if (!left)
        return 0;
    if (s[0] < 0x80) {
        *c = s[0];
        return 1;
    }
    int n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (!n || (size_t)n > left || s[0] > 0xF4)
        return 0;
    uint32_t v = s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *c = v;
    return n;
}

struct cprange {
    uint32_t lo, hi;
};

/* appends the utf-8 byte-range sequences of code points [lo, hi] (no surrogates) to rule r
 * (single-byte ranges go to *ascii) */
static void b_utf8_ranges(struct builder *b, uint32_t lo, uint32_t hi, uint32_t r,
                          uint32_t ascii[8])
{
    static const uint32_t lim[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (b->rc || lo > hi)
        return;
    for (int i = 0; i < 3; i++) {
        if (lo <= lim[i] && hi > lim[i]) {
            b_utf8_ranges(b, lo, lim[i], r, ascii);
            b_utf8_ranges(b, lim[i] + 1, hi, r, ascii);
            return;
        }
    }
    if (hi < 0x80) {
        for (uint32_t c = lo; c <= hi; c++)
            ascii[c >> 5] |= 1u << (c & 31);
        return;
    }
    /* split until every continuation position spans a full or single prefix */
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                b_utf8_ranges(b, lo, lo | m, r, ascii);
                b_utf8_ranges(b, (lo | m) + 1, hi, r, ascii);
                return;
            }
            if ((hi & m) != m) {
                b_utf8_ranges(b, lo, (hi & ~m) - 1, r, ascii);
                b_utf8_ranges(b, hi & ~m, hi, r, ascii);
                return;
            }
        }
    }
    uint8_t a[4], z[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, z);
    struct evec e = {0};
    for (int i = 0; i < n; i++)
        ev_push(b, &e, E_BYTES, b_range(b, a[i], z[i]));
    b_add_alt(b, r, &e);
}

/* pushes a matcher of any one code point in ranges (sorted, merged) onto seq */
static void b_class(struct builder *b, struct evec *seq, const struct cprange *rg, size_t n)
{
    uint32_t ascii[8] = {0};
    int multi = 0;
    for (size_t i = 0; i < n; i++)
        if (rg[i].hi >= 0x80)
            multi = 1;
    if (!multi) {
        for (size_t i = 0; i < n; i++)
            for (uint32_t c = rg[i].lo; c <= rg[i].hi; c++)
                ascii[c >> 5] |= 1u << (c & 31);
        ev_push(b, seq, E_BYTES, b_set(b, ascii));
        return;
    }
    uint32_t r = b_rule(b, NULL, 0);
    for (size_t i = 0; i < n && !b->rc; i++) {
        uint32_t lo = rg[i].lo, hi = rg[i].hi;
        if (lo <= 0xDFFF && hi >= 0xD800) {
            b_utf8_ranges(b, lo, 0xD7FF < lo ? lo - 1 : 0xD7FF, r, ascii);
            lo = 0xE000;
        }
        if (lo <= hi)
            b_utf8_ranges(b, lo, hi, r, ascii);
    }
    uint32_t zero[8] = {0};
    if (memcmp(ascii, zero, 32)) {
        struct evec e = {0};
        ev_push(b, &e, E_BYTES, b_set(b, ascii));
        b_add_alt(b, r, &e);
    }
    ev_push(b, seq, E_REF, r);
}

static int cmp_range(const void *x, const void *y)
{
    const struct cprange *a = x, *c = y;
    return a->lo < c->lo ? -1 : a->lo > c->lo;
}

/* ---- the GBNF parser ---- */

static int is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* skips spaces, newlines and comments */
static void skip_ws(struct builder *b)
{
    while (b->p < b->end) {
        char c = *b->p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            b->p++;
        } else if (c == '#') {
            while (b->p < b->end && *b->p != '\n')
                b->p++;
        } else {
            break;
        }
    }
}

/* 1 when the cursor is at `name ::=` (the next rule starts) */
static int at_rule_start(const struct builder *b)
{
    const char *q = b->p;
    if (q >= b->end || !is_word((unsigned char)*q))
        return 0;
    while (q < b->end && is_word((unsigned char)*q))
        q++;
    while (q < b->end && (*q == ' ' || *q == '\t'))
        q++;
    return b->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20; /* lower case */
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* one character of a literal or class (an escape, or one utf-8 character) */
static int parse_char(struct builder *b, uint32_t *c)
{
    if (b->p >= b->end) {
        b_perr(b, "unexpected end of grammar");
        return -1;
    }
    if (*b->p != '\\') {
        int n = utf8_decode(b->p, b->end, c);
        if (!n) {
            b_perr(b, "invalid UTF-8");
            return -1;
        }
        b->p += n;
        return 0;
    }
    b->p++;
    if (b->p >= b->end) {
        b_perr(b, "unfinished escape");
        return -1;
    }
    char e = *b->p++;
    int digits = 0;
    switch (e) {
    case 'n': *c = '\n'; return 0;
    case 'r': *c = '\r'; return 0;
    case 't': *c = '\t'; return 0;
    case '0': *c = 0; return 0;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/':
    case '\'': *c = (uint32_t)(unsigned char)e; return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        b->p--;
        b_perr(
            b,
            "unknown escape '\\%c' (use \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)",
            e);
        return -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = b->p < b->end ? hexval((unsigned char)*b->p) : -1;
        if (h < 0) {
            b_perr(b, "expected %d hex digits after \\%c", digits, e);
            return -1;
        }
        v = v * 16 + (uint32_t)h;
        b->p++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        b_perr(b, "escape is not a Unicode scalar value");
        return -1;
    }
    *c = v;
    return 0;
}

static void parse_literal(struct builder *b, struct evec *seq)
{
    b->p++; /* " */
    while (!b->rc) {
        if (b->p >= b->end || *b->p == '\n') {
            b_perr(b, "unterminated literal: expected '\"'");
            return;
        }
        if (*b->p == '"') {
            b->p++;
            return;
        }
        uint32_t c;
        if (parse_char(b, &c))
            return;
        uint8_t u[4];
        int n = utf8_encode(c, u);
        for (int i = 0; i < n; i++)
            ev_push(b, seq, E_BYTES, b_range(b, u[i], u[i]));
    }
}

static void parse_class(struct builder *b, struct evec *seq, int any)
{
    struct cprange *rg = NULL;
    size_t n = 0, cap = 0;
    int neg = 0;
    if (any) {
        b->p++;
        neg = 1; /* the complement of nothing */
    } else {
        b->p++; /* [ */
        if (b->p < b->end && *b->p == '^') {
            neg = 1;
            b->p++;
        }
        while (!b->rc) {
            if (b->p >= b->end || *b->p == '\n') {
                b_perr(b, "unterminated character class: expected ']'");
                break;
            }
            if (*b->p == ']') {
                b->p++;
                break;
            }
            uint32_t lo, hi;
            if (parse_char(b, &lo))
                break;
            hi = lo;
            if (b->end - b->p >= 2 && b->p[0] == '-' && b->p[1] != ']') {
                b->p++;
                if (parse_char(b, &hi))
                    break;
                if (hi < lo) {
                    b_perr(b, "character range is reversed");
                    break;
                }
            }
            if (rkv_grow((void **)&rg, &cap, (n + 1) * sizeof *rg, 8 * sizeof *rg)) {
                b_fail(b, RKV_ENOMEM, "out of memory");
                break;
            }
            rg[n].lo = lo;
            rg[n].hi = hi;
            n++;
        }
    }
    if (b->rc) {
        free(rg);
        return;
    }
    if (n)
        qsort(rg, n, sizeof *rg, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && rg[i].lo <= rg[m - 1].hi + 1) {
            if (rg[i].hi > rg[m - 1].hi)
                rg[m - 1].hi = rg[i].hi;
        } else {
            rg[m++] = rg[i];
        }
    }
    if (neg) {
        struct cprange *c = malloc((m + 1) * sizeof *c);
        if (!c) {
            free(rg);
            b_fail(b, RKV_ENOMEM, "out of memory");
            return;
        }
        size_t k = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < m; i++) {
            if (rg[i].lo > next)
                c[k++] = (struct cprange){next, rg[i].lo - 1};
            next = rg[i].hi + 1;
        }
        if (next <= 0x10FFFF)
            c[k++] = (struct cprange){next, 0x10FFFF};
        free(rg);
        rg = c;
        m = k;
    }
    if (!m) {
        /* an empty class matches nothing: an impossible byte set */
        uint32_t none[8] = {0};
        ev_push(b, seq, E_BYTES, b_set(b, none));
    } else {
        b_class(b, seq, rg, m);
    }
    free(rg);
}

static unsigned long parse_uint(struct builder *b)
{
    unsigned long v = 0;
    const char *s = b->p;
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (unsigned long)(*b->p - '0');
        if (v > GRAMMAR_MAX_REPEAT)
            v = GRAMMAR_MAX_REPEAT + 1;
        b->p++;
    }
    if (b->p == s)
        b_perr(b, "expected a number in {m,n}");
    return v;
}

/* x repeated min..max times (max < 0: unbounded), x = seq[from..] */
static void apply_repeat(struct builder *b, struct evec *seq, size_t from, long min, long max)
{
    if (b->rc)
        return;
    if (min > GRAMMAR_MAX_REPEAT || max > GRAMMAR_MAX_REPEAT) {
        b_perr(b, "repetition count above %d", GRAMMAR_MAX_REPEAT);
        return;
    }
    if (max >= 0 && max < min) {
        b_perr(b, "repetition {m,n} with n < m");
        return;
    }
    struct gelem one;
    size_t nx = seq->n - from;
    if (nx == 1) {
        one = seq->v[from];
    } else {
        one.kind = E_REF;
        one.arg = b_helper(b, seq->v + from, nx, 0);
    }
    b->n_elems -= nx;
    seq->n = from;
    for (long i = 0; i < min && !b->rc; i++)
        ev_push(b, seq, one.kind, one.arg);
    if (max < 0) {
        ev_push(b, seq, E_REF, b_helper(b, &one, 1, 1));
    } else if (max > min) {
        /* R1 ::= x | "" ; Rk ::= x R(k-1) | "" */
        uint32_t r = b_helper(b, &one, 1, 2);
        for (long k = 2; k <= max - min && !b->rc; k++) {
            struct gelem two[2] = {one, {E_REF, r}};
            r = b_helper(b, two, 2, 2);
        }
        ev_push(b, seq, E_REF, r);
    }
}

static void parse_alternates(struct builder *b, uint32_t r, int nested);

static void parse_sequence(struct builder *b, struct evec *seq, int nested)
{
    size_t last = (size_t)-1;
    while (!b->rc) {
        skip_ws(b);
        if (b->p >= b->end)
            return;
        char c = *b->p;
        if (c == '|' || c == ')')
            return;
        if (!nested && at_rule_start(b))
            return;
        size_t start = seq->n;
        if (c == '"') {
            parse_literal(b, seq);
        } else if (c == '[' || c == '.') {
            parse_class(b, seq, c == '.');
        } else if (is_word((unsigned char)c)) {
            const char *s = b->p;
            while (b->p < b->end && is_word((unsigned char)*b->p))
                b->p++;
            uint32_t r = b_rule(b, s, (size_t)(b->p - s));
            if (!b->rc && !b->rules[r].ref_line && !b->rules[r].defined)
                b_pos(b, s, &b->rules[r].ref_line, &b->rules[r].ref_col);
            ev_push(b, seq, E_REF, r);
        } else if (c == '(') {
            if (++b->depth > GRAMMAR_MAX_NESTING) {
                b_perr(b, "groups nested deeper than %d", GRAMMAR_MAX_NESTING);
                return;
            }
            b->p++;
            uint32_t r = b_rule(b, NULL, 0);
            parse_alternates(b, r, 1);
            b->depth--;
            skip_ws(b);
            if (b->rc)
                return;
            if (b->p >= b->end || *b->p != ')') {
                b_perr(b, "expected ')'");
                return;
            }
            b->p++;
            ev_push(b, seq, E_REF, r);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == (size_t)-1) {
                b_perr(b, "expected a symbol before '%c'", c);
                return;
            }
            b->p++;
            long min = 0, max = -1;
            if (c == '+') {
                min = 1;
            } else if (c == '?') {
                max = 1;
            } else if (c == '{') {
                skip_ws(b);
                min = (long)parse_uint(b);
                skip_ws(b);
                if (b->p < b->end && *b->p == ',') {
                    b->p++;
                    skip_ws(b);
                    if (b->p < b->end && *b->p != '}')
                        max = (long)parse_uint(b);
                } else {
                    max = min;
                }
                skip_ws(b);
                if (!b->rc && (b->p >= b->end || *b->p != '}')) {
                    b_perr(b, "expected '}' to close {m,n}");
                    return;
                }
                b->p++;
            }
            apply_repeat(b, seq, last, min, max);
            continue; /* last stays: x*? applies to the repeated whole */
        } else {
            b_perr(b, "unexpected '%c': expected a literal, [class], rule name, '(' or '|'", c);
            return;
        }
        last = start;
    }
}

static void parse_alternates(struct builder *b, uint32_t r, int nested)
{
    for (;;) {
        struct evec seq = {0};
        parse_sequence(b, &seq, nested);
        b_add_alt(b, r, &seq);
        if (b->rc)
            return;
        skip_ws(b);
        if (b->p < b->end && *b->p == '|') {
            b->p++;
            continue;
        }
        return;
    }
}

static void parse_grammar(struct builder *b)
{
    for (;;) {
        skip_ws(b);
        if (b->rc || b->p >= b->end)
            return;
        const char *s = b->p;
        while (b->p < b->end && is_word((unsigned char)*b->p))
            b->p++;
        if (b->p == s) {
            b_perr(b, "expected a rule name");
            return;
        }
        size_t nl = (size_t)(b->p - s);
        while (b->p < b->end && (*b->p == ' ' || *b->p == '\t'))
            b->p++;
        if (b->end - b->p < 3 || memcmp(b->p, "::=", 3)) {
            b_perr(b, "expected ::= after rule name");
            return;
        }
        uint32_t r = b_rule(b, s, nl);
        if (b->rc)
            return;
        if (b->rules[r].defined) {
            b->p = s;
            b_perr(b, "rule \"%s\" is defined twice", b->rules[r].name);
            return;
        }
        b->rules[r].defined = 1;
        b->p += 3;
        parse_alternates(b, r, 0);
        if (b->rc)
            return;
        skip_ws(b);
        if (b->p < b->end && *b->p == ')') {
            b_perr(b, "unmatched ')'");
            return;
        }
    }
}

/* ---- checks and flattening ---- */

/* refuses left recursion: a rule that can reach itself before consuming a byte */
static void check_left_recursion(struct builder *b)
{
    size_t n = b->n_rules;
    uint8_t *nullable = calloc(n ? n : 1, 1);
    uint8_t *color = calloc(n ? n : 1, 1);
    uint32_t *stack = malloc((n ? n : 1) * sizeof *stack);
    uint32_t *alt_i = calloc(n ? n : 1, sizeof *alt_i);
    uint32_t *el_i = calloc(n ? n : 1, sizeof *el_i);
    if (!nullable || !color || !stack || !alt_i || !el_i) {
        b_fail(b, RKV_ENOMEM, "out of memory");
        goto out;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t r = 0; r < n; r++) {
            if (nullable[r])
                continue;
            for (size_t a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                const struct evec *e = &b->rules[r].alts[a];
                size_t i = 0;
                while (i < e->n && e->v[i].kind == E_REF && nullable[e->v[i].arg])
                    i++;
                if (i == e->n) {
                    nullable[r] = 1;
                    changed = 1;
                }
            }
        }
    }
    /* iterative dfs over "r can start with s" edges; grey = on the path */
    for (size_t root = 0; root < n && !b->rc; root++) {
        if (color[root])
            continue;
        size_t sp = 0;
        stack[sp++] = (uint32_t)root;
        color[root] = 1;
        alt_i[root] = el_i[root] = 0;
        while (sp && !b->rc) {
            uint32_t r = stack[sp - 1];
            const struct brule *ru = &b->rules[r];
            int pushed = 0;
            while (alt_i[r] < ru->n_alts && !pushed) {
                const struct evec *e = &ru->alts[alt_i[r]];
                /* the element at el_i is reachable when every one before is nullable */
                int reach = 1;
                for (uint32_t k = 0; k < el_i[r] && reach; k++)
                    reach = e->v[k].kind == E_REF && nullable[e->v[k].arg];
                if (!reach || el_i[r] >= e->n) {
                    alt_i[r]++;
                    el_i[r] = 0;
                    continue;
                }
                const struct gelem *x = &e->v[el_i[r]++];
                if (x->kind != E_REF)
                    continue;
                uint32_t s = x->arg;
                if (color[s] == 1) {
                    /* the cycle: s ... r -> s, named by the defined rules on it */
                    char path[256];
                    size_t pl = 0, k = sp;
                    while (k > 0 && stack[k - 1] != s)
                        k--;
                    path[0] = 0;
                    for (size_t j = k ? k - 1 : 0; j < sp && pl < sizeof path - 40; j++) {
                        if (b->rules[stack[j]].name[0] == '_')
                            continue;
                        pl += (size_t)snprintf(path + pl, sizeof path - pl, "%s -> ",
                                               b->rules[stack[j]].name);
                    }
                    snprintf(path + pl, sizeof path - pl, "%s", b->rules[s].name);
                    b_fail(b, RKV_EUNSUPPORTED,
                           "left recursion: %s (rewrite it right-recursive, e.g. "
                           "a ::= x a | x, or use x*)",
                           path);
                    break;
                }
                if (color[s] == 0) {
                    color[s] = 1;
                    alt_i[s] = el_i[s] = 0;
                    stack[sp++] = s;
                    pushed = 1;
                }
            }
            if (!pushed && !b->rc && alt_i[r] >= ru->n_alts) {
                color[r] = 2;
                sp--;
            }
        }
    }
out:
    free(nullable);
    free(color);
    free(stack);
    free(alt_i);
    free(el_i);
}

static void builder_free(struct builder *b)
{
    for (size_t i = 0; i < b->n_rules; i++) {
        for (size_t a = 0; a < b->rules[i].n_alts; a++)
            free(b->rules[i].alts[a].v);
        free(b->rules[i].alts);
        free(b->rules[i].name);
    }
    free(b->rules);
    free(b->sets);
}

void grammar_destroy(struct grammar *g)
{
    if (!g)
        return;
    free(g->elems);
    free(g->rule_alt);
    free(g->alt_start);
    free(g->sets);
    for (size_t i = 0; i < g->n_cache; i++) {
        free(g->cache[i].key);
        free(g->cache[i].bits);
        free(g->cache[i].deps);
    }
    free(g->cache);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

int grammar_compile(const char *gbnf, size_t len, struct grammar **out, char *err, size_t errlen)
{
    if (!out || (!gbnf && len))
        return RKV_EINVAL;
    *out = NULL;
    if (err && errlen)
        err[0] = 0;
    struct builder b = {.src = gbnf, .p = gbnf, .end = gbnf + len, .err = err, .errlen = errlen};
    parse_grammar(&b);
    uint32_t root = 0;
    if (!b.rc) {
        size_t i;
        for (i = 0; i < b.n_rules; i++)
            if (!strcmp(b.rules[i].name, "root"))
                break;
        if (i == b.n_rules)
            b_fail(&b, RKV_EFORMAT, "no rule named \"root\" (the start rule)");
        root = (uint32_t)i;
    }
    for (size_t i = 0; i < b.n_rules && !b.rc; i++) {
        if (b.rules[i].name[0] != '_' && !b.rules[i].defined)
            b_fail(&b, RKV_EFORMAT, "line %u, column %u: rule \"%s\" is not defined",
                   b.rules[i].ref_line, b.rules[i].ref_col, b.rules[i].name);
    }
    if (!b.rc)
        check_left_recursion(&b);
    struct grammar *g = NULL;
    if (!b.rc) {
        g = calloc(1, sizeof *g);
        if (g)
            pthread_mutex_init(&g->lock, NULL);
        size_t n_alts = 0;
        for (size_t i = 0; i < b.n_rules; i++)
            n_alts += b.rules[i].n_alts;
        if (g) {
            g->elems = malloc((b.n_elems + n_alts) * sizeof *g->elems);
            g->rule_alt = malloc((b.n_rules + 1) * sizeof *g->rule_alt);
            g->alt_start = malloc((n_alts ? n_alts : 1) * sizeof *g->alt_start);
            g->sets = malloc((b.n_sets ? b.n_sets : 1) * 32);
        }
        if (!g || !g->elems || !g->rule_alt || !g->alt_start || !g->sets) {
            grammar_destroy(g);
            g = NULL;
            b_fail(&b, RKV_ENOMEM, "out of memory");
        }
    }
    if (!b.rc) {
        uint32_t ne = 0, na = 0;
        for (size_t i = 0; i < b.n_rules; i++) {
            g->rule_alt[i] = na;
            for (size_t a = 0; a < b.rules[i].n_alts; a++) {
                const struct evec *e = &b.rules[i].alts[a];
                g->alt_start[na++] = ne;
                if (e->n)
                    memcpy(g->elems + ne, e->v, e->n * sizeof *e->v);
                ne += (uint32_t)e->n;
                g->elems[ne].kind = E_END;
                g->elems[ne].arg = 0;
                ne++;
            }
        }
        g->rule_alt[b.n_rules] = na;
        g->n_elems = ne;
        g->n_rules = (uint32_t)b.n_rules;
        if (b.n_sets)
            memcpy(g->sets, b.sets, b.n_sets * 32);
        g->n_sets = (uint32_t)b.n_sets;
        g->root = root;
        *out = g;
    }
    int rc = b.rc;
    builder_free(&b);
    return rc;
}

/* ---- vocabulary trie ---- */

struct grammar_vocab {
    uint64_t id; /* unique per vocab made: a cache key that an address reused cannot fake */
    int32_t n;
    uint32_t n_words;
    /* trie: node i's children are child_node[child_off[i] .. child_off[i + 1]) */
    uint32_t n_nodes;
    uint32_t *child_off;  /* (n_nodes + 1) */
    uint8_t *child_byte;  /* (n_nodes - 1) */
    uint32_t *child_node; /* (n_nodes - 1) */
    uint32_t *tok_off;    /* (n_nodes + 1): tokens ending at node i in toks[tok_off[i] ..) */
    int32_t *toks;        /* (n) */
    /* token bytes for accept */
    uint64_t *byte_off; /* (n + 1) */
    char *blob;
    uint8_t *eog; /* (n) */
    int32_t *eog_ids;
    int32_t n_eog;
};

void grammar_vocab_destroy(struct grammar_vocab *v)
{
    if (!v)
        return;
    free(v->child_off);
    free(v->child_byte);
    free(v->child_node);
    free(v->tok_off);
    free(v->toks);
    free(v->byte_off);
    free(v->blob);
    free(v->eog);
    free(v->eog_ids);
    free(v);
}

int32_t grammar_vocab_n(const struct grammar_vocab *v)
{
    return v ? v->n : 0;
}

static int cmp_tok_bytes(const void *x, const void *y, void *ctx)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    const struct grammar_vocab *v = ctx;
    uint64_t la = v->byte_off[a + 1] - v->byte_off[a], lb = v->byte_off[b + 1] - v->byte_off[b];
    int c = memcmp(v->blob + v->byte_off[a], v->blob + v->byte_off[b], la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

int grammar_vocab_create(struct grammar_vocab **out, int32_t n_vocab, const char *const *bytes,
                         const uint32_t *lens, const uint8_t *eog)
{
    if (!out || n_vocab <= 0 || !bytes || !lens)
        return RKV_EINVAL;
    *out = NULL;
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return RKV_ENOMEM;
    static uint64_t next_id;
    v->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    v->n = n_vocab;
    v->n_words = ((uint32_t)n_vocab + 31) / 32;
    uint64_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        total += lens[i];
    v->byte_off = malloc(((size_t)n_vocab + 1) * sizeof *v->byte_off);
    v->blob = malloc(total ? total : 1);
    v->eog = calloc((size_t)n_vocab, 1);
    v->toks = malloc((size_t)n_vocab * sizeof *v->toks);
    int32_t *order = malloc((size_t)n_vocab * sizeof *order);
    /* trie under construction: first child / next sibling / last child */
    size_t max_nodes = total + 1;
    uint32_t *first = NULL, *next = NULL, *lastc = NULL, *cnt_tok = NULL;
    uint8_t *byte = NULL;
    int rc = RKV_ENOMEM;
    if (!v->byte_off || !v->blob || !v->eog || !v->toks || !order)
        goto fail;
    uint64_t off = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->byte_off[i] = off;
        if (lens[i]) {
            if (!bytes[i]) {
                rc = RKV_EINVAL;
                goto fail;
            }
            memcpy(v->blob + off, bytes[i], lens[i]);
        }
        off += lens[i];
        v->eog[i] = eog ? (eog[i] != 0) : 0;
        if (v->eog[i])
            v->n_eog++;
    }
    v->byte_off[n_vocab] = off;
    v->eog_ids = malloc((size_t)(v->n_eog ? v->n_eog : 1) * sizeof *v->eog_ids);
    first = malloc(max_nodes * sizeof *first);
    next = malloc(max_nodes * sizeof *next);
    lastc = malloc(max_nodes * sizeof *lastc);
    cnt_tok = calloc(max_nodes, sizeof *cnt_tok);
    byte = malloc(max_nodes);
    if (!v->eog_ids || !first || !next || !lastc || !cnt_tok || !byte)
        goto fail;
    for (int32_t i = 0, k = 0; i < n_vocab; i++)
        if (v->eog[i])
            v->eog_ids[k++] = i;
    int32_t n_sorted = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (lens[i] && !v->eog[i])
            order[n_sorted++] = i;
    qsort_r(order, (size_t)n_sorted, sizeof *order, cmp_tok_bytes, v);
    /* insert in sorted order: a new child is always its parent's last one */
    uint32_t nn = 1;
    first[0] = next[0] = lastc[0] = UINT32_MAX;
    uint32_t *end_node = malloc((size_t)n_vocab * sizeof *end_node);
    if (!end_node)
        goto fail;
    for (int32_t k = 0; k < n_sorted; k++) {
        int32_t id = order[k];
        const uint8_t *s = (const uint8_t *)v->blob + v->byte_off[id];
        uint64_t l = v->byte_off[id + 1] - v->byte_off[id];
        uint32_t node = 0;
        for (uint64_t j = 0; j < l; j++) {
            uint32_t c = lastc[node];
            if (c == UINT32_MAX || byte[c] != s[j]) {
                c = nn++;
                byte[c] = s[j];
                first[c] = next[c] = lastc[c] = UINT32_MAX;
                if (lastc[node] == UINT32_MAX)
                    first[node] = c;
                else
                    next[lastc[node]] = c;
                lastc[node] = c;
            }
            node = c;
        }
        end_node[k] = node;
        cnt_tok[node]++;
    }
    v->n_nodes = nn;
    v->child_off = malloc(((size_t)nn + 1) * sizeof *v->child_off);
    v->child_byte = malloc(nn);
    v->child_node = malloc((size_t)nn * sizeof *v->child_node);
    v->tok_off = malloc(((size_t)nn + 1) * sizeof *v->tok_off);
    if (!v->child_off || !v->child_byte || !v->child_node || !v->tok_off) {
        free(end_node);
        goto fail;
    }
    uint32_t co = 0, to = 0;
    for (uint32_t i = 0; i < nn; i++) {
        v->child_off[i] = co;
        for (uint32_t c = first[i]; c != UINT32_MAX; c = next[c]) {
            v->child_byte[co] = byte[c];
            v->child_node[co++] = c;
        }
        v->tok_off[i] = to;
        to += cnt_tok[i];
        cnt_tok[i] = v->tok_off[i]; /* fill cursor */
    }
    v->child_off[nn] = co;
    v->tok_off[nn] = to;
    for (int32_t k = 0; k < n_sorted; k++)
        v->toks[cnt_tok[end_node[k]]++] = order[k];
    free(end_node);
    rc = 0;
    *out = v;
    v = NULL;
fail:
    free(order);
    free(first);
    free(next);
    free(lastc);
    free(cnt_tok);
    free(byte);
    grammar_vocab_destroy(v);
    return rc;
}

/* ---- matcher ---- */

/* a stack is a cons list of grammar positions: node = (pos, parent); node 0 is the empty
 * stack (the grammar is complete). node 1 (WILD) stands for frames left out of a stack cut to
 * its top KEY_DEPTH ones: popping into it marks a set "wild". a set of stacks is a sorted list
 * of node ids, interned. */
#define WILD 1u
struct snode {
    uint32_t pos, parent, next, depth;
};

struct sset {
    uint32_t off, n; /* node ids in m->pool[off .. off + n) */
    uint32_t next;   /* hash chain */
    uint32_t hash;
    int32_t *trans; /* 256 next set ids, -1 unknown; NULL until stepped */
    int32_t mask_slot;
    uint8_t live;    /* holds a stack that can consume more bytes */
    uint8_t can_end; /* holds the empty stack */
    uint8_t wild;    /* a stack popped below its cut (WILD) */
};

#define MASK_SLOTS 16

struct grammar_matcher {
    const struct grammar *g;
    const struct grammar_vocab *v;
    struct snode *nodes;
    size_t n_nodes, cap_nodes; /* cap in bytes */
    uint32_t *nbuckets;
    uint32_t n_nbuckets;
    uint32_t *marks; /* per node: the expansion pass that last visited it */
    size_t cap_marks;
    uint32_t gen;
    uint32_t work; /* stacks visited by this expansion pass (GRAMMAR_MAX_EXPAND) */
    struct sset *sets;
    size_t n_sets, cap_sets;
    uint32_t *sbuckets;
    uint32_t n_sbuckets;
    uint32_t *pool;
    size_t n_pool, cap_pool;
    size_t trans_bytes;
    uint32_t *tmp; /* expansion output */
    size_t n_tmp, cap_tmp;
    uint32_t *masks; /* MASK_SLOTS * n_words */
    uint32_t *key;   /* the current set's cache key */
    size_t n_key, cap_key;
    uint32_t key_hash;
    int32_t *deps; /* tokens to try from the current state */
    size_t n_deps, cap_deps;
    int32_t slot_owner[MASK_SLOTS];
    uint8_t slot_fallback[MASK_SLOTS];
    int next_slot;
    int32_t cur; /* current set id; 0 = dead */
    int32_t start;
    int finished;
    int oom;
};

#define NONE UINT32_MAX

static uint32_t hash2(uint32_t a, uint32_t b)
{
    uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u;
    return h ^ (h >> 15);
}

static int m_rehash_nodes(struct grammar_matcher *m, uint32_t nb)
{
    uint32_t *bk = malloc((size_t)nb * sizeof *bk);
    if (!bk)
        return RKV_ENOMEM;
    memset(bk, 0xFF, (size_t)nb * sizeof *bk);
    for (size_t i = 2; i < m->n_nodes; i++) {
        uint32_t h = hash2(m->nodes[i].pos, m->nodes[i].parent) & (nb - 1);
        m->nodes[i].next = bk[h];
        bk[h] = (uint32_t)i;
    }
    free(m->nbuckets);
    m->nbuckets = bk;
    m->n_nbuckets = nb;
    return 0;
}

/* the node (pos, parent), created when new; NONE on allocation failure */
static uint32_t m_node(struct grammar_matcher *m, uint32_t pos, uint32_t parent)
{
    uint32_t h = hash2(pos, parent) & (m->n_nbuckets - 1);
    for (uint32_t i = m->nbuckets[h]; i != NONE; i = m->nodes[i].next)
        if (m->nodes[i].pos == pos && m->nodes[i].parent == parent)
            return i;
    if (rkv_grow((void **)&m->nodes, &m->cap_nodes, (m->n_nodes + 1) * sizeof *m->nodes,
                 1024 * sizeof *m->nodes) ||
        rkv_grow((void **)&m->marks, &m->cap_marks, (m->n_nodes + 1) * sizeof *m->marks,
                 1024 * sizeof *m->marks)) {
        m->oom = 1;
        return NONE;
    }
    uint32_t id = (uint32_t)m->n_nodes++;
    m->nodes[id].pos = pos;
    m->nodes[id].parent = parent;
    m->nodes[id].depth = parent > WILD ? m->nodes[parent].depth + 1 : 1;
    m->nodes[id].next = m->nbuckets[h];
    m->marks[id] = 0;
    m->nbuckets[h] = id;
    if (m->n_nodes > m->n_nbuckets && m_rehash_nodes(m, m->n_nbuckets * 2))
        m->oom = 1;
    return id;
}

static void m_out(struct grammar_matcher *m, uint32_t id)
{
    if (rkv_grow((void **)&m->tmp, &m->cap_tmp, (m->n_tmp + 1) * sizeof *m->tmp,
                 64 * sizeof *m->tmp)) {
        m->oom = 1;
        return;
    }
    m->tmp[m->n_tmp++] = id;
}

/* adds to m->tmp every stack whose top is a byte set, reachable from (pos, parent) without
 * consuming a byte */
static void m_expand(struct grammar_matcher *m, uint32_t pos, uint32_t parent)
{
    const struct grammar *g = m->g;
    /* an ambiguous grammar's parses can multiply with every byte: past the budget the pass
     * keeps what it has (fewer parses: every text it accepts is still the grammar's) */
    if (++m->work > GRAMMAR_MAX_EXPAND)
        return;
    for (;;) {
        const struct gelem *e = &g->elems[pos];
        if (e->kind == E_END) {
            if (parent <= WILD) {
                if (m->marks[parent] != m->gen) {
                    m->marks[parent] = m->gen;
                    m_out(m, parent);
                }
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        if (parent > WILD && m->nodes[parent].depth >= GRAMMAR_MAX_DEPTH)
            return;
        uint32_t id = m_node(m, pos, parent);
        if (id == NONE || m->marks[id] == m->gen)
            return;
        m->marks[id] = m->gen;
        if (e->kind == E_BYTES) {
            m_out(m, id);
            return;
        }
        /* a reference: the continuation, then each alternative of the rule */
        uint32_t cont = parent;
        if (g->elems[pos + 1].kind != E_END) {
            cont = m_node(m, pos + 1, parent);
            if (cont == NONE)
                return;
        }
        uint32_t r = e->arg;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            m_expand(m, g->alt_start[a], cont);
        return;
    }
}

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* the set of m->tmp (sorted, unique: marks deduplicate) interned; -1 on allocation failure */
static int32_t m_intern_tmp(struct grammar_matcher *m)
{
    if (m->oom)
        return -1;
    if (m->n_tmp == 0)
        return 0;
    if (m->n_tmp > 1)
        qsort(m->tmp, m->n_tmp, sizeof *m->tmp, cmp_u32);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < m->n_tmp; i++)
        h = (h ^ m->tmp[i]) * 16777619u;
    uint32_t b = h & (m->n_sbuckets - 1);
    for (uint32_t i = m->sbuckets[b]; i != NONE; i = m->sets[i].next) {
        const struct sset *s = &m->sets[i];
        if (s->hash == h && s->n == m->n_tmp &&
            !memcmp(m->pool + s->off, m->tmp, m->n_tmp * sizeof *m->tmp))
            return (int32_t)i;
    }
    if (rkv_grow((void **)&m->sets, &m->cap_sets, (m->n_sets + 1) * sizeof *m->sets,
                 256 * sizeof *m->sets) ||
        rkv_grow((void **)&m->pool, &m->cap_pool, (m->n_pool + m->n_tmp) * sizeof *m->pool,
                 1024 * sizeof *m->pool)) {
        m->oom = 1;
        return -1;
    }
    struct sset *s = &m->sets[m->n_sets];
    memset(s, 0, sizeof *s);
    s->off = (uint32_t)m->n_pool;
    s->n = (uint32_t)m->n_tmp;
    s->hash = h;
    s->mask_slot = -1;
    memcpy(m->pool + m->n_pool, m->tmp, m->n_tmp * sizeof *m->tmp);
    m->n_pool += m->n_tmp;
    for (size_t i = 0; i < m->n_tmp; i++) {
        if (m->tmp[i] == 0)
            s->can_end = 1;
        else if (m->tmp[i] == WILD)
            s->wild = 1;
        else
            s->live = 1;
    }
    s->next = m->sbuckets[b];
    m->sbuckets[b] = (uint32_t)m->n_sets;
    if (m->n_sets + 1 > m->n_sbuckets) {
        uint32_t nb = m->n_sbuckets * 2;
        uint32_t *bk = malloc((size_t)nb * sizeof *bk);
        if (!bk) {
            m->oom = 1;
            return -1;
        }
        memset(bk, 0xFF, (size_t)nb * sizeof *bk);
        for (size_t i = 1; i <= m->n_sets; i++) {
            uint32_t bb = m->sets[i].hash & (nb - 1);
            m->sets[i].next = bk[bb];
            bk[bb] = (uint32_t)i;
        }
        free(m->sbuckets);
        m->sbuckets = bk;
        m->n_sbuckets = nb;
    }
    return (int32_t)m->n_sets++;
}

/* the set after byte c from set s (0: dead); -1 on allocation failure */
static int32_t m_step(struct grammar_matcher *m, int32_t s, uint8_t c)
{
    if (s <= 0)
        return s;
    struct sset *st = &m->sets[s];
    if (st->trans && st->trans[c] >= 0)
        return st->trans[c];
    if (!st->live)
        return 0;
    m->gen++;
    m->work = 0;
    m->n_tmp = 0;
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t id = m->pool[m->sets[s].off + i];
        if (id <= WILD)
            continue;
        uint32_t pos = m->nodes[id].pos;
        const uint32_t *set = m->g->sets[m->g->elems[pos].arg];
        if (set[c >> 5] >> (c & 31) & 1)
            m_expand(m, pos + 1, m->nodes[id].parent);
    }
    int32_t t = m_intern_tmp(m);
    if (t < 0)
        return -1;
    st = &m->sets[s]; /* m->sets may have moved */
    if (!st->trans) {
        st->trans = malloc(256 * sizeof *st->trans);
        if (!st->trans)
            return t;
        memset(st->trans, 0xFF, 256 * sizeof *st->trans);
        m->trans_bytes += 256 * sizeof *st->trans;
    }
    st->trans[c] = t;
    return t;
}

static void m_clear(struct grammar_matcher *m)
{
    for (size_t i = 0; i < m->n_sets; i++)
        free(m->sets[i].trans);
    m->n_sets = 1; /* set 0: dead */
    memset(&m->sets[0], 0, sizeof m->sets[0]);
    m->sets[0].mask_slot = -1;
    m->n_pool = 0;
    m->trans_bytes = 0;
    m->n_nodes = 2; /* node 0: the empty stack; node 1: WILD */
    m->nodes[0] = (struct snode){NONE, 0, NONE, 0};
    m->nodes[1] = (struct snode){NONE, 0, NONE, 0};
    memset(m->nbuckets, 0xFF, m->n_nbuckets * sizeof *m->nbuckets);
    memset(m->sbuckets, 0xFF, m->n_sbuckets * sizeof *m->sbuckets);
    for (int i = 0; i < MASK_SLOTS; i++)
        m->slot_owner[i] = -1;
    m->gen = 1;
    m->marks[0] = m->marks[1] = 0;
}

static int32_t m_start_set(struct grammar_matcher *m)
{
    const struct grammar *g = m->g;
    m->gen++;
    m->work = 0;
    m->n_tmp = 0;
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        m_expand(m, g->alt_start[a], 0);
    return m_intern_tmp(m);
}

/* past the cache budget: drop every table and re-intern the current stacks */
static int m_maybe_flush(struct grammar_matcher *m)
{
    size_t bytes = m->n_nodes * sizeof(struct snode) + m->n_sets * sizeof(struct sset) +
                   m->n_pool * 4 + m->trans_bytes;
    if (bytes < GRAMMAR_CACHE_BYTES && !m->oom)
        return 0;
    /* copy the current stacks out as position lists, top first */
    const struct sset *s = &m->sets[m->cur];
    size_t n_st = s->n, total = 0;
    for (size_t i = 0; i < n_st; i++) {
        uint32_t id = m->pool[s->off + i];
        total += id ? m->nodes[id].depth : 0;
    }
    uint32_t *pos = malloc((total + 1) * sizeof *pos);
    uint32_t *len = malloc((n_st + 1) * sizeof *len);
    if (!pos || !len) {
        free(pos);
        free(len);
        return RKV_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_st; i++) {
        uint32_t id = m->pool[s->off + i];
        len[i] = id ? m->nodes[id].depth : 0;
        for (; id; id = m->nodes[id].parent)
            pos[k++] = m->nodes[id].pos;
    }
    m->oom = 0;
    m_clear(m);
    m->start = m_start_set(m);
    m->n_tmp = 0;
    k = 0;
    for (size_t i = 0; i < n_st; i++) {
        uint32_t id = 0;
        for (uint32_t j = len[i]; j-- > 0;)
            id = m_node(m, pos[k + j], id);
        k += len[i];
        m_out(m, id);
    }
    free(pos);
    free(len);
    m->cur = m_intern_tmp(m);
    return m->cur < 0 || m->start < 0 ? RKV_ENOMEM : 0;
}

void grammar_matcher_destroy(struct grammar_matcher *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_sets; i++)
        free(m->sets[i].trans);
    free(m->nodes);
    free(m->nbuckets);
    free(m->marks);
    free(m->sets);
    free(m->sbuckets);
    free(m->pool);
    free(m->tmp);
    free(m->masks);
    free(m->key);
    free(m->deps);
    free(m);
}

int grammar_matcher_create(struct grammar_matcher **out, const struct grammar *g,
                           const struct grammar_vocab *v)
{
    if (!out || !g || !v)
        return RKV_EINVAL;
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return RKV_ENOMEM;
    m->g = g;
    m->v = v;
    m->n_nbuckets = 1024;
    m->n_sbuckets = 256;
    m->nbuckets = malloc(m->n_nbuckets * sizeof *m->nbuckets);
    m->sbuckets = malloc(m->n_sbuckets * sizeof *m->sbuckets);
    m->masks = malloc((size_t)MASK_SLOTS * v->n_words * sizeof *m->masks);
    if (!m->nbuckets || !m->sbuckets || !m->masks ||
        rkv_grow((void **)&m->nodes, &m->cap_nodes, 1024 * sizeof *m->nodes, 0) ||
        rkv_grow((void **)&m->marks, &m->cap_marks, 1024 * sizeof *m->marks, 0) ||
        rkv_grow((void **)&m->sets, &m->cap_sets, 256 * sizeof *m->sets, 0)) {
        grammar_matcher_destroy(m);
        return RKV_ENOMEM;
    }
    m_clear(m);
    m->start = m->cur = m_start_set(m);
    if (m->cur < 0) {
        grammar_matcher_destroy(m);
        return RKV_ENOMEM;
    }
    *out = m;
    return 0;
}

void grammar_matcher_reset(struct grammar_matcher *m)
{
    m->cur = m->start;
    m->finished = 0;
}

int grammar_matcher_can_end(const struct grammar_matcher *m)
{
    return !m->finished && m->cur > 0 && m->sets[m->cur].can_end;
}

int grammar_matcher_must_end(const struct grammar_matcher *m)
{
    return !m->finished && m->cur > 0 && m->sets[m->cur].can_end && !m->sets[m->cur].live;
}

struct walk {
    struct grammar_matcher *m;
    uint32_t *mask;
};

/* every token at trie node `node` and below goes to m->deps */
static void walk_collect(struct walk *w, uint32_t node)
{
    struct grammar_matcher *m = w->m;
    const struct grammar_vocab *v = m->v;
    uint32_t i0 = v->tok_off[node], i1 = v->tok_off[node + 1];
    if (i0 < i1) {
        if (rkv_grow((void **)&m->deps, &m->cap_deps, (m->n_deps + i1 - i0) * sizeof *m->deps,
                     1024 * sizeof *m->deps)) {
            m->oom = 1;
            return;
        }
        memcpy(m->deps + m->n_deps, v->toks + i0, (i1 - i0) * sizeof *m->deps);
        m->n_deps += i1 - i0;
    }
    for (uint32_t k = v->child_off[node]; k < v->child_off[node + 1]; k++)
        walk_collect(w, v->child_node[k]);
}

/* marks the tokens set s allows; a subtree whose prefix pops below the cut goes to deps */
static void walk_trie(struct walk *w, uint32_t node, int32_t s)
{
    struct grammar_matcher *m = w->m;
    const struct grammar_vocab *v = m->v;
    const int32_t *tr = m->sets[s].trans;
    for (uint32_t k = v->child_off[node], ke = v->child_off[node + 1]; k < ke; k++) {
        int32_t t = tr ? tr[v->child_byte[k]] : -1;
        if (t < 0) {
            t = m_step(m, s, v->child_byte[k]);
            tr = m->sets[s].trans; /* stepping may have allocated it */
        }
        if (t <= 0)
            continue;
        uint32_t c = v->child_node[k];
        if (m->sets[t].wild) {
            walk_collect(w, c);
            continue;
        }
        for (uint32_t i = v->tok_off[c], i1 = v->tok_off[c + 1]; i < i1; i++) {
            int32_t id = v->toks[i];
            w->mask[id >> 5] |= 1u << (id & 31);
        }
        if (v->child_off[c] < v->child_off[c + 1] && m->sets[t].live)
            walk_trie(w, c, t);
    }
}

static int cmp_rec(const void *x, const void *y)
{
    return memcmp(x, y, (KEY_DEPTH + 2) * sizeof(uint32_t));
}

/* the cache key of set s: one record (depth, cut, top KEY_DEPTH positions) per stack,
 * sorted and unique, in m->key; 0 or RKV_ENOMEM */
static int m_key(struct grammar_matcher *m, int32_t s)
{
    const size_t R = KEY_DEPTH + 2;
    const struct sset *st = &m->sets[s];
    if (rkv_grow((void **)&m->key, &m->cap_key, st->n * R * sizeof *m->key, 64 * sizeof *m->key))
        return RKV_ENOMEM;
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t *rec = m->key + i * R, x = m->pool[st->off + i], len = 0;
        for (size_t j = 2; j < R; j++)
            rec[j] = NONE;
        while (x > WILD && len < KEY_DEPTH) {
            rec[2 + len++] = m->nodes[x].pos;
            x = m->nodes[x].parent;
        }
        rec[0] = len;
        rec[1] = x > WILD;
    }
    qsort(m->key, st->n, R * sizeof *m->key, cmp_rec);
    size_t n = 0;
    for (uint32_t i = 0; i < st->n; i++)
        if (!n || cmp_rec(m->key + (n - 1) * R, m->key + i * R))
            memmove(m->key + n++ * R, m->key + i * R, R * sizeof *m->key);
    m->n_key = n * R;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < m->n_key; i++)
        h = (h ^ m->key[i]) * 16777619u;
    m->key_hash = h;
    return 0;
}

/* the set of m->key's stacks, each cut to its top frames over WILD */
static int32_t m_cut_set(struct grammar_matcher *m)
{
    const size_t R = KEY_DEPTH + 2;
    m->n_tmp = 0;
    for (size_t i = 0; i < m->n_key; i += R) {
        const uint32_t *rec = m->key + i;
        uint32_t node = rec[1] ? WILD : 0;
        for (uint32_t j = rec[0]; j-- > 0 && node != NONE;)
            node = m_node(m, rec[2 + j], node);
        if (node == NONE)
            return -1;
        m_out(m, node);
    }
    return m_intern_tmp(m);
}

/* the shared entry for m->key into mask and m->deps; 1 on a hit */
static int cache_get(struct grammar_matcher *m, uint32_t *mask)
{
    struct grammar *g = (struct grammar *)m->g; /* the cache is the lock-guarded mutable part */
    const struct grammar_vocab *v = m->v;
    int hit = 0;
    pthread_mutex_lock(&g->lock);
    for (size_t i = 0; i < g->n_cache && !hit; i++) {
        const struct gcache *e = &g->cache[i];
        if (e->vocab_id != v->id || e->hash != m->key_hash || e->key_len != m->n_key ||
            memcmp(e->key, m->key, m->n_key * sizeof *m->key))
            continue;
        if (rkv_grow((void **)&m->deps, &m->cap_deps, e->n_deps * sizeof *m->deps,
                     1024 * sizeof *m->deps))
            break;
        memcpy(mask, e->bits, v->n_words * sizeof *mask);
        if (e->n_deps)
            memcpy(m->deps, e->deps, e->n_deps * sizeof *m->deps);
        m->n_deps = e->n_deps;
        hit = 1;
    }
    pthread_mutex_unlock(&g->lock);
    return hit;
}

static void cache_put(struct grammar_matcher *m, const uint32_t *mask)
{
    struct grammar *g = (struct grammar *)m->g;
    const struct grammar_vocab *v = m->v;
    struct gcache e = {.vocab_id = v->id,
                       .key_len = (uint32_t)m->n_key,
                       .hash = m->key_hash,
                       .n_deps = (uint32_t)m->n_deps};
    e.key = malloc(m->n_key * sizeof *e.key);
    e.bits = malloc(v->n_words * sizeof *e.bits);
    e.deps = malloc((m->n_deps ? m->n_deps : 1) * sizeof *e.deps);
    if (!e.key || !e.bits || !e.deps)
        goto drop;
    memcpy(e.key, m->key, m->n_key * sizeof *e.key);
    memcpy(e.bits, mask, v->n_words * sizeof *e.bits);
    if (m->n_deps)
        memcpy(e.deps, m->deps, m->n_deps * sizeof *e.deps);
    pthread_mutex_lock(&g->lock);
    if (g->n_cache >= CACHE_ENTRIES) {
        /* full: start over (the states a schema visits are few; churn means many grammars) */
        for (size_t i = 0; i < g->n_cache; i++) {
            free(g->cache[i].key);
            free(g->cache[i].bits);
            free(g->cache[i].deps);
        }
        g->n_cache = 0;
    }
    int ok = !rkv_grow((void **)&g->cache, &g->cap_cache, (g->n_cache + 1) * sizeof *g->cache,
                       16 * sizeof *g->cache);
    if (ok)
        g->cache[g->n_cache++] = e;
    pthread_mutex_unlock(&g->lock);
    if (ok)
        return;
drop:
    free(e.key);
    free(e.bits);
    free(e.deps);
}

/* the set after bytes from set s; 0 when they do not continue the grammar */
static int32_t m_run_from(struct grammar_matcher *m, int32_t s, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n && s > 0; i++)
        s = m_step(m, s, p[i]);
    return s;
}

int grammar_matcher_mask(struct grammar_matcher *m, uint32_t *mask)
{
    if (!m || !mask)
        return RKV_EINVAL;
    const struct grammar_vocab *v = m->v;
    memset(mask, 0, v->n_words * sizeof *mask);
    if (m->finished)
        return 0;
    int rc = m_maybe_flush(m);
    if (rc)
        return rc;
    int32_t s = m->cur;
    int32_t slot = m->sets[s].mask_slot;
    if (slot >= 0 && m->slot_owner[slot] == s) {
        memcpy(mask, m->masks + (size_t)slot * v->n_words, v->n_words * sizeof *mask);
        return 0;
    }
    /* the tokens that stay within the top frames come from the shared cache (or a walk of
     * the cut set, then cached); those that reach below are tried from this state */
    m->n_deps = 0;
    if (m->sets[s].live) {
        if (m_key(m, s))
            return RKV_ENOMEM;
        if (!cache_get(m, mask)) {
            int32_t cut = m_cut_set(m);
            if (cut < 0)
                return RKV_ENOMEM;
            struct walk w = {.m = m, .mask = mask};
            walk_trie(&w, 0, cut);
            if (m->oom)
                return RKV_ENOMEM;
            cache_put(m, mask);
        }
        for (size_t i = 0; i < m->n_deps; i++) {
            int32_t id = m->deps[i];
            const uint8_t *b = (const uint8_t *)v->blob + v->byte_off[id];
            if (m_run_from(m, s, b, v->byte_off[id + 1] - v->byte_off[id]) > 0)
                mask[id >> 5] |= 1u << (id & 31);
        }
        if (m->oom)
            return RKV_ENOMEM;
    }
    int any = 0;
    for (uint32_t i = 0; i < v->n_words && !any; i++)
        any = mask[i] != 0;
    int fallback = !any && !m->sets[s].can_end;
    if (m->sets[s].can_end || fallback)
        for (int32_t i = 0; i < v->n_eog; i++)
            mask[v->eog_ids[i] >> 5] |= 1u << (v->eog_ids[i] & 31);
    slot = m->next_slot;
    m->next_slot = (m->next_slot + 1) % MASK_SLOTS;
    m->slot_owner[slot] = s;
    m->slot_fallback[slot] = (uint8_t)fallback;
    m->sets[s].mask_slot = slot;
    memcpy(m->masks + (size_t)slot * v->n_words, mask, v->n_words * sizeof *mask);
    return 0;
}

int grammar_matcher_accept(struct grammar_matcher *m, int32_t id)
{
    if (!m || id < 0 || id >= m->v->n || m->finished)
        return RKV_EINVAL;
    int rc = m_maybe_flush(m);
    if (rc)
        return rc;
    const struct grammar_vocab *v = m->v;
    if (v->eog[id]) {
        int32_t slot = m->sets[m->cur].mask_slot;
        int fallback = slot >= 0 && m->slot_owner[slot] == m->cur && m->slot_fallback[slot];
        if (!m->sets[m->cur].can_end && !fallback)
            return RKV_EINVAL;
        m->finished = 1;
        return 0;
    }
    uint64_t l = v->byte_off[id + 1] - v->byte_off[id];
    if (!l)
        return RKV_EINVAL;
    int32_t s = m_run_from(m, m->cur, (const uint8_t *)v->blob + v->byte_off[id], l);
    if (s < 0)
        return RKV_ENOMEM;
    if (s == 0)
        return RKV_EINVAL;
    m->cur = s;
    return 0;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *bytes, size_t len)
{
    if (!m || (!bytes && len) || m->finished)
        return RKV_EINVAL;
    int rc = m_maybe_flush(m);
    if (rc)
        return rc;
    int32_t s = m_run_from(m, m->cur, (const uint8_t *)bytes, len);
    if (s < 0)
        return RKV_ENOMEM;
    if (s == 0)
        return RKV_EINVAL;
    m->cur = s;
    return 0;
}
