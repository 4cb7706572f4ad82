/* view: see view.h. */
#include "view.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "db.h"
#include "event.h"
#include "log.h"
#include "record.h"
#include "rows.h"
#include "shard.h"
#include "util.h"

static char *str_or_null(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : xstrdup(PQgetvalue(r, row, col));
}

static int64_t time_or_none(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? VIEW_NO_TIME : db_int(r, row, col);
}

/* A JSON array of strings (a jsonb column) as a strv; never NULL. */
static char **strv_of_json(const PGresult *r, int row, int col)
{
    json_t *a = rows_json(r, row, col);
    char **v = event_strv(a);
    json_decref(a);
    if (!v)
        v = xcalloc(1, sizeof *v);
    return v;
}

/* ---- the log's records (record.h) ----
 * A reader meets each line of a record and keeps the ones it wants: fn
 * returns 1 to go on, 0 to stop, -1 on an error. */
typedef int (*LineFn)(const LogLine *l, int64_t term, void *ud, Err *err);

/* Each line of a record's text (term, events) to fn, oldest first: 1 when
 * fn took them all, 0 when it stopped, -1 on an error. */
static int record_each(int64_t term, const char *text, size_t len, LineFn fn, void *ud, Err *err)
{
    const char *p = text, *end = text + len;
    LogLine l;
    int rc;
    while ((rc = record_next(&p, end, &l, err)) == 1)
        if ((rc = fn(&l, term, ud, err)) != 1)
            return rc;
    return rc < 0 ? -1 : 1;
}

/* A sorted list of seqs. */
typedef struct Seqs {
    int64_t *v;
    size_t n;
} Seqs;

static bool seqs_has(const Seqs *s, int64_t seq)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->v[mid] == seq)
            return true;
        if (s->v[mid] < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

typedef struct SeqsVisit {
    const Seqs *want;
    LineFn fn;
    void *ud;
} SeqsVisit;

static int visit_wanted(const LogLine *l, int64_t term, void *ud, Err *err)
{
    SeqsVisit *v = ud;
    return seqs_has(v->want, l->seq) ? v->fn(l, term, v->ud, err) : 1;
}

/* The events of these seqs (sorted), oldest first, to fn: each record that
 * holds one is read once, through the index on last_seq, SEQS_READ seqs and
 * about READ_BYTES of records a read, so that a long history is read a page
 * at a time (and no further than fn wants) and a large record or two do not
 * bring a read's worth of them into memory at once. A seq whose record is
 * gone with its part is skipped. */
static int log_read_seqs(PGconn *c, int shard, const Seqs *want, LineFn fn, void *ud, Err *err)
{
    char sh[16];
    snprintf(sh, sizeof sh, "%d", shard);
    enum { SEQS_READ = 64, READ_BYTES = 1 << 20 };
    int rc = 1;
    size_t from = 0;
    while (from < want->n && rc == 1) {
        Seqs part = {want->v + from, want->n - from < SEQS_READ ? want->n - from : SEQS_READ};
        char *arr = seqs_array(part.v, part.n), bytes[24];
        snprintf(bytes, sizeof bytes, "%d", READ_BYTES);
        const char *params[] = {arr, bytes, sh};
        /* Planned once per session: planning over every part costs more
         * than the lookups. Sizes come from the values' headers. */
        PGresult *r = db_exec_cached(
            c, "workd_log_at",
            "SELECT term, events, last_seq"
            "  FROM (SELECT k.*, sum(octet_length(k.events)) OVER (ORDER BY k.last_seq)"
            "                 - octet_length(k.events) AS before"
            "          FROM (SELECT DISTINCT ON (l.last_seq) l.term, l.events, l.last_seq"
            "                  FROM unnest($1::bigint[]) AS s(seq) CROSS JOIN LATERAL"
            "                       (SELECT last_seq, first_seq, term, events FROM workd_log"
            "                         WHERE shard = $3::int AND last_seq >= s.seq"
            "                         ORDER BY last_seq LIMIT 1) l"
            "                 WHERE l.first_seq <= s.seq ORDER BY l.last_seq) k) w"
            " WHERE before < $2::bigint ORDER BY last_seq",
            3, params, "reading the log", err);
        free(arr);
        if (!r)
            return -1;
        SeqsVisit v = {&part, fn, ud};
        int n = PQntuples(r);
        int64_t last = 0;
        for (int i = 0; i < n && rc == 1; i++) {
            rc = record_each(db_int(r, i, 0), PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1),
                             visit_wanted, &v, err);
            last = db_int(r, i, 2);
        }
        PQclear(r);
        if (n == 0) /* every record of these seqs is gone */
            from += part.n;
        while (n > 0 && from < want->n && want->v[from] <= last)
            from++;
    }
    return rc < 0 ? -1 : 0;
}

/* Appends the elements of an array literal ("{1,2,3}") greater than after. */
static void seqs_parse(const char *text, int64_t after, Seqs *out)
{
    size_t cap = out->n + 2;
    for (const char *p = text; *p; p++)
        cap += *p == ',';
    out->v = xrealloc(out->v, cap * sizeof *out->v);
    for (const char *p = text; *p;) {
        char *stop;
        long long v = strtoll(p + 1, &stop, 10);
        if (stop == p + 1)
            break;
        if (v > after)
            out->v[out->n++] = v;
        p = stop;
    }
}

/* The seqs of a work item's events after `after`, in order: its row's
 * history, and its progress reports, at most max of them (a page's worth):
 * when there are more, *cut is set and the list ends at the last report
 * read. *found is false if no row has the id; else *shard is the shard whose
 * log holds them. */
WARN_UNUSED static int work_seqs(PGconn *c, const char *id, int64_t after, int max, Seqs *out,
                                 int *shard, bool *found, bool *cut, Err *err)
{
    memset(out, 0, sizeof *out);
    char a[24], m[16];
    snprintf(a, sizeof a, "%lld", (long long)after);
    snprintf(m, sizeof m, "%d", max);
    const char *params[] = {id, a, m};
    PGresult *r = db_exec(c,
                          "SELECT h.history::text, h.shard,"
                          "       (SELECT array_agg(p.seq ORDER BY p.seq)::text"
                          "          FROM (SELECT seq FROM workd_progress WHERE work_id = $1"
                          "                   AND seq > $2::bigint ORDER BY seq LIMIT $3::int) p)"
                          "  FROM (SELECT history, shard FROM workd_open WHERE id = $1"
                          "        UNION ALL"
                          "        SELECT history, shard FROM workd_done WHERE id = $1 LIMIT 1) h",
                          3, params, "reading a work item's history", err);
    if (!r)
        return -1;
    *found = PQntuples(r) > 0;
    Seqs hist = {0}, prog = {0};
    if (*found) {
        seqs_parse(PQgetisnull(r, 0, 0) ? "{}" : PQgetvalue(r, 0, 0), after, &hist);
        *shard = (int)db_int(r, 0, 1);
        seqs_parse(PQgetisnull(r, 0, 2) ? "{}" : PQgetvalue(r, 0, 2), after, &prog);
    }
    PQclear(r);
    *cut = prog.n >= (size_t)max;
    int64_t end = *cut ? prog.v[prog.n - 1] : INT64_MAX;
    /* Both in order: merged, up to the last report read when there are more. */
    out->v = xcalloc(hist.n + prog.n + 1, sizeof *out->v);
    size_t i = 0, j = 0;
    while ((i < hist.n && hist.v[i] <= end) || j < prog.n)
        out->v[out->n++] =
            j == prog.n || (i < hist.n && hist.v[i] < prog.v[j]) ? hist.v[i++] : prog.v[j++];
    free(hist.v);
    free(prog.v);
    return 0;
}

