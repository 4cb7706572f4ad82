/* ws_testlib: what the WorkState and event tests share. A CHECK that says in
 * words what went wrong, JSON helpers for messages, a tiny stand-in for the
 * manager that stamps and applies decided events as server/manager/manager.c
 * emit() does, and a C mirror of the workd_project() trigger of
 * migrations/0001_init.sql, so recovery (journal_recover + ws_restore) can be
 * tested without a database. Header-only: everything is static inline, so a
 * test uses what it needs without unused-function warnings. */
#ifndef WORKD_WS_TESTLIB_H
#define WORKD_WS_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "event.h"
#include "hmap.h"
#include "util.h"
#include "projection.h"
#include "record.h"
#include "workstate.h"

/* Fails the test with a sentence when cond is false. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

/* 2026-01-01T00:00:00Z: tests never run at time 0, where 0 means "none". */
#define T0 INT64_C(1767225600000)

/* ---- JSON for messages ---- */

/* Compact text with sorted keys (caller frees); "(null)" for NULL. */
static inline char *jtext(const json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    return s ? s : xstrdup("(null)");
}

static inline char *jtext_trunc(const json_t *j, size_t max)
{
    char *s = jtext(j);
    if (strlen(s) > max)
        strcpy(s + max - 3, "...");
    return s;
}

/* NULL when want and got are equal JSON, else a sentence saying how they
 * differ (caller frees). For two arrays of objects (state_dump images) it names
 * the first item and key that differ. */
static inline char *json_diff(const char *what, json_t *want, json_t *got)
{
    if (json_equal(want, got))
        return NULL;
    SBuf b;
    sbuf_init(&b);
    char *sa = NULL, *sb = NULL;
    if (json_is_array(want) && json_is_array(got)) {
        size_t n = json_array_size(want) < json_array_size(got) ? json_array_size(want)
                                                                : json_array_size(got);
        for (size_t i = 0; i < n && !sa; i++) {
            json_t *a = json_array_get(want, i), *g = json_array_get(got, i), *v;
            if (json_equal(a, g))
                continue;
            const char *key = NULL;
            if (json_is_object(a) && json_is_object(g)) {
                json_object_foreach(a, key, v)
                {
                    if (!json_equal(v, json_object_get(g, key)))
                        break;
                }
                if (!key) {
                    json_object_foreach(g, key, v)
                    {
                        if (!json_object_get(a, key))
                            break;
                    }
                }
            }
            sa = jtext_trunc(a, 600);
            sb = jtext_trunc(g, 600);
            sbuf_printf(&b, "%s: item %zu differs (first at '%s'):\n  expected %s\n  actual   %s",
                        what, i, key ? key : "?", sa, sb);
        }
    }
    if (!sa) {
        sa = jtext_trunc(want, 1500);
        sb = jtext_trunc(got, 1500);
        sbuf_printf(&b, "%s differs:\n  expected %s\n  actual   %s", what, sa, sb);
    }
    free(sa);
    free(sb);
    return sbuf_steal(&b);
}

/* Fails unless want and got are equal JSON, saying how they differ. */
static inline void check_json_equal(const char *what, json_t *want, json_t *got)
{
    char *d = json_diff(what, want, got);
    if (d)
        fail_msg("%s", d);
}

/* Parses JSON text written by the test itself (a typo is the test's bug). */
static inline json_t *J(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    CHECK(j != NULL, "the test's own JSON '%s' does not parse: %s", text, je.text);
    return j;
}

/* ---- the WorkState as JSON, for comparing states ---- */

static inline int dump_by_seq(const void *a, const void *b)
{
    const WorkItem *x = *(WorkItem *const *)a, *y = *(WorkItem *const *)b;
    return (x->accepted_seq > y->accepted_seq) - (x->accepted_seq < y->accepted_seq);
}

