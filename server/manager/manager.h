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
#include "netpolicy.h"
#include "progress.h"
#include "retention.h"
#include "stores.h"
#include "workstate.h"

typedef enum { COMMIT_BEGIN, COMMIT_DONE, COMMIT_FAILED } CommitStage;

/* The window of ManagerStats.window_* (a leader's recent writer figures). */
#define STATS_WINDOW_MS 10000

/* Bytes of a pulled job's answer beside its payload, at most: the fields
 * (id, queue, deadline...: 512) and the trace context (traceparent and a
 * tracestate of 512 bytes, escaped). A pull answer of --max-reply-bytes holds
 * any one job whose payload is at most --max-reply-bytes less this (main.c
 * requires --max-body to be). */
#define MANAGER_JOB_ENVELOPE 2048

typedef struct ManagerConfig {
    const char *database_url; /* the database of this manager's shard */
    const char *advertise_url;
    /* The shard this manager stands for, of the cluster's shards (the
     * database's workd_cluster): its lock, term, log and queues. Webhook
     * deliveries run in shard 0's manager alone, retention in the manager
     * of the first shard of each database. */
    int shard, shards;
    /* Where every shard lives (borrowed; outlives the manager). NULL: one
     * database, database_url. */
    const Stores *stores;
    int64_t election_interval_ms;  /* how often a standby tries the lock */
    int64_t heartbeat_interval_ms; /* announced to workers */
    int64_t pull_wait_max_ms;      /* cap on a pull's long-poll */
    int64_t max_workers;           /* registered workers at most: 429 for a new one past it */
    int64_t max_reply_bytes;       /* a pull answer stops adding jobs near it (at least one) */
    /* A payload's compact JSON text at most (--max-body), and a body's nesting
     * (--max-json-depth): published to workd.submit at election, and checked
     * again when an item is taken from its inbox. */
    int64_t max_payload_bytes;
    int max_json_depth;
    int64_t max_schedules; /* schedules at most: 409 for a new one past it */
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
    const NetPolicy *webhook_allow; /* receivers' addresses allowed beside public ones */
    /* Called on the manager thread around each commit of events of its shard
     * (in seq order; final events carry their queue): COMMIT_BEGIN before it is sent,
     * then COMMIT_DONE or COMMIT_FAILED (written or not, unknown). The
     * front-end publishes results without its listener's round trip. May be
     * NULL. */
    void (*on_commit)(CommitStage stage, int shard, const EventList *events, void *ud);
    void *on_commit_ud;
} ManagerConfig;

typedef enum {
    MC_SUBMIT,       /* items -> submitted (typed, no JSON) */
    MC_CANCEL,       /* work_id -> work_status */
    MC_RETRY,        /* work_id (dead) -> work_status */
    MC_REPORTS,      /* worker_id, instance, claim, reports -> results (typed, no JSON) */
    MC_PULL,         /* worker_id, instance, claim, queues, max, wait_ms -> jobs (typed) */
    MC_HEARTBEAT,    /* worker_id, instance, claim, capacity, queues, running -> intervals, stale */
    MC_DEREGISTER,   /* worker_id, instance, claim -> (204) */
    MC_CLUSTER,      /* -> cluster */
    MC_QUEUE_SET,    /* queue, limits (the parts in limits_set) -> limits: all of the queue's */
    MC_BULK_CANCEL,  /* filter (queue, key, status), max -> n_done, more */
    MC_BULK_RETRY,   /* filter (queue, key), max -> n_done, more (dead work) */
    MC_SCHEDULE_SET, /* name, schedule (or pause: 1 pause, 0 resume) -> schedule (all of it),
                        last_tick, decided_at */
    MC_SCHEDULE_DELETE,     /* name -> (204) */
    MC_PROGRESS,            /* worker_id, instance, claim, updates -> each update's status and seq
                               (typed) */
    MC_SUBSCRIPTION_SET,    /* name, sub, sub_reset -> subs: the subscription as GET shows it */
    MC_SUBSCRIPTION_DELETE, /* name -> subs: the subscription as it was */
    MC_SUBSCRIPTION_GET,    /* name, or NULL for all -> subs */
    MC_SUB_CURSOR,          /* name, sub->cursor: from the webhooks thread -> (204) */
    MC_SUB_PAUSE,           /* name, reason: from the webhooks thread -> (204) */
    MC_QUEUE_FLOW,          /* -> tokens: the starts each rate-limited queue allows now */
    MC_COUNT                /* not a command: how many kinds (commands.c has an entry for each) */
} MgrCmdType;

