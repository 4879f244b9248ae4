/* sock_test.c - nng req/rep/pub/sub over ipc:// between threads: calls, timeouts, garbage,
 * versions. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "common/err.h"
#include "proto/json.h"
#include "proto/msg.h"
#include "proto/sock.h"
#include "proto/wire.h"

#define VTEXT(peer, me)                                                                            \
    "peer speaks rkv protocol v" #peer ", this build speaks v" #me ": upgrade the older side"

struct fix {
    char dir[32];
    char path[64];
    char url[80];
};

static int setup(void **state)
{
    struct fix *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/rkv-proto-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/s.sock", f->dir);
    snprintf(f->url, sizeof f->url, "ipc://%s", f->path);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fix *f = *state;
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

/* the server side: budget get/set, mode, a binary step */
static int handler(void *ctx, const struct proto_in *req, struct proto_wbuf *reply, int *reply_type,
                   char *err, size_t errlen)
{
    (void)ctx;
    switch (req->hdr.type) {
    case PROTO_MSG_BUDGET_GET: {
        struct proto_budget_get g;
        int rc = proto_json_decode(PROTO_MSG_BUDGET_GET, req->payload, req->len, &g, err, errlen);
        if (rc < 0)
            return rc;
        struct proto_budget b = {.vram_target_bytes = 100ull << 30,
                                 .host_budget_bytes = 1ull << 40,
                                 .compute_reserve_bytes = 3ull << 30,
                                 .gpu = g.gpu};
        *reply_type = PROTO_MSG_BUDGET;
        return proto_put_json(reply, PROTO_MSG_BUDGET, &b, err, errlen);
    }
    case PROTO_MSG_BUDGET_SET:
        return proto_seterr(
            err, errlen, RKV_ENOSPACE,
            "vram target 200 GiB is over the 141 GiB of gpu 0: lower --vram-target");
    case PROTO_MSG_MODE_GET: *reply_type = PROTO_MSG_OK; return 0; /* wrong on purpose */
    case PROTO_MSG_STEP_REQ: {
        struct proto_step_req *m;
        int rc = proto_step_req_decode(req->payload, req->len, &m, err, errlen);
        if (rc < 0)
            return rc;
        struct proto_step_out outs[4] = {{0}};
        struct proto_step_resp resp = {.epoch = m->epoch, .n_seqs = m->n_seqs, .seqs = outs};
        for (uint32_t i = 0; i < m->n_seqs && i < 4; i++) {
            outs[i].session_id = m->seqs[i].session_id;
            outs[i].token = (int32_t)m->seqs[i].n_tokens;
            outs[i].logprob = -1.0f;
        }
        proto_step_req_destroy(m);
        *reply_type = PROTO_MSG_STEP_RESP;
        return proto_step_resp_encode(&resp, reply, err, errlen);
    }
    default:
        return proto_seterr(err, errlen, RKV_EUNSUPPORTED, "%s is not served here",
                            proto_msg_name(req->hdr.type));
    }
}

struct server {
    struct proto_sock *rep;
    int n;
    int rc[64];
    char err[64][256];
    pthread_t th;
};

/* serves n requests, waiting up to 60 s in all */
static void *serve_thread(void *p)
{
    struct server *s = p;
    for (int i = 0, waits = 0; i < s->n && waits < 300;) {
        s->rc[i] = proto_serve_one(s->rep, handler, NULL, 200, s->err[i], sizeof s->err[i]);
        if (s->rc[i] == RKV_ETIMEOUT)
            waits++;
        else
            i++;
    }
    return NULL;
}

static void server_start(struct server *s, const char *url, int n)
{
    memset(s, 0, sizeof *s);
    char err[256];
    assert_int_equal(proto_sock_open(&s->rep, PROTO_SOCK_REP, url, err, sizeof err), 0);
    s->n = n;
    assert_int_equal(pthread_create(&s->th, NULL, serve_thread, s), 0);
}

static void server_join(struct server *s)
{
    pthread_join(s->th, NULL);
    proto_sock_close(s->rep);
}

