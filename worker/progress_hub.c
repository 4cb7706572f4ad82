/* progress: see progress.h. */
#include "progress_hub.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "httpc.h"
#include "log.h"
#include "util.h"

#define SEND_TIMEOUT_MS 5000
#define MESSAGE_MAX 1024         /* the server's limit (parse_hooks.h) */
#define BATCH_MAX 256            /* updates in one request, unless the server wants fewer (413) */
#define BATCH_BYTES (256 * 1024) /* of messages and output in one request (at least one update) */
#define END_TRIES 3              /* psend_end: sends tried before what is left is dropped */
#define END_PAUSE_MS 1000        /* ... at most this far apart when the server is busy */

struct ProgressHub {
    Link *link;
    HttpClient *http; /* the hub's thread only */
    char *worker_id, *instance, *path;
    int64_t interval_ms;
    pthread_mutex_t lock; /* guards all below and every sender's state */
    pthread_cond_t wake;  /* the thread: something to send, or stop */
    pthread_cond_t sent;  /* psend_end: a request has ended */
    ProgressSender **senders;
    size_t n, cap;
    int64_t next_send;  /* mono ms: the interval since the last request */
    size_t batch_limit; /* updates per request: halved by a 413, doubled back */
    bool stop, started;
    pthread_t thread;
};

struct ProgressSender {
    ProgressHub *hub;
    /* the job (hub->lock) */
    char *work_id; /* NULL: no job */
    int64_t attempt;
    uint64_t gen; /* every begin and end bumps it: an answer for an older job is ignored */
    bool stopped; /* the server refused for good (413, 404, 409): nothing more is sent */
    bool has_fraction, fraction_new;
    double fraction;
    char *message; /* latest, not yet sent (NULL: none new) */
    SBuf output;   /* not yet sent */
    size_t dropped;
    bool in_flight;   /* a request carries some of what it said */
    int64_t retry_at; /* mono ms: the server asked to wait until then (429) */
    bool ending;      /* psend_end waits for it */
    int failures;     /* requests that did not take it since psend_end began */
};

/* What one request took from a sender (owned copies). */
typedef struct Taken {
    ProgressSender *p;
    uint64_t gen;
    char *work_id;
    int64_t attempt;
    bool fraction_new;
    char *message;
    SBuf output;
} Taken;

static bool pending(const ProgressSender *p)
{
    return p->fraction_new || p->message || p->output.len;
}

static void set_message(ProgressSender *p, const char *s, size_t n)
{
    if (n > MESSAGE_MAX) {
        n = MESSAGE_MAX;
        while (n && ((unsigned char)s[n] & 0xC0) == 0x80) /* not inside a character */
            n--;
    }
    free(p->message);
    p->message = exec_utf8_clean(s, n);
}

static void add_output(ProgressSender *p, const char *s, size_t n)
{
    if (p->output.len + n > PROGRESS_PENDING_MAX) {
        if (!p->dropped)
            log_warn("job %s attempt %lld: progress output comes faster than it can be sent; "
                     "dropping some",
                     p->work_id, (long long)p->attempt);
        p->dropped += n;
        return;
    }
    sbuf_append(&p->output, s, n);
}

static void set_fraction(ProgressSender *p, double f)
{
    if (!(f >= 0.0 && f <= 1.0))
        return;
    p->has_fraction = p->fraction_new = true;
    p->fraction = f;
}

/* One line from the job. */
static void take_line(ProgressSender *p, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    if (!len)
        return;
    if (line[0] == '{') {
        json_t *j = json_loadb(line, len, 0, NULL);
        if (json_is_object(j)) {
            json_t *f = json_object_get(j, "fraction"), *m = json_object_get(j, "message"),
                   *o = json_object_get(j, "output");
            if (json_is_number(f))
                set_fraction(p, json_number_value(f));
            if (json_is_string(m))
                set_message(p, json_string_value(m), json_string_length(m));
            if (json_is_string(o))
                add_output(p, json_string_value(o), json_string_length(o));
            json_decref(j);
            return;
        }
        json_decref(j);
    }
    char buf[32];
    if (len < sizeof buf) {
        memcpy(buf, line, len);
        buf[len] = '\0';
        char *end;
        double v = strtod(buf, &end);
        if (end != buf && *end == '%' && end[1] == '\0') {
            set_fraction(p, v / 100.0);
            return;
        }
        if (end != buf && *end == '\0') {
            set_fraction(p, v);
            return;
        }
    }
    set_message(p, line, len);
}

