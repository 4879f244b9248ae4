/* admin.h - rkvd's admin API: one command table, served on the admin socket (nng rep) and HTTP. */
#ifndef RKV_ADMIN_H
#define RKV_ADMIN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include <cjson/cJSON.h>

#include "daemon/driver.h"
#include "daemon/sched.h"
#include "proto/msg.h"

/*
 * Every command takes a JSON object of arguments and answers a JSON result
 * or an error (an RKV_E* code and a message naming the bad field and what
 * was expected). The same table is served two ways:
 *
 *   socket  RUNTIME_DIR/admin.sock, nng rep, envelope PROTO_MSG_ADMIN_REQ
 *           {"cmd":"budget_set","args":{...}} answered with ADMIN_RESP
 *           {"ok":true,"result":{...}} or an ERROR envelope; the file is
 *           mode 0660 (group admin_group): whoever can open it is an admin.
 *   HTTP    GET /admin/v1/<cmd>?k=v (read-only commands) and
 *           POST /admin/v1/<cmd> with a JSON body; answers
 *           {"ok":true,"result":...} or {"ok":false,"error":{code,name,message}}.
 *           Commands that change something need "Authorization: Bearer
 *           rkv-..." of a key with admin scope; read-only ones are open to
 *           loopback peers, or to any valid key.
 *
 * Admin talks to the rest of rkvd only through struct admin_ops (filled by
 * main.c) and the store. Everything runs on rkvd's loop thread.
 */

#define ADMIN_MAX_WORKERS 64
#define ADMIN_VERSION     "0.1.0"

struct admin_worker_info {
    uint32_t id;
    int64_t gpu;  /* -1 = cpu */
    uint32_t pid; /* 0 when not running */
    int up;       /* answered hello: model loaded */
    int draining;
    uint32_t restarts;
    const char *state; /* "running" "backoff" "failed" "stopped" */
    struct sched_steps steps; /* its step sizes (0: not up yet) */
    uint32_t beside_now;      /* prompt tokens its next step beside a decode may take */
};

/* what rkvd knows about itself; main.c fills it on demand */
struct admin_info {
    const char *model; /* served name */
    const char *model_path;
    const char *backend;
    const char *listen;
    int deterministic; /* the workers run batch-invariant kernels */
    uint64_t uptime_ms;
    int healthy;
    char health_reason[384];
    int kvmgr_up;
    uint32_t kvmgr_restarts;
    struct proto_status kv; /* kvmgr's last STATUS */
    uint32_t n_workers;
    struct admin_worker_info workers[ADMIN_MAX_WORKERS];
    struct sched_stats st;
    uint32_t block_size;
    uint32_t ctx_size;
    const char *kv_dtype; /* the configured KV element type: "f16", "q8", ... */
};

struct admin_ops {
    void (*info)(void *ctx, struct admin_info *out);
    /* driver_kvmgr_call: the reply comes back on the loop */
    int (*kvmgr_call)(void *ctx, int type, const void *payload, size_t len, driver_call_cb cb,
                      void *ud);
    void (*sessions_foreach)(void *ctx, sched_session_fn fn, void *ud);
    int (*session_evict)(void *ctx, uint64_t sid);
    int (*session_pin)(void *ctx, uint64_t sid, int pinned);
    int (*worker_restart)(void *ctx, uint32_t worker, uint32_t *old_pid);
    int (*worker_drain)(void *ctx, uint32_t worker, int drain);
    /* kvmgr took new budgets: rkvd keeps them for a kvmgr restart */
    void (*budget_applied)(void *ctx, uint64_t vram_target, uint64_t host_budget,
                           uint64_t compute_reserve);
    void *ctx;
};

struct admin_config {
    const char *socket_path;                            /* NULL or "" = no admin socket */
    const char *socket_group;                           /* NULL or "" = the process's group */
    uint64_t vram_target, host_budget, compute_reserve; /* as kvmgr was started */
    uint32_t n_gpus;
};

struct admin;
struct store;
struct http_req;

/* listens on the socket (mode 0660, group set) when one is configured;
 * errors name the path or group and the fix */
int admin_create(uv_loop_t *loop, const struct admin_config *cfg, const struct admin_ops *ops,
                 struct store *store, struct admin **out, char *errbuf, size_t errlen);
/* SIGTERM: answers what is pending with an error, stops listening */
void admin_shutdown(struct admin *a);
/* after the loop has closed every handle */
void admin_destroy(struct admin *a);

/* GET / (the status page) and /admin/v1/...: 1 when it handled req */
int admin_http(struct admin *a, struct http_req *req);
/* api_sched.authorize for /v1: 0 when no key exists or bearer is a live key */
int admin_authorize(struct admin *a, const char *bearer);
/* the same check, and which key it was: *id 0 and every limit
 * STORE_LIMIT_DEFAULT when no key exists (the API is open) */
struct store_key_limits;
int admin_key_lookup(struct admin *a, const char *bearer, int64_t *id,
                     struct store_key_limits *lim);

/* news from kvmgr (driver callbacks) and the periodic timer */
void admin_on_histogram(struct admin *a, const struct proto_histogram *h);
void admin_on_tactic_event(struct admin *a, const struct proto_tactic_event *ev);
/* a new kvmgr (restart): budgets set at runtime are sent to it again */
void admin_on_kvmgr_changed(struct admin *a, uint32_t old_pid);
void admin_tick(struct admin *a);

/* runs one command; done gets the result or the error (code < 0, message).
 * changes = 0 refuses commands that change state (RKV_EAUTH). done may run
 * before admin_exec returns, or later on the loop. */
typedef void (*admin_done_fn)(void *ud, int rc, const cJSON *result, const char *err);
void admin_exec(struct admin *a, const char *cmd, const cJSON *args, int changes,
                admin_done_fn done, void *ud);
/* 1 for a command that exists and changes state, 0 read-only, -1 unknown */
int admin_cmd_changes(const char *cmd);

/* the embedded status page (daemon/status_page.c) */
extern const char admin_status_page[];

#endif
