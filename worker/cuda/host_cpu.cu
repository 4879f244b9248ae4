/* host_cpu.cu - host kv blocks attended by cpu threads: all of them (CPU_TAIL), or the oldest
 * share beside the gpu's read of the rest (the split host read), its partial merged by lse. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_ops.cuh"
extern "C" {
#include "worker/tail_policy.h"
}

/* the split host read is on for this state (tail_split_on) */
int cuda_host_split_on(const struct cuda_ctx *c)
{
    return tail_split_on(c->hcpu.host_split, c->hcpu.attend.attend != NULL, c->hcpu.host_cpu,
                         c->deterministic, c->tune.attn_fixed,
                         c->have_kv ? c->n_blocks[KV_DEVICE] : 0);
}

/* the batch's shares as tail_batch decides them: sc[s] the host blocks of sequence s the gpu
 * stages, m->cpu_k[s] the oldest ones the cpu attends; the staged slots of all in *all */
int cuda_split_shares(struct cuda_ctx *c, const struct be_batch *b, uint32_t *sc, uint64_t *all)
{
    struct cuda_meta *m = &c->meta;
    if (b->n_seqs > m->cpu_k_cap) {
        uint32_t *k = (uint32_t *)realloc(m->cpu_k, sizeof(uint32_t) * b->n_seqs);
        if (!k)
            return RKV_ENOMEM;
        m->cpu_k = k;
        m->cpu_k_cap = b->n_seqs;
    }
    const tail_split_cfg cfg = {cuda_host_split_on(c) ? c->hcpu.host_split : 0,
                                kv_slice_bytes(&c->layout), c->hcpu.link_gbps, c->tune.split_min_us,
                                c->tune.split_async_us};
    tail_batch_out o;
    tail_batch(b, c->have_kv ? c->layout.block_size : 0, &cfg, m->cpu_k, sc, &o);
    if (cfg.pct && o.dec_blocks) {
        c->hst.tail_us += o.tail_us;
        c->hst.tail_n++;
    }
    m->cpu_any = o.cpu_any;
    m->split_async = o.async;
    m->split_gated = o.gated;
    *all = o.staged;
    return 0;
}

/* pinned bytes at *p for at least bytes, after the work that reads the old ones */
static int pinned_ready(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    if (*p) {
        CU_TRY(cudaStreamSynchronize(c->side)); /* its copies read the old buffer */
        CU_TRY(cudaStreamSynchronize(c->hcpu.cpu_s));
        cudaFreeHost(*p);
        *p = NULL;
        *cap = 0;
    }
    CU_TRY(cudaHostAlloc(p, bytes, cudaHostAllocDefault));
    *cap = bytes;
    return 0;
}

/* the router that attends host blocks on cpu threads, or an error saying there is none */
static int attend_ready(const struct cuda_ctx *c)
{
    if (c->hcpu.attend.attend)
        return 0;
    log_error(
        "cuda: host blocks to attend on cpu threads but no host attention was set "
        "(backend_create sets the worker's); reading them on the gpu needs host_read=measure");
    return RKV_EUNSUPPORTED;
}

/* CPU_TAIL: the host blocks' partial from cpu threads over the host pool. q comes down once
 * what the stream held before device attention is done (the kv write put the new keys of host
 * blocks in the mapped pool by then); the device attends its blocks meanwhile; the partial goes up
 * on the side stream, which the merge joins */
