/* stage.cu - host kv blocks attended on the gpu: staging copies a layer ahead (batched, or a copy
 * per run of blocks), passes of whole sequences for long tails, the kv write's write-back, and
 * zero-copy reads. */
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_ops.cuh"

/* copy engine or zero-copy for host blocks: whichever moves bytes faster here, unless the
 * host_read knob names one (or cpu: CPU_TAIL forced, which deterministic mode refuses) */
void cuda_host_read_choose(struct cuda_ctx *c)
{
    uint32_t want = c->tune.host_read;
    if (want == CUDA_READ_CPU && c->deterministic) {
        log_warn("%s: host_read=cpu: deterministic mode keeps host blocks on the gpu",
                 CUDA_TUNE_ENV);
        want = CUDA_READ_MEASURE;
    }
    if (want == CUDA_READ_CPU) {
        c->hcpu.host_cpu = 1;
        c->stage.host_read = CUDA_HOST_ZEROCOPY;
        return;
    }
    if (want == CUDA_READ_COPY || want == CUDA_READ_ZEROCOPY) {
        c->stage.host_read = want == CUDA_READ_COPY ? CUDA_HOST_COPY : CUDA_HOST_ZEROCOPY;
        return;
    }
    static double copy_gbps = -1, zc_gbps = -1; /* one measurement per process */
    if (copy_gbps < 0 && cuda_measure_host_paths(&copy_gbps, &zc_gbps) < 0)
        copy_gbps = zc_gbps = 0;
    /* the attention kernel reaches about 0.55 of the stream-read rate over zero-copy, and
     * copies also overlap the layer before: compare what each path delivers */
    c->stage.host_read = copy_gbps > 0.55 * zc_gbps ? CUDA_HOST_COPY : CUDA_HOST_ZEROCOPY;
    if (copy_gbps > 0)
        c->hcpu.link_gbps = copy_gbps;
    log_info("cuda: host kv blocks: copy engine %.1f GB/s, zero-copy reads %.1f GB/s: using %s",
             copy_gbps, zc_gbps, c->stage.host_read == CUDA_HOST_COPY ? "copies" : "zero-copy");
}

/* which slots of a layer stage_issue copies, as a set of their meta stage_w values: all (after
 * the kv write and its copies back); those that may go before this layer's kv write (a layer
 * ahead): the clean ones and the write-back ones with old rows; those the kv write stores in
 * the mapped pool (after it); the write-back ones with old rows alone */
enum stage_which {
    STAGE_ALL = 15,
    STAGE_AHEAD = 5,
    STAGE_WRITTEN = 2,
    STAGE_WB = 4,
};

static int stage_wanted(const struct cuda_meta *m, uint32_t i, int which)
{
    return (which >> m->stage_w[i]) & 1;
}

/* the wanted slots among [first, first + count): piece bytes from src0 + stage_src[i] * pitch
 * into dst0 + (i - first) * piece, by one cudaMemcpyBatchAsync on the copy stream: separate
 * 1 MiB copies move ~47 GB/s on the H200, the same pieces as one batch ~53 (gpu_bench's
 * ceilings), and a layer's spilled blocks are seldom consecutive in the pool. 0: queued; 1: not
 * available (a driver or toolkit before CUDA 12.8; stage_batch is off from now on), the caller
 * copies them itself */
