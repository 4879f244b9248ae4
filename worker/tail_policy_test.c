/* tail_policy_test.c - the worker's host-tail decisions as functions of rates and sizes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker/tail_policy.h"

/* the split's share: the cpu's part of the summed rates */
static void test_split_auto(void **state)
{
    (void)state;
    assert_int_equal(tail_split_auto(51.0, 33.0), 39); /* the H200's host: 39.3 % */
    assert_int_equal(tail_split_auto(50.0, 50.0), 50);
    assert_int_equal(tail_split_auto(51.0, 0.0), 0); /* cpu unknown */
    assert_int_equal(tail_split_auto(0.0, 33.0), 0); /* gpu's host reads unknown */
    assert_int_equal(tail_split_auto(1.0, 1000.0), 100);
}

/* the split's rate: the tail over the slower part's time */
static void test_split_gbps(void **state)
{
    (void)state;
    assert_true(fabs(tail_split_gbps(65, 51.0, 62.0) - 62.0 / 0.65) < 1e-9); /* cpu slower */
    assert_true(fabs(tail_split_gbps(40, 51.0, 62.0) - 51.0 / 0.60) < 1e-9); /* link slower */
    assert_true(fabs(tail_split_gbps(100, 51.0, 62.0) - 62.0) < 1e-9);       /* all on cpu */
    assert_true(fabs(tail_split_gbps(250, 51.0, 62.0) - 62.0) < 1e-9);       /* at most all */
    assert_true(tail_split_gbps(0, 51.0, 62.0) == 0);                        /* off */
    assert_true(tail_split_gbps(50, 0.0, 62.0) == 0);                        /* unknown */
}

/* the split's share from measured rates: side by side where measured, else those apart */
static void test_split_share(void **state)
{
    (void)state;
    struct rates r = {0};
    double cpu, gpu;
    assert_int_equal(tail_split_share(&r, &cpu, &gpu), 0); /* nothing measured: off */
    r.attn_host_gbps = 51.0;
    r.attn_cpu_gbps = 34.0; /* one block a layer, apart: the H100 host's 40 % */
    assert_int_equal(tail_split_share(&r, NULL, NULL), 40);
    r.split = (struct split_rates){61.0, 49.0, 12}; /* side by side: the link the slower */
    assert_int_equal(tail_split_share(&r, &cpu, &gpu), 55);
    assert_true(cpu == 61.0 && gpu == 49.0);
    r.split.link_gbps = 53.0; /* the gpu's own host attention the slower */
    assert_int_equal(tail_split_share(&r, &cpu, &gpu), 54);
    assert_true(gpu == 51.0);
    r.split.link_gbps = 0; /* no link figure: the gpu's host attention */
    assert_int_equal(tail_split_share(&r, NULL, &gpu), 54);
    assert_true(gpu == 51.0);
}

/* the worker's split: as given, measured (-1), off (0); deterministic keeps the measured one off
 * and never counts a rate for the planner */
static void test_split_plan(void **state)
{
    (void)state;
    struct rates r = {0};
    r.attn_host_gbps = 51.0;
    r.attn_cpu_gbps = 34.0;
    struct tail_split_plan p;
    tail_split_plan(&r, -1, 0, &p);
    assert_int_equal(p.pct, 40);
    assert_true(p.cpu_gbps == 34.0 && p.gpu_gbps == 51.0);
    assert_true(fabs(p.gbps - 51.0 / 0.60) < 1e-9);
    tail_split_plan(&r, 70, 0, &p);
    assert_int_equal(p.pct, 70);
    assert_true(fabs(p.gbps - 34.0 / 0.70) < 1e-9);
    tail_split_plan(&r, 0, 0, &p);
    assert_int_equal(p.pct, 0);
    assert_true(p.gbps == 0);
    assert_true(p.cpu_gbps == 34.0); /* the rates are told even when off */
    tail_split_plan(&r, -1, 1, &p);
    assert_int_equal(p.pct, 0);
    assert_true(p.gbps == 0);
    /* a share asked for stays under deterministic (the backend refuses it), with no rate */
    tail_split_plan(&r, 70, 1, &p);
    assert_int_equal(p.pct, 70);
    assert_true(p.gbps == 0);
    /* nothing measured: the measured share is off */
    struct rates none = {0};
    tail_split_plan(&none, -1, 0, &p);
    assert_int_equal(p.pct, 0);
    assert_true(p.gbps == 0);
}

