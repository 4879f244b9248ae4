/* server_test.c - http server tests: a real server on an ephemeral port, a blocking client thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/http/server.h"

#include "daemon/http/test_client.h"

/* --- the server side ------------------------------------------------------------ */

struct ctx {
    uv_loop_t loop;
    uv_async_t client_done;
    struct http_server *srv;
    int port;
    pthread_t thread;
    void (*client)(struct ctx *);
    int shutdown_called;
    int done_called;
    int closes;          /* on_close callbacks seen */
    int stream_ends;     /* streams the handler ended */
    int shutdown_in_sse; /* /sse starts a graceful shutdown after its first event */
    uint64_t shutdown_deadline_ms;
    sem_t backpressured; /* the /big handler saw http_resp_write return 1 */
    int big_chunks;      /* chunks written before backpressure */
    int drains;
    struct http_stats stats;    /* taken when the client finished */
    struct http_stats at_burst; /* taken when /burst began */
    /* results the client thread records for the main thread to assert */
    struct resp r[8];
    int rc[8];
    int eof[8];
    char *raw[4];
};

static struct ctx *g;

static void on_shutdown_done(void *arg)
{
    struct ctx *x = arg;
    x->done_called++;
}

static void start_shutdown(struct ctx *x, uint64_t deadline_ms)
{
    if (x->shutdown_called)
        return;
    x->shutdown_called = 1;
    http_server_shutdown(x->srv, deadline_ms, on_shutdown_done, x);
}

/* a streaming handler: n events, one per timer tick, or forever */
struct stream {
    struct http_req *req;
    uv_timer_t timer;
    int left; /* -1: until the client leaves */
    int i;
};

static void stream_timer_closed(uv_handle_t *h)
{
    free(h->data);
}

static void stream_finish(struct stream *st)
{
    http_resp_end(st->req);
    g->stream_ends++;
    uv_close((uv_handle_t *)&st->timer, stream_timer_closed);
}

static void stream_on_close(struct http_req *req, void *arg)
{
    struct stream *st = arg;
    g->closes++;
    uv_timer_stop(&st->timer);
    stream_finish(st);
}

static void stream_tick(uv_timer_t *t)
{
    struct stream *st = t->data;
    char ev[64];
    int n = snprintf(ev, sizeof(ev), "data: {\"i\":%d}\n\n", st->i++);
    if (http_resp_write(st->req, ev, (size_t)n) < 0)
        return;
    if (st->i == 1 && g->shutdown_in_sse)
        start_shutdown(g, g->shutdown_deadline_ms);
    if (st->left > 0 && --st->left == 0) {
        uv_timer_stop(t);
        stream_finish(st);
    }
}

static void start_stream(struct http_req *req, int n)
{
    struct stream *st = calloc(1, sizeof(*st));
    st->req = req;
    st->left = n;
    uv_timer_init(&g->loop, &st->timer);
    st->timer.data = st;
    http_req_set_callbacks(req, stream_on_close, NULL, st);
    http_resp_start(req, 200, "text/event-stream");
    uv_timer_start(&st->timer, stream_tick, 1, 2);
}

struct later {
    uv_timer_t timer;
    struct http_req *req;
};

static void later_closed(uv_handle_t *h)
{
    free(h->data);
}

static void later_fire(uv_timer_t *t)
{
    struct later *l = t->data;
    http_respond(l->req, 200, "text/plain", "late", 4);
    uv_close((uv_handle_t *)&l->timer, later_closed);
}

/* writes 64 KiB chunks to a client that does not read until the queue
 * passes the high-water mark, then finishes once it drained */
static char big_chunk[65536];

static void big_on_drain(struct http_req *req, void *arg)
{
    g->drains++;
    http_resp_write(req, "end", 3);
    http_resp_end(req);
}