static int stage_batched(struct cuda_ctx *c, char *dst0, const char *src0, uint32_t first,
                         uint32_t count, int which, size_t piece, size_t pitch)
{
    const struct cuda_meta *m = &c->meta;
#if CUDART_VERSION >= 12080
    if (count > c->stage.bat_cap) {
        uint32_t n = count + count / 2;
        void **d = (void **)realloc(c->stage.bat_dst, n * sizeof(void *));
        if (d)
            c->stage.bat_dst = d;
        const void **sr = (const void **)realloc(c->stage.bat_src, n * sizeof(void *));
        if (sr)
            c->stage.bat_src = sr;
        size_t *sz = (size_t *)realloc(c->stage.bat_size, n * sizeof(size_t));
        if (sz)
            c->stage.bat_size = sz;
        if (!d || !sr || !sz)
            return RKV_ENOMEM;
        c->stage.bat_cap = n;
    }
    uint32_t n = 0;
    for (uint32_t i = first; i < first + count; i++) {
        if (!stage_wanted(m, i, which))
            continue;
        c->stage.bat_dst[n] = dst0 + (size_t)(i - first) * piece;
        c->stage.bat_src[n] = src0 + (size_t)m->stage_src[i] * pitch;
        c->stage.bat_size[n++] = piece;
    }
    if (n == 0)
        return 0;
    cudaMemcpyAttributes at = {};
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream; /* after the kv writes queued before */
    size_t at_idx = 0;
    cudaError_t e = cudaMemcpyBatchAsync(c->stage.bat_dst, c->stage.bat_src, c->stage.bat_size, n,
                                         &at, &at_idx, 1, c->stage.copy);
    if (e == cudaSuccess) {
        c->hst.copies++;
        return 0;
    }
    cudaGetLastError();
    log_warn("cuda: batched staging copies failed (%s): staging with one copy per run of blocks "
             "from now on",
             cudaGetErrorString(e));
#else
    (void)m, (void)dst0, (void)src0, (void)first, (void)count, (void)which, (void)piece,
        (void)pitch;
    log_warn("cuda: batched staging copies need CUDA 12.8 (built with %d): staging with one "
             "copy per run of blocks",
             CUDART_VERSION);
#endif
    c->stage.stage_batch = 0;
    return 1;
}

/* the copies of the wanted slots among [first, first + count) of a layer (src0: its k slices in
 * the host pool) into dst0 on the copy stream: one batched call, or runs of consecutive pool
 * indexes as one strided copy each */
static int stage_copies(struct cuda_ctx *c, char *dst0, const char *src0, uint32_t first,
                        uint32_t count, int which)
{
    const struct cuda_meta *m = &c->meta;
    const size_t slice = kv_slice_bytes(&c->layout), bb = kv_block_bytes(&c->layout);
    const uint32_t end = first + count;
    int rc = c->stage.stage_batch && count > 1
                 ? stage_batched(c, dst0, src0, first, count, which, 2 * slice, bb)
                 : 1;
    if (rc < 0)
        return rc;
    for (uint32_t i = rc == 0 ? end : first; i < end;) {
        if (!stage_wanted(m, i, which)) {
            i++;
            continue;
        }
        uint32_t n = 1;
        while (i + n < end && m->stage_src[i + n] == m->stage_src[i] + n &&
               stage_wanted(m, i + n, which))
            n++;
        /* K then V of a block's layer are contiguous: 2*slice bytes per block */
        c->hst.copies++;
        CU_TRY(cudaMemcpy2DAsync(dst0 + (size_t)(i - first) * 2 * slice, 2 * slice,
                                 src0 + (size_t)m->stage_src[i] * bb, bb, 2 * slice, n,
                                 cudaMemcpyHostToDevice, c->stage.copy));
        i += n;
    }
    return 0;
}

/* queues the copies of one layer's host blocks (slots [first, first + count), those which
 * wants) into staging buffer buf on the copy stream, the write-back slots first (ev_wready
 * after them: the kv write waits for no more). after_main: the copies also wait for the
 * stream's work before this layer's device attention (ev_pre_attn, which cu_attn_partial
 * records before every host-block path: the kv writes into host blocks), so they and the host
 * attention after them overlap device attention */
