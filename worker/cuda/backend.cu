/* backend.cu - the cuda backend: the vtable over the kernels, tensors, the ops' glue, its start
 * and its end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_ops.cuh"

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
    cuda_graph_drop(c);
    cudaFree(t->data);
    free(t);
}

static int cu_tensor_set(void *ctx, struct be_tensor *t, const void *src, size_t off, size_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    CU_TRY(cudaMemcpyAsync((char *)t->data + off, src, n, cudaMemcpyHostToDevice, c->stream));
    /* the caller may free src on return */
    CU_TRY(cudaStreamSynchronize(c->stream));
    return 0;
}

static int cu_tensor_get(void *ctx, const struct be_tensor *t, void *dst, size_t off, size_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    CU_TRY(cudaMemcpyAsync(dst, (const char *)t->data + off, n, cudaMemcpyDeviceToHost, c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    return cuda_split_async_err(c);
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
    cuda_op_begin(c);
    int rc = upload_small(c, ids, (size_t)n * sizeof(int32_t));
    return rc < 0 ? rc : cuda_embed(c, (float *)out->data, w, (const int32_t *)c->small, n);
}

/* where an op over n rows of cols floats may also write its output rounded to 16 bits for the
 * cublas gemm that reads it next (matmul.cu's act16): the gemm path (more rows than the decode
 * kernels take) after a conversion to 16 bits, whose type it guesses; NULL when not */
static void *act16_twin(struct cuda_ctx *c, uint32_t n, uint32_t cols)
{
    if (n <= c->tune.gemv_max_n || c->deterministic || c->tune.precise ||
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
    cuda_op_begin(c);
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
    cuda_op_begin_keep(c);
    return cuda_matmul2(c, (float *)out0->data, (float *)out1->data, (const float *)in->data, w0,
                        w1, bias0 ? (const float *)bias0->data : NULL,
                        bias1 ? (const float *)bias1->data : NULL, n);
}

static int cu_matmul(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                     const struct be_tensor *w, const struct be_tensor *bias, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin_keep(c);
    return cuda_matmul(c, (float *)out->data, (const float *)in->data, w,
                       bias ? (const float *)bias->data : NULL, n);
}
static int cu_rope(void *ctx, struct be_tensor *x, const struct be_batch *b, uint32_t n_heads,
                   uint32_t head_dim, const struct be_rope *r)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    int rc = cuda_meta_ensure(c, b, cuda_meta_last_g(c));
    if (rc < 0)
        return rc;
    if (x->cols < n_heads * head_dim)
        return RKV_EINVAL;
    return cuda_rope(c, (float *)x->data, c->meta.d_pos, b->n_tokens, n_heads, head_dim, r);
}

static int cu_kv_write(void *ctx, const struct be_batch *b, uint32_t layer,
                       const struct be_tensor *k, const struct be_tensor *v)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    if (!c->have_kv || layer >= c->layout.n_layer)
        return RKV_ESTATE;
    if (k->cols != c->layout.n_kv_head * c->layout.head_dim)
        return RKV_EINVAL;
    int rc = cuda_meta_ensure(c, b, cuda_meta_last_g(c));
    char *stg = NULL;
    if (rc == 0)
        rc = cuda_wb_before(c, layer, &stg);
    if (rc == 0)
        rc = cuda_kv_write(c, &c->meta, layer, (const float *)k->data, (const float *)v->data, stg);
    if (rc == 0 && stg)
        rc = cuda_wb_after(c, layer, stg);
    return rc < 0 ? rc : 0;
}
static int cu_attn_partial(void *ctx, const struct be_batch *b, uint32_t layer,
                           enum kv_residency residency, const struct be_tensor *q,
                           const struct be_attn *at, const struct be_partial *out)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    c->act16_ok = 0; /* it writes out without cuda_op_begin */
    if (!c->have_kv || layer >= c->layout.n_layer || (unsigned)residency >= KV_N_POOLS)
        return RKV_ESTATE;
    if (at->n_kv_head != c->layout.n_kv_head || at->head_dim != c->layout.head_dim)
        return RKV_EINVAL;
    int rc = cuda_meta_ensure(c, b, at->n_head / at->n_kv_head);
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
        cuda_join_side(c);
        CU_TRY(cudaEventRecord(c->ev_pre_attn, c->stream));
    }
    if (c->hcpu.host_cpu)
        return cuda_attn_host_cpu(c, b, layer, q, at, out);
    CU_TRY(cudaStreamWaitEvent(c->side, c->ev_pre_attn, 0));
    /* split: q goes down first, the gpu's part is queued, then the cpu attends its part */
    const int split = c->meta.cpu_any;
    c->hst.split_gated += c->meta.split_gated;
    if (split && (rc = cuda_split_q_down(
                      c, q, (size_t)b->n_tokens * at->n_head * at->head_dim * sizeof(float))) < 0)
        return rc;
    rc = cuda_attn_host_gpu(c, &a, layer);
    if (rc == 0 && split)
        rc = c->meta.split_async ? cuda_split_host_cpu_async(c, b, layer, at, out)
                                 : cuda_split_host_cpu(c, b, layer, at, out);
    return rc;
}

