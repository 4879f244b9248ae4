/* backend.cu - the cuda backend: the vtable over the kernels, tensors, kv pools and the batch
 * metadata on device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_ops.cuh"
extern "C" {
#include "worker/cpu/cpu_backend.h"
}

int cuda_scratch(struct cuda_ctx *c, void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    if (c->graph.capturing) {
        /* no allocation inside a recording: the step runs again as usual */
        c->graph.cap_failed = 1;
        return RKV_ESTATE;
    }
    c->scratch_gen++;
    /* grow by half again so a slowly rising size does not reallocate every step.
     * cudaFree waits for the device, so queued users of the old buffer finish */
    size_t n = need + need / 2;
    if (*buf)
        CU_TRY(cudaFree(*buf));
    *buf = NULL;
    *cap = 0;
    CU_TRY(cudaMalloc(buf, n));
    *cap = n;
    return 0;
}

/* the stream waits for host-block attention queued on the side stream */
static void join_side(struct cuda_ctx *c)
{
    if (c->side_pending) {
        cudaStreamWaitEvent(c->stream, c->ev_side_done, 0);
        c->side_pending = 0;
    }
}

/* the stream waits for the kv write's copies back to the host pool (wb_after) */
static void join_wb(struct cuda_ctx *c)
{
    if (c->wb_pending) {
        cudaStreamWaitEvent(c->stream, c->ev_wb_done[c->wb_last], 0);
        c->wb_pending = 0;
    }
}

/* every op but device attention starts here */
/* a matmul's start: the activations converted for the last one stay valid */
static void op_begin_keep(struct cuda_ctx *c)
{
    join_side(c);
    join_wb(c);
    c->last_was_dev_attn = 0;
}

/* every other op's: it may write what the last matmul converted */
static void op_begin(struct cuda_ctx *c)
{
    op_begin_keep(c);
    c->act16_ok = 0;
}

/* --- batch metadata ------------------------------------------------------- */

static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* host block j of q is staged: some token of the step reads it (the last position a token
 * attends to is n_past + n_tokens - 1) */
static int staged_block(const struct be_seq *q, uint32_t j, uint32_t B)
{
    uint64_t last = (uint64_t)q->n_past + (q->n_tokens ? q->n_tokens - 1 : 0);
    return q->blocks[j].residency == KV_HOST && !(B && (uint64_t)j * B > last);
}

/* the staging passes of a batch whose sequences stage sc[s] slots each (all_slots in all):
 * none when everything fits one pass, or when passes are off, or when one sequence alone is
 * too big (its layer is then read zero-copy); else whole sequences in order, as many as fit
 * c->pass_limit, per pass (kv_stage_passes); pass_of[s] gets each sequence's pass */
static int meta_passes(struct cuda_ctx *c, const uint32_t *sc, uint32_t n_seqs, uint64_t all_slots,
                       uint32_t *pass_of)
{
    struct cuda_meta *m = &c->meta;
    const size_t per = c->have_kv ? 2 * kv_slice_bytes(&c->layout) : 0;
    m->n_pass = 0;
    if (!per || !c->pass_limit || all_slots * per <= c->pass_limit)
        return 0;
    if (n_seqs > m->pass_cap) { /* a pass holds one sequence at least */
        uint32_t *a = (uint32_t *)realloc(m->pass_slot0, sizeof(uint32_t) * n_seqs);
        if (!a)
            return RKV_ENOMEM;
        m->pass_slot0 = a;
        uint32_t *b = (uint32_t *)realloc(m->pass_nslots, sizeof(uint32_t) * n_seqs);
        if (!b)
            return RKV_ENOMEM;
        m->pass_nslots = b;
        m->pass_cap = n_seqs;
    }
    m->n_pass = kv_stage_passes(sc, n_seqs, c->pass_limit / per, pass_of, m->pass_slot0,
                                m->pass_nslots, n_seqs);
    return 0;
}

/* the split host read is on: a share of the host blocks to the cpu (not with CPU_TAIL, which
 * takes them all, nor in deterministic mode or with one key split per block: the cpu's partial
 * spans many blocks, which the block-order merge cannot take apart; the cpu's view hides the
 * gpu's host blocks behind device block 0, so the device pool must have one) */
static int host_split_on(const struct cuda_ctx *c)
{
    return c->host_split && !c->host_cpu && !c->deterministic && !c->attn_fixed && c->have_kv &&
           c->n_blocks[KV_DEVICE] > 0;
}

/* sc[s]: the host blocks of sequence s the gpu stages (those some token reads, less the oldest
 * m->cpu_k[s] the cpu attends when the host read is split, kv_host_cpu_share); the staged
 * slots of all in *all */
static int meta_host_shares(struct cuda_ctx *c, const struct be_batch *b, uint32_t *sc,
                            uint64_t *all)
{
    struct cuda_meta *m = &c->meta;
    const uint32_t B = c->have_kv ? c->layout.block_size : 0;
    const uint32_t split = host_split_on(c) ? c->host_split : 0;
    if (b->n_seqs > m->cpu_k_cap) {
        uint32_t *k = (uint32_t *)realloc(m->cpu_k, sizeof(uint32_t) * b->n_seqs);
        if (!k)
            return RKV_ENOMEM;
        m->cpu_k = k;
        m->cpu_k_cap = b->n_seqs;
    }
    m->cpu_any = 0;
    m->cpu_blocks = 0;
    m->decode_only = 1;
    *all = 0;
    /* learned: every sequence's read host blocks first (pct 0), the cpu's share after */
    const int learn = split && c->split_learn;
    uint64_t dec_blocks = 0; /* host blocks decode rows read */
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        const uint64_t last = (uint64_t)q->n_past + (q->n_tokens ? q->n_tokens - 1 : 0);
        m->cpu_k[s] = kv_host_cpu_share(q->blocks, q->n_blocks, B, last, q->n_tokens,
                                        learn ? 0 : split, &sc[s]);
        dec_blocks += q->n_tokens <= 1 ? sc[s] : 0;
        m->decode_only &= q->n_tokens <= 1;
    }
    const double h = (double)dec_blocks * 2 * kv_slice_bytes(&c->layout); /* a layer's bytes */
    int gated = 1;
    if (learn) {
        if (!c->split_l_init) {
            /* the cpu's rate from the share of the measured rates: pct = cpu / (cpu + link) */
            const double pct = split >= 100 ? 99 : split;
            kv_split_learn_init(&c->split_l, c->split_fix0_us, c->link_gbps * pct / (100 - pct),
                                c->link_gbps);
            c->split_l_init = 1;
        }
        const double share = kv_split_share(&c->split_l, h, 0.9);
        const uint32_t k = (uint32_t)(share * (double)dec_blocks + 0.5);
        gated = k == 0;
        if (!gated) {
            /* spread over the decode rows (a prefill row's count is left out) */
            for (uint32_t s = 0; s < b->n_seqs; s++)
                m->cpu_k[s] = b->seqs[s].n_tokens <= 1 ? sc[s] : 0;
            kv_split_spread(m->cpu_k, b->n_seqs, k, m->cpu_k);
            c->hst.split_share += (double)k / (double)dec_blocks;
            c->hst.split_steps++;
        }
    }
    /* the link time of the decode rows' host bytes of one layer, in us */
    const double link_us = h / (c->link_gbps * 1e3);
    if (!learn)
        gated = !split || link_us < (double)c->split_min_us;
    /* the learned share's samples are the launching thread's waits */
    if (split && dec_blocks) {
        c->hst.tail_us += link_us;
        c->hst.tail_n++;
    }
    m->split_async =
        !gated && !learn &&
        (c->split_async == 1 || (c->split_async == 2 && link_us >= (double)c->split_async_us));
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        if (gated)
            m->cpu_k[s] = 0;
        m->cpu_any |= m->cpu_k[s] > 0;
        m->cpu_blocks += m->cpu_k[s];
        sc[s] -= m->cpu_k[s];
        *all += sc[s];
    }
    m->split_gated = split && gated && dec_blocks;
    return 0;
}

/* builds the device view of a batch (positions, write slots, per-residency
 * block lists, query tiles) and uploads it when it differs from the last one */
