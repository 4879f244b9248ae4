/* pool_test.c - kv pools: two mappings share bytes, names are cleaned up,
 * batched and partial copies are exact, the gpu hooks are called as documented. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/shm.h"
#include "kvmgr/pool.h"

#define BT     4  /* positions per block */
#define SLICES 2  /* e.g. one layer's K and V */
#define BB     64 /* block bytes: 2 slices x 4 positions x 8 bytes */

static void name_for(char *buf, const char *tag)
{
    snprintf(buf, 64, "/rkv-test-%d-%s", (int)getpid(), tag);
}

static int shm_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static struct kvpool *make(enum kvpool_kind kind, const char *tag, uint32_t n,
                           const struct kvpool_gpu_ops *ops)
{
    char name[64];
    name_for(name, tag);
    struct kvpool_config cfg = {kind, 0, name, BB, n, BT, SLICES, ops};
    struct kvpool *p = NULL;
    assert_int_equal(kvpool_create(&cfg, &p), 0);
    return p;
}

static void fill(struct kvpool *p, uint32_t n)
{
    for (uint32_t b = 0; b < n; b++)
        for (uint32_t i = 0; i < BB; i++)
            ((uint8_t *)kvpool_block(p, b))[i] = (uint8_t)(b * 16 + i);
}

static void test_make_name(void **state)
{
    (void)state;
    char buf[64];
    assert_int_equal(kvpool_make_name(buf, sizeof(buf), 42, KVPOOL_HOST, 0), 0);
    assert_string_equal(buf, "/rkv-42-host");
    assert_int_equal(kvpool_make_name(buf, sizeof(buf), 42, KVPOOL_DEVICE_SHM, 3), 0);
    assert_string_equal(buf, "/rkv-42-dev3");
    assert_int_equal(kvpool_make_name(buf, 6, 42, KVPOOL_HOST, 0), RKV_ERANGE);
}

static void test_two_mappings(void **state)
{
    (void)state;
    struct kvpool *owner = make(KVPOOL_HOST, "h", 8, NULL);
    const struct kvpool_desc *d = kvpool_get_desc(owner);
    assert_true(shm_exists(d->name));
    struct kvpool *peer = NULL;
    assert_int_equal(kvpool_open(d, &peer), 0);
    /* a different mapping of the same bytes, both ways */
    assert_ptr_not_equal(kvpool_block(owner, 0), kvpool_block(peer, 0));
    memset(kvpool_block(owner, 3), 0xab, BB);
    assert_int_equal(((uint8_t *)kvpool_block(peer, 3))[BB - 1], 0xab);
    ((uint8_t *)kvpool_block(peer, 7))[5] = 0x5c;
    assert_int_equal(((uint8_t *)kvpool_block(owner, 7))[5], 0x5c);
    assert_null(kvpool_block(owner, 8));
    /* the peer leaving keeps the name; the owner leaving removes it */
    kvpool_destroy(peer);
    assert_true(shm_exists(d->name));
    char name[64];
    snprintf(name, sizeof(name), "%s", d->name);
    kvpool_destroy(owner);
    assert_false(shm_exists(name));
    /* a desc claiming more blocks than exist is refused */
    struct kvpool *p = make(KVPOOL_HOST, "small", 2, NULL);
    struct kvpool_desc big = *kvpool_get_desc(p);
    big.n_blocks = 1000;
    assert_int_equal(kvpool_open(&big, &peer), RKV_EFORMAT);
    kvpool_destroy(p);
}

/* another process maps the pool by its desc and writes; the owner sees it.
 * fork is safe here: the test process has no threads, cuda or nng */
static void test_other_process(void **state)
{
    (void)state;
    struct kvpool *owner = make(KVPOOL_HOST, "proc", 4, NULL);
    memset(kvpool_block(owner, 2), 0x11, BB);
    struct kvpool_desc desc = *kvpool_get_desc(owner);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct kvpool *peer = NULL;
        int ok =
            kvpool_open(&desc, &peer) == 0 && ((uint8_t *)kvpool_block(peer, 2))[BB - 1] == 0x11;
        if (ok)
            memset(kvpool_block(peer, 3), 0x22, BB);
        kvpool_destroy(peer);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    uint8_t want[BB];
    memset(want, 0x22, BB);
    assert_memory_equal(kvpool_block(owner, 3), want, BB);
    assert_true(shm_exists(desc.name)); /* the peer leaving keeps it */
    kvpool_destroy(owner);
    assert_false(shm_exists(desc.name));
}

