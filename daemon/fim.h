/* fim.h - fill-in-the-middle: a model's FIM tokens, and the prompt PRE prefix SUF suffix MID. */
#ifndef RKV_FIM_H
#define RKV_FIM_H

#include <stddef.h>
#include <stdint.h>

struct gguf_ctx;

/* token ids of the three FIM markers; -1 when the model has none */
struct fim_tokens {
    int32_t pre, suf, mid;
};

/* from the vocabulary's token strings (tokens[i] is id i, NULL for a slot without one): the
 * first family found of Qwen2.5-Coder (<|fim_prefix|> <|fim_suffix|> <|fim_middle|>),
 * StarCoder (<fim_prefix> <fim_suffix> <fim_middle>), CodeLlama (▁<PRE> ▁<SUF> ▁<MID>, also
 * without the ▁), all three of one family or none. 1 when found, else 0 (out all -1) */
int fim_from_vocab(const char *const *tokens, size_t n, struct fim_tokens *out);

/* the model's: tokenizer.ggml.fim_{pre,suf,mid}_token_id when all three are there (and
 * below the vocabulary's size), else fim_from_vocab over tokenizer.ggml.tokens. 1 when
 * found, else 0 (out all -1) */
int fim_find(const struct gguf_ctx *g, struct fim_tokens *out);

/* llama.cpp's order: [bos] PRE prefix SUF suffix MID into out (cap ids; bos < 0: none).
 * the number of ids, or RKV_ETOOBIG when cap is short */
int fim_build(const struct fim_tokens *f, int32_t bos, const int32_t *prefix, size_t n_prefix,
              const int32_t *suffix, size_t n_suffix, int32_t *out, size_t cap);

#endif
