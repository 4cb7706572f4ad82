/* manager: see manager.h. Only the manager thread touches the fields below the
 * "thread-owned" banner; the mailbox is shared under `lock` and signalled
 * through an eventfd so that the thread can also watch its database socket. */
#include "manager.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "db.h"
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

/* An append sent (pipeline mode) and not yet answered, with what waits for it. */
typedef struct Flight {
    EventList batch;               /* its events, applied to the state */
    int part;                      /* the part it appends into */
    MgrCmd *done_head, *done_tail; /* replies to send once it (and those before) committed */
    struct timespec sent;
} Flight;

/* At most this many appends out at once: one being committed while the next
 * waits its turn in the session, so that PostgreSQL does not wait for the
 * manager between commits. */
enum { MAX_FLIGHTS = 2 };

struct Manager {
    ManagerConfig cfg;
    pthread_t thread;
    atomic_bool stopping;
    bool closed; /* under lock: the thread is gone, answer at once */
    atomic_bool leader;
    atomic_llong term;
    ManagerStats stats;
    Retention *retention;
    Webhooks *webhooks;  /* deliveries while leading (its own thread; webhooks.h) */
    atomic_int cur_part; /* the part the leader appends into; -1 while not leading */
    /* mailbox */
    pthread_mutex_t lock;
    MgrCmd *head, *tail;
    int efd;
    /* ---- thread-owned ---- */
    PGconn *conn;
    WorkState *ws;
    int64_t last_seq;
    int part;              /* the part this leader appends into (also in cur_part) */
    PartList *parts;       /* the parts as last read */
    int64_t parts_read_ms; /* when */
    Election election;     /* stands for leader on conn */
    int64_t last_db_ok;
    MgrCmd *waiters, *waiters_tail; /* pulls waiting for work, FIFO */
    MgrCmd *done_head, *done_tail;  /* replies to send after the commit */
    EventList batch;                /* events of this round, applied, not yet committed */
    Flight flights[MAX_FLIGHTS];    /* appends sent, outcome not yet read: oldest first */
    size_t n_flights;
    HMap proj;             /* work id -> ProjRow: what the batch makes of its rows */
    bool inbox_due;        /* workd_inbox may hold submissions (NOTIFY, or the poll) */
    int64_t inbox_read_ms; /* when it was last read */
    int64_t *inbox_ack;    /* entries this round took into the log */
    size_t n_inbox_ack, cap_inbox_ack;
    HMap finished; /* work id -> KnownWork: work this round finished (owned copies), so that
                      the round decides from its own decisions, not only from the database */
    ProgressBook *progress; /* budgets of the attempts that sent progress */
    /* What was in an append the database refused for what it held (it
     * would refuse it again): commands by fingerprint ("c:..."), and work ids
     * workd made ("w:<id>", a tick's) -> Suspect. Kept across step-downs, so
     * that one bad command cannot make this node step down over and over: a
     * suspect is decided alone in its round (its append is then its own) and
     * one refused twice is refused (409 append-refused) or, a tick, skipped. */
    HMap suspects;
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
    ws_running_free(c->stale);
    cluster_view_free(c->cluster);
    json_decref(c->reply);
    json_decref(c->detail);
    queue_limits_clear(&c->limits);
    if (c->bulk) {
        journal_known_free(c->bulk);
        free(c->bulk);
    }
    free(c);
}

static void cmd_fail(MgrCmd *c, int status, const char *type, const char *msg)
{
    c->status = status;
    err_set(&c->err, status, type, "%s", msg);
}

/* The answer itself is in the command's typed fields (manager.h). */
static void cmd_ok(MgrCmd *c, int status)
{
    c->status = status;
}