static int keep_progress(const LogLine *l, int64_t term, void *ud, Err *err)
{
    WorkView *w = ud;
    Event e;
    if (record_decode(l, term, &e, err) != 0)
        return -1;
    w->has_progress = true;
    w->progress = (WorkProgress){
        .seq = e.seq,
        .at = e.at,
        .attempt = e.attempt,
        .has_fraction = e.has_fraction,
        .fraction = e.fraction,
        .message = e.message, /* taken */
    };
    e.message = NULL;
    event_clear(&e);
    return 0;
}

/* The work's latest progress report. */
WARN_UNUSED static int read_progress(PGconn *c, const char *id, WorkView *w, Err *err)
{
    const char *params[] = {id};
    PGresult *r = db_exec(c,
                          "SELECT max(seq), (SELECT shard FROM workd_open WHERE id = $1"
                          "                  UNION ALL"
                          "                  SELECT shard FROM workd_done WHERE id = $1 LIMIT 1)"
                          "  FROM workd_progress WHERE work_id = $1",
                          1, params, "reading progress", err);
    if (!r)
        return -1;
    int64_t seq = PQgetisnull(r, 0, 0) ? 0 : db_int(r, 0, 0);
    int shard = (int)db_int(r, 0, 1);
    PQclear(r);
    Seqs one = {&seq, seq ? 1 : 0};
    return log_read_seqs(c, shard, &one, keep_progress, w, err);
}

/* Its children: work that names it in after, open or kept (GIN indexes). */
WARN_UNUSED static int read_children(PGconn *c, const char *id, WorkView *w, Err *err)
{
    json_t *probe = json_pack("[s]", id);
    char *probe_text = json_dumps(probe, JSON_COMPACT);
    json_decref(probe);
    const char *cp[] = {probe_text};
    PGresult *r = db_exec(c,
                          "SELECT id FROM (SELECT id, accepted_seq FROM workd_open"
                          "                 WHERE after IS NOT NULL AND after @> $1::jsonb"
                          "                UNION ALL"
                          "                SELECT id, accepted_seq FROM workd_done"
                          "                 WHERE after IS NOT NULL AND after @> $1::jsonb) k"
                          " ORDER BY accepted_seq LIMIT 1000",
                          1, cp, "reading children", err);
    free(probe_text);
    if (!r)
        return -1;
    w->children = xcalloc((size_t)PQntuples(r) + 1, sizeof *w->children);
    for (int i = 0; i < PQntuples(r); i++)
        w->children[i] = xstrdup(db_str(r, i, 0));
    PQclear(r);
    return 0;
}

/* The work item in this database, or NULL with err (404: not here). */
WARN_UNUSED static WorkView *work_get(PGconn *c, const char *id, int64_t now, Err *err)
{
    const char *params[] = {id};
    PGresult *r = db_exec(
        c,
        "SELECT id, queue, priority, payload::text, status, attempts, max_attempts, timeout_ms,"
        "       workd_epoch_ms(run_at), workd_epoch_ms(created_at), workd_epoch_ms(started_at),"
        "       workd_epoch_ms(finished_at), worker_id, workd_epoch_ms(deadline), NULL, last_error,"
        "       updated_seq, key, after::text, after_policy, batch, trace->>'traceparent',"
        "       trace->>'tracestate', shard"
        "  FROM workd_open WHERE id = $1"
        " UNION ALL "
        "SELECT id, queue, priority, payload::text, status, attempts, max_attempts, timeout_ms,"
        "       NULL, workd_epoch_ms(created_at), workd_epoch_ms(started_at),"
        "       workd_epoch_ms(finished_at), worker_id, NULL, result::text, last_error,"
        "       finished_seq, key, after::text, after_policy, batch, trace->>'traceparent',"
        "       trace->>'tracestate', shard"
        "  FROM workd_done WHERE id = $1"
        " LIMIT 1",
        1, params, "reading work", err);
    if (!r)
        return NULL;
    if (PQntuples(r) == 0) {
        PQclear(r);
        err_set(err, 404, "not-found", "no work with id '%s'", id);
        return NULL;
    }
    const char *status = db_str(r, 0, 4);
    if (!strcmp(status, "pending") && !PQgetisnull(r, 0, 8) && db_int(r, 0, 8) > now)
        status = "scheduled";
    const char *policy = db_str(r, 0, 19);
    WorkView *w = xcalloc(1, sizeof *w);
    *w = (WorkView){
        .id = xstrdup(db_str(r, 0, 0)),
        .queue = xstrdup(db_str(r, 0, 1)),
        .status = xstrdup(status),
        .key = str_or_null(r, 0, 17),
        .batch = str_or_null(r, 0, 20),
        .priority = (int)db_int(r, 0, 2),
        .attempts = (int)db_int(r, 0, 5),
        .max_attempts = (int)db_int(r, 0, 6),
        .timeout_ms = db_int(r, 0, 7),
        .payload = rows_json(r, 0, 3),
        .result = rows_json(r, 0, 14),
        .run_at = time_or_none(r, 0, 8),
        .created_at = time_or_none(r, 0, 9),
        .started_at = time_or_none(r, 0, 10),
        .finished_at = time_or_none(r, 0, 11),
        .deadline = time_or_none(r, 0, 13),
        .worker_id = str_or_null(r, 0, 12),
        .last_error = str_or_null(r, 0, 15),
        .updated_seq = db_int(r, 0, 16),
        .shard = (int)db_int(r, 0, 23),
        .after = PQgetisnull(r, 0, 18) ? xcalloc(1, sizeof(char *)) : strv_of_json(r, 0, 18),
        .run_anyway = policy && !strcmp(policy, "run"),
        .traceparent = str_or_null(r, 0, 21),
        .tracestate = PQgetisnull(r, 0, 21) ? NULL : str_or_null(r, 0, 22),
    };
    PQclear(r);
    if (read_progress(c, id, w, err) != 0 || read_children(c, id, w, err) != 0) {
        view_work_free(w);
        return NULL;
    }
    return w;
}

void view_work_free(WorkView *w)
{
    if (!w)
        return;
    free(w->id);
    free(w->queue);
    free(w->status);
    free(w->key);
    free(w->batch);
    json_decref(w->payload);
    json_decref(w->result);
    free(w->worker_id);
    free(w->last_error);
    strv_free(w->after);
    free(w->traceparent);
    free(w->tracestate);
    free(w->progress.message);
    strv_free(w->children);
    free(w);
}

/* view_schedules of one database. */
WARN_UNUSED static ScheduleList *schedules_in(PGconn *c, const char *name, Err *err)
{
    const char *params[] = {name};
    PGresult *r = db_exec(
        c,
        "SELECT s.name, s.spec::text, s.last_tick, s.last_work, workd_epoch_ms(s.last_fired_at),"
        "       coalesce((SELECT status FROM workd_open WHERE id = s.last_work),"
        "                (SELECT status FROM workd_done WHERE id = s.last_work)),"
        "       workd_epoch_ms(s.updated_at)"
        "  FROM workd_schedules s WHERE $1::text IS NULL OR s.name = $1 ORDER BY s.name",
        1, params, "reading schedules", err);
    if (!r)
        return NULL;
    if (name && PQntuples(r) == 0) {
        PQclear(r);
        err_set(err, 404, "not-found", "no schedule '%s'", name);
        return NULL;
    }
    ScheduleList *l = xcalloc(1, sizeof *l);
    l->len = (size_t)PQntuples(r);
    l->items = xcalloc(l->len + 1, sizeof *l->items);
    for (int i = 0; i < PQntuples(r); i++) {
        ScheduleView *v = &l->items[i];
        json_t *stored = rows_json(r, i, 1);
        ScheduleSpec sp;
        Err e = {0};
        if (schedspec_decode(stored, &sp, &e) == 0) {
            v->spec = xcalloc(1, sizeof *v->spec);
            *v->spec = sp;
            json_decref(stored);
        } else { /* shown as stored, with why it does not fire */
            v->stored = stored;
            v->error = xstrdup(e.msg);
        }
        v->name = xstrdup(db_str(r, i, 0));
        v->last_tick = db_int(r, i, 2);
        v->last_work = str_or_null(r, i, 3);
        v->last_fired_at = time_or_none(r, i, 4);
        v->last_status = str_or_null(r, i, 5);
        v->updated_at = time_or_none(r, i, 6);
    }
    PQclear(r);
    return l;
}

