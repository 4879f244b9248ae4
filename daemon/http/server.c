/* server.c - HTTP/1.1 server: connections, request queue, responses, limits and shutdown on libuv.
 */
#include "daemon/http/server.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "daemon/http/reader.h"

enum conn_timer { TIMER_NONE, TIMER_IDLE, TIMER_HEADERS, TIMER_BODY, TIMER_LINGER };

struct http_conn;

struct http_req {
    struct http_server *srv;
    struct http_conn *conn; /* NULL once the connection is gone */
    struct http_msg *msg;
    struct http_req *next; /* in the connection's queue */
    http_close_cb on_close;
    http_drain_cb on_drain;
    void *cb_arg;
    char *extra; /* extra response header lines, "Name: value\r\n"... */
    size_t extra_len;
    char peer[64];
    uint64_t t_start;        /* loop time the request was complete, ms */
    int status;              /* the response's status, for the access log */
    unsigned started : 1;    /* response head sent */
    unsigned closed : 1;     /* the client went away */
    unsigned want_drain : 1; /* a write reported backpressure */
    unsigned chunked : 1;    /* response body in chunked coding */
    unsigned last : 1;       /* the connection closes after this response */
    unsigned finishing : 1;  /* inside http_respond/http_resp_end: no on_close now */
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    struct http_server *srv;
    struct http_conn *prev, *next;
    struct http_reader reader;
    struct http_req *qhead, *qtail; /* parsed, not yet handed to the handler */
    unsigned n_queued;
    struct http_req *active; /* handed to the handler, response not finished */
    int open_handles;        /* tcp + timer; freed when both closed */
    enum conn_timer tkind;
    int err_status; /* answer this after the queue, then close */
    const char *err_text;
    unsigned closing : 1;  /* uv_close called */
    unsigned draining : 1; /* our side is done: FIN sent, discarding input */
    unsigned reading : 1;
    unsigned rejected : 1; /* over max_connections: 503 then close */
    unsigned no_more : 1;  /* no request after the queued ones (close or upgrade) */
    unsigned pumping : 1;
    /* body chunks not yet handed to the socket: written as one when the loop is about to
     * wait (srv->flush), so a step's tokens of one stream go out in one write, after the
     * scheduler has sent the next step */
    struct wbuf *pend;
    char peer[64];
    char rbuf[16384];
};

struct http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t deadline;
    struct http_limits lim;
    http_request_cb on_request;
    void *arg;
    int port;
    struct http_conn *conns;
    unsigned n_conns;   /* counted against max_connections */
    unsigned n_handles; /* every connection not yet freed, rejected ones too */
    unsigned n_reqs;    /* request objects alive */
    struct http_stats stats;
    uv_prepare_t flush; /* writes the connections' pending chunks before the loop waits */
    unsigned n_pend;    /* connections with pending chunks */
    unsigned shutting_down : 1;
    unsigned listener_open : 1;
    unsigned deadline_open : 1;
    unsigned deadline_closing : 1;
    unsigned flush_open : 1;
    unsigned flush_closing : 1;
    http_shutdown_cb done;
    void *done_arg;
};

/* one queued write and its bytes */
struct wbuf {
    uv_write_t w;
    struct http_conn *conn;
    size_t len, cap;
    char data[];
};

static void conn_pump(struct http_conn *c);
static void conn_resume(struct http_conn *c);
static void deadline_closed(uv_handle_t *h);
static void flush_closed(uv_handle_t *h);
static void conn_close(struct http_conn *c);
static int conn_flush(struct http_conn *c);
static void conn_update_timer(struct http_conn *c);

void http_limits_default(struct http_limits *l)
{
    l->max_header_bytes = 8192;
    l->max_body_bytes = 4u << 20;
    l->max_connections = 1024;
    l->header_timeout_ms = 10000;
    l->body_timeout_ms = 30000;
    l->idle_timeout_ms = 60000;
    l->linger_ms = 2000;
    l->write_high_water = 1u << 20;
    l->max_pipelined = 32;
}

