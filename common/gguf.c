/* gguf.c - GGUF v2/v3 reader: parse and validate a mapped file; typed metadata, tensors. */
#include "common/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

#define GGUF_MAGIC             "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
/* arrays of arrays are legal GGUF; deeper nesting than this is hostile */
#define GGUF_MAX_ARRAY_DEPTH 8

struct gguf_kv {
    struct gguf_str key;
    uint32_t type;      /* enum gguf_value_type */
    uint32_t elem_type; /* arrays only */
    uint64_t n;         /* arrays only: element count */
    const uint8_t *val; /* scalar value, string length field, or first array element */
    uint64_t *str_off;  /* string arrays: offset of element i's length field from val */
};

/* open-addressing hash of (ptr, len) names -> index + 1 (0 = empty slot) */
struct gguf_index {
    uint64_t *slots;
    uint64_t mask;
};

struct gguf_ctx {
    const uint8_t *base;
    uint64_t size;
    int mapped; /* base came from mmap and is unmapped on close */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;

    struct gguf_kv *kv; /* (n_kv) once parsed */
    uint64_t n_kv;
    uint64_t kv_cap;
    struct gguf_index kv_index;

    struct gguf_tensor *tensors; /* (n_tensors) once parsed */
    uint64_t n_tensors;
    uint64_t tensors_cap, tnames_cap;
    struct gguf_str *tnames; /* (n_tensors) each name inside the buffer */
    char *names;             /* every tensor name, NUL-terminated, back to back */
    struct gguf_index tensor_index;
};

/* parse state: a cursor over the buffer plus what to say on error */
struct gguf_parser {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *label; /* file name for messages */
    char where[160];   /* "key 3 \"llama.block_count\"" */
    char *errbuf;
    size_t errlen;
};

__attribute__((format(printf, 2, 3))) static int perr(struct gguf_parser *p, const char *fmt, ...)
{
    if (!p->errbuf || p->errlen == 0)
        return RKV_EFORMAT;
    int n;
    if (p->where[0])
        n = snprintf(p->errbuf, p->errlen, "%s: %s: ", p->label, p->where);
    else
        n = snprintf(p->errbuf, p->errlen, "%s: ", p->label);
    if (n < 0 || (size_t)n >= p->errlen)
        return RKV_EFORMAT;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->errbuf + n, p->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return RKV_EFORMAT;
}