void view_schedules_free(ScheduleList *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->len; i++) {
        ScheduleView *v = &l->items[i];
        free(v->name);
        schedspec_free(v->spec);
        json_decref(v->stored);
        free(v->error);
        free(v->last_work);
        free(v->last_status);
    }
    free(l->items);
    free(l);
}

/* The batch in this database, or NULL with err (404: not here). */
WARN_UNUSED static BatchView *batch_get(PGconn *c, const char *id, int64_t now, Err *err)
{
    const char *params[] = {id};
    PGresult *r =
        db_exec(c,
                "SELECT workd_epoch_ms(opened_at), workd_epoch_ms(finished_at), callback::text,"
                "       callback_id"
                "  FROM workd_batches WHERE id = $1",
                1, params, "reading a batch", err);
    if (!r)
        return NULL;
    if (PQntuples(r) == 0) {
        PQclear(r);
        err_set(err, 404, "not-found", "no batch '%s'", id);
        return NULL;
    }
    BatchView *b = xcalloc(1, sizeof *b);
    b->id = xstrdup(id);
    b->opened_at = time_or_none(r, 0, 0);
    b->finished_at = time_or_none(r, 0, 1);
    b->callback = PQgetisnull(r, 0, 2) ? NULL : rows_json(r, 0, 2);
    b->callback_id = str_or_null(r, 0, 3);
    PQclear(r);
    char nowv[24];
    snprintf(nowv, sizeof nowv, "%lld", (long long)now);
    const char *p2[] = {id, nowv};
    r = db_exec(c,
                "SELECT CASE WHEN status = 'pending' AND run_at > workd_ts($2::bigint)"
                "            THEN 'scheduled' ELSE status END, count(*)"
                "  FROM workd_open WHERE batch = $1 GROUP BY 1"
                " UNION ALL "
                "SELECT status, count(*) FROM workd_done WHERE batch = $1 GROUP BY 1",
                2, p2, "counting a batch", err);
    if (!r) {
        view_batch_free(b);
        return NULL;
    }
    struct {
        const char *status;
        int64_t *n;
    } const by[] = {{"waiting", &b->waiting},     {"pending", &b->pending},
                    {"scheduled", &b->scheduled}, {"running", &b->running},
                    {"completed", &b->completed}, {"dead", &b->dead},
                    {"cancelled", &b->cancelled}};
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t n = db_int(r, i, 1);
        for (size_t k = 0; k < sizeof by / sizeof by[0]; k++)
            if (!strcmp(db_str(r, i, 0), by[k].status))
                *by[k].n += n;
        b->total += n;
    }
    PQclear(r);
    return b;
}

void view_batch_free(BatchView *b)
{
    if (!b)
        return;
    free(b->id);
    json_decref(b->callback);
    free(b->callback_id);
    free(b);
}

static int keep_work_event(const LogLine *l, int64_t term, void *ud, Err *err)
{
    WorkEvents *o = ud;
    WorkEvent *w = &o->items[o->len];
    char *work_id;
    if (record_parts(l, &w->version, &work_id, &w->data, err) != 0)
        return -1;
    free(work_id);
    w->seq = l->seq;
    w->term = term;
    w->at = l->at;
    w->type = xstrdup(l->type);
    o->len++;
    return 1;
}

/* A page of the history of work `id` in this database (empty when it is
 * not here: *found false). */
WARN_UNUSED static WorkEvents *events_in(PGconn *c, const char *id, int64_t after, int limit,
                                         bool *found, Err *err)
{
    Seqs seqs;
    bool cut;
    int shard = 0;
    if (work_seqs(c, id, after, limit + 1, &seqs, &shard, found, &cut, err) != 0)
        return NULL;
    bool more = seqs.n > (size_t)limit || (cut && seqs.n);
    if (more)
        seqs.n = (size_t)limit;
    WorkEvents *o = xcalloc(1, sizeof *o);
    o->id = xstrdup(id);
    o->items = xcalloc(seqs.n + 1, sizeof *o->items);
    int rc = log_read_seqs(c, shard, &seqs, keep_work_event, o, err);
    /* The page's last seq, read or not: the records of a long-open work's
     * first events may be gone with their part, and the history goes on. */
    o->next_after = more ? seqs.v[seqs.n - 1] : 0;
    free(seqs.v);
    if (rc != 0) {
        view_work_events_free(o);
        return NULL;
    }
    return o;
}

void view_work_events_free(WorkEvents *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->len; i++) {
        free(e->items[i].type);
        json_decref(e->items[i].data);
    }
    free(e->items);
    free(e->id);
    free(e);
}

static int sbuf_dump(const char *buf, size_t size, void *b)
{
    sbuf_append(b, buf, size);
    return 0;
}

void view_result_of(const Event *e, ResultEvent *out)
{
    const char *status = event_type_name(e->type);
    SBuf b;
    sbuf_init(&b);
    sbuf_printf(&b, "event: %s\ndata: ", status);
    size_t off = b.len;
    json_t *o = event_result_json(e);
    if (json_dump_callback(o, sbuf_dump, &b, JSON_COMPACT) != 0)
        sbuf_puts(&b, "{}"); /* cannot happen: jansson's own tree */
    json_decref(o);
    size_t data_len = b.len - off;
    sbuf_puts(&b, "\n\n");
    *out = (ResultEvent){
        .seq = e->seq,
        .at = e->at,
        .type = e->type,
        .work_id = xstrdup(e->type == EV_BATCH ? e->batch : e->work_id),
        .queue = xstrdup(e->type == EV_BATCH || !e->queue ? "" : e->queue),
        .frame_len = b.len,
        .data_off = off,
        .data_len = data_len,
    };
    out->frame = sbuf_steal(&b);
}

void view_result_clear(ResultEvent *r)
{
    free(r->work_id);
    free(r->queue);
    free(r->frame);
    memset(r, 0, sizeof *r);
}