static void start_big(struct http_req *req)
{
    memset(big_chunk, 'b', sizeof(big_chunk));
    http_req_set_callbacks(req, NULL, big_on_drain, NULL);
    http_resp_start(req, 200, "application/octet-stream");
    int rc = 0;
    while (rc == 0 && g->big_chunks < 4096) {
        rc = http_resp_write(req, big_chunk, sizeof(big_chunk));
        g->big_chunks++;
    }
    sem_post(&g->backpressured);
}

static void handler(struct http_req *req, void *arg)
{
    const char *path = http_req_path(req);
    if (strcmp(path, "/echo") == 0) {
        size_t len;
        const char *body = http_req_body(req, &len);
        const char *xt = http_req_header(req, "x-TEST");
        char out[4096];
        int n = snprintf(out, sizeof(out), "%s %s ?%s x=%s len=%zu body=%.2000s",
                         http_req_method(req), path, http_req_query(req), xt ? xt : "-", len, body);
        http_resp_header(req, "X-Rkv", "1");
        http_respond(req, 200, "text/plain", out, (size_t)n);
    } else if (strcmp(path, "/sse") == 0) {
        int n = atoi(http_req_query(req) + 2); /* "n=5" */
        start_stream(req, n);
    } else if (strcmp(path, "/burst") == 0) {
        /* five events and the end in one callback, as the scheduler streams a step's tokens */
        http_server_get_stats(g->srv, &g->at_burst);
        http_resp_start(req, 200, "text/event-stream");
        for (int i = 0; i < 5; i++) {
            char ev[32];
            int n = snprintf(ev, sizeof(ev), "data: %d\n\n", i);
            http_resp_write(req, ev, (size_t)n);
        }
        http_resp_end(req);
    } else if (strcmp(path, "/big") == 0) {
        start_big(req);
    } else if (strcmp(path, "/forever") == 0) {
        start_stream(req, -1);
    } else if (strcmp(path, "/async") == 0) {
        struct later *l = calloc(1, sizeof(*l));
        l->req = req;
        uv_timer_init(&g->loop, &l->timer);
        l->timer.data = l;
        uv_timer_start(&l->timer, later_fire, 5, 0);
    } else {
        http_respond(req, 404, "text/plain", "no", 2);
    }
}

static void on_client_done(uv_async_t *a)
{
    struct ctx *x = a->data;
    if (!x->shutdown_called)
        http_server_get_stats(x->srv, &x->stats);
    start_shutdown(x, 2000);
    uv_close((uv_handle_t *)a, NULL);
}

static void *client_main(void *arg)
{
    struct ctx *x = arg;
    x->client(x);
    uv_async_send(&x->client_done);
    return NULL;
}

/* runs one scenario: the server in this thread's loop, the client on a thread */
static void run_scenario(struct ctx *x, const struct http_limits *lim, const char *host,
                         void (*client)(struct ctx *))
{
    g = x;
    assert_int_equal(uv_loop_init(&x->loop), 0);
    struct http_server_config cfg = {.host = host, .port = 0, .on_request = handler};
    if (lim)
        cfg.limits = *lim;
    else
        http_limits_default(&cfg.limits);
    assert_int_equal(http_server_start(&x->loop, &cfg, &x->srv), 0);
    x->port = http_server_port(x->srv);
    assert_true(x->port > 0);
    uv_async_init(&x->loop, &x->client_done, on_client_done);
    x->client_done.data = x;
    x->client = client;
    pthread_create(&x->thread, NULL, client_main, x);
    assert_int_equal(uv_run(&x->loop, UV_RUN_DEFAULT), 0);
    pthread_join(x->thread, NULL);
    assert_int_equal(x->done_called, 1);
    assert_int_equal(uv_loop_close(&x->loop), 0);
}

static void ctx_fini(struct ctx *x)
{
    for (size_t i = 0; i < 8; i++)
        free(x->r[i].body);
    for (size_t i = 0; i < 4; i++)
        free(x->raw[i]);
}

/* --- scenarios --------------------------------------------------------------------- */

