/* event: the facts the WorkManager records, and their JSON encoding in the
 * event table. Encodings only ever grow compatibly: a field is added with a
 * default, never renamed or removed, so any later server replays any older log. */
#ifndef WORKD_EVENT_H
#define WORKD_EVENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cron.h"
#include "cursor.h"
#include "err.h"
#include "tz.h"

#define EVENT_VERSION 1

typedef enum {
    EV_TERM = 1,     /* a manager won the election: term, leader URL */
    EV_ACCEPTED,     /* work accepted: queue, priority, payload, run_at, timeout, max attempts */
    EV_STARTED,      /* an attempt was handed to a worker: attempt, worker, deadline */
    EV_COMPLETED,    /* the current attempt succeeded: result */
    EV_FAILED,       /* the current attempt failed: error, retry_at (0: no retry) */
    EV_TIMED_OUT,    /* the current attempt's deadline passed: retry_at (0: no retry) */
    EV_DEAD,         /* no attempt left (or retry refused): final error */
    EV_CANCELLED,    /* cancelled before it started */
    EV_RETRIED,      /* dead work reopened by an operator: everything to rebuild it, one
                        more attempt (max_attempts) */
    EV_QUEUE_SET,    /* an operator set a queue's flow control: all of it (QueueLimits) */
    EV_PROGRESS,     /* the running attempt's worker sent progress: fraction, message, output
                        (published on /results, changes no state) */
    EV_SUBSCRIPTION, /* an operator set or deleted a webhook subscription, or workd paused it:
                        all of it (sub); no work id */
    EV_SUB_CURSOR,   /* a subscription's deliveries reached sub->cursor; no work id */
    EV_RELEASED,     /* waiting work whose parents have all finished became pending */
    EV_SCHEDULE_SET, /* an operator created or changed a schedule: all of it */
    EV_SCHEDULE_DELETED, /* an operator deleted a schedule */
    EV_TICK,             /* a schedule's tick: the work it submitted, or why none */
    EV_BATCH_OPENED,     /* a batch was opened: its callback */
    EV_BATCH,            /* every work item of a batch finished: counts (published) */
} EventType;
#define EV_LAST EV_BATCH

/* A key's weight in its queue's turns: a key of weight w is handed w jobs in a
 * row before the next key's turn (a key without one has weight 1). */
typedef struct KeyWeight {
    char *key;
    int weight; /* 1..QL_MAX_WEIGHT */
} KeyWeight;
#define QL_MAX_WEIGHTS 100 /* weighted keys per queue at most (a queue_set event's size) */
#define QL_MAX_WEIGHT 1000

/* A queue's flow control, as operators set it (queue_set events). Kept across
 * failovers: a new leader reads it back (workd_queues). The weights are owned
 * by whoever owns the QueueLimits (an Event, a MgrCmd, the WorkState), freed
 * by queue_limits_clear, deep-copied by queue_limits_copy; a plain struct copy
 * borrows them. */
typedef struct QueueLimits {
    bool paused;             /* hands out no work; submissions are still accepted */
    int max_running;         /* attempts of the queue running at once; 0: no limit */
    int max_running_per_key; /* attempts of one key of the queue at once; 0: no limit */
    int rate_limit;          /* starts per rate_period_ms; 0: no limit */
    int64_t rate_period_ms;  /* with rate_limit */
    KeyWeight *weights;      /* sorted by key, distinct keys; NULL when n_weights is 0 */
    size_t n_weights;        /* at most QL_MAX_WEIGHTS */
} QueueLimits;
/* Parts of a QueueLimits that a change sets (the rest is kept). */
enum { QL_PAUSED = 1, QL_MAX_RUNNING = 2, QL_RATE = 4, QL_MAX_PER_KEY = 8, QL_WEIGHTS = 16 };

/* What a schedule submits at each tick, or a batch when it finishes (owned
 * strings and payload). */
typedef struct WorkTemplate {
    char *queue;
    char *key; /* NULL: none */
    int priority;
    json_t *payload;
    int64_t timeout_ms;
    int max_attempts;
} WorkTemplate;

/* What to do with ticks missed while no leader ran (more than a grace late). */
typedef enum { CATCHUP_NONE, CATCHUP_LAST, CATCHUP_ALL } CatchUp;

/* A schedule as an operator defines it. cron and zone are resolved from the
 * text by whoever builds the spec (the parser, event_decode), so that deciding
 * and applying need no I/O: zone is borrowed from tz_get's cache. */
