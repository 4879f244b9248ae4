/* store.c - sqlite (WAL) state for rkvd with a versioned schema. */
#include "daemon/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sqlite3.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

struct store {
    sqlite3 *db;
};

/* migrations[i] takes the schema from version i to i+1 */
static const char *const migrations[] = {
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE api_keys (id INTEGER PRIMARY KEY, name TEXT NOT NULL, scope TEXT NOT NULL,"
    "  prefix TEXT NOT NULL, salt BLOB NOT NULL, hash BLOB NOT NULL, lookup BLOB NOT NULL,"
    "  created_ms INTEGER NOT NULL, revoked INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX api_keys_lookup ON api_keys(lookup);"
    "CREATE TABLE sessions (ext_id TEXT NOT NULL, owner INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL, used_ms INTEGER NOT NULL, n_tokens INTEGER NOT NULL,"
    "  tokens BLOB NOT NULL, PRIMARY KEY (ext_id, owner));"
    "CREATE TABLE tactic_events (id INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL,"
    "  session_id INTEGER NOT NULL, gpu INTEGER NOT NULL, from_tactic TEXT NOT NULL,"
    "  to_tactic TEXT NOT NULL, reason TEXT NOT NULL, bytes_moved INTEGER NOT NULL,"
    "  elapsed_us INTEGER NOT NULL);"
    "CREATE INDEX tactic_events_ts ON tactic_events(ts_ms);"
    "CREATE TABLE usage (id INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, key_id INTEGER NOT NULL,"
    "  endpoint TEXT NOT NULL, status INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,"
    "  completion_tokens INTEGER NOT NULL, ttft_ms REAL NOT NULL, e2e_ms REAL NOT NULL);",
    /* 2: per-key limits; NULL follows the configured default */
    "ALTER TABLE api_keys ADD COLUMN rpm INTEGER;"
    "ALTER TABLE api_keys ADD COLUMN tpm INTEGER;"
    "ALTER TABLE api_keys ADD COLUMN max_concurrent INTEGER;"
    "ALTER TABLE api_keys ADD COLUMN max_tokens INTEGER;",
    /* 3: the per-key prompt cap */
    "ALTER TABLE api_keys ADD COLUMN max_prompt INTEGER;",
};

#define PBKDF2_ITERS 100000
#define SALT_LEN     16
#define HASH_LEN     32

/* sqlite result -> rkv code, logging the database's own words */
static int db_err(struct store *s, int rc, const char *what)
{
    int code;
    switch (rc) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: code = RKV_EBUSY; break;
    case SQLITE_NOMEM: code = RKV_ENOMEM; break;
    case SQLITE_FULL: code = RKV_ENOSPACE; break;
    default: code = RKV_EIO; break;
    }
    log_ratelimited(RKV_LOG_ERROR, 10000, 5, "state database: %s failed: %s", what,
                    s && s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    return code;
}

static int exec(struct store *s, const char *sql, const char *what)
{
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : db_err(s, rc, what);
}

static int prepare(struct store *s, const char *sql, sqlite3_stmt **st)
{
    int rc = sqlite3_prepare_v2(s->db, sql, -1, st, NULL);
    return rc == SQLITE_OK ? 0 : db_err(s, rc, "prepare");
}

/* steps a write statement to completion and finalizes it */
static int step_done(struct store *s, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_err(s, rc, what);
}

int store_schema_version(struct store *s)
{
    sqlite3_stmt *st;
    if (prepare(s, "PRAGMA user_version", &st))
        return -1;
    int v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    return v;
}

static int migrate(struct store *s, char *errbuf, size_t errlen)
{
    int v = store_schema_version(s);
    if (v < 0) {
        snprintf(errbuf, errlen, "cannot read the schema version: %s", sqlite3_errmsg(s->db));
        return RKV_EIO;
    }
    if (v > STORE_SCHEMA_VERSION) {
        snprintf(errbuf, errlen,
                 "the database has schema version %d but this rkvd knows only up to %d: "
                 "run a newer rkvd or move the state directory aside",
                 v, STORE_SCHEMA_VERSION);
        return RKV_EVERSION;
    }
    for (; v < STORE_SCHEMA_VERSION; v++) {
        char sql[64];
        int rc = exec(s, "BEGIN IMMEDIATE", "begin migration");
        if (!rc)
            rc = exec(s, migrations[v], "migration");
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
        if (!rc)
            rc = exec(s, sql, "set schema version");
        if (!rc)
            rc = exec(s, "COMMIT", "commit migration");
        if (rc) {
            exec(s, "ROLLBACK", "rollback migration");
            snprintf(errbuf, errlen, "migrating the schema from version %d failed: %s", v,
                     sqlite3_errmsg(s->db));
            return rc;
        }
    }
    return 0;
}

int store_open(const char *state_dir, struct store **out, char *errbuf, size_t errlen)
{
    char path[4096];
    struct stat st;
    if (stat(state_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(errbuf, errlen, "state directory %s does not exist: create it or set state_dir",
                 state_dir);
        return RKV_ENOTFOUND;
    }
    snprintf(path, sizeof path, "%s/rkv.db", state_dir);
    struct store *s = calloc(1, sizeof *s);
    if (!s)
        return RKV_ENOMEM;
    int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        snprintf(errbuf, errlen, "%s: cannot open: %s", path,
                 s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
        sqlite3_close(s->db);
        free(s);
        return RKV_EIO;
    }
    sqlite3_busy_timeout(s->db, 2000);
    rc = exec(s, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
              "set pragmas");
    if (rc) {
        snprintf(errbuf, errlen, "%s: %s (is it a sqlite database?)", path, sqlite3_errmsg(s->db));
    } else if ((rc = migrate(s, errbuf, errlen)) == 0) {
        *out = s;
        return 0;
    }
    sqlite3_close(s->db);
    free(s);
    return rc;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    sqlite3_close(s->db);
    free(s);
}

int store_integrity_check(struct store *s, char *buf, size_t len)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "PRAGMA integrity_check", &st);
    if (rc)
        return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        snprintf(buf, len, "%s", (const char *)sqlite3_column_text(st, 0));
        rc = 0;
    } else {
        rc = db_err(s, rc, "integrity_check");
    }
    sqlite3_finalize(st);
    return rc;
}

