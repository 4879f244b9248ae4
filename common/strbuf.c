/* strbuf.c - a growing NUL-terminated text buffer (strbuf.h). */
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

void strbuf_fini(struct strbuf *b)
{
    free(b->s);
    *b = (struct strbuf){0};
}

void strbuf_reset(struct strbuf *b)
{
    b->n = 0;
    if (b->s)
        b->s[0] = 0;
}

/* room for need more bytes and the NUL */
static int strbuf_room(struct strbuf *b, size_t need)
{
    if (b->err)
        return b->err;
    if (need > SIZE_MAX - b->n - 1 || rkv_grow((void **)&b->s, &b->cap, b->n + need + 1, 256)) {
        b->err = RKV_ENOMEM;
        return b->err;
    }
    return 0;
}

int strbuf_add(struct strbuf *b, const void *p, size_t n)
{
    if (strbuf_room(b, n))
        return b->err;
    if (n)
        memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

int strbuf_puts(struct strbuf *b, const char *s)
{
    return strbuf_add(b, s, strlen(s));
}

int strbuf_printf(struct strbuf *b, const char *fmt, ...)
{
    if (strbuf_room(b, 0))
        return b->err;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->s[b->n] = 0;
        b->err = RKV_EINVAL;
        return b->err;
    }
    if ((size_t)n >= b->cap - b->n) { /* it did not fit: grow and write it again */
        if (strbuf_room(b, (size_t)n))
            return b->err;
        va_start(ap, fmt);
        vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
    }
    b->n += (size_t)n;
    return 0;
}

int strbuf_append(struct strbuf *b, const struct strbuf *src)
{
    strbuf_add(b, src->s, src->n);
    if (src->err && !b->err)
        b->err = src->err;
    return b->err;
}

const char *strbuf_str(const struct strbuf *b)
{
    return b->s ? b->s : "";
}

int strbuf_take(struct strbuf *b, char **out, size_t *len)
{
    strbuf_add(b, "", 0);
    const int rc = b->err;
    if (rc == 0) {
        *out = b->s;
        if (len)
            *len = b->n;
        b->s = NULL;
    }
    strbuf_fini(b);
    return rc;
}
