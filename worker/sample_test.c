/* sample_test.c - sampler: determinism, greedy, filters by statistics, penalties, logprobs. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/grammar.h"
#include "worker/sample.h"

#define BIG_VOCAB 152064
#define N_DRAWS   200000L

/* deterministic test logits: splitmix64 -> roughly uniform in [-scale, scale) */
static void fill_logits(float *v, int32_t n, uint64_t seed, float scale)
{
    uint64_t x = seed;
    for (int32_t i = 0; i < n; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        v[i] = (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
    }
}

static struct sampler *make(const struct sample_params *p, int32_t n_vocab)
{
    struct sampler *s = NULL;
    assert_int_equal(sampler_create(&s, p, n_vocab), 0);
    assert_non_null(s);
    return s;
}

/* draws n tokens into counts (n_vocab entries) */
static void draw_counts(const struct sample_params *p, const float *logits, int32_t n_vocab, long n,
                        long *counts)
{
    struct sampler *s = make(p, n_vocab);
    memset(counts, 0, (size_t)n_vocab * sizeof(*counts));
    for (long i = 0; i < n; i++) {
        int32_t id = sampler_sample(s, logits, NULL, NULL);
        assert_true(id >= 0 && id < n_vocab);
        counts[id]++;
    }
    sampler_destroy(s);
}

/* every count within 5 binomial standard deviations of n*prob; tokens with
 * prob 0 never drawn */
static void check_freq(const long *counts, const double *prob, int32_t n_vocab, long n)
{
    double chi2 = 0.0;
    int dof = -1;
    for (int32_t i = 0; i < n_vocab; i++) {
        double mean = (double)n * prob[i];
        if (prob[i] == 0.0) {
            if (counts[i] != 0)
                fail_msg("token %d has probability 0 but was drawn %ld times", i, counts[i]);
            continue;
        }
        double sd = sqrt((double)n * prob[i] * (1.0 - prob[i]));
        if (fabs((double)counts[i] - mean) > 5.0 * sd + 1.0)
            fail_msg("token %d: %ld draws, expected %.1f +- %.1f (5 sd)", i, counts[i], mean,
                     5.0 * sd);
        chi2 += ((double)counts[i] - mean) * ((double)counts[i] - mean) / mean;
        dof++;
    }
    /* chi-square: mean dof, sd sqrt(2 dof); 8 sd + 10 is far beyond the
     * 0.999 quantile (26.1 at 8 dof, 330 at 255) */
    if (dof > 0 && chi2 > dof + 8.0 * sqrt(2.0 * dof) + 10.0)
        fail_msg("chi-square %.2f with %d degrees of freedom", chi2, dof);
}

/* softmax(v / t) over the tokens with keep[i] set */
static void softmax_kept(const float *v, const int *keep, int32_t n, double t, double *prob)
{
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (keep[i] && v[i] > mx)
            mx = v[i];
    for (int32_t i = 0; i < n; i++) {
        prob[i] = keep[i] ? exp(((double)v[i] - mx) / t) : 0.0;
        sum += prob[i];
    }
    for (int32_t i = 0; i < n; i++)
        prob[i] /= sum;
}

/* N_DRAWS draws over 8 tokens match softmax(v / temperature) over `keep` */
static void check_draws_n(const struct sample_params *p, const float *v, const int *keep,
                          int32_t n_vocab)
{
    long *counts = malloc((size_t)n_vocab * sizeof(*counts));
    double *prob = malloc((size_t)n_vocab * sizeof(*prob));
    assert_non_null(counts);
    assert_non_null(prob);
    draw_counts(p, v, n_vocab, N_DRAWS, counts);
    softmax_kept(v, keep, n_vocab, p->temperature, prob);
    check_freq(counts, prob, n_vocab, N_DRAWS);
    free(counts);
    free(prob);
}

static void check_draws(const struct sample_params *p, const float *v, const int *keep)
{
    check_draws_n(p, v, keep, 8);
}

static const float small_logits[8] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 1.5f, 0.25f};

static void test_params_check(void **state)
{
    (void)state;
    struct sample_params p;
    char err[200];
    sample_params_default(&p);
    assert_int_equal(sample_params_check(&p, err, sizeof(err)), 0);
    assert_true(p.temperature == 0.0f && p.top_p == 1.0f && p.repetition_penalty == 1.0f);

    /* one field at a time, each message names its field */
    struct sample_params q;
#define CHECK_BAD(field_name, stmt)                                                                \
    do {                                                                                           \
        sample_params_default(&q);                                                                 \
        stmt;                                                                                      \
        err[0] = 0;                                                                                \
        assert_int_equal(sample_params_check(&q, err, sizeof(err)), RKV_ERANGE);                   \
        if (!strstr(err, field_name))                                                              \
            fail_msg("message \"%s\" does not name %s", err, field_name);                          \
    } while (0)
    CHECK_BAD("temperature", q.temperature = -0.1f);
    CHECK_BAD("temperature", q.temperature = 100.5f);
    CHECK_BAD("temperature", q.temperature = NAN);
    CHECK_BAD("top_k", q.top_k = -1);
    CHECK_BAD("top_p", q.top_p = 0.0f);
    CHECK_BAD("top_p", q.top_p = 1.01f);
    CHECK_BAD("min_p", q.min_p = -0.01f);
    CHECK_BAD("min_p", q.min_p = 1.5f);
    CHECK_BAD("repetition_penalty", q.repetition_penalty = 0.0f);
    CHECK_BAD("repetition_penalty", q.repetition_penalty = 10.5f);
    CHECK_BAD("presence_penalty", q.presence_penalty = -2.5f);
    CHECK_BAD("frequency_penalty", q.frequency_penalty = 2.01f);
    CHECK_BAD("penalty_last_n", q.penalty_last_n = -2);
    CHECK_BAD("n_top_logprobs", q.n_top_logprobs = 21);
    CHECK_BAD("n_top_logprobs", q.n_top_logprobs = -1);
    assert_non_null(strstr(err, "[0, 20]"));
    struct sample_bias bias[2] = {{3, 100.0f}, {4, -100.0f}};
    CHECK_BAD("n_bias", (q.n_bias = SAMPLE_MAX_BIAS + 1, q.bias = bias));
    CHECK_BAD("n_bias", q.n_bias = 1);
    CHECK_BAD("bias 1 (token 4)", (q.n_bias = 2, q.bias = bias, bias[1].bias = -100.5f));
    assert_non_null(strstr(err, "[-100, 100]"));
    CHECK_BAD("bias 1 (token 4)", (q.n_bias = 2, q.bias = bias, bias[1].bias = NAN));
    bias[1].bias = -100.0f;
    CHECK_BAD("bias 0 has token id -1", (q.n_bias = 2, q.bias = bias, bias[0].id = -1));
    bias[0].id = 3;

    /* edges are allowed */
    sample_params_default(&q);
    q.temperature = 100.0f;
    q.top_p = 1.0f;
    q.min_p = 1.0f;
    q.repetition_penalty = 10.0f;
    q.presence_penalty = -2.0f;
    q.frequency_penalty = 2.0f;
    q.n_top_logprobs = 20;
    q.n_bias = 2;
    q.bias = bias;
    assert_int_equal(sample_params_check(&q, NULL, 0), 0);

    struct sampler *s = NULL;
    /* an id past the vocabulary */
    assert_int_equal(sampler_create(&s, &q, 4), RKV_EINVAL);
    assert_null(s);
    assert_int_equal(sampler_create(&s, &q, 5), 0);
    sampler_destroy(s);
    s = NULL;
    q.top_k = -3;
    assert_int_equal(sampler_create(&s, &q, 10), RKV_EINVAL);
    assert_null(s);
    sample_params_default(&q);
    assert_int_equal(sampler_create(&s, &q, 0), RKV_EINVAL);
}

