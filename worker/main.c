/* main.c - rkv-worker: loads the model, maps kvmgr's KV pools, serves batched steps for rkvd. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/err.h"
#include "common/gguf.h"
#include "common/gpu.h"
#include "common/log.h"
#include "common/shm.h"
#include "common/util.h"
#include "proto/msg.h"
#include "proto/sock.h"
#include "proto/wire.h"
#include "worker/backend.h"
#include "worker/forward.h"
#include "worker/model.h"
#include "worker/pool.h"
#include "worker/rates.h"
#include "worker/reserve.h"
#include "worker/sample.h"

/*
 * Shape: one thread serves the rep socket rkvd dials (proto_serve_one with a
 * short timeout so signals and the kvmgr check are noticed); a step runs on
 * that thread and the backend spreads it over its own threads. Between
 * steps the worker checks that the kvmgr it attached to is still the one
 * running; when it is not, it stops serving, re-attaches (new pools) and
 * continues. A restarted worker re-attaches the same way: the KV lives in
 * kvmgr's pools, so sessions go on without re-prefill. On the cuda backend
 * the device pool is kvmgr's VRAM slab, opened from its IPC handle
 * ("cudaipc:<hex>", common/gpu.h); the host pool is shared memory either
 * way, and the cuda backend pins it (set_kv).
 */

struct worker_conf {
    char model[1024];
    int backend;
    int64_t threads;
    int64_t sample_threads;
    int64_t worker_id;
    int64_t gpu;
    char runtime_dir[512];
    char kvmgr_url[600];
    char listen[600];
    int64_t max_batch_tokens;
    int64_t max_seqs;
    int64_t block_size;
    int kv_dtype;
    int measure_rates;
    int deterministic;
    int host_attn;
    int64_t host_split;
    int log_level;
};

static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
static const char *const kv_dtypes[] = {"f32", "f16", NULL};
static const char *const host_attns[] = {"auto", "gpu", "cpu", NULL};

#define K(n, t, f) n, t, offsetof(struct worker_conf, f)
/* sampling threads at most, and the logits (rows x vocab) below which a
 * step samples on its own thread */
#define SAMPLE_MAX_THREADS  16
#define SAMPLE_PARALLEL_MIN (1u << 16)
static const struct cfg_key keys[] = {
    {K("model", CFG_STR, model), sizeof(((struct worker_conf *)0)->model), .help = "GGUF model"},
    {K("backend", CFG_ENUM, backend), .names = backends, .def = "auto", .help = "compute"},
    {K("threads", CFG_INT, threads), .min = 0, .max = 1024, .def = "0",
     .help = "cpu threads (0 = all cores)"},
    {K("sample_threads", CFG_INT, sample_threads), .min = 0, .max = SAMPLE_MAX_THREADS, .def = "0",
     .help = "threads sampling a step's rows (0 = auto: --threads or the cores, at most 16, and "
             "only for large logits; 1 = on the step thread)"},
    {K("worker_id", CFG_INT, worker_id), .min = 0, .max = 63, .def = "0", .help = "worker index"},
    {K("gpu", CFG_INT, gpu), .min = -1, .max = 1023, .def = "-1", .help = "gpu ordinal, -1 cpu"},
    {K("runtime_dir", CFG_STR, runtime_dir), 512, .def = "/run/rkv", .help = "sockets"},
    {K("kvmgr_url", CFG_STR, kvmgr_url), 600, .help = "default ipc://RUNTIME_DIR/kvmgr.sock"},
    {K("listen", CFG_STR, listen), 600, .help = "default ipc://RUNTIME_DIR/worker<ID>.sock"},
    {K("max_batch_tokens", CFG_INT, max_batch_tokens), .min = 0, .max = 65536, .def = "0",
     .help = "tokens in one step (0 = 2048 on cuda, 512 on the cpu)"},
    {K("max_seqs", CFG_INT, max_seqs), .min = 1, .max = 4096, .def = "256",
     .help = "sequences in one step"},
    {K("block_size", CFG_INT, block_size), .min = 1, .max = 65536, .def = "256",
     .help = "positions per KV block (the same as kvmgr's)"},
    {K("kv_dtype", CFG_ENUM, kv_dtype), .names = kv_dtypes, .def = "f32", .help = "kv cache type"},
    {K("measure_rates", CFG_BOOL, measure_rates), .def = "true",
     .help = "time kv attention and moves at start-up for the planner (false: report 0)"},
    {K("host_attn", CFG_ENUM, host_attn), .names = host_attns, .def = "auto",
     .help = "who attends a spilled session's host blocks on a gpu worker: the gpu over pcie, or "
             "cpu threads over the host pool (CPU_TAIL); auto: the cpu where its measured rate "
             "beats the link's, as kvmgr's planner decides"},
    {K("host_split", CFG_INT, host_split), .min = -1, .max = 100, .def = "-1",
     .help = "percent of a decode row's host blocks (the oldest) attended by cpu threads while "
             "the gpu reads the rest, so the cpu's and the link's rates add up: 0 off, -1 the "
             "cpu's share of the measured rates (not with CPU_TAIL or --deterministic)"},
    {K("deterministic", CFG_BOOL, deterministic), .def = "false",
     .help = "batch-invariant kernels: a sequence's tokens do not depend on what else runs "
             "(slower on cuda; the cpu backend is always so)"},
    {K("log_level", CFG_ENUM, log_level), .names = rkv_log_level_names, .def = "info",
     .help = "log level"},
};
#undef K

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* a session's sampler, kept between steps */
struct samp {
    struct sampler *s;
    uint64_t last_step;
};

