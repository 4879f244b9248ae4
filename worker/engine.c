/* engine.c - opens a GGUF model onto a backend (what rkv-gen, rkv-bench and workers share). */
#include "worker/engine.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"

int engine_open(struct engine *e, const char *path, const struct backend_opts *bo, char *errbuf,
                size_t errlen)
{
    memset(e, 0, sizeof(*e));
    int rc = gguf_open(path, &e->g, errbuf, errlen);
    if (rc < 0) {
        if (errbuf && !errbuf[0])
            snprintf(errbuf, errlen, "%s: %s", path, rkv_strerror(rc));
        return rc;
    }
    if ((rc = backend_create(bo, &e->be, errbuf, errlen)) < 0 ||
        (rc = model_load_gguf(e->be, e->g, path, &e->m, errbuf, errlen)) < 0) {
        engine_close(e);
        return rc;
    }
    if (tok_load_gguf(e->g, &e->tok, e->tok_err, sizeof(e->tok_err)) < 0)
        e->tok = NULL;
    return 0;
}

void engine_close(struct engine *e)
{
    tok_destroy(e->tok);
    model_destroy(e->m);
    backend_destroy(e->be);
    gguf_close(e->g);
    memset(e, 0, sizeof(*e));
}
