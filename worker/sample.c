/* sample.c - token sampling: penalties, top-k, top-p, min-p, temperature, seeded draw. */
#include "worker/sample.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grammar.h"
#include "common/log.h"

/* top-p histogram resolution (see top_p_vocab) */
#define TOP_P_BUCKETS 1024
/* exp weights are summed in blocks of this many (see exp_weights) */
#define EXP_BLOCK 64

/* a candidate token: its (penalized) logit and id */
struct cand {
    float v;
    int32_t id;
};

struct sampler {
    struct sample_params p;
    int32_t n_vocab;
    uint64_t rng[4]; /* xoshiro256** state */
    /* penalty history: a ring of the last penalty_last_n ids, or every id when
     * penalty_last_n is -1 (then it grows) */
    int32_t *hist;
    size_t hist_cap;
    size_t hist_len;            /* ids stored (<= hist_cap) */
    size_t hist_head;           /* next write slot in the ring */
    int32_t *counts;            /* (n_vocab) scratch, all zero between calls */
    float *work;                /* (n_vocab) penalized logits */
    struct cand *cand;          /* (n_vocab) candidates */
    double *bucket_mass;        /* (TOP_P_BUCKETS) top-p scratch */
    float *weight;              /* (n_vocab) exp weights scratch */
    float *vals;                /* (n_vocab) kept logits, contiguous */
    int32_t *ids;               /* (n_vocab) their token ids */
    double *block_sum;          /* (n_vocab / EXP_BLOCK + 1) weight sums per block */
    const double *u_row;        /* sample_dev_run: the row's uniform, drawn in place of the rng's */
    struct grammar_matcher *gm; /* the answer so far against p.grammar, or NULL */
    int32_t gn;                 /* tokens the grammar's vocabulary has (<= n_vocab) */
    uint32_t *gmask;            /* ((gn + 31) / 32) the ids the grammar allows next */
    int gmask_ready;            /* gmask holds the mask of the grammar's current state */
    struct sample_bias *bias;   /* (p.n_bias) the logit bias, p.bias points here */
};

void sample_params_default(struct sample_params *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->penalty_last_n = -1;
    p->seed = 0;
    p->n_top_logprobs = 0;
}

/* true when lo <= v <= hi and v is a number */
static int in_range(float v, float lo, float hi)
{
    return v >= lo && v <= hi;
}

int sample_params_check(const struct sample_params *p, char *errbuf, size_t errlen)
{
    const char *msg = NULL;
    char tmp[160];
    if (!in_range(p->temperature, 0.0f, 100.0f)) {
        snprintf(tmp, sizeof(tmp), "temperature is %g; it must be in [0, 100] (0 = greedy)",
                 (double)p->temperature);
        msg = tmp;
    } else if (p->top_k < 0) {
        snprintf(tmp, sizeof(tmp), "top_k is %d; it must be >= 0 (0 = off)", (int)p->top_k);
        msg = tmp;
    } else if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        snprintf(tmp, sizeof(tmp), "top_p is %g; it must be in (0, 1] (1 = off)", (double)p->top_p);
        msg = tmp;
    } else if (!in_range(p->min_p, 0.0f, 1.0f)) {
        snprintf(tmp, sizeof(tmp), "min_p is %g; it must be in [0, 1] (0 = off)", (double)p->min_p);
        msg = tmp;
    } else if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 10.0f)) {
        snprintf(tmp, sizeof(tmp), "repetition_penalty is %g; it must be in (0, 10] (1 = off)",
                 (double)p->repetition_penalty);
        msg = tmp;
    } else if (!in_range(p->presence_penalty, -2.0f, 2.0f)) {
        snprintf(tmp, sizeof(tmp), "presence_penalty is %g; it must be in [-2, 2] (0 = off)",
                 (double)p->presence_penalty);
        msg = tmp;
    } else if (!in_range(p->frequency_penalty, -2.0f, 2.0f)) {
        snprintf(tmp, sizeof(tmp), "frequency_penalty is %g; it must be in [-2, 2] (0 = off)",
                 (double)p->frequency_penalty);
        msg = tmp;
    } else if (p->penalty_last_n < -1) {
        snprintf(tmp, sizeof(tmp), "penalty_last_n is %d; it must be >= -1 (-1 = all, 0 = off)",
                 (int)p->penalty_last_n);
        msg = tmp;
    } else if (p->n_top_logprobs < 0 || p->n_top_logprobs > 20) {
        snprintf(tmp, sizeof(tmp), "n_top_logprobs is %d; it must be in [0, 20]",
                 (int)p->n_top_logprobs);
        msg = tmp;
    } else if (p->n_bias < 0 || p->n_bias > SAMPLE_MAX_BIAS || (p->n_bias && !p->bias)) {
        snprintf(tmp, sizeof(tmp), "n_bias is %d; it must be in [0, %d]", (int)p->n_bias,
                 SAMPLE_MAX_BIAS);
        msg = tmp;
    }
    for (int32_t i = 0; !msg && i < p->n_bias; i++) {
        if (p->bias[i].id < 0) {
            snprintf(tmp, sizeof(tmp), "bias %d has token id %d; ids are >= 0", (int)i,
                     (int)p->bias[i].id);
            msg = tmp;
        } else if (!in_range(p->bias[i].bias, -100.0f, 100.0f)) {
            snprintf(tmp, sizeof(tmp), "bias %d (token %d) is %g; it must be in [-100, 100]",
                     (int)i, (int)p->bias[i].id, (double)p->bias[i].bias);
            msg = tmp;
        }
    }
    if (!msg)
        return 0;
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s", msg);
    return RKV_ERANGE;
}