static void cl_keepalive(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /echo?a=1 HTTP/1.1\r\nHost: x\r\nX-Test: hello\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde");
    x->rc[1] = client_read(&c, &x->r[1]);
    SEND(&c, "GET /missing HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[2] = client_read(&c, &x->r[2]);
    SEND(&c, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    x->rc[3] = client_read(&c, &x->r[3]);
    x->eof[3] = client_eof(&c);
    client_close(&c);
}

static void test_keepalive(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_keepalive);
    for (int i = 0; i < 4; i++)
        assert_int_equal(x.rc[i], 0);
    assert_int_equal(x.r[0].status, 200);
    assert_string_equal(x.r[0].body, "GET /echo ?a=1 x=hello len=0 body=");
    assert_string_equal(x.r[0].conn, "keep-alive");
    assert_string_equal(x.r[1].body, "POST /echo ? x=- len=5 body=abcde");
    assert_int_equal(x.r[2].status, 404);
    assert_string_equal(x.r[3].conn, "close");
    assert_int_equal(x.eof[3], 1);
    ctx_fini(&x);
}

static void cl_pipeline(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 1);
    /* all three in one write: the slow /async one must still answer first */
    SEND(&c, "GET /async HTTP/1.1\r\nHost: x\r\n\r\n"
             "POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz"
             "GET /echo?n=3 HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < 3; i++)
        x->rc[i] = client_read(&c, &x->r[i]);
    client_close(&c);
}

static void test_pipelining_ipv6(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "::1", cl_pipeline);
    for (int i = 0; i < 3; i++)
        assert_int_equal(x.rc[i], 0);
    assert_string_equal(x.r[0].body, "late");
    assert_string_equal(x.r[1].body, "POST /echo ?n=2 x=- len=3 body=xyz");
    assert_string_equal(x.r[2].body, "GET /echo ?n=3 x=- len=0 body=");
    ctx_fini(&x);
}

static void cl_chunked_body(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             "4\r\nWiki\r\n5\r\npedia\r\n");
    SEND(&c, "E\r\n in\r\n\r\nchunks.\r\n0\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    /* Expect: 100-continue gets the interim response, then the real one */
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
             "Expect: 100-continue\r\n\r\n");
    x->raw[0] = client_read_until(&c, "\r\n\r\n");
    SEND(&c, "ok");
    x->rc[1] = client_read(&c, &x->r[1]);
    client_close(&c);
}

static void test_chunked_request_body(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_chunked_body);
    assert_int_equal(x.rc[0], 0);
    assert_string_equal(x.r[0].body, "POST /echo ? x=- len=23 body=Wikipedia in\r\n\r\nchunks.");
    assert_string_equal(x.raw[0], "HTTP/1.1 100 Continue\r\n\r\n");
    assert_int_equal(x.rc[1], 0);
    assert_string_equal(x.r[1].body, "POST /echo ? x=- len=2 body=ok");
    ctx_fini(&x);
}

static void cl_sse(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /sse?n=3 HTTP/1.1\r\nHost: x\r\n\r\n");
    x->raw[0] = client_read_until(&c, "0\r\n\r\n");
    client_close(&c);
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /sse?n=4 HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    client_close(&c);
}

static void test_sse_chunked(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_sse);
    /* the exact bytes: head, one chunk per event, the last chunk */
    const char *body = strstr(x.raw[0], "\r\n\r\n");
    assert_non_null(body);
    assert_non_null(strstr(x.raw[0], "Transfer-Encoding: chunked\r\n"));
    assert_non_null(strstr(x.raw[0], "Content-Type: text/event-stream\r\n"));
    assert_non_null(strstr(x.raw[0], "Cache-Control: no-cache\r\n"));
    assert_string_equal(body + 4, "f\r\ndata: {\"i\":0}\n\n\r\n"
                                  "f\r\ndata: {\"i\":1}\n\n\r\n"
                                  "f\r\ndata: {\"i\":2}\n\n\r\n"
                                  "0\r\n\r\n");
    assert_int_equal(x.rc[0], 0);
    assert_string_equal(x.r[0].te, "chunked");
    assert_string_equal(x.r[0].body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\n"
                                     "data: {\"i\":2}\n\ndata: {\"i\":3}\n\n");
    assert_int_equal(x.stream_ends, 2);
    assert_int_equal(x.closes, 0);
    ctx_fini(&x);
}

