/* http: see http.h. The daemon runs its own threads (epoll) and allows
 * suspend/resume; each connection's Req lives from the first callback to the
 * completed callback. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include "head.h"
#include "linger.h"
#include "log.h"

#define MAX_SEGMENTS HTTP_MAX_SEGMENTS

/* A connection from accept until it is closed. `receiving` while a request is
 * on its way in: from the accept, or from the end of the previous request on
 * the connection (since_ms), until the whole request has arrived. Listed in
 * Http.conns under conns_lock; the two atomics are written by the HTTP
 * thread of the connection and read by the sweep. */
typedef struct ConnTrack {
    int fd;
    atomic_llong since_ms;
    atomic_bool receiving;
    bool cut;
    bool linger; /* answered before its body: close it lingering (linger.h) */
    struct ConnTrack *prev, *next;
} ConnTrack;

struct Http {
    HttpConfig cfg; /* cfg.listen points to listen */
    char *listen;
    HttpApp app;
    struct MHD_Daemon *mhd;
    /* Connections, for the slow-client sweep (http_sweep); guarded by conns_lock. */
    pthread_mutex_t conns_lock;
    ConnTrack *conns;
    Linger *linger;
};

/* Lingering closes: at most this many sockets at once, each for at most this
 * long (as nginx's lingering_time); beyond either the close resets. */
#define LINGER_SOCKETS 256
#define LINGER_MS 5000

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void req_park(Req *r)
{
    r->parked = true;
    MHD_suspend_connection(r->conn);
}

void http_suspend_stream(struct MHD_Connection *c)
{
    MHD_suspend_connection(c);
}

void req_finish_raw(Req *r, int status, const char *content_type, char *body, size_t len)
{
    r->status = status;
    r->content_type = content_type;
    free(r->resp_body);
    r->resp_body = body;
    r->resp_len = len;
    r->answered = true;
    if (r->parked) {
        r->parked = false;
        MHD_resume_connection(r->conn);
    }
}

/* Whether the client of a parked request is still connected: a peek at its
 * socket sees the end of the stream once it has closed. */
bool req_alive(Req *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return true;
    char c;
    ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

void req_resume(Req *r)
{
    r->parked = false;
    MHD_resume_connection(r->conn);
}

void req_finish_json(Req *r, int status, json_t *body)
{
    char *txt = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(body);
    if (txt) {
        size_t n = strlen(txt);
        txt = xrealloc(txt, n + 2);
        txt[n] = '\n';
        txt[n + 1] = '\0';
        req_finish_raw(r, status, "application/json", txt, n + 1);
    } else {
        req_finish_raw(r, status, NULL, NULL, 0);
    }
}

static const char *reason(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 431:
        return "Request Header Fields Too Large";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    default:
        return "Error";
    }
}

#define DB_DOWN_DETAIL "the database cannot be reached; retry"

void req_finish_problem(Req *r, const Err *err)
{
    int status = err->status ? err->status : 500;
    const char *detail = err->msg[0] ? err->msg : "internal error";
    if (!strncmp(err->type, "database-", 9)) {
        /* libpq's words name hosts, users and SQL: they go to the log, the
         * client gets what it can act on. */
        if (strcmp(err->msg, DB_DOWN_DETAIL) != 0)
            log_warn("%s %s: %s", r->method, r->path, err->msg);
        detail = status == 503 ? DB_DOWN_DETAIL
                               : "the database refused this request; the node's log says why";
    }
    if (status == 429 || status == 503)
        r->retry_after_s = 1;
    char type[96];
    snprintf(type, sizeof type, "https://workd.dev/problems/%s",
             err->type[0] ? err->type : "internal");
    json_t *p = json_pack("{s:s, s:s, s:i, s:s}", "type", type, "title", reason(status), "status",
                          status, "detail", detail);
    if (!p) /* a detail that is not valid UTF-8 (a bug upstream): still answer */
        p = json_pack("{s:s, s:s, s:i, s:s}", "type", type, "title", reason(status), "status",
                      status, "detail", "the request was refused (no readable detail)");
    char *txt = json_dumps(p, JSON_COMPACT);
    json_decref(p);
    size_t n = strlen(txt);
    txt = xrealloc(txt, n + 2);
    txt[n] = '\n';
    txt[n + 1] = '\0';
    req_finish_raw(r, status, "application/problem+json", txt, n + 1);
}