/* A canonical image of the open work (by acceptance), a new reference. */
static inline json_t *state_dump(const WorkState *ws)
{
    size_t n = ws_open_count(ws), j = 0;
    const WorkItem **all = xcalloc(n + 1, sizeof *all);
    const WorkItem *it;
    for (size_t i = 0; (it = ws_item_next(ws, &i));)
        all[j++] = it;
    qsort(all, n, sizeof *all, dump_by_seq);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        it = all[i];
        json_array_append_new(
            arr,
            json_pack("{s:s, s:s, s:i, s:O, s:I, s:I, s:i, s:I, s:s, s:i, s:s?, s:I, s:s?, "
                      "s:i}",
                      "id", it->id, "queue", it->queue, "priority", it->priority, "payload",
                      it->payload, "run_at", (json_int_t)it->run_at, "timeout_ms",
                      (json_int_t)it->timeout_ms, "max_attempts", it->max_attempts, "accepted_seq",
                      (json_int_t)it->accepted_seq, "status",
                      it->status == WORK_RUNNING   ? "running"
                      : it->status == WORK_WAITING ? "waiting"
                                                   : "pending",
                      "attempt", it->attempt, "worker_id", it->worker_id, "deadline",
                      (json_int_t)it->deadline, "last_error", it->last_error, "where", it->where));
    }
    free(all);
    return arr;
}

/* ws_queue_stats as {"queue": {"pending": n, "scheduled": n, "running": n}}. */
static inline json_t *queue_stats_json(const WorkState *ws, int64_t now)
{
    size_t n;
    WsQueueStats *st = ws_queue_stats(ws, now, &n);
    json_t *out = json_object();
    for (size_t i = 0; i < n; i++)
        json_object_set_new(out, st[i].queue,
                            json_pack("{s:I, s:I, s:I, s:I}", "waiting", (json_int_t)st[i].waiting,
                                      "pending", (json_int_t)st[i].pending, "scheduled",
                                      (json_int_t)st[i].scheduled, "running",
                                      (json_int_t)st[i].running));
    free(st);
    return out;
}

/* A heartbeat's running list from [{"id": ..., "attempt": n}, ...] (NULL: NULL). */
static inline RunningList *running_list(const json_t *arr)
{
    if (!arr)
        return NULL;
    RunningList *l = xcalloc(1, sizeof *l);
    l->n = json_array_size(arr);
    l->items = xcalloc(l->n + 1, sizeof *l->items);
    for (size_t i = 0; i < l->n; i++) {
        json_t *r = json_array_get(arr, i);
        l->items[i].work_id = xstrdup(json_string_value(json_object_get(r, "id")));
        l->items[i].attempt = json_integer_value(json_object_get(r, "attempt"));
    }
    return l;
}

/* ---- events ---- */

/* "accepted started ..." for the events of l from index first on (caller frees). */
static inline char *event_types(const EventList *l, size_t first)
{
    SBuf b;
    sbuf_init(&b);
    for (size_t i = first; i < l->len; i++)
        sbuf_printf(&b, "%s%s", i > first ? " " : "", event_type_name(l->items[i].type));
    return sbuf_steal(&b);
}

/* Fails unless the events of l from first on have exactly the given types. */
static inline void check_event_types(const char *what, const EventList *l, size_t first,
                                     const char *want)
{
    char *got = event_types(l, first);
    CHECK(!strcmp(got, want), "%s: expected the events [%s] but got [%s]", what, want, got);
    free(got);
}

