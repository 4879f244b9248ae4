/* metrics.c - a small Prometheus registry and its text rendering. */
#include "daemon/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/strbuf.h"

struct series {
    char *labels[METRIC_MAX_LABELS];
    double value;    /* counter, gauge; histogram sum */
    double count;    /* histogram */
    double *buckets; /* histogram: cumulative counts per bound */
    struct series *next;
};

struct metric {
    enum metric_type type;
    char *name;
    char *help;
    char *label_names[METRIC_MAX_LABELS];
    size_t n_labels;
    double *bounds;
    size_t n_bounds;
    struct series *series;
    struct metric *next;
};

struct metrics {
    struct metric *head, *tail;
};

int metrics_create(struct metrics **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : RKV_ENOMEM;
}

static void series_free(struct series *s, size_t n_labels)
{
    for (size_t i = 0; i < n_labels; i++)
        free(s->labels[i]);
    free(s->buckets);
    free(s);
}

void metrics_destroy(struct metrics *m)
{
    if (!m)
        return;
    for (struct metric *f = m->head, *nf; f; f = nf) {
        nf = f->next;
        for (struct series *s = f->series, *ns; s; s = ns) {
            ns = s->next;
            series_free(s, f->n_labels);
        }
        for (size_t i = 0; i < f->n_labels; i++)
            free(f->label_names[i]);
        free(f->name);
        free(f->help);
        free(f->bounds);
        free(f);
    }
    free(m);
}

struct metric *metrics_add(struct metrics *m, enum metric_type type, const char *name,
                           const char *help, const char *const *label_names, const double *buckets,
                           size_t n_buckets)
{
    struct metric *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help);
    for (size_t i = 0; label_names && label_names[i] && i < METRIC_MAX_LABELS; i++)
        f->label_names[f->n_labels++] = strdup(label_names[i]);
    if (type == METRIC_HISTOGRAM && n_buckets) {
        f->bounds = malloc(n_buckets * sizeof *f->bounds);
        if (f->bounds) {
            memcpy(f->bounds, buckets, n_buckets * sizeof *f->bounds);
            f->n_bounds = n_buckets;
        }
    }
    if (m->tail)
        m->tail->next = f;
    else
        m->head = f;
    m->tail = f;
    return f;
}

static struct series *series_get(struct metric *f, const char *const *labels)
{
    for (struct series *s = f->series; s; s = s->next) {
        size_t i = 0;
        while (i < f->n_labels && strcmp(s->labels[i], labels[i]) == 0)
            i++;
        if (i == f->n_labels)
            return s;
    }
    struct series *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    for (size_t i = 0; i < f->n_labels; i++)
        s->labels[i] = strdup(labels[i] ? labels[i] : "");
    if (f->type == METRIC_HISTOGRAM && f->n_bounds)
        s->buckets = calloc(f->n_bounds, sizeof *s->buckets);
    /* append: series render in creation order */
    struct series **pp = &f->series;
    while (*pp)
        pp = &(*pp)->next;
    *pp = s;
    return s;
}

void metric_inc(struct metric *f, const char *const *labels, double by)
{
    struct series *s = f ? series_get(f, labels) : NULL;
    if (s)
        s->value += by;
}

void metric_set(struct metric *f, const char *const *labels, double value)
{
    struct series *s = f ? series_get(f, labels) : NULL;
    if (s)
        s->value = value;
}

void metric_observe(struct metric *f, const char *const *labels, double value)
{
    struct series *s = f ? series_get(f, labels) : NULL;
    if (!s)
        return;
    s->value += value;
    s->count += 1;
    for (size_t i = 0; i < f->n_bounds && s->buckets; i++)
        if (value <= f->bounds[i])
            s->buckets[i] += 1;
}

double metric_get(struct metric *f, const char *const *labels)
{
    struct series *s = f ? series_get(f, labels) : NULL;
    return s ? s->value : 0;
}

double metric_count(struct metric *f, const char *const *labels)
{
    struct series *s = f ? series_get(f, labels) : NULL;
    return s ? s->count : 0;
}

/* label values escaped per the text format: backslash, quote, newline */
static void put_escaped(struct strbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            strbuf_puts(b, "\\\\");
        else if (*s == '"')
            strbuf_puts(b, "\\\"");
        else if (*s == '\n')
            strbuf_puts(b, "\\n");
        else
            strbuf_add(b, s, 1);
    }
}

static void put_labels(struct strbuf *b, const struct metric *f, const struct series *s,
                       const char *le)
{
    if (!f->n_labels && !le)
        return;
    strbuf_puts(b, "{");
    for (size_t i = 0; i < f->n_labels; i++) {
        strbuf_printf(b, "%s%s=\"", i ? "," : "", f->label_names[i]);
        put_escaped(b, s->labels[i]);
        strbuf_puts(b, "\"");
    }
    if (le)
        strbuf_printf(b, "%sle=\"%s\"", f->n_labels ? "," : "", le);
    strbuf_puts(b, "}");
}

static void put_value(struct strbuf *b, double v)
{
    if (isinf(v))
        strbuf_printf(b, " %s\n", v > 0 ? "+Inf" : "-Inf");
    else if (isnan(v))
        strbuf_puts(b, " NaN\n");
    else if (v == floor(v) && fabs(v) < 1e15)
        strbuf_printf(b, " %.0f\n", v);
    else
        strbuf_printf(b, " %.9g\n", v);
}

int metrics_render(struct metrics *m, char **out, size_t *len)
{
    static const char *type_names[] = {"counter", "gauge", "histogram"};
    struct strbuf b = {0};
    for (struct metric *f = m->head; f; f = f->next) {
        strbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
                      type_names[f->type]);
        for (struct series *s = f->series; s; s = s->next) {
            if (f->type != METRIC_HISTOGRAM) {
                strbuf_puts(&b, f->name);
                put_labels(&b, f, s, NULL);
                put_value(&b, s->value);
                continue;
            }
            for (size_t i = 0; i < f->n_bounds; i++) {
                char le[32];
                snprintf(le, sizeof le, "%g", f->bounds[i]);
                strbuf_printf(&b, "%s_bucket", f->name);
                put_labels(&b, f, s, le);
                put_value(&b, s->buckets ? s->buckets[i] : 0);
            }
            strbuf_printf(&b, "%s_bucket", f->name);
            put_labels(&b, f, s, "+Inf");
            put_value(&b, s->count);
            strbuf_printf(&b, "%s_sum", f->name);
            put_labels(&b, f, s, NULL);
            put_value(&b, s->value);
            strbuf_printf(&b, "%s_count", f->name);
            put_labels(&b, f, s, NULL);
            put_value(&b, s->count);
        }
    }
    return strbuf_take(&b, out, len);
}
