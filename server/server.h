/* server: the context every part of workd-server shares, built by main(). */
#ifndef WORKD_SERVER_H
#define WORKD_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "manager.h"
#include "stores.h"
#include "netpolicy.h"

typedef struct ServerConfig {
    char *listen;        /* HOST:PORT */
    char *advertise_url; /* how other nodes reach this one */
    char *database_url;
    char *shard_databases; /* "S=URL S=URL": shards with a database of their own */
    Stores stores;         /* ...read by finish_config; shards set by stores_prepare */
    char *roles;           /* "frontend,manager" */
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
    int64_t shards;             /* --shards: 0, as the database says */
    int64_t election_interval_ms;
    int64_t heartbeat_interval_ms;
    int64_t worker_timeout_ms;
    int64_t lease_grace_ms;
    int64_t max_open;
    int64_t max_edges;      /* --max-dependencies */
    int64_t edge_rate;      /* --dependency-rate: links a second */
    int64_t metrics_queues; /* queues labelled in /metrics besides the flow-controlled */
    int64_t retain_ms;      /* finished work and events are kept this long */
    int64_t backoff_base_ms, backoff_max_ms;
    int64_t pull_wait_max_ms;
    int64_t get_wait_max_ms;
    int64_t proxy_deadline_ms;
    int64_t sse_keepalive_ms;
    int64_t sse_max_subscribers;
    int64_t sse_buffer_bytes;   /* unsent bytes per result stream; page size of result reads */
    int64_t results_ring_bytes; /* finished events kept in memory for result streams */
    int64_t max_workers;        /* registered workers at most (429 past it) */
    int64_t max_schedules;
    int64_t max_reply_bytes; /* largest pull answer, and forwarded reply */
    int64_t default_timeout_ms;
    int64_t default_max_attempts;
    int64_t db_pool_size;
    int64_t progress_rate;        /* progress updates per second per attempt */
    int64_t progress_rate_worker; /* ... per worker id, over its attempts */
    int64_t progress_rate_total;  /* ... over the cluster */
    int64_t progress_max_bytes;   /* progress messages and output per attempt */
    int64_t webhook_timeout_ms, webhook_backoff_base_ms, webhook_backoff_max_ms;
    int64_t webhook_pause_after_ms;
    char *webhook_allow_networks; /* as given */
    NetPolicy webhook_allow;      /* ...read by finish_config */
    char *tokens;                 /* "scopes:token ..." (WORKD_TOKENS) */
    char *tokens_file;            /* one "scopes:token" per line */
    char *cluster_secret;         /* shared by the nodes: proves a forwarded request ("": none) */
} ServerConfig;

struct Api;
struct Auth;
struct DbPool;
struct DbWatch;
struct Http;
struct Hub;
struct LeaderInfo;
struct Listener;
struct Metrics;
struct Proxy;

/* The parts of a node, each made and freed by main() and owning its own
 * state; a part is handed only the others it needs (its *_start or *_new
 * config): main() alone sees them all. */
typedef struct Server {
    ServerConfig cfg;
    int shards;            /* the cluster's shard count, as the database says (cfg.stores) */
    struct ShardSet *mgrs; /* a manager per shard; NULL without the manager role */
    struct Hub *hub;
    struct Listener *listener;
    struct Proxy *proxy;
    struct DbPool *pool;
    struct Metrics *metrics;
    struct Http *http;
    struct Auth *auth;         /* bearer tokens; none configured: the API is open */
    struct DbWatch *dbwatch;   /* what the database offers a 202 (dbwatch.h) */
    struct LeaderInfo *leader; /* written by the listener alone (leaderinfo.h) */
    struct Api *api;
} Server;

#endif
