/* journal: see journal.h. */
#include "journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "util.h"

#define MS(col) "(extract(epoch from " col ") * 1000)::bigint"

/* Fencing: every part of the statement writes only if this session holds the
 * leader lock (workd_holds_leader_lock(), asked once, in the lk CTE). The
 * events, the new work rows and the changed ones go in one statement, which
 * is one transaction, with the NOTIFY that wakes the listeners. */
static const char append_sql[] =
    "WITH lk AS (SELECT workd_holds_leader_lock() AS ok),"
    " ev AS ("
    " INSERT INTO workd_events (seq, term, at, type, version, work_id, data)"
    " SELECT u.seq, $2::bigint, workd_ts(u.at), u.type, u.version, u.work_id, u.data::jsonb"
    " FROM unnest($1::bigint[], $3::bigint[], $4::text[], $5::int2[], $6::text[], $7::text[])"
    "      AS u(seq, at, type, version, work_id, data)"
    " WHERE (SELECT ok FROM lk)"
    " RETURNING 1),"
    " nw AS ("
    " INSERT INTO workd_work (id, queue, priority, payload, status, attempts, max_attempts,"
    "   timeout_ms, run_at, created_at, accepted_seq, started_at, finished_at, worker_id,"
    "   deadline, result, last_error, updated_seq)"
    " SELECT n.id, n.queue, n.priority, n.payload::jsonb, n.status, n.attempts, n.max_attempts,"
    "   n.timeout_ms, workd_ts(n.run_at), workd_ts(n.created_at), n.accepted_seq,"
    "   workd_ts(n.started_at), workd_ts(n.finished_at), n.worker_id, workd_ts(n.deadline),"
    "   n.result::jsonb, n.last_error, n.updated_seq"
    " FROM unnest($9::text[], $10::text[], $11::int[], $12::text[], $13::text[], $14::int[],"
    "   $15::int[], $16::bigint[], $17::bigint[], $18::bigint[], $19::bigint[], $20::bigint[],"
    "   $21::bigint[], $22::text[], $23::bigint[], $24::text[], $25::text[], $26::bigint[])"
    "   AS n(id, queue, priority, payload, status, attempts, max_attempts, timeout_ms, run_at,"
    "   created_at, accepted_seq, started_at, finished_at, worker_id, deadline, result,"
    "   last_error, updated_seq)"
    " WHERE (SELECT ok FROM lk)),"
    " up AS ("
    " UPDATE workd_work w SET"
    "   status = CASE WHEN u.m & 1 <> 0 THEN u.status ELSE w.status END,"
    "   attempts = CASE WHEN u.m & 2 <> 0 THEN u.attempts ELSE w.attempts END,"
    "   max_attempts = CASE WHEN u.m & 4 <> 0 THEN u.max_attempts ELSE w.max_attempts END,"
    "   run_at = CASE WHEN u.m & 8 <> 0 THEN workd_ts(u.run_at) ELSE w.run_at END,"
    "   started_at = CASE WHEN u.m & 16 <> 0 THEN workd_ts(u.started_at) ELSE w.started_at END,"
    "   finished_at = CASE WHEN u.m & 32 <> 0 THEN workd_ts(u.finished_at)"
    "                 ELSE w.finished_at END,"
    "   worker_id = CASE WHEN u.m & 64 <> 0 THEN u.worker_id ELSE w.worker_id END,"
    "   deadline = CASE WHEN u.m & 128 <> 0 THEN workd_ts(u.deadline) ELSE w.deadline END,"
    "   result = CASE WHEN u.m & 256 <> 0 THEN u.result::jsonb ELSE w.result END,"
    "   last_error = CASE WHEN u.m & 512 <> 0 THEN u.last_error ELSE w.last_error END,"
    "   accepted_seq = CASE WHEN u.m & 1024 <> 0 THEN u.accepted_seq ELSE w.accepted_seq END,"
    "   updated_seq = u.updated_seq"
    " FROM unnest($27::text[], $28::int[], $29::text[], $30::int[], $31::int[], $32::bigint[],"
    "   $33::bigint[], $34::bigint[], $35::text[], $36::bigint[], $37::text[], $38::text[],"
    "   $39::bigint[], $40::bigint[])"
    "   AS u(id, m, status, attempts, max_attempts, run_at, started_at, finished_at, worker_id,"
    "   deadline, result, last_error, accepted_seq, updated_seq)"
    " WHERE w.id = u.id AND (SELECT ok FROM lk))"
    " SELECT (SELECT count(*) FROM ev), pg_notify('workd_events', $8)";

