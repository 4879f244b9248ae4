/* driver.c - worker step threads and the kvmgr monitor, talking to rkvd's loop by uv_async. */
#include "daemon/driver.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "proto/kvwire.h"
#include "proto/sock.h"
#include "proto/wire.h"

enum ev_kind {
    EV_JOB,
    EV_UP,
    EV_DOWN,
    EV_KV_CHANGED,
    EV_KV_DOWN,
    EV_STATUS,
    EV_TACTIC,
    EV_HIST,
    EV_CALL
};

struct event {
    enum ev_kind kind;
    uint32_t worker;
    struct step_job *job;
    uint32_t old_pid, new_pid;
    uint32_t max_batch_tokens; /* EV_UP: the worker's hello */
    int on_gpu;
    char why[256];
    union {
        struct proto_status status;
        struct proto_tactic_event tactic;
        struct proto_histogram hist;
    } u;
    /* EV_CALL */
    driver_call_cb cb;
    void *cb_ud;
    int rc;
    struct proto_in reply;
    int has_reply;
    struct event *next;
};

struct call {
    int type;
    void *payload;
    size_t len;
    driver_call_cb cb;
    void *ud;
    struct call *next;
};

/* the next decode step's KV_PREP, sent by a helper thread while this step runs */
enum ahead_state { AH_IDLE, AH_QUEUED, AH_DONE };

struct ahead_seq {
    uint64_t sid;
    uint32_t n_pos;
    uint8_t flags; /* PROTO_KV_PINNED / NOMOVE as the scheduler set them */
};

struct ahead {
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    enum ahead_state state;
    int stop;
    struct proto_wbuf buf; /* the encoded KV_PREP */
    uint64_t ack;          /* the epoch it acknowledges */
    struct rkv_vec seqs;   /* struct ahead_seq: what it asked for */
    uint32_t n_steps;      /* the decode steps of the step it was asked for */
    int rc;
    struct proto_in reply;
    char err[256];
    uint32_t streak; /* preps sent ahead in a row */
};

/* every so many steps the prep runs at a step boundary instead: kvmgr moves a session to
 * another gpu (rebalance) only when every position it holds is written */
#define AHEAD_MAX_STREAK 32

struct wthread {
    struct driver *d;
    uint32_t idx;
    pthread_t th;
    struct step_job *job; /* guarded by d->mu */
    struct proto_sock *kv, *wk;
    uint64_t acked_epoch;
    uint64_t sent_ack;         /* the ack kvmgr has received */
    uint32_t worker_kvmgr_pid; /* the kvmgr whose pools the worker maps (its hello) */
    uint64_t block_bytes;      /* one kv block of the worker's layout (its hello) */
    int up;
    int lost; /* guarded by d->mu: the process died; ask it for hello again */
    struct proto_wbuf buf;
    /* where a step's time goes as rkvd sees it, summed since the last report
     * (step_report): kvmgr's KV_PREP, the worker's STEP_REQ, and rkvd's loop
     * from one step's result to the next step's job */
    struct {
        uint64_t steps, prep_ns, step_ns, loop_ns, t_report, t_posted, ahead_used, ahead_sent;
    } st;
    struct ahead ah;
    uint64_t report_ms;          /* step_report's period (rkv_step_report_ms) */
    struct timespec idle_ack_at; /* guarded by d->mu: when to send the idle ack (0: not set) */
};

struct driver {
    uv_loop_t *loop;
    struct driver_config cfg;
    struct driver_cbs cbs;
    uv_async_t async;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    struct event *ev_head, *ev_tail;
    struct call *calls;
    struct wthread *w;
    pthread_t mon;
    struct proto_sock *mon_kv, *mon_sub;
    int started_threads;
};

static void post(struct driver *d, struct event *e)
{
    pthread_mutex_lock(&d->mu);
    e->next = NULL;
    if (d->ev_tail)
        d->ev_tail->next = e;
    else
        d->ev_head = e;
    d->ev_tail = e;
    pthread_mutex_unlock(&d->mu);
    uv_async_send(&d->async);
}

static struct event *ev_create(enum ev_kind k, uint32_t worker)
{
    struct event *e = calloc(1, sizeof *e);
    if (e) {
        e->kind = k;
        e->worker = worker;
    }
    return e;
}

/* --- the loop side ------------------------------------------------------------ */

static void on_async(uv_async_t *a)
{
    struct driver *d = a->data;
    pthread_mutex_lock(&d->mu);
    struct event *e = d->ev_head;
    d->ev_head = d->ev_tail = NULL;
    pthread_mutex_unlock(&d->mu);
    const struct driver_cbs *c = &d->cbs;
    while (e) {
        struct event *n = e->next;
        switch (e->kind) {
        case EV_JOB: c->job_done(c->ud, e->job); break;
        case EV_UP:
            if (c->worker_up)
                c->worker_up(c->ud, e->worker, e->max_batch_tokens, e->on_gpu);
            break;
        case EV_DOWN:
            if (c->worker_down)
                c->worker_down(c->ud, e->worker, e->why);
            break;
        case EV_KV_CHANGED:
            if (c->kvmgr_changed)
                c->kvmgr_changed(c->ud, e->old_pid, e->new_pid);
            break;
        case EV_KV_DOWN:
            if (c->kvmgr_down)
                c->kvmgr_down(c->ud, e->why);
            break;
        case EV_STATUS:
            if (c->kvmgr_status)
                c->kvmgr_status(c->ud, &e->u.status);
            break;
        case EV_TACTIC:
            if (c->tactic_event)
                c->tactic_event(c->ud, &e->u.tactic);
            break;
        case EV_HIST:
            if (c->histogram)
                c->histogram(c->ud, &e->u.hist);
            break;
        case EV_CALL:
            e->cb(e->cb_ud, e->rc, e->has_reply ? &e->reply : NULL, e->why);
            if (e->has_reply)
                proto_in_fini(&e->reply);
            break;
        }
        free(e);
        e = n;
    }
}

