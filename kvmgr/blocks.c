/* blocks.c - the kv block allocator, session tables, prefix index and
 * epoch-acked releases (see blocks.h). */
#include "kvmgr/blocks.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

/* a pool of fixed-size blocks: reference counts, a free stack, the index */
struct pool {
    uint32_t n;
    uint32_t *ref;  /* [n] */
    uint64_t *hash; /* [n] hash the block is indexed under, 0 = none */
    uint32_t *free; /* [n] stack of free indices that hold nothing shareable */
    uint32_t n_free;
    /* free blocks that still hold written, indexed KV (a finished session's
     * prefix), least recently freed first: a later session with the same
     * prefix revives them; allocation takes them only when the stack is
     * empty, oldest first (the prefix cache) */
    uint32_t *lru_prev, *lru_next; /* [n] */
    uint32_t lru_head, lru_tail, n_cached;
    struct rkv_map index; /* chain hash -> block index + 1 */
};

/* a table entry with its chain hash (0 until the block is full and written) */
struct ent {
    uint32_t dev;
    uint32_t host;
    uint64_t hash;
};

/* a reference a table gave up at `epoch`, dropped once leases acked it */
struct drop {
    uint64_t epoch;
    uint32_t pool;
    uint32_t idx;
};

struct lease {
    uint32_t worker;
    uint64_t acked;
    uint64_t retire_at; /* the session moved to another gpu at this epoch: the lease ends
                         * once acked there (0: it does not) */
};

/* an open move: entry `entry` gets block idx (KVB_NONE: nothing to copy) in
 * the move's destination pool, and (rehome only) host block `host` */
struct mv {
    uint32_t entry;
    uint32_t idx;
    uint32_t host;
};

enum mv_kind { MV_NONE = 0, MV_DEMOTE, MV_PROMOTE, MV_REHOME };

struct sess {
    uint64_t id;
    uint32_t gpu;
    uint8_t closed;
    uint64_t scope; /* prefix partition: seeds its chain hashes */
    uint64_t epoch;
    struct rkv_vec ents;   /* struct ent, position order */
    struct rkv_vec tokens; /* uint32_t */
    size_t n_written;      /* positions whose kv the worker wrote */
    size_t n_published;    /* leading full blocks offered to the index */
    size_t n_known;        /* leading positions whose token ids are known */
    struct rkv_vec drops;  /* struct drop */
    struct rkv_vec leases; /* struct lease */
    enum mv_kind mv_kind;
    uint32_t mv_to;    /* rehome: the gpu it goes to */
    struct rkv_vec mv; /* struct mv */
};

struct kvb {
    uint64_t epoch; /* last table change, over all sessions */
    uint32_t n_gpus;
    uint32_t block_tokens;
    int moves_need_written;
    uint32_t n_parts;       /* table entries per position block */
    uint32_t window;        /* local layers' window in positions (0: none) */
    struct pool *pools;     /* [n_gpus + 1]: device pools, then the host pool */
    struct rkv_map live;    /* sid -> struct sess * */
    struct rkv_vec closing; /* struct sess *: closed, releases still pending */
};

#define ENT(s, i) rkv_vec_at(&(s)->ents, struct ent, i)

/* a local part dropped once it left every window: it names no block */
static int ent_dropped(const struct ent *e)
{
    return e->dev == KVB_NONE && e->host == KVB_NONE;
}

static uint32_t host_pool(const struct kvb *kvb)
{
    return kvb->n_gpus;
}

/* --- pools ------------------------------------------------------------------- */

static int pool_init(struct pool *p, uint32_t n)
{
    p->n = n;
    p->ref = calloc(n ? n : 1, sizeof(*p->ref));
    p->hash = calloc(n ? n : 1, sizeof(*p->hash));
    p->free = calloc(n ? n : 1, sizeof(*p->free));
    p->lru_prev = calloc(n ? n : 1, sizeof(*p->lru_prev));
    p->lru_next = calloc(n ? n : 1, sizeof(*p->lru_next));
    p->lru_head = p->lru_tail = KVB_NONE;
    p->n_cached = 0;
    rkv_map_init(&p->index);
    if (!p->ref || !p->hash || !p->free || !p->lru_prev || !p->lru_next)
        return RKV_ENOMEM;
    /* lowest index on top: allocation order is deterministic */
    for (uint32_t k = 0; k < n; k++)
        p->free[k] = n - 1 - k;
    p->n_free = n;
    return 0;
}

static void pool_fini(struct pool *p)
{
    free(p->ref);
    free(p->hash);
    free(p->free);
    free(p->lru_prev);
    free(p->lru_next);
    rkv_map_fini(&p->index);
}

/* blocks a new allocation can take: free, or cached (evictable) */
static uint32_t pool_avail(const struct pool *p)
{
    return p->n_free + p->n_cached;
}

static void lru_remove(struct pool *p, uint32_t idx)
{
    uint32_t pr = p->lru_prev[idx], nx = p->lru_next[idx];
    if (pr != KVB_NONE)
        p->lru_next[pr] = nx;
    else
        p->lru_head = nx;
    if (nx != KVB_NONE)
        p->lru_prev[nx] = pr;
    else
        p->lru_tail = pr;
    p->n_cached--;
}

static void lru_append(struct pool *p, uint32_t idx)
{
    p->lru_prev[idx] = p->lru_tail;
    p->lru_next[idx] = KVB_NONE;
    if (p->lru_tail != KVB_NONE)
        p->lru_next[p->lru_tail] = idx;
    else
        p->lru_head = idx;
    p->lru_tail = idx;
    p->n_cached++;
}

static uint32_t pool_alloc(struct pool *p)
{
    uint32_t idx;
    if (p->n_free) {
        idx = p->free[--p->n_free];
    } else if (p->n_cached) {
        /* evict the least recently freed cached block */
        idx = p->lru_head;
        lru_remove(p, idx);
        rkv_map_del(&p->index, p->hash[idx]);
        p->hash[idx] = 0;
    } else {
        return KVB_NONE;
    }
    p->ref[idx] = 1;
    return idx;
}

static void pool_unref(struct pool *p, uint32_t idx)
{
    if (--p->ref[idx] > 0)
        return;
    if (p->hash[idx])
        lru_append(p, idx); /* still indexed: a later identical prefix revives it */
    else
        p->free[p->n_free++] = idx;
}

/* the block indexed under hash, referenced, or KVB_NONE */
static uint32_t pool_lookup_ref(struct pool *p, uint64_t hash)
{
    if (!hash)
        return KVB_NONE;
    void *v = rkv_map_get(&p->index, hash);
    if (!v)
        return KVB_NONE;
    uint32_t idx = (uint32_t)((uintptr_t)v - 1);
    if (p->ref[idx] == 0)
        lru_remove(p, idx); /* a cached block comes back into use */
    p->ref[idx]++;
    return idx;
}

/* offers block idx under hash; the first block with a hash keeps the slot */
static void pool_publish(struct pool *p, uint32_t idx, uint64_t hash)
{
    if (!hash || p->hash[idx] || rkv_map_get(&p->index, hash))
        return;
    if (rkv_map_put(&p->index, hash, (void *)(uintptr_t)(idx + 1)) == 0)
        p->hash[idx] = hash;
}

