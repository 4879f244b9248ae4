/* msg.h - the control messages between rkv processes as C structs (JSON on the wire). */
#ifndef RKV_PROTO_MSG_H
#define RKV_PROTO_MSG_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/json.h"
#include "proto/proto.h"

/* limits a decoder enforces (see the field tables in msg.c) */
#define PROTO_MAX_PID     4194303u /* linux pid_max ceiling */
#define PROTO_MAX_GPU     1023     /* gpu index; -1 = cpu */
#define PROTO_MAX_WORKERS 64
#define PROTO_N_TACTICS   4
#define PROTO_MAX_EVENTS  256  /* tactic events in one EVENTS reply */
#define PROTO_MIN_BUDGET  4096 /* the least vram target and host budget kvmgr takes */

/* enums travel as their names; *_names are NULL-terminated, indexed by value */
enum proto_role { PROTO_ROLE_WORKER, PROTO_ROLE_RKVD, PROTO_ROLE_RKVCTL };
enum proto_mode { PROTO_MODE_AUTO, PROTO_MODE_RESIDENT, PROTO_MODE_WINDOW, PROTO_MODE_CPU_TAIL };
enum proto_tactic {
    PROTO_TACTIC_RESIDENT,
    PROTO_TACTIC_WINDOW,
    PROTO_TACTIC_CPU_TAIL,
    PROTO_TACTIC_PARKED,
    PROTO_TACTIC_NEW, /* tactic events only: a session's first placement (not in histograms) */
};
extern const char *const proto_role_names[]; /* worker rkvd rkvctl */
extern const char *const proto_mode_names[]; /* auto resident window cpu_tail */
/* a worker's KV element type, worker/kv.h's enum kv_dtype order: f32 f16 q8 fp8 */
extern const char *const proto_kv_dtype_names[];
extern const char *const proto_tactic_names[]; /* resident window cpu_tail parked new */

/* OK, MODE_GET, STATUS_GET: no fields ("{}") */
struct proto_empty {
    int unused_;
};

/* ERROR: the answer to any request that failed; code is an RKV_E* value */
struct proto_error {
    int64_t code;
    char message[512];
};

/* HELLO: the first request of a worker/rkvd/rkvctl to kvmgr or rkvd */
struct proto_hello {
    int role; /* enum proto_role */
    uint32_t pid;
    uint32_t worker_id;
    int64_t gpu; /* -1 = cpu */
    uint32_t proto_version;
    char build[64];
    /* workers: the kv geometry their model needs and what it costs in VRAM,
     * so kvmgr can size its pools before the first session */
    uint64_t block_bytes;
    uint64_t weights_bytes;
    /* device bytes a step of this model takes beyond what the worker already
     * holds (activations, staging), measured on the real graph; 0 = unknown */
    uint64_t compute_reserve_bytes;
    /* workers: the KV element type their blocks hold (proto_kv_dtype_names) */
    int kv_dtype;
    /* sliding windows: blocks per position block (0 or 1: one block of every layer) and the
     * local layers' window in positions; block_bytes is then one part */
    uint32_t n_parts;
    uint32_t n_swa;
};

struct proto_hello_ack {
    bool accepted;
    uint32_t kvmgr_pid;
    char device_pool_url[256];
    char host_pool_name[256];
    uint32_t block_size;  /* tokens per block */
    uint64_t block_bytes; /* bytes per block, all layers, K and V */
    uint64_t n_device_blocks;
    uint64_t n_host_blocks;
    /* workers, to rkvd: the most tokens one step may carry (what the worker sized its buffers
     * for; 0 = not said), and whether it computes on a gpu */
    uint32_t max_batch_tokens;
    bool on_gpu;
};

/* WORKER_REPORT: what a worker measured at start-up (rates in GB/s) */
struct proto_worker_report {
    uint32_t worker_id;
    uint64_t weights_bytes;
    uint64_t compute_reserve_bytes;
    double pcie_h2d_gbps;
    double attn_device_gbps;
    double attn_host_gbps;
    double attn_cpu_gbps;
    double split_gbps; /* the split host read's rate (cpu and link together); 0 = no split */
};

struct proto_budget_get {
    int64_t gpu;
};

