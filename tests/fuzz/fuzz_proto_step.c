/* fuzz_proto_step.c - STEP_REQ and STEP_RESP decoders (the first byte picks one); accepted ones
 * re-encode exactly. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/wire.h"

/* the decoded message re-encoded must be the input, byte for byte */
static void same(struct proto_wbuf *w, int rc, const uint8_t *data, size_t size)
{
    if (rc != 0 || w->len != size || (size && memcmp(w->data, data, size) != 0))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int which = data[0] % 2;
    data++;
    size--;
    char err[256] = "";
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    int rc;
    if (which == 0) {
        struct proto_step_req *m;
        rc = proto_step_req_decode(data, size, &m, err, sizeof err);
        if (rc == 0)
            same(&w, proto_step_req_encode(m, &w, err, sizeof err), data, size);
        proto_step_req_destroy(rc == 0 ? m : NULL);
    } else {
        struct proto_step_resp *m;
        rc = proto_step_resp_decode(data, size, &m, err, sizeof err);
        if (rc == 0)
            same(&w, proto_step_resp_encode(m, &w, err, sizeof err), data, size);
        proto_step_resp_destroy(rc == 0 ? m : NULL);
    }
    if (rc != 0 && (rc != RKV_EFORMAT || !err[0]))
        __builtin_trap();
    proto_wbuf_fini(&w);
    return 0;
}