static int stage_issue(struct cuda_ctx *c, uint32_t layer, int buf, int after_main, uint32_t first,
                       uint32_t count, int which)
{
    const struct kv_layout *l = &c->layout;
    const struct cuda_meta *m = &c->meta;
    size_t slice = kv_slice_bytes(l), need = (size_t)count * 2 * slice;
    if (need > c->stage.stage_limit) {
        c->hst.zero_copy++;
        return 1; /* too big to stage: zero-copy */
    }
    for (uint32_t i = first; i < first + count; i++)
        c->hst.slots += stage_wanted(m, i, which);
    if (need > c->stage.stg_cap[buf]) {
        c->hst.grown++;
        /* the buffer may still be read by queued attention, or copied back */
        CU_TRY(cudaStreamSynchronize(c->side));
        CU_TRY(cudaStreamSynchronize(c->stage.wb));
        int rc = cuda_scratch(c, &c->stage.stg[buf], &c->stage.stg_cap[buf], need);
        if (rc < 0)
            return rc;
    }
    CU_TRY(cudaStreamWaitEvent(c->stage.copy, c->stage.ev_stage_free[buf], 0));
    if (c->stage.wb_used[buf]) /* the last copies back out of this buffer */
        CU_TRY(cudaStreamWaitEvent(c->stage.copy, c->stage.ev_wb_done[buf], 0));
    if (after_main) /* the kv write before: ev_pre_attn holds it, and not device attention */
        CU_TRY(cudaStreamWaitEvent(c->stage.copy, c->ev_pre_attn, 0));
    const char *src0 = c->host_base + kv_slice_offset(l, layer, 0);
    char *dst0 = (char *)c->stage.stg[buf];
    c->stage.stg_wready[buf] = 0;
    int rc = 0;
    if (m->n_wb_old && (which & STAGE_WB)) {
        rc = stage_copies(c, dst0, src0, first, count, STAGE_WB);
        if (rc < 0)
            return rc;
        CU_TRY(cudaEventRecord(c->stage.ev_wready[buf], c->stage.copy));
        c->stage.stg_wready[buf] = 1;
        which &= ~STAGE_WB;
    }
    if ((rc = stage_copies(c, dst0, src0, first, count, which)) < 0)
        return rc;
    CU_TRY(cudaEventRecord(c->stage.ev_copy_done[buf], c->stage.copy));
    c->stage.stg_valid[buf] = 1;
    c->stage.stg_layer[buf] = layer;
    c->stage.stg_gen[buf] = m->gen;
    return 0;
}

/* write-back, before layer's kv write: the layer's staging buffer with the write-back slots'
 * old rows, which the stream waits for; *stg gets it (NULL: the batch has no write-back). The
 * slots the write fills from their block's first row get no copy: the stream's order alone
 * keeps the write after the last readers of the buffer (host attention two layers back, which
 * the stream joined, and the copies back, which it joined too) */
int cuda_wb_before(struct cuda_ctx *c, uint32_t layer, char **stg)
{
    *stg = NULL;
    if (!c->meta.n_wb)
        return 0;
    const int b = (int)(layer % 2);
    if (!(c->stage.stg_valid[b] && c->stage.stg_layer[b] == layer &&
          c->stage.stg_gen[b] == c->meta.gen && (c->stage.stg_wready[b] || !c->meta.n_wb_old))) {
        c->stage.stg_valid[b] = 0;
        /* the blocks no token writes in place go now too; those it does, after the write */
        int rc = stage_issue(c, layer, b, 0, 0, c->meta.n_slots, STAGE_AHEAD);
        if (rc != 0)
            return rc < 0 ? rc : RKV_ESTATE; /* cuda_meta_ensure saw the layer fit */
    }
    if (c->meta.n_wb_old)
        CU_TRY(cudaStreamWaitEvent(c->stream, c->stage.ev_wready[b], 0));
    c->hst.wb_layers++;
    *stg = (char *)c->stage.stg[b];
    return 0;
}

/* write-back, after layer's kv write into stg: the rows the batch wrote into the write-back
 * slots copied back to their host blocks on the wb stream (whole blocks in runs, a block's
 * written rows as one strided copy of its k and one of its v: the pool holds what a store in
 * place would leave), which the stream joins at its next op (cuda_op_begin_keep) */
int cuda_wb_after(struct cuda_ctx *c, uint32_t layer, const char *stg)
{
    const struct kv_layout *l = &c->layout;
    const struct cuda_meta *m = &c->meta;
    const size_t slice = kv_slice_bytes(l), bb = kv_block_bytes(l), B = l->block_size;
    const size_t row = slice / ((size_t)l->n_kv_head * B); /* a head's row of one position */
    const int b = (int)(layer % 2);
    char *dst0 = c->host_base + kv_slice_offset(l, layer, 0);
    CU_TRY(cudaEventRecord(c->stage.ev_kvw, c->stream));
    CU_TRY(cudaStreamWaitEvent(c->stage.wb, c->stage.ev_kvw, 0));
    for (uint32_t i = 0; i < m->n_slots;) {
        const uint32_t r0 = m->stage_rows[2 * i], r1 = m->stage_rows[2 * i + 1];
        if (m->stage_w[i] < 2) {
            i++;
            continue;
        }
        if (r0 > 0 || r1 < B) {
            for (int kv = 0; kv < 2; kv++) /* (n_kv_head, B, head_dim): rows [r0, r1) a head */
                CU_TRY(cudaMemcpy2DAsync(
                    dst0 + (size_t)m->stage_src[i] * bb + kv * slice + r0 * row, B * row,
                    stg + ((size_t)i * 2 + kv) * slice + r0 * row, B * row, (r1 - r0) * row,
                    l->n_kv_head, cudaMemcpyDeviceToHost, c->stage.wb));
            c->hst.wb_slots++;
            i++;
            continue;
        }
        uint32_t n = 1;
        while (i + n < m->n_slots && m->stage_src[i + n] == m->stage_src[i] + n &&
               m->stage_w[i + n] >= 2 && m->stage_rows[2 * (i + n)] == 0 &&
               m->stage_rows[2 * (i + n) + 1] == B)
            n++;
        CU_TRY(cudaMemcpy2DAsync(dst0 + (size_t)m->stage_src[i] * bb, bb,
                                 stg + (size_t)i * 2 * slice, 2 * slice, 2 * slice, n,
                                 cudaMemcpyDeviceToHost, c->stage.wb));
        c->hst.wb_slots += n;
        i += n;
    }
    CU_TRY(cudaEventRecord(c->stage.ev_wb_done[b], c->stage.wb));
    c->stage.wb_used[b] = 1;
    c->stage.wb_pending = 1;
    c->stage.wb_last = b;
    return 0;
}

