/* histogram: a Prometheus-style histogram with fixed bucket bounds, updated
 * lock-free (atomics) from any thread and rendered in the text format. */
#ifndef WORKD_HISTOGRAM_H
#define WORKD_HISTOGRAM_H

#include <stdatomic.h>
#include <stdint.h>

#include "util.h"

#define HISTOGRAM_BUCKETS 12

typedef struct Histogram {
    const int64_t *bounds; /* HISTOGRAM_BUCKETS upper bounds, ascending; static storage */
    double scale;          /* rendered value = observed value / scale (1e6: us -> s) */
    atomic_llong buckets[HISTOGRAM_BUCKETS];
    atomic_llong count;
    atomic_llong sum;
} Histogram;

/* Bounds for durations in microseconds (250 us .. 5 s) and for sizes (1 .. 5000). */
extern const int64_t histogram_us_bounds[HISTOGRAM_BUCKETS];
extern const int64_t histogram_size_bounds[HISTOGRAM_BUCKETS];

void histogram_init(Histogram *h, const int64_t *bounds, double scale);
void histogram_observe(Histogram *h, int64_t v);
/* Appends the _bucket, _sum and _count lines of name{labels} (labels may be ""). */
void histogram_render(SBuf *b, const char *name, const char *labels, const Histogram *h);

#endif
