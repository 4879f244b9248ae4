/* plan.c - the tactic planner (see plan.h for the algorithm). */
#include "kvmgr/plan.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hosttail.h"
#include "common/log.h"
#include "common/util.h"

struct plan {
    size_t n;
    struct plan_assign *assign; /* [n], input order */
    uint32_t *by_id;            /* [n] indices sorted by id, for plan_find */
    enum plan_mode mode;
    struct plan_summary sum;
    struct plan_gpu_summary *gsum; /* [n_gpus] */
};

/* a session's role while planning */
enum role {
    ROLE_IDLE = 0, /* unpinned, idle: stored on device or parked */
    ROLE_RUN,      /* admitted: pinned or active */
    ROLE_WAIT,     /* wanted to run, not admitted; held blocks on the host */
    ROLE_DROP,     /* kv dropped */
};

/* sort record: keys compared in order, then idx */
struct key {
    uint64_t k[4];
    uint32_t idx;
};

static int key_cmp(const void *a, const void *b)
{
    const struct key *x = a, *y = b;
    for (int i = 0; i < 4; i++)
        if (x->k[i] != y->k[i])
            return x->k[i] < y->k[i] ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* scratch shared by the steps of one plan_compute call */
struct work {
    const struct plan_input *in;
    struct plan *out;
    uint8_t *role;      /* [n] enum role */
    uint32_t *need;     /* [n] blocks */
    uint32_t *held;     /* [n] blocks held now */
    uint32_t *dev_cap;  /* [n_gpus] D */
    uint32_t host_cap;  /* H */
    struct key *keys;   /* [n] scratch */
    uint32_t *list;     /* [n] scratch */
    uint64_t *prefix;   /* [n+1] scratch */
    uint32_t *prio;     /* [n] candidates in priority order */
    uint32_t *rank;     /* [n] position in prio (UINT32_MAX for idle) */
    uint8_t *running;   /* [n] admitted before: ranks above new work */
    uint8_t *hyst;      /* [n_gpus] windows kept only by the promotion margin */
    uint8_t *rot;       /* [n] resident for its rotation turn */
    uint8_t *rot_prev;  /* [n_gpus] the previous plan rotated there */
    uint64_t *rot_last; /* [n_gpus] when the previous plans last ended turns there */
    size_t n_prio;
};

uint32_t plan_dev_cap(const struct plan_gpu *g, uint64_t block_bytes)
{
    uint64_t used = g->weights_bytes + g->compute_reserve_bytes;
    if (block_bytes == 0 || g->vram_target <= used)
        return 0;
    uint64_t b = (g->vram_target - used) / block_bytes;
    return b >= PLAN_NO_CAP ? PLAN_NO_CAP - 1 : (uint32_t)b;
}

uint32_t plan_host_cap(uint64_t host_budget, uint64_t block_bytes)
{
    if (block_bytes == 0)
        return 0;
    uint64_t b = host_budget / block_bytes;
    return b >= PLAN_NO_CAP ? PLAN_NO_CAP - 1 : (uint32_t)b;
}

void plan_input_init(struct plan_input *in)
{
    memset(in, 0, sizeof(*in));
    in->mode = PLAN_MODE_AUTO;
    in->margin_pct = 5;
}

static int is_running_tactic(enum plan_tactic t)
{
    return t == PLAN_RESIDENT || t == PLAN_WINDOW || t == PLAN_CPU_TAIL || t == PLAN_ROTATED;
}

static int validate(const struct plan_input *in)
{
    if (in->block_bytes == 0) {
        log_error("plan: block_bytes is 0; set the kv block size");
        return RKV_EINVAL;
    }
    if (in->n_gpus == 0 || !in->gpus) {
        log_error("plan: no gpus given; pass at least one budget");
        return RKV_EINVAL;
    }
    if (in->n_sessions && !in->sessions)
        return RKV_EINVAL;
    if (in->rotation > PLAN_ROT_ALWAYS) {
        log_error("plan: rotation %d unknown; use off|auto|always", (int)in->rotation);
        return RKV_EINVAL;
    }
    if (in->mode > PLAN_MODE_CPU_TAIL) {
        log_error("plan: mode %d unknown; use auto|resident|window|cpu_tail", (int)in->mode);
        return RKV_EINVAL;
    }
    if (in->n_sessions >= UINT32_MAX)
        return RKV_ETOOBIG;
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_session *s = &in->sessions[i];
        if (s->gpu >= in->n_gpus) {
            log_error("plan: session %llu is on gpu %u but only %u gpus have budgets",
                      (unsigned long long)s->id, s->gpu, in->n_gpus);
            return RKV_EINVAL;
        }
        if (s->cur_tactic >= PLAN_N_TACTICS)
            return RKV_EINVAL;
    }
    return 0;
}

static uint64_t cap_usage(const uint32_t *needs, size_t n, uint32_t w);

/* largest cap W >= m with sum(min(need, W)) <= room over the sorted needs
 * (ascending, prefix sums in pre); PLAN_NO_CAP when all fit, 0 when even
 * W = m does not fit. */
static uint32_t max_cap(const uint32_t *needs_sorted, const uint64_t *pre, size_t n, int64_t room,
                        uint32_t m)
{
    if (n == 0 || (room >= 0 && pre[n] <= (uint64_t)room))
        return PLAN_NO_CAP;
    if (room < 0 || cap_usage(needs_sorted, n, m) > (uint64_t)room)
        return 0;
    for (size_t k = 0; k < n; k++) {
        if (pre[k] > (uint64_t)room)
            break;
        uint64_t w = ((uint64_t)room - pre[k]) / (n - k);
        if (w < needs_sorted[k])
            return (uint32_t)w;
    }
    return PLAN_NO_CAP; /* not reached: pre[n] > room */
}

static uint64_t cap_usage(const uint32_t *needs, size_t n, uint32_t w)
{
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++)
        u += needs[i] < w ? needs[i] : w;
    return u;
}

/* host blocks the tails take under cap w once the spare blocks are handed out */
static int64_t tails_at(const uint32_t *needs, size_t n, int64_t r_act, int64_t active, uint32_t w)
{
    int64_t dev = (int64_t)cap_usage(needs, n, w == PLAN_NO_CAP ? w : w + 1);
    return active - (dev < r_act ? dev : r_act);
}

/* --- step 1: admission ------------------------------------------------------- */

struct admit_state {
    int64_t *fixed;     /* [n_gpus] blocks that must be on the device */
    int64_t *tot;       /* [n_gpus] device demand if nothing spilled */
    int64_t spill;      /* sum over gpus of max(0, tot - D) */
    int64_t host_fixed; /* parked idle + waiting sessions' held blocks */
    int64_t *idle_dev;  /* [n_gpus] idle sessions' kv on the device (in tot) */
    int64_t idle_host;  /* idle sessions' kv on the host (in host_fixed) */
};

