/* manager: see manager.h. Only the manager thread touches the fields below the
 * "thread-owned" banner; the mailbox is shared under `lock` and signalled
 * through an eventfd so that the thread can also watch its database socket. */
#include "manager_private.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "election.h"
#include "hmap.h"
#include "projection.h"
#include "journal.h"
#include "log.h"
#include "trace.h"
#include "util.h"
#include "wake.h"
#include "webhooks.h"

#define HEALTH_CHECK_MS 1000

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
        free(c->items[i].key);
        json_decref(c->items[i].payload);
        strv_free(c->items[i].after);
        free(c->items[i].batch);
        free(c->items[i].traceparent);
        free(c->items[i].tracestate);
    }
    free(c->items);
    free(c->batch_id);
    if (c->batch_callback) {
        template_clear(c->batch_callback);
        free(c->batch_callback);
    }
    free(c->name);
    schedspec_free(c->schedule);
    free(c->work_id);
    free(c->worker_id);
    free(c->queue);
    free(c->key);
    free(c->state);
    free(c->instance);
    strv_free(c->queues);
    ws_running_free(c->running);
    ws_reports_free(c->reports, c->n_reports);
    progress_updates_free(c->updates, c->n_updates);
    free(c->results);
    free(c->submitted);
    for (size_t i = 0; i < c->n_jobs; i++) {
        free(c->jobs[i].id);
        free(c->jobs[i].queue);
        json_decref(c->jobs[i].payload);
        free(c->jobs[i].traceparent);
        free(c->jobs[i].tracestate);
    }
    free(c->jobs);
    for (size_t i = 0; i < c->n_tokens; i++)
        free(c->tokens[i].queue);
    free(c->tokens);
    ws_running_free(c->stale);
    cluster_view_free(c->cluster);
    if (c->sub) {
        subscription_clear(c->sub);
        free(c->sub);
    }
    free(c->reason);
    subscription_views_free(c->subs);
    queue_limits_clear(&c->limits);
    if (c->bulk) {
        journal_known_free(c->bulk);
        free(c->bulk);
    }
    free(c);
}

void cmd_fail(MgrCmd *c, int status, const char *type, const char *msg)
{
    c->status = status;
    err_set(&c->err, status, type, "%s", msg);
}

/* The answer itself is in the command's typed fields (manager.h). */
void cmd_ok(MgrCmd *c, int status)
{
    c->status = status;
}

void queue_done(Manager *m, MgrCmd *c)
{
    c->next = NULL;
    if (m->done_tail)
        m->done_tail->next = c;
    else
        m->done_head = c;
    m->done_tail = c;
}

/* Calls done() for every reply of the list from c on. */
static void answer_list(Manager *m, MgrCmd *c)
{
    while (c) {
        MgrCmd *next = c->next;
        c->next = NULL;
        if (c->status < 400)
            cmd_landed(m, c);
        c->done(c, c->ud);
        c = next;
    }
}

/* Answers the round's replies: only once nothing they say waits for a commit
 * (their events are committed, or none was made and no append is out), or
 * once a failed commit or a lost session has turned them into 503s. */
static void flush_done(Manager *m)
{
    MgrCmd *c = m->done_head;
    m->done_head = m->done_tail = NULL;
    answer_list(m, c);
}

static MgrCmd *take_mailbox(Manager *m)
{
    wake_drain(m->efd);
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
    wake_poke(m->efd);
}

void manager_allow_campaign(Manager *m, bool allow)
{
    atomic_store(&m->may_campaign, allow);
}

void manager_release(Manager *m)
{
    atomic_store(&m->release_asked, true);
    wake_poke(m->efd);
}

bool manager_is_leader(const Manager *m)
{
    return atomic_load(&m->leader);
}

const ManagerStats *manager_stats(const Manager *m)
{
    return &m->stats;
}

int manager_database(const Manager *m, char *label, size_t len)
{
    const Stores *stores = m->cfg.stores;
    int db = stores ? stores->of[m->cfg.shard] : 0, first = 0;
    while (db && stores->of[first] != db)
        first++;
    if (db)
        snprintf(label, len, "shard-%d", first);
    else
        snprintf(label, len, "home");
    return stores ? stores->n : 1;
}

const RetentionStats *manager_retention_stats(const Manager *m)
{
    static const RetentionStats none;
    return m->retention ? retention_stats(m->retention) : &none;
}

static bool leading(void *ud)
{
    return manager_is_leader(ud);
}

static int current_part(void *ud)
{
    const Manager *m = ud;
    return atomic_load(&m->cur_part);
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

/* What the database would say of an open item once final event e is applied. */
static KnownWork *known_snapshot(const WorkItem *it, const Event *e)
{
    KnownWork *k = xcalloc(1, sizeof *k);
    k->id = xstrdup(it->id);
    k->status = event_type_name(e->type); /* static: completed, dead, cancelled */
    k->attempts = it->attempt;
    k->payload = json_incref(it->payload);
    k->queue = xstrdup(it->queue);
    k->key = xstrdup(it->key);
    k->priority = it->priority;
    k->timeout_ms = it->timeout_ms;
    k->max_attempts = it->max_attempts;
    k->last_error = xstrdup(e->error ? e->error : it->last_error);
    k->batch = xstrdup(it->batch);
    k->traceparent = xstrdup(it->traceparent);
    k->tracestate = xstrdup(it->tracestate);
    return k;
}

static void known_snapshot_free(KnownWork *k)
{
    free((char *)k->id);
    json_decref(k->payload);
    free((char *)k->queue);
    free((char *)k->key);
    free((char *)k->last_error);
    free((char *)k->batch);
    free((char *)k->traceparent);
    free((char *)k->tracestate);
    free(k);
}

static void finished_reset(Manager *m)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&m->finished, &i, &k, &v);)
        known_snapshot_free(v);
    hmap_free(&m->finished);
}

