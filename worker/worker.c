/* worker: see worker.h. Threads, each with its own HttpClient where it talks to
 * the server: heartbeat (PUT /workers/{id}), pull (long-poll), reporter
 * (reports.c), one executor per slot, and a stopper that carries out a stop.
 *
 * Jobs a pull brings wait in one queue (w->queue) for the slots, which take
 * them in turn: a slot that ends a job takes the next one without sleeping,
 * and sleeping slots are woken one at a time (slot_main says when), so a
 * pull of many short jobs does not cost a thread switch per job.
 *
 * Locks: w->lock guards the slots' jobs, the queue and the fields marked
 * below. Order: w->lock, then an ExecCtl's lock or the reporter's lock; never
 * the reverse. */
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "demo.h"
#include "exec.h"
#include "httpc.h"
#include "link.h"
#include "log.h"
#include "trace.h"
#include "progress_hub.h"
#include "reports.h"
#include "servers.h"
#include "util.h"

#define HEARTBEAT_DEFAULT_MS 2000 /* until the server says otherwise */
#define HEARTBEAT_TIMEOUT_MS 5000
#define PULL_SLACK_MS 15000    /* HTTP timeout of a pull beyond the wait asked for */
#define EMPTY_PULL_MIN_MS 1000 /* an empty answer sooner than this: wait the rest */
#define GATHER_MS 1            /* all slots were busy: wait this long for more to free */
#define CARRY_MAX 100          /* reports a pull carries at most (the worker's exchange) */
#define RETRY_AFTER_CAP_MS 60000
#define FLUSH_TIMEOUT_MS 10000      /* graceful stop: how long to try delivering reports */
#define DEREGISTER_TIMEOUT_MS 10000 /* graceful stop: how long to try deregistering */
#define DEREGISTER_TRY_MS 3000      /* ... in tries of at most this long */
#define DEREGISTER_PAUSE_MS 200
#define SLOT_STACK (1024 * 1024)

typedef struct Job {
    struct Job *next; /* w->lock: in w->queue */
    char *id;
    int64_t attempt;
    bool cancelled; /* w->lock: the server ended the attempt; stop it, report nothing */
    char *queue;
    json_t *payload;                /* owned reference */
    int64_t timeout_ms;             /* <= 0: none */
    char *traceparent, *tracestate; /* the producer's trace context; NULL: none */
} Job;

typedef struct Slot {
    struct Worker *w;
    pthread_t thread;
    bool started;
    Job *job;  /* w->lock: the job this slot runs, NULL when idle */
    bool quit; /* w->lock */
    ExecCtl ctl;
    bool ctl_ready;
    ProgressSender *progress; /* WORK_EXEC: the job's progress (w->progress sends it) */
} Slot;

struct Worker {
    /* Configuration, owned copies; read-only once threads run. */
    WorkerConfig cfg;
    char *server, *id, *token, *exec_cmd;
    char **queues;
    char instance[37];
    Servers *servers; /* the list in cfg.server; the link sends to one of them */
    char *path_worker, *path_pull, *path_reports;
    char **env_base; /* our environment minus the worker's own WORKD_* settings */

    Link link;
    Reporter *reporter;
    ProgressHub *progress; /* WORK_EXEC: sends what the jobs say */
    Slot *slots;
    int nslots;

    pthread_mutex_t lock;
    pthread_cond_t cond;        /* broadcast: a slot freed, registered, stop requested */
    pthread_cond_t hb_cond;     /* the heartbeat thread sleeps here */
    int free_slots;             /* w->lock: slots neither running a job nor owed one by the queue */
    Job *queue, *queue_tail;    /* w->lock: pulled jobs no slot has taken yet, oldest first */
    pthread_cond_t job_cond;    /* with w->lock: idle slots sleep here (a job, or quit) */
    int idle;                   /* w->lock: slots asleep on job_cond */
    int waking;                 /* w->lock: of them, signalled and not awake yet */
    bool registered;            /* w->lock: a heartbeat succeeded */
    bool stop_requested;        /* w->lock */
    bool failed;                /* w->lock: stopped by a refusal that retrying cannot mend */
    int64_t hb_interval_ms;     /* w->lock */
    atomic_bool pull_stop;      /* ends the pull thread and cancels its long-poll */
    _Atomic int64_t pull_since; /* mono ms the pull in flight was sent; 0: none */
    bool no_exchange;           /* pull thread: the server takes no reports in a pull (older) */
    atomic_bool hb_stop;        /* ends the heartbeat thread */

    pthread_t hb_thread, pull_thread, stop_thread;
    bool hb_started, pull_started, stop_started;
    bool guarded; /* started the exec guard (exec.h) */
    int done_rd, done_wr;
};

/* ---- small helpers ---- */

static char *url_join(const char *base, const char *a, const char *b, const char *c)
{
    SBuf s;
    sbuf_init(&s);
    sbuf_printf(&s, "%s%s%s%s", base, a, b ? b : "", c ? c : "");
    return sbuf_steal(&s);
}

static void job_free(Job *j)
{
    if (!j)
        return;
    free(j->id);
    free(j->queue);
    json_decref(j->payload);
    free(j->traceparent);
    free(j->tracestate);
    free(j);
}