/* BUDGET (reply) and BUDGET_SET (request, answered with BUDGET) */
struct proto_budget {
    uint64_t vram_target_bytes;
    uint64_t host_budget_bytes;
    uint64_t compute_reserve_bytes;
    int64_t gpu;
    uint64_t plan_seq; /* BUDGET: kvmgr's plan that applies it (0: not said) */
};

/* MODE (reply) and MODE_SET (request, answered with MODE) */
struct proto_mode_msg {
    int mode; /* enum proto_mode */
};

struct proto_session_close {
    uint64_t session_id;
};

/* TACTIC_EVENT: kvmgr publishes one per tactic transition, and keeps the last
 * ones numbered for EVENTS_GET (pub/sub drops what no subscriber is connected for) */
struct proto_tactic_event {
    uint64_t session_id;
    int from; /* enum proto_tactic */
    int to;   /* enum proto_tactic */
    char reason[128];
    uint64_t tail_blocks;
    uint64_t bytes_moved;
    uint64_t elapsed_us;
    uint64_t ts_ms; /* unix time */
    int64_t gpu;
    uint64_t seq;       /* 1 for a kvmgr's first event, then +1 each; 0 = not numbered */
    uint32_t kvmgr_pid; /* whose numbering seq is (a restarted kvmgr starts at 1) */
};

/* EVENTS_GET: the tactic events numbered after since (0 = all kvmgr still holds) */
struct proto_events_get {
    uint64_t since;
};

/* EVENTS: at most PROTO_MAX_EVENTS of them, oldest first; the caller asks again
 * with since = the last seq it got until it has last_seq */
struct proto_events {
    uint32_t kvmgr_pid;
    uint64_t first_seq; /* the oldest event kvmgr still holds; 0 = none yet */
    uint64_t last_seq;  /* the newest event kvmgr numbered; 0 = none yet */
    uint64_t dropped;   /* events after since that left kvmgr's ring before they were asked for */
    uint32_t n_events;
    struct proto_tactic_event events[PROTO_MAX_EVENTS];
};

/* HISTOGRAM: sessions and KV bytes per tactic on one gpu, indexed by enum proto_tactic */
struct proto_histogram {
    int64_t gpu;
    uint64_t sessions[PROTO_N_TACTICS];
    uint64_t bytes[PROTO_N_TACTICS];
    uint64_t device_used;
    uint64_t device_total;
    uint64_t host_used;
    uint64_t host_total;
    uint64_t plan_seq; /* the plan it describes: kvmgr counts them from 1 (0: not said) */
};

/* STATUS: kvmgr's overview for rkvd and rkvctl */
struct proto_status {
    uint32_t kvmgr_pid;
    uint64_t uptime_ms;
    uint64_t n_sessions;
    int mode; /* enum proto_mode */
    uint32_t proto_version;
    char build[64];
    uint64_t device_used;
    uint64_t device_total;
    uint64_t host_used;
    uint64_t host_total;
    uint32_t n_worker_pids;
    uint32_t worker_pids[PROTO_MAX_WORKERS];
    uint32_t n_worker_step_ms;
    double worker_step_ms[PROTO_MAX_WORKERS]; /* last decode step per worker */
    uint64_t event_seq; /* the newest tactic event's seq (EVENTS_GET); 0 = none yet */
    /* why kvmgr has no pools after a worker's hello ("" while it has them, or none was asked
     * for): what rkvd's /health says while no worker can attach */
    char pools_error[256];
    /* the pools' blocks: bytes each and the KV element type they hold (0, f32 while no worker
     * has said hello); blocks a position block takes (a sliding-window layout's parts: each
     * block then holds some of the layers; 0 read as 1) */
    uint64_t block_bytes;
    int kv_dtype;
    uint32_t n_parts;
};

/* the schema of a control message type, NULL for any other type */
const struct proto_schema *proto_msg_schema(int type);

/* bytes one position's KV takes, every layer, K and V, in the pools of st (positions of
 * block_size a block; a sliding-window layout's block is one of n_parts); 0 while kvmgr has no
 * pools or block_size is 0 */
uint64_t proto_status_token_bytes(const struct proto_status *st, uint32_t block_size);

#endif