/* What is known of an id that is not open: this round's own decisions first,
 * then what the database held when the round began. */
const KnownWork *known_get(const Manager *m, const KnownSet *known, const char *id)
{
    const KnownWork *k = hmap_get(&m->finished, id);
    if (k)
        return k;
    for (size_t i = 0; i < known->n; i++)
        if (!strcmp(known->items[i].id, id))
            return &known->items[i];
    return NULL;
}

/* Whether id names work already: open, finished this round, or (known, may be
 * NULL) found in the database. */
bool id_taken(const Manager *m, const KnownSet *known, const char *id)
{
    static const KnownSet none;
    return ws_get(m->ws, id) || known_get(m, known ? known : &none, id);
}

/* Answers every command of list 503 (type: why the caller should retry). */
static void reject_all_as(Manager *m, MgrCmd *list, const char *type, const char *why)
{
    while (list) {
        MgrCmd *next = list->next;
        cmd_fail(list, 503, type, why);
        queue_done(m, list);
        list = next;
    }
}

static void reject_all(Manager *m, MgrCmd *list, const char *why)
{
    reject_all_as(m, list, "not-leader", why);
}

/* Answers 503 the commands of list that wanted ids looked up (looks) while
 * another shard's database cannot say; returns the others, in order. */
static MgrCmd *reject_looks(Manager *m, MgrCmd *list)
{
    MgrCmd *keep = NULL, **tail = &keep;
    while (list) {
        MgrCmd *next = list->next;
        list->next = NULL;
        if (list->looks) {
            cmd_fail(list, 503, "database-unavailable",
                     "the database of another shard cannot be reached to look its ids up; retry "
                     "(generated ids need no look)");
            queue_done(m, list);
        } else {
            *tail = list;
            tail = &list->next;
        }
        list = next;
    }
    return keep;
}

/* Gives up leadership: the state is dropped (the log is the truth), the
 * session is closed so that the lock is released at once, and everything in
 * flight is answered 503 so that callers retry against the next leader. */
/* Empties h, which owns its keys and values. */
static void owned_clear(HMap *h)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(h, &i, &k, &v);) {
        free((char *)k);
        free(v);
    }
    hmap_free(h);
    hmap_init(h);
}

static void busy_clear(Manager *m)
{
    owned_clear(&m->busy);
}

static void claims_push(int64_t **v, size_t *n, const int64_t *add, size_t n_add)
{
    if (!n_add)
        return;
    *v = xrealloc(*v, (*n + n_add) * sizeof **v);
    memcpy(*v + *n, add, n_add * sizeof *add);
    *n += n_add;
}

/* Forgets every claim and busy id: the session that held them is gone. */
static void claims_clear(Manager *m)
{
    free(m->claims);
    free(m->claims_free);
    m->claims = m->claims_free = NULL;
    m->n_claims = m->n_claims_free = 0;
    for (size_t i = 0; i < m->n_flights; i++) {
        free(m->flights[i].claims);
        m->flights[i].claims = NULL;
        m->flights[i].n_claims = 0;
    }
    busy_clear(m);
}

void step_down(Manager *m, const char *why)
{
    if (m->ws) {
        char of[24] = "";
        if (m->cfg.shards > 1)
            snprintf(of, sizeof of, " of shard %d", m->cfg.shard);
        log_warn("stepping down as leader%s (term %lld): %s", of, (long long)atomic_load(&m->term),
                 why);
        atomic_fetch_add(&m->stats.step_downs, 1);
    }
    atomic_store(&m->leader, false);
    atomic_store(&m->cur_part, -1);
    /* Replies that were waiting for a commit that will not happen (or did,
     * unseen: the appends out are put in front of the round's replies). */
    for (size_t i = m->n_flights; i-- > 0;) {
        Flight *f = &m->flights[i];
        if (f->batch.len && m->cfg.on_commit)
            m->cfg.on_commit(COMMIT_FAILED, m->cfg.shard, &f->batch, m->cfg.on_commit_ud);
        if (f->done_tail) {
            f->done_tail->next = m->done_head;
            m->done_head = f->done_head;
            if (!m->done_tail)
                m->done_tail = f->done_tail;
        }
        eventlist_free(&f->batch);
    }
    claims_clear(m); /* the session that held them closes below */
    m->n_flights = 0;
    /* Every answer still held was decided from a state that includes what
     * was not committed: a 404 or 409 may be as wrong as a 202. */
    for (MgrCmd *c = m->done_head; c; c = c->next)
        cmd_fail(c, 503, "not-leader",
                 "leadership was lost before the change was committed; retry");
    reject_all(m, m->waiters, "leadership was lost; retry");
    m->waiters = m->waiters_tail = NULL;
    flush_done(m);
    eventlist_clear(&m->batch);
    proj_reset(m);
    finished_reset(m);
    m->n_inbox_ack = 0;
    if (m->ws)
        if (m->webhooks)
            webhooks_unlead(m->webhooks);
    progress_free(m->progress);
    m->progress = progress_new(&m->cfg.progress);
    ws_free(m->ws);
    m->ws = NULL;
    journal_close(m->conn);
    m->conn = NULL;
}

/* Assigns seq, term and time to event e (moved: e is left zeroed), decides
 * what it brings about into *more (ws_decide_followups), applies it to the
 * state and moves it to the round's batch, folding it into its work's row. */
