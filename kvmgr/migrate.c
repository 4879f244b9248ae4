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

/* moves n blocks of sid one way, runs the copies (queued on the device's copy lanes, waited for
 * once), commits; RKV_ENOSPACE and RKV_EBUSY leave the session as it was, and so does a failed
 * copy or commit (the move is aborted) */
static int move(struct kvb *kvb, struct kvpool *const *dev, uint32_t n_gpus, struct kvpool *host,
                uint64_t sid, uint32_t n, int demote, int parking, struct kvb_copy *ops,
                uint32_t *copies)
{
    size_t n_ops = 0;
    int rc = !demote   ? kvb_promote(kvb, sid, n, ops, n, &n_ops)
             : parking ? kvb_park(kvb, sid, n, ops, n, &n_ops)
                       : kvb_demote(kvb, sid, n, ops, n, &n_ops);
    if (rc)
        return rc;
    rc = kvpool_run_copies(dev, n_gpus, host, ops, n_ops);
    if (rc) {
        log_error("kv migration of session %llu failed: %s", (unsigned long long)sid,
                  rkv_strerror(rc));
        kvb_abort(kvb, sid);
        return rc;
    }
    if ((rc = kvb_commit(kvb, sid, NULL)) != 0) {
        log_error("kv migration of session %llu: the new table failed: %s", (unsigned long long)sid,
                  rkv_strerror(rc));
        kvb_abort(kvb, sid);
        return rc;
    }
    *copies += (uint32_t)n_ops;
    return 0;
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
    if (rc == 0) {
        /* the copies (device -> host, then host -> device of the same host blocks: the pool
         * orders them) and the new table, or nothing of the move */
        rc = kvpool_run_copies(dev, n_gpus, host, ops, n_ops);
        if (rc == 0)
            rc = kvb_commit(kvb, sid, NULL);
        if (rc) {
            log_error("moving session %llu to gpu %u failed: %s", (unsigned long long)sid, to,
                      rkv_strerror(rc));
            kvb_abort(kvb, sid);
        } else {
            *copies = (uint32_t)n_ops;
        }
    }
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
    if (!ops)
        return RKV_ENOMEM;
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
            int mrc = move(kvb, dev, n_gpus, host, a->id, k, demote, parking, ops, &st->copies);
            if (mrc == 0) {
                st->sessions_moved++;
                *(demote ? &st->blocks_demoted : &st->blocks_promoted) += k;
            } else if (mrc == RKV_ENOSPACE || mrc == RKV_EBUSY || mrc == RKV_ERANGE) {
                /* no room until acks, a move already open: the next pass retries.
                 * a host pool full of clean copies (which the plan does not
                 * count) gives some back for then */
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
    free(ops);
    return rc;
}
