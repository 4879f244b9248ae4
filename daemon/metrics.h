/* metrics.h - Prometheus text exposition: counters, gauges, histograms with labels. */
#ifndef RKV_METRICS_H
#define RKV_METRICS_H

#include <stddef.h>

/* a registry of metric families; each family has fixed label names and a
 * series per distinct label-value tuple. not thread-safe (rkvd's loop owns
 * it). names follow vLLM's where the meaning matches, with the "rkv:"
 * prefix, so vLLM dashboards work after a prefix change. */
enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

#define METRIC_MAX_LABELS 3

struct metrics;
struct metric; /* one family */

int metrics_create(struct metrics **out);
void metrics_destroy(struct metrics *m);

/* label_names: up to METRIC_MAX_LABELS, NULL-terminated (or NULL);
 * buckets: histogram upper bounds, ascending (+Inf is implicit) */
struct metric *metrics_add(struct metrics *m, enum metric_type type, const char *name,
                           const char *help, const char *const *label_names,
                           const double *buckets, size_t n_buckets);

/* values for a series named by its label values (as many as the family has
 * label names; NULL when it has none) */
void metric_inc(struct metric *f, const char *const *labels, double by);
void metric_set(struct metric *f, const char *const *labels, double value);
void metric_observe(struct metric *f, const char *const *labels, double value);
double metric_get(struct metric *f, const char *const *labels); /* counter/gauge; sum for hist */
double metric_count(struct metric *f, const char *const *labels); /* histogram count */

/* the text format (version 0.0.4) into a malloc'd string */
int metrics_render(struct metrics *m, char **out, size_t *len);

#endif
