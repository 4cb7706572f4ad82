/* retention: see retention.h. Every step is a short statement with a lock
 * timeout on the retention thread's own session; a step that cannot get its
 * lock gives up and is tried again at the next pass. */
#include "retention.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "journal.h"
#include "log.h"
#include "util.h"
#include "wake.h"

#define DAY_MS 86400000LL
#define AHEAD 2 /* parts kept ready beyond the current one */

struct Retention {
    RetentionConfig cfg;
    RetentionStats stats;
    pthread_t thread;
    atomic_bool stopping;
    int efd;
    PGconn *conn; /* thread-owned */
};

int64_t retention_span(int64_t retain_ms)
{
    int64_t span = retain_ms / 4;
    return span < 1000 ? 1000 : span > DAY_MS ? DAY_MS : span;
}

WARN_UNUSED static int exec(Retention *r, const char *sql, int n, const char *const *params,
                            const char *what)
{
    Err err = {0};
    PGresult *res = db_exec(r->conn, sql, n, params, what, &err);
    if (!res) {
        log_warn("retention: %s", err.msg);
        atomic_store(&r->stats.last_error_ms, wall_ms());
        return -1;
    }
    PQclear(res);
    return 0;
}

/* Adds parts until AHEAD of them start after now. */
WARN_UNUSED static int add_ahead(Retention *r, const PartList *pl, int64_t now)
{
    const Part *last = &pl->items[pl->n - 1];
    int part = last->part;
    int64_t ends = last->ends_at;
    while (ends < now + AHEAD * r->cfg.span_ms) {
        int64_t starts = ends > now ? ends : now; /* no leader ran for a while: no gap of parts */
        char p[16], s[24], e[24];
        snprintf(p, sizeof p, "%d", ++part);
        snprintf(s, sizeof s, "%lld", (long long)starts);
        snprintf(e, sizeof e, "%lld", (long long)(starts + r->cfg.span_ms));
        const char *params[] = {p, s, e};
        if (exec(r, "SELECT workd_part_add($1::int, workd_ts($2::bigint), workd_ts($3::bigint))", 3,
                 params, "adding a part") != 0)
            return -1;
        log_debug("retention: added part %d", part);
        ends = starts + r->cfg.span_ms;
    }
    return 0;
}

/* Detaches and drops one table of a part. A detach that was interrupted
 * (a lost session, a lock timeout) is finished first. */
WARN_UNUSED static int drop_table(Retention *r, const char *table, int part)
{
    char name[64], sql[256];
    snprintf(name, sizeof name, "%s_p%d", table, part);
    const char *params[] = {name};
    Err err = {0};
    PGresult *res = db_exec(r->conn,
                            "SELECT i.inhdetachpending FROM pg_inherits i"
                            "  JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relname = $1",
                            1, params, "looking at a part", &err);
    if (!res) {
        log_warn("retention: %s", err.msg);
        return -1;
    }
    bool attached = PQntuples(res) == 1;
    bool pending = attached && !strcmp(PQgetvalue(res, 0, 0), "t");
    PQclear(res);
    if (attached) {
        /* The detach waits for transactions that may still read the part
         * (a long one holds it back, as it holds back VACUUM); only this
         * thread waits: the leader's appends go to other parts. */
        snprintf(sql, sizeof sql, "ALTER TABLE %s DETACH PARTITION %s %s", table, name,
                 pending ? "FINALIZE" : "CONCURRENTLY");
        if (exec(r, "SET lock_timeout = 0", 0, NULL, "configuring") != 0)
            return -1;
        int rc = exec(r, sql, 0, NULL, "detaching a part");
        if (exec(r, "SET lock_timeout = '500ms'", 0, NULL, "configuring") != 0 || rc != 0)
            return -1;
    }
    snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s", name);
    return exec(r, sql, 0, NULL, "dropping a part");
}

/* Drops the oldest parts whose every row is older than the window. The part
 * the leader writes into is never dropped, nor any after it; a part's rows
 * are all as old as its last event, which the (shard, seq) index finds at
 * once in each shard's log. */
WARN_UNUSED static int drop_expired(Retention *r, const PartList *pl, int64_t now)
{
    int current = r->cfg.current_part(r->cfg.ud);
    for (size_t i = 0; i < pl->n && pl->items[i].part < current; i++) {
        int part = pl->items[i].part;
        char sql[400];
        snprintf(sql, sizeof sql,
                 "SELECT workd_epoch_ms(max(r.last_at))"
                 "  FROM generate_series(0, (SELECT shards - 1 FROM workd_cluster)) s"
                 "       CROSS JOIN LATERAL (SELECT last_at FROM workd_log_p%d"
                 "                            WHERE shard = s ORDER BY last_seq DESC LIMIT 1) r",
                 part);
        Err err = {0};
        PGresult *res = db_exec(r->conn, sql, 0, NULL, "reading a part's last event", &err);
        if (!res) {
            log_warn("retention: %s", err.msg);
            return -1;
        }
        int64_t last = PQntuples(res) ? db_int(res, 0, 0) : 0;
        PQclear(res);
        if (last > now - r->cfg.retain_ms)
            return 0;
        if (drop_table(r, "workd_done", part) != 0 || drop_table(r, "workd_log", part) != 0 ||
            drop_table(r, "workd_progress", part) != 0)
            return -1;
        char pv[16];
        snprintf(pv, sizeof pv, "%d", part);
        const char *params[] = {pv};
        if (exec(r, "DELETE FROM workd_counts WHERE part = $1::int", 1, params,
                 "forgetting a part's counts") != 0 ||
            exec(r, "DELETE FROM workd_parts WHERE part = $1::int", 1, params,
                 "forgetting a part") != 0)
            return -1;
        /* Finished batches leave with their work (GET /batches then says 404);
         * open ones stay, however old. */
        char cut[24];
        snprintf(cut, sizeof cut, "%lld", (long long)(now - r->cfg.retain_ms));
        const char *cp[] = {cut};
        if (exec(r, "DELETE FROM workd_batches WHERE finished_at < workd_ts($1::bigint)", 1, cp,
                 "forgetting finished batches") != 0)
            return -1;
        atomic_fetch_add(&r->stats.parts_dropped, 1);
        log_info("retention: dropped part %d (last written %lld s ago)", part,
                 last ? (long long)((now - last) / 1000) : -1LL);
    }
    return 0;
}

