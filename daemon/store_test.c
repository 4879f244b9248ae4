/* store_test.c - the sqlite state: migrations, settings, keys, sessions, events, usage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/err.h"
#include "daemon/store.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/rkv-store-test-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void test_settings_survive_reopen(void **state)
{
    (void)state;
    struct store *s;
    char err[256], val[64];
    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    assert_int_equal(store_schema_version(s), STORE_SCHEMA_VERSION);
    assert_int_equal(store_setting_get(s, "vram_target", val, sizeof val), RKV_ENOTFOUND);
    assert_int_equal(store_setting_set(s, "vram_target", "1073741824"), 0);
    assert_int_equal(store_setting_set(s, "vram_target", "2147483648"), 0);
    store_close(s);
    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    assert_int_equal(store_setting_get(s, "vram_target", val, sizeof val), 0);
    assert_string_equal(val, "2147483648");
    assert_int_equal(store_integrity_check(s, val, sizeof val), 0);
    assert_string_equal(val, "ok");
    store_close(s);
}

static void test_keys(void **state)
{
    (void)state;
    struct store *s;
    char err[256], secret[64], other[64];
    int64_t id, id2;
    struct store_key k;
    int n;
    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    assert_int_equal(store_key_add(s, "alice", "admin", secret, sizeof secret, &id), 0);
    assert_int_equal(strlen(secret), 52);
    assert_memory_equal(secret, "rkv-", 4);
    assert_int_equal(store_key_add(s, "bob", "user", other, sizeof other, &id2), 0);
    assert_string_not_equal(secret, other);
    assert_int_equal(store_key_add(s, "eve", "root", other, sizeof other, &id2), RKV_EINVAL);
    assert_int_equal(store_key_verify(s, secret, &k), 0);
    assert_int_equal(k.id, id);
    assert_string_equal(k.scope, "admin");
    assert_string_equal(k.name, "alice");
    secret[10] ^= 1;
    assert_int_equal(store_key_verify(s, secret, &k), RKV_EAUTH);
    secret[10] ^= 1;
    assert_int_equal(store_key_verify(s, "", &k), RKV_EAUTH);
    assert_int_equal(store_key_count(s, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(store_key_revoke(s, id), 0);
    assert_int_equal(store_key_revoke(s, id), RKV_ENOTFOUND);
    assert_int_equal(store_key_verify(s, secret, &k), RKV_EAUTH);
    struct store_key list[4];
    size_t nl;
    assert_int_equal(store_key_list(s, list, 4, &nl), 0);
    assert_int_equal(nl, 2);
    assert_int_equal(list[1].revoked, 1);
    store_close(s);

    /* the secret itself is nowhere in the database file */
    char path[128], cmd[256];
    snprintf(path, sizeof path, "%s/rkv.db", dir);
    snprintf(cmd, sizeof cmd, "grep -c %s %s* >/dev/null", secret + 4, path);
    assert_int_not_equal(system(cmd), 0);
}

static void test_sessions_isolated_by_owner(void **state)
{
    (void)state;
    struct store *s;
    char err[256];
    int32_t toks[300];
    for (int i = 0; i < 300; i++)
        toks[i] = i * 7 - 3;
    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    assert_int_equal(store_session_save(s, "conv-1", 5, toks, 300), 0);
    int32_t *got;
    size_t n;
    assert_int_equal(store_session_load(s, "conv-1", 5, &got, &n), 0);
    assert_int_equal(n, 300);
    assert_memory_equal(got, toks, sizeof toks);
    free(got);
    assert_int_equal(store_session_load(s, "conv-1", 6, &got, &n), RKV_ENOTFOUND);
    assert_int_equal(store_session_save(s, "conv-1", 5, toks, 10), 0);
    assert_int_equal(store_session_load(s, "conv-1", 5, &got, &n), 0);
    assert_int_equal(n, 10);
    free(got);
    assert_int_equal(store_session_save(s, "empty", 0, NULL, 0), 0);
    assert_int_equal(store_session_load(s, "empty", 0, &got, &n), 0);
    assert_int_equal(n, 0);
    free(got);
    assert_int_equal(store_session_delete(s, "conv-1", 6), RKV_ENOTFOUND);
    assert_int_equal(store_session_delete(s, "conv-1", 5), 0);
    store_close(s);
}

static void test_events_and_usage(void **state)
{
    (void)state;
    struct store *s;
    char err[256];
    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    for (int i = 0; i < 10; i++) {
        struct store_event e = {.ts_ms = 1000 + i,
                                .session_id = (uint64_t)(i % 3) + 1,
                                .gpu = 0,
                                .bytes_moved = (uint64_t)i << 20};
        strcpy(e.from, "resident");
        strcpy(e.to, "window");
        snprintf(e.reason, sizeof e.reason, "vram pressure %d", i);
        assert_int_equal(store_event_add(s, &e), 0);
    }
    struct store_event ev[16];
    size_t n;
    assert_int_equal(store_event_list(s, 1005, 0, ev, 16, &n), 0);
    assert_int_equal(n, 5);
    assert_int_equal(ev[0].ts_ms, 1005);
    assert_string_equal(ev[0].reason, "vram pressure 5");
    assert_int_equal(store_event_list(s, 0, 2, ev, 16, &n), 0);
    assert_int_equal(n, 3); /* i = 1, 4, 7 */
    assert_int_equal(ev[1].bytes_moved, 4ull << 20);
    struct store_usage u = {.ts_ms = 1,
                            .endpoint = "completions",
                            .status = 200,
                            .prompt_tokens = 5,
                            .completion_tokens = 7};
    assert_int_equal(store_usage_add(s, &u), 0);
    int64_t cnt;
    assert_int_equal(store_usage_count(s, &cnt), 0);
    assert_int_equal(cnt, 1);
    store_close(s);
}

