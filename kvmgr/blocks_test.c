/* blocks_test.c - block allocator: alloc/free, prefix sharing and copy-on-write,
 * demote/promote released only after acks, worker loss, random sequences
 * checked with kvb_check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "kvmgr/blocks.h"

#define B 4 /* positions per block: small so tests cross blocks often */

static struct kvb *make(uint32_t dev, uint32_t host)
{
    struct kvb_config cfg = {0};
    cfg.n_gpus = 2;
    cfg.dev_blocks[0] = dev;
    cfg.dev_blocks[1] = dev;
    cfg.host_blocks = host;
    cfg.block_tokens = B;
    struct kvb *kvb = NULL;
    assert_int_equal(kvb_create(&cfg, &kvb), 0);
    return kvb;
}

static void seq(uint32_t *t, size_t n, uint32_t start)
{
    for (size_t i = 0; i < n; i++)
        t[i] = start + (uint32_t)i;
}

static void table(struct kvb *kvb, uint64_t sid, struct kvb_entry *e, size_t want_n)
{
    size_t n = 0;
    assert_int_equal(kvb_session_table(kvb, sid, e, 64, &n, NULL), 0);
    assert_int_equal(n, want_n);
}

static void test_alloc_free(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 8);
    uint32_t t[10];
    size_t reused;
    seq(t, 10, 100);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 5); /* 10 tokens = 3 blocks */
    assert_int_equal(kvb_free_dev(kvb, 1), 8);
    struct kvb_entry e[64];
    table(kvb, 1, e, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(e[i].dev, (uint32_t)i);
        assert_int_equal(kvb_entry_residency(e[i]), KVB_DEVICE);
    }
    /* 2 more tokens fit the third block; 1 more needs a fourth */
    assert_int_equal(kvb_session_append(kvb, 1, t, 2), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 5);
    assert_int_equal(kvb_session_append(kvb, 1, t, 1), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 4);
    assert_int_equal(kvb_session_tokens(kvb, 1), 13);
    assert_int_equal(kvb_check(kvb), 0);
    /* errors: used id, unknown gpu, no room */
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 1, KVB_NONE, &reused), RKV_EBUSY);
    assert_int_equal(kvb_session_open(kvb, 2, 5, 0, t, 1, KVB_NONE, &reused), RKV_EINVAL);
    uint32_t big[40];
    seq(big, 40, 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, big, 40, KVB_NONE, &reused), RKV_ENOSPACE);
    assert_int_equal(kvb_free_dev(kvb, 0), 4);
    assert_int_equal(kvb_session_close(kvb, 1), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 8); /* no leases: released at once */
    /* a prompt split: the newest block on the device, the older two on the host */
    assert_int_equal(kvb_session_open(kvb, 3, 0, 0, t, 10, 1, &reused), 0);
    table(kvb, 3, e, 3);
    assert_int_equal(kvb_entry_residency(e[0]), KVB_HOST);
    assert_int_equal(kvb_entry_residency(e[1]), KVB_HOST);
    assert_int_equal(kvb_entry_residency(e[2]), KVB_DEVICE);
    assert_int_equal(kvb_free_host(kvb), 6);
    assert_int_equal(kvb_session_open(kvb, 4, 0, 0, t, 10, 0, &reused), RKV_EINVAL);
    assert_int_equal(kvb_session_close(kvb, 3), 0);
    assert_int_equal(kvb_free_host(kvb), 8);
    assert_int_equal(kvb_session_close(kvb, 1), RKV_ENOTFOUND);
    assert_int_equal(kvb_n_sessions(kvb), 0);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_prefix_sharing(void **state)
{
    (void)state;
    struct kvb *kvb = make(16, 16);
    uint32_t a[14], b[11];
    size_t reused;
    seq(a, 14, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, a, 14, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 12);
    /* nothing shared before the kv is written */
    seq(b, 11, 1);
    b[9] = 999;
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, b, 11, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(kvb_session_close(kvb, 2), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 14), 0);
    /* b matches a's blocks 0 and 1 (tokens 0..7); block 2 differs at 9 */
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, b, 11, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    struct kvb_entry ea[64], eb[64];
    table(kvb, 1, ea, 4);
    table(kvb, 2, eb, 3);
    assert_int_equal(eb[0].dev, ea[0].dev);
    assert_int_equal(eb[1].dev, ea[1].dev);
    assert_int_not_equal(eb[2].dev, ea[2].dev);
    assert_int_equal(kvb_free_dev(kvb, 0), 11); /* one new block */
    /* another gpu shares nothing */
    assert_int_equal(kvb_session_open(kvb, 3, 1, 0, b, 11, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    /* a prompt equal to a's 12 written tokens reuses 2 blocks, not 3: the last
     * position must be computed */
    assert_int_equal(kvb_session_open(kvb, 4, 0, 0, a, 12, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    assert_int_equal(kvb_check(kvb), 0);
    /* the shared blocks outlive their first owner */
    assert_int_equal(kvb_session_close(kvb, 1), 0);
    table(kvb, 2, eb, 3);
    assert_int_equal(kvb_check(kvb), 0);
    uint32_t c[9];
    seq(c, 9, 1);
    assert_int_equal(kvb_session_open(kvb, 5, 0, 0, c, 9, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    for (uint64_t s = 2; s <= 5; s++)
        assert_int_equal(kvb_session_close(kvb, s), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 16);
    assert_int_equal(kvb_free_dev(kvb, 1), 16);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* blocks are shared only within a scope (rkvd's API key): another scope with the same
 * tokens finds nothing, a fork keeps its parent's scope */
static void test_prefix_scopes(void **state)
{
    (void)state;
    struct kvb *kvb = make(16, 16);
    uint32_t a[10];
    size_t reused;
    seq(a, 10, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 7, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 10), 0);
    /* the same tokens under scopes 0 and 8: nothing found */
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(kvb_session_open(kvb, 3, 0, 8, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    /* scope 7 finds its blocks */
    assert_int_equal(kvb_session_open(kvb, 4, 0, 7, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    /* what scope 8 writes is its own: 8 finds it, 7's blocks stay apart */
    assert_int_equal(kvb_session_written(kvb, 3, 10), 0);
    assert_int_equal(kvb_session_open(kvb, 5, 0, 8, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    struct kvb_entry e1[64], e3[64], e4[64], e5[64];
    table(kvb, 1, e1, 3);
    table(kvb, 3, e3, 3);
    table(kvb, 4, e4, 3);
    table(kvb, 5, e5, 3);
    assert_int_equal(e4[0].dev, e1[0].dev);
    assert_int_equal(e5[0].dev, e3[0].dev);
    assert_int_not_equal(e3[0].dev, e1[0].dev);
    /* a fork of scope 7 publishes under 7 */
    struct kvb_copy cow[1];
    size_t n_cow;
    assert_int_equal(kvb_session_fork(kvb, 1, 6, 10, cow, &n_cow), 0);
    assert_int_equal(kvb_session_written(kvb, 6, 10), 0);
    for (uint64_t s = 1; s <= 5; s++)
        assert_int_equal(kvb_session_close(kvb, s), 0);
    assert_int_equal(kvb_session_open(kvb, 7, 0, 7, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    assert_int_equal(kvb_session_open(kvb, 8, 0, 0, a, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(kvb_check(kvb), 0);
    for (uint64_t s = 6; s <= 8; s++)
        assert_int_equal(kvb_session_close(kvb, s), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 16);
    kvb_destroy(kvb);
}

/* a step prepared ahead appends its last position before its token is sampled: the
 * next prep brings the id (kvb_session_know), and only then is that block shareable */
static void test_tokens_known_later(void **state)
{
    (void)state;
    struct kvb *kvb = make(16, 16);
    uint32_t a[12], junk[4] = {900, 901, 902, 903};
    size_t reused;
    seq(a, 12, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, a, 5, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_append(kvb, 1, NULL, 3), 0); /* positions 5..7, ids unknown */
    assert_int_equal(kvb_session_written(kvb, 1, 8), 0);
    /* block 1 (positions 4..7) is written but its ids are not known: not shared */
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, a, 9, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 4);
    assert_int_equal(kvb_session_close(kvb, 2), 0);
    /* a gap before them (position 5 still unknown): ignored */
    assert_int_equal(kvb_session_know(kvb, 1, 6, a + 6, 2), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 8), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, a, 9, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 4);
    assert_int_equal(kvb_session_close(kvb, 2), 0);
    /* known from position 5 on (and past what it holds: cut to 8); ids before n_known
     * keep what they were */
    assert_int_equal(kvb_session_know(kvb, 1, 0, junk, 4), 0);
    assert_int_equal(kvb_session_know(kvb, 1, 5, a + 5, 7), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 8), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, a, 9, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    struct kvb_entry ea[64], eb[64];
    table(kvb, 1, ea, 2);
    table(kvb, 2, eb, 3);
    assert_int_equal(eb[1].dev, ea[1].dev);
    /* unknown sessions */
    assert_int_equal(kvb_session_know(kvb, 77, 0, a, 1), RKV_ENOTFOUND);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_fork_cow(void **state)
{
    (void)state;
    struct kvb *kvb = make(16, 16);
    uint32_t a[10];
    size_t reused, n_cow;
    struct kvb_copy cow[1];
    seq(a, 10, 7);
    assert_int_equal(kvb_session_open(kvb, 1, 1, 0, a, 10, KVB_NONE, &reused), 0);
    /* only written kv can be shared */
    assert_int_equal(kvb_session_fork(kvb, 1, 2, 6, cow, &n_cow), RKV_EINVAL);
    assert_int_equal(kvb_session_written(kvb, 1, 10), 0);
    assert_int_equal(kvb_session_fork(kvb, 1, 2, 6, cow, &n_cow), 0);
    struct kvb_entry ea[64], eb[64];
    table(kvb, 1, ea, 3);
    table(kvb, 2, eb, 2);
    assert_int_equal(eb[0].dev, ea[0].dev);
    /* the split block: 2 positions copied into a private block */
    assert_int_equal(n_cow, 1);
    assert_int_equal(cow[0].kind, KVB_COPY_D2D);
    assert_int_equal(cow[0].gpu, 1);
    assert_int_equal(cow[0].src, ea[1].dev);
    assert_int_equal(cow[0].dst, eb[1].dev);
    assert_int_equal(cow[0].n_tokens, 2);
    assert_int_not_equal(eb[1].dev, ea[1].dev);
    assert_int_equal(kvb_session_tokens(kvb, 2), 6);
    /* the child diverges; the parent is untouched */
    uint32_t x[3] = {50, 51, 52};
    assert_int_equal(kvb_session_append(kvb, 2, x, 3), 0);
    table(kvb, 1, ea, 3);
    table(kvb, 2, eb, 3);
    /* a fork on a block boundary copies nothing */
    assert_int_equal(kvb_session_fork(kvb, 1, 3, 8, cow, &n_cow), 0);
    assert_int_equal(n_cow, 0);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_close(kvb, 1), 0);
    assert_int_equal(kvb_session_close(kvb, 3), 0);
    assert_int_equal(kvb_session_close(kvb, 2), 0);
    assert_int_equal(kvb_free_dev(kvb, 1), 16);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_demote_promote_acks(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 8);
    uint32_t t[20];
    size_t reused, n_ops;
    uint64_t epoch, e2;
    struct kvb_copy ops[8];
    struct kvb_entry e[64];
    seq(t, 20, 1);
    assert_int_equal(kvb_session_open(kvb, 9, 0, 0, t, 20, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_table(kvb, 9, e, 64, NULL, &epoch), 0);
    assert_int_equal(kvb_lease(kvb, 1, 9, epoch), 0);
    assert_int_equal(kvb_lease(kvb, 1, 9, epoch), RKV_EBUSY);
    assert_int_equal(kvb_free_dev(kvb, 0), 3);

    /* demote 2: the two oldest blocks, copied to host blocks 0 and 1 */
    assert_int_equal(kvb_demote(kvb, 9, 2, ops, 8, &n_ops), 0);
    assert_int_equal(n_ops, 2);
    assert_int_equal(ops[0].kind, KVB_COPY_D2H);
    assert_int_equal(ops[0].src, e[0].dev);
    assert_int_equal(ops[0].dst, 0);
    assert_int_equal(ops[1].src, e[1].dev);
    assert_int_equal(ops[1].dst, 1);
    assert_int_equal(kvb_demote(kvb, 9, 1, ops, 8, &n_ops), RKV_EBUSY);
    /* before the commit the table is unchanged */
    struct kvb_entry now[64];
    uint64_t ep_now;
    assert_int_equal(kvb_session_table(kvb, 9, now, 64, NULL, &ep_now), 0);
    assert_int_equal(ep_now, epoch);
    assert_int_equal(kvb_entry_residency(now[0]), KVB_DEVICE);
    assert_int_equal(kvb_free_host(kvb), 6);
    assert_int_equal(kvb_check(kvb), 0);

    assert_int_equal(kvb_commit(kvb, 9, &e2), 0);
    assert_int_equal(e2, epoch + 1);
    assert_int_equal(kvb_session_table(kvb, 9, now, 64, NULL, NULL), 0);
    assert_int_equal(kvb_entry_residency(now[0]), KVB_HOST);
    assert_int_equal(now[0].host, 0);
    uint32_t nd, nh;
    assert_int_equal(kvb_session_counts(kvb, 9, &nd, &nh), 0);
    assert_int_equal(nd, 3);
    assert_int_equal(nh, 2);
    /* the worker still reads the old table: device blocks not reused yet */
    assert_int_equal(kvb_free_dev(kvb, 0), 3);
    assert_int_equal(kvb_pending(kvb), 2);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_ack(kvb, 1, 9, epoch), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 3);
    assert_int_equal(kvb_ack(kvb, 1, 9, e2 + 1000), RKV_EINVAL);
    assert_int_equal(kvb_ack(kvb, 1, 9, e2), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 5);
    assert_int_equal(kvb_pending(kvb), 0);

    /* promote 1: the newest host-only block, its host copy kept */
    assert_int_equal(kvb_promote(kvb, 9, 1, ops, 8, &n_ops), 0);
    assert_int_equal(n_ops, 1);
    assert_int_equal(ops[0].kind, KVB_COPY_H2D);
    assert_int_equal(ops[0].src, 1);
    assert_int_equal(kvb_commit(kvb, 9, &e2), 0);
    assert_int_equal(kvb_session_table(kvb, 9, now, 64, NULL, NULL), 0);
    assert_int_equal(kvb_entry_residency(now[1]), KVB_BOTH);
    assert_int_equal(kvb_free_host(kvb), 6);
    /* demoting a block with a clean host copy copies nothing */
    assert_int_equal(kvb_demote(kvb, 9, 1, ops, 8, &n_ops), 0);
    assert_int_equal(n_ops, 0);
    assert_int_equal(kvb_commit(kvb, 9, &e2), 0);
    assert_int_equal(kvb_session_table(kvb, 9, now, 64, NULL, NULL), 0);
    assert_int_equal(kvb_entry_residency(now[1]), KVB_HOST);
    /* abort frees the destinations and leaves the table */
    assert_int_equal(kvb_demote(kvb, 9, 2, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_free_host(kvb), 4);
    assert_int_equal(kvb_abort(kvb, 9), 0);
    assert_int_equal(kvb_free_host(kvb), 6);
    assert_int_equal(kvb_abort(kvb, 9), RKV_ESTATE);
    /* the newest block leaves the device only once it is full */
    if (kvb_session_tokens(kvb, 9) % B != 0) {
        assert_int_equal(kvb_demote(kvb, 9, 3, ops, 8, &n_ops), RKV_ERANGE);
    } else {
        assert_int_equal(kvb_demote(kvb, 9, 4, ops, 8, &n_ops), RKV_ERANGE);
        assert_int_equal(kvb_demote(kvb, 9, 3, ops, 8, &n_ops), 0);
        assert_int_equal(kvb_abort(kvb, 9), 0);
    }
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_close(kvb, 9), 0);
    /* the closed session's blocks wait for the lease holder */
    assert_int_equal(kvb_free_host(kvb), 6);
    assert_int_equal(kvb_unlease(kvb, 1, 9), 0);
    assert_int_equal(kvb_free_host(kvb), 8);
    assert_int_equal(kvb_free_dev(kvb, 0), 8);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_host_full(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 1);
    uint32_t t[16];
    size_t reused, n_ops;
    struct kvb_copy ops[8];
    seq(t, 16, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 16, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_demote(kvb, 1, 2, ops, 8, &n_ops), RKV_ENOSPACE);
    assert_int_equal(n_ops, 0);
    assert_int_equal(kvb_free_host(kvb), 1);
    assert_int_equal(kvb_demote(kvb, 1, 2, ops, 1, &n_ops), RKV_EINVAL); /* ops too small */
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* a cut into a block that must be copied while the device pool is full (the session's own
 * blocks past the cut are all it could use): refused for now, but those blocks go, so once
 * the worker acknowledges the epoch the retry finds room (it used to refuse forever) */
static void test_truncate_full_pool(void **state)
{
    (void)state;
    struct kvb *kvb = make(4, 8);
    uint32_t t[16];
    size_t reused, n_cow, n_ops;
    struct kvb_copy cow[1], ops[4];
    struct kvb_entry e[8];
    seq(t, 16, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 8, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_demote(kvb, 1, 1, ops, 4, &n_ops), 0); /* block 0 to the host */
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_session_append(kvb, 1, t + 8, 8), 0); /* blocks 1-3 on the device */
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, NULL, 4, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 0);
    uint64_t ep;
    assert_int_equal(kvb_session_table(kvb, 1, e, 8, &n_ops, &ep), 0);
    assert_int_equal(kvb_entry_residency(e[0]), KVB_HOST);
    assert_int_equal(kvb_lease(kvb, 0, 1, ep), 0);
    assert_int_equal(kvb_session_truncate(kvb, 1, 2, cow, &n_cow), RKV_ENOSPACE);
    assert_int_equal(n_cow, 0);
    assert_int_equal(kvb_session_tokens(kvb, 1), 4); /* the host block's positions stay */
    assert_int_equal(kvb_free_dev(kvb, 0), 0);       /* until the worker acknowledges */
    assert_int_equal(kvb_ack_worker(kvb, 0, kvb_epoch(kvb)), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 3);
    assert_int_equal(kvb_session_truncate(kvb, 1, 2, cow, &n_cow), 0);
    assert_int_equal(n_cow, 1);
    assert_int_equal(cow[0].kind, KVB_COPY_H2D);
    assert_int_equal(cow[0].n_tokens, 2);
    assert_int_equal(kvb_session_tokens(kvb, 1), 2);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_truncate(void **state)
{
    (void)state;
    struct kvb *kvb = make(16, 16);
    uint32_t t[14];
    size_t reused, n_cow, n_ops;
    struct kvb_copy cow[1], ops[4];
    struct kvb_entry e1[8], e2[8];
    seq(t, 14, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 14, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 14), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, t, 10, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    assert_int_equal(kvb_free_dev(kvb, 0), 11);
    /* into session 1's private, published third block: kept, unpublished */
    assert_int_equal(kvb_session_truncate(kvb, 1, 9, cow, &n_cow), 0);
    assert_int_equal(n_cow, 0);
    table(kvb, 1, e1, 3);
    assert_int_equal(kvb_free_dev(kvb, 0), 12);
    assert_int_equal(kvb_session_tokens(kvb, 1), 9);
    uint32_t u[12];
    seq(u, 12, 1);
    assert_int_equal(kvb_session_open(kvb, 3, 0, 0, u, 12, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8); /* block 2 is no longer offered */
    assert_int_equal(kvb_session_close(kvb, 3), 0);
    /* into session 2's shared second block: copied first */
    assert_int_equal(kvb_session_truncate(kvb, 2, 6, cow, &n_cow), 0);
    assert_int_equal(n_cow, 1);
    table(kvb, 1, e1, 3);
    table(kvb, 2, e2, 2);
    assert_int_equal(cow[0].kind, KVB_COPY_D2D);
    assert_int_equal(cow[0].src, e1[1].dev);
    assert_int_equal(cow[0].dst, e2[1].dev);
    assert_int_equal(cow[0].n_tokens, 2);
    assert_int_equal(e2[0].dev, e1[0].dev);
    /* into a host-only block: brought back to the device by the copy */
    assert_int_equal(kvb_session_append(kvb, 1, t, 5), 0); /* 14 positions */
    assert_int_equal(kvb_demote(kvb, 1, 2, ops, 4, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    table(kvb, 1, e1, 4);
    assert_int_equal(kvb_session_truncate(kvb, 1, 7, cow, &n_cow), 0);
    assert_int_equal(n_cow, 1);
    assert_int_equal(cow[0].kind, KVB_COPY_H2D);
    assert_int_equal(cow[0].src, e1[1].host);
    assert_int_equal(cow[0].n_tokens, 3);
    table(kvb, 1, e1, 2);
    assert_int_equal(kvb_entry_residency(e1[1]), KVB_DEVICE);
    assert_int_equal(kvb_session_truncate(kvb, 1, 8, cow, &n_cow), RKV_ERANGE);
    assert_int_equal(kvb_check(kvb), 0);
    /* positions without token ids are never shared */
    assert_int_equal(kvb_session_open(kvb, 4, 0, 0, NULL, 9, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_append(kvb, 4, NULL, 3), 0);
    assert_int_equal(kvb_session_written(kvb, 4, 12), 0);
    assert_int_equal(kvb_session_open(kvb, 5, 0, 0, u, 12, KVB_NONE, &reused), 0);
    /* session 1's first block, and its old second block: no table names it
     * any more, but it is cached with its written prefix and revived */
    assert_int_equal(reused, 8);
    for (uint64_t sid = 1; sid <= 5; sid++)
        kvb_session_close(kvb, sid);
    assert_int_equal(kvb_free_dev(kvb, 0), 16);
    assert_int_equal(kvb_free_host(kvb), 16);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* the wire acks one epoch per worker: every table it was sent up to then */
static void test_ack_worker(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 8);
    uint32_t t[12];
    size_t reused, n_ops;
    uint64_t e1, e2, last;
    struct kvb_copy ops[4];
    seq(t, 12, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 12, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, t, 8, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_table(kvb, 1, NULL, 0, NULL, &e1), 0);
    assert_int_equal(kvb_session_table(kvb, 2, NULL, 0, NULL, &e2), 0);
    assert_true(e2 > e1); /* one counter over all sessions */
    assert_int_equal(kvb_lease(kvb, 3, 1, e1), 0);
    assert_int_equal(kvb_lease(kvb, 3, 2, e2), 0);
    assert_int_equal(kvb_demote(kvb, 1, 1, ops, 4, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_demote(kvb, 2, 1, ops, 4, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 2, &last), 0);
    assert_int_equal(kvb_pending(kvb), 2);
    assert_int_equal(kvb_ack_worker(kvb, 3, last + 1), RKV_EINVAL);
    assert_int_equal(kvb_ack_worker(kvb, 3, last - 1), 0); /* session 1's change only */
    assert_int_equal(kvb_pending(kvb), 1);
    assert_int_equal(kvb_ack_worker(kvb, 3, last), 0);
    assert_int_equal(kvb_pending(kvb), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 5);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_trim_host_copies(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 2);
    uint32_t t[16], dropped;
    size_t reused, n_ops;
    uint64_t epoch;
    struct kvb_copy ops[8];
    seq(t, 16, 1);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 12, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_demote(kvb, 1, 2, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_promote(kvb, 1, 2, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, &epoch), 0);
    /* two clean copies fill the host; a third block has nowhere to go */
    assert_int_equal(kvb_free_host(kvb), 0);
    assert_int_equal(kvb_session_append(kvb, 1, t, 4), 0);
    assert_int_equal(kvb_demote(kvb, 1, 3, ops, 8, &n_ops), RKV_ENOSPACE);
    assert_int_equal(kvb_session_table(kvb, 1, NULL, 0, NULL, &epoch), 0);
    assert_int_equal(kvb_lease(kvb, 4, 1, epoch), 0);
    assert_int_equal(kvb_trim_host_copies(kvb, 1, &dropped), 0);
    assert_int_equal(dropped, 1);
    struct kvb_entry e[8];
    table(kvb, 1, e, 4);
    assert_int_equal(kvb_entry_residency(e[0]), KVB_DEVICE);
    assert_int_equal(kvb_entry_residency(e[1]), KVB_BOTH);
    assert_int_equal(kvb_free_host(kvb), 0); /* worker 4 may still read it */
    assert_int_equal(kvb_ack(kvb, 4, 1, epoch + 1), 0);
    assert_int_equal(kvb_free_host(kvb), 1);
    assert_int_equal(kvb_demote(kvb, 1, 2, ops, 8, &n_ops), 0);
    assert_int_equal(n_ops, 1); /* block 0 only: block 1 kept its copy */
    assert_int_equal(ops[0].src, e[0].dev);
    assert_int_equal(kvb_free_host(kvb), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_trim_host_copies(kvb, 5, &dropped), 0);
    assert_int_equal(dropped, 0);
    kvb_destroy(kvb);
}

static void test_worker_lost(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 8);
    uint32_t t[12];
    size_t reused, n_ops;
    uint64_t epoch, e2;
    struct kvb_copy ops[8];
    seq(t, 12, 1);
    assert_int_equal(kvb_session_open(kvb, 5, 0, 0, t, 12, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_table(kvb, 5, NULL, 0, NULL, &epoch), 0);
    assert_int_equal(kvb_lease(kvb, 1, 5, epoch), 0);
    assert_int_equal(kvb_lease(kvb, 2, 5, epoch), 0);
    assert_int_equal(kvb_demote(kvb, 5, 1, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 5, &e2), 0);
    /* an old table can no longer be leased */
    assert_int_equal(kvb_lease(kvb, 3, 5, epoch), RKV_ESTATE);
    assert_int_equal(kvb_ack(kvb, 1, 5, e2), 0);
    assert_int_equal(kvb_pending(kvb), 1); /* worker 2 may still read it */
    assert_int_equal(kvb_free_dev(kvb, 0), 5);
    assert_int_equal(kvb_worker_lost(kvb, 2), 0);
    assert_int_equal(kvb_pending(kvb), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 6);
    assert_int_equal(kvb_ack(kvb, 2, 5, e2), RKV_ENOTFOUND);
    /* a restarted worker leases the current table again */
    assert_int_equal(kvb_lease(kvb, 2, 5, e2), 0);
    assert_int_equal(kvb_session_close(kvb, 5), 0);
    assert_int_equal(kvb_pending(kvb), 3);
    assert_int_equal(kvb_worker_lost(kvb, 1), 0);
    assert_int_equal(kvb_worker_lost(kvb, 2), 0);
    assert_int_equal(kvb_pending(kvb), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 8);
    assert_int_equal(kvb_free_host(kvb), 8);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* --- random operation sequences ------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static uint32_t below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(rng_next(s) % n);
}

/* successes of the interesting operations: the random runs must reach them */
static uint64_t n_shared, n_cow, n_moved, n_released;

static void random_op(struct kvb *kvb, uint64_t *rng, uint64_t *next_sid)
{
    uint32_t t[32];
    struct kvb_copy ops[16];
    size_t reused, n_ops;
    /* mostly recent sessions, which are likely still open */
    uint64_t back = below(rng, 8);
    uint64_t sid = *next_sid > back + 1 ? *next_sid - 1 - back : 1;
    uint32_t worker = below(rng, 3);
    uint64_t epoch;
    /* prompts from a small alphabet of prefixes so sharing happens */
    uint32_t base = below(rng, 3) * 1000;
    switch (below(rng, 13)) {
    case 0:
    case 1: {
        size_t n = 1 + below(rng, 24);
        seq(t, n, base);
        if (below(rng, 2))
            t[below(rng, (uint32_t)n)] = 7;
        uint32_t max_dev = below(rng, 2) ? KVB_NONE : 1 + below(rng, 3);
        /* two tenants in one pool: scope 0 mostly, 5 now and then */
        uint32_t gpu = below(rng, 2);
        uint64_t scope = below(rng, 4) ? 0 : 5;
        int rc = kvb_session_open(kvb, (*next_sid)++, gpu, scope, t, n, max_dev, &reused);
        assert_true(rc == 0 || rc == RKV_ENOSPACE);
        n_shared += rc == 0 && reused > 0;
        break;
    }
    case 2: {
        size_t n = 1 + below(rng, 6);
        seq(t, n, base);
        int rc = kvb_session_append(kvb, sid, t, n);
        assert_true(rc == 0 || rc == RKV_ENOSPACE || rc == RKV_ENOTFOUND);
        if (rc == 0 && below(rng, 2))
            kvb_session_written(kvb, sid, kvb_session_tokens(kvb, sid));
        break;
    }
    case 3:
        if (kvb_session_tokens(kvb, sid) && below(rng, 2)) {
            assert_int_equal(kvb_session_written(kvb, sid, kvb_session_tokens(kvb, sid)), 0);
        } else if (kvb_session_tokens(kvb, sid)) {
            size_t nc;
            int rc = kvb_session_truncate(
                kvb, sid, below(rng, (uint32_t)kvb_session_tokens(kvb, sid) + 1), ops, &nc);
            assert_true(rc == 0 || rc == RKV_ENOSPACE || rc == RKV_EBUSY);
            n_cow += rc == 0 && nc == 1;
        }
        break;
    case 4: {
        size_t nc;
        size_t n = below(rng, (uint32_t)kvb_session_tokens(kvb, sid) + 1);
        int rc = kvb_session_fork(kvb, sid, (*next_sid)++, n, ops, &nc);
        assert_true(rc == 0 || rc == RKV_ENOSPACE || rc == RKV_ENOTFOUND || rc == RKV_EINVAL);
        n_cow += rc == 0 && nc == 1;
        break;
    }
    case 5:
    case 6: {
        uint32_t n = 1 + below(rng, 4);
        int rc = below(rng, 2) ? kvb_demote(kvb, sid, n, ops, 16, &n_ops)
                               : kvb_promote(kvb, sid, n, ops, 16, &n_ops);
        assert_true(rc == 0 || rc == RKV_ENOSPACE || rc == RKV_ENOTFOUND || rc == RKV_EBUSY ||
                    rc == RKV_ERANGE);
        if (rc == 0 && below(rng, 3))
            n_moved += kvb_commit(kvb, sid, NULL) == 0;
        break;
    }
    case 7:
        if (below(rng, 3))
            n_moved += kvb_commit(kvb, sid, NULL) == 0;
        else
            kvb_abort(kvb, sid);
        break;
    case 8: kvb_session_close(kvb, sid); break;
    case 9:
    case 12:
        if (kvb_session_table(kvb, sid, NULL, 0, NULL, &epoch) == 0)
            kvb_lease(kvb, worker, sid, epoch);
        break;
    case 10:
        if (kvb_session_table(kvb, sid, NULL, 0, NULL, &epoch) == 0) {
            size_t before = kvb_pending(kvb);
            if (below(rng, 2))
                kvb_ack(kvb, worker, sid, epoch - below(rng, 2));
            else
                assert_int_equal(kvb_ack_worker(kvb, worker, epoch), 0);
            n_released += kvb_pending(kvb) < before;
        } else
            kvb_unlease(kvb, worker, sid);
        break;
    case 11: {
        size_t before = kvb_pending(kvb);
        uint32_t dropped;
        if (below(rng, 4) == 0)
            kvb_worker_lost(kvb, worker);
        else if (below(rng, 3) == 0)
            assert_int_equal(kvb_trim_host_copies(kvb, 1 + below(rng, 3), &dropped), 0);
        else
            kvb_unlease(kvb, worker, sid);
        n_released += kvb_pending(kvb) < before;
        break;
    }
    }
}

/* a partly filled block brought back to the device keeps a host copy (BOTH);
 * writing more positions into it makes that copy stale, so parking it again
 * must copy instead of trusting the old copy */
static void test_written_block_loses_host_copy(void **state)
{
    (void)state;
    struct kvb *kvb = make(8, 8);
    size_t reused;
    struct kvb_copy ops[8];
    size_t n_ops;
    assert_int_equal(kvb_session_open(kvb, 3, 0, 0, NULL, B + 2, KVB_NONE, &reused), 0);
    /* park everything, newest (partial) block included */
    assert_int_equal(kvb_park(kvb, 3, 2, ops, 8, &n_ops), 0);
    assert_int_equal(n_ops, 2);
    assert_int_equal(kvb_commit(kvb, 3, NULL), 0);
    /* back to the device: BOTH */
    assert_int_equal(kvb_promote(kvb, 3, 2, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 3, NULL), 0);
    struct kvb_entry e[4];
    table(kvb, 3, e, 2);
    assert_int_equal(kvb_entry_residency(e[1]), KVB_BOTH);
    /* one more position lands in block 1: its host copy is dropped */
    assert_int_equal(kvb_session_append(kvb, 3, NULL, 1), 0);
    table(kvb, 3, e, 2);
    assert_int_equal(kvb_entry_residency(e[0]), KVB_BOTH);
    assert_int_equal(kvb_entry_residency(e[1]), KVB_DEVICE);
    /* parking now copies block 1 (block 0's clean copy is reused) */
    assert_int_equal(kvb_park(kvb, 3, 2, ops, 8, &n_ops), 0);
    assert_int_equal(n_ops, 1);
    assert_int_equal(ops[0].src, e[1].dev);
    assert_int_equal(kvb_commit(kvb, 3, NULL), 0);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_close(kvb, 3), 0);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* a finished session's written blocks stay cached: the next session with the
 * same prefix maps them; allocation evicts cached blocks only when nothing
 * else is free, oldest first */
static void test_prefix_cache_survives_close(void **state)
{
    (void)state;
    struct kvb *kvb = make(4, 4);
    uint32_t t[16];
    size_t reused;
    seq(t, 16, 100);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 8, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 8), 0);
    assert_int_equal(kvb_session_close(kvb, 1), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 4); /* cached blocks count as free */
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, t, 12, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_close(kvb, 2), 0);
    /* a session that needs every block evicts the cache */
    uint32_t other[16];
    seq(other, 16, 900);
    assert_int_equal(kvb_session_open(kvb, 3, 0, 0, other, 16, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 0);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_close(kvb, 3), 0);
    assert_int_equal(kvb_session_open(kvb, 4, 0, 0, t, 8, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0); /* evicted */
    assert_int_equal(kvb_session_close(kvb, 4), 0);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* with moves_need_written, a block a step may still be writing does not move:
 * copying it before the step ends would lose what the step writes */
static void test_unwritten_blocks_stay(void **state)
{
    (void)state;
    struct kvb_config cfg = {0};
    cfg.n_gpus = 1;
    cfg.dev_blocks[0] = 8;
    cfg.host_blocks = 8;
    cfg.block_tokens = B;
    cfg.moves_need_written = 1;
    struct kvb *kvb;
    assert_int_equal(kvb_create(&cfg, &kvb), 0);
    size_t reused, n_ops;
    struct kvb_copy ops[8];
    /* a 3-block prefill in flight: nothing written yet */
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, NULL, 3 * B, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_demote(kvb, 1, 1, ops, 8, &n_ops), RKV_ERANGE);
    /* the step finished: its blocks may go (the newest, full, too) */
    assert_int_equal(kvb_session_written(kvb, 1, 3 * B), 0);
    assert_int_equal(kvb_demote(kvb, 1, 3, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    /* two more positions being written: their block stays */
    assert_int_equal(kvb_session_append(kvb, 1, NULL, 2), 0);
    assert_int_equal(kvb_park(kvb, 1, 1, ops, 8, &n_ops), RKV_ERANGE);
    assert_int_equal(kvb_session_written(kvb, 1, 3 * B + 2), 0);
    assert_int_equal(kvb_park(kvb, 1, 1, ops, 8, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_session_close(kvb, 1), 0);
    kvb_destroy(kvb);
}

/* a session moves to gpu 1 through the host pool; what it shares stays for the others */
static void test_rehome(void **state)
{
    (void)state;
    struct kvb_config cfg = {0};
    cfg.n_gpus = 2;
    cfg.dev_blocks[0] = cfg.dev_blocks[1] = 8;
    cfg.host_blocks = 8;
    cfg.block_tokens = B;
    cfg.moves_need_written = 1;
    struct kvb *kvb;
    assert_int_equal(kvb_create(&cfg, &kvb), 0);
    uint32_t t[3 * B];
    seq(t, 3 * B, 100);
    size_t reused, n_ops;
    struct kvb_copy ops[16];
    /* 1: three full blocks on gpu 0; 2 shares the first two, then a partial block */
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 3 * B, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_rehome(kvb, 1, 1, 3, ops, 16, &n_ops), RKV_EBUSY); /* unwritten */
    assert_int_equal(kvb_session_written(kvb, 1, 3 * B), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, t, 2 * B + 2, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 2 * B);
    assert_int_equal(kvb_session_written(kvb, 2, 2 * B + 2), 0);
    struct kvb_entry e1[3], e2[3];
    table(kvb, 2, e2, 3);
    uint64_t ep;
    assert_int_equal(kvb_session_table(kvb, 2, NULL, 0, NULL, &ep), 0);
    assert_int_equal(kvb_lease(kvb, 0, 2, ep), 0);
    uint32_t free0 = kvb_free_dev(kvb, 0), free1 = kvb_free_dev(kvb, 1);
    /* refused: the same gpu, too few ops, a partial newest block left without a device */
    assert_int_equal(kvb_rehome(kvb, 2, 0, 3, ops, 16, &n_ops), RKV_EINVAL);
    assert_int_equal(kvb_rehome(kvb, 2, 1, 3, ops, 5, &n_ops), RKV_EINVAL);
    assert_int_equal(kvb_rehome(kvb, 2, 1, 0, ops, 16, &n_ops), RKV_EINVAL);
    /* 2 goes to gpu 1 whole: three device-only blocks, each staged through a host block */
    assert_int_equal(kvb_rehome(kvb, 2, 1, 3, ops, 16, &n_ops), 0);
    assert_int_equal(n_ops, 6);
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(ops[2 * k].kind, KVB_COPY_D2H);
        assert_int_equal(ops[2 * k].gpu, 0);
        assert_int_equal(ops[2 * k].src, e2[k].dev);
        assert_int_equal(ops[2 * k + 1].kind, KVB_COPY_H2D);
        assert_int_equal(ops[2 * k + 1].gpu, 1);
        assert_int_equal(ops[2 * k + 1].src, ops[2 * k].dst);
    }
    assert_int_equal(kvb_rehome(kvb, 2, 1, 3, ops, 16, &n_ops), RKV_EBUSY); /* one open */
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_commit(kvb, 2, NULL), 0);
    assert_int_equal(kvb_session_gpu(kvb, 2), 1);
    assert_int_equal(kvb_check(kvb), 0);
    table(kvb, 2, e2, 3);
    for (size_t k = 0; k < 3; k++)
        assert_int_equal(kvb_entry_residency(e2[k]), KVB_BOTH);
    assert_int_equal(kvb_free_dev(kvb, 1), free1 - 3);
    /* 1 still reads its blocks on gpu 0; 2's private block there goes once worker 0 acks */
    table(kvb, 1, e1, 3);
    assert_int_equal(kvb_entry_residency(e1[0]), KVB_DEVICE);
    assert_int_equal(kvb_free_dev(kvb, 0), free0);
    assert_int_equal(kvb_ack_worker(kvb, 0, kvb_epoch(kvb)), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), free0 + 1);
    /* worker 0 acked the move: its lease is gone, so what 2 gives up on gpu 1 (where
     * nobody has leased it yet) returns at once */
    assert_int_equal(kvb_demote(kvb, 2, 1, ops, 16, &n_ops), 0);
    assert_int_equal(n_ops, 0); /* a clean host copy: nothing to copy */
    assert_int_equal(kvb_commit(kvb, 2, NULL), 0);
    assert_int_equal(kvb_free_dev(kvb, 1), free1 - 2);
    assert_int_equal(kvb_promote(kvb, 2, 1, ops, 16, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 2, NULL), 0);
    /* worker 1 reads it from now on: its lease protects the blocks from here */
    assert_int_equal(kvb_session_table(kvb, 2, NULL, 0, NULL, &ep), 0);
    assert_int_equal(kvb_lease(kvb, 1, 2, ep), 0);
    /* 1 follows: its first two blocks are indexed on gpu 1 now (2 published them), so
     * they are shared, not copied; its third goes host-only (n_dev 1 keeps the newest) */
    assert_int_equal(kvb_rehome(kvb, 1, 1, 2, ops, 16, &n_ops), 0);
    assert_int_equal(n_ops, 2); /* block 2: D2H, H2D; blocks 0 and 1: shared */
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    table(kvb, 1, e1, 3);
    table(kvb, 2, e2, 3);
    assert_int_equal(kvb_entry_residency(e1[0]), KVB_HOST);
    assert_int_equal(e1[0].host, e2[0].host);
    assert_int_equal(e1[1].dev, e2[1].dev);
    assert_int_equal(kvb_check(kvb), 0);
    /* no room on gpu 0 for a way back: nothing changes */
    uint32_t u[8 * B];
    seq(u, 8 * B, 500);
    assert_int_equal(kvb_session_open(kvb, 3, 0, 0, u, 8 * B, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 3, 8 * B), 0);
    assert_int_equal(kvb_rehome(kvb, 1, 0, 3, ops, 16, &n_ops), RKV_ENOSPACE);
    assert_int_equal(kvb_session_gpu(kvb, 1), 1);
    assert_int_equal(kvb_check(kvb), 0);
    for (uint64_t sid = 1; sid <= 3; sid++)
        assert_int_equal(kvb_session_close(kvb, sid), 0);
    assert_int_equal(kvb_worker_lost(kvb, 0), 0);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 8);
    kvb_destroy(kvb);
}

static void test_random_sequences(void **state)
{
    (void)state;
    uint64_t rng = 0x5eed;
    for (int run = 0; run < 300; run++) {
        struct kvb *kvb = make(6 + below(&rng, 20), 4 + below(&rng, 20));
        uint64_t next_sid = 1;
        for (int op = 0; op < 200; op++) {
            random_op(kvb, &rng, &next_sid);
            assert_int_equal(kvb_check(kvb), 0);
        }
        /* everything closed and every worker gone: every block is free */
        for (uint64_t s = 1; s < next_sid; s++)
            kvb_session_close(kvb, s);
        for (uint32_t w = 0; w < 3; w++)
            kvb_worker_lost(kvb, w);
        assert_int_equal(kvb_pending(kvb), 0);
        assert_int_equal(kvb_n_sessions(kvb), 0);
        assert_int_equal(kvb_check(kvb), 0);
        kvb_destroy(kvb);
    }
    print_message("shared %llu cow %llu moved %llu released-on-ack %llu\n",
                  (unsigned long long)n_shared, (unsigned long long)n_cow,
                  (unsigned long long)n_moved, (unsigned long long)n_released);
    assert_true(n_shared > 100 && n_cow > 100 && n_moved > 300 && n_released > 100);
}

/* sliding windows: 3 parts a position block (the global layers, two local ones), a window of
 * 6 positions. Dead local parts go as the worker acks, moves skip them, a cut-back past the
 * window is refused, and a prefix match keeps only what its window finds */
static struct kvb *make_parts_on(uint32_t n_gpus, uint32_t dev, uint32_t host,
                                 uint32_t block_tokens, uint32_t n_parts, uint32_t window)
{
    struct kvb_config cfg = {0};
    cfg.n_gpus = n_gpus;
    for (uint32_t g = 0; g < n_gpus; g++)
        cfg.dev_blocks[g] = dev;
    cfg.host_blocks = host;
    cfg.block_tokens = block_tokens;
    cfg.n_parts = n_parts;
    cfg.window = window;
    struct kvb *kvb = NULL;
    assert_int_equal(kvb_create(&cfg, &kvb), 0);
    return kvb;
}

static struct kvb *make_parts(uint32_t dev, uint32_t host, uint32_t block_tokens, uint32_t n_parts,
                              uint32_t window)
{
    return make_parts_on(1, dev, host, block_tokens, n_parts, window);
}

/* a session with dead local parts dropped moves to another gpu: its live entries alone, two
 * copies each at most (through the host), with room for that and no more */
static void test_window_rehome(void **state)
{
    (void)state;
    struct kvb *kvb = make_parts_on(2, 32, 30, B, 3, 6);
    uint32_t t[20], d, h, dropped;
    size_t reused, n_ops;
    struct kvb_copy ops[64];
    struct kvb_entry e[16];
    seq(t, 20, 900);
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 20, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 20), 0);
    assert_int_equal(kvb_session_drop_local(kvb, 1, 2, &dropped), 0);
    assert_int_equal(dropped, 4);
    assert_int_equal(kvb_session_counts(kvb, 1, &d, &h), 0);
    assert_int_equal(d + h, 11); /* of 15 entries */
    assert_int_equal(kvb_rehome(kvb, 1, 1, d + h, ops, 2 * (d + h) - 1, &n_ops), RKV_EINVAL);
    assert_int_equal(kvb_rehome(kvb, 1, 1, d + h, ops, 2 * (d + h), &n_ops), 0);
    assert_int_equal(n_ops, 2 * (d + h)); /* each live entry: out to the host, in to gpu 1 */
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_session_gpu(kvb, 1), 1);
    table(kvb, 1, e, 15);
    for (int i = 0; i < 15; i++) {
        int gone = i < 6 && i % 3 != 0;
        assert_int_equal(e[i].dev == KVB_NONE && e[i].host == KVB_NONE, gone);
        assert_int_equal(e[i].dev != KVB_NONE, !gone);
    }
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

static void test_window_parts(void **state)
{
    (void)state;
    struct kvb *kvb = make_parts(32, 30, B, 3, 6);
    uint32_t t[24], d, h, dropped;
    size_t reused, n_cow, n_ops;
    struct kvb_copy ops[64];
    struct kvb_entry e[64];
    uint64_t epoch;
    seq(t, 24, 500);
    assert_int_equal(kvb_parts(kvb), 3);
    assert_int_equal(kvb_window_first(kvb, 5), 0);
    assert_int_equal(kvb_window_first(kvb, 20), 3); /* (20 + 1 - 6) / 4 */
    /* 20 positions: 5 position blocks of 3 parts */
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 20, KVB_NONE, &reused), 0);
    table(kvb, 1, e, 15);
    assert_int_equal(kvb_free_dev(kvb, 0), 17);
    assert_int_equal(kvb_session_table(kvb, 1, NULL, 0, NULL, &epoch), 0);
    assert_int_equal(kvb_lease(kvb, 0, 1, epoch), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 20), 0);
    /* local parts of position blocks 0 and 1 are dead; the blocks wait for the ack */
    assert_int_equal(kvb_session_drop_local(kvb, 1, 2, &dropped), 0);
    assert_int_equal(dropped, 4);
    assert_int_equal(kvb_session_drop_local(kvb, 1, 2, &dropped), 0);
    assert_int_equal(dropped, 0);
    table(kvb, 1, e, 15);
    for (int i = 0; i < 15; i++) {
        int gone = i < 6 && i % 3 != 0;
        assert_int_equal(e[i].dev == KVB_NONE && e[i].host == KVB_NONE, gone);
    }
    assert_int_equal(kvb_session_counts(kvb, 1, &d, &h), 0);
    assert_int_equal(d, 11);
    assert_int_equal(h, 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 17);
    assert_int_equal(kvb_check(kvb), 0);
    assert_int_equal(kvb_ack(kvb, 0, 1, kvb_epoch(kvb)), 0);
    assert_int_equal(kvb_free_dev(kvb, 0), 21); /* indexed: in the prefix cache */
    assert_int_equal(kvb_check(kvb), 0);
    /* the window of 8 reads position blocks 0 and 1: gone, so no cut-back there */
    assert_int_equal(kvb_session_window_live(kvb, 1, 20), 1);
    assert_int_equal(kvb_session_window_live(kvb, 1, 8), 0);
    assert_int_equal(kvb_session_window_live(kvb, 1, 0), 1);
    assert_int_equal(kvb_session_truncate(kvb, 1, 8, ops, &n_cow), RKV_ESTALE);
    assert_int_equal(kvb_session_tokens(kvb, 1), 20);
    /* a cut-back inside the window is exact: 18 keeps 5 position blocks */
    assert_int_equal(kvb_session_truncate(kvb, 1, 18, ops, &n_cow), 0);
    assert_int_equal(n_cow, 0);
    table(kvb, 1, e, 15);
    /* moves count and skip dropped parts: park every live block, bring them back */
    assert_int_equal(kvb_park(kvb, 1, 12, ops, 64, &n_ops), RKV_ERANGE);
    assert_int_equal(kvb_park(kvb, 1, 11, ops, 64, &n_ops), 0);
    assert_int_equal(n_ops, 11);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_session_counts(kvb, 1, &d, &h), 0);
    assert_int_equal(d, 0);
    assert_int_equal(h, 11);
    assert_int_equal(kvb_promote(kvb, 1, 11, ops, 64, &n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    assert_int_equal(kvb_session_counts(kvb, 1, &d, &h), 0);
    assert_int_equal(d, 11);
    assert_int_equal(h, 0); /* host copies kept: BOTH counts as device */
    assert_int_equal(kvb_ack(kvb, 0, 1, kvb_epoch(kvb)), 0);
    assert_int_equal(kvb_check(kvb), 0);
    /* a prefix match while the dead parts sit in the prefix cache revives them */
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, t, 9, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 8);
    table(kvb, 2, e, 9);
    for (int i = 0; i < 9; i++)
        assert_int_not_equal(e[i].dev == KVB_NONE && e[i].host == KVB_NONE, 1);
    assert_int_equal(kvb_session_close(kvb, 2), 0);
    /* evict the cache: a session of unrelated tokens takes every free device block */
    uint32_t u[40];
    seq(u, 40, 9000);
    uint32_t free_now = kvb_free_dev(kvb, 0);
    assert_int_equal(free_now % 3, 0);
    assert_int_equal(kvb_session_open(kvb, 3, 0, 0, u, free_now / 3 * B, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_close(kvb, 3), 0);
    assert_int_equal(kvb_check(kvb), 0);
    /* now position blocks 0 and 1 have only their global parts: a prompt whose window
     * needs them finds nothing it can use ... */
    assert_int_equal(kvb_session_open(kvb, 4, 0, 0, t, 9, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(kvb_session_close(kvb, 4), 0);
    /* ... and one of 17 positions shares 16: its window starts at position block 2 */
    assert_int_equal(kvb_session_open(kvb, 5, 0, 0, t, 17, KVB_NONE, &reused), 0);
    assert_int_equal(reused, 16);
    table(kvb, 5, e, 15);
    for (int i = 0; i < 15; i++)
        assert_int_equal(e[i].dev == KVB_NONE && e[i].host == KVB_NONE, i < 6 && i % 3 != 0);
    assert_int_equal(kvb_check(kvb), 0);
    /* a fork whose window was dropped is refused; inside it, a split block copies 3 parts */
    assert_int_equal(kvb_session_written(kvb, 5, 16), 0);
    assert_int_equal(kvb_session_fork(kvb, 5, 6, 8, ops, &n_cow), RKV_ESTALE);
    assert_int_equal(kvb_session_fork(kvb, 5, 6, 14, ops, &n_cow), 0);
    assert_int_equal(n_cow, 3);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

/* Gemma 3 270M's shape (18 layers, 3 global: 6 parts; a window of 512) at 32k positions with
 * 256-position blocks: after kvmgr's drop (the window of the written positions and one
 * position block more) the session holds 128 global and 15 local blocks, under a quarter of
 * the 128 x 6 parts of the all-global layout */
static void test_window_32k(void **state)
{
    (void)state;
    struct kvb *kvb = make_parts(800, 800, 256, 6, 512);
    size_t reused;
    uint32_t d, h, dropped;
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, NULL, 32768, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 32768), 0);
    assert_int_equal(kvb_window_first(kvb, 32768), 126);
    assert_int_equal(kvb_session_drop_local(kvb, 1, 125, &dropped), 0);
    assert_int_equal(dropped, 125 * 5);
    assert_int_equal(kvb_session_counts(kvb, 1, &d, &h), 0);
    assert_int_equal(d + h, 128 + 3 * 5);
    assert_true((d + h) * 4 <= 128 * 6);
    assert_int_equal(kvb_session_window_live(kvb, 1, 32768), 1);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free),
        cmocka_unit_test(test_prefix_sharing),
        cmocka_unit_test(test_prefix_scopes),
        cmocka_unit_test(test_tokens_known_later),
        cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_demote_promote_acks),
        cmocka_unit_test(test_host_full),
        cmocka_unit_test(test_worker_lost),
        cmocka_unit_test(test_trim_host_copies),
        cmocka_unit_test(test_ack_worker),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_random_sequences),
        cmocka_unit_test(test_truncate_full_pool),
        cmocka_unit_test(test_written_block_loses_host_copy),
        cmocka_unit_test(test_prefix_cache_survives_close),
        cmocka_unit_test(test_unwritten_blocks_stay),
        cmocka_unit_test(test_rehome),
        cmocka_unit_test(test_window_parts),
        cmocka_unit_test(test_window_rehome),
        cmocka_unit_test(test_window_32k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
