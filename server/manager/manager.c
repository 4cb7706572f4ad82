/* manager: see manager.h. Only the manager thread touches the fields below the
 * "thread-owned" banner; the mailbox is shared under `lock` and signalled
 * through an eventfd so that the thread can also watch its database socket. */
#include "manager.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "db.h"
#include "hmap.h"
#include "projection.h"
#include "journal.h"
#include "log.h"
#include "util.h"

#define HEALTH_CHECK_MS 1000

struct Manager {
    ManagerConfig cfg;
    pthread_t thread;
    atomic_bool stopping;
    bool closed; /* under lock: the thread is gone, answer at once */
    atomic_bool leader;
    atomic_llong term;
    ManagerStats stats;
    /* mailbox */
    pthread_mutex_t lock;
    MgrCmd *head, *tail;
    int efd;
    /* ---- thread-owned ---- */
    PGconn *conn;
    WorkState *ws;
    int64_t last_seq;
    int64_t last_db_ok;
    bool db_down_logged;
    MgrCmd *waiters, *waiters_tail; /* pulls waiting for work, FIFO */
    MgrCmd *done_head, *done_tail;  /* replies to send after the commit */
    EventList batch;                /* events of this round, applied, not yet committed */
    HMap proj;                      /* work id -> ProjRow: what the batch makes of its rows */
};

/* ---- commands ---- */

MgrCmd *mgrcmd_new(MgrCmdType type)
{
    MgrCmd *c = xcalloc(1, sizeof *c);
    c->type = type;
    return c;
}

void mgrcmd_free(MgrCmd *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_items; i++) {
        free(c->items[i].id);
        free(c->items[i].queue);
        json_decref(c->items[i].payload);
    }
    free(c->items);
    free(c->work_id);
    free(c->worker_id);
    free(c->instance);
    strv_free(c->queues);
    json_decref(c->running);
    json_decref(c->reports);
    json_decref(c->reply);
    free(c);
}

static void cmd_fail(MgrCmd *c, int status, const char *type, const char *msg)
{
    json_decref(c->reply);
    c->reply = NULL;
    c->status = status;
    err_set(&c->err, status, type, "%s", msg);
}

static void cmd_ok(MgrCmd *c, int status, json_t *reply)
{
    json_decref(c->reply);
    c->status = status;
    c->reply = reply;
}

static void queue_done(Manager *m, MgrCmd *c)
{
    c->next = NULL;
    if (m->done_tail)
        m->done_tail->next = c;
    else
        m->done_head = c;
    m->done_tail = c;
}

/* Calls done() for every reply of the round (after the commit, or after a
 * failed commit has turned them into 503s). */
static void flush_done(Manager *m)
{
    MgrCmd *c = m->done_head;
    m->done_head = m->done_tail = NULL;
    while (c) {
        MgrCmd *next = c->next;
        c->next = NULL;
        c->done(c, c->ud);
        c = next;
    }
}

static MgrCmd *take_mailbox(Manager *m)
{
    uint64_t v;
    while (read(m->efd, &v, sizeof v) > 0) {
    }
    pthread_mutex_lock(&m->lock);
    MgrCmd *c = m->head;
    m->head = m->tail = NULL;
    pthread_mutex_unlock(&m->lock);
    return c;
}

void manager_send(Manager *m, MgrCmd *cmd)
{
    cmd->next = NULL;
    pthread_mutex_lock(&m->lock);
    if (m->closed) {
        pthread_mutex_unlock(&m->lock);
        cmd_fail(cmd, 503, "shutting-down", "the server is shutting down; retry on another node");
        cmd->done(cmd, cmd->ud);
        return;
    }
    if (m->tail)
        m->tail->next = cmd;
    else
        m->head = cmd;
    m->tail = cmd;
    pthread_mutex_unlock(&m->lock);
    uint64_t one = 1;
    ssize_t w = write(m->efd, &one, sizeof one);
    (void)w; /* the counter cannot overflow in practice; a failed write still leaves it > 0 */
}

