/* main.c - rkv-worker's process shell: configuration, the model, kvmgr's KV pools, the request
 * loop that serves rkvd (its steps run in step.c). */
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
#include "common/grammar.h"
#include "common/log.h"
#include "common/shm.h"
#include "common/util.h"
#include "proto/msg.h"
#include "proto/sock.h"
#include "proto/wire.h"
#include "worker/backend.h"
#include "worker/cuda/tuning.h"
#include "worker/forward.h"
#include "worker/model.h"
#include "worker/pool.h"
#include "worker/rates.h"
#include "worker/reserve.h"
#include "worker/sample.h"
#include "worker/step.h"
#include "worker/tail_policy.h"

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

static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
/* enum kv_dtype order */
static const char *const kv_dtypes[] = {"f32", "f16", "q8", "fp8", NULL};
static const char *const host_attns[] = {"auto", "gpu", "cpu", NULL};
static const char *const swa_kvs[] = {"window", "full", NULL};

#define K(n, t, f) n, t, offsetof(struct worker_conf, f)
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
    {K("kv_dtype", CFG_ENUM, kv_dtype), .names = kv_dtypes, .def = "f16", .help = "kv cache type"},
    {K("swa_kv", CFG_ENUM, swa_kv), .names = swa_kvs, .def = "window",
     .help = "a sliding-window model's local layers: keep only their window of kv (window) or "
             "every position (full); the cuda backend always keeps every position"},
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
    {K("cuda_tune", CFG_STR, cuda_tune), sizeof(((struct worker_conf *)0)->cuda_tune),
     .help = "the cuda backend's tuning knobs, name=value,... (docs/operations.md); empty: their "
             "defaults"},
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

/* "shm:/name" (cpu mode) -> "/name" */
static const char *shm_name(const char *url)
{
    return strncmp(url, "shm:", 4) == 0 ? url + 4 : url;
}