/* the bias is added before everything else, greedy included, and kept by the sampler */
static void test_logit_bias(void **state)
{
    (void)state;
    enum { N = 1000 };
    float *logits = malloc(N * sizeof(*logits));
    fill_logits(logits, N, 11, 5.0f);
    int32_t top = sample_greedy(logits, N, NULL);
    struct sample_params p;
    sample_params_default(&p);
    /* +100 on one id: greedy picks it at every step; -100 on the argmax: another pick */
    struct sample_bias bias[2] = {{top == 7 ? 8 : 7, 100.0f}, {top, -100.0f}};
    p.n_bias = 1;
    p.bias = bias;
    struct sampler *s = make(&p, N);
    bias[0].bias = 0.0f; /* the sampler has its own copy */
    assert_false(sampler_plain_greedy(s));
    for (int i = 0; i < 5; i++) {
        float lp;
        int32_t id = sampler_sample(s, logits, &lp, NULL);
        assert_int_equal(id, top == 7 ? 8 : 7);
        sampler_accept(s, id);
        /* the logprob is of the raw logits, as with the penalties */
        float want;
        sample_greedy(logits, N, &want);
        assert_true(lp < want);
    }
    sampler_destroy(s);
    bias[0].bias = 100.0f;
    p.n_bias = 2;
    p.bias = bias;
    s = make(&p, N);
    assert_int_equal(sampler_sample(s, logits, NULL, NULL), bias[0].id);
    sampler_destroy(s);
    p.bias = bias + 1;
    p.n_bias = 1;
    s = make(&p, N);
    int32_t id = sampler_sample(s, logits, NULL, NULL);
    assert_true(id != top);
    float *v = malloc(N * sizeof(*v));
    memcpy(v, logits, N * sizeof(*v));
    v[top] -= 100.0f;
    assert_int_equal(id, sample_greedy(v, N, NULL));
    sampler_destroy(s);

    /* with temperature: the same seed reproduces, and the biased id dominates */
    p.temperature = 1.0f;
    p.seed = 42;
    p.bias = bias;
    p.n_bias = 1;
    bias[0].bias = 20.0f;
    struct sampler *a = make(&p, N), *b = make(&p, N);
    int hits = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = sampler_sample(a, logits, NULL, NULL),
                y = sampler_sample(b, logits, NULL, NULL);
        assert_int_equal(x, y);
        hits += x == bias[0].id;
    }
    assert_true(hits > 190);
    sampler_destroy(a);
    sampler_destroy(b);

    /* before the penalties: a biased id in the history is biased, then penalized */
    sample_params_default(&p);
    p.presence_penalty = 2.0f;
    bias[0] = (struct sample_bias){3, 1.0f};
    p.bias = bias;
    p.n_bias = 1;
    const float raw[4] = {0.5f, 0.0f, 0.0f, 0.0f};
    s = make(&p, 4);
    sampler_accept(s, 3);
    /* 0 + 1 - 2 = -1 < 0.5 */
    assert_int_equal(sampler_sample(s, raw, NULL, NULL), 0);
    sampler_destroy(s);
    p.presence_penalty = 0.0f;
    s = make(&p, 4);
    assert_int_equal(sampler_sample(s, raw, NULL, NULL), 3);

    /* a biased row is not a backend's to pick */
    struct sample_dev_row row;
    int32_t pen[2];
    assert_int_equal(sampler_dev_row(s, &row, pen, pen + 1, 1), 1);
    sampler_destroy(s);
    free(v);
    free(logits);
}

static void test_greedy_is_argmax(void **state)
{
    (void)state;
    float *v = malloc(BIG_VOCAB * sizeof(*v));
    assert_non_null(v);
    struct sample_params p;
    sample_params_default(&p);
    struct sampler *s = make(&p, BIG_VOCAB);
    for (uint64_t seed = 1; seed <= 5; seed++) {
        fill_logits(v, BIG_VOCAB, seed, 10.0f);
        int32_t best = 0;
        for (int32_t i = 1; i < BIG_VOCAB; i++)
            if (v[i] > v[best])
                best = i;
        assert_int_equal(sampler_sample(s, v, NULL, NULL), best);
    }
    /* ties go to the lowest id */
    for (int32_t i = 0; i < BIG_VOCAB; i++)
        v[i] = 0.0f;
    v[70000] = 3.0f;
    v[1234] = 3.0f;
    v[150000] = 3.0f;
    assert_int_equal(sampler_sample(s, v, NULL, NULL), 1234);
    sampler_destroy(s);
    free(v);
}

static void test_top_k1_is_greedy(void **state)
{
    (void)state;
    float v[1000];
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 1.5f;
    p.top_k = 1;
    p.seed = 99;
    struct sampler *s = make(&p, 1000);
    for (uint64_t seed = 1; seed <= 50; seed++) {
        fill_logits(v, 1000, seed, 1.0f);
        int32_t best = 0;
        for (int32_t i = 1; i < 1000; i++)
            if (v[i] > v[best])
                best = i;
        assert_int_equal(sampler_sample(s, v, NULL, NULL), best);
    }
    sampler_destroy(s);
}

/* a backend picks plain greedy rows with sample_greedy: the same id and logprob, bit for bit,
 * as the sampler; anything that changes the pick or asks for alternatives is not plain */
static void test_plain_greedy_matches_the_sampler(void **state)
{
    (void)state;
    float v[5000];
    struct sample_params p;
    sample_params_default(&p);
    struct sampler *s = make(&p, 5000);
    assert_true(sampler_plain_greedy(s));
    for (uint64_t seed = 1; seed <= 20; seed++) {
        fill_logits(v, 5000, seed, 8.0f);
        if (seed == 2)
            v[17] = v[4000] = 99.0f; /* a tie */
        if (seed == 3)
            v[0] = NAN;
        float lp_s = 0, lp_g = 0;
        int32_t a = sampler_sample(s, v, &lp_s, NULL), b = sample_greedy(v, 5000, &lp_g);
        assert_int_equal(a, b);
        assert_memory_equal(&lp_s, &lp_g, sizeof lp_s);
        if (seed == 2)
            assert_int_equal(b, 17);
    }
    sampler_destroy(s);
    /* not plain: a penalty, top alternatives, a temperature; top_k 1 is */
    struct sample_params q = p;
    q.repetition_penalty = 1.1f;
    s = make(&q, 100);
    assert_false(sampler_plain_greedy(s));
    sampler_destroy(s);
    q = p;
    q.n_top_logprobs = 2;
    s = make(&q, 100);
    assert_false(sampler_plain_greedy(s));
    sampler_destroy(s);
    q = p;
    q.temperature = 0.7f;
    s = make(&q, 100);
    assert_false(sampler_plain_greedy(s));
    sampler_destroy(s);
    q.top_k = 1;
    s = make(&q, 100);
    assert_true(sampler_plain_greedy(s));
    sampler_destroy(s);
}

static void test_seeded_determinism(void **state)
{
    (void)state;
    enum { NV = 5000, STEPS = 300 };
    float *v = malloc(NV * sizeof(*v));
    int32_t a[STEPS], b[STEPS], c[STEPS];
    assert_non_null(v);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_k = 50;
    p.top_p = 0.95f;
    p.min_p = 0.01f;
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.3f;
    p.seed = 1234;
    int32_t *out[3] = {a, b, c};
    for (int run = 0; run < 3; run++) {
        p.seed = run < 2 ? 1234 : 4321;
        struct sampler *s = make(&p, NV);
        for (int t = 0; t < STEPS; t++) {
            fill_logits(v, NV, (uint64_t)t, 4.0f);
            out[run][t] = sampler_sample(s, v, NULL, NULL);
            sampler_accept(s, out[run][t]);
        }
        sampler_destroy(s);
    }
    assert_memory_equal(a, b, sizeof(a));
    int same = 0;
    for (int t = 0; t < STEPS; t++)
        same += a[t] == c[t];
    assert_true(same < STEPS / 2);
    free(v);
}