static int meta_ensure(struct cuda_ctx *c, const struct be_batch *b, uint32_t g)
{
    struct cuda_meta *m = &c->meta;
    const uint32_t B = c->have_kv ? c->layout.block_size : 0;
    /* decode batches (one token per sequence) use one-token tiles */
    int decode = 1;
    uint32_t n_blk_total = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        decode &= b->seqs[s].n_tokens <= 1;
        n_blk_total += b->seqs[s].n_blocks;
    }
    if (g == 0)
        g = 1;
    if (g > 64)
        return RKV_EUNSUPPORTED;
    uint32_t qt = decode && g <= 16 ? 1 : 64 / g;
    uint32_t n_qtiles = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++)
        n_qtiles += (b->seqs[s].n_tokens + qt - 1) / qt;

    /* staged slots per sequence (its host blocks some token reads), then the passes */
    /* and per block of each sequence (its first at boff[s]) its staging slot, or ~0u */
    const size_t ns1 = b->n_seqs ? b->n_seqs : 1;
    uint32_t *sc = (uint32_t *)calloc(3 * ns1 + n_blk_total, sizeof(uint32_t));
    if (!sc)
        return RKV_ENOMEM;
    uint32_t *pass_of = sc + ns1, *boff = pass_of + ns1, *jslot = boff + ns1;
    uint64_t all_slots = 0;
    int rc = meta_host_shares(c, b, sc, &all_slots);
    if (rc == 0)
        rc = meta_passes(c, sc, b->n_seqs, all_slots, pass_of);
    if (rc < 0) {
        free(sc);
        return rc;
    }
    const uint32_t n_pass = m->n_pass;
    /* write-back: a staged block a token writes at least wb_min rows of gets them in its
     * staging slot (not with passes, zero-copy, CPU_TAIL or while a graph records) */
    const size_t slot_bytes = c->have_kv ? 2 * kv_slice_bytes(&c->layout) : 0;
    const uint32_t wb_min = B / 8 > 2 ? B / 8 : 2;
    const int wb_on = c->wb_on && B && c->host_read == CUDA_HOST_COPY && !c->host_cpu && !n_pass &&
                      all_slots * slot_bytes <= c->stage_limit && !c->graph.capturing;
    uint32_t n_wb = 0, n_wb_old = 0;

    size_t o_pos = align16(4 * sizeof(uint32_t));
    size_t o_slot = o_pos + align16((size_t)b->n_tokens * 4);
    size_t o_wslot = o_slot + align16((size_t)b->n_tokens * 4);
    size_t o_seqs = o_wslot + align16((size_t)b->n_tokens * 4);
    size_t o_blks = o_seqs + align16((size_t)b->n_seqs * sizeof(struct cuda_seq_meta));
    /* with decode graphs, the block lists' room rounded up, so the arrays after them keep their
     * offsets while rows gain blocks (a recording holds those addresses: cu_graph_begin) */
    const size_t blk_room =
        c->graph_on ? ((size_t)n_blk_total + 255) & ~(size_t)255 : (size_t)n_blk_total;
    size_t o_qt = o_blks + align16((size_t)2 * blk_room * sizeof(struct cuda_blk));
    size_t o_pass = o_qt + align16((size_t)n_qtiles * sizeof(struct cuda_qtile));
    size_t len = o_pass + (size_t)n_pass * b->n_seqs * sizeof(struct cuda_seq_meta);

    /* build into a fresh buffer, then compare with what the device holds */
    char *h = (char *)calloc(1, len);
    if (!h) {
        free(sc);
        return RKV_ENOMEM;
    }
    uint32_t *hdr = (uint32_t *)h;
    hdr[0] = b->n_tokens;
    hdr[1] = b->n_seqs;
    hdr[2] = n_qtiles;
    hdr[3] = qt;
    int32_t *pos = (int32_t *)(h + o_pos);
    uint32_t *slot = (uint32_t *)(h + o_slot);
    uint32_t *wslot = (uint32_t *)(h + o_wslot);
    struct cuda_seq_meta *sm = (struct cuda_seq_meta *)(h + o_seqs);
    struct cuda_blk *bl = (struct cuda_blk *)(h + o_blks);
    struct cuda_qtile *qtl = (struct cuda_qtile *)(h + o_qt);
    uint32_t max_units[CUDA_N_LISTS] = {0, 0, 0};
    uint32_t nb = 0, nq = 0, n_slots = 0;
    /* staging slots: one per staged host block */
    if (all_slots > m->stage_cap) {
        uint32_t *ns = (uint32_t *)realloc(m->stage_src, sizeof(uint32_t) * all_slots);
        if (!ns) {
            free(h);
            free(sc);
            return RKV_ENOMEM;
        }
        m->stage_src = ns;
        uint8_t *nw = (uint8_t *)realloc(m->stage_w, all_slots);
        if (!nw) {
            free(h);
            free(sc);
            return RKV_ENOMEM;
        }
        m->stage_w = nw;
        uint32_t *nr = (uint32_t *)realloc(m->stage_rows, sizeof(uint32_t) * 2 * all_slots);
        if (!nr) {
            free(h);
            free(sc);
            return RKV_ENOMEM;
        }
        m->stage_rows = nr;
        m->stage_cap = (uint32_t)all_slots;
    }
    for (uint32_t s = 0, off = 0; s < b->n_seqs; off += b->seqs[s++].n_blocks)
        boff[s] = off;
    for (uint32_t i = 0; i < n_blk_total; i++)
        jslot[i] = ~0u;
    for (uint32_t s = 0; s < b->n_seqs && rc == 0; s++) {
        const struct be_seq *q = &b->seqs[s];
        sm[s].tok_off = q->tok_off;
        sm[s].n_tokens = q->n_tokens;
        sm[s].n_past = q->n_past;
        for (int r = 0; r < CUDA_N_LISTS && rc == 0; r++) {
            int res = r == CUDA_LIST_STAGED ? KV_HOST : r;
            uint32_t cpu_left = res == KV_HOST ? m->cpu_k[s] : 0; /* the cpu's: not listed */
            sm[s].list_off[r] = nb;
            for (uint32_t j = 0; j < q->n_blocks; j++) {
                struct kv_block_ref ref = q->blocks[j];
                if (ref.residency >= KV_N_POOLS ||
                    (c->have_kv && ref.index >= c->n_blocks[ref.residency])) {
                    rc = RKV_ERANGE;
                    break;
                }
                if (ref.residency != res)
                    continue;
                if (cpu_left) {
                    cpu_left--;
                    continue;
                }
                bl[nb].j = j;
                bl[nb].index = ref.index;
                if (r == CUDA_LIST_STAGED) {
                    if (!staged_block(q, j, B))
                        continue; /* never read: not copied */
                    /* the rows of block j the step writes: [n_past, n_past + n_tokens) in it */
                    const uint64_t lo = (uint64_t)j * B, hi = lo + B,
                                   w0 = q->n_past > lo ? q->n_past : lo,
                                   w1 = q->n_past + q->n_tokens < hi ? q->n_past + q->n_tokens : hi;
                    const uint64_t rows = B && w1 > w0 ? w1 - w0 : 0;
                    m->stage_src[n_slots] = ref.index;
                    m->stage_w[n_slots] = !rows ? 0 : !wb_on || rows < wb_min ? 1 : w0 > lo ? 2 : 3;
                    m->stage_rows[2 * n_slots] = rows ? (uint32_t)(w0 - lo) : 0;
                    m->stage_rows[2 * n_slots + 1] = rows ? (uint32_t)(w1 - lo) : 0;
                    n_wb += m->stage_w[n_slots] >= 2;
                    n_wb_old += m->stage_w[n_slots] == 2;
                    jslot[boff[s] + j] = n_slots;
                    bl[nb].index = n_slots++;
                }
                nb++;
            }
            sm[s].list_len[r] = nb - sm[s].list_off[r];
            if (sm[s].list_len[r] > max_units[r])
                max_units[r] = sm[s].list_len[r];
        }
        for (uint32_t t0 = 0; t0 < q->n_tokens; t0 += qt) {
            qtl[nq].seq = s;
            qtl[nq].t0 = t0;
            qtl[nq].nt = q->n_tokens - t0 < qt ? q->n_tokens - t0 : qt;
            nq++;
        }
    }
    int host_writes = 0;
    for (uint32_t t = 0; t < b->n_tokens && rc == 0; t++) {
        uint32_t s = b->seq_of[t];
        if (s >= b->n_seqs || b->pos[t] < 0 || t < b->seqs[s].tok_off ||
            t >= b->seqs[s].tok_off + b->seqs[s].n_tokens) {
            rc = RKV_EINVAL;
            break;
        }
        pos[t] = b->pos[t];
        if (B) {
            uint32_t j = (uint32_t)b->pos[t] / B;
            if (j >= b->seqs[s].n_blocks) {
                rc = RKV_ERANGE;
                break;
            }
            struct kv_block_ref ref = b->seqs[s].blocks[j];
            slot[t] = ref.index | ((uint32_t)ref.residency << 31);
            const uint32_t w = ref.residency == KV_HOST ? jslot[boff[s] + j] : ~0u;
            wslot[t] = w != ~0u && m->stage_w[w] >= 2 ? w : ~0u;
            host_writes |= ref.residency == KV_HOST && wslot[t] == ~0u;
        } else {
            wslot[t] = ~0u;
        }
    }
    if (rc == 0 && n_pass) {
        /* pass p: the sequences outside it have empty staged lists */
        struct cuda_seq_meta *pv = (struct cuda_seq_meta *)(h + o_pass);
        for (uint32_t p = 0; p < n_pass; p++)
            for (uint32_t s = 0; s < b->n_seqs; s++) {
                pv[(size_t)p * b->n_seqs + s] = sm[s];
                if (pass_of[s] != p)
                    pv[(size_t)p * b->n_seqs + s].list_len[CUDA_LIST_STAGED] = 0;
            }
    }
    free(sc);
    if (rc < 0) {
        free(h);
        return rc;
    }
    if (m->valid && m->host_len == len && !memcmp(m->host, h, len)) {
        free(h);
        return 0;
    }
    /* the side stream may still read the old arrays */
    join_side(c);
    if (len > m->dev_cap) {
        rc = cuda_scratch(c, &m->dev, &m->dev_cap, len);
        if (rc < 0) {
            free(h);
            return rc;
        }
    }
    /* pageable source: staged at once, so h may be reused after the call */
    cudaError_t e = cudaMemcpyAsync(m->dev, h, len, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) {
        log_error("cuda: batch upload failed: %s", cudaGetErrorString(e));
        free(h);
        m->valid = 0;
        return RKV_ECUDA;
    }
    free(m->host);
    m->host = h;
    m->host_len = len;
    char *d = (char *)m->dev;
    m->d_pos = (int32_t *)(d + o_pos);
    m->d_slot = (uint32_t *)(d + o_slot);
    m->d_wslot = (uint32_t *)(d + o_wslot);
    m->d_seqs = (struct cuda_seq_meta *)(d + o_seqs);
    m->d_blks = (struct cuda_blk *)(d + o_blks);
    m->d_qtiles = (struct cuda_qtile *)(d + o_qt);
    m->d_seqs_pass = n_pass ? (struct cuda_seq_meta *)(d + o_pass) : NULL;
    m->n_tokens = b->n_tokens;
    m->n_seqs = b->n_seqs;
    m->n_qtiles = n_qtiles;
    m->qt = qt;
    for (int r = 0; r < CUDA_N_LISTS; r++)
        m->max_units[r] = max_units[r];
    m->n_slots = n_slots;
    m->n_wb = n_wb;
    m->n_wb_old = n_wb_old;
    m->host_writes = host_writes;
    m->gen++;
    m->valid = 1;
    return 0;
}

/* --- tensors -------------------------------------------------------------- */

/* --- decode layers as a cuda graph ----------------------------------------------------- */

/* the recording holds pointers to tensors and pools that may go */
static void graph_drop(struct cuda_ctx *c)
{
    if (c->graph.exec)
        cudaGraphExecDestroy(c->graph.exec);
    c->graph.exec = NULL;
    c->graph.key = c->graph.seen = c->graph.bad = 0;
}

static uint64_t graph_mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        h = (h ^ (v & 0xff)) * 0x100000001b3ULL;
    return h;
}

/* what the layers' launches depend on beyond the device's meta (positions, block lists): the
 * caller, the batch's rows, the longest block list (attention's splits), the meta's layout (its
 * block lists' room grows in steps of 256 blocks) and the scratch buffers */
static uint64_t graph_key(const struct cuda_ctx *c, const struct be_batch *b, const void *owner)
{
    const struct cuda_meta *m = &c->meta;
    uint64_t h = 0xcbf29ce484222325ULL;
    h = graph_mix(h, (uintptr_t)owner);
    h = graph_mix(h, ((uint64_t)b->n_seqs << 32) | b->n_tokens);
    h = graph_mix(h, ((uint64_t)m->n_qtiles << 32) | m->qt);
    h = graph_mix(h, (uintptr_t)m->dev);
    h = graph_mix(h, m->host_len);
    h = graph_mix(h, c->scratch_gen);
    for (int l = 0; l < CUDA_N_LISTS; l++)
        h = graph_mix(h, m->max_units[l]);
    return h ? h : 1;
}

static int cu_graph_begin(void *ctx, const struct be_batch *b, const struct be_attn *at,
                          const void *owner)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->graph_on || c->deterministic || c->attn_fixed || c->host_cpu || !c->have_kv ||
        b->n_tokens != b->n_seqs || at->n_kv_head == 0 ||
        (c->graph_on == 1 && b->n_seqs > CUDA_GRAPH_ROWS))
        return 0;
    op_begin(c); /* joins the side stream */
    /* the meta goes up now, outside the recording; the layers' own calls find it current */
    int rc = meta_ensure(c, b, at->n_head / at->n_kv_head);
    if (rc < 0)
        return rc;
    const struct cuda_meta *m = &c->meta;
    if (m->max_units[KV_HOST] || m->max_units[CUDA_LIST_STAGED] || m->cpu_any || m->n_pass)
        return 0; /* host tails: streams and events the recording does not hold */
    const uint64_t key = graph_key(c, b, owner);
    if (c->graph.exec && key == c->graph.key) {
        CU_TRY(cudaGraphLaunch(c->graph.exec, c->stream));
        c->hst.graph_replay++;
        c->act16_ok = 0;
        return 2;
    }
    if (key == c->graph.bad || key != c->graph.seen) {
        c->graph.seen = key; /* sized its buffers as usual first */
        return 0;
    }
    CU_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->graph.capturing = 1;
    c->graph.cap_failed = 0;
    c->graph.rec = key;
    return 1;
}

static int cu_graph_end(void *ctx, int failed)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->graph.capturing = 0;
    c->act16_ok = 0; /* what the recorded ops left there has not run */
    if (failed || c->graph.cap_failed || e != cudaSuccess || !g) {
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError();
        if (!c->hst.graph_fail)
            log_warn("cuda: a decode step could not be recorded as a graph (%s); its shape "
                     "runs as usual",
                     e != cudaSuccess ? cudaGetErrorString(e) : "an op declined");
        c->hst.graph_fail++;
        c->graph.bad = c->graph.rec;
        return 1;
    }
    if (c->graph.exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(c->graph.exec, g, &info) != cudaSuccess) {
            cudaGetLastError();
            cudaGraphExecDestroy(c->graph.exec);
            c->graph.exec = NULL;
        }
    }
    cudaError_t ie = c->graph.exec ? cudaSuccess : cudaGraphInstantiate(&c->graph.exec, g, 0);
    cudaGraphDestroy(g);
    if (ie != cudaSuccess) {
        cudaGetLastError();
        c->graph.exec = NULL;
        c->graph.bad = c->graph.rec;
        c->hst.graph_fail++;
        return 1;
    }
    c->graph.key = c->graph.rec;
    CU_TRY(cudaGraphLaunch(c->graph.exec, c->stream));
    c->hst.graph_rec++;
    return 0;
}

static int cu_tensor_alloc(void *ctx, enum be_type type, uint32_t rows, uint32_t cols,
                           struct be_tensor **out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    struct be_tensor *t = (struct be_tensor *)calloc(1, sizeof(*t));
    if (!t)
        return RKV_ENOMEM;
    t->type = type;
    t->rows = rows;
    t->cols = cols;
    t->row_bytes = be_type_size(type, cols);
    t->nbytes = t->row_bytes * rows;
    cudaError_t e = cudaMalloc(&t->data, t->nbytes);
    if (e != cudaSuccess) {
        log_error("cuda: cannot allocate %zu bytes on gpu %d for a (%u, %u) %s tensor: %s",
                  t->nbytes, c->dev, rows, cols, be_type_name(type), cudaGetErrorString(e));
        cudaGetLastError();
        free(t);
        return RKV_ENOMEM;
    }
    *out = t;
    return 0;
}

