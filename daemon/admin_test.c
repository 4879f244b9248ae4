/* admin_test.c - the admin command table with a fake rkvd: validation, sessions, keys, budgets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/util.h"
#include "daemon/admin.h"
#include "daemon/store.h"
#include "proto/sock.h"

/* --- a fake rkvd ----------------------------------------------------------------- */

struct fake {
    struct sched_session_info sess[3];
    int evicted[3];
    int pinned[3];
    int drained;
    /* the last kvmgr call, answered by the test */
    int call_type;
    char call_payload[512];
    driver_call_cb cb;
    void *cb_ud;
    uint64_t applied_vram;
};

static void f_info(void *ctx, struct admin_info *o)
{
    (void)ctx;
    o->model = "tiny";
    o->backend = "cpu";
    o->listen = "127.0.0.1:1";
    o->uptime_ms = 61000;
    o->healthy = 1;
    o->kvmgr_up = 1;
    o->kv.kvmgr_pid = 42;
    o->kv.device_total = 1 << 20;
    o->n_workers = 1;
    o->workers[0] = (struct admin_worker_info){0, -1, 43, 1, 0, 2, "running"};
    o->st.gen_tokens = 7;
    o->block_size = 16;
    o->ctx_size = 2048;
}

static void f_sessions(void *ctx, sched_session_fn fn, void *ud)
{
    struct fake *f = ctx;
    for (int i = 0; i < 3; i++)
        if (!f->evicted[i])
            fn(ud, &f->sess[i]);
}

static int f_evict(void *ctx, uint64_t sid)
{
    struct fake *f = ctx;
    for (int i = 0; i < 3; i++) {
        if (f->sess[i].sid == sid) {
            if (f->sess[i].busy)
                return RKV_EBUSY;
            f->evicted[i] = 1;
            return 0;
        }
    }
    return RKV_ENOTFOUND;
}

static int f_pin(void *ctx, uint64_t sid, int pinned)
{
    struct fake *f = ctx;
    for (int i = 0; i < 3; i++)
        if (f->sess[i].sid == sid)
            f->sess[i].pinned = pinned;
    return 0;
}

static int f_kvmgr_call(void *ctx, int type, const void *p, size_t len, driver_call_cb cb, void *ud)
{
    struct fake *f = ctx;
    f->call_type = type;
    snprintf(f->call_payload, sizeof f->call_payload, "%.*s", (int)len, (const char *)p);
    f->cb = cb;
    f->cb_ud = ud;
    return 0;
}

static int f_restart(void *ctx, uint32_t w, uint32_t *old)
{
    (void)ctx;
    *old = 43;
    return w == 0 ? 0 : RKV_EINVAL;
}

static int f_drain(void *ctx, uint32_t w, int drain)
{
    struct fake *f = ctx;
    f->drained = drain;
    return 0;
}

static void f_budget(void *ctx, uint64_t vram, uint64_t host, uint64_t reserve)
{
    struct fake *f = ctx;
    f->applied_vram = vram;
}

/* --- running commands ------------------------------------------------------------ */

struct answer {
    int done;
    int rc;
    char err[600];
    cJSON *result;
};

static void on_done(void *ud, int rc, const cJSON *result, const char *err)
{
    struct answer *a = ud;
    a->done = 1;
    a->rc = rc;
    snprintf(a->err, sizeof a->err, "%s", err ? err : "");
    a->result = result ? cJSON_Duplicate(result, 1) : NULL;
}

/* the one answer slot */
static struct answer g_ans;