/* --- worker threads -------------------------------------------------------------- */

static uint8_t seq_flags(const struct job_seq *js)
{
    return (js->pinned ? PROTO_KV_PINNED : 0) | (js->nomove ? PROTO_KV_NOMOVE : 0);
}

/* what kvmgr needs of js: for its own step of n_steps decode steps, or (ahead) for the
 * step after it, asked while js's step runs: as many decode steps, from the position after
 * js's step's last */
static void prep_seq(const struct job_seq *js, int ahead, uint32_t n_steps,
                     struct proto_kv_prep_seq *ps)
{
    ps->session_id = js->sid;
    ps->flags = PROTO_KV_ACTIVE | seq_flags(js);
    /* the step's n_past was written by earlier steps that finished; ahead, the step
     * still running writes the rest */
    ps->n_written = js->n_past;
    /* the positions the step's later decode steps write; their ids are what it picks */
    ps->n_owed = (uint8_t)(n_steps - 1);
    ps->n_pos = js->n_past + js->n_tokens + ps->n_owed;
    if (js->is_new && !ahead) {
        ps->flags |= PROTO_KV_NEW;
        ps->scope = js->scope;
        ps->n_tokens = js->n_all;
        ps->tokens = js->all;
        return;
    }
    /* the tokens before the step's: when the step before used tables asked for ahead,
     * kvmgr got the last position without its id; a step of several decode steps owes
     * the ids it picked */
    ps->n_tokens = js->n_tokens + js->n_prev;
    ps->tokens = js->tokens - js->n_prev;
    if (ahead) {
        /* the next step's positions too: its input (what js's step picks last) and its
         * later decode steps, none of their ids known yet */
        ps->n_pos += n_steps;
        ps->n_owed = (uint8_t)(ps->n_owed + n_steps);
        ps->flags |= PROTO_KV_AHEAD;
    }
}

/* job's KV_PREP into buf; ahead: the step after it (no closes or idles: those go with
 * the next step's own prep) */
static int encode_prep(struct wthread *t, const struct step_job *job, int ahead,
                       struct proto_wbuf *buf, char *err, size_t errlen)
{
    struct proto_kv_prep_seq *ps = calloc(job->n_seqs ? job->n_seqs : 1, sizeof *ps);
    if (!ps)
        return RKV_ENOMEM;
    for (uint32_t i = 0; i < job->n_seqs; i++)
        prep_seq(&job->seqs[i], ahead, job->n_steps ? job->n_steps : 1, &ps[i]);
    struct proto_kv_prep m = {t->idx,
                              t->acked_epoch,
                              ahead ? 0 : job->n_closes,
                              ahead ? NULL : job->closes,
                              ahead ? 0 : job->n_idles,
                              ahead ? NULL : job->idles,
                              job->n_seqs,
                              ps};
    proto_wbuf_reset(buf);
    int rc = proto_kv_prep_encode(&m, buf, err, errlen);
    free(ps);
    return rc;
}

static int kv_prep(struct wthread *t, struct step_job *job, struct proto_kv_tables **tables)
{
    struct driver *d = t->d;
    int rc = encode_prep(t, job, 0, &t->buf, job->err, sizeof job->err);
    if (rc)
        return rc;
    struct proto_in reply;
    rc = proto_call(t->kv, PROTO_MSG_KV_PREP, t->buf.data, t->buf.len, &reply, 5000, job->err,
                    sizeof job->err);
    if (rc)
        return rc;
    t->sent_ack = t->acked_epoch;
    if (reply.hdr.type != PROTO_MSG_KV_TABLES)
        rc = proto_seterr(job->err, sizeof job->err, RKV_EPROTO, "kvmgr answered kv_prep with %s",
                          proto_msg_name(reply.hdr.type));
    else
        rc = proto_kv_tables_decode(reply.payload, reply.len, tables, job->err, sizeof job->err);
    proto_in_fini(&reply);
    if (!rc && (*tables)->n_seqs != job->n_seqs) {
        rc = proto_seterr(job->err, sizeof job->err, RKV_EPROTO,
                          "kvmgr answered %u tables for %u sequences", (*tables)->n_seqs,
                          job->n_seqs);
        proto_kv_tables_destroy(*tables);
    }
    (void)d;
    return rc;
}

/* --- the next step's KV_PREP, ahead ---------------------------------------------------- */

static void *ahead_thread(void *arg)
{
    struct wthread *t = arg;
    struct ahead *a = &t->ah;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->state != AH_QUEUED)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->stop)
            break;
        pthread_mutex_unlock(&a->mu);
        struct proto_in reply;
        char err[sizeof a->err] = "";
        int rc = proto_call(t->kv, PROTO_MSG_KV_PREP, a->buf.data, a->buf.len, &reply, 5000, err,
                            sizeof err);
        pthread_mutex_lock(&a->mu);
        a->rc = rc;
        a->reply = reply;
        memcpy(a->err, err, sizeof err);
        a->state = AH_DONE;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* is job the step the prep ahead was made for: the same sequences, each one token on */