const char *http_status_text(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* --- lifetime ----------------------------------------------------------------- */

static void server_check_done(struct http_server *s)
{
    if (!s->shutting_down || s->listener_open || s->n_handles || s->n_reqs)
        return;
    if (s->flush_open) {
        if (!s->flush_closing) {
            s->flush_closing = 1;
            uv_close((uv_handle_t *)&s->flush, flush_closed);
        }
        return;
    }
    if (s->deadline_open) {
        if (!s->deadline_closing) {
            s->deadline_closing = 1;
            uv_close((uv_handle_t *)&s->deadline, deadline_closed);
        }
        return;
    }
    http_shutdown_cb done = s->done;
    void *arg = s->done_arg;
    free(s);
    if (done)
        done(arg);
}

static void req_destroy(struct http_req *r)
{
    r->srv->n_reqs--;
    http_msg_destroy(r->msg);
    free(r->extra);
    free(r);
}

static void conn_free_queue(struct http_conn *c)
{
    while (c->qhead) {
        struct http_req *r = c->qhead;
        c->qhead = r->next;
        req_destroy(r);
    }
    c->qtail = NULL;
    c->n_queued = 0;
}

static void conn_handle_closed(uv_handle_t *h)
{
    struct http_conn *c = h->data;
    if (--c->open_handles > 0)
        return;
    struct http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (!c->rejected)
        s->n_conns--;
    s->n_handles--;
    http_reader_fini(&c->reader);
    free(c);
    server_check_done(s);
}

/* closes now: pending writes are dropped, the active request sees on_close */
static void conn_close(struct http_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (c->pend) {
        free(c->pend);
        c->pend = NULL;
        c->srv->n_pend--;
    }
    conn_free_queue(c);
    struct http_req *r = c->active;
    c->active = NULL;
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    if (r) {
        r->conn = NULL;
        r->closed = 1;
        if (r->on_close && !r->finishing)
            r->on_close(r, r->cb_arg);
    }
}

static void conn_shutdown_cb(uv_shutdown_t *sr, int status)
{
    struct http_conn *c = sr->data;
    if (status < 0)
        conn_close(c);
}

/* our side is finished: flush, send FIN, and discard input until the
 * client's EOF or linger_ms, so the client reads our last response rather
 * than a reset */
static void conn_drain(struct http_conn *c)
{
    if (c->closing || c->draining)
        return;
    if (conn_flush(c) < 0)
        return;
    c->draining = 1;
    conn_free_queue(c);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, conn_shutdown_cb) < 0) {
        conn_close(c);
        return;
    }
    /* reading may have been paused for the queue; resume to see the EOF */
    conn_resume(c);
    conn_update_timer(c);
}

/* --- writing ------------------------------------------------------------------ */

static void write_done(uv_write_t *w, int status)
{
    struct wbuf *b = (struct wbuf *)w;
    struct http_conn *c = b->conn;
    free(b);
    if (c->closing)
        return;
    if (status < 0) {
        log_debug("http: write to %s failed: %s", c->peer, uv_strerror(status));
        conn_close(c);
        return;
    }
    struct http_req *r = c->active;
    if (r && r->want_drain &&
        uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) <=
            c->srv->lim.write_high_water / 2) {
        r->want_drain = 0;
        if (r->on_drain)
            r->on_drain(r, r->cb_arg);
    }
}

static struct wbuf *wbuf_create(struct http_conn *c, size_t cap)
{
    struct wbuf *b = malloc(sizeof(*b) + cap);
    if (!b)
        return NULL;
    b->conn = c;
    b->len = 0;
    b->cap = cap;
    return b;
}

static int conn_submit(struct http_conn *c, struct wbuf *b)
{
    c->srv->stats.bytes_out += b->len;
    c->srv->stats.writes++;
    uv_buf_t ub = uv_buf_init(b->data, (unsigned)b->len);
    int rc = uv_write(&b->w, (uv_stream_t *)&c->tcp, &ub, 1, write_done);
    if (rc < 0) {
        free(b);
        conn_close(c);
        return RKV_ECLOSED;
    }
    return 0;
}

