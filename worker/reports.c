/* reports: see reports.h. Reports wait in a FIFO array; the sending thread
 * always sends the oldest ones first and is the only one that removes any
 * (a pull that carries some only marks them: carried, then done). */
#include "reports.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "httpc.h"
#include "log.h"
#include "util.h"

#define BATCH_MAX 100            /* reports per request, unless the server wants fewer (413) */
#define BATCH_BYTES (256 * 1024) /* body size per request (at least one report) */
#define REQUEST_TIMEOUT_MS 10000
#define RETRY_AFTER_CAP_MS 60000
/* While the puller is about to ask for jobs (reporter_carrier), a new report
 * waits this long for it to carry the report: one exchange, not two. */
#define CARRY_MS 20

typedef struct Report {
    char *id;
    int64_t attempt;
    char *json; /* the report object, serialised once */
    size_t json_len;
    bool warned;    /* a refusal of it was logged already */
    bool too_large; /* it replaces a report the server found too large */
    int64_t added;  /* mono ms */
    bool sending;   /* in the sending thread's batch */
    bool carried;   /* in a pull's exchange (reporter_take) */
    bool done;      /* settled by a pull's answer: removed by the sending thread */
} Report;

struct Reporter {
    char *path;
    char *instance;   /* sent with every batch: the server binds a report to its sender */
    HttpClient *http; /* used by the sending thread only */
    Link *link;
    atomic_bool stop; /* also cancels the request in flight */
    pthread_t thread;
    bool started;

    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t cond;  /* broadcast on a new report, an answer, stop */
    Report *items;
    size_t len, cap;
    int64_t retry_at;   /* mono_ms() before which nothing is sent (backoff) */
    size_t batch_limit; /* reports per request: halved on 413, grows back on success */
    Backoff backoff;
    _Atomic int64_t *carrier; /* reporter_carrier's; NULL: none */
};

static void report_free(Report *p)
{
    free(p->id);
    free(p->json);
}

Reporter *reporter_new(const char *path, const char *token, const char *instance, Link *link)
{
    Reporter *r = xcalloc(1, sizeof *r);
    r->path = xstrdup(path);
    r->instance = xstrdup(instance);
    r->http = httpc_new(token);
    httpc_set_cancel(r->http, &r->stop);
    r->link = link;
    atomic_init(&r->stop, false);
    pthread_mutex_init(&r->lock, NULL);
    cond_init_mono(&r->cond);
    backoff_init(&r->backoff, 100, 5000);
    r->batch_limit = BATCH_MAX;
    return r;
}

void reporter_add(Reporter *r, const char *id, int64_t attempt, const ExecOutcome *o)
{
    json_t *j;
    if (o->ok)
        j = json_pack("{s:s, s:I, s:s, s:O}", "id", id, "attempt", (json_int_t)attempt, "outcome",
                      "completed", "result", o->result ? o->result : json_null());
    else
        j = json_pack("{s:s, s:I, s:s, s:s, s:b}", "id", id, "attempt", (json_int_t)attempt,
                      "outcome", "failed", "error", o->error ? o->error : "failed", "retry",
                      o->retry);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        /* Only when the strings are not UTF-8, which exec and pull rule out. */
        log_error("job %s attempt %lld: cannot encode its report; the server will retry it", id,
                  (long long)attempt);
        return;
    }
    pthread_mutex_lock(&r->lock);
    if (r->len == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->items = xrealloc(r->items, r->cap * sizeof *r->items);
    }
    r->items[r->len++] = (Report){.id = xstrdup(id),
                                  .attempt = attempt,
                                  .json = s,
                                  .json_len = strlen(s),
                                  .added = mono_ms()};
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

void reporter_list(Reporter *r, json_t *arr)
{
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->len; i++)
        if (!r->items[i].done)
            json_array_append_new(arr, json_pack("{s:s, s:I}", "id", r->items[i].id, "attempt",
                                                 (json_int_t)r->items[i].attempt));
    pthread_mutex_unlock(&r->lock);
}

void reporter_carrier(Reporter *r, _Atomic int64_t *pull_since)
{
    pthread_mutex_lock(&r->lock);
    r->carrier = pull_since;
    pthread_mutex_unlock(&r->lock);
}

/* Whether items[i] may go in a batch (of either sender). */
static bool free_to_send(const Report *p)
{
    return !p->sending && !p->carried && !p->done;
}

