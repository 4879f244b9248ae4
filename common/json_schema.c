/* json_schema.c - JSON Schema subset compiled to GBNF for constrained decoding. */
#include "common/json_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/grammar.h"
#include "common/strbuf.h"
#include "common/util.h"

#define SUPPORTED                                                                                  \
    "type, properties, required, additionalProperties, enum, const, minLength, maxLength, "        \
    "format, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum, items, "               \
    "prefixItems, minItems, maxItems, anyOf, oneOf, allOf, $ref, $defs, definitions; "             \
    "ignored: description, title, default, examples, $schema, $id, $comment, deprecated, "         \
    "readOnly, writeOnly, strict"

static const char *const KEYWORDS[] = {"type",
                                       "properties",
                                       "required",
                                       "additionalProperties",
                                       "enum",
                                       "const",
                                       "minLength",
                                       "maxLength",
                                       "format",
                                       "pattern",
                                       "minimum",
                                       "maximum",
                                       "exclusiveMinimum",
                                       "exclusiveMaximum",
                                       "items",
                                       "prefixItems",
                                       "minItems",
                                       "maxItems",
                                       "anyOf",
                                       "oneOf",
                                       "allOf",
                                       "$ref",
                                       "$defs",
                                       "definitions",
                                       "description",
                                       "title",
                                       "default",
                                       "examples",
                                       "$schema",
                                       "$id",
                                       "$comment",
                                       "deprecated",
                                       "readOnly",
                                       "writeOnly",
                                       "strict",
                                       NULL};

/* the primitives, each emitted once when used (ws is always) */
enum {
    P_CHAR = 1 << 0,
    P_STRING = 1 << 1,
    P_INTEGER = 1 << 2,
    P_NUMBER = 1 << 3,
    P_BOOLEAN = 1 << 4,
    P_NULL = 1 << 5,
    P_VALUE = 1 << 6,
    P_OBJECT = 1 << 7,
    P_ARRAY = 1 << 8,
};

/* the hex of a \u escape: any but a surrogate (U+D800..U+DFFF), which decoders refuse alone
 * and which would count as two characters against minLength/maxLength */
#define U_ESC "([0-9a-cA-C] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [eEfF] [0-9a-fA-F]{3})"

#define WS_RULE      "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
#define CHAR_RULE    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" " U_ESC ")\n"
#define STRING_RULE  "string ::= \"\\\"\" char* \"\\\"\"\n"
#define INTEGER_RULE "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
#define NUMBER_RULE  "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
#define BOOLEAN_RULE "boolean ::= \"true\" | \"false\"\n"
#define NULL_RULE    "null ::= \"null\"\n"
#define VALUE_RULE   "value ::= object | array | string | number | boolean | null\n"
#define OBJECT_RULE                                                                                \
    "object ::= \"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? "  \
    "\"}\"\n"
#define ARRAY_RULE "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"

static const struct {
    unsigned bit, needs;
    const char *text;
} PRIMS[] = {
    {P_CHAR, 0, CHAR_RULE},
    {P_STRING, P_CHAR, STRING_RULE},
    {P_INTEGER, 0, INTEGER_RULE},
    {P_NUMBER, P_INTEGER, NUMBER_RULE},
    {P_BOOLEAN, 0, BOOLEAN_RULE},
    {P_NULL, 0, NULL_RULE},
    {P_VALUE, P_OBJECT | P_ARRAY | P_STRING | P_NUMBER | P_BOOLEAN | P_NULL, VALUE_RULE},
    {P_OBJECT, P_STRING | P_VALUE, OBJECT_RULE},
    {P_ARRAY, P_VALUE, ARRAY_RULE},
};

static const char ANY_OBJECT[] = "root ::= object\n" WS_RULE CHAR_RULE STRING_RULE INTEGER_RULE
    NUMBER_RULE BOOLEAN_RULE NULL_RULE VALUE_RULE OBJECT_RULE ARRAY_RULE;

const char *json_schema_any_object_gbnf(void)
{
    return ANY_OBJECT;
}

/* ---- GBNF text ---- */

/* a GBNF literal of bytes: "..." with quote, backslash and control bytes escaped */
static void sb_lit(struct strbuf *b, const char *s, size_t n)
{
    strbuf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            strbuf_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            strbuf_printf(b, "\\x%02x", c);
        else
            strbuf_add(b, s + i, 1);
    }
    strbuf_puts(b, "\"");
}

/* ---- compiler state ---- */

struct refmemo {
    char *ptr;  /* the $ref text */
    char *rule; /* its rule name */
};

struct js {
    cJSON *doc;
    struct strbuf out; /* the rules so far */
    unsigned prims;
    unsigned n_rules;
    struct refmemo *refs;
    size_t n_refs, cap_refs;
    cJSON **owned; /* merged allOf schemas, freed at the end */
    size_t n_owned, cap_owned;
    int depth;
    int rc;
    char *err;
    size_t errlen;
};

static void js_fail(struct js *j, int rc, const char *path, const char *fmt, ...)
{
    if (j->rc)
        return;
    j->rc = rc;
    if (!j->err || !j->errlen)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(j->err, j->errlen, "%s: %s", path, msg);
}

static void use_prim(struct js *j, unsigned bit)
{
    j->prims |= bit;
}

/* a new rule name from a hint: lower-case letters, digits and '-', then -N */
static char *rule_name(struct js *j, const char *hint)
{
    char buf[64];
    size_t k = 0;
    for (const char *p = hint; *p && k < 24; p++) {
        char c = *p;
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
            buf[k++] = c;
        else if (c >= 'A' && c <= 'Z')
            buf[k++] = (char)(c - 'A' + 'a');
        else if (k && buf[k - 1] != '-')
            buf[k++] = '-';
    }
    while (k && buf[k - 1] == '-')
        k--;
    if (!k || buf[0] < 'a' || buf[0] > 'z') {
        buf[0] = 's';
        k = 1;
    }
    snprintf(buf + k, sizeof buf - k, "-%u", ++j->n_rules);
    char *r = strdup(buf);
    if (!r)
        js_fail(j, RKV_ENOMEM, "schema", "out of memory");
    return r;
}

/* appends "name ::= expr\n" */
static void emit_rule(struct js *j, const char *name, const struct strbuf *expr)
{
    strbuf_printf(&j->out, "%s ::= ", name);
    strbuf_append(&j->out, expr);
    strbuf_puts(&j->out, "\n");
}

static char *gen(struct js *j, const cJSON *s, const char *path, const char *hint);

/* path + "/" + seg (malloc'd) */
static char *path_join(const char *path, const char *seg)
{
    size_t a = strlen(path), b = strlen(seg);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, path, a);
        p[a] = '/';
        memcpy(p + a + 1, seg, b + 1);
    }
    return p;
}

/* a sub-schema's rule: gen(sub, path/seg) */
static char *gen_sub(struct js *j, const cJSON *s, const char *path, const char *seg,
                     const char *hint)
{
    char *p = path_join(path, seg);
    if (!p) {
        js_fail(j, RKV_ENOMEM, path, "out of memory");
        return NULL;
    }
    char *r = gen(j, s, p, hint);
    free(p);
    return r;
}

/* ---- $ref ---- */

