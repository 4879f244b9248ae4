/* rkv-grammar - random constrained generations and mask timing for a schema or a GBNF grammar. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/grammar.h"
#include "common/json_schema.h"
#include "common/strbuf.h"
#include "common/tok.h"
#include "common/util.h"

static const char usage[] =
    "usage: rkv-grammar (--schema FILE | --gbnf FILE | --json-object) --model GGUF [options]\n"
    "  --schema FILE    a JSON Schema (structured output's subset); \"-\" = stdin\n"
    "  --gbnf FILE      a GBNF grammar whose start rule is root\n"
    "  --json-object    any JSON object (response_format json_object)\n"
    "  --model GGUF     the vocabulary: a model file (a generated one from rkv-mkmodel works)\n"
    "  --samples N      random generations to draw (default 10); each is one JSON line\n"
    "                   {\"sample\", \"text\", \"tokens\", \"end\"} with end \"eog\" (sampled),\n"
    "                   \"complete\" (nothing but eog could follow) or \"limit\"\n"
    "  --seed S         random seed (default 1)\n"
    "  --max-tokens N   give up a generation after N tokens (default 4096)\n"
    "  --soft-len N     after N tokens, favour eog and tokens that close strings, arrays\n"
    "                   and objects (and other punctuation), disfavour tokens that open\n"
    "                   arrays and objects, more with every token (default 48)\n"
    "  --bench          time every mask (thread cpu time); print median, p99 and max per\n"
    "                   mask on stderr as one JSON line\n"
    "  --print-gbnf     print the grammar (a schema's compiled GBNF) and exit\n";

struct opts {
    const char *schema, *gbnf, *model;
    int json_object, bench, print_gbnf;
    long samples, max_tokens, soft_len;
    unsigned long long seed;
};

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(void)
{
    return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

static void put_json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    o->samples = 10;
    o->seed = 1;
    o->max_tokens = 4096;
    o->soft_len = 48;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--schema"))
            o->schema = v;
        else if (!strcmp(a, "--gbnf"))
            o->gbnf = v;
        else if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--samples"))
            o->samples = v ? strtol(v, NULL, 10) : -1;
        else if (!strcmp(a, "--seed"))
            o->seed = v ? strtoull(v, NULL, 10) : 0;
        else if (!strcmp(a, "--max-tokens"))
            o->max_tokens = v ? strtol(v, NULL, 10) : -1;
        else if (!strcmp(a, "--soft-len"))
            o->soft_len = v ? strtol(v, NULL, 10) : -1;
        else {
            takes = 0;
            if (!strcmp(a, "--json-object"))
                o->json_object = 1;
            else if (!strcmp(a, "--bench"))
                o->bench = 1;
            else if (!strcmp(a, "--print-gbnf"))
                o->print_gbnf = 1;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                fputs(usage, stdout);
                exit(0);
            } else {
                fprintf(stderr, "rkv-grammar: unknown option %s\n%s", a, usage);
                return -1;
            }
        }
        if (takes) {
            if (!v) {
                fprintf(stderr, "rkv-grammar: %s needs a value\n", a);
                return -1;
            }
            i++;
        }
    }
    if ((o->schema != NULL) + (o->gbnf != NULL) + o->json_object != 1) {
        fprintf(stderr, "rkv-grammar: give one of --schema, --gbnf, --json-object\n%s", usage);
        return -1;
    }
    if (!o->model && !o->print_gbnf) {
        fprintf(stderr, "rkv-grammar: --model is required\n");
        return -1;
    }
    if (o->samples < 0 || o->max_tokens <= 0 || o->soft_len < 0) {
        fprintf(stderr, "rkv-grammar: --samples, --max-tokens, --soft-len take counts\n");
        return -1;
    }
    return 0;
}

/* the grammar text of the options (malloc'd) */
static int load_gbnf(const struct opts *o, char **out)
{
    char err[512];
    if (o->json_object) {
        *out = strdup(json_schema_any_object_gbnf());
        return *out ? 0 : RKV_ENOMEM;
    }
    char *text = NULL;
    size_t len = 0;
    const char *path = o->schema ? o->schema : o->gbnf;
    int rc = rkv_read_file(path, 16 << 20, &text, &len);
    if (rc) {
        fprintf(stderr, "rkv-grammar: %s: %s\n", path, rkv_strerror(rc));
        return rc;
    }
    if (o->gbnf) {
        *out = text;
        return 0;
    }
    rc = json_schema_to_gbnf(text, len, out, err, sizeof err);
    free(text);
    if (rc)
        fprintf(stderr, "rkv-grammar: %s: %s\n", path, err);
    return rc;
}