/* the staging buffer holding this layer's host blocks (issuing the copies
 * now unless the last layer prefetched them); *buf = -1 when not staged */
static int stage_layer(struct cuda_ctx *c, uint32_t layer, int *buf)
{
    int b = (int)(layer % 2);
    *buf = -1;
    if (!(c->stage.stg_valid[b] && c->stage.stg_layer[b] == layer &&
          c->stage.stg_gen[b] == c->meta.gen)) {
        c->stage.stg_valid[b] = 0;
        c->hst.inline_++;
        c->hst.host_write += c->meta.host_writes != 0;
        int rc = stage_issue(c, layer, b, 1, 0, c->meta.n_slots, STAGE_ALL);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    } else if (c->meta.host_writes) {
        /* the blocks no token writes came a layer ahead (a long prefill over a host tail
         * copies most of its layer there); those it writes come after this layer's kv write */
        c->hst.prefetched++;
        c->hst.host_write++;
        int rc = stage_issue(c, layer, b, 1, 0, c->meta.n_slots, STAGE_WRITTEN);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    } else {
        c->hst.prefetched++;
    }
    *buf = b;
    return 0;
}

/* host-block attention of one layer in passes of whole sequences (meta n_pass > 1): pass p
 * copies its slots into staging buffer p % 2 while pass p - 1 attends from the other, attends
 * its sequences (the others' staged lists are empty), and merges into the first pass's partial
 * by lse; every sequence's host partial comes from one pass, so the result is the one-pass
 * result. On the side stream, as the one-pass path */
static int attn_host_passes(struct cuda_ctx *c, const struct cuda_attn_args *a, uint32_t layer)
{
    const struct cuda_meta *m = &c->meta;
    const struct be_attn *at = a->at;
    const size_t slice = kv_slice_bytes(&c->layout);
    const size_t n_th = (size_t)m->n_tokens * at->n_head;
    int rc = cuda_scratch(c, &c->pass_part, &c->pass_part_cap,
                          n_th * (at->head_dim + 2) * sizeof(float));
    if (rc < 0)
        return rc;
    float *o_t = (float *)c->pass_part, *m_t = o_t + n_th * at->head_dim, *l_t = m_t + n_th;
    struct cuda_meta pm = *m;
    c->stage.stg_valid[0] = c->stage.stg_valid[1] = 0; /* no layer-ahead copies in this mode */
    c->hst.passes++;
    c->hst.pass_n += m->n_pass;
    for (uint32_t p = 0; p < m->n_pass && rc == 0; p++) {
        const int buf = (int)(p % 2);
        rc = stage_issue(c, layer, buf, p == 0, m->pass_slot0[p], m->pass_nslots[p], STAGE_ALL);
        if (rc != 0)
            return rc < 0 ? rc : RKV_ESTATE; /* a pass always fits: meta_passes sized it */
        pm.d_seqs = m->d_seqs_pass + (size_t)p * m->n_seqs;
        struct cuda_attn_args pa = *a;
        pa.meta = &pm;
        pa.list = CUDA_LIST_STAGED;
        /* the staged list holds slot numbers of the whole layer: this pass's first slot is at
         * the buffer's start */
        pa.pool = (const char *)c->stage.stg[buf] - (ptrdiff_t)m->pass_slot0[p] * 2 * slice;
        pa.block_bytes = 2 * slice;
        pa.k_off = 0;
        pa.v_off = slice;
        pa.s = c->side;
        if (p > 0) {
            pa.o = o_t;
            pa.m = m_t;
            pa.l = l_t;
        }
        CU_TRY(cudaStreamWaitEvent(c->side, c->stage.ev_copy_done[buf], 0));
        rc = cuda_attn(c, &pa);
        CU_TRY(cudaEventRecord(c->stage.ev_stage_free[buf], c->side));
        if (rc == 0 && p > 0)
            rc = cuda_attn_merge(c, a->o, a->m, a->l, o_t, m_t, l_t, m->n_tokens, at->n_head,
                                 at->head_dim, c->side);
    }
    c->stage.stg_valid[0] = c->stage.stg_valid[1] = 0;
    CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
    c->side_pending = 1;
    c->last_was_dev_attn = 0;
    return rc;
}

