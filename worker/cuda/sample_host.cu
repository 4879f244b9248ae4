/* sample_host.cu - the host side of greedy and sampled picks on the device: buffers, rows up,
 * picks down. */
#include <stdio.h>
#include <string.h>

#include "worker/cuda/cuda_ops.cuh"

int cu_greedy(void *ctx, const struct be_tensor *logits, uint32_t n, int32_t *ids, float *logprobs)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    /* the parts first (16-byte aligned), then the ids and logprobs */
    const size_t parts = (cuda_greedy_scratch(n, logits->cols) + 15) & ~(size_t)15;
    int rc = cuda_scratch(c, &c->smp.greedy_buf, &c->smp.greedy_cap,
                          parts + (size_t)n * 2 * sizeof(int32_t));
    if (rc < 0)
        return rc;
    int32_t *d_ids = (int32_t *)((char *)c->smp.greedy_buf + parts);
    float *d_lps = (float *)(d_ids + n);
    rc = cuda_greedy(c, (const float *)logits->data, n, logits->cols, d_ids, d_lps,
                     c->smp.greedy_buf);
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

int cu_sample(void *ctx, const struct be_tensor *logits, uint32_t n,
              const struct sample_dev_row *const *rows, struct sample_dev_out *outs)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!sample_dev_supported())
        return 1;
    /* a grammar's row (allow) is sampled on the host: the kernel has no mask yet */
    uint32_t n_rows = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (rows[i] && rows[i]->allow) {
            memset(&outs[i], 0, sizeof(outs[i]));
            outs[i].status = 1;
            continue;
        }
        n_rows += rows[i] != NULL;
    }
    if (n_rows == 0)
        return 1;
    cuda_op_begin(c);
    const uint32_t n_vocab = logits->cols;
    const size_t rb = (cuda_sample_row_bytes() + 15) & ~(size_t)15;
    for (uint32_t i0 = 0; i0 < n;) {
        /* the next CU_SAMPLE_ROWS rows that sample here */
        uint32_t which[CU_SAMPLE_ROWS], m = 0, pens = 0, i = i0;
        for (; i < n && m < CU_SAMPLE_ROWS; i++)
            if (rows[i] && !rows[i]->allow) {
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
        int rc = cu_host_scratch(&c->smp.smp_host, &c->smp.smp_host_cap, up + ob);
        if (rc < 0)
            return rc;
        /* RKV_DEBUG_SAMPLE_STAMPS=1: each row's phase times to stderr (a measurement) */
        const size_t ns = c->tune.sample_stamps ? (size_t)m * cuda_sample_stamps() : 0;
        const size_t sc = cuda_sample_scratch(m, n_vocab);
        rc = cuda_scratch(c, &c->smp.smp_dev, &c->smp.smp_dev_cap, up + ob + sv + sc + ns * 8);
        if (rc < 0)
            return rc;
        char *h = (char *)c->smp.smp_host, *d = (char *)c->smp.smp_dev;
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
        if ((rc = cuda_split_async_err(c)) < 0)
            return rc;
        for (uint32_t j = 0; j < m; j++) {
            outs[which[j]] = h_out[j];
            c->hst.smp_rows++;
            c->hst.smp_back += h_out[j].status != 0;
        }
    }
    return 0;
}

void cuda_sampling_fini(struct cuda_sampling *s)
{
    cudaFree(s->greedy_buf);
    cudaFree(s->smp_dev);
    cudaFreeHost(s->smp_host);
}
