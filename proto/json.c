/* json.c - the table-driven JSON codec: every field checked, errors name message and field. */
#include "proto/json.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/msg.h"
#include "proto/proto.h"

#define EXACT_MAX  9007199254740992.0 /* 2^53: doubles hold every integer up to here */
#define MAX_FIELDS 64

/* a json value in a few words, for "got ..." */
static void describe(const cJSON *v, char *buf, size_t n)
{
    if (cJSON_IsNumber(v)) {
        snprintf(buf, n, "%.15g", v->valuedouble);
    } else if (cJSON_IsString(v)) {
        char tmp[44];
        size_t i = 0;
        const char *s = v->valuestring;
        for (; s[i] && i < 40; i++)
            tmp[i] = (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"') ? s[i] : '?';
        tmp[i] = 0;
        snprintf(buf, n, "\"%s%s\"", tmp, s[i] ? "..." : "");
    } else if (cJSON_IsBool(v)) {
        snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNull(v)) {
        snprintf(buf, n, "null");
    } else if (cJSON_IsArray(v)) {
        snprintf(buf, n, "an array");
    } else if (cJSON_IsObject(v)) {
        snprintf(buf, n, "an object");
    } else {
        snprintf(buf, n, "an invalid value");
    }
}

/* an integer as sign + magnitude so u64 and i64 share one path */
struct ival {
    bool neg;
    uint64_t mag;
};

/* 0 when v is a whole number within 2^53, or (allow_str) a decimal string */
static int int_value(const cJSON *v, bool allow_str, struct ival *out)
{
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (!isfinite(d) || d != floor(d) || fabs(d) > EXACT_MAX)
            return -1;
        out->neg = d < 0;
        out->mag = (uint64_t)fabs(d);
        return 0;
    }
    if (!allow_str || !cJSON_IsString(v))
        return -1;
    const char *s = v->valuestring;
    bool neg = *s == '-';
    s += neg;
    if (!*s || strlen(s) > 20)
        return -1;
    uint64_t m = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (m > (UINT64_MAX - d) / 10)
            return -1;
        m = m * 10 + d;
    }
    out->neg = neg && m;
    out->mag = m;
    return 0;
}

static void int_range(const struct proto_field *f, enum proto_ftype base, int64_t *lo, uint64_t *hi)
{
    if (f->min || f->max) {
        *lo = f->min;
        *hi = f->max;
        return;
    }
    *lo = base == PROTO_FT_I64 ? INT64_MIN : 0;
    *hi = base == PROTO_FT_U32 ? UINT32_MAX : base == PROTO_FT_I64 ? INT64_MAX : UINT64_MAX;
}

static bool int_in_range(struct ival v, int64_t lo, uint64_t hi)
{
    if (v.neg)
        return lo < 0 && v.mag <= (uint64_t)(-(lo + 1)) + 1;
    return (lo <= 0 || v.mag >= (uint64_t)lo) && v.mag <= hi;
}

static size_t elem_size(enum proto_ftype base)
{
    return base == PROTO_FT_U32 ? sizeof(uint32_t) : sizeof(uint64_t);
}

static enum proto_ftype elem_type(enum proto_ftype t)
{
    switch (t) {
    case PROTO_FT_U32_ARR: return PROTO_FT_U32;
    case PROTO_FT_U64_ARR: return PROTO_FT_U64;
    case PROTO_FT_F64_ARR: return PROTO_FT_F64;
    default: return t;
    }
}

static int read_int(const struct proto_schema *s, const struct proto_field *f,
                    enum proto_ftype base, const cJSON *v, void *dst, const char *label, char *err,
                    size_t errlen)
{
    int64_t lo;
    uint64_t hi;
    int_range(f, base, &lo, &hi);
    struct ival iv;
    char got[64];
    describe(v, got, sizeof got);
    if (int_value(v, base != PROTO_FT_U32, &iv) != 0) {
        bool big = cJSON_IsNumber(v) && fabs(v->valuedouble) > EXACT_MAX &&
                   isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
        return proto_seterr(
            err, errlen, big ? RKV_ERANGE : RKV_EFORMAT,
            "%s: field %s must be an integer in [%" PRId64 ", %" PRIu64 "], got %s%s", s->name,
            label, lo, hi, got, big ? " (integers above 2^53 travel as decimal strings)" : "");
    }
    if (!int_in_range(iv, lo, hi))
        return proto_seterr(err, errlen, RKV_ERANGE,
                            "%s: field %s must be an integer in [%" PRId64 ", %" PRIu64 "], got %s",
                            s->name, label, lo, hi, got);
    switch (base) {
    case PROTO_FT_U32: *(uint32_t *)dst = (uint32_t)iv.mag; break;
    case PROTO_FT_U64: *(uint64_t *)dst = iv.mag; break;
    default: *(int64_t *)dst = iv.neg ? -(int64_t)(iv.mag - 1) - 1 : (int64_t)iv.mag; break;
    }
    return 0;
}

