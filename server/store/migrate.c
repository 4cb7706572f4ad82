/* migrate: see migrate.h. */
#include "migrate.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

#include "db.h"
#include "log.h"

int migrate_run(const char *database_url, int *applied, Err *err)
{
    *applied = 0;
    PGconn *c = db_connect(database_url, "migrate", err);
    if (!c)
        return -1;
    int rc = -1;
    bool locked = false;
    char lock[128];
    snprintf(lock, sizeof lock, "SELECT pg_advisory_lock(%d, %d)", DB_LOCK_CLASS, DB_LOCK_MIGRATE);
    if (db_command(c, "SET client_min_messages = warning", "configuring", err) ||
        db_command(c, lock, "taking the migration lock", err))
        goto cleanup;
    locked = true;
    if (db_command(c,
                   "CREATE TABLE IF NOT EXISTS workd_migrations ("
                   " version integer PRIMARY KEY, name text NOT NULL,"
                   " applied_at timestamptz NOT NULL DEFAULT now())",
                   "creating workd_migrations", err))
        goto cleanup;
    for (size_t i = 0; i < workd_migrations_count; i++) {
        const Migration *m = &workd_migrations[i];
        char v[16];
        snprintf(v, sizeof v, "%d", m->version);
        const char *params[] = {v, m->name};
        PGresult *r = db_exec(c, "SELECT 1 FROM workd_migrations WHERE version = $1::int", 1,
                              params, "reading workd_migrations", err);
        if (!r)
            goto cleanup;
        bool done = PQntuples(r) > 0;
        PQclear(r);
        if (done)
            continue;
        if (db_command(c, "BEGIN", "BEGIN", err))
            goto cleanup;
        char what[160];
        snprintf(what, sizeof what, "applying migration %s", m->name);
        if (db_command(c, m->sql, what, err)) {
            PQclear(PQexec(c, "ROLLBACK"));
            goto cleanup;
        }
        r = db_exec(c, "INSERT INTO workd_migrations (version, name) VALUES ($1::int, $2)", 2,
                    params, "recording the migration", err);
        if (!r) {
            PQclear(PQexec(c, "ROLLBACK"));
            goto cleanup;
        }
        PQclear(r);
        if (db_command(c, "COMMIT", "COMMIT", err))
            goto cleanup;
        log_info("applied migration %s", m->name);
        (*applied)++;
    }
    rc = 0;
cleanup:
    if (locked) {
        snprintf(lock, sizeof lock, "SELECT pg_advisory_unlock(%d, %d)", DB_LOCK_CLASS,
                 DB_LOCK_MIGRATE);
        PQclear(PQexec(c, lock));
    }
    PQfinish(c);
    return rc;
}