/* One array parameter being built as a PostgreSQL array literal. */
typedef struct Col {
    SBuf b;
    size_t n;
} Col;

static void col_sep(Col *c)
{
    sbuf_puts(&c->b, c->n++ ? "," : "{");
}

static void col_int(Col *c, int64_t v)
{
    col_sep(c);
    sbuf_printf(&c->b, "%lld", (long long)v);
}

/* A time: 0 is NULL. */
static void col_time(Col *c, int64_t ms)
{
    col_sep(c);
    if (ms)
        sbuf_printf(&c->b, "%lld", (long long)ms);
    else
        sbuf_puts(&c->b, "NULL");
}

static void col_text(Col *c, const char *s)
{
    col_sep(c);
    db_array_text(&c->b, s);
}

static void col_json(Col *c, const json_t *v)
{
    char *txt = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    col_text(c, txt);
    free(txt);
}

static const char *col_end(Col *c)
{
    if (!c->n)
        sbuf_puts(&c->b, "{");
    sbuf_puts(&c->b, "}");
    return c->b.data;
}

enum { EV_COLS = 6, NEW_COLS = 18, UP_COLS = 14, ALL_COLS = EV_COLS + NEW_COLS + UP_COLS };

int journal_prepare(PGconn *c, Err *err)
{
    PGresult *r = PQprepare(c, "workd_append", append_sql, 0, NULL);
    int rc = db_check(c, r, "preparing the append statement", err);
    PQclear(r);
    return rc;
}

int journal_append(PGconn *c, const EventList *events, ProjRow *const *rows, size_t nrows, Err *err)
{
    if (events->len == 0)
        return 0;
    Col cols[ALL_COLS];
    memset(cols, 0, sizeof cols);
    Col *ev = cols, *nw = cols + EV_COLS, *up = cols + EV_COLS + NEW_COLS;
    for (size_t i = 0; i < events->len; i++) {
        const Event *e = &events->items[i];
        col_int(&ev[0], e->seq);
        col_int(&ev[1], e->at);
        col_text(&ev[2], event_type_name(e->type));
        col_int(&ev[3], e->version);
        col_text(&ev[4], e->work_id);
        json_t *d = event_data_encode(e);
        col_json(&ev[5], d);
        json_decref(d);
    }
    for (size_t i = 0; i < nrows; i++) {
        const ProjRow *r = rows[i];
        if (r->is_new) {
            col_text(&nw[0], r->id);
            col_text(&nw[1], r->queue);
            col_int(&nw[2], r->priority);
            col_json(&nw[3], r->payload ? r->payload : json_null());
            col_text(&nw[4], r->status);
            col_int(&nw[5], r->attempts);
            col_int(&nw[6], r->max_attempts);
            col_int(&nw[7], r->timeout_ms);
            col_time(&nw[8], r->run_at);
            col_time(&nw[9], r->created_at);
            col_int(&nw[10], r->accepted_seq);
            col_time(&nw[11], r->started_at);
            col_time(&nw[12], r->finished_at);
            col_text(&nw[13], r->worker_id);
            col_time(&nw[14], r->deadline);
            col_json(&nw[15], r->result);
            col_text(&nw[16], r->last_error);
            col_int(&nw[17], r->updated_seq);
        } else {
            col_text(&up[0], r->id);
            col_int(&up[1], r->changed);
            col_text(&up[2], r->status);
            col_int(&up[3], r->attempts);
            col_int(&up[4], r->max_attempts);
            col_time(&up[5], r->run_at);
            col_time(&up[6], r->started_at);
            col_time(&up[7], r->finished_at);
            col_text(&up[8], r->worker_id);
            col_time(&up[9], r->deadline);
            col_json(&up[10], r->result);
            col_text(&up[11], r->last_error);
            col_int(&up[12], r->accepted_seq);
            col_int(&up[13], r->updated_seq);
        }
    }
    char term[24], last[24];
    snprintf(term, sizeof term, "%lld", (long long)events->items[0].term);
    snprintf(last, sizeof last, "%lld", (long long)events->items[events->len - 1].seq);
    const char *params[ALL_COLS + 2];
    params[0] = col_end(&ev[0]);
    params[1] = term;
    for (int i = 1; i < EV_COLS; i++)
        params[i + 1] = col_end(&ev[i]);
    params[7] = last;
    for (int i = 0; i < NEW_COLS + UP_COLS; i++)
        params[8 + i] = col_end(&nw[i]);
    PGresult *r = PQexecPrepared(c, "workd_append", ALL_COLS + 2, params, NULL, NULL, 0);
    if (db_check(c, r, "appending events", err) != 0) {
        PQclear(r);
        r = NULL;
    }
    for (int i = 0; i < ALL_COLS; i++)
        sbuf_free(&cols[i].b);
    if (!r)
        return -1;
    int64_t written = db_int(r, 0, 0);
    PQclear(r);
    if (written != (int64_t)events->len)
        return err_set(err, 409, "fenced",
                       "this session no longer holds the leader lock: nothing was written");
    return 0;
}