struct worker {
    struct worker_conf c;
    uint64_t report_ms; /* step_report's period */
    struct gguf_ctx *g;
    struct backend *be;
    struct model *m;
    struct fwd *fwd;
    struct kv_layout layout;
    struct kv_pools pools;
    struct rkv_shm shm[KV_N_POOLS];
    void *ipc_dev; /* kvmgr's device slab opened by its IPC handle, or NULL */
    int on_gpu;    /* the backend is cuda */
    uint32_t gpu;
    struct proto_sock *kvmgr;
    struct proto_sock *rep;
    uint32_t kvmgr_pid;
    uint64_t n_steps;  /* forward passes run */
    uint64_t swept_at; /* n_steps at the last sweep_samplers */
    /* where a step's time goes, summed since the last report (step_report):
     * forward, sampling, the whole handler, and the gaps between steps (rkvd,
     * kvmgr and the ipc between them) */
    struct step_times {
        uint64_t steps, passes, rows, picked, tokens, fwd_ns, sample_ns, handle_ns, gap_ns,
            t_report, t_last_end;
    } st;
    struct rates rates; /* measured at the first attach, reported at every attach */
    uint64_t reserve;   /* compute reserve measured before the first hello (gpu), bytes */
    int reserve_done;
    int rates_done;
    struct rkv_map samplers; /* session id -> struct samp */
    /* per-step scratch */
    struct fwd_seq *fseqs;
    struct kv_block_ref *refs;
    size_t refs_cap;
    float *logits; /* (max_seqs, n_vocab), backend_host_alloc */
    /* a step whose sampled rows are all plain greedy: the backend picks them
     * (fwd_step_greedy), each row's sampler and its status here */
    int32_t *g_ids;
    float *g_lps;
    int32_t *g_feed; /* a step of several decode steps: each row's input of the next one */
    struct samp **rows_sp;
    int *rows_rc;
    struct pool *samp_pool;
    /* rows of the current step to sample (sample_rows) */
    struct samp_job {
        struct sampler *s;
        const float *row;
        struct proto_step_out *o;
        struct sample_top top[PROTO_MAX_TOP_LOGPROBS];
    } * sjobs;
    /* sampled rows picked by the backend where the logits are (fwd_sample), each row's
     * parameters and penalty ids (SAMPLE_PEN_CAP of them a row) and its pick */
    struct sample_dev_row *drows;
    const struct sample_dev_row **drow_p; /* a row's drows entry, or NULL: not sampled there */
    struct sample_dev_out *douts;
    uint8_t *dwant;    /* a row the host samples from its logits */
    int32_t *dpen;     /* (max_seqs, 2 * SAMPLE_PEN_CAP) penalty ids and counts */
    struct proto_wbuf out;
};

/* distinct penalty ids a row may send the backend; a row with more is sampled on the host */
#define SAMPLE_PEN_CAP 4096

/* "shm:/name" (cpu mode) -> "/name" */
static const char *shm_name(const char *url)
{
    return strncmp(url, "shm:", 4) == 0 ? url + 4 : url;
}

static void detach(struct worker *w)
{
    fwd_free(w->fwd);
    w->fwd = NULL;
    for (int i = 0; i < KV_N_POOLS; i++)
        rkv_shm_close(&w->shm[i]);
    rkv_gpu_ipc_close(w->gpu, w->ipc_dev);
    w->ipc_dev = NULL;
    memset(&w->pools, 0, sizeof w->pools);
}

/* maps kvmgr's device pool: a VRAM slab by IPC handle, or shared memory */
static int map_device_pool(struct worker *w, const char *url, size_t bytes)
{
    if (strncmp(url, "cudaipc:", 8) != 0) {
        int rc = rkv_shm_open(&w->shm[KV_DEVICE], shm_name(url), bytes);
        w->pools.base[KV_DEVICE] = w->shm[KV_DEVICE].base;
        return rc;
    }
    uint8_t handle[RKV_GPU_IPC_BYTES];
    if (!w->on_gpu) {
        log_error("kvmgr's device pool is in VRAM but this worker runs on the cpu backend: "
                  "start kvmgr and the workers with the same --backend");
        return RKV_EUNSUPPORTED;
    }
    if (rkv_gpu_handle_parse(url + 8, handle)) {
        log_error("kvmgr sent a malformed device pool handle \"%.40s...\"", url);
        return RKV_EPROTO;
    }
    int rc = rkv_gpu_ipc_open(w->gpu, handle, &w->ipc_dev);
    w->pools.base[KV_DEVICE] = w->ipc_dev;
    return rc;
}

/* the split host read as this worker runs it where CPU_TAIL does not take its host blocks: the
 * share (--host-split, or with -1 the cpu's part of the measured rates; 0 off), the two rates it
 * came from, and the rate it reads a long tail at, the cpu and the gpu at once (0: no split) */
static uint32_t split_plan(const struct worker *w, double *cpu, double *gpu, double *gbps)
{
    *gbps = 0;
    const uint32_t auto_pct = rates_split_share(&w->rates, cpu, gpu);
    if (!w->on_gpu || !w->c.host_split)
        return 0;
    uint32_t pct = w->c.host_split > 0 ? (uint32_t)w->c.host_split : auto_pct;
    if (w->c.deterministic && w->c.host_split < 0)
        pct = 0; /* the default (-1) stays quiet where the split cannot run */
    if (!w->c.deterministic)
        *gbps = rkv_host_split_gbps(pct, *gpu, *cpu);
    return pct;
}

/* where a spilled session's host blocks are attended on a gpu worker: the rule kvmgr's planner
 * applies to the rates this worker reported (CPU_TAIL when the cpu attends faster than host
 * blocks reach the gpu, and faster than the split reads them), or what --host-attn forces */
