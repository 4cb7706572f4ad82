/* dbwatch: see dbwatch.h. One thread, a session per database; the last
 * checks are kept under `lock` and copied out by readers. */
#include "dbwatch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "log.h"
#include "util.h"

/* What one check found. */
typedef struct Facts {
    bool reachable;
    char error[512];        /* when not reachable */
    char server[160];       /* host:port as the URL names it */
    char version[64];       /* server_version */
    bool standby;           /* pg_is_in_recovery() */
    char sync_names[256];   /* synchronous_standby_names */
    char sync_commit[32];   /* synchronous_commit */
    int64_t standbys;       /* streaming standbys (pg_stat_replication) */
    int64_t sync_standbys;  /* of them synchronous; -1: not visible to workd's role */
    int64_t commit_wait_ms; /* the longest wait of a commit for a synchronous standby */
    int64_t checked_ms;     /* wall clock of the check; 0: none yet */
} Facts;

/* One database's watch: thread-owned. */
typedef struct Watched {
    PGconn *conn;
    Facts prev; /* what was logged last */
    bool stall_logged, down_logged;
} Watched;

struct DbWatch {
    const Stores *stores; /* borrowed */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;          /* under lock */
    Facts last[SHARDS_MAX]; /* by database, under lock */
    Watched db[SHARDS_MAX]; /* by database, thread-owned */
};

/* One statement, nothing written: it answers even while commits are stuck.
 * pg_stat_replication's states are visible to superusers and members of
 * pg_read_all_stats (pg_monitor) only; the rows themselves to everyone. */
static const char FACTS_SQL[] =
    "SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),"
    " current_setting('synchronous_commit'),"
    " (SELECT count(*) FROM pg_stat_replication),"
    " CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
    "   OR pg_has_role('pg_read_all_stats', 'MEMBER')"
    "  THEN (SELECT count(*) FROM pg_stat_replication"
    "        WHERE sync_state IN ('sync', 'quorum') AND state = 'streaming') END,"
    " (SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start) * 1000), 0)"
    "  FROM pg_stat_activity WHERE wait_event = 'SyncRep')::bigint";

typedef enum { DUR_UNKNOWN, DUR_REPLICATED, DUR_LOCAL, DUR_UNSAFE } Durability;

static Durability durability(const Facts *f)
{
    if (!f->reachable || f->standby)
        return DUR_UNKNOWN;
    if (!strcmp(f->sync_commit, "off"))
        return DUR_UNSAFE;
    /* With standbys named and synchronous_commit on, remote_write or
     * remote_apply, a commit returns only once a synchronous standby has it. */
    if (f->sync_names[0] && strcmp(f->sync_commit, "local") != 0)
        return DUR_REPLICATED;
    return DUR_LOCAL;
}

static const char *durability_name(Durability d)
{
    static const char *const names[] = {"unknown", "replicated", "local", "unsafe"};
    return names[d];
}

static bool stalled(const Facts *f)
{
    return f->reachable && f->commit_wait_ms >= DBWATCH_STALL_MS;
}

static void stall_sentence(const Facts *f, char *out, size_t len)
{
    long long s = (long long)(f->commit_wait_ms / 1000);
    if (f->sync_standbys == 0)
        snprintf(out, len,
                 "commits have waited %lld s for a synchronous standby and none is connected "
                 "(synchronous_standby_names = '%s', %lld standby(s) streaming): no write can "
                 "complete until one connects or the setting is cleared",
                 s, f->sync_names, (long long)f->standbys);
    else if (f->sync_standbys < 0)
        snprintf(out, len,
                 "commits have waited %lld s for a synchronous standby "
                 "(synchronous_standby_names = '%s'; grant pg_monitor to workd's database role "
                 "to see which standbys are connected)",
                 s, f->sync_names);
    else
        snprintf(out, len,
                 "commits have waited %lld s for the confirmation of the %lld synchronous "
                 "standby(s) (synchronous_standby_names = '%s')",
                 s, (long long)f->sync_standbys, f->sync_names);
}

