/* view: the store's read face. What any node reads of the log and the work
 * tables to answer the API: a work item, its history, lists, counts, batches,
 * schedules, subscriptions, the results after a seq. A read of one shard's
 * log takes a session of that shard's database; a read of the API takes the
 * cluster's databases (ViewDbs) and asks each what it keeps. Nothing here
 * writes. The front-end reads through this header only, never through
 * journal.h (the leader's writer). */
#ifndef WORKD_STORE_VIEW_H
#define WORKD_STORE_VIEW_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "cursor.h"
#include "err.h"
#include "event.h"
#include "stores.h"

/* ---- the cluster's databases ----
 * How a read reaches the databases of a cluster (stores.h: each shard's rows
 * are in one of them; db 0 is home). session(d, db) is database db's
 * session, valid until the read returns, or NULL when it cannot be reached:
 * a read that needs it fails with 503 database-unavailable. A read by id
 * asks each database until one has it (an id is in one at most); a list or
 * a count asks each for what it keeps and merges. With one database every
 * read is the single query it has always been. */
typedef struct ViewDbs ViewDbs;
struct ViewDbs {
    const Stores *stores; /* st->shards set (stores_prepare) */
    PGconn *(*session)(ViewDbs *d, int db);
};

/* Database db's session, or NULL with err 503 (naming a shard it keeps). */
PGconn *view_db(ViewDbs *d, int db, Err *err) WARN_UNUSED;
/* The session of the database that keeps shard's rows, or NULL with err 503. */
PGconn *view_shard_db(ViewDbs *d, int shard, Err *err) WARN_UNUSED;

/* workd_activity: buckets of this many seconds, kept this long (retention). */
#define ACTIVITY_BUCKET_S 10
#define ACTIVITY_KEEP_S 3600

/* A time not set (null in the API), where times are ms since the epoch. */
#define VIEW_NO_TIME INT64_MIN

/* ---- work ---- */
/* The last progress an attempt reported (a progress event's data). */
typedef struct WorkProgress {
    int64_t seq, at;
    int attempt;
    bool has_fraction;
    double fraction;
    char *message; /* NULL: none */
} WorkProgress;

/* One work item, open or kept. Owns every string, list and JSON value
 * (view_work_free); payload and result are the client's and the worker's
 * JSON, opaque. */
typedef struct WorkView {
    char *id, *queue, *status; /* "scheduled": pending with run_at after now */
    char *key, *batch;         /* NULL: none */
    int priority, attempts, max_attempts;
    int64_t timeout_ms;
    json_t *payload;
    json_t *result;                                                /* JSON null unless completed */
    int64_t run_at, created_at, started_at, finished_at, deadline; /* or VIEW_NO_TIME */
    char *worker_id, *last_error;                                  /* NULL: none */
    int64_t updated_seq; /* the last event that changed it (a seq of its shard's log) */
    int shard;           /* whose log holds its events */
    char **after;        /* its parents (strv, never NULL) */
    bool run_anyway;
    char *traceparent, *tracestate; /* the producer's trace context; NULL: none */
    bool has_progress;
    WorkProgress progress;
    char **children; /* work that names it in after (strv, never NULL), at most 1000 */
} WorkView;

/* The work item (view_work_free), or NULL with err 404 (or 503: not in any
 * database that could be asked, and one could not). Finished work is found
 * while its part is kept (the retention window). */
WorkView *view_work_get(ViewDbs *d, const char *id, int64_t now, Err *err) WARN_UNUSED;
void view_work_free(WorkView *w);

/* One event of a work item's history, as the log holds it. */
typedef struct WorkEvent {
    int64_t seq, term, at;
    char *type;
    int version;
    json_t *data; /* the event's data as stored */
} WorkEvent;

/* A page of one work item's history. */
typedef struct WorkEvents {
    char *id;
    WorkEvent *items;
    size_t len;
    int64_t next_after; /* the `after` of the next page; 0 after the last */
} WorkEvents;

/* The history of one work item, a page at a time: at most limit events with
 * seq > after (view_work_events_free); 404 if the work has no event (after
 * == 0). */
WorkEvents *view_work_events(ViewDbs *d, const char *id, int64_t after, int limit,
                             Err *err) WARN_UNUSED;
void view_work_events_free(WorkEvents *e);

/* One line of the work list. */
typedef struct WorkSummary {
    char *id, *queue, *status;
    int priority, attempts, max_attempts;
    int64_t created_at, finished_at; /* or VIEW_NO_TIME */
    char *worker_id, *last_error;    /* NULL: none */
} WorkSummary;

typedef struct WorkList {
    WorkSummary *items;
    size_t len;
    bool more;          /* the page is full: next_before pages on */
    Cursor next_before; /* the `before` of the next page */
} WorkList;

/* Work newest first, filtered by status (NULL: any; "scheduled" and "pending"
 * are told apart by run_at) and queue (NULL: any), at most limit
 * (view_work_list_free). `before` holds an accepted seq per shard (0: from
 * that shard's newest): each shard's work accepted before it, newest accepted
 * first, merged newest created first (one query per shard). */