void view_results_clear(ResultList *l)
{
    for (size_t i = 0; i < l->len; i++)
        view_result_clear(&l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

ResultEvent *view_results_push(ResultList *l)
{
    if (l->len == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->items = xrealloc(l->items, l->cap * sizeof *l->items);
    }
    ResultEvent *r = &l->items[l->len++];
    memset(r, 0, sizeof *r);
    return r;
}

/* A page of results being read: published events after `after`, at most
 * limit of them, each read while those before it hold less than max_bytes
 * of data. */
typedef struct ResultsPage {
    ResultList *out;
    int64_t after;
    int limit;
    int64_t max_bytes, bytes;
    bool progress;
    bool full; /* a limit was reached: the page ends here */
    int shard; /* whose log is read */
} ResultsPage;

static int keep_result(const LogLine *l, int64_t term, void *ud, Err *err)
{
    ResultsPage *pg = ud;
    if (l->seq <= pg->after)
        return 1;
    EventType t;
    if (event_type_parse(l->type, &t) != 0 || !event_is_published(t) ||
        (t == EV_PROGRESS && !pg->progress))
        return 1;
    if ((int)pg->out->len >= pg->limit || pg->bytes >= pg->max_bytes) {
        pg->full = true;
        return 0;
    }
    Event e;
    if (record_decode(l, term, &e, err) != 0)
        return -1;
    ResultEvent *r = view_results_push(pg->out);
    view_result_of(&e, r);
    r->shard = pg->shard;
    event_clear(&e);
    pg->bytes += (int64_t)r->data_len;
    return 1;
}

/* The log's records after `after`, a few at a time, until the page is full
 * or the log ends. A read takes at most RECORDS records, and of those only
 * the ones that begin before the bytes the page has left (at least one), so
 * that a catch-up over large results holds about a page in memory: the
 * sizes come from the values' headers, without reading the values. */
WARN_UNUSED static int tail_records(PGconn *c, int shard, ResultsPage *pg, bool *at_end, Err *err)
{
    char sh[16];
    snprintf(sh, sizeof sh, "%d", shard);
    enum { RECORDS = 16 };
    int64_t from = pg->after;
    for (;;) {
        if (pg->bytes >= pg->max_bytes) { /* the next result would not fit: the page is full */
            *at_end = false;
            return 0;
        }
        char a[24], l[16], b[24];
        snprintf(a, sizeof a, "%lld", (long long)from);
        snprintf(l, sizeof l, "%d", RECORDS);
        snprintf(b, sizeof b, "%lld", (long long)(pg->max_bytes - pg->bytes));
        const char *params[] = {a, l, b, sh};
        PGresult *r =
            db_exec_cached(c, "workd_log_after",
                           "SELECT term, events, last_seq, n_page"
                           "  FROM (SELECT r.*, count(*) OVER () AS n_page,"
                           "               sum(octet_length(r.events)) OVER (ORDER BY r.last_seq)"
                           "                 - octet_length(r.events) AS before"
                           "          FROM (SELECT term, events, last_seq FROM workd_log"
                           "                 WHERE shard = $4::int AND last_seq > $1::bigint"
                           "                 ORDER BY last_seq LIMIT $2::int) r) w"
                           " WHERE before < $3::bigint ORDER BY last_seq",
                           4, params, "reading the log", err);
        if (!r)
            return -1;
        int n = PQntuples(r), rc = 1;
        int64_t n_page = n ? db_int(r, 0, 3) : 0;
        for (int i = 0; i < n && rc == 1; i++) {
            rc = record_each(db_int(r, i, 0), PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1),
                             keep_result, pg, err);
            from = db_int(r, i, 2);
        }
        PQclear(r);
        if (rc < 0)
            return -1;
        if (pg->full || (n_page < RECORDS && n == n_page)) { /* else: more to read */
            *at_end = !pg->full;
            return 0;
        }
    }
}

int view_finished_after(PGconn *c, int shard, int64_t after, int limit, int64_t max_bytes,
                        bool progress, const char *work_id, ResultList *out, bool *at_end, Err *err)
{
    size_t before = out->len;
    ResultsPage pg = {out, after, limit + (int)before, max_bytes, 0, progress, false, shard};
    if (!work_id) {
        if (tail_records(c, shard, &pg, at_end, err) != 0)
            return -1;
        return (int)(out->len - before);
    }
    /* One work item's: through its row's history and its progress. */
    Seqs seqs;
    bool found, cut;
    if (work_seqs(c, work_id, after, limit + 1, &seqs, &shard, &found, &cut, err) != 0)
        return -1;
    pg.shard = shard;
    int rc = log_read_seqs(c, shard, &seqs, keep_result, &pg, err);
    free(seqs.v);
    if (rc != 0)
        return -1;
    *at_end = !pg.full && !cut;
    return (int)(out->len - before);
}

/* One shard's work newest first by accepted seq, as view_work_list pages it. */
static PGresult *list_shard(PGconn *c, const char *status, const char *queue, int shard,
                            int64_t before, int limit, Err *err)
{
    char b[24], l[16], sh[16];
    snprintf(b, sizeof b, "%lld", (long long)before);
    snprintf(l, sizeof l, "%d", limit);
    snprintf(sh, sizeof sh, "%d", shard);
    const char *params[] = {status, queue, b, l, sh};
    return db_exec(
        c,
        "SELECT * FROM ("
        "  SELECT id, queue, priority,"
        "         CASE WHEN status = 'pending' AND run_at > now() THEN 'scheduled' ELSE status END"
        "           AS status,"
        "         attempts, max_attempts, workd_epoch_ms(created_at), workd_epoch_ms(finished_at),"
        "         worker_id, last_error, accepted_seq"
        "    FROM workd_open"
        "   WHERE shard = $5::int AND ($3::bigint = 0 OR accepted_seq < $3::bigint)"
        "     AND ($2::text IS NULL OR queue = $2)"
        "     AND ($1::text IS NULL OR $1 IN ('waiting', 'pending', 'scheduled', 'running', "
        "'dead'))"
        "  UNION ALL"
        "  SELECT id, queue, priority, status, attempts, max_attempts, workd_epoch_ms(created_at),"
        "         workd_epoch_ms(finished_at), worker_id, last_error, accepted_seq"
        "    FROM workd_done"
        "   WHERE shard = $5::int AND ($3::bigint = 0 OR accepted_seq < $3::bigint)"
        "     AND ($2::text IS NULL OR queue = $2)"
        "     AND ($1::text IS NULL OR $1 IN ('completed', 'cancelled'))"
        ") w"
        " WHERE $1::text IS NULL OR w.status = $1"
        " ORDER BY accepted_seq DESC LIMIT $4::int",
        5, params, "listing work", err);
}

WorkList *view_work_list(ViewDbs *d, const char *status, const char *queue, const Cursor *before,
                         int limit, Err *err)
{
    int n = before->n;
    PGresult *r[SHARDS_MAX] = {0};
    int at[SHARDS_MAX] = {0};
    WorkList *o = NULL;
    for (int s = 0; s < n; s++) {
        PGconn *c = view_shard_db(d, s, err);
        if (!c || !(r[s] = list_shard(c, status, queue, s, before->seq[s], limit, err)))
            goto cleanup;
    }
    /* Each shard's page in its order, merged newest created first and cut at
     * limit: each shard's next `before` is the last of its rows taken, so
     * that pages neither skip nor repeat. */
    o = xcalloc(1, sizeof *o);
    o->items = xcalloc((size_t)limit + 1, sizeof *o->items);
    o->next_before = *before;
    while (o->len < (size_t)limit) {
        int s = -1;
        for (int k = 0; k < n; k++)
            if (at[k] < PQntuples(r[k]) &&
                (s < 0 || db_int(r[k], at[k], 6) > db_int(r[s], at[s], 6)))
                s = k;
        if (s < 0)
            break;
        int i = at[s]++;
        o->items[o->len++] = (WorkSummary){.id = xstrdup(db_str(r[s], i, 0)),
                                           .queue = xstrdup(db_str(r[s], i, 1)),
                                           .status = xstrdup(db_str(r[s], i, 3)),
                                           .priority = (int)db_int(r[s], i, 2),
                                           .attempts = (int)db_int(r[s], i, 4),
                                           .max_attempts = (int)db_int(r[s], i, 5),
                                           .created_at = time_or_none(r[s], i, 6),
                                           .finished_at = time_or_none(r[s], i, 7),
                                           .worker_id = str_or_null(r[s], i, 8),
                                           .last_error = str_or_null(r[s], i, 9)};
        o->next_before.seq[s] = db_int(r[s], i, 10);
    }
    o->more = o->len == (size_t)limit && limit > 0;
cleanup:
    for (int s = 0; s < n; s++)
        PQclear(r[s]);
    return o;
}

void view_work_list_free(WorkList *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->len; i++) {
        WorkSummary *w = &l->items[i];
        free(w->id);
        free(w->queue);
        free(w->status);
        free(w->worker_id);
        free(w->last_error);
    }
    free(l->items);
    free(l);
}

#define READY "status = 'pending' AND (run_at IS NULL OR run_at <= now())"

static int by_queue(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}
/* Sorts n entries of size sz whose first member is their queue's name. */
#define SORT_BY_QUEUE(items, n) qsort((items), (n), sizeof *(items), by_queue)