bool manager_is_leader(const Manager *m)
{
    return atomic_load(&m->leader);
}

int64_t manager_term(const Manager *m)
{
    return atomic_load(&m->term);
}

const ManagerStats *manager_stats(const Manager *m)
{
    return &m->stats;
}

/* ---- leadership ---- */

static void proj_reset(Manager *m)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&m->proj, &i, &k, &v);) {
        projrow_clear(v);
        free(v);
    }
    hmap_free(&m->proj);
}

static void reject_all(Manager *m, MgrCmd *list, const char *why)
{
    while (list) {
        MgrCmd *next = list->next;
        cmd_fail(list, 503, "not-leader", why);
        queue_done(m, list);
        list = next;
    }
}

/* Gives up leadership: the state is dropped (the log is the truth), the
 * session is closed so that the lock is released at once, and everything in
 * flight is answered 503 so that callers retry against the next leader. */
static void step_down(Manager *m, const char *why)
{
    if (m->ws) {
        log_warn("stepping down as leader (term %lld): %s", (long long)atomic_load(&m->term), why);
        atomic_fetch_add(&m->stats.step_downs, 1);
    }
    atomic_store(&m->leader, false);
    /* Replies that were waiting for a commit that will not happen. */
    for (MgrCmd *c = m->done_head; c; c = c->next)
        if (c->status < 400)
            cmd_fail(c, 503, "not-leader",
                     "leadership was lost before the change was committed; retry");
    reject_all(m, m->waiters, "leadership was lost; retry");
    m->waiters = m->waiters_tail = NULL;
    flush_done(m);
    eventlist_clear(&m->batch);
    proj_reset(m);
    ws_free(m->ws);
    m->ws = NULL;
    PQfinish(m->conn);
    m->conn = NULL;
}

static int ensure_conn(Manager *m)
{
    if (m->conn && PQstatus(m->conn) == CONNECTION_OK)
        return 0;
    PQfinish(m->conn);
    Err err = {0};
    m->conn = db_connect(m->cfg.database_url, "manager", &err);
    if (!m->conn) {
        if (!m->db_down_logged)
            log_warn("manager cannot reach the database, retrying: %s", err.msg);
        m->db_down_logged = true;
        return -1;
    }
    if (m->db_down_logged)
        log_info("manager reached the database again");
    m->db_down_logged = false;
    return 0;
}

/* Assigns seq, term and time to the events in tmp, applies them to the state
 * and moves them to the round's batch, folding each into its work's row. */
static void emit(Manager *m, EventList *tmp, int64_t now)
{
    for (size_t i = 0; i < tmp->len; i++) {
        Event *e = &tmp->items[i];
        e->seq = ++m->last_seq;
        e->term = atomic_load(&m->term);
        e->at = now;
        if (event_is_final(e->type) && !e->queue) {
            const WorkItem *it = ws_get(m->ws, e->work_id);
            e->queue = xstrdup(it ? it->queue : "");
        }
        ws_apply(m->ws, e);
        if (e->work_id) {
            ProjRow *row = hmap_get(&m->proj, e->work_id);
            if (!row) {
                row = xmalloc(sizeof *row);
                projrow_init(row, e->work_id);
                hmap_put(&m->proj, row->id, row);
            }
            projrow_fold(row, e);
        }
        Event *dst = eventlist_push(&m->batch);
        *dst = *e;
        memset(e, 0, sizeof *e);
    }
    tmp->len = 0;
}