int cuda_attn_host_cpu(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                       const struct be_tensor *q, const struct be_attn *at,
                       const struct be_partial *out)
{
    const uint32_t n = b->n_tokens, qd = at->n_head * at->head_dim;
    const size_t n_th = (size_t)n * at->n_head;
    int rc = attend_ready(c);
    if (rc == 0)
        rc = pinned_ready(c, (void **)&c->hcpu.hbuf, &c->hcpu.hbuf_cap,
                          ((size_t)2 * n * qd + 2 * n_th) * sizeof(float));
    if (rc < 0)
        return rc;
    float *hq = c->hcpu.hbuf, *ho = hq + (size_t)n * qd, *hm = ho + (size_t)n * qd, *hl = hm + n_th;
    CU_TRY(cudaStreamWaitEvent(c->side, c->ev_pre_attn, 0));
    CU_TRY(cudaMemcpyAsync(hq, q->data, (size_t)n * qd * sizeof(float), cudaMemcpyDeviceToHost,
                           c->side));
    CU_TRY(cudaStreamSynchronize(c->side));
    if ((rc = c->hcpu.attend.attend(c->hcpu.attend.ctx, b, layer, hq, at, ho, hm, hl)) < 0)
        return rc;
    CU_TRY(cudaMemcpyAsync(out->o->data, ho, (size_t)n * qd * sizeof(float), cudaMemcpyHostToDevice,
                           c->side));
    CU_TRY(
        cudaMemcpyAsync(out->m->data, hm, n_th * sizeof(float), cudaMemcpyHostToDevice, c->side));
    CU_TRY(
        cudaMemcpyAsync(out->l->data, hl, n_th * sizeof(float), cudaMemcpyHostToDevice, c->side));
    CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
    c->side_pending = 1;
    c->last_was_dev_attn = 0;
    c->hst.cpu_layers++;
    return 0;
}

/* the host_attn_cpu switch (deterministic mode keeps host blocks on the device kernels) */
int cu_host_attn_cpu(void *ctx, int on)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (on && (c->deterministic || !c->hcpu.attend.attend))
        return RKV_EUNSUPPORTED;
    c->hcpu.host_cpu = on != 0;
    return 0;
}

/* the split host read, first part: q comes down on the side stream (after what the stream
 * held before device attention) into pinned memory, ahead of the gpu's host part */
int cuda_split_q_down(struct cuda_ctx *c, const struct be_tensor *q, size_t bytes)
{
    int rc = pinned_ready(c, &c->hcpu.qdown, &c->hcpu.qdown_cap, bytes); /* a split job reads it */
    if (rc < 0)
        return rc;
    CU_TRY(cudaMemcpyAsync(c->hcpu.qdown, q->data, bytes, cudaMemcpyDeviceToHost, c->side));
    CU_TRY(cudaEventRecord(c->hcpu.ev_qdown, c->side));
    return 0;
}

/* the cpu's view of the batch (tail_cpu_view of each sequence's table) */
static int split_view(struct cuda_ctx *c, const struct be_batch *b, struct be_batch *v)
{
    size_t n_tab = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++)
        n_tab += b->seqs[s].n_blocks;
    if (b->n_seqs > c->hcpu.split_seqs_cap) {
        struct be_seq *p = (struct be_seq *)realloc(c->hcpu.split_seqs, sizeof(*p) * b->n_seqs);
        if (!p)
            return RKV_ENOMEM;
        c->hcpu.split_seqs = p;
        c->hcpu.split_seqs_cap = b->n_seqs;
    }
    if (n_tab > c->hcpu.split_tab_cap) {
        struct kv_block_ref *p =
            (struct kv_block_ref *)realloc(c->hcpu.split_tab, sizeof(*p) * n_tab);
        if (!p)
            return RKV_ENOMEM;
        c->hcpu.split_tab = p;
        c->hcpu.split_tab_cap = n_tab;
    }
    size_t at = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        struct kv_block_ref *tab = c->hcpu.split_tab + at;
        tail_cpu_view(q->blocks, q->n_blocks, c->meta.cpu_k[s], tab);
        c->hcpu.split_seqs[s] = *q;
        c->hcpu.split_seqs[s].blocks = tab;
        at += q->n_blocks;
    }
    *v = *b;
    v->seqs = c->hcpu.split_seqs;
    return 0;
}

/* the split's last step on the side stream: the cpu's partial (o_t, then its m and l, on the
 * device) merged by lse into the gpu's host partial out */
static int split_merge(struct cuda_ctx *c, const struct be_partial *out, float *o_t, uint32_t n,
                       const struct be_attn *at)
{
    const size_t n_th = (size_t)n * at->n_head;
    float *m_t = o_t + n_th * at->head_dim, *l_t = m_t + n_th;
    int rc = cuda_attn_merge(c, (float *)out->o->data, (float *)out->m->data, (float *)out->l->data,
                             o_t, m_t, l_t, n, at->n_head, at->head_dim, c->side);
    CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
    c->side_pending = 1;
    c->last_was_dev_attn = 0;
    c->fixed[KV_HOST].valid = 0; /* the per-block partials miss the cpu's blocks */
    c->hst.split_layers++;
    return rc;
}