static void cu_tensor_free(void *ctx, struct be_tensor *t)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    c->act16_ok = 0; /* a new tensor may get this address */
    graph_drop(c);
    cudaFree(t->data);
    free(t);
}

static int split_async_err(struct cuda_ctx *c);

static int cu_tensor_set(void *ctx, struct be_tensor *t, const void *src, size_t off, size_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    CU_TRY(cudaMemcpyAsync((char *)t->data + off, src, n, cudaMemcpyHostToDevice, c->stream));
    /* the caller may free src on return */
    CU_TRY(cudaStreamSynchronize(c->stream));
    return 0;
}

static int cu_tensor_get(void *ctx, const struct be_tensor *t, void *dst, size_t off, size_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    CU_TRY(cudaMemcpyAsync(dst, (const char *)t->data + off, n, cudaMemcpyDeviceToHost, c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    return split_async_err(c);
}

/* --- kv pools ------------------------------------------------------------- */

static void unregister_pools(struct cuda_ctx *c)
{
    for (int r = 0; r < KV_N_POOLS; r++) {
        if (c->registered[r])
            cudaHostUnregister(c->registered[r]);
        c->registered[r] = NULL;
        c->pool[r] = NULL;
        c->n_blocks[r] = 0;
    }
}

/* a device-visible address for a pool: device memory as is, host memory
 * registered mapped (zero-copy reads by the attention kernel) */
static int map_pool(struct cuda_ctx *c, int r, void *base, size_t bytes)
{
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, base) != cudaSuccess) {
        cudaGetLastError();
        at.type = cudaMemoryTypeUnregistered;
    }
    if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) {
        c->pool[r] = (char *)base;
        return 0;
    }
    if (at.type == cudaMemoryTypeUnregistered) {
        cudaError_t e =
            cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
        if (e != cudaSuccess) {
            log_error("cuda: cannot register the %s kv pool (%zu bytes at %p) with the gpu: %s; "
                      "check the memlock limit (ulimit -l)",
                      r == KV_HOST ? "host" : "device", bytes, base, cudaGetErrorString(e));
            cudaGetLastError();
            return RKV_ECUDA;
        }
        c->registered[r] = base;
    }
    void *dptr = NULL;
    CU_TRY(cudaHostGetDevicePointer(&dptr, base, 0));
    c->pool[r] = (char *)dptr;
    if (r == KV_DEVICE)
        log_warn("cuda: the device kv pool is host memory; device blocks are read over PCIe");
    return 0;
}

/* copy engine or zero-copy for host blocks: whichever moves bytes faster
 * here (env RKV_CUDA_HOST_READ=copy|zerocopy overrides; cpu: attended on the cpu) */
static void choose_host_read(struct cuda_ctx *c)
{
    const char *e = getenv("RKV_CUDA_HOST_READ");
    if (e && strcmp(e, "cpu") && strcmp(e, "copy") && strcmp(e, "zerocopy")) {
        log_warn("RKV_CUDA_HOST_READ=%.20s is not copy, zerocopy or cpu: measuring", e);
        e = NULL;
    }
    if (e && !strcmp(e, "cpu")) {
        if (c->deterministic) {
            log_warn("RKV_CUDA_HOST_READ=cpu: deterministic mode keeps host blocks on the gpu");
            e = NULL;
        } else {
            c->host_cpu = 1; /* forced CPU_TAIL (tests, a/b runs) */
            c->host_read = CUDA_HOST_ZEROCOPY;
            return;
        }
    }
    if (e && !strcmp(e, "copy")) {
        c->host_read = CUDA_HOST_COPY;
        return;
    }
    if (e && !strcmp(e, "zerocopy")) {
        c->host_read = CUDA_HOST_ZEROCOPY;
        return;
    }
    static double copy_gbps = -1, zc_gbps = -1; /* one measurement per process */
    if (copy_gbps < 0 && cuda_measure_host_paths(&copy_gbps, &zc_gbps) < 0)
        copy_gbps = zc_gbps = 0;
    /* the attention kernel reaches ~0.55 of the stream-read rate over zero-copy
     * (tests/gpu bench, H200 2026-11-29: 28.5 of 51.2 GB/s), and copies also
     * overlap the layer before; compare what each path delivers */
    c->host_read = copy_gbps > 0.55 * zc_gbps ? CUDA_HOST_COPY : CUDA_HOST_ZEROCOPY;
    if (copy_gbps > 0)
        c->link_gbps = copy_gbps;
    log_info("cuda: host kv blocks: copy engine %.1f GB/s, zero-copy reads %.1f GB/s: using %s",
             copy_gbps, zc_gbps, c->host_read == CUDA_HOST_COPY ? "copies" : "zero-copy");
}

/* cuTensorMapEncodeTiled (cuda.h's signature), reached through cudart's driver entry point so
 * the worker links no libcuda */
typedef CUresult (*tmap_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                   const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                   const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* the driver's encoder, looked up once; NULL when the driver has none */
static tmap_encode_fn tmap_encoder(void)
{
    static const tmap_encode_fn fn = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            f = NULL;
        }
        return (tmap_encode_fn)f;
    }();
    return fn;
}

/* the device pool as a tensor map for decode attention (cuda_ctx.kv_tmap): dims (64 columns,
 * head_dim / 64 halves, rows of head_dim f16), boxes of 64 rows of one half. Off (kv_tma 0)
 * when the switch is, the layout is not f16 with head_dim 64 or 128 and blocks of whole 64-key
 * chunks, the pool is not device memory or has too many rows, or the driver refuses */
static void kv_tmap_encode(struct cuda_ctx *c, const struct kv_layout *l)
{
    c->kv_tma = 0;
    const uint32_t D = l->head_dim;
    const size_t row = (size_t)D * 2, bytes = (size_t)c->n_blocks[KV_DEVICE] * kv_block_bytes(l);
    if (!c->dec_tma || !c->pool[KV_DEVICE] || l->dtype != KV_F16 || (D != 64 && D != 128) ||
        l->block_size % 64 || kv_block_bytes(l) % row || bytes / row > INT32_MAX)
        return;
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, c->pool[KV_DEVICE]) != cudaSuccess ||
        pa.type != cudaMemoryTypeDevice) {
        cudaGetLastError();
        return;
    }
    const tmap_encode_fn fn = tmap_encoder();
    if (!fn) {
        log_warn("cuda: the driver has no cuTensorMapEncodeTiled; decode attention loads keys "
                 "with cp.async");
        return;
    }
    alignas(64) CUtensorMap tm;
    const cuuint64_t dim[3] = {64, D / 64, bytes / row}, stride[2] = {128, row};
    const cuuint32_t box[3] = {64, 1, 64}, one[3] = {1, 1, 1};
    CUresult r = fn(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, c->pool[KV_DEVICE], dim, stride, box,
                    one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        log_warn("cuda: cuTensorMapEncodeTiled refused the kv pool (error %d); decode attention "
                 "loads keys with cp.async",
                 (int)r);
        return;
    }
    memcpy(c->kv_tmap, &tm, sizeof(tm));
    c->kv_tma = 1;
}

static int cu_set_kv(void *ctx, const struct kv_layout *l, const struct kv_pools *p)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    CU_TRY(cudaStreamSynchronize(c->stream));
    CU_TRY(cudaStreamSynchronize(c->side));
    graph_drop(c); /* it reads the old pools */
    uint32_t hd = l->head_dim;
    if (hd < 8 || hd > 128 || (hd & (hd - 1))) {
        log_error("cuda: head_dim %u is not supported by the cuda attention (8, 16, 32, 64, 128); "
                  "use --backend cpu",
                  hd);
        return RKV_EUNSUPPORTED;
    }
    unregister_pools(c);
    c->have_kv = 0;
    c->meta.valid = 0;
    c->layout = *l;
    for (int r = 0; r < KV_N_POOLS; r++) {
        if (!p->base[r] || p->n_blocks[r] == 0)
            continue;
        int rc = map_pool(c, r, p->base[r], (size_t)p->n_blocks[r] * kv_block_bytes(l));
        if (rc < 0) {
            unregister_pools(c);
            return rc;
        }
        c->n_blocks[r] = p->n_blocks[r];
    }
    c->host_base = (char *)p->base[KV_HOST];
    c->cpu_kv_set = 0;
    c->stg_valid[0] = c->stg_valid[1] = 0;
    if (c->host_base && c->n_blocks[KV_HOST])
        choose_host_read(c);
    kv_tmap_encode(c, l);
    c->have_kv = 1;
    return 0;
}

/* --- ops ------------------------------------------------------------------ */

