/* server.h - kvmgr's request server: KV pools, the tactic plan and block tables, over nng. */
#ifndef RKV_KVMGR_SERVER_H
#define RKV_KVMGR_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "kvmgr/blocks.h"

#define KVMGR_MAX_GPUS KVB_MAX_GPUS

/* the configuration (main.c's table fills it) */
struct kvmgr_conf {
    char runtime_dir[512];
    char listen[600];
    char pub[600];
    int backend;
    uint64_t vram_target;
    uint64_t host_budget;
    uint64_t compute_reserve;
    int64_t block_size;
    int mode;
    int64_t workers;
    int64_t margin_pct;
    int64_t park_after_ms;
    int rotation;         /* enum plan_rotation */
    int64_t max_stall_ms; /* longest a rotated session waits for its turn */
    int log_level;
};

struct kvmgr;

/* listens on c->listen (req/rep) and c->pub (tactic events, histograms); pools come with the
 * first worker's HELLO. errors name the socket, with text in err */
int kvmgr_create(const struct kvmgr_conf *c, struct kvmgr **out, char *err, size_t errlen);
/* NULL is fine */
void kvmgr_destroy(struct kvmgr *k);
/* answers one request, waiting up to timeout_ms for it: 0, RKV_ETIMEOUT or -EAGAIN when none
 * came, or the decode error of a bad request (answered with an ERROR; text in err) */
int kvmgr_serve(struct kvmgr *k, int timeout_ms, char *err, size_t errlen);
/* the periodic work, every 100 ms: pools a maker thread finished, a re-plan when something
 * changed, each second the tails and histograms published; heals the pub listener */
void kvmgr_tick(struct kvmgr *k, uint64_t now_ms);

#endif