static void test_bad_config(void **state)
{
    (void)state;
    char name[64];
    name_for(name, "bad");
    struct kvpool *p = NULL;
    struct kvpool_config cfg = {KVPOOL_HOST, 0, name, 60, 4, BT, SLICES, NULL};
    assert_int_equal(kvpool_create(&cfg, &p), RKV_EINVAL); /* 60 bytes do not split */
    cfg.block_bytes = BB;
    cfg.name = "no-slash";
    assert_int_equal(kvpool_create(&cfg, &p), RKV_EINVAL);
    cfg.kind = KVPOOL_DEVICE_CUDA;
    assert_int_equal(kvpool_create(&cfg, &p), RKV_ENODEV); /* no gpu hooks */
    assert_null(p);
    /* an empty pool maps nothing */
    cfg = (struct kvpool_config){KVPOOL_HOST, 0, name, BB, 0, BT, SLICES, NULL};
    assert_int_equal(kvpool_create(&cfg, &p), 0);
    assert_null(kvpool_block(p, 0));
    assert_false(shm_exists(name));
    kvpool_destroy(p);
}

static void test_copy_batched_exact(void **state)
{
    (void)state;
    struct kvpool *dev = make(KVPOOL_DEVICE_SHM, "d", 8, NULL);
    struct kvpool *host = make(KVPOOL_HOST, "h2", 8, NULL);
    fill(dev, 8);
    memset(kvpool_block(host, 0), 0, 8 * BB);
    /* out of order; 1..3 -> 4..6 is one run */
    struct kvpool_op ops[4] = {{3, 6, BT}, {1, 4, BT}, {2, 5, BT}, {7, 0, BT}};
    assert_int_equal(kvpool_copy(host, dev, ops, 4), 0);
    for (int k = 0; k < 4; k++)
        assert_memory_equal(kvpool_block(host, ops[k].dst), kvpool_block(dev, ops[k].src), BB);
    uint8_t zero[BB] = {0};
    assert_memory_equal(kvpool_block(host, 1), zero, BB);
    /* the first 3 positions of a block: 3 x 8 bytes of each slice */
    memset(kvpool_block(host, 2), 0xee, BB);
    struct kvpool_op part = {5, 2, 3};
    assert_int_equal(kvpool_copy(host, dev, &part, 1), 0);
    const uint8_t *h = kvpool_block(host, 2), *d = kvpool_block(dev, 5);
    assert_memory_equal(h, d, 24);
    assert_int_equal(h[24], 0xee);
    assert_memory_equal(h + 32, d + 32, 24);
    assert_int_equal(h[56], 0xee);
    /* bad indices change nothing */
    struct kvpool_op bad = {9, 0, BT};
    assert_int_equal(kvpool_copy(host, dev, &bad, 1), RKV_ERANGE);
    kvpool_destroy(dev);
    kvpool_destroy(host);
}

