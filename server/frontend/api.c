/* api: see api.h. */
#include "api.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "dbpool.h"
#include "view.h"
#include "listener.h"
#include "log.h"
#include "manager.h"
#include "metrics.h"
#include "parse.h"
#include "parse_hooks.h"
#include "proxy.h"
#include "render.h"
#include "fanout.h"
#include "hub.h"
#include "pull.h"
#include "shard.h"
#include "shards.h"
#include "static.h"
#include "trace.h"
#include "util.h"

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

static Api *api_of(const Req *r)
{
    return r->app;
}

/* ---- helpers ---- */

static void problem(Req *r, int status, const char *type, const char *msg)
{
    Err e;
    err_set(&e, status, type, "%s", msg);
    req_finish_problem(r, &e);
}

WARN_UNUSED static json_t *body_json(Req *r, Err *err)
{
    return parse_json_body(r->body.data ? r->body.data : "", r->body.len,
                           (size_t)api_of(r)->cfg.max_json_depth, err);
}

/* A work id in the path may be one workd made (with '~'); any other id not. */
static bool check_id(Req *r, const char *id, const char *what)
{
    bool work = !strcmp(what, "work id");
    if (work ? work_id_valid(id) : id_valid(id))
        return true;
    char msg[200];
    snprintf(msg, sizeof msg,
             "the %s in the path must be 1-128 characters of A-Z a-z 0-9 . _ : @ -%s, not . or ..",
             what, work ? " ~" : "");
    problem(r, 400, "invalid-path", msg);
    return false;
}

/* Whether the request's token may act for worker_id (a token bound to other
 * worker ids may not: 403). Sets c->claim: may it claim the id without naming
 * the registered instance (manager.h)? */
static bool worker_allowed(Req *r, const char *worker_id, MgrCmd *c)
{
    AuthWorkerAccess acc =
        auth_worker_access(api_of(r)->auth, req_header(r, MHD_HTTP_HEADER_AUTHORIZATION),
                           req_query(r, "access_token"), worker_id);
    if (acc == AUTH_WORKER_DENIED) {
        char msg[300];
        snprintf(msg, sizeof msg, "this token is bound to other worker ids than '%s'", worker_id);
        problem(r, 403, "forbidden", msg);
        return false;
    }
    c->claim = acc == AUTH_WORKER_OWNS;
    return true;
}

/* Attempts as [{"id", "attempt"}] (null for NULL). */
static json_t *running_json(const RunningList *l)
{
    if (!l)
        return json_null();
    json_t *arr = json_array();
    for (size_t i = 0; i < l->n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:I}", "id", l->items[i].work_id, "attempt",
                                             (json_int_t)l->items[i].attempt));
    return arr;
}

/* GET /cluster as the leader sees it (without "nodes" and "database", which
 * the answering node adds). */
static json_t *cluster_json(const ClusterView *v)
{
    json_t *workers = json_array();
    for (size_t i = 0; i < v->n_workers; i++) {
        const ClusterWorker *w = &v->workers[i];
        json_t *queues = json_array();
        for (size_t q = 0; w->queues && w->queues[q]; q++)
            json_array_append_new(queues, json_string(w->queues[q]));
        char seen[40];
        time_format(w->last_seen, seen, sizeof seen);
        json_array_append_new(workers,
                              json_pack("{s:s, s:i, s:o, s:o, s:s, s:I}", "id", w->id, "capacity",
                                        w->capacity, "queues", queues, "running",
                                        running_json(w->running), "last_heartbeat", seen,
                                        "silent_ms", (json_int_t)(v->now - w->last_seen)));
    }
    json_t *open = json_object();
    for (size_t i = 0; i < v->n_open; i++)
        json_object_set_new(
            open, v->open[i].queue,
            json_pack("{s:I, s:I, s:I, s:I}", "waiting", (json_int_t)v->open[i].waiting, "pending",
                      (json_int_t)v->open[i].pending, "scheduled", (json_int_t)v->open[i].scheduled,
                      "running", (json_int_t)v->open[i].running));
    json_t *storage = json_pack(
        "{s:f, s:I, s:I, s:I, s:I, s:o, s:o, s:I}", "retain_s", (double)v->retain_ms / 1000.0,
        "parts", (json_int_t)v->parts, "events_bytes", (json_int_t)v->events_bytes, "done_bytes",
        (json_int_t)v->done_bytes, "open_bytes", (json_int_t)v->open_bytes, "oldest_part_at",
        render_time(v->oldest_part_ms), "retention_last_run_at", render_time(v->last_run_ms),
        "parts_dropped", (json_int_t)v->parts_dropped);
    /* Its shard's line (merge_cluster gathers every shard's). */
    json_t *shard = json_pack(
        "{s:i, s:s, s:s, s:I, s:I, s:f, s:f, s:f}", "shard", v->shard, "database", v->database,
        "leader", v->leader, "term", (json_int_t)v->term, "open_total", (json_int_t)v->open_total,
        "writer_busy", (double)v->busy_permille / 1000.0, "commit_mean_ms",
        (double)v->commit_mean_us / 1000.0, "commit_p99_ms", (double)v->commit_p99_us / 1000.0);
    return json_pack("{s:s, s:I, s:o, s:o, s:I, s:o, s:[o]}", "leader", v->leader, "term",
                     (json_int_t)v->term, "workers", workers, "open", open, "open_total",
                     (json_int_t)v->open_total, "storage", storage, "shards", shard);
}

/* One job of a pull's answer. */
static json_t *job_json(const PulledJob *j)
{
    char deadline[40];
    time_format(j->deadline, deadline, sizeof deadline);
    json_t *o = json_pack("{s:s, s:i, s:s, s:i, s:O, s:I, s:s}", "id", j->id, "attempt", j->attempt,
                          "queue", j->queue, "priority", j->priority, "payload", j->payload,
                          "timeout_ms", (json_int_t)j->timeout_ms, "deadline", deadline);
    if (j->traceparent) {
        json_object_set_new(o, "traceparent", json_string(j->traceparent));
        if (j->tracestate)
            json_object_set_new(o, "tracestate", json_string(j->tracestate));
    }
    return o;
}

/* {"id", "status", "created"}: how the manager took one submitted item. */
static json_t *submitted_json(const SubmitItem *it, const SubmitResult *res)
{
    return json_pack("{s:s, s:s, s:b}", "id", it->id, "status", res->status, "created",
                     res->created);
}

/* {"id", "attempt", "accepted", "status" or "reason"}: how the manager took
 * one report. */
static json_t *report_result_json(const Report *rep, const ReportResult *res)
{
    json_t *o = json_pack("{s:s, s:i, s:b}", "id", rep->work_id, "attempt", rep->attempt,
                          "accepted", res->accepted);
    if (res->accepted)
        json_object_set_new(o, "status", json_string(res->status));
    else
        json_object_set_new(o, "reason", json_string(res->reason));
    return o;
}

/* POST /workers/{id}/reports: {"results": [...]}, one per report. */
static json_t *reports_reply(const MgrCmd *c)
{
    json_t *results = json_array();
    for (size_t i = 0; i < c->n_reports; i++)
        json_array_append_new(results, report_result_json(&c->reports[i], &c->results[i]));
    return json_pack("{s:o}", "results", results);
}

/* POST /work/{id}/attempts/{n}/complete|fail: the result, or why it was refused. */
static void single_report_reply(Req *r, const Report *rep, const ReportResult *res)
{
    char msg[300];
    if (res->accepted) {
        req_finish_json(r, 200, report_result_json(rep, res));
    } else if (res->reason && !strcmp(res->reason, "not-holder")) {
        snprintf(msg, sizeof msg,
                 "attempt %lld of work '%s' is held by another worker (or instance); "
                 "its report was not recorded",
                 (long long)rep->attempt, rep->work_id);
        problem(r, 409, "attempt-not-held", msg);
    } else if (res->reason && !strcmp(res->reason, "not-found")) {
        snprintf(msg, sizeof msg, "no work with id '%s'", rep->work_id);
        problem(r, 404, "not-found", msg);
    } else {
        snprintf(msg, sizeof msg,
                 "attempt %lld of work '%s' is not the current attempt; its report was "
                 "not recorded",
                 (long long)rep->attempt, rep->work_id);
        problem(r, 409, "attempt-superseded", msg);
    }
}

static void progress_reply(Req *r, const MgrCmd *c);

/* ---- the manager's answers, one function per kind of command (REPLIES) ----
 * Each writes a command's typed reply (status < 400) as the API's answer. */

typedef void (*CmdReply)(Req *r, const MgrCmd *c);

static void reply_submit(Req *r, const MgrCmd *c)
{
    if (!r->bulk) {
        snprintf(r->location, sizeof r->location, "/work/%s", c->items[0].id);
        req_finish_json(r, 202, submitted_json(&c->items[0], &c->submitted[0]));
        return;
    }
    json_t *items = json_array();
    for (size_t i = 0; i < c->n_items; i++)
        json_array_append_new(items, submitted_json(&c->items[i], &c->submitted[i]));
    json_t *o = json_pack("{s:o}", "items", items);
    if (c->batch_id)
        json_object_set_new(o, "batch", json_string(c->batch_id));
    req_finish_json(r, 202, o);
}

static void reply_no_content(Req *r, const MgrCmd *c)
{
    (void)c;
    req_finish_raw(r, 204, NULL, NULL, 0);
}

static void reply_pull(Req *r, const MgrCmd *c)
{
    json_t *jobs = json_array();
    for (size_t i = 0; i < c->n_jobs; i++)
        json_array_append_new(jobs, job_json(&c->jobs[i]));
    json_t *o = json_pack("{s:o}", "jobs", jobs);
    if (c->peek)
        json_object_set_new(o, "ready", json_boolean(c->ready));
    req_finish_json(r, 200, o);
}

static void reply_reports(Req *r, const MgrCmd *c)
{
    if (r->single)
        single_report_reply(r, &c->reports[0], &c->results[0]);
    else
        req_finish_json(r, 200, reports_reply(c));
}

