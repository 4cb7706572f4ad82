/* db: PostgreSQL connections for the server, and small helpers around libpq
 * results. Every connection is direct (never through a transaction pooler:
 * advisory locks and LISTEN need a session) and uses TCP keepalives and
 * tcp_user_timeout so that a half-open session is noticed within seconds. */
#ifndef WORKD_DB_H
#define WORKD_DB_H

#include <libpq-fe.h>
#include <stdint.h>

#include "err.h"

/* The advisory lock keys (two int4 form: class, object). */
#define DB_LOCK_CLASS 2003792491 /* "work" */
#define DB_LOCK_LEADER 1
#define DB_LOCK_MIGRATE 2

/* Opens a connection; app is the application_name suffix ("manager", "listener"...).
 * Returns NULL and sets err on failure. */
PGconn *db_connect(const char *url, const char *app, Err *err);

/* True if res is PGRES_COMMAND_OK or PGRES_TUPLES_OK; otherwise sets err from the
 * result (status 503 when the connection is gone, 500 otherwise), clears res. */
int db_check(PGconn *c, PGresult *res, const char *what, Err *err) WARN_UNUSED;

/* Runs a parameterised statement (text parameters) and returns its result, or
 * NULL with err set. The caller PQclear()s. */
PGresult *db_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                  const char *what, Err *err);

/* Column helpers for text results: NULL-safe. */
int64_t db_int(const PGresult *r, int row, int col);
const char *db_str(const PGresult *r, int row, int col); /* NULL for SQL NULL */

/* Appends s to a PostgreSQL array literal being built in b, quoted; NULL -> NULL. */
struct SBuf;
void db_array_text(struct SBuf *b, const char *s);

#endif
