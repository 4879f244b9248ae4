/* gpu_bench.c - attention, decode and prefill benchmarks against ceilings measured in the same run
 * (json out). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "tests/gpu/gpu_model.h"
#include "tests/gpu/gpu_trace.h"
#include "worker/backend.h"
#include "worker/backend_impl.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/tuning.h"
#include "worker/forward.h"
#include "worker/pool.h"
#include "worker/rates.h"
#include "worker/tail_policy.h"

static struct rkv_cuda_ceilings ceil_;
static FILE *js;
static int js_first = 1;

/* env RKV_PROFILE_TRACE=DIR: one more step of each resident decode case traced by CUPTI (the
 * kernels as they run, graphs and programmatic launches included), and the last chunk of each
 * 32k prefill with its copies: a summary printed, every kernel (and copy) in DIR/trace.csv */
static FILE *trace_csv;
static int trace_on;

/* the worker's buffers for a step's outputs (worker/main.c: pinned) */
struct dec_bufs {
    float *logits;
    int32_t *ids;
    float *lps;
};

/* one decode step as the worker runs greedy rows: the pick on the device, ids back */
static int dec_step(struct fwd *f, const struct fwd_seq *seqs, uint32_t n, const struct dec_bufs *d)
{
    int used = 0;
    return fwd_step_greedy(f, seqs, n, d->logits, d->ids, d->lps, &used);
}

/* rows sampled at temperature 0.8, top_p 0.95 as the worker samples them on a gpu: the
 * pick where the logits are (fwd_sample), sampler_dev_finish here; a row the device gives
 * back is sampled here from its logits */
#define DS_MAX 64
struct dev_samp {
    struct sampler *s[DS_MAX];
    struct sample_dev_row rows[DS_MAX];
    const struct sample_dev_row *rp[DS_MAX];
    struct sample_dev_out outs[DS_MAX];
    uint8_t want[DS_MAX];
    int32_t pen[2];
    uint32_t back;     /* rows given back to the host, summed */
    struct pool *pool; /* the host's sampling threads (mode 3) */
    const float *logits;
    int32_t n_vocab;
};

static void host_samp_rows(void *arg, uint32_t begin, uint32_t end, uint32_t thread)
{
    struct dev_samp *ds = arg;
    (void)thread;
    for (uint32_t i = begin; i < end; i++) {
        float lp;
        sampler_sample(ds->s[i], ds->logits + (size_t)i * ds->n_vocab, &lp, NULL);
    }
}

/* the same rows sampled as the worker samples them without the device: every logit to the
 * host, then the rows' samplers on a pool of threads */
static int host_samp_step(struct fwd *f, const struct fwd_seq *seqs, uint32_t n,
                          struct dev_samp *ds, float *logits, int32_t n_vocab)
{
    int rc = fwd_step(f, seqs, n, 0, logits);
    if (rc == 0) {
        ds->logits = logits;
        ds->n_vocab = n_vocab;
        pool_run(ds->pool, host_samp_rows, ds, n, 1);
    }
    return rc;
}

static int dev_samp_init(struct dev_samp *ds, uint32_t n, int32_t n_vocab)
{
    memset(ds, 0, sizeof(*ds));
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    for (uint32_t i = 0; i < n && i < DS_MAX; i++) {
        p.seed = 77 + i;
        if (sampler_create(&ds->s[i], &p, n_vocab))
            return RKV_ENOMEM;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return pool_create(&ds->pool, cpus > 16 ? 16 : cpus > 0 ? (uint32_t)cpus : 1);
}

static void dev_samp_fini(struct dev_samp *ds)
{
    for (int i = 0; i < DS_MAX; i++)
        sampler_destroy(ds->s[i]);
    if (ds->pool)
        pool_destroy(ds->pool);
}

static int dev_samp_step(struct fwd *f, const struct fwd_seq *seqs, uint32_t n, struct dev_samp *ds,
                         float *logits, int32_t n_vocab)
{
    int rc = fwd_step_keep(f, seqs, n), used = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        sampler_dev_row(ds->s[i], &ds->rows[i], ds->pen, ds->pen + 1, 1);
        ds->rp[i] = &ds->rows[i];
    }
    if (rc == 0)
        rc = fwd_sample(f, n, ds->rp, ds->outs, ds->want, logits, &used);
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        float lp;
        if (used && ds->outs[i].status == 0) {
            sampler_dev_finish(ds->s[i], &ds->outs[i], &lp, NULL);
        } else {
            sampler_sample(ds->s[i], logits + (size_t)i * n_vocab, &lp, NULL);
            ds->back++;
        }
    }
    return rc;
}

/* seconds a decode step of seqs takes over `steps` steps: greedy (dec_step), sampled (1: every
 * logit to the host, as the worker's samplers read them, not sampled; 2: sampled on the
 * device, dev_samp_step; 3: sampled on the host, host_samp_step); *rc: the first failure */
static double time_steps(struct fwd *f, const struct fwd_seq *seqs, uint32_t n, int steps,
                         const struct dec_bufs *d, int sampled, struct dev_samp *ds,
                         int32_t n_vocab, int *rc)
{
    double t0 = gu_now();
    for (int i = 0; i < steps && *rc == 0; i++)
        *rc = sampled == 3   ? host_samp_step(f, seqs, n, ds, d->logits, n_vocab)
              : sampled == 2 ? dev_samp_step(f, seqs, n, ds, d->logits, n_vocab)
              : sampled == 1 ? fwd_step(f, seqs, n, 0, d->logits)
                             : dec_step(f, seqs, n, d);
    return (gu_now() - t0) / steps;
}

/* two more decode steps of seqs traced under label (dec_step synchronizes: its ids are read
 * back), so the trace shows the gpu's idle time between steps too; 0 or the first rc */
static int trace_step(const char *label, struct fwd *f, const struct fwd_seq *seqs, uint32_t n,
                      const struct dec_bufs *d)
{
    if (!trace_on || gt_begin() < 0)
        return 0;
    int rc = dec_step(f, seqs, n, d);
    if (rc == 0)
        rc = dec_step(f, seqs, n, d);
    gt_end(label, stdout, trace_csv, -1, 16);
    return rc;
}

/* the RKV_* settings in the environment as json members ("NAME": "VALUE", ...), so an a/b
 * run's file says which variant it was (device-ab.sh sets them per run) */
static void json_env(FILE *f)
{
    extern char **environ;
    int first = 1;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "RKV_", 4) || !eq)
            continue;
        fprintf(f, "%s\"%.*s\": \"", first ? "" : ", ", (int)(eq - *e), *e);
        for (const char *c = eq + 1; *c; c++) {
            if (*c == '"' || *c == '\\')
                fprintf(f, "\\%c", *c);
            else if ((unsigned char)*c < 0x20)
                fprintf(f, "\\u%04x", (unsigned char)*c);
            else
                fputc(*c, f);
        }
        fputc('"', f);
        first = 0;
    }
}

/* the quant suite: the weights' type (g_wt; g_more for attn_v, ffn_down and output), its name
 * in front of every record, and which rows run (0 all, 1 the type's marks: b=1 at 4k and
 * prefill 4k, 2 also 32k with 0 and 90 % of the kv on host, b=8 and 64, prefill 32k) */
static enum be_type g_wt = BE_BF16, g_more = BE_BF16;
static const char *g_tag = "";
/* --kv-dtype: the KV element type of the attention and model suites (f16 unless asked) */
static enum kv_dtype g_kv = KV_F16;
static int g_qrows;

/* one json record per measurement, printed as a table row too */
static void record(const char *suite, const char *tagless, double value, const char *unit,
                   double bound, double ratio)
{
    char name[160];
    snprintf(name, sizeof(name), "%s%s%s", g_tag, *g_tag ? " " : "", tagless);
    printf("  %-8s %-44s %10.2f %-6s bound %10.2f ratio %.3f\n", suite, name, value, unit, bound,
           ratio);
    if (js) {
        fprintf(js,
                "%s\n  {\"suite\": \"%s\", \"name\": \"%s\", \"value\": %.4f, \"unit\": \"%s\", "
                "\"bound\": %.4f, \"ratio\": %.4f}",
                js_first ? "" : ",", suite, name, value, unit, bound, ratio);
        js_first = 0;
    }
}

