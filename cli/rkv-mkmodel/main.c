/* main.c - rkv-mkmodel: deterministic random-weight GGUF v3 models with a working BPE tokenizer. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/rkv-mkmodel/bpe.h"
#include "cli/rkv-mkmodel/corpus.h"
#include "cli/rkv-mkmodel/gguf_write.h"
#include "cli/rkv-mkmodel/weights.h"
#include "common/err.h"
#include "common/gguf.h"
#include "common/quant.h"
#include "common/util.h"

#define PROG      "rkv-mkmodel"
#define ALIGNMENT 32
/* learned merges stop here (or where the built-in text runs out) */
#define MAX_MERGES 4000
/* elements generated per batch, split across threads */
#define BATCH_ELEMS (16u << 20)

enum arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA3, ARCH_PHI3 };
static const char *const arch_names[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};

struct preset {
    const char *name;
    enum arch arch;
    uint32_t dim, n_layer, n_head, n_head_kv, ffn, vocab, ctx;
    uint32_t head_dim; /* attention.key_length; 0 = dim / n_head */
    uint32_t window;   /* gemma3's attention.sliding_window */
    float rope_base;   /* rope.freq_base; 0 = the architecture's */
    /* YaRN: rope.scaling.factor and original_context_length; 0 = none */
    float yarn_factor;
    uint32_t yarn_ctx;
};

/* docs/model-format.md lists these */
static const struct preset presets[] = {
    {"tiny", ARCH_LLAMA, 64, 2, 4, 2, 160, 512, 2048},
    {"tiny-qwen2", ARCH_QWEN2, 64, 2, 4, 2, 160, 512, 2048},
    /* rows of whole 256-value blocks: the k-quants apply to every matrix */
    {"tiny256", ARCH_LLAMA, 256, 2, 4, 2, 512, 512, 2048},
    {"small", ARCH_LLAMA, 768, 12, 12, 4, 2048, 8192, 8192},
    {"llama3-8b", ARCH_LLAMA, 4096, 32, 32, 8, 14336, 128256, 131072},
    {"qwen2.5-7b", ARCH_QWEN2, 3584, 28, 28, 4, 18944, 152064, 131072},
    /* heads wider than dim / n_head, as Qwen3's and Gemma 3's are */
    {"qwen3-tiny", ARCH_QWEN3, 64, 2, 4, 2, 160, 512, 2048, 32},
    /* seven layers: local 0-4 and 6, global 5; a window the tests' prompts outgrow */
    {"gemma3-tiny", ARCH_GEMMA3, 64, 7, 4, 1, 160, 512, 2048, 32, 8},
    /* Gemma 3 4B's shape: 34 layers (every sixth global), heads of 256, a window of 1024 */
    {"gemma3-4b", ARCH_GEMMA3, 2560, 34, 8, 4, 10240, 262144, 131072, 256, 1024},
    /* YaRN 4x over a trained context of 64, with a base whose correction ramp spans
     * several of the 8 pairs, so short prompts run past the trained context */
    {"qwen2-yarn-tiny", ARCH_QWEN2, 64, 2, 4, 2, 160, 512, 256, 0, 0, 10000.0f, 4.0f, 64},
    /* q, k, v in one matrix and gate, up in another, as Phi-3's files have them */
    {"phi3-tiny", ARCH_PHI3, 64, 2, 4, 2, 160, 512, 2048, 0, 0, 10000.0f},
};
#define PRESET_NAMES                                                                               \
    "tiny, tiny-qwen2, tiny256, small, llama3-8b, qwen2.5-7b, qwen3-tiny, gemma3-tiny, "           \
    "gemma3-4b, qwen2-yarn-tiny, phi3-tiny"

struct dtype {
    const char *name;
    uint32_t type;      /* ggml type of the matrices */
    uint32_t file_type; /* llama.cpp's general.file_type */
    int mix_k_m;        /* the _K_M mixes: some tensors in Q6_K (tensor_type) */
};

