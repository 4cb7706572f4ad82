/* dbpool: a few threads that run the front-end's reads so that no HTTP thread
 * ever waits on the database. Each thread keeps a PostgreSQL session per
 * database of the cluster (stores.h), opened when a task first needs it. */
#ifndef WORKD_DBPOOL_H
#define WORKD_DBPOOL_H

#include "err.h"
#include "view.h"

typedef struct DbPool DbPool;

/* A task runs on a pool thread and reaches the databases through db
 * (view_db, view_shard_db; valid until it returns). A session whose server
 * went away is replaced the first time a task asks for it; a database that
 * cannot be reached gives none, and the read that needs it answers 503
 * (view.h). */
typedef void (*DbTaskFn)(ViewDbs *db, void *arg);

/* Every statement of the pool waits at most DBPOOL_DEADLINE_MS for its
 * answer, and less once the watch says its database went silent
 * (dbpool_watch): a frozen database holds a pool thread until the
 * listener's probe there is overdue, and reads queued behind it that long. */
#define DBPOOL_DEADLINE_MS 5000

/* stores is borrowed: it outlives the pool. */
DbPool *dbpool_start(const Stores *stores, int threads, Err *err) WARN_UNUSED;
/* Runs what is queued (with no database), then joins; later tasks run at
 * once with no database. dbpool_free after the HTTP daemon has stopped. */
void dbpool_stop(DbPool *p);
void dbpool_free(DbPool *p);
void dbpool_submit(DbPool *p, DbTaskFn fn, void *arg);
/* From now on a database that down(ud, db) says is down gives no session
 * at once, rather than a connect that waits for its timeout (a host that
 * does not answer would hold every pool thread), and a statement there
 * gives up waiting once silent(ud, db) says so: the listener's word
 * (listener_db_down, listener_db_silent). Any thread. */
void dbpool_watch(DbPool *p, bool (*down)(void *ud, int db), bool (*silent)(void *ud, int db),
                  void *ud);

#endif