/* Copies s into out (size n) on one line, cut with "..." past n-4 bytes, never
 * in the middle of a UTF-8 character. For log lines. */
static void abbreviate(const char *s, char *out, size_t n)
{
    size_t len = strlen(s), j = 0;
    bool cut = len > n - 1;
    size_t keep = cut ? n - 4 : len;
    if (cut)
        while (keep > 0 && ((unsigned char)s[keep] & 0xC0) == 0x80)
            keep--;
    for (size_t i = 0; i < keep; i++)
        out[j++] = (s[i] == '\n' || s[i] == '\r' || s[i] == '\t') ? ' ' : s[i];
    if (cut) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = '\0';
}

static json_t *queues_json(const Worker *w)
{
    json_t *a = json_array();
    for (size_t i = 0; w->queues[i]; i++)
        json_array_append_new(a, json_string(w->queues[i]));
    return a;
}

/* A refusal no retry can mend (a wrong token, or one without the worker
 * scope)? Then says so once and stops the worker, which exits with an error
 * instead of retrying forever. Returns whether it was one. */
static bool refused_for_good(Worker *w, long status, const char *why)
{
    if (status != 401 && status != 403)
        return false;
    pthread_mutex_lock(&w->lock);
    if (!w->failed) {
        w->failed = true;
        log_error("%s: the token (--token or WORKD_TOKEN) %s; stopping", why,
                  status == 403 ? "lacks the worker scope" : "is missing or wrong");
        w->stop_requested = true;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return true;
}

/* ---- heartbeat ---- */

/* Appends {id, attempt} of j to the array a (nothing if j is NULL). */
static void attempt_append(json_t *a, const Job *j)
{
    if (j)
        json_array_append_new(
            a, json_pack("{s:s, s:I}", "id", j->id, "attempt", (json_int_t)j->attempt));
}

/* The body of PUT /workers/{id}. w->lock held. Running attempts include those
 * whose report is not yet acknowledged, so that their leases stay alive. */
static char *heartbeat_body(Worker *w)
{
    json_t *running = json_array();
    for (int i = 0; i < w->nslots; i++)
        attempt_append(running, w->slots[i].job);
    for (const Job *j = w->queue; j; j = j->next) /* queued: the server counts them started */
        attempt_append(running, j);
    size_t in_slots = json_array_size(running);
    json_t *pending = json_array();
    reporter_list(w->reporter, pending);
    size_t k;
    json_t *p;
    json_array_foreach(pending, k, p)
    {
        bool dup = false;
        for (size_t i = 0; i < in_slots && !dup; i++)
            dup = json_equal(json_array_get(running, i), p);
        if (!dup)
            json_array_append(running, p);
    }
    json_decref(pending);
    json_t *body = json_pack("{s:s, s:i, s:o}", "instance", w->instance, "capacity", w->nslots,
                             "running", running);
    if (w->queues[0])
        json_object_set_new(body, "queues", queues_json(w));
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return s;
}

int64_t worker_read_heartbeat_answer(const char *body, int64_t interval)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *iv = json_object_get(j, "heartbeat_interval_ms");
    if (json_is_integer(iv)) {
        int64_t v = json_integer_value(iv);
        interval = v < 100 ? 100 : v > 60000 ? 60000 : v;
    }
    json_decref(j);
    return interval;
}

/* The heartbeat's answer lists attempts that are no longer current (an
 * operator cancelled the work, or its lease ran out): the slots running them
 * stop their jobs (SIGTERM to the process group, SIGKILL after the grace). */
static void stop_cancelled(Worker *w, const char *body)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *cancel = json_object_get(j, "cancel");
    size_t i;
    json_t *c;
    pthread_mutex_lock(&w->lock);
    json_array_foreach(cancel, i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        json_int_t attempt = json_integer_value(json_object_get(c, "attempt"));
        for (int k = 0; id && k < w->nslots; k++) {
            Job *job = w->slots[k].job;
            if (job && !job->cancelled && job->attempt == attempt && !strcmp(job->id, id)) {
                job->cancelled = true;
                log_info("job %s attempt %lld cancelled by the server: stopping it", id,
                         (long long)attempt);
                if (w->slots[k].ctl_ready)
                    exec_ctl_stop(&w->slots[k].ctl, false);
            }
        }
        for (Job *job = w->queue; id && job; job = job->next)
            if (!job->cancelled && job->attempt == attempt && !strcmp(job->id, id)) {
                job->cancelled = true; /* a slot drops it instead of starting it */
                log_info("job %s attempt %lld cancelled by the server before it started", id,
                         (long long)attempt);
            }
    }
    pthread_mutex_unlock(&w->lock);
    json_decref(j);
}

