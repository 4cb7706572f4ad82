/* api_work: the work routes, submitting (one item, many, a batch), reading a
 * work and its events, listing, cancelling and retrying one, and the bulk
 * actions; with their answers (api_private.h). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api_private.h"
#include "dbpool.h"
#include "hub.h"
#include "listener.h"
#include "parse.h"
#include "render.h"
#include "shards.h"
#include "trace.h"
#include "util.h"
#include "view.h"

/* ---- submitting ---- */

/* {"id", "status", "created"}: how the manager took one submitted item. */
static json_t *submitted_json(const SubmitItem *it, const SubmitResult *res)
{
    return json_pack("{s:s, s:s, s:b}", "id", it->id, "status", res->status, "created",
                     res->created);
}

void reply_submit(Req *r, const MgrCmd *c)
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

void h_submit(Req *r, char *const *p)
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

/* ---- one work: reading it and its events, cancelling, retrying ---- */

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

void h_work_get(Req *r, char *const *p)
{
    start_get(r, p[0], false);
}

void h_work_events(Req *r, char *const *p)
{
    start_get(r, p[0], true);
}

void h_cancel(Req *r, char *const *p)
{
    if (!check_id(r, p[0], "work id"))
        return;
    MgrCmd *c = mgrcmd_new(MC_CANCEL);
    c->work_id = xstrdup(p[0]);
    to_work_shard(r, p[0], c);
}

void h_retry(Req *r, char *const *p)
{
    if (!check_id(r, p[0], "work id"))
        return;
    MgrCmd *c = mgrcmd_new(MC_RETRY);
    c->work_id = xstrdup(p[0]);
    to_work_shard(r, p[0], c);
}

/* MC_CANCEL, MC_RETRY: {"id", "status"}. */
void reply_work_status(Req *r, const MgrCmd *c)
{
    req_finish_json(r, c->status,
                    json_pack("{s:s, s:s}", "id", c->work_id, "status", c->work_status));
}

/* ---- listing ---- */

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

void h_work_list(Req *r, char *const *p)
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

void h_bulk_cancel(Req *r, char *const *p)
{
    (void)p;
    bulk(r, MC_BULK_CANCEL);
}

void h_bulk_retry(Req *r, char *const *p)
{
    (void)p;
    bulk(r, MC_BULK_RETRY);
}

void reply_bulk(Req *r, const MgrCmd *c)
{
    req_finish_json(r, c->status,
                    json_pack("{s:I, s:b}", c->type == MC_BULK_CANCEL ? "cancelled" : "retried",
                              (json_int_t)c->n_done, "more", c->more));
}