/* resolves a local JSON pointer (#, #/a/b, with ~0 ~1 and %xx unescaped) */
static const cJSON *resolve_ref(struct js *j, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const cJSON *cur = j->doc;
    const char *p = ref + 1;
    if (!*p)
        return cur;
    if (*p != '/')
        return NULL;
    while (*p == '/' && cur) {
        p++;
        char seg[256];
        size_t k = 0;
        while (*p && *p != '/' && k < sizeof seg - 1) {
            if (p[0] == '~' && p[1] == '0') {
                seg[k++] = '~';
                p += 2;
            } else if (p[0] == '~' && p[1] == '1') {
                seg[k++] = '/';
                p += 2;
            } else if (p[0] == '%' && p[1] && p[2]) {
                char hex[3] = {p[1], p[2], 0};
                seg[k++] = (char)strtol(hex, NULL, 16);
                p += 3;
            } else {
                seg[k++] = *p++;
            }
        }
        seg[k] = 0;
        if (cJSON_IsArray(cur)) {
            char *e;
            long i = strtol(seg, &e, 10);
            cur = *e || !k ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else if (cJSON_IsObject(cur)) {
            cur = cJSON_GetObjectItemCaseSensitive(cur, seg);
        } else {
            cur = NULL;
        }
    }
    return *p ? NULL : cur;
}

static char *gen_ref(struct js *j, const char *ref, const char *path)
{
    for (size_t i = 0; i < j->n_refs; i++)
        if (!strcmp(j->refs[i].ptr, ref))
            return strdup(j->refs[i].rule);
    const cJSON *target = resolve_ref(j, ref);
    if (!target) {
        js_fail(j, ref[0] == '#' ? RKV_EINVAL : RKV_EUNSUPPORTED, path,
                "$ref \"%s\" does not resolve (local references only: #/$defs/NAME, "
                "#/definitions/NAME, #)",
                ref);
        return NULL;
    }
    const char *base = strrchr(ref, '/');
    char *name = rule_name(j, base && base[1] ? base + 1 : "root");
    if (!name)
        return NULL;
    if (rkv_grow((void **)&j->refs, &j->cap_refs, (j->n_refs + 1) * sizeof *j->refs,
                 8 * sizeof *j->refs)) {
        free(name);
        js_fail(j, RKV_ENOMEM, path, "out of memory");
        return NULL;
    }
    /* recorded before the target is compiled, so recursion refers to the name */
    j->refs[j->n_refs].ptr = strdup(ref);
    j->refs[j->n_refs].rule = name;
    j->n_refs++;
    char tpath[300];
    snprintf(tpath, sizeof tpath, "schema%s", ref + 1);
    char *body = gen(j, target, tpath, base && base[1] ? base + 1 : "root");
    if (!body)
        return NULL;
    struct strbuf e = {0};
    strbuf_puts(&e, body);
    emit_rule(j, name, &e);
    strbuf_fini(&e);
    free(body);
    return strdup(name);
}

/* ---- strings ---- */

/* code point ranges */
struct cps {
    uint32_t lo[64], hi[64];
    int n;
    int overflow;
};

static void cps_add(struct cps *c, uint32_t lo, uint32_t hi)
{
    if (c->n >= 64) {
        c->overflow = 1;
        return;
    }
    c->lo[c->n] = lo;
    c->hi[c->n] = hi;
    c->n++;
}

/* sorted and merged */
static void cps_norm(struct cps *c)
{
    for (int i = 1; i < c->n; i++)
        for (int k = i; k > 0 && c->lo[k] < c->lo[k - 1]; k--) {
            uint32_t t = c->lo[k];
            c->lo[k] = c->lo[k - 1];
            c->lo[k - 1] = t;
            t = c->hi[k];
            c->hi[k] = c->hi[k - 1];
            c->hi[k - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < c->n; i++) {
        if (m && c->lo[i] <= c->hi[m - 1] + 1) {
            if (c->hi[i] > c->hi[m - 1])
                c->hi[m - 1] = c->hi[i];
        } else {
            c->lo[m] = c->lo[i];
            c->hi[m] = c->hi[i];
            m++;
        }
    }
    c->n = m;
}

static void cps_invert(struct cps *c)
{
    cps_norm(c);
    struct cps r = {.overflow = c->overflow};
    uint32_t next = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->lo[i] > next)
            cps_add(&r, next, c->lo[i] - 1);
        next = c->hi[i] + 1;
    }
    if (next <= 0x10FFFF)
        cps_add(&r, next, 0x10FFFF);
    *c = r;
}

static int cps_has(const struct cps *c, uint32_t x)
{
    for (int i = 0; i < c->n; i++)
        if (x >= c->lo[i] && x <= c->hi[i])
            return 1;
    return 0;
}

static void sb_class_char(struct strbuf *b, uint32_t c)
{
    if (c == ']' || c == '\\' || c == '-' || c == '^' || c == '"' || c == '[')
        strbuf_printf(b, "\\%c", (char)c);
    else if (c < 0x20 || c == 0x7f)
        strbuf_printf(b, "\\x%02x", (unsigned)c);
    else if (c < 0x80)
        strbuf_printf(b, "%c", (char)c);
    else
        strbuf_printf(b, "\\U%08x", (unsigned)c);
}

/* the JSON text of one character of a decoded string in ranges c: a class of the characters
 * that stand for themselves, or their escapes (quote, backslash, \n \t \r) */
static void sb_json_class(struct strbuf *b, const struct cps *c0)
{
    struct cps c = *c0;
    cps_norm(&c);
    struct strbuf cls = {0};
    int n_cls = 0;
    for (int i = 0; i < c.n; i++) {
        uint32_t lo = c.lo[i], hi = c.hi[i];
        if (lo < 0x20)
            lo = 0x20;
        /* cut out '"' (0x22) and '\\' (0x5c) */
        uint32_t cut[2] = {'"', '\\'};
        for (int k = 0; k < 2 && lo <= hi; k++) {
            if (cut[k] >= lo && cut[k] <= hi) {
                if (cut[k] > lo) {
                    sb_class_char(&cls, lo);
                    if (cut[k] - 1 > lo) {
                        strbuf_puts(&cls, "-");
                        sb_class_char(&cls, cut[k] - 1);
                    }
                    n_cls++;
                }
                lo = cut[k] + 1;
            }
        }
        if (lo > hi)
            continue;
        sb_class_char(&cls, lo);
        if (hi > lo) {
            strbuf_puts(&cls, "-");
            sb_class_char(&cls, hi);
        }
        n_cls++;
    }
    int first = 1;
    strbuf_puts(b, "(");
    if (n_cls) {
        strbuf_puts(b, "[");
        strbuf_append(b, &cls);
        strbuf_puts(b, "]");
        first = 0;
    }
    strbuf_fini(&cls);
    static const struct {
        uint32_t c;
        const char *esc;
    } E[] = {{'"', "\"\\\\\\\"\""},
             {'\\', "\"\\\\\\\\\""},
             {'\n', "\"\\\\n\""},
             {'\t', "\"\\\\t\""},
             {'\r', "\"\\\\r\""}};
    for (size_t k = 0; k < RKV_ARRAY_LEN(E); k++) {
        if (!cps_has(&c, E[k].c))
            continue;
        strbuf_puts(b, first ? "" : " | ");
        strbuf_puts(b, E[k].esc);
        first = 0;
    }
    if (first)
        strbuf_puts(b, "[]"); /* nothing: an impossible class */
    strbuf_puts(b, ")");
}