static int ahead_matches(const struct ahead *a, const struct step_job *job)
{
    if (job->n_closes || job->n_idles || job->n_seqs != a->seqs.len || job->n_steps != a->n_steps)
        return 0;
    for (uint32_t i = 0; i < job->n_seqs; i++) {
        const struct job_seq *js = &job->seqs[i];
        const struct ahead_seq *q = rkv_vec_at(&a->seqs, struct ahead_seq, i);
        if (js->sid != q->sid || js->is_new || js->n_past + js->n_tokens != q->n_pos ||
            seq_flags(js) != q->flags)
            return 0;
    }
    return 1;
}

/* waits for the prep ahead, if one was sent, and takes its tables when job (NULL:
 * none) is the step it was made for: 1 with *tables set, else 0 (the job needs a
 * KV_PREP of its own; kvmgr cuts the positions added ahead back on it) */
static int ahead_take(struct wthread *t, const struct step_job *job,
                      struct proto_kv_tables **tables)
{
    struct ahead *a = &t->ah;
    if (!a->started)
        return 0;
    pthread_mutex_lock(&a->mu);
    while (a->state == AH_QUEUED)
        pthread_cond_wait(&a->cv, &a->mu);
    int done = a->state == AH_DONE;
    a->state = AH_IDLE;
    pthread_mutex_unlock(&a->mu);
    if (!done)
        return 0;
    if (a->rc) {
        log_debug("worker %u: the next step's kv_prep sent ahead failed: %s", t->idx, a->err);
        return 0;
    }
    if (a->ack > t->sent_ack)
        t->sent_ack = a->ack;
    int used = 0;
    char err[256];
    struct proto_kv_tables *tb = NULL;
    if (job && ahead_matches(a, job) && a->reply.hdr.type == PROTO_MSG_KV_TABLES &&
        proto_kv_tables_decode(a->reply.payload, a->reply.len, &tb, err, sizeof err) == 0) {
        used = tb->n_seqs == job->n_seqs;
        for (uint32_t i = 0; used && i < job->n_seqs; i++)
            used = tb->seqs[i].session_id == job->seqs[i].sid;
        if (used)
            *tables = tb;
        else
            proto_kv_tables_destroy(tb);
    }
    proto_in_fini(&a->reply);
    return used;
}

/* sends the KV_PREP of the step the scheduler will likely build next (every sequence of
 * job, which all sample, one token on) while job runs on the worker */
