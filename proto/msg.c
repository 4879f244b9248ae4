/* msg.c - field tables of the control messages: names, types, ranges, lengths. */
#include "proto/msg.h"

#include <stddef.h>

const char *const proto_role_names[] = {"worker", "rkvd", "rkvctl", NULL};
const char *const proto_mode_names[] = {"auto", "resident", "window", "cpu_tail", NULL};
const char *const proto_kv_dtype_names[] = {"f32", "f16", "q8", "fp8", NULL};
const char *const proto_tactic_names[] = {"resident", "window", "cpu_tail", "parked", "new", NULL};

/* rates are GB/s in [0, 1e6]: 0 means not measured */

static const struct proto_field f_empty[1] = {{0}};

static const struct proto_field f_error[] = {
    PROTO_F_I64(struct proto_error, code, 1, 0, 0),
    PROTO_F_STR(struct proto_error, message, 1),
};

static const struct proto_field f_hello[] = {
    PROTO_F_ENUM(struct proto_hello, role, 1, proto_role_names),
    PROTO_F_U32(struct proto_hello, pid, 1, 1, PROTO_MAX_PID),
    PROTO_F_U32(struct proto_hello, worker_id, 1, 0, PROTO_MAX_WORKERS - 1),
    PROTO_F_I64(struct proto_hello, gpu, 1, -1, PROTO_MAX_GPU),
    PROTO_F_U32(struct proto_hello, proto_version, 1, 1, 65535),
    PROTO_F_STR(struct proto_hello, build, 0),
    PROTO_F_U64(struct proto_hello, block_bytes, 0, 0, 1ull << 40),
    PROTO_F_U64(struct proto_hello, weights_bytes, 0, 0, 1ull << 50),
    PROTO_F_U64(struct proto_hello, compute_reserve_bytes, 0, 0, 1ull << 50),
    PROTO_F_ENUM(struct proto_hello, kv_dtype, 0, proto_kv_dtype_names),
    PROTO_F_U32(struct proto_hello, n_parts, 0, 0, 64),
    PROTO_F_U32(struct proto_hello, n_swa, 0, 0, 1u << 24),
};

static const struct proto_field f_hello_ack[] = {
    PROTO_F_BOOL(struct proto_hello_ack, accepted, 1),
    PROTO_F_U32(struct proto_hello_ack, kvmgr_pid, 1, 1, PROTO_MAX_PID),
    PROTO_F_STR(struct proto_hello_ack, device_pool_url, 0),
    PROTO_F_STR(struct proto_hello_ack, host_pool_name, 0),
    PROTO_F_U32(struct proto_hello_ack, block_size, 1, 1, 1u << 20),
    PROTO_F_U64(struct proto_hello_ack, block_bytes, 1, 0, 0),
    PROTO_F_U64(struct proto_hello_ack, n_device_blocks, 1, 0, 0),
    PROTO_F_U64(struct proto_hello_ack, n_host_blocks, 1, 0, 0),
    PROTO_F_U32(struct proto_hello_ack, max_batch_tokens, 0, 0, 1u << 20),
    PROTO_F_BOOL(struct proto_hello_ack, on_gpu, 0),
};

static const struct proto_field f_worker_report[] = {
    PROTO_F_U32(struct proto_worker_report, worker_id, 1, 0, PROTO_MAX_WORKERS - 1),
    PROTO_F_U64(struct proto_worker_report, weights_bytes, 1, 0, 0),
    PROTO_F_U64(struct proto_worker_report, compute_reserve_bytes, 1, 0, 0),
    PROTO_F_F64(struct proto_worker_report, pcie_h2d_gbps, 1, 0.0, 1e6),
    PROTO_F_F64(struct proto_worker_report, attn_device_gbps, 1, 0.0, 1e6),
    PROTO_F_F64(struct proto_worker_report, attn_host_gbps, 1, 0.0, 1e6),
    PROTO_F_F64(struct proto_worker_report, attn_cpu_gbps, 1, 0.0, 1e6),
    PROTO_F_F64(struct proto_worker_report, split_gbps, 0, 0.0, 1e6),
};

