/* rates.c - times decode attention over the kv pools, the cpu attention and host->device moves. */
#include "worker/rates.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/cpu/cpu_backend.h"
#if RKV_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

#define MAX_SEQS       64
#define MAX_REPS       64
#define MAX_WINDOWS    16
#define GPU_PASS_BYTES ((uint64_t)512 << 20)
#define GPU_COPY_BYTES ((uint64_t)256 << 20)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* blocks of a pass: the pool's, capped at cap bytes */
static uint32_t pass_blocks(const struct kv_layout *l, uint32_t n_pool, uint64_t cap_bytes)
{
    uint64_t cap = cap_bytes / kv_block_bytes(l);
    if (cap == 0)
        cap = 1;
    return n_pool < cap ? n_pool : (uint32_t)cap;
}

/* passes cycle over up to MAX_WINDOWS disjoint windows of the pool, so a pass
 * reads memory, not what the previous one left in the caches. only where the
 * pools are resident (a gpu worker: vram, and a host pool pinned by set_kv): a
 * cpu worker's fresh shared memory would be allocated page by page by the reads */
static uint32_t pass_windows(uint32_t n_pool, uint32_t nb, int rotate)
{
    uint32_t w = nb && rotate ? n_pool / nb : 1;
    return w < 1 ? 1 : w > MAX_WINDOWS ? MAX_WINDOWS : w;
}

/* runs fn until budget_ms has passed (at least 3, at most MAX_REPS times after a
 * warm-up) and returns bytes / the median time, GB/s */
