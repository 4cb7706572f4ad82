/* event: see event.h. */
#include "event.h"

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "util.h"

static const char *type_names[] = {
    [EV_TERM] = "term",
    [EV_ACCEPTED] = "accepted",
    [EV_STARTED] = "started",
    [EV_COMPLETED] = "completed",
    [EV_FAILED] = "failed",
    [EV_TIMED_OUT] = "timed_out",
    [EV_DEAD] = "dead",
    [EV_CANCELLED] = "cancelled",
    [EV_RETRIED] = "retried",
    [EV_QUEUE_SET] = "queue_set",
    [EV_PROGRESS] = "progress",
    [EV_SUBSCRIPTION] = "subscription",
    [EV_SUB_CURSOR] = "subscription_cursor",
    [EV_RELEASED] = "released",
    [EV_SCHEDULE_SET] = "schedule_set",
    [EV_SCHEDULE_DELETED] = "schedule_deleted",
    [EV_TICK] = "tick",
    [EV_BATCH_OPENED] = "batch_opened",
    [EV_BATCH] = "batch",
};
_Static_assert(sizeof type_names / sizeof type_names[0] == EV_LAST + 1,
               "a name per EventType (and EV_LAST the last of them)");

static const char *catch_up_names[] = {
    [CATCHUP_NONE] = "none", [CATCHUP_LAST] = "last", [CATCHUP_ALL] = "all"};

const char *event_type_name(EventType t)
{
    if (t < EV_TERM || t > EV_LAST)
        return "unknown";
    return type_names[t];
}

int event_type_parse(const char *name, EventType *out)
{
    for (int t = EV_TERM; t <= EV_LAST; t++)
        if (strcmp(type_names[t], name) == 0) {
            *out = (EventType)t;
            return 0;
        }
    return -1;
}

bool event_is_final(EventType t)
{
    return t == EV_COMPLETED || t == EV_DEAD || t == EV_CANCELLED;
}

bool event_is_published(EventType t)
{
#define IS_PUBLISHED_(type, name) t == type ||
    return EVENTS_PUBLISHED(IS_PUBLISHED_) t == EV_PROGRESS;
#undef IS_PUBLISHED_
}

/* ---- templates and schedules ---- */

json_t *template_json(const WorkTemplate *t)
{
    json_t *o = json_pack("{s:s, s:i, s:O, s:I, s:i}", "queue", t->queue, "priority", t->priority,
                          "payload", t->payload ? t->payload : json_null(), "timeout_ms",
                          (json_int_t)t->timeout_ms, "max_attempts", t->max_attempts);
    if (t->key)
        json_object_set_new(o, "key", json_string(t->key));
    return o;
}

int template_decode(json_t *o, WorkTemplate *t, Err *err)
{
    memset(t, 0, sizeof *t);
    const char *q = json_string_value(json_object_get(o, "queue"));
    json_t *payload = json_object_get(o, "payload");
    if (!q || !payload)
        return err_set(err, 500, "bad-event", "a work template lacks 'queue' or 'payload'");
    t->queue = xstrdup(q);
    t->key = xstrdup(json_string_value(json_object_get(o, "key")));
    t->priority = (int)json_integer_value(json_object_get(o, "priority"));
    t->payload = json_incref(payload);
    t->timeout_ms = json_integer_value(json_object_get(o, "timeout_ms"));
    t->max_attempts = (int)json_integer_value(json_object_get(o, "max_attempts"));
    if (t->timeout_ms <= 0)
        t->timeout_ms = 300000;
    if (t->max_attempts <= 0)
        t->max_attempts = 3;
    return 0;
}

void template_copy(WorkTemplate *dst, const WorkTemplate *src)
{
    *dst = *src;
    dst->queue = xstrdup(src->queue);
    dst->key = xstrdup(src->key);
    dst->payload = json_incref(src->payload);
}

void template_clear(WorkTemplate *t)
{
    free(t->queue);
    free(t->key);
    json_decref(t->payload);
    memset(t, 0, sizeof *t);
}

json_t *schedspec_json(const ScheduleSpec *s)
{
    return json_pack("{s:s, s:s, s:o, s:s, s:s, s:i, s:b}", "cron", s->cron_text, "timezone", s->tz,
                     "work", template_json(&s->work), "overlap", s->skip_overlap ? "skip" : "allow",
                     "catch_up", catch_up_names[s->catch_up], "catch_up_max", s->catch_up_max,
                     "paused", s->paused);
}