static void cl_burst(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /burst HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    SEND(&c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"); /* the connection goes on */
    x->rc[1] = client_read(&c, &x->r[1]);
    client_close(&c);
}

static void test_burst_is_one_write(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_burst);
    assert_int_equal(x.rc[0], 0);
    assert_string_equal(x.r[0].te, "chunked");
    assert_string_equal(x.r[0].body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
    assert_int_equal(x.rc[1], 0);
    assert_non_null(strstr(x.r[1].body, "GET /echo"));
    /* stats taken at /burst's start, and when the client was done: the head, the five
     * chunks and the last chunk as one write, then /echo's answer */
    assert_int_equal(x.stats.writes - x.at_burst.writes, 3);
    ctx_fini(&x);
}

static void cl_disconnect(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    x->raw[0] = client_read_until(&c, "{\"i\":2}");
    client_close(&c);
    /* a second connection proves the server lives on */
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    client_close(&c);
}

static void test_disconnect_mid_stream(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_disconnect);
    assert_non_null(strstr(x.raw[0], "{\"i\":2}"));
    assert_int_equal(x.closes, 1);
    assert_int_equal(x.stream_ends, 1);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].status, 200);
    ctx_fini(&x);
}

static void cl_header_too_large(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    char *big = malloc(10000);
    memset(big, 'a', 9999);
    big[9999] = '\0';
    SEND(&c, "GET /echo HTTP/1.1\r\nX-Big: ");
    SEND(&c, big);
    SEND(&c, "\r\n\r\n");
    free(big);
    x->rc[0] = client_read(&c, &x->r[0]);
    x->eof[0] = client_eof(&c);
    client_close(&c);
}

static void test_header_too_large_431(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_header_too_large);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].status, 431);
    assert_string_equal(x.r[0].conn, "close");
    assert_non_null(strstr(x.r[0].body, "\"message\":\"request headers are too large\""));
    assert_int_equal(x.eof[0], 1);
    ctx_fini(&x);
}

static void cl_body_too_large(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    /* declared too large: refused before a byte of body is sent */
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    client_close(&c);
    /* chunked: refused once the decoded body passes the limit */
    client_connect(&c, x->port, 0);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    char chunk[600];
    memset(chunk, 'z', sizeof(chunk));
    for (int i = 0; i < 2; i++) {
        SEND(&c, "258\r\n");
        client_send(&c, chunk, sizeof(chunk));
        SEND(&c, "\r\n");
    }
    x->rc[1] = client_read(&c, &x->r[1]);
    client_close(&c);
    /* exactly at the limit is fine */
    client_connect(&c, x->port, 0);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");
    char full[1000];
    memset(full, 'q', sizeof(full));
    client_send(&c, full, sizeof(full));
    x->rc[2] = client_read(&c, &x->r[2]);
    client_close(&c);
}

static void test_body_too_large_413(void **state)
{
    struct ctx x = {0};
    struct http_limits lim;
    http_limits_default(&lim);
    lim.max_body_bytes = 1000;
    run_scenario(&x, &lim, "127.0.0.1", cl_body_too_large);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].status, 413);
    assert_int_equal(x.rc[1], 0);
    assert_int_equal(x.r[1].status, 413);
    assert_int_equal(x.rc[2], 0);
    assert_int_equal(x.r[2].status, 200);
    assert_non_null(strstr(x.r[2].body, "len=1000 "));
    ctx_fini(&x);
}

static void cl_slow(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slo");
    x->rc[0] = client_read(&c, &x->r[0]);
    x->eof[0] = client_eof(&c);
    client_close(&c);
    client_connect(&c, x->port, 0);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
    x->rc[1] = client_read(&c, &x->r[1]);
    client_close(&c);
}