/* host array -> the small device scratch */
static int upload_small(struct cuda_ctx *c, const void *src, size_t n)
{
    int rc = cuda_scratch(c, &c->small, &c->small_cap, n ? n : 4);
    if (rc < 0)
        return rc;
    CU_TRY(cudaMemcpyAsync(c->small, src, n, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

static int cu_embed(void *ctx, struct be_tensor *out, const struct be_tensor *w, const int32_t *ids,
                    uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    int rc = upload_small(c, ids, (size_t)n * sizeof(int32_t));
    return rc < 0 ? rc : cuda_embed(c, (float *)out->data, w, (const int32_t *)c->small, n);
}

/* where an op over n rows of cols floats may also write its output rounded to 16 bits for the
 * cublas gemm that reads it next (matmul.cu's act16): the gemm path (more rows than the decode
 * kernels take) after a conversion to 16 bits, whose type it guesses; NULL when not */
static void *act16_twin(struct cuda_ctx *c, uint32_t n, uint32_t cols)
{
    if (n <= c->gemv_max_n || c->deterministic || c->precise ||
        (c->act16_type != BE_F16 && c->act16_type != BE_BF16))
        return NULL;
    if (cuda_scratch(c, &c->act16, &c->act16_cap, (size_t)n * cols * 2) < 0) {
        cudaGetLastError();
        return NULL; /* the gemm converts, and reports the failure if it persists */
    }
    return c->act16;
}

/* the twin was written: a matmul over out reads it instead of converting */
static void act16_have(struct cuda_ctx *c, const float *out, size_t elems)
{
    c->act16_src = out;
    c->act16_elems = elems;
    c->act16_ok = 1;
    c->act16_twin = 1;
}

static int cu_rmsnorm(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                      const struct be_tensor *w, uint32_t n, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    void *twin = act16_twin(c, n, in->cols);
    int rc = cuda_rmsnorm(c, (float *)out->data, (const float *)in->data, (const float *)w->data, n,
                          in->cols, eps, twin, (enum be_type)c->act16_type);
    if (rc == 0 && twin)
        act16_have(c, (const float *)out->data, (size_t)n * in->cols);
    return rc < 0 ? rc : 0;
}

static int cu_matmul2(void *ctx, struct be_tensor *out0, struct be_tensor *out1,
                      const struct be_tensor *in, const struct be_tensor *w0,
                      const struct be_tensor *w1, const struct be_tensor *bias0,
                      const struct be_tensor *bias1, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin_keep(c);
    return cuda_matmul2(c, (float *)out0->data, (float *)out1->data, (const float *)in->data, w0,
                        w1, bias0 ? (const float *)bias0->data : NULL,
                        bias1 ? (const float *)bias1->data : NULL, n);
}

static int cu_matmul(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                     const struct be_tensor *w, const struct be_tensor *bias, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin_keep(c);
    return cuda_matmul(c, (float *)out->data, (const float *)in->data, w,
                       bias ? (const float *)bias->data : NULL, n);
}

/* the group size the last attention used, so rope and kv_write build tiles
 * attention can reuse */
static uint32_t last_g(const struct cuda_ctx *c)
{
    const uint32_t *hdr = (const uint32_t *)c->meta.host;
    if (!c->meta.valid || !hdr || hdr[3] == 0)
        return 1;
    return hdr[3] == 1 ? 1 : 64 / hdr[3];
}

static int cu_rope(void *ctx, struct be_tensor *x, const struct be_batch *b, uint32_t n_heads,
                   uint32_t head_dim, const struct be_rope *r)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    int rc = meta_ensure(c, b, last_g(c));
    if (rc < 0)
        return rc;
    if (x->cols < n_heads * head_dim)
        return RKV_EINVAL;
    return cuda_rope(c, (float *)x->data, c->meta.d_pos, b->n_tokens, n_heads, head_dim, r);
}

static int wb_before(struct cuda_ctx *c, uint32_t layer, char **stg);
static int wb_after(struct cuda_ctx *c, uint32_t layer, const char *stg);

static int cu_kv_write(void *ctx, const struct be_batch *b, uint32_t layer,
                       const struct be_tensor *k, const struct be_tensor *v)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    if (!c->have_kv || layer >= c->layout.n_layer)
        return RKV_ESTATE;
    if (k->cols != c->layout.n_kv_head * c->layout.head_dim)
        return RKV_EINVAL;
    int rc = meta_ensure(c, b, last_g(c));
    char *stg = NULL;
    if (rc == 0)
        rc = wb_before(c, layer, &stg);
    if (rc == 0)
        rc = cuda_kv_write(c, &c->meta, layer, (const float *)k->data, (const float *)v->data, stg);
    if (rc == 0 && stg)
        rc = wb_after(c, layer, stg);
    return rc < 0 ? rc : 0;
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
    if (count > c->bat_cap) {
        uint32_t n = count + count / 2;
        void **d = (void **)realloc(c->bat_dst, n * sizeof(void *));
        if (d)
            c->bat_dst = d;
        const void **sr = (const void **)realloc(c->bat_src, n * sizeof(void *));
        if (sr)
            c->bat_src = sr;
        size_t *sz = (size_t *)realloc(c->bat_size, n * sizeof(size_t));
        if (sz)
            c->bat_size = sz;
        if (!d || !sr || !sz)
            return RKV_ENOMEM;
        c->bat_cap = n;
    }
    uint32_t n = 0;
    for (uint32_t i = first; i < first + count; i++) {
        if (!stage_wanted(m, i, which))
            continue;
        c->bat_dst[n] = dst0 + (size_t)(i - first) * piece;
        c->bat_src[n] = src0 + (size_t)m->stage_src[i] * pitch;
        c->bat_size[n++] = piece;
    }
    if (n == 0)
        return 0;
    cudaMemcpyAttributes at = {};
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream; /* after the kv writes queued before */
    size_t at_idx = 0;
    cudaError_t e =
        cudaMemcpyBatchAsync(c->bat_dst, c->bat_src, c->bat_size, n, &at, &at_idx, 1, c->copy);
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
    c->stage_batch = 0;
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
    int rc = c->stage_batch && count > 1
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
                                 cudaMemcpyHostToDevice, c->copy));
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
    if (need > c->stage_limit) {
        c->hst.zero_copy++;
        return 1; /* too big to stage: zero-copy */
    }
    for (uint32_t i = first; i < first + count; i++)
        c->hst.slots += stage_wanted(m, i, which);
    if (need > c->stg_cap[buf]) {
        c->hst.grown++;
        /* the buffer may still be read by queued attention, or copied back */
        CU_TRY(cudaStreamSynchronize(c->side));
        CU_TRY(cudaStreamSynchronize(c->wb));
        int rc = cuda_scratch(c, &c->stg[buf], &c->stg_cap[buf], need);
        if (rc < 0)
            return rc;
    }
    CU_TRY(cudaStreamWaitEvent(c->copy, c->ev_stage_free[buf], 0));
    if (c->wb_used[buf]) /* the last copies back out of this buffer */
        CU_TRY(cudaStreamWaitEvent(c->copy, c->ev_wb_done[buf], 0));
    if (after_main) /* the kv write before: ev_pre_attn holds it, and not device attention */
        CU_TRY(cudaStreamWaitEvent(c->copy, c->ev_pre_attn, 0));
    const char *src0 = c->host_base + kv_slice_offset(l, layer, 0);
    char *dst0 = (char *)c->stg[buf];
    c->stg_wready[buf] = 0;
    int rc = 0;
    if (m->n_wb_old && (which & STAGE_WB)) {
        rc = stage_copies(c, dst0, src0, first, count, STAGE_WB);
        if (rc < 0)
            return rc;
        CU_TRY(cudaEventRecord(c->ev_wready[buf], c->copy));
        c->stg_wready[buf] = 1;
        which &= ~STAGE_WB;
    }
    if ((rc = stage_copies(c, dst0, src0, first, count, which)) < 0)
        return rc;
    CU_TRY(cudaEventRecord(c->ev_copy_done[buf], c->copy));
    c->stg_valid[buf] = 1;
    c->stg_layer[buf] = layer;
    c->stg_gen[buf] = m->gen;
    return 0;
}

/* write-back, before layer's kv write: the layer's staging buffer with the write-back slots'
 * old rows, which the stream waits for; *stg gets it (NULL: the batch has no write-back). The
 * slots the write fills from their block's first row get no copy: the stream's order alone
 * keeps the write after the last readers of the buffer (host attention two layers back, which
 * the stream joined, and the copies back, which it joined too) */
static int wb_before(struct cuda_ctx *c, uint32_t layer, char **stg)
{
    *stg = NULL;
    if (!c->meta.n_wb)
        return 0;
    const int b = (int)(layer % 2);
    if (!(c->stg_valid[b] && c->stg_layer[b] == layer && c->stg_gen[b] == c->meta.gen &&
          (c->stg_wready[b] || !c->meta.n_wb_old))) {
        c->stg_valid[b] = 0;
        /* the blocks no token writes in place go now too; those it does, after the write */
        int rc = stage_issue(c, layer, b, 0, 0, c->meta.n_slots, STAGE_AHEAD);
        if (rc != 0)
            return rc < 0 ? rc : RKV_ESTATE; /* meta_ensure saw the layer fit */
    }
    if (c->meta.n_wb_old)
        CU_TRY(cudaStreamWaitEvent(c->stream, c->ev_wready[b], 0));
    c->hst.wb_layers++;
    *stg = (char *)c->stg[b];
    return 0;
}

/* write-back, after layer's kv write into stg: the rows the batch wrote into the write-back
 * slots copied back to their host blocks on the wb stream (whole blocks in runs, a block's
 * written rows as one strided copy of its k and one of its v: the pool holds what a store in
 * place would leave), which the stream joins at its next op (op_begin_keep) */
static int wb_after(struct cuda_ctx *c, uint32_t layer, const char *stg)
{
    const struct kv_layout *l = &c->layout;
    const struct cuda_meta *m = &c->meta;
    const size_t slice = kv_slice_bytes(l), bb = kv_block_bytes(l), B = l->block_size;
    const size_t row = slice / ((size_t)l->n_kv_head * B); /* a head's row of one position */
    const int b = (int)(layer % 2);
    char *dst0 = c->host_base + kv_slice_offset(l, layer, 0);
    CU_TRY(cudaEventRecord(c->ev_kvw, c->stream));
    CU_TRY(cudaStreamWaitEvent(c->wb, c->ev_kvw, 0));
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
                    l->n_kv_head, cudaMemcpyDeviceToHost, c->wb));
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
                                 cudaMemcpyDeviceToHost, c->wb));
        c->hst.wb_slots += n;
        i += n;
    }
    CU_TRY(cudaEventRecord(c->ev_wb_done[b], c->wb));
    c->wb_used[b] = 1;
    c->wb_pending = 1;
    c->wb_last = b;
    return 0;
}

/* the staging buffer holding this layer's host blocks (issuing the copies
 * now unless the last layer prefetched them); *buf = -1 when not staged */
static int stage_layer(struct cuda_ctx *c, uint32_t layer, int *buf)
{
    int b = (int)(layer % 2);
    *buf = -1;
    if (!(c->stg_valid[b] && c->stg_layer[b] == layer && c->stg_gen[b] == c->meta.gen)) {
        c->stg_valid[b] = 0;
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
    c->stg_valid[0] = c->stg_valid[1] = 0; /* no layer-ahead copies in this mode */
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
        pa.pool = (const char *)c->stg[buf] - (ptrdiff_t)m->pass_slot0[p] * 2 * slice;
        pa.block_bytes = 2 * slice;
        pa.k_off = 0;
        pa.v_off = slice;
        pa.s = c->side;
        if (p > 0) {
            pa.o = o_t;
            pa.m = m_t;
            pa.l = l_t;
        }
        CU_TRY(cudaStreamWaitEvent(c->side, c->ev_copy_done[buf], 0));
        rc = cuda_attn(c, &pa);
        CU_TRY(cudaEventRecord(c->ev_stage_free[buf], c->side));
        if (rc == 0 && p > 0)
            rc = cuda_attn_merge(c, a->o, a->m, a->l, o_t, m_t, l_t, m->n_tokens, at->n_head,
                                 at->head_dim, c->side);
    }
    c->stg_valid[0] = c->stg_valid[1] = 0;
    CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
    c->side_pending = 1;
    c->last_was_dev_attn = 0;
    return rc;
}

/* the cpu backend over the host pool, and its q, o, m, l tensors for n tokens of at's shape */
static int cpu_attn_ready(struct cuda_ctx *c, uint32_t n, const struct be_attn *at)
{
    int rc = 0;
    if (!c->cpu_be && (rc = cpu_backend_init(c->cpu_threads, &c->cpu_be)) < 0)
        return rc;
    if (!c->cpu_kv_set) {
        /* the device pool's address only bounds its block indices: the cpu reads host blocks */
        struct kv_pools p = {{c->pool[KV_DEVICE], c->host_base},
                             {c->n_blocks[KV_DEVICE], c->n_blocks[KV_HOST]}};
        if ((rc = backend_set_kv(c->cpu_be, &c->layout, &p)) < 0)
            return rc;
        c->cpu_kv_set = 1;
    }
    const uint32_t qd = at->n_head * at->head_dim;
    struct be_tensor **t = c->cpu_t;
    if (!t[3] || t[0]->rows < n || t[0]->cols != qd || t[2]->cols != at->n_head) {
        for (int i = 0; i < 4; i++) {
            backend_tensor_free(c->cpu_be, t[i]);
            t[i] = NULL;
        }
        for (int i = 0; i < 4 && rc == 0; i++)
            rc = backend_tensor_alloc(c->cpu_be, BE_F32, n, i < 2 ? qd : at->n_head, &t[i]);
    }
    return rc < 0 ? rc : 0;
}

/* CPU_TAIL: the host blocks' partial from cpu threads over the host pool. q comes down once
 * what the stream held before device attention is done (the kv write put the new keys of host
 * blocks in the mapped pool by then); the device attends its blocks meanwhile; the partial goes up
 * on the side stream, which the merge joins */
static int attn_host_cpu(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                         const struct be_tensor *q, const struct be_attn *at,
                         const struct be_partial *out)
{
    int rc = cpu_attn_ready(c, b->n_tokens, at);
    if (rc < 0)
        return rc;
    const uint32_t n = b->n_tokens, qd = at->n_head * at->head_dim;
    struct be_tensor **t = c->cpu_t;
    CU_TRY(cudaStreamWaitEvent(c->side, c->ev_pre_attn, 0));
    CU_TRY(cudaMemcpyAsync(t[0]->data, q->data, (size_t)n * qd * sizeof(float),
                           cudaMemcpyDeviceToHost, c->side));
    CU_TRY(cudaStreamSynchronize(c->side));
    const struct be_partial part = {t[1], t[2], t[3]};
    if ((rc = attn_partial_forward(c->cpu_be, b, layer, KV_HOST, t[0], at, &part)) < 0)
        return rc;
    CU_TRY(cudaMemcpyAsync(out->o->data, t[1]->data, (size_t)n * qd * sizeof(float),
                           cudaMemcpyHostToDevice, c->side));
    CU_TRY(cudaMemcpyAsync(out->m->data, t[2]->data, (size_t)n * at->n_head * sizeof(float),
                           cudaMemcpyHostToDevice, c->side));
    CU_TRY(cudaMemcpyAsync(out->l->data, t[3]->data, (size_t)n * at->n_head * sizeof(float),
                           cudaMemcpyHostToDevice, c->side));
    CU_TRY(cudaEventRecord(c->ev_side_done, c->side));
    c->side_pending = 1;
    c->last_was_dev_attn = 0;
    c->hst.cpu_layers++;
    return 0;
}

/* the host_attn_cpu switch (deterministic mode keeps host blocks on the device kernels) */
static int cu_host_attn_cpu(void *ctx, int on)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (on && c->deterministic)
        return RKV_EUNSUPPORTED;
    c->host_cpu = on != 0;
    return 0;
}

/* the host blocks the gpu reads, on the side stream (which waits for ev_pre_attn already):
 * staged in passes, staged one layer ahead, or read zero-copy */
