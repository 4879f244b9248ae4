/* kvwire.c - codecs for KV_PREP and KV_TABLES, bounds-checked like every decoder in proto/. */
#include "proto/kvwire.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/msg.h"
#include "proto/proto.h"

/* a prep seq's positions and ids agree: the ids owed fit before n_pos after the tokens
 * given, and a prep ahead owes at least its last id (a new session carries all it has) */
static int prep_seq_check(uint32_t i, uint8_t flags, uint32_t n_pos, uint8_t n_owed, uint32_t nt,
                          char *err, size_t errlen)
{
    if (n_owed > 2 * PROTO_MAX_DECODE_STEPS)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "kv_prep: seq %u owes %u ids, at most %u (the decode steps of a step "
                            "and of the one prepared ahead)",
                            i, n_owed, 2 * PROTO_MAX_DECODE_STEPS);
    if ((flags & PROTO_KV_AHEAD) && ((flags & PROTO_KV_NEW) || !n_owed))
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "kv_prep: seq %u is prepared ahead %s: it must be a known session "
                            "that owes its last id",
                            i, (flags & PROTO_KV_NEW) ? "with the new flag" : "owing no id");
    if (!(flags & PROTO_KV_NEW) && (uint64_t)nt + n_owed > n_pos)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "kv_prep: seq %u has %u tokens and owes %u ids, more than its %u "
                            "positions",
                            i, nt, n_owed, n_pos);
    return 0;
}

int proto_kv_prep_encode(const struct proto_kv_prep *m, struct proto_wbuf *w, char *err,
                         size_t errlen)
{
    if (m->n_close > PROTO_MAX_SEQS || m->n_idle > PROTO_MAX_SEQS || m->n_seqs > PROTO_MAX_SEQS)
        return proto_seterr(err, errlen, RKV_EINVAL,
                            "kv_prep: %u closes, %u idles, %u seqs; at most %u each", m->n_close,
                            m->n_idle, m->n_seqs, PROTO_MAX_SEQS);
    proto_wbuf_put_u32(w, m->worker_id);
    proto_wbuf_put_u64(w, m->ack_epoch);
    proto_wbuf_put_u32(w, m->n_close);
    for (uint32_t i = 0; i < m->n_close; i++)
        proto_wbuf_put_u64(w, m->close[i]);
    proto_wbuf_put_u32(w, m->n_idle);
    for (uint32_t i = 0; i < m->n_idle; i++)
        proto_wbuf_put_u64(w, m->idle[i]);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        const struct proto_kv_prep_seq *q = &m->seqs[i];
        if (q->n_tokens > PROTO_KV_MAX_TOKENS || (q->flags & ~PROTO_KV_FLAGS))
            return proto_seterr(err, errlen, RKV_EINVAL,
                                "kv_prep: seq %u has %u tokens (max %u) and flags 0x%x", i,
                                q->n_tokens, PROTO_KV_MAX_TOKENS, q->flags);
        if (prep_seq_check(i, q->flags, q->n_pos, q->n_owed, q->n_tokens, err, errlen))
            return RKV_EINVAL;
    }
    proto_wbuf_put_u32(w, m->n_seqs);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        const struct proto_kv_prep_seq *q = &m->seqs[i];
        proto_wbuf_put_u64(w, q->session_id);
        proto_wbuf_put_u32(w, q->n_pos);
        proto_wbuf_put_u8(w, q->flags);
        proto_wbuf_put_u32(w, q->n_written);
        proto_wbuf_put_u8(w, q->n_owed);
        proto_wbuf_put_u64(w, q->scope);
        proto_wbuf_put_u32(w, q->n_tokens);
        for (uint32_t t = 0; t < q->n_tokens; t++)
            proto_wbuf_put_i32(w, q->tokens[t]);
    }
    return proto_wbuf_err(w);
}

int proto_kv_tables_encode(const struct proto_kv_tables *m, struct proto_wbuf *w, char *err,
                           size_t errlen)
{
    if (m->n_seqs > PROTO_MAX_SEQS)
        return proto_seterr(err, errlen, RKV_EINVAL, "kv_tables: %u seqs, at most %u", m->n_seqs,
                            PROTO_MAX_SEQS);
    proto_wbuf_put_u64(w, m->epoch);
    proto_wbuf_put_u32(w, m->kvmgr_pid);
    proto_wbuf_put_u32(w, m->n_seqs);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        const struct proto_kv_table *t = &m->seqs[i];
        if (t->n_blocks > PROTO_MAX_BLOCKS || t->tactic >= PROTO_N_TACTICS)
            return proto_seterr(err, errlen, RKV_EINVAL,
                                "kv_tables: seq %u has %u blocks (max %u) and tactic %u", i,
                                t->n_blocks, PROTO_MAX_BLOCKS, t->tactic);
        proto_wbuf_put_u64(w, t->session_id);
        proto_wbuf_put_i32(w, t->status);
        proto_wbuf_put_u8(w, t->tactic);
        proto_wbuf_put_u32(w, t->n_cached);
        proto_wbuf_put_u32(w, t->n_blocks);
        for (uint32_t b = 0; b < t->n_blocks; b++) {
            if (t->blocks[b].residency > PROTO_RES_BOTH)
                return proto_seterr(err, errlen, RKV_EINVAL,
                                    "kv_tables: seq %u block %u has residency %u", i, b,
                                    t->blocks[b].residency);
            proto_wbuf_put_u32(w, t->blocks[b].index);
            proto_wbuf_put_u8(w, t->blocks[b].residency);
        }
    }
    return proto_wbuf_err(w);
}