static int read_f64(const struct proto_schema *s, const struct proto_field *f, const cJSON *v,
                    double *dst, const char *label, char *err, size_t errlen)
{
    char got[64];
    describe(v, got, sizeof got);
    double d;
    if (cJSON_IsRaw(v) && v->valuestring) {
        /* our own encoder's exact form (see f64_item); parsed JSON has no raw items */
        char *end;
        d = strtod(v->valuestring, &end);
        if (*end)
            return proto_seterr(err, errlen, RKV_EFORMAT, "%s: field %s must be a number",
                                s->name, label);
    } else if (cJSON_IsNumber(v)) {
        d = v->valuedouble;
    } else {
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: field %s must be a number, got %s",
                            s->name, label, got);
    }
    if (!isfinite(d))
        return proto_seterr(err, errlen, RKV_ERANGE, "%s: field %s must be a finite number, got %s",
                            s->name, label, got);
    if ((f->fmin != 0 || f->fmax != 0) && (d < f->fmin || d > f->fmax))
        return proto_seterr(err, errlen, RKV_ERANGE,
                            "%s: field %s must be a number in [%g, %g], got %s", s->name, label,
                            f->fmin, f->fmax, got);
    *dst = d;
    return 0;
}

static void enum_choices(const char *const *names, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; names[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? "|" : "", names[i]);
}

/* one scalar of type base at dst */
static int read_scalar(const struct proto_schema *s, const struct proto_field *f,
                       enum proto_ftype base, const cJSON *v, void *dst, const char *label,
                       char *err, size_t errlen)
{
    char got[64];
    switch (base) {
    case PROTO_FT_U32:
    case PROTO_FT_U64:
    case PROTO_FT_I64: return read_int(s, f, base, v, dst, label, err, errlen);
    case PROTO_FT_F64: return read_f64(s, f, v, dst, label, err, errlen);
    case PROTO_FT_BOOL:
        if (!cJSON_IsBool(v)) {
            describe(v, got, sizeof got);
            return proto_seterr(err, errlen, RKV_EFORMAT,
                                "%s: field %s must be true or false, got %s", s->name, label, got);
        }
        *(bool *)dst = cJSON_IsTrue(v);
        return 0;
    case PROTO_FT_STR: {
        if (!cJSON_IsString(v)) {
            describe(v, got, sizeof got);
            return proto_seterr(err, errlen, RKV_EFORMAT, "%s: field %s must be a string, got %s",
                                s->name, label, got);
        }
        size_t n = strlen(v->valuestring);
        if (n >= f->cap)
            return proto_seterr(err, errlen, RKV_ETOOBIG,
                                "%s: field %s is %zu bytes long, the limit is %zu", s->name, label,
                                n, f->cap - 1);
        memcpy(dst, v->valuestring, n + 1);
        return 0;
    }
    case PROTO_FT_ENUM:
        for (int i = 0; cJSON_IsString(v) && f->names[i]; i++) {
            if (strcmp(v->valuestring, f->names[i]) == 0) {
                *(int *)dst = i;
                return 0;
            }
        }
        char choices[256];
        enum_choices(f->names, choices, sizeof choices);
        describe(v, got, sizeof got);
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: field %s must be one of %s, got %s",
                            s->name, label, choices, got);
    default:
        return proto_seterr(err, errlen, RKV_EINTERNAL, "%s: field %s has a bad descriptor",
                            s->name, label);
    }
}

/* *n = the length of v when it is an array of a length f allows, else RKV_EFORMAT /
 * RKV_ETOOBIG naming the field */
static int array_len(const struct proto_schema *s, const struct proto_field *f, const cJSON *v,
                     const char *label, size_t *n, char *err, size_t errlen)
{
    *n = 0;
    if (!cJSON_IsArray(v)) {
        char got[64];
        describe(v, got, sizeof got);
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: field %s must be an array, got %s",
                            s->name, label, got);
    }
    for (const cJSON *e = v->child; e; e = e->next)
        (*n)++;
    if (f->count_off == PROTO_FIXED && *n != f->cap)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: field %s must have exactly %zu entries, got %zu", s->name, label,
                            f->cap, *n);
    if (*n > f->cap)
        return proto_seterr(err, errlen, RKV_ETOOBIG,
                            "%s: field %s has %zu entries, the limit is %zu", s->name, label, *n,
                            f->cap);
    return 0;
}