static void test_temperature_distribution(void **state)
{
    (void)state;
    const float temps[] = {1.0f, 0.5f, 2.5f};
    int keep[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (size_t k = 0; k < sizeof(temps) / sizeof(temps[0]); k++) {
        struct sample_params p;
        sample_params_default(&p);
        p.temperature = temps[k];
        p.seed = 7 + k;
        check_draws(&p, small_logits, keep);
    }
}

static void test_top_k_distribution(void **state)
{
    (void)state;
    /* k = 3 keeps ids 4 (2.0), 6 (1.5), 0 (1.0) */
    int keep[8] = {1, 0, 0, 0, 1, 0, 1, 0};
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.8f;
    p.top_k = 3;
    p.seed = 11;
    check_draws(&p, small_logits, keep);
}

/* the nucleus at temperature 1, computed independently by a full sort */
static void nucleus(const float *v, int32_t n, double top_p, int *keep)
{
    int32_t *order = malloc((size_t)n * sizeof(*order));
    assert_non_null(order);
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        order[i] = i;
        if (v[i] > mx)
            mx = v[i];
    }
    for (int32_t i = 0; i < n; i++)
        sum += exp(v[i] - mx);
    /* selection sort is fine for the small case; big case uses few steps */
    memset(keep, 0, (size_t)n * sizeof(*keep));
    double acc = 0.0;
    for (int32_t r = 0; r < n; r++) {
        int32_t b = r;
        for (int32_t j = r + 1; j < n; j++)
            if (v[order[j]] > v[order[b]] || (v[order[j]] == v[order[b]] && order[j] < order[b]))
                b = j;
        int32_t t = order[r];
        order[r] = order[b];
        order[b] = t;
        keep[order[r]] = 1;
        acc += exp(v[order[r]] - mx) / sum;
        if (acc >= top_p)
            break;
    }
    free(order);
}

static void test_top_p_distribution(void **state)
{
    (void)state;
    int keep[8];
    const float ps[] = {0.5f, 0.8f, 0.97f};
    for (size_t k = 0; k < 3; k++) {
        struct sample_params p;
        sample_params_default(&p);
        p.temperature = 1.3f;
        p.top_p = ps[k];
        p.seed = 21 + k;
        nucleus(small_logits, 8, ps[k], keep);
        check_draws(&p, small_logits, keep);
    }
    /* p = 0.5: probs at t=1 are .34 (id 4), .21 (id 6), .13 (id 0): two tokens */
    nucleus(small_logits, 8, 0.5, keep);
    assert_int_equal(keep[4] + keep[6] + keep[0], 2);
}

static void test_min_p_distribution(void **state)
{
    (void)state;
    /* min_p 0.3: keep logits >= 2.0 + ln 0.3 = 0.796: ids 4, 6, 0 */
    int keep[8] = {1, 0, 0, 0, 1, 0, 1, 0};
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 2.0f;
    p.min_p = 0.3f;
    p.seed = 31;
    check_draws(&p, small_logits, keep);
}

static void test_chain_order(void **state)
{
    (void)state;
    /* top-k 5 then top-p 0.75 over those five (renormalized), then min-p */
    float v5[8];
    int keep[8] = {0};
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.7f;
    p.top_k = 5;
    p.top_p = 0.75f;
    p.min_p = 0.35f;
    p.seed = 41;
    /* the five best: 4 (2.0), 6 (1.5), 0 (1.0), 1 (0.5), 7 (0.25) */
    for (int i = 0; i < 8; i++)
        v5[i] = small_logits[i];
    int top5[8] = {1, 1, 0, 0, 1, 0, 1, 1};
    /* nucleus over the five: probs .415 .252 .153 .093 .072 -> 4, 6, 0 */
    double mx = 2.0, sum = 0.0;
    for (int i = 0; i < 8; i++)
        sum += top5[i] ? exp(v5[i] - mx) : 0.0;
    double acc = 0.0;
    const int by_rank[5] = {4, 6, 0, 1, 7};
    for (int r = 0; r < 5; r++) {
        keep[by_rank[r]] = 1;
        acc += exp(v5[by_rank[r]] - mx) / sum;
        if (acc >= 0.75)
            break;
    }
    assert_int_equal(keep[4] + keep[6] + keep[0] + keep[1] + keep[7], 3);
    /* min-p 0.35 of the max: 2.0 + ln .35 = .95 keeps 0 (1.0) too */
    check_draws(&p, v5, keep);
}

/* 300 tokens: full 64-wide blocks (the vector path) plus a tail, through the
 * whole-vocab paths: no filter, top-p alone, min-p alone */