static void emit_one(Manager *m, Event *e, int64_t now, EventList *more)
{
    e->seq = ++m->last_seq;
    e->term = atomic_load(&m->term);
    e->at = now;
    if (event_is_final(e->type)) {
        const WorkItem *it = ws_get(m->ws, e->work_id);
        if (!e->queue)
            e->queue = xstrdup(it ? it->queue : "");
        if (it && it->traceparent && !e->traceparent) { /* for /results and webhooks */
            e->traceparent = xstrdup(it->traceparent);
            e->tracestate = xstrdup(it->tracestate);
        }
        if (it) {
            KnownWork *old = hmap_del(&m->finished, e->work_id);
            if (old)
                known_snapshot_free(old);
            KnownWork *k = known_snapshot(it, e);
            hmap_put(&m->finished, k->id, k);
        }
    } else if ((e->type == EV_FAILED || e->type == EV_TIMED_OUT) && !e->queue) {
        /* Not written into the event's data: for workd_activity's count. */
        const WorkItem *it = ws_get(m->ws, e->work_id);
        e->queue = it ? xstrdup(it->queue) : NULL;
    }
    ws_decide_followups(m->ws, e, now, more);
    ws_apply(m->ws, e);
    if (e->work_id && (e->type == EV_STARTED || e->type == EV_FAILED || e->type == EV_TIMED_OUT ||
                       event_is_final(e->type)))
        progress_forget(m->progress, e->work_id); /* the attempt ended */
    if (e->work_id && e->type != EV_PROGRESS) {   /* progress changes no row */
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

/* A list of follow-ups being emitted, and how far (emit_event's stack). */
typedef struct Pending {
    EventList list;
    size_t next;
} Pending;

/* emit_one for e, then for what it brings about (its waiting children
 * released or cancelled, its batch finished), each right after its cause,
 * depth first, so that the log holds causes before effects. An explicit
 * stack, not recursion: a cancelled chain of waiting work may be as long as
 * the open work. */
static void emit_event(Manager *m, Event *e, int64_t now)
{
    Pending *stack = xcalloc(1, sizeof *stack);
    size_t depth = 1, cap = 1;
    eventlist_init(&stack[0].list);
    emit_one(m, e, now, &stack[0].list);
    while (depth) {
        Pending *top = &stack[depth - 1];
        if (top->next == top->list.len) {
            eventlist_free(&top->list);
            depth--;
            continue;
        }
        Event *x = &top->list.items[top->next++];
        /* Another path got there first (or, for work it accepts, this round
         * finished work under that id). */
        if (ws_followup_stale(m->ws, x) ||
            (x->type == EV_ACCEPTED && hmap_get(&m->finished, x->work_id))) {
            event_clear(x);
            continue;
        }
        EventList more;
        eventlist_init(&more);
        emit_one(m, x, now, &more);
        if (!more.len) {
            eventlist_free(&more);
            continue;
        }
        if (depth == cap) {
            cap *= 2;
            stack = xrealloc(stack, cap * sizeof *stack);
        }
        stack[depth++] = (Pending){.list = more, .next = 0};
    }
    free(stack);
}

/* emit_event for each event of tmp, in order; tmp is left empty. */
void emit(Manager *m, EventList *tmp, int64_t now)
{
    for (size_t i = 0; i < tmp->len; i++)
        emit_event(m, &tmp->items[i], now);
    tmp->len = 0;
}

/* The part to append into: the newest whose start has come, never an older
 * one than the last append's (a new leader's clock may lag). The parts are
 * read again when the next one is due or, when none is known, every second
 * until the retention thread has added it. -1: the leader stepped down. */
WARN_UNUSED static int choose_part(Manager *m, int64_t now, Err *err)
{
    const PartList *pl = m->parts;
    bool next_known = false;
    for (size_t i = 0; i < pl->n; i++)
        if (pl->items[i].part > m->part) {
            next_known = true;
            if (pl->items[i].starts_at <= now)
                m->part = pl->items[i].part;
        }
    if (!next_known && now - m->parts_read_ms >= 1000) {
        if (settle(m) != 0)
            return -1;
        if (journal_parts(m->conn, m->parts, err) != 0) {
            step_down(m, err->msg);
            return -1;
        }
        m->parts_read_ms = now;
        for (size_t i = 0; i < pl->n; i++)
            if (pl->items[i].part > m->part && pl->items[i].starts_at <= now)
                m->part = pl->items[i].part;
    }
    atomic_store(&m->cur_part, m->part);
    return 0;
}

/* Moves the round's replies to the end of the list from *head to *tail. */
static void take_done(Manager *m, MgrCmd **head, MgrCmd **tail)
{
    if (!m->done_head)
        return;
    if (*tail)
        (*tail)->next = m->done_head;
    else
        *head = m->done_head;
    *tail = m->done_tail;
    m->done_head = m->done_tail = NULL;
}

/* Reads the outcome of the oldest append out (waiting for it) and finishes
 * its round: published, counted, replied to. -1: the leader stepped down. */
WARN_UNUSED static int land_flight(Manager *m)
{
    Flight *f = &m->flights[0];
    Err err = {0};
    if (journal_append_recv(m->conn, f->batch.len, &err) != 0) {
        if (!strcmp(err.type, "database-refused")) /* it would fail again */
            suspects_note(m, f, err.msg);
        step_down(m, err.msg);
        return -1;
    }
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    long long us = (b.tv_sec - f->sent.tv_sec) * 1000000LL + (b.tv_nsec - f->sent.tv_nsec) / 1000;
    if (m->cfg.on_commit)
        m->cfg.on_commit(COMMIT_DONE, m->cfg.shard, &f->batch, m->cfg.on_commit_ud);
    if (m->webhooks)
        webhooks_committed(m->webhooks, &f->batch);
    suspects_cleared(m, f);
    int64_t now = wall_ms();
    for (size_t i = 0; i < f->batch.len; i++)
        if (f->batch.items[i].type == EV_STARTED)
            ws_handed(m->ws, f->batch.items[i].work_id, f->batch.items[i].attempt, now);
    histogram_observe(&m->stats.commit_us, us);
    histogram_observe(&m->stats.commit_events, (int64_t)f->batch.len);
    for (size_t i = 0; i < f->batch.len; i++) {
        const Event *e = &f->batch.items[i];
        atomic_fetch_add(&m->stats.events_by_type[e->type], 1);
        if (log_enabled(LOG_DEBUG))
            log_debug("work %s: %s (attempt %d%s%s)", e->work_id ? e->work_id : "-",
                      event_type_name(e->type), e->attempt, e->worker_id ? ", worker " : "",
                      e->worker_id ? e->worker_id : "");
    }
    /* Only its own replies: the round's (m->done_head) may wait for events
     * of the round that are not even sent yet; they travel with its append. */
    MgrCmd *head = f->done_head;
    eventlist_free(&f->batch);
    claims_push(&m->claims_free, &m->n_claims_free, f->claims, f->n_claims);
    free(f->claims);
    memmove(&m->flights[0], &m->flights[1], --m->n_flights * sizeof *m->flights);
    if (!m->n_flights)
        atomic_fetch_add(&m->stats.busy_us,
                         b.tv_sec * 1000000LL + b.tv_nsec / 1000 - m->busy_from_us);
    m->last_db_ok = mono_ms();
    answer_list(m, head);
    return 0;
}

/* Lands every append out and leaves pipeline mode, so that the session can
 * run another statement (a read sees what they wrote). -1: stepped down. */
int settle(Manager *m)
{
    while (m->n_flights)
        if (land_flight(m) != 0)
            return -1;
    Err err = {0};
    if (m->conn && journal_pipeline_end(m->conn, &err) != 0) {
        step_down(m, err.msg);
        return -1;
    }
    return 0;
}

/* Sends the round's events, or keeps its replies for the appends out (they
 * may say what those appends decided). -1: the leader stepped down. */
WARN_UNUSED static int commit_batch(Manager *m)
{
    Err err = {0};
    if (m->batch.len == 0) {
        if (m->n_inbox_ack) { /* only inbox entries of ids that existed */
            if (settle(m) != 0)
                return -1;
            int rc =
                journal_inbox_forget(m->conn, m->cfg.shard, m->inbox_ack, m->n_inbox_ack, &err);
            m->n_inbox_ack = 0;
            if (rc != 0) {
                step_down(m, err.msg);
                return -1;
            }
            m->last_db_ok = mono_ms();
        }
        if (m->n_flights) {
            Flight *last = &m->flights[m->n_flights - 1];
            take_done(m, &last->done_head, &last->done_tail);
        }
        /* Nothing of this round's to commit: its claims may go. */
        claims_push(&m->claims_free, &m->n_claims_free, m->claims, m->n_claims);
        m->n_claims = 0;
        return 0;
    }
    if (m->n_flights == MAX_FLIGHTS && land_flight(m) != 0)
        return -1;
    if (choose_part(m, wall_ms(), &err) != 0)
        return -1;
    ProjRow **rows = xcalloc(m->proj.len + 1, sizeof *rows);
    size_t nrows = 0;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&m->proj, &i, &k, &v);)
        rows[nrows++] = v;
    AppendAfter after = {0};
    if (m->n_flights) {
        const Flight *prev = &m->flights[m->n_flights - 1];
        after.seq = prev->batch.items[prev->batch.len - 1].seq;
        after.part = prev->part;
    }
    if (m->cfg.on_commit)
        m->cfg.on_commit(COMMIT_BEGIN, m->cfg.shard, &m->batch, m->cfg.on_commit_ud);
    Flight *f = &m->flights[m->n_flights++];
    memset(f, 0, sizeof *f);
    f->part = m->part;
    clock_gettime(CLOCK_MONOTONIC, &f->sent);
    f->claims = m->claims; /* held until it has committed */
    f->n_claims = m->n_claims;
    m->claims = NULL;
    m->n_claims = 0;
    if (m->n_flights == 1)
        m->busy_from_us = f->sent.tv_sec * 1000000LL + f->sent.tv_nsec / 1000;
    int rc =
        journal_append_send(m->conn, m->cfg.shard, m->part, &m->batch, rows, nrows, m->inbox_ack,
                            m->n_inbox_ack, m->n_flights > 1 ? &after : NULL, &err);
    m->n_inbox_ack = 0;
    free(rows);
    proj_reset(m);
    finished_reset(m);
    f->batch = m->batch;
    eventlist_init(&m->batch);
    take_done(m, &f->done_head, &f->done_tail);
    if (rc != 0) {
        step_down(m, err.msg);
        return -1;
    }
    if (m->n_flights > 1)
        atomic_fetch_add(&m->stats.appends_behind, 1);
    return 0;
}

