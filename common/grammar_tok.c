/* grammar_tok.c - a grammar vocabulary from a tokenizer: apart from grammar.c, which uses libc
 * alone, so the engine (the gpu programs' library) links the sampler's grammars without the
 * tokenizer's pcre2. */
#include "common/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/tok.h"

int grammar_vocab_from_tok(struct grammar_vocab **out, const struct tok *t)
{
    if (!out || !t)
        return RKV_EINVAL;
    int32_t n = tok_n_vocab(t);
    if (n <= 0)
        return RKV_EINVAL;
    char **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *eog = calloc((size_t)n, 1);
    int rc = RKV_ENOMEM;
    if (!bytes || !lens || !eog)
        goto out;
    for (int32_t i = 0; i < n; i++) {
        eog[i] = tok_is_eog(t, i) != 0;
        if (eog[i] || tok_is_control(t, i))
            continue;
        char buf[256];
        int l = tok_token_bytes(t, i, 0, buf, sizeof buf);
        if (l <= 0)
            continue;
        bytes[i] = malloc((size_t)l);
        if (!bytes[i])
            goto out;
        if ((size_t)l > sizeof buf)
            tok_token_bytes(t, i, 0, bytes[i], (size_t)l);
        else
            memcpy(bytes[i], buf, (size_t)l);
        lens[i] = (uint32_t)l;
    }
    rc = grammar_vocab_create(out, n, (const char *const *)bytes, lens, eog);
out:
    if (bytes)
        for (int32_t i = 0; i < n; i++)
            free(bytes[i]);
    free(bytes);
    free(lens);
    free(eog);
    return rc;
}
