/* fuzz_http.c - arbitrary bytes through the server's request reader (libhttp-parser), split two
 * ways. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http/reader.h"

static volatile size_t sink;

struct tally {
    size_t msgs;
    size_t body_bytes;
    size_t headers;
};

static void on_msg(void *arg, struct http_msg *m)
{
    struct tally *t = arg;
    t->msgs++;
    t->body_bytes += m->body_len;
    t->headers += m->n_headers;
    /* every field the server reads */
    sink += strlen(m->method) + strlen(m->url) + strlen(m->path) + strlen(m->query);
    for (size_t i = 0; i < m->n_headers; i++)
        sink += strlen(m->headers[i].name) + strlen(m->headers[i].value);
    if (m->body_len)
        sink += (unsigned char)m->body[m->body_len - 1] + (unsigned char)m->body[m->body_len];
    const char *h = http_msg_header(m, "content-type");
    sink += h ? strlen(h) : 0;
    http_msg_destroy(m);
}

static void on_head(void *arg, const struct http_msg *m)
{
    sink += m->expect_continue;
}

/* feeds data in pieces of `step` bytes (0: all at once), as reads arrive */
static void run(const uint8_t *data, size_t size, size_t step, struct tally *t, int *status)
{
    struct http_reader_limits lim = {1024, 4096};
    struct http_reader r;
    http_reader_init(&r, &lim, on_msg, on_head, t);
    size_t off = 0;
    int rc = 0;
    while (off < size && rc == 0) {
        size_t n = step ? step : size;
        if (n > size - off)
            n = size - off;
        rc = http_reader_feed(&r, (const char *)data + off, n);
        off += n;
    }
    if (rc == 0)
        http_reader_eof(&r);
    *status = r.err_status;
    http_reader_fini(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tally a = {0}, b = {0};
    int sa, sb;
    run(data, size, 0, &a, &sa);
    /* how the bytes are split into reads must not change what is parsed;
     * which error a bad request gets may (libhttp-parser reports a field's
     * bytes when the field or the read ends, so the size limit and a bad
     * character later in the same field can come in either order) */
    size_t step = size ? 1 + data[0] % 7 : 1;
    run(data, size, step, &b, &sb);
    if (a.msgs != b.msgs || a.body_bytes != b.body_bytes || a.headers != b.headers || !sa != !sb)
        __builtin_trap();
    return 0;
}
