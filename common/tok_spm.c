/* tok_spm.c - sentencepiece (llama.cpp style): U+2581 spaces, best-score bigram merges, byte
 * fallback. */
#include <string.h>

#include "common/err.h"
#include "common/tok_int.h"

static const char spm_space[] = "\xe2\x96\x81"; /* U+2581, how sentencepiece writes ' ' */

static int spm_pair(const struct tok_enc *e, const struct tok_sym *l, const struct tok_sym *r,
                    double *key, int32_t *id)
{
    /* symbols are adjacent slices of e->buf, so the pair is one slice */
    int32_t m = tok_find(e->t, e->buf + l->start, (size_t)l->len + r->len);
    if (m < 0)
        return 0;
    *key = -(double)e->t->ent[m].score;
    *id = m;
    return 1;
}

int tok_spm_encode(struct tok_enc *e, const char *s, size_t len)
{
    const struct tok *t = e->t;
    int rc;
    if (len > INT32_MAX / 4)
        return RKV_ETOOBIG;
    /* escape: optional leading space, every ' ' as U+2581 */
    if ((rc = tok_enc_grow((void **)&e->buf, &e->buf_cap, 3 * len + 3, 1)) < 0)
        return rc;
    size_t n = 0;
    if (t->add_space_prefix) {
        memcpy(e->buf, spm_space, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(e->buf + n, spm_space, 3);
            n += 3;
        } else {
            e->buf[n++] = s[i];
        }
    }
    /* one symbol per utf-8 char; a byte that is not part of a valid char is
     * a symbol of its own so byte fallback reproduces it exactly */
    if ((rc = tok_enc_grow(&e->sym, &e->sym_cap, n, sizeof(struct tok_sym))) < 0)
        return rc;
    struct tok_sym *sym = e->sym;
    const uint8_t *b = (const uint8_t *)e->buf;
    size_t nsym = 0;
    for (size_t i = 0; i < n;) {
        size_t cl;
        if (tok_utf8_scan(b + i, n - i, &cl) != TOK_UTF8_OK)
            cl = 1;
        sym[nsym] = (struct tok_sym){.id = tok_find(t, e->buf + i, cl),
                                     .prev = (int32_t)nsym - 1,
                                     .next = (int32_t)nsym + 1,
                                     .start = (uint32_t)i,
                                     .len = (uint32_t)cl};
        nsym++;
        i += cl;
    }
    if (!nsym)
        return 0;
    sym[nsym - 1].next = -1;
    if ((rc = tok_merge_run(e, nsym, spm_pair)) < 0)
        return rc;
    sym = e->sym;
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) {
            tok_enc_push(e, sym[i].id);
            continue;
        }
        /* byte fallback: <0xXX> for each byte; <unk> when the vocab has none */
        int all = 1;
        for (uint32_t k = 0; k < sym[i].len; k++)
            all = all && t->byte_tok[b[sym[i].start + k]] >= 0;
        if (all) {
            for (uint32_t k = 0; k < sym[i].len; k++)
                tok_enc_push(e, t->byte_tok[b[sym[i].start + k]]);
        } else if (t->unk >= 0) {
            tok_enc_push(e, t->unk);
        }
    }
    return 0;
}