/* --- rng: splitmix64 seeds xoshiro256** ----------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t *s)
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 random bits from the xoshiro state rng */
static double rng_uniform(uint64_t *rng)
{
    return (double)(xoshiro_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

void sampler_skip_draws(struct sampler *s, uint64_t n)
{
    /* every non-greedy sample draws exactly one uniform (sampler_sample) */
    if (s->p.temperature == 0.0f || s->p.top_k == 1)
        return;
    while (n--)
        xoshiro_next(s->rng);
}

/* --- lifecycle ------------------------------------------------------------ */

int sampler_create(struct sampler **out, const struct sample_params *p, int32_t n_vocab)
{
    *out = NULL;
    if (n_vocab <= 0 || sample_params_check(p, NULL, 0))
        return RKV_EINVAL;
    struct sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return RKV_ENOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    s->hist_cap = p->penalty_last_n > 0 ? (size_t)p->penalty_last_n : 64;
    s->hist = malloc(s->hist_cap * sizeof(*s->hist));
    s->counts = calloc((size_t)n_vocab, sizeof(*s->counts));
    s->work = malloc((size_t)n_vocab * sizeof(*s->work));
    s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
    s->bucket_mass = malloc(TOP_P_BUCKETS * sizeof(*s->bucket_mass));
    s->weight = malloc((size_t)n_vocab * sizeof(*s->weight));
    s->vals = malloc((size_t)n_vocab * sizeof(*s->vals));
    s->ids = malloc((size_t)n_vocab * sizeof(*s->ids));
    s->block_sum = malloc(((size_t)n_vocab / EXP_BLOCK + 1) * sizeof(*s->block_sum));
    s->p.bias = NULL;
    if (p->n_bias) {
        s->bias = malloc((size_t)p->n_bias * sizeof(*s->bias));
        if (s->bias)
            memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof(*s->bias));
        s->p.bias = s->bias;
    }
    if (!s->hist || !s->counts || !s->work || !s->cand || !s->bucket_mass || !s->weight ||
        !s->vals || !s->ids || !s->block_sum || (p->n_bias && !s->bias)) {
        sampler_destroy(s);
        return RKV_ENOMEM;
    }
    if (p->grammar) {
        /* a model may have more output rows than its tokenizer has tokens (padding): the
         * grammar never allows those */
        s->gn = grammar_vocab_n(p->grammar_vocab);
        int rc = s->gn <= n_vocab ? grammar_matcher_create(&s->gm, p->grammar, p->grammar_vocab)
                                  : RKV_EINVAL;
        s->gmask = rc ? NULL : malloc(((size_t)s->gn + 31) / 32 * sizeof(*s->gmask));
        if (rc || !s->gmask) {
            sampler_destroy(s);
            return rc ? rc : RKV_ENOMEM;
        }
    }
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].id >= n_vocab) {
            sampler_destroy(s);
            return RKV_EINVAL;
        }
    *out = s;
    return 0;
}

void sampler_destroy(struct sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->counts);
    free(s->work);
    free(s->cand);
    free(s->bucket_mass);
    free(s->weight);
    free(s->vals);
    free(s->ids);
    free(s->block_sum);
    free(s->bias);
    grammar_matcher_destroy(s->gm);
    free(s->gmask);
    free(s);
}

int sampler_grammar_prepare(struct sampler *s)
{
    if (!s->gm || s->gmask_ready)
        return 0;
    int rc = grammar_matcher_mask(s->gm, s->gmask);
    s->gmask_ready = rc == 0;
    return rc;
}

int sampler_has_grammar(const struct sampler *s)
{
    return s->gm != NULL;
}

int sampler_grammar_replay(struct sampler *s, const int32_t *ids, size_t n)
{
    s->gmask_ready = 0;
    for (size_t i = 0; s->gm && i < n; i++) {
        int rc = grammar_matcher_accept(s->gm, ids[i]);
        if (rc)
            return rc;
    }
    return 0;
}

void sampler_accept(struct sampler *s, int32_t id)
{
    if (s->p.penalty_last_n == 0)
        return;
    if (s->p.penalty_last_n < 0 && s->hist_len == s->hist_cap) {
        /* unbounded history: grow; on failure forget the oldest instead */
        int32_t *h = realloc(s->hist, 2 * s->hist_cap * sizeof(*h));
        if (h) {
            s->hist = h;
            s->hist_cap *= 2;
        }
    }
    if (s->hist_len < s->hist_cap) {
        s->hist[(s->hist_head + s->hist_len) % s->hist_cap] = id;
        s->hist_len++;
    } else {
        s->hist[s->hist_head] = id;
        s->hist_head = (s->hist_head + 1) % s->hist_cap;
    }
}

/* --- penalties ------------------------------------------------------------ */