typedef int (*pass_fn)(void *u);
static int time_passes(pass_fn fn, void *u, uint64_t bytes, double budget_ms, double *gbps)
{
    double t[MAX_REPS];
    int n = 0, rc = fn(u);
    if (rc)
        return rc;
    double start = now_ms();
    while (n < MAX_REPS && (n < 3 || now_ms() - start < budget_ms)) {
        double t0 = now_ms();
        if ((rc = fn(u)))
            return rc;
        t[n++] = now_ms() - t0;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    double med = t[n / 2] > 1e-6 ? t[n / 2] : 1e-6;
    *gbps = (double)bytes / (med * 1e6);
    return 0;
}

/* one decode pass: every layer's attention of one token per sequence over its blocks */
struct attn_pass {
    struct backend *be;
    const struct kv_layout *l;
    const struct be_attn *at;
    enum kv_residency res;
    struct be_batch b;
    struct be_seq seqs[MAX_SEQS];
    uint32_t b0[MAX_SEQS]; /* first block of each sequence inside a window */
    const struct kv_block_ref *refs;
    uint32_t nb, n_win, pass;
    struct be_tensor *q;
    struct be_partial out;
};

static int attn_pass_run(void *u)
{
    struct attn_pass *p = u;
    const struct kv_block_ref *win = p->refs + (size_t)(p->pass++ % p->n_win) * p->nb;
    for (uint32_t s = 0; s < p->b.n_seqs; s++)
        p->seqs[s].blocks = win + p->b0[s];
    for (uint32_t layer = 0; layer < p->l->n_layer; layer++) {
        /* a sliding-window layout: the global layers, which read every position (part 0 of each
         * position block); the local ones read their window */
        if (p->l->n_parts > 1 && kv_layer_local(p->l, layer))
            continue;
        int rc = attn_partial_forward(p->be, &p->b, layer, p->res, p->q, p->at, &p->out);
        if (rc)
            return rc;
    }
    return backend_sync(p->be);
}

/* the shape of an attention pass: at most cap bytes of blocks, over up to max_seqs rows */
struct pass_shape {
    uint64_t cap;
    uint32_t max_seqs;
};

/* attention rate of be over blocks of pool res (GB/s of kv read); 0 when empty */
static int attn_rate(struct backend *be, const struct kv_layout *l, const struct be_attn *at,
                     enum kv_residency res, uint32_t n_pool, struct pass_shape sh, int rotate,
                     double budget_ms, double *gbps)
{
    *gbps = 0;
    /* a position block is n_parts blocks (sliding windows: the global layers' part and the
     * local ones'), its table n_parts entries */
    const uint32_t P = l->n_parts ? l->n_parts : 1;
    uint32_t nb = pass_blocks(l, n_pool, sh.cap) / P * P, npb = nb / P;
    if (nb == 0)
        return 0;
    uint32_t max_seqs = sh.max_seqs < MAX_SEQS ? sh.max_seqs : MAX_SEQS;
    uint32_t ns = npb < max_seqs ? npb : max_seqs, n_win = pass_windows(n_pool, nb, rotate);
    struct kv_block_ref *refs = calloc((size_t)nb * n_win, sizeof *refs);
    int32_t pos[MAX_SEQS];
    uint32_t seq_of[MAX_SEQS];
    const uint32_t qcols = at->n_head * at->head_dim;
    float *q0 = calloc(qcols, sizeof *q0);
    struct attn_pass *p = calloc(1, sizeof *p);
    int rc = RKV_ENOMEM;
    if (!refs || !q0 || !p)
        goto out;
    *p = (struct attn_pass){
        .be = be, .l = l, .at = at, .res = res, .refs = refs, .nb = nb, .n_win = n_win};
    p->b = (struct be_batch){p->seqs, ns, ns, pos, seq_of};
    for (uint32_t i = 0; i < nb * n_win; i++)
        refs[i] = (struct kv_block_ref){i, (uint8_t)res};
    /* sequence s reads position blocks [s*npb/ns, (s+1)*npb/ns) of a window; its token is the
     * last position */
    for (uint32_t s = 0; s < ns; s++) {
        const uint32_t pb0 = (uint32_t)((uint64_t)s * npb / ns),
                       pb1 = (uint32_t)((uint64_t)(s + 1) * npb / ns);
        const uint32_t b0 = pb0 * P, b1 = pb1 * P;
        uint32_t n_pos = (pb1 - pb0) * l->block_size;
        p->seqs[s] = (struct be_seq){s, 1, n_pos - 1, refs + b0, b1 - b0};
        p->b0[s] = b0;
        pos[s] = (int32_t)(n_pos - 1);
        seq_of[s] = s;
    }
    for (uint32_t i = 0; i < qcols; i++)
        q0[i] = 0.01f * (float)((i % 7) + 1);
    if ((rc = backend_tensor_alloc(be, BE_F32, ns, qcols, &p->q)) ||
        (rc = backend_tensor_alloc(be, BE_F32, ns, qcols, &p->out.o)) ||
        (rc = backend_tensor_alloc(be, BE_F32, ns, at->n_head, &p->out.m)) ||
        (rc = backend_tensor_alloc(be, BE_F32, ns, at->n_head, &p->out.l)))
        goto out;
    for (uint32_t s = 0; s < ns && rc == 0; s++)
        rc = backend_tensor_set(be, p->q, q0, (size_t)s * qcols * sizeof(float),
                                qcols * sizeof(float));
    /* the bytes a pass reads: every block, or with parts the global part of each */
    if (rc == 0)
        rc = time_passes(attn_pass_run, p, (uint64_t)(P > 1 ? npb : nb) * kv_block_bytes(l),
                         budget_ms, gbps);
out:
    if (p) {
        backend_tensor_free(be, p->q);
        backend_tensor_free(be, p->out.o);
        backend_tensor_free(be, p->out.m);
        backend_tensor_free(be, p->out.l);
    }
    free(p);
    free(refs);
    free(q0);
    return rc;
}

/* a bulk copy out of the host pool, a different window each pass */
struct copy_pass {
    void *dst;
    const char *src;
    size_t n;
    uint32_t n_win, pass;
    int gpu;
};

static int copy_pass_run(void *u)
{
    struct copy_pass *c = u;
    const char *src = c->src + (size_t)(c->pass++ % c->n_win) * c->n;
#if RKV_CUDA
    if (c->gpu >= 0)
        return rkv_cuda_copy(c->dst, src, c->n);
#endif
    memcpy(c->dst, src, c->n);
    return 0;
}

/* a copy pass over up to cap bytes of the host pool's blocks (rotate: through its windows) */
static struct copy_pass copy_pass_of(const struct rates_opts *o, uint64_t cap, int rotate)
{
    uint32_t n_pool = o->pools->n_blocks[KV_HOST];
    uint32_t nb = pass_blocks(o->layout, n_pool, cap);
    return (struct copy_pass){NULL,
                              o->pools->base[KV_HOST],
                              (size_t)nb * kv_block_bytes(o->layout),
                              pass_windows(n_pool, nb, rotate),
                              0,
                              o->gpu};
}

/* a copy pass's destination: device memory on a gpu (which this makes the calling thread's),
 * else a malloc. 0 or a negative RKV_E* code */
static int copy_dst_alloc(struct copy_pass *c)
{
#if RKV_CUDA
    if (c->gpu >= 0)
        return rkv_cuda_dev_alloc(c->gpu, c->n, &c->dst);
#endif
    return (c->dst = malloc(c->n)) ? 0 : RKV_ENOMEM;
}

static void copy_dst_free(struct copy_pass *c)
{
#if RKV_CUDA
    if (c->gpu >= 0) {
        if (c->dst)
            rkv_cuda_dev_free(c->dst);
        c->dst = NULL;
        return;
    }
#endif
    free(c->dst);
    c->dst = NULL;
}

/* host pool -> a private buffer (device memory on a gpu): GB/s moved */
static int copy_rate(const struct rates_opts *o, double *gbps)
{
    *gbps = 0;
    struct copy_pass c =
        copy_pass_of(o, o->gpu >= 0 ? GPU_COPY_BYTES : RATES_MAX_BYTES, o->gpu >= 0);
    if (c.n == 0 || !c.src)
        return 0;
    int rc = copy_dst_alloc(&c);
    if (rc && o->gpu >= 0) {
        /* a gpu close to full keeps its kv: the rate stays unknown */
        log_warn("no room on gpu %d for a %zu MiB copy test: pcie rate unknown (0)", o->gpu,
                 c.n >> 20);
        return 0;
    }
    if (rc)
        return rc;
    rc = time_passes(copy_pass_run, &c, c.n, o->budget_ms, gbps);
    copy_dst_free(&c);
    return rc;
}

/* the shapes of the cpu's passes. CPU_TAIL's rate for the planner: one llama3-8b block a layer
 * over up to 16 rows, as before. The split's: one row of up to SPLIT_PASS_BYTES, a tail as long
 * as those the split takes (it leaves tails under ~1 ms of the link a layer on the gpu), which
 * the cpu reads faster than one block a layer (H100 host, 16 threads: 61.8 GB/s over a 32k row
 * against 33.9 by the short pass) */
static const struct pass_shape CPU_TAIL_PASS = {RATES_MAX_BYTES, 16};
#define SPLIT_PASS_BYTES ((uint64_t)1 << 30)

/* a cpu backend (a gpu worker's cpu threads) over the host pool alone */
static int host_cpu_backend(const struct rates_opts *o, struct backend **cpu)
{
    int rc = cpu_backend_create(o->cpu_threads, cpu);
    if (rc)
        return rc;
    struct kv_pools host_only = {{NULL, o->pools->base[KV_HOST]}, {0, o->pools->n_blocks[KV_HOST]}};
    if ((rc = backend_set_kv(*cpu, o->layout, &host_only))) { /* the pools are copied */
        backend_destroy(*cpu);
        *cpu = NULL;
    }
    return rc;
}

/* the cpu attention over the host pool, on cpu (host_cpu_backend's) */
static int cpu_attn_rate(struct backend *cpu, const struct rates_opts *o, struct pass_shape sh,
                         double *gbps)
{
    return attn_rate(cpu, o->layout, &o->attn, KV_HOST, o->pools->n_blocks[KV_HOST], sh, 1,
                     o->budget_ms, gbps);
}

/* the link kept reading the host pool (a gpu: into device memory; the cpu backend's stand-in: a
 * memcpy) on a thread of its own, while the cpu attends the same pool */
#define LINK_PIECE_BYTES ((uint64_t)64 << 20)
struct link_load {
    const struct rates_opts *o;
    atomic_int stop, state; /* state: 0 starting, 1 copying (the first piece landed), -1 failed */
    uint64_t bytes;         /* moved after the first piece */
    double t0, t1;
    uint32_t pieces;
    int rc;
};

static void *link_load_run(void *u)
{
    struct link_load *ll = u;
    struct copy_pass c = copy_pass_of(ll->o, LINK_PIECE_BYTES, 1);
    int rc = copy_dst_alloc(&c);
    if (rc == 0 && (rc = copy_pass_run(&c)) == 0) {
        ll->t0 = now_ms();
        atomic_store(&ll->state, 1);
        while (!atomic_load(&ll->stop) && (rc = copy_pass_run(&c)) == 0) {
            ll->bytes += c.n;
            ll->pieces++;
        }
        ll->t1 = now_ms();
    }
    ll->rc = rc;
    if (rc)
        atomic_store(&ll->state, -1);
    copy_dst_free(&c);
    return NULL;
}

/* rates_split on cpu (host_cpu_backend's) */
static int split_rates_on(struct backend *cpu, const struct rates_opts *o, struct split_rates *out)
{
    memset(out, 0, sizeof *out);
    if (!o->pools->base[KV_HOST] || o->pools->n_blocks[KV_HOST] == 0)
        return 0;
    struct link_load ll = {.o = o};
    pthread_t th;
    if (pthread_create(&th, NULL, link_load_run, &ll) != 0)
        return RKV_ENOMEM;
    while (atomic_load(&ll.state) == 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    double gbps = 0;
    int rc = atomic_load(&ll.state) < 0
                 ? 0
                 : cpu_attn_rate(cpu, o, (struct pass_shape){SPLIT_PASS_BYTES, 1}, &gbps);
    atomic_store(&ll.stop, 1);
    pthread_join(th, NULL);
    if (rc)
        return rc;
    if (ll.rc) {
        log_warn("the link could not read the host pool beside the cpu (%s): the split host "
                 "read's share comes from the rates measured apart",
                 rkv_strerror(ll.rc));
        return 0;
    }
    out->cpu_gbps = gbps;
    out->link_gbps = ll.t1 > ll.t0 ? (double)ll.bytes / ((ll.t1 - ll.t0) * 1e6) : 0;
    out->link_pieces = ll.pieces;
    return 0;
}

int rates_split(const struct rates_opts *o, struct split_rates *out)
{
    memset(out, 0, sizeof *out);
    if (!o->pools->base[KV_HOST] || o->pools->n_blocks[KV_HOST] == 0)
        return 0;
    struct backend *cpu;
    int rc = host_cpu_backend(o, &cpu);
    if (rc == 0) {
        rc = split_rates_on(cpu, o, out);
        backend_destroy(cpu);
    }
    return rc;
}

int rates_measure(struct backend *be, const struct rates_opts *o, struct rates *out)
{
    memset(out, 0, sizeof *out);
    struct rates_opts op = *o;
    if (op.budget_ms <= 0)
        op.budget_ms = 20;
    double t0 = now_ms();
    const struct kv_pools *p = op.pools;
    /* a gpu streams far more than a cpu in the same time: larger passes and more rows, so
     * launches do not dominate and every SM has work */
    const struct pass_shape own =
        op.gpu >= 0 ? (struct pass_shape){GPU_PASS_BYTES, MAX_SEQS} : CPU_TAIL_PASS;
    int rc = attn_rate(be, op.layout, &op.attn, KV_DEVICE,
                       p->base[KV_DEVICE] ? p->n_blocks[KV_DEVICE] : 0, own, op.gpu >= 0,
                       op.budget_ms, &out->attn_device_gbps);
    if (rc == 0)
        rc =
            attn_rate(be, op.layout, &op.attn, KV_HOST, p->base[KV_HOST] ? p->n_blocks[KV_HOST] : 0,
                      own, op.gpu >= 0, op.budget_ms, &out->attn_host_gbps);
    if (rc == 0 && op.gpu >= 0) {
        rc = copy_rate(&op, &out->pcie_h2d_gbps);
        /* one cpu backend (its threads) for CPU_TAIL's pass and the split's */
        struct backend *cpu = NULL;
        if (rc == 0 && op.pools->base[KV_HOST] && (rc = host_cpu_backend(&op, &cpu)) == 0) {
            rc = cpu_attn_rate(cpu, &op, CPU_TAIL_PASS, &out->attn_cpu_gbps);
            if (rc == 0)
                rc = split_rates_on(cpu, &op, &out->split);
            backend_destroy(cpu);
        }
    } else if (rc == 0) {
        /* cpu backend: its host attention is the cpu rate; no link, so the
         * host-stream rate is what a memcpy out of the host pool moves */
        out->attn_cpu_gbps = out->attn_host_gbps;
        rc = copy_rate(&op, &out->attn_host_gbps);
    }
    out->elapsed_ms = now_ms() - t0;
    if (rc) {
        log_warn("measuring kv rates failed: %s; the planner gets 0 (unknown) for the rest",
                 rkv_strerror(rc));
        return rc;
    }
    if (!isfinite(out->attn_device_gbps + out->attn_host_gbps + out->attn_cpu_gbps +
                  out->pcie_h2d_gbps))
        return RKV_EINVAL;
    return 0;
}
