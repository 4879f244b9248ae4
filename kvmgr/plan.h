/* plan.h - the tactic planner: a pure function from budgets, sessions and rates to
 * per-session KV residency (RESIDENT / WINDOW / CPU_TAIL / PARKED / WAIT / ROTATED). */
#ifndef RKV_KVMGR_PLAN_H
#define RKV_KVMGR_PLAN_H

#include <stddef.h>
#include <stdint.h>

/*
 * Algorithm (plan_compute). Units are blocks; per GPU the device capacity is
 * D = (vram_target - weights - compute_reserve) / block_bytes, the host pool
 * (shared by all GPUs) holds H = host_budget / block_bytes.
 *
 * 1. admission: sessions that want to run (active or pinned) are taken in
 *    priority order: pinned, then already running, then the rest oldest
 *    last_use first (fifo). Pinned and running ones are admitted while their
 *    GPU has D >= pinned blocks + min_dev blocks per active session (all of
 *    its blocks in `resident` mode); new ones also need the blocks that overflow
 *    D to fit the host, and once one is refused every later new session on
 *    that GPU waits too (no starvation of large requests); a session that
 *    could not run even alone is marked never_fits and holds no one up.
 *    Admission repeats with the admitted counted as running until the set is
 *    stable, so a replan admits the same sessions. A waiting session keeps the blocks it
 *    holds, on the host; when the host cannot hold the existing kv, the
 *    lowest-priority waiting, then least recently used parked sessions are
 *    dropped (`dropped`: rebuilt from token history later). Idle sessions
 *    need only the blocks they hold.
 * 2. relief, per GPU, in order, only as far as needed:
 *    a. pinned sessions stay RESIDENT; idle sessions already off the device
 *       stay PARKED (an idle session is promoted only when it becomes active);
 *    b. park idle sessions, least recently used first, until the rest fits;
 *       a session idle for less than idle_grace (last_use within idle_grace of
 *       now) is not parked: it is windowed with the active ones (step c), so a
 *       client's next turn a moment later finds its blocks where they were
 *       instead of copied out and back (when the host cannot take the tails
 *       that way, the gpu is planned again without the grace; resident mode
 *       has no grace, as it windows no one);
 *    c. window the active sessions: one cap W for all (water-filling, so the
 *       tails grow fairly), each keeps min(n_blocks, W), W >= min_dev, newest
 *       blocks on the device, spare blocks go +1 to sessions that already hold
 *       more;
 *    d. a spilled session is CPU_TAIL when the measured cpu attention rate
 *       beats the streamed rate min(pcie, host-stream), else WINDOW;
 *    d'. rotation (plan_input.rotation; see "Rotation" below) replaces c and d
 *       on a gpu when every active session there fits the device alone and the
 *       rate model says taking turns beats streaming the tails;
 *    e. whoever was not admitted in step 1 is WAIT (admission control).
 * 3. hysteresis: W is the previous plan's cap clamped to [W_lo, W_hi], where
 *    W_hi is the largest cap that fits D and W_lo the largest that fits D minus
 *    a margin (margin_pct of D). Demotion is immediate, promotion needs the
 *    margin, and planning again with unchanged inputs yields no moves.
 *    Spare blocks are only handed out +1 each, so planning again with unchanged
 *    inputs gives the same plan.
 * Budgets are hard: device blocks <= D per GPU and host blocks <= H always
 * (when the host cannot take the tails or parked sessions a GPU needs, its
 * lowest-priority admitted session is dropped and the GPU planned again).
 * 4. moves across gpus (several gpus only): an active, movable session that
 *    is spilled (WINDOW / CPU_TAIL) or waiting on gpu a goes to gpu b when b
 *    holds all of it resident with the margin to spare (margin_pct of b's D,
 *    at least one block), b has nobody spilled or waiting, b's worker is up,
 *    and the rate model says the aggregate tokens/s of a and b rise by more
 *    than margin_pct: each gpu makes (its active sessions / step time), a
 *    step reads the weights and the device blocks at the device rate (the
 *    mean of both gpus' dev_attn_gbps: they run one model, what their
 *    measurements differ by is noise) and streams what does not fit D at the
 *    spill rate. The biggest gain goes
 *    first; at most one move leaves and one arrives per gpu per plan. The
 *    assignment keeps describing the session on a (the move is carried out
 *    later, at a step boundary) with move_to = b. Hysteresis: once on b the
 *    session is resident with room to spare, so planning again proposes no
 *    move back; kvmgr also clears `movable` for a while after a move.
 * Rotation. Sessions that each fit take turns holding the device: holders are
 * RESIDENT (reason turn), the others ROTATED (every block on the host, not in
 * a step, request open). Holders are chosen in order: those whose turn (the
 * quantum) has not ended, then the rest by how long they waited (turn_since,
 * oldest first), then holders whose turn ended; the device fills in that order
 * and stops at the first that does not fit (a large session is never skipped
 * for ever); among holders whose turn ended, those on the device the shortest
 * (in_since) stay first; when holders grow past the room, the one whose turn
 * started first gives way. Idle sessions in their grace take turns as well
 * (their next request is expected soon); one that waits is PARKED. The quantum: with n
 * sessions rotating through k places (k = the sessions of average size the
 * room holds) a session waits about ceil((n - k) / k) turns; turns end a
 * quarter of the places at a time, a quarter of a quantum apart (so the copies
 * of a turnover stay small beside the holders that keep decoding), which can
 * hold the queue back most of a quantum more; so quantum = (0.8 max_stall -
 * swap) / (ceil((n - k) / k) + 1), at least one step, where swap is one place's
 * turnover (a session of average size copied out and the next one in at the
 * link rate; the fifth of max_stall kept back covers noticing a turn's end).
 * The rate model: WINDOW / CPU_TAIL make n tokens per step of (weights +
 * room) / dev + spilled / tail rate; rotation makes k per step of (weights +
 * held) / dev, times quantum / (quantum + swap). Auto rotates when that beats
 * the spill by margin_pct and the quantum meets max_stall (at least one step);
 * always rotates whenever the sessions each fit. When everything fits again
 * every session is a holder: RESIDENT, nothing rotated.
 * Placement of a new session (plan_pick_gpu): the gpu where it fits (free
 * device blocks >= its blocks) with the most free device blocks, then the
 * fewest running sessions, then the gpu it was offered on.
 * Prefix-shared blocks are counted once per session (conservative). Cost:
 * O(n log n) per plan; 10k sessions on 8 GPUs plan in about 10 ms
 * (rkv-bench-plan).
 */