static int penalties_active(const struct sample_params *p)
{
    return p->penalty_last_n != 0 && (p->repetition_penalty != 1.0f ||
                                      p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

/* a logit whose id is c times in the penalty window */
static float penalize_one(float l, int32_t c, const struct sample_params *p)
{
    /* llama.cpp: shrink toward zero-side by the repetition factor */
    l = l <= 0.0f ? l * p->repetition_penalty : l / p->repetition_penalty;
    /* openai: frequency per occurrence, presence once */
    l -= (float)c * p->frequency_penalty + p->presence_penalty;
    return l;
}

void sampler_penalize(struct sampler *s, float *logits)
{
    const struct sample_params *p = &s->p;
    if (!penalties_active(p))
        return;
    size_t n = s->hist_len;
    for (size_t i = 0; i < n; i++) {
        int32_t id = s->hist[(s->hist_head + i) % s->hist_cap];
        if (id >= 0 && id < s->n_vocab)
            s->counts[id]++;
    }
    /* each distinct id once (its count is reset after the first visit) */
    for (size_t i = 0; i < n; i++) {
        int32_t id = s->hist[(s->hist_head + i) % s->hist_cap];
        if (id < 0 || id >= s->n_vocab || s->counts[id] == 0)
            continue;
        int32_t c = s->counts[id];
        s->counts[id] = 0;
        logits[id] = penalize_one(logits[id], c, p);
    }
}

/* --- selection ------------------------------------------------------------ */

/* total order: higher logit first, then lower id */
static int cand_before(struct cand a, struct cand b)
{
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static void cand_swap(struct cand *a, struct cand *b)
{
    struct cand t = *a;
    *a = *b;
    *b = t;
}

/* partial sort: afterwards c[0..k) are the k best (unordered), O(n) average */
static void cand_select(struct cand *c, size_t n, size_t k)
{
    size_t lo = 0, hi = n; /* [lo, hi) holds position k */
    while (hi - lo > 16) {
        size_t mid = lo + (hi - lo) / 2;
        /* median of three into c[lo] as the pivot */
        if (cand_before(c[mid], c[lo]))
            cand_swap(&c[mid], &c[lo]);
        if (cand_before(c[hi - 1], c[lo]))
            cand_swap(&c[hi - 1], &c[lo]);
        if (cand_before(c[hi - 1], c[mid]))
            cand_swap(&c[hi - 1], &c[mid]);
        /* now c[lo] <= c[mid] <= c[hi-1] in order; pivot is the middle */
        cand_swap(&c[lo], &c[mid]);
        struct cand piv = c[lo];
        size_t store = lo + 1;
        for (size_t i = lo + 1; i < hi; i++)
            if (cand_before(c[i], piv))
                cand_swap(&c[i], &c[store++]);
        cand_swap(&c[lo], &c[store - 1]);
        size_t pos = store - 1; /* the pivot's final place */
        if (pos == k)
            return;
        if (pos > k)
            hi = pos;
        else
            lo = pos + 1;
    }
    /* small range: insertion sort finishes it */
    for (size_t i = lo + 1; i < hi; i++) {
        struct cand x = c[i];
        size_t j = i;
        while (j > lo && cand_before(x, c[j - 1])) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
}

static int cand_cmp(const void *a, const void *b)
{
    struct cand x = *(const struct cand *)a, y = *(const struct cand *)b;
    return cand_before(x, y) ? -1 : cand_before(y, x) ? 1 : 0;
}

/* the k best of c[0..n) to the front, sorted best first */
static void cand_top_sorted(struct cand *c, size_t n, size_t k)
{
    if (k < n)
        cand_select(c, n, k);
    qsort(c, k < n ? k : n, sizeof(*c), cand_cmp);
}

/* top-p bucket of logit v: 0 holds the max */
static int bucket_of(float v, float mx, double scale)
{
    double b = ((double)mx - v) * scale;
    return b < TOP_P_BUCKETS - 1 ? (int)b : TOP_P_BUCKETS - 1;
}

/* nan -> -inf and +inf -> FLT_MAX so comparisons stay defined */
static float sanitize(float v)
{
    if (isnan(v))
        return -INFINITY;
    if (v > FLT_MAX)
        return FLT_MAX;
    return v;
}

/* --- vector kernels: max, exp weights ------------------------------------ */

/* exp(x) for x <= 0: exactly 0 below -87 (and for nan), else within 3e-7
 * relative. the scalar and avx2 versions run the same operations, so a tail
 * element gets the value a vector lane would. */
#define EXP_LOG2E  1.44269504f
#define EXP_LN2_HI 0.693145752f
#define EXP_LN2_LO 1.42860677e-6f
#define EXP_FLOOR  -87.0f
/* fused where the cpu has it (then scalar = vector lane); a libm fmaf
 * without hardware support would be slow */
#ifdef __FMA__
#define EXP_FMA(a, b, c) fmaf(a, b, c)
#else
#define EXP_FMA(a, b, c) ((a) * (b) + (c))
#endif

static float exp_neg(float x)
{
    if (!(x >= EXP_FLOOR))
        return 0.0f;
    x = x < 0.0f ? x : 0.0f;
    float n = rintf(x * EXP_LOG2E);
    float r = EXP_FMA(-n, EXP_LN2_LO, EXP_FMA(-n, EXP_LN2_HI, x));
    float q = EXP_FMA(r, 1.0f / 720, 1.0f / 120);
    q = EXP_FMA(q, r, 1.0f / 24);
    q = EXP_FMA(q, r, 1.0f / 6);
    q = EXP_FMA(q, r, 0.5f);
    q = EXP_FMA(q, r, 1.0f);
    q = EXP_FMA(q, r, 1.0f);
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return q * scale;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__)
#include <immintrin.h>
#define SAMPLE_AVX2 1

static __m256 exp_neg8(__m256 x)
{
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_FLOOR), _CMP_GE_OQ); /* nan: 0 */
    /* no clamp at the floor: lanes below it are garbage that keep zeroes */
    x = _mm256_min_ps(x, _mm256_setzero_ps());
    /* rint by the 1.5 * 2^23 trick (the mode is round to nearest, as for
     * rintf); the sum's low bits are n itself, so n + 127 shifted up is
     * 2^n without a conversion */
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), magic);
    __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 q = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 720), _mm256_set1_ps(1.0f / 120));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 24));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 6));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(q, _mm256_castsi256_ps(e)), keep);
}

static float hsum8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}
#endif

/* largest value, nan skipped; -inf when there is none */
static float max_of(const float *x, size_t n)
{
    size_t i = 0;
    float mx = -INFINITY;
#ifdef SAMPLE_AVX2
    /* four accumulators: one would serialize on the max latency */
    __m256 m[4];
    for (int j = 0; j < 4; j++)
        m[j] = _mm256_set1_ps(-INFINITY);
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++)
            m[j] = _mm256_max_ps(_mm256_loadu_ps(x + i + 8 * j), m[j]); /* nan in x: m is kept */
    for (; i + 8 <= n; i += 8)
        m[0] = _mm256_max_ps(_mm256_loadu_ps(x + i), m[0]);
    m[0] = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    float lanes[8];
    _mm256_storeu_ps(lanes, m[0]);
    for (int j = 0; j < 8; j++)
        mx = lanes[j] > mx ? lanes[j] : mx;
#endif
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* w[i] = exp((x[i] - shift) * scale) (w may be NULL), bsum[b] = the sum of
 * block b of EXP_BLOCK weights (bsum may be NULL); returns the total. float
 * sums inside a block, double across blocks. */
static double exp_weights(const float *x, size_t n, float shift, float scale, float *w,
                          double *bsum)
{
    double total = 0.0;
    for (size_t b = 0; b * EXP_BLOCK < n; b++) {
        size_t i = b * EXP_BLOCK, end = i + EXP_BLOCK < n ? i + EXP_BLOCK : n;
        float acc = 0.0f;
#ifdef SAMPLE_AVX2
        if (end - i == EXP_BLOCK) {
            __m256 a = _mm256_setzero_ps();
            for (; i < end; i += 8) {
                __m256 e = exp_neg8(
                    _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(shift)),
                                  _mm256_set1_ps(scale)));
                if (w)
                    _mm256_storeu_ps(w + i, e);
                a = _mm256_add_ps(a, e);
            }
            acc = hsum8(a);
        }