/* hash of every token up to the end of this block, chained over blocks */
static uint64_t chain_hash(uint64_t prev, const uint32_t *tok, uint32_t n)
{
    uint64_t h = prev ^ 0x243f6a8885a308d3ull;
    for (uint32_t i = 0; i < n; i++) {
        h += tok[i] + 0x9e3779b97f4a7c15ull;
        h ^= h >> 30;
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 27;
        h *= 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return h ? h : 1; /* 0 means "no hash" */
}

/* the hash part p of a position block is indexed under: part 0 keeps the chain hash (the
 * next block's chain goes on from it), local parts get their own */
static uint64_t part_hash(uint64_t h, uint32_t p)
{
    if (!h || p == 0)
        return h;
    return chain_hash(h, &p, 1);
}

/* --- sessions ---------------------------------------------------------------- */

static struct sess *sess_create(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope)
{
    struct sess *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->id = sid;
    s->gpu = gpu;
    s->scope = scope;
    s->epoch = ++kvb->epoch;
    rkv_vec_init(&s->ents, sizeof(struct ent));
    rkv_vec_init(&s->tokens, sizeof(uint32_t));
    rkv_vec_init(&s->drops, sizeof(struct drop));
    rkv_vec_init(&s->leases, sizeof(struct lease));
    rkv_vec_init(&s->mv, sizeof(struct mv));
    return s;
}

static void sess_destroy(struct sess *s)
{
    rkv_vec_fini(&s->ents);
    rkv_vec_fini(&s->tokens);
    rkv_vec_fini(&s->drops);
    rkv_vec_fini(&s->leases);
    rkv_vec_fini(&s->mv);
    free(s);
}

static struct sess *sess_get(const struct kvb *kvb, uint64_t sid)
{
    return sid ? rkv_map_get(&kvb->live, sid) : NULL;
}

/* live or closing: what acks and leases may name */
static struct sess *sess_any(const struct kvb *kvb, uint64_t sid)
{
    struct sess *s = sess_get(kvb, sid);
    for (size_t i = 0; !s && i < kvb->closing.len; i++) {
        struct sess *c = *rkv_vec_at(&kvb->closing, struct sess *, i);
        if (c->id == sid)
            s = c;
    }
    return s;
}

/* drops every reference the leases acked; frees a drained closed session */
static void sess_release(struct kvb *kvb, struct sess *s)
{
    uint64_t min_acked = UINT64_MAX;
    for (size_t i = 0; i < s->leases.len; i++) {
        struct lease *l = rkv_vec_at(&s->leases, struct lease, i);
        min_acked = l->acked < min_acked ? l->acked : min_acked;
    }
    size_t keep = 0;
    for (size_t i = 0; i < s->drops.len; i++) {
        struct drop d = *rkv_vec_at(&s->drops, struct drop, i);
        if (d.epoch <= min_acked)
            pool_unref(&kvb->pools[d.pool], d.idx);
        else
            *rkv_vec_at(&s->drops, struct drop, keep++) = d;
    }
    s->drops.len = keep;
    if (s->closed && keep == 0) {
        for (size_t i = 0; i < kvb->closing.len; i++) {
            if (*rkv_vec_at(&kvb->closing, struct sess *, i) == s) {
                *rkv_vec_at(&kvb->closing, struct sess *, i) =
                    *rkv_vec_at(&kvb->closing, struct sess *, kvb->closing.len - 1);
                kvb->closing.len--;
                break;
            }
        }
        sess_destroy(s);
    }
}

/* the table stops naming (pool, idx) as of the current epoch */
static int sess_drop(struct sess *s, uint32_t pool, uint32_t idx)
{
    struct drop d = {s->epoch, pool, idx};
    return rkv_vec_push(&s->drops, &d) ? 0 : RKV_ENOMEM;
}

/* the table keeps its first `keep` entries; the rest are dropped (deferred;
 * room in s->drops reserved by the caller) */
static void sess_drop_tail(struct kvb *kvb, struct sess *s, size_t keep)
{
    for (size_t i = keep; i < s->ents.len; i++) {
        struct ent *e = ENT(s, i);
        if (e->dev != KVB_NONE)
            sess_drop(s, s->gpu, e->dev);
        if (e->host != KVB_NONE)
            sess_drop(s, host_pool(kvb), e->host);
    }
    s->ents.len = keep;
}

/* allocates n blocks at the end of the table, the newest max_dev on the
 * device and the older ones on the host, or none */
static int sess_grow(struct kvb *kvb, struct sess *s, size_t n, uint32_t max_dev)
{
    struct pool *dp = &kvb->pools[s->gpu], *hp = &kvb->pools[host_pool(kvb)];
    size_t n_dev = n < max_dev ? n : max_dev;
    if (n_dev > pool_avail(dp) || n - n_dev > pool_avail(hp))
        return RKV_ENOSPACE;
    if (rkv_vec_reserve(&s->ents, s->ents.len + n))
        return RKV_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        int on_dev = k >= n - n_dev;
        struct ent e = {on_dev ? pool_alloc(dp) : KVB_NONE, on_dev ? KVB_NONE : pool_alloc(hp), 0};
        rkv_vec_push(&s->ents, &e);
    }
    return 0;
}

/* table entries for n_tokens positions */
static size_t blocks_for(const struct kvb *kvb, size_t n_tokens)
{
    return RKV_DIV_UP(n_tokens, kvb->block_tokens) * kvb->n_parts;
}

uint32_t kvb_window_first(const struct kvb *kvb, size_t n_past)
{
    if (!kvb->window || n_past + 1 <= kvb->window)
        return 0;
    return (uint32_t)((n_past + 1 - kvb->window) / kvb->block_tokens);
}

uint32_t kvb_parts(const struct kvb *kvb)
{
    return kvb->n_parts;
}

/* 1 when entries ents[0 .. n_pb*n_parts) hold every local part a step from n_tokens reads
 * among the position blocks before n_tokens */
static int window_live(const struct kvb *kvb, const struct ent *ents, size_t n_pb, size_t n_tokens)
{
    size_t end = RKV_MIN(n_pb, RKV_DIV_UP(n_tokens, kvb->block_tokens));
    for (size_t b = kvb_window_first(kvb, n_tokens); b < end; b++)
        for (uint32_t p = 1; p < kvb->n_parts; p++)
            if (ent_dropped(&ents[b * kvb->n_parts + p]))
                return 0;
    return 1;
}

