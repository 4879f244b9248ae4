/* server.c - kvmgr's request server: KV pools, the tactic plan, block tables for each step,
 * tactic events and histograms. */
#include "kvmgr/server.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/err.h"
#include "common/gpu.h"
#include "common/log.h"
#include "common/util.h"
#include "kvmgr/evring.h"
#include "kvmgr/migrate.h"
#include "kvmgr/plan.h"
#include "kvmgr/pool.h"
#include "proto/kvwire.h"
#include "proto/msg.h"
#include "proto/sock.h"
#include "proto/wire.h"

/*
 * Shape: one thread serves the rep socket (rkvd's KV_PREP before every
 * step, workers' HELLO, control messages) with a short timeout, and runs
 * the periodic tick between requests: re-plan when something changed
 * (budget, mode, sessions going idle), publish the histogram, heal the
 * listeners. Nothing here blocks on a peer: replies go out at once.
 *
 * Pools are created when the first worker says how many bytes a block of
 * its model takes: the device pool of each gpu (shared memory on the cpu
 * backend) and one host pool, sized from the budgets. Workers map them by
 * name; their memory outlives a worker that dies, so the KV survives it.
 * On a gpu (--backend cuda, or auto when the worker runs on one) each device
 * pool is one cudaMalloc slab of VRAM target - weights - compute reserve,
 * capped by the free memory, exported by its IPC handle ("cudaipc:<hex>" in
 * HELLO_ACK); the host pool stays shared memory, pinned with cudaHostRegister.
 */

/* compute reserve when neither the config nor the worker gives one: the
 * worker's step activations, logits, cublas workspace and host-block staging
 * slots, which it allocates after the pools exist (H200, llama3-8b bf16, 8
 * streams: 221 MiB). The cuda contexts and the weights are measured instead. */
#define KVMGR_CUDA_RESERVE (512ull << 20)

/* a session moved to another gpu stays there at least this long (hysteresis
 * on top of the planner's margin) */
#define KVMGR_MOVE_COOLDOWN_MS 5000

/* tactic events kept for EVENTS_GET: rkvd asks within 250 ms of a STATUS
 * that shows new ones, so this only overflows in a storm or while rkvd is away */
#define KVMGR_EVENT_RING 4096

/* what kvmgr knows of a session besides its blocks */
struct sess {
    uint64_t sid;
    uint32_t gpu;
    uint32_t want_pos; /* positions it will hold after its next step */
    int active;
    int pinned;
    int open;        /* known to the allocator */
    uint32_t reused; /* leading positions mapped to another session's blocks at open */
    uint64_t last_use;
    enum plan_tactic tactic;
    int nomove;                    /* rkvd's last prep asked to keep it on its gpu */
    int placed;                    /* its gpu was chosen (plan_pick_gpu) */
    uint64_t moved_ms;             /* last move to another gpu (rkv_now_ms), 0 = never */
    uint32_t tail_pub;             /* host blocks its last tactic event said it has */
    uint64_t turn_since, in_since; /* rotation (rkv_now_ms): see plan_session */
    int rot_back; /* left ROTATED: runs once its blocks are all back on the device */
};

struct gpu_state {
    uint32_t worker_pid;
    uint64_t weights_bytes;
    uint64_t free_bytes;  /* the gpu's free memory at the first hello */
    uint64_t fixed_bytes; /* what the gpu held before the slab (weights, cuda contexts, the
                           * worker's kept scratch), read at the first hello; 0 = unknown */
    uint64_t reserve_bytes;
    double pcie_gbps, dev_attn_gbps, host_attn_gbps, cpu_attn_gbps, split_gbps;
};

/* pools made off the request loop (pinning a large host pool takes seconds) */
struct pools_new {
    uint64_t block_bytes;
    uint32_t n_gpus;
    struct kvpool *dev[KVMGR_MAX_GPUS];
    struct kvpool *host;
    struct kvb *kvb;
};

struct kvmgr {
    struct kvmgr_conf c;
    uint64_t started_ms;
    struct proto_sock *rep, *pub;
    struct evring *events; /* the last tactic events, numbered (EVENTS_GET) */
    uint64_t block_bytes;
    int kv_dtype; /* what the first worker's blocks hold (proto_kv_dtype_names) */
    uint32_t n_gpus;
    int cuda; /* device pools are cuda slabs */
    struct gpu_state gpu[KVMGR_MAX_GPUS];
    struct kvpool *dev[KVMGR_MAX_GPUS];
    struct kvpool *host;
    struct kvb *kvb;
    /* the pool maker thread: started by the first worker HELLO on a gpu */
    pthread_t maker;
    int making;
    atomic_int made; /* the maker is done; made_rc its result */
    int made_rc;
    char made_why[256];    /* the maker's reason when made_rc says it failed */
    char pools_error[256]; /* why the last try made no pools ("" once they exist: STATUS) */
    uint64_t make_bytes;
    /* sliding windows (the first worker's hello): table entries per position block and the
     * local layers' window; 1 and 0 without */
    uint32_t n_parts, n_swa;
    uint64_t make_started_ms;
    struct pools_new np;
    struct rkv_map sess; /* sid -> struct sess */
    struct plan *plan;
    uint64_t plan_seq;     /* plans made so far: the histograms and budget answers name theirs */
    int dirty;             /* something changed since the last plan */
    uint64_t grace_end_ms; /* an idle session's grace ends then: plan again (0 = none) */
    uint64_t turn_end_ms;  /* a rotation turn ends then: plan again (0 = none) */
    uint64_t rot_logged_q[KVMGR_MAX_GPUS], rot_logged_ms[KVMGR_MAX_GPUS]; /* log_rotation */
    uint64_t last_hist_ms;
    uint64_t moved_bytes;
    struct proto_wbuf buf;
};

static uint32_t blocks_for(const struct kvmgr *k, uint64_t n_pos)
{
    return (uint32_t)((n_pos + (uint64_t)k->c.block_size - 1) / (uint64_t)k->c.block_size);
}

/* the first position block whose local parts kvmgr keeps for a session with n_written
 * positions written: the window of a step from there, and one position block more, so a
 * cut-back of a few positions (a stop string, unused decode steps) stays exact */
static uint32_t window_keep(const struct kvmgr *k, uint64_t n_written)
{
    uint32_t first = k->kvb ? kvb_window_first(k->kvb, n_written) : 0;
    return first ? first - 1 : 0;
}

/* blocks opening a session of n_pos positions takes: every part of every position block (the
 * dead local parts of a sliding-window layout go only after its first step's ack, so a session
 * counted by its live parts before then would not fit where the plan put it) */
static uint32_t open_blocks(const struct kvmgr *k, uint64_t n_pos)
{
    return blocks_for(k, n_pos) * (k->n_parts ? k->n_parts : 1);
}

/* blocks the planner counts for s: those it holds, and the parts of the position blocks its
 * next step adds */
static uint32_t sess_blocks(const struct kvmgr *k, const struct sess *s)
{
    uint32_t d = 0, h = 0;
    if (!s->open || kvb_session_counts(k->kvb, s->sid, &d, &h) < 0)
        return open_blocks(k, s->want_pos);
    size_t held = kvb_session_tokens(k->kvb, s->sid);
    uint32_t more = s->want_pos > held ? blocks_for(k, s->want_pos) - blocks_for(k, held) : 0;
    return d + h + more * (k->n_parts ? k->n_parts : 1);
}

/* --- pools ------------------------------------------------------------------------ */

static uint64_t reserve_of(const struct kvmgr *k, uint32_t g)
{
    if (k->c.compute_reserve)
        return k->c.compute_reserve;
    if (k->gpu[g].reserve_bytes)
        return k->gpu[g].reserve_bytes;
    return k->cuda ? KVMGR_CUDA_RESERVE : 0;
}

/* gpu g's device blocks under the vram target. None: the planner could run no session there
 * (each keeps its newest blocks on the device), so why gets what the target must be, logged */
