/* json_test.c - control messages: round trip every type, refuse every kind of bad field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/json.h"
#include "proto/msg.h"

/* every control message, zeroed first so memcmp can compare padding too */
static struct proto_error m_error;
static struct proto_empty m_empty;
static struct proto_hello m_hello;
static struct proto_hello_ack m_hello_ack;
static struct proto_worker_report m_report;
static struct proto_budget_get m_budget_get;
static struct proto_budget m_budget;
static struct proto_mode_msg m_mode;
static struct proto_session_close m_sclose;
static struct proto_tactic_event m_event;
static struct proto_histogram m_hist;
static struct proto_status m_status;
static struct proto_events_get m_events_get;
static struct proto_events m_events;

static void fill_all(void)
{
    m_error.code = RKV_ENOSPACE;
    snprintf(m_error.message, sizeof m_error.message,
             "host budget 8 GiB is full: raise --host-budget");
    m_hello.role = PROTO_ROLE_WORKER;
    m_hello.pid = 4194303;
    m_hello.worker_id = 3;
    m_hello.gpu = -1;
    m_hello.proto_version = PROTO_VERSION;
    m_hello.kv_dtype = 2; /* q8 */
    snprintf(m_hello.build, sizeof m_hello.build, "rkv 0.1 \"quoted\" \\ back\tslash \xc3\xa9");
    m_hello_ack.accepted = true;
    m_hello_ack.kvmgr_pid = 1234;
    snprintf(m_hello_ack.device_pool_url, sizeof m_hello_ack.device_pool_url, "ipc:///run/rkv/x");
    snprintf(m_hello_ack.host_pool_name, sizeof m_hello_ack.host_pool_name, "/rkv-host-pool-1");
    m_hello_ack.block_size = 256;
    m_hello_ack.block_bytes = 33554432;
    m_hello_ack.n_device_blocks = 9007199254740993ull; /* 2^53 + 1: travels as a string */
    m_hello_ack.n_host_blocks = UINT64_MAX;
    m_hello_ack.max_batch_tokens = 2048;
    m_hello_ack.on_gpu = true;
    m_report.worker_id = 63;
    m_report.weights_bytes = 16060522496ull;
    m_report.compute_reserve_bytes = 2147483648ull;
    m_report.pcie_h2d_gbps = 55.4;
    m_report.attn_device_gbps = 4200.125;
    m_report.attn_host_gbps = 0.1;
    m_report.attn_cpu_gbps = 1.0 / 3.0;
    m_report.split_gbps = 104.5;
    m_budget_get.gpu = 7;
    m_budget.vram_target_bytes = 24ull << 30;
    m_budget.host_budget_bytes = 1ull << 40;
    m_budget.compute_reserve_bytes = 1;
    m_budget.gpu = 1023;
    m_mode.mode = PROTO_MODE_CPU_TAIL;
    m_sclose.session_id = 0xfedcba9876543210ull;
    m_event.session_id = 99;
    m_event.from = PROTO_TACTIC_RESIDENT;
    m_event.to = PROTO_TACTIC_PARKED;
    snprintf(m_event.reason, sizeof m_event.reason, "vram pressure: idle 30 s");
    m_event.tail_blocks = 17;
    m_event.bytes_moved = 570425344;
    m_event.elapsed_us = 10321;
    m_event.ts_ms = 1764415800123ull;
    m_event.gpu = 0;
    m_event.seq = 12345;
    m_event.kvmgr_pid = 4242;
    m_hist.gpu = 2;
    for (int i = 0; i < PROTO_N_TACTICS; i++) {
        m_hist.sessions[i] = (uint64_t)i * 10 + 1;
        m_hist.bytes[i] = ((uint64_t)1 << 60) + (uint64_t)i; /* beyond 2^53 */
    }
    m_hist.device_used = 1;
    m_hist.device_total = 2;
    m_hist.host_used = 3;
    m_hist.host_total = 4;
    m_status.kvmgr_pid = 77;
    m_status.uptime_ms = 123456789;
    m_status.n_sessions = 5;
    m_status.mode = PROTO_MODE_WINDOW;
    m_status.proto_version = 1;
    snprintf(m_status.build, sizeof m_status.build, "test");
    m_status.device_used = 10;
    m_status.device_total = 20;
    m_status.host_used = 30;
    m_status.host_total = 40;
    m_status.n_worker_pids = 3;
    m_status.worker_pids[0] = 100;
    m_status.worker_pids[1] = 200;
    m_status.worker_pids[2] = 4194303;
    m_status.n_worker_step_ms = 2;
    m_status.worker_step_ms[0] = 12.5;
    m_status.worker_step_ms[1] = 0.000123;
    m_status.event_seq = 9007199254740993ull;
    snprintf(m_status.pools_error, sizeof m_status.pools_error,
             "gpu 0: vram target 4.00 KiB leaves no room for a kv block (128.00 KiB)");
    m_status.block_bytes = 69632 * 256;
    m_status.kv_dtype = 3; /* fp8 */
    m_events_get.since = 12344;
    m_events.kvmgr_pid = 4242;
    m_events.first_seq = 12000;
    m_events.last_seq = 12346;
    m_events.dropped = 3;
    m_events.n_events = 2;
    /* memcpy, not assignment: the padding must stay as memcmp expects it */
    memcpy(&m_events.events[0], &m_event, sizeof m_event);
    memcpy(&m_events.events[1], &m_event, sizeof m_event);
    m_events.events[1].seq = 12346;
    m_events.events[1].from = PROTO_TACTIC_NEW;
    m_events.events[1].to = PROTO_TACTIC_WINDOW;
    m_events.events[1].gpu = -1;
}