/* the split's cpu part of one layer, run by cuda's host-function thread (no cuda calls in it):
 * q from the pinned copy down, the cpu's partial into split_up, pinned, for its copy up */
struct split_job {
    struct cuda_ctx *c;
    uint32_t layer;
    struct be_attn at;
    size_t n_th; /* rows x heads */
};

static void CUDART_CB split_cpu_job(void *arg)
{
    const struct split_job *j = (const struct split_job *)arg;
    struct cuda_ctx *c = j->c;
    if (__atomic_load_n(&c->hcpu.split_async_rc, __ATOMIC_ACQUIRE) < 0)
        return; /* a layer before failed: the step's result is an error anyway */
    float *o = c->hcpu.split_up, *m = o + j->n_th * j->at.head_dim, *l = m + j->n_th;
    int rc = c->hcpu.attend.attend(c->hcpu.attend.ctx, &c->hcpu.split_v, j->layer,
                                   (const float *)c->hcpu.qdown, &j->at, o, m, l);
    if (rc < 0)
        __atomic_store_n(&c->hcpu.split_async_rc, rc, __ATOMIC_RELEASE);
}

/* an error of a split job since the last call (0: none), cleared */
int cuda_split_async_err(struct cuda_ctx *c)
{
    return __atomic_exchange_n(&c->hcpu.split_async_rc, 0, __ATOMIC_ACQ_REL);
}

/* the split's cpu part queued as a host function on cpu_s behind q's copy down; the side
 * stream's copy up and merge wait for it. The view is the step's (the same at every layer),
 * built when the meta changes, once the jobs of the step before are done */
int cuda_split_host_cpu_async(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                              const struct be_attn *at, const struct be_partial *out)
{
    const uint32_t n = b->n_tokens;
    const size_t n_th = (size_t)n * at->n_head, up = n_th * (at->head_dim + 2) * sizeof(float);
    int rc = cuda_split_async_err(c);
    if (rc < 0)
        return rc;
    if (c->hcpu.split_v_gen != c->meta.gen) { /* 0: none yet (the first upload makes it 1) */
        CU_TRY(cudaStreamSynchronize(c->hcpu.cpu_s)); /* no job reads the view or the buffers now */
        if ((rc = attend_ready(c)) < 0 || (rc = split_view(c, b, &c->hcpu.split_v)) < 0)
            return rc;
        c->hcpu.split_v_gen = c->meta.gen;
    }
    if ((rc = pinned_ready(c, (void **)&c->hcpu.split_up, &c->hcpu.split_up_cap, up)) < 0)
        return rc;
    if (c->layout.n_layer > c->hcpu.split_jobs_n) {
        CU_TRY(cudaStreamSynchronize(c->hcpu.cpu_s));
        struct split_job *j =
            (struct split_job *)realloc(c->hcpu.split_jobs, sizeof(*j) * c->layout.n_layer);
        if (!j)
            return RKV_ENOMEM;
        c->hcpu.split_jobs = j;
        c->hcpu.split_jobs_n = c->layout.n_layer;
    }
    if ((rc = cuda_scratch(c, &c->pass_part, &c->pass_part_cap, up)) < 0)
        return rc;
    /* job layer's slot is free: the step before ended in a sync that came after its jobs */
    struct split_job *j = &c->hcpu.split_jobs[layer];
    *j = (struct split_job){c, layer, *at, n_th};
    CU_TRY(cudaStreamWaitEvent(c->hcpu.cpu_s, c->hcpu.ev_qdown, 0));
    CU_TRY(cudaLaunchHostFunc(c->hcpu.cpu_s, split_cpu_job, j));
    CU_TRY(cudaEventRecord(c->hcpu.ev_cpu_done, c->hcpu.cpu_s));
    CU_TRY(cudaStreamWaitEvent(c->side, c->hcpu.ev_cpu_done, 0));
    float *o_t = (float *)c->pass_part;
    CU_TRY(cudaMemcpyAsync(o_t, c->hcpu.split_up, up, cudaMemcpyHostToDevice, c->side));
    rc = split_merge(c, out, o_t, n, at);
    c->hst.split_async++;
    return rc;
}

