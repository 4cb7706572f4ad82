/* render: see render.h. */
#include "render.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

json_t *render_time(int64_t ms)
{
    char buf[40];
    if (!ms)
        return json_null();
    time_format(ms, buf, sizeof buf);
    return json_string(buf);
}

/* A time (ms) as RFC 3339, or null when not set. */
static json_t *at_json(int64_t ms)
{
    if (ms == VIEW_NO_TIME)
        return json_null();
    char buf[40];
    time_format(ms, buf, sizeof buf);
    return json_string(buf);
}

/* A string, or null. */
static json_t *str_json(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *strv_json(char *const *v)
{
    json_t *a = json_array();
    for (size_t i = 0; v && v[i]; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

/* ---- work ---- */

static json_t *progress_json(const WorkView *w)
{
    if (!w->has_progress)
        return json_null();
    const WorkProgress *p = &w->progress;
    return json_pack("{s:I, s:i, s:o, s:o, s:o}", "seq", (json_int_t)p->seq, "attempt", p->attempt,
                     "fraction", p->has_fraction ? json_real(p->fraction) : json_null(), "message",
                     str_json(p->message), "at", at_json(p->at));
}

json_t *render_work(const WorkView *w)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(w->id));
    json_object_set_new(o, "queue", json_string(w->queue));
    json_object_set_new(o, "priority", json_integer(w->priority));
    json_object_set_new(o, "status", json_string(w->status));
    json_object_set(o, "payload", w->payload ? w->payload : json_null());
    json_object_set_new(o, "attempts", json_integer(w->attempts));
    json_object_set_new(o, "max_attempts", json_integer(w->max_attempts));
    json_object_set_new(o, "timeout_ms", json_integer(w->timeout_ms));
    json_object_set_new(o, "run_at", at_json(w->run_at));
    json_object_set_new(o, "created_at", at_json(w->created_at));
    json_object_set_new(o, "started_at", at_json(w->started_at));
    json_object_set_new(o, "finished_at", at_json(w->finished_at));
    json_object_set_new(o, "worker_id", str_json(w->worker_id));
    json_object_set_new(o, "deadline", at_json(w->deadline));
    json_object_set(o, "result", w->result ? w->result : json_null());
    json_object_set_new(o, "last_error", str_json(w->last_error));
    json_object_set_new(o, "key", str_json(w->key));
    json_object_set_new(o, "after", strv_json(w->after));
    json_object_set_new(o, "run_anyway", json_boolean(w->run_anyway));
    json_object_set_new(o, "batch", str_json(w->batch));
    if (w->traceparent) { /* the producer's trace context: only when there is one */
        json_object_set_new(o, "traceparent", json_string(w->traceparent));
        if (w->tracestate)
            json_object_set_new(o, "tracestate", json_string(w->tracestate));
    }
    json_object_set_new(o, "progress", progress_json(w));
    json_object_set_new(o, "children", strv_json(w->children));
    return o;
}

json_t *render_work_events(const WorkEvents *e)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < e->len; i++) {
        const WorkEvent *x = &e->items[i];
        json_array_append_new(arr, json_pack("{s:I, s:I, s:o, s:s, s:i, s:O}", "seq",
                                             (json_int_t)x->seq, "term", (json_int_t)x->term, "at",
                                             at_json(x->at), "type", x->type, "version", x->version,
                                             "data", x->data ? x->data : json_null()));
    }
    return json_pack("{s:s, s:o, s:o}", "id", e->id, "events", arr, "next_after",
                     e->next_after ? json_integer(e->next_after) : json_null());
}

