/* meta.cuh - the batch metadata: a step's positions, write slots and block lists on the device. */
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "worker/backend.h"
}

struct cuda_ctx;

/* device-side view of one step's batch, built on the host once per distinct
 * batch and kept on the device (every layer of a step reuses it) */
/* block lists per sequence: device blocks, host blocks (zero-copy), and the
 * host blocks renumbered by staging slot (copy path) */
#define CUDA_LIST_STAGED 2
#define CUDA_N_LISTS     3
struct cuda_seq_meta {
    uint32_t tok_off, n_tokens, n_past, pad;
    uint32_t list_off[CUDA_N_LISTS]; /* into the block lists */
    uint32_t list_len[CUDA_N_LISTS];
    uint32_t pad2[2];
};

/* one query tile: up to qt tokens of one sequence */
struct cuda_qtile {
    uint32_t seq, t0, nt, pad; /* t0 relative to the sequence's first token */
};

/* block list entry: position-order index j in the table, index in its pool */
struct cuda_blk {
    uint32_t j, index;
};

struct cuda_meta {
    /* device arrays (one allocation, dev points at its start) */
    void *dev;
    size_t dev_cap;
    int32_t *d_pos;   /* (n_tokens) */
    uint32_t *d_slot; /* (n_tokens) pool index | residency << 31 */
    /* (n_tokens) the staging slot a token's k, v go to instead (its host block is written
     * back from there: stage_w 2), or ~0u */
    uint32_t *d_wslot;
    struct cuda_seq_meta *d_seqs; /* (n_seqs) */
    struct cuda_blk *d_blks;      /* (sum of list lengths) */
    struct cuda_qtile *d_qtiles;  /* (n_qtiles) */
    /* host copy of what was uploaded, to see whether the next batch differs */
    void *host;
    size_t host_len, host_cap;
    uint32_t n_tokens, n_seqs, n_qtiles, qt;
    uint32_t max_units[CUDA_N_LISTS]; /* most blocks of one list in one sequence */
    uint32_t *stage_src;              /* (n_slots) host pool index copied into each staging slot */
    /* (n_slots) 0: no token of the batch writes that block; 1: the kv write stores its new
     * rows in the mapped pool (copied after the write); 2: in its staging slot (copied up
     * before the write with its old rows, the slot copied back to the pool after it: a prefill
     * chunk's rows, which the mapped pool takes at a seventh of the link's speed); 3: as 2,
     * but the write fills the block from its first row (no old rows: nothing copied up) */
    uint8_t *stage_w;
    uint32_t *stage_rows; /* (2 n_slots) rows [r0, r1) of its block the batch writes */
    uint32_t n_slots, stage_cap;
    uint32_t n_wb, n_wb_old; /* slots with stage_w 2 or 3, and with 2 */
    int host_writes;         /* some token of the batch stores into the mapped pool */
    /* a layer's host blocks past the staging limit go in passes of whole sequences (each
     * sequence's slots are contiguous): pass p stages slots [pass_slot0[p], + pass_nslots[p])
     * and attends with d_seqs_pass[p * n_seqs ...], where the staged lists of the other
     * sequences are empty. n_pass 0: one pass (or zero-copy, when one sequence is too big) */
    uint32_t n_pass, pass_cap;
    uint32_t *pass_slot0, *pass_nslots;
    struct cuda_seq_meta *d_seqs_pass;
    /* the split host read (c->hcpu.host_split): sequence s's oldest cpu_k[s] read host blocks
     * are attended on the cpu, the gpu's host lists leave them out; any: some sequence has one */
    uint32_t *cpu_k, cpu_k_cap;
    int cpu_any;
    int split_gated;     /* the split is on, but these decode rows' host tails are too short */
    int split_async;     /* the split's cpu part runs as a host function (split_async_us) */
    uint64_t gen;        /* bumped at every upload */
    int valid;
};

/* builds the device view of batch b for attention of gqa group g (positions, write slots,
 * per-residency block lists, query tiles) and uploads it when it differs from the last one */
int cuda_meta_ensure(struct cuda_ctx *c, const struct be_batch *b, uint32_t g);
/* the group size the last attention used, so rope and kv_write build tiles attention can
 * reuse */
uint32_t cuda_meta_last_g(const struct cuda_ctx *c);
/* frees what the meta holds (device and host arrays) */
void cuda_meta_fini(struct cuda_meta *m);
