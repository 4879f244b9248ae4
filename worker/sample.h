/* sample.h - token sampling: greedy, temperature, top-k/p, min-p, penalties, seeded. */
#ifndef RKV_SAMPLE_H
#define RKV_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct sample_params {
    float temperature;        /* 0 = greedy (argmax, ties to the lowest id) */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; llama.cpp/HF style divide/multiply */
    float presence_penalty;   /* 0 = off; OpenAI semantics */
    float frequency_penalty;  /* 0 = off; OpenAI semantics */
    int32_t penalty_last_n;   /* tokens of history the penalties see; -1 = all */
    uint64_t seed;            /* same seed + same logits -> same tokens */
    int32_t n_top_logprobs;   /* 0..20 alternatives reported per token */
};

/* defaults: greedy, every filter off, seed 0 */
void sample_params_default(struct sample_params *p);
/* range check; on error writes a message naming the field and the range */
int sample_params_check(const struct sample_params *p, char *errbuf, size_t errlen);

struct sample_top {
    int32_t id;
    float logprob;
};

struct sampler;

int sampler_init(struct sampler **out, const struct sample_params *p, int32_t n_vocab);
void sampler_free(struct sampler *s);
/* history for penalties: prompt tokens and each sampled token */
void sampler_accept(struct sampler *s, int32_t id);
/* picks a token from raw logits (n_vocab floats, not modified).
 * logprob: log-softmax of the chosen token under the unfiltered, unpenalized
 * distribution (what OpenAI's logprobs report); top: n_top_logprobs best
 * alternatives by that distribution, sorted. either may be NULL. */
int32_t sampler_sample(struct sampler *s, const float *logits, float *logprob,
                       struct sample_top *top);

#endif