int kvb_create(const struct kvb_config *cfg, struct kvb **out)
{
    *out = NULL;
    if (cfg->n_gpus == 0 || cfg->n_gpus > KVB_MAX_GPUS || cfg->block_tokens == 0 ||
        cfg->n_parts > KVB_MAX_PARTS || (cfg->n_parts > 1 && cfg->window == 0)) {
        log_error("kvb: need 1..%d gpus, a block size > 0 and at most %d parts, several with a "
                  "window (got %u gpus, %u tokens, %u parts, window %u)",
                  KVB_MAX_GPUS, KVB_MAX_PARTS, cfg->n_gpus, cfg->block_tokens, cfg->n_parts,
                  cfg->window);
        return RKV_EINVAL;
    }
    struct kvb *kvb = calloc(1, sizeof(*kvb));
    if (!kvb)
        return RKV_ENOMEM;
    kvb->n_gpus = cfg->n_gpus;
    kvb->block_tokens = cfg->block_tokens;
    kvb->moves_need_written = cfg->moves_need_written;
    kvb->n_parts = cfg->n_parts ? cfg->n_parts : 1;
    kvb->window = kvb->n_parts > 1 ? cfg->window : 0;
    rkv_map_init(&kvb->live);
    rkv_vec_init(&kvb->closing, sizeof(struct sess *));
    kvb->pools = calloc(cfg->n_gpus + 1, sizeof(*kvb->pools));
    int rc = kvb->pools ? 0 : RKV_ENOMEM;
    for (uint32_t g = 0; rc == 0 && g <= cfg->n_gpus; g++)
        rc = pool_init(&kvb->pools[g], g < cfg->n_gpus ? cfg->dev_blocks[g] : cfg->host_blocks);
    if (rc) {
        kvb_destroy(kvb);
        return rc;
    }
    *out = kvb;
    return 0;
}

void kvb_destroy(struct kvb *kvb)
{
    if (!kvb)
        return;
    size_t it = 0;
    void *v;
    while (rkv_map_next(&kvb->live, &it, NULL, &v))
        sess_destroy(v);
    rkv_map_fini(&kvb->live);
    for (size_t i = 0; i < kvb->closing.len; i++)
        sess_destroy(*rkv_vec_at(&kvb->closing, struct sess *, i));
    rkv_vec_fini(&kvb->closing);
    for (uint32_t g = 0; kvb->pools && g <= kvb->n_gpus; g++)
        pool_fini(&kvb->pools[g]);
    free(kvb->pools);
    free(kvb);
}

enum kvb_residency kvb_entry_residency(struct kvb_entry e)
{
    return (e.dev != KVB_NONE ? KVB_DEVICE : 0) | (e.host != KVB_NONE ? KVB_HOST : 0);
}

/* undoes references taken for a table never shown to a worker */
static void ents_unref_now(struct kvb *kvb, struct sess *s)
{
    for (size_t i = 0; i < s->ents.len; i++) {
        struct ent *e = ENT(s, i);
        if (e->dev != KVB_NONE)
            pool_unref(&kvb->pools[s->gpu], e->dev);
        if (e->host != KVB_NONE)
            pool_unref(&kvb->pools[host_pool(kvb)], e->host);
    }
    s->ents.len = 0;
}

static int session_open(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope,
                        const uint32_t *tokens, size_t n_tokens, uint32_t max_dev, int grow,
                        size_t *n_reused);

int kvb_session_open(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope,
                     const uint32_t *tokens, size_t n_tokens, uint32_t max_dev, size_t *n_reused)
{
    return session_open(kvb, sid, gpu, scope, tokens, n_tokens, max_dev, 1, n_reused);
}

int kvb_session_open_shared(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope,
                            const uint32_t *tokens, size_t n_tokens, size_t *n_reused)
{
    if (!tokens)
        return RKV_EINVAL;
    return session_open(kvb, sid, gpu, scope, tokens, n_tokens, KVB_NONE, 0, n_reused);
}

static int session_open(struct kvb *kvb, uint64_t sid, uint32_t gpu, uint64_t scope,
                        const uint32_t *tokens, size_t n_tokens, uint32_t max_dev, int grow,
                        size_t *n_reused)
{
    uint32_t B = kvb->block_tokens;
    *n_reused = 0;
    if (sid == 0 || gpu >= kvb->n_gpus || max_dev == 0)
        return RKV_EINVAL;
    if (sess_get(kvb, sid))
        return RKV_EBUSY;
    struct sess *s = sess_create(kvb, sid, gpu, scope);
    if (!s || rkv_vec_reserve(&s->tokens, n_tokens ? n_tokens : 1)) {
        if (s)
            sess_destroy(s);
        return RKV_ENOMEM;
    }
    /* without token ids (positions only) nothing can be shared */
    if (tokens)
        memcpy(s->tokens.data, tokens, n_tokens * sizeof(uint32_t));
    else
        memset(s->tokens.data, 0, n_tokens * sizeof(uint32_t));
    s->tokens.len = n_tokens;
    s->n_known = tokens ? n_tokens : 0;
    /* share full blocks while the prefix matches; at least one position is
     * left to compute so the worker gets logits for the last token */
    uint64_t h = scope;
    struct pool *dp = &kvb->pools[gpu], *hp = &kvb->pools[host_pool(kvb)];
    uint32_t P = kvb->n_parts;
    int rc = 0;
    if (rkv_vec_reserve(&s->ents, blocks_for(kvb, n_tokens)))
        rc = RKV_ENOMEM;
    for (size_t b = 0; tokens && rc == 0 && (b + 1) * B < n_tokens; b++) {
        h = chain_hash(h, tokens + b * B, B);
        /* part 0 (the global layers) must be there; a local part may be gone (the window
         * below decides whether the match can use it) */
        struct ent e = {pool_lookup_ref(dp, h), pool_lookup_ref(hp, h), h};
        if (ent_dropped(&e))
            break;
        rkv_vec_push(&s->ents, &e);
        for (uint32_t p = 1; p < P; p++) {
            uint64_t ph = part_hash(h, p);
            struct ent l = {pool_lookup_ref(dp, ph), pool_lookup_ref(hp, ph), ph};
            rkv_vec_push(&s->ents, &l);
        }
    }
    /* a match continues exactly only where its window's local parts are all there: cut it
     * back to the longest such prefix */
    size_t n_pb = s->ents.len / P;
    while (rc == 0 && n_pb && !window_live(kvb, s->ents.data, n_pb, n_pb * B))
        n_pb--;
    for (size_t i = n_pb * P; i < s->ents.len; i++) {
        struct ent *e = ENT(s, i);
        if (e->dev != KVB_NONE)
            pool_unref(dp, e->dev);
        if (e->host != KVB_NONE)
            pool_unref(hp, e->host);
    }
    s->ents.len = RKV_MIN(s->ents.len, n_pb * P);
    size_t reused = n_pb * B;
    if (!grow) /* the shared prefix only: the caller appends the rest */
        s->tokens.len = s->n_known = reused;
    else if (rc == 0)
        rc = sess_grow(kvb, s, blocks_for(kvb, n_tokens) - s->ents.len, max_dev);
    if (rc == 0)
        rc = rkv_map_put(&kvb->live, s->id, s);
    if (rc) {
        ents_unref_now(kvb, s);
        sess_destroy(s);
        return rc;
    }
    s->n_written = reused;
    s->n_published = reused / B; /* the shared blocks are indexed already */
    *n_reused = reused;
    return 0;
}

