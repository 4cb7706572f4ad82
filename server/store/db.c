/* db: see db.h. */
#include "db.h"

#include <libpq-events.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* Settings workd gives every connection unless its URL sets them itself. */
static const struct {
    const char *key, *val;
} DB_CONNECT_DEFAULTS[] = {
    /* Every session writes (the leader) or must read what the leader committed
     * (front-ends): with several hosts libpq skips standbys and reconnects find
     * the new primary after a failover. No read goes to a replica. */
    {"target_session_attrs", "read-write"},
    /* A server that vanished without closing the session (power loss, a
     * partition): an idle session ends after 5 + 2 * 3 = 11 s of silence, one
     * with unacknowledged data after 10 s, a connection attempt after 5 s per
     * host. */
    {"keepalives", "1"},
    {"keepalives_idle", "5"},
    {"keepalives_interval", "2"},
    {"keepalives_count", "3"},
    {"tcp_user_timeout", "10000"},
    {"connect_timeout", "5"},
};
#define N_DEFAULTS (sizeof DB_CONNECT_DEFAULTS / sizeof DB_CONNECT_DEFAULTS[0])

/* Added after the URL's own options (so these win):
 * - every statement of workd looks rows up by key among few: the planner,
 *   misled by young tables and unnest()'s row estimate, picked hash joins that
 *   read all of workd_work per commit (5x the CPU);
 * - no JIT: every statement of workd is small, and compiling one costs
 *   ~250 ms; a plan whose cost a disabled join method inflates (the leader's
 *   session, journal_prepare) would otherwise be compiled at every run;
 * - search_path: workd's tables live in public. The default path starts with
 *   "$user", so under a role named workd the schema workd (migration 5) would
 *   take new tables and hide the existing ones (test_db_role.py). */
#define DB_SESSION_OPTIONS                                                                         \
    "-c enable_hashjoin=off -c enable_mergejoin=off -c jit=off -c search_path=public"

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = '\0';
}

/* What the server says beside a statement's answer (NOTICE, WARNING...), as a
 * line of workd's log rather than libpq's raw line on stderr: `--log-format
 * json` stays one object per line. A WARNING is worth a look; the rest (e.g.
 * "trigger ... does not exist, skipping" of an idempotent DDL) is for
 * debugging. arg: the session's name (a string that outlives it). */
static void db_notice(void *arg, const PGresult *res)
{
    const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    bool warning = severity && !strcmp(severity, "WARNING");
    log_emit(warning ? LOG_WARN : LOG_DEBUG, __FILE__, __LINE__, "PostgreSQL %s (%s session): %s",
             severity ? severity : "notice", (const char *)arg,
             primary ? primary : PQresultErrorMessage(res));
}

/* The connection parameters of a session of workd to url (keys and vals
 * NULL-terminated, pointing into url, appname and options, which the
 * caller provides). -1: url cannot be read (err). */
#define CONNECT_PARAMS_MAX (N_DEFAULTS + 4)
WARN_UNUSED static int connect_params(const char *url, const char *app, const char **keys,
                                      const char **vals, char *appname, size_t appname_len,
                                      char *options, size_t options_len, Err *err)
{
    char *perr = NULL;
    PQconninfoOption *given = PQconninfoParse(url, &perr);
    if (!given) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", perr ? perr : "out of memory");
        trim(msg);
        PQfreemem(perr);
        return err_set(err, 400, "bad-config", "the database URL cannot be read: %s", msg);
    }
    snprintf(appname, appname_len, "workd-%s", app);
    snprintf(options, options_len, "%s", DB_SESSION_OPTIONS);
    size_t n = 0;
    keys[n] = "dbname"; /* expanded: the URL's own settings, overridden by what follows */
    vals[n++] = url;
    keys[n] = "application_name";
    vals[n++] = appname;
    for (size_t i = 0; i < N_DEFAULTS; i++) {
        bool set = false;
        for (const PQconninfoOption *o = given; o->keyword; o++)
            if (!strcmp(o->keyword, DB_CONNECT_DEFAULTS[i].key) && o->val && o->val[0])
                set = true;
        if (!set) {
            keys[n] = DB_CONNECT_DEFAULTS[i].key;
            vals[n++] = DB_CONNECT_DEFAULTS[i].val;
        }
    }
    for (const PQconninfoOption *o = given; o->keyword; o++)
        if (!strcmp(o->keyword, "options") && o->val && o->val[0])
            snprintf(options, options_len, "%s %s", o->val, DB_SESSION_OPTIONS);
    keys[n] = "options";
    vals[n++] = options;
    keys[n] = vals[n] = NULL;
    PQconninfoFree(given);
    return 0;
}

