/* gpu_trace.c - kernel activity records from CUPTI (see gpu_trace.h). libcupti comes with the
 * CUDA toolkit; it is opened with dlopen so the programs need it only when a trace is asked
 * for. */
#include "tests/gpu/gpu_trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<cupti_activity.h>)
#define GT_CUPTI 1
#endif
#endif

#ifdef GT_CUPTI
#include <cupti_activity.h>
#include <dlfcn.h>

struct gt_kernel {
    uint64_t start, end;
    int32_t grid, block;
    char name[96];
};

/* a memory copy's record */
struct gt_copy {
    uint64_t start, end, bytes;
    uint32_t stream;
    uint8_t kind; /* CUpti_ActivityMemcpyKind */
};

static struct {
    void *lib;
    CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush)(uint32_t);
    CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*errstr)(CUptiResult, const char **);
    struct gt_kernel *k;
    size_t n, cap;
    struct gt_copy *c;
    size_t nc, ccap;
    int registered, overflow, copies;
} gt;

#define GT_BUF (8u << 20)

static void CUPTIAPI gt_request(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, GT_BUF);
    *size = *buf ? GT_BUF : 0;
    *max_records = 0;
}

/* the kernel name without its parameter list (and a template's arguments kept short) */
static void gt_short_name(char *dst, size_t len, const char *name)
{
    size_t i = 0;
    for (; name && name[i] && name[i] != '(' && i + 1 < len; i++)
        dst[i] = name[i];
    dst[i] = 0;
}

/* room for one more record of elem bytes in *arr (n used of *cap); 0, or -1 (overflow marked) */
static int gt_room(void **arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? 2 * *cap : 1024;
    void *p = realloc(*arr, c * elem);
    if (!p) {
        gt.overflow = 1;
        return -1;
    }
    *arr = p;
    *cap = c;
    return 0;
}

static void CUPTIAPI gt_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                 size_t valid)
{
    CUpti_Activity *r = NULL;
    while (gt.next(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            if (gt_room((void **)&gt.c, gt.nc, &gt.ccap, sizeof(*gt.c)) == 0)
                gt.c[gt.nc++] =
                    (struct gt_copy){m->start, m->end, m->bytes, m->streamId, m->copyKind};
            continue;
        }
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            r->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (gt_room((void **)&gt.k, gt.n, &gt.cap, sizeof(*gt.k)) < 0)
            continue;
        struct gt_kernel *o = &gt.k[gt.n++];
        o->start = k->start;
        o->end = k->end;
        o->grid = k->gridX * k->gridY * k->gridZ;
        o->block = k->blockX * k->blockY * k->blockZ;
        gt_short_name(o->name, sizeof(o->name), k->name);
    }
    free(buf);
}

static int gt_fail(const char *what, CUptiResult r)
{
    const char *s = "?";
    if (gt.errstr)
        gt.errstr(r, &s);
    fprintf(stderr, "gpu-trace: %s: %s\n", what, s);
    return -1;
}

int gt_begin(void)
{
    if (!gt.lib) {
        gt.lib = dlopen("libcupti.so.13", RTLD_NOW);
        if (!gt.lib)
            gt.lib = dlopen("libcupti.so", RTLD_NOW);
        if (!gt.lib) {
            fprintf(stderr,
                    "gpu-trace: cannot load libcupti (%s): put the CUDA toolkit's "
                    "targets/x86_64-linux/lib (or extras/CUPTI/lib64) on LD_LIBRARY_PATH\n",
                    dlerror());
            return -1;
        }
        *(void **)&gt.reg = dlsym(gt.lib, "cuptiActivityRegisterCallbacks");
        *(void **)&gt.enable = dlsym(gt.lib, "cuptiActivityEnable");
        *(void **)&gt.disable = dlsym(gt.lib, "cuptiActivityDisable");
        *(void **)&gt.flush = dlsym(gt.lib, "cuptiActivityFlushAll");
        *(void **)&gt.next = dlsym(gt.lib, "cuptiActivityGetNextRecord");
        *(void **)&gt.errstr = dlsym(gt.lib, "cuptiGetResultString");
        if (!gt.reg || !gt.enable || !gt.disable || !gt.flush || !gt.next) {
            fprintf(stderr, "gpu-trace: libcupti lacks the activity api\n");
            dlclose(gt.lib);
            gt.lib = NULL;
            return -1;
        }
    }
    CUptiResult r;
    if (!gt.registered) {
        if ((r = gt.reg(gt_request, gt_complete)) != CUPTI_SUCCESS)
            return gt_fail("cuptiActivityRegisterCallbacks", r);
        gt.registered = 1;
    }
    gt.n = 0;
    gt.nc = 0;
    gt.overflow = 0;
    /* concurrent kernel records do not serialize the kernels (KIND_KERNEL would) */
    if ((r = gt.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) != CUPTI_SUCCESS)
        return gt_fail("cuptiActivityEnable", r);
    if (gt.copies && (r = gt.enable(CUPTI_ACTIVITY_KIND_MEMCPY)) != CUPTI_SUCCESS) {
        gt.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        gt.copies = 0;
        return gt_fail("cuptiActivityEnable (memcpy)", r);
    }
    return 0;
}