/* Sends one heartbeat; returns when the next one is due, in ms from now. */
static int64_t heartbeat_send(Worker *w, HttpClient *http, const char *body, Backoff *b,
                              int64_t interval)
{
    HttpResp resp;
    Err err;
    err_clear(&err);
    char why[600], url[SERVERS_URL_MAX];
    size_t pos = link_url(&w->link, w->path_worker, url, sizeof url);
    if (httpc_request(http, "PUT", url, body, HEARTBEAT_TIMEOUT_MS, &resp, &err) != 0) {
        if (atomic_load(&w->hb_stop))
            return 0;
        link_describe(NULL, &err, why, sizeof why);
        link_unreachable(&w->link, LINK_HEARTBEAT, pos, why);
        int64_t d = backoff_next(b);
        return d < interval ? d : interval;
    }
    if (resp.status != 200) {
        link_describe(&resp, NULL, why, sizeof why);
        if (!refused_for_good(w, resp.status, why))
            link_refused(&w->link, LINK_HEARTBEAT, resp.status, why);
        int64_t d = backoff_next(b);
        if (resp.retry_after_ms > d)
            d = resp.retry_after_ms;
        httpc_resp_free(&resp);
        return d < interval ? d : interval;
    }
    interval = worker_read_heartbeat_answer(resp.body, interval);
    stop_cancelled(w, resp.body);
    httpc_resp_free(&resp);
    link_ok(&w->link, LINK_HEARTBEAT);
    backoff_reset(b);

    pthread_mutex_lock(&w->lock);
    w->hb_interval_ms = interval;
    if (!w->registered) {
        w->registered = true;
        url[strlen(url) - strlen(w->path_worker)] = '\0';
        log_info("registered with %s as %s (capacity %d)", url, w->id, w->nslots);
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return interval;
}

static void *heartbeat_main(void *arg)
{
    Worker *w = arg;
    HttpClient *http = httpc_new(w->token);
    httpc_set_cancel(http, &w->hb_stop);
    Backoff b;
    backoff_init(&b, 100, 5000);
    int64_t next = mono_ms();
    pthread_mutex_lock(&w->lock);
    while (!atomic_load(&w->hb_stop)) {
        if (mono_ms() < next) {
            cond_wait_until(&w->hb_cond, &w->lock, next);
            continue;
        }
        char *body = heartbeat_body(w);
        int64_t interval = w->hb_interval_ms;
        pthread_mutex_unlock(&w->lock);
        int64_t delay = heartbeat_send(w, http, body, &b, interval);
        free(body);
        pthread_mutex_lock(&w->lock);
        next = mono_ms() + delay;
    }
    pthread_mutex_unlock(&w->lock);
    httpc_free(http);
    return NULL;
}

/* ---- pull ---- */

/* Reads one job of a pull answer; NULL (logged) if it cannot be run or reported. */
static Job *job_parse(const json_t *o)
{
    const char *id = json_string_value(json_object_get(o, "id"));
    json_t *att = json_object_get(o, "attempt");
    if (!id || !work_id_valid(id) || !json_is_integer(att)) {
        log_error("pull: ignoring a job without a valid id and attempt");
        return NULL;
    }
    Job *j = xcalloc(1, sizeof *j);
    j->id = xstrdup(id);
    j->attempt = json_integer_value(att);
    const char *q = json_string_value(json_object_get(o, "queue"));
    j->queue = xstrdup(q ? q : "");
    json_t *payload = json_object_get(o, "payload");
    j->payload = payload ? json_incref(payload) : json_null();
    /* Checked again here: only a W3C value goes into a job's environment. */
    j->traceparent = xstrdup(json_string_value(json_object_get(o, "traceparent")));
    j->tracestate = xstrdup(json_string_value(json_object_get(o, "tracestate")));
    trace_keep(&j->traceparent, &j->tracestate);
    json_t *t = json_object_get(o, "timeout_ms");
    if (json_is_integer(t)) {
        j->timeout_ms = json_integer_value(t);
    } else {
        /* No timeout given: the deadline is the next best bound. */
        int64_t dl;
        const char *d = json_string_value(json_object_get(o, "deadline"));
        if (d && time_parse(d, &dl, NULL) == 0)
            j->timeout_ms = dl - wall_ms() > 1 ? dl - wall_ms() : 1;
    }
    return j;
}

int worker_read_pull_answer(const char *body, size_t *n, size_t *runnable, Err *err)
{
    *n = *runnable = 0;
    json_t *ans = body ? json_loads(body, 0, NULL) : NULL;
    json_t *jobs = json_object_get(ans, "jobs");
    if (!json_is_array(jobs)) {
        json_decref(ans);
        return err_set(err, 502, "bad-answer", "the answer to a pull has no jobs array");
    }
    *n = json_array_size(jobs);
    for (size_t i = 0; i < *n; i++) {
        Job *j = job_parse(json_array_get(jobs, i));
        if (j)
            (*runnable)++;
        job_free(j);
    }
    json_decref(ans);
    return 0;
}

static void give_back(Worker *w, Job *j, const char *why)
{
    ExecOutcome o;
    memset(&o, 0, sizeof o);
    exec_outcome_fail(&o, true, "%s", why);
    log_info("job %s attempt %lld given back: %s", j->id, (long long)j->attempt, why);
    reporter_add(w->reporter, j->id, j->attempt, &o);
    exec_outcome_free(&o);
    job_free(j);
}

/* Wakes one more sleeping slot if jobs wait for one and no slot is already
 * on its way to take them; w->lock held. */
static void wake_a_slot(Worker *w)
{
    if (w->queue && w->idle > 0 && w->waking == 0) {
        w->waking++;
        pthread_cond_signal(&w->job_cond);
    }
}

/* Queues the jobs of a pull answer for the slots (at most one per free slot);
 * returns how many there were. One pass under the lock for the whole answer,
 * and one slot woken: the first to take a job wakes the next if more wait. */
static size_t jobs_dispatch(Worker *w, json_t *jobs)
{
    size_t n = json_array_size(jobs), np = 0, given = 0;
    Job **parsed = xcalloc(n + 1, sizeof *parsed);
    for (size_t i = 0; i < n; i++) {
        Job *j = job_parse(json_array_get(jobs, i));
        if (j)
            parsed[np++] = j;
    }
    pthread_mutex_lock(&w->lock);
    bool stopping = atomic_load(&w->pull_stop);
    for (; given < np && !stopping && w->free_slots > 0; given++) {
        Job *j = parsed[given];
        if (w->queue_tail)
            w->queue_tail->next = j;
        else
            w->queue = j;
        w->queue_tail = j;
        w->free_slots--;
    }
    wake_a_slot(w);
    pthread_mutex_unlock(&w->lock);
    for (size_t i = given; i < np; i++)
        give_back(w, parsed[i], stopping ? "worker stopping" : "worker has no free slot");
    free(parsed);
    return n;
}

/* The body of a pull, carrying the reports the reporter has for it (the
 * worker's exchange: docs/worker-api.md): *keys and the count returned are
 * what to settle once it is answered. A pull that carries reports does not
 * wait for jobs, so that their answer is not held. */
static char *pull_body(Worker *w, int max, ReportKey **keys, size_t *n)
{
    SBuf reports;
    sbuf_init(&reports);
    *keys = NULL;
    *n = w->no_exchange ? 0 : reporter_take(w->reporter, CARRY_MAX, &reports, keys);
    json_t *req = json_pack("{s:s, s:i, s:I}", "instance", w->instance, "max", max, "wait",
                            (json_int_t)(*n ? 0 : (w->cfg.poll_wait_ms + 999) / 1000));
    if (w->queues[0])
        json_object_set_new(req, "queues", queues_json(w));
    char *plain = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!*n) {
        sbuf_free(&reports);
        return plain;
    }
    SBuf body;
    sbuf_init(&body);
    sbuf_append(&body, plain, strlen(plain) - 1); /* without its closing brace */
    sbuf_puts(&body, ",\"reports\":[");
    sbuf_append(&body, reports.data, reports.len);
    sbuf_puts(&body, "]}");
    free(plain);
    sbuf_free(&reports);
    return sbuf_steal(&body);
}