static int apply_host_attn(struct worker *w, double split_gbps)
{
    if (!w->on_gpu)
        return 0;
    const struct rates *r = &w->rates;
    int cpu = w->c.host_attn == 2 ||
              (w->c.host_attn == 0 && rkv_cpu_tail_faster(r->pcie_h2d_gbps, r->attn_host_gbps,
                                                          r->attn_cpu_gbps, split_gbps));
    int rc = backend_host_attn_cpu(w->be, cpu);
    if (rc < 0 && cpu)
        log_warn("host blocks stay on the gpu: the cpu cannot attend them here (%s)%s",
                 rkv_strerror(rc), w->c.deterministic ? "; --deterministic keeps them there" : "");
    else if (rc == 0 && cpu)
        log_info("host kv blocks attended by the cpu (CPU_TAIL): cpu %.2f GB/s, pcie %.2f, host "
                 "reads %.2f%s",
                 r->attn_cpu_gbps, r->pcie_h2d_gbps, r->attn_host_gbps,
                 w->c.host_attn == 2 ? " (forced)" : "");
    return rc == 0 && cpu;
}

/* sets the split's share pct (split_plan's); nothing under CPU_TAIL (the cpu takes every host
 * block already). 1 when the split runs */
static int apply_host_split(struct worker *w, int cpu_tail, uint32_t pct, double cpu, double gpu)
{
    if (!w->on_gpu || !w->c.host_split)
        return 0;
    const struct rates *r = &w->rates;
    if (cpu_tail)
        pct = 0;
    const int learn = w->c.host_split < 0;
    int rc = backend_host_split(w->be, pct, learn);
    if (rc < 0)
        log_warn("the split host read is off: %s%s", rkv_strerror(rc),
                 w->c.deterministic ? " (--deterministic keeps host blocks on the gpu)" : "");
    else if (rc == 0 && pct)
        log_info("host kv blocks split: %u %% of each decode row's on the cpu (%.2f GB/s), the "
                 "rest read by the gpu (%.2f)%s",
                 pct, cpu, gpu,
                 w->c.host_split > 0     ? " (--host-split)"
                 : r->split.cpu_gbps > 0 ? " (measured side by side)"
                                         : " (measured)");
    else if (rc == 0 && w->c.host_split < 0 && !cpu_tail && !w->c.deterministic)
        log_info("the split host read stays off: no measured cpu or host-read rate");
    return rc == 0 && pct > 0;
}

/* HELLO to kvmgr, map its pools, build the forward state, report rates */
static int attach(struct worker *w)
{
    char err[512];
    int rc = fwd_kv_layout(w->m, (uint32_t)w->c.block_size, w->c.kv_dtype == 1 ? KV_F16 : KV_F32,
                           &w->layout);
    if (rc)
        return rc;
    /* on a gpu, before kvmgr sizes its slab: what a step of this model takes */
    if (w->on_gpu && !w->reserve_done) {
        w->reserve_done = 1;
        rc = reserve_measure(w->be, w->m, w->layout.dtype, (uint32_t)w->c.max_batch_tokens,
                             (uint32_t)w->c.max_seqs, (int)w->gpu, &w->reserve);
        if (rc)
            log_warn("could not measure the compute reserve (%s): kvmgr uses its default",
                     rkv_strerror(rc));
    }
    /* gpu -1 tells kvmgr (on auto) that this worker needs shared memory pools */
    struct proto_hello h = {PROTO_ROLE_WORKER,
                            (uint32_t)getpid(),
                            (uint32_t)w->c.worker_id,
                            w->on_gpu ? (int64_t)w->gpu : -1,
                            PROTO_VERSION,
                            "rkv-worker",
                            kv_block_bytes(&w->layout),
                            w->m->weight_bytes,
                            w->reserve};
    struct proto_hello_ack ack;
    /* the first hello makes kvmgr create its pools: on a gpu pinning the host pool takes
     * about a second per 4 GiB (H200 machine, 2026-11-29) */
    rc = proto_call_json(w->kvmgr, PROTO_MSG_HELLO, &h, PROTO_MSG_HELLO_ACK, &ack, 5000, err,
                         sizeof err);
    if (rc)
        return rc;
    if (!ack.accepted) {
        log_error("kvmgr refused this worker");
        return RKV_EPROTO;
    }
    if (kv_block_bytes(&w->layout) != ack.block_bytes || ack.block_size != w->layout.block_size) {
        log_error("kvmgr's blocks are %llu bytes but this model needs %zu per block of %u "
                  "positions: kvmgr and the worker must be started for the same model and "
                  "kv_dtype",
                  (unsigned long long)ack.block_bytes, kv_block_bytes(&w->layout), ack.block_size);
        return RKV_EFORMAT;
    }
    const char *names[KV_N_POOLS] = {ack.device_pool_url, shm_name(ack.host_pool_name)};
    uint64_t counts[KV_N_POOLS] = {ack.n_device_blocks, ack.n_host_blocks};
    for (int i = 0; i < KV_N_POOLS; i++) {
        if (counts[i] == 0 || counts[i] > UINT32_MAX)
            continue;
        size_t bytes = counts[i] * ack.block_bytes;
        if (i == KV_DEVICE) {
            rc = map_device_pool(w, names[i], bytes);
        } else {
            rc = rkv_shm_open(&w->shm[i], names[i], bytes);
            w->pools.base[i] = w->shm[i].base;
        }
        if (rc) {
            log_error("cannot map kvmgr's %s pool %.60s: %s", i == KV_DEVICE ? "device" : "host",
                      names[i], rkv_strerror(rc));
            detach(w);
            return rc;
        }
        w->pools.n_blocks[i] = (uint32_t)counts[i];
    }
    rc = fwd_init(&w->fwd, w->m, &w->layout, &w->pools, (uint32_t)w->c.max_batch_tokens,
                  (uint32_t)w->c.max_seqs);
    if (rc) {
        log_error("cannot set up the forward pass: %s", rkv_strerror(rc));
        detach(w);
        return rc;
    }
    w->kvmgr_pid = ack.kvmgr_pid;
    if (w->c.measure_rates && !w->rates_done) {
        const struct model_hparams *hp = &w->m->hp;
        struct rates_opts ro = {
            &w->layout,
            &w->pools,
            {hp->n_head, hp->n_kv_head, hp->head_dim, 1.0f / sqrtf((float)hp->head_dim)},
            w->on_gpu ? (int)w->gpu : -1,
            (uint32_t)w->c.threads,
            0};
        const struct rates *r = &w->rates;
        if (rates_measure(w->be, &ro, &w->rates) == 0)
            log_info("kv rates (%.0f ms): pcie h2d %.2f, attention device %.2f, host %.2f, "
                     "cpu %.2f GB/s",
                     r->elapsed_ms, r->pcie_h2d_gbps, r->attn_device_gbps, r->attn_host_gbps,
                     r->attn_cpu_gbps);
        if (w->on_gpu && r->split.cpu_gbps > 0)
            log_info("kv rates side by side: the cpu %.2f GB/s over a long row while the link "
                     "moved %.2f GB/s out of the same host pool",
                     r->split.cpu_gbps, r->split.link_gbps);
        w->rates_done = 1;
    }
    double split_cpu, split_gpu, split_gbps;
    const uint32_t split_pct = split_plan(w, &split_cpu, &split_gpu, &split_gbps);
    const int split_on =
        apply_host_split(w, apply_host_attn(w, split_gbps), split_pct, split_cpu, split_gpu);
    struct proto_worker_report rep = {
        (uint32_t)w->c.worker_id, w->m->weight_bytes,        w->reserve,
        w->rates.pcie_h2d_gbps,   w->rates.attn_device_gbps, w->rates.attn_host_gbps,
        w->rates.attn_cpu_gbps,   split_on ? split_gbps : 0};
    struct proto_empty ok;
    rc = proto_call_json(w->kvmgr, PROTO_MSG_WORKER_REPORT, &rep, PROTO_MSG_OK, &ok, 2000, err,
                         sizeof err);
    if (rc)
        log_warn("kvmgr did not take the worker report: %s", err);
    log_info("attached to kvmgr (pid %u): %llu device%s + %llu host blocks of %u positions",
             ack.kvmgr_pid, (unsigned long long)ack.n_device_blocks,
             w->ipc_dev ? " (cuda ipc)" : "", (unsigned long long)ack.n_host_blocks,
             ack.block_size);
    return 0;
}

