/* proxy: see proxy.h. One thread drives a curl multi handle; requests arrive
 * through a mutex-guarded list and curl_multi_wakeup. */
#include "proxy.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

typedef struct Fwd {
    Req *req; /* a forward's; NULL for a call, which outlives nothing of it */
    char method[16];
    int shard; /* whose leader it goes to */
    /* A call (proxy_call): told the outcome instead of answering req. */
    ProxyDone done;
    void *done_ud;
    char *url_path; /* path?query */
    char *body;
    size_t body_len;
    struct curl_slist *hdrs;
    int64_t deadline, next_try;
    int64_t within_ms; /* a call's own bound (proxy_call_within); 0: the proxy's deadline */
    int attempt;
    CURL *easy;
    SBuf resp; /* at most --max-reply-bytes */
    size_t resp_limit;
    bool too_large; /* the leader's reply passed resp_limit: aborted, answered 502 */
    char content_type[128];
    char location[300];
    int64_t retry_after;
    char last_error[256];
    struct Fwd *next;
    struct Fwd *fly_prev, *fly_next; /* in Proxy.flying while in flight */
} Fwd;

struct Proxy {
    ProxyConfig cfg; /* strings borrowed from the caller */
    CURLM *multi;
    pthread_t thread;
    atomic_bool stopping;
    pthread_mutex_t lock;
    Fwd *incoming;
    Fwd *waiting; /* not in flight: waiting for next_try */
    Fwd *flying;  /* in flight */
    long in_flight;
    int64_t next_alive_check;
    _Atomic int64_t stuck_until[SHARDS_MAX]; /* mono ms (proxy_shard_stuck) */
};

static void fly_add(Proxy *p, Fwd *f)
{
    f->fly_prev = NULL;
    f->fly_next = p->flying;
    if (p->flying)
        p->flying->fly_prev = f;
    p->flying = f;
    p->in_flight++;
}

static void fly_remove(Proxy *p, Fwd *f)
{
    if (f->fly_prev)
        f->fly_prev->fly_next = f->fly_next;
    else
        p->flying = f->fly_next;
    if (f->fly_next)
        f->fly_next->fly_prev = f->fly_prev;
    f->fly_prev = f->fly_next = NULL;
    p->in_flight--;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    Fwd *f = ud;
    if (f->resp.len + size * n > f->resp_limit) {
        f->too_large = true;
        return 0; /* aborts the transfer */
    }
    sbuf_append(&f->resp, p, size * n);
    return size * n;
}

static void copy_header(char *dst, size_t dstlen, const char *v, size_t len)
{
    while (len && (*v == ' ')) {
        v++;
        len--;
    }
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
        len--;
    if (len >= dstlen)
        len = dstlen - 1;
    memcpy(dst, v, len);
    dst[len] = '\0';
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    Fwd *f = ud;
    size_t len = size * n;
    if (len > 13 && !strncasecmp(p, "Content-Type:", 13))
        copy_header(f->content_type, sizeof f->content_type, p + 13, len - 13);
    else if (len > 9 && !strncasecmp(p, "Location:", 9))
        copy_header(f->location, sizeof f->location, p + 9, len - 9);
    else if (len > 12 && !strncasecmp(p, "Retry-After:", 12))
        f->retry_after = atoll(p + 12);
    return len;
}

static void fwd_free(Fwd *f)
{
    if (f->easy)
        curl_easy_cleanup(f->easy);
    curl_slist_free_all(f->hdrs);
    free(f->url_path);
    free(f->body);
    sbuf_free(&f->resp);
    free(f);
}

/* f's request fails with err: its client is answered, or its caller told. */
static void fwd_fail(Fwd *f, const Err *err)
{
    if (f->done)
        f->done(f->done_ud, &(ProxyReply){.status = err->status, .err = err});
    else
        req_finish_problem(f->req, err);
}