int kvb_session_fork(struct kvb *kvb, uint64_t parent, uint64_t child, size_t n_tokens,
                     struct kvb_copy *cow, size_t *n_cow)
{
    uint32_t B = kvb->block_tokens;
    struct sess *p = sess_get(kvb, parent);
    *n_cow = 0;
    if (!p)
        return RKV_ENOTFOUND;
    if (child == 0 || n_tokens > p->n_written)
        return RKV_EINVAL; /* only written kv can be shared */
    if (sess_get(kvb, child))
        return RKV_EBUSY;
    uint32_t P = kvb->n_parts;
    size_t full = n_tokens / B * P, part = n_tokens % B;
    if (!window_live(kvb, p->ents.data, p->ents.len / P, n_tokens))
        return RKV_ESTALE;
    if (part && pool_avail(&kvb->pools[p->gpu]) < P)
        return RKV_ENOSPACE;
    struct sess *s = sess_create(kvb, child, p->gpu, p->scope);
    if (!s || rkv_vec_reserve(&s->tokens, n_tokens ? n_tokens : 1) ||
        rkv_vec_reserve(&s->ents, full + P)) {
        if (s)
            sess_destroy(s);
        return RKV_ENOMEM;
    }
    memcpy(s->tokens.data, p->tokens.data, n_tokens * sizeof(uint32_t));
    s->tokens.len = n_tokens;
    for (size_t b = 0; b < full; b++) {
        struct ent e = *ENT(p, b);
        if (e.dev != KVB_NONE)
            kvb->pools[p->gpu].ref[e.dev]++;
        if (e.host != KVB_NONE)
            kvb->pools[host_pool(kvb)].ref[e.host]++;
        rkv_vec_push(&s->ents, &e);
    }
    for (uint32_t q = 0; part && q < P; q++) {
        /* copy-on-write: the split position block's first positions into private blocks
         * (it is inside the window, so none of its parts was dropped) */
        struct ent *src = ENT(p, full + q);
        struct ent e = {pool_alloc(&kvb->pools[p->gpu]), KVB_NONE, 0};
        rkv_vec_push(&s->ents, &e);
        cow[q] =
            (struct kvb_copy){src->dev != KVB_NONE ? KVB_COPY_D2D : KVB_COPY_H2D, p->gpu,
                              src->dev != KVB_NONE ? src->dev : src->host, e.dev, (uint32_t)part};
        *n_cow = q + 1;
    }
    int rc = rkv_map_put(&kvb->live, s->id, s);
    if (rc) {
        ents_unref_now(kvb, s);
        sess_destroy(s);
        *n_cow = 0;
        return rc;
    }
    s->n_written = n_tokens;
    s->n_published = RKV_MIN(full / P, p->n_published);
    s->n_known = n_tokens < p->n_known ? n_tokens : p->n_known;
    return 0;
}

int kvb_session_append(struct kvb *kvb, uint64_t sid, const uint32_t *tokens, size_t n)
{
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    size_t grow = blocks_for(kvb, s->tokens.len + n) - s->ents.len;
    if (rkv_vec_reserve(&s->tokens, s->tokens.len + n) ||
        rkv_vec_reserve(&s->drops, s->drops.len + kvb->n_parts))
        return RKV_ENOMEM;
    int rc = sess_grow(kvb, s, grow, KVB_NONE);
    if (rc)
        return rc;
    /* the partly filled newest position block is written again: a clean host copy of
     * its parts goes stale (demoting them later must copy, not reuse the copy) */
    int changed = grow != 0;
    for (uint32_t p = 0; n && s->tokens.len % kvb->block_tokens && p < kvb->n_parts; p++) {
        struct ent *last = ENT(s, s->tokens.len / kvb->block_tokens * kvb->n_parts + p);
        if (last->host != KVB_NONE && last->dev != KVB_NONE) {
            if (changed >= 0)
                s->epoch = ++kvb->epoch;
            sess_drop(s, host_pool(kvb), last->host);
            last->host = KVB_NONE;
            changed = -1; /* the epoch is new already */
        }
    }
    uint32_t *dst = (uint32_t *)s->tokens.data + s->tokens.len;
    if (tokens)
        memcpy(dst, tokens, n * sizeof(uint32_t));
    else
        memset(dst, 0, n * sizeof(uint32_t));
    if (tokens && s->n_known == s->tokens.len)
        s->n_known += n;
    s->tokens.len += n;
    if (changed > 0)
        s->epoch = ++kvb->epoch;
    sess_release(kvb, s);
    return 0;
}

int kvb_session_know(struct kvb *kvb, uint64_t sid, size_t from, const uint32_t *tokens, size_t n)
{
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    if (from > s->n_known || from >= s->tokens.len || !n)
        return 0; /* a gap before them: the prefix stays where it is */
    size_t end = RKV_MIN(from + n, s->tokens.len);
    if (end <= s->n_known)
        return 0;
    /* positions before n_known keep their ids (published blocks hash them) */
    memcpy((uint32_t *)s->tokens.data + s->n_known, tokens + (s->n_known - from),
           (end - s->n_known) * sizeof(uint32_t));
    s->n_known = end;
    return 0;
}

int kvb_session_truncate(struct kvb *kvb, uint64_t sid, size_t n_tokens, struct kvb_copy *cow,
                         size_t *n_cow)
{
    uint32_t B = kvb->block_tokens, P = kvb->n_parts;
    struct sess *s = sess_get(kvb, sid);
    *n_cow = 0;
    if (!s)
        return RKV_ENOTFOUND;
    if (n_tokens > s->tokens.len)
        return RKV_ERANGE;
    if (s->mv_kind != MV_NONE)
        return RKV_EBUSY;
    if (n_tokens == s->tokens.len)
        return 0;
    if (!window_live(kvb, s->ents.data, s->ents.len / P, n_tokens))
        return RKV_ESTALE;
    struct pool *dp = &kvb->pools[s->gpu];
    size_t keep = blocks_for(kvb, n_tokens), part = n_tokens % B;
    /* the kept partial position block will be written again: each part must be a private
     * device block, else its first positions are copied into one */
    uint32_t n_need = 0;
    for (uint32_t p = 0; part && p < P; p++) {
        struct ent *e = ENT(s, keep - P + p);
        n_need += e->dev == KVB_NONE || dp->ref[e->dev] > 1;
    }
    if (rkv_vec_reserve(&s->drops, s->drops.len + 2 * (s->ents.len - keep) + 2 * P))
        return RKV_ENOMEM;
    if (n_need > pool_avail(dp)) {
        /* no block to copy into yet. the blocks past the kept one go now all the same:
         * once the worker acknowledges this epoch they are free, so a retry finds room (the
         * session's own surplus may be all the device pool has) */
        if (s->ents.len > keep) {
            s->epoch = ++kvb->epoch;
            sess_drop_tail(kvb, s, keep);
            size_t held = keep / P * (size_t)B;
            s->tokens.len = RKV_MIN(s->tokens.len, held);
            s->n_written = RKV_MIN(s->n_written, held);
            s->n_known = RKV_MIN(s->n_known, held);
            s->n_published = RKV_MIN(s->n_published, keep / P);
            sess_release(kvb, s);
        }
        return RKV_ENOSPACE;
    }
    s->epoch = ++kvb->epoch;
    sess_drop_tail(kvb, s, keep);
    for (uint32_t p = 0; part && p < P; p++) {
        struct ent *last = ENT(s, keep - P + p);
        if (last->dev == KVB_NONE || dp->ref[last->dev] > 1) {
            uint32_t d = pool_alloc(dp);
            cow[(*n_cow)++] = (struct kvb_copy){
                last->dev != KVB_NONE ? KVB_COPY_D2D : KVB_COPY_H2D, s->gpu,
                last->dev != KVB_NONE ? last->dev : last->host, d, (uint32_t)part};
            if (last->dev != KVB_NONE)
                sess_drop(s, s->gpu, last->dev);
            last->dev = d;
        } else if (dp->hash[last->dev]) {
            /* private and about to change: no longer what its hash says */
            rkv_map_del(&dp->index, dp->hash[last->dev]);
            dp->hash[last->dev] = 0;
        }
        /* a host copy goes stale once the block is written again */
        if (last->host != KVB_NONE)
            sess_drop(s, host_pool(kvb), last->host);
        last->host = KVB_NONE;
        last->hash = 0;
    }
    s->tokens.len = n_tokens;
    s->n_written = RKV_MIN(s->n_written, n_tokens);
    s->n_known = RKV_MIN(s->n_known, n_tokens);
    s->n_published = RKV_MIN(s->n_published, n_tokens / B);
    sess_release(kvb, s);
    return 0;
}