WorkList *view_work_list(ViewDbs *d, const char *status, const char *queue, const Cursor *before,
                         int limit, Err *err) WARN_UNUSED;
void view_work_list_free(WorkList *l);

/* ---- schedules and batches ---- */
/* A schedule as workd_schedules holds it. Owns everything (in a
 * ScheduleList: view_schedules_free). */
typedef struct ScheduleView {
    char *name;
    ScheduleSpec *spec; /* NULL when the stored definition no longer decodes: */
    json_t *stored;     /* ...then the definition as stored, */
    char *error;        /* ...and why it does not fire */
    int64_t last_tick;  /* ms */
    char *last_work;    /* the work of its last run; NULL: none yet */
    int64_t last_fired_at;
    char *last_status; /* that work's status; NULL: no longer kept */
    int64_t updated_at;
} ScheduleView;
typedef struct ScheduleList {
    ScheduleView *items; /* by name */
    size_t len;
} ScheduleList;

/* Every schedule when name is NULL (each database's, by name), else the one
 * named (404 if none). */
ScheduleList *view_schedules(ViewDbs *d, const char *name, Err *err) WARN_UNUSED;
void view_schedules_free(ScheduleList *l);

/* A batch: when it opened and finished, its callback, its work by status. */
typedef struct BatchView {
    char *id;
    int64_t opened_at, finished_at; /* finished_at: VIEW_NO_TIME while open */
    json_t *callback;               /* the callback's template as stored; NULL: none */
    char *callback_id;              /* NULL: none */
    int64_t waiting, pending, scheduled, running, completed, dead, cancelled, total;
} BatchView;

/* The batch (view_batch_free), or NULL with err (404 if none); now tells
 * scheduled from pending work. */
BatchView *view_batch_get(ViewDbs *d, const char *id, int64_t now, Err *err) WARN_UNUSED;
void view_batch_free(BatchView *b);

/* ---- the results stream ---- */
/* One published event (event_is_published) as /results and webhooks send it,
 * typed for filtering, with its frame built once:
 * "event: <status>\ndata: <json>\n\n" (a stream puts its own "id:" line
 * before it: hub.h), the JSON (data_off, data_len) being the object a client
 * reads ({seq, id, queue, status, at, ...}). Owns its strings
 * (view_result_clear); whoever keeps them may take them and leave NULL
 * behind. */
typedef struct ResultEvent {
    int shard; /* whose log holds it: view_finished_after sets it, view_result_of leaves 0 */
    int64_t seq;
    int64_t at;     /* ms since the epoch */
    EventType type; /* EV_COMPLETED, EV_DEAD, EV_CANCELLED, EV_PROGRESS or EV_BATCH */
    char *work_id;  /* a batch's end: the batch's id */
    char *queue;    /* "" when none (a batch) */
    char *frame;
    size_t frame_len;
    size_t data_off, data_len; /* the JSON object inside frame */
} ResultEvent;

typedef struct ResultList {
    ResultEvent *items;
    size_t len, cap;
} ResultList;

/* e as a ResultEvent (e must be published); e is only read. */
void view_result_of(const Event *e, ResultEvent *out);
void view_result_clear(ResultEvent *r);
/* Frees every event and the array; the list is empty and reusable after. */
void view_results_clear(ResultList *l);
/* A new zeroed slot at the end of l (valid until the next push). */
ResultEvent *view_results_push(ResultList *l);

/* Events of shard `shard` after seq that finish work (completed, dead,
 * cancelled) and, with progress, progress events, oldest first, each with
 * its shard; of work_id only if not NULL (then of its own shard, whatever
 * shard says: after is a seq of that one), at most limit and about
 * max_bytes of event data (at least one event, so a large result still gets
 * through), appended to out. Sets *at_end when no
 * such event is left after the ones appended (as of the read). Returns the
 * number appended, or -1. */
int view_finished_after(PGconn *c, int shard, int64_t after, int limit, int64_t max_bytes,
                        bool progress, const char *work_id, ResultList *out, bool *at_end,
                        Err *err) WARN_UNUSED;

/* ---- webhook subscriptions (workd_subscriptions, migration 0013) ---- */
typedef struct SubscriptionList {
    Subscription *items; /* by name */
    size_t len;
} SubscriptionList;

/* Every subscription, secret and cursor included (Subscription: event.h; a
 * cursor of the cluster's shards), or NULL with err. Free with
 * view_subscriptions_free. */
SubscriptionList *view_subscriptions(PGconn *c, int shards, Err *err) WARN_UNUSED;
void view_subscriptions_free(SubscriptionList *l);

/* ---- queues ----
 * Each list is one entry per queue, sorted by name (strcmp), so that a reader
 * merges them in one pass; each has its *_free, which takes NULL. */