/* A rate-limited queue's token bucket as the leader holds it (MC_QUEUE_FLOW). */
typedef struct QueueTokens {
    char *queue;
    double tokens; /* starts its rate limit allows now */
} QueueTokens;

/* A job handed to a pull (MC_PULL's answer); strings and payload owned by the
 * command. */
typedef struct PulledJob {
    char *id;
    int attempt;
    char *queue;
    int priority;
    json_t *payload;
    int64_t timeout_ms;
    int64_t deadline; /* ms since the epoch */
    /* the producer's trace context; NULL: none */
    char *traceparent, *tracestate;
} PulledJob;

/* What /cluster shows of the leader, taken on the manager thread. Every
 * string and list is owned by the view (cluster_view_free). */
typedef struct ClusterWorker {
    char *id;
    int capacity;
    char **queues;        /* NULL-terminated, or NULL */
    RunningList *running; /* NULL: it never said */
    int64_t last_seen;
} ClusterWorker;

typedef struct ClusterQueue {
    char *queue;
    int64_t waiting, pending, scheduled, running;
} ClusterQueue;

typedef struct ClusterView {
    char *leader; /* advertise URL */
    int64_t term;
    int shard;
    char database[24]; /* where the shard's rows are: "home", or "shard-K" (the
                          first shard of its own database) */
    /* the writer over the last stats window (ManagerStats) */
    int64_t busy_permille, commit_mean_us, commit_p99_us;
    int64_t now; /* when the view was taken (silent_ms is from it) */
    ClusterWorker *workers;
    size_t n_workers;
    ClusterQueue *open; /* open work by queue */
    size_t n_open;
    int64_t open_total;
    /* storage: retention's figures (retention.h) */
    int64_t retain_ms, parts, events_bytes, done_bytes, open_bytes, oldest_part_ms, last_run_ms,
        parts_dropped;
} ClusterView;

/* How a subscription's deliveries go on the leader (the webhooks thread's
 * figures, webhooks.h). Times are ms since the epoch; 0: none. */
typedef struct Deliveries {
    Cursor delivered_upto; /* every event up to here was delivered or skipped (the cursor
                              not recorded yet) */
    int64_t lag;           /* events in the logs after delivered_upto, every shard's */
    int64_t delivered;     /* deliveries acknowledged since this node leads */
    int64_t last_delivered_at;
    int failures; /* failed deliveries in a row */
    int64_t failing_since, last_error_at, next_attempt_at;
    char last_error[300]; /* "": none */
} Deliveries;

/* A subscription as GET /subscriptions shows it: its settings and recorded
 * cursor as the WorkState holds them (sub.secret is NULL: never shown), and
 * its deliveries. */
typedef struct SubscriptionView {
    Subscription sub; /* owned */
    Deliveries deliveries;
} SubscriptionView;