int kvb_session_written(struct kvb *kvb, uint64_t sid, size_t n_tokens)
{
    uint32_t B = kvb->block_tokens;
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    if (n_tokens > s->tokens.len)
        return RKV_ERANGE;
    if (n_tokens > s->n_written)
        s->n_written = n_tokens;
    const uint32_t *tok = s->tokens.data;
    size_t upto = RKV_MIN(s->n_written, s->n_known);
    uint32_t P = kvb->n_parts;
    for (size_t b = s->n_published; (b + 1) * B <= upto; b++) {
        uint64_t h = chain_hash(b ? ENT(s, (b - 1) * P)->hash : s->scope, tok + b * B, B);
        for (uint32_t p = 0; p < P; p++) {
            struct ent *e = ENT(s, b * P + p);
            e->hash = part_hash(h, p);
            if (e->dev != KVB_NONE)
                pool_publish(&kvb->pools[s->gpu], e->dev, e->hash);
            if (e->host != KVB_NONE)
                pool_publish(&kvb->pools[host_pool(kvb)], e->host, e->hash);
        }
        s->n_published = b + 1;
    }
    return 0;
}

int kvb_session_drop_local(struct kvb *kvb, uint64_t sid, uint32_t first_pb, uint32_t *n_dropped)
{
    uint32_t P = kvb->n_parts, n = 0;
    struct sess *s = sess_get(kvb, sid);
    if (n_dropped)
        *n_dropped = 0;
    if (!s)
        return RKV_ENOTFOUND;
    if (s->mv_kind != MV_NONE)
        return RKV_EBUSY;
    /* the newest position block is never dropped: it is the one being written */
    size_t end = s->ents.len / P ? RKV_MIN((size_t)first_pb, s->ents.len / P - 1) : 0;
    for (size_t i = 0; i < end * P; i++)
        n += i % P && !ent_dropped(ENT(s, i));
    if (n == 0)
        return 0;
    if (rkv_vec_reserve(&s->drops, s->drops.len + 2 * (size_t)n))
        return RKV_ENOMEM;
    s->epoch = ++kvb->epoch;
    for (size_t i = 0; i < end * P; i++) {
        struct ent *e = ENT(s, i);
        if (i % P == 0 || ent_dropped(e))
            continue;
        if (e->dev != KVB_NONE)
            sess_drop(s, s->gpu, e->dev);
        if (e->host != KVB_NONE)
            sess_drop(s, host_pool(kvb), e->host);
        e->dev = e->host = KVB_NONE;
    }
    if (n_dropped)
        *n_dropped = n;
    sess_release(kvb, s);
    return 0;
}

int kvb_session_window_live(const struct kvb *kvb, uint64_t sid, size_t n_tokens)
{
    const struct sess *s = sess_get(kvb, sid);
    return s ? window_live(kvb, s->ents.data, s->ents.len / kvb->n_parts, n_tokens) : 0;
}

int kvb_session_close(struct kvb *kvb, uint64_t sid)
{
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    if (s->mv_kind != MV_NONE)
        kvb_abort(kvb, sid);
    if (!rkv_vec_push(&kvb->closing, &s))
        return RKV_ENOMEM;
    if (rkv_vec_reserve(&s->drops, s->drops.len + 2 * s->ents.len)) {
        kvb->closing.len--;
        return RKV_ENOMEM;
    }
    rkv_map_del(&kvb->live, sid);
    s->epoch = ++kvb->epoch;
    sess_drop_tail(kvb, s, 0);
    s->closed = 1;
    sess_release(kvb, s);
    return 0;
}

int kvb_session_table(const struct kvb *kvb, uint64_t sid, struct kvb_entry *out, size_t cap,
                      size_t *n, uint64_t *epoch)
{
    const struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    for (size_t i = 0; out && i < s->ents.len && i < cap; i++)
        out[i] = (struct kvb_entry){ENT(s, i)->dev, ENT(s, i)->host};
    if (n)
        *n = s->ents.len;
    if (epoch)
        *epoch = s->epoch;
    return 0;
}

int kvb_session_counts(const struct kvb *kvb, uint64_t sid, uint32_t *n_dev, uint32_t *n_host)
{
    const struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    uint32_t d = 0, h = 0;
    for (size_t i = 0; i < s->ents.len; i++) {
        d += ENT(s, i)->dev != KVB_NONE;
        h += ENT(s, i)->dev == KVB_NONE && ENT(s, i)->host != KVB_NONE;
    }
    *n_dev = d;
    *n_host = h;
    return 0;
}

uint32_t kvb_session_gpu(const struct kvb *kvb, uint64_t sid)
{
    const struct sess *s = sess_get(kvb, sid);
    return s ? s->gpu : KVB_NONE;
}

size_t kvb_session_tokens(const struct kvb *kvb, uint64_t sid)
{
    const struct sess *s = sess_get(kvb, sid);
    return s ? s->tokens.len : 0;
}

/* --- moves ------------------------------------------------------------------- */

/* the pool an open move's mv.idx blocks come from */
static uint32_t mv_pool(const struct kvb *kvb, const struct sess *s)
{
    return s->mv_kind == MV_DEMOTE ? host_pool(kvb) : s->mv_kind == MV_REHOME ? s->mv_to : s->gpu;
}

static void mv_release(struct kvb *kvb, struct sess *s)
{
    uint32_t pool = mv_pool(kvb, s);
    for (size_t i = 0; i < s->mv.len; i++) {
        struct mv *m = rkv_vec_at(&s->mv, struct mv, i);
        if (m->idx != KVB_NONE)
            pool_unref(&kvb->pools[pool], m->idx);
        if (m->host != KVB_NONE)
            pool_unref(&kvb->pools[host_pool(kvb)], m->host);
    }
    s->mv.len = 0;
    s->mv_kind = MV_NONE;
}

/* shared by demote and promote: picks n entries, finds or allocates their
 * destination blocks in pool `to` */