static void test_run_copies(void **state)
{
    (void)state;
    struct kvpool *dev[2] = {make(KVPOOL_DEVICE_SHM, "r0", 6, NULL),
                             make(KVPOOL_DEVICE_SHM, "r1", 6, NULL)};
    struct kvpool *host = make(KVPOOL_HOST, "rh", 6, NULL);
    fill(dev[0], 6);
    fill(dev[1], 6);
    fill(host, 6);
    uint8_t want_h0[BB], want_d1_4[BB], want_d0_5[BB];
    memcpy(want_h0, kvpool_block(dev[1], 2), BB);
    memcpy(want_d1_4, kvpool_block(host, 3), BB);
    memcpy(want_d0_5, kvpool_block(dev[0], 1), BB);
    struct kvb_copy ops[3] = {
        {KVB_COPY_D2H, 1, 2, 0, BT}, {KVB_COPY_H2D, 1, 3, 4, BT}, {KVB_COPY_D2D, 0, 1, 5, BT}};
    assert_int_equal(kvpool_run_copies(dev, 2, host, ops, 3), 0);
    assert_memory_equal(kvpool_block(host, 0), want_h0, BB);
    assert_memory_equal(kvpool_block(dev[1], 4), want_d1_4, BB);
    assert_memory_equal(kvpool_block(dev[0], 5), want_d0_5, BB);
    ops[0].gpu = 2;
    assert_int_equal(kvpool_run_copies(dev, 2, host, ops, 1), RKV_EINVAL);
    kvpool_destroy(dev[0]);
    kvpool_destroy(dev[1]);
    kvpool_destroy(host);
}

/* a stand-in for the cuda code: "device" memory from malloc, calls counted */
struct fake_gpu {
    int allocs, frees, registers, unregisters, copies;
    size_t copied;
    /* pinned pieces, in order: their start and length */
    uint8_t *reg_base[16];
    size_t reg_len[16];
    int fail_at;           /* the register call (1-based) that fails; 0 = none */
    uint8_t *dev_base;     /* the last device pool made */
    uint8_t *dev_bases[2]; /* per gpu */
    /* queued copies (copy_async): done at copy_wait, the lanes in reverse order */
    struct {
        int lane;
        void *dst;
        const void *src;
        size_t n;
    } q[16];
    int nq, waits, lane_runs[3];
    int fail_wait; /* copy_wait answers RKV_ECUDA */
};

static int fake_alloc(void *ctx, uint32_t gpu, size_t bytes, void **dptr, uint8_t *ipc)
{
    struct fake_gpu *f = ctx;
    f->allocs++;
    *dptr = f->dev_base = calloc(1, bytes);
    if (gpu < 2)
        f->dev_bases[gpu] = f->dev_base;
    memset(ipc, 0x77, KVPOOL_IPC_BYTES);
    return *dptr ? 0 : RKV_ENOMEM;
}

static void fake_free(void *ctx, uint32_t gpu, void *dptr)
{
    ((struct fake_gpu *)ctx)->frees++;
    free(dptr);
}

static int fake_register(void *ctx, void *base, size_t bytes)
{
    struct fake_gpu *f = ctx;
    if (f->fail_at && f->registers + 1 == f->fail_at)
        return RKV_ECUDA;
    if (f->registers < 16) {
        f->reg_base[f->registers] = base;
        f->reg_len[f->registers] = bytes;
    }
    f->registers++;
    return 0;
}

static void fake_unregister(void *ctx, void *base)
{
    ((struct fake_gpu *)ctx)->unregisters++;
}

static int fake_copy(void *ctx, uint32_t gpu, void *dst, const void *src, size_t bytes)
{
    struct fake_gpu *f = ctx;
    f->copies++;
    f->copied += bytes;
    memcpy(dst, src, bytes);
    return 0;
}

static int fake_copy_async(void *ctx, uint32_t gpu, int lane, void *dst, const void *src,
                           size_t bytes)
{
    struct fake_gpu *f = ctx;
    if (f->nq == 16 || lane < 0 || lane > 2)
        return RKV_EINVAL;
    f->q[f->nq].lane = lane, f->q[f->nq].dst = dst, f->q[f->nq].src = src;
    f->q[f->nq++].n = bytes;
    f->lane_runs[lane]++;
    return 0;
}

static int fake_copy_wait(void *ctx, uint32_t gpu)
{
    struct fake_gpu *f = ctx;
    f->waits++;
    for (int lane = 2; lane >= 0; lane--)
        for (int i = 0; i < f->nq; i++)
            if (f->q[i].lane == lane)
                memcpy(f->q[i].dst, f->q[i].src, f->q[i].n);
    f->nq = 0;
    return f->fail_wait ? RKV_ECUDA : 0;
}

