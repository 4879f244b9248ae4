/* blocks.h - the kv block allocator: device and host block pools, per-session
 * block tables with residency, prefix sharing, and epoch-acked moves. */
#ifndef RKV_KVMGR_BLOCKS_H
#define RKV_KVMGR_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

/*
 * Model. Each gpu has a pool of device blocks, the host has one pool of host
 * blocks; a block holds block_tokens positions of one session for all layers.
 * A session's table lists its blocks in position order; an entry names a
 * device block, a host block, or both (a device block with a clean host copy,
 * so demoting it copies nothing). Physical blocks are reference counted:
 * sessions share read-only full blocks with identical token prefixes (the
 * prefix index maps a chain hash of all tokens up to a block's end to the
 * block). Only full blocks are shared, so the block being written is always
 * private (copy-on-write happens once, when a fork splits inside a block).
 *
 * Epochs and leases. Epochs are one counter over all sessions: every change
 * to a table gives it the next epoch (a session's epoch is its last change).
 * A worker that reads a session holds a lease on it and acks, at a step
 * boundary, the epoch it adopted: for one session (kvb_ack) or for all its
 * sessions at once (kvb_ack_worker, the KV_PREP ack_epoch). A block a table stops naming is not
 * reused at once: its reference is dropped only when every worker holding a lease on that session
 * has acked an epoch >= the change. kvb_worker_lost drops a dead worker's leases so nothing waits
 * for it.
 *
 * Moves are two-phase: kvb_demote / kvb_promote pick blocks, allocate their
 * destinations and return the copies to do; the table changes only at
 * kvb_commit (after the copies are done); kvb_abort frees the destinations.
 *
 * Hash collisions of the 64-bit chain hash are not checked (as vLLM's
 * default hash); appended blocks come from the device pool (the newest block is
 * written on the device): a caller makes room with kvb_demote first.
 */

#define KVB_MAX_GPUS  16
#define KVB_MAX_PARTS 64
#define KVB_NONE      UINT32_MAX

struct kvb;

struct kvb_config {
    uint32_t n_gpus;
    uint32_t dev_blocks[KVB_MAX_GPUS]; /* device pool size per gpu */
    uint32_t host_blocks;              /* host pool size */
    uint32_t block_tokens;             /* positions per block (B) */
    /* move (demote, park) only blocks whose positions are all reported
     * written (kvb_session_written): a step in flight may still be writing
     * the others, and a copy taken now would miss what it writes. kvmgr sets
     * it; without it any block but the partly filled newest may move. */
    int moves_need_written;
    /* sliding windows (docs/runtime.md, "Sliding windows"): each position block is n_parts
     * table entries (0 counts as 1), part 0 the global layers, parts 1.. local layers that
     * read only the last `window` positions; a dropped local part is an entry naming no
     * block (dev and host KVB_NONE) */
    uint32_t n_parts;
    uint32_t window;
};

enum kvb_residency {
    KVB_DEVICE = 1,
    KVB_HOST = 2,
    KVB_BOTH = 3, /* device block with a clean host copy */
};

/* one table entry: block indices in their pools, KVB_NONE when absent (both: a dropped
 * local part). Entry j*n_parts + p is part p of position block j */
struct kvb_entry {
    uint32_t dev;
    uint32_t host;
};

enum kvb_copy_kind {
    KVB_COPY_D2H = 0, /* device pool of `gpu` -> host pool */
    KVB_COPY_H2D,     /* host pool -> device pool of `gpu` */
    KVB_COPY_D2D,     /* device -> device on `gpu` (copy-on-write) */
};

struct kvb_copy {
    enum kvb_copy_kind kind;
    uint32_t gpu;
    uint32_t src;      /* block index in the source pool */
    uint32_t dst;      /* block index in the destination pool */
    uint32_t n_tokens; /* positions to copy from the block start (B = whole block) */
};

int kvb_create(const struct kvb_config *cfg, struct kvb **out);
void kvb_destroy(struct kvb *kvb);

enum kvb_residency kvb_entry_residency(struct kvb_entry e);

/* --- sessions --------------------------------------------------------------- */