struct env {
    char dir[64];
    uv_loop_t loop;
    struct store *store;
    struct admin *admin;
    struct fake fake;
};

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/rkv-admin-test-XXXXXX");
    if (!mkdtemp(e->dir))
        return -1;
    char err[256];
    if (store_open(e->dir, &e->store, err, sizeof err))
        return -1;
    uv_loop_init(&e->loop);
    struct fake *f = &e->fake;
    f->sess[0] = (struct sched_session_info){5, "chat-a", 0, 40, 40, 8192, 0, 0, 0, rkv_now_ms()};
    f->sess[1] = (struct sched_session_info){6, "chat-b", 0, 20, 19, 4096, 0, 1, 0, rkv_now_ms()};
    f->sess[2] = (struct sched_session_info){9, "", 0, 3, 2, 4096, 0, 1, 0, 0};
    struct admin_ops ops = {f_info,    f_kvmgr_call, f_sessions, f_evict, f_pin,
                            f_restart, f_drain,      f_budget,   f};
    struct admin_config ac = {NULL, NULL, 1 << 30, 1 << 30, 0, 1};
    if (admin_create(&e->loop, &ac, &ops, e->store, &e->admin, err, sizeof err))
        return -1;
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    admin_shutdown(e->admin);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    admin_destroy(e->admin);
    store_close(e->store);
    cJSON_Delete(g_ans.result);
    memset(&g_ans, 0, sizeof g_ans);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    free(e);
    return system(cmd);
}

/* runs cmd with args given as JSON text; the answer lands in g_ans (a command
 * may answer later: kvmgr calls), the previous result is freed */
static struct answer *run(struct env *e, const char *cmd, const char *args, int changes)
{
    cJSON_Delete(g_ans.result);
    memset(&g_ans, 0, sizeof g_ans);
    cJSON *j = args ? cJSON_Parse(args) : NULL;
    admin_exec(e->admin, cmd, j, changes, on_done, &g_ans);
    cJSON_Delete(j);
    return &g_ans;
}

static double num(const cJSON *o, const char *path)
{
    /* "a.b" */
    char buf[64];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *v = o;
    for (char *t = strtok(buf, "."); t && v; t = strtok(NULL, "."))
        v = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, atoi(t)) : cJSON_GetObjectItem(v, t);
    assert_non_null(v);
    return v->valuedouble;
}

static void expect_error(struct env *e, const char *cmd, const char *args, int changes, int rc,
                         const char *needle)
{
    struct answer *a = run(e, cmd, args, changes);
    assert_true(a->done);
    if (a->rc != rc || !strstr(a->err, needle))
        fail_msg("%s %s: got %d \"%s\", expected %d with \"%s\"", cmd, args ? args : "", a->rc,
                 a->err, rc, needle);
    assert_null(a->result);
}

/* --- tests ------------------------------------------------------------------------ */

static void test_validation(void **state)
{
    struct env *e = *state;
    expect_error(e, "nope", NULL, 1, RKV_ENOTFOUND, "unknown admin command \"nope\"");
    expect_error(e, "budget_set", "{\"vram_target\":\"1GiB\"}", 0, RKV_EAUTH,
                 "budget_set changes rkvd");
    expect_error(e, "status", "{\"x\":1}", 1, RKV_EINVAL,
                 "status: unknown argument \"x\" (it takes none");
    expect_error(e, "tactics", "{\"gpu\":1}", 1, RKV_EINVAL,
                 "tactics: gpu must be an integer from -1 to 0");
    expect_error(e, "tactics", "{\"gpu\":\"zero\"}", 1, RKV_EINVAL, "gpu must be an integer");
    expect_error(e, "budget_set", "{}", 1, RKV_EINVAL, "give at least one of vram_target");
    expect_error(e, "budget_set", "{\"vram_target\":\"huge\"}", 1, RKV_EINVAL,
                 "vram_target must be a size like 512MiB");
    expect_error(e, "budget_set", "{\"vram_target\":100}", 1, RKV_EINVAL, "at least 4.00 KiB");
    expect_error(e, "mode_set", "{\"mode\":\"fast\"}", 1, RKV_EINVAL,
                 "mode must be auto, resident, window or cpu_tail");
    expect_error(e, "events", "{\"since\":\"last week\"}", 1, RKV_EINVAL, "since must be a time");
    expect_error(e, "events", "{\"limit\":0}", 1, RKV_EINVAL, "limit must be an integer");
    expect_error(e, "worker_drain", "{\"worker\":0,\"drain\":\"yes\"}", 1, RKV_EINVAL,
                 "drain must be true or false");
    expect_error(e, "worker_restart", "{}", 1, RKV_EINVAL, "worker is required");
    expect_error(e, "keys_add", "{\"name\":\"\"}", 1, RKV_EINVAL, "name is required");
    expect_error(e, "keys_add", "{\"name\":\"x\",\"scope\":\"root\"}", 1, RKV_EINVAL,
                 "scope must be \"user\"");
    expect_error(e, "keys_revoke", "{\"id\":77}", 1, RKV_ENOTFOUND, "no live key 77");
    /* read-only commands run without the right to change */
    struct answer *a = run(e, "status", NULL, 0);
    assert_int_equal(a->rc, 0);
    assert_int_equal(admin_cmd_changes("status"), 0);
    assert_int_equal(admin_cmd_changes("session_evict"), 1);
    assert_int_equal(admin_cmd_changes("rm_rf"), -1);
}

