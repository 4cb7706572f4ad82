/* workd-server: the front-end and WorkManager roles of workd. main() reads the
 * configuration, applies migrations, starts the parts and waits for a signal. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "auth.h"
#include "config.h"
#include "db.h"
#include "dbpool.h"
#include "dbwatch.h"
#include "http.h"
#include "httpc.h"
#include "view.h"
#include "leaderinfo.h"
#include "listener.h"
#include "log.h"
#include "manager.h"
#include "metrics.h"
#include "migrate.h"
#include "proxy.h"
#include "tz.h"
#include "server.h"
#include "shard.h"
#include "shards.h"
#include "hub.h"
#include "util.h"

#define MS(x) (int64_t)(x)
static ServerConfig C;
static const OptSpec options[] = {
    {"listen", OPT_STRING, &C.listen, "127.0.0.1:8080",
     "address and port to serve HTTP on (HOST:PORT)", 0, 0},
    {"advertise-url", OPT_STRING, &C.advertise_url, "",
     "URL other nodes use to reach this one (default http://LISTEN)", 0, 0},
    {"database-url", OPT_STRING, &C.database_url, "",
     "PostgreSQL connection URL (direct, not through a transaction pooler)", 0, 0},
    {"shard-databases", OPT_STRING, &C.shard_databases, "",
     "shards that keep their rows in a database of their own: SHARD=URL pairs separated by "
     "spaces, the same on every server (docs/operations.md, \"A database per shard\")",
     0, 0},
    {"roles", OPT_STRING, &C.roles, "frontend,manager",
     "roles of this node: frontend (never leads), or frontend,manager (may lead)", 0, 0},
    {"node-id", OPT_STRING, &C.node_id, "",
     "name of this node in logs and /cluster (default: host:port)", 0, 0},
    {"log-level", OPT_STRING, &C.log_level, "info", "debug, info, warn or error", 0, 0},
    {"log-format", OPT_STRING, &C.log_format, "text", "text or json", 0, 0},
    {"http-threads", OPT_INT, &C.http_threads, "2", "HTTP event-loop threads", 1, 64},
    {"max-connections", OPT_INT, &C.max_connections, "10000", "open HTTP connections at most", 16,
     1000000},
    {"max-body", OPT_INT, &C.max_body, "1048576", "largest request body in bytes (413 above)", 1024,
     1LL << 30},
    {"max-batch", OPT_INT, &C.max_batch, "1000",
     "most work items, reports or progress updates in one request", 1, 100000},
    {"max-json-depth", OPT_INT, &C.max_json_depth, "32", "deepest JSON nesting accepted in a body",
     2, 1000},
    {"request-timeout", OPT_DURATION, &C.request_timeout_ms, "30s",
     "time a client has to send a request's headers and body (slow clients are cut off)", 1000,
     MS(3600000)},
    {"connection-timeout", OPT_DURATION, &C.connection_timeout_ms, "30s",
     "idle HTTP connection timeout (slow clients are cut off)", 1000, MS(3600000)},
    {"shards", OPT_INT, &C.shards, "0",
     "shards of the manager, fixed when the database is made (0: as the database says; a new "
     "one has 1)",
     0, SHARDS_MAX},
    {"election-interval", OPT_DURATION, &C.election_interval_ms, "250ms",
     "how often a standby manager tries to become leader", 10, 60000},
    {"heartbeat-interval", OPT_DURATION, &C.heartbeat_interval_ms, "2s",
     "heartbeat interval announced to workers", 100, 600000},
    {"worker-timeout", OPT_DURATION, &C.worker_timeout_ms, "10s",
     "a worker silent this long is gone and its attempts are retried", 500, MS(3600000)},
    {"lease-grace", OPT_DURATION, &C.lease_grace_ms, "10s",
     "an attempt times out at its job timeout plus this", 0, MS(3600000)},
    {"retain", OPT_DURATION, &C.retain_ms, "7d",
     "finished work and its events are kept this long, then dropped a whole part at a time", 1000,
     MS(3650) * 86400000},
    {"max-open", OPT_INT, &C.max_open, "1000000",
     "open (unfinished) work items at most; past it, 429", 1, 100000000},
    {"max-dependencies", OPT_INT, &C.max_edges, "1000000",
     "dependencies (a waiting item's link to an open parent) held at once; past it, 429", 1,
     100000000},
    {"dependency-rate", OPT_INT, &C.edge_rate, "100000",
     "dependencies (links of new waiting work to open parents) made a second at most, in a "
     "bucket of a second's worth; past it, 429 (0: no limit)",
     0, 100000000},
    {"metrics-queues", OPT_INT, &C.metrics_queues, "100",
     "queues with series of their own in /metrics besides those whose flow control was set (the "
     "most open work first); the rest are added up as queue=\"(other)\"",
     0, 100000},
    {"backoff-base", OPT_DURATION, &C.backoff_base_ms, "1s",
     "first retry delay (doubles per attempt, with jitter)", 0, MS(86400000)},
    {"backoff-max", OPT_DURATION, &C.backoff_max_ms, "5m", "longest retry delay", 0, MS(86400000)},
    {"pull-wait-max", OPT_DURATION, &C.pull_wait_max_ms, "30s",
     "longest long-poll of a worker's pull", 0, MS(600000)},
    {"get-wait-max", OPT_DURATION, &C.get_wait_max_ms, "60s", "longest ?wait= of GET /work/{id}", 0,
     MS(600000)},
    {"proxy-deadline", OPT_DURATION, &C.proxy_deadline_ms, "10s",
     "how long a node retries forwarding to the leader before 503", 100, MS(600000)},
    {"sse-keepalive", OPT_DURATION, &C.sse_keepalive_ms, "15s",
     "comment line interval on idle result streams", 100, MS(600000)},
    {"sse-max-subscribers", OPT_INT, &C.sse_max_subscribers, "10000",
     "result streams per node at most", 1, 1000000},
    {"sse-buffer-bytes", OPT_INT, &C.sse_buffer_bytes, "262144",
     "unsent bytes a result stream may hold (at least one event); results are read from the "
     "database in pages of this size",
     4096, 1LL << 30},
    {"results-ring-bytes", OPT_INT, &C.results_ring_bytes, "33554432",
     "bytes of recent results each node keeps in memory for result streams (older ones are "
     "read from the database)",
     65536, 1LL << 40},
    {"max-schedules", OPT_INT, &C.max_schedules, "1000",
     "schedules at most; past it a new schedule gets 409", 1, 1000000},
    {"max-workers", OPT_INT, &C.max_workers, "10000",
     "registered workers at most; past it a new worker id gets 429", 1, 10000000},
    {"max-reply-bytes", OPT_INT, &C.max_reply_bytes, "16777216",
     "largest pull answer (jobs are handed out up to it, at least one) and largest reply a node "
     "forwards from the leader (502 above)",
     65536, 1LL << 40},
    {"default-timeout", OPT_DURATION, &C.default_timeout_ms, "60s",
     "job timeout when a submission gives none", 1, MS(604800000)},
    {"default-max-attempts", OPT_INT, &C.default_max_attempts, "3",
     "attempts when a submission gives none", 1, 1000},
    {"progress-rate", OPT_INT, &C.progress_rate, "10",
     "progress updates an attempt may send a second (429 above; workers merge updates)", 1, 10000},
    {"progress-rate-worker", OPT_INT, &C.progress_rate_worker, "100",
     "progress updates a worker id may send per second over all its attempts", 1, 1000000},
    {"progress-rate-total", OPT_INT, &C.progress_rate_total, "1000",
     "progress updates the cluster records per second over all workers", 1, 10000000},
    {"progress-max-bytes", OPT_INT, &C.progress_max_bytes, "1048576",
     "bytes of progress messages and output an attempt may send in all (413 above)", 1024,
     1LL << 32},
    {"webhook-timeout", OPT_DURATION, &C.webhook_timeout_ms, "10s",
     "time a webhook receiver has to answer one delivery", 100, MS(600000)},
    {"webhook-backoff-base", OPT_DURATION, &C.webhook_backoff_base_ms, "1s",
     "first delay before a failed webhook delivery is retried (doubles, with jitter)", 10,
     MS(3600000)},
    {"webhook-backoff-max", OPT_DURATION, &C.webhook_backoff_max_ms, "5m",
     "longest delay between retries of a webhook delivery", 10, MS(86400000)},
    {"webhook-pause-after", OPT_DURATION, &C.webhook_pause_after_ms, "24h",
     "a webhook subscription whose deliveries fail this long is paused (PUT resumes it)", 1000,
     MS(3650) * 86400000},
    {"webhook-allow-networks", OPT_STRING, &C.webhook_allow_networks, "",
     "networks webhook receivers may be in besides public ones, as CIDRs (e.g. 10.1.0.0/16, "
     "127.0.0.1): loopback, private, link-local and other internal addresses are refused "
     "otherwise",
     0, 0},
    {"db-pool-size", OPT_INT, &C.db_pool_size, "2", "database sessions for reads on this node", 1,
     64},
    {"tokens", OPT_STRING, &C.tokens, "",
     "bearer tokens as SCOPES:TOKEN words (scopes: client, worker, admin; worker[ID,PREFIX*]: "
     "bound to those worker ids); none: the API is open",
     0, 0},
    {"tokens-file", OPT_STRING, &C.tokens_file, "",
     "file with one SCOPES:TOKEN per line ('#' comments)", 0, 0},
    {"cluster-secret", OPT_STRING, &C.cluster_secret, "",
     "the same on every node (16-255 characters, set it through the environment): a node "
     "forwarding a request proves with it that it is one of the cluster",
     0, 0},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] =
    "usage: workd-server [serve|migrate] [options]\n\n"
    "  serve    run a server node (the default): the HTTP API (role frontend)\n"
    "           and a WorkManager candidate (role manager)\n"
    "  migrate  apply database migrations and exit";

WARN_UNUSED static int finish_config(ServerConfig *c, Err *err)
{
    if (!c->database_url[0])
        return err_set(err, 400, "bad-config",
                       "--database-url (WORKD_DATABASE_URL) is required, e.g. "
                       "postgresql://user@127.0.0.1:5432/workd");
    if (stores_parse(&c->stores, c->database_url, c->shard_databases, err) != 0)
        return -1;
    char **roles = strv_split(c->roles);
    c->role_frontend = strv_contains(roles, "frontend");
    c->role_manager = strv_contains(roles, "manager");
    for (size_t i = 0; roles[i]; i++)
        if (strcmp(roles[i], "frontend") && strcmp(roles[i], "manager")) {
            err_set(err, 400, "bad-config", "--roles: unknown role '%s' (frontend, manager)",
                    roles[i]);
            strv_free(roles);
            return -1;
        }
    strv_free(roles);
    if (!c->role_frontend && !c->role_manager)
        return err_set(err, 400, "bad-config", "--roles: give frontend, or frontend,manager");
    /* A node that can lead must answer at its advertise URL: the other nodes
     * forward every leader-only request there. A manager without the HTTP
     * front-end won elections and served nothing (issue 13.10). */
    if (c->role_manager && !c->role_frontend)
        return err_set(err, 400, "bad-config",
                       "--roles: a manager must serve HTTP at its advertise URL, where the other "
                       "nodes forward leader-only requests; run it as frontend,manager (and leave "
                       "it out of the load balancer to keep public traffic off it)");
    if (!strchr(c->listen, ':'))
        return err_set(err, 400, "bad-config", "--listen: '%s' is not HOST:PORT", c->listen);
    if (!c->advertise_url[0]) {
        free(c->advertise_url);
        size_t n = strlen(c->listen) + 16;
        c->advertise_url = xmalloc(n);
        snprintf(c->advertise_url, n, "http://%s", c->listen);
    }
    size_t n = strlen(c->advertise_url);
    if (n && c->advertise_url[n - 1] == '/')
        c->advertise_url[n - 1] = '\0';
    if (strncmp(c->advertise_url, "http://", 7) && strncmp(c->advertise_url, "https://", 8))
        return err_set(err, 400, "bad-config", "--advertise-url: '%s' is not an http(s) URL",
                       c->advertise_url);
    if (!c->node_id[0]) {
        free(c->node_id);
        c->node_id = xstrdup(c->listen);
    }
    if (strcmp(c->log_format, "text") && strcmp(c->log_format, "json"))
        return err_set(err, 400, "bad-config", "--log-format: '%s' is not text or json",
                       c->log_format);
    LogLevel lvl;
    if (log_level_parse(c->log_level, &lvl) != 0)
        return err_set(err, 400, "bad-config",
                       "--log-level: '%s' is not debug, info, warn or error", c->log_level);
    size_t sn = strlen(c->cluster_secret);
    if (sn && (sn < AUTH_SECRET_MIN || sn > AUTH_SECRET_MAX ||
               strcspn(c->cluster_secret, " \t\r\n;,") != sn))
        return err_set(err, 400, "bad-config",
                       "--cluster-secret must be %d to %d characters without spaces, ';' or ','",
                       AUTH_SECRET_MIN, AUTH_SECRET_MAX);
    Err nerr = {0};
    if (netpolicy_parse(c->webhook_allow_networks, &c->webhook_allow, &nerr) != 0)
        return err_set(err, 400, "bad-config", "--webhook-allow-networks: %s", nerr.msg);
    /* Every job fits a pull's answer alone, so none is started that a node
     * forwarding the pull would refuse (502) after the leader started it. */
    if (c->max_reply_bytes < c->max_body + MANAGER_JOB_ENVELOPE)
        return err_set(err, 400, "bad-config",
                       "--max-reply-bytes (%lld) must be at least --max-body (%lld) plus %d, so "
                       "that a pull's answer holds any one job",
                       (long long)c->max_reply_bytes, (long long)c->max_body, MANAGER_JOB_ENVELOPE);
    if (c->backoff_max_ms < c->backoff_base_ms)
        return err_set(err, 400, "bad-config", "--backoff-max must not be below --backoff-base");
    char roles_txt[64];
    snprintf(roles_txt, sizeof roles_txt, "%s%s%s", c->role_frontend ? "frontend" : "",
             c->role_frontend && c->role_manager ? "+" : "", c->role_manager ? "manager" : "");
    log_setup(c->node_id, roles_txt, lvl, !strcmp(c->log_format, "json"));
    return 0;
}

