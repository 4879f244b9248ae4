/* proto_test.c - the envelope: round trips, every truncation, bad magic/type/flags/version. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/proto.h"

static const int g_types[] = {
    PROTO_MSG_ERROR,         PROTO_MSG_OK,           PROTO_MSG_HELLO,      PROTO_MSG_HELLO_ACK,
    PROTO_MSG_WORKER_REPORT, PROTO_MSG_BUDGET_GET,   PROTO_MSG_BUDGET,     PROTO_MSG_BUDGET_SET,
    PROTO_MSG_MODE_GET,      PROTO_MSG_MODE,         PROTO_MSG_MODE_SET,   PROTO_MSG_SESSION_CLOSE,
    PROTO_MSG_TACTIC_EVENT,  PROTO_MSG_HISTOGRAM,    PROTO_MSG_STATUS_GET, PROTO_MSG_STATUS,
    PROTO_MSG_ADMIN_REQ,     PROTO_MSG_ADMIN_RESP,   PROTO_MSG_EVENTS_GET, PROTO_MSG_EVENTS,
    PROTO_MSG_STEP_REQ,      PROTO_MSG_STEP_RESP,    PROTO_MSG_KV_PREP,    PROTO_MSG_KV_TABLES,
};
/* retired numbers (proto.h): a build that meets one calls it unknown */
static const int g_retired[] = {12, 14, 19, 66};
#define N_TYPES (sizeof g_types / sizeof g_types[0])

/* decode from an exact-size heap copy so ASan sees any read past the end */
static int decode_copy(const uint8_t *buf, size_t len, struct proto_hdr *h, char *err,
                       size_t errlen)
{
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    const void *payload;
    int rc = proto_env_decode(copy, len, h, &payload, err, errlen);
    if (rc == 0)
        assert_ptr_equal(payload, copy + PROTO_HDR_SIZE);
    free(copy);
    return rc;
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(proto_msg_name(PROTO_MSG_HELLO_ACK), "hello_ack");
    assert_string_equal(proto_msg_name(PROTO_MSG_STEP_REQ), "step_req");
    assert_string_equal(proto_msg_name(0), "unknown");
    assert_string_equal(proto_msg_name(63), "unknown");
    assert_string_equal(proto_msg_name(-5), "unknown");
    assert_string_equal(proto_msg_name(100000), "unknown");
    assert_true(proto_msg_is_json(PROTO_MSG_EVENTS));
    assert_false(proto_msg_is_json(PROTO_MSG_KV_TABLES));
    assert_true(proto_msg_is_json(PROTO_MSG_ADMIN_REQ));
    assert_false(proto_msg_is_json(40));
    for (size_t i = 0; i < N_TYPES; i++)
        assert_true(proto_msg_known(g_types[i]));
    for (size_t i = 0; i < sizeof g_retired / sizeof g_retired[0]; i++)
        assert_false(proto_msg_known(g_retired[i]));
}

static void test_roundtrip_every_type(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_TYPES; i++) {
        int type = g_types[i];
        char payload[40];
        size_t plen = (size_t)snprintf(payload, sizeof payload, "{\"n\":%zu}", i) * (i % 3 != 0);
        uint8_t *buf;
        size_t len;
        uint64_t id = 0x0123456789abcdefull + i;
        assert_int_equal(proto_env_encode(type, id, payload, plen, &buf, &len), 0);
        assert_int_equal(len, PROTO_HDR_SIZE + plen);
        assert_memory_equal(buf, "RKV1", 4);
        struct proto_hdr h;
        const void *p;
        char err[256];
        assert_int_equal(proto_env_decode(buf, len, &h, &p, err, sizeof err), 0);
        assert_int_equal(h.version, PROTO_VERSION);
        assert_int_equal(h.type, type);
        assert_true(h.req_id == id);
        assert_int_equal(h.flags, proto_msg_is_json(type) ? PROTO_FLAG_JSON : 0);
        assert_int_equal(h.len, plen);
        if (plen)
            assert_memory_equal(p, payload, plen);
        free(buf);
    }
}

static void test_exact_bytes(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    assert_int_equal(proto_env_encode(PROTO_MSG_HELLO, 0x1122334455667788ull, "{}", 2, &buf, &len),
                     0);
    static const uint8_t want[] = {'R',  'K',  'V',  '1', 1, 0, 3, 0, 0x88, 0x77, 0x66, 0x55, 0x44,
                                   0x33, 0x22, 0x11, 1,   0, 0, 0, 2, 0,    0,    0,    '{',  '}'};
    assert_int_equal(len, sizeof want);
    assert_memory_equal(buf, want, sizeof want);
    free(buf);
}

