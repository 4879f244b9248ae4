/* sample.c - token sampling: penalties, top-k, top-p, min-p, temperature, seeded draw. */
#include "worker/sample.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* top-p histogram resolution (see filter_top_p) */
#define TOP_P_BUCKETS 1024

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
    size_t hist_len;     /* ids stored (<= hist_cap) */
    size_t hist_head;    /* next write slot in the ring */
    int32_t *counts;     /* (n_vocab) scratch, all zero between calls */
    float *work;         /* (n_vocab) penalized logits */
    struct cand *cand;   /* (n_vocab) candidates */
    double *bucket_mass; /* (TOP_P_BUCKETS) top-p scratch */
    double *weight;      /* (n_vocab) exp(logit - max) scratch */
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

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(struct sampler *s)
{
    return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* --- lifecycle ------------------------------------------------------------ */

int sampler_init(struct sampler **out, const struct sample_params *p, int32_t n_vocab)
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
    if (!s->hist || !s->counts || !s->work || !s->cand || !s->bucket_mass || !s->weight) {
        sampler_free(s);
        return RKV_ENOMEM;
    }
    *out = s;
    return 0;
}

void sampler_free(struct sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->counts);
    free(s->work);
    free(s->cand);
    free(s->bucket_mass);
    free(s->weight);
    free(s);
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
        float l = logits[id];
        /* llama.cpp: shrink toward zero-side by the repetition factor */
        l = l <= 0.0f ? l * p->repetition_penalty : l / p->repetition_penalty;
        /* openai: frequency per occurrence, presence once */
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        logits[id] = l;
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

/* nan -> -inf and +inf -> FLT_MAX so exp() and comparisons stay defined */
static float sanitize(float v)
{
    if (isnan(v))
        return -INFINITY;
    if (v > FLT_MAX)
        return FLT_MAX;
    return v;
}

/* index of the max (ties: lowest id) */
static int32_t argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    float bv = sanitize(v[0]);
    for (int32_t i = 1; i < n; i++) {
        float x = sanitize(v[i]);
        if (x > bv) {
            bv = x;
            best = i;
        }
    }
    return best;
}

/* log-softmax of the raw logits for `id` and the top alternatives */
static void raw_logprobs(const struct sampler *s, const float *logits, int32_t id, float *logprob,
                         struct sample_top *top)
{
    int32_t n = s->n_vocab;
    double mx = sanitize(logits[argmax(logits, n)]);
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += expf(sanitize(logits[i]) - (float)mx);
    double lse = mx + log(sum);
    if (logprob)
        *logprob = (float)((double)sanitize(logits[id]) - lse);
    int32_t k = s->p.n_top_logprobs;
    if (!top || k == 0)
        return;
    if (k > n)
        k = n;
    /* running insertion list of the k best, best first */
    struct cand best[20];
    int32_t have = 0;
    for (int32_t i = 0; i < n; i++) {
        struct cand c = {sanitize(logits[i]), i};
        if (have == k && !cand_before(c, best[k - 1]))
            continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && cand_before(c, best[j - 1])) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = c;
    }
    for (int32_t j = 0; j < k; j++) {
        top[j].id = best[j].id;
        top[j].logprob = (float)((double)best[j].v - lse);
    }
}

/* draw from candidates c[0..n) by softmax(v / temperature) */
static int32_t draw(struct sampler *s, const struct cand *c, size_t n)
{
    double inv_t = 1.0 / (double)s->p.temperature;
    float mx = c[0].v;
    for (size_t i = 1; i < n; i++)
        if (c[i].v > mx)
            mx = c[i].v;
    if (mx == -INFINITY)
        return c[0].id; /* every token masked: nothing to weigh */
    double *wt = s->weight;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        wt[i] = expf((c[i].v - mx) * (float)inv_t);
        sum += wt[i];
    }
    double u = rng_uniform(s) * sum;
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += wt[i];
        if (u < acc)
            return c[i].id;
    }
    return c[n - 1].id; /* rounding left u at the very top */
}

/* top-p over c[0..n): keeps the smallest best-first set whose probability
 * (softmax at temperature 1 over c) reaches top_p and moves it to the front;
 * returns its size. when c is not sorted it avoids sorting the vocab: one
 * pass buckets the tokens by logit, the buckets are summed best first, and
 * only the bucket where the sum crosses top_p is sorted. */