typedef struct ScheduleSpec {
    char *cron_text;
    char *tz; /* IANA name */
    CronExpr cron;
    const TzZone *zone;
    WorkTemplate work;
    bool skip_overlap; /* a tick is skipped while the previous tick's work is open */
    CatchUp catch_up;
    int catch_up_max; /* CATCHUP_ALL: at most this many missed ticks run */
    bool paused;
} ScheduleSpec;

/* A webhook subscription (webhooks.h), as an operator set it and its events
 * left it. Strings and lists are owned by whoever owns the Subscription (an
 * Event, a MgrCmd, the WorkState), freed by subscription_clear and
 * deep-copied by subscription_copy. */
typedef struct Subscription {
    char *name, *url;
    /* whsec_<base64>, the deliveries' signing key. NULL: not known. The log
     * keeps none (migration 0016 strips it from the row and keeps it in
     * workd_subscriptions only), so an event read back from the log has none
     * and a replay of the log cannot restore it. */
    char *secret;
    char **queues; /* strv; NULL: every queue */
    char **kinds;  /* strv of completed, dead, cancelled; never NULL but in a deletion */
    bool paused;
    char *paused_reason; /* why workd paused it; NULL: an operator's pause, or running */
    Cursor cursor;       /* every event of each shard up to its seq was delivered or skipped */
} Subscription;

/* One event. Strings and JSON values are owned by the event (event_clear frees
 * them). Times are milliseconds since the epoch; 0 means "none". Fields not
 * used by the type are zero. */
typedef struct Event {
    int64_t seq, term, at;
    EventType type;
    int version;
    char *work_id; /* NULL for EV_TERM */
    /* EV_ACCEPTED */
    char *queue;
    char *key; /* fair-share key (a tenant, a customer); NULL: none */
    int priority;
    json_t *payload;
    int64_t run_at;
    int64_t timeout_ms;
    int max_attempts;
    /* EV_STARTED, EV_COMPLETED, EV_FAILED, EV_TIMED_OUT */
    int attempt;
    char *worker_id;
    int64_t deadline;
    json_t *result;
    char *error; /* EV_FAILED, EV_TIMED_OUT, EV_DEAD, EV_RETRIED: what ended the attempt */
    int64_t retry_at;
    char *reason; /* EV_CANCELLED: why, when not an operator (a parent ended); NULL: none */
    /* EV_TERM */
    int64_t new_term;
    char *leader_url;
    /* EV_QUEUE_SET (and queue) */
    QueueLimits limits;
    /* EV_PROGRESS (and attempt, queue): what the attempt says of itself, the
     * latest fraction and message it sent, and the output of this update */
    bool has_fraction; /* false: it has sent none (null) */
    double fraction;   /* 0..1 */
    char *message;     /* NULL: none (null) */
    char *output;      /* NULL: none (absent) */
    /* EV_SUBSCRIPTION: all of the subscription (its cursor only with
     * sub_reset), or only its name with sub_deleted; EV_SUB_CURSOR: its name
     * and the cursor its deliveries reached. NULL for other kinds. */
    Subscription *sub;
    bool sub_deleted; /* EV_SUBSCRIPTION: it is deleted */
    bool sub_reset;   /* EV_SUBSCRIPTION: deliveries restart after sub->cursor ("after") */
    Cursor sub_start; /* EV_SUBSCRIPTION: every shard's log's end when it was decided: where
                         a new subscription without sub_reset starts */
    /* EV_ACCEPTED: dependencies and batches */
    /* the parents named, a JSON array of ids (NULL: none): one reference,
     * never changed once made, shared by the copies, the log's encoding and
     * the projection (json_incref) instead of copied for each */
    json_t *after;
    bool run_anyway; /* run when a parent ends dead or cancelled (else cancelled with it) */
    bool waiting;    /* a parent was open at acceptance: the work waits */
    char *batch;     /* the batch it belongs to (EV_BATCH*: the batch); NULL: none */
    /* EV_ACCEPTED, EV_RETRIED and the final events: the producer's W3C trace
     * context, kept as trace_keep (trace.h) left it; NULL: none */
    char *traceparent, *tracestate;
    /* schedules (EV_SCHEDULE_SET, EV_SCHEDULE_DELETED, EV_TICK) */
    char *schedule;      /* its name */
    ScheduleSpec *sched; /* EV_SCHEDULE_SET */
    int64_t tick;        /* EV_TICK: the tick; EV_SCHEDULE_SET: ticks after this are due */
    char *tick_work;     /* EV_TICK: the work it submitted (NULL: none, see skipped) */
    char *skipped;       /* EV_TICK: why it submitted nothing (NULL: it did) */
    int missed;          /* EV_TICK: missed ticks skipped with this one */
    /* batches (EV_BATCH_OPENED, EV_BATCH; the batch is in batch) */
    WorkTemplate *callback; /* EV_BATCH_OPENED (NULL: none) */
    int counts[3];          /* EV_BATCH: completed, dead, cancelled */
    char *callback_id;      /* EV_BATCH: the callback's work (NULL: none) */
} Event;