static void test_calls(void **state)
{
    struct fix *f = *state;
    struct server srv;
    struct proto_sock *req;
    char err[256];
    /* the client first: it dials in the background until the server listens */
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, f->url, err, sizeof err), 0);
    server_start(&srv, f->url, 4);

    struct proto_budget_get g = {.gpu = 3};
    struct proto_budget b;
    assert_int_equal(proto_call_json(req, PROTO_MSG_BUDGET_GET, &g, PROTO_MSG_BUDGET, &b, 10000,
                                     err, sizeof err),
                     0);
    assert_true(b.vram_target_bytes == 100ull << 30);
    assert_true(b.host_budget_bytes == 1ull << 40);
    assert_int_equal(b.gpu, 3);

    struct proto_budget set = {.vram_target_bytes = 200ull << 30, .gpu = 0};
    assert_int_equal(proto_call_json(req, PROTO_MSG_BUDGET_SET, &set, PROTO_MSG_BUDGET, &b, 10000,
                                     err, sizeof err),
                     RKV_ENOSPACE);
    assert_string_equal(err,
                        "vram target 200 GiB is over the 141 GiB of gpu 0: lower --vram-target");

    struct proto_empty e = {0};
    struct proto_mode_msg mode;
    assert_int_equal(
        proto_call_json(req, PROTO_MSG_MODE_GET, &e, PROTO_MSG_MODE, &mode, 10000, err, sizeof err),
        RKV_EPROTO);
    assert_non_null(strstr(err, "mode_get was answered with ok, expected mode"));

    /* binary both ways */
    int32_t tok[3] = {1, 2, 3};
    struct proto_step_seq seq = {.session_id = 0xabcdef0123456789ull, .n_tokens = 3, .tokens = tok};
    struct proto_step_req sreq = {.epoch = 12, .n_seqs = 1, .seqs = &seq};
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    assert_int_equal(proto_step_req_encode(&sreq, &w, err, sizeof err), 0);
    struct proto_in r;
    assert_int_equal(proto_call(req, PROTO_MSG_STEP_REQ, w.data, w.len, &r, 10000, err, sizeof err),
                     0);
    assert_int_equal(r.hdr.type, PROTO_MSG_STEP_RESP);
    struct proto_step_resp *resp;
    assert_int_equal(proto_step_resp_decode(r.payload, r.len, &resp, err, sizeof err), 0);
    assert_true(resp->epoch == 12);
    assert_int_equal(resp->n_seqs, 1);
    assert_true(resp->seqs[0].session_id == 0xabcdef0123456789ull);
    assert_int_equal(resp->seqs[0].token, 3);
    proto_step_resp_destroy(resp);
    proto_in_fini(&r);
    proto_wbuf_fini(&w);

    server_join(&srv);
    for (int i = 0; i < 4; i++)
        assert_int_equal(srv.rc[i], 0);
    /* the server side heard the handler's text too */
    assert_string_equal(srv.err[1],
                        "vram target 200 GiB is over the 141 GiB of gpu 0: lower --vram-target");
    proto_sock_close(req);
}

struct client {
    struct proto_sock *req;
    int n, ok;
    int64_t gpu;
    pthread_t th;
};

static void *client_thread(void *p)
{
    struct client *c = p;
    char err[256];
    for (int i = 0; i < c->n; i++) {
        struct proto_budget_get g = {.gpu = c->gpu};
        struct proto_budget b;
        if (proto_call_json(c->req, PROTO_MSG_BUDGET_GET, &g, PROTO_MSG_BUDGET, &b, 10000, err,
                            sizeof err) == 0 &&
            b.gpu == c->gpu)
            c->ok++;
    }
    return NULL;
}

static void test_threads_share_a_socket(void **state)
{
    struct fix *f = *state;
    struct server srv;
    server_start(&srv, f->url, 40);
    struct proto_sock *req;
    char err[256];
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, f->url, err, sizeof err), 0);
    struct client c[2] = {{.req = req, .n = 20, .gpu = 0}, {.req = req, .n = 20, .gpu = 1}};
    for (int i = 0; i < 2; i++)
        pthread_create(&c[i].th, NULL, client_thread, &c[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(c[i].th, NULL);
    server_join(&srv);
    assert_int_equal(c[0].ok, 20);
    assert_int_equal(c[1].ok, 20);
    proto_sock_close(req);
}

static void test_timeouts(void **state)
{
    struct fix *f = *state;
    char err[256];
    /* a listener that never answers */
    struct proto_sock *rep, *req;
    assert_int_equal(proto_sock_open(&rep, PROTO_SOCK_REP, f->url, err, sizeof err), 0);
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, f->url, err, sizeof err), 0);
    struct proto_in r;
    assert_int_equal(proto_call(req, PROTO_MSG_STATUS_GET, "{}", 2, &r, 200, err, sizeof err),
                     RKV_ETIMEOUT);
    assert_non_null(strstr(err, "no reply to status_get within 200 ms"));
    assert_null(r.nmsg_);
    proto_sock_close(req);
    /* the server then sees nothing queued, or times out itself */
    int rc = proto_serve_one(rep, handler, NULL, 0, err, sizeof err);
    assert_true(rc == -EAGAIN || rc == 0);
    assert_int_equal(proto_serve_one(rep, handler, NULL, 0, err, sizeof err), -EAGAIN);
    assert_int_equal(proto_serve_one(rep, handler, NULL, 50, err, sizeof err), RKV_ETIMEOUT);
    proto_sock_close(rep);

    /* nobody listening at all */
    char url[96];
    snprintf(url, sizeof url, "ipc://%s/nobody.sock", f->dir);
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, url, err, sizeof err), 0);
    rc = proto_call(req, PROTO_MSG_STATUS_GET, "{}", 2, &r, 200, err, sizeof err);
    assert_int_equal(rc, RKV_ETIMEOUT);
    proto_sock_close(req);
}