/* Sets err from a session that could not be opened. */
static void connect_failed(PGconn *c, Err *err)
{
    char clean[400];
    snprintf(clean, sizeof clean, "%s", c ? PQerrorMessage(c) : "out of memory");
    trim(clean);
    err_set(err, 503, "database-unavailable", "cannot connect to PostgreSQL: %s", clean);
}

PGconn *db_connect(const char *url, const char *app, Err *err)
{
    const char *keys[CONNECT_PARAMS_MAX], *vals[CONNECT_PARAMS_MAX];
    char appname[64], options[512];
    if (connect_params(url, app, keys, vals, appname, sizeof appname, options, sizeof options,
                       err) != 0)
        return NULL;
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        connect_failed(c, err);
        PQfinish(c);
        return NULL;
    }
    PQsetNoticeReceiver(c, db_notice, (void *)app);
    return c;
}

PGconn *db_connect_start(const char *url, const char *app, Err *err)
{
    const char *keys[CONNECT_PARAMS_MAX], *vals[CONNECT_PARAMS_MAX];
    char appname[64], options[512];
    if (connect_params(url, app, keys, vals, appname, sizeof appname, options, sizeof options,
                       err) != 0)
        return NULL;
    PGconn *c = PQconnectStartParams(keys, vals, 1);
    if (!c || PQstatus(c) == CONNECTION_BAD) {
        connect_failed(c, err);
        PQfinish(c);
        return NULL;
    }
    return c;
}

int db_connect_step(PGconn *c, const char *app, bool *want_write, Err *err)
{
    switch (PQconnectPoll(c)) {
    case PGRES_POLLING_OK:
        PQsetNoticeReceiver(c, db_notice, (void *)app);
        return 1;
    case PGRES_POLLING_WRITING:
        *want_write = true;
        return 0;
    case PGRES_POLLING_READING:
        *want_write = false;
        return 0;
    default:
        connect_failed(c, err);
        return -1;
    }
}

/* ---- deadlines: the session's, kept as libpq instance data ---- */

typedef struct Deadline {
    int ms;
    bool expired;
    bool (*give_up)(void *arg); /* NULL: none */
    void *arg;
} Deadline;

static int deadline_event(PGEventId id, void *info, void *pass)
{
    (void)pass;
    if (id == PGEVT_CONNDESTROY) {
        const PGEventConnDestroy *d = info;
        free(PQinstanceData(d->conn, deadline_event));
    }
    return 1;
}

void db_set_deadline(PGconn *c, int ms)
{
    db_set_deadline_or(c, ms, NULL, NULL);
}

void db_set_deadline_or(PGconn *c, int ms, bool (*give_up)(void *arg), void *arg)
{
    if (!c || PQinstanceData(c, deadline_event))
        return;
    Deadline *d = xcalloc(1, sizeof *d);
    d->ms = ms;
    d->give_up = give_up;
    d->arg = arg;
    if (!PQregisterEventProc(c, deadline_event, "workd-deadline", NULL) ||
        !PQsetInstanceData(c, deadline_event, d))
        free(d);
}

int db_deadline_swap(PGconn *c, int ms)
{
    Deadline *d = c ? PQinstanceData(c, deadline_event) : NULL;
    if (!d)
        return 0;
    int old = d->ms;
    d->ms = ms;
    return old;
}

bool db_timed_out(PGconn *c)
{
    const Deadline *d = c ? PQinstanceData(c, deadline_event) : NULL;
    return d && d->expired;
}

