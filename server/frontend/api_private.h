/* The API's private parts, shared by its files: api.c (the route table, the
 * table of the manager's answers, the Api, the HTTP hooks, the helpers every
 * handler uses), api_shards.c (where a command goes: a shard's leader, every
 * shard, the shards a database says, and the merging of their answers) and
 * the handlers by resource: api_work.c, api_queues.c, api_schedules.c,
 * api_workers.c, api_cluster.c. Nothing outside server/frontend/api*.c
 * includes this. */
#ifndef WORKD_API_PRIVATE_H
#define WORKD_API_PRIVATE_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "auth.h"
#include "cursor.h"
#include "dbpool.h"
#include "err.h"
#include "fanout.h"
#include "http.h"
#include "hub.h"
#include "leaderinfo.h"
#include "listener.h"
#include "manager.h"
#include "metrics.h"
#include "proxy.h"
#include "shards.h"
#include "view.h"

/* The handlers' context (Req.app): their config, the node's parts, and a
 * cache: finished-work counts are a scan of the history, computed at most
 * every FINISHED_COUNTS_MS, whoever asks (read-pool threads). */
struct Api {
    ApiConfig cfg;
    ShardSet *mgrs; /* a manager per shard; NULL without the manager role */
    int shards;     /* the cluster's */
    Hub *hub;
    Listener *listener;
    Proxy *proxy;
    DbPool *pool;
    Metrics *metrics;
    Auth *auth;
    LeaderInfo *leader;
    ApiDbWatch dbwatch;
    pthread_mutex_t stats_lock; /* guards the two below */
    FinishedCounts *finished_counts;
    int64_t finished_counts_ms;
};

static inline Api *api_of(const Req *r)
{
    return r->app;
}

/* ---- api.c: helpers of every handler ---- */
/* Answers r with a problem+json of status, type and msg. */
void problem(Req *r, int status, const char *type, const char *msg);
/* The request's body as JSON (a new reference), or NULL with err. */
json_t *body_json(Req *r, Err *err) WARN_UNUSED;
/* Whether id (in the path) is valid for what it names ("work id": one workd
 * made too); answers 400 if not. */
bool check_id(Req *r, const char *id, const char *what);
/* Whether name (in the path: a queue, a schedule, a subscription) is valid;
 * answers 400, saying what, if not. */
bool check_name(Req *r, const char *name, const char *what);
/* A cursor of this cluster's shards, from a query or Last-Event-ID. */
int parse_cursor(Req *r, const char *text, Cursor *out, Err *err) WARN_UNUSED;

/* ---- api.c: the manager's answers, one function per kind of command ----
 * Each writes a command's typed reply (status < 400) as the API's answer. */
typedef void (*CmdReply)(Req *r, const MgrCmd *c);
/* By MgrCmdType: every one has its reply. */
extern const CmdReply api_replies[];

/* ---- api_shards.c: where a command goes, and the shards' answers merged ----
 * Each takes c (and forward_body) and answers r, or parks it until the
 * manager, a forward or a read of the database answers. */
void to_shard(Req *r, int shard, MgrCmd *c, char *forward_body);
int queue_shard(const Api *a, const char *q);
void to_queue_shard(Req *r, int shard, MgrCmd *c, char *forward_body);
void to_all_shards(Req *r, MgrCmd *c, FanMerge merge);
void to_looked_up_shard(Req *r, const char *id, bool schedule, int want, MgrCmd *c);
void to_work_shard(Req *r, const char *id, MgrCmd *c);
/* ids[0..n) are borrowed from c; the array is taken. */
void to_batch_shards(Req *r, MgrCmd *c, const char *key, char **ids, size_t n);
/* A batch's items split by shard: for each shard s that of[i] names for
 * some of the n items, a body (base, a deep copy, with key set to those
 * items in order) in bodies (the caller's) and s in shards; returns how
 * many. */
size_t bodies_by_shard(const Api *a, const json_t *base, const char *key, const json_t *items,
                       const int *of, size_t n, int *shards, char **bodies);
