/* http: the libmicrohttpd daemon and the life of one request. A handler either
 * answers at once or parks the request (suspends its connection) and answers
 * later from any thread with req_finish_*; nothing blocks the HTTP threads. */
#ifndef WORKD_HTTP_H
#define WORKD_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "server.h"
#include "util.h"

#define HTTP_MAX_SEGMENTS 8 /* path segments a route may have */

typedef struct Route Route;
typedef struct Req Req;
struct Req {
    Server *srv;
    struct MHD_Connection *conn;
    char *method; /* as sent: "HEAD" runs the GET route, the answer has no body */
    char *path;   /* without the query */
    int route;    /* index into the route table, for metrics */
    const Route *rt;
    char *segs;                      /* owned copy of path, split */
    char *params[HTTP_MAX_SEGMENTS]; /* the ":x" segments, into segs */
    bool forwarded;                  /* sent by another node (never forwarded again) */
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
    /* A command sent to the local manager, and how to turn its reply into the
     * answer (run on the HTTP thread when the request is resumed). */
    MgrCmd *cmd;
    bool bulk, single; /* single: a route of one attempt (answered as one item) */
    void (*on_resume)(Req *r);
};

/* ---- the daemon ---- */
typedef struct Http Http;
/* The daemon of server s, not listening yet; s is handed to every handler. */
Http *http_new(Server *s);
int http_start(Http *h, Err *err) WARN_UNUSED;
/* Stops serving (NULL: nothing); http_free after, once nothing uses h. */
void http_stop(Http *h);
void http_free(Http *h);
/* Cuts off connections that have not delivered a whole request (head and
 * body) within --request-timeout of being accepted or of the previous answer
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

/* ---- routing (the table lives in api.c) ---- */
typedef void (*Handler)(Req *r, char *const *params);
struct Route {
    const char *method;  /* a "GET" route answers HEAD too */
    const char *pattern; /* "/work/:id/events": ":x" matches one segment */
    Handler fn;
    const char *name; /* for metrics */
    bool json_body;   /* requires a JSON body (415/400 otherwise); other routes take none */
    int scope;        /* SCOPE_* a bearer token needs (auth.h) */
    /* The query parameters it takes, space-separated (others are refused);
     * NULL: any (the dashboard's files). "access_token" only where a browser
     * cannot send a header (EventSource). */
    const char *query;
};
extern const Route api_routes[];
extern const size_t api_routes_count;

/* Suspends an SSE connection from inside its content reader (see hub.c). */
void http_suspend_stream(struct MHD_Connection *c);
#endif