static int move_open(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
                     size_t *n_ops, enum mv_kind kind, int parking)
{
    struct sess *s = sess_get(kvb, sid);
    *n_ops = 0;
    if (!s)
        return RKV_ENOTFOUND;
    if (s->mv_kind != MV_NONE)
        return RKV_EBUSY;
    if (cap < n)
        return RKV_EINVAL;
    int demote = kind == MV_DEMOTE;
    uint32_t to = demote ? host_pool(kvb) : s->gpu;
    struct pool *dst = &kvb->pools[to];
    if (rkv_vec_reserve(&s->mv, n))
        return RKV_ENOMEM;
    s->mv_kind = kind;
    /* demote: oldest device blocks, never the newest; promote: newest host-only */
    size_t len = s->ents.len;
    for (size_t k = 0; k < len && s->mv.len < n; k++) {
        uint32_t i = demote ? (uint32_t)k : (uint32_t)(len - 1 - k);
        struct ent *e = ENT(s, i);
        /* a block that a step in flight may still be writing stays on the device
         * (copying it now would copy what is not there yet): every position it
         * holds must be written. the newest, partly filled position block is written
         * next, unless the session is parked (idle: nothing writes it) */
        size_t pb = i / kvb->n_parts, end = RKV_MIN((pb + 1) * kvb->block_tokens, s->tokens.len);
        int writing =
            (kvb->moves_need_written && end > s->n_written) ||
            (!parking && pb == len / kvb->n_parts - 1 && s->tokens.len % kvb->block_tokens != 0);
        if (ent_dropped(e) || (demote ? (e->dev == KVB_NONE || writing) : e->dev != KVB_NONE))
            continue;
        struct mv m = {i, KVB_NONE, KVB_NONE};
        if (!demote || e->host == KVB_NONE) {
            m.idx = pool_lookup_ref(dst, e->hash);
            if (m.idx == KVB_NONE) {
                m.idx = pool_alloc(dst);
                if (m.idx == KVB_NONE) {
                    mv_release(kvb, s);
                    *n_ops = 0;
                    return RKV_ENOSPACE;
                }
                ops[(*n_ops)++] =
                    (struct kvb_copy){demote ? KVB_COPY_D2H : KVB_COPY_H2D, s->gpu,
                                      demote ? e->dev : e->host, m.idx, kvb->block_tokens};
            }
        }
        rkv_vec_push(&s->mv, &m);
    }
    if (s->mv.len < n) {
        mv_release(kvb, s);
        *n_ops = 0;
        return RKV_ERANGE; /* fewer movable blocks than asked */
    }
    return 0;
}

int kvb_demote(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
               size_t *n_ops)
{
    return move_open(kvb, sid, n, ops, cap, n_ops, MV_DEMOTE, 0);
}

int kvb_park(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
             size_t *n_ops)
{
    return move_open(kvb, sid, n, ops, cap, n_ops, MV_DEMOTE, 1);
}

int kvb_promote(struct kvb *kvb, uint64_t sid, uint32_t n, struct kvb_copy *ops, size_t cap,
                size_t *n_ops)
{
    return move_open(kvb, sid, n, ops, cap, n_ops, MV_PROMOTE, 0);
}

/* the entry's block on gpu `to` (shared when indexed there, else a new one
 * copied from its host copy, staged through a host block for a device-only
 * one) or, for an entry going host-only, a host copy of a device-only block */
static int rehome_entry(struct kvb *kvb, struct sess *s, uint32_t i, int on_dev, struct mv *m,
                        struct kvb_copy *ops, size_t *n_ops)
{
    struct pool *tp = &kvb->pools[s->mv_to], *hp = &kvb->pools[host_pool(kvb)];
    struct ent *e = ENT(s, i);
    uint32_t B = kvb->block_tokens;
    if (on_dev && (m->idx = pool_lookup_ref(tp, e->hash)) != KVB_NONE)
        return 0;
    uint32_t src = e->host;
    if (e->host == KVB_NONE) {
        m->host = pool_lookup_ref(hp, e->hash);
        if (m->host == KVB_NONE) {
            if ((m->host = pool_alloc(hp)) == KVB_NONE)
                return RKV_ENOSPACE;
            ops[(*n_ops)++] = (struct kvb_copy){KVB_COPY_D2H, s->gpu, e->dev, m->host, B};
        }
        src = m->host;
    }
    if (!on_dev)
        return 0;
    if ((m->idx = pool_alloc(tp)) == KVB_NONE)
        return RKV_ENOSPACE;
    ops[(*n_ops)++] = (struct kvb_copy){KVB_COPY_H2D, s->mv_to, src, m->idx, B};
    return 0;
}

int kvb_rehome(struct kvb *kvb, uint64_t sid, uint32_t to, uint32_t n_dev, struct kvb_copy *ops,
               size_t cap, size_t *n_ops)
{
    struct sess *s = sess_get(kvb, sid);
    *n_ops = 0;
    if (!s)
        return RKV_ENOTFOUND;
    /* two copies at most for each live entry (dropped local parts move nothing) */
    size_t len = s->ents.len, live = 0;
    for (size_t i = 0; i < len; i++)
        live += !ent_dropped(ENT(s, i));
    if (to >= kvb->n_gpus || to == s->gpu || n_dev > live || cap < 2 * live ||
        (n_dev < kvb->n_parts && s->tokens.len % kvb->block_tokens))
        return RKV_EINVAL;
    if (s->mv_kind != MV_NONE)
        return RKV_EBUSY;
    /* a step in flight may still write: its positions would miss the copy; the newest n_dev
     * live entries go on the device of `to` */
    if (kvb->moves_need_written && s->n_written < s->tokens.len)
        return RKV_EBUSY;
    if (rkv_vec_reserve(&s->mv, len))
        return RKV_ENOMEM;
    s->mv_kind = MV_REHOME;
    s->mv_to = to;
    for (size_t i = 0, k = 0; i < len; i++) {
        if (ent_dropped(ENT(s, i)))
            continue;
        struct mv m = {(uint32_t)i, KVB_NONE, KVB_NONE};
        int rc = rehome_entry(kvb, s, (uint32_t)i, k++ >= live - n_dev, &m, ops, n_ops);
        rkv_vec_push(&s->mv, &m); /* also on failure: mv_release frees what it holds */
        if (rc) {
            mv_release(kvb, s);
            *n_ops = 0;
            return rc;
        }
    }
    return 0;
}

/* a rehome's copies are done: the entries name their new blocks, the old
 * gpu's device blocks go as the workers ack (sessions staying there that
 * share them keep them), the session is on the new gpu */
static int rehome_commit(struct kvb *kvb, struct sess *s, uint64_t *epoch)
{
    struct pool *tp = &kvb->pools[s->mv_to], *hp = &kvb->pools[host_pool(kvb)];
    s->epoch = ++kvb->epoch;
    for (size_t k = 0; k < s->mv.len; k++) {
        struct mv *m = rkv_vec_at(&s->mv, struct mv, k);
        struct ent *e = ENT(s, m->entry);
        if (e->dev != KVB_NONE)
            sess_drop(s, s->gpu, e->dev);
        e->dev = m->idx;
        if (m->host != KVB_NONE) {
            e->host = m->host;
            pool_publish(hp, e->host, e->hash);
        }
        if (e->dev != KVB_NONE)
            pool_publish(tp, e->dev, e->hash);
    }
    /* the workers reading it on the old gpu need their leases only until they
     * ack the move (a worker kept leasing it, e.g. the new gpu's, keeps it) */
    for (size_t i = 0; i < s->leases.len; i++)
        rkv_vec_at(&s->leases, struct lease, i)->retire_at = s->epoch;
    s->gpu = s->mv_to;
    s->mv.len = 0;
    s->mv_kind = MV_NONE;
    if (epoch)
        *epoch = s->epoch;
    sess_release(kvb, s);
    return 0;
}