/* opens session sid (nonzero, unused) on gpu with its prompt tokens (NULL:
 * n_tokens positions of unknown tokens, nothing shared): full
 * blocks whose prefix is already in the index under the same scope (the
 * prefix-cache partition, e.g. an API key; a fork keeps its parent's) are shared (*n_reused tokens,
 * a multiple of B, need no prefill; with parts, cut back to the longest prefix whose window's
 * local parts are all found); blocks are allocated for the rest, the
 * newest max_dev (>= 1; KVB_NONE = all) on the device and older ones on the
 * host (a long prompt of a WINDOW session prefills its tail into host
 * memory). RKV_ENOSPACE when a pool is short (nothing changes). */
int kvb_session_open(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope,
                     const uint32_t *tokens, size_t n_tokens, uint32_t max_dev, size_t *n_reused);
/* as kvb_session_open, but the session holds only the shared prefix (*n_reused positions,
 * maybe 0): no block is allocated, so a prompt longer than the pools have room for now opens
 * as well (kvb_session_append brings the positions a step needs) */
int kvb_session_open_shared(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope,
                            const uint32_t *tokens, size_t n_tokens, size_t *n_reused);
/* opens child sharing parent's first n_tokens positions: full blocks are
 * shared; a partial last position block is copied into new private device blocks,
 * returned in *cow (room for n_parts; *n_cow of them) for the caller to execute.
 * RKV_ESTALE when the window of n_tokens was dropped. */
int kvb_session_fork(struct kvb *kvb, uint64_t parent, uint64_t child, size_t n_tokens,
                     struct kvb_copy *cow, size_t *n_cow);
/* records n more positions (tokens may be NULL when only positions are
 * known: such blocks are never shared); allocates device blocks for them */
int kvb_session_append(struct kvb *kvb, uint64_t sid, const uint32_t *tokens, size_t n);
/* the token ids of positions [from, from + n) that an earlier append made without
 * them (a step prepared ahead of the one sampling its input): they count as known
 * when they continue the known prefix, so the blocks they fill become shareable.
 * Positions past what the session holds are ignored. */
int kvb_session_know(struct kvb *kvb, uint64_t sid, size_t from, const uint32_t *tokens, size_t n);
/* keeps the first n_tokens positions; later blocks are released as workers
 * ack. A kept partial position block is written again, so each of its parts that is
 * shared or not on the device has its first positions copied into a new private device
 * block (*cow: room for n_parts, *n_cow of them), like a fork. RKV_ESTALE (nothing changes)
 * when a local part the window of n_tokens reads was dropped (kvb_session_window_live). */
int kvb_session_truncate(struct kvb *kvb, uint64_t sid, size_t n_tokens, struct kvb_copy *cow,
                         size_t *n_cow);
/* drops the local parts (1..n_parts-1) of position blocks before first_pb; their blocks are
 * released as workers ack (an indexed one stays in the prefix cache). RKV_EBUSY while a move
 * is open. *n_dropped (may be NULL): entries dropped */
int kvb_session_drop_local(struct kvb *kvb, uint64_t sid, uint32_t first_pb, uint32_t *n_dropped);
/* 1 when a step from n_tokens finds every local part its window reads among the position
 * blocks before n_tokens (always 1 with one part): only then may the session be cut back to
 * n_tokens and continue exactly */
int kvb_session_window_live(const struct kvb *kvb, uint64_t sid, size_t n_tokens);
/* the first position block whose local parts a step from n_past reads (0 without a window) */
uint32_t kvb_window_first(const struct kvb *kvb, size_t n_past);
/* table entries per position block */
uint32_t kvb_parts(const struct kvb *kvb);
/* the worker wrote kv for the first n_tokens positions: their full blocks
 * become shareable through the prefix index */
int kvb_session_written(struct kvb *kvb, uint64_t sid, size_t n_tokens);
/* ends the session; its blocks are released as workers ack (or at once) */
int kvb_session_close(struct kvb *kvb, uint64_t sid);

/* the table: *n entries (at most cap copied into out, out may be NULL) */
int kvb_session_table(const struct kvb *kvb, uint64_t sid, struct kvb_entry *out, size_t cap,
                      size_t *n, uint64_t *epoch);
/* device-readable blocks (DEVICE or BOTH) and host-only blocks: the planner's
 * cur_dev / cur_host */