/* Stands for leader once (election.c); on a win rebuilds the state and opens
 * a term. */
static void campaign(Manager *m)
{
    if (election_try(&m->election, &m->conn) != ELECTION_WON)
        return;
    Err err = {0};
    int64_t t0 = mono_ms();
    m->ws = ws_new(&m->cfg.ws);
    int64_t last_term = 0;
    m->parts_read_ms = 0;
    if (journal_recover(m->conn, m->cfg.shard, m->cfg.shards, m->ws, wall_ms(), &m->last_seq,
                        &last_term, &m->part, &err) != 0 ||
        journal_parts(m->conn, m->parts, &err) != 0) {
        log_error("won the lock but could not recover: %s", err.msg);
        step_down(m, "recovery failed");
        return;
    }
    if (journal_listen(m->conn, &err) != 0) {
        step_down(m, err.msg);
        return;
    }
    if (journal_publish_budgets(m->conn, m->cfg.max_payload_bytes, m->cfg.max_json_depth, &err) !=
        0) {
        step_down(m, err.msg);
        return;
    }
    m->inbox_due = true; /* what was committed while no leader ran */
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
    if (commit_batch(m) != 0 || settle(m) != 0) /* the term is in the log before anything */
        return;
    ws_adopt_running_workers(m->ws, now);
    if (m->webhooks) { /* shard 0: the subscriptions' home */
        SubscriptionList *subs = view_subscriptions(m->conn, m->cfg.shards, &err);
        Cursor end;
        cursor_zero(&end, m->cfg.shards);
        end.seq[0] = m->last_seq; /* the others': read here, then kept by the thread */
        for (int k = 1; subs && k < m->cfg.shards; k++) /* (shards elsewhere: by it alone) */
            if ((!m->cfg.stores || m->cfg.stores->of[k] == 0) &&
                view_last_seq(m->conn, k, &end.seq[k], &err) != 0) {
                view_subscriptions_free(subs);
                subs = NULL;
            }
        if (!subs) {
            log_error("won the lock but could not read the webhook subscriptions: %s", err.msg);
            step_down(m, "recovery failed");
            return;
        }
        for (size_t i = 0; i < subs->len; i++) /* secrets included: the log keeps none */
            ws_subscription_restore(m->ws, &subs->items[i]);
        webhooks_lead(m->webhooks, subs, &end);
    }
    atomic_store(&m->leader, true);
    atomic_fetch_add(&m->stats.elections_won, 1);
    char of[24] = "";
    if (m->cfg.shards > 1)
        snprintf(of, sizeof of, " of shard %d", m->cfg.shard);
    log_info("elected leader%s: term %lld, %zu open work items recovered in %lld ms, "
             "advertising %s",
             of, (long long)(last_term + 1), ws_open_count(m->ws), (long long)(mono_ms() - t0),
             m->cfg.advertise_url);
}