static inline bool str_eq(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

/* NULL counts as JSON null: the encoding writes null for a missing value. */
static inline bool json_eq_null(json_t *a, json_t *b)
{
    return json_equal(a ? a : json_null(), b ? b : json_null());
}

/* NULL when a and b are the same event field by field, else the fields that
 * differ, as "field: a != b;" (caller frees). */
/* A subscription on one line, every field of it, for comparing and for
 * messages (NULL: "(none)"); the caller frees. */
static inline char *sub_text(const Subscription *s)
{
    if (!s)
        return xstrdup("(none)");
    SBuf b;
    sbuf_init(&b);
    sbuf_printf(&b, "%s url=%s secret=%s queues=", s->name ? s->name : "(null)",
                s->url ? s->url : "(null)", s->secret ? s->secret : "(null)");
    if (!s->queues)
        sbuf_puts(&b, "(all)");
    for (size_t i = 0; s->queues && s->queues[i]; i++)
        sbuf_printf(&b, "%s%s", i ? "," : "", s->queues[i]);
    sbuf_puts(&b, " kinds=");
    for (size_t i = 0; s->kinds && s->kinds[i]; i++)
        sbuf_printf(&b, "%s%s", i ? "," : "", s->kinds[i]);
    char cursor[CURSOR_TEXT_MAX];
    cursor_format(&s->cursor, cursor, sizeof cursor);
    sbuf_printf(&b, " paused=%d reason=%s cursor=%s", s->paused,
                s->paused_reason ? s->paused_reason : "(null)", cursor);
    return sbuf_steal(&b);
}

/* A place in a cluster of one shard (a subscription's start or cursor);
 * AT(x) points at one for the length of the full expression. */
#define AT(x) (&(Cursor){.n = 1, .seq = {(x)}})
static inline Cursor at_seq(int64_t seq)
{
    Cursor c;
    cursor_zero(&c, 1);
    c.seq[0] = seq;
    return c;
}

static inline char *event_diff(const Event *a, const Event *b)
{
    SBuf m;
    sbuf_init(&m);
#define EVD_INT(f)                                                                                 \
    if (a->f != b->f)                                                                              \
    sbuf_printf(&m, " %s: %lld != %lld;", #f, (long long)a->f, (long long)b->f)
#define EVD_STR(f)                                                                                 \
    if (!str_eq(a->f, b->f))                                                                       \
    sbuf_printf(&m, " %s: '%s' != '%s';", #f, a->f ? a->f : "(null)", b->f ? b->f : "(null)")
#define EVD_JSON_VALUES(f, x, y)                                                                   \
    do {                                                                                           \
        if (!json_eq_null(x, y)) {                                                                 \
            char *tx = jtext(x), *ty = jtext(y);                                                   \
            sbuf_printf(&m, " %s: %s != %s;", #f, tx, ty);                                         \
            free(tx);                                                                              \
            free(ty);                                                                              \
        }                                                                                          \
        json_decref(x);                                                                            \
        json_decref(y);                                                                            \
    } while (0)
#define EVD_JSON(f)                                                                                \
    if (!json_eq_null(a->f, b->f)) {                                                               \
        char *x = jtext(a->f), *y = jtext(b->f);                                                   \
        sbuf_printf(&m, " %s: %s != %s;", #f, x, y);                                               \
        free(x);                                                                                   \
        free(y);                                                                                   \
    }
    EVD_INT(seq);
    EVD_INT(term);
    EVD_INT(at);
    EVD_INT(type);
    EVD_INT(version);
    EVD_STR(work_id);
    EVD_STR(queue);
    EVD_STR(key);
    EVD_INT(priority);
    EVD_JSON(payload);
    EVD_INT(run_at);
    EVD_INT(timeout_ms);
    EVD_INT(max_attempts);
    EVD_INT(attempt);
    EVD_STR(worker_id);
    EVD_INT(deadline);
    EVD_JSON(result);
    EVD_STR(error);
    EVD_STR(reason);
    EVD_INT(retry_at);
    EVD_INT(new_term);
    EVD_STR(leader_url);
    EVD_INT(limits.paused);
    EVD_INT(limits.max_running);
    EVD_INT(limits.max_running_per_key);
    EVD_INT(limits.rate_limit);
    EVD_INT(limits.rate_period_ms);
    EVD_INT(has_fraction);
    if (a->fraction != b->fraction)
        sbuf_printf(&m, " fraction: %g != %g;", a->fraction, b->fraction);
    EVD_STR(message);
    EVD_STR(output);
    EVD_INT(sub_deleted);
    EVD_INT(sub_reset);
    {
        char x[CURSOR_TEXT_MAX], y[CURSOR_TEXT_MAX];
        cursor_format(&a->sub_start, x, sizeof x);
        cursor_format(&b->sub_start, y, sizeof y);
        if (strcmp(x, y))
            sbuf_printf(&m, " sub_start: %s != %s;", x, y);
    }
    {
        char *x = sub_text(a->sub), *y = sub_text(b->sub);
        if (strcmp(x, y))
            sbuf_printf(&m, " sub: %s != %s;", x, y);
        free(x);
        free(y);
    }
    EVD_INT(run_anyway);
    EVD_INT(waiting);
    EVD_STR(batch);
    EVD_STR(traceparent);
    EVD_STR(tracestate);
    EVD_STR(schedule);
    EVD_INT(tick);
    EVD_STR(tick_work);
    EVD_STR(skipped);
    EVD_STR(callback_id);
    EVD_INT(missed);
    EVD_INT(counts[0]);
    EVD_INT(counts[1]);
    EVD_INT(counts[2]);
    if ((a->after == NULL) != (b->after == NULL) || (a->after && !json_equal(a->after, b->after)))
        sbuf_printf(&m, " after: %zu parents != %zu;", a->after ? json_array_size(a->after) : 0,
                    b->after ? json_array_size(b->after) : 0);
    {
        json_t *x = a->sched ? schedspec_json(a->sched) : NULL;
        json_t *y = b->sched ? schedspec_json(b->sched) : NULL;
        EVD_JSON_VALUES(sched, x, y);
        x = a->callback ? template_json(a->callback) : NULL;
        y = b->callback ? template_json(b->callback) : NULL;
        EVD_JSON_VALUES(callback, x, y);
    }
    EVD_INT(limits.n_weights);
    for (size_t i = 0; i < a->limits.n_weights && i < b->limits.n_weights; i++) {
        EVD_STR(limits.weights[i].key);
        EVD_INT(limits.weights[i].weight);
    }
#undef EVD_INT
#undef EVD_STR
#undef EVD_JSON
#undef EVD_JSON_VALUES
    if (m.len == 0) {
        sbuf_free(&m);
        return NULL;
    }
    return sbuf_steal(&m);
}

/* Stores e as the event table would (its data column as JSON text) and reads
 * it back with event_decode. Returns event_decode's result; out is the
 * caller's to clear on success. */
static inline int event_through_table(const Event *e, Event *out, Err *err)
{
    /* As the leader writes it into a log record and a reader reads it back
     * (server/store/record.h). */
    SBuf line;
    sbuf_init(&line);
    record_line(&line, e);
    const char *p = line.data;
    LogLine l;
    int rc = record_next(&p, line.data + line.len, &l, err);
    CHECK(rc == 1, "the line of a %s event is not a record line: %s", event_type_name(e->type),
          line.data);
    CHECK(l.seq == e->seq && l.at == e->at && !strcmp(l.type, event_type_name(e->type)),
          "the prefix of a %s event's line reads back otherwise: %s", event_type_name(e->type),
          line.data);
    rc = record_decode(&l, e->term, out, err);
    sbuf_free(&line);
    return rc;
}

/* ---- the projection (workd_work), folded by the server's own projection.c ---- */

typedef struct Proj {
    HMap rows;     /* id -> ProjRow, as the table holds them */
    HMap reopened; /* ids reopened by a retried event (test bookkeeping) */
} Proj;

static inline void proj_init(Proj *p)
{
    hmap_init(&p->rows);
    hmap_init(&p->reopened);
}

static inline void proj_free(Proj *p)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&p->rows, &i, &k, &v);) {
        projrow_clear(v);
        free(v);
    }
    hmap_free(&p->rows);
    hmap_free(&p->reopened);
}

static inline const ProjRow *proj_get(const Proj *p, const char *id)
{
    return hmap_get(&p->rows, id);
}

/* What the manager knows of finished work from its row (borrowed strings). */
static inline KnownWork known_of_row(const ProjRow *row)
{
    return (KnownWork){.id = row->id,
                       .status = row->status,
                       .attempts = row->attempts,
                       .payload = row->payload,
                       .queue = row->queue,
                       .priority = row->priority,
                       .timeout_ms = row->timeout_ms,
                       .max_attempts = row->max_attempts,
                       .last_error = row->last_error,
                       .batch = row->batch,
                       .traceparent = row->traceparent,
                       .tracestate = row->tracestate};
}

static inline bool proj_reopened(const Proj *p, const char *id)
{
    return hmap_get(&p->reopened, id) != NULL;
}

/* Folds one event into the table as the leader does: a row per work item,
 * created by its accepted event, updated by the rest (projrow_fold). */
static inline void proj_apply(Proj *p, const Event *e)
{
    if (!e->work_id)
        return;
    ProjRow *r = hmap_get(&p->rows, e->work_id);
    if (e->type == EV_ACCEPTED) {
        CHECK(r == NULL,
              "seq %lld accepts '%s' a second time: the unique index "
              "workd_events_accepted_id would refuse the commit",
              (long long)e->seq, e->work_id);
        r = xmalloc(sizeof *r);
        projrow_init(r, e->work_id);
        hmap_put(&p->rows, r->id, r);
    }
    if (!r)
        return;
    projrow_fold(r, e);
    if (e->type == EV_RETRIED && !proj_reopened(p, r->id))
        hmap_put(&p->reopened, r->id, r);
}

static inline int proj_by_seq(const void *a, const void *b)
{
    const ProjRow *x = *(const ProjRow *const *)a, *y = *(const ProjRow *const *)b;
    return (x->accepted_seq > y->accepted_seq) - (x->accepted_seq < y->accepted_seq);
}

/* Loads the open rows into ws as journal_recover() does: in accepted_seq
 * order, worker and deadline only for running work. Returns how many. */
static inline size_t proj_restore(const Proj *p, WorkState *ws)
{
    ProjRow **open = xcalloc(p->rows.len + 1, sizeof *open);
    size_t n = 0;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&p->rows, &i, &k, &v);) {
        ProjRow *r = v;
        if (!strcmp(r->status, "pending") || !strcmp(r->status, "running") ||
            !strcmp(r->status, "waiting"))
            open[n++] = r;
    }
    qsort(open, n, sizeof *open, proj_by_seq);
    for (size_t i = 0; i < n; i++) {
        const ProjRow *r = open[i];
        bool running = !strcmp(r->status, "running");
        char **after = NULL;
        if (r->after) {
            after = xcalloc(json_array_size(r->after) + 1, sizeof *after);
            for (size_t j = 0; j < json_array_size(r->after); j++)
                after[j] = (char *)json_string_value(json_array_get(r->after, j));
        }
        WorkItem it = {
            .id = r->id,
            .queue = r->queue,
            .priority = r->priority,
            .payload = r->payload,
            .status = running                         ? WORK_RUNNING
                      : !strcmp(r->status, "waiting") ? WORK_WAITING
                                                      : WORK_PENDING,
            .after = after,
            .run_anyway = r->after_policy && !strcmp(r->after_policy, "run"),
            .batch = r->batch,
            .attempt = r->attempts,
            .max_attempts = r->max_attempts,
            .timeout_ms = r->timeout_ms,
            .run_at = r->run_at,
            .accepted_seq = r->accepted_seq,
            .created_at = r->created_at,
            .worker_id = running ? r->worker_id : NULL,
            .deadline = running ? r->deadline : 0,
            .started_at = r->started_at,
            .last_error = r->last_error,
        };
        ws_restore(ws, &it);
        free(after);
    }
    free(open);
    ws_restore_links(ws);
    return n;
}