/* is the kvmgr we attached to still the one answering? */
static int kvmgr_same(struct worker *w)
{
    struct proto_empty q = {0};
    struct proto_status st;
    char err[256];
    int rc = proto_call_json(w->kvmgr, PROTO_MSG_STATUS_GET, &q, PROTO_MSG_STATUS, &st, 1000, err,
                             sizeof err);
    return rc == 0 && st.kvmgr_pid == w->kvmgr_pid;
}

static struct samp *sampler_for(struct worker *w, const struct proto_step_seq *sq, int *rc)
{
    struct samp *sp = rkv_map_get(&w->samplers, sq->session_id);
    *rc = 0;
    if (sp && !(sq->flags & PROTO_STEP_RESET))
        return sp;
    if (!sp) {
        sp = calloc(1, sizeof *sp);
        if (!sp || rkv_map_put(&w->samplers, sq->session_id, sp)) {
            free(sp);
            *rc = RKV_ENOMEM;
            return NULL;
        }
    }
    sampler_free(sp->s);
    sp->s = NULL;
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = sq->sampling.temperature;
    p.top_k = sq->sampling.top_k;
    p.top_p = sq->sampling.top_p;
    p.min_p = sq->sampling.min_p;
    p.repetition_penalty = sq->sampling.repetition_penalty;
    p.presence_penalty = sq->sampling.presence_penalty;
    p.frequency_penalty = sq->sampling.frequency_penalty;
    p.seed = sq->sampling.seed;
    p.n_top_logprobs = sq->sampling.n_top_logprobs;
    char err[256];
    if ((*rc = sample_params_check(&p, err, sizeof err)) != 0) {
        log_warn("session %llu: %s", (unsigned long long)sq->session_id, err);
        return NULL;
    }
    if ((*rc = sampler_init(&sp->s, &p, (int32_t)w->m->hp.n_vocab)) != 0)
        return NULL;
    for (uint32_t i = 0; i < sq->n_history; i++)
        sampler_accept(sp->s, sq->history[i]);
    sampler_skip_draws(sp->s, sq->n_drawn);
    return sp;
}

/* samplers of sessions not seen for a long while (closed or moved) */
static void sweep_samplers(struct worker *w)
{
    size_t it = 0;
    uint64_t key;
    void *v;
    while (rkv_map_next(&w->samplers, &it, &key, &v)) {
        struct samp *sp = v;
        if (w->n_steps - sp->last_step > 100000) {
            sampler_free(sp->s);
            free(sp);
            rkv_map_del(&w->samplers, key);
            it = 0;
        }
    }
}

static void sample_range(void *arg, uint32_t begin, uint32_t end, uint32_t thread)
{
    struct samp_job *jobs = arg;
    (void)thread;
    for (uint32_t i = begin; i < end; i++) {
        struct samp_job *j = &jobs[i];
        j->o->token = sampler_sample(j->s, j->row, &j->o->logprob, j->top);
        for (uint8_t k = 0; k < j->o->n_top; k++) {
            j->o->top[k].id = j->top[k].id;
            j->o->top[k].logprob = j->top[k].logprob;
        }
    }
}

