/* journal: see journal.h. */
#include "journal.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "rows.h"
#include "log.h"
#include "hmap.h"
#include "record.h"
#include "schedule.h"
#include "shard.h"
#include "util.h"

/* ---- the append statement, generated from one table of columns ----
 *
 * Each commit writes, in one statement (one transaction), fenced by
 * workd_fence (migration 0010: the leader lock and the newest term, asked
 * once, in the lk CTE):
 *   ev   the events, as log records (record.h) in the leader's current part;
 *   pt   the part's first seq and time, on the first write into it;
 *   nw   new open rows (accepted, not finished in the same commit);
 *   up   changes to open rows (HOT: no indexed column changes), each row's
 *        history growing by the seqs of its events;
 *   gone + dn  finished work: its open row is deleted and its workd_done row
 *        written once, from the open row overlaid with the commit's changes
 *        (or wholly from the commit, for work accepted in it);
 * and NOTIFY workd_events with the last seq. The SQL text and the code that
 * fills the array parameters are both generated from the tables below, so a
 * placeholder cannot drift from the value that fills it. */

/* K_SEQS: a list of seqs, sent as the text of a bigint[]; K_BOOL: sent as
 * an int (0: false). */
typedef enum { K_TEXT, K_INT, K_BIGINT, K_TIME, K_JSON, K_SEQS, K_BOOL } ColKind;

/* A column of a projection row: its name in workd_open / workd_done, its kind,
 * and the PC_* bit saying an update changed it (0: set once, at acceptance).
 * One table makes the Field enum, the FieldDef array and the checks below. */
#define FIELD_TABLE(X)                                                                             \
    X(F_ID, "id", K_TEXT, 0)                                                                       \
    X(F_MASK, "m", K_INT, 0)                                                                       \
    X(F_QUEUE, "queue", K_TEXT, 0)                                                                 \
    X(F_KEY, "key", K_TEXT, 0)                                                                     \
    X(F_PRIORITY, "priority", K_INT, 0)                                                            \
    X(F_PAYLOAD, "payload", K_JSON, 0)                                                             \
    X(F_STATUS, "status", K_TEXT, PC_STATUS)                                                       \
    X(F_ATTEMPTS, "attempts", K_INT, PC_ATTEMPTS)                                                  \
    X(F_MAX_ATTEMPTS, "max_attempts", K_INT, PC_MAX_ATTEMPTS)                                      \
    X(F_TIMEOUT, "timeout_ms", K_BIGINT, 0)                                                        \
    X(F_RUN_AT, "run_at", K_TIME, PC_RUN_AT)                                                       \
    X(F_CREATED_AT, "created_at", K_TIME, 0)                                                       \
    X(F_ACCEPTED_SEQ, "accepted_seq", K_BIGINT, PC_ACCEPTED_SEQ)                                   \
    X(F_STARTED_AT, "started_at", K_TIME, PC_STARTED_AT)                                           \
    X(F_FINISHED_AT, "finished_at", K_TIME, PC_FINISHED_AT)                                        \
    X(F_WORKER, "worker_id", K_TEXT, PC_WORKER)                                                    \
    X(F_DEADLINE, "deadline", K_TIME, PC_DEADLINE)                                                 \
    X(F_RESULT, "result", K_JSON, PC_RESULT)                                                       \
    X(F_LAST_ERROR, "last_error", K_TEXT, PC_LAST_ERROR)                                           \
    X(F_UPDATED_SEQ, "updated_seq", K_BIGINT, 0)                                                   \
    X(F_FINISHED_SEQ, "finished_seq", K_BIGINT, 0)                                                 \
    X(F_AFTER, "after", K_JSON, 0)                                                                 \
    X(F_AFTER_POLICY, "after_policy", K_TEXT, 0)                                                   \
    X(F_BATCH, "batch", K_TEXT, 0)                                                                 \
    X(F_TRACE, "trace", K_JSON, 0)                                                                 \
    X(F_HISTORY, "history", K_SEQS, 0)

#define FIELD_ENUM(f, name, kind, pc) f,
typedef enum { FIELD_TABLE(FIELD_ENUM) F_COUNT } Field;

typedef struct FieldDef {
    const char *name;
    ColKind kind;
    int pc;
} FieldDef;

#define FIELD_DEF(f, name, kind, pc) [f] = {name, kind, pc},
static const FieldDef fields[] = {FIELD_TABLE(FIELD_DEF)};
_Static_assert(sizeof fields / sizeof fields[0] == F_COUNT, "a FieldDef per Field");

/* Every PC_* bit has one column: an update that sets a bit with no column
 * would never be written, two columns on one bit would both be. */
#define FIELD_PC_OR(f, name, kind, pc) | (pc)
#define FIELD_PC_SUM(f, name, kind, pc) +(pc)
_Static_assert((0 FIELD_TABLE(FIELD_PC_OR)) == PC_ALL,
               "every PC_* bit of projection.h needs a column in FIELD_TABLE");
_Static_assert((0 FIELD_TABLE(FIELD_PC_SUM)) == PC_ALL,
               "a PC_* bit belongs to one column of FIELD_TABLE only");

static const Field open_new_cols[] = {
    F_ID,         F_QUEUE,        F_KEY,     F_PRIORITY, F_PAYLOAD,    F_STATUS,
    F_ATTEMPTS,   F_MAX_ATTEMPTS, F_TIMEOUT, F_RUN_AT,   F_CREATED_AT, F_ACCEPTED_SEQ,
    F_STARTED_AT, F_FINISHED_AT,  F_WORKER,  F_DEADLINE, F_LAST_ERROR, F_UPDATED_SEQ,
    F_AFTER,      F_AFTER_POLICY, F_BATCH,   F_TRACE,    F_HISTORY};
static const Field open_up_cols[] = {
    F_ID,          F_MASK,   F_STATUS,   F_ATTEMPTS,   F_MAX_ATTEMPTS, F_RUN_AT,      F_STARTED_AT,
    F_FINISHED_AT, F_WORKER, F_DEADLINE, F_LAST_ERROR, F_ACCEPTED_SEQ, F_UPDATED_SEQ, F_HISTORY};
static const Field done_cols[] = {
    F_ID,         F_MASK,         F_QUEUE,        F_KEY,     F_PRIORITY,   F_PAYLOAD,
    F_STATUS,     F_ATTEMPTS,     F_MAX_ATTEMPTS, F_TIMEOUT, F_CREATED_AT, F_ACCEPTED_SEQ,
    F_STARTED_AT, F_FINISHED_AT,  F_WORKER,       F_RESULT,  F_LAST_ERROR, F_FINISHED_SEQ,
    F_AFTER,      F_AFTER_POLICY, F_BATCH,        F_TRACE,   F_HISTORY};
#define NCOLS(a) (sizeof(a) / sizeof((a)[0]))

/* The columns of a log record (record.h): a commit's events, as one or
 * more records. */
typedef enum { R_FIRST, R_LAST, R_LAST_AT, R_CONTROL, R_EVENTS, R_COUNT } RecField;
static const FieldDef rec_fields[] = {
    [R_FIRST] = {"first_seq", K_BIGINT, 0}, [R_LAST] = {"last_seq", K_BIGINT, 0},
    [R_LAST_AT] = {"last_at", K_TIME, 0},   [R_CONTROL] = {"control", K_BOOL, 0},
    [R_EVENTS] = {"events", K_TEXT, 0},
};
_Static_assert(sizeof rec_fields / sizeof rec_fields[0] == R_COUNT, "a FieldDef per RecField");

/* What a commit adds to workd_activity, per queue: one array parameter per
 * column, after the queues'. */
typedef enum { A_ACCEPTED, A_COMPLETED, A_FAILED, A_DEAD, A_CANCELLED, A_COUNT } ActKind;
static const char *const act_cols[A_COUNT] = {"accepted", "completed", "failed", "dead",
                                              "cancelled"};

/* The scalar parameters come first: $1.. */
enum {
    P_TERM = 1,
    P_OPENING,
    P_PART,
    P_LAST_SEQ,
    P_FIRST_AT,
    P_PREV_SEQ,  /* the last event of the append before, or NULL: see journal_append_send */
    P_PREV_PART, /* its part */
    P_INBOX,
    P_SHARD,
    P_NOTIFY, /* whether the append notifies (else its own transaction does: NOTIFY_SQL) */
    P_ACT_QUEUES,
    P_ACT_FIRST,                         /* A_COUNT of them */
    P_PROG_WORK = P_ACT_FIRST + A_COUNT, /* the progress reports: their work ids */
    P_PROG_SEQ,                          /* and seqs */
    P_SCALARS = P_PROG_SEQ
};

static const char *array_type(ColKind k)
{
    switch (k) {
    case K_INT:
    case K_BOOL:
        return "int[]";
    case K_BIGINT:
    case K_TIME:
        return "bigint[]";
    case K_TEXT:
    case K_JSON:
    case K_SEQS:
        break;
    }
    return "text[]";
}