static const struct proto_field f_budget_get[] = {
    PROTO_F_I64(struct proto_budget_get, gpu, 1, -1, PROTO_MAX_GPU),
};

static const struct proto_field f_budget[] = {
    PROTO_F_U64(struct proto_budget, vram_target_bytes, 1, 0, 0),
    PROTO_F_U64(struct proto_budget, host_budget_bytes, 1, 0, 0),
    PROTO_F_U64(struct proto_budget, compute_reserve_bytes, 1, 0, 0),
    PROTO_F_I64(struct proto_budget, gpu, 1, -1, PROTO_MAX_GPU),
    PROTO_F_U64(struct proto_budget, plan_seq, 0, 0, 0),
};

static const struct proto_field f_mode[] = {
    PROTO_F_ENUM(struct proto_mode_msg, mode, 1, proto_mode_names),
};

static const struct proto_field f_session_close[] = {
    PROTO_F_U64(struct proto_session_close, session_id, 1, 0, 0),
};

static const struct proto_field f_tactic_event[] = {
    PROTO_F_U64(struct proto_tactic_event, session_id, 1, 0, 0),
    PROTO_F_ENUM(struct proto_tactic_event, from, 1, proto_tactic_names),
    PROTO_F_ENUM(struct proto_tactic_event, to, 1, proto_tactic_names),
    PROTO_F_STR(struct proto_tactic_event, reason, 0),
    PROTO_F_U64(struct proto_tactic_event, tail_blocks, 1, 0, 0),
    PROTO_F_U64(struct proto_tactic_event, bytes_moved, 1, 0, 0),
    PROTO_F_U64(struct proto_tactic_event, elapsed_us, 1, 0, 0),
    PROTO_F_U64(struct proto_tactic_event, ts_ms, 1, 0, 0),
    PROTO_F_I64(struct proto_tactic_event, gpu, 1, -1, PROTO_MAX_GPU),
    PROTO_F_U64(struct proto_tactic_event, seq, 0, 0, 0),
    PROTO_F_U32(struct proto_tactic_event, kvmgr_pid, 0, 0, PROTO_MAX_PID),
};

/* the element schema of EVENTS' array (the same table as TACTIC_EVENT's) */
static const struct proto_schema s_tactic_event =
    PROTO_SCHEMA("tactic_event", struct proto_tactic_event, f_tactic_event);

static const struct proto_field f_events_get[] = {
    PROTO_F_U64(struct proto_events_get, since, 1, 0, 0),
};

static const struct proto_field f_events[] = {
    PROTO_F_U32(struct proto_events, kvmgr_pid, 1, 1, PROTO_MAX_PID),
    PROTO_F_U64(struct proto_events, first_seq, 1, 0, 0),
    PROTO_F_U64(struct proto_events, last_seq, 1, 0, 0),
    PROTO_F_U64(struct proto_events, dropped, 1, 0, 0),
    PROTO_F_OBJ_ARR(struct proto_events, events, n_events, 1, &s_tactic_event),
};

static const struct proto_field f_histogram[] = {
    PROTO_F_I64(struct proto_histogram, gpu, 1, -1, PROTO_MAX_GPU),
    PROTO_F_U64_FIXED(struct proto_histogram, sessions, 1, 0, 0),
    PROTO_F_U64_FIXED(struct proto_histogram, bytes, 1, 0, 0),
    PROTO_F_U64(struct proto_histogram, device_used, 1, 0, 0),
    PROTO_F_U64(struct proto_histogram, device_total, 1, 0, 0),
    PROTO_F_U64(struct proto_histogram, host_used, 1, 0, 0),
    PROTO_F_U64(struct proto_histogram, host_total, 1, 0, 0),
    PROTO_F_U64(struct proto_histogram, plan_seq, 0, 0, 0),
};

