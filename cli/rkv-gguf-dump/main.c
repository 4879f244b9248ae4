/* main.c - rkv-gguf-dump: a GGUF file's metadata and tensors as rkv's reader sees them. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/quant.h"

#define PROG "rkv-gguf-dump"

static const char *const val_names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                        "int32",  "float32", "bool",   "string", "array",
                                        "uint64", "int64",   "float64"};

static const char *val_name(enum gguf_value_type t)
{
    return (unsigned)t < sizeof val_names / sizeof val_names[0] ? val_names[t] : "?";
}

/* crc-32 (zlib's), so a test can compare with zlib.crc32; c continues an earlier crc (0 to
 * start) */
static uint32_t crc32_bytes(uint32_t c, const uint8_t *p, uint64_t n)
{
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    c ^= 0xffffffffu;
    for (uint64_t i = 0; i < n; i++)
        c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

/* integers as raw JSON text keep all 64 bits; is_float 1 prints a float32
 * (9 digits round-trip), 2 a float64; non-finite floats become strings */
static cJSON *num_json(double f, int is_float, int64_t i, uint64_t u, int is_signed)
{
    char buf[40];
    if (is_float) {
        if (!isfinite(f))
            return cJSON_CreateString(isnan(f) ? "nan" : f > 0 ? "inf" : "-inf");
        snprintf(buf, sizeof buf, "%.*g", is_float == 1 ? 9 : 17, f);
    } else if (is_signed) {
        snprintf(buf, sizeof buf, "%" PRId64, i);
    } else {
        snprintf(buf, sizeof buf, "%" PRIu64, u);
    }
    return cJSON_CreateRaw(buf);
}

static cJSON *str_json(struct gguf_str s)
{
    char *z = malloc(s.len + 1);
    if (!z)
        return NULL;
    memcpy(z, s.ptr, s.len);
    z[s.len] = 0;
    cJSON *j = cJSON_CreateString(z);
    free(z);
    return j;
}

/* one scalar of type t: through the typed getters, or array element i */
static cJSON *value_json(const struct gguf_ctx *g, const char *key, enum gguf_value_type t,
                         int64_t elem)
{
    struct gguf_str s;
    float f;
    int64_t i64 = 0;
    uint64_t u64 = 0;
    int b;
    if (t == GGUF_VAL_STRING) {
        int rc = elem < 0 ? gguf_get_str(g, key, &s) : gguf_get_arr_str(g, key, elem, &s);
        return rc ? NULL : str_json(s);
    }
    if (t == GGUF_VAL_BOOL && elem < 0)
        return gguf_get_bool(g, key, &b) ? NULL : cJSON_CreateBool(b);
    if (t == GGUF_VAL_FLOAT32 || t == GGUF_VAL_FLOAT64) {
        double d;
        if (elem >= 0)
            return gguf_get_arr_f32(g, key, elem, &f) ? NULL : num_json(f, 1, 0, 0, 0);
        return gguf_get_f64(g, key, &d) ? NULL
                                        : num_json(d, t == GGUF_VAL_FLOAT32 ? 1 : 2, 0, 0, 0);
    }
    if (t == GGUF_VAL_BOOL)
        return gguf_get_arr_i64(g, key, elem, &i64) ? NULL : cJSON_CreateBool(i64 != 0);
    if (t == GGUF_VAL_UINT64) {
        if (elem >= 0) /* values above INT64_MAX show as their int64 bits */
            return gguf_get_arr_i64(g, key, elem, &i64) ? NULL : num_json(0, 0, i64, 0, 1);
        return gguf_get_u64(g, key, &u64) ? NULL : num_json(0, 0, 0, u64, 0);
    }
    int rc = elem < 0 ? gguf_get_i64(g, key, &i64) : gguf_get_arr_i64(g, key, elem, &i64);
    return rc ? NULL : num_json(0, 0, i64, 0, 1);
}

static cJSON *kv_json(const struct gguf_ctx *g, uint64_t i)
{
    struct gguf_str k = gguf_key_name(g, i);
    char *key = malloc(k.len + 1);
    cJSON *o = cJSON_CreateObject();
    if (!key || !o) {
        free(key);
        cJSON_Delete(o);
        return NULL;
    }
    memcpy(key, k.ptr, k.len);
    key[k.len] = 0;
    enum gguf_value_type t = gguf_kv_type(g, i);
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddStringToObject(o, "type", val_name(t));
    if (t == GGUF_VAL_ARRAY) {
        enum gguf_value_type et;
        uint64_t n;
        gguf_get_arr_info(g, key, &et, &n);
        cJSON_AddStringToObject(o, "elem_type", val_name(et));
        cJSON_AddItemToObject(o, "count", num_json(0, 0, 0, n, 0));
        cJSON *arr = cJSON_AddArrayToObject(o, "value");
        /* arrays of arrays: only their count */
        for (uint64_t e = 0; et != GGUF_VAL_ARRAY && e < n; e++)
            cJSON_AddItemToArray(arr, value_json(g, key, et, (int64_t)e));
    } else {
        cJSON_AddItemToObject(o, "value", value_json(g, key, t, -1));
    }
    free(key);
    return o;
}

/* crc-32 of the tensor's values as f32 (dequantized row by row): "" for a type rkv does
 * not read */
static void dequant_crc(const struct gguf_tensor *t, char *out, size_t cap)
{
    uint64_t n = t->ne[0], rows = n ? t->n_elements / n : 0;
    size_t rb = quant_row_bytes(t->type, n);
    float *row = rb ? malloc(n * sizeof *row) : NULL;
    if (!row) {
        snprintf(out, cap, "%s", rb ? "out of memory" : "");
        return;
    }
    uint32_t c = 0;
    for (uint64_t r = 0; r < rows; r++) {
        quant_dequantize_row(t->type, (const uint8_t *)t->data + r * rb, row, n);
        c = crc32_bytes(c, (const uint8_t *)row, n * sizeof *row);
    }
    free(row);
    snprintf(out, cap, "%08" PRIx32, c);
}

static int g_dequant; /* --dequant */

static cJSON *tensor_json(const struct gguf_tensor *t)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON_AddStringToObject(o, "type", gguf_type_name(t->type));
    cJSON_AddNumberToObject(o, "type_id", t->type);
    cJSON *dims = cJSON_AddArrayToObject(o, "dims");
    for (uint32_t d = 0; d < t->n_dims; d++)
        cJSON_AddItemToArray(dims, num_json(0, 0, 0, t->ne[d], 0));
    cJSON_AddItemToObject(o, "n_elements", num_json(0, 0, 0, t->n_elements, 0));
    cJSON_AddItemToObject(o, "n_bytes", num_json(0, 0, 0, t->n_bytes, 0));
    cJSON_AddItemToObject(o, "offset", num_json(0, 0, 0, t->offset, 0));
    char crc[16];
    snprintf(crc, sizeof crc, "%08" PRIx32, crc32_bytes(0, t->data, t->n_bytes));
    cJSON_AddStringToObject(o, "crc32", crc);
    if (g_dequant) {
        char dq[32];
        dequant_crc(t, dq, sizeof dq);
        cJSON_AddStringToObject(o, "dequant_crc32", dq);
    }
    return o;
}