int journal_recover(PGconn *c, WorkState *ws, int64_t *last_seq, int64_t *last_term, Err *err)
{
    PGresult *r =
        db_exec(c,
                "SELECT coalesce((SELECT seq FROM workd_events ORDER BY seq DESC LIMIT 1), 0),"
                "       coalesce((SELECT term FROM workd_events ORDER BY seq DESC LIMIT 1), 0)",
                0, NULL, "reading the last seq", err);
    if (!r)
        return -1;
    *last_seq = db_int(r, 0, 0);
    *last_term = db_int(r, 0, 1);
    PQclear(r);

    r = db_exec(c,
                "SELECT id, queue, priority, payload::text, status, attempts, max_attempts,"
                " timeout_ms, " MS("run_at") ", accepted_seq, " MS(
                    "created_at") ", worker_id,"
                                  " " MS("deadline") ", " MS(
                                      "started_at") ", last_error"
                                                    " FROM workd_work WHERE status IN ('pending', "
                                                    "'running') ORDER BY accepted_seq",
                0, NULL, "loading open work", err);
    if (!r)
        return -1;
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        WorkItem it = {0};
        it.id = (char *)db_str(r, i, 0);
        it.queue = (char *)db_str(r, i, 1);
        it.priority = (int)db_int(r, i, 2);
        it.payload = json_loads(db_str(r, i, 3), JSON_DECODE_ANY, NULL);
        it.status = strcmp(db_str(r, i, 4), "running") == 0 ? WORK_RUNNING : WORK_PENDING;
        it.attempt = (int)db_int(r, i, 5);
        it.max_attempts = (int)db_int(r, i, 6);
        it.timeout_ms = db_int(r, i, 7);
        it.run_at = db_int(r, i, 8);
        it.accepted_seq = db_int(r, i, 9);
        it.created_at = db_int(r, i, 10);
        it.worker_id = it.status == WORK_RUNNING ? (char *)db_str(r, i, 11) : NULL;
        it.deadline = it.status == WORK_RUNNING ? db_int(r, i, 12) : 0;
        it.started_at = db_int(r, i, 13);
        it.last_error = (char *)db_str(r, i, 14);
        ws_restore(ws, &it);
        json_decref(it.payload);
    }
    PQclear(r);
    return 0;
}