WARN_UNUSED static OpenCounts *open_counts_in(PGconn *c, Err *err)
{
    PGresult *r = db_exec(
        c,
        "SELECT queue,"
        "       count(*) FILTER (WHERE status = 'pending' AND (run_at IS NULL OR run_at <= now())),"
        "       count(*) FILTER (WHERE status = 'pending' AND run_at > now()),"
        "       count(*) FILTER (WHERE status = 'running'),"
        "       workd_epoch_ms(min(coalesce(run_at, created_at)) FILTER (WHERE " READY ")),"
        "       extract(epoch from now() - min(coalesce(run_at, created_at))"
        "                                  FILTER (WHERE " READY "))::float8,"
        "       count(*) FILTER (WHERE status = 'waiting')"
        "  FROM workd_open WHERE status IN ('pending', 'running', 'waiting') GROUP BY queue",
        0, NULL, "counting open work", err);
    if (!r)
        return NULL;
    OpenCounts *o = xcalloc(1, sizeof *o);
    o->len = (size_t)PQntuples(r);
    o->items = xcalloc(o->len + 1, sizeof *o->items);
    for (int i = 0; i < PQntuples(r); i++)
        o->items[i] = (OpenCount){
            .queue = xstrdup(db_str(r, i, 0)),
            .waiting = db_int(r, i, 6),
            .pending = db_int(r, i, 1),
            .scheduled = db_int(r, i, 2),
            .running = db_int(r, i, 3),
            .oldest_pending_at = time_or_none(r, i, 4),
            .oldest_pending_age_s = PQgetisnull(r, i, 5) ? 0 : atof(db_str(r, i, 5)),
        };
    PQclear(r);
    SORT_BY_QUEUE(o->items, o->len);
    return o;
}

void view_open_counts_free(OpenCounts *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->len; i++)
        free(o->items[i].queue);
    free(o->items);
    free(o);
}

const char *const activity_kinds[ACTIVITY_KINDS] = {"accepted", "completed", "failed", "dead",
                                                    "cancelled"};

static ActivityQueue *activity_queue(Activity *a, const char *name)
{
    for (size_t i = 0; i < a->len; i++)
        if (!strcmp(a->queues[i].queue, name))
            return &a->queues[i];
    a->queues = xrealloc(a->queues, (a->len + 1) * sizeof *a->queues);
    ActivityQueue *q = &a->queues[a->len++];
    q->queue = xstrdup(name);
    for (int k = 0; k < ACTIVITY_KINDS; k++)
        q->count[k] = xcalloc((size_t)a->buckets, sizeof *q->count[k]);
    return q;
}

WARN_UNUSED static Activity *activity_in(PGconn *c, int buckets, Err *err)
{
    char span[24], size[16];
    snprintf(span, sizeof span, "%d", buckets * ACTIVITY_BUCKET_S);
    snprintf(size, sizeof size, "%d", ACTIVITY_BUCKET_S);
    const char *params[] = {span, size};
    PGresult *r = db_exec(
        c,
        "WITH w AS (SELECT (floor(extract(epoch from now()) / $2::int) * $2::int)::bigint AS last) "
        "SELECT w.last, a.bucket, a.queue, a.accepted, a.completed, a.failed, a.dead, a.cancelled"
        "  FROM w LEFT JOIN workd_activity a"
        "    ON a.bucket > w.last - $1::bigint AND a.bucket <= w.last"
        " ORDER BY a.bucket, a.queue",
        2, params, "reading the activity", err);
    if (!r)
        return NULL;
    Activity *a = xcalloc(1, sizeof *a);
    a->buckets = buckets;
    a->start = db_int(r, 0, 0) - (int64_t)(buckets - 1) * ACTIVITY_BUCKET_S;
    for (int i = 0; i < PQntuples(r); i++) {
        if (PQgetisnull(r, i, 1))
            continue; /* no activity at all: the left join's one row */
        ActivityQueue *q = activity_queue(a, db_str(r, i, 2));
        int64_t slot = (db_int(r, i, 1) - a->start) / ACTIVITY_BUCKET_S;
        if (slot < 0 || slot >= buckets)
            continue;
        for (int k = 0; k < ACTIVITY_KINDS; k++)
            q->count[k][slot] = db_int(r, i, 3 + k);
    }
    PQclear(r);
    return a;
}

void view_activity_free(Activity *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->len; i++) {
        free(a->queues[i].queue);
        for (int k = 0; k < ACTIVITY_KINDS; k++)
            free(a->queues[i].count[k]);
    }
    free(a->queues);
    free(a);
}

static KeyCount key_count(const PGresult *r, int i)
{
    return (KeyCount){
        .pending = db_int(r, i, 3), .scheduled = db_int(r, i, 4), .running = db_int(r, i, 5)};
}

WARN_UNUSED static KeyBacklogs *key_backlog_in(PGconn *c, const char *queue, int top, Err *err)
{
    char topv[16];
    snprintf(topv, sizeof topv, "%d", top);
    const char *params[] = {queue, topv};
    PGresult *r = db_exec(
        c,
        "WITH k AS (SELECT queue, key,"
        "       count(*) FILTER (WHERE status = 'pending' AND (run_at IS NULL OR run_at <= now()))"
        "         AS pending,"
        "       count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,"
        "       count(*) FILTER (WHERE status = 'running') AS running"
        "  FROM workd_open WHERE status IN ('pending', 'running')"
        "   AND ($1::text IS NULL OR queue = $1::text) GROUP BY queue, key),"
        " r AS (SELECT *, row_number() OVER (PARTITION BY queue"
        "                 ORDER BY pending DESC, running DESC, key NULLS FIRST) <= $2::int AS top"
        "         FROM k)"
        "SELECT queue, top, CASE WHEN top THEN key END, sum(pending)::bigint,"
        "       sum(scheduled)::bigint, sum(running)::bigint, count(*)"
        "  FROM r GROUP BY queue, top, CASE WHEN top THEN key END"
        " ORDER BY queue, top DESC, 4 DESC, 6 DESC, 3 NULLS FIRST",
        2, params, "counting the backlog per key", err);
    if (!r)
        return NULL;
    KeyBacklogs *out = xcalloc(1, sizeof *out);
    int n = PQntuples(r);
    out->items = xcalloc((size_t)n + 1, sizeof *out->items); /* a queue has a row at least */
    for (int i = 0; i < n; i++) {
        const char *name = db_str(r, i, 0);
        KeyBacklog *q = out->len ? &out->items[out->len - 1] : NULL;
        if (!q || strcmp(q->queue, name) != 0) { /* the rows come queue by queue */
            q = &out->items[out->len++];
            q->queue = xstrdup(name);
        }
        if (!strcmp(PQgetvalue(r, i, 1), "t")) {
            q->keys = xrealloc(q->keys, (q->n_keys + 1) * sizeof *q->keys);
            KeyCount *k = &q->keys[q->n_keys++];
            *k = key_count(r, i);
            k->key = str_or_null(r, i, 2);
        } else {
            q->other = key_count(r, i);
            q->other_keys = db_int(r, i, 6);
        }
    }
    PQclear(r);
    SORT_BY_QUEUE(out->items, out->len);
    return out;
}

void view_key_backlog_free(KeyBacklogs *k)
{
    if (!k)
        return;
    for (size_t i = 0; i < k->len; i++) {
        for (size_t j = 0; j < k->items[i].n_keys; j++)
            free(k->items[i].keys[j].key);
        free(k->items[i].keys);
        free(k->items[i].queue);
    }
    free(k->items);
    free(k);
}

