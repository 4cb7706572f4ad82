/* render: see render.h. */
#include "render.h"

#include "util.h"

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
                     "fraction", p->has_fraction ? json_real(p->fraction) : json_null(),
                     "message", str_json(p->message), "at", at_json(p->at));
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
        json_array_append_new(
            arr, json_pack("{s:I, s:I, s:o, s:s, s:i, s:O}", "seq", (json_int_t)x->seq, "term",
                           (json_int_t)x->term, "at", at_json(x->at), "type", x->type, "version",
                           x->version, "data", x->data ? x->data : json_null()));
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
            items, json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:o, s:o, s:o, s:o}", "id", w->id,
                             "queue", w->queue, "priority", w->priority, "status", w->status,
                             "attempts", w->attempts, "max_attempts", w->max_attempts,
                             "created_at", at_json(w->created_at), "finished_at",
                             at_json(w->finished_at), "worker_id", str_json(w->worker_id),
                             "last_error", str_json(w->last_error)));
    }
    return json_pack("{s:o, s:o}", "items", items, "next_before",
                     l->next_before ? json_integer(l->next_before) : json_null());
}