static void ahead_send(struct wthread *t, const struct step_job *job)
{
    struct ahead *a = &t->ah;
    if (!t->d->cfg.prep_ahead || !a->started || !job->n_seqs)
        return;
    if (a->streak >= AHEAD_MAX_STREAK) {
        a->streak = 0;
        return;
    }
    for (uint32_t i = 0; i < job->n_seqs; i++)
        if (!job->seqs[i].sample || job->seqs[i].status != 0 || !job->seqs[i].n_tokens)
            return;
    if (rkv_vec_reserve(&a->seqs, job->n_seqs))
        return;
    a->seqs.len = 0;
    for (uint32_t i = 0; i < job->n_seqs; i++) {
        const struct job_seq *js = &job->seqs[i];
        /* where the next step starts when no sequence stops early */
        struct ahead_seq q = {js->sid, js->n_past + js->n_tokens + job->n_steps, seq_flags(js)};
        rkv_vec_push(&a->seqs, &q);
    }
    char err[256];
    if (encode_prep(t, job, 1, &a->buf, err, sizeof err)) {
        log_debug("worker %u: the next step's kv_prep: %s", t->idx, err);
        return;
    }
    a->ack = t->acked_epoch;
    a->n_steps = job->n_steps; /* the next step likely runs as many */
    a->streak++;
    t->st.ahead_sent++;
    pthread_mutex_lock(&a->mu);
    a->state = AH_QUEUED;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* --- one step ---------------------------------------------------------------------------- */

static int worker_step(struct wthread *t, struct step_job *job, const struct proto_kv_tables *tb)
{
    uint32_t n = 0;
    struct proto_step_seq *seqs = calloc(job->n_seqs ? job->n_seqs : 1, sizeof *seqs);
    uint32_t *which = calloc(job->n_seqs ? job->n_seqs : 1, sizeof *which);
    if (!seqs || !which) {
        free(seqs);
        free(which);
        return RKV_ENOMEM;
    }
    for (uint32_t i = 0; i < job->n_seqs; i++) {
        struct job_seq *js = &job->seqs[i];
        const struct proto_kv_table *kt = &tb->seqs[i];
        js->status = kt->status;
        if (kt->status != 0)
            continue;
        uint32_t live = 0;
        for (uint32_t b = 0; b < kt->n_blocks; b++)
            live += kt->blocks[b].index != UINT32_MAX; /* KV_REF_NONE: a dropped part */
        js->kv_bytes = (uint64_t)live * t->block_bytes;
        if (kt->n_cached > js->n_past && js->n_past == 0) {
            /* kvmgr mapped this prefix to blocks another session wrote: skip
             * computing it; the sampler still sees those tokens as history */
            uint32_t skip = RKV_MIN(kt->n_cached, js->n_tokens - (js->sample ? 1 : 0));
            if (skip == js->n_tokens && js->is_new && kt->n_cached > skip) {
                /* the shared prefix reaches past this prompt chunk: the
                 * session starts after all of it (kvmgr holds those positions
                 * now; a later chunk would otherwise truncate and recompute
                 * them). kvmgr leaves at least the last prompt token to run */
                skip = RKV_MIN(kt->n_cached, js->n_all ? js->n_all - 1 : 0);
                js->n_tokens = 0;
            } else {
                js->tokens += skip;
                js->n_tokens -= skip;
            }
            if (js->reset) {
                js->history = js->is_new ? js->all : js->tokens - skip;
                js->n_history = skip;
            }
            js->n_past += skip;
            js->n_cached = skip;
            if (js->n_tokens == 0)
                continue; /* all of this chunk was there: nothing to run */
        }
        struct proto_step_seq *s = &seqs[n];
        which[n++] = i;
        s->session_id = js->sid;
        s->n_past = js->n_past;
        s->n_tokens = js->n_tokens;
        s->tokens = js->tokens;
        s->n_blocks = kt->n_blocks;
        s->blocks = kt->blocks;
        s->sampling = js->sp;
        s->flags = (js->sample ? PROTO_STEP_SAMPLE : 0) | (js->reset ? PROTO_STEP_RESET : 0);
        s->n_history = js->reset ? js->n_history : 0;
        s->n_drawn = js->reset ? js->n_drawn : 0;
        s->history = js->history;
    }
    int rc = 0;
    /* a step with only closes still reaches the worker: it frees their samplers
     * (and those of sessions that moved to another worker) */
    uint32_t n_drop = job->n_closes + job->n_forgets;
    if (n || n_drop) {
        struct proto_step_req req = {
            tb->epoch, n, seqs, n_drop, job->closes, (uint8_t)(job->n_steps ? job->n_steps : 1)};
        proto_wbuf_reset(&t->buf);
        rc = proto_step_req_encode(&req, &t->buf, job->err, sizeof job->err);
        struct proto_in reply;
        if (!rc && n == job->n_seqs)
            ahead_send(t, job);
        if (!rc)
            rc = proto_call(t->wk, PROTO_MSG_STEP_REQ, t->buf.data, t->buf.len, &reply,
                            t->d->cfg.step_timeout_ms, job->err, sizeof job->err);
        if (!rc) {
            struct proto_step_resp *resp = NULL;
            if (reply.hdr.type != PROTO_MSG_STEP_RESP)
                rc = proto_seterr(job->err, sizeof job->err, RKV_EPROTO,
                                  "worker answered step_req with %s",
                                  proto_msg_name(reply.hdr.type));
            else
                rc = proto_step_resp_decode(reply.payload, reply.len, &resp, job->err,
                                            sizeof job->err);
            if (!rc && resp->n_seqs != n)
                rc = proto_seterr(job->err, sizeof job->err, RKV_EPROTO,
                                  "worker answered %u of %u sequences", resp->n_seqs, n);
            for (uint32_t k = 0; !rc && k < n; k++) {
                struct job_seq *js = &job->seqs[which[k]];
                const struct proto_step_out *o = &resp->seqs[k];
                js->status = o->status;
                js->token = o->token;
                js->logprob = o->logprob;
                js->n_top = o->n_top;
                memcpy(js->top, o->top, o->n_top * sizeof o->top[0]);
                /* a worker runs fewer decode steps than asked, never more */
                js->n_more =
                    (uint8_t)RKV_MIN((uint32_t)o->n_more, job->n_steps ? job->n_steps - 1 : 0);
                memcpy(js->more, o->more, js->n_more * sizeof o->more[0]);
            }
            proto_step_resp_destroy(resp);
            proto_in_fini(&reply);
        }
    }
    free(seqs);
    free(which);
    return rc;
}

static void step_report(struct wthread *t, uint64_t now)
{
    if (!t->st.t_report) {
        t->st.t_report = now;
        t->report_ms = rkv_step_report_ms();
    }
    if (now - t->st.t_report < t->report_ms * 1000000ull || !t->st.steps)
        return;
    double n = (double)t->st.steps;
    log_info("worker %u: %llu steps in %.1f s: kvmgr kv_prep %.3f ms (%llu of the steps used "
             "tables asked for ahead, of %llu asked), worker step %.3f ms, rkvd loop between "
             "steps %.3f ms",
             t->idx, (unsigned long long)t->st.steps, (double)(now - t->st.t_report) / 1e9,
             (double)t->st.prep_ns / n / 1e6, (unsigned long long)t->st.ahead_used,
             (unsigned long long)t->st.ahead_sent, (double)t->st.step_ns / n / 1e6,
             (double)t->st.loop_ns / n / 1e6);
    uint64_t posted = t->st.t_posted;
    memset(&t->st, 0, sizeof t->st);
    t->st.t_report = now;
    t->st.t_posted = posted;
}

static void run_job(struct wthread *t, struct step_job *job)
{
    uint64_t t0 = rkv_now_ns();
    /* a gap of over a second is idleness, not the loop's turnaround */
    if (t->st.t_posted && t0 - t->st.t_posted < 1000000000ull)
        t->st.loop_ns += t0 - t->st.t_posted;
    struct proto_kv_tables *tb = NULL;
    int rc = 0;
    if (ahead_take(t, job, &tb)) {
        t->st.ahead_used++;
        job->prep_ahead = 1;
    } else {
        rc = kv_prep(t, job, &tb);
        t->ah.streak = 0; /* a step boundary kvmgr can move sessions at */
    }
    uint64_t t1 = rkv_now_ns();
    t->st.prep_ns += t1 - t0;
    if (rc) {
        job->rc = rc;
        job->kvmgr_failed = 1;
        return;
    }
    /* which kvmgr placed these tables: the scheduler drops the step if it is
     * not the one the sessions' KV lives in (a restart it has not seen yet) */
    job->kvmgr_pid = tb->kvmgr_pid;
    if (tb->kvmgr_pid != t->worker_kvmgr_pid) {
        /* a new kvmgr: the worker must map its pools before it runs its
         * tables (until it notices, it still maps the old ones) */
        struct proto_hello h = {PROTO_ROLE_RKVD, (uint32_t)getpid(), t->idx, -1, PROTO_VERSION,
                                "rkvd"};
        struct proto_hello_ack ack;
        rc = proto_call_json(t->wk, PROTO_MSG_HELLO, &h, PROTO_MSG_HELLO_ACK, &ack, 2000, job->err,
                             sizeof job->err);
        if (!rc && (!ack.accepted || ack.kvmgr_pid != tb->kvmgr_pid)) {
            /* as a kvmgr failure: the worker is fine, the step is retried */
            rc = proto_seterr(job->err, sizeof job->err, RKV_ESTATE,
                              "worker %u has not attached to kvmgr %u yet", t->idx, tb->kvmgr_pid);
            job->kvmgr_failed = 1;
        }
        if (rc) {
            proto_kv_tables_destroy(tb);
            job->rc = rc;
            return;
        }
        t->worker_kvmgr_pid = tb->kvmgr_pid;
        /* acks count the new kvmgr's epochs: one of the old one's could free blocks of the new
         * one that a step still reads */
        t->acked_epoch = t->sent_ack = 0;
    }
    uint64_t t2 = rkv_now_ns();
    rc = worker_step(t, job, tb);
    uint64_t t3 = rkv_now_ns();
    t->st.step_ns += t3 - t2;
    t->st.steps++;
    if (rc) {
        job->rc = rc;
    } else {
        t->acked_epoch = tb->epoch;
    }
    proto_kv_tables_destroy(tb);
    job->step_ms = (double)(t3 - t0) / 1e6;
    step_report(t, t3);
}

/* after the last step of a burst, kvmgr still waits for its ack to free
 * blocks that step no longer needs (closed sessions, demoted copies): send
 * it on its own once the worker has been idle a moment */
static void send_idle_ack(struct wthread *t)
{
    struct proto_kv_prep m = {t->idx, t->acked_epoch, 0, NULL, 0, NULL, 0, NULL};
    char err[256];
    proto_wbuf_reset(&t->buf);
    if (proto_kv_prep_encode(&m, &t->buf, err, sizeof err) != 0)
        return;
    struct proto_in reply;
    if (proto_call(t->kv, PROTO_MSG_KV_PREP, t->buf.data, t->buf.len, &reply, 2000, err,
                   sizeof err) == 0) {
        t->sent_ack = m.ack_epoch;
        proto_in_fini(&reply);
    }
}

static void *worker_thread(void *arg)
{
    struct wthread *t = arg;
    struct driver *d = t->d;
    uint64_t last_probe = 0, unanswered_since = 0;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->stop && !t->job) {
            if (t->lost) {
                t->lost = 0;
                t->up = 0;
            }
            if (!t->up)
                break; /* probe readiness below */
            if (t->acked_epoch > t->sent_ack) {
                /* 50 ms after this worker went idle, however often the condition wakes
                 * it (the other workers' steps do, every few ms: a deadline renewed at
                 * each wake-up never came while another worker was busy, and kvmgr kept
                 * blocks waiting for this ack) */
                if (!t->idle_ack_at.tv_sec) {
                    clock_gettime(CLOCK_REALTIME, &t->idle_ack_at);
                    t->idle_ack_at.tv_nsec += 50 * 1000000L;
                    if (t->idle_ack_at.tv_nsec >= 1000000000L) {
                        t->idle_ack_at.tv_sec++;
                        t->idle_ack_at.tv_nsec -= 1000000000L;
                    }
                }
                if (pthread_cond_timedwait(&d->cv, &d->mu, &t->idle_ack_at) == ETIMEDOUT &&
                    !t->job && !d->stop) {
                    t->idle_ack_at = (struct timespec){0, 0};
                    pthread_mutex_unlock(&d->mu);
                    ahead_take(t, NULL, NULL); /* no step came: it is not needed */
                    send_idle_ack(t);
                    pthread_mutex_lock(&d->mu);
                }
                continue;
            }
            pthread_cond_wait(&d->cv, &d->mu);
        }
        struct step_job *job = t->job;
        int stop = d->stop;
        t->idle_ack_at = (struct timespec){0, 0}; /* a step: idle again after it */
        pthread_mutex_unlock(&d->mu);
        if (stop && !job)
            break;
        if (!job) {
            /* not up yet: ask the worker whether it has its model and pools */
            uint64_t now = rkv_now_ms();
            if (now - last_probe < 100) {
                rkv_sleep_ms(20);
                continue;
            }
            last_probe = now;
            struct proto_hello h = {PROTO_ROLE_RKVD, (uint32_t)getpid(), t->idx, -1, PROTO_VERSION,
                                    "rkvd"};
            struct proto_hello_ack ack;
            char err[256];
            int hrc = proto_call_json(t->wk, PROTO_MSG_HELLO, &h, PROTO_MSG_HELLO_ACK, &ack, 500,
                                      err, sizeof err);
            if (hrc == 0) {
                unanswered_since = 0;
            } else if (!unanswered_since) {
                unanswered_since = now;
            } else if (now - unanswered_since >= 10000) {
                /* no answer for 10 s (a model still loading is one reason): the socket is
                 * dialed anew, since nng 1.5 can leave a dialer stuck after its peer restarts
                 * (a .ci/run once saw no hello get through for 60 s after a worker's SIGKILL,
                 * while the new worker ran) */
                log_info("driver: worker %u has not answered hello for 10 s (%s); dialing it "
                         "anew",
                         t->idx, err);
                struct proto_sock *ns = NULL;
                char oerr[256];
                if (proto_sock_open(&ns, PROTO_SOCK_REQ, d->cfg.worker_urls[t->idx], oerr,
                                    sizeof oerr) == 0) {
                    /* swapped under the lock driver_stop shuts the sockets down with; the
                     * one left is closed after it (only this thread still holds it) */
                    struct proto_sock *old = ns;
                    pthread_mutex_lock(&d->mu);
                    if (!d->stop) {
                        old = t->wk;
                        t->wk = ns;
                    }
                    pthread_mutex_unlock(&d->mu);
                    proto_sock_close(old);
                } else {
                    log_warn("driver: worker %u: %s", t->idx, oerr);
                }
                unanswered_since = now;
            }
            if (hrc == 0 && ack.accepted) {
                struct event *e = ev_create(EV_UP, t->idx);
                if (!e)
                    continue; /* out of memory: asked again at the next probe */
                e->max_batch_tokens = ack.max_batch_tokens;
                e->on_gpu = ack.on_gpu;
                t->worker_kvmgr_pid = ack.kvmgr_pid;
                t->block_bytes = ack.block_bytes;
                t->up = 1;
                post(d, e);
            }
            continue;
        }
        run_job(t, job);
        int worker_failed = job->rc < 0 && !job->kvmgr_failed;
        pthread_mutex_lock(&d->mu);
        t->job = NULL;
        pthread_mutex_unlock(&d->mu);
        if (worker_failed) {
            t->up = 0;
            struct event *e = ev_create(EV_DOWN, t->idx);
            if (e) {
                snprintf(e->why, sizeof e->why, "%s", job->err);
                post(d, e);
            }
        }
        struct event *e = ev_create(EV_JOB, t->idx);
        if (!e) {
            log_error("driver: out of memory; a step result is lost");
            continue;
        }
        e->job = job;
        t->st.t_posted = rkv_now_ns();
        post(d, e);
    }
    return NULL;
}