/* Hands the reports a pull carried back to the reporter with what the
 * answer (resp: NULL when none came) says of them. */
static void settle_carried(Worker *w, const HttpResp *resp, ReportKey *keys, size_t n)
{
    if (!n)
        return;
    ReportAnswer *answers = xcalloc(n, sizeof *answers);
    Err err;
    err_clear(&err);
    bool read =
        resp && resp->status == 200 && reports_read_answer(resp->body, keys, n, answers, &err) == 0;
    if (resp && resp->status == 400 && resp->body && strstr(resp->body, "'reports'")) {
        log_info("the server takes no reports in a pull (an older version): reports go on "
                 "their own");
        w->no_exchange = true;
    }
    reporter_settle(w->reporter, keys, n, read ? answers : NULL);
    free(answers);
}

/* One pull; returns how long to wait before the next one. */
static int64_t pull_once(Worker *w, HttpClient *http, int max, Backoff *b)
{
    ReportKey *keys;
    size_t carried;
    char *body = pull_body(w, max, &keys, &carried);

    int64_t t0 = mono_ms(), delay = 0;
    HttpResp resp;
    Err err;
    err_clear(&err);
    char why[600], url[SERVERS_URL_MAX];
    size_t pos = link_url(&w->link, w->path_pull, url, sizeof url);
    atomic_store(&w->pull_since, mono_ms());
    int rc =
        httpc_request(http, "POST", url, body, w->cfg.poll_wait_ms + PULL_SLACK_MS, &resp, &err);
    atomic_store(&w->pull_since, 0);
    free(body);
    settle_carried(w, rc == 0 ? &resp : NULL, keys, carried);
    if (rc != 0) {
        if (atomic_load(&w->pull_stop))
            return 0;
        link_describe(NULL, &err, why, sizeof why);
        link_unreachable(&w->link, LINK_PULL, pos, why);
        return backoff_next(b);
    }
    json_t *ans = resp.status == 200 ? json_loads(resp.body, 0, NULL) : NULL;
    json_t *jobs = json_object_get(ans, "jobs");
    if (json_is_array(jobs)) {
        link_ok(&w->link, LINK_PULL);
        backoff_reset(b);
        if (jobs_dispatch(w, jobs) == 0 && !carried) {
            /* The server waited for us; pull again, but never in a tight loop. */
            int64_t took = mono_ms() - t0;
            delay = took < EMPTY_PULL_MIN_MS ? EMPTY_PULL_MIN_MS - took : 0;
        }
    } else {
        link_describe(&resp, NULL, why, sizeof why);
        if (resp.status == 200)
            snprintf(why, sizeof why, "HTTP 200 without a jobs array");
        if (!refused_for_good(w, resp.status, why))
            link_refused(&w->link, LINK_PULL, resp.status, why);
        delay = backoff_next(b);
        if (resp.retry_after_ms > delay)
            delay =
                resp.retry_after_ms < RETRY_AFTER_CAP_MS ? resp.retry_after_ms : RETRY_AFTER_CAP_MS;
    }
    json_decref(ans);
    httpc_resp_free(&resp);
    return delay;
}

