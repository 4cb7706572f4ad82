/* api_queues: the queues' routes, their counts and rates, flow control
 * (limits, pause, resume), a queue's backlog per key, and the activity chart
 * of every queue (api_private.h). */
#include <pthread.h>
#include <stdlib.h>

#include "api_private.h"
#include "dbpool.h"
#include "hub.h"
#include "parse.h"
#include "render.h"
#include "util.h"
#include "view.h"

/* ---- flow control (admin) ---- */

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

void h_queue_put(Req *r, char *const *p)
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

void h_queue_pause(Req *r, char *const *p)
{
    if (!check_queue(r, p[0]))
        return;
    QueueLimits l = {.paused = true};
    queue_set(r, p[0], &l, QL_PAUSED);
}

void h_queue_resume(Req *r, char *const *p)
{
    if (!check_queue(r, p[0]))
        return;
    QueueLimits l = {.paused = false};
    queue_set(r, p[0], &l, QL_PAUSED);
}

void reply_queue_set(Req *r, const MgrCmd *c)
{
    json_t *o = render_queue_limits(c->queue, &c->limits);
    if (c->queue_new) /* most often a misspelt name: say so */
        json_object_set_new(o, "warning",
                            json_pack("s++", "the queue '", c->queue,
                                      "' had no open work and no flow control: these settings "
                                      "start it (check the name)"));
    req_finish_json(r, c->status, o);
}

/* ---- counts and rates (any node) ---- */

#define FINISHED_COUNTS_MS 5000

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

void h_queues(Req *r, char *const *p)
{
    req_park(r);
    dbpool_submit(api_of(r)->pool, queues_task, r);
}

/* ---- a queue's keys, every queue's activity (any node) ---- */

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

void h_activity(Req *r, char *const *p)
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

void h_queue_keys(Req *r, char *const *p)
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
