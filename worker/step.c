/* step.c - the step loop: runs rkvd's STEP_REQ on the worker's state (forward passes, samplers,
 * several decode steps in one request) and reports where a step's time goes. */
#include "worker/step.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grammar.h"
#include "common/log.h"
#include "common/tok.h"
#include "common/util.h"
#include "proto/msg.h"
#include "proto/sock.h"
#include "proto/wire.h"
#include "worker/backend.h"
#include "worker/forward.h"
#include "worker/model.h"
#include "worker/pool.h"
#include "worker/sample.h"

void samp_destroy(struct samp *sp)
{
    if (!sp)
        return;
    sampler_destroy(sp->s); /* before the grammar its matcher reads */
    if (sp->gr)
        sp->gr->refs--;
    free(sp);
}

static uint64_t text_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* fnv-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* drops cached grammars no sampler uses and none asked for in a while (all with force) */
void gram_sweep(struct worker *w, int force)
{
    size_t it = 0;
    uint64_t key;
    void *v;
    while (rkv_map_next(&w->grammars, &it, &key, &v)) {
        struct gram_ref *gr = v;
        if (force || (gr->refs == 0 && w->n_steps - gr->last_step > 1000)) {
            grammar_destroy(gr->g);
            free(gr->text);
            free(gr);
            rkv_map_del(&w->grammars, key);
            it = 0;
        }
    }
}

/* the grammar a request's sampler follows: compiled here (rkvd checked it), against the
 * vocabulary's token bytes, made once */
static int grammar_for(struct worker *w, const struct proto_step_seq *sq, struct samp *sp)
{
    char err[256] = "";
    int rc = 0;
    if (!w->gvocab) {
        struct tok *t = NULL;
        rc = tok_load_gguf(w->g, &t, err, sizeof err);
        if (!rc)
            rc = grammar_vocab_from_tok(&w->gvocab, t);
        tok_destroy(t);
        if (!rc && grammar_vocab_n(w->gvocab) > (int32_t)w->m->hp.n_vocab) {
            snprintf(err, sizeof err, "the tokenizer has %d tokens, the model's output %lld",
                     (int)grammar_vocab_n(w->gvocab), (long long)w->m->hp.n_vocab);
            grammar_vocab_destroy(w->gvocab);
            w->gvocab = NULL;
            rc = RKV_EINVAL;
        }
        if (rc) {
            log_warn("session %llu: no token bytes for its grammar: %s",
                     (unsigned long long)sq->session_id, err[0] ? err : rkv_strerror(rc));
            return rc;
        }
    }
    const char *text = sq->sampling.grammar;
    size_t len = sq->sampling.grammar_len;
    /* the text's slot: its hash, or the next free key after another text with that hash */
    uint64_t key = text_hash(text, len) | 1; /* never the map's reserved 0 */
    struct gram_ref *gr;
    while ((gr = rkv_map_get(&w->grammars, key)) &&
           (strlen(gr->text) != len || memcmp(gr->text, text, len)))
        key += 2;
    if (!gr) {
        gr = calloc(1, sizeof *gr);
        if (!gr || !(gr->text = strndup(text, len)) || rkv_map_put(&w->grammars, key, gr)) {
            if (gr)
                free(gr->text);
            free(gr);
            return RKV_ENOMEM;
        }
        if ((rc = grammar_compile(text, len, &gr->g, err, sizeof err)) != 0) {
            log_warn("session %llu: grammar: %s", (unsigned long long)sq->session_id, err);
            rkv_map_del(&w->grammars, key);
            free(gr->text);
            free(gr);
            return rc;
        }
    }
    gr->refs++;
    gr->last_step = w->n_steps;
    sp->gr = gr;
    return 0;
}