int store_setting_get(struct store *s, const char *key, char *val, size_t len)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "SELECT value FROM settings WHERE key = ?", &st);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        snprintf(val, len, "%s", (const char *)sqlite3_column_text(st, 0));
        rc = 0;
    } else {
        rc = rc == SQLITE_DONE ? RKV_ENOTFOUND : db_err(s, rc, "read setting");
    }
    sqlite3_finalize(st);
    return rc;
}

int store_setting_set(struct store *s, const char *key, const char *val)
{
    sqlite3_stmt *st;
    int rc = prepare(s,
                     "INSERT INTO settings(key, value) VALUES(?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                     &st);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, val, -1, SQLITE_STATIC);
    return step_done(s, st, "write setting");
}

/* the stored hash: PBKDF2-HMAC-SHA256(secret, salt) */
static int key_hash(const char *secret, const uint8_t *salt, uint8_t *hash)
{
    return PKCS5_PBKDF2_HMAC(secret, (int)strlen(secret), salt, SALT_LEN, PBKDF2_ITERS,
                             EVP_sha256(), HASH_LEN, hash) == 1
               ? 0
               : RKV_EINTERNAL;
}

/* an unsalted sha256 of the secret finds the candidate row without a scan;
 * the salted KDF then decides */
static int key_lookup(const char *secret, uint8_t *out)
{
    unsigned int n = 0;
    return EVP_Digest(secret, strlen(secret), out, &n, EVP_sha256(), NULL) == 1 ? 0 : RKV_EINTERNAL;
}

int store_key_add(struct store *s, const char *name, const char *scope, char *secret,
                  size_t secret_len, int64_t *id)
{
    uint8_t raw[24], salt[SALT_LEN], hash[HASH_LEN], lookup[32];
    if (secret_len < 53)
        return RKV_ETOOBIG;
    if (strcmp(scope, "user") != 0 && strcmp(scope, "admin") != 0)
        return RKV_EINVAL;
    if (getrandom(raw, sizeof raw, 0) != sizeof raw || getrandom(salt, sizeof salt, 0) != SALT_LEN)
        return RKV_EIO;
    int o = snprintf(secret, secret_len, "rkv-");
    for (size_t i = 0; i < sizeof raw; i++)
        o += snprintf(secret + o, secret_len - (size_t)o, "%02x", raw[i]);
    int rc = key_hash(secret, salt, hash);
    if (!rc)
        rc = key_lookup(secret, lookup);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    if ((rc = prepare(s,
                      "INSERT INTO api_keys(name, scope, prefix, salt, hash, lookup, created_ms)"
                      " VALUES(?, ?, ?, ?, ?, ?, ?)",
                      &st)))
        return rc;
    char prefix[12];
    snprintf(prefix, sizeof prefix, "%.10s", secret);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, scope, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, prefix, -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 4, salt, SALT_LEN, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 5, hash, HASH_LEN, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 6, lookup, sizeof lookup, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)rkv_wall_ms());
    if ((rc = step_done(s, st, "add api key")))
        return rc;
    if (id)
        *id = sqlite3_last_insert_rowid(s->db);
    OPENSSL_cleanse(raw, sizeof raw);
    return 0;
}

