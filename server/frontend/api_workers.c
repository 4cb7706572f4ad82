/* api_workers: the routes a worker uses, heartbeats, pulls (over the queues of
 * several shards), reports, progress and deregistration, each checked
 * against the worker ids its token may act for; with their answers
 * (api_private.h). */
#include <stdlib.h>
#include <string.h>

#include "api_private.h"
#include "auth.h"
#include "parse.h"
#include "parse_hooks.h"
#include "pull.h"
#include "shard.h"
#include "util.h"

/* ---- a worker's command: checked, parsed, sent to its shards ---- */

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

/* Fills c from the request: p, the path's parameters; body, the parsed JSON
 * body (NULL for a route without one). Sets c->worker_id. */
typedef int (*CmdParse)(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err);

static void exchange_route(Req *r, MgrCmd *c);

/* The shards a pull takes from (each once, in order), as many as it returns:
 * its queues', or every shard when it names none. */
static int pull_shards(Req *r, const MgrCmd *c, int *out)
{
    Api *a = api_of(r);
    bool in[SHARDS_MAX] = {0};
    for (size_t i = 0; c->queues && c->queues[i]; i++)
        in[queue_shard(a, c->queues[i])] = true;
    int n = 0;
    for (int s = 0; s < a->shards; s++)
        if (!c->queues || in[s])
            out[n++] = s;
    return n;
}

/* A pull goes to the shard of its queues; over several (or all, naming
 * none), this node pulls from each for the worker (pull.h), as it does
 * when results (NULL: none) of the reports it carried must be added to
 * its answer (exchange_route). */
static void pull_route_with(Req *r, MgrCmd *c, json_t *results)
{
    Api *a = api_of(r);
    PullSpec spec = {
        .instance = c->instance, .max = c->max, .wait_ms = c->wait_ms, .results = results};
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
    if ((spec.n == 1 || r->shard >= 0) && !results) {
        to_shard(r, spec.shards[0], c, NULL);
    } else {
        req_park(r);
        pull_over_shards(a->proxy, r, &spec);
        mgrcmd_free(c);
    }
    for (int s = 0; s < a->shards; s++)
        free(by_shard[s]);
}

static void pull_route(Req *r, MgrCmd *c)
{
    pull_route_with(r, c, NULL);
}

/* ---- the worker's exchange over several shards ---- */

/* A pull that carries reports, in a cluster of several shards: each report
 * goes to its work's shard. When they and the pull's queues are all of one
 * shard, one command there does both (one commit); else each shard's
 * reports go first (a peek that takes nothing, carrying them), then the
 * pull, whose answer carries their results in order. */
typedef struct Exchange {
    MgrCmd *c;       /* the pull, with its reports */
    char **ids;      /* the reports' work ids, borrowed from c */
    int *shards;     /* of each report's work (-1: unknown) */
    json_t *results; /* once the reports are answered */
    json_t *items;   /* the body's reports, once sent */
} Exchange;

static void exchange_free(void *state)
{
    Exchange *x = state;
    if (x->c)
        mgrcmd_free(x->c);
    free(x->ids);
    free(x->shards);
    json_decref(x->results);
    json_decref(x->items);
    free(x);
}

/* Takes r's exchange back from r (the caller owns it then). */
static Exchange *exchange_of(Req *r)
{
    Exchange *x = r->state;
    r->state = NULL;
    r->free_state = NULL;
    return x;
}

/* Any thread: every shard answered its reports; on to the pull. */
static void exchange_pull(Req *r)
{
    Exchange *x = exchange_of(r);
    MgrCmd *c = x->c;
    x->c = NULL;
    ws_reports_free(c->reports, c->n_reports);
    c->reports = NULL;
    c->n_reports = 0;
    json_t *results = x->results;
    x->results = NULL;
    exchange_free(x);
    pull_route_with(r, c, results);
    json_decref(results);
}

static void exchange_merged(Req *r, FanReply *rs, size_t n, void *ud)
{
    (void)ud;
    Exchange *x = r->state;
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
        return;
    }
    x->results = results_in_order(rs, n, x->shards, x->items, x->c->n_reports);
    r->on_resume = exchange_pull;
    req_resume(r);
}

/* HTTP thread: the reports' shards are known. */
static void exchange_send(Req *r)
{
    Api *a = api_of(r);
    Exchange *x = r->state;
    MgrCmd *c = x->c;
    int pulls[SHARDS_MAX];
    int n_pulls = pull_shards(r, c, pulls);
    bool one = n_pulls == 1;
    for (size_t i = 0; i < c->n_reports; i++) {
        if (x->shards[i] == -1) /* unknown: any shard says so */
            x->shards[i] = pulls[0];
        one = one && x->shards[i] == pulls[0]; /* none SHARD_UNREACHABLE */
    }
    if (one) {
        x->c = NULL;
        exchange_free(exchange_of(r));
        to_shard(r, pulls[0], c, NULL);
        return;
    }
    json_t *body = json_loadb(r->body.data, r->body.len, 0, NULL);
    json_t *peek = json_pack("{s:i, s:i, s:b}", "max", 1, "wait", 0, "peek", 1);
    if (c->instance)
        json_object_set_new(peek, "instance", json_string(c->instance));
    int shards[SHARDS_MAX];
    char *bodies[SHARDS_MAX];
    x->items = json_incref(json_object_get(body, "reports"));
    size_t parts =
        bodies_by_shard(a, peek, "reports", x->items, x->shards, c->n_reports, shards, bodies);
    json_decref(peek);
    json_decref(body);
    req_park(r);
    fanout(a->proxy, r, shards, bodies, parts, exchange_merged, NULL);
}

