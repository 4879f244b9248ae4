/* pool.c - persistent worker threads; chunks handed out by an atomic counter.
 * after a job a thread spins briefly for the next one (a forward step is ~150 short
 * jobs back to back), then sleeps on a semaphore; the caller posts only for sleepers
 * it needs. the caller works too and never waits for a thread that has not joined the
 * job (a late, descheduled thread finds the job closed and goes back to waiting). */
#include "worker/pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/err.h"

/* state: this bit while the job takes new threads, plus the count of threads in it */
#define POOL_OPEN 0x80000000u
/* pause iterations a thread looks for the next job before it sleeps (~0.1 ms) */
#define POOL_SPIN 2000

struct pool {
    uint32_t n_threads;
    pthread_t *threads;
    sem_t wake; /* one post per sleeping thread wanted */
    atomic_int stop;
    atomic_uint state;
    atomic_uint job;      /* id of the latest job, bumped before it opens */
    atomic_uint sleepers; /* threads blocked (or about to block) on wake */
    /* the current job: written before the job opens */
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

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* joins the open job; 0 when none is open */
static int join_job(struct pool *p)
{
    unsigned s = atomic_load(&p->state);
    while (s & POOL_OPEN)
        if (atomic_compare_exchange_weak(&p->state, &s, s + 1))
            return 1;
    return 0;
}

static void *worker_main(void *v)
{
    struct worker_arg *wa = v;
    struct pool *p = wa->p;
    uint32_t id = wa->id;
    unsigned seen = 0; /* the last job this thread worked on */
    free(wa);
    for (;;) {
        int found = 0;
        for (int i = 0; i < POOL_SPIN && !found; i++) {
            if (atomic_load(&p->stop))
                return NULL;
            found = atomic_load(&p->job) != seen && (atomic_load(&p->state) & POOL_OPEN);
            if (!found)
                cpu_relax();
        }
        if (!found) {
            atomic_fetch_add(&p->sleepers, 1);
            while (sem_wait(&p->wake) < 0 && errno == EINTR)
                ;
            atomic_fetch_sub(&p->sleepers, 1);
            if (atomic_load(&p->stop))
                return NULL;
        }
        if (atomic_load(&p->job) == seen || !join_job(p))
            continue; /* nothing new, or the job closed already */
        /* while this thread is joined the caller cannot start another job */
        seen = atomic_load(&p->job);
        take_chunks(p, id);
        atomic_fetch_sub(&p->state, 1);
    }
}

int pool_create(struct pool **out, uint32_t n_threads)
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
    if (!p->threads || sem_init(&p->wake, 0, 0) < 0) {
        free(p->threads);
        free(p);
        return RKV_ENOMEM;
    }
    p->n_threads = 1;
    for (uint32_t i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->p = p;
            wa->id = i;
        }
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool_destroy(p);
            return RKV_ENOMEM;
        }
        p->n_threads++;
    }
    *out = p;
    return 0;
}

void pool_destroy(struct pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    for (uint32_t i = 1; i < p->n_threads; i++)
        sem_post(&p->wake);
    for (uint32_t i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    sem_destroy(&p->wake);
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
    p->fn = fn;
    p->arg = arg;
    p->n_items = n_items;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_fetch_add(&p->job, 1);
    atomic_store(&p->state, POOL_OPEN);
    /* spinning threads join by themselves; wake sleepers for the rest */
    uint32_t n_chunks = (n_items + chunk - 1) / chunk;
    uint32_t n_wake = n_chunks - 1 < p->n_threads - 1 ? n_chunks - 1 : p->n_threads - 1;
    uint32_t n_sleep = atomic_load(&p->sleepers);
    for (uint32_t i = 0; i < n_wake && i < n_sleep; i++)
        sem_post(&p->wake);

    take_chunks(p, 0);

    /* every chunk is claimed: close the job, then wait only for threads
     * still running theirs (they are on a cpu, so spinning is short) */
    atomic_fetch_and(&p->state, ~POOL_OPEN);
    for (unsigned spins = 0; atomic_load(&p->state) != 0; spins++)
        if (spins > 64)
            sched_yield();
}
