/* http: the libmicrohttpd daemon and the life of one request. A handler either
 * answers at once or parks the request (suspends its connection) and answers
 * later from any thread with req_finish_*; nothing blocks the HTTP threads.
 * It knows nothing of the server: its caller hands it a small config, a route
 * table and hooks (HttpApp), as redis's ae and anet take theirs. */
#ifndef WORKD_HTTP_H
#define WORKD_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "util.h"

#define HTTP_MAX_SEGMENTS 8 /* path segments a route may have */

typedef struct Route Route;
typedef struct Req Req;
struct Req {
    void *app; /* the caller's context (HttpApp.ctx), for the handlers */
    struct MHD_Connection *conn;
    char *method; /* as sent: "HEAD" runs the GET route, the answer has no body */
    char *path;   /* without the query */
    int route;    /* index into the route table (-1: none), for HttpApp.observe */
    const Route *rt;
    char *segs;                      /* owned copy of path, split */
    char *params[HTTP_MAX_SEGMENTS]; /* the ":x" segments, into segs */
    bool forwarded; /* sent by another node (never forwarded again): set by HttpApp.vouch */
    /* The shard a command of this request is for: a forwarded request's
     * X-Workd-Shard (HttpApp.vouch), or where the API sent it; -1: none. */
    int shard;
    SBuf body;
    int64_t body_limit;
    bool body_too_large;
    /* A refusal decided from the request head, answered before the body is
     * read (or, without a body, once the request is complete). */
    bool refused;
    Err refusal;
    bool close; /* answer with Connection: close (a framing error) */
    int64_t start_us;
    /* The answer, set before the connection is resumed. */
    bool parked;
    bool answered;
    int status;
    char *resp_body; /* owned */
    size_t resp_len;
    const char *content_type;
    char location[300];
    int64_t retry_after_s;
    struct MHD_Response *stream; /* SSE: a callback response to queue when resumed */
    /* The handler's own: its state for this request (api.c: the command it
     * sent to the manager), freed with free_state when the request ends, and
     * its flags (api.c: bulk, a POST /work of many items; single, a route of
     * one attempt, answered as one item). */
    void *state;
    void (*free_state)(void *state);
    bool bulk, single;
    /* How to compute the answer of a parked request once it is resumed (run
     * on the HTTP thread); NULL: it was answered before. */
    void (*on_resume)(Req *r);
};

/* ---- routing (the caller's table) ---- */
typedef void (*Handler)(Req *r, char *const *params);
struct Route {
    const char *method;  /* a "GET" route answers HEAD too */
    const char *pattern; /* "/work/:id/events": ":x" matches one segment */
    Handler fn;
    const char *name; /* for metrics */
    bool json_body;   /* requires a JSON body (415/400 otherwise); other routes take none */
    int scope;        /* what a client needs to use it, for HttpApp.authorize */
    /* The query parameters it takes, space-separated (others are refused);
     * NULL: any (the dashboard's files). "access_token" only where a browser
     * cannot send a header (EventSource). */
    const char *query;
};
/* Whether rt takes the query parameter param. */
bool route_takes(const Route *rt, const char *param);

/* ---- what the caller hands the daemon ---- */
typedef struct HttpConfig {
    const char *listen; /* "HOST:PORT", IPv4 (copied) */
    int64_t threads;
    int64_t max_connections;
    int64_t connection_timeout_ms; /* an idle connection is closed after this */
    /* A connection is cut off when a whole request (head and body) has not
     * arrived this long after it was accepted or its previous answer. */
    int64_t request_timeout_ms;
    int64_t max_body; /* bytes; a request vouched for may send HTTP_VOUCHED_BODY times more */
} HttpConfig;

/* A request that vouch says comes from another node of the cluster may carry
 * a larger body (the ids and defaults the forwarding node filled in). */
#define HTTP_VOUCHED_BODY 4

/* The routes and the hooks; ctx is handed to each hook and to the handlers
 * (Req.app). Hooks run on the HTTP threads, with the request head read; a
 * NULL hook is skipped (vouch: nobody is vouched for; authorize: every route
 * is open). The table and ctx outlive the daemon. */
typedef struct HttpApp {
    const Route *routes;
    size_t n_routes;
    void *ctx;
    /* Before routing: 1 if the request comes from a node of the cluster, 0 if
     * not, or -1 with err to refuse it. */
    int (*vouch)(void *ctx, Req *r, Err *err);
    /* Once r->rt is known: 0 if the client may use the route, or -1 with err
     * (it may set r->location, which a 401 sends as WWW-Authenticate). */
    int (*authorize)(void *ctx, Req *r, Err *err);
    /* As each answer is queued: the route's index (-1: none), the status and
     * the microseconds since the request arrived. */
    void (*observe)(void *ctx, int route, int status, int64_t us);
} HttpApp;

/* ---- the daemon ---- */
typedef struct Http Http;
/* A daemon, not listening yet (http_sweep may run from now on). */
Http *http_new(const HttpConfig *cfg);
/* Listens on cfg->listen and serves app's routes (copied; see HttpApp). */
int http_start(Http *h, const HttpApp *app, Err *err) WARN_UNUSED;
/* The port it listens on, once started (the one chosen, for port 0). */
int http_port(const Http *h);
/* Stops serving (NULL: nothing); http_free after, once nothing uses h. */
void http_stop(Http *h);
void http_free(Http *h);
/* Cuts off connections that have not delivered a whole request (head and
 * body) within request_timeout_ms of being accepted or of the previous answer
 * on the same connection (a client sending a byte at a time). Call about once
 * a second, from any thread. */
void http_sweep(Http *h, int64_t now_ms);

/* ---- answering (any thread) ---- */
/* Parks the request: call from the handler before handing work to another
 * thread, then answer with one of the req_finish_* functions. */
void req_park(Req *r);
/* Sets the answer; resumes the connection if parked. Takes body ownership. */
void req_finish_json(Req *r, int status, json_t *body);
void req_finish_problem(Req *r, const Err *err);
void req_finish_raw(Req *r, int status, const char *content_type, char *body, size_t len);
/* Resumes a parked request whose on_resume will compute the answer. */
void req_resume(Req *r);

/* Whether the client of a parked request is still connected (any thread). */
bool req_alive(Req *r);

/* ---- request data (HTTP thread only, while the handler runs) ---- */
const char *req_header(Req *r, const char *name);
const char *req_query(Req *r, const char *name);
/* Calls fn for each query argument of r, in order (value NULL: a bare key). */
void req_query_each(Req *r, void (*fn)(void *ud, const char *key, const char *value), void *ud);

/* Suspends an SSE connection from inside its content reader (see hub.c). */
void http_suspend_stream(struct MHD_Connection *c);
#endif