static const struct dtype dtypes[] = {
    {"f32", QUANT_F32, 0, 0},      {"f16", QUANT_F16, 1, 0},        {"bf16", QUANT_BF16, 32, 0},
    {"q8_0", QUANT_Q8_0, 7, 0},    {"q4_0", QUANT_Q4_0, 2, 0},      {"q4_1", QUANT_Q4_1, 3, 0},
    {"q5_0", QUANT_Q5_0, 8, 0},    {"q5_1", QUANT_Q5_1, 9, 0},      {"q2_k", QUANT_Q2_K, 10, 0},
    {"q3_k", QUANT_Q3_K, 11, 0},   {"q4_k", QUANT_Q4_K, 14, 0},     {"q5_k", QUANT_Q5_K, 16, 0},
    {"q6_k", QUANT_Q6_K, 18, 0},   {"iq4_nl", QUANT_IQ4_NL, 25, 0}, {"iq4_xs", QUANT_IQ4_XS, 30, 0},
    {"q4_k_m", QUANT_Q4_K, 15, 1}, {"q5_k_m", QUANT_Q5_K, 17, 1},
};
#define DTYPE_NAMES                                                                                \
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, "         \
    "iq4_xs, q4_k_m, q5_k_m"

struct opts {
    const struct preset *preset;
    enum arch arch;
    const struct dtype *dtype;
    uint64_t seed;
    const char *out;
    int fim; /* --fim: Qwen2.5-Coder's fill-in-the-middle tokens after the specials */
};

struct tensor {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[2];
    uint64_t n_el, n_bytes, offset;
    struct wt_dist dist;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --out FILE [--preset NAME] [--arch llama|qwen2|qwen3|gemma3|phi3]\n"
            "                   [--dtype TYPE] [--seed N] [--fim]\n"
            "writes a GGUF v3 model with seeded random weights and a byte-level BPE\n"
            "tokenizer; the same arguments give the same bytes.\n"
            "  --preset NAME   tiny (default), tiny-qwen2, tiny256, small, llama3-8b,\n"
            "                  qwen2.5-7b, qwen3-tiny, gemma3-tiny, gemma3-4b, qwen2-yarn-tiny,\n"
            "                  phi3-tiny\n"
            "  --arch A        override the preset's architecture\n"
            "  --dtype T       matrix type (norms and biases stay f32), default f32: " DTYPE_NAMES
            "\n"
            "                  (q4_k_m / q5_k_m: attn_v and ffn_down of the first and last\n"
            "                  eighth of the layers and of every third between, and output,\n"
            "                  in q6_k, as llama.cpp's quantizer assigns them; a matrix whose\n"
            "                  rows are not whole 256-value blocks takes llama.cpp's fallback:\n"
            "                  q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0, q2_k/q3_k/iq4_xs ->\n"
            "                  iq4_nl)\n"
            "  --seed N        weight seed, default 1\n"
            "  --fim           add fill-in-the-middle tokens (<|fim_prefix|> <|fim_suffix|>\n"
            "                  <|fim_middle|>) and name them in tokenizer.ggml.fim_*_token_id\n"
            "  --out FILE      output path (written to FILE.tmp, then renamed)\n");
}

static int bad_flag(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see " PROG " --help)\n");
    return 1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    o->preset = &presets[0];
    o->dtype = &dtypes[0];
    o->seed = 1;
    o->arch = ARCH_LLAMA;
    o->out = NULL;
    int arch_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(a, "--", 2) != 0)
            return bad_flag("unexpected argument '%s'", a);
        if (!strcmp(a, "--fim")) {
            o->fim = 1;
            continue;
        }
        if (strcmp(a, "--preset") && strcmp(a, "--arch") && strcmp(a, "--dtype") &&
            strcmp(a, "--seed") && strcmp(a, "--out"))
            return bad_flag("unknown flag '%s'", a);
        if (i + 1 >= argc)
            return bad_flag("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--preset")) {
            o->preset = NULL;
            for (size_t k = 0; k < RKV_ARRAY_LEN(presets); k++)
                if (!strcmp(v, presets[k].name))
                    o->preset = &presets[k];
            if (!o->preset)
                return bad_flag("unknown preset '%s' (" PRESET_NAMES ")", v);
        } else if (!strcmp(a, "--arch")) {
            size_t k = 0;
            while (k < RKV_ARRAY_LEN(arch_names) && strcmp(v, arch_names[k]))
                k++;
            if (k == RKV_ARRAY_LEN(arch_names))
                return bad_flag("unknown --arch '%s' (llama, qwen2, qwen3, gemma3, phi3)", v);
            o->arch = (enum arch)k;
            arch_set = 1;
        } else if (!strcmp(a, "--dtype")) {
            o->dtype = NULL;
            for (size_t k = 0; k < RKV_ARRAY_LEN(dtypes); k++)
                if (!strcmp(v, dtypes[k].name))
                    o->dtype = &dtypes[k];
            if (!o->dtype)
                return bad_flag("unknown --dtype '%s' (" DTYPE_NAMES ")", v);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 0);
            if (errno || end == v || *end || v[0] == '-')
                return bad_flag("--seed '%s' is not an unsigned integer", v);
            o->seed = s;
        } else {
            o->out = v;
        }
    }
    if (!arch_set)
        o->arch = o->preset->arch;
    if (!o->out)
        return bad_flag("%s", "--out FILE is required");
    return 0;
}