static uint32_t dev_blocks_for_budget(const struct kvmgr *k, uint32_t g, uint64_t block_bytes,
                                      char *why, size_t whylen)
{
    struct plan_gpu pg = {k->c.vram_target, k->gpu[g].weights_bytes, reserve_of(k, g)};
    uint32_t n = plan_dev_cap(&pg, block_bytes);
    uint64_t used = pg.weights_bytes;
    char t[32], u[32], r[32];
    if (k->cuda && k->gpu[g].fixed_bytes) {
        /* read at the first hello, the worker's weights loaded: what the gpu held (weights,
         * kvmgr's and the worker's cuda contexts, anything else on it) counts against the
         * target, so the slab is the target minus that minus the reserve */
        uint64_t fr = k->gpu[g].free_bytes;
        used = k->gpu[g].fixed_bytes;
        uint64_t want = used + pg.compute_reserve_bytes;
        uint64_t room = k->c.vram_target > want ? k->c.vram_target - want : 0;
        if (fr < pg.compute_reserve_bytes)
            room = 0;
        else if (room > fr - pg.compute_reserve_bytes)
            room = fr - pg.compute_reserve_bytes;
        cfg_format_size(k->c.vram_target, t, sizeof t);
        cfg_format_size(used, u, sizeof u);
        cfg_format_size(pg.compute_reserve_bytes, r, sizeof r);
        log_info("gpu %u: vram target %s, in use now %s (weights, cuda contexts), compute "
                 "reserve %s: %llu blocks for kv",
                 g, t, u, r, (unsigned long long)(room / block_bytes));
        if (room / block_bytes < n)
            n = (uint32_t)(room / block_bytes);
    }
    if (n == 0) {
        char b[32], need[32];
        cfg_format_size(k->c.vram_target, t, sizeof t);
        cfg_format_size(used, u, sizeof u);
        cfg_format_size(pg.compute_reserve_bytes, r, sizeof r);
        cfg_format_size(block_bytes, b, sizeof b);
        cfg_format_size(used + pg.compute_reserve_bytes + 8 * block_bytes, need, sizeof need);
        snprintf(why, whylen,
                 "gpu %u: vram target %s leaves no room for a kv block (%s): %s in use (weights, "
                 "cuda contexts, anything else on the gpu) and a compute reserve of %s; raise "
                 "--vram-target to %s or more (8 blocks), or free the gpu",
                 g, t, b, u, r, need);
        log_ratelimited(RKV_LOG_ERROR, 10000, 1, "%s", why);
    }
    return n;
}

static void pools_fini(struct pools_new *np)
{
    kvb_destroy(np->kvb);
    for (uint32_t g = 0; g < KVMGR_MAX_GPUS; g++)
        kvpool_destroy(np->dev[g]);
    kvpool_destroy(np->host);
    memset(np, 0, sizeof *np);
}

/* makes the pools into np (reads only k's config and per-gpu sizes); why: the reason when no
 * kv block fits a gpu's budget ("" otherwise) */
static int create_pools(const struct kvmgr *k, uint64_t block_bytes, struct pools_new *np,
                        char *why, size_t whylen)
{
    why[0] = 0;
    memset(np, 0, sizeof *np);
    np->block_bytes = block_bytes;
    np->n_gpus = (uint32_t)k->c.workers;
    struct kvb_config kc = {0};
    kc.n_gpus = np->n_gpus;
    kc.block_tokens = (uint32_t)k->c.block_size;
    kc.moves_need_written = 1; /* steps in flight write blocks kvmgr must not copy yet */
    kc.n_parts = k->n_parts;
    kc.window = k->n_swa;
    kc.host_blocks = plan_host_cap(k->c.host_budget, block_bytes);
    char name[64];
    int rc;
    const struct kvpool_gpu_ops *ops = k->cuda ? kvpool_cuda_ops() : NULL;
    for (uint32_t g = 0; g < np->n_gpus; g++) {
        kc.dev_blocks[g] = dev_blocks_for_budget(k, g, block_bytes, why, whylen);
        if (kc.dev_blocks[g] == 0) {
            pools_fini(np);
            return RKV_ENOSPACE;
        }
        kvpool_make_name(name, sizeof name, (int)getpid(), KVPOOL_DEVICE_SHM, g);
        struct kvpool_config pc = {k->cuda ? KVPOOL_DEVICE_CUDA : KVPOOL_DEVICE_SHM,
                                   g,
                                   k->cuda ? NULL : name,
                                   block_bytes,
                                   kc.dev_blocks[g],
                                   (uint32_t)k->c.block_size,
                                   1,
                                   ops};
        if ((rc = kvpool_create(&pc, &np->dev[g]))) {
            log_error("cannot create the device pool of gpu %u (%u blocks of %llu bytes): %s", g,
                      kc.dev_blocks[g], (unsigned long long)block_bytes, rkv_strerror(rc));
            pools_fini(np);
            return rc;
        }
    }
    kvpool_make_name(name, sizeof name, (int)getpid(), KVPOOL_HOST, 0);
    struct kvpool_config hc = {
        KVPOOL_HOST, 0, name, block_bytes, kc.host_blocks, (uint32_t)k->c.block_size, 1, ops};
    if ((rc = kvpool_create(&hc, &np->host))) {
        log_error("cannot create the host pool (%u blocks of %llu bytes): %s", kc.host_blocks,
                  (unsigned long long)block_bytes, rkv_strerror(rc));
        pools_fini(np);
        return rc;
    }
    if ((rc = kvb_create(&kc, &np->kvb))) {
        pools_fini(np);
        return rc;
    }
    char dev[32], host[32];
    cfg_format_size((uint64_t)kc.dev_blocks[0] * block_bytes, dev, sizeof dev);
    cfg_format_size((uint64_t)kc.host_blocks * block_bytes, host, sizeof host);
    log_info("pools: %u device block(s) per gpu (%s, %s) and %u host block(s) (%s%s) of %llu "
             "bytes, %lld positions each",
             kc.dev_blocks[0], dev, k->cuda ? "cuda ipc" : "shared memory", kc.host_blocks, host,
             k->cuda ? ", pinned" : "", (unsigned long long)block_bytes,
             (long long)k->c.block_size);
    return 0;
}

/* --- planning --------------------------------------------------------------------- */

static void *pool_maker(void *arg)
{
    struct kvmgr *k = arg;
    k->made_rc = create_pools(k, k->make_bytes, &k->np, k->made_why, sizeof k->made_why);
    atomic_store(&k->made, 1);
    return NULL;
}

/* np's pools go live */
static void pools_install(struct kvmgr *k)
{
    k->pools_error[0] = 0;
    k->block_bytes = k->np.block_bytes;
    k->n_gpus = k->np.n_gpus;
    for (uint32_t g = 0; g < KVMGR_MAX_GPUS; g++)
        k->dev[g] = k->np.dev[g];
    k->host = k->np.host;
    k->kvb = k->np.kvb;
    memset(&k->np, 0, sizeof k->np);
}

/* what STATUS says while there are no pools: the budget's reason, or the error's */
static void pools_failed(struct kvmgr *k, int rc, const char *why)
{
    if (why[0])
        snprintf(k->pools_error, sizeof k->pools_error, "%s", why);
    else
        snprintf(k->pools_error, sizeof k->pools_error, "kvmgr cannot create its pools: %s",
                 rkv_strerror(rc));
}

/* the maker thread's pools go live (request loop): 1 when they did, <0 when it failed, 0 while
 * it still works */
static int pools_collect(struct kvmgr *k)
{
    if (!k->making || !atomic_load(&k->made))
        return 0;
    pthread_join(k->maker, NULL);
    k->making = 0;
    if (k->made_rc) {
        log_error("kvmgr cannot create its pools: %s (the next worker hello tries again)",
                  rkv_strerror(k->made_rc));
        pools_failed(k, k->made_rc, k->made_why);
        return k->made_rc;
    }
    pools_install(k);
    log_info("pools ready after %.1f s", (rkv_now_ms() - k->make_started_ms) / 1000.0);
    return 1;
}

static void publish_json(struct kvmgr *k, int type, const void *msg)
{
    char err[256];
    proto_wbuf_reset(&k->buf);
    if (proto_put_json(&k->buf, type, msg, err, sizeof err) == 0)
        proto_sock_send(k->pub, type, 0, k->buf.data, k->buf.len);
}

/* numbers a transition into the ring (what rkvd fetches when pub/sub dropped it), then
 * publishes it for rkvd to see at once */
