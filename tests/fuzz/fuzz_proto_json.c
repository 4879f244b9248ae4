/* fuzz_proto_json.c - every control message decoder (the first byte picks the type); accepted ones
 * round-trip. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/json.h"
#include "proto/msg.h"

/* every type with a schema, in type order (the corpus's first bytes index this list) */
static int g_types[PROTO_MSG__MAX], g_n_types;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_n_types)
        for (int t = 1; t < PROTO_MSG__MAX; t++)
            if (proto_msg_schema(t))
                g_types[g_n_types++] = t;
    if (size < 1)
        return 0;
    int type = g_types[data[0] % g_n_types];
    const struct proto_schema *s = proto_msg_schema(type);
    if (!s)
        __builtin_trap();
    void *msg = malloc(s->size), *back = malloc(s->size);
    char err[256] = "";
    int rc = proto_json_decode(type, (const char *)data + 1, size - 1, msg, err, sizeof err);
    if (rc < 0 && rc != RKV_EFORMAT && rc != RKV_ERANGE && rc != RKV_ETOOBIG)
        __builtin_trap();
    if (rc < 0 && !err[0])
        __builtin_trap();
    if (rc == 0) {
        /* what was accepted encodes, and decodes back to the same struct */
        char *json, *again;
        size_t len, len2;
        if (proto_json_encode(type, msg, &json, &len, err, sizeof err) != 0)
            __builtin_trap();
        if (proto_json_decode(type, json, len, back, err, sizeof err) != 0)
            __builtin_trap();
        if (memcmp(msg, back, s->size) != 0)
            __builtin_trap();
        if (proto_json_encode(type, back, &again, &len2, err, sizeof err) != 0 || len != len2 ||
            memcmp(json, again, len) != 0)
            __builtin_trap();
        free(json);
        free(again);
    }
    free(msg);
    free(back);
    return 0;
}