const char *req_header(Req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *req_query(Req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

typedef struct QueryEach {
    void (*fn)(void *ud, const char *key, const char *value);
    void *ud;
} QueryEach;

static enum MHD_Result query_one(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    (void)kind;
    QueryEach *q = cls;
    q->fn(q->ud, key, value);
    return MHD_YES;
}

void req_query_each(Req *r, void (*fn)(void *ud, const char *key, const char *value), void *ud)
{
    QueryEach q = {fn, ud};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, query_one, &q);
}

/* ---- the request head: framing (RFC 9112) ---- */

static enum MHD_Result on_header_line(void *cls, enum MHD_ValueKind kind, const char *key,
                                      size_t key_size, const char *value, size_t value_size)
{
    head_line(cls, key, key_size, value, value_size);
    return MHD_YES;
}

/* Where the line before ended (its value's end), and whether a line did not
 * start where a CRLF after it puts it. */
typedef struct LineLayout {
    const char *end;
    bool bad;
} LineLayout;

static enum MHD_Result on_line_layout(void *cls, enum MHD_ValueKind kind, const char *key,
                                      size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    LineLayout *l = cls;
    /* The line before ended with two NULs (its CRLF), then this key; the
     * key's colon is a NUL, then optional whitespace, then the value. */
    if (key != l->end + 2 || l->end[0] || l->end[1])
        l->bad = true;
    const char *colon = key + key_size;
    if (value <= colon || value - colon > 1024 || *colon)
        l->bad = true;
    for (const char *p = colon + 1; !l->bad && p < value; p++)
        if (*p != ' ' && *p != '\t')
            l->bad = true;
    l->end = value + value_size;
    return l->bad ? MHD_NO : MHD_YES;
}

/* libmicrohttpd 0.9.75 parses a head in place: the version, each header's
 * name and value point into its read buffer, and it overwrites each line's
 * end with NULs, two for a CRLF. It also takes a bare LF (or CR) as a line's
 * end and joins an obs-fold continuation onto the value above (moving it),
 * both of which RFC 9112 lets a server refuse and another party may read
 * differently. Neither shows in the values, but both move the lines: the head
 * is refused unless every line, and the blank line after the last, ends
 * exactly where a CRLF would put it. */
static bool lines_end_in_crlf(struct MHD_Connection *conn, const char *version)
{
    LineLayout l = {.end = version + strlen(version)};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, on_line_layout, &l);
    /* The last line's CRLF, then the blank line's. */
    return !l.bad && !l.end[0] && !l.end[1] && !l.end[2] && !l.end[3];
}

/* libmicrohttpd 0.9.75 takes the first of two Content-Lengths, lets
 * Transfer-Encoding win over Content-Length and serves a request without
 * Host: head_check (head.c) judges every line it kept, before anything else
 * reads the head. */
WARN_UNUSED static int check_framing(struct MHD_Connection *conn, const char *version, Err *err)
{
    HeadCheck h = {0};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, on_header_line, &h);
    if (head_check(&h, strcmp(version, MHD_HTTP_VERSION_1_0) != 0, err) != 0)
        return -1;
    if (!lines_end_in_crlf(conn, version))
        return err_set(err, 400, "bad-request",
                       "every line of the head must end with CRLF, and no header may continue "
                       "on the next line (obs-fold; RFC 9112 sections 2.2 and 5.2)");
    return 0;
}

/* ---- routing ---- */

static size_t split_path(char *path, char **segs)
{
    size_t n = 0;
    char *save = NULL;
    for (char *t = strtok_r(path, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (n == MAX_SEGMENTS)
            return MAX_SEGMENTS + 1;
        segs[n++] = t;
    }
    return n;
}

/* Matches pattern against the path's segments; fills params with the ":x" parts. */
static bool match(const char *pattern, char **segs, size_t nsegs, char **params)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", pattern);
    char *psegs[MAX_SEGMENTS + 1];
    size_t np = split_path(buf, psegs), k = 0;
    if (np != nsegs)
        return false;
    for (size_t i = 0; i < np; i++) {
        if (psegs[i][0] == ':')
            params[k++] = segs[i];
        else if (strcmp(psegs[i], segs[i]) != 0)
            return false;
    }
    return true;
}

static bool is_json(const char *ct)
{
    if (!ct)
        return false;
    while (*ct == ' ')
        ct++;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 &&
           (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

/* Whether the space-separated list holds word (NULL: no). */
static bool listed(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; p && *p;) {
        while (*p == ' ')
            p++;
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, word, n))
            return true;
        p += len;
    }
    return false;
}