/* MC_CANCEL, MC_RETRY: {"id", "status"}. */
static void reply_work_status(Req *r, const MgrCmd *c)
{
    req_finish_json(r, c->status,
                    json_pack("{s:s, s:s}", "id", c->work_id, "status", c->work_status));
}

static void reply_heartbeat(Req *r, const MgrCmd *c)
{
    json_t *o =
        json_pack("{s:I, s:I}", "heartbeat_interval_ms", (json_int_t)c->heartbeat_interval_ms,
                  "worker_timeout_ms", (json_int_t)c->worker_timeout_ms);
    if (c->stale && c->stale->n)
        json_object_set_new(o, "cancel", running_json(c->stale));
    req_finish_json(r, c->status, o);
}

static void reply_cluster(Req *r, const MgrCmd *c)
{
    Api *a = api_of(r);
    json_t *o = cluster_json(c->cluster);
    json_object_set_new(o, "nodes", listener_nodes(a->listener));
    json_object_set_new(o, "database", a->dbwatch.json(a->dbwatch.ctx));
    req_finish_json(r, c->status, o);
}

static void reply_queue_set(Req *r, const MgrCmd *c)
{
    json_t *o = render_queue_limits(c->queue, &c->limits);
    if (c->queue_new) /* most often a misspelt name: say so */
        json_object_set_new(o, "warning",
                            json_pack("s++", "the queue '", c->queue,
                                      "' had no open work and no flow control: these settings "
                                      "start it (check the name)"));
    req_finish_json(r, c->status, o);
}

static void reply_schedule_set(Req *r, const MgrCmd *c)
{
    req_finish_json(r, c->status,
                    render_schedule_spec(c->name, c->schedule, c->last_tick, c->decided_at));
}

/* MC_SUBSCRIPTION_*: the one subscription (as it was, for a deletion), or all. */
static void reply_subscriptions(Req *r, const MgrCmd *c)
{
    if (c->type == MC_SUBSCRIPTION_GET && !c->name)
        req_finish_json(r, c->status, render_subscriptions(c->subs));
    else
        req_finish_json(r, c->status,
                        render_subscription(&c->subs->items[0], c->type == MC_SUBSCRIPTION_DELETE));
}

static void reply_bulk(Req *r, const MgrCmd *c)
{
    req_finish_json(r, c->status,
                    json_pack("{s:I, s:b}", c->type == MC_BULK_CANCEL ? "cancelled" : "retried",
                              (json_int_t)c->n_done, "more", c->more));
}

/* The commands no HTTP request sends: MC_QUEUE_FLOW (/metrics asks it
 * itself), MC_SUB_CURSOR and MC_SUB_PAUSE (the webhooks thread's). */
static void reply_never(Req *r, const MgrCmd *c)
{
    (void)c;
    problem(r, 500, "internal", "this command is not answered over HTTP");
}

static const CmdReply REPLIES[] = {
    [MC_SUBMIT] = reply_submit,
    [MC_CANCEL] = reply_work_status,
    [MC_RETRY] = reply_work_status,
    [MC_REPORTS] = reply_reports,
    [MC_PULL] = reply_pull,
    [MC_HEARTBEAT] = reply_heartbeat,
    [MC_DEREGISTER] = reply_no_content,
    [MC_CLUSTER] = reply_cluster,
    [MC_QUEUE_SET] = reply_queue_set,
    [MC_BULK_CANCEL] = reply_bulk,
    [MC_BULK_RETRY] = reply_bulk,
    [MC_SCHEDULE_SET] = reply_schedule_set,
    [MC_SCHEDULE_DELETE] = reply_no_content,
    [MC_PROGRESS] = progress_reply,
    [MC_SUBSCRIPTION_SET] = reply_subscriptions,
    [MC_SUBSCRIPTION_DELETE] = reply_subscriptions,
    [MC_SUBSCRIPTION_GET] = reply_subscriptions,
    [MC_SUB_CURSOR] = reply_never,
    [MC_SUB_PAUSE] = reply_never,
    [MC_QUEUE_FLOW] = reply_never,
};
_Static_assert(sizeof REPLIES / sizeof REPLIES[0] == MC_COUNT, "every MgrCmdType has its reply");

/* Leadership moved while the command waited: it is forwarded like any
 * request that reaches a node that does not lead (delayed, not failed). */
static void forward_again(Req *r, const MgrCmd *c)
{
    char *fwd = NULL;
    if (c->type == MC_SUBMIT) {
        json_t *norm = submit_json(c->items, c->n_items, r->bulk, c->batch_id, c->batch_callback);
        fwd = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
    }
    req_park(r);
    proxy_forward(api_of(r)->proxy, r->shard, r, fwd);
}

/* Runs on the HTTP thread once the manager has answered. */
static void cmd_reply(Req *r)
{
    const MgrCmd *c = r->state;
    /* Leadership moved, or another shard is creating the same id (its
     * commit will tell this one what the id is): asked again, through the
     * proxy's retries. */
    if (c->status == 503 &&
        (!strcmp(c->err.type, "not-leader") || !strcmp(c->err.type, "id-busy")) && !r->forwarded)
        forward_again(r, c);
    else if (c->status >= 400)
        req_finish_problem(r, &c->err);
    else
        REPLIES[c->type](r, c);
}

/* Manager thread: hand the reply back to the HTTP thread. */
static void cmd_done(MgrCmd *c, void *ud)
{
    Req *r = ud;
    r->on_resume = cmd_reply;
    req_resume(r);
}

static bool cmd_alive(void *ud)
{
    return req_alive(ud);
}

static void cmd_free(void *c)
{
    mgrcmd_free(c);
}

/* r keeps c until it ends (the manager's reply is read from it). */
static void keep_cmd(Req *r, MgrCmd *c)
{
    r->state = c;
    r->free_state = cmd_free;
}

/* Sends c to shard `shard`'s leader: the local manager if this node leads
 * it, else through the proxy with forward_body (or the request's own body
 * when NULL). A request another node forwarded goes to the shard it names. */
static void to_shard(Req *r, int shard, MgrCmd *c, char *forward_body)
{
    Api *a = api_of(r);
    if (r->shard >= 0)
        shard = r->shard;
    r->shard = shard;
    if (shard >= a->shards) { /* a forward from a node that counts more shards */
        mgrcmd_free(c);
        free(forward_body);
        problem(r, 503, "not-leader", "this node's cluster has fewer shards than the sender's");
        return;
    }
    if (shards_leads(a->mgrs, shard)) {
        free(forward_body);
        c->done = cmd_done;
        c->alive = cmd_alive;
        c->ud = r;
        keep_cmd(r, c);
        req_park(r);
        manager_send(shards_manager(a->mgrs, shard), c);
        return;
    }
    mgrcmd_free(c);
    if (r->forwarded) {
        free(forward_body);
        problem(r, 503, "not-leader",
                "this node is not the leader (forwarded requests are not forwarded again)");
        return;
    }
    req_park(r);
    proxy_forward(a->proxy, shard, r, forward_body);
}

/* The shard of queue q. */
static int queue_shard(const Api *a, const char *q)
{
    return shard_of_queue(q, a->shards);
}

/* to_shard for a command that writes a queue's state (its work, limits, a
 * schedule): the queue's shard decides, and a forward that names another
 * (a node that counts shards otherwise, or a hand-made header) is refused
 * rather than let a queue live in two shards. */
static void to_queue_shard(Req *r, int shard, MgrCmd *c, char *forward_body)
{
    if (r->shard >= 0 && r->shard != shard) {
        mgrcmd_free(c);
        free(forward_body);
        problem(r, 409, "shard-mismatch",
                "X-Workd-Shard names another shard than the queue's: do the nodes of this "
                "cluster agree on the shard count?");
        return;
    }
    to_shard(r, shard, c, forward_body);
}

/* Sends c to every shard and merges the answers, in a cluster of several
 * shards; else, or when forwarded to one shard, as to_shard. */
static void to_all_shards(Req *r, MgrCmd *c, FanMerge merge)
{
    Api *a = api_of(r);
    if (a->shards == 1 || r->shard >= 0) {
        to_shard(r, 0, c, NULL);
        return;
    }
    mgrcmd_free(c);
    int all[SHARDS_MAX];
    for (int s = 0; s < a->shards; s++)
        all[s] = s;
    req_park(r);
    fanout(a->proxy, r, all, NULL, (size_t)a->shards, merge, NULL);
}

/* ---- merging the shards' answers (fanout.h) ---- */

/* Whether attempt {id, attempt} is in list (a JSON array of them). */
static bool attempt_listed(const json_t *list, const json_t *att)
{
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x)
    {
        if (json_equal(json_object_get(x, "id"), json_object_get(att, "id")) &&
            json_equal(json_object_get(x, "attempt"), json_object_get(att, "attempt")))
            return true;
    }
    return false;
}

/* A heartbeat: any shard's refusal; else shard 0's answer, whose "cancel"
 * is what every shard calls stale. An attempt lives in one shard, and the
 * others call it stale only because they do not know it: it is really stale
 * only if its own shard says so too. */
static void merge_heartbeat(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
        return;
    }
    json_t *out = json_deep_copy(rs[0].body);
    json_t *cancel = json_array();
    json_t *first = json_object_get(rs[0].body, "cancel");
    size_t i;
    json_t *att;
    json_array_foreach(first, i, att)
    {
        bool everywhere = true;
        for (size_t k = 1; k < n && everywhere; k++)
            everywhere = attempt_listed(json_object_get(rs[k].body, "cancel"), att);
        if (everywhere)
            json_array_append(cancel, att);
    }
    json_object_del(out, "cancel");
    if (json_array_size(cancel))
        json_object_set(out, "cancel", cancel);
    json_decref(cancel);
    req_finish_json(r, 200, out);
}

/* Every shard's 204, or the first refusal. */
static void merge_no_content(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad)
        req_finish_problem(r, &bad->err);
    else
        req_finish_raw(r, 204, NULL, NULL, 0);
}