enum plan_tactic {
    PLAN_RESIDENT = 0, /* every block on the device */
    PLAN_WINDOW,       /* newest blocks on the device, tail streamed by the gpu */
    PLAN_CPU_TAIL,     /* newest blocks on the device, tail attended by the cpu */
    PLAN_PARKED,       /* idle, every block on the host */
    PLAN_WAIT,         /* not admitted: queued, holds only the blocks it had, on the host */
    PLAN_ROTATED,      /* admitted, waits for its rotation turn: every block on the host */
    PLAN_N_TACTICS,
};

enum plan_mode {
    PLAN_MODE_AUTO = 0,
    PLAN_MODE_RESIDENT, /* never spill an active session: queue instead */
    PLAN_MODE_WINDOW,   /* spill as WINDOW */
    PLAN_MODE_CPU_TAIL, /* spill as CPU_TAIL */
};

enum plan_rotation {
    PLAN_ROT_OFF = 0,
    PLAN_ROT_AUTO,   /* rotate where the rate model says turns beat streaming the tails */
    PLAN_ROT_ALWAYS, /* rotate whenever the sessions each fit (tests, A/B runs) */
};

/* no window cap: every admitted session fits entirely */
#define PLAN_NO_CAP UINT32_MAX
/* plan_assign.move_to when the session stays on its gpu */
#define PLAN_NO_GPU UINT32_MAX

