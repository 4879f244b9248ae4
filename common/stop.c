/* stop.c - incremental stop-string matcher: scan new bytes, hold back a possible prefix. */
#include "common/stop.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

struct stop {
    char *str[STOP_MAX_STRINGS];
    size_t len[STOP_MAX_STRINGS];
    size_t n;
    /* buf[0..hold) was handed out by the last call (still valid for the
     * caller), buf[hold..used) is held back; the next call drops buf[0..hold) */
    char *buf;
    size_t cap;
    size_t used;
    size_t hold;
    size_t scanned; /* buf[0..scanned) already checked for a stop string's end */
    int matched;    /* index of the matched string, -1 before a match */
};

int stop_create(struct stop **out, const char *const *strs, size_t n)
{
    *out = NULL;
    if (n > STOP_MAX_STRINGS)
        return RKV_ETOOBIG;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(strs[i]);
        if (l == 0)
            return RKV_EINVAL;
        if (l > STOP_MAX_LEN)
            return RKV_ETOOBIG;
    }
    struct stop *s = calloc(1, sizeof(*s));
    if (!s)
        return RKV_ENOMEM;
    s->matched = -1;
    for (size_t i = 0; i < n; i++) {
        s->str[i] = strdup(strs[i]);
        if (!s->str[i]) {
            stop_destroy(s);
            return RKV_ENOMEM;
        }
        s->len[i] = strlen(strs[i]);
        s->n++;
    }
    *out = s;
    return 0;
}

void stop_destroy(struct stop *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->str[i]);
    free(s->buf);
    free(s);
}

/* drops what the last call handed out; the held tail moves to the front */
static void stop_compact(struct stop *s)
{
    if (s->hold == 0)
        return;
    memmove(s->buf, s->buf + s->hold, s->used - s->hold);
    s->used -= s->hold;
    s->scanned = s->scanned > s->hold ? s->scanned - s->hold : 0;
    s->hold = 0;
}

/* start of the longest stop string ending at byte e of buf, or -1 */
static long stop_ending_at(const struct stop *s, size_t e, int *which)
{
    long best = -1;
    for (size_t i = 0; i < s->n; i++) {
        size_t l = s->len[i];
        if (l > e || s->buf[e - 1] != s->str[i][l - 1])
            continue;
        if (memcmp(s->buf + e - l, s->str[i], l) == 0 && (best < 0 || (long)(e - l) < best)) {
            best = (long)(e - l);
            *which = (int)i;
        }
    }
    return best;
}

/* length of the longest suffix of buf[0..used) that is a proper prefix of a
 * stop string: those bytes could still become a match */
static size_t stop_partial(const struct stop *s)
{
    size_t best = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t k = s->len[i] - 1;
        if (k > s->used)
            k = s->used;
        for (; k > best; k--) {
            const char *tail = s->buf + s->used - k;
            if (tail[0] == s->str[i][0] && memcmp(tail, s->str[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* bytes a UTF-8 sequence starting with lead byte c takes; 0 if not a lead */
static size_t utf8_seq_len(unsigned char c)
{
    if (c >= 0xc0 && c < 0xe0)
        return 2;
    if (c >= 0xe0 && c < 0xf0)
        return 3;
    if (c >= 0xf0 && c < 0xf8)
        return 4;
    return 0;
}

/* moves end back to the start of a UTF-8 sequence that buf[0..end) cuts */
static size_t utf8_cut(const char *buf, size_t end)
{
    size_t q = end;
    while (q > 0 && end - q < 3 && ((unsigned char)buf[q - 1] & 0xc0) == 0x80)
        q--;
    if (q == 0)
        return end;
    size_t need = utf8_seq_len((unsigned char)buf[q - 1]);
    if (need && q - 1 + need > end)
        return q - 1;
    return end;
}

int stop_feed(struct stop *s, const char *chunk, size_t len, const char **emit, size_t *emit_len)
{
    stop_compact(s);
    *emit = s->buf ? s->buf : "";
    *emit_len = 0;
    if (s->matched >= 0)
        return 1;
    if (rkv_grow((void **)&s->buf, &s->cap, s->used + len, 512) < 0)
        return RKV_ENOMEM;
    if (len)
        memcpy(s->buf + s->used, chunk, len);
    s->used += len;
    *emit = s->buf;

    /* a stop string can only end in the new bytes: older ends were checked */
    for (size_t e = s->scanned + 1; e <= s->used; e++) {
        int which = -1;
        long start = stop_ending_at(s, e, &which);
        if (start >= 0) {
            s->matched = which;
            *emit_len = (size_t)start;
            /* the rest is dropped; buf[0..start) stays valid because the
             * next call has nothing to move */
            s->hold = s->used = s->scanned = 0;
            return 1;
        }
    }
    s->scanned = s->used;
    size_t out = utf8_cut(s->buf, s->used - stop_partial(s));
    *emit_len = out;
    s->hold = out;
    return 0;
}

void stop_flush(struct stop *s, const char **emit, size_t *emit_len)
{
    stop_compact(s);
    *emit = s->buf ? s->buf : "";
    *emit_len = 0;
    if (s->matched >= 0)
        return;
    *emit_len = s->used;
    s->hold = s->used;
    s->scanned = s->used;
}

int stop_matched(const struct stop *s)
{
    return s->matched;
}

size_t stop_held(const struct stop *s)
{
    return s->matched >= 0 ? 0 : s->used - s->hold;
}
