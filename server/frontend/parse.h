/* parse: validation of untrusted input (request bodies, query parameters,
 * Last-Event-ID) into typed values. Pure functions, no I/O, so they can be
 * unit tested and fuzzed; every refusal is a 400-class Err naming the field. */
#ifndef WORKD_PARSE_H
#define WORKD_PARSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "schedule.h"
#include "workstate.h"

typedef struct ParseLimits {
    size_t max_batch;
    size_t max_depth;
    /* A payload's compact JSON text at most (--max-body), so that any job fits
     * a pull's answer alone; 0: unchecked. */
    int64_t max_payload_bytes;
    int64_t default_timeout_ms;
    int default_max_attempts;
} ParseLimits;

/* Parses a JSON body; refuses invalid JSON, invalid UTF-8 and nesting deeper
 * than max_depth. Returns a new reference or NULL with err (400). */
json_t *parse_json_body(const char *body, size_t len, size_t max_depth, Err *err) WARN_UNUSED;

/* Refuses a field of object o that is not in known (NULL-terminated), naming
 * it and listing the known ones, so that a typo is an error, not a default. */
int parse_check_fields(json_t *o, const char *const *known, const char *where,
                       Err *err) WARN_UNUSED;
/* body's "instance", if any, checked (*out: NULL when absent, else the caller's
 * to free). */
int parse_instance(json_t *body, char **out, Err *err) WARN_UNUSED;

/* POST /work: one object or an array of them. idem_key (Idempotency-Key
 * header, may be NULL) becomes the id of a single item. Items without id get a
 * generated one. On success *items (caller frees with submit_items_free) and
 * *bulk (whether the body was an array). */
int parse_submit(json_t *body, const char *idem_key, int64_t now, const ParseLimits *lim,
                 SubmitItem **items, size_t *n, bool *bulk, Err *err) WARN_UNUSED;
void submit_items_free(SubmitItem *items, size_t n);
/* The normalised form of items (ids filled in), to forward to the leader. */
json_t *submit_items_json(const SubmitItem *items, size_t n, bool bulk);

/* A batch that a submission opens: {"items": [...], "batch": {"id"?,
 * "callback"?}} (id generated when absent; callback is a work item without id,
 * run_at, after or batch). Items join it unless they name another. */
typedef struct SubmitBatch {
    char *id;               /* NULL: the submission opens no batch */
    WorkTemplate *callback; /* NULL: none */
} SubmitBatch;
/* parse_submit, also taking the batch form (batch NULL: refused). The caller
 * frees *batch with submit_batch_clear. */
int parse_submit_batch(json_t *body, const char *idem_key, int64_t now, const ParseLimits *lim,
                       SubmitItem **items, size_t *n, bool *bulk, SubmitBatch *batch,
                       Err *err) WARN_UNUSED;
void submit_batch_clear(SubmitBatch *b);
/* submit_items_json, in the batch form when batch_id is set. */
json_t *submit_json(const SubmitItem *items, size_t n, bool bulk, const char *batch_id,
                    const WorkTemplate *callback);
/* A batch id: a work id of at most 100 characters (its callback is "<id>:callback"). */
bool batch_id_valid(const char *s);

/* PUT /schedules/{name}: {cron, timezone?, work: {queue?, payload, priority?,
 * key?, timeout?, max_attempts?}, overlap?: skip|allow, catch_up?: none|last|
 * all, catch_up_max?, paused?}. The zone is loaded (tz_get) and the cron
 * expression parsed. Returns a new spec (schedspec_free), or NULL with err. */
ScheduleSpec *parse_schedule(json_t *body, const ParseLimits *lim, Err *err) WARN_UNUSED;

/* PUT /workers/{id}: {instance, capacity, queues, running}. */
typedef struct HeartbeatMsg {
    char *instance;
    int capacity;
    char **queues;
    RunningList *running; /* NULL: not said (free with ws_running_free) */
} HeartbeatMsg;
int parse_heartbeat(json_t *body, HeartbeatMsg *out, Err *err) WARN_UNUSED;

/* POST /workers/{id}/pull: {instance, max, wait, queues, reports}: the
 * worker's exchange, whose reports (as parse_reports reads them, bounded by
 * the body's size: the caller bounds their count, and frees them with
 * ws_reports_free) are decided before its jobs are handed out. */
typedef struct PullMsg {
    char *instance;
    int max;
    int64_t wait_ms;
    char **queues;
    bool peek; /* for the nodes of a cluster only (api.c refuses it from a client) */
    Report *reports;
    size_t n_reports;
} PullMsg;
int parse_pull(json_t *body, PullMsg *out, Err *err) WARN_UNUSED;

/* POST /workers/{id}/reports: {"reports": [...], "instance": "..."}. On
 * success *reports holds *n typed reports (the caller frees them with
 * ws_reports_free; worker_id, instance and claim are left for the manager)
 * and *instance the sender's instance (NULL when absent; the caller frees it).
 * A report without "result" has result NULL, without "retry" retry true. */
int parse_reports(json_t *body, size_t max_batch, Report **reports, size_t *n, char **instance,
                  Err *err) WARN_UNUSED;
/* POST /work/{id}/attempts/{n}/complete|fail: one report, as parse_reports
 * gives them (a completion without "result" has the result null);
 * *worker_id and *instance (NULL when absent) are the caller's to free. */
int parse_single_report(json_t *body, const char *work_id, const char *attempt, bool completed,
                        Report **reports, size_t *n, char **worker_id, char **instance,
                        Err *err) WARN_UNUSED;

/* A non-negative integer such as a Last-Event-ID or ?after=. */
int parse_seq(const char *s, int64_t *out, Err *err) WARN_UNUSED;
/* ?wait=SECONDS: a number of seconds, at most max_ms. */
int parse_wait(const char *s, int64_t max_ms, int64_t *out_ms, Err *err) WARN_UNUSED;
/* A queue name: 1..64 of [A-Za-z0-9_.-]. */
bool queue_name_valid(const char *s);

/* The body of PUT /queues/{queue}: {"paused": bool, "max_running": n|null,
 * "max_running_per_key": n|null, "rate": {"limit": n, "per": seconds}|null,
 * "key_weights": {key: weight}|null}, any of them; *set says which (QL_* of
 * event.h); null clears a limit. The caller owns out's weights
 * (queue_limits_clear); nothing is allocated on error. */
int parse_queue_limits(json_t *body, QueueLimits *out, int *set, Err *err) WARN_UNUSED;

/* The body of POST /bulk/cancel and /bulk/retry: {"queue", "key", "status"
 * (cancel only: pending, scheduled, running), "limit" (1-10000, default
 * 1000)}, each optional (NULL: any). Strings are new (caller frees). */
int parse_bulk_filter(json_t *body, bool with_status, char **queue, char **key, char **status,
                      int *limit, Err *err) WARN_UNUSED;

#endif