/* what key_row reads, in its order */
#define KEY_COLS                                                                                   \
    "id, name, scope, prefix, created_ms, revoked, rpm, tpm, max_concurrent, max_tokens, "         \
    "max_prompt"

static void key_row(sqlite3_stmt *st, struct store_key *k)
{
    memset(k, 0, sizeof *k);
    k->id = sqlite3_column_int64(st, 0);
    snprintf(k->name, sizeof k->name, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(k->scope, sizeof k->scope, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(k->prefix, sizeof k->prefix, "%s", (const char *)sqlite3_column_text(st, 3));
    k->created_ms = sqlite3_column_int64(st, 4);
    k->revoked = sqlite3_column_int(st, 5);
    int64_t *lim[] = {&k->lim.rpm, &k->lim.tpm, &k->lim.max_concurrent, &k->lim.max_tokens,
                      &k->lim.max_prompt};
    for (int i = 0; i < 5; i++)
        *lim[i] = sqlite3_column_type(st, 6 + i) == SQLITE_NULL ? STORE_LIMIT_DEFAULT
                                                                : sqlite3_column_int64(st, 6 + i);
}

int store_key_verify(struct store *s, const char *secret, struct store_key *out)
{
    uint8_t lookup[32], hash[HASH_LEN];
    if (!secret || strlen(secret) > 256)
        return RKV_EAUTH;
    int rc = key_lookup(secret, lookup);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    if ((rc = prepare(s,
                      "SELECT " KEY_COLS ", salt, hash "
                      "FROM api_keys WHERE lookup = ? AND revoked = 0",
                      &st)))
        return rc;
    sqlite3_bind_blob(st, 1, lookup, sizeof lookup, SQLITE_STATIC);
    rc = RKV_EAUTH;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        const void *salt = sqlite3_column_blob(st, 11), *want = sqlite3_column_blob(st, 12);
        if (sqlite3_column_bytes(st, 11) != SALT_LEN || sqlite3_column_bytes(st, 12) != HASH_LEN)
            continue;
        if (key_hash(secret, salt, hash) == 0 && CRYPTO_memcmp(hash, want, HASH_LEN) == 0) {
            if (out)
                key_row(st, out);
            rc = 0;
            break;
        }
    }
    if (step != SQLITE_ROW && step != SQLITE_DONE)
        rc = db_err(s, step, "verify api key");
    sqlite3_finalize(st);
    return rc;
}

int store_key_revoke(struct store *s, int64_t id)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "UPDATE api_keys SET revoked = 1 WHERE id = ? AND revoked = 0", &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    if ((rc = step_done(s, st, "revoke api key")))
        return rc;
    return sqlite3_changes(s->db) == 1 ? 0 : RKV_ENOTFOUND;
}

