/* sample.h - token sampling: greedy, temperature, top-k/p, min-p, penalties, seeded.
 *
 * order (llama.cpp's sampler chain):
 *   0. logit bias: each listed id's logit += its bias (OpenAI's logit_bias)
 *   0b. grammar (structured output), after the penalties below: ids the grammar does not
 *      allow next get -inf, and the picked id advances the grammar
 *   1. penalties over the history window (penalty_last_n tokens), per id seen
 *      c times: repetition (logit > 0 ? logit / r : logit * r), then
 *      logit -= frequency * c + presence
 *   2. temperature 0 (or top_k 1): argmax of the penalized logits, lowest id
 *      on ties; nothing below runs and no random number is drawn
 *   3. top-k: the k highest logits (ties: lowest id)
 *   4. top-p: the smallest best-first set whose probability reaches top_p
 *   5. min-p: tokens with prob >= min_p * the highest prob
 *      (3-5 judge probabilities at temperature 1, as llama.cpp does)
 *   6. temperature: softmax(logit / T) over what is left, one uniform draw
 *      from xoshiro256** seeded by splitmix64(seed)
 * one sampler serves one sequence; it is not thread-safe and uses no threads,
 * so results do not depend on the thread count. */
#ifndef RKV_SAMPLE_H
#define RKV_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLE_MAX_BIAS 300 /* logit bias entries of one sampler */

struct grammar;
struct grammar_vocab;

struct sample_bias {
    int32_t id; /* a token id in the vocabulary */
    float bias; /* [-100, 100], added to the logit of id */
};

struct sample_params {
    float temperature;              /* 0 = greedy (argmax, ties to the lowest id) */
    int32_t top_k;                  /* 0 = off */
    float top_p;                    /* 1 = off */
    float min_p;                    /* 0 = off */
    float repetition_penalty;       /* 1 = off; llama.cpp/HF style divide/multiply */
    float presence_penalty;         /* 0 = off; OpenAI semantics */
    float frequency_penalty;        /* 0 = off; OpenAI semantics */
    int32_t penalty_last_n;         /* tokens of history the penalties see; -1 = all, 0 = none */
    uint64_t seed;                  /* same seed + same logits -> same tokens */
    int32_t n_top_logprobs;         /* 0..20 alternatives reported per token */
    int32_t n_bias;                 /* 0..SAMPLE_MAX_BIAS entries in bias */
    const struct sample_bias *bias; /* (n_bias) sampler_create copies it */
    /* structured output: every pick keeps the answer a prefix of the grammar (tokens it does
     * not allow get -inf after the bias and the penalties; the logprobs stay the raw ones).
     * both or neither; they must outlive the sampler, which keeps its own matcher */
    const struct grammar *grammar;
    const struct grammar_vocab *grammar_vocab;
};

/* defaults: greedy, every filter off, penalty_last_n -1 (all), seed 0 */
void sample_params_default(struct sample_params *p);
/* range check; on error writes a message naming the field and the range */
int sample_params_check(const struct sample_params *p, char *errbuf, size_t errlen);

struct sample_top {
    int32_t id;
    float logprob;
};

struct sampler;

int sampler_create(struct sampler **out, const struct sample_params *p, int32_t n_vocab);
void sampler_destroy(struct sampler *s);
/* history for penalties: prompt tokens and each sampled token */
void sampler_accept(struct sampler *s, int32_t id);
/* applies the penalties (step 1) for the current history to logits
 * (n_vocab floats) in place; what sampler_sample does first */
void sampler_penalize(struct sampler *s, float *logits);
/* feeds ids the request already generated to the grammar (a sampler rebuilt mid-request
 * continues where the first one was); RKV_EINVAL when the grammar refuses one (the state
 * stays before it), 0 without a grammar */
int sampler_grammar_replay(struct sampler *s, const int32_t *ids, size_t n);
/* computes the grammar's mask for the next pick ahead of sampler_sample, which then takes it
 * (the worker runs this on other threads while the step's forward pass runs); 0 without a
 * grammar. the sampler must not be used by another thread meanwhile */
int sampler_grammar_prepare(struct sampler *s);
/* 1 when the sampler follows a grammar */
int sampler_has_grammar(const struct sampler *s);
/* advances the rng past n samples (a sampler rebuilt mid-request, e.g. in
 * a restarted worker, continues the stream the first one drew from); a
 * greedy sampler draws nothing, so this does nothing for it */
void sampler_skip_draws(struct sampler *s, uint64_t n);
/* picks a token from raw logits (n_vocab floats, not modified).
 * logprob: log-softmax of the chosen token under the unfiltered, unpenalized
 * distribution (what OpenAI's logprobs report); top: n_top_logprobs best
 * alternatives by that distribution, sorted. either may be NULL. */