static const struct {
    int type;
    const void *msg;
} g_msgs[] = {
    {PROTO_MSG_ERROR, &m_error},           {PROTO_MSG_OK, &m_empty},
    {PROTO_MSG_HELLO, &m_hello},           {PROTO_MSG_HELLO_ACK, &m_hello_ack},
    {PROTO_MSG_WORKER_REPORT, &m_report},  {PROTO_MSG_BUDGET_GET, &m_budget_get},
    {PROTO_MSG_BUDGET, &m_budget},         {PROTO_MSG_BUDGET_SET, &m_budget},
    {PROTO_MSG_MODE_GET, &m_empty},        {PROTO_MSG_MODE, &m_mode},
    {PROTO_MSG_MODE_SET, &m_mode},         {PROTO_MSG_SESSION_CLOSE, &m_sclose},
    {PROTO_MSG_TACTIC_EVENT, &m_event},    {PROTO_MSG_HISTOGRAM, &m_hist},
    {PROTO_MSG_STATUS_GET, &m_empty},      {PROTO_MSG_STATUS, &m_status},
    {PROTO_MSG_EVENTS_GET, &m_events_get}, {PROTO_MSG_EVENTS, &m_events},
};

static void test_roundtrip_every_type(void **state)
{
    (void)state;
    fill_all();
    size_t n_json = 0;
    /* the admin messages carry free-form JSON (no schema) */
    for (int t = 1; t < PROTO_MSG__MAX; t++)
        n_json += proto_msg_is_json(t) && t != PROTO_MSG_ADMIN_REQ && t != PROTO_MSG_ADMIN_RESP;
    assert_int_equal(n_json, sizeof g_msgs / sizeof g_msgs[0]);
    for (size_t i = 0; i < sizeof g_msgs / sizeof g_msgs[0]; i++) {
        const struct proto_schema *s = proto_msg_schema(g_msgs[i].type);
        assert_non_null(s);
        char *json, *again;
        size_t len, len2;
        char err[256] = "";
        int rc = proto_json_encode(g_msgs[i].type, g_msgs[i].msg, &json, &len, err, sizeof err);
        if (rc)
            fail_msg("%s: %s", s->name, err);
        void *back = malloc(s->size);
        rc = proto_json_decode(g_msgs[i].type, json, len, back, err, sizeof err);
        if (rc)
            fail_msg("%s: %s in %s", s->name, err, json);
        assert_memory_equal(back, g_msgs[i].msg, s->size);
        assert_int_equal(proto_json_encode(g_msgs[i].type, back, &again, &len2, err, sizeof err),
                         0);
        assert_string_equal(json, again);
        free(back);
        free(json);
        free(again);
    }
}