/* A growable array of events (owned). */
typedef struct EventList {
    Event *items;
    size_t len, cap;
} EventList;

/* ---- types ---- */
const char *event_type_name(EventType t);
int event_type_parse(const char *name, EventType *out) WARN_UNUSED;
/* True for the events that finish work (and are published on /results). */
bool event_is_final(EventType t);
/* The events published on /results, to webhooks and the hub, as (type, name)
 * pairs: the one list that C (event_is_published) and the SQL that reads
 * them back (journal.c, SQL_PUBLISHED_TYPES) are made from; test_event checks
 * each name against event_type_name. Progress is published too, but only to
 * a reader that asks for it. */
#define EVENTS_PUBLISHED(X)                                                                        \
    X(EV_COMPLETED, "completed")                                                                   \
    X(EV_DEAD, "dead")                                                                             \
    X(EV_CANCELLED, "cancelled")                                                                   \
    X(EV_BATCH, "batch")
/* The list as SQL: 'completed', 'dead', ... (an IN list, '' closing it). */
#define SQL_PUBLISHED_NAME_(type, name) "'" name "', "
#define SQL_PUBLISHED_TYPES EVENTS_PUBLISHED(SQL_PUBLISHED_NAME_) "''"
/* True for the events published on /results: EVENTS_PUBLISHED and progress. */
bool event_is_published(EventType t);

/* A JSON array's strings as a strv (strv_free; NULL when a is not an
 * array; other elements are skipped). */
char **event_strv(json_t *a);

/* ---- encoding ---- */
/* The "data" column of e (a new reference). */
json_t *event_data_encode(const Event *e);
/* Fills *out from a row of the event table; data is borrowed. Unknown fields are
 * ignored; a missing required field is an error. */
int event_decode(int64_t seq, int64_t term, int64_t at, const char *type, int version,
                 const char *work_id, json_t *data, Event *out, Err *err) WARN_UNUSED;

/* A finished work's event as /results publishes it: {seq, id, queue, status,
 * at, result and attempt | error and attempts, traceparent and tracestate
 * when it has them}, or a progress event's {seq,
 * id, queue, status: "progress", at, attempt, fraction, message[, output]}
 * (a new reference). e->queue must
 * be set (final events do not carry it in the table; callers fill it in). */
json_t *event_result_json(const Event *e);

/* ---- templates and schedules ---- */
/* {queue, key?, priority, payload, timeout_ms, max_attempts} (a new reference). */
json_t *template_json(const WorkTemplate *t);
/* The inverse; queue and payload are required. */
int template_decode(json_t *o, WorkTemplate *t, Err *err) WARN_UNUSED;
void template_copy(WorkTemplate *dst, const WorkTemplate *src);
void template_clear(WorkTemplate *t);
/* A schedule_set event's data without "schedule" and "since" (a new reference). */
json_t *schedspec_json(const ScheduleSpec *s);
/* The inverse: parses the cron text and loads the zone (tz_get). */
int schedspec_decode(json_t *o, ScheduleSpec *s, Err *err) WARN_UNUSED;
ScheduleSpec *schedspec_dup(const ScheduleSpec *s);
void schedspec_free(ScheduleSpec *s);
/* ---- subscriptions ---- */
/* dst (overwritten, not freed first) becomes a deep copy of src. */
void subscription_copy(Subscription *dst, const Subscription *src);
/* Frees s's strings and lists, and zeroes it. */
void subscription_clear(Subscription *s);

/* ---- queue limits ---- */
/* dst (overwritten, not freed first) becomes a deep copy of src. */
void queue_limits_copy(QueueLimits *dst, const QueueLimits *src);
/* Frees the weights and zeroes *l. */
void queue_limits_clear(QueueLimits *l);
/* The weight of key (1 when it has none). */
int queue_limits_weight(const QueueLimits *l, const char *key);
/* Sorts l's weights by key (after filling them in any order). */
void queue_limits_sort(QueueLimits *l);

/* ---- lifetime ---- */
void event_clear(Event *e);
/* Deep copy. */
void event_copy(Event *dst, const Event *src);

void eventlist_init(EventList *l);
/* Appends a zeroed event and returns it for the caller to fill. */
Event *eventlist_push(EventList *l);
void eventlist_clear(EventList *l); /* frees the events, keeps capacity */
void eventlist_free(EventList *l);

#endif