bool route_takes(const Route *rt, const char *param)
{
    return listed(rt->query, param);
}

typedef struct QueryCheck {
    const Route *rt;
    char bad[65];      /* the first parameter the route does not take */
    char repeated[65]; /* ...or the first given twice */
    const char *seen[16];
    size_t nseen;
} QueryCheck;

static void copy_name(char *dst, size_t n, const char *s)
{
    size_t o = 0;
    for (; *s && o + 1 < n; s++)
        dst[o++] = (unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?';
    dst[o] = '\0';
}

static enum MHD_Result on_query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    QueryCheck *q = cls;
    if (!listed(q->rt->query, key)) {
        if (!q->bad[0])
            copy_name(q->bad, sizeof q->bad, key[0] ? key : "(empty)");
        return MHD_YES;
    }
    for (size_t i = 0; i < q->nseen; i++)
        if (!strcmp(q->seen[i], key) && !q->repeated[0])
            copy_name(q->repeated, sizeof q->repeated, key);
    if (q->nseen < sizeof q->seen / sizeof q->seen[0])
        q->seen[q->nseen++] = key;
    return MHD_YES;
}

/* Refuses a query parameter the route does not take, so that a misspelt one
 * is an error rather than a silent default. */
WARN_UNUSED static int check_query(Req *r, Err *err)
{
    if (!r->rt->query)
        return 0;
    QueryCheck q = {.rt = r->rt};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, on_query_arg, &q);
    if (q.bad[0])
        return err_set(err, 400, "unknown-parameter", "%s %s takes no query parameter '%s'%s%s",
                       r->method, r->rt->pattern, q.bad,
                       r->rt->query[0] ? "; it takes: " : " (it takes none)", r->rt->query);
    if (q.repeated[0])
        return err_set(err, 400, "repeated-parameter", "the query parameter '%s' is given twice",
                       q.repeated);
    return 0;
}

/* Finds the route of r (r->rt, r->params, r->route), or refuses with 404/405. */
WARN_UNUSED static int route(const HttpApp *app, Req *r, Err *err)
{
    r->segs = xstrdup(r->path);
    char *segs[MAX_SEGMENTS + 1];
    size_t nsegs = split_path(r->segs, segs);
    /* HEAD is GET without the body (RFC 9110 9.3.2). */
    const char *method = strcmp(r->method, "HEAD") ? r->method : "GET";
    char allow[128] = "";
    for (size_t i = 0; i < app->n_routes; i++) {
        const Route *rt = &app->routes[i];
        char *p[MAX_SEGMENTS] = {0};
        if (nsegs > MAX_SEGMENTS || !match(rt->pattern, segs, nsegs, p))
            continue;
        if (strcmp(rt->method, method) == 0) {
            r->rt = rt;
            memcpy(r->params, p, sizeof r->params);
            r->route = (int)i;
            return 0;
        }
        if (!strstr(allow, rt->method))
            snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s%s",
                     allow[0] ? ", " : "", rt->method, strcmp(rt->method, "GET") ? "" : ", HEAD");
    }
    if (!allow[0])
        return err_set(err, 404, "no-route", "there is no %s on this server", r->path);
    snprintf(r->location, sizeof r->location, "%s", allow);
    return err_set(err, 405, "method-not-allowed", "%s is not allowed on %s; allowed: %s",
                   r->method, r->path, allow);
}

/* What the request head alone decides, before a byte of the body is read:
 * framing, whether another node vouches for it, the route, the client's
 * authorization, the query, the content type and the body's size. Returns 0
 * to go on, or -1 with err. */
WARN_UNUSED static int check_head(const Http *h, Req *r, const char *version, Err *err)
{
    const HttpApp *app = &h->app;
    if (check_framing(r->conn, version, err) != 0) {
        r->close = true;
        return -1;
    }
    int vouched = app->vouch ? app->vouch(app->ctx, r, err) : 0;
    if (vouched < 0)
        return -1;
    r->body_limit = h->cfg.max_body * (vouched ? HTTP_VOUCHED_BODY : 1);
    const char *cl =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int64_t length = cl ? strtoll(cl, NULL, 10) : 0;
    if (length > r->body_limit)
        /* Before routing: a body this large is refused on any path. */
        return err_set(err, 413, "body-too-large",
                       "the request body is %s bytes; the limit is %lld", cl,
                       (long long)r->body_limit);
    if (route(app, r, err) != 0)
        return -1;
    if (app->authorize && app->authorize(app->ctx, r, err) != 0)
        return -1;
    if (check_query(r, err) != 0)
        return -1;
    if (r->rt->json_body && !is_json(req_header(r, MHD_HTTP_HEADER_CONTENT_TYPE)))
        return err_set(err, 415, "unsupported-media-type",
                       "send the body as JSON with 'Content-Type: application/json'");
    if (!r->rt->json_body)
        r->body_limit = 0;
    if (length > r->body_limit)
        return err_set(err, 413, "body-too-large", "%s %s takes no request body", r->method,
                       r->rt->pattern);
    return 0;
}