/* the JSON text of one literal character */
static void sb_json_char(struct strbuf *b, uint32_t c)
{
    struct cps one = {0};
    cps_add(&one, c, c);
    if (c >= 0x20 && c != '"' && c != '\\') {
        char u[8];
        int n;
        if (c < 0x80) {
            u[0] = (char)c;
            n = 1;
        } else if (c < 0x800) {
            u[0] = (char)(0xC0 | (c >> 6));
            u[1] = (char)(0x80 | (c & 0x3F));
            n = 2;
        } else if (c < 0x10000) {
            u[0] = (char)(0xE0 | (c >> 12));
            u[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            u[2] = (char)(0x80 | (c & 0x3F));
            n = 3;
        } else {
            u[0] = (char)(0xF0 | (c >> 18));
            u[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            u[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            u[3] = (char)(0x80 | (c & 0x3F));
            n = 4;
        }
        sb_lit(b, u, (size_t)n);
        return;
    }
    if (c == '"' || c == '\\' || c == '\n' || c == '\t' || c == '\r') {
        sb_json_class(b, &one);
        return;
    }
    strbuf_printf(b, "\"\\\\u00%02x\"", (unsigned)c);
}

/* ---- pattern (regex subset) ---- */

struct rx {
    struct js *j;
    const char *pat, *p, *end;
    const char *path;
    struct strbuf *b;
    int depth;
};

static void rx_fail(struct rx *r, const char *what)
{
    js_fail(r->j, RKV_EUNSUPPORTED, r->path,
            "keyword \"pattern\": %s at offset %d (supported: literals, [classes], . \\d \\w \\s "
            "\\D \\W \\S, groups, |, * + ? {m,n}, ^ at the start, $ at the end)",
            what, (int)(r->p - r->pat));
}

/* one character of the pattern (raw utf-8 decoded); 0 on success */
static int rx_utf8(struct rx *r, uint32_t *c)
{
    const unsigned char *s = (const unsigned char *)r->p;
    int n = s[0] < 0x80 ? 1 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (!n || r->end - r->p < n) {
        rx_fail(r, "invalid UTF-8");
        return -1;
    }
    uint32_t v = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++)
        v = (v << 6) | (s[i] & 0x3F);
    r->p += n;
    *c = v;
    return 0;
}

/* an escape after '\\': a class (\d ...) into c, or one character (*ch, returns 1) */
static int rx_escape(struct rx *r, struct cps *c, uint32_t *ch)
{
    if (r->p >= r->end) {
        rx_fail(r, "a trailing backslash");
        return -1;
    }
    char e = *r->p++;
    int neg = e == 'D' || e == 'W' || e == 'S';
    switch (e) {
    case 'd':
    case 'D': cps_add(c, '0', '9'); break;
    case 'w':
    case 'W':
        cps_add(c, 'a', 'z');
        cps_add(c, 'A', 'Z');
        cps_add(c, '0', '9');
        cps_add(c, '_', '_');
        break;
    case 's':
    case 'S':
        cps_add(c, ' ', ' ');
        cps_add(c, '\t', '\r');
        break;
    case 'n': *ch = '\n'; return 1;
    case 't': *ch = '\t'; return 1;
    case 'r': *ch = '\r'; return 1;
    case 'f': *ch = '\f'; return 1;
    case 'v': *ch = '\v'; return 1;
    case 'x':
    case 'u': {
        int nd = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            char h = r->p < r->end ? *r->p : 0;
            int d = (h >= '0' && h <= '9')                     ? h - '0'
                    : ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') ? (h | 0x20) - 'a' + 10
                                                               : -1;
            if (d < 0) {
                rx_fail(r, "a bad \\x or \\u escape");
                return -1;
            }
            v = v * 16 + (uint32_t)d;
            r->p++;
        }
        *ch = v;
        return 1;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
            r->p--;
            rx_fail(r, "an unsupported escape (\\b, backreferences, \\p{...})");
            return -1;
        }
        *ch = (uint32_t)(unsigned char)e;
        return 1;
    }
    if (neg)
        cps_invert(c);
    return 0;
}

static int rx_class(struct rx *r)
{
    struct cps c = {0};
    int neg = 0;
    r->p++; /* [ */
    if (r->p < r->end && *r->p == '^') {
        neg = 1;
        r->p++;
    }
    int first = 1;
    for (;;) {
        if (r->p >= r->end) {
            rx_fail(r, "an unterminated [class]");
            return -1;
        }
        if (*r->p == ']' && !first) {
            r->p++;
            break;
        }
        first = 0;
        uint32_t lo, hi;
        if (*r->p == '\\') {
            r->p++;
            struct cps sub = {0};
            int k = rx_escape(r, &sub, &lo);
            if (k < 0)
                return -1;
            if (k == 0) {
                for (int i = 0; i < sub.n; i++)
                    cps_add(&c, sub.lo[i], sub.hi[i]);
                continue;
            }
        } else if (*r->p == '[' && r->p + 1 < r->end && r->p[1] == ':') {
            rx_fail(r, "a POSIX [:class:]");
            return -1;
        } else if (rx_utf8(r, &lo)) {
            return -1;
        }
        hi = lo;
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                struct cps sub = {0};
                if (rx_escape(r, &sub, &hi) != 1) {
                    rx_fail(r, "a class escape as a range end");
                    return -1;
                }
            } else if (rx_utf8(r, &hi)) {
                return -1;
            }
            if (hi < lo) {
                rx_fail(r, "a reversed range");
                return -1;
            }
        }
        cps_add(&c, lo, hi);
    }
    if (neg)
        cps_invert(&c);
    if (c.overflow) {
        rx_fail(r, "a class of too many ranges");
        return -1;
    }
    sb_json_class(r->b, &c);
    return 0;
}

static int rx_alt(struct rx *r, int top);

static int rx_atom(struct rx *r)
{
    char c = *r->p;
    if (c == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->end - r->p >= 2 && r->p[1] == ':') {
                r->p += 2;
            } else {
                r->p--;
                rx_fail(r, "a lookaround or named group");
                return -1;
            }
        }
        if (++r->depth > GRAMMAR_MAX_NESTING) {
            rx_fail(r, "groups nested too deep");
            return -1;
        }
        strbuf_puts(r->b, "(");
        if (rx_alt(r, 0))
            return -1;
        r->depth--;
        if (r->p >= r->end || *r->p != ')') {
            rx_fail(r, "a missing ')'");
            return -1;
        }
        r->p++;
        strbuf_puts(r->b, ")");
        return 0;
    }
    if (c == '[')
        return rx_class(r);
    if (c == '.') {
        r->p++;
        struct cps cs = {0};
        cps_add(&cs, '\n', '\n');
        cps_invert(&cs);
        sb_json_class(r->b, &cs);
        return 0;
    }
    uint32_t ch;
    if (c == '\\') {
        r->p++;
        struct cps cs = {0};
        int k = rx_escape(r, &cs, &ch);
        if (k < 0)
            return -1;
        if (k == 0) {
            sb_json_class(r->b, &cs);
            return 0;
        }
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        rx_fail(r, "a quantifier with nothing before it");
        return -1;
    } else if (c == '^' || c == '$') {
        rx_fail(r, "an anchor inside the pattern");
        return -1;
    } else if (rx_utf8(r, &ch)) {
        return -1;
    }
    sb_json_char(r->b, ch);
    return 0;
}

static int rx_seq(struct rx *r, int top)
{
    int any = 0;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (top && *r->p == '$' && r->p + 1 == r->end)
            break;
        strbuf_puts(r->b, "(");
        if (rx_atom(r))
            return -1;
        strbuf_puts(r->b, ")");
        any = 1;
        if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?')) {
            strbuf_add(r->b, r->p, 1);
            r->p++;
        } else if (r->p < r->end && *r->p == '{') {
            const char *q = r->p + 1;
            char *e;
            long m = strtol(q, &e, 10), n = m;
            if (e == q) {
                rx_fail(r, "a '{' that is not {m,n}");
                return -1;
            }
            if (*e == ',') {
                q = e + 1;
                n = *q == '}' ? -1 : strtol(q, &e, 10);
                if (n >= 0 && e == q) {
                    rx_fail(r, "a bad {m,n}");
                    return -1;
                }
                if (n < 0)
                    e = (char *)q;
            }
            if (*e != '}' || m < 0 || m > GRAMMAR_MAX_REPEAT || n > GRAMMAR_MAX_REPEAT ||
                (n >= 0 && n < m)) {
                rx_fail(r, "a bad {m,n}");
                return -1;
            }
            if (n < 0)
                strbuf_printf(r->b, "{%ld,}", m);
            else
                strbuf_printf(r->b, "{%ld,%ld}", m, n);
            r->p = e + 1;
        } else {
            continue;
        }
        /* lazy quantifiers generate the same language */
        if (r->p < r->end && *r->p == '?')
            r->p++;
        else if (r->p < r->end && *r->p == '+') {
            rx_fail(r, "a possessive quantifier");
            return -1;
        }
        strbuf_puts(r->b, " ");
    }
    if (!any)
        strbuf_puts(r->b, "\"\"");
    return 0;
}

static int rx_alt(struct rx *r, int top)
{
    for (;;) {
        if (rx_seq(r, top))
            return -1;
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            strbuf_puts(r->b, " | ");
            continue;
        }
        return 0;
    }
}

/* the string rule of a pattern. a pattern matches anywhere (re.search), so a side without its
 * anchor admits other characters; up to PATTERN_FREE of them, so that generation heads for the
 * pattern itself instead of wandering */