static int commit_batch(Manager *m)
{
    if (m->batch.len == 0)
        return 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    Err err = {0};
    ProjRow **rows = xcalloc(m->proj.len + 1, sizeof *rows);
    size_t nrows = 0;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&m->proj, &i, &k, &v);)
        rows[nrows++] = v;
    int rc = journal_append(m->conn, &m->batch, rows, nrows, &err);
    free(rows);
    proj_reset(m);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (rc != 0) {
        step_down(m, err.msg);
        return -1;
    }
    long long us = (b.tv_sec - a.tv_sec) * 1000000LL + (b.tv_nsec - a.tv_nsec) / 1000;
    if (m->cfg.on_commit)
        m->cfg.on_commit(&m->batch, m->cfg.on_commit_ud);
    histogram_observe(&m->stats.commit_us, us);
    histogram_observe(&m->stats.commit_events, (int64_t)m->batch.len);
    for (size_t i = 0; i < m->batch.len; i++) {
        const Event *e = &m->batch.items[i];
        atomic_fetch_add(&m->stats.events_by_type[e->type], 1);
        if (log_enabled(LOG_DEBUG))
            log_debug("work %s: %s (attempt %d%s%s)", e->work_id ? e->work_id : "-",
                      event_type_name(e->type), e->attempt, e->worker_id ? ", worker " : "",
                      e->worker_id ? e->worker_id : "");
    }
    eventlist_clear(&m->batch);
    m->last_db_ok = mono_ms();
    return 0;
}

/* Tries the leader lock once; on success rebuilds the state and opens a term. */
static void campaign(Manager *m)
{
    if (ensure_conn(m) != 0)
        return;
    Err err = {0};
    char cls[16], obj[16];
    snprintf(cls, sizeof cls, "%d", DB_LOCK_CLASS);
    snprintf(obj, sizeof obj, "%d", DB_LOCK_LEADER);
    const char *params[] = {cls, obj};
    PGresult *r = db_exec(m->conn, "SELECT pg_try_advisory_lock($1::int, $2::int)", 2, params,
                          "trying the leader lock", &err);
    if (!r) {
        log_warn("election: %s", err.msg);
        PQfinish(m->conn);
        m->conn = NULL;
        return;
    }
    bool won = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!won)
        return;

    int64_t t0 = mono_ms();
    if (journal_prepare(m->conn, &err) != 0) {
        log_error("won the lock but cannot prepare statements: %s", err.msg);
        PQfinish(m->conn); /* releases the lock */
        m->conn = NULL;
        return;
    }
    m->ws = ws_new(&m->cfg.ws);
    int64_t last_term = 0;
    if (journal_recover(m->conn, m->ws, &m->last_seq, &last_term, &err) != 0) {
        log_error("won the lock but could not recover: %s", err.msg);
        step_down(m, "recovery failed");
        return;
    }
    int64_t now = wall_ms();
    atomic_store(&m->term, last_term + 1);
    EventList tmp;
    eventlist_init(&tmp);
    Event *e = eventlist_push(&tmp);
    e->type = EV_TERM;
    e->new_term = last_term + 1;
    e->leader_url = xstrdup(m->cfg.advertise_url);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    if (commit_batch(m) != 0)
        return;
    ws_adopt_running_workers(m->ws, now);
    atomic_store(&m->leader, true);
    atomic_fetch_add(&m->stats.elections_won, 1);
    log_info("elected leader: term %lld, %zu open work items recovered in %lld ms, "
             "advertising %s",
             (long long)(last_term + 1), ws_open_count(m->ws), (long long)(mono_ms() - t0),
             m->cfg.advertise_url);
}

/* ---- handling commands (leader only) ---- */

static json_t *job_json(const WorkItem *it)
{
    char deadline[40];
    time_format(it->deadline, deadline, sizeof deadline);
    return json_pack("{s:s, s:i, s:s, s:i, s:O, s:I, s:s}", "id", it->id, "attempt", it->attempt,
                     "queue", it->queue, "priority", it->priority, "payload", it->payload,
                     "timeout_ms", (json_int_t)it->timeout_ms, "deadline", deadline);
}