/* The answer to what was just sent on c (PQsend*: sent says whether that
 * worked), read within d's deadline, as PQexec would give it (the last
 * result; an error's if one failed). NULL past the deadline (d->expired)
 * or when the session failed (PQerrorMessage says why). */
static PGresult *await_answer(PGconn *c, Deadline *d, bool sent)
{
    if (!sent)
        return NULL;
    int64_t until = mono_ms() + d->ms;
    PGresult *kept = NULL, *r;
    for (;;) {
        while (!PQisBusy(c)) {
            if (!(r = PQgetResult(c)))
                return kept;
            ExecStatusType st = PQresultStatus(r);
            bool failed = st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR;
            if (kept && PQresultStatus(kept) == PGRES_FATAL_ERROR && !failed) {
                PQclear(r); /* the error stays the answer */
                continue;
            }
            PQclear(kept);
            kept = r;
        }
        int64_t left = until - mono_ms();
        if (d->give_up && left > DB_GIVE_UP_POLL_MS)
            left = DB_GIVE_UP_POLL_MS;
        struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN};
        int ready = left > 0 ? poll(&pfd, 1, (int)left) : 0;
        if (ready == 0 && mono_ms() < until && !(d->give_up && d->give_up(d->arg)))
            continue;
        if (ready == 0) {
            d->expired = true;
            PQclear(kept);
            return NULL;
        }
        if (ready > 0 && !PQconsumeInput(c)) {
            PQclear(kept);
            return NULL;
        }
    }
}

/* A statement past its session's deadline: err says so. */
static void timed_out(PGconn *c, const char *what, Err *err)
{
    const Deadline *d = PQinstanceData(c, deadline_event);
    err_set(err, 503, "database-unavailable",
            "%s: the database gave no answer in time (the session's deadline: %d ms)", what,
            d ? d->ms : 0);
}

/* The blocking calls db.c makes, each under c's deadline when it has one. */
static PGresult *run_params(PGconn *c, const char *sql, int nparams, const char *const *params)
{
    Deadline *d = PQinstanceData(c, deadline_event);
    if (!d)
        return PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
    return await_answer(c, d, PQsendQueryParams(c, sql, nparams, NULL, params, NULL, NULL, 0));
}

static PGresult *run_simple(PGconn *c, const char *sql)
{
    Deadline *d = PQinstanceData(c, deadline_event);
    return d ? await_answer(c, d, PQsendQuery(c, sql)) : PQexec(c, sql);
}

static PGresult *run_prepare(PGconn *c, const char *name, const char *sql, int nparams)
{
    Deadline *d = PQinstanceData(c, deadline_event);
    return d ? await_answer(c, d, PQsendPrepare(c, name, sql, nparams, NULL))
             : PQprepare(c, name, sql, nparams, NULL);
}

static PGresult *run_prepared(PGconn *c, const char *name, int nparams, const char *const *params)
{
    Deadline *d = PQinstanceData(c, deadline_event);
    if (!d)
        return PQexecPrepared(c, name, nparams, params, NULL, NULL, 0);
    return await_answer(c, d, PQsendQueryPrepared(c, name, nparams, params, NULL, NULL, 0));
}

/* db_check, or the deadline's error when that is why res is NULL. */
static int checked(PGconn *c, PGresult *res, const char *what, Err *err)
{
    if (!res && db_timed_out(c)) {
        timed_out(c, what, err);
        return -1;
    }
    return db_check(c, res, what, err);
}

bool db_alive(PGconn *c)
{
    if (!c || PQstatus(c) != CONNECTION_OK || db_timed_out(c))
        return false;
    /* An idle session that does not LISTEN has nothing to read: anything
     * readable is the server ending it (a message, then EOF), or a report that
     * it changed under us (e.g. it became read-only). Either way: reconnect. */
    struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN};
    return pfd.fd >= 0 && poll(&pfd, 1, 0) == 0;
}