/* The chart's buckets (workd_activity) older than ACTIVITY_KEEP_S go: a few
 * small rows per queue and bucket, deleted by their primary key's range. */
static int trim_activity(Retention *r, int64_t now)
{
    char before[24];
    snprintf(before, sizeof before, "%lld", (long long)(now / 1000 - ACTIVITY_KEEP_S));
    const char *params[] = {before};
    return exec(r, "DELETE FROM workd_activity WHERE bucket < $1::bigint", 1, params,
                "forgetting old activity");
}

static void measure(Retention *r, const PartList *pl)
{
    Err err = {0};
    PGresult *res =
        db_exec(r->conn,
                "SELECT (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)"
                "          FROM (SELECT relid FROM pg_partition_tree('workd_log')"
                "                UNION ALL"
                "                SELECT relid FROM pg_partition_tree('workd_progress')) t),"
                "       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)"
                "          FROM pg_partition_tree('workd_done')),"
                "       pg_total_relation_size('workd_open')",
                0, NULL, "measuring the tables", &err);
    if (!res)
        return;
    atomic_store(&r->stats.events_bytes, db_int(res, 0, 0));
    atomic_store(&r->stats.done_bytes, db_int(res, 0, 1));
    atomic_store(&r->stats.open_bytes, db_int(res, 0, 2));
    PQclear(res);
    atomic_store(&r->stats.parts, (long long)pl->n);
    atomic_store(&r->stats.oldest_part_ms, !pl->n                  ? 0
                                           : pl->items[0].first_at ? pl->items[0].first_at
                                                                   : pl->items[0].starts_at);
}

static void pass(Retention *r)
{
    if (!db_alive(r->conn)) { /* none yet, or its server went away since the last pass */
        PQfinish(r->conn);
        Err err = {0};
        if (!(r->conn = db_connect(r->cfg.database_url, "retention", &err))) {
            log_debug("retention: %s", err.msg);
            return;
        }
        /* Never queue behind a long lock: try again at the next pass. */
        if (exec(r, "SET lock_timeout = '500ms'", 0, NULL, "configuring") != 0)
            return;
    }
    PartList *pl = xcalloc(1, sizeof *pl);
    Err err = {0};
    int64_t now = wall_ms();
    if (journal_parts(r->conn, pl, &err) != 0) {
        log_warn("retention: %s", err.msg);
    } else if (pl->n > 0 && add_ahead(r, pl, now) == 0 && drop_expired(r, pl, now) == 0 &&
               trim_activity(r, now) == 0) {
        if (journal_parts(r->conn, pl, &err) == 0)
            measure(r, pl);
        atomic_store(&r->stats.last_run_ms, now);
    }
    free(pl);
}

static void *retention_main(void *arg)
{
    Retention *r = arg;
    while (!atomic_load(&r->stopping)) {
        if (r->cfg.leading(r->cfg.ud))
            pass(r);
        wake_wait(r->efd, (int)r->cfg.interval_ms);
    }
    PQfinish(r->conn);
    return NULL;
}

Retention *retention_start(const RetentionConfig *cfg, Err *err)
{
    Retention *r = xcalloc(1, sizeof *r);
    r->cfg = *cfg;
    r->cfg.database_url = xstrdup(cfg->database_url);
    if ((r->efd = wake_open(err)) < 0)
        goto cleanup;
    if (pthread_create(&r->thread, NULL, retention_main, r) != 0) {
        err_set(err, 500, "internal", "cannot start the retention thread");
        goto cleanup;
    }
    return r;
cleanup:
    wake_close(r->efd);
    free((char *)r->cfg.database_url);
    free(r);
    return NULL;
}

void retention_kick(Retention *r)
{
    wake_poke(r->efd);
}

void retention_stop(Retention *r)
{
    if (!r)
        return;
    atomic_store(&r->stopping, true);
    retention_kick(r);
    pthread_join(r->thread, NULL);
    wake_close(r->efd);
    free((char *)r->cfg.database_url);
    free(r);
}

const RetentionStats *retention_stats(const Retention *r)
{
    return &r->stats;
}