#endif
        for (; i < end; i++) {
            float e = exp_neg((x[i] - shift) * scale);
            if (w)
                w[i] = e;
            acc += e;
        }
        if (bsum)
            bsum[b] = acc;
        total += acc;
    }
    return total;
}

/* index of the first v[i] == x, or n */
static size_t find_first(const float *v, size_t n, float x)
{
    size_t i = 0;
#ifdef SAMPLE_AVX2
    __m256 vx = _mm256_set1_ps(x);
    for (; i + 8 <= n; i += 8) {
        int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), vx, _CMP_EQ_OQ));
        if (m)
            return i + (size_t)__builtin_ctz((unsigned)m);
    }
#endif
    for (; i < n; i++)
        if (v[i] == x)
            return i;
    return n;
}

/* index of the max (ties: lowest id; nan never wins); its value to *mx */
static int32_t argmax(const float *v, int32_t n, float *mx)
{
    *mx = max_of(v, (size_t)n);
    size_t i = find_first(v, (size_t)n, *mx);
    return i < (size_t)n ? (int32_t)i : 0; /* all nan */
}

/* index drawn from x[0..n) with probability softmax(x / temperature), by a
 * uniform from rng; *drew set when it took one (a +inf max, or nothing
 * finite, decides without) */
static size_t draw_index(struct sampler *s, const float *x, size_t n, uint64_t *rng, int *drew)
{
    float mx = max_of(x, n);
    if (mx == -INFINITY)
        return 0; /* every token masked: nothing to weigh */
    if (mx == INFINITY) {
        for (size_t i = 0;; i++)
            if (x[i] == INFINITY)
                return i; /* outweighs everything */
    }
    double *bsum = s->block_sum;
    float *w = s->weight;
    double total = exp_weights(x, n, mx, 1.0f / s->p.temperature, w, bsum);
    double u = (s->u_row ? *s->u_row : rng_uniform(rng)) * total;
    *drew = 1;
    /* find the block, then the token inside it; rounding that leaves u at
     * the very top picks the last token with weight */
    double acc = 0.0;
    size_t n_blocks = (n + EXP_BLOCK - 1) / EXP_BLOCK, pick = 0;
    for (size_t b = 0; b < n_blocks; b++) {
        if (!(bsum[b] > 0.0))
            continue;
        pick = b;
        if (u < acc + bsum[b])
            break;
        if (b + 1 < n_blocks)
            acc += bsum[b];
        else
            break; /* ran off the end: stay in this block */
    }
    size_t i = pick * EXP_BLOCK, end = i + EXP_BLOCK < n ? i + EXP_BLOCK : n, last = i;
    for (; i < end; i++) {
        if (!(w[i] > 0.0f))
            continue;
        last = i;
        acc += w[i];
        if (u < acc)
            return i;
    }
    return last;
}

/* top-p over x[0..n), sorted best first (after top-k): the length of the
 * smallest prefix whose probability (softmax at temperature 1 over x)
 * reaches top_p */
static size_t top_p_sorted(struct sampler *s, const float *x, size_t n)
{
    float *w = s->weight;
    if (n == 0 || x[0] == -INFINITY)
        return n;
    double want = (double)s->p.top_p * exp_weights(x, n, x[0], 1.0f, w, NULL);
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += w[i];
        if (acc >= want)
            return i + 1;
    }
    return n; /* rounding: p of the whole */
}

/* the float order key, descending: a smaller key is a higher value (-0 as +0) */
static uint32_t desc_key(float v)
{
    uint32_t u;
    v += 0.0f;
    memcpy(&u, &v, sizeof(u));
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u; /* ascending */
    return ~u;
}

/* sorts (x, ids)[0..n) best first, the cand_before order, given them in id
 * order: a stable lsd radix sort on the value keeps ties in id order.
 * tx, tid: n entries of scratch */
static void sort_best_first(float *x, int32_t *ids, size_t n, float *tx, int32_t *tid)
{
    float *sx = x, *dx = tx;
    int32_t *sid = ids, *did = tid;
    for (int shift = 0; shift < 32 && n > 1; shift += 8) {
        size_t cnt[256] = {0};
        for (size_t i = 0; i < n; i++)
            cnt[(desc_key(sx[i]) >> shift) & 255]++;
        if (cnt[(desc_key(sx[0]) >> shift) & 255] == n)
            continue; /* one digit value: the order stays */
        size_t pos = 0;
        for (int d = 0; d < 256; d++) {
            size_t c = cnt[d];
            cnt[d] = pos;
            pos += c;
        }
        for (size_t i = 0; i < n; i++) {
            size_t j = cnt[(desc_key(sx[i]) >> shift) & 255]++;
            dx[j] = sx[i];
            did[j] = sid[i];
        }
        float *t = sx;
        sx = dx;
        dx = t;
        int32_t *ti = sid;
        sid = did;
        did = ti;
    }
    if (sx != x) {
        memcpy(x, sx, n * sizeof(*x));
        memcpy(ids, sid, n * sizeof(*ids));
    }
}

/* the smallest float f with (double)f >= d, so that x >= f in float says
 * what (double)x >= d says */
static float float_at_least(double d)
{
    float f = (float)d;
    if ((double)f < d)
        f = nextafterf(f, INFINITY);
    return f;
}

#ifdef SAMPLE_AVX2
/* top-p buckets of 8 logits, computed in double as bucket_of does */
static __m256i bucket_of8(__m256 v, __m256d mx, __m256d scale)
{
    __m256d cap = _mm256_set1_pd(TOP_P_BUCKETS - 1);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    /* min_pd gives cap for nan too (v nan; such tokens weigh 0 anyway) */
    lo = _mm256_min_pd(_mm256_mul_pd(_mm256_sub_pd(mx, lo), scale), cap);
    hi = _mm256_min_pd(_mm256_mul_pd(_mm256_sub_pd(mx, hi), scale), cap);
    return _mm256_set_m128i(_mm256_cvttpd_epi32(hi), _mm256_cvttpd_epi32(lo));
}

/* appends the lanes of (x8, id8) whose mask bit is set to (x, ids) at k;
 * writes 8 lanes, so x and ids need room for k + 8 */