/* "(SELECT unnest($a::t[]) AS name, ...) AS alias", numbering from *param:
 * the arrays side by side, row by row. In the select list, not as
 * unnest(a, b, ...) in FROM: that form keeps each array's rows in a tuplestore
 * of its own before joining them, which cost ~60 µs per statement and ~2 µs
 * per row of 15 arrays (measured in d59821c). */
static void sql_unnest(SBuf *b, int *param, const FieldDef *defs, const int *cols, size_t n,
                       const char *alias)
{
    sbuf_puts(b, "(SELECT ");
    for (size_t i = 0; i < n; i++)
        sbuf_printf(b, "%sunnest($%d::%s) AS %s", i ? ", " : "", (*param)++,
                    array_type(defs[cols[i]].kind), defs[cols[i]].name);
    sbuf_printf(b, ") AS %s", alias);
}

/* The SQL value of a parameter column. */
static void sql_value(SBuf *b, const char *alias, const FieldDef *f)
{
    if (f->kind == K_TIME)
        sbuf_printf(b, "workd_ts(%s.%s)", alias, f->name);
    else if (f->kind == K_JSON)
        sbuf_printf(b, "%s.%s::jsonb", alias, f->name);
    else if (f->kind == K_SEQS)
        sbuf_printf(b, "%s.%s::bigint[]", alias, f->name);
    else if (f->kind == K_BOOL)
        sbuf_printf(b, "(%s.%s <> 0)", alias, f->name);
    else
        sbuf_printf(b, "%s.%s", alias, f->name);
}

/* The value a changed row gets: the commit's where its bit is set, else the
 * old row's (alias old), or (immutable columns) the commit's if it has one;
 * a list of seqs grows by the commit's. */
static void sql_overlay(SBuf *b, const char *alias, const char *old, const FieldDef *f)
{
    if (f->kind == K_SEQS) {
        sbuf_printf(b, "%s.%s || ", old, f->name);
        sql_value(b, alias, f);
    } else if (f->pc) {
        sbuf_printf(b, "CASE WHEN %s.m & %d <> 0 THEN ", alias, f->pc);
        sql_value(b, alias, f);
        sbuf_printf(b, " ELSE %s.%s END", old, f->name);
    } else if (!strcmp(f->name, "id") || !strcmp(f->name, "finished_seq")) {
        sql_value(b, alias, f);
    } else {
        sbuf_puts(b, "coalesce(");
        sql_value(b, alias, f);
        sbuf_printf(b, ", %s.%s)", old, f->name);
    }
}

static void sql_names(SBuf *b, const Field *cols, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sbuf_printf(b, "%s%s", i ? ", " : "", fields[cols[i]].name);
}

enum {
    N_PARAMS = P_SCALARS + R_COUNT + NCOLS(open_new_cols) + NCOLS(open_up_cols) + NCOLS(done_cols)
};

/* The parts of the append statement: each a CTE, written only when the
 * commit has rows for it (see append_shape). */
typedef enum {
    AP_BASE,     /* the fence, the log records, the part's first seq: every commit */
    AP_NEW,      /* open rows accepted in this commit */
    AP_UP,       /* open rows changed */
    AP_DONE,     /* finished rows: out of workd_open, into workd_done, counted */
    AP_ACT,      /* the dashboard's activity counts */
    AP_PROGRESS, /* progress reports, found by work id in workd_progress */
    AP_INBOX,
    AP_END, /* the closing SELECT: every commit */
    AP_COUNT
} AppendPart;

/* The append statement of one shape (a bit per AppendPart present besides
 * AP_BASE and AP_END, which every shape has).
 * Every shape numbers the parameters alike; *used says which it reads. */
/* The statement's parts (append_sql): each appends its CTE to b, taking its
 * array parameters from *param on, in the order the append sends them. */

/* The fence, the log records, the part's first seq. */
static void sql_log(SBuf *b, int *param)
{
    int rec_cols[R_COUNT];
    for (int i = 0; i < R_COUNT; i++)
        rec_cols[i] = i;
    sbuf_printf(
        b,
        "WITH lk AS (SELECT workd_fence($%d::int, $%d::bigint, $%d::boolean)"
        " AND ($%d::bigint IS NULL OR EXISTS (SELECT 1 FROM workd_log"
        " WHERE shard = $%d::int AND part = $%d::int AND last_seq = $%d::bigint)) AS ok),\n",
        P_SHARD, P_TERM, P_OPENING, P_PREV_SEQ, P_SHARD, P_PREV_PART, P_PREV_SEQ);
    sbuf_puts(b, "ev AS (INSERT INTO workd_log (");
    for (int i = 0; i < R_COUNT; i++)
        sbuf_printf(b, "%s, ", rec_fields[i].name);
    sbuf_puts(b, "term, part, shard)\n  SELECT ");
    for (int i = 0; i < R_COUNT; i++) {
        sql_value(b, "e", &rec_fields[i]);
        sbuf_puts(b, ", ");
    }
    sbuf_printf(b, "$%d::bigint, $%d::int, $%d::int\n  FROM ", P_TERM, P_PART, P_SHARD);
    int first_rec = *param;
    sql_unnest(b, param, rec_fields, rec_cols, R_COUNT, "e");
    sbuf_puts(b, "\n  WHERE (SELECT ok FROM lk) RETURNING last_seq - first_seq + 1 AS n),\n");
    sbuf_printf(b,
                "pt AS (UPDATE workd_parts"
                "  SET first_seq = ($%d::bigint[])[1], first_at = workd_ts($%d::bigint)\n"
                "  WHERE part = $%d::int AND first_seq IS NULL AND (SELECT ok FROM lk)),\n",
                first_rec + R_FIRST, P_FIRST_AT, P_PART);
}

/* Work accepted in the commit: new open rows. */
static void sql_open_new(SBuf *b, int *param)
{
    int cols[F_COUNT];
    sbuf_puts(b, "nw AS (INSERT INTO workd_open (");
    sql_names(b, open_new_cols, NCOLS(open_new_cols));
    sbuf_puts(b, ", shard)\n  SELECT ");
    for (size_t i = 0; i < NCOLS(open_new_cols); i++) {
        sbuf_puts(b, i ? ", " : "");
        sql_value(b, "n", &fields[open_new_cols[i]]);
        cols[i] = open_new_cols[i];
    }
    sbuf_printf(b, ", $%d::int\n  FROM ", P_SHARD);
    sql_unnest(b, param, fields, cols, NCOLS(open_new_cols), "n");
    sbuf_puts(b, "\n  WHERE (SELECT ok FROM lk)),\n");
}

/* Open work the commit changed: the columns it changed, overlaid. */
static void sql_open_update(SBuf *b, int *param)
{
    int cols[F_COUNT];
    sbuf_puts(b, "up AS (UPDATE workd_open w SET ");
    for (size_t i = 0; i < NCOLS(open_up_cols); i++) {
        const FieldDef *f = &fields[open_up_cols[i]];
        cols[i] = open_up_cols[i];
        if (open_up_cols[i] == F_ID || open_up_cols[i] == F_MASK)
            continue;
        sbuf_printf(b, "%s = ", f->name);
        sql_overlay(b, "u", "w", f);
        sbuf_puts(b, i + 1 < NCOLS(open_up_cols) ? ",\n    " : "");
    }
    sbuf_puts(b, "\n  FROM ");
    int up_ids = *param; /* open_up_cols[0] is the id */
    sql_unnest(b, param, fields, cols, NCOLS(open_up_cols), "u");
    sbuf_printf(b, "\n  WHERE w.id = u.id AND w.id = ANY($%d::text[]) AND (SELECT ok FROM lk)),\n",
                up_ids);
}

/* Finished work: the rows that were open leave workd_open, their done row
 * made in the DELETE's RETURNING from the old row overlaid with the commit's
 * changes (m = -1: accepted in this commit, no old row). The array parameters
 * are the same for both uses. Then the finished counts per part, kept as the
 * rows are written, so that no read ever counts the history (GET /queues);
 * they leave with their part. */
