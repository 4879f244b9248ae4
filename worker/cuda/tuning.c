/* tuning.c - the cuda backend's knob table and its reading from RKV_CUDA_TUNE. */
#include "worker/cuda/tuning.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

const struct cuda_knob cuda_knobs[] = {
#define CUDA_TUNE_ROW(name, def, lo, hi, names, doc) {#name, def, lo, hi, names, doc},
    CUDA_TUNE_KNOBS(CUDA_TUNE_ROW)
#undef CUDA_TUNE_ROW
};
const size_t cuda_n_knobs = RKV_ARRAY_LEN(cuda_knobs);

/* the field of knob i */
static uint32_t *knob_field(struct cuda_tune *t, size_t i)
{
    static const size_t off[] = {
#define CUDA_TUNE_OFF(name, def, lo, hi, names, doc) offsetof(struct cuda_tune, name),
        CUDA_TUNE_KNOBS(CUDA_TUNE_OFF)
#undef CUDA_TUNE_OFF
    };
    return (uint32_t *)((char *)t + off[i]);
}

void cuda_tune_defaults(struct cuda_tune *t)
{
    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < cuda_n_knobs; i++)
        *knob_field(t, i) = cuda_knobs[i].def;
}

/* v (len bytes) as knob k's value: a number in range, or the index of one of its names */
static int knob_value(const struct cuda_knob *k, const char *v, size_t len, uint32_t *out)
{
    if (k->names) {
        uint32_t idx = 0;
        for (const char *p = k->names; *p; idx++) {
            const char *bar = strchr(p, '|');
            const size_t n = bar ? (size_t)(bar - p) : strlen(p);
            if (n == len && !strncmp(p, v, len)) {
                *out = idx;
                return 0;
            }
            p += n + (bar != NULL);
        }
    }
    char buf[24];
    if (len == 0 || len >= sizeof(buf) || v[0] == '-')
        return -1;
    memcpy(buf, v, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (*end || errno || x < k->lo || x > k->hi)
        return -1;
    if (k->names) { /* a named knob takes the numbers of its names only where they exist */
        uint32_t n = 1;
        for (const char *p = k->names; *p; p++)
            n += *p == '|';
        if (x >= n)
            return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

int cuda_tune_parse(struct cuda_tune *t, const char *spec)
{
    int bad = 0;
    for (const char *p = spec; p && *p;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        size_t i = cuda_n_knobs;
        if (eq)
            for (i = 0; i < cuda_n_knobs; i++)
                if (strlen(cuda_knobs[i].name) == (size_t)(eq - p) &&
                    !strncmp(cuda_knobs[i].name, p, (size_t)(eq - p)))
                    break;
        uint32_t v = 0;
        if (n == 0) {
            /* an empty part (",," or a trailing comma) says nothing */
        } else if (i == cuda_n_knobs) {
            log_warn("%s: \"%.*s\" names no knob (docs/operations.md lists them): left out",
                     CUDA_TUNE_ENV, (int)n, p);
            bad++;
        } else if (knob_value(&cuda_knobs[i], eq + 1, n - (size_t)(eq - p) - 1, &v) < 0) {
            const struct cuda_knob *k = &cuda_knobs[i];
            log_warn("%s: %.*s is not %s%s in [%u, %u]: %s stays %u", CUDA_TUNE_ENV, (int)n, p,
                     k->names ? k->names : "", k->names ? " or a number" : "a whole number", k->lo,
                     k->hi, k->name, *knob_field(t, i));
            bad++;
        } else {
            *knob_field(t, i) = v;
        }
        p = end ? end + 1 : NULL;
    }
    if (t->sample_cl & (t->sample_cl - 1)) {
        log_warn("%s: sample_cl=%u is not 1, 2, 4 or 8: using 8", CUDA_TUNE_ENV, t->sample_cl);
        t->sample_cl = 8;
        bad++;
    }
    return bad;
}

void cuda_tune_read(struct cuda_tune *t)
{
    cuda_tune_defaults(t);
    cuda_tune_parse(t, getenv(CUDA_TUNE_ENV));
    t->sample_stamps = (int)rkv_env_u64(CUDA_DEBUG_STAMPS_ENV, 0, 0, 1);
}
