/* fuzz_grammar.c - GBNF or schema text -> grammar -> masks that agree with token-by-token tries. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "common/json_schema.h"

/* input: [mode] then text. mode bit 0: 0 = GBNF, 1 = JSON Schema; the other bits seed the
 * token picks. a small vocab of JSON pieces, single bytes and split utf-8. */
static const char *const PIECES[] = {
    "{",   "}",   "[",   "]",   ",",  ":",    " ",    "\n",       "\"",           "\\",    "a",
    "b",   "z",   "0",   "1",   "9",  "-",    ".",    "e",        "true",         "false", "null",
    "{\"", "\":", "\",", "\"}", "ab", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82\xac", "\\u00", "x\"",
    "]}",  "\t",  "A",   "_",   "@",
};
#define NP ((int32_t)(sizeof PIECES / sizeof PIECES[0]))
#define NV (NP + 1) /* + an eog token */

static struct grammar_vocab *vocab(void)
{
    static struct grammar_vocab *v;
    if (!v) {
        const char *p[NV];
        uint32_t l[NV];
        uint8_t eog[NV] = {0};
        for (int32_t i = 0; i < NP; i++) {
            p[i] = PIECES[i];
            l[i] = (uint32_t)strlen(PIECES[i]);
        }
        p[NP] = NULL;
        l[NP] = 0;
        eog[NP] = 1;
        if (grammar_vocab_create(&v, NV, p, l, eog))
            abort();
    }
    return v;
}

static void run(const struct grammar *g, uint32_t seed)
{
    struct grammar_matcher *m = NULL, *ref = NULL;
    if (grammar_matcher_create(&m, g, vocab()) || grammar_matcher_create(&ref, g, vocab()))
        abort();
    char text[1024];
    size_t tl = 0;
    uint32_t mask[(NV + 31) / 32];
    for (int step = 0; step < 12; step++) {
        if (grammar_matcher_mask(m, mask))
            abort();
        int32_t allowed[NV];
        int na = 0;
        for (int32_t id = 0; id < NV; id++) {
            int bit = (int)(mask[id >> 5] >> (id & 31) & 1);
            int want;
            if (id == NP) {
                want = grammar_matcher_can_end(m);
            } else {
                grammar_matcher_reset(ref);
                want = grammar_matcher_accept_bytes(ref, text, tl) == 0 &&
                       grammar_matcher_accept_bytes(ref, PIECES[id], strlen(PIECES[id])) == 0;
            }
            /* eog may also stand in when nothing else is allowed */
            if (bit != want && !(id == NP && bit && na == 0))
                abort();
            if (bit)
                allowed[na++] = id;
        }
        if (!na)
            abort(); /* never empty before the end */
        if (grammar_matcher_must_end(m) && (na != 1 || allowed[0] != NP))
            abort();
        seed = seed * 1103515245u + 12345u;
        int32_t pick = allowed[(seed >> 16) % (uint32_t)na];
        if (grammar_matcher_accept(m, pick))
            abort();
        if (pick == NP)
            break;
        size_t pl = strlen(PIECES[pick]);
        if (tl + pl > sizeof text)
            break;
        memcpy(text + tl, PIECES[pick], pl);
        tl += pl;
    }
    grammar_matcher_destroy(m);
    grammar_matcher_destroy(ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *gbnf = NULL;
    struct grammar *g = NULL;
    if (mode & 1) {
        if (json_schema_to_gbnf(text, len, &gbnf, NULL, 0))
            return 0;
        /* what the schema compiler emits always compiles */
        if (grammar_compile(gbnf, strlen(gbnf), &g, NULL, 0))
            abort();
    } else {
        char err[256];
        if (grammar_compile(text, len, &g, err, sizeof err))
            return 0;
    }
    run(g, mode >> 1);
    grammar_destroy(g);
    free(gbnf);
    return 0;
}