/* The answer of the subscription commands (owned by the command). */
typedef struct SubscriptionViews {
    SubscriptionView *items; /* by name */
    size_t len;
    Cursor last_seq; /* every shard's log's end as the deliveries know it */
} SubscriptionViews;

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
    char **queues;        /* NULL-terminated, or NULL */
    RunningList *running; /* MC_HEARTBEAT: NULL when the worker did not say */
    Report *reports;      /* MC_REPORTS: n_reports of them (ws_reports_free); the manager
                             fills in worker_id, instance and claim from the command */
    size_t n_reports;
    char *queue;        /* MC_QUEUE_SET; a filter of MC_BULK_* (NULL: any) */
    char *key;          /* a filter of MC_BULK_* (NULL: any) */
    char *state;        /* a filter of MC_BULK_CANCEL: pending, scheduled, running (NULL: any) */
    QueueLimits limits; /* MC_QUEUE_SET: the change; once done, all of the queue's limits */
    int limits_set;     /* QL_* */
    char *batch_id;     /* MC_SUBMIT: the batch the submission opens (or joins) */
    WorkTemplate *batch_callback; /* with batch_id: its callback (NULL: none) */
    char *name; /* MC_SCHEDULE_*: the schedule; MC_SUBSCRIPTION_*, MC_SUB_*: the subscription
                   (MC_SUBSCRIPTION_GET: NULL for all) */
    ScheduleSpec *schedule; /* MC_SCHEDULE_SET: the whole definition, or NULL with */
    int pause;              /* 1: pause, 0: resume the schedule as it is */
    int max;
    int64_t wait_ms;
    /* MC_PULL: a peek (a node pulling for a worker from several shards)
     * starts nothing: it is answered, ready set, once a start would be
     * possible, or at its wait's end. */
    bool peek, ready;
    ProgressUpdate *updates; /* MC_PROGRESS: n_updates of them, each answered in place */
    size_t n_updates;
    /* MC_SUBSCRIPTION_SET: all of it, its secret included; MC_SUB_CURSOR: its
     * cursor alone (every event up to it was delivered or skipped) */
    Subscription *sub;
    bool sub_reset; /* MC_SUBSCRIPTION_SET: deliveries restart after sub->cursor ("after") */
    char *reason;   /* MC_SUB_PAUSE: why workd pauses it */
    /* reply: typed, written as JSON by the front-end (api.c, render.c) */
    int status;              /* HTTP status: 200, 202, 204, or the error's */
    Err err;                 /* when status >= 400 */
    const char *work_status; /* MC_CANCEL, MC_RETRY: the work's status after it (static) */
    int64_t n_done;          /* MC_BULK_*: work items cancelled or reopened */
    bool queue_new; /* MC_QUEUE_SET: the queue had no open work and no flow control before */
    bool more;      /* MC_BULK_*: more match: send the command again */
    int64_t heartbeat_interval_ms, worker_timeout_ms; /* MC_HEARTBEAT */
    RunningList *stale;      /* MC_HEARTBEAT: listed attempts no longer current (stop them) */
    ClusterView *cluster;    /* MC_CLUSTER */
    int64_t last_tick;       /* MC_SCHEDULE_SET: the schedule's last tick */
    int64_t decided_at;      /* MC_SCHEDULE_SET: its next fire times count from here */
    SubscriptionViews *subs; /* MC_SUBSCRIPTION_SET, _DELETE: the one; _GET: one or all */
    ReportResult *results;   /* MC_REPORTS, status 200: one per report, its status as seen
                                right after it (static strings) */
    SubmitResult *submitted; /* MC_SUBMIT, status 202: one per item (static strings) */
    PulledJob *jobs;         /* MC_PULL, status 200: n_jobs handed to the worker */
    size_t n_jobs;
    QueueTokens *tokens; /* MC_QUEUE_FLOW, status 200: n_tokens of them */
    size_t n_tokens;
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
    bool looks;            /* the round looks up ids for it (cmd_lookup) */
} MgrCmd;

typedef struct ManagerStats {
    Histogram commit_us;                      /* time of each group commit, microseconds */
    Histogram commit_events;                  /* events per group commit */
    atomic_llong events_by_type[EV_LAST + 1]; /* committed events, by EventType */
    atomic_llong workers_lost;                /* attempts ended because their worker went silent */
    atomic_llong elections_won, step_downs;
    atomic_llong appends_behind; /* appends sent while another was being committed */
    atomic_llong open_work, workers, waiting_pulls;
    atomic_llong inbox_taken; /* SQL submissions taken into the log (new or existing ids) */
    atomic_llong busy_us;     /* time with an append out: the writer session at work */
    /* Over the last full window of STATS_WINDOW_MS while leading: the
     * writer's busy share (per mille), and its commits' mean and 99th
     * percentile (the histogram bucket's bound), in microseconds. */
    atomic_llong window_busy_permille, window_commit_mean_us, window_commit_p99_us;
    atomic_llong
        inbox_refused; /* SQL submissions refused when taken (an id with another payload) */
} ManagerStats;

typedef struct Manager Manager;

/* ---- lifetime ---- */
/* Starts the manager thread (it campaigns at once). Copies cfg's strings. */
Manager *manager_start(const ManagerConfig *cfg, Err *err) WARN_UNUSED;
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
/* Whether this manager stands for its shard's leader while it does not lead
 * (placement, shards.h; true from the start). Any thread. */
void manager_allow_campaign(Manager *m, bool allow);
/* Asks a leading manager to step down at once (its shard goes to a less
 * loaded node); nothing while it does not lead. Any thread. */
void manager_release(Manager *m);
/* True while this process is the leader (a hint: a command may still be
 * refused with 503 "not-leader" if leadership is lost meanwhile). */
bool manager_is_leader(const Manager *m);
const ManagerStats *manager_stats(const Manager *m);
/* The history's size and the last retention pass (kept while this node leads). */
const RetentionStats *manager_retention_stats(const Manager *m);
/* Where m's shard keeps its rows, as operators see it: "home", or "shard-K"
 * for a database of its own (K its first shard). Returns how many databases
 * the cluster has (1: every shard at home). */
int manager_database(const Manager *m, char *label, size_t len);
/* Frees a view and all it holds (NULL: nothing). */
void cluster_view_free(ClusterView *v);

#endif