static void *pull_main(void *arg)
{
    Worker *w = arg;
    HttpClient *http = httpc_new(w->token);
    httpc_set_cancel(http, &w->pull_stop);
    Backoff b;
    backoff_init(&b, 100, 5000);
    pthread_mutex_lock(&w->lock);
    while (!w->registered && !atomic_load(&w->pull_stop))
        pthread_cond_wait(&w->cond, &w->lock);
    while (!atomic_load(&w->pull_stop)) {
        if (w->free_slots == 0) {
            pthread_cond_wait(&w->cond, &w->lock);
            /* Every slot was busy: the first to free wakes us. Give the
             * others a moment to free too, so that one pull fills them
             * rather than one pull per slot (never longer than GATHER_MS). */
            int64_t until = mono_ms() + GATHER_MS;
            while (w->free_slots < (w->nslots + 7) / 8 && !atomic_load(&w->pull_stop) &&
                   mono_ms() < until)
                cond_wait_until(&w->cond, &w->lock, until);
            continue;
        }
        int max = w->free_slots;
        pthread_mutex_unlock(&w->lock);
        int64_t delay = pull_once(w, http, max, &b);
        pthread_mutex_lock(&w->lock);
        int64_t until = mono_ms() + delay;
        while (delay > 0 && !atomic_load(&w->pull_stop) && mono_ms() < until)
            cond_wait_until(&w->cond, &w->lock, until);
    }
    pthread_mutex_unlock(&w->lock);
    httpc_free(http);
    return NULL;
}

/* ---- executors ---- */

/* "NAME=value", to be freed by the caller. */
static char *env_entry(const char *name, const char *value)
{
    SBuf s;
    sbuf_init(&s);
    sbuf_printf(&s, "%s=%s", name, value);
    return sbuf_steal(&s);
}

static void job_run_exec(Worker *w, Slot *s, const Job *j, ExecOutcome *o)
{
    char *input = json_dumps(j->payload, JSON_COMPACT | JSON_ENCODE_ANY);
    SBuf in;
    sbuf_init(&in);
    sbuf_puts(&in, input ? input : "null");
    sbuf_puts(&in, "\n");
    free(input);
    char attempt[32];
    snprintf(attempt, sizeof attempt, "%lld", (long long)j->attempt);
    char *add[7] = {env_entry("WORKD_WORK_ID", j->id), env_entry("WORKD_ATTEMPT", attempt),
                    env_entry("WORKD_QUEUE", j->queue), env_entry("WORKD_PROGRESS_FD", "3")};
    size_t n_add = 4;
    if (j->traceparent) /* the producer's trace context, as OpenTelemetry's env carriers name it */
        add[n_add++] = env_entry("TRACEPARENT", j->traceparent);
    if (j->tracestate)
        add[n_add++] = env_entry("TRACESTATE", j->tracestate);
    char **env = exec_env_merge(w->env_base, add);
    ExecSpec spec = {.cmd = w->exec_cmd,
                     .input = in.data,
                     .input_len = in.len,
                     .env = env,
                     .timeout_ms = j->timeout_ms,
                     .kill_grace_ms = w->cfg.kill_grace_ms,
                     .max_output = w->cfg.max_output,
                     .progress_fd = 3,
                     /* Read twice per interval: what is sent waits at most half
                      * an interval more, and a job writing 50 lines a second
                      * wakes its slot 10 times a second, not 50. */
                     .progress_pace_ms = w->cfg.progress_interval_ms / 2,
                     .progress = psend_line,
                     .progress_ud = s->progress};
    Err err;
    err_clear(&err);
    psend_begin(s->progress, j->id, j->attempt);
    if (exec_run(&spec, &s->ctl, o, &err) != 0)
        log_error("job %s attempt %lld: %s", j->id, (long long)j->attempt, err.msg);
    psend_end(s->progress); /* before the result is reported */
    strv_free(env);
    for (char **e = add; *e; e++)
        free(*e);
    sbuf_free(&in);
}