static void test_exact_text(void **state)
{
    (void)state;
    fill_all();
    char *json;
    size_t len;
    assert_int_equal(proto_json_encode(PROTO_MSG_SESSION_CLOSE, &m_sclose, &json, &len, NULL, 0),
                     0);
    assert_string_equal(json, "{\"session_id\":\"18364758544493064720\"}");
    free(json);
    struct proto_hello_ack ack = {
        .accepted = true, .kvmgr_pid = 7, .block_size = 16, .block_bytes = 4096, .on_gpu = false};
    assert_int_equal(proto_json_encode(PROTO_MSG_HELLO_ACK, &ack, &json, &len, NULL, 0), 0);
    assert_string_equal(json, "{\"accepted\":true,\"kvmgr_pid\":7,\"device_pool_url\":\"\","
                              "\"host_pool_name\":\"\",\"block_size\":16,\"block_bytes\":4096,"
                              "\"n_device_blocks\":0,\"n_host_blocks\":0,\"max_batch_tokens\":0,"
                              "\"on_gpu\":false}");
    free(json);
    assert_int_equal(proto_json_encode(PROTO_MSG_MODE, &m_mode, &json, &len, NULL, 0), 0);
    assert_string_equal(json, "{\"mode\":\"cpu_tail\"}");
    free(json);
    assert_int_equal(proto_json_encode(PROTO_MSG_OK, &m_empty, &json, &len, NULL, 0), 0);
    assert_string_equal(json, "{}");
    free(json);
}

/* decode text as type; returns the code, text in err */
static int dec(int type, const char *text, char *err, size_t errlen)
{
    const struct proto_schema *s = proto_msg_schema(type);
    void *msg = malloc(s->size);
    /* an exact-size copy with no NUL: the decoder must stay within len */
    size_t len = strlen(text);
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    err[0] = 0;
    int rc = proto_json_decode(type, copy, len, msg, err, errlen);
    free(copy);
    free(msg);
    return rc;
}

#define HELLO_OK "\"role\":\"worker\",\"worker_id\":0,\"gpu\":-1,\"proto_version\":1"

