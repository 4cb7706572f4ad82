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
#include "shard.h"
#include "util.h"
#include "view.h"

#define METRICS_ROUTES 48 /* the last slot counts requests that matched no route */

typedef struct Metrics {
    atomic_llong status[METRICS_ROUTES][6]; /* by status class: 1xx..5xx, [0] other */
    Histogram latency[METRICS_ROUTES];      /* microseconds */
    atomic_llong proxied, proxy_retries, proxy_failures;
    atomic_llong sse_subscribers, sse_events_sent;
    atomic_llong get_waits;
    /* Queues with series of their own besides those whose flow control was
     * set (metrics_render): METRICS_QUEUES_TOP unless the caller sets it
     * after metrics_init, before any thread reads it. */
    int64_t queues_top;
} Metrics;

/* Queue names are chosen by clients, and each queue with open work would be
 * a label value of several families: /metrics labels the queues whose flow
 * control an operator set (PUT /queues/{queue}) and the queues_top others
 * with the most open work; the rest are added up as queue="(other)" (queue
 * names cannot hold parentheses). At most (queues_top + flow-controlled + 1)
 * queues, however many clients name. */
#define METRICS_QUEUES_TOP 100

/* Keys of a queue with their own series in /metrics: the ones with the most
 * ready work; the rest are added up as key="(other)" (keys cannot hold
 * parentheses), work without a key is key="(none)". */
#define METRICS_KEYS_TOP 10

/* Sets up m's histograms and its default queues_top (m zeroed, as xcalloc
 * gives it). */
void metrics_init(Metrics *m);
void metrics_observe(Metrics *m, int route, int status, int64_t us);

/* ---- rendering ---- */
/* What /metrics shows of this node besides its counters; all borrowed. */
typedef struct MetricsNode {
    const char *const *routes;        /* the route names, by route index (http.h) */
    size_t n_routes;                  /* below METRICS_ROUTES */
    int shards;                       /* the cluster's */
    int64_t leader_terms[SHARDS_MAX]; /* of each shard's leader this node knows */
    bool database_up;
    /* Open work by queue (view_open_counts); NULL: unknown, no queue metrics. */
    OpenCounts *open_counts;
    /* The queues' flow control, each may be NULL: limits (view_queue_limits;
     * its queues always have series of their own), backlog per key
     * (view_key_backlog with METRICS_KEYS_TOP), the leader's rate tokens
     * (MC_QUEUE_FLOW). */
    QueueLimitsList *limits;
    KeyBacklogs *backlog;
    const QueueTokens *tokens; /* the leader's buckets; NULL: not asked */
    size_t n_tokens;
    const struct ShardSet *mgrs; /* NULL without the manager role */
} MetricsNode;

/* The Prometheus text of everything: a string the caller frees, *len bytes. */
char *metrics_render(Metrics *m, const MetricsNode *node, size_t *len);

#endif
