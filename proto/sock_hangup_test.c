/* sock_hangup_test.c - peers that hang up mid-handshake do not leave a server deaf (nng 1.5 bug).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>

#include "common/err.h"
#include "common/log.h"
#include "proto/msg.h"
#include "proto/sock.h"

/* nng 1.5.2 itself leaks the listener it gave up on (its pipes wait forever
 * for an accept that never comes). those blocks live only inside libnng; our
 * own allocations are leak-checked by sock_test, which never triggers this. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libnng.so\n";
}

static char g_dir[32], g_path[64], g_url[80];

/* valgrind has no in-binary suppressions: the tests skip themselves there */
static void skip_under_valgrind(void)
{
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "vgpreload")) {
        print_message("skipped under valgrind: nng 1.5.2 leaks the endpoints these tests break "
                      "on purpose (run them under ASan: make asan)\n");
        skip();
    }
}

static int status_handler(void *ctx, const struct proto_in *req, struct proto_wbuf *reply,
                          int *reply_type, char *err, size_t errlen)
{
    struct proto_status st = {.kvmgr_pid = (uint32_t)getpid(), .proto_version = PROTO_VERSION};
    *reply_type = PROTO_MSG_STATUS;
    return proto_put_json(reply, PROTO_MSG_STATUS, &st, err, errlen);
}

struct server {
    struct proto_sock *rep;
    int served;
    pthread_t th;
};

/* answers 2 requests; each 200 ms without one lets proto_serve_one heal */
static void *serve(void *p)
{
    struct server *s = p;
    char err[256];
    for (int waits = 0; s->served < 2 && waits < 300;) {
        int rc = proto_serve_one(s->rep, status_handler, NULL, 200, err, sizeof err);
        if (rc == 0)
            s->served++;
        else
            waits++;
    }
    return NULL;
}

/* connect to the unix socket and hang up before nng's handshake, with or
 * without a few bytes of garbage first */
static void hang_up_early(int garbage)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_path);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    if (garbage)
        assert_int_equal(write(fd, "\xff\xfe garbage", 10), 10);
    close(fd);
}

/* a call may meet RKV_ECLOSED once: healing drops connections that sat in the
 * dead listener with a request in flight (an error, never a hang) */
static int status_call(struct proto_status *st, char *err, size_t errlen)
{
    struct proto_sock *req;
    int rc = proto_sock_open(&req, PROTO_SOCK_REQ, g_url, err, errlen);
    if (rc < 0)
        return rc;
    struct proto_empty e = {0};
    for (int tries = 0; tries < 4; tries++) {
        rc = proto_call_json(req, PROTO_MSG_STATUS_GET, &e, PROTO_MSG_STATUS, st, 30000, err,
                             errlen);
        if (rc != RKV_ECLOSED)
            break;
    }
    proto_sock_close(req);
    return rc;
}

static void test_server_survives_early_hangups(void **state)
{
    (void)state;
    skip_under_valgrind();
    struct server srv = {0};
    char err[256];
    assert_int_equal(proto_sock_open(&srv.rep, PROTO_SOCK_REP, g_url, err, sizeof err), 0);
    pthread_create(&srv.th, NULL, serve, &srv);
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 3; k++)
            hang_up_early(k == round);
        struct proto_status st;
        int rc = status_call(&st, err, sizeof err);
        if (rc)
            fail_msg("round %d: %s", round, err);
        assert_int_equal(st.kvmgr_pid, (uint32_t)getpid());
    }
    pthread_join(srv.th, NULL);
    assert_int_equal(srv.served, 2);
    proto_sock_close(srv.rep);
}

/* a plain unix listener that accepts one connection and hangs up on it */
static void *hang_up_on_one(void *p)
{
    int lfd = *(int *)p;
    int fd = accept(lfd, NULL, NULL);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void test_client_survives_a_server_hanging_up(void **state)
{
    (void)state;
    skip_under_valgrind();
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_path);
    unlink(g_path);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 4), 0);
    pthread_t th;
    pthread_create(&th, NULL, hang_up_on_one, &lfd);
    /* the client dials that listener first: nng 1.5 would never redial */
    struct proto_sock *req;
    char err[256];
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, g_url, err, sizeof err), 0);
    pthread_join(th, NULL);
    close(lfd);
    unlink(g_path);

    struct server srv = {0};
    assert_int_equal(proto_sock_open(&srv.rep, PROTO_SOCK_REP, g_url, err, sizeof err), 0);
    pthread_create(&srv.th, NULL, serve, &srv);
    struct proto_empty e = {0};
    struct proto_status st;
    int rc = RKV_ECLOSED;
    for (int tries = 0; tries < 4 && rc == RKV_ECLOSED; tries++)
        rc = proto_call_json(req, PROTO_MSG_STATUS_GET, &e, PROTO_MSG_STATUS, &st, 30000, err,
                             sizeof err);
    if (rc)
        fail_msg("%s", err);
    rc = proto_call_json(req, PROTO_MSG_STATUS_GET, &e, PROTO_MSG_STATUS, &st, 30000, err,
                         sizeof err);
    if (rc)
        fail_msg("%s", err);
    pthread_join(srv.th, NULL);
    proto_sock_close(req);
    proto_sock_close(srv.rep);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/rkv-proto-XXXXXX");
    if (!mkdtemp(g_dir))
        return 1;
    if (getenv("RKV_TEST_DEBUG"))
        rkv_log_init("sock_hangup_test", RKV_LOG_DEBUG);
    snprintf(g_path, sizeof g_path, "%s/s.sock", g_dir);
    snprintf(g_url, sizeof g_url, "ipc://%s", g_path);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_survives_early_hangups),
        cmocka_unit_test(test_client_survives_a_server_hanging_up),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(g_path);
    rmdir(g_dir);
    nng_fini();
    return failed;
}
