/* reader.h - incremental HTTP/1.1 request reader over libhttp-parser, no sockets. */
#ifndef RKV_HTTP_READER_H
#define RKV_HTTP_READER_H

#include <http_parser.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* one parsed request; the reader hands it over complete (body included) */
struct http_header {
    char *name;  /* as sent; compare case-insensitively */
    char *value; /* leading/trailing blanks removed */
};

struct http_msg {
    char method[16]; /* "GET", "POST", ... */
    char *url;       /* request target as sent: "/v1/models?x=1" */
    char *path;      /* target up to '?': "/v1/models" */
    char *query;     /* after '?', "" when none */
    struct http_header *headers;
    size_t n_headers;
    char *body; /* NUL-terminated for convenience; body_len excludes the NUL */
    size_t body_len;
    int http_major, http_minor;
    int keep_alive;      /* the client allows another request on this connection */
    int expect_continue; /* "Expect: 100-continue" was sent */
    int upgrade;         /* the client asked to switch protocols; nothing follows */
};

/* header value by case-insensitive name; NULL when absent */
const char *http_msg_header(const struct http_msg *m, const char *name);
void http_msg_destroy(struct http_msg *m);

struct http_reader_limits {
    size_t max_header_bytes; /* request line + header lines; over it -> 431 */
    size_t max_body_bytes;   /* decoded body; over it -> 413 */
};

/* where the reader is inside the byte stream (the server times each state) */
enum http_reader_state {
    HTTP_READER_IDLE,    /* between requests */
    HTTP_READER_HEADERS, /* inside a request line or headers */
    HTTP_READER_BODY,    /* headers done, body not yet complete */
    HTTP_READER_DONE,    /* an error or upgrade: no more requests on this stream */
};

/* called for each complete request, in order; takes ownership of msg */
typedef void (*http_reader_msg_cb)(void *arg, struct http_msg *msg);
/* called when a request's headers are complete (before its body): lets the
 * server answer "Expect: 100-continue" or refuse early */
typedef void (*http_reader_head_cb)(void *arg, const struct http_msg *msg);

struct http_reader {
    http_parser parser;
    struct http_reader_limits limits;
    http_reader_msg_cb on_msg;
    http_reader_head_cb on_head;
    void *arg;
    struct http_msg *cur; /* the request being read */
    size_t header_bytes;
    size_t hdr_cap;  /* headers allocated in cur */
    size_t body_cap; /* bytes allocated for cur's body */
    int in_value;    /* last header callback was a value */
    enum http_reader_state state;
    int err_status;       /* HTTP status to answer with after an error, 0 when none */
    const char *err_text; /* why, for the error body and the log */
};

void http_reader_init(struct http_reader *r, const struct http_reader_limits *limits,
                      http_reader_msg_cb on_msg, http_reader_head_cb on_head, void *arg);
void http_reader_fini(struct http_reader *r);

/* parses len bytes; calls on_msg for each complete request. returns 0, or
 * RKV_EPROTO/RKV_ETOOBIG/RKV_ENOMEM after which err_status/err_text say what
 * to answer and the reader accepts nothing more (state DONE). */
int http_reader_feed(struct http_reader *r, const char *data, size_t len);

/* the client closed its side: a request cut short is an error (400) */
int http_reader_eof(struct http_reader *r);

#endif