/* samples w->sjobs[0..n); a row's result does not depend on the thread
 * count. automatic: small logits stay on this thread (a handoff costs more) */
static void sample_rows(struct worker *w, uint32_t n)
{
    int big = (size_t)n * w->m->hp.n_vocab >= SAMPLE_PARALLEL_MIN || w->c.sample_threads > 1;
    if (n >= 2 && big && pool_n_threads(w->samp_pool) > 1)
        pool_run(w->samp_pool, sample_range, w->sjobs, n, 1);
    else
        sample_range(w->sjobs, 0, n, 0);
}

/* one forward pass over the step's rows as w->fseqs describe them, and each sampled row's
 * token into outs (picked by the backend when greedy allows, else by the row's sampler) */
static int step_pass(struct worker *w, const struct proto_step_req *req,
                     struct proto_step_out *outs, int greedy)
{
    uint32_t n = req->n_seqs;
    uint64_t t_fwd = rkv_now_ns();
    for (uint32_t i = 0; i < n; i++)
        w->st.tokens += w->fseqs[i].n_tokens;
    int picked = 0, rc;
    /* rows sampled where the logits are, when the backend can (a gpu then sends back a token
     * and a few numbers a row, not the logits) */
    const int dev = !greedy;
    if (greedy)
        rc = fwd_step_greedy(w->fwd, w->fseqs, n, w->logits, w->g_ids, w->g_lps, &picked);
    else if (dev)
        rc = fwd_step_keep(w->fwd, w->fseqs, n);
    else
        rc = fwd_step(w->fwd, w->fseqs, n, 0, w->logits);
    w->st.fwd_ns += rkv_now_ns() - t_fwd;
    if (rc)
        return rc;
    w->n_steps++;
    w->st.passes++;
    /* samplers and their history here (the map is this thread's), the
     * sampling itself on the pool: each row has its own sampler */
    uint32_t n_sample = 0, n_picked = 0;
    for (uint32_t i = 0; i < n; i++) {
        w->drow_p[i] = NULL;
        w->dwant[i] = 0;
        const struct proto_step_seq *sq = &req->seqs[i];
        const struct fwd_seq *fs = &w->fseqs[i];
        struct proto_step_out *o = &outs[i];
        o->session_id = sq->session_id;
        o->token = -1;
        struct samp *sp = w->rows_sp[i];
        if (!sp) {
            o->status = w->rows_rc[i];
            continue;
        }
        sp->last_step = w->n_steps;
        for (uint32_t t = 0; t < fs->n_tokens; t++)
            sampler_accept(sp->s, fs->tokens[t]);
        if (!(sq->flags & PROTO_STEP_SAMPLE))
            continue;
        if (picked) {
            o->token = w->g_ids[i];
            o->logprob = w->g_lps[i];
            n_picked++;
            continue;
        }
        o->n_top = sq->sampling.n_top_logprobs;
        if (dev) {
            int32_t *pen = w->dpen + (size_t)i * 2 * SAMPLE_PEN_CAP;
            if (sampler_dev_row(sp->s, &w->drows[i], pen, pen + SAMPLE_PEN_CAP, SAMPLE_PEN_CAP))
                w->dwant[i] = 1;
            else
                w->drow_p[i] = &w->drows[i];
            continue;
        }
        w->sjobs[n_sample++] =
            (struct samp_job){sp->s, w->logits + (size_t)i * w->m->hp.n_vocab, o, {{0, 0}}};
    }
    uint64_t t_samp = rkv_now_ns();
    if (dev) {
        int used = 0;
        rc = fwd_sample(w->fwd, n, w->drow_p, w->douts, w->dwant, w->logits, &used);
        if (rc)
            return rc;
        for (uint32_t i = 0; i < n; i++) {
            struct samp *sp = w->rows_sp[i];
            struct proto_step_out *o = &outs[i];
            if (!w->drow_p[i] && !w->dwant[i])
                continue; /* not sampled this pass */
            if (used && w->drow_p[i] && w->douts[i].status == 0) {
                struct sample_top top[PROTO_MAX_TOP_LOGPROBS];
                o->token = sampler_dev_finish(sp->s, &w->douts[i], &o->logprob, top);
                for (uint8_t k = 0; k < o->n_top; k++) {
                    o->top[k].id = top[k].id;
                    o->top[k].logprob = top[k].logprob;
                }
                n_picked++;
                continue;
            }
            w->sjobs[n_sample++] =
                (struct samp_job){sp->s, w->logits + (size_t)i * w->m->hp.n_vocab, o, {{0, 0}}};
        }
    }
    sample_rows(w, n_sample);
    w->st.sample_ns += rkv_now_ns() - t_samp;
    w->st.rows += n_sample + n_picked;
    w->st.picked += n_picked;
    return 0;
}