/* --- monitor thread -------------------------------------------------------------- */

static void run_calls(struct driver *d)
{
    pthread_mutex_lock(&d->mu);
    struct call *c = d->calls;
    d->calls = NULL;
    pthread_mutex_unlock(&d->mu);
    while (c) {
        struct call *n = c->next;
        struct event *e = ev_create(EV_CALL, 0);
        if (e) {
            e->cb = c->cb;
            e->cb_ud = c->ud;
            e->rc = proto_call(d->mon_kv, c->type, c->payload, c->len, &e->reply, 5000, e->why,
                               sizeof e->why);
            e->has_reply = e->rc == 0;
            post(d, e);
        }
        free(c->payload);
        free(c);
        c = n;
    }
}

/* which of kvmgr's numbered tactic events reached the loop (monitor thread only) */
struct ev_track {
    uint32_t pid;  /* whose numbering seq is; 0 = none yet */
    uint64_t seq;  /* the last one posted */
    int need_sync; /* pub/sub showed a gap or another kvmgr: poll STATUS now */
};

/* posts ev when it is the next of its kvmgr's events; 0 when it did or it was
 * seen already, 1 when it is out of order (fetch the gap with EVENTS_GET) */
static int tactic_post_next(struct driver *d, struct ev_track *tr,
                            const struct proto_tactic_event *ev)
{
    if (ev->kvmgr_pid != tr->pid || ev->seq > tr->seq + 1)
        return 1;
    if (ev->seq <= tr->seq)
        return 0; /* pub/sub brought what EVENTS already did, or the reverse */
    struct event *e = ev_create(EV_TACTIC, 0);
    if (!e) {
        log_error("driver: out of memory; tactic event %llu of kvmgr %u is lost",
                  (unsigned long long)ev->seq, ev->kvmgr_pid);
    } else {
        e->u.tactic = *ev;
        post(d, e);
    }
    tr->seq = ev->seq;
    return 0;
}

