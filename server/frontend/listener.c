/* listener: see listener.h. */
#include "listener.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "http.h"
#include "view.h"
#include "log.h"
#include "hub.h"
#include "util.h"
#include "wake.h"

#define PAGE 1000
#define NODE_EVERY_MS 3000

struct Listener {
    ListenerConfig cfg; /* strings borrowed from the caller */
    pthread_t thread;
    atomic_bool stopping;
    int efd;
    PGconn *conn;
    bool down_logged;
    int64_t next_node_ms;
    pthread_mutex_t nodes_lock;
    json_t *nodes;
    atomic_bool db_ok; /* the session is up (written by the thread only) */
};

static void drop(Listener *l, const char *why)
{
    if (l->conn && !l->down_logged)
        log_warn("listener lost its database session: %s", why);
    l->down_logged = true;
    PQfinish(l->conn);
    l->conn = NULL;
    atomic_store(&l->db_ok, false);
}

/* Re-reads the leader of every shard in `which` (a bit per shard). */
WARN_UNUSED static int refresh_leader(Listener *l, uint64_t which)
{
    int n = leaderinfo_shards(l->cfg.leader);
    for (int k = 0; k < n; k++) {
        if (!(which >> k & 1))
            continue;
        Err err = {0};
        char url[256];
        int64_t term;
        if (view_leader(l->conn, k, &term, url, sizeof url, &err) != 0) {
            drop(l, err.msg);
            return -1;
        }
        if (leaderinfo_set(l->cfg.leader, k, url, term) && term) {
            if (n == 1)
                log_info("leader is %s (term %lld)", url, (long long)term);
            else
                log_info("leader of shard %d is %s (term %lld)", k, url, (long long)term);
        }
    }
    return 0;
}

/* Every shard, as refresh_leader's `which`. */
#define ALL_SHARDS UINT64_MAX

/* Reads shard k's finished events past what the hub has, up to `notified` (a
 * seq of shard k known to be committed before this read started). */
WARN_UNUSED static int pump(Listener *l, int k, int64_t notified)
{
    if (hub_claimed(l->cfg.hub, k, notified))
        return 0; /* read, or this node's own commit, published by its manager */
    for (;;) {
        ResultList rows = {0};
        Err err = {0};
        bool at_end = false;
        int n = view_finished_after(l->conn, k, hub_scanned_upto(l->cfg.hub, k), PAGE,
                                    l->cfg.page_bytes, true, NULL, &rows, &at_end, &err);
        if (n < 0) {
            view_results_clear(&rows);
            drop(l, err.msg);
            return -1;
        }
        for (size_t i = 0; i < rows.len; i++)
            hub_publish(l->cfg.hub, &rows.items[i]);
        view_results_clear(&rows);
        if (at_end) {
            hub_scanned(l->cfg.hub, k, notified);
            return 0;
        }
    }
}