static int64_t over(int64_t tot, uint32_t cap)
{
    return tot > (int64_t)cap ? tot - (int64_t)cap : 0;
}

static void order_candidates(struct work *w)
{
    const struct plan_input *in = w->in;
    size_t nk = 0;
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_session *s = &in->sessions[i];
        w->rank[i] = UINT32_MAX;
        if (!s->active && !s->pinned)
            continue;
        uint64_t cls = s->pinned ? 0 : w->running[i] ? 1 : 2;
        w->keys[nk++] = (struct key){{cls, s->last_use, s->id}, (uint32_t)i};
    }
    qsort(w->keys, nk, sizeof(*w->keys), key_cmp);
    for (size_t k = 0; k < nk; k++) {
        w->prio[k] = w->keys[k].idx;
        w->rank[w->keys[k].idx] = (uint32_t)k;
    }
    w->n_prio = nk;
}

/* blocks session i must have on the device when admitted */
static int64_t fixed_blocks(const struct work *w, uint32_t i, int resident_mode)
{
    uint32_t m = w->in->min_dev ? w->in->min_dev : 1;
    return (w->in->sessions[i].pinned || resident_mode) ? w->need[i] : RKV_MIN(w->need[i], m);
}

/* too large for its gpu even with nothing else planned: the caller should
 * refuse the request instead of queueing it */
static int never_fits(const struct work *w, uint32_t i, int resident_mode)
{
    uint64_t d = w->dev_cap[w->in->sessions[i].gpu];
    if (w->in->sessions[i].pinned || resident_mode)
        return w->need[i] > d;
    return d == 0 || w->need[i] > d + w->host_cap;
}

static void admit_one(struct work *w, struct admit_state *st, uint32_t i, int resident_mode)
{
    uint32_t g = w->in->sessions[i].gpu;
    int64_t tot2 = st->tot[g] + w->need[i];
    st->spill += over(tot2, w->dev_cap[g]) - over(st->tot[g], w->dev_cap[g]);
    st->tot[g] = tot2;
    st->fixed[g] += fixed_blocks(w, i, resident_mode);
    st->host_fixed -= w->held[i];
    w->role[i] = ROLE_RUN;
}

static int admit(struct work *w)
{
    const struct plan_input *in = w->in;
    struct admit_state st = {0};
    uint8_t *blocked = calloc(in->n_gpus, 1);
    st.fixed = calloc(in->n_gpus, sizeof(int64_t));
    st.tot = calloc(in->n_gpus, sizeof(int64_t));
    st.idle_dev = calloc(in->n_gpus, sizeof(int64_t));
    if (!blocked || !st.fixed || !st.tot || !st.idle_dev) {
        free(blocked), free(st.fixed), free(st.tot), free(st.idle_dev);
        return RKV_ENOMEM;
    }
    /* start: nobody runs; idle kv where it is, candidates' kv on the host */
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_session *s = &in->sessions[i];
        if (w->rank[i] != UINT32_MAX) {
            w->role[i] = ROLE_WAIT;
            st.host_fixed += w->held[i];
        } else {
            w->role[i] = ROLE_IDLE;
            if (s->cur_dev > 0) {
                st.tot[s->gpu] += w->need[i];
                st.idle_dev[s->gpu] += w->need[i];
            } else {
                st.host_fixed += w->need[i];
                st.idle_host += w->need[i];
            }
        }
    }
    for (uint32_t g = 0; g < in->n_gpus; g++)
        st.spill += over(st.tot[g], w->dev_cap[g]);

    /* pinned and running sessions first, in priority order, as long as their
     * gpu has the blocks they must hold on the device; the host is not
     * checked here: moving their kv to the host would not free host blocks */
    int resident_mode = in->mode == PLAN_MODE_RESIDENT;
    size_t n_first = 0;
    while (n_first < w->n_prio &&
           (in->sessions[w->prio[n_first]].pinned || w->running[w->prio[n_first]]))
        n_first++;
    for (size_t k = 0; k < n_first; k++) {
        uint32_t i = w->prio[k];
        uint32_t g = in->sessions[i].gpu;
        if (st.fixed[g] + fixed_blocks(w, i, resident_mode) <= (int64_t)w->dev_cap[g])
            admit_one(w, &st, i, resident_mode);
    }
    /* new work in fifo order; a refusal blocks later new work on that gpu */
    for (size_t k = n_first; k < w->n_prio; k++) {
        uint32_t i = w->prio[k];
        uint32_t g = in->sessions[i].gpu;
        if (blocked[g] || never_fits(w, i, resident_mode))
            continue; /* one that can never run must not hold up the queue */
        int64_t tot2 = st.tot[g] + w->need[i];
        int64_t spill2 = st.spill - over(st.tot[g], w->dev_cap[g]) + over(tot2, w->dev_cap[g]);
        int64_t host_before = st.host_fixed + st.spill;
        int64_t host_after = st.host_fixed - w->held[i] + spill2;
        /* idle kv yields to work: with every idle session's kv dropped (lru first, only as
         * much as placement needs), would it fit? Else an arrival that needs that room waited
         * for as long as the idle sessions lived */
        int64_t spill_no_idle = 0;
        for (uint32_t h = 0; h < in->n_gpus; h++)
            spill_no_idle += over((h == g ? tot2 : st.tot[h]) - st.idle_dev[h], w->dev_cap[h]);
        int64_t host_no_idle = st.host_fixed - st.idle_host - w->held[i] + spill_no_idle;
        int ok = st.fixed[g] + fixed_blocks(w, i, resident_mode) <= (int64_t)w->dev_cap[g] &&
                 (host_after <= (int64_t)w->host_cap || host_after <= host_before ||
                  host_no_idle <= (int64_t)w->host_cap);
        if (!ok) {
            blocked[g] = 1;
            continue;
        }
        admit_one(w, &st, i, resident_mode);
    }

    /* existing kv that does not fit even on the host: drop the waiting
     * sessions' kv lowest priority first, then parked idle sessions, lru first */
    for (size_t k = w->n_prio; k-- > 0 && st.host_fixed + st.spill > (int64_t)w->host_cap;) {
        uint32_t i = w->prio[k];
        if (w->role[i] == ROLE_WAIT && w->held[i] > 0) {
            st.host_fixed -= w->held[i];
            w->role[i] = ROLE_DROP;
        }
    }
    if (st.host_fixed + st.spill > (int64_t)w->host_cap) {
        /* idle sessions' kv, lru first, parked or still on the device (its blocks spill
         * the admitted work's to the host) */
        size_t nk = 0;
        for (size_t i = 0; i < in->n_sessions; i++)
            if (w->role[i] == ROLE_IDLE && w->need[i] > 0)
                w->keys[nk++] =
                    (struct key){{in->sessions[i].last_use, in->sessions[i].id, 0}, (uint32_t)i};
        qsort(w->keys, nk, sizeof(*w->keys), key_cmp);
        for (size_t k = 0; k < nk && st.host_fixed + st.spill > (int64_t)w->host_cap; k++) {
            uint32_t i = w->keys[k].idx;
            const struct plan_session *s = &in->sessions[i];
            if (s->cur_dev > 0) {
                uint32_t g = s->gpu;
                st.spill -=
                    over(st.tot[g], w->dev_cap[g]) - over(st.tot[g] - w->need[i], w->dev_cap[g]);
                st.tot[g] -= w->need[i];
            } else {
                st.host_fixed -= w->need[i];
            }
            w->role[i] = ROLE_DROP;
        }
    }
    free(blocked), free(st.fixed), free(st.tot), free(st.idle_dev);
    return 0;
}