/* the stand-in's hooks with copy lanes */
static struct kvpool_gpu_ops lane_ops(struct fake_gpu *f)
{
    return (struct kvpool_gpu_ops){
        f,         fake_alloc,      fake_free,     fake_register, fake_unregister,
        fake_copy, fake_copy_async, fake_copy_wait};
}

/* with copy lanes every run is queued on its direction's lane and one wait finishes the
 * lot: _start leaves the destinations as they were, _wait fills them; kvpool_copy and
 * kvpool_run_copies are done on return; a failed wait is answered */
static void test_copy_lanes(void **state)
{
    (void)state;
    struct fake_gpu f = {0};
    struct kvpool_gpu_ops ops = lane_ops(&f);
    struct kvpool_config cfg = {KVPOOL_DEVICE_CUDA, 0, NULL, BB, 8, BT, SLICES, &ops};
    struct kvpool *dev = NULL;
    assert_int_equal(kvpool_create(&cfg, &dev), 0);
    struct kvpool *host = make(KVPOOL_HOST, "lh", 8, &ops);
    fill(host, 8);
    for (uint32_t b = 0; b < 8; b++)
        memset(f.dev_base + (size_t)b * BB, 0xd0 + (int)b, BB);
    uint8_t want_h6[BB], want_d4[BB], want_d7[BB], host0[BB];
    memcpy(want_h6, f.dev_base + 1 * BB, BB);
    memcpy(want_d4, kvpool_block(host, 2), BB);
    memcpy(want_d7, f.dev_base + 3 * BB, BB);
    memcpy(host0, kvpool_block(host, 6), BB);
    /* a turnover: one block out, one in, one copied on the device */
    struct kvb_copy ops3[3] = {
        {KVB_COPY_D2H, 0, 1, 6, BT}, {KVB_COPY_H2D, 0, 2, 4, BT}, {KVB_COPY_D2D, 0, 3, 7, BT}};
    struct kvpool *devs[1] = {dev};
    assert_int_equal(kvpool_copies_start(devs, 1, host, ops3, 3), 0);
    assert_int_equal(f.nq, 3);
    assert_int_equal(f.copies, 0);
    assert_memory_equal(kvpool_block(host, 6), host0, BB); /* not yet */
    assert_int_equal(kvpool_copies_wait(devs, 1), 0);
    assert_int_equal(f.waits, 1);
    assert_int_equal(f.lane_runs[KVPOOL_LANE_D2H], 1);
    assert_int_equal(f.lane_runs[KVPOOL_LANE_H2D], 1);
    assert_int_equal(f.lane_runs[KVPOOL_LANE_D2D], 1);
    assert_memory_equal(kvpool_block(host, 6), want_h6, BB);
    assert_memory_equal(f.dev_base + 4 * BB, want_d4, BB);
    assert_memory_equal(f.dev_base + 7 * BB, want_d7, BB);
    /* kvpool_copy: consecutive blocks still merge into one run, done on return */
    struct kvpool_op back[2] = {{4, 0, BT}, {5, 1, BT}};
    assert_int_equal(kvpool_copy(host, dev, back, 2), 0);
    assert_int_equal(f.waits, 2);
    assert_int_equal(f.lane_runs[KVPOOL_LANE_D2H], 2);
    assert_memory_equal(kvpool_block(host, 0), want_d4, BB);
    assert_int_equal(f.copies, 0); /* nothing went through the synchronous hook */
    /* a copy that failed in flight is answered by the wait */
    f.fail_wait = 1;
    assert_int_equal(kvpool_run_copies(devs, 1, host, ops3, 1), RKV_ECUDA);
    kvpool_destroy(host);
    kvpool_destroy(dev);
}

/* a batch whose host -> device copies read the host blocks its device -> host copies write (a
 * rehome stages a session's blocks through the host) waits between the two: the engine that
 * runs the lanes in reverse order still gives the bytes; copies with nothing in common do not
 * wait */