static int cu_attn_merge(void *ctx, const struct be_partial *a, const struct be_partial *b,
                         uint32_t n, const struct be_attn *at)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    const struct cuda_meta *m = &c->meta;
    if (c->fixed[KV_DEVICE].valid && c->fixed[KV_HOST].valid && n == m->n_tokens &&
        c->fixed[KV_DEVICE].gen == m->gen && c->fixed[KV_HOST].gen == m->gen &&
        c->fixed[KV_DEVICE].layer == c->fixed[KV_HOST].layer) {
        /* both partials left one split per block: merged again block by block over both,
         * the numbers an all-device placement of the same blocks gives */
        c->fixed[KV_DEVICE].valid = c->fixed[KV_HOST].valid = 0;
        return cuda_attn_merge_blocks(
            c, m, c->fixed[KV_DEVICE].list, (const float *)c->part[KV_DEVICE],
            c->fixed[KV_HOST].list, (const float *)c->part[KV_HOST], at->n_head, at->head_dim,
            (float *)a->o->data, (float *)a->m->data, (float *)a->l->data, c->stream);
    }
    return cuda_attn_merge(c, (float *)a->o->data, (float *)a->m->data, (float *)a->l->data,
                           (const float *)b->o->data, (const float *)b->m->data,
                           (const float *)b->l->data, n, at->n_head, at->head_dim, c->stream);
}

static int glu(void *ctx, int gelu, struct be_tensor *out, const struct be_tensor *gate,
               const struct be_tensor *up, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    void *twin = act16_twin(c, n, gate->cols);
    int rc =
        cuda_glu(c, gelu, (float *)out->data, (const float *)gate->data, (const float *)up->data,
                 (size_t)n * gate->cols, twin, (enum be_type)c->act16_type);
    if (rc == 0 && twin)
        act16_have(c, (const float *)out->data, (size_t)n * gate->cols);
    return rc;
}

static int cu_silu_mul(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                       const struct be_tensor *up, uint32_t n)
{
    return glu(ctx, 0, out, gate, up, n);
}

static int cu_gelu_mul(void *ctx, struct be_tensor *out, const struct be_tensor *gate,
                       const struct be_tensor *up, uint32_t n)
{
    return glu(ctx, 1, out, gate, up, n);
}

/* each (token, head) row of head_dim values normed: the rows of a (n * n_heads, head_dim) view */
static int cu_rmsnorm_heads(void *ctx, struct be_tensor *x, const struct be_tensor *w, uint32_t n,
                            uint32_t n_heads, float eps)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    act16_written(c, (const float *)x->data, (size_t)n * x->cols);
    int rc = cuda_rmsnorm(c, (float *)x->data, (const float *)x->data, (const float *)w->data,
                          n * n_heads, w->cols, eps, NULL, BE_F16);
    return rc < 0 ? rc : 0;
}

static int cu_scale(void *ctx, struct be_tensor *x, float s, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    act16_written(c, (const float *)x->data, (size_t)n * x->cols);
    return cuda_scale(c, (float *)x->data, s, (size_t)n * x->cols);
}

static int cu_add(void *ctx, struct be_tensor *out, const struct be_tensor *a,
                  const struct be_tensor *b, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    return cuda_add(c, (float *)out->data, (const float *)a->data, (const float *)b->data,
                    (size_t)n * a->cols);
}