/* fetches and posts kvmgr's tactic events after the last one posted (those
 * pub/sub dropped: published before rkvd subscribed, or while it redialed) */
static void events_sync(struct driver *d, struct ev_track *tr)
{
    struct proto_events *r = malloc(sizeof *r);
    if (!r)
        return;
    /* 64 replies of PROTO_MAX_EVENTS: more than kvmgr's ring holds */
    for (int round = 0; round < 64; round++) {
        struct proto_events_get q = {tr->seq};
        char err[256];
        int rc = proto_call_json(d->mon_kv, PROTO_MSG_EVENTS_GET, &q, PROTO_MSG_EVENTS, r, 2000,
                                 err, sizeof err);
        if (rc) {
            log_ratelimited(RKV_LOG_WARN, 10000, 1, "fetching kvmgr's tactic events: %s", err);
            break;
        }
        if (r->kvmgr_pid != tr->pid || r->last_seq < tr->seq) {
            /* another kvmgr (or its pid again): its numbering starts at 1 */
            int again = tr->seq != 0;
            tr->pid = r->kvmgr_pid;
            tr->seq = 0;
            if (again)
                continue;
        }
        if (r->dropped)
            log_warn("kvmgr %u: %llu tactic event(s) after %llu left its ring before rkvd "
                     "fetched them: they are not in the event log or the metrics",
                     r->kvmgr_pid, (unsigned long long)r->dropped, (unsigned long long)tr->seq);
        if (r->dropped && r->first_seq > tr->seq + 1)
            tr->seq = r->first_seq - 1;
        for (uint32_t i = 0; i < r->n_events; i++) {
            r->events[i].kvmgr_pid = r->kvmgr_pid;
            tactic_post_next(d, tr, &r->events[i]);
        }
        if (!r->n_events || tr->seq >= r->last_seq)
            break;
    }
    free(r);
}

