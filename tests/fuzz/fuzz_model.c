/* fuzz_model.c - any GGUF bytes are loaded as a model on the cpu backend or refused with a message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/log.h"
#include "worker/backend.h"
#include "worker/model.h"

static struct backend *g_be;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_be) {
        rkv_log_set_level(RKV_LOG_ERROR);
        struct backend_opts o = {.kind = "cpu", .n_threads = 1};
        char err[256];
        if (backend_create(&o, &g_be, err, sizeof err) != 0)
            abort();
    }
    struct gguf_ctx *g;
    char err[512] = "";
    if (gguf_open_mem(data, size, &g, err, sizeof err) != 0)
        return 0;
    struct model *m = NULL;
    err[0] = 0;
    int rc = model_load_gguf(g_be, g, "fuzz.gguf", &m, err, sizeof err);
    if (rc == 0) {
        if (!m)
            abort();
        model_destroy(m);
    } else if (!err[0] && rc != RKV_ENOMEM) {
        abort(); /* every refusal names what is wrong */
    }
    gguf_close(g);
    return 0;
}