static int cu_get_rows(void *ctx, struct be_tensor *out, const struct be_tensor *in,
                       const uint32_t *rows, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    int rc = upload_small(c, rows, (size_t)n * sizeof(uint32_t));
    return rc < 0 ? rc
                  : cuda_get_rows(c, (float *)out->data, (const float *)in->data,
                                  (const uint32_t *)c->small, n, in->cols);
}

static int cu_linear(void *ctx, const struct be_linear *l, uint32_t n)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin_keep(c); /* a gemm over a twin written just before (cuda_linear drops it else) */
    return cuda_linear(c, l, n);
}

static int cu_rope_kv_write(void *ctx, const struct be_batch *b, uint32_t layer,
                            struct be_tensor *q, struct be_tensor *k, const struct be_tensor *v,
                            const struct be_attn *at, const struct be_rope *r)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cuda_op_begin(c);
    if (!c->have_kv || layer >= c->layout.n_layer)
        return RKV_ESTATE;
    if (at->n_kv_head != c->layout.n_kv_head || at->head_dim != c->layout.head_dim)
        return RKV_EINVAL;
    int rc = cuda_meta_ensure(c, b, at->n_head / at->n_kv_head);
    char *stg = NULL;
    if (rc == 0)
        rc = cuda_wb_before(c, layer, &stg);
    if (rc == 0)
        rc = cuda_rope_kv_write(c, &c->meta, layer, (float *)q->data, (float *)k->data,
                                (const float *)v->data, at->n_head, r, stg);
    if (rc == 0 && stg)
        rc = cuda_wb_after(c, layer, stg);
    return rc < 0 ? rc : 0;
}

static size_t cu_scratch_reserve(void *ctx)
{
    /* the two layer staging buffers of the copy path, at their cap */
    return 2 * ((struct cuda_ctx *)ctx)->stage.stage_limit;
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

static int cu_stats(void *ctx, char *buf, size_t len)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    char split_how[256];
    cuda_split_stats(c, split_how, sizeof split_how);
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
        (unsigned long long)c->hst.split_gated, split_how, (unsigned long long)c->hst.act16_conv,
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
    cuda_op_begin(c);
    CU_TRY(cudaStreamSynchronize(c->stream));
    return cuda_split_async_err(c);
}

static void cu_destroy(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c)
        return;
    cudaSetDevice(c->dev);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->side)
        cudaStreamSynchronize(c->side);
    cuda_graph_drop(c);
    cuda_pools_unregister(c);
    cuda_host_cpu_fini(&c->hcpu);
    cuda_stage_fini(&c->stage);
    cuda_meta_fini(&c->meta);
    cuda_sampling_fini(&c->smp);
    cudaFree(c->act16);
    cudaFree(c->wdeq);
    cudaFree(c->part[0]);
    cudaFree(c->part[1]);
    cudaFree(c->cnt[0]);
    cudaFree(c->cnt[1]);
    cudaFree(c->small);
    cudaFree(c->lin_h);
    cudaFree(c->pass_part);
    cudaFree(c->ls_ctr);
    cuda_lt_free(c);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->blas_ws)
        cudaFree(c->blas_ws);
    cuda_event_destroy(c->ev_pre_attn);
    cuda_event_destroy(c->ev_side_done);
    cuda_stream_destroy(c->side);
    cuda_stream_destroy(c->stream);
    free(c);
}

/* cuBLAS's workspace: its advice for Hopper */
#define CUDA_BLAS_WS_BYTES ((size_t)32 << 20)

/* one entry a line, in struct backend_i's order */
/* clang-format off */
static const struct backend_i cuda_iface = {
    cu_destroy,
    cu_tensor_alloc,
    cu_tensor_free,
    cu_tensor_set,
    cu_tensor_get,
    cu_set_kv,
    cu_embed,
    cu_rmsnorm,
    cu_matmul,
    cu_rope,
    cu_kv_write,
    cu_attn_partial,
    cu_attn_merge,
    cu_silu_mul,
    cu_add,
    cu_get_rows,
    cu_sync,
    cu_linear,
    cu_rope_kv_write,
    cu_scratch_reserve,
    cu_host_alloc,
    cu_host_free,
    cu_stats,
    cu_greedy,
    cu_host_attn_cpu,
    cu_host_split,
    cu_graph_begin,
    cu_graph_end,
    cu_matmul2,
    cu_sample,
    /* weight_types: the block formats beside Q8_0 (quant_dot.cu, quant_gemv.cu, quant_mma.cu,
     * quant_matmul.cu) */
    (1ull << BE_Q4_0) | (1ull << BE_Q4_1) | (1ull << BE_Q5_0) | (1ull << BE_Q5_1) |
        (1ull << BE_Q2_K) | (1ull << BE_Q3_K) | (1ull << BE_Q4_K) | (1ull << BE_Q5_K) |
        (1ull << BE_Q6_K) | (1ull << BE_IQ4_NL) | (1ull << BE_IQ4_XS),
    1, /* rope_freq_factors */
    cu_rmsnorm_heads,
    cu_gelu_mul,
    cu_scale,
    1, /* attn_window */
    1, /* rope_mscale */
    cu_set_host_attend,
};
/* clang-format on */

