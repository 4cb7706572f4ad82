/* http: see http.h. The daemon runs its own threads (epoll) and allows
 * suspend/resume; each connection's Req lives from the first callback to the
 * completed callback. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include "auth.h"
#include "log.h"
#include "metrics.h"

#define MAX_SEGMENTS 8

/* A connection from accept until it is closed; `seen` once a whole request
 * header has arrived. Listed in Server.conns under conns_lock. */
typedef struct ConnTrack {
    int fd;
    int64_t accepted_ms;
    atomic_bool seen;
    bool cut;
    struct ConnTrack *prev, *next;
} ConnTrack;

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
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    default:
        return "Error";
    }
}

void req_finish_problem(Req *r, const Err *err)
{
    int status = err->status ? err->status : 500;
    if (status == 429 || status == 503)
        r->retry_after_s = 1;
    char type[96];
    snprintf(type, sizeof type, "https://workd.dev/problems/%s",
             err->type[0] ? err->type : "internal");
    json_t *p = json_pack("{s:s, s:s, s:i, s:s}", "type", type, "title", reason(status), "status",
                          status, "detail", err->msg[0] ? err->msg : "internal error");
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

static void dispatch(Req *r)
{
    char *copy = xstrdup(r->path);
    char *segs[MAX_SEGMENTS + 1];
    size_t nsegs = split_path(copy, segs);
    char allow[128] = "";
    char *params[MAX_SEGMENTS] = {0};
    const Route *found = NULL;
    for (size_t i = 0; i < api_routes_count && !found; i++) {
        const Route *rt = &api_routes[i];
        char *p[MAX_SEGMENTS] = {0};
        if (nsegs > MAX_SEGMENTS || !match(rt->pattern, segs, nsegs, p))
            continue;
        if (strcmp(rt->method, r->method) == 0) {
            found = rt;
            memcpy(params, p, sizeof params);
            r->route = (int)i;
        } else if (!strstr(allow, rt->method)) {
            snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s",
                     allow[0] ? ", " : "", rt->method);
        }
    }
    Err err = {0};
    if (found &&
        auth_check(r->srv->auth, found->scope, req_header(r, MHD_HTTP_HEADER_AUTHORIZATION),
                   req_query(r, "access_token"), &err) != 0) {
        if (err.status == 401)
            snprintf(r->location, sizeof r->location, "%s", "Bearer realm=\"workd\"");
        req_finish_problem(r, &err);
        free(copy);
        return;
    }
    if (!found) {
        if (allow[0]) {
            snprintf(r->location, sizeof r->location, "%s", allow);
            err_set(&err, 405, "method-not-allowed", "%s is not allowed on %s; allowed: %s",
                    r->method, r->path, allow);
            r->status = 405;
        } else {
            err_set(&err, 404, "no-route", "there is no %s on this server", r->path);
        }
        req_finish_problem(r, &err);
        free(copy);
        return;
    }
    if (r->body_too_large) {
        err_set(&err, 413, "body-too-large", "the request body is over the limit of %lld bytes",
                (long long)r->body_limit);
        req_finish_problem(r, &err);
    } else if (found->json_body && !is_json(req_header(r, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        err_set(&err, 415, "unsupported-media-type",
                "send the body as JSON with 'Content-Type: application/json'");
        req_finish_problem(r, &err);
    } else {
        found->fn(r, params);
    }
    free(copy);
}

/* ---- the daemon's callbacks ---- */

static enum MHD_Result queue_answer(Req *r)
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
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    metrics_observe(r->srv->metrics, r->route, r->status, now_us() - r->start_us);
    return rc;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    Server *s = cls;
    ConnTrack *t = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        t = xcalloc(1, sizeof *t);
        t->fd = ci ? ci->connect_fd : -1;
        t->accepted_ms = mono_ms();
        pthread_mutex_lock(&s->conns_lock);
        t->next = s->conns;
        if (s->conns)
            s->conns->prev = t;
        s->conns = t;
        pthread_mutex_unlock(&s->conns_lock);
        *socket_context = t;
    } else if (t) {
        /* Closed: unlisted before libmicrohttpd closes the descriptor, so the
         * sweep never touches a number that another connection may reuse. */
        pthread_mutex_lock(&s->conns_lock);
        if (t->prev)
            t->prev->next = t->next;
        else
            s->conns = t->next;
        if (t->next)
            t->next->prev = t->prev;
        pthread_mutex_unlock(&s->conns_lock);
        free(t);
        *socket_context = NULL;
    }
}

