/* jinja.c - a Jinja2 subset interpreter for chat templates: lexer, parser, renderer. */
#include "common/jinja.h"

#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/err.h"

/* errors leave a parse or a render by longjmp: everything either allocates
 * lives in one arena, freed whole by the function that set the jump, so
 * nothing leaks and no error path needs its own cleanup. */

/* --- errors ---------------------------------------------------------------- */

struct jerr {
    jmp_buf jb;
    int code;
    char *buf;
    size_t len;
    const char *name; /* "chat template" */
    int line, col;    /* where a render is, for errors raised below the tree walk */
};

static _Noreturn void jfailv(struct jerr *e, int code, int line, int col, const char *fmt,
                             va_list ap)
{
    e->code = code;
    if (line <= 0 && e->line > 0) {
        line = e->line;
        col = e->col;
    }
    if (e->buf && e->len) {
        int n = line > 0 ? snprintf(e->buf, e->len, "%s line %d, column %d: ", e->name, line, col)
                         : snprintf(e->buf, e->len, "%s: ", e->name);
        if (n >= 0 && (size_t)n < e->len)
            vsnprintf(e->buf + n, e->len - (size_t)n, fmt, ap);
    }
    longjmp(e->jb, 1);
}

static _Noreturn void jfail(struct jerr *e, int code, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jfailv(e, code, line, col, fmt, ap);
}

/* --- arena ----------------------------------------------------------------- */

struct chunk {
    struct chunk *next;
    size_t cap, used;
    _Alignas(max_align_t) unsigned char data[];
};

struct arena {
    struct chunk *head;
    size_t total, cap; /* bytes taken from malloc, the most allowed */
    struct jerr *err;  /* set: running out jumps there instead of returning NULL */
};

static void arena_fini(struct arena *a)
{
    struct chunk *c = a->head;
    while (c) {
        struct chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

static void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 - sizeof *c ? n : 65536 - sizeof *c;
        if (n > SIZE_MAX / 2 || (a->cap && a->total + cap > a->cap)) {
            if (a->err)
                jfail(a->err, RKV_ETOOBIG, 0, 0, "render exceeded its memory limit (%zu bytes)",
                      a->cap);
            return NULL;
        }
        c = malloc(sizeof *c + cap);
        if (!c) {
            if (a->err)
                jfail(a->err, RKV_ENOMEM, 0, 0, "out of memory");
            return NULL;
        }
        c->cap = cap;
        c->used = 0;
        a->total += cap;
        /* a big block goes behind the current one so its free tail stays usable */
        if (a->head && cap > 65536 - sizeof *c) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

static void *arena_zalloc(struct arena *a, size_t n)
{
    void *p = arena_alloc(a, n);
    if (p)
        memset(p, 0, n);
    return p;
}

/* --- values ---------------------------------------------------------------- */

enum jt {
    JT_UNDEF = 0,
    JT_NONE,
    JT_BOOL,
    JT_INT,
    JT_FLOAT,
    JT_STR,
    JT_LIST,
    JT_DICT,
    JT_NS,     /* namespace(): a dict whose attributes can be set */
    JT_MACRO,  /* a macro or a call block's caller */
    JT_FUNC,   /* a global function: range, namespace, ... */
    JT_METHOD, /* a bound str/dict/list method, or loop.cycle */
    JT_LOOP,
    JT_MISSING /* an argument not given (internal) */
};

struct jstr {
    size_t n;
    char s[]; /* n bytes and a NUL */
};
struct jlist;
struct jdict;
struct jmacro;
struct jmethod;
struct jloop;

struct jv {
    uint8_t t;
    uint8_t tuple; /* JT_LIST: a Python tuple (prints with parentheses) */
    uint16_t fn;   /* JT_FUNC: which function */
    union {
        int64_t i; /* JT_BOOL, JT_INT */
        double f;
        struct jstr *s;
        struct jlist *l;
        struct jdict *d; /* JT_DICT, JT_NS */
        struct jmacro *m;
        struct jmethod *me;
        struct jloop *lp;
        const char *name; /* JT_UNDEF: what was undefined, for messages; may be NULL */
    } u;
};

struct jlist {
    size_t n, cap;
    struct jv *v;
};
struct jdict {
    size_t n, cap;
    struct jv *k, *v;
};

struct jinja_val {
    struct jv v;
};

static const struct jv UNDEF = {.t = JT_UNDEF};
static const struct jv NONE = {.t = JT_NONE};
static const struct jv MISSING = {.t = JT_MISSING};

static struct jv mk_bool(int b)
{
    struct jv v = {.t = JT_BOOL};
    v.u.i = b != 0;
    return v;
}
static struct jv mk_int(int64_t i)
{
    struct jv v = {.t = JT_INT};
    v.u.i = i;
    return v;
}
static struct jv mk_float(double f)
{
    struct jv v = {.t = JT_FLOAT};
    v.u.f = f;
    return v;
}
static struct jv mk_undef(const char *name)
{
    struct jv v = {.t = JT_UNDEF};
    v.u.name = name;
    return v;
}

static struct jstr *str_new(struct arena *a, const char *s, size_t n)
{
    struct jstr *r = arena_alloc(a, sizeof *r + n + 1);
    if (!r)
        return NULL;
    r->n = n;
    if (n)
        memcpy(r->s, s, n);
    r->s[n] = 0;
    return r;
}

static struct jv mk_str(struct arena *a, const char *s, size_t n)
{
    struct jv v = {.t = JT_STR};
    v.u.s = str_new(a, s, n);
    return v;
}

static struct jlist *list_new(struct arena *a, size_t cap)
{
    struct jlist *l = arena_zalloc(a, sizeof *l);
    if (!l)
        return NULL;
    if (cap) {
        l->v = arena_alloc(a, cap * sizeof *l->v);
        if (!l->v)
            return NULL;
        l->cap = cap;
    }
    return l;
}

static int list_push(struct arena *a, struct jlist *l, struct jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jv *nv = arena_alloc(a, cap * sizeof *nv);
        if (!nv)
            return RKV_ENOMEM;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

static struct jv mk_list(struct jlist *l, int tuple)
{
    struct jv v = {.t = JT_LIST, .tuple = (uint8_t)tuple};
    v.u.l = l;
    return v;
}

static struct jdict *dict_new(struct arena *a)
{
    return arena_zalloc(a, sizeof(struct jdict));
}

static struct jv mk_dict(struct jdict *d)
{
    struct jv v = {.t = JT_DICT};
    v.u.d = d;
    return v;
}

static bool v_eq(struct jv a, struct jv b);

static long dict_find(const struct jdict *d, struct jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (v_eq(d->k[i], k))
            return (long)i;
    return -1;
}

static long dict_find_str(const struct jdict *d, const char *s, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JT_STR && d->k[i].u.s->n == n && !memcmp(d->k[i].u.s->s, s, n))
            return (long)i;
    return -1;
}

/* k is not in d yet */
static int dict_append(struct arena *a, struct jdict *d, struct jv k, struct jv v)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct jv *nk = arena_alloc(a, cap * sizeof *nk), *nv = arena_alloc(a, cap * sizeof *nv);
        if (!nk || !nv)
            return RKV_ENOMEM;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

static int dict_set(struct arena *a, struct jdict *d, struct jv k, struct jv v)
{
    long at = dict_find(d, k);
    if (at >= 0) {
        d->v[at] = v;
        return 0;
    }
    return dict_append(a, d, k, v);
}

static bool is_num(struct jv v)
{
    return v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL;
}
static double num_f(struct jv v)
{
    return v.t == JT_FLOAT ? v.u.f : (double)v.u.i;
}

/* Python's ==; containers compare their items as CPython does (one item the same object as
 * the other: equal without looking inside). Nesting past what a template can build by
 * literals ends the walk as unequal: a list nested 100000 deep by a loop overflowed the stack */
static bool v_eq_at(struct jv a, struct jv b, int depth);

static bool v_eq(struct jv a, struct jv b)
{
    return v_eq_at(a, b, 0);
}

static bool v_eq_at(struct jv a, struct jv b, int depth)
{
    if (depth > JINJA_MAX_NESTING * 2)
        return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT)
            return a.u.i == b.u.i;
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JT_UNDEF:
    case JT_NONE: return true;
    case JT_STR: return a.u.s->n == b.u.s->n && !memcmp(a.u.s->s, b.u.s->s, a.u.s->n);
    case JT_LIST:
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n)
            return false;
        if (a.u.l == b.u.l)
            return true;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!v_eq_at(a.u.l->v[i], b.u.l->v[i], depth + 1))
                return false;
        return true;
    case JT_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        if (a.u.d == b.u.d)
            return true;
        for (size_t i = 0; i < a.u.d->n; i++) {
            long j = dict_find(b.u.d, a.u.d->k[i]);
            if (j < 0 || !v_eq_at(a.u.d->v[i], b.u.d->v[j], depth + 1))
                return false;
        }
        return true;
    case JT_NS: return a.u.d == b.u.d;
    case JT_MACRO: return a.u.m == b.u.m;
    case JT_FUNC: return a.fn == b.fn;
    case JT_METHOD: return a.u.me == b.u.me;
    case JT_LOOP: return a.u.lp == b.u.lp;
    default: return false;
    }
}

static bool truthy(struct jv v)
{
    switch (v.t) {
    case JT_UNDEF:
    case JT_NONE:
    case JT_MISSING: return false;
    case JT_BOOL:
    case JT_INT: return v.u.i != 0;
    case JT_FLOAT: return v.u.f != 0.0;
    case JT_STR: return v.u.s->n != 0;
    case JT_LIST: return v.u.l->n != 0;
    case JT_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static const char *type_name(struct jv v)
{
    switch (v.t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST: return v.tuple ? "tuple" : "list";
    case JT_DICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_MACRO: return "Macro";
    case JT_LOOP: return "LoopContext";
    default: return "function";
    }
}

/* --- unicode --------------------------------------------------------------- */

/* decodes one code point at s (n > 0 bytes left); a bad byte reads as itself */
static size_t u8_dec(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (!len || len > n) {
        *cp = c;
        return 1;
    }
    uint32_t v = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *cp = c;
            return 1;
        }
        v = v << 6 | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

static size_t u8_enc(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Python's str.isspace() */
static bool u_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* the line breaks of Python's str.splitlines() */
static bool u_linebreak(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
           c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
}

static bool ascii_only(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

/* byte offsets of each code point of s, plus n at the end; *count code points */
static size_t *u8_offsets(struct arena *a, const char *s, size_t n, size_t *count)
{
    size_t *off = arena_alloc(a, (n + 1) * sizeof *off), k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        off[k++] = i;
        i += u8_dec((const unsigned char *)s + i, n - i, &cp);
    }
    off[k] = n;
    *count = k;
    return off;
}

static size_t u8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += u8_dec((const unsigned char *)s + i, n - i, &cp);
        k++;
    }
    return k;
}

/* --- text buffer ----------------------------------------------------------- */

struct sbuf {
    struct arena *a;
    char *p;
    size_t n, cap, max; /* max: 0 = none */
    struct jerr *err;
};

static void sb_init(struct sbuf *b, struct arena *a, size_t max, struct jerr *err)
{
    memset(b, 0, sizeof *b);
    b->a = a;
    b->max = max;
    b->err = err;
}

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        if (b->max && b->n + n > b->max)
            jfail(b->err, RKV_ETOOBIG, 0, 0, "render exceeded its output limit (%zu bytes)",
                  b->max);
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = arena_alloc(b->a, cap);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(struct sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static struct jv sb_val(struct sbuf *b)
{
    struct jv v = {.t = JT_STR};
    v.u.s = str_new(b->a, b->p ? b->p : "", b->n);
    return v;
}

/* --- printing: Python's str(), repr() and json.dumps ------------------------ */

/* Python's repr(float): the shortest text that reads back the same */
static void fmt_float(double x, char *out, size_t cap)
{
    if (isnan(x)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(out, cap, x < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    /* buf: [-]d[.ddd]e[+-]xx */
    char digits[24];
    size_t nd = 0;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = out;
    char *end = out + cap - 1;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (o < end)                                                                               \
            *o++ = (c);                                                                            \
    } while (0)
    if (neg)
        PUT('-');
    if (e < -4 || e >= 16) {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (size_t i = 1; i < nd; i++)
                PUT(digits[i]);
        }
        char eb[8];
        snprintf(eb, sizeof eb, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        for (char *q = eb; *q; q++)
            PUT(*q);
    } else if (e >= 0) {
        for (int i = 0; i <= e; i++)
            PUT((size_t)i < nd ? digits[i] : '0');
        PUT('.');
        if ((size_t)e + 1 < nd)
            for (size_t i = (size_t)e + 1; i < nd; i++)
                PUT(digits[i]);
        else
            PUT('0');
    } else {
        PUT('0');
        PUT('.');
        for (int i = 0; i < -e - 1; i++)
            PUT('0');
        for (size_t i = 0; i < nd; i++)
            PUT(digits[i]);
    }
#undef PUT
    *o = 0;
}

/* Python's str.isprintable() for the code points repr() escapes */
static bool u_printable(uint32_t c)
{
    if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad)
        return false;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
        (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff ||
        (c >= 0xfff9 && c <= 0xfffb) || (c >= 0xd800 && c <= 0xdfff) ||
        (c >= 0xe000 && c <= 0xf8ff))
        return false;
    return true;
}

static void repr_str(struct sbuf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t l = u8_dec((const unsigned char *)s + i, n - i, &c);
        char tmp[16];
        if (c == (uint32_t)q || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            sb_put(b, tmp, 2);
        } else if (c == '\n') {
            sb_put(b, "\\n", 2);
        } else if (c == '\r') {
            sb_put(b, "\\r", 2);
        } else if (c == '\t') {
            sb_put(b, "\\t", 2);
        } else if (!u_printable(c)) {
            if (c < 0x100)
                snprintf(tmp, sizeof tmp, "\\x%02x", c);
            else if (c < 0x10000)
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
            else
                snprintf(tmp, sizeof tmp, "\\U%08x", c);
            sb_puts(b, tmp);
        } else {
            sb_put(b, s + i, l);
        }
        i += l;
    }
    sb_put(b, &q, 1);
}

static void v_repr(struct sbuf *b, struct jv v, int depth);

/* Python's str(v) */
static void v_str(struct sbuf *b, struct jv v, int depth)
{
    char tmp[40];
    switch (v.t) {
    case JT_UNDEF:
    case JT_MISSING: return;
    case JT_NONE: sb_put(b, "None", 4); return;
    case JT_BOOL: sb_puts(b, v.u.i ? "True" : "False"); return;
    case JT_INT: sb_printf(b, "%lld", (long long)v.u.i); return;
    case JT_FLOAT:
        fmt_float(v.u.f, tmp, sizeof tmp);
        sb_puts(b, tmp);
        return;
    case JT_STR: sb_put(b, v.u.s->s, v.u.s->n); return;
    default: v_repr(b, v, depth); return;
    }
}

static void v_repr(struct sbuf *b, struct jv v, int depth)
{
    if (depth > JINJA_MAX_NESTING * 2)
        jfail(b->err, RKV_ETOOBIG, 0, 0, "value nested too deeply to print");
    switch (v.t) {
    case JT_STR: repr_str(b, v.u.s->s, v.u.s->n); return;
    case JT_LIST:
        sb_put(b, v.tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_put(b, ", ", 2);
            v_repr(b, v.u.l->v[i], depth + 1);
        }
        if (v.tuple && v.u.l->n == 1)
            sb_put(b, ",", 1);
        sb_put(b, v.tuple ? ")" : "]", 1);
        return;
    case JT_NS:
        sb_puts(b, "<Namespace ");
        /* fall through */
    case JT_DICT:
        sb_put(b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                sb_put(b, ", ", 2);
            v_repr(b, v.u.d->k[i], depth + 1);
            sb_put(b, ": ", 2);
            v_repr(b, v.u.d->v[i], depth + 1);
        }
        sb_put(b, "}", 1);
        if (v.t == JT_NS)
            sb_put(b, ">", 1);
        return;
    case JT_UNDEF: sb_puts(b, "Undefined"); return;
    case JT_MACRO: sb_puts(b, "<Macro>"); return;
    case JT_LOOP: sb_puts(b, "<LoopContext>"); return;
    case JT_FUNC:
    case JT_METHOD: sb_puts(b, "<function>"); return;
    default: v_str(b, v, depth); return;
    }
}

struct json_opts {
    bool ascii;      /* ensure_ascii */
    bool sort;       /* sort_keys */
    const char *ind; /* NULL: one line */
    size_t ind_n;
    const char *isep; /* between items */
    const char *ksep; /* between key and value */
};

static void json_str(struct sbuf *b, const char *s, size_t n, bool ascii)
{
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        char tmp[16];
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            sb_put(b, tmp, 2);
            i++;
        } else if (c < 0x20) {
            const char *e = c == '\n'   ? "\\n"
                            : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t"
                            : c == '\b' ? "\\b"
                            : c == '\f' ? "\\f"
                                        : NULL;
            if (e) {
                sb_put(b, e, 2);
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                sb_puts(b, tmp);
            }
            i++;
        } else if (c >= 0x80 && ascii) {
            uint32_t cp;
            i += u8_dec((const unsigned char *)s + i, n - i, &cp);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                         0xdc00 + (cp & 0x3ff));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            sb_puts(b, tmp);
        } else {
            size_t j = i + 1;
            while (j < n && (unsigned char)s[j] >= 0x20 && s[j] != '"' && s[j] != '\\' &&
                   !(ascii && (unsigned char)s[j] >= 0x80))
                j++;
            sb_put(b, s + i, j - i);
            i = j;
        }
    }
    sb_put(b, "\"", 1);
}

static void json_nl(struct sbuf *b, const struct json_opts *o, int level)
{
    sb_put(b, "\n", 1);
    for (int i = 0; i < level; i++)
        sb_put(b, o->ind, o->ind_n);
}

/* returns NULL, or the type name of what cannot be serialized */
static const char *json_val(struct sbuf *b, struct jv v, const struct json_opts *o, int level)
{
    char tmp[40];
    if (level > JINJA_MAX_NESTING * 2)
        return "(nested too deeply)";
    switch (v.t) {
    case JT_NONE: sb_puts(b, "null"); return NULL;
    case JT_BOOL: sb_puts(b, v.u.i ? "true" : "false"); return NULL;
    case JT_INT: sb_printf(b, "%lld", (long long)v.u.i); return NULL;
    case JT_FLOAT:
        if (isnan(v.u.f))
            sb_puts(b, "NaN");
        else if (isinf(v.u.f))
            sb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float(v.u.f, tmp, sizeof tmp);
            sb_puts(b, tmp);
        }
        return NULL;
    case JT_STR: json_str(b, v.u.s->s, v.u.s->n, o->ascii); return NULL;
    case JT_LIST: {
        const struct jlist *l = v.u.l;
        if (!l->n) {
            sb_put(b, "[]", 2);
            return NULL;
        }
        sb_put(b, "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                sb_puts(b, o->isep);
            if (o->ind)
                json_nl(b, o, level + 1);
            const char *bad = json_val(b, l->v[i], o, level + 1);
            if (bad)
                return bad;
        }
        if (o->ind)
            json_nl(b, o, level);
        sb_put(b, "]", 1);
        return NULL;
    }
    case JT_DICT: {
        const struct jdict *d = v.u.d;
        if (!d->n) {
            sb_put(b, "{}", 2);
            return NULL;
        }
        size_t *order = arena_alloc(b->a, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort) {
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t != JT_STR)
                    return "(a key that is not a string, with sort_keys)";
            for (size_t i = 1; i < d->n; i++) /* insertion sort: stable, small dicts */
                for (size_t j = i; j > 0; j--) {
                    const struct jstr *x = d->k[order[j - 1]].u.s, *y = d->k[order[j]].u.s;
                    size_t m = x->n < y->n ? x->n : y->n;
                    int c = memcmp(x->s, y->s, m);
                    if (c < 0 || (c == 0 && x->n <= y->n))
                        break;
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        }
        sb_put(b, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            struct jv k = d->k[order[i]];
            if (i)
                sb_puts(b, o->isep);
            if (o->ind)
                json_nl(b, o, level + 1);
            if (k.t == JT_STR) {
                json_str(b, k.u.s->s, k.u.s->n, o->ascii);
            } else if (k.t == JT_INT || k.t == JT_FLOAT || k.t == JT_BOOL || k.t == JT_NONE) {
                struct sbuf kb;
                sb_init(&kb, b->a, 0, b->err);
                json_val(&kb, k, o, level);
                sb_put(b, "\"", 1);
                sb_put(b, kb.p, kb.n);
                sb_put(b, "\"", 1);
            } else {
                return "(a key of this type)";
            }
            sb_puts(b, o->ksep);
            const char *bad = json_val(b, d->v[order[i]], o, level + 1);
            if (bad)
                return bad;
        }
        if (o->ind)
            json_nl(b, o, level);
        sb_put(b, "}", 1);
        return NULL;
    }
    default: return type_name(v);
    }
}

/* --- lexer ----------------------------------------------------------------- */

enum tk {
    TK_EOF = 0,
    TK_DATA,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP
};

enum op {
    OP_ADD,
    OP_SUB,
    OP_DIV,
    OP_FLOORDIV,
    OP_MUL,
    OP_MOD,
    OP_POW,
    OP_TILDE,
    OP_LBRACKET,
    OP_RBRACKET,
    OP_LPAREN,
    OP_RPAREN,
    OP_LBRACE,
    OP_RBRACE,
    OP_EQ,
    OP_NE,
    OP_GT,
    OP_GTEQ,
    OP_LT,
    OP_LTEQ,
    OP_ASSIGN,
    OP_DOT,
    OP_COLON,
    OP_PIPE,
    OP_COMMA,
    OP_SEMICOLON,
    OP_COUNT
};
static const char *const op_text[OP_COUNT] = {
    "+", "-",  "/",  "//", "*",  "%", "**", "~", "[", "]", "(", ")", "{",
    "}", "==", "!=", ">",  ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};

struct tok {
    uint8_t t, op;
    int line, col;
    struct jstr *s; /* TK_NAME, TK_STRING, TK_DATA */
    int64_t i;
    double f;
};

struct lexer {
    const char *src;
    size_t n, pos;
    int line;
    size_t line_start; /* byte offset where the current line starts */
    /* the last column asked for: the next one counts on from it, not from the line's start
     * (a template of one long line took minutes to lex) */
    size_t col_line, col_at;
    int col_chars;
    struct tok *tk;
    size_t ntk, cap;
    struct arena *a;
    struct jerr *err;
};

