/* kvwire_test.c - KV_PREP / KV_TABLES round trips; truncations, limits and noise refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/kvwire.h"
#include "proto/msg.h"

static void encode_prep(struct proto_wbuf *w)
{
    uint64_t closes[] = {7, 1ull << 60};
    uint64_t idles[] = {9};
    static const int32_t toks[] = {7, -1, 65535};
    struct proto_kv_prep_seq seqs[] = {{3, 1000, PROTO_KV_ACTIVE, 997, 0, 3, toks},
                                       {4, 1, 0, 0, 0, 0, NULL},
                                       {5, 0, PROTO_KV_ACTIVE | PROTO_KV_NEW, 0, 0, 0, NULL,
                                        (1ull << 63) | 42}};
    struct proto_kv_prep m = {2, 99, 2, closes, 1, idles, 3, seqs};
    char err[128];
    proto_wbuf_init(w);
    assert_int_equal(proto_kv_prep_encode(&m, w, err, sizeof err), 0);
}

static void encode_tables(struct proto_wbuf *w)
{
    struct proto_block_ref a[] = {{0, PROTO_RES_DEVICE}, {17, PROTO_RES_HOST}, {5, PROTO_RES_BOTH}};
    struct proto_kv_table t[] = {{3, 0, PROTO_TACTIC_WINDOW, 256, 3, a},
                                 {4, RKV_ENOSPACE, PROTO_TACTIC_PARKED, 0, 0, NULL}};
    struct proto_kv_tables m = {12345, 4242, 2, t};
    char err[128];
    proto_wbuf_init(w);
    assert_int_equal(proto_kv_tables_encode(&m, w, err, sizeof err), 0);
}

static void test_prep_roundtrip(void **state)
{
    (void)state;
    struct proto_wbuf w;
    encode_prep(&w);
    struct proto_kv_prep *m;
    char err[128];
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_int_equal(m->worker_id, 2);
    assert_int_equal(m->ack_epoch, 99);
    assert_int_equal(m->n_close, 2);
    assert_int_equal(m->close[1], 1ull << 60);
    assert_int_equal(m->n_idle, 1);
    assert_int_equal(m->idle[0], 9);
    assert_int_equal(m->n_seqs, 3);
    assert_int_equal(m->seqs[0].n_pos, 1000);
    assert_int_equal(m->seqs[2].flags, PROTO_KV_ACTIVE | PROTO_KV_NEW);
    assert_int_equal(m->seqs[2].scope, (1ull << 63) | 42);
    assert_int_equal(m->seqs[0].scope, 0);
    assert_int_equal(m->seqs[0].n_written, 997);
    assert_int_equal(m->seqs[0].n_tokens, 3);
    assert_int_equal(m->seqs[0].tokens[1], -1);
    assert_int_equal(m->seqs[0].tokens[2], 65535);
    assert_null(m->seqs[1].tokens);
    proto_kv_prep_destroy(m);
    /* every truncation and one trailing byte are refused */
    for (size_t n = 0; n < w.len; n++)
        assert_int_equal(proto_kv_prep_decode(w.data, n, &m, err, sizeof err), RKV_EFORMAT);
    proto_wbuf_put_u8(&w, 0);
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &m, err, sizeof err), RKV_EFORMAT);
    proto_wbuf_fini(&w);
}

