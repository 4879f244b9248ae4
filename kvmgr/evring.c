/* evring.c - a fixed ring of numbered tactic events. */
#include "kvmgr/evring.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

struct evring {
    uint32_t cap;
    uint64_t last;                 /* the newest seq; event seq lives at slot (seq - 1) % cap */
    struct proto_tactic_event *ev; /* (cap) */
};

int evring_create(uint32_t cap, struct evring **out)
{
    *out = NULL;
    if (!cap)
        return RKV_EINVAL;
    struct evring *r = calloc(1, sizeof *r);
    if (!r || !(r->ev = calloc(cap, sizeof *r->ev))) {
        free(r);
        return RKV_ENOMEM;
    }
    r->cap = cap;
    *out = r;
    return 0;
}

void evring_destroy(struct evring *r)
{
    if (!r)
        return;
    free(r->ev);
    free(r);
}

uint64_t evring_push(struct evring *r, struct proto_tactic_event *ev)
{
    ev->seq = ++r->last;
    r->ev[(ev->seq - 1) % r->cap] = *ev;
    return ev->seq;
}

uint64_t evring_last_seq(const struct evring *r)
{
    return r->last;
}

uint64_t evring_first_seq(const struct evring *r)
{
    if (!r->last)
        return 0;
    return r->last > r->cap ? r->last - r->cap + 1 : 1;
}

void evring_fill(const struct evring *r, uint64_t since, struct proto_events *out)
{
    uint64_t first = evring_first_seq(r);
    out->first_seq = first;
    out->last_seq = r->last;
    out->dropped = 0;
    out->n_events = 0;
    if (since >= r->last)
        return;
    uint64_t from = since + 1;
    if (from < first) {
        out->dropped = first - from;
        from = first;
    }
    for (uint64_t s = from; s <= r->last && out->n_events < PROTO_MAX_EVENTS; s++)
        out->events[out->n_events++] = r->ev[(s - 1) % r->cap];
}