/* --- tokenizer -------------------------------------------------------------- */

static const char *const llama_specials[] = {"<|begin_of_text|>", "<|end_of_text|>",
                                             "<|start_header_id|>", "<|end_header_id|>",
                                             "<|eot_id|>"};
static const char *const qwen2_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
static const char *const gemma_specials[] = {"<pad>", "<eos>", "<bos>", "<start_of_turn>",
                                             "<end_of_turn>"};
static const char *const phi3_specials[] = {"<s>",     "<|endoftext|>", "<|assistant|>",
                                            "<|end|>", "<|user|>",      "<|system|>"};

/* llama 3 instruct's template */
static const char llama3_template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* qwen2 instruct's chatml template */
static const char chatml_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' "
    "+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* gemma 3 instruct's turns (its template without the system-prompt folding) */
static const char gemma_template[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set "
    "role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + "
    "role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/* phi 3 instruct's template */
static const char phi3_template[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' "
    "%}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";

/* an architecture's chat tokens: its specials (after the bpe tokens), the special ids as
 * offsets into them (-1: the key is not written), whether BOS is added, its template */
struct chat_family {
    const char *const *specials;
    uint32_t n_specials;
    int bos, eos, eot, pad;
    int add_bos;
    const char *tmpl;
};

static const struct chat_family *chat_family(enum arch a)
{
#define SPECIALS(x) x, RKV_ARRAY_LEN(x)
    static const struct chat_family
        llama = {SPECIALS(llama_specials), 0, 1, 4, -1, 1, llama3_template},
        gemma = {SPECIALS(gemma_specials), 2, 1, 4, 0, 1, gemma_template},
        phi3 = {SPECIALS(phi3_specials), 0, 1, 3, 1, 0, phi3_template},
        chatml = {SPECIALS(qwen2_specials), 0, 2, 2, 0, 0, chatml_template};
#undef SPECIALS
    return a == ARCH_LLAMA ? &llama : a == ARCH_GEMMA3 ? &gemma : a == ARCH_PHI3 ? &phi3 : &chatml;
}

struct vocab {
    struct bpe_vocab bpe;
    const char **tokens; /* (n) bpe tokens, specials, reserved */
    int32_t *types;      /* (n) */
    char **reserved;     /* (n_reserved) */
    uint32_t n, n_reserved;
    int32_t first_special;
    int32_t first_fim; /* -1 without --fim */
};

static void vocab_free(struct vocab *v)
{
    bpe_vocab_fini(&v->bpe);
    for (uint32_t i = 0; v->reserved && i < v->n_reserved; i++)
        free(v->reserved[i]);
    free(v->reserved);
    free(v->tokens);
    free(v->types);
}

static int vocab_build(const struct opts *o, struct vocab *v)
{
    memset(v, 0, sizeof *v);
    const struct chat_family *fam = chat_family(o->arch);
    const char *const *specials = fam->specials;
    uint32_t n_special = fam->n_specials;
    static const char *const fim_tokens[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};
    uint32_t n_fim = o->fim ? RKV_ARRAY_LEN(fim_tokens) : 0;
    uint32_t n_vocab = o->preset->vocab;
    if (n_vocab < 256 + n_special + n_fim) {
        fprintf(stderr, PROG ": vocab %u is below 256 bytes + %u special tokens\n", n_vocab,
                n_special);
        return RKV_EINVAL;
    }
    size_t len;
    const char *text = mk_corpus(&len);
    uint32_t max_tokens = RKV_MIN(n_vocab - n_special - n_fim, 256 + MAX_MERGES);
    int rc = bpe_train(text, len, max_tokens, &v->bpe);
    if (rc)
        return rc;
    v->n = n_vocab;
    v->n_reserved = n_vocab - n_special - n_fim - v->bpe.n_tokens;
    v->tokens = calloc(n_vocab, sizeof *v->tokens);
    v->types = calloc(n_vocab, sizeof *v->types);
    v->reserved = calloc(v->n_reserved ? v->n_reserved : 1, sizeof *v->reserved);
    if (!v->tokens || !v->types || !v->reserved)
        return RKV_ENOMEM;
    uint32_t t = 0;
    for (uint32_t i = 0; i < v->bpe.n_tokens; i++, t++) {
        v->tokens[t] = v->bpe.tokens[i];
        v->types[t] = 1; /* normal */
    }
    v->first_special = (int32_t)t;
    for (uint32_t i = 0; i < n_special; i++, t++) {
        v->tokens[t] = specials[i];
        v->types[t] = 3; /* control */
    }
    v->first_fim = n_fim ? (int32_t)t : -1;
    for (uint32_t i = 0; i < n_fim; i++, t++) {
        v->tokens[t] = fim_tokens[i];
        v->types[t] = 3;
    }
    for (uint32_t i = 0; i < v->n_reserved; i++, t++) {
        char name[32];
        snprintf(name, sizeof name, "<|reserved_%u|>", i);
        if (!(v->reserved[i] = strdup(name)))
            return RKV_ENOMEM;
        v->tokens[t] = v->reserved[i];
        v->types[t] = 3;
    }
    return 0;
}

static void put_tokenizer(struct gw *w, const struct opts *o, const struct vocab *v)
{
    int32_t s = v->first_special;
    gw_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(w, "tokenizer.ggml.pre",
              o->arch == ARCH_QWEN2 || o->arch == ARCH_QWEN3 ? "qwen2" : "llama-bpe");
    gw_kv_arr_str(w, "tokenizer.ggml.tokens", v->tokens, v->n);
    gw_kv_arr_i32(w, "tokenizer.ggml.token_type", v->types, v->n);
    gw_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->bpe.merges, v->bpe.n_merges);
    if (v->first_fim >= 0) {
        gw_kv_u32(w, "tokenizer.ggml.fim_pre_token_id", (uint32_t)v->first_fim);
        gw_kv_u32(w, "tokenizer.ggml.fim_suf_token_id", (uint32_t)v->first_fim + 1);
        gw_kv_u32(w, "tokenizer.ggml.fim_mid_token_id", (uint32_t)v->first_fim + 2);
    }
    const struct chat_family *fam = chat_family(o->arch);
    static const char *const keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                       "tokenizer.ggml.eot_token_id",
                                       "tokenizer.ggml.padding_token_id"};
    const int ids[] = {fam->bos, fam->eos, fam->eot, fam->pad};
    for (size_t k = 0; k < RKV_ARRAY_LEN(keys); k++)
        if (ids[k] >= 0)
            gw_kv_u32(w, keys[k], (uint32_t)(s + ids[k]));
    gw_kv_bool(w, "tokenizer.ggml.add_bos_token", fam->add_bos);
    gw_kv_str(w, "tokenizer.chat_template", fam->tmpl);
}