/* ---- the hub's thread ---- */

static bool sendable(const ProgressSender *p, int64_t now)
{
    return p->work_id && !p->stopped && !p->in_flight && pending(p) && p->retry_at <= now;
}

/* Takes what up to batch_limit senders have gathered (about BATCH_BYTES) into
 * t and the request's body; hub->lock held. Returns how many. */
static size_t take(ProgressHub *h, int64_t now, Taken *t, json_t *updates)
{
    size_t n = 0, bytes = 0;
    for (size_t i = 0; i < h->n && n < h->batch_limit && (n == 0 || bytes < BATCH_BYTES); i++) {
        ProgressSender *p = h->senders[i];
        if (!sendable(p, now))
            continue;
        bytes += p->output.len + (p->message ? strlen(p->message) : 0);
        json_t *u = json_pack("{s:s, s:I}", "id", p->work_id, "attempt", (json_int_t)p->attempt);
        if (p->has_fraction)
            json_object_set_new(u, "fraction", json_real(p->fraction));
        if (p->message)
            json_object_set_new(u, "message", json_string(p->message));
        if (p->output.len) {
            char *clean = exec_utf8_clean(p->output.data, p->output.len);
            json_object_set_new(u, "output", json_string(clean));
            free(clean);
        }
        json_array_append_new(updates, u);
        t[n] = (Taken){.p = p,
                       .gen = p->gen,
                       .work_id = xstrdup(p->work_id),
                       .attempt = p->attempt,
                       .fraction_new = p->fraction_new,
                       .message = p->message,
                       .output = p->output};
        p->message = NULL;
        sbuf_init(&p->output);
        p->fraction_new = false;
        p->in_flight = true;
        n++;
    }
    return n;
}

/* What a request took goes back in front of what came since (to be sent
 * again); hub->lock held. */
static void put_back(ProgressSender *p, Taken *t)
{
    p->fraction_new = p->fraction_new || t->fraction_new;
    if (!p->message) {
        p->message = t->message;
        t->message = NULL;
    }
    if (t->output.len) {
        if (t->output.len + p->output.len > PROGRESS_PENDING_MAX) {
            p->dropped += p->output.len;
            sbuf_reset(&p->output);
        }
        sbuf_append(&t->output, p->output.data, p->output.len);
        sbuf_free(&p->output);
        p->output = t->output;
        sbuf_init(&t->output);
    }
}

/* The verdict on one update: 0 taken, 1 to be sent again, -1 refused for good. */
typedef struct Verdict {
    int kind;
    int64_t retry_ms;
    char why[300];
} Verdict;

/* Sends the request; fills v[0..n) from the answer. A whole request refused
 * as too large is tried again in smaller ones (one update alone: dropped). */