/* Logs the facts when what they promise changed (not the wait times). */
static void report(Watched *w, const Facts *f)
{
    const Facts *p = &w->prev;
    bool changed = !p->checked_ms || p->reachable != f->reachable || strcmp(p->server, f->server) ||
                   p->standby != f->standby || strcmp(p->sync_names, f->sync_names) ||
                   strcmp(p->sync_commit, f->sync_commit) || p->standbys != f->standbys ||
                   p->sync_standbys != f->sync_standbys;
    if (changed && f->reachable) {
        char sync[64];
        if (f->sync_standbys < 0)
            snprintf(sync, sizeof sync, "synchronous ones not visible (grant pg_monitor)");
        else
            snprintf(sync, sizeof sync, "%lld synchronous", (long long)f->sync_standbys);
        Durability d = durability(f);
        const char *promise =
            d == DUR_REPLICATED ? "a 202 is on a synchronous standby too"
            : d == DUR_UNSAFE   ? "synchronous_commit is off: a 202 can be lost if this server "
                                  "crashes"
            : f->standby        ? "this server is a standby: workd cannot write here"
            : f->standbys       ? "a 202 is on this server only: a failover to an asynchronous "
                                  "standby can lose it"
                                : "a 202 is on this server only";
        bool good = d == DUR_REPLICATED || (d == DUR_LOCAL && !f->standbys);
        log_emit(good ? LOG_INFO : LOG_WARN, __FILE__, __LINE__,
                 "database %s (PostgreSQL %s, %s): synchronous_commit=%s, "
                 "synchronous_standby_names='%s', %lld standby(s) streaming, %s: %s",
                 f->server, f->version, f->standby ? "standby" : "primary", f->sync_commit,
                 f->sync_names, (long long)f->standbys, sync, promise);
    }
    if (stalled(f) && !w->stall_logged) {
        char why[600];
        stall_sentence(f, why, sizeof why);
        log_error("database %s: %s", f->server, why);
        w->stall_logged = true;
    } else if (!stalled(f) && w->stall_logged && f->reachable) {
        log_info("database %s: commits no longer wait for a synchronous standby", f->server);
        w->stall_logged = false;
    }
    if (f->reachable)
        w->prev = *f;
}

static void check(Watched *w, const char *url, Facts *f)
{
    memset(f, 0, sizeof *f);
    f->sync_standbys = -1;
    f->checked_ms = wall_ms();
    Err err = {0};
    if (!db_alive(w->conn)) {
        PQfinish(w->conn);
        w->conn = db_connect(url, "dbwatch", &err);
        if (!w->conn) {
            snprintf(f->error, sizeof f->error, "%s", err.msg);
            return;
        }
        /* A frozen server would hold the check of every database. */
        db_set_deadline(w->conn, DBWATCH_EVERY_MS);
    }
    PGresult *r = db_exec(w->conn, FACTS_SQL, 0, NULL, "checking the database", &err);
    if (!r) {
        snprintf(f->error, sizeof f->error, "%s", err.msg);
        PQfinish(w->conn);
        w->conn = NULL;
        return;
    }
    f->reachable = true;
    const char *host = PQhost(w->conn), *port = PQport(w->conn);
    const char *version = PQparameterStatus(w->conn, "server_version");
    snprintf(f->server, sizeof f->server, "%s:%s", host ? host : "", port ? port : "");
    snprintf(f->version, sizeof f->version, "%s", version ? version : "");
    f->standby = !strcmp(PQgetvalue(r, 0, 0), "t");
    snprintf(f->sync_names, sizeof f->sync_names, "%s", PQgetvalue(r, 0, 1));
    snprintf(f->sync_commit, sizeof f->sync_commit, "%s", PQgetvalue(r, 0, 2));
    f->standbys = db_int(r, 0, 3);
    f->sync_standbys = PQgetisnull(r, 0, 4) ? -1 : db_int(r, 0, 4);
    f->commit_wait_ms = db_int(r, 0, 5);
    PQclear(r);
}