static void sql_done(SBuf *b, int *param)
{
    int cols[F_COUNT];
    for (size_t i = 0; i < NCOLS(done_cols); i++)
        cols[i] = done_cols[i];
    SBuf dsrc;
    sbuf_init(&dsrc);
    int done_ids = *param; /* done_cols[0] is the id */
    sql_unnest(&dsrc, param, fields, cols, NCOLS(done_cols), "d");
    sbuf_printf(b, "gone AS (DELETE FROM workd_open g USING %s\n", dsrc.data);
    sbuf_printf(b,
                "  WHERE g.id = d.id AND g.id = ANY($%d::text[]) AND d.m <> -1"
                " AND (SELECT ok FROM lk)\n  RETURNING ",
                done_ids);
    for (size_t i = 0; i < NCOLS(done_cols); i++) {
        if (done_cols[i] == F_MASK)
            continue;
        sbuf_puts(b, i ? ", " : "");
        if (done_cols[i] == F_RESULT) /* open rows have none */
            sql_value(b, "d", &fields[F_RESULT]);
        else
            sql_overlay(b, "d", "g", &fields[done_cols[i]]);
    }
    sbuf_puts(b, "),\n");
    sbuf_puts(b, "dn AS (INSERT INTO workd_done (");
    sql_names(b, done_cols + 0, 1);
    sbuf_puts(b, ", ");
    sql_names(b, done_cols + 2, NCOLS(done_cols) - 2);
    sbuf_printf(b,
                ", part, shard)\n  SELECT *, $%d::int, $%d::int FROM gone\n  UNION ALL\n  SELECT ",
                P_PART, P_SHARD);
    for (size_t i = 0; i < NCOLS(done_cols); i++) {
        if (done_cols[i] == F_MASK)
            continue;
        sbuf_puts(b, i ? ", " : "");
        sql_value(b, "d", &fields[done_cols[i]]);
    }
    sbuf_printf(b,
                ", $%d::int, $%d::int\n  FROM %s\n  WHERE d.m = -1 AND (SELECT ok FROM lk)\n"
                "  RETURNING queue, status),\n",
                P_PART, P_SHARD, dsrc.data);
    sbuf_free(&dsrc);
    sbuf_printf(
        b,
        "cnt AS (INSERT INTO workd_counts (part, queue, status, n)\n"
        "  SELECT $%d::int, queue, status, count(*) FROM dn GROUP BY queue, status\n"
        "  ON CONFLICT (part, queue, status) DO UPDATE SET n = workd_counts.n + EXCLUDED.n),\n",
        P_PART);
}

/* Activity per queue and bucket (the dashboard's chart), added up here from
 * the commit's events so that no read counts the log. */
static void sql_activity(SBuf *b)
{
    sbuf_printf(b,
                "act AS (INSERT INTO workd_activity AS a (bucket, queue, accepted, completed, "
                "failed, dead, cancelled)\n"
                "  SELECT $%d::bigint / %d * %d, t.* FROM (SELECT unnest($%d::text[])",
                P_FIRST_AT, ACTIVITY_BUCKET_S * 1000, ACTIVITY_BUCKET_S, P_ACT_QUEUES);
    for (int k = 0; k < A_COUNT; k++) /* as sql_unnest */
        sbuf_printf(b, ", unnest($%d::bigint[])", P_ACT_FIRST + k);
    sbuf_puts(b,
              ") AS t\n  WHERE (SELECT ok FROM lk)\n  ON CONFLICT (bucket, queue) DO UPDATE SET ");
    for (int k = 0; k < A_COUNT; k++)
        sbuf_printf(b, "%s%s = a.%s + EXCLUDED.%s", k ? ", " : "", act_cols[k], act_cols[k],
                    act_cols[k]);
    sbuf_puts(b, "),\n");
}

static char *append_sql(unsigned shape, bool used[N_PARAMS + 1])
{
    SBuf part[AP_COUNT];
    for (int i = 0; i < AP_COUNT; i++)
        sbuf_init(&part[i]);
    int param = P_SCALARS + 1; /* every part numbers its arrays, used or not */
    sql_log(&part[AP_BASE], &param);
    sql_open_new(&part[AP_NEW], &param);
    sql_open_update(&part[AP_UP], &param);
    sql_done(&part[AP_DONE], &param);
    sql_activity(&part[AP_ACT]);
    sbuf_printf(&part[AP_PROGRESS],
                "pr AS (INSERT INTO workd_progress (work_id, seq, part)\n"
                "  SELECT unnest($%d::text[]), unnest($%d::bigint[]), $%d::int"
                " WHERE (SELECT ok FROM lk)),\n",
                P_PROG_WORK, P_PROG_SEQ, P_PART);
    sbuf_printf(
        &part[AP_INBOX],
        "ib AS (DELETE FROM workd_inbox WHERE n = ANY($%d::bigint[]) AND (SELECT ok FROM lk)),\n",
        P_INBOX);
    sbuf_printf(&part[AP_END],
                "SELECT (SELECT coalesce(sum(n), 0) FROM ev),"
                " CASE WHEN $%d::boolean THEN pg_notify('workd_events', $%d) END",
                P_NOTIFY, P_LAST_SEQ);

    /* Joined: each CTE ends in ",\n", the last one's comma dropped. */
    SBuf sql;
    sbuf_init(&sql);
    for (int i = 0; i < AP_COUNT; i++) {
        if (i == AP_END && sql.len >= 2)
            sql.len -= 2, sbuf_puts(&sql, "\n");
        if (i == AP_BASE || i == AP_END || (shape & (1u << i)))
            sbuf_append(&sql, part[i].data, part[i].len);
        sbuf_free(&part[i]);
    }
    memset(used, 0, (N_PARAMS + 1) * sizeof *used);
    for (const char *p = sql.data; (p = strchr(p, '$'));) {
        long n = strtol(p + 1, (char **)&p, 10);
        if (n > 0 && n <= N_PARAMS)
            used[n] = true;
    }
    return sbuf_steal(&sql);
}

/* One array parameter being built in PostgreSQL's binary array form (what
 * array_send writes), so that the server reads each element with its
 * receive function rather than parsing a literal: a header (dimensions,
 * whether any element is NULL, the element type), then each element as its
 * length (-1: NULL) and its bytes, all integers big-endian. */
typedef struct Col {
    SBuf b; /* the elements, after ARRAY_HEADER bytes left for the header */
    size_t n;
    Oid elem; /* int4, int8 or text */
    bool nulls;
} Col;

enum { OID_INT8 = 20, OID_INT4 = 23, OID_TEXT = 25, ARRAY_HEADER = 20 };

static Oid elem_oid(ColKind k)
{
    switch (k) {
    case K_INT:
    case K_BOOL:
        return OID_INT4;
    case K_BIGINT:
    case K_TIME:
        return OID_INT8;
    case K_TEXT:
    case K_JSON:
    case K_SEQS:
        break;
    }
    return OID_TEXT;
}

static void put_be32(SBuf *b, uint32_t v)
{
    unsigned char x[4] = {v >> 24, v >> 16, v >> 8, v};
    sbuf_append(b, x, 4);
}

static void col_begin(Col *c, ColKind k)
{
    memset(c, 0, sizeof *c);
    sbuf_init(&c->b);
    sbuf_append(&c->b, (char[ARRAY_HEADER]){0}, ARRAY_HEADER);
    c->elem = elem_oid(k);
}

static void col_int(Col *c, int64_t v)
{
    c->n++;
    if (c->elem == OID_INT4) {
        put_be32(&c->b, 4);
        put_be32(&c->b, (uint32_t)(int32_t)v);
    } else {
        put_be32(&c->b, 8);
        put_be32(&c->b, (uint32_t)((uint64_t)v >> 32));
        put_be32(&c->b, (uint32_t)v);
    }
}

static void col_null(Col *c)
{
    c->n++;
    c->nulls = true;
    put_be32(&c->b, UINT32_MAX); /* -1 */
}

/* A time: 0 is NULL. */
static void col_time(Col *c, int64_t ms)
{
    if (ms)
        col_int(c, ms);
    else
        col_null(c);
}

static void col_text(Col *c, const char *s)
{
    if (!s) {
        col_null(c);
        return;
    }
    size_t len = strlen(s);
    c->n++;
    put_be32(&c->b, (uint32_t)len);
    sbuf_append(&c->b, s, len);
}

static void col_json(Col *c, const json_t *v)
{
    char *txt = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    col_text(c, txt);
    free(txt);
}

/* Writes the header; the parameter is c->b.data, c->b.len bytes long. An
 * empty array has no dimensions (its header is 12 bytes). */
static const char *col_end(Col *c)
{
    SBuf h;
    sbuf_init(&h);
    put_be32(&h, c->n ? 1 : 0);
    put_be32(&h, c->nulls);
    put_be32(&h, c->elem);
    if (c->n) {
        put_be32(&h, (uint32_t)c->n);
        put_be32(&h, 1); /* the lower bound */
        memcpy(c->b.data, h.data, ARRAY_HEADER);
    } else {
        memcpy(c->b.data, h.data, 12);
        c->b.len = 12;
    }
    sbuf_free(&h);
    return c->b.data;
}

/* A list of seqs as the text of a bigint[] ("{1,2}"); NULL when empty (an
 * update then keeps the old row's). */
static void col_seqs(Col *c, const int64_t *seqs, size_t n)
{
    if (!n) {
        col_null(c);
        return;
    }
    char *text = seqs_array(seqs, n);
    col_text(c, text);
    free(text);
}

/* A row's trace context as its column holds it: {"traceparent", "tracestate"?},
 * or NULL (most work has none, and pays nothing for it). */
static void col_trace(Col *c, const ProjRow *r)
{
    if (!r->traceparent) {
        col_null(c);
        return;
    }
    json_t *t = json_pack("{s:s}", "traceparent", r->traceparent);
    if (r->tracestate)
        json_object_set_new(t, "tracestate", json_string(r->tracestate));
    col_json(c, t);
    json_decref(t);
}