static void send_updates(ProgressHub *h, json_t *updates, size_t n, Verdict *v)
{
    json_t *body = json_pack("{s:o}", "progress", updates);
    if (h->instance)
        json_object_set_new(body, "instance", json_string(h->instance));
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    char url[SERVERS_URL_MAX];
    link_url(h->link, h->path, url, sizeof url);
    HttpResp resp;
    Err err;
    err_clear(&err);
    int rc = httpc_request(h->http, "POST", url, text, SEND_TIMEOUT_MS, &resp, &err);
    free(text);
    json_t *ans = rc == 0 && resp.status == 200 ? json_loads(resp.body, 0, NULL) : NULL;
    json_t *results = json_object_get(ans, "results");
    for (size_t i = 0; i < n; i++) {
        v[i] = (Verdict){.kind = 1, .retry_ms = 0};
        if (rc != 0 || resp.status == 0) {
            snprintf(v[i].why, sizeof v[i].why, "%.290s", err.msg);
        } else if (resp.status == 429 || resp.status >= 500 || !json_is_array(results)) {
            link_describe(&resp, NULL, v[i].why, sizeof v[i].why);
            v[i].retry_ms = resp.retry_after_ms > 0 ? resp.retry_after_ms : 0;
            if (resp.status == 413 && n > 1)
                v[i].kind = 1;
            else if (resp.status < 500 && resp.status != 429 && resp.status != 200)
                v[i].kind = -1; /* the whole request was refused (400, 401, 403, 413) */
        } else {
            json_t *r = json_array_get(results, i);
            int st = (int)json_integer_value(json_object_get(r, "status"));
            if (json_is_true(json_object_get(r, "accepted")))
                v[i].kind = 0;
            else if (st != 429 && st < 500)
                v[i].kind = -1;
            else
                v[i].retry_ms = 1000;
            snprintf(v[i].why, sizeof v[i].why, "%.290s",
                     json_string_value(json_object_get(r, "detail"))
                         ? json_string_value(json_object_get(r, "detail"))
                         : "no answer for this update");
        }
    }
    pthread_mutex_lock(&h->lock);
    if (resp.status == 413 && n > 1)
        h->batch_limit = n / 2;
    else if (resp.status == 200 && h->batch_limit < BATCH_MAX)
        h->batch_limit = h->batch_limit * 2 < BATCH_MAX ? h->batch_limit * 2 : BATCH_MAX;
    pthread_mutex_unlock(&h->lock);
    json_decref(ans);
    httpc_resp_free(&resp);
}

/* The answers to a request, applied to its senders; hub->lock held. */
static void settle(ProgressHub *h, Taken *t, const Verdict *v, size_t n)
{
    int64_t now = mono_ms();
    for (size_t i = 0; i < n; i++) {
        ProgressSender *p = t[i].p;
        bool same = p->gen == t[i].gen;
        if (same) {
            p->in_flight = false;
            if (v[i].kind == 1) {
                put_back(p, &t[i]);
                p->retry_at = now + v[i].retry_ms;
                p->failures++;
                log_debug("job %s: progress not sent, kept for the next try: %s", t[i].work_id,
                          v[i].why);
            } else if (v[i].kind < 0) {
                log_warn("job %s attempt %lld: progress refused, sending no more for this "
                         "attempt: %s",
                         t[i].work_id, (long long)t[i].attempt, v[i].why);
                p->stopped = true;
            }
        }
        free(t[i].work_id);
        free(t[i].message);
        sbuf_free(&t[i].output);
    }
    h->next_send = now + h->interval_ms;
    pthread_cond_broadcast(&h->sent);
}

static void *hub_main(void *arg)
{
    ProgressHub *h = arg;
    Taken *t = xcalloc(BATCH_MAX, sizeof *t);
    Verdict *v = xcalloc(BATCH_MAX, sizeof *v);
    pthread_mutex_lock(&h->lock);
    while (!h->stop) {
        int64_t now = mono_ms(), wake_at = -1;
        bool due = false, ending = false;
        for (size_t i = 0; i < h->n; i++) {
            const ProgressSender *p = h->senders[i];
            if (sendable(p, now)) {
                due = true;
                ending = ending || p->ending;
            } else if (p->work_id && !p->stopped && !p->in_flight && pending(p) &&
                       (wake_at < 0 || p->retry_at < wake_at)) {
                wake_at = p->retry_at;
            }
        }
        if (!due || (!ending && now < h->next_send)) {
            /* Nothing yet, or the interval has not passed: what the job says
             * meanwhile is merged. A job that ends is sent at once. */
            cond_wait_until(&h->wake, &h->lock, due ? h->next_send : wake_at);
            continue;
        }
        json_t *updates = json_array();
        size_t n = take(h, now, t, updates);
        pthread_mutex_unlock(&h->lock);
        send_updates(h, updates, n, v);
        pthread_mutex_lock(&h->lock);
        settle(h, t, v, n);
    }
    pthread_mutex_unlock(&h->lock);
    free(t);
    free(v);
    return NULL;
}

/* ---- the hub ---- */

ProgressHub *phub_new(Link *link, const char *token, const char *worker_id, const char *instance,
                      int64_t interval_ms)
{
    ProgressHub *h = xcalloc(1, sizeof *h);
    h->link = link;
    h->http = httpc_new(token);
    h->worker_id = xstrdup(worker_id);
    h->instance = xstrdup(instance);
    SBuf path;
    sbuf_init(&path);
    sbuf_printf(&path, "/workers/%s/progress", worker_id);
    h->path = sbuf_steal(&path);
    h->interval_ms = interval_ms;
    h->batch_limit = BATCH_MAX;
    pthread_mutex_init(&h->lock, NULL);
    cond_init_mono(&h->wake);
    cond_init_mono(&h->sent);
    return h;
}

