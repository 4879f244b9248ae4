/* sched_test.c - the step sizes a worker gets from the config and its hello. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "daemon/sched.h"

/* the config's three sizes (0: by the backend), the worker's hello, the sizes wanted */
static void sizes(uint32_t cfg_mbt, uint32_t cfg_chunk, uint32_t cfg_beside, uint32_t worker_mbt,
                  int on_gpu, uint32_t want_mbt, uint32_t want_chunk, uint32_t want_beside)
{
    const struct sched_steps cfg = {cfg_mbt, cfg_chunk, cfg_beside};
    struct sched_steps got = {0, 0, 0};
    sched_step_sizes(&cfg, worker_mbt, on_gpu, &got);
    assert_int_equal(got.max_batch_tokens, want_mbt);
    assert_int_equal(got.prefill_chunk, want_chunk);
    assert_int_equal(got.prefill_beside_decode, want_beside);
}

static void test_defaults_by_backend(void **state)
{
    (void)state;
    sizes(0, 0, 0, 2048, 1, 2048, 2048, 512); /* a gpu worker: 2048, 2048, 512 beside decodes */
    sizes(0, 0, 0, 512, 0, 512, 256, 256);    /* a cpu worker: 512 and 256, a chunk beside */
    sizes(0, 0, 0, 0, 0, 512, 256, 256);      /* not heard yet (or an older worker) */
    sizes(0, 0, 0, 4096, 0, 4096, 256, 256);  /* a cpu worker sized for max_seqs 4096 */
    sizes(0, 0, 0, 256, 1, 256, 256, 256);    /* a gpu worker of small steps: never past them */
}

static void test_config_wins_but_never_past_the_worker(void **state)
{
    (void)state;
    sizes(1024, 0, 0, 1024, 1, 1024, 1024, 512);   /* a set step: a gpu's chunk follows it */
    sizes(100, 0, 0, 100, 0, 100, 100, 100);       /* a cpu's chunk of 256 is cut to the step */
    sizes(0, 512, 0, 2048, 1, 2048, 512, 512);     /* a set chunk on the gpu's default step */
    sizes(0, 4096, 0, 2048, 1, 2048, 2048, 512);   /* a chunk past the step is cut to it */
    sizes(4096, 0, 0, 2048, 1, 2048, 2048, 512);   /* the worker sized its buffers for less */
    sizes(0, 0, 2048, 2048, 1, 2048, 2048, 2048);  /* beside decodes as alone: the old way */
    sizes(0, 0, 64, 512, 0, 512, 256, 64);         /* a cpu's small steps beside decodes */
    sizes(0, 0, 9000, 2048, 1, 2048, 2048, 2048);  /* past the step: cut to it */
    sizes(0, 128, 1024, 2048, 1, 2048, 128, 1024); /* more than a chunk: several prompts' */
}

/* steps of D ms for the decodes plus b ms a prompt token: the learned size settles where a
 * step takes the target, without overshooting past the bounds */
static void test_beside_learns_the_size_for_a_target(void **state)
{
    (void)state;
    const double d = 14, b = 0.06, target = 50; /* ~600 tokens make 50 ms */
    uint32_t p = 512;
    for (int i = 0; i < 30; i++)
        p = sched_beside_next(p, d + b * p, target, 64, 2048);
    assert_in_range(p, 590, 610);
    /* the context grows: the same tokens cost more, the size shrinks with it */
    for (int i = 0; i < 30; i++)
        p = sched_beside_next(p, d + 2 * b * p, target, 64, 2048);
    assert_in_range(p, 295, 305);
    /* a target below the decodes' own time: the floor, never zero */
    for (int i = 0; i < 30; i++)
        p = sched_beside_next(p, d + b * p, 10, 64, 2048);
    assert_int_equal(p, 64);
    /* a generous target: the ceiling */
    for (int i = 0; i < 30; i++)
        p = sched_beside_next(p, d + b * p, 10000, 64, 2048);
    assert_int_equal(p, 2048);
    /* nothing measured: the size stays, within the bounds */
    assert_int_equal(sched_beside_next(300, 0, 50, 64, 2048), 300);
    assert_int_equal(sched_beside_next(3000, 0, 50, 64, 2048), 2048);
    assert_int_equal(sched_beside_next(100, 10, 50, 128, 64), 128); /* hi below lo: lo */
}

static void test_choice_seeds(void **state)
{
    (void)state;
    /* choice 0 keeps the request's seed; the others are fixed, distinct, and differ by seed */
    assert_true(sched_choice_seed(7, 0) == 7);
    assert_true(sched_choice_seed(-3, 0) == (uint64_t)-3);
    uint64_t seen[32];
    for (uint32_t k = 0; k < 16; k++) {
        seen[k] = sched_choice_seed(7, k);
        seen[16 + k] = sched_choice_seed(8, k);
        assert_true(sched_choice_seed(7, k) == seen[k]);
    }
    for (int i = 0; i < 32; i++)
        for (int j = i + 1; j < 32; j++)
            assert_true(seen[i] != seen[j]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_by_backend),
        cmocka_unit_test(test_config_wins_but_never_past_the_worker),
        cmocka_unit_test(test_beside_learns_the_size_for_a_target),
        cmocka_unit_test(test_choice_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
