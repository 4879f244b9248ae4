/* reader.c - incremental HTTP/1.1 request reader: libhttp-parser callbacks into http_msg. */
#include "daemon/http/reader.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "common/util.h"

const char *http_msg_header(const struct http_msg *m, const char *name)
{
    for (size_t i = 0; i < m->n_headers; i++)
        if (strcasecmp(m->headers[i].name, name) == 0)
            return m->headers[i].value;
    return NULL;
}

void http_msg_destroy(struct http_msg *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_headers; i++) {
        free(m->headers[i].name);
        free(m->headers[i].value);
    }
    free(m->headers);
    free(m->url);
    free(m->path);
    free(m->query);
    free(m->body);
    free(m);
}

static struct http_reader *reader_of(http_parser *p)
{
    return p->data;
}

/* stops the parser with an HTTP status to answer */
static int reader_fail(struct http_reader *r, int status, const char *text)
{
    r->err_status = status;
    r->err_text = text;
    return -1;
}

/* appends len bytes to a NUL-terminated heap string */
static int str_append(char **s, const char *at, size_t len)
{
    size_t old = *s ? strlen(*s) : 0;
    char *n = realloc(*s, old + len + 1);
    if (!n)
        return RKV_ENOMEM;
    memcpy(n + old, at, len);
    n[old + len] = '\0';
    *s = n;
    return 0;
}

/* header bytes count against the limit as they arrive, so a client cannot
 * make us buffer more than max_header_bytes before we refuse it */
static int count_header_bytes(struct http_reader *r, size_t len)
{
    r->header_bytes += len;
    if (r->header_bytes > r->limits.max_header_bytes)
        return reader_fail(r, 431, "request headers are too large");
    return 0;
}

static int on_message_begin(http_parser *p)
{
    struct http_reader *r = reader_of(p);
    http_msg_destroy(r->cur);
    r->cur = calloc(1, sizeof(*r->cur));
    if (!r->cur)
        return reader_fail(r, 500, "out of memory");
    r->header_bytes = 0;
    r->hdr_cap = 0;
    r->body_cap = 0;
    r->in_value = 0;
    r->state = HTTP_READER_HEADERS;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    struct http_reader *r = reader_of(p);
    if (count_header_bytes(r, len))
        return -1;
    if (str_append(&r->cur->url, at, len))
        return reader_fail(r, 500, "out of memory");
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct http_reader *r = reader_of(p);
    struct http_msg *m = r->cur;
    if (count_header_bytes(r, len))
        return -1;
    if (m->n_headers == 0 || r->in_value) {
        /* a new header starts */
        if (m->n_headers == r->hdr_cap) {
            size_t cap = r->hdr_cap ? r->hdr_cap * 2 : 8;
            struct http_header *h = realloc(m->headers, cap * sizeof(*h));
            if (!h)
                return reader_fail(r, 500, "out of memory");
            m->headers = h;
            r->hdr_cap = cap;
        }
        m->headers[m->n_headers].name = NULL;
        m->headers[m->n_headers].value = NULL;
        m->n_headers++;
        r->in_value = 0;
    }
    if (str_append(&m->headers[m->n_headers - 1].name, at, len))
        return reader_fail(r, 500, "out of memory");
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct http_reader *r = reader_of(p);
    struct http_msg *m = r->cur;
    if (count_header_bytes(r, len))
        return -1;
    if (m->n_headers == 0)
        return reader_fail(r, 400, "header value without a name");
    r->in_value = 1;
    if (str_append(&m->headers[m->n_headers - 1].value, at, len))
        return reader_fail(r, 500, "out of memory");
    return 0;
}

/* splits the request target into path and query (origin or absolute form) */
static int split_url(struct http_msg *m)
{
    const char *u = m->url ? m->url : "";
    const char *scheme = strstr(u, "://");
    if (u[0] != '/' && scheme) {
        const char *slash = strchr(scheme + 3, '/');
        u = slash ? slash : "/";
    }
    size_t plen = strcspn(u, "?#");
    m->path = strndup(u, plen);
    const char *q = u[plen] == '?' ? u + plen + 1 : "";
    m->query = strndup(q, strcspn(q, "#"));
    return m->path && m->query ? 0 : RKV_ENOMEM;
}