void want_known(Manager *m, IdList *l, const char *id)
{
    if (!id || ws_get(m->ws, id))
        return;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->ids = xrealloc(l->ids, l->cap * sizeof *l->ids);
        l->claim = xrealloc(l->claim, l->cap * sizeof *l->claim);
    }
    l->claim[l->n] = false;
    l->ids[l->n++] = (char *)id;
}

void want_claimed(Manager *m, IdList *l, const char *id)
{
    size_t before = l->n;
    want_known(m, l, id);
    if (l->n > before && m->cfg.shards > 1)
        l->claim[before] = true;
}

bool id_busy(const Manager *m, const char *id)
{
    return m->busy.len && hmap_get(&m->busy, id);
}

const char *id_squatted(const Manager *m, const char *id)
{
    const char *who = m->busy.len ? hmap_get(&m->busy, id) : NULL;
    return who && who[0] ? who : NULL;
}

void want_claimed_made(Manager *m, IdList *l, char *id)
{
    size_t before = l->n;
    want_known_made(m, l, id);
    if (l->n > before && m->cfg.shards > 1)
        l->claim[before] = true;
}

/* A claim held by a session that is no leader: which, since when. Another
 * leader's look holds one for a moment; a squatter for longer. */
typedef struct Squat {
    int pid;
    int64_t since_ms, seen_ms;
} Squat;
#define SQUAT_MS 200      /* held longer by one session that is no leader: squatted */
#define SQUAT_GAP_MS 1500 /* not seen held for this long: a new observation */
#define SQUATS_MAX 4096   /* ids remembered so (forgotten all at once past it) */

static void squats_clear(Manager *m)
{
    owned_clear(&m->squats);
}

/* Whether id's claim, held by session pid that is no leader, has been held
 * by it for SQUAT_MS, as the node's retries of the command saw it (it is
 * refused, naming the session), rather than for a moment, as another
 * leader's look holds one (it waits, as for a leader's claim). */
static bool squatted(Manager *m, const char *id, int pid, int64_t now)
{
    Squat *x = hmap_get(&m->squats, id);
    if (!x) {
        if (m->squats.len >= SQUATS_MAX)
            squats_clear(m);
        x = xcalloc(1, sizeof *x);
        hmap_put(&m->squats, xstrdup(id), x);
        *x = (Squat){pid, now, now};
    } else if (x->pid != pid || now - x->seen_ms > SQUAT_GAP_MS) {
        *x = (Squat){pid, now, now};
    }
    x->seen_ms = now;
    return now - x->since_ms >= SQUAT_MS;
}

/* Notes ids[i] (busy[i]: its claim is held elsewhere) in m->busy, with who
 * holds each as c's database tells (journal_claim_holders). -1: c failed
 * (err). */
WARN_UNUSED static int note_busy(Manager *m, PGconn *c, char *const *ids, const bool *busy,
                                 size_t n, Err *err)
{
    char **held = xcalloc(n + 1, sizeof *held), **foreign = xcalloc(n + 1, sizeof *foreign);
    int *pid = xcalloc(n + 1, sizeof *pid);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (busy[i] && !id_busy(m, ids[i]))
            held[k++] = ids[i];
    int rc = journal_claim_holders(c, held, k, pid, foreign, err);
    int64_t now = mono_ms();
    for (size_t i = 0; rc == 0 && i < k; i++) {
        bool squat = foreign[i] && squatted(m, held[i], pid[i], now);
        if (squat)
            log_warn("id %s: its claim is held by %s, not by a leader of this cluster", held[i],
                     foreign[i]);
        hmap_put(&m->busy, xstrdup(held[i]), squat ? foreign[i] : xstrdup(""));
        if (squat)
            foreign[i] = NULL;
    }
    for (size_t i = 0; i < k; i++)
        free(foreign[i]);
    free(held);
    free(foreign);
    free(pid);
    return rc;
}

/* Releases the claims whose appends committed; then claims the ids of l
 * marked so, noting those another shard's leader holds. Every append out
 * has landed (settle). -1: the leader stepped down. */
WARN_UNUSED static int claim_ids(Manager *m, const IdList *l)
{
    Err err = {0};
    busy_clear(m);
    if (journal_release(m->conn, m->claims_free, m->n_claims_free, &err) != 0) {
        step_down(m, err.msg);
        return -1;
    }
    m->n_claims_free = 0;
    char **ids = xcalloc(l->n + 1, sizeof *ids);
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->claim[i])
            ids[n++] = l->ids[i];
    int64_t *keys = xcalloc(n + 1, sizeof *keys);
    bool *busy = xcalloc(n + 1, sizeof *busy);
    int rc = n ? journal_claim(m->conn, ids, n, keys, busy, &err) : 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!busy[i])
            claims_push(&m->claims, &m->n_claims, &keys[i], 1);
    if (rc == 0)
        rc = note_busy(m, m->conn, ids, busy, n, &err);
    free(ids);
    free(keys);
    free(busy);
    if (rc != 0)
        step_down(m, err.msg);
    return rc;
}

