/* migrate_test.c - plan -> allocator -> pools end to end: block contents
 * survive demotion and promotion, acks gate reuse, drained load returns home. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "kvmgr/migrate.h"

#define BT   4  /* positions per block */
#define BB   64 /* block bytes: 2 slices x 4 positions x 8 bytes */
#define DEV  8  /* device blocks */
#define HOST 32

/* a stand-in for a gpu's copy engines: "device" memory from malloc, copies queued on their
 * lanes and done at the wait, the lanes in reverse order (host -> device before device ->
 * host), so a pass that needed one direction's copies before the other's reads wrong bytes.
 * It also notes a session whose table changed while its copies were still queued */
#define MAX_QUEUED 256
struct engine {
    uint8_t *dev_base;
    struct kvb *kvb;
    struct {
        int lane;
        void *dst;
        const void *src;
        size_t n;
    } q[MAX_QUEUED];
    size_t nq;
    uint64_t epochs[4]; /* sessions 1..3 when the first copy of a batch was queued */
    int waits, sync_copies, queued, early_commits;
};

static uint64_t epoch_of(struct kvb *kvb, uint64_t sid)
{
    uint64_t e = 0;
    return kvb_session_table(kvb, sid, NULL, 0, NULL, &e) == 0 ? e : 0;
}

static int eng_alloc(void *ctx, uint32_t gpu, size_t bytes, void **dptr, uint8_t *ipc)
{
    (void)gpu;
    struct engine *f = ctx;
    *dptr = f->dev_base = calloc(1, bytes);
    memset(ipc, 0, KVPOOL_IPC_BYTES);
    return *dptr ? 0 : RKV_ENOMEM;
}

static void eng_free(void *ctx, uint32_t gpu, void *dptr)
{
    (void)ctx, (void)gpu;
    free(dptr);
}

static int eng_register(void *ctx, void *base, size_t bytes)
{
    (void)ctx, (void)base, (void)bytes;
    return 0;
}

static void eng_unregister(void *ctx, void *base)
{
    (void)ctx, (void)base;
}

static int eng_copy(void *ctx, uint32_t gpu, void *dst, const void *src, size_t bytes)
{
    (void)gpu;
    ((struct engine *)ctx)->sync_copies++;
    memcpy(dst, src, bytes);
    return 0;
}

static int eng_copy_async(void *ctx, uint32_t gpu, int lane, void *dst, const void *src,
                          size_t bytes)
{
    (void)gpu;
    struct engine *f = ctx;
    if (f->nq == MAX_QUEUED)
        return RKV_ENOSPACE;
    if (f->nq == 0)
        for (uint64_t sid = 1; sid <= 3; sid++)
            f->epochs[sid] = epoch_of(f->kvb, sid);
    f->q[f->nq].lane = lane, f->q[f->nq].dst = dst, f->q[f->nq].src = src;
    f->q[f->nq++].n = bytes;
    f->queued++;
    return 0;
}

static int eng_copy_wait(void *ctx, uint32_t gpu)
{
    (void)gpu;
    struct engine *f = ctx;
    f->waits++;
    if (f->nq)
        for (uint64_t sid = 1; sid <= 3; sid++)
            f->early_commits += epoch_of(f->kvb, sid) != f->epochs[sid];
    for (int lane = KVPOOL_LANE_D2D; lane >= KVPOOL_LANE_D2H; lane--)
        for (size_t i = 0; i < f->nq; i++)
            if (f->q[i].lane == lane)
                memcpy(f->q[i].dst, f->q[i].src, f->q[i].n);
    f->nq = 0;
    return 0;
}

struct rig {
    uint32_t host_blocks;
    struct kvb *kvb;
    struct kvpool *dev[1];
    struct kvpool *host;
    struct plan *prev;
    struct engine *eng; /* queued copies on a stand-in gpu; NULL: shared memory pools */
    struct kvpool_gpu_ops ops;
};