static void test_copy_lanes_ordered(void **state)
{
    (void)state;
    struct fake_gpu f = {0};
    struct kvpool_gpu_ops ops = lane_ops(&f);
    struct kvpool *dev[2];
    for (uint32_t g = 0; g < 2; g++) {
        struct kvpool_config cfg = {KVPOOL_DEVICE_CUDA, g, NULL, BB, 8, BT, SLICES, &ops};
        dev[g] = NULL;
        assert_int_equal(kvpool_create(&cfg, &dev[g]), 0);
        for (uint32_t b = 0; b < 8; b++)
            memset(f.dev_bases[g] + (size_t)b * BB, 0x40 + (int)(g * 8 + b), BB);
    }
    struct kvpool *host = make(KVPOOL_HOST, "oh", 8, &ops);
    fill(host, 8);
    uint8_t want[BB];
    memcpy(want, f.dev_bases[0] + 1 * BB, BB);
    /* gpu 0's block 1 to gpu 1's block 2 through host block 5 */
    struct kvb_copy rehome[2] = {{KVB_COPY_D2H, 0, 1, 5, BT}, {KVB_COPY_H2D, 1, 5, 2, BT}};
    assert_int_equal(kvpool_run_copies(dev, 2, host, rehome, 2), 0);
    assert_memory_equal(f.dev_bases[1] + 2 * BB, want, BB);
    assert_memory_equal(kvpool_block(host, 5), want, BB);
    assert_true(f.waits >= 2); /* one between the two, one at the end */
    /* out and in of different blocks: one wait for both lanes */
    const int before = f.waits;
    struct kvb_copy turn[2] = {{KVB_COPY_D2H, 0, 3, 6, BT}, {KVB_COPY_H2D, 0, 7, 4, BT}};
    assert_int_equal(kvpool_run_copies(dev, 2, host, turn, 2), 0);
    assert_int_equal(f.waits - before, 2); /* kvpool_copies_wait: once a gpu */
    assert_memory_equal(kvpool_block(host, 6), f.dev_bases[0] + 3 * BB, BB);
    assert_memory_equal(f.dev_bases[0] + 4 * BB, kvpool_block(host, 7), BB);
    kvpool_destroy(host);
    kvpool_destroy(dev[0]);
    kvpool_destroy(dev[1]);
}

static void test_gpu_hooks(void **state)
{
    (void)state;
    struct fake_gpu f = {0};
    struct kvpool_gpu_ops ops = {&f,       fake_alloc, fake_free, fake_register, fake_unregister,
                                 fake_copy};
    struct kvpool_config cfg = {KVPOOL_DEVICE_CUDA, 0, NULL, BB, 8, BT, SLICES, &ops};
    struct kvpool *dev = NULL;
    assert_int_equal(kvpool_create(&cfg, &dev), 0);
    assert_int_equal(f.allocs, 1);
    assert_int_equal(kvpool_get_desc(dev)->ipc_handle[0], 0x77);
    assert_null(kvpool_block(dev, 0)); /* device memory is not addressable here */
    struct kvpool *peer = NULL;
    assert_int_equal(kvpool_open(kvpool_get_desc(dev), &peer), RKV_EUNSUPPORTED);
    struct kvpool *host = make(KVPOOL_HOST, "gh", 8, &ops);
    assert_int_equal(f.registers, 1);
    fill(host, 8);
    /* 4 blocks in 2 runs: two copies through the hook */
    struct kvpool_op h2d[4] = {{0, 0, BT}, {1, 1, BT}, {5, 6, BT}, {6, 7, BT}};
    assert_int_equal(kvpool_copy(dev, host, h2d, 4), 0);
    assert_int_equal(f.copies, 2);
    assert_int_equal(f.copied, 4 * BB);
    /* and back: the bytes went through the device */
    memset(kvpool_block(host, 2), 0, BB);
    struct kvpool_op d2h = {6, 2, BT};
    assert_int_equal(kvpool_copy(host, dev, &d2h, 1), 0);
    assert_memory_equal(kvpool_block(host, 2), kvpool_block(host, 5), BB);
    kvpool_destroy(host);
    kvpool_destroy(dev);
    assert_int_equal(f.unregisters, 1);
    assert_int_equal(f.frees, 1);
}