static int lx_col(struct lexer *L, size_t at)
{
    if (L->col_line != L->line_start || at < L->col_at) {
        L->col_line = L->line_start;
        L->col_at = L->line_start;
        L->col_chars = 0;
    }
    L->col_chars += (int)u8_len(L->src + L->col_at, at - L->col_at);
    L->col_at = at;
    return 1 + L->col_chars;
}

/* moves pos to `to`, counting lines */
static void lx_advance(struct lexer *L, size_t to)
{
    for (size_t i = L->pos; i < to; i++)
        if (L->src[i] == '\n') {
            L->line++;
            L->line_start = i + 1;
        }
    L->pos = to;
}

static _Noreturn void lx_fail(struct lexer *L, size_t at, const char *fmt, ...)
{
    /* the error path: line and column of `at` counted from the start */
    int line = 1;
    size_t ls = 0;
    for (size_t i = 0; i < at && i < L->n; i++)
        if (L->src[i] == '\n') {
            line++;
            ls = i + 1;
        }
    int col = 1 + (int)u8_len(L->src + ls, (at < L->n ? at : L->n) - ls);
    va_list ap;
    va_start(ap, fmt);
    jfailv(L->err, RKV_EFORMAT, line, col, fmt, ap);
}

static struct tok *lx_push(struct lexer *L, int t, size_t at)
{
    if (L->ntk == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct tok *nt = arena_alloc(L->a, cap * sizeof *nt);
        if (L->ntk)
            memcpy(nt, L->tk, L->ntk * sizeof *nt);
        L->tk = nt;
        L->cap = cap;
    }
    struct tok *k = &L->tk[L->ntk++];
    memset(k, 0, sizeof *k);
    k->t = (uint8_t)t;
    k->line = L->line;
    k->col = lx_col(L, at);
    return k;
}

/* length of the Python whitespace character ending at s[end-1], 0 if none */
static size_t ws_back(const char *s, size_t start, size_t end)
{
    if (end <= start)
        return 0;
    unsigned char c = (unsigned char)s[end - 1];
    if (c < 0x80)
        return u_space(c) ? 1 : 0;
    size_t b = end - 1;
    while (b > start && ((unsigned char)s[b] & 0xc0) == 0x80 && end - b < 4)
        b--;
    uint32_t cp;
    size_t l = u8_dec((const unsigned char *)s + b, end - b, &cp);
    return l == end - b && u_space(cp) ? l : 0;
}

static size_t ws_fwd(const char *s, size_t at, size_t n)
{
    if (at >= n)
        return 0;
    uint32_t cp;
    size_t l = u8_dec((const unsigned char *)s + at, n - at, &cp);
    return u_space(cp) ? l : 0;
}

static size_t skip_ws(const char *s, size_t at, size_t n)
{
    size_t l;
    while ((l = ws_fwd(s, at, n)) > 0)
        at += l;
    return at;
}

static void lx_data(struct lexer *L, size_t from, size_t to)
{
    if (to <= from)
        return;
    struct tok *k = lx_push(L, TK_DATA, from);
    k->s = str_new(L->a, L->src + from, to - from);
}

/* the escapes of Python's unicode-escape codec, which jinja2 applies to
 * string literals */
static struct jstr *lx_unescape(struct lexer *L, size_t from, size_t to)
{
    struct jstr *r = arena_alloc(L->a, sizeof *r + (to - from) + 1);
    char *o = r->s;
    const char *s = L->src;
    for (size_t i = from; i < to;) {
        if (s[i] != '\\') {
            *o++ = s[i++];
            continue;
        }
        char c = s[i + 1]; /* the string rule guarantees a character after '\' */
        size_t at = i;
        i += 2;
        switch (c) {
        case '\n': break;
        case '\\': *o++ = '\\'; break;
        case '\'': *o++ = '\''; break;
        case '"': *o++ = '"'; break;
        case 'a': *o++ = '\a'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'v': *o++ = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < want; k++, i++) {
                char h = i < to ? s[i] : 0;
                int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (d < 0)
                    lx_fail(L, at, "truncated \\%c escape in a string", c);
                cp = cp << 4 | (uint32_t)d;
            }
            if (cp > 0x10ffff)
                lx_fail(L, at, "illegal Unicode character in a string");
            o += u8_enc(cp, o);
            break;
        }
        case 'N': lx_fail(L, at, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                uint32_t cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < to && s[i] >= '0' && s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += u8_enc(cp, o);
            } else {
                /* unknown escapes stay as they are */
                *o++ = '\\';
                i--;
            }
        }
    }
    r->n = (size_t)(o - r->s);
    *o = 0;
    return r;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}
static bool is_name0(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* digits with single underscores between them: (\d+_)*\d+ ; returns end or at */
static size_t lx_digits(const char *s, size_t at, size_t n)
{
    size_t i = at;
    if (i >= n || !is_digit(s[i]))
        return at;
    while (i < n && is_digit(s[i]))
        i++;
    while (i + 1 < n && s[i] == '_' && is_digit(s[i + 1])) {
        i++;
        while (i < n && is_digit(s[i]))
            i++;
    }
    return i;
}

/* a number token at pos: jinja2's float rule, then its integer rule */
static bool lx_number(struct lexer *L, size_t at, size_t *end)
{
    const char *s = L->src;
    size_t n = L->n;
    if (!is_digit(s[at]) || (at > 0 && s[at - 1] == '.'))
        goto integer;
    size_t i = lx_digits(s, at, n), f = i;
    bool frac = false;
    if (f < n && s[f] == '.' && lx_digits(s, f + 1, n) > f + 1) {
        f = lx_digits(s, f + 1, n);
        frac = true;
    }
    size_t e = f;
    if (e < n && (s[e] == 'e' || s[e] == 'E')) {
        size_t k = e + 1;
        if (k < n && (s[k] == '+' || s[k] == '-'))
            k++;
        size_t d = lx_digits(s, k, n);
        if (d > k)
            e = d;
    }
    if (frac || e > f) {
        /* the literal without its underscores; a long one on the heap (cut to 127 bytes, 1
         * followed by 130 zeros read as 1e126) */
        char small[128], *tmp = e - at < sizeof small ? small : malloc(e - at + 1);
        if (!tmp)
            lx_fail(L, at, "out of memory");
        size_t m = 0;
        for (size_t k = at; k < e; k++)
            if (s[k] != '_')
                tmp[m++] = s[k];
        tmp[m] = 0;
        double f64 = strtod(tmp, NULL);
        if (tmp != small)
            free(tmp);
        struct tok *k = lx_push(L, TK_FLOAT, at);
        k->f = f64;
        *end = e;
        return true;
    }
integer:;
    int base = 10;
    size_t i2 = at;
    if (s[at] == '0' && at + 1 < n && strchr("bBoOxX", s[at + 1]) && s[at + 1]) {
        char b = (char)(s[at + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        i2 = at + 2;
        size_t k = i2;
        for (;;) {
            size_t q = k < n && s[k] == '_' ? k + 1 : k;
            char c = q < n ? (char)(s[q] | 0x20) : 0;
            bool ok = base == 2   ? (c == '0' || c == '1')
                      : base == 8 ? (c >= '0' && c <= '7')
                                  : (is_digit(c) || (c >= 'a' && c <= 'f'));
            if (!ok)
                break;
            k = q + 1;
        }
        if (k == i2) {
            base = 10;
            i2 = at;
        } else {
            i2 = k;
        }
    }
    if (base == 10) {
        if (!is_digit(s[at]))
            return false;
        if (s[at] == '0') {
            /* 0(_?0)* */
            i2 = at + 1;
            while (i2 < n && (s[i2] == '0' || (s[i2] == '_' && i2 + 1 < n && s[i2 + 1] == '0')))
                i2 += s[i2] == '_' ? 2 : 1;
        } else {
            i2 = lx_digits(s, at, n);
        }
    }
    uint64_t v = 0;
    for (size_t k = at + (base == 10 ? 0 : 2); k < i2; k++) {
        if (s[k] == '_')
            continue;
        char c = (char)(s[k] | 0x20);
        unsigned d = is_digit(c) ? (unsigned)(c - '0') : (unsigned)(c - 'a' + 10);
        if (v > (UINT64_MAX - d) / (unsigned)base || v * (unsigned)base + d > (uint64_t)INT64_MAX)
            lx_fail(L, at, "integer literal does not fit in 64 bits");
        v = v * (unsigned)base + d;
    }
    struct tok *k = lx_push(L, TK_INT, at);
    k->i = (int64_t)v;
    *end = i2;
    return true;
}

/* lexes the tokens of one {% %} or {{ }} tag from L->pos; returns with pos
 * after the end tag (whitespace control applied) and *line_starting set */
static void lx_tag(struct lexer *L, bool block, bool *line_starting, size_t open_at)
{
    const char *s = L->src;
    size_t n = L->n, i = L->pos;
    char stack[JINJA_MAX_NESTING];
    int depth = 0;
    for (;;) {
        lx_advance(L, i);
        if (i >= n)
            lx_fail(L, open_at, "unexpected end of template: %s tag not closed with '%s'",
                    block ? "a block" : "a variable", block ? "%}" : "}}");
        if (depth == 0) {
            size_t e = 0;
            bool trim_ws = false, nl = false;
            if (block) {
                if (s[i] == '+' && i + 2 < n + 0 && s[i + 1] == '%' && s[i + 2] == '}')
                    e = i + 3;
                else if (s[i] == '-' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}')
                    e = i + 3, trim_ws = true;
                else if (s[i] == '%' && i + 1 < n && s[i + 1] == '}')
                    e = i + 2, nl = true;
            } else {
                if (s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}')
                    e = i + 3, trim_ws = true;
                else if (s[i] == '}' && i + 1 < n && s[i + 1] == '}')
                    e = i + 2;
            }
            if (e) {
                lx_push(L, block ? TK_BLOCK_END : TK_VAR_END, i);
                if (trim_ws)
                    e = skip_ws(s, e, n);
                else if (nl && e < n && s[e] == '\n')
                    e++; /* trim_blocks */
                *line_starting = s[e - 1] == '\n';
                lx_advance(L, e);
                return;
            }
        }
        size_t w = ws_fwd(s, i, n);
        if (w) {
            i = skip_ws(s, i, n);
            continue;
        }
        char c = s[i];
        size_t end;
        if (is_digit(c) && lx_number(L, i, &end)) {
            i = end;
        } else if (is_name0(c)) {
            size_t j = i + 1;
            while (j < n && (is_name0(s[j]) || is_digit(s[j])))
                j++;
            struct tok *k = lx_push(L, TK_NAME, i);
            k->s = str_new(L->a, s + i, j - i);
            i = j;
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c) {
                if (s[j] == '\\' && j + 1 < n)
                    j++;
                j++;
            }
            if (j >= n)
                lx_fail(L, i, "unterminated string literal");
            size_t line = (size_t)L->line;
            (void)line;
            struct tok *k = lx_push(L, TK_STRING, i);
            k->s = lx_unescape(L, i + 1, j);
            i = j + 1;
        } else {
            int op = -1;
            for (int o = 0; o < OP_COUNT; o++) {
                size_t l = strlen(op_text[o]);
                if (i + l <= n && !memcmp(s + i, op_text[o], l) &&
                    (op < 0 || l > strlen(op_text[op])))
                    op = o;
            }
            if (op < 0)
                lx_fail(L, i, "unexpected character '%c'", c);
            if (op == OP_LBRACE || op == OP_LPAREN || op == OP_LBRACKET) {
                if (depth >= JINJA_MAX_NESTING)
                    lx_fail(L, i, "brackets nested deeper than %d", JINJA_MAX_NESTING);
                stack[depth++] = op == OP_LBRACE ? '}' : op == OP_LPAREN ? ')' : ']';
            } else if (op == OP_RBRACE || op == OP_RPAREN || op == OP_RBRACKET) {
                if (!depth)
                    lx_fail(L, i, "unexpected '%c'", c);
                if (stack[depth - 1] != c)
                    lx_fail(L, i, "unexpected '%c', expected '%c'", c, stack[depth - 1]);
                depth--;
            }
            struct tok *k = lx_push(L, TK_OP, i);
            k->op = (uint8_t)op;
            i += strlen(op_text[op]);
        }
    }
}

/* source -> tokens, with trim_blocks and lstrip_blocks as HF sets them */
static void lx_run(struct lexer *L)
{
    const char *s = L->src;
    size_t n = L->n;
    bool line_starting = true;
    while (L->pos < n) {
        size_t at = L->pos;
        const char *hit = NULL;
        for (;;) {
            hit = memchr(s + at, '{', n - at);
            if (!hit || (size_t)(hit - s) + 1 >= n)
                break;
            char c = hit[1];
            if (c == '{' || c == '%' || c == '#')
                break;
            at = (size_t)(hit - s) + 1;
        }
        if (!hit || (size_t)(hit - s) + 1 >= n) {
            lx_data(L, L->pos, n);
            lx_advance(L, n);
            return;
        }
        size_t open = (size_t)(hit - s);
        char kind = s[open + 1];
        char sign = open + 2 < n && (s[open + 2] == '-' || s[open + 2] == '+') ? s[open + 2] : 0;
        size_t text_end = open;
        /* {% raw %} */
        bool raw = false;
        size_t raw_end = 0;
        if (kind == '%') {
            size_t k = skip_ws(s, open + 2 + (sign ? 1 : 0), n);
            if (k + 3 <= n && !memcmp(s + k, "raw", 3)) {
                size_t q = skip_ws(s, k + 3, n);
                if (q + 2 <= n && !memcmp(s + q, "%}", 2)) {
                    raw = true; /* no trim_blocks after a raw tag, as jinja2 */
                    raw_end = q + 2;
                } else if (q + 3 <= n && !memcmp(s + q, "-%}", 3)) {
                    raw = true;
                    raw_end = skip_ws(s, q + 3, n);
                }
            }
        }
        if (sign == '-') {
            size_t w;
            while ((w = ws_back(s, L->pos, text_end)) > 0)
                text_end -= w;
        } else if (sign != '+' && kind != '{') {
            size_t l_pos = text_end;
            while (l_pos > L->pos && s[l_pos - 1] != '\n')
                l_pos--;
            if (l_pos > L->pos || line_starting) {
                size_t k = l_pos;
                while (k < text_end && ws_fwd(s, k, text_end))
                    k += ws_fwd(s, k, text_end);
                if (k == text_end && k > l_pos)
                    text_end = l_pos;
            }
        }
        lx_data(L, L->pos, text_end);
        lx_advance(L, open);
        if (raw) {
            /* data up to {% endraw %}, with that tag's own whitespace control */
            size_t k = raw_end;
            for (;;) {
                const char *e = memmem(s + k, n - k, "{%", 2);
                if (!e)
                    lx_fail(L, open, "missing end of raw directive");
                size_t eo = (size_t)(e - s);
                char es = eo + 2 < n && (s[eo + 2] == '-' || s[eo + 2] == '+') ? s[eo + 2] : 0;
                size_t q = skip_ws(s, eo + 2 + (es ? 1 : 0), n);
                if (q + 6 <= n && !memcmp(s + q, "endraw", 6)) {
                    q = skip_ws(s, q + 6, n);
                    size_t after = 0;
                    if (q + 3 <= n && !memcmp(s + q, "+%}", 3))
                        after = q + 3;
                    else if (q + 3 <= n && !memcmp(s + q, "-%}", 3))
                        after = skip_ws(s, q + 3, n);
                    else if (q + 2 <= n && !memcmp(s + q, "%}", 2))
                        after = q + 2 + (q + 2 < n && s[q + 2] == '\n');
                    if (after) {
                        size_t tend = eo;
                        if (es == '-') {
                            size_t w;
                            while ((w = ws_back(s, raw_end, tend)) > 0)
                                tend -= w;
                        } else if (es != '+') {
                            size_t l_pos = tend;
                            while (l_pos > raw_end && s[l_pos - 1] != '\n')
                                l_pos--;
                            size_t m = l_pos;
                            while (m < tend && ws_fwd(s, m, tend))
                                m += ws_fwd(s, m, tend);
                            if (m == tend && m > l_pos &&
                                (l_pos > raw_end || s[raw_end - 1] == '\n'))
                                tend = l_pos;
                        }
                        lx_advance(L, raw_end);
                        lx_data(L, raw_end, tend);
                        lx_advance(L, after);
                        line_starting = s[after - 1] == '\n';
                        break;
                    }
                }
                k = eo + 2;
            }
            continue;
        }
        size_t body = open + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t k = body;
            for (;;) {
                const char *e = memmem(s + k, n - k, "#}", 2);
                if (!e)
                    lx_fail(L, open, "missing end of comment tag");
                size_t eo = (size_t)(e - s), after;
                if (eo > body && s[eo - 1] == '-')
                    after = skip_ws(s, eo + 2, n);
                else if (eo > body && s[eo - 1] == '+')
                    after = eo + 2;
                else
                    after = eo + 2 + (eo + 2 < n && s[eo + 2] == '\n');
                line_starting = s[after - 1] == '\n';
                lx_advance(L, after);
                break;
            }
            continue;
        }
        lx_push(L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, open);
        lx_advance(L, body);
        lx_tag(L, kind == '%', &line_starting, open);
    }
}

/* --- syntax tree ----------------------------------------------------------- */

enum nk {
    /* statements */
    N_BODY,
    N_DATA,
    N_OUT,
    N_FOR,
    N_IF,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_WITH,
    /* expressions */
    E_CONST,
    E_NAME,
    E_NSREF,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_GETATTR,
    E_GETITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_BIN,
    E_CONCAT,
    E_CMP,
    E_COND,
    E_BLOCKVAL
};

enum cmp { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct node {
    uint8_t k, op;
    int line, col, h; /* h: height of the subtree, bounded so evaluation cannot blow the stack */
    /* N_FOR: a target, b iterable, c inline filter, d body, e else
     * N_IF: a test, b body, c else (a body or an N_IF)
     * N_SET: a target, b value; N_SETBLOCK: a target, b body, c filter chain
     * N_MACRO / N_CALLBLOCK: xs parameters (E_NAME, a = default), d body,
     *   N_CALLBLOCK's a the call
     * N_FILTERBLOCK: a filter chain (its innermost operand E_BLOCKVAL), d body
     * N_WITH: xs targets, kv values, d body
     * E_GETATTR: a object, name; E_GETITEM: a object, b key (E_SLICE: a, b, c)
     * E_CALL: a callee, xs args, kn/kv keywords
     * E_FILTER / E_TEST: a operand, name, xs args, kn/kv keywords
     * E_BIN: op, a, b; E_CMP: a, xs operands with ops; E_COND: a test, b then, c else */
    struct node *a, *b, *c, *d, *e;
    struct node **xs;
    size_t nx;
    struct node **kv;
    const char **kn;
    size_t nk;
    uint8_t *ops;
    const char *name, *attr;
    struct jv v;
};

/* --- parser ---------------------------------------------------------------- */

struct parser {
    struct tok *tk;
    size_t n, pos;
    struct arena *a;
    struct jerr *err;
    int depth; /* open blocks and expression recursion */
    int loops; /* for-loops around the current statement (break/continue) */
};

static const char *const filter_names[] = {
    "abs",      "attr",   "capitalize", "center",     "count",     "d",       "default",
    "dictsort", "e",      "escape",     "first",      "float",     "indent",  "int",
    "items",    "join",   "last",       "length",     "list",      "lower",   "map",
    "max",      "min",    "reject",     "rejectattr", "replace",   "reverse", "round",
    "safe",     "select", "selectattr", "sort",       "string",    "sum",     "title",
    "tojson",   "trim",   "unique",     "upper",      "wordcount", NULL};
static const char *const test_names[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
    "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
    "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
    "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
    "string",  "test",     "true",     "undefined",   "upper",    "==",      "!=",
    "<",       "<=",       ">",        ">=",          NULL};

static bool in_names(const char *const *names, const char *s)
{
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], s))
            return true;
    return false;
}

static struct tok *cur(struct parser *P)
{
    return &P->tk[P->pos];
}
static struct tok *peek(struct parser *P, size_t k)
{
    return P->pos + k < P->n ? &P->tk[P->pos + k] : &P->tk[P->n - 1];
}
static struct tok *advance(struct parser *P)
{
    struct tok *t = cur(P);
    if (P->pos + 1 < P->n)
        P->pos++;
    return t;
}

static const char *describe(const struct tok *t)
{
    switch (t->t) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_BLOCK_END: return "end of statement block";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_VAR_END: return "end of print statement";
    case TK_NAME: return t->s->s;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: return op_text[t->op];
    }
}

static _Noreturn void p_fail(struct parser *P, const struct tok *t, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jfailv(P->err, code, t->line, t->col, fmt, ap);
}

static bool is_kw(const struct tok *t, const char *kw)
{
    return t->t == TK_NAME && !strcmp(t->s->s, kw);
}
static bool is_op(const struct tok *t, int op)
{
    return t->t == TK_OP && t->op == op;
}
static bool skip_kw(struct parser *P, const char *kw)
{
    if (!is_kw(cur(P), kw))
        return false;
    advance(P);
    return true;
}
static bool skip_op(struct parser *P, int op)
{
    if (!is_op(cur(P), op))
        return false;
    advance(P);
    return true;
}
static void expect_op(struct parser *P, int op)
{
    if (!skip_op(P, op))
        p_fail(P, cur(P), RKV_EFORMAT, "expected '%s', got '%s'", op_text[op], describe(cur(P)));
}
static void expect_t(struct parser *P, int t)
{
    if (cur(P)->t != t) {
        struct tok want = {.t = (uint8_t)t};
        p_fail(P, cur(P), RKV_EFORMAT, "expected %s, got '%s'", describe(&want), describe(cur(P)));
    }
    advance(P);
}
static const char *expect_name(struct parser *P)
{
    if (cur(P)->t != TK_NAME)
        p_fail(P, cur(P), RKV_EFORMAT, "expected a name, got '%s'", describe(cur(P)));
    return advance(P)->s->s;
}

static void enter(struct parser *P)
{
    if (++P->depth > JINJA_MAX_NESTING)
        p_fail(P, cur(P), RKV_ETOOBIG, "template nested deeper than %d levels", JINJA_MAX_NESTING);
}
static void leave(struct parser *P)
{
    P->depth--;
}

