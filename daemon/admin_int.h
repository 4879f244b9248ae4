/* admin_int.h - private parts of rkvd's admin API shared by admin.c, admin_http.c,
 * admin_sock.c, admin_keys.c and admin_kvmgr.c. */
#ifndef RKV_ADMIN_INT_H
#define RKV_ADMIN_INT_H

#include <stdint.h>

#include <openssl/sha.h>

#include "common/util.h"
#include "daemon/admin.h"
#include "daemon/store.h"

#define KEY_CACHE    16 /* verified secrets (pbkdf2 is slow on purpose) */
#define RATE_SAMPLES 8

enum via { VIA_SOCK, VIA_HTTP, VIA_FN };

struct admin_req;
typedef void (*admin_cmd_fn)(struct admin *a, const cJSON *args, struct admin_req *r);

struct admin_cmd {
    const char *name;
    int changes;
    const char *fields; /* accepted argument names, space separated */
    admin_cmd_fn fn;
    int needs_admin; /* a read that shows other keys' data: never to a user-scope key */
};

/* one command in flight; freed when answered and no callback still points at it */
struct admin_req {
    struct admin *a;
    const struct admin_cmd *cmd;
    enum via via;
    uint64_t req_id;       /* socket */
    struct http_req *http; /* http */
    admin_done_fn done;    /* fn */
    void *done_ud;
    int answered;
    /* whose data it may see: 0 everything (the socket, an admin key, or no keys exist),
     * else the id of the user-scope key asking, which sees only its own sessions */
    int64_t viewer;
    int waiting_kv;         /* a kvmgr call holds a pointer to it */
    int waiting_hist;       /* budget_set: the histograms after the re-plan */
    uint64_t hist_after_ms; /* ... arrived after this (wall ms) */
    uint64_t hist_seq;      /* ... and describe this plan or a later one (0: not known) */
    cJSON *state;           /* what a multi-step command carries (budget before, new budget) */
    struct admin_req *next;
};

struct tactic_state {
    uint8_t tactic;
    uint8_t rotated; /* parked by kvmgr's rotation: waits for its turn with its request open */
    uint32_t gpu;
    uint64_t tail_blocks;
    uint64_t ts_ms;
};

struct key_cache_ent {
    unsigned char hash[SHA256_DIGEST_LENGTH];
    int64_t id;
    char scope[16];
    struct store_key_limits lim;
    uint64_t at_ms;
    int used;
};

struct proto_sock;

struct admin {
    uv_loop_t *loop;
    struct admin_config cfg;
    char socket_path[512];
    struct admin_ops ops;
    struct store *store;
    struct proto_sock *sock;
    uv_poll_t poll;
    int polling, sock_busy, stopping;
    uv_timer_t hist_timer;
    int handles_open;
    struct admin_req *reqs; /* every live request */
    /* the last histogram per gpu */
    struct proto_histogram hist[ADMIN_MAX_WORKERS];
    uint64_t hist_ms[ADMIN_MAX_WORKERS]; /* wall clock it arrived, 0 = never */
    struct rkv_map tactics;              /* sid -> struct tactic_state */
    uint64_t last_prune_ms;
    int runtime_budget; /* budget_set happened: resend to a new kvmgr */
    uint64_t vram_target, host_budget, compute_reserve;
    int n_keys; /* live api keys */
    struct key_cache_ent keys[KEY_CACHE];
    uint64_t rate_ms[RATE_SAMPLES], rate_tok[RATE_SAMPLES];
    uint32_t rate_n, rate_pos;
};

/* requests and the table (admin.c) */
struct admin_req *admin_req_create(struct admin *a, enum via via);
/* runs r's command (or refuses it) */
void admin_run(struct admin *a, struct admin_req *r, const char *name, const cJSON *args,
               int changes);
const struct admin_cmd *admin_cmd_find(const char *name);
/* takes result; rc < 0 sends msg as the error */
void admin_req_finish(struct admin_req *r, int rc, cJSON *result, const char *msg);
__attribute__((format(printf, 3, 4))) void admin_req_fail(struct admin_req *r, int rc,
                                                          const char *fmt, ...);
/* frees r once it is answered and nothing waits on it */
void admin_req_maybe_destroy(struct admin_req *r);

/* arguments (admin.c): 1 when present, 0 absent, -1 refused (r is failed) */
const cJSON *admin_arg(const cJSON *args, const char *name);
int admin_arg_int(struct admin_req *r, const cJSON *args, const char *name, int64_t min,
                  int64_t max, int64_t *out);
int admin_arg_size(struct admin_req *r, const cJSON *args, const char *name, uint64_t min,
                   uint64_t *out);

/* the front ends' answers; they take result */
void admin_http_answer(struct admin_req *r, int rc, cJSON *result, const char *msg);
void admin_sock_answer(struct admin_req *r, int rc, cJSON *result, const char *msg);
/* listens on a->socket_path (admin_sock.c) */
int admin_sock_open(struct admin *a, char *err, size_t errlen);
void admin_sock_pump(struct admin *a);

/* keys (admin_keys.c) */
int admin_key_verify(struct admin *a, const char *secret, struct store_key *key);
void admin_keys_changed(struct admin *a);
void admin_cmd_keys_add(struct admin *a, const cJSON *args, struct admin_req *r);
void admin_cmd_keys_list(struct admin *a, const cJSON *args, struct admin_req *r);
void admin_cmd_keys_revoke(struct admin *a, const cJSON *args, struct admin_req *r);
void admin_cmd_keys_limits(struct admin *a, const cJSON *args, struct admin_req *r);

/* budgets, mode and kvmgr's news (admin_kvmgr.c) */
cJSON *admin_budget_json(uint64_t vram, uint64_t host, uint64_t reserve);
cJSON *admin_hist_json(const struct admin *a, int64_t gpu);
void admin_tactics_prune(struct admin *a);
void admin_cmd_budget_get(struct admin *a, const cJSON *args, struct admin_req *r);
void admin_cmd_budget_set(struct admin *a, const cJSON *args, struct admin_req *r);
void admin_cmd_mode_get(struct admin *a, const cJSON *args, struct admin_req *r);
void admin_cmd_mode_set(struct admin *a, const cJSON *args, struct admin_req *r);

#endif
