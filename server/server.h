/* server: the context every part of workd-server shares, built by main(). */
#ifndef WORKD_SERVER_H
#define WORKD_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "manager.h"

typedef struct ServerConfig {
    char *listen;        /* HOST:PORT */
    char *advertise_url; /* how other nodes reach this one */
    char *database_url;
    char *roles; /* "frontend,manager" */
    char *node_id;
    char *log_level, *log_format;
    bool role_frontend, role_manager;
    int64_t http_threads;
    int64_t max_connections;
    int64_t max_body;  /* bytes */
    int64_t max_batch; /* items per POST /work */
    int64_t max_json_depth;
    int64_t connection_timeout_ms;
    int64_t request_timeout_ms; /* to receive a request (slow clients are cut off) */
    int64_t election_interval_ms;
    int64_t heartbeat_interval_ms;
    int64_t worker_timeout_ms;
    int64_t lease_grace_ms;
    int64_t max_open;
    int64_t retain_ms; /* finished work and events are kept this long */
    int64_t backoff_base_ms, backoff_max_ms;
    int64_t pull_wait_max_ms;
    int64_t get_wait_max_ms;
    int64_t proxy_deadline_ms;
    int64_t sse_keepalive_ms;
    int64_t sse_max_subscribers;
    int64_t sse_buffer_bytes;   /* unsent bytes per result stream; page size of result reads */
    int64_t results_ring_bytes; /* finished events kept in memory for result streams */
    int64_t max_workers;        /* registered workers at most (429 past it) */
    int64_t max_reply_bytes;    /* largest pull answer, and forwarded reply */
    int64_t default_timeout_ms;
    int64_t default_max_attempts;
    int64_t db_pool_size;
    int64_t progress_rate;      /* progress updates per second per attempt */
    int64_t progress_max_bytes; /* progress messages and output per attempt */
    int64_t webhook_timeout_ms, webhook_backoff_base_ms, webhook_backoff_max_ms;
    int64_t webhook_pause_after_ms;
    char *tokens;         /* "scopes:token ..." (WORKD_TOKENS) */
    char *tokens_file;    /* one "scopes:token" per line */
    char *cluster_secret; /* shared by the nodes: proves a forwarded request ("": none) */
} ServerConfig;

/* What this node knows of the leader, kept by the listener; read by anyone. */
typedef struct LeaderInfo {
    pthread_mutex_t lock;
    char url[256];
    int64_t term;
    atomic_bool suspect; /* a forward failed: re-read soon */
} LeaderInfo;

struct Hub;
struct Listener;
struct Proxy;
struct DbPool;
struct Metrics;
struct MHD_Daemon;
struct Auth;
struct DbWatch;

typedef struct Server {
    ServerConfig cfg;
    Manager *mgr; /* NULL without the manager role */
    struct Hub *hub;
    struct Listener *listener;
    struct Proxy *proxy;
    struct DbPool *pool;
    struct Metrics *metrics;
    struct MHD_Daemon *mhd;
    struct Auth *auth;       /* bearer tokens; none configured: the API is open */
    struct DbWatch *dbwatch; /* what the database offers a 202 (dbwatch.h) */
    LeaderInfo leader;
    /* Connections still receiving their first request, for the slow-client
     * sweep (http_sweep); guarded by conns_lock. */
    pthread_mutex_t conns_lock;
    struct ConnTrack *conns;
    atomic_bool db_ok; /* the listener's session is up */
    /* Finished-work counts are a scan of the history: computed at most every
     * few seconds, whoever asks (read-pool threads). */
    pthread_mutex_t stats_lock;
    json_t *finished_counts;
    int64_t finished_counts_ms;
    int64_t started_ms;
} Server;

/* Copies the leader URL into out ("" if unknown); returns the term. */
int64_t server_leader(Server *s, char *out, size_t outlen);

#endif
