/* backend.c - backend selection (auto|cpu|cuda) and the op entry points over the vtable. */
#include "worker/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/quant.h"
#include "worker/attn_route.h"
#include "worker/backend_impl.h"
#include "worker/cpu/cpu_backend.h"
#ifdef RKV_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

int backend_wrap(const char *name, const struct backend_i *iface, void *ctx, struct backend **out)
{
    struct backend *be = calloc(1, sizeof(*be));
    if (!be)
        return RKV_ENOMEM;
    snprintf(be->name, sizeof(be->name), "%s", name);
    be->iface = iface;
    be->ctx = ctx;
    *out = be;
    return 0;
}

void backend_destroy(struct backend *be)
{
    if (!be)
        return;
    be->iface->destroy(be->ctx); /* first: its host functions may still call the router */
    attn_route_destroy(be->route);
    free(be);
}

#ifdef RKV_CUDA
/* a device backend that sends host blocks to cpu threads gets the worker's router for them */
static int attach_route(struct backend *be, uint32_t n_threads)
{
    if (!be->iface->set_host_attend)
        return 0;
    int rc = attn_route_create(n_threads, &be->route);
    if (rc == 0)
        rc = be->iface->set_host_attend(be->ctx, attn_route_host(be->route));
    return rc;
}
#endif

const char *backend_name(const struct backend *be)
{
    return be->name;
}

/* cuda when asked for (forced) or allowed (auto); 1 = started, 0 = not
 * available and auto may fall back, <0 = error for a forced cuda */
static int start_cuda(const struct backend_opts *o, int forced, struct backend **out, char *errbuf,
                      size_t errlen)
{
#ifdef RKV_CUDA
    int n = rkv_cuda_backend_probe();
    if (n <= 0) {
        if (forced) {
            snprintf(errbuf, errlen,
                     "backend cuda: no CUDA device found (driver missing or no GPU); "
                     "use --backend cpu or auto");
            return RKV_ENODEV;
        }
        log_info("backend: no CUDA device found, using the cpu backend");
        return 0;
    }
    int rc = rkv_cuda_backend_create(o, out);
    if (rc == 0 && (rc = attach_route(*out, o->n_threads)) < 0) {
        backend_destroy(*out);
        *out = NULL;
    }
    if (rc < 0) {
        if (forced) {
            snprintf(errbuf, errlen, "backend cuda: cannot start on gpu %d: %s", o->gpu,
                     rkv_strerror(rc));
            return rc;
        }
        log_warn("backend: cuda backend unavailable (%s), using the cpu backend", rkv_strerror(rc));
        return 0;
    }
    return 1;
#else
    (void)o;
    (void)out;
    if (forced) {
        snprintf(errbuf, errlen,
                 "backend cuda: this build has no CUDA support (built with CUDA=0); "
                 "use --backend cpu or auto");
        return RKV_EUNSUPPORTED;
    }
    log_info("backend: built without CUDA, using the cpu backend");
    return 0;
#endif
}

int backend_create(const struct backend_opts *o, struct backend **out, char *errbuf, size_t errlen)
{
    static const struct backend_opts defaults = {"auto", 0, 0};
    char dummy[8];
    if (!o)
        o = &defaults;
    if (!errbuf) {
        errbuf = dummy;
        errlen = sizeof(dummy);
    }
    errbuf[0] = '\0';
    const char *kind = o->kind ? o->kind : "auto";
    int want_cpu = !strcmp(kind, "cpu");
    int want_cuda = !strcmp(kind, "cuda");
    if (!want_cpu && !want_cuda && strcmp(kind, "auto")) {
        snprintf(errbuf, errlen, "backend: unknown backend '%s' (auto, cpu, cuda)", kind);
        return RKV_EINVAL;
    }
    if (!want_cpu) {
        int rc = start_cuda(o, want_cuda, out, errbuf, errlen);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
    int rc = cpu_backend_create(o->n_threads, out);
    if (rc < 0)
        snprintf(errbuf, errlen, "backend cpu: cannot start: %s", rkv_strerror(rc));
    return rc;
}

size_t be_type_size(enum be_type t, size_t n)
{
    return quant_row_bytes((uint32_t)t, n);
}

const char *be_type_name(enum be_type t)
{
    const char *n = quant_name((uint32_t)t);
    return n ? n : "unknown";
}

uint32_t be_type_block(enum be_type t)
{
    return quant_block_values((uint32_t)t);
}

int backend_reads_weights(const struct backend *be, enum be_type t)
{
    if ((unsigned)t >= 64 || !quant_supported((uint32_t)t))
        return 0;
    return (int)(((BE_TYPES_BASE | be->iface->weight_types) >> t) & 1);
}

int backend_rope_freq_factors(const struct backend *be)
{
    return be->iface->rope_freq_factors;
}

int backend_rope_mscale(const struct backend *be)
{
    return be->iface->rope_mscale;
}

const char *backend_missing_op(const struct backend *be, unsigned needs)
{
    const struct backend_i *i = be->iface;
    if ((needs & BE_NEED_HEAD_NORM) && !i->rmsnorm_heads)
        return "rmsnorm_heads";
    if ((needs & BE_NEED_GELU) && !i->gelu_mul)
        return "gelu_mul";
    if ((needs & BE_NEED_SCALE) && !i->scale)
        return "scale";
    if ((needs & BE_NEED_ATTN_WINDOW) && !i->attn_window)
        return "attn_window";
    return NULL;
}

void backend_weight_types(const struct backend *be, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (unsigned t = 0; t < 64 && n < len; t++)
        if (backend_reads_weights(be, (enum be_type)t))
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", be_type_name(t));
}
