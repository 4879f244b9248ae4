/* kv.h - paged KV cache: layout descriptor, block geometry, block tables, pools. */
#ifndef RKV_KV_H
#define RKV_KV_H

#include <stddef.h>
#include <stdint.h>

#define KV_BLOCK_SIZE_DEFAULT 256

enum kv_dtype {
    KV_F32 = 0,
    KV_F16 = 1,
    KV_Q8 = 2,  /* int8 levels, a bf16 scale per 32 values of a row */
    KV_FP8 = 3, /* e4m3 levels, an f32 scale per row */
};
#define KV_N_DTYPES 4
/* the names config keys and messages use, in enum order */
#define KV_DTYPE_NAMES "f32, f16, q8, fp8"
#define KV_Q8_GROUP    32 /* values under one q8 scale */

/* where a block lives; a pool per residency */
enum kv_residency {
    KV_DEVICE = 0,
    KV_HOST = 1,
};
#define KV_N_POOLS 2

/* the positions j*B .. j*B+B-1 of a session (a position block) are n_parts blocks of
 * part_layers layer slots each. inside a block, slot s's K slice then its V slice, each
 * contiguous, so one copy moves one layer of one block.
 * Without sliding windows a position block is one block of every layer (slot = layer).
 * With them (kv_layout_set_window) part 0 holds the global layers and parts 1.. the local
 * ones, part_layers (= the global layers) at a time, so a position block that left every
 * local window keeps only its part 0 (docs/runtime.md, "Sliding windows").
 * A slice is (n_kv_head, block_size) rows of kv_row_bytes, a
 * (head, position) row each, position-major within a head as kvmgr's partial
 * copies expect. A row of f32 or f16 is head_dim elements; a row of an 8-bit
 * dtype is head_dim level bytes, then the row's scales:
 *   q8:  level int8 q, value = q * d, d a bf16 per KV_Q8_GROUP values
 *        (ceil(head_dim / 32) of them, the last group may be shorter);
 *   fp8: level an e4m3 byte (bias 7, no infinities, 0x7f/0xff NaN, never
 *        written), value = e4m3(level) * s, s one f32.
 * A NaN in a row is passed over by its scale's amax and stored as level 0
 * (both forms).
 * A row of head_dim 128 takes 136 bytes in q8 and 132 in fp8 (f16: 256).
 * head_dim must be a multiple of 8 for them, so every row and its scales
 * start 2-byte aligned (q8) or 4-byte aligned (fp8) in a slice that is.
 * Quantization is deterministic, every division and rounding one IEEE f32
 * operation (kv_q8_quantize, kv_fp8_quantize), so every writer (cpu, cuda)
 * gives the same bytes for the same row. */
struct kv_layout {
    uint32_t block_size; /* B: positions per block */
    uint32_t n_layer;
    uint32_t n_kv_head;
    uint32_t head_dim;
    enum kv_dtype dtype;
    uint32_t n_parts;     /* blocks per position block (1: no window saving) */
    uint32_t part_layers; /* layer slots per block */
    uint32_t n_swa;       /* local layers' window in positions; 0 = none */
    uint32_t swa_period;  /* layer l is global when l % swa_period == swa_period - 1 */
};

/* a table entry naming no block: a local part dropped once it left every window */
#define KV_REF_NONE UINT32_MAX

/* one entry of a session's block table. entries come in position order, n_parts per
 * position block: entry j*n_parts + p is part p of positions j*B .. j*B+B-1. blocks need
 * not be contiguous or sorted. */
struct kv_block_ref {
    uint32_t index;    /* block index inside the pool of its residency, or KV_REF_NONE */
    uint8_t residency; /* enum kv_residency */
};

/* the memory blocks live in; handed in from outside (kvmgr's shared memory,
 * CUDA IPC mappings) or from kv_local_create for tools and tests. */
struct kv_pools {
    void *base[KV_N_POOLS]; /* pool start, indexed by residency */
    uint32_t n_blocks[KV_N_POOLS];
};

