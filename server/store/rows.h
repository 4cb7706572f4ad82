/* rows: how the store reads values out of result rows, shared by its two
 * faces (journal.c, the writer; view.c, the read side). Internal to
 * server/store: nothing outside it includes this. */
#ifndef WORKD_STORE_ROWS_H
#define WORKD_STORE_ROWS_H

#include <jansson.h>
#include <libpq-fe.h>

#include "workstate.h"

/* Every queue's flow control (workd_queues), one row a queue, as
 * rows_queue_limits reads it. */
#define ROWS_QUEUES_SQL                                                                            \
    "SELECT queue, paused, coalesce(max_running, 0), coalesce(max_running_per_key, 0),"            \
    "       coalesce(rate_limit, 0), coalesce(rate_period_ms, 0), key_weights::text"               \
    "  FROM workd_queues"

/* A row of ROWS_QUEUES_SQL; the caller owns the result's weights
 * (queue_limits_clear). */
QueueLimits rows_queue_limits(const PGresult *r, int i);
/* The column as JSON (null when NULL or unreadable): a new reference. */
json_t *rows_json(const PGresult *r, int row, int col);
/* Sets o[key] to the column's time (ms) as RFC 3339, or null. */
void rows_time_field(json_t *o, const char *key, const PGresult *r, int row, int col);

/* An array literal of integers (seqs, inbox entries): "{1,2,3}" (owned). */
char *seqs_array(const int64_t *v, size_t n);
/* An array literal of strings (work ids), each quoted: owned. */
char *text_array(char *const *v, size_t n);

#endif