WARN_UNUSED static int connect_listen(Listener *l)
{
    Err err = {0};
    l->conn = db_connect(l->cfg.database_url, "listener", &err);
    if (!l->conn) {
        if (!l->down_logged)
            log_warn("listener cannot reach the database, retrying: %s", err.msg);
        l->down_logged = true;
        return -1;
    }
    /* Its reads are the same few statements all the time: plan them once
     * (db_exec_cached), whatever their parameters. */
    PGresult *r = db_exec(l->conn, "SET plan_cache_mode = force_generic_plan", 0, NULL,
                          "configuring the listener's session", &err);
    PQclear(r);
    if (r)
        r = db_exec(l->conn, "LISTEN workd_events", 0, NULL, "LISTEN", &err);
    PQclear(r);
    if (r)
        r = db_exec(l->conn, "LISTEN workd_leader", 0, NULL, "LISTEN", &err);
    PQclear(r);
    if (!r) {
        drop(l, err.msg);
        return -1;
    }
    if (l->down_logged)
        log_info("listener reached the database again");
    l->down_logged = false;
    if (refresh_leader(l, ALL_SHARDS) != 0)
        return -1;
    for (int k = 0; k < hub_shards(l->cfg.hub); k++) {
        int64_t last = 0;
        if (view_last_seq(l->conn, k, &last, &err) != 0) {
            drop(l, err.msg);
            return -1;
        }
        /* After a failover each log must go on from where it was: with
         * synchronous replication the new primary has every event this node
         * saw committed. */
        int64_t seen = hub_scanned_upto(l->cfg.hub, k);
        char of[32] = "";
        if (k)
            snprintf(of, sizeof of, " of shard %d", k);
        if (last < seen)
            log_error("the event log%s on this database server ends at seq %lld, but this node "
                      "already saw seq %lld: committed events were lost (a failover to a standby "
                      "that was not synchronous?); results after seq %lld may be missing from "
                      "streams",
                      of, (long long)last, (long long)seen, (long long)last);
        if (pump(l, k, last) != 0)
            return -1;
    }
    atomic_store(&l->db_ok, true);
    return 0;
}

static void announce(Listener *l)
{
    Err err = {0};
    char started[40];
    time_format(l->cfg.started_ms, started, sizeof started);
    const char *params[] = {l->cfg.node_id, l->cfg.advertise_url, l->cfg.roles, started};
    PGresult *r = db_exec(l->conn,
                          "INSERT INTO workd_nodes (id, url, roles, started_at, last_seen)"
                          " VALUES ($1, $2, $3, $4::timestamptz, now())"
                          " ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url,"
                          " roles = EXCLUDED.roles, started_at = EXCLUDED.started_at,"
                          " last_seen = now()",
                          4, params, "announcing this node", &err);
    if (!r) {
        drop(l, err.msg);
        return;
    }
    PQclear(r);
    r = db_exec(l->conn,
                "SELECT id, url, roles, (extract(epoch from last_seen) * 1000)::bigint"
                " FROM workd_nodes WHERE last_seen > now() - interval '30 seconds' ORDER BY id",
                0, NULL, "listing nodes", &err);
    if (!r) {
        drop(l, err.msg);
        return;
    }
    json_t *nodes = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        char seen[40];
        time_format(db_int(r, i, 3), seen, sizeof seen);
        json_array_append_new(nodes, json_pack("{s:s, s:s, s:s, s:s}", "id", db_str(r, i, 0), "url",
                                               db_str(r, i, 1), "roles", db_str(r, i, 2),
                                               "last_seen", seen));
    }
    PQclear(r);
    pthread_mutex_lock(&l->nodes_lock);
    json_decref(l->nodes);
    l->nodes = nodes;
    pthread_mutex_unlock(&l->nodes_lock);
}

json_t *listener_nodes(Listener *l)
{
    pthread_mutex_lock(&l->nodes_lock);
    json_t *n = l->nodes ? json_incref(l->nodes) : json_array();
    pthread_mutex_unlock(&l->nodes_lock);
    return n;
}

/* How long to sleep at most: `most` ms, less when a GET ?wait= ends sooner
 * (its answer is due at its deadline, not at the next second). */
static int tick_in(Listener *l, int64_t most)
{
    int64_t due = hub_next_deadline(l->cfg.hub) - mono_ms();
    return (int)(due < 0 ? 0 : due < most ? due : most);
}

