/* main.c - rkv-gen: single-process generation through the engine (batch, kv splits, logit dumps).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/tok.h"
#include "common/util.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/forward.h"
#include "worker/kv.h"
#include "worker/model.h"
#include "worker/sample.h"
#ifdef RKV_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

#define PROG "rkv-gen"

struct opts {
    const char *model;
    const char *prompt;
    const char *prompt_file;
    const char *prompt_ids;
    int64_t n_gen;
    struct sample_params sp;
    uint32_t block_size;
    uint32_t chunk;
    const char *backend;
    uint32_t threads;
    double host_frac;
    uint64_t split_seed;
    uint32_t batch;
    const char *dump_logits;
    int json;
    int ignore_eos;
    enum kv_dtype kv_dtype;
    int swa_full; /* local layers keep every position (one block a position block) */
    int warmup;   /* one untimed prefill chunk first (a server's steady state, not a cold start) */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG
               " --model PATH (--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3) -n N\n"
               "  [--temp T (0 = greedy, default)] [--top-k K] [--top-p P] [--min-p P]\n"
               "  [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F] [--seed N]\n"
               "  [--block-size N (256)] [--chunk N (prefill chunk, 512)]\n"
               "  [--kv-dtype f16|f32|q8|fp8 (f16)] [--backend cpu|cuda|auto] [--threads N]\n"
               "  [--host-frac F] [--split-seed S]\n"
               "  [--batch N] [--dump-logits FILE] [--json] [--ignore-eos] [--swa-full]\n"
               "  [--warmup (one untimed prefill chunk before the timed run)]\n"
               "text goes to stdout, logs to stderr\n");
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static double num(const char *flag, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        die("%s: '%s' is not a number in [%g, %g]", flag, s, lo, hi);
    return v;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    enum {
        O_MODEL = 256,
        O_PROMPT,
        O_PROMPT_FILE,
        O_PROMPT_IDS,
        O_TEMP,
        O_TOP_K,
        O_TOP_P,
        O_MIN_P,
        O_REPEAT,
        O_PRESENCE,
        O_FREQUENCY,
        O_SEED,
        O_BLOCK,
        O_CHUNK,
        O_BACKEND,
        O_THREADS,
        O_HOST_FRAC,
        O_SPLIT_SEED,
        O_BATCH,
        O_DUMP,
        O_JSON,
        O_IGNORE_EOS,
        O_KV_DTYPE,
        O_SWA_FULL,
        O_WARMUP,
        O_HELP
    };
    static const struct option lo[] = {
        {"model", 1, 0, O_MODEL},
        {"prompt", 1, 0, O_PROMPT},
        {"prompt-file", 1, 0, O_PROMPT_FILE},
        {"prompt-ids", 1, 0, O_PROMPT_IDS},
        {"temp", 1, 0, O_TEMP},
        {"top-k", 1, 0, O_TOP_K},
        {"top-p", 1, 0, O_TOP_P},
        {"min-p", 1, 0, O_MIN_P},
        {"repeat-penalty", 1, 0, O_REPEAT},
        {"presence-penalty", 1, 0, O_PRESENCE},
        {"frequency-penalty", 1, 0, O_FREQUENCY},
        {"seed", 1, 0, O_SEED},
        {"block-size", 1, 0, O_BLOCK},
        {"chunk", 1, 0, O_CHUNK},
        {"backend", 1, 0, O_BACKEND},
        {"threads", 1, 0, O_THREADS},
        {"host-frac", 1, 0, O_HOST_FRAC},
        {"split-seed", 1, 0, O_SPLIT_SEED},
        {"swa-full", 0, 0, O_SWA_FULL},
        {"warmup", 0, 0, O_WARMUP},
        {"batch", 1, 0, O_BATCH},
        {"dump-logits", 1, 0, O_DUMP},
        {"json", 0, 0, O_JSON},
        {"ignore-eos", 0, 0, O_IGNORE_EOS},
        {"kv-dtype", 1, 0, O_KV_DTYPE},
        {"help", 0, 0, O_HELP},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof(*o));
    sample_params_default(&o->sp);
    o->n_gen = -1;
    o->block_size = KV_BLOCK_SIZE_DEFAULT;
    o->chunk = 512;
    o->backend = "auto";
    o->batch = 1;
    o->kv_dtype = KV_F16;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":n:h", lo, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_PROMPT: o->prompt = optarg; break;
        case O_PROMPT_FILE: o->prompt_file = optarg; break;
        case O_PROMPT_IDS: o->prompt_ids = optarg; break;
        case 'n': o->n_gen = (int64_t)num("-n", optarg, 0, 1 << 24); break;
        case O_TEMP: o->sp.temperature = (float)num("--temp", optarg, 0, 100); break;
        case O_TOP_K: o->sp.top_k = (int32_t)num("--top-k", optarg, 0, 1 << 24); break;
        case O_TOP_P: o->sp.top_p = (float)num("--top-p", optarg, 0, 1); break;
        case O_MIN_P: o->sp.min_p = (float)num("--min-p", optarg, 0, 1); break;
        case O_REPEAT:
            o->sp.repetition_penalty = (float)num("--repeat-penalty", optarg, 0.01, 100);
            break;
        case O_PRESENCE:
            o->sp.presence_penalty = (float)num("--presence-penalty", optarg, -2, 2);
            break;
        case O_FREQUENCY:
            o->sp.frequency_penalty = (float)num("--frequency-penalty", optarg, -2, 2);
            break;
        case O_SEED: o->sp.seed = (uint64_t)num("--seed", optarg, 0, 9007199254740992.0); break;
        case O_BLOCK: o->block_size = (uint32_t)num("--block-size", optarg, 1, 65536); break;
        case O_CHUNK: o->chunk = (uint32_t)num("--chunk", optarg, 1, 65536); break;
        case O_BACKEND:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"))
                die("--backend: '%s' is not one of cpu, cuda, auto", optarg);
            o->backend = optarg;
            break;
        case O_THREADS: o->threads = (uint32_t)num("--threads", optarg, 1, 1024); break;
        case O_HOST_FRAC: o->host_frac = num("--host-frac", optarg, 0, 1); break;
        case O_SPLIT_SEED:
            o->split_seed = (uint64_t)num("--split-seed", optarg, 0, 9007199254740992.0);
            break;
        case O_BATCH: o->batch = (uint32_t)num("--batch", optarg, 1, 1024); break;
        case O_DUMP: o->dump_logits = optarg; break;
        case O_JSON: o->json = 1; break;
        case O_IGNORE_EOS: o->ignore_eos = 1; break;
        case O_SWA_FULL: o->swa_full = 1; break;
        case O_WARMUP: o->warmup = 1; break;
        case O_KV_DTYPE:
            if (kv_dtype_parse(optarg, &o->kv_dtype) < 0)
                die("--kv-dtype: '%s' is not one of " KV_DTYPE_NAMES, optarg);
            break;
        case 'h':
        case O_HELP: usage(stdout); exit(0);
        case ':': die("%s needs a value (see --help)", argv[optind - 1]);
        default: die("unknown flag %s (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        die("unexpected argument '%s' (see --help)", argv[optind]);
    if (!o->model)
        die("--model PATH is required");
    if (!!o->prompt + !!o->prompt_file + !!o->prompt_ids != 1)
        die("give exactly one of --prompt, --prompt-file, --prompt-ids");
    if (o->n_gen < 0)
        die("-n N (tokens to generate) is required");
    char err[256];
    if (sample_params_check(&o->sp, err, sizeof(err)) < 0)
        die("%s", err);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("--prompt-file: cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf)
        die("out of memory reading %s", path);
    buf[n] = '\0';
    return buf;
}

static int32_t *parse_ids(const char *s, uint32_t n_vocab, uint32_t *n)
{
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || (uint64_t)v >= n_vocab)
            die("--prompt-ids: '%s' is not a list of token ids below %u like 1,2,3", s, n_vocab);
        if (*n == cap)
            ids = realloc(ids, (cap *= 2) * sizeof(int32_t));
        ids[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            die("--prompt-ids: unexpected '%c' in '%s' (ids separated by commas)", *p, s);
    }
    if (*n == 0)
        die("--prompt-ids: no ids in '%s'", s);
    return ids;
}

#ifdef RKV_CUDA
/* on a gpu the device pool is device memory, as kvmgr hands it to a worker;
 * the host pool is page-aligned host memory the backend registers */
static int gpu_pool_alloc(void *u, enum kv_residency r, size_t bytes, void **out)
{
    if (r == KV_DEVICE)
        return rkv_cuda_dev_alloc(*(const int *)u, bytes, out);
    *out = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    return *out ? 0 : RKV_ENOMEM;
}

static void gpu_pool_free(void *u, enum kv_residency r, void *p)
{
    if (r == KV_DEVICE)
        rkv_cuda_dev_free(p);
    else
        free(p);
}

static int gpu_pool_copy(void *u, void *dst, const void *src, size_t n)
{
    return rkv_cuda_copy(dst, src, n);
}
#endif

/* one generating session: its blocks, sampler, output */
struct session {
    struct kv_block_ref *blocks; /* (max_blocks * n_parts) */
    uint8_t *host_pref;          /* (max_blocks) 1 = host when not being written */
    uint32_t n_blocks;
    uint32_t n_past;
    struct sampler *smp;
    int32_t *ids; /* generated */
    uint32_t n_ids;
    int32_t next; /* token to feed next step */
    int done;
    const char *finish;
    struct strbuf text; /* generated, detokenized */
    struct tok_detok dt;
};

/* a NUL byte (a <0x00> token) as U+FFFD, as rkvd's answers carry it: the text is a C string */
static void text_append(struct session *s, const char *p, size_t n)
{
    for (const char *end = p + n, *nul; p < end; p = nul + 1) {
        nul = memchr(p, 0, (size_t)(end - p));
        if (strbuf_add(&s->text, p, nul ? (size_t)(nul - p) : (size_t)(end - p)))
            die("out of memory");
        if (!nul)
            break;
        if (strbuf_add(&s->text, "\xef\xbf\xbd", 3))
            die("out of memory");
    }
}

/* picks round(frac * n) of n blocks at random (split seed), the host set */
static void plan_split(uint8_t *pref, uint32_t n, double frac, uint64_t seed)
{
    uint32_t *perm = malloc(sizeof(uint32_t) * (n ? n : 1));
    for (uint32_t i = 0; i < n; i++) {
        perm[i] = i;
        pref[i] = 0;
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (uint32_t i = n; i > 1; i--) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 29;
        uint32_t j = (uint32_t)(x % i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    uint32_t k = (uint32_t)llround(frac * n);
    for (uint32_t i = 0; i < k; i++)
        pref[perm[i]] = 1;
    free(perm);
}

/* the local parts of position blocks before kv_window_first(n_past) go back to the pool:
 * no step from n_past on reads them */
static void drop_dead_parts(struct kv_local *kv, const struct kv_layout *l, struct session *s)
{
    const uint32_t P = l->n_parts, dead = kv_window_first(l, s->n_past);
    for (uint32_t j = 0; j < dead && (size_t)j * P < s->n_blocks; j++)
        for (uint32_t p = 1; p < P; p++) {
            struct kv_block_ref *r = &s->blocks[(size_t)j * P + p];
            kv_local_release(kv, *r);
            r->index = KV_REF_NONE;
        }
}

/* grows the table for n_new positions, drops dead local parts and applies the split:
 * blocks being written this step stay on the device, the others go where the plan says */
static void prepare_blocks(struct kv_local *kv, const struct kv_layout *l, struct session *s,
                           uint32_t n_new)
{
    const uint32_t P = l->n_parts, need = kv_blocks_for(l, s->n_past + n_new) * P;
    while (s->n_blocks < need) {
        int rc = kv_local_alloc(kv, KV_DEVICE, &s->blocks[s->n_blocks]);
        if (rc < 0)
            die("kv pool exhausted: %s", rkv_strerror(rc));
        s->n_blocks++;
    }
    drop_dead_parts(kv, l, s);
    uint32_t first_written = s->n_past / l->block_size;
    for (uint32_t e = 0; e < s->n_blocks; e++) {
        uint32_t j = e / P;
        enum kv_residency want = j < first_written && s->host_pref[j] ? KV_HOST : KV_DEVICE;
        int rc = kv_local_migrate(kv, &s->blocks[e], want);
        if (rc < 0)
            die("kv migrate: %s", rkv_strerror(rc));
    }
}

/* blocks in use over both pools */
static uint64_t kv_used(const struct kv_local *kv)
{
    return (uint64_t)kv_local_used(kv, KV_DEVICE) + kv_local_used(kv, KV_HOST);
}

/* sampling + bookkeeping for one session's logits; returns 1 when it ended */
static void take_token(struct session *s, const float *logits, const struct tok *tk,
                       const struct opts *o, FILE *text_out)
{
    int32_t id = sampler_sample(s->smp, logits, NULL, NULL);
    sampler_accept(s->smp, id);
    if (!o->ignore_eos && tk && tok_is_eog(tk, id)) {
        s->done = 1;
        s->finish = "stop";
        return;
    }
    s->ids[s->n_ids++] = id;
    s->next = id;
    if (tk) {
        char buf[256];
        size_t n = 0;
        if (tok_detok_push(&s->dt, id, buf, sizeof(buf), &n) == 0 && n) {
            text_append(s, buf, n);
            if (text_out) {
                fwrite(buf, 1, n, text_out);
                fflush(text_out);
            }
        }
    }
    if (s->n_ids == (uint32_t)o->n_gen) {
        s->done = 1;
        s->finish = "length";
    }
}

static double now_ms(void)
{
    return (double)rkv_now_ns() / 1e6;
}

int main(int argc, char **argv)
{
    struct opts o;
    rkv_log_init(PROG, RKV_LOG_INFO);
    parse_args(argc, argv, &o);
    char err[512] = "";

    struct backend_opts bo = {o.backend, o.threads, 0};
    struct engine eng;
    int rc = engine_open(&eng, o.model, &bo, err, sizeof(err));
    if (rc < 0)
        die("%s", err);
    struct model *m = eng.m;
    struct tok *tk = eng.tok;
    const uint32_t V = m->hp.n_vocab;
    if (!tk) {
        if (!o.prompt_ids)
            die("%s (use --prompt-ids to run without a tokenizer)", eng.tok_err);
        log_warn("no tokenizer (%s): output text stays empty", eng.tok_err);
    }

    /* the prompt */
    uint32_t n_prompt = 0;
    int32_t *prompt;
    if (o.prompt_ids) {
        prompt = parse_ids(o.prompt_ids, V, &n_prompt);
    } else {
        char *text = o.prompt ? strdup(o.prompt) : read_file(o.prompt_file);
        size_t len = strlen(text), n = 0, cap = len + 8;
        prompt = malloc(sizeof(int32_t) * cap);
        rc = tok_encode(tk, text, len, tok_add_bos(tk), 1, prompt, cap, &n);
        if (rc < 0)
            die("cannot tokenize the prompt: %s", rkv_strerror(rc));
        free(text);
        n_prompt = (uint32_t)n;
        if (n_prompt == 0)
            die("the prompt is empty after tokenizing; give some text or --prompt-ids");
    }
    uint64_t n_pos = (uint64_t)n_prompt + (uint64_t)o.n_gen;
    if (n_pos > m->hp.n_ctx)
        die("prompt (%u tokens) + -n %lld = %llu positions exceeds the model's context_length %u",
            n_prompt, (long long)o.n_gen, (unsigned long long)n_pos, m->hp.n_ctx);

    /* kv: every block of every session may sit in either pool */
    struct kv_layout l;
    if ((rc = fwd_kv_layout(m, o.block_size, o.kv_dtype, &l)) < 0) {
        if (kv_dtype_is_8bit(o.kv_dtype) && m->hp.head_dim % 8)
            die("--kv-dtype %s needs a head_dim that is a multiple of 8 and this model's is %u: "
                "use --kv-dtype f16",
                kv_dtype_name(o.kv_dtype), m->hp.head_dim);
        die("--block-size %u: %s", o.block_size, rkv_strerror(rc));
    }
    /* the local layers' kv past their window is dropped where the backend reads that layout */
    if (!o.swa_full && !strcmp(backend_name(eng.be), "cpu") &&
        (rc = fwd_kv_layout_window(m, &l)) < 0)
        die("the model's sliding window: %s", rkv_strerror(rc));
    const uint32_t max_blocks = kv_blocks_for(&l, (uint32_t)n_pos) + 1, P = l.n_parts;
    struct kv_local *kv;
    const struct kv_mem *mem = NULL;
#ifdef RKV_CUDA
    struct kv_mem gpu_mem = {gpu_pool_alloc, gpu_pool_free, gpu_pool_copy, &bo.gpu};
    if (!strcmp(backend_name(eng.be), "cuda"))
        mem = &gpu_mem;
#endif
    if ((rc = kv_local_init_mem(&kv, &l, o.batch * max_blocks * P, o.batch * max_blocks * P, mem)) <
        0)
        die("cannot allocate the kv cache (%u blocks of %zu bytes): %s",
            2 * o.batch * max_blocks * P, kv_block_bytes(&l), rkv_strerror(rc));
    uint32_t chunk = o.chunk < n_prompt ? o.chunk : n_prompt;
    struct fwd *f;
    if ((rc = fwd_create(&f, m, &l, kv_local_pools(kv), o.batch * chunk, o.batch)) < 0)
        die("cannot set up the forward pass: %s", rkv_strerror(rc));

    struct session *ss = calloc(o.batch, sizeof(*ss));
    for (uint32_t i = 0; i < o.batch; i++) {
        struct session *s = &ss[i];
        s->blocks = calloc((size_t)max_blocks * P, sizeof(*s->blocks));
        s->host_pref = calloc(max_blocks, 1);
        s->ids = calloc((size_t)o.n_gen + 1, sizeof(int32_t));
        plan_split(s->host_pref, kv_blocks_for(&l, (uint32_t)n_pos), o.host_frac,
                   o.split_seed * 1000003u + i);
        if ((rc = sampler_create(&s->smp, &o.sp, (int32_t)V)) < 0)
            die("sampler: %s", rkv_strerror(rc));
        for (uint32_t j = 0; j < n_prompt; j++)
            sampler_accept(s->smp, prompt[j]);
        if (tk)
            tok_detok_init(&s->dt, tk);
        s->finish = "length";
        s->done = o.n_gen == 0;
    }
    FILE *dump = NULL;
    if (o.dump_logits && !(dump = fopen(o.dump_logits, "wb")))
        die("--dump-logits: cannot create %s: %s", o.dump_logits, strerror(errno));
    FILE *stream = !o.json && o.batch == 1 ? stdout : NULL;

    float *logits = malloc(sizeof(float) * V * o.batch);
    struct fwd_seq *seqs = calloc(o.batch, sizeof(*seqs));
    uint32_t *who = calloc(o.batch, sizeof(uint32_t));
    /* --warmup: the first chunk once untimed (first launches, library set-up), then the timed
     * run writes the same kv into the same blocks again */
    if (o.warmup && o.n_gen > 0 && n_prompt > 0) {
        for (uint32_t i = 0; i < o.batch; i++) {
            prepare_blocks(kv, &l, &ss[i], chunk);
            seqs[i] = (struct fwd_seq){prompt, chunk, 0, ss[i].blocks, ss[i].n_blocks};
        }
        if ((rc = fwd_step(f, seqs, o.batch, 0, logits)) < 0)
            die("warm-up prefill failed: %s", rkv_strerror(rc));
    }
    double t0 = now_ms(), t_prefill = 0, t_decode = 0;
    uint64_t n_decoded = 0, kv_peak = 0;

    /* prefill: all sessions together, chunk by chunk */
    if (o.n_gen > 0) {
        for (uint32_t p = 0; p < n_prompt; p += chunk) {
            uint32_t n = n_prompt - p < chunk ? n_prompt - p : chunk;
            for (uint32_t i = 0; i < o.batch; i++) {
                prepare_blocks(kv, &l, &ss[i], n);
                seqs[i] =
                    (struct fwd_seq){prompt + p, n, ss[i].n_past, ss[i].blocks, ss[i].n_blocks};
            }
            kv_peak = kv_used(kv) > kv_peak ? kv_used(kv) : kv_peak;
            if ((rc = fwd_step(f, seqs, o.batch, 0, logits)) < 0)
                die("prefill failed: %s", rkv_strerror(rc));
            for (uint32_t i = 0; i < o.batch; i++)
                ss[i].n_past += n;
        }
        t_prefill = now_ms() - t0;
        if (dump)
            fwrite(logits, sizeof(float), (size_t)V * o.batch, dump);
        for (uint32_t i = 0; i < o.batch; i++)
            take_token(&ss[i], logits + (size_t)i * V, tk, &o, i == 0 ? stream : NULL);
    }

    /* decode: every unfinished session feeds its last token */
    double t1 = now_ms();
    for (;;) {
        uint32_t nb = 0;
        for (uint32_t i = 0; i < o.batch; i++) {
            struct session *s = &ss[i];
            if (s->done)
                continue;
            prepare_blocks(kv, &l, s, 1);
            seqs[nb] = (struct fwd_seq){&s->next, 1, s->n_past, s->blocks, s->n_blocks};
            who[nb++] = i;
        }
        if (nb == 0)
            break;
        kv_peak = kv_used(kv) > kv_peak ? kv_used(kv) : kv_peak;
        if ((rc = fwd_step(f, seqs, nb, 0, logits)) < 0)
            die("decode failed: %s", rkv_strerror(rc));
        n_decoded += nb;
        if (dump)
            fwrite(logits, sizeof(float), (size_t)V * nb, dump);
        for (uint32_t j = 0; j < nb; j++) {
            ss[who[j]].n_past++;
            take_token(&ss[who[j]], logits + (size_t)j * V, tk, &o, who[j] == 0 ? stream : NULL);
        }
    }
    t_decode = now_ms() - t1;
    if (dump && fclose(dump) != 0)
        die("--dump-logits: write to %s failed: %s", o.dump_logits, strerror(errno));

    for (uint32_t i = 0; i < o.batch; i++) {
        char buf[64];
        size_t n = 0;
        if (tk && tok_detok_flush(&ss[i].dt, buf, sizeof(buf), &n) == 0 && n) {
            text_append(&ss[i], buf, n);
            if (stream && i == 0)
                fwrite(buf, 1, n, stream);
        }
    }
    /* the sessions at rest: what a next step from n_past reads */
    uint64_t all_global = 0;
    for (uint32_t i = 0; i < o.batch; i++) {
        drop_dead_parts(kv, &l, &ss[i]);
        all_global += kv_all_global_bytes(&l, ss[i].n_past);
    }
    double prefill_tok_s = t_prefill > 0 ? (double)n_prompt * o.batch / (t_prefill / 1e3) : 0;
    double decode_tok_s = t_decode > 0 ? (double)n_decoded / (t_decode / 1e3) : 0;
    if (o.json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddStringToObject(root, "backend", backend_name(eng.be));
        cJSON_AddNumberToObject(root, "n_vocab", V);
        cJSON *pi = cJSON_AddArrayToObject(root, "prompt_ids");
        for (uint32_t j = 0; j < n_prompt; j++)
            cJSON_AddItemToArray(pi, cJSON_CreateNumber(prompt[j]));
        cJSON *sa = cJSON_AddArrayToObject(root, "sessions");
        for (uint32_t i = 0; i < o.batch; i++) {
            cJSON *so = cJSON_CreateObject();
            cJSON *ia = cJSON_AddArrayToObject(so, "ids");
            for (uint32_t j = 0; j < ss[i].n_ids; j++)
                cJSON_AddItemToArray(ia, cJSON_CreateNumber(ss[i].ids[j]));
            cJSON_AddStringToObject(so, "text", strbuf_str(&ss[i].text));
            cJSON_AddStringToObject(so, "finish_reason", ss[i].finish);
            cJSON_AddItemToArray(sa, so);
        }
        cJSON *kj = cJSON_AddObjectToObject(root, "kv");
        cJSON_AddNumberToObject(kj, "block_bytes", (double)kv_block_bytes(&l));
        cJSON_AddNumberToObject(kj, "parts", P);
        cJSON_AddNumberToObject(kj, "bytes", (double)(kv_used(kv) * kv_block_bytes(&l)));
        cJSON_AddNumberToObject(kj, "peak_bytes", (double)(kv_peak * kv_block_bytes(&l)));
        cJSON_AddNumberToObject(kj, "all_global_bytes", (double)all_global);
        cJSON *tm = cJSON_AddObjectToObject(root, "timings");
        cJSON_AddNumberToObject(tm, "prefill_ms", t_prefill);
        cJSON_AddNumberToObject(tm, "decode_ms", t_decode);
        cJSON_AddNumberToObject(tm, "prefill_tok_s", prefill_tok_s);
        cJSON_AddNumberToObject(tm, "decode_tok_s", decode_tok_s);
        char *js = cJSON_PrintUnformatted(root);
        printf("%s\n", js);
        free(js);
        cJSON_Delete(root);
    } else {
        if (!stream)
            for (uint32_t i = 0; i < o.batch; i++)
                printf("%s%s", i ? "\n" : "", strbuf_str(&ss[i].text));
        printf("\n");
    }
    log_info("prompt %u tokens x %u: prefill %.1f ms (%.1f tok/s), decode %llu tokens %.1f ms "
             "(%.1f tok/s), backend %s",
             n_prompt, o.batch, t_prefill, prefill_tok_s, (unsigned long long)n_decoded, t_decode,
             decode_tok_s, backend_name(eng.be));

    for (uint32_t i = 0; i < o.batch; i++) {
        free(ss[i].blocks);
        free(ss[i].host_pref);
        free(ss[i].ids);
        strbuf_fini(&ss[i].text);
        sampler_destroy(ss[i].smp);
    }
    free(ss);
    free(seqs);
    free(who);
    free(logits);
    free(prompt);
    fwd_destroy(f);
    kv_local_destroy(kv);
    engine_close(&eng);
    return 0;
}