#define PATTERN_FREE 16

static void gen_pattern(struct js *j, struct strbuf *e, const char *pat, const char *path)
{
    size_t n = strlen(pat);
    int start = n && pat[0] == '^';
    int end = n > (size_t)start && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
    use_prim(j, P_CHAR);
    struct rx r = {.j = j, .pat = pat, .p = pat + start, .end = pat + n, .path = path};
    struct strbuf body = {0};
    r.b = &body;
    if (rx_alt(&r, 1) == 0 && r.p < r.end && !(end && r.p + 1 == r.end)) {
        rx_fail(&r, *r.p == ')' ? "an unmatched ')'" : "an anchor inside the pattern");
    }
    strbuf_puts(e, "\"\\\"\" ");
    if (!start)
        strbuf_printf(e, "char{0,%d} ", PATTERN_FREE);
    strbuf_puts(e, "(");
    strbuf_append(e, &body);
    strbuf_puts(e, ") ");
    if (!end)
        strbuf_printf(e, "char{0,%d} ", PATTERN_FREE);
    strbuf_puts(e, "\"\\\"\"");
    strbuf_fini(&body);
}

static const char DATE[] =
    "[1-9] [0-9]{3} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" "
    "[01]) | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" (\"0\" "
    "[1-9] | \"1\" [0-9] | \"2\" [0-8]))";
static const char TIME[] =
    "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | "
    "[+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";

static int gen_format(struct js *j, struct strbuf *e, const char *fmt, const char *path)
{
    strbuf_puts(e, "\"\\\"\" ");
    if (!strcmp(fmt, "date")) {
        strbuf_puts(e, DATE);
    } else if (!strcmp(fmt, "time")) {
        strbuf_puts(e, TIME);
    } else if (!strcmp(fmt, "date-time")) {
        strbuf_printf(e, "%s \"T\" %s", DATE, TIME);
    } else if (!strcmp(fmt, "uuid")) {
        strbuf_puts(e, "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" "
                       "[0-9a-f]{12}");
    } else if (!strcmp(fmt, "email")) {
        strbuf_puts(e, "[a-zA-Z0-9_+-]{1,32} (\".\" [a-zA-Z0-9_+-]{1,32}){0,3} \"@\" "
                       "[a-zA-Z0-9]{1,32} (\".\" [a-zA-Z0-9]{1,32}){1,3}");
    } else {
        js_fail(j, RKV_EUNSUPPORTED, path,
                "keyword \"format\": \"%s\" is not supported (supported: date, time, date-time, "
                "uuid, email)",
                fmt);
        return -1;
    }
    strbuf_puts(e, " \"\\\"\"");
    return 0;
}

static const cJSON *kw(const cJSON *s, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(s, name);
}

/* a non-negative integer keyword into *out (absent: def) */
static int kw_count(struct js *j, const cJSON *s, const char *name, const char *path, long def,
                    long *out)
{
    const cJSON *v = kw(s, name);
    *out = def;
    if (!v)
        return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (d < 0 || d != floor(d)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"%s\" must be a non-negative integer", name);
        return -1;
    }
    *out = d > 1e9 ? 1000000000L : (long)d;
    return 0;
}

static void gen_string(struct js *j, const cJSON *s, struct strbuf *e, const char *path)
{
    const cJSON *fmt = kw(s, "format"), *pat = kw(s, "pattern");
    long mn, mx;
    if (kw_count(j, s, "minLength", path, 0, &mn) || kw_count(j, s, "maxLength", path, -1, &mx))
        return;
    int lengths = kw(s, "minLength") || kw(s, "maxLength");
    if ((fmt != NULL) + (pat != NULL) + lengths > 1) {
        js_fail(j, RKV_EUNSUPPORTED, path,
                "keywords \"format\", \"pattern\" and \"minLength\"/\"maxLength\" do not combine "
                "(use one of them)");
        return;
    }
    if (fmt) {
        if (!cJSON_IsString(fmt))
            js_fail(j, RKV_EINVAL, path, "keyword \"format\" must be a string");
        else
            gen_format(j, e, fmt->valuestring, path);
        return;
    }
    if (pat) {
        if (!cJSON_IsString(pat))
            js_fail(j, RKV_EINVAL, path, "keyword \"pattern\" must be a string");
        else
            gen_pattern(j, e, pat->valuestring, path);
        return;
    }
    use_prim(j, P_CHAR);
    if (!lengths) {
        use_prim(j, P_STRING);
        strbuf_puts(e, "string");
        return;
    }
    if (mx >= 0 && mx < mn) {
        js_fail(j, RKV_EINVAL, path, "maxLength %ld is below minLength %ld", mx, mn);
        return;
    }
    if (mn > GRAMMAR_MAX_REPEAT) {
        js_fail(j, RKV_EUNSUPPORTED, path, "keyword \"minLength\": at most %d", GRAMMAR_MAX_REPEAT);
        return;
    }
    if (mx > GRAMMAR_MAX_REPEAT)
        mx = GRAMMAR_MAX_REPEAT; /* a shorter string still validates */
    if (mx < 0)
        strbuf_printf(e, "\"\\\"\" char{%ld,} \"\\\"\"", mn);
    else
        strbuf_printf(e, "\"\\\"\" char{%ld,%ld} \"\\\"\"", mn, mx);
}

/* ---- integers and numbers ---- */

/* decimal digits of x >= 0 */
static int digits(long long x, char *buf)
{
    return snprintf(buf, 24, "%lld", x);
}

/* same-length digit strings a <= b (n digits): the numbers between them */
static void range_same_len(struct strbuf *e, const char *a, const char *b, int n)
{
    if (n == 0)
        return;
    if (!strncmp(a, b, (size_t)n)) {
        sb_lit(e, a, (size_t)n);
        return;
    }
    if (a[0] == b[0]) {
        sb_lit(e, a, 1);
        strbuf_puts(e, " (");
        range_same_len(e, a + 1, b + 1, n - 1);
        strbuf_puts(e, ")");
        return;
    }
    int a_zero = 1, b_nine = 1;
    for (int i = 1; i < n; i++) {
        a_zero &= a[i] == '0';
        b_nine &= b[i] == '9';
    }
    char lo = a_zero ? a[0] : (char)(a[0] + 1), hi = b_nine ? b[0] : (char)(b[0] - 1);
    int first = 1;
    strbuf_puts(e, "(");
    if (!a_zero) {
        char nines[24];
        memset(nines, '9', sizeof nines);
        sb_lit(e, a, 1);
        strbuf_puts(e, " (");
        range_same_len(e, a + 1, nines, n - 1);
        strbuf_puts(e, ")");
        first = 0;
    }
    if (lo <= hi) {
        strbuf_printf(e, "%s[%c-%c]", first ? "" : " | ", lo, hi);
        if (n > 1)
            strbuf_printf(e, " [0-9]{%d}", n - 1);
        first = 0;
    }
    if (!b_nine) {
        char zeros[24];
        memset(zeros, '0', sizeof zeros);
        strbuf_printf(e, "%s", first ? "" : " | ");
        sb_lit(e, b, 1);
        strbuf_puts(e, " (");
        range_same_len(e, zeros, b + 1, n - 1);
        strbuf_puts(e, ")");
    }
    strbuf_puts(e, ")");
}

/* integers in [a, b], 0 <= a <= b, without leading zeros */
static void range_nonneg(struct strbuf *e, long long a, long long b)
{
    char sa[24], sb_[24];
    int la = digits(a, sa), lb = digits(b, sb_);
    strbuf_puts(e, "(");
    long long p = 1;
    for (int i = 1; i < la; i++)
        p *= 10;
    for (int len = la; len <= lb; len++) {
        long long lo = len == la ? a : p, hi = len == lb ? b : p * 10 - 1;
        char x[24], y[24];
        digits(lo, x);
        digits(hi, y);
        if (len > la)
            strbuf_puts(e, " | ");
        range_same_len(e, x, y, len);
        p *= 10;
    }
    strbuf_puts(e, ")");
}