static void *monitor_thread(void *arg)
{
    struct driver *d = arg;
    uint32_t pid = 0;
    int down_reported = 0;
    uint64_t last_status = 0;
    struct ev_track tr = {0};
    while (1) {
        pthread_mutex_lock(&d->mu);
        int stop = d->stop;
        pthread_mutex_unlock(&d->mu);
        if (stop)
            break;
        run_calls(d);
        /* kvmgr's events */
        for (int i = 0; i < 256; i++) {
            struct proto_in in;
            char err[256];
            if (proto_sock_recv(d->mon_sub, &in, PROTO_NONBLOCK, err, sizeof err) != 0)
                break;
            struct event *e = NULL;
            struct proto_tactic_event tev;
            if (in.hdr.type == PROTO_MSG_TACTIC_EVENT) {
                /* at once when it is the next one; after a gap the status poll below
                 * fetches it with what was missed, in order */
                if (proto_json_decode(PROTO_MSG_TACTIC_EVENT, in.payload, in.len, &tev, err,
                                      sizeof err) == 0 &&
                    tactic_post_next(d, &tr, &tev))
                    tr.need_sync = 1;
            } else if (in.hdr.type == PROTO_MSG_HISTOGRAM && (e = ev_create(EV_HIST, 0)) &&
                       proto_json_decode(PROTO_MSG_HISTOGRAM, in.payload, in.len, &e->u.hist, err,
                                         sizeof err) == 0)
                post(d, e);
            else
                free(e);
            proto_in_fini(&in);
        }
        uint64_t now = rkv_now_ms();
        if (now - last_status >= 250 || tr.need_sync) {
            tr.need_sync = 0;
            last_status = now;
            struct proto_empty q = {0};
            struct event *e = ev_create(EV_STATUS, 0);
            char err[256];
            int rc = e ? proto_call_json(d->mon_kv, PROTO_MSG_STATUS_GET, &q, PROTO_MSG_STATUS,
                                         &e->u.status, 1000, err, sizeof err)
                       : RKV_ENOMEM;
            if (rc == 0) {
                uint32_t np = e->u.status.kvmgr_pid;
                down_reported = 0;
                if (np != pid) {
                    struct event *c = ev_create(EV_KV_CHANGED, 0);
                    if (c) {
                        c->old_pid = pid;
                        c->new_pid = np;
                        post(d, c);
                    }
                    pid = np;
                }
                /* after the status (and a kvmgr change) so the loop sees them in that order */
                int behind = np != tr.pid || e->u.status.event_seq != tr.seq;
                post(d, e);
                if (behind)
                    events_sync(d, &tr);
            } else {
                free(e);
                if (!down_reported && pid) {
                    struct event *c = ev_create(EV_KV_DOWN, 0);
                    if (c) {
                        snprintf(c->why, sizeof c->why, "%s", err);
                        post(d, c);
                    }
                    down_reported = 1;
                }
            }
        }
        rkv_sleep_ms(20);
    }
    return NULL;
}

/* --- lifecycle ------------------------------------------------------------------- */

int driver_start(uv_loop_t *loop, const struct driver_config *cfg, const struct driver_cbs *cbs,
                 struct driver **out, char *errbuf, size_t errlen)
{
    struct driver *d = calloc(1, sizeof *d);
    if (!d)
        return RKV_ENOMEM;
    d->loop = loop;
    d->cfg = *cfg;
    if (d->cfg.step_timeout_ms <= 0)
        d->cfg.step_timeout_ms = 120000;
    d->cbs = *cbs;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    uv_async_init(loop, &d->async, on_async);
    d->async.data = d;
    d->w = calloc(cfg->n_workers, sizeof *d->w);
    int rc = d->w ? 0 : RKV_ENOMEM;
    if (!rc)
        rc = proto_sock_open(&d->mon_kv, PROTO_SOCK_REQ, cfg->kvmgr_url, errbuf, errlen);
    if (!rc)
        rc = proto_sock_open(&d->mon_sub, PROTO_SOCK_SUB, cfg->kvmgr_pub_url, errbuf, errlen);
    if (!rc)
        rc = proto_sock_subscribe(d->mon_sub, 0);
    for (uint32_t i = 0; !rc && i < cfg->n_workers; i++) {
        struct wthread *t = &d->w[i];
        t->d = d;
        t->idx = i;
        proto_wbuf_init(&t->buf);
        proto_wbuf_init(&t->ah.buf);
        rkv_vec_init(&t->ah.seqs, sizeof(struct ahead_seq));
        pthread_mutex_init(&t->ah.mu, NULL);
        pthread_cond_init(&t->ah.cv, NULL);
        rc = proto_sock_open(&t->kv, PROTO_SOCK_REQ, cfg->kvmgr_url, errbuf, errlen);
        if (!rc)
            rc = proto_sock_open(&t->wk, PROTO_SOCK_REQ, cfg->worker_urls[i], errbuf, errlen);
    }
    if (rc) {
        driver_stop(d);
        return rc;
    }
    for (uint32_t i = 0; i < cfg->n_workers; i++) {
        struct wthread *t = &d->w[i];
        if (cfg->prep_ahead)
            t->ah.started = pthread_create(&t->ah.th, NULL, ahead_thread, t) == 0;
        pthread_create(&t->th, NULL, worker_thread, t);
    }
    pthread_create(&d->mon, NULL, monitor_thread, d);
    d->started_threads = 1;
    *out = d;
    return 0;
}