size_t reporter_take(Reporter *r, size_t max, SBuf *out, ReportKey **keys)
{
    *keys = NULL;
    size_t n = 0, bytes = 0;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->len && n < max && bytes < BATCH_BYTES; i++) {
        Report *p = &r->items[i];
        if (!free_to_send(p) || p->too_large)
            continue;
        *keys = xrealloc(*keys, (n + 1) * sizeof **keys);
        (*keys)[n] = (ReportKey){.id = xstrdup(p->id), .attempt = p->attempt};
        if (n)
            sbuf_puts(out, ",");
        sbuf_append(out, p->json, p->json_len);
        bytes += p->json_len;
        p->carried = true;
        n++;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* Logs what became of a report the server answered for good. */
static void settled(const ReportKey *k, const ReportAnswer *a)
{
    if (a->verdict == REPORT_SUPERSEDED)
        log_warn("job %s attempt %lld: result dropped: %s", k->id, (long long)k->attempt,
                 !strcmp(a->reason, "not-found")    ? "the work does not exist"
                 : !strcmp(a->reason, "not-holder") ? "another worker holds the attempt"
                                                    : "the attempt was superseded");
    else
        log_debug("job %s attempt %lld: report acknowledged", k->id, (long long)k->attempt);
}

void reporter_settle(Reporter *r, ReportKey *keys, size_t n, const ReportAnswer *answers)
{
    pthread_mutex_lock(&r->lock);
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < r->len; i++) {
            Report *p = &r->items[i];
            if (!p->carried || p->attempt != keys[k].attempt || strcmp(p->id, keys[k].id) != 0)
                continue;
            p->carried = false;
            if (answers && answers[k].verdict != REPORT_RETRY) {
                settled(&keys[k], &answers[k]);
                p->done = true;
            }
            break;
        }
        free((char *)keys[k].id);
    }
    free(keys);
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

/* Removes the reports that are done; r->lock held, by the sending thread. */
static void compact(Reporter *r)
{
    size_t kept = 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->items[i].done)
            report_free(&r->items[i]);
        else
            r->items[kept++] = r->items[i];
    }
    if (kept != r->len)
        pthread_cond_broadcast(&r->cond);
    r->len = kept;
}

/* Reports not acknowledged yet; r->lock held. */
static size_t pending(const Reporter *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->len; i++)
        n += !r->items[i].done;
    return n;
}

size_t reporter_flush(Reporter *r, int64_t timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    pthread_mutex_lock(&r->lock);
    size_t n;
    while ((n = pending(r)) > 0 && mono_ms() < deadline && !atomic_load(&r->stop))
        cond_wait_until(&r->cond, &r->lock, deadline);
    pthread_mutex_unlock(&r->lock);
    return n;
}

int reports_read_answer(const char *body, const ReportKey *keys, size_t n, ReportAnswer *answers,
                        Err *err)
{
    json_error_t je;
    json_t *root = json_loads(body ? body : "", 0, &je);
    json_t *results = json_object_get(root, "results");
    if (!json_is_array(results)) {
        json_decref(root);
        return err_set(err, 502, "bad-answer", "the answer to a report batch has no results array");
    }
    for (size_t i = 0; i < n; i++) {
        ReportAnswer *a = &answers[i];
        json_t *e = json_array_get(results, i);
        const char *id = json_string_value(json_object_get(e, "id"));
        json_t *att = json_object_get(e, "attempt");
        json_t *acc = json_object_get(e, "accepted");
        const char *reason = json_string_value(json_object_get(e, "reason"));
        a->verdict = REPORT_RETRY;
        a->reason[0] = '\0';
        if (!e)
            snprintf(a->reason, sizeof a->reason, "no entry %zu in the answer", i);
        else if (!id || strcmp(id, keys[i].id) != 0 || !json_is_integer(att) ||
                 json_integer_value(att) != keys[i].attempt)
            snprintf(a->reason, sizeof a->reason, "entry %zu of the answer is another attempt", i);
        else if (!json_is_boolean(acc))
            snprintf(a->reason, sizeof a->reason, "entry %zu of the answer has no accepted", i);
        else if (json_is_true(acc))
            a->verdict = REPORT_ACCEPTED;
        else if (reason && (!strcmp(reason, "superseded") || !strcmp(reason, "cancelled") ||
                            !strcmp(reason, "not-found") || !strcmp(reason, "not-holder"))) {
            /* Final refusals: the attempt lost, was cancelled, the work does
             * not exist, or another worker (or instance) holds the attempt. */
            a->verdict = REPORT_SUPERSEDED;
            snprintf(a->reason, sizeof a->reason, "%s", reason);
        } else
            snprintf(a->reason, sizeof a->reason, "refused: %.80s", reason ? reason : "no reason");
    }
    json_decref(root);
    return 0;
}