static struct node *mk(struct parser *P, int k, const struct tok *at)
{
    struct node *n = arena_zalloc(P->a, sizeof *n);
    n->k = (uint8_t)k;
    n->line = at->line;
    n->col = at->col;
    n->h = 1;
    return n;
}

/* sets n->h from its children; chains like a+b+c+... grow the tree without
 * recursion in the parser, so the height is checked here */
static struct node *fin(struct parser *P, struct node *n)
{
    int h = 0;
    struct node *ch[5] = {n->a, n->b, n->c, n->d, n->e};
    for (int i = 0; i < 5; i++)
        if (ch[i] && ch[i]->h > h)
            h = ch[i]->h;
    for (size_t i = 0; i < n->nx; i++)
        if (n->xs[i] && n->xs[i]->h > h)
            h = n->xs[i]->h;
    for (size_t i = 0; i < n->nk; i++)
        if (n->kv[i]->h > h)
            h = n->kv[i]->h;
    n->h = h + 1;
    if (n->h > JINJA_MAX_NESTING * 4)
        jfail(P->err, RKV_ETOOBIG, n->line, n->col, "expression nested deeper than %d levels",
              JINJA_MAX_NESTING * 4);
    return n;
}

struct nvec {
    struct node **v;
    size_t n, cap;
};
static void nv_push(struct parser *P, struct nvec *nv, struct node *x)
{
    if (nv->n == nv->cap) {
        size_t cap = nv->cap ? nv->cap * 2 : 4;
        struct node **v = arena_alloc(P->a, cap * sizeof *v);
        if (nv->n)
            memcpy(v, nv->v, nv->n * sizeof *v);
        nv->v = v;
        nv->cap = cap;
    }
    nv->v[nv->n++] = x;
}

static struct node *p_expr(struct parser *P, bool condexpr);
static struct node *p_or(struct parser *P);
static struct node *p_unary(struct parser *P, bool with_filter);
static struct node *p_primary(struct parser *P, bool with_ns);
static struct node *p_postfix(struct parser *P, struct node *n);
static struct node *p_filter(struct parser *P, struct node *n, bool start_inline);

static bool tuple_end(struct parser *P, const char *extra)
{
    struct tok *t = cur(P);
    if (t->t == TK_VAR_END || t->t == TK_BLOCK_END || is_op(t, OP_RPAREN))
        return true;
    return extra && is_kw(t, extra);
}

/* jinja2's parse_tuple: an expression, or a tuple when commas follow */
static struct node *p_tuple(struct parser *P, bool simplified, bool condexpr, const char *extra,
                            bool explicit_parens, bool with_ns)
{
    struct tok *at = cur(P);
    struct nvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n)
            expect_op(P, OP_COMMA);
        if (tuple_end(P, extra))
            break;
        nv_push(P, &items, simplified ? p_primary(P, with_ns) : p_expr(P, condexpr));
        if (is_op(cur(P), OP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n)
            return items.v[0];
        if (!explicit_parens)
            p_fail(P, cur(P), RKV_EFORMAT, "expected an expression, got '%s'", describe(cur(P)));
    }
    struct node *n = mk(P, E_TUPLE, at);
    n->xs = items.v;
    n->nx = items.n;
    return fin(P, n);
}

static struct node *p_expr(struct parser *P, bool condexpr)
{
    enter(P);
    struct node *n;
    if (!condexpr) {
        n = p_or(P);
    } else {
        n = p_or(P);
        while (is_kw(cur(P), "if")) {
            struct tok *at = advance(P);
            struct node *c = mk(P, E_COND, at);
            c->b = n;
            c->a = p_or(P);
            if (skip_kw(P, "else"))
                c->c = p_expr(P, true);
            n = fin(P, c);
        }
    }
    leave(P);
    return n;
}

static struct node *p_binary(struct parser *P, int k, int op, struct node *a, struct node *b,
                             const struct tok *at)
{
    struct node *n = mk(P, k, at);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return fin(P, n);
}

static struct node *p_compare(struct parser *P);
static struct node *p_not(struct parser *P)
{
    if (is_kw(cur(P), "not")) {
        struct tok *at = advance(P);
        enter(P);
        struct node *n = mk(P, E_NOT, at);
        n->a = p_not(P);
        leave(P);
        return fin(P, n);
    }
    return p_compare(P);
}

static struct node *p_and(struct parser *P)
{
    struct node *l = p_not(P);
    while (is_kw(cur(P), "and")) {
        struct tok *at = advance(P);
        l = p_binary(P, E_AND, 0, l, p_not(P), at);
    }
    return l;
}

static struct node *p_or(struct parser *P)
{
    struct node *l = p_and(P);
    while (is_kw(cur(P), "or")) {
        struct tok *at = advance(P);
        l = p_binary(P, E_OR, 0, l, p_and(P), at);
    }
    return l;
}

static struct node *p_math1(struct parser *P);
static struct node *p_compare(struct parser *P)
{
    struct tok *at = cur(P);
    struct node *first = p_math1(P);
    struct nvec ops = {0};
    uint8_t opc[256];
    for (;;) {
        struct tok *t = cur(P);
        int c = -1;
        if (t->t == TK_OP) {
            switch (t->op) {
            case OP_EQ: c = CMP_EQ; break;
            case OP_NE: c = CMP_NE; break;
            case OP_LT: c = CMP_LT; break;
            case OP_LTEQ: c = CMP_LE; break;
            case OP_GT: c = CMP_GT; break;
            case OP_GTEQ: c = CMP_GE; break;
            }
            if (c >= 0)
                advance(P);
        } else if (is_kw(t, "in")) {
            advance(P);
            c = CMP_IN;
        } else if (is_kw(t, "not") && is_kw(peek(P, 1), "in")) {
            advance(P);
            advance(P);
            c = CMP_NOTIN;
        }
        if (c < 0)
            break;
        if (ops.n >= sizeof opc)
            p_fail(P, t, RKV_ETOOBIG, "comparison chain longer than %zu", sizeof opc);
        opc[ops.n] = (uint8_t)c;
        nv_push(P, &ops, p_math1(P));
    }
    if (!ops.n)
        return first;
    struct node *n = mk(P, E_CMP, at);
    n->a = first;
    n->xs = ops.v;
    n->nx = ops.n;
    n->ops = arena_alloc(P->a, ops.n);
    memcpy(n->ops, opc, ops.n);
    return fin(P, n);
}

static struct node *p_concat(struct parser *P);
static struct node *p_math1(struct parser *P)
{
    struct node *l = p_concat(P);
    while (is_op(cur(P), OP_ADD) || is_op(cur(P), OP_SUB)) {
        struct tok *at = advance(P);
        l = p_binary(P, E_BIN, at->op, l, p_concat(P), at);
    }
    return l;
}

static struct node *p_math2(struct parser *P);
static struct node *p_concat(struct parser *P)
{
    struct tok *at = cur(P);
    struct node *first = p_math2(P);
    if (!is_op(cur(P), OP_TILDE))
        return first;
    struct nvec args = {0};
    nv_push(P, &args, first);
    while (skip_op(P, OP_TILDE))
        nv_push(P, &args, p_math2(P));
    struct node *n = mk(P, E_CONCAT, at);
    n->xs = args.v;
    n->nx = args.n;
    return fin(P, n);
}

static struct node *p_pow(struct parser *P);
static struct node *p_math2(struct parser *P)
{
    struct node *l = p_pow(P);
    while (is_op(cur(P), OP_MUL) || is_op(cur(P), OP_DIV) || is_op(cur(P), OP_FLOORDIV) ||
           is_op(cur(P), OP_MOD)) {
        struct tok *at = advance(P);
        l = p_binary(P, E_BIN, at->op, l, p_pow(P), at);
    }
    return l;
}

static struct node *p_pow(struct parser *P)
{
    struct node *l = p_unary(P, true);
    while (is_op(cur(P), OP_POW)) {
        struct tok *at = advance(P);
        l = p_binary(P, E_BIN, OP_POW, l, p_unary(P, true), at);
    }
    return l;
}

static struct node *p_filter_expr(struct parser *P, struct node *n);
static struct node *p_unary(struct parser *P, bool with_filter)
{
    struct tok *t = cur(P);
    struct node *n;
    enter(P);
    if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
        advance(P);
        n = mk(P, is_op(t, OP_SUB) ? E_NEG : E_POS, t);
        n->a = p_unary(P, false);
        n = fin(P, n);
    } else {
        n = p_primary(P, false);
    }
    n = p_postfix(P, n);
    if (with_filter)
        n = p_filter_expr(P, n);
    leave(P);
    return n;
}

static struct node *p_const(struct parser *P, const struct tok *at, struct jv v)
{
    struct node *n = mk(P, E_CONST, at);
    n->v = v;
    return n;
}

static struct node *p_primary(struct parser *P, bool with_ns)
{
    struct tok *t = cur(P);
    if (t->t == TK_NAME) {
        advance(P);
        const char *s = t->s->s;
        if (!strcmp(s, "true") || !strcmp(s, "True"))
            return p_const(P, t, mk_bool(1));
        if (!strcmp(s, "false") || !strcmp(s, "False"))
            return p_const(P, t, mk_bool(0));
        if (!strcmp(s, "none") || !strcmp(s, "None"))
            return p_const(P, t, NONE);
        if (with_ns && is_op(cur(P), OP_DOT)) {
            advance(P);
            struct node *n = mk(P, E_NSREF, t);
            n->name = s;
            n->attr = expect_name(P);
            return n;
        }
        struct node *n = mk(P, E_NAME, t);
        n->name = s;
        return n;
    }
    if (t->t == TK_STRING) {
        advance(P);
        if (cur(P)->t != TK_STRING)
            return p_const(P, t, (struct jv){.t = JT_STR, .u.s = t->s});
        struct sbuf b;
        sb_init(&b, P->a, 0, P->err);
        sb_put(&b, t->s->s, t->s->n);
        while (cur(P)->t == TK_STRING) {
            struct tok *u = advance(P);
            sb_put(&b, u->s->s, u->s->n);
        }
        return p_const(P, t, sb_val(&b));
    }
    if (t->t == TK_INT) {
        advance(P);
        return p_const(P, t, mk_int(t->i));
    }
    if (t->t == TK_FLOAT) {
        advance(P);
        return p_const(P, t, mk_float(t->f));
    }
    if (is_op(t, OP_LPAREN)) {
        advance(P);
        struct node *n = p_tuple(P, false, true, NULL, true, false);
        expect_op(P, OP_RPAREN);
        return n;
    }
    if (is_op(t, OP_LBRACKET) || is_op(t, OP_LBRACE)) {
        /* [a, b] or {k: v, ...}, a trailing comma allowed */
        bool dict = is_op(t, OP_LBRACE);
        int close = dict ? OP_RBRACE : OP_RBRACKET;
        advance(P);
        struct nvec items = {0};
        while (!is_op(cur(P), close)) {
            if (items.n)
                expect_op(P, OP_COMMA);
            if (is_op(cur(P), close))
                break;
            nv_push(P, &items, p_expr(P, true));
            if (dict) {
                expect_op(P, OP_COLON);
                nv_push(P, &items, p_expr(P, true));
            }
        }
        expect_op(P, close);
        struct node *n = mk(P, dict ? E_DICT : E_LIST, t);
        n->xs = items.v;
        n->nx = items.n;
        return fin(P, n);
    }
    p_fail(P, t, RKV_EFORMAT, "unexpected '%s'", describe(t));
}

/* (args, name=value, ...) */
static void p_call_args(struct parser *P, struct node *n)
{
    struct tok *open = cur(P);
    expect_op(P, OP_LPAREN);
    struct nvec args = {0}, kwv = {0};
    const char **kn = NULL;
    size_t nk = 0, kcap = 0;
    bool need_comma = false;
    while (!is_op(cur(P), OP_RPAREN)) {
        if (need_comma) {
            expect_op(P, OP_COMMA);
            if (is_op(cur(P), OP_RPAREN))
                break;
        }
        if (is_op(cur(P), OP_MUL) || is_op(cur(P), OP_POW))
            p_fail(P, cur(P), RKV_EUNSUPPORTED, "*args and **kwargs in calls are not supported");
        if (cur(P)->t == TK_NAME && is_op(peek(P, 1), OP_ASSIGN)) {
            const char *key = advance(P)->s->s;
            advance(P);
            if (nk == kcap) {
                kcap = kcap ? kcap * 2 : 4;
                const char **nkn = arena_alloc(P->a, kcap * sizeof *nkn);
                if (nk)
                    memcpy(nkn, kn, nk * sizeof *kn);
                kn = nkn;
            }
            kn[nk++] = key;
            nv_push(P, &kwv, p_expr(P, true));
        } else {
            if (nk)
                p_fail(P, open, RKV_EFORMAT, "invalid syntax for function call expression");
            nv_push(P, &args, p_expr(P, true));
        }
        need_comma = true;
    }
    expect_op(P, OP_RPAREN);
    n->xs = args.v;
    n->nx = args.n;
    n->kv = kwv.v;
    n->kn = kn;
    n->nk = nk;
}

static struct node *p_call(struct parser *P, struct node *callee)
{
    struct node *n = mk(P, E_CALL, cur(P));
    /* errors of a call point at what is called */
    n->line = callee->line;
    n->col = callee->col;
    n->a = callee;
    p_call_args(P, n);
    return fin(P, n);
}

static struct node *p_subscribed(struct parser *P)
{
    struct tok *at = cur(P);
    struct node *start = NULL, *stop = NULL, *step = NULL;
    if (is_op(cur(P), OP_COLON)) {
        advance(P);
    } else {
        start = p_expr(P, true);
        if (!is_op(cur(P), OP_COLON))
            return start;
        advance(P);
    }
    if (!is_op(cur(P), OP_COLON) && !is_op(cur(P), OP_RBRACKET) && !is_op(cur(P), OP_COMMA))
        stop = p_expr(P, true);
    if (skip_op(P, OP_COLON))
        if (!is_op(cur(P), OP_RBRACKET) && !is_op(cur(P), OP_COMMA))
            step = p_expr(P, true);
    struct node *n = mk(P, E_SLICE, at);
    n->a = start;
    n->b = stop;
    n->c = step;
    return fin(P, n);
}

static struct node *p_postfix(struct parser *P, struct node *n)
{
    for (;;) {
        struct tok *t = cur(P);
        if (is_op(t, OP_DOT)) {
            advance(P);
            struct tok *a = advance(P);
            if (a->t == TK_NAME) {
                struct node *g = mk(P, E_GETATTR, t);
                g->a = n;
                g->name = a->s->s;
                n = fin(P, g);
            } else if (a->t == TK_INT) {
                struct node *g = mk(P, E_GETITEM, t);
                g->a = n;
                g->b = p_const(P, a, mk_int(a->i));
                n = fin(P, g);
            } else {
                p_fail(P, a, RKV_EFORMAT, "expected name or number after '.'");
            }
        } else if (is_op(t, OP_LBRACKET)) {
            advance(P);
            struct nvec args = {0};
            while (!is_op(cur(P), OP_RBRACKET)) {
                if (args.n)
                    expect_op(P, OP_COMMA);
                nv_push(P, &args, p_subscribed(P));
            }
            expect_op(P, OP_RBRACKET);
            if (args.n != 1)
                p_fail(P, t, RKV_EUNSUPPORTED, "subscripts take one key or slice");
            struct node *g = mk(P, E_GETITEM, t);
            g->a = n;
            g->b = args.v[0];
            n = fin(P, g);
        } else if (is_op(t, OP_LPAREN)) {
            n = p_call(P, n);
        } else {
            return n;
        }
    }
}

static const char *p_dotted_name(struct parser *P)
{
    const char *name = expect_name(P);
    if (!is_op(cur(P), OP_DOT))
        return name;
    struct sbuf b;
    sb_init(&b, P->a, 0, P->err);
    sb_puts(&b, name);
    while (skip_op(P, OP_DOT)) {
        sb_put(&b, ".", 1);
        sb_puts(&b, expect_name(P));
    }
    return b.p;
}

static struct node *p_filter(struct parser *P, struct node *n, bool start_inline)
{
    while (is_op(cur(P), OP_PIPE) || start_inline) {
        if (!start_inline)
            advance(P);
        struct tok *at = cur(P);
        const char *name = p_dotted_name(P);

        struct node *f = mk(P, E_FILTER, at);
        f->a = n;
        f->name = name;
        if (is_op(cur(P), OP_LPAREN))
            p_call_args(P, f);
        n = fin(P, f);
        start_inline = false;
    }
    return n;
}

static struct node *p_test(struct parser *P, struct node *n)
{
    struct tok *at = advance(P); /* is */
    bool negated = skip_kw(P, "not");
    struct tok *nt = cur(P);
    const char *name = p_dotted_name(P);
    (void)nt;
    struct node *t = mk(P, E_TEST, at);
    t->a = n;
    t->name = name;
    struct tok *c = cur(P);
    if (is_op(c, OP_LPAREN)) {
        p_call_args(P, t);
    } else if ((c->t == TK_NAME || c->t == TK_STRING || c->t == TK_INT || c->t == TK_FLOAT ||
                is_op(c, OP_LBRACKET) || is_op(c, OP_LBRACE)) &&
               !is_kw(c, "else") && !is_kw(c, "or") && !is_kw(c, "and")) {
        if (is_kw(c, "is"))
            p_fail(P, c, RKV_EFORMAT, "you cannot chain multiple tests with is");
        struct node *arg = p_postfix(P, p_primary(P, false));
        t->xs = arena_alloc(P->a, sizeof *t->xs);
        t->xs[0] = arg;
        t->nx = 1;
    }
    t = fin(P, t);
    if (negated) {
        struct node *x = mk(P, E_NOT, at);
        x->a = t;
        t = fin(P, x);
    }
    return t;
}

static struct node *p_filter_expr(struct parser *P, struct node *n)
{
    for (;;) {
        struct tok *t = cur(P);
        if (is_op(t, OP_PIPE))
            n = p_filter(P, n, false);
        else if (is_kw(t, "is"))
            n = p_test(P, n);
        else if (is_op(t, OP_LPAREN))
            n = p_call(P, n);
        else
            return n;
    }
}

/* --- statements --- */

static struct node *p_body(struct parser *P, const char *const *ends);

static struct node *p_target(struct parser *P, const char *extra, bool with_ns)
{
    struct tok *at = cur(P);
    struct node *t = p_tuple(P, true, true, extra, false, with_ns);
    if (t->k == E_TUPLE) {
        for (size_t i = 0; i < t->nx; i++)
            if (t->xs[i]->k != E_NAME)
                p_fail(P, at, RKV_EFORMAT, "can't assign to '%s'", "tuple item");
    } else if (t->k != E_NAME && t->k != E_NSREF) {
        p_fail(P, at, RKV_EFORMAT, "can't assign to this expression");
    }
    return t;
}

static void end_of(struct parser *P)
{
    expect_t(P, TK_BLOCK_END);
}

/* (a, b=default, ...) of a macro or a call block */
static void p_signature(struct parser *P, struct node *n)
{
    expect_op(P, OP_LPAREN);
    struct nvec params = {0};
    bool seen_default = false;
    while (!is_op(cur(P), OP_RPAREN)) {
        if (params.n)
            expect_op(P, OP_COMMA);
        struct tok *at = cur(P);
        struct node *p = mk(P, E_NAME, at);
        p->name = expect_name(P);
        if (skip_op(P, OP_ASSIGN)) {
            p->a = p_expr(P, true);
            seen_default = true;
        } else if (seen_default) {
            p_fail(P, at, RKV_EFORMAT, "non-default argument follows default argument");
        }
        nv_push(P, &params, fin(P, p));
    }
    expect_op(P, OP_RPAREN);
    n->xs = params.v;
    n->nx = params.n;
}

static void close_tag(struct parser *P, const char *name)
{
    /* the caller's p_body stopped at this end tag's name */
    if (!skip_kw(P, name))
        p_fail(P, cur(P), RKV_EFORMAT, "expected '%s'", name);
    end_of(P);
}