#define INT_LIMIT 9999999999999999LL /* 16 digits, as the integer primitive */

static void range_int(struct strbuf *e, long long lo, long long hi)
{
    int first = 1;
    strbuf_puts(e, "(");
    if (lo < 0) {
        long long a = hi < 0 ? -hi : 1;
        strbuf_puts(e, "\"-\" ");
        range_nonneg(e, a, -lo);
        first = 0;
    }
    if (hi >= 0) {
        strbuf_puts(e, first ? "" : " | ");
        range_nonneg(e, lo > 0 ? lo : 0, hi);
    }
    strbuf_puts(e, ")");
}

/* a number keyword's value, or dflt when absent; -1 when present but not a number */
static int kw_num(struct js *j, const cJSON *s, const char *name, const char *path, double *out)
{
    const cJSON *v = kw(s, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"%s\" must be a number", name);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

/* a bound as an integer within the 16 digits the integer rule allows (doubles cannot hold
 * 9999999999999999 exactly) */
static long long clamp_int(double d)
{
    if (d >= 9.9e15)
        return INT_LIMIT;
    if (d <= -9.9e15)
        return -INT_LIMIT;
    return (long long)d;
}

static void gen_integer(struct js *j, const cJSON *s, struct strbuf *e, const char *path)
{
    static const struct {
        const char *name;
        int upper;     /* bounds from above */
        double adjust; /* exclusive: one past, after rounding inwards */
    } B[] = {{"minimum", 0, 0},
             {"exclusiveMinimum", 0, 1},
             {"maximum", 1, 0},
             {"exclusiveMaximum", 1, -1}};
    long long lo = -INT_LIMIT, hi = INT_LIMIT;
    int any = 0;
    for (size_t i = 0; i < RKV_ARRAY_LEN(B); i++) {
        double x;
        int k = kw_num(j, s, B[i].name, path, &x);
        if (k < 0)
            return;
        if (!k)
            continue;
        any = 1;
        if (B[i].upper) {
            long long v = clamp_int((B[i].adjust ? ceil(x) : floor(x)) + B[i].adjust);
            hi = v < hi ? v : hi;
        } else {
            long long v = clamp_int((B[i].adjust ? floor(x) : ceil(x)) + B[i].adjust);
            lo = v > lo ? v : lo;
        }
    }
    if (!any) {
        use_prim(j, P_INTEGER);
        strbuf_puts(e, "integer");
        return;
    }
    if (lo > hi) {
        js_fail(j, RKV_EINVAL, path, "no integer lies between minimum and maximum");
        return;
    }
    range_int(e, lo, hi);
}

static void gen_number(struct js *j, const cJSON *s, struct strbuf *e, const char *path)
{
    if (kw(s, "exclusiveMinimum") || kw(s, "exclusiveMaximum")) {
        js_fail(j, RKV_EUNSUPPORTED, path,
                "keywords \"exclusiveMinimum\"/\"exclusiveMaximum\" are supported on integers "
                "only (use type integer, or minimum/maximum)");
        return;
    }
    double lo = -1e15, hi = 1e15;
    int k1 = kw_num(j, s, "minimum", path, &lo), k2 = kw_num(j, s, "maximum", path, &hi);
    if (k1 < 0 || k2 < 0)
        return;
    if (!k1 && !k2) {
        use_prim(j, P_NUMBER);
        strbuf_puts(e, "number");
        return;
    }
    if (lo != floor(lo) || hi != floor(hi) || fabs(lo) > 1e15 || fabs(hi) > 1e15) {
        js_fail(j, RKV_EUNSUPPORTED, path,
                "keywords \"minimum\"/\"maximum\" on numbers must be integers within 1e15 "
                "(got %g, %g)",
                lo, hi);
        return;
    }
    if (lo > hi) {
        js_fail(j, RKV_EINVAL, path, "minimum is above maximum");
        return;
    }
    /* x in [lo, hi]: an integer part below the bound with any fraction, or the bound itself */
    long long a = (long long)lo, b = (long long)hi;
    const char *frac = " (\".\" [0-9]{1,16})?";
    int first = 1;
    char t[24];
    strbuf_puts(e, "(");
    if (b >= 0) {
        long long c = a > 0 ? a : 0;
        if (c <= b - 1) {
            range_nonneg(e, c, b - 1);
            strbuf_puts(e, frac);
            strbuf_puts(e, " | ");
        }
        sb_lit(e, t, (size_t)digits(b, t));
        first = 0;
    }
    if (a < 0) {
        long long c = b < 0 ? -b : 0;
        strbuf_puts(e, first ? "\"-\" (" : " | \"-\" (");
        if (c <= -a - 1) {
            range_nonneg(e, c, -a - 1);
            strbuf_puts(e, frac);
            strbuf_puts(e, " | ");
        }
        sb_lit(e, t, (size_t)digits(-a, t));
        strbuf_puts(e, ")");
    }
    strbuf_puts(e, ")");
}

/* ---- arrays ---- */

static void gen_array(struct js *j, const cJSON *s, struct strbuf *e, const char *path,
                      const char *hint)
{
    const cJSON *items = kw(s, "items"), *prefix = kw(s, "prefixItems");
    long m, mx;
    if (kw_count(j, s, "minItems", path, 0, &m) || kw_count(j, s, "maxItems", path, -1, &mx))
        return;
    if (prefix && !cJSON_IsArray(prefix)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"prefixItems\" must be an array of schemas");
        return;
    }
    if (items && cJSON_IsArray(items)) {
        js_fail(j, RKV_EUNSUPPORTED, path,
                "keyword \"items\" as an array is not supported (use \"prefixItems\")");
        return;
    }
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    int no_more = items && cJSON_IsFalse(items);
    if (no_more && (mx < 0 || mx > k))
        mx = k;
    if (mx >= 0 && m > mx) {
        js_fail(j, RKV_EINVAL, path, "minItems %ld is above the most items allowed (%ld)", m, mx);
        return;
    }
    if (m > GRAMMAR_MAX_REPEAT || k > 1000) {
        js_fail(j, RKV_EUNSUPPORTED, path, "keyword \"minItems\": at most %d", GRAMMAR_MAX_REPEAT);
        return;
    }
    if (mx > GRAMMAR_MAX_REPEAT)
        mx = GRAMMAR_MAX_REPEAT;
    char **pre = calloc((size_t)(k ? k : 1), sizeof *pre);
    char *item = NULL;
    if (!pre) {
        js_fail(j, RKV_ENOMEM, path, "out of memory");
        return;
    }
    for (int i = 0; i < k && !j->rc; i++) {
        char seg[32];
        snprintf(seg, sizeof seg, "prefixItems/%d", i);
        pre[i] = gen_sub(j, cJSON_GetArrayItem(prefix, i), path, seg, hint);
    }
    if (!no_more && !j->rc) {
        if (items) {
            item = gen_sub(j, items, path, "items", hint);
        } else {
            use_prim(j, P_VALUE);
            item = strdup("value");
        }
    }
    if (j->rc)
        goto out;
    strbuf_puts(e, "\"[\" ws ");
    /* element i after i written: prefix ones nest, group i optional when i >= minItems */
    long n_open = 0;
    for (long i = 0; mx < 0 || i < mx; i++) {
        if (i >= k) {
            if (no_more)
                break;
            /* the rest are items: between max(0, m - i) and mx - i more */
            long lo = m > i ? m - i : 0;
            if (i == 0) {
                strbuf_printf(e, "(%s ws (\",\" ws %s ws)", item, item);
                lo = lo > 0 ? lo - 1 : 0;
                if (mx < 0)
                    strbuf_printf(e, "{%ld,}", lo);
                else
                    strbuf_printf(e, "{%ld,%ld}", lo, mx - 1);
                strbuf_puts(e, m > 0 ? ") " : ")? ");
            } else {
                strbuf_printf(e, "(\",\" ws %s ws)", item);
                if (mx < 0)
                    strbuf_printf(e, "{%ld,} ", lo);
                else
                    strbuf_printf(e, "{%ld,%ld} ", lo, mx - i);
            }
            break;
        }
        strbuf_printf(e, "(%s%s ws ", i ? "\",\" ws " : "", pre[i]);
        n_open++;
    }
    for (long i = n_open - 1; i >= 0; i--)
        strbuf_puts(e, i >= m ? ")? " : ") ");
    strbuf_puts(e, "\"]\"");
out:
    for (int i = 0; i < k; i++)
        free(pre[i]);
    free(pre);
    free(item);
}