int driver_submit(struct driver *d, struct step_job *job)
{
    if (job->worker >= d->cfg.n_workers)
        return RKV_EINVAL;
    struct wthread *t = &d->w[job->worker];
    pthread_mutex_lock(&d->mu);
    /* once stopping no thread takes it: the caller keeps it (a step that finished while the
     * driver stopped kicks the next one from driver_stop itself) */
    int rc = d->stop ? RKV_ECLOSED : t->job ? RKV_EBUSY : 0;
    if (!rc) {
        t->job = job;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int driver_kvmgr_call(struct driver *d, int type, const void *payload, size_t len,
                      driver_call_cb cb, void *ud)
{
    struct call *c = calloc(1, sizeof *c);
    if (!c)
        return RKV_ENOMEM;
    c->payload = malloc(len ? len : 1);
    if (!c->payload) {
        free(c);
        return RKV_ENOMEM;
    }
    memcpy(c->payload, payload, len);
    c->len = len;
    c->type = type;
    c->cb = cb;
    c->ud = ud;
    pthread_mutex_lock(&d->mu);
    struct call **pp = &d->calls;
    while (*pp)
        pp = &(*pp)->next;
    *pp = c;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static void async_closed(uv_handle_t *h)
{
    free(h->data);
}

void driver_stop(struct driver *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    /* the streams are over: a call still waiting ends now. a step sent to a worker that
     * died as rkvd began to stop waited out step_timeout, since no worker comes back to
     * take it, and rkvd did not exit (found by the fault tests, SIGKILL then SIGTERM) */
    for (uint32_t i = 0; d->w && i < d->cfg.n_workers; i++) {
        proto_sock_shutdown(d->w[i].wk);
        proto_sock_shutdown(d->w[i].kv);
    }
    proto_sock_shutdown(d->mon_kv);
    proto_sock_shutdown(d->mon_sub);
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (d->started_threads) {
        for (uint32_t i = 0; i < d->cfg.n_workers; i++)
            pthread_join(d->w[i].th, NULL);
        pthread_join(d->mon, NULL);
    }
    for (uint32_t i = 0; d->w && i < d->cfg.n_workers; i++) {
        struct ahead *a = &d->w[i].ah;
        if (a->started) {
            pthread_mutex_lock(&a->mu);
            while (a->state == AH_QUEUED) /* within its call's timeout */
                pthread_cond_wait(&a->cv, &a->mu);
            a->stop = 1;
            pthread_cond_broadcast(&a->cv);
            pthread_mutex_unlock(&a->mu);
            pthread_join(a->th, NULL);
            if (a->state == AH_DONE && a->rc == 0)
                proto_in_fini(&a->reply);
        }
    }
    for (uint32_t i = 0; d->w && i < d->cfg.n_workers; i++) {
        proto_sock_close(d->w[i].kv);
        proto_sock_close(d->w[i].wk);
        proto_wbuf_fini(&d->w[i].buf);
        proto_wbuf_fini(&d->w[i].ah.buf);
        rkv_vec_fini(&d->w[i].ah.seqs);
        pthread_mutex_destroy(&d->w[i].ah.mu);
        pthread_cond_destroy(&d->w[i].ah.cv);
        /* a job still queued never ran: hand it back as failed */
        if (d->w[i].job) {
            d->w[i].job->rc = RKV_ECLOSED;
            snprintf(d->w[i].job->err, sizeof d->w[i].job->err, "rkvd is stopping");
            d->cbs.job_done(d->cbs.ud, d->w[i].job);
        }
    }
    proto_sock_close(d->mon_kv);
    proto_sock_close(d->mon_sub);
    /* events not yet delivered */
    for (struct event *e = d->ev_head, *n; e; e = n) {
        n = e->next;
        if (e->kind == EV_JOB)
            d->cbs.job_done(d->cbs.ud, e->job);
        if (e->kind == EV_CALL && e->has_reply)
            proto_in_fini(&e->reply);
        free(e);
    }
    for (struct call *c = d->calls, *n; c; c = n) {
        n = c->next;
        free(c->payload);
        free(c);
    }
    free(d->w);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    uv_close((uv_handle_t *)&d->async, async_closed);
}

void driver_worker_lost(struct driver *d, uint32_t worker)
{
    if (!d || worker >= d->cfg.n_workers)
        return;
    pthread_mutex_lock(&d->mu);
    d->w[worker].lost = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}
