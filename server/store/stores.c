/* stores: see stores.h. */
#include "stores.h"

#include <ctype.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "migrate.h"
#include "util.h"

static const char *const HOW = "docs/operations.md, \"A database per shard\", says how";

int stores_parse(Stores *st, const char *home_url, const char *spec, Err *err)
{
    memset(st, 0, sizeof *st);
    st->url[st->n++] = xstrdup(home_url);
    const char *p = spec ? spec : "";
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            break;
        const char *end = p;
        while (*end && !isspace((unsigned char)*end))
            end++;
        const char *eq = memchr(p, '=', (size_t)(end - p));
        char *stop;
        long s = eq ? strtol(p, &stop, 10) : -1;
        if (!eq || stop != eq || eq == p || eq + 1 == end)
            return err_set(err, 400, "bad-setting",
                           "--shard-databases: \"%.*s\" is not SHARD=URL (pairs separated by "
                           "spaces)",
                           (int)(end - p), p);
        if (s < 1 || s >= SHARDS_MAX)
            return err_set(err, 400, "bad-setting",
                           "--shard-databases: shard %ld: a shard's own database is for shards "
                           "1 to %d (shard 0 lives in the home database, --database-url)",
                           s, SHARDS_MAX - 1);
        if (st->of[s])
            return err_set(err, 400, "bad-setting", "--shard-databases names shard %ld twice", s);
        char *url = xcalloc(1, (size_t)(end - eq));
        memcpy(url, eq + 1, (size_t)(end - eq - 1));
        int db = 0;
        for (int i = 1; i < st->n; i++)
            if (!strcmp(st->url[i], url))
                db = i;
        if (!strcmp(url, home_url)) {
            free(url);
            return err_set(err, 400, "bad-setting",
                           "--shard-databases: shard %ld's URL is the home database's "
                           "(--database-url): leave it out",
                           s);
        }
        if (db)
            free(url);
        else {
            db = st->n;
            st->url[st->n++] = url;
        }
        st->of[s] = db;
        p = end;
    }
    return 0;
}

void stores_free(Stores *st)
{
    for (int i = 0; i < st->n; i++)
        free(st->url[i]);
    memset(st, 0, sizeof *st);
}

void stores_keeps_array(const Stores *st, int db, char *out)
{
    size_t at = 0;
    out[at++] = '{';
    for (int s = 0; s < st->shards; s++)
        if (stores_keeps(st, db, s))
            at += (size_t)snprintf(out + at, STORES_KEEPS_LEN - at, "%s%d", at > 1 ? "," : "", s);
    snprintf(out + at, STORES_KEEPS_LEN - at, "}");
}

const char *stores_url(const Stores *st, int s)
{
    return st->url[st->of[s]];
}

/* A database's name in messages (never its URL: it may hold a password):
 * "the database of shard 2" (the first shard it keeps). */
static const char *db_label(const Stores *st, int db, char *buf, size_t len)
{
    int first = 0;
    for (int s = SHARDS_MAX - 1; s > 0; s--)
        if (st->of[s] == db)
            first = s;
    snprintf(buf, len, "the database of shard %d (--shard-databases)", first);
    return buf;
}

/* What one database says of itself (workd_cluster, migration 0021). */
typedef struct DbIdent {
    char database[40], home[40]; /* home: "" for a home database */
} DbIdent;

WARN_UNUSED static int read_ident(PGconn *c, DbIdent *id, Err *err)
{
    PGresult *r = db_exec(c, "SELECT database, home FROM workd_cluster WHERE id = 1", 0, NULL,
                          "reading which database this is", err);
    if (!r)
        return -1;
    snprintf(id->database, sizeof id->database, "%s", db_str(r, 0, 0));
    snprintf(id->home, sizeof id->home, "%s", db_str(r, 0, 1) ? db_str(r, 0, 1) : "");
    PQclear(r);
    return 0;
}

/* Whether shard s has lived in this database: had a leader there. */
WARN_UNUSED static int has_lived(PGconn *c, int s, bool *lived, Err *err)
{
    char sv[16];
    snprintf(sv, sizeof sv, "%d", s);
    const char *params[] = {sv};
    PGresult *r = db_exec(c,
                          "SELECT EXISTS (SELECT 1 FROM workd_shards WHERE shard = $1::int)"
                          "    OR EXISTS (SELECT 1 FROM workd_log WHERE shard = $1::int)",
                          1, params, "looking for a shard's rows", err);
    if (!r)
        return -1;
    *lived = !strcmp(db_str(r, 0, 0), "t");
    PQclear(r);
    return 0;
}