int schedspec_decode(json_t *o, ScheduleSpec *s, Err *err)
{
    memset(s, 0, sizeof *s);
    const char *cron = json_string_value(json_object_get(o, "cron"));
    const char *tz = json_string_value(json_object_get(o, "timezone"));
    if (!cron || !tz)
        return err_set(err, 500, "bad-event", "a schedule lacks 'cron' or 'timezone'");
    if (cron_parse(cron, &s->cron, err) != 0 || !(s->zone = tz_get(tz, err)) ||
        template_decode(json_object_get(o, "work"), &s->work, err) != 0) {
        template_clear(&s->work);
        return -1;
    }
    s->cron_text = xstrdup(cron);
    s->tz = xstrdup(tz);
    const char *overlap = json_string_value(json_object_get(o, "overlap"));
    s->skip_overlap = !overlap || strcmp(overlap, "allow") != 0;
    const char *cu = json_string_value(json_object_get(o, "catch_up"));
    s->catch_up = CATCHUP_LAST;
    for (int i = 0; cu && i <= CATCHUP_ALL; i++)
        if (!strcmp(cu, catch_up_names[i]))
            s->catch_up = (CatchUp)i;
    s->catch_up_max = (int)json_integer_value(json_object_get(o, "catch_up_max"));
    s->paused = json_is_true(json_object_get(o, "paused"));
    return 0;
}

ScheduleSpec *schedspec_dup(const ScheduleSpec *s)
{
    ScheduleSpec *d = xcalloc(1, sizeof *d);
    *d = *s;
    d->cron_text = xstrdup(s->cron_text);
    d->tz = xstrdup(s->tz);
    template_copy(&d->work, &s->work);
    return d;
}

void schedspec_free(ScheduleSpec *s)
{
    if (!s)
        return;
    free(s->cron_text);
    free(s->tz);
    template_clear(&s->work);
    free(s);
}

/* Whether events of type t name a work item (the others are about the cluster,
 * a queue, a schedule or a batch). */
static bool event_needs_work(EventType t)
{
    return t != EV_TERM && t != EV_QUEUE_SET && t != EV_SCHEDULE_SET && t != EV_SCHEDULE_DELETED &&
           t != EV_TICK && t != EV_BATCH_OPENED && t != EV_BATCH && t != EV_SUBSCRIPTION &&
           t != EV_SUB_CURSOR;
}

static void set_time(json_t *o, const char *key, int64_t ms)
{
    json_object_set_new(o, key, ms ? json_integer(ms) : json_null());
}

/* The trace context fields, when there is one (none: no field, no cost). */
static void set_trace(json_t *o, const Event *e)
{
    if (!e->traceparent)
        return;
    json_object_set_new(o, "traceparent", json_string(e->traceparent));
    if (e->tracestate)
        json_object_set_new(o, "tracestate", json_string(e->tracestate));
}

/* ---- encoding, one function per kind (ENCODERS below) ----
 * Each writes its kind's fields into o. */

static void encode_term(const Event *e, json_t *o)
{
    json_object_set_new(o, "term", json_integer(e->new_term));
    json_object_set_new(o, "leader", json_string(e->leader_url ? e->leader_url : ""));
}

static void encode_work_fields(const Event *e, json_t *o)
{
    json_object_set_new(o, "queue", json_string(e->queue));
    json_object_set_new(o, "priority", json_integer(e->priority));
    json_object_set(o, "payload", e->payload ? e->payload : json_null());
    set_time(o, "run_at", e->run_at);
    json_object_set_new(o, "timeout_ms", json_integer(e->timeout_ms));
    json_object_set_new(o, "max_attempts", json_integer(e->max_attempts));
    if (e->key) /* since schema 7 */
        json_object_set_new(o, "key", json_string(e->key));
    if (e->after) { /* since schema 11 */
        json_object_set(o, "after", e->after);
        if (e->run_anyway)
            json_object_set_new(o, "run_anyway", json_true());
        if (e->waiting)
            json_object_set_new(o, "waiting", json_true());
    }
    if (e->batch)
        json_object_set_new(o, "batch", json_string(e->batch));
    set_trace(o, e); /* since schema 17 */
}

/* a retried event carries what accepted carried */
static void encode_retried(const Event *e, json_t *o)
{
    json_object_set_new(o, "attempt", json_integer(e->attempt));
    if (e->error)
        json_object_set_new(o, "error", json_string(e->error));
    encode_work_fields(e, o);
}

static void encode_started(const Event *e, json_t *o)
{
    json_object_set_new(o, "attempt", json_integer(e->attempt));
    json_object_set_new(o, "worker_id", json_string(e->worker_id ? e->worker_id : ""));
    /* Required by event_decode: never null, even when 0 (set_time's "none"). */
    json_object_set_new(o, "deadline", json_integer(e->deadline));
}

static void encode_completed(const Event *e, json_t *o)
{
    json_object_set_new(o, "attempt", json_integer(e->attempt));
    json_object_set(o, "result", e->result ? e->result : json_null());
}

static void encode_attempt_ended(const Event *e, json_t *o)
{
    json_object_set_new(o, "attempt", json_integer(e->attempt));
    json_object_set_new(o, "error", json_string(e->error ? e->error : ""));
    set_time(o, "retry_at", e->retry_at);
}

static void encode_dead(const Event *e, json_t *o)
{
    json_object_set_new(o, "error", json_string(e->error ? e->error : ""));
    if (e->attempt) /* since schema 3: absent in older logs */
        json_object_set_new(o, "attempts", json_integer(e->attempt));
}