/* queued: the device pool is a stand-in gpu's (struct engine) */
static void rig_init_mode(struct rig *r, uint32_t host_blocks, int queued)
{
    memset(r, 0, sizeof(*r));
    r->host_blocks = host_blocks;
    struct kvb_config kc = {1, {DEV}, host_blocks, BT};
    assert_int_equal(kvb_create(&kc, &r->kvb), 0);
    const struct kvpool_gpu_ops *ops = NULL;
    if (queued) {
        r->eng = calloc(1, sizeof(*r->eng));
        assert_non_null(r->eng);
        r->eng->kvb = r->kvb;
        r->ops = (struct kvpool_gpu_ops){r->eng,         eng_alloc, eng_free,       eng_register,
                                         eng_unregister, eng_copy,  eng_copy_async, eng_copy_wait};
        ops = &r->ops;
    }
    char name[64];
    snprintf(name, sizeof(name), "/rkv-test-%d-mdev", (int)getpid());
    struct kvpool_config pc = {queued ? KVPOOL_DEVICE_CUDA : KVPOOL_DEVICE_SHM,
                               0,
                               queued ? NULL : name,
                               BB,
                               DEV,
                               BT,
                               2,
                               ops};
    assert_int_equal(kvpool_create(&pc, &r->dev[0]), 0);
    snprintf(name, sizeof(name), "/rkv-test-%d-mhost", (int)getpid());
    pc = (struct kvpool_config){KVPOOL_HOST, 0, name, BB, host_blocks, BT, 2, ops};
    assert_int_equal(kvpool_create(&pc, &r->host), 0);
}

static void rig_init(struct rig *r, uint32_t host_blocks)
{
    rig_init_mode(r, host_blocks, 0);
}

static void rig_fini(struct rig *r)
{
    plan_destroy(r->prev);
    kvpool_destroy(r->dev[0]);
    kvpool_destroy(r->host);
    kvb_destroy(r->kvb);
    free(r->eng);
}

/* device block idx as this process sees it */
static uint8_t *dev_block(struct rig *r, uint32_t idx)
{
    return r->eng ? r->eng->dev_base + (size_t)idx * BB : kvpool_block(r->dev[0], idx);
}

static uint8_t pattern(uint64_t sid, size_t block)
{
    return (uint8_t)(sid * 16 + block + 1);
}

/* what the worker does: writes each block's kv where the table says */
static void write_kv(struct rig *r, uint64_t sid)
{
    struct kvb_entry e[32];
    size_t n;
    assert_int_equal(kvb_session_table(r->kvb, sid, e, 32, &n, NULL), 0);
    for (size_t b = 0; b < n; b++) {
        if (e[b].dev != KVB_NONE)
            memset(dev_block(r, e[b].dev), pattern(sid, b), BB);
        if (e[b].host != KVB_NONE)
            memset(kvpool_block(r->host, e[b].host), pattern(sid, b), BB);
    }
}

/* every copy of every block still holds its pattern; returns device blocks */
static uint32_t check_kv(struct rig *r, uint64_t sid)
{
    struct kvb_entry e[32];
    size_t n;
    uint32_t dev = 0;
    assert_int_equal(kvb_session_table(r->kvb, sid, e, 32, &n, NULL), 0);
    for (size_t b = 0; b < n; b++) {
        uint8_t want[BB];
        memset(want, pattern(sid, b), BB);
        if (e[b].dev != KVB_NONE)
            assert_memory_equal(dev_block(r, e[b].dev), want, BB);
        if (e[b].host != KVB_NONE)
            assert_memory_equal(kvpool_block(r->host, e[b].host), want, BB);
        dev += e[b].dev != KVB_NONE;
    }
    assert_int_equal(kvb_check(r->kvb), 0);
    return dev;
}

static const struct plan *replan(struct rig *r, const uint64_t *ids, const uint32_t *need, size_t n)
{
    struct plan_gpu g = {0};
    g.vram_target = DEV * BB;
    g.pcie_h2d_gbps = 50;
    struct plan_session ss[8];
    for (size_t i = 0; i < n; i++) {
        memset(&ss[i], 0, sizeof(ss[i]));
        ss[i].id = ids[i];
        ss[i].n_blocks = need[i];
        ss[i].active = 1;
        ss[i].last_use = i;
        ss[i].cur_tactic = PLAN_WAIT;
        if (mig_session_state(r->kvb, ids[i], &ss[i]) == 0)
            ss[i].cur_tactic = ss[i].cur_host ? PLAN_WINDOW : PLAN_RESIDENT;
    }
    struct plan_input in;
    plan_input_init(&in);
    in.block_bytes = BB;
    in.host_budget = r->host_blocks * BB;
    in.n_gpus = 1;
    in.gpus = &g;
    in.n_sessions = n;
    in.sessions = ss;
    struct plan *p = NULL;
    assert_int_equal(plan_compute(&in, r->prev, &p), 0);
    plan_destroy(r->prev);
    r->prev = p;
    return p;
}

