/* workstate: the WorkManager's state, as a pure module. No I/O, no clock, no
 * randomness: time comes in as `now`, and jitter is derived from the work id.
 *
 * It holds open work only (pending, scheduled, running) and the registry of
 * live workers. Finished work lives in the database; what the manager knows of
 * it is passed in as KnownWork.
 *
 * The rules: a ws_decide_* function reads the state and appends the events a
 * command produces (or refuses it with an Err) without changing anything;
 * ws_apply folds one event into the state. Replaying a log through ws_apply
 * rebuilds the state. The worker registry is not event-sourced (as in the
 * Pekko sample): it is rebuilt from heartbeats, and ws_worker_* change it. */
#ifndef WORKD_WORKSTATE_H
#define WORKD_WORKSTATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "schedule.h"
#include "subscription.h"

typedef struct WsConfig {
    int64_t max_open;          /* open work limit; past it submissions are refused */
    int64_t lease_grace_ms;    /* attempt deadline = start + timeout + this */
    int64_t backoff_base_ms;   /* first retry delay (before jitter) */
    int64_t backoff_max_ms;    /* retry delay cap */
    int64_t worker_timeout_ms; /* a worker silent this long is gone */
    /* An attempt handed out this long ago that its worker's heartbeat does not
     * list never reached it (the pull's answer was lost): it is retried now.
     * 0: worker_timeout_ms. */
    int64_t unclaimed_grace_ms;
    /* Dependency edges (a waiting item's link to an open parent) held at
     * once; past it submissions that would add some get 429. 0: no limit. */
    int64_t max_edges;
    /* Dependency links that new waiting work may make a second (a token
     * bucket holding a second's worth, full at the start): each link costs
     * the leader and its writer a few microseconds, so a client's fan-in of
     * millions of them would hold up everyone's commits; past it,
     * submissions that would add some get 429. A request larger than a
     * second's worth passes when the bucket is full. 0: no limit. */
    int64_t edge_rate;
} WsConfig;

/* WORK_WAITING: accepted with parents (after) of which one is still open; it
 * sits in no heap until the last parent completes (EV_RELEASED). */
typedef enum { WORK_PENDING, WORK_RUNNING, WORK_WAITING } WorkStatus;

/* One open work item. Owned by the WorkState; pointers stay valid until the
 * event that finishes the work is applied. */
typedef struct WorkItem {
    char *id;
    char *queue;
    char *key; /* fair-share key; NULL: none */
    int priority;
    json_t *payload;
    int64_t run_at; /* 0: ready now */
    int64_t timeout_ms;
    int max_attempts;
    int64_t accepted_seq;
    int64_t created_at;
    WorkStatus status;
    int attempt;      /* attempts started so far (the current one if running) */
    char *worker_id;  /* running: who holds the attempt */
    int64_t deadline; /* running: when the attempt times out */
    int64_t started_at;
    int64_t handed_at; /* running: when its start was committed (its pull's answer could
                          leave); 0: not yet */
    char *last_error;
    /* Work restored from the database (ws_restore): the parents it names
     * (NULL-terminated), until ws_restore_links links it to those still
     * open; NULL otherwise. The state keeps links to open parents, not
     * names: the log and the projection have the names. */
    char **after;
    bool run_anyway; /* runs when a parent ends dead or cancelled (else cancelled too) */
    char *batch;     /* NULL: none */
    char *traceparent, *tracestate; /* the producer's W3C trace context; NULL: none */
    /* private */
    struct WsLink
        *links; /* waiting: a link per open parent (n_links; a finished one's is cleared) */
    size_t n_links;
    size_t parents_open; /* waiting: the open parents it is linked to (released at 0) */
    struct WsKids *kids; /* open: the waiting work linked to it (NULL: none) */
    size_t heap_idx;
    int where; /* which heap holds it */
} WorkItem;

/* An attempt a worker says it runs (its heartbeat's "running"). */
typedef struct RunningAttempt {
    char *work_id;
    int64_t attempt;
} RunningAttempt;