/* CPU_TAIL: forced, forbidden, or the rate rule against the link and the split */
static void test_cpu_wanted(void **state)
{
    (void)state;
    struct rates r = {0};
    r.pcie_h2d_gbps = 55.0;
    r.attn_host_gbps = 51.0;
    r.attn_cpu_gbps = 62.0;
    assert_true(tail_cpu_wanted(&r, 0, 0));      /* the cpu beats the link */
    assert_false(tail_cpu_wanted(&r, 0, 110.0)); /* but not the split */
    assert_false(tail_cpu_wanted(&r, 1, 0));     /* the gpu forced */
    assert_true(tail_cpu_wanted(&r, 2, 110.0));  /* the cpu forced */
    r.attn_cpu_gbps = 35.0;
    assert_false(tail_cpu_wanted(&r, 0, 0)); /* the link wins */
}

/* copies where they deliver more than zero-copy reads do, at 0.55 of their rate */
static void test_gpu_copies(void **state)
{
    (void)state;
    assert_true(tail_gpu_copies(50.0, 51.0));  /* copies deliver more */
    assert_false(tail_gpu_copies(25.0, 51.0)); /* a slow copy engine: zero-copy */
    assert_false(tail_gpu_copies(28.0, 51.0)); /* just under 0.55 of it */
    assert_true(tail_gpu_copies(28.1, 51.0));
    assert_true(tail_gpu_copies(1.0, 0.0));  /* zero-copy unmeasured */
    assert_false(tail_gpu_copies(0.0, 0.0)); /* nothing measured */
}

/* the split runs only with a share and a router, and in none of the states it cannot */
static void test_split_on(void **state)
{
    (void)state;
    assert_true(tail_split_on(40, 1, 0, 0, 0, 8));
    assert_false(tail_split_on(0, 1, 0, 0, 0, 8));  /* no share */
    assert_false(tail_split_on(40, 0, 0, 0, 0, 8)); /* no router */
    assert_false(tail_split_on(40, 1, 1, 0, 0, 8)); /* CPU_TAIL */
    assert_false(tail_split_on(40, 1, 0, 1, 0, 8)); /* deterministic */
    assert_false(tail_split_on(40, 1, 0, 0, 1, 8)); /* one key split per block */
    assert_false(tail_split_on(40, 1, 0, 0, 0, 0)); /* no device blocks */
}

/* a split step's tail against its two gates: 1 ms to split, 1.2 ms to split off the thread */
static void test_split_mode(void **state)
{
    (void)state;
    assert_int_equal(tail_split_mode(999.9, 1000, 1200), TAIL_SPLIT_OFF);
    assert_int_equal(tail_split_mode(1000.0, 1000, 1200), TAIL_SPLIT_INLINE);
    assert_int_equal(tail_split_mode(1199.9, 1000, 1200), TAIL_SPLIT_INLINE);
    assert_int_equal(tail_split_mode(1200.0, 1000, 1200), TAIL_SPLIT_ASYNC);
    /* no gates: every tail splits off the thread; a gate past the other: never async first */
    assert_int_equal(tail_split_mode(0.0, 0, 0), TAIL_SPLIT_ASYNC);
    assert_int_equal(tail_split_mode(1500.0, 2000, 1200), TAIL_SPLIT_OFF);
    assert_int_equal(tail_split_mode(2500.0, 2000, 1200), TAIL_SPLIT_ASYNC);
}

static const struct kv_block_ref tab7[] = {{7, KV_DEVICE}, {3, KV_HOST}, {4, KV_HOST},
                                           {9, KV_DEVICE}, {5, KV_HOST}, {6, KV_HOST},
                                           {8, KV_HOST}};

/* the oldest share of the host blocks a decode row reads goes to the cpu, whose view keeps
 * exactly those and hides the rest behind device block 0 */