/* The database each shard lives in, as the home database records it: id[s]
 * "" for home. */
WARN_UNUSED static int read_places(PGconn *home, char (*id)[40], Err *err)
{
    PGresult *r = db_exec(home, "SELECT shard, database FROM workd_shard_databases", 0, NULL,
                          "reading where the shards live", err);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        int s = (int)db_int(r, i, 0);
        if (s > 0 && s < SHARDS_MAX)
            snprintf(id[s], 40, "%s", db_str(r, i, 1));
    }
    PQclear(r);
    return 0;
}

/* Checks shard s's setting against where it lives, and records a shard's own
 * database the first time. conn[db] are sessions to every database. */
WARN_UNUSED static int place_shard(const Stores *st, PGconn **conn, const DbIdent *ident,
                                   const char (*lives)[40], int s, Err *err)
{
    int db = st->of[s];
    char label[64];
    if (!db) {
        if (lives[s][0])
            return err_set(err, 409, "shard-database",
                           "shard %d keeps its rows in a database of its own (id %s), but "
                           "--shard-databases does not name it: give every server the same "
                           "--shard-databases (%s)",
                           s, lives[s], HOW);
        return 0;
    }
    if (lives[s][0]) {
        if (strcmp(lives[s], ident[db].database))
            return err_set(err, 409, "shard-database",
                           "shard %d keeps its rows in the database with id %s, and %s is "
                           "another (id %s): give every server the same --shard-databases (%s)",
                           s, lives[s], db_label(st, db, label, sizeof label), ident[db].database,
                           HOW);
        return 0;
    }
    bool lived;
    if (has_lived(conn[0], s, &lived, err) != 0)
        return -1;
    if (lived)
        return err_set(err, 409, "shard-database",
                       "shard %d keeps its rows in the home database, where it has had a "
                       "leader: a shard's database is chosen before its first leader and "
                       "never moves (%s)",
                       s, HOW);
    char sv[16];
    snprintf(sv, sizeof sv, "%d", s);
    const char *params[] = {sv, ident[db].database};
    PGresult *r =
        db_exec(conn[0], "INSERT INTO workd_shard_databases (shard, database) VALUES ($1, $2)", 2,
                params, "recording where the shard lives", err);
    if (!r)
        return -1;
    PQclear(r);
    log_info("shard %d keeps its rows in its own database (id %s)", s, ident[db].database);
    return 0;
}

/* Each shard database says which cluster it belongs to and which shards it
 * keeps (its inbox takes only theirs), as the home database records. */
WARN_UNUSED static int mark_databases(const Stores *st, PGconn **conn, const DbIdent *ident,
                                      Err *err)
{
    for (int db = 1; db < st->n; db++) {
        char keeps[STORES_KEEPS_LEN];
        stores_keeps_array(st, db, keeps);
        const char *params[] = {ident[0].database, keeps};
        PGresult *r = db_exec(conn[db],
                              "UPDATE workd_cluster SET home = $1::uuid, keeps = $2::int[]"
                              " WHERE id = 1",
                              2, params, "recording the shards this database keeps", err);
        if (!r)
            return -1;
        PQclear(r);
    }
    return 0;
}

/* Moves the schedules a database holds of a shard it does not keep (a
 * cluster that grew: a schedule follows its queue's shard) to the database
 * that keeps it. Every server is stopped then (migrate_run's rule), and a
 * schedule is copied before it is deleted, so a crash between leaves it in
 * both and the next start deletes the first copy. */