static void publish_tactic(struct kvmgr *k, struct proto_tactic_event *ev)
{
    ev->kvmgr_pid = (uint32_t)getpid();
    evring_push(k->events, ev);
    publish_json(k, PROTO_MSG_TACTIC_EVENT, ev);
}

static int tactic_to_proto(enum plan_tactic t)
{
    switch (t) {
    case PLAN_RESIDENT: return PROTO_TACTIC_RESIDENT;
    case PLAN_WINDOW: return PROTO_TACTIC_WINDOW;
    case PLAN_CPU_TAIL: return PROTO_TACTIC_CPU_TAIL;
    default: return PROTO_TACTIC_PARKED;
    }
}

/* host blocks the session holds now (what a WINDOW or CPU_TAIL step streams) */
static uint32_t sess_tail(const struct kvmgr *k, const struct sess *s)
{
    uint32_t n_dev = 0, n_host = 0;
    if (!s->open || kvb_session_counts(k->kvb, s->sid, &n_dev, &n_host) < 0)
        return 0;
    return n_host;
}

static const char *transition_reason(enum plan_tactic from, enum plan_tactic to, int active,
                                     enum plan_reason why)
{
    if (to == PLAN_ROTATED)
        return from == PLAN_WAIT ? "rotation: admitted, waits for its turn"
                                 : "rotation: turn over, waits for the next";
    if (why == PLAN_WHY_TURN)
        return "rotation: its turn on the gpu";
    if (to == PLAN_PARKED)
        return active ? "vram pressure: parked" : "idle: parked to make room";
    if (to == PLAN_WAIT)
        return "not admitted: the budgets are full";
    if (to == PLAN_WINDOW || to == PLAN_CPU_TAIL)
        return from == PLAN_RESIDENT ? "vram pressure: tail moved to host" : "tail resized";
    if (to == PLAN_RESIDENT)
        return from == PLAN_WAIT ? "admitted" : "room again: promoted back to vram";
    return "re-planned";
}

/* plans every session, moves blocks to match, publishes transitions */
static void publish_tails(struct kvmgr *k);

/* the rotation decision of each gpu, in the log: when it starts or stops, and when its
 * quantum moves by a quarter (at most every 10 s); the swaps themselves are tactic events */
static void log_rotation(struct kvmgr *k, const struct plan *p)
{
    const struct plan_summary *sum = plan_get_summary(p);
    uint64_t now = rkv_now_ms();
    for (uint32_t g = 0; g < sum->n_gpus && g < KVMGR_MAX_GPUS; g++) {
        const struct plan_gpu_summary *gs = &sum->gpu[g];
        uint64_t was = k->rot_logged_q[g], q = gs->quantum;
        int moved =
            was && q && (q * 4 < was * 3 || q * 4 > was * 5) && now - k->rot_logged_ms[g] >= 10000;
        if ((q != 0) == (was != 0) && !moved)
            continue;
        if (q)
            log_info("gpu %u: %u sessions take turns on the device, %u holding it, a turn of "
                     "%llu ms (rate model: %.0f tok/s rotating, %.0f spilling)",
                     g, gs->n_rotating, gs->sessions[PLAN_RESIDENT], (unsigned long long)q,
                     gs->rot_tok_s, gs->spill_tok_s);
        else
            log_info("gpu %u: rotation ends (%s)", g,
                     gs->window_cap == PLAN_NO_CAP && !gs->sessions[PLAN_WINDOW] &&
                             !gs->sessions[PLAN_CPU_TAIL]
                         ? "the running sessions fit"
                         : "spilling the tails is faster now, or one does not fit alone");
        k->rot_logged_q[g] = q;
        k->rot_logged_ms[g] = now;
    }
}

static int replan(struct kvmgr *k, const char *why)
{
    if (!k->kvb)
        return 0;
    size_t n = k->sess.len, i = 0, it = 0;
    struct plan_session *ps = calloc(n ? n : 1, sizeof *ps);
    struct plan_gpu pg[KVMGR_MAX_GPUS];
    if (!ps)
        return RKV_ENOMEM;
    void *v;
    while (rkv_map_next(&k->sess, &it, NULL, &v)) {
        struct sess *s = v;
        struct plan_session *p = &ps[i++];
        p->id = s->sid;
        p->gpu = s->gpu;
        p->n_blocks = sess_blocks(k, s);
        if (p->n_blocks == 0)
            p->n_blocks = 1;
        p->active = (uint8_t)s->active;
        p->pinned = (uint8_t)s->pinned;
        p->last_use = s->last_use;
        p->cur_tactic = s->open ? s->tactic : PLAN_WAIT;
        if (s->open)
            mig_session_state(k->kvb, s->sid, p);
        p->movable = (uint8_t)(!s->nomove && (!s->moved_ms || rkv_now_ms() - s->moved_ms >=
                                                                  KVMGR_MOVE_COOLDOWN_MS));
        p->turn_since = s->turn_since;
        p->in_since = s->in_since;
    }
    for (uint32_t g = 0; g < k->n_gpus; g++) {
        /* a live target is planned with all the gpu held besides kv, not just the weights */
        uint64_t fixed = k->gpu[g].fixed_bytes > k->gpu[g].weights_bytes ? k->gpu[g].fixed_bytes
                                                                         : k->gpu[g].weights_bytes;
        pg[g] = (struct plan_gpu){k->c.vram_target,        fixed,
                                  reserve_of(k, g),        k->gpu[g].pcie_gbps,
                                  k->gpu[g].dev_attn_gbps, k->gpu[g].host_attn_gbps,
                                  k->gpu[g].cpu_attn_gbps, k->gpu[g].split_gbps};
        /* no worker has said hello for it: nothing would run a session moved there */
        pg[g].offline = k->gpu[g].worker_pid == 0;
        /* the pool was sized at start: a larger budget cannot grow it */
        uint32_t cap = kvpool_get_desc(k->dev[g])->n_blocks;
        if (plan_dev_cap(&pg[g], k->block_bytes) > cap)
            pg[g].vram_target =
                pg[g].weights_bytes + pg[g].compute_reserve_bytes + (uint64_t)cap * k->block_bytes;
    }
    struct plan_input in;
    plan_input_init(&in);
    in.mode = (enum plan_mode)k->c.mode;
    in.block_bytes = k->block_bytes;
    in.min_dev = k->n_parts; /* the newest position block's parts stay on the device */
    in.host_budget = k->c.host_budget;
    in.margin_pct = (uint32_t)k->c.margin_pct;
    in.now = rkv_now_ms();
    in.idle_grace = (uint64_t)k->c.park_after_ms;
    in.rotation = (enum plan_rotation)k->c.rotation;
    in.max_stall = (uint64_t)k->c.max_stall_ms;
    in.ticks_per_s = 1000;
    in.n_gpus = k->n_gpus;
    in.gpus = pg;
    in.n_sessions = n;
    in.sessions = ps;
    struct plan *p;
    int rc = plan_compute(&in, k->plan, &p);
    if (rc) {
        free(ps);
        log_error("planning failed: %s", rkv_strerror(rc));
        return rc;
    }
    struct mig_stats st = {0};
    rc = mig_apply(k->kvb, k->dev, k->n_gpus, k->host, p, &st);
    if (rc)
        log_warn("moving blocks for the plan: %s", rkv_strerror(rc));
    k->moved_bytes += (uint64_t)st.copies * k->block_bytes;
    uint64_t now = rkv_wall_ms();
    for (size_t j = 0; j < plan_n_assign(p); j++) {
        const struct plan_assign *a = plan_assign_at(p, j);
        struct sess *s = rkv_map_get(&k->sess, a->id);
        if (!s)
            continue;
        if (a->dropped && s->open) {
            s->open = 0; /* mig_apply closed it: rebuilt by re-prefill */
        }
        /* a session admitted straight into a spilled tactic is a transition
         * too (from "new"): else a load that arrives at once logs nothing */
        int first_spill = !s->open && s->tactic == PLAN_WAIT &&
                          (a->tactic == PLAN_WINDOW || a->tactic == PLAN_CPU_TAIL);
        /* rotation's clock (plan_session.turn_since, in_since) */
        int on_dev =
            s->tactic == PLAN_RESIDENT || s->tactic == PLAN_WINDOW || s->tactic == PLAN_CPU_TAIL;
        if (a->turn_new || ((a->tactic == PLAN_ROTATED || a->tactic == PLAN_PARKED) && on_dev))
            s->turn_since = in.now;
        if (a->n_dev && (s->tactic == PLAN_ROTATED || s->tactic == PLAN_WAIT))
            s->in_since = in.now;
        if (s->tactic == PLAN_ROTATED && a->tactic != PLAN_ROTATED)
            s->rot_back = 1;
        if ((s->tactic != a->tactic && s->open) || first_spill) {
            struct proto_tactic_event ev = {0};
            ev.session_id = a->id;
            ev.from = first_spill ? PROTO_TACTIC_NEW : tactic_to_proto(s->tactic);
            ev.to = tactic_to_proto(a->tactic);
            snprintf(ev.reason, sizeof ev.reason, "%s (%s)",
                     transition_reason(s->tactic, a->tactic, s->active, a->reason), why);
            ev.tail_blocks = s->open ? sess_tail(k, s) : a->n_host;
            s->tail_pub = (uint32_t)ev.tail_blocks;
            ev.bytes_moved = (uint64_t)(a->demote + a->promote) * k->block_bytes;
            ev.ts_ms = now;
            ev.gpu = s->gpu;
            if (ev.from != ev.to)
                publish_tactic(k, &ev);
            log_debug("session %llu: %s -> %s (%s)", (unsigned long long)a->id,
                      plan_tactic_name(s->tactic), plan_tactic_name(a->tactic), why);
        }
        s->tactic = a->tactic;
    }
    /* an idle session on the device in its grace may be parked once it ends */
    k->grace_end_ms = 0;
    for (size_t j = 0; j < n; j++) {
        const struct plan_assign *a = plan_assign_at(p, j);
        uint64_t end = ps[j].last_use + in.idle_grace;
        if (in.idle_grace && !ps[j].active && a->n_dev > 0 && end > in.now &&
            (!k->grace_end_ms || end < k->grace_end_ms))
            k->grace_end_ms = end;
    }
    k->turn_end_ms = plan_get_summary(p)->next_turn;
    log_rotation(k, p);
    plan_destroy(k->plan);
    k->plan = p;
    k->plan_seq++;
    /* a move that waits for room (blocks the workers still hold) or for a step to finish
     * writing is tried again at the next prep or tick */
    k->dirty = st.deferred > 0;
    free(ps);
    /* the moves just made changed tails: the sessions list shows them now, not at the next
     * second's tick (a growing spilled session re-plans at every new block) */
    publish_tails(k);
    return 0;
}