/* ---- a stand-in for the manager ---- */

typedef struct Sim {
    WsConfig cfg;
    WorkState *ws;
    int64_t now, seq, term;
    EventList out; /* decided, not yet emitted */
    EventList log; /* every emitted event, in seq order */
    Proj proj;     /* workd_work as the log makes it */
} Sim;

static inline void sim_init(Sim *s, const WsConfig *cfg, int64_t now)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->ws = ws_new(cfg);
    s->now = now;
    s->term = 1;
    eventlist_init(&s->out);
    eventlist_init(&s->log);
    proj_init(&s->proj);
}

static inline void sim_free(Sim *s)
{
    ws_free(s->ws);
    eventlist_free(&s->out);
    eventlist_free(&s->log);
    proj_free(&s->proj);
}

/* Stamps the decided events with seq, term and now, applies them and moves
 * them to the log, as manager.c emit() does. Returns the log index of the
 * first one. */
static inline void sim_emit_one(Sim *s, Event *e)
{
    EventList more;
    eventlist_init(&more);
    e->seq = ++s->seq;
    e->term = s->term;
    e->at = s->now;
    ws_decide_followups(s->ws, e, s->now, &more);
    ws_apply(s->ws, e);
    if (e->type == EV_STARTED) /* the sim's commit is at once, as its answer's hand-out */
        ws_handed(s->ws, e->work_id, e->attempt, s->now);
    proj_apply(&s->proj, e);
    Event *dst = eventlist_push(&s->log);
    *dst = *e;
    memset(e, 0, sizeof *e);
    for (size_t i = 0; i < more.len; i++) {
        if (ws_followup_stale(s->ws, &more.items[i]))
            event_clear(&more.items[i]);
        else
            sim_emit_one(s, &more.items[i]);
    }
    eventlist_free(&more);
}

