/* commands: what each kind of command decides, on the manager thread while
 * it leads (manager_private.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "manager_private.h"
#include "trace.h"
#include "util.h"

/* ---- handling commands (leader only) ---- */

/* Adds the started item it to the pull's answer. */
static void add_job(MgrCmd *c, const WorkItem *it)
{
    c->jobs = xrealloc(c->jobs, (c->n_jobs + 1) * sizeof *c->jobs);
    c->jobs[c->n_jobs++] = (PulledJob){.id = xstrdup(it->id),
                                       .attempt = it->attempt,
                                       .queue = xstrdup(it->queue),
                                       .priority = it->priority,
                                       .payload = json_incref(it->payload),
                                       .timeout_ms = it->timeout_ms,
                                       .deadline = it->deadline,
                                       .traceparent = xstrdup(it->traceparent),
                                       .tracestate = xstrdup(it->tracestate)};
}

/* Hands ready jobs to a pull, up to its max; returns how many. */
int fill_pull(Manager *m, MgrCmd *c, int64_t now)
{
    Err err = {0};
    if (ws_check_worker(m->ws, c->worker_id, c->instance, c->claim, now, &err) != 0)
        return -1; /* another instance holds the id now: this pull is stale */
    EventList tmp;
    eventlist_init(&tmp);
    if (c->peek) { /* would a start be decided? (decisions are pure: nothing starts) */
        c->ready = ws_decide_start(m->ws, c->worker_id, c->queues, now, &tmp);
        eventlist_free(&tmp);
        return c->ready ? 1 : 0;
    }
    bool seen = false;
    size_t bytes = 0; /* of the answer: at most --max-reply-bytes, or one job */
    while ((int)c->n_jobs < c->max && ws_decide_start(m->ws, c->worker_id, c->queues, now, &tmp)) {
        /* A waiting pull whose client has gone (a killed or stopping worker)
         * must not be handed work: the jobs would wait for their deadline.
         * Asked only when there is a job to hand, not every round. */
        if (!seen && c->deadline && c->alive && !c->alive(c->ud)) {
            eventlist_free(&tmp);
            return -1;
        }
        /* The job's size, before it is started: one that does not fit stays
         * ready for the next pull. 512 bytes cover the fields around the
         * payload but the trace context (MANAGER_JOB_ENVELOPE bounds both). */
        const WorkItem *next = ws_get(m->ws, tmp.items[0].work_id);
        size_t payload = json_dumpb(next->payload, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
        size_t size = payload + 512;
        if (next->traceparent)
            size += 96 + (next->tracestate ? 2 * strlen(next->tracestate) : 0); /* escaped */
        if (bytes && bytes + size > (size_t)m->cfg.max_reply_bytes) {
            eventlist_free(&tmp);
            break;
        }
        if (size > (size_t)m->cfg.max_reply_bytes) {
            /* No answer could carry it (accepted before the payload budget,
             * or under a larger --max-body): never started, cancelled. */
            char *id = xstrdup(tmp.items[0].work_id);
            eventlist_free(&tmp);
            eventlist_init(&tmp);
            Err cerr = {0};
            if (ws_decide_cancel(m->ws, id, now, &tmp, &cerr) == 0) {
                log_warn("work %s is cancelled: its payload (%zu bytes) is larger than a pull's "
                         "answer may be (--max-reply-bytes %lld)",
                         id, payload, (long long)m->cfg.max_reply_bytes);
                emit(m, &tmp, now);
            }
            free(id);
            if (cerr.status)
                break;
            continue;
        }
        bytes += size;
        char *id = xstrdup(tmp.items[0].work_id);
        emit(m, &tmp, now);
        if (!seen) {
            /* A waiting pull alone does not keep a worker alive (it may have
             * died while it waited), but one that is handed work now counts as
             * seen now: its new attempts get a full worker timeout. */
            int cap = ws_worker_get(m->ws, c->worker_id) ? 0 : c->max;
            ws_worker_seen(m->ws, c->worker_id, c->instance, cap, c->queues, NULL, now, &tmp);
            emit(m, &tmp, now);
            seen = true;
        }
        add_job(c, ws_get(m->ws, id));
        free(id);
    }
    eventlist_free(&tmp);
    return (int)c->n_jobs;
}

/* The answer to a command that needs id while its claim is held elsewhere
 * (id_busy): 503 id-busy while another shard's leader creates it (the node
 * asks again), 503 id-locked at once when a session that is no leader holds
 * it. `what` names the id's kind for the message. */
static int busy_error(const Manager *m, const char *id, const char *what, Err *err)
{
    const char *who = id_squatted(m, id);
    if (who)
        return err_set(err, 503, "id-locked",
                       "%s '%s' cannot be taken: the database lock that claims it in this cluster "
                       "is held by %s, which is not a workd leader; end that session "
                       "(pg_terminate_backend) or its lock",
                       what, id, who);
    return err_set(err, 503, "id-busy",
                   "%s '%s' is being taken in another shard of this cluster at this moment; "
                   "retry",
                   what, id);
}

/* What refuses a submission before its items are decided: a batch opened
 * under an id that another shard's open batch holds, or whose earlier
 * callback is still known (its callback's id is taken). */
WARN_UNUSED static int submit_refused(const Manager *m, const MgrCmd *c, const KnownSet *known,
                                      Err *err)
{
    if (!c->batch_id || ws_batch(m->ws, c->batch_id))
        return 0;
    char cb[ID_MAX + 1];
    ws_callback_id(c->batch_id, cb, sizeof cb);
    if (id_busy(m, cb))
        return busy_error(m, c->batch_id, "batch", err);
    const KnownWork *k = id_taken(m, known, cb) ? known_get(m, known, cb) : NULL;
    if (k && !strcmp(k->status, RESERVED))
        return err_set(err, 409, "batch-exists",
                       "batch '%s' is open in shard %d of this cluster, and a batch's work is in "
                       "one shard: submit to a queue of that shard, or give this batch another id",
                       c->batch_id, k->shard);
    if (c->batch_callback && id_taken(m, known, cb))
        return err_set(err, 409, "batch-callback-exists",
                       "batch '%s' ran its callback '%s' within the retention window; a batch "
                       "with a callback needs another id",
                       c->batch_id, cb);
    return 0;
}

/* A parent still open in another shard: its end would be that shard's
 * event, which this shard's child never hears of. (One finished there is
 * known for good: its child is decided here as for a finished parent.) */
WARN_UNUSED static int parents_elsewhere(const Manager *m, const MgrCmd *c, const KnownWork *kn,
                                         size_t n_kn, Err *err)
{
    for (size_t i = 0; i < c->n_items; i++)
        for (size_t j = 0; c->items[i].after && c->items[i].after[j]; j++)
            for (size_t k = 0; k < n_kn; k++) {
                const KnownWork *p = &kn[k];
                if (strcmp(p->id, c->items[i].after[j]) != 0 || p->shard == m->cfg.shard)
                    continue;
                if (!strcmp(p->status, "completed") || !strcmp(p->status, "dead") ||
                    !strcmp(p->status, "cancelled"))
                    continue;
                return err_set(err, 409, "cross-shard",
                               "work '%s' waits for '%s', which is still open in shard %d of "
                               "this cluster (its queue '%s' is there, this one's in shard %d): "
                               "a dependency on open work must stay in one shard (put both "
                               "queues in one, or submit the child once its parent has finished)",
                               c->items[i].id, p->id, p->shard, p->queue, m->cfg.shard);
            }
    return 0;
}

static void handle_submit(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    SubmitResult *res = xcalloc(c->n_items + 1, sizeof *res);
    size_t n_ids = c->n_items;
    for (size_t i = 0; i < c->n_items; i++)
        n_ids += strv_len(c->items[i].after);
    KnownWork *kn = xcalloc(n_ids + 1, sizeof *kn); /* borrowed entries */
    size_t n_kn = 0;
    for (size_t i = 0; i < c->n_items; i++) {
        const KnownWork *k =
            ws_get(m->ws, c->items[i].id) ? NULL : known_get(m, known, c->items[i].id);
        if (k)
            kn[n_kn++] = *k;
        for (size_t j = 0; c->items[i].after && c->items[i].after[j]; j++) {
            const char *p = c->items[i].after[j];
            k = ws_get(m->ws, p) ? NULL : known_get(m, known, p);
            if (k)
                kn[n_kn++] = *k;
        }
    }
    Err err = {0};
    BatchOpen bo = {.id = c->batch_id, .callback = c->batch_callback};
    for (size_t i = 0; i < c->n_items && !err.status; i++)
        if (id_busy(m, c->items[i].id))
            (void)busy_error(m, c->items[i].id, "work", &err);
    if (err.status || submit_refused(m, c, known, &err) != 0 ||
        parents_elsewhere(m, c, kn, n_kn, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else if (ws_decide_submit_in(m->ws, c->items, c->n_items, kn, n_kn, c->batch_id ? &bo : NULL,
                                   now, &tmp, res, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        emit(m, &tmp, now);
        for (size_t i = 0; i < c->n_items; i++) {
            /* What a new item became once its events (and theirs) applied
             * (static strings: a finished item's is its event's name). */
            const WorkItem *it = res[i].created ? ws_get(m->ws, c->items[i].id) : NULL;
            const KnownWork *f =
                res[i].created && !it ? hmap_get(&m->finished, c->items[i].id) : NULL;
            res[i].status = it ? ws_item_status(it, now) : f ? f->status : res[i].status;
        }
        cmd_ok(c, 202);
        free(c->submitted);
        c->submitted = res;
        res = NULL;
    }
    free(kn);
    free(res);
    eventlist_free(&tmp);
}

static void handle_cancel(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    if (ws_decide_cancel(m->ws, c->work_id, now, &tmp, &err) != 0) {
        const KnownWork *k = err.status == 404 ? known_get(m, known, c->work_id) : NULL;
        if (k) {
            char msg[300];
            snprintf(msg, sizeof msg, "work '%s' is already %s and cannot be cancelled", c->work_id,
                     k->status);
            cmd_fail(c, 409, "not-cancellable", msg);
        } else {
            cmd_fail(c, err.status, err.type, err.msg);
        }
    } else {
        emit(m, &tmp, now);
        c->work_status = "cancelled";
        cmd_ok(c, 200);
    }
    eventlist_free(&tmp);
}

static void handle_retry(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    if (ws_decide_retry(m->ws, c->work_id, known_get(m, known, c->work_id), now, &tmp, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        log_info("work %s retried by an operator", c->work_id);
        emit(m, &tmp, now);
        c->work_status = "pending";
        cmd_ok(c, 200);
    }
    eventlist_free(&tmp);
}

/* Decides c's reports (c->results, one per report, in order). */
static void decide_reports(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    free(c->results);
    c->results = xcalloc(c->n_reports + 1, sizeof *c->results);
    EventList tmp;
    eventlist_init(&tmp);
    for (size_t i = 0; i < c->n_reports; i++) {
        Report r = c->reports[i];
        r.worker_id = c->worker_id;
        r.instance = c->instance;
        r.claim = c->claim;
        ReportResult *res = &c->results[i];
        ws_decide_report(m->ws, &r,
                         ws_get(m->ws, r.work_id) ? NULL : known_get(m, known, r.work_id), now,
                         &tmp, res);
        emit(m, &tmp, now);
        const WorkItem *after = res->accepted ? ws_get(m->ws, r.work_id) : NULL;
        if (after)
            res->status = ws_item_status(after, now);
    }
    eventlist_free(&tmp);
}

static void handle_reports(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    decide_reports(m, c, known, now);
    cmd_ok(c, 200);
}

static void add_waiter(Manager *m, MgrCmd *c)
{
    c->next = NULL;
    if (m->waiters_tail)
        m->waiters_tail->next = c;
    else
        m->waiters = c;
    m->waiters_tail = c;
}

/* Whether worker_id may be registered or refreshed: a new id past --max-workers
 * is refused, as a worker id is anyone's to invent and each costs memory. */
WARN_UNUSED static int check_worker_room(const Manager *m, const char *worker_id, Err *err)
{
    if (ws_worker_get(m->ws, worker_id) || ws_worker_count(m->ws) < (size_t)m->cfg.max_workers)
        return 0;
    return err_set(err, 429, "too-many-workers",
                   "%zu workers are registered, the limit (--max-workers); retry later",
                   ws_worker_count(m->ws));
}

/* A pull, and the reports it carries (the worker's exchange): the reports
 * first, so that the slots they free and the attempts they end count for
 * what is handed out, all in this round's commit. */
static void handle_pull(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    if (c->n_reports)
        decide_reports(m, c, known, now);
    Err err = {0};
    if (check_worker_room(m, c->worker_id, &err) != 0 ||
        ws_check_worker(m->ws, c->worker_id, c->instance, c->claim, now, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg); /* handle() answers it */
        return;
    }
    EventList tmp;
    eventlist_init(&tmp);
    if (!c->peek) /* a peek starts nothing, so it registers nothing either */
        ws_worker_seen(m->ws, c->worker_id, c->instance,
                       ws_worker_get(m->ws, c->worker_id) ? 0 : c->max, c->queues, NULL, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    cmd_ok(c, 200); /* the jobs: c->jobs, filled by fill_pull */
    int64_t wait = c->wait_ms < m->cfg.pull_wait_max_ms ? c->wait_ms : m->cfg.pull_wait_max_ms;
    if (fill_pull(m, c, now) > 0 || wait <= 0) {
        queue_done(m, c);
        return;
    }
    c->deadline = now + wait;
    add_waiter(m, c);
}

void cluster_view_free(ClusterView *v)
{
    if (!v)
        return;
    free(v->leader);
    for (size_t i = 0; i < v->n_workers; i++) {
        free(v->workers[i].id);
        strv_free(v->workers[i].queues);
        ws_running_free(v->workers[i].running);
    }
    free(v->workers);
    for (size_t i = 0; i < v->n_open; i++)
        free(v->open[i].queue);
    free(v->open);
    free(v);
}

/* A copy of what /cluster shows, so that the HTTP thread can write it. */
static ClusterView *cluster_view(Manager *m, int64_t now)
{
    ClusterView *v = xcalloc(1, sizeof *v);
    v->leader = xstrdup(m->cfg.advertise_url);
    v->term = atomic_load(&m->term);
    v->now = now;
    v->shard = m->cfg.shard;
    manager_database(m, v->database, sizeof v->database);
    v->busy_permille = atomic_load(&m->stats.window_busy_permille);
    v->commit_mean_us = atomic_load(&m->stats.window_commit_mean_us);
    v->commit_p99_us = atomic_load(&m->stats.window_commit_p99_us);
    v->workers = xcalloc(ws_worker_count(m->ws) + 1, sizeof *v->workers);
    size_t pos = 0;
    const WsWorker *w;
    while ((w = ws_worker_next(m->ws, &pos)))
        v->workers[v->n_workers++] =
            (ClusterWorker){.id = xstrdup(w->id),
                            .capacity = w->capacity,
                            .queues = strv_copy(w->queues),
                            .running = ws_running_copy(w->running, SIZE_MAX),
                            .last_seen = w->last_seen};
    WsQueueStats *st = ws_queue_stats(m->ws, now, &v->n_open);
    v->open = xcalloc(v->n_open + 1, sizeof *v->open);
    for (size_t i = 0; i < v->n_open; i++)
        v->open[i] = (ClusterQueue){.queue = xstrdup(st[i].queue),
                                    .waiting = st[i].waiting,
                                    .pending = st[i].pending,
                                    .scheduled = st[i].scheduled,
                                    .running = st[i].running};
    free(st);
    v->open_total = (int64_t)ws_open_count(m->ws);
    const RetentionStats *r = manager_retention_stats(m);
    v->retain_ms = m->cfg.retain_ms;
    v->parts = atomic_load(&r->parts);
    v->events_bytes = atomic_load(&r->events_bytes);
    v->done_bytes = atomic_load(&r->done_bytes);
    v->open_bytes = atomic_load(&r->open_bytes);
    v->oldest_part_ms = atomic_load(&r->oldest_part_ms);
    v->last_run_ms = atomic_load(&r->last_run_ms);
    v->parts_dropped = atomic_load(&r->parts_dropped);
    return v;
}

/* The attempts a heartbeat lists that are no longer current (cancelled,
 * timed out, finished): the worker should stop them (NULL: none). */
static RunningList *stale_attempts(Manager *m, const RunningList *running)
{
    RunningList *out = NULL;
    for (size_t i = 0; running && i < running->n; i++) {
        const RunningAttempt *r = &running->items[i];
        const WorkItem *it = ws_get(m->ws, r->work_id);
        if (it && it->status == WORK_RUNNING && it->attempt == r->attempt)
            continue;
        if (!out) {
            out = xcalloc(1, sizeof *out);
            out->items = xcalloc(running->n + 1, sizeof *out->items);
        }
        out->items[out->n++] = (RunningAttempt){xstrdup(r->work_id), r->attempt};
    }
    return out;
}

/* Answers (empty) the waiting pulls of a worker that left. */
static void drop_waiters_of(Manager *m, const char *worker_id)
{
    MgrCmd *keep = NULL, **tail = &keep;
    for (MgrCmd *c = m->waiters, *next; c; c = next) {
        next = c->next;
        c->next = NULL;
        if (!strcmp(c->worker_id, worker_id)) {
            queue_done(m, c);
        } else {
            *tail = c;
            tail = &c->next;
        }
    }
    m->waiters = keep;
    m->waiters_tail = NULL;
    for (MgrCmd *c = keep; c; c = c->next)
        m->waiters_tail = c;
}

static void handle_queue_set(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    /* l borrows its weights: the state's, or the command's when it sets them. */
    QueueLimits l = ws_queue_limits(m->ws, c->queue);
    if (c->limits_set & QL_PAUSED)
        l.paused = c->limits.paused;
    if (c->limits_set & QL_MAX_RUNNING)
        l.max_running = c->limits.max_running;
    if (c->limits_set & QL_MAX_PER_KEY)
        l.max_running_per_key = c->limits.max_running_per_key;
    if (c->limits_set & QL_RATE) {
        l.rate_limit = c->limits.rate_limit;
        l.rate_period_ms = c->limits.rate_period_ms;
    }
    if (c->limits_set & QL_WEIGHTS) {
        l.weights = c->limits.weights;
        l.n_weights = c->limits.n_weights;
    }
    c->queue_new = !ws_queue_known(m->ws, c->queue);
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    if (ws_decide_queue_set(m->ws, c->queue, &l, now, &tmp, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        log_info("queue %s: %s, max_running %d, rate %d per %lld ms (set by an operator)", c->queue,
                 l.paused ? "paused" : "running", l.max_running, l.rate_limit,
                 (long long)l.rate_period_ms);
        emit(m, &tmp, now);
        /* The state's own now (l's borrowed weights went with the old ones),
         * copied: the answer outlives the round. */
        QueueLimits set = ws_queue_limits(m->ws, c->queue);
        queue_limits_clear(&c->limits);
        queue_limits_copy(&c->limits, &set);
        cmd_ok(c, 200);
    }
    eventlist_free(&tmp);
}

/* ---- progress ---- */

/* Each update is taken or refused on its own; the command succeeds. */
static void handle_progress(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    for (size_t i = 0; i < c->n_updates; i++) {
        ProgressUpdate *u = &c->updates[i];
        ProgressMsg pm = {.work_id = u->work_id,
                          .attempt = u->attempt,
                          .worker_id = c->worker_id,
                          .instance = c->instance,
                          .claim = c->claim,
                          .has_fraction = u->has_fraction,
                          .fraction = u->fraction,
                          .message = u->message,
                          .output = u->output};
        EventList tmp;
        eventlist_init(&tmp);
        if (progress_decide(m->progress, m->ws, &pm, now, &tmp, &u->err) != 0) {
            u->status = u->err.status;
        } else {
            emit(m, &tmp, now);
            u->status = 200;
            u->seq = m->batch.items[m->batch.len - 1].seq;
        }
        eventlist_free(&tmp);
    }
    c->status = 200;
}

/* ---- webhook subscriptions ---- */

void subscription_views_free(SubscriptionViews *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->len; i++)
        subscription_clear(&v->items[i].sub);
    free(v->items);
    free(v);
}

/* Adds x's settings as the state holds them, without its secret, to c's
 * answer; its deliveries are filled by fill_deliveries. */
static SubscriptionView *add_view(MgrCmd *c, const Subscription *x)
{
    if (!c->subs)
        c->subs = xcalloc(1, sizeof *c->subs);
    SubscriptionViews *l = c->subs;
    l->items = xrealloc(l->items, (l->len + 1) * sizeof *l->items);
    SubscriptionView *v = &l->items[l->len++];
    memset(v, 0, sizeof *v);
    subscription_copy(&v->sub, x);
    free(v->sub.secret);
    v->sub.secret = NULL;
    return v;
}

/* The deliveries of every subscription of c's answer, as the webhooks thread
 * has them now. */
static void fill_deliveries(Manager *m, MgrCmd *c)
{
    if (c->subs)
        if (m->webhooks)
            webhooks_deliveries(m->webhooks, c->subs);
}

static int view_by_name(const void *a, const void *b)
{
    return strcmp(((const SubscriptionView *)a)->sub.name, ((const SubscriptionView *)b)->sub.name);
}

/* Every shard's log's end as this leader knows it: its own exactly, the
 * others' as the webhooks thread last heard (none of theirs committed since
 * is behind it). */
static Cursor logs_end(Manager *m)
{
    Cursor end;
    cursor_zero(&end, m->cfg.shards);
    if (m->webhooks)
        webhooks_ends(m->webhooks, &end);
    end.seq[0] = m->last_seq;
    return end;
}

static void handle_subscription_set(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    const SubscriptionSet *subs = ws_subscriptions(m->ws);
    bool existed = subs_get(subs, c->sub->name) != NULL;
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    /* A new subscription starts at the logs' end unless it names a cursor. */
    Cursor end = logs_end(m);
    if (subs_decide_set(subs, c->sub, c->sub_reset, &end, now, &tmp, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        emit(m, &tmp, now);
        add_view(c, subs_get(subs, c->sub->name)); /* deliveries: once committed (cmd_landed) */
        log_info("webhook subscription %s %s by an operator", c->sub->name,
                 existed ? "changed" : "created");
        cmd_ok(c, 200);
    }
    eventlist_free(&tmp);
}

static void handle_subscription_delete(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    const SubscriptionSet *subs = ws_subscriptions(m->ws);
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    Cursor end = logs_end(m);
    if (subs_decide_delete(subs, c->name, &end, now, &tmp, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        add_view(c, subs_get(subs, c->name)); /* as it was */
        fill_deliveries(m, c);
        emit(m, &tmp, now);
        log_info("webhook subscription %s deleted by an operator", c->name);
        cmd_ok(c, 200);
    }
    eventlist_free(&tmp);
}

static void handle_subscription_get(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    (void)now;
    const SubscriptionSet *subs = ws_subscriptions(m->ws);
    if (c->name) {
        const Subscription *x = subs_get(subs, c->name);
        if (!x) {
            cmd_fail(c, 404, "not-found", "no webhook subscription with that name");
            return;
        }
        add_view(c, x);
    } else {
        c->subs = xcalloc(1, sizeof *c->subs); /* answered: not NULL, even with none */
        const Subscription *x;
        for (size_t i = 0; (x = subs_next(subs, &i));)
            add_view(c, x);
        if (c->subs->len > 1)
            qsort(c->subs->items, c->subs->len, sizeof *c->subs->items, view_by_name);
    }
    fill_deliveries(m, c);
    cmd_ok(c, 200);
}

/* The webhooks thread's: how far a subscription's deliveries got. */
static void handle_sub_cursor(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    EventList tmp;
    eventlist_init(&tmp);
    subs_decide_cursor(ws_subscriptions(m->ws), c->name, &c->sub->cursor, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    cmd_ok(c, 204);
}

/* The webhooks thread's: a subscription that keeps failing is paused. */
static void handle_sub_pause(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    EventList tmp;
    eventlist_init(&tmp);
    Cursor end = logs_end(m);
    if (subs_decide_pause(ws_subscriptions(m->ws), c->name, c->reason, &end, now, &tmp))
        emit(m, &tmp, now);
    eventlist_free(&tmp);
    cmd_ok(c, 204);
}

/* ---- bulk actions (an operator's filter) ---- */

/* Cancels the open work that matches, at most c->max per command so that a
 * huge filter cannot stall the round; "more" tells the caller to repeat. */
static void handle_bulk_cancel(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    const char **ids = xcalloc((size_t)c->max + 1, sizeof *ids);
    size_t matched = ws_match(m->ws, c->queue, c->key, c->state, now, ids, (size_t)c->max);
    size_t n = matched < (size_t)c->max ? matched : (size_t)c->max;
    char **own = xcalloc(n + 1, sizeof *own); /* ids point into items the cancels free */
    for (size_t i = 0; i < n; i++)
        own[i] = xstrdup(ids[i]);
    EventList tmp;
    eventlist_init(&tmp);
    for (size_t i = 0; i < n; i++) {
        Err err = {0};
        if (ws_decide_cancel(m->ws, own[i], now, &tmp, &err) == 0)
            emit(m, &tmp, now);
        free(own[i]);
    }
    eventlist_free(&tmp);
    free(own);
    free(ids);
    log_info("bulk cancel: %zu work item(s) cancelled by an operator", n);
    c->n_done = (int64_t)n;
    c->more = matched > n;
    cmd_ok(c, 200);
}

/* Reopens the dead work the prefetch found for c (its KnownSet). */
static void handle_bulk_retry(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    KnownSet *k = c->bulk;
    size_t done = 0;
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    for (size_t i = 0; k && i < k->n; i++) {
        if (ws_get(m->ws, k->items[i].id) || hmap_get(&m->finished, k->items[i].id))
            continue; /* reopened or finished again in this round */
        err_clear(&err);
        if (ws_decide_retry(m->ws, k->items[i].id, &k->items[i], now, &tmp, &err) != 0)
            break; /* the queue is full: what is left stays dead */
        emit(m, &tmp, now);
        done++;
    }
    eventlist_free(&tmp);
    bool more = k && k->n == (size_t)c->max;
    if (!done && err.status == 429) {
        cmd_fail(c, 429, err.type, err.msg);
        return;
    }
    log_info("bulk retry: %zu dead work item(s) reopened by an operator", done);
    c->n_done = (int64_t)done;
    c->more = more || done < (k ? k->n : 0);
    cmd_ok(c, 200);
}

/* ---- schedules ---- */

/* What refuses a new schedule (x: NULL) in a cluster of several shards,
 * from its reservations (lookup_schedule_set); else 0. */
WARN_UNUSED static int schedule_refused(const Manager *m, const MgrCmd *c, const KnownSet *known,
                                        Err *err)
{
    if (m->cfg.shards < 2)
        return ws_schedule_count(m->ws) >= (size_t)m->cfg.max_schedules
                   ? err_set(err, 409, "too-many-schedules",
                             "there are %lld schedules, the limit (--max-schedules); delete one "
                             "first",
                             (long long)m->cfg.max_schedules)
                   : 0;
    char name[ID_MAX + 16];
    journal_schedule_reservation(c->name, name, sizeof name);
    if (id_busy(m, name))
        return busy_error(m, c->name, "schedule", err);
    if (id_busy(m, RESERVE_SCHEDULES))
        return busy_error(m, "(every new schedule)", "the count of schedules", err);
    const KnownWork *k = known_get(m, known, name);
    if (k && k->shard != m->cfg.shard)
        return err_set(err, 409, "schedule-moves-shard",
                       "schedule '%s' is in shard %d, and its queue '%s' in shard %d: delete it "
                       "first, or keep a queue of that shard",
                       c->name, k->shard, c->schedule->work.queue, m->cfg.shard);
    long long count = 0;
    for (size_t i = 0; i < known->n; i++)
        if (!strcmp(known->items[i].id, RESERVE_SCHEDULES))
            count += known->items[i].attempts;
    if (count >= m->cfg.max_schedules)
        return err_set(err, 409, "too-many-schedules",
                       "there are %lld schedules in the cluster, the limit (--max-schedules); "
                       "delete one first",
                       count);
    return 0;
}

static void handle_schedule_set(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    const Schedule *x = ws_schedule(m->ws, c->name);
    ScheduleSpec *spec = c->schedule;
    if (!spec) { /* pause or resume: the schedule as it is */
        if (!x) {
            char msg[200];
            snprintf(msg, sizeof msg, "no schedule '%s'", c->name);
            cmd_fail(c, 404, "not-found", msg);
            return;
        }
        spec = schedspec_dup(x->spec);
        spec->paused = c->pause == 1;
        c->schedule = spec; /* freed with the command */
    } else {
        Err err = {0};
        if (!x && schedule_refused(m, c, known, &err) != 0) {
            cmd_fail(c, err.status, err.type, err.msg);
            return;
        }
    }
    EventList tmp;
    eventlist_init(&tmp);
    ws_decide_schedule_set(m->ws, c->name, spec, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    x = ws_schedule(m->ws, c->name);
    log_info("schedule %s set by an operator: '%s' in %s%s", c->name, spec->cron_text, spec->tz,
             spec->paused ? " (paused)" : "");
    c->last_tick = x->last_tick;
    c->decided_at = now;
    cmd_ok(c, 200); /* the schedule is c->schedule: x->spec's equal */
}

/* ---- work submitted in SQL (workd.submit) ---- */

#define INBOX_PAGE 1000
#define INBOX_POLL_MS 1000 /* a NOTIFY lost with a session is noticed this late */

static void inbox_cmd_done(MgrCmd *c, void *ud)
{
    (void)ud;
    mgrcmd_free(c);
}

static void inbox_decided(Manager *m, const MgrCmd *c);

/* How deep v's arrays and objects nest (a scalar: 0), as the bytes of its
 * text count it. Recursion is bounded by what jansson reads (2048). */
static size_t json_nesting(const json_t *v)
{
    size_t deepest = 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            size_t d = json_nesting(json_array_get(v, i));
            deepest = d > deepest ? d : deepest;
        }
    } else if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            size_t d = json_nesting(x);
            deepest = d > deepest ? d : deepest;
        }
    } else {
        return 0;
    }
    return deepest + 1;
}

/* Turns the oldest inbox entries into submit commands ahead of the round's
 * mail, one command each, so that one refused entry does not hold the others
 * back. Returns -1 when the leader stepped down. */
int take_inbox(Manager *m, MgrCmd **mail)
{
    int64_t now = mono_ms();
    if (!m->inbox_due && now - m->inbox_read_ms < INBOX_POLL_MS)
        return 0;
    m->inbox_read_ms = now;
    InboxItem *items = NULL;
    size_t n = 0;
    Err err = {0};
    if (settle(m) != 0)
        return -1;
    if (journal_inbox_read(m->conn, m->cfg.shard, INBOX_PAGE, &items, &n, &err) != 0) {
        free(items);
        step_down(m, err.msg);
        return -1;
    }
    m->inbox_due = n == INBOX_PAGE; /* more behind: read again next round */
    for (size_t i = n; i-- > 0;) {
        InboxItem *it = &items[i];
        MgrCmd *c = mgrcmd_new(MC_SUBMIT);
        c->items = xcalloc(1, sizeof *c->items);
        c->n_items = 1;
        SubmitItem *s = &c->items[0];
        s->id = it->id;
        s->queue = it->queue;
        s->priority = it->priority;
        s->payload = it->payload;
        s->run_at = it->run_at;
        s->timeout_ms = it->timeout_ms ? it->timeout_ms : m->cfg.default_timeout_ms;
        s->max_attempts = it->max_attempts ? it->max_attempts : m->cfg.default_max_attempts;
        s->traceparent = it->traceparent;
        s->tracestate = it->tracestate;
        trace_keep(&s->traceparent, &s->tracestate); /* ignored when invalid, as over HTTP */
        c->inbox_n = it->n;
        /* Refused for good: never stored as null in its stead, and never
         * started if a pull's answer could not hold it. workd.submit refuses
         * these at the call since schema 16; an entry from before, or one
         * whose numbers grow when written out, is refused here. */
        char why[200] = "";
        size_t bytes =
            s->payload ? json_dumpb(s->payload, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY) : 0;
        if (!s->payload)
            snprintf(why, sizeof why, "%s", it->why);
        else if (bytes > (size_t)m->cfg.max_payload_bytes)
            snprintf(why, sizeof why,
                     "its payload is %zu bytes as workd writes it; the limit is %lld "
                     "(--max-body)",
                     bytes, (long long)m->cfg.max_payload_bytes);
        else if (json_nesting(s->payload) >= (size_t)m->cfg.max_json_depth)
            snprintf(why, sizeof why, "its payload is nested deeper than %d (--max-json-depth)",
                     m->cfg.max_json_depth - 1);
        if (why[0]) {
            cmd_fail(c, s->payload ? 413 : 400, "invalid-payload", why);
            inbox_decided(m, c);
            mgrcmd_free(c);
            continue;
        }
        c->done = inbox_cmd_done;
        c->next = *mail;
        *mail = c;
    }
    free(items);
    return 0;
}

/* An inbox entry is taken (deleted with the round's commit) once decided:
 * accepted, acknowledged as existing, or refused for good (another payload
 * under its id). A full queue leaves it in the inbox for a later round. */
static void inbox_decided(Manager *m, const MgrCmd *c)
{
    /* Left in the inbox: a full queue, a failure, and an entry the database
     * refuses to log (committed by its application: never dropped). */
    if (c->status == 429 || c->status >= 500 || !strcmp(c->err.type, "append-refused"))
        return;
    if (c->status >= 400) {
        log_warn("work %s submitted in SQL is refused: %s", c->items[0].id, c->err.msg);
        atomic_fetch_add(&m->stats.inbox_refused, 1);
    }
    if (m->n_inbox_ack == m->cap_inbox_ack) {
        m->cap_inbox_ack = m->cap_inbox_ack ? m->cap_inbox_ack * 2 : 64;
        m->inbox_ack = xrealloc(m->inbox_ack, m->cap_inbox_ack * sizeof *m->inbox_ack);
    }
    m->inbox_ack[m->n_inbox_ack++] = c->inbox_n;
    atomic_fetch_add(&m->stats.inbox_taken, 1);
}

/* ---- the commands without a section of their own ---- */

static void handle_heartbeat(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    Err err = {0};
    if (check_worker_room(m, c->worker_id, &err) != 0 ||
        ws_check_worker(m->ws, c->worker_id, c->instance, c->claim, now, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
        return;
    }
    EventList tmp;
    eventlist_init(&tmp);
    ws_worker_seen(m->ws, c->worker_id, c->instance, c->capacity, c->queues, c->running, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    c->heartbeat_interval_ms = m->cfg.heartbeat_interval_ms;
    c->worker_timeout_ms = m->cfg.ws.worker_timeout_ms;
    ws_running_free(c->stale);
    c->stale = stale_attempts(m, c->running);
    cmd_ok(c, 200);
}

static void handle_deregister(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    Err err = {0};
    /* A named instance must be the registered one, claim or not: an old
     * instance must not end its successor's attempts. */
    if (ws_check_worker(m->ws, c->worker_id, c->instance, c->claim && !c->instance, now, &err) !=
        0) {
        cmd_fail(c, err.status, err.type, err.msg);
        return;
    }
    EventList tmp;
    eventlist_init(&tmp);
    ws_worker_forget(m->ws, c->worker_id, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    drop_waiters_of(m, c->worker_id);
    log_info("worker %s deregistered", c->worker_id);
    cmd_ok(c, 204);
}

static void handle_cluster(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    cluster_view_free(c->cluster);
    c->cluster = cluster_view(m, now);
    cmd_ok(c, 200);
}

static void handle_schedule_delete(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    Err err = {0};
    EventList tmp;
    eventlist_init(&tmp);
    if (ws_decide_schedule_delete(m->ws, c->name, now, &tmp, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        log_info("schedule %s deleted by an operator", c->name);
        emit(m, &tmp, now);
        cmd_ok(c, 204);
    }
    eventlist_free(&tmp);
}

static void handle_queue_flow(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    (void)known;
    const char *name;
    c->tokens = xcalloc(1, sizeof *c->tokens); /* answered: not NULL, even with none */
    for (size_t i = 0; (name = ws_queue_next(m->ws, &i));) {
        double t = ws_queue_tokens(m->ws, name, now);
        if (t < 0)
            continue;
        c->tokens = xrealloc(c->tokens, (c->n_tokens + 1) * sizeof *c->tokens);
        c->tokens[c->n_tokens++] = (QueueTokens){.queue = xstrdup(name), .tokens = t};
    }
    cmd_ok(c, 200);
}

/* ---- what the round looks up before it decides ---- */

/* A UUID this node just generated cannot exist yet (2^-122). */
static int lookup_submit(Manager *m, MgrCmd *c, IdList *ids)
{
    for (size_t i = 0; i < c->n_items; i++) {
        if (!c->items[i].generated)
            want_claimed(m, ids, c->items[i].id);
        for (size_t j = 0; c->items[i].after && c->items[i].after[j]; j++)
            want_known(m, ids, c->items[i].after[j]);
    }
    /* A batch opened here: no other shard may hold its id (an open batch
     * reserves its callback's, journal.h), and its callback's id must be free. */
    if (c->batch_id && !ws_batch(m->ws, c->batch_id)) {
        char cb[ID_MAX + 1];
        ws_callback_id(c->batch_id, cb, sizeof cb);
        want_claimed_made(m, ids, xstrdup(cb));
    }
    return 0;
}

/* A new schedule, in a cluster of several shards: its name must be free in
 * every shard (its ticks' ids are made from it), and the cluster's count
 * under the limit; both are reservations (journal.h), claimed. */
static int lookup_schedule_set(Manager *m, MgrCmd *c, IdList *ids)
{
    if (m->cfg.shards < 2 || !c->schedule || ws_schedule(m->ws, c->name))
        return 0;
    char name[ID_MAX + 16];
    journal_schedule_reservation(c->name, name, sizeof name);
    want_claimed_made(m, ids, xstrdup(name));
    want_claimed_made(m, ids, xstrdup(RESERVE_SCHEDULES));
    return 0;
}

static int lookup_work_id(Manager *m, MgrCmd *c, IdList *ids)
{
    want_known(m, ids, c->work_id);
    return 0;
}

static int lookup_reports(Manager *m, MgrCmd *c, IdList *ids)
{
    for (size_t i = 0; i < c->n_reports; i++)
        want_known(m, ids, c->reports[i].work_id);
    return 0;
}

/* Dead work lives in the database only: find what matches. */
static int lookup_dead(Manager *m, MgrCmd *c, IdList *ids)
{
    (void)ids;
    Err err = {0};
    c->bulk = xcalloc(1, sizeof *c->bulk);
    if (settle(m) != 0)
        return -1;
    if (journal_dead_matching(m->conn, m->cfg.shard, c->queue, c->key, c->max, c->bulk, &err) !=
        0) {
        step_down(m, err.msg);
        return -1;
    }
    return 0;
}

/* ---- the table ---- */

/* One kind of command: what the round looks up for it before deciding (NULL:
 * nothing; -1: the leader stepped down), how it decides (answering with
 * cmd_ok or cmd_fail; one that parks answers itself when it has what it
 * waits for, unless it failed), whether it may put events into the round's
 * append (the suspects of a refused append are those), and what its answer
 * takes once its events are committed (NULL: nothing). A new command is its
 * MgrCmdType, its fields in MgrCmd, its entry here, its handler, and its
 * reply in api.c. */
typedef struct CmdKind {
    int (*lookup)(Manager *m, MgrCmd *c, IdList *ids);
    void (*decide)(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now);
    bool parks;
    bool writes;
    void (*landed)(Manager *m, MgrCmd *c);
} CmdKind;

static const CmdKind KINDS[] = {
    [MC_SUBMIT] = {.lookup = lookup_submit, .decide = handle_submit, .writes = true},
    [MC_CANCEL] = {.lookup = lookup_work_id, .decide = handle_cancel, .writes = true},
    [MC_RETRY] = {.lookup = lookup_work_id, .decide = handle_retry, .writes = true},
    [MC_REPORTS] = {.lookup = lookup_reports, .decide = handle_reports, .writes = true},
    [MC_PULL] = {.lookup = lookup_reports, .decide = handle_pull, .parks = true, .writes = true},
    [MC_HEARTBEAT] = {.decide = handle_heartbeat, .writes = true},
    [MC_DEREGISTER] = {.decide = handle_deregister, .writes = true},
    [MC_CLUSTER] = {.decide = handle_cluster},
    [MC_QUEUE_SET] = {.decide = handle_queue_set, .writes = true},
    [MC_BULK_CANCEL] = {.decide = handle_bulk_cancel, .writes = true},
    [MC_BULK_RETRY] = {.lookup = lookup_dead, .decide = handle_bulk_retry, .writes = true},
    [MC_SCHEDULE_SET] = {.lookup = lookup_schedule_set,
                         .decide = handle_schedule_set,
                         .writes = true},
    [MC_SCHEDULE_DELETE] = {.decide = handle_schedule_delete, .writes = true},
    [MC_PROGRESS] = {.decide = handle_progress, .writes = true},
    [MC_SUBSCRIPTION_SET] = {.decide = handle_subscription_set,
                             .writes = true,
                             .landed = fill_deliveries},
    [MC_SUBSCRIPTION_DELETE] = {.decide = handle_subscription_delete, .writes = true},
    [MC_SUBSCRIPTION_GET] = {.decide = handle_subscription_get},
    [MC_SUB_CURSOR] = {.decide = handle_sub_cursor, .writes = true},
    [MC_SUB_PAUSE] = {.decide = handle_sub_pause, .writes = true},
    [MC_QUEUE_FLOW] = {.decide = handle_queue_flow},
};
_Static_assert(sizeof KINDS / sizeof KINDS[0] == MC_COUNT, "every MgrCmdType has its entry");

int cmd_lookup(Manager *m, MgrCmd *c, IdList *ids)
{
    return KINDS[c->type].lookup ? KINDS[c->type].lookup(m, c, ids) : 0;
}

void cmd_landed(Manager *m, MgrCmd *c)
{
    if (KINDS[c->type].landed)
        KINDS[c->type].landed(m, c);
}

bool cmd_may_write(const MgrCmd *c)
{
    return c->status < 400 && KINDS[c->type].writes &&
           (c->type != MC_PULL || c->n_jobs > 0 || c->n_reports > 0);
}

/* Whether c is isolated: the database refused twice an append that held it
 * (alone the second time). A submission whose items all exist already is
 * answered as ever (idempotent), wherever they were written. */
static bool isolated(const Manager *m, const MgrCmd *c, const KnownSet *known)
{
    if (cmd_suspicion(m, c) < SUSPECT_ISOLATE)
        return false;
    for (size_t i = 0; i < c->n_items; i++)
        if (!id_taken(m, known, c->items[i].id))
            return true;
    return c->type != MC_SUBMIT;
}

void handle(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    const CmdKind *k = &KINDS[c->type];
    if (isolated(m, c, known))
        cmd_fail(c, 409, "append-refused",
                 "the database refused twice the change this request makes when it was written "
                 "to the log; it is not tried again (the leader's log says why)");
    else
        k->decide(m, c, known, now);
    if (c->inbox_n)
        inbox_decided(m, c);
    if (!k->parks || c->status >= 400)
        queue_done(m, c);
}