/* --- step 2: placement per gpu ------------------------------------------------ */

static enum plan_tactic spill_tactic(const struct plan_input *in, const struct plan_gpu *g)
{
    if (in->mode == PLAN_MODE_CPU_TAIL)
        return PLAN_CPU_TAIL;
    if (in->mode == PLAN_MODE_WINDOW)
        return PLAN_WINDOW;
    /* the worker applies the same rule to the same rates (its --host-attn auto) */
    return hosttail_cpu_faster(g->pcie_h2d_gbps, g->host_stream_gbps, g->cpu_attn_gbps,
                               g->split_gbps)
               ? PLAN_CPU_TAIL
               : PLAN_WINDOW;
}

static void set_assign(struct work *w, uint32_t i, enum plan_tactic t, uint32_t dev, uint32_t host)
{
    struct plan_assign *a = &w->out->assign[i];
    a->tactic = t;
    a->n_dev = dev;
    a->n_host = host;
}

/* an idle session used within the grace: windowed with the active ones, not parked (not in
 * resident mode, which windows no one) */
static int in_grace(const struct plan_input *in, const struct plan_session *s)
{
    return in->idle_grace && in->mode != PLAN_MODE_RESIDENT && !s->pinned &&
           s->last_use <= in->now && in->now - s->last_use < in->idle_grace;
}

/* parks idle sessions of the list (lru order) until the active and the idle
 * device blocks fit room (all of them with park_all), skipping any the host
 * cannot take; returns the device blocks idle sessions still hold */
static int64_t park_idle(struct work *w, const uint32_t *idle, size_t n_idle, int64_t room,
                         int64_t active, int park_all, int64_t *host_avail)
{
    int64_t idev = 0;
    for (size_t k = 0; k < n_idle; k++)
        if (w->out->assign[idle[k]].tactic == PLAN_RESIDENT)
            idev += w->need[idle[k]];
    for (size_t k = 0; k < n_idle && idev > 0; k++) {
        uint32_t i = idle[k];
        if (!park_all && active + idev <= room)
            break;
        if (w->out->assign[i].tactic != PLAN_RESIDENT || w->need[i] > *host_avail)
            continue;
        set_assign(w, i, PLAN_PARKED, 0, w->need[i]);
        *host_avail -= w->need[i];
        idev -= w->need[i];
    }
    return idev;
}

/* --- rotation ----------------------------------------------------------------- */

static double dev_rate(const struct plan_gpu *g)
{
    return g->dev_attn_gbps > 0 ? g->dev_attn_gbps : 1000.0;
}

/* GB/s at which a turn's blocks move between the pools: the link, or on the cpu backend (no
 * link) what a memcpy out of the host pool moves */
static double swap_rate(const struct plan_gpu *g)
{
    return g->pcie_h2d_gbps > 0      ? g->pcie_h2d_gbps
           : g->host_stream_gbps > 0 ? g->host_stream_gbps
                                     : 1.0;
}

static double tail_rate(const struct plan_input *in, const struct plan_gpu *g);

/* the rotation of gpu g's active sessions act[n_act] through `room` device blocks (see plan.h):
 * 1 when it assigned them, 0 when they should spill instead */