/* The manager's commits go straight to this node's results hub. */
static void on_commit(CommitStage stage, int shard, const EventList *events, void *ud)
{
    Server *s = ud;
    if (!s->hub)
        return;
    if (stage == COMMIT_BEGIN)
        hub_claim(s->hub, shard, events->items[0].seq, events->items[events->len - 1].seq);
    else if (stage == COMMIT_DONE)
        hub_publish_committed(s->hub, shard, events);
    else
        hub_unclaim(s->hub, shard);
}

/* The database watch as api.c sees it (ApiDbWatch). */
static json_t *dbwatch_json_of(void *w)
{
    return dbwatch_json(w);
}

static bool listener_down_of(void *l, int db)
{
    return listener_db_down(l, db);
}

static bool listener_silent_of(void *l, int db)
{
    return listener_db_silent(l, db);
}

static bool dbwatch_stalled_of(void *w, char *why, size_t whylen)
{
    return dbwatch_stalled(w, why, whylen);
}

/* Applies the migrations, waiting for a database that is not up yet (compose,
 * a restart), and reads the shard count and where each shard's log ends. 0:
 * ready; 1: a signal came meanwhile; -1: logged. */
static int prepare_database(Server *s, const sigset_t *sigs, Cursor *last)
{
    Err err = {0};
    int applied;
    int64_t backoff = 200;
    while (stores_prepare(&s->cfg.stores, (int)s->cfg.shards, &applied, &err) != 0) {
        if (err.status != 503) {
            log_error("%s: %s",
                      !strcmp(err.type, "shards-fixed")     ? "the shard count"
                      : !strcmp(err.type, "shard-database") ? "the shard databases"
                                                            : "migrations failed",
                      err.msg);
            return -1;
        }
        log_warn("waiting for the database: %s", err.msg);
        struct timespec ts = {.tv_sec = backoff / 1000, .tv_nsec = (backoff % 1000) * 1000000};
        siginfo_t si;
        if (sigtimedwait(sigs, &si, &ts) > 0)
            return 1;
        backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
    }
    s->shards = s->cfg.stores.shards;
    int rc = 0;
    cursor_zero(last, s->shards);
    for (int k = 0; rc == 0 && k < s->shards; k++) {
        PGconn *c = db_connect(stores_url(&s->cfg.stores, k), "start", &err);
        rc = c && view_last_seq(c, k, &last->seq[k], &err) == 0 ? 0 : -1;
        PQfinish(c);
    }
    if (rc != 0)
        log_error("cannot read the event log: %s", err.msg);
    return rc;
}