static int on_headers_complete(http_parser *p)
{
    struct http_reader *r = reader_of(p);
    struct http_msg *m = r->cur;
    if (!m->url && str_append(&m->url, "", 0))
        return reader_fail(r, 500, "out of memory");
    for (size_t i = 0; i < m->n_headers; i++) {
        struct http_header *h = &m->headers[i];
        if (!h->value && str_append(&h->value, "", 0))
            return reader_fail(r, 500, "out of memory");
        size_t n = strlen(h->value);
        while (n > 0 && (h->value[n - 1] == ' ' || h->value[n - 1] == '\t'))
            h->value[--n] = '\0';
    }
    if (split_url(m))
        return reader_fail(r, 500, "out of memory");
    const char *method = http_method_str((enum http_method)p->method);
    strncpy(m->method, method, sizeof(m->method) - 1);
    m->http_major = p->http_major;
    m->http_minor = p->http_minor;
    m->keep_alive = http_should_keep_alive(p);
    const char *expect = http_msg_header(m, "Expect");
    m->expect_continue = expect && strcasecmp(expect, "100-continue") == 0;
    /* refuse a declared body over the limit before reading any of it */
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
        p->content_length > r->limits.max_body_bytes)
        return reader_fail(r, 413, "request body is too large");
    r->state = HTTP_READER_BODY;
    if (r->on_head)
        r->on_head(r->arg, m);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct http_reader *r = reader_of(p);
    struct http_msg *m = r->cur;
    if (len > r->limits.max_body_bytes - m->body_len)
        return reader_fail(r, 413, "request body is too large");
    /* grow by doubling; the NUL after the body is always kept */
    if (rkv_grow((void **)&m->body, &r->body_cap, m->body_len + len + 1, 256) < 0)
        return reader_fail(r, 500, "out of memory");
    memcpy(m->body + m->body_len, at, len);
    m->body_len += len;
    m->body[m->body_len] = '\0';
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct http_reader *r = reader_of(p);
    struct http_msg *m = r->cur;
    if (!m->body) {
        m->body = calloc(1, 1);
        if (!m->body)
            return reader_fail(r, 500, "out of memory");
    }
    m->keep_alive = http_should_keep_alive(p);
    m->upgrade = p->upgrade;
    r->cur = NULL;
    r->state = HTTP_READER_IDLE;
    r->on_msg(r->arg, m);
    return 0;
}

static const http_parser_settings reader_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void http_reader_init(struct http_reader *r, const struct http_reader_limits *limits,
                      http_reader_msg_cb on_msg, http_reader_head_cb on_head, void *arg)
{
    memset(r, 0, sizeof(*r));
    http_parser_init(&r->parser, HTTP_REQUEST);
    r->parser.data = r;
    r->limits = *limits;
    r->on_msg = on_msg;
    r->on_head = on_head;
    r->arg = arg;
    r->state = HTTP_READER_IDLE;
}

void http_reader_fini(struct http_reader *r)
{
    http_msg_destroy(r->cur);
    r->cur = NULL;
}

/* after a parser error: which status to answer */
static int reader_error(struct http_reader *r)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);
    r->state = HTTP_READER_DONE;
    if (!r->err_status) {
        if (e == HPE_HEADER_OVERFLOW) {
            r->err_status = 431;
            r->err_text = "request headers are too large";
        } else if (e == HPE_INVALID_VERSION) {
            r->err_status = 505;
            r->err_text = "HTTP version not supported; use HTTP/1.1";
        } else {
            r->err_status = 400;
            r->err_text = http_errno_description(e);
        }
    }
    return r->err_status == 413 || r->err_status == 431 ? RKV_ETOOBIG : RKV_EPROTO;
}

int http_reader_feed(struct http_reader *r, const char *data, size_t len)
{
    if (r->state == HTTP_READER_DONE)
        return r->err_status ? RKV_EPROTO : 0;
    if (len == 0)
        return 0;
    size_t n = http_parser_execute(&r->parser, &reader_settings, data, len);
    if (HTTP_PARSER_ERRNO(&r->parser) != HPE_OK)
        return reader_error(r);
    if (r->parser.upgrade) {
        /* we do not switch protocols: answer the request, then close */
        r->state = HTTP_READER_DONE;
        return 0;
    }
    if (n != len)
        return reader_error(r);
    return 0;
}

int http_reader_eof(struct http_reader *r)
{
    if (r->state == HTTP_READER_DONE)
        return 0;
    http_parser_execute(&r->parser, &reader_settings, NULL, 0);
    if (HTTP_PARSER_ERRNO(&r->parser) != HPE_OK)
        return reader_error(r);
    if (r->state != HTTP_READER_IDLE) {
        r->state = HTTP_READER_DONE;
        r->err_status = 400;
        r->err_text = "connection closed in the middle of a request";
        return RKV_EPROTO;
    }
    r->state = HTTP_READER_DONE;
    return 0;
}