static inline size_t sim_emit(Sim *s)
{
    size_t first = s->log.len;
    for (size_t i = 0; i < s->out.len; i++)
        sim_emit_one(s, &s->out.items[i]);
    s->out.len = 0;
    return first;
}

/* A fresh WorkState rebuilt from the log (ws_apply in order, then ws_advance). */
static inline WorkState *sim_replay(const Sim *s)
{
    WorkState *ws = ws_new(&s->cfg);
    for (size_t i = 0; i < s->log.len; i++)
        ws_apply(ws, &s->log.items[i]);
    ws_advance(ws, s->now);
    return ws;
}

/* A fresh WorkState recovered from the projection, as a new leader does. */
static inline WorkState *sim_recover(const Sim *s)
{
    WorkState *ws = ws_new(&s->cfg);
    proj_restore(&s->proj, ws);
    ws_advance(ws, s->now);
    return ws;
}

/* NULL when other holds the same open work as the live state at now, else a
 * sentence saying how they differ (caller frees). Besides state_dump it compares
 * the times state_dump leaves out (created_at, started_at). */
static inline char *state_diff(const char *what, Sim *s, WorkState *other)
{
    ws_advance(s->ws, s->now);
    json_t *live = state_dump(s->ws), *got = state_dump(other), *it;
    char *d = json_diff(what, live, got);
    size_t i;
    json_array_foreach(live, i, it)
    {
        if (d)
            break;
        const char *id = json_string_value(json_object_get(it, "id"));
        const WorkItem *a = ws_get(s->ws, id), *b = ws_get(other, id);
        const ProjRow *r = proj_get(&s->proj, id);
        /* A retried event does not carry when the work was first created or
         * last started (nothing depends on them); the projection keeps them. */
        bool reopened = r && proj_reopened(&s->proj, id);
        if ((!reopened && a->created_at != b->created_at) ||
            ((!reopened || a->status == WORK_RUNNING) && a->started_at != b->started_at)) {
            SBuf m;
            sbuf_init(&m);
            sbuf_printf(&m, "%s: '%s' was created at %lld and started at %lld, not %lld and %lld",
                        what, id, (long long)a->created_at, (long long)a->started_at,
                        (long long)b->created_at, (long long)b->started_at);
            d = sbuf_steal(&m);
        }
    }
    json_decref(live);
    json_decref(got);
    return d;
}

/* ---- building submissions ---- */

/* Fills it with owned copies; payload is JSON text. */
static inline void item_set(SubmitItem *it, const char *id, const char *queue, int priority,
                            const char *payload, int64_t run_at, int64_t timeout_ms,
                            int max_attempts)
{
    it->id = xstrdup(id);
    it->queue = xstrdup(queue);
    it->priority = priority;
    it->payload = J(payload);
    it->run_at = run_at;
    it->timeout_ms = timeout_ms;
    it->max_attempts = max_attempts;
}

static inline void items_clear(SubmitItem *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(items[i].id);
        free(items[i].queue);
        free(items[i].key);
        json_decref(items[i].payload);
        strv_free(items[i].after);
        free(items[i].batch);
        free(items[i].traceparent);
        free(items[i].tracestate);
        memset(&items[i], 0, sizeof items[i]);
    }
}

#endif
