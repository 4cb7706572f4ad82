/* db: see db.h. */
#include "db.h"

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

bool db_alive(PGconn *c)
{
    if (!c || PQstatus(c) != CONNECTION_OK)
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
    PGresult *r = PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
    if (db_check(c, r, what, err) != 0) {
        PQclear(r);
        return NULL;
    }
    return r;
}

int db_command(PGconn *c, const char *sql, const char *what, Err *err)
{
    PGresult *r = PQexec(c, sql);
    int rc = db_check(c, r, what, err);
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
    PGresult *r = PQprepare(c, name, sql, nparams, NULL);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    int rc = state && !strcmp(state, "42P05") ? 0 /* prepared before, by this thread */
                                              : db_check(c, r, what, err);
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
    PGresult *r = PQexecPrepared(c, name, nparams, params, NULL, NULL, 0);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (state && !strcmp(state, "26000")) { /* a new session at the same address */
        PQclear(r);
        cached.at->n = 0;
        if (prepare(c, name, sql, nparams, what, err) != 0)
            return NULL;
        r = PQexecPrepared(c, name, nparams, params, NULL, NULL, 0);
    }
    if (db_check(c, r, what, err) != 0) {
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