static void answer(Proxy *p, Fwd *f, int status)
{
    Req *r = f->req;
    if (f->done) {
        f->done(f->done_ud, &(ProxyReply){.status = status,
                                          .body = f->resp.data ? f->resp.data : "",
                                          .len = f->resp.len});
        return;
    }
    if (f->location[0])
        snprintf(r->location, sizeof r->location, "%s", f->location);
    r->retry_after_s = f->retry_after;
    if (status == 401) /* queue_answer sends it as WWW-Authenticate */
        snprintf(r->location, sizeof r->location, "%s", "Bearer realm=\"workd\"");
    char *ct = f->content_type[0] ? xstrdup(f->content_type) : NULL;
    /* content_type must outlive the Req's answer: keep a static copy for the
     * common types, else fall back to JSON. */
    const char *type = "application/json";
    if (ct && !strncasecmp(ct, "application/problem+json", 24))
        type = "application/problem+json";
    else if (ct && !strncasecmp(ct, "text/plain", 10))
        type = "text/plain";
    free(ct);
    size_t len = f->resp.len;
    req_finish_raw(r, status, len ? type : NULL, len ? sbuf_steal(&f->resp) : NULL, len);
    (void)p;
}

static void fail_unreachable(Proxy *p, Fwd *f)
{
    atomic_fetch_add(&p->cfg.metrics->proxy_failures, 1);
    Err err;
    if (atomic_load(&p->stopping)) {
        err_set(&err, 503, "shutting-down", "this node is shutting down; retry on another node");
        fwd_fail(f, &err);
        return;
    }
    err_set(&err, 503, "leader-unavailable", "no leader answered within %lld ms (%s); retry later",
            (long long)p->cfg.deadline_ms, f->last_error[0] ? f->last_error : "no leader known");
    fwd_fail(f, &err);
}

/* Starts one try of f against the leader, or schedules the next. */
static void try_send(Proxy *p, Fwd *f, int64_t now)
{
    char leader[256];
    leaderinfo_get(p->cfg.leader, f->shard, leader, sizeof leader);
    if (!leader[0]) {
        snprintf(f->last_error, sizeof f->last_error, "no leader known");
        leaderinfo_mark_suspect(p->cfg.leader);
        /* No leader all the way to the deadline: 503, as when one was known
         * but did not answer (else the forward would wait until stopping). */
        if (now >= f->deadline) {
            fail_unreachable(p, f);
            fwd_free(f);
            return;
        }
        f->next_try = now + 100;
        f->next = p->waiting;
        p->waiting = f;
        return;
    }
    if (!f->easy)
        f->easy = curl_easy_init();
    CURL *e = f->easy;
    curl_easy_reset(e);
    sbuf_reset(&f->resp);
    f->resp_limit = (size_t)p->cfg.max_reply_bytes;
    f->too_large = false;
    f->content_type[0] = f->location[0] = '\0';
    f->retry_after = 0;
    char url[1024];
    snprintf(url, sizeof url, "%s%s", leader, f->url_path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    /* The path as this node routed it: curl would otherwise resolve "." and
     * ".." segments into another route. */
    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
    /* HEAD is asked of the leader as GET; this node's daemon drops the body. */
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, strcmp(f->method, "HEAD") ? f->method : "GET");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, f->hdrs);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    int64_t left = f->deadline - mono_ms();
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
                     f->within_ms ? (long)(left > 0 ? left : 1)
                                  : (long)(p->cfg.pull_wait_max_ms + p->cfg.deadline_ms + 5000));
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, f);
    curl_easy_setopt(e, CURLOPT_PRIVATE, f);
    if (f->body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, f->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)f->body_len);
    }
    curl_multi_add_handle(p->multi, e);
    fly_add(p, f);
    f->attempt++;
    if (f->attempt > 1)
        atomic_fetch_add(&p->cfg.metrics->proxy_retries, 1);
}