static struct node *p_statement(struct parser *P)
{
    struct tok *t = cur(P);
    if (t->t != TK_NAME)
        p_fail(P, t, RKV_EFORMAT, "tag name expected");
    const char *kw = t->s->s;
    enter(P);
    struct node *n;
    if (!strcmp(kw, "for")) {
        advance(P);
        n = mk(P, N_FOR, t);
        n->a = p_target(P, "in", false);
        if (!skip_kw(P, "in"))
            p_fail(P, cur(P), RKV_EFORMAT, "expected 'in', got '%s'", describe(cur(P)));
        n->b = p_tuple(P, false, false, "recursive", false, false);
        if (skip_kw(P, "if"))
            n->c = p_expr(P, true);
        if (is_kw(cur(P), "recursive"))
            p_fail(P, cur(P), RKV_EUNSUPPORTED, "recursive loops are not supported");
        end_of(P);
        static const char *const ends[] = {"endfor", "else", NULL};
        P->loops++;
        n->d = p_body(P, ends);
        P->loops--;
        if (skip_kw(P, "else")) {
            end_of(P);
            static const char *const e2[] = {"endfor", NULL};
            n->e = p_body(P, e2);
        }
        close_tag(P, "endfor");
    } else if (!strcmp(kw, "if")) {
        advance(P);
        n = mk(P, N_IF, t);
        n->a = p_tuple(P, false, false, NULL, false, false);
        end_of(P);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        n->b = p_body(P, ends);
        struct node *tail = n;
        for (;;) {
            struct tok *k = cur(P);
            if (skip_kw(P, "elif")) {
                struct node *e = mk(P, N_IF, k);
                e->a = p_tuple(P, false, false, NULL, false, false);
                end_of(P);
                e->b = p_body(P, ends);
                tail->c = e;
                tail = e;
            } else if (skip_kw(P, "else")) {
                end_of(P);
                static const char *const e2[] = {"endif", NULL};
                tail->c = p_body(P, e2);
                close_tag(P, "endif");
                break;
            } else {
                close_tag(P, "endif");
                break;
            }
        }
        /* an elif chain runs as a loop (exec), so its length adds no depth:
         * only the first node's height is set */
    } else if (!strcmp(kw, "set")) {
        advance(P);
        struct node *target = p_target(P, NULL, true);
        if (skip_op(P, OP_ASSIGN)) {
            n = mk(P, N_SET, t);
            n->a = target;
            n->b = p_tuple(P, false, true, NULL, false, false);
            end_of(P);
        } else {
            if (target->k == E_TUPLE)
                p_fail(P, t, RKV_EFORMAT, "a block set takes one name");
            n = mk(P, N_SETBLOCK, t);
            n->a = target;
            if (is_op(cur(P), OP_PIPE)) {
                struct node *hole = mk(P, E_BLOCKVAL, cur(P));
                n->c = p_filter(P, hole, false);
            }
            end_of(P);
            static const char *const ends[] = {"endset", NULL};
            n->b = p_body(P, ends);
            close_tag(P, "endset");
        }
    } else if (!strcmp(kw, "macro")) {
        advance(P);
        n = mk(P, N_MACRO, t);
        n->name = expect_name(P);
        p_signature(P, n);
        end_of(P);
        int loops = P->loops;
        P->loops = 0;
        static const char *const ends[] = {"endmacro", NULL};
        n->d = p_body(P, ends);
        P->loops = loops;
        close_tag(P, "endmacro");
    } else if (!strcmp(kw, "call")) {
        advance(P);
        n = mk(P, N_CALLBLOCK, t);
        if (is_op(cur(P), OP_LPAREN))
            p_signature(P, n);
        struct tok *ct = cur(P);
        n->a = p_expr(P, true);
        if (n->a->k != E_CALL)
            p_fail(P, ct, RKV_EFORMAT, "expected call");
        end_of(P);
        int loops = P->loops;
        P->loops = 0;
        static const char *const ends[] = {"endcall", NULL};
        n->d = p_body(P, ends);
        P->loops = loops;
        close_tag(P, "endcall");
    } else if (!strcmp(kw, "filter")) {
        advance(P);
        n = mk(P, N_FILTERBLOCK, t);
        n->a = p_filter(P, mk(P, E_BLOCKVAL, cur(P)), true);
        end_of(P);
        static const char *const ends[] = {"endfilter", NULL};
        n->d = p_body(P, ends);
        close_tag(P, "endfilter");
    } else if (!strcmp(kw, "with")) {
        advance(P);
        n = mk(P, N_WITH, t);
        struct nvec targets = {0}, values = {0};
        while (cur(P)->t != TK_BLOCK_END) {
            if (targets.n)
                expect_op(P, OP_COMMA);
            struct tok *at = cur(P);
            struct node *tg = p_target(P, NULL, false);
            if (tg->k != E_NAME)
                p_fail(P, at, RKV_EUNSUPPORTED, "with takes names");
            nv_push(P, &targets, tg);
            expect_op(P, OP_ASSIGN);
            nv_push(P, &values, p_expr(P, true));
        }
        n->xs = targets.v;
        n->nx = targets.n;
        n->kv = values.v;
        n->nk = values.n;
        end_of(P);
        static const char *const ends[] = {"endwith", NULL};
        n->d = p_body(P, ends);
        close_tag(P, "endwith");
    } else if (!strcmp(kw, "generation")) {
        /* HF's assistant-mask tag: renders its body */
        advance(P);
        end_of(P);
        static const char *const ends[] = {"endgeneration", NULL};
        n = p_body(P, ends);
        close_tag(P, "endgeneration");
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        advance(P);
        if (!P->loops)
            p_fail(P, t, RKV_EFORMAT, "'%s' outside of a loop", kw);
        n = mk(P, kw[0] == 'b' ? N_BREAK : N_CONTINUE, t);
        end_of(P);
    } else if (!strcmp(kw, "include") || !strcmp(kw, "import") || !strcmp(kw, "from") ||
               !strcmp(kw, "extends") || !strcmp(kw, "block") || !strcmp(kw, "autoescape") ||
               !strcmp(kw, "do") || !strcmp(kw, "trans")) {
        p_fail(P, t, RKV_EUNSUPPORTED, "'%s' is not supported in chat templates", kw);
    } else {
        p_fail(P, t, RKV_EFORMAT, "unknown tag '%s'", kw);
    }
    leave(P);
    return fin(P, n);
}

/* statements until a block whose tag is one of ends (left unconsumed) or,
 * with ends NULL, the end of the template */
static struct node *p_body(struct parser *P, const char *const *ends)
{
    struct node *body = mk(P, N_BODY, cur(P));
    struct nvec items = {0};
    for (;;) {
        struct tok *t = cur(P);
        if (t->t == TK_EOF) {
            if (ends)
                p_fail(P, t, RKV_EFORMAT, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->t == TK_DATA) {
            advance(P);
            struct node *d = mk(P, N_DATA, t);
            d->v = (struct jv){.t = JT_STR, .u.s = t->s};
            nv_push(P, &items, d);
        } else if (t->t == TK_VAR_BEGIN) {
            advance(P);
            struct node *o = mk(P, N_OUT, t);
            o->a = p_tuple(P, false, true, NULL, false, false);
            expect_t(P, TK_VAR_END);
            nv_push(P, &items, fin(P, o));
        } else if (t->t == TK_BLOCK_BEGIN) {
            advance(P);
            struct tok *name = cur(P);
            if (ends && name->t == TK_NAME && in_names(ends, name->s->s))
                break;
            nv_push(P, &items, p_statement(P));
        } else {
            p_fail(P, t, RKV_EFORMAT, "unexpected '%s'", describe(t));
        }
    }
    body->xs = items.v;
    body->nx = items.n;
    return fin(P, body);
}

/* unknown filters and tests: jinja2 reports them when it compiles the
 * template, except inside an if statement or an if expression (a "soft"
 * frame), where only running one fails */
static void check_names(struct parser *P, const struct node *n, bool soft)
{
    while (n) {
        if ((n->k == E_FILTER && !in_names(filter_names, n->name)) ||
            (n->k == E_TEST && !in_names(test_names, n->name))) {
            if (!soft)
                jfail(P->err, RKV_EUNSUPPORTED, n->line, n->col, "unknown %s '%s'",
                      n->k == E_FILTER ? "filter" : "test", n->name);
        }
        bool inner = soft; /* for, macro, call, set and filter blocks start frames of their own */
        switch (n->k) {
        case N_IF:
        case E_COND: soft = inner = true; break;
        case N_FOR:
        case N_MACRO:
        case N_CALLBLOCK:
        case N_SETBLOCK:
        case N_FILTERBLOCK:
        case N_WITH: inner = false; break;
        }
        const struct node *body[3] = {NULL, NULL, NULL};
        switch (n->k) {
        case N_FOR: /* a target, b iterable, c filter, d body, e else */
            check_names(P, n->b, soft);
            check_names(P, n->c, false);
            body[0] = n->d;
            body[1] = n->e;
            break;
        case N_SETBLOCK: /* a target, b body, c filter chain */
            check_names(P, n->c, soft);
            body[0] = n->b;
            break;
        case N_MACRO:
        case N_CALLBLOCK:
        case N_FILTERBLOCK:
        case N_WITH:
            check_names(P, n->a, soft);
            for (size_t i = 0; i < n->nk; i++)
                check_names(P, n->kv[i], soft);
            for (size_t i = 0; i < n->nx; i++)
                check_names(P, n->xs[i], false);
            body[0] = n->d;
            break;
        default:
            check_names(P, n->a, soft);
            check_names(P, n->b, soft);
            check_names(P, n->d, soft);
            check_names(P, n->e, soft);
            for (size_t i = 0; i < n->nx; i++)
                check_names(P, n->xs[i], soft);
            for (size_t i = 0; i < n->nk; i++)
                check_names(P, n->kv[i], soft);
            /* c last, as a loop: an elif chain can be long */
            n = n->c;
            continue;
        }
        for (int i = 0; i < 3; i++)
            check_names(P, body[i], inner);
        return;
    }
}

/* --- render state ---------------------------------------------------------- */

struct jinja_tmpl {
    struct arena a;
    struct node *root;
    char *name;
};

struct jinja_ctx {
    struct arena a;
    const char **names;
    struct jv *vals;
    size_t n, cap;
    time_t now;
    bool has_now;
};

struct scope {
    struct scope *parent;
    const char **names;
    struct jv *vals;
    size_t n, cap;
};

struct jmacro {
    const struct node *def; /* N_MACRO or N_CALLBLOCK */
    struct scope *sc;       /* where it was defined */
    const char *name;
};

struct jmethod {
    struct jv self;
    const char *name;
};

struct jloop {
    const struct jlist *items;
    size_t i;
};

enum fn { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME };

struct rs {
    struct jerr *err;
    struct arena *a;
    const struct jinja_ctx *ctx;
    struct sbuf *out;
    struct jv blockval; /* the rendered body a filter block's chain reads */
    uint64_t steps, max_steps;
    size_t max_output;
    int depth, max_depth;
};

static _Noreturn void rfail(struct rs *R, const struct node *at, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jfailv(R->err, code, at ? at->line : 0, at ? at->col : 0, fmt, ap);
}

static void step(struct rs *R, const struct node *at, uint64_t n)
{
    R->steps += n;
    if (R->steps > R->max_steps)
        rfail(R, at, RKV_ETOOBIG, "render exceeded its step budget (%llu steps)",
              (unsigned long long)R->max_steps);
}

static _Noreturn void fail_undef(struct rs *R, const struct node *at, struct jv v)
{
    if (v.u.name)
        rfail(R, at, RKV_EFORMAT, "'%s' is undefined", v.u.name);
    rfail(R, at, RKV_EFORMAT, "an undefined value was used");
}

static struct jv str_of(struct rs *R, struct jv v)
{
    if (v.t == JT_STR)
        return v;
    struct sbuf b;
    sb_init(&b, R->a, 0, R->err);
    v_str(&b, v, 0);
    return sb_val(&b);
}

static struct jv rstr(struct rs *R, const char *s, size_t n)
{
    return mk_str(R->a, s, n);
}

static struct scope *scope_new(struct rs *R, struct scope *parent)
{
    struct scope *s = arena_zalloc(R->a, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(struct rs *R, struct scope *s, const char *name, struct jv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nn = arena_alloc(R->a, cap * sizeof *nn);
        struct jv *nv = arena_alloc(R->a, cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static struct jv lookup(struct rs *R, struct scope *s, const char *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name))
                return s->vals[i];
    const struct jinja_ctx *c = R->ctx;
    for (size_t i = c->n; i-- > 0;)
        if (!strcmp(c->names[i], name))
            return c->vals[i];
    static const struct {
        const char *name;
        int fn;
    } builtins[] = {{"range", F_RANGE},
                    {"namespace", F_NAMESPACE},
                    {"dict", F_DICT},
                    {"raise_exception", F_RAISE},
                    {"strftime_now", F_STRFTIME}};
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
        if (!strcmp(builtins[i].name, name)) {
            struct jv v = {.t = JT_FUNC, .fn = (uint16_t)builtins[i].fn};
            return v;
        }
    return mk_undef(name);
}

/* a str as its code points, for indexing and slicing */
struct cps {
    const char *s;
    size_t *off; /* NULL when ASCII: code point i is byte i */
    size_t n;
};

static struct cps cps_of(struct rs *R, const struct jstr *s)
{
    struct cps c = {.s = s->s, .n = s->n};
    if (!ascii_only(s->s, s->n))
        c.off = u8_offsets(R->a, s->s, s->n, &c.n);
    return c;
}
static size_t cp_at(const struct cps *c, size_t i)
{
    return c->off ? c->off[i] : i;
}
static size_t cp_len(const struct cps *c, size_t i)
{
    return c->off ? c->off[i + 1] - c->off[i] : 1;
}

/* the items of an iterable, as Python's iter(): list items, dict keys, a
 * str's characters; undefined is empty */
static const struct jlist *iter_items(struct rs *R, const struct node *at, struct jv v)
{
    switch (v.t) {
    case JT_LIST: return v.u.l;
    case JT_UNDEF: return list_new(R->a, 0);
    case JT_DICT: {
        struct jlist *l = list_new(R->a, v.u.d->n);
        memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
        l->n = v.u.d->n;
        return l;
    }
    case JT_STR: {
        struct cps c = cps_of(R, v.u.s);
        struct jlist *l = list_new(R->a, c.n);
        for (size_t i = 0; i < c.n; i++)
            l->v[i] = rstr(R, c.s + cp_at(&c, i), cp_len(&c, i));
        l->n = c.n;
        return l;
    }
    case JT_LOOP: return v.u.lp->items;
    default: rfail(R, at, RKV_EFORMAT, "'%s' object is not iterable", type_name(v));
    }
}

static int64_t len_of(struct rs *R, const struct node *at, struct jv v)
{
    switch (v.t) {
    case JT_STR: step(R, at, v.u.s->n / 64 + 1); return (int64_t)u8_len(v.u.s->s, v.u.s->n);
    case JT_LIST: return (int64_t)v.u.l->n;
    case JT_DICT: return (int64_t)v.u.d->n;
    case JT_UNDEF: return 0;
    case JT_LOOP: return (int64_t)v.u.lp->items->n;
    default: rfail(R, at, RKV_EFORMAT, "object of type '%s' has no len()", type_name(v));
    }
}

/* --- attribute and item access --- */

static const char *const str_methods[] = {
    "startswith", "endswith",   "split",     "rsplit",       "strip",        "lstrip",
    "rstrip",     "upper",      "lower",     "title",        "capitalize",   "swapcase",
    "replace",    "find",       "rfind",     "index",        "rindex",       "count",
    "join",       "splitlines", "isdigit",   "isalpha",      "isalnum",      "isspace",
    "islower",    "isupper",    "isnumeric", "isdecimal",    "center",       "ljust",
    "rjust",      "zfill",      "format",    "encode",       "casefold",     "partition",
    "rpartition", "expandtabs", "istitle",   "removeprefix", "removesuffix", NULL};
static const char *const dict_methods[] = {"items",  "keys",  "values",   "get",
                                           "copy",   "pop",   "popitem",  "setdefault",
                                           "update", "clear", "fromkeys", NULL};
static const char *const list_methods[] = {"index",   "count",  "copy",  "append",
                                           "extend",  "insert", "pop",   "remove",
                                           "reverse", "sort",   "clear", NULL};

static struct jv mk_method(struct rs *R, struct jv self, const char *name)
{
    struct jmethod *m = arena_alloc(R->a, sizeof *m);
    m->self = self;
    m->name = name;
    struct jv v = {.t = JT_METHOD};
    v.u.me = m;
    return v;
}

static struct jv loop_attr(struct rs *R, struct jv lv, const char *name)
{
    const struct jloop *lp = lv.u.lp;
    size_t n = lp->items->n, i = lp->i;
    if (!strcmp(name, "index"))
        return mk_int((int64_t)i + 1);
    if (!strcmp(name, "index0"))
        return mk_int((int64_t)i);
    if (!strcmp(name, "revindex"))
        return mk_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0"))
        return mk_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first"))
        return mk_bool(i == 0);
    if (!strcmp(name, "last"))
        return mk_bool(i + 1 == n);
    if (!strcmp(name, "length"))
        return mk_int((int64_t)n);
    if (!strcmp(name, "depth"))
        return mk_int(1);
    if (!strcmp(name, "depth0"))
        return mk_int(0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? lp->items->v[i - 1] : mk_undef("previtem");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? lp->items->v[i + 1] : mk_undef("nextitem");
    if (!strcmp(name, "cycle"))
        return mk_method(R, lv, "cycle");
    return mk_undef(name);
}

/* jinja2's environment.getattr: the attribute, else the item, else undefined */
static struct jv get_attr(struct rs *R, const struct node *at, struct jv obj, const char *name)
{
    switch (obj.t) {
    case JT_UNDEF: fail_undef(R, at, obj);
    case JT_DICT:
        if (in_names(dict_methods, name))
            return mk_method(R, obj, name);
        /* fall through */
    case JT_NS: {
        long i = dict_find_str(obj.u.d, name, strlen(name));
        return i >= 0 ? obj.u.d->v[i] : mk_undef(name);
    }
    case JT_STR: return in_names(str_methods, name) ? mk_method(R, obj, name) : mk_undef(name);
    case JT_LIST: return in_names(list_methods, name) ? mk_method(R, obj, name) : mk_undef(name);
    case JT_LOOP: return loop_attr(R, obj, name);
    default: return mk_undef(name);
    }
}

static bool int_like(struct jv v)
{
    return v.t == JT_INT || v.t == JT_BOOL;
}

/* jinja2's environment.getitem: the item, else the attribute, else undefined */
static struct jv get_item(struct rs *R, const struct node *at, struct jv obj, struct jv key)
{
    switch (obj.t) {
    case JT_UNDEF: fail_undef(R, at, obj);
    case JT_DICT: {
        if (key.t == JT_LIST && !key.tuple)
            break;
        long i = dict_find(obj.u.d, key);
        if (i >= 0)
            return obj.u.d->v[i];
        break;
    }
    case JT_LIST:
        if (int_like(key)) {
            int64_t n = (int64_t)obj.u.l->n, i = key.u.i;
            if (i < 0)
                i += n;
            return i >= 0 && i < n ? obj.u.l->v[i] : mk_undef(NULL);
        }
        break;
    case JT_STR:
        if (int_like(key)) {
            struct cps c = cps_of(R, obj.u.s);
            int64_t n = (int64_t)c.n, i = key.u.i;
            if (i < 0)
                i += n;
            if (i >= 0 && i < n)
                return rstr(R, c.s + cp_at(&c, (size_t)i), cp_len(&c, (size_t)i));
            return mk_undef(NULL);
        }
        break;
    default: break;
    }
    if (key.t == JT_STR)
        return get_attr(R, at, obj, key.u.s->s);
    return mk_undef(NULL);
}

/* Python's slice.indices(); false when an index is not an int */
static bool slice_idx(struct jv v, int64_t def, int64_t *out)
{
    if (v.t == JT_MISSING || v.t == JT_NONE) {
        *out = def;
        return true;
    }
    if (!int_like(v))
        return false;
    *out = v.u.i;
    return true;
}

static struct jv do_slice(struct rs *R, const struct node *at, struct jv obj, struct jv a,
                          struct jv b, struct jv c)
{
    /* jinja2 compiles a slice to Python's own obj[a:b:c], past its getitem:
     * what cannot be sliced fails instead of giving undefined */
    if (obj.t == JT_UNDEF)
        fail_undef(R, at, obj);
    if (obj.t != JT_STR && obj.t != JT_LIST)
        rfail(R, at, RKV_EFORMAT, "'%s' object is not subscriptable", type_name(obj));
    int64_t stepv;
    if (!slice_idx(c, 1, &stepv))
        goto bad_index;
    if (stepv == 0)
        rfail(R, at, RKV_EFORMAT, "slice step cannot be zero");
    struct cps cp = {0};
    int64_t len;
    if (obj.t == JT_STR) {
        cp = cps_of(R, obj.u.s);
        len = (int64_t)cp.n;
    } else {
        len = (int64_t)obj.u.l->n;
    }
    int64_t start, stop;
    if (!slice_idx(a, stepv < 0 ? INT64_MAX : 0, &start) ||
        !slice_idx(b, stepv < 0 ? INT64_MIN : INT64_MAX, &stop))
        goto bad_index;
    /* PySlice_AdjustIndices */
    if (start < 0) {
        start = start == INT64_MIN ? -1 : start + len;
        if (start < 0)
            start = stepv < 0 ? -1 : 0;
    } else if (start >= len) {
        start = stepv < 0 ? len - 1 : len;
    }
    if (stop < 0) {
        stop = stop == INT64_MIN ? -1 : stop + len;
        if (stop < 0)
            stop = stepv < 0 ? -1 : 0;
    } else if (stop >= len) {
        stop = stepv < 0 ? len - 1 : len;
    }
    int64_t count = 0;
    if (stepv > 0 && stop > start)
        count = (stop - start - 1) / stepv + 1;
    else if (stepv < 0 && start > stop)
        count = (start - stop - 1) / (-stepv) + 1;
    step(R, at, (uint64_t)count);
    if (obj.t == JT_STR) {
        struct sbuf sb;
        sb_init(&sb, R->a, 0, R->err);
        for (int64_t k = 0, i = start; k < count; k++, i += stepv)
            sb_put(&sb, cp.s + cp_at(&cp, (size_t)i), cp_len(&cp, (size_t)i));
        return sb_val(&sb);
    }
    struct jlist *l = list_new(R->a, (size_t)count);
    for (int64_t k = 0, i = start; k < count; k++, i += stepv)
        l->v[l->n++] = obj.u.l->v[i];
    return mk_list(l, obj.tuple);
bad_index:
    rfail(R, at, RKV_EFORMAT, "slice indices must be integers or None");
}

/* --- arithmetic and comparison --- */

static _Noreturn void fail_operands(struct rs *R, const struct node *at, const char *op,
                                    struct jv a, struct jv b)
{
    if (a.t == JT_UNDEF)
        fail_undef(R, at, a);
    if (b.t == JT_UNDEF)
        fail_undef(R, at, b);
    rfail(R, at, RKV_EFORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", op, type_name(a),
          type_name(b));
}

static struct jv repeat(struct rs *R, const struct node *at, struct jv seq, int64_t k)
{
    if (k < 0)
        k = 0;
    if (seq.t == JT_STR && seq.u.s->n == 0)
        k = 0; /* '' * n: nothing to repeat, however large n is */
    if (seq.t == JT_STR) {
        if (seq.u.s->n && (uint64_t)k > R->max_output / seq.u.s->n)
            rfail(R, at, RKV_ETOOBIG, "string repetition exceeds the output limit");
        struct sbuf b;
        sb_init(&b, R->a, 0, R->err);
        for (int64_t i = 0; i < k; i++)
            sb_put(&b, seq.u.s->s, seq.u.s->n);
        return sb_val(&b);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > R->max_steps / n)
        rfail(R, at, RKV_ETOOBIG, "list repetition exceeds the step budget");
    step(R, at, (uint64_t)k * n);
    struct jlist *l = list_new(R->a, (size_t)k * n);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < n; j++)
            l->v[l->n++] = seq.u.l->v[j];
    return mk_list(l, seq.tuple);
}

/* CPython's float floor division and modulo */
static void float_divmod(double vx, double wx, double *floordiv, double *modv)
{
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0)) {
            mod += wx;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, wx);
    }
    double fd;
    if (div) {
        fd = floor(div);
        if (div - fd > 0.5)
            fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *modv = mod;
}

static struct jv binop(struct rs *R, const struct node *at, int op, struct jv a, struct jv b)
{
    static const char *const names[] = {
        [OP_ADD] = "+",       [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/",
        [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**"};
    bool ints = int_like(a) && int_like(b);
    if (is_num(a) && is_num(b)) {
        int64_t r;
        double x = num_f(a), y = num_f(b);
        switch (op) {
        case OP_ADD:
            if (!ints)
                return mk_float(x + y);
            if (__builtin_add_overflow(a.u.i, b.u.i, &r))
                goto overflow;
            return mk_int(r);
        case OP_SUB:
            if (!ints)
                return mk_float(x - y);
            if (__builtin_sub_overflow(a.u.i, b.u.i, &r))
                goto overflow;
            return mk_int(r);
        case OP_MUL:
            if (!ints)
                return mk_float(x * y);
            if (__builtin_mul_overflow(a.u.i, b.u.i, &r))
                goto overflow;
            return mk_int(r);
        case OP_DIV:
            if (y == 0)
                rfail(R, at, RKV_EFORMAT, "division by zero");
            return mk_float(x / y);
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints) {
                if (b.u.i == 0)
                    rfail(R, at, RKV_EFORMAT, "integer division or modulo by zero");
                if (a.u.i == INT64_MIN && b.u.i == -1)
                    goto overflow;
                int64_t q = a.u.i / b.u.i, m = a.u.i % b.u.i;
                if (m && ((m < 0) != (b.u.i < 0))) {
                    q--;
                    m += b.u.i;
                }
                return mk_int(op == OP_MOD ? m : q);
            } else {
                if (y == 0)
                    rfail(R, at, RKV_EFORMAT, "float division by zero");
                double fd, md;
                float_divmod(x, y, &fd, &md);
                return mk_float(op == OP_MOD ? md : fd);
            }
        case OP_POW:
            if (ints && b.u.i >= 0) {
                int64_t base = a.u.i, e = b.u.i, acc = 1;
                while (e) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc))
                            goto overflow;
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base))
                        goto overflow;
                }
                return mk_int(acc);
            }
            if (x == 0 && y < 0)
                rfail(R, at, RKV_EFORMAT, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y))
                rfail(R, at, RKV_EUNSUPPORTED, "complex results are not supported");
            return mk_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) {
        struct sbuf sb;
        sb_init(&sb, R->a, R->max_output, R->err);
        sb_put(&sb, a.u.s->s, a.u.s->n);
        sb_put(&sb, b.u.s->s, b.u.s->n);
        return sb_val(&sb);
    }
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST && a.tuple == b.tuple) {
        step(R, at, a.u.l->n + b.u.l->n);
        struct jlist *l = list_new(R->a, a.u.l->n + b.u.l->n);
        memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        l->n = a.u.l->n + b.u.l->n;
        return mk_list(l, a.tuple);
    }
    if (op == OP_MUL && (a.t == JT_STR || a.t == JT_LIST) && int_like(b))
        return repeat(R, at, a, b.u.i);
    if (op == OP_MUL && (b.t == JT_STR || b.t == JT_LIST) && int_like(a))
        return repeat(R, at, b, a.u.i);
    if (op == OP_MOD && a.t == JT_STR)
        rfail(R, at, RKV_EUNSUPPORTED, "string formatting with %% is not supported");
    fail_operands(R, at, names[op], a, b);