static void test_status_and_tactics(void **state)
{
    struct env *e = *state;
    struct answer *a = run(e, "status", NULL, 0);
    assert_int_equal(a->rc, 0);
    assert_string_equal(cJSON_GetObjectItem(a->result, "model")->valuestring, "tiny");
    assert_true(num(a->result, "uptime_ms") == 61000);
    assert_true(num(a->result, "kvmgr.pid") == 42);
    assert_true(num(a->result, "workers.0.restarts") == 2);
    assert_true(num(a->result, "budgets.vram_target") == 1 << 30);
    assert_true(num(a->result, "tokens.generated") == 7);
    assert_true(num(a->result, "api_keys") == 0);

    struct proto_histogram h = {0, {3, 1, 0, 2}, {300, 100, 0, 200}, 4096, 8192, 512, 1024};
    admin_on_histogram(e->admin, &h);
    a = run(e, "tactics", "{\"gpu\":\"0\"}", 0);
    assert_int_equal(a->rc, 0);
    const cJSON *g = cJSON_GetArrayItem(cJSON_GetObjectItem(a->result, "gpus"), 0);
    assert_true(num(g, "sessions.resident") == 3 && num(g, "sessions.parked") == 2);
    assert_true(num(g, "bytes.window") == 100 && num(g, "device_total") == 8192);
    assert_true(num(g, "age_ms") >= 0);
}

static void test_sessions(void **state)
{
    struct env *e = *state;
    /* a parked session's tactic and tail come from kvmgr's events */
    struct proto_tactic_event ev = {6, PROTO_TACTIC_RESIDENT, PROTO_TACTIC_PARKED, "idle", 2};
    admin_on_tactic_event(e->admin, &ev);
    struct answer *a = run(e, "sessions_list", NULL, 0);
    assert_int_equal(a->rc, 0);
    const cJSON *l = cJSON_GetObjectItem(a->result, "sessions");
    assert_int_equal(cJSON_GetArraySize(l), 3);
    const cJSON *b = cJSON_GetArrayItem(l, 1);
    assert_string_equal(cJSON_GetObjectItem(b, "id")->valuestring, "chat-b");
    assert_string_equal(cJSON_GetObjectItem(b, "tactic")->valuestring, "parked");
    assert_true(num(b, "tail_blocks") == 2 && num(b, "tail_tokens") == 19); /* <= kv */
    assert_true(num(b, "kv_bytes") == 4096);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(l, 0), "tactic")->valuestring,
                        "resident");

    a = run(e, "session_show", "{\"session\":\"#9\"}", 0);
    assert_int_equal(a->rc, 0);
    assert_true(num(a->result, "session.sid") == 9);
    a = run(e, "session_show", "{\"session\":\"5\"}", 0);
    assert_int_equal(a->rc, 0);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(a->result, "session"), "id")->valuestring,
        "chat-a");
    expect_error(e, "session_show", "{\"session\":\"chat-z\"}", 0, RKV_ENOTFOUND,
                 "no session \"chat-z\"");
    expect_error(e, "session_show", "{}", 0, RKV_EINVAL, "session is required");

    a = run(e, "session_pin", "{\"session\":\"chat-a\"}", 1);
    assert_int_equal(a->rc, 0);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a->result, "pinned")));
    assert_int_equal(e->fake.sess[0].pinned, 1);
    expect_error(e, "session_evict", "{\"session\":\"chat-b\"}", 1, RKV_EBUSY,
                 "is serving a request");
    a = run(e, "session_evict", "{\"session\":\"chat-a\"}", 1);
    assert_int_equal(a->rc, 0);
    assert_int_equal(e->fake.evicted[0], 1);
    expect_error(e, "session_evict", "{\"session\":\"chat-a\"}", 1, RKV_ENOTFOUND, "no session");
}