struct waiter {
    struct proto_sock *req;
    pthread_t th;
    int rc;
    char err[256];
};

static void *waiter_thread(void *arg)
{
    struct waiter *w = arg;
    struct proto_in r;
    w->rc = proto_call(w->req, PROTO_MSG_STATUS_GET, "{}", 2, &r, 60000, w->err, sizeof w->err);
    if (w->rc == 0)
        proto_in_fini(&r);
    return NULL;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* a call waiting on a peer that never answers (sent, no reply) or on nobody (not sent) ends
 * at proto_sock_shutdown from another thread, long before its timeout; later calls fail at
 * once, and the socket is still closed normally */
static void test_shutdown_ends_waiting_calls(void **state)
{
    struct fix *f = *state;
    char err[256], url[96];
    snprintf(url, sizeof url, "ipc://%s/nobody.sock", f->dir);
    struct proto_sock *rep;
    assert_int_equal(proto_sock_open(&rep, PROTO_SOCK_REP, f->url, err, sizeof err), 0);
    struct waiter w[2] = {{0}};
    assert_int_equal(proto_sock_open(&w[0].req, PROTO_SOCK_REQ, f->url, err, sizeof err), 0);
    assert_int_equal(proto_sock_open(&w[1].req, PROTO_SOCK_REQ, url, err, sizeof err), 0);
    for (int i = 0; i < 2; i++)
        pthread_create(&w[i].th, NULL, waiter_thread, &w[i]);
    /* the silent peer has the request before the shutdown */
    struct proto_in in;
    assert_int_equal(proto_sock_set_timeouts(rep, 5000, 5000), 0);
    assert_int_equal(proto_sock_recv(rep, &in, 0, err, sizeof err), 0);
    proto_in_fini(&in);
    usleep(50 * 1000);
    uint64_t t0 = mono_ms();
    for (int i = 0; i < 2; i++)
        proto_sock_shutdown(w[i].req);
    for (int i = 0; i < 2; i++) {
        pthread_join(w[i].th, NULL);
        assert_int_equal(w[i].rc, RKV_ECLOSED);
    }
    assert_true(mono_ms() - t0 < 5000);
    struct proto_in r;
    assert_int_equal(
        proto_call(w[0].req, PROTO_MSG_STATUS_GET, "{}", 2, &r, 60000, err, sizeof err),
        RKV_ECLOSED);
    proto_sock_shutdown(w[0].req); /* twice is fine */
    for (int i = 0; i < 2; i++)
        proto_sock_close(w[i].req);
    proto_sock_shutdown(NULL);
    proto_sock_close(rep);
}

/* a raw nng req peer: sends bytes as they are, returns the reply */
static nng_msg *raw_call(const char *url, const void *bytes, size_t len)
{
    nng_socket s;
    assert_int_equal(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 10000);
    assert_int_equal(nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK), 0);
    nng_msg *m;
    assert_int_equal(nng_msg_alloc(&m, 0), 0);
    assert_int_equal(nng_msg_append(m, bytes, len), 0);
    assert_int_equal(nng_sendmsg(s, m, 0), 0);
    nng_msg *r = NULL;
    assert_int_equal(nng_recvmsg(s, &r, 0), 0);
    nng_close(s);
    return r;
}