static void encode_cancelled(const Event *e, json_t *o)
{
    if (e->attempt) /* running work was cancelled: the attempt it ended */
        json_object_set_new(o, "attempt", json_integer(e->attempt));
    if (e->reason) /* since schema 11: why, when not an operator (a parent ended) */
        json_object_set_new(o, "reason", json_string(e->reason));
}

static void encode_nothing(const Event *e, json_t *o)
{
    (void)e;
    (void)o;
}

static void encode_schedule_set(const Event *e, json_t *o)
{
    json_t *spec = schedspec_json(e->sched);
    json_object_update(o, spec);
    json_decref(spec);
    json_object_set_new(o, "schedule", json_string(e->schedule));
    json_object_set_new(o, "since", json_integer(e->tick));
}

static void encode_schedule_deleted(const Event *e, json_t *o)
{
    json_object_set_new(o, "schedule", json_string(e->schedule));
}

static void encode_tick(const Event *e, json_t *o)
{
    json_object_set_new(o, "schedule", json_string(e->schedule));
    json_object_set_new(o, "tick", json_integer(e->tick));
    json_object_set_new(o, "work_id", e->tick_work ? json_string(e->tick_work) : json_null());
    json_object_set_new(o, "skipped", e->skipped ? json_string(e->skipped) : json_null());
    json_object_set_new(o, "missed", json_integer(e->missed));
}

static void encode_batch_opened(const Event *e, json_t *o)
{
    json_object_set_new(o, "batch", json_string(e->batch));
    json_object_set_new(o, "callback", e->callback ? template_json(e->callback) : json_null());
}

static void encode_batch(const Event *e, json_t *o)
{
    json_object_set_new(o, "batch", json_string(e->batch));
    json_object_set_new(o, "completed", json_integer(e->counts[0]));
    json_object_set_new(o, "dead", json_integer(e->counts[1]));
    json_object_set_new(o, "cancelled", json_integer(e->counts[2]));
    json_object_set_new(o, "callback_id",
                        e->callback_id ? json_string(e->callback_id) : json_null());
}

static void encode_queue_set(const Event *e, json_t *o)
{
    const QueueLimits *l = &e->limits;
    json_object_set_new(o, "queue", json_string(e->queue ? e->queue : ""));
    json_object_set_new(o, "paused", json_boolean(l->paused));
    json_object_set_new(o, "max_running_per_key",
                        l->max_running_per_key ? json_integer(l->max_running_per_key)
                                               : json_null());
    json_object_set_new(o, "max_running",
                        l->max_running ? json_integer(l->max_running) : json_null());
    json_object_set_new(o, "rate",
                        l->rate_limit ? json_pack("{s:i, s:I}", "limit", l->rate_limit, "period_ms",
                                                  (json_int_t)l->rate_period_ms)
                                      : json_null());
    if (l->n_weights) { /* since schema 12 */
        json_t *w = json_object();
        for (size_t i = 0; i < l->n_weights; i++)
            json_object_set_new(w, l->weights[i].key, json_integer(l->weights[i].weight));
        json_object_set_new(o, "key_weights", w);
    }
}

static void encode_progress(const Event *e, json_t *o)
{
    json_object_set_new(o, "attempt", json_integer(e->attempt));
    json_object_set_new(o, "queue", json_string(e->queue ? e->queue : ""));
    json_object_set_new(o, "fraction", e->has_fraction ? json_real(e->fraction) : json_null());
    json_object_set_new(o, "message", e->message ? json_string(e->message) : json_null());
    if (e->output)
        json_object_set_new(o, "output", json_string(e->output));
}