json_t *render_work_list(const WorkList *l)
{
    json_t *items = json_array();
    for (size_t i = 0; i < l->len; i++) {
        const WorkSummary *w = &l->items[i];
        json_array_append_new(
            items,
            json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:o, s:o, s:o, s:o}", "id", w->id, "queue",
                      w->queue, "priority", w->priority, "status", w->status, "attempts",
                      w->attempts, "max_attempts", w->max_attempts, "created_at",
                      at_json(w->created_at), "finished_at", at_json(w->finished_at), "worker_id",
                      str_json(w->worker_id), "last_error", str_json(w->last_error)));
    }
    /* A seq in a cluster of one shard, else a cursor's text (cursor.h). */
    json_t *next = json_null();
    if (l->more && l->next_before.n == 1) {
        next = json_integer(l->next_before.seq[0]);
    } else if (l->more) {
        char text[CURSOR_TEXT_MAX];
        cursor_format(&l->next_before, text, sizeof text);
        next = json_string(text);
    }
    return json_pack("{s:o, s:o}", "items", items, "next_before", next);
}

/* ---- queues ---- */

static json_t *limits_json(const QueueLimits *l)
{
    json_t *w = json_object();
    for (size_t i = 0; i < l->n_weights; i++)
        json_object_set_new(w, l->weights[i].key, json_integer(l->weights[i].weight));
    return json_pack(
        "{s:b, s:o, s:o, s:o, s:o}", "paused", l->paused, "max_running",
        l->max_running ? json_integer(l->max_running) : json_null(), "max_running_per_key",
        l->max_running_per_key ? json_integer(l->max_running_per_key) : json_null(), "rate",
        l->rate_limit ? json_pack("{s:i, s:f}", "limit", l->rate_limit, "per",
                                  (double)l->rate_period_ms / 1000.0)
                      : json_null(),
        "key_weights", w);
}

json_t *render_queue_limits(const char *queue, const QueueLimits *l)
{
    json_t *o = limits_json(l);
    json_object_set_new(o, "queue", json_string(queue));
    return o;
}

static json_t *ints_json(const int *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *rate_json(const QueueRate *r)
{
    if (!r)
        return json_null();
    return json_pack("{s:o, s:o, s:o}", "completed", ints_json(r->completed, HUB_RATE_BUCKETS),
                     "dead", ints_json(r->dead, HUB_RATE_BUCKETS), "cancelled",
                     ints_json(r->cancelled, HUB_RATE_BUCKETS));
}

/* One queue of GET /queues; any part may be NULL (nothing known). */
static json_t *queue_json(const char *name, const OpenCount *o, const FinishedCount *f,
                          const QueueLimitsRow *l, const QueueRate *r)
{
    static const QueueLimits none = {0};
    return json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:f, s:o, s:o}", "queue", name, "waiting",
        (json_int_t)(o ? o->waiting : 0), "pending", (json_int_t)(o ? o->pending : 0), "scheduled",
        (json_int_t)(o ? o->scheduled : 0), "running", (json_int_t)(o ? o->running : 0),
        "completed", (json_int_t)(f ? f->completed : 0), "dead", (json_int_t)(f ? f->dead : 0),
        "cancelled", (json_int_t)(f ? f->cancelled : 0), "oldest_pending_at",
        at_json(o ? o->oldest_pending_at : VIEW_NO_TIME), "oldest_pending_age_s",
        o ? o->oldest_pending_age_s : 0.0, "throughput", rate_json(r), "limits",
        limits_json(l ? &l->limits : &none));
}

/* The queue's name of the entry at i of a list sorted by queue, or NULL past
 * its end. */
#define HEAD(list, i) ((list) && (i) < (list)->len ? (list)->items[i].queue : NULL)

static bool is(const char *head, const char *name)
{
    return head && !strcmp(head, name);
}

static const char *least(const char *a, const char *b)
{
    return !a ? b : !b ? a : strcmp(a, b) <= 0 ? a : b;
}

json_t *render_queues(const OpenCounts *open, const FinishedCounts *finished,
                      const QueueLimitsList *limits, const HubRates *rates, int finished_age_s)
{
    json_t *queues = json_array();
    size_t io = 0, jf = 0, kl = 0, mr = 0;
    for (;;) {
        const char *name = least(least(HEAD(open, io), HEAD(finished, jf)),
                                 least(HEAD(limits, kl), HEAD(rates, mr)));
        if (!name)
            break;
        /* Each list that has this queue at its head gives its entry and moves on. */
        const OpenCount *o = is(HEAD(open, io), name) ? &open->items[io++] : NULL;
        const FinishedCount *f = is(HEAD(finished, jf), name) ? &finished->items[jf++] : NULL;
        const QueueLimitsRow *l = is(HEAD(limits, kl), name) ? &limits->items[kl++] : NULL;
        const QueueRate *r = is(HEAD(rates, mr), name) ? &rates->items[mr++] : NULL;
        json_array_append_new(queues, queue_json(name, o, f, l, r));
    }
    return json_pack("{s:o, s:i, s:i}", "queues", queues, "bucket_seconds",
                     HUB_RATE_BUCKET_MS / 1000, "finished_counts_age_s", finished_age_s);
}

