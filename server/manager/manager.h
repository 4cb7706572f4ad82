/* manager: the WorkManager actor. One thread owns the WorkState; everyone else
 * sends it commands through the mailbox and is called back with the reply.
 * It campaigns for leadership with a PostgreSQL advisory lock, rebuilds the
 * state from the database when it wins, and commits each mailbox batch's events
 * in one transaction before it replies (persist, then act). */
#ifndef WORKD_MANAGER_H
#define WORKD_MANAGER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "histogram.h"
#include "progress.h"
#include "retention.h"
#include "workstate.h"

typedef enum { COMMIT_BEGIN, COMMIT_DONE, COMMIT_FAILED } CommitStage;

typedef struct ManagerConfig {
    const char *database_url;
    const char *advertise_url;
    int64_t election_interval_ms;  /* how often a standby tries the lock */
    int64_t heartbeat_interval_ms; /* announced to workers */
    int64_t pull_wait_max_ms;      /* cap on a pull's long-poll */
    int64_t max_workers;           /* registered workers at most: 429 for a new one past it */
    int64_t max_reply_bytes;       /* a pull answer stops adding jobs near it (at least one) */
    WsConfig ws;
    int64_t retain_ms; /* finished work and events are kept this long (retention.h) */
    /* For work submitted in SQL without them (workd.submit). */
    int64_t default_timeout_ms;
    int default_max_attempts;
    ProgressLimits progress; /* per attempt (progress.h) */
    /* Webhook deliveries (webhooks.h): one delivery's time limit, the retries'
     * backoff, and how long a failing subscription is retried before it is paused. */
    int64_t webhook_timeout_ms, webhook_backoff_base_ms, webhook_backoff_max_ms;
    int64_t webhook_pause_after_ms;
    /* Called on the manager thread around each commit of events (in seq
     * order; final events carry their queue): COMMIT_BEGIN before it is sent,
     * then COMMIT_DONE or COMMIT_FAILED (written or not, unknown). The
     * front-end publishes results without its listener's round trip. May be
     * NULL. */
    void (*on_commit)(CommitStage stage, const EventList *events, void *ud);
    void *on_commit_ud;
} ManagerConfig;

typedef enum {
    MC_SUBMIT,          /* items -> {"items": [{id, status, created}]} */
    MC_CANCEL,          /* work_id -> {id, status} */
    MC_RETRY,           /* work_id (dead) -> {id, status} */
    MC_REPORTS,         /* worker_id, instance, claim, reports (JSON array) -> {"results": [...]} */
    MC_PULL,            /* worker_id, instance, claim, queues, max, wait_ms -> {"jobs": [...]} */
    MC_HEARTBEAT,       /* worker_id, instance, claim, capacity, queues, running -> intervals */
    MC_DEREGISTER,      /* worker_id, instance, claim -> (204) */
    MC_CLUSTER,         /* -> {"leader", "term", "workers", "open"} */
    MC_QUEUE_SET,       /* queue, limits (the parts in limits_set) -> the queue's limits */
    MC_BULK_CANCEL,     /* filter (queue, key, status), max -> {"cancelled": n, "more": bool} */
    MC_BULK_RETRY,      /* filter (queue, key), max -> {"retried": n, "more": bool} (dead work) */
    MC_SCHEDULE_SET,    /* name, schedule (or pause: 1 pause, 0 resume) -> the schedule */
    MC_SCHEDULE_DELETE, /* name -> (204) */
    MC_PROGRESS,        /* work_id, attempt, worker_id, instance, claim, detail {fraction, message,
                           output} -> {id, attempt, seq} */
    MC_SUBSCRIPTION_SET, /* detail: the whole subscription (webhooks.h), or {name, deleted:
                            true} -> the subscription as GET shows it */
    MC_SUBSCRIPTION_GET, /* queue: a name, or NULL for all -> webhooks_json */
    MC_SUB_CURSOR,       /* detail {name, cursor}: from the webhooks thread -> (204) */
    MC_SUB_PAUSE,        /* detail {name, paused_reason}: from the webhooks thread -> (204) */
    MC_QUEUE_FLOW,       /* -> {queue: {"tokens": starts allowed now}} for rate-limited queues */
} MgrCmdType;