/* a spilled session's tail changes without a change of tactic: as it grows, and as the plan
 * moves blocks between its window and its tail. Each change goes out as an event from the
 * tactic to itself ("tail resized"), so rkvd's sessions list, rkvctl and the event log show the
 * host blocks a step really streams (they showed the tail of the first spill only) */
static void publish_tails(struct kvmgr *k)
{
    size_t it = 0;
    void *v;
    uint64_t now = rkv_wall_ms();
    while (rkv_map_next(&k->sess, &it, NULL, &v)) {
        struct sess *s = v;
        if (!s->open || (s->tactic != PLAN_WINDOW && s->tactic != PLAN_CPU_TAIL))
            continue;
        uint32_t tail = sess_tail(k, s);
        if (tail == s->tail_pub)
            continue;
        struct proto_tactic_event ev = {0};
        ev.session_id = s->sid;
        ev.from = ev.to = tactic_to_proto(s->tactic);
        snprintf(ev.reason, sizeof ev.reason, "tail resized: %u -> %u blocks on host", s->tail_pub,
                 tail);
        ev.tail_blocks = tail;
        ev.ts_ms = now;
        ev.gpu = s->gpu;
        s->tail_pub = tail;
        publish_tactic(k, &ev);
    }
}

static void publish_histogram(struct kvmgr *k)
{
    if (!k->plan)
        return;
    const struct plan_summary *sum = plan_get_summary(k->plan);
    for (uint32_t g = 0; g < sum->n_gpus; g++) {
        struct proto_histogram h = {0};
        h.gpu = g;
        for (int t = 0; t < PLAN_N_TACTICS; t++) {
            int pt = tactic_to_proto((enum plan_tactic)t);
            h.sessions[pt] += sum->gpu[g].sessions[t];
            h.bytes[pt] += sum->gpu[g].bytes[t];
        }
        h.device_total = (uint64_t)kvpool_get_desc(k->dev[g])->n_blocks * k->block_bytes;
        h.device_used = h.device_total - (uint64_t)kvb_free_dev(k->kvb, g) * k->block_bytes;
        h.host_total = (uint64_t)kvpool_get_desc(k->host)->n_blocks * k->block_bytes;
        h.host_used = h.host_total - (uint64_t)kvb_free_host(k->kvb) * k->block_bytes;
        h.plan_seq = k->plan_seq;
        publish_json(k, PROTO_MSG_HISTOGRAM, &h);
    }
}

/* --- KV_PREP ---------------------------------------------------------------------- */

static struct sess *sess_get(struct kvmgr *k, uint64_t sid, uint32_t gpu)
{
    struct sess *s = rkv_map_get(&k->sess, sid);
    if (s)
        return s;
    s = calloc(1, sizeof *s);
    if (!s || rkv_map_put(&k->sess, sid, s)) {
        free(s);
        return NULL;
    }
    s->sid = sid;
    s->gpu = gpu;
    s->tactic = PLAN_WAIT;
    s->turn_since = s->in_since = rkv_now_ms();
    k->dirty = 1;
    return s;
}

static void sess_drop(struct kvmgr *k, uint64_t sid)
{
    struct sess *s = rkv_map_del(&k->sess, sid);
    if (!s)
        return;
    if (s->open)
        kvb_session_close(k->kvb, sid);
    free(s);
    k->dirty = 1;
}

/* the positions whose ids q carries: [*first, end). A new session's are all it has;
 * a step's end n_owed before n_pos (ids the step picks itself: the last one of a step
 * prepared ahead, those of a step's later decode steps). None when they would start
 * before position 0 */
static size_t token_span(const struct proto_kv_prep_seq *q, size_t *first)
{
    size_t end = (q->flags & PROTO_KV_NEW) ? q->n_tokens
                 : q->n_pos > q->n_owed    ? q->n_pos - q->n_owed
                                           : 0;
    if (!q->n_tokens || q->n_tokens > end) {
        *first = end;
        return end;
    }
    *first = end - q->n_tokens;
    return end;
}

/* opens a session kvmgr has not seen: full blocks whose tokens another
 * session has written are shared (the last token always stays to compute) */
static int open_session(struct kvmgr *k, struct sess *s, const struct proto_kv_prep_seq *q,
                        uint32_t max_dev)
{
    size_t reused = 0;
    int rc;
    s->reused = 0;
    if ((q->flags & PROTO_KV_NEW) && q->n_tokens > 1) {
        size_t B = (size_t)k->c.block_size, cand = (q->n_tokens - 1) / B * B;
        if (cand) {
            /* shares full blocks before the last position it is given: one past the
             * candidate blocks. Only what was found is held; the rest is computed and
             * appended as the steps reach it (opening every block of a prompt longer than the
             * device's room failed, and the request waited for good) */
            rc = kvb_session_open_shared(k->kvb, s->sid, s->gpu, q->scope,
                                         (const uint32_t *)q->tokens, cand + 1, &reused);
            if (rc)
                return rc;
            s->open = 1;
            s->reused = (uint32_t)reused;
            if (reused)
                log_debug("session %llu: %zu positions found in shared blocks",
                          (unsigned long long)s->sid, reused);
            return 0;
        }
    }
    /* positions only; a window session's older blocks go straight to the host */
    rc = kvb_session_open(k->kvb, s->sid, s->gpu, q->scope, NULL, s->want_pos, max_dev, &reused);
    if (!rc)
        s->open = 1;
    return rc;
}