/* Adds storage b (a shard's: its database's, when its manager runs that
 * database's retention, else nothing measured) into a: sizes and parts
 * summed, the oldest part and the stalest retention pass kept. */
static void merge_storage(json_t *a, const json_t *b)
{
    if (json_is_null(json_object_get(b, "retention_last_run_at")))
        return;
    if (json_is_null(json_object_get(a, "retention_last_run_at"))) {
        json_object_update(a, (json_t *)b);
        return;
    }
    static const char *const sums[] = {"parts", "events_bytes", "done_bytes", "open_bytes",
                                       "parts_dropped"};
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++)
        json_object_set_new(a, sums[i],
                            json_integer(json_integer_value(json_object_get(a, sums[i])) +
                                         json_integer_value(json_object_get(b, sums[i]))));
    /* RFC 3339 UTC times of one format compare as strings. */
    static const char *const oldest[] = {"oldest_part_at", "retention_last_run_at"};
    for (size_t i = 0; i < sizeof oldest / sizeof *oldest; i++) {
        const char *x = json_string_value(json_object_get(a, oldest[i]));
        const char *y = json_string_value(json_object_get(b, oldest[i]));
        if (y && (!x || strcmp(y, x) < 0))
            json_object_set(a, oldest[i], json_object_get(b, oldest[i]));
    }
}

/* /cluster: shard 0's leader and term (and the node's nodes and database),
 * the workers every shard knows, the open work of every shard, the storage
 * of every database, and a line per shard. */
static void merge_cluster(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
        return;
    }
    json_t *out = json_deep_copy(rs[0].body);
    json_t *workers = json_object(), *open = json_object(), *shards = json_array();
    json_int_t total = 0;
    for (size_t k = 0; k < n; k++) {
        const json_t *b = rs[k].body;
        size_t i;
        json_t *w;
        json_array_foreach(json_object_get(b, "workers"), i, w)
        {
            const char *id = json_string_value(json_object_get(w, "id"));
            json_t *have = id ? json_object_get(workers, id) : NULL;
            if (!have) {
                if (id)
                    json_object_set_new(workers, id, json_deep_copy(w));
                continue;
            }
            /* Known to several shards: its attempts are each one's. */
            json_t *running = json_object_get(have, "running");
            if (json_is_array(running) && json_is_array(json_object_get(w, "running")))
                json_array_extend(running, json_object_get(w, "running"));
            if (json_integer_value(json_object_get(w, "silent_ms")) <
                json_integer_value(json_object_get(have, "silent_ms"))) {
                json_object_set(have, "silent_ms", json_object_get(w, "silent_ms"));
                json_object_set(have, "last_heartbeat", json_object_get(w, "last_heartbeat"));
            }
        }
        json_object_update(open, json_object_get(b, "open"));
        if (k > 0)
            merge_storage(json_object_get(out, "storage"), json_object_get(b, "storage"));
        total += json_integer_value(json_object_get(b, "open_total"));
        json_array_extend(shards, json_object_get(b, "shards"));
    }
    json_t *list = json_array();
    const char *id;
    json_t *w;
    json_object_foreach(workers, id, w)
    {
        json_array_append(list, w);
    }
    json_decref(workers);
    json_object_set_new(out, "workers", list);
    json_object_set_new(out, "open", open);
    json_object_set_new(out, "open_total", json_integer(total));
    json_object_set_new(out, "shards", shards);
    req_finish_json(r, 200, out);
}

/* A bulk action: the counts summed, more if any shard has more. */
static void merge_bulk(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
        return;
    }
    const char *key = json_object_get(rs[0].body, "cancelled") ? "cancelled" : "retried";
    json_int_t done = 0;
    bool more = false;
    for (size_t k = 0; k < n; k++) {
        done += json_integer_value(json_object_get(rs[k].body, key));
        more = more || json_is_true(json_object_get(rs[k].body, "more"));
    }
    req_finish_json(r, 200, json_pack("{s:I, s:b}", key, done, "more", more));
}

/* ---- routing by work id: which shard holds it is in the database ---- */

/* What decides a command's shard by a row of the database: work (its id),
 * or a schedule (its name; a PUT's new queue must be in the same shard). */
typedef struct ShardLookup {
    Req *r;
    char *id;
    bool schedule;
    int want; /* a schedule PUT: its queue's shard; else -1 */
} ShardLookup;

/* HTTP thread: the shard is known (r->shard); the command goes there. */
static void send_looked_up(Req *r)
{
    MgrCmd *c = r->state;
    r->state = NULL;
    r->free_state = NULL;
    int shard = r->shard;
    r->shard = -1;
    to_shard(r, shard < 0 ? 0 : shard, c, NULL);
}

/* Read pool: finds the shard (none found: shard 0 says what there is to say). */
static void shard_lookup_task(ViewDbs *db, void *arg)
{
    ShardLookup *t = arg;
    Err err = {0};
    int shard = -1;
    int rc = t->schedule ? view_schedule_shard(db, t->id, &shard, &err)
                         : view_work_shard(db, t->id, &shard, &err);
    if (rc == 0 && t->want >= 0 && shard >= 0 && shard != t->want)
        rc = err_set(&err, 409, "schedule-moves-shard",
                     "schedule '%s' is in shard %d, and its new queue in shard %d: delete it "
                     "and create it again to move it",
                     t->id, shard, t->want);
    if (rc != 0) {
        req_finish_problem(t->r, &err);
    } else {
        if (shard < 0)
            shard = t->want;
        t->r->shard = shard;
        t->r->on_resume = send_looked_up;
        req_resume(t->r);
    }
    free(t->id);
    free(t);
}

/* Sends c to the shard the database says: that of work `id`, or of
 * schedule `id` (a PUT's queue's shard `want`, which must be the same). At
 * once in a cluster of one shard, or for a request another node forwarded
 * to its shard. */
static void to_looked_up_shard(Req *r, const char *id, bool schedule, int want, MgrCmd *c)
{
    Api *a = api_of(r);
    if (a->shards == 1 || r->shard >= 0) {
        to_shard(r, 0, c, NULL);
        return;
    }
    keep_cmd(r, c);
    ShardLookup *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->id = xstrdup(id);
    t->schedule = schedule;
    t->want = want;
    req_park(r);
    dbpool_submit(a->pool, shard_lookup_task, t);
}

static void to_work_shard(Req *r, const char *id, MgrCmd *c)
{
    to_looked_up_shard(r, id, false, -1, c);
}

/* ---- a worker's batch (reports, progress) over several shards ---- */

/* The batch's items: their ids, and what the database said of their shards. */
typedef struct BatchRoute {
    Req *r;
    const char *key; /* the body's array: "reports" or "progress" */
    char **ids;      /* borrowed from the command (kept in r->state) */
    size_t n;
    int *shards;
} BatchRoute;

/* The batch's answers, put back in the order of the request's items. */
static void merge_batch(Req *r, FanReply *rs, size_t n, void *ud)
{
    BatchRoute *b = ud;
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
    } else {
        json_t *results = json_array();
        size_t next[SHARDS_MAX] = {0};
        for (size_t i = 0; i < b->n; i++) {
            size_t k = 0;
            while (k + 1 < n && rs[k].shard != b->shards[i])
                k++;
            json_t *x = json_array_get(json_object_get(rs[k].body, "results"), next[k]++);
            json_array_append(results, x ? x : json_null());
        }
        req_finish_json(r, 200, json_pack("{s:o}", "results", results));
    }
    free(b->shards);
    free(b);
}

/* HTTP thread: the shards are known; one: the command goes there; several:
 * each gets its items, and the answers are merged. */
static void send_batch(Req *r)
{
    Api *a = api_of(r);
    MgrCmd *c = r->state;
    BatchRoute *b = c->ud;
    c->ud = NULL;
    r->state = NULL;
    r->free_state = NULL;
    int first = -1;
    bool several = false;
    for (size_t i = 0; i < b->n; i++) {
        if (b->shards[i] < 0) /* unknown: any shard says so */
            b->shards[i] = first >= 0 ? first : 0;
        if (first < 0)
            first = b->shards[i];
        several = several || b->shards[i] != first;
    }
    if (!several) {
        to_shard(r, first, c, NULL);
        free(b->shards);
        free(b);
        return;
    }
    json_t *body = json_loadb(r->body.data, r->body.len, 0, NULL);
    json_t *items = json_object_get(body, b->key);
    int shards[SHARDS_MAX];
    char *bodies[SHARDS_MAX];
    size_t parts = 0;
    for (int s = 0; s < a->shards; s++) {
        json_t *mine = json_array();
        for (size_t i = 0; i < b->n; i++)
            if (b->shards[i] == s)
                json_array_append(mine, json_array_get(items, i));
        if (json_array_size(mine)) {
            json_t *part = json_deep_copy(body);
            json_object_set(part, b->key, mine);
            shards[parts] = s;
            bodies[parts++] = json_dumps(part, JSON_COMPACT);
            json_decref(part);
        }
        json_decref(mine);
    }
    json_decref(body);
    mgrcmd_free(c);
    req_park(r);
    fanout(a->proxy, r, shards, bodies, parts, merge_batch, b);
}

static void batch_lookup_task(ViewDbs *db, void *arg)
{
    BatchRoute *b = arg;
    Err err = {0};
    if (view_work_shards(db, b->ids, b->n, b->shards, &err) != 0) {
        ((MgrCmd *)b->r->state)->ud = NULL;
        free(b->ids);
        free(b->shards);
        Req *r = b->r;
        free(b);
        req_finish_problem(r, &err);
        return;
    }
    free(b->ids);
    b->ids = NULL;
    b->r->on_resume = send_batch;
    req_resume(b->r);
}

/* Sends a worker's batch (key: its body's array) to the shards of its
 * items' work. ids[0..n) are the items' work ids, borrowed from c. */