static int rotate_gpu(struct work *w, uint32_t g, const uint32_t *act, size_t n_act, int64_t room,
                      int64_t *host_avail)
{
    const struct plan_input *in = w->in;
    const struct plan_gpu *gp = &in->gpus[g];
    if (in->rotation == PLAN_ROT_OFF || in->mode != PLAN_MODE_AUTO || room <= 0)
        return 0;
    /* act holds the active sessions and the idle ones in their grace (on the device, a next
     * request expected soon): those take part as holders, and wait parked, not rotated */
    size_t n = 0;
    uint64_t total = 0;
    for (size_t k = 0; k < n_act; k++) {
        uint32_t i = act[k];
        if (w->need[i] > room)
            return 0; /* one too long to fit alone streams its tail: WINDOW */
        /* the rate model weighs the active ones: the others make no tokens */
        n += in->sessions[i].active;
        total += in->sessions[i].active ? w->need[i] : 0;
    }
    if (n < 2 || total <= (uint64_t)room)
        return 0;

    /* the rate model (units: seconds and GB) */
    double gb = (double)in->block_bytes / 1e9,
           tick = 1.0 / (in->ticks_per_s ? in->ticks_per_s : 1000);
    double weights = (double)gp->weights_bytes / 1e9 / dev_rate(gp);
    uint64_t k = (uint64_t)((double)room * (double)n / (double)total);
    k = k < 1 ? 1 : k > n - 1 ? n - 1 : k;
    /* a place's turnover: one session of average size copied out and the next one in; the
     * other holders decode meanwhile (turns end a few places at a time, below) */
    double swap = 2.0 * (double)total / (double)n * gb / swap_rate(gp);
    double step_rot = weights + (double)room * gb / dev_rate(gp);
    double step_spill = step_rot + (double)(total - (uint64_t)room) * gb / tail_rate(in, gp);
    uint64_t waits = (n - k + k - 1) / k;
    double stall =
        (double)(in->max_stall ? in->max_stall : (in->ticks_per_s ? in->ticks_per_s : 1000)) * tick;
    /* a fifth of the budget is kept for what delays a turn change: the tick that notices the
     * end, the step in flight, the waiting session's first step. Turns end a quarter of the
     * places at a time (below): turns that end together stay up to most of a quantum more,
     * and the queue behind them waits that long too */
    uint64_t per = (k + 3) / 4;
    double quantum = (0.8 * stall - swap) / (double)(waits + 1);
    int meets = quantum >= step_rot;
    if (!meets)
        quantum = step_rot;
    if (quantum < tick)
        quantum = tick;
    double rot = (double)k / step_rot * quantum / (quantum + swap);
    double spill = (double)n / step_spill;
    w->out->gsum[g].rot_tok_s = meets ? rot : 0;
    w->out->gsum[g].spill_tok_s = spill;
    /* hysteresis: starting to rotate must gain margin_pct, stopping must lose */
    double need_gain = w->rot_prev[g] ? 1.0 : 1.0 + in->margin_pct / 100.0;
    if (in->rotation == PLAN_ROT_AUTO && (!meets || rot <= spill * need_gain))
        return 0;
    uint64_t q = (uint64_t)(quantum / tick + 0.5);
    if (q == 0)
        q = 1;

    /* turns end a quarter of the places at a time, a quarter of a quantum apart, so the
     * copies of one turnover stay small beside the steps of the holders that stay */
    uint64_t spacing = q * per / k ? q * per / k : 1;
    uint64_t last = w->rot_prev[g] ? w->rot_last[g] : 0;
    uint64_t may_end = w->rot_prev[g] && in->now < last + spacing ? 0 : per;
    size_t n_over = 0;

    /* holders: a turn not over, then the longest waiting, then turns that ended */
    size_t nk = 0;
    for (size_t j = 0; j < n_act; j++) {
        uint32_t i = act[j];
        const struct plan_session *s = &in->sessions[i];
        /* by its last tactic, not its blocks: a holder whose blocks are still on their way in
         * (promotions wait for the room the workers release) holds its turn all the same */
        int holding = s->cur_tactic == PLAN_RESIDENT || s->cur_tactic == PLAN_WINDOW ||
                      s->cur_tactic == PLAN_CPU_TAIL;
        int kept =
            holding && w->rot_prev[g] && s->turn_since <= in->now && in->now - s->turn_since < q;
        uint64_t cls = kept ? 0 : holding ? 2 : 1;
        /* turn not over: the latest turn first; waiting: the longest first; turn over: the
         * shortest on the device first. Those that
         * began to wait together keep the order they had as holders, so planning again
         * after the moves picks the same holders */
        struct key k2 = {{cls, s->turn_since, UINT64_MAX - s->in_since, s->id}, i};
        if (cls == 2)
            k2.k[1] = UINT64_MAX - s->in_since, k2.k[2] = s->id;
        /* holders that grew past the room: the one whose turn started first gives way */
        if (cls == 0)
            k2.k[1] = UINT64_MAX - s->turn_since;
        w->keys[nk++] = k2;
        n_over += cls == 2;
    }
    qsort(w->keys, nk, sizeof(*w->keys), key_cmp);
    /* of the turns that ended, only the may_end longest on the device end now; the others
     * stay (their turn not renewed) until the next spacing */
    if (n_over > may_end) {
        size_t first = 0;
        while (first < nk && w->keys[first].k[0] != 2)
            first++;
        for (size_t j = first; j < first + n_over - may_end; j++) {
            const struct plan_session *s = &in->sessions[w->keys[j].idx];
            w->keys[j].k[0] = 0;
            w->keys[j].k[1] = UINT64_MAX - s->turn_since;
            w->keys[j].k[3] = 1; /* kept without a new turn */
        }
        qsort(w->keys, nk, sizeof(*w->keys), key_cmp);
    }
    /* a holder that grew past the room left gives up its turn; from the first other session
     * that does not fit on, everyone waits */
    int64_t used = 0, waiting = 0;
    int full = 0;
    for (size_t j = 0; j < nk; j++) {
        uint32_t i = w->keys[j].idx;
        w->rot[i] = !full && used + w->need[i] <= room;
        if (w->rot[i])
            used += w->need[i];
        else
            waiting += w->need[i];
        full |= !w->rot[i] && w->keys[j].k[0] != 0;
    }
    if (waiting > *host_avail) {
        for (size_t j = 0; j < nk; j++) /* the host cannot hold the waiting: spill instead */
            w->rot[w->keys[j].idx] = 0;
        return 0;
    }
    struct plan_gpu_summary *gs = &w->out->gsum[g];
    size_t ended = 0;
    for (size_t j = 0; j < nk; j++) {
        uint32_t i = w->keys[j].idx;
        const struct plan_session *s = &in->sessions[i];
        if (w->rot[i]) {
            set_assign(w, i, PLAN_RESIDENT, w->need[i], 0);
            w->out->assign[i].turn_new = w->keys[j].k[0] != 0;
            uint64_t start = w->keys[j].k[0] == 0 ? s->turn_since : in->now;
            if (!gs->turn_end || start + q < gs->turn_end)
                gs->turn_end = start + q;
        } else {
            set_assign(w, i, s->active ? PLAN_ROTATED : PLAN_PARKED, 0, w->need[i]);
            ended += w->keys[j].k[0] == 2;
        }
    }
    gs->last_swap = ended ? in->now : last;
    /* turns that ended but wait for their spacing: plan again then */
    if (gs->turn_end <= in->now)
        gs->turn_end = gs->last_swap + spacing > in->now ? gs->last_swap + spacing : in->now + 1;
    *host_avail -= waiting;
    gs->quantum = q;
    gs->n_rotating = (uint32_t)n;
    return 1;
}

/* places the sessions of gpu g; RKV_ENOSPACE when the admitted set cannot be
 * placed within host_avail (the caller then un-admits one and retries). */
