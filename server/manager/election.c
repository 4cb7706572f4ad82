/* election: see election.h. */
#include "election.h"

#include <stdio.h>
#include <string.h>

#include "db.h"
#include "journal.h"
#include "log.h"

/* A usable session in *conn, opened when there is none or it broke. */
WARN_UNUSED static int ensure_session(Election *e, PGconn **conn)
{
    if (*conn && PQstatus(*conn) == CONNECTION_OK)
        return 0;
    PQfinish(*conn);
    Err err = {0};
    if (!e->app[0])
        snprintf(e->app, sizeof e->app, e->shard ? "manager-s%d" : "manager", e->shard);
    *conn = db_connect(e->database_url, e->app, &err);
    if (!*conn) {
        if (!e->down_logged)
            log_warn("manager cannot reach the database, retrying: %s", err.msg);
        e->down_logged = true;
        return -1;
    }
    if (e->down_logged)
        log_info("manager reached the database again");
    e->down_logged = false;
    return 0;
}

ElectionResult election_try(Election *e, PGconn **conn)
{
    if (ensure_session(e, conn) != 0)
        return ELECTION_DOWN;
    Err err = {0};
    char cls[16], obj[16];
    snprintf(cls, sizeof cls, "%d", DB_LOCK_CLASS);
    snprintf(obj, sizeof obj, "%d", db_shard_lock(e->shard));
    const char *params[] = {cls, obj};
    PGresult *r = db_exec(*conn, "SELECT pg_try_advisory_lock($1::int, $2::int)", 2, params,
                          "trying the leader lock", &err);
    if (!r) {
        log_warn("election: %s", err.msg);
        PQfinish(*conn);
        *conn = NULL;
        return ELECTION_DOWN;
    }
    bool won = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!won)
        return ELECTION_LOST;
    if (journal_prepare(*conn, e->shards > 1, &err) != 0) {
        log_error("won the lock but cannot prepare statements: %s", err.msg);
        PQfinish(*conn); /* releases the lock */
        *conn = NULL;
        return ELECTION_DOWN;
    }
    return ELECTION_WON;
}
