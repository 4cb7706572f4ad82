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
/* A session being opened is given up after this long (db_connect's
 * connect_timeout, which libpq does not keep for a session opened without
 * blocking): a host that does not answer costs a retry, not the thread. */
#define OPEN_MS 5000
/* A session that waits for notifications hears nothing of a server that is
 * frozen (its kernel still acknowledges TCP): each is probed (SELECT 1,
 * sent without waiting) every PROBE_EVERY_MS, and dropped when a probe, or
 * any statement (db_set_deadline), is not answered within PROBE_MS. So a
 * frozen database shows as down within PROBE_EVERY_MS + PROBE_MS, and
 * holds this thread, which serves every database, for at most PROBE_MS
 * once; a probe unanswered for SILENT_MS already says that it is silent
 * (listener_db_silent), so that reads waiting there give up (dbpool). */
#define SILENT_MS 500
#define ANNOUNCE_MS 10000 /* this node's row: a write (announce) */
#define PROBE_EVERY_MS 250
#define PROBE_MS 1000

/* The session to one database, and when to try it again. */
typedef struct ListenDb {
    PGconn *conn;
    /* a session being opened (db_connect_start): what its socket waits
     * for, and when to give up */
    PGconn *opening;
    bool opening_write;
    int64_t opening_until;
    bool down_logged;
    int64_t retry_ms, backoff_ms;
    _Atomic int64_t probe_sent; /* mono ms: the probe in flight (0: none; written by the thread) */
    _Atomic int64_t unanswered; /* mono ms: when the thread last read its socket and found
                                   the probe still unanswered (0: never, this probe) */
    int64_t next_probe;         /* mono ms */
    uint64_t shards;            /* the shards it keeps (a bit per shard) */
    atomic_bool ok;             /* the session is up (written by the thread only) */
    atomic_bool down;           /* the last try to open it failed, or it dropped (ditto) */
} ListenDb;

struct Listener {
    ListenerConfig cfg; /* strings borrowed from the caller */
    pthread_t thread;
    atomic_bool stopping;
    int efd;
    int n;                   /* databases */
    ListenDb db[SHARDS_MAX]; /* by database; db 0 is home (workd_nodes) */
    int64_t next_node_ms;
    pthread_mutex_t nodes_lock;
    json_t *nodes;
};

/* "the database", or "the database of shard N" (its first), for logs. */
static const char *db_name(const Listener *l, int d, char *buf, size_t len)
{
    int first = 0;
    for (int k = SHARDS_MAX - 1; k > 0 && d; k--)
        if (l->db[d].shards >> k & 1)
            first = k;
    if (d)
        snprintf(buf, len, "the database of shard %d", first);
    else
        snprintf(buf, len, "the database");
    return buf;
}

static void drop(Listener *l, int d, const char *why)
{
    ListenDb *b = &l->db[d];
    char name[48];
    if (b->conn && !b->down_logged)
        log_warn("listener lost its session to %s: %s", db_name(l, d, name, sizeof name), why);
    b->down_logged = true;
    PQfinish(b->conn);
    b->conn = NULL;
    b->probe_sent = 0;
    b->unanswered = 0;
    atomic_store(&b->ok, false);
    atomic_store(&b->down, true);
}

/* Reads what the probe in flight on database d's session got, waiting at
 * most until its deadline (wait: else not at all); a probe not answered by
 * then drops the session. 0: no probe in flight any more; 1: it still is
 * (not waiting); -1: the session was dropped. */
static int probe_settle(Listener *l, int d, bool wait)
{
    ListenDb *b = &l->db[d];
    while (b->conn && b->probe_sent) {
        if (!PQconsumeInput(b->conn)) {
            drop(l, d, PQerrorMessage(b->conn));
            return -1;
        }
        if (!PQisBusy(b->conn)) {
            PGresult *r;
            while ((r = PQgetResult(b->conn)))
                PQclear(r);
            b->probe_sent = 0;
            b->unanswered = 0;
            b->next_probe = mono_ms() + PROBE_EVERY_MS;
            return 0;
        }
        b->unanswered = mono_ms();
        int64_t left = b->probe_sent + PROBE_MS - mono_ms();
        if (left <= 0) {
            char why[80];
            snprintf(why, sizeof why, "no answer to a probe within %d ms", PROBE_MS);
            drop(l, d, why);
            return -1;
        }
        if (!wait)
            return 1;
        struct pollfd pfd = {.fd = PQsocket(b->conn), .events = POLLIN};
        poll(&pfd, 1, (int)left);
    }
    return b->conn ? 0 : -1;
}

