/* migrate: see migrate.h. */
#include "migrate.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

#include "db.h"
#include "log.h"

/* The shard count as migrate_run says (under the migration lock). */
WARN_UNUSED static int fix_shards(PGconn *c, int want, int *shards, Err *err)
{
    char w[16];
    snprintf(w, sizeof w, "%d", want);
    const char *params[] = {w};
    /* Never held work: no event but terms in the log, nothing in the inbox
     * (a cluster's queues move between shards when the count changes). */
    PGresult *r = db_exec(c,
                          "UPDATE workd_cluster SET shards = $1::int"
                          " WHERE id = 1 AND $1::int > 0 AND shards <> $1::int"
                          "   AND NOT EXISTS (SELECT 1 FROM workd_inbox)"
                          "   AND NOT EXISTS (SELECT 1 FROM workd_events WHERE type <> 'term')",
                          1, params, "setting the shard count", err);
    if (!r)
        return -1;
    PQclear(r);
    r = db_exec(c, "SELECT shards FROM workd_cluster WHERE id = 1", 0, NULL,
                "reading the shard count", err);
    if (!r)
        return -1;
    *shards = PQntuples(r) ? (int)db_int(r, 0, 0) : 1;
    PQclear(r);
    if (want > 0 && want != *shards)
        return err_set(err, 409, "shards-fixed",
                       "this database has %d shard%s and has held work: --shards %d cannot "
                       "change that (docs/operations.md, \"Shards\", says how to move to "
                       "another count)",
                       *shards, *shards == 1 ? "" : "s", want);
    return 0;
}

int migrate_run(const char *database_url, int want_shards, int *shards, int *applied, Err *err)
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
    if (fix_shards(c, want_shards, shards, err) != 0)
        goto cleanup;
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
