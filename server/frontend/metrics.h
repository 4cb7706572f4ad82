/* metrics: the front-end's counters and histograms for /metrics (Prometheus
 * text format). Lock-free updates (atomics) from any thread. */
#ifndef WORKD_METRICS_H
#define WORKD_METRICS_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

#include "histogram.h"
#include "util.h"

#define METRICS_ROUTES 48 /* the last slot counts requests that matched no route */

typedef struct Metrics {
    atomic_llong status[METRICS_ROUTES][6]; /* by status class: 1xx..5xx, [0] other */
    Histogram latency[METRICS_ROUTES];      /* microseconds */
    atomic_llong proxied, proxy_retries, proxy_failures;
    atomic_llong sse_subscribers, sse_events_sent;
    atomic_llong get_waits;
} Metrics;

/* Keys of a queue with their own series in /metrics: the ones with the most
 * ready work; the rest are added up as key="(other)" (keys cannot hold
 * parentheses), work without a key is key="(none)". */
#define METRICS_KEYS_TOP 10

void metrics_init(Metrics *m);
void metrics_observe(Metrics *m, int route, int status, int64_t us);
/* Appends the queues' flow control to b: limits ({queue: the API's limits},
 * journal_queue_limits), backlog per key (journal_key_backlog with
 * METRICS_KEYS_TOP), and the leader's rate tokens ({queue: {"tokens"}},
 * MC_QUEUE_FLOW). Any of them may be NULL: its families are left out. All
 * borrowed. */
void metrics_render_flow(SBuf *b, json_t *limits, json_t *backlog, json_t *tokens);

#endif