WARN_UNUSED static QueueLimitsList *queue_limits_in(PGconn *c, Err *err)
{
    PGresult *r = db_exec(c, ROWS_QUEUES_SQL, 0, NULL, "reading the queues' limits", err);
    if (!r)
        return NULL;
    QueueLimitsList *o = xcalloc(1, sizeof *o);
    o->len = (size_t)PQntuples(r);
    o->items = xcalloc(o->len + 1, sizeof *o->items);
    for (int i = 0; i < PQntuples(r); i++)
        o->items[i] =
            (QueueLimitsRow){.queue = xstrdup(db_str(r, i, 0)), .limits = rows_queue_limits(r, i)};
    PQclear(r);
    SORT_BY_QUEUE(o->items, o->len);
    return o;
}

void view_queue_limits_free(QueueLimitsList *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->len; i++) {
        free(l->items[i].queue);
        queue_limits_clear(&l->items[i].limits);
    }
    free(l->items);
    free(l);
}

bool view_notify_parse(const char *text, int shards, int *shard, int64_t *n)
{
    char *end;
    const char *colon = strchr(text, ':');
    long k = 0;
    if (colon) {
        k = strtol(text, &end, 10);
        if (end != colon || end == text)
            return false;
        text = colon + 1;
    }
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || k < 0 || k >= shards)
        return false;
    *shard = (int)k;
    *n = v;
    return true;
}

WARN_UNUSED static int work_shard_in(PGconn *c, const char *id, int *shard, Err *err)
{
    const char *params[] = {id};
    PGresult *r = db_exec_cached(c, "workd_work_shard",
                                 "SELECT shard FROM workd_open WHERE id = $1"
                                 " UNION ALL SELECT shard FROM workd_done WHERE id = $1 LIMIT 1",
                                 1, params, "finding a work item's shard", err);
    if (!r)
        return -1;
    *shard = PQntuples(r) ? (int)db_int(r, 0, 0) : -1;
    PQclear(r);
    return 0;
}

/* Fills shards[i] of the ids this database has (the others are left as
 * they are). */
WARN_UNUSED static int work_shards_in(PGconn *c, char *const *ids, size_t n, int *shards, Err *err)
{
    char *arr = text_array(ids, n);
    const char *params[] = {arr};
    PGresult *r =
        db_exec_cached(c, "workd_work_shards",
                       "SELECT k.n, (SELECT shard FROM workd_open WHERE id = k.id"
                       "             UNION ALL"
                       "             SELECT shard FROM workd_done WHERE id = k.id LIMIT 1)"
                       "  FROM unnest($1::text[]) WITH ORDINALITY AS k(id, n)",
                       1, params, "finding work items' shards", err);
    free(arr);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t k = db_int(r, i, 0) - 1;
        if (k >= 0 && k < (int64_t)n && !PQgetisnull(r, i, 1))
            shards[k] = (int)db_int(r, i, 1);
    }
    PQclear(r);
    return 0;
}

WARN_UNUSED static int schedule_shard_in(PGconn *c, const char *name, int *shard, Err *err)
{
    const char *params[] = {name};
    PGresult *r = db_exec(c, "SELECT shard FROM workd_schedules WHERE name = $1", 1, params,
                          "finding a schedule's shard", err);
    if (!r)
        return -1;
    *shard = PQntuples(r) ? (int)db_int(r, 0, 0) : -1;
    PQclear(r);
    return 0;
}

int view_last_seq(PGconn *c, int shard, int64_t *seq, Err *err)
{
    char sh[16];
    snprintf(sh, sizeof sh, "%d", shard);
    const char *params[] = {sh};
    PGresult *r =
        db_exec(c, "SELECT coalesce(max(last_seq), 0) FROM workd_log WHERE shard = $1::int", 1,
                params, "reading the last seq", err);
    if (!r)
        return -1;
    *seq = db_int(r, 0, 0);
    PQclear(r);
    return 0;
}

int view_leader(PGconn *c, int shard, int64_t *term, char *url_out, size_t url_len, Err *err)
{
    char sh[16];
    snprintf(sh, sizeof sh, "%d", shard);
    const char *params[] = {sh};
    PGresult *r = db_exec(c, "SELECT term, url FROM workd_shards WHERE shard = $1::int", 1, params,
                          "reading the leader", err);
    if (!r)
        return -1;
    *term = 0;
    url_out[0] = '\0';
    if (PQntuples(r) == 1) {
        *term = db_int(r, 0, 0);
        snprintf(url_out, url_len, "%s", db_str(r, 0, 1));
    }
    PQclear(r);
    return 0;
}

WARN_UNUSED static FinishedCounts *finished_counts_in(PGconn *c, Err *err)
{
    PGresult *r =
        db_exec(c,
                "SELECT queue, status, sum(n)::bigint FROM workd_counts GROUP BY queue, status"
                " UNION ALL "
                "SELECT queue, status, count(*) FROM workd_open WHERE status = 'dead' GROUP BY "
                "queue, status",
                0, NULL, "counting finished work", err);
    if (!r)
        return NULL;
    FinishedCounts *o = xcalloc(1, sizeof *o);
    o->items = xcalloc((size_t)PQntuples(r) + 1, sizeof *o->items);
    for (int i = 0; i < PQntuples(r); i++) {
        const char *q = db_str(r, i, 0), *st = db_str(r, i, 1);
        FinishedCount *f = NULL;
        for (size_t j = 0; j < o->len && !f; j++)
            if (!strcmp(o->items[j].queue, q))
                f = &o->items[j];
        if (!f) {
            f = &o->items[o->len++];
            f->queue = xstrdup(q);
        }
        int64_t n = db_int(r, i, 2);
        if (!strcmp(st, "completed"))
            f->completed = n;
        else if (!strcmp(st, "dead"))
            f->dead = n;
        else if (!strcmp(st, "cancelled"))
            f->cancelled = n;
    }
    PQclear(r);
    SORT_BY_QUEUE(o->items, o->len);
    return o;
}

FinishedCounts *view_finished_counts_copy(const FinishedCounts *f)
{
    FinishedCounts *o = xcalloc(1, sizeof *o);
    o->len = f->len;
    o->items = xcalloc(f->len + 1, sizeof *o->items);
    for (size_t i = 0; i < f->len; i++) {
        o->items[i] = f->items[i];
        o->items[i].queue = xstrdup(f->items[i].queue);
    }
    return o;
}

void view_finished_counts_free(FinishedCounts *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->len; i++)
        free(f->items[i].queue);
    free(f->items);
    free(f);
}

SubscriptionList *view_subscriptions(PGconn *c, int shards, Err *err)
{
    PGresult *r = db_exec(c,
                          "SELECT name, url, secret, to_json(queues)::text, to_json(kinds)::text,"
                          "       paused, paused_reason,"
                          "       array_to_string(coalesce(cursors, ARRAY[cursor]), '.')"
                          "  FROM workd_subscriptions ORDER BY name",
                          0, NULL, "reading webhook subscriptions", err);
    if (!r)
        return NULL;
    SubscriptionList *l = xcalloc(1, sizeof *l);
    l->len = (size_t)PQntuples(r);
    l->items = xcalloc(l->len + 1, sizeof *l->items);
    for (int i = 0; i < PQntuples(r); i++)
        l->items[i] = (Subscription){
            .name = xstrdup(db_str(r, i, 0)),
            .url = xstrdup(db_str(r, i, 1)),
            .secret = xstrdup(db_str(r, i, 2)),
            .queues = PQgetisnull(r, i, 3) ? NULL : strv_of_json(r, i, 3),
            .kinds = strv_of_json(r, i, 4),
            .paused = !strcmp(db_str(r, i, 5), "t"),
            .paused_reason = str_or_null(r, i, 6),
        };
    for (int i = 0; i < PQntuples(r); i++)
        if (cursor_parse(db_str(r, i, 7), shards, &l->items[i].cursor, err) != 0) {
            err_set(err, 500, "bad-row", "subscription %s has the cursor '%s' (%d shards)",
                    l->items[i].name, db_str(r, i, 7), shards);
            PQclear(r);
            view_subscriptions_free(l);
            return NULL;
        }
    PQclear(r);
    return l;
}

