/* attn_route.h - where a device backend's host KV blocks are attended when not on the device:
 * the worker's cpu threads over the host pool. The router owns the cpu backend that does it and
 * hands the device backend a callback (struct be_host_attend), so no backend holds or calls
 * another; the device backend copies q down and the partial up and merges it. */
#ifndef RKV_ATTN_ROUTE_H
#define RKV_ATTN_ROUTE_H

#include <stdint.h>

#include "worker/backend.h"

struct attn_route;

/* a router whose cpu backend (n_threads, 0 = online cpus) starts at its first call */
int attn_route_create(uint32_t n_threads, struct attn_route **out);
void attn_route_destroy(struct attn_route *r);
/* the pools the device backend was given: the cpu reads the host pool's blocks only */
int attn_route_set_kv(struct attn_route *r, const struct kv_layout *l, const struct kv_pools *p);
/* the callback a device backend's set_host_attend takes; valid while r lives */
const struct be_host_attend *attn_route_host(struct attn_route *r);

#endif