/* A strv as a JSON array of strings; NULL as null. */
static json_t *strv_json(char *const *v)
{
    if (!v)
        return json_null();
    json_t *a = json_array();
    for (size_t i = 0; v[i]; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

/* A subscription's place: `key` is shard 0's seq (all of it in a cluster of
 * one shard, as before shards), and with several shards `keys` is every
 * shard's, in shard order (migration 0020 folds it). */
static void encode_place(json_t *o, const char *key, const char *keys, const Cursor *c)
{
    json_object_set_new(o, key, json_integer(c->n ? c->seq[0] : 0));
    if (c->n <= 1)
        return;
    json_t *a = json_array();
    for (int k = 0; k < c->n; k++)
        json_array_append_new(a, json_integer(c->seq[k]));
    json_object_set_new(o, keys, a);
}

/* {name, url, secret (when known), queues, kinds, paused, paused_reason,
 * deleted: false, start (starts), cursor (cursors; a reset only)}, or {name,
 * deleted: true, start (starts)}. The database keeps the secret out of the log
 * (migration 0016). */
static void encode_subscription(const Event *e, json_t *o)
{
    const Subscription *s = e->sub;
    json_object_set_new(o, "name", json_string(s->name));
    if (e->sub_deleted) {
        json_object_set_new(o, "deleted", json_true());
        encode_place(o, "start", "starts", &e->sub_start);
        return;
    }
    json_object_set_new(o, "url", json_string(s->url ? s->url : ""));
    if (s->secret)
        json_object_set_new(o, "secret", json_string(s->secret));
    json_object_set_new(o, "queues", strv_json(s->queues));
    json_object_set_new(o, "kinds", strv_json(s->kinds));
    json_object_set_new(o, "paused", json_boolean(s->paused));
    json_object_set_new(o, "paused_reason",
                        s->paused_reason ? json_string(s->paused_reason) : json_null());
    json_object_set_new(o, "deleted", json_false());
    encode_place(o, "start", "starts", &e->sub_start);
    if (e->sub_reset)
        encode_place(o, "cursor", "cursors", &s->cursor);
}

static void encode_sub_cursor(const Event *e, json_t *o)
{
    json_object_set_new(o, "name", json_string(e->sub->name));
    encode_place(o, "cursor", "cursors", &e->sub->cursor);
}

typedef void (*Encoder)(const Event *e, json_t *o);

static const Encoder ENCODERS[] = {
    [EV_TERM] = encode_term,
    [EV_ACCEPTED] = encode_work_fields,
    [EV_STARTED] = encode_started,
    [EV_COMPLETED] = encode_completed,
    [EV_FAILED] = encode_attempt_ended,
    [EV_TIMED_OUT] = encode_attempt_ended,
    [EV_DEAD] = encode_dead,
    [EV_CANCELLED] = encode_cancelled,
    [EV_RETRIED] = encode_retried,
    [EV_QUEUE_SET] = encode_queue_set,
    [EV_PROGRESS] = encode_progress,
    [EV_SUBSCRIPTION] = encode_subscription,
    [EV_SUB_CURSOR] = encode_sub_cursor,
    [EV_RELEASED] = encode_nothing,
    [EV_SCHEDULE_SET] = encode_schedule_set,
    [EV_SCHEDULE_DELETED] = encode_schedule_deleted,
    [EV_TICK] = encode_tick,
    [EV_BATCH_OPENED] = encode_batch_opened,
    [EV_BATCH] = encode_batch,
};
_Static_assert(sizeof ENCODERS / sizeof ENCODERS[0] == EV_LAST + 1, "an encoder for every kind");

json_t *event_data_encode(const Event *e)
{
    json_t *o = json_object();
    if (e->type >= EV_TERM && e->type <= EV_LAST)
        ENCODERS[e->type](e, o);
    /* Since schema 4 the events that finish work name its queue, so that the
     * results stream needs no other table (its row may be gone with its part). */
    if (event_is_final(e->type) && e->queue)
        json_object_set_new(o, "queue", json_string(e->queue));
    /* Since schema 17 they carry the work's trace context too, for the same
     * reason. */
    if (event_is_final(e->type))
        set_trace(o, e);
    return o;
}

/* Always writes *out (0 unless the field holds an integer), so no caller can
 * read an unset value on any path, whatever the optimiser concludes. */
WARN_UNUSED static int get_int(json_t *d, const char *key, int64_t *out, int required, Err *err)
{
    json_t *v = json_object_get(d, key);
    *out = 0;
    if (!v || json_is_null(v)) {
        return required ? err_set(err, 500, "bad-event", "event lacks '%s'", key) : 0;
    }
    if (!json_is_integer(v))
        return err_set(err, 500, "bad-event", "event field '%s' is not an integer", key);
    *out = json_integer_value(v);
    return 0;
}

static char *get_str(json_t *d, const char *key)
{
    const char *s = json_string_value(json_object_get(d, key));
    return s ? xstrdup(s) : NULL;
}

/* ---- decoding, one function per kind (DECODERS below) ----
 * Each reads its kind's fields out of data into out; -1 with err when a
 * required one is missing or wrong (event_decode then clears out). */

static int decode_term(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    if (get_int(data, "term", &out->new_term, 1, err))
        return -1;
    out->leader_url = get_str(data, "leader");
    return 0;
}

/* What accepted carries (and retried, which rebuilds the item from it). */
static int decode_work_fields(json_t *data, Event *out, Err *err)
{
    int64_t v;
    out->key = get_str(data, "key");
    out->queue = get_str(data, "queue");
    if (!out->queue)
        return err_set(err, 500, "bad-event", "accepted event lacks 'queue'");
    if (get_int(data, "priority", &v, 0, err))
        return -1;
    out->priority = (int)v;
    out->payload = json_incref(json_object_get(data, "payload"));
    if (!out->payload)
        out->payload = json_null();
    if (get_int(data, "run_at", &out->run_at, 0, err) ||
        get_int(data, "timeout_ms", &out->timeout_ms, 1, err) ||
        get_int(data, "max_attempts", &v, 1, err))
        return -1;
    out->max_attempts = (int)v;
    out->batch = get_str(data, "batch"); /* retried: the batch it rejoins */
    return 0;
}

static int decode_accepted(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    if (decode_work_fields(data, out, err) != 0)
        return -1;
    json_t *after = json_object_get(data, "after");
    if (json_is_array(after)) {
        /* Taken as it is when it holds ids only (it always does): the
         * decoded document is not changed after. */
        bool ids = true;
        size_t i;
        json_t *a;
        json_array_foreach(after, i, a)
        {
            ids = ids && json_is_string(a);
        }
        if (ids) {
            out->after = json_incref(after);
        } else {
            out->after = json_array();
            json_array_foreach(after, i, a)
            {
                if (json_is_string(a))
                    json_array_append(out->after, a);
            }
        }
    }
    out->run_anyway = json_is_true(json_object_get(data, "run_anyway"));
    out->waiting = json_is_true(json_object_get(data, "waiting"));
    return 0;
}

static int decode_retried(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    if (get_int(data, "attempt", &v, 1, err))
        return -1;
    out->attempt = (int)v;
    out->error = get_str(data, "error");
    return decode_work_fields(data, out, err);
}

static int decode_started(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    if (get_int(data, "attempt", &v, 1, err) || get_int(data, "deadline", &out->deadline, 1, err))
        return -1;
    out->attempt = (int)v;
    /* Required: a running attempt without a holder would crash the timers. */
    out->worker_id = get_str(data, "worker_id");
    if (!out->worker_id)
        return err_set(err, 500, "bad-event", "started event lacks 'worker_id'");
    return 0;
}

static int decode_completed(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    if (get_int(data, "attempt", &v, 1, err))
        return -1;
    out->attempt = (int)v;
    out->result = json_incref(json_object_get(data, "result"));
    if (!out->result)
        out->result = json_null();
    return 0;
}

/* failed, timed_out */
static int decode_attempt_ended(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    if (get_int(data, "attempt", &v, 1, err) || get_int(data, "retry_at", &out->retry_at, 0, err))
        return -1;
    out->attempt = (int)v;
    out->error = get_str(data, "error");
    return 0;
}

static int decode_dead(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    out->error = get_str(data, "error");
    if (get_int(data, "attempts", &v, 0, err))
        return -1;
    out->attempt = (int)v;
    return 0;
}

static int decode_cancelled(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    if (get_int(data, "attempt", &v, 0, err))
        return -1;
    out->attempt = (int)v;
    out->reason = get_str(data, "reason");
    return 0;
}

static int decode_nothing(json_t *data, const char *type, Event *out, Err *err)
{
    (void)data;
    (void)type;
    (void)out;
    (void)err;
    return 0;
}

/* schedule_deleted (and what schedule_set and tick carry too) */
static int decode_schedule_named(json_t *data, const char *type, Event *out, Err *err)
{
    out->schedule = get_str(data, "schedule");
    if (!out->schedule)
        return err_set(err, 500, "bad-event", "%s event lacks 'schedule'", type);
    return 0;
}

static int decode_schedule_set(json_t *data, const char *type, Event *out, Err *err)
{
    out->sched = xcalloc(1, sizeof *out->sched);
    if (schedspec_decode(data, out->sched, err) != 0 || get_int(data, "since", &out->tick, 0, err))
        return -1;
    return decode_schedule_named(data, type, out, err);
}

static int decode_tick(json_t *data, const char *type, Event *out, Err *err)
{
    int64_t v;
    if (decode_schedule_named(data, type, out, err) != 0 ||
        get_int(data, "tick", &out->tick, 1, err) || get_int(data, "missed", &v, 0, err))
        return -1;
    out->missed = (int)v;
    out->tick_work = get_str(data, "work_id");
    out->skipped = get_str(data, "skipped");
    return 0;
}

static int decode_batch_named(json_t *data, const char *type, Event *out, Err *err)
{
    out->batch = get_str(data, "batch");
    if (!out->batch)
        return err_set(err, 500, "bad-event", "%s event lacks 'batch'", type);
    return 0;
}

static int decode_batch_opened(json_t *data, const char *type, Event *out, Err *err)
{
    if (decode_batch_named(data, type, out, err) != 0)
        return -1;
    if (!json_is_object(json_object_get(data, "callback")))
        return 0;
    out->callback = xcalloc(1, sizeof *out->callback);
    return template_decode(json_object_get(data, "callback"), out->callback, err);
}

static int decode_batch(json_t *data, const char *type, Event *out, Err *err)
{
    if (decode_batch_named(data, type, out, err) != 0)
        return -1;
    out->counts[0] = (int)json_integer_value(json_object_get(data, "completed"));
    out->counts[1] = (int)json_integer_value(json_object_get(data, "dead"));
    out->counts[2] = (int)json_integer_value(json_object_get(data, "cancelled"));
    out->callback_id = get_str(data, "callback_id");
    return 0;
}

static int decode_key_weights(json_t *w, QueueLimits *l, Err *err)
{
    if (!json_is_object(w) || !json_object_size(w))
        return 0;
    const char *k;
    json_t *x;
    l->weights = xcalloc(json_object_size(w), sizeof *l->weights);
    json_object_foreach(w, k, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 1 ||
            json_integer_value(x) > QL_MAX_WEIGHT)
            return err_set(err, 500, "bad-event", "queue_set event has a bad weight for '%s'", k);
        KeyWeight *kw = &l->weights[l->n_weights++];
        kw->key = xstrdup(k);
        kw->weight = (int)json_integer_value(x);
    }
    queue_limits_sort(l);
    return 0;
}

static int decode_queue_set(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    out->queue = get_str(data, "queue");
    if (!out->queue)
        return err_set(err, 500, "bad-event", "queue_set event lacks 'queue'");
    out->limits.paused = json_is_true(json_object_get(data, "paused"));
    if (get_int(data, "max_running", &v, 0, err))
        return -1;
    out->limits.max_running = (int)v;
    if (get_int(data, "max_running_per_key", &v, 0, err))
        return -1;
    out->limits.max_running_per_key = (int)v;
    json_t *rate = json_object_get(data, "rate");
    if (json_is_object(rate)) {
        if (get_int(rate, "limit", &v, 1, err) ||
            get_int(rate, "period_ms", &out->limits.rate_period_ms, 1, err))
            return -1;
        out->limits.rate_limit = (int)v;
        /* A rate that allows nothing or has no period is none, as its
         * encoding (null) says: decoding what was encoded gives it back. */
        if (out->limits.rate_limit <= 0 || out->limits.rate_period_ms <= 0)
            out->limits.rate_limit = 0, out->limits.rate_period_ms = 0;
    }
    return decode_key_weights(json_object_get(data, "key_weights"), &out->limits, err);
}

static int decode_progress(json_t *data, const char *type, Event *out, Err *err)
{
    (void)type;
    int64_t v;
    if (get_int(data, "attempt", &v, 1, err))
        return -1;
    out->attempt = (int)v;
    out->queue = get_str(data, "queue");
    json_t *f = json_object_get(data, "fraction");
    out->has_fraction = json_is_number(f);
    out->fraction = json_number_value(f);
    out->message = get_str(data, "message");
    out->output = get_str(data, "output");
    return 0;
}

char **event_strv(json_t *a)
{
    if (!json_is_array(a))
        return NULL;
    char **v = xcalloc(json_array_size(a) + 1, sizeof *v);
    size_t i, n = 0;
    json_t *x;
    json_array_foreach(a, i, x)
    {
        if (json_is_string(x))
            v[n++] = xstrdup(json_string_value(x));
    }
    return v;
}

/* The strings of d's array `key` (NULL when it is not an array). */
static char **get_strv(json_t *d, const char *key)
{
    return event_strv(json_object_get(d, key));
}

/* A place encode_place wrote: `keys` when the event has it (several shards),
 * else `key` as a cursor of one shard. */
WARN_UNUSED static int get_place(json_t *d, const char *key, const char *keys, Cursor *out,
                                 int required, Err *err)
{
    json_t *a = json_object_get(d, keys);
    if (json_is_array(a) && json_array_size(a) >= 1 && json_array_size(a) <= SHARDS_MAX) {
        cursor_zero(out, (int)json_array_size(a));
        for (size_t k = 0; k < json_array_size(a); k++) {
            if (!json_is_integer(json_array_get(a, k)))
                return err_set(err, 500, "bad-event", "event field '%s' holds a non-integer", keys);
            out->seq[k] = json_integer_value(json_array_get(a, k));
        }
        return 0;
    }
    cursor_zero(out, 1);
    return get_int(d, key, &out->seq[0], required, err);
}

/* The name every subscription event carries, into a new out->sub. */
static int decode_sub_named(json_t *data, const char *type, Event *out, Err *err)
{
    const char *name = json_string_value(json_object_get(data, "name"));
    if (!name)
        return err_set(err, 500, "bad-event", "%s event lacks 'name'", type);
    out->sub = xcalloc(1, sizeof *out->sub);
    out->sub->name = xstrdup(name);
    return 0;
}

/* The fields this version knows (a later one may add others); a secret only
 * in events written before schema 16. */
static int decode_subscription(json_t *data, const char *type, Event *out, Err *err)
{
    if (decode_sub_named(data, type, out, err) != 0 ||
        get_place(data, "start", "starts", &out->sub_start, 0, err) != 0)
        return -1;
    out->sub_deleted = json_is_true(json_object_get(data, "deleted"));
    if (out->sub_deleted)
        return 0;
    Subscription *s = out->sub;
    if (!(s->url = get_str(data, "url")))
        return err_set(err, 500, "bad-event", "%s event lacks 'url'", type);
    s->secret = get_str(data, "secret");
    s->queues = get_strv(data, "queues");
    if (!(s->kinds = get_strv(data, "kinds")))
        s->kinds = xcalloc(1, sizeof *s->kinds);
    s->paused = json_is_true(json_object_get(data, "paused"));
    s->paused_reason = get_str(data, "paused_reason");
    out->sub_reset = json_is_integer(json_object_get(data, "cursor"));
    if (out->sub_reset)
        return get_place(data, "cursor", "cursors", &s->cursor, 1, err);
    cursor_zero(&s->cursor, out->sub_start.n);
    return 0;
}

static int decode_sub_cursor(json_t *data, const char *type, Event *out, Err *err)
{
    if (decode_sub_named(data, type, out, err) != 0)
        return -1;
    return get_place(data, "cursor", "cursors", &out->sub->cursor, 1, err);
}

typedef int (*Decoder)(json_t *data, const char *type, Event *out, Err *err);

/* One decoder per kind: a new kind is its EventType, its name, its entry
 * here and in encoders, and the two functions. */
static const Decoder DECODERS[] = {
    [EV_TERM] = decode_term,
    [EV_ACCEPTED] = decode_accepted,
    [EV_STARTED] = decode_started,
    [EV_COMPLETED] = decode_completed,
    [EV_FAILED] = decode_attempt_ended,
    [EV_TIMED_OUT] = decode_attempt_ended,
    [EV_DEAD] = decode_dead,
    [EV_CANCELLED] = decode_cancelled,
    [EV_RETRIED] = decode_retried,
    [EV_QUEUE_SET] = decode_queue_set,
    [EV_PROGRESS] = decode_progress,
    [EV_SUBSCRIPTION] = decode_subscription,
    [EV_SUB_CURSOR] = decode_sub_cursor,
    [EV_RELEASED] = decode_nothing,
    [EV_SCHEDULE_SET] = decode_schedule_set,
    [EV_SCHEDULE_DELETED] = decode_schedule_named,
    [EV_TICK] = decode_tick,
    [EV_BATCH_OPENED] = decode_batch_opened,
    [EV_BATCH] = decode_batch,
};
_Static_assert(sizeof DECODERS / sizeof DECODERS[0] == EV_LAST + 1, "a decoder for every kind");

int event_decode(int64_t seq, int64_t term, int64_t at, const char *type, int version,
                 const char *work_id, json_t *data, Event *out, Err *err)
{
    memset(out, 0, sizeof *out);
    if (event_type_parse(type, &out->type) != 0)
        return err_set(err, 500, "bad-event", "unknown event type '%s' at seq %lld", type,
                       (long long)seq);
    out->seq = seq;
    out->term = term;
    out->at = at;
    out->version = version;
    out->work_id = xstrdup(work_id);
    if (DECODERS[out->type](data, type, out, err) != 0)
        goto cleanup;
    if (event_is_final(out->type))
        out->queue = get_str(data, "queue"); /* since schema 4; NULL before */
    if (event_is_final(out->type) || out->type == EV_ACCEPTED || out->type == EV_RETRIED) {
        out->traceparent = get_str(data, "traceparent"); /* since schema 17 */
        out->tracestate = out->traceparent ? get_str(data, "tracestate") : NULL;
    }
    if (event_needs_work(out->type) && !out->work_id) {
        err_set(err, 500, "bad-event", "%s event at seq %lld has no work id", type, (long long)seq);
        goto cleanup;
    }
    return 0;
cleanup:
    event_clear(out);
    return -1;
}

json_t *event_result_json(const Event *e)
{
    char at[40];
    time_format(e->at, at, sizeof at);
    if (e->type == EV_BATCH)
        return json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:{s:i, s:i, s:i}, s:s?}", "seq",
                         (json_int_t)e->seq, "id", e->batch, "batch", e->batch, "queue", "",
                         "status", "batch", "at", at, "counts", "completed", e->counts[0], "dead",
                         e->counts[1], "cancelled", e->counts[2], "callback_id", e->callback_id);
    json_t *o =
        json_pack("{s:I, s:s, s:s, s:s, s:s}", "seq", (json_int_t)e->seq, "id", e->work_id, "queue",
                  e->queue ? e->queue : "", "status", event_type_name(e->type), "at", at);
    if (e->type == EV_COMPLETED) {
        json_object_set(o, "result", e->result ? e->result : json_null());
        json_object_set_new(o, "attempt", json_integer(e->attempt));
    } else if (e->type == EV_DEAD) {
        json_object_set_new(o, "error", json_string(e->error ? e->error : ""));
        json_object_set_new(o, "attempts", json_integer(e->attempt));
    } else if (e->type == EV_PROGRESS) {
        json_object_set_new(o, "attempt", json_integer(e->attempt));
        json_object_set_new(o, "fraction", e->has_fraction ? json_real(e->fraction) : json_null());
        json_object_set_new(o, "message", e->message ? json_string(e->message) : json_null());
        if (e->output)
            json_object_set_new(o, "output", json_string(e->output));
    } else if (e->type == EV_CANCELLED && e->reason) {
        json_object_set_new(o, "reason", json_string(e->reason));
    }
    if (event_is_final(e->type))
        set_trace(o, e);
    return o;
}