static const struct proto_field f_status[] = {
    PROTO_F_U32(struct proto_status, kvmgr_pid, 1, 1, PROTO_MAX_PID),
    PROTO_F_U64(struct proto_status, uptime_ms, 1, 0, 0),
    PROTO_F_U64(struct proto_status, n_sessions, 1, 0, 0),
    PROTO_F_ENUM(struct proto_status, mode, 1, proto_mode_names),
    PROTO_F_U32(struct proto_status, proto_version, 1, 1, 65535),
    PROTO_F_STR(struct proto_status, build, 0),
    PROTO_F_U64(struct proto_status, device_used, 1, 0, 0),
    PROTO_F_U64(struct proto_status, device_total, 1, 0, 0),
    PROTO_F_U64(struct proto_status, host_used, 1, 0, 0),
    PROTO_F_U64(struct proto_status, host_total, 1, 0, 0),
    PROTO_F_U32_ARR(struct proto_status, worker_pids, n_worker_pids, 0, 1, PROTO_MAX_PID),
    PROTO_F_F64_ARR(struct proto_status, worker_step_ms, n_worker_step_ms, 0, 0, 1e9),
    PROTO_F_U64(struct proto_status, event_seq, 0, 0, 0),
    PROTO_F_STR(struct proto_status, pools_error, 0),
    PROTO_F_U64(struct proto_status, block_bytes, 0, 0, 1ull << 40),
    PROTO_F_ENUM(struct proto_status, kv_dtype, 0, proto_kv_dtype_names),
    PROTO_F_U32(struct proto_status, n_parts, 0, 0, 64),
};

#define EMPTY(nm)                                                                                  \
    {                                                                                              \
        .name = (nm), .size = sizeof(struct proto_empty), .fields = f_empty, .n_fields = 0         \
    }

static const struct proto_schema g_schemas[PROTO_MSG__MAX] = {
    [PROTO_MSG_ERROR] = PROTO_SCHEMA("error", struct proto_error, f_error),
    [PROTO_MSG_OK] = EMPTY("ok"),
    [PROTO_MSG_HELLO] = PROTO_SCHEMA("hello", struct proto_hello, f_hello),
    [PROTO_MSG_HELLO_ACK] = PROTO_SCHEMA("hello_ack", struct proto_hello_ack, f_hello_ack),
    [PROTO_MSG_WORKER_REPORT] =
        PROTO_SCHEMA("worker_report", struct proto_worker_report, f_worker_report),
    [PROTO_MSG_BUDGET_GET] = PROTO_SCHEMA("budget_get", struct proto_budget_get, f_budget_get),
    [PROTO_MSG_BUDGET] = PROTO_SCHEMA("budget", struct proto_budget, f_budget),
    [PROTO_MSG_BUDGET_SET] = PROTO_SCHEMA("budget_set", struct proto_budget, f_budget),
    [PROTO_MSG_MODE_GET] = EMPTY("mode_get"),
    [PROTO_MSG_MODE] = PROTO_SCHEMA("mode", struct proto_mode_msg, f_mode),
    [PROTO_MSG_MODE_SET] = PROTO_SCHEMA("mode_set", struct proto_mode_msg, f_mode),
    [PROTO_MSG_SESSION_CLOSE] =
        PROTO_SCHEMA("session_close", struct proto_session_close, f_session_close),
    [PROTO_MSG_TACTIC_EVENT] =
        PROTO_SCHEMA("tactic_event", struct proto_tactic_event, f_tactic_event),
    [PROTO_MSG_HISTOGRAM] = PROTO_SCHEMA("histogram", struct proto_histogram, f_histogram),
    [PROTO_MSG_STATUS_GET] = EMPTY("status_get"),
    [PROTO_MSG_STATUS] = PROTO_SCHEMA("status", struct proto_status, f_status),
    [PROTO_MSG_EVENTS_GET] = PROTO_SCHEMA("events_get", struct proto_events_get, f_events_get),
    [PROTO_MSG_EVENTS] = PROTO_SCHEMA("events", struct proto_events, f_events),
};

uint64_t proto_status_token_bytes(const struct proto_status *st, uint32_t block_size)
{
    return block_size ? st->block_bytes * (st->n_parts ? st->n_parts : 1) / block_size : 0;
}

const struct proto_schema *proto_msg_schema(int type)
{
    if (!proto_msg_is_json(type) || !g_schemas[type].name)
        return NULL;
    return &g_schemas[type];
}