int gt_begin_copies(void)
{
    gt.copies = 1;
    int rc = gt_begin();
    if (rc < 0)
        gt.copies = 0;
    return rc;
}

static int gt_copy_by_start(const void *a, const void *b)
{
    const struct gt_copy *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static const char *gt_copy_kind(uint8_t k)
{
    switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "other";
    }
}

/* the copies apart from the kernels: per direction and stream their count, bytes, the union
 * of their intervals (the engine busy) and the rate over it, and when the first began and the
 * last ended from t0 */
static void gt_copies(FILE *out, FILE *csv, const char *label, uint64_t t0)
{
    qsort(gt.c, gt.nc, sizeof(*gt.c), gt_copy_by_start);
    /* (kind, stream) groups, at most 16 listed */
    struct {
        uint8_t kind;
        uint32_t stream;
        size_t n;
        uint64_t bytes, busy, cover, first, last;
    } g[16];
    size_t ng = 0;
    for (size_t i = 0; i < gt.nc; i++) {
        const struct gt_copy *c = &gt.c[i];
        size_t j = 0;
        while (j < ng && (g[j].kind != c->kind || g[j].stream != c->stream))
            j++;
        if (j == ng) {
            if (ng == 16)
                continue;
            g[ng].kind = c->kind;
            g[ng].stream = c->stream;
            g[ng].n = 0;
            g[ng].bytes = g[ng].busy = 0;
            g[ng].cover = g[ng].first = c->start;
            g[ng].last = c->end;
            ng++;
        }
        g[j].n++;
        g[j].bytes += c->bytes;
        if (c->end > g[j].cover) {
            g[j].busy += c->end - (c->start > g[j].cover ? c->start : g[j].cover);
            g[j].cover = c->end;
        }
        if (c->end > g[j].last)
            g[j].last = c->end;
    }
    fprintf(out, "    copies: %zu\n", gt.nc);
    for (size_t j = 0; j < ng; j++)
        fprintf(out,
                "      %-5s stream %-4u %6zu copies %10.2f MB, busy %9.1f us (%.1f GB/s), "
                "from %.1f to %.1f us\n",
                gt_copy_kind(g[j].kind), g[j].stream, g[j].n, g[j].bytes / 1e6, g[j].busy / 1e3,
                g[j].busy ? (double)g[j].bytes / (double)g[j].busy : 0.0,
                ((double)g[j].first - (double)t0) / 1e3, ((double)g[j].last - (double)t0) / 1e3);
    if (csv)
        for (size_t i = 0; i < gt.nc; i++)
            fprintf(csv, "%s,c%zu,%.3f,%.3f,0,%llu,0,\"memcpy %s\"\n", label, i,
                    ((double)gt.c[i].start - (double)t0) / 1e3,
                    (double)(gt.c[i].end - gt.c[i].start) / 1e3, (unsigned long long)gt.c[i].bytes,
                    gt_copy_kind(gt.c[i].kind));
}

