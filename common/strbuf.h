/* strbuf.h - a growing NUL-terminated text buffer for renderers and builders: an append that
 * fails records the error and makes every later one do nothing, so a builder checks once at the
 * end. A struct strbuf starts zeroed (= {0}). */
#ifndef RKV_STRBUF_H
#define RKV_STRBUF_H

#include <stddef.h>

struct strbuf {
    char *s;    /* the text, NUL-terminated; NULL until the first append */
    size_t n;   /* its bytes, without the NUL */
    size_t cap; /* bytes allocated */
    int err;    /* 0, or the first failure (RKV_ENOMEM, RKV_EINVAL for a bad format) */
};

/* frees the text; b is empty again (its error cleared) */
void strbuf_fini(struct strbuf *b);
/* empties the text, keeping its allocation (and any error) */
void strbuf_reset(struct strbuf *b);
/* the appends return b's error: 0 while every append so far has worked */
/* n bytes (any bytes; n 0 still makes s a valid "") */
int strbuf_add(struct strbuf *b, const void *p, size_t n);
int strbuf_puts(struct strbuf *b, const char *s);
int strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* src's text, and its error when it has one */
int strbuf_append(struct strbuf *b, const struct strbuf *src);
/* the text, "" while nothing was appended */
const char *strbuf_str(const struct strbuf *b);
/* hands the text over (the caller frees it; "" when nothing was appended) with its length in
 * *len (may be NULL) and empties b: 0, or b's error (b freed, *out untouched) */
int strbuf_take(struct strbuf *b, char **out, size_t *len);

#endif