static size_t compact8(float *x, int32_t *ids, size_t k, __m256 x8, __m256i id8, unsigned mask)
{
    /* the set lanes' numbers, low first, as a permutation */
    uint64_t lanes = _pdep_u64(mask, 0x0101010101010101ULL) * 0xff;
    uint64_t idx = _pext_u64(0x0706050403020100ULL, lanes);
    __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)idx));
    _mm256_storeu_ps(x + k, _mm256_permutevar8x32_ps(x8, perm));
    _mm256_storeu_si256((__m256i *)(ids + k), _mm256_permutevar8x32_epi32(id8, perm));
    return k + (size_t)__builtin_popcount(mask);
}

static __m256i iota8(size_t i)
{
    return _mm256_add_epi32(_mm256_set1_epi32((int32_t)i),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* keeps the entries of (v, id)[0..n) with v >= f, in order, in (x, ids);
 * id NULL: the ids are the indices. x == v (and ids == id) filters in place */
static size_t keep_at_least(const float *v, const int32_t *id, size_t n, float f, float *x,
                            int32_t *ids)
{
    size_t i = 0, k = 0;
#ifdef SAMPLE_AVX2
    /* in place the 8 stores at k <= i land on what is already loaded */
    __m256 f8 = _mm256_set1_ps(f);
    for (; i + 8 <= n; i += 8) {
        __m256 v8 = _mm256_loadu_ps(v + i);
        __m256i id8 = id ? _mm256_loadu_si256((const __m256i *)(id + i)) : iota8(i);
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v8, f8, _CMP_GE_OQ));
        k = compact8(x, ids, k, v8, id8, m);
    }
#endif
    for (; i < n; i++) {
        if (v[i] >= f) {
            int32_t t = id ? id[i] : (int32_t)i;
            x[k] = v[i];
            ids[k++] = t;
        }
    }
    return k;
}

/* mass[b] += w[i] for each token in bucket b, in id order (a weight of 0
 * adds nothing, so no test) */
static void bucket_mass(const float *v, const float *w, size_t n, float mx, double scale,
                        double *mass)
{
    size_t i = 0;
#ifdef SAMPLE_AVX2
    __m256d mx4 = _mm256_set1_pd((double)mx), sc4 = _mm256_set1_pd(scale);
    for (; i + 8 <= n; i += 8) {
        int32_t b[8];
        _mm256_storeu_si256((__m256i *)b, bucket_of8(_mm256_loadu_ps(v + i), mx4, sc4));
        for (int j = 0; j < 8; j++)
            mass[b[j]] += w[i + j];
    }
#endif
    for (; i < n; i++)
        mass[bucket_of(v[i], mx, scale)] += w[i];
}

/* float order as unsigned order (ascending; -0 just below +0) */
static uint32_t ord_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