static int do_step(struct worker *w, const struct proto_in *in, struct proto_wbuf *reply,
                   int *reply_type, char *err, size_t errlen)
{
    struct proto_step_req *req;
    int rc = proto_step_req_decode(in->payload, in->len, &req, err, errlen);
    if (rc)
        return rc;
    /* sessions that ended: their samplers go now, not at the sweep */
    for (uint32_t i = 0; i < req->n_close; i++) {
        struct samp *gone = rkv_map_del(&w->samplers, req->close[i]);
        if (gone) {
            sampler_free(gone->s);
            free(gone);
        }
    }
    if (req->n_seqs == 0) {
        /* nothing to run (a step that only closes sessions) */
        struct proto_step_resp empty = {req->epoch, 0, NULL};
        int erc = proto_step_resp_encode(&empty, reply, err, errlen);
        proto_step_req_free(req);
        *reply_type = PROTO_MSG_STEP_RESP;
        return erc;
    }
    uint32_t n = req->n_seqs, n_tok = 0;
    size_t n_refs = 0;
    for (uint32_t i = 0; i < n; i++) {
        n_tok += req->seqs[i].n_tokens;
        n_refs += req->seqs[i].n_blocks;
    }
    if (!w->fwd) {
        proto_step_req_free(req);
        return proto_seterr(err, errlen, RKV_ESTATE, "the worker is not attached to kvmgr yet");
    }
    if (n > (uint32_t)w->c.max_seqs || n_tok > (uint32_t)w->c.max_batch_tokens) {
        proto_step_req_free(req);
        return proto_seterr(err, errlen, RKV_ETOOBIG,
                            "step of %u sequences / %u tokens is over this worker's %lld / %lld", n,
                            n_tok, (long long)w->c.max_seqs, (long long)w->c.max_batch_tokens);
    }
    if (n_refs > w->refs_cap) {
        struct kv_block_ref *r = realloc(w->refs, n_refs * sizeof *r);
        if (!r) {
            proto_step_req_free(req);
            return RKV_ENOMEM;
        }
        w->refs = r;
        w->refs_cap = n_refs;
    }
    struct kv_block_ref *ref = w->refs;
    for (uint32_t i = 0; i < n; i++) {
        const struct proto_step_seq *sq = &req->seqs[i];
        struct fwd_seq *fs = &w->fseqs[i];
        for (uint32_t b = 0; b < sq->n_blocks; b++) {
            ref[b].index = sq->blocks[b].index;
            /* a block with a clean host copy is read from the device */
            ref[b].residency = sq->blocks[b].residency == PROTO_RES_HOST ? KV_HOST : KV_DEVICE;
            if (ref[b].index >= w->pools.n_blocks[ref[b].residency]) {
                proto_step_req_free(req);
                return proto_seterr(err, errlen, RKV_EPROTO,
                                    "session %llu block %u: index %u is outside the %s pool",
                                    (unsigned long long)sq->session_id, b, ref[b].index,
                                    ref[b].residency == KV_HOST ? "host" : "device");
            }
        }
        fs->tokens = sq->tokens;
        fs->n_tokens = sq->n_tokens;
        fs->n_past = sq->n_past;
        fs->blocks = ref;
        fs->n_blocks = sq->n_blocks;
        ref += sq->n_blocks;
    }
    /* each row's sampler first: when every sampled row is plain greedy the backend picks the
     * tokens where the logits are (a gpu then sends back two numbers a row, not the logits) */
    int greedy = 1, all_sample = 1;
    for (uint32_t i = 0; i < n; i++) {
        const struct proto_step_seq *sq = &req->seqs[i];
        w->rows_sp[i] = sampler_for(w, sq, &w->rows_rc[i]);
        all_sample &= (sq->flags & PROTO_STEP_SAMPLE) != 0 && w->rows_sp[i] != NULL;
        if (sq->flags & PROTO_STEP_SAMPLE)
            greedy &= w->rows_sp[i] && sampler_plain_greedy(w->rows_sp[i]->s);
    }
    /* several decode steps: each feeds the tokens the one before picked (by the backend or by
     * the row's sampler, whose draws go on in order), so every row must sample, none may ask
     * for top alternatives (later steps answer a token and its logprob), and its blocks must
     * cover the positions the later steps write; else fewer (rkvd reads how many from each
     * output's n_more) */
    uint32_t n_steps = all_sample ? req->n_steps : 1;
    for (uint32_t i = 0; i < n && n_steps > 1; i++)
        if (req->seqs[i].sampling.n_top_logprobs)
            n_steps = 1;
    for (uint32_t i = 0; i < n && n_steps > 1; i++) {
        const struct proto_step_seq *sq = &req->seqs[i];
        uint64_t room = (uint64_t)sq->n_blocks * w->layout.block_size,
                 need = (uint64_t)sq->n_past + sq->n_tokens;
        n_steps = room < need ? 1 : (uint32_t)RKV_MIN((uint64_t)n_steps, room - need + 1);
    }
    struct proto_step_out *outs = calloc(n ? n : 1, sizeof *outs);
    struct proto_step_out *po = n_steps > 1 ? calloc(n, sizeof *po) : outs;
    if (!outs || !po) {
        free(outs);
        proto_step_req_free(req);
        return RKV_ENOMEM;
    }
    for (uint32_t k = 0; k < n_steps; k++) {
        if (k) {
            /* the next decode step: each row's picked token at the position after */
            for (uint32_t i = 0; i < n; i++) {
                struct fwd_seq *fs = &w->fseqs[i];
                fs->n_past += fs->n_tokens;
                w->g_feed[i] = po[i].token;
                fs->tokens = &w->g_feed[i];
                fs->n_tokens = 1;
            }
            memset(po, 0, n * sizeof *po);
        }
        rc = step_pass(w, req, po, greedy);
        if (rc) {
            if (po != outs)
                free(po);
            free(outs);
            proto_step_req_free(req);
            return proto_seterr(err, errlen, rc, "forward step failed: %s", rkv_strerror(rc));
        }
        int stop = 0;
        for (uint32_t i = 0; i < n; i++) {
            stop |= po[i].status != 0 || po[i].token < 0;
            if (k)
                outs[i].more[outs[i].n_more++] = (struct proto_logprob){po[i].token, po[i].logprob};
        }
        if (k == 0 && po != outs)
            memcpy(outs, po, n * sizeof *po);
        if (stop)
            break; /* a row without a token has nothing to feed the next step */
    }
    if (po != outs)
        free(po);
    struct proto_step_resp resp = {req->epoch, n, outs};
    rc = proto_step_resp_encode(&resp, reply, err, errlen);
    free(outs);
    proto_step_req_free(req);
    *reply_type = PROTO_MSG_STEP_RESP;
    if (w->n_steps - w->swept_at >= 4096) {
        sweep_samplers(w);
        w->swept_at = w->n_steps;
    }
    return rc;
}