typedef struct OpenCount {
    char *queue;
    int64_t waiting, pending, scheduled, running;
    int64_t oldest_pending_at;   /* the oldest ready work's time; VIEW_NO_TIME: none */
    double oldest_pending_age_s; /* 0 when none */
} OpenCount;
typedef struct OpenCounts {
    OpenCount *items;
    size_t len;
} OpenCounts;

/* Open work by queue from the projection, every database's added up. Cost
 * follows the open work. */
OpenCounts *view_open_counts(ViewDbs *d, Err *err) WARN_UNUSED;
void view_open_counts_free(OpenCounts *o);

typedef struct FinishedCount {
    char *queue;
    int64_t completed, dead, cancelled;
} FinishedCount;
typedef struct FinishedCounts {
    FinishedCount *items;
    size_t len;
} FinishedCounts;

/* Counts of finished work by queue and status within the retention window
 * (dead work: all of it). */
FinishedCounts *view_finished_counts(ViewDbs *d, Err *err) WARN_UNUSED;
FinishedCounts *view_finished_counts_copy(const FinishedCounts *f);
void view_finished_counts_free(FinishedCounts *f);

typedef struct QueueLimitsRow {
    char *queue;
    QueueLimits limits; /* owns its weights */
} QueueLimitsRow;
typedef struct QueueLimitsList {
    QueueLimitsRow *items;
    size_t len;
} QueueLimitsList;

/* Every queue's flow control as operators set it (queues never set are
 * absent). */
QueueLimitsList *view_queue_limits(ViewDbs *d, Err *err) WARN_UNUSED;
void view_queue_limits_free(QueueLimitsList *l);

typedef struct KeyCount {
    char *key; /* NULL: work without a key */
    int64_t pending, scheduled, running;
} KeyCount;
/* One queue's backlog per key: its top keys, the rest added up. */
typedef struct KeyBacklog {
    char *queue;
    KeyCount *keys; /* most ready work first */
    size_t n_keys;
    int64_t other_keys; /* how many keys other holds (its key is NULL) */
    KeyCount other;
} KeyBacklog;
typedef struct KeyBacklogs {
    KeyBacklog *items;
    size_t len;
} KeyBacklogs;

/* The backlog of each key of a queue (all queues when queue is NULL), bounded:
 * the `top` keys with the most ready work, the rest added up as other. One
 * pass over the open work (workd_open) of the queue's shard's database, or
 * of each database for every queue. */
KeyBacklogs *view_key_backlog(ViewDbs *d, const char *queue, int top, Err *err) WARN_UNUSED;
void view_key_backlog_free(KeyBacklogs *k);

/* ---- the dashboard's chart ---- */
enum { ACTIVITY_KINDS = 5 }; /* accepted, completed, failed, dead, cancelled */
extern const char *const activity_kinds[ACTIVITY_KINDS];

typedef struct ActivityQueue {
    char *queue;
    int64_t *count[ACTIVITY_KINDS]; /* by activity_kinds, each Activity.buckets long */
} ActivityQueue;
typedef struct Activity {
    int64_t start; /* the first bucket's time, seconds since the epoch */
    int buckets;   /* of ACTIVITY_BUCKET_S seconds, oldest first */
    ActivityQueue *queues;
    size_t len;
} Activity;

/* Per queue and bucket of ACTIVITY_BUCKET_S seconds, the last `buckets`
 * buckets up to the database's now, from workd_activity (kept by the
 * leader's append); queues in the order they first had activity. */
Activity *view_activity(ViewDbs *d, int buckets, Err *err) WARN_UNUSED;
void view_activity_free(Activity *a);

/* ---- the log ---- */
/* Reads the payload of a NOTIFY on workd_events or workd_leader: "<n>" for
 * shard 0, "<shard>:<n>" for another (journal_notify_payload writes them);
 * false when it is not one of a shard below shards. */
bool view_notify_parse(const char *text, int shards, int *shard, int64_t *n);

/* The shard whose log holds work `id` (open, or finished and kept); -1:
 * none does (503 when a database that could not be asked might). */
int view_work_shard(ViewDbs *d, const char *id, int *shard, Err *err) WARN_UNUSED;
/* view_work_shard for n ids at once: shards[i] is ids[i]'s. When a database
 * that could not be asked might hold some, those are SHARD_UNREACHABLE, the
 * others found, and it returns -2 (err says which database). */
#define SHARD_UNREACHABLE (-2)
int view_work_shards(ViewDbs *d, char *const *ids, size_t n, int *shards, Err *err) WARN_UNUSED;
/* The shard schedule `name` belongs to; -1: no such schedule. */
int view_schedule_shard(ViewDbs *d, const char *name, int *shard, Err *err) WARN_UNUSED;
/* The highest seq in a shard's log (0 if empty). */
int view_last_seq(PGconn *c, int shard, int64_t *seq, Err *err) WARN_UNUSED;

/* A shard's current leader: term and URL (url_out gets "" and term 0 if none
 * yet). */
int view_leader(PGconn *c, int shard, int64_t *term, char *url_out, size_t url_len,
                Err *err) WARN_UNUSED;

#endif