static float float_of_ord(uint32_t u)
{
    u = (u & 0x80000000u) ? u & 0x7fffffffu : ~u;
    float v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

/* the least float v with bucket_of(v) < b: a token is in a bucket below b
 * iff its logit is >= this (bucket_of falls as v rises), so collecting
 * needs float compares, not the double math per token */
static float bucket_floor(float mx, double scale, int b)
{
    if (b <= 0)
        return INFINITY;
    if (b >= TOP_P_BUCKETS)
        return -INFINITY;
    uint32_t lo = ord_of(-FLT_MAX), hi = ord_of(mx); /* bucket_of(mx) is 0 */
    if (bucket_of(-FLT_MAX, mx, scale) < b)
        return -FLT_MAX;
    while (hi - lo > 1) { /* bucket_of(lo) >= b > bucket_of(hi) */
        uint32_t mid = lo + (hi - lo) / 2;
        if (bucket_of(float_of_ord(mid), mx, scale) < b)
            hi = mid;
        else
            lo = mid;
    }
    return float_of_ord(hi);
}

/* the tokens with weight and v >= above to (x, ids), those with weight and
 * at <= v < above to (cx, cid), both in id order; counts to *front, *m */
static void bucket_collect(const float *v, const float *w, size_t n, float above, float at,
                           float *x, int32_t *ids, size_t *front, float *cx, int32_t *cid,
                           size_t *m)
{
    size_t i = 0, k = 0, c = 0;
#ifdef SAMPLE_AVX2
    __m256 above8 = _mm256_set1_ps(above), at8 = _mm256_set1_ps(at);
    for (; i + 8 <= n; i += 8) {
        __m256 v8 = _mm256_loadu_ps(v + i);
        __m256 live = _mm256_cmp_ps(_mm256_loadu_ps(w + i), _mm256_setzero_ps(), _CMP_GT_OQ);
        __m256 hi = _mm256_and_ps(live, _mm256_cmp_ps(v8, above8, _CMP_GE_OQ));
        __m256 lo = _mm256_andnot_ps(hi, _mm256_and_ps(live, _mm256_cmp_ps(v8, at8, _CMP_GE_OQ)));
        k = compact8(x, ids, k, v8, iota8(i), (unsigned)_mm256_movemask_ps(hi));
        unsigned lm = (unsigned)_mm256_movemask_ps(lo);
        if (lm)
            c = compact8(cx, cid, c, v8, iota8(i), lm);
    }
#endif
    for (; i < n; i++) {
        if (!(w[i] > 0.0f))
            continue;
        if (v[i] >= above) {
            x[k] = v[i];
            ids[k++] = (int32_t)i;
        } else if (v[i] >= at) {
            cx[c] = v[i];
            cid[c++] = (int32_t)i;
        }
    }
    *front = k;
    *m = c;
}

/* top-p over the whole vocab v (max mx, finite) without sorting it: one
 * pass buckets the tokens by logit and sums their weights, the buckets are
 * summed best first, and only the bucket where the sum crosses top_p is
 * sorted. the kept tokens go to (s->vals, s->ids): buckets above the cut in
 * id order, then the cut bucket's prefix best first; returns their count.
 * *total: the weight sum at temperature 1 (raw_logprobs needs it too) */
static size_t top_p_vocab(struct sampler *s, const float *v, size_t n, float mx, double *total)
{
    float *w = s->weight; /* by id */
    float *x = s->vals;
    int32_t *ids = s->ids;
    *total = exp_weights(v, n, mx, 1.0f, w, NULL);
    double want = (double)s->p.top_p * *total;
    /* weights below exp(EXP_FLOOR) are 0 anyway: the buckets span that range */
    const double scale = (TOP_P_BUCKETS - 1) / -(double)EXP_FLOOR;
    double *mass = s->bucket_mass;
    memset(mass, 0, TOP_P_BUCKETS * sizeof(*mass));
    bucket_mass(v, w, n, mx, scale, mass);
    double acc = 0.0;
    int cut = TOP_P_BUCKETS - 1;
    for (int b = 0; b < TOP_P_BUCKETS; b++) {
        if (acc + mass[b] >= want) {
            cut = b;
            break;
        }
        acc += mass[b];
    }
    /* buckets above the cut are kept whole; the cut bucket, sorted, gives
     * the prefix that reaches top_p. s->cand's memory holds it meanwhile,
     * as two arrays of n */
    float *cx = (float *)(void *)s->cand;
    int32_t *cid = (int32_t *)(void *)(cx + n);
    size_t front, m;
    bucket_collect(v, w, n, bucket_floor(mx, scale, cut), bucket_floor(mx, scale, cut + 1), x, ids,
                   &front, cx, cid, &m);
    memcpy(x + front, cx, m * sizeof(*x));
    memcpy(ids + front, cid, m * sizeof(*ids));
    sort_best_first(x + front, ids + front, m, cx, cid);
    for (size_t i = front; i < front + m; i++) {
        acc += w[ids[i]];
        if (acc >= want)
            return i + 1;
    }
    return front + m;
}

/* offers x to a heap of the k best so far (worst at the root, have <= k
 * entries); returns the new count */
static size_t heap_offer(struct cand *c, size_t have, size_t k, struct cand x)
{
    size_t j;
    if (have < k) {
        /* sift up: parents are worse than children */
        j = have++;
        while (j > 0 && cand_before(c[(j - 1) / 2], x)) {
            c[j] = c[(j - 1) / 2];
            j = (j - 1) / 2;
        }
        c[j] = x;
        return have;
    }
    if (!cand_before(x, c[0]))
        return have;
    /* replace the worst, sift down */
    j = 0;
    for (;;) {
        size_t l = 2 * j + 1, r = l + 1, m = j;
        struct cand worst = x;
        if (l < k && cand_before(worst, c[l])) {
            m = l;
            worst = c[l];
        }
        if (r < k && cand_before(worst, c[r]))
            m = r;
        if (m == j)
            break;
        c[j] = c[m];
        j = m;
    }
    c[j] = x;
    return have;
}

/* the first i >= from where a 32-block of v may hold a value above thr (or
 * where fewer than 32 are left). nan is never above; a raw value not above
 * thr is not above once sanitized either, so nothing is skipped wrongly. */
static size_t skip_not_above(const float *v, size_t from, size_t n, float thr)
{
    size_t i = from;
#ifdef SAMPLE_AVX2
    __m256 t = _mm256_set1_ps(thr);
    for (; i + 32 <= n; i += 32) {
        /* or of compares, not a max: max_ps would let a nan hide a lane */
        __m256 gt = _mm256_cmp_ps(_mm256_loadu_ps(v + i), t, _CMP_GT_OQ);
        for (int j = 1; j < 4; j++)
            gt = _mm256_or_ps(gt, _mm256_cmp_ps(_mm256_loadu_ps(v + i + 8 * j), t, _CMP_GT_OQ));
        if (_mm256_movemask_ps(gt))
            break;
    }
#else
    (void)n;
    (void)thr;
#endif
    return i;
}

/* the k best of v[0..n) into c[0..k), sorted best first. a heap of the k
 * best so far, worst at the root; once it is full, a token only gets in
 * above the root's value (its id is higher than every id in the heap), so
 * blocks with nothing above it are skipped whole. */
static void top_k_heap(const float *v, size_t n, size_t k, struct cand *c)
{
    size_t have = 0, i = 0;
    for (; i < n && have < k; i++)
        have = heap_offer(c, have, k, (struct cand){sanitize(v[i]), (int32_t)i});
    while (i < n) {
        i = skip_not_above(v, i, n, c[0].v);
        size_t end = i + 32 < n ? i + 32 : n;
        for (; i < end; i++)
            have = heap_offer(c, have, k, (struct cand){sanitize(v[i]), (int32_t)i});
    }
    qsort(c, have, sizeof(*c), cand_cmp);
}

/* what sampler_sample already knows of the raw logits, so raw_logprobs need
 * not scan them again */
struct row_stats {
    int have_max; /* max: max_of(logits) */
    float max;
    int have_sum; /* sum: exp_weights(logits, n, sanitize(max), 1, ...) */
    double sum;
};

/* what a logprob report needs of the raw logits for `id` (the fields of o but
 * id, status and drew): raw_max, raw_sum (0 when nothing is finite), raw_logit
 * and the k best (k <= SAMPLE_DEV_MAX_TOP) */
static void raw_stats(int32_t n, int32_t k, const float *logits, int32_t id,
                      const struct row_stats *rs, struct sample_dev_out *o)
{
    o->raw_max = rs->have_max ? rs->max : max_of(logits, (size_t)n);
    float mx = sanitize(o->raw_max);
    o->raw_sum = 0.0;
    if (mx != -INFINITY)
        o->raw_sum = rs->have_sum ? rs->sum : exp_weights(logits, (size_t)n, mx, 1.0f, NULL, NULL);
    o->raw_logit = logits[id];
    o->n_top = k;
    if (k == 0)
        return;
    struct cand best[SAMPLE_DEV_MAX_TOP];
    top_k_heap(logits, (size_t)n, (size_t)k, best);
    for (int32_t j = 0; j < k; j++) {
        o->top_id[j] = best[j].id;
        o->top_v[j] = best[j].v;
    }
}

/* log-softmax of the raw logits for the chosen token and the k_top best, from
 * raw_stats' fields of o (they hold min(k_top, n) best when top is not NULL) */
static void report_logprobs(int32_t n, int32_t k_top, const struct sample_dev_out *o,
                            float *logprob, struct sample_top *top)
{
    float mx = sanitize(o->raw_max);
    if (mx == -INFINITY) {
        /* nothing finite: report the uniform distribution, not nan */
        double lp = -log((double)n);
        if (logprob)
            *logprob = (float)lp;
        for (int32_t j = 0; top && j < k_top && j < n; j++)
            top[j] = (struct sample_top){j, (float)lp};
        return;
    }
    double lse = (double)mx + log(o->raw_sum);
    if (logprob)
        *logprob = (float)((double)sanitize(o->raw_logit) - lse);
    int32_t k = k_top;
    if (!top || k == 0)
        return;
    if (k > n)
        k = n;
    for (int32_t j = 0; j < k; j++) {
        top[j].id = o->top_id[j];
        top[j].logprob = (float)((double)o->top_v[j] - lse);
    }
}

/* log-softmax of the raw logits for `id` and the top alternatives */
static void raw_logprobs(int32_t n, int32_t k_top, const float *logits, int32_t id,
                         const struct row_stats *rs, float *logprob, struct sample_top *top)
{
    struct sample_dev_out o;
    raw_stats(n, top ? (k_top < n ? k_top : n) : 0, logits, id, rs, &o);
    report_logprobs(n, k_top, &o, logprob, top);
}

/* -inf for the ids of v (n_vocab) a mask does not allow: bits of ids below n_allow, none past */
static void mask_disallowed(float *v, int32_t n_vocab, const uint32_t *allow, int32_t n_allow)
{
    for (int32_t w = 0; w < (n_allow + 31) / 32; w++) {
        uint32_t m = allow[w];
        if (m == UINT32_MAX)
            continue;
        for (int32_t b = 0; b < 32 && w * 32 + b < n_allow; b++)
            if (!(m >> b & 1u))
                v[w * 32 + b] = -INFINITY;
    }
    for (int32_t i = n_allow; i < n_vocab; i++)
        v[i] = -INFINITY;
}

/* ids the grammar does not allow next: -inf in s->work */
static void grammar_mask_logits(struct sampler *s)
{
    if (sampler_grammar_prepare(s))
        return; /* no mask (out of memory): unconstrained this step */
    mask_disallowed(s->work, s->n_vocab, s->gmask, s->gn);
}

/* the picked id moves the grammar on (its mask is then stale). the mask never leaves the grammar without a way on; a
 * failure here would be the grammar's bug, and the answer goes on unconstrained rather than
 * stopping */
static void grammar_advance(struct sampler *s, int32_t id)
{
    s->gmask_ready = 0;
    if (s->gm && grammar_matcher_accept(s->gm, id))
        log_warn("grammar: token %d was not accepted after the mask allowed it", (int)id);
}

/* sampler_sample's pick from raw logits: the token, what it learned of the raw
 * logits on the way (*rs) and whether it took a uniform from rng (*drew) */
static int32_t pick_from(struct sampler *s, const float *logits, const float *v, uint64_t *rng,
                         struct row_stats *rs, int *drew);

static int32_t sample_pick(struct sampler *s, const float *logits, uint64_t *rng,
                           struct row_stats *rs, int *drew)
{
    const float *v = logits;
    if (s->p.n_bias || penalties_active(&s->p) || s->gm) {
        memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(*s->work));
        /* the bias first: the penalties see the logits the client asked for */
        for (int32_t i = 0; i < s->p.n_bias; i++)
            s->work[s->p.bias[i].id] += s->p.bias[i].bias;
        sampler_penalize(s, s->work);
        if (s->gm)
            grammar_mask_logits(s);
        v = s->work;
    }
    return pick_from(s, logits, v, rng, rs, drew);
}

