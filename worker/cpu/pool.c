/* pool.c - persistent worker threads woken per job; chunks handed out by an atomic counter.
 * the caller works too and never waits for a thread that has not joined the job yet: a
 * late (descheduled) thread finds the job closed and goes back to sleep. */
#include "worker/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/err.h"

struct pool {
    uint32_t n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers wait here for a new generation */
    pthread_cond_t done; /* the caller waits here for joined == 0 */
    uint64_t generation;
    int open;        /* the current job still takes new threads */
    uint32_t joined; /* threads working on the current job */
    int stop;
    /* the current job */
    pool_fn fn;
    void *arg;
    uint32_t n_items;
    uint32_t chunk;
    atomic_uint next;
};

struct worker_arg {
    struct pool *p;
    uint32_t id;
};

static void take_chunks(struct pool *p, uint32_t thread)
{
    for (;;) {
        uint32_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n_items)
            break;
        uint32_t e = b + p->chunk < p->n_items ? b + p->chunk : p->n_items;
        p->fn(p->arg, b, e, thread);
    }
}

static void *worker_main(void *v)
{
    struct worker_arg *wa = v;
    struct pool *p = wa->p;
    uint32_t id = wa->id;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        if (!p->open)
            continue;
        p->joined++;
        pthread_mutex_unlock(&p->mu);
        take_chunks(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->joined == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int pool_init(struct pool **out, uint32_t n_threads)
{
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (uint32_t)n : 1;
    }
    if (n_threads > 1024)
        return RKV_ERANGE;
    struct pool *p = calloc(1, sizeof(*p));
    if (!p)
        return RKV_ENOMEM;
    p->threads = calloc(n_threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return RKV_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->n_threads = 1;
    for (uint32_t i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->p = p;
            wa->id = i;
        }
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool_free(p);
            return RKV_ENOMEM;
        }
        p->n_threads++;
    }
    *out = p;
    return 0;
}

void pool_free(struct pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

uint32_t pool_n_threads(const struct pool *p)
{
    return p->n_threads;
}

void pool_run(struct pool *p, pool_fn fn, void *arg, uint32_t n_items, uint32_t grain)
{
    if (n_items == 0)
        return;
    if (grain == 0)
        grain = 1;
    /* small jobs are not worth a wake-up */
    if (p->n_threads == 1 || n_items <= grain) {
        fn(arg, 0, n_items, 0);
        return;
    }
    /* a few chunks per thread balance uneven items (attention rows differ) */
    uint32_t chunk = n_items / (p->n_threads * 4);
    if (chunk < grain)
        chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_items = n_items;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->open = 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    take_chunks(p, 0);

    /* every chunk is claimed; wait only for threads still running theirs */
    pthread_mutex_lock(&p->mu);
    p->open = 0;
    while (p->joined > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
