/* migrate.c - one reconcile pass from the allocator's state to a plan. */
#include "kvmgr/migrate.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

int mig_session_state(const struct kvb *kvb, uint64_t sid, struct plan_session *s)
{
    uint32_t d, h;
    int rc = kvb_session_counts(kvb, sid, &d, &h);
    if (rc)
        return rc;
    s->cur_dev = d;
    s->cur_host = h;
    return 0;
}

/* opens a move of n blocks of sid one way and queues its copies (kvpool_copies_start); the
 * caller commits it once kvpool_copies_wait says they are done. RKV_ENOSPACE and RKV_EBUSY
 * leave the session as it was; after a failed queueing the move stays open (*opened), to be
 * aborted after the wait, since some of its copies may be in flight */
static int move_start(struct kvb *kvb, struct kvpool *const *dev, uint32_t n_gpus,
                      struct kvpool *host, uint64_t sid, uint32_t n, int demote, int parking,
                      struct kvb_copy *ops, uint32_t *copies, int *opened)
{
    size_t n_ops = 0;
    *opened = 0;
    int rc = !demote   ? kvb_promote(kvb, sid, n, ops, n, &n_ops)
             : parking ? kvb_park(kvb, sid, n, ops, n, &n_ops)
                       : kvb_demote(kvb, sid, n, ops, n, &n_ops);
    if (rc)
        return rc;
    *opened = 1;
    rc = kvpool_copies_start(dev, n_gpus, host, ops, n_ops);
    if (rc)
        log_error("kv migration of session %llu failed: %s", (unsigned long long)sid,
                  rkv_strerror(rc));
    else
        *copies += (uint32_t)n_ops;
    return rc;
}

int mig_rehome(struct kvb *kvb, struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
               uint64_t sid, uint32_t to, uint32_t n_dev, uint32_t *copies)
{
    uint32_t d, h;
    *copies = 0;
    int rc = kvb_session_counts(kvb, sid, &d, &h);
    if (rc)
        return rc;
    size_t cap = 2 * ((size_t)d + h), n_ops = 0;
    struct kvb_copy *ops = malloc((cap ? cap : 1) * sizeof(*ops));
    if (!ops)
        return RKV_ENOMEM;
    rc = kvb_rehome(kvb, sid, to, n_dev, ops, cap, &n_ops);
    if (rc == 0 && (rc = kvpool_run_copies(dev, n_gpus, host, ops, n_ops)) != 0) {
        log_error("moving session %llu to gpu %u failed: %s", (unsigned long long)sid, to,
                  rkv_strerror(rc));
        kvb_abort(kvb, sid);
    }
    if (rc == 0 && (rc = kvb_commit(kvb, sid, NULL)) == 0)
        *copies = (uint32_t)n_ops;
    free(ops);
    return rc;
}

int mig_apply(struct kvb *kvb, struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
              const struct plan *plan, struct mig_stats *st)
{
    memset(st, 0, sizeof(*st));
    size_t n = plan_n_assign(plan);
    uint32_t max_blocks = 0;
    for (size_t i = 0; i < n; i++) {
        const struct plan_assign *a = plan_assign_at(plan, i);
        if (a->dropped && kvb_session_close(kvb, a->id) == 0)
            st->closed++;
        uint32_t d, h;
        if (kvb_session_counts(kvb, a->id, &d, &h) == 0 && d + h > max_blocks)
            max_blocks = d + h;
    }
    struct kvb_copy *ops = malloc((max_blocks ? max_blocks : 1) * sizeof(*ops));
    /* the moves whose copies are queued: all of a pass's copies are in flight together (on a
     * gpu the demotions' device -> host beside the promotions' host -> device), then every
     * move commits. A failed one is aborted once nothing is in flight */
    struct {
        uint64_t sid;
        int failed;
    } *open = malloc((n ? n : 1) * sizeof(*open));
    size_t n_open = 0;
    if (!ops || !open) {
        free(ops);
        free(open);
        return RKV_ENOMEM;
    }
    int rc = 0;
    /* demotions everywhere first: they make the room promotions need */
    for (int demote = 1; demote >= 0 && rc == 0; demote--) {
        for (size_t i = 0; i < n && rc == 0; i++) {
            const struct plan_assign *a = plan_assign_at(plan, i);
            uint32_t d, h;
            if (kvb_session_counts(kvb, a->id, &d, &h))
                continue;
            /* blocks the session will append land on the device: the blocks it
             * has now get what is left of n_dev */
            uint32_t total = a->n_dev + a->n_host, held = d + h;
            uint32_t grow = total > held ? total - held : 0;
            uint32_t target = a->n_dev > grow ? a->n_dev - grow : 0;
            /* the newest block stays while partly written; a full one may go
             * when the session is about to start a new block */
            size_t toks = kvb_session_tokens(kvb, a->id);
            int parking = a->tactic == PLAN_PARKED || a->tactic == PLAN_ROTATED;
            uint32_t keep = !parking && !(grow > 0 && toks % kvb_block_tokens(kvb) == 0)
                                ? kvb_parts(kvb) /* the newest position block's parts */
                                : 0;
            uint32_t k = demote ? (d > target && d > keep ? RKV_MIN(d - target, d - keep) : 0)
                                : (d < target ? RKV_MIN(target - d, h) : 0);
            if (k == 0)
                continue;
            int opened;
            int mrc = move_start(kvb, dev, n_gpus, host, a->id, k, demote, parking, ops,
                                 &st->copies, &opened);
            if (opened)
                open[n_open].sid = a->id, open[n_open++].failed = mrc != 0;
            if (mrc == 0) {
                st->sessions_moved++;
                *(demote ? &st->blocks_demoted : &st->blocks_promoted) += k;
            } else if (!opened && (mrc == RKV_ENOSPACE || mrc == RKV_EBUSY || mrc == RKV_ERANGE)) {
                /* no room until acks, a move already open: the next pass retries.
                 * a host pool full of clean copies (which the plan does not
                 * count) gives some back for then (sessions with a move open keep
                 * theirs) */
                if (mrc == RKV_ENOSPACE && demote) {
                    uint32_t trimmed;
                    if ((rc = kvb_trim_host_copies(kvb, k, &trimmed)))
                        break;
                    st->trimmed += trimmed;
                }
                st->deferred++;
            } else {
                rc = mrc;
            }
        }
    }
    int wrc = n_open ? kvpool_copies_wait(dev, n_gpus) : 0;
    if (wrc) {
        log_error("kv migration: waiting for the copies of %zu sessions failed: %s", n_open,
                  rkv_strerror(wrc));
        if (!rc)
            rc = wrc;
    }
    for (size_t j = 0; j < n_open; j++) {
        if (wrc || open[j].failed) {
            kvb_abort(kvb, open[j].sid);
            continue;
        }
        int crc = kvb_commit(kvb, open[j].sid, NULL);
        if (crc && !rc)
            rc = crc;
    }
    free(open);
    free(ops);
    return rc;
}