static void test_every_truncation(void **state)
{
    (void)state;
    const char *payload = "{\"session_id\":42}";
    uint8_t *buf;
    size_t len;
    assert_int_equal(
        proto_env_encode(PROTO_MSG_SESSION_CLOSE, 7, payload, strlen(payload), &buf, &len), 0);
    struct proto_hdr h;
    char err[256];
    for (size_t n = 0; n < len; n++) {
        err[0] = 0;
        assert_int_equal(decode_copy(buf, n, &h, err, sizeof err), RKV_EFORMAT);
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(decode_copy(buf, len, &h, err, sizeof err), 0);
    assert_int_equal(decode_copy(buf, 10, &h, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "truncated rkv message: 10 bytes, the header alone is 24");
    assert_int_equal(decode_copy(buf, len - 1, &h, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "session_close: header says 17 payload bytes, message has 16");
    /* one byte too many */
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = ' ';
    assert_int_equal(decode_copy(longer, len + 1, &h, err, sizeof err), RKV_EFORMAT);
    free(longer);
    free(buf);
}

static void test_bad_headers(void **state)
{
    (void)state;
    uint8_t b[PROTO_HDR_SIZE + 2];
    struct proto_hdr h = {.version = 1, .type = PROTO_MSG_OK, .req_id = 9, .flags = 1, .len = 2};
    char err[256];
    struct proto_hdr out;

    proto_hdr_pack(&h, b);
    memcpy(b + PROTO_HDR_SIZE, "{}", 2);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), 0);

    b[3] = '2';
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "not an rkv message: magic is 52 4b 56 32, expected \"RKV1\"");

    h.type = 50;
    proto_hdr_pack(&h, b);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "unknown rkv message type 50");
    h.type = 0;
    proto_hdr_pack(&h, b);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_EFORMAT);

    /* json flag on a binary message, reserved bits, no flag on json */
    h.type = PROTO_MSG_STEP_RESP;
    proto_hdr_pack(&h, b);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err,
                        "step_resp: flags 0x1, expected 0x0 (bit 0 set for JSON, others zero)");
    h.type = PROTO_MSG_OK;
    h.flags = 0x81;
    proto_hdr_pack(&h, b);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_EFORMAT);
    h.flags = 0;
    proto_hdr_pack(&h, b);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_EFORMAT);
}

static void test_oversized(void **state)
{
    (void)state;
    uint8_t b[PROTO_HDR_SIZE];
    struct proto_hdr h = {.version = 1, .type = PROTO_MSG_STEP_REQ, .len = PROTO_MAX_PAYLOAD + 1};
    proto_hdr_pack(&h, b);
    struct proto_hdr out;
    char err[256];
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_ETOOBIG);
    assert_string_equal(err, "step_req: payload of 67108865 bytes is over the 67108864 limit");
    h.len = UINT32_MAX;
    proto_hdr_pack(&h, b);
    assert_int_equal(decode_copy(b, sizeof b, &out, err, sizeof err), RKV_ETOOBIG);

    /* the encoder refuses before touching the payload */
    uint8_t *buf = (uint8_t *)1;
    size_t len = 1;
    assert_int_equal(
        proto_env_encode(PROTO_MSG_STEP_REQ, 1, b, (size_t)PROTO_MAX_PAYLOAD + 1, &buf, &len),
        RKV_ETOOBIG);
    assert_null(buf);
    assert_int_equal(len, 0);
    assert_int_equal(proto_env_encode(99, 1, "x", 1, &buf, &len), RKV_EINVAL);
}

static void test_version_mismatch(void **state)
{
    (void)state;
    uint8_t b[PROTO_HDR_SIZE + 2];
    struct proto_hdr h = {
        .version = 2, .type = PROTO_MSG_ERROR, .req_id = 77, .flags = 1, .len = 2};
    proto_hdr_pack(&h, b);
    memcpy(b + PROTO_HDR_SIZE, "{}", 2);
    struct proto_hdr out;
    const void *payload;
    char err[256];
    assert_int_equal(proto_env_decode(b, sizeof b, &out, &payload, err, sizeof err), RKV_EVERSION);
    assert_string_equal(
        err, "peer speaks rkv protocol v2, this build speaks v1: upgrade the older side");
    /* the header is still readable so the caller can show the peer's ERROR */
    assert_int_equal(out.version, 2);
    assert_int_equal(out.type, PROTO_MSG_ERROR);
    assert_true(out.req_id == 77);
    assert_ptr_equal(payload, b + PROTO_HDR_SIZE);

    char text[128];
    proto_version_text(0, text, sizeof text);
    assert_string_equal(
        text, "peer speaks rkv protocol v0, this build speaks v1: upgrade the older side");
}

/* xorshift: a fixed sequence, so a failure reproduces */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void test_random_bytes(void **state)
{
    (void)state;
    uint8_t buf[96];
    struct proto_hdr h;
    char err[256];
    for (int i = 0; i < 20000; i++) {
        size_t len = rnd() % sizeof buf;
        for (size_t j = 0; j < len; j++)
            buf[j] = (uint8_t)rnd();
        /* half of them start like a real header so the later checks run */
        if (i % 2 && len >= 8) {
            memcpy(buf, "RKV1", 4);
            buf[4] = 1;
            buf[5] = 0;
        }
        int rc = decode_copy(buf, len, &h, err, sizeof err);
        assert_true(rc == 0 || rc == RKV_EFORMAT || rc == RKV_ETOOBIG || rc == RKV_EVERSION);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_roundtrip_every_type),
        cmocka_unit_test(test_exact_bytes),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_version_mismatch),
        cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
