/* proto.h - the rkv message envelope: header layout, message types, version check. */
#ifndef RKV_PROTO_H
#define RKV_PROTO_H

#include <stddef.h>
#include <stdint.h>

/*
 * Every message between rkv processes is one envelope:
 *
 *   offset size  field
 *        0    4  magic "RKV1"
 *        4    2  protocol version (u16 le), PROTO_VERSION
 *        6    2  message type (u16 le), enum proto_msg
 *        8    8  request id (u64 le), echoed by the reply
 *       16    4  flags (u32 le): bit 0 = payload is JSON, other bits zero
 *       20    4  payload length (u32 le), at most PROTO_MAX_PAYLOAD
 *       24  len  payload: JSON text (control messages, proto/json.h)
 *                or little-endian binary (hot path, proto/wire.h)
 *
 * The header layout and the ERROR payload ({"code","message"} JSON) are frozen
 * across protocol versions, so two builds that disagree on the version can
 * still tell each other so (see proto_version_text).
 */

#define PROTO_MAGIC       "RKV1"
#define PROTO_VERSION     1
#define PROTO_HDR_SIZE    24
#define PROTO_MAX_PAYLOAD (64u << 20)
#define PROTO_FLAG_JSON   1u

/* message types; the numbers are on the wire, never renumber. 12, 14, 19 and
 * 66 are retired (session_open, session_active, epoch_ack, block_table: block
 * tables and their acks travel in KV_PREP / KV_TABLES and STEP_REQ); never
 * reuse them */
enum proto_msg {
    PROTO_MSG_NONE = 0,
    /* control messages, JSON payload (structs in proto/msg.h) */
    PROTO_MSG_ERROR = 1,
    PROTO_MSG_OK = 2,
    PROTO_MSG_HELLO = 3,
    PROTO_MSG_HELLO_ACK = 4,
    PROTO_MSG_WORKER_REPORT = 5,
    PROTO_MSG_BUDGET_GET = 6,
    PROTO_MSG_BUDGET = 7,
    PROTO_MSG_BUDGET_SET = 8,
    PROTO_MSG_MODE_GET = 9,
    PROTO_MSG_MODE = 10,
    PROTO_MSG_MODE_SET = 11,
    PROTO_MSG_SESSION_CLOSE = 13,
    PROTO_MSG_TACTIC_EVENT = 15,
    PROTO_MSG_HISTOGRAM = 16,
    PROTO_MSG_STATUS_GET = 17,
    PROTO_MSG_STATUS = 18,
    /* rkvctl <-> rkvd admin socket: free-form JSON, {"cmd","args"} and
     * {"ok":true,"result":...} (daemon/admin.h); no fixed schema */
    PROTO_MSG_ADMIN_REQ = 20,
    PROTO_MSG_ADMIN_RESP = 21,
    /* rkvd -> kvmgr: the tactic events kvmgr numbered after a sequence number */
    PROTO_MSG_EVENTS_GET = 22,
    PROTO_MSG_EVENTS = 23,
    /* hot-path messages, binary payload (proto/wire.h) */
    PROTO_MSG_STEP_REQ = 64,
    PROTO_MSG_STEP_RESP = 65,
    PROTO_MSG_KV_PREP = 67,   /* rkvd -> kvmgr before a step (proto/kvwire.h) */
    PROTO_MSG_KV_TABLES = 68, /* kvmgr -> rkvd: the step's block tables */
    PROTO_MSG__MAX = 127, /* types are < this */
};

struct proto_hdr {
    uint16_t version; /* PROTO_VERSION when sent by this build */
    uint16_t type;    /* enum proto_msg */
    uint64_t req_id;
    uint32_t flags; /* PROTO_FLAG_JSON for control messages */
    uint32_t len;   /* payload bytes */
};

/* lowercase name of a message type ("hello_ack"), "unknown" when it is none */
const char *proto_msg_name(int type);
/* 1 for a known control (JSON) message, 0 otherwise */
int proto_msg_is_json(int type);
/* 1 for any known message type */
int proto_msg_known(int type);

/* a header for a message this build sends: PROTO_VERSION, flags from the type */
void proto_hdr_init(struct proto_hdr *h, int type, uint64_t req_id, uint32_t len);

/* writes the 24 header bytes as given (version included, so tests can speak
 * another version); no checks */
void proto_hdr_pack(const struct proto_hdr *h, uint8_t out[PROTO_HDR_SIZE]);

/* builds header + payload in one malloc'd buffer (*out, free with free()).
 * version = PROTO_VERSION, flags from the type. RKV_EINVAL for an unknown
 * type, RKV_ETOOBIG over PROTO_MAX_PAYLOAD. */
int proto_env_encode(int type, uint64_t req_id, const void *payload, size_t len, uint8_t **out,
                     size_t *out_len);

/* parses and checks an envelope of exactly len bytes; *payload points into
 * buf. errors, with text in err (may be NULL):
 *   RKV_EFORMAT  truncated, bad magic, unknown type, wrong flags, length
 *                not matching the buffer
 *   RKV_ETOOBIG  declared payload over PROTO_MAX_PAYLOAD
 *   RKV_EVERSION version differs; *h is still filled (and *payload set when
 *                the length matches) so an ERROR reply from a peer of
 *                another version can be read */
int proto_env_decode(const void *buf, size_t len, struct proto_hdr *h, const void **payload,
                     char *err, size_t errlen);

/* "peer speaks rkv protocol v2, this build speaks v1: upgrade the older side" */
void proto_version_text(unsigned peer_version, char *buf, size_t len);

/* formats into err (when err && errlen) and returns code; a helper for the
 * decoders here and for modules that validate messages of their own */
int proto_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* little-endian loads and stores used by every codec in proto/ */
static inline void proto_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void proto_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void proto_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t proto_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t proto_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t proto_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#endif