/* A list of them, owned by whoever made it: free it with ws_running_free. */
typedef struct RunningList {
    RunningAttempt *items;
    size_t n;
    int64_t as_of; /* when the list was received (wall ms; 0: when it is decided) */
} RunningList;

typedef struct WsWorker {
    char *id;
    char *instance; /* NULL: learned from the log at recovery, not heard from yet */
    int capacity;
    char **queues; /* NULL-terminated; empty: every queue */
    int64_t last_seen;
    RunningList *running; /* the first WORKER_RUNNING_KEPT attempts it last said it runs, for
                             display (NULL: it never said); a heartbeat may list more */
} WsWorker;

#define WORKER_RUNNING_KEPT 100

typedef struct WorkState WorkState;

/* What the manager found in the database about an id that is not open. */
typedef struct KnownWork {
    const char *id;
    const char *status; /* "completed", "dead", "cancelled" */
    int attempts;
    json_t *payload; /* borrowed */
    /* what it takes to reopen it (ws_decide_retry) */
    const char *queue;
    const char *key; /* may be NULL */
    int priority;
    int64_t timeout_ms;
    int max_attempts;
    const char *last_error; /* may be NULL */
    const char *batch;      /* the batch it was a member of (NULL: none) */
    /* the producer's trace context (may be NULL) */
    const char *traceparent, *tracestate;
    int shard; /* the shard whose log holds it */
} KnownWork;

typedef struct SubmitItem {
    char *id; /* always set: the front-end generates one when the client did not */
    char *queue;
    char *key; /* fair-share key; NULL: none */
    int priority;
    json_t *payload;
    int64_t run_at; /* 0: now */
    int64_t timeout_ms;
    int max_attempts;
    bool generated;  /* the id is a fresh UUID of this server's: no need to look it up */
    char **after;    /* parents (NULL-terminated; NULL: none): each must be open, known, or
                        an earlier item of the same submission */
    bool run_anyway; /* run even if a parent ends dead or cancelled */
    char *batch;     /* join this open batch (or the one the submission opens); NULL: none */
    char *traceparent, *tracestate; /* the producer's trace context, as trace_keep (trace.h)
                                       leaves it; NULL: none */
} SubmitItem;

/* A batch a submission opens (its id, from the front-end, and its callback:
 * NULL for none). */
typedef struct BatchOpen {
    const char *id;
    const WorkTemplate *callback;
} BatchOpen;

/* An open batch: its work not finished yet. */
typedef struct Batch {
    char *id;
    WorkTemplate *callback; /* NULL: none */
    int open;               /* members not finished */
    int counts[3];          /* members finished: completed, dead, cancelled */
} Batch;

typedef struct SubmitResult {
    bool created;       /* false: the id existed and this is the same work */
    const char *status; /* static string: "pending", "scheduled", "running", "completed", ... */
} SubmitResult;

typedef struct Report {
    const char *work_id;
    int attempt;
    const char *worker_id; /* who sends it (may be NULL: nobody holds an attempt then) */
    const char *instance;  /* the sender's instance, or NULL */
    bool claim;            /* the sender may act for worker_id without its instance: its token
                              is bound to the id, or the server is open (ws_check_worker) */
    bool completed;        /* else failed */
    json_t *result;        /* completed: borrowed */
    const char *error;     /* failed */
    bool retry;            /* failed: may it be retried */
} Report;

/* Frees reports made by the front-end's parser: work_id, error (owned there
 * though const here) and a reference to result (NULL: nothing). */
void ws_reports_free(Report *reports, size_t n);

typedef struct ReportResult {
    bool accepted;      /* recorded now, or was already: stop sending */
    const char *status; /* the work's status after it, when accepted (static) */
    const char *reason; /* when not accepted: "superseded", "cancelled", "not-found" or
                           "not-holder" */
} ReportResult;

/* ---- lifetime ---- */
WorkState *ws_new(const WsConfig *cfg);
void ws_free(WorkState *ws);

/* ---- deciding (pure: the state is not changed) ---- */