/* fills a layout; checks every field (block_size 1..65536, dtype known, head_dim a multiple
 * of 8 for the 8-bit dtypes) */
int kv_layout_init(struct kv_layout *l, uint32_t block_size, uint32_t n_layer, uint32_t n_kv_head,
                   uint32_t head_dim, enum kv_dtype dtype);
/* splits each position block into a part of the global layers and parts of the local ones
 * (layer l local when n_swa and l % swa_period != swa_period - 1). A model with no local or
 * no global layer keeps one part. RKV_EINVAL for a period of 0 with a window */
int kv_layout_set_window(struct kv_layout *l, uint32_t n_swa, uint32_t swa_period);
/* bytes of one element, or of one level for the 8-bit dtypes */
size_t kv_dtype_size(enum kv_dtype t);
/* "f16"; "?" for an unknown value */
const char *kv_dtype_name(enum kv_dtype t);
/* "q8" -> KV_Q8; RKV_EINVAL for a name not in KV_DTYPE_NAMES */
int kv_dtype_parse(const char *name, enum kv_dtype *out);
/* 1 for q8 and fp8 (rows of levels and scales), else 0 */
int kv_dtype_is_8bit(enum kv_dtype t);
/* scales in one (head, position) row: ceil(head_dim / 32) for q8, 1 for fp8, 0 else */
uint32_t kv_row_scales(const struct kv_layout *l);
/* bytes one (head, position) row takes in a slice, its scales included */
size_t kv_row_bytes(const struct kv_layout *l);
/* bytes one position takes in a block: all layers, K and V, every kv head */
size_t kv_token_bytes(const struct kv_layout *l);
/* bytes of one K (or V) slice: n_kv_head * block_size rows */
size_t kv_slice_bytes(const struct kv_layout *l);
/* inside a slice: row (head, pos), its elements or levels, and (8-bit) its scales after them */
void *kv_row_ptr(const struct kv_layout *l, void *slice, uint32_t head, uint32_t pos);
void *kv_row_scale_ptr(const struct kv_layout *l, void *slice, uint32_t head, uint32_t pos);
/* the reference row conversions (the cpu backend's vector forms give the same bits):
 * src (head_dim) into row (head, pos) of a slice in the layout's dtype, and back */
void kv_row_store(const struct kv_layout *l, void *slice, uint32_t head, uint32_t pos,
                  const float *src);
void kv_row_load(const struct kv_layout *l, const void *slice, uint32_t head, uint32_t pos,
                 float *dst);
/* q8 of n values: levels q (n), scales d (ceil(n / 32) bf16 bits). per group: amax the largest
 * |x|, d = bf16(amax / 127) (round to nearest even), q = rint(x / d) (half to even) clamped
 * to +-127; all 0 when amax is 0 */
void kv_q8_quantize(const float *x, uint32_t n, int8_t *q, uint16_t *d);
/* fp8 of n values: s = amax / 448, levels e4m3(x / s) (nearest even, saturating at 448) */
void kv_fp8_quantize(const float *x, uint32_t n, uint8_t *q, float *s);
uint8_t kv_f32_to_e4m3(float x);
float kv_e4m3_to_f32(uint8_t v);
float kv_bf16_to_f32(uint16_t h);
uint16_t kv_f32_to_bf16(float f);
/* bytes of one block (part_layers layer slots, K and V): the unit pools allocate */
size_t kv_block_bytes(const struct kv_layout *l);
/* byte offset of layer's K (is_v=0) or V (is_v=1) slice inside the block of its part */
size_t kv_slice_offset(const struct kv_layout *l, uint32_t layer, int is_v);
/* position blocks needed for n_pos positions */
uint32_t kv_blocks_for(const struct kv_layout *l, uint32_t n_pos);
/* 1 when layer attends through the window (its kv is dropped once out of it) */
int kv_layer_local(const struct kv_layout *l, uint32_t layer);
/* the part of a position block that holds layer */
uint32_t kv_layer_part(const struct kv_layout *l, uint32_t layer);
/* the first position block whose local parts a step starting at n_past reads (queries at
 * n_past and later see positions > pos - n_swa): the local parts before it are dead.
 * 0 without a window */