static void to_batch_shards(Req *r, MgrCmd *c, const char *key, char **ids, size_t n)
{
    Api *a = api_of(r);
    if (a->shards == 1 || r->shard >= 0 || n == 1 || r->single) {
        const char *first = ids[0]; /* from c: valid after ids goes */
        free(ids);
        to_work_shard(r, first, c);
        return;
    }
    BatchRoute *b = xcalloc(1, sizeof *b);
    b->r = r;
    b->key = key;
    b->ids = ids;
    b->n = n;
    b->shards = xcalloc(n, sizeof *b->shards);
    keep_cmd(r, c);
    c->ud = b;
    req_park(r);
    dbpool_submit(a->pool, batch_lookup_task, b);
}

/* Fills c from the request: p, the path's parameters; body, the parsed JSON
 * body (NULL for a route without one). Sets c->worker_id. */
typedef int (*CmdParse)(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err);

/* A pull goes to the shard of its queues; over several (or all, naming
 * none), this node pulls from each for the worker (pull.h). */
static void pull_route(Req *r, MgrCmd *c)
{
    Api *a = api_of(r);
    PullSpec spec = {.instance = c->instance, .max = c->max, .wait_ms = c->wait_ms};
    char **by_shard[SHARDS_MAX] = {0};
    size_t counts[SHARDS_MAX] = {0};
    for (size_t i = 0; c->queues && c->queues[i]; i++)
        counts[queue_shard(a, c->queues[i])]++;
    for (int s = 0; s < a->shards; s++) {
        if (c->queues && !counts[s])
            continue;
        spec.shards[spec.n] = s;
        if (c->queues) {
            by_shard[s] = xcalloc(counts[s] + 1, sizeof *by_shard[s]);
            counts[s] = 0;
        }
        spec.queues[spec.n++] = by_shard[s];
    }
    for (size_t i = 0; c->queues && c->queues[i]; i++) {
        int s = queue_shard(a, c->queues[i]);
        by_shard[s][counts[s]++] = c->queues[i];
    }
    if (spec.n == 1 || r->shard >= 0) {
        to_shard(r, spec.shards[0], c, NULL);
    } else {
        req_park(r);
        pull_over_shards(a->proxy, r, &spec);
        mgrcmd_free(c);
    }
    for (int s = 0; s < a->shards; s++)
        free(by_shard[s]);
}

/* Where a worker's command goes: a report or progress to the shard of its
 * work, a pull to the shard of its queues; heartbeats and deregistration to
 * every shard. */
static void worker_route(Req *r, MgrCmd *c)
{
    switch (c->type) {
    case MC_REPORTS: {
        char **ids = xcalloc(c->n_reports + 1, sizeof *ids);
        for (size_t i = 0; i < c->n_reports; i++)
            ids[i] = (char *)c->reports[i].work_id;
        to_batch_shards(r, c, "reports", ids, c->n_reports);
        return;
    }
    case MC_PROGRESS: {
        char **ids = xcalloc(c->n_updates + 1, sizeof *ids);
        for (size_t i = 0; i < c->n_updates; i++)
            ids[i] = c->updates[i].work_id;
        to_batch_shards(r, c, "progress", ids, c->n_updates);
        return;
    }
    case MC_PULL:
        pull_route(r, c);
        return;
    case MC_HEARTBEAT:
        to_all_shards(r, c, merge_heartbeat);
        return;
    case MC_DEREGISTER:
        to_all_shards(r, c, merge_no_content);
        return;
    default:
        to_shard(r, 0, c, NULL);
        return;
    }
}

/* The worker routes: p[0] must be a valid id (what it names), the request
 * parses into a command, and the token must be allowed to act for the command's
 * worker id; then the command goes to the leader. */
static void worker_cmd(Req *r, char *const *p, const char *what, MgrCmdType type, CmdParse parse)
{
    if (!check_id(r, p[0], what))
        return;
    Err err = {0};
    json_t *body = NULL;
    if (r->rt->json_body && !(body = body_json(r, &err))) {
        req_finish_problem(r, &err);
        return;
    }
    MgrCmd *c = mgrcmd_new(type);
    int rc = parse(r, p, body, c, &err);
    json_decref(body);
    if (rc != 0) {
        mgrcmd_free(c);
        req_finish_problem(r, &err);
        return;
    }
    if (!worker_allowed(r, c->worker_id, c)) {
        mgrcmd_free(c);
        return;
    }
    worker_route(r, c);
}

/* ---- work ---- */

/* The request's W3C trace context headers: the traceparent when there is
 * exactly one, the tracestate fields joined with commas (RFC 9110 5.3). */
typedef struct TraceHeaders {
    int parents;
    const char *parent; /* borrowed from the request */
    SBuf state;
} TraceHeaders;

static enum MHD_Result trace_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    (void)kind;
    TraceHeaders *t = cls;
    if (!strcasecmp(key, "traceparent")) {
        t->parents++;
        t->parent = value;
    } else if (!strcasecmp(key, "tracestate") && t->state.len <= TRACESTATE_MAX_BYTES) {
        sbuf_printf(&t->state, "%s%s", t->state.len ? "," : "", value); /* past it: invalid */
    }
    return MHD_YES;
}

/* Gives the request's trace context to every item that has none of its own
 * (an item's fields win over the headers). A header that does not parse is
 * ignored, as the W3C spec tells a receiver; so are several traceparents. */
static void apply_trace_headers(Req *r, SubmitItem *items, size_t n)
{
    TraceHeaders t = {0};
    sbuf_init(&t.state);
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, trace_header, &t);
    char *parent = t.parents == 1 ? xstrdup(t.parent) : NULL;
    char *state = t.state.len ? xstrdup(t.state.data) : NULL;
    sbuf_free(&t.state);
    trace_keep(&parent, &state);
    for (size_t i = 0; parent && i < n; i++)
        if (!items[i].traceparent) {
            items[i].traceparent = xstrdup(parent);
            items[i].tracestate = xstrdup(state);
        }
    free(parent);
    free(state);
}

/* The shard a submission goes to: its items' queues' and its batch
 * callback's, which must be one (a submission is one commit of one shard's
 * log). 409 cross-shard otherwise. */
WARN_UNUSED static int submit_shard(Req *r, const MgrCmd *c, int *shard)
{
    Api *a = api_of(r);
    *shard = queue_shard(a, c->items[0].queue);
    const char *other = NULL;
    for (size_t i = 1; i < c->n_items && !other; i++)
        if (queue_shard(a, c->items[i].queue) != *shard)
            other = c->items[i].queue;
    if (!other && c->batch_callback && queue_shard(a, c->batch_callback->queue) != *shard)
        other = c->batch_callback->queue;
    if (!other)
        return 0;
    char msg[400];
    snprintf(msg, sizeof msg,
             "queues '%s' (shard %d) and '%s' (shard %d) are in different shards of this "
             "cluster: a submission of several items, or a batch and its callback, must stay "
             "in one shard (send them separately)",
             c->items[0].queue, *shard, other, queue_shard(a, other));
    problem(r, 409, "cross-shard", msg);
    return -1;
}

static void h_submit(Req *r, char *const *p)
{
    Api *a = api_of(r);
    Err err = {0};
    json_t *body = body_json(r, &err);
    if (!body) {
        req_finish_problem(r, &err);
        return;
    }
    ParseLimits lim = {.max_batch = (size_t)a->cfg.max_batch,
                       .max_depth = (size_t)a->cfg.max_json_depth,
                       .max_payload_bytes = a->cfg.max_body,
                       .default_timeout_ms = a->cfg.default_timeout_ms,
                       .default_max_attempts = (int)a->cfg.default_max_attempts};
    MgrCmd *c = mgrcmd_new(MC_SUBMIT);
    bool bulk;
    SubmitBatch batch;
    if (parse_submit_batch(body, req_header(r, "Idempotency-Key"), wall_ms(), &lim, &c->items,
                           &c->n_items, &bulk, &batch, &err) != 0) {
        json_decref(body);
        mgrcmd_free(c);
        req_finish_problem(r, &err);
        return;
    }
    json_decref(body);
    apply_trace_headers(r, c->items, c->n_items);
    c->batch_id = batch.id;
    c->batch_callback = batch.callback;
    r->bulk = bulk;
    int shard;
    if (submit_shard(r, c, &shard) != 0) {
        mgrcmd_free(c);
        return;
    }
    char *fwd = NULL;
    if (!shards_leads(a->mgrs, shard)) {
        /* Forward the normalised items: ids generated here stay the same on
         * every retry, so a retried forward never creates a second job (nor
         * a second batch: its id is generated here too). */
        json_t *norm = submit_json(c->items, c->n_items, bulk, c->batch_id, c->batch_callback);
        fwd = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
    }
    to_queue_shard(r, shard, c, fwd);
}

/* Events of one work item in one answer, at most (GET /work/{id}/events). */
#define EVENTS_PAGE 1000

typedef struct GetTask {
    Req *r;
    char *id;
    int64_t wait_ms;
    int64_t after; /* events: the page after this seq, */
    int limit;     /* this many at most */
    bool events, waited;
} GetTask;

static void get_task(ViewDbs *db, void *arg);

static void get_refire(void *arg)
{
    GetTask *t = arg;
    t->waited = true;
    dbpool_submit(api_of(t->r)->pool, get_task, t);
}

static bool is_final(const char *status)
{
    return status && (!strcmp(status, "completed") || !strcmp(status, "dead") ||
                      !strcmp(status, "cancelled"));
}

static void get_task(ViewDbs *db, void *arg)
{
    GetTask *t = arg;
    Req *r = t->r;
    Err err = {0};
    if (t->events) {
        WorkEvents *e = view_work_events(db, t->id, t->after, t->limit, &err);
        if (e)
            req_finish_json(r, 200, render_work_events(e));
        else
            req_finish_problem(r, &err);
        view_work_events_free(e);
        goto cleanup;
    }
    WorkView *w = view_work_get(db, t->id, wall_ms(), &err);
    if (!w) {
        req_finish_problem(r, &err);
        goto cleanup;
    }
    if (t->wait_ms > 0 && !t->waited && !is_final(w->status)) {
        int64_t after = w->updated_seq;
        int shard = w->shard;
        view_work_free(w);
        hub_wait(api_of(r)->hub, shard, t->id, after, mono_ms() + t->wait_ms, get_refire, t);
        listener_wake(api_of(r)->listener); /* to answer at the deadline, not after it */
        return;
    }
    req_finish_json(r, 200, render_work(w));
    view_work_free(w);
cleanup:
    free(t->id);
    free(t);
}

