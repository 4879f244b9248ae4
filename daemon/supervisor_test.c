/* supervisor_test.c - real children: restart after SIGKILL, give up, stop with deadline. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "daemon/supervisor.h"

struct obs {
    int started, exited, gave_up, stopped, done;
    int last_status;
    struct sup_child *child;
    int kill_on_start; /* SIGKILL the child on its first start */
};

static void on_event(void *ud, struct sup_child *c, enum sup_event ev, int status)
{
    struct obs *o = ud;
    switch (ev) {
    case SUP_STARTED:
        o->started++;
        if (o->kill_on_start && o->started == 1)
            sup_child_kill(c, SIGKILL);
        break;
    case SUP_EXITED: o->exited++; o->last_status = status; break;
    case SUP_GAVE_UP: o->gave_up++; break;
    case SUP_STOPPED: o->stopped++; break;
    }
}

static void on_done(void *ud) { ((struct obs *)ud)->done = 1; }

static void run_until(uv_loop_t *loop, int *flag, int want)
{
    for (int i = 0; i < 5000 && *flag < want; i++)
        uv_run(loop, UV_RUN_ONCE);
}

static void close_all(uv_loop_t *loop, struct sup *s)
{
    sup_destroy(s);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
}

static void test_restart_after_kill(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct obs o = {.kill_on_start = 1};
    struct sup *s;
    assert_int_equal(sup_create(&loop, on_event, &o, &s), 0);
    char *argv[] = {"/bin/sleep", "30", NULL};
    struct sup_child_spec spec = {"sleeper", argv, 3, 60000, 10, 100};
    assert_int_equal(sup_add(s, &spec, &o.child), 0);
    run_until(&loop, &o.started, 2);
    assert_int_equal(o.started, 2);
    assert_int_equal(o.exited, 1);
    assert_int_equal(o.last_status, SIGKILL);
    assert_int_equal(sup_child_restarts(o.child), 1);
    assert_true(sup_child_pid(o.child) > 0);
    sup_stop_all(s, 2000, on_done, &o);
    run_until(&loop, &o.done, 1);
    assert_int_equal(o.stopped, 1);
    close_all(&loop, s);
}

static void test_gives_up(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct obs o = {0};
    struct sup *s;
    assert_int_equal(sup_create(&loop, on_event, &o, &s), 0);
    char *argv[] = {"/bin/sh", "-c", "exit 3", NULL};
    struct sup_child_spec spec = {"crasher", argv, 2, 60000, 1, 4};
    assert_int_equal(sup_add(s, &spec, &o.child), 0);
    run_until(&loop, &o.gave_up, 1);
    assert_int_equal(o.gave_up, 1);
    assert_int_equal(o.exited, 3); /* first run + 2 restarts */
    assert_int_equal(o.last_status, 3 << 8);
    assert_int_equal(sup_child_state(o.child), SUP_FAILED);
    sup_stop_all(s, 100, on_done, &o);
    run_until(&loop, &o.done, 1);
    close_all(&loop, s);
}

static void test_stop_escalates_to_sigkill(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct obs o = {0};
    struct sup *s;
    assert_int_equal(sup_create(&loop, on_event, &o, &s), 0);
    /* ignores SIGTERM */
    char *argv[] = {"/bin/sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30", NULL};
    struct sup_child_spec spec = {"stubborn", argv, 3, 60000, 10, 100};
    assert_int_equal(sup_add(s, &spec, &o.child), 0);
    run_until(&loop, &o.started, 1);
    uv_sleep(100); /* let the shell install its trap */
    sup_stop_all(s, 200, on_done, &o);
    run_until(&loop, &o.done, 1);
    assert_int_equal(o.done, 1);
    assert_int_equal(o.stopped, 1);
    close_all(&loop, s);
}

static void test_missing_binary(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct obs o = {0};
    struct sup *s;
    assert_int_equal(sup_create(&loop, on_event, &o, &s), 0);
    char *argv[] = {"/nonexistent/rkv-worker", NULL};
    struct sup_child_spec spec = {"ghost", argv, 3, 60000, 10, 100};
    assert_true(sup_add(s, &spec, &o.child) < 0);
    assert_int_equal(sup_child_state(o.child), SUP_FAILED);
    close_all(&loop, s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_after_kill),
        cmocka_unit_test(test_gives_up),
        cmocka_unit_test(test_stop_escalates_to_sigkill),
        cmocka_unit_test(test_missing_binary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