/* ---- objects ---- */

/* the JSON-encoded key (without quotes) as a GBNF literal of "\"key\"" */
static void sb_key(struct strbuf *e, const char *name)
{
    cJSON *str = cJSON_CreateString(name);
    char *enc = str ? cJSON_PrintUnformatted(str) : NULL;
    if (enc)
        sb_lit(e, enc, strlen(enc));
    else
        e->err = RKV_ENOMEM;
    free(enc);
    cJSON_Delete(str);
}

/* a key string equal to none of names (ASCII names without quote or backslash are excluded;
 * others are not). a rule per trie node of the names. */
static char *gen_other_key(struct js *j, const char *const *names, int n)
{
    use_prim(j, P_CHAR);
    struct strbuf e = {0};
    char *name = rule_name(j, "other-key");
    if (!name)
        return NULL;
    /* K(prefix) = "(" end-here | a char leaving every name, then anything | c K(prefix c) ")"
     * over the trie of the names, written with an explicit stack of frames: stage 0 writes
     * a prefix's own alternatives, 2 + c opens its child c, 1 closes it */
    struct strbuf body = {0};
    char pre[256] = "";
    size_t pl = 0, total = 2;
    for (int i = 0; i < n; i++)
        total += strlen(names[i]) + 1;
    struct stk {
        size_t pl;
        int stage;
    } *stack = malloc(total * sizeof *stack);
    int sp = 0;
    if (!stack) {
        free(name);
        js_fail(j, RKV_ENOMEM, "schema", "out of memory");
        return NULL;
    }
    stack[sp++] = (struct stk){0, 0};
    strbuf_puts(&body, "\"\\\"\" ");
    while (sp) {
        struct stk *t = &stack[sp - 1];
        pl = t->pl;
        if (t->stage == 0) {
            /* the children of this prefix: distinct next bytes of names extending it */
            uint8_t kids[128] = {0};
            int word = 0, nk = 0;
            for (int i = 0; i < n; i++) {
                const char *w = names[i];
                size_t wl = strlen(w);
                int ok = 1;
                for (size_t q = 0; q < wl && ok; q++)
                    ok = (unsigned char)w[q] >= 0x20 && (unsigned char)w[q] < 0x7f && w[q] != '"' &&
                         w[q] != '\\';
                if (!ok || wl < pl || memcmp(w, pre, pl))
                    continue;
                if (wl == pl)
                    word = 1;
                else if (!kids[(unsigned char)w[pl]]) {
                    kids[(unsigned char)w[pl]] = 1;
                    nk++;
                }
            }
            strbuf_puts(&body, "(");
            int first = 1;
            if (!word) {
                strbuf_puts(&body, "\"\\\"\"");
                first = 0;
            }
            /* a character that leaves every name: any other char, then anything */
            struct cps other = {0};
            for (int c = 0; c < 128; c++)
                if (kids[c])
                    cps_add(&other, (uint32_t)c, (uint32_t)c);
            cps_add(&other, '"', '"');
            cps_add(&other, '\\', '\\');
            cps_add(&other, 0, 0x1f);
            cps_invert(&other);
            strbuf_puts(&body, first ? "" : " | ");
            strbuf_puts(&body, "(");
            struct strbuf cls = {0};
            sb_json_class(&cls, &other);
            strbuf_append(&body, &cls);
            strbuf_fini(&cls);
            strbuf_puts(&body, " | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" " U_ESC ")) char* \"\\\"\"");
            t->stage = 1;
            /* children, one frame each */
            if (nk && pl < sizeof pre - 1) {
                for (int c = 127; c >= 0; c--) {
                    if (!kids[c])
                        continue;
                    /* pushed in reverse so they come out in order; each writes " | c (K)" */
                    stack[sp++] = (struct stk){pl + 1, 2 + c};
                }
            }
            continue;
        }
        if (t->stage >= 2) {
            int c = t->stage - 2;
            pre[t->pl - 1] = (char)c;
            char lit[2] = {(char)c, 0};
            strbuf_puts(&body, " | ");
            sb_lit(&body, lit, 1);
            strbuf_puts(&body, " ");
            t->stage = 0;
            continue;
        }
        /* stage 1: done with this prefix */
        strbuf_puts(&body, ")");
        sp--;
    }
    free(stack);
    strbuf_append(&e, &body);
    strbuf_fini(&body);
    if (e.err)
        js_fail(j, RKV_ENOMEM, "schema", "out of memory");
    emit_rule(j, name, &e);
    strbuf_fini(&e);
    return name;
}

static void gen_object(struct js *j, const cJSON *s, struct strbuf *e, const char *path,
                       const char *hint)
{
    const cJSON *props = kw(s, "properties"), *req = kw(s, "required"),
                *add = kw(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"properties\" must be an object");
        return;
    }
    if (req && !cJSON_IsArray(req)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"required\" must be an array of names");
        return;
    }
    int np = props ? cJSON_GetArraySize(props) : 0, nr = req ? cJSON_GetArraySize(req) : 0;
    if (!np && !nr && (!add || cJSON_IsTrue(add))) {
        use_prim(j, P_OBJECT);
        strbuf_puts(e, "object");
        return;
    }
    /* the declared properties, then required names without a schema */
    int n = 0;
    const char **names = calloc((size_t)(np + nr + 1), sizeof *names);
    char **rules = calloc((size_t)(np + nr + 1), sizeof *rules);
    uint8_t *required = calloc((size_t)(np + nr + 1), 1);
    char *extra = NULL;
    if (!names || !rules || !required) {
        js_fail(j, RKV_ENOMEM, path, "out of memory");
        goto out;
    }
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next)
        names[n++] = p->string;
    for (int i = 0; i < nr; i++) {
        const cJSON *r = cJSON_GetArrayItem(req, i);
        if (!cJSON_IsString(r)) {
            js_fail(j, RKV_EINVAL, path, "keyword \"required\" must be an array of names");
            goto out;
        }
        int k;
        for (k = 0; k < n; k++)
            if (!strcmp(names[k], r->valuestring))
                break;
        if (k == n)
            names[n++] = r->valuestring;
        required[k] = 1;
    }
    char seg[300];
    for (int i = 0; i < n && !j->rc; i++) {
        const cJSON *ps = props ? kw(props, names[i]) : NULL;
        if (ps) {
            snprintf(seg, sizeof seg, "properties/%s", names[i]);
            rules[i] = gen_sub(j, ps, path, seg, names[i]);
        } else {
            use_prim(j, P_VALUE);
            rules[i] = strdup("value");
        }
    }
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add)) {
        js_fail(j, RKV_EINVAL, path,
                "keyword \"additionalProperties\" must be a boolean or a schema");
        goto out;
    }
    if (add && !cJSON_IsFalse(add) && !j->rc) {
        char *key = gen_other_key(j, names, n);
        char *val = NULL;
        if (cJSON_IsTrue(add)) {
            use_prim(j, P_VALUE);
            val = strdup("value");
        } else {
            val = gen_sub(j, add, path, "additionalProperties", hint);
        }
        if (key && val) {
            size_t l = strlen(key) + strlen(val) + 32;
            extra = malloc(l);
            if (extra)
                snprintf(extra, l, "%s ws \":\" ws %s ws", key, val);
        }
        free(key);
        free(val);
        if (!extra && !j->rc)
            js_fail(j, RKV_ENOMEM, path, "out of memory");
    }
    if (j->rc)
        goto out;
    /* first_i: nothing written yet; rest_i: something written, each next one after a comma.
     * written inline from the end: rest_n, first_n. */
    struct strbuf rest = {0}, first = {0};
    if (extra) {
        strbuf_printf(&rest, "(\",\" ws %s)*", extra);
        strbuf_printf(&first, "(%s (\",\" ws %s)*)?", extra, extra);
    } else {
        strbuf_puts(&rest, "\"\"");
        strbuf_puts(&first, "\"\"");
    }
    for (int i = n - 1; i >= 0; i--) {
        struct strbuf kv = {0}, r2 = {0}, f2 = {0};
        sb_key(&kv, names[i]);
        strbuf_printf(&kv, " ws \":\" ws %s ws", rules[i]);
        /* a rule per step keeps the text linear in n */
        char *rn = rule_name(j, "rest");
        char *fn = rule_name(j, "first");
        if (!rn || !fn) {
            free(rn);
            free(fn);
            strbuf_fini(&kv);
            break;
        }
        strbuf_printf(&r2, "\",\" ws %s %s", kv.s, rest.s);
        if (!required[i])
            strbuf_printf(&r2, " | %s", rest.s);
        strbuf_printf(&f2, "%s %s", kv.s, rest.s);
        if (!required[i])
            strbuf_printf(&f2, " | %s", first.s);
        emit_rule(j, rn, &r2);
        emit_rule(j, fn, &f2);
        strbuf_fini(&rest);
        strbuf_fini(&first);
        strbuf_puts(&rest, rn);
        strbuf_puts(&first, fn);
        free(rn);
        free(fn);
        strbuf_fini(&kv);
        strbuf_fini(&r2);
        strbuf_fini(&f2);
    }
    strbuf_printf(e, "\"{\" ws %s \"}\"", first.s ? first.s : "\"\"");
    strbuf_fini(&rest);
    strbuf_fini(&first);