/* --- tensors ---------------------------------------------------------------- */

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third
 * between */
static int more_bits(uint32_t layer, uint32_t n_layer)
{
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* the type of a matrix of rows of ne0 values: the dtype's, Q6_K where a _K_M mix wants more
 * bits (role 'v' attn_v / ffn_down, 'o' output), then llama.cpp's fallback where the rows are
 * not whole blocks */
static uint32_t matrix_type(const struct opts *o, char role, uint32_t layer, uint64_t ne0)
{
    uint32_t t = o->dtype->type;
    if (o->dtype->mix_k_m && (role == 'o' || (role == 'v' && more_bits(layer, o->preset->n_layer))))
        t = QUANT_Q6_K;
    if (ne0 % quant_block_values(t)) {
        switch (t) {
        case QUANT_Q4_K: t = QUANT_Q5_0; break;
        case QUANT_Q5_K: t = QUANT_Q5_1; break;
        case QUANT_Q6_K: t = QUANT_Q8_0; break;
        case QUANT_Q2_K:
        case QUANT_Q3_K:
        case QUANT_IQ4_XS: t = QUANT_IQ4_NL; break;
        }
        if (ne0 % quant_block_values(t))
            t = QUANT_F16;
    }
    return t;
}

static void add_tensor(struct tensor *t, uint32_t *n, uint64_t seed, const char *name,
                       uint32_t type, uint64_t ne0, uint64_t ne1, float center, float half)
{
    struct tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->type = type;
    x->n_dims = ne1 ? 2 : 1;
    x->ne[0] = ne0;
    x->ne[1] = ne1 ? ne1 : 1;
    x->n_el = x->ne[0] * x->ne[1];
    x->n_bytes = gguf_type_size(type, x->n_el);
    x->dist.key = wt_tensor_key(seed, name);
    x->dist.center = center;
    x->dist.half = half;
}

/* uniform on [-h, h] has std h/sqrt(3): matrices get std 1/sqrt(n_in) so
 * activations stay O(1) */
static float mat_half(uint64_t n_in)
{
    return sqrtf(3.0f / (float)n_in);
}

static uint32_t plan_tensors(const struct opts *o, struct tensor *t)
{
    const struct preset *p = o->preset;
    uint32_t n = 0;
    uint64_t head_dim = p->head_dim ? p->head_dim : p->dim / p->n_head;
    uint64_t q_dim = head_dim * p->n_head, kv_dim = head_dim * p->n_head_kv;
    uint64_t s = o->seed;
    char name[64];
    /* embeddings std 1: rmsnorm comes next, and the residual keeps the token; gemma's std
     * 1/sqrt(dim), which its sqrt(dim) scaling brings back to 1 (and the tied lm head gives
     * logits of std ~1) */
    add_tensor(t, &n, s, "token_embd.weight", matrix_type(o, 'e', 0, p->dim), p->dim, p->vocab,
               0.0f, o->arch == ARCH_GEMMA3 ? mat_half(p->dim) : sqrtf(3.0f));
    for (uint32_t l = 0; l < p->n_layer; l++) {
        uint32_t mt = matrix_type(o, 'm', l, p->dim), vt = matrix_type(o, 'v', l, p->dim);
#define BLK(suffix) (snprintf(name, sizeof name, "blk.%u." suffix, l), name)
        add_tensor(t, &n, s, BLK("attn_norm.weight"), GGUF_TYPE_F32, p->dim, 0, 1.0f, 0.1f);
        if (o->arch == ARCH_PHI3) {
            add_tensor(t, &n, s, BLK("attn_qkv.weight"), mt, p->dim, q_dim + 2 * kv_dim, 0.0f,
                       mat_half(p->dim));
        } else {
            add_tensor(t, &n, s, BLK("attn_q.weight"), mt, p->dim, q_dim, 0.0f, mat_half(p->dim));
            add_tensor(t, &n, s, BLK("attn_k.weight"), mt, p->dim, kv_dim, 0.0f, mat_half(p->dim));
            add_tensor(t, &n, s, BLK("attn_v.weight"), vt, p->dim, kv_dim, 0.0f, mat_half(p->dim));
        }
        if (o->arch == ARCH_QWEN2) {
            add_tensor(t, &n, s, BLK("attn_q.bias"), GGUF_TYPE_F32, q_dim, 0, 0.0f, 0.1f);
            add_tensor(t, &n, s, BLK("attn_k.bias"), GGUF_TYPE_F32, kv_dim, 0, 0.0f, 0.1f);
            add_tensor(t, &n, s, BLK("attn_v.bias"), GGUF_TYPE_F32, kv_dim, 0, 0.0f, 0.1f);
        }
        if (o->arch == ARCH_QWEN3 || o->arch == ARCH_GEMMA3) {
            add_tensor(t, &n, s, BLK("attn_q_norm.weight"), GGUF_TYPE_F32, head_dim, 0, 1.0f, 0.1f);
            add_tensor(t, &n, s, BLK("attn_k_norm.weight"), GGUF_TYPE_F32, head_dim, 0, 1.0f, 0.1f);
        }
        add_tensor(t, &n, s, BLK("attn_output.weight"), matrix_type(o, 'm', l, q_dim), q_dim,
                   p->dim, 0.0f, mat_half(q_dim));
        if (o->arch == ARCH_GEMMA3)
            add_tensor(t, &n, s, BLK("post_attention_norm.weight"), GGUF_TYPE_F32, p->dim, 0, 1.0f,
                       0.1f);
        add_tensor(t, &n, s, BLK("ffn_norm.weight"), GGUF_TYPE_F32, p->dim, 0, 1.0f, 0.1f);
        if (o->arch == ARCH_PHI3) { /* gate rows, then up rows */
            add_tensor(t, &n, s, BLK("ffn_up.weight"), mt, p->dim, 2 * p->ffn, 0.0f,
                       mat_half(p->dim));
        } else {
            add_tensor(t, &n, s, BLK("ffn_gate.weight"), mt, p->dim, p->ffn, 0.0f,
                       mat_half(p->dim));
            add_tensor(t, &n, s, BLK("ffn_up.weight"), mt, p->dim, p->ffn, 0.0f, mat_half(p->dim));
        }
        add_tensor(t, &n, s, BLK("ffn_down.weight"), matrix_type(o, 'v', l, p->ffn), p->ffn, p->dim,
                   0.0f, mat_half(p->ffn));
        if (o->arch == ARCH_GEMMA3)
            add_tensor(t, &n, s, BLK("post_ffw_norm.weight"), GGUF_TYPE_F32, p->dim, 0, 1.0f, 0.1f);
#undef BLK
    }
    add_tensor(t, &n, s, "output_norm.weight", GGUF_TYPE_F32, p->dim, 0, 1.0f, 0.1f);
    /* gemma ties the lm head to the embedding */
    if (o->arch == ARCH_GEMMA3)
        return n;
    /* twice the matrix std: logits of std ~2 are peaked enough to sample from */
    add_tensor(t, &n, s, "output.weight", matrix_type(o, 'o', 0, p->dim), p->dim, p->vocab, 0.0f,
               2.0f * mat_half(p->dim));
    return n;
}

static void put_hparams(struct gw *w, const struct opts *o)
{
    const struct preset *p = o->preset;
    const char *a = arch_names[o->arch];
    const uint32_t head_dim = p->head_dim ? p->head_dim : p->dim / p->n_head;
    char key[96];
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, a), key)
    gw_kv_str(w, "general.architecture", a);
    gw_kv_str(w, "general.name", p->name);
    gw_kv_u32(w, "general.alignment", ALIGNMENT);
    gw_kv_u32(w, "general.file_type", o->dtype->file_type);
    gw_kv_u32(w, "general.quantization_version", 2);
    gw_kv_u32(w, K("vocab_size"), p->vocab);
    gw_kv_u32(w, K("context_length"), p->ctx);
    gw_kv_u32(w, K("embedding_length"), p->dim);
    gw_kv_u32(w, K("block_count"), p->n_layer);
    gw_kv_u32(w, K("feed_forward_length"), p->ffn);
    gw_kv_u32(w, K("attention.head_count"), p->n_head);
    gw_kv_u32(w, K("attention.head_count_kv"), p->n_head_kv);
    gw_kv_u32(w, K("rope.dimension_count"), head_dim);
    if (p->head_dim) {
        gw_kv_u32(w, K("attention.key_length"), head_dim);
        gw_kv_u32(w, K("attention.value_length"), head_dim);
    }
    if (o->arch == ARCH_GEMMA3)
        gw_kv_u32(w, K("attention.sliding_window"), p->window ? p->window : 512);
    float base = o->arch == ARCH_LLAMA ? 500000.0f : 1000000.0f;
    gw_kv_f32(w, K("rope.freq_base"), p->rope_base > 0.0f ? p->rope_base : base);
    if (p->yarn_factor > 0.0f) {
        gw_kv_str(w, K("rope.scaling.type"), "yarn");
        gw_kv_f32(w, K("rope.scaling.factor"), p->yarn_factor);
        gw_kv_u32(w, K("rope.scaling.original_context_length"), p->yarn_ctx);
    }
    gw_kv_f32(w, K("attention.layer_norm_rms_epsilon"),
              o->arch == ARCH_LLAMA || o->arch == ARCH_PHI3 ? 1e-5f : 1e-6f);