/* Hands ready jobs to a pull, up to its max; returns how many. */
static int fill_pull(Manager *m, MgrCmd *c, int64_t now)
{
    json_t *jobs = json_object_get(c->reply, "jobs");
    EventList tmp;
    eventlist_init(&tmp);
    bool seen = false;
    while ((int)json_array_size(jobs) < c->max &&
           ws_decide_start(m->ws, c->worker_id, c->queues, now, &tmp)) {
        /* A waiting pull whose client has gone (a killed or stopping worker)
         * must not be handed work: the jobs would wait for their deadline.
         * Asked only when there is a job to hand, not every round. */
        if (!seen && c->deadline && c->alive && !c->alive(c->ud)) {
            eventlist_free(&tmp);
            return -1;
        }
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
        json_array_append_new(jobs, job_json(ws_get(m->ws, id)));
        free(id);
    }
    eventlist_free(&tmp);
    return (int)json_array_size(jobs);
}

static void handle_submit(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    SubmitResult *res = xcalloc(c->n_items, sizeof *res);
    Err err = {0};
    if (ws_decide_submit(m->ws, c->items, c->n_items, known->items, known->n, now, &tmp, res,
                         &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        json_t *items = json_array();
        for (size_t i = 0; i < c->n_items; i++)
            json_array_append_new(items,
                                  json_pack("{s:s, s:s, s:b}", "id", c->items[i].id, "status",
                                            res[i].status, "created", res[i].created));
        emit(m, &tmp, now);
        cmd_ok(c, 202, json_pack("{s:o}", "items", items));
    }
    free(res);
    eventlist_free(&tmp);
}

static const KnownWork *known_find(const KnownSet *k, const char *id)
{
    for (size_t i = 0; i < k->n; i++)
        if (!strcmp(k->items[i].id, id))
            return &k->items[i];
    return NULL;
}

static void handle_cancel(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    if (ws_decide_cancel(m->ws, c->work_id, now, &tmp, &err) != 0) {
        const KnownWork *k = err.status == 404 ? known_find(known, c->work_id) : NULL;
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
        cmd_ok(c, 200, json_pack("{s:s, s:s}", "id", c->work_id, "status", "cancelled"));
    }
    eventlist_free(&tmp);
}

static void handle_retry(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    if (ws_decide_retry(m->ws, c->work_id, known_find(known, c->work_id), now, &tmp, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
    } else {
        log_info("work %s retried by an operator", c->work_id);
        emit(m, &tmp, now);
        cmd_ok(c, 200, json_pack("{s:s, s:s}", "id", c->work_id, "status", "pending"));
    }
    eventlist_free(&tmp);
}

static void handle_reports(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    json_t *results = json_array();
    EventList tmp;
    eventlist_init(&tmp);
    size_t i;
    json_t *rep;
    json_array_foreach(c->reports, i, rep)
    {
        Report r = {0};
        r.work_id = json_string_value(json_object_get(rep, "id"));
        r.attempt = (int)json_integer_value(json_object_get(rep, "attempt"));
        r.worker_id = c->worker_id;
        r.completed = !strcmp(json_string_value(json_object_get(rep, "outcome")), "completed");
        r.result = json_object_get(rep, "result");
        r.error = json_string_value(json_object_get(rep, "error"));
        json_t *retry = json_object_get(rep, "retry");
        r.retry = !retry || json_is_true(retry);
        ReportResult res;
        ws_decide_report(m->ws, &r, ws_get(m->ws, r.work_id) ? NULL : known_find(known, r.work_id),
                         now, &tmp, &res);
        emit(m, &tmp, now);
        const WorkItem *after = res.accepted ? ws_get(m->ws, r.work_id) : NULL;
        if (after)
            res.status = ws_item_status(after, now);
        json_t *o = json_pack("{s:s, s:i, s:b}", "id", r.work_id, "attempt", r.attempt, "accepted",
                              res.accepted);
        if (res.accepted)
            json_object_set_new(o, "status", json_string(res.status));
        else
            json_object_set_new(o, "reason", json_string(res.reason));
        json_array_append_new(results, o);
    }
    eventlist_free(&tmp);
    cmd_ok(c, 200, json_pack("{s:o}", "results", results));
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

static void handle_pull(Manager *m, MgrCmd *c, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    ws_worker_seen(m->ws, c->worker_id, c->instance,
                   ws_worker_get(m->ws, c->worker_id) ? 0 : c->max, c->queues, NULL, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    cmd_ok(c, 200, json_pack("{s:[]}", "jobs"));
    int64_t wait = c->wait_ms < m->cfg.pull_wait_max_ms ? c->wait_ms : m->cfg.pull_wait_max_ms;
    if (fill_pull(m, c, now) > 0 || wait <= 0) {
        queue_done(m, c);
        return;
    }
    c->deadline = now + wait;
    add_waiter(m, c);
}

static json_t *cluster_json(Manager *m, int64_t now)
{
    json_t *workers = json_array();
    size_t pos = 0;
    const Worker *w;
    while ((w = ws_worker_next(m->ws, &pos))) {
        json_t *queues = json_array();
        for (size_t i = 0; w->queues && w->queues[i]; i++)
            json_array_append_new(queues, json_string(w->queues[i]));
        char seen[40];
        time_format(w->last_seen, seen, sizeof seen);
        json_array_append_new(workers,
                              json_pack("{s:s, s:i, s:o, s:O, s:s, s:I}", "id", w->id, "capacity",
                                        w->capacity, "queues", queues, "running",
                                        w->running ? w->running : json_null(), "last_heartbeat",
                                        seen, "silent_ms", (json_int_t)(now - w->last_seen)));
    }
    return json_pack("{s:s, s:I, s:o, s:o, s:I}", "leader", m->cfg.advertise_url, "term",
                     (json_int_t)atomic_load(&m->term), "workers", workers, "open",
                     ws_queue_stats(m->ws, now), "open_total", (json_int_t)ws_open_count(m->ws));
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

static void handle(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    switch (c->type) {
    case MC_SUBMIT:
        handle_submit(m, c, known, now);
        break;
    case MC_CANCEL:
        handle_cancel(m, c, known, now);
        break;
    case MC_REPORTS:
        handle_reports(m, c, known, now);
        break;
    case MC_RETRY:
        handle_retry(m, c, known, now);
        break;
    case MC_PULL:
        handle_pull(m, c, now);
        eventlist_free(&tmp);
        return; /* queued by handle_pull, now or later */
    case MC_HEARTBEAT:
        ws_worker_seen(m->ws, c->worker_id, c->instance, c->capacity, c->queues, c->running, now,
                       &tmp);
        emit(m, &tmp, now);
        cmd_ok(c, 200,
               json_pack("{s:I, s:I}", "heartbeat_interval_ms",
                         (json_int_t)m->cfg.heartbeat_interval_ms, "worker_timeout_ms",
                         (json_int_t)m->cfg.ws.worker_timeout_ms));
        break;
    case MC_DEREGISTER:
        ws_worker_forget(m->ws, c->worker_id, now, &tmp);
        emit(m, &tmp, now);
        drop_waiters_of(m, c->worker_id);
        log_info("worker %s deregistered", c->worker_id);
        cmd_ok(c, 204, NULL);
        break;
    case MC_CLUSTER:
        cmd_ok(c, 200, cluster_json(m, now));
        break;
    }
    eventlist_free(&tmp);
    queue_done(m, c);
}

/* Ids the commands name that are not open: the database tells what they are. */
/* Collects ids that are not open (the database must say what they are). */
typedef struct IdList {
    char **ids;
    size_t n, cap;
} IdList;

static void want_known(Manager *m, IdList *l, const char *id)
{
    if (!id || ws_get(m->ws, id))
        return;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->ids = xrealloc(l->ids, l->cap * sizeof *l->ids);
    }
    l->ids[l->n++] = (char *)id;
}

static int prefetch_known(Manager *m, MgrCmd *list, KnownSet *known)
{
    IdList l = {0};
    for (MgrCmd *c = list; c; c = c->next) {
        size_t i;
        json_t *rep;
        switch (c->type) {
        case MC_SUBMIT:
            /* A UUID this node just generated cannot exist yet (2^-122). */
            for (i = 0; i < c->n_items; i++)
                if (!c->items[i].generated)
                    want_known(m, &l, c->items[i].id);
            break;
        case MC_CANCEL:
        case MC_RETRY:
            want_known(m, &l, c->work_id);
            break;
        case MC_REPORTS:
            json_array_foreach(c->reports, i, rep)
            {
                want_known(m, &l, json_string_value(json_object_get(rep, "id")));
            }
            break;
        default:
            break;
        }
    }
    Err err = {0};
    int rc = journal_known(m->conn, l.ids, l.n, known, &err);
    free(l.ids);
    if (rc != 0)
        step_down(m, err.msg);
    return rc;
}

static void serve_waiters(Manager *m, int64_t now)
{
    MgrCmd *keep = NULL, *keep_tail = NULL;
    MgrCmd *c = m->waiters;
    m->waiters = m->waiters_tail = NULL;
    while (c) {
        MgrCmd *next = c->next;
        c->next = NULL;
        int got = fill_pull(m, c, now); /* -1: its client has gone */
        if (got != 0 || c->deadline <= now) {
            queue_done(m, c);
        } else {
            if (keep_tail)
                keep_tail->next = c;
            else
                keep = c;
            keep_tail = c;
        }
        c = next;
    }
    m->waiters = keep;
    m->waiters_tail = keep_tail;
}

static int64_t earliest_waiter(const Manager *m)
{
    int64_t t = INT64_MAX;
    for (const MgrCmd *c = m->waiters; c; c = c->next)
        if (c->deadline < t)
            t = c->deadline;
    return t;
}

/* One round as leader: wait for mail, a deadline or the database; then decide,
 * commit once, reply. */
static void lead_round(Manager *m)
{
    int64_t now = wall_ms();
    int64_t next = ws_next_deadline(m->ws);
    int64_t w = earliest_waiter(m);
    if (w < next)
        next = w;
    int64_t timeout = next == INT64_MAX ? HEALTH_CHECK_MS : next - now;
    if (timeout > HEALTH_CHECK_MS)
        timeout = HEALTH_CHECK_MS;
    if (timeout < 0)
        timeout = 0;
    struct pollfd pfd[2] = {{.fd = m->efd, .events = POLLIN},
                            {.fd = PQsocket(m->conn), .events = POLLIN}};
    int pr = poll(pfd, 2, (int)timeout);
    if (pr < 0 && errno != EINTR) {
        step_down(m, "poll failed");
        return;
    }
    if (pfd[1].revents) {
        /* The server spoke unprompted: a termination notice, or the socket closed. */
        if (!PQconsumeInput(m->conn) || PQstatus(m->conn) != CONNECTION_OK) {
            step_down(m, "the database session was lost");
            return;
        }
        PGnotify *n;
        while ((n = PQnotifies(m->conn)))
            PQfreemem(n);
    }
    MgrCmd *mail = take_mailbox(m);
    if (!mail && mono_ms() - m->last_db_ok >= HEALTH_CHECK_MS) {
        Err err = {0};
        PGresult *r = db_exec(m->conn, "SELECT 1", 0, NULL, "checking the session", &err);
        if (!r) {
            step_down(m, err.msg);
            return;
        }
        PQclear(r);
        m->last_db_ok = mono_ms();
    }
    now = wall_ms();
    ws_advance(m->ws, now);
    KnownSet known = {0};
    if (mail && prefetch_known(m, mail, &known) != 0) {
        reject_all(m, mail, "the database failed; retry");
        flush_done(m);
        return;
    }
    while (mail) {
        MgrCmd *following = mail->next;
        mail->next = NULL;
        handle(m, mail, &known, now);
        mail = following;
    }
    journal_known_free(&known);
    EventList tmp;
    eventlist_init(&tmp);
    ws_decide_timers(m->ws, now, &tmp);
    for (size_t i = 0; i < tmp.len; i++) {
        const Event *e = &tmp.items[i];
        if (e->type == EV_FAILED) /* from the timers: its worker went silent */
            atomic_fetch_add(&m->stats.workers_lost, 1);
        if (e->type == EV_DEAD)
            log_info("work %s is dead: %s", e->work_id, e->error ? e->error : "");
        else
            log_info("work %s attempt %d %s: %s", e->work_id, e->attempt, event_type_name(e->type),
                     e->error ? e->error : "");
    }
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    ws_advance(m->ws, now);
    serve_waiters(m, now);
    if (commit_batch(m) != 0)
        return;
    flush_done(m);
    atomic_store(&m->stats.open_work, (long long)ws_open_count(m->ws));
    long long nw = 0, np = 0;
    size_t pos = 0;
    while (ws_worker_next(m->ws, &pos))
        nw++;
    for (MgrCmd *c = m->waiters; c; c = c->next)
        np++;
    atomic_store(&m->stats.workers, nw);
    atomic_store(&m->stats.waiting_pulls, np);
}

/* ---- the thread ---- */

static void *manager_main(void *arg)
{
    Manager *m = arg;
    while (!atomic_load(&m->stopping)) {
        if (m->ws) {
            lead_round(m);
            continue;
        }
        campaign(m);
        if (m->ws)
            continue;
        /* A standby answers nothing: front-ends only send here while we lead,
         * but a command can race with a lost election. */
        struct pollfd pfd = {.fd = m->efd, .events = POLLIN};
        poll(&pfd, 1, (int)m->cfg.election_interval_ms);
        MgrCmd *mail = take_mailbox(m);
        if (mail) {
            reject_all(m, mail, "this node is not the leader; retry");
            flush_done(m);
        }
    }
    if (m->ws)
        step_down(m, "shutting down");
    PQfinish(m->conn);
    m->conn = NULL;
    MgrCmd *mail = take_mailbox(m);
    reject_all(m, mail, "the server is shutting down");
    flush_done(m);
    return NULL;
}

Manager *manager_start(const ManagerConfig *cfg, Err *err)
{
    Manager *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->cfg.database_url = xstrdup(cfg->database_url);
    m->cfg.advertise_url = xstrdup(cfg->advertise_url);
    pthread_mutex_init(&m->lock, NULL);
    eventlist_init(&m->batch);
    histogram_init(&m->stats.commit_us, histogram_us_bounds, 1e6);
    histogram_init(&m->stats.commit_events, histogram_size_bounds, 1);
    m->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m->efd < 0) {
        err_set(err, 500, "internal", "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&m->thread, NULL, manager_main, m) != 0) {
        err_set(err, 500, "internal", "cannot start the manager thread");
        goto fail;
    }
    return m;
fail:
    if (m->efd >= 0)
        close(m->efd);
    free((char *)m->cfg.database_url);
    free((char *)m->cfg.advertise_url);
    free(m);
    return NULL;
}

void manager_stop(Manager *m)
{
    if (!m)
        return;
    atomic_store(&m->stopping, true);
    uint64_t one = 1;
    ssize_t w = write(m->efd, &one, sizeof one);
    (void)w;
    pthread_join(m->thread, NULL);
    pthread_mutex_lock(&m->lock);
    m->closed = true;
    MgrCmd *late = m->head;
    m->head = m->tail = NULL;
    pthread_mutex_unlock(&m->lock);
    reject_all(m, late, "the server is shutting down");
    flush_done(m);
}

void manager_free(Manager *m)
{
    if (!m)
        return;
    close(m->efd);
    eventlist_free(&m->batch);
    pthread_mutex_destroy(&m->lock);
    free((char *)m->cfg.database_url);
    free((char *)m->cfg.advertise_url);
    free(m);
}