static cJSON *file_json(const struct gguf_ctx *g)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "version", gguf_version(g));
    cJSON_AddItemToObject(root, "alignment", num_json(0, 0, 0, gguf_alignment(g), 0));
    cJSON_AddItemToObject(root, "data_offset", num_json(0, 0, 0, gguf_data_offset(g), 0));
    cJSON_AddItemToObject(root, "file_size", num_json(0, 0, 0, gguf_file_size(g), 0));
    cJSON *kvs = cJSON_AddArrayToObject(root, "metadata");
    for (uint64_t i = 0; i < gguf_n_kv(g); i++)
        cJSON_AddItemToArray(kvs, kv_json(g, i));
    cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++)
        cJSON_AddItemToArray(ts, tensor_json(gguf_tensor_at(g, i)));
    return root;
}

/* text form: one line per key (long arrays cut), one per tensor */
static void print_text(const cJSON *root)
{
    printf("GGUF v%d, alignment %s, data at byte %s, %s bytes\n",
           cJSON_GetObjectItem(root, "version")->valueint,
           cJSON_GetObjectItem(root, "alignment")->valuestring,
           cJSON_GetObjectItem(root, "data_offset")->valuestring,
           cJSON_GetObjectItem(root, "file_size")->valuestring);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, cJSON_GetObjectItem(root, "metadata"))
    {
        const cJSON *v = cJSON_GetObjectItem(kv, "value");
        const cJSON *et = cJSON_GetObjectItem(kv, "elem_type");
        if (et) {
            printf("%-40s %s[%s] =", cJSON_GetObjectItem(kv, "key")->valuestring, et->valuestring,
                   cJSON_GetObjectItem(kv, "count")->valuestring);
            int n = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, v)
            {
                if (n++ == 8) {
                    printf(" ...");
                    break;
                }
                char *s = cJSON_PrintUnformatted(e);
                printf(" %s", s ? s : "?");
                free(s);
            }
            printf("\n");
        } else {
            char *s = cJSON_PrintUnformatted(v);
            printf("%-40s %s = %s\n", cJSON_GetObjectItem(kv, "key")->valuestring,
                   cJSON_GetObjectItem(kv, "type")->valuestring, s ? s : "?");
            free(s);
        }
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors"))
    {
        char *dims = cJSON_PrintUnformatted(cJSON_GetObjectItem(t, "dims"));
        printf("%-32s %-6s %-20s offset %-12s bytes %-12s crc32 %s\n",
               cJSON_GetObjectItem(t, "name")->valuestring,
               cJSON_GetObjectItem(t, "type")->valuestring, dims ? dims : "?",
               cJSON_GetObjectItem(t, "offset")->valuestring,
               cJSON_GetObjectItem(t, "n_bytes")->valuestring,
               cJSON_GetObjectItem(t, "crc32")->valuestring);
        free(dims);
    }
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--dequant")) {
            g_dequant = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: " PROG " FILE [--json] [--dequant]\n"
                   "prints a GGUF file's metadata and tensors (name, type, dims, file offset,\n"
                   "crc32 of the data) as rkv's reader sees them. --dequant adds, in the JSON\n"
                   "form, dequant_crc32: the crc32 of each tensor's values as f32 the way rkv\n"
                   "dequantizes them (\"\" for a type rkv does not read).\n");
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, PROG ": unexpected argument '%s' (usage: " PROG " FILE [--json] [--dequant])\n",
                    argv[i]);
            return 1;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, PROG ": no file given (usage: " PROG " FILE [--json] [--dequant])\n");
        return 1;
    }
    struct gguf_ctx *g;
    char err[512];
    int rc = gguf_open(path, &g, err, sizeof err);
    if (rc) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    cJSON *root = file_json(g);
    if (json) {
        char *s = root ? cJSON_Print(root) : NULL;
        if (s)
            printf("%s\n", s);
        else
            rc = RKV_ENOMEM;
        free(s);
    } else if (root) {
        print_text(root);
    }
    cJSON_Delete(root);
    gguf_close(g);
    if (rc)
        fprintf(stderr, PROG ": %s\n", rkv_strerror(rc));
    return rc ? 1 : 0;
}