/* the pending chunks to the socket (RKV_ECLOSED when that closed the connection) */
static int conn_flush(struct http_conn *c)
{
    struct wbuf *b = c->pend;
    if (!b)
        return 0;
    c->pend = NULL;
    c->srv->n_pend--;
    return conn_submit(c, b);
}

/* a write after the pending chunks, in order */
static int conn_write(struct http_conn *c, struct wbuf *b)
{
    if (conn_flush(c) < 0) {
        free(b);
        return RKV_ECLOSED;
    }
    return conn_submit(c, b);
}

static void flush_cb(uv_prepare_t *h)
{
    struct http_server *s = h->data;
    for (struct http_conn *c = s->conns, *nx; c && s->n_pend; c = nx) {
        nx = c->next; /* a failed write closes c, which stays listed until its handles close */
        conn_flush(c);
    }
    uv_prepare_stop(h);
}

/* room for n more bytes at the end of c's pending chunks (a new buffer once the old is full,
 * which goes to the socket now); NULL when out of memory (the connection is closed then) */
static struct wbuf *conn_pend(struct http_conn *c, size_t n)
{
    if (c->pend && c->pend->cap - c->pend->len >= n)
        return c->pend;
    if (conn_flush(c) < 0)
        return NULL;
    struct wbuf *b = wbuf_create(c, n > 4096 ? n : 4096);
    if (!b) {
        conn_close(c);
        return NULL;
    }
    c->pend = b;
    if (c->srv->n_pend++ == 0)
        uv_prepare_start(&c->srv->flush, flush_cb);
    return b;
}

/* errors the server answers itself, in the OpenAI error shape every rkv
 * endpoint uses */
static void conn_send_error(struct http_conn *c, int status, const char *text)
{
    char body[512];
    int blen = snprintf(body, sizeof(body),
                        "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\","
                        "\"param\":null,\"code\":null}}",
                        text);
    struct wbuf *b = wbuf_create(c, 1024);
    if (!b) {
        conn_close(c);
        return;
    }
    b->len = (size_t)snprintf(b->data, 1024,
                              "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                              "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                              status, http_status_text(status), blen, body);
    if (conn_write(c, b) == 0)
        conn_drain(c);
}

/* --- reading ------------------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct http_conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void on_msg(void *arg, struct http_msg *msg)
{
    struct http_conn *c = arg;
    struct http_server *s = c->srv;
    if (c->no_more || c->draining || c->closing) {
        http_msg_destroy(msg);
        return;
    }
    struct http_req *r = calloc(1, sizeof(*r));
    if (!r) {
        http_msg_destroy(msg);
        c->err_status = 500;
        c->err_text = "out of memory";
        return;
    }
    s->n_reqs++;
    s->stats.requests++;
    r->srv = s;
    r->conn = c;
    r->msg = msg;
    memcpy(r->peer, c->peer, sizeof(r->peer));
    r->t_start = uv_now(s->loop);
    r->chunked = msg->http_major > 1 || (msg->http_major == 1 && msg->http_minor >= 1);
    if (!msg->keep_alive || msg->upgrade) {
        r->last = 1;
        c->no_more = 1;
    }
    if (c->qtail)
        c->qtail->next = r;
    else
        c->qhead = r;
    c->qtail = r;
    c->n_queued++;
    if (c->n_queued >= s->lim.max_pipelined && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

static void on_head(void *arg, const struct http_msg *msg)
{
    struct http_conn *c = arg;
    /* answer "100 Continue" only when this request is next in line, so the
     * interim response cannot land inside an earlier response */
    if (!msg->expect_continue || c->active || c->qhead || c->draining || c->closing)
        return;
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    struct wbuf *b = wbuf_create(c, sizeof(cont));
    if (!b)
        return;
    memcpy(b->data, cont, sizeof(cont) - 1);
    b->len = sizeof(cont) - 1;
    conn_write(c, b);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct http_conn *c = st->data;
    if (nread < 0) {
        /* EOF or reset: whatever is in flight is cancelled */
        conn_close(c);
        return;
    }
    if (nread == 0 || c->draining || c->closing || c->rejected)
        return;
    if (c->reader.state != HTTP_READER_DONE && !c->err_status) {
        int rc = http_reader_feed(&c->reader, buf->base, (size_t)nread);
        /* bytes after a "Connection: close" request are not an error */
        if (rc < 0 && !c->no_more) {
            c->err_status = c->reader.err_status;
            c->srv->stats.bad_requests++;
            c->err_text = c->reader.err_text;
            log_debug("http: %s: %d %s", c->peer, c->err_status, c->err_text);
        }
    }
    conn_pump(c);
}