static void test_keys_and_authorize(void **state)
{
    struct env *e = *state;
    assert_int_equal(admin_authorize(e->admin, NULL), 0); /* no keys: open */
    struct answer *a = run(e, "keys_add", "{\"name\":\"alice\"}", 1);
    assert_int_equal(a->rc, 0);
    char secret[128];
    snprintf(secret, sizeof secret, "%s", cJSON_GetObjectItem(a->result, "secret")->valuestring);
    int id = (int)num(a->result, "id");
    assert_string_equal(cJSON_GetObjectItem(a->result, "scope")->valuestring, "user");
    assert_int_equal(admin_authorize(e->admin, NULL), RKV_EAUTH);
    assert_int_equal(admin_authorize(e->admin, "rkv-nope"), RKV_EAUTH);
    assert_int_equal(admin_authorize(e->admin, secret), 0);
    assert_int_equal(admin_authorize(e->admin, secret), 0); /* from the cache */
    a = run(e, "keys_list", NULL, 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(a->result, "keys")), 1);
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a->result, "keys"), 0),
                                    "secret"));
    a = run(e, "keys_add", "{\"name\":\"ops\",\"scope\":\"admin\"}", 1);
    assert_int_equal(a->rc, 0);
    char args[64];
    snprintf(args, sizeof args, "{\"id\":%d}", id);
    a = run(e, "keys_revoke", args, 1);
    assert_int_equal(a->rc, 0);
    /* revoking empties the cache: the key is refused at once */
    assert_int_equal(admin_authorize(e->admin, secret), RKV_EAUTH);
    a = run(e, "status", NULL, 0);
    assert_true(num(a->result, "api_keys") == 1);
}

static void reply_budget(struct env *e, uint64_t vram, uint64_t plan_seq)
{
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    struct proto_budget b = {vram, 1 << 30, 0, -1, plan_seq};
    assert_int_equal(proto_put_json(&w, PROTO_MSG_BUDGET, &b, NULL, 0), 0);
    struct proto_in in = {{PROTO_VERSION, PROTO_MSG_BUDGET, 1, PROTO_FLAG_JSON, (uint32_t)w.len},
                          w.data,
                          w.len,
                          NULL};
    e->fake.cb(e->fake.cb_ud, 0, &in, "");
    proto_wbuf_fini(&w);
}

