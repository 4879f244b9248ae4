/* err.c - text for rkv error codes. */
#include "common/err.h"

#include <string.h>

const char *rkv_strerror(int err)
{
    switch (err) {
    case RKV_OK: return "success";
    case RKV_EINVAL: return "invalid argument";
    case RKV_ENOMEM: return "out of memory";
    case RKV_EIO: return "input/output error";
    case RKV_EFORMAT: return "malformed input";
    case RKV_ERANGE: return "value out of range";
    case RKV_ENOTFOUND: return "not found";
    case RKV_EUNSUPPORTED: return "not supported";
    case RKV_ETIMEOUT: return "timed out";
    case RKV_ECLOSED: return "connection closed";
    case RKV_EPROTO: return "protocol error";
    case RKV_EVERSION: return "protocol version mismatch";
    case RKV_EBUSY: return "busy, try again later";
    case RKV_ENOSPACE: return "budget exhausted";
    case RKV_ESTATE: return "not valid in the current state";
    case RKV_ECUDA: return "CUDA error";
    case RKV_ENODEV: return "no GPU device";
    case RKV_ETOOBIG: return "too large";
    case RKV_EAUTH: return "authentication failed";
    case RKV_EINTERNAL: return "internal error";
    case RKV_EPERM: return "not permitted";
    case RKV_ESTALE: return "kv dropped: recompute it from the token history";
    default: break;
    }
    if (err < 0 && err > -4096)
        return strerror(-err); /* glibc: thread-safe for known codes */
    return "unknown error";
}