static void test_vocab_paths_distribution(void **state)
{
    (void)state;
    enum { NV = 300 };
    float v[NV];
    int keep[NV];
    fill_logits(v, NV, 17, 3.0f);
    v[250] = -INFINITY; /* masked tokens are never drawn */
    v[10] = NAN;
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.6f;
    p.seed = 51;
    for (int i = 0; i < NV; i++)
        keep[i] = i != 250 && i != 10;
    float clean[NV];
    for (int i = 0; i < NV; i++)
        clean[i] = keep[i] ? v[i] : -INFINITY;
    check_draws_n(&p, v, keep, NV);

    p.top_p = 0.7f;
    nucleus(clean, NV, 0.7, keep);
    int kept = 0;
    for (int i = 0; i < NV; i++)
        kept += keep[i];
    assert_true(kept > 20 && kept < 200);
    check_draws_n(&p, v, keep, NV);

    p.top_p = 1.0f;
    p.min_p = 0.25f;
    float mx = -INFINITY;
    for (int i = 0; i < NV; i++)
        mx = clean[i] > mx ? clean[i] : mx;
    for (int i = 0; i < NV; i++)
        keep[i] = (double)clean[i] >= (double)mx + log(0.25);
    check_draws_n(&p, v, keep, NV);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

static void test_big_vocab_filters(void **state)
{
    (void)state;
    float *v = malloc(BIG_VOCAB * sizeof(*v));
    float *sorted = malloc(BIG_VOCAB * sizeof(*sorted));
    assert_non_null(v);
    assert_non_null(sorted);
    fill_logits(v, BIG_VOCAB, 5, 8.0f);
    memcpy(sorted, v, BIG_VOCAB * sizeof(*v));
    qsort(sorted, BIG_VOCAB, sizeof(*sorted), cmp_desc);

    /* top-k 40: every draw is at least the 40th best logit */
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 5.0f;
    p.top_k = 40;
    p.seed = 3;
    struct sampler *s = make(&p, BIG_VOCAB);
    int distinct = 0;
    char *seen = calloc(BIG_VOCAB, 1);
    assert_non_null(seen);
    for (int i = 0; i < 400; i++) {
        int32_t id = sampler_sample(s, v, NULL, NULL);
        assert_true(v[id] >= sorted[39]);
        distinct += !seen[id];
        seen[id] = 1;
    }
    assert_int_equal(distinct, 40); /* t = 5 flattens: all 40 show up */
    sampler_destroy(s);

    /* top-p 0.9 without top-k: the nucleus spans thousands of tokens, which
     * forces the widening path; every draw is inside it */
    double mx = sorted[0], sum = 0.0, acc = 0.0;
    for (int32_t i = 0; i < BIG_VOCAB; i++)
        sum += exp((double)v[i] - mx);
    int32_t m = 0;
    while (acc < 0.9 * sum)
        acc += exp((double)sorted[m++] - mx);
    assert_true(m > 1024);
    p.top_k = 0;
    p.top_p = 0.9f;
    p.temperature = 1.0f;
    s = make(&p, BIG_VOCAB);
    for (int i = 0; i < 400; i++) {
        int32_t id = sampler_sample(s, v, NULL, NULL);
        assert_true(v[id] >= sorted[m - 1]);
    }
    sampler_destroy(s);
    free(seen);
    free(sorted);
    free(v);
}

static void test_penalties_exact(void **state)
{
    (void)state;
    struct sample_params p;
    sample_params_default(&p);
    p.repetition_penalty = 1.25f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 4;
    struct sampler *s = make(&p, 6);
    const float raw[6] = {2.0f, -1.0f, 0.0f, 3.0f, 1.0f, -2.0f};
    /* history 3 3 1 5 0 3: the window of 4 sees 1 5 0 3 */
    const int32_t hist[] = {3, 3, 1, 5, 0, 3};
    for (size_t i = 0; i < 6; i++)
        sampler_accept(s, hist[i]);
    float got[6];
    memcpy(got, raw, sizeof(got));
    sampler_penalize(s, got);
    float want[6];
    memcpy(want, raw, sizeof(want));
    const int32_t count[6] = {1, 1, 0, 1, 0, 1};
    for (int i = 0; i < 6; i++) {
        if (!count[i])
            continue;
        float l = raw[i] <= 0.0f ? raw[i] * 1.25f : raw[i] / 1.25f;
        want[i] = l - ((float)count[i] * 0.25f + 0.5f);
    }
    for (int i = 0; i < 6; i++)
        if (got[i] != want[i])
            fail_msg("id %d: got %.9g want %.9g", i, (double)got[i], (double)want[i]);
    sampler_destroy(s);

    /* unbounded history: counts accumulate, frequency scales with count */
    p.penalty_last_n = -1;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 1.5f;
    s = make(&p, 6);
    for (int i = 0; i < 100; i++)
        sampler_accept(s, 2);
    sampler_accept(s, 4);
    memcpy(got, raw, sizeof(got));
    sampler_penalize(s, got);
    assert_true(got[2] == 0.0f - 150.0f);
    assert_true(got[4] == 1.0f - 1.5f);
    assert_true(got[0] == 2.0f && got[3] == 3.0f);
    /* greedy sees penalized logits and never modifies the caller's */
    float before[6];
    memcpy(before, raw, sizeof(before));
    assert_int_equal(sampler_sample(s, raw, NULL, NULL), 3);
    sampler_accept(s, 3);
    sampler_accept(s, 3);
    /* id 3: 3 - 2*1.5 = 0 < id 0's 2.0 */
    assert_int_equal(sampler_sample(s, raw, NULL, NULL), 0);
    assert_memory_equal(before, raw, sizeof(raw));
    sampler_destroy(s);

    /* penalty_last_n 0 turns penalties off */
    p.penalty_last_n = 0;
    s = make(&p, 6);
    sampler_accept(s, 3);
    memcpy(got, raw, sizeof(got));
    sampler_penalize(s, got);
    assert_memory_equal(got, raw, sizeof(raw));
    sampler_destroy(s);
}

static void test_logprobs(void **state)
{
    (void)state;
    enum { NV = 3000 };
    float v[NV];
    fill_logits(v, NV, 77, 6.0f);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.8f;
    p.top_k = 10;
    p.repetition_penalty = 2.0f; /* must not change the reported logprobs */
    p.n_top_logprobs = 20;
    p.seed = 5;
    struct sampler *s = make(&p, NV);
    for (int i = 0; i < 50; i++)
        sampler_accept(s, i * 7);
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < NV; i++)
        mx = v[i] > mx ? v[i] : mx;
    for (int i = 0; i < NV; i++)
        sum += exp((double)v[i] - mx);
    double lse = mx + log(sum);
    for (int step = 0; step < 20; step++) {
        float lp = 1.0f;
        struct sample_top top[20];
        int32_t id = sampler_sample(s, v, &lp, top);
        assert_true(fabs((double)lp - ((double)v[id] - lse)) < 1e-5);
        for (int j = 0; j < 20; j++) {
            assert_true(fabs((double)top[j].logprob - ((double)v[top[j].id] - lse)) < 1e-5);
            if (j > 0)
                assert_true(top[j].logprob <= top[j - 1].logprob);
        }
        /* top[0] is the raw argmax, and nothing outside top beats top[19] */
        int32_t best = 0;
        for (int i = 1; i < NV; i++)
            if (v[i] > v[best])
                best = i;
        assert_int_equal(top[0].id, best);
        int beat = 0;
        for (int i = 0; i < NV; i++)
            beat += v[i] > v[top[19].id];
        assert_int_equal(beat, 19);
        /* NULL outputs are allowed */
        sampler_sample(s, v, NULL, NULL);
    }
    sampler_destroy(s);
}

/* --- fast paths against sort-based references ------------------------------ */

/* a reference candidate: sanitized logit (nan -> -inf, +inf -> FLT_MAX), id */
struct ref_cand {
    float v;
    int32_t id;
};

static int ref_cmp(const void *a, const void *b)
{
    const struct ref_cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* every token of v, best first: higher logit, then lower id; nan last */
static struct ref_cand *ref_sorted(const float *v, int32_t n)
{
    struct ref_cand *c = malloc((size_t)n * sizeof(*c));
    assert_non_null(c);
    for (int32_t i = 0; i < n; i++) {
        float x = isnan(v[i]) ? -INFINITY : v[i] > FLT_MAX ? FLT_MAX : v[i];
        c[i] = (struct ref_cand){x, i};
    }
    qsort(c, (size_t)n, sizeof(*c), ref_cmp);
    return c;
}

/* a row with what the vector paths must get right: ties, -inf, nan, +inf
 * (kind 0 plain, 1 ties on a coarse grid, 2 specials mixed in, 3 mostly
 * -inf, 4 a narrow range so one top-p bucket holds everything) */
static void fill_row(float *v, int32_t n, uint64_t seed, int kind)
{
    fill_logits(v, n, seed, kind == 4 ? 0.02f : 4.0f);
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int32_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        unsigned r = (unsigned)(x % 100);
        if (kind == 1)
            v[i] = floorf(v[i]);
        else if (kind == 2 && r < 4)
            v[i] = r == 0 ? -INFINITY : r == 1 ? NAN : r == 2 ? INFINITY : floorf(v[i]);
        else if (kind == 3 && r < 90)
            v[i] = -INFINITY;
    }
}

/* sizes around the 8- and 32-wide blocks, and a few big ones */
static int32_t fast_path_size(int t)
{
    static const int32_t big[] = {100, 255, 257, 1000, 4099, 32001};
    return t < 40 ? t + 1 : big[t % 6];
}

static void test_greedy_and_top_logprobs_match_reference(void **state)
{
    (void)state;
    float *v = malloc(32001 * sizeof(*v));
    assert_non_null(v);
    for (int t = 0; t < 52; t++) {
        int32_t n = fast_path_size(t);
        for (int kind = 0; kind < 5; kind++) {
            fill_row(v, n, (uint64_t)(t * 5 + kind + 1), kind);
            struct sample_params p;
            sample_params_default(&p);
            p.n_top_logprobs = 20;
            struct sampler *s = make(&p, n);
            struct sample_top top[20];
            float lp;
            int32_t id = sampler_sample(s, v, &lp, top);
            struct ref_cand *c = ref_sorted(v, n);
            /* argmax: the first max, nan never wins, all nan -> 0 */
            float best = -INFINITY;
            int32_t want = 0;
            for (int32_t i = 0; i < n; i++)
                best = v[i] > best ? v[i] : best;
            while (want < n && !(v[want] == best))
                want++;
            want = want < n ? want : 0;
            if (id != want)
                fail_msg("n %d kind %d: greedy %d, reference %d", n, kind, id, want);
            int32_t k = n < 20 ? n : 20;
            int finite = c[0].v > -INFINITY;
            for (int32_t j = 0; j < k && finite; j++)
                if (top[j].id != c[j].id)
                    fail_msg("n %d kind %d: top[%d] is %d, reference %d", n, kind, j, top[j].id,
                             c[j].id);
            free(c);
            sampler_destroy(s);
        }
    }
    free(v);
}