static void *listener_main(void *arg)
{
    Listener *l = arg;
    int64_t backoff = 50;
    while (!atomic_load(&l->stopping)) {
        hub_tick(l->cfg.hub, mono_ms());
        if (l->cfg.http)
            http_sweep(l->cfg.http, mono_ms());
        if (!l->conn) {
            if (connect_listen(l) != 0) {
                if (wake_wait(l->efd, tick_in(l, backoff)))
                    continue; /* woken for a timer: the backoff is not over */
                /* Capped as low as the managers' election interval: after a
                 * failover this node's streams, and its forwards to the leader
                 * (the leader's URL comes from here), wait for this reconnect. */
                backoff = backoff * 2 > 250 ? 250 : backoff * 2;
                continue;
            }
            backoff = 50;
        }
        if (mono_ms() >= l->next_node_ms) {
            announce(l);
            l->next_node_ms = mono_ms() + NODE_EVERY_MS;
            if (!l->conn)
                continue;
        }
        bool suspect = leaderinfo_suspect(l->cfg.leader);
        struct pollfd pfd[2] = {{.fd = l->efd, .events = POLLIN},
                                {.fd = PQsocket(l->conn), .events = POLLIN}};
        poll(pfd, 2, tick_in(l, suspect ? 100 : 1000));
        if (pfd[0].revents)
            wake_drain(l->efd);
        /* Notifications that arrive while a pump's queries run wait inside
         * libpq, not on the socket: read them again until none is left. */
        for (bool first = true;; first = false) {
            if (!PQconsumeInput(l->conn) || PQstatus(l->conn) != CONNECTION_OK) {
                drop(l, PQerrorMessage(l->conn));
                break;
            }
            int shards = hub_shards(l->cfg.hub);
            int64_t notified[SHARDS_MAX];
            bool any = false;
            uint64_t leaders = first && suspect ? ALL_SHARDS : 0;
            for (int k = 0; k < shards; k++)
                notified[k] = -1;
            PGnotify *n;
            while ((n = PQnotifies(l->conn))) {
                int k;
                int64_t v;
                bool events = !strcmp(n->relname, "workd_events");
                if (!view_notify_parse(n->extra, shards, &k, &v)) {
                    /* Not a shard of this cluster (it cannot grow under a
                     * running node): events are left to the next
                     * notification, the leaders all read again. */
                    log_warn("listener: notification '%s' on %s names no shard of %d", n->extra,
                             n->relname, shards);
                    if (!events)
                        leaders = ALL_SHARDS;
                } else if (events) {
                    if (v > notified[k])
                        notified[k] = v;
                    any = true;
                } else {
                    leaders |= (uint64_t)1 << k;
                }
                PQfreemem(n);
            }
            if ((leaders && refresh_leader(l, leaders) != 0) || !any)
                break;
            int rc = 0;
            for (int k = 0; k < shards && rc == 0; k++)
                if (notified[k] >= 0)
                    rc = pump(l, k, notified[k]);
            if (rc != 0)
                break;
        }
    }
    return NULL;
}

Listener *listener_start(const ListenerConfig *cfg, Err *err)
{
    Listener *l = xcalloc(1, sizeof *l);
    l->cfg = *cfg;
    pthread_mutex_init(&l->nodes_lock, NULL);
    if ((l->efd = wake_open(err)) < 0 || pthread_create(&l->thread, NULL, listener_main, l) != 0) {
        if (l->efd >= 0)
            err_set(err, 500, "internal", "cannot start the listener thread");
        wake_close(l->efd);
        pthread_mutex_destroy(&l->nodes_lock);
        free(l);
        return NULL;
    }
    return l;
}

bool listener_db_ok(Listener *l)
{
    return l && atomic_load(&l->db_ok);
}

void listener_wake(Listener *l)
{
    wake_poke(l->efd);
}

void listener_stop(Listener *l)
{
    if (!l)
        return;
    atomic_store(&l->stopping, true);
    wake_poke(l->efd);
    pthread_join(l->thread, NULL);
    PQfinish(l->conn);
    l->conn = NULL;
    atomic_store(&l->db_ok, false);
}

void listener_free(Listener *l)
{
    if (!l)
        return;
    wake_close(l->efd); /* here, not at the stop: HTTP threads may still wake it */
    json_decref(l->nodes);
    pthread_mutex_destroy(&l->nodes_lock);
    free(l);
}