#undef K
}

/* --- streaming the data ------------------------------------------------------- */

struct fill_job {
    const struct tensor *t;
    uint64_t first, n;
    uint8_t *out;
};

static void *fill_thread(void *arg)
{
    struct fill_job *j = arg;
    wt_fill(&j->t->dist, j->t->type, j->first, j->n, j->out);
    return NULL;
}

/* two buffers: threads fill one while the main thread writes the other */
struct writer {
    int fd;
    const char *path;
    uint64_t done, total;
    uint64_t t0_ms, last_ms;
    int progress;
    int n_threads;
    uint8_t *buf[2];
    int cur;
    size_t pending; /* bytes of buf[cur ^ 1] still to write */
    pthread_t th[64];
    struct fill_job jobs[64];
    int started[64];
};

static int write_all(struct writer *wr, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(wr->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            fprintf(stderr, PROG ": writing %s: %s\n", wr->path, strerror(e));
            return -e;
        }
        p += n;
        len -= (size_t)n;
        wr->done += (uint64_t)n;
    }
    uint64_t now = rkv_now_ms();
    if (wr->progress && now - wr->last_ms >= 1000) {
        double s = (double)(now - wr->t0_ms) / 1e3;
        fprintf(stderr, PROG ": %.2f / %.2f GB (%.0f%%), %.0f MB/s\n", wr->done / 1e9,
                wr->total / 1e9, 100.0 * wr->done / wr->total, wr->done / 1e6 / (s > 0 ? s : 1));
        wr->last_ms = now;
    }
    return 0;
}

