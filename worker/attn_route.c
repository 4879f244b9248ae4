/* attn_route.c - host KV blocks attended on cpu threads for a device backend (CPU_TAIL, the
 * split host read): the cpu backend's attention over the host pool, on host buffers the device
 * backend fills and reads. */
#include "worker/attn_route.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "worker/backend_impl.h"
#include "worker/cpu/cpu_backend.h"

struct attn_route {
    uint32_t n_threads;
    struct backend *cpu;   /* started at the first call */
    struct kv_layout l;    /* the pools set_kv gave, until the cpu backend starts */
    struct kv_pools pools; /* (the device pool's address only bounds block indices) */
    int have_kv, cpu_kv;   /* pools given; given to cpu */
    struct be_host_attend host;
};

/* a host array as an f32 tensor of the cpu backend (its ops read the handle's fields only) */
static struct be_tensor host_tensor(float *p, uint32_t rows, uint32_t cols)
{
    return (struct be_tensor){BE_F32, rows, cols, (size_t)cols * 4, (size_t)rows * cols * 4, p};
}

static int route_attend(void *ctx, const struct be_batch *b, uint32_t layer, const float *q,
                        const struct be_attn *at, float *o, float *m, float *l)
{
    struct attn_route *r = ctx;
    int rc;
    if (!r->have_kv)
        return RKV_EINVAL;
    if (!r->cpu && (rc = cpu_backend_create(r->n_threads, &r->cpu)) < 0)
        return rc;
    if (!r->cpu_kv) {
        if ((rc = backend_set_kv(r->cpu, &r->l, &r->pools)) < 0)
            return rc;
        r->cpu_kv = 1;
    }
    const uint32_t n = b->n_tokens, qd = at->n_head * at->head_dim;
    struct be_tensor tq = host_tensor((float *)q, n, qd), to = host_tensor(o, n, qd),
                     tm = host_tensor(m, n, at->n_head), tl = host_tensor(l, n, at->n_head);
    const struct be_partial part = {&to, &tm, &tl};
    return attn_partial_forward(r->cpu, b, layer, KV_HOST, &tq, at, &part);
}

int attn_route_create(uint32_t n_threads, struct attn_route **out)
{
    struct attn_route *r = calloc(1, sizeof(*r));
    if (!r)
        return RKV_ENOMEM;
    r->n_threads = n_threads;
    r->host = (struct be_host_attend){route_attend, r};
    *out = r;
    return 0;
}

void attn_route_destroy(struct attn_route *r)
{
    if (!r)
        return;
    backend_destroy(r->cpu);
    free(r);
}

int attn_route_set_kv(struct attn_route *r, const struct kv_layout *l, const struct kv_pools *p)
{
    r->l = *l;
    r->pools = *p;
    r->have_kv = 1;
    r->cpu_kv = 0;
    /* the cpu backend's view of the old pools ends here; it takes the new ones at its next
     * call (none is in flight: the device backend's set_kv waited for its work) */
    if (r->cpu) {
        const int rc = backend_set_kv(r->cpu, l, p);
        if (rc < 0)
            return rc;
        r->cpu_kv = 1;
    }
    return 0;
}

const struct be_host_attend *attn_route_host(struct attn_route *r)
{
    return &r->host;
}