/* every token drawn under top-k / top-p / min-p is one the sort-based
 * definition keeps (a token within 1e-6 of the top-p edge may go either way) */
static void test_filters_match_reference(void **state)
{
    (void)state;
    float *v = malloc(32001 * sizeof(*v));
    int *ok = malloc(32001 * sizeof(*ok));
    assert_non_null(v);
    assert_non_null(ok);
    static const float top_ps[] = {0.3f, 0.9f, 1.0f};
    for (int t = 0; t < 52; t++) {
        int32_t n = fast_path_size(t);
        for (int kind = 0; kind < 5; kind++) {
            fill_row(v, n, (uint64_t)(t * 7 + kind + 3), kind);
            struct sample_params p;
            sample_params_default(&p);
            p.temperature = 1.5f;
            p.top_p = top_ps[(t + kind) % 3];
            p.top_k = (t + kind) % 4 == 0 ? 1 + (t * 13) % (n + 2) : 0;
            p.min_p = (t + kind) % 5 == 1 ? 0.2f : 0.0f;
            p.seed = (uint64_t)t;
            struct ref_cand *c = ref_sorted(v, n);
            /* the order a filter walks: top-k prefix, then top-p, then min-p */
            int32_t kk = p.top_k > 0 && p.top_k < n ? p.top_k : n;
            double mx = c[0].v, sum = 0.0, acc = 0.0;
            memset(ok, 0, (size_t)n * sizeof(*ok));
            if (mx == -INFINITY || mx >= FLT_MAX) {
                free(c);
                continue; /* no weights to judge by (test_masked_logits) */
            }
            for (int32_t j = 0; j < kk; j++)
                sum += exp((double)c[j].v - mx);
            for (int32_t j = 0; j < kk; j++) {
                double pj = exp((double)c[j].v - mx) / sum;
                int in_p = p.top_p >= 1.0f || acc < (double)p.top_p + 1e-6;
                int in_min = p.min_p <= 0.0f || (double)c[j].v >= mx + log((double)p.min_p);
                ok[c[j].id] = in_p && in_min && pj > 0.0;
                acc += pj;
            }
            struct sampler *s = make(&p, n);
            for (int d = 0; d < (n > 4096 ? 20 : 60); d++) {
                int32_t id = sampler_sample(s, v, NULL, NULL);
                if (id < 0 || id >= n || !ok[id])
                    fail_msg("n %d kind %d top_k %d top_p %g min_p %g: drew %d (logit %g), "
                             "which the reference drops",
                             n, kind, p.top_k, (double)p.top_p, (double)p.min_p, id,
                             id >= 0 && id < n ? (double)v[id] : 0.0);
            }
            sampler_destroy(s);
            free(c);
        }
    }
    free(ok);
    free(v);
}

/* the top-p kept set is exact at its edge: with two tokens per logit and
 * top_p landing between the twins, the lower id of the edge pair is kept
 * and the higher one is not (the cut bucket's sort and its tie order) */
static void test_top_p_edge_ties(void **state)
{
    (void)state;
    for (int32_t n = 2; n <= 600; n += 37) {
        float *v = malloc((size_t)n * sizeof(*v));
        assert_non_null(v);
        /* pairs (i, n-1-i) share a logit, a narrow range: one bucket */
        for (int32_t i = 0; i < n; i++) {
            int32_t r = i < n - 1 - i ? i : n - 1 - i;
            v[i] = 0.001f * (float)(r % 11);
        }
        struct ref_cand *c = ref_sorted(v, n);
        double mx = c[0].v, sum = 0.0;
        for (int32_t j = 0; j < n; j++)
            sum += exp((double)c[j].v - mx);
        /* top_p a little above the mass of the first half: keeps exactly
         * those plus the next (tie: lower id) */
        int32_t half = n / 2;
        double acc = 0.0;
        for (int32_t j = 0; j < half; j++)
            acc += exp((double)c[j].v - mx) / sum;
        struct sample_params p;
        sample_params_default(&p);
        p.temperature = 1.0f;
        p.top_p = (float)(acc + 0.25 * exp((double)c[half].v - mx) / sum);
        if (!(p.top_p > 0.0f && p.top_p < 1.0f) || (double)p.top_p <= acc + 1e-6) {
            free(c);
            free(v);
            continue;
        }
        int *ok = calloc((size_t)n, sizeof(*ok));
        assert_non_null(ok);
        for (int32_t j = 0; j <= half; j++)
            ok[c[j].id] = 1;
        struct sampler *s = make(&p, n);
        for (int d = 0; d < 200; d++) {
            int32_t id = sampler_sample(s, v, NULL, NULL);
            if (!ok[id])
                fail_msg("n %d: drew %d (logit %g), outside the top-p set", n, id, (double)v[id]);
        }
        sampler_destroy(s);
        free(ok);
        free(c);
        free(v);
    }
}

static void test_masked_logits(void **state)
{
    (void)state;
    float v[5] = {-INFINITY, -INFINITY, 1.0f, NAN, -INFINITY};
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 1.0f;
    p.top_p = 0.5f;
    struct sampler *s = make(&p, 5);
    for (int i = 0; i < 100; i++)
        assert_int_equal(sampler_sample(s, v, NULL, NULL), 2);
    float all[3] = {-INFINITY, -INFINITY, NAN};
    sampler_destroy(s);
    p.n_top_logprobs = 2;
    s = make(&p, 3);
    float lp;
    struct sample_top top[2];
    assert_int_equal(sampler_sample(s, all, &lp, top), 0);
    assert_true(fabsf(lp + logf(3.0f)) < 1e-6f); /* finite, not nan */
    assert_true(top[0].id == 0 && top[1].id == 1);
    sampler_destroy(s);
}

/* --- sampling where the logits are (sample_dev_*) --------------------------- */

/* the next uniform of s's stream, peeked by sampler_dev_row (which takes none) */
static double peek_u(struct sampler *s)
{
    static int32_t id[256], count[256];
    struct sample_dev_row r;
    assert_int_equal(sampler_dev_row(s, &r, id, count, 256), 0);
    return r.u;
}

/* the largest raw logit, nan skipped, -inf when none: what raw_max must be */
static float ref_raw_max(const float *v, int32_t n)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    return mx;
}

/* logits of kind: 0 uniform [-4, 4), 1 flat, 2 a large spread, 3 nan / +inf / -inf mixed in,
 * 4 mostly -inf, 5 nothing finite, 6 one +inf, 7 ties on a coarse grid */
static void fill_dev_row(float *v, int32_t n, uint64_t seed, int kind)
{
    switch (kind) {
    case 1:
        for (int32_t i = 0; i < n; i++)
            v[i] = 0.5f;
        break;
    case 2: fill_logits(v, n, seed, 80.0f); break;
    case 3: fill_row(v, n, seed, 2); break;
    case 4: fill_row(v, n, seed, 3); break;
    case 5:
        for (int32_t i = 0; i < n; i++)
            v[i] = i % 3 == 1 ? NAN : -INFINITY;
        break;
    case 6:
        fill_logits(v, n, seed, 4.0f);
        v[(int32_t)(seed % (uint64_t)n)] = INFINITY;
        break;
    case 7: fill_row(v, n, seed, 1); break;
    default: fill_logits(v, n, seed, 4.0f); break;
    }
}

#define N_DEV_PARAMS 16

/* the chain's paths: greedy, temperature alone, top-k (heap and the > 4096 sort), top-p
 * (sorted after top-k and whole-vocab), min-p, combinations, penalties on each */
