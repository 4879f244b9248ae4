/* err.h - rkv error codes: 0 or a negative code, errno values included. */
#ifndef RKV_ERR_H
#define RKV_ERR_H

/* rkv's own codes sit below -4096 so they never collide with -errno. */
enum rkv_err {
    RKV_OK = 0,
    RKV_EINVAL = -4097,   /* bad argument or value */
    RKV_ENOMEM = -4098,   /* allocation failed */
    RKV_EIO = -4099,      /* read/write/map failed */
    RKV_EFORMAT = -4100,  /* malformed input (file, message, text) */
    RKV_ERANGE = -4101,   /* value out of its allowed range */
    RKV_ENOTFOUND = -4102,/* named thing does not exist */
    RKV_EUNSUPPORTED = -4103, /* valid but not supported by rkv */
    RKV_ETIMEOUT = -4104, /* peer did not answer in time */
    RKV_ECLOSED = -4105,  /* peer or socket went away */
    RKV_EPROTO = -4106,   /* protocol violation by a peer */
    RKV_EVERSION = -4107, /* peer speaks another protocol version */
    RKV_EBUSY = -4108,    /* resource busy / queue full, try later */
    RKV_ENOSPACE = -4109, /* budget or pool exhausted */
    RKV_ESTATE = -4110,   /* operation not valid in the current state */
    RKV_ECUDA = -4111,    /* a CUDA call failed */
    RKV_ENODEV = -4112,   /* no GPU present */
    RKV_ETOOBIG = -4113,  /* input larger than a limit */
    RKV_EAUTH = -4114,    /* authentication failed */
    RKV_EINTERNAL = -4115,/* invariant broken: a bug */
    RKV_EPERM = -4116,    /* authenticated, but this key may not do that */
    RKV_ESTALE = -4117,   /* the kv needed is gone: recompute it from the token history */
};

/* text for any rkv code or negative errno; never NULL */
const char *rkv_strerror(int err);

#endif