static void retry_or_fail(Proxy *p, Fwd *f, int64_t now)
{
    leaderinfo_mark_suspect(p->cfg.leader);
    if (now >= f->deadline || atomic_load(&p->stopping)) {
        fail_unreachable(p, f);
        fwd_free(f);
        return;
    }
    int64_t delay = 50LL << (f->attempt < 5 ? f->attempt : 5);
    if (delay > 1000)
        delay = 1000;
    f->next_try = now + delay / 2 + (int64_t)(rand_unit() * (double)delay / 2);
    f->next = p->waiting;
    p->waiting = f;
}

/* A 503 that says "not the leader" (or a gateway error) is worth another try
 * once the leader is known again; any other answer is the answer. */
static bool retryable(Fwd *f, long status)
{
    if (status == 502 || status == 504)
        return true;
    return status == 503 && f->resp.data &&
           (strstr(f->resp.data, "/not-leader") || strstr(f->resp.data, "/leader-unavailable") ||
            strstr(f->resp.data, "/id-busy"));
}

static void on_done(Proxy *p, CURL *e, CURLcode rc, int64_t now)
{
    Fwd *f;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&f);
    curl_multi_remove_handle(p->multi, e);
    fly_remove(p, f);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (f->too_large) {
        /* Final: sending it again would only do again what the leader did. */
        Err err;
        err_set(&err, 502, "reply-too-large",
                "the leader's reply is over --max-reply-bytes (%lld bytes)",
                (long long)f->resp_limit);
        fwd_fail(f, &err);
        fwd_free(f);
        return;
    }
    if (f->within_ms && (rc == CURLE_OPERATION_TIMEDOUT || now >= f->deadline) &&
        (rc != CURLE_OK || retryable(f, status))) {
        /* A call's bound: no more tries, and the shard is passed over a while. */
        atomic_store(&p->stuck_until[f->shard], now + PROXY_STUCK_MS);
        Err err;
        err_set(&err, 504, "shard-unavailable",
                "the leader of shard %d gave no answer within %lld ms", f->shard,
                (long long)f->within_ms);
        fwd_fail(f, &err);
        fwd_free(f);
        return;
    }
    if (rc != CURLE_OK || retryable(f, status)) {
        snprintf(f->last_error, sizeof f->last_error, "%s",
                 rc != CURLE_OK ? curl_easy_strerror(rc) : "the node was not the leader");
        retry_or_fail(p, f, now);
        return;
    }
    atomic_store(&p->stuck_until[f->shard], 0);
    if (status == 403 && f->resp.data && strstr(f->resp.data, "/forwarding-refused")) {
        /* The leader did not believe this node: an operator's mistake, not
         * the client's. */
        log_error("the leader refused a forward from this node: is --cluster-secret "
                  "(WORKD_CLUSTER_SECRET) the same on every node?");
        Err err;
        err_set(&err, 503, "leader-unavailable",
                "the leader does not take requests from this node (their cluster secrets "
                "differ): try another node, and tell the operator");
        fwd_fail(f, &err);
        fwd_free(f);
        return;
    }
    answer(p, f, (int)status);
    fwd_free(f);
}

/* A forward whose client has gone (a long-poll of a worker that died) is
 * abandoned, so that the leader sees its connection close and does not hand
 * work to nobody. Checked about once a second. */
static void drop_abandoned(Proxy *p, int64_t now)
{
    if (now < p->next_alive_check)
        return;
    p->next_alive_check = now + 1000;
    for (Fwd *f = p->flying, *next; f; f = next) {
        next = f->fly_next;
        if (!f->req || req_alive(f->req)) /* a call ends with its own answer */
            continue;
        curl_multi_remove_handle(p->multi, f->easy);
        fly_remove(p, f);
        Err err;
        err_set(&err, 503, "client-gone", "the client closed the connection");
        fwd_fail(f, &err);
        fwd_free(f);
    }
}

