/* journal: the event log and the work tables in PostgreSQL. All SQL that
 * reads or writes workd_events, workd_open, workd_done and workd_leader lives
 * here; adding and dropping parts (partitions) lives in retention.c. */
#ifndef WORKD_JOURNAL_H
#define WORKD_JOURNAL_H

/* workd_activity: buckets of this many seconds, kept this long (retention). */
#define ACTIVITY_BUCKET_S 10
#define ACTIVITY_KEEP_S 3600

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "projection.h"
#include "workstate.h"

/* ---- writing (the leader, through the session holding the leader lock) ---- */

/* Prepares the append statements on the leader's session (once per session,
 * before the first append). */
int journal_prepare(PGconn *c, Err *err) WARN_UNUSED;

/* The last event of the append sent before, while its outcome is unknown. */
typedef struct AppendAfter {
    int64_t seq;
    int part;
} AppendAfter;

/* Appends events (seq and term already set, in order) into part `part` and
 * writes the work rows they fold into (projection.h) in one statement, which
 * is one transaction, with a NOTIFY on channel workd_events carrying the last
 * seq: open rows are inserted or updated in workd_open; work that finished
 * (completed, cancelled) leaves it for a workd_done row in the same part;
 * the inbox entries (n) the commit took into the log are deleted with it.
 *
 * Sent in pipeline mode without waiting (events non-empty; the rows and
 * events may be freed once this returns): journal_append_recv reads the
 * outcomes in the order the appends were sent, each after its own commit.
 * Until the pipeline is ended (journal_pipeline_end, once every outcome is
 * read) the session runs nothing else. An append sent while another is out
 * names that one's last event in *after: it writes nothing unless that event
 * is in the log, since a pipeline goes on with the statements after a failed
 * one, and this one was decided from the state that one left.
 * Fencing: nothing is written unless this session holds the leader lock;
 * either way journal_append_recv says "fenced" (409). */
int journal_append_send(PGconn *c, int part, const EventList *events, ProjRow *const *rows,
                        size_t nrows, const int64_t *inbox, size_t n_inbox,
                        const AppendAfter *after, Err *err) WARN_UNUSED;
/* The outcome of the oldest append out, of n_events events (blocks until it
 * has come; at once when PQisBusy says it has). An append the database
 * refused for what it holds (db_refused: it would fail again) has err->type
 * "database-refused". */
int journal_append_recv(PGconn *c, size_t n_events, Err *err) WARN_UNUSED;
/* Leaves pipeline mode (every outcome read), so that other statements run. */
int journal_pipeline_end(PGconn *c, Err *err) WARN_UNUSED;

/* ---- the inbox: work submitted in SQL (workd.submit, migration 0005) ---- */
/* One submission waiting in workd_inbox; 0 in timeout_ms / max_attempts:
 * the server's default. Strings and payload are owned. */
typedef struct InboxItem {
    int64_t n; /* its place in the inbox */
    char *id, *queue;
    int priority;
    json_t *payload; /* NULL: the database holds one jansson cannot read (a number of
                        2^63 or more written before schema 12 refused it, or a
                        nesting deeper than jansson reads, before schema 16): why */
    char why[160];
    int64_t run_at, timeout_ms;
    int max_attempts;
    char *traceparent, *tracestate; /* as given to workd.submit, not checked yet; NULL: none */
} InboxItem;
/* The oldest entries, at most limit (caller frees *out and its strings). */
int journal_inbox_read(PGconn *c, int limit, InboxItem **out, size_t *n, Err *err) WARN_UNUSED;
/* Publishes the leader's budgets for workd.submit (workd_budgets): a
 * payload's bytes as JSON text, and a body's nesting. */
int journal_publish_budgets(PGconn *c, int64_t payload_bytes, int json_depth, Err *err) WARN_UNUSED;
/* Deletes entries taken into the log without an event of their own (an id
 * that exists already); the append deletes the others with their events.
 * Fenced like the append. */
int journal_inbox_forget(PGconn *c, const int64_t *inbox, size_t n, Err *err) WARN_UNUSED;

/* ---- recovery ---- */

/* Rebuilds the open work into ws from workd_open, and the queues' limits from
 * workd_queues (as of now), and reads the last event's seq, term and part.
 * Cost depends on the open work only. */
int journal_recover(PGconn *c, WorkState *ws, int64_t now, int64_t *last_seq, int64_t *last_term,
                    int *last_part, Err *err) WARN_UNUSED;

/* The parts (workd_parts), oldest first. */
#define PARTS_MAX 256
typedef struct Part {
    int part;
    int64_t starts_at, ends_at; /* ms (part 0, made by the upgrade: from the epoch) */
    int64_t first_at;           /* ms of its first event; 0: nothing written into it yet */
} Part;
typedef struct PartList {
    Part items[PARTS_MAX];
    size_t n;
} PartList;
int journal_parts(PGconn *c, PartList *out, Err *err) WARN_UNUSED;

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
/* Dead work of a queue and key (NULL: any), oldest first, at most limit. */
int journal_dead_matching(PGconn *c, const char *queue, const char *key, int limit, KnownSet *out,
                          Err *err) WARN_UNUSED;

