/* retention: keeps the history bounded. While this node leads, a thread of its
 * own (with its own database session, never the leader's) adds parts ahead of
 * the leader's clock and drops, whole, the parts older than the retention
 * window: both tables of a part (its events and the work that finished in it)
 * go at once, by DETACH ... CONCURRENTLY and DROP TABLE, so neither the
 * leader's appends nor the readers wait on it. Open and dead work live in
 * workd_open and are never touched. */
#ifndef WORKD_RETENTION_H
#define WORKD_RETENTION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"

typedef struct RetentionConfig {
    const char *database_url;
    int64_t retain_ms;   /* finished work and events are kept at least this long */
    int64_t span_ms;     /* the time one part covers (retention_span) */
    int64_t interval_ms; /* how often it looks */
    /* Whether to act now (this node leads), and the part the leader writes
     * into (never dropped, nor any after it); called from the retention thread. */
    bool (*leading)(void *ud);
    int (*current_part)(void *ud);
    void *ud;
} RetentionConfig;

/* What operators see (/metrics, /cluster); written by the retention thread. */
typedef struct RetentionStats {
    atomic_llong last_run_ms;    /* wall time of the last completed pass (0: never) */
    atomic_llong parts;          /* parts kept */
    atomic_llong oldest_part_ms; /* when the oldest part was first written (or began) */
    atomic_llong parts_dropped;  /* since this process started */
    atomic_llong events_bytes, done_bytes, open_bytes; /* table + index size */
    atomic_llong last_error_ms; /* wall time of the last failed step (0: none) */
} RetentionStats;

typedef struct Retention Retention;

/* The part span for a retention window: a quarter of it, between one second
 * and a day, so that about five to eight parts are kept. */
int64_t retention_span(int64_t retain_ms);

/* Starts the thread; copies cfg's strings. */
Retention *retention_start(const RetentionConfig *cfg, Err *err) WARN_UNUSED;
/* Wakes the thread for a pass now (any thread). */
void retention_kick(Retention *r);
/* Stops and frees (NULL is fine). */
void retention_stop(Retention *r);
const RetentionStats *retention_stats(const Retention *r);

#endif