/* want_known for an id made for the lookup: l owns it. */
void want_known_made(Manager *m, IdList *l, char *id)
{
    l->made = xrealloc(l->made, (l->n_made + 1) * sizeof *l->made);
    l->made[l->n_made++] = id;
    want_known(m, l, id);
}

static void idlist_free(IdList *l)
{
    free(l->ids);
    free(l->claim);
    for (size_t i = 0; i < l->n_made; i++)
        free(l->made[i]);
    free(l->made);
}

/* Looks the ids of l up in the cluster's other databases too (after this
 * shard's own claims and look), claiming there for the look the ids l marks
 * so; those another leader holds there are busy (id_busy). -1: one of them
 * cannot be reached (err). */
WARN_UNUSED static int look_elsewhere(Manager *m, const IdList *l, KnownSet *known, Err *err)
{
    const Stores *st = m->cfg.stores;
    if (!st || st->n < 2)
        return 0;
    int own = st->of[m->cfg.shard], rc = 0;
    bool *busy = xcalloc(l->n + 1, sizeof *busy);
    for (int db = 0; rc == 0 && db < st->n; db++) {
        if (db == own)
            continue;
        JournalPeer *p = &m->peer[db];
        memset(busy, 0, l->n * sizeof *busy);
        if (journal_peer(p, st->url[db], err) != 0 ||
            journal_known_elsewhere(p->conn, l->ids, l->claim, l->n, busy, known, err) != 0 ||
            note_busy(m, p->conn, l->ids, busy, l->n, err) != 0) {
            if (p->conn)
                journal_peer_close(p, true);
            if (!p->down_logged) /* once an outage: rounds go on trying meanwhile */
                log_warn("shard %d: cannot look ids up in the database of another shard, so "
                         "client-chosen ids and dependencies wait (503): %s",
                         m->cfg.shard, err->msg);
            p->down_logged = true;
            rc = -1;
        } else if (p->down_logged) {
            log_info("shard %d: the database of another shard answers again", m->cfg.shard);
            p->down_logged = false;
        }
    }
    free(busy);
    return rc;
}

/* Looks up the ids of l in the database, after the appends out have landed
 * (so that it sees what they wrote), and in the cluster's other databases.
 * -1: the leader stepped down; -2: another database cannot be reached (its
 * error logged; the leader goes on). */
WARN_UNUSED static int lookup_known(Manager *m, IdList *l, KnownSet *known)
{
    memset(known, 0, sizeof *known);
    if (!l->n)
        return 0;
    Err err = {0};
    if (settle(m) != 0)
        return -1;
    if (m->cfg.shards > 1 && claim_ids(m, l) != 0)
        return -1;
    if (journal_known(m->conn, l->ids, l->n, known, &err) != 0) {
        step_down(m, err.msg);
        return -1;
    }
    if (look_elsewhere(m, l, known, &err) != 0) {
        journal_known_free(known);
        return -2;
    }
    return 0;
}

/* The ticks of tmp (ws_decide_ticks) whose work id is taken already, or whose
 * append the database refused twice: such a tick is recorded as skipped, its
 * work not accepted (a second accepted event under one id would break "one
 * id, one job", and an append the database refuses would stop every leader
 * that fires the tick). A tick's id is made from its schedule's name, which
 * this shard alone holds in the cluster (reserved, journal.h): it is looked
 * up, never claimed, so no lock another session holds can stop a tick.
 * -1: the leader stepped down; -2: another database cannot say
 * (lookup_known), tmp is as it was. */
WARN_UNUSED static int screen_ticks(Manager *m, EventList *tmp)
{
    IdList l = {0};
    for (size_t i = 0; i < tmp->len; i++)
        if (tmp->items[i].type == EV_ACCEPTED && !hmap_get(&m->finished, tmp->items[i].work_id))
            want_known(m, &l, tmp->items[i].work_id);
    KnownSet known;
    int rc = lookup_known(m, &l, &known);
    idlist_free(&l);
    if (rc != 0)
        return rc;
    size_t kept = 0;
    for (size_t i = 0; i < tmp->len; i++) {
        Event *e = &tmp->items[i];
        const char *why = NULL;
        if (e->type == EV_ACCEPTED)
            why = id_taken(m, &known, e->work_id) ? "duplicate-id"
                  : tick_isolated(m, e->work_id)  ? "append-refused"
                                                  : NULL;
        if (!why) {
            tmp->items[kept++] = *e;
            continue;
        }
        log_error("schedule tick: work %s is not accepted (%s); the tick is recorded as skipped",
                  e->work_id, why);
        for (size_t j = i + 1; j < tmp->len; j++) {
            Event *t = &tmp->items[j];
            if (t->type == EV_TICK && t->tick_work && !strcmp(t->tick_work, e->work_id)) {
                free(t->tick_work);
                t->tick_work = NULL;
                t->skipped = xstrdup(why);
                break;
            }
        }
        event_clear(e);
    }
    tmp->len = kept;
    journal_known_free(&known);
    return 0;
}

/* What the round's commands need to know of ids that are not open (each
 * kind's lookup, commands.c), read once for the whole round; a command that
 * wants any is marked (looks). -1: stepped down; -2: another database cannot
 * say (lookup_known). */