void view_subscriptions_free(SubscriptionList *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->len; i++)
        subscription_clear(&l->items[i]);
    free(l->items);
    free(l);
}

/* ---- the cluster's databases ---- */

PGconn *view_db(ViewDbs *d, int db, Err *err)
{
    PGconn *c = d->session(d, db);
    if (c)
        return c;
    int first = 0;
    for (int s = d->stores->shards - 1; s > 0; s--)
        if (stores_keeps(d->stores, db, s))
            first = s;
    if (db == 0)
        err_set(err, 503, "database-unavailable", "the database cannot be reached; retry");
    else
        err_set(err, 503, "database-unavailable",
                "the database of shard %d cannot be reached; retry", first);
    return NULL;
}

PGconn *view_shard_db(ViewDbs *d, int shard, Err *err)
{
    return view_db(d, d->stores->of[shard], err);
}

/* Looks for something in one database: 1 found (and kept in ud), 0 not
 * there, -1 an error. */
typedef int (*FindFn)(PGconn *c, void *ud, Err *err);

/* Asks each database in turn, `first` first, until one finds: 1 found, 0
 * none has it, -1 an error, or (503) none that could be asked has it and a
 * database could not be reached. */
WARN_UNUSED static int find_each(ViewDbs *d, int first, FindFn find, void *ud, Err *err)
{
    int n = d->stores->n;
    Err down = {0};
    for (int i = 0; i < n; i++) {
        int db = (first + i) % n;
        Err e = {0};
        PGconn *c = view_db(d, db, &e);
        if (!c) {
            if (!down.status)
                down = e;
            continue;
        }
        int rc = find(c, ud, err);
        if (rc != 0)
            return rc;
    }
    if (down.status) {
        if (err)
            *err = down;
        return -1;
    }
    return 0;
}

/* A read by id of one database, as FindFn wants it: 404 is "not here". */
typedef struct FindById {
    const char *id;
    int64_t now, after;
    int limit;
    /* the read in one database (NULL with a 404: not there) */
    void *(*get)(PGconn *c, const struct FindById *f, Err *err);
    void *found; /* what was found (the read's own type) */
} FindById;

static int find_by_get(PGconn *c, void *ud, Err *err)
{
    FindById *f = ud;
    Err e = {0};
    f->found = f->get(c, f, &e);
    if (!f->found && e.status != 404 && err)
        *err = e;
    return f->found ? 1 : e.status == 404 ? 0 : -1;
}

static void *get_work(PGconn *c, const FindById *f, Err *err)
{
    return work_get(c, f->id, f->now, err);
}

WorkView *view_work_get(ViewDbs *d, const char *id, int64_t now, Err *err)
{
    FindById f = {.id = id, .now = now, .get = get_work};
    int rc = find_each(d, 0, find_by_get, &f, err);
    if (rc == 0)
        err_set(err, 404, "not-found", "no work with id '%s'", id);
    return rc == 1 ? f.found : NULL;
}

static int find_events(PGconn *c, void *ud, Err *err)
{
    FindById *f = ud;
    bool found = false;
    WorkEvents *e = events_in(c, f->id, f->after, f->limit, &found, err);
    if (!e)
        return -1;
    if (!found) {
        view_work_events_free(e);
        return 0;
    }
    f->found = e;
    return 1;
}

WorkEvents *view_work_events(ViewDbs *d, const char *id, int64_t after, int limit, Err *err)
{
    FindById f = {.id = id, .after = after, .limit = limit};
    int rc = find_each(d, 0, find_events, &f, err);
    if (rc == 1)
        return f.found;
    if (rc < 0)
        return NULL;
    if (after == 0) {
        err_set(err, 404, "not-found", "no work with id '%s'", id);
        return NULL;
    }
    /* Past its history's start: an empty page, as for work whose events
     * are gone with their part. */
    WorkEvents *o = xcalloc(1, sizeof *o);
    o->id = xstrdup(id);
    o->items = xcalloc(1, sizeof *o->items);
    return o;
}

static void *get_batch(PGconn *c, const FindById *f, Err *err)
{
    return batch_get(c, f->id, f->now, err);
}

BatchView *view_batch_get(ViewDbs *d, const char *id, int64_t now, Err *err)
{
    FindById f = {.id = id, .now = now, .get = get_batch};
    int rc = find_each(d, 0, find_by_get, &f, err);
    if (rc == 0)
        err_set(err, 404, "not-found", "no batch '%s'", id);
    return rc == 1 ? f.found : NULL;
}

static void *get_schedules(PGconn *c, const FindById *f, Err *err)
{
    return schedules_in(c, f->id, err);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const ScheduleView *)a)->name, ((const ScheduleView *)b)->name);
}

ScheduleList *view_schedules(ViewDbs *d, const char *name, Err *err)
{
    if (name) {
        FindById f = {.id = name, .get = get_schedules};
        int rc = find_each(d, 0, find_by_get, &f, err);
        if (rc == 0)
            err_set(err, 404, "not-found", "no schedule '%s'", name);
        return rc == 1 ? f.found : NULL;
    }
    ScheduleList *all = NULL;
    for (int db = 0; db < d->stores->n; db++) {
        PGconn *c = view_db(d, db, err);
        ScheduleList *l = c ? schedules_in(c, NULL, err) : NULL;
        if (!l) {
            view_schedules_free(all);
            return NULL;
        }
        if (!all) {
            all = l;
            continue;
        }
        all->items = xrealloc(all->items, (all->len + l->len + 1) * sizeof *all->items);
        memcpy(all->items + all->len, l->items, l->len * sizeof *l->items);
        all->len += l->len;
        l->len = 0;
        view_schedules_free(l);
    }
    if (d->stores->n > 1)
        qsort(all->items, all->len, sizeof *all->items, by_name);
    return all;
}

/* Which shard a work item or a schedule is in, as FindFn asks it. */
typedef struct FindShard {
    const char *id;
    bool schedule;
    int shard;
} FindShard;

static int find_shard(PGconn *c, void *ud, Err *err)
{
    FindShard *f = ud;
    int rc = f->schedule ? schedule_shard_in(c, f->id, &f->shard, err)
                         : work_shard_in(c, f->id, &f->shard, err);
    return rc != 0 ? -1 : f->shard >= 0;
}

int view_work_shard(ViewDbs *d, const char *id, int *shard, Err *err)
{
    FindShard f = {.id = id, .shard = -1};
    int rc = find_each(d, 0, find_shard, &f, err);
    *shard = f.shard;
    return rc < 0 ? -1 : 0;
}

int view_schedule_shard(ViewDbs *d, const char *name, int *shard, Err *err)
{
    FindShard f = {.id = name, .schedule = true, .shard = -1};
    int rc = find_each(d, 0, find_shard, &f, err);
    *shard = f.shard;
    return rc < 0 ? -1 : 0;
}

int view_work_shards(ViewDbs *d, char *const *ids, size_t n, int *shards, Err *err)
{
    for (size_t i = 0; i < n; i++)
        shards[i] = -1;
    Err down = {0};
    for (int db = 0; db < d->stores->n; db++) {
        size_t missing = 0;
        for (size_t i = 0; i < n; i++)
            missing += shards[i] < 0;
        if (!missing)
            return 0;
        Err e = {0};
        PGconn *c = view_db(d, db, &e);
        if (!c) {
            if (!down.status)
                down = e;
        } else if (work_shards_in(c, ids, n, shards, err) != 0) {
            return -1;
        }
    }
    int rc = 0;
    for (size_t i = 0; i < n && down.status; i++)
        if (shards[i] < 0) { /* maybe in the database that could not be asked */
            if (err)
                *err = down;
            shards[i] = SHARD_UNREACHABLE;
            rc = -2;
        }
    return rc;
}