static int set_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int set_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
{
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* --- primitive reads (little-endian hosts only, like ggml) --------------- */

static uint64_t remaining(const struct gguf_parser *p)
{
    return p->size - p->pos;
}

static int need(struct gguf_parser *p, uint64_t n, const char *what)
{
    if (n > remaining(p))
        return perr(p,
                    "%s at byte %" PRIu64 " needs %" PRIu64
                    " bytes but the file ends at byte %" PRIu64 " (truncated file?)",
                    what, p->pos, n, p->size);
    return 0;
}

/* n bytes at the cursor into v (u32/u64 fields) */
static int rd_raw(struct gguf_parser *p, void *v, uint64_t n, const char *what)
{
    int rc = need(p, n, what);
    if (rc)
        return rc;
    memcpy(v, p->base + p->pos, n);
    p->pos += n;
    return 0;
}

static int rd_u32(struct gguf_parser *p, uint32_t *v, const char *what)
{
    return rd_raw(p, v, 4, what);
}

static int rd_u64(struct gguf_parser *p, uint64_t *v, const char *what)
{
    return rd_raw(p, v, 8, what);
}

static int rd_str(struct gguf_parser *p, struct gguf_str *s, const char *what)
{
    uint64_t at = p->pos;
    uint64_t len;
    int rc = rd_u64(p, &len, what);
    if (rc)
        return rc;
    if (len > remaining(p))
        return perr(p,
                    "%s at byte %" PRIu64 " has length %" PRIu64 " but only %" PRIu64
                    " bytes remain in the file (corrupt or truncated file?)",
                    what, at, len, remaining(p));
    s->ptr = (const char *)p->base + p->pos;
    s->len = len;
    p->pos += len;
    return 0;
}

/* --- value types ----------------------------------------------------------- */

static const char *val_type_name(uint32_t t)
{
    static const char *const names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                        "int32",  "float32", "bool",   "string", "array",
                                        "uint64", "int64",   "float64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* fixed size of a scalar value type; 0 for string/array/unknown */
static uint64_t val_size(uint32_t t)
{
    switch (t) {
    case GGUF_VAL_UINT8:
    case GGUF_VAL_INT8:
    case GGUF_VAL_BOOL: return 1;
    case GGUF_VAL_UINT16:
    case GGUF_VAL_INT16: return 2;
    case GGUF_VAL_UINT32:
    case GGUF_VAL_INT32:
    case GGUF_VAL_FLOAT32: return 4;
    case GGUF_VAL_UINT64:
    case GGUF_VAL_INT64:
    case GGUF_VAL_FLOAT64: return 8;
    default: return 0;
    }
}

/* fewest bytes one value of type t can occupy (bounds element counts) */
static uint64_t val_min_size(uint32_t t)
{
    if (t == GGUF_VAL_STRING)
        return 8;
    if (t == GGUF_VAL_ARRAY)
        return 12;
    return val_size(t);
}

static int is_int_type(uint32_t t)
{
    return t <= GGUF_VAL_INT32 || t == GGUF_VAL_UINT64 || t == GGUF_VAL_INT64;
}

static int is_float_type(uint32_t t)
{
    return t == GGUF_VAL_FLOAT32 || t == GGUF_VAL_FLOAT64;
}

/* a numeric value of type t at v, as signed/unsigned/double */
struct num {
    int is_float;
    int neg; /* integer < 0: value in i, else in u */
    uint64_t u;
    int64_t i;
    double f;
};

static int read_num(uint32_t t, const uint8_t *v, struct num *n)
{
    memset(n, 0, sizeof *n);
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } x;
    uint64_t sz = val_size(t);
    if (sz == 0)
        return RKV_EFORMAT;
    memcpy(&x, v, sz);
    switch (t) {
    case GGUF_VAL_UINT8: n->u = x.u8; break;
    case GGUF_VAL_BOOL: n->u = x.u8 != 0; break;
    case GGUF_VAL_UINT16: n->u = x.u16; break;
    case GGUF_VAL_UINT32: n->u = x.u32; break;
    case GGUF_VAL_UINT64: n->u = x.u64; break;
    case GGUF_VAL_INT8: n->i = x.i8; break;
    case GGUF_VAL_INT16: n->i = x.i16; break;
    case GGUF_VAL_INT32: n->i = x.i32; break;
    case GGUF_VAL_INT64: n->i = x.i64; break;
    case GGUF_VAL_FLOAT32: n->f = x.f32, n->is_float = 1; break;
    case GGUF_VAL_FLOAT64: n->f = x.f64, n->is_float = 1; break;
    default: return RKV_EFORMAT;
    }
    if (t == GGUF_VAL_INT8 || t == GGUF_VAL_INT16 || t == GGUF_VAL_INT32 || t == GGUF_VAL_INT64) {
        if (n->i < 0)
            n->neg = 1;
        else
            n->u = (uint64_t)n->i;
    }
    return 0;
}

/* skip over one value of type t at the cursor (nested arrays recurse) */
static int skip_value(struct gguf_parser *p, uint32_t t, int depth);

static int skip_array(struct gguf_parser *p, int depth, uint32_t *elem_type, uint64_t *n)
{
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        return perr(p, "arrays nested deeper than %d at byte %" PRIu64, GGUF_MAX_ARRAY_DEPTH,
                    p->pos);
    uint64_t at = p->pos;
    int rc = rd_u32(p, elem_type, "array element type");
    if (rc)
        return rc;
    rc = rd_u64(p, n, "array length");
    if (rc)
        return rc;
    uint64_t min = val_min_size(*elem_type);
    if (min == 0)
        return perr(p, "array at byte %" PRIu64 " has unknown element type %" PRIu32, at,
                    *elem_type);
    if (*n > remaining(p) / min)
        return perr(p,
                    "array at byte %" PRIu64 " claims %" PRIu64 " %s elements but only %" PRIu64
                    " bytes remain in the file (corrupt or truncated file?)",
                    at, *n, val_type_name(*elem_type), remaining(p));
    uint64_t fixed = val_size(*elem_type);
    if (fixed) {
        p->pos += *n * fixed; /* no overflow: n * fixed <= remaining */
        return 0;
    }
    for (uint64_t i = 0; i < *n; i++) {
        rc = skip_value(p, *elem_type, depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

static int skip_value(struct gguf_parser *p, uint32_t t, int depth)
{
    if (t == GGUF_VAL_STRING) {
        struct gguf_str s;
        return rd_str(p, &s, "string");
    }
    if (t == GGUF_VAL_ARRAY) {
        uint32_t et;
        uint64_t n;
        return skip_array(p, depth, &et, &n);
    }
    uint64_t sz = val_size(t);
    if (sz == 0)
        return perr(p, "value at byte %" PRIu64 " has unknown type %" PRIu32, p->pos, t);
    int rc = need(p, sz, val_type_name(t));
    if (!rc)
        p->pos += sz;
    return rc;
}

/* --- name index ------------------------------------------------------------ */

static uint64_t name_hash(const char *s, uint64_t len)
{
    uint64_t h = 1469598103934665603ull; /* fnv-1a */
    for (uint64_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* room for entry i of an array that grows as the file proves its counts
 * (a hostile count must not reserve memory before the bytes are there) */
static int grow(void **arr, uint64_t *cap, size_t entry, uint64_t i)
{
    if (i < *cap)
        return 0;
    uint64_t ncap = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, ncap * entry);
    if (!p)
        return RKV_ENOMEM;
    memset((char *)p + *cap * entry, 0, (ncap - *cap) * entry);
    *arr = p;
    *cap = ncap;
    return 0;
}

typedef struct gguf_str (*name_at_fn)(const struct gguf_ctx *ctx, uint64_t i);

/* slot holding name, or the empty slot where it would go */
static uint64_t *index_slot(const struct gguf_ctx *ctx, const struct gguf_index *ix,
                            name_at_fn name_at, const char *s, uint64_t len)
{
    uint64_t h = name_hash(s, len) & ix->mask;
    for (;;) {
        uint64_t *slot = &ix->slots[h];
        if (*slot == 0)
            return slot;
        struct gguf_str other = name_at(ctx, *slot - 1);
        if (other.len == len && memcmp(other.ptr, s, len) == 0)
            return slot;
        h = (h + 1) & ix->mask;
    }
}

/* index ready for its n-th name (n - 1 are in): rebuilt twice as large when
 * it would pass half full */
static int index_reserve(const struct gguf_ctx *ctx, struct gguf_index *ix, name_at_fn name_at,
                         uint64_t n)
{
    if (ix->slots && n * 2 <= ix->mask + 1)
        return 0;
    uint64_t cap = ix->slots ? (ix->mask + 1) * 2 : 64;
    struct gguf_index nx = {calloc(cap, sizeof *nx.slots), cap - 1};
    if (!nx.slots)
        return RKV_ENOMEM;
    for (uint64_t i = 0; i + 1 < n; i++) {
        struct gguf_str s = name_at(ctx, i);
        *index_slot(ctx, &nx, name_at, s.ptr, s.len) = i + 1;
    }
    free(ix->slots);
    *ix = nx;
    return 0;
}

static struct gguf_str kv_name_at(const struct gguf_ctx *ctx, uint64_t i)
{
    return ctx->kv[i].key;
}

static struct gguf_str tensor_name_at(const struct gguf_ctx *ctx, uint64_t i)
{
    return ctx->tnames[i];
}

/* --- ggml tensor types ------------------------------------------------------- */

struct type_traits {
    const char *name;
    uint32_t block; /* elements per block */
    uint32_t size;  /* bytes per block */
};

/* ggml's type table (ids that ggml removed stay empty) */
static const struct type_traits type_table[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 40},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},    [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},
};
#define N_TYPES (sizeof type_table / sizeof type_table[0])

static const struct type_traits *type_traits(uint32_t type)
{
    if (type >= N_TYPES || !type_table[type].name)
        return NULL;
    return &type_table[type];
}

const char *gguf_type_name(uint32_t type)
{
    const struct type_traits *tt = type_traits(type);
    if (tt)
        return tt->name;
    static _Thread_local char buf[24];
    snprintf(buf, sizeof buf, "type %" PRIu32, type);
    return buf;
}

uint64_t gguf_type_size(uint32_t type, uint64_t n)
{
    const struct type_traits *tt = type_traits(type);
    if (!tt || n % tt->block)
        return 0;
    uint64_t blocks = n / tt->block;
    if (blocks > UINT64_MAX / tt->size)
        return 0;
    return blocks * tt->size;
}

/* --- parsing --------------------------------------------------------------------- */

static void where_kv(struct gguf_parser *p, uint64_t i, const struct gguf_str *key)
{
    if (key)
        snprintf(p->where, sizeof p->where, "key %" PRIu64 " \"%.*s\"", i,
                 (int)(key->len > 64 ? 64 : key->len), key->ptr);
    else
        snprintf(p->where, sizeof p->where, "key %" PRIu64, i);
}

static void where_tensor(struct gguf_parser *p, uint64_t i, const struct gguf_str *name)
{
    if (name)
        snprintf(p->where, sizeof p->where, "tensor %" PRIu64 " \"%.*s\"", i,
                 (int)(name->len > 64 ? 64 : name->len), name->ptr);
    else
        snprintf(p->where, sizeof p->where, "tensor %" PRIu64, i);
}

static int parse_header(struct gguf_parser *p, struct gguf_ctx *ctx)
{
    if (p->size < 4 || memcmp(p->base, GGUF_MAGIC, 4) != 0)
        return perr(p, "not a GGUF file (the first 4 bytes are not \"GGUF\")");
    p->pos = 4;
    int rc = rd_u32(p, &ctx->version, "version");
    if (rc)
        return rc;
    if (ctx->version == 1)
        return perr(p, "GGUF version 1 is not supported (a pre-2023-09 file); re-convert the "
                       "model with a current llama.cpp convert script");
    if (ctx->version > 0xffff && (ctx->version & 0xffff) == 0)
        return perr(p,
                    "GGUF version field 0x%08" PRIx32
                    " looks big-endian; only little-endian GGUF files are supported",
                    ctx->version);
    if (ctx->version != 2 && ctx->version != 3)
        return perr(p, "GGUF version %" PRIu32 " is not supported (rkv reads versions 2 and 3)",
                    ctx->version);
    rc = rd_u64(p, &ctx->n_tensors, "tensor count");
    if (rc)
        return rc;
    rc = rd_u64(p, &ctx->n_kv, "metadata key count");
    if (rc)
        return rc;
    /* smallest kv: 8-byte key length, 4-byte type, 1-byte value */
    if (ctx->n_kv > remaining(p) / 13)
        return perr(p,
                    "metadata key count %" PRIu64 " at byte 16 cannot fit in the %" PRIu64
                    " bytes that remain (corrupt file?)",
                    ctx->n_kv, remaining(p));
    /* smallest tensor info: name length, n_dims, type, offset */
    if (ctx->n_tensors > remaining(p) / 24)
        return perr(p,
                    "tensor count %" PRIu64 " at byte 8 cannot fit in the %" PRIu64
                    " bytes that remain (corrupt file?)",
                    ctx->n_tensors, remaining(p));
    return 0;
}

static int parse_kv(struct gguf_parser *p, struct gguf_ctx *ctx)
{
    int rc;
    for (uint64_t i = 0; i < ctx->n_kv; i++) {
        if ((rc = grow((void **)&ctx->kv, &ctx->kv_cap, sizeof *ctx->kv, i)) ||
            (rc = index_reserve(ctx, &ctx->kv_index, kv_name_at, i + 1)))
            return rc;
        struct gguf_kv *kv = &ctx->kv[i];
        where_kv(p, i, NULL);
        rc = rd_str(p, &kv->key, "key name");
        if (rc)
            return rc;
        where_kv(p, i, &kv->key);
        uint64_t *slot = index_slot(ctx, &ctx->kv_index, kv_name_at, kv->key.ptr, kv->key.len);
        if (*slot)
            return perr(p, "duplicate key (also key %" PRIu64 ")", *slot - 1);
        uint64_t at = p->pos;
        rc = rd_u32(p, &kv->type, "value type");
        if (rc)
            return rc;
        if (kv->type > GGUF_VAL_FLOAT64)
            return perr(p, "unknown value type %" PRIu32 " at byte %" PRIu64, kv->type, at);
        kv->val = p->base + p->pos;
        if (kv->type == GGUF_VAL_ARRAY) {
            rc = skip_array(p, 1, &kv->elem_type, &kv->n);
            if (rc)
                return rc;
            kv->val += 12; /* past element type and count */
            if (kv->elem_type == GGUF_VAL_STRING) {
                /* index every string so element access is O(1) */
                kv->str_off = malloc((kv->n ? kv->n : 1) * sizeof *kv->str_off);
                if (!kv->str_off)
                    return RKV_ENOMEM;
                uint64_t off = 0;
                for (uint64_t j = 0; j < kv->n; j++) {
                    uint64_t len;
                    kv->str_off[j] = off;
                    memcpy(&len, kv->val + off, 8); /* validated by skip_array */
                    off += 8 + len;
                }
            }
        } else {
            rc = skip_value(p, kv->type, 1);
            if (rc)
                return rc;
        }
        *slot = i + 1;
    }
    p->where[0] = 0;
    return 0;
}

static int parse_alignment(struct gguf_parser *p, struct gguf_ctx *ctx)
{
    ctx->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(ctx, "general.alignment");
    if (i < 0)
        return 0;
    where_kv(p, (uint64_t)i, &ctx->kv[i].key);
    if (!is_int_type(ctx->kv[i].type))
        return perr(p, "must be an unsigned integer (it is a %s)", val_type_name(ctx->kv[i].type));
    struct num n;
    read_num(ctx->kv[i].type, ctx->kv[i].val, &n);
    uint64_t a = n.neg ? 0 : n.u;
    ctx->alignment = a;
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
        return perr(p, "value %" PRIu64 " must be a power of two (32 is the default)", a);
    p->where[0] = 0;
    return 0;
}

static int parse_tensor_infos(struct gguf_parser *p, struct gguf_ctx *ctx)
{
    int rc;
    uint64_t names_len = 0;
    for (uint64_t i = 0; i < ctx->n_tensors; i++) {
        if ((rc = grow((void **)&ctx->tensors, &ctx->tensors_cap, sizeof *ctx->tensors, i)) ||
            (rc = grow((void **)&ctx->tnames, &ctx->tnames_cap, sizeof *ctx->tnames, i)) ||
            (rc = index_reserve(ctx, &ctx->tensor_index, tensor_name_at, i + 1)))
            return rc;
        struct gguf_tensor *t = &ctx->tensors[i];
        where_tensor(p, i, NULL);
        struct gguf_str name;
        rc = rd_str(p, &name, "tensor name");
        if (rc)
            return rc;
        if (memchr(name.ptr, 0, name.len))
            return perr(p, "tensor name contains a NUL byte");
        ctx->tnames[i] = name;
        names_len += name.len + 1; /* no overflow: each len fits in the file */
        where_tensor(p, i, &name);
        uint64_t *slot = index_slot(ctx, &ctx->tensor_index, tensor_name_at, name.ptr, name.len);
        if (*slot)
            return perr(p, "duplicate tensor name (also tensor %" PRIu64 ")", *slot - 1);
        *slot = i + 1;

        uint64_t at = p->pos;
        rc = rd_u32(p, &t->n_dims, "n_dims");
        if (rc)
            return rc;
        if (t->n_dims > GGUF_MAX_DIMS)
            return perr(p, "n_dims %" PRIu32 " at byte %" PRIu64 " exceeds the maximum of %d",
                        t->n_dims, at, GGUF_MAX_DIMS);
        uint64_t n_el = 1;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            at = p->pos;
            rc = rd_u64(p, &t->ne[d], "dimension");
            if (rc)
                return rc;
            /* ggml keeps ne as int64 */
            if (t->ne[d] > INT64_MAX)
                return perr(p,
                            "dimension %" PRIu32 " at byte %" PRIu64 " is %" PRIu64 ", too large",
                            d, at, t->ne[d]);
            if (t->ne[d] != 0 && n_el > (uint64_t)INT64_MAX / t->ne[d])
                return perr(p,
                            "element count overflows at dimension %" PRIu32 " (byte %" PRIu64 ")",
                            d, at);
            n_el *= t->ne[d];
        }
        t->n_elements = n_el;
        at = p->pos;
        rc = rd_u32(p, &t->type, "tensor type");
        if (rc)
            return rc;
        const struct type_traits *tt = type_traits(t->type);
        if (tt && t->ne[0] % tt->block)
            return perr(p, "ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32,
                        t->ne[0], tt->name, tt->block);
        /* unknown types keep n_bytes 0: the reader passes them on, the engine refuses */
        t->n_bytes = tt ? gguf_type_size(t->type, n_el) : 0;
        if (tt && n_el && t->n_bytes == 0)
            return perr(p, "byte size of %" PRIu64 " %s elements overflows", n_el, tt->name);
        at = p->pos;
        /* relative to the data section until the second pass below */
        rc = rd_u64(p, &t->offset, "data offset");
        if (rc)
            return rc;
        if (t->offset % ctx->alignment)
            return perr(p,
                        "data offset %" PRIu64 " (at byte %" PRIu64
                        ") is not a multiple of the alignment %" PRIu64,
                        t->offset, at, ctx->alignment);
    }
    p->where[0] = 0;

    /* NUL-terminated copies, sized now that every name is known */
    ctx->names = malloc(names_len ? names_len : 1);
    if (!ctx->names)
        return RKV_ENOMEM;
    char *copy = ctx->names;
    for (uint64_t i = 0; i < ctx->n_tensors; i++) {
        memcpy(copy, ctx->tnames[i].ptr, ctx->tnames[i].len);
        copy[ctx->tnames[i].len] = 0;
        ctx->tensors[i].name = copy;
        copy += ctx->tnames[i].len + 1;
    }

    /* data section starts at the next aligned byte */
    uint64_t a = ctx->alignment;
    uint64_t end = p->pos;
    ctx->data_offset = end + (a - end % a) % a; /* end < 2^63 and a <= 2^30: no overflow */
    for (uint64_t i = 0; i < ctx->n_tensors; i++) {
        struct gguf_tensor *t = &ctx->tensors[i];
        where_tensor(p, i, &ctx->tnames[i]);
        uint64_t rel = t->offset;
        if (rel > p->size || ctx->data_offset > p->size - rel)
            return perr(p,
                        "data starts at byte %" PRIu64 "+%" PRIu64 " but the file has %" PRIu64
                        " bytes (truncated download?)",
                        ctx->data_offset, rel, p->size);
        uint64_t start = ctx->data_offset + rel;
        if (t->n_bytes > p->size - start) {
            if (t->n_bytes > UINT64_MAX - start)
                return perr(p, "data size %" PRIu64 " bytes overflows", t->n_bytes);
            return perr(p,
                        "data extends to byte %" PRIu64 " but the file has %" PRIu64
                        " bytes (truncated download?)",
                        start + t->n_bytes, p->size);
        }
        t->offset = start;
        t->data = p->base + start;
    }
    p->where[0] = 0;
    return 0;
}

static void ctx_free(struct gguf_ctx *ctx)
{
    if (!ctx)
        return;
    for (uint64_t i = 0; i < ctx->kv_cap; i++) /* entries past the parsed ones are zero */
        free(ctx->kv[i].str_off);
    free(ctx->kv);
    free(ctx->kv_index.slots);
    free(ctx->tensors);
    free(ctx->names);
    free(ctx->tnames);
    free(ctx->tensor_index.slots);
    if (ctx->mapped && ctx->base)
        munmap((void *)ctx->base, ctx->size);
    free(ctx);
}

static int parse(struct gguf_ctx *ctx, const char *label, char *errbuf, size_t errlen)
{
    struct gguf_parser p = {
        .base = ctx->base, .size = ctx->size, .label = label, .errbuf = errbuf, .errlen = errlen};
    if (errbuf && errlen)
        errbuf[0] = 0;
    int rc = parse_header(&p, ctx);
    if (!rc)
        rc = parse_kv(&p, ctx);
    if (!rc)
        rc = parse_alignment(&p, ctx);
    if (!rc)
        rc = parse_tensor_infos(&p, ctx);
    if (rc == RKV_ENOMEM)
        set_err(errbuf, errlen, rc, "%s: out of memory while reading the GGUF header", label);
    return rc;
}

int gguf_open_mem(const void *buf, size_t len, struct gguf_ctx **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    struct gguf_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return set_err(errbuf, errlen, RKV_ENOMEM, "(memory): out of memory");
    ctx->base = buf;
    ctx->size = len;
    int rc = parse(ctx, "(memory)", errbuf, errlen);
    if (rc) {
        ctx_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

int gguf_open(const char *path, struct gguf_ctx **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return set_err(errbuf, errlen, -e, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return set_err(errbuf, errlen, -e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return set_err(errbuf, errlen, RKV_EINVAL, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return set_err(errbuf, errlen, RKV_EFORMAT,
                       "%s: file has %lld bytes, too small for a GGUF header (24 bytes)", path,
                       (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return set_err(errbuf, errlen, -e, "%s: cannot mmap %lld bytes: %s", path,
                       (long long)st.st_size, strerror(e));
    struct gguf_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        munmap(map, (size_t)st.st_size);
        return set_err(errbuf, errlen, RKV_ENOMEM, "%s: out of memory", path);
    }
    ctx->base = map;
    ctx->size = (uint64_t)st.st_size;
    ctx->mapped = 1;
    int rc = parse(ctx, path, errbuf, errlen);
    if (rc) {
        ctx_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

void gguf_close(struct gguf_ctx *ctx)
{
    ctx_free(ctx);
}

uint32_t gguf_version(const struct gguf_ctx *ctx)
{
    return ctx->version;
}

uint64_t gguf_alignment(const struct gguf_ctx *ctx)
{
    return ctx->alignment;
}

uint64_t gguf_data_offset(const struct gguf_ctx *ctx)
{
    return ctx->data_offset;
}

uint64_t gguf_file_size(const struct gguf_ctx *ctx)
{
    return ctx->size;
}

/* --- metadata ------------------------------------------------------------------- */

int64_t gguf_find_key(const struct gguf_ctx *ctx, const char *key)
{
    if (!ctx->kv_index.slots)
        return -1;
    uint64_t *slot = index_slot(ctx, &ctx->kv_index, kv_name_at, key, strlen(key));
    return *slot ? (int64_t)(*slot - 1) : -1;
}

uint64_t gguf_n_kv(const struct gguf_ctx *ctx)
{
    return ctx->n_kv;
}

struct gguf_str gguf_key_name(const struct gguf_ctx *ctx, uint64_t i)
{
    if (i >= ctx->n_kv) {
        struct gguf_str none = {NULL, 0};
        return none;
    }
    return ctx->kv[i].key;
}

enum gguf_value_type gguf_kv_type(const struct gguf_ctx *ctx, uint64_t i)
{
    if (i >= ctx->n_kv)
        return (enum gguf_value_type) - 1;
    return (enum gguf_value_type)ctx->kv[i].type;
}

static const struct gguf_kv *find_kv(const struct gguf_ctx *ctx, const char *key)
{
    int64_t i = gguf_find_key(ctx, key);
    return i < 0 ? NULL : &ctx->kv[i];
}

static int num_to_u64(const struct num *n, uint64_t max, uint64_t *out)
{
    if (n->is_float)
        return RKV_EFORMAT;
    if (n->neg || n->u > max)
        return RKV_ERANGE;
    *out = n->u;
    return 0;
}

static int num_to_i64(const struct num *n, int64_t *out)
{
    if (n->is_float) {
        /* 2^63 is the first double past INT64_MAX */
        if (!(n->f >= -9223372036854775808.0 && n->f < 9223372036854775808.0))
            return RKV_ERANGE;
        *out = (int64_t)n->f;
        return 0;
    }
    if (n->neg) {
        *out = n->i;
        return 0;
    }
    if (n->u > (uint64_t)INT64_MAX)
        return RKV_ERANGE;
    *out = (int64_t)n->u;
    return 0;
}

static float num_to_f32(const struct num *n)
{
    if (n->is_float) /* out-of-range doubles saturate (the cast would be undefined) */
        return n->f > FLT_MAX ? INFINITY : n->f < -FLT_MAX ? -INFINITY : (float)n->f;
    return n->neg ? (float)n->i : (float)n->u;
}

static int get_int(const struct gguf_ctx *ctx, const char *key, uint64_t max, uint64_t *out)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (!is_int_type(kv->type))
        return RKV_EFORMAT;
    struct num n;
    read_num(kv->type, kv->val, &n);
    return num_to_u64(&n, max, out);
}

int gguf_get_u32(const struct gguf_ctx *ctx, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = get_int(ctx, key, UINT32_MAX, &v);
    if (!rc)
        *out = (uint32_t)v;
    return rc;
}

int gguf_get_u64(const struct gguf_ctx *ctx, const char *key, uint64_t *out)
{
    return get_int(ctx, key, UINT64_MAX, out);
}

int gguf_get_i64(const struct gguf_ctx *ctx, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (!is_int_type(kv->type))
        return RKV_EFORMAT;
    struct num n;
    read_num(kv->type, kv->val, &n);
    return num_to_i64(&n, out);
}

static int get_num(const struct gguf_ctx *ctx, const char *key, struct num *n)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (!is_float_type(kv->type) && !is_int_type(kv->type))
        return RKV_EFORMAT;
    return read_num(kv->type, kv->val, n);
}

int gguf_get_f32(const struct gguf_ctx *ctx, const char *key, float *out)
{
    struct num n;
    int rc = get_num(ctx, key, &n);
    if (!rc)
        *out = num_to_f32(&n);
    return rc;
}

int gguf_get_f64(const struct gguf_ctx *ctx, const char *key, double *out)
{
    struct num n;
    int rc = get_num(ctx, key, &n);
    if (!rc)
        *out = n.is_float ? n.f : n.neg ? (double)n.i : (double)n.u;
    return rc;
}

int gguf_get_bool(const struct gguf_ctx *ctx, const char *key, int *out)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (kv->type != GGUF_VAL_BOOL)
        return RKV_EFORMAT;
    *out = kv->val[0] != 0;
    return 0;
}

static struct gguf_str str_at(const uint8_t *p)
{
    struct gguf_str s;
    memcpy(&s.len, p, 8);
    s.ptr = (const char *)p + 8;
    return s;
}

int gguf_get_str(const struct gguf_ctx *ctx, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (kv->type != GGUF_VAL_STRING)
        return RKV_EFORMAT;
    *out = str_at(kv->val);
    return 0;
}

int gguf_get_arr_info(const struct gguf_ctx *ctx, const char *key, enum gguf_value_type *elem_type,
                      uint64_t *n)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (kv->type != GGUF_VAL_ARRAY)
        return RKV_EFORMAT;
    if (elem_type)
        *elem_type = (enum gguf_value_type)kv->elem_type;
    if (n)
        *n = kv->n;
    return 0;
}

int gguf_get_arr_str(const struct gguf_ctx *ctx, const char *key, uint64_t i, struct gguf_str *out)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (kv->type != GGUF_VAL_ARRAY || kv->elem_type != GGUF_VAL_STRING)
        return RKV_EFORMAT;
    if (i >= kv->n)
        return RKV_ERANGE;
    *out = str_at(kv->val + kv->str_off[i]);
    return 0;
}

/* element i of a numeric array */
static int arr_num(const struct gguf_ctx *ctx, const char *key, uint64_t i, struct num *n)
{
    const struct gguf_kv *kv = find_kv(ctx, key);
    if (!kv)
        return RKV_ENOTFOUND;
    if (kv->type != GGUF_VAL_ARRAY || val_size(kv->elem_type) == 0)
        return RKV_EFORMAT;
    if (i >= kv->n)
        return RKV_ERANGE;
    return read_num(kv->elem_type, kv->val + i * val_size(kv->elem_type), n);
}

int gguf_get_arr_f32(const struct gguf_ctx *ctx, const char *key, uint64_t i, float *out)
{
    struct num n;
    int rc = arr_num(ctx, key, i, &n);
    if (!rc)
        *out = num_to_f32(&n);
    return rc;
}

int gguf_get_arr_i64(const struct gguf_ctx *ctx, const char *key, uint64_t i, int64_t *out)
{
    struct num n;
    int rc = arr_num(ctx, key, i, &n);
    if (!rc)
        rc = num_to_i64(&n, out);
    return rc;
}

/* --- tensors --------------------------------------------------------------------- */

uint64_t gguf_n_tensors(const struct gguf_ctx *ctx)
{
    return ctx->n_tensors;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf_ctx *ctx, uint64_t i)
{
    return i < ctx->n_tensors ? &ctx->tensors[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_ctx *ctx, const char *name)
{
    if (!ctx->tensor_index.slots)
        return NULL;
    uint64_t *slot = index_slot(ctx, &ctx->tensor_index, tensor_name_at, name, strlen(name));
    return *slot ? &ctx->tensors[*slot - 1] : NULL;
}