static int attn_host_gpu(struct cuda_ctx *c, struct cuda_attn_args *a, uint32_t layer)
{
    const struct kv_layout *l = &c->layout;
    int rc;
    if (c->host_read == CUDA_HOST_COPY && c->meta.n_pass > 1)
        return attn_host_passes(c, a, layer);
    if (c->host_read == CUDA_HOST_COPY && c->meta.n_slots) {
        int buf = -1;
        rc = stage_layer(c, layer, &buf);
        if (rc < 0)
            return rc;
        if (buf >= 0) {
            /* the staged copy: a pool of (K, V) slices, one per slot */
            size_t slice = kv_slice_bytes(l);
            a->list = CUDA_LIST_STAGED;
            a->pool = (const char *)c->stg[buf];
            a->block_bytes = 2 * slice;
            a->k_off = 0;
            a->v_off = slice;
            CU_TRY(cudaStreamWaitEvent(c->side, c->ev_copy_done[buf], 0));
            a->s = c->side;
            rc = cuda_attn(c, a);
            CU_TRY(cudaEventRecord(c->ev_stage_free[buf], c->side));
            c->stg_valid[buf] = 0; /* used once: the next call for this layer copies again */
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

/* the split host read, first part: q comes down on the side stream (after what the stream
 * held before device attention) into pinned memory, ahead of the gpu's host part */
static int split_q_down(struct cuda_ctx *c, const struct be_tensor *q, size_t bytes)
{
    if (bytes > c->qdown_cap) {
        if (c->qdown) {
            CU_TRY(cudaStreamSynchronize(c->side));
            CU_TRY(cudaStreamSynchronize(c->cpu_s)); /* a split job reads it */
            cudaFreeHost(c->qdown);
            c->qdown = NULL;
            c->qdown_cap = 0;
        }
        CU_TRY(cudaHostAlloc(&c->qdown, bytes, cudaHostAllocDefault));
        c->qdown_cap = bytes;
    }
    CU_TRY(cudaMemcpyAsync(c->qdown, q->data, bytes, cudaMemcpyDeviceToHost, c->side));
    CU_TRY(cudaEventRecord(c->ev_qdown, c->side));
    return 0;
}

/* the cpu's view of the batch (kv_host_cpu_view of each sequence's table) */
static int split_view(struct cuda_ctx *c, const struct be_batch *b, struct be_batch *v)
{
    size_t n_tab = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++)
        n_tab += b->seqs[s].n_blocks;
    if (b->n_seqs > c->split_seqs_cap) {
        struct be_seq *p = (struct be_seq *)realloc(c->split_seqs, sizeof(*p) * b->n_seqs);
        if (!p)
            return RKV_ENOMEM;
        c->split_seqs = p;
        c->split_seqs_cap = b->n_seqs;
    }
    if (n_tab > c->split_tab_cap) {
        struct kv_block_ref *p = (struct kv_block_ref *)realloc(c->split_tab, sizeof(*p) * n_tab);
        if (!p)
            return RKV_ENOMEM;
        c->split_tab = p;
        c->split_tab_cap = n_tab;
    }
    size_t at = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        struct kv_block_ref *tab = c->split_tab + at;
        kv_host_cpu_view(q->blocks, q->n_blocks, c->meta.cpu_k[s], tab);
        c->split_seqs[s] = *q;
        c->split_seqs[s].blocks = tab;
        at += q->n_blocks;
    }
    *v = *b;
    v->seqs = c->split_seqs;
    return 0;
}

/* the learned share's sample of the split layer before this one (its period closes at this
 * layer's q on the host, q_ns): the step's bytes are the same at every layer */
static void split_learn_layer(struct cuda_ctx *c, uint32_t layer, uint64_t q_ns)
{
    if (c->split_prev.valid && c->split_prev.layer + 1 == layer && c->meta.decode_only) {
        const double slice2 = 2.0 * (double)kv_slice_bytes(&c->layout);
        kv_split_observe(&c->split_l, (double)(q_ns - c->split_prev.q_ns) / 1e3,
                         c->split_prev.cpu_us, (double)c->meta.cpu_blocks * slice2,
                         (double)c->meta.n_slots * slice2, c->split_prev.gpu_first);
    }
    c->split_prev.valid = 0;
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
    if (__atomic_load_n(&c->split_async_rc, __ATOMIC_ACQUIRE) < 0)
        return; /* a layer before failed: the step's result is an error anyway */
    struct be_tensor **t = c->cpu_t;
    const size_t hd = j->at.head_dim;
    memcpy(t[0]->data, c->qdown, j->n_th * hd * sizeof(float));
    const struct be_partial part = {t[1], t[2], t[3]};
    int rc = attn_partial_forward(c->cpu_be, &c->split_v, j->layer, KV_HOST, t[0], &j->at, &part);
    if (rc < 0) {
        __atomic_store_n(&c->split_async_rc, rc, __ATOMIC_RELEASE);
        return;
    }
    memcpy(c->split_up, t[1]->data, j->n_th * hd * sizeof(float));
    memcpy(c->split_up + j->n_th * hd, t[2]->data, j->n_th * sizeof(float));
    memcpy(c->split_up + j->n_th * (hd + 1), t[3]->data, j->n_th * sizeof(float));
}

/* an error of a split job since the last call (0: none), cleared */
static int split_async_err(struct cuda_ctx *c)
{
    return __atomic_exchange_n(&c->split_async_rc, 0, __ATOMIC_ACQ_REL);
}

/* the split's cpu part queued as a host function on cpu_s behind q's copy down; the side
 * stream's copy up and merge wait for it. The view is the step's (the same at every layer),
 * built when the meta changes, once the jobs of the step before are done */
static int split_host_cpu_async(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                                const struct be_attn *at, const struct be_partial *out)
{
    const uint32_t n = b->n_tokens;
    const size_t n_th = (size_t)n * at->n_head, up = n_th * (at->head_dim + 2) * sizeof(float);
    int rc = split_async_err(c);
    if (rc < 0)
        return rc;
    if (c->split_v_gen != c->meta.gen) {         /* 0: none yet (the first upload makes it 1) */
        CU_TRY(cudaStreamSynchronize(c->cpu_s)); /* no job reads the view or the buffers now */
        if ((rc = cpu_attn_ready(c, n, at)) < 0 || (rc = split_view(c, b, &c->split_v)) < 0)
            return rc;
        c->split_v_gen = c->meta.gen;
    }
    if (up > c->split_up_cap) {
        CU_TRY(cudaStreamSynchronize(c->side)); /* its copies up read the old buffer */
        CU_TRY(cudaStreamSynchronize(c->cpu_s));
        cudaFreeHost(c->split_up);
        c->split_up = NULL;
        c->split_up_cap = 0;
        CU_TRY(cudaHostAlloc((void **)&c->split_up, up, cudaHostAllocDefault));
        c->split_up_cap = up;
    }
    if (c->layout.n_layer > c->split_jobs_n) {
        CU_TRY(cudaStreamSynchronize(c->cpu_s));
        struct split_job *j =
            (struct split_job *)realloc(c->split_jobs, sizeof(*j) * c->layout.n_layer);
        if (!j)
            return RKV_ENOMEM;
        c->split_jobs = j;
        c->split_jobs_n = c->layout.n_layer;
    }
    if ((rc = cuda_scratch(c, &c->pass_part, &c->pass_part_cap, up)) < 0)
        return rc;
    /* job layer's slot is free: the step before ended in a sync that came after its jobs */
    struct split_job *j = &c->split_jobs[layer];
    *j = (struct split_job){c, layer, *at, n_th};
    CU_TRY(cudaStreamWaitEvent(c->cpu_s, c->ev_qdown, 0));
    CU_TRY(cudaLaunchHostFunc(c->cpu_s, split_cpu_job, j));
    CU_TRY(cudaEventRecord(c->ev_cpu_done, c->cpu_s));
    CU_TRY(cudaStreamWaitEvent(c->side, c->ev_cpu_done, 0));
    float *o_t = (float *)c->pass_part;
    CU_TRY(cudaMemcpyAsync(o_t, c->split_up, up, cudaMemcpyHostToDevice, c->side));
    rc = split_merge(c, out, o_t, n, at);
    c->hst.split_async++;
    return rc;
}

/* the split host read, last part (the gpu's host part queued on the side stream): the cpu
 * attends each sequence's share once q is down; its partial goes up and is merged by lse into
 * the gpu's host partial, on the side stream */
static int split_host_cpu(struct cuda_ctx *c, const struct be_batch *b, uint32_t layer,
                          const struct be_attn *at, const struct be_partial *out)
{
    const uint32_t n = b->n_tokens;
    const size_t n_th = (size_t)n * at->n_head;
    struct be_batch v;
    int rc = cpu_attn_ready(c, n, at);
    if (rc == 0)
        rc = split_view(c, b, &v);
    c->split_v_gen = 0; /* the async path's view shares split_view's buffers */
    if (rc == 0)
        rc = cuda_scratch(c, &c->pass_part, &c->pass_part_cap,
                          n_th * (at->head_dim + 2) * sizeof(float));
    if (rc < 0)
        return rc;
    struct be_tensor **t = c->cpu_t;
    CU_TRY(cudaEventSynchronize(c->ev_qdown));
    const uint64_t q_ns = c->split_learn ? rkv_now_ns() : 0;
    if (c->split_learn)
        split_learn_layer(c, layer, q_ns);
    memcpy(t[0]->data, c->qdown, n_th * at->head_dim * sizeof(float));
    const struct be_partial part = {t[1], t[2], t[3]};
    if ((rc = attn_partial_forward(c->cpu_be, &v, layer, KV_HOST, t[0], at, &part)) < 0)
        return rc;
    if (c->split_learn) {
        /* the gpu's host part (queued on the side stream before the cpu began) is done: the
         * cpu's part was the slower */
        const cudaError_t first = cudaEventQuery(c->ev_side_done);
        if (first != cudaSuccess && first != cudaErrorNotReady)
            CU_TRY(first);
        c->split_prev.valid = 1;
        c->split_prev.layer = layer;
        c->split_prev.q_ns = q_ns;
        c->split_prev.cpu_us = (double)(rkv_now_ns() - q_ns) / 1e3;
        c->split_prev.gpu_first = first == cudaSuccess;
    }
    float *o_t = (float *)c->pass_part, *m_t = o_t + n_th * at->head_dim, *l_t = m_t + n_th;
    CU_TRY(cudaMemcpyAsync(o_t, t[1]->data, n_th * at->head_dim * sizeof(float),
                           cudaMemcpyHostToDevice, c->side));
    CU_TRY(cudaMemcpyAsync(m_t, t[2]->data, n_th * sizeof(float), cudaMemcpyHostToDevice, c->side));
    CU_TRY(cudaMemcpyAsync(l_t, t[3]->data, n_th * sizeof(float), cudaMemcpyHostToDevice, c->side));
    rc = split_merge(c, out, o_t, n, at);
    return rc;
}

/* the split host read's share, fixed or where the learned one starts; the environment's
 * (RKV_CUDA_HOST_SPLIT, for a/b runs and tests) wins, fixed */
static int cu_host_split(void *ctx, uint32_t pct, int learn)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (pct && (c->deterministic || c->attn_fixed))
        return RKV_EUNSUPPORTED; /* host_split_on keeps it off there */
    if (!getenv("RKV_CUDA_HOST_SPLIT")) {
        c->host_split = pct;
        /* learned only when asked: on the H200 neither form beat the fixed share yet
         * (tests/gpu/NOTES.md, thirty-first session) */
        c->split_learn = learn && pct && c->split_learn_env && c->split_async != 1;
        c->split_l_init = 0;
        if (c->split_learn)
            log_info("cuda: the split host read's share is learned from the layers it splits "
                     "(RKV_CUDA_HOST_SPLIT_LEARN=1), up to %u %% for a long tail",
                     pct);
    }
    return 0;
}

