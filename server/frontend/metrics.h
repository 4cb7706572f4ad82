/* metrics: the front-end's counters and histograms, and the rendering of
 * /metrics (Prometheus text format) from them and from the manager's. Lock-free
 * updates (atomics) from any thread. */
#ifndef WORKD_METRICS_H
#define WORKD_METRICS_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "histogram.h"
#include "manager.h"

#define METRICS_ROUTES 32 /* the last slot counts requests that matched no route */

typedef struct Metrics {
    atomic_llong status[METRICS_ROUTES][6]; /* by status class: 1xx..5xx, [0] other */
    Histogram latency[METRICS_ROUTES];      /* microseconds */
    atomic_llong proxied, proxy_retries, proxy_failures;
    atomic_llong sse_subscribers, sse_events_sent;
    atomic_llong get_waits;
} Metrics;

void metrics_init(Metrics *m);
void metrics_observe(Metrics *m, int route, int status, int64_t us);

/* ---- rendering ---- */
/* What /metrics shows of this node besides its counters; all borrowed. */
typedef struct MetricsNode {
    const char *const *routes; /* the route names, by route index (http.h) */
    size_t n_routes;           /* below METRICS_ROUTES */
    int64_t leader_term;       /* of the leader this node knows */
    bool is_leader, database_up;
    /* Open work by queue (journal_open_counts): {q: {pending, scheduled,
     * running, oldest_pending_age_s}}; NULL: unknown, no queue metrics. */
    json_t *open_counts;
    const Manager *mgr; /* NULL without the manager role */
} MetricsNode;

/* The Prometheus text of everything: a string the caller frees, *len bytes. */
char *metrics_render(Metrics *m, const MetricsNode *node, size_t *len);

#endif
