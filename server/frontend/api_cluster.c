/* api_cluster: the cluster's routes, /cluster, health and readiness,
 * /metrics, the results streams, and the webhook subscriptions that results
 * are delivered to (api_private.h). */
#include <stdlib.h>
#include <string.h>

#include "api_private.h"
#include "dbpool.h"
#include "hub.h"
#include "leaderinfo.h"
#include "listener.h"
#include "metrics.h"
#include "parse.h"
#include "parse_hooks.h"
#include "render.h"
#include "shards.h"
#include "util.h"
#include "view.h"

/* ---- the cluster, health, readiness ---- */

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

void reply_cluster(Req *r, const MgrCmd *c)
{
    Api *a = api_of(r);
    json_t *o = cluster_json(c->cluster);
    json_object_set_new(o, "nodes", listener_nodes(a->listener));
    json_object_set_new(o, "database", a->dbwatch.json(a->dbwatch.ctx));
    req_finish_json(r, c->status, o);
}

void h_cluster(Req *r, char *const *p)
{
    to_all_shards(r, mgrcmd_new(MC_CLUSTER), merge_cluster);
}

void h_healthz(Req *r, char *const *p)
{
    req_finish_json(r, 200,
                    json_pack("{s:s, s:s}", "status", "ok", "node", api_of(r)->cfg.node_id));
}

void h_readyz(Req *r, char *const *p)
{
    Api *a = api_of(r);
    char url[256];
    int64_t term = leaderinfo_get(a->leader, 0, url, sizeof url);
    /* Commits waiting for a synchronous standby first: they also stall the
     * listener's one write (this node's row in workd_nodes), which its
     * deadline then gives up, and "cannot reach" would hide the cause. */
    char stuck[600];
    if (a->dbwatch.stalled(a->dbwatch.ctx, stuck, sizeof stuck)) {
        problem(r, 503, "not-ready", stuck);
        return;
    }
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

/* ---- metrics ---- */

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

void h_metrics(Req *r, char *const *p)
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

void h_results(Req *r, char *const *p)
{
    results_stream(r, NULL);
}

void h_work_stream(Req *r, char *const *p)
{
    results_stream(r, p[0]);
}

/* ---- webhook subscriptions (admin; the leader answers) ---- */

static bool check_subscription(Req *r, const char *name)
{
    return check_name(r, name, "subscription name");
}

void h_subscription_put(Req *r, char *const *p)
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

void h_subscription_delete(Req *r, char *const *p)
{
    if (!check_subscription(r, p[0]))
        return;
    MgrCmd *c = mgrcmd_new(MC_SUBSCRIPTION_DELETE);
    c->name = xstrdup(p[0]);
    to_shard(r, 0, c, NULL); /* subscriptions live in shard 0 */
}

void h_subscription_get(Req *r, char *const *p)
{
    if (!check_subscription(r, p[0]))
        return;
    MgrCmd *c = mgrcmd_new(MC_SUBSCRIPTION_GET);
    c->name = xstrdup(p[0]);
    to_shard(r, 0, c, NULL); /* subscriptions live in shard 0 */
}

void h_subscriptions(Req *r, char *const *p)
{
    to_shard(r, 0, mgrcmd_new(MC_SUBSCRIPTION_GET), NULL);
}

/* MC_SUBSCRIPTION_*: the one subscription (as it was, for a deletion), or all. */
void reply_subscriptions(Req *r, const MgrCmd *c)
{
    if (c->type == MC_SUBSCRIPTION_GET && !c->name)
        req_finish_json(r, c->status, render_subscriptions(c->subs));
    else
        req_finish_json(r, c->status,
                        render_subscription(&c->subs->items[0], c->type == MC_SUBSCRIPTION_DELETE));
}