overflow:
    rfail(R, at, RKV_ERANGE, "integer result does not fit in 64 bits");
}

static int cmp_order(struct rs *R, const struct node *at, const char *op, struct jv a, struct jv b,
                     int depth)
{
    if (is_num(a) && is_num(b)) {
        if (int_like(a) && int_like(b))
            return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        double x = num_f(a), y = num_f(b);
        if (isnan(x) || isnan(y))
            return 2; /* unordered: every comparison false */
        return (x > y) - (x < y);
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t m = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->s, b.u.s->s, m);
        if (c)
            return c < 0 ? -1 : 1;
        return (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    }
    if (a.t == JT_LIST && b.t == JT_LIST && a.tuple == b.tuple && depth < JINJA_MAX_NESTING) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++)
            if (!v_eq(a.u.l->v[i], b.u.l->v[i]))
                return cmp_order(R, at, op, a.u.l->v[i], b.u.l->v[i], depth + 1);
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    if (a.t == JT_UNDEF)
        fail_undef(R, at, a);
    if (b.t == JT_UNDEF)
        fail_undef(R, at, b);
    rfail(R, at, RKV_EFORMAT, "'%s' not supported between instances of '%s' and '%s'", op,
          type_name(a), type_name(b));
}

static bool contains(struct rs *R, const struct node *at, struct jv hay, struct jv needle)
{
    switch (hay.t) {
    case JT_STR:
        if (needle.t != JT_STR)
            rfail(R, at, RKV_EFORMAT, "'in <string>' requires string as left operand, not %s",
                  type_name(needle));
        return !needle.u.s->n || memmem(hay.u.s->s, hay.u.s->n, needle.u.s->s, needle.u.s->n);
    case JT_LIST:
        step(R, at, hay.u.l->n);
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (v_eq(hay.u.l->v[i], needle))
                return true;
        return false;
    case JT_DICT: step(R, at, hay.u.d->n); return dict_find(hay.u.d, needle) >= 0;
    case JT_UNDEF: return false;
    default: rfail(R, at, RKV_EFORMAT, "argument of type '%s' is not iterable", type_name(hay));
    }
}

static bool compare(struct rs *R, const struct node *at, int op, struct jv a, struct jv b)
{
    static const char *const names[] = {"==", "!=", "<", "<=", ">", ">="};
    switch (op) {
    case CMP_EQ: return v_eq(a, b);
    case CMP_NE: return !v_eq(a, b);
    case CMP_IN: return contains(R, at, b, a);
    case CMP_NOTIN: return !contains(R, at, b, a);
    default: {
        int c = cmp_order(R, at, names[op], a, b, 0);
        if (c == 2)
            return false;
        return op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
    }
    }
}

/* --- strings --------------------------------------------------------------- */

static bool a_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* simple case mapping: ASCII, Latin-1, Latin Extended-A, Greek and
 * Cyrillic; other scripts pass through unchanged (Python's full mappings
 * such as German sharp s to "SS" and the final sigma are not applied) */
static uint32_t u_upper(uint32_t c)
{
    if (c < 0x80)
        return c >= 'a' && c <= 'z' ? c - 32 : c;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7)
        return c - 32;
    if (c == 0xff)
        return 0x178;
    if (c == 0xb5)
        return 0x39c;
    if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177))
        return c & 1 ? c - 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e))
        return c & 1 ? c : c - 1;
    if (c >= 0x3b1 && c <= 0x3c9)
        return c == 0x3c2 ? 0x3a3 : c - 32;
    if (c >= 0x430 && c <= 0x44f)
        return c - 32;
    if (c >= 0x450 && c <= 0x45f)
        return c - 80;
    return c;
}

static uint32_t u_lower(uint32_t c)
{
    if (c < 0x80)
        return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7)
        return c + 32;
    if (c == 0x178)
        return 0xff;
    if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177))
        return c & 1 ? c : c + 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e))
        return c & 1 ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2)
        return c + 32;
    if (c >= 0x410 && c <= 0x42f)
        return c + 32;
    if (c >= 0x400 && c <= 0x40f)
        return c + 80;
    return c;
}

static bool u_cased(uint32_t c)
{
    return u_upper(c) != c || u_lower(c) != c || c == 0xdf || c == 0xaa || c == 0xba;
}

enum casemode { C_UPPER, C_LOWER, C_SWAP, C_CAPITALIZE, C_TITLE, C_JTITLE };

static struct jv str_case(struct rs *R, struct jv v, int mode)
{
    const struct jstr *s = v.u.s;
    struct sbuf b;
    sb_init(&b, R->a, 0, R->err);
    bool word_start = true;
    for (size_t i = 0, k = 0; i < s->n; k++) {
        uint32_t c, o;
        size_t l = u8_dec((const unsigned char *)s->s + i, s->n - i, &c);
        switch (mode) {
        case C_UPPER: o = u_upper(c); break;
        case C_LOWER: o = u_lower(c); break;
        case C_SWAP: o = u_upper(c) != c ? u_upper(c) : u_lower(c); break;
        case C_CAPITALIZE: o = k == 0 ? u_upper(c) : u_lower(c); break;
        case C_TITLE:
            /* str.title(): upper after an uncased character */
            o = word_start ? u_upper(c) : u_lower(c);
            word_start = !u_cased(c);
            break;
        default:
            /* jinja2's title filter: upper at the start and after one of -\s({[< */
            o = word_start ? u_upper(c) : u_lower(c);
            word_start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || u_space(c);
            break;
        }
        if (o == c || (l == 1 && c >= 0x80)) {
            sb_put(&b, s->s + i, l);
        } else {
            char tmp[4];
            sb_put(&b, tmp, u8_enc(o, tmp));
        }
        i += l;
    }
    return sb_val(&b);
}

static bool in_cp_set(uint32_t c, const struct jstr *set)
{
    for (size_t i = 0; i < set->n;) {
        uint32_t x;
        i += u8_dec((const unsigned char *)set->s + i, set->n - i, &x);
        if (x == c)
            return true;
    }
    return false;
}

/* str.strip / lstrip / rstrip; chars NULL: whitespace */
static struct jv str_strip(struct rs *R, struct jv v, const struct jstr *chars, bool left,
                           bool right)
{
    const char *s = v.u.s->s;
    size_t b = 0, e = v.u.s->n;
    if (left)
        while (b < e) {
            uint32_t cp;
            size_t l = u8_dec((const unsigned char *)s + b, e - b, &cp);
            if (chars ? !in_cp_set(cp, chars) : !u_space(cp))
                break;
            b += l;
        }
    if (right)
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s[k] & 0xc0) == 0x80)
                k--;
            uint32_t cp;
            u8_dec((const unsigned char *)s + k, e - k, &cp);
            if (chars ? !in_cp_set(cp, chars) : !u_space(cp))
                break;
            e = k;
        }
    return rstr(R, s + b, e - b);
}

/* str.split / str.rsplit */
static struct jv str_split(struct rs *R, const struct node *at, struct jv v, struct jv sep,
                           int64_t maxsplit, bool from_right)
{
    const char *s = v.u.s->s;
    size_t n = v.u.s->n;
    struct jlist *l = list_new(R->a, 0);
    step(R, at, n / 16 + 1);
    if (sep.t == JT_MISSING || sep.t == JT_NONE) {
        if (!from_right) {
            size_t i = 0;
            while (i < n) {
                while (i < n && ws_fwd(s, i, n))
                    i += ws_fwd(s, i, n);
                if (i >= n)
                    break;
                if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
                    size_t e = n;
                    list_push(R->a, l, rstr(R, s + i, e - i));
                    break;
                }
                size_t j = i;
                while (j < n && !ws_fwd(s, j, n)) {
                    uint32_t cp;
                    j += u8_dec((const unsigned char *)s + j, n - j, &cp);
                }
                list_push(R->a, l, rstr(R, s + i, j - i));
                i = j;
            }
        } else {
            size_t e = n;
            while (e > 0) {
                size_t w;
                while ((w = ws_back(s, 0, e)) > 0)
                    e -= w;
                if (e == 0)
                    break;
                if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
                    list_push(R->a, l, rstr(R, s, e));
                    break;
                }
                size_t b = e;
                while (b > 0 && !ws_back(s, 0, b)) {
                    b--;
                    while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80)
                        b--;
                }
                list_push(R->a, l, rstr(R, s + b, e - b));
                e = b;
            }
            for (size_t i = 0; i < l->n / 2; i++) {
                struct jv t = l->v[i];
                l->v[i] = l->v[l->n - 1 - i];
                l->v[l->n - 1 - i] = t;
            }
        }
        return mk_list(l, 0);
    }
    if (sep.t != JT_STR)
        rfail(R, at, RKV_EFORMAT, "must be str or None, not %s", type_name(sep));
    const struct jstr *d = sep.u.s;
    if (!d->n)
        rfail(R, at, RKV_EFORMAT, "empty separator");
    if (!from_right) {
        size_t i = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && (int64_t)l->n == maxsplit
                                  ? NULL
                                  : memmem(s + i, n - i, d->s, d->n);
            if (!hit) {
                list_push(R->a, l, rstr(R, s + i, n - i));
                break;
            }
            list_push(R->a, l, rstr(R, s + i, (size_t)(hit - s) - i));
            i = (size_t)(hit - s) + d->n;
        }
    } else {
        size_t e = n;
        for (;;) {
            const char *hit = NULL;
            if (!(maxsplit >= 0 && (int64_t)l->n == maxsplit) && e >= d->n)
                for (size_t k = e - d->n + 1; k-- > 0;)
                    if (!memcmp(s + k, d->s, d->n)) {
                        hit = s + k;
                        break;
                    }
            if (!hit) {
                list_push(R->a, l, rstr(R, s, e));
                break;
            }
            size_t b = (size_t)(hit - s) + d->n;
            list_push(R->a, l, rstr(R, s + b, e - b));
            e = (size_t)(hit - s);
        }
        for (size_t i = 0; i < l->n / 2; i++) {
            struct jv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    }
    return mk_list(l, 0);
}

static struct jv str_replace(struct rs *R, const struct node *at, struct jv v, struct jv old,
                             struct jv new, int64_t count)
{
    if (old.t != JT_STR || new.t != JT_STR)
        rfail(R, at, RKV_EFORMAT, "replace() arguments must be str");
    const char *s = v.u.s->s;
    size_t n = v.u.s->n;
    const struct jstr *o = old.u.s, *w = new.u.s;
    struct sbuf b;
    sb_init(&b, R->a, R->max_output, R->err);
    step(R, at, n / 16 + 1);
    if (!o->n) {
        int64_t done = 0;
        for (size_t i = 0; i <= n;) {
            if (count < 0 || done < count) {
                sb_put(&b, w->s, w->n);
                done++;
            }
            if (i == n)
                break;
            uint32_t cp;
            size_t l = u8_dec((const unsigned char *)s + i, n - i, &cp);
            sb_put(&b, s + i, l);
            i += l;
        }
        return sb_val(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        const char *hit = count >= 0 && done >= count ? NULL : memmem(s + i, n - i, o->s, o->n);
        if (!hit) {
            sb_put(&b, s + i, n - i);
            break;
        }
        sb_put(&b, s + i, (size_t)(hit - s) - i);
        sb_put(&b, w->s, w->n);
        i = (size_t)(hit - s) + o->n;
        done++;
    }
    return sb_val(&b);
}

/* str.splitlines(keepends) */
static struct jlist *str_lines(struct rs *R, const char *s, size_t n, bool keepends)
{
    struct jlist *l = list_new(R->a, 0);
    size_t i = 0, start = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = u8_dec((const unsigned char *)s + i, n - i, &cp);
        if (u_linebreak(cp)) {
            size_t end = i;
            i += len;
            if (cp == '\r' && i < n && s[i] == '\n')
                i++;
            list_push(R->a, l, rstr(R, s + start, (keepends ? i : end) - start));
            start = i;
        } else {
            i += len;
        }
    }
    if (start < n)
        list_push(R->a, l, rstr(R, s + start, n - start));
    return l;
}

/* --- argument binding --- */

struct args {
    const struct jv *v;
    size_t n;
    const char **kn;
    const struct jv *kv;
    size_t nk;
};

/* params: names in order; out[i] = the value or MISSING */
static void bind(struct rs *R, const struct node *at, const char *what, const char *const *params,
                 size_t np, const struct args *a, struct jv *out)
{
    if (a->n > np)
        rfail(R, at, RKV_EFORMAT, "%s takes at most %zu argument(s), %zu given", what, np, a->n);
    for (size_t i = 0; i < np; i++)
        out[i] = i < a->n ? a->v[i] : MISSING;
    for (size_t k = 0; k < a->nk; k++) {
        size_t i = 0;
        while (i < np && strcmp(params[i], a->kn[k]))
            i++;
        if (i == np)
            rfail(R, at, RKV_EFORMAT, "%s got an unexpected keyword argument '%s'", what, a->kn[k]);
        if (out[i].t != JT_MISSING)
            rfail(R, at, RKV_EFORMAT, "%s got multiple values for argument '%s'", what, a->kn[k]);
        out[i] = a->kv[k];
    }
}

static struct jv or_default(struct jv v, struct jv def)
{
    return v.t == JT_MISSING ? def : v;
}

static int64_t need_int(struct rs *R, const struct node *at, struct jv v, const char *what)
{
    if (!int_like(v))
        rfail(R, at, RKV_EFORMAT, "%s must be an integer, not '%s'", what, type_name(v));
    return v.u.i;
}

static const struct jstr *need_str(struct rs *R, const struct node *at, struct jv v,
                                   const char *what)
{
    if (v.t != JT_STR)
        rfail(R, at, RKV_EFORMAT, "%s must be a string, not '%s'", what, type_name(v));
    return v.u.s;
}

/* --- evaluation entry points used by filters --- */

static struct jv eval(struct rs *R, const struct node *e, struct scope *sc);
static bool run_test(struct rs *R, const struct node *at, const char *name, struct jv x,
                     const struct args *a);
static struct jv run_filter(struct rs *R, const struct node *at, const char *name, struct jv x,
                            const struct args *a);

/* jinja2's make_attrgetter: "a.b.0" looked up part by part */
static struct jv attr_path(struct rs *R, const struct node *at, struct jv item, struct jv attr)
{
    if (int_like(attr))
        return get_item(R, at, item, attr);
    const struct jstr *p = need_str(R, at, attr, "attribute");
    size_t i = 0;
    for (;;) {
        const char *dot = memchr(p->s + i, '.', p->n - i);
        size_t e = dot ? (size_t)(dot - p->s) : p->n;
        struct jv key = rstr(R, p->s + i, e - i);
        bool digits = e > i;
        for (size_t k = i; k < e; k++)
            digits = digits && is_digit(p->s[k]);
        if (digits)
            key = mk_int(strtoll(key.u.s->s, NULL, 10));
        item = get_item(R, at, item, key);
        if (!dot)
            return item;
        i = e + 1;
    }
}

/* the key a sort/unique/min/max compares: the attribute, lowercased unless
 * case_sensitive */
static struct jv sort_key(struct rs *R, const struct node *at, struct jv item, struct jv attr,
                          bool case_sensitive)
{
    struct jv k = attr.t == JT_MISSING || attr.t == JT_NONE ? item : attr_path(R, at, item, attr);
    if (!case_sensitive && k.t == JT_STR)
        k = str_case(R, k, C_LOWER);
    return k;
}

/* stable merge sort of idx by keys */
static void sort_idx(struct rs *R, const struct node *at, size_t *idx, size_t *tmp, size_t n,
                     const struct jv *keys, bool reverse)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    sort_idx(R, at, idx, tmp, h, keys, reverse);
    sort_idx(R, at, idx + h, tmp, n - h, keys, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = cmp_order(R, at, "<", keys[idx[j]], keys[idx[i]], 0);
        /* reverse keeps equal items in order, as Python's sort(reverse=True) */
        bool take_right =
            reverse ? cmp_order(R, at, "<", keys[idx[i]], keys[idx[j]], 0) == -1 : c == -1;
        tmp[k++] = take_right ? idx[j++] : idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    step(R, at, n);
}

static struct jlist *sorted(struct rs *R, const struct node *at, const struct jlist *items,
                            const struct jv *keys, bool reverse)
{
    size_t n = items->n;
    size_t *idx = arena_alloc(R->a, (n + 1) * sizeof *idx),
           *tmp = arena_alloc(R->a, (n + 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    sort_idx(R, at, idx, tmp, n, keys, reverse);
    struct jlist *l = list_new(R->a, n);
    for (size_t i = 0; i < n; i++)
        l->v[i] = items->v[idx[i]];
    l->n = n;
    return l;
}

static struct jv html_escape(struct rs *R, struct jv v)
{
    v = str_of(R, v);
    struct sbuf b;
    sb_init(&b, R->a, R->max_output, R->err);
    for (size_t i = 0; i < v.u.s->n; i++) {
        char c = v.u.s->s[i];
        switch (c) {
        case '&': sb_puts(&b, "&amp;"); break;
        case '<': sb_puts(&b, "&lt;"); break;
        case '>': sb_puts(&b, "&gt;"); break;
        case '"': sb_puts(&b, "&#34;"); break;
        case '\'': sb_puts(&b, "&#39;"); break;
        default: sb_put(&b, &c, 1);
        }
    }
    return sb_val(&b);
}

static struct jv to_json(struct rs *R, const struct node *at, struct jv x, struct jv *p)
{
    /* HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    struct json_opts o = {.ascii = p[0].t != JT_MISSING && truthy(p[0]),
                          .sort = p[3].t != JT_MISSING && truthy(p[3])};
    struct jv ind = p[1];
    if (int_like(ind)) {
        int64_t k = ind.u.i < 0 ? 0 : ind.u.i;
        if (k > 64)
            rfail(R, at, RKV_EUNSUPPORTED, "tojson indent larger than 64");
        char *sp = arena_alloc(R->a, (size_t)k + 1);
        memset(sp, ' ', (size_t)k);
        sp[k] = 0;
        o.ind = sp;
        o.ind_n = (size_t)k;
    } else if (ind.t == JT_STR) {
        o.ind = ind.u.s->s;
        o.ind_n = ind.u.s->n;
    } else if (ind.t != JT_MISSING && ind.t != JT_NONE) {
        rfail(R, at, RKV_EFORMAT, "tojson indent must be an integer or a string");
    }
    o.isep = o.ind ? "," : ", ";
    o.ksep = ": ";
    if (p[2].t == JT_LIST && p[2].u.l->n == 2 && p[2].u.l->v[0].t == JT_STR &&
        p[2].u.l->v[1].t == JT_STR) {
        o.isep = p[2].u.l->v[0].u.s->s;
        o.ksep = p[2].u.l->v[1].u.s->s;
    } else if (p[2].t != JT_MISSING && p[2].t != JT_NONE) {
        rfail(R, at, RKV_EFORMAT, "tojson separators must be a pair of strings");
    }
    struct sbuf b;
    sb_init(&b, R->a, R->max_output, R->err);
    const char *bad = json_val(&b, x, &o, 0);
    if (bad)
        rfail(R, at, RKV_EFORMAT, "object of type %s is not JSON serializable", bad);
    step(R, at, b.n / 64 + 1);
    return sb_val(&b);
}

static struct jv parse_int_str(const struct jstr *s, int base, bool *ok)
{
    /* Python's int(str, base): whitespace around, a sign, digits with single underscores */
    const char *p = s->s, *e = s->s + s->n;
    while (p < e && ws_fwd(p, 0, (size_t)(e - p)))
        p += ws_fwd(p, 0, (size_t)(e - p));
    while (e > p && ws_back(p, 0, (size_t)(e - p)))
        e -= ws_back(p, 0, (size_t)(e - p));
    bool neg = false;
    if (p < e && (*p == '+' || *p == '-'))
        neg = *p++ == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (e - p > 2 && p[0] == '0') {
            char c = (char)(p[1] | 0x20);
            int b2 = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
            if (b2 && (base == 0 || base == b2)) {
                base = b2;
                p += 2;
                if (p < e && *p == '_')
                    p++;
            }
        }
        if (base == 0)
            base = 10;
    }
    *ok = false;
    if (p >= e)
        return NONE;
    uint64_t v = 0;
    bool last_us = true;
    for (; p < e; p++) {
        if (*p == '_') {
            if (last_us)
                return NONE;
            last_us = true;
            continue;
        }
        char c = (char)(*p | 0x20);
        int d = is_digit(c) ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
        if (d >= base)
            return NONE;
        if (v > ((uint64_t)INT64_MAX + 1 - (uint64_t)d) / (uint64_t)base)
            return NONE;
        v = v * (uint64_t)base + (uint64_t)d;
        last_us = false;
    }
    if (last_us || (!neg && v > (uint64_t)INT64_MAX))
        return NONE;
    *ok = true;
    return mk_int(neg ? (int64_t)(0 - v) : (int64_t)v);
}

static bool parse_float_str(const struct jstr *s, double *out)
{
    char *end;
    const char *p = s->s;
    size_t n = s->n;
    while (n && ws_fwd(p, 0, n)) {
        size_t l = ws_fwd(p, 0, n);
        p += l;
        n -= l;
    }
    while (n && ws_back(p, 0, n))
        n -= ws_back(p, 0, n);
    if (!n || n > 300)
        return false;
    char tmp[320];
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '_') {
            if (!i || i + 1 == n || !is_digit(p[i - 1]) || !is_digit(p[i + 1]))
                return false;
            continue;
        }
        if (p[i] == 'x' || p[i] == 'X' || p[i] == '(')
            return false; /* strtod's hex floats and nan(...) are not Python's */
        tmp[m++] = p[i];
    }
    tmp[m] = 0;
    *out = strtod(tmp, &end);
    return end == tmp + m;
}