/* Work that is finished for good leaves workd_open; dead work stays there,
 * waiting for an operator. */
static bool row_is_done(const ProjRow *r)
{
    return r->status && (!strcmp(r->status, "completed") || !strcmp(r->status, "cancelled"));
}

/* Appends field f of row r. A row that is not new sends only what changed:
 * columns it did not change are NULL and the SQL keeps the old row's. */
static void put_field(Col *c, const ProjRow *r, Field f)
{
    const FieldDef *d = &fields[f];
    if (!r->is_new && f != F_ID && f != F_MASK && f != F_UPDATED_SEQ && f != F_FINISHED_SEQ &&
        f != F_HISTORY && !(d->pc & r->changed)) {
        col_null(c);
        return;
    }
    switch (f) {
    case F_ID:
        col_text(c, r->id);
        return;
    case F_MASK: /* -1: accepted in this commit (every column is new) */
        col_int(c, r->is_new ? -1 : r->changed);
        return;
    case F_KEY:
        col_text(c, r->key);
        return;
    case F_QUEUE:
        col_text(c, r->queue);
        return;
    case F_PRIORITY:
        col_int(c, r->priority);
        return;
    case F_PAYLOAD:
        col_json(c, r->payload ? r->payload : json_null());
        return;
    case F_STATUS:
        col_text(c, r->status);
        return;
    case F_ATTEMPTS:
        col_int(c, r->attempts);
        return;
    case F_MAX_ATTEMPTS:
        col_int(c, r->max_attempts);
        return;
    case F_TIMEOUT:
        col_int(c, r->timeout_ms);
        return;
    case F_RUN_AT:
        col_time(c, r->run_at);
        return;
    case F_CREATED_AT:
        col_time(c, r->created_at);
        return;
    case F_ACCEPTED_SEQ:
        col_int(c, r->accepted_seq);
        return;
    case F_STARTED_AT:
        col_time(c, r->started_at);
        return;
    case F_FINISHED_AT:
        col_time(c, r->finished_at);
        return;
    case F_WORKER:
        col_text(c, r->worker_id);
        return;
    case F_DEADLINE:
        col_time(c, r->deadline);
        return;
    case F_RESULT:
        col_json(c, r->result);
        return;
    case F_LAST_ERROR:
        col_text(c, r->last_error);
        return;
    case F_UPDATED_SEQ:
    case F_FINISHED_SEQ:
        col_int(c, r->updated_seq);
        return;
    case F_HISTORY:
        col_seqs(c, r->hist, r->n_hist);
        return;
    case F_AFTER:
        col_json(c, r->after);
        return;
    case F_AFTER_POLICY:
        col_text(c, r->after_policy);
        return;
    case F_BATCH:
        col_text(c, r->batch);
        return;
    case F_TRACE:
        col_trace(c, r);
        return;
    case F_COUNT:
        break;
    }
}

static void cols_begin(Col *cols, const Field *defs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        col_begin(&cols[i], fields[defs[i]].kind);
}

static void put_row(Col *cols, const Field *defs, size_t n, const ProjRow *r)
{
    for (size_t i = 0; i < n; i++)
        put_field(&cols[i], r, defs[i]);
}

/* The shapes of append statement, all prepared on the leader's session when
 * it wins (journal_prepare), so that appends can be sent one behind another
 * in pipeline mode, where a statement cannot be prepared synchronously. */
static _Thread_local struct {
    PGconn *conn;
    bool used[1u << AP_END][N_PARAMS + 1]; /* the parameters shape reads ($1 is [1]) */
    bool notify_apart;                     /* each append's NOTIFY in a transaction of its own */
} shapes;

_Static_assert(AP_END <= 8, "shapes (bits 1 to AP_END - 1) fit an unsigned char");

/* Every shape: AP_BASE and AP_END always, any set of the parts between. */
#define SHAPE_BITS (((1u << AP_END) - 1) & ~1u)

static void shape_name(unsigned shape, char *name, size_t name_size)
{
    snprintf(name, name_size, "workd_append_%02x", shape);
}

/* The NOTIFY on channel workd_events that tells every node's listener of an
 * append. PostgreSQL makes a transaction that sent NOTIFY hold a lock of the
 * whole database from before its commit until its commit record is flushed
 * (so that notifications come in commit order): with several shards, their
 * appends would commit one after another, each behind the others'
 * fdatasync. So there each append's NOTIFY is a transaction of its own, sent
 * right behind it, notifying only if the append committed (its last record
 * is there): it has no transaction id and writes no commit record, and holds
 * the lock for microseconds. With one shard the append notifies itself,
 * which costs no statement more. */
#define NOTIFY_NAME "workd_notify"
#define NOTIFY_SQL                                                                                 \
    "SELECT pg_notify('workd_events', $3::text) WHERE EXISTS"                                      \
    " (SELECT 1 FROM workd_log WHERE shard = $1::int AND last_seq = $2::bigint)"

int journal_prepare(PGconn *c, bool notify_apart, Err *err)
{
    shapes.notify_apart = notify_apart;
    /* The append's plan does not depend on its parameters (arrays of any
     * length): plan it once, not at every commit. Nor on the statistics of
     * workd_open, which swing with the open work: a table vacuumed while it
     * held a few rows on many pages, and refilled since, still looks nearly
     * empty to the planner. With nested loops, a plan made then scans
     * workd_open whole and joins the commit's rows to it by filter, at a cost
     * of open rows x commit rows (2,000 against 2,500: 150 ms); a slower
     * commit makes the next one larger, and soaks at 4,000 jobs/s stalled for
     * 30-50 s (test_storage.py reproduces the statistics). So this session
     * joins by hash only and reaches workd_open by key only (its updates and
     * deletes name their ids with = ANY): a commit's cost follows its own
     * rows, whatever the statistics say. Recovery's read of all open work
     * turns sequential scans back on for itself (journal_recover). */
    if (db_command(c,
                   "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off;"
                   " SET enable_nestloop = off; SET enable_hashjoin = on",
                   "configuring the leader's session", err) != 0)
        return -1;
    /* All shapes in one round trip. A parameter a shape does not read is
     * declared text (its type cannot be inferred) and sent as NULL; the
     * others are typed by their casts. */
    shapes.conn = NULL;
    if (!PQenterPipelineMode(c))
        return err_set(err, 503, "database-unavailable", "preparing the append statements: %s",
                       PQerrorMessage(c));
    int sent = 0, rc = 0;
    for (unsigned shape = 0; shape <= SHAPE_BITS && rc == 0; shape += 2) {
        if (shape & ~SHAPE_BITS)
            continue;
        bool *used = shapes.used[shape];
        char *sql = append_sql(shape, used), name[32];
        Oid types[N_PARAMS];
        for (int i = 0; i < N_PARAMS; i++)
            types[i] = used[i + 1] ? 0 : OID_TEXT;
        shape_name(shape, name, sizeof name);
        if (PQsendPrepare(c, name, sql, N_PARAMS, types))
            sent++;
        else
            rc = err_set(err, 503, "database-unavailable", "preparing the append statements: %s",
                         PQerrorMessage(c));
        free(sql);
    }
    if (rc == 0 && PQsendPrepare(c, NOTIFY_NAME, NOTIFY_SQL, 3, NULL))
        sent++;
    else if (rc == 0)
        rc = err_set(err, 503, "database-unavailable", "preparing the append statements: %s",
                     PQerrorMessage(c));
    if (rc == 0 && !PQpipelineSync(c))
        rc = err_set(err, 503, "database-unavailable", "preparing the append statements: %s",
                     PQerrorMessage(c));
    for (int i = 0; i < sent && rc == 0; i++) {
        PGresult *r = PQgetResult(c), *end;
        rc = db_check(c, r, "preparing the append statements", err);
        PQclear(r);
        while ((end = PQgetResult(c))) /* the NULL that ends each statement's results */
            PQclear(end);
    }
    PGresult *sync = rc == 0 ? PQgetResult(c) : NULL;
    if (rc == 0 && PQresultStatus(sync) != PGRES_PIPELINE_SYNC)
        rc = err_set(err, 500, "database-error", "preparing the append statements: no sync");
    PQclear(sync);
    if (rc == 0 && !PQexitPipelineMode(c))
        rc = err_set(err, 500, "database-error", "preparing the append statements: %s",
                     PQerrorMessage(c));
    if (rc == 0)
        shapes.conn = c;
    return rc;
}

/* The kind of activity an event is (-1: none the chart shows). */
static int act_kind(EventType t)
{
    switch (t) {
    case EV_ACCEPTED:
        return A_ACCEPTED;
    case EV_COMPLETED:
        return A_COMPLETED;
    case EV_FAILED:
    case EV_TIMED_OUT:
        return A_FAILED;
    case EV_DEAD:
        return A_DEAD;
    case EV_CANCELLED:
        return A_CANCELLED;
    default:
        return -1;
    }
}