static void *dbwatch_main(void *arg)
{
    DbWatch *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stopping) {
        pthread_mutex_unlock(&w->lock);
        for (int d = 0; d < w->stores->n; d++) {
            Watched *x = &w->db[d];
            Facts f;
            check(x, w->stores->url[d], &f);
            if (!f.reachable && !x->down_logged)
                log_warn("database check: %s", f.error);
            x->down_logged = !f.reachable;
            report(x, &f);
            pthread_mutex_lock(&w->lock);
            w->last[d] = f;
            pthread_mutex_unlock(&w->lock);
        }
        pthread_mutex_lock(&w->lock);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += DBWATCH_EVERY_MS / 1000;
        until.tv_nsec += (long)(DBWATCH_EVERY_MS % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!w->stopping && pthread_cond_timedwait(&w->cond, &w->lock, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&w->lock);
    for (int d = 0; d < w->stores->n; d++) {
        PQfinish(w->db[d].conn);
        w->db[d].conn = NULL;
    }
    return NULL;
}

DbWatch *dbwatch_start(const Stores *stores, Err *err)
{
    DbWatch *w = xcalloc(1, sizeof *w);
    w->stores = stores;
    for (int d = 0; d < stores->n; d++) {
        w->last[d].sync_standbys = -1;
        snprintf(w->last[d].error, sizeof w->last[d].error, "not checked yet");
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (pthread_create(&w->thread, NULL, dbwatch_main, w) != 0) {
        err_set(err, 500, "internal", "cannot start the database watch thread");
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
        return NULL;
    }
    return w;
}

void dbwatch_stop(DbWatch *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
}

json_t *dbwatch_json(DbWatch *w)
{
    if (!w)
        return json_null();
    pthread_mutex_lock(&w->lock);
    Facts f = w->last[0];
    pthread_mutex_unlock(&w->lock);
    char at[40];
    if (f.checked_ms)
        time_format(f.checked_ms, at, sizeof at);
    json_t *o = json_pack("{s:b, s:s, s:b, s:I}", "reachable", f.reachable, "durability",
                          durability_name(durability(&f)), "stalled", stalled(&f), "commit_wait_ms",
                          (json_int_t)f.commit_wait_ms);
    json_object_set_new(o, "checked_at", f.checked_ms ? json_string(at) : json_null());
    if (!f.reachable) {
        json_object_set_new(o, "error", json_string(f.error));
        return o;
    }
    json_object_set_new(o, "server", json_string(f.server));
    json_object_set_new(o, "version", json_string(f.version));
    json_object_set_new(o, "role", json_string(f.standby ? "standby" : "primary"));
    json_object_set_new(o, "synchronous_commit", json_string(f.sync_commit));
    json_object_set_new(o, "synchronous_standby_names", json_string(f.sync_names));
    json_object_set_new(o, "standbys", json_integer(f.standbys));
    json_object_set_new(o, "sync_standbys",
                        f.sync_standbys < 0 ? json_null() : json_integer(f.sync_standbys));
    return o;
}

bool dbwatch_stalled(DbWatch *w, char *why, size_t whylen)
{
    if (!w)
        return false;
    int stuck = -1;
    Facts f;
    pthread_mutex_lock(&w->lock);
    for (int d = 0; d < w->stores->n && stuck < 0; d++)
        if (stalled(&w->last[d])) {
            stuck = d;
            f = w->last[d];
        }
    pthread_mutex_unlock(&w->lock);
    if (stuck < 0)
        return false;
    if (stuck == 0) {
        stall_sentence(&f, why, whylen);
        return true;
    }
    int first = 0;
    for (int s = SHARDS_MAX - 1; s > 0; s--)
        if (stores_keeps(w->stores, stuck, s))
            first = s;
    char sentence[600];
    stall_sentence(&f, sentence, sizeof sentence);
    snprintf(why, whylen, "the database of shard %d: %s", first, sentence);
    return true;
}
