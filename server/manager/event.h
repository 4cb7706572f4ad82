/* event: the facts the WorkManager records, and their JSON encoding in the
 * event table. Encodings only ever grow compatibly: a field is added with a
 * default, never renamed or removed, so any later server replays any older log. */
#ifndef WORKD_EVENT_H
#define WORKD_EVENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

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
    EV_PROGRESS,     /* the running attempt's worker sent progress: detail {fraction, message,
                        output} (published on /results, changes no state) */
    EV_SUBSCRIPTION, /* an operator set, paused or deleted a webhook subscription: all of it
                        in detail (webhooks.h); no work id */
    EV_SUB_CURSOR,   /* a subscription's deliveries reached detail.cursor; no work id */
} EventType;
#define EV_LAST EV_SUB_CURSOR

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
    char *error; /* also EV_DEAD */
    int64_t retry_at;
    /* EV_TERM */
    int64_t new_term;
    char *leader_url;
    /* EV_QUEUE_SET (and queue) */
    QueueLimits limits;
    /* EV_PROGRESS (and attempt, queue), EV_SUBSCRIPTION, EV_SUB_CURSOR: a JSON object */
    json_t *detail;
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
int event_is_final(EventType t);
/* True for the events /results can publish: the final ones and progress. */
int event_is_published(EventType t);

/* ---- encoding ---- */
/* The "data" column of e (a new reference). */
json_t *event_data_encode(const Event *e);
/* Fills *out from a row of the event table; data is borrowed. Unknown fields are
 * ignored; a missing required field is an error. */
int event_decode(int64_t seq, int64_t term, int64_t at, const char *type, int version,
                 const char *work_id, json_t *data, Event *out, Err *err) WARN_UNUSED;

/* A finished work's event as /results publishes it: {seq, id, queue, status,
 * at, result and attempt | error and attempts}, or a progress event's {seq,
 * id, queue, status: "progress", at, attempt, fraction, message[, output]}
 * (a new reference). e->queue must
 * be set (final events do not carry it in the table; callers fill it in). */
json_t *event_result_json(const Event *e);

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
