/* journal: see journal.h. */
#include "journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "util.h"

#define MS(col) "(extract(epoch from " col ") * 1000)::bigint"
#define STR_(x) #x
#define STR(x) STR_(x)

static const char append_sql[] =
    "WITH ins AS ("
    " INSERT INTO workd_events (seq, term, at, type, version, work_id, data)"
    " SELECT u.seq, $2::bigint, to_timestamp(u.at / 1000.0), u.type, u.version, u.work_id,"
    "        u.data::jsonb"
    " FROM unnest($1::bigint[], $3::bigint[], $4::text[], $5::int2[], $6::text[], $7::text[])"
    "      AS u(seq, at, type, version, work_id, data)"
    " WHERE EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
    "               AND pid = pg_backend_pid() AND granted"
    "               AND classid = " STR(DB_LOCK_CLASS) " AND objid = " STR(DB_LOCK_LEADER)
    "               AND objsubid = 2)"
    " RETURNING 1)"
    " SELECT count(*), pg_notify('workd_events', $8) FROM ins";

int journal_append(PGconn *c, const EventList *events, Err *err)
{
    if (events->len == 0)
        return 0;
    SBuf seqs, ats, types, vers, ids, datas;
    sbuf_init(&seqs);
    sbuf_init(&ats);
    sbuf_init(&types);
    sbuf_init(&vers);
    sbuf_init(&ids);
    sbuf_init(&datas);
    SBuf *all[] = {&seqs, &ats, &types, &vers, &ids, &datas};
    for (size_t i = 0; i < 6; i++)
        sbuf_puts(all[i], "{");
    for (size_t i = 0; i < events->len; i++) {
        const Event *e = &events->items[i];
        const char *sep = i ? "," : "";
        sbuf_printf(&seqs, "%s%lld", sep, (long long)e->seq);
        sbuf_printf(&ats, "%s%lld", sep, (long long)e->at);
        sbuf_printf(&types, "%s%s", sep, event_type_name(e->type));
        sbuf_printf(&vers, "%s%d", sep, e->version);
        sbuf_puts(&ids, sep);
        db_array_text(&ids, e->work_id);
        json_t *d = event_data_encode(e);
        char *txt = json_dumps(d, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(d);
        sbuf_puts(&datas, sep);
        db_array_text(&datas, txt);
        free(txt);
    }
    for (size_t i = 0; i < 6; i++)
        sbuf_puts(all[i], "}");
    char term[24], last[24];
    snprintf(term, sizeof term, "%lld", (long long)events->items[0].term);
    snprintf(last, sizeof last, "%lld", (long long)events->items[events->len - 1].seq);
    const char *params[] = {seqs.data, term, ats.data, types.data, vers.data,
                            ids.data,  datas.data, last};
    PGresult *r = db_exec(c, append_sql, 8, params, "appending events", err);
    for (size_t i = 0; i < 6; i++)
        sbuf_free(all[i]);
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
    PGresult *r = db_exec(c,
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
                " timeout_ms, " MS("run_at") ", accepted_seq, " MS("created_at") ", worker_id,"
                " " MS("deadline") ", " MS("started_at") ", last_error"
                " FROM workd_work WHERE status IN ('pending', 'running') ORDER BY accepted_seq",
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
                       "SELECT id, status, attempts, payload::text, queue, priority,"
                       " timeout_ms, max_attempts FROM workd_work WHERE id = ANY($1::text[])",
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
    PGresult *r = db_exec(c,
                          "SELECT id, queue, priority, payload::text, status, attempts,"
                          " max_attempts, timeout_ms, " MS("run_at") ", " MS("created_at") ","
                          " " MS("started_at") ", " MS("finished_at") ", worker_id,"
                          " " MS("deadline") ", result::text, last_error, updated_seq"
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
    PGresult *r = db_exec(c,
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
        "SELECT e.seq, " MS("e.at") ", e.type, e.work_id, w.queue, e.data::text, w.attempts"
        " FROM workd_events e JOIN workd_work w ON w.id = e.work_id"
        " WHERE e.seq > $1::bigint AND e.type IN ('completed', 'dead', 'cancelled')"
        " ORDER BY e.seq LIMIT $2::int",
        2, params, "reading finished work", err);
    if (!r)
        return -1;
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        json_t *data = json_col(r, i, 5);
        json_t *o = json_object();
        json_object_set_new(o, "seq", json_integer(db_int(r, i, 0)));
        json_object_set_new(o, "id", json_string(db_str(r, i, 3)));
        json_object_set_new(o, "queue", json_string(db_str(r, i, 4)));
        json_object_set_new(o, "status", json_string(db_str(r, i, 2)));
        set_time_field(o, "at", r, i, 1);
        const char *type = db_str(r, i, 2);
        if (!strcmp(type, "completed")) {
            json_object_set(o, "result", json_object_get(data, "result"));
            json_object_set(o, "attempt", json_object_get(data, "attempt"));
        } else if (!strcmp(type, "dead")) {
            json_object_set(o, "error", json_object_get(data, "error"));
            json_object_set_new(o, "attempts", json_integer(db_int(r, i, 6)));
        }
        json_decref(data);
        json_array_append_new(out, o);
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
        " THEN 'scheduled' ELSE status END, attempts, max_attempts, " MS("created_at") ","
        " " MS("finished_at") ", worker_id, last_error, accepted_seq"
        " FROM workd_work"
        " WHERE ($1::text IS NULL OR status = CASE $1 WHEN 'scheduled' THEN 'pending' ELSE $1 END)"
        "   AND ($1::text IS DISTINCT FROM 'scheduled' OR run_at > now())"
        "   AND ($1::text IS DISTINCT FROM 'pending' OR run_at IS NULL OR run_at <= now())"
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
        " " MS("min(created_at) FILTER (WHERE status = 'pending'"
               " AND (run_at IS NULL OR run_at <= now()))")
        " FROM workd_work WHERE status IN ('pending', 'running') GROUP BY queue",
        0, NULL, "counting open work", err);
    if (!r)
        return NULL;
    json_t *o = json_object();
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *q = json_pack("{s:I, s:I, s:I}", "pending", (json_int_t)db_int(r, i, 1),
                              "scheduled", (json_int_t)db_int(r, i, 2), "running",
                              (json_int_t)db_int(r, i, 3));
        set_time_field(q, "oldest_pending_at", r, i, 4);
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