static int place_gpu(struct work *w, uint32_t g, uint32_t w_prev, int64_t *host_avail,
                     uint32_t *cap_out, int grace)
{
    const struct plan_input *in = w->in;
    const struct plan_gpu *gb = &in->gpus[g];
    int resident_mode = in->mode == PLAN_MODE_RESIDENT;
    int64_t room = w->dev_cap[g];
    size_t n_idle = 0, n_act = 0;
    uint32_t *idle = w->list;
    uint32_t *act = w->list + in->n_sessions; /* second half: list has 2n */
    int64_t active = 0;

    *cap_out = PLAN_NO_CAP;
    struct plan_gpu_summary *gs = &w->out->gsum[g];
    gs->quantum = gs->turn_end = gs->last_swap = 0;
    gs->rot_tok_s = gs->spill_tok_s = 0;
    gs->n_rotating = 0;
    for (size_t i = 0; i < in->n_sessions; i++)
        if (in->sessions[i].gpu == g)
            w->rot[i] = 0;
    /* pinned and (resident mode) active sessions first; idle on device by lru */
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_session *s = &in->sessions[i];
        if (s->gpu != g)
            continue;
        if (w->role[i] == ROLE_RUN && (s->pinned || resident_mode)) {
            set_assign(w, (uint32_t)i, PLAN_RESIDENT, w->need[i], 0);
            room -= w->need[i];
        } else if (w->role[i] == ROLE_RUN ||
                   (w->role[i] == ROLE_IDLE && s->cur_dev > 0 && grace && in_grace(in, s))) {
            act[n_act++] = (uint32_t)i;
            active += w->need[i];
        } else if (w->role[i] == ROLE_IDLE && s->cur_dev > 0) {
            w->keys[n_idle++] = (struct key){{s->last_use, s->id, 0}, (uint32_t)i};
            set_assign(w, (uint32_t)i, PLAN_RESIDENT, w->need[i], 0);
        }
    }
    if (room < 0)
        return RKV_EINTERNAL; /* admission guarantees the fixed part fits */
    qsort(w->keys, n_idle, sizeof(*w->keys), key_cmp);
    for (size_t k = 0; k < n_idle; k++)
        idle[k] = w->keys[k].idx;

    int64_t idev = park_idle(w, idle, n_idle, room, active, 0, host_avail);
    /* idle kv that fits neither the device nor the host is dropped, lru first */
    for (size_t k = 0; k < n_idle && idev > room - (int64_t)n_act; k++) {
        uint32_t i = idle[k];
        if (w->out->assign[i].tactic != PLAN_RESIDENT)
            continue;
        set_assign(w, i, PLAN_PARKED, 0, 0);
        w->out->assign[i].dropped = w->held[i] > 0;
        idev -= w->need[i];
    }
    if (n_act == 0)
        return 0;

    /* needs sorted ascending for the water-filling cap */
    uint32_t *sorted = malloc(n_act * sizeof(*sorted));
    if (!sorted)
        return RKV_ENOMEM;
    for (size_t k = 0; k < n_act; k++)
        sorted[k] = w->need[act[k]];
    for (int pass = 0; pass < 2; pass++) {
        int64_t r_act = room - idev;
        for (size_t k = 0; k < n_act; k++)
            w->keys[k] = (struct key){{sorted[k], 0, 0}, 0};
        qsort(w->keys, n_act, sizeof(*w->keys), key_cmp);
        w->prefix[0] = 0;
        for (size_t k = 0; k < n_act; k++) {
            sorted[k] = (uint32_t)w->keys[k].k[0];
            w->prefix[k + 1] = w->prefix[k] + sorted[k];
        }
        uint32_t m = in->min_dev ? in->min_dev : 1;
        uint32_t w_hi = max_cap(sorted, w->prefix, n_act, r_act, m);
        if (w_hi == 0) {
            free(sorted);
            return RKV_ENOSPACE;
        }
        int64_t margin = (int64_t)w->dev_cap[g] * in->margin_pct / 100;
        uint32_t w_lo = max_cap(sorted, w->prefix, n_act, r_act - margin, m);
        if (w_lo == 0)
            w_lo = m;
        uint32_t cap = w_prev < w_lo ? w_lo : w_prev > w_hi ? w_hi : w_prev;
        /* spilling while idle kv sits on the device breaks the relief order:
         * park all idle sessions and size the windows again */
        if (cap != PLAN_NO_CAP && cap < sorted[n_act - 1] && idev > 0 && pass == 0) {
            idev = park_idle(w, idle, n_idle, room, active, 1, host_avail);
            continue;
        }
        /* sessions that each fit may take turns instead of all spilling */
        if (cap != PLAN_NO_CAP && w_hi != PLAN_NO_CAP) {
            int r = rotate_gpu(w, g, act, n_act, r_act, host_avail);
            if (r < 0) {
                free(sorted);
                return r;
            }
            if (r > 0)
                break; /* no window cap: a holder is all resident */
        }
        /* the tails must fit the host: the smallest cap in [cap, w_hi] whose
         * tails fit; with the spare blocks a cap W places min(r_act,
         * usage(W + 1)) on the device, which grows with W */
        if (cap != PLAN_NO_CAP && tails_at(sorted, n_act, r_act, active, cap) > *host_avail) {
            uint32_t lo = cap, hi = w_hi == PLAN_NO_CAP ? sorted[n_act - 1] : w_hi;
            if (tails_at(sorted, n_act, r_act, active, hi) > *host_avail) {
                free(sorted);
                return RKV_ENOSPACE;
            }
            while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;
                if (tails_at(sorted, n_act, r_act, active, mid) > *host_avail)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            cap = lo >= sorted[n_act - 1] ? PLAN_NO_CAP : lo;
        }
        *cap_out = cap;
        w->hyst[g] = cap != PLAN_NO_CAP && w_hi == PLAN_NO_CAP;
        /* spare device blocks: +1 to spilled sessions, those holding more first */
        int64_t spare = cap == PLAN_NO_CAP ? 0 : r_act - (int64_t)cap_usage(sorted, n_act, cap);
        size_t n_sp = 0;
        enum plan_tactic st = spill_tactic(in, gb);
        for (size_t k = 0; k < n_act; k++) {
            uint32_t i = act[k];
            uint32_t dev = w->need[i] < cap ? w->need[i] : cap;
            set_assign(w, i, PLAN_RESIDENT, dev, w->need[i] - dev);
            if (dev < w->need[i])
                w->keys[n_sp++] =
                    (struct key){{UINT64_MAX - in->sessions[i].cur_dev, in->sessions[i].id, 0}, i};
        }
        qsort(w->keys, n_sp, sizeof(*w->keys), key_cmp);
        for (size_t k = 0; k < n_sp && spare > 0; k++, spare--) {
            struct plan_assign *a = &w->out->assign[w->keys[k].idx];
            a->n_dev++;
            a->n_host--;
        }
        for (size_t k = 0; k < n_act; k++) {
            struct plan_assign *a = &w->out->assign[act[k]];
            if (a->n_host > 0)
                a->tactic = st;
            *host_avail -= a->n_host;
        }
        break;
    }
    free(sorted);
    return 0;
}

/* the lowest-priority admitted unpinned session on gpu g, or UINT32_MAX */
static uint32_t last_admitted(const struct work *w, uint32_t g)
{
    for (size_t k = w->n_prio; k-- > 0;) {
        uint32_t i = w->prio[k];
        const struct plan_session *s = &w->in->sessions[i];
        if (s->gpu == g && w->role[i] == ROLE_RUN && !s->pinned)
            return i;
    }
    return UINT32_MAX;
}