int kvb_commit(struct kvb *kvb, uint64_t sid, uint64_t *epoch)
{
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    if (s->mv_kind == MV_NONE)
        return RKV_ESTATE;
    if (rkv_vec_reserve(&s->drops, s->drops.len + s->mv.len))
        return RKV_ENOMEM;
    if (s->mv_kind == MV_REHOME)
        return rehome_commit(kvb, s, epoch);
    s->epoch = ++kvb->epoch;
    struct pool *dp = &kvb->pools[s->gpu], *hp = &kvb->pools[host_pool(kvb)];
    for (size_t k = 0; k < s->mv.len; k++) {
        struct mv *m = rkv_vec_at(&s->mv, struct mv, k);
        struct ent *e = ENT(s, m->entry);
        if (s->mv_kind == MV_DEMOTE) {
            if (m->idx != KVB_NONE) {
                e->host = m->idx;
                pool_publish(hp, e->host, e->hash);
            }
            sess_drop(s, s->gpu, e->dev);
            e->dev = KVB_NONE;
        } else {
            e->dev = m->idx;
            pool_publish(dp, e->dev, e->hash);
        }
    }
    s->mv.len = 0;
    s->mv_kind = MV_NONE;
    if (epoch)
        *epoch = s->epoch;
    sess_release(kvb, s);
    return 0;
}

int kvb_abort(struct kvb *kvb, uint64_t sid)
{
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    if (s->mv_kind == MV_NONE)
        return RKV_ESTATE;
    mv_release(kvb, s);
    return 0;
}

int kvb_trim_host_copies(struct kvb *kvb, uint32_t want, uint32_t *dropped)
{
    *dropped = 0;
    size_t it = 0;
    void *v;
    while (*dropped < want && rkv_map_next(&kvb->live, &it, NULL, &v)) {
        struct sess *s = v;
        size_t n = 0;
        /* a session with an open move keeps its table as the move saw it */
        for (size_t i = 0; s->mv_kind == MV_NONE && i < s->ents.len && *dropped + n < want; i++)
            n += ENT(s, i)->dev != KVB_NONE && ENT(s, i)->host != KVB_NONE;
        if (n == 0)
            continue;
        if (rkv_vec_reserve(&s->drops, s->drops.len + n))
            return RKV_ENOMEM;
        s->epoch = ++kvb->epoch;
        for (size_t i = 0; i < s->ents.len && n > 0; i++) {
            struct ent *e = ENT(s, i);
            if (e->dev == KVB_NONE || e->host == KVB_NONE)
                continue;
            sess_drop(s, host_pool(kvb), e->host);
            e->host = KVB_NONE;
            n--;
            (*dropped)++;
        }
        sess_release(kvb, s);
    }
    return 0;
}

/* --- workers ----------------------------------------------------------------- */

static struct lease *lease_find(struct sess *s, uint32_t worker)
{
    for (size_t i = 0; i < s->leases.len; i++) {
        struct lease *l = rkv_vec_at(&s->leases, struct lease, i);
        if (l->worker == worker)
            return l;
    }
    return NULL;
}

static void lease_remove(struct sess *s, struct lease *l)
{
    *l = *rkv_vec_at(&s->leases, struct lease, s->leases.len - 1);
    s->leases.len--;
}

/* a retiring lease whose worker acked the move ends */
static void lease_ack_retire(struct sess *s, struct lease *l)
{
    if (l->retire_at && l->acked >= l->retire_at)
        lease_remove(s, l);
}

/* live and closing sessions, collected first: releasing can free closing ones */
static int collect_sessions(const struct kvb *kvb, struct rkv_vec *all)
{
    rkv_vec_init(all, sizeof(struct sess *));
    size_t it = 0;
    void *v;
    while (rkv_map_next(&kvb->live, &it, NULL, &v))
        if (!rkv_vec_push(all, &v))
            return RKV_ENOMEM;
    for (size_t i = 0; i < kvb->closing.len; i++)
        if (!rkv_vec_push(all, rkv_vec_at(&kvb->closing, struct sess *, i)))
            return RKV_ENOMEM;
    return 0;
}

int kvb_lease(struct kvb *kvb, uint32_t worker, uint64_t sid, uint64_t epoch)
{
    struct sess *s = sess_get(kvb, sid);
    if (!s)
        return RKV_ENOTFOUND;
    /* only the current table: an older one may name blocks already reused */
    if (epoch != s->epoch)
        return RKV_ESTATE;
    struct lease *l = lease_find(s, worker);
    if (l) {
        l->retire_at = 0; /* it reads the session again */
        return RKV_EBUSY;
    }
    struct lease nl = {worker, epoch, 0};
    return rkv_vec_push(&s->leases, &nl) ? 0 : RKV_ENOMEM;
}

int kvb_unlease(struct kvb *kvb, uint32_t worker, uint64_t sid)
{
    struct sess *s = sess_any(kvb, sid);
    struct lease *l = s ? lease_find(s, worker) : NULL;
    if (!l)
        return RKV_ENOTFOUND;
    lease_remove(s, l);
    sess_release(kvb, s);
    return 0;
}

int kvb_ack(struct kvb *kvb, uint32_t worker, uint64_t sid, uint64_t epoch)
{
    struct sess *s = sess_any(kvb, sid);
    struct lease *l = s ? lease_find(s, worker) : NULL;
    if (!l)
        return RKV_ENOTFOUND;
    if (epoch > kvb->epoch)
        return RKV_EINVAL;
    if (epoch > l->acked)
        l->acked = epoch;
    lease_ack_retire(s, l);
    sess_release(kvb, s);
    return 0;
}

uint64_t kvb_epoch(const struct kvb *kvb)
{
    return kvb->epoch;
}
uint32_t kvb_block_tokens(const struct kvb *kvb)
{
    return kvb->block_tokens;
}

int kvb_ack_worker(struct kvb *kvb, uint32_t worker, uint64_t epoch)
{
    if (epoch > kvb->epoch)
        return RKV_EINVAL;
    struct rkv_vec all;
    int rc = collect_sessions(kvb, &all);
    for (size_t i = 0; rc == 0 && i < all.len; i++) {
        struct sess *s = *rkv_vec_at(&all, struct sess *, i);
        struct lease *l = lease_find(s, worker);
        if (l && epoch > l->acked) {
            l->acked = epoch;
            lease_ack_retire(s, l);
            sess_release(kvb, s);
        }
    }
    rkv_vec_fini(&all);
    return rc;
}

int kvb_worker_lost(struct kvb *kvb, uint32_t worker)
{
    struct rkv_vec all;
    int rc = collect_sessions(kvb, &all);
    for (size_t i = 0; rc == 0 && i < all.len; i++) {
        struct sess *s = *rkv_vec_at(&all, struct sess *, i);
        struct lease *l = lease_find(s, worker);
        if (l) {
            lease_remove(s, l);
            sess_release(kvb, s);
        }
    }
    rkv_vec_fini(&all);
    return rc;
}

