/* meta.cu - the batch metadata: a step's positions, write slots, block lists and query tiles,
 * built on the host and uploaded when the batch changes. */
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_ops.cuh"

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
 * c->stage.pass_limit, per pass (kv_stage_passes); pass_of[s] gets each sequence's pass */
static int meta_passes(struct cuda_ctx *c, const uint32_t *sc, uint32_t n_seqs, uint64_t all_slots,
                       uint32_t *pass_of)
{
    struct cuda_meta *m = &c->meta;
    const size_t per = c->have_kv ? 2 * kv_slice_bytes(&c->layout) : 0;
    m->n_pass = 0;
    if (!per || !c->stage.pass_limit || all_slots * per <= c->stage.pass_limit)
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
    m->n_pass = kv_stage_passes(sc, n_seqs, c->stage.pass_limit / per, pass_of, m->pass_slot0,
                                m->pass_nslots, n_seqs);
    return 0;
}

/* builds the device view of a batch (positions, write slots, per-residency
 * block lists, query tiles) and uploads it when it differs from the last one */
int cuda_meta_ensure(struct cuda_ctx *c, const struct be_batch *b, uint32_t g)
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
    int rc = cuda_split_shares(c, b, sc, &all_slots);
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
    const int wb_on = B && c->stage.host_read == CUDA_HOST_COPY && !c->hcpu.host_cpu && !n_pass &&
                      all_slots * slot_bytes <= c->stage.stage_limit && !c->graph.capturing;
    uint32_t n_wb = 0, n_wb_old = 0;

    size_t o_pos = align16(4 * sizeof(uint32_t));
    size_t o_slot = o_pos + align16((size_t)b->n_tokens * 4);
    size_t o_wslot = o_slot + align16((size_t)b->n_tokens * 4);
    size_t o_seqs = o_wslot + align16((size_t)b->n_tokens * 4);
    size_t o_blks = o_seqs + align16((size_t)b->n_seqs * sizeof(struct cuda_seq_meta));
    /* with decode graphs, the block lists' room rounded up, so the arrays after them keep their
     * offsets while rows gain blocks (a recording holds those addresses: cu_graph_begin) */
    const size_t blk_room =
        c->tune.graph ? ((size_t)n_blk_total + 255) & ~(size_t)255 : (size_t)n_blk_total;
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
    cuda_join_side(c);
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

/* the group size the last attention used, so rope and kv_write build tiles
 * attention can reuse */
uint32_t cuda_meta_last_g(const struct cuda_ctx *c)
{
    const uint32_t *hdr = (const uint32_t *)c->meta.host;
    if (!c->meta.valid || !hdr || hdr[3] == 0)
        return 1;
    return hdr[3] == 1 ? 1 : 64 / hdr[3];
}

void cuda_meta_fini(struct cuda_meta *m)
{
    cudaFree(m->dev);
    free(m->host);
    free(m->stage_src);
    free(m->stage_w);
    free(m->stage_rows);
    free(m->pass_slot0);
    free(m->pass_nslots);
    free(m->cpu_k);
}
