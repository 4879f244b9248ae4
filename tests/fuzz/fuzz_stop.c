/* fuzz_stop.c - any chunking of any text gives the same stop result as one whole feed. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/stop.h"

/* input: [n_stops] then per stop [len][bytes], then [chunk seed], then text */
struct run {
    char *out;
    size_t n;
    int matched;
};

/* feeds text in chunks of 1..max_step bytes picked by seed (max_step 0: one
 * feed) and collects what comes out, the flush included */
static void run_chunked(const char *const *stops, size_t ns, const uint8_t *text, size_t tl,
                        uint32_t seed, size_t max_step, struct run *r)
{
    struct stop *s = NULL;
    if (stop_create(&s, stops, ns) != 0)
        abort();
    r->out = malloc(tl + 1);
    r->n = 0;
    size_t pos = 0;
    const char *e;
    size_t el;
    int rc = 0;
    while (rc == 0 && (pos < tl || (pos == 0 && tl == 0))) {
        size_t step = tl - pos;
        if (max_step) {
            seed = seed * 1103515245u + 12345u;
            size_t want = 1 + (seed >> 16) % max_step;
            step = want < step ? want : step;
        }
        rc = stop_feed(s, (const char *)text + pos, step, &e, &el);
        if (rc < 0)
            abort();
        /* what comes out is exactly the next bytes of the text */
        if (r->n + el > tl || memcmp(e, text + r->n, el) != 0)
            abort();
        memcpy(r->out + r->n, e, el);
        r->n += el;
        pos += step;
        if (tl == 0)
            break;
    }
    stop_flush(s, &e, &el);
    if (r->n + el > tl || memcmp(e, text + r->n, el) != 0)
        abort();
    memcpy(r->out + r->n, e, el);
    r->n += el;
    r->matched = stop_matched(s);
    stop_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char sbuf[STOP_MAX_STRINGS][33];
    const char *stops[STOP_MAX_STRINGS];
    size_t at = 0, ns = 0;
    if (size < 2)
        return 0;
    size_t want = data[at++] % (STOP_MAX_STRINGS + 1);
    while (ns < want && at < size) {
        size_t l = 1 + data[at++] % 32;
        if (at + l > size)
            return 0;
        for (size_t j = 0; j < l; j++)
            sbuf[ns][j] = data[at + j] ? (char)data[at + j] : 'x'; /* c strings */
        sbuf[ns][l] = 0;
        stops[ns] = sbuf[ns];
        ns++;
        at += l;
    }
    if (at >= size)
        return 0;
    uint32_t seed = data[at++];
    const uint8_t *text = data + at;
    size_t tl = size - at;

    struct run whole, bytes, rand1, rand2;
    run_chunked(stops, ns, text, tl, seed, 0, &whole);
    run_chunked(stops, ns, text, tl, seed, 1, &bytes);
    run_chunked(stops, ns, text, tl, seed, 5, &rand1);
    run_chunked(stops, ns, text, tl, seed ^ 0x5a5a, 300, &rand2);
    struct run *all[] = {&bytes, &rand1, &rand2};
    for (int i = 0; i < 3; i++)
        if (all[i]->matched != whole.matched || all[i]->n != whole.n)
            abort();
    /* the result holds no stop string; a match sits right after it */
    for (size_t i = 0; i < ns; i++) {
        size_t l = strlen(stops[i]);
        if (memmem(whole.out, whole.n, stops[i], l))
            abort();
    }
    if (whole.matched >= 0) {
        size_t l = strlen(stops[whole.matched]);
        if (whole.n + l > tl || memcmp(text + whole.n, stops[whole.matched], l) != 0)
            abort();
    } else if (whole.n != tl) {
        abort();
    }
    free(whole.out);
    free(bytes.out);
    free(rand1.out);
    free(rand2.out);
    return 0;
}