int journal_known(PGconn *c, char *const *ids, size_t n, KnownSet *out, Err *err)
{
    memset(out, 0, sizeof *out);
    if (n == 0)
        return 0;
    SBuf arr;
    sbuf_init(&arr);
    sbuf_puts(&arr, "{");
    for (size_t i = 0; i < n; i++) {
        if (i)
            sbuf_puts(&arr, ",");
        db_array_text(&arr, ids[i]);
    }
    sbuf_puts(&arr, "}");
    const char *params[] = {arr.data};
    out->res = db_exec(c,
                       "SELECT w.id, w.status, w.attempts, w.payload::text, w.queue,"
                       " w.priority, w.timeout_ms, w.max_attempts, w.last_error"
                       " FROM unnest($1::text[]) AS k(id) JOIN workd_work w ON w.id = k.id",
                       1, params, "looking up work ids", err);
    sbuf_free(&arr);
    if (!out->res)
        return -1;
    int rows = PQntuples(out->res);
    out->items = xcalloc((size_t)rows + 1, sizeof *out->items);
    for (int i = 0; i < rows; i++) {
        KnownWork *k = &out->items[out->n++];
        k->id = db_str(out->res, i, 0);
        k->status = db_str(out->res, i, 1);
        k->attempts = (int)db_int(out->res, i, 2);
        k->payload = json_loads(db_str(out->res, i, 3), JSON_DECODE_ANY, NULL);
        k->queue = db_str(out->res, i, 4);
        k->priority = (int)db_int(out->res, i, 5);
        k->timeout_ms = db_int(out->res, i, 6);
        k->max_attempts = (int)db_int(out->res, i, 7);
        k->last_error = db_str(out->res, i, 8);
    }
    return 0;
}

void journal_known_free(KnownSet *k)
{
    for (size_t i = 0; i < k->n; i++)
        json_decref(k->items[i].payload);
    free(k->items);
    PQclear(k->res);
    memset(k, 0, sizeof *k);
}

static void set_time_field(json_t *o, const char *key, const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col)) {
        json_object_set_new(o, key, json_null());
        return;
    }
    char buf[40];
    time_format(db_int(r, row, col), buf, sizeof buf);
    json_object_set_new(o, key, json_string(buf));
}

static json_t *json_col(const PGresult *r, int row, int col)
{
    const char *s = db_str(r, row, col);
    json_t *v = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    return v ? v : json_null();
}

json_t *journal_work_get(PGconn *c, const char *id, int64_t now, Err *err)
{
    const char *params[] = {id};
    PGresult *r = db_exec(
        c,
        "SELECT id, queue, priority, payload::text, status, attempts,"
        " max_attempts, timeout_ms, " MS("run_at") ", " MS(
            "created_at") ","
                          " " MS("started_at") ", " MS(
                              "finished_at") ", worker_id,"
                                             " " MS("deadline") ", result::text, last_error, "
                                                                "updated_seq"
                                                                " FROM workd_work WHERE id = $1",
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
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(db_str(r, 0, 0)));
    json_object_set_new(o, "queue", json_string(db_str(r, 0, 1)));
    json_object_set_new(o, "priority", json_integer(db_int(r, 0, 2)));
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "payload", json_col(r, 0, 3));
    json_object_set_new(o, "attempts", json_integer(db_int(r, 0, 5)));
    json_object_set_new(o, "max_attempts", json_integer(db_int(r, 0, 6)));
    json_object_set_new(o, "timeout_ms", json_integer(db_int(r, 0, 7)));
    set_time_field(o, "run_at", r, 0, 8);
    set_time_field(o, "created_at", r, 0, 9);
    set_time_field(o, "started_at", r, 0, 10);
    set_time_field(o, "finished_at", r, 0, 11);
    const char *w = db_str(r, 0, 12);
    json_object_set_new(o, "worker_id", w ? json_string(w) : json_null());
    set_time_field(o, "deadline", r, 0, 13);
    json_object_set_new(o, "result", json_col(r, 0, 14));
    const char *le = db_str(r, 0, 15);
    json_object_set_new(o, "last_error", le ? json_string(le) : json_null());
    json_object_set_new(o, "updated_seq", json_integer(db_int(r, 0, 16)));
    PQclear(r);
    return o;
}