static struct samp *sampler_for(struct worker *w, const struct proto_step_seq *sq, int *rc)
{
    struct samp *sp = rkv_map_get(&w->samplers, sq->session_id);
    *rc = 0;
    if (sp && !(sq->flags & PROTO_STEP_RESET))
        return sp;
    if (!sp && !(sq->flags & PROTO_STEP_RESET)) {
        /* a session this worker has no sampler for, in a step that does not rebuild it: a step
         * sent before this worker started (nng kept it for the next connection), or one whose
         * sampler the sweep took. Its grammar, penalties and rng draws are not here, so rkvd
         * is asked for a step that resets it, rather than sampling with defaults */
        log_warn("session %llu: no sampler here and the step does not rebuild it: asking rkvd "
                 "for one that does",
                 (unsigned long long)sq->session_id);
        *rc = RKV_ESTATE;
        return NULL;
    }
    if (!sp) {
        sp = calloc(1, sizeof *sp);
        if (!sp || rkv_map_put(&w->samplers, sq->session_id, sp)) {
            free(sp);
            *rc = RKV_ENOMEM;
            return NULL;
        }
    }
    sampler_destroy(sp->s);
    sp->s = NULL;
    if (sp->gr)
        sp->gr->refs--;
    sp->gr = NULL;
    if (sq->sampling.grammar_len && (*rc = grammar_for(w, sq, sp)) != 0)
        return NULL;
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
    /* the message's list; sampler_create keeps a copy */
    struct sample_bias bias[PROTO_MAX_LOGIT_BIAS];
    p.n_bias = sq->sampling.n_bias;
    for (int32_t i = 0; i < p.n_bias; i++)
        bias[i] = (struct sample_bias){sq->sampling.bias[i].id, sq->sampling.bias[i].bias};
    p.bias = bias;
    p.grammar = sp->gr ? sp->gr->g : NULL;
    p.grammar_vocab = sp->gr ? w->gvocab : NULL;
    char err[256];
    if ((*rc = sample_params_check(&p, err, sizeof err)) != 0) {
        log_warn("session %llu: %s", (unsigned long long)sq->session_id, err);
        return NULL;
    }
    if ((*rc = sampler_create(&sp->s, &p, (int32_t)w->m->hp.n_vocab)) != 0)
        return NULL;
    for (uint32_t i = 0; i < sq->n_history; i++)
        sampler_accept(sp->s, sq->history[i]);
    sampler_skip_draws(sp->s, sq->n_drawn);
    /* the request's answer so far is the last n_drawn ids of history and this step's tokens */
    uint32_t n_gen = sq->n_drawn, n_all = sq->n_history + sq->n_tokens;
    for (uint32_t i = n_all - RKV_MIN(n_gen, n_all); sp->gr && i < n_all && !*rc; i++)
        *rc = sampler_grammar_replay(
            sp->s, i < sq->n_history ? &sq->history[i] : &sq->tokens[i - sq->n_history], 1);
    if (*rc) {
        log_warn("session %llu: its answer so far does not follow its grammar",
                 (unsigned long long)sq->session_id);
        return NULL;
    }
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
            samp_destroy(sp);
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

/* the constrained rows' grammar masks, computed on the sample pool by a thread of their own
 * while the step's forward pass runs (a mask over a large vocabulary can take milliseconds) */
struct mask_run {
    struct worker *w;
    struct sampler **rows; /* (n) */
    uint32_t n;
    pthread_t th;
};

static void mask_range(void *arg, uint32_t begin, uint32_t end, uint32_t thread)
{
    struct sampler **rows = arg;
    (void)thread;
    for (uint32_t i = begin; i < end; i++)
        sampler_grammar_prepare(rows[i]); /* a failure: sampler_sample tries again */
}

static void *mask_main(void *arg)
{
    struct mask_run *mr = arg;
    if (mr->n >= 2 && pool_n_threads(mr->w->samp_pool) > 1)
        pool_run(mr->w->samp_pool, mask_range, mr->rows, mr->n, 1);
    else
        mask_range(mr->rows, 0, mr->n, 0);
    return NULL;
}

/* starts the masks of the rows this pass samples that follow a grammar; 1 when a thread runs
 * them (mask_join waits for it), 0 when there are none or no thread could start (then each
 * row's sampler computes its own) */
static int mask_start(struct worker *w, const struct proto_step_req *req, struct mask_run *mr)
{
    mr->w = w;
    mr->n = 0;
    mr->rows = w->mask_rows;
    for (uint32_t i = 0; i < req->n_seqs; i++) {
        struct samp *sp = w->rows_sp[i];
        if (sp && (req->seqs[i].flags & PROTO_STEP_SAMPLE) && sampler_has_grammar(sp->s))
            mr->rows[mr->n++] = sp->s;
    }
    return mr->n && pthread_create(&mr->th, NULL, mask_main, mr) == 0;
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
    struct mask_run mr;
    const int masking = !greedy && mask_start(w, req, &mr);
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
    if (masking)
        pthread_join(mr.th, NULL);
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

int step_run(struct worker *w, const struct proto_in *in, struct proto_wbuf *reply, int *reply_type,
             char *err, size_t errlen)
{
    struct proto_step_req *req;
    int rc = proto_step_req_decode(in->payload, in->len, &req, err, errlen);
    if (rc)
        return rc;
    /* sessions that ended: their samplers go now, not at the sweep */
    for (uint32_t i = 0; i < req->n_close; i++) {
        struct samp *gone = rkv_map_del(&w->samplers, req->close[i]);
        samp_destroy(gone);
    }
    if (req->n_seqs == 0) {
        /* nothing to run (a step that only closes sessions) */
        struct proto_step_resp empty = {req->epoch, 0, NULL};
        int erc = proto_step_resp_encode(&empty, reply, err, errlen);
        proto_step_req_destroy(req);
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
        proto_step_req_destroy(req);
        return proto_seterr(err, errlen, RKV_ESTATE, "the worker is not attached to kvmgr yet");
    }
    if (n > (uint32_t)w->c.max_seqs || n_tok > (uint32_t)w->c.max_batch_tokens) {
        proto_step_req_destroy(req);
        return proto_seterr(err, errlen, RKV_ETOOBIG,
                            "step of %u sequences / %u tokens is over this worker's %lld / %lld", n,
                            n_tok, (long long)w->c.max_seqs, (long long)w->c.max_batch_tokens);
    }
    if (n_refs > w->refs_cap) {
        struct kv_block_ref *r = realloc(w->refs, n_refs * sizeof *r);
        if (!r) {
            proto_step_req_destroy(req);
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
            /* a local part that left every window names no block */
            int dropped = ref[b].index == KV_REF_NONE && w->layout.n_parts > 1;
            if (!dropped && ref[b].index >= w->pools.n_blocks[ref[b].residency]) {
                proto_step_req_destroy(req);
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
        uint64_t room = (uint64_t)(sq->n_blocks / w->layout.n_parts) * w->layout.block_size,
                 need = (uint64_t)sq->n_past + sq->n_tokens;
        n_steps = room < need ? 1 : (uint32_t)RKV_MIN((uint64_t)n_steps, room - need + 1);
    }
    struct proto_step_out *outs = calloc(n ? n : 1, sizeof *outs);
    struct proto_step_out *po = n_steps > 1 ? calloc(n, sizeof *po) : outs;
    if (!outs || !po) {
        free(outs);
        proto_step_req_destroy(req);
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
            proto_step_req_destroy(req);
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
    proto_step_req_destroy(req);
    *reply_type = PROTO_MSG_STEP_RESP;
    if (w->n_steps - w->swept_at >= 4096) {
        sweep_samplers(w);
        gram_sweep(w, 0);
        w->swept_at = w->n_steps;
    }
    return rc;
}

/* one info line every rkv_step_report_ms() (10 s) while steps run: what a step costs here
 * and what passes between steps (rkvd and kvmgr), for tuning and support */
void step_report(struct worker *w, uint64_t now)
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