/* the reply must be an ERROR envelope with this code; its message into msg */
static void expect_error_reply(nng_msg *r, int code, char *msg, size_t n)
{
    struct proto_hdr h;
    const void *p;
    char err[256];
    assert_int_equal(proto_env_decode(nng_msg_body(r), nng_msg_len(r), &h, &p, err, sizeof err), 0);
    assert_int_equal(h.type, PROTO_MSG_ERROR);
    struct proto_error e;
    assert_int_equal(proto_json_decode(PROTO_MSG_ERROR, p, h.len, &e, err, sizeof err), 0);
    assert_int_equal(e.code, code);
    snprintf(msg, n, "%s", e.message);
    nng_msg_free(r);
}

static void test_garbage_gets_an_error(void **state)
{
    struct fix *f = *state;
    struct server srv;
    server_start(&srv, f->url, 4);
    char msg[512];

    expect_error_reply(raw_call(f->url, "hello, garbage", 14), RKV_EFORMAT, msg, sizeof msg);
    assert_string_equal(msg, "not an rkv message: magic is 68 65 6c 6c, expected \"RKV1\"");
    expect_error_reply(raw_call(f->url, "RKV1\x01\x00", 6), RKV_EFORMAT, msg, sizeof msg);
    assert_string_equal(msg, "truncated rkv message: 6 bytes, the header alone is 24");

    /* a well-formed envelope whose JSON is wrong: the handler's decoder says why */
    const char *json = "{\"gpu\":\"abc\"}";
    uint8_t *env;
    size_t len;
    assert_int_equal(proto_env_encode(PROTO_MSG_BUDGET_GET, 5, json, strlen(json), &env, &len), 0);
    expect_error_reply(raw_call(f->url, env, len), RKV_EFORMAT, msg, sizeof msg);
    assert_string_equal(msg,
                        "budget_get: field \"gpu\" must be an integer in [-1, 1023], got \"abc\"");
    free(env);

    struct proto_sock *req;
    char err[256];
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, f->url, err, sizeof err), 0);
    struct proto_budget_get g = {.gpu = -1};
    struct proto_budget b;
    assert_int_equal(proto_call_json(req, PROTO_MSG_BUDGET_GET, &g, PROTO_MSG_BUDGET, &b, 10000,
                                     err, sizeof err),
                     0);
    assert_int_equal(b.gpu, -1);
    proto_sock_close(req);

    server_join(&srv);
    assert_int_equal(srv.rc[0], RKV_EFORMAT);
    assert_string_equal(srv.err[0], "not an rkv message: magic is 68 65 6c 6c, expected \"RKV1\"");
    assert_int_equal(srv.rc[1], RKV_EFORMAT);
    assert_int_equal(srv.rc[2], 0); /* a valid envelope, answered with the handler's ERROR */
    assert_int_equal(srv.rc[3], 0);
}

static void test_version_mismatch_server_side(void **state)
{
    struct fix *f = *state;
    struct server srv;
    server_start(&srv, f->url, 1);
    /* a v2 peer says hello */
    uint8_t env[PROTO_HDR_SIZE + 2];
    struct proto_hdr h = {.version = 2, .type = PROTO_MSG_HELLO, .req_id = 1, .flags = 1, .len = 2};
    proto_hdr_pack(&h, env);
    memcpy(env + PROTO_HDR_SIZE, "{}", 2);
    char msg[512];
    expect_error_reply(raw_call(f->url, env, sizeof env), RKV_EVERSION, msg, sizeof msg);
    assert_string_equal(msg, VTEXT(2, 1));
    server_join(&srv);
    assert_int_equal(srv.rc[0], RKV_EVERSION);
    assert_string_equal(srv.err[0], VTEXT(2, 1));
}

/* a fake server of protocol v2: answers anything with its own v2 ERROR */
static void *v2_server(void *p)
{
    nng_socket *s = p;
    nng_msg *m;
    if (nng_recvmsg(*s, &m, 0) != 0)
        return NULL;
    uint64_t id = proto_get_u64((const uint8_t *)nng_msg_body(m) + 8);
    nng_msg_free(m);
    const char *json = "{\"code\":-4107,\"message\":\"" VTEXT(1, 2) "\"}";
    struct proto_hdr h = {.version = 2,
                          .type = PROTO_MSG_ERROR,
                          .req_id = id,
                          .flags = 1,
                          .len = (uint32_t)strlen(json)};
    uint8_t hdr[PROTO_HDR_SIZE];
    proto_hdr_pack(&h, hdr);
    nng_msg_alloc(&m, 0);
    nng_msg_append(m, hdr, sizeof hdr);
    nng_msg_append(m, json, strlen(json));
    if (nng_sendmsg(*s, m, 0) != 0)
        nng_msg_free(m);
    return NULL;
}