/* f16 kv in host memory: valid, non-zero values without a slow generator */
static void host_fill_f16(void *p, size_t bytes, uint64_t seed)
{
    uint16_t *h = p;
    uint64_t s = seed | 1;
    for (size_t i = 0; i < bytes / 2; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint16_t)((s >> 48) & 0xbbff); /* |x| < 1, either sign */
    }
}

/* --- attention: one llama3-8b layer, resident vs host vs split ------------ */

struct attn_bench {
    struct backend *be;
    struct kv_layout l;
    struct kv_pools p;
    struct be_tensor *q, *o[2], *m[2], *lse[2];
    struct be_attn at;
};

static double time_attn(struct attn_bench *ab, const struct be_batch *b, int do_dev, int do_host,
                        int reps)
{
    struct be_partial pd = {ab->o[0], ab->m[0], ab->lse[0]}, ph = {ab->o[1], ab->m[1], ab->lse[1]};
    double best = 1e30;
    for (int round = 0; round < 3; round++) {
        backend_sync(ab->be);
        double t0 = gu_now();
        for (int r = 0; r < reps; r++) {
            if (do_dev)
                attn_partial_forward(ab->be, b, 0, KV_DEVICE, ab->q, &ab->at, &pd);
            if (do_host)
                attn_partial_forward(ab->be, b, 0, KV_HOST, ab->q, &ab->at, &ph);
            if (do_dev && do_host)
                attn_merge_forward(ab->be, &pd, &ph, b->n_tokens, &ab->at);
        }
        backend_sync(ab->be);
        double t = (gu_now() - t0) / reps;
        best = t < best ? t : best;
    }
    return best;
}

/* the decode suite's host pool: anonymous memory (transparent huge pages where the kernel gives
 * them), or with RKV_BENCH_SHM=1 a POSIX shared memory mapping as kvmgr's pool is (tmpfs: 4 KiB
 * pages unless /dev/shm is mounted huge=), so the two can be compared under the same copies */
static int shm_pool;
static size_t shm_bytes;

static void *host_pool_alloc(size_t bytes)
{
    const char *e = getenv("RKV_BENCH_SHM");
    if (!e || strcmp(e, "1") != 0)
        return aligned_alloc(4096, bytes);
    char name[64];
    snprintf(name, sizeof name, "/rkv-bench-%d", (int)getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return NULL;
    shm_unlink(name);
    void *p = ftruncate(fd, (off_t)bytes) == 0
                  ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    shm_pool = 1;
    shm_bytes = bytes;
    printf("  host pool: %zu bytes of POSIX shared memory (RKV_BENCH_SHM=1)\n", bytes);
    return p;
}

static void host_pool_free(void *p)
{
    if (shm_pool)
        munmap(p, shm_bytes);
    else
        free(p);
}

static int bench_attention(struct backend *be, int quick)
{
    struct attn_bench ab = {be};
    const uint32_t B = 256, n_kv = 8, D = 128, H = 32;
    kv_layout_init(&ab.l, B, 1, n_kv, D, g_kv);
    const uint32_t max_ctx = quick ? 32768 : 131072, n_seq_max = 64;
    uint32_t nb = max_ctx / B > 16 * n_seq_max ? max_ctx / B : 16 * n_seq_max;
    size_t bytes = (size_t)nb * kv_block_bytes(&ab.l);
    void *dev = NULL, *host = aligned_alloc(4096, bytes);
    if (!host || rkv_cuda_dev_alloc(0, bytes, &dev) < 0)
        return -1;
    rkv_cuda_fill_random(dev, BE_F16, bytes / 2, 3, 1.0f);
    host_fill_f16(host, bytes, 5);
    ab.p = (struct kv_pools){{dev, host}, {nb, nb}};
    if (backend_set_kv(be, &ab.l, &ab.p) < 0)
        return -1;
    ab.at = (struct be_attn){H, n_kv, D, 1.0f / sqrtf((float)D)};
    backend_tensor_alloc(be, BE_F32, n_seq_max, H * D, &ab.q);
    for (int r = 0; r < 2; r++) {
        backend_tensor_alloc(be, BE_F32, n_seq_max, H * D, &ab.o[r]);
        backend_tensor_alloc(be, BE_F32, n_seq_max, H, &ab.m[r]);
        backend_tensor_alloc(be, BE_F32, n_seq_max, H, &ab.lse[r]);
    }
    float *qh = malloc(sizeof(float) * n_seq_max * H * D);
    struct gu_rng rng;
    gu_seed(&rng, 9);
    gu_fill(&rng, qh, (size_t)n_seq_max * H * D, 1.0f);
    backend_tensor_set(be, ab.q, qh, 0, sizeof(float) * n_seq_max * H * D);
    free(qh);
    const double hbm = ceil_.hbm_read * 1e9;
    /* pcie: the faster of the two ways host bytes reach the gpu */
    const double pcie =
        (ceil_.zero_copy > ceil_.h2d_pinned ? ceil_.zero_copy : ceil_.h2d_pinned) * 1e9;
    struct kv_block_ref *tab = malloc(sizeof(*tab) * nb);
    /* 512: the step is nearly all weights, so its gap to 4k is what 4k's attention costs */
    uint32_t ctxs[] = {512, 4096, 32768, 131072};
    for (size_t ci = 0; ci < sizeof(ctxs) / sizeof(ctxs[0]); ci++) {
        uint32_t ctx = ctxs[ci];
        if (ctx > max_ctx)
            continue;
        uint32_t n = ctx / B;
        double kv_bytes = (double)ctx * n_kv * kv_row_bytes(&ab.l) * 2; /* k and v */
        int32_t pos = (int32_t)ctx - 1;
        uint32_t seq_of = 0;
        struct be_seq s = {0, 1, ctx - 1, tab, n};
        struct be_batch b = {&s, 1, 1, &pos, &seq_of};
        int reps = ctx >= 131072 ? 10 : 50;
        char name[96];
        /* resident */
        for (uint32_t j = 0; j < n; j++)
            tab[j] = (struct kv_block_ref){j, KV_DEVICE};
        double t_res = time_attn(&ab, &b, 1, 0, reps);
        snprintf(name, sizeof(name), "resident ctx=%u (GB/s vs hbm read)", ctx);
        record("attn", name, kv_bytes / t_res / 1e9, "GB/s", hbm / 1e9, kv_bytes / t_res / hbm);
        /* all host, zero-copy */
        for (uint32_t j = 0; j < n; j++)
            tab[j] = (struct kv_block_ref){j, KV_HOST};
        double t_host = time_attn(&ab, &b, 0, 1, ctx >= 131072 ? 3 : 10);
        snprintf(name, sizeof(name), "host ctx=%u (GB/s vs pcie ceiling)", ctx);
        record("attn", name, kv_bytes / t_host / 1e9, "GB/s", pcie / 1e9, kv_bytes / t_host / pcie);
        /* split: the last 1/8 of the blocks on device, the rest on host; the
         * overlapped step against max(resident part, host part) */
        uint32_t n_dev = n / 8 ? n / 8 : 1;
        for (uint32_t j = 0; j < n; j++)
            tab[j] = (struct kv_block_ref){j, j >= n - n_dev ? KV_DEVICE : KV_HOST};
        double t_d = time_attn(&ab, &b, 1, 0, reps), t_h = time_attn(&ab, &b, 0, 1, 3);
        double t_both = time_attn(&ab, &b, 1, 1, 3);
        double mx = t_d > t_h ? t_d : t_h;
        snprintf(name, sizeof(name), "split 1/8 dev ctx=%u step ms (vs max parts)", ctx);
        record("attn", name, t_both * 1e3, "ms", mx * 1e3, mx / t_both);
        /* half and half: device time comparable to nothing, shows overlap sum */
        for (uint32_t j = 0; j < n; j++)
            tab[j] = (struct kv_block_ref){j, j % 2 ? KV_DEVICE : KV_HOST};
        t_d = time_attn(&ab, &b, 1, 0, reps);
        t_h = time_attn(&ab, &b, 0, 1, 3);
        t_both = time_attn(&ab, &b, 1, 1, 3);
        mx = t_d > t_h ? t_d : t_h;
        snprintf(name, sizeof(name), "split 1/2 ctx=%u step ms (vs max parts)", ctx);
        record("attn", name, t_both * 1e3, "ms", mx * 1e3, mx / t_both);
    }
    /* batch 64 x 4k, resident */
    {
        uint32_t S = n_seq_max, n = 4096 / B;
        struct be_seq seqs[64];
        int32_t pos[64];
        uint32_t seq_of[64];
        for (uint32_t s = 0; s < S; s++) {
            for (uint32_t j = 0; j < n; j++)
                tab[s * n + j] = (struct kv_block_ref){s * n + j, KV_DEVICE};
            seqs[s] = (struct be_seq){s, 1, 4095, tab + s * n, n};
            pos[s] = 4095;
            seq_of[s] = s;
        }
        struct be_batch b = {seqs, S, S, pos, seq_of};
        double t = time_attn(&ab, &b, 1, 0, 20);
        double kv_bytes = (double)S * 4096 * n_kv * kv_row_bytes(&ab.l) * 2;
        record("attn", "resident batch=64 ctx=4096 (GB/s vs hbm)", kv_bytes / t / 1e9, "GB/s",
               hbm / 1e9, kv_bytes / t / hbm);
    }
    struct kv_pools none = {{NULL, NULL}, {0, 0}};
    backend_set_kv(be, &ab.l, &none);
    backend_tensor_free(be, ab.q);
    for (int r = 0; r < 2; r++) {
        backend_tensor_free(be, ab.o[r]);
        backend_tensor_free(be, ab.m[r]);
        backend_tensor_free(be, ab.lse[r]);
    }
    rkv_cuda_dev_free(dev);
    free(host);
    free(tab);
    return 0;
}

/* --- prefill matmuls: each linear of llama3-8b's layer (and the output) at prefill sizes, every
 * weight type, against the dense bf16 gemm ceiling of the run (a prefill linear should reach
 * 0.8 of it). Random weight bytes: the kernels' speed does not depend on the values */

static int bench_gemm(struct backend *be, int quick)
{
    static const struct {
        const char *name;
        uint32_t n_out, n_in;
    } sh[] = {{"qkv", 6144, 4096},
              {"o", 4096, 4096},
              {"gate_up", 28672, 4096},
              {"down", 4096, 14336},
              {"output", 128256, 4096}};
    static const enum be_type ty[] = {BE_BF16, BE_Q4_K, BE_Q5_K,  BE_Q6_K,
                                      BE_Q8_0, BE_Q4_0, BE_IQ4_XS};
    static const uint32_t ms[] = {2048, 4096}; /* rkvd's step; a long chunk */
    const uint32_t M = ms[1];
    if (ceil_.gemm_bf16 <= 0) {
        printf("  gemm: no dense bf16 gemm ceiling; skipped\n");
        return 0;
    }
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
        struct be_tensor *x = NULL, *y = NULL;
        if (backend_tensor_alloc(be, BE_F32, M, sh[si].n_in, &x) < 0 ||
            backend_tensor_alloc(be, BE_F32, M, sh[si].n_out, &y) < 0)
            return -1;
        rkv_cuda_fill_random(x->data, BE_F32, (size_t)M * sh[si].n_in, 2, 1.0f);
        for (size_t ti = 0; ti < sizeof ty / sizeof ty[0]; ti++) {
            if (quick && ti > 1)
                break; /* bf16 and q4_k */
            struct be_tensor *w = NULL;
            if (backend_tensor_alloc(be, ty[ti], sh[si].n_out, sh[si].n_in, &w) < 0)
                return -1;
            const double wbytes = (double)w->row_bytes * sh[si].n_out;
            if (ty[ti] == BE_BF16)
                rkv_cuda_fill_random(w->data, BE_BF16, (size_t)sh[si].n_out * sh[si].n_in, 1,
                                     0.02f);
            else
                rkv_cuda_fill_random(w->data, BE_F16, (size_t)(wbytes / 2), 3, 0.02f);
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const uint32_t m = ms[mi];
                const int reps = quick ? 3 : 10;
                /* untimed: the first product of a shape picks its kernels */
                matmul_forward(be, y, x, w, NULL, m);
                backend_sync(be);
                const double t0 = gu_now();
                for (int r = 0; r < reps; r++)
                    matmul_forward(be, y, x, w, NULL, m);
                backend_sync(be);
                const double t = (gu_now() - t0) / reps;
                const double tflops = 2.0 * m * sh[si].n_out * sh[si].n_in / t / 1e12;
                char name[96];
                snprintf(name, sizeof(name), "%s %s %ux%u m=%u (TFLOP/s vs dense bf16)",
                         be_type_name(ty[ti]), sh[si].name, sh[si].n_out, sh[si].n_in, m);
                record("gemm", name, tflops, "TFLOP/s", ceil_.gemm_bf16, tflops / ceil_.gemm_bf16);
                /* RKV_PROFILE_TRACE: one more product traced, its kernels by time (a block
                 * type's dequantization beside its gemms) */
                if (trace_on && m == M && gt_begin() == 0) {
                    matmul_forward(be, y, x, w, NULL, m);
                    backend_sync(be);
                    snprintf(name, sizeof(name), "trace gemm %s %s m=%u", be_type_name(ty[ti]),
                             sh[si].name, m);
                    gt_end(name, stdout, trace_csv, 0, 24);
                }
            }
            backend_tensor_free(be, w);
        }
        backend_tensor_free(be, x);
        backend_tensor_free(be, y);
    }
    return 0;
}

