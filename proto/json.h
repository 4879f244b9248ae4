/* json.h - one table-driven JSON codec for every control message (and any module's own). */
#ifndef RKV_PROTO_JSON_H
#define RKV_PROTO_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/*
 * A message is a plain C struct plus a table of field descriptors. The one
 * decoder checks every field against its descriptor: missing required field,
 * unknown or repeated field, wrong JSON type, number out of range, string too
 * long, unknown enum name -> an error naming message and field, e.g.
 *   hello: field "pid" must be an integer in [1, 4194303], got "abc"
 * An optional field that is absent reads as zero ("" / false / first enum).
 *
 * 64-bit integers above 2^53 do not survive a JSON number (a double), and
 * cJSON prints numbers with 15 significant digits, so the encoder writes
 * integers from 10^15 on as decimal strings (and doubles with 17 digits);
 * the decoder accepts u64/i64 fields as a number up to 2^53 or a decimal
 * string.
 *
 * Adding a message: a struct, a field table (PROTO_F_* below), a schema; for
 * a protocol message also a type in proto.h and a row in msg.c.
 */

enum proto_ftype {
    PROTO_FT_U32 = 1, /* uint32_t */
    PROTO_FT_U64,     /* uint64_t */
    PROTO_FT_I64,     /* int64_t */
    PROTO_FT_F64,     /* double, finite */
    PROTO_FT_BOOL,    /* bool */
    PROTO_FT_STR,     /* char[cap], NUL-terminated, at most cap-1 bytes */
    PROTO_FT_ENUM,    /* int, written as names[value] */
    PROTO_FT_U32_ARR, /* uint32_t[cap] + uint32_t count at count_off */
    PROTO_FT_U64_ARR, /* uint64_t[cap] + count */
    PROTO_FT_F64_ARR, /* double[cap] + count */
    PROTO_FT_OBJ_ARR, /* struct[cap] of the schema sub + count: an array of objects */
};

/* count_off for an array of exactly cap elements */
#define PROTO_FIXED ((size_t)-1)

struct proto_schema;

struct proto_field {
    const char *name;
    enum proto_ftype type;
    size_t off; /* offsetof the member */
    int required;
    /* integers and integer arrays: allowed range; both 0 = the C type's range */
    int64_t min;
    uint64_t max;
    /* f64 and f64 arrays: allowed range; both 0 = any finite value */
    double fmin, fmax;
    size_t cap;                     /* str: sizeof the array; arrays: max elements */
    size_t count_off;               /* arrays: offsetof the uint32_t count, or PROTO_FIXED */
    const char *const *names;       /* enum: NULL-terminated, value i is names[i] */
    const struct proto_schema *sub; /* object arrays: each element's schema (sizeof = stride) */
};

struct proto_schema {
    const char *name; /* used in error text: "hello" */
    size_t size;      /* sizeof the struct */
    const struct proto_field *fields;
    size_t n_fields;
};

/* field table helpers: PROTO_F_U32(struct proto_hello, pid, 1, 1, 4194303) */
#define PROTO_F_INT_(ft, st, f, req, lo, hi)                                                       \
    {                                                                                              \
        .name = #f, .type = (ft), .off = offsetof(st, f), .required = (req), .min = (lo),          \
        .max = (hi)                                                                                \
    }
#define PROTO_F_U32(st, f, req, lo, hi) PROTO_F_INT_(PROTO_FT_U32, st, f, req, lo, hi)
#define PROTO_F_U64(st, f, req, lo, hi) PROTO_F_INT_(PROTO_FT_U64, st, f, req, lo, hi)
#define PROTO_F_I64(st, f, req, lo, hi) PROTO_F_INT_(PROTO_FT_I64, st, f, req, lo, hi)
#define PROTO_F_F64(st, f, req, lo, hi)                                                            \
    {                                                                                              \
        .name = #f, .type = PROTO_FT_F64, .off = offsetof(st, f), .required = (req), .fmin = (lo), \
        .fmax = (hi)                                                                               \
    }
#define PROTO_F_BOOL(st, f, req)                                                                   \
    {                                                                                              \
        .name = #f, .type = PROTO_FT_BOOL, .off = offsetof(st, f), .required = (req)               \
    }
#define PROTO_F_STR(st, f, req)                                                                    \
    {                                                                                              \
        .name = #f, .type = PROTO_FT_STR, .off = offsetof(st, f), .required = (req),               \
        .cap = sizeof(((st *)0)->f)                                                                \
    }
