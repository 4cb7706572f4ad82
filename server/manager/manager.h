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
#include "workstate.h"

typedef struct ManagerConfig {
    const char *database_url;
    const char *advertise_url;
    int64_t election_interval_ms;  /* how often a standby tries the lock */
    int64_t heartbeat_interval_ms; /* announced to workers */
    int64_t pull_wait_max_ms;      /* cap on a pull's long-poll */
    WsConfig ws;
    /* Called on the manager thread after each commit with its events, in seq
     * order (final events carry their queue): the front-end publishes results
     * without waiting for its listener's round trip. May be NULL. */
    void (*on_commit)(const EventList *events, void *ud);
    void *on_commit_ud;
} ManagerConfig;

typedef enum {
    MC_SUBMIT,     /* items -> {"items": [{id, status, created}]} */
    MC_CANCEL,     /* work_id -> {id, status} */
    MC_RETRY,      /* work_id (dead) -> {id, status} */
    MC_REPORTS,    /* worker_id, reports (JSON array) -> {"results": [...]} */
    MC_PULL,       /* worker_id, instance, queues, max, wait_ms -> {"jobs": [...]} */
    MC_HEARTBEAT,  /* worker_id, instance, capacity, queues, running -> intervals */
    MC_DEREGISTER, /* worker_id -> (204) */
    MC_CLUSTER,    /* -> {"leader", "term", "workers", "open"} */
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
    int capacity;
    char **queues; /* NULL-terminated, or NULL */
    json_t *running;
    json_t *reports;
    int max;
    int64_t wait_ms;
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
} MgrCmd;

typedef struct ManagerStats {
    Histogram commit_us;                         /* time of each group commit, microseconds */
    Histogram commit_events;                     /* events per group commit */
    atomic_llong events_by_type[EV_RETRIED + 1]; /* committed events, by EventType */
    atomic_llong workers_lost; /* attempts ended because their worker went silent */
    atomic_llong elections_won, step_downs;
    atomic_llong open_work, workers, waiting_pulls;
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

#endif