static const char *const F_DEFAULT[] = {"default_value", "boolean"};
static const char *const F_TOJSON[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
static const char *const F_INDENT[] = {"width", "first", "blank"};
static const char *const F_REPLACE[] = {"old", "new", "count"};
static const char *const F_JOIN[] = {"d", "attribute"};
static const char *const F_SORT[] = {"reverse", "case_sensitive", "attribute"};
static const char *const F_UNIQUE[] = {"case_sensitive", "attribute"};
static const char *const F_INT[] = {"default", "base"};
static const char *const F_FLOAT[] = {"default"};
static const char *const F_ROUND[] = {"precision", "method"};
static const char *const F_TRIM[] = {"chars"};
static const char *const F_SUM[] = {"attribute", "start"};
static const char *const F_DICTSORT[] = {"case_sensitive", "by", "reverse"};
static const char *const F_CENTER[] = {"width"};
static const char *const F_ATTR[] = {"name"};

#define BIND(params, out) bind(R, at, what, params, sizeof params / sizeof *params, a, out)

static struct jv filter_select(struct rs *R, const struct node *at, struct jv x,
                               const struct args *a, bool want, bool by_attr, const char *what)
{
    if (a->nk)
        rfail(R, at, RKV_EFORMAT, "%s takes no keyword arguments", what);
    size_t k = 0;
    struct jv attr = MISSING;
    if (by_attr) {
        if (a->n < 1)
            rfail(R, at, RKV_EFORMAT, "%s needs an attribute name", what);
        attr = a->v[k++];
    }
    const char *test = NULL;
    if (k < a->n) {
        test = need_str(R, at, a->v[k++], "the test name")->s;
        if (!in_names(test_names, test))
            rfail(R, at, RKV_EUNSUPPORTED, "unknown test '%s'", test);
    }
    struct args ta = {.v = a->v + k, .n = a->n - k};
    struct jlist *out = list_new(R->a, 0);
    if (!truthy(x))
        return mk_list(out, 0);
    const struct jlist *items = iter_items(R, at, x);
    step(R, at, items->n);
    for (size_t i = 0; i < items->n; i++) {
        struct jv it = items->v[i];
        struct jv probe = by_attr ? attr_path(R, at, it, attr) : it;
        bool ok = test ? run_test(R, at, test, probe, &ta) : truthy(probe);
        if (ok == want)
            list_push(R->a, out, it);
    }
    return mk_list(out, 0);
}

static struct jv run_filter(struct rs *R, const struct node *at, const char *name, struct jv x,
                            const struct args *a)
{
    char what[64];
    snprintf(what, sizeof what, "filter '%s'", name);
    struct jv p[4] = {MISSING, MISSING, MISSING, MISSING};
    step(R, at, 1);
    if (!strcmp(name, "tojson")) {
        BIND(F_TOJSON, p);
        return to_json(R, at, x, p);
    }
    if (!strcmp(name, "trim")) {
        BIND(F_TRIM, p);
        struct jv s = str_of(R, x);
        const struct jstr *chars = p[0].t == JT_STR ? p[0].u.s : NULL;
        return str_strip(R, s, chars, true, true);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        bind(R, at, what, NULL, 0, a, p);
        return mk_int(len_of(R, at, x));
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize") ||
        !strcmp(name, "title")) {
        bind(R, at, what, NULL, 0, a, p);
        int mode = name[0] == 'u'   ? C_UPPER
                   : name[0] == 'l' ? C_LOWER
                   : name[0] == 'c' ? C_CAPITALIZE
                                    : C_JTITLE;
        return str_case(R, str_of(R, x), mode);
    }
    if (!strcmp(name, "string") || !strcmp(name, "safe")) {
        bind(R, at, what, NULL, 0, a, p);
        return str_of(R, x);
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape")) {
        bind(R, at, what, NULL, 0, a, p);
        return html_escape(R, x);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        BIND(F_DEFAULT, p);
        struct jv def = or_default(p[0], rstr(R, "", 0));
        if (x.t == JT_UNDEF || (truthy(or_default(p[1], mk_bool(0))) && !truthy(x)))
            return def;
        return x;
    }
    if (!strcmp(name, "replace")) {
        BIND(F_REPLACE, p);
        if (p[0].t == JT_MISSING || p[1].t == JT_MISSING)
            rfail(R, at, RKV_EFORMAT, "%s needs old and new", what);
        int64_t count =
            p[2].t == JT_MISSING || p[2].t == JT_NONE ? -1 : need_int(R, at, p[2], "count");
        return str_replace(R, at, str_of(R, x), str_of(R, p[0]), str_of(R, p[1]), count);
    }
    if (!strcmp(name, "join")) {
        BIND(F_JOIN, p);
        struct jv sep = str_of(R, or_default(p[0], rstr(R, "", 0)));
        const struct jlist *items = iter_items(R, at, x);
        step(R, at, items->n);
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                sb_put(&b, sep.u.s->s, sep.u.s->n);
            struct jv it = items->v[i];
            if (p[1].t != JT_MISSING && p[1].t != JT_NONE)
                it = attr_path(R, at, it, p[1]);
            v_str(&b, it, 0);
        }
        return sb_val(&b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        bind(R, at, what, NULL, 0, a, p);
        if (name[0] == 'l' && x.t == JT_UNDEF)
            fail_undef(R, at, x);
        const struct jlist *items = iter_items(R, at, x);
        if (!items->n)
            return mk_undef(NULL);
        return items->v[name[0] == 'f' ? 0 : items->n - 1];
    }
    if (!strcmp(name, "list")) {
        bind(R, at, what, NULL, 0, a, p);
        const struct jlist *items = iter_items(R, at, x);
        struct jlist *l = list_new(R->a, items->n);
        if (items->n)
            memcpy(l->v, items->v, items->n * sizeof *l->v);
        l->n = items->n;
        return mk_list(l, 0);
    }
    if (!strcmp(name, "items")) {
        bind(R, at, what, NULL, 0, a, p);
        struct jlist *l = list_new(R->a, 0);
        if (x.t == JT_UNDEF)
            return mk_list(l, 0);
        if (x.t != JT_DICT)
            rfail(R, at, RKV_EFORMAT, "can only get item pairs from a mapping");
        for (size_t i = 0; i < x.u.d->n; i++) {
            struct jlist *pair = list_new(R->a, 2);
            pair->v[0] = x.u.d->k[i];
            pair->v[1] = x.u.d->v[i];
            pair->n = 2;
            list_push(R->a, l, mk_list(pair, 1));
        }
        return mk_list(l, 0);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return filter_select(R, at, x, a, name[0] == 's', true, what);
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return filter_select(R, at, x, a, name[0] == 's', false, what);
    if (!strcmp(name, "map")) {
        struct jlist *out = list_new(R->a, 0);
        bool by_attr = !a->n && a->nk;
        struct jv attr = MISSING, def = NONE;
        const char *fname = NULL;
        struct args fa = {0};
        if (by_attr) {
            for (size_t k = 0; k < a->nk; k++) {
                if (!strcmp(a->kn[k], "attribute"))
                    attr = a->kv[k];
                else if (!strcmp(a->kn[k], "default"))
                    def = a->kv[k];
                else
                    rfail(R, at, RKV_EFORMAT, "unexpected keyword argument '%s'", a->kn[k]);
            }
            if (attr.t == JT_MISSING)
                rfail(R, at, RKV_EFORMAT, "map needs attribute= or a filter name");
        } else {
            if (!a->n)
                rfail(R, at, RKV_EFORMAT, "map requires a filter argument");
            fname = need_str(R, at, a->v[0], "the filter name")->s;
            if (!in_names(filter_names, fname))
                rfail(R, at, RKV_EUNSUPPORTED, "unknown filter '%s'", fname);
            fa = (struct args){a->v + 1, a->n - 1, a->kn, a->kv, a->nk};
        }
        if (!truthy(x))
            return mk_list(out, 0);
        const struct jlist *items = iter_items(R, at, x);
        step(R, at, items->n);
        for (size_t i = 0; i < items->n; i++) {
            struct jv r;
            if (by_attr) {
                r = attr_path(R, at, items->v[i], attr);
                if (r.t == JT_UNDEF && def.t != JT_NONE)
                    r = def;
            } else {
                r = run_filter(R, at, fname, items->v[i], &fa);
            }
            list_push(R->a, out, r);
        }
        return mk_list(out, 0);
    }
    if (!strcmp(name, "int")) {
        BIND(F_INT, p);
        struct jv def = or_default(p[0], mk_int(0));
        int64_t base = p[1].t == JT_MISSING ? 10 : need_int(R, at, p[1], "base");
        if (x.t == JT_INT)
            return x;
        if (x.t == JT_BOOL)
            return mk_int(x.u.i);
        if (x.t == JT_FLOAT || x.t == JT_STR) {
            double f = 0;
            if (x.t == JT_STR) {
                bool ok;
                struct jv r = parse_int_str(x.u.s, (int)base, &ok);
                if (ok)
                    return r;
                if (!parse_float_str(x.u.s, &f))
                    return def;
            } else {
                f = x.u.f;
            }
            if (isnan(f) || isinf(f))
                rfail(R, at, RKV_EFORMAT, "cannot convert float %s to integer",
                      isnan(f) ? "NaN" : "infinity");
            if (f >= 9.2233720368547758e18 || f < -9.2233720368547758e18)
                rfail(R, at, RKV_ERANGE, "integer does not fit in 64 bits");
            return mk_int((int64_t)f);
        }
        return def;
    }
    if (!strcmp(name, "float")) {
        BIND(F_FLOAT, p);
        struct jv def = or_default(p[0], mk_float(0.0));
        if (is_num(x))
            return mk_float(num_f(x));
        double f;
        if (x.t == JT_STR && parse_float_str(x.u.s, &f))
            return mk_float(f);
        return def;
    }
    if (!strcmp(name, "abs")) {
        bind(R, at, what, NULL, 0, a, p);
        if (x.t == JT_FLOAT)
            return mk_float(fabs(x.u.f));
        if (int_like(x)) {
            if (x.u.i == INT64_MIN)
                rfail(R, at, RKV_ERANGE, "integer does not fit in 64 bits");
            return mk_int(x.u.i < 0 ? -x.u.i : x.u.i);
        }
        rfail(R, at, RKV_EFORMAT, "bad operand type for abs(): '%s'", type_name(x));
    }
    if (!strcmp(name, "round")) {
        BIND(F_ROUND, p);
        int64_t prec = p[0].t == JT_MISSING ? 0 : need_int(R, at, p[0], "precision");
        const char *method = p[1].t == JT_MISSING ? "common" : need_str(R, at, p[1], "method")->s;
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            rfail(R, at, RKV_EFORMAT, "method must be common, ceil or floor");
        if (!is_num(x))
            rfail(R, at, RKV_EFORMAT, "type %s doesn't define __round__ method", type_name(x));
        if (prec < -300 || prec > 300)
            rfail(R, at, RKV_EUNSUPPORTED, "round precision out of range");
        if (!strcmp(method, "common")) {
            if (int_like(x) && prec >= 0)
                return mk_int(x.u.i);
            double f = num_f(x);
            if (isnan(f) || isinf(f))
                return mk_float(f);
            if (prec >= 0) {
                char buf[400];
                snprintf(buf, sizeof buf, "%.*f", (int)prec, f);
                return mk_float(strtod(buf, NULL));
            }
            double m = pow(10.0, (double)-prec);
            return mk_float(nearbyint(f / m) * m);
        }
        double m = pow(10.0, (double)prec), f = num_f(x) * m;
        return mk_float((method[0] == 'c' ? ceil(f) : floor(f)) / m);
    }
    if (!strcmp(name, "reverse")) {
        bind(R, at, what, NULL, 0, a, p);
        if (x.t == JT_STR) {
            struct args none = {0};
            (void)none;
            return do_slice(R, at, x, MISSING, MISSING, mk_int(-1));
        }
        const struct jlist *items = iter_items(R, at, x);
        struct jlist *l = list_new(R->a, items->n);
        for (size_t i = 0; i < items->n; i++)
            l->v[i] = items->v[items->n - 1 - i];
        l->n = items->n;
        return mk_list(l, 0);
    }
    if (!strcmp(name, "sort")) {
        BIND(F_SORT, p);
        const struct jlist *items = iter_items(R, at, x);
        bool cs = truthy(or_default(p[1], mk_bool(0)));
        struct jv *keys = arena_alloc(R->a, (items->n + 1) * sizeof *keys);
        for (size_t i = 0; i < items->n; i++)
            keys[i] = sort_key(R, at, items->v[i], p[2], cs);
        return mk_list(sorted(R, at, items, keys, truthy(or_default(p[0], mk_bool(0)))), 0);
    }
    if (!strcmp(name, "dictsort")) {
        BIND(F_DICTSORT, p);
        if (x.t != JT_DICT)
            rfail(R, at, RKV_EFORMAT, "dictsort needs a mapping");
        const char *by = p[1].t == JT_MISSING ? "key" : need_str(R, at, p[1], "by")->s;
        bool by_value = !strcmp(by, "value");
        if (!by_value && strcmp(by, "key"))
            rfail(R, at, RKV_EFORMAT, "you can only sort by either \"key\" or \"value\"");
        bool cs = truthy(or_default(p[0], mk_bool(0)));
        struct jlist *pairs = list_new(R->a, x.u.d->n);
        struct jv *keys = arena_alloc(R->a, (x.u.d->n + 1) * sizeof *keys);
        for (size_t i = 0; i < x.u.d->n; i++) {
            struct jlist *pair = list_new(R->a, 2);
            pair->v[0] = x.u.d->k[i];
            pair->v[1] = x.u.d->v[i];
            pair->n = 2;
            pairs->v[i] = mk_list(pair, 1);
            keys[i] = sort_key(R, at, by_value ? pair->v[1] : pair->v[0], MISSING, cs);
        }
        pairs->n = x.u.d->n;
        return mk_list(sorted(R, at, pairs, keys, truthy(or_default(p[2], mk_bool(0)))), 0);
    }
    if (!strcmp(name, "unique")) {
        BIND(F_UNIQUE, p);
        const struct jlist *items = iter_items(R, at, x);
        bool cs = truthy(or_default(p[0], mk_bool(0)));
        struct jlist *out = list_new(R->a, 0), *seen = list_new(R->a, 0);
        step(R, at, items->n * (items->n + 1) / 2);
        for (size_t i = 0; i < items->n; i++) {
            struct jv k = sort_key(R, at, items->v[i], p[1], cs);
            if (k.t == JT_LIST && !k.tuple)
                rfail(R, at, RKV_EFORMAT, "unhashable type: 'list'");
            bool dup = false;
            for (size_t j = 0; j < seen->n && !dup; j++)
                dup = v_eq(seen->v[j], k);
            if (!dup) {
                list_push(R->a, seen, k);
                list_push(R->a, out, items->v[i]);
            }
        }
        return mk_list(out, 0);
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        BIND(F_UNIQUE, p);
        const struct jlist *items = iter_items(R, at, x);
        if (!items->n)
            return mk_undef(NULL);
        bool cs = truthy(or_default(p[0], mk_bool(0)));
        size_t best = 0;
        struct jv bk = sort_key(R, at, items->v[0], p[1], cs);
        for (size_t i = 1; i < items->n; i++) {
            struct jv k = sort_key(R, at, items->v[i], p[1], cs);
            int c = cmp_order(R, at, name[1] == 'i' ? "<" : ">", k, bk, 0);
            if (name[1] == 'i' ? c == -1 : c == 1) {
                best = i;
                bk = k;
            }
        }
        return items->v[best];
    }
    if (!strcmp(name, "sum")) {
        BIND(F_SUM, p);
        const struct jlist *items = iter_items(R, at, x);
        struct jv acc = or_default(p[1], mk_int(0));
        for (size_t i = 0; i < items->n; i++) {
            struct jv it = items->v[i];
            if (p[0].t != JT_MISSING && p[0].t != JT_NONE)
                it = attr_path(R, at, it, p[0]);
            acc = binop(R, at, OP_ADD, acc, it);
        }
        return acc;
    }
    if (!strcmp(name, "indent")) {
        BIND(F_INDENT, p);
        if (x.t != JT_STR)
            rfail(R, at, RKV_EFORMAT, "indent needs a string, not '%s'", type_name(x));
        struct jv w = or_default(p[0], mk_int(4));
        struct jv ind;
        if (w.t == JT_STR) {
            ind = w;
        } else {
            int64_t k = need_int(R, at, w, "width");
            if (k > 256)
                rfail(R, at, RKV_EUNSUPPORTED, "indent width larger than 256");
            ind = repeat(R, at, rstr(R, " ", 1), k);
        }
        bool first = truthy(or_default(p[1], mk_bool(0)));
        bool blank = truthy(or_default(p[2], mk_bool(0)));
        struct sbuf s0;
        sb_init(&s0, R->a, R->max_output, R->err);
        sb_put(&s0, x.u.s->s, x.u.s->n);
        sb_put(&s0, "\n", 1);
        struct jlist *lines = str_lines(R, s0.p, s0.n, false);
        step(R, at, lines->n);
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        if (first)
            sb_put(&b, ind.u.s->s, ind.u.s->n);
        for (size_t i = 0; i < lines->n; i++) {
            const struct jstr *ln = lines->v[i].u.s;
            if (i) {
                sb_put(&b, "\n", 1);
                if (blank || ln->n)
                    sb_put(&b, ind.u.s->s, ind.u.s->n);
            }
            sb_put(&b, ln->s, ln->n);
        }
        return sb_val(&b);
    }
    if (!strcmp(name, "center")) {
        BIND(F_CENTER, p);
        struct jv s = str_of(R, x);
        int64_t width = p[0].t == JT_MISSING ? 80 : need_int(R, at, p[0], "width");
        int64_t len = (int64_t)u8_len(s.u.s->s, s.u.s->n);
        if (width <= len)
            return s;
        if (width > 100000)
            rfail(R, at, RKV_EUNSUPPORTED, "center width larger than 100000");
        int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        for (int64_t i = 0; i < left; i++)
            sb_put(&b, " ", 1);
        sb_put(&b, s.u.s->s, s.u.s->n);
        for (int64_t i = 0; i < marg - left; i++)
            sb_put(&b, " ", 1);
        return sb_val(&b);
    }
    if (!strcmp(name, "wordcount")) {
        bind(R, at, what, NULL, 0, a, p);
        struct jv s = str_of(R, x);
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s.u.s->n; i++) {
            unsigned char c = (unsigned char)s.u.s->s[i];
            bool w = c >= 0x80 || is_digit((char)c) || a_alpha((char)c) || c == '_';
            if (w && !in)
                words++;
            in = w;
        }
        return mk_int(words);
    }
    if (!strcmp(name, "attr")) {
        BIND(F_ATTR, p);
        const struct jstr *n = need_str(R, at, p[0], "the attribute name");
        if (x.t == JT_DICT || x.t == JT_NS)
            return x.t == JT_DICT && in_names(dict_methods, n->s) ? mk_method(R, x, n->s)
                   : x.t == JT_NS                                 ? get_attr(R, at, x, n->s)
                                                                  : mk_undef(n->s);
        if (x.t == JT_UNDEF)
            return mk_undef(n->s);
        return get_attr(R, at, x, n->s);
    }
    rfail(R, at, RKV_EUNSUPPORTED, "unknown filter '%s'", name);
}

static bool run_test(struct rs *R, const struct node *at, const char *name, struct jv x,
                     const struct args *a)
{
    char what[64];
    snprintf(what, sizeof what, "test '%s'", name);
    struct jv arg = MISSING;
    static const char *const one[] = {"other"};
    step(R, at, 1);
    if (!strcmp(name, "defined"))
        return x.t != JT_UNDEF;
    if (!strcmp(name, "undefined"))
        return x.t == JT_UNDEF;
    if (!strcmp(name, "none"))
        return x.t == JT_NONE;
    if (!strcmp(name, "boolean"))
        return x.t == JT_BOOL;
    if (!strcmp(name, "true"))
        return x.t == JT_BOOL && x.u.i;
    if (!strcmp(name, "false"))
        return x.t == JT_BOOL && !x.u.i;
    if (!strcmp(name, "integer"))
        return x.t == JT_INT;
    if (!strcmp(name, "float"))
        return x.t == JT_FLOAT;
    if (!strcmp(name, "number"))
        return is_num(x);
    if (!strcmp(name, "string"))
        return x.t == JT_STR;
    if (!strcmp(name, "mapping"))
        return x.t == JT_DICT;
    if (!strcmp(name, "iterable"))
        return x.t == JT_STR || x.t == JT_LIST || x.t == JT_DICT || x.t == JT_UNDEF ||
               x.t == JT_LOOP;
    if (!strcmp(name, "sequence"))
        return x.t == JT_STR || x.t == JT_LIST || x.t == JT_DICT || x.t == JT_UNDEF;
    if (!strcmp(name, "callable"))
        return x.t == JT_MACRO || x.t == JT_FUNC || x.t == JT_METHOD;
    if (!strcmp(name, "escaped"))
        return false;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        struct jv s = str_of(R, x);
        bool cased = false;
        for (size_t i = 0; i < s.u.s->n;) {
            uint32_t c;
            i += u8_dec((const unsigned char *)s.u.s->s + i, s.u.s->n - i, &c);
            if (u_cased(c)) {
                cased = true;
                if (name[0] == 'l' ? u_lower(c) != c : u_upper(c) != c)
                    return false;
            }
        }
        return cased;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        int64_t v = need_int(R, at, x, "the value");
        return ((v % 2 != 0) == (name[0] == 'o'));
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        const struct jstr *s = x.t == JT_STR ? x.u.s : NULL;
        return s && in_names(name[0] == 'f' ? filter_names : test_names, s->s);
    }
    bind(R, at, what, one, 1, a, &arg);
    if (arg.t == JT_MISSING)
        rfail(R, at, RKV_EFORMAT, "%s needs an argument", what);
    if (!strcmp(name, "divisibleby")) {
        struct jv m = binop(R, at, OP_MOD, x, arg);
        return !truthy(m) && m.t != JT_UNDEF;
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
        return compare(R, at, CMP_EQ, x, arg);
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return compare(R, at, CMP_NE, x, arg);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<"))
        return compare(R, at, CMP_LT, x, arg);
    if (!strcmp(name, "le") || !strcmp(name, "<="))
        return compare(R, at, CMP_LE, x, arg);
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">"))
        return compare(R, at, CMP_GT, x, arg);
    if (!strcmp(name, "ge") || !strcmp(name, ">="))
        return compare(R, at, CMP_GE, x, arg);
    if (!strcmp(name, "in"))
        return compare(R, at, CMP_IN, x, arg);
    if (!strcmp(name, "sameas")) {
        if (x.t != arg.t)
            return false;
        if (x.t == JT_NONE || x.t == JT_BOOL || x.t == JT_UNDEF)
            return x.t != JT_BOOL || x.u.i == arg.u.i;
        if (x.t == JT_INT)
            return x.u.i == arg.u.i && x.u.i >= -5 && x.u.i <= 256; /* CPython's small ints */
        return v_eq(x, arg) && x.u.l == arg.u.l;
    }
    rfail(R, at, RKV_EUNSUPPORTED, "unknown test '%s'", name);
}