/* The tokens, and what the log should say of them. -1: logged. */
static int load_auth(Server *s)
{
    Err err = {0};
    s->auth = auth_load(s->cfg.tokens, s->cfg.tokens_file, &err);
    if (!s->auth) {
        log_error("%s", err.msg);
        return -1;
    }
    if (!auth_enabled(s->auth) && s->cfg.role_frontend)
        log_warn("AUTHENTICATION IS OFF: no token is configured (--tokens, --tokens-file), so "
                 "anyone who can reach %s can submit, run and cancel work",
                 s->cfg.listen);
    else if (s->cfg.role_frontend)
        log_info("authentication on: %zu token(s) configured", auth_count(s->auth));
    if (!s->cfg.cluster_secret[0] && s->cfg.role_frontend)
        log_warn("no cluster secret (--cluster-secret, WORKD_CLUSTER_SECRET): requests forwarded "
                 "to the leader get no more than --max-body, like any client's");
    return 0;
}

/* The manager role, after the hub (the manager publishes its commits there). */
WARN_UNUSED static int start_manager(Server *s, Err *err)
{
    ManagerConfig mc = {
        .database_url = s->cfg.database_url,
        .stores = &s->cfg.stores,
        .advertise_url = s->cfg.advertise_url,
        .election_interval_ms = s->cfg.election_interval_ms,
        .heartbeat_interval_ms = s->cfg.heartbeat_interval_ms,
        .pull_wait_max_ms = s->cfg.pull_wait_max_ms,
        .max_workers = s->cfg.max_workers,
        .max_reply_bytes = s->cfg.max_reply_bytes,
        .max_payload_bytes = s->cfg.max_body,
        .max_json_depth = (int)s->cfg.max_json_depth,
        .max_schedules = s->cfg.max_schedules,
        .ws = {.max_open = s->cfg.max_open,
               .max_edges = s->cfg.max_edges,
               .edge_rate = s->cfg.edge_rate,
               .lease_grace_ms = s->cfg.lease_grace_ms,
               .backoff_base_ms = s->cfg.backoff_base_ms,
               .backoff_max_ms = s->cfg.backoff_max_ms,
               .worker_timeout_ms = s->cfg.worker_timeout_ms,
               /* A worker lists a job from the moment its pull's answer is
                * read: one heartbeat interval covers an answer on its way. */
               .unclaimed_grace_ms = s->cfg.heartbeat_interval_ms},
        .retain_ms = s->cfg.retain_ms,
        .default_timeout_ms = s->cfg.default_timeout_ms,
        .default_max_attempts = (int)s->cfg.default_max_attempts,
        .progress = {.rate = (int)s->cfg.progress_rate,
                     .max_bytes = s->cfg.progress_max_bytes,
                     .worker_rate = (int)s->cfg.progress_rate_worker,
                     .total_rate = (int)s->cfg.progress_rate_total},
        .webhook_timeout_ms = s->cfg.webhook_timeout_ms,
        .webhook_backoff_base_ms = s->cfg.webhook_backoff_base_ms,
        .webhook_backoff_max_ms = s->cfg.webhook_backoff_max_ms,
        .webhook_pause_after_ms = s->cfg.webhook_pause_after_ms,
        .webhook_allow = &s->cfg.webhook_allow,
        .on_commit = on_commit,
        .on_commit_ud = s,
    };
    return (s->mgrs = shards_start(&mc, s->shards, err)) ? 0 : -1;
}