/* Sends items [0, n) (a copy of their keys and bodies, taken under the lock)
 * and fills answers and *status (0: no answer). Returns the delay the server
 * asked for, or 0. */
static int64_t send_batch(Reporter *r, const ReportKey *keys, char *body, size_t n,
                          ReportAnswer *answers, long *status)
{
    *status = 0;
    for (size_t i = 0; i < n; i++)
        answers[i] = (ReportAnswer){.verdict = REPORT_RETRY};
    HttpResp resp;
    Err err;
    err_clear(&err);
    int64_t retry_after = 0;
    char why[600], url[SERVERS_URL_MAX];
    size_t pos = link_url(r->link, r->path, url, sizeof url);
    if (httpc_request(r->http, "POST", url, body, REQUEST_TIMEOUT_MS, &resp, &err) != 0) {
        if (!atomic_load(&r->stop)) {
            link_describe(NULL, &err, why, sizeof why);
            link_unreachable(r->link, LINK_REPORTS, pos, why);
        }
        return 0;
    }
    *status = resp.status;
    if (resp.status == 200 && reports_read_answer(resp.body, keys, n, answers, &err) == 0) {
        link_ok(r->link, LINK_REPORTS);
    } else if (resp.status == 413) {
        /* Too large (bytes or count): the caller splits the batch. */
    } else {
        link_describe(&resp, NULL, why, sizeof why);
        if (resp.status == 200)
            snprintf(why, sizeof why, "HTTP 200: %s", err.msg);
        link_refused(r->link, LINK_REPORTS, resp.status, why);
        if (resp.retry_after_ms > 0)
            retry_after = resp.retry_after_ms;
    }
    httpc_resp_free(&resp);
    return retry_after < RETRY_AFTER_CAP_MS ? retry_after : RETRY_AFTER_CAP_MS;
}

/* The server refused a batch of n as too large (413); r->lock held. A batch is
 * split; a single report (items[at]) cannot be, so its attempt is reported
 * failed instead (retry false: another attempt would produce the same result). */
static void shrink(Reporter *r, size_t n, size_t at)
{
    r->retry_at = 0;
    if (n > 1) {
        r->batch_limit = n / 2;
        log_debug("reports: the server found %zu reports too large; sending %zu at a time", n,
                  r->batch_limit);
        return;
    }
    Report *p = &r->items[at];
    if (p->too_large) {
        log_error("job %s attempt %lld: even its failure report is too large for the server; "
                  "dropped, the server will retry the work",
                  p->id, (long long)p->attempt);
        p->done = true;
        return;
    }
    char error[160];
    snprintf(error, sizeof error,
             "the report (%zu bytes) is larger than the server accepts (HTTP 413)", p->json_len);
    log_warn("job %s attempt %lld: %s; reporting it failed", p->id, (long long)p->attempt, error);
    json_t *j = json_pack("{s:s, s:I, s:s, s:s, s:b}", "id", p->id, "attempt",
                          (json_int_t)p->attempt, "outcome", "failed", "error", error, "retry", 0);
    free(p->json);
    p->json = json_dumps(j, JSON_COMPACT);
    p->json_len = strlen(p->json);
    p->too_large = true;
    json_decref(j);
}

/* When the oldest report free to send may go: now, or once the next pull
 * has had CARRY_MS to carry it, unless the pull in flight is a long poll
 * (-1: none to send); r->lock held. */
static int64_t next_send(const Reporter *r)
{
    for (size_t i = 0; i < r->len; i++)
        if (free_to_send(&r->items[i])) {
            int64_t since = r->carrier ? atomic_load(r->carrier) : -1;
            bool coming = since == 0 || (since > 0 && mono_ms() - since < CARRY_MS);
            int64_t at = coming ? r->items[i].added + CARRY_MS : 0;
            return at > r->retry_at ? at : r->retry_at;
        }
    return -1;
}