/* state: NULL, or an int that says the copies are queued on a stand-in gpu */
static void test_spill_and_return(void **state)
{
    int queued = *state ? *(int *)*state : 0;
    struct rig r;
    rig_init_mode(&r, HOST, queued);
    uint32_t tok[16];
    for (int i = 0; i < 16; i++)
        tok[i] = (uint32_t)i;
    size_t reused;
    uint64_t ids[3] = {1, 2, 3};
    uint32_t need[3] = {3, 3, 3};
    assert_int_equal(kvb_session_open(r.kvb, 1, 0, 0, tok, 10, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_open(r.kvb, 2, 0, 0, tok + 1, 10, KVB_NONE, &reused), 0);
    write_kv(&r, 1);
    write_kv(&r, 2);
    /* session 3 arrives: 9 blocks wanted, 8 on the device; cap 2, the two
     * spare blocks stay with the sessions holding them */
    const struct plan *p = replan(&r, ids, need, 3);
    assert_int_equal(plan_get_summary(p)->gpu[0].window_cap, 2);
    assert_int_equal(plan_find(p, 3)->n_dev, 2);
    struct mig_stats st;
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.sessions_moved, 0);
    /* it prefills its oldest block straight into host memory */
    assert_int_equal(kvb_session_open(r.kvb, 3, 0, 0, tok + 2, 10, plan_find(p, 3)->n_dev, &reused),
                     0);
    write_kv(&r, 3);
    assert_int_equal(check_kv(&r, 3), 2);
    assert_int_equal(kvb_free_dev(r.kvb, 0), 0);

    /* session 1 grows a block: one of its blocks moves to the host first */
    need[0] = 4;
    p = replan(&r, ids, need, 3);
    assert_int_equal(plan_find(p, 1)->n_dev, 3);
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.blocks_demoted, 1);
    assert_int_equal(st.copies, 1);
    assert_int_equal(check_kv(&r, 1), 2); /* the copy holds the same bytes */
    assert_int_equal(kvb_session_append(r.kvb, 1, tok, 4), 0);
    write_kv(&r, 1);
    uint32_t dev_total = 0;
    for (int i = 0; i < 3; i++) {
        uint32_t d = check_kv(&r, ids[i]);
        assert_int_equal(d, plan_find(p, ids[i])->n_dev);
        dev_total += d;
    }
    assert_int_equal(dev_total, DEV);

    /* load drains: session 3 ends, session 1 comes back to the device */
    assert_int_equal(kvb_session_close(r.kvb, 3), 0);
    p = replan(&r, ids, need, 2);
    assert_int_equal(plan_find(p, 1)->tactic, PLAN_RESIDENT);
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.blocks_promoted, 1);
    assert_int_equal(check_kv(&r, 1), 4);
    assert_int_equal(check_kv(&r, 2), 3);
    /* a replan with nothing changed moves nothing */
    p = replan(&r, ids, need, 2);
    assert_int_equal(plan_get_summary(p)->n_moves, 0);
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.sessions_moved, 0);
    if (queued) {
        /* every copy went through a lane, each pass waited once for the lot, and no table
         * changed before its copies were done */
        assert_int_equal(r.eng->sync_copies, 0);
        assert_int_equal(r.eng->queued, 2);
        assert_int_equal(r.eng->waits, 2);
        assert_int_equal(r.eng->early_commits, 0);
    }
    rig_fini(&r);
}