/* a u32 count, checked against its limit and against the bytes left (each
 * element takes at least elem_min bytes) before anything is allocated */
static int get_count(struct proto_rbuf *r, uint32_t max, size_t elem_min, const char *what,
                     uint32_t *out, char *err, size_t errlen)
{
    if (proto_rbuf_get_u32(r, out))
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: truncated count", what);
    if (*out > max || (size_t)*out * elem_min > proto_rbuf_left(r))
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: count %u is over the limit %u or the %zu bytes left", what, *out,
                            max, proto_rbuf_left(r));
    return 0;
}

int proto_kv_prep_decode(const void *buf, size_t len, struct proto_kv_prep **out, char *err,
                         size_t errlen)
{
    struct proto_rbuf r;
    proto_rbuf_init(&r, buf, len);
    struct proto_kv_prep h = {0};
    int rc;
    if (proto_rbuf_get_u32(&r, &h.worker_id) || proto_rbuf_get_u64(&r, &h.ack_epoch))
        return proto_seterr(err, errlen, RKV_EFORMAT, "kv_prep: truncated header");
    /* sizes first (walk once), then one allocation, then fill */
    size_t start = r.pos;
    if ((rc = get_count(&r, PROTO_MAX_SEQS, 8, "kv_prep close", &h.n_close, err, errlen)))
        return rc;
    r.pos += (size_t)h.n_close * 8;
    if ((rc = get_count(&r, PROTO_MAX_SEQS, 8, "kv_prep idle", &h.n_idle, err, errlen)))
        return rc;
    r.pos += (size_t)h.n_idle * 8;
    if ((rc = get_count(&r, PROTO_MAX_SEQS, 30, "kv_prep seqs", &h.n_seqs, err, errlen)))
        return rc;
    /* walk the seqs once to check them and count their tokens */
    size_t seqs_at = r.pos, n_tok = 0;
    for (uint32_t i = 0; i < h.n_seqs; i++) {
        uint64_t sid, scope;
        uint32_t n_pos, n_written, nt;
        uint8_t flags, n_owed;
        if (proto_rbuf_get_u64(&r, &sid) || proto_rbuf_get_u32(&r, &n_pos) ||
            proto_rbuf_get_u8(&r, &flags) || proto_rbuf_get_u32(&r, &n_written) ||
            proto_rbuf_get_u8(&r, &n_owed) || proto_rbuf_get_u64(&r, &scope))
            return proto_seterr(err, errlen, RKV_EFORMAT, "kv_prep: seq %u truncated", i);
        if (flags & ~PROTO_KV_FLAGS)
            return proto_seterr(err, errlen, RKV_EFORMAT, "kv_prep: seq %u flags 0x%x unknown",
                                i, flags);
        if ((rc = get_count(&r, PROTO_KV_MAX_TOKENS, 4, "kv_prep tokens", &nt, err, errlen)))
            return rc;
        if ((rc = prep_seq_check(i, flags, n_pos, n_owed, nt, err, errlen)))
            return rc;
        r.pos += (size_t)nt * 4;
        n_tok += nt;
    }
    if (proto_rbuf_left(&r))
        return proto_seterr(err, errlen, RKV_EFORMAT, "kv_prep: %zu trailing bytes",
                            proto_rbuf_left(&r));
    size_t sz = sizeof h + (h.n_close + h.n_idle) * sizeof(uint64_t) +
                h.n_seqs * sizeof(struct proto_kv_prep_seq) + n_tok * sizeof(int32_t);
    struct proto_kv_prep *m = calloc(1, sz);
    if (!m)
        return RKV_ENOMEM;
    *m = h;
    m->close = (uint64_t *)(m + 1);
    m->idle = m->close + h.n_close;
    m->seqs = (struct proto_kv_prep_seq *)(m->idle + h.n_idle);
    int32_t *tok = (int32_t *)(m->seqs + h.n_seqs);
    (void)seqs_at;
    r.pos = start + 4;
    for (uint32_t i = 0; i < h.n_close; i++)
        proto_rbuf_get_u64(&r, &m->close[i]);
    r.pos += 4;
    for (uint32_t i = 0; i < h.n_idle; i++)
        proto_rbuf_get_u64(&r, &m->idle[i]);
    r.pos += 4;
    for (uint32_t i = 0; i < h.n_seqs; i++) {
        struct proto_kv_prep_seq *q = &m->seqs[i];
        proto_rbuf_get_u64(&r, &q->session_id);
        proto_rbuf_get_u32(&r, &q->n_pos);
        proto_rbuf_get_u8(&r, &q->flags);
        proto_rbuf_get_u32(&r, &q->n_written);
        proto_rbuf_get_u8(&r, &q->n_owed);
        proto_rbuf_get_u64(&r, &q->scope);
        proto_rbuf_get_u32(&r, &q->n_tokens);
        q->tokens = q->n_tokens ? tok : NULL;
        for (uint32_t t = 0; t < q->n_tokens; t++)
            proto_rbuf_get_i32(&r, tok++);
    }
    *out = m;
    return 0;
}