static void conn_resume(struct http_conn *c)
{
    if (c->reading || c->closing)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = 1;
}

/* --- timers ------------------------------------------------------------------- */

static void on_timer(uv_timer_t *t)
{
    struct http_conn *c = t->data;
    enum conn_timer kind = c->tkind;
    c->tkind = TIMER_NONE;
    switch (kind) {
    case TIMER_HEADERS:
    case TIMER_BODY:
        c->srv->stats.timeouts++;
        /* slow client: answer 408 unless something else is in flight */
        c->reader.state = HTTP_READER_DONE;
        c->err_status = 408;
        c->err_text = kind == TIMER_HEADERS ? "request headers not received in time"
                                            : "request body not received in time";
        conn_pump(c);
        break;
    case TIMER_IDLE:
    case TIMER_LINGER: conn_close(c); break;
    case TIMER_NONE: break;
    }
}

static void conn_update_timer(struct http_conn *c)
{
    if (c->closing)
        return;
    const struct http_limits *l = &c->srv->lim;
    enum conn_timer want;
    uint64_t ms = 0;
    if (c->draining) {
        want = TIMER_LINGER;
        ms = l->linger_ms;
    } else if (c->active || c->qhead) {
        /* a response is being produced: generation may take minutes */
        want = TIMER_NONE;
    } else if (c->reader.state == HTTP_READER_HEADERS) {
        want = TIMER_HEADERS;
        ms = l->header_timeout_ms;
    } else if (c->reader.state == HTTP_READER_BODY) {
        want = TIMER_BODY;
        ms = l->body_timeout_ms;
    } else {
        want = TIMER_IDLE;
        ms = l->idle_timeout_ms;
    }
    if (want == c->tkind)
        return;
    c->tkind = want;
    if (want == TIMER_NONE)
        uv_timer_stop(&c->timer);
    else
        uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* --- the request queue --------------------------------------------------------- */

/* hands the next request to the handler when none is active; answers a
 * pending error or closes once the queue is empty */
static void conn_pump(struct http_conn *c)
{
    struct http_server *s = c->srv;
    if (c->pumping)
        return;
    c->pumping = 1;
    while (!c->closing && !c->draining && !c->active) {
        if (c->qhead && !s->shutting_down) {
            struct http_req *r = c->qhead;
            c->qhead = r->next;
            if (!c->qhead)
                c->qtail = NULL;
            c->n_queued--;
            r->next = NULL;
            c->active = r;
            if (!c->reading && c->n_queued < s->lim.max_pipelined && !c->no_more)
                conn_resume(c);
            s->on_request(r, s->arg);
        } else if (c->err_status) {
            conn_send_error(c, c->err_status, c->err_text ? c->err_text : "bad request");
        } else if (c->no_more || s->shutting_down) {
            conn_drain(c);
        } else {
            break;
        }
    }
    c->pumping = 0;
    conn_update_timer(c);
}

/* --- accepting ----------------------------------------------------------------- */

static void peer_name(uv_tcp_t *t, char *out, size_t n)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(t, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, ip, sizeof(ip));
            port = ntohs(a->sin6_port);
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            uv_ip4_name(a, ip, sizeof(ip));
            port = ntohs(a->sin_port);
        }
    }
    snprintf(out, n, "%s:%d", ip, port);
}

