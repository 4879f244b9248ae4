/* kvwire.h - rkvd <-> kvmgr hot-path messages: KV_PREP (what the next step needs) and KV_TABLES. */
#ifndef RKV_PROTO_KVWIRE_H
#define RKV_PROTO_KVWIRE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

/*
 * Before each step rkvd tells kvmgr, for one worker, how many positions each
 * sequence of the step will occupy afterwards; kvmgr allocates or trims
 * blocks, re-plans (which may move blocks between device and host), and
 * answers with every sequence's block table and the table epoch. rkvd puts
 * the tables into the worker's STEP_REQ and acknowledges the epoch in its
 * next KV_PREP once the step has finished: only then does kvmgr reuse
 * memory that older tables pointed at (the lease: no worker ever reads a
 * block mid-move or after reuse).
 *
 * KV_PREP wire: u32 worker_id, u64 ack_epoch (0 = none yet), u32 n_close,
 * u64 close[n_close], u32 n_idle, u64 idle[n_idle], u32 n_seqs, then per
 * seq: u64 session_id, u32 n_pos, u8 flags, u32 n_written, u8 n_owed, u64 scope,
 * u32 n_tokens, i32 tokens[n_tokens].
 *
 * KV_TABLES wire: u64 epoch, u32 n_seqs, then per seq: u64 session_id,
 * i32 status, u8 tactic (enum proto_tactic), u32 n_cached, u32 n_blocks,
 * n_blocks x (u32 index, u8 residency).
 *
 * Prefix sharing: a session kvmgr does not know yet comes with
 * PROTO_KV_NEW and every token it has (its prompt); kvmgr maps the full
 * blocks whose token prefix another session of the same scope (rkvd sends
 * the API key's id, or 0 for one cache shared by all) has written to the same blocks
 * and answers n_cached, the positions that need no prefill (a multiple of
 * the block size, always leaving the last token to compute). Later steps
 * send the tokens they add, so the blocks they fill become shareable once
 * n_written (positions whose KV is known written: the step's n_past) covers
 * them.
 *
 * Several gpus: kvmgr may answer a sequence with status PROTO_KV_MOVED(g)
 * (no blocks): it placed the session on gpu g instead (a new session that
 * fits g better), or moved its blocks there through the host pool (the
 * planner's rebalance; every position was written, so no step reads the old
 * blocks). rkvd runs it on worker g from then on: the next KV_PREP for it
 * comes from g's driver. PROTO_KV_NOMOVE asks kvmgr to keep the session
 * where it is (rkvd cannot follow now, e.g. another worker is drained).
 */

#define PROTO_KV_ACTIVE 1u /* the session has a request running */
#define PROTO_KV_PINNED 2u /* operator pinned: keep resident */
#define PROTO_KV_NEW 4u    /* first prep of this session: tokens = all it has */
#define PROTO_KV_NOMOVE 8u /* keep it on this worker's gpu */
/* prepared ahead: sent while this worker's previous step still runs (its positions,
 * from n_written on, are being written), before that step sampled this one's input.
 * tokens end at n_pos - n_owed (n_owed >= 1: the ids of the previous step's input become
 * known; the last position's id is not known yet, the next prep brings it). kvmgr never
 * cuts such a session back: the positions past n_written are the step in flight */
#define PROTO_KV_AHEAD 16u
#define PROTO_KV_FLAGS \
    (PROTO_KV_ACTIVE | PROTO_KV_PINNED | PROTO_KV_NEW | PROTO_KV_NOMOVE | PROTO_KV_AHEAD)
/* a KV_TABLES status: the session is on gpu g now (g < PROTO_MAX_WORKERS) */
#define PROTO_KV_MOVED(g) ((int32_t)(1 + (g)))
#define PROTO_KV_IS_MOVED(st) ((st) >= 1 && (st) <= 64) /* 64: PROTO_MAX_WORKERS */
#define PROTO_KV_MOVED_GPU(st) ((uint32_t)(st) - 1u)
#define PROTO_KV_MAX_TOKENS (1u << 24)

struct proto_kv_prep_seq {
    uint64_t session_id;
    uint32_t n_pos;     /* positions the session holds after this step */
    uint8_t flags;      /* PROTO_KV_* */
    uint32_t n_written; /* positions whose KV the worker has written */
    /* the last n_owed positions get their ids later (a later prep's tokens bring them):
     * the steps pick them (several greedy decode steps in one STEP_REQ; AHEAD: those of the
     * running step and of the step prepared); at most 2 * PROTO_MAX_DECODE_STEPS */
    uint8_t n_owed;
    uint32_t n_tokens;
    const int32_t *tokens; /* NEW: every token; else ending at n_pos - n_owed (the step's,
                            * after ids owed from earlier steps) */
    /* the prefix-cache partition (read with NEW): blocks are shared only between sessions
     * of one scope, so one tenant's cached prefixes never answer another's prompts */
    uint64_t scope;
};

struct proto_kv_prep {
    uint32_t worker_id;
    uint64_t ack_epoch;
    uint32_t n_close;
    uint64_t *close; /* (n_close) sessions to free */
    uint32_t n_idle;
    uint64_t *idle; /* (n_idle) sessions that went idle (parkable) */
    uint32_t n_seqs;
    struct proto_kv_prep_seq *seqs; /* (n_seqs) */
};

struct proto_kv_table {
    uint64_t session_id;
    int32_t status; /* 0, RKV_ENOSPACE: not admitted yet (retry), or PROTO_KV_MOVED(g) */
    uint8_t tactic; /* enum proto_tactic */
    uint32_t n_cached; /* NEW sessions: leading positions reused from other sessions */
    uint32_t n_blocks;
    struct proto_block_ref *blocks; /* (n_blocks) position order */
};

struct proto_kv_tables {
    uint64_t epoch;
    uint32_t kvmgr_pid; /* who placed these tables (rkvd checks its worker maps this kvmgr) */
    uint32_t n_seqs;
    struct proto_kv_table *seqs; /* (n_seqs) */
};

int proto_kv_prep_encode(const struct proto_kv_prep *m, struct proto_wbuf *w, char *err,
                         size_t errlen);
int proto_kv_tables_encode(const struct proto_kv_tables *m, struct proto_wbuf *w, char *err,
                           size_t errlen);
/* decode exactly len bytes into one allocation; RKV_EFORMAT with text in
 * err for anything truncated, over a limit or with trailing bytes */
int proto_kv_prep_decode(const void *buf, size_t len, struct proto_kv_prep **out, char *err,
                         size_t errlen);
int proto_kv_tables_decode(const void *buf, size_t len, struct proto_kv_tables **out, char *err,
                           size_t errlen);
void proto_kv_prep_destroy(struct proto_kv_prep *m);
void proto_kv_tables_destroy(struct proto_kv_tables *m);

#endif
