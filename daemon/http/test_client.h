/* test_client.h - a blocking HTTP/1.1 test client (plain sockets, http_parser) for the daemon's
 * tests. */
#ifndef RKV_HTTP_TEST_CLIENT_H
#define RKV_HTTP_TEST_CLIENT_H

/* static functions: included by *_test.c files only, never by the daemon */
#include <arpa/inet.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

struct client {
    int fd;
    http_parser p;
    char buf[1 << 16];
    size_t off, len; /* unparsed bytes in buf */
};

struct resp {
    int status;
    int complete;
    char ctype[64];
    char te[64];
    char conn[32];
    char last_field[64];
    char *body;
    size_t body_len;
};

static inline int client_connect(struct client *c, int port, int ipv6)
{
    memset(c, 0, sizeof(*c));
    c->fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0)
        return -1;
    struct timeval tv = {20, 0}; /* a broken server fails the test instead of hanging it */
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int rc;
    if (ipv6) {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        inet_pton(AF_INET6, "::1", &a.sin6_addr);
        rc = connect(c->fd, (struct sockaddr *)&a, sizeof(a));
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        rc = connect(c->fd, (struct sockaddr *)&a, sizeof(a));
    }
    http_parser_init(&c->p, HTTP_RESPONSE);
    return rc;
}

static inline void client_send(struct client *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}
#define SEND(c, s) client_send((c), (s), strlen(s))

static inline int cb_field(http_parser *p, const char *at, size_t n)
{
    struct resp *r = p->data;
    snprintf(r->last_field, sizeof(r->last_field), "%.*s", (int)n, at);
    return 0;
}

static inline int cb_value(http_parser *p, const char *at, size_t n)
{
    struct resp *r = p->data;
    char *dst = NULL;
    size_t cap = 0;
    if (!strcasecmp(r->last_field, "Content-Type"))
        dst = r->ctype, cap = sizeof(r->ctype);
    else if (!strcasecmp(r->last_field, "Transfer-Encoding"))
        dst = r->te, cap = sizeof(r->te);
    else if (!strcasecmp(r->last_field, "Connection"))
        dst = r->conn, cap = sizeof(r->conn);
    if (dst)
        snprintf(dst, cap, "%.*s", (int)n, at);
    return 0;
}

static inline int cb_body(http_parser *p, const char *at, size_t n)
{
    struct resp *r = p->data;
    r->body = realloc(r->body, r->body_len + n + 1);
    memcpy(r->body + r->body_len, at, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}

static inline int cb_headers(http_parser *p)
{
    struct resp *r = p->data;
    r->status = (int)p->status_code;
    /* a 100 Continue interim response has no body */
    return r->status == 100 ? 1 : 0;
}

static inline int cb_complete(http_parser *p)
{
    struct resp *r = p->data;
    if (r->status == 100) {
        r->status = 0;
        return 0;
    }
    r->complete = 1;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings resp_settings = {
    .on_header_field = cb_field,
    .on_header_value = cb_value,
    .on_headers_complete = cb_headers,
    .on_body = cb_body,
    .on_message_complete = cb_complete,
};

/* reads one response; 0 when complete */
static inline int client_read(struct client *c, struct resp *r)
{
    memset(r, 0, sizeof(*r));
    r->body = calloc(1, 1);
    c->p.data = r;
    for (;;) {
        if (c->len > 0) {
            size_t n = http_parser_execute(&c->p, &resp_settings, c->buf + c->off, c->len);
            c->off += n;
            c->len -= n;
            if (HTTP_PARSER_ERRNO(&c->p) == HPE_PAUSED) {
                http_parser_pause(&c->p, 0);
                return 0;
            }
            if (HTTP_PARSER_ERRNO(&c->p) != HPE_OK)
                return -1;
        }
        if (c->off > 0) {
            memmove(c->buf, c->buf + c->off, c->len);
            c->off = 0;
        }
        ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
        if (n <= 0) {
            http_parser_execute(&c->p, &resp_settings, NULL, 0);
            return r->complete ? 0 : -1;
        }
        c->len += (size_t)n;
    }
}

/* 1 when the server closed the connection (EOF) */
static inline int client_eof(struct client *c)
{
    char b[256];
    if (c->len > 0)
        return 0;
    ssize_t n = recv(c->fd, b, sizeof(b), 0);
    return n == 0;
}

/* reads raw bytes until needle shows up; returns what was read */
static char *client_read_until(struct client *c, const char *needle)
{
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap + 1);
    while (!strstr(out, needle) && len < cap) {
        ssize_t n = recv(c->fd, out + len, cap - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        out[len] = '\0';
    }
    return out;
}

static inline void client_close(struct client *c)
{
    close(c->fd);
}

#endif