/* The activity parameters of a commit: cols[0] the queues, cols[1 + k] the
 * counts of kind k, one element per queue the events name. */
static void activity_cols(const EventList *events, Col *cols)
{
    typedef struct {
        const char *queue;
        int64_t n[A_COUNT];
    } Act;
    col_begin(&cols[0], K_TEXT);
    for (int k = 0; k < A_COUNT; k++)
        col_begin(&cols[1 + k], K_BIGINT);
    Act *acts = NULL;
    size_t n = 0, cap = 0;
    HMap idx; /* queue -> 1 + its index in acts */
    hmap_init(&idx);
    for (size_t i = 0; i < events->len; i++) {
        const Event *e = &events->items[i];
        int k = act_kind(e->type);
        if (k < 0 || !e->queue)
            continue;
        size_t at = (size_t)(uintptr_t)hmap_get(&idx, e->queue);
        if (!at) {
            if (n == cap) {
                cap = cap ? cap * 2 : 4;
                acts = xrealloc(acts, cap * sizeof *acts);
            }
            memset(&acts[n], 0, sizeof acts[n]);
            acts[n].queue = e->queue;
            at = ++n;
            hmap_put(&idx, e->queue, (void *)(uintptr_t)at);
        }
        acts[at - 1].n[k]++;
    }
    for (size_t i = 0; i < n; i++) {
        col_text(&cols[0], acts[i].queue);
        for (int k = 0; k < A_COUNT; k++)
            col_int(&cols[1 + k], acts[i].n[k]);
    }
    hmap_free(&idx);
    free(acts);
}

/* The commit's progress reports: cols[0] their work ids, cols[1] their seqs. */
static void progress_cols(const EventList *events, Col *cols)
{
    col_begin(&cols[0], K_TEXT);
    col_begin(&cols[1], K_BIGINT);
    for (size_t i = 0; i < events->len; i++) {
        const Event *e = &events->items[i];
        if (e->type != EV_PROGRESS || !e->work_id)
            continue;
        col_text(&cols[0], e->work_id);
        col_int(&cols[1], e->seq);
    }
}

/* The commit's events as log records (record.h): lines cut into records of
 * about RECORD_BYTES. */
static void put_records(Col *rec, const EventList *events)
{
    SBuf lines;
    sbuf_init(&lines);
    size_t first = 0;
    bool control = false;
    for (size_t i = 0; i < events->len; i++) {
        const Event *e = &events->items[i];
        if (lines.len)
            sbuf_puts(&lines, "\n");
        record_line(&lines, e);
        control |= record_is_control(e->type);
        if (lines.len < RECORD_BYTES && i + 1 < events->len)
            continue;
        col_int(&rec[R_FIRST], events->items[first].seq);
        col_int(&rec[R_LAST], e->seq);
        col_time(&rec[R_LAST_AT], e->at);
        col_int(&rec[R_CONTROL], control);
        col_text(&rec[R_EVENTS], lines.data);
        sbuf_reset(&lines);
        first = i + 1;
        control = false;
    }
    sbuf_free(&lines);
}

int journal_append_send(PGconn *c, int shard, int part, const EventList *events,
                        ProjRow *const *rows, size_t nrows, const int64_t *inbox, size_t n_inbox,
                        const AppendAfter *after, Err *err)
{
    if (shapes.conn != c)
        return err_set(err, 500, "internal", "the append statements are not prepared");
    enum { N_ARRAYS = N_PARAMS - P_SCALARS };
    Col cols[N_ARRAYS];
    Col *rec = cols, *nw = rec + R_COUNT, *up = nw + NCOLS(open_new_cols),
        *dn = up + NCOLS(open_up_cols);
    for (int i = 0; i < R_COUNT; i++)
        col_begin(&rec[i], rec_fields[i].kind);
    cols_begin(nw, open_new_cols, NCOLS(open_new_cols));
    cols_begin(up, open_up_cols, NCOLS(open_up_cols));
    cols_begin(dn, done_cols, NCOLS(done_cols));
    unsigned shape = n_inbox ? 1u << AP_INBOX : 0;
    put_records(rec, events);
    for (size_t i = 0; i < nrows; i++) {
        const ProjRow *r = rows[i];
        if (row_is_done(r)) {
            put_row(dn, done_cols, NCOLS(done_cols), r);
            shape |= 1u << AP_DONE;
        } else if (r->is_new) {
            put_row(nw, open_new_cols, NCOLS(open_new_cols), r);
            shape |= 1u << AP_NEW;
        } else {
            put_row(up, open_up_cols, NCOLS(open_up_cols), r);
            shape |= 1u << AP_UP;
        }
    }
    char term[24], partv[16], last[40], first_at[24], prev[24], prev_part[16], shardv[16];
    snprintf(term, sizeof term, "%lld", (long long)events->items[0].term);
    snprintf(prev, sizeof prev, "%lld", after ? (long long)after->seq : 0LL);
    snprintf(prev_part, sizeof prev_part, "%d", after ? after->part : 0);
    snprintf(partv, sizeof partv, "%d", part);
    journal_notify_payload(shard, events->items[events->len - 1].seq, last, sizeof last);
    snprintf(shardv, sizeof shardv, "%d", shard);
    snprintf(first_at, sizeof first_at, "%lld", (long long)events->items[0].at);
    const char *params[N_PARAMS];
    int lengths[N_PARAMS] = {0}, formats[N_PARAMS] = {0};
    params[P_TERM - 1] = term;
    params[P_OPENING - 1] = events->items[0].type == EV_TERM ? "t" : "f";
    params[P_PART - 1] = partv;
    params[P_LAST_SEQ - 1] = last;
    params[P_FIRST_AT - 1] = first_at;
    params[P_PREV_SEQ - 1] = after ? prev : NULL;
    params[P_PREV_PART - 1] = after ? prev_part : NULL;
    char *inbox_ns = seqs_array(inbox, n_inbox);
    params[P_INBOX - 1] = inbox_ns;
    params[P_SHARD - 1] = shardv;
    params[P_NOTIFY - 1] = shapes.notify_apart ? "f" : "t";
    Col act[1 + A_COUNT], prog[2];
    activity_cols(events, act);
    progress_cols(events, prog);
    Col *binary[N_PARAMS] = {0}; /* the array parameters, by index */
    for (int k = 0; k <= A_COUNT; k++)
        binary[P_ACT_QUEUES - 1 + k] = &act[k];
    binary[P_PROG_WORK - 1] = &prog[0];
    binary[P_PROG_SEQ - 1] = &prog[1];
    if (prog[0].n)
        shape |= 1u << AP_PROGRESS;
    for (int i = 0; i < N_ARRAYS; i++)
        binary[P_SCALARS + i] = &cols[i];
    if (act[0].n)
        shape |= 1u << AP_ACT;
    char name[32];
    shape_name(shape, name, sizeof name);
    const bool *used = shapes.used[shape];
    for (int i = 0; i < N_PARAMS; i++) {
        if (!binary[i])
            continue;
        params[i] = used[i + 1] ? col_end(binary[i]) : NULL; /* NULL: not read */
        lengths[i] = (int)binary[i]->b.len;
        formats[i] = 1;
    }
    int rc = 0;
    char last_seq[24];
    snprintf(last_seq, sizeof last_seq, "%lld", (long long)events->items[events->len - 1].seq);
    const char *nparams[] = {shardv, last_seq, last};
    if ((PQpipelineStatus(c) == PQ_PIPELINE_OFF && !PQenterPipelineMode(c)) ||
        !PQsendQueryPrepared(c, name, N_PARAMS, params, lengths, formats, 0) ||
        !PQpipelineSync(c) ||
        (shapes.notify_apart &&
         (!PQsendQueryPrepared(c, NOTIFY_NAME, 3, nparams, NULL, NULL, 0) || !PQpipelineSync(c))))
        rc = err_set(err, 503, "database-unavailable", "appending events: %s", PQerrorMessage(c));
    for (int i = 0; i < N_ARRAYS; i++)
        sbuf_free(&cols[i].b);
    free(inbox_ns);
    for (int k = 0; k <= A_COUNT; k++)
        sbuf_free(&act[k].b);
    sbuf_free(&prog[0].b);
    sbuf_free(&prog[1].b);
    return rc;
}

void journal_notify_payload(int shard, int64_t seq, char *out, size_t len)
{
    if (shard == 0)
        snprintf(out, len, "%lld", (long long)seq);
    else
        snprintf(out, len, "%d:%lld", shard, (long long)seq);
}