json_t *journal_work_events(PGconn *c, const char *id, Err *err)
{
    const char *params[] = {id};
    PGresult *r =
        db_exec(c,
                "SELECT seq, term, " MS("at") ", type, version, data::text"
                                              " FROM workd_events WHERE work_id = $1 ORDER BY seq",
                1, params, "reading work events", err);
    if (!r)
        return NULL;
    int n = PQntuples(r);
    if (n == 0) {
        PQclear(r);
        err_set(err, 404, "not-found", "no work with id '%s'", id);
        return NULL;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "seq", json_integer(db_int(r, i, 0)));
        json_object_set_new(e, "term", json_integer(db_int(r, i, 1)));
        set_time_field(e, "at", r, i, 2);
        json_object_set_new(e, "type", json_string(db_str(r, i, 3)));
        json_object_set_new(e, "version", json_integer(db_int(r, i, 4)));
        json_object_set_new(e, "data", json_col(r, i, 5));
        json_array_append_new(arr, e);
    }
    PQclear(r);
    return json_pack("{s:s, s:o}", "id", id, "events", arr);
}

int journal_finished_after(PGconn *c, int64_t after, int limit, json_t *out, Err *err)
{
    char a[24], l[16];
    snprintf(a, sizeof a, "%lld", (long long)after);
    snprintf(l, sizeof l, "%d", limit);
    const char *params[] = {a, l};
    PGresult *r = db_exec(
        c,
        "SELECT e.seq, e.term, " MS(
            "e.at") ", e.type, e.version, e.work_id,"
                    " e.data::text, w.queue, w.attempts"
                    " FROM workd_events e JOIN workd_work w ON w.id = e.work_id"
                    " WHERE e.seq > $1::bigint AND e.type IN ('completed', 'dead', 'cancelled')"
                    " ORDER BY e.seq LIMIT $2::int",
        2, params, "reading finished work", err);
    if (!r)
        return -1;
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        json_t *data = json_col(r, i, 6);
        Event e;
        if (event_decode(db_int(r, i, 0), db_int(r, i, 1), db_int(r, i, 2), db_str(r, i, 3),
                         (int)db_int(r, i, 4), db_str(r, i, 5), data, &e, err) != 0) {
            json_decref(data);
            PQclear(r);
            return -1;
        }
        json_decref(data);
        e.queue = xstrdup(db_str(r, i, 7));
        if (e.type == EV_DEAD && !e.attempt) /* logs before schema 3 */
            e.attempt = (int)db_int(r, i, 8);
        json_array_append_new(out, event_result_json(&e));
        event_clear(&e);
    }
    PQclear(r);
    return n;
}

json_t *journal_work_list(PGconn *c, const char *status, const char *queue, int64_t before,
                          int limit, Err *err)
{
    char b[24], l[16];
    snprintf(b, sizeof b, "%lld", (long long)before);
    snprintf(l, sizeof l, "%d", limit);
    const char *params[] = {status, queue, b, l};
    PGresult *r = db_exec(
        c,
        "SELECT id, queue, priority, CASE WHEN status = 'pending' AND run_at > now()"
        " THEN 'scheduled' ELSE status END, attempts, max_attempts, " MS(
            "created_at") ","
                          " " MS(
                              "finished_at") ", worker_id, last_error, accepted_seq"
                                             " FROM workd_work"
                                             " WHERE ($1::text IS NULL OR status = CASE $1 WHEN "
                                             "'scheduled' THEN 'pending' ELSE $1 END)"
                                             "   AND ($1::text IS DISTINCT FROM 'scheduled' OR "
                                             "run_at > now())"
                                             "   AND ($1::text IS DISTINCT FROM 'pending' OR "
                                             "run_at IS NULL OR run_at <= now())"
                                             "   AND ($2::text IS NULL OR queue = $2)"
                                             "   AND ($3::bigint = 0 OR accepted_seq < $3::bigint)"
                                             " ORDER BY accepted_seq DESC LIMIT $4::int",
        4, params, "listing work", err);
    if (!r)
        return NULL;
    json_t *items = json_array();
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(db_str(r, i, 0)));
        json_object_set_new(o, "queue", json_string(db_str(r, i, 1)));
        json_object_set_new(o, "priority", json_integer(db_int(r, i, 2)));
        json_object_set_new(o, "status", json_string(db_str(r, i, 3)));
        json_object_set_new(o, "attempts", json_integer(db_int(r, i, 4)));
        json_object_set_new(o, "max_attempts", json_integer(db_int(r, i, 5)));
        set_time_field(o, "created_at", r, i, 6);
        set_time_field(o, "finished_at", r, i, 7);
        const char *w = db_str(r, i, 8), *le = db_str(r, i, 9);
        json_object_set_new(o, "worker_id", w ? json_string(w) : json_null());
        json_object_set_new(o, "last_error", le ? json_string(le) : json_null());
        json_array_append_new(items, o);
    }
    json_t *next = n == limit && n > 0 ? json_integer(db_int(r, n - 1, 10)) : json_null();
    PQclear(r);
    return json_pack("{s:o, s:o}", "items", items, "next_before", next);
}