static void cl_idle(struct ctx *x)
{
    /* an idle keep-alive connection is closed quietly */
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[2] = client_read(&c, &x->r[2]);
    x->eof[2] = client_eof(&c);
    client_close(&c);
}

static void test_slow_client_408(void **state)
{
    struct ctx x = {0};
    struct http_limits lim;
    http_limits_default(&lim);
    lim.header_timeout_ms = 30;
    lim.body_timeout_ms = 30;
    run_scenario(&x, &lim, "127.0.0.1", cl_slow);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].status, 408);
    assert_int_equal(x.eof[0], 1);
    assert_int_equal(x.rc[1], 0);
    assert_int_equal(x.r[1].status, 408);
    assert_non_null(strstr(x.r[1].body, "body not received in time"));
    assert_int_equal(x.stats.timeouts, 2);
    ctx_fini(&x);
}

static void test_idle_keepalive_closed(void **state)
{
    struct ctx x = {0};
    struct http_limits lim;
    http_limits_default(&lim);
    /* long enough that the request itself always arrives first */
    lim.idle_timeout_ms = 200;
    run_scenario(&x, &lim, "127.0.0.1", cl_idle);
    assert_int_equal(x.rc[2], 0);
    assert_int_equal(x.r[2].status, 200);
    assert_int_equal(x.eof[2], 1);
    ctx_fini(&x);
}

static void cl_too_many(struct ctx *x)
{
    struct client c[3];
    for (int i = 0; i < 2; i++) {
        client_connect(&c[i], x->port, 0);
        SEND(&c[i], "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
        x->rc[i] = client_read(&c[i], &x->r[i]);
    }
    client_connect(&c[2], x->port, 0);
    x->rc[2] = client_read(&c[2], &x->r[2]);
    x->eof[2] = client_eof(&c[2]);
    client_close(&c[2]);
    /* a freed slot is usable again */
    client_close(&c[0]);
    SEND(&c[1], "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[3] = client_read(&c[1], &x->r[3]);
    client_close(&c[1]);
}

static void test_too_many_connections_503(void **state)
{
    struct ctx x = {0};
    struct http_limits lim;
    http_limits_default(&lim);
    lim.max_connections = 2;
    run_scenario(&x, &lim, "127.0.0.1", cl_too_many);
    assert_int_equal(x.r[0].status, 200);
    assert_int_equal(x.r[1].status, 200);
    assert_int_equal(x.rc[2], 0);
    assert_int_equal(x.r[2].status, 503);
    assert_non_null(strstr(x.r[2].body, "max_connections"));
    assert_int_equal(x.eof[2], 1);
    assert_int_equal(x.r[3].status, 200);
    assert_int_equal(x.stats.connections, 3);
    assert_int_equal(x.stats.rejected, 1);
    assert_int_equal(x.stats.requests, 3);
    ctx_fini(&x);
}

static void cl_bad_request(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    /* the good request is answered, then the garbage gets a 400 and a close */
    SEND(&c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\nBLAH\x01 / HTTP/1.1\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    x->rc[1] = client_read(&c, &x->r[1]);
    x->eof[1] = client_eof(&c);
    client_close(&c);
    /* smuggling attempt: Content-Length together with chunked */
    client_connect(&c, x->port, 0);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
             "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    x->rc[2] = client_read(&c, &x->r[2]);
    client_close(&c);
}

static void test_bad_request_400(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_bad_request);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].status, 200);
    assert_int_equal(x.rc[1], 0);
    assert_int_equal(x.r[1].status, 400);
    assert_int_equal(x.eof[1], 1);
    assert_int_equal(x.rc[2], 0);
    assert_int_equal(x.r[2].status, 400);
    ctx_fini(&x);
}