int kvb_session_counts(const struct kvb *kvb, uint64_t sid, uint32_t *n_dev, uint32_t *n_host);
size_t kvb_session_tokens(const struct kvb *kvb, uint64_t sid);
/* the gpu whose device pool holds its device blocks, KVB_NONE if unknown */
uint32_t kvb_session_gpu(const struct kvb *kvb, uint64_t sid);

/* --- moves ------------------------------------------------------------------ */

/* demotes the n oldest device-resident blocks (never the newest block while
 * it is being written, i.e. partly filled).
 * ops (cap >= n) receives the copies; *n_ops may be < n when a block has a
 * host copy already. RKV_EBUSY while another move of the session is open,
 * RKV_ENOSPACE when the host pool is short (nothing changes). */
int kvb_demote(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
               size_t *n_ops);
/* kvb_demote for an idle session that nothing writes: the newest block may
 * go too (PARKED keeps no block on the device) */
int kvb_park(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
             size_t *n_ops);
/* promotes the n newest host-only blocks; the host copy is kept (BOTH) */
int kvb_promote(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
                size_t *n_ops);
/* moves session sid to gpu `to` through the host pool (demote on its gpu,
 * promote on `to`): its newest n_dev blocks get device blocks on `to` (one
 * indexed there already is shared, else copied from the block's host copy;
 * a device-only block is copied to a new host block first and keeps that
 * clean copy), older ones become host-only (a device-only one is copied to
 * the host). The old device blocks are released as the workers ack, so a
 * session staying on the old gpu that shares one keeps it. ops: cap >= twice
 * the session's blocks (D2H copies come first: they feed the H2D ones).
 * Every position must be written (moves_need_written) and no other move open,
 * else RKV_EBUSY; n_dev >= 1 while the newest block is partly filled;
 * RKV_ENOSPACE when a pool is short (nothing changes). kvb_commit installs it
 * (the session is on `to` from then on), kvb_abort forgets it. */
int kvb_rehome(struct kvb *kvb, uint64_t sid, uint32_t to, uint32_t n_dev, struct kvb_copy *ops,
               size_t cap, size_t *n_ops);
/* the copies are done: install the new table (epoch + 1) */
int kvb_commit(struct kvb *kvb, uint64_t sid, uint64_t *epoch);
/* forget the open move, freeing its destinations */
int kvb_abort(struct kvb *kvb, uint64_t sid);

/* drops clean host copies of device blocks (BOTH -> DEVICE) over all
 * sessions until `want` copies are dropped; their host blocks return as the
 * workers ack. For when the host pool fills with copies the planner does not
 * count. *dropped: how many were dropped. */
int kvb_trim_host_copies(struct kvb *kvb, uint32_t want, uint32_t *dropped);

/* --- workers ---------------------------------------------------------------- */

/* worker reads sid from the table of `epoch` on */
int kvb_lease(struct kvb *kvb, uint32_t worker, uint64_t sid, uint64_t epoch);
int kvb_unlease(struct kvb *kvb, uint32_t worker, uint64_t sid);
/* worker adopted sid's table as of `epoch` (at a step boundary) */
int kvb_ack(struct kvb *kvb, uint32_t worker, uint64_t sid, uint64_t epoch);
/* the newest epoch of any table: a worker that finished a step with tables
 * sent at this point may ack it, whichever sessions the step held */
uint64_t kvb_epoch(const struct kvb *kvb);
/* positions per block */
uint32_t kvb_block_tokens(const struct kvb *kvb);
/* worker adopted every table it was sent up to `epoch` */
int kvb_ack_worker(struct kvb *kvb, uint32_t worker, uint64_t epoch);
/* worker died: its leases go, blocks waiting only for it are released */
int kvb_worker_lost(struct kvb *kvb, uint32_t worker);

/* --- accounting ------------------------------------------------------------- */

uint32_t kvb_free_dev(const struct kvb *kvb, uint32_t gpu);
uint32_t kvb_free_host(const struct kvb *kvb);
/* blocks whose release waits for acks, over all sessions */
size_t kvb_pending(const struct kvb *kvb);
size_t kvb_n_sessions(const struct kvb *kvb);

/* recomputes every reference count from the tables, pending releases and open
 * moves, and checks that each block is free exactly once or owned with the
 * right count, and that the index names live blocks. 0 or RKV_EINTERNAL
 * (the first violation is logged). */
int kvb_check(const struct kvb *kvb);

#endif