/* --- accounting -------------------------------------------------------------- */

uint32_t kvb_free_dev(const struct kvb *kvb, uint32_t gpu)
{
    return gpu < kvb->n_gpus ? pool_avail(&kvb->pools[gpu]) : 0;
}

uint32_t kvb_free_host(const struct kvb *kvb)
{
    return pool_avail(&kvb->pools[host_pool(kvb)]);
}

static void sess_count_refs(const struct kvb *kvb, const struct sess *s, uint32_t **want)
{
    for (size_t i = 0; i < s->ents.len; i++) {
        const struct ent *e = ENT(s, i);
        if (e->dev != KVB_NONE)
            want[s->gpu][e->dev]++;
        if (e->host != KVB_NONE)
            want[host_pool(kvb)][e->host]++;
    }
    for (size_t i = 0; i < s->drops.len; i++) {
        const struct drop *d = rkv_vec_at(&s->drops, struct drop, i);
        want[d->pool][d->idx]++;
    }
    uint32_t to = mv_pool(kvb, s);
    for (size_t i = 0; i < s->mv.len; i++) {
        const struct mv *m = rkv_vec_at(&s->mv, struct mv, i);
        if (m->idx != KVB_NONE)
            want[to][m->idx]++;
        if (m->host != KVB_NONE)
            want[host_pool(kvb)][m->host]++;
    }
}

size_t kvb_pending(const struct kvb *kvb)
{
    size_t n = 0, it = 0;
    void *v;
    while (rkv_map_next(&kvb->live, &it, NULL, &v))
        n += ((struct sess *)v)->drops.len;
    for (size_t i = 0; i < kvb->closing.len; i++)
        n += (*rkv_vec_at(&kvb->closing, struct sess *, i))->drops.len;
    return n;
}

size_t kvb_n_sessions(const struct kvb *kvb)
{
    return kvb->live.len;
}

static int check_session_shape(const struct kvb *kvb, const struct sess *s)
{
    if (s->ents.len != blocks_for(kvb, s->tokens.len)) {
        log_error("kvb_check: session %llu has %zu blocks for %zu tokens",
                  (unsigned long long)s->id, s->ents.len, s->tokens.len);
        return RKV_EINTERNAL;
    }
    /* the block being written (a partial last block) is on the device; a
     * full last block (after a fork on a boundary) is read-only, and a parked
     * session (nothing on the device) writes nothing until it is promoted */
    int any_dev = 0;
    uint32_t P = kvb->n_parts;
    for (size_t i = 0; i < s->ents.len; i++) {
        any_dev |= ENT(s, i)->dev != KVB_NONE;
        if (ent_dropped(ENT(s, i)) && (i % P == 0 || i / P + 1 == s->ents.len / P)) {
            log_error("kvb_check: session %llu: entry %zu names no block, yet it is a global "
                      "part or in the newest position block",
                      (unsigned long long)s->id, i);
            return RKV_EINTERNAL;
        }
    }
    for (size_t i = s->ents.len - (s->ents.len ? P : 0); i < s->ents.len; i++) {
        if (s->tokens.len % kvb->block_tokens && any_dev && ENT(s, i)->dev == KVB_NONE) {
            log_error("kvb_check: session %llu: the block being written is not on the device",
                      (unsigned long long)s->id);
            return RKV_EINTERNAL;
        }
    }
    return 0;
}

static int check_pool(const struct pool *p, uint32_t pid, const uint32_t *want)
{
    uint8_t *on_free = calloc(p->n ? p->n : 1, 1);
    int rc = on_free ? 0 : RKV_ENOMEM;
    for (uint32_t k = 0; rc == 0 && k < p->n_free; k++) {
        uint32_t idx = p->free[k];
        if (idx >= p->n || on_free[idx] || p->ref[idx] != 0) {
            log_error("kvb_check: pool %u: block %u on the free list twice or in use", pid, idx);
            rc = RKV_EINTERNAL;
        } else {
            on_free[idx] = 1;
        }
    }
    uint32_t n_lru = 0;
    for (uint32_t idx = p->lru_head; rc == 0 && idx != KVB_NONE; idx = p->lru_next[idx]) {
        if (idx >= p->n || on_free[idx] || p->ref[idx] != 0 || !p->hash[idx] ||
            ++n_lru > p->n_cached) {
            log_error("kvb_check: pool %u: cached block %u is in use, unindexed or listed twice",
                      pid, idx);
            rc = RKV_EINTERNAL;
        } else {
            on_free[idx] = 1;
        }
    }
    if (rc == 0 && n_lru != p->n_cached) {
        log_error("kvb_check: pool %u: %u cached blocks listed, %u counted", pid, n_lru,
                  p->n_cached);
        rc = RKV_EINTERNAL;
    }
    for (uint32_t idx = 0; rc == 0 && idx < p->n; idx++) {
        if (p->ref[idx] != want[idx] || (p->ref[idx] == 0) != on_free[idx]) {
            log_error("kvb_check: pool %u: block %u has %u references, tables hold %u%s", pid, idx,
                      p->ref[idx], want[idx], on_free[idx] ? " (on the free list)" : "");
            rc = RKV_EINTERNAL;
        } else if (p->hash[idx] &&
                   rkv_map_get(&p->index, p->hash[idx]) != (void *)(uintptr_t)(idx + 1)) {
            log_error("kvb_check: pool %u: block %u indexed but not in the index", pid, idx);
            rc = RKV_EINTERNAL;
        }
    }
    size_t it = 0;
    uint64_t key;
    void *v;
    while (rc == 0 && rkv_map_next(&p->index, &it, &key, &v)) {
        uint32_t idx = (uint32_t)((uintptr_t)v - 1);
        if (idx >= p->n || p->hash[idx] != key) {
            log_error("kvb_check: pool %u: index names block %u which is free or rehashed", pid,
                      idx);
            rc = RKV_EINTERNAL;
        }
    }
    free(on_free);
    return rc;
}

int kvb_check(const struct kvb *kvb)
{
    uint32_t np = kvb->n_gpus + 1;
    uint32_t **want = calloc(np, sizeof(*want));
    int rc = want ? 0 : RKV_ENOMEM;
    for (uint32_t p = 0; rc == 0 && p < np; p++)
        if (!(want[p] = calloc(kvb->pools[p].n ? kvb->pools[p].n : 1, sizeof(uint32_t))))
            rc = RKV_ENOMEM;
    size_t it = 0;
    void *v;
    while (rc == 0 && rkv_map_next(&kvb->live, &it, NULL, &v)) {
        sess_count_refs(kvb, v, want);
        rc = check_session_shape(kvb, v);
    }
    for (size_t i = 0; rc == 0 && i < kvb->closing.len; i++)
        sess_count_refs(kvb, *rkv_vec_at(&kvb->closing, struct sess *, i), want);
    for (uint32_t p = 0; rc == 0 && p < np; p++)
        rc = check_pool(&kvb->pools[p], p, want[p]);
    for (uint32_t p = 0; want && p < np; p++)
        free(want[p]);
    free(want);
    return rc;
}