static void *reporter_main(void *arg)
{
    Reporter *r = arg;
    ReportKey *keys = xcalloc(BATCH_MAX, sizeof *keys);
    ReportAnswer *answers = xcalloc(BATCH_MAX, sizeof *answers);
    size_t *at = xcalloc(BATCH_MAX, sizeof *at);
    SBuf body;
    sbuf_init(&body);
    pthread_mutex_lock(&r->lock);
    while (!atomic_load(&r->stop)) {
        compact(r);
        int64_t when = next_send(r);
        if (when < 0 || mono_ms() < when) {
            cond_wait_until(&r->cond, &r->lock, when);
            continue;
        }
        /* Take the oldest reports free to send. Only this thread removes
         * any, so their indices hold while the lock is released; their ids
         * are copied because the array itself may move (xrealloc). */
        size_t n = 0;
        sbuf_reset(&body);
        sbuf_printf(&body, "{\"instance\":\"%s\",\"reports\":[", r->instance);
        for (size_t i = 0; i < r->len && n < r->batch_limit; i++) {
            Report *p = &r->items[i];
            if (!free_to_send(p))
                continue;
            if (n && body.len + p->json_len >= BATCH_BYTES)
                break;
            if (n)
                sbuf_puts(&body, ",");
            sbuf_append(&body, p->json, p->json_len);
            keys[n] = (ReportKey){.id = xstrdup(p->id), .attempt = p->attempt};
            p->sending = true;
            at[n++] = i;
        }
        sbuf_puts(&body, "]}");
        pthread_mutex_unlock(&r->lock);

        long status;
        int64_t asked = send_batch(r, keys, body.data, n, answers, &status);

        pthread_mutex_lock(&r->lock);
        for (size_t i = 0; i < n; i++)
            r->items[at[i]].sending = false;
        if (status == 413) {
            shrink(r, n, at[0]);
            for (size_t i = 0; i < n; i++)
                free((char *)keys[i].id);
            continue;
        }
        bool retry = false;
        for (size_t i = 0; i < n; i++) {
            Report *p = &r->items[at[i]];
            if (answers[i].verdict == REPORT_RETRY) {
                if (answers[i].reason[0] && !p->warned) {
                    /* Said once per report: it is kept and sent again. */
                    log_warn("job %s attempt %lld: report not accepted (%s); will retry",
                             keys[i].id, (long long)keys[i].attempt, answers[i].reason);
                    p->warned = true;
                }
                retry = true;
            } else {
                settled(&keys[i], &answers[i]);
                p->done = true;
            }
            free((char *)keys[i].id);
        }
        if (retry) {
            int64_t d = backoff_next(&r->backoff);
            r->retry_at = mono_ms() + (asked > d ? asked : d);
        } else {
            backoff_reset(&r->backoff);
            r->retry_at = 0;
            if (r->batch_limit < BATCH_MAX)
                r->batch_limit = r->batch_limit * 2 < BATCH_MAX ? r->batch_limit * 2 : BATCH_MAX;
        }
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    sbuf_free(&body);
    free(keys);
    free(answers);
    free(at);
    return NULL;
}

int reporter_start(Reporter *r, Err *err)
{
    int rc = pthread_create(&r->thread, NULL, reporter_main, r);
    if (rc != 0)
        return err_set(err, 500, "internal", "cannot start the reporter thread: %s", strerror(rc));
    r->started = true;
    return 0;
}

void reporter_stop(Reporter *r)
{
    pthread_mutex_lock(&r->lock);
    atomic_store(&r->stop, true);
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    if (r->started) {
        pthread_join(r->thread, NULL);
        r->started = false;
    }
    pthread_mutex_lock(&r->lock);
    compact(r);
    if (r->len > 0) {
        SBuf which;
        sbuf_init(&which);
        for (size_t i = 0; i < r->len && i < 10; i++)
            sbuf_printf(&which, "%s%s attempt %lld", i ? ", " : "", r->items[i].id,
                        (long long)r->items[i].attempt);
        log_warn("%zu result(s) never acknowledged (%s%s); the server will run that work again",
                 r->len, which.data, r->len > 10 ? ", ..." : "");
        sbuf_free(&which);
        for (size_t i = 0; i < r->len; i++)
            report_free(&r->items[i]);
        r->len = 0;
    }
    pthread_mutex_unlock(&r->lock);
}

void reporter_free(Reporter *r)
{
    if (!r)
        return;
    reporter_stop(r);
    httpc_free(r->http);
    free(r->items);
    free(r->path);
    free(r->instance);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