/* the split host read, last part (the gpu's host part queued on the side stream): the cpu
 * attends each sequence's share once q is down; its partial goes up and is merged by lse into
 * the gpu's host partial, on the side stream */
int cuda_split_host_cpu(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                        const struct be_attn *at, const struct be_partial *out)
{
    const uint32_t n = b->n_tokens;
    const size_t n_th = (size_t)n * at->n_head, up = n_th * (at->head_dim + 2) * sizeof(float);
    struct be_batch v;
    int rc = attend_ready(c);
    if (rc == 0)
        rc = split_view(c, b, &v);
    c->hcpu.split_v_gen = 0; /* the async path's view shares split_view's buffers */
    if (rc == 0)
        rc = pinned_ready(c, (void **)&c->hcpu.split_up, &c->hcpu.split_up_cap, up);
    if (rc == 0)
        rc = cuda_scratch(c, &c->pass_part, &c->pass_part_cap, up);
    if (rc < 0)
        return rc;
    float *o = c->hcpu.split_up, *m = o + n_th * at->head_dim, *l = m + n_th;
    CU_TRY(cudaEventSynchronize(c->hcpu.ev_qdown));
    if ((rc = c->hcpu.attend.attend(c->hcpu.attend.ctx, &v, layer, (const float *)c->hcpu.qdown, at,
                                    o, m, l)) < 0)
        return rc;
    float *o_t = (float *)c->pass_part;
    CU_TRY(cudaMemcpyAsync(o_t, c->hcpu.split_up, up, cudaMemcpyHostToDevice, c->side));
    return split_merge(c, out, o_t, n, at);
}

/* the split host read's share; the host_split knob, when set, wins */
int cu_host_split(void *ctx, uint32_t pct)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (pct && (c->deterministic || c->tune.attn_fixed))
        return RKV_EUNSUPPORTED; /* cuda_host_split_on keeps it off there */
    if (!c->tune.host_split)
        c->hcpu.host_split = pct;
    return 0;
}

int cu_set_host_attend(void *ctx, const struct be_host_attend *h)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    CU_TRY(cudaStreamSynchronize(c->hcpu.cpu_s)); /* no job calls the old one */
    c->hcpu.attend = h ? *h : be_host_attend{NULL, NULL};
    return 0;
}

int cuda_host_cpu_init(struct cuda_host_cpu *h)
{
    if (cuda_event_create(&h->ev_qdown) < 0 || cuda_stream_create(&h->cpu_s) < 0 ||
        cuda_event_create(&h->ev_cpu_done) < 0)
        return RKV_ECUDA;
    return 0;
}

void cuda_host_cpu_fini(struct cuda_host_cpu *h)
{
    if (h->cpu_s)
        cudaStreamSynchronize(h->cpu_s); /* its jobs read what is freed below */
    cuda_stream_destroy(h->cpu_s);
    cuda_event_destroy(h->ev_cpu_done);
    cuda_event_destroy(h->ev_qdown);
    free(h->split_jobs);
    free(h->split_seqs);
    free(h->split_tab);
    cudaFreeHost(h->split_up);
    cudaFreeHost(h->qdown);
    cudaFreeHost(h->hbuf);
}

void cuda_split_stats(const struct cuda_ctx *c, char *buf, size_t len)
{
    if (!cuda_host_split_on(c))
        snprintf(buf, len, "off");
    else if (c->hst.tail_n)
        snprintf(buf, len,
                 "a fixed share; the decode tails %.0f us of the link a layer on average over "
                 "%llu batches, split from %u us, off the launching thread from %u us",
                 c->hst.tail_us / (double)c->hst.tail_n, (unsigned long long)c->hst.tail_n,
                 c->tune.split_min_us, c->tune.split_async_us);
    else
        snprintf(buf, len, "a fixed share");
}
