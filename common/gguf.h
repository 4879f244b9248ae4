/* gguf.h - read-only GGUF v2/v3 reader over an mmap'd file, every extent validated. */
#ifndef RKV_GGUF_H
#define RKV_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor type ids as stored in GGUF (the ones rkv knows by name). */
enum gguf_tensor_type {
    GGUF_TYPE_F32 = 0,
    GGUF_TYPE_F16 = 1,
    GGUF_TYPE_Q8_0 = 8,
    GGUF_TYPE_BF16 = 30,
};

/* metadata value types as stored in GGUF */
enum gguf_value_type {
    GGUF_VAL_UINT8 = 0,
    GGUF_VAL_INT8 = 1,
    GGUF_VAL_UINT16 = 2,
    GGUF_VAL_INT16 = 3,
    GGUF_VAL_UINT32 = 4,
    GGUF_VAL_INT32 = 5,
    GGUF_VAL_FLOAT32 = 6,
    GGUF_VAL_BOOL = 7,
    GGUF_VAL_STRING = 8,
    GGUF_VAL_ARRAY = 9,
    GGUF_VAL_UINT64 = 10,
    GGUF_VAL_INT64 = 11,
    GGUF_VAL_FLOAT64 = 12,
};

#define GGUF_MAX_DIMS 4

struct gguf_tensor {
    const char *name; /* NUL-terminated copy owned by the ctx */
    uint32_t type;    /* enum gguf_tensor_type (may be any ggml id) */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the fastest-varying dim; unused = 1 */
    uint64_t n_elements;
    uint64_t n_bytes; /* validated: data + n_bytes within the file */
    const void *data; /* points into the mapping */
    uint64_t offset;  /* byte offset of data from the start of the file */
};

/* a string inside the mapping: not NUL-terminated */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

struct gguf_ctx;

/* open + validate. on failure returns a negative code and, when errbuf is
 * given, a message naming the file and the offending field. */
int gguf_open(const char *path, struct gguf_ctx **out, char *errbuf, size_t errlen);
/* same over a caller-owned buffer (fuzzing, tests); buf must outlive ctx */
int gguf_open_mem(const void *buf, size_t len, struct gguf_ctx **out, char *errbuf, size_t errlen);
void gguf_close(struct gguf_ctx *ctx);

uint32_t gguf_version(const struct gguf_ctx *ctx);
uint64_t gguf_alignment(const struct gguf_ctx *ctx);
/* byte offset of the (aligned) tensor data section, and the file's size */
uint64_t gguf_data_offset(const struct gguf_ctx *ctx);
uint64_t gguf_file_size(const struct gguf_ctx *ctx);

/* metadata. key lookups return -1 when absent; gguf_key_name gives
 * {NULL, 0} and gguf_kv_type (enum gguf_value_type)-1 for i >= n_kv.
 * arrays of arrays are read and skipped: arr_info reports them, element
 * getters give RKV_EFORMAT. */
int64_t gguf_find_key(const struct gguf_ctx *ctx, const char *key);
uint64_t gguf_n_kv(const struct gguf_ctx *ctx);
struct gguf_str gguf_key_name(const struct gguf_ctx *ctx, uint64_t i);
enum gguf_value_type gguf_kv_type(const struct gguf_ctx *ctx, uint64_t i);

/* typed getters: 0, RKV_ENOTFOUND (absent) or RKV_EFORMAT (wrong type).
 * integer getters accept any integer type; a value that does not fit the
 * result gives RKV_ERANGE. gguf_get_f32 also accepts integer types. */
int gguf_get_u32(const struct gguf_ctx *ctx, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf_ctx *ctx, const char *key, uint64_t *out);
int gguf_get_i64(const struct gguf_ctx *ctx, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_ctx *ctx, const char *key, float *out);  /* f32 or f64 */
int gguf_get_f64(const struct gguf_ctx *ctx, const char *key, double *out); /* f64 kept exact */
int gguf_get_bool(const struct gguf_ctx *ctx, const char *key, int *out);
int gguf_get_str(const struct gguf_ctx *ctx, const char *key, struct gguf_str *out);

/* arrays: element type and count; element access is bounds-checked
 * (RKV_ERANGE past the end) */
int gguf_get_arr_info(const struct gguf_ctx *ctx, const char *key, enum gguf_value_type *elem_type,
                      uint64_t *n);
int gguf_get_arr_str(const struct gguf_ctx *ctx, const char *key, uint64_t i, struct gguf_str *out);
/* numeric arrays (any int/float elem type) converted per element */
int gguf_get_arr_f32(const struct gguf_ctx *ctx, const char *key, uint64_t i, float *out);
int gguf_get_arr_i64(const struct gguf_ctx *ctx, const char *key, uint64_t i, int64_t *out);

/* tensors. types unknown to ggml are passed on with n_bytes 0 (only the
 * offset is checked); known types have ne[0] a multiple of their block. */
uint64_t gguf_n_tensors(const struct gguf_ctx *ctx);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_ctx *ctx, uint64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_ctx *ctx, const char *name);

/* "F32", "Q4_K", ... ; "type 99" style text for unknown ids (static buffer
 * per thread) */
const char *gguf_type_name(uint32_t type);
/* bytes for n elements of type (n multiple of the block size); 0 if unknown */
uint64_t gguf_type_size(uint32_t type, uint64_t n);

#endif