/* one info line every rkv_step_report_ms() (10 s) while steps run: what a step costs here
 * and what passes between steps (rkvd and kvmgr), for tuning and support */
static void step_report(struct worker *w, uint64_t now)
{
    struct step_times *t = &w->st;
    if (!t->t_report) {
        t->t_report = now;
        w->report_ms = rkv_step_report_ms();
    }
    if (now - t->t_report < w->report_ms * 1000000ull || !t->steps)
        return;
    double n = (double)t->steps;
    char bs[1024]; /* the cuda backend's counters run past 600 characters */
    backend_stats(w->be, bs, sizeof bs);
    log_info(
        "%llu steps in %.1f s (%.1f decode steps each, %.1f sampled rows, %.1f of them picked "
        "by the backend, %.1f tokens each): forward %.3f ms, sampling %.3f ms, the rest of the "
        "step %.3f ms, between steps %.3f ms (rkvd, kvmgr, ipc)%s%s",
        (unsigned long long)t->steps, (double)(now - t->t_report) / 1e9, (double)t->passes / n,
        (double)t->rows / n, (double)t->picked / n, (double)t->tokens / n,
        (double)t->fwd_ns / n / 1e6, (double)t->sample_ns / n / 1e6,
        (double)(t->handle_ns - t->fwd_ns - t->sample_ns) / n / 1e6, (double)t->gap_ns / n / 1e6,
        bs[0] ? "; " : "", bs);
    *t = (struct step_times){.t_report = now, .t_last_end = t->t_last_end};
}

static int handle(void *ctx, const struct proto_in *in, struct proto_wbuf *reply, int *reply_type,
                  char *err, size_t errlen)
{
    struct worker *w = ctx;
    switch (in->hdr.type) {
    case PROTO_MSG_STEP_REQ: {
        uint64_t t0 = rkv_now_ns();
        /* a gap of over a second is idleness, not overhead */
        if (w->st.t_last_end && t0 - w->st.t_last_end < 1000000000ull)
            w->st.gap_ns += t0 - w->st.t_last_end;
        int rc = do_step(w, in, reply, reply_type, err, errlen);
        uint64_t t1 = rkv_now_ns();
        w->st.handle_ns += t1 - t0;
        w->st.steps++;
        w->st.t_last_end = t1;
        step_report(w, t1);
        return rc;
    }
    case PROTO_MSG_HELLO: {
        struct proto_hello_ack ack = {.accepted = w->fwd != NULL,
                                      .kvmgr_pid = w->kvmgr_pid,
                                      .block_size = w->layout.block_size,
                                      .block_bytes = kv_block_bytes(&w->layout),
                                      .n_device_blocks = w->pools.n_blocks[KV_DEVICE],
                                      .n_host_blocks = w->pools.n_blocks[KV_HOST],
                                      .max_batch_tokens = (uint32_t)w->c.max_batch_tokens,
                                      .on_gpu = w->on_gpu != 0};
        *reply_type = PROTO_MSG_HELLO_ACK;
        return proto_put_json(reply, PROTO_MSG_HELLO_ACK, &ack, err, errlen);
    }
    default:
        return proto_seterr(err, errlen, RKV_EPROTO, "rkv-worker does not serve %s messages",
                            proto_msg_name(in->hdr.type));
    }
}