int store_key_set_limits(struct store *s, int64_t id, const struct store_key_limits *lim,
                         struct store_key *out)
{
    /* a field is written when it is not KEEP: NULL for DEFAULT */
    sqlite3_stmt *st;
    int rc = prepare(s,
                     "UPDATE api_keys SET"
                     " rpm = CASE WHEN ?2 = -2 THEN rpm WHEN ?2 = -1 THEN NULL ELSE ?2 END,"
                     " tpm = CASE WHEN ?3 = -2 THEN tpm WHEN ?3 = -1 THEN NULL ELSE ?3 END,"
                     " max_concurrent = CASE WHEN ?4 = -2 THEN max_concurrent"
                     "   WHEN ?4 = -1 THEN NULL ELSE ?4 END,"
                     " max_tokens = CASE WHEN ?5 = -2 THEN max_tokens"
                     "   WHEN ?5 = -1 THEN NULL ELSE ?5 END,"
                     " max_prompt = CASE WHEN ?6 = -2 THEN max_prompt"
                     "   WHEN ?6 = -1 THEN NULL ELSE ?6 END"
                     " WHERE id = ?1 AND revoked = 0",
                     &st);
    if (rc)
        return rc;
    const int64_t v[] = {lim->rpm, lim->tpm, lim->max_concurrent, lim->max_tokens, lim->max_prompt};
    sqlite3_bind_int64(st, 1, id);
    for (int i = 0; i < 5; i++) {
        if (v[i] < STORE_LIMIT_KEEP) {
            sqlite3_finalize(st);
            return RKV_EINVAL;
        }
        sqlite3_bind_int64(st, 2 + i, v[i]);
    }
    if ((rc = step_done(s, st, "set api key limits")))
        return rc;
    if (sqlite3_changes(s->db) != 1)
        return RKV_ENOTFOUND;
    if (!out)
        return 0;
    if ((rc = prepare(s, "SELECT " KEY_COLS " FROM api_keys WHERE id = ?", &st)))
        return rc;
    sqlite3_bind_int64(st, 1, id);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        key_row(st, out);
    rc = rc == SQLITE_ROW ? 0 : db_err(s, rc, "read api key");
    sqlite3_finalize(st);
    return rc;
}

int store_key_count(struct store *s, int *n_live)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "SELECT count(*) FROM api_keys WHERE revoked = 0", &st);
    if (rc)
        return rc;
    rc = sqlite3_step(st);
    *n_live = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    rc = rc == SQLITE_ROW ? 0 : db_err(s, rc, "count api keys");
    sqlite3_finalize(st);
    return rc;
}

int store_key_list(struct store *s, struct store_key *keys, size_t cap, size_t *n)
{
    sqlite3_stmt *st;
    *n = 0;
    int rc = prepare(s, "SELECT " KEY_COLS " FROM api_keys ORDER BY id DESC", &st);
    if (rc)
        return rc;
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW)
        key_row(st, &keys[(*n)++]);
    rc = (rc == SQLITE_ROW || rc == SQLITE_DONE || *n == cap) ? 0 : db_err(s, rc, "list keys");
    sqlite3_finalize(st);
    return rc;
}

int store_session_save(struct store *s, const char *ext_id, int64_t owner, const int32_t *tokens,
                       size_t n_tokens)
{
    sqlite3_stmt *st;
    int rc = prepare(s,
                     "INSERT INTO sessions(ext_id, owner, created_ms, used_ms, n_tokens, tokens)"
                     " VALUES(?1, ?2, ?3, ?3, ?4, ?5) ON CONFLICT(ext_id, owner) DO UPDATE SET"
                     " used_ms = excluded.used_ms, n_tokens = excluded.n_tokens,"
                     " tokens = excluded.tokens",
                     &st);
    if (rc)
        return rc;
    /* tokens as little-endian int32 (x86 and arm64 are both little-endian) */
    sqlite3_bind_text(st, 1, ext_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, owner);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)rkv_wall_ms());
    sqlite3_bind_int64(st, 4, (sqlite3_int64)n_tokens);
    sqlite3_bind_blob64(st, 5, n_tokens ? (const void *)tokens : "", n_tokens * sizeof(int32_t),
                        SQLITE_STATIC);
    return step_done(s, st, "save session");
}