static int cu_attn_partial(void *ctx, const struct be_batch *b, uint32_t layer,
                           enum kv_residency residency, const struct be_tensor *q,
                           const struct be_attn *at, const struct be_partial *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    c->act16_ok = 0; /* it writes out without op_begin */
    if (!c->have_kv || layer >= c->layout.n_layer || (unsigned)residency >= KV_N_POOLS)
        return RKV_ESTATE;
    if (at->n_kv_head != c->layout.n_kv_head || at->head_dim != c->layout.head_dim)
        return RKV_EINVAL;
    int rc = meta_ensure(c, b, at->n_head / at->n_kv_head);
    if (rc < 0)
        return rc;
    const struct kv_layout *l = &c->layout;
    struct cuda_attn_args a = {&c->meta,
                               layer,
                               (int)residency,
                               (int)residency,
                               c->pool[residency],
                               kv_block_bytes(l),
                               kv_slice_offset(l, layer, 0),
                               kv_slice_offset(l, layer, 1),
                               (const float *)q->data,
                               at,
                               (float *)out->o->data,
                               (float *)out->m->data,
                               (float *)out->l->data,
                               c->stream};
    if (residency == KV_DEVICE) {
        c->fixed[KV_HOST].valid = 0; /* a new layer's pair of partials begins */
        /* host-block attention of the same layer may run beside this one: it waits for what
         * the stream held just before. Without host blocks no event comes between the kv write
         * and attention (so attention's prologue overlaps it); a host call after all records it
         * itself */
        c->last_was_dev_attn = c->meta.max_units[KV_HOST] > 0 || c->meta.cpu_any;
        if (c->last_was_dev_attn)
            CU_TRY(cudaEventRecord(c->ev_pre_attn, c->stream));
        return cuda_attn(c, &a);
    }
    /* host blocks on the side stream, overlapping device attention; the
     * stream joins at its next op */
    if (!c->last_was_dev_attn) {
        join_side(c);
        CU_TRY(cudaEventRecord(c->ev_pre_attn, c->stream));
    }
    if (c->host_cpu)
        return attn_host_cpu(c, b, layer, q, at, out);
    CU_TRY(cudaStreamWaitEvent(c->side, c->ev_pre_attn, 0));
    /* split: q goes down first, the gpu's part is queued, then the cpu attends its part */
    const int split = c->meta.cpu_any;
    c->hst.split_gated += c->meta.split_gated;
    if (split && (rc = split_q_down(
                      c, q, (size_t)b->n_tokens * at->n_head * at->head_dim * sizeof(float))) < 0)
        return rc;
    rc = attn_host_gpu(c, &a, layer);
    if (rc == 0 && split)
        rc = c->meta.split_async ? split_host_cpu_async(c, b, layer, at, out)
                                 : split_host_cpu(c, b, layer, at, out);
    return rc;
}

static int cu_attn_merge(void *ctx, const struct be_partial *a, const struct be_partial *b,
                         uint32_t n, const struct be_attn *at)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    const struct cuda_meta *m = &c->meta;
    if (c->fixed[KV_DEVICE].valid && c->fixed[KV_HOST].valid && n == m->n_tokens &&
        c->fixed[KV_DEVICE].gen == m->gen && c->fixed[KV_HOST].gen == m->gen &&
        c->fixed[KV_DEVICE].layer == c->fixed[KV_HOST].layer) {
        /* both partials left one split per block: merged again block by block over both,
         * the numbers an all-device placement of the same blocks gives */
        c->fixed[KV_DEVICE].valid = c->fixed[KV_HOST].valid = 0;
        return cuda_attn_merge_blocks(c, m, c->fixed[KV_DEVICE].list,
                                      (const float *)c->part[KV_DEVICE], c->fixed[KV_HOST].list,
                                      (const float *)c->part[KV_HOST], at->n_head, at->head_dim,
                                      (float *)a->o->data, (float *)a->m->data,
                                      (float *)a->l->data, c->stream);
    }
    return cuda_attn_merge(c, (float *)a->o->data, (float *)a->m->data, (float *)a->l->data,
                           (const float *)b->o->data, (const float *)b->m->data,
                           (const float *)b->l->data, n, at->n_head, at->head_dim, c->stream);
}

static int cu_silu_mul(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                       const struct be_tensor *up, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    void *twin = act16_twin(c, n, gate->cols);
    int rc =
        cuda_silu_mul(c, (float *)out->data, (const float *)gate->data, (const float *)up->data,
                      (size_t)n * gate->cols, twin, (enum be_type)c->act16_type);
    if (rc == 0 && twin)
        act16_have(c, (const float *)out->data, (size_t)n * gate->cols);
    return rc;
}

static int cu_add(void *ctx, struct be_tensor *out, const struct be_tensor *a,
                  const struct be_tensor *b, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    return cuda_add(c, (float *)out->data, (const float *)a->data, (const float *)b->data,
                    (size_t)n * a->cols);
}

static int cu_get_rows(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                       const uint32_t *rows, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    int rc = upload_small(c, rows, (size_t)n * sizeof(uint32_t));
    return rc < 0 ? rc
                  : cuda_get_rows(c, (float *)out->data, (const float *)in->data,
                                  (const uint32_t *)c->small, n, in->cols);
}

static int cu_linear(void *ctx, const struct be_linear *l, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->fuse)
        return 1;
    op_begin_keep(c); /* a gemm over a twin written just before (cuda_linear drops it else) */
    return cuda_linear(c, l, n);
}

static int cu_rope_kv_write(void *ctx, const struct be_batch *b, uint32_t layer,
                            struct be_tensor *q, struct be_tensor *k, const struct be_tensor *v,
                            const struct be_attn *at, const struct be_rope *r)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->fuse)
        return 1;
    op_begin(c);
    if (!c->have_kv || layer >= c->layout.n_layer)
        return RKV_ESTATE;
    if (at->n_kv_head != c->layout.n_kv_head || at->head_dim != c->layout.head_dim)
        return RKV_EINVAL;
    int rc = meta_ensure(c, b, at->n_head / at->n_kv_head);
    char *stg = NULL;
    if (rc == 0)
        rc = wb_before(c, layer, &stg);
    if (rc == 0)
        rc = cuda_rope_kv_write(c, &c->meta, layer, (float *)q->data, (float *)k->data,
                                (const float *)v->data, at->n_head, r, stg);
    if (rc == 0 && stg)
        rc = wb_after(c, layer, stg);
    return rc < 0 ? rc : 0;
}

static size_t cu_scratch_reserve(void *ctx)
{
    /* the two layer staging buffers of the copy path, at their cap */
    return 2 * ((struct cuda_ctx *)ctx)->stage_limit;
}

static void *cu_host_alloc(void *ctx, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    void *p = NULL;
    cudaSetDevice(c->dev);
    /* pinned: a device-to-host copy of 64 rows of logits runs at the link's
     * speed, not through the driver's pageable bounce buffers */
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(void *ctx, void *p)
{
    (void)ctx;
    cudaFreeHost(p);
}

static int cu_greedy(void *ctx, const struct be_tensor *logits, uint32_t n, int32_t *ids,
                     float *logprobs)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->dev_greedy)
        return 1;
    op_begin(c);
    /* the parts first (16-byte aligned), then the ids and logprobs */
    const size_t parts = (cuda_greedy_scratch(n, logits->cols) + 15) & ~(size_t)15;
    int rc =
        cuda_scratch(c, &c->greedy_buf, &c->greedy_cap, parts + (size_t)n * 2 * sizeof(int32_t));
    if (rc < 0)
        return rc;
    int32_t *d_ids = (int32_t *)((char *)c->greedy_buf + parts);
    float *d_lps = (float *)(d_ids + n);
    rc = cuda_greedy(c, (const float *)logits->data, n, logits->cols, d_ids, d_lps, c->greedy_buf);
    if (rc < 0)
        return rc;
    CU_TRY(cudaMemcpyAsync(ids, d_ids, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                           c->stream));
    CU_TRY(cudaMemcpyAsync(logprobs, d_lps, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost,
                           c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    return 0;
}

/* pinned host scratch that grows (cu_sample's rows up, picks down) */
static int cu_host_scratch(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    cudaFreeHost(*buf);
    *buf = NULL;
    *cap = 0;
    size_t n = need + need / 2;
    if (cudaHostAlloc(buf, n, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        *buf = NULL;
        return RKV_ENOMEM;
    }
    *cap = n;
    return 0;
}

#define CU_SAMPLE_ROWS 64 /* rows a launch: its scratch is 8 bytes a logit of each, and 32 KB */

static int cu_sample(void *ctx, const struct be_tensor *logits, uint32_t n,
                     const struct sample_dev_row *const *rows, struct sample_dev_out *outs)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->dev_sample || !sample_dev_supported())
        return 1;
    /* steps of fewer than RKV_CUDA_DEV_SAMPLE_MIN (default 1) sampled rows stay on the host's
     * threads: the kernel takes ~0.29 ms a 128k-vocab row (one block each, rows in parallel),
     * the host ~0.4 ms for one row and ~4 ms for 64 (H200, 16 threads) */
    uint32_t n_rows = 0;
    for (uint32_t i = 0; i < n; i++)
        n_rows += rows[i] != NULL;
    if (n_rows < c->smp_min)
        return 1;
    op_begin(c);
    const uint32_t n_vocab = logits->cols;
    const size_t rb = (cuda_sample_row_bytes() + 15) & ~(size_t)15;
    for (uint32_t i0 = 0; i0 < n;) {
        /* the next CU_SAMPLE_ROWS rows that sample here */
        uint32_t which[CU_SAMPLE_ROWS], m = 0, pens = 0, i = i0;
        for (; i < n && m < CU_SAMPLE_ROWS; i++)
            if (rows[i]) {
                which[m++] = i;
                pens += rows[i]->n_pen;
            }
        i0 = i;
        if (m == 0)
            break;
        /* host: rows, penalty ids and counts, then the picks; device: the same, the saved
         * logits and the scratch, each part 16-byte aligned */
        const size_t up = m * rb + (((size_t)pens * 8 + 15) & ~(size_t)15);
        const size_t ob = ((size_t)m * sizeof(struct sample_dev_out) + 15) & ~(size_t)15;
        const size_t sv = (((size_t)pens * 4) + 15) & ~(size_t)15;
        int rc = cu_host_scratch(&c->smp_host, &c->smp_host_cap, up + ob);
        if (rc < 0)
            return rc;
        /* RKV_CUDA_SAMPLE_STAMPS=1: each row's phase times to stderr (a measurement) */
        const size_t ns = c->smp_stamps ? (size_t)m * cuda_sample_stamps() : 0;
        const size_t sc = cuda_sample_scratch(m, n_vocab);
        rc = cuda_scratch(c, &c->smp_dev, &c->smp_dev_cap, up + ob + sv + sc + ns * 8);
        if (rc < 0)
            return rc;
        char *h = (char *)c->smp_host, *d = (char *)c->smp_dev;
        int32_t *hp = (int32_t *)(h + m * rb);
        uint32_t pen0 = 0;
        for (uint32_t j = 0; j < m; j++) {
            const struct sample_dev_row *r = rows[which[j]];
            cuda_sample_row(h + j * rb, r, which[j], pen0);
            if (r->n_pen) {
                memcpy(hp + 2 * (size_t)pen0, r->pen_id, r->n_pen * sizeof(int32_t));
                memcpy(hp + 2 * (size_t)pen0 + r->n_pen, r->pen_count, r->n_pen * sizeof(int32_t));
            }
            pen0 += r->n_pen;
        }
        CU_TRY(cudaMemcpyAsync(d, h, up, cudaMemcpyHostToDevice, c->stream));
        struct sample_dev_out *d_out = (struct sample_dev_out *)(d + up);
        unsigned long long *d_st = ns ? (unsigned long long *)(d + up + ob + sv + sc) : NULL;
        if (d_st)
            CU_TRY(cudaMemsetAsync(d_st, 0, ns * 8, c->stream));
        rc = cuda_sample(c, (float *)logits->data, n_vocab, m, d, (const int32_t *)(d + m * rb),
                         (float *)(d + up + ob), d + up + ob + sv, d_out, d_st);
        if (rc < 0)
            return rc;
        if (d_st) {
            unsigned long long st[64 * 16];
            const size_t k = cuda_sample_stamps();
            CU_TRY(cudaMemcpyAsync(st, d_st, (ns < 64 * 16 ? ns : 64 * 16) * 8,
                                   cudaMemcpyDeviceToHost, c->stream));
            CU_TRY(cudaStreamSynchronize(c->stream));
            for (uint32_t j = 0; j < m && (j + 1) * k <= 64 * 16; j++) {
                char line[256];
                int len = snprintf(line, sizeof line, "sample stamps row %u (us):", which[j]);
                for (size_t q = 1; q < k && len < (int)sizeof line - 12; q++)
                    if (st[j * k + q])
                        len += snprintf(line + len, sizeof line - (size_t)len, " %zu:%.1f", q,
                                        (double)(st[j * k + q] - st[j * k]) / 1e3);
                fprintf(stderr, "%s\n", line);
            }
        }
        struct sample_dev_out *h_out = (struct sample_dev_out *)(h + up);
        CU_TRY(cudaMemcpyAsync(h_out, d_out, (size_t)m * sizeof(*h_out), cudaMemcpyDeviceToHost,
                               c->stream));
        CU_TRY(cudaStreamSynchronize(c->stream));
        if ((rc = split_async_err(c)) < 0)
            return rc;
        for (uint32_t j = 0; j < m; j++) {
            outs[which[j]] = h_out[j];
            c->hst.smp_rows++;
            c->hst.smp_back += h_out[j].status != 0;
        }
    }
    return 0;
}