static void start_get(Req *r, const char *id, bool events)
{
    if (!check_id(r, id, "work id"))
        return;
    GetTask *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->id = xstrdup(id);
    t->events = events;
    const char *wait = events ? NULL : req_query(r, "wait");
    const char *after = events ? req_query(r, "after") : NULL;
    const char *limit = events ? req_query(r, "limit") : NULL;
    int64_t l = EVENTS_PAGE;
    Err err = {0};
    if ((wait && parse_wait(wait, api_of(r)->cfg.get_wait_max_ms, &t->wait_ms, &err) != 0) ||
        (after && parse_seq(after, &t->after, &err) != 0) ||
        (limit && parse_seq(limit, &l, &err) != 0) ||
        ((l < 1 || l > EVENTS_PAGE) &&
         err_set(&err, 400, "invalid-parameter", "'limit' must be from 1 to %d", EVENTS_PAGE))) {
        free(t->id);
        free(t);
        req_finish_problem(r, &err);
        return;
    }
    t->limit = (int)l;
    req_park(r);
    dbpool_submit(api_of(r)->pool, get_task, t);
}

static void h_work_get(Req *r, char *const *p)
{
    start_get(r, p[0], false);
}

static void h_work_events(Req *r, char *const *p)
{
    start_get(r, p[0], true);
}

static void h_cancel(Req *r, char *const *p)
{
    if (!check_id(r, p[0], "work id"))
        return;
    MgrCmd *c = mgrcmd_new(MC_CANCEL);
    c->work_id = xstrdup(p[0]);
    to_work_shard(r, p[0], c);
}

static void h_retry(Req *r, char *const *p)
{
    if (!check_id(r, p[0], "work id"))
        return;
    MgrCmd *c = mgrcmd_new(MC_RETRY);
    c->work_id = xstrdup(p[0]);
    to_work_shard(r, p[0], c);
}

/* ---- queues: flow control (admin) ---- */

/* A name in the path (a queue, a schedule, a subscription): what says which. */
static bool check_name(Req *r, const char *name, const char *what)
{
    if (queue_name_valid(name))
        return true;
    char msg[128];
    snprintf(msg, sizeof msg,
             "the %s in the path must be 1-64 characters of A-Z a-z 0-9 _ . - (not . or ..)", what);
    problem(r, 400, "invalid-path", msg);
    return false;
}

static bool check_queue(Req *r, const char *q)
{
    return check_name(r, q, "queue");
}

static void queue_set(Req *r, const char *queue, const QueueLimits *l, int set)
{
    MgrCmd *c = mgrcmd_new(MC_QUEUE_SET);
    c->queue = xstrdup(queue);
    c->limits = *l;
    c->limits_set = set;
    to_queue_shard(r, queue_shard(api_of(r), queue), c, NULL);
}

static void h_queue_put(Req *r, char *const *p)
{
    if (!check_queue(r, p[0]))
        return;
    Err err = {0};
    json_t *body = body_json(r, &err);
    QueueLimits l;
    int set = 0;
    if (!body || parse_queue_limits(body, &l, &set, &err) != 0) {
        json_decref(body);
        req_finish_problem(r, &err);
        return;
    }
    json_decref(body);
    queue_set(r, p[0], &l, set);
}

static void h_queue_pause(Req *r, char *const *p)
{
    if (!check_queue(r, p[0]))
        return;
    QueueLimits l = {.paused = true};
    queue_set(r, p[0], &l, QL_PAUSED);
}

static void h_queue_resume(Req *r, char *const *p)
{
    if (!check_queue(r, p[0]))
        return;
    QueueLimits l = {.paused = false};
    queue_set(r, p[0], &l, QL_PAUSED);
}

/* ---- schedules (changes: admin) and batches ---- */

static bool check_schedule(Req *r, const char *name)
{
    return check_name(r, name, "schedule name");
}

static void h_schedule_put(Req *r, char *const *p)
{
    if (!check_schedule(r, p[0]))
        return;
    Api *a = api_of(r);
    Err err = {0};
    json_t *body = body_json(r, &err);
    ParseLimits lim = {.max_batch = (size_t)a->cfg.max_batch,
                       .max_depth = (size_t)a->cfg.max_json_depth,
                       .max_payload_bytes = a->cfg.max_body,
                       .default_timeout_ms = a->cfg.default_timeout_ms,
                       .default_max_attempts = (int)a->cfg.default_max_attempts};
    ScheduleSpec *spec = body ? parse_schedule(body, &lim, &err) : NULL;
    json_decref(body);
    if (!spec) {
        req_finish_problem(r, &err);
        return;
    }
    MgrCmd *c = mgrcmd_new(MC_SCHEDULE_SET);
    c->name = xstrdup(p[0]);
    c->schedule = spec;
    to_looked_up_shard(r, p[0], true, queue_shard(a, spec->work.queue), c);
}

static void schedule_cmd(Req *r, const char *name, MgrCmdType type, int pause)
{
    if (!check_schedule(r, name))
        return;
    MgrCmd *c = mgrcmd_new(type);
    c->name = xstrdup(name);
    c->pause = pause;
    to_looked_up_shard(r, name, true, -1, c);
}

static void h_schedule_delete(Req *r, char *const *p)
{
    schedule_cmd(r, p[0], MC_SCHEDULE_DELETE, -1);
}

static void h_schedule_pause(Req *r, char *const *p)
{
    schedule_cmd(r, p[0], MC_SCHEDULE_SET, 1);
}

static void h_schedule_resume(Req *r, char *const *p)
{
    schedule_cmd(r, p[0], MC_SCHEDULE_SET, 0);
}

/* A read of the schedules or a batch, on a read-pool thread. */
typedef struct FlowRead {
    Req *r;
    char *key; /* the schedule or batch; NULL: every schedule */
    bool batch;
} FlowRead;

/* The answer of a flow read (a new reference), or NULL with err. */
static json_t *flow_read_json(ViewDbs *db, const FlowRead *t, Err *err)
{
    int64_t now = wall_ms();
    if (t->batch) {
        BatchView *b = view_batch_get(db, t->key, now, err);
        json_t *o = b ? render_batch(b) : NULL;
        view_batch_free(b);
        return o;
    }
    ScheduleList *l = view_schedules(db, t->key, err);
    json_t *o = !l ? NULL : t->key ? render_schedule(&l->items[0], now) : render_schedules(l, now);
    view_schedules_free(l);
    return o;
}

static void flow_read_task(ViewDbs *db, void *arg)
{
    FlowRead *t = arg;
    Err err = {0};
    json_t *o = flow_read_json(db, t, &err);
    if (!o) {
        req_finish_problem(t->r, &err);
    } else {
        req_finish_json(t->r, 200, o);
    }
    free(t->key);
    free(t);
}

static void flow_read(Req *r, const char *key, bool batch)
{
    FlowRead *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->key = xstrdup(key);
    t->batch = batch;
    req_park(r);
    dbpool_submit(api_of(r)->pool, flow_read_task, t);
}

static void h_schedules(Req *r, char *const *p)
{
    (void)p;
    flow_read(r, NULL, false);
}

static void h_schedule_get(Req *r, char *const *p)
{
    if (check_schedule(r, p[0]))
        flow_read(r, p[0], false);
}

static void h_batch_get(Req *r, char *const *p)
{
    if (!batch_id_valid(p[0])) {
        problem(r, 400, "invalid-path",
                "the batch id in the path must be 1-100 characters of A-Z a-z 0-9 . _ : @ -");
        return;
    }
    flow_read(r, p[0], true);
}

/* ---- bulk actions (admin) ---- */

static void bulk(Req *r, MgrCmdType type)
{
    Err err = {0};
    json_t *body = body_json(r, &err);
    MgrCmd *c = mgrcmd_new(type);
    if (!body || parse_bulk_filter(body, type == MC_BULK_CANCEL, &c->queue, &c->key, &c->state,
                                   &c->max, &err) != 0) {
        json_decref(body);
        mgrcmd_free(c);
        req_finish_problem(r, &err);
        return;
    }
    json_decref(body);
    if (c->queue)
        to_shard(r, queue_shard(api_of(r), c->queue), c, NULL);
    else
        to_all_shards(r, c, merge_bulk);
}

static void h_bulk_cancel(Req *r, char *const *p)
{
    (void)p;
    bulk(r, MC_BULK_CANCEL);
}

static void h_bulk_retry(Req *r, char *const *p)
{
    (void)p;
    bulk(r, MC_BULK_RETRY);
}

WARN_UNUSED static int parse_complete(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    r->single = true;
    return parse_single_report(body, p[0], p[1], true, &c->reports, &c->n_reports, &c->worker_id,
                               &c->instance, err);
}

WARN_UNUSED static int parse_fail(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    r->single = true;
    return parse_single_report(body, p[0], p[1], false, &c->reports, &c->n_reports, &c->worker_id,
                               &c->instance, err);
}

static void h_complete(Req *r, char *const *p)
{
    worker_cmd(r, p, "work id", MC_REPORTS, parse_complete);
}

static void h_fail(Req *r, char *const *p)
{
    worker_cmd(r, p, "work id", MC_REPORTS, parse_fail);
}

/* A cursor of this cluster's shards (cursor.h): in a cluster of one shard
 * the seq it has always been, refused as any seq is (invalid-parameter). */
WARN_UNUSED static int parse_cursor(Req *r, const char *text, Cursor *out, Err *err)
{
    int n = api_of(r)->shards;
    if (n > 1)
        return cursor_parse(text, n, out, err);
    cursor_zero(out, 1);
    return parse_seq(text, &out->seq[0], err);
}