extern "C" int rkv_cuda_backend_create(const struct backend_opts *o, struct backend **out)
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
    if (p.major < 8) {
        log_error("cuda: gpu %d (%s) is compute capability %d.%d; rkv needs 8.0 or newer", gpu,
                  p.name, p.major, p.minor);
        rc = RKV_EUNSUPPORTED;
        goto fail;
    }
    cuda_tune_read(&c->tune);
    c->deterministic = o->deterministic || c->tune.deterministic;
    c->tune.deterministic = (uint32_t)c->deterministic; /* the mode in effect */
    if (c->deterministic)
        c->tune.attn_fixed = 1; /* one split per kv block, merged in block order */
    c->stage.stage_batch = 1;
    c->stage.stage_limit = (size_t)c->tune.stage_mb << 20;
    c->stage.pass_limit =
        c->tune.stage_pass_kb ? (size_t)c->tune.stage_pass_kb << 10 : c->stage.stage_limit;
    if (c->stage.pass_limit > c->stage.stage_limit)
        c->stage.pass_limit = c->stage.stage_limit;
    c->hcpu.host_split = c->tune.host_split;
    c->hcpu.link_gbps = 50.0; /* until set_kv measures the link */
    if (cuda_stream_create(&c->stream) < 0 || cuda_stream_create(&c->side) < 0 ||
        cuda_event_create(&c->ev_pre_attn) < 0 || cuda_event_create(&c->ev_side_done) < 0 ||
        cuda_stage_init(&c->stage) < 0 || cuda_host_cpu_init(&c->hcpu) < 0)
        goto fail;
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        goto fail;
    }
    if (cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    {
        /* a workspace of our own, after SetStream (which resets it): under stream capture
         * cuBLAS does not use its default pool and may take other algorithms */
        const size_t ws = CUDA_BLAS_WS_BYTES;
        if (cudaMalloc(&c->blas_ws, ws) != cudaSuccess) {
            log_warn("cuda: no %zu MiB for cuBLAS's workspace (%s): cuBLAS keeps its own pool, "
                     "which it does not use in a captured decode step (other algorithms "
                     "there); free device memory",
                     ws >> 20, cudaGetErrorString(cudaGetLastError()));
            c->blas_ws = NULL;
        }
        if (c->blas_ws && cublasSetWorkspace(c->blas, c->blas_ws, ws) != CUBLAS_STATUS_SUCCESS)
            goto fail;
        c->blas_ws_bytes = c->blas_ws ? ws : 0;
    }
    if (cudaMalloc(&c->ls_ctr, 2 * sizeof(uint32_t)) != cudaSuccess ||
        cudaMemset(c->ls_ctr, 0, 2 * sizeof(uint32_t)) != cudaSuccess)
        goto fail;
    rc = backend_wrap("cuda", &cuda_iface, c, out);
    if (rc < 0)
        goto fail;
    log_info("backend: cuda on gpu %d (%s, %d SMs, %.1f GiB)", gpu, p.name, c->n_sm,
             p.totalGlobalMem / 1073741824.0);
    return 0;
fail:
    cudaGetLastError();
    cu_destroy(c);
    return rc;
}

extern "C" int cuda_backend_create(const struct backend_opts *o, struct backend **out, char *errbuf,
                                   size_t errlen)
{
    int rc = rkv_cuda_backend_create(o, out);
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
     * would not wait for it, and a kernel could read a block whose last bytes had not landed */
    CU_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    return 0;
}