static int flush_pending(struct writer *wr)
{
    size_t n = wr->pending;
    wr->pending = 0;
    return n ? write_all(wr, wr->buf[wr->cur ^ 1], n) : 0;
}

/* elements [first, first + n) of t into buf[cur] on worker threads; returns the byte count */
static size_t fill_start(struct writer *wr, const struct tensor *t, uint64_t first, uint64_t n)
{
    uint64_t per_block = quant_block_values(t->type);
    uint64_t blocks = n / per_block;
    /* threads take whole blocks; small tensors stay on one thread */
    int k = n < 65536 ? 1 : wr->n_threads;
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        uint64_t nb = blocks / k + ((uint64_t)i < blocks % k);
        wr->jobs[i] = (struct fill_job){t, first, nb * per_block, wr->buf[wr->cur] + off};
        off += gguf_type_size(t->type, nb * per_block);
        first += nb * per_block;
        wr->started[i] = pthread_create(&wr->th[i], NULL, fill_thread, &wr->jobs[i]) == 0;
    }
    for (int i = k; i < 64; i++)
        wr->started[i] = -1;
    return off;
}

static void fill_finish(struct writer *wr)
{
    for (int i = 0; i < 64 && wr->started[i] >= 0; i++) {
        if (wr->started[i])
            pthread_join(wr->th[i], NULL);
        else
            fill_thread(&wr->jobs[i]); /* no thread: do it here */
    }
}

