/* listener: see listener.h. */
#include "listener.h"

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "db.h"
#include "http.h"
#include "journal.h"
#include "log.h"
#include "sse.h"
#include "util.h"

#define PAGE 1000
#define NODE_EVERY_MS 3000

struct Listener {
    Server *srv;
    pthread_t thread;
    atomic_bool stopping;
    int efd;
    PGconn *conn;
    bool down_logged;
    int64_t next_node_ms;
    pthread_mutex_t nodes_lock;
    json_t *nodes;
};

static void drop(Listener *l, const char *why)
{
    if (l->conn && !l->down_logged)
        log_warn("listener lost its database session: %s", why);
    l->down_logged = true;
    PQfinish(l->conn);
    l->conn = NULL;
    atomic_store(&l->srv->db_ok, false);
}

static int refresh_leader(Listener *l)
{
    Err err = {0};
    char url[256];
    int64_t term;
    if (journal_leader(l->conn, &term, url, sizeof url, &err) != 0) {
        drop(l, err.msg);
        return -1;
    }
    Server *s = l->srv;
    pthread_mutex_lock(&s->leader.lock);
    bool changed = term != s->leader.term || strcmp(url, s->leader.url) != 0;
    snprintf(s->leader.url, sizeof s->leader.url, "%s", url);
    s->leader.term = term;
    pthread_mutex_unlock(&s->leader.lock);
    atomic_store(&s->leader.suspect, false);
    if (changed && term)
        log_info("leader is %s (term %lld)", url, (long long)term);
    return 0;
}

/* Reads finished events past what the hub has, up to `notified` (a seq known
 * to be committed before this read started). */
static int pump(Listener *l, int64_t notified)
{
    if (hub_claimed(l->srv->hub, notified))
        return 0; /* read, or this node's own commit, published by its manager */
    for (;;) {
        json_t *rows = json_array();
        Err err = {0};
        bool at_end = false;
        int n =
            journal_finished_after(l->conn, hub_scanned_upto(l->srv->hub), PAGE,
                                   l->srv->cfg.sse_buffer_bytes, true, NULL, rows, &at_end, &err);
        if (n < 0) {
            json_decref(rows);
            drop(l, err.msg);
            return -1;
        }
        size_t i;
        json_t *ev;
        json_array_foreach(rows, i, ev)
        {
            hub_publish(l->srv->hub, ev);
        }
        json_decref(rows);
        if (at_end) {
            hub_scanned(l->srv->hub, notified);
            return 0;
        }
    }
}

static int connect_listen(Listener *l)
{
    Err err = {0};
    l->conn = db_connect(l->srv->cfg.database_url, "listener", &err);
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
    int64_t last = 0;
    if (journal_last_seq(l->conn, &last, &err) != 0) {
        drop(l, err.msg);
        return -1;
    }
    /* After a failover the log must go on from where it was: with synchronous
     * replication the new primary has every event this node saw committed. */
    int64_t seen = hub_scanned_upto(l->srv->hub);
    if (last < seen)
        log_error("the event log on this database server ends at seq %lld, but this node already "
                  "saw seq %lld: committed events were lost (a failover to a standby that was not "
                  "synchronous?); results after seq %lld may be missing from streams",
                  (long long)last, (long long)seen, (long long)last);
    if (refresh_leader(l) != 0 || pump(l, last) != 0)
        return -1;
    atomic_store(&l->srv->db_ok, true);
    return 0;
}

static void announce(Listener *l)
{
    Server *s = l->srv;
    Err err = {0};
    char started[40];
    time_format(s->started_ms, started, sizeof started);
    const char *params[] = {s->cfg.node_id, s->cfg.advertise_url, s->cfg.roles, started};
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
    int64_t due = hub_next_deadline(l->srv->hub) - mono_ms();
    return (int)(due < 0 ? 0 : due < most ? due : most);
}

static void *listener_main(void *arg)
{
    Listener *l = arg;
    int64_t backoff = 50;
    while (!atomic_load(&l->stopping)) {
        hub_tick(l->srv->hub, mono_ms());
        http_sweep(l->srv, mono_ms());
        if (!l->conn) {
            if (connect_listen(l) != 0) {
                struct pollfd pfd = {.fd = l->efd, .events = POLLIN};
                if (poll(&pfd, 1, tick_in(l, backoff)) > 0) {
                    uint64_t v;
                    ssize_t rd = read(l->efd, &v, sizeof v);
                    (void)rd;
                    continue; /* woken for a timer: the backoff is not over */
                }
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
        bool suspect = atomic_load(&l->srv->leader.suspect);
        struct pollfd pfd[2] = {{.fd = l->efd, .events = POLLIN},
                                {.fd = PQsocket(l->conn), .events = POLLIN}};
        poll(pfd, 2, tick_in(l, suspect ? 100 : 1000));
        if (pfd[0].revents) {
            uint64_t v;
            ssize_t rd = read(l->efd, &v, sizeof v);
            (void)rd;
        }
        /* Notifications that arrive while a pump's queries run wait inside
         * libpq, not on the socket: read them again until none is left. */
        for (bool first = true;; first = false) {
            if (!PQconsumeInput(l->conn) || PQstatus(l->conn) != CONNECTION_OK) {
                drop(l, PQerrorMessage(l->conn));
                break;
            }
            int64_t notified = -1;
            bool leader_changed = false;
            PGnotify *n;
            while ((n = PQnotifies(l->conn))) {
                if (!strcmp(n->relname, "workd_events")) {
                    int64_t seq = strtoll(n->extra, NULL, 10);
                    if (seq > notified)
                        notified = seq;
                } else {
                    leader_changed = true;
                }
                PQfreemem(n);
            }
            if (((leader_changed || (first && suspect)) && refresh_leader(l) != 0) || notified < 0)
                break;
            if (pump(l, notified) != 0)
                break;
        }
    }
    return NULL;
}

Listener *listener_start(Server *s, Err *err)
{
    Listener *l = xcalloc(1, sizeof *l);
    l->srv = s;
    pthread_mutex_init(&l->nodes_lock, NULL);
    l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->efd < 0 || pthread_create(&l->thread, NULL, listener_main, l) != 0) {
        err_set(err, 500, "internal", "cannot start the listener thread");
        if (l->efd >= 0)
            close(l->efd);
        free(l);
        return NULL;
    }
    return l;
}

void listener_wake(Listener *l)
{
    uint64_t one = 1;
    ssize_t w = write(l->efd, &one, sizeof one);
    (void)w;
}

void listener_stop(Listener *l)
{
    if (!l)
        return;
    atomic_store(&l->stopping, true);
    uint64_t one = 1;
    ssize_t w = write(l->efd, &one, sizeof one);
    (void)w;
    pthread_join(l->thread, NULL);
    close(l->efd);
    PQfinish(l->conn);
    json_decref(l->nodes);
    pthread_mutex_destroy(&l->nodes_lock);
    free(l);
}