/* Sends database d's probe when it is due (probe_settle reads it). */
static void probe(Listener *l, int d, int64_t now)
{
    ListenDb *b = &l->db[d];
    if (!b->conn || b->probe_sent || now < b->next_probe)
        return;
    if (!PQsendQuery(b->conn, "SELECT 1")) {
        drop(l, d, PQerrorMessage(b->conn));
        return;
    }
    b->probe_sent = now;
}

/* The session of the database that keeps shard k, ready for a statement
 * (NULL: down). */
static PGconn *shard_conn(Listener *l, int k)
{
    int d = l->cfg.stores->of[k];
    return probe_settle(l, d, true) == 0 ? l->db[d].conn : NULL;
}

/* Re-reads the leader of every shard in `which` (a bit per shard) whose
 * database's session is up; a session that fails is dropped. */
WARN_UNUSED static int refresh_leader(Listener *l, uint64_t which)
{
    int n = leaderinfo_shards(l->cfg.leader), rc = 0;
    for (int k = 0; k < n; k++) {
        if (!(which >> k & 1) || !shard_conn(l, k))
            continue;
        Err err = {0};
        char url[256];
        int64_t term;
        if (view_leader(shard_conn(l, k), k, &term, url, sizeof url, &err) != 0) {
            drop(l, l->cfg.stores->of[k], err.msg);
            rc = -1;
            continue;
        }
        if (leaderinfo_set(l->cfg.leader, k, url, term) && term) {
            if (n == 1)
                log_info("leader is %s (term %lld)", url, (long long)term);
            else
                log_info("leader of shard %d is %s (term %lld)", k, url, (long long)term);
        }
    }
    return rc;
}

/* Reads shard k's finished events past what the hub has, up to `notified` (a
 * seq of shard k known to be committed before this read started), from its
 * database. */
