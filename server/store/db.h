/* db: PostgreSQL connections for the server, and small helpers around libpq
 * results. Every connection is direct (never through a transaction pooler:
 * advisory locks and LISTEN need a session), goes to a server that accepts
 * writes (target_session_attrs=read-write: with a multi-host URL libpq skips
 * standbys, so after a failover every reconnect finds the new primary) and uses
 * TCP keepalives and tcp_user_timeout so that a half-open session is noticed
 * within seconds. All of that connection policy lives in db_connect. */
#ifndef WORKD_DB_H
#define WORKD_DB_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"

/* The advisory lock keys (two int4 form: class, object). */
#define DB_LOCK_CLASS 2003792491 /* "work" */
#define DB_LOCK_MIGRATE 2
/* A shard's leader lock's object: 1 for shard 0 (the one leader's before
 * shards), 1000 + shard for the others (workd_shard_lock in SQL). */
static inline int db_shard_lock(int shard)
{
    return shard == 0 ? 1 : 1000 + shard;
}

/* Opens a connection to url (a libpq URL or key=value string, one host or
 * several); app is the application_name suffix ("manager", "listener"...).
 * Settings the URL gives itself win; workd fills in the rest (DB_CONNECT_DEFAULTS
 * in db.c: read-write target, keepalives, timeouts). Returns NULL and sets err
 * (503 database-unavailable) on failure. The caller PQfinish()es. The
 * server's notices and warnings on the session go to workd's log (debug and
 * warn), named by app, which must outlive the connection (a literal). */
PGconn *db_connect(const char *url, const char *app, Err *err) WARN_UNUSED;
/* The session of db_connect, opened without blocking (a thread that also
 * serves other databases must not wait on one whose host does not answer):
 * db_connect_start begins it (NULL: err), and db_connect_step goes on each
 * time its socket is ready for what the last step asked (*want_write: for
 * writing, else for reading; it is writing at first): 1 connected, 0 not
 * yet, -1 failed (err). libpq keeps no time limit for such a session: the
 * caller gives up on it (PQfinish) when it has waited long enough. */
PGconn *db_connect_start(const char *url, const char *app, Err *err) WARN_UNUSED;
int db_connect_step(PGconn *c, const char *app, bool *want_write, Err *err) WARN_UNUSED;

/* Gives session c a deadline: every statement db.c runs on it waits at most
 * ms for its answer. libpq waits for ever on a server that is frozen (a
 * stopped process, a hung host whose kernel still acknowledges TCP: neither
 * keepalives nor tcp_user_timeout fire), so a thread that must not stall on
 * one database gives the sessions it opens there a deadline. Past it the
 * statement fails 503 database-unavailable ("no answer within N ms") and the
 * session is spent (db_alive false, db_timed_out true): the caller closes it.
 * Call once, right after the session is open. */
void db_set_deadline(PGconn *c, int ms);
/* As db_set_deadline, and a statement also gives up as soon as
 * give_up(arg) says so (asked every DB_GIVE_UP_POLL_MS while it waits): a
 * caller that learns of a frozen server elsewhere (the listener's probes)
 * need not wait out the whole deadline. give_up is called on the waiting
 * thread; arg must outlive c. */
#define DB_GIVE_UP_POLL_MS 50
void db_set_deadline_or(PGconn *c, int ms, bool (*give_up)(void *arg), void *arg);
/* Changes the deadline of session c (given one) to ms; returns the one it
 * had (0: none). For a statement that may wait longer than the session's
 * others: a write, which waits for a synchronous standby. */
int db_deadline_swap(PGconn *c, int ms);
/* Whether a statement on c ran past c's deadline (the session is spent). */
bool db_timed_out(PGconn *c);

/* For an idle connection that does not LISTEN (no query running): false if its
 * server has gone away or said anything meanwhile (the socket tells without a
 * round trip), so that the caller reconnects before using it. NULL is not alive. */
bool db_alive(PGconn *c);

/* True if res is PGRES_COMMAND_OK or PGRES_TUPLES_OK; otherwise sets err from the
 * result (status 503 when the connection is gone, 500 otherwise). The caller
 * still PQclear()s res. */
int db_check(PGconn *c, PGresult *res, const char *what, Err *err) WARN_UNUSED;

/* Runs a parameterised statement (text parameters) and returns its result, or
 * NULL with err set. The caller PQclear()s. */
PGresult *db_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                  const char *what, Err *err) WARN_UNUSED;

/* Runs SQL that takes no parameters and returns no rows wanted (one
 * statement or several, in the simple protocol); 0, or -1 with err set. */
int db_command(PGconn *c, const char *sql, const char *what, Err *err) WARN_UNUSED;

/* As db_exec, for a statement run often: it is prepared as `name` on c the
 * first time this thread runs it there (again if the session does not know
 * it), and then only executed, so that it is not planned at every call.
 * name and sql are static strings, the same for a given name. */
PGresult *db_exec_cached(PGconn *c, const char *name, const char *sql, int nparams,
                         const char *const *params, const char *what, Err *err) WARN_UNUSED;

/* Column helpers for text results: NULL-safe. */
int64_t db_int(const PGresult *r, int row, int col);
const char *db_str(const PGresult *r, int row, int col); /* NULL for SQL NULL */

/* Appends s to a PostgreSQL array literal being built in b, quoted; NULL -> NULL. */
struct SBuf;
void db_array_text(struct SBuf *b, const char *s);

/* True if res is an error for what the statement holds (a data exception, a
 * constraint, a trigger's exception) on a session that is still there: the
 * same statement would fail again. */
bool db_refused(PGconn *c, const PGresult *res);

#endif
