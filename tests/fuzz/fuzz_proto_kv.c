/* fuzz_proto_kv.c - KV_PREP and KV_TABLES decoders (the first byte picks one); accepted ones
 * re-encode exactly. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "proto/kvwire.h"

static void same(struct proto_wbuf *w, int rc, const uint8_t *data, size_t size)
{
    if (rc != 0 || w->len != size || (size && memcmp(w->data, data, size) != 0))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int which = data[0] & 1;
    data++;
    size--;
    char err[256] = "";
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    int rc;
    if (which == 0) {
        struct proto_kv_prep *m;
        rc = proto_kv_prep_decode(data, size, &m, err, sizeof err);
        if (rc == 0)
            same(&w, proto_kv_prep_encode(m, &w, err, sizeof err), data, size);
        if (rc == 0)
            proto_kv_prep_destroy(m);
    } else {
        struct proto_kv_tables *m;
        rc = proto_kv_tables_decode(data, size, &m, err, sizeof err);
        if (rc == 0)
            same(&w, proto_kv_tables_encode(m, &w, err, sizeof err), data, size);
        if (rc == 0)
            proto_kv_tables_destroy(m);
    }
    if (rc != 0 && (rc != RKV_EFORMAT || !err[0]))
        __builtin_trap();
    proto_wbuf_fini(&w);
    return 0;
}