/* The "results" of n shards' answers to such bodies, put back in the
 * order of the items (of: each item's shard); a new array. */
json_t *results_in_order(const FanReply *rs, size_t n, const int *of, const json_t *items,
                         size_t count);
/* A heartbeat's answers from every shard; one whose leader does not answer
 * within HEARTBEAT_CALL_MS (to_all_shards) is left out. */
#define HEARTBEAT_CALL_MS 2000
void merge_heartbeat(Req *r, FanReply *rs, size_t n, void *ud);
void merge_no_content(Req *r, FanReply *rs, size_t n, void *ud);
void merge_cluster(Req *r, FanReply *rs, size_t n, void *ud);
void merge_bulk(Req *r, FanReply *rs, size_t n, void *ud);

/* ---- the handlers (api_routes) and answers (api_replies), by resource ---- */

/* api_work.c: work, its events, bulk actions */
void h_submit(Req *r, char *const *p);
void h_work_list(Req *r, char *const *p);
void h_work_get(Req *r, char *const *p);
void h_work_events(Req *r, char *const *p);
void h_cancel(Req *r, char *const *p);
void h_retry(Req *r, char *const *p);
void h_bulk_cancel(Req *r, char *const *p);
void h_bulk_retry(Req *r, char *const *p);
void reply_submit(Req *r, const MgrCmd *c);
void reply_work_status(Req *r, const MgrCmd *c);
void reply_bulk(Req *r, const MgrCmd *c);

/* api_queues.c: queues, their flow control and keys, the activity chart */
void h_queues(Req *r, char *const *p);
void h_queue_put(Req *r, char *const *p);
void h_queue_pause(Req *r, char *const *p);
void h_queue_resume(Req *r, char *const *p);
void h_queue_keys(Req *r, char *const *p);
void h_activity(Req *r, char *const *p);
void reply_queue_set(Req *r, const MgrCmd *c);

/* api_schedules.c: schedules, and batches */
void h_schedules(Req *r, char *const *p);
void h_schedule_get(Req *r, char *const *p);
void h_schedule_put(Req *r, char *const *p);
void h_schedule_delete(Req *r, char *const *p);
void h_schedule_pause(Req *r, char *const *p);
void h_schedule_resume(Req *r, char *const *p);
void h_batch_get(Req *r, char *const *p);
void reply_schedule_set(Req *r, const MgrCmd *c);

/* api_workers.c: heartbeats, pulls, reports, progress, deregistration */
void h_complete(Req *r, char *const *p);
void h_fail(Req *r, char *const *p);
void h_progress(Req *r, char *const *p);
void h_heartbeat(Req *r, char *const *p);
void h_deregister(Req *r, char *const *p);
void h_pull(Req *r, char *const *p);
void h_reports(Req *r, char *const *p);
void h_worker_progress(Req *r, char *const *p);
void reply_pull(Req *r, const MgrCmd *c);
void reply_reports(Req *r, const MgrCmd *c);
void reply_heartbeat(Req *r, const MgrCmd *c);
void progress_reply(Req *r, const MgrCmd *c);
/* Attempts as [{"id", "attempt"}] (null for NULL); a new reference. */
json_t *running_json(const RunningList *l);

/* api_cluster.c: the cluster, health, metrics, results, subscriptions */
void h_cluster(Req *r, char *const *p);
void h_healthz(Req *r, char *const *p);
void h_readyz(Req *r, char *const *p);
void h_metrics(Req *r, char *const *p);
void h_results(Req *r, char *const *p);
void h_work_stream(Req *r, char *const *p);
void h_subscriptions(Req *r, char *const *p);
void h_subscription_put(Req *r, char *const *p);
void h_subscription_get(Req *r, char *const *p);
void h_subscription_delete(Req *r, char *const *p);
void reply_cluster(Req *r, const MgrCmd *c);
void reply_subscriptions(Req *r, const MgrCmd *c);

#endif
