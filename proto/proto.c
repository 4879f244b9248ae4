/* proto.c - envelope encode/decode, message type names, version text. */
#include "proto/proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

static const char *const g_names[PROTO_MSG__MAX] = {
    [PROTO_MSG_ERROR] = "error",
    [PROTO_MSG_OK] = "ok",
    [PROTO_MSG_HELLO] = "hello",
    [PROTO_MSG_HELLO_ACK] = "hello_ack",
    [PROTO_MSG_WORKER_REPORT] = "worker_report",
    [PROTO_MSG_BUDGET_GET] = "budget_get",
    [PROTO_MSG_BUDGET] = "budget",
    [PROTO_MSG_BUDGET_SET] = "budget_set",
    [PROTO_MSG_MODE_GET] = "mode_get",
    [PROTO_MSG_MODE] = "mode",
    [PROTO_MSG_MODE_SET] = "mode_set",
    [PROTO_MSG_SESSION_CLOSE] = "session_close",
    [PROTO_MSG_TACTIC_EVENT] = "tactic_event",
    [PROTO_MSG_HISTOGRAM] = "histogram",
    [PROTO_MSG_STATUS_GET] = "status_get",
    [PROTO_MSG_STATUS] = "status",
    [PROTO_MSG_ADMIN_REQ] = "admin_req",
    [PROTO_MSG_ADMIN_RESP] = "admin_resp",
    [PROTO_MSG_EVENTS_GET] = "events_get",
    [PROTO_MSG_EVENTS] = "events",
    [PROTO_MSG_STEP_REQ] = "step_req",
    [PROTO_MSG_STEP_RESP] = "step_resp",
    [PROTO_MSG_KV_PREP] = "kv_prep",
    [PROTO_MSG_KV_TABLES] = "kv_tables",
};

int proto_msg_known(int type)
{
    return type > 0 && type < PROTO_MSG__MAX && g_names[type] != NULL;
}

const char *proto_msg_name(int type)
{
    return proto_msg_known(type) ? g_names[type] : "unknown";
}

int proto_msg_is_json(int type)
{
    return proto_msg_known(type) && type < PROTO_MSG_STEP_REQ;
}

int proto_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void proto_version_text(unsigned peer_version, char *buf, size_t len)
{
    snprintf(buf, len,
             "peer speaks rkv protocol v%u, this build speaks v%u: upgrade the older side",
             peer_version, (unsigned)PROTO_VERSION);
}

void proto_hdr_init(struct proto_hdr *h, int type, uint64_t req_id, uint32_t len)
{
    h->version = PROTO_VERSION;
    h->type = (uint16_t)type;
    h->req_id = req_id;
    h->flags = proto_msg_is_json(type) ? PROTO_FLAG_JSON : 0;
    h->len = len;
}

void proto_hdr_pack(const struct proto_hdr *h, uint8_t out[PROTO_HDR_SIZE])
{
    memcpy(out, PROTO_MAGIC, 4);
    proto_put_u16(out + 4, h->version);
    proto_put_u16(out + 6, h->type);
    proto_put_u64(out + 8, h->req_id);
    proto_put_u32(out + 16, h->flags);
    proto_put_u32(out + 20, h->len);
}

int proto_env_encode(int type, uint64_t req_id, const void *payload, size_t len, uint8_t **out,
                     size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (!proto_msg_known(type) || (len && !payload))
        return RKV_EINVAL;
    if (len > PROTO_MAX_PAYLOAD)
        return RKV_ETOOBIG;
    uint8_t *buf = malloc(PROTO_HDR_SIZE + len);
    if (!buf)
        return RKV_ENOMEM;
    struct proto_hdr h;
    proto_hdr_init(&h, type, req_id, (uint32_t)len);
    proto_hdr_pack(&h, buf);
    if (len)
        memcpy(buf + PROTO_HDR_SIZE, payload, len);
    *out = buf;
    *out_len = PROTO_HDR_SIZE + len;
    return 0;
}

int proto_env_decode(const void *buf, size_t len, struct proto_hdr *h, const void **payload,
                     char *err, size_t errlen)
{
    const uint8_t *p = buf;
    memset(h, 0, sizeof *h);
    *payload = NULL;
    if (len >= 4 && memcmp(p, PROTO_MAGIC, 4) != 0)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "not an rkv message: magic is %02x %02x %02x %02x, expected \"RKV1\"",
                            p[0], p[1], p[2], p[3]);
    if (len < PROTO_HDR_SIZE)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "truncated rkv message: %zu bytes, the header alone is %d", len,
                            PROTO_HDR_SIZE);
    h->version = proto_get_u16(p + 4);
    h->type = proto_get_u16(p + 6);
    h->req_id = proto_get_u64(p + 8);
    h->flags = proto_get_u32(p + 16);
    h->len = proto_get_u32(p + 20);
    int len_ok = (uint64_t)h->len == (uint64_t)len - PROTO_HDR_SIZE;
    if (h->version != PROTO_VERSION) {
        if (len_ok && h->len <= PROTO_MAX_PAYLOAD)
            *payload = p + PROTO_HDR_SIZE;
        char text[128];
        proto_version_text(h->version, text, sizeof text);
        return proto_seterr(err, errlen, RKV_EVERSION, "%s", text);
    }
    if (!proto_msg_known(h->type))
        return proto_seterr(err, errlen, RKV_EFORMAT, "unknown rkv message type %u", h->type);
    const char *name = proto_msg_name(h->type);
    uint32_t want_flags = proto_msg_is_json(h->type) ? PROTO_FLAG_JSON : 0;
    if (h->flags != want_flags)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: flags 0x%x, expected 0x%x (bit 0 set for JSON, others zero)", name,
                            h->flags, want_flags);
    if (h->len > PROTO_MAX_PAYLOAD)
        return proto_seterr(err, errlen, RKV_ETOOBIG,
                            "%s: payload of %u bytes is over the %u limit", name, h->len,
                            PROTO_MAX_PAYLOAD);
    if (!len_ok)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: header says %u payload bytes, message has %zu", name, h->len,
                            len - PROTO_HDR_SIZE);
    *payload = p + PROTO_HDR_SIZE;
    return 0;
}