WARN_UNUSED static int prefetch_known(Manager *m, MgrCmd *list, KnownSet *known)
{
    IdList l = {0};
    for (MgrCmd *c = list; c; c = c->next) {
        size_t before = l.n;
        if (cmd_lookup(m, c, &l) != 0) {
            idlist_free(&l);
            return -1;
        }
        c->looks = l.n > before;
    }
    int rc = lookup_known(m, &l, known);
    idlist_free(&l);
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

/* What the clock brings about: attempts past their deadline or of silent
 * workers, due ticks (screened), waiting pulls served. -1: stepped down. */
WARN_UNUSED static int decide_timers(Manager *m, int64_t now)
{
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
    ws_decide_ticks(m->ws, now, &tmp);
    int screened = tmp.len ? screen_ticks(m, &tmp) : 0;
    if (screened == -1) {
        eventlist_free(&tmp);
        return -1;
    }
    if (screened == 0) /* else another database cannot say: the ticks wait for a later round */
        emit(m, &tmp, now);
    eventlist_free(&tmp);
    ws_advance(m->ws, now);
    serve_waiters(m, now);
    return 0;
}

/* Lands the appends whose answers libpq already holds (read with an earlier
 * answer, say): the socket will not wake the poll for them. -1: stepped down. */
WARN_UNUSED static int land_answered(Manager *m)
{
    while (m->n_flights && !journal_busy(m->conn))
        if (land_flight(m) != 0)
            return -1;
    return 0;
}

/* One round as leader: wait for mail, a deadline or the database; then decide,
 * commit once, reply. */
/* Closes the stats window when it is due (ManagerStats.window_*). */
static void stats_window(Manager *m)
{
    int64_t now = mono_ms() * 1000;
    const Histogram *h = &m->stats.commit_us;
    if (m->window_us && now - m->window_us < STATS_WINDOW_MS * 1000)
        return;
    int64_t busy = atomic_load(&m->stats.busy_us), count = atomic_load(&h->count),
            sum = atomic_load(&h->sum);
    if (m->window_us) {
        int64_t n = count - m->window_count, at = 0, seen = 0;
        atomic_store(&m->stats.window_busy_permille,
                     (busy - m->window_busy_us) * 1000 / (now - m->window_us));
        atomic_store(&m->stats.window_commit_mean_us, n ? (sum - m->window_sum_us) / n : 0);
        for (int i = 0; i < HISTOGRAM_BUCKETS && n; i++) {
            seen += atomic_load(&h->buckets[i]) - m->window_buckets[i];
            at = h->bounds[i];
            if (seen * 100 >= n * 99)
                break;
        }
        atomic_store(&m->stats.window_commit_p99_us, at);
    }
    m->window_us = now;
    m->window_busy_us = busy;
    m->window_count = count;
    m->window_sum_us = sum;
    for (int i = 0; i < HISTOGRAM_BUCKETS; i++)
        m->window_buckets[i] = atomic_load(&h->buckets[i]);
}

static void lead_round(Manager *m)
{
    stats_window(m);
    if (land_answered(m) != 0)
        return;
    /* Claims of ids whose appends committed go at once when nothing is out:
     * another shard's leader may be waiting for one. */
    if (!m->n_flights && m->n_claims_free) {
        Err err = {0};
        if (journal_pipeline_end(m->conn, &err) != 0 ||
            journal_release(m->conn, m->claims_free, m->n_claims_free, &err) != 0) {
            step_down(m, err.msg);
            return;
        }
        m->n_claims_free = 0;
    }
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
                            {.fd = journal_socket(m->conn), .events = POLLIN}};
    int pr = poll(pfd, 2, (int)timeout);
    if (pr < 0 && errno != EINTR) {
        step_down(m, "poll failed");
        return;
    }
    if (pfd[1].revents) {
        /* The outcome of an append out, a notification, a termination
         * notice, or the socket closed. */
        if (journal_consume(m->conn, &m->inbox_due) != 0) {
            step_down(m, "the database session was lost");
            return;
        }
        if (land_answered(m) != 0)
            return;
    }
    MgrCmd *mail = take_mailbox(m);
    if (take_inbox(m, &mail) != 0)
        return;
    char alone_key[24];
    bool alone = take_suspect(m, &mail);
    if (alone)
        cmd_key(mail, alone_key);
    if (!mail && mono_ms() - m->last_db_ok >= HEALTH_CHECK_MS) {
        Err err = {0};
        if (settle(m) != 0)
            return;
        if (journal_ping(m->conn, &err) != 0 ||
            journal_release(m->conn, m->claims_free, m->n_claims_free, &err) != 0) {
            step_down(m, err.msg);
            return;
        }
        m->n_claims_free = 0;
        m->last_db_ok = mono_ms();
    }
    now = wall_ms();
    ws_advance(m->ws, now);
    KnownSet known = {0};
    int looked = mail ? prefetch_known(m, mail, &known) : 0;
    if (looked == -1) {
        reject_all(m, mail, "the database failed; retry");
        flush_done(m);
        return;
    }
    if (looked == -2) /* the others go on: they need no look */
        mail = reject_looks(m, mail);
    while (mail) {
        MgrCmd *following = mail->next;
        mail->next = NULL;
        handle(m, mail, &known, now);
        mail = following;
    }
    journal_known_free(&known);
    /* A suspect's round holds it alone: if the database refuses this append
     * too, it is the suspect's own. */
    if (!alone && decide_timers(m, now) != 0)
        return;
    if (alone && !m->batch.len)
        unsuspect(m, alone_key); /* it wrote nothing: nothing of it can be refused */
    if (commit_batch(m) != 0)
        return;
    flush_done(m); /* what waits for no append out */
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
        if (m->ws && atomic_exchange(&m->release_asked, false)) {
            if (settle(m) == 0) /* what was sent is answered as it went */
                step_down(m, "handing the shard to a less loaded node");
            continue;
        }
        if (m->ws) {
            lead_round(m);
            continue;
        }
        atomic_store(&m->release_asked, false);
        if (atomic_load(&m->may_campaign))
            campaign(m);
        if (m->ws)
            continue;
        /* A standby answers nothing: front-ends only send here while we lead,
         * but a command can race with a lost election. */
        wake_wait(m->efd, (int)m->cfg.election_interval_ms);
        MgrCmd *mail = take_mailbox(m);
        if (mail) {
            reject_all(m, mail, "this node is not the leader; retry");
            flush_done(m);
        }
    }
    if (m->ws && settle(m) == 0) /* what was sent is answered as it went */
        step_down(m, "shutting down");
    journal_close(m->conn);
    m->conn = NULL;
    for (int db = 0; db < SHARDS_MAX; db++)
        journal_peer_close(&m->peer[db], false);
    MgrCmd *mail = take_mailbox(m);
    reject_all(m, mail, "the server is shutting down");
    flush_done(m);
    return NULL;
}