/* n more positions for s (tok: their ids, or NULL when not known) */
static int grow(struct kvmgr *k, struct sess *s, const uint32_t *tok, size_t n)
{
    int rc = kvb_session_append(k->kvb, s->sid, tok, n);
    if (rc == RKV_ENOSPACE) {
        /* the device pool is short right now: re-plan (relief) and retry once */
        k->dirty = 1;
        replan(k, "session grew");
        rc = kvb_session_append(k->kvb, s->sid, tok, n);
    }
    return rc;
}

/* s's kv is gone or untrustworthy: kvmgr forgets it, and RKV_ESTALE tells rkvd to prefill
 * its whole token history again (full blocks of it that other sessions published are shared) */
static int forget_session(struct kvmgr *k, struct sess *s, const char *why)
{
    log_info("session %llu: %s: rebuilt from its token history", (unsigned long long)s->sid, why);
    if (s->open)
        kvb_session_close(k->kvb, s->sid);
    s->open = 0;
    s->placed = 0;
    s->reused = 0;
    k->dirty = 1;
    return RKV_ESTALE;
}

/* brings one session's blocks to want_pos positions within its plan */
static int place(struct kvmgr *k, struct sess *s, const struct proto_kv_prep_seq *q)
{
    const struct plan_assign *a = k->plan ? plan_find(k->plan, s->sid) : NULL;
    /* a rotated session waits for its turn: rkvd keeps its request open and retries */
    if (!a || a->tactic == PLAN_WAIT || a->tactic == PLAN_PARKED || a->tactic == PLAN_ROTATED)
        return RKV_ENOSPACE;
    int rc;
    /* a rotation holder runs once its blocks are all back on the device (they come in as the
     * workers release the last holder's): its steps then read only device blocks, in the
     * all-resident order, and never stream a tail over the link */
    uint32_t n_dev = 0, n_host = 0;
    if (s->rot_back && s->open && a->tactic == PLAN_RESIDENT &&
        kvb_session_counts(k->kvb, s->sid, &n_dev, &n_host) == 0 && n_host > 0) {
        k->dirty = 1;
        return RKV_ENOSPACE;
    }
    s->rot_back = 0;
    /* written positions of a session kvmgr no longer holds (the plan dropped its kv: no room
     * on the device or the host): fresh blocks would read as its kv, garbage or another
     * session's */
    if (!s->open && !(q->flags & PROTO_KV_NEW) && q->n_written > 0)
        return forget_session(k, s, "its kv was dropped for room");
    if (!s->open) {
        uint32_t max_dev = a->tactic == PLAN_RESIDENT ? KVB_NONE : (a->n_dev ? a->n_dev : 1);
        if ((rc = open_session(k, s, q, max_dev)))
            return rc;
    }
    /* a session found in shared blocks holds at least those positions */
    if (s->want_pos < s->reused && (q->flags & PROTO_KV_NEW))
        s->want_pos = s->reused;
    size_t held = kvb_session_tokens(k->kvb, s->sid);
    size_t first, end = token_span(q, &first);
    const uint32_t *tok = (const uint32_t *)q->tokens;
    /* positions from n_written on are written by this step. a new turn of a named session
     * rewrites its last prompt position, inside a full block that WINDOW may have moved to
     * the host or another session may share: cut back to n_written, so the kept partial
     * block becomes a private device block (copy-on-write), then grow to want_pos. A step
     * prepared ahead never cuts: past n_written is the step still running */
    if (!(q->flags & PROTO_KV_AHEAD)) {
        size_t cut = s->want_pos;
        if (!(q->flags & PROTO_KV_NEW) && q->n_written < held && q->n_written < cut)
            cut = q->n_written;
        if (cut < held) {
            struct kvb_copy cow[KVB_MAX_PARTS];
            size_t n_cow = 0;
            rc = kvb_session_truncate(k->kvb, s->sid, cut, cow, &n_cow);
            if (rc == RKV_ESTALE) {
                /* cut back past its live window: the local layers' kv for the kept positions
                 * is gone */
                char why[96];
                snprintf(why, sizeof why, "cut back to %zu positions, before its live window", cut);
                return forget_session(k, s, why);
            }
            if (rc)
                return rc;
            /* kvmgr does not know the worker's layout inside a block (positions
             * are not outermost), so a copy-on-write moves the whole block */
            for (size_t c = 0; c < n_cow; c++)
                cow[c].n_tokens = (uint32_t)k->c.block_size;
            /* the table already names the private copy: one whose bytes did not arrive is
             * not its kv */
            if (n_cow && (rc = kvpool_run_copies(k->dev, k->n_gpus, k->host, cow, n_cow))) {
                char why[96];
                snprintf(why, sizeof why, "copying its shared last block failed (%s)",
                         rkv_strerror(rc));
                return forget_session(k, s, why);
            }
            held = cut;
        }
    }
    /* ids of positions it holds that were appended without them (by a step prepared
     * ahead, or a step's later decode steps): known now, and the full blocks among the
     * written ones shareable. a new session's ids came with open_session */
    if (!(q->flags & PROTO_KV_NEW) && first < end) {
        kvb_session_know(k->kvb, s->sid, first, tok, end - first);
        kvb_session_written(k->kvb, s->sid, RKV_MIN((size_t)q->n_written, held));
    }
    /* new positions: with the ids q carries, then those owed without */
    if (s->want_pos > held && held >= first && held < end) {
        size_t to = RKV_MIN(end, s->want_pos);
        if ((rc = grow(k, s, tok + (held - first), to - held)))
            return rc;
        held = to;
    }
    return s->want_pos > held ? grow(k, s, NULL, s->want_pos - held) : 0;
}

/* a session kvmgr has not placed yet goes to the gpu where it fits best;
 * extra / extra_run count what this prep placed already (the plan does not) */
static void place_new(struct kvmgr *k, struct sess *s, const struct proto_kv_prep_seq *q,
                      uint32_t w, uint32_t *extra, uint32_t *extra_run)
{
    s->placed = 1;
    uint32_t need = open_blocks(k, RKV_MAX(q->n_pos, (q->flags & PROTO_KV_NEW) ? q->n_tokens : 0));
    uint32_t g = w;
    if (k->n_gpus > 1 && !s->nomove)
        g = plan_pick_gpu(k->plan, need ? need : 1, w, extra, extra_run);
    if (g >= k->n_gpus)
        g = w;
    extra[g] += need;
    extra_run[g]++;
    if (g != w) {
        log_debug("session %llu: placed on gpu %u (offered on %u): it fits better there",
                  (unsigned long long)s->sid, g, w);
        s->gpu = g;
    }
}

/* carries out the planner's move of s to gpu b, at a step boundary of its
 * worker: every position is written and no step of that worker runs, so the
 * copies see all of its kv; the old blocks go when that worker acks */
static int rebalance_move(struct kvmgr *k, struct sess *s, uint32_t b)
{
    uint32_t a = s->gpu, copies = 0, d = 0, h = 0;
    enum plan_tactic from = s->tactic;
    if (s->open) {
        kvb_session_counts(k->kvb, s->sid, &d, &h);
        int rc = mig_rehome(k->kvb, k->dev, k->n_gpus, k->host, s->sid, b, d + h, &copies);
        if (rc) {
            log_debug("session %llu: move to gpu %u waits: %s", (unsigned long long)s->sid, b,
                      rkv_strerror(rc));
            return rc;
        }
    }
    s->gpu = b;
    s->moved_ms = rkv_now_ms();
    s->tactic = s->open ? PLAN_RESIDENT : PLAN_WAIT;
    k->dirty = 1;
    k->moved_bytes += (uint64_t)copies * k->block_bytes;
    log_info("session %llu moved from gpu %u to gpu %u (rebalance: %s on gpu %u, room on gpu "
             "%u; %u blocks, %u copied through the host pool)",
             (unsigned long long)s->sid, a, b, plan_tactic_name(from), a, b, d + h, copies);
    if (s->open) {
        struct proto_tactic_event ev = {0};
        ev.session_id = s->sid;
        ev.from = tactic_to_proto(from);
        ev.to = PROTO_TACTIC_RESIDENT;
        snprintf(ev.reason, sizeof ev.reason, "%s: moved from gpu %u to gpu %u",
                 plan_reason_name(PLAN_WHY_REBALANCE), a, b);
        ev.bytes_moved = (uint64_t)copies * k->block_bytes;
        ev.ts_ms = rkv_wall_ms();
        ev.gpu = b;
        publish_tactic(k, &ev);
    }
    return 0;
}