/* --- decode matmuls: weights streamed once, against the hbm ceiling ------- */

static int bench_gemv(struct backend *be)
{
    static const uint32_t shapes[][2] = {
        {4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
    for (int si = 0; si < 5; si++) {
        uint32_t n_out = shapes[si][0], n_in = shapes[si][1];
        struct be_tensor *w = NULL, *x = NULL, *y = NULL;
        if (backend_tensor_alloc(be, BE_BF16, n_out, n_in, &w) < 0 ||
            backend_tensor_alloc(be, BE_F32, 8, n_in, &x) < 0 ||
            backend_tensor_alloc(be, BE_F32, 8, n_out, &y) < 0)
            return -1;
        rkv_cuda_fill_random(w->data, BE_BF16, (size_t)n_out * n_in, 1, 0.02f);
        rkv_cuda_fill_random(x->data, BE_F32, (size_t)8 * n_in, 2, 1.0f);
        uint32_t ns[] = {1, 8};
        for (int ni = 0; ni < 2; ni++) {
            int reps = 50;
            matmul_forward(be, y, x, w, NULL, ns[ni]);
            backend_sync(be);
            double t0 = gu_now();
            for (int r = 0; r < reps; r++)
                matmul_forward(be, y, x, w, NULL, ns[ni]);
            backend_sync(be);
            double t = (gu_now() - t0) / reps, bytes = (double)n_out * n_in * 2;
            char name[96];
            snprintf(name, sizeof(name), "bf16 %ux%u n=%u (GB/s vs hbm)", n_out, n_in, ns[ni]);
            record("gemv", name, bytes / t / 1e9, "GB/s", ceil_.hbm_read,
                   bytes / t / 1e9 / ceil_.hbm_read);
        }
        backend_tensor_free(be, w);
        backend_tensor_free(be, x);
        backend_tensor_free(be, y);
    }
    /* the block formats' decode kernels over llama3-8b's shapes (their bytes random: the
     * kernels' speed does not depend on the values) */
    static const enum be_type qt[] = {BE_Q4_K, BE_Q6_K, BE_Q5_K, BE_Q4_0, BE_Q8_0, BE_IQ4_XS};
    for (size_t ti = 0; ti < sizeof qt / sizeof qt[0]; ti++)
        for (int si = 0; si < 4; si++) {
            const uint32_t n_out = shapes[si][0], n_in = shapes[si][1];
            struct be_tensor *w = NULL, *x = NULL, *y = NULL;
            if (backend_tensor_alloc(be, qt[ti], n_out, n_in, &w) < 0 ||
                backend_tensor_alloc(be, BE_F32, 8, n_in, &x) < 0 ||
                backend_tensor_alloc(be, BE_F32, 8, n_out, &y) < 0)
                return -1;
            const double bytes = (double)w->row_bytes * n_out;
            rkv_cuda_fill_random(w->data, BE_F16, (size_t)(bytes / 2), 3, 0.02f);
            rkv_cuda_fill_random(x->data, BE_F32, (size_t)8 * n_in, 2, 1.0f);
            const uint32_t ns[] = {1, 8};
            for (int ni = 0; ni < 2; ni++) {
                const int reps = 50;
                matmul_forward(be, y, x, w, NULL, ns[ni]);
                backend_sync(be);
                const double t0 = gu_now();
                for (int r = 0; r < reps; r++)
                    matmul_forward(be, y, x, w, NULL, ns[ni]);
                backend_sync(be);
                const double t = (gu_now() - t0) / reps;
                char name[96];
                snprintf(name, sizeof(name), "%s %ux%u n=%u (GB/s vs hbm)", be_type_name(qt[ti]),
                         n_out, n_in, ns[ni]);
                record("gemv", name, bytes / t / 1e9, "GB/s", ceil_.hbm_read,
                       bytes / t / 1e9 / ceil_.hbm_read);
            }
            backend_tensor_free(be, w);
            backend_tensor_free(be, x);
            backend_tensor_free(be, y);
        }
    return 0;
}

/* the fused decode linears of one llama3-8b layer (q/k/v and gate/up with the norm folded in,
 * o and down adding into the residual), 1 and 2 tokens: weight bytes read per second */
static int bench_linear(struct backend *be)
{
    static const struct {
        const char *name;
        enum be_lin_mode mode;
        uint32_t n_w, n_in, rows[3];
        int norm;
    } cases[] = {
        {"q/k/v +norm", BE_LIN_SET, 3, 4096, {4096, 1024, 1024}, 1},
        {"o +residual", BE_LIN_ADD, 1, 4096, {4096, 0, 0}, 0},
        {"gate/up +norm +silu", BE_LIN_SWIGLU, 2, 4096, {14336, 14336, 0}, 1},
        {"down +residual", BE_LIN_ADD, 1, 14336, {4096, 0, 0}, 0},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        struct be_tensor *w[3] = {0}, *out[3] = {0}, *x = NULL, *nw = NULL;
        const uint32_t n_in = cases[ci].n_in;
        double bytes = 0;
        int bad = backend_tensor_alloc(be, BE_F32, 2, n_in, &x) < 0 ||
                  backend_tensor_alloc(be, BE_F32, 1, n_in, &nw) < 0;
        for (uint32_t i = 0; i < cases[ci].n_w && !bad; i++) {
            uint32_t r = cases[ci].rows[i];
            bad = backend_tensor_alloc(be, BE_BF16, r, n_in, &w[i]) < 0 ||
                  backend_tensor_alloc(be, BE_F32, 2, r, &out[i]) < 0;
            if (!bad)
                rkv_cuda_fill_random(w[i]->data, BE_BF16, (size_t)r * n_in, 3 + i, 0.02f);
            bytes += (double)r * n_in * 2;
        }
        if (bad)
            return -1;
        rkv_cuda_fill_random(x->data, BE_F32, (size_t)2 * n_in, 2, 1.0f);
        rkv_cuda_fill_random(nw->data, BE_F32, n_in, 5, 1.0f);
        struct be_linear l = {
            cases[ci].mode, x, cases[ci].norm ? nw : NULL, 1e-5f, cases[ci].n_w, {0}, {0}, {0}};
        for (uint32_t i = 0; i < cases[ci].n_w; i++) {
            l.w[i] = w[i];
            l.out[i] = out[i];
        }
        for (uint32_t n = 1; n <= 2; n++) {
            const int reps = 100;
            if (linear_forward(be, &l, n) != 0)
                return -1;
            backend_sync(be);
            double t0 = gu_now();
            for (int r = 0; r < reps; r++)
                linear_forward(be, &l, n);
            backend_sync(be);
            double t = (gu_now() - t0) / reps;
            char name[96];
            snprintf(name, sizeof(name), "%s %ux%u n=%u (GB/s vs hbm)", cases[ci].name,
                     cases[ci].rows[0], n_in, n);
            record("linear", name, bytes / t / 1e9, "GB/s", ceil_.hbm_read,
                   bytes / t / 1e9 / ceil_.hbm_read);
        }
        for (uint32_t i = 0; i < 3; i++) {
            backend_tensor_free(be, w[i]);
            backend_tensor_free(be, out[i]);
        }
        backend_tensor_free(be, x);
        backend_tensor_free(be, nw);
    }
    return 0;
}

/* --- decode and prefill on a llama3-8b-shaped model ----------------------- */

/* decode: the decode cases; prefill: the prefill cases (4k, and 16k, 32k unless quick) */
/* the backend's cuda-graph counts since the last call (backend_stats resets them), printed when
 * graphs ran (the graph knob): a recording inside the timed steps shows here */
static void graph_counts(struct backend *be, int print)
{
    char st[1024] = "";
    backend_stats(be, st, sizeof(st));
    const char *g = strstr(st, "decode layers as graphs");
    if (print && g && !strstr(g, ": 0 recorded, 0 replayed, 0 failed"))
        printf("    %s\n", g);
}

/* the backend's host-block counts since the last call, printed when print (how a prefill over
 * host blocks read and wrote them) */
static void host_counts(struct backend *be, int print)
{
    char st[1024] = "";
    backend_stats(be, st, sizeof(st));
    const char *e = strstr(st, "; gemm inputs");
    if (print && e)
        printf("    %.*s\n", (int)(e - st), st);
}

/* the bound of a decode step (s) of ns sessions with n_host of their nbs blocks on host: the
 * weights and the device kv at HBM speed, or the host kv over the link, whichever is longer */
static double step_bound(double wbytes, double block_bytes, uint32_t ns, uint32_t nbs,
                         uint32_t n_host, double hbm, double pcie)
{
    double t_hbm = (wbytes + (double)ns * (nbs - n_host) * block_bytes) / hbm,
           t_pcie = (double)ns * n_host * block_bytes / pcie;
    return t_hbm > t_pcie ? t_hbm : t_pcie;
}

/* a decode shape with part of its kv on host: ns (<= 16) sessions of ctx keys with host_pm per
 * mille of each one's blocks on host (the oldest) */
struct host_case {
    uint32_t ns, ctx, host_pm;
};

/* c's block tables (block j of session s at j * ns + s in either pool) and sequences; its host
 * blocks a session */
static uint32_t host_case_seqs(struct kv_block_ref *tab, struct host_case c, struct fwd_seq ss[16],
                               int32_t toks[16])
{
    const uint32_t nbs = c.ctx / 256, n_host = (uint32_t)((uint64_t)nbs * c.host_pm / 1000);
    for (uint32_t s = 0; s < c.ns; s++) {
        for (uint32_t j = 0; j < nbs; j++)
            tab[s * nbs + j] =
                (struct kv_block_ref){j * c.ns + s, j < n_host ? KV_HOST : KV_DEVICE};
        toks[s] = 1;
        ss[s] = (struct fwd_seq){&toks[s], 1, c.ctx - 1, tab + s * nbs, nbs};
    }
    return n_host;
}

/* times c, records it against the step's bound ("decode b=.. ctx=.. host=..%", then
 * " <what> <pct>%" where what is given: the split share the backend runs at) and returns its
 * tok/s (0 on failure, in *rc) */
static double host_row(struct fwd *f, struct kv_block_ref *tab, const struct dec_bufs *db,
                       struct host_case c, const char *what, uint32_t pct, double wbytes,
                       double block_bytes, double hbm, double pcie, int *rc)
{
    struct fwd_seq ss[16];
    int32_t toks[16];
    if (c.ns == 0 || c.ns > 16)
        return 0;
    const uint32_t nbs = c.ctx / 256, n_host = host_case_seqs(tab, c, ss, toks);
    if ((*rc = dec_step(f, ss, c.ns, db)) != 0)
        return 0;
    double t = time_steps(f, ss, c.ns, c.ns == 1 ? 12 : 5, db, 0, NULL, 0, rc);
    if (*rc || t <= 0)
        return 0;
    double bound = step_bound(wbytes, block_bytes, c.ns, nbs, n_host, hbm, pcie);
    char name[96], tail[32] = "";
    if (what)
        snprintf(tail, sizeof(tail), " %s %u%%", what, pct);
    snprintf(name, sizeof(name), "decode b=%u ctx=%u host=%.1f%%%s (tok/s)", c.ns, c.ctx,
             100.0 * n_host / nbs, tail);
    record("decode", name, c.ns / t, "tok/s", c.ns / bound, bound / t);
    return c.ns / t;
}

static int bench_model(struct backend *be, int quick, const char *preset, int decode, int prefill)
{
    struct model_hparams hp =
        gm_hparams(MODEL_LLAMA, 32, 4096, 14336, 32, 8, 128, 128256, 1e-5f, 500000.0f);
    if (!strcmp(preset, "small"))
        hp = gm_hparams(MODEL_LLAMA, 8, 1024, 2816, 16, 4, 64, 32000, 1e-5f, 10000.0f);
    if (!strcmp(preset, "qwen3-8b")) /* q/k norms, neox rope */
        hp = gm_hparams(MODEL_QWEN3, 36, 4096, 12288, 32, 8, 128, 151936, 1e-6f, 1000000.0f);
    if (!strcmp(preset, "gemma3-4b")) {
        /* head_dim 256, GeGLU, five local layers of a 1024-position window to a global one (the
         * windows mask keys; every layer still reads its whole kv) */
        hp = gm_hparams(MODEL_GEMMA3, 34, 2560, 10240, 8, 4, 256, 262144, 1e-6f, 1000000.0f);
        hp.n_swa = 1024;
        hp.swa_period = 6;
        hp.rope_base_swa = 10000.0f;
    }
    double t0 = gu_now();
    struct gm_src src;
    /* one layer's bytes shared by all layers on the host; uploaded per layer */
    if (gm_src_init_mix(&src, &hp, g_wt, g_more, 11, 0) < 0)
        return -1;
    struct model *m = NULL;
    char err[256];
    if (model_create(be, &hp, &src.src, &m, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench: %s\n", err);
        return -1;
    }
    gm_src_fini(&src);
    printf("  model %s %s, kv %s: %.2f GB of weights, built in %.1f s\n", preset,
           g_qrows && *g_tag ? g_tag : be_type_name(g_wt), kv_dtype_name(g_kv),
           m->weight_bytes / 1e9, gu_now() - t0);
    struct kv_layout l;
    fwd_kv_layout(m, 256, g_kv, &l);
    const size_t bb = kv_block_bytes(&l);
    const uint32_t max_ctx = quick ? 32768 : 131072, S = 64;
    /* the host pool also holds the many-session case: 16 sessions x 14 host blocks */
    uint32_t nb_dev = max_ctx / 256 > S * 16 ? max_ctx / 256 : S * 16,
             nb_host = max_ctx / 256 > 16 * 16 ? max_ctx / 256 : 16 * 16;
    void *dev = NULL, *host = host_pool_alloc((size_t)nb_host * bb);
    if (!host || rkv_cuda_dev_alloc(0, (size_t)nb_dev * bb, &dev) < 0) {
        fprintf(stderr, "bench: cannot allocate the kv pools (%zu + %zu bytes)\n",
                (size_t)nb_dev * bb, (size_t)nb_host * bb);
        return -1;
    }
    rkv_cuda_fill_random(dev, BE_F16, (size_t)nb_dev * bb / 2, 3, 1.0f);
    host_fill_f16(host, (size_t)nb_host * bb, 5);
    struct kv_pools p = {{dev, host}, {nb_dev, nb_host}};
    struct fwd *f = NULL;
    int rc = fwd_create(&f, m, &l, &p, 512, S);
    if (rc < 0) {
        fprintf(stderr, "bench: fwd_create: %s\n", rkv_strerror(rc));
        return rc;
    }
    /* pinned, as the worker's (backend_host_alloc); decode steps pick greedily on the device as
     * the worker does for greedy rows (dec_step), the sampled rows' copy of every logit is its
     * own case */
    struct dec_bufs db = {backend_host_alloc(be, sizeof(float) * S * hp.n_vocab),
                          backend_host_alloc(be, sizeof(int32_t) * S),
                          backend_host_alloc(be, sizeof(float) * S)};
    float *logits = db.logits;
    if (!logits || !db.ids || !db.lps) {
        fprintf(stderr, "bench: cannot allocate pinned host buffers for %u rows\n", S);
        return -1;
    }
    struct kv_block_ref *tab = malloc(sizeof(*tab) * (nb_dev + nb_host));
    const double hbm = ceil_.hbm_read * 1e9;
    /* pcie: the faster of the two ways host bytes reach the gpu */
    const double pcie =
        (ceil_.zero_copy > ceil_.h2d_pinned ? ceil_.zero_copy : ceil_.h2d_pinned) * 1e9;
    const double wbytes = (double)m->weight_bytes, kv_per_tok = (double)bb / 256;
    /* 512: the step is nearly all weights, so its gap to 4k is what 4k's attention costs */
    /* 8k: all on host alone, the mark against llama.cpp's -nkvo (docs/performance.md) */
    uint32_t ctxs[] = {512, 4096, 8192, 32768, 131072};
    int fracs[] = {0, 25, 50, 90, 100};
    int profiled = 0; /* RKV_PROFILE_EXIT: stop after the profiled step */
    /* RKV_BENCH_B1=0: the batched cases alone, for a short run */
    const int b1 = (int)rkv_env_u64("RKV_BENCH_B1", 1, 0, 1);
    for (size_t ci = 0; ci < sizeof(ctxs) / sizeof(ctxs[0]) && !profiled && decode && b1; ci++) {
        uint32_t ctx = ctxs[ci];
        if (ctx > max_ctx)
            continue;
        for (int fi = 0; fi < 5; fi++) {
            if ((ctx == 4096 && fracs[fi] && fracs[fi] != 100) || (ctx == 512 && fracs[fi]) ||
                (ctx == 8192 && fracs[fi] != 100))
                continue;
            if (g_qrows && !(ctx == 4096 && !fracs[fi]) &&
                !(g_qrows == 2 && ctx == 32768 && (!fracs[fi] || fracs[fi] == 90)))
                continue;
            uint32_t n = ctx / 256, n_host = (uint32_t)((uint64_t)n * fracs[fi] / 100);
            /* the block being written stays on device (docs/runtime.md), so "100%"
             * is every block but the newest */
            if (n_host >= n)
                n_host = n - 1;
            /* the host part is the oldest blocks (a window of recent ones stays) */
            for (uint32_t j = 0; j < n; j++)
                tab[j] = j < n_host ? (struct kv_block_ref){j, KV_HOST}
                                    : (struct kv_block_ref){j, KV_DEVICE};
            int32_t tok = 1;
            struct fwd_seq s = {&tok, 1, ctx - 1, tab, n};
            double bound = step_bound(wbytes, 256 * kv_per_tok, 1, n, n_host, hbm, pcie);
            int steps = (int)(2.0 / bound);
            steps = steps < 3 ? 3 : steps > 50 ? 50 : steps;
            /* warm-up: two steps, so a cuda graph (recorded on a shape's second step) is too */
            for (int w = 0; w < 2 && rc == 0; w++)
                rc = dec_step(f, &s, 1, &db);
            graph_counts(be, 0);
            /* RKV_PROFILE_CTX=N: one step at ctx N, all resident, for ncu */
            const char *pc = getenv("RKV_PROFILE_CTX");
            if (rc == 0 && pc && (uint32_t)atoi(pc) == ctx && n_host == 0) {
                rkv_cuda_profiler(1);
                rc = dec_step(f, &s, 1, &db);
                rkv_cuda_profiler(0);
                if (getenv("RKV_PROFILE_EXIT"))
                    profiled = 1;
            }
            if (profiled)
                break;
            double t = time_steps(f, &s, 1, steps, &db, 0, NULL, 0, &rc);
            if (rc < 0) {
                fprintf(stderr, "bench: decode step failed: %s\n", rkv_strerror(rc));
                break;
            }
            char name[96];
            snprintf(name, sizeof(name), "decode b=1 ctx=%u host=%.1f%% (tok/s)", ctx,
                     100.0 * n_host / n);
            record("decode", name, 1.0 / t, "tok/s", 1.0 / bound, bound / t);
            graph_counts(be, 1);
            if (n_host == 0 && ctx == 4096 && rc == 0 && !g_qrows) {
                /* a sampled row: every logit to the host (pinned) */
                t = time_steps(f, &s, 1, steps, &db, 1, NULL, 0, &rc);
                record("decode", "decode b=1 ctx=4096 sampled, logits to the host (tok/s)", 1.0 / t,
                       "tok/s", 1.0 / bound, bound / t);
                /* sampled on the device (temperature 0.8, top_p 0.95) */
                struct dev_samp ds;
                if (rc == 0 && (rc = dev_samp_init(&ds, 1, (int32_t)hp.n_vocab)) == 0) {
                    t = time_steps(f, &s, 1, steps, &db, 2, &ds, (int32_t)hp.n_vocab, &rc);
                    record("decode",
                           "decode b=1 ctx=4096 sampled on the device (top_p 0.95, tok/s)", 1.0 / t,
                           "tok/s", 1.0 / bound, bound / t);
                    t = time_steps(f, &s, 1, steps, &db, 3, &ds, (int32_t)hp.n_vocab, &rc);
                    record("decode", "decode b=1 ctx=4096 sampled on the host (top_p 0.95, tok/s)",
                           1.0 / t, "tok/s", 1.0 / bound, bound / t);
                    printf(" rows given back to the host: %u\n", ds.back);
                    dev_samp_fini(&ds);
                }
            }
            if (n_host == 0) {
                char label[48];
                snprintf(label, sizeof(label), "b=1 ctx=%u", ctx);
                if ((rc = trace_step(label, f, &s, 1, &db)) < 0)
                    break;
            }
        }
    }
    /* batches at 4k, all resident: 2, 4 and 8 on the decode kernels (tensor cores; register
     * kernels with lin_mma=0, cublas past gemv_max_n), 64 on cublas */
    static const uint32_t batch_b[] = {2, 4, 8, 64};            /* S */
    const uint64_t pb = rkv_env_u64("RKV_PROFILE_B", 0, 0, 64); /* a bad value warns */
    for (int bi = 0; bi < 4 && rc == 0 && !profiled && decode; bi++) {
        const uint32_t NS = batch_b[bi];
        if (g_qrows && (g_qrows < 2 || NS < 8))
            continue;
        struct fwd_seq ss[64];
        int32_t toks[64];
        for (uint32_t s = 0; s < NS; s++) {
            for (uint32_t j = 0; j < 16; j++)
                tab[s * 16 + j] = (struct kv_block_ref){s * 16 + j, KV_DEVICE};
            toks[s] = 1;
            ss[s] = (struct fwd_seq){&toks[s], 1, 4095, tab + s * 16, 16};
        }
        for (int w = 0; w < 2 && rc == 0; w++)
            rc = dec_step(f, ss, NS, &db);
        graph_counts(be, 0);
        if (rc == 0 && ((NS == S && getenv("RKV_PROFILE_B64")) || pb == NS)) {
            /* RKV_PROFILE_B64=1 or RKV_PROFILE_B=NS: one profiled step of this batch, for ncu;
             * then stop */
            rkv_cuda_profiler(1);
            rc = dec_step(f, ss, NS, &db);
            rkv_cuda_profiler(0);
            profiled = 1;
        } else {
            double t = time_steps(f, ss, NS, 20, &db, 0, NULL, 0, &rc);
            double bound = (wbytes + NS * 4096.0 * kv_per_tok) / hbm;
            char name[96];
            snprintf(name, sizeof(name), "decode b=%u ctx=4096 (tok/s)", NS);
            record("decode", name, NS / t, "tok/s", NS / bound, bound / t);
            graph_counts(be, 1);
            if (NS == S && rc == 0 && !g_qrows) {
                /* sampled rows: every row's logits to the host (pinned) */
                t = time_steps(f, ss, NS, 20, &db, 1, NULL, 0, &rc);
                snprintf(name, sizeof(name), "decode b=%u ctx=4096 sampled, logits to the host",
                         NS);
                record("decode", name, NS / t, "tok/s", NS / bound, bound / t);
                /* sampled on the device (temperature 0.8, top_p 0.95) */
                struct dev_samp ds;
                if (rc == 0 && (rc = dev_samp_init(&ds, NS, (int32_t)hp.n_vocab)) == 0) {
                    t = time_steps(f, ss, NS, 20, &db, 2, &ds, (int32_t)hp.n_vocab, &rc);
                    snprintf(name, sizeof(name),
                             "decode b=%u ctx=4096 sampled on the device (top_p 0.95)", NS);
                    record("decode", name, NS / t, "tok/s", NS / bound, bound / t);
                    t = time_steps(f, ss, NS, 20, &db, 3, &ds, (int32_t)hp.n_vocab, &rc);
                    snprintf(name, sizeof(name),
                             "decode b=%u ctx=4096 sampled on the host (top_p 0.95, %u threads)",
                             NS, pool_n_threads(ds.pool));
                    record("decode", name, NS / t, "tok/s", NS / bound, bound / t);
                    printf(" rows given back to the host: %u\n", ds.back);
                    dev_samp_fini(&ds);
                }
            }
            char label[48];
            snprintf(label, sizeof(label), "b=%u ctx=4096", NS);
            if (rc == 0)
                rc = trace_step(label, f, ss, NS, &db);
        }
    }
    /* 16 sessions at 4k with host tails (what WINDOW does under overflow): block j of session s
     * at index j * 16 + s in either pool, so no two of a session's blocks are neighbours (as in
     * a shared pool); the newest block on device. Short tails too (an eighth: 32 MiB a layer,
     * as bench_system's ramp just past the device, which read 0.84 of the link), where a
     * layer's fixed costs weigh most. RKV_PROFILE_MULTI=1: one profiled step, exit */
    int host_eighths[] = {1, 2, 4, 7};
    for (int hi = 0; hi < 4 && rc == 0 && !profiled && decode && !g_qrows; hi++) {
        const struct host_case c = {16, 4096, 125u * (uint32_t)host_eighths[hi]};
        if (getenv("RKV_PROFILE_MULTI")) {
            struct fwd_seq ss[16];
            int32_t toks[16];
            host_case_seqs(tab, c, ss, toks);
            rc = dec_step(f, ss, c.ns, &db);
            if (rc == 0) {
                rkv_cuda_profiler(1);
                rc = dec_step(f, ss, c.ns, &db);
                rkv_cuda_profiler(0);
            }
            profiled = 1;
            break;
        }
        host_row(f, tab, &db, c, NULL, 0, wbytes, 256 * kv_per_tok, hbm, pcie, &rc);
    }
    /* the split host read at the share the worker's start-up probe picks (tail_split_share: the
     * cpu's and the link's rates side by side): the long host tails again, at that share. The
     * rows above read host blocks over the link alone (RKV_CUDA_TUNE=host_split=N runs them all
     * at N instead, and skips these) */
    struct cuda_tune knobs;
    cuda_tune_read(&knobs);
    if (rc == 0 && !profiled && decode && !knobs.host_split && !g_qrows) {
        struct rates r;
        const struct rates_opts ro = {
            &l, &p, {hp.n_head, hp.n_kv_head, hp.head_dim, 1.0f / sqrtf((float)hp.head_dim)},
            0,  0,  20};
        double cpu = 0, gpu = 0;
        uint32_t pct = 0;
        if (rates_measure(be, &ro, &r) == 0)
            pct = tail_split_share(&r, &cpu, &gpu);
        printf("  split host read: the worker's probe reads the cpu at %.2f GB/s beside the link's "
               "%.2f (alone: cpu %.2f over one block a layer, link %.2f): %u %% on the cpu\n",
               cpu, r.split.link_gbps, r.attn_cpu_gbps, r.pcie_h2d_gbps, pct);
        /* b=1 at 32k with 50 / 89.8 / 99.2 % on host; 16 sessions at 4k, 4 and 7 eighths */
        static const struct host_case rows[] = {
            {1, 32768, 500}, {1, 32768, 898}, {1, 32768, 992}, {16, 4096, 500}, {16, 4096, 875}};
        double at_probe[5] = {0};
        if (pct && backend_host_split(be, pct) == 0)
            for (size_t ri = 0; ri < 5 && rc == 0; ri++)
                at_probe[ri] = host_row(f, tab, &db, rows[ri], "split", pct, wbytes,
                                        256 * kv_per_tok, hbm, pcie, &rc);
        /* the longest tails again at fixed shares around it: how far the probe's share is from
         * the best of them */
        static const uint32_t shares[] = {30, 40, 50, 55, 60, 65, 70};
        for (size_t k = 0; k < 2 && pct && rc == 0; k++) {
            const size_t ri = k ? 4 : 1;
            double best = 0;
            uint32_t best_pct = 0;
            for (size_t si = 0; si < sizeof(shares) / sizeof(shares[0]) && rc == 0; si++) {
                if (backend_host_split(be, shares[si]) != 0)
                    break;
                double tps = host_row(f, tab, &db, rows[ri], "share", shares[si], wbytes,
                                      256 * kv_per_tok, hbm, pcie, &rc);
                if (tps > best)
                    best = tps, best_pct = shares[si];
            }
            if (best > 0 && at_probe[ri] > 0) {
                char name[96];
                snprintf(name, sizeof(name), "split probe b=%u ctx=%u %u%% over best %u%% (x)",
                         rows[ri].ns, rows[ri].ctx, pct, best_pct);
                record("decode", name, at_probe[ri] / best, "x", 1.0, at_probe[ri] / best);
            }
        }
        backend_host_split(be, 0);
    }
    /* prefill: 4k, 16k, 32k resident, with half the kv on host, and with all of it there:
     * as kvmgr serves a prompt when the device has no room for it (each chunk's blocks on
     * the device, those of the chunks before on host: the "all KV in host RAM" mark), and
     * written there too (every block but the last on host, the chunks' new keys written into
     * host blocks and copied up again: a worst case); 128k resident (llama.cpp's 2340 tok/s on
     * the H200 is its mark, docs/performance.md) */
    uint32_t plens[] = {4096, quick || g_qrows ? 0 : 16384, quick || g_qrows == 1 ? 0 : 32768,
                        quick || g_qrows ? 0 : 131072};
    if (rc == 0 && !profiled && prefill) {
        /* untimed: the first gemms of each shape pick their kernels */
        int32_t warm[1024];
        for (uint32_t i = 0; i < 1024; i++)
            warm[i] = (int32_t)(i * 104729 % hp.n_vocab);
        for (uint32_t j = 0; j < 4; j++)
            tab[j] = (struct kv_block_ref){j, KV_DEVICE};
        rc = fwd_prefill(f, warm, 1024, 0, tab, 4, 512, logits);
    }
    for (int pi = 0; pi < 4 && rc == 0 && !profiled && prefill; pi++) {
        /* a profiled prefill (below) ends the suite */
        uint32_t len = plens[pi];
        if (!len)
            continue;
        int32_t *toks = malloc(sizeof(int32_t) * len);
        for (uint32_t i = 0; i < len; i++)
            toks[i] = (int32_t)(i * 7919 % hp.n_vocab);
        uint32_t n = len / 256;
        double t_res = 0;
        /* where: 0 resident, 1 every other block on host, 2 all on host but each chunk's
         * own (the table changes a chunk), 3 all but the last on host */
        for (int where = 0; where < (len < 131072 && !g_qrows ? 4 : 1) && rc == 0; where++) {
            for (uint32_t j = 0; j < n; j++)
                tab[j] = where == 1 && j % 2 == 0 && j / 2 < nb_host
                             ? (struct kv_block_ref){j / 2, KV_HOST}
                         : where == 3 && j + 1 < n && j < nb_host
                             ? (struct kv_block_ref){j, KV_HOST}
                             : (struct kv_block_ref){j, KV_DEVICE};
            /* RKV_PROFILE_PREFILL=N: the prefill of N resident tokens, its last chunk of 512
             * between profiler start and stop (ncu --profile-from-start off), then exit */
            const char *pp = getenv("RKV_PROFILE_PREFILL");
            if (!where && pp && (uint32_t)atoi(pp) == len) {
                rc = fwd_prefill(f, toks, len - 512, 0, tab, n, 512, logits);
                rkv_cuda_profiler(1);
                if (rc == 0)
                    rc = fwd_prefill(f, toks + len - 512, 512, len - 512, tab, n, 512, logits);
                rkv_cuda_profiler(0);
                profiled = 1;
                break;
            }
            host_counts(be, 0); /* counts from here */
            double t1 = gu_now();
            if (where == 2) {
                for (uint32_t c0 = 0; c0 < len && rc == 0; c0 += 512) {
                    for (uint32_t j = 0; j < c0 / 256 && j < nb_host; j++)
                        tab[j] = (struct kv_block_ref){j, KV_HOST};
                    rc = fwd_prefill(f, toks + c0, 512, c0, tab, n, 512, logits);
                }
            } else {
                rc = fwd_prefill(f, toks, len, 0, tab, n, 512, logits);
            }
            double t = gu_now() - t1;
            char name[96];
            static const char *const wheres[] = {"resident", "half kv on host", "all kv on host",
                                                 "all kv on host, written there too"};
            snprintf(name, sizeof(name), "prefill %u %s (tok/s)", len, wheres[where]);
            if (!where)
                t_res = t;
            record("prefill", name, len / t, "tok/s", where ? len / t_res : 0,
                   where ? t_res / t : 0);
            if (!where && ceil_.gemm_bf16 > 0) {
                /* the same run as compute: 2 flops a weight of the layers' linears a token,
                 * and causal attention's 4 layers heads head_dim flops a key (len^2 / 2 keys) */
                const double hd = hp.head_dim,
                             lin = (double)hp.n_layer *
                                   ((double)hp.dim * hd * 2.0 * (hp.n_head + hp.n_kv_head) +
                                    3.0 * hp.dim * hp.ffn);
                const double attn = 4.0 * hp.n_layer * hp.n_head * hd * (double)len * len / 2.0;
                const double tflops = (2.0 * lin * len + attn) / t / 1e12;
                snprintf(name, sizeof(name), "prefill %u resident (TFLOP/s vs dense bf16 gemm)",
                         len);
                record("prefill", name, tflops, "TFLOP/s", ceil_.gemm_bf16,
                       tflops / ceil_.gemm_bf16);
            }
            host_counts(be, where && len == 32768);
            /* RKV_PROFILE_TRACE: the last chunk of 32k again, its kernels and copies traced
             * (the table is the last chunk's) */
            if (rc == 0 && trace_on && len == 32768 && gt_begin_copies() == 0) {
                rc = fwd_prefill(f, toks + len - 512, 512, len - 512, tab, n, 512, logits);
                char label[64];
                snprintf(label, sizeof(label), "prefill 32k last chunk, %s", wheres[where]);
                gt_end(label, stdout, trace_csv, -1, 16);
            }
        }
        free(toks);
    }
    fwd_destroy(f);
    model_destroy(m);
    struct kv_pools none = {{NULL, NULL}, {0, 0}};
    backend_set_kv(be, &l, &none);
    rkv_cuda_dev_free(dev);
    host_pool_free(host);
    free(tab);
    backend_host_free(be, db.logits);
    backend_host_free(be, db.ids);
    backend_host_free(be, db.lps);
    return rc;
}

/* quantized weights: the bf16 model's marks, then each type's (q4_k_m: Q4_K with Q6_K where a
 * q4_k_m file has it), every row against its own weight bytes; prefill also as a ratio to the
 * bf16 model's in this run */
/* the quant suite's models: a tag, the weights' type (more: attn_v, ffn_down, output), the
 * prefill rows it measures */
static const struct {
    const char *tag;
    enum be_type t, more;
    int rows;
} qs[] = {{"bf16", BE_BF16, BE_BF16, 1}, {"q4_k_m", BE_Q4_K, BE_Q6_K, 2},
          {"q4_0", BE_Q4_0, BE_Q4_0, 1}, {"q6_k", BE_Q6_K, BE_Q6_K, 1},
          {"q8_0", BE_Q8_0, BE_Q8_0, 1}, {"iq4_xs", BE_IQ4_XS, BE_IQ4_XS, 1}};

/* --quant-types: the quant suite's tags to run (comma-separated; NULL: all) */
static const char *g_qtypes;

static int qtype_wanted(const char *tag)
{
    if (!g_qtypes)
        return 1;
    const size_t n = strlen(tag);
    for (const char *p = g_qtypes; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, tag, n))
            return 1;
        p += len + (e != NULL);
    }
    return 0;
}

static int bench_quant(struct backend *be, int quick, const char *preset)
{
    int rc = 0;
    for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]) && rc == 0; i++) {
        if (!qtype_wanted(qs[i].tag))
            continue;
        g_wt = qs[i].t;
        g_more = qs[i].more;
        g_tag = qs[i].tag;
        g_qrows = qs[i].rows;
        rc = bench_model(be, quick, preset, 1, 1);
    }
    g_wt = g_more = BE_BF16;
    g_tag = "";
    g_qrows = 0;
    return rc;
}