/* The webhooks thread's requests: commands like any other, freed when done. */
static void own_cmd_done(MgrCmd *c, void *ud)
{
    if (c->status >= 400 && strcmp(c->err.type, "not-leader") != 0)
        log_warn("webhooks: %s", c->err.msg);
    mgrcmd_free(c);
}

static void webhooks_cursor(void *ud, const char *name, const Cursor *cursor)
{
    MgrCmd *c = mgrcmd_new(MC_SUB_CURSOR);
    c->name = xstrdup(name);
    c->sub = xcalloc(1, sizeof *c->sub);
    c->sub->cursor = *cursor;
    c->done = own_cmd_done;
    manager_send(ud, c);
}

static void webhooks_pause(void *ud, const char *name, const char *reason)
{
    MgrCmd *c = mgrcmd_new(MC_SUB_PAUSE);
    c->name = xstrdup(name);
    c->reason = xstrdup(reason);
    c->done = own_cmd_done;
    manager_send(ud, c);
}

/* Whether cfg's shard is the first of those its database keeps: its manager
 * runs that database's retention (parts are a database's, not a shard's). */
static bool first_of_database(const ManagerConfig *cfg)
{
    if (!cfg->stores)
        return cfg->shard == 0;
    for (int s = 0; s < cfg->shard; s++)
        if (cfg->stores->of[s] == cfg->stores->of[cfg->shard])
            return false;
    return true;
}

Manager *manager_start(const ManagerConfig *cfg, Err *err)
{
    Manager *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->cfg.database_url = xstrdup(cfg->database_url);
    m->cfg.advertise_url = xstrdup(cfg->advertise_url);
    m->election.database_url = m->cfg.database_url;
    atomic_store(&m->may_campaign, true);
    if (m->cfg.shards < 1)
        m->cfg.shards = 1;
    m->election.shard = cfg->shard;
    m->election.shards = m->cfg.shards;
    pthread_mutex_init(&m->lock, NULL);
    eventlist_init(&m->batch);
    histogram_init(&m->stats.commit_us, histogram_us_bounds, 1e6);
    histogram_init(&m->stats.commit_events, histogram_size_bounds, 1);
    if ((m->efd = wake_open(err)) < 0)
        goto cleanup;
    m->parts = xcalloc(1, sizeof *m->parts);
    atomic_store(&m->cur_part, -1);
    RetentionConfig rc = {.database_url = cfg->database_url,
                          .retain_ms = cfg->retain_ms,
                          .span_ms = retention_span(cfg->retain_ms),
                          .interval_ms = retention_span(cfg->retain_ms) / 4 < 1000
                                             ? retention_span(cfg->retain_ms) / 4
                                             : 1000,
                          .leading = leading,
                          .current_part = current_part,
                          .ud = m};
    if (first_of_database(cfg) && !(m->retention = retention_start(&rc, err)))
        goto cleanup;
    m->progress = progress_new(&cfg->progress);
    hmap_init(&m->suspects);
    hmap_init(&m->busy);
    hmap_init(&m->squats);
    WebhooksConfig wc = {.database_url = cfg->database_url,
                         .shards = m->cfg.shards,
                         .stores = cfg->stores,
                         .pause_after_ms = cfg->webhook_pause_after_ms,
                         .timeout_ms = cfg->webhook_timeout_ms,
                         .backoff_base_ms = cfg->webhook_backoff_base_ms,
                         .backoff_max_ms = cfg->webhook_backoff_max_ms,
                         .allow = cfg->webhook_allow,
                         .cursor = webhooks_cursor,
                         .pause = webhooks_pause,
                         .ud = m};
    if (cfg->shard == 0 && !(m->webhooks = webhooks_start(&wc, err)))
        goto cleanup;
    if (pthread_create(&m->thread, NULL, manager_main, m) != 0) {
        err_set(err, 500, "internal", "cannot start the manager thread");
        goto cleanup;
    }
    return m;
cleanup:
    retention_stop(m->retention);
    webhooks_stop(m->webhooks);
    progress_free(m->progress);
    free(m->parts);
    wake_close(m->efd);
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
    retention_stop(m->retention);
    m->retention = NULL;
    wake_poke(m->efd);
    pthread_join(m->thread, NULL);
    pthread_mutex_lock(&m->lock);
    m->closed = true;
    MgrCmd *late = m->head;
    m->head = m->tail = NULL;
    pthread_mutex_unlock(&m->lock);
    reject_all(m, late, "the server is shutting down");
    flush_done(m);
    webhooks_stop(m->webhooks);
    m->webhooks = NULL;
}

void manager_free(Manager *m)
{
    if (!m)
        return;
    wake_close(m->efd);
    free(m->parts);
    free(m->inbox_ack);
    progress_free(m->progress);
    suspects_clear(m);
    hmap_free(&m->suspects);
    claims_clear(m);
    hmap_free(&m->busy);
    squats_clear(m);
    hmap_free(&m->squats);
    eventlist_free(&m->batch);
    pthread_mutex_destroy(&m->lock);
    free((char *)m->cfg.database_url);
    free((char *)m->cfg.advertise_url);
    free(m);
}