/* scalars, or objects each read with the field's sub schema (errors name the element) */
static int read_array(const struct proto_schema *s, const struct proto_field *f, const cJSON *v,
                      void *msg, const char *label, char *err, size_t errlen)
{
    enum proto_ftype base = elem_type(f->type);
    size_t n;
    int rc = array_len(s, f, v, label, &n, err, errlen);
    if (rc < 0)
        return rc;
    uint8_t *dst = (uint8_t *)msg + f->off;
    size_t i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (f->type == PROTO_FT_OBJ_ARR) {
            char sub[256] = "";
            rc = proto_json_read(f->sub, e, dst + i * f->sub->size, sub, sizeof sub);
            if (rc < 0)
                return proto_seterr(err, errlen, rc, "%s: field %s[%zu]: %s", s->name, label, i,
                                    sub);
            continue;
        }
        char elabel[96];
        snprintf(elabel, sizeof elabel, "%s[%zu]", label, i);
        rc = read_scalar(s, f, base, e, dst + i * elem_size(base), elabel, err, errlen);
        if (rc < 0)
            return rc;
    }
    if (f->count_off != PROTO_FIXED)
        *(uint32_t *)((uint8_t *)msg + f->count_off) = (uint32_t)n;
    return 0;
}

static void safe_name(const char *in, char *out, size_t n)
{
    size_t i = 0;
    for (; in[i] && i + 4 < n; i++)
        out[i] = (in[i] >= 0x20 && in[i] < 0x7f && in[i] != '"') ? in[i] : '?';
    out[i] = 0;
}

static int unknown_field(const struct proto_schema *s, const char *key, char *err, size_t errlen)
{
    char name[48];
    safe_name(key, name, sizeof name);
    char known[512];
    size_t used = 0;
    known[0] = 0;
    for (size_t i = 0; i < s->n_fields && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                                 s->fields[i].name);
    return proto_seterr(err, errlen, RKV_EFORMAT, "%s: unknown field \"%s\" (%s%s)", s->name, name,
                        s->n_fields ? "fields: " : "this message has no fields", known);
}

int proto_json_read(const struct proto_schema *s, const cJSON *obj, void *msg, char *err,
                    size_t errlen)
{
    memset(msg, 0, s->size);
    if (s->n_fields > MAX_FIELDS)
        return proto_seterr(err, errlen, RKV_EINTERNAL, "%s: more than %d fields", s->name,
                            MAX_FIELDS);
    if (!cJSON_IsObject(obj)) {
        char got[64];
        describe(obj, got, sizeof got);
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: payload must be a JSON object, got %s",
                            s->name, got);
    }
    bool seen[MAX_FIELDS] = {0};
    for (const cJSON *c = obj->child; c; c = c->next) {
        size_t i = 0;
        while (i < s->n_fields && strcmp(s->fields[i].name, c->string) != 0)
            i++;
        if (i == s->n_fields)
            return unknown_field(s, c->string, err, errlen);
        const struct proto_field *f = &s->fields[i];
        char label[72];
        snprintf(label, sizeof label, "\"%s\"", f->name);
        if (seen[i])
            return proto_seterr(err, errlen, RKV_EFORMAT, "%s: field %s appears twice", s->name,
                                label);
        seen[i] = true;
        int arr = f->type == PROTO_FT_OBJ_ARR || elem_type(f->type) != f->type;
        int rc = arr ? read_array(s, f, c, msg, label, err, errlen)
                     : read_scalar(s, f, f->type, c, (uint8_t *)msg + f->off, label, err, errlen);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < s->n_fields; i++)
        if (s->fields[i].required && !seen[i])
            return proto_seterr(err, errlen, RKV_EFORMAT, "%s: missing required field \"%s\"",
                                s->name, s->fields[i].name);
    return 0;
}

/* a number, or from 10^15 on a decimal string: cJSON prints numbers with 15
 * significant digits, which would lose the last digits of larger integers
 * (the decoder takes 64-bit fields either way) */
static cJSON *int_item(bool neg, uint64_t mag)
{
    if (mag < 1000000000000000ull)
        return cJSON_CreateNumber(neg ? -(double)mag : (double)mag);
    char buf[32];
    snprintf(buf, sizeof buf, "%s%" PRIu64, neg ? "-" : "", mag);
    return cJSON_CreateString(buf);
}