static int place_all(struct work *w, const struct plan *prev)
{
    const struct plan_input *in = w->in;
    int64_t host_avail = w->host_cap;
    /* waiting and parked kv is on the host before any gpu places */
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_session *s = &in->sessions[i];
        set_assign(w, (uint32_t)i, PLAN_WAIT, 0, 0);
        if (w->role[i] == ROLE_WAIT) {
            set_assign(w, (uint32_t)i, PLAN_WAIT, 0, w->held[i]);
            host_avail -= w->held[i];
        } else if (w->role[i] == ROLE_IDLE && s->cur_dev == 0) {
            set_assign(w, (uint32_t)i, PLAN_PARKED, 0, w->need[i]);
            host_avail -= w->need[i];
        } else if (w->role[i] == ROLE_DROP) {
            /* dropped idle sessions stay parked with no kv */
            if (w->rank[i] == UINT32_MAX)
                set_assign(w, (uint32_t)i, PLAN_PARKED, 0, 0);
            w->out->assign[i].dropped = w->held[i] > 0;
        }
    }
    if (host_avail < 0)
        return RKV_EINTERNAL;
    int same = prev && prev->sum.n_gpus == in->n_gpus && prev->mode == in->mode;
    for (uint32_t g = 0; g < in->n_gpus; g++) {
        w->rot_prev[g] = same && prev->gsum[g].quantum > 0;
        w->rot_last[g] = w->rot_prev[g] ? prev->gsum[g].last_swap : 0;
    }
    for (uint32_t g = 0; g < in->n_gpus; g++) {
        uint32_t w_prev = same ? prev->gsum[g].window_cap : PLAN_NO_CAP;
        int grace = 1;
        for (;;) {
            int64_t avail = host_avail;
            uint32_t cap;
            int rc = place_gpu(w, g, w_prev, &avail, &cap, grace);
            if (rc == 0) {
                host_avail = avail;
                w->out->gsum[g].window_cap = cap;
                break;
            }
            if (rc != RKV_ENOSPACE)
                return rc;
            /* idle sessions parked, windowed or dropped by the failed attempt go back */
            for (size_t j = 0; j < in->n_sessions; j++)
                if (in->sessions[j].gpu == g && w->role[j] == ROLE_IDLE &&
                    in->sessions[j].cur_dev > 0) {
                    set_assign(w, (uint32_t)j, PLAN_RESIDENT, w->need[j], 0);
                    w->out->assign[j].dropped = 0;
                }
            /* the grace is worth less than any admitted session: first without it */
            if (grace) {
                grace = 0;
                continue;
            }
            /* host too small for what was admitted: un-admit the last one;
             * its kv is dropped since the host has no room for it */
            uint32_t i = last_admitted(w, g);
            if (i == UINT32_MAX)
                return RKV_EINTERNAL;
            w->role[i] = ROLE_DROP;
            set_assign(w, i, PLAN_WAIT, 0, 0);
            w->out->assign[i].dropped = w->held[i] > 0;
        }
    }
    return 0;
}

/* --- step 3: moves and summary ------------------------------------------------ */

static enum plan_reason reason_of(const struct work *w, uint32_t i)
{
    const struct plan_session *s = &w->in->sessions[i];
    const struct plan_assign *a = &w->out->assign[i];
    if (a->dropped)
        return PLAN_WHY_HOST_FULL;
    switch (a->tactic) {
    case PLAN_RESIDENT:
        return s->pinned ? PLAN_WHY_PINNED : w->rot[i] ? PLAN_WHY_TURN : PLAN_WHY_FITS;
    case PLAN_ROTATED: return PLAN_WHY_ROTATION;
    case PLAN_PARKED: return s->cur_dev > 0 ? PLAN_WHY_IDLE_LRU : PLAN_WHY_IDLE;
    case PLAN_CPU_TAIL:
    case PLAN_WINDOW:
        if (w->in->mode == PLAN_MODE_WINDOW || w->in->mode == PLAN_MODE_CPU_TAIL)
            return PLAN_WHY_FORCED;
        if (a->tactic == PLAN_CPU_TAIL)
            return PLAN_WHY_CPU_FASTER;
        return w->hyst[s->gpu] ? PLAN_WHY_HYSTERESIS : PLAN_WHY_VRAM_FULL;
    default: return PLAN_WHY_QUEUED;
    }
}

static int summarize(struct work *w)
{
    const struct plan_input *in = w->in;
    struct plan *p = w->out;
    struct plan_summary *sum = &p->sum;
    uint64_t host_used = 0;
    for (uint32_t g = 0; g < in->n_gpus; g++) {
        p->gsum[g].dev_cap = w->dev_cap[g];
        p->gsum[g].offline = in->gpus[g].offline;
        uint64_t te = p->gsum[g].turn_end;
        if (te && (!sum->next_turn || te < sum->next_turn))
            sum->next_turn = te;
    }
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_session *s = &in->sessions[i];
        struct plan_assign *a = &p->assign[i];
        struct plan_gpu_summary *gs = &p->gsum[s->gpu];
        a->id = s->id;
        a->reason = reason_of(w, (uint32_t)i);
        a->never_fits = a->tactic == PLAN_WAIT && w->rank[i] != UINT32_MAX &&
                        never_fits(w, (uint32_t)i, in->mode == PLAN_MODE_RESIDENT);
        sum->n_never_fits += a->never_fits;
        if (a->never_fits)
            a->reason = PLAN_WHY_TOO_BIG;
        if (!a->dropped) {
            a->demote = s->cur_dev > a->n_dev ? s->cur_dev - a->n_dev : 0;
            a->promote = s->cur_host > a->n_host ? s->cur_host - a->n_host : 0;
        }
        gs->dev_used += a->n_dev;
        gs->n_active += w->role[i] == ROLE_RUN && s->active;
        gs->sessions[a->tactic]++;
        gs->bytes[a->tactic] += (uint64_t)(a->n_dev + a->n_host) * in->block_bytes;
        host_used += a->n_host;
        sum->n_wait += a->tactic == PLAN_WAIT;
        sum->n_dropped += a->dropped;
        sum->n_moves += a->demote > 0 || a->promote > 0;
        sum->blocks_demoted += a->demote;
        sum->blocks_promoted += a->promote;
    }
    sum->n_gpus = in->n_gpus;
    sum->host_cap = w->host_cap;
    sum->host_used = (uint32_t)host_used;
    sum->gpu = p->gsum;
    /* the budgets are the contract: check them before anyone acts on it */
    if (host_used > w->host_cap)
        return RKV_EINTERNAL;
    for (uint32_t g = 0; g < in->n_gpus; g++)
        if (p->gsum[g].dev_used > w->dev_cap[g])
            return RKV_EINTERNAL;
    return 0;
}

/* --- step 4: moves across gpus ------------------------------------------------ */

static int is_spilled(enum plan_tactic t)
{
    return t == PLAN_WINDOW || t == PLAN_CPU_TAIL || t == PLAN_ROTATED;
}