/* A command and, once done, its reply. The sender allocates it with
 * mgrcmd_new, fills the inputs, and hands it to manager_send; the manager owns
 * it until it calls done() (from its own thread, exactly once), after which the
 * sender owns it again and frees it with mgrcmd_free. */
typedef struct MgrCmd {
    MgrCmdType type;
    /* inputs, owned by the command */
    SubmitItem *items;
    size_t n_items;
    char *work_id;
    char *worker_id;
    char *instance;
    bool claim; /* the sender may act for worker_id without its instance (ws_check_worker) */
    int capacity;
    char **queues; /* NULL-terminated, or NULL */
    json_t *running;
    json_t *reports;
    char *queue; /* MC_QUEUE_SET; a filter of MC_BULK_* (NULL: any) */
    char *key;   /* a filter of MC_BULK_* (NULL: any) */
    char *state; /* a filter of MC_BULK_CANCEL: pending, scheduled, running (NULL: any) */
    QueueLimits limits;
    int limits_set;               /* QL_* */
    char *batch_id;               /* MC_SUBMIT: the batch the submission opens (or joins) */
    WorkTemplate *batch_callback; /* with batch_id: its callback (NULL: none) */
    char *name;                   /* MC_SCHEDULE_*: the schedule */
    ScheduleSpec *schedule;       /* MC_SCHEDULE_SET: the whole definition, or NULL with */
    int pause;                    /* 1: pause, 0: resume the schedule as it is */
    int max;
    int64_t wait_ms;
    int attempt;    /* MC_PROGRESS */
    json_t *detail; /* MC_PROGRESS, MC_SUBSCRIPTION_SET, MC_SUB_* */
    /* reply */
    int status;    /* HTTP status: 200, 204, or the error's */
    Err err;       /* when status >= 400 */
    json_t *reply; /* when status < 300 and there is a body */
    /* completion */
    void (*done)(struct MgrCmd *cmd, void *ud);
    void *ud;
    /* For a waiting pull: whether its client is still connected (may be NULL).
     * Called from the manager thread while the request is parked. */
    bool (*alive)(void *ud);
    /* private to the manager */
    struct MgrCmd *next;
    int64_t deadline;
    int64_t inbox_n;       /* a submission taken from workd_inbox (0: from HTTP) */
    struct KnownSet *bulk; /* MC_BULK_RETRY: the dead work the round found */
} MgrCmd;

typedef struct ManagerStats {
    Histogram commit_us;                      /* time of each group commit, microseconds */
    Histogram commit_events;                  /* events per group commit */
    atomic_llong events_by_type[EV_LAST + 1]; /* committed events, by EventType */
    atomic_llong workers_lost;                /* attempts ended because their worker went silent */
    atomic_llong elections_won, step_downs;
    atomic_llong open_work, workers, waiting_pulls;
    atomic_llong inbox_taken; /* SQL submissions taken into the log (new or existing ids) */
    atomic_llong
        inbox_refused; /* SQL submissions refused when taken (an id with another payload) */
} ManagerStats;

typedef struct Manager Manager;

/* ---- lifetime ---- */
/* Starts the manager thread (it campaigns at once). Copies cfg's strings. */
Manager *manager_start(const ManagerConfig *cfg, Err *err);
/* Steps down (releasing the lock), fails queued commands with 503, joins.
 * Commands sent afterwards are answered 503 at once; free after the HTTP
 * daemon has stopped. */
void manager_stop(Manager *m);
void manager_free(Manager *m);

/* ---- talking to it (any thread) ---- */
MgrCmd *mgrcmd_new(MgrCmdType type);
void mgrcmd_free(MgrCmd *c);
/* Queues cmd; done() will be called from the manager thread. */
void manager_send(Manager *m, MgrCmd *cmd);
/* True while this process is the leader (a hint: a command may still be
 * refused with 503 "not-leader" if leadership is lost meanwhile). */
bool manager_is_leader(const Manager *m);
int64_t manager_term(const Manager *m);
const ManagerStats *manager_stats(const Manager *m);
/* The history's size and the last retention pass (kept while this node leads). */
const RetentionStats *manager_retention_stats(const Manager *m);
/* A queue's flow control as the API shows it: {queue, paused, max_running,
 * rate: {limit, per} | null} (a new reference). */
json_t *queue_limits_json(const char *queue, const QueueLimits *l);

#endif