int proto_kv_tables_decode(const void *buf, size_t len, struct proto_kv_tables **out, char *err,
                           size_t errlen)
{
    struct proto_rbuf r;
    proto_rbuf_init(&r, buf, len);
    struct proto_kv_tables h = {0};
    int rc;
    if (proto_rbuf_get_u64(&r, &h.epoch) || proto_rbuf_get_u32(&r, &h.kvmgr_pid))
        return proto_seterr(err, errlen, RKV_EFORMAT, "kv_tables: truncated header");
    if ((rc = get_count(&r, PROTO_MAX_SEQS, 21, "kv_tables seqs", &h.n_seqs, err, errlen)))
        return rc;
    /* first pass: validate and count blocks */
    size_t seqs_at = r.pos, n_blocks = 0;
    for (uint32_t i = 0; i < h.n_seqs; i++) {
        uint64_t sid;
        int32_t status;
        uint8_t tactic;
        uint32_t nb, n_cached;
        if (proto_rbuf_get_u64(&r, &sid) || proto_rbuf_get_i32(&r, &status) ||
            proto_rbuf_get_u8(&r, &tactic) || proto_rbuf_get_u32(&r, &n_cached))
            return proto_seterr(err, errlen, RKV_EFORMAT, "kv_tables: seq %u truncated", i);
        if (tactic >= PROTO_N_TACTICS)
            return proto_seterr(err, errlen, RKV_EFORMAT, "kv_tables: seq %u tactic %u unknown", i,
                                tactic);
        if ((rc = get_count(&r, PROTO_MAX_BLOCKS, 5, "kv_tables blocks", &nb, err, errlen)))
            return rc;
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t idx;
            uint8_t res;
            proto_rbuf_get_u32(&r, &idx);
            proto_rbuf_get_u8(&r, &res);
            if (res > PROTO_RES_BOTH)
                return proto_seterr(err, errlen, RKV_EFORMAT,
                                    "kv_tables: seq %u block %u residency %u unknown", i, b, res);
        }
        n_blocks += nb;
        if (n_blocks > PROTO_MAX_BLOCKS * 4ull)
            return proto_seterr(err, errlen, RKV_EFORMAT, "kv_tables: too many blocks in all");
    }
    if (proto_rbuf_left(&r))
        return proto_seterr(err, errlen, RKV_EFORMAT, "kv_tables: %zu trailing bytes",
                            proto_rbuf_left(&r));
    size_t sz = sizeof h + h.n_seqs * sizeof(struct proto_kv_table) +
                n_blocks * sizeof(struct proto_block_ref);
    struct proto_kv_tables *m = calloc(1, sz);
    if (!m)
        return RKV_ENOMEM;
    *m = h;
    m->seqs = (struct proto_kv_table *)(m + 1);
    struct proto_block_ref *refs = (struct proto_block_ref *)(m->seqs + h.n_seqs);
    r.pos = seqs_at;
    for (uint32_t i = 0; i < h.n_seqs; i++) {
        struct proto_kv_table *t = &m->seqs[i];
        proto_rbuf_get_u64(&r, &t->session_id);
        proto_rbuf_get_i32(&r, &t->status);
        proto_rbuf_get_u8(&r, &t->tactic);
        proto_rbuf_get_u32(&r, &t->n_cached);
        proto_rbuf_get_u32(&r, &t->n_blocks);
        t->blocks = refs;
        for (uint32_t b = 0; b < t->n_blocks; b++) {
            proto_rbuf_get_u32(&r, &refs[b].index);
            proto_rbuf_get_u8(&r, &refs[b].residency);
        }
        refs += t->n_blocks;
    }
    *out = m;
    return 0;
}

void proto_kv_prep_destroy(struct proto_kv_prep *m)
{
    free(m);
}
void proto_kv_tables_destroy(struct proto_kv_tables *m)
{
    free(m);
}
