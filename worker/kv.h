/* kv.h - paged KV cache: layout descriptor, block geometry, block tables, pools. */
#ifndef RKV_KV_H
#define RKV_KV_H

#include <stddef.h>
#include <stdint.h>

#define KV_BLOCK_SIZE_DEFAULT 256

enum kv_dtype {
    KV_F32 = 0,
    KV_F16 = 1,
};

/* where a block lives; a pool per residency */
enum kv_residency {
    KV_DEVICE = 0,
    KV_HOST = 1,
};
#define KV_N_POOLS 2

/* one block holds block_size positions for all layers. inside a block, layer
 * l's K slice then its V slice, each contiguous (n_kv_head, block_size,
 * head_dim), so one copy moves one layer of one block. */
struct kv_layout {
    uint32_t block_size; /* B: positions per block */
    uint32_t n_layer;
    uint32_t n_kv_head;
    uint32_t head_dim;
    enum kv_dtype dtype;
};

/* one entry of a session's block table (position order: entry j holds
 * positions j*B .. j*B+B-1). blocks need not be contiguous or sorted. */
struct kv_block_ref {
    uint32_t index;    /* block index inside the pool of its residency */
    uint8_t residency; /* enum kv_residency */
};

/* the memory blocks live in; handed in from outside (kvmgr's shared memory,
 * CUDA IPC mappings) or from kv_local_create for tools and tests. */
struct kv_pools {
    void *base[KV_N_POOLS]; /* pool start, indexed by residency */
    uint32_t n_blocks[KV_N_POOLS];
};

/* fills a layout; checks every field (block_size 1..65536, dtype known) */
int kv_layout_init(struct kv_layout *l, uint32_t block_size, uint32_t n_layer, uint32_t n_kv_head,
                   uint32_t head_dim, enum kv_dtype dtype);
size_t kv_dtype_size(enum kv_dtype t);
/* bytes of one K (or V) slice: n_kv_head * block_size * head_dim elements */
size_t kv_slice_bytes(const struct kv_layout *l);
/* bytes of one whole block (all layers, K and V) */
size_t kv_block_bytes(const struct kv_layout *l);
/* byte offset of layer's K (is_v=0) or V (is_v=1) slice inside a block */
size_t kv_slice_offset(const struct kv_layout *l, uint32_t layer, int is_v);
/* blocks needed for n_pos positions */
uint32_t kv_blocks_for(const struct kv_layout *l, uint32_t n_pos);

/* a layer's host blocks staged in passes of whole sequences (the cuda backend, when they pass
 * its staging buffer): sequence s stages slots[s] consecutive slots, in sequence order; each
 * pass takes the next sequences while their slots fit cap. pass_of[s] gets each sequence's
 * pass. Returns the passes (at most max_pass are described in first/count: the first slot
 * and the slots of each), or 0 when one sequence alone is over cap (nothing to split) */
uint32_t kv_stage_passes(const uint32_t *slots, uint32_t n_seqs, uint64_t cap, uint32_t *pass_of,
                         uint32_t *first, uint32_t *count, uint32_t max_pass);
/* host address of a block's layer slice (valid when the pool is host-mapped,
 * always true for the cpu backend); NULL when the ref is out of range */
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
/* moves a block to the other residency (copy, then release the source);
 * *ref is updated */
int kv_local_migrate(struct kv_local *k, struct kv_block_ref *ref, enum kv_residency to);

#endif