static void job_run(Worker *w, Slot *s, const Job *j)
{
    log_info("job %s attempt %lld started", j->id, (long long)j->attempt);
    ExecOutcome o;
    memset(&o, 0, sizeof o);
    switch (w->cfg.kind) {
    case WORK_EXEC:
        job_run_exec(w, s, j, &o);
        break;
    case WORK_DEMO:
        demo_run(j->payload, w->cfg.demo_delay_ms, &s->ctl, &o);
        break;
    case WORK_NOOP:
        exec_outcome_ok(&o, json_null());
        break;
    }
    char line[200];
    pthread_mutex_lock(&w->lock);
    bool cancelled = j->cancelled;
    pthread_mutex_unlock(&w->lock);
    if (cancelled) {
        /* The server ended the attempt: its report would be refused. */
        log_info("job %s attempt %lld stopped: cancelled", j->id, (long long)j->attempt);
        exec_outcome_free(&o);
        return;
    }
    if (o.ok) {
        char *r = json_dumps(o.result, JSON_COMPACT | JSON_ENCODE_ANY);
        abbreviate(r ? r : "?", line, 80);
        free(r);
        log_info("job %s attempt %lld completed: %s", j->id, (long long)j->attempt, line);
    } else if (o.stopped) {
        log_info("job %s attempt %lld given back: worker stopping", j->id, (long long)j->attempt);
    } else {
        abbreviate(o.error, line, sizeof line);
        log_warn("job %s attempt %lld failed: %s", j->id, (long long)j->attempt, line);
    }
    reporter_add(w->reporter, j->id, j->attempt, &o);
    exec_outcome_free(&o);
}

/* A slot takes the oldest queued job; asleep when there is none. Waking: a
 * slot that takes a job while more wait wakes one sleeping slot, unless one
 * is already waking, so the queue is served by as many slots as keep up with
 * it: a run of short jobs by one or a few, long jobs by one slot each, each
 * started a wake-up after the one before. */
static void *slot_main(void *arg)
{
    Slot *s = arg;
    Worker *w = s->w;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->queue && !s->quit) {
            w->idle++;
            pthread_cond_wait(&w->job_cond, &w->lock);
            w->idle--;
            if (w->waking > 0)
                w->waking--;
        }
        if (!w->queue)
            break;
        s->job = w->queue;
        w->queue = s->job->next;
        if (!w->queue)
            w->queue_tail = NULL;
        s->job->next = NULL;
        wake_a_slot(w);
        const Job *j = s->job;         /* stays valid: only this thread frees it */
        bool cancelled = j->cancelled; /* while it waited: never started */
        pthread_mutex_unlock(&w->lock);
        if (!cancelled)
            job_run(w, s, j);
        /* The report is queued before the slot shows free, so that a heartbeat
         * always lists the attempt somewhere until it is acknowledged. */
        pthread_mutex_lock(&w->lock);
        if (s->job->cancelled && s->ctl_ready)
            exec_ctl_reset(&s->ctl); /* the stop was for that job only */
        job_free(s->job);
        s->job = NULL;
        w->free_slots++;
        /* Who waits on w->cond for a slot: the puller, only when none was
         * free, and a stop, for all of them. Waking every waiter (the
         * stopper too) at every job was a thread switch per job. */
        if (w->free_slots == 1 || w->stop_requested)
            pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ---- stopping ---- */

/* Deregisters through the server in use, moving to the next one when a try
 * gets no answer, until DEREGISTER_TIMEOUT_MS have passed. Each try is short:
 * a name lookup that hangs for a moment (a container network's DNS while
 * another container stops) must not cost the whole deregistration. */
static void deregister(Worker *w)
{
    HttpClient *http = httpc_new(w->token);
    int64_t deadline = mono_ms() + DEREGISTER_TIMEOUT_MS;
    /* Named, so that a successor instance under our id is not deregistered. */
    char *path = url_join(w->path_worker, "?instance=", w->instance, NULL);
    for (;;) {
        HttpResp resp;
        Err err;
        err_clear(&err);
        char url[SERVERS_URL_MAX];
        size_t pos = link_url(&w->link, path, url, sizeof url);
        int64_t left = deadline - mono_ms();
        if (httpc_request(http, "DELETE", url, NULL,
                          left < DEREGISTER_TRY_MS ? left : DEREGISTER_TRY_MS, &resp, &err) != 0) {
            if (mono_ms() + DEREGISTER_PAUSE_MS >= deadline) {
                log_warn("could not deregister: %s", err.msg);
                break;
            }
            log_debug("deregistering: %s; trying again", err.msg);
            servers_unreachable(w->servers, pos, NULL, 0);
            sleep_ms(DEREGISTER_PAUSE_MS);
            continue;
        }
        if (resp.status == 204 || resp.status == 200 || resp.status == 404) {
            url[strlen(url) - strlen(path)] = '\0';
            log_info("deregistered from %s", url);
        } else {
            char why[600];
            link_describe(&resp, NULL, why, sizeof why);
            log_warn("could not deregister: %s", why);
        }
        httpc_resp_free(&resp);
        break;
    }
    free(path);
    httpc_free(http);
}