json_t *journal_open_counts(PGconn *c, Err *err)
{
    PGresult *r = db_exec(
        c,
        "SELECT queue,"
        " count(*) FILTER (WHERE status = 'pending' AND (run_at IS NULL OR run_at <= now())),"
        " count(*) FILTER (WHERE status = 'pending' AND run_at > now()),"
        " count(*) FILTER (WHERE status = 'running'),"
        " " MS(
            "min(coalesce(run_at, created_at)) FILTER (WHERE status = 'pending'"
            " AND (run_at IS NULL OR run_at <= now()))") ","
                                                         " extract(epoch from now() - "
                                                         "min(coalesce(run_at, created_at)) FILTER"
                                                         "   (WHERE status = 'pending' AND (run_at "
                                                         "IS NULL OR run_at <= now())))::float8"
                                                         " FROM workd_work WHERE status IN "
                                                         "('pending', 'running') GROUP BY queue",
        0, NULL, "counting open work", err);
    if (!r)
        return NULL;
    json_t *o = json_object();
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *q =
            json_pack("{s:I, s:I, s:I}", "pending", (json_int_t)db_int(r, i, 1), "scheduled",
                      (json_int_t)db_int(r, i, 2), "running", (json_int_t)db_int(r, i, 3));
        set_time_field(q, "oldest_pending_at", r, i, 4);
        json_object_set_new(q, "oldest_pending_age_s",
                            PQgetisnull(r, i, 5) ? json_real(0) : json_real(atof(db_str(r, i, 5))));
        json_object_set_new(o, db_str(r, i, 0), q);
    }
    PQclear(r);
    return o;
}

int journal_last_seq(PGconn *c, int64_t *seq, Err *err)
{
    PGresult *r = db_exec(c, "SELECT coalesce(max(seq), 0) FROM workd_events", 0, NULL,
                          "reading the last seq", err);
    if (!r)
        return -1;
    *seq = db_int(r, 0, 0);
    PQclear(r);
    return 0;
}

int journal_leader(PGconn *c, int64_t *term, char *url_out, size_t url_len, Err *err)
{
    PGresult *r = db_exec(c, "SELECT term, url FROM workd_leader WHERE id = 1", 0, NULL,
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

json_t *journal_finished_counts(PGconn *c, Err *err)
{
    PGresult *r = db_exec(c,
                          "SELECT queue, status, count(*) FROM workd_work"
                          " WHERE status IN ('completed', 'dead', 'cancelled')"
                          " GROUP BY queue, status",
                          0, NULL, "counting finished work", err);
    if (!r)
        return NULL;
    json_t *o = json_object();
    for (int i = 0; i < PQntuples(r); i++) {
        const char *q = db_str(r, i, 0);
        json_t *qo = json_object_get(o, q);
        if (!qo) {
            qo = json_pack("{s:i, s:i, s:i}", "completed", 0, "dead", 0, "cancelled", 0);
            json_object_set_new(o, q, qo);
        }
        json_object_set_new(qo, db_str(r, i, 1), json_integer(db_int(r, i, 2)));
    }
    PQclear(r);
    return o;
}