static void test_bad_fields(void **state)
{
    (void)state;
    char err[512];
    const int H = PROTO_MSG_HELLO;

    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1}", err, sizeof err), 0);
    assert_int_equal(dec(H, "  {" HELLO_OK ",\"pid\":1}\n", err, sizeof err), 0);

    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":\"abc\"}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err,
                        "hello: field \"pid\" must be an integer in [1, 4194303], got \"abc\"");
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":0}", err, sizeof err), RKV_ERANGE);
    assert_string_equal(err, "hello: field \"pid\" must be an integer in [1, 4194303], got 0");
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":4194304}", err, sizeof err), RKV_ERANGE);
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":-3}", err, sizeof err), RKV_ERANGE);
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1.5}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: field \"pid\" must be an integer in [1, 4194303], got 1.5");
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":true}", err, sizeof err), RKV_EFORMAT);
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":null}", err, sizeof err), RKV_EFORMAT);
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":[1]}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err,
                        "hello: field \"pid\" must be an integer in [1, 4194303], got an array");
    /* u32 fields do not take strings; u64/i64 ones do */
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":\"12\"}", err, sizeof err), RKV_EFORMAT);

    assert_int_equal(dec(H, "{" HELLO_OK "}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: missing required field \"pid\"");
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1,\"pdi\":2}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: unknown field \"pdi\" (fields: role, pid, worker_id, gpu, "
                             "proto_version, build, block_bytes, weights_bytes, "
                             "compute_reserve_bytes, kv_dtype, n_parts, n_swa)");
    /* a kv dtype is one of the names */
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1,\"kv_dtype\":\"int4\"}", err, sizeof err),
                     RKV_EFORMAT);
    assert_string_equal(err,
                        "hello: field \"kv_dtype\" must be one of f32|f16|q8|fp8, got \"int4\"");
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1,\"pid\":2}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: field \"pid\" appears twice");

    assert_int_equal(dec(H, "{\"role\":\"admin\",\"pid\":1}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err,
                        "hello: field \"role\" must be one of worker|rkvd|rkvctl, got \"admin\"");
    assert_int_equal(dec(H, "{\"role\":0,\"pid\":1}", err, sizeof err), RKV_EFORMAT);
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1,\"build\":7}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: field \"build\" must be a string, got 7");

    char text[256];
    snprintf(text, sizeof text, "{" HELLO_OK ",\"pid\":1,\"build\":\"%063d\"}", 0);
    assert_int_equal(dec(H, text, err, sizeof err), 0);
    snprintf(text, sizeof text, "{" HELLO_OK ",\"pid\":1,\"build\":\"%064d\"}", 0);
    assert_int_equal(dec(H, text, err, sizeof err), RKV_ETOOBIG);
    assert_string_equal(err, "hello: field \"build\" is 64 bytes long, the limit is 63");

    /* gpu: i64 in [-1, 1023] */
    assert_int_equal(dec(H,
                         "{\"role\":\"rkvd\",\"pid\":1,\"worker_id\":0,\"gpu\":-2,"
                         "\"proto_version\":1}",
                         err, sizeof err),
                     RKV_ERANGE);
    assert_string_equal(err, "hello: field \"gpu\" must be an integer in [-1, 1023], got -2");

    /* shape */
    assert_int_equal(dec(H, "[1,2]", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: payload must be a JSON object, got an array");
    assert_int_equal(dec(H, "{\"pid\":", err, sizeof err), RKV_EFORMAT);
    assert_int_equal(dec(H, "", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: payload is not valid JSON (0 bytes, error near byte 0)");
    assert_int_equal(dec(H, "{" HELLO_OK ",\"pid\":1} x", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "hello: 1 stray bytes after the JSON object");
    assert_int_equal(dec(PROTO_MSG_OK, "{\"a\":1}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "ok: unknown field \"a\" (this message has no fields)");
}

static void test_numbers(void **state)
{
    (void)state;
    char err[512];
    const int C = PROTO_MSG_SESSION_CLOSE;
    assert_int_equal(dec(C, "{\"session_id\":9007199254740992}", err, sizeof err), 0);
    assert_int_equal(dec(C, "{\"session_id\":18446744073709551615}", err, sizeof err), RKV_ERANGE);
    assert_true(strstr(err, "integers above 2^53 travel as decimal strings") != NULL);
    assert_int_equal(dec(C, "{\"session_id\":\"18446744073709551615\"}", err, sizeof err), 0);
    assert_int_equal(dec(C, "{\"session_id\":\"18446744073709551616\"}", err, sizeof err),
                     RKV_EFORMAT);
    assert_int_equal(dec(C, "{\"session_id\":\"-1\"}", err, sizeof err), RKV_ERANGE);
    assert_int_equal(dec(C, "{\"session_id\":\"\"}", err, sizeof err), RKV_EFORMAT);
    assert_int_equal(dec(C, "{\"session_id\":\" 1\"}", err, sizeof err), RKV_EFORMAT);
    assert_int_equal(dec(C, "{\"session_id\":-0}", err, sizeof err), 0);
    assert_int_equal(dec(C, "{\"session_id\":1e3}", err, sizeof err), 0);
    assert_int_equal(dec(C, "{\"session_id\":1e999}", err, sizeof err), RKV_EFORMAT);

    const int W = PROTO_MSG_WORKER_REPORT;
    const char *ok = "{\"worker_id\":0,\"weights_bytes\":1,\"compute_reserve_bytes\":2,"
                     "\"pcie_h2d_gbps\":1.5,\"attn_device_gbps\":0,\"attn_host_gbps\":2,"
                     "\"attn_cpu_gbps\":%s}";
    char text[512];
    snprintf(text, sizeof text, ok, "3");
    assert_int_equal(dec(W, text, err, sizeof err), 0);
    snprintf(text, sizeof text, ok, "1e999");
    assert_int_equal(dec(W, text, err, sizeof err), RKV_ERANGE);
    assert_string_equal(err,
                        "worker_report: field \"attn_cpu_gbps\" must be a finite number, got inf");
    snprintf(text, sizeof text, ok, "-1");
    assert_int_equal(dec(W, text, err, sizeof err), RKV_ERANGE);
    assert_string_equal(
        err, "worker_report: field \"attn_cpu_gbps\" must be a number in [0, 1e+06], got -1");
    snprintf(text, sizeof text, ok, "\"3\"");
    assert_int_equal(dec(W, text, err, sizeof err), RKV_EFORMAT);

    /* i64 through strings both ways */
    struct proto_error e;
    const char *min = "{\"code\":\"-9223372036854775808\",\"message\":\"\"}";
    assert_int_equal(proto_json_decode(PROTO_MSG_ERROR, min, strlen(min), &e, err, sizeof err), 0);
    assert_true(e.code == INT64_MIN);
    char *json;
    size_t len;
    assert_int_equal(proto_json_encode(PROTO_MSG_ERROR, &e, &json, &len, err, sizeof err), 0);
    assert_string_equal(json, "{\"code\":\"-9223372036854775808\",\"message\":\"\"}");
    free(json);
}

static void test_arrays(void **state)
{
    (void)state;
    char err[512];
    const char *h = "{\"gpu\":0,\"sessions\":%s,\"bytes\":[0,0,0,0],\"device_used\":0,"
                    "\"device_total\":0,\"host_used\":0,\"host_total\":0}";
    char text[512];
    snprintf(text, sizeof text, h, "[1,2,3,4]");
    assert_int_equal(dec(PROTO_MSG_HISTOGRAM, text, err, sizeof err), 0);
    snprintf(text, sizeof text, h, "[1,2,3]");
    assert_int_equal(dec(PROTO_MSG_HISTOGRAM, text, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "histogram: field \"sessions\" must have exactly 4 entries, got 3");
    snprintf(text, sizeof text, h, "[1,2,\"x\",4]");
    assert_int_equal(dec(PROTO_MSG_HISTOGRAM, text, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(
        err, "histogram: field \"sessions\"[2] must be an integer in [0, 18446744073709551615], "
             "got \"x\"");
    snprintf(text, sizeof text, h, "{}");
    assert_int_equal(dec(PROTO_MSG_HISTOGRAM, text, err, sizeof err), RKV_EFORMAT);

    const char *st = "{\"kvmgr_pid\":1,\"uptime_ms\":0,\"n_sessions\":0,\"mode\":\"auto\","
                     "\"proto_version\":1,\"device_used\":0,\"device_total\":0,\"host_used\":0,"
                     "\"host_total\":0,\"worker_pids\":[%s]}";
    char pids[1024] = "";
    size_t used = 0;
    for (int i = 0; i < PROTO_MAX_WORKERS + 1; i++)
        used += (size_t)snprintf(pids + used, sizeof pids - used, "%s%d", i ? "," : "", i + 1);
    char big[2048];
    snprintf(big, sizeof big, st, pids);
    assert_int_equal(dec(PROTO_MSG_STATUS, big, err, sizeof err), RKV_ETOOBIG);
    assert_string_equal(err, "status: field \"worker_pids\" has 65 entries, the limit is 64");
    snprintf(big, sizeof big, st, "5,0");
    assert_int_equal(dec(PROTO_MSG_STATUS, big, err, sizeof err), RKV_ERANGE);
    assert_string_equal(
        err, "status: field \"worker_pids\"[1] must be an integer in [1, 4194303], got 0");
    snprintf(big, sizeof big, st, "");
    struct proto_status s;
    assert_int_equal(proto_json_decode(PROTO_MSG_STATUS, big, strlen(big), &s, err, sizeof err), 0);
    assert_int_equal(s.n_worker_pids, 0);
    assert_int_equal(s.n_worker_step_ms, 0); /* optional and absent: zero */
}

/* EVENTS: an array of objects, each checked by the tactic event's own table */
#define EVENTS_HEAD "\"kvmgr_pid\":7,\"first_seq\":1,\"last_seq\":2,\"dropped\":0"
#define EVENT_OK                                                                                   \
    "{\"session_id\":1,\"from\":\"new\",\"to\":\"window\",\"tail_blocks\":1,\"bytes_moved\":0,"    \
    "\"elapsed_us\":0,\"ts_ms\":1,\"gpu\":0,\"seq\":2}"

static void test_object_arrays(void **state)
{
    (void)state;
    char err[512];
    const int E = PROTO_MSG_EVENTS;
    assert_int_equal(dec(E, "{" EVENTS_HEAD ",\"events\":[]}", err, sizeof err), 0);
    assert_int_equal(
        dec(E, "{" EVENTS_HEAD ",\"events\":[" EVENT_OK "," EVENT_OK "]}", err, sizeof err), 0);
    assert_int_equal(dec(E, "{" EVENTS_HEAD "}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "events: missing required field \"events\"");
    assert_int_equal(dec(E, "{" EVENTS_HEAD ",\"events\":{}}", err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "events: field \"events\" must be an array, got an object");
    assert_int_equal(dec(E, "{" EVENTS_HEAD ",\"events\":[" EVENT_OK ",3]}", err, sizeof err),
                     RKV_EFORMAT);
    assert_string_equal(err, "events: field \"events\"[1]: tactic_event: payload must be a JSON "
                             "object, got 3");
    assert_int_equal(dec(E, "{" EVENTS_HEAD ",\"events\":[{\"session_id\":1}]}", err, sizeof err),
                     RKV_EFORMAT);
    assert_string_equal(err, "events: field \"events\"[0]: tactic_event: missing required field "
                             "\"from\"");
    assert_int_equal(
        dec(E, "{" EVENTS_HEAD ",\"events\":[" EVENT_OK ",{\"gpu\":-5}]}", err, sizeof err),
        RKV_ERANGE);
    assert_string_equal(err, "events: field \"events\"[1]: tactic_event: field \"gpu\" must be an "
                             "integer in [-1, 1023], got -5");
    /* one more than an EVENTS reply holds */
    size_t cap = (PROTO_MAX_EVENTS + 1) * (sizeof EVENT_OK) + 256;
    char *text = malloc(cap);
    size_t n = (size_t)snprintf(text, cap, "{" EVENTS_HEAD ",\"events\":[");
    for (int i = 0; i <= PROTO_MAX_EVENTS; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s" EVENT_OK, i ? "," : "");
    snprintf(text + n, cap - n, "]}");
    assert_int_equal(dec(E, text, err, sizeof err), RKV_ETOOBIG);
    assert_string_equal(err, "events: field \"events\" has 257 entries, the limit is 256");
    free(text);

    /* the encoder refuses what the decoder would: a count over the cap, a bad element */
    fill_all();
    struct proto_events *m = malloc(sizeof *m);
    *m = m_events;
    char *json;
    size_t len;
    m->n_events = PROTO_MAX_EVENTS + 1;
    assert_int_equal(proto_json_encode(E, m, &json, &len, err, sizeof err), RKV_EINVAL);
    assert_null(json);
    m->n_events = 2;
    m->events[1].to = 99;
    assert_int_equal(proto_json_encode(E, m, &json, &len, err, sizeof err), RKV_EINVAL);
    assert_null(json);
    assert_string_equal(err, "tactic_event: field \"to\" holds a value that cannot be sent (a NaN, "
                             "an unterminated string or an enum out of range)");
    free(m);
}

static void test_encode_refuses(void **state)
{
    (void)state;
    fill_all();
    char err[512];
    char *json = (char *)1;
    size_t len = 1;
    struct proto_hello h = m_hello;
    h.pid = 0;
    assert_int_equal(proto_json_encode(PROTO_MSG_HELLO, &h, &json, &len, err, sizeof err),
                     RKV_ERANGE);
    assert_null(json);
    assert_int_equal(len, 0);
    assert_string_equal(err, "hello: field \"pid\" must be an integer in [1, 4194303], got 0");
    h = m_hello;
    h.role = 3;
    assert_int_equal(proto_json_encode(PROTO_MSG_HELLO, &h, &json, &len, err, sizeof err),
                     RKV_EINVAL);
    h = m_hello;
    memset(h.build, 'x', sizeof h.build); /* no terminator */
    assert_int_equal(proto_json_encode(PROTO_MSG_HELLO, &h, &json, &len, err, sizeof err),
                     RKV_EINVAL);
    struct proto_worker_report r = m_report;
    r.attn_cpu_gbps = 0.0 / 0.0;
    assert_int_equal(proto_json_encode(PROTO_MSG_WORKER_REPORT, &r, &json, &len, err, sizeof err),
                     RKV_EINVAL);
    struct proto_status s = m_status;
    s.n_worker_pids = PROTO_MAX_WORKERS + 1;
    assert_int_equal(proto_json_encode(PROTO_MSG_STATUS, &s, &json, &len, err, sizeof err),
                     RKV_EINVAL);
    assert_int_equal(proto_json_encode(PROTO_MSG_STEP_REQ, &s, &json, &len, err, sizeof err),
                     RKV_EINVAL);
    assert_string_equal(err, "message type 64 (step_req) is not a JSON message");
    assert_int_equal(proto_json_decode(PROTO_MSG_STEP_REQ, "{}", 2, &s, err, sizeof err),
                     RKV_EINVAL);
}

/* a module's own message: a struct and a table, nothing else */
struct admin_drain {
    uint64_t session_ids[8];
    uint32_t n_session_ids;
    double grace_s;
    bool force;
};
static const struct proto_field f_drain[] = {
    PROTO_F_U64_ARR(struct admin_drain, session_ids, n_session_ids, 1, 0, 0),
    PROTO_F_F64(struct admin_drain, grace_s, 0, 0.0, 3600.0),
    PROTO_F_BOOL(struct admin_drain, force, 1),
};
static const struct proto_schema s_drain = PROTO_SCHEMA("drain", struct admin_drain, f_drain);

static void test_own_schema(void **state)
{
    (void)state;
    const char *text = "{\"session_ids\":[1,\"18446744073709551615\",3],\"force\":false,"
                       "\"grace_s\":2.5}";
    cJSON *obj = cJSON_Parse(text);
    struct admin_drain d;
    char err[256];
    assert_int_equal(proto_json_read(&s_drain, obj, &d, err, sizeof err), 0);
    assert_int_equal(d.n_session_ids, 3);
    assert_true(d.session_ids[1] == UINT64_MAX);
    assert_true(d.grace_s == 2.5);
    assert_false(d.force);
    cJSON *out = cJSON_CreateObject();
    assert_int_equal(proto_json_write(&s_drain, &d, out, err, sizeof err), 0);
    char *printed = cJSON_PrintUnformatted(out);
    assert_string_equal(printed, "{\"session_ids\":[1,\"18446744073709551615\",3],"
                                 "\"grace_s\":2.5,\"force\":false}");
    free(printed);
    cJSON_Delete(out);
    cJSON_Delete(obj);
    assert_int_equal(proto_json_decode_with(&s_drain, "{\"force\":1}", 11, &d, err, sizeof err),
                     RKV_EFORMAT);
    assert_string_equal(err, "drain: field \"force\" must be true or false, got 1");
}

/* a key twice anywhere is found, with its path; many keys go through the sorted check */
static void test_dup_keys(void **state)
{
    (void)state;
    static const struct {
        const char *json, *path;
    } cases[] = {
        {"{\"a\":1,\"b\":2}", NULL},
        {"{\"a\":1,\"a\":2}", "a"},
        {"{\"x\":{\"y\":[1,{\"z\":1,\"z\":2}]}}", "x.y[1].z"},
        {"[{},{\"k\":[],\"k\":{}}]", "[1].k"},
        {"{\"a\":{\"a\":1},\"b\":{\"a\":1}}", NULL},
        {"\"s\"", NULL},
    };
    char path[160];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *v = cJSON_Parse(cases[i].json);
        assert_non_null(v);
        int dup = proto_json_dup_key(v, path, sizeof path);
        if (dup != (cases[i].path != NULL) || (dup && strcmp(path, cases[i].path))) {
            print_error("case %zu %s: dup %d path '%s'\n", i, cases[i].json, dup, path);
            fail();
        }
        cJSON_Delete(v);
    }
    /* 200 keys, one of them twice, last */
    char big[4096];
    size_t n = 0;
    n += (size_t)snprintf(big + n, sizeof big - n, "{");
    for (int k = 0; k < 200; k++)
        n += (size_t)snprintf(big + n, sizeof big - n, "\"k%d\":%d,", k, k);
    snprintf(big + n, sizeof big - n, "\"k17\":0}");
    cJSON *v = cJSON_Parse(big);
    assert_non_null(v);
    assert_int_equal(proto_json_dup_key(v, path, sizeof path), 1);
    assert_string_equal(path, "k17");
    cJSON_DeleteItemFromObject(v, "k17");
    assert_int_equal(proto_json_dup_key(v, path, sizeof path), 0);
    cJSON_Delete(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_type),
        cmocka_unit_test(test_exact_text),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_object_arrays),
        cmocka_unit_test(test_encode_refuses),
        cmocka_unit_test(test_own_schema),
        cmocka_unit_test(test_dup_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