WARN_UNUSED static int move_schedules(const Stores *st, PGconn **conn, Err *err)
{
    for (int from = 0; from < st->n; from++) {
        char keeps[STORES_KEEPS_LEN];
        stores_keeps_array(st, from, keeps);
        const char *p[] = {keeps};
        PGresult *r = db_exec(conn[from],
                              "SELECT name, shard, row_to_json(s) FROM workd_schedules s"
                              " WHERE NOT shard = ANY ($1::int[])",
                              1, p, "looking for schedules to move", err);
        if (!r)
            return -1;
        for (int i = 0; i < PQntuples(r); i++) {
            int s = (int)db_int(r, i, 1);
            const char *row[] = {db_str(r, i, 2)};
            const char *name[] = {db_str(r, i, 0)};
            PGresult *w = s >= 0 && s < st->shards
                              ? db_exec(conn[st->of[s]],
                                        "INSERT INTO workd_schedules SELECT * FROM"
                                        " json_populate_record(NULL::workd_schedules, $1::json)"
                                        " ON CONFLICT (name) DO NOTHING",
                                        1, row, "moving a schedule", err)
                              : NULL;
            PQclear(w);
            if (w)
                w = db_exec(conn[from], "DELETE FROM workd_schedules WHERE name = $1", 1, name,
                            "moving a schedule", err);
            PQclear(w);
            if (!w) {
                PQclear(r);
                return -1;
            }
            log_info("schedule %s moved to shard %d's database", name[0], s);
        }
        PQclear(r);
    }
    return 0;
}

int stores_prepare(Stores *st, int want_shards, int *applied, Err *err)
{
    int shards = 0;
    if (migrate_run(st->url[0], want_shards, &shards, applied, err) != 0)
        return -1;
    for (int s = 1; s < SHARDS_MAX; s++)
        if (st->of[s] && s >= shards)
            return err_set(err, 409, "shard-database",
                           "--shard-databases names shard %d, and the cluster has %d shard%s "
                           "(0 to %d)",
                           s, shards, shards == 1 ? "" : "s", shards - 1);
    for (int db = 1; db < st->n; db++) {
        int theirs, n;
        if (migrate_run(st->url[db], shards, &theirs, &n, err) != 0) {
            char why[400], label[64];
            snprintf(why, sizeof why, "%.399s", err->msg);
            snprintf(err->msg, sizeof err->msg, "%s: %s", db_label(st, db, label, sizeof label),
                     why);
            return -1;
        }
    }
    st->shards = shards;
    if (st->n == 1) {
        /* No shard database named: none must be recorded either. */
        PGconn *c = db_connect(st->url[0], "start", err);
        char lives[SHARDS_MAX][40] = {{0}};
        int rc = c && read_places(c, lives, err) == 0 ? 0 : -1;
        for (int s = 1; rc == 0 && s < shards; s++)
            rc = place_shard(st, &c, NULL, lives, s, err);
        PQfinish(c);
        return rc;
    }
    PGconn *conn[SHARDS_MAX] = {0};
    DbIdent ident[SHARDS_MAX];
    char lives[SHARDS_MAX][40] = {{0}};
    char lock[128];
    snprintf(lock, sizeof lock, "SELECT pg_advisory_lock(%d, %d)", DB_LOCK_CLASS, DB_LOCK_MIGRATE);
    int rc = -1;
    for (int db = 0; db < st->n; db++)
        if (!(conn[db] = db_connect(st->url[db], "start", err)) ||
            read_ident(conn[db], &ident[db], err) != 0)
            goto cleanup;
    /* Under the home database's migration lock: two servers starting at once
     * record a shard's database once. */
    if (db_command(conn[0], lock, "taking the migration lock", err) != 0)
        goto cleanup;
    for (int db = 1; db < st->n; db++) {
        char label[64];
        db_label(st, db, label, sizeof label);
        if (ident[db].home[0] && strcmp(ident[db].home, ident[0].database)) {
            err_set(err, 409, "shard-database",
                    "%s belongs to another cluster (its home database has id %s; this "
                    "cluster's has id %s)",
                    label, ident[db].home, ident[0].database);
            goto cleanup;
        }
        if (!strcmp(ident[db].database, ident[0].database)) {
            err_set(err, 409, "shard-database",
                    "%s is the home database itself (the same id %s): a shard's own database "
                    "is another one",
                    label, ident[0].database);
            goto cleanup;
        }
    }
    if (read_places(conn[0], lives, err) != 0)
        goto cleanup;
    for (int s = 1; s < shards; s++)
        if (place_shard(st, conn, ident, lives, s, err) != 0)
            goto cleanup;
    if (mark_databases(st, conn, ident, err) != 0 || move_schedules(st, conn, err) != 0)
        goto cleanup;
    rc = 0;
cleanup:
    for (int db = 0; db < st->n; db++)
        PQfinish(conn[db]);
    return rc;
}