static void on_connection(uv_stream_t *ls, int status)
{
    struct http_server *s = ls->data;
    if (status < 0) {
        log_warn("http: accept failed: %s", uv_strerror(status));
        return;
    }
    struct http_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        log_error("http: out of memory accepting a connection");
        return;
    }
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    c->tkind = TIMER_NONE;
    struct http_reader_limits rl = {s->lim.max_header_bytes, s->lim.max_body_bytes};
    http_reader_init(&c->reader, &rl, on_msg, on_head, c);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_handles++;
    c->rejected = s->n_conns >= s->lim.max_connections;
    if (!c->rejected)
        s->n_conns++;
    else
        s->stats.rejected++;
    s->stats.connections++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    /* tokens go out as soon as they exist; a peer that vanished without a
     * FIN during a long non-stream generation is found by keepalive probes */
    uv_tcp_nodelay(&c->tcp, 1);
    uv_tcp_keepalive(&c->tcp, 1, 60);
    peer_name(&c->tcp, c->peer, sizeof(c->peer));
    conn_resume(c);
    if (c->rejected) {
        log_ratelimited(RKV_LOG_WARN, 10000, 3,
                        "http: refusing %s: %u connections open (limit max_connections)", c->peer,
                        s->n_conns);
        conn_send_error(c, 503, "too many connections; retry later or raise max_connections");
        return;
    }
    conn_update_timer(c);
}

static void listener_closed(uv_handle_t *h)
{
    struct http_server *s = h->data;
    s->listener_open = 0;
    server_check_done(s);
}

static void deadline_closed(uv_handle_t *h)
{
    struct http_server *s = h->data;
    s->deadline_open = 0;
    server_check_done(s);
}

static void flush_closed(uv_handle_t *h)
{
    struct http_server *s = h->data;
    s->flush_open = 0;
    server_check_done(s);
}

static void start_failed_closed(uv_handle_t *h)
{
    free(h->data);
}

int http_server_start(uv_loop_t *loop, const struct http_server_config *cfg,
                      struct http_server **out)
{
    struct sockaddr_storage ss;
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    if (uv_ip6_addr(host, cfg->port, (struct sockaddr_in6 *)&ss) != 0 &&
        uv_ip4_addr(host, cfg->port, (struct sockaddr_in *)&ss) != 0) {
        log_error("listen: '%s' is not an IP address; use e.g. 127.0.0.1, 0.0.0.0 or ::", host);
        return RKV_EINVAL;
    }
    if (cfg->port < 0 || cfg->port > 65535 || !cfg->on_request)
        return RKV_EINVAL;
    struct http_server *s = calloc(1, sizeof(*s));
    if (!s)
        return RKV_ENOMEM;
    s->loop = loop;
    s->lim = cfg->limits;
    if (!s->lim.max_header_bytes)
        http_limits_default(&s->lim);
    if (!s->lim.max_pipelined)
        s->lim.max_pipelined = 1;
    s->on_request = cfg->on_request;
    s->arg = cfg->arg;
    /* a client that disconnects mid-write must not kill the daemon */
    signal(SIGPIPE, SIG_IGN);
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    int rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc < 0) {
        log_error("listen: cannot listen on %s port %d: %s; pick another --listen address", host,
                  cfg->port, uv_strerror(rc));
        /* the handle closes on the next loop turn, which frees s */
        uv_close((uv_handle_t *)&s->listener, start_failed_closed);
        return rc;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    s->listener_open = 1;
    uv_timer_init(loop, &s->deadline);
    s->deadline.data = s;
    s->deadline_open = 1;
    uv_prepare_init(loop, &s->flush);
    s->flush.data = s;
    s->flush_open = 1;
    *out = s;
    return 0;
}

int http_server_port(const struct http_server *srv)
{
    return srv->port;
}
unsigned http_server_connections(const struct http_server *srv)
{
    return srv->n_conns;
}
void http_server_get_stats(const struct http_server *srv, struct http_stats *out)
{
    *out = srv->stats;
    out->open_connections = srv->n_conns;
    out->open_requests = srv->n_reqs;
}

unsigned http_server_requests(const struct http_server *srv)
{
    return srv->n_reqs;
}

static void on_deadline(uv_timer_t *t)
{
    struct http_server *s = t->data;
    for (struct http_conn *c = s->conns; c; c = c->next)
        conn_close(c);
    server_check_done(s);
}

