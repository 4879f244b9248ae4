/* evring_test.c - numbered tactic events: numbering, fetching after a sequence number in
 * bounded replies, counting what the ring dropped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "kvmgr/evring.h"

static uint64_t push_sid(struct evring *r, uint64_t sid)
{
    struct proto_tactic_event ev = {0};
    ev.session_id = sid;
    ev.from = PROTO_TACTIC_RESIDENT;
    ev.to = PROTO_TACTIC_CPU_TAIL;
    return evring_push(r, &ev);
}

/* a ring of cap with n events pushed, event i for session i * mul */
static struct evring *ring_of(uint32_t cap, uint64_t n, uint64_t mul)
{
    struct evring *r;
    assert_int_equal(evring_create(cap, &r), 0);
    for (uint64_t i = 1; i <= n; i++)
        push_sid(r, i * mul);
    return r;
}

static void test_empty(void **state)
{
    (void)state;
    struct evring *r;
    assert_int_equal(evring_create(0, &r), RKV_EINVAL);
    assert_null(r);
    assert_int_equal(evring_create(8, &r), 0);
    assert_int_equal(evring_last_seq(r), 0);
    assert_int_equal(evring_first_seq(r), 0);
    struct proto_events *out = calloc(1, sizeof *out);
    evring_fill(r, 0, out);
    assert_int_equal(out->n_events, 0);
    assert_int_equal(out->first_seq, 0);
    assert_int_equal(out->last_seq, 0);
    assert_int_equal(out->dropped, 0);
    free(out);
    evring_destroy(r);
    evring_destroy(NULL);
}

static void test_numbers_and_since(void **state)
{
    (void)state;
    struct evring *r;
    assert_int_equal(evring_create(8, &r), 0);
    for (uint64_t i = 1; i <= 5; i++)
        assert_int_equal(push_sid(r, 100 + i), i);
    assert_int_equal(evring_first_seq(r), 1);
    assert_int_equal(evring_last_seq(r), 5);
    struct proto_events *out = calloc(1, sizeof *out);
    evring_fill(r, 0, out);
    assert_int_equal(out->n_events, 5);
    for (uint32_t i = 0; i < 5; i++) {
        assert_int_equal(out->events[i].seq, i + 1);
        assert_int_equal(out->events[i].session_id, 101 + i);
        assert_int_equal(out->events[i].to, PROTO_TACTIC_CPU_TAIL);
    }
    /* only what comes after since */
    evring_fill(r, 3, out);
    assert_int_equal(out->n_events, 2);
    assert_int_equal(out->events[0].seq, 4);
    assert_int_equal(out->events[1].seq, 5);
    assert_int_equal(out->dropped, 0);
    /* nothing new, and a since past the newest (another kvmgr's numbering): none */
    evring_fill(r, 5, out);
    assert_int_equal(out->n_events, 0);
    assert_int_equal(out->last_seq, 5);
    evring_fill(r, 99, out);
    assert_int_equal(out->n_events, 0);
    assert_int_equal(out->last_seq, 5);
    free(out);
    evring_destroy(r);
}

static void test_overflow_counts_dropped(void **state)
{
    (void)state;
    struct evring *r = ring_of(4, 10, 1);
    /* holds 7..10 */
    assert_int_equal(evring_first_seq(r), 7);
    assert_int_equal(evring_last_seq(r), 10);
    struct proto_events *out = calloc(1, sizeof *out);
    evring_fill(r, 2, out);
    assert_int_equal(out->dropped, 4); /* 3, 4, 5, 6 */
    assert_int_equal(out->first_seq, 7);
    assert_int_equal(out->n_events, 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(out->events[i].seq, 7 + i);
        assert_int_equal(out->events[i].session_id, 7 + i);
    }
    /* a caller that saw 6 lost nothing */
    evring_fill(r, 6, out);
    assert_int_equal(out->dropped, 0);
    assert_int_equal(out->n_events, 4);
    evring_fill(r, 0, out);
    assert_int_equal(out->dropped, 6);
    free(out);
    evring_destroy(r);
}

static void test_bounded_reply_and_loop(void **state)
{
    (void)state;
    const uint64_t n = 3 * PROTO_MAX_EVENTS + 7;
    struct evring *r = ring_of(4096, n, 10);
    struct proto_events *out = calloc(1, sizeof *out);
    /* as rkvd does: ask again from the last seq until last_seq is reached */
    uint64_t since = 0, got = 0;
    int rounds = 0;
    do {
        evring_fill(r, since, out);
        assert_true(out->n_events <= PROTO_MAX_EVENTS);
        for (uint32_t i = 0; i < out->n_events; i++) {
            assert_int_equal(out->events[i].seq, since + 1);
            assert_int_equal(out->events[i].session_id, (since + 1) * 10);
            since = out->events[i].seq;
            got++;
        }
        rounds++;
    } while (since < out->last_seq && out->n_events);
    assert_int_equal(got, n);
    assert_int_equal(rounds, 4);
    assert_int_equal(out->dropped, 0);
    free(out);
    evring_destroy(r);
}

static void test_reply_encodes(void **state)
{
    (void)state;
    struct evring *r = ring_of(16, 3, 1);
    struct proto_events *out = calloc(1, sizeof *out), *back = calloc(1, sizeof *back);
    evring_fill(r, 1, out);
    out->kvmgr_pid = 42;
    for (uint32_t i = 0; i < out->n_events; i++)
        out->events[i].kvmgr_pid = 42;
    char *json, err[256] = "";
    size_t len;
    if (proto_json_encode(PROTO_MSG_EVENTS, out, &json, &len, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(proto_json_decode(PROTO_MSG_EVENTS, json, len, back, err, sizeof err), 0);
    assert_int_equal(back->n_events, 2);
    assert_int_equal(back->events[1].seq, 3);
    assert_int_equal(back->events[1].kvmgr_pid, 42);
    assert_int_equal(back->last_seq, 3);
    free(json);
    free(out);
    free(back);
    evring_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_numbers_and_since),
        cmocka_unit_test(test_overflow_counts_dropped),
        cmocka_unit_test(test_bounded_reply_and_loop),
        cmocka_unit_test(test_reply_encodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
