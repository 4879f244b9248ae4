/* graph.cu - a decode step's layers recorded as a cuda graph and replayed while its shape holds. */
#include "worker/cuda/cuda_ops.cuh"

void cuda_graph_drop(struct cuda_ctx *c)
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

int cu_graph_begin(void *ctx, const struct be_batch *b, const struct be_attn *at, const void *owner)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->tune.graph || c->deterministic || c->tune.attn_fixed || c->hcpu.host_cpu ||
        !c->have_kv || b->n_tokens != b->n_seqs || at->n_kv_head == 0 ||
        (c->tune.graph == 1 && b->n_seqs > CUDA_GRAPH_ROWS))
        return 0;
    cuda_op_begin(c); /* joins the side stream */
    /* the meta goes up now, outside the recording; the layers' own calls find it current */
    int rc = cuda_meta_ensure(c, b, at->n_head / at->n_kv_head);
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

int cu_graph_end(void *ctx, int failed)
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