/* ---- the aggregates: each database's, merged by queue ---- */

/* Appends src's items to *dst's (both sorted by queue), merging the entries
 * of a queue both have with merge(into, from), which also frees what of
 * `from` it does not take; the result is sorted by queue. src's array is
 * freed, its items taken. */
typedef void (*MergeFn)(void *into, void *from);

static void merge_sorted(void **dst_items, size_t *dst_len, void *src_items, size_t src_len,
                         size_t size, MergeFn merge, void (*drop)(void *))
{
    char *a = *dst_items, *b = src_items;
    char *out = xcalloc(*dst_len + src_len + 1, size);
    size_t i = 0, j = 0, n = 0;
    while (i < *dst_len || j < src_len) {
        int cmp = i == *dst_len ? 1 : j == src_len ? -1 : by_queue(a + i * size, b + j * size);
        if (cmp <= 0) {
            memcpy(out + n * size, a + i * size, size);
            if (cmp == 0) {
                if (merge)
                    merge(out + n * size, b + j * size);
                else
                    drop(b + j * size);
                j++;
            }
            i++;
        } else {
            memcpy(out + n * size, b + j * size, size);
            j++;
        }
        n++;
    }
    free(a);
    free(b);
    *dst_items = out;
    *dst_len = n;
}

static void merge_open(void *into, void *from)
{
    OpenCount *a = into, *b = from;
    a->waiting += b->waiting;
    a->pending += b->pending;
    a->scheduled += b->scheduled;
    a->running += b->running;
    if (b->oldest_pending_at != VIEW_NO_TIME &&
        (a->oldest_pending_at == VIEW_NO_TIME || b->oldest_pending_at < a->oldest_pending_at))
        a->oldest_pending_at = b->oldest_pending_at;
    if (b->oldest_pending_age_s > a->oldest_pending_age_s)
        a->oldest_pending_age_s = b->oldest_pending_age_s;
    free(b->queue);
}

OpenCounts *view_open_counts(ViewDbs *d, Err *err)
{
    OpenCounts *all = NULL;
    for (int db = 0; db < d->stores->n; db++) {
        PGconn *c = view_db(d, db, err);
        OpenCounts *o = c ? open_counts_in(c, err) : NULL;
        if (!o) {
            view_open_counts_free(all);
            return NULL;
        }
        if (!all) {
            all = o;
            continue;
        }
        merge_sorted((void **)&all->items, &all->len, o->items, o->len, sizeof *o->items,
                     merge_open, NULL);
        free(o);
    }
    return all;
}

static void merge_finished(void *into, void *from)
{
    FinishedCount *a = into, *b = from;
    a->completed += b->completed;
    a->dead += b->dead;
    a->cancelled += b->cancelled;
    free(b->queue);
}

FinishedCounts *view_finished_counts(ViewDbs *d, Err *err)
{
    FinishedCounts *all = NULL;
    for (int db = 0; db < d->stores->n; db++) {
        PGconn *c = view_db(d, db, err);
        FinishedCounts *f = c ? finished_counts_in(c, err) : NULL;
        if (!f) {
            view_finished_counts_free(all);
            return NULL;
        }
        if (!all) {
            all = f;
            continue;
        }
        merge_sorted((void **)&all->items, &all->len, f->items, f->len, sizeof *f->items,
                     merge_finished, NULL);
        free(f);
    }
    return all;
}

/* A queue's limits are its shard's database's: another's copy is dropped. */
static void drop_limits(void *p)
{
    QueueLimitsRow *q = p;
    free(q->queue);
    queue_limits_clear(&q->limits);
}

QueueLimitsList *view_queue_limits(ViewDbs *d, Err *err)
{
    QueueLimitsList *all = NULL;
    for (int db = 0; db < d->stores->n; db++) {
        PGconn *c = view_db(d, db, err);
        QueueLimitsList *l = c ? queue_limits_in(c, err) : NULL;
        if (!l) {
            view_queue_limits_free(all);
            return NULL;
        }
        if (!all) {
            all = l;
            continue;
        }
        merge_sorted((void **)&all->items, &all->len, l->items, l->len, sizeof *l->items, NULL,
                     drop_limits);
        free(l);
    }
    return all;
}

/* A queue's open work is all in its shard's database: another's is dropped. */
static void drop_backlog(void *p)
{
    KeyBacklog *q = p;
    for (size_t j = 0; j < q->n_keys; j++)
        free(q->keys[j].key);
    free(q->keys);
    free(q->queue);
}

KeyBacklogs *view_key_backlog(ViewDbs *d, const char *queue, int top, Err *err)
{
    if (queue) { /* one queue: its shard's database alone */
        PGconn *c = view_shard_db(d, shard_of_queue(queue, d->stores->shards), err);
        return c ? key_backlog_in(c, queue, top, err) : NULL;
    }
    KeyBacklogs *all = NULL;
    for (int db = 0; db < d->stores->n; db++) {
        PGconn *c = view_db(d, db, err);
        KeyBacklogs *k = c ? key_backlog_in(c, NULL, top, err) : NULL;
        if (!k) {
            view_key_backlog_free(all);
            return NULL;
        }
        if (!all) {
            all = k;
            continue;
        }
        merge_sorted((void **)&all->items, &all->len, k->items, k->len, sizeof *k->items, NULL,
                     drop_backlog);
        free(k);
    }
    return all;
}

/* The first bucket a queue had activity in (buckets when none). */
static int first_active(const Activity *a, const ActivityQueue *q)
{
    for (int b = 0; b < a->buckets; b++)
        for (int k = 0; k < ACTIVITY_KINDS; k++)
            if (q->count[k][b])
                return b;
    return a->buckets;
}

/* A queue of a merged chart and when its activity began, for sorting. */
typedef struct FirstActive {
    int first;
    ActivityQueue q;
} FirstActive;

static int by_first_activity(const void *x, const void *y)
{
    const FirstActive *a = x, *b = y;
    return a->first != b->first ? (a->first < b->first ? -1 : 1) : strcmp(a->q.queue, b->q.queue);
}

/* Orders a merged chart's queues as one database orders them: by the bucket
 * of their first activity, then by name. */
static void sort_by_first_activity(Activity *a)
{
    FirstActive *v = xcalloc(a->len + 1, sizeof *v);
    for (size_t i = 0; i < a->len; i++)
        v[i] = (FirstActive){first_active(a, &a->queues[i]), a->queues[i]};
    qsort(v, a->len, sizeof *v, by_first_activity);
    for (size_t i = 0; i < a->len; i++)
        a->queues[i] = v[i].q;
    free(v);
}

Activity *view_activity(ViewDbs *d, int buckets, Err *err)
{
    Activity *all = NULL;
    for (int db = 0; db < d->stores->n; db++) {
        PGconn *c = view_db(d, db, err);
        Activity *a = c ? activity_in(c, buckets, err) : NULL;
        if (!a) {
            view_activity_free(all);
            return NULL;
        }
        if (!all) {
            all = a;
            continue;
        }
        /* Its buckets where the first database's clock puts them. */
        for (size_t i = 0; i < a->len; i++) {
            ActivityQueue *to = activity_queue(all, a->queues[i].queue);
            for (int b = 0; b < buckets; b++) {
                int64_t slot = (a->start - all->start) / ACTIVITY_BUCKET_S + b;
                for (int k = 0; k < ACTIVITY_KINDS && slot >= 0 && slot < buckets; k++)
                    to->count[k][slot] += a->queues[i].count[k][b];
            }
        }
        view_activity_free(a);
    }
    if (d->stores->n > 1)
        sort_by_first_activity(all);
    return all;
}