/* For the answers not typed yet: reply (taken) is sent as it is. */
static void cmd_ok_json(MgrCmd *c, int status, json_t *reply)
{
    json_decref(c->reply);
    c->reply = reply;
    c->status = status;
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

/* Calls done() for every reply of the list from c on. */
static void answer_list(Manager *m, MgrCmd *c)
{
    while (c) {
        MgrCmd *next = c->next;
        c->next = NULL;
        if (c->type == MC_SUBSCRIPTION_SET && c->status == 200 && !c->reply)
            c->reply =
                webhooks_json(m->webhooks, json_string_value(json_object_get(c->detail, "name")));
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

bool manager_is_leader(const Manager *m)
{
    return atomic_load(&m->leader);
}

const ManagerStats *manager_stats(const Manager *m)
{
    return &m->stats;
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
static const KnownWork *known_get(const Manager *m, const KnownSet *known, const char *id)
{
    const KnownWork *k = hmap_get(&m->finished, id);
    if (k)
        return k;
    for (size_t i = 0; i < known->n; i++)
        if (!strcmp(known->items[i].id, id))
            return &known->items[i];
    return NULL;
}

#define SUSPECTS_MAX 10000 /* remembered; past it the memory starts again */
#define SUSPECT_ISOLATE 2  /* refused appends after which a command is not tried again */

typedef struct Suspect {
    unsigned refused; /* appends the database refused that held it */
    char key[];
} Suspect;

static void suspects_clear(Manager *m)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&m->suspects, &i, &k, &v);)
        free(v);
    hmap_free(&m->suspects);
    hmap_init(&m->suspects);
}

static uint64_t fp_str(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL; /* FNV-1a */
    return (h ^ 0xff) * 1099511628211ULL;               /* an end, so "ab"+"c" != "a"+"bc" */
}

static uint64_t fp_int(uint64_t h, long long v)
{
    char b[24];
    snprintf(b, sizeof b, "%lld", v);
    return fp_str(h, b);
}

/* A command's fingerprint: its type and what it names, so that the same
 * request sent again (a client retrying after a 503) has the same one. */
static void cmd_key(const MgrCmd *c, char out[24])
{
    uint64_t h = fp_int(14695981039346656037ULL, c->type);
    for (size_t i = 0; i < c->n_items; i++)
        h = fp_str(h, c->items[i].id);
    for (size_t i = 0; i < c->n_reports; i++)
        h = fp_int(fp_str(h, c->reports[i].work_id), c->reports[i].attempt);
    for (size_t i = 0; i < c->n_updates; i++)
        h = fp_int(fp_str(h, c->updates[i].work_id), c->updates[i].attempt);
    h = fp_str(fp_str(fp_str(h, c->work_id), c->worker_id), c->queue);
    h = fp_str(fp_str(h, c->name), c->batch_id);
    snprintf(out, 24, "c:%016llx", (unsigned long long)h);
}

/* Whether c may have put events into its round's append. */
static bool cmd_may_write(const MgrCmd *c)
{
    if (c->status >= 400)
        return false;
    switch (c->type) {
    case MC_CLUSTER:
    case MC_SUBSCRIPTION_GET:
    case MC_QUEUE_FLOW:
        return false;
    case MC_PULL:
        return c->n_jobs > 0;
    default:
        return true;
    }
}

static unsigned suspicion(const Manager *m, const char *key)
{
    const Suspect *x = hmap_get(&m->suspects, key);
    return x ? x->refused : 0;
}

static unsigned cmd_suspicion(const Manager *m, const MgrCmd *c)
{
    if (!m->suspects.len)
        return 0;
    char key[24];
    cmd_key(c, key);
    return suspicion(m, key);
}

static void suspect(Manager *m, const char *key, const char *what, const char *why)
{
    Suspect *x = hmap_get(&m->suspects, key);
    if (!x) {
        if (m->suspects.len >= SUSPECTS_MAX)
            suspects_clear(m);
        size_t len = strlen(key) + 1;
        x = xcalloc(1, sizeof *x + len);
        memcpy(x->key, key, len);
        hmap_put(&m->suspects, x->key, x);
    }
    if (++x->refused == SUSPECT_ISOLATE)
        log_error("%s: the database refused twice the append that held it (%s): it is not tried "
                  "again",
                  what, why);
}

static void unsuspect(Manager *m, const char *key)
{
    free(hmap_del(&m->suspects, key));
}

/* The database refused f for what it held: every command that may have
 * written to it becomes suspect (the one at fault among them is found by
 * deciding each alone next time); the work ids workd made (ticks) only when
 * no command was in it. */
static void suspects_note(Manager *m, const Flight *f, const char *why)
{
    size_t n = 0;
    char key[ID_MAX + 8];
    for (const MgrCmd *c = f->done_head; c; c = c->next)
        if (cmd_may_write(c)) {
            cmd_key(c, key);
            suspect(m, key, "a command", why);
            n++;
        }
    for (size_t i = 0; !n && i < f->batch.len; i++) {
        const Event *e = &f->batch.items[i];
        if (e->type == EV_ACCEPTED && strchr(e->work_id, SYSTEM_ID_MARK)) {
            snprintf(key, sizeof key, "w:%s", e->work_id);
            suspect(m, key, e->work_id, why);
        }
    }
}

/* f committed: nothing it held is suspect. */
static void suspects_cleared(Manager *m, const Flight *f)
{
    if (!m->suspects.len)
        return;
    char key[ID_MAX + 8];
    for (const MgrCmd *c = f->done_head; c; c = c->next) {
        cmd_key(c, key);
        unsuspect(m, key);
    }
    for (size_t i = 0; i < f->batch.len; i++)
        if (f->batch.items[i].type == EV_ACCEPTED) {
            snprintf(key, sizeof key, "w:%s", f->batch.items[i].work_id);
            unsuspect(m, key);
        }
}

static bool tick_isolated(const Manager *m, const char *work_id)
{
    char key[ID_MAX + 8];
    snprintf(key, sizeof key, "w:%s", work_id);
    return suspicion(m, key) >= SUSPECT_ISOLATE;
}

/* Puts list back at the head of the mailbox, in order, for the next round. */
static void requeue(Manager *m, MgrCmd *list)
{
    if (!list)
        return;
    MgrCmd *tail = list;
    while (tail->next)
        tail = tail->next;
    pthread_mutex_lock(&m->lock);
    tail->next = m->head;
    m->head = list;
    if (!m->tail)
        m->tail = tail;
    pthread_mutex_unlock(&m->lock);
    wake_poke(m->efd);
}

/* When *mail holds a suspect that is not isolated yet, leaves it alone in
 * *mail (the rest goes back to the mailbox) and returns true. */
static bool take_suspect(Manager *m, MgrCmd **mail)
{
    if (!m->suspects.len)
        return false;
    for (MgrCmd **p = mail; *p; p = &(*p)->next) {
        unsigned n = cmd_suspicion(m, *p);
        if (n == 0 || n >= SUSPECT_ISOLATE)
            continue;
        MgrCmd *c = *p;
        *p = c->next;
        c->next = NULL;
        requeue(m, *mail);
        *mail = c;
        return true;
    }
    return false;
}

/* Whether id names work already: open, finished this round, or (known, may be
 * NULL) found in the database. */
static bool id_taken(const Manager *m, const KnownSet *known, const char *id)
{
    static const KnownSet none;
    return ws_get(m->ws, id) || known_get(m, known ? known : &none, id);
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
    atomic_store(&m->cur_part, -1);
    /* Replies that were waiting for a commit that will not happen (or did,
     * unseen: the appends out are put in front of the round's replies). */
    for (size_t i = m->n_flights; i-- > 0;) {
        Flight *f = &m->flights[i];
        if (f->batch.len && m->cfg.on_commit)
            m->cfg.on_commit(COMMIT_FAILED, &f->batch, m->cfg.on_commit_ud);
        if (f->done_tail) {
            f->done_tail->next = m->done_head;
            m->done_head = f->done_head;
            if (!m->done_tail)
                m->done_tail = f->done_tail;
        }
        eventlist_free(&f->batch);
    }
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
        webhooks_unlead(m->webhooks);
    progress_free(m->progress);
    m->progress = progress_new(&m->cfg.progress);
    ws_free(m->ws);
    m->ws = NULL;
    PQfinish(m->conn);
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
static void emit(Manager *m, EventList *tmp, int64_t now)
{
    for (size_t i = 0; i < tmp->len; i++)
        emit_event(m, &tmp->items[i], now);
    tmp->len = 0;
}

WARN_UNUSED static int settle(Manager *m);

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
        m->cfg.on_commit(COMMIT_DONE, &f->batch, m->cfg.on_commit_ud);
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
    memmove(&m->flights[0], &m->flights[1], --m->n_flights * sizeof *m->flights);
    m->last_db_ok = mono_ms();
    answer_list(m, head);
    return 0;
}

/* Lands every append out and leaves pipeline mode, so that the session can
 * run another statement (a read sees what they wrote). -1: stepped down. */
WARN_UNUSED static int settle(Manager *m)
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
            int rc = journal_inbox_forget(m->conn, m->inbox_ack, m->n_inbox_ack, &err);
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
        m->cfg.on_commit(COMMIT_BEGIN, &m->batch, m->cfg.on_commit_ud);
    Flight *f = &m->flights[m->n_flights++];
    memset(f, 0, sizeof *f);
    f->part = m->part;
    clock_gettime(CLOCK_MONOTONIC, &f->sent);
    int rc = journal_append_send(m->conn, m->part, &m->batch, rows, nrows, m->inbox_ack,
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
    if (journal_recover(m->conn, m->ws, wall_ms(), &m->last_seq, &last_term, &m->part, &err) != 0 ||
        journal_parts(m->conn, m->parts, &err) != 0) {
        log_error("won the lock but could not recover: %s", err.msg);
        step_down(m, "recovery failed");
        return;
    }
    PGresult *lr =
        db_exec(m->conn, "LISTEN workd_inbox", 0, NULL, "listening for SQL submissions", &err);
    if (!lr) {
        step_down(m, err.msg);
        return;
    }
    PQclear(lr);
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
    json_t *subs = view_subscriptions(m->conn, &err);
    if (!subs) {
        log_error("won the lock but could not read the webhook subscriptions: %s", err.msg);
        step_down(m, "recovery failed");
        return;
    }
    webhooks_lead(m->webhooks, subs, m->last_seq);
    atomic_store(&m->leader, true);
    atomic_fetch_add(&m->stats.elections_won, 1);
    log_info("elected leader: term %lld, %zu open work items recovered in %lld ms, "
             "advertising %s",
             (long long)(last_term + 1), ws_open_count(m->ws), (long long)(mono_ms() - t0),
             m->cfg.advertise_url);
}

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
WARN_UNUSED static int fill_pull(Manager *m, MgrCmd *c, int64_t now)
{
    Err err = {0};
    if (ws_check_worker(m->ws, c->worker_id, c->instance, c->claim, now, &err) != 0)
        return -1; /* another instance holds the id now: this pull is stale */
    EventList tmp;
    eventlist_init(&tmp);
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

/* What refuses a submission before its items are decided: a batch opened
 * again under an id whose earlier callback is still known (its callback's id
 * is taken). */
WARN_UNUSED static int submit_refused(const Manager *m, const MgrCmd *c, const KnownSet *known,
                                      Err *err)
{
    if (c->batch_id && c->batch_callback && !ws_batch(m->ws, c->batch_id)) {
        char cb[ID_MAX + 1];
        ws_callback_id(c->batch_id, cb, sizeof cb);
        if (id_taken(m, known, cb))
            return err_set(err, 409, "batch-callback-exists",
                           "batch '%s' ran its callback '%s' within the retention window; a batch "
                           "with a callback needs another id",
                           c->batch_id, cb);
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
    if (submit_refused(m, c, known, &err) != 0) {
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

static void handle_reports(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
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

static void handle_pull(Manager *m, MgrCmd *c, int64_t now)
{
    Err err = {0};
    if (check_worker_room(m, c->worker_id, &err) != 0 ||
        ws_check_worker(m->ws, c->worker_id, c->instance, c->claim, now, &err) != 0) {
        cmd_fail(c, err.status, err.type, err.msg);
        queue_done(m, c);
        return;
    }
    EventList tmp;
    eventlist_init(&tmp);
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

static void handle_queue_set(Manager *m, MgrCmd *c, int64_t now)
{
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
static void handle_progress(Manager *m, MgrCmd *c, int64_t now)
{
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

static void emit_subscription(Manager *m, EventType type, json_t *detail, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    Event *e = eventlist_push(&tmp);
    e->type = type;
    e->detail = detail; /* stolen */
    emit(m, &tmp, now);
    eventlist_free(&tmp);
}

static void handle_subscription(Manager *m, MgrCmd *c, int64_t now)
{
    const char *name = json_string_value(json_object_get(c->detail, "name"));
    json_t *old = webhooks_settings(m->webhooks, name);
    switch (c->type) {
    case MC_SUBSCRIPTION_SET: {
        bool del = json_is_true(json_object_get(c->detail, "deleted"));
        if (!old && del) {
            cmd_fail(c, 404, "not-found", "no webhook subscription with that name");
            break;
        }
        if (!old && webhooks_count(m->webhooks) >= WEBHOOKS_MAX) {
            char msg[120];
            snprintf(msg, sizeof msg, "there are %d webhook subscriptions, the limit",
                     WEBHOOKS_MAX);
            cmd_fail(c, 409, "too-many-subscriptions", msg);
            break;
        }
        json_t *view = del ? webhooks_json(m->webhooks, name) : NULL;
        json_t *d = json_deep_copy(c->detail);
        /* A new subscription starts at the log's end unless it names a cursor. */
        json_object_set_new(d, "start", json_integer(m->last_seq));
        emit_subscription(m, EV_SUBSCRIPTION, d, now);
        if (del) {
            json_object_set_new(view, "deleted", json_true());
            cmd_ok_json(c, 200, view);
        } else {
            cmd_ok_json(c, 200, NULL); /* the view is taken after the commit (flush_done) */
        }
        log_info("webhook subscription %s %s by an operator", name,
                 del   ? "deleted"
                 : old ? "changed"
                       : "created");
        break;
    }
    case MC_SUB_CURSOR:
        if (old)
            emit_subscription(m, EV_SUB_CURSOR, json_incref(c->detail), now);
        cmd_ok_json(c, 204, NULL);
        break;
    case MC_SUB_PAUSE:
        if (old && !json_is_true(json_object_get(old, "paused"))) {
            json_t *d = json_deep_copy(old);
            json_object_set_new(d, "paused", json_true());
            json_object_set(d, "paused_reason", json_object_get(c->detail, "paused_reason"));
            json_object_set_new(d, "start", json_integer(m->last_seq)); /* unused: it exists */
            emit_subscription(m, EV_SUBSCRIPTION, d, now);
        }
        cmd_ok_json(c, 204, NULL);
        break;
    default:
        break;
    }
    json_decref(old);
}

/* ---- bulk actions (an operator's filter) ---- */

/* Cancels the open work that matches, at most c->max per command so that a
 * huge filter cannot stall the round; "more" tells the caller to repeat. */
static void handle_bulk_cancel(Manager *m, MgrCmd *c, int64_t now)
{
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
static void handle_bulk_retry(Manager *m, MgrCmd *c, int64_t now)
{
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

static void handle_schedule_set(Manager *m, MgrCmd *c, int64_t now)
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
    } else if (!x && ws_schedule_count(m->ws) >= (size_t)m->cfg.max_schedules) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "there are %lld schedules, the limit (--max-schedules); delete one first",
                 (long long)m->cfg.max_schedules);
        cmd_fail(c, 409, "too-many-schedules", msg);
        return;
    }
    EventList tmp;
    eventlist_init(&tmp);
    ws_decide_schedule_set(m->ws, c->name, spec, now, &tmp);
    emit(m, &tmp, now);
    eventlist_free(&tmp);
    x = ws_schedule(m->ws, c->name);
    log_info("schedule %s set by an operator: '%s' in %s%s", c->name, spec->cron_text, spec->tz,
             spec->paused ? " (paused)" : "");
    cmd_ok_json(c, 200, sched_json(c->name, x->spec, x->last_tick, now));
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
WARN_UNUSED static int take_inbox(Manager *m, MgrCmd **mail)
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
    if (journal_inbox_read(m->conn, INBOX_PAGE, &items, &n, &err) != 0) {
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

static void handle(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now)
{
    EventList tmp;
    eventlist_init(&tmp);
    Err err = {0};
    if (isolated(m, c, known)) {
        cmd_fail(c, 409, "append-refused",
                 "the database refused twice the change this request makes when it was written "
                 "to the log; it is not tried again (the leader's log says why)");
        if (c->inbox_n)
            inbox_decided(m, c);
        queue_done(m, c);
        return;
    }
    switch (c->type) {
    case MC_SUBMIT:
        handle_submit(m, c, known, now);
        if (c->inbox_n)
            inbox_decided(m, c);
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
    case MC_HEARTBEAT: {
        if (check_worker_room(m, c->worker_id, &err) != 0 ||
            ws_check_worker(m->ws, c->worker_id, c->instance, c->claim, now, &err) != 0) {
            cmd_fail(c, err.status, err.type, err.msg);
            break;
        }
        ws_worker_seen(m->ws, c->worker_id, c->instance, c->capacity, c->queues, c->running, now,
                       &tmp);
        emit(m, &tmp, now);
        c->heartbeat_interval_ms = m->cfg.heartbeat_interval_ms;
        c->worker_timeout_ms = m->cfg.ws.worker_timeout_ms;
        ws_running_free(c->stale);
        c->stale = stale_attempts(m, c->running);
        cmd_ok(c, 200);
        break;
    }
    case MC_DEREGISTER:
        /* A named instance must be the registered one, claim or not: an old
         * instance must not end its successor's attempts. */
        if (ws_check_worker(m->ws, c->worker_id, c->instance, c->claim && !c->instance, now,
                            &err) != 0) {
            cmd_fail(c, err.status, err.type, err.msg);
            break;
        }
        ws_worker_forget(m->ws, c->worker_id, now, &tmp);
        emit(m, &tmp, now);
        drop_waiters_of(m, c->worker_id);
        log_info("worker %s deregistered", c->worker_id);
        cmd_ok(c, 204);
        break;
    case MC_CLUSTER:
        cluster_view_free(c->cluster);
        c->cluster = cluster_view(m, now);
        cmd_ok(c, 200);
        break;
    case MC_QUEUE_SET:
        handle_queue_set(m, c, now);
        break;
    case MC_BULK_CANCEL:
        handle_bulk_cancel(m, c, now);
        break;
    case MC_BULK_RETRY:
        handle_bulk_retry(m, c, now);
        break;
    case MC_PROGRESS:
        handle_progress(m, c, now);
        break;
    case MC_SUBSCRIPTION_SET:
    case MC_SUB_CURSOR:
    case MC_SUB_PAUSE:
        handle_subscription(m, c, now);
        break;
    case MC_SUBSCRIPTION_GET:
        c->reply = webhooks_json(m->webhooks, c->queue);
        if (c->reply)
            c->status = 200;
        else
            cmd_fail(c, 404, "not-found", "no webhook subscription with that name");
        break;
    case MC_SCHEDULE_SET:
        handle_schedule_set(m, c, now);
        break;
    case MC_SCHEDULE_DELETE:
        if (ws_decide_schedule_delete(m->ws, c->name, now, &tmp, &err) != 0) {
            cmd_fail(c, err.status, err.type, err.msg);
            break;
        }
        log_info("schedule %s deleted by an operator", c->name);
        emit(m, &tmp, now);
        cmd_ok_json(c, 204, NULL);
        break;
    case MC_QUEUE_FLOW: {
        json_t *o = json_object();
        const char *name;
        for (size_t i = 0; (name = ws_queue_next(m->ws, &i));) {
            double t = ws_queue_tokens(m->ws, name, now);
            if (t >= 0)
                json_object_set_new(o, name, json_pack("{s:f}", "tokens", t));
        }
        cmd_ok_json(c, 200, o);
        break;
    }
    }
    eventlist_free(&tmp);
    queue_done(m, c);
}

/* Collects ids that are not open (the database must say what they are). */
typedef struct IdList {
    char **ids; /* borrowed, but for those also in made */
    size_t n, cap;
    char **made; /* ids made for the lookup (a batch's callback), owned */
    size_t n_made;
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

/* want_known for an id made for the lookup: l owns it. */
static void want_known_made(Manager *m, IdList *l, char *id)
{
    l->made = xrealloc(l->made, (l->n_made + 1) * sizeof *l->made);
    l->made[l->n_made++] = id;
    want_known(m, l, id);
}

static void idlist_free(IdList *l)
{
    free(l->ids);
    for (size_t i = 0; i < l->n_made; i++)
        free(l->made[i]);
    free(l->made);
}

/* Looks up the ids of l in the database, after the appends out have landed
 * (so that it sees what they wrote). -1: the leader stepped down. */
WARN_UNUSED static int lookup_known(Manager *m, IdList *l, KnownSet *known)
{
    memset(known, 0, sizeof *known);
    if (!l->n)
        return 0;
    Err err = {0};
    if (settle(m) != 0)
        return -1;
    if (journal_known(m->conn, l->ids, l->n, known, &err) != 0) {
        step_down(m, err.msg);
        return -1;
    }
    return 0;
}

/* The ticks of tmp (ws_decide_ticks) whose work id is taken already, or whose
 * append the database refused twice: such a tick is recorded as skipped, its
 * work not accepted (a second accepted event under one id would break "one
 * id, one job", and an append the database refuses would stop every leader
 * that fires the tick). -1: the leader stepped down. */
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
        return -1;
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
            if (t->type == EV_TICK && t->fired && !strcmp(t->fired, e->work_id)) {
                free(t->fired);
                t->fired = NULL;
                t->error = xstrdup(why);
                break;
            }
        }
        event_clear(e);
    }
    tmp->len = kept;
    journal_known_free(&known);
    return 0;
}

WARN_UNUSED static int prefetch_known(Manager *m, MgrCmd *list, KnownSet *known)
{
    IdList l = {0};
    for (MgrCmd *c = list; c; c = c->next) {
        size_t i;
        switch (c->type) {
        case MC_SUBMIT:
            /* A UUID this node just generated cannot exist yet (2^-122). */
            for (i = 0; i < c->n_items; i++) {
                if (!c->items[i].generated)
                    want_known(m, &l, c->items[i].id);
                for (size_t j = 0; c->items[i].after && c->items[i].after[j]; j++)
                    want_known(m, &l, c->items[i].after[j]);
            }
            /* A batch opened again under its id: its callback's id must be free. */
            if (c->batch_id && c->batch_callback && !ws_batch(m->ws, c->batch_id)) {
                char cb[ID_MAX + 1];
                ws_callback_id(c->batch_id, cb, sizeof cb);
                want_known_made(m, &l, xstrdup(cb));
            }
            break;
        case MC_CANCEL:
        case MC_RETRY:
            want_known(m, &l, c->work_id);
            break;
        case MC_REPORTS:
            for (i = 0; i < c->n_reports; i++)
                want_known(m, &l, c->reports[i].work_id);
            break;
        case MC_BULK_RETRY: {
            /* Dead work lives in the database only: find what matches. */
            Err err = {0};
            c->bulk = xcalloc(1, sizeof *c->bulk);
            if (settle(m) != 0) {
                idlist_free(&l);
                return -1;
            }
            if (journal_dead_matching(m->conn, c->queue, c->key, c->max, c->bulk, &err) != 0) {
                idlist_free(&l);
                step_down(m, err.msg);
                return -1;
            }
            break;
        }
        default:
            break;
        }
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
    if (tmp.len && screen_ticks(m, &tmp) != 0) {
        eventlist_free(&tmp);
        return -1;
    }
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
    while (m->n_flights && !PQisBusy(m->conn))
        if (land_flight(m) != 0)
            return -1;
    return 0;
}

/* One round as leader: wait for mail, a deadline or the database; then decide,
 * commit once, reply. */
static void lead_round(Manager *m)
{
    if (land_answered(m) != 0)
        return;
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
        /* The outcome of an append out, a notification, a termination
         * notice, or the socket closed. */
        if (!PQconsumeInput(m->conn) || PQstatus(m->conn) != CONNECTION_OK) {
            step_down(m, "the database session was lost");
            return;
        }
        PGnotify *n;
        while ((n = PQnotifies(m->conn))) {
            if (!strcmp(n->relname, "workd_inbox"))
                m->inbox_due = true;
            PQfreemem(n);
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
        if (m->ws) {
            lead_round(m);
            continue;
        }
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
    PQfinish(m->conn);
    m->conn = NULL;
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

static void webhooks_cursor(void *ud, const char *name, int64_t cursor)
{
    MgrCmd *c = mgrcmd_new(MC_SUB_CURSOR);
    c->detail = json_pack("{s:s, s:I}", "name", name, "cursor", (json_int_t)cursor);
    c->done = own_cmd_done;
    manager_send(ud, c);
}

static void webhooks_pause(void *ud, const char *name, const char *reason)
{
    MgrCmd *c = mgrcmd_new(MC_SUB_PAUSE);
    c->detail = json_pack("{s:s, s:s}", "name", name, "paused_reason", reason);
    c->done = own_cmd_done;
    manager_send(ud, c);
}

Manager *manager_start(const ManagerConfig *cfg, Err *err)
{
    Manager *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->cfg.database_url = xstrdup(cfg->database_url);
    m->cfg.advertise_url = xstrdup(cfg->advertise_url);
    m->election.database_url = m->cfg.database_url;
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
    if (!(m->retention = retention_start(&rc, err)))
        goto cleanup;
    m->progress = progress_new(&cfg->progress);
    hmap_init(&m->suspects);
    WebhooksConfig wc = {.database_url = cfg->database_url,
                         .pause_after_ms = cfg->webhook_pause_after_ms,
                         .timeout_ms = cfg->webhook_timeout_ms,
                         .backoff_base_ms = cfg->webhook_backoff_base_ms,
                         .backoff_max_ms = cfg->webhook_backoff_max_ms,
                         .allow = cfg->webhook_allow,
                         .cursor = webhooks_cursor,
                         .pause = webhooks_pause,
                         .ud = m};
    if (!(m->webhooks = webhooks_start(&wc, err)))
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
    eventlist_free(&m->batch);
    pthread_mutex_destroy(&m->lock);
    free((char *)m->cfg.database_url);
    free((char *)m->cfg.advertise_url);
    free(m);
}
