/* server.h - HTTP/1.1 server on one libuv loop: keep-alive, pipelining, chunked and SSE responses.
 */
#ifndef RKV_HTTP_SERVER_H
#define RKV_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct http_server;
struct http_req;

struct http_limits {
    size_t max_header_bytes;    /* request line + headers (8 KiB) -> 431 */
    size_t max_body_bytes;      /* decoded request body (4 MiB) -> 413 */
    unsigned max_connections;   /* open client connections (1024); more -> 503 and close */
    uint64_t header_timeout_ms; /* first byte to end of headers (10 s) -> 408 and close */
    uint64_t body_timeout_ms;   /* end of headers to end of body (30 s) -> 408 and close */
    uint64_t idle_timeout_ms;   /* keep-alive wait for the next request (60 s) -> close */
    uint64_t linger_ms;         /* after our last byte, wait this long for the client's EOF (2 s) */
    size_t
        write_high_water; /* queued response bytes above which writes report backpressure (1 MiB) */
    unsigned max_pipelined; /* parsed requests waiting their turn before reading pauses (32) */
};

/* the defaults in the comments above */
void http_limits_default(struct http_limits *l);

/* a request is complete (body included). the handler answers now or later
 * with http_respond() or http_resp_start()/write()/end(); every request
 * handed to it must be finished exactly once, even after its client left. */
typedef void (*http_request_cb)(struct http_req *req, void *arg);

struct http_server_config {
    const char *host; /* "127.0.0.1", "::", "0.0.0.0", "::1" */
    int port;         /* 0 picks a free port (see http_server_port) */
    struct http_limits limits;
    http_request_cb on_request;
    void *arg;
};

/* binds and listens; logs and returns a negative code (e.g. UV_EADDRINUSE)
 * naming host:port when it cannot (its handle then closes on the next loop
 * turn: run the loop once before uv_loop_close). The process ignores
 * SIGPIPE from here on, so a client that leaves mid-write cannot kill it. */
int http_server_start(uv_loop_t *loop, const struct http_server_config *cfg,
                      struct http_server **out);
/* the bound port */
int http_server_port(const struct http_server *srv);
/* open client connections, and requests handed to the handler not yet finished */
unsigned http_server_connections(const struct http_server *srv);
unsigned http_server_requests(const struct http_server *srv);

/* counters since start, for /metrics */
struct http_stats {
    uint64_t connections;  /* accepted */
    uint64_t rejected;     /* over max_connections (503) */
    uint64_t requests;     /* parsed completely */
    uint64_t bad_requests; /* malformed or over a size limit (400, 413, 431, ...) */
    uint64_t timeouts;     /* slow headers or body (408) */
    uint64_t bytes_out;    /* response bytes queued */
    /* writes handed to the sockets: the body chunks of one response written while the loop
     * runs its callbacks go out together, when it is about to wait */
    uint64_t writes;
    unsigned open_connections;
    unsigned open_requests;
};
void http_server_get_stats(const struct http_server *srv, struct http_stats *out);

typedef void (*http_shutdown_cb)(void *arg);
/* stops accepting, closes idle connections, lets responses in flight finish
 * for up to deadline_ms, then closes the rest (their requests see on_close).
 * done runs once every handle is closed and every request finished; the
 * server is freed right after done returns. */
void http_server_shutdown(struct http_server *srv, uint64_t deadline_ms, http_shutdown_cb done,
                          void *arg);

/* --- the request ---------------------------------------------------------- */
const char *http_req_method(const struct http_req *req);
const char *http_req_path(const struct http_req *req);  /* "/v1/models" */
const char *http_req_query(const struct http_req *req); /* "a=1&b=2", "" when none */
/* case-insensitive; NULL when absent */
const char *http_req_header(const struct http_req *req, const char *name);
size_t http_req_header_count(const struct http_req *req);
void http_req_header_at(const struct http_req *req, size_t i, const char **name,
                        const char **value);
/* the body, NUL-terminated (len excludes the NUL) */
const char *http_req_body(const struct http_req *req, size_t *len);
/* the credential of "Authorization: Bearer <key>", NULL when absent */
const char *http_req_bearer(const struct http_req *req);
/* the peer as "ip:port" */
const char *http_req_peer(const struct http_req *req);

/* the client went away before the response ended (disconnect, error,
 * shutdown deadline): cancel work; the request must still be finished */
typedef void (*http_close_cb)(struct http_req *req, void *arg);
/* the queued response bytes fell back below half the high-water mark */
typedef void (*http_drain_cb)(struct http_req *req, void *arg);
void http_req_set_callbacks(struct http_req *req, http_close_cb on_close, http_drain_cb on_drain,
                            void *arg);
/* 1 once the client is gone */
int http_req_closed(const struct http_req *req);

/* --- the response ------------------------------------------------------------ */
/* extra header for the response; before respond/start. "Content-Length",
 * "Transfer-Encoding" and "Connection" are the server's. */
int http_resp_header(struct http_req *req, const char *name, const char *value);
/* a whole response with Content-Length; finishes the request */
int http_respond(struct http_req *req, int status, const char *content_type, const char *body,
                 size_t len);
/* starts a chunked response; "text/event-stream" also sends
 * Cache-Control: no-cache and X-Accel-Buffering: no (SSE) */
int http_resp_start(struct http_req *req, int status, const char *content_type);
/* sends one chunk. 0: sent; 1: sent, but the queue is above the high-water
 * mark (pause until on_drain); RKV_ECLOSED: the client is gone */
int http_resp_write(struct http_req *req, const void *data, size_t len);
/* sends the last chunk and finishes the request */
int http_resp_end(struct http_req *req);

/* "Not Found" for 404 ... */
const char *http_status_text(int status);

#endif
