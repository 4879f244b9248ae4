/* bpe.h - deterministic byte-level BPE training (GPT-2 byte mapping, llama3-style split). */
#ifndef RKV_MKMODEL_BPE_H
#define RKV_MKMODEL_BPE_H

#include <stddef.h>
#include <stdint.h>

/* a learned vocabulary in GGUF form: texts in the GPT-2 byte->unicode
 * mapping, token i < 256 is byte i, merges are "left right" */
struct bpe_vocab {
    char **tokens; /* (n_tokens) NUL-terminated */
    uint32_t n_tokens;
    char **merges; /* (n_merges) NUL-terminated */
    uint32_t n_merges;
};

/* learns merges on text until there are max_tokens tokens (>= 256) or no
 * pair is left to merge. same input -> same output. */
int bpe_train(const char *text, size_t len, uint32_t max_tokens, struct bpe_vocab *out);
void bpe_vocab_fini(struct bpe_vocab *v);

/* pre-token length at text[i] (approximation of the llama3 regex split) */
size_t bpe_split_next(const char *text, size_t len, size_t i);

#endif