/* this thread's cpu time: mask cost without the other processes on a shared machine */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

struct gen_ctx {
    const struct opts *o;
    const struct tok *t;
    struct grammar_matcher *m;
    int32_t n_vocab;
    uint32_t *mask;
    int8_t *lean; /* per token: +2 closes ('"', ']', '}'), -2 opens ('[', '{'), +1 other
                   * punctuation: where a generation past --soft-len leans */
    uint8_t *eog;
    uint64_t *times; /* mask ns */
    size_t n_times, cap_times;
};

/* one generation: random logits over the allowed tokens, gumbel-max sampling */
static int generate(struct gen_ctx *c, long sample)
{
    const struct opts *o = c->o;
    grammar_matcher_reset(c->m);
    struct strbuf text = {0};
    long n = 0;
    const char *end = "limit";
    int rc = 0;
    for (; n < o->max_tokens; n++) {
        if (grammar_matcher_must_end(c->m)) {
            end = "complete";
            break;
        }
        uint64_t t0 = cpu_ns();
        rc = grammar_matcher_mask(c->m, c->mask);
        uint64_t dt = cpu_ns() - t0;
        if (rc)
            break;
        if (o->bench) {
            if (rkv_grow((void **)&c->times, &c->cap_times, (c->n_times + 1) * sizeof *c->times,
                         1024 * sizeof *c->times))
                return RKV_ENOMEM;
            c->times[c->n_times++] = dt;
        }
        double push = n > o->soft_len ? 0.5 * (double)(n - o->soft_len) : 0;
        double best = -INFINITY;
        int32_t pick = -1;
        for (uint32_t w = 0; w < (uint32_t)(c->n_vocab + 31) / 32; w++) {
            uint32_t bits = c->mask[w];
            while (bits) {
                int32_t id = (int32_t)(w * 32 + (uint32_t)__builtin_ctz(bits));
                bits &= bits - 1;
                double logit = 2.0 * (rng_unit() - 0.5);
                logit += push * (c->eog[id] ? 2 : c->lean[id]);
                double g = logit - log(-log(rng_unit()));
                if (g > best) {
                    best = g;
                    pick = id;
                }
            }
        }
        if (pick < 0) {
            fprintf(stderr, "rkv-grammar: sample %ld: empty mask\n", sample);
            rc = RKV_EINTERNAL;
            break;
        }
        if (c->eog[pick]) {
            if (!grammar_matcher_can_end(c->m)) {
                fprintf(stderr, "rkv-grammar: sample %ld: eog allowed before the end\n", sample);
                rc = RKV_EINTERNAL;
                break;
            }
            end = "eog";
            n++;
            break;
        }
        rc = grammar_matcher_accept(c->m, pick);
        if (rc) {
            fprintf(stderr, "rkv-grammar: sample %ld: token %d in the mask refused\n", sample,
                    pick);
            break;
        }
        char buf[512];
        int l = tok_token_bytes(c->t, pick, 0, buf, sizeof buf);
        if (l < 0 || (size_t)l > sizeof buf) {
            rc = RKV_EINTERNAL;
            break;
        }
        if ((rc = strbuf_add(&text, buf, (size_t)l)) < 0)
            break;
    }
    if (!rc) {
        printf("{\"sample\": %ld, \"text\": ", sample);
        put_json_str(stdout, strbuf_str(&text), text.n);
        printf(", \"tokens\": %ld, \"end\": \"%s\"}\n", n, end);
    }
    strbuf_fini(&text);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o = {0};
    if (parse_args(argc, argv, &o))
        return 2;
    char *gbnf = NULL;
    if (load_gbnf(&o, &gbnf))
        return 1;
    if (o.print_gbnf) {
        fputs(gbnf, stdout);
        free(gbnf);
        return 0;
    }
    char err[512];
    struct grammar *g = NULL;
    int rc = grammar_compile(gbnf, strlen(gbnf), &g, err, sizeof err);
    free(gbnf);
    if (rc) {
        fprintf(stderr, "rkv-grammar: grammar: %s\n", err);
        return 1;
    }
    struct gguf_ctx *gg = NULL;
    struct tok *t = NULL;
    rc = gguf_open(o.model, &gg, err, sizeof err);
    if (!rc)
        rc = tok_load_gguf(gg, &t, err, sizeof err);
    gguf_close(gg);
    if (rc) {
        fprintf(stderr, "rkv-grammar: %s: %s\n", o.model, err);
        grammar_destroy(g);
        return 1;
    }
    uint64_t t0 = rkv_now_ns();
    struct grammar_vocab *v = NULL;
    rc = grammar_vocab_from_tok(&v, t);
    uint64_t vocab_ns = rkv_now_ns() - t0;
    struct gen_ctx c = {.o = &o, .t = t};
    if (!rc)
        rc = grammar_matcher_create(&c.m, g, v);
    if (rc) {
        fprintf(stderr, "rkv-grammar: %s\n", rkv_strerror(rc));
        return 1;
    }
    c.n_vocab = grammar_vocab_n(v);
    c.mask = calloc((size_t)(c.n_vocab + 31) / 32, sizeof *c.mask);
    c.lean = calloc((size_t)c.n_vocab, 1);
    c.eog = calloc((size_t)c.n_vocab, 1);
    if (!c.mask || !c.lean || !c.eog)
        return 1;
    for (int32_t i = 0; i < c.n_vocab; i++) {
        char buf[512];
        c.eog[i] = tok_is_eog(t, i) != 0;
        int l = tok_is_control(t, i) ? 0 : tok_token_bytes(t, i, 0, buf, sizeof buf);
        int8_t lean = 0;
        for (int k = 0; k < l && k < (int)sizeof buf; k++) {
            char b = buf[k];
            if (b == '{' || b == '[') {
                lean = -2;
                break;
            }
            if (b == '"' || b == ']' || b == '}')
                lean = 2;
            else if (ispunct((unsigned char)b) && !lean)
                lean = 1;
        }
        c.lean[i] = lean;
    }
    rng_state = o.seed;
    for (long s = 0; s < o.samples && !rc; s++)
        rc = generate(&c, s);
    fflush(stdout);
    if (o.bench && c.n_times) {
        qsort(c.times, c.n_times, sizeof *c.times, cmp_u64);
        size_t n = c.n_times;
        fprintf(stderr,
                "{\"vocab\": %d, \"vocab_build_ms\": %.1f, \"masks\": %zu, \"mask_median_us\": "
                "%.1f, \"mask_p99_us\": %.1f, \"mask_max_us\": %.1f}\n",
                c.n_vocab, (double)vocab_ns / 1e6, n, (double)c.times[n / 2] / 1e3,
                (double)c.times[n * 99 / 100] / 1e3, (double)c.times[n - 1] / 1e3);
    }
    free(c.times);
    free(c.mask);
    free(c.lean);
    free(c.eog);
    grammar_matcher_destroy(c.m);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
    tok_destroy(t);
    if (rc)
        fprintf(stderr, "rkv-grammar: %s\n", rkv_strerror(rc));
    return rc ? 1 : 0;
}