/* The work row as the API shows it (a new reference), or NULL with err 404.
 * Finished work is found while its part is kept (the retention window). */
json_t *journal_work_get(PGconn *c, const char *id, int64_t now, Err *err) WARN_UNUSED;

/* Schedules as workd_schedules holds them, with their next fire times after
 * now and their last run: {"schedules": [...]} when name is NULL, else the one
 * named (404 if none). */
json_t *journal_schedules(PGconn *c, const char *name, int64_t now, Err *err) WARN_UNUSED;

/* A batch: when it opened and finished, its callback, and its work counted by
 * status (a new reference; 404 if none). */
json_t *journal_batch_get(PGconn *c, const char *id, int64_t now, Err *err) WARN_UNUSED;

/* The history of one work item, a page at a time: {"id", "events": [at most
 * limit events with seq > after], "next_after": the `after` of the next page,
 * or null after the last}; 404 if the work has no event (after == 0). */
json_t *journal_work_events(PGconn *c, const char *id, int64_t after, int limit,
                            Err *err) WARN_UNUSED;

/* Events after seq that finish work (completed, dead, cancelled) and, with
 * progress, progress events, of work_id only if not NULL, oldest first, at
 * most limit and about max_bytes of event data (at least one event, so a
 * large result still gets through), as SSE-ready objects {seq, id, queue,
 * status, ...}, appended to out (a JSON array). Sets *at_end when no such
 * event is left after the ones appended (as of the read). Returns the number
 * appended, or -1. */
int journal_finished_after(PGconn *c, int64_t after, int limit, int64_t max_bytes, bool progress,
                           const char *work_id, json_t *out, bool *at_end, Err *err) WARN_UNUSED;

/* ---- webhook subscriptions (workd_subscriptions, migration 0013) ---- */
/* Every subscription as its events left it: [{name, url, secret, queues
 * (array or null), kinds (array), paused, paused_reason, cursor}] (a new
 * reference), or NULL with err. */
json_t *journal_subscriptions(PGconn *c, Err *err) WARN_UNUSED;

/* Work newest first, filtered by status (NULL: any; "scheduled" and "pending"
 * are told apart by run_at) and queue (NULL: any), before accepted seq
 * `before` (0: from the newest), at most limit: {"items": [...], "next_before": N|null}. */
json_t *journal_work_list(PGconn *c, const char *status, const char *queue, int64_t before,
                          int limit, Err *err) WARN_UNUSED;

/* Open work by queue from the projection: {queue: {pending, scheduled, running,
 * oldest_pending_at, oldest_pending_age_s}} (a new reference). Cost follows the
 * open work. */
json_t *journal_open_counts(PGconn *c, Err *err) WARN_UNUSED;
/* The dashboard's chart: per queue and bucket of ACTIVITY_BUCKET_S seconds,
 * the last `buckets` buckets up to the database's now, from workd_activity
 * (kept by the leader's append): {"bucket_seconds", "start" (the first
 * bucket's time), "buckets", "queues": {queue: {"accepted": [n...],
 * "completed", "failed", "dead", "cancelled"}}}, oldest first. New reference,
 * NULL on error. */
json_t *journal_activity(PGconn *c, int buckets, Err *err) WARN_UNUSED;
/* The backlog of each key of a queue (all queues when queue is NULL), bounded:
 * the `top` keys with the most ready work, the rest added up as "other":
 * {queue: {"keys": [{"key": k|null, "pending", "scheduled", "running"}...],
 * "other": {"keys": n, "pending", "scheduled", "running"}}}. One pass over
 * the open work (workd_open). New reference, NULL on error. */
json_t *journal_key_backlog(PGconn *c, const char *queue, int top, Err *err) WARN_UNUSED;

/* Every queue's flow control as operators set it: {queue: {paused,
 * max_running, rate}} (a new reference; queues never set are absent). */
json_t *journal_queue_limits(PGconn *c, Err *err) WARN_UNUSED;

/* The highest seq in the table (0 if empty). */
int journal_last_seq(PGconn *c, int64_t *seq, Err *err) WARN_UNUSED;

/* The current leader: term and URL (url_out gets "" and term 0 if none yet). */
int journal_leader(PGconn *c, int64_t *term, char *url_out, size_t url_len, Err *err) WARN_UNUSED;

/* Counts of finished work by queue and status within the retention window
 * (dead work: all of it) (a new reference: {"queue": {"completed": n, "dead":
 * n, "cancelled": n}}). */
json_t *journal_finished_counts(PGconn *c, Err *err) WARN_UNUSED;

#endif