static void dev_params(int which, uint64_t seed, int n_top, struct sample_params *p)
{
    sample_params_default(p);
    p->seed = seed;
    p->n_top_logprobs = n_top;
    p->temperature = 0.8f;
    switch (which) {
    case 0: p->temperature = 0.0f; break;
    case 1: p->top_k = 1; break;
    case 2: p->temperature = 0.7f; break;
    case 3: p->top_k = 5; break;
    case 4:
        p->top_k = 40;
        p->temperature = 1.2f;
        break;
    case 5: p->top_k = 5000; break;
    case 6:
        p->top_p = 0.5f;
        p->temperature = 1.0f;
        break;
    case 7: p->top_p = 0.9f; break;
    case 8:
        p->top_p = 0.999f;
        p->temperature = 1.5f;
        break;
    case 9: p->min_p = 0.05f; break;
    case 10:
        p->top_k = 40;
        p->top_p = 0.9f;
        p->min_p = 0.05f;
        p->temperature = 0.7f;
        break;
    case 11:
        p->top_p = 0.9f;
        p->min_p = 0.05f;
        break;
    default:
        /* 12..15: penalties with greedy, top-k, top-p (penalized: no shared sum), min-p */
        p->repetition_penalty = 1.3f;
        p->presence_penalty = 0.5f;
        p->frequency_penalty = 0.2f;
        p->penalty_last_n = 64;
        if (which == 12)
            p->temperature = 0.0f;
        else if (which == 13)
            p->top_k = 40;
        else if (which == 14)
            p->top_p = 0.9f;
        else
            p->min_p = 0.05f;
        break;
    }
}

/* sampler_sample on one sampler and sampler_sample_dev + sampler_dev_finish on a twin, over
 * a few steps (the row, then plain rows; the last with NULL outputs): the same token, logprob
 * bit for bit, the same alternatives, and the rng streams in step (the next uniforms equal) */
static void check_dev_case(const struct sample_params *p, int32_t n, const float *row, float *plain,
                           uint64_t seed, const char *what)
{
    struct sampler *a = make(p, n), *b = make(p, n), *scratch = make(p, n);
    /* a history with repeats and ids outside the vocab (penalties skip them) */
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 7;
    for (int i = 0; i < 100; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int32_t id = x % 17 == 0 ? -1 : x % 19 == 0 ? n + 3 : (int32_t)((x >> 8) % (uint64_t)n);
        if (x % 3 == 0)
            id = (int32_t)((x >> 8) % (n < 8 ? (uint64_t)n : 8)); /* repeats */
        sampler_accept(a, id);
        sampler_accept(b, id);
    }
    int32_t k = p->n_top_logprobs < n ? p->n_top_logprobs : n;
    for (int step = 0; step < 4; step++) {
        const float *v = row;
        if (step >= 2) {
            fill_logits(plain, n, seed + (uint64_t)step, 3.0f);
            v = plain;
        }
        int want_out = step < 3;
        float lp_a = 0.0f, lp_b = 0.0f;
        struct sample_top top_a[SAMPLE_DEV_MAX_TOP], top_b[SAMPLE_DEV_MAX_TOP];
        memset(top_a, 0, sizeof(top_a));
        memset(top_b, 0, sizeof(top_b));
        int32_t id_a = sampler_sample(a, v, want_out ? &lp_a : NULL, want_out ? top_a : NULL);

        double u0 = peek_u(b);
        struct sample_dev_out o, o_row;
        sampler_sample_dev(b, v, &o);
        /* the same from the row alone (a backend's view: its penalty list, its u) */
        struct sample_dev_row r;
        int32_t pen_id[128], pen_count[128];
        assert_int_equal(sampler_dev_row(b, &r, pen_id, pen_count, 128), 0);
        sample_dev_run(scratch, &r, v, &o_row);
        if (memcmp(&o, &o_row, sizeof(o)))
            fail_msg("%s step %d: sample_dev_run id %d drew %d, sampler_sample_dev id %d drew %d",
                     what, step, o_row.id, o_row.drew, o.id, o.drew);
        double u1 = peek_u(b);
        if (memcmp(&u0, &u1, sizeof(u0)))
            fail_msg("%s step %d: sampler_sample_dev moved the rng", what, step);
        assert_int_equal(o.status, 0);
        assert_int_equal(o.n_top, k);
        assert_true(o.id >= 0 && o.id < n);
        assert_memory_equal(&o.raw_logit, &v[o.id], sizeof(float));
        float mx = ref_raw_max(v, n);
        assert_memory_equal(&o.raw_max, &mx, sizeof(float));
        if (p->temperature == 0.0f || p->top_k == 1)
            assert_int_equal(o.drew, 0);
        int32_t id_b = sampler_dev_finish(b, &o, want_out ? &lp_b : NULL, want_out ? top_b : NULL);

        if (id_a != id_b)
            fail_msg("%s step %d: sampler_sample %d, dev %d", what, step, id_a, id_b);
        if (memcmp(&lp_a, &lp_b, sizeof(lp_a)))
            fail_msg("%s step %d: logprob %.9g, dev %.9g", what, step, (double)lp_a, (double)lp_b);
        for (int32_t j = 0; j < k; j++)
            if (top_a[j].id != top_b[j].id ||
                memcmp(&top_a[j].logprob, &top_b[j].logprob, sizeof(float)))
                fail_msg("%s step %d: top[%d] %d %.9g, dev %d %.9g", what, step, j, top_a[j].id,
                         (double)top_a[j].logprob, top_b[j].id, (double)top_b[j].logprob);
        assert_memory_equal(top_a + k, top_b + k, sizeof(top_a) - (size_t)k * sizeof(top_a[0]));
        double ua = peek_u(a), ub = peek_u(b);
        if (memcmp(&ua, &ub, sizeof(ua)))
            fail_msg("%s step %d: rng out of step after the pick (drew %d)", what, step, o.drew);
        sampler_accept(a, id_a);
        sampler_accept(b, id_b);
    }
    sampler_destroy(a);
    sampler_destroy(b);
    sampler_destroy(scratch);
}

static void test_dev_matches_sampler(void **state)
{
    (void)state;
    static const int32_t sizes[] = {1, 7, 64, 65, 1000, 32000};
    static const int n_tops[] = {0, 5, 20};
    float *row = malloc(128256 * sizeof(*row)), *plain = malloc(128256 * sizeof(*plain));
    assert_non_null(row);
    assert_non_null(plain);
    char what[160];
    int cases = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        int32_t n = sizes[si];
        for (int kind = 0; kind < 8; kind++) {
            for (int which = 0; which < N_DEV_PARAMS; which++) {
                uint64_t seed = (uint64_t)(si * 1000 + (size_t)kind * 100 + (size_t)which) + 1;
                struct sample_params p;
                dev_params(which, seed, n_tops[(kind + which) % 3], &p);
                fill_dev_row(row, n, seed, kind);
                snprintf(what, sizeof(what), "n %d kind %d params %d n_top %d", n, kind, which,
                         p.n_top_logprobs);
                check_dev_case(&p, n, row, plain, seed, what);
                cases++;
            }
        }
    }
    /* the big vocab, a few: whole-vocab top-p, the big top-k sort, penalties with min-p */
    static const int big[][2] = {{7, 0}, {5, 3}, {15, 6}, {0, 1}};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        struct sample_params p;
        dev_params(big[i][0], 9000 + i, 20, &p);
        fill_dev_row(row, 128256, 9000 + i, big[i][1]);
        snprintf(what, sizeof(what), "n 128256 kind %d params %d", big[i][1], big[i][0]);
        check_dev_case(&p, 128256, row, plain, 9000 + i, what);
        cases++;
    }
    assert_int_equal(cases, 6 * 8 * N_DEV_PARAMS + 4);
    free(row);
    free(plain);
}

/* the uniforms a sampler seeded with seed draws: xoshiro256** seeded by splitmix64 (sample.h) */
static void ref_uniforms(uint64_t seed, int n, double *u)
{
    uint64_t x = seed, s[4];
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        s[i] = z ^ (z >> 31);
    }
    for (int i = 0; i < n; i++) {
        uint64_t r = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9, t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3] << 45 | s[3] >> 19;
        u[i] = (double)(r >> 11) * (1.0 / 9007199254740992.0);
    }
}