static void *proxy_main(void *arg)
{
    Proxy *p = arg;
    for (;;) {
        int64_t now = mono_ms();
        pthread_mutex_lock(&p->lock);
        if (atomic_load(&p->stopping) && !p->in_flight && !p->waiting && !p->incoming) {
            pthread_mutex_unlock(&p->lock);
            break;
        }
        Fwd *in = p->incoming;
        p->incoming = NULL;
        pthread_mutex_unlock(&p->lock);
        while (in) {
            Fwd *next = in->next;
            in->deadline = now + (in->within_ms ? in->within_ms : p->cfg.deadline_ms);
            try_send(p, in, now);
            in = next;
        }
        Fwd *w = p->waiting;
        p->waiting = NULL;
        int64_t next_wake = now + 1000;
        while (w) {
            Fwd *next = w->next;
            if (atomic_load(&p->stopping)) {
                fail_unreachable(p, w);
                fwd_free(w);
            } else if (w->next_try <= now) {
                try_send(p, w, now);
            } else {
                if (w->next_try < next_wake)
                    next_wake = w->next_try;
                w->next = p->waiting;
                p->waiting = w;
            }
            w = next;
        }
        drop_abandoned(p, now);
        int running;
        curl_multi_perform(p->multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(p->multi, &left)))
            if (msg->msg == CURLMSG_DONE)
                on_done(p, msg->easy_handle, msg->data.result, mono_ms());
        /* A retry on_done just scheduled may be due before the others. */
        for (const Fwd *f = p->waiting; f; f = f->next)
            if (f->next_try < next_wake)
                next_wake = f->next_try;
        int timeout = (int)(next_wake - mono_ms());
        if (p->waiting && timeout > 0)
            ; /* wait for the earliest retry */
        else if (p->waiting)
            timeout = 0;
        if (timeout < 0)
            timeout = 0;
        if (atomic_load(&p->stopping))
            timeout = timeout > 50 ? 50 : timeout;
        curl_multi_poll(p->multi, NULL, 0, timeout, NULL);
    }
    return NULL;
}

Proxy *proxy_start(const ProxyConfig *cfg, Err *err)
{
    Proxy *p = xcalloc(1, sizeof *p);
    p->cfg = *cfg;
    pthread_mutex_init(&p->lock, NULL);
    p->multi = curl_multi_init();
    curl_multi_setopt(p->multi, CURLMOPT_MAXCONNECTS, 256L);
    if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
        curl_multi_cleanup(p->multi);
        free(p);
        err_set(err, 500, "internal", "cannot start the proxy thread");
        return NULL;
    }
    return p;
}

void proxy_stop(Proxy *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stopping, true);
    pthread_mutex_unlock(&p->lock);
    curl_multi_wakeup(p->multi);
    pthread_join(p->thread, NULL);
}