out:
    for (int i = 0; i < n; i++)
        free(rules[i]);
    free(names);
    free(rules);
    free(required);
    free(extra);
}

/* ---- keywords, types, combinators ---- */

static int check_keywords(struct js *j, const cJSON *s, const char *path)
{
    for (const cJSON *k = s->child; k; k = k->next) {
        size_t i;
        for (i = 0; KEYWORDS[i]; i++)
            if (!strcmp(k->string, KEYWORDS[i]))
                break;
        if (!KEYWORDS[i]) {
            js_fail(j, RKV_EUNSUPPORTED, path, "keyword \"%s\" is not supported (supported: %s)",
                    k->string, SUPPORTED);
            return -1;
        }
    }
    return 0;
}

static void gen_literal(struct js *j, struct strbuf *e, const cJSON *v, const char *path)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        js_fail(j, RKV_ENOMEM, path, "out of memory");
        return;
    }
    sb_lit(e, t, strlen(t));
    free(t);
}

static void gen_type(struct js *j, const cJSON *s, const char *type, struct strbuf *e,
                     const char *path, const char *hint)
{
    if (!strcmp(type, "string")) {
        gen_string(j, s, e, path);
    } else if (!strcmp(type, "integer")) {
        gen_integer(j, s, e, path);
    } else if (!strcmp(type, "number")) {
        gen_number(j, s, e, path);
    } else if (!strcmp(type, "boolean")) {
        use_prim(j, P_BOOLEAN);
        strbuf_puts(e, "boolean");
    } else if (!strcmp(type, "null")) {
        use_prim(j, P_NULL);
        strbuf_puts(e, "null");
    } else if (!strcmp(type, "object")) {
        gen_object(j, s, e, path, hint);
    } else if (!strcmp(type, "array")) {
        gen_array(j, s, e, path, hint);
    } else {
        js_fail(j, RKV_EINVAL, path,
                "keyword \"type\": \"%s\" is not a type (string, integer, number, boolean, "
                "null, object, array)",
                type);
    }
}

/* allOf: one schema of the parts' keywords (properties merged, required joined) */
static cJSON *merge_all_of(struct js *j, const cJSON *s, const char *path)
{
    const cJSON *all = kw(s, "allOf");
    if (!cJSON_IsArray(all)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"allOf\" must be an array of schemas");
        return NULL;
    }
    cJSON *m = cJSON_CreateObject();
    if (!m) {
        js_fail(j, RKV_ENOMEM, path, "out of memory");
        return NULL;
    }
    int n = cJSON_GetArraySize(all);
    for (int i = -1; i < n && !j->rc; i++) {
        const cJSON *part = i < 0 ? s : cJSON_GetArrayItem(all, i);
        for (int hop = 0; part && cJSON_IsObject(part) && kw(part, "$ref") && hop < 32; hop++) {
            const cJSON *ref = kw(part, "$ref");
            part = cJSON_IsString(ref) ? resolve_ref(j, ref->valuestring) : NULL;
        }
        if (!part || !cJSON_IsObject(part)) {
            js_fail(j, RKV_EUNSUPPORTED, path,
                    "keyword \"allOf\": part %d must be an object schema or a resolvable $ref", i);
            break;
        }
        if (i >= 0 && kw(part, "allOf")) {
            js_fail(j, RKV_EUNSUPPORTED, path, "keyword \"allOf\": nested allOf is not supported");
            break;
        }
        for (const cJSON *k = part->child; k && !j->rc; k = k->next) {
            if (!strcmp(k->string, "allOf"))
                continue;
            cJSON *have = cJSON_GetObjectItemCaseSensitive(m, k->string);
            if (!have) {
                cJSON_AddItemToObject(m, k->string, cJSON_Duplicate(k, 1));
            } else if (!strcmp(k->string, "properties") && cJSON_IsObject(k)) {
                for (const cJSON *p = k->child; p; p = p->next) {
                    cJSON_DeleteItemFromObjectCaseSensitive(have, p->string);
                    cJSON_AddItemToObject(have, p->string, cJSON_Duplicate(p, 1));
                }
            } else if (!strcmp(k->string, "required") && cJSON_IsArray(k)) {
                for (const cJSON *r = k->child; r; r = r->next)
                    cJSON_AddItemToArray(have, cJSON_Duplicate(r, 1));
            } else if (!cJSON_Compare(have, k, 1)) {
                js_fail(j, RKV_EUNSUPPORTED, path,
                        "keyword \"allOf\": the parts disagree on \"%s\" (only properties and "
                        "required merge)",
                        k->string);
            }
        }
    }
    if (j->rc || rkv_grow((void **)&j->owned, &j->cap_owned, (j->n_owned + 1) * sizeof *j->owned,
                          8 * sizeof *j->owned)) {
        cJSON_Delete(m);
        if (!j->rc)
            js_fail(j, RKV_ENOMEM, path, "out of memory");
        return NULL;
    }
    j->owned[j->n_owned++] = m;
    return m;
}

/* alternatives of the schemas in an anyOf/oneOf array */
static void gen_any_of(struct js *j, const cJSON *arr, const char *key, struct strbuf *e,
                       const char *path, const char *hint)
{
    if (!cJSON_IsArray(arr) || !cJSON_GetArraySize(arr)) {
        js_fail(j, RKV_EINVAL, path, "keyword \"%s\" must be a non-empty array of schemas", key);
        return;
    }
    int i = 0;
    strbuf_puts(e, "(");
    for (const cJSON *c = arr->child; c && !j->rc; c = c->next, i++) {
        char seg[40];
        snprintf(seg, sizeof seg, "%s/%d", key, i);
        char *r = gen_sub(j, c, path, seg, hint);
        if (r)
            strbuf_printf(e, "%s%s", i ? " | " : "", r);
        free(r);
    }
    strbuf_puts(e, ")");
}