static size_t filter_top_p(struct sampler *s, struct cand *c, size_t n, int sorted)
{
    float mx = c[0].v, mn = c[0].v;
    for (size_t i = 1; i < n; i++) {
        if (c[i].v > mx)
            mx = c[i].v;
        if (c[i].v < mn && c[i].v > -INFINITY)
            mn = c[i].v;
    }
    if (mx == -INFINITY)
        return n;
    /* weights by token id: c gets reordered below */
    double *wt = s->weight;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        wt[c[i].id] = expf(c[i].v - mx);
        total += wt[c[i].id];
    }
    double want = (double)s->p.top_p * total;
    if (sorted) {
        double acc = 0.0;
        for (size_t i = 0; i < n; i++) {
            acc += wt[c[i].id];
            if (acc >= want)
                return i + 1;
        }
        return n; /* rounding: p of the whole */
    }
    /* bucket b holds logits in (mx - (b+1)/scale, mx - b/scale] */
    double span = (double)mx - mn;
    double scale = span > 0.0 ? (TOP_P_BUCKETS - 1) / span : 0.0;
    double *mass = s->bucket_mass;
    memset(mass, 0, TOP_P_BUCKETS * sizeof(*mass));
    for (size_t i = 0; i < n; i++)
        mass[bucket_of(c[i].v, mx, scale)] += wt[c[i].id];
    double acc = 0.0;
    int cut = TOP_P_BUCKETS - 1;
    for (int b = 0; b < TOP_P_BUCKETS; b++) {
        if (acc + mass[b] >= want) {
            cut = b;
            break;
        }
        acc += mass[b];
    }
    /* buckets above the cut in front, then the cut bucket, sorted */
    size_t front = 0;
    for (size_t i = 0; i < n; i++)
        if (bucket_of(c[i].v, mx, scale) < cut)
            cand_swap(&c[i], &c[front++]);
    size_t end = front;
    for (size_t i = front; i < n; i++)
        if (bucket_of(c[i].v, mx, scale) == cut)
            cand_swap(&c[i], &c[end++]);
    qsort(c + front, end - front, sizeof(*c), cand_cmp);
    for (size_t i = front; i < end; i++) {
        acc += wt[c[i].id];
        if (acc >= want)
            return i + 1;
    }
    return end;
}

int32_t sampler_sample(struct sampler *s, const float *logits, float *logprob,
                       struct sample_top *top)
{
    const struct sample_params *p = &s->p;
    int32_t n_vocab = s->n_vocab;
    const float *v = logits;
    if (penalties_active(p)) {
        memcpy(s->work, logits, (size_t)n_vocab * sizeof(*s->work));
        sampler_penalize(s, s->work);
        v = s->work;
    }

    int32_t id;
    if (p->temperature == 0.0f || p->top_k == 1) {
        id = argmax(v, n_vocab);
    } else {
        struct cand *c = s->cand;
        size_t n = (size_t)n_vocab;
        for (int32_t i = 0; i < n_vocab; i++) {
            c[i].v = sanitize(v[i]);
            c[i].id = i;
        }
        int sorted = 0;
        if (p->top_k > 0 && (size_t)p->top_k < n) {
            cand_top_sorted(c, n, (size_t)p->top_k);
            n = (size_t)p->top_k;
            sorted = 1;
        }
        if (p->top_p < 1.0f) {
            n = filter_top_p(s, c, n, sorted); /* sorted only if it was */
        }
        if (p->min_p > 0.0f) {
            /* prob_i >= min_p * prob_max  <=>  v_i >= v_max + log(min_p) */
            float mx = c[0].v;
            if (!sorted)
                for (size_t i = 1; i < n; i++)
                    if (c[i].v > mx)
                        mx = c[i].v;
            double floor_v = (double)mx + log((double)p->min_p);
            size_t kept = 0;
            for (size_t i = 0; i < n; i++)
                if ((double)c[i].v >= floor_v)
                    c[kept++] = c[i];
            n = kept; /* the max always passes */
        }
        id = draw(s, c, n);
    }
    if (logprob || top)
        raw_logprobs(s, logits, id, logprob, top);
    return id;
}