typedef struct ListTask {
    Req *r;
    char *status, *queue;
    Cursor before;
    int limit;
} ListTask;

static void list_task(ViewDbs *db, void *arg)
{
    ListTask *t = arg;
    Err err = {0};
    WorkList *l = view_work_list(db, t->status, t->queue, &t->before, t->limit, &err);
    if (!l) {
        req_finish_problem(t->r, &err);
    } else {
        req_finish_json(t->r, 200, render_work_list(l));
    }
    view_work_list_free(l);
    free(t->status);
    free(t->queue);
    free(t);
}

static void h_work_list(Req *r, char *const *p)
{
    static const char *statuses[] = {"waiting",   "pending", "scheduled", "running",
                                     "completed", "dead",    "cancelled", NULL};
    const char *status = req_query(r, "status"), *queue = req_query(r, "queue");
    const char *before = req_query(r, "before"), *limit = req_query(r, "limit");
    Err err = {0};
    bool ok = !status;
    for (size_t i = 0; statuses[i] && !ok; i++)
        ok = !strcmp(status, statuses[i]);
    if (!ok) {
        problem(r, 400, "invalid-parameter",
                "'status' must be one of waiting, pending, scheduled, running, completed, dead, "
                "cancelled");
        return;
    }
    if (queue && !queue_name_valid(queue)) {
        problem(r, 400, "invalid-parameter", "'queue' is not a valid queue name");
        return;
    }
    int64_t l = 50;
    Cursor b;
    if ((before && parse_cursor(r, before, &b, &err) != 0) ||
        (limit && parse_seq(limit, &l, &err) != 0)) {
        req_finish_problem(r, &err);
        return;
    }
    if (!before)
        cursor_zero(&b, api_of(r)->shards);
    if (l < 1 || l > 500) {
        problem(r, 400, "invalid-parameter", "'limit' must be from 1 to 500");
        return;
    }
    ListTask *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->status = xstrdup(status);
    t->queue = xstrdup(queue);
    t->before = b;
    t->limit = (int)l;
    req_park(r);
    dbpool_submit(api_of(r)->pool, list_task, t);
}

#define FINISHED_COUNTS_MS 5000

Api *api_new(const ApiConfig *cfg, const ApiParts *parts)
{
    Api *a = xcalloc(1, sizeof *a);
    a->cfg = *cfg;
    a->mgrs = parts->mgrs;
    a->shards = leaderinfo_shards(parts->leader);
    a->hub = parts->hub;
    a->listener = parts->listener;
    a->proxy = parts->proxy;
    a->pool = parts->pool;
    a->metrics = parts->metrics;
    a->auth = parts->auth;
    a->leader = parts->leader;
    a->dbwatch = parts->dbwatch;
    pthread_mutex_init(&a->stats_lock, NULL);
    return a;
}

void api_free(Api *a)
{
    if (!a)
        return;
    view_finished_counts_free(a->finished_counts);
    pthread_mutex_destroy(&a->stats_lock);
    free(a);
}

static void queues_task(ViewDbs *db, void *arg)
{
    Req *r = arg;
    Api *a = api_of(r);
    Err err = {0};
    OpenCounts *open = view_open_counts(db, &err);
    if (!open) {
        req_finish_problem(r, &err);
        return;
    }
    pthread_mutex_lock(&a->stats_lock);
    if (!a->finished_counts || mono_ms() - a->finished_counts_ms > FINISHED_COUNTS_MS) {
        FinishedCounts *fc = view_finished_counts(db, &err);
        if (fc) {
            view_finished_counts_free(a->finished_counts);
            a->finished_counts = fc;
            a->finished_counts_ms = mono_ms();
        }
    }
    FinishedCounts *finished =
        a->finished_counts ? view_finished_counts_copy(a->finished_counts) : NULL;
    pthread_mutex_unlock(&a->stats_lock);
    QueueLimitsList *limits = finished ? view_queue_limits(db, &err) : NULL;
    if (!limits) {
        req_finish_problem(r, &err);
    } else {
        HubRates *rates = hub_rates(a->hub, wall_ms());
        req_finish_json(r, 200,
                        render_queues(open, finished, limits, rates, FINISHED_COUNTS_MS / 1000));
        hub_rates_free(rates);
    }
    view_open_counts_free(open);
    view_finished_counts_free(finished);
    view_queue_limits_free(limits);
}

static void h_queues(Req *r, char *const *p)
{
    req_park(r);
    dbpool_submit(api_of(r)->pool, queues_task, r);
}

/* Keys shown by GET /queues/{queue}/keys at most (the rest is "other"). */
#define KEYS_TOP_MAX 100

/* A read of the shared tables that any node answers: the activity chart, a
 * queue's backlog per key. */
typedef struct ReadTask {
    Req *r;
    char *queue;
    int n; /* activity: buckets; keys: how many keys */
} ReadTask;

/* Answers o (stolen), or the error when o is NULL. */
static void read_finish(ReadTask *t, json_t *o, Err *err)
{
    if (!o) {
        req_finish_problem(t->r, err);
    } else {
        req_finish_json(t->r, 200, o);
    }
    free(t->queue);
    free(t);
}

static void activity_task(ViewDbs *db, void *arg)
{
    ReadTask *t = arg;
    Err err = {0};
    Activity *a = view_activity(db, t->n, &err);
    read_finish(t, a ? render_activity(a) : NULL, &err);
    view_activity_free(a);
}

static void keys_task(ViewDbs *db, void *arg)
{
    ReadTask *t = arg;
    Err err = {0};
    KeyBacklogs *k = view_key_backlog(db, t->queue, t->n, &err);
    read_finish(t, k ? render_key_backlog(t->queue, k) : NULL, &err);
    view_key_backlog_free(k);
}

/* ?name= as an integer from lo to hi (def when absent); answers 400 if not. */
static bool query_int(Req *r, const char *name, int lo, int hi, int def, int *out)
{
    const char *v = req_query(r, name);
    int64_t x = def;
    Err err = {0};
    if (v && parse_seq(v, &x, &err) != 0)
        x = -1;
    if (x < lo || x > hi) {
        char msg[120];
        snprintf(msg, sizeof msg, "'%s' must be an integer from %d to %d", name, lo, hi);
        problem(r, 400, "invalid-parameter", msg);
        return false;
    }
    *out = (int)x;
    return true;
}

static void h_activity(Req *r, char *const *p)
{
    int minutes;
    if (!query_int(r, "minutes", 1, ACTIVITY_KEEP_S / 60, 10, &minutes))
        return;
    ReadTask *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->n = minutes * 60 / ACTIVITY_BUCKET_S;
    req_park(r);
    dbpool_submit(api_of(r)->pool, activity_task, t);
}

static void h_queue_keys(Req *r, char *const *p)
{
    int top;
    if (!check_queue(r, p[0]) || !query_int(r, "limit", 1, KEYS_TOP_MAX, 20, &top))
        return;
    ReadTask *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->queue = xstrdup(p[0]);
    t->n = top;
    req_park(r);
    dbpool_submit(api_of(r)->pool, keys_task, t);
}

/* ---- results ---- */

static ssize_t no_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* A results stream: /results (per_work NULL) or /work/{id}/stream. */
static void results_stream(Req *r, const char *per_work)
{
    Err err = {0};
    Cursor after;
    cursor_zero(&after, api_of(r)->shards); /* a work's stream starts with its history */
    const char *last = req_header(r, "Last-Event-ID");
    const char *q_after = req_query(r, "after");
    const char *from = last && *last ? last : q_after;
    if (from && parse_cursor(r, from, &after, &err) != 0) {
        req_finish_problem(r, &err);
        return;
    }
    const char *work_id = per_work ? per_work : req_query(r, "work_id");
    const char *queue = per_work ? NULL : req_query(r, "queue");
    const char *progress = per_work ? "true" : req_query(r, "progress");
    if (progress && strcmp(progress, "true") != 0 && strcmp(progress, "false") != 0) {
        problem(r, 400, "invalid-parameter", "'progress' must be true or false");
        return;
    }
    if (per_work && !check_id(r, per_work, "work id"))
        return;
    if (work_id && !work_id_valid(work_id)) {
        problem(r, 400, "invalid-parameter", "'work_id' is not a valid work id");
        return;
    }
    if (queue && !queue_name_valid(queue)) {
        problem(r, 400, "invalid-parameter", "'queue' is not a valid queue name");
        return;
    }
    if (!strcmp(r->method, "HEAD")) {
        /* The head a stream would have, without subscribing to one (the
         * daemon never asks a HEAD answer for its body). */
        r->stream =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, no_stream, NULL, NULL);
        MHD_add_response_header(r->stream, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r->stream, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r->stream, "X-Accel-Buffering", "no");
        /* A stream has no length: the head of one ends its connection.
         * (libmicrohttpd 0.9.75 at times sends the chunked terminator after a
         * HEAD answer of unknown size, which a kept-alive client would read
         * as the start of its next answer.) */
        MHD_add_response_header(r->stream, MHD_HTTP_HEADER_CONNECTION, "close");
        r->status = 200;
        r->answered = true;
        return;
    }
    /* A work's own stream ends with the work; /results?work_id= goes on. */
    r->stream = hub_subscribe(api_of(r)->hub, r->conn, from || per_work ? &after : NULL, work_id,
                              queue, progress && !strcmp(progress, "true"), per_work != NULL, &err);
    if (!r->stream) {
        req_finish_problem(r, &err);
        return;
    }
    r->status = 200;
    r->answered = true;
}

static void h_results(Req *r, char *const *p)
{
    results_stream(r, NULL);
}

static void h_work_stream(Req *r, char *const *p)
{
    results_stream(r, p[0]);
}

/* ---- progress (workers) ---- */

WARN_UNUSED static int parse_progress_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    r->single = true;
    return parse_progress(body, p[0], p[1], &c->updates, &c->n_updates, &c->worker_id, &c->instance,
                          err);
}

static void h_progress(Req *r, char *const *p)
{
    worker_cmd(r, p, "work id", MC_PROGRESS, parse_progress_cmd);
}

