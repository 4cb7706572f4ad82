/* metrics: the front-end's counters and histograms for /metrics (Prometheus
 * text format). Lock-free updates (atomics) from any thread. */
#ifndef WORKD_METRICS_H
#define WORKD_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "histogram.h"

#define METRICS_ROUTES 48 /* the last slot counts requests that matched no route */

typedef struct Metrics {
    atomic_llong status[METRICS_ROUTES][6]; /* by status class: 1xx..5xx, [0] other */
    Histogram latency[METRICS_ROUTES];      /* microseconds */
    atomic_llong proxied, proxy_retries, proxy_failures;
    atomic_llong sse_subscribers, sse_events_sent;
    atomic_llong get_waits;
} Metrics;

void metrics_init(Metrics *m);
void metrics_observe(Metrics *m, int route, int status, int64_t us);

#endif