int store_session_load(struct store *s, const char *ext_id, int64_t owner, int32_t **tokens,
                       size_t *n_tokens)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "SELECT tokens FROM sessions WHERE ext_id = ? AND owner = ?", &st);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, ext_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, owner);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        size_t bytes = (size_t)sqlite3_column_bytes(st, 0);
        *n_tokens = bytes / sizeof(int32_t);
        *tokens = malloc(bytes ? bytes : 1);
        if (!*tokens) {
            rc = RKV_ENOMEM;
        } else {
            if (bytes)
                memcpy(*tokens, sqlite3_column_blob(st, 0), bytes);
            rc = 0;
        }
    } else {
        rc = rc == SQLITE_DONE ? RKV_ENOTFOUND : db_err(s, rc, "load session");
    }
    sqlite3_finalize(st);
    return rc;
}

int store_session_delete(struct store *s, const char *ext_id, int64_t owner)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "DELETE FROM sessions WHERE ext_id = ? AND owner = ?", &st);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, ext_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, owner);
    if ((rc = step_done(s, st, "delete session")))
        return rc;
    return sqlite3_changes(s->db) ? 0 : RKV_ENOTFOUND;
}

int store_event_add(struct store *s, const struct store_event *e)
{
    sqlite3_stmt *st;
    int rc = prepare(s,
                     "INSERT INTO tactic_events(ts_ms, session_id, gpu, from_tactic, to_tactic,"
                     " reason, bytes_moved, elapsed_us) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                     &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, e->ts_ms);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)e->session_id);
    sqlite3_bind_int64(st, 3, e->gpu);
    sqlite3_bind_text(st, 4, e->from, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, e->to, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, e->reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)e->bytes_moved);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)e->elapsed_us);
    return step_done(s, st, "log tactic event");
}

int store_event_list(struct store *s, int64_t since_ms, uint64_t session, struct store_event *ev,
                     size_t cap, size_t *n)
{
    sqlite3_stmt *st;
    *n = 0;
    int rc = prepare(s,
                     "SELECT ts_ms, session_id, gpu, from_tactic, to_tactic, reason, bytes_moved,"
                     " elapsed_us FROM tactic_events WHERE ts_ms >= ?1 AND (?2 = 0 OR"
                     " session_id = ?2) ORDER BY id LIMIT ?3",
                     &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, since_ms);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)session);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)cap);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_event *e = &ev[(*n)++];
        memset(e, 0, sizeof *e);
        e->ts_ms = sqlite3_column_int64(st, 0);
        e->session_id = (uint64_t)sqlite3_column_int64(st, 1);
        e->gpu = sqlite3_column_int64(st, 2);
        snprintf(e->from, sizeof e->from, "%s", (const char *)sqlite3_column_text(st, 3));
        snprintf(e->to, sizeof e->to, "%s", (const char *)sqlite3_column_text(st, 4));
        snprintf(e->reason, sizeof e->reason, "%s", (const char *)sqlite3_column_text(st, 5));
        e->bytes_moved = (uint64_t)sqlite3_column_int64(st, 6);
        e->elapsed_us = (uint64_t)sqlite3_column_int64(st, 7);
    }
    rc = rc == SQLITE_DONE ? 0 : db_err(s, rc, "list tactic events");
    sqlite3_finalize(st);
    return rc;
}

int store_usage_add(struct store *s, const struct store_usage *u)
{
    sqlite3_stmt *st;
    int rc = prepare(s,
                     "INSERT INTO usage(ts_ms, key_id, endpoint, status, prompt_tokens,"
                     " completion_tokens, ttft_ms, e2e_ms) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                     &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, u->ts_ms);
    sqlite3_bind_int64(st, 2, u->key_id);
    sqlite3_bind_text(st, 3, u->endpoint, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, u->status);
    sqlite3_bind_int(st, 5, (int)u->prompt_tokens);
    sqlite3_bind_int(st, 6, (int)u->completion_tokens);
    sqlite3_bind_double(st, 7, u->ttft_ms);
    sqlite3_bind_double(st, 8, u->e2e_ms);
    return step_done(s, st, "log usage");
}

int store_usage_count(struct store *s, int64_t *n)
{
    sqlite3_stmt *st;
    int rc = prepare(s, "SELECT count(*) FROM usage", &st);
    if (rc)
        return rc;
    rc = sqlite3_step(st);
    *n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    rc = rc == SQLITE_ROW ? 0 : db_err(s, rc, "count usage");
    sqlite3_finalize(st);
    return rc;
}