static int do_prep(struct kvmgr *k, const struct proto_in *in, struct proto_wbuf *reply,
                   int *reply_type, char *err, size_t errlen)
{
    if (!k->kvb)
        return proto_seterr(err, errlen, RKV_ESTATE,
                            "kvmgr has no pools yet: no worker has said hello");
    struct proto_kv_prep *m;
    int rc = proto_kv_prep_decode(in->payload, in->len, &m, err, errlen);
    if (rc)
        return rc;
    if (m->worker_id >= k->n_gpus) {
        proto_kv_prep_destroy(m);
        return proto_seterr(err, errlen, RKV_EINVAL, "kv_prep: worker %u, kvmgr has %u",
                            m->worker_id, k->n_gpus);
    }
    uint32_t w = m->worker_id;
    if (m->ack_epoch)
        kvb_ack_worker(k->kvb, w, m->ack_epoch);
    for (uint32_t i = 0; i < m->n_close; i++)
        sess_drop(k, m->close[i]);
    uint64_t now = rkv_now_ms();
    for (uint32_t i = 0; i < m->n_idle; i++) {
        struct sess *s = rkv_map_get(&k->sess, m->idle[i]);
        if (s && s->open) /* its last step is done: every position is written */
            kvb_session_written(k->kvb, s->sid, kvb_session_tokens(k->kvb, s->sid));
        if (s && s->active) {
            s->active = 0;
            k->dirty = 1;
        }
    }
    uint32_t extra[KVMGR_MAX_GPUS] = {0}, extra_run[KVMGR_MAX_GPUS] = {0};
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        struct sess *s = sess_get(k, m->seqs[i].session_id, w);
        if (!s) {
            proto_kv_prep_destroy(m);
            return RKV_ENOMEM;
        }
        s->nomove = (m->seqs[i].flags & PROTO_KV_NOMOVE) != 0;
        if (!s->placed && !s->open)
            place_new(k, s, &m->seqs[i], w, extra, extra_run);
        if (s->gpu != w)
            continue; /* answered "moved": its steps come from that gpu's worker */
        if (!s->active || s->want_pos != m->seqs[i].n_pos)
            k->dirty |= blocks_for(k, s->want_pos) != blocks_for(k, m->seqs[i].n_pos) || !s->active;
        /* what earlier steps wrote (this worker's previous step is done): such
         * blocks may move and, when full, be shared; the rest is being written */
        if (s->open && m->seqs[i].n_written)
            kvb_session_written(
                k->kvb, s->sid,
                RKV_MIN((size_t)m->seqs[i].n_written, kvb_session_tokens(k->kvb, s->sid)));
        s->want_pos = m->seqs[i].n_pos;
        s->active = 1;
        s->pinned = (m->seqs[i].flags & PROTO_KV_PINNED) != 0;
        s->last_use = now;
    }
    if (k->turn_end_ms && now >= k->turn_end_ms)
        k->dirty = 1; /* a rotation turn is over: the next holders come in at this step */
    if (k->dirty)
        replan(k, "sessions changed");

    struct proto_kv_table *tabs = calloc(m->n_seqs ? m->n_seqs : 1, sizeof *tabs);
    struct rkv_vec refs;
    rkv_vec_init(&refs, sizeof(struct proto_block_ref));
    struct rkv_vec ents;
    rkv_vec_init(&ents, sizeof(struct kvb_entry));
    size_t *offs = calloc(m->n_seqs ? m->n_seqs : 1, sizeof *offs);
    if (!tabs || !offs) {
        free(tabs);
        free(offs);
        proto_kv_prep_destroy(m);
        return RKV_ENOMEM;
    }
    uint64_t epoch = 0;
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        struct sess *s = rkv_map_get(&k->sess, m->seqs[i].session_id);
        struct proto_kv_table *t = &tabs[i];
        t->session_id = s->sid;
        t->tactic = (uint8_t)tactic_to_proto(s->tactic);
        offs[i] = refs.len;
        const struct plan_assign *pa = k->plan ? plan_find(k->plan, s->sid) : NULL;
        if (s->gpu == w && pa && pa->move_to < k->n_gpus && pa->move_to != w && !s->nomove)
            rebalance_move(k, s, pa->move_to);
        if (s->gpu != w) {
            t->status = PROTO_KV_MOVED(s->gpu);
            continue;
        }
        rc = place(k, s, &m->seqs[i]);
        if (rc) {
            const struct plan_assign *a = k->plan ? plan_find(k->plan, s->sid) : NULL;
            log_debug("session %llu: cannot place %u positions (holds %zu, %u written, flags "
                      "0x%x, %u owed) (%s); plan %s dev %u host %u, free dev %u host %u, %zu "
                      "blocks wait for acks",
                      (unsigned long long)s->sid, s->want_pos,
                      s->open ? kvb_session_tokens(k->kvb, s->sid) : 0, m->seqs[i].n_written,
                      m->seqs[i].flags, m->seqs[i].n_owed, rkv_strerror(rc),
                      a ? plan_tactic_name(a->tactic) : "none", a ? a->n_dev : 0, a ? a->n_host : 0,
                      kvb_free_dev(k->kvb, s->gpu), kvb_free_host(k->kvb), kvb_pending(k->kvb));
            t->status = rc == RKV_ENOSPACE ? RKV_ENOSPACE : rc;
            continue;
        }
        /* local parts no window reads any more go back to the pools (as the workers ack) */
        uint32_t n_dropped = 0;
        if (k->n_parts > 1 &&
            kvb_session_drop_local(k->kvb, s->sid, window_keep(k, m->seqs[i].n_written),
                                   &n_dropped) == 0 &&
            n_dropped)
            k->dirty = 1;
        size_t n = 0;
        uint64_t sepoch = 0;
        kvb_session_table(k->kvb, s->sid, NULL, 0, &n, &sepoch);
        if (rkv_vec_reserve(&ents, n) || rkv_vec_reserve(&refs, refs.len + n)) {
            t->status = RKV_ENOMEM;
            continue;
        }
        kvb_session_table(k->kvb, s->sid, ents.data, n, &n, &sepoch);
        for (size_t b = 0; b < n; b++) {
            struct kvb_entry e = ((struct kvb_entry *)ents.data)[b];
            struct proto_block_ref r;
            if (e.dev != KVB_NONE) {
                r.index = e.dev;
                r.residency = e.host != KVB_NONE ? PROTO_RES_BOTH : PROTO_RES_DEVICE;
            } else if (e.host == KVB_NONE) {
                r.index = KVB_NONE; /* a dropped local part: the worker's KV_REF_NONE */
                r.residency = PROTO_RES_DEVICE;
            } else {
                r.index = e.host;
                r.residency = PROTO_RES_HOST;
            }
            rkv_vec_push(&refs, &r);
        }
        t->n_blocks = (uint32_t)n;
        /* a step that names the session as new learns what was shared, also
         * when it is a retry of a step that opened it */
        if (m->seqs[i].flags & PROTO_KV_NEW)
            t->n_cached = s->reused;
        kvb_lease(k->kvb, w, s->sid, sepoch);
    }
    /* acking this epoch later releases everything older, also when no
     * sequence of the step could be placed (or there were none) */
    epoch = kvb_epoch(k->kvb);
    for (uint32_t i = 0; i < m->n_seqs; i++)
        tabs[i].blocks = (struct proto_block_ref *)refs.data + offs[i];
    struct proto_kv_tables out = {epoch, (uint32_t)getpid(), m->n_seqs, tabs};
    rc = proto_kv_tables_encode(&out, reply, err, errlen);
    *reply_type = PROTO_MSG_KV_TABLES;
    free(tabs);
    free(offs);
    rkv_vec_fini(&refs);
    rkv_vec_fini(&ents);
    proto_kv_prep_destroy(m);
    return rc;
}

/* --- control messages ----------------------------------------------------------------- */