static int load(struct worker *w)
{
    char err[512];
    int rc = gguf_open(w->c.model, &w->g, err, sizeof err);
    if (rc) {
        log_error("%s", err);
        return rc;
    }
    struct backend_opts bo = {backends[w->c.backend], (uint32_t)w->c.threads,
                              w->c.gpu < 0 ? 0 : (int)w->c.gpu, w->c.deterministic};
    if ((rc = backend_init(&bo, &w->be, err, sizeof err))) {
        log_error("%s", err);
        return rc;
    }
    if ((rc = model_load_gguf(w->be, w->g, w->c.model, &w->m, err, sizeof err))) {
        log_error("%s", err);
        return rc;
    }
    w->on_gpu = strcmp(backend_name(w->be), "cuda") == 0;
    /* the step size by the backend: a gpu's prefill runs ~1.3x faster in chunks of 2048 than of
     * 256 (the compute reserve grows with it); rkvd hears it in the hello */
    if (!w->c.max_batch_tokens)
        w->c.max_batch_tokens = RKV_MAX(w->on_gpu ? 2048 : 512, w->c.max_seqs);
    if (w->c.max_seqs > w->c.max_batch_tokens) {
        log_error("--max-seqs %lld is more than --max-batch-tokens %lld: a step carries a token "
                  "of every sequence; raise --max-batch-tokens (or give 0: by the backend) or "
                  "lower --max-seqs",
                  (long long)w->c.max_seqs, (long long)w->c.max_batch_tokens);
        return RKV_EINVAL;
    }
    if (w->c.deterministic)
        log_info("deterministic: batch-invariant kernels%s",
                 w->on_gpu ? " (one attention split per kv block, one linear kernel per token "
                             "count; slower than the default)"
                           : " (the cpu backend's default)");
    w->gpu = w->c.gpu < 0 ? 0 : (uint32_t)w->c.gpu;
    w->fseqs = calloc((size_t)w->c.max_seqs, sizeof *w->fseqs);
    w->sjobs = calloc((size_t)w->c.max_seqs, sizeof *w->sjobs);
    w->g_ids = calloc((size_t)w->c.max_seqs, sizeof *w->g_ids);
    w->g_feed = calloc((size_t)w->c.max_seqs, sizeof *w->g_feed);
    w->g_lps = calloc((size_t)w->c.max_seqs, sizeof *w->g_lps);
    w->rows_sp = calloc((size_t)w->c.max_seqs, sizeof *w->rows_sp);
    w->rows_rc = calloc((size_t)w->c.max_seqs, sizeof *w->rows_rc);
    w->drows = calloc((size_t)w->c.max_seqs, sizeof *w->drows);
    w->drow_p = calloc((size_t)w->c.max_seqs, sizeof *w->drow_p);
    w->douts = calloc((size_t)w->c.max_seqs, sizeof *w->douts);
    w->dwant = calloc((size_t)w->c.max_seqs, sizeof *w->dwant);
    w->dpen = calloc((size_t)w->c.max_seqs * 2 * SAMPLE_PEN_CAP, sizeof *w->dpen);
    w->logits = backend_host_alloc(w->be, (size_t)w->c.max_seqs * w->m->hp.n_vocab * sizeof(float));
    if (!w->fseqs || !w->sjobs || !w->logits || !w->g_ids || !w->g_feed || !w->g_lps ||
        !w->rows_sp || !w->rows_rc || !w->drows || !w->drow_p || !w->douts || !w->dwant ||
        !w->dpen) {
        log_error("out of host memory for %lld rows of %u logits", (long long)w->c.max_seqs,
                  w->m->hp.n_vocab);
        return RKV_ENOMEM;
    }
    /* rows are sampled in parallel: 64 rows of a 128k vocab with logprobs
     * take longer on one thread than the gpu's decode step */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n_samp = w->c.sample_threads > 0 ? (uint32_t)w->c.sample_threads
                      : w->c.threads > 0      ? (uint32_t)w->c.threads
                                              : (uint32_t)(cpus > 0 ? cpus : 1);
    if ((rc = pool_init(&w->samp_pool, RKV_MIN(n_samp, SAMPLE_MAX_THREADS)))) {
        log_error("cannot start the sampling threads: %s", rkv_strerror(rc));
        return rc;
    }
    log_info("loaded %s on %s: %u layers, %u wide, %u vocab, %.1f MiB of weights", w->c.model,
             backend_name(w->be), w->m->hp.n_layer, w->m->hp.dim, w->m->hp.n_vocab,
             (double)w->m->weight_bytes / (1 << 20));
    return 0;
}

int main(int argc, char **argv)
{
    static struct worker w;
    char err[1024];
    rkv_log_init("rkv-worker", RKV_LOG_INFO);
    static const struct cfg_spec spec = {"rkv-worker", "--model FILE [options]", keys,
                                         sizeof keys / sizeof keys[0], NULL};
    int rc = cfg_load_args(&spec, &w.c, argc, argv);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (!w.c.model[0]) {
        log_error("rkv-worker: --model is required");
        return 2;
    }
    rkv_log_set_level(rkv_log_level_at(w.c.log_level));
    if (!w.c.kvmgr_url[0])
        snprintf(w.c.kvmgr_url, sizeof w.c.kvmgr_url, "ipc://%s/kvmgr.sock", w.c.runtime_dir);
    if (!w.c.listen[0])
        snprintf(w.c.listen, sizeof w.c.listen, "ipc://%s/worker%lld.sock", w.c.runtime_dir,
                 (long long)w.c.worker_id);

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    rkv_map_init(&w.samplers);
    proto_wbuf_init(&w.out);
    if ((rc = load(&w)))
        return 1;
    if ((rc = proto_sock_open(&w.kvmgr, PROTO_SOCK_REQ, w.c.kvmgr_url, err, sizeof err)) ||
        (rc = proto_sock_open(&w.rep, PROTO_SOCK_REP, w.c.listen, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    uint64_t last_check = 0;
    while (!g_stop) {
        if (!w.fwd) {
            rc = attach(&w);
            if (rc) {
                log_ratelimited(RKV_LOG_WARN, 10000, 2, "waiting for kvmgr at %s: %s",
                                w.c.kvmgr_url, rkv_strerror(rc));
                rkv_sleep_ms(200);
                continue;
            }
        }
        rc = proto_serve_one(w.rep, handle, &w, 250, err, sizeof err);
        if (rc && rc != RKV_ETIMEOUT && rc != -EAGAIN)
            log_ratelimited(RKV_LOG_WARN, 5000, 5, "bad request: %s", err);
        uint64_t now = rkv_now_ms();
        /* soon after a kvmgr restart: rkvd's steps wait on the re-attach */
        if (now - last_check > 250) {
            last_check = now;
            if (!kvmgr_same(&w)) {
                log_warn("kvmgr (pid %u) is gone: detaching and waiting for a new one",
                         w.kvmgr_pid);
                detach(&w);
            }
        }
    }
    log_info("stopping");
    detach(&w);
    proto_sock_close(w.rep);
    proto_sock_close(w.kvmgr);
    size_t it = 0;
    void *v;
    while (rkv_map_next(&w.samplers, &it, NULL, &v)) {
        struct samp *sp = v;
        sampler_free(sp->s);
        free(sp);
    }
    rkv_map_fini(&w.samplers);
    free(w.fseqs);
    free(w.sjobs);
    free(w.g_ids);
    free(w.g_feed);
    free(w.g_lps);
    free(w.rows_sp);
    free(w.rows_rc);
    free(w.drows);
    free(w.drow_p);
    free(w.douts);
    free(w.dwant);
    free(w.dpen);
    if (w.be)
        backend_host_free(w.be, w.logits);
    if (w.samp_pool)
        pool_free(w.samp_pool);
    free(w.refs);
    proto_wbuf_free(&w.out);
    model_free(w.m);
    backend_free(w.be);
    gguf_close(w.g);
    return 0;
}