static void test_budget_set_waits_for_the_replan(void **state)
{
    struct env *e = *state;
    struct proto_histogram h = {0, {4, 0, 0, 0}, {400, 0, 0, 0}, 4096, 8192, 0, 1024};
    admin_on_histogram(e->admin, &h);
    struct answer *a = run(e, "budget_set", "{\"vram_target\":\"64KiB\",\"gpu\":0}", 1);
    assert_false(a->done); /* kvmgr has it */
    assert_int_equal(e->fake.call_type, PROTO_MSG_BUDGET_SET);
    assert_non_null(strstr(e->fake.call_payload, "\"vram_target_bytes\":65536"));
    reply_budget(e, 65536, 0);
    assert_false(a->done); /* now the histogram after the re-plan */
    assert_int_equal(e->fake.applied_vram, 65536);
    char v[64];
    assert_int_equal(store_setting_get(e->store, "vram_target", v, sizeof v), 0);
    assert_string_equal(v, "65536B");
    rkv_sleep_ms(2); /* the histogram must be newer than the answer */
    struct proto_histogram h2 = {0, {2, 0, 0, 2}, {200, 0, 0, 200}, 2048, 8192, 200, 1024};
    admin_on_histogram(e->admin, &h2);
    assert_true(a->done);
    assert_int_equal(a->rc, 0);
    assert_true(num(a->result, "budget.vram_target") == 65536);
    assert_true(num(a->result, "before.0.sessions.resident") == 4);
    assert_true(num(a->result, "after.0.sessions.parked") == 2);
    const char *sum = cJSON_GetArrayItem(cJSON_GetObjectItem(a->result, "summary"), 0)->valuestring;
    assert_string_equal(sum, "gpu 0: resident 4->2 parked 0->2");

    a = run(e, "budget_get", NULL, 0);
    assert_true(num(a->result, "budget.vram_target") == 65536);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a->result, "set_at_runtime")));

    /* kvmgr refuses: the error names what happened */
    a = run(e, "mode_set", "{\"mode\":\"window\"}", 1);
    assert_false(a->done);
    e->fake.cb(e->fake.cb_ud, RKV_ETIMEOUT, NULL, "no answer in 5000 ms");
    assert_true(a->done);
    assert_int_equal(a->rc, RKV_ETIMEOUT);
    assert_non_null(strstr(a->err, "mode_set: kvmgr did not take it: no answer"));
}

/* kvmgr names its plans: a histogram of an older plan does not end the wait, nor one that
 * arrived before the request was sent (from a kvmgr that counted its plans further); the
 * budget's plan's histogram may come before the answer, which is then immediate */
static void test_budget_set_answers_with_the_plans_histogram(void **state)
{
    struct env *e = *state;
    struct proto_histogram old = {0, {4, 0, 0, 0}, {400, 0, 0, 0}, 4096, 8192, 0, 1024, 90};
    admin_on_histogram(e->admin, &old);
    rkv_sleep_ms(2);
    struct answer *a = run(e, "budget_set", "{\"vram_target\":\"64KiB\"}", 1);
    reply_budget(e, 65536, 7);
    assert_false(a->done);
    struct proto_histogram h = {0, {4, 0, 0, 0}, {400, 0, 0, 0}, 4096, 8192, 0, 1024, 6};
    admin_on_histogram(e->admin, &h);
    assert_false(a->done);
    struct proto_histogram h2 = {0, {2, 2, 0, 0}, {200, 200, 0, 0}, 2048, 8192, 200, 1024, 7};
    admin_on_histogram(e->admin, &h2);
    assert_true(a->done);
    assert_int_equal(a->rc, 0);
    assert_string_equal(
        cJSON_GetArrayItem(cJSON_GetObjectItem(a->result, "summary"), 0)->valuestring,
        "gpu 0: resident 4->2 window 0->2");

    a = run(e, "budget_set", "{\"vram_target\":\"128KiB\"}", 1);
    struct proto_histogram h3 = {0, {4, 0, 0, 0}, {400, 0, 0, 0}, 4096, 8192, 0, 1024, 8};
    admin_on_histogram(e->admin, &h3);
    assert_false(a->done);
    reply_budget(e, 131072, 8);
    assert_true(a->done);
    assert_int_equal(a->rc, 0);
    assert_string_equal(
        cJSON_GetArrayItem(cJSON_GetObjectItem(a->result, "summary"), 0)->valuestring,
        "gpu 0: resident 2->4 window 2->0");
}

static void test_shutdown_answers_what_is_pending(void **state)
{
    struct env *e = *state;
    struct answer *a = run(e, "mode_get", NULL, 0);
    assert_false(a->done);
    admin_shutdown(e->admin);
    assert_true(a->done);
    assert_int_equal(a->rc, RKV_ESTATE);
    assert_non_null(strstr(a->err, "shutting down"));
    /* the late kvmgr answer finds the request answered and frees it */
    e->fake.cb(e->fake.cb_ud, RKV_ECLOSED, NULL, "closed");
    expect_error(e, "status", NULL, 0, RKV_ESTATE, "shutting down");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_and_tactics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keys_and_authorize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_set_waits_for_the_replan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_set_answers_with_the_plans_histogram, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_answers_what_is_pending, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