/* Accepts n items atomically: either every item is accepted or exists already
 * (results[i] says which), or nothing is and err says why: "conflict" (409,
 * same id with another payload) or "queue-full" (429). known[] lists what the
 * database holds for ids that are not open. */
int ws_decide_submit(const WorkState *ws, const SubmitItem *items, size_t n, const KnownWork *known,
                     size_t n_known, int64_t now, EventList *out, SubmitResult *results,
                     Err *err) WARN_UNUSED;

/* ws_decide_submit, where the submission may open a batch (NULL: none; an id
 * already open is joined). Items that name parents wait (WORK_WAITING) while
 * one is open; a parent that is dead or cancelled cancels the item (unless
 * run_anyway), with its cancelled event after every accepted one. Refusals
 * besides those of ws_decide_submit: 404 "parent-not-found", 404
 * "batch-not-found" (a batch that is not open). */
int ws_decide_submit_in(const WorkState *ws, const SubmitItem *items, size_t n,
                        const KnownWork *known, size_t n_known, const BatchOpen *batch, int64_t now,
                        EventList *out, SubmitResult *results, Err *err) WARN_UNUSED;

/* What an event brings about once it is decided, to be decided before e is
 * applied (e must not be applied yet): for work that finishes, its waiting
 * children are released (every parent done; a dead or cancelled parent counts
 * as done for a run_anyway child) or cancelled (the reason names the parent),
 * and its batch finishes when it was the last open member (EV_BATCH, and the
 * callback's accepted event). The caller applies e, then each follow-up in
 * order, deciding theirs in turn and skipping those ws_followup_stale says
 * another path has made moot. */
void ws_decide_followups(const WorkState *ws, const Event *e, int64_t now, EventList *out);
bool ws_followup_stale(const WorkState *ws, const Event *e);

/* The ticks of schedules that are due (sched_decide_ticks with this state). */
void ws_decide_ticks(const WorkState *ws, int64_t now, EventList *out);
/* Creates or replaces a schedule (spec copied). Ticks after now are due for a
 * new schedule or one resumed from a pause; otherwise the schedule goes on
 * from its last tick. */
void ws_decide_schedule_set(const WorkState *ws, const char *name, const ScheduleSpec *spec,
                            int64_t now, EventList *out);
/* Refusal: 404 "not-found". */
int ws_decide_schedule_delete(const WorkState *ws, const char *name, int64_t now, EventList *out,
                              Err *err) WARN_UNUSED;
const Schedule *ws_schedule(const WorkState *ws, const char *name);
size_t ws_schedule_count(const WorkState *ws);
void ws_schedule_restore(WorkState *ws, const char *name, const ScheduleSpec *spec,
                         int64_t last_tick, const char *last_work);
/* The webhook subscriptions (subscription.h: decided with subs_decide_*,
 * applied by ws_apply). */
const SubscriptionSet *ws_subscriptions(const WorkState *ws);
/* Recovery: a subscription as workd_subscriptions holds it, its secret
 * included (copied). */
void ws_subscription_restore(WorkState *ws, const Subscription *sub);
/* The id of batch's callback work, "<batch>~callback" (a batch id is at most
 * 100 characters, so it fits ID_MAX). */
void ws_callback_id(const char *batch, char *out, size_t len);
/* An open batch, or NULL. */
const Batch *ws_batch(const WorkState *ws, const char *id);
/* Recovery: an open batch as workd_batches holds it, with the counts of its
 * finished members (callback copied, may be NULL). Call before
 * ws_restore_links. */
void ws_batch_restore(WorkState *ws, const char *id, const WorkTemplate *callback,
                      const int counts[3]);
/* Recovery, after every ws_restore and ws_batch_restore: links waiting work
 * to its open parents and counts each open batch's open members. */
void ws_restore_links(WorkState *ws);

/* Cancels open work, running or not: a running attempt ends with it (its
 * worker is told to stop by ws_stale_attempts, its late report is refused as
 * "cancelled"). Refusal: 404 "not-found" when the id is not open (the caller
 * tells apart finished from unknown). */