/* GB/s at which gpu g's spilled sessions read their tail (unknown: 1) */
static double tail_rate(const struct plan_input *in, const struct plan_gpu *g)
{
    double r = g->pcie_h2d_gbps;
    if (g->host_stream_gbps > 0 && (r <= 0 || g->host_stream_gbps < r))
        r = g->host_stream_gbps;
    if (spill_tactic(in, g) == PLAN_CPU_TAIL)
        r = g->cpu_attn_gbps;
    else if (g->split_gbps > r)
        r = g->split_gbps; /* the worker reads a WINDOW tail on the cpu and the link at once */
    return r > 0 ? r : 1.0;
}

/* the rate model: tokens per second of gpu g running n sessions that need
 * `need` blocks, one token each per step; a step reads the weights and the
 * device blocks at device rate dev and streams what does not fit D */
static double gpu_rate(const struct work *w, uint32_t g, double dev, uint64_t n, uint64_t need)
{
    const struct plan_gpu *gp = &w->in->gpus[g];
    if (n == 0)
        return 0;
    double gb = (double)w->in->block_bytes / 1e9;
    uint64_t on_dev = need < w->dev_cap[g] ? need : w->dev_cap[g];
    double step = ((double)gp->weights_bytes / 1e9 + (double)on_dev * gb) / dev +
                  (double)(need - on_dev) * gb / tail_rate(w->in, gp);
    return (double)n / (step > 0 ? step : 1e-9);
}

static int rebalance(struct work *w)
{
    const struct plan_input *in = w->in;
    struct plan *p = w->out;
    uint32_t ng = in->n_gpus;
    for (size_t i = 0; i < in->n_sessions; i++)
        p->assign[i].move_to = PLAN_NO_GPU;
    if (ng < 2)
        return 0;
    uint64_t *n_run = calloc(ng, sizeof(*n_run)), *need = calloc(ng, sizeof(*need));
    uint8_t *busy = calloc(ng, 1), *sent = calloc(ng, 1), *got = calloc(ng, 1);
    if (!n_run || !need || !busy || !sent || !got) {
        free(n_run), free(need), free(busy), free(sent), free(got);
        return RKV_ENOMEM;
    }
    /* a gpu with spilled or waiting work is a source, never a target */
    for (size_t i = 0; i < in->n_sessions; i++) {
        const struct plan_assign *a = &p->assign[i];
        uint32_t g = in->sessions[i].gpu;
        if (w->role[i] == ROLE_RUN) {
            n_run[g] += in->sessions[i].active; /* a pinned idle one makes no tokens */
            need[g] += w->need[i];
        }
        if (is_spilled(a->tactic) ||
            (a->tactic == PLAN_WAIT && w->rank[i] != UINT32_MAX && !a->never_fits))
            busy[g] = 1;
    }
    for (uint32_t round = 0; round < ng; round++) {
        uint32_t bi = UINT32_MAX, bg = 0;
        double best = 0;
        for (size_t i = 0; i < in->n_sessions; i++) {
            const struct plan_session *s = &in->sessions[i];
            const struct plan_assign *a = &p->assign[i];
            uint32_t ga = s->gpu;
            int waiting = a->tactic == PLAN_WAIT && w->rank[i] != UINT32_MAX;
            if (!s->movable || s->pinned || !s->active || sent[ga] || a->dropped || a->never_fits ||
                !(is_spilled(a->tactic) || waiting))
                continue;
            for (uint32_t b = 0; b < ng; b++) {
                const struct plan_gpu_summary *gb = &p->gsum[b];
                if (b == ga || got[b] || busy[b] || in->gpus[b].offline)
                    continue;
                /* all of it resident on b, with the promotion margin to spare */
                uint64_t margin = (uint64_t)gb->dev_cap * in->margin_pct / 100;
                if ((uint64_t)w->need[i] + (margin ? margin : 1) + gb->dev_used > gb->dev_cap)
                    continue;
                /* aggregate tokens per second before and after; a waiting
                 * session gains most: it runs at all */
                /* one device rate for both: the gpus of one host run one model, so
                 * what their measurements differ by is noise, not a reason to move */
                double da = in->gpus[ga].dev_attn_gbps, db = in->gpus[b].dev_attn_gbps;
                double dev = da > 0 && db > 0 ? (da + db) / 2 : da > 0 ? da : db > 0 ? db : 1000;
                double before = gpu_rate(w, ga, dev, n_run[ga], need[ga]) +
                                gpu_rate(w, b, dev, n_run[b], need[b]);
                double after = waiting
                                   ? before * 2 + 1
                                   : gpu_rate(w, ga, dev, n_run[ga] - 1, need[ga] - w->need[i]) +
                                         gpu_rate(w, b, dev, n_run[b] + 1, need[b] + w->need[i]);
                double gain = after - before;
                /* hysteresis: a move must gain margin_pct at least */
                if (gain <= before * in->margin_pct / 100.0 || gain <= best)
                    continue;
                best = gain;
                bi = (uint32_t)i;
                bg = b;
            }
        }
        if (bi == UINT32_MAX)
            break;
        uint32_t ga = in->sessions[bi].gpu;
        p->assign[bi].move_to = bg;
        sent[ga] = got[bg] = 1;
        p->sum.n_rebalance++;
    }
    free(n_run), free(need), free(busy), free(sent), free(got);
    return 0;
}

uint32_t plan_pick_gpu(const struct plan *p, uint32_t need, uint32_t hint, const uint32_t *extra,
                       const uint32_t *extra_running)
{
    if (!p)
        return hint;
    uint32_t best = UINT32_MAX;
    uint64_t best_key[4] = {0};
    for (uint32_t g = 0; g < p->sum.n_gpus; g++) {
        const struct plan_gpu_summary *gs = &p->gsum[g];
        if (gs->offline)
            continue;
        uint64_t used = (uint64_t)gs->dev_used + (extra ? extra[g] : 0);
        uint64_t fr = gs->dev_cap > used ? gs->dev_cap - used : 0;
        uint64_t run = (uint64_t)gs->n_active + (extra_running ? extra_running[g] : 0);
        /* larger key wins, compared in order; then the lower index */
        uint64_t key[4] = {fr >= need, fr, UINT64_MAX - run, g == hint};
        int better = best == UINT32_MAX;
        for (int k = 0; !better && k < 4; k++) {
            if (key[k] != best_key[k]) {
                better = key[k] > best_key[k];
                break;
            }
        }
        if (better) {
            best = g;
            memcpy(best_key, key, sizeof key);
        }
    }
    return best == UINT32_MAX ? hint : best;
}