WARN_UNUSED static int parse_progress_batch_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c,
                                                Err *err)
{
    c->worker_id = xstrdup(p[0]);
    return parse_progress_batch(body, (size_t)api_of(r)->cfg.max_batch, &c->updates, &c->n_updates,
                                &c->instance, err);
}

static void h_worker_progress(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_PROGRESS, parse_progress_batch_cmd);
}

/* {"id", "attempt", "accepted", "seq"} or {..., "accepted": false, "status",
 * "reason", "detail"}: how the manager took one progress update. */
static json_t *progress_result_json(const ProgressUpdate *u)
{
    json_t *o = json_pack("{s:s, s:i, s:b}", "id", u->work_id, "attempt", u->attempt, "accepted",
                          u->status == 200);
    if (u->status == 200)
        json_object_set_new(o, "seq", json_integer(u->seq));
    else
        json_object_update_new(o, json_pack("{s:i, s:s, s:s}", "status", u->status, "reason",
                                            u->err.type, "detail", u->err.msg));
    return o;
}

/* POST /work/{id}/attempts/{n}/progress answers {"id", "attempt", "seq"} or
 * the refusal; POST /workers/{id}/progress {"results": [...]}, one per update. */
static void progress_reply(Req *r, const MgrCmd *c)
{
    if (r->single && c->updates[0].status != 200) {
        req_finish_problem(r, &c->updates[0].err);
        return;
    }
    if (r->single) {
        const ProgressUpdate *u = &c->updates[0];
        req_finish_json(r, 200,
                        json_pack("{s:s, s:i, s:I}", "id", u->work_id, "attempt", u->attempt, "seq",
                                  (json_int_t)u->seq));
        return;
    }
    json_t *results = json_array();
    for (size_t i = 0; i < c->n_updates; i++)
        json_array_append_new(results, progress_result_json(&c->updates[i]));
    req_finish_json(r, 200, json_pack("{s:o}", "results", results));
}

/* ---- webhook subscriptions (admin; the leader answers) ---- */

static bool check_subscription(Req *r, const char *name)
{
    return check_name(r, name, "subscription name");
}

static void h_subscription_put(Req *r, char *const *p)
{
    if (!check_subscription(r, p[0]))
        return;
    Err err = {0};
    json_t *body = body_json(r, &err);
    MgrCmd *c = mgrcmd_new(MC_SUBSCRIPTION_SET);
    c->name = xstrdup(p[0]);
    c->sub = xcalloc(1, sizeof *c->sub);
    Api *a = api_of(r);
    if (!body || parse_subscription(body, p[0], a->shards, a->cfg.webhook_allow, c->sub,
                                    &c->sub_reset, &err) != 0) {
        json_decref(body);
        mgrcmd_free(c);
        req_finish_problem(r, &err);
        return;
    }
    json_decref(body);
    to_shard(r, 0, c, NULL); /* subscriptions live in shard 0 */
}

static void h_subscription_delete(Req *r, char *const *p)
{
    if (!check_subscription(r, p[0]))
        return;
    MgrCmd *c = mgrcmd_new(MC_SUBSCRIPTION_DELETE);
    c->name = xstrdup(p[0]);
    to_shard(r, 0, c, NULL); /* subscriptions live in shard 0 */
}

static void h_subscription_get(Req *r, char *const *p)
{
    if (!check_subscription(r, p[0]))
        return;
    MgrCmd *c = mgrcmd_new(MC_SUBSCRIPTION_GET);
    c->name = xstrdup(p[0]);
    to_shard(r, 0, c, NULL); /* subscriptions live in shard 0 */
}

static void h_subscriptions(Req *r, char *const *p)
{
    to_shard(r, 0, mgrcmd_new(MC_SUBSCRIPTION_GET), NULL);
}

/* ---- workers ---- */

WARN_UNUSED static int parse_heartbeat_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c,
                                           Err *err)
{
    HeartbeatMsg hb;
    if (parse_heartbeat(body, &hb, err) != 0)
        return -1;
    c->worker_id = xstrdup(p[0]);
    c->instance = hb.instance;
    c->capacity = hb.capacity;
    c->queues = hb.queues;
    c->running = hb.running;
    return 0;
}

static void h_heartbeat(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_HEARTBEAT, parse_heartbeat_cmd);
}

WARN_UNUSED static int parse_deregister(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    const char *instance = req_query(r, "instance");
    if (instance && !id_valid(instance))
        return err_set(err, 400, "invalid-parameter",
                       "'instance' must be 1-128 characters of A-Z a-z 0-9 . _ : @ -");
    c->worker_id = xstrdup(p[0]);
    c->instance = xstrdup(instance);
    return 0;
}

static void h_deregister(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_DEREGISTER, parse_deregister);
}

WARN_UNUSED static int parse_pull_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    PullMsg pm;
    if (parse_pull(body, &pm, err) != 0)
        return -1;
    c->worker_id = xstrdup(p[0]);
    c->instance = pm.instance;
    c->peek = pm.peek;
    c->max = pm.max;
    c->wait_ms = pm.wait_ms;
    c->queues = pm.queues;
    if (c->peek && !r->forwarded)
        return err_set(err, 400, "invalid-field",
                       "'peek' is for the nodes of a cluster, pulling for a worker");
    return 0;
}

static void h_pull(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_PULL, parse_pull_cmd);
}

WARN_UNUSED static int parse_reports_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    if (parse_reports(body, (size_t)api_of(r)->cfg.max_batch, &c->reports, &c->n_reports,
                      &c->instance, err) != 0)
        return -1;
    c->worker_id = xstrdup(p[0]);
    return 0;
}

static void h_reports(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_REPORTS, parse_reports_cmd);
}

/* ---- operations ---- */

static void h_cluster(Req *r, char *const *p)
{
    to_all_shards(r, mgrcmd_new(MC_CLUSTER), merge_cluster);
}

static void h_healthz(Req *r, char *const *p)
{
    req_finish_json(r, 200,
                    json_pack("{s:s, s:s}", "status", "ok", "node", api_of(r)->cfg.node_id));
}

static void h_readyz(Req *r, char *const *p)
{
    Api *a = api_of(r);
    char url[256];
    int64_t term = leaderinfo_get(a->leader, 0, url, sizeof url);
    if (!listener_db_ok(a->listener)) {
        char msg[120] = "this node cannot reach PostgreSQL";
        for (int sh = 1; sh < a->shards && listener_shard_db_ok(a->listener, 0); sh++)
            if (!listener_shard_db_ok(a->listener, sh)) {
                snprintf(msg, sizeof msg,
                         "this node cannot reach the database of shard %d (--shard-databases)", sh);
                break;
            }
        problem(r, 503, "not-ready", msg);
        return;
    }
    char stuck[600];
    if (a->dbwatch.stalled(a->dbwatch.ctx, stuck, sizeof stuck)) {
        problem(r, 503, "not-ready", stuck);
        return;
    }
    if (!url[0]) {
        problem(r, 503, "not-ready", "no leader has been elected yet");
        return;
    }
    for (int sh = 1; sh < a->shards; sh++) {
        char other[256];
        leaderinfo_get(a->leader, sh, other, sizeof other);
        if (!other[0]) {
            char msg[80];
            snprintf(msg, sizeof msg, "shard %d has no leader elected yet", sh);
            problem(r, 503, "not-ready", msg);
            return;
        }
    }
    bool leader = shards_leads(a->mgrs, 0);
    req_finish_json(r, 200,
                    json_pack("{s:s, s:s, s:I, s:b}", "status", "ready", "leader", url, "term",
                              (json_int_t)term, "is_leader", leader));
}

/* Runs on a read-pool thread: queue depths come from the projection, so that
 * every node, leader or not, reports them. */
/* The token buckets of the shards this node leads, asked of their managers
 * one after the other before the metrics are read. */
typedef struct FlowAsk {
    Req *r;
    MgrCmd *cmds[SHARDS_MAX];
    int shard[SHARDS_MAX]; /* whose manager cmds[i] goes to */
    int n, next;
} FlowAsk;

static void flow_ask_free(void *p)
{
    FlowAsk *f = p;
    for (int i = 0; i < f->n; i++)
        mgrcmd_free(f->cmds[i]);
    free(f);
}

static void metrics_task(ViewDbs *db, void *arg)
{
    Req *r = arg;
    Api *a = api_of(r);
    const char *routes[METRICS_ROUTES];
    for (size_t i = 0; i < api_routes_count; i++)
        routes[i] = api_routes[i].name;
    char url[256];
    Err err = {0};
    /* The buckets the leading managers answered (queues are each one shard's). */
    const FlowAsk *asked = r->state;
    size_t n_tokens = 0;
    for (int i = 0; asked && i < asked->n; i++)
        n_tokens += asked->cmds[i]->status == 200 ? asked->cmds[i]->n_tokens : 0;
    QueueTokens *tokens = xcalloc(n_tokens + 1, sizeof *tokens);
    n_tokens = 0;
    for (int i = 0; asked && i < asked->n; i++)
        for (size_t k = 0; asked->cmds[i]->status == 200 && k < asked->cmds[i]->n_tokens; k++)
            tokens[n_tokens++] = asked->cmds[i]->tokens[k]; /* borrowed */
    MetricsNode node = {
        .routes = routes,
        .n_routes = api_routes_count,
        .shards = a->shards,
        .database_up = listener_db_ok(a->listener),
        .open_counts = view_open_counts(db, &err),
        .limits = view_queue_limits(db, &err),
        .backlog = view_key_backlog(db, NULL, METRICS_KEYS_TOP, &err),
        .tokens = asked ? tokens : NULL,
        .n_tokens = n_tokens,
        .mgrs = a->mgrs,
    };
    for (int sh = 0; sh < a->shards; sh++)
        node.leader_terms[sh] = leaderinfo_get(a->leader, sh, url, sizeof url);
    size_t len;
    char *text = metrics_render(a->metrics, &node, &len);
    free(tokens);
    view_open_counts_free(node.open_counts);
    view_queue_limits_free(node.limits);
    view_key_backlog_free(node.backlog);
    req_finish_raw(r, 200, "text/plain; version=0.0.4", text, len);
}

