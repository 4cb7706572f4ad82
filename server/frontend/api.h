/* api: the routes of the public HTTP API and their handlers. Requests that
 * only the leader can answer go to the local manager when this node leads, and
 * through the proxy otherwise; reads are served by any node from the table.
 * The HTTP daemon (http.h) serves the table through api_http. */
#ifndef WORKD_API_H
#define WORKD_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http.h"
#include "netpolicy.h"

/* The limits and names the handlers use; strings and webhook_allow are
 * borrowed and outlive the Api. */
typedef struct ApiConfig {
    const char *node_id;
    const char *cluster_secret; /* proves a forwarded request ("": none) */
    int64_t max_body;           /* bytes of a payload */
    int64_t max_batch;          /* items per POST /work, reports or progress */
    int64_t max_json_depth;
    int64_t get_wait_max_ms;
    int64_t default_timeout_ms, default_max_attempts;
    const NetPolicy *webhook_allow; /* receivers' networks allowed beside public ones */
} ApiConfig;

/* What the database offers a 202 (main's database watch), for GET /cluster
 * and /readyz; both thread-safe. */
typedef struct ApiDbWatch {
    void *ctx;
    /* The last check as a new JSON object (ClusterDatabase in openapi.yaml). */
    json_t *(*json)(void *ctx);
    /* Whether commits are stuck; a sentence saying so into why. */
    bool (*stalled)(void *ctx, char *why, size_t whylen);
} ApiDbWatch;

/* The parts of the node the handlers use, each made and freed by main(),
 * borrowed for the Api's life. */
typedef struct ApiParts {
    struct ShardSet *mgrs; /* a manager per shard; NULL without the manager role */
    struct Hub *hub;
    struct Listener *listener;
    struct Proxy *proxy;
    struct DbPool *pool;
    struct Metrics *metrics;
    struct Auth *auth; /* bearer tokens; none configured: the API is open */
    struct LeaderInfo *leader;
    ApiDbWatch dbwatch;
} ApiParts;

/* The handlers' state (their config and parts, a cache of finished-work
 * counts), one per server. */
typedef struct Api Api;

/* cfg and parts are copied (their pointees borrowed). */
Api *api_new(const ApiConfig *cfg, const ApiParts *parts);
/* After the HTTP daemon has stopped. */
void api_free(Api *a);
/* The route table and hooks to serve a with (http_start). */
HttpApp api_http(Api *a);

/* The route table, by route index (the metrics' order). */
extern const Route api_routes[];
extern const size_t api_routes_count;

#endif