/* ---- subscriptions ---- */

void subscription_copy(Subscription *dst, const Subscription *src)
{
    *dst = *src;
    dst->name = xstrdup(src->name);
    dst->url = xstrdup(src->url);
    dst->secret = xstrdup(src->secret);
    dst->queues = strv_copy(src->queues);
    dst->kinds = strv_copy(src->kinds);
    dst->paused_reason = xstrdup(src->paused_reason);
}

void subscription_clear(Subscription *s)
{
    free(s->name);
    free(s->url);
    free(s->secret);
    strv_free(s->queues);
    strv_free(s->kinds);
    free(s->paused_reason);
    memset(s, 0, sizeof *s);
}

/* ---- queue limits ---- */

void queue_limits_copy(QueueLimits *dst, const QueueLimits *src)
{
    *dst = *src;
    if (!src->n_weights) {
        dst->weights = NULL;
        return;
    }
    dst->weights = xcalloc(src->n_weights, sizeof *dst->weights);
    for (size_t i = 0; i < src->n_weights; i++) {
        dst->weights[i].key = xstrdup(src->weights[i].key);
        dst->weights[i].weight = src->weights[i].weight;
    }
}

void queue_limits_clear(QueueLimits *l)
{
    for (size_t i = 0; i < l->n_weights; i++)
        free(l->weights[i].key);
    free(l->weights);
    memset(l, 0, sizeof *l);
}