static void metrics_read(Req *r)
{
    req_park(r);
    dbpool_submit(api_of(r)->pool, metrics_task, r);
}

static void flow_ask_next(FlowAsk *f);

/* Manager thread: a leader's token buckets are in; the next, or the rest. */
static void metrics_flow_done(MgrCmd *c, void *ud)
{
    FlowAsk *f = ud;
    if (f->next < f->n) {
        flow_ask_next(f);
        return;
    }
    f->r->on_resume = metrics_read;
    req_resume(f->r);
}

static void flow_ask_next(FlowAsk *f)
{
    Api *a = api_of(f->r);
    int i = f->next++;
    manager_send(shards_manager(a->mgrs, f->shard[i]), f->cmds[i]);
}

static void h_metrics(Req *r, char *const *p)
{
    Api *a = api_of(r);
    FlowAsk *f = xcalloc(1, sizeof *f);
    f->r = r;
    for (int sh = 0; sh < shards_count(a->mgrs); sh++)
        if (shards_leads(a->mgrs, sh)) {
            MgrCmd *c = mgrcmd_new(MC_QUEUE_FLOW);
            c->done = metrics_flow_done;
            c->ud = f;
            f->shard[f->n] = sh;
            f->cmds[f->n++] = c;
        }
    if (!f->n) {
        free(f);
        metrics_read(r);
        return;
    }
    r->state = f;
    r->free_state = flow_ask_free;
    req_park(r);
    flow_ask_next(f);
}

const Route api_routes[] = {
    {"POST", "/work", h_submit, "submit", true, SCOPE_CLIENT, ""},
    {"GET", "/work", h_work_list, "work_list", false, SCOPE_CLIENT, "status queue before limit"},
    {"POST", "/bulk/cancel", h_bulk_cancel, "work_bulk_cancel", true, SCOPE_ADMIN, ""},
    {"POST", "/bulk/retry", h_bulk_retry, "work_bulk_retry", true, SCOPE_ADMIN, ""},
    {"GET", "/queues", h_queues, "queues", false, SCOPE_CLIENT, ""},
    {"PUT", "/queues/:queue", h_queue_put, "queue_put", true, SCOPE_ADMIN, ""},
    {"POST", "/queues/:queue/pause", h_queue_pause, "queue_pause", false, SCOPE_ADMIN, ""},
    {"POST", "/queues/:queue/resume", h_queue_resume, "queue_resume", false, SCOPE_ADMIN, ""},
    {"GET", "/queues/:queue/keys", h_queue_keys, "queue_keys", false, SCOPE_CLIENT, "limit"},
    {"GET", "/activity", h_activity, "activity", false, SCOPE_CLIENT, "minutes"},
    {"GET", "/work/:id", h_work_get, "work_get", false, SCOPE_CLIENT, "wait"},
    {"DELETE", "/work/:id", h_cancel, "work_cancel", false, SCOPE_ADMIN, ""},
    {"GET", "/work/:id/events", h_work_events, "work_events", false, SCOPE_CLIENT, "after limit"},
    {"POST", "/work/:id/retry", h_retry, "work_retry", false, SCOPE_ADMIN, ""},
    {"POST", "/work/:id/attempts/:n/complete", h_complete, "attempt_complete", true, SCOPE_WORKER,
     ""},
    {"POST", "/work/:id/attempts/:n/fail", h_fail, "attempt_fail", true, SCOPE_WORKER, ""},
    {"POST", "/work/:id/attempts/:n/progress", h_progress, "attempt_progress", true, SCOPE_WORKER,
     ""},
    {"GET", "/work/:id/stream", h_work_stream, "work_stream", false, SCOPE_CLIENT,
     "after access_token"},
    {"GET", "/results", h_results, "results", false, SCOPE_CLIENT,
     "after work_id queue progress access_token"},
    {"GET", "/subscriptions", h_subscriptions, "subscriptions", false, SCOPE_ADMIN, ""},
    {"PUT", "/subscriptions/:name", h_subscription_put, "subscription_put", true, SCOPE_ADMIN, ""},
    {"GET", "/subscriptions/:name", h_subscription_get, "subscription_get", false, SCOPE_ADMIN, ""},
    {"DELETE", "/subscriptions/:name", h_subscription_delete, "subscription_delete", false,
     SCOPE_ADMIN, ""},
    {"PUT", "/workers/:id", h_heartbeat, "worker_heartbeat", true, SCOPE_WORKER, ""},
    {"DELETE", "/workers/:id", h_deregister, "worker_deregister", false, SCOPE_WORKER, "instance"},
    {"POST", "/workers/:id/pull", h_pull, "worker_pull", true, SCOPE_WORKER, ""},
    {"POST", "/workers/:id/reports", h_reports, "worker_reports", true, SCOPE_WORKER, ""},
    {"POST", "/workers/:id/progress", h_worker_progress, "worker_progress", true, SCOPE_WORKER, ""},
    {"GET", "/schedules", h_schedules, "schedules", false, SCOPE_CLIENT, ""},
    {"GET", "/schedules/:name", h_schedule_get, "schedule_get", false, SCOPE_CLIENT, ""},
    {"PUT", "/schedules/:name", h_schedule_put, "schedule_put", true, SCOPE_ADMIN, ""},
    {"DELETE", "/schedules/:name", h_schedule_delete, "schedule_delete", false, SCOPE_ADMIN, ""},
    {"POST", "/schedules/:name/pause", h_schedule_pause, "schedule_pause", false, SCOPE_ADMIN, ""},
    {"POST", "/schedules/:name/resume", h_schedule_resume, "schedule_resume", false, SCOPE_ADMIN,
     ""},
    {"GET", "/batches/:id", h_batch_get, "batch_get", false, SCOPE_CLIENT, ""},
    {"GET", "/cluster", h_cluster, "cluster", false, SCOPE_ADMIN, ""},
    {"GET", "/healthz", h_healthz, "healthz", false, SCOPE_NONE, ""},
    {"GET", "/readyz", h_readyz, "readyz", false, SCOPE_NONE, ""},
    {"GET", "/metrics", h_metrics, "metrics", false, SCOPE_ADMIN, ""},
    {"GET", "/", static_index, "index", false, SCOPE_NONE, NULL},
    {"GET", "/dashboard/:file", static_asset, "dashboard_asset", false, SCOPE_NONE, NULL},
};
const size_t api_routes_count = sizeof api_routes / sizeof api_routes[0];
_Static_assert(sizeof api_routes / sizeof api_routes[0] < METRICS_ROUTES,
               "METRICS_ROUTES needs a slot per route and one for unmatched requests");

/* ---- the hooks of the HTTP daemon (http.h) ---- */

/* Only a node that knows the cluster secret may say it forwards: such a
 * request is not forwarded again, and may be larger (ids and defaults filled
 * in). Without a secret configured the header is believed only for the
 * first, which can only make a node answer less. */
static int vouch(void *ctx, Req *r, Err *err)
{
    const Api *a = ctx;
    const char *fwd = req_header(r, "X-Workd-Forwarded");
    bool trusted = false;
    if (fwd && a->cfg.cluster_secret[0]) {
        /* "secret=SECRET; node=NODE-ID", as proxy.c sends it. */
        size_t n = strncmp(fwd, "secret=", 7) ? 0 : strcspn(fwd + 7, "; ");
        char given[AUTH_SECRET_MAX + 1] = "";
        if (n && n <= AUTH_SECRET_MAX)
            snprintf(given, sizeof given, "%.*s", (int)n, fwd + 7);
        trusted = auth_secret_matches(a->cfg.cluster_secret, given);
        explicit_bzero(given, sizeof given);
        if (!trusted)
            return err_set(err, 403, "forwarding-refused",
                           "X-Workd-Forwarded is reserved for the nodes of this cluster (it "
                           "carries their shared secret); send the request without it");
    }
    r->forwarded = fwd != NULL;
    /* The shard a node forwards to: a forwarded request only (another node
     * decided it). */
    const char *shard = fwd ? req_header(r, "X-Workd-Shard") : NULL;
    r->shard = -1;
    if (shard) {
        char *end;
        long s = strtol(shard, &end, 10);
        if (end == shard || *end || s < 0 || s >= leaderinfo_shards(a->leader))
            return err_set(err, 400, "invalid-shard",
                           "X-Workd-Shard names no shard of this cluster");
        r->shard = (int)s;
    }
    return trusted;
}

/* The route's scope against the request's bearer token. A token in the URL
 * ends up in logs and histories: it counts only where a browser cannot send a
 * header, and is refused elsewhere. */
static int authorize(void *ctx, Req *r, Err *err)
{
    const Api *a = ctx;
    bool url_token_ok = route_takes(r->rt, "access_token");
    if (!url_token_ok && req_query(r, "access_token"))
        return err_set(err, 400, "token-in-url",
                       "?access_token= is accepted only on GET /results (where a browser's "
                       "EventSource cannot send headers); send 'Authorization: Bearer TOKEN'");
    if (auth_check(a->auth, r->rt->scope, req_header(r, MHD_HTTP_HEADER_AUTHORIZATION),
                   url_token_ok ? req_query(r, "access_token") : NULL, err) != 0) {
        if (err->status == 401)
            snprintf(r->location, sizeof r->location, "%s", "Bearer realm=\"workd\"");
        return -1;
    }
    return 0;
}

/* Requests that matched no route count in the last slot ("unmatched"). */
static void observe(void *ctx, int route, int status, int64_t us)
{
    const Api *a = ctx;
    metrics_observe(a->metrics, route >= 0 ? route : METRICS_ROUTES - 1, status, us);
}

HttpApp api_http(Api *a)
{
    return (HttpApp){.routes = api_routes,
                     .n_routes = api_routes_count,
                     .ctx = a,
                     .vouch = vouch,
                     .authorize = authorize,
                     .observe = observe};
}