static cJSON *scalar_item(const struct proto_field *f, enum proto_ftype base, const void *src)
{
    switch (base) {
    case PROTO_FT_U32: return cJSON_CreateNumber(*(const uint32_t *)src);
    case PROTO_FT_U64: return int_item(false, *(const uint64_t *)src);
    case PROTO_FT_I64: {
        int64_t v = *(const int64_t *)src;
        return int_item(v < 0, v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v);
    }
    case PROTO_FT_F64: {
        /* 17 significant digits: cJSON's own printing may keep only 15 */
        double d = *(const double *)src;
        char buf[40];
        snprintf(buf, sizeof buf, "%.17g", d);
        return isfinite(d) ? cJSON_CreateRaw(buf) : NULL;
    }
    case PROTO_FT_BOOL: return cJSON_CreateBool(*(const bool *)src);
    case PROTO_FT_STR: return memchr(src, 0, f->cap) ? cJSON_CreateString((const char *)src) : NULL;
    case PROTO_FT_ENUM: {
        int v = *(const int *)src;
        for (int i = 0; f->names[i]; i++)
            if (i == v)
                return cJSON_CreateString(f->names[i]);
        return NULL;
    }
    default: return NULL;
    }
}

/* an array of objects, each written with the field's sub schema (*out NULL on failure) */
static int obj_array_item(const struct proto_schema *s, const struct proto_field *f,
                          const void *msg, cJSON **out, char *err, size_t errlen)
{
    size_t n = *(const uint32_t *)((const uint8_t *)msg + f->count_off);
    *out = NULL;
    if (n > f->cap)
        return proto_seterr(err, errlen, RKV_EINVAL,
                            "%s: field \"%s\" has %zu entries, the limit is %zu", s->name, f->name,
                            n, f->cap);
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return RKV_ENOMEM;
    const uint8_t *src = (const uint8_t *)msg + f->off;
    for (size_t j = 0; j < n; j++) {
        cJSON *e = cJSON_CreateObject();
        int rc = e ? proto_json_write(f->sub, src + j * f->sub->size, e, err, errlen) : RKV_ENOMEM;
        if (rc == 0 && !cJSON_AddItemToArray(arr, e))
            rc = RKV_ENOMEM;
        if (rc) {
            cJSON_Delete(e);
            cJSON_Delete(arr);
            return rc;
        }
    }
    *out = arr;
    return 0;
}

int proto_json_write(const struct proto_schema *s, const void *msg, cJSON *obj, char *err,
                     size_t errlen)
{
    for (size_t i = 0; i < s->n_fields; i++) {
        const struct proto_field *f = &s->fields[i];
        const uint8_t *src = (const uint8_t *)msg + f->off;
        enum proto_ftype base = elem_type(f->type);
        cJSON *item;
        if (f->type == PROTO_FT_OBJ_ARR) {
            int rc = obj_array_item(s, f, msg, &item, err, errlen);
            if (rc)
                return rc;
        } else if (base != f->type) {
            size_t n = f->count_off == PROTO_FIXED
                           ? f->cap
                           : *(const uint32_t *)((const uint8_t *)msg + f->count_off);
            if (n > f->cap)
                return proto_seterr(err, errlen, RKV_EINVAL,
                                    "%s: field \"%s\" has %zu entries, the limit is %zu", s->name,
                                    f->name, n, f->cap);
            item = cJSON_CreateArray();
            for (size_t j = 0; item && j < n; j++) {
                cJSON *e = scalar_item(f, base, src + j * elem_size(base));
                if (!e || !cJSON_AddItemToArray(item, e)) {
                    cJSON_Delete(e);
                    cJSON_Delete(item);
                    item = NULL;
                }
            }
        } else {
            item = scalar_item(f, base, src);
        }
        if (!item)
            return proto_seterr(err, errlen, RKV_EINVAL,
                                "%s: field \"%s\" holds a value that cannot be sent (a NaN, an "
                                "unterminated string or an enum out of range)",
                                s->name, f->name);
        if (!cJSON_AddItemToObject(obj, f->name, item)) {
            cJSON_Delete(item);
            return RKV_ENOMEM;
        }
    }
    return 0;
}

