/* sched_test.c - the step sizes a worker gets from the config and its hello. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "daemon/sched.h"

static void sizes(uint32_t cfg_mbt, uint32_t cfg_chunk, uint32_t worker_mbt, int on_gpu,
                  uint32_t want_mbt, uint32_t want_chunk)
{
    uint32_t mbt = 0, chunk = 0;
    sched_step_sizes(cfg_mbt, cfg_chunk, worker_mbt, on_gpu, &mbt, &chunk);
    assert_int_equal(mbt, want_mbt);
    assert_int_equal(chunk, want_chunk);
}

static void test_defaults_by_backend(void **state)
{
    (void)state;
    sizes(0, 0, 2048, 1, 2048, 2048); /* a gpu worker: steps and chunks of 2048 */
    sizes(0, 0, 512, 0, 512, 256);    /* a cpu worker: 512 and 256 */
    sizes(0, 0, 0, 0, 512, 256);      /* not heard yet (or an older worker) */
    sizes(0, 0, 4096, 0, 4096, 256);  /* a cpu worker sized for max_seqs 4096 */
}

static void test_config_wins_but_never_past_the_worker(void **state)
{
    (void)state;
    sizes(1024, 0, 1024, 1, 1024, 1024); /* a set step: a gpu's chunk follows it */
    sizes(100, 0, 100, 0, 100, 100);     /* a cpu's chunk of 256 is cut to the step */
    sizes(0, 512, 2048, 1, 2048, 512);   /* a set chunk on the gpu's default step */
    sizes(0, 4096, 2048, 1, 2048, 2048); /* a chunk past the step is cut to it */
    sizes(4096, 0, 2048, 1, 2048, 2048); /* the worker sized its buffers for less */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_by_backend),
        cmocka_unit_test(test_config_wins_but_never_past_the_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