static int build_index(struct work *w)
{
    struct plan *p = w->out;
    for (size_t i = 0; i < p->n; i++)
        w->keys[i] = (struct key){{p->assign[i].id, 0, 0}, (uint32_t)i};
    qsort(w->keys, p->n, sizeof(*w->keys), key_cmp);
    for (size_t i = 0; i < p->n; i++) {
        p->by_id[i] = w->keys[i].idx;
        if (i > 0 && w->keys[i].k[0] == w->keys[i - 1].k[0]) {
            log_error("plan: session id %llu appears twice; ids must be unique",
                      (unsigned long long)w->keys[i].k[0]);
            return RKV_EINVAL;
        }
    }
    return 0;
}

int plan_compute(const struct plan_input *in, const struct plan *prev, struct plan **out)
{
    *out = NULL;
    int rc = validate(in);
    if (rc)
        return rc;
    size_t n = in->n_sessions;
    struct plan *p = calloc(1, sizeof(*p));
    struct work w = {.in = in, .out = p};
    if (!p)
        return RKV_ENOMEM;
    p->n = n;
    p->mode = in->mode;
    p->assign = calloc(n ? n : 1, sizeof(*p->assign));
    p->by_id = calloc(n ? n : 1, sizeof(*p->by_id));
    p->gsum = calloc(in->n_gpus, sizeof(*p->gsum));
    w.role = calloc(n ? n : 1, 1);
    w.need = calloc(n ? n : 1, sizeof(uint32_t));
    w.held = calloc(n ? n : 1, sizeof(uint32_t));
    w.dev_cap = calloc(in->n_gpus, sizeof(uint32_t));
    w.keys = calloc(n ? n : 1, sizeof(struct key));
    w.list = calloc(2 * n + 1, sizeof(uint32_t));
    w.prefix = calloc(n + 1, sizeof(uint64_t));
    w.prio = calloc(n ? n : 1, sizeof(uint32_t));
    w.rank = calloc(n ? n : 1, sizeof(uint32_t));
    w.running = calloc(n ? n : 1, 1);
    w.hyst = calloc(in->n_gpus, 1);
    w.rot = calloc(n ? n : 1, 1);
    w.rot_prev = calloc(in->n_gpus, 1);
    w.rot_last = calloc(in->n_gpus, sizeof(uint64_t));
    rc = RKV_ENOMEM;
    if (!p->assign || !p->by_id || !p->gsum || !w.role || !w.need || !w.held || !w.dev_cap ||
        !w.keys || !w.list || !w.prefix || !w.prio || !w.rank || !w.running || !w.hyst || !w.rot ||
        !w.rot_prev || !w.rot_last)
        goto done;

    for (uint32_t g = 0; g < in->n_gpus; g++)
        w.dev_cap[g] = plan_dev_cap(&in->gpus[g], in->block_bytes);
    w.host_cap = plan_host_cap(in->host_budget, in->block_bytes);
    for (size_t i = 0; i < n; i++) {
        const struct plan_session *s = &in->sessions[i];
        p->assign[i].id = s->id;
        /* an active session writes at least one block; an idle one needs only
         * the kv it holds (none after a drop) */
        w.need[i] = s->active && s->n_blocks == 0 ? 1 : s->n_blocks;
        uint64_t held = (uint64_t)s->cur_dev + s->cur_host;
        w.held[i] = held < w.need[i] ? (uint32_t)held : w.need[i];
        if (!s->active && !s->pinned)
            w.need[i] = w.held[i];
    }
    if ((rc = build_index(&w)))
        goto done;
    for (size_t i = 0; i < n; i++)
        w.running[i] = in->sessions[i].active && is_running_tactic(in->sessions[i].cur_tactic);
    /* admission repeats with the admitted set counted as running until it
     * stops growing (it only grows): then planning again, once they run,
     * admits exactly the same sessions */
    for (int round = 0; round < 16; round++) {
        order_candidates(&w);
        if ((rc = admit(&w)))
            goto done;
        int grew = 0;
        for (size_t i = 0; i < n; i++) {
            if (w.role[i] == ROLE_RUN && !in->sessions[i].pinned && !w.running[i]) {
                w.running[i] = 1;
                grew = 1;
            }
        }
        if (!grew)
            break;
    }
    if ((rc = place_all(&w, prev)))
        goto done;
    if ((rc = summarize(&w)))
        goto done;
    rc = rebalance(&w);
done:
    free(w.role), free(w.need), free(w.held), free(w.dev_cap), free(w.keys);
    free(w.list), free(w.prefix), free(w.prio), free(w.rank), free(w.running);
    free(w.hyst), free(w.rot), free(w.rot_prev), free(w.rot_last);
    if (rc) {
        if (rc == RKV_EINTERNAL)
            log_error("plan: internal error: budgets would be exceeded (a planner bug)");
        plan_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void plan_destroy(struct plan *p)
{
    if (!p)
        return;
    free(p->assign);
    free(p->by_id);
    free(p->gsum);
    free(p);
}

size_t plan_n_assign(const struct plan *p)
{
    return p->n;
}

const struct plan_assign *plan_assign_at(const struct plan *p, size_t i)
{
    return i < p->n ? &p->assign[i] : NULL;
}

const struct plan_assign *plan_find(const struct plan *p, uint64_t id)
{
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t mid_id = p->assign[p->by_id[mid]].id;
        if (mid_id == id)
            return &p->assign[p->by_id[mid]];
        if (mid_id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const struct plan_summary *plan_get_summary(const struct plan *p)
{
    return &p->sum;
}

const char *plan_tactic_name(enum plan_tactic t)
{
    static const char *const names[] = {"resident", "window", "cpu_tail",
                                        "parked",   "wait",   "rotated"};
    return (unsigned)t < PLAN_N_TACTICS ? names[t] : "unknown";
}

const char *plan_reason_name(enum plan_reason r)
{
    static const char *const names[] = {
        "fits",       "pinned", "idle",      "idle_lru", "vram_full", "cpu_faster", "forced",
        "hysteresis", "queued", "host_full", "too_big",  "rebalance", "turn",       "rotation"};
    return (unsigned)r < PLAN_N_REASONS ? names[r] : "unknown";
}

static const char *const mode_names[] = {"auto", "resident", "window", "cpu_tail"};

const char *plan_mode_name(enum plan_mode m)
{
    return (unsigned)m < 4 ? mode_names[m] : "unknown";
}

int plan_mode_parse(const char *s, enum plan_mode *out)
{
    for (int m = 0; m < 4; m++)
        if (s && strcmp(s, mode_names[m]) == 0) {
            *out = (enum plan_mode)m;
            return 0;
        }
    return RKV_EINVAL;
}

const char *plan_rotation_name(enum plan_rotation r)
{
    static const char *const names[] = {"off", "auto", "always"};
    return (unsigned)r <= PLAN_ROT_ALWAYS ? names[r] : "unknown";
}