int ws_decide_cancel(const WorkState *ws, const char *work_id, int64_t now, EventList *out,
                     Err *err) WARN_UNUSED;

/* Open work matching a filter (NULL: any): queue, key, and status
 * ("pending", "scheduled", "running"); at most max ids into ids (borrowed,
 * valid until the state changes). Returns how many matched, which may exceed
 * max. Cost: one pass over the open work. */
size_t ws_match(const WorkState *ws, const char *queue, const char *key, const char *status,
                int64_t now, const char **ids, size_t max);

/* Reopens dead work for one more attempt (an operator's retry). Refusals: 404
 * when the id is unknown (known is NULL), 409 when it is not dead, 429 when
 * the queue is full. */
int ws_decide_retry(const WorkState *ws, const char *work_id, const KnownWork *known, int64_t now,
                    EventList *out, Err *err) WARN_UNUSED;

/* Sets a queue's flow control (all of it: the caller merges a partial change
 * with ws_queue_limits). Refuses negative limits, more than QL_MAX_WEIGHTS
 * weighted keys and weights outside 1..QL_MAX_WEIGHT (400). lim is copied. */
int ws_decide_queue_set(const WorkState *ws, const char *queue, const QueueLimits *lim, int64_t now,
                        EventList *out, Err *err) WARN_UNUSED;

/* A worker's completion or failure of an attempt. A report for an attempt that
 * is not current is not accepted ("superseded"); the duplicate of a recorded
 * completion is accepted with no event. A report of the current attempt from
 * anyone but the worker that holds it is refused ("not-holder"): the worker id
 * must be the holder's, and the instance its registered one (when the report
 * names none, r->claim must say the sender may act for that id). known: the
 * database row when the work is not open (may be NULL). */
void ws_decide_report(const WorkState *ws, const Report *r, const KnownWork *known, int64_t now,
                      EventList *out, ReportResult *res);

/* Hands at most one ready job from the worker's queues (all if queues is
 * empty or NULL) to the worker: appends one started event and returns true, or
 * returns false when nothing is ready. Within a queue the keys with ready work
 * take turns: a key of weight w (the queue's key_weights, 1 by default) gets w
 * jobs in a row, then the next key's turn comes. Queues that are paused, at their
 * max_running, or out of their rate limit's tokens hand out nothing. Call
 * ws_advance() first. */
bool ws_decide_start(const WorkState *ws, const char *worker_id, char *const *queues, int64_t now,
                     EventList *out);

/* Attempts whose deadline passed, and attempts of workers that went silent:
 * appends their timed_out / failed (and dead) events. */
void ws_decide_timers(const WorkState *ws, int64_t now, EventList *out);

/* ---- applying ---- */
/* Folds one committed event into the state. Events that do not fit (unknown
 * id, stale attempt) are ignored, which is what replay of an old log needs. */
void ws_apply(WorkState *ws, const Event *e);

/* Makes scheduled work whose time has come ready, and forgets workers that are
 * silent past the timeout and hold no attempt. Call before deciding. */
void ws_advance(WorkState *ws, int64_t now);

/* The earliest time at which ws_advance or ws_decide_timers would do
 * something (INT64_MAX if never). Drives the manager's sleep. */
int64_t ws_next_deadline(const WorkState *ws);

/* ---- the worker registry ---- */
/* Registers or refreshes a worker. If it comes back as another instance (the
 * process restarted), the attempts the old instance held are failed: their
 * events are appended to out. When running (the attempts the worker says it
 * runs) is given, attempts handed to it more than unclaimed_grace_ms ago that
 * it does not list are failed too (the job never reached it). queues and running
 * are copied. */
void ws_worker_seen(WorkState *ws, const char *worker_id, const char *instance, int capacity,
                    char *const *queues, const RunningList *running, int64_t now, EventList *out);