/* The proxy, the listener, the API and (with the frontend role) HTTP. */
WARN_UNUSED static int start_front(Server *s, int64_t started_ms, Err *err)
{
    ProxyConfig pc = {.leader = s->leader,
                      .metrics = s->metrics,
                      .deadline_ms = s->cfg.proxy_deadline_ms,
                      .pull_wait_max_ms = s->cfg.pull_wait_max_ms,
                      .max_reply_bytes = s->cfg.max_reply_bytes,
                      .cluster_secret = s->cfg.cluster_secret,
                      .node_id = s->cfg.node_id};
    ListenerConfig lc = {.stores = &s->cfg.stores,
                         .node_id = s->cfg.node_id,
                         .advertise_url = s->cfg.advertise_url,
                         .roles = s->cfg.roles,
                         .started_ms = started_ms,
                         .page_bytes = s->cfg.sse_buffer_bytes,
                         .hub = s->hub,
                         .leader = s->leader,
                         .http = s->http};
    if (!(s->proxy = proxy_start(&pc, err)) || !(s->listener = listener_start(&lc, err)))
        return -1;
    dbpool_watch(s->pool, listener_down_of, listener_silent_of, s->listener);
    ApiConfig ac = {.node_id = s->cfg.node_id,
                    .cluster_secret = s->cfg.cluster_secret,
                    .max_body = s->cfg.max_body,
                    .max_batch = s->cfg.max_batch,
                    .max_json_depth = s->cfg.max_json_depth,
                    .get_wait_max_ms = s->cfg.get_wait_max_ms,
                    .default_timeout_ms = s->cfg.default_timeout_ms,
                    .default_max_attempts = s->cfg.default_max_attempts,
                    .webhook_allow = &s->cfg.webhook_allow};
    ApiParts ap = {.mgrs = s->mgrs,
                   .hub = s->hub,
                   .listener = s->listener,
                   .proxy = s->proxy,
                   .pool = s->pool,
                   .metrics = s->metrics,
                   .auth = s->auth,
                   .leader = s->leader,
                   .dbwatch = {s->dbwatch, dbwatch_json_of, dbwatch_stalled_of}};
    s->api = api_new(&ac, &ap);
    HttpApp app = api_http(s->api);
    return s->cfg.role_frontend ? http_start(s->http, &app, err) : 0;
}