static void detach(struct worker *w)
{
    fwd_destroy(w->fwd);
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

/* where a spilled session's host blocks are attended on a gpu worker: the rule kvmgr's planner
 * applies to the rates this worker reported (CPU_TAIL when the cpu attends faster than host
 * blocks reach the gpu, and faster than the split reads them), or what --host-attn forces */
static int apply_host_attn(struct worker *w, double split_gbps)
{
    if (!w->on_gpu)
        return 0;
    const struct rates *r = &w->rates;
    const int cpu = tail_cpu_wanted(r, w->c.host_attn, split_gbps);
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

/* sets the split's share (tail_split_plan's); nothing under CPU_TAIL (the cpu takes every host
 * block already). 1 when the split runs */
static int apply_host_split(struct worker *w, int cpu_tail, const struct tail_split_plan *sp)
{
    if (!w->on_gpu || !w->c.host_split)
        return 0;
    const struct rates *r = &w->rates;
    const uint32_t pct = cpu_tail ? 0 : sp->pct;
    int rc = backend_host_split(w->be, pct);
    if (rc < 0)
        log_warn("the split host read is off: %s%s", rkv_strerror(rc),
                 w->c.deterministic ? " (--deterministic keeps host blocks on the gpu)" : "");
    else if (rc == 0 && pct)
        log_info("host kv blocks split: %u %% of each decode row's on the cpu (%.2f GB/s), the "
                 "rest read by the gpu (%.2f)%s",
                 pct, sp->cpu_gbps, sp->gpu_gbps,
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
    int rc =
        fwd_kv_layout(w->m, (uint32_t)w->c.block_size, (enum kv_dtype)w->c.kv_dtype, &w->layout);
    if (rc == RKV_EINVAL && kv_dtype_is_8bit((enum kv_dtype)w->c.kv_dtype))
        log_error("kv_dtype %s needs a head_dim that is a multiple of 8 and this model's is %u: "
                  "set kv_dtype = f16",
                  kv_dtype_name((enum kv_dtype)w->c.kv_dtype), w->m->hp.head_dim);
    /* local layers keep only their window (cpu backend: its kernels read a layer's view) */
    if (rc == 0 && w->c.swa_kv == 0 && !w->on_gpu)
        rc = fwd_kv_layout_window(w->m, &w->layout);
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
                            w->reserve,
                            (int)w->layout.dtype,
                            w->layout.n_parts,
                            w->layout.n_swa};
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
    rc = fwd_create(&w->fwd, w->m, &w->layout, &w->pools, (uint32_t)w->c.max_batch_tokens,
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
    /* the split host read where CPU_TAIL does not take the host blocks (a gpu worker only) */
    struct tail_split_plan sp = {0};
    if (w->on_gpu)
        tail_split_plan(&w->rates, w->c.host_split, w->c.deterministic, &sp);
    const int split_on = apply_host_split(w, apply_host_attn(w, sp.gbps), &sp);
    struct proto_worker_report rep = {
        (uint32_t)w->c.worker_id, w->m->weight_bytes,        w->reserve,
        w->rates.pcie_h2d_gbps,   w->rates.attn_device_gbps, w->rates.attn_host_gbps,
        w->rates.attn_cpu_gbps,   split_on ? sp.gbps : 0};
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
        int rc = step_run(w, in, reply, reply_type, err, errlen);
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
    /* the cuda backend reads its knobs where rkvd's environment and a flag both reach it; a
     * knob it does not know, or a value out of its range, stops the worker here */
    if (w->c.cuda_tune[0]) {
        struct cuda_tune knobs;
        cuda_tune_defaults(&knobs);
        if (cuda_tune_parse(&knobs, w->c.cuda_tune)) {
            log_error("cuda_tune \"%s\": fix the knobs named above (docs/operations.md, CUDA "
                      "backend tuning, lists each with its range)",
                      w->c.cuda_tune);
            return RKV_EINVAL;
        }
        if (setenv("RKV_CUDA_TUNE", w->c.cuda_tune, 1) != 0)
            return -errno;
    }
    struct backend_opts bo = {backends[w->c.backend], (uint32_t)w->c.threads,
                              w->c.gpu < 0 ? 0 : (int)w->c.gpu, w->c.deterministic};
    if ((rc = backend_create(&bo, &w->be, err, sizeof err))) {
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
    w->mask_rows = calloc((size_t)w->c.max_seqs, sizeof *w->mask_rows);
    w->drows = calloc((size_t)w->c.max_seqs, sizeof *w->drows);
    w->drow_p = calloc((size_t)w->c.max_seqs, sizeof *w->drow_p);
    w->douts = calloc((size_t)w->c.max_seqs, sizeof *w->douts);
    w->dwant = calloc((size_t)w->c.max_seqs, sizeof *w->dwant);
    w->dpen = calloc((size_t)w->c.max_seqs * 2 * SAMPLE_PEN_CAP, sizeof *w->dpen);
    w->logits = backend_host_alloc(w->be, (size_t)w->c.max_seqs * w->m->hp.n_vocab * sizeof(float));
    if (!w->fseqs || !w->sjobs || !w->logits || !w->g_ids || !w->g_feed || !w->g_lps ||
        !w->rows_sp || !w->rows_rc || !w->mask_rows || !w->drows || !w->drow_p || !w->douts ||
        !w->dwant || !w->dpen) {
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
    if ((rc = pool_create(&w->samp_pool, RKV_MIN(n_samp, SAMPLE_MAX_THREADS)))) {
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
    rkv_map_init(&w.grammars);
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
    while (rkv_map_next(&w.samplers, &it, NULL, &v))
        samp_destroy(v);
    rkv_map_fini(&w.samplers);
    gram_sweep(&w, 1);
    rkv_map_fini(&w.grammars);
    grammar_vocab_destroy(w.gvocab);
    free(w.fseqs);
    free(w.sjobs);
    free(w.g_ids);
    free(w.g_feed);
    free(w.g_lps);
    free(w.rows_sp);
    free(w.rows_rc);
    free(w.mask_rows);
    free(w.drows);
    free(w.drow_p);
    free(w.douts);
    free(w.dwant);
    free(w.dpen);
    if (w.be)
        backend_host_free(w.be, w.logits);
    if (w.samp_pool)
        pool_destroy(w.samp_pool);
    free(w.refs);
    proto_wbuf_fini(&w.out);
    model_destroy(w.m);
    backend_destroy(w.be);
    gguf_close(w.g);
    return 0;
}