static void test_seq_share(void **state)
{
    (void)state;
    const struct kv_block_ref *t = tab7;
    uint32_t n_read = 0;
    /* block size 16, last position 95: blocks 0..5 are read, host blocks 1, 2, 4, 5 */
    assert_int_equal(tail_seq_share(t, 7, 16, 95, 1, 40, &n_read), 2); /* 1.6 rounds to 2 */
    assert_int_equal(n_read, 4);
    assert_int_equal(tail_seq_share(t, 7, 16, 95, 1, 100, NULL), 4);
    assert_int_equal(tail_seq_share(t, 7, 16, 95, 1, 10, NULL), 0);
    assert_int_equal(tail_seq_share(t, 7, 16, 95, 1, 0, NULL), 0);
    assert_int_equal(tail_seq_share(t, 7, 16, 95, 1, 250, NULL), 4); /* at most all */
    /* a prefill row never splits, but its read blocks are still counted */
    assert_int_equal(tail_seq_share(t, 7, 16, 111, 64, 40, &n_read), 0);
    assert_int_equal(n_read, 5);
    struct kv_block_ref v[7];
    tail_cpu_view(t, 7, 2, v);
    const struct kv_block_ref want[] = {{7, KV_DEVICE}, {3, KV_HOST},   {4, KV_HOST},
                                        {9, KV_DEVICE}, {0, KV_DEVICE}, {0, KV_DEVICE},
                                        {0, KV_DEVICE}};
    for (int j = 0; j < 7; j++) {
        assert_int_equal(v[j].index, want[j].index);
        assert_int_equal(v[j].residency, want[j].residency);
    }
    /* no share: every host block hidden; all of them: the table as it is */
    tail_cpu_view(t, 7, 0, v);
    for (int j = 0; j < 7; j++)
        assert_int_equal(v[j].residency, KV_DEVICE);
    tail_cpu_view(t, 7, 5, v);
    for (int j = 0; j < 7; j++) {
        assert_int_equal(v[j].index, t[j].index);
        assert_int_equal(v[j].residency, t[j].residency);
    }
}

/* a batch of a decode row (4 host blocks read), a prefill chunk (5) and a decode row without
 * host blocks, its tail sized by the slice bytes and the link */
static void test_batch(void **state)
{
    (void)state;
    const struct kv_block_ref dev[] = {{1, KV_DEVICE}, {2, KV_DEVICE}};
    struct be_seq seqs[3] = {
        {.n_past = 95, .n_tokens = 1, .blocks = tab7, .n_blocks = 7},
        {.n_past = 48, .n_tokens = 64, .blocks = tab7, .n_blocks = 7},
        {.n_past = 20, .n_tokens = 1, .blocks = dev, .n_blocks = 2},
    };
    struct be_batch b = {.n_seqs = 3, .seqs = seqs};
    uint32_t cpu_k[3], gpu_k[3];
    struct tail_batch_out o;
    /* 4 decode blocks x K and V x 1 MB over 8 GB/s: 1000 us, at the inline gate */
    struct tail_split_cfg cfg = {50, 1000000, 8.0, 1000, 1200};
    tail_batch(&b, 16, &cfg, cpu_k, gpu_k, &o);
    assert_int_equal(o.dec_blocks, 4);
    assert_true(fabs(o.tail_us - 1000.0) < 1e-6);
    assert_true(o.cpu_any && !o.async && !o.gated);
    assert_int_equal(cpu_k[0], 2);
    assert_int_equal(gpu_k[0], 2);
    assert_int_equal(cpu_k[1], 0); /* prefill: all on the gpu */
    assert_int_equal(gpu_k[1], 5);
    assert_int_equal(cpu_k[2], 0);
    assert_int_equal(gpu_k[2], 0);
    assert_int_equal(o.staged, 7);
    /* a faster link: the tail is short, the gpu reads it all */
    cfg.link_gbps = 16.0;
    tail_batch(&b, 16, &cfg, cpu_k, gpu_k, &o);
    assert_true(!o.cpu_any && !o.async && o.gated);
    assert_int_equal(cpu_k[0], 0);
    assert_int_equal(gpu_k[0], 4);
    assert_int_equal(o.staged, 9);
    /* a slower one: off the launching thread */
    cfg.link_gbps = 4.0;
    tail_batch(&b, 16, &cfg, cpu_k, gpu_k, &o);
    assert_true(o.cpu_any && o.async && !o.gated);
    assert_int_equal(o.staged, 7);
    /* no split: never gated, never the cpu's */
    cfg.pct = 0;
    tail_batch(&b, 16, &cfg, cpu_k, gpu_k, &o);
    assert_true(!o.cpu_any && !o.async && !o.gated);
    assert_int_equal(o.dec_blocks, 4);
    assert_int_equal(o.staged, 9);
    /* a split with no decode host blocks is not counted as gated */
    cfg.pct = 50;
    b.n_seqs = 2;
    seqs[0] = seqs[2];
    tail_batch(&b, 16, &cfg, cpu_k, gpu_k, &o);
    assert_true(!o.cpu_any && !o.gated);
    assert_int_equal(o.dec_blocks, 0);
    assert_int_equal(o.staged, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_auto),  cmocka_unit_test(test_split_gbps),
        cmocka_unit_test(test_split_share), cmocka_unit_test(test_split_plan),
        cmocka_unit_test(test_gpu_copies),  cmocka_unit_test(test_cpu_wanted),
        cmocka_unit_test(test_split_on),    cmocka_unit_test(test_split_mode),
        cmocka_unit_test(test_seq_share),   cmocka_unit_test(test_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