/* Waits for running jobs, then stops what is left; w->lock held. */
static void stop_jobs(Worker *w, int64_t deadline)
{
    int busy = w->nslots - w->free_slots;
    if (busy > 0)
        log_info("waiting up to %lldms for %d running job(s)",
                 (long long)(deadline > mono_ms() ? deadline - mono_ms() : 0), busy);
    while (w->free_slots < w->nslots && mono_ms() < deadline)
        cond_wait_until(&w->cond, &w->lock, deadline);
    busy = w->nslots - w->free_slots;
    /* (cppcheck does not know that the wait above lets executors free slots) */
    // cppcheck-suppress knownConditionTrueFalse
    if (busy > 0) {
        log_warn("grace period over: stopping and giving back %d job(s)", busy);
        for (int i = 0; i < w->nslots; i++)
            if (w->slots[i].job)
                exec_ctl_stop(&w->slots[i].ctl, false);
        while (w->queue) { /* not started: given back as they are */
            Job *j = w->queue;
            w->queue = j->next;
            w->free_slots++;
            give_back(w, j, "worker stopping");
        }
        w->queue_tail = NULL;
    }
    while (w->free_slots < w->nslots)
        pthread_cond_wait(&w->cond, &w->lock);
}

static void join_slots(Worker *w)
{
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->nslots; i++)
        w->slots[i].quit = true;
    pthread_cond_broadcast(&w->job_cond);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->nslots; i++)
        if (w->slots[i].started) {
            pthread_join(w->slots[i].thread, NULL);
            w->slots[i].started = false;
        }
}

static void join_control(Worker *w)
{
    pthread_mutex_lock(&w->lock);
    atomic_store(&w->pull_stop, true);
    atomic_store(&w->hb_stop, true);
    pthread_cond_broadcast(&w->cond);
    pthread_cond_broadcast(&w->hb_cond);
    pthread_mutex_unlock(&w->lock);
    if (w->pull_started)
        pthread_join(w->pull_thread, NULL);
    if (w->hb_started)
        pthread_join(w->hb_thread, NULL);
    w->pull_started = w->hb_started = false;
}

static void *stopper_main(void *arg)
{
    Worker *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stop_requested)
        pthread_cond_wait(&w->cond, &w->lock);
    int64_t deadline = mono_ms() + w->cfg.grace_ms; /* from the request, not from here on */
    log_info("stopping: no new work taken");
    atomic_store(&w->pull_stop, true);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (w->pull_started) {
        pthread_join(w->pull_thread, NULL); /* gives back whatever its last pull got */
        w->pull_started = false;
    }

    pthread_mutex_lock(&w->lock);
    stop_jobs(w, deadline);
    bool registered = w->registered;
    pthread_mutex_unlock(&w->lock);
    join_slots(w);
    phub_stop(w->progress); /* the slots have sent what their jobs said last */

    /* Heartbeats go on meanwhile: they keep the unacknowledged attempts' leases. */
    size_t left = reporter_flush(w->reporter, FLUSH_TIMEOUT_MS);
    if (left > 0)
        log_warn("gave up delivering %zu report(s) after %dms", left, FLUSH_TIMEOUT_MS);
    join_control(w);
    if (registered)
        deregister(w);
    reporter_stop(w->reporter);
    log_info("stopped");
    char b = 1;
    if (write(w->done_wr, &b, 1) < 0)
        log_error("cannot signal the end of the stop: %s", strerror(errno));
    return NULL;
}