static int do_hello(struct kvmgr *k, const struct proto_in *in, struct proto_wbuf *reply,
                    int *reply_type, char *err, size_t errlen)
{
    struct proto_hello h;
    int rc = proto_json_decode(PROTO_MSG_HELLO, in->payload, in->len, &h, err, errlen);
    if (rc)
        return rc;
    struct proto_hello_ack ack = {0};
    ack.accepted = true;
    ack.kvmgr_pid = (uint32_t)getpid();
    ack.block_size = (uint32_t)k->c.block_size;
    if (h.role == PROTO_ROLE_WORKER) {
        if (h.worker_id >= (uint32_t)k->c.workers)
            return proto_seterr(err, errlen, RKV_EINVAL,
                                "worker %u: kvmgr was started for %lld worker(s)", h.worker_id,
                                (long long)k->c.workers);
        if (!h.block_bytes)
            return proto_seterr(err, errlen, RKV_EINVAL, "hello: a worker must send block_bytes");
        if (!k->kvb && k->making) {
            /* a worker retries its hello until the pools exist */
            int prc = pools_collect(k);
            if (prc == 0)
                return proto_seterr(err, errlen, RKV_EBUSY,
                                    "kvmgr is still creating its pools (%.0f s so far); retry",
                                    (rkv_now_ms() - k->make_started_ms) / 1000.0);
            if (prc < 0)
                return proto_seterr(err, errlen, prc, "kvmgr cannot create its pools: %s",
                                    rkv_strerror(prc));
        }
        if (!k->kvb) {
            /* cuda pools when asked, or on auto when the worker runs on a gpu */
            k->cuda = k->c.backend == 2 || (k->c.backend == 0 && h.gpu >= 0 && rkv_gpu_count() > 0);
            if (k->cuda && rkv_gpu_count() < 0)
                return proto_seterr(err, errlen, RKV_ENODEV,
                                    "kvmgr cannot create cuda pools: %s; or run with --backend cpu",
                                    rkv_gpu_why());
            /* every worker runs the same model; cpu pools are RAM, not vram */
            for (uint32_t g = 0; g < (uint32_t)k->c.workers; g++) {
                k->gpu[g].weights_bytes = k->cuda ? h.weights_bytes : 0;
                /* measured by the worker on its model (reserve_of prefers the config) */
                if (k->cuda && h.compute_reserve_bytes)
                    k->gpu[g].reserve_bytes = h.compute_reserve_bytes;
                /* what the gpu holds besides kv: the slab and every later plan count it */
                size_t fr = 0, tot = 0;
                if (k->cuda && rkv_gpu_mem_info(g, &fr, &tot) == 0 && tot > fr) {
                    k->gpu[g].fixed_bytes = tot - fr;
                    k->gpu[g].free_bytes = fr;
                }
            }
            k->make_bytes = h.block_bytes;
            k->kv_dtype = h.kv_dtype;
            k->n_parts = h.n_parts > 1 ? h.n_parts : 1;
            k->n_swa = h.n_parts > 1 ? h.n_swa : 0;
            k->make_started_ms = rkv_now_ms();
            if (k->cuda) {
                /* cudaMalloc of the slab and pinning the host pool take seconds: a thread
                 * makes them while this loop keeps answering (rkvd's watchdog, other
                 * workers); this worker's hello is answered "busy" until they exist */
                atomic_store(&k->made, 0);
                if ((rc = pthread_create(&k->maker, NULL, pool_maker, k)))
                    return proto_seterr(err, errlen, -rc, "kvmgr cannot start a thread: %s",
                                        strerror(rc));
                k->making = 1;
                return proto_seterr(err, errlen, RKV_EBUSY, "kvmgr is creating its pools; retry");
            }
            char why[256];
            if ((rc = create_pools(k, h.block_bytes, &k->np, why, sizeof why))) {
                pools_failed(k, rc, why);
                return proto_seterr(err, errlen, rc, "%s", k->pools_error);
            }
            pools_install(k);
        } else if (h.block_bytes != k->block_bytes || h.kv_dtype != k->kv_dtype) {
            return proto_seterr(
                err, errlen, RKV_EINVAL,
                "worker %u needs %llu-byte %s blocks but kvmgr's pools hold %llu "
                "bytes of %s: every worker must run the same model and kv_dtype",
                h.worker_id, (unsigned long long)h.block_bytes, proto_kv_dtype_names[h.kv_dtype],
                (unsigned long long)k->block_bytes, proto_kv_dtype_names[k->kv_dtype]);
        } else if ((h.n_parts > 1 ? h.n_parts : 1) != k->n_parts ||
                   (h.n_parts > 1 ? h.n_swa : 0) != k->n_swa) {
            return proto_seterr(err, errlen, RKV_EINVAL,
                                "worker %u splits a position block into %u parts (window %u) "
                                "but kvmgr's tables have %u (window %u): every worker must run "
                                "the same model and swa_kv",
                                h.worker_id, h.n_parts > 1 ? h.n_parts : 1, h.n_swa, k->n_parts,
                                k->n_swa);
        }
        if (k->cuda && h.gpu != (int64_t)h.worker_id)
            return proto_seterr(err, errlen, RKV_EINVAL,
                                "worker %u runs on %s but kvmgr's device pool %u is on gpu %u: "
                                "start worker N with --gpu N and the same --backend as kvmgr",
                                h.worker_id, h.gpu < 0 ? "the cpu" : "another gpu", h.worker_id,
                                h.worker_id);
        struct gpu_state *g = &k->gpu[h.worker_id];
        if (g->worker_pid && g->worker_pid != h.pid) {
            /* a restarted worker: the old one's leases must not hold blocks */
            kvb_worker_lost(k->kvb, h.worker_id);
            log_info("worker %u is back (pid %u, was %u): its sessions keep their KV", h.worker_id,
                     h.pid, g->worker_pid);
        }
        g->worker_pid = h.pid;
        const struct kvpool_desc *dd = kvpool_get_desc(k->dev[h.worker_id]);
        const struct kvpool_desc *hd = kvpool_get_desc(k->host);
        if (dd->kind == KVPOOL_DEVICE_CUDA) {
            char hex[RKV_GPU_HEX_LEN + 1];
            rkv_gpu_handle_hex(dd->ipc_handle, hex);
            snprintf(ack.device_pool_url, sizeof ack.device_pool_url, "cudaipc:%s", hex);
        } else {
            snprintf(ack.device_pool_url, sizeof ack.device_pool_url, "shm:%s", dd->name);
        }
        snprintf(ack.host_pool_name, sizeof ack.host_pool_name, "%s", hd->name);
        ack.n_device_blocks = dd->n_blocks;
        ack.n_host_blocks = hd->n_blocks;
    }
    ack.block_bytes = k->block_bytes;
    *reply_type = PROTO_MSG_HELLO_ACK;
    return proto_put_json(reply, PROTO_MSG_HELLO_ACK, &ack, err, errlen);
}

static void fill_status(struct kvmgr *k, struct proto_status *st)
{
    memset(st, 0, sizeof *st);
    st->kvmgr_pid = (uint32_t)getpid();
    st->uptime_ms = rkv_now_ms() - k->started_ms;
    st->n_sessions = k->sess.len;
    st->mode = k->c.mode;
    st->proto_version = PROTO_VERSION;
    snprintf(st->build, sizeof st->build, "rkv-kvmgr");
    st->event_seq = evring_last_seq(k->events);
    snprintf(st->pools_error, sizeof st->pools_error, "%s", k->pools_error);
    st->kv_dtype = k->kv_dtype;
    if (k->kvb) {
        st->block_bytes = k->block_bytes;
        st->n_parts = k->n_parts ? k->n_parts : 1;
        for (uint32_t g = 0; g < k->n_gpus; g++) {
            uint64_t tot = (uint64_t)kvpool_get_desc(k->dev[g])->n_blocks * k->block_bytes;
            st->device_total += tot;
            st->device_used += tot - (uint64_t)kvb_free_dev(k->kvb, g) * k->block_bytes;
        }
        st->host_total = (uint64_t)kvpool_get_desc(k->host)->n_blocks * k->block_bytes;
        st->host_used = st->host_total - (uint64_t)kvb_free_host(k->kvb) * k->block_bytes;
    }
    /* only workers that said hello: a pid of 0 fails the STATUS schema, and
     * rkvd would take kvmgr for dead until every worker is up */
    for (uint32_t g = 0; g < (uint32_t)k->c.workers && g < PROTO_MAX_WORKERS; g++)
        if (k->gpu[g].worker_pid)
            st->worker_pids[st->n_worker_pids++] = k->gpu[g].worker_pid;
}