/* a host pool is pinned in pieces of whole blocks (one 40 GiB cudaHostRegister stalled every
 * thread of kvmgr); runs of copies do not cross a piece; a failed piece unpins the others */
static void test_host_pinned_in_pieces(void **state)
{
    (void)state;
    struct fake_gpu f = {0};
    struct kvpool_gpu_ops ops = {&f,       fake_alloc, fake_free, fake_register, fake_unregister,
                                 fake_copy};
    char name[64];
    name_for(name, "pieces");
    /* 10 blocks in pieces of 3 (3.5 blocks asked: whole blocks only): 3 + 3 + 3 + 1 */
    struct kvpool_config cfg = {KVPOOL_HOST, 0, name, BB, 10, BT, SLICES, &ops, BB * 7 / 2};
    struct kvpool *host = NULL;
    assert_int_equal(kvpool_create(&cfg, &host), 0);
    assert_int_equal(f.registers, 4);
    for (int i = 0; i < 4; i++) {
        assert_ptr_equal(f.reg_base[i], (uint8_t *)kvpool_block(host, 0) + (size_t)i * 3 * BB);
        assert_int_equal(f.reg_len[i], (i < 3 ? 3 : 1) * BB);
    }
    /* blocks 1..5 to a device pool: the run splits where the pieces do (1-2 | 3-5) */
    struct kvpool_config dc = {KVPOOL_DEVICE_CUDA, 0, NULL, BB, 10, BT, SLICES, &ops};
    struct kvpool *dev = NULL;
    assert_int_equal(kvpool_create(&dc, &dev), 0);
    fill(host, 10);
    struct kvpool_op ops5[5];
    for (uint32_t b = 0; b < 5; b++)
        ops5[b] = (struct kvpool_op){b + 1, b + 1, BT};
    assert_int_equal(kvpool_copy(dev, host, ops5, 5), 0);
    assert_int_equal(f.copies, 2);
    assert_int_equal(f.copied, 5 * BB);
    kvpool_destroy(dev);
    kvpool_destroy(host);
    assert_int_equal(f.unregisters, 4);
    /* the third piece fails: the pool is not made and the two pinned ones are unpinned */
    struct fake_gpu g = {.fail_at = 3};
    ops.ctx = &g;
    host = NULL;
    assert_int_equal(kvpool_create(&cfg, &host), RKV_ECUDA);
    assert_null(host);
    assert_int_equal(g.registers, 2);
    assert_int_equal(g.unregisters, 2);
    assert_false(shm_exists(name));
}

/* pools of a kvmgr that died without cleaning up are removed; a live one's stay */
static void test_reap_stale(void **state)
{
    (void)state;
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    assert_true(dead > 0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    char stale[64], live[64];
    kvpool_make_name(stale, sizeof stale, (int)dead, KVPOOL_HOST, 0);
    kvpool_make_name(live, sizeof live, (int)getppid(), KVPOOL_DEVICE_SHM, 7);
    struct rkv_shm a, b;
    assert_int_equal(rkv_shm_create(&a, stale, 4096), 0);
    assert_int_equal(rkv_shm_create(&b, live, 4096), 0);
    uint32_t n = 0;
    assert_int_equal(kvpool_reap_stale(&n), 0);
    assert_true(n >= 1);
    struct rkv_shm c;
    assert_true(rkv_shm_open(&c, stale, 4096) < 0);
    assert_int_equal(rkv_shm_open(&c, live, 4096), 0);
    rkv_shm_close(&c);
    a.owner = 0; /* already gone */
    rkv_shm_close(&a);
    rkv_shm_close(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reap_stale),
        cmocka_unit_test(test_make_name),
        cmocka_unit_test(test_two_mappings),
        cmocka_unit_test(test_other_process),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_copy_batched_exact),
        cmocka_unit_test(test_run_copies),
        cmocka_unit_test(test_copy_lanes),
        cmocka_unit_test(test_copy_lanes_ordered),
        cmocka_unit_test(test_gpu_hooks),
        cmocka_unit_test(test_host_pinned_in_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