/* ---- the daemon's callbacks ---- */

static enum MHD_Result queue_answer(const Http *h, Req *r)
{
    struct MHD_Response *resp;
    if (r->stream) {
        resp = r->stream;
        r->stream = NULL;
    } else {
        resp = MHD_create_response_from_buffer(r->resp_len, r->resp_body, MHD_RESPMEM_MUST_FREE);
        r->resp_body = NULL;
        if (r->content_type)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    }
    if (r->status == 405 && r->location[0])
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->location);
    else if (r->status == 401 && r->location[0])
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, r->location);
    else if (r->location[0])
        MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, r->location);
    if (r->retry_after_s > 0) {
        char ra[24];
        snprintf(ra, sizeof ra, "%lld", (long long)r->retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (r->close)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    if (h->app.observe)
        h->app.observe(h->app.ctx, r->route, r->status, now_us() - r->start_us);
    return rc;
}

static ConnTrack *conn_track(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    Http *h = cls;
    ConnTrack *t = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        t = xcalloc(1, sizeof *t);
        t->fd = ci ? ci->connect_fd : -1;
        atomic_store(&t->since_ms, mono_ms());
        atomic_store(&t->receiving, true);
        pthread_mutex_lock(&h->conns_lock);
        t->next = h->conns;
        if (h->conns)
            h->conns->prev = t;
        h->conns = t;
        pthread_mutex_unlock(&h->conns_lock);
        *socket_context = t;
    } else if (t) {
        /* libmicrohttpd has sent the answer and shut the write side; its
         * close follows, and with the body unread it would reset. */
        if (t->linger && !t->cut)
            linger_take(h->linger, t->fd);
        /* Closed: unlisted before libmicrohttpd closes the descriptor, so the
         * sweep never touches a number that another connection may reuse. */
        pthread_mutex_lock(&h->conns_lock);
        if (t->prev)
            t->prev->next = t->next;
        else
            h->conns = t->next;
        if (t->next)
            t->next->prev = t->prev;
        pthread_mutex_unlock(&h->conns_lock);
        free(t);
        *socket_context = NULL;
    }
}

void http_sweep(Http *h, int64_t now)
{
    pthread_mutex_lock(&h->conns_lock);
    for (ConnTrack *t = h->conns; t; t = t->next)
        if (!t->cut && atomic_load(&t->receiving) && t->fd >= 0 &&
            now - atomic_load(&t->since_ms) > h->cfg.request_timeout_ms) {
            /* shutdown, not close: libmicrohttpd sees the end of the stream and
             * closes the connection itself. */
            shutdown(t->fd, SHUT_RDWR);
            t->cut = true;
            log_info("cut off a client that sent no complete request in %lld ms",
                     (long long)h->cfg.request_timeout_ms);
        }
    pthread_mutex_unlock(&h->conns_lock);
}

/* The whole request has arrived (or is refused unread): the request timeout
 * stops for this connection until the answer is sent. */
static void received(Req *r)
{
    ConnTrack *t = conn_track(r->conn);
    if (t)
        atomic_store(&t->receiving, false);
}