static int weight_cmp(const void *a, const void *b)
{
    return strcmp(((const KeyWeight *)a)->key, ((const KeyWeight *)b)->key);
}

int queue_limits_weight(const QueueLimits *l, const char *key)
{
    if (!l->n_weights)
        return 1;
    KeyWeight probe = {.key = (char *)key};
    const KeyWeight *w = bsearch(&probe, l->weights, l->n_weights, sizeof *w, weight_cmp);
    return w ? w->weight : 1;
}

void queue_limits_sort(QueueLimits *l)
{
    if (l->n_weights > 1)
        qsort(l->weights, l->n_weights, sizeof *l->weights, weight_cmp);
}

/* ---- lifetime ---- */

void event_clear(Event *e)
{
    free(e->work_id);
    free(e->queue);
    free(e->key);
    json_decref(e->payload);
    free(e->worker_id);
    json_decref(e->result);
    free(e->error);
    free(e->reason);
    free(e->leader_url);
    free(e->message);
    free(e->output);
    if (e->sub) {
        subscription_clear(e->sub);
        free(e->sub);
    }
    json_decref(e->after);
    free(e->batch);
    free(e->traceparent);
    free(e->tracestate);
    free(e->schedule);
    schedspec_free(e->sched);
    free(e->tick_work);
    free(e->skipped);
    free(e->callback_id);
    if (e->callback) {
        template_clear(e->callback);
        free(e->callback);
    }
    queue_limits_clear(&e->limits);
    memset(e, 0, sizeof *e);
}