void http_sweep(Server *s, int64_t now)
{
    pthread_mutex_lock(&s->conns_lock);
    for (ConnTrack *t = s->conns; t; t = t->next)
        if (!t->cut && !atomic_load(&t->seen) && t->fd >= 0 &&
            now - t->accepted_ms > s->cfg.request_timeout_ms) {
            /* shutdown, not close: libmicrohttpd sees the end of the stream and
             * closes the connection itself. */
            shutdown(t->fd, SHUT_RDWR);
            t->cut = true;
            log_info("cut off a client that sent no complete request in %lld ms",
                     (long long)s->cfg.request_timeout_ms);
        }
    pthread_mutex_unlock(&s->conns_lock);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    Server *s = cls;
    Req *r = *con_cls;
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->srv = s;
        r->conn = conn;
        r->method = xstrdup(method);
        r->path = xstrdup(url);
        r->route = METRICS_ROUTES - 1;
        r->start_us = now_us();
        sbuf_init(&r->body);
        *con_cls = r;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        if (ci && ci->socket_context)
            atomic_store(&((ConnTrack *)ci->socket_context)->seen, true);
        /* A node forwards submissions with their ids and defaults filled in,
         * which makes them larger than what the client sent. */
        r->body_limit = s->cfg.max_body;
        if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Workd-Forwarded"))
            r->body_limit *= 4;
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > r->body_limit) {
            /* Refuse before reading a byte of it. */
            Err err;
            err_set(&err, 413, "body-too-large", "the request body is %s bytes; the limit is %lld",
                    cl, (long long)r->body_limit);
            req_finish_problem(r, &err);
            return queue_answer(r);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (now_us() - r->start_us > s->cfg.request_timeout_ms * 1000) {
            /* A body trickling in: libmicrohttpd cannot answer before the body
             * is read, so the connection is closed. */
            log_info("cut off a client whose request body did not arrive within %lld ms",
                     (long long)s->cfg.request_timeout_ms);
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
        return queue_answer(r);
    if (r->parked)
        return MHD_YES;
    dispatch(r);
    if (r->answered && !r->parked)
        return queue_answer(r);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    Req *r = *con_cls;
    if (!r)
        return;
    if (r->state_free)
        r->state_free(r->state);
    if (r->stream)
        MHD_destroy_response(r->stream);
    mgrcmd_free(r->cmd);
    free(r->method);
    free(r->path);
    free(r->resp_body);
    sbuf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = '\0';
    log_debug("http: %s", msg);
}

int http_start(Server *s, Err *err)
{
    /* Every idle stream and long-poll is a descriptor: lift the soft limit. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    const char *colon = strrchr(s->cfg.listen, ':');
    if (!colon)
        return err_set(err, 400, "bad-config", "--listen: '%s' is not HOST:PORT", s->cfg.listen);
    char host[128];
    snprintf(host, sizeof host, "%.*s", (int)(colon - s->cfg.listen), s->cfg.listen);
    int port = atoi(colon + 1);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &addr.sin_addr) != 1)
        return err_set(err, 400, "bad-config", "--listen: '%s' is not an IPv4 address", host);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        s, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(s->cfg.connection_timeout_ms / 1000), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)32 * 1024, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
    if (!s->mhd)
        return err_set(err, 500, "listen-failed", "cannot listen on %s (in use, or not allowed?)",
                       s->cfg.listen);
    return 0;
}

void http_stop(Server *s)
{
    if (s->mhd)
        MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