/* --- methods and functions ------------------------------------------------- */

static const char *const M_SPLIT[] = {"sep", "maxsplit"};
static const char *const M_STRIP[] = {"chars"};
static const char *const M_REPLACE[] = {"old", "new", "count"};
static const char *const M_ONE[] = {"x"};
static const char *const M_GET[] = {"key", "default"};
static const char *const M_PAD[] = {"width", "fillchar"};
static const char *const M_LINES[] = {"keepends"};
static const char *const M_AFFIX[] = {"prefix", "start", "end"};

static bool str_affix(struct rs *R, const struct node *at, struct jv self, struct jv *p, bool end)
{
    if (p[1].t != JT_MISSING || p[2].t != JT_MISSING)
        self = do_slice(R, at, self, p[1], p[2], MISSING);
    const struct jstr *s = self.u.s;
    struct jv pre = p[0];
    size_t np = pre.t == JT_LIST && pre.tuple ? pre.u.l->n : 1;
    for (size_t i = 0; i < np; i++) {
        struct jv x = pre.t == JT_LIST && pre.tuple ? pre.u.l->v[i] : pre;
        const struct jstr *a =
            need_str(R, at, x, end ? "endswith's argument" : "startswith's argument");
        if (a->n <= s->n && !memcmp(end ? s->s + s->n - a->n : s->s, a->s, a->n))
            return true;
    }
    return false;
}

static int64_t cp_index(const struct jstr *s, const char *at)
{
    return (int64_t)u8_len(s->s, (size_t)(at - s->s));
}

static struct jv str_method(struct rs *R, const struct node *at, struct jv self, const char *name,
                            const struct args *a)
{
    char what[64];
    snprintf(what, sizeof what, "str.%s()", name);
    struct jv p[3] = {MISSING, MISSING, MISSING};
    const struct jstr *s = self.u.s;
    /* every method may walk the string: its length counts against the step budget (a loop
     * over a 16 MB string's find() ran for minutes on steps of one each) */
    step(R, at, s->n / 64 + 1);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        BIND(M_AFFIX, p);
        if (p[0].t == JT_MISSING)
            rfail(R, at, RKV_EFORMAT, "%s takes at least 1 argument", what);
        return mk_bool(str_affix(R, at, self, p, name[0] == 'e'));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        BIND(M_SPLIT, p);
        int64_t maxsplit = p[1].t == JT_MISSING ? -1 : need_int(R, at, p[1], "maxsplit");
        return str_split(R, at, self, p[0], maxsplit, name[0] == 'r');
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        BIND(M_STRIP, p);
        const struct jstr *chars = NULL;
        if (p[0].t != JT_MISSING && p[0].t != JT_NONE)
            chars = need_str(R, at, p[0], "chars");
        return str_strip(R, self, chars, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize") || !strcmp(name, "swapcase") || !strcmp(name, "casefold")) {
        bind(R, at, what, NULL, 0, a, p);
        int mode = !strcmp(name, "upper")        ? C_UPPER
                   : !strcmp(name, "title")      ? C_TITLE
                   : !strcmp(name, "capitalize") ? C_CAPITALIZE
                   : !strcmp(name, "swapcase")   ? C_SWAP
                                                 : C_LOWER;
        return str_case(R, self, mode);
    }
    if (!strcmp(name, "replace")) {
        BIND(M_REPLACE, p);
        if (p[0].t == JT_MISSING || p[1].t == JT_MISSING)
            rfail(R, at, RKV_EFORMAT, "%s takes at least 2 arguments", what);
        int64_t count = p[2].t == JT_MISSING ? -1 : need_int(R, at, p[2], "count");
        return str_replace(R, at, self, p[0], p[1], count);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") ||
        !strcmp(name, "rindex") || !strcmp(name, "count")) {
        BIND(M_ONE, p);
        const struct jstr *sub = need_str(R, at, p[0], "the substring");
        bool rev = name[0] == 'r';
        if (!strcmp(name, "count")) {
            if (!sub->n)
                return mk_int((int64_t)u8_len(s->s, s->n) + 1);
            int64_t k = 0;
            for (const char *q = s->s; (q = memmem(q, s->n - (size_t)(q - s->s), sub->s, sub->n));
                 q += sub->n)
                k++;
            return mk_int(k);
        }
        const char *hit = NULL;
        if (!rev) {
            hit = sub->n ? memmem(s->s, s->n, sub->s, sub->n) : s->s;
        } else if (sub->n <= s->n) {
            for (size_t k = s->n - sub->n + 1; k-- > 0;)
                if (!memcmp(s->s + k, sub->s, sub->n)) {
                    hit = s->s + k;
                    break;
                }
        }
        if (!hit) {
            if (strstr(name, "index"))
                rfail(R, at, RKV_EFORMAT, "substring not found");
            return mk_int(-1);
        }
        return mk_int(cp_index(s, hit));
    }
    if (!strcmp(name, "join")) {
        BIND(M_ONE, p);
        const struct jlist *items = iter_items(R, at, p[0]);
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        step(R, at, items->n);
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                sb_put(&b, s->s, s->n);
            const struct jstr *it = need_str(R, at, items->v[i], "a joined item");
            sb_put(&b, it->s, it->n);
        }
        return sb_val(&b);
    }
    if (!strcmp(name, "splitlines")) {
        BIND(M_LINES, p);
        return mk_list(str_lines(R, s->s, s->n, truthy(or_default(p[0], mk_bool(0)))), 0);
    }
    if (!strncmp(name, "is", 2)) {
        bind(R, at, what, NULL, 0, a, p);
        if (!s->n)
            return mk_bool(0);
        bool cased = false, all = true;
        for (size_t i = 0; i < s->n;) {
            uint32_t cp;
            i += u8_dec((const unsigned char *)s->s + i, s->n - i, &cp);
            char c = cp < 0x80 ? (char)cp : 0;
            bool ok;
            if (!strcmp(name, "isdigit") || !strcmp(name, "isnumeric") ||
                !strcmp(name, "isdecimal"))
                ok = is_digit(c);
            else if (!strcmp(name, "isalpha"))
                ok = a_alpha(c);
            else if (!strcmp(name, "isalnum"))
                ok = a_alpha(c) || is_digit(c);
            else if (!strcmp(name, "isspace"))
                ok = u_space(cp);
            else if (!strcmp(name, "islower") || !strcmp(name, "isupper")) {
                bool want_lower = name[2] == 'l';
                if (u_cased(cp)) {
                    cased = true;
                    ok = want_lower ? u_lower(cp) == cp : u_upper(cp) == cp;
                } else {
                    ok = true;
                }
            } else {
                rfail(R, at, RKV_EUNSUPPORTED, "%s is not supported", what);
            }
            all = all && ok;
        }
        if (!strcmp(name, "islower") || !strcmp(name, "isupper"))
            return mk_bool(all && cased);
        return mk_bool(all);
    }
    if (!strcmp(name, "center") || !strcmp(name, "ljust") || !strcmp(name, "rjust") ||
        !strcmp(name, "zfill")) {
        BIND(M_PAD, p);
        int64_t width = need_int(R, at, p[0], "width");
        const char *fill = " ";
        size_t fl = 1;
        if (p[1].t != JT_MISSING) {
            const struct jstr *f = need_str(R, at, p[1], "fillchar");
            if (u8_len(f->s, f->n) != 1)
                rfail(R, at, RKV_EFORMAT, "the fill character must be exactly one character long");
            fill = f->s;
            fl = f->n;
        }
        int64_t len = (int64_t)u8_len(s->s, s->n);
        if (width <= len)
            return self;
        if (width > 100000)
            rfail(R, at, RKV_EUNSUPPORTED, "padding width larger than 100000");
        int64_t marg = width - len, left;
        if (name[0] == 'c')
            left = marg / 2 + (marg & width & 1);
        else if (name[0] == 'l')
            left = 0;
        else
            left = marg;
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        if (name[0] == 'z') {
            size_t sign = s->n && (s->s[0] == '+' || s->s[0] == '-');
            sb_put(&b, s->s, sign);
            for (int64_t i = 0; i < marg; i++)
                sb_put(&b, "0", 1);
            sb_put(&b, s->s + sign, s->n - sign);
            return sb_val(&b);
        }
        for (int64_t i = 0; i < left; i++)
            sb_put(&b, fill, fl);
        sb_put(&b, s->s, s->n);
        for (int64_t i = 0; i < marg - left; i++)
            sb_put(&b, fill, fl);
        return sb_val(&b);
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        BIND(M_ONE, p);
        const struct jstr *x = need_str(R, at, p[0], "the affix");
        bool suf = name[6] == 's';
        if (x->n <= s->n && !memcmp(suf ? s->s + s->n - x->n : s->s, x->s, x->n))
            return rstr(R, suf ? s->s : s->s + x->n, s->n - x->n);
        return self;
    }
    if (!strcmp(name, "partition") || !strcmp(name, "rpartition")) {
        BIND(M_ONE, p);
        const struct jstr *sep = need_str(R, at, p[0], "the separator");
        if (!sep->n)
            rfail(R, at, RKV_EFORMAT, "empty separator");
        const char *hit = NULL;
        if (name[0] == 'p') {
            hit = memmem(s->s, s->n, sep->s, sep->n);
        } else if (sep->n <= s->n) {
            for (size_t k = s->n - sep->n + 1; k-- > 0;)
                if (!memcmp(s->s + k, sep->s, sep->n)) {
                    hit = s->s + k;
                    break;
                }
        }
        struct jlist *l = list_new(R->a, 3);
        l->n = 3;
        if (!hit) {
            struct jv e = rstr(R, "", 0);
            l->v[0] = name[0] == 'p' ? self : e;
            l->v[1] = e;
            l->v[2] = name[0] == 'p' ? e : self;
        } else {
            size_t off = (size_t)(hit - s->s);
            l->v[0] = rstr(R, s->s, off);
            l->v[1] = rstr(R, sep->s, sep->n);
            l->v[2] = rstr(R, s->s + off + sep->n, s->n - off - sep->n);
        }
        return mk_list(l, 1);
    }
    rfail(R, at, RKV_EUNSUPPORTED, "%s is not supported", what);
}

static struct jv call_method(struct rs *R, const struct node *at, const struct jmethod *me,
                             const struct args *a)
{
    struct jv self = me->self;
    const char *name = me->name;
    char what[64];
    struct jv p[2] = {MISSING, MISSING};
    if (self.t == JT_STR)
        return str_method(R, at, self, name, a);
    if (self.t == JT_LOOP) {
        /* loop.cycle(a, b, ...) */
        if (!a->n)
            rfail(R, at, RKV_EFORMAT, "no items for cycling given");
        return a->v[self.u.lp->i % a->n];
    }
    snprintf(what, sizeof what, "%s.%s()", type_name(self), name);
    if (self.t == JT_DICT) {
        const struct jdict *d = self.u.d;
        if (!strcmp(name, "get")) {
            BIND(M_GET, p);
            if (p[0].t == JT_MISSING)
                rfail(R, at, RKV_EFORMAT, "%s takes at least 1 argument", what);
            long i = dict_find(d, p[0]);
            return i >= 0 ? d->v[i] : or_default(p[1], NONE);
        }
        bind(R, at, what, NULL, 0, a, p);
        if (!strcmp(name, "items"))
            return run_filter(R, at, "items", self, a);
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            struct jlist *l = list_new(R->a, d->n);
            memcpy(l->v, name[0] == 'k' ? d->k : d->v, d->n * sizeof *l->v);
            l->n = d->n;
            return mk_list(l, 0);
        }
        if (!strcmp(name, "copy")) {
            struct jdict *c = dict_new(R->a);
            for (size_t i = 0; i < d->n; i++)
                dict_set(R->a, c, d->k[i], d->v[i]);
            return mk_dict(c);
        }
    } else if (self.t == JT_LIST) {
        const struct jlist *l = self.u.l;
        if (!strcmp(name, "index") || !strcmp(name, "count")) {
            BIND(M_ONE, p);
            int64_t k = 0;
            step(R, at, l->n);
            for (size_t i = 0; i < l->n; i++)
                if (v_eq(l->v[i], p[0])) {
                    if (name[0] == 'i')
                        return mk_int((int64_t)i);
                    k++;
                }
            if (name[0] == 'i')
                rfail(R, at, RKV_EFORMAT, "value is not in list");
            return mk_int(k);
        }
        if (!strcmp(name, "copy")) {
            bind(R, at, what, NULL, 0, a, p);
            struct jlist *c = list_new(R->a, l->n);
            memcpy(c->v, l->v, l->n * sizeof *c->v);
            c->n = l->n;
            return mk_list(c, 0);
        }
    }
    rfail(R, at, RKV_EFORMAT, "access to attribute '%s' of '%s' object is unsafe", name,
          type_name(self));
}

static void exec_body(struct rs *R, const struct node *body, struct scope *sc, struct sbuf *out);

static struct jv call_macro(struct rs *R, const struct node *at, const struct jmacro *m,
                            const struct args *a, struct jv caller)
{
    const struct node *def = m->def;
    char what[96];
    snprintf(what, sizeof what, "macro '%s'", m->name);
    if (a->n > def->nx)
        rfail(R, at, RKV_EFORMAT, "%s takes not more than %zu argument(s)", what, def->nx);
    struct scope *sc = scope_new(R, m->sc);
    for (size_t i = 0; i < def->nx; i++) {
        const struct node *pn = def->xs[i];
        struct jv v = MISSING;
        if (i < a->n)
            v = a->v[i];
        for (size_t k = 0; k < a->nk; k++)
            if (!strcmp(a->kn[k], pn->name)) {
                if (v.t != JT_MISSING)
                    rfail(R, at, RKV_EFORMAT, "%s got multiple values for argument '%s'", what,
                          pn->name);
                v = a->kv[k];
            }
        if (v.t == JT_MISSING)
            v = pn->a ? eval(R, pn->a, sc) : mk_undef(pn->name);
        scope_set(R, sc, pn->name, v);
    }
    for (size_t k = 0; k < a->nk; k++) {
        size_t i = 0;
        while (i < def->nx && strcmp(def->xs[i]->name, a->kn[k]))
            i++;
        if (i == def->nx)
            rfail(R, at, RKV_EFORMAT, "%s takes no keyword argument '%s'", what, a->kn[k]);
    }
    if (caller.t != JT_MISSING)
        scope_set(R, sc, "caller", caller);
    struct sbuf b;
    sb_init(&b, R->a, R->max_output, R->err);
    exec_body(R, def->d, sc, &b);
    return sb_val(&b);
}

static struct jv call_func(struct rs *R, const struct node *at, int fn, const struct args *a)
{
    switch (fn) {
    case F_RANGE: {
        if (a->nk || !a->n || a->n > 3)
            rfail(R, at, RKV_EFORMAT, "range expects 1 to 3 integer arguments");
        int64_t v[3];
        for (size_t i = 0; i < a->n; i++)
            v[i] = need_int(R, at, a->v[i], "a range argument");
        int64_t start = a->n > 1 ? v[0] : 0, stop = a->n > 1 ? v[1] : v[0],
                stp = a->n > 2 ? v[2] : 1;
        if (stp == 0)
            rfail(R, at, RKV_EFORMAT, "range() arg 3 must not be zero");
        int64_t count = 0;
        if (stp > 0 && stop > start)
            count = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)stp + 1);
        else if (stp < 0 && start > stop)
            count = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-stp) + 1);
        if (count > 100000)
            rfail(R, at, RKV_ETOOBIG, "range too big: at most 100000 items");
        step(R, at, (uint64_t)count);
        struct jlist *l = list_new(R->a, (size_t)count);
        for (int64_t i = 0; i < count; i++)
            l->v[l->n++] = mk_int(start + i * stp);
        return mk_list(l, 0);
    }
    case F_NAMESPACE:
    case F_DICT: {
        struct jdict *d = dict_new(R->a);
        if (a->n > 1)
            rfail(R, at, RKV_EFORMAT, "%s takes at most one positional argument",
                  fn == F_DICT ? "dict()" : "namespace()");
        if (a->n) {
            if (a->v[0].t != JT_DICT)
                rfail(R, at, RKV_EUNSUPPORTED, "%s takes a dict as its positional argument",
                      fn == F_DICT ? "dict()" : "namespace()");
            for (size_t i = 0; i < a->v[0].u.d->n; i++)
                dict_set(R->a, d, a->v[0].u.d->k[i], a->v[0].u.d->v[i]);
        }
        for (size_t k = 0; k < a->nk; k++)
            dict_set(R->a, d, rstr(R, a->kn[k], strlen(a->kn[k])), a->kv[k]);
        struct jv v = mk_dict(d);
        if (fn == F_NAMESPACE)
            v.t = JT_NS;
        return v;
    }
    case F_RAISE: {
        struct jv msg = a->n ? str_of(R, a->v[0]) : rstr(R, "", 0);
        rfail(R, at, RKV_EFORMAT, "%s", msg.u.s->s);
    }
    case F_STRFTIME: {
        if (a->n != 1 || a->nk)
            rfail(R, at, RKV_EFORMAT, "strftime_now takes one format string");
        const struct jstr *f = need_str(R, at, a->v[0], "the format");
        time_t now = R->ctx->has_now ? R->ctx->now : time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        /* %f (microseconds) is Python's own; the clock has whole seconds */
        struct sbuf fb;
        sb_init(&fb, R->a, 0, R->err);
        for (size_t i = 0; i < f->n; i++) {
            if (f->s[i] == '%' && i + 1 < f->n) {
                if (f->s[i + 1] == 'f')
                    sb_puts(&fb, "000000");
                else
                    sb_put(&fb, f->s + i, 2);
                i++;
            } else {
                sb_put(&fb, f->s + i, 1);
            }
        }
        if (!fb.n)
            return rstr(R, "", 0);
        size_t cap = fb.n * 16 + 64;
        char *buf = arena_alloc(R->a, cap);
        size_t n = strftime(buf, cap, fb.p, &tm);
        return rstr(R, buf, n);
    }
    }
    rfail(R, at, RKV_EINTERNAL, "unknown function");
}

static struct jv call(struct rs *R, const struct node *at, struct jv fn, const struct args *a,
                      struct jv caller)
{
    switch (fn.t) {
    case JT_MACRO: return call_macro(R, at, fn.u.m, a, caller);
    case JT_FUNC: return call_func(R, at, fn.fn, a);
    case JT_METHOD: return call_method(R, at, fn.u.me, a);
    case JT_UNDEF: fail_undef(R, at, fn);
    default: rfail(R, at, RKV_EFORMAT, "'%s' object is not callable", type_name(fn));
    }
}

/* --- evaluation ------------------------------------------------------------ */

static void eval_args(struct rs *R, const struct node *e, struct scope *sc, struct args *a)
{
    struct jv *v = e->nx ? arena_alloc(R->a, e->nx * sizeof *v) : NULL;
    for (size_t i = 0; i < e->nx; i++)
        v[i] = eval(R, e->xs[i], sc);
    struct jv *kv = e->nk ? arena_alloc(R->a, e->nk * sizeof *kv) : NULL;
    for (size_t i = 0; i < e->nk; i++)
        kv[i] = eval(R, e->kv[i], sc);
    *a = (struct args){v, e->nx, e->kn, kv, e->nk};
}

static void enter_r(struct rs *R, const struct node *at)
{
    if (++R->depth > R->max_depth)
        rfail(R, at, RKV_ETOOBIG, "render nested deeper than %d levels (macro recursion?)",
              R->max_depth);
    R->err->line = at->line;
    R->err->col = at->col;
}