/* A copy of the first max entries of l (NULL: NULL). */
RunningList *ws_running_copy(const RunningList *l, size_t max);
/* Frees a RunningList and its strings (NULL: nothing). */
void ws_running_free(RunningList *l);
/* Whether a request naming worker_id (and instance, may be NULL) may act for
 * it: a worker id belongs to the instance that registered it while that
 * instance is alive. Another instance, or a request without one, is refused
 * with 409 "worker-id-taken" unless claim (the sender's token is bound to the
 * id, or the server is open): then a new instance takes over as after a
 * restart (ws_worker_seen). Call before ws_worker_seen and ws_worker_forget;
 * for a deregistration pass claim only when no instance is named (a named
 * instance must be the registered one). */
int ws_check_worker(const WorkState *ws, const char *worker_id, const char *instance, bool claim,
                    int64_t now, Err *err) WARN_UNUSED;
/* Deregisters a worker; the attempts it still holds are failed (events to out). */
void ws_worker_forget(WorkState *ws, const char *worker_id, int64_t now, EventList *out);
const WsWorker *ws_worker_get(const WorkState *ws, const char *worker_id);
size_t ws_worker_count(const WorkState *ws);
/* Iteration over workers: for (size_t i = 0; (w = ws_worker_next(ws, &i));) */
const WsWorker *ws_worker_next(const WorkState *ws, size_t *pos);
/* After recovery: every worker named by a running attempt gets a placeholder
 * that must heartbeat within the worker timeout from now, and the attempt's
 * unclaimed grace (ws_handed) counts from now. */
void ws_adopt_running_workers(WorkState *ws, int64_t now);

/* ---- reading ---- */
const WorkItem *ws_get(const WorkState *ws, const char *work_id);
size_t ws_open_count(const WorkState *ws);
/* "waiting", "pending", "scheduled" or "running" as seen at time now. */
const char *ws_item_status(const WorkItem *it, int64_t now);
/* Open work of one queue by status, as seen at some time. */
typedef struct WsQueueStats {
    const char *queue; /* borrowed: valid until the state changes */
    int64_t waiting, pending, scheduled, running;
} WsQueueStats;
/* Counts by queue (queues with open work only, in no particular order): a new
 * array of *n entries that the caller frees. */
WsQueueStats *ws_queue_stats(const WorkState *ws, int64_t now, size_t *n);
/* Iteration over the open work, in no particular order:
 * for (size_t i = 0; (it = ws_item_next(ws, &i));) */
const WorkItem *ws_item_next(const WorkState *ws, size_t *pos);

/* Whether the state holds the queue: it has open work or flow control (an
 * idle queue without either is forgotten, ws_advance). */
bool ws_queue_known(const WorkState *ws, const char *queue);
/* A queue's flow control (all zero: none). Its weights are borrowed: valid
 * until the state changes; do not clear it. */
QueueLimits ws_queue_limits(const WorkState *ws, const char *queue);
/* Iteration over the queues the state holds (those with open work or flow
 * control): for (size_t i = 0; (name = ws_queue_next(ws, &i));) */
const char *ws_queue_next(const WorkState *ws, size_t *pos);
/* The starts a queue's rate limit allows at now, fractional (-1: it has none). */
double ws_queue_tokens(const WorkState *ws, const char *queue, int64_t now);
/* Recovery: a queue's flow control as workd_queues holds it (copied); a rate
 * limit's bucket starts empty at now, so a failover brings no burst. */
void ws_queue_restore(WorkState *ws, const char *queue, const QueueLimits *lim, int64_t now);

/* Inserts an open item as the projection holds it (recovery). Takes copies. */
void ws_restore(WorkState *ws, const WorkItem *item);
/* The start of attempt `attempt` of work_id is committed at time now: its
 * answer may be on its way to the worker from now on (fail_unclaimed counts
 * the grace from here, not from the decision: a slow commit is not a lost
 * answer). Recovered running attempts count from their recovery. */
void ws_handed(WorkState *ws, const char *work_id, int attempt, int64_t now);

/* Deterministic retry delay for the given attempt: exponential, capped, with
 * jitter in [50%, 100%] derived from the id. */
int64_t ws_backoff_ms(const WsConfig *cfg, const char *work_id, int attempt);

#endif