static int gt_by_start(const void *a, const void *b)
{
    const struct gt_kernel *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

struct gt_sum {
    const char *name;
    int n;
    double us, gap_us;
};

static int gt_by_time(const void *a, const void *b)
{
    const struct gt_sum *x = a, *y = b;
    return x->us < y->us ? 1 : x->us > y->us ? -1 : 0;
}

int gt_end(const char *label, FILE *out, FILE *csv, int first, int n_show)
{
    if (!gt.lib)
        return -1;
    gt.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (gt.copies)
        gt.disable(CUPTI_ACTIVITY_KIND_MEMCPY);
    gt.flush(1 /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED */);
    const int copies = gt.copies;
    gt.copies = 0;
    const size_t n = gt.n;
    if (n == 0) {
        fprintf(out, "  trace %s: no kernel records\n", label);
        return 0;
    }
    qsort(gt.k, n, sizeof(*gt.k), gt_by_start);
    /* gap before kernel i: its start after the latest end so far (negative: it overlapped) */
    struct gt_sum *s = calloc(n, sizeof(*s));
    double *gap = calloc(n, sizeof(*gap));
    if (!s || !gap) {
        free(s);
        free(gap);
        return -1;
    }
    const uint64_t t0 = gt.k[0].start;
    uint64_t last_end = gt.k[0].start, busy = 0, cover_to = gt.k[0].start;
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        const struct gt_kernel *k = &gt.k[i];
        gap[i] = i ? ((double)k->start - (double)last_end) / 1e3 : 0.0;
        /* busy: the union of the kernels' intervals */
        if (k->end > cover_to) {
            busy += k->end - (k->start > cover_to ? k->start : cover_to);
            cover_to = k->end;
        }
        if (k->end > last_end)
            last_end = k->end;
        size_t j = 0;
        while (j < ns && strcmp(s[j].name, k->name))
            j++;
        if (j == ns)
            s[ns++].name = k->name;
        s[j].n++;
        s[j].us += (double)(k->end - k->start) / 1e3;
        s[j].gap_us += gap[i];
    }
    const double span = (double)(last_end - t0) / 1e3;
    fprintf(out,
            "  trace %s: %zu kernels%s, span %.1f us, some kernel running %.1f us (%.3f), "
            "none %.1f us\n",
            label, n, gt.overflow ? " (records lost)" : "", span, busy / 1e3,
            span > 0 ? busy / 1e3 / span : 0.0, span - busy / 1e3);
    qsort(s, ns, sizeof(*s), gt_by_time);
    fprintf(out, "    %10s %6s %9s %12s  kernel\n", "us total", "n", "us each", "gaps us");
    for (size_t j = 0; j < ns; j++)
        fprintf(out, "    %10.1f %6d %9.2f %12.1f  %.70s\n", s[j].us, s[j].n, s[j].us / s[j].n,
                s[j].gap_us, s[j].name);
    if (first < 0)
        first = (int)(n / 2);
    if (n_show > 0 && (size_t)first < n) {
        fprintf(out, "    kernels %d..%d in order: start us, duration us, gap us, grid x block\n",
                first, first + n_show - 1);
        for (size_t i = (size_t)first; i < n && i < (size_t)(first + n_show); i++)
            fprintf(out, "      %9.1f %8.2f %7.2f %6d x %-4d %.60s\n",
                    (double)(gt.k[i].start - t0) / 1e3, (double)(gt.k[i].end - gt.k[i].start) / 1e3,
                    gap[i], gt.k[i].grid, gt.k[i].block, gt.k[i].name);
    }
    if (csv) {
        if (ftell(csv) == 0)
            fprintf(csv, "label,index,start_us,duration_us,gap_us,grid,block,kernel\n");
        for (size_t i = 0; i < n; i++)
            fprintf(csv, "%s,%zu,%.3f,%.3f,%.3f,%d,%d,\"%s\"\n", label, i,
                    (double)(gt.k[i].start - t0) / 1e3, (double)(gt.k[i].end - gt.k[i].start) / 1e3,
                    gap[i], gt.k[i].grid, gt.k[i].block, gt.k[i].name);
    }
    if (copies)
        gt_copies(out, csv, label, t0);
    free(s);
    free(gap);
    return (int)n;
}

#else /* no CUPTI headers where this was built */

int gt_begin(void)
{
    fprintf(stderr, "gpu-trace: built without CUPTI's headers (cupti_activity.h): no traces\n");
    return -1;
}

int gt_begin_copies(void)
{
    return gt_begin();
}

int gt_end(const char *label, FILE *out, FILE *csv, int first, int n)
{
    return -1;
}

#endif