static void exchange_lookup_task(ViewDbs *db, void *arg)
{
    Req *r = arg;
    Exchange *x = r->state;
    Err err = {0};
    /* Reports whose shard cannot be told are answered 'unavailable' (sent
     * again later); the pull goes on for the others. */
    if (view_work_shards(db, x->ids, x->c->n_reports, x->shards, &err) == -1) {
        req_finish_problem(r, &err);
        return;
    }
    r->on_resume = exchange_send;
    req_resume(r);
}

static void exchange_route(Req *r, MgrCmd *c)
{
    Exchange *x = xcalloc(1, sizeof *x);
    x->c = c;
    x->ids = xcalloc(c->n_reports + 1, sizeof *x->ids);
    x->shards = xcalloc(c->n_reports + 1, sizeof *x->shards);
    for (size_t i = 0; i < c->n_reports; i++)
        x->ids[i] = (char *)c->reports[i].work_id;
    r->state = x;
    r->free_state = exchange_free;
    req_park(r);
    dbpool_submit(api_of(r)->pool, exchange_lookup_task, r);
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
        if (c->n_reports && api_of(r)->shards > 1 && r->shard < 0)
            exchange_route(r, c);
        else
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

/* ---- heartbeats and deregistration ---- */

/* Attempts as [{"id", "attempt"}] (null for NULL). */
json_t *running_json(const RunningList *l)
{
    if (!l)
        return json_null();
    json_t *arr = json_array();
    for (size_t i = 0; i < l->n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:I}", "id", l->items[i].work_id, "attempt",
                                             (json_int_t)l->items[i].attempt));
    return arr;
}

void reply_heartbeat(Req *r, const MgrCmd *c)
{
    json_t *o =
        json_pack("{s:I, s:I}", "heartbeat_interval_ms", (json_int_t)c->heartbeat_interval_ms,
                  "worker_timeout_ms", (json_int_t)c->worker_timeout_ms);
    if (c->stale && c->stale->n)
        json_object_set_new(o, "cancel", running_json(c->stale));
    req_finish_json(r, c->status, o);
}

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

void h_heartbeat(Req *r, char *const *p)
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

void h_deregister(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_DEREGISTER, parse_deregister);
}

/* ---- pulls ---- */

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

static json_t *reports_reply(const MgrCmd *c);

/* A pull's answer: its jobs, and the results of the reports it carried
 * (the worker's exchange), in their order. */
void reply_pull(Req *r, const MgrCmd *c)
{
    json_t *jobs = json_array();
    for (size_t i = 0; i < c->n_jobs; i++)
        json_array_append_new(jobs, job_json(&c->jobs[i]));
    json_t *o = json_pack("{s:o}", "jobs", jobs);
    if (c->peek)
        json_object_set_new(o, "ready", json_boolean(c->ready));
    if (c->n_reports && c->results)
        json_object_update_new(o, reports_reply(c));
    req_finish_json(r, 200, o);
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
    c->reports = pm.reports;
    c->n_reports = pm.n_reports;
    size_t max_batch = (size_t)api_of(r)->cfg.max_batch;
    if (c->n_reports > max_batch)
        return err_set(err, 413, "batch-too-large", "%zu reports in one request; the limit is %zu",
                       c->n_reports, max_batch);
    if (c->peek && !r->forwarded)
        return err_set(err, 400, "invalid-field",
                       "'peek' is for the nodes of a cluster, pulling for a worker");
    return 0;
}

void h_pull(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_PULL, parse_pull_cmd);
}

/* ---- reports ---- */

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

void reply_reports(Req *r, const MgrCmd *c)
{
    if (r->single)
        single_report_reply(r, &c->reports[0], &c->results[0]);
    else
        req_finish_json(r, 200, reports_reply(c));
}

WARN_UNUSED static int parse_reports_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    if (parse_reports(body, (size_t)api_of(r)->cfg.max_batch, &c->reports, &c->n_reports,
                      &c->instance, err) != 0)
        return -1;
    c->worker_id = xstrdup(p[0]);
    return 0;
}

void h_reports(Req *r, char *const *p)
{
    worker_cmd(r, p, "worker id", MC_REPORTS, parse_reports_cmd);
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

void h_complete(Req *r, char *const *p)
{
    worker_cmd(r, p, "work id", MC_REPORTS, parse_complete);
}

void h_fail(Req *r, char *const *p)
{
    worker_cmd(r, p, "work id", MC_REPORTS, parse_fail);
}

/* ---- progress ---- */

WARN_UNUSED static int parse_progress_cmd(Req *r, char *const *p, json_t *body, MgrCmd *c, Err *err)
{
    r->single = true;
    return parse_progress(body, p[0], p[1], &c->updates, &c->n_updates, &c->worker_id, &c->instance,
                          err);
}

void h_progress(Req *r, char *const *p)
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

void h_worker_progress(Req *r, char *const *p)
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
void progress_reply(Req *r, const MgrCmd *c)
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