int db_check(PGconn *c, PGresult *res, const char *what, Err *err)
{
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        return 0;
    char msg[400];
    snprintf(msg, sizeof msg, "%s", res ? PQresultErrorMessage(res) : PQerrorMessage(c));
    trim(msg);
    /* A terminated backend says so before the socket closes (libpq still
     * reads OK): FATAL, or a state of connection exception (08), operator
     * intervention (57) or insufficient resources (53) is a session gone. */
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *severity = res ? PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED) : NULL;
    bool gone = PQstatus(c) != CONNECTION_OK || !state ||
                (severity && (!strcmp(severity, "FATAL") || !strcmp(severity, "PANIC"))) ||
                !strncmp(state, "08", 2) || !strncmp(state, "57", 2) || !strncmp(state, "53", 2);
    err_set(err, gone ? 503 : 500, gone ? "database-unavailable" : "database-error", "%s: %s", what,
            msg);
    return -1;
}

PGresult *db_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                  const char *what, Err *err)
{
    PGresult *r = run_params(c, sql, nparams, params);
    if (checked(c, r, what, err) != 0) {
        PQclear(r);
        return NULL;
    }
    return r;
}

int db_command(PGconn *c, const char *sql, const char *what, Err *err)
{
    PGresult *r = run_simple(c, sql);
    int rc = checked(c, r, what, err);
    PQclear(r);
    return rc;
}

/* The statements this thread has prepared, on the last few sessions it used
 * (a leader's own and those to the cluster's other databases; a slot is
 * reused for another session in turn). A statement prepared on a session
 * whose slot was reused is prepared again: 42P05, taken as done. */
#define CACHED_MAX 8
#define CACHED_SESSIONS 4
typedef struct Cached {
    PGconn *conn;
    const char *names[CACHED_MAX];
    int n;
} Cached;
static _Thread_local struct {
    Cached slot[CACHED_SESSIONS];
    int next;   /* the slot to reuse next */
    Cached *at; /* the slot of the session last asked about */
} cached;

static bool cached_has(PGconn *c, const char *name)
{
    Cached *s = NULL;
    for (int i = 0; i < CACHED_SESSIONS && !s; i++)
        if (cached.slot[i].conn == c)
            s = &cached.slot[i];
    if (!s) {
        s = &cached.slot[cached.next];
        cached.next = (cached.next + 1) % CACHED_SESSIONS;
        s->conn = c;
        s->n = 0;
    }
    cached.at = s;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name))
            return true;
    return false;
}

static int prepare(PGconn *c, const char *name, const char *sql, int nparams, const char *what,
                   Err *err)
{
    PGresult *r = run_prepare(c, name, sql, nparams);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    int rc = state && !strcmp(state, "42P05") ? 0 /* prepared before, by this thread */
                                              : checked(c, r, what, err);
    PQclear(r);
    if (rc == 0 && cached.at && cached.at->n < CACHED_MAX)
        cached.at->names[cached.at->n++] = name;
    return rc;
}

PGresult *db_exec_cached(PGconn *c, const char *name, const char *sql, int nparams,
                         const char *const *params, const char *what, Err *err)
{
    if (!cached_has(c, name) && prepare(c, name, sql, nparams, what, err) != 0)
        return NULL;
    PGresult *r = run_prepared(c, name, nparams, params);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (state && !strcmp(state, "26000")) { /* a new session at the same address */
        PQclear(r);
        cached.at->n = 0;
        if (prepare(c, name, sql, nparams, what, err) != 0)
            return NULL;
        r = run_prepared(c, name, nparams, params);
    }
    if (checked(c, r, what, err) != 0) {
        PQclear(r);
        return NULL;
    }
    return r;
}

int64_t db_int(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

const char *db_str(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

void db_array_text(SBuf *b, const char *s)
{
    if (!s) {
        sbuf_puts(b, "NULL");
        return;
    }
    sbuf_append(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sbuf_append(b, "\\", 1);
        sbuf_append(b, p, 1);
    }
    sbuf_append(b, "\"", 1);
}

bool db_refused(PGconn *c, const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *severity = res ? PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED) : NULL;
    return PQstatus(c) == CONNECTION_OK && state && severity && !strcmp(severity, "ERROR") &&
           (!strncmp(state, "22", 2) || !strncmp(state, "23", 2) || !strncmp(state, "P0", 2));
}