/* the pick from v, the penalized logits (logits itself when no penalty applies) */
static int32_t pick_from(struct sampler *s, const float *logits, const float *v, uint64_t *rng,
                         struct row_stats *rs, int *drew)
{
    const struct sample_params *p = &s->p;
    size_t n_vocab = (size_t)s->n_vocab;
    *rs = (struct row_stats){0};
    *drew = 0;

    float mx;
    int top_k = p->top_k > 0 && (size_t)p->top_k < n_vocab;
    if (p->temperature == 0.0f || p->top_k == 1) {
        int32_t id = argmax(v, (int32_t)n_vocab, &mx);
        *rs = (struct row_stats){.have_max = v == logits, .max = mx};
        return id;
    }
    if (!top_k && p->top_p >= 1.0f && p->min_p <= 0.0f)
        return (int32_t)draw_index(s, v, n_vocab, rng, drew); /* no filter: the whole vocab */
    /* the kept tokens: logits in x, ids in ids */
    float *x = s->vals;
    int32_t *ids = s->ids;
    size_t n;
    if (top_k) {
        struct cand *c = s->cand;
        n = (size_t)p->top_k;
        if (n <= 4096) {
            top_k_heap(v, n_vocab, n, c);
        } else {
            for (size_t i = 0; i < n_vocab; i++)
                c[i] = (struct cand){sanitize(v[i]), (int32_t)i};
            cand_top_sorted(c, n_vocab, n);
        }
        for (size_t i = 0; i < n; i++) {
            x[i] = c[i].v;
            ids[i] = c[i].id;
        }
        if (p->top_p < 1.0f)
            n = top_p_sorted(s, x, n);
        mx = x[0];
    } else {
        mx = max_of(v, n_vocab);
        *rs = (struct row_stats){.have_max = v == logits, .max = mx};
        if (mx == INFINITY || mx == -INFINITY) {
            /* an infinite logit outweighs the rest; none finite: no weights */
            return argmax(v, (int32_t)n_vocab, &mx);
        }
        if (p->top_p < 1.0f) {
            n = top_p_vocab(s, v, n_vocab, mx, &rs->sum);
            rs->have_sum = v == logits; /* same max, same weights */
        } else {
            /* min-p alone: only tokens at or above its floor are copied */
            n = keep_at_least(v, NULL, n_vocab, float_at_least((double)mx + log((double)p->min_p)),
                              x, ids);
        }
    }
    if (p->min_p > 0.0f && (top_k || p->top_p < 1.0f)) {
        /* prob_i >= min_p * prob_max  <=>  v_i >= v_max + log(min_p);
         * the max always passes */
        n = keep_at_least(x, ids, n, float_at_least((double)mx + log((double)p->min_p)), x, ids);
    }
    return ids[draw_index(s, x, n, rng, drew)];
}

