/* util.h - time, small helpers and containers shared by every process. */
#ifndef RKV_UTIL_H
#define RKV_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RKV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define RKV_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define RKV_MAX(a, b)    ((a) > (b) ? (a) : (b))
#define RKV_DIV_UP(a, b) (((a) + (b)-1) / (b))

/* monotonic clock */
uint64_t rkv_now_ns(void);
uint64_t rkv_now_ms(void);
/* wall clock, ms since the epoch */
uint64_t rkv_wall_ms(void);
void rkv_sleep_ms(uint64_t ms);

/* the environment variable name as an integer in [lo, hi], def when unset; a value that is not
 * one (or out of range) is logged as a warning naming the variable, and def is used */
uint64_t rkv_env_u64(const char *name, uint64_t def, uint64_t lo, uint64_t hi);
/* the period of the worker's and rkvd's step lines: env RKV_STEP_REPORT_MS in [100, 3600000],
 * 10 s unset */
uint64_t rkv_step_report_ms(void);

/* directory of the running executable (to find sibling binaries) */
int rkv_exe_dir(char *buf, size_t len);
/* a whole file ("-": standard input) into a malloc'd buffer, NUL-terminated (*len excludes
 * the NUL); -errno when it cannot be opened, RKV_EIO on a read error, RKV_ETOOBIG past max
 * bytes (0: no limit), RKV_ENOMEM */
int rkv_read_file(const char *path, size_t max, char **out, size_t *len);

/* starts path with argv (and envp, or the current environment when NULL)
 * via posix_spawn with default signal dispositions and an empty signal
 * mask; never forks. */
int rkv_spawn(const char *path, char *const argv[], char *const envp[], pid_t *pid);

/* *buf (of *cap bytes) grown to hold need bytes: doubled from *cap, or from first when
 * empty; 0, or RKV_ENOMEM with *buf untouched */
int rkv_grow(void **buf, size_t *cap, size_t need, size_t first);

/* growable array of fixed-size elements */
struct rkv_vec {
    void *data;
    size_t len;  /* elements in use */
    size_t cap;  /* elements allocated */
    size_t elem; /* element size */
};
void rkv_vec_init(struct rkv_vec *v, size_t elem);
void rkv_vec_fini(struct rkv_vec *v);
int rkv_vec_reserve(struct rkv_vec *v, size_t cap);
/* appends one element copied from item; returns its address or NULL */
void *rkv_vec_push(struct rkv_vec *v, const void *item);
#define rkv_vec_at(v, type, i) (&((type *)(v)->data)[i])

/* u64 -> pointer hash map, open addressing; key 0 is reserved */
struct rkv_map {
    uint64_t *keys;
    void **vals;
    size_t cap; /* power of two */
    size_t len;
};
void rkv_map_init(struct rkv_map *m);
void rkv_map_fini(struct rkv_map *m);
int rkv_map_put(struct rkv_map *m, uint64_t key, void *val);
void *rkv_map_get(const struct rkv_map *m, uint64_t key);
/* returns the removed value or NULL */
void *rkv_map_del(struct rkv_map *m, uint64_t key);
/* iteration: for (size_t it = 0; rkv_map_next(m, &it, &k, &v);) */
int rkv_map_next(const struct rkv_map *m, size_t *it, uint64_t *key, void **val);

#endif