/* Answers everything in flight, then stops serving, then frees. */
static void stop_all(Server *s)
{
    shards_stop(s->mgrs);
    if (s->hub)
        hub_shutdown(s->hub);
    proxy_stop(s->proxy);
    listener_stop(s->listener);
    dbpool_stop(s->pool);
    http_stop(s->http);
    dbwatch_stop(s->dbwatch);
    shards_free(s->mgrs);
    proxy_free(s->proxy);
    listener_free(s->listener);
    dbpool_free(s->pool);
    hub_free(s->hub);
    free(s->metrics);
    auth_free(s->auth);
    http_free(s->http);
    api_free(s->api);
    leaderinfo_free(s->leader);
}

static int serve(Server *s)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    Cursor last_seq = {.n = 1};
    int ready = prepare_database(s, &sigs, &last_seq);
    if (ready != 0)
        return ready > 0 ? 0 : 1;
    if (load_auth(s) != 0)
        return 2;
    s->metrics = xcalloc(1, sizeof *s->metrics);
    metrics_init(s->metrics);
    s->metrics->queues_top = s->cfg.metrics_queues;
    int64_t started_ms = wall_ms();
    s->leader = leaderinfo_new(s->shards);
    HttpConfig hc = {.listen = s->cfg.listen,
                     .threads = s->cfg.http_threads,
                     .max_connections = s->cfg.max_connections,
                     .connection_timeout_ms = s->cfg.connection_timeout_ms,
                     .request_timeout_ms = s->cfg.request_timeout_ms,
                     .max_body = s->cfg.max_body};
    s->http = http_new(&hc);
    Err err = {0};
    int rc = 1;
    if (!(s->pool = dbpool_start(&s->cfg.stores, (int)s->cfg.db_pool_size, &err)) ||
        !(s->dbwatch = dbwatch_start(&s->cfg.stores, &err)))
        goto cleanup;
    s->hub = hub_new(s->pool, s->metrics, s->cfg.sse_keepalive_ms, s->cfg.sse_max_subscribers,
                     s->cfg.results_ring_bytes, s->cfg.sse_buffer_bytes, &last_seq);
    if ((s->cfg.role_manager && start_manager(s, &err) != 0) ||
        start_front(s, started_ms, &err) != 0)
        goto cleanup;
    log_info("workd-server listening on %s (advertised as %s)", s->cfg.listen,
             s->cfg.advertise_url);
    siginfo_t si;
    while (sigwaitinfo(&sigs, &si) < 0 && errno == EINTR) {
    }
    log_info("received %s: stopping", strsignal(si.si_signo));
    rc = 0;