static void test_version_mismatch_client_side(void **state)
{
    struct fix *f = *state;
    nng_socket s;
    assert_int_equal(nng_rep0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
    assert_int_equal(nng_listen(s, f->url, NULL, 0), 0);
    pthread_t th;
    pthread_create(&th, NULL, v2_server, &s);
    struct proto_sock *req;
    char err[512];
    assert_int_equal(proto_sock_open(&req, PROTO_SOCK_REQ, f->url, err, sizeof err), 0);
    struct proto_hello hello = {.role = PROTO_ROLE_WORKER, .pid = 42, .proto_version = 1};
    struct proto_hello_ack ack;
    assert_int_equal(proto_call_json(req, PROTO_MSG_HELLO, &hello, PROTO_MSG_HELLO_ACK, &ack, 10000,
                                     err, sizeof err),
                     RKV_EVERSION);
    char want[512];
    snprintf(want, sizeof want, "%s: " VTEXT(2, 1) " (peer says: " VTEXT(1, 2) ")", f->url);
    assert_string_equal(err, want);
    pthread_join(th, NULL);
    proto_sock_close(req);
    nng_close(s);
}

struct one_call {
    const char *url;
    int rc;
};

static void *one_call_thread(void *p)
{
    struct one_call *c = p;
    struct proto_sock *req;
    char err[256];
    c->rc = proto_sock_open(&req, PROTO_SOCK_REQ, c->url, err, sizeof err);
    if (c->rc == 0) {
        struct proto_budget_get g = {.gpu = 0};
        struct proto_budget b;
        c->rc = proto_call_json(req, PROTO_MSG_BUDGET_GET, &g, PROTO_MSG_BUDGET, &b, 10000, err,
                                sizeof err);
        proto_sock_close(req);
    }
    return NULL;
}

static void test_recv_fd_polls(void **state)
{
    struct fix *f = *state;
    struct proto_sock *rep;
    char err[256];
    assert_int_equal(proto_sock_open(&rep, PROTO_SOCK_REP, f->url, err, sizeof err), 0);
    int fd = -1;
    assert_int_equal(proto_sock_recv_fd(rep, &fd), 0);
    assert_true(fd >= 0);
    struct one_call c = {.url = f->url, .rc = 1};
    pthread_t th;
    pthread_create(&th, NULL, one_call_thread, &c);
    /* what a uv_poll_t would do: wait for readable, then serve without blocking */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 10000), 1);
    assert_int_equal(proto_serve_one(rep, handler, NULL, 0, err, sizeof err), 0);
    pthread_join(th, NULL);
    assert_int_equal(c.rc, 0);
    assert_int_equal(proto_serve_one(rep, handler, NULL, 0, err, sizeof err), -EAGAIN);
    proto_sock_close(rep);
}

