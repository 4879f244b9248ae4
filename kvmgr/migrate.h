/* migrate.h - carries out a plan: moves each session's blocks between the
 * device and host pools until its device count matches the plan. */
#ifndef RKV_KVMGR_MIGRATE_H
#define RKV_KVMGR_MIGRATE_H

#include <stdint.h>

#include "kvmgr/blocks.h"
#include "kvmgr/plan.h"
#include "kvmgr/pool.h"

/*
 * mig_apply is one reconcile pass, meant for the kvmgr's periodic timer:
 *  1. sessions the plan dropped are closed in the allocator (their kv is
 *     rebuilt from token history when they are admitted again);
 *  2. every session with more device blocks than the plan's n_dev demotes its
 *     oldest ones (the newest block stays, except for a PARKED or ROTATED
 *     session, which goes to the host whole), copies run, the table commits;
 *  3. every session with fewer promotes its newest host-only blocks.
 * Counts come from the allocator, not from the plan's demote/promote fields:
 * blocks appended since planning are accounted for, and blocks the session
 * will still append (plan total - held) are kept room for on the device, since
 * new blocks are written there (the newest block never leaves the device). Device blocks freed by
 * a demotion return to the pool only when the workers ack the new table, so
 * a promotion may find no room yet: it is counted as deferred and the next
 * pass retries. Sessions in the plan but not in the allocator are skipped.
 * A move's copies are queued on the device's copy lanes and waited for once
 * (kvpool_run_copies: its runs do not wait for each other), then the move commits
 * before the next one opens, so a block shared by two sessions that move in one
 * pass is copied once: the second finds the first's copy in the index. A failed
 * copy or commit aborts the move. On the cpu backend the copies are memcpy.
 *
 * A kvmgr tick, end to end:
 *   for each session: plan_session{id, gpu, n_blocks = blocks for its tokens
 *     plus the next step, active, pinned, last_use, cur_tactic = its tactic in
 *     the previous plan (PLAN_WAIT if none)} and mig_session_state() for
 *     cur_dev / cur_host;
 *   plan_compute(&in, prev, &plan); mig_apply(...); plan_destroy(prev);
 *   new sessions the plan admitted: kvb_session_open(..., max_dev = n_dev);
 *   send each changed table (kvb_session_table + epoch) to its worker, which
 *   adopts it at a step boundary and acks (kvb_ack); kvb_worker_lost when a
 *   worker dies. PLAN_WAIT and PLAN_ROTATED sessions are not scheduled this
 *   round.
 */

struct mig_stats {
    uint32_t sessions_moved;
    uint32_t blocks_demoted;
    uint32_t blocks_promoted;
    uint32_t copies;   /* blocks copied (demoting a BOTH block copies nothing) */
    uint32_t deferred; /* sessions whose move must wait for room or a free move slot */
    uint32_t closed;   /* dropped sessions closed */
    uint32_t trimmed;  /* clean host copies dropped to make host room */
};

/* the allocator state the planner needs: cur_dev, cur_host of session sid */
int mig_session_state(const struct kvb *kvb, uint64_t sid, struct plan_session *s);

/* moves session sid to gpu `to` through the host pool (kvb_rehome), its
 * newest n_dev blocks resident there; runs the copies and commits, or leaves
 * the session as it was on any error (RKV_EBUSY: not all written yet or a
 * move open; RKV_ENOSPACE: a pool is short). *copies: blocks copied. */
int mig_rehome(struct kvb *kvb, struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
               uint64_t sid, uint32_t to, uint32_t n_dev, uint32_t *copies);

int mig_apply(struct kvb *kvb, struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
              const struct plan *plan, struct mig_stats *st);

#endif