cleanup:
    if (rc)
        log_error("cannot start: %s", err.msg);
    stop_all(s);
    return rc;
}

#ifdef WORKD_JEMALLOC
extern const char *malloc_conf;
const char *malloc_conf = WORKD_MALLOC_CONF; /* read by jemalloc at its start */
#endif

int main(int argc, char **argv)
{
    int first = 1;
    const char *cmd = "serve";
    if (argc > 1 && argv[1][0] != '-') {
        cmd = argv[1];
        first = 2;
    }
    if (strcmp(cmd, "serve") && strcmp(cmd, "migrate")) {
        fprintf(stderr, "workd-server: unknown command '%s'\n\n%s\n", cmd, synopsis);
        return 2;
    }
    int cli = config_cli(options, NOPT, argc, argv, first, "workd-server", synopsis);
    if (cli != 0) {
        config_free(options, NOPT);
        return cli > 0 ? 0 : 2;
    }
    Err err = {0};
    if (finish_config(&C, &err) != 0) {
        fprintf(stderr, "workd-server: %s\n", err.msg);
        stores_free(&C.stores);
        config_free(options, NOPT);
        return 2;
    }
    httpc_global_init();
    int rc;
    if (!strcmp(cmd, "migrate")) {
        int applied;
        rc = stores_prepare(&C.stores, (int)C.shards, &applied, &err) == 0 ? 0 : 1;
        if (rc)
            log_error("migrations failed: %s", err.msg);
        else
            log_info("database is at the latest schema (%d migration(s) applied now), with %d "
                     "shard(s) in %d database(s)",
                     applied, C.stores.shards, C.stores.n);
    } else {
        Server s = {.cfg = C};
        rc = serve(&s);
    }
    httpc_global_cleanup();
    tz_cache_free(); /* the zones schedules loaded; nothing uses them after serve() */
    stores_free(&C.stores);
    config_free(options, NOPT);
    return rc;
}