void http_server_shutdown(struct http_server *srv, uint64_t deadline_ms, http_shutdown_cb done,
                          void *arg)
{
    if (srv->shutting_down)
        return;
    srv->shutting_down = 1;
    srv->done = done;
    srv->done_arg = arg;
    uv_close((uv_handle_t *)&srv->listener, listener_closed);
    uv_timer_start(&srv->deadline, on_deadline, deadline_ms, 0);
    for (struct http_conn *c = srv->conns; c; c = c->next) {
        if (c->closing || c->draining)
            continue;
        if (!c->active)
            conn_close(c);
    }
}

/* --- requests ------------------------------------------------------------------- */

const char *http_req_method(const struct http_req *req)
{
    return req->msg->method;
}
const char *http_req_path(const struct http_req *req)
{
    return req->msg->path;
}
const char *http_req_query(const struct http_req *req)
{
    return req->msg->query;
}
const char *http_req_peer(const struct http_req *req)
{
    return req->peer;
}
int http_req_closed(const struct http_req *req)
{
    return req->closed;
}

const char *http_req_header(const struct http_req *req, const char *name)
{
    return http_msg_header(req->msg, name);
}

size_t http_req_header_count(const struct http_req *req)
{
    return req->msg->n_headers;
}

void http_req_header_at(const struct http_req *req, size_t i, const char **name, const char **value)
{
    *name = req->msg->headers[i].name;
    *value = req->msg->headers[i].value;
}

const char *http_req_body(const struct http_req *req, size_t *len)
{
    if (len)
        *len = req->msg->body_len;
    return req->msg->body;
}

void http_req_set_callbacks(struct http_req *req, http_close_cb on_close, http_drain_cb on_drain,
                            void *arg)
{
    req->on_close = on_close;
    req->on_drain = on_drain;
    req->cb_arg = arg;
}

/* the handler is done with req: free it and move the connection on */
static void req_finish(struct http_req *r)
{
    struct http_conn *c = r->conn;
    struct http_server *s = r->srv;
    log_debug("http: %s %s %s %d%s %" PRIu64 " ms", r->peer, r->msg->method, r->msg->path,
              r->status, r->closed ? " (client gone)" : "", uv_now(s->loop) - r->t_start);
    if (c && c->active == r)
        c->active = NULL;
    /* an answer that said "Connection: close" (an HTTP/1.0 stream ends when the connection
     * does) is the connection's last: requests pipelined behind it are not answered */
    int last = r->last && r->status;
    req_destroy(r);
    if (c && last && !c->active)
        conn_free_queue(c);
    if (c)
        conn_pump(c);
    else
        server_check_done(s);
}

static int header_ok(const char *s)
{
    for (; *s; s++)
        if (*s == '\r' || *s == '\n')
            return 0;
    return 1;
}

int http_resp_header(struct http_req *req, const char *name, const char *value)
{
    if (req->started)
        return RKV_ESTATE;
    if (!header_ok(name) || !header_ok(value) || !*name)
        return RKV_EINVAL;
    size_t add = strlen(name) + strlen(value) + 4;
    char *n = realloc(req->extra, req->extra_len + add + 1);
    if (!n)
        return RKV_ENOMEM;
    req->extra = n;
    req->extra_len += (size_t)snprintf(n + req->extra_len, add + 1, "%s: %s\r\n", name, value);
    return 0;
}

