/* backend_impl.h - what backend implementations share: the tensor handle's fields. */
#ifndef RKV_BACKEND_IMPL_H
#define RKV_BACKEND_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"

struct attn_route;

struct backend {
    char name[16];
    const struct backend_i *iface;
    void *ctx;
    struct attn_route *route; /* a device backend's host attention (set_host_attend), or NULL */
};

/* read by backend_ops.c's shape checks and by the backend that owns it */
struct be_tensor {
    enum be_type type;
    uint32_t rows;
    uint32_t cols;
    size_t row_bytes;
    size_t nbytes;
    void *data; /* backend memory (host for cpu, device for cuda) */
};

#endif