static void test_bad_dirs_and_newer_schema(void **state)
{
    (void)state;
    struct store *s;
    char err[256];
    assert_int_equal(store_open("/nonexistent/rkv", &s, err, sizeof err), RKV_ENOTFOUND);
    assert_non_null(strstr(err, "/nonexistent/rkv"));

    /* a database from a newer rkvd is refused by name, not clobbered */
    char path[128];
    snprintf(path, sizeof path, "%s/rkv.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(store_open(dir, &s, err, sizeof err), RKV_EVERSION);
    assert_non_null(strstr(err, "schema version 99"));
    unlink(path);

    /* garbage where the database should be */
    FILE *f = fopen(path, "w");
    fputs("this is not a database, just text long enough to fill a header...........", f);
    fclose(f);
    assert_true(store_open(dir, &s, err, sizeof err) < 0);
    assert_non_null(strstr(err, "rkv.db"));
    unlink(path);
}

static void test_key_limits_and_upgrade_from_v1(void **state)
{
    (void)state;
    struct store *s;
    char err[256], secret[128], path[128];
    int64_t id;
    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    assert_int_equal(store_key_add(s, "alice", "user", secret, sizeof secret, &id), 0);
    store_close(s);
    /* turn it into the version 1 database an older rkvd wrote */
    sqlite3 *db;
    snprintf(path, sizeof path, "%s/rkv.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "ALTER TABLE api_keys DROP COLUMN rpm;"
                                  "ALTER TABLE api_keys DROP COLUMN tpm;"
                                  "ALTER TABLE api_keys DROP COLUMN max_concurrent;"
                                  "ALTER TABLE api_keys DROP COLUMN max_tokens;"
                                  "ALTER TABLE api_keys DROP COLUMN max_prompt;"
                                  "PRAGMA user_version = 1;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);

    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    assert_int_equal(store_schema_version(s), 3);
    struct store_key k;
    assert_int_equal(store_key_verify(s, secret, &k), 0);
    assert_int_equal(k.id, id);
    assert_int_equal(k.lim.rpm, STORE_LIMIT_DEFAULT);
    assert_int_equal(k.lim.max_tokens, STORE_LIMIT_DEFAULT);

    struct store_key_limits l = {60, 1000, STORE_LIMIT_KEEP, 0, 500};
    assert_int_equal(store_key_set_limits(s, id, &l, &k), 0);
    assert_int_equal(k.lim.rpm, 60);
    assert_int_equal(k.lim.tpm, 1000);
    assert_int_equal(k.lim.max_concurrent, STORE_LIMIT_DEFAULT);
    assert_int_equal(k.lim.max_tokens, 0);
    assert_int_equal(k.lim.max_prompt, 500);
    /* only rpm back to the default, the rest kept */
    l = (struct store_key_limits){STORE_LIMIT_DEFAULT, STORE_LIMIT_KEEP, 4, STORE_LIMIT_KEEP,
                                  STORE_LIMIT_KEEP};
    assert_int_equal(store_key_set_limits(s, id, &l, NULL), 0);
    store_close(s);

    assert_int_equal(store_open(dir, &s, err, sizeof err), 0);
    size_t n;
    struct store_key keys[4];
    assert_int_equal(store_key_list(s, keys, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(keys[0].lim.rpm, STORE_LIMIT_DEFAULT);
    assert_int_equal(keys[0].lim.tpm, 1000);
    assert_int_equal(keys[0].lim.max_concurrent, 4);
    assert_int_equal(keys[0].lim.max_tokens, 0);
    assert_int_equal(keys[0].lim.max_prompt, 500);
    assert_int_equal(store_key_verify(s, secret, &k), 0);
    assert_int_equal(k.lim.tpm, 1000);
    /* bad values and unknown or revoked keys */
    l = (struct store_key_limits){-3, 0, 0, 0, 0};
    assert_int_equal(store_key_set_limits(s, id, &l, NULL), RKV_EINVAL);
    l = (struct store_key_limits){1, 1, 1, 1, 1};
    assert_int_equal(store_key_set_limits(s, id + 1, &l, NULL), RKV_ENOTFOUND);
    assert_int_equal(store_key_revoke(s, id), 0);
    assert_int_equal(store_key_set_limits(s, id, &l, NULL), RKV_ENOTFOUND);
    assert_int_equal(store_integrity_check(s, err, sizeof err), 0);
    assert_string_equal(err, "ok");
    store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_settings_survive_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sessions_isolated_by_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_and_usage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_dirs_and_newer_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_limits_and_upgrade_from_v1, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