struct plan_gpu {
    uint64_t vram_target;           /* bytes: cap for weights + kv + compute reserve */
    uint64_t weights_bytes;         /* reported by the worker */
    uint64_t compute_reserve_bytes; /* reported by the worker */
    /* measured at start-up, GB/s; 0 = unknown (never chosen) */
    double pcie_h2d_gbps;    /* pinned host -> device copy */
    double dev_attn_gbps;    /* attention over device kv (informational) */
    double host_stream_gbps; /* gpu attention reading host kv (zero-copy); 0 = use pcie */
    double cpu_attn_gbps;    /* cpu attention over host kv */
    double split_gbps;       /* WINDOW's tail where the worker splits it: cpu and link; 0 = no */
    uint8_t offline;         /* no worker serves it now: never a move or placement target */
};

struct plan_session {
    uint64_t id;
    uint32_t gpu;
    uint32_t n_blocks;           /* blocks needed now (including the one being written) */
    uint8_t active;              /* has work queued or running */
    uint8_t pinned;              /* operator: keep RESIDENT, never park, never window */
    enum plan_tactic cur_tactic; /* PLAN_WAIT for a new session */
    uint32_t cur_dev;            /* blocks on the device now */
    uint32_t cur_host;           /* host-only blocks now */
    uint64_t last_use;           /* any monotonic time unit; larger = more recent */
    uint8_t movable;             /* may move to another gpu (0: stays, e.g. moved lately) */
    /* rotation (units of now): turn_since is when its turn on the device started (turn_new)
     * or it began to wait (went from RESIDENT / WINDOW / CPU_TAIL to ROTATED); in_since is when it
     * last came onto the device after waiting. Both: when it arrived, for one that never rotated */
    uint64_t turn_since, in_since;
};

struct plan_input {
    enum plan_mode mode;
    uint64_t block_bytes;
    uint64_t host_budget; /* bytes */
    uint32_t margin_pct;  /* hysteresis margin, percent of device blocks (e.g. 5) */
    /* device blocks a running session keeps at least (its newest position block: the parts
     * of a sliding-window model's block, docs/runtime.md); 0 counts as 1 */
    uint32_t min_dev;
    /* idle sessions used within idle_grace of now (the units of last_use) are windowed
     * like active ones rather than parked (step 2b); 0: park at once */
    uint64_t now, idle_grace;
    /* rotation: off in plan_input_init; max_stall is the longest a rotated session may wait
     * for its turn (units of now; 0 = one second); ticks_per_s converts rates (0 = 1000) */
    enum plan_rotation rotation;
    uint64_t max_stall, ticks_per_s;
    uint32_t n_gpus;
    const struct plan_gpu *gpus; /* [n_gpus] */
    size_t n_sessions;
    const struct plan_session *sessions; /* [n_sessions], ids unique */
};

/* why a session got its tactic: the tactic-transition log's reason */
enum plan_reason {
    PLAN_WHY_FITS = 0,   /* resident: everything admitted fits */
    PLAN_WHY_PINNED,     /* resident: operator pinned */
    PLAN_WHY_IDLE,       /* parked: idle, its kv was already on the host */
    PLAN_WHY_IDLE_LRU,   /* parked now: least recently used idle under vram pressure */
    PLAN_WHY_VRAM_FULL,  /* window: vram cannot hold every admitted session */
    PLAN_WHY_CPU_FASTER, /* cpu_tail: the cpu attends faster than the link streams */
    PLAN_WHY_FORCED,     /* window / cpu_tail: the operator's mode */
    PLAN_WHY_HYSTERESIS, /* window: would fit, but not with the promotion margin */
    PLAN_WHY_QUEUED,     /* wait: no room for it now */
    PLAN_WHY_HOST_FULL,  /* dropped: the host cannot hold its kv */
    PLAN_WHY_TOO_BIG,    /* wait, never_fits */
    PLAN_WHY_REBALANCE,  /* moving to another gpu (move_to) */
    PLAN_WHY_TURN,       /* resident: its rotation turn */
    PLAN_WHY_ROTATION,   /* rotated: waits for its turn */
    PLAN_N_REASONS,
};