/* the host blocks the gpu reads, on the side stream (which waits for ev_pre_attn already):
 * staged in passes, staged one layer ahead, or read zero-copy */
int cuda_attn_host_gpu(struct cuda_ctx *c, struct cuda_attn_args *a, uint32_t layer)
{
    const struct kv_layout *l = &c->layout;
    int rc;
    if (c->stage.host_read == CUDA_HOST_COPY && c->meta.n_pass > 1)
        return attn_host_passes(c, a, layer);
    if (c->stage.host_read == CUDA_HOST_COPY && c->meta.n_slots) {
        int buf = -1;
        rc = stage_layer(c, layer, &buf);
        if (rc < 0)
            return rc;
        if (buf >= 0) {
            /* the staged copy: a pool of (K, V) slices, one per slot */
            size_t slice = kv_slice_bytes(l);
            a->list = CUDA_LIST_STAGED;
            a->pool = (const char *)c->stage.stg[buf];
            a->block_bytes = 2 * slice;
            a->k_off = 0;
            a->v_off = slice;
            CU_TRY(cudaStreamWaitEvent(c->side, c->stage.ev_copy_done[buf], 0));
            a->s = c->side;
            rc = cuda_attn(c, a);
            CU_TRY(cudaEventRecord(c->stage.ev_stage_free[buf], c->side));
            c->stage.stg_valid[buf] = 0; /* used once: the next call for this layer copies again */
            CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
            c->side_pending = 1;
            c->last_was_dev_attn = 0;
            if (rc == 0 && layer + 1 < l->n_layer)
                rc = stage_issue(c, layer + 1, (layer + 1) % 2, 0, 0, c->meta.n_slots, STAGE_AHEAD);
            return rc < 0 ? rc : 0;
        }
    }
    a->s = c->side;
    rc = cuda_attn(c, a);
    CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
    c->side_pending = 1;
    c->last_was_dev_attn = 0;
    return rc;
}

int cuda_stage_init(struct cuda_stage *s)
{
    if (cuda_stream_create(&s->copy) < 0 || cuda_stream_create(&s->wb) < 0 ||
        cuda_event_create(&s->ev_kvw) < 0)
        return RKV_ECUDA;
    for (int i = 0; i < 2; i++)
        if (cuda_event_create(&s->ev_copy_done[i]) < 0 ||
            cuda_event_create(&s->ev_stage_free[i]) < 0 ||
            cuda_event_create(&s->ev_wready[i]) < 0 || cuda_event_create(&s->ev_wb_done[i]) < 0)
            return RKV_ECUDA;
    return 0;
}

void cuda_stage_fini(struct cuda_stage *s)
{
    free(s->bat_dst);
    free(s->bat_src);
    free(s->bat_size);
    if (s->copy)
        cudaStreamSynchronize(s->copy);
    if (s->wb)
        cudaStreamSynchronize(s->wb);
    cudaFree(s->stg[0]);
    cudaFree(s->stg[1]);
    for (int i = 0; i < 2; i++) {
        cuda_event_destroy(s->ev_copy_done[i]);
        cuda_event_destroy(s->ev_stage_free[i]);
        cuda_event_destroy(s->ev_wready[i]);
        cuda_event_destroy(s->ev_wb_done[i]);
    }
    cuda_event_destroy(s->ev_kvw);
    cuda_stream_destroy(s->copy);
    cuda_stream_destroy(s->wb);
}