static struct jv eval(struct rs *R, const struct node *e, struct scope *sc)
{
    enter_r(R, e);
    step(R, e, 1);
    struct jv r;
    switch (e->k) {
    case E_CONST: r = e->v; break;
    case E_NAME: r = lookup(R, sc, e->name); break;
    case E_BLOCKVAL: r = R->blockval; break;
    case E_LIST:
    case E_TUPLE: {
        struct jlist *l = list_new(R->a, e->nx);
        for (size_t i = 0; i < e->nx; i++)
            l->v[i] = eval(R, e->xs[i], sc);
        l->n = e->nx;
        r = mk_list(l, e->k == E_TUPLE);
        break;
    }
    case E_DICT: {
        struct jdict *d = dict_new(R->a);
        for (size_t i = 0; i + 1 < e->nx; i += 2) {
            struct jv k = eval(R, e->xs[i], sc);
            if ((k.t == JT_LIST && !k.tuple) || k.t == JT_DICT || k.t == JT_NS)
                rfail(R, e->xs[i], RKV_EFORMAT, "unhashable type: '%s'", type_name(k));
            dict_set(R->a, d, k, eval(R, e->xs[i + 1], sc));
        }
        r = mk_dict(d);
        break;
    }
    case E_GETATTR: r = get_attr(R, e, eval(R, e->a, sc), e->name); break;
    case E_GETITEM: {
        struct jv obj = eval(R, e->a, sc);
        if (e->b->k == E_SLICE) {
            const struct node *s = e->b;
            struct jv a = s->a ? eval(R, s->a, sc) : MISSING;
            struct jv b = s->b ? eval(R, s->b, sc) : MISSING;
            struct jv c = s->c ? eval(R, s->c, sc) : MISSING;
            r = do_slice(R, e, obj, a, b, c);
        } else {
            r = get_item(R, e, obj, eval(R, e->b, sc));
        }
        break;
    }
    case E_SLICE: rfail(R, e, RKV_EFORMAT, "a slice outside of a subscript");
    case E_CALL: {
        struct jv fn = eval(R, e->a, sc);
        struct args a;
        eval_args(R, e, sc, &a);
        r = call(R, e, fn, &a, MISSING);
        break;
    }
    case E_FILTER: {
        struct jv x = e->a ? eval(R, e->a, sc) : R->blockval;
        struct args a;
        eval_args(R, e, sc, &a);
        r = run_filter(R, e, e->name, x, &a);
        break;
    }
    case E_TEST: {
        struct jv x = eval(R, e->a, sc);
        struct args a;
        eval_args(R, e, sc, &a);
        r = mk_bool(run_test(R, e, e->name, x, &a));
        break;
    }
    case E_NEG:
    case E_POS: {
        struct jv x = eval(R, e->a, sc);
        if (x.t == JT_FLOAT)
            r = mk_float(e->k == E_NEG ? -x.u.f : x.u.f);
        else if (int_like(x)) {
            if (e->k == E_NEG && x.u.i == INT64_MIN)
                rfail(R, e, RKV_ERANGE, "integer result does not fit in 64 bits");
            r = mk_int(e->k == E_NEG ? -x.u.i : x.u.i);
        } else if (x.t == JT_UNDEF) {
            fail_undef(R, e, x);
        } else {
            rfail(R, e, RKV_EFORMAT, "bad operand type for unary %c: '%s'",
                  e->k == E_NEG ? '-' : '+', type_name(x));
        }
        break;
    }
    case E_NOT: r = mk_bool(!truthy(eval(R, e->a, sc))); break;
    case E_AND: {
        struct jv a = eval(R, e->a, sc);
        r = truthy(a) ? eval(R, e->b, sc) : a;
        break;
    }
    case E_OR: {
        struct jv a = eval(R, e->a, sc);
        r = truthy(a) ? a : eval(R, e->b, sc);
        break;
    }
    case E_BIN: r = binop(R, e, e->op, eval(R, e->a, sc), eval(R, e->b, sc)); break;
    case E_CONCAT: {
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        for (size_t i = 0; i < e->nx; i++)
            v_str(&b, eval(R, e->xs[i], sc), 0);
        r = sb_val(&b);
        break;
    }
    case E_CMP: {
        struct jv left = eval(R, e->a, sc);
        r = mk_bool(1);
        for (size_t i = 0; i < e->nx; i++) {
            struct jv right = eval(R, e->xs[i], sc);
            if (!compare(R, e, e->ops[i], left, right)) {
                r = mk_bool(0);
                break;
            }
            left = right;
        }
        break;
    }
    case E_COND:
        if (truthy(eval(R, e->a, sc)))
            r = eval(R, e->b, sc);
        else
            r = e->c ? eval(R, e->c, sc) : mk_undef(NULL);
        break;
    case E_NSREF: rfail(R, e, RKV_EFORMAT, "a namespace reference outside of a set");
    default: rfail(R, e, RKV_EINTERNAL, "unknown expression node %d", e->k);
    }
    R->depth--;
    return r;
}

static void assign(struct rs *R, const struct node *t, struct jv v, struct scope *sc)
{
    if (t->k == E_NAME) {
        scope_set(R, sc, t->name, v);
    } else if (t->k == E_NSREF) {
        struct jv ns = lookup(R, sc, t->name);
        if (ns.t != JT_NS)
            rfail(R, t, RKV_EFORMAT, "cannot assign attribute on non-namespace object");
        dict_set(R->a, ns.u.d, rstr(R, t->attr, strlen(t->attr)), v);
    } else {
        /* a, b = ... */
        const struct jlist *items = iter_items(R, t, v);
        if (items->n != t->nx)
            rfail(R, t, RKV_EFORMAT, "%s values to unpack (expected %zu, got %zu)",
                  items->n < t->nx ? "not enough" : "too many", t->nx, items->n);
        for (size_t i = 0; i < t->nx; i++)
            scope_set(R, sc, t->xs[i]->name, items->v[i]);
    }
}

enum flow { FLOW_NEXT = 0, FLOW_BREAK, FLOW_CONTINUE };

static int exec(struct rs *R, const struct node *n, struct scope *sc);

static void out_val(struct rs *R, struct jv v)
{
    if (v.t == JT_STR)
        sb_put(R->out, v.u.s->s, v.u.s->n);
    else
        v_str(R->out, v, 0);
}

/* renders body into out in a scope of its own */
static void exec_body(struct rs *R, const struct node *body, struct scope *sc, struct sbuf *out)
{
    struct sbuf *saved = R->out;
    R->out = out;
    exec(R, body, scope_new(R, sc));
    R->out = saved;
}

static struct jv apply_chain(struct rs *R, const struct node *chain, struct jv v, struct scope *sc)
{
    struct jv saved = R->blockval;
    R->blockval = v;
    struct jv r = eval(R, chain, sc);
    R->blockval = saved;
    return r;
}

static int exec_for(struct rs *R, const struct node *n, struct scope *sc)
{
    const struct jlist *items = iter_items(R, n, eval(R, n->b, sc));
    if (n->c) {
        struct jlist *kept = list_new(R->a, 0);
        for (size_t i = 0; i < items->n; i++) {
            struct scope *fs = scope_new(R, sc);
            assign(R, n->a, items->v[i], fs);
            if (truthy(eval(R, n->c, fs)))
                list_push(R->a, kept, items->v[i]);
        }
        items = kept;
    }
    struct jloop *lp = arena_alloc(R->a, sizeof *lp);
    lp->items = items;
    struct jv lv = {.t = JT_LOOP};
    lv.u.lp = lp;
    bool iterated = false;
    for (size_t i = 0; i < items->n; i++) {
        lp->i = i;
        step(R, n, 1);
        struct scope *it = scope_new(R, sc);
        assign(R, n->a, items->v[i], it);
        scope_set(R, it, "loop", lv);
        int rc = exec(R, n->d, it);
        if (rc == FLOW_BREAK)
            break;
        /* jinja2 sets its "iterated" flag at the end of the body, so an else
         * also runs when every iteration left by break or continue */
        if (rc == FLOW_NEXT)
            iterated = true;
    }
    if (!iterated && n->e)
        return exec(R, n->e, scope_new(R, sc));
    return FLOW_NEXT;
}

static int exec(struct rs *R, const struct node *n, struct scope *sc)
{
    enter_r(R, n);
    step(R, n, 1);
    int rc = FLOW_NEXT;
    switch (n->k) {
    case N_BODY:
        for (size_t i = 0; i < n->nx && rc == FLOW_NEXT; i++)
            rc = exec(R, n->xs[i], sc);
        break;
    case N_DATA: sb_put(R->out, n->v.u.s->s, n->v.u.s->n); break;
    case N_OUT: out_val(R, eval(R, n->a, sc)); break;
    case N_IF: {
        const struct node *x = n;
        while (x && x->k == N_IF && !truthy(eval(R, x->a, sc)))
            x = x->c;
        if (x)
            rc = exec(R, x->k == N_IF ? x->b : x, sc);
        break;
    }
    case N_FOR: rc = exec_for(R, n, sc); break;
    case N_SET: assign(R, n->a, eval(R, n->b, sc), sc); break;
    case N_SETBLOCK: {
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        exec_body(R, n->b, sc, &b);
        struct jv v = sb_val(&b);
        if (n->c)
            v = apply_chain(R, n->c, v, sc);
        assign(R, n->a, v, sc);
        break;
    }
    case N_FILTERBLOCK: {
        struct sbuf b;
        sb_init(&b, R->a, R->max_output, R->err);
        exec_body(R, n->d, sc, &b);
        out_val(R, apply_chain(R, n->a, sb_val(&b), sc));
        break;
    }
    case N_MACRO: {
        struct jmacro *m = arena_alloc(R->a, sizeof *m);
        m->def = n;
        m->sc = sc;
        m->name = n->name;
        struct jv v = {.t = JT_MACRO};
        v.u.m = m;
        scope_set(R, sc, n->name, v);
        break;
    }
    case N_CALLBLOCK: {
        struct jmacro *m = arena_alloc(R->a, sizeof *m);
        m->def = n;
        m->sc = sc;
        m->name = "caller";
        struct jv caller = {.t = JT_MACRO};
        caller.u.m = m;
        const struct node *ce = n->a;
        struct jv fn = eval(R, ce->a, sc);
        struct args a;
        eval_args(R, ce, sc, &a);
        if (fn.t != JT_MACRO)
            rfail(R, ce, RKV_EUNSUPPORTED, "a call block must call a macro");
        out_val(R, call(R, ce, fn, &a, caller));
        break;
    }
    case N_WITH: {
        struct scope *ws = scope_new(R, sc);
        for (size_t i = 0; i < n->nx; i++)
            scope_set(R, ws, n->xs[i]->name, eval(R, n->kv[i], sc));
        rc = exec(R, n->d, ws);
        break;
    }
    case N_BREAK: rc = FLOW_BREAK; break;
    case N_CONTINUE: rc = FLOW_CONTINUE; break;
    default: rfail(R, n, RKV_EINTERNAL, "unknown statement node %d", n->k);
    }
    R->depth--;
    return rc;
}

/* --- public API ------------------------------------------------------------ */

/* state that must survive a longjmp lives on the heap, not in locals */
struct parse_job {
    struct jerr err;
    struct jinja_tmpl *t;
};

int jinja_parse(const char *src, size_t len, const char *name, struct jinja_tmpl **out,
                char *errbuf, size_t errlen)
{
    *out = NULL;
    if (errbuf && errlen)
        errbuf[0] = 0;
    struct parse_job *job = calloc(1, sizeof *job);
    struct jinja_tmpl *t = calloc(1, sizeof *t);
    if (!job || !t) {
        free(job);
        free(t);
        return RKV_ENOMEM;
    }
    job->t = t;
    job->err.buf = errbuf;
    job->err.len = errlen;
    job->err.name = name ? name : "template";
    t->a.err = &job->err;
    if (setjmp(job->err.jb)) {
        int code = job->err.code;
        arena_fini(&job->t->a);
        free(job->t->name);
        free(job->t);
        free(job);
        return code;
    }
    t->name = strdup(job->err.name);
    if (!t->name)
        jfail(&job->err, RKV_ENOMEM, 0, 0, "out of memory");
    job->err.name = t->name;
    /* newlines as jinja2 reads them: \r\n and \r become \n, one trailing
     * newline is dropped (keep_trailing_newline=False) */
    char *norm = arena_alloc(&t->a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n')
        n--;
    norm[n] = 0;
    struct lexer L = {.src = norm, .n = n, .line = 1, .a = &t->a, .err = &job->err};
    lx_run(&L);
    struct tok *eof = lx_push(&L, TK_EOF, n);
    (void)eof;
    struct parser P = {.tk = L.tk, .n = L.ntk, .a = &t->a, .err = &job->err};
    t->root = p_body(&P, NULL);
    check_names(&P, t->root, false);
    t->a.err = NULL;
    free(job);
    *out = t;
    return 0;
}

void jinja_destroy(struct jinja_tmpl *t)
{
    if (!t)
        return;
    arena_fini(&t->a);
    free(t->name);
    free(t);
}

int jinja_ctx_create(struct jinja_ctx **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : RKV_ENOMEM;
}

void jinja_ctx_destroy(struct jinja_ctx *c)
{
    if (!c)
        return;
    arena_fini(&c->a);
    free(c->names);
    free(c->vals);
    free(c);
}

void jinja_ctx_set_now(struct jinja_ctx *c, time_t now)
{
    c->now = now;
    c->has_now = true;
}

int jinja_ctx_set(struct jinja_ctx *c, const char *name, struct jinja_val *v)
{
    if (!v || !name)
        return v ? RKV_EINVAL : RKV_ENOMEM;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->names[i], name)) {
            c->vals[i] = v->v;
            return 0;
        }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        const char **nn = realloc(c->names, cap * sizeof *nn);
        if (!nn)
            return RKV_ENOMEM;
        c->names = nn;
        struct jv *nv = realloc(c->vals, cap * sizeof *nv);
        if (!nv)
            return RKV_ENOMEM;
        c->vals = nv;
        c->cap = cap;
    }
    struct jstr *s = str_new(&c->a, name, strlen(name));
    if (!s)
        return RKV_ENOMEM;
    c->names[c->n] = s->s;
    c->vals[c->n++] = v->v;
    return 0;
}

static struct jinja_val *box(struct jinja_ctx *c, struct jv v)
{
    struct jinja_val *b = arena_alloc(&c->a, sizeof *b);
    if (b)
        b->v = v;
    return b;
}

struct jinja_val *jinja_none(struct jinja_ctx *c)
{
    return box(c, NONE);
}
struct jinja_val *jinja_bool(struct jinja_ctx *c, int b)
{
    return box(c, mk_bool(b));
}
struct jinja_val *jinja_int(struct jinja_ctx *c, int64_t i)
{
    return box(c, mk_int(i));
}
struct jinja_val *jinja_float(struct jinja_ctx *c, double f)
{
    return box(c, mk_float(f));
}
struct jinja_val *jinja_str(struct jinja_ctx *c, const char *s, size_t len)
{
    struct jv v = mk_str(&c->a, s, len);
    return v.u.s ? box(c, v) : NULL;
}
struct jinja_val *jinja_list(struct jinja_ctx *c)
{
    struct jlist *l = list_new(&c->a, 0);
    return l ? box(c, mk_list(l, 0)) : NULL;
}
struct jinja_val *jinja_dict(struct jinja_ctx *c)
{
    struct jdict *d = dict_new(&c->a);
    return d ? box(c, mk_dict(d)) : NULL;
}

int jinja_list_append(struct jinja_ctx *c, struct jinja_val *list, struct jinja_val *v)
{
    if (!list || !v)
        return RKV_ENOMEM;
    if (list->v.t != JT_LIST)
        return RKV_EINVAL;
    return list_push(&c->a, list->v.u.l, v->v);
}

int jinja_dict_set(struct jinja_ctx *c, struct jinja_val *dict, const char *key,
                   struct jinja_val *v)
{
    if (!dict || !v)
        return RKV_ENOMEM;
    if (dict->v.t != JT_DICT || !key)
        return RKV_EINVAL;
    struct jv k = mk_str(&c->a, key, strlen(key));
    if (!k.u.s)
        return RKV_ENOMEM;
    return dict_set(&c->a, dict->v.u.d, k, v->v);
}

static int cmp_cname(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* 1 when no two members of object j share a name (0: some do, the last one wins as in
 * Python's json), RKV_ENOMEM */
static int unique_keys(const cJSON *j)
{
    size_t n = 0;
    for (const cJSON *x = j->child; x; x = x->next)
        n++;
    if (n < 2)
        return 1;
    const char **names = malloc(n * sizeof *names);
    if (!names)
        return RKV_ENOMEM;
    size_t k = 0;
    for (const cJSON *x = j->child; x; x = x->next)
        names[k++] = x->string ? x->string : "";
    qsort(names, k, sizeof *names, cmp_cname);
    int unique = 1;
    for (size_t i = 1; i < k && unique; i++)
        unique = strcmp(names[i - 1], names[i]) != 0;
    free(names);
    return unique;
}

static int from_cjson(struct jinja_ctx *c, const cJSON *j, struct jv *out, int depth)
{
    if (depth > 1000)
        return RKV_ETOOBIG;
    if (cJSON_IsNull(j)) {
        *out = NONE;
    } else if (cJSON_IsBool(j)) {
        *out = mk_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            *out = mk_int((int64_t)d);
        else
            *out = mk_float(d);
    } else if (cJSON_IsString(j)) {
        *out = mk_str(&c->a, j->valuestring, strlen(j->valuestring));
        if (!out->u.s)
            return RKV_ENOMEM;
    } else if (cJSON_IsArray(j)) {
        struct jlist *l = list_new(&c->a, 0);
        if (!l)
            return RKV_ENOMEM;
        for (const cJSON *x = j->child; x; x = x->next) {
            struct jv v;
            int rc = from_cjson(c, x, &v, depth + 1);
            if (rc < 0 || (rc = list_push(&c->a, l, v)) < 0)
                return rc;
        }
        *out = mk_list(l, 0);
    } else if (cJSON_IsObject(j)) {
        struct jdict *d = dict_new(&c->a);
        if (!d)
            return RKV_ENOMEM;
        /* keys checked once by sorting, then appended: a search per key was quadratic in a
         * request's object of 300k keys (a tool's parameters, chat_template_kwargs) */
        int unique = unique_keys(j);
        if (unique < 0)
            return unique;
        for (const cJSON *x = j->child; x; x = x->next) {
            struct jv v,
                k = mk_str(&c->a, x->string ? x->string : "", x->string ? strlen(x->string) : 0);
            if (!k.u.s)
                return RKV_ENOMEM;
            int rc = from_cjson(c, x, &v, depth + 1);
            if (rc < 0 ||
                (rc = unique ? dict_append(&c->a, d, k, v) : dict_set(&c->a, d, k, v)) < 0)
                return rc;
        }
        *out = mk_dict(d);
    } else {
        return RKV_EFORMAT;
    }
    return 0;
}

int jinja_from_cjson(struct jinja_ctx *c, const struct cJSON *j, struct jinja_val **out)
{
    struct jv v;
    *out = NULL;
    int rc = from_cjson(c, j, &v, 0);
    if (rc < 0)
        return rc;
    *out = box(c, v);
    return *out ? 0 : RKV_ENOMEM;
}

int jinja_from_json(struct jinja_ctx *c, const char *json, size_t len, struct jinja_val **out,
                    char *errbuf, size_t errlen)
{
    *out = NULL;
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!j) {
        const char *at = cJSON_GetErrorPtr();
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "context JSON is malformed near byte %zu",
                     at && at >= json && at <= json + len ? (size_t)(at - json) : (size_t)0);
        return RKV_EFORMAT;
    }
    int rc = jinja_from_cjson(c, j, out);
    cJSON_Delete(j);
    if (rc < 0 && errbuf && errlen)
        snprintf(errbuf, errlen, "context JSON: %s", rkv_strerror(rc));
    return rc;
}

int jinja_ctx_set_json(struct jinja_ctx *c, const char *json, size_t len, char *errbuf,
                       size_t errlen)
{
    struct jinja_val *v;
    int rc = jinja_from_json(c, json, len, &v, errbuf, errlen);
    if (rc < 0)
        return rc;
    if (v->v.t != JT_DICT) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "context JSON must be an object");
        return RKV_EFORMAT;
    }
    const struct jdict *d = v->v.u.d;
    for (size_t i = 0; i < d->n; i++) {
        struct jinja_val *x = box(c, d->v[i]);
        if ((rc = jinja_ctx_set(c, d->k[i].u.s->s, x)) < 0)
            return rc;
    }
    return 0;
}

struct render_job {
    struct jerr err;
    struct arena a;
    struct rs R;
    struct sbuf out;
};

int jinja_render(const struct jinja_tmpl *t, const struct jinja_ctx *c,
                 const struct jinja_limits *lim, char **out, size_t *out_len, char *errbuf,
                 size_t errlen)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (errbuf && errlen)
        errbuf[0] = 0;
    struct jinja_limits L = {JINJA_DEFAULT_STEPS, JINJA_DEFAULT_OUTPUT, JINJA_DEFAULT_MEMORY,
                             JINJA_DEFAULT_DEPTH};
    if (lim) {
        if (lim->max_steps)
            L.max_steps = lim->max_steps;
        if (lim->max_output)
            L.max_output = lim->max_output;
        if (lim->max_memory)
            L.max_memory = lim->max_memory;
        if (lim->max_depth > 0)
            L.max_depth = lim->max_depth;
    }
    struct render_job *job = calloc(1, sizeof *job);
    if (!job)
        return RKV_ENOMEM;
    job->err.buf = errbuf;
    job->err.len = errlen;
    job->err.name = t->name;
    job->a.cap = L.max_memory;
    job->a.err = &job->err;
    if (setjmp(job->err.jb)) {
        int code = job->err.code;
        arena_fini(&job->a);
        free(job);
        return code;
    }
    struct rs *R = &job->R;
    R->err = &job->err;
    R->a = &job->a;
    R->ctx = c;
    R->max_steps = L.max_steps;
    R->max_output = L.max_output;
    R->max_depth = L.max_depth;
    R->blockval = UNDEF;
    sb_init(&job->out, &job->a, L.max_output, &job->err);
    R->out = &job->out;
    exec(R, t->root, scope_new(R, NULL));
    char *res = malloc(job->out.n + 1);
    if (!res) {
        arena_fini(&job->a);
        free(job);
        return RKV_ENOMEM;
    }
    if (job->out.n)
        memcpy(res, job->out.p, job->out.n);
    res[job->out.n] = 0;
    if (out_len)
        *out_len = job->out.n;
    *out = res;
    arena_fini(&job->a);
    free(job);
    return 0;
}