int32_t sampler_sample(struct sampler *s, const float *logits, float *logprob,
                       struct sample_top *top)
{
    struct row_stats rs;
    int drew;
    int32_t id = sample_pick(s, logits, s->rng, &rs, &drew);
    if (s->gm)
        grammar_advance(s, id);
    if (logprob || top)
        raw_logprobs(s->n_vocab, s->p.n_top_logprobs, logits, id, &rs, logprob, top);
    return id;
}

int32_t sample_greedy(const float *logits, int32_t n_vocab, float *logprob)
{
    float mx;
    int32_t id = argmax(logits, n_vocab, &mx);
    struct row_stats rs = {.have_max = 1, .max = mx};
    raw_logprobs(n_vocab, 0, logits, id, &rs, logprob, NULL);
    return id;
}

int sampler_plain_greedy(const struct sampler *s)
{
    const struct sample_params *p = &s->p;
    return (p->temperature == 0.0f || p->top_k == 1) && p->n_bias == 0 && !penalties_active(p) &&
           p->n_top_logprobs == 0 && !s->gm;
}

/* --- sampling where the logits are ---------------------------------------- */

int sample_dev_supported(void)
{
#ifdef SAMPLE_AVX2
    return 1;
#else
    return 0;
#endif
}

int sampler_dev_row(struct sampler *s, struct sample_dev_row *r, int32_t *pen_id,
                    int32_t *pen_count, uint32_t cap)
{
    const struct sample_params *p = &s->p;
    *r = (struct sample_dev_row){
        .temperature = p->temperature,
        .top_k = p->top_k,
        .top_p = p->top_p,
        .min_p = p->min_p,
        .repetition_penalty = p->repetition_penalty,
        .presence_penalty = p->presence_penalty,
        .frequency_penalty = p->frequency_penalty,
        .n_top = p->n_top_logprobs,
        .log_min_p = p->min_p > 0.0f ? log((double)p->min_p) : 0.0,
        .pen_id = pen_id,
        .pen_count = pen_count,
    };
    /* peek: the draw is the backend's, sampler_dev_finish takes it */
    uint64_t rng[4];
    memcpy(rng, s->rng, sizeof(rng));
    r->u = rng_uniform(rng);
    if (p->n_bias)
        return 1; /* a backend's sample op has no bias: the row goes to sampler_sample */
    if (s->gm) {
        if (sampler_grammar_prepare(s))
            return 1; /* no mask (out of memory): sampler_sample tries again */
        r->allow = s->gmask;
        r->n_allow = s->gn;
    }
    if (!penalties_active(p))
        return 0;
    /* the window's ids as sampler_penalize visits them; counts is zeroed
     * behind, also past cap, so it stays all zero */
    size_t n = s->hist_len;
    for (size_t i = 0; i < n; i++) {
        int32_t id = s->hist[(s->hist_head + i) % s->hist_cap];
        if (id >= 0 && id < s->n_vocab)
            s->counts[id]++;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = s->hist[(s->hist_head + i) % s->hist_cap];
        if (id < 0 || id >= s->n_vocab || s->counts[id] == 0)
            continue;
        if (m < cap) {
            pen_id[m] = id;
            pen_count[m] = s->counts[id];
        }
        s->counts[id] = 0;
        m++;
    }
    if (m > cap)
        return 1;
    r->n_pen = (uint32_t)m;
    return 0;
}

int32_t sampler_dev_finish(struct sampler *s, const struct sample_dev_out *o, float *logprob,
                           struct sample_top *top)
{
    if (o->drew)
        xoshiro_next(s->rng);
    if (s->gm)
        grammar_advance(s, o->id);
    report_logprobs(s->n_vocab, s->p.n_top_logprobs, o, logprob, top);
    return o->id;
}

void sampler_sample_dev(struct sampler *s, const float *logits, struct sample_dev_out *o)
{
    /* the pick draws from a copy: the backend's u is the peeked one, and
     * sampler_dev_finish takes it from s */
    uint64_t rng[4];
    memcpy(rng, s->rng, sizeof(rng));
    struct row_stats rs;
    int drew;
    int32_t id = sample_pick(s, logits, rng, &rs, &drew);
    memset(o, 0, sizeof(*o));
    o->id = id;
    o->status = 0;
    o->drew = drew;
    int32_t k = s->p.n_top_logprobs < s->n_vocab ? s->p.n_top_logprobs : s->n_vocab;
    raw_stats(s->n_vocab, k, logits, id, &rs, o);
}

void sample_dev_run(struct sampler *scratch, const struct sample_dev_row *r, const float *logits,
                    struct sample_dev_out *o)
{
    struct sampler *s = scratch;
    struct sample_params *p = &s->p;
    p->temperature = r->temperature;
    p->top_k = r->top_k;
    p->top_p = r->top_p;
    p->min_p = r->min_p;
    p->repetition_penalty = r->repetition_penalty;
    p->presence_penalty = r->presence_penalty;
    p->frequency_penalty = r->frequency_penalty;
    p->n_top_logprobs = r->n_top;
    const float *v = logits;
    if (r->n_pen || r->allow) {
        memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(*s->work));
        for (uint32_t j = 0; j < r->n_pen; j++) {
            const int32_t id = r->pen_id[j];
            if (id >= 0 && id < s->n_vocab)
                s->work[id] = penalize_one(s->work[id], r->pen_count[j], p);
        }
        if (r->allow) /* as sample_pick: the grammar's mask after the penalties */
            mask_disallowed(s->work, s->n_vocab, r->allow, r->n_allow);
        v = s->work;
    }
    struct row_stats rs;
    int drew;
    s->u_row = &r->u;
    int32_t id = pick_from(s, logits, v, s->rng, &rs, &drew);
    s->u_row = NULL;
    memset(o, 0, sizeof(*o));
    o->id = id;
    o->drew = drew;
    int32_t k = r->n_top < s->n_vocab ? r->n_top : s->n_vocab;
    raw_stats(s->n_vocab, k, logits, id, &rs, o);
}
