/* metrics: counters and histograms for /metrics in Prometheus text format.
 * Lock-free updates (atomics) from any thread. */
#ifndef WORKD_METRICS_H
#define WORKD_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "util.h"

#define METRICS_ROUTES 24
#define METRICS_BUCKETS 12

typedef struct Histogram {
    atomic_llong buckets[METRICS_BUCKETS]; /* cumulative at render time */
    atomic_llong count;
    atomic_llong sum_us;
} Histogram;

typedef struct Metrics {
    const char *route_names[METRICS_ROUTES];
    atomic_llong status[METRICS_ROUTES][6]; /* by status class: 1xx..5xx, [0] other */
    Histogram latency[METRICS_ROUTES];
    atomic_llong proxied, proxy_retries, proxy_failures;
    atomic_llong sse_subscribers, sse_events_sent;
    atomic_llong get_waiters;
} Metrics;

/* Bucket upper bounds in microseconds. */
extern const int64_t metrics_bucket_us[METRICS_BUCKETS];

void metrics_observe(Metrics *m, int route, int status, int64_t us);
void histogram_observe(Histogram *h, int64_t us);
/* Appends histogram lines for name{labels} to b (labels may be ""). */
void histogram_render(SBuf *b, const char *name, const char *labels, const Histogram *h);

#endif