void worker_stop(Worker *w)
{
    pthread_mutex_lock(&w->lock);
    w->stop_requested = true;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

int worker_done_fd(const Worker *w)
{
    return w->done_rd;
}

bool worker_failed(Worker *w)
{
    pthread_mutex_lock(&w->lock);
    bool failed = w->failed;
    pthread_mutex_unlock(&w->lock);
    return failed;
}

void worker_kill_jobs(Worker *w)
{
    for (int i = 0; i < w->nslots; i++)
        if (w->slots[i].ctl_ready)
            exec_ctl_stop(&w->slots[i].ctl, true);
}

void worker_join(Worker *w)
{
    if (w->stop_started) {
        pthread_join(w->stop_thread, NULL);
        w->stop_started = false;
    }
}

/* ---- setting up ---- */

Worker *worker_new(const WorkerConfig *cfg, Err *err)
{
    if (cfg->concurrency < 1) {
        err_set(err, 400, "bad-config", "concurrency must be at least 1");
        return NULL;
    }
    if (cfg->kind == WORK_EXEC && (!cfg->exec_cmd || !*cfg->exec_cmd)) {
        err_set(err, 400, "bad-config", "--exec needs a command");
        return NULL;
    }
    Servers *servers = servers_new(cfg->server, "--server", err);
    if (!servers)
        return NULL;
    Worker *w = xcalloc(1, sizeof *w);
    w->cfg = *cfg;
    w->servers = servers;
    w->server = xstrdup(servers_text(servers));
    w->id = xstrdup(cfg->id);
    w->token = cfg->token && *cfg->token ? xstrdup(cfg->token) : NULL;
    w->exec_cmd = xstrdup(cfg->exec_cmd);
    size_t nq = strv_len(cfg->queues);
    w->queues = xcalloc(nq + 1, sizeof *w->queues);
    for (size_t i = 0; i < nq; i++)
        w->queues[i] = xstrdup(cfg->queues[i]);
    w->cfg.server = w->server;
    w->cfg.id = w->id;
    w->cfg.token = w->token;
    w->cfg.exec_cmd = w->exec_cmd;
    w->cfg.queues = w->queues;
    id_generate(w->instance);
    w->path_worker = url_join("/workers/", w->id, NULL, NULL);
    w->path_pull = url_join("/workers/", w->id, "/pull", NULL);
    w->path_reports = url_join("/workers/", w->id, "/reports", NULL);

    /* Jobs inherit our environment, but not the worker's own settings (the
     * token), nor a trace context of the worker's: a job's is its producer's. */
    size_t ne = strv_len(environ), k = 0;
    w->env_base = xcalloc(ne + 1, sizeof *w->env_base);
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "WORKD_", 6) != 0 && strncmp(environ[i], "TRACEPARENT=", 12) != 0 &&
            strncmp(environ[i], "TRACESTATE=", 11) != 0)
            w->env_base[k++] = xstrdup(environ[i]);

    link_init(&w->link, w->servers);
    w->reporter = reporter_new(w->path_reports, w->token, w->instance, &w->link);
    if (cfg->kind == WORK_EXEC)
        w->progress = phub_new(&w->link, w->token, w->id, w->instance, cfg->progress_interval_ms);
    pthread_mutex_init(&w->lock, NULL);
    cond_init_mono(&w->cond);
    cond_init_mono(&w->hb_cond);
    w->hb_interval_ms = HEARTBEAT_DEFAULT_MS;
    atomic_init(&w->pull_stop, false);
    atomic_init(&w->pull_since, 0);
    reporter_carrier(w->reporter, &w->pull_since);
    atomic_init(&w->hb_stop, false);
    w->done_rd = w->done_wr = -1;
    w->nslots = cfg->concurrency;
    w->free_slots = cfg->concurrency;
    w->slots = xcalloc((size_t)w->nslots, sizeof *w->slots);
    pthread_cond_init(&w->job_cond, NULL);
    for (int i = 0; i < w->nslots; i++) {
        w->slots[i].w = w;
        if (cfg->kind == WORK_EXEC)
            w->slots[i].progress = psend_new(w->progress);
    }
    for (int i = 0; i < w->nslots; i++) {
        if (exec_ctl_init(&w->slots[i].ctl, err) != 0)
            goto cleanup;
        w->slots[i].ctl_ready = true;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        err_set(err, 500, "internal", "pipe: %s", strerror(errno));
        goto cleanup;
    }
    w->done_rd = p[0];
    w->done_wr = p[1];
    /* Here, before any thread exists: it forks (exec.h). */
    if (cfg->kind == WORK_EXEC) {
        if (exec_guard_start(err) != 0)
            goto cleanup;
        w->guarded = true;
    }
    return w;
cleanup:
    worker_free(w);
    return NULL;
}

int worker_start(Worker *w, Err *err)
{
    int rc = 0;
    const char *what = "";
    if (reporter_start(w->reporter, err) != 0)
        return -1;
    if (w->progress && phub_start(w->progress, err) != 0) {
        reporter_stop(w->reporter);
        return -1;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, SLOT_STACK);
    for (int i = 0; i < w->nslots && rc == 0; i++) {
        what = "an executor";
        rc = pthread_create(&w->slots[i].thread, &attr, slot_main, &w->slots[i]);
        w->slots[i].started = rc == 0;
    }
    pthread_attr_destroy(&attr);
    if (rc == 0) {
        what = "the heartbeat";
        rc = pthread_create(&w->hb_thread, NULL, heartbeat_main, w);
        w->hb_started = rc == 0;
    }
    if (rc == 0) {
        what = "the pull";
        rc = pthread_create(&w->pull_thread, NULL, pull_main, w);
        w->pull_started = rc == 0;
    }
    if (rc == 0) {
        what = "the stopper";
        rc = pthread_create(&w->stop_thread, NULL, stopper_main, w);
        w->stop_started = rc == 0;
    }
    if (rc == 0)
        return 0;
    err_set(err, 500, "internal", "cannot start %s thread: %s", what, strerror(rc));
    join_control(w);
    join_slots(w);
    phub_stop(w->progress);
    reporter_stop(w->reporter);
    return -1;
}

void worker_free(Worker *w)
{
    if (!w)
        return;
    if (w->guarded)
        exec_guard_stop();
    for (int i = 0; i < w->nslots; i++) {
        job_free(w->slots[i].job);
        psend_free(w->slots[i].progress);
        if (w->slots[i].ctl_ready)
            exec_ctl_destroy(&w->slots[i].ctl);
    }
    free(w->slots);
    while (w->queue) {
        Job *j = w->queue;
        w->queue = j->next;
        job_free(j);
    }
    pthread_cond_destroy(&w->job_cond);
    phub_free(w->progress);
    reporter_free(w->reporter);
    link_destroy(&w->link);
    pthread_cond_destroy(&w->cond);
    pthread_cond_destroy(&w->hb_cond);
    pthread_mutex_destroy(&w->lock);
    if (w->done_rd >= 0)
        close(w->done_rd);
    if (w->done_wr >= 0)
        close(w->done_wr);
    strv_free(w->env_base);
    strv_free(w->queues);
    free(w->path_worker);
    free(w->path_pull);
    free(w->path_reports);
    servers_free(w->servers);
    free(w->server);
    free(w->id);
    free(w->token);
    free(w->exec_cmd);
    free(w);
}