static void cl_shutdown_stream(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /sse?n=5 HTTP/1.1\r\nHost: x\r\n\r\n");
    x->rc[0] = client_read(&c, &x->r[0]);
    x->eof[0] = client_eof(&c);
    client_close(&c);
}

static void test_shutdown_finishes_stream(void **state)
{
    struct ctx x = {0};
    x.shutdown_in_sse = 1;
    x.shutdown_deadline_ms = 10000;
    run_scenario(&x, NULL, "127.0.0.1", cl_shutdown_stream);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].status, 200);
    assert_string_equal(x.r[0].body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\n"
                                     "data: {\"i\":3}\n\ndata: {\"i\":4}\n\n");
    assert_int_equal(x.eof[0], 1);
    assert_int_equal(x.closes, 0);
    assert_int_equal(x.stream_ends, 1);
    ctx_fini(&x);
}

static void cl_shutdown_deadline(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    /* the stream never ends by itself: the deadline cuts it */
    x->raw[0] = client_read_until(&c, "no such text");
    client_close(&c);
}

static void test_shutdown_deadline_cuts_stream(void **state)
{
    struct ctx x = {0};
    x.shutdown_in_sse = 1;
    x.shutdown_deadline_ms = 20;
    run_scenario(&x, NULL, "127.0.0.1", cl_shutdown_deadline);
    assert_non_null(strstr(x.raw[0], "{\"i\":0}"));
    /* cut: no last chunk */
    assert_null(strstr(x.raw[0], "\r\n0\r\n\r\n"));
    assert_int_equal(x.closes, 1);
    assert_int_equal(x.stream_ends, 1);
    ctx_fini(&x);
}