static bool has_body(struct MHD_Connection *conn)
{
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return (cl && strtoll(cl, NULL, 10) != 0) ||
           MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    Http *h = cls;
    Req *r = *con_cls;
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->shard = -1;
        r->app = h->app.ctx;
        r->conn = conn;
        r->method = xstrdup(method);
        r->path = xstrdup(url);
        r->route = -1;
        r->start_us = now_us();
        sbuf_init(&r->body);
        *con_cls = r;
        if (check_head(h, r, version, &r->refusal) == 0)
            return MHD_YES; /* read the body (after "100 Continue" if asked) */
        r->refused = true;
        if (r->close || has_body(conn)) {
            /* Answered before the body: libmicrohttpd sends no "100 Continue",
             * reads none of the body and closes the connection after, which
             * must linger for the answer to arrive whole. */
            ConnTrack *t = conn_track(conn);
            if (t)
                t->linger = true;
            received(r);
            req_finish_problem(r, &r->refusal);
            return queue_answer(h, r);
        }
        /* No body: answer once the request is complete, which keeps the
         * connection open for the next one. */
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (now_us() - r->start_us > h->cfg.request_timeout_ms * 1000) {
            /* A body trickling in: libmicrohttpd cannot answer before the body
             * is read, so the connection is closed. */
            log_info("cut off a client whose request body did not arrive within %lld ms",
                     (long long)h->cfg.request_timeout_ms);
            return MHD_NO;
        }
        if (!r->body_too_large) {
            if (r->body.len + *upload_data_size > (size_t)r->body_limit) {
                r->body_too_large = true;
                sbuf_free(&r->body);
            } else {
                sbuf_append(&r->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!r->answered && !r->parked && r->on_resume) {
        void (*fn)(Req *) = r->on_resume;
        r->on_resume = NULL;
        fn(r);
    }
    if (r->answered)
        return queue_answer(h, r);
    if (r->parked)
        return MHD_YES;
    received(r);
    if (r->refused) {
        req_finish_problem(r, &r->refusal);
    } else if (r->body_too_large) {
        Err err;
        if (r->body_limit)
            err_set(&err, 413, "body-too-large", "the request body is over the limit of %lld bytes",
                    (long long)r->body_limit);
        else
            err_set(&err, 413, "body-too-large", "%s %s takes no request body", r->method,
                    r->rt->pattern);
        req_finish_problem(r, &err);
    } else {
        r->rt->fn(r, r->params);
    }
    if (r->answered && !r->parked)
        return queue_answer(h, r);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    Req *r = *con_cls;
    /* The next request on this connection has --request-timeout from now. */
    ConnTrack *t = conn_track(conn);
    if (t) {
        atomic_store(&t->since_ms, mono_ms());
        atomic_store(&t->receiving, true);
    }
    if (!r)
        return;
    if (r->stream)
        MHD_destroy_response(r->stream);
    if (r->free_state)
        r->free_state(r->state);
    free(r->method);
    free(r->path);
    free(r->segs);
    free(r->resp_body);
    sbuf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

/* The format comes from libmicrohttpd: say so, for -Wformat-nonliteral. */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = '\0';
    log_debug("http: %s", msg);
}

Http *http_new(const HttpConfig *cfg)
{
    Http *h = xcalloc(1, sizeof *h);
    h->cfg = *cfg;
    h->listen = xstrdup(cfg->listen);
    h->cfg.listen = h->listen;
    pthread_mutex_init(&h->conns_lock, NULL);
    return h;
}

int http_start(Http *h, const HttpApp *app, Err *err)
{
    const HttpConfig *cfg = &h->cfg;
    h->app = *app;
    /* Every idle stream and long-poll is a descriptor: lift the soft limit. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    const char *colon = strrchr(cfg->listen, ':');
    if (!colon)
        return err_set(err, 400, "bad-config", "--listen: '%s' is not HOST:PORT", cfg->listen);
    char host[128];
    snprintf(host, sizeof host, "%.*s", (int)(colon - cfg->listen), cfg->listen);
    int port = atoi(colon + 1);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &addr.sin_addr) != 1)
        return err_set(err, 400, "bad-config", "--listen: '%s' is not an IPv4 address", host);
    h->linger = linger_new(LINGER_SOCKETS, LINGER_MS, err);
    if (!h->linger)
        return -1;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    h->mhd = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        h, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(cfg->connection_timeout_ms / 1000), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)32 * 1024, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
    if (!h->mhd)
        return err_set(err, 500, "listen-failed", "cannot listen on %s (in use, or not allowed?)",
                       cfg->listen);
    return 0;
}

int http_port(const Http *h)
{
    const union MHD_DaemonInfo *di =
        h->mhd ? MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT) : NULL;
    return di ? di->port : 0;
}

void http_stop(Http *h)
{
    if (h && h->mhd)
        MHD_stop_daemon(h->mhd);
    if (h)
        h->mhd = NULL;
}

void http_free(Http *h)
{
    if (!h)
        return;
    /* The daemon has stopped: every connection has been closed and unlisted. */
    linger_free(h->linger);
    pthread_mutex_destroy(&h->conns_lock);
    free(h->listen);
    free(h);
}