int journal_append_recv(PGconn *c, size_t n_events, Err *err)
{
    PGresult *r = PQgetResult(c), *more;
    int rc = db_check(c, r, "appending events", err);
    if (rc != 0 && db_refused(c, r))
        snprintf(err->type, sizeof err->type, "%s", "database-refused");
    int64_t written = rc == 0 ? db_int(r, 0, 0) : 0;
    if (!r)
        return rc; /* the session is gone: the caller closes it */
    PQclear(r);
    /* Then a NULL ends the statement's results, and its sync follows. */
    for (int i = 0; i < 4 && (more = PQgetResult(c)); i++)
        PQclear(more);
    PGresult *sync = PQgetResult(c);
    if (rc == 0 && PQresultStatus(sync) != PGRES_PIPELINE_SYNC)
        rc = err_set(err, 503, "database-unavailable", "appending events: %s",
                     sync ? PQresultErrorMessage(sync) : PQerrorMessage(c));
    PQclear(sync);
    if (rc == 0 && written != (int64_t)n_events)
        rc = err_set(err, 409, "fenced",
                     "this session no longer holds the leader lock, or the append before "
                     "this one failed: nothing was written");
    /* Then its notification's transaction (NOTIFY_SQL), if it has one: a
     * result, the NULL, the sync. It notifies nothing unless the append
     * committed. */
    if (!shapes.notify_apart)
        return rc;
    PGresult *n = PQgetResult(c);
    if (rc == 0 && (!n || PQresultStatus(n) != PGRES_TUPLES_OK))
        rc = err_set(err, 503, "database-unavailable", "notifying an append: %s",
                     n ? PQresultErrorMessage(n) : PQerrorMessage(c));
    PQclear(n);
    if (!n)
        return rc;
    for (int i = 0; i < 4 && (more = PQgetResult(c)); i++)
        PQclear(more);
    sync = PQgetResult(c);
    if (rc == 0 && PQresultStatus(sync) != PGRES_PIPELINE_SYNC)
        rc = err_set(err, 503, "database-unavailable", "notifying an append: %s",
                     sync ? PQresultErrorMessage(sync) : PQerrorMessage(c));
    PQclear(sync);
    return rc;
}

int journal_pipeline_end(PGconn *c, Err *err)
{
    if (PQpipelineStatus(c) == PQ_PIPELINE_OFF || PQexitPipelineMode(c))
        return 0;
    return err_set(err, 503, "database-unavailable", "ending the pipeline: %s", PQerrorMessage(c));
}

int journal_inbox_forget(PGconn *c, int shard, const int64_t *inbox, size_t n, Err *err)
{
    char *ns = seqs_array(inbox, n), s[16];
    snprintf(s, sizeof s, "%d", shard);
    const char *params[] = {ns, s};
    PGresult *r = db_exec(c,
                          "WITH ib AS (DELETE FROM workd_inbox"
                          "             WHERE n = ANY($1::bigint[])"
                          "               AND workd_holds_leader_lock($2::int)"
                          "            RETURNING 1)"
                          "SELECT workd_holds_leader_lock($2::int)",
                          2, params, "taking submissions from the inbox", err);
    free(ns);
    if (!r)
        return -1;
    bool ok = !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    return ok ? 0
              : err_set(err, 409, "fenced",
                        "this session no longer holds the leader lock: nothing was written");
}

int journal_publish_budgets(PGconn *c, int64_t payload_bytes, int json_depth, Err *err)
{
    char b[24], d[16];
    snprintf(b, sizeof b, "%lld", (long long)payload_bytes);
    snprintf(d, sizeof d, "%d", json_depth);
    const char *params[] = {b, d};
    PGresult *r = db_exec(c,
                          "UPDATE workd_budgets SET payload_bytes = $1::bigint,"
                          " json_depth = $2::int, updated_at = now()"
                          " WHERE id = 1 AND (payload_bytes, json_depth) <>"
                          " ($1::bigint, $2::int)",
                          2, params, "publishing the budgets of workd.submit", err);
    if (!r)
        return -1;
    PQclear(r);
    return 0;
}

int journal_inbox_read(PGconn *c, int shard, int limit, InboxItem **out, size_t *n, Err *err)
{
    char l[16], s[16];
    snprintf(l, sizeof l, "%d", limit);
    snprintf(s, sizeof s, "%d", shard);
    const char *params[] = {l, s};
    PGresult *r = db_exec(c,
                          "SELECT n, id, queue, priority, payload::text, workd_epoch_ms(run_at),"
                          "       timeout_ms, max_attempts, traceparent, tracestate"
                          "  FROM workd_inbox WHERE shard = $2::int ORDER BY n LIMIT $1::int",
                          2, params, "reading the inbox", err);
    if (!r)
        return -1;
    *n = (size_t)PQntuples(r);
    *out = xcalloc(*n + 1, sizeof **out);
    for (size_t i = 0; i < *n; i++) {
        InboxItem *it = &(*out)[i];
        it->n = db_int(r, (int)i, 0);
        it->id = xstrdup(db_str(r, (int)i, 1));
        it->queue = xstrdup(db_str(r, (int)i, 2));
        it->priority = (int)db_int(r, (int)i, 3);
        json_error_t jerr;
        it->payload = json_loads(db_str(r, (int)i, 4), JSON_DECODE_ANY, &jerr);
        if (!it->payload)
            snprintf(it->why, sizeof it->why, "workd cannot read back its payload: %.120s",
                     jerr.text);
        it->run_at = PQgetisnull(r, (int)i, 5) ? 0 : db_int(r, (int)i, 5);
        it->timeout_ms = PQgetisnull(r, (int)i, 6) ? 0 : db_int(r, (int)i, 6);
        it->max_attempts = PQgetisnull(r, (int)i, 7) ? 0 : (int)db_int(r, (int)i, 7);
        it->traceparent = xstrdup(db_str(r, (int)i, 8));
        it->tracestate = xstrdup(db_str(r, (int)i, 9));
    }
    PQclear(r);
    return 0;
}

/* The schedules (workd_schedules); one whose spec no longer loads (its zone
 * left the system) is skipped with a warning. */
WARN_UNUSED static int recover_schedules(PGconn *c, const char *shard, WorkState *ws, Err *err)
{
    const char *params[] = {shard};
    PGresult *r = db_exec(c,
                          "SELECT name, spec::text, last_tick, last_work FROM workd_schedules"
                          " WHERE shard = $1::int",
                          1, params, "loading the schedules", err);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *spec = rows_json(r, i, 1);
        ScheduleSpec sp;
        Err e = {0};
        if (schedspec_decode(spec, &sp, &e) == 0) {
            ws_schedule_restore(ws, db_str(r, i, 0), &sp, db_int(r, i, 2), db_str(r, i, 3));
            free(sp.cron_text);
            free(sp.tz);
            template_clear(&sp.work);
        } else {
            log_warn("schedule %s cannot be loaded and does not fire: %s", db_str(r, i, 0), e.msg);
        }
        json_decref(spec);
    }
    PQclear(r);
    return 0;
}

/* The open batches (workd_batches) with the counts of their finished work. */
WARN_UNUSED static int recover_batches(PGconn *c, const char *shard, WorkState *ws, Err *err)
{
    const char *params[] = {shard};
    PGresult *r = db_exec(
        c,
        "SELECT b.id, b.callback::text,"
        "       (SELECT count(*) FROM workd_done d WHERE d.batch = b.id AND d.status = "
        "'completed'),"
        "       (SELECT count(*) FROM workd_open o WHERE o.batch = b.id AND o.status = 'dead'),"
        "       (SELECT count(*) FROM workd_done d WHERE d.batch = b.id AND d.status = 'cancelled')"
        "  FROM workd_batches b WHERE b.finished_seq IS NULL AND b.shard = $1::int",
        1, params, "loading the open batches", err);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        WorkTemplate cb, *cbp = NULL;
        json_t *cbj = PQgetisnull(r, i, 1) ? NULL : rows_json(r, i, 1);
        Err e = {0};
        if (cbj && template_decode(cbj, &cb, &e) == 0)
            cbp = &cb;
        int counts[3] = {(int)db_int(r, i, 2), (int)db_int(r, i, 3), (int)db_int(r, i, 4)};
        ws_batch_restore(ws, db_str(r, i, 0), cbp, counts);
        if (cbp)
            template_clear(cbp);
        json_decref(cbj);
    }
    PQclear(r);
    return 0;
}

