/* fuzz_proto_env.c - arbitrary bytes through the envelope decoder; accepted ones re-encode exactly.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_hdr h;
    const void *payload;
    char err[256];
    int rc = proto_env_decode(data, size, &h, &payload, err, sizeof err);
    if (rc != 0 && rc != RKV_EFORMAT && rc != RKV_ETOOBIG && rc != RKV_EVERSION)
        __builtin_trap();
    if (rc < 0 && (!err[0] || strlen(err) >= sizeof err))
        __builtin_trap();
    if (rc != 0)
        return 0;
    if (payload != data + PROTO_HDR_SIZE || h.len != size - PROTO_HDR_SIZE)
        __builtin_trap();
    uint8_t *out;
    size_t len;
    if (proto_env_encode(h.type, h.req_id, payload, h.len, &out, &len) != 0)
        __builtin_trap();
    if (len != size || memcmp(out, data, size) != 0)
        __builtin_trap();
    free(out);
    return 0;
}