static void test_acks_gate_reuse(void **state)
{
    (void)state;
    struct rig r;
    rig_init(&r, HOST);
    uint32_t tok[16];
    for (int i = 0; i < 16; i++)
        tok[i] = (uint32_t)(100 + i);
    size_t reused;
    uint64_t epoch;
    assert_int_equal(kvb_session_open(r.kvb, 1, 0, 0, tok, 16, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_open(r.kvb, 2, 0, 0, tok, 13, KVB_NONE, &reused), 0);
    write_kv(&r, 1);
    write_kv(&r, 2);
    assert_int_equal(kvb_session_table(r.kvb, 2, NULL, 0, NULL, &epoch), 0);
    assert_int_equal(kvb_lease(r.kvb, 7, 2, epoch), 0);
    /* session 2 will grow to 6 blocks: two of its 4 go to the host */
    uint64_t ids[2] = {1, 2};
    uint32_t need[2] = {4, 6};
    const struct plan *p = replan(&r, ids, need, 2);
    assert_int_equal(plan_find(p, 2)->n_dev, 4);
    assert_int_equal(plan_find(p, 2)->n_host, 2);
    struct mig_stats st;
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.blocks_demoted, 2);
    assert_int_equal(check_kv(&r, 2), 2);
    /* worker 7 may still read the old table: the device blocks are not free */
    uint32_t grow[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(kvb_free_dev(r.kvb, 0), 0);
    assert_int_equal(kvb_session_append(r.kvb, 2, grow, 8), RKV_ENOSPACE);
    assert_int_equal(kvb_session_table(r.kvb, 2, NULL, 0, NULL, &epoch), 0);
    assert_int_equal(kvb_ack(r.kvb, 7, 2, epoch), 0);
    assert_int_equal(kvb_free_dev(r.kvb, 0), 2);
    assert_int_equal(kvb_session_append(r.kvb, 2, grow, 8), 0);
    struct plan_session s = {0};
    assert_int_equal(mig_session_state(r.kvb, 2, &s), 0);
    assert_int_equal(s.cur_dev, 4);
    assert_int_equal(s.cur_host, 2);
    assert_int_equal(kvb_unlease(r.kvb, 7, 2), 0);
    rig_fini(&r);
}

/* the host pool full of clean copies the plan does not count: a pass trims
 * them and the next pass demotes */
static void test_trim_copies(void **state)
{
    (void)state;
    struct rig r;
    rig_init(&r, 2);
    uint32_t tok[12];
    for (int i = 0; i < 12; i++)
        tok[i] = (uint32_t)(7 * i);
    size_t reused, n_ops;
    struct kvb_copy ops[4];
    assert_int_equal(kvb_session_open(r.kvb, 1, 0, 0, tok, 12, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_open(r.kvb, 2, 0, 0, tok, 12, KVB_NONE, &reused), 0);
    write_kv(&r, 1);
    write_kv(&r, 2);
    assert_int_equal(kvb_demote(r.kvb, 1, 2, ops, 4, &n_ops), 0);
    assert_int_equal(kvpool_run_copies(r.dev, 1, r.host, ops, n_ops), 0);
    assert_int_equal(kvb_commit(r.kvb, 1, NULL), 0);
    assert_int_equal(kvb_promote(r.kvb, 1, 2, ops, 4, &n_ops), 0);
    assert_int_equal(kvpool_run_copies(r.dev, 1, r.host, ops, n_ops), 0);
    assert_int_equal(kvb_commit(r.kvb, 1, NULL), 0);
    assert_int_equal(check_kv(&r, 1), 3);
    assert_int_equal(kvb_free_host(r.kvb), 0);
    /* session 2 will grow to 7 blocks: 5 on the device, 2 on the host */
    uint64_t ids[2] = {1, 2};
    uint32_t need[2] = {3, 7};
    const struct plan *p = replan(&r, ids, need, 2);
    assert_int_equal(plan_find(p, 2)->n_host, 2);
    struct mig_stats st;
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.trimmed, 2);
    assert_int_equal(st.deferred, 1);
    assert_int_equal(mig_apply(r.kvb, r.dev, 1, r.host, p, &st), 0);
    assert_int_equal(st.blocks_demoted, 2);
    assert_int_equal(check_kv(&r, 1), 3);
    assert_int_equal(check_kv(&r, 2), 1);
    rig_fini(&r);
}

/* a session moves from gpu 0 to gpu 1 through the host pool: every block holds the same
 * bytes afterwards, and the prefix it shared with a session staying on gpu 0 is intact */
static void test_rehome_bytes(void **state)
{
    (void)state;
    struct kvb_config kc = {2, {DEV, DEV}, HOST, BT, 1};
    struct kvb *kvb;
    assert_int_equal(kvb_create(&kc, &kvb), 0);
    struct kvpool *dev[2], *host;
    char name[64];
    for (uint32_t g = 0; g < 2; g++) {
        snprintf(name, sizeof(name), "/rkv-test-%d-rdev%u", (int)getpid(), g);
        struct kvpool_config pc = {KVPOOL_DEVICE_SHM, g, name, BB, DEV, BT, 2, NULL};
        assert_int_equal(kvpool_create(&pc, &dev[g]), 0);
    }
    snprintf(name, sizeof(name), "/rkv-test-%d-rhost", (int)getpid());
    struct kvpool_config hc = {KVPOOL_HOST, 0, name, BB, HOST, BT, 2, NULL};
    assert_int_equal(kvpool_create(&hc, &host), 0);
    /* 1 writes three full blocks; 2 shares the first two and writes a partial third */
    uint32_t t[3 * BT];
    for (uint32_t i = 0; i < 3 * BT; i++)
        t[i] = 7 + i;
    size_t reused;
    assert_int_equal(kvb_session_open(kvb, 1, 0, 0, t, 3 * BT, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 1, 3 * BT), 0);
    assert_int_equal(kvb_session_open(kvb, 2, 0, 0, t, 2 * BT + 1, KVB_NONE, &reused), 0);
    assert_int_equal(kvb_session_written(kvb, 2, 2 * BT + 1), 0);
    struct kvb_entry e[3];
    size_t n;
    uint8_t want[3][BB];
    assert_int_equal(kvb_session_table(kvb, 1, e, 3, &n, NULL), 0);
    for (size_t b = 0; b < 3; b++) {
        for (size_t i = 0; i < BB; i++)
            want[b][i] = (uint8_t)(b * 31 + i);
        memcpy(kvpool_block(dev[0], e[b].dev), want[b], BB);
    }
    /* 2's own third block: a different pattern */
    uint8_t own[BB];
    memset(own, 0xa5, BB);
    assert_int_equal(kvb_session_table(kvb, 2, e, 3, &n, NULL), 0);
    memcpy(kvpool_block(dev[0], e[2].dev), own, BB);
    /* 1's oldest block lives on the host only: it reaches gpu 1 by one copy */
    struct kvb_copy ops[8];
    size_t n_ops;
    assert_int_equal(kvb_demote(kvb, 1, 1, ops, 8, &n_ops), 0);
    assert_int_equal(kvpool_run_copies(dev, 2, host, ops, n_ops), 0);
    assert_int_equal(kvb_commit(kvb, 1, NULL), 0);
    uint32_t copies;
    assert_int_equal(mig_rehome(kvb, dev, 2, host, 1, 0, 3, &copies), RKV_EINVAL); /* there */
    assert_int_equal(mig_rehome(kvb, dev, 2, host, 1, 1, 3, &copies), 0);
    assert_int_equal(copies, 1 + 2 * 2);
    assert_int_equal(kvb_session_gpu(kvb, 1), 1);
    assert_int_equal(kvb_session_table(kvb, 1, e, 3, &n, NULL), 0);
    for (size_t b = 0; b < 3; b++) {
        assert_int_not_equal(e[b].dev, KVB_NONE);
        assert_memory_equal(kvpool_block(dev[1], e[b].dev), want[b], BB);
        assert_memory_equal(kvpool_block(host, e[b].host), want[b], BB);
    }
    /* 2 stays on gpu 0 with the same bytes in its shared and its own blocks */
    assert_int_equal(kvb_session_table(kvb, 2, e, 3, &n, NULL), 0);
    assert_int_equal(kvb_session_gpu(kvb, 2), 0);
    assert_memory_equal(kvpool_block(dev[0], e[0].dev), want[0], BB);
    assert_memory_equal(kvpool_block(dev[0], e[1].dev), want[1], BB);
    assert_memory_equal(kvpool_block(dev[0], e[2].dev), own, BB);
    assert_int_equal(kvb_check(kvb), 0);
    /* and 2 follows: the shared prefix is found on gpu 1, only its own block is copied */
    assert_int_equal(mig_rehome(kvb, dev, 2, host, 2, 1, 3, &copies), 0);
    assert_int_equal(copies, 2);
    assert_int_equal(kvb_session_table(kvb, 2, e, 3, &n, NULL), 0);
    assert_memory_equal(kvpool_block(dev[1], e[0].dev), want[0], BB);
    assert_memory_equal(kvpool_block(dev[1], e[1].dev), want[1], BB);
    assert_memory_equal(kvpool_block(dev[1], e[2].dev), own, BB);
    assert_int_equal(kvb_check(kvb), 0);
    kvb_destroy(kvb);
    kvpool_destroy(dev[0]);
    kvpool_destroy(dev[1]);
    kvpool_destroy(host);
}

int main(void)
{
    static int queued = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_spill_and_return, NULL),
        cmocka_unit_test_prestate(test_spill_and_return, &queued),
        cmocka_unit_test(test_acks_gate_reuse),
        cmocka_unit_test(test_trim_copies),
        cmocka_unit_test(test_rehome_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
