/* engine.h - a model file opened onto a backend: gguf mapping, backend, weights, tokenizer. */
#ifndef RKV_ENGINE_H
#define RKV_ENGINE_H

#include <stddef.h>

#include "common/gguf.h"
#include "common/tok.h"
#include "worker/backend.h"
#include "worker/model.h"

struct engine {
    struct gguf_ctx *g; /* the mapping the weights were read from */
    struct backend *be;
    struct model *m;
    struct tok *tok;   /* NULL when the file has no usable tokenizer */
    char tok_err[256]; /* why tok is NULL */
};

/* opens path, starts the backend and uploads the weights. errors name the
 * file and what is wrong with it. */
int engine_open(struct engine *e, const char *path, const struct backend_opts *bo, char *errbuf,
                size_t errlen);
void engine_close(struct engine *e);

#endif
