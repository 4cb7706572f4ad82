/* event: the facts the WorkManager records, and their JSON encoding in the
 * event table. Encodings only ever grow compatibly: a field is added with a
 * default, never renamed or removed, so any later server replays any older log. */
#ifndef WORKD_EVENT_H
#define WORKD_EVENT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define EVENT_VERSION 1

typedef enum {
    EV_TERM = 1,  /* a manager won the election: term, leader URL */
    EV_ACCEPTED,  /* work accepted: queue, priority, payload, run_at, timeout, max attempts */
    EV_STARTED,   /* an attempt was handed to a worker: attempt, worker, deadline */
    EV_COMPLETED, /* the current attempt succeeded: result */
    EV_FAILED,    /* the current attempt failed: error, retry_at (0: no retry) */
    EV_TIMED_OUT, /* the current attempt's deadline passed: retry_at (0: no retry) */
    EV_DEAD,      /* no attempt left (or retry refused): final error */
    EV_CANCELLED, /* cancelled before it started */
    EV_RETRIED,   /* dead work reopened by an operator: everything to rebuild it, one
                     more attempt (max_attempts) */
} EventType;

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

/* ---- encoding ---- */
/* The "data" column of e (a new reference). */
json_t *event_data_encode(const Event *e);
/* Fills *out from a row of the event table; data is borrowed. Unknown fields are
 * ignored; a missing required field is an error. */
int event_decode(int64_t seq, int64_t term, int64_t at, const char *type, int version,
                 const char *work_id, json_t *data, Event *out, Err *err) WARN_UNUSED;

/* A finished work's event as /results publishes it: {seq, id, queue, status,
 * at, result and attempt | error and attempts} (a new reference). e->queue must
 * be set (final events do not carry it in the table; callers fill it in). */
json_t *event_result_json(const Event *e);

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