static int handle(void *ctx, const struct proto_in *in, struct proto_wbuf *reply, int *reply_type,
                  char *err, size_t errlen)
{
    struct kvmgr *k = ctx;
    int rc;
    switch (in->hdr.type) {
    case PROTO_MSG_KV_PREP: return do_prep(k, in, reply, reply_type, err, errlen);
    case PROTO_MSG_HELLO: return do_hello(k, in, reply, reply_type, err, errlen);
    case PROTO_MSG_STATUS_GET: {
        struct proto_status st;
        fill_status(k, &st);
        *reply_type = PROTO_MSG_STATUS;
        return proto_put_json(reply, PROTO_MSG_STATUS, &st, err, errlen);
    }
    case PROTO_MSG_EVENTS_GET: {
        struct proto_events_get q;
        if ((rc = proto_json_decode(in->hdr.type, in->payload, in->len, &q, err, errlen)))
            return rc;
        struct proto_events *ev = calloc(1, sizeof *ev); /* 50 KiB: not on the stack */
        if (!ev)
            return proto_seterr(err, errlen, RKV_ENOMEM, "events_get: out of memory");
        evring_fill(k->events, q.since, ev);
        ev->kvmgr_pid = (uint32_t)getpid();
        *reply_type = PROTO_MSG_EVENTS;
        rc = proto_put_json(reply, PROTO_MSG_EVENTS, ev, err, errlen);
        free(ev);
        return rc;
    }
    case PROTO_MSG_WORKER_REPORT: {
        struct proto_worker_report r;
        if ((rc = proto_json_decode(in->hdr.type, in->payload, in->len, &r, err, errlen)))
            return rc;
        if (r.worker_id >= (uint32_t)k->c.workers)
            return proto_seterr(err, errlen, RKV_EINVAL, "worker_report: no worker %u",
                                r.worker_id);
        struct gpu_state *g = &k->gpu[r.worker_id];
        g->reserve_bytes = r.compute_reserve_bytes;
        g->pcie_gbps = r.pcie_h2d_gbps;
        g->dev_attn_gbps = r.attn_device_gbps;
        g->host_attn_gbps = r.attn_host_gbps;
        g->cpu_attn_gbps = r.attn_cpu_gbps;
        g->split_gbps = r.split_gbps;
        k->dirty = 1;
        *reply_type = PROTO_MSG_OK;
        struct proto_empty ok = {0};
        return proto_put_json(reply, PROTO_MSG_OK, &ok, err, errlen);
    }
    case PROTO_MSG_BUDGET_SET:
    case PROTO_MSG_BUDGET_GET: {
        struct proto_budget b;
        if (in->hdr.type == PROTO_MSG_BUDGET_SET) {
            if ((rc = proto_json_decode(in->hdr.type, in->payload, in->len, &b, err, errlen)))
                return rc;
            if (b.vram_target_bytes)
                k->c.vram_target = b.vram_target_bytes;
            if (b.host_budget_bytes)
                k->c.host_budget = b.host_budget_bytes;
            k->c.compute_reserve = b.compute_reserve_bytes;
            char v[32], h[32];
            cfg_format_size(k->c.vram_target, v, sizeof v);
            cfg_format_size(k->c.host_budget, h, sizeof h);
            log_info("budget set: vram target %s, host %s", v, h);
            k->dirty = 1;
            replan(k, "budget changed");
            /* rkvd answers rkvctl with the histogram of this plan: it goes now, not at the
             * next second's tick */
            publish_histogram(k);
        }
        b = (struct proto_budget){k->c.vram_target, k->c.host_budget, k->c.compute_reserve, -1,
                                  k->plan_seq};
        *reply_type = PROTO_MSG_BUDGET;
        return proto_put_json(reply, PROTO_MSG_BUDGET, &b, err, errlen);
    }
    case PROTO_MSG_MODE_SET:
    case PROTO_MSG_MODE_GET: {
        struct proto_mode_msg mm;
        if (in->hdr.type == PROTO_MSG_MODE_SET) {
            if ((rc = proto_json_decode(in->hdr.type, in->payload, in->len, &mm, err, errlen)))
                return rc;
            k->c.mode = mm.mode;
            log_info("mode set: %s", proto_mode_names[k->c.mode]);
            k->dirty = 1;
            replan(k, "mode changed");
        }
        mm.mode = k->c.mode;
        *reply_type = PROTO_MSG_MODE;
        return proto_put_json(reply, PROTO_MSG_MODE, &mm, err, errlen);
    }
    case PROTO_MSG_SESSION_CLOSE: {
        struct proto_session_close c;
        if ((rc = proto_json_decode(in->hdr.type, in->payload, in->len, &c, err, errlen)))
            return rc;
        sess_drop(k, c.session_id);
        *reply_type = PROTO_MSG_OK;
        struct proto_empty ok = {0};
        return proto_put_json(reply, PROTO_MSG_OK, &ok, err, errlen);
    }
    default:
        return proto_seterr(err, errlen, RKV_EPROTO, "rkv-kvmgr does not serve %s messages",
                            proto_msg_name(in->hdr.type));
    }
}

/* --- lifecycle ------------------------------------------------------------------- */

int kvmgr_create(const struct kvmgr_conf *c, struct kvmgr **out, char *err, size_t errlen)
{
    *out = NULL;
    struct kvmgr *k = calloc(1, sizeof *k);
    if (!k)
        return proto_seterr(err, errlen, RKV_ENOMEM, "out of memory");
    k->c = *c;
    k->started_ms = rkv_now_ms();
    rkv_map_init(&k->sess);
    proto_wbuf_init(&k->buf);
    int rc;
    if ((rc = evring_create(KVMGR_EVENT_RING, &k->events))) {
        snprintf(err, errlen, "cannot keep %d tactic events: %s", KVMGR_EVENT_RING,
                 rkv_strerror(rc));
        kvmgr_destroy(k);
        return rc;
    }
    if ((rc = proto_sock_open(&k->rep, PROTO_SOCK_REP, k->c.listen, err, errlen)) ||
        (rc = proto_sock_open(&k->pub, PROTO_SOCK_PUB, k->c.pub, err, errlen))) {
        kvmgr_destroy(k);
        return rc;
    }
    kvpool_reap_stale(NULL);
    *out = k;
    return 0;
}

void kvmgr_destroy(struct kvmgr *k)
{
    if (!k)
        return;
    size_t it = 0;
    void *v;
    while (rkv_map_next(&k->sess, &it, NULL, &v))
        free(v);
    rkv_map_fini(&k->sess);
    plan_destroy(k->plan);
    if (k->making) {
        /* a maker still at work: its pools are freed once it is done */
        pthread_join(k->maker, NULL);
        if (k->made_rc == 0)
            pools_fini(&k->np);
    }
    kvb_destroy(k->kvb);
    for (uint32_t g = 0; g < k->n_gpus; g++)
        kvpool_destroy(k->dev[g]);
    kvpool_destroy(k->host);
    proto_wbuf_fini(&k->buf);
    evring_destroy(k->events);
    proto_sock_close(k->pub);
    proto_sock_close(k->rep);
    free(k);
}

int kvmgr_serve(struct kvmgr *k, int timeout_ms, char *err, size_t errlen)
{
    return proto_serve_one(k->rep, handle, k, timeout_ms, err, errlen);
}

void kvmgr_tick(struct kvmgr *k, uint64_t now_ms)
{
    if (k->making)
        pools_collect(k);
    if (k->grace_end_ms && now_ms >= k->grace_end_ms)
        k->dirty = 1; /* an idle session's grace is over */
    if (k->turn_end_ms && now_ms >= k->turn_end_ms)
        k->dirty = 1; /* a rotation turn is over */
    if (k->dirty)
        replan(k, "periodic");
    if (now_ms - k->last_hist_ms >= 1000) {
        k->last_hist_ms = now_ms;
        publish_tails(k);
        publish_histogram(k);
    }
    proto_sock_heal(k->pub);
}