uint32_t kv_window_first(const struct kv_layout *l, uint64_t n_past);
/* blocks a session of n_pos positions holds once its dead local parts are dropped: every
 * global part, and the local parts a step from n_pos reads. what its kv costs at rest */
uint64_t kv_live_blocks(const struct kv_layout *l, uint64_t n_pos);
/* the same session's bytes, and what they would be with every layer global */
uint64_t kv_live_bytes(const struct kv_layout *l, uint64_t n_pos);
uint64_t kv_all_global_bytes(const struct kv_layout *l, uint64_t n_pos);
/* 1 when a table of n_refs entries holds every block a step from n_pos reads among the
 * position blocks that hold positions before n_pos: a prefix of n_pos positions taken from
 * it (another session's table) continues exactly; 0 when some local part of the window was
 * dropped, so its local layers' kv would have to be recomputed from position 0 */
int kv_window_live(const struct kv_layout *l, const struct kv_block_ref *blocks, uint32_t n_refs,
                   uint64_t n_pos);
/* layer's table over position blocks: out[j] = in[j*n_parts + part] for the n_pos_blocks
 * position blocks of a table of n_refs entries; returns n_pos_blocks (n_refs / n_parts) */
uint32_t kv_layer_view(const struct kv_layout *l, const struct kv_block_ref *in, uint32_t n_refs,
                       uint32_t layer, struct kv_block_ref *out);

/* a layer's host blocks staged in passes of whole sequences (the cuda backend, when they pass
 * its staging buffer): sequence s stages slots[s] consecutive slots, in sequence order; each
 * pass takes the next sequences while their slots fit cap. pass_of[s] gets each sequence's
 * pass. Returns the passes (at most max_pass are described in first/count: the first slot
 * and the slots of each), or 0 when one sequence alone is over cap (nothing to split) */
uint32_t kv_stage_passes(const uint32_t *slots, uint32_t n_seqs, uint64_t cap, uint32_t *pass_of,
                         uint32_t *first, uint32_t *count, uint32_t max_pass);
/* host address of a layer's slice in ref, the block of the layer's part (valid when the
 * pool is host-mapped, always true for the cpu backend); NULL when the ref is out of range
 * or KV_REF_NONE */
void *kv_slice_ptr(const struct kv_layout *l, const struct kv_pools *p, struct kv_block_ref ref,
                   uint32_t layer, int is_v);

/* a local allocator over two plain-memory pools, for rkv-gen and tests (the
 * server's blocks come from kvmgr). */
struct kv_local;
int kv_local_create(struct kv_local **out, const struct kv_layout *l, uint32_t n_device,
                    uint32_t n_host);

/* where a local pool's memory comes from when it is not plain memory (a gpu
 * backend's device pool): alloc/free per residency, copy between any two
 * pool addresses. pools from alloc are not zeroed. */
struct kv_mem {
    int (*alloc)(void *u, enum kv_residency r, size_t bytes, void **out);
    void (*free)(void *u, enum kv_residency r, void *p);
    int (*copy)(void *u, void *dst, const void *src, size_t n);
    void *u;
};
int kv_local_init_mem(struct kv_local **out, const struct kv_layout *l, uint32_t n_device,
                      uint32_t n_host, const struct kv_mem *mem);
void kv_local_destroy(struct kv_local *k);
const struct kv_pools *kv_local_pools(const struct kv_local *k);
/* takes a free block of that residency: RKV_ENOSPACE when none is left */
int kv_local_alloc(struct kv_local *k, enum kv_residency r, struct kv_block_ref *out);
void kv_local_release(struct kv_local *k, struct kv_block_ref ref);
/* blocks of that residency in use */
uint32_t kv_local_used(const struct kv_local *k, enum kv_residency r);
/* moves a block to the other residency (copy, then release the source);
 * *ref is updated */
int kv_local_migrate(struct kv_local *k, struct kv_block_ref *ref, enum kv_residency to);

#endif
