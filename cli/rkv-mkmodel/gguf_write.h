/* gguf_write.h - GGUF v3 header (metadata, tensor infos) built in memory; data streamed after. */
#ifndef RKV_MKMODEL_GGUF_WRITE_H
#define RKV_MKMODEL_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

struct gw;

int gw_create(struct gw **out, uint32_t alignment);
void gw_destroy(struct gw *w);

/* metadata in the order added; allocation failures are reported by gw_header */
void gw_kv_u32(struct gw *w, const char *key, uint32_t v);
void gw_kv_i32(struct gw *w, const char *key, int32_t v);
void gw_kv_f32(struct gw *w, const char *key, float v);
void gw_kv_bool(struct gw *w, const char *key, int v);
void gw_kv_str(struct gw *w, const char *key, const char *s);
void gw_kv_arr_str(struct gw *w, const char *key, const char *const *s, uint64_t n);
void gw_kv_arr_i32(struct gw *w, const char *key, const int32_t *v, uint64_t n);

/* a tensor of n_bytes data; returns its offset from the data section start
 * (each tensor starts aligned) */
uint64_t gw_tensor(struct gw *w, const char *name, uint32_t type, uint32_t n_dims,
                   const uint64_t *ne, uint64_t n_bytes);

/* the finished header, padded to the data section; valid until gw_destroy.
 * data_bytes: the padded size of the data section that must follow. */
int gw_header(struct gw *w, const uint8_t **buf, size_t *len, uint64_t *data_bytes);

#endif