void proxy_free(Proxy *p)
{
    if (!p)
        return;
    curl_multi_cleanup(p->multi);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static void add_header(Fwd *f, Req *r, const char *name)
{
    const char *v = req_header(r, name);
    if (!v)
        return;
    char line[1024];
    snprintf(line, sizeof line, "%s: %s", name, v);
    f->hdrs = curl_slist_append(f->hdrs, line);
}

typedef struct Query {
    SBuf *u;
    char sep; /* '?' before the first argument, '&' after */
} Query;

static void add_query(void *ud, const char *key, const char *value)
{
    Query *q = ud;
    if (!strcmp(key, "access_token"))
        return;
    char *k = curl_easy_escape(NULL, key, 0);
    sbuf_printf(q->u, "%c%s", q->sep, k);
    q->sep = '&';
    curl_free(k);
    if (value) {
        char *v = curl_easy_escape(NULL, value, 0);
        sbuf_printf(q->u, "=%s", v);
        curl_free(v);
    }
}

/* A forward of r to shard's leader, with body (NULL: the request's own). */
static Fwd *fwd_new(Proxy *p, int shard, Req *r, char *body)
{
    Fwd *f = xcalloc(1, sizeof *f);
    f->req = r;
    f->shard = shard;
    snprintf(f->method, sizeof f->method, "%s", r->method);
    sbuf_init(&f->resp);
    /* Rebuild path?query from the connection's arguments: every one (a
     * leader-only route must see what its client sent), but a token, which
     * goes on as a header below. */
    SBuf u;
    sbuf_init(&u);
    sbuf_puts(&u, r->path);
    req_query_each(r, add_query, &(Query){&u, '?'});
    f->url_path = sbuf_steal(&u);
    if (body) {
        f->body = body;
        f->body_len = strlen(body);
    } else if (r->body.len) {
        f->body = xmalloc(r->body.len + 1);
        memcpy(f->body, r->body.data, r->body.len + 1);
        f->body_len = r->body.len;
    }
    add_header(f, r, "Content-Type");
    /* The credentials this node checked are the ones the leader checks: a
     * bearer header, else an ?access_token= (sent on as a bearer header). */
    const char *auth = req_header(r, "Authorization");
    const char *tok = req_query(r, "access_token");
    bool bearer = auth && !strncasecmp(auth, "Bearer ", 7);
    if (auth && (bearer || !tok))
        add_header(f, r, "Authorization");
    if (tok && !bearer) {
        char line[600];
        snprintf(line, sizeof line, "Authorization: Bearer %s", tok);
        f->hdrs = curl_slist_append(f->hdrs, line);
    }
    /* Proof that a node of the cluster forwards (http.c checks it), and which. */
    char fwd[600];
    const char *secret = p->cfg.cluster_secret;
    snprintf(fwd, sizeof fwd, "X-Workd-Forwarded: %s%s%snode=%s", secret[0] ? "secret=" : "",
             secret, secret[0] ? "; " : "", p->cfg.node_id);
    f->hdrs = curl_slist_append(f->hdrs, fwd);
    explicit_bzero(fwd, sizeof fwd);
    if (leaderinfo_shards(p->cfg.leader) > 1) {
        char sh[40];
        snprintf(sh, sizeof sh, "X-Workd-Shard: %d", shard);
        f->hdrs = curl_slist_append(f->hdrs, sh);
    }
    f->hdrs = curl_slist_append(f->hdrs, "Expect:");
    return f;
}

/* Hands f to the proxy thread. */
static void fwd_send(Proxy *p, Fwd *f)
{
    atomic_fetch_add(&p->cfg.metrics->proxied, 1);
    pthread_mutex_lock(&p->lock);
    if (atomic_load(&p->stopping)) {
        pthread_mutex_unlock(&p->lock);
        fail_unreachable(p, f);
        fwd_free(f);
        return;
    }
    f->next = p->incoming;
    p->incoming = f;
    pthread_mutex_unlock(&p->lock);
    curl_multi_wakeup(p->multi);
}

void proxy_forward(Proxy *p, int shard, Req *r, char *body)
{
    fwd_send(p, fwd_new(p, shard, r, body));
}

void proxy_call(Proxy *p, int shard, Req *r, char *body, ProxyDone done, void *ud)
{
    proxy_call_within(p, shard, r, body, 0, done, ud);
}

void proxy_call_within(Proxy *p, int shard, Req *r, char *body, int64_t within_ms, ProxyDone done,
                       void *ud)
{
    Fwd *f = fwd_new(p, shard, r, body);
    f->done = done;
    f->done_ud = ud;
    f->within_ms = within_ms;
    f->req = NULL; /* r may be answered and gone before this call's answer */
    fwd_send(p, f);
}

bool proxy_shard_stuck(Proxy *p, int shard)
{
    return shard >= 0 && shard < SHARDS_MAX && mono_ms() < atomic_load(&p->stuck_until[shard]);
}
