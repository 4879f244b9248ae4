/* pool.h - a small persistent pthread pool that splits an index range across threads. */
#ifndef RKV_POOL_H
#define RKV_POOL_H

#include <stdint.h>

/* runs items [begin, end) on thread `thread` (0 = the caller) */
typedef void (*pool_fn)(void *arg, uint32_t begin, uint32_t end, uint32_t thread);

struct pool;

/* n_threads counts the caller; 0 = online cpus */
int pool_create(struct pool **out, uint32_t n_threads);
void pool_destroy(struct pool *p);
uint32_t pool_n_threads(const struct pool *p);
/* calls fn over [0, n_items) in chunks of at least `grain` items, every
 * thread taking chunks until none are left; returns when all are done.
 * not reentrant: one run at a time. */
void pool_run(struct pool *p, pool_fn fn, void *arg, uint32_t n_items, uint32_t grain);

#endif
