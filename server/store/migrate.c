/* migrate: see migrate.h. */
#include "migrate.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

#include "db.h"
#include "log.h"

/* Whether a server of the cluster runs: one holds a shard's leader lock. */
WARN_UNUSED static int servers_running(PGconn *c, int shards, bool *running, Err *err)
{
    char n[16];
    snprintf(n, sizeof n, "%d", shards);
    const char *params[] = {n};
    /* Each lock this session takes is given back at once. */
    PGresult *r = db_exec(c,
                          "SELECT count(*) FILTER (WHERE NOT got) FROM"
                          " (SELECT s, pg_try_advisory_lock(2003792491, workd_shard_lock(s)) AS got"
                          "    FROM generate_series(0, $1::int - 1) s) t"
                          " CROSS JOIN LATERAL (SELECT CASE WHEN got THEN"
                          "   pg_advisory_unlock(2003792491, workd_shard_lock(s)) END) u",
                          1, params, "looking for running servers", err);
    if (!r)
        return -1;
    *running = db_int(r, 0, 0) > 0;
    PQclear(r);
    return 0;
}

/* The shard count as migrate_run says (under the migration lock). A cluster
 * grows (never shrinks: a shard's log would have no reader) while no server
 * runs and no work is open: each queue's work is then in one shard only,
 * whichever its new shard is, and the logs of the shards there were stay
 * as they are, so that every event id given out before still resumes. */
WARN_UNUSED static int fix_shards(PGconn *c, int want, int *shards, Err *err)
{
    PGresult *r = db_exec(c, "SELECT shards FROM workd_cluster WHERE id = 1", 0, NULL,
                          "reading the shard count", err);
    if (!r)
        return -1;
    *shards = PQntuples(r) ? (int)db_int(r, 0, 0) : 1;
    PQclear(r);
    if (want <= 0 || want == *shards)
        return 0;
    const char *how = "docs/operations.md, \"Shards\", says how";
    if (want < *shards)
        return err_set(err, 409, "shards-fixed",
                       "this database has %d shards: a cluster's shards can grow, not shrink "
                       "(%s)",
                       *shards, how);
    bool running;
    if (servers_running(c, *shards, &running, err) != 0)
        return -1;
    if (running)
        return err_set(err, 409, "shards-fixed",
                       "this database has %d shard%s and a server of it is running: stop "
                       "every server before --shards %d (%s)",
                       *shards, *shards == 1 ? "" : "s", want, how);
    r = db_exec(c,
                "SELECT (SELECT count(*) FROM workd_open) + (SELECT count(*) FROM workd_inbox)"
                "     + (SELECT count(*) FROM workd_batches WHERE finished_seq IS NULL)",
                0, NULL, "looking for open work", err);
    if (!r)
        return -1;
    int64_t open = db_int(r, 0, 0);
    PQclear(r);
    if (open)
        return err_set(err, 409, "shards-fixed",
                       "this database has %d shard%s and open work (%lld items, SQL "
                       "submissions or batches): drain it before --shards %d (%s)",
                       *shards, *shards == 1 ? "" : "s", (long long)open, want, how);
    char w[16];
    snprintf(w, sizeof w, "%d", want);
    const char *params[] = {w};
    if (db_command(c, "BEGIN", "BEGIN", err) != 0)
        return -1;
    r = db_exec(c, "UPDATE workd_cluster SET shards = $1::int WHERE id = 1", 1, params,
                "setting the shard count", err);
    PQclear(r);
    if (r)
        r = db_exec(c, "UPDATE workd_schedules SET shard = workd_shard_of(spec->'work'->>'queue')",
                    0, NULL, "moving the schedules to their queues' shards", err);
    PQclear(r);
    if (!r || db_command(c, "COMMIT", "COMMIT", err) != 0) {
        PQclear(PQexec(c, "ROLLBACK"));
        return -1;
    }
    log_info("the cluster has %d shards now (it had %d)", want, *shards);
    *shards = want;
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
