/* dbpool: a few threads, each with its own PostgreSQL session, that run the
 * front-end's reads so that no HTTP thread ever waits on the database. */
#ifndef WORKD_DBPOOL_H
#define WORKD_DBPOOL_H

#include <libpq-fe.h>

#include "err.h"

typedef struct DbPool DbPool;

/* A task runs on a pool thread with a live connection (conn is NULL when the
 * database cannot be reached: the task must answer with a 503 itself). */
typedef void (*DbTaskFn)(PGconn *conn, void *arg);

DbPool *dbpool_start(const char *database_url, int threads, Err *err) WARN_UNUSED;
/* Runs what is queued (with conn NULL), then joins; later tasks run at once
 * with conn NULL. dbpool_free after the HTTP daemon has stopped. */
void dbpool_stop(DbPool *p);
void dbpool_free(DbPool *p);
void dbpool_submit(DbPool *p, DbTaskFn fn, void *arg);

#endif