int journal_recover(PGconn *c, int shard, int n_shards, WorkState *ws, int64_t now,
                    int64_t *last_seq, int64_t *last_term, int *last_part, Err *err)
{
    char s[16];
    snprintf(s, sizeof s, "%d", shard);
    const char *params[] = {s};
    PGresult *r = db_exec(c,
                          "SELECT last_seq, term, part FROM workd_log WHERE shard = $1::int"
                          " ORDER BY last_seq DESC LIMIT 1",
                          1, params, "reading the last seq", err);
    if (!r)
        return -1;
    bool any = PQntuples(r) > 0;
    *last_seq = any ? db_int(r, 0, 0) : 0;
    *last_term = any ? db_int(r, 0, 1) : 0;
    *last_part = any ? (int)db_int(r, 0, 2) : 0;
    PQclear(r);

    /* All of it, in one pass over the table: the leader's session allows
     * sequential scans for this read only (journal_prepare). */
    if (db_command(c, "BEGIN; SET LOCAL enable_seqscan = on", "loading open work", err) != 0)
        return -1;
    r = db_exec(
        c,
        "SELECT id, queue, priority, payload::text, status, attempts, max_attempts, timeout_ms,"
        "       workd_epoch_ms(run_at), accepted_seq, workd_epoch_ms(created_at), worker_id,"
        "       workd_epoch_ms(deadline), workd_epoch_ms(started_at), last_error, key,"
        "       after::text, after_policy, batch, trace->>'traceparent', trace->>'tracestate'"
        "  FROM workd_open WHERE status <> 'dead' AND shard = $1::int ORDER BY accepted_seq",
        1, params, "loading open work", err);
    if (!r || db_command(c, "COMMIT", "loading open work", err) != 0) {
        PQclear(r);
        return -1;
    }
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        WorkItem it = {0};
        it.id = (char *)db_str(r, i, 0);
        it.queue = (char *)db_str(r, i, 1);
        it.priority = (int)db_int(r, i, 2);
        it.payload = json_loads(db_str(r, i, 3), JSON_DECODE_ANY, NULL);
        const char *st = db_str(r, i, 4);
        it.status = !strcmp(st, "running")   ? WORK_RUNNING
                    : !strcmp(st, "waiting") ? WORK_WAITING
                                             : WORK_PENDING;
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
        it.key = (char *)db_str(r, i, 15);
        json_t *after = PQgetisnull(r, i, 16) ? NULL : rows_json(r, i, 16);
        if (json_is_array(after)) {
            it.after = xcalloc(json_array_size(after) + 1, sizeof *it.after);
            for (size_t j = 0, k = 0; j < json_array_size(after); j++)
                if (json_is_string(json_array_get(after, j)))
                    it.after[k++] = (char *)json_string_value(json_array_get(after, j));
        }
        it.run_anyway = db_str(r, i, 17) && !strcmp(db_str(r, i, 17), "run");
        it.batch = (char *)db_str(r, i, 18);
        it.traceparent = (char *)db_str(r, i, 19);
        it.tracestate = (char *)db_str(r, i, 20);
        ws_restore(ws, &it);
        free(it.after);
        json_decref(after);
        json_decref(it.payload);
    }
    PQclear(r);
    if (recover_schedules(c, s, ws, err) != 0 || recover_batches(c, s, ws, err) != 0)
        return -1;
    ws_restore_links(ws);

    r = db_exec(c, ROWS_QUEUES_SQL, 0, NULL, "loading the queues' limits", err);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        if (shard_of_queue(db_str(r, i, 0), n_shards) != shard)
            continue; /* another shard's queue */
        QueueLimits lim = rows_queue_limits(r, i);
        ws_queue_restore(ws, db_str(r, i, 0), &lim, now);
        queue_limits_clear(&lim);
    }
    PQclear(r);
    return 0;
}

int journal_parts(PGconn *c, PartList *out, Err *err)
{
    PGresult *r = db_exec(
        c,
        "SELECT part, workd_epoch_ms(starts_at), workd_epoch_ms(ends_at), workd_epoch_ms(first_at)"
        "  FROM workd_parts ORDER BY part",
        0, NULL, "reading the parts", err);
    if (!r)
        return -1;
    out->n = 0;
    int n = PQntuples(r);
    for (int i = 0; i < n && out->n < PARTS_MAX; i++) {
        Part *p = &out->items[out->n++];
        p->part = (int)db_int(r, i, 0);
        p->starts_at = db_int(r, i, 1);
        p->ends_at = db_int(r, i, 2);
        p->first_at = PQgetisnull(r, i, 3) ? 0 : db_int(r, i, 3);
    }
    PQclear(r);
    return 0;
}

/* Open rows (dead work, or work that another leader just opened) and finished
 * rows of these ids, with what reopening one needs. */
#define KNOWN_COLS                                                                                 \
    "w.id, w.status, w.attempts, w.payload::text, w.queue, w.priority, w.timeout_ms,"              \
    " w.max_attempts, w.last_error, w.key, w.batch, w.trace->>'traceparent',"                      \
    " w.trace->>'tracestate', w.shard"

/* A reservation's row (journal.h, RESERVE_*) in KNOWN_COLS' shape:
 * "k.id, 'reserved', <count>, " RESERVED_COLS "<shard>". */
#define RESERVED_COLS                                                                              \
    "'null'::text, '', 0, 0::bigint, 0, NULL::text, NULL::text, NULL::text, NULL::text,"           \
    " NULL::text, "

/* Adds the rows of res (KNOWN_COLS) to out; res must live as long as out. */
static void known_rows_of(KnownSet *out, const PGresult *res)
{
    int rows = PQntuples(res);
    out->items = xrealloc(out->items, (out->n + (size_t)rows + 1) * sizeof *out->items);
    for (int i = 0; i < rows; i++) {
        KnownWork *k = &out->items[out->n++];
        memset(k, 0, sizeof *k);
        k->id = db_str(res, i, 0);
        k->status = db_str(res, i, 1);
        k->attempts = (int)db_int(res, i, 2);
        k->payload = json_loads(db_str(res, i, 3), JSON_DECODE_ANY, NULL);
        k->queue = db_str(res, i, 4);
        k->priority = (int)db_int(res, i, 5);
        k->timeout_ms = db_int(res, i, 6);
        k->max_attempts = (int)db_int(res, i, 7);
        k->last_error = db_str(res, i, 8);
        k->key = db_str(res, i, 9);
        k->batch = db_str(res, i, 10);
        k->traceparent = db_str(res, i, 11);
        k->tracestate = db_str(res, i, 12);
        k->shard = (int)db_int(res, i, 13);
    }
}

/* Fills out from rows of KNOWN_COLS (out->res owns the strings). */
static void known_rows(KnownSet *out)
{
    known_rows_of(out, out->res);
}

/* Open rows (dead work, or work that another leader just opened) and finished
 * rows of these ids, with what reopening one needs. */
/* The look of journal_known, on any session. */
WARN_UNUSED static PGresult *known_look(PGconn *c, char *const *ids, size_t n, Err *err)
{
    char *arr = text_array(ids, n);
    const char *params[] = {arr};
    /* Run in every round with submissions, so planned once per session
     * (db_exec_cached): planning it over every part of workd_done cost ten
     * times its execution (0.49 against 0.04 ms). The plan must not depend on
     * the tables' statistics, which are those of empty tables when the
     * session starts: an index lookup per id (LATERAL, kept a subquery by
     * OFFSET 0), where a join may be planned as a hash join over every row. */
    /* Names that make ids are reserved as ids too (RESERVE_*, journal.h):
     * an open batch reserves its callback's id, a schedule its name; the
     * count of schedules answers as one row. */
    PGresult *r = db_exec_cached(
        c, "workd_known",
        "SELECT w.* FROM unnest($1::text[]) AS k(id) CROSS JOIN LATERAL"
        " (SELECT " KNOWN_COLS " FROM workd_open w WHERE w.id = k.id"
        "  UNION ALL"
        "  SELECT " KNOWN_COLS " FROM workd_done w WHERE w.id = k.id"
        "  UNION ALL"
        "  SELECT k.id, 'reserved', 0, " RESERVED_COLS "b.shard FROM workd_batches b"
        "   WHERE k.id LIKE '%" RESERVE_CALLBACK_SQL "' AND b.finished_seq IS NULL"
        "     AND b.id = left(k.id, -" RESERVE_CALLBACK_LEN ")"
        "  UNION ALL"
        "  SELECT k.id, 'reserved', 0, " RESERVED_COLS "s.shard FROM workd_schedules s"
        "   WHERE k.id LIKE '%" RESERVE_SCHEDULE_SQL "'"
        "     AND s.name = left(k.id, -" RESERVE_SCHEDULE_LEN ")"
        "  UNION ALL"
        "  SELECT k.id, 'reserved', n.n::int, " RESERVED_COLS "-1"
        "    FROM (SELECT count(*) n FROM workd_schedules) n WHERE k.id = '" RESERVE_SCHEDULES "'"
        "  OFFSET 0) w",
        1, params, "looking up work ids", err);
    free(arr);
    return r;
}

int journal_known(PGconn *c, char *const *ids, size_t n, KnownSet *out, Err *err)
{
    memset(out, 0, sizeof *out);
    if (n == 0)
        return 0;
    if (!(out->res = known_look(c, ids, n, err)))
        return -1;
    known_rows(out);
    return 0;
}

void journal_peer_close(JournalPeer *p, bool failed)
{
    PQfinish(p->conn);
    PQfinish(p->opening);
    p->conn = p->opening = NULL;
    if (failed)
        p->retry_ms = mono_ms() + JOURNAL_PEER_RETRY_MS;
}

