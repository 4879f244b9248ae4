/* evring.h - kvmgr's last tactic events, numbered, so rkvd can fetch what pub/sub dropped. */
#ifndef RKV_KVMGR_EVRING_H
#define RKV_KVMGR_EVRING_H

#include <stdint.h>

#include "proto/msg.h"

/*
 * pub/sub loses what is published while no subscriber is connected (rkvd
 * starting, reconnecting after a kvmgr restart). So kvmgr numbers each
 * tactic event (1, 2, ... per process), keeps the last cap of them here,
 * reports the newest number in STATUS, and answers EVENTS_GET {since} from
 * here; rkvd asks whenever STATUS shows a number it has not seen.
 */

struct evring;

/* cap > 0 events; RKV_EINVAL, RKV_ENOMEM */
int evring_create(uint32_t cap, struct evring **out);
/* NULL is fine */
void evring_destroy(struct evring *r);
/* numbers ev (ev->seq = the last seq + 1) and keeps a copy, over the oldest
 * when the ring is full; returns the seq */
uint64_t evring_push(struct evring *r, struct proto_tactic_event *ev);
/* the newest seq, 0 before the first event */
uint64_t evring_last_seq(const struct evring *r);
/* the oldest seq still held, 0 when none */
uint64_t evring_first_seq(const struct evring *r);
/* the EVENTS reply to EVENTS_GET {since}: the events after since, oldest
 * first, at most PROTO_MAX_EVENTS; dropped counts those after since that
 * the ring no longer holds. kvmgr_pid is left to the caller. */
void evring_fill(const struct evring *r, uint64_t since, struct proto_events *out);

#endif