void event_copy(Event *dst, const Event *src)
{
    *dst = *src;
    dst->work_id = xstrdup(src->work_id);
    dst->queue = xstrdup(src->queue);
    dst->key = xstrdup(src->key);
    dst->payload = json_incref(src->payload);
    dst->worker_id = xstrdup(src->worker_id);
    dst->result = json_incref(src->result);
    dst->error = xstrdup(src->error);
    dst->reason = xstrdup(src->reason);
    dst->leader_url = xstrdup(src->leader_url);
    dst->message = xstrdup(src->message);
    dst->output = xstrdup(src->output);
    if (src->sub) {
        dst->sub = xcalloc(1, sizeof *dst->sub);
        subscription_copy(dst->sub, src->sub);
    }
    dst->after = json_incref(src->after);
    dst->batch = xstrdup(src->batch);
    dst->traceparent = xstrdup(src->traceparent);
    dst->tracestate = xstrdup(src->tracestate);
    dst->schedule = xstrdup(src->schedule);
    dst->sched = src->sched ? schedspec_dup(src->sched) : NULL;
    dst->tick_work = xstrdup(src->tick_work);
    dst->skipped = xstrdup(src->skipped);
    dst->callback_id = xstrdup(src->callback_id);
    if (src->callback) {
        dst->callback = xcalloc(1, sizeof *dst->callback);
        template_copy(dst->callback, src->callback);
    }
    queue_limits_copy(&dst->limits, &src->limits);
}

void eventlist_init(EventList *l)
{
    memset(l, 0, sizeof *l);
}

Event *eventlist_push(EventList *l)
{
    if (l->len == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->items = xrealloc(l->items, l->cap * sizeof *l->items);
    }
    Event *e = &l->items[l->len++];
    memset(e, 0, sizeof *e);
    e->version = EVENT_VERSION;
    return e;
}

void eventlist_clear(EventList *l)
{
    for (size_t i = 0; i < l->len; i++)
        event_clear(&l->items[i]);
    l->len = 0;
}

void eventlist_free(EventList *l)
{
    eventlist_clear(l);
    free(l->items);
    eventlist_init(l);
}