WARN_UNUSED static int pump(Listener *l, int k, int64_t notified)
{
    if (hub_claimed(l->cfg.hub, k, notified))
        return 0; /* read, or this node's own commit, published by its manager */
    for (;;) {
        ResultList rows = {0};
        Err err = {0};
        bool at_end = false;
        int n = view_finished_after(shard_conn(l, k), k, hub_scanned_upto(l->cfg.hub, k), PAGE,
                                    l->cfg.page_bytes, true, NULL, &rows, &at_end, &err);
        if (n < 0) {
            view_results_clear(&rows);
            drop(l, l->cfg.stores->of[k], err.msg);
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

/* A try to open database d's session failed (why): the next one after a
 * wait, doubled each time up to 250 ms. */
static void open_failed(Listener *l, int d, const char *why)
{
    ListenDb *b = &l->db[d];
    char name[48];
    if (!b->down_logged)
        log_warn("listener cannot reach %s, retrying: %s", db_name(l, d, name, sizeof name), why);
    b->down_logged = true;
    atomic_store(&b->down, true);
    PQfinish(b->opening);
    b->opening = NULL;
    b->retry_ms = mono_ms() + b->backoff_ms;
    /* Capped as low as the managers' election interval: after a failover
     * this node's streams, and its forwards to the leader (the leader's URL
     * comes from here), wait for this reconnect. */
    b->backoff_ms = b->backoff_ms * 2 > 250 ? 250 : b->backoff_ms * 2;
}

/* Begins opening database d's session (without blocking). */
static void open_start(Listener *l, int d)
{
    ListenDb *b = &l->db[d];
    Err err = {0};
    if (!(b->opening = db_connect_start(l->cfg.stores->url[d], "listener", &err))) {
        open_failed(l, d, err.msg);
        return;
    }
    b->opening_write = true;
    b->opening_until = mono_ms() + OPEN_MS;
}

/* On database d's session, newly opened: LISTENs, and reads what its shards
 * committed while it was down, each from where the hub is. */
WARN_UNUSED static int connect_listen(Listener *l, int d)
{
    ListenDb *b = &l->db[d];
    Err err = {0};
    char name[48];
    db_name(l, d, name, sizeof name);
    /* Its reads are the same few statements all the time: plan them once
     * (db_exec_cached), whatever their parameters. */
    PGresult *r = db_exec(b->conn, "SET plan_cache_mode = force_generic_plan", 0, NULL,
                          "configuring the listener's session", &err);
    PQclear(r);
    if (r)
        r = db_exec(b->conn, "LISTEN workd_events", 0, NULL, "LISTEN", &err);
    PQclear(r);
    if (r)
        r = db_exec(b->conn, "LISTEN workd_leader", 0, NULL, "LISTEN", &err);
    PQclear(r);
    if (!r) {
        drop(l, d, err.msg);
        return -1;
    }
    if (b->down_logged)
        log_info("listener reached %s again", name);
    b->down_logged = false;
    if (refresh_leader(l, b->shards) != 0)
        return -1;
    for (int k = 0; k < hub_shards(l->cfg.hub); k++) {
        if (!(b->shards >> k & 1))
            continue;
        int64_t last = 0;
        if (view_last_seq(b->conn, k, &last, &err) != 0) {
            drop(l, d, err.msg);
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
    atomic_store(&b->ok, true);
    atomic_store(&b->down, false);
    return 0;
}

/* This node's row in workd_nodes, and the live nodes: the home database's. */
static void announce(Listener *l)
{
    if (probe_settle(l, 0, true) != 0)
        return;
    PGconn *home = l->db[0].conn;
    Err err = {0};
    char started[40];
    time_format(l->cfg.started_ms, started, sizeof started);
    const char *params[] = {l->cfg.node_id, l->cfg.advertise_url, l->cfg.roles, started};
    /* The one write of the listener: its commit waits for a synchronous
     * standby, and a stall of those is dbwatch's to report (after 5 s), not
     * a database that does not answer. */
    int was = db_deadline_swap(home, ANNOUNCE_MS);
    PGresult *r = db_exec(home,
                          "INSERT INTO workd_nodes (id, url, roles, started_at, last_seen)"
                          " VALUES ($1, $2, $3, $4::timestamptz, now())"
                          " ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url,"
                          " roles = EXCLUDED.roles, started_at = EXCLUDED.started_at,"
                          " last_seen = now()",
                          4, params, "announcing this node", &err);
    db_deadline_swap(home, was);
    if (!r) {
        drop(l, 0, err.msg);
        return;
    }
    PQclear(r);
    r = db_exec(home,
                "SELECT id, url, roles, (extract(epoch from last_seen) * 1000)::bigint"
                " FROM workd_nodes WHERE last_seen > now() - interval '30 seconds' ORDER BY id",
                0, NULL, "listing nodes", &err);
    if (!r) {
        drop(l, 0, err.msg);
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

/* Reads database d's notifications and what they announce. */
static void take_notifications(Listener *l, int d, bool suspect)
{
    ListenDb *b = &l->db[d];
    /* Notifications that arrive while a pump's queries run wait inside
     * libpq, not on the socket: read them again until none is left. */
    for (bool first = true;; first = false) {
        if (probe_settle(l, d, false) != 0) /* dropped, or answered later: then read */
            return;
        if (!PQconsumeInput(b->conn) || PQstatus(b->conn) != CONNECTION_OK) {
            drop(l, d, PQerrorMessage(b->conn));
            return;
        }
        int shards = hub_shards(l->cfg.hub);
        int64_t notified[SHARDS_MAX];
        bool any = false;
        uint64_t leaders = first && suspect ? b->shards : 0;
        for (int k = 0; k < shards; k++)
            notified[k] = -1;
        PGnotify *n;
        while ((n = PQnotifies(b->conn))) {
            int k;
            int64_t v;
            bool events = !strcmp(n->relname, "workd_events");
            if (!view_notify_parse(n->extra, shards, &k, &v) || !(b->shards >> k & 1)) {
                /* Not a shard this database keeps (the cluster cannot grow,
                 * nor a shard move, under a running node): events are left
                 * to the next notification, the leaders all read again. */
                char name[48];
                log_warn("listener: notification '%s' on %s names no shard %s keeps", n->extra,
                         n->relname, db_name(l, d, name, sizeof name));
                if (!events)
                    leaders = b->shards;
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
            return;
        for (int k = 0; k < shards; k++)
            if (notified[k] >= 0 && pump(l, k, notified[k]) != 0)
                return;
    }
}

/* Goes on opening database d's session (ready: its socket is), and once it
 * is open, LISTENs and catches up (connect_listen). */
static void open_step(Listener *l, int d, bool ready)
{
    ListenDb *b = &l->db[d];
    Err err = {0};
    int rc = 0;
    if (ready && (rc = db_connect_step(b->opening, "listener", &b->opening_write, &err)) < 0) {
        open_failed(l, d, err.msg);
        return;
    }
    if (rc == 0) {
        if (mono_ms() >= b->opening_until)
            open_failed(l, d, "no answer within 5 s");
        return;
    }
    b->conn = b->opening;
    b->opening = NULL;
    db_set_deadline(b->conn, PROBE_MS);
    b->next_probe = mono_ms() + PROBE_EVERY_MS;
    if (connect_listen(l, d) == 0) {
        b->backoff_ms = 50;
        return;
    }
    /* (connect_listen dropped the session) */
    open_failed(l, d, "the new session failed");
}

static void *listener_main(void *arg)
{
    Listener *l = arg;
    while (!atomic_load(&l->stopping)) {
        hub_tick(l->cfg.hub, mono_ms());
        if (l->cfg.http)
            http_sweep(l->cfg.http, mono_ms());
        for (int d = 0; d < l->n; d++)
            if (!l->db[d].conn && !l->db[d].opening && mono_ms() >= l->db[d].retry_ms)
                open_start(l, d);
        if (l->db[0].conn && mono_ms() >= l->next_node_ms) {
            announce(l);
            l->next_node_ms = mono_ms() + NODE_EVERY_MS;
        }
        for (int d = 0; d < l->n; d++)
            probe(l, d, mono_ms());
        bool suspect = leaderinfo_suspect(l->cfg.leader);
        int64_t most = suspect ? 100 : 1000, now = mono_ms();
        struct pollfd pfd[1 + SHARDS_MAX] = {{.fd = l->efd, .events = POLLIN}};
        int of[1 + SHARDS_MAX], np = 1;
        for (int d = 0; d < l->n; d++) {
            ListenDb *b = &l->db[d];
            PGconn *c = b->conn ? b->conn : b->opening;
            if (!c) { /* until its next try */
                int64_t due = b->retry_ms - now;
                most = due < 0 ? 0 : due < most ? due : most;
                continue;
            }
            if (b->opening) {
                int64_t due = b->opening_until - now;
                most = due < 0 ? 0 : due < most ? due : most;
            } else {
                /* Looked at again once it would be silent, then at its deadline. */
                int64_t silent = b->probe_sent + SILENT_MS + 10 - now;
                int64_t due = !b->probe_sent ? b->next_probe - now
                              : silent > 0   ? silent
                                             : b->probe_sent + PROBE_MS - now;
                most = due < 0 ? 0 : due < most ? due : most;
            }
            of[np] = d;
            pfd[np++] = (struct pollfd){
                .fd = PQsocket(c), .events = b->opening && b->opening_write ? POLLOUT : POLLIN};
        }
        poll(pfd, (nfds_t)np, tick_in(l, most));
        if (pfd[0].revents)
            wake_drain(l->efd);
        for (int i = 1; i < np; i++) {
            ListenDb *b = &l->db[of[i]];
            if (b->conn)
                take_notifications(l, of[i], suspect);
            else if (b->opening)
                open_step(l, of[i], pfd[i].revents != 0);
        }
    }
    return NULL;
}

Listener *listener_start(const ListenerConfig *cfg, Err *err)
{
    Listener *l = xcalloc(1, sizeof *l);
    l->cfg = *cfg;
    l->n = cfg->stores->n;
    for (int d = 0; d < l->n; d++)
        l->db[d].backoff_ms = 50;
    for (int k = 0; k < hub_shards(cfg->hub); k++)
        l->db[cfg->stores->of[k]].shards |= (uint64_t)1 << k;
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
    for (int d = 0; l && d < l->n; d++)
        if (!atomic_load(&l->db[d].ok))
            return false;
    return l != NULL;
}

bool listener_db_silent(Listener *l, int db)
{
    /* Silent as the thread saw it when it read the socket: not merely
     * unread while the thread served another database. */
    int64_t sent = l && db >= 0 && db < l->n ? atomic_load(&l->db[db].probe_sent) : 0;
    int64_t seen = sent ? atomic_load(&l->db[db].unanswered) : 0;
    return (sent && seen - sent > SILENT_MS) || listener_db_down(l, db);
}

bool listener_db_down(Listener *l, int db)
{
    return l && db >= 0 && db < l->n && atomic_load(&l->db[db].down);
}

bool listener_shard_db_ok(Listener *l, int shard)
{
    return l && atomic_load(&l->db[l->cfg.stores->of[shard]].ok);
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
    for (int d = 0; d < l->n; d++) {
        PQfinish(l->db[d].conn);
        PQfinish(l->db[d].opening);
        l->db[d].conn = l->db[d].opening = NULL;
        atomic_store(&l->db[d].ok, false);
    }
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