/* the rule of schema s; returns its name (malloc'd) */
static char *gen(struct js *j, const cJSON *s, const char *path, const char *hint)
{
    if (j->rc)
        return NULL;
    if (++j->depth > 64) {
        js_fail(j, RKV_ETOOBIG, path, "schema nested deeper than 64 levels");
        j->depth--;
        return NULL;
    }
    char *name = NULL;
    struct strbuf e = {0};
    if (cJSON_IsTrue(s)) {
        use_prim(j, P_VALUE);
        name = strdup("value");
        goto done;
    }
    if (!cJSON_IsObject(s)) {
        js_fail(j, cJSON_IsFalse(s) ? RKV_EUNSUPPORTED : RKV_EINVAL, path,
                cJSON_IsFalse(s) ? "the schema false allows no value"
                                 : "a schema must be an object or a boolean");
        goto done;
    }
    if (check_keywords(j, s, path))
        goto done;
    const cJSON *ref = kw(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) {
            js_fail(j, RKV_EINVAL, path, "keyword \"$ref\" must be a string");
            goto done;
        }
        for (const cJSON *k = s->child; k; k = k->next) {
            static const char *const ok[] = {"$ref",     "description", "title", "default",
                                             "examples", "$comment",    "$defs", "definitions",
                                             "$schema",  "$id",         NULL};
            int i;
            for (i = 0; ok[i] && strcmp(ok[i], k->string); i++)
                ;
            if (!ok[i]) {
                js_fail(j, RKV_EUNSUPPORTED, path,
                        "keyword \"%s\" beside \"$ref\" is not supported (wrap both in allOf)",
                        k->string);
                goto done;
            }
        }
        name = gen_ref(j, ref->valuestring, path);
        goto done;
    }
    if (kw(s, "allOf")) {
        cJSON *m = merge_all_of(j, s, path);
        if (m)
            name = gen(j, m, path, hint);
        goto done;
    }
    const cJSON *c;
    if ((c = kw(s, "const"))) {
        gen_literal(j, &e, c, path);
    } else if ((c = kw(s, "enum"))) {
        if (!cJSON_IsArray(c) || !cJSON_GetArraySize(c)) {
            js_fail(j, RKV_EINVAL, path, "keyword \"enum\" must be a non-empty array");
            goto done;
        }
        strbuf_puts(&e, "(");
        for (const cJSON *v = c->child; v; v = v->next) {
            if (v != c->child)
                strbuf_puts(&e, " | ");
            gen_literal(j, &e, v, path);
        }
        strbuf_puts(&e, ")");
    } else if ((c = kw(s, "anyOf")) || (c = kw(s, "oneOf"))) {
        if (kw(s, "anyOf") && kw(s, "oneOf")) {
            js_fail(j, RKV_EUNSUPPORTED, path, "keywords \"anyOf\" and \"oneOf\" together");
            goto done;
        }
        gen_any_of(j, c, c->string, &e, path, hint);
    } else if ((c = kw(s, "type"))) {
        if (cJSON_IsString(c)) {
            gen_type(j, s, c->valuestring, &e, path, hint);
        } else if (cJSON_IsArray(c) && cJSON_GetArraySize(c)) {
            strbuf_puts(&e, "(");
            for (const cJSON *t = c->child; t && !j->rc; t = t->next) {
                if (!cJSON_IsString(t)) {
                    js_fail(j, RKV_EINVAL, path,
                            "keyword \"type\" must be a string or an array "
                            "of strings");
                    break;
                }
                if (t != c->child)
                    strbuf_puts(&e, " | ");
                gen_type(j, s, t->valuestring, &e, path, hint);
            }
            strbuf_puts(&e, ")");
        } else {
            js_fail(j, RKV_EINVAL, path,
                    "keyword \"type\" must be a string or an array of strings");
        }
    } else if (kw(s, "properties") || kw(s, "required") || kw(s, "additionalProperties")) {
        gen_object(j, s, &e, path, hint);
    } else if (kw(s, "items") || kw(s, "prefixItems") || kw(s, "minItems") || kw(s, "maxItems")) {
        gen_array(j, s, &e, path, hint);
    } else if (kw(s, "pattern") || kw(s, "format") || kw(s, "minLength") || kw(s, "maxLength")) {
        gen_string(j, s, &e, path);
    } else if (kw(s, "minimum") || kw(s, "maximum") || kw(s, "exclusiveMinimum") ||
               kw(s, "exclusiveMaximum")) {
        gen_number(j, s, &e, path);
    } else {
        use_prim(j, P_VALUE);
        strbuf_puts(&e, "value");
    }
    if (j->rc)
        goto done;
    name = rule_name(j, hint);
    if (name)
        emit_rule(j, name, &e);
done:
    if (e.err)
        js_fail(j, RKV_ENOMEM, path, "out of memory");
    strbuf_fini(&e);
    j->depth--;
    if (j->rc) {
        free(name);
        return NULL;
    }
    if (!name)
        js_fail(j, RKV_ENOMEM, path, "out of memory");
    return name;
}

/* s as a GBNF literal's body: quote, backslash and control bytes escaped */
static void sb_literal(struct strbuf *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            strbuf_printf(b, "\\%c", c);
        else if (c == '\n')
            strbuf_puts(b, "\\n");
        else if (c < 0x20 || c == 0x7f)
            strbuf_printf(b, "\\x%02x", c);
        else
            strbuf_add(b, s, 1);
    }
}

static int schema_gbnf(const char *schema, size_t len, const char *prefix, const char *suffix,
                       char **gbnf, char *err, size_t errlen);

int json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, char *err, size_t errlen)
{
    return schema_gbnf(schema, len, NULL, NULL, gbnf, err, errlen);
}

int json_schema_to_gbnf_framed(const char *schema, size_t len, const char *prefix,
                               const char *suffix, char **gbnf, char *err, size_t errlen)
{
    return schema_gbnf(schema, len, prefix, suffix, gbnf, err, errlen);
}

static int schema_gbnf(const char *schema, size_t len, const char *prefix, const char *suffix,
                       char **gbnf, char *err, size_t errlen)
{
    if (!gbnf || (!schema && len))
        return RKV_EINVAL;
    *gbnf = NULL;
    if (err && errlen)
        err[0] = 0;
    struct js j = {.err = err, .errlen = errlen};
    j.doc = cJSON_ParseWithLength(schema ? schema : "", len);
    if (!j.doc) {
        if (err && errlen)
            snprintf(err, errlen, "schema: not valid JSON");
        return RKV_EFORMAT;
    }
    char *top = gen(&j, j.doc, "schema", "root");
    int rc = j.rc;
    if (!rc) {
        /* root first, then the rules it uses */
        struct strbuf all = {0};
        strbuf_puts(&all, "root ::=");
        if (prefix && *prefix) {
            strbuf_puts(&all, " \"");
            sb_literal(&all, prefix);
            strbuf_puts(&all, "\"");
        }
        strbuf_printf(&all, " ( %s )", top);
        if (suffix && *suffix) {
            strbuf_puts(&all, " \"");
            sb_literal(&all, suffix);
            strbuf_puts(&all, "\"");
        }
        strbuf_puts(&all, "\n");
        strbuf_append(&all, &j.out);
        strbuf_fini(&j.out);
        j.out = all;
        strbuf_puts(&j.out, WS_RULE);
        unsigned want = j.prims;
        for (int pass = 0; pass < 4; pass++)
            for (size_t i = 0; i < RKV_ARRAY_LEN(PRIMS); i++)
                if (want & PRIMS[i].bit)
                    want |= PRIMS[i].needs;
        for (size_t i = 0; i < RKV_ARRAY_LEN(PRIMS); i++)
            if (want & PRIMS[i].bit)
                strbuf_puts(&j.out, PRIMS[i].text);
        if (j.out.err)
            rc = RKV_ENOMEM;
    }
    free(top);
    if (!rc) {
        /* the grammar must compile (a $ref cycle without a byte between is left recursion) */
        struct grammar *g = NULL;
        char gerr[256];
        rc = grammar_compile(j.out.s, j.out.n, &g, gerr, sizeof gerr);
        grammar_destroy(g);
        if (rc && err && errlen)
            snprintf(err, errlen, "schema: %s", gerr);
    }
    if (!rc) {
        *gbnf = j.out.s;
        j.out.s = NULL;
    }
    strbuf_fini(&j.out);
    for (size_t i = 0; i < j.n_refs; i++) {
        free(j.refs[i].ptr);
        free(j.refs[i].rule);
    }
    free(j.refs);
    for (size_t i = 0; i < j.n_owned; i++)
        cJSON_Delete(j.owned[i]);
    free(j.owned);
    cJSON_Delete(j.doc);
    return rc;
}