int phub_start(ProgressHub *h, Err *err)
{
    int rc = pthread_create(&h->thread, NULL, hub_main, h);
    if (rc != 0)
        return err_set(err, 500, "internal", "cannot start the progress thread: %s", strerror(rc));
    h->started = true;
    return 0;
}

void phub_stop(ProgressHub *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->lock);
    h->stop = true;
    pthread_cond_broadcast(&h->wake);
    pthread_cond_broadcast(&h->sent);
    pthread_mutex_unlock(&h->lock);
    if (h->started) {
        pthread_join(h->thread, NULL);
        h->started = false;
    }
}

void phub_free(ProgressHub *h)
{
    if (!h)
        return;
    phub_stop(h);
    httpc_free(h->http);
    free(h->senders);
    free(h->worker_id);
    free(h->instance);
    free(h->path);
    pthread_cond_destroy(&h->wake);
    pthread_cond_destroy(&h->sent);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* ---- senders ---- */

ProgressSender *psend_new(ProgressHub *h)
{
    ProgressSender *p = xcalloc(1, sizeof *p);
    p->hub = h;
    sbuf_init(&p->output);
    pthread_mutex_lock(&h->lock);
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 16;
        h->senders = xrealloc(h->senders, h->cap * sizeof *h->senders);
    }
    h->senders[h->n++] = p;
    pthread_mutex_unlock(&h->lock);
    return p;
}

/* Forgets the job; hub->lock held. */
static void reset(ProgressSender *p)
{
    free(p->work_id);
    p->work_id = NULL;
    free(p->message);
    p->message = NULL;
    sbuf_reset(&p->output);
    p->has_fraction = p->fraction_new = p->stopped = p->ending = p->in_flight = false;
    p->dropped = 0;
    p->retry_at = 0;
    p->failures = 0;
    p->gen++;
}

void psend_free(ProgressSender *p)
{
    if (!p)
        return;
    ProgressHub *h = p->hub;
    pthread_mutex_lock(&h->lock);
    reset(p);
    for (size_t i = 0; i < h->n; i++)
        if (h->senders[i] == p) {
            h->senders[i] = h->senders[--h->n];
            break;
        }
    pthread_mutex_unlock(&h->lock);
    sbuf_free(&p->output);
    free(p);
}

void psend_begin(ProgressSender *p, const char *work_id, int64_t attempt)
{
    pthread_mutex_lock(&p->hub->lock);
    reset(p);
    p->work_id = xstrdup(work_id);
    p->attempt = attempt;
    pthread_mutex_unlock(&p->hub->lock);
}

void psend_line(void *ud, const char *line, size_t len)
{
    ProgressSender *p = ud;
    if (!line)
        return;
    ProgressHub *h = p->hub;
    pthread_mutex_lock(&h->lock);
    if (p->work_id && !p->stopped) {
        bool was = pending(p);
        take_line(p, line, len);
        if (!was && pending(p))
            pthread_cond_signal(&h->wake);
    }
    pthread_mutex_unlock(&h->lock);
}

void psend_end(ProgressSender *p)
{
    ProgressHub *h = p->hub;
    pthread_mutex_lock(&h->lock);
    p->ending = true;
    p->failures = 0;
    int64_t give_up = mono_ms() + END_TRIES * (SEND_TIMEOUT_MS + END_PAUSE_MS);
    while (h->started && !h->stop && p->work_id && !p->stopped && (pending(p) || p->in_flight) &&
           p->failures < END_TRIES && mono_ms() < give_up) {
        if (p->retry_at > mono_ms() + END_PAUSE_MS) /* a busy server: try again sooner */
            p->retry_at = mono_ms() + END_PAUSE_MS;
        pthread_cond_signal(&h->wake);
        cond_wait_until(&h->sent, &h->lock, give_up);
    }
    reset(p);
    pthread_mutex_unlock(&h->lock);
}