static void cl_http10_head(struct ctx *x)
{
    struct client c;
    /* HTTP/1.0: no chunked coding; the stream ends when the server closes */
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /sse?n=2 HTTP/1.0\r\n\r\n");
    x->raw[0] = client_read_until(&c, "no such text");
    client_close(&c);
    /* HEAD: the headers of a GET, no body */
    client_connect(&c, x->port, 0);
    SEND(&c, "HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n"
             "Connection: close\r\n\r\n");
    x->raw[1] = client_read_until(&c, "no such text");
    client_close(&c);
    /* a transfer coding other than chunked is refused */
    client_connect(&c, x->port, 0);
    SEND(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxx");
    x->rc[0] = client_read(&c, &x->r[0]);
    client_close(&c);
    /* HTTP/1.0 keep-alive asked, but a stream is close-delimited: the server closes after it
     * (it waited for the idle timeout) and answers nothing pipelined behind it */
    client_connect(&c, x->port, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    SEND(&c, "GET /sse?n=2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
             "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    x->raw[2] = client_read_until(&c, "no such text");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    x->eof[2] = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 5000;
    client_close(&c);
}

static void test_http10_head_and_codings(void **state)
{
    struct ctx x = {0};
    run_scenario(&x, NULL, "127.0.0.1", cl_http10_head);
    assert_non_null(strstr(x.raw[0], "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(x.raw[0], "Connection: close\r\n"));
    assert_null(strstr(x.raw[0], "Transfer-Encoding"));
    const char *body = strstr(x.raw[0], "\r\n\r\n");
    assert_non_null(body);
    assert_string_equal(body + 4, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\n");
    /* the HEAD answer has Content-Length but no body: the next response follows at once */
    const char *second = strstr(x.raw[1] + 1, "HTTP/1.1 200 OK");
    assert_non_null(second);
    assert_non_null(strstr(x.raw[1], "Content-Length: 28\r\n"));
    assert_true(strncmp(second - 4, "\r\n\r\n", 4) == 0);
    assert_non_null(strstr(second, "GET /echo ? x=- len=0 body="));
    assert_int_equal(x.rc[0], 0);
    assert_true(x.r[0].status == 400 || x.r[0].status == 501);
    assert_non_null(strstr(x.raw[2], "Connection: close\r\n"));
    assert_non_null(strstr(x.raw[2], "data: {\"i\":1}\n\n"));
    assert_null(strstr(x.raw[2], "GET /echo"));
    assert_true(x.eof[2]); /* closed at once, not at the idle timeout */
    ctx_fini(&x);
}

static void cl_backpressure(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    SEND(&c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
    /* read nothing until the server reports backpressure */
    sem_wait(&x->backpressured);
    x->rc[0] = client_read(&c, &x->r[0]);
    client_close(&c);
}

static void test_write_backpressure_and_drain(void **state)
{
    struct ctx x = {0};
    sem_init(&x.backpressured, 0, 0);
    struct http_limits lim;
    http_limits_default(&lim);
    lim.write_high_water = 256 * 1024;
    run_scenario(&x, &lim, "127.0.0.1", cl_backpressure);
    assert_true(x.big_chunks < 4096); /* backpressure was reported */
    assert_int_equal(x.drains, 1);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.r[0].body_len, (size_t)x.big_chunks * 65536 + 3);
    assert_string_equal(x.r[0].body + x.r[0].body_len - 3, "end");
    sem_destroy(&x.backpressured);
    ctx_fini(&x);
}

static void cl_pipeline_pause(struct ctx *x)
{
    struct client c;
    client_connect(&c, x->port, 0);
    /* more requests in one write than max_pipelined: reading pauses and
     * resumes, every one is answered in order */
    char all[2048] = "";
    for (int i = 0; i < 6; i++) {
        char one[128];
        snprintf(one, sizeof(one), "GET /echo?i=%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
        strcat(all, one);
    }
    SEND(&c, all);
    for (int i = 0; i < 6; i++)
        x->rc[i] = client_read(&c, &x->r[i]);
    client_close(&c);
}

static void test_pipeline_over_queue_limit(void **state)
{
    struct ctx x = {0};
    struct http_limits lim;
    http_limits_default(&lim);
    lim.max_pipelined = 2;
    run_scenario(&x, &lim, "127.0.0.1", cl_pipeline_pause);
    for (int i = 0; i < 6; i++) {
        char want[64];
        snprintf(want, sizeof(want), "GET /echo ?i=%d x=- len=0 body=", i);
        assert_int_equal(x.rc[i], 0);
        assert_string_equal(x.r[i].body, want);
    }
    ctx_fini(&x);
}

static void test_listen_errors(void **state)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct http_server *a, *b;
    struct http_server_config cfg = {.host = "127.0.0.1", .port = 0, .on_request = handler};
    http_limits_default(&cfg.limits);
    assert_int_equal(http_server_start(&loop, &cfg, &a), 0);
    cfg.port = http_server_port(a);
    assert_int_equal(http_server_start(&loop, &cfg, &b), UV_EADDRINUSE);
    cfg.host = "not-an-address";
    assert_true(http_server_start(&loop, &cfg, &b) < 0);
    struct ctx x = {0};
    http_server_shutdown(a, 100, on_shutdown_done, &x);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(x.done_called, 1);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keepalive),
        cmocka_unit_test(test_pipelining_ipv6),
        cmocka_unit_test(test_chunked_request_body),
        cmocka_unit_test(test_sse_chunked),
        cmocka_unit_test(test_burst_is_one_write),
        cmocka_unit_test(test_disconnect_mid_stream),
        cmocka_unit_test(test_header_too_large_431),
        cmocka_unit_test(test_body_too_large_413),
        cmocka_unit_test(test_slow_client_408),
        cmocka_unit_test(test_idle_keepalive_closed),
        cmocka_unit_test(test_too_many_connections_503),
        cmocka_unit_test(test_bad_request_400),
        cmocka_unit_test(test_shutdown_finishes_stream),
        cmocka_unit_test(test_shutdown_deadline_cuts_stream),
        cmocka_unit_test(test_http10_head_and_codings),
        cmocka_unit_test(test_write_backpressure_and_drain),
        cmocka_unit_test(test_pipeline_over_queue_limit),
        cmocka_unit_test(test_listen_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
