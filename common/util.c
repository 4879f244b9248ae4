/* util.c - clocks, executable path, posix_spawn, growable array, u64 map. */
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

extern char **environ;

uint64_t rkv_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t rkv_now_ms(void)
{
    return rkv_now_ns() / 1000000ull;
}

uint64_t rkv_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void rkv_sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int rkv_exe_dir(char *buf, size_t len)
{
    if (len < 2)
        return RKV_EINVAL;
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n < 0)
        return -errno;
    if ((size_t)n >= len - 1)
        return RKV_ETOOBIG;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash)
        return RKV_EFORMAT;
    if (slash == buf)
        slash[1] = '\0';
    else
        *slash = '\0';
    return 0;
}

int rkv_spawn(const char *path, char *const argv[], char *const envp[], pid_t *pid)
{
    posix_spawnattr_t attr;
    sigset_t none, all;
    int rc = posix_spawnattr_init(&attr);
    if (rc)
        return -rc;
    /* the child starts with default handlers and nothing blocked, whatever
     * the parent (libuv, nng threads) has set up */
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    rc = posix_spawn(pid, path, NULL, &attr, argv, envp ? envp : environ);
    posix_spawnattr_destroy(&attr);
    return rc ? -rc : 0;
}

void rkv_vec_init(struct rkv_vec *v, size_t elem)
{
    memset(v, 0, sizeof *v);
    v->elem = elem;
}

void rkv_vec_fini(struct rkv_vec *v)
{
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

int rkv_grow(void **buf, size_t *cap, size_t need, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : first ? first : 1;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return RKV_ENOMEM;
        c *= 2;
    }
    void *b = realloc(*buf, c);
    if (!b)
        return RKV_ENOMEM;
    *buf = b;
    *cap = c;
    return 0;
}

int rkv_vec_reserve(struct rkv_vec *v, size_t cap)
{
    if (cap <= v->cap)
        return 0;
    if (v->elem == 0 || cap > SIZE_MAX / v->elem)
        return RKV_ENOMEM;
    void *p = realloc(v->data, cap * v->elem);
    if (!p)
        return RKV_ENOMEM;
    v->data = p;
    v->cap = cap;
    return 0;
}

void *rkv_vec_push(struct rkv_vec *v, const void *item)
{
    if (v->len == v->cap && rkv_vec_reserve(v, v->cap ? v->cap * 2 : 8) != 0)
        return NULL;
    void *slot = (char *)v->data + v->len * v->elem;
    if (item)
        memcpy(slot, item, v->elem);
    else
        memset(slot, 0, v->elem);
    v->len++;
    return slot;
}

static size_t map_hash(uint64_t k)
{
    /* splitmix64 finalizer: ids are often sequential */
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebull;
    k ^= k >> 31;
    return (size_t)k;
}

void rkv_map_init(struct rkv_map *m)
{
    memset(m, 0, sizeof *m);
}

void rkv_map_fini(struct rkv_map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static int map_grow(struct rkv_map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    uint64_t *keys = calloc(ncap, sizeof *keys);
    void **vals = calloc(ncap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return RKV_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = map_hash(m->keys[i]) & (ncap - 1);
        while (keys[j])
            j = (j + 1) & (ncap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = ncap;
    return 0;
}

int rkv_map_put(struct rkv_map *m, uint64_t key, void *val)
{
    if (key == 0)
        return RKV_EINVAL;
    if ((m->len + 1) * 4 > m->cap * 3) {
        int rc = map_grow(m);
        if (rc)
            return rc;
    }
    size_t j = map_hash(key) & (m->cap - 1);
    while (m->keys[j] && m->keys[j] != key)
        j = (j + 1) & (m->cap - 1);
    if (!m->keys[j])
        m->len++;
    m->keys[j] = key;
    m->vals[j] = val;
    return 0;
}

static size_t map_slot(const struct rkv_map *m, uint64_t key)
{
    if (!m->cap || key == 0)
        return SIZE_MAX;
    size_t j = map_hash(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (m->keys[j] == key)
            return j;
        j = (j + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

void *rkv_map_get(const struct rkv_map *m, uint64_t key)
{
    size_t j = map_slot(m, key);
    return j == SIZE_MAX ? NULL : m->vals[j];
}

void *rkv_map_del(struct rkv_map *m, uint64_t key)
{
    size_t j = map_slot(m, key);
    if (j == SIZE_MAX)
        return NULL;
    void *val = m->vals[j];
    m->keys[j] = 0;
    m->vals[j] = NULL;
    m->len--;
    /* backward-shift the probe chain so lookups stay correct */
    size_t i = (j + 1) & (m->cap - 1);
    while (m->keys[i]) {
        size_t home = map_hash(m->keys[i]) & (m->cap - 1);
        /* move i into the hole j when home is not in the cyclic range (j, i] */
        int in_range = (j < i) ? (home > j && home <= i) : (home > j || home <= i);
        if (!in_range) {
            m->keys[j] = m->keys[i];
            m->vals[j] = m->vals[i];
            m->keys[i] = 0;
            m->vals[i] = NULL;
            j = i;
        }
        i = (i + 1) & (m->cap - 1);
    }
    return val;
}

int rkv_map_next(const struct rkv_map *m, size_t *it, uint64_t *key, void **val)
{
    while (*it < m->cap) {
        size_t i = (*it)++;
        if (m->keys[i]) {
            if (key)
                *key = m->keys[i];
            if (val)
                *val = m->vals[i];
            return 1;
        }
    }
    return 0;
}

uint64_t rkv_env_u64(const char *name, uint64_t def, uint64_t lo, uint64_t hi)
{
    const char *v = getenv(name);
    if (!v)
        return def;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno || v[0] == '-' || x < lo || x > hi) {
        log_warn("%s=%.40s is not a whole number in [%llu, %llu]: using %llu", name, v,
                 (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)def);
        return def;
    }
    return x;
}

uint64_t rkv_step_report_ms(void)
{
    return rkv_env_u64("RKV_STEP_REPORT_MS", 10000, 100, 3600000);
}

int rkv_read_file(const char *path, size_t max, char **out, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? 0 : RKV_ENOMEM;
    while (rc == 0) {
        if (n == cap) {
            char *q = max && cap >= max ? NULL : realloc(buf, cap * 2 + 1);
            if (!q) {
                rc = max && cap >= max ? RKV_ETOOBIG : RKV_ENOMEM;
                break;
            }
            buf = q;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        if (!k)
            break;
        n += k;
    }
    if (rc == 0 && ferror(f))
        rc = RKV_EIO;
    if (rc == 0 && max && n > max)
        rc = RKV_ETOOBIG;
    if (f != stdin)
        fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}