struct plan_assign {
    uint64_t id;
    enum plan_tactic tactic;
    uint32_t n_dev;   /* device blocks (the window for WINDOW/CPU_TAIL) */
    uint32_t n_host;  /* host blocks (the tail for WINDOW/CPU_TAIL) */
    uint32_t demote;  /* blocks to copy device -> host */
    uint32_t promote; /* blocks to copy host -> device */
    uint8_t dropped;  /* its kv is freed; rebuild from token history */
    enum plan_reason reason;
    uint8_t never_fits; /* WAIT, and larger than its gpu and the host even when
                         * alone: answer the request with an error */
    uint32_t move_to;   /* PLAN_NO_GPU, or the gpu it should move to (rebalance) */
    uint8_t turn_new;   /* rotation: a turn on the device starts now (turn_since = now) */
};

struct plan_gpu_summary {
    uint32_t dev_cap;    /* D, blocks */
    uint32_t dev_used;   /* blocks */
    uint32_t window_cap; /* W, or PLAN_NO_CAP */
    uint32_t sessions[PLAN_N_TACTICS];
    uint64_t bytes[PLAN_N_TACTICS]; /* kv bytes of those sessions (device + host) */
    uint32_t n_active;              /* admitted sessions with work (running) */
    uint8_t offline;                /* as in plan_gpu */
    /* rotation: a turn's length (units of now; 0 = the gpu does not rotate), the earliest
     * end of a holder's turn (plan again then), the sessions taking turns */
    uint64_t quantum, turn_end;
    uint32_t n_rotating;
    /* rotation's rate model where sessions overflow the device and each fits it (0: not
     * weighed): tokens/s rotating and spilling */
    double rot_tok_s, spill_tok_s;
    uint64_t last_swap; /* rotation: when a plan last ended turns there (they end a
                         * quarter of the places at a time, a quarter of a quantum apart) */
};

struct plan_summary {
    uint32_t n_gpus;
    uint32_t host_cap;  /* H, blocks */
    uint32_t host_used; /* blocks */
    uint32_t n_wait;    /* sessions not admitted */
    uint32_t n_dropped; /* sessions whose kv must be rebuilt */
    uint32_t n_never_fits;
    uint32_t n_moves;     /* sessions with demote or promote > 0 */
    uint32_t n_rebalance; /* sessions with move_to set */
    uint64_t blocks_demoted;
    uint64_t blocks_promoted;
    uint64_t next_turn; /* the earliest turn_end over the gpus; 0 = nobody rotates */
    const struct plan_gpu_summary *gpu; /* [n_gpus] */
};

struct plan;

/* an input with every field zero except margin_pct = 5 and mode auto */
void plan_input_init(struct plan_input *in);

/* computes a plan. prev: the previous plan (hysteresis) or NULL. *out is a new
 * plan to free with plan_destroy. RKV_EINVAL names the bad field in the log. */
int plan_compute(const struct plan_input *in, const struct plan *prev, struct plan **out);
void plan_destroy(struct plan *p);

/* assignments in input order, one per session */
size_t plan_n_assign(const struct plan *p);
const struct plan_assign *plan_assign_at(const struct plan *p, size_t i);
/* the assignment of session id, or NULL */
const struct plan_assign *plan_find(const struct plan *p, uint64_t id);
const struct plan_summary *plan_get_summary(const struct plan *p);

/* the gpu a new session of `need` blocks goes to, from plan p (its sessions'
 * usage) plus extra[g] blocks and extra_running[g] sessions placed since (both
 * may be NULL): among gpus not offline, those where it fits first, then the
 * most free device blocks, the fewest running, then `hint` (the gpu it was
 * offered on), then the lowest index. `hint` when p is NULL or every gpu is
 * offline. */
uint32_t plan_pick_gpu(const struct plan *p, uint32_t need, uint32_t hint, const uint32_t *extra,
                       const uint32_t *extra_running);

/* device / host capacity in blocks for one gpu / the host */
uint32_t plan_dev_cap(const struct plan_gpu *g, uint64_t block_bytes);
uint32_t plan_host_cap(uint64_t host_budget, uint64_t block_bytes);

const char *plan_tactic_name(enum plan_tactic t);
const char *plan_reason_name(enum plan_reason r);
const char *plan_mode_name(enum plan_mode m);
/* "auto|resident|window|cpu_tail" -> mode; 0 or RKV_EINVAL */
int plan_mode_parse(const char *s, enum plan_mode *out);
/* "off" "auto" "always" */
const char *plan_rotation_name(enum plan_rotation r);

#endif