#define PROTO_F_ENUM(st, f, req, tbl)                                                              \
    {                                                                                              \
        .name = #f, .type = PROTO_FT_ENUM, .off = offsetof(st, f), .required = (req),              \
        .names = (tbl)                                                                             \
    }
/* arrays: cnt is the count member, or omit with the _FIXED forms */
#define PROTO_F_ARR_(ft, st, f, cnt_off, req, lo, hi)                                              \
    {                                                                                              \
        .name = #f, .type = (ft), .off = offsetof(st, f), .required = (req), .min = (lo),          \
        .max = (hi), .fmin = (double)(lo), .fmax = (double)(hi),                                   \
        .cap = sizeof(((st *)0)->f) / sizeof(((st *)0)->f[0]), .count_off = (cnt_off)              \
    }
#define PROTO_F_U32_ARR(st, f, cnt, req, lo, hi)                                                   \
    PROTO_F_ARR_(PROTO_FT_U32_ARR, st, f, offsetof(st, cnt), req, lo, hi)
#define PROTO_F_U64_ARR(st, f, cnt, req, lo, hi)                                                   \
    PROTO_F_ARR_(PROTO_FT_U64_ARR, st, f, offsetof(st, cnt), req, lo, hi)
#define PROTO_F_F64_ARR(st, f, cnt, req, lo, hi)                                                   \
    PROTO_F_ARR_(PROTO_FT_F64_ARR, st, f, offsetof(st, cnt), req, lo, hi)
#define PROTO_F_U64_FIXED(st, f, req, lo, hi)                                                      \
    PROTO_F_ARR_(PROTO_FT_U64_ARR, st, f, PROTO_FIXED, req, lo, hi)
/* an array of objects: f is struct x[cap], cnt its uint32_t count, schema x's schema */
#define PROTO_F_OBJ_ARR(st, f, cnt, req, schema)                                                   \
    {                                                                                              \
        .name = #f, .type = PROTO_FT_OBJ_ARR, .off = offsetof(st, f), .required = (req),           \
        .cap = sizeof(((st *)0)->f) / sizeof(((st *)0)->f[0]), .count_off = offsetof(st, cnt),     \
        .sub = (schema)                                                                            \
    }

#define PROTO_SCHEMA(nm, st, tbl)                                                                  \
    {                                                                                              \
        .name = (nm), .size = sizeof(st), .fields = (tbl),                                         \
        .n_fields = sizeof(tbl) / sizeof((tbl)[0])                                                 \
    }

/* --- generic: any schema ---------------------------------------------------- */

/* fills msg (zeroed first) from a cJSON object; 0, or RKV_EFORMAT (shape,
 * type, unknown/missing field) / RKV_ERANGE (value) / RKV_ETOOBIG (string,
 * array) with text in err */
int proto_json_read(const struct proto_schema *s, const cJSON *obj, void *msg, char *err,
                    size_t errlen);
/* adds msg's fields to obj; RKV_EINVAL for a value the decoder would refuse
 * (text in err), RKV_ENOMEM */
int proto_json_write(const struct proto_schema *s, const void *msg, cJSON *obj, char *err,
                     size_t errlen);
/* text <-> struct; encode returns malloc'd compact JSON (*out, free()),
 * checked against the schema first so a peer never refuses what we send */
int proto_json_encode_with(const struct proto_schema *s, const void *msg, char **out, size_t *len,
                           char *err, size_t errlen);
int proto_json_decode_with(const struct proto_schema *s, const char *buf, size_t len, void *msg,
                           char *err, size_t errlen);

/* --- protocol messages: the schema comes from the type (proto/msg.h) ---------- */

/* RKV_EINVAL for a type that is not a control message */
/* 1 when an object anywhere in v names a key twice (JSON leaves that undefined: cJSON keeps
 * the first, Python and JavaScript the last, so a gateway and rkv could read one request
 * two ways), with its path ("messages[2].role") in path; else 0 */
int proto_json_dup_key(const cJSON *v, char *path, size_t cap);

int proto_json_encode(int type, const void *msg, char **out, size_t *len, char *err, size_t errlen);
int proto_json_decode(int type, const char *buf, size_t len, void *msg, char *err, size_t errlen);

#endif
