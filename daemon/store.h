/* store.h - rkvd's sqlite state: settings, API keys, sessions, tactic events, usage. */
#ifndef RKV_STORE_H
#define RKV_STORE_H

#include <stddef.h>
#include <stdint.h>

/* one database file, STATE_DIR/rkv.db, in WAL mode, with a schema version
 * and forward migrations. every call returns 0 or a negative code; a full
 * disk, a locked or corrupt database gives RKV_EIO/RKV_EBUSY with the sqlite
 * message in the log, never a crash. not thread-safe: rkvd calls it from
 * its loop thread only. */
struct store;

#define STORE_SCHEMA_VERSION 3

int store_open(const char *state_dir, struct store **out, char *errbuf, size_t errlen);
void store_close(struct store *s);
int store_schema_version(struct store *s);
/* "ok" or the first problem sqlite's integrity_check reports */
int store_integrity_check(struct store *s, char *buf, size_t len);

/* settings: runtime budgets and mode that survive a restart.
 * get: RKV_ENOTFOUND when the key was never set. */
int store_setting_get(struct store *s, const char *key, char *val, size_t len);
int store_setting_set(struct store *s, const char *key, const char *val);

/* API keys: only a PBKDF2-SHA256 hash with a random salt is stored; the
 * secret ("rkv-" + 48 hex chars) is returned once by store_key_add. */
struct store_key {
    int64_t id;
    char name[64];
    char scope[16];  /* "user" | "admin" */
    char prefix[12]; /* first chars of the secret, to tell keys apart */
    int64_t created_ms;
    int revoked;
    struct store_key_limits {
        /* per key; STORE_LIMIT_DEFAULT follows rkvd's key_* config, 0 = unlimited */
        int64_t rpm, tpm, max_concurrent, max_tokens, max_prompt;
    } lim;
};
#define STORE_LIMIT_DEFAULT (-1)
#define STORE_LIMIT_KEEP    (-2) /* store_key_set_limits: leave this one as it is */
int store_key_add(struct store *s, const char *name, const char *scope, char *secret,
                  size_t secret_len, int64_t *id);
/* 0 and the key (id, scope) when the secret matches a live key, RKV_EAUTH
 * otherwise; comparison in constant time */
int store_key_verify(struct store *s, const char *secret, struct store_key *out);
int store_key_revoke(struct store *s, int64_t id);
/* changes a live key's limits (fields STORE_LIMIT_KEEP stay); RKV_ENOTFOUND
 * when no live key has that id; *out (optional) gets the key as stored */
int store_key_set_limits(struct store *s, int64_t id, const struct store_key_limits *lim,
                         struct store_key *out);
int store_key_count(struct store *s, int *n_live);
/* up to cap keys, newest first; *n = how many were written */
int store_key_list(struct store *s, struct store_key *keys, size_t cap, size_t *n);

/* sessions: the conversation's token history (prompt + generated tokens),
 * so KV can be rebuilt by re-prefill if kvmgr dies. owner is the API key
 * id (0 without keys): a session is only visible to its owner. */
int store_session_save(struct store *s, const char *ext_id, int64_t owner, const int32_t *tokens,
                       size_t n_tokens);
/* RKV_ENOTFOUND when absent or owned by someone else. *tokens is malloc'd */
int store_session_load(struct store *s, const char *ext_id, int64_t owner, int32_t **tokens,
                       size_t *n_tokens);
int store_session_delete(struct store *s, const char *ext_id, int64_t owner);

/* tactic transitions published by kvmgr */
struct store_event {
    int64_t ts_ms;
    uint64_t session_id;
    int64_t gpu;
    char from[16];
    char to[16];
    char reason[96];
    uint64_t bytes_moved;
    uint64_t elapsed_us;
};
int store_event_add(struct store *s, const struct store_event *e);
/* events with ts_ms >= since_ms (and session_id == session when nonzero),
 * oldest first, at most cap */
int store_event_list(struct store *s, int64_t since_ms, uint64_t session, struct store_event *ev,
                     size_t cap, size_t *n);

/* one finished request */
struct store_usage {
    int64_t ts_ms;
    int64_t key_id;
    char endpoint[32];
    int status;
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    double ttft_ms;
    double e2e_ms;
};
int store_usage_add(struct store *s, const struct store_usage *u);
int store_usage_count(struct store *s, int64_t *n);

#endif