static void test_tables_roundtrip(void **state)
{
    (void)state;
    struct proto_wbuf w;
    encode_tables(&w);
    struct proto_kv_tables *m;
    char err[128];
    assert_int_equal(proto_kv_tables_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_int_equal(m->epoch, 12345);
    assert_int_equal(m->kvmgr_pid, 4242);
    assert_int_equal(m->n_seqs, 2);
    assert_int_equal(m->seqs[0].tactic, PROTO_TACTIC_WINDOW);
    assert_int_equal(m->seqs[0].n_blocks, 3);
    assert_int_equal(m->seqs[0].n_cached, 256);
    assert_int_equal(m->seqs[0].blocks[1].index, 17);
    assert_int_equal(m->seqs[0].blocks[2].residency, PROTO_RES_BOTH);
    assert_int_equal(m->seqs[1].status, RKV_ENOSPACE);
    assert_int_equal(m->seqs[1].n_blocks, 0);
    proto_kv_tables_destroy(m);
    for (size_t n = 0; n < w.len; n++)
        assert_int_equal(proto_kv_tables_decode(w.data, n, &m, err, sizeof err), RKV_EFORMAT);
    proto_wbuf_fini(&w);
}

/* several gpus: a sequence answered "moved to gpu g", and a prep asking to stay */
static void test_moved_and_nomove(void **state)
{
    (void)state;
    struct proto_kv_table t[] = {{8, PROTO_KV_MOVED(3), PROTO_TACTIC_RESIDENT, 0, 0, NULL}};
    struct proto_kv_tables tm = {7, 99, 1, t};
    struct proto_wbuf w;
    char err[128];
    proto_wbuf_init(&w);
    assert_int_equal(proto_kv_tables_encode(&tm, &w, err, sizeof err), 0);
    struct proto_kv_tables *m;
    assert_int_equal(proto_kv_tables_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_true(PROTO_KV_IS_MOVED(m->seqs[0].status));
    assert_int_equal(PROTO_KV_MOVED_GPU(m->seqs[0].status), 3);
    assert_false(PROTO_KV_IS_MOVED(0));
    assert_false(PROTO_KV_IS_MOVED(RKV_ENOSPACE));
    assert_true(PROTO_KV_IS_MOVED(PROTO_KV_MOVED(PROTO_MAX_WORKERS - 1)));
    proto_kv_tables_destroy(m);
    proto_wbuf_reset(&w);
    struct proto_kv_prep_seq q = {5, 10, PROTO_KV_ACTIVE | PROTO_KV_NOMOVE, 9, 0, 0, NULL};
    struct proto_kv_prep pm = {1, 0, 0, NULL, 0, NULL, 1, &q};
    assert_int_equal(proto_kv_prep_encode(&pm, &w, err, sizeof err), 0);
    struct proto_kv_prep *p;
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &p, err, sizeof err), 0);
    assert_int_equal(p->seqs[0].flags, PROTO_KV_ACTIVE | PROTO_KV_NOMOVE);
    proto_kv_prep_destroy(p);
    proto_wbuf_fini(&w);
}

/* ids owed: a step prepared ahead owes its last id, a step of several decode steps the ids
 * it picks before its last position; a prep whose tokens and owed ids pass its positions, a
 * prep ahead that owes nothing or is new, and more owed ids than decode steps are refused
 * with the reason, by the encoder and (bytes patched) by the decoder */
