/* journal: the event table and its projection in PostgreSQL. All SQL that
 * touches workd_events, workd_work and workd_leader lives here. */
#ifndef WORKD_JOURNAL_H
#define WORKD_JOURNAL_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "projection.h"
#include "workstate.h"

/* ---- writing (the leader, through the session holding the leader lock) ---- */

/* Prepares the append statement on the leader's session (once per session,
 * before the first journal_append). */
int journal_prepare(PGconn *c, Err *err) WARN_UNUSED;

/* Appends events (seq and term already set, in order) and writes the
 * projection rows they fold into (projection.h) in one statement, which is one
 * transaction, with a NOTIFY on channel workd_events carrying the last seq.
 * Fencing: nothing is written unless this session holds the leader lock, and
 * then err is "fenced" (409). */
int journal_append(PGconn *c, const EventList *events, ProjRow *const *rows, size_t nrows,
                   Err *err) WARN_UNUSED;

/* ---- recovery ---- */

/* Rebuilds the open work into ws from the projection and reads the last seq and
 * term. Cost depends on the open work only. */
int journal_recover(PGconn *c, WorkState *ws, int64_t *last_seq, int64_t *last_term,
                    Err *err) WARN_UNUSED;

/* ---- reading (any node) ---- */

/* What the database holds about these ids (finished or not). Returns an array
 * of n_out KnownWork whose strings point into *res (keep res until done; then
 * journal_known_free). */
typedef struct KnownSet {
    PGresult *res;
    KnownWork *items;
    size_t n;
} KnownSet;
int journal_known(PGconn *c, char *const *ids, size_t n, KnownSet *out, Err *err) WARN_UNUSED;
void journal_known_free(KnownSet *k);

/* The work row as the API shows it (a new reference), or NULL with err 404. */
json_t *journal_work_get(PGconn *c, const char *id, int64_t now, Err *err);

/* The history of one work item: {"events": [...]}; 404 if unknown. */
json_t *journal_work_events(PGconn *c, const char *id, Err *err);

/* Events after seq that finish work (completed, dead, cancelled), oldest first,
 * at most limit, as SSE-ready objects {seq, id, queue, status, ...}, appended to
 * out (a JSON array). Returns the number appended, or -1. */
int journal_finished_after(PGconn *c, int64_t after, int limit, json_t *out, Err *err);

/* Work newest first, filtered by status (NULL: any; "scheduled" and "pending"
 * are told apart by run_at) and queue (NULL: any), before accepted seq
 * `before` (0: from the newest), at most limit: {"items": [...], "next_before": N|null}. */
json_t *journal_work_list(PGconn *c, const char *status, const char *queue, int64_t before,
                          int limit, Err *err);

/* Open work by queue from the projection: {queue: {pending, scheduled, running,
 * oldest_pending_at, oldest_pending_age_s}} (a new reference). Cost follows the
 * open work. */
json_t *journal_open_counts(PGconn *c, Err *err);

/* The highest seq in the table (0 if empty). */
int journal_last_seq(PGconn *c, int64_t *seq, Err *err) WARN_UNUSED;

/* The current leader: term and URL (url_out gets "" and term 0 if none yet). */
int journal_leader(PGconn *c, int64_t *term, char *url_out, size_t url_len, Err *err) WARN_UNUSED;

/* Counts of finished work by queue and status from the projection (a new
 * reference: {"queue": {"completed": n, "dead": n, "cancelled": n}}). */
json_t *journal_finished_counts(PGconn *c, Err *err);

#endif