static json_t *key_count_json(const KeyCount *k)
{
    return json_pack("{s:I, s:I, s:I}", "pending", (json_int_t)k->pending, "scheduled",
                     (json_int_t)k->scheduled, "running", (json_int_t)k->running);
}

json_t *render_key_backlog(const char *queue, const KeyBacklogs *k)
{
    const KeyBacklog *q = NULL;
    for (size_t i = 0; k && i < k->len && !q; i++)
        if (!strcmp(k->items[i].queue, queue))
            q = &k->items[i];
    json_t *keys = json_array();
    for (size_t i = 0; q && i < q->n_keys; i++) {
        json_t *o = key_count_json(&q->keys[i]);
        json_object_set_new(o, "key", str_json(q->keys[i].key));
        json_array_append_new(keys, o);
    }
    static const KeyCount none = {0};
    json_t *other = key_count_json(q ? &q->other : &none);
    json_object_set_new(other, "keys", json_integer(q ? q->other_keys : 0));
    return json_pack("{s:s, s:o, s:o}", "queue", queue, "keys", keys, "other", other);
}

json_t *render_activity(const Activity *a)
{
    json_t *queues = json_object();
    for (size_t i = 0; i < a->len; i++) {
        const ActivityQueue *q = &a->queues[i];
        json_t *o = json_object();
        for (int k = 0; k < ACTIVITY_KINDS; k++) {
            json_t *arr = json_array();
            for (int b = 0; b < a->buckets; b++)
                json_array_append_new(arr, json_integer(q->count[k][b]));
            json_object_set_new(o, activity_kinds[k], arr);
        }
        json_object_set_new(queues, q->queue, o);
    }
    char start[40];
    time_format(a->start * 1000, start, sizeof start);
    return json_pack("{s:i, s:s, s:i, s:o}", "bucket_seconds", ACTIVITY_BUCKET_S, "start", start,
                     "buckets", a->buckets, "queues", queues);
}

/* ---- schedules and batches ---- */

json_t *render_schedule_spec(const char *name, const ScheduleSpec *spec, int64_t last_tick,
                             int64_t now)
{
    json_t *o = schedspec_json(spec);
    json_object_set_new(o, "name", json_string(name));
    char buf[40];
    time_format(last_tick, buf, sizeof buf);
    json_object_set_new(o, "last_tick", json_string(buf));
    json_t *next = json_array();
    int64_t t = last_tick > now ? last_tick : now;
    for (int i = 0; i < 5 && !spec->paused; i++) {
        t = cron_next(&spec->cron, spec->zone, t);
        if (t == INT64_MAX)
            break;
        time_format(t, buf, sizeof buf);
        json_array_append_new(next, json_string(buf));
    }
    json_object_set_new(o, "next", next);
    return o;
}

json_t *render_schedule(const ScheduleView *v, int64_t now)
{
    json_t *o;
    if (v->spec) {
        o = render_schedule_spec(v->name, v->spec, v->last_tick, now);
    } else { /* shown as stored, with why it does not fire */
        o = json_deep_copy(v->stored);
        json_object_del(o, "since");
        json_object_del(o, "schedule");
        json_object_set_new(o, "name", json_string(v->name));
        json_object_set_new(o, "next", json_array());
        json_object_set_new(o, "error", json_string(v->error));
    }
    json_object_set_new(o, "last_run",
                        v->last_work ? json_pack("{s:s, s:o, s:s}", "id", v->last_work, "fired_at",
                                                 at_json(v->last_fired_at), "status",
                                                 v->last_status ? v->last_status : "unknown")
                                     : json_null());
    json_object_set_new(o, "updated_at", at_json(v->updated_at));
    return o;
}