/* u is the uniform the next draw takes and peeking it takes nothing: over flat logits of n
 * tokens a draw picks floor(u * n); every field is the sampler's params */
static void test_dev_row_uniform(void **state)
{
    (void)state;
    enum { NV = 1000, STEPS = 200 };
    float v[NV];
    for (int i = 0; i < NV; i++)
        v[i] = -1.25f;
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.9f;
    p.seed = 424242;
    p.n_top_logprobs = 7;
    struct sampler *s = make(&p, NV);
    double want[STEPS];
    ref_uniforms(p.seed, STEPS, want);
    int32_t pen_id[4], pen_count[4];
    for (int t = 0; t < STEPS; t++) {
        struct sample_dev_row r, r2;
        memset(&r, 0xa5, sizeof(r));
        assert_int_equal(sampler_dev_row(s, &r, pen_id, pen_count, 4), 0);
        assert_int_equal(sampler_dev_row(s, &r2, pen_id, pen_count, 4), 0);
        assert_memory_equal(&r.u, &want[t], sizeof(double));
        assert_memory_equal(&r.u, &r2.u, sizeof(double)); /* the peek took nothing */
        assert_true(r.u >= 0.0 && r.u < 1.0);
        assert_int_equal(r.n_pen, 0);
        int32_t id = sampler_sample(s, v, NULL, NULL);
        if (id != (int32_t)(r.u * NV))
            fail_msg("step %d: u %.17g says token %d, the draw took %d", t, r.u,
                     (int32_t)(r.u * NV), id);
    }
    sampler_destroy(s);

    /* the params, as sampler_sample reads them; log_min_p in double */
    sample_params_default(&p);
    p.temperature = 0.65f;
    p.top_k = 33;
    p.top_p = 0.85f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.15f;
    p.presence_penalty = -0.25f;
    p.frequency_penalty = 0.75f;
    p.n_top_logprobs = 20;
    s = make(&p, 50);
    struct sample_dev_row r;
    assert_int_equal(sampler_dev_row(s, &r, pen_id, pen_count, 4), 0);
    assert_true(r.temperature == p.temperature && r.top_k == 33 && r.top_p == p.top_p &&
                r.min_p == p.min_p && r.repetition_penalty == p.repetition_penalty &&
                r.presence_penalty == p.presence_penalty &&
                r.frequency_penalty == p.frequency_penalty && r.n_top == 20);
    double lmp = log((double)p.min_p);
    assert_memory_equal(&r.log_min_p, &lmp, sizeof(lmp));
    assert_int_equal(r.n_pen, 0); /* no history yet */
    sampler_destroy(s);
    p.min_p = 0.0f;
    s = make(&p, 50);
    assert_int_equal(sampler_dev_row(s, &r, pen_id, pen_count, 4), 0);
    assert_true(r.log_min_p == 0.0);
    sampler_destroy(s);
}

/* penalized logits of a sampler after dev_row equal a fresh sampler's with the same history
 * (dev_row leaves its counts scratch zero), and so do their samples */
static void check_same_as_fresh(struct sampler *s, const struct sample_params *p, int32_t n,
                                const int32_t *hist, size_t n_hist)
{
    struct sampler *f = make(p, n);
    for (size_t i = 0; i < n_hist; i++)
        sampler_accept(f, hist[i]);
    float *v = malloc((size_t)n * sizeof(*v)), *ps = malloc((size_t)n * sizeof(*ps)),
          *pf = malloc((size_t)n * sizeof(*pf));
    assert_true(v && ps && pf);
    for (uint64_t t = 0; t < 5; t++) {
        fill_logits(v, n, 300 + t, 2.0f);
        memcpy(ps, v, (size_t)n * sizeof(*v));
        memcpy(pf, v, (size_t)n * sizeof(*v));
        sampler_penalize(s, ps);
        sampler_penalize(f, pf);
        assert_memory_equal(ps, pf, (size_t)n * sizeof(*v));
        assert_int_equal(sampler_sample(s, v, NULL, NULL), sampler_sample(f, v, NULL, NULL));
    }
    free(v);
    free(ps);
    free(pf);
    sampler_destroy(f);
}

static void test_dev_row_penalties(void **state)
{
    (void)state;
    enum { NV = 40 };
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.8f;
    p.repetition_penalty = 1.2f;
    p.frequency_penalty = 0.5f;
    p.penalty_last_n = 12;
    p.seed = 3;
    /* 20 ids through a window of 12: the ring wraps; -1 and 40 are outside the vocab */
    const int32_t hist[] = {5, 6, 7,  8, 9,  10, 11, 12, /* forgotten */
                            3, 9, -1, 3, 40, 17, 9,  3,  0, 17, 39, 3};
    const size_t n_hist = sizeof(hist) / sizeof(hist[0]);
    /* the window 3 9 -1 3 40 17 9 3 0 17 39 3: first occurrences and counts */
    const int32_t want_id[] = {3, 9, 17, 0, 39}, want_count[] = {4, 2, 2, 1, 1};
    const uint32_t distinct = 5;
    struct sampler *s = make(&p, NV);
    for (size_t i = 0; i < n_hist; i++)
        sampler_accept(s, hist[i]);
    int32_t pen_id[8], pen_count[8];
    struct sample_dev_row r;
    for (uint32_t cap = distinct; cap <= 8; cap += 3) {
        memset(pen_id, 0, sizeof(pen_id));
        memset(pen_count, 0, sizeof(pen_count));
        assert_int_equal(sampler_dev_row(s, &r, pen_id, pen_count, cap), 0);
        assert_int_equal(r.n_pen, distinct);
        assert_ptr_equal(r.pen_id, pen_id);
        assert_ptr_equal(r.pen_count, pen_count);
        assert_memory_equal(pen_id, want_id, sizeof(want_id));
        assert_memory_equal(pen_count, want_count, sizeof(want_count));
    }
    check_same_as_fresh(s, &p, NV, hist, n_hist);
    sampler_destroy(s);

    /* one too many distinct ids for cap: 1, and the sampler samples as a fresh one */
    s = make(&p, NV);
    for (size_t i = 0; i < n_hist; i++)
        sampler_accept(s, hist[i]);
    assert_int_equal(sampler_dev_row(s, &r, pen_id, pen_count, distinct - 1), 1);
    assert_int_equal(sampler_dev_row(s, &r, NULL, NULL, 0), 1);
    check_same_as_fresh(s, &p, NV, hist, n_hist);
    sampler_destroy(s);

    /* every id once, an unbounded window of 200 over a vocab of 300 (the counts scratch spans
     * it); cap 199 overflows, 200 fits */
    p.penalty_last_n = -1;
    int32_t big_hist[250], big_id[200], big_count[200];
    for (int i = 0; i < 250; i++)
        big_hist[i] = (i * 7) % 200; /* a permutation of 0..199, then its first 50 again */
    s = make(&p, 300);
    for (int i = 0; i < 250; i++)
        sampler_accept(s, big_hist[i]);
    assert_int_equal(sampler_dev_row(s, &r, big_id, big_count, 199), 1);
    check_same_as_fresh(s, &p, 300, big_hist, 250);
    assert_int_equal(sampler_dev_row(s, &r, big_id, big_count, 200), 0);
    assert_int_equal(r.n_pen, 200);
    for (int i = 0; i < 200; i++) {
        assert_int_equal(big_id[i], (i * 7) % 200);
        assert_int_equal(big_count[i], i < 50 ? 2 : 1);
    }
    sampler_destroy(s);

    /* penalties off (all neutral, or a window of 0): no ids, whatever the history */
    sample_params_default(&p);
    p.temperature = 1.0f;
    for (int off = 0; off < 2; off++) {
        if (off == 1) {
            p.repetition_penalty = 1.3f;
            p.penalty_last_n = 0;
        }
        s = make(&p, NV);
        for (size_t i = 0; i < n_hist; i++)
            sampler_accept(s, hist[i]);
        r.n_pen = 77;
        assert_int_equal(sampler_dev_row(s, &r, NULL, NULL, 0), 0);
        assert_int_equal(r.n_pen, 0);
        sampler_destroy(s);
    }
}