/* status line and headers; body_len < 0 means chunked (or close-delimited) */
static struct wbuf *resp_head(struct http_req *r, int status, const char *ctype, long long body_len,
                              size_t extra_cap)
{
    struct http_conn *c = r->conn;
    if (c->srv->shutting_down || c->err_status)
        r->last = 1;
    if (body_len < 0 && !r->chunked)
        r->last = 1; /* HTTP/1.0: the body ends when we close */
    if (r->last)
        c->no_more = 1; /* "Connection: close" below: the connection closes after this answer */
    r->status = status;
    size_t cap = 512 + r->extra_len + (ctype ? strlen(ctype) : 0) + extra_cap;
    struct wbuf *b = wbuf_create(c, cap);
    if (!b)
        return NULL;
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
    int n = snprintf(b->data, cap, "HTTP/1.1 %d %s\r\nServer: rkv\r\nDate: %s\r\n", status,
                     http_status_text(status), date);
    if (ctype)
        n += snprintf(b->data + n, cap - (size_t)n, "Content-Type: %s\r\n", ctype);
    if (ctype && strncasecmp(ctype, "text/event-stream", 17) == 0)
        n += snprintf(b->data + n, cap - (size_t)n,
                      "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n");
    if (status == 204 || status == 304)
        ; /* no body and no Content-Length (RFC 9110 8.6) */
    else if (body_len >= 0)
        n += snprintf(b->data + n, cap - (size_t)n, "Content-Length: %lld\r\n", body_len);
    else if (r->chunked)
        n += snprintf(b->data + n, cap - (size_t)n, "Transfer-Encoding: chunked\r\n");
    if (r->extra_len) {
        memcpy(b->data + n, r->extra, r->extra_len);
        n += (int)r->extra_len;
    }
    n += snprintf(b->data + n, cap - (size_t)n, "Connection: %s\r\n\r\n",
                  r->last ? "close" : "keep-alive");
    b->len = (size_t)n;
    return b;
}

int http_respond(struct http_req *req, int status, const char *content_type, const char *body,
                 size_t len)
{
    if (req->started)
        return RKV_ESTATE;
    req->started = 1;
    req->finishing = 1;
    struct http_conn *c = req->conn;
    int rc = c ? 0 : RKV_ECLOSED;
    if (c) {
        int head_only = strcmp(req->msg->method, "HEAD") == 0 || status == 204 || status == 304;
        struct wbuf *b = resp_head(req, status, content_type, (long long)len, head_only ? 0 : len);
        if (!b) {
            conn_close(c);
            rc = RKV_ENOMEM;
        } else {
            if (!head_only && len) {
                memcpy(b->data + b->len, body, len);
                b->len += len;
            }
            rc = conn_write(c, b);
        }
    }
    req_finish(req);
    return rc;
}

int http_resp_start(struct http_req *req, int status, const char *content_type)
{
    if (req->started)
        return RKV_ESTATE;
    req->started = 1;
    struct http_conn *c = req->conn;
    if (!c)
        return RKV_ECLOSED;
    struct wbuf *b = resp_head(req, status, content_type, -1, 0);
    if (!b) {
        conn_close(c);
        return RKV_ENOMEM;
    }
    return conn_write(c, b);
}

int http_resp_write(struct http_req *req, const void *data, size_t len)
{
    if (!req->started)
        return RKV_ESTATE;
    struct http_conn *c = req->conn;
    if (!c)
        return RKV_ECLOSED;
    if (len == 0)
        return 0; /* an empty chunk would end the body */
    if (strcmp(req->msg->method, "HEAD") == 0)
        return 0;
    /* onto the pending chunks: the socket gets them when the loop is about to wait */
    struct wbuf *b = conn_pend(c, len + 24);
    if (!b)
        return c->closing ? RKV_ECLOSED : RKV_ENOMEM;
    if (req->chunked)
        b->len += (size_t)snprintf(b->data + b->len, 24, "%zx\r\n", len);
    memcpy(b->data + b->len, data, len);
    b->len += len;
    if (req->chunked) {
        memcpy(b->data + b->len, "\r\n", 2);
        b->len += 2;
    }
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + b->len >
        c->srv->lim.write_high_water) {
        req->want_drain = 1;
        return 1;
    }
    return 0;
}

int http_resp_end(struct http_req *req)
{
    if (!req->started)
        return RKV_ESTATE;
    req->finishing = 1;
    struct http_conn *c = req->conn;
    int rc = c ? 0 : RKV_ECLOSED;
    if (c && req->chunked && strcmp(req->msg->method, "HEAD") != 0) {
        /* the last chunk goes with the pending ones */
        struct wbuf *b = conn_pend(c, 5);
        if (b) {
            memcpy(b->data + b->len, "0\r\n\r\n", 5);
            b->len += 5;
        } else {
            rc = c->closing ? RKV_ECLOSED : RKV_ENOMEM;
        }
    }
    req_finish(req);
    return rc;
}

const char *http_req_bearer(const struct http_req *req)
{
    const char *h = http_req_header(req, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return *h ? h : NULL;
}
