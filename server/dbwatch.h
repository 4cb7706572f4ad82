/* dbwatch: what the databases offer a 202, checked at start and every second
 * on a session of its own to each (the home database and each shard's own,
 * stores.h): which server is the primary, its synchronous replication
 * settings and standbys, and whether commits are stuck waiting for a
 * synchronous standby that does not answer. Logged when it changes; read by
 * GET /cluster (the home database's) and /readyz (every database's). */
#ifndef WORKD_DBWATCH_H
#define WORKD_DBWATCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"
#include "stores.h"

typedef struct DbWatch DbWatch;

/* A commit waiting this long for a synchronous standby is reported as stuck. */
#define DBWATCH_STALL_MS 5000
#define DBWATCH_EVERY_MS 1000

/* Starts the watching thread on every database of stores (borrowed: it
 * outlives the watch). Returns NULL (err set) only if the thread cannot
 * start; an unreachable database is retried and reported. */
DbWatch *dbwatch_start(const Stores *stores, Err *err) WARN_UNUSED;
/* Stops and joins the thread, then frees. NULL is a no-op. */
void dbwatch_stop(DbWatch *w);

/* The last check of the home database as a new JSON object (the caller owns
 * it): see the ClusterDatabase schema in openapi.yaml. Thread-safe. */
json_t *dbwatch_json(DbWatch *w);

/* True if commits are stuck waiting for a synchronous standby in any
 * database; writes a sentence saying so (and which database) into why.
 * Thread-safe; false for NULL. */
bool dbwatch_stalled(DbWatch *w, char *why, size_t whylen);

#endif