/* where a draw cannot decide (an infinite max, nothing finite) the pick takes no uniform;
 * a plain temperature row takes one */
static void test_dev_drew(void **state)
{
    (void)state;
    enum { NV = 100 };
    float v[NV];
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 8;
    static const float top_ps[] = {1.0f, 0.9f};
    for (int t = 0; t < 2; t++) {
        p.top_p = top_ps[t];
        struct sampler *s = make(&p, NV);
        struct sample_dev_out o;
        fill_logits(v, NV, 1, 2.0f);
        sampler_sample_dev(s, v, &o);
        assert_int_equal(o.drew, 1);
        v[42] = INFINITY;
        sampler_sample_dev(s, v, &o);
        assert_int_equal(o.drew, 0);
        assert_int_equal(o.id, 42);
        for (int i = 0; i < NV; i++)
            v[i] = i % 2 ? NAN : -INFINITY;
        sampler_sample_dev(s, v, &o);
        assert_int_equal(o.drew, 0);
        assert_int_equal(o.id, 0);
        assert_true(o.raw_max == -INFINITY && o.raw_sum == 0.0);
        sampler_destroy(s);
    }
}

static void test_dev_supported(void **state)
{
    (void)state;
#if defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__)
    assert_int_equal(sample_dev_supported(), 1);
#elif !defined(__AVX2__)
    assert_int_equal(sample_dev_supported(), 0);
#endif
}

/* a grammar's sampler: whatever the logits, the answer follows the grammar and ends with the
 * eog token where the grammar can end; a sampler rebuilt from the ids so far goes on alike */
static void test_grammar(void **state)
{
    (void)state;
    /* 0 "{", 1 "}", 2 "a", 3 "b", 4 "ab", 5 "}x", 6 eog, 7 a control token, 8 "x" */
    static const char *const bytes[] = {"{", "}", "a", "b", "ab", "}x", "", "", "x"};
    static const uint32_t lens[] = {1, 1, 1, 1, 2, 2, 0, 0, 1};
    static const uint8_t eog[] = {0, 0, 0, 0, 0, 0, 1, 0, 0};
    const int32_t n_vocab = 10; /* one output row more than the vocabulary: never allowed */
    struct grammar_vocab *v;
    assert_int_equal(grammar_vocab_create(&v, 9, bytes, lens, eog), 0);
    struct grammar *g;
    char err[128];
    static const char gbnf[] = "root ::= \"{\" [ab]{1,6} \"}\"";
    assert_int_equal(grammar_compile(gbnf, sizeof gbnf - 1, &g, err, sizeof err), 0);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 1.0f;
    p.grammar = g;
    p.grammar_vocab = v;
    float logits[10];
    for (uint64_t seed = 1; seed <= 200; seed++) {
        p.seed = seed;
        struct sampler *s = make(&p, n_vocab);
        assert_false(sampler_plain_greedy(s));
        char text[64] = "";
        int32_t ids[32];
        int n = 0;
        for (;;) {
            fill_logits(logits, n_vocab, seed * 100 + (uint64_t)n, 8.0f);
            logits[9] = 1000.0f; /* beyond the vocabulary: masked however large */
            int32_t id = sampler_sample(s, logits, NULL, NULL);
            assert_true(id >= 0 && id <= 8 && id != 7);
            ids[n++] = id;
            if (id == 6)
                break;
            strcat(text, bytes[id]);
            assert_true(n < 16);
            if (n == 2) {
                /* a sampler rebuilt mid-answer: the same state (only "}" or more letters) */
                struct sampler *r = make(&p, n_vocab);
                assert_int_equal(sampler_grammar_replay(r, ids, (size_t)n), 0);
                int32_t bad = 0; /* "{" again */
                assert_int_equal(sampler_grammar_replay(r, &bad, 1), RKV_EINVAL);
                sampler_destroy(r);
            }
        }
        size_t len = strlen(text);
        assert_true(len >= 3 && len <= 8);
        assert_true(text[0] == '{' && text[len - 1] == '}');
        assert_int_equal(strspn(text + 1, "ab"), len - 2);
        sampler_destroy(s);
    }
    /* greedy too: the argmax among the allowed ids */
    p.temperature = 0.0f;
    struct sampler *s = make(&p, n_vocab);
    for (int i = 0; i < n_vocab; i++)
        logits[i] = (float)i; /* "x" (8) is the best id the vocabulary has: never allowed */
    assert_int_equal(sampler_sample(s, logits, NULL, NULL), 0); /* "{" */
    assert_int_equal(sampler_sample(s, logits, NULL, NULL), 4); /* "ab" */
    sampler_destroy(s);
    /* a vocabulary larger than the logits is refused */
    assert_int_equal(sampler_create(&s, &p, 8), RKV_EINVAL);
    /* a backend's sample op takes the grammar's mask with the row: sample_dev_run +
     * sampler_dev_finish pick what sampler_sample picks, step for step, and move the grammar
     * the same way (a repetition penalty on too, applied before the mask as on the host) */
    p.temperature = 1.0f;
    p.repetition_penalty = 1.3f;
    struct sampler *scratch = make(&p, n_vocab);
    for (uint64_t seed = 1; seed <= 100; seed++) {
        p.seed = seed;
        struct sampler *a = make(&p, n_vocab), *b = make(&p, n_vocab);
        for (int n = 0; n < 16; n++) {
            fill_logits(logits, n_vocab, seed * 1000 + (uint64_t)n, 8.0f);
            logits[9] = 1000.0f;
            float lpa = 0, lpb = 0;
            int32_t want = sampler_sample(a, logits, &lpa, NULL);
            struct sample_dev_row row;
            int32_t pen[32];
            assert_int_equal(sampler_dev_row(b, &row, pen, pen + 16, 16), 0);
            assert_non_null(row.allow);
            assert_int_equal(row.n_allow, 9);
            struct sample_dev_out o;
            sample_dev_run(scratch, &row, logits, &o);
            int32_t got = sampler_dev_finish(b, &o, &lpb, NULL);
            assert_int_equal(got, want);
            assert_true(lpa == lpb);
            sampler_accept(a, want);
            sampler_accept(b, got);
            if (want == 6)
                break;
        }
        sampler_destroy(a);
        sampler_destroy(b);
    }
    sampler_destroy(scratch);
    grammar_destroy(g);
    grammar_vocab_destroy(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_greedy_is_argmax),
        cmocka_unit_test(test_top_k1_is_greedy),
        cmocka_unit_test(test_plain_greedy_matches_the_sampler),
        cmocka_unit_test(test_seeded_determinism),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k_distribution),
        cmocka_unit_test(test_top_p_distribution),
        cmocka_unit_test(test_min_p_distribution),
        cmocka_unit_test(test_chain_order),
        cmocka_unit_test(test_vocab_paths_distribution),
        cmocka_unit_test(test_big_vocab_filters),
        cmocka_unit_test(test_penalties_exact),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_masked_logits),
        cmocka_unit_test(test_greedy_and_top_logprobs_match_reference),
        cmocka_unit_test(test_filters_match_reference),
        cmocka_unit_test(test_top_p_edge_ties),
        cmocka_unit_test(test_dev_matches_sampler),
        cmocka_unit_test(test_dev_row_uniform),
        cmocka_unit_test(test_dev_row_penalties),
        cmocka_unit_test(test_dev_drew),
        cmocka_unit_test(test_dev_supported),
        cmocka_unit_test(test_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