int proto_json_encode_with(const struct proto_schema *s, const void *msg, char **out, size_t *len,
                           char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    cJSON *obj = cJSON_CreateObject();
    void *check = malloc(s->size);
    int rc = obj && check ? 0 : RKV_ENOMEM;
    if (rc == 0)
        rc = proto_json_write(s, msg, obj, err, errlen);
    /* read it back: what the peer would refuse is refused here, with the same text */
    if (rc == 0)
        rc = proto_json_read(s, obj, check, err, errlen);
    if (rc == 0) {
        *out = cJSON_PrintUnformatted(obj);
        rc = *out ? 0 : RKV_ENOMEM;
    }
    if (rc == 0)
        *len = strlen(*out);
    free(check);
    cJSON_Delete(obj);
    return rc;
}

int proto_json_decode_with(const struct proto_schema *s, const char *buf, size_t len, void *msg,
                           char *err, size_t errlen)
{
    memset(msg, 0, s->size);
    const char *end = NULL;
    cJSON *obj = len ? cJSON_ParseWithLengthOpts(buf, len, &end, 0) : NULL;
    if (!obj) {
        size_t at = end && end >= buf ? (size_t)(end - buf) : 0;
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: payload is not valid JSON (%zu bytes, error near byte %zu)",
                            s->name, len, at);
    }
    while (end < buf + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    int rc = end == buf + len ? 0
                              : proto_seterr(err, errlen, RKV_EFORMAT,
                                             "%s: %zu stray bytes after the JSON object", s->name,
                                             (size_t)(buf + len - end));
    char dup[160];
    if (rc == 0 && proto_json_dup_key(obj, dup, sizeof dup))
        rc = proto_seterr(err, errlen, RKV_EFORMAT, "%s: field \"%s\" appears twice", s->name,
                          dup);
    if (rc == 0)
        rc = proto_json_read(s, obj, msg, err, errlen);
    cJSON_Delete(obj);
    return rc;
}

static int cmp_name(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* the first name o holds twice, or NULL; a few keys by pairs, many sorted */
static const char *dup_name(const cJSON *o)
{
    size_t n = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        n++;
    if (n <= 16) {
        for (const cJSON *c = o->child; c; c = c->next)
            for (const cJSON *d = o->child; d != c; d = d->next)
                if (c->string && d->string && !strcmp(c->string, d->string))
                    return c->string;
        return NULL;
    }
    const char **names = malloc(n * sizeof *names);
    if (!names)
        return NULL;
    size_t k = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        if (c->string)
            names[k++] = c->string;
    qsort(names, k, sizeof *names, cmp_name);
    const char *dup = NULL;
    for (size_t i = 1; i < k && !dup; i++)
        if (!strcmp(names[i - 1], names[i]))
            dup = names[i];
    free(names);
    return dup;
}

static int dup_walk(const cJSON *v, char *path, size_t cap, size_t at)
{
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return 0;
    if (cJSON_IsObject(v)) {
        const char *d = dup_name(v);
        if (d) {
            snprintf(path + at, cap - at, "%s%.64s", at ? "." : "", d);
            return 1;
        }
    }
    size_t i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        int n = cJSON_IsObject(v) ? snprintf(path + at, cap - at, "%s%.64s", at ? "." : "",
                                             c->string ? c->string : "")
                                  : snprintf(path + at, cap - at, "[%zu]", i);
        size_t next = n > 0 && at + (size_t)n < cap ? at + (size_t)n : at;
        if (dup_walk(c, path, cap, next))
            return 1;
    }
    path[at] = '\0';
    return 0;
}

int proto_json_dup_key(const cJSON *v, char *path, size_t cap)
{
    if (!path || cap == 0)
        return 0;
    path[0] = '\0';
    return dup_walk(v, path, cap, 0);
}

static const struct proto_schema *schema_of(int type, char *err, size_t errlen)
{
    const struct proto_schema *s = proto_msg_schema(type);
    if (!s)
        proto_seterr(err, errlen, RKV_EINVAL, "message type %d (%s) is not a JSON message", type,
                     proto_msg_name(type));
    return s;
}

int proto_json_encode(int type, const void *msg, char **out, size_t *len, char *err, size_t errlen)
{
    const struct proto_schema *s = schema_of(type, err, errlen);
    if (!s) {
        *out = NULL;
        *len = 0;
        return RKV_EINVAL;
    }
    return proto_json_encode_with(s, msg, out, len, err, errlen);
}

int proto_json_decode(int type, const char *buf, size_t len, void *msg, char *err, size_t errlen)
{
    const struct proto_schema *s = schema_of(type, err, errlen);
    return s ? proto_json_decode_with(s, buf, len, msg, err, errlen) : RKV_EINVAL;
}