int journal_peer(JournalPeer *p, const char *url, Err *err)
{
    if (p->conn && db_alive(p->conn))
        return 0;
    if (p->conn)
        journal_peer_close(p, false); /* gone while idle: open another at once */
    int64_t now = mono_ms(), wait_until = now;
    if (!p->opening) {
        if (now < p->retry_ms)
            return err_set(err, 503, "database-unavailable",
                           "it could not be reached a moment ago");
        if (!(p->opening = db_connect_start(url, "manager-peer", err))) {
            journal_peer_close(p, true);
            return -1;
        }
        p->write = true;
        p->until_ms = now + JOURNAL_PEER_OPEN_MS;
        /* A database down a moment ago is tried without holding the round:
         * one that is frozen would cost it the wait at every try. */
        wait_until = p->down_logged ? now : now + JOURNAL_PEER_WAIT_MS;
    }
    for (;;) {
        struct pollfd pfd = {.fd = PQsocket(p->opening), .events = p->write ? POLLOUT : POLLIN};
        int64_t left = wait_until - mono_ms();
        if (poll(&pfd, 1, left > 0 ? (int)left : 0) > 0) {
            int rc = db_connect_step(p->opening, "manager-peer", &p->write, err);
            if (rc < 0) {
                journal_peer_close(p, true);
                return -1;
            }
            if (rc > 0) {
                p->conn = p->opening;
                p->opening = NULL;
                db_set_deadline(p->conn, JOURNAL_PEER_DEADLINE_MS);
                return 0;
            }
            continue;
        }
        if (mono_ms() >= p->until_ms) {
            journal_peer_close(p, true);
            return err_set(err, 503, "database-unavailable", "no answer within %d s",
                           JOURNAL_PEER_OPEN_MS / 1000);
        }
        if (mono_ms() >= wait_until)
            return err_set(err, 503, "database-unavailable", "its session is being opened");
    }
}

int journal_known_elsewhere(PGconn *c, char *const *ids, const bool *claim, size_t n, bool *busy,
                            KnownSet *out, Err *err)
{
    if (n == 0)
        return 0;
    char *arr = text_array(ids, n);
    SBuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "{");
    for (size_t i = 0; i < n; i++)
        sbuf_puts(&b, i ? (claim[i] ? ",t" : ",f") : (claim[i] ? "t" : "f"));
    sbuf_puts(&b, "}");
    const char *params[] = {arr, b.data};
    int64_t *keys = xcalloc(n + 1, sizeof *keys);
    size_t n_keys = 0;
    /* Three statements, each its own transaction: the claims (session
     * locks, the kind journal_claim takes), then the look, whose snapshot is
     * taken once they are held, then their release. */
    PGresult *r = db_exec_cached(c, "workd_claim_look",
                                 "SELECT k.n - 1, h, pg_try_advisory_lock(h)"
                                 "  FROM unnest($1::text[], $2::bool[]) WITH ORDINALITY"
                                 "       AS k(id, claim, n),"
                                 "       LATERAL hashtextextended(k.id, 0) AS h WHERE k.claim",
                                 2, params, "claiming ids for a look", err);
    for (int i = 0; r && i < PQntuples(r); i++) {
        int64_t at = db_int(r, i, 0);
        if (strcmp(PQgetvalue(r, i, 2), "t"))
            busy[at >= 0 && (size_t)at < n ? at : 0] = true;
        else
            keys[n_keys++] = db_int(r, i, 1);
    }
    PGresult *look = r ? known_look(c, ids, n, err) : NULL;
    int rc = look && journal_release(c, keys, n_keys, err) == 0 ? 0 : -1;
    PQclear(r);
    free(arr);
    free(keys);
    sbuf_free(&b);
    if (rc != 0) { /* the caller closes the session, and the claims with it */
        PQclear(look);
        return -1;
    }
    out->more = xrealloc(out->more, (out->n_more + 1) * sizeof *out->more);
    out->more[out->n_more++] = look;
    known_rows_of(out, look);
    return 0;
}

int journal_dead_matching(PGconn *c, int shard, const char *queue, const char *key, int limit,
                          KnownSet *out, Err *err)
{
    memset(out, 0, sizeof *out);
    char l[16], s[16];
    snprintf(l, sizeof l, "%d", limit);
    snprintf(s, sizeof s, "%d", shard);
    const char *params[] = {queue, key, l, s};
    out->res = db_exec(c,
                       "SELECT " KNOWN_COLS "  FROM workd_open w"
                       " WHERE w.status = 'dead' AND ($1::text IS NULL OR w.queue = $1)"
                       "   AND ($2::text IS NULL OR w.key = $2) AND w.shard = $4::int"
                       " ORDER BY w.accepted_seq LIMIT $3::int",
                       4, params, "finding dead work", err);
    if (!out->res)
        return -1;
    known_rows(out);
    return 0;
}

int journal_claim(PGconn *c, char *const *ids, size_t n, int64_t *keys, bool *busy, Err *err)
{
    char *arr = text_array(ids, n);
    const char *params[] = {arr};
    /* A key of one bigint: apart from the leader locks' two int4 keys. */
    PGresult *r = db_exec_cached(c, "workd_claim",
                                 "SELECT h, pg_try_advisory_lock(h)"
                                 "  FROM unnest($1::text[]) WITH ORDINALITY AS k(id, n),"
                                 "       LATERAL hashtextextended(k.id, 0) AS h ORDER BY k.n",
                                 1, params, "claiming new ids", err);
    free(arr);
    if (!r)
        return -1;
    for (size_t i = 0; i < n && (int)i < PQntuples(r); i++) {
        busy[i] = strcmp(PQgetvalue(r, (int)i, 1), "t") != 0;
        keys[i] = busy[i] ? 0 : db_int(r, (int)i, 0);
    }
    PQclear(r);
    return 0;
}

int journal_claim_holders(PGconn *c, char *const *ids, size_t n, int *pid, char **foreign, Err *err)
{
    memset(foreign, 0, n * sizeof *foreign);
    memset(pid, 0, n * sizeof *pid);
    if (!n)
        return 0;
    char *arr = text_array(ids, n);
    const char *params[] = {arr};
    /* A bigint advisory key shows in pg_locks as its halves, objsubid 1.
     * The sessions that write each shard's log are workd_shards' pids. */
    PGresult *r = db_exec_cached(
        c, "workd_claim_holders",
        "SELECT k.n - 1, l.pid, coalesce(a.usename::text, '?'),"
        "       coalesce(a.application_name, ''), s.shard IS NOT NULL"
        "  FROM unnest($1::text[]) WITH ORDINALITY AS k(id, n)"
        "  CROSS JOIN LATERAL hashtextextended(k.id, 0) AS h"
        "  JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        "   AND l.classid = ((h >> 32) & 4294967295)::oid AND l.objid = (h & 4294967295)::oid"
        "  LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
        "  LEFT JOIN workd_shards s ON s.pid = l.pid",
        1, params, "finding who holds claims", err);
    free(arr);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t at = db_int(r, i, 0);
        if (at < 0 || (size_t)at >= n || !strcmp(PQgetvalue(r, i, 4), "t") || foreign[at])
            continue;
        char who[256];
        snprintf(who, sizeof who, "database session pid %s (role '%.63s', application '%.63s')",
                 PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3));
        foreign[at] = xstrdup(who);
        pid[at] = (int)db_int(r, i, 1);
    }
    PQclear(r);
    return 0;
}

int journal_release(PGconn *c, const int64_t *keys, size_t n, Err *err)
{
    if (!n)
        return 0;
    char *arr = seqs_array(keys, n);
    const char *params[] = {arr};
    PGresult *r = db_exec_cached(c, "workd_release",
                                 "SELECT count(pg_advisory_unlock(k)) FROM unnest($1::bigint[]) k",
                                 1, params, "releasing claims", err);
    free(arr);
    PQclear(r);
    return r ? 0 : -1;
}

void journal_known_free(KnownSet *k)
{
    for (size_t i = 0; i < k->n; i++)
        json_decref(k->items[i].payload);
    free(k->items);
    PQclear(k->res);
    for (size_t i = 0; i < k->n_more; i++)
        PQclear(k->more[i]);
    free(k->more);
    memset(k, 0, sizeof *k);
}

int journal_socket(PGconn *c)
{
    return PQsocket(c);
}

bool journal_busy(PGconn *c)
{
    return PQisBusy(c);
}

int journal_consume(PGconn *c, bool *inbox)
{
    if (!PQconsumeInput(c) || PQstatus(c) != CONNECTION_OK)
        return -1;
    PGnotify *n;
    while ((n = PQnotifies(c))) {
        if (!strcmp(n->relname, "workd_inbox"))
            *inbox = true;
        PQfreemem(n);
    }
    return 0;
}

int journal_listen(PGconn *c, Err *err)
{
    return db_command(c, "LISTEN workd_inbox", "listening for SQL submissions", err);
}

int journal_ping(PGconn *c, Err *err)
{
    return db_command(c, "SELECT 1", "checking the session", err);
}

void journal_close(PGconn *c)
{
    PQfinish(c);
}