static int cu_stats(void *ctx, char *buf, size_t len)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    char learned[256] = "a fixed share";
    if (c->split_learn && c->split_l_init)
        snprintf(learned, sizeof learned,
                 "learned share %.1f %% of the host blocks a split step; a layer's chain %.0f us, "
                 "the cpu %.1f GB/s, the link beside it %.1f GB/s, the cpu the slower in %llu "
                 "layers, the gpu in %llu",
                 c->hst.split_steps ? 100 * c->hst.split_share / (double)c->hst.split_steps : 0,
                 c->split_l.fix_us, c->split_l.cpu_gbps, c->split_l.link_gbps,
                 (unsigned long long)c->split_l.n_cpu, (unsigned long long)c->split_l.n_link);
    else if (!host_split_on(c))
        snprintf(learned, sizeof learned, "off");
    else if (c->hst.tail_n) {
        char as[48] = "never";
        if (c->split_async)
            snprintf(as, sizeof as, "from %u us", c->split_async == 1 ? 0 : c->split_async_us);
        snprintf(learned, sizeof learned,
                 "a fixed share; the decode tails %.0f us of the link a layer on average over "
                 "%llu batches, split from %u us, off the launching thread %s",
                 c->hst.tail_us / (double)c->hst.tail_n, (unsigned long long)c->hst.tail_n,
                 c->split_min_us, as);
    }
    int n = snprintf(
        buf, len,
        "host kv layers: %llu prefetched, %llu copied in line, %llu with a host "
        "write, %llu zero-copy, %llu in %llu passes; %llu block slices staged in %llu "
        "copies, %llu staging growths, %llu with the kv write into staging (%llu "
        "block slices copied back), %llu attended on the cpu, %llu split with it (%llu "
        "off the launching thread), "
        "%llu tails too short to split (%s); gemm inputs: %llu converted, %llu from the "
        "op's 16-bit copy; decode layers as graphs: %llu recorded, %llu replayed, "
        "%llu failed; decode linears on tensor cores: %llu; decode attention by "
        "tensor copies: %llu; gemms on tuned cuBLASLt algorithms: %llu (%llu shapes "
        "tuned, %llu faster than the heuristic's first); gemm pairs as one batch: "
        "%llu; rows sampled on the device: %llu (%llu "
        "given back to the host)",
        (unsigned long long)c->hst.prefetched, (unsigned long long)c->hst.inline_,
        (unsigned long long)c->hst.host_write, (unsigned long long)c->hst.zero_copy,
        (unsigned long long)c->hst.passes, (unsigned long long)c->hst.pass_n,
        (unsigned long long)c->hst.slots, (unsigned long long)c->hst.copies,
        (unsigned long long)c->hst.grown, (unsigned long long)c->hst.wb_layers,
        (unsigned long long)c->hst.wb_slots, (unsigned long long)c->hst.cpu_layers,
        (unsigned long long)c->hst.split_layers, (unsigned long long)c->hst.split_async,
        (unsigned long long)c->hst.split_gated, learned, (unsigned long long)c->hst.act16_conv,
        (unsigned long long)c->hst.act16_twin, (unsigned long long)c->hst.graph_rec,
        (unsigned long long)c->hst.graph_replay, (unsigned long long)c->hst.graph_fail,
        (unsigned long long)c->hst.lin_mma, (unsigned long long)c->hst.dec_tma,
        (unsigned long long)c->hst.lt_gemm, (unsigned long long)c->hst.lt_tuned,
        (unsigned long long)c->hst.lt_faster, (unsigned long long)c->hst.mm_pair,
        (unsigned long long)c->hst.smp_rows, (unsigned long long)c->hst.smp_back);
    memset(&c->hst, 0, sizeof c->hst);
    return n;
}

static int cu_sync(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    op_begin(c);
    CU_TRY(cudaStreamSynchronize(c->stream));
    return split_async_err(c);
}

static void cu_free(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c)
        return;
    cudaSetDevice(c->dev);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->side)
        cudaStreamSynchronize(c->side);
    graph_drop(c);
    unregister_pools(c);
    if (c->cpu_be) {
        for (int i = 0; i < 4; i++)
            backend_tensor_free(c->cpu_be, c->cpu_t[i]);
        backend_free(c->cpu_be);
    }
    cudaFree(c->meta.dev);
    free(c->meta.host);
    cudaFree(c->act16);
    cudaFree(c->wdeq);
    cudaFree(c->part[0]);
    cudaFree(c->part[1]);
    cudaFree(c->cnt[0]);
    cudaFree(c->cnt[1]);
    cudaFree(c->small);
    cudaFree(c->lin_h);
    cudaFree(c->pass_part);
    cudaFree(c->greedy_buf);
    cudaFree(c->smp_dev);
    cudaFreeHost(c->smp_host);
    cudaFree(c->ls_ctr);
    free(c->bat_dst);
    free(c->bat_src);
    free(c->bat_size);
    if (c->copy)
        cudaStreamSynchronize(c->copy);
    if (c->wb)
        cudaStreamSynchronize(c->wb);
    cudaFree(c->stg[0]);
    cudaFree(c->stg[1]);
    for (int i = 0; i < 2; i++) {
        if (c->ev_copy_done[i])
            cudaEventDestroy(c->ev_copy_done[i]);
        if (c->ev_stage_free[i])
            cudaEventDestroy(c->ev_stage_free[i]);
        if (c->ev_wready[i])
            cudaEventDestroy(c->ev_wready[i]);
        if (c->ev_wb_done[i])
            cudaEventDestroy(c->ev_wb_done[i]);
    }
    if (c->ev_kvw)
        cudaEventDestroy(c->ev_kvw);
    if (c->copy)
        cudaStreamDestroy(c->copy);
    if (c->wb)
        cudaStreamDestroy(c->wb);
    free(c->meta.stage_src);
    free(c->meta.stage_w);
    free(c->meta.stage_rows);
    free(c->meta.pass_slot0);
    free(c->meta.pass_nslots);
    free(c->meta.cpu_k);
    if (c->cpu_s) {
        cudaStreamSynchronize(c->cpu_s); /* its jobs read what is freed below */
        cudaStreamDestroy(c->cpu_s);
    }
    if (c->ev_cpu_done)
        cudaEventDestroy(c->ev_cpu_done);
    free(c->split_jobs);
    if (c->split_up)
        cudaFreeHost(c->split_up);
    free(c->split_seqs);
    free(c->split_tab);
    if (c->qdown)
        cudaFreeHost(c->qdown);
    if (c->ev_qdown)
        cudaEventDestroy(c->ev_qdown);
    cuda_lt_free(c);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->blas_ws)
        cudaFree(c->blas_ws);
    if (c->ev_pre_attn)
        cudaEventDestroy(c->ev_pre_attn);
    if (c->ev_side_done)
        cudaEventDestroy(c->ev_side_done);
    if (c->side)
        cudaStreamDestroy(c->side);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

static const struct backend_i cuda_iface = {
    cu_free,       cu_tensor_alloc, cu_tensor_free, cu_tensor_set,    cu_tensor_get,
    cu_set_kv,     cu_embed,        cu_rmsnorm,     cu_matmul,        cu_rope,
    cu_kv_write,   cu_attn_partial, cu_attn_merge,  cu_silu_mul,      cu_add,
    cu_get_rows,   cu_sync,         cu_linear,      cu_rope_kv_write, cu_scratch_reserve,
    cu_host_alloc, cu_host_free,    cu_stats,       cu_greedy,        cu_host_attn_cpu,
    cu_host_split, cu_graph_begin,  cu_graph_end,   cu_matmul2,       cu_sample,
};

/* a size in KiB, and a 0/1 switch, from the environment (common/util's reading: def when
 * unset, a warning naming the variable and def when not a number in range) */
static uint32_t cu_env_kb(const char *name, uint32_t def, uint32_t lo, uint32_t hi)
{
    return (uint32_t)rkv_env_u64(name, def, lo, hi);
}
static int cu_env_flag(const char *name, int def)
{
    return (int)rkv_env_u64(name, (uint64_t)def, 0, 1);
}

