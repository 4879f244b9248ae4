/* step.h - the worker process's state (struct worker, shared by main.c's shell and step.c) and
 * the step loop's entry points. */
#ifndef RKV_WORKER_STEP_H
#define RKV_WORKER_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "common/shm.h"
#include "common/util.h"
#include "proto/sock.h"
#include "proto/wire.h"
#include "worker/forward.h"
#include "worker/rates.h"
#include "worker/sample.h"

/* sampling threads at most, and the logits (rows x vocab) below which a
 * step samples on its own thread */
#define SAMPLE_MAX_THREADS  16
#define SAMPLE_PARALLEL_MIN (1u << 16)

/* distinct penalty ids a row may send the backend; a row with more is sampled on the host */
#define SAMPLE_PEN_CAP 4096

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
    int swa_kv; /* 0: window (local layers keep their window only), 1: full */
    int measure_rates;
    int deterministic;
    int host_attn;
    int64_t host_split;
    int log_level;
    char cuda_tune[512];
};

/* a session's sampler, kept between steps */
/* a compiled grammar the samplers of every request that sends the same text share (and with
 * it the grammar's mask cache: a batch of one schema walks the vocabulary once per state) */
struct gram_ref {
    char *text;
    struct grammar *g;
    uint32_t refs; /* samplers using it; 0: cached until the sweep */
    uint64_t last_step;
};

struct samp {
    struct sampler *s;
    struct gram_ref *gr; /* the request's grammar, or NULL (s reads it) */
    uint64_t last_step;
};
/* frees a session's sampler and drops its grammar */
void samp_destroy(struct samp *sp);
struct worker;
/* frees the cached grammars no sampler uses and none asked for in 1000 steps (all: force) */
void gram_sweep(struct worker *w, int force);

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
    /* the vocabulary's token bytes for grammars, made at the first request with one */
    struct grammar_vocab *gvocab;
    struct rkv_map grammars; /* hash of a grammar's text -> struct gram_ref */
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
    struct sampler **mask_rows; /* (max_seqs) the rows whose grammar masks run beside a pass */
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
    uint8_t *dwant; /* a row the host samples from its logits */
    int32_t *dpen;  /* (max_seqs, 2 * SAMPLE_PEN_CAP) penalty ids and counts */
    struct proto_wbuf out;
};

/* runs one STEP_REQ (in) and writes its STEP_RESP into reply */
int step_run(struct worker *w, const struct proto_in *in, struct proto_wbuf *reply, int *reply_type,
             char *err, size_t errlen);
/* one info line every rkv_step_report_ms() while steps run: where a step's time goes */
void step_report(struct worker *w, uint64_t now);

#endif