json_t *render_schedules(const ScheduleList *l, int64_t now)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < l->len; i++)
        json_array_append_new(arr, render_schedule(&l->items[i], now));
    return json_pack("{s:o}", "schedules", arr);
}

json_t *render_batch(const BatchView *b)
{
    return json_pack(
        "{s:s, s:o, s:b, s:o, s:O, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:I}", "id", b->id,
        "opened_at", at_json(b->opened_at), "finished", b->finished_at != VIEW_NO_TIME,
        "finished_at", at_json(b->finished_at), "callback", b->callback ? b->callback : json_null(),
        "callback_id", str_json(b->callback_id), "counts", "waiting", (json_int_t)b->waiting,
        "pending", (json_int_t)b->pending, "scheduled", (json_int_t)b->scheduled, "running",
        (json_int_t)b->running, "completed", (json_int_t)b->completed, "dead", (json_int_t)b->dead,
        "cancelled", (json_int_t)b->cancelled, "total", (json_int_t)b->total);
}

/* ---- webhook subscriptions ---- */

/* url without the user information of its authority, which becomes "***"
 * (user and password alike): a new string. */
static char *url_redacted(const char *url)
{
    const char *auth = strstr(url, "://");
    if (!auth)
        return xstrdup(url);
    auth += 3;
    size_t n = strcspn(auth, "/?#");
    const char *at = NULL;
    for (const char *p = auth; p < auth + n; p++)
        if (*p == '@')
            at = p;
    if (!at)
        return xstrdup(url);
    SBuf b;
    sbuf_init(&b);
    sbuf_append(&b, url, (size_t)(auth - url));
    sbuf_puts(&b, "***");
    sbuf_puts(&b, at);
    return sbuf_steal(&b);
}

/* A subscription's place: a seq in a cluster of one shard, else a cursor's
 * text (cursor.h). */
static json_t *place_json(const Cursor *c)
{
    if (c->n <= 1)
        return json_integer(c->seq[0]);
    char text[CURSOR_TEXT_MAX];
    cursor_format(c, text, sizeof text);
    return json_string(text);
}

json_t *render_subscription(const SubscriptionView *v, bool deleted)
{
    const Subscription *s = &v->sub;
    const Deliveries *d = &v->deliveries;
    char *shown = url_redacted(s->url ? s->url : "");
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(s->name));
    json_object_set_new(o, "url", json_string(shown));
    free(shown);
    json_object_set_new(o, "queues", s->queues ? strv_json(s->queues) : json_null());
    json_object_set_new(o, "kinds", strv_json(s->kinds));
    json_object_set_new(o, "paused", json_boolean(s->paused));
    json_object_set_new(o, "paused_reason", str_json(s->paused_reason));
    json_object_set_new(o, "cursor", place_json(&s->cursor));
    json_object_set_new(o, "delivered_upto", place_json(&d->delivered_upto));
    json_object_set_new(o, "lag", json_integer(d->lag));
    json_object_set_new(o, "delivered", json_integer(d->delivered));
    json_object_set_new(o, "last_delivered_at", render_time(d->last_delivered_at));
    json_object_set_new(o, "failures", json_integer(d->failures));
    json_object_set_new(o, "failing_since", render_time(d->failing_since));
    json_object_set_new(o, "last_error",
                        d->last_error[0] ? json_string(d->last_error) : json_null());
    json_object_set_new(o, "last_error_at", render_time(d->last_error_at));
    json_object_set_new(o, "next_attempt_at", render_time(d->next_attempt_at));
    if (deleted)
        json_object_set_new(o, "deleted", json_true());
    return o;
}

json_t *render_subscriptions(const SubscriptionViews *l)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < l->len; i++)
        json_array_append_new(arr, render_subscription(&l->items[i], false));
    return json_pack("{s:o, s:o}", "subscriptions", arr, "last_seq", place_json(&l->last_seq));
}