extern "C" int rkv_cuda_backend_init(const struct backend_opts *o, struct backend **out)
{
    int gpu = o ? o->gpu : 0;
    int n = rkv_cuda_backend_probe();
    if (n < 0)
        return n;
    if (gpu < 0 || gpu >= n)
        return RKV_ENODEV;
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof(*c));
    if (!c)
        return RKV_ENOMEM;
    c->dev = gpu;
    int rc = RKV_ECUDA;
    cudaDeviceProp p;
    if (cudaSetDevice(gpu) != cudaSuccess || cudaGetDeviceProperties(&p, gpu) != cudaSuccess)
        goto fail;
    c->n_sm = p.multiProcessorCount;
    c->cc_major = p.major;
    c->smem_sm = p.sharedMemPerMultiprocessor;
    c->smem_rsv = p.reservedSharedMemPerBlock;
    if (p.major < 8) {
        log_error("cuda: gpu %d (%s) is compute capability %d.%d; rkv needs 8.0 or newer", gpu,
                  p.name, p.major, p.minor);
        rc = RKV_EUNSUPPORTED;
        goto fail;
    }
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_pre_attn, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_side_done, cudaEventDisableTiming) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->wb, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_kvw, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_qdown, cudaEventDisableTiming) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->cpu_s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_cpu_done, cudaEventDisableTiming) != cudaSuccess)
        goto fail;
    for (int i = 0; i < 2; i++)
        if (cudaEventCreateWithFlags(&c->ev_copy_done[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&c->ev_stage_free[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&c->ev_wready[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&c->ev_wb_done[i], cudaEventDisableTiming) != cudaSuccess)
            goto fail;
    {
        /* staging per buffer: env RKV_CUDA_STAGE_MB, default 512 MiB (a 128k host tail of
         * llama3-8b's f16 kv per layer); both buffers count in the compute reserve the worker
         * reports, larger tails are read zero-copy */
        c->stage_limit = (size_t)rkv_env_u64("RKV_CUDA_STAGE_MB", 512, 0, 1u << 20) << 20;
        /* a prefill chunk's rows of a staged host block (an eighth of the block or more) go
         * into its staging slot and are copied back, not stored over pcie by the kv write (a
         * 512-token chunk of llama3-8b: 282 us a layer into the mapped pool, 19 into device
         * memory); env RKV_CUDA_HOST_WB=0: the kv write stores them in the mapped pool */
        c->wb_on = cu_env_flag("RKV_CUDA_HOST_WB", 1);
        /* greedy rows picked on the device (env RKV_CUDA_DEV_GREEDY=0: on the host) */
        c->dev_greedy = cu_env_flag("RKV_CUDA_DEV_GREEDY", 1);
        /* sampled rows picked on the device (env RKV_CUDA_DEV_SAMPLE=0: on the host) */
        c->dev_sample = cu_env_flag("RKV_CUDA_DEV_SAMPLE", 1);
        c->smp_stamps = cu_env_flag("RKV_CUDA_SAMPLE_STAMPS", 0);
        c->smp_min = (uint32_t)rkv_env_u64("RKV_CUDA_DEV_SAMPLE_MIN", 1, 1, 1u << 20);
        /* a step of up to 8 sampled rows: a cluster of 8 blocks (8 SMs) a row, since one
         * block streams a 128k vocab at ~30 GB/s; a power of two to 8 (1: a block a row) */
        c->smp_cl = (uint32_t)rkv_env_u64("RKV_CUDA_SAMPLE_CL", 8, 1, 8);
        if (c->smp_cl & (c->smp_cl - 1)) {
            rkv_log(RKV_LOG_WARN, "RKV_CUDA_SAMPLE_CL=%u is not 1, 2, 4 or 8; using 8", c->smp_cl);
            c->smp_cl = 8;
        }
        c->smp_cl_rows = (uint32_t)rkv_env_u64("RKV_CUDA_SAMPLE_CL_ROWS", 8, 0, 1u << 20);
        /* a layer's host blocks staged by one batched copy call (H200: 40 window sessions at
         * 53 GB/s, 0.97 of the pcie bound, against 47 GB/s in a copy per run of blocks; env
         * RKV_CUDA_STAGE_BATCH=0: the copies per run) */
        c->stage_batch = cu_env_flag("RKV_CUDA_STAGE_BATCH", 1);
        /* staging passes: a layer's host tails past RKV_CUDA_STAGE_PASS_KB (default: the
         * staging limit) go in passes of whole sequences instead of zero-copy reads (H200, 40
         * window sessions of ~32k: 0.85 of the pcie bound, against 0.2-0.4 read zero-copy) */
        if (cu_env_flag("RKV_CUDA_STAGE_PASSES", 1)) {
            uint32_t kb = cu_env_kb("RKV_CUDA_STAGE_PASS_KB", 0, 0, 1u << 30);
            c->pass_limit = kb ? (size_t)kb << 10 : c->stage_limit;
            if (c->pass_limit > c->stage_limit)
                c->pass_limit = c->stage_limit;
        }
    }
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        goto fail;
    }
    if (cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    {
        /* a workspace of our own (after SetStream, which resets it): under stream capture
         * cublas does not use its default pool and may take other algorithms (the split-k
         * ones of a 64-row gemm); 32 MiB is cublas's advice for Hopper. RKV_CUDA_BLAS_WS_MB=0:
         * cublas's own pool (a/b) */
        size_t ws = (size_t)rkv_env_u64("RKV_CUDA_BLAS_WS_MB", 32, 0, 1024) << 20;
        if (ws && cudaMalloc(&c->blas_ws, ws) != cudaSuccess) {
            log_warn("cuda: no %zu MiB for cuBLAS's workspace (%s): cuBLAS keeps its own pool, "
                     "which it does not use in a captured decode step (other algorithms "
                     "there); free device memory or lower RKV_CUDA_BLAS_WS_MB",
                     ws >> 20, cudaGetErrorString(cudaGetLastError()));
            c->blas_ws = NULL;
        }
        if (c->blas_ws && cublasSetWorkspace(c->blas, c->blas_ws, ws) != CUBLAS_STATUS_SUCCESS)
            goto fail;
        c->blas_ws_bytes = c->blas_ws ? ws : 0;
        /* gemms of 9..N tokens (batched decode) on the cuBLASLt algorithm timed fastest at
         * the shape's first eager call (gemm_lt.cu); 0: cublasGemmEx's heuristic choice */
        c->lt_tune_n = (uint32_t)rkv_env_u64("RKV_CUDA_LT_TUNE_N", 256, 0, 1u << 16);
    }
    if (cudaMalloc(&c->ls_ctr, 2 * sizeof(uint32_t)) != cudaSuccess ||
        cudaMemset(c->ls_ctr, 0, 2 * sizeof(uint32_t)) != cudaSuccess)
        goto fail;
    {
        c->precise = cu_env_flag("RKV_CUDA_PRECISE", 0);
        c->fuse = cu_env_flag("RKV_CUDA_FUSE", 1);
        c->dec = cu_env_flag("RKV_CUDA_DEC", 1);
        /* 1: f32-accurate products; 2, 3: p, then q and p, plain f16 (a/b of the cost); 0: the
         * older attn_mma_kernel (2.5x slower at 4k, 5.4x at 32k on the H200, tenth session) */
        c->fa = (int)rkv_env_u64("RKV_CUDA_FA", 1, 0, 3);
        /* the split host read: percent of each sequence's host blocks on the cpu (0: off) */
        c->host_split = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT", 0, 0, 100);
        /* the split's cpu part off the launching thread: 0 never, 1 always, 2 for a tail of at
         * least split_async_us of the link a layer (not with the learned share, whose samples
         * are the launching thread's waits). H200, llama3-8b batch 16 at 4k, of the link's
         * bound: at 25 / 50 / 87.5 % host 0.992 / 1.110 / 1.231 against 0.906 / 0.975 / 1.053
         * waiting on the launching thread; the ramp at 24-40 sessions +7-19 % tok/s, at 20
         * (about 1 ms a layer) -9-12 % (thirty-second session) */
        c->split_async = (int)rkv_env_u64("RKV_CUDA_HOST_SPLIT_ASYNC", 2, 0, 2);
        c->split_async_us = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT_ASYNC_US", 1200, 0, 1000000);
        /* the learned share (a/b runs; tests: from the environment's share) */
        c->split_learn_env = cu_env_flag("RKV_CUDA_HOST_SPLIT_LEARN", 0);
        c->split_learn = c->host_split && c->split_learn_env && c->split_async != 1;
        c->split_min_us = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT_MIN_US", 1000, 0, 1000000);
        /* the learned share's first chain: the H200's at batch 20 (400-475 us a layer) */
        c->split_fix0_us = (uint32_t)rkv_env_u64("RKV_CUDA_HOST_SPLIT_FIX_US", 400, 0, 100000);
        c->link_gbps = 50.0;
        c->merge_in_attn = cu_env_flag("RKV_CUDA_MERGE_IN_ATTN", 1);
        /* batch 64 at 4k: 4557 / 4624 tok/s against 4468 / 4453 with two gemms; prefill 4k / 32k
         * 24624 / 10278 against 24063 / 10150 (H200) */
        c->pair_n = (uint32_t)rkv_env_u64("RKV_CUDA_PAIR_N", 1u << 16, 0, 1u << 16);
        c->vec4 = cu_env_flag("RKV_CUDA_VEC4", 1);
        c->attn_fixed = cu_env_flag("RKV_CUDA_ATTN_FIXED", 0);
        c->no_mma = cu_env_flag("RKV_CUDA_NO_MMA", 0);
        /* warps per weight row in the fused decode linears (for a/b runs) */
        const char *ke = getenv("RKV_CUDA_LIN_KS");
        c->lin_ks = 2;
        if (ke) {
            int v = atoi(ke);
            if (v == 1 || v == 2 || v == 4 || v == 8)
                c->lin_ks = v;
            else
                log_warn("RKV_CUDA_LIN_KS=%.20s is not 1, 2, 4 or 8: using 2", ke);
        }
        c->lin_stream = cu_env_flag("RKV_CUDA_LIN_STREAM", 1);
        /* decode linears and matmuls of up to 8 tokens on tensor cores from this many tokens (0:
         * the register kernels; one token takes the streamed kernel first) */
        c->lin_mma = (int)rkv_env_u64("RKV_CUDA_LIN_MMA", 2, 0, 8);
        c->pdl = cu_env_flag("RKV_CUDA_PDL", 1);
        /* 2: o's blocks take half an SM's shared memory (ls_alone), else they double up on
         * the SMs attention frees first (0.61 of the hbm bound at 4k against 0.76, eighth
         * session); with that, 2 reads the same as 1 (b=1 32k +0.3-0.8 %, 4k -0.6-0 %,
         * twenty-seventh session): o's weights streamed beside attention slow its keys */
        c->early = (int)rkv_env_u64("RKV_CUDA_EARLY", 1, 0, 2);
        /* decode attention's key chunk stages: 0 by the launch's shape (cuda_dec_stages), 2
         * or 3 for every launch (a/b) */
        c->dec_stages = (int)rkv_env_u64("RKV_CUDA_DEC_STAGES", 0, 0, 3);
        if (c->dec_stages == 1) {
            log_warn("RKV_CUDA_DEC_STAGES=1 is not 0 (by shape), 2 or 3: using 0");
            c->dec_stages = 0;
        }
        /* decode attention's device key chunks: 2 by tensor copies read evict-first in L2, 1 by
         * tensor copies, 0 by cp.async (kv_tmap_encode). H200, llama3-8b, same call: isolated
         * attention 32k / 128k / b=64 x 4k 0.671 / 0.836 / 0.884 of HBM with 1 against 0.618 /
         * 0.798 / 0.836 with 0; decode b=1 32k 0.869-0.871 against 0.863-0.864, b=64
         * 0.753-0.763 against 0.732-0.736. 2 against 1 (next call): 32k / 128k / b=64 0.691 /
         * 0.854 / 0.893 against 0.661 / 0.844 / 0.876, decode b=1 4k 0.879 against 0.870-0.876 */
        c->dec_tma = (int)rkv_env_u64("RKV_CUDA_DEC_TMA", 2, 0, 2);
        c->split_cost = (uint32_t)rkv_env_u64("RKV_CUDA_SPLIT_COST", 1, 0, 64);
        c->max_split = (uint32_t)rkv_env_u64("RKV_CUDA_MAX_SPLIT", 0, 0, 1u << 16);
        /* steps of up to this many rows on the decode kernels (weights read once, x from
         * registers); more rows on cublas. Deterministic mode keeps 8-row chunks */
        c->gemv_max_n =
            (uint32_t)rkv_env_u64("RKV_CUDA_GEMV_MAX_N", CUDA_GEMV_MAX_N, 1, CUDA_GEMV_MAX_N);
        /* env RKV_CUDA_DETERMINISTIC=1: the same for programs without the option (gpu_bench) */
        c->deterministic = o->deterministic || cu_env_flag("RKV_CUDA_DETERMINISTIC", 0);
        c->cpu_threads = o->n_threads;
        if (c->deterministic) {
            /* one split per kv block merged in block order, decode on the prefill kernel's
             * arithmetic, one linear kernel for every token count */
            c->attn_fixed = 1;
            c->dec = 0;
            c->fa = 0; /* a prefilled row would not round as the same row decoded */
            c->lin_stream = 0;
        }
        /* streamed linears: 32 KiB stages (16 KiB: 0.56 of hbm on gate/up, 32: 0.89), a ring
         * under half an SM's shared memory, so the next launch's block fits beside this one */
        c->ls_stage = cu_env_kb("RKV_CUDA_LS_STAGE_KB", 32, 4, 64) << 10;
        c->ls_ring = cu_env_kb("RKV_CUDA_LS_RING_KB", 96, 16, 200) << 10;
        c->ls_dyn = (int)rkv_env_u64("RKV_CUDA_LS_DYN", 1, 0, 2);
        c->ls_t4 = cu_env_flag("RKV_CUDA_LS_T4", 1);
        c->ls_alone = cu_env_flag("RKV_CUDA_LS_ALONE", 1);
        /* one attention block an SM up to 4 key units a split (b=1 4k: 0.842 / 0.849 of the
         * bound against 0.842 / 0.838; every block starts beside q/k/v's: attn_pick_split) */
        c->one_wave = (uint32_t)rkv_env_u64("RKV_CUDA_ONE_WAVE", 4, 0, 64);
        /* 1: steps of up to CUDA_GRAPH_ROWS rows, 2: every decode step, 0: none */
        c->graph_on = (int)rkv_env_u64("RKV_CUDA_GRAPH", 1, 0, 2);
    }
    rc = backend_new("cuda", &cuda_iface, c, out);
    if (rc < 0)
        goto fail;
    log_info("backend: cuda on gpu %d (%s, %d SMs, %.1f GiB)", gpu, p.name, c->n_sm,
             p.totalGlobalMem / 1073741824.0);
    return 0;
fail:
    cudaGetLastError();
    cu_free(c);
    return rc;
}

extern "C" int cuda_backend_create(const struct backend_opts *o, struct backend **out, char *errbuf,
                                   size_t errlen)
{
    int rc = rkv_cuda_backend_init(o, out);
    if (rc < 0 && errbuf)
        snprintf(errbuf, errlen, "backend cuda: cannot start on gpu %d: %s%s", o ? o->gpu : 0,
                 rkv_strerror(rc),
                 rc == RKV_ENODEV ? " (no CUDA device; use --backend cpu or auto)" : "");
    return rc;
}

extern "C" int rkv_cuda_dev_alloc(int gpu, size_t bytes, void **out)
{
    CU_TRY(cudaSetDevice(gpu));
    CU_TRY(cudaMalloc(out, bytes));
    return 0;
}

extern "C" void rkv_cuda_dev_free(void *p)
{
    cudaFree(p);
}

extern "C" void rkv_cuda_profiler(int on)
{
    /* brackets a region for ncu --profile-from-start off */
    if (on)
        cudaProfilerStart();
    else
        cudaProfilerStop();
}

extern "C" int rkv_cuda_copy(void *dst, const void *src, size_t n)
{
    CU_TRY(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
    /* from pageable memory cudaMemcpy returns once the bytes are staged, before the dma lands
     * (and a device-to-device copy is asynchronous): the backend's streams are non-blocking and
     * would not wait for it. Tenth session: an ATTN_FIXED identity check read a device block
     * whose last 128 KiB still held the previous placement's keys, once in five runs */
    CU_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    return 0;
}