static void test_owed(void **state)
{
    (void)state;
    static const int32_t toks[] = {11, 12};
    struct proto_kv_prep_seq q = {5, 3, PROTO_KV_ACTIVE | PROTO_KV_AHEAD, 1, 1, 2, toks};
    struct proto_kv_prep pm = {0, 4, 0, NULL, 0, NULL, 1, &q};
    struct proto_wbuf w;
    char err[256];
    proto_wbuf_init(&w);
    assert_int_equal(proto_kv_prep_encode(&pm, &w, err, sizeof err), 0);
    struct proto_kv_prep *p;
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &p, err, sizeof err), 0);
    assert_int_equal(p->seqs[0].flags, PROTO_KV_ACTIVE | PROTO_KV_AHEAD);
    assert_int_equal(p->seqs[0].n_owed, 1);
    assert_int_equal(p->seqs[0].tokens[1], 12);
    proto_kv_prep_destroy(p);
    /* the same bytes owing nothing (header 24 bytes, then sid, n_pos, flags, n_written) */
    const size_t owed_at = 24 + 8 + 4 + 1 + 4;
    w.data[owed_at] = 0;
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &p, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "owing no id"));
    w.data[owed_at] = 2; /* 2 tokens + 2 owed > 3 positions */
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &p, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "more than its 3 positions"));
    w.data[owed_at] = 2 * PROTO_MAX_DECODE_STEPS + 1;
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &p, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "owes 33 ids, at most 32"));
    /* the encoder refuses what the decoder would */
    q.n_owed = 0;
    proto_wbuf_reset(&w);
    assert_int_equal(proto_kv_prep_encode(&pm, &w, err, sizeof err), RKV_EINVAL);
    assert_non_null(strstr(err, "owing no id"));
    q.n_owed = 1;
    q.flags |= PROTO_KV_NEW;
    proto_wbuf_reset(&w);
    assert_int_equal(proto_kv_prep_encode(&pm, &w, err, sizeof err), RKV_EINVAL);
    assert_non_null(strstr(err, "new flag"));
    /* four greedy decode steps: 8 positions, the step's token and the id before it known,
     * the 3 picked before the last position owed */
    struct proto_kv_prep_seq k = {6, 8, PROTO_KV_ACTIVE, 4, 3, 2, toks};
    pm.seqs = &k;
    proto_wbuf_reset(&w);
    assert_int_equal(proto_kv_prep_encode(&pm, &w, err, sizeof err), 0);
    assert_int_equal(proto_kv_prep_decode(w.data, w.len, &p, err, sizeof err), 0);
    assert_int_equal(p->seqs[0].n_owed, 3);
    assert_int_equal(p->seqs[0].n_pos, 8);
    assert_int_equal(p->seqs[0].n_tokens, 2);
    proto_kv_prep_destroy(p);
    k.n_owed = 7;
    proto_wbuf_reset(&w);
    assert_int_equal(proto_kv_prep_encode(&pm, &w, err, sizeof err), RKV_EINVAL);
    assert_non_null(strstr(err, "owes 7 ids, more than its 8 positions"));
    proto_wbuf_fini(&w);
}

static void test_limits_and_noise(void **state)
{
    (void)state;
    char err[128];
    /* a huge count with no bytes behind it: refused before allocating */
    uint8_t buf[64] = {0};
    buf[12] = 0xff, buf[13] = 0xff, buf[14] = 0xff, buf[15] = 0x7f;
    struct proto_kv_prep *p;
    assert_int_equal(proto_kv_prep_decode(buf, 16, &p, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "count"));
    /* bad tactic and residency values */
    struct proto_wbuf w;
    encode_tables(&w);
    struct proto_kv_tables *t;
    w.data[8 + 4 + 4 + 8 + 4] = 9; /* first seq's tactic (after epoch, pid, count, sid, status) */
    assert_int_equal(proto_kv_tables_decode(w.data, w.len, &t, err, sizeof err), RKV_EFORMAT);
    assert_non_null(strstr(err, "tactic"));
    proto_wbuf_fini(&w);
    /* random bytes never crash and are mostly refused */
    uint64_t x = 88172645463325252ull;
    uint8_t rnd[256];
    for (int i = 0; i < 20000; i++) {
        size_t n = (size_t)(x % sizeof rnd);
        for (size_t k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            rnd[k] = (uint8_t)x;
        }
        if (proto_kv_prep_decode(rnd, n, &p, err, sizeof err) == 0)
            proto_kv_prep_destroy(p);
        if (proto_kv_tables_decode(rnd, n, &t, err, sizeof err) == 0)
            proto_kv_tables_destroy(t);
    }
    /* encoders refuse what decoders would */
    struct proto_kv_table bad = {1, 0, 7, 0, 0, NULL};
    struct proto_kv_tables m = {1, 1, 1, &bad};
    proto_wbuf_init(&w);
    assert_int_equal(proto_kv_tables_encode(&m, &w, err, sizeof err), RKV_EINVAL);
    proto_wbuf_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prep_roundtrip),
        cmocka_unit_test(test_tables_roundtrip),
        cmocka_unit_test(test_moved_and_nomove),
        cmocka_unit_test(test_owed),
        cmocka_unit_test(test_limits_and_noise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