/* the padding before t, then t's data, one batch behind the generators */
static int write_tensor(struct writer *wr, const struct tensor *t, uint64_t pad)
{
    static const uint8_t zeros[ALIGNMENT];
    for (uint64_t first = 0; first < t->n_el; first += BATCH_ELEMS) {
        uint64_t n = RKV_MIN((uint64_t)BATCH_ELEMS, t->n_el - first);
        size_t len = fill_start(wr, t, first, n);
        int rc = flush_pending(wr);
        if (!rc && pad)
            rc = write_all(wr, zeros, pad);
        pad = 0;
        fill_finish(wr);
        if (rc)
            return rc;
        wr->pending = len;
        wr->cur ^= 1;
    }
    return 0;
}

static int write_model(struct gw *w, const struct tensor *t, uint32_t n_t, const char *tmp)
{
    const uint8_t *hdr;
    size_t hdr_len;
    uint64_t data_len;
    int rc = gw_header(w, &hdr, &hdr_len, &data_len);
    if (rc)
        return rc;
    struct writer wr = {.path = tmp, .total = hdr_len + data_len, .t0_ms = rkv_now_ms()};
    wr.last_ms = wr.t0_ms;
    wr.progress = wr.total > (256u << 20);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    wr.n_threads = (int)RKV_MAX(1, RKV_MIN(ncpu, 64));
    wr.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (wr.fd < 0) {
        rc = -errno;
        fprintf(stderr, PROG ": cannot create %s: %s\n", tmp, strerror(-rc));
        return rc;
    }
    wr.buf[0] = malloc((size_t)BATCH_ELEMS * 4);
    wr.buf[1] = malloc((size_t)BATCH_ELEMS * 4);
    rc = wr.buf[0] && wr.buf[1] ? write_all(&wr, hdr, hdr_len) : RKV_ENOMEM;
    uint64_t pos = 0; /* within the data section */
    for (uint32_t i = 0; i < n_t && !rc; i++) {
        rc = write_tensor(&wr, &t[i], t[i].offset - pos);
        pos = t[i].offset + t[i].n_bytes;
    }
    if (!rc)
        rc = flush_pending(&wr);
    static const uint8_t zeros[ALIGNMENT];
    if (!rc && data_len > pos)
        rc = write_all(&wr, zeros, data_len - pos);
    free(wr.buf[0]);
    free(wr.buf[1]);
    if (close(wr.fd) != 0 && !rc) {
        rc = -errno;
        fprintf(stderr, PROG ": closing %s: %s\n", tmp, strerror(-rc));
    }
    if (!rc && wr.progress) {
        double s = (double)(rkv_now_ms() - wr.t0_ms) / 1e3;
        fprintf(stderr, PROG ": wrote %.2f GB in %.1f s (%.0f MB/s)\n", wr.done / 1e9, s,
                wr.done / 1e6 / (s > 0 ? s : 1));
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o = {0};
    if (parse_args(argc, argv, &o))
        return 1;

    struct vocab v;
    struct gw *w = NULL;
    struct tensor *t = NULL;
    char *tmp = NULL;
    int rc = vocab_build(&o, &v);
    if (!rc)
        rc = gw_create(&w, ALIGNMENT);
    if (rc)
        goto out;
    put_hparams(w, &o);
    put_tokenizer(w, &o, &v);

    /* 9 matrices/vectors per layer plus 3 biases for qwen2 or 4 norms for gemma3, and 3 more */
    t = calloc(13u * o.preset->n_layer + 3, sizeof *t);
    rc = RKV_ENOMEM;
    if (!t)
        goto out;
    uint32_t n_t = plan_tensors(&o, t);
    for (uint32_t i = 0; i < n_t; i++)
        t[i].offset = gw_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne, t[i].n_bytes);

    size_t plen = strlen(o.out) + 8;
    if (!(tmp = malloc(plen)))
        goto out;
    snprintf(tmp, plen, "%s.tmp", o.out);
    rc = write_model(w, t, n_t, tmp);
    if (!rc && rename(tmp, o.out) != 0) {
        rc = -errno;
        fprintf(stderr, PROG ": renaming %s to %s: %s\n", tmp, o.out, strerror(-rc));
    }
    if (rc)
        unlink(tmp);
out:
    /* errno failures were reported where they happened */
    if (rc && rc <= RKV_EINVAL)
        fprintf(stderr, PROG ": %s: %s\n", o.out, rkv_strerror(rc));
    free(tmp);
    free(t);
    gw_destroy(w);
    vocab_free(&v);
    return rc ? 1 : 0;
}