static void test_pubsub(void **state)
{
    struct fix *f = *state;
    struct proto_sock *pub, *sub;
    char err[256];
    assert_int_equal(proto_sock_open(&pub, PROTO_SOCK_PUB, f->url, err, sizeof err), 0);
    assert_int_equal(proto_sock_open(&sub, PROTO_SOCK_SUB, f->url, err, sizeof err), 0);
    assert_int_equal(proto_sock_subscribe(sub, PROTO_MSG_TACTIC_EVENT), 0);
    assert_int_equal(proto_sock_subscribe(sub, PROTO_MSG_BUDGET_GET + 1000), RKV_EINVAL);
    assert_int_equal(proto_sock_set_timeouts(sub, 1000, 20), 0);
    struct proto_tactic_event ev = {.session_id = 5,
                                    .from = PROTO_TACTIC_RESIDENT,
                                    .to = PROTO_TACTIC_WINDOW,
                                    .tail_blocks = 3,
                                    .gpu = 0};
    snprintf(ev.reason, sizeof ev.reason, "vram pressure");
    struct proto_histogram hist = {.gpu = 0};
    char *ev_json, *hist_json;
    size_t ev_len, hist_len;
    assert_int_equal(
        proto_json_encode(PROTO_MSG_TACTIC_EVENT, &ev, &ev_json, &ev_len, err, sizeof err), 0);
    assert_int_equal(
        proto_json_encode(PROTO_MSG_HISTOGRAM, &hist, &hist_json, &hist_len, err, sizeof err), 0);
    /* the subscriber connects in the background: publish until one arrives */
    struct proto_in in;
    int rc = -1;
    for (int i = 0; i < 500 && rc != 0; i++) {
        assert_int_equal(proto_sock_send(pub, PROTO_MSG_HISTOGRAM, 0, hist_json, hist_len), 0);
        assert_int_equal(proto_sock_send(pub, PROTO_MSG_TACTIC_EVENT, 0, ev_json, ev_len), 0);
        rc = proto_sock_recv(sub, &in, 0, err, sizeof err);
        if (rc)
            proto_in_fini(&in);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(in.hdr.type, PROTO_MSG_TACTIC_EVENT); /* never the histogram */
    struct proto_tactic_event got;
    assert_int_equal(
        proto_json_decode(PROTO_MSG_TACTIC_EVENT, in.payload, in.len, &got, err, sizeof err), 0);
    assert_int_equal(got.to, PROTO_TACTIC_WINDOW);
    assert_string_equal(got.reason, "vram pressure");
    proto_in_fini(&in);
    /* drain: everything left is a tactic event too */
    while (proto_sock_recv(sub, &in, PROTO_NONBLOCK, err, sizeof err) == 0) {
        assert_int_equal(in.hdr.type, PROTO_MSG_TACTIC_EVENT);
        proto_in_fini(&in);
    }
    proto_in_fini(&in);
    free(ev_json);
    free(hist_json);
    proto_sock_close(sub);
    proto_sock_close(pub);
}

static void test_open_errors(void **state)
{
    struct fix *f = *state;
    struct proto_sock *a, *b;
    char err[256];
    assert_int_equal(proto_sock_open(&a, PROTO_SOCK_REP, f->url, err, sizeof err), 0);
    int rc = proto_sock_open(&b, PROTO_SOCK_REP, f->url, err, sizeof err);
    assert_int_equal(rc, -EADDRINUSE);
    assert_null(b);
    assert_non_null(strstr(err, "is another rkv process running?"));
    assert_non_null(strstr(err, f->url));
    proto_sock_close(a);
    rc = proto_sock_open(&b, PROTO_SOCK_REP, "bogus://x", err, sizeof err);
    assert_true(rc < 0);
    assert_non_null(strstr(err, "bogus://x: cannot listen on it (rep socket)"));
    struct proto_in r;
    assert_int_equal(proto_sock_open(&a, PROTO_SOCK_PUB, f->url, err, sizeof err), 0);
    assert_int_equal(proto_call(a, PROTO_MSG_OK, "{}", 2, &r, 10, err, sizeof err), RKV_EINVAL);
    proto_sock_close(a);
    proto_sock_close(NULL);
}

static void test_nng_err(void **state)
{
    (void)state;
    assert_int_equal(proto_nng_err(0), 0);
    assert_int_equal(proto_nng_err(NNG_ETIMEDOUT), RKV_ETIMEOUT);
    assert_int_equal(proto_nng_err(NNG_ECLOSED), RKV_ECLOSED);
    assert_int_equal(proto_nng_err(NNG_ECONNREFUSED), RKV_ECLOSED);
    assert_int_equal(proto_nng_err(NNG_ECONNRESET), RKV_ECLOSED);
    assert_int_equal(proto_nng_err(NNG_ENOMEM), RKV_ENOMEM);
    assert_int_equal(proto_nng_err(NNG_EAGAIN), -EAGAIN);
    assert_int_equal(proto_nng_err(NNG_EMSGSIZE), RKV_ETOOBIG);
    assert_int_equal(proto_nng_err(NNG_EPROTO), RKV_EPROTO);
    assert_int_equal(proto_nng_err(NNG_ESYSERR | EPIPE), -EPIPE);
    assert_int_equal(proto_nng_err(NNG_ETRANERR | 5), RKV_EIO);
    for (int e = 1; e <= 31; e++)
        assert_true(proto_nng_err(e) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_share_a_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeouts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_ends_waiting_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_gets_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_mismatch_server_side, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_mismatch_client_side, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recv_fd_polls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pubsub, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test(test_nng_err),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* nng reaps closed listeners and pipes on its own threads; let it finish
     * so the leak checker sees only real leaks */
    nng_fini();
    return failed;
}