int main(int argc, char **argv)
{
    rkv_log_init("gpu-bench", RKV_LOG_WARN);
    const char *json = NULL, *suite = "all", *preset = "llama3-8b";
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--suite") && i + 1 < argc)
            suite = argv[++i];
        else if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--quant-types") && i + 1 < argc) {
            g_qtypes = argv[++i];
            /* every name one of the suite's tags, and at least one */
            for (const char *p = g_qtypes;;) {
                const size_t len = strcspn(p, ",");
                size_t k = 0;
                while (k < sizeof(qs) / sizeof(qs[0]) &&
                       !(strlen(qs[k].tag) == len && !strncmp(p, qs[k].tag, len)))
                    k++;
                if (k == sizeof(qs) / sizeof(qs[0])) {
                    fprintf(stderr,
                            "gpu_bench: --quant-types: '%.*s' is not one of bf16, q4_k_m, q4_0, "
                            "q6_k, q8_0, iq4_xs\n",
                            (int)len, p);
                    return 2;
                }
                if (!p[len])
                    break;
                p += len + 1;
            }
        } else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc) {
            if (kv_dtype_parse(argv[++i], &g_kv) < 0) {
                fprintf(stderr, "gpu_bench: --kv-dtype %s is not one of " KV_DTYPE_NAMES "\n",
                        argv[i]);
                return 2;
            }
            if (g_kv != KV_F16)
                g_tag = argv[i]; /* the rows say which */
        } else {
            fprintf(stderr,
                    "usage: gpu_bench [--suite all|gemv|gemm|linear|attn|decode|prefill|quant] "
                    "[--preset llama3-8b|qwen3-8b|gemma3-4b|small] "
                    "[--quant-types bf16,q4_k_m,q4_0,q6_k,q8_0,iq4_xs] "
                    "[--kv-dtype f16|f32|q8|fp8] "
                    "[--quick] [--json FILE]\n");
            return 2;
        }
    }
    static const char *const suites[] = {"all",  "gemv",   "gemm",    "linear",
                                         "attn", "decode", "prefill", "quant"};
    if (strcmp(preset, "llama3-8b") && strcmp(preset, "qwen3-8b") && strcmp(preset, "gemma3-4b") &&
        strcmp(preset, "small")) {
        fprintf(stderr,
                "gpu_bench: --preset %s is not one of llama3-8b, qwen3-8b, gemma3-4b, small\n",
                preset);
        return 2;
    }
    int known = 0;
    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
        known |= !strcmp(suite, suites[i]);
    if (!known) {
        fprintf(stderr,
                "gpu_bench: --suite %s is not one of all, gemv, gemm, linear, attn, decode, "
                "prefill, quant\n",
                suite);
        return 2;
    }
    if (rkv_cuda_backend_probe() <= 0) {
        printf("gpu-bench: no CUDA device; skipped\n");
        return 77;
    }
    if (json && !(js = fopen(json, "w"))) {
        perror(json);
        return 1;
    }
    if (js)
        fprintf(js, "{\"records\": [");
    const char *tdir = getenv("RKV_PROFILE_TRACE");
    if (tdir && *tdir) {
        char path[512];
        snprintf(path, sizeof(path), "%s/trace.csv", tdir);
        /* the directory is made when missing (one level, as $OUT/tr) */
        if (mkdir(tdir, 0755) != 0 && errno != EEXIST)
            fprintf(stderr, "gpu_bench: RKV_PROFILE_TRACE=%s: cannot make it (%s)\n", tdir,
                    strerror(errno));
        if (!(trace_csv = fopen(path, "w"))) {
            fprintf(stderr,
                    "gpu_bench: RKV_PROFILE_TRACE=%s: cannot write %s (%s): name a writable "
                    "directory (made when missing, if its parent exists)\n",
                    tdir, path, strerror(errno));
            return 1;
        }
        trace_on = 1;
    }
    int rc = rkv_cuda_measure_ceilings(0, (size_t)4 << 30, (size_t)1 << 30, &ceil_);
    if (rc < 0) {
        fprintf(stderr, "gpu-bench: ceilings: %s\n", rkv_strerror(rc));
        return 1;
    }
    printf("ceilings on %s (%d SMs):\n", ceil_.gpu_name, ceil_.n_sm);
    record("ceiling", "hbm stream read", ceil_.hbm_read, "GB/s", 0, 0);
    record("ceiling", "d2d copy (read+write)", ceil_.d2d_copy, "GB/s", 0, 0);
    record("ceiling", "pinned h2d 64MiB copies", ceil_.h2d_pinned, "GB/s", 0, 0);
    record("ceiling", "pinned h2d 1MiB copies", ceil_.h2d_pinned_1m, "GB/s", 0, 0);
    record("ceiling", "pinned h2d 1MiB pieces 4MiB apart", ceil_.h2d_strided_1m, "GB/s", 0, 0);
    record("ceiling", "pinned h2d the same, one 2d copy", ceil_.h2d_2d_1m, "GB/s", 0, 0);
    record("ceiling", "pinned h2d the same, one batch call", ceil_.h2d_batch_1m, "GB/s", 0, 0);
    record("ceiling", "zero-copy kernel read", ceil_.zero_copy, "GB/s", 0, 0);
    record("ceiling", "dense bf16 gemm 8192^3", ceil_.gemm_bf16, "TFLOP/s", 0, 0);
    char err[256];
    struct backend_opts go = {"cuda", 0, 0};
    struct backend *be = NULL;
    if (backend_create(&go, &be, err, sizeof(err)) < 0) {
        fprintf(stderr, "gpu-bench: %s\n", err);
        return 1;
    }
    if (!strcmp(suite, "all") || !strcmp(suite, "gemv"))
        rc |= bench_gemv(be);
    if (!strcmp(suite, "gemm"))
        rc |= bench_gemm(be, quick);
    if (!strcmp(suite, "all") || !strcmp(suite, "linear"))
        rc |= bench_linear(be);
    if (!strcmp(suite, "all") || !strcmp(suite, "attn"))
        rc |= bench_attention(be, quick);
    if (!strcmp(suite, "all") || !strcmp(suite, "decode"))
        rc |= bench_model(be, quick, preset, 1, 1);
    if (!strcmp(suite, "prefill"))
        rc |= bench_model(be, quick, preset, 0, 1);
    if (!strcmp(suite, "quant"))
        rc |= bench_quant(be, quick, preset);
    backend_destroy(be);
    if (js) {
        fprintf(js, "\n], \"gpu\": \"%s\", \"env\": {", ceil_.gpu_name);
        json_env(js);
        fprintf(js, "}}\n");
        fclose(js);
    }
    if (trace_csv)
        fclose(trace_csv);
    return rc ? 1 : 0;
}