int32_t sampler_sample(struct sampler *s, const float *logits, float *logprob,
                       struct sample_top *top);

/* what sampler_sample returns for a plain greedy sampler (sampler_plain_greedy), without
 * one: the argmax of raw logits (ties: lowest id) and its log-softmax to *logprob */
int32_t sample_greedy(const float *logits, int32_t n_vocab, float *logprob);
/* temperature 0 (or top_k 1), no bias, no penalties and no alternatives asked: its token and
 * logprob are sample_greedy's, so a backend may pick them where the logits are */
int sampler_plain_greedy(const struct sampler *s);

/* --- sampling where the logits are (a backend's sample op) ----------------
 * a backend that samples rows itself takes each row's sample_dev_row and gives back a
 * sample_dev_out; sampler_dev_finish turns that into what sampler_sample would have returned
 * for the same logits, bit for bit: the backend copies this file's arithmetic (the exp
 * polynomial, the order of every float sum, the double sums across blocks), and what needs
 * libm (log) stays here. */
#define SAMPLE_DEV_MAX_TOP 20 /* n_top_logprobs' range */

struct sample_dev_row {
    float temperature; /* the row's sample_params, as sampler_sample reads them */
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t n_top;            /* n_top_logprobs */
    double log_min_p;         /* log((double)min_p), this build's libm; 0 when min_p is 0 */
    double u;                 /* the uniform the row's draw takes, if it draws (not yet taken) */
    uint32_t n_pen;           /* distinct ids the penalties touch (0: none or penalties off) */
    const int32_t *pen_id;    /* (n_pen) those ids */
    const int32_t *pen_count; /* (n_pen) times each is in the penalty window */
    /* structured output: the ids the row's grammar allows next, a bit each for ids below
     * n_allow (bit i % 32 of word i / 32; ids from n_allow on are never allowed), applied after
     * the penalties; NULL: every id */
    const uint32_t *allow;
    int32_t n_allow;
};

struct sample_dev_out {
    int32_t id;      /* the token */
    int32_t status;  /* 0 picked; 1 the backend could not (the caller samples the logits) */
    int32_t drew;    /* 1 when the pick took the row's uniform u */
    float raw_max;   /* max of the raw logits, nan skipped (-inf: none) */
    double raw_sum;  /* exp weights of the raw logits at sanitize(raw_max), temperature 1 */
    float raw_logit; /* the raw logit of id */
    int32_t n_top;   /* entries in top_id / top_v: min(n_top, n_vocab) */
    int32_t top_id[SAMPLE_DEV_MAX_TOP]; /* the n_top best raw logits, best first (ties: id) */
    float top_v[SAMPLE_DEV_MAX_TOP];    /* their values, sanitized */
};

/* 1 when this build's exp weights are the ones a backend copies (avx2 + fma: eight-lane
 * sums a 64-block); 0: rows go to sampler_sample */
int sample_dev_supported(void);
/* the row for s's next sample: params, u (peeked, not taken), the penalty ids with their
 * counts into pen_id / pen_count (cap entries each; r points at them) and a grammar's mask of
 * the ids it allows next (r->allow points into s: it holds until the pick is finished). 1 when
 * the window holds more than cap distinct ids, s has a logit bias or its grammar's mask cannot
 * be had (sample that row with sampler_sample), else 0 */
int sampler_dev_row(struct sampler *s, struct sample_dev_row *r, int32_t *pen_id,
                    int32_t *pen_count, uint32_t cap);
/* a backend's pick (status 0) as sampler_sample returns it: the token, its logprob and the
 * top alternatives (either may be NULL); takes the uniform when o->drew and moves a grammar on
 * by the token */
int32_t sampler_dev_finish(struct sampler *s, const struct sample_dev_out *o, float *logprob,
                           struct sample_top *top);
/* the reference a backend's sample op is tested against: o as it gives it back for logits
 * (s's grammar, if any, stays where it is: sampler_dev_finish moves it) */
void sampler_sample_dev(struct sampler *s, const float *logits, struct sample_dev_out *o);
/* a backend's sample op done on the cpu from the row alone (its penalty ids and counts, its u):
 * what sampler_sample_dev gives for the sampler the row was made from. scratch: any sampler of
 * the row's vocab (its buffers and params are overwritten, its history and rng unused) */
void sample_dev_run(struct sampler *scratch, const struct sample_dev_row *r, const float *logits,
                    struct sample_dev_out *o);

#endif
