/* api: see api.h. The route table and the table of the manager's answers,
 * the Api, the hooks of the HTTP daemon and the helpers every handler uses;
 * the handlers are in api_<resource>.c (api_private.h). */
#include "api.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api_private.h"
#include "auth.h"
#include "leaderinfo.h"
#include "metrics.h"
#include "parse.h"
#include "static.h"
#include "util.h"
#include "view.h"

/* ---- helpers of every handler ---- */

void problem(Req *r, int status, const char *type, const char *msg)
{
    Err e;
    err_set(&e, status, type, "%s", msg);
    req_finish_problem(r, &e);
}

WARN_UNUSED json_t *body_json(Req *r, Err *err)
{
    return parse_json_body(r->body.data ? r->body.data : "", r->body.len,
                           (size_t)api_of(r)->cfg.max_json_depth, err);
}

/* A work id in the path may be one workd made (with '~'); any other id not. */
bool check_id(Req *r, const char *id, const char *what)
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

/* A name in the path (a queue, a schedule, a subscription): what says which. */
bool check_name(Req *r, const char *name, const char *what)
{
    if (queue_name_valid(name))
        return true;
    char msg[128];
    snprintf(msg, sizeof msg,
             "the %s in the path must be 1-64 characters of A-Z a-z 0-9 _ . - (not . or ..)", what);
    problem(r, 400, "invalid-path", msg);
    return false;
}

/* A cursor of this cluster's shards (cursor.h): in a cluster of one shard
 * the seq it has always been, refused as any seq is (invalid-parameter). */
WARN_UNUSED int parse_cursor(Req *r, const char *text, Cursor *out, Err *err)
{
    int n = api_of(r)->shards;
    if (n > 1)
        return cursor_parse(text, n, out, err);
    cursor_zero(out, 1);
    return parse_seq(text, &out->seq[0], err);
}

/* ---- the Api ---- */

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

/* ---- the manager's answers (api_replies) ---- */

static void reply_no_content(Req *r, const MgrCmd *c)
{
    (void)c;
    req_finish_raw(r, 204, NULL, NULL, 0);
}

/* The commands no HTTP request sends: MC_QUEUE_FLOW (/metrics asks it
 * itself), MC_SUB_CURSOR and MC_SUB_PAUSE (the webhooks thread's). */
static void reply_never(Req *r, const MgrCmd *c)
{
    (void)c;
    problem(r, 500, "internal", "this command is not answered over HTTP");
}

const CmdReply api_replies[] = {
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
_Static_assert(sizeof api_replies / sizeof api_replies[0] == MC_COUNT,
               "every MgrCmdType has its reply");

/* ---- the routes (api.h) ---- */

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
