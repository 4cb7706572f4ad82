/* workstate: see workstate.h. Open work sits in exactly one of three heaps:
 * its queue's ready heap (priority, then acceptance), its queue's delayed heap
 * (run_at), or the running heap (deadline). */
#include "workstate.h"

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "heap.h"
#include "hmap.h"
#include "util.h"

enum { IN_NONE = 0, IN_READY, IN_DELAYED, IN_RUNNING };

/* The ready work of one key of a queue (work without a key has key ""). A
 * queue serves its keys in turn: the keys with ready work form a ring, and
 * the queue's cursor is the key whose turn it is. A KeyQ lives while it has
 * ready or running work, so memory follows the open work, not the keys ever
 * seen. */
typedef struct KeyQ {
    char *key;
    Heap ready;               /* by priority, then acceptance */
    int running;              /* attempts of this key in the running heap */
    int weight;               /* turns in a row per round (the queue's key_weights; 1) */
    int turns;                /* of this round's, used so far */
    struct KeyQ *prev, *next; /* the ring of keys with ready work (NULL: not in it) */
} KeyQ;

typedef struct Queue {
    char *name;
    HMap keys;    /* key -> KeyQ */
    KeyQ *cursor; /* whose turn it is; NULL: no ready work */
    size_t n_ready;
    Heap delayed;
    QueueLimits lim;
    int running;       /* attempts of this queue in the running heap */
    double tokens;     /* rate limit: starts allowed now (a bucket of lim.rate_limit) */
    int64_t tokens_at; /* when tokens was computed; 0: the bucket starts empty */
} Queue;

/* A waiting item's link to one open parent: the parent, and where in the
 * parent's Kids the item is. */
typedef struct WsLink {
    WorkItem *parent; /* NULL: it finished (the link is gone) */
    size_t slot;
} WsLink;

/* An entry of a parent's Kids: the child, and which of its links is this one. */
typedef struct KidRef {
    WorkItem *child; /* NULL: it left */
    size_t link;
} KidRef;

/* The waiting children of one open parent (WorkItem.kids), in the order they
 * were accepted. A child that leaves (released or finished) leaves a NULL in
 * its place, found through its link: O(1), so that cancelling 100,000
 * children of one parent is not 100,000 scans of the list; the list is
 * compacted when most of it is holes, and goes when the parent finishes.
 * Links are pointers both ways, never names: making or ending one hashes
 * nothing (a fan-in of 3,000 children of 1,000 parents is 3,000,000 of
 * them). */
typedef struct WsKids {
    KidRef *v;
    size_t n, cap;
    size_t live; /* entries that are not NULL */
} Kids;

struct WorkState {
    WsConfig cfg;
    HMap items;   /* id -> WorkItem */
    HMap queues;  /* name -> Queue */
    HMap workers; /* id -> WsWorker (owned) */
    Heap running; /* by deadline */
    size_t edges; /* links of waiting work to open parents (live KidRefs) */
    /* the bucket of cfg.edge_rate: links it allows now (below 0: a large
     * request's debt), as of edge_tokens_at (0: full) */
    double edge_tokens;
    int64_t edge_tokens_at;
    HMap batches; /* id -> Batch: open batches */
    ScheduleSet *sched;
    SubscriptionSet *subs; /* webhook subscriptions */
};

/* ---- heaps ---- */

static size_t *item_index(void *x)
{
    return &((WorkItem *)x)->heap_idx;
}

static bool ready_less(const void *a, const void *b)
{
    const WorkItem *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority;
    return x->accepted_seq < y->accepted_seq;
}

static bool delayed_less(const void *a, const void *b)
{
    const WorkItem *x = a, *y = b;
    if (x->run_at != y->run_at)
        return x->run_at < y->run_at;
    return x->accepted_seq < y->accepted_seq;
}

static bool deadline_less(const void *a, const void *b)
{
    const WorkItem *x = a, *y = b;
    if (x->deadline != y->deadline)
        return x->deadline < y->deadline;
    return x->accepted_seq < y->accepted_seq;
}

static Queue *queue_get(WorkState *ws, const char *name)
{
    Queue *q = hmap_get(&ws->queues, name);
    if (!q) {
        q = xcalloc(1, sizeof *q);
        q->name = xstrdup(name);
        hmap_init(&q->keys);
        heap_init(&q->delayed, delayed_less, item_index);
        hmap_put(&ws->queues, q->name, q);
    }
    return q;
}

static void queue_free(Queue *q)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&q->keys, &i, &k, &v);) {
        heap_free(&((KeyQ *)v)->ready);
        free(((KeyQ *)v)->key);
        free(v);
    }
    hmap_free(&q->keys);
    heap_free(&q->delayed);
    queue_limits_clear(&q->lim);
    free(q->name);
    free(q);
}

/* Holds no work and no flow control: nothing would be lost with it. */
static bool queue_idle(const Queue *q)
{
    const QueueLimits *l = &q->lim;
    return !q->n_ready && !q->delayed.len && !q->running && !q->keys.len && !l->paused &&
           !l->max_running && !l->max_running_per_key && !l->rate_limit && !l->rate_period_ms &&
           !l->n_weights;
}

static const char *key_of(const WorkItem *it)
{
    return it->key ? it->key : "";
}

static KeyQ *key_get(Queue *q, const char *key)
{
    KeyQ *k = hmap_get(&q->keys, key);
    if (!k) {
        k = xcalloc(1, sizeof *k);
        k->key = xstrdup(key);
        k->weight = queue_limits_weight(&q->lim, key);
        heap_init(&k->ready, ready_less, item_index);
        hmap_put(&q->keys, k->key, k);
    }
    return k;
}

/* Joins the ring just before the cursor: the new key's turn comes after
 * every key already waiting. */
static void ring_link(Queue *q, KeyQ *k)
{
    k->turns = 0;
    if (!q->cursor) {
        k->prev = k->next = k;
        q->cursor = k;
        return;
    }
    k->next = q->cursor;
    k->prev = q->cursor->prev;
    k->prev->next = k;
    q->cursor->prev = k;
}

static void ring_unlink(Queue *q, KeyQ *k)
{
    if (k->next == k) {
        q->cursor = NULL;
    } else {
        k->prev->next = k->next;
        k->next->prev = k->prev;
        if (q->cursor == k)
            q->cursor = k->next;
    }
    k->prev = k->next = NULL;
}

/* Frees a key that holds nothing any more. */
static void key_release(Queue *q, KeyQ *k)
{
    if (k->ready.len || k->running || k->next)
        return;
    hmap_del(&q->keys, k->key);
    heap_free(&k->ready);
    free(k->key);
    free(k);
}

/* After the queue's weights changed: every key takes its new weight (a round
 * under way keeps the turns it used). */
static void refresh_weights(Queue *q)
{
    const char *name;
    void *v;
    for (size_t i = 0; hmap_next(&q->keys, &i, &name, &v);)
        ((KeyQ *)v)->weight = queue_limits_weight(&q->lim, name);
}

static void ready_push(Queue *q, WorkItem *it)
{
    KeyQ *k = key_get(q, key_of(it));
    heap_push(&k->ready, it);
    q->n_ready++;
    it->where = IN_READY;
    if (!k->next)
        ring_link(q, k);
}

static void ready_remove(Queue *q, WorkItem *it)
{
    KeyQ *k = hmap_get(&q->keys, key_of(it));
    heap_remove(&k->ready, it);
    q->n_ready--;
    if (!k->ready.len) {
        ring_unlink(q, k);
        key_release(q, k);
    }
}

static void unplace(WorkState *ws, WorkItem *it)
{
    Queue *q = hmap_get(&ws->queues, it->queue);
    switch (it->where) {
    case IN_READY:
        ready_remove(q, it);
        break;
    case IN_DELAYED:
        heap_remove(&q->delayed, it);
        break;
    case IN_RUNNING: {
        heap_remove(&ws->running, it);
        q->running--;
        KeyQ *k = hmap_get(&q->keys, key_of(it));
        k->running--;
        key_release(q, k);
        break;
    }
    }
    it->where = IN_NONE;
}

/* Puts a pending item where it belongs: delayed if it has a run_at, else ready.
 * ws_advance moves delayed items whose time has come. */
static void place_pending(WorkState *ws, WorkItem *it)
{
    Queue *q = queue_get(ws, it->queue);
    it->status = WORK_PENDING;
    if (it->run_at) {
        heap_push(&q->delayed, it);
        it->where = IN_DELAYED;
    } else {
        ready_push(q, it);
    }
}

static void run_place(WorkState *ws, WorkItem *it)
{
    heap_push(&ws->running, it);
    it->where = IN_RUNNING;
    Queue *q = queue_get(ws, it->queue);
    q->running++;
    key_get(q, key_of(it))->running++;
}

/* ---- flow control ---- */

/* Starts the queue's rate limit allows at time now (fractional). */
static double tokens_at(const Queue *q, int64_t now)
{
    if (!q->lim.rate_limit)
        return 1e18;
    double t = q->tokens +
               (double)(now - q->tokens_at) * q->lim.rate_limit / (double)q->lim.rate_period_ms;
    return t > q->lim.rate_limit ? q->lim.rate_limit : t;
}

static void take_token(Queue *q, int64_t now)
{
    if (!q->lim.rate_limit)
        return;
    q->tokens = tokens_at(q, now) - 1;
    q->tokens_at = now;
}

/* Links new waiting work may make at time now (cfg.edge_rate's bucket). */
static double edge_tokens(const WorkState *ws, int64_t now)
{
    double rate = (double)ws->cfg.edge_rate;
    if (!ws->edge_tokens_at)
        return rate;
    double t = ws->edge_tokens +
               (double)(now > ws->edge_tokens_at ? now - ws->edge_tokens_at : 0) * rate / 1000.0;
    return t > rate ? rate : t;
}

static void take_edges(WorkState *ws, size_t n, int64_t now)
{
    if (!ws->cfg.edge_rate || !n)
        return;
    ws->edge_tokens = edge_tokens(ws, now) - (double)n;
    if (now > ws->edge_tokens_at)
        ws->edge_tokens_at = now;
}

/* May the queue hand out a job now? Costs nothing for a queue without limits. */
static bool queue_open(const Queue *q, int64_t now)
{
    return !q->lim.paused && (!q->lim.max_running || q->running < q->lim.max_running) &&
           (!q->lim.rate_limit || tokens_at(q, now) >= 1.0);
}

/* The queue's next job: the first of the next key in turn that is under the
 * queue's per-key limit (keys are served in turn; priority orders work within
 * a key). */
static const WorkItem *next_of(const Queue *q)
{
    const KeyQ *k = q->cursor;
    for (size_t n = 0; k && n < q->keys.len; n++, k = k->next)
        if (!q->lim.max_running_per_key || k->running < q->lim.max_running_per_key)
            return heap_peek(&k->ready);
    return NULL;
}

static void item_free(WorkItem *it)
{
    free(it->links);
    if (it->kids) {
        free(it->kids->v);
        free(it->kids);
    }
    strv_free(it->after);
    free(it->batch);
    free(it->traceparent);
    free(it->tracestate);
    free(it->id);
    free(it->queue);
    free(it->key);
    json_decref(it->payload);
    free(it->worker_id);
    free(it->last_error);
    free(it);
}

static void wsworker_free(WsWorker *w)
{
    free(w->id);
    free(w->instance);
    strv_free(w->queues);
    ws_running_free(w->running);
    free(w);
}

static void batch_free(Batch *b)
{
    free(b->id);
    if (b->callback) {
        template_clear(b->callback);
        free(b->callback);
    }
    free(b);
}

/* ---- lifetime ---- */

WorkState *ws_new(const WsConfig *cfg)
{
    WorkState *ws = xcalloc(1, sizeof *ws);
    ws->cfg = *cfg;
    hmap_init(&ws->items);
    hmap_init(&ws->queues);
    hmap_init(&ws->workers);
    heap_init(&ws->running, deadline_less, item_index);
    hmap_init(&ws->batches);
    ws->sched = sched_new();
    ws->subs = subs_new();
    return ws;
}

void ws_free(WorkState *ws)
{
    if (!ws)
        return;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&ws->items, &i, &k, &v);)
        item_free(v);
    for (size_t i = 0; hmap_next(&ws->queues, &i, &k, &v);)
        queue_free(v);
    for (size_t i = 0; hmap_next(&ws->workers, &i, &k, &v);)
        wsworker_free(v);
    for (size_t i = 0; hmap_next(&ws->batches, &i, &k, &v);)
        batch_free(v);
    hmap_free(&ws->batches);
    sched_free(ws->sched);
    subs_free(ws->subs);
    hmap_free(&ws->items);
    hmap_free(&ws->queues);
    hmap_free(&ws->workers);
    heap_free(&ws->running);
    free(ws);
}

/* ---- helpers ---- */

int64_t ws_backoff_ms(const WsConfig *cfg, const char *work_id, int attempt)
{
    int64_t d = cfg->backoff_base_ms;
    for (int i = 1; i < attempt && d < cfg->backoff_max_ms; i++)
        d *= 2;
    if (d > cfg->backoff_max_ms)
        d = cfg->backoff_max_ms;
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = work_id; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h = (h ^ (uint64_t)attempt) * 1099511628211ULL;
    /* FNV-1a leaves the high bits poorly mixed when ids differ only in their
     * last characters (job-1, job-2, ...), so such a batch retried in lockstep:
     * finish with a 64-bit mixer (MurmurHash3's fmix64) before taking them. */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    double jitter = 0.5 + 0.5 * (double)(h >> 11) / 9007199254740992.0;
    return (int64_t)((double)d * jitter);
}

const char *ws_item_status(const WorkItem *it, int64_t now)
{
    if (it->status == WORK_RUNNING)
        return "running";
    if (it->status == WORK_WAITING)
        return "waiting";
    return it->run_at > now ? "scheduled" : "pending";
}

/* The static string equal to a status read from the database (KnownWork's
 * strings live only as long as the round's rows; a SubmitResult's outlive it). */
static const char *status_static(const char *status)
{
    static const char *const all[] = {"pending",   "scheduled", "running",
                                      "completed", "dead",      "cancelled"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i], status))
            return all[i];
    return "unknown";
}

static const KnownWork *find_known(const KnownWork *known, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(known[i].id, id) == 0)
            return &known[i];
    return NULL;
}

/* Appends the events that end the current attempt: failed/timed_out, then dead
 * when no attempt is left or retry is refused. */
static void end_attempt(const WorkState *ws, const WorkItem *it, EventType type, const char *error,
                        bool retry, int64_t now, EventList *out)
{
    bool again = retry && it->attempt < it->max_attempts;
    Event *e = eventlist_push(out);
    e->type = type;
    e->at = now;
    e->work_id = xstrdup(it->id);
    e->attempt = it->attempt;
    e->error = xstrdup(error);
    e->retry_at = again ? now + ws_backoff_ms(&ws->cfg, it->id, it->attempt) : 0;
    if (!again) {
        Event *d = eventlist_push(out);
        d->type = EV_DEAD;
        d->at = now;
        d->work_id = xstrdup(it->id);
        d->attempt = it->attempt; /* attempts made, for the record */
        d->error = xstrdup(error);
    }
}

/* ---- deciding ---- */

int ws_decide_submit(const WorkState *ws, const SubmitItem *items, size_t n, const KnownWork *known,
                     size_t n_known, int64_t now, EventList *out, SubmitResult *results, Err *err)
{
    return ws_decide_submit_in(ws, items, n, known, n_known, NULL, now, out, results, err);
}

/* Checks an item's parents: 0 with *waits (a parent is open, or accepted
 * earlier in this request) and *ended (the first parent that is dead or
 * cancelled, NULL if none), or -1 with err. */
WARN_UNUSED static int check_parents(const WorkState *ws, const SubmitItem *s, const HMap *seen,
                                     const KnownWork *known, size_t n_known, bool *waits,
                                     const char **ended, const char **ended_status, Err *err)
{
    *waits = false;
    *ended = NULL;
    for (size_t j = 0; s->after && s->after[j]; j++) {
        const char *p = s->after[j];
        if (!strcmp(p, s->id))
            return err_set(err, 400, "invalid-field", "work '%s' cannot wait for itself", s->id);
        if (hmap_get(&ws->items, p) || hmap_get(seen, p)) {
            *waits = true;
            continue;
        }
        const KnownWork *k = find_known(known, n_known, p);
        if (!k)
            return err_set(err, 404, "parent-not-found",
                           "work '%s' waits for '%s', which does not exist: a parent must be "
                           "submitted before its children (or earlier in the same request)",
                           s->id, p);
        if (!*ended && (!strcmp(k->status, "dead") || !strcmp(k->status, "cancelled"))) {
            *ended = p;
            *ended_status = k->status;
        }
    }
    return 0;
}

static void batch_opened_event(const BatchOpen *batch, int64_t now, EventList *out)
{
    Event *b = eventlist_push(out);
    b->type = EV_BATCH_OPENED;
    b->at = now;
    b->batch = xstrdup(batch->id);
    if (batch->callback) {
        b->callback = xcalloc(1, sizeof *b->callback);
        template_copy(b->callback, batch->callback);
    }
}

/* The accepted event of a new item (waits: a parent is open). */
static const Event *accepted_event(const SubmitItem *s, bool waits, int64_t now, EventList *out)
{
    Event *e = eventlist_push(out);
    e->type = EV_ACCEPTED;
    e->at = now;
    e->work_id = xstrdup(s->id);
    e->queue = xstrdup(s->queue);
    e->key = xstrdup(s->key);
    e->priority = s->priority;
    e->payload = json_incref(s->payload);
    e->run_at = s->run_at > now ? s->run_at : 0;
    e->timeout_ms = s->timeout_ms;
    e->max_attempts = s->max_attempts;
    if (s->after) { /* one JSON array for the log, the projection and the copies */
        e->after = json_array();
        for (size_t j = 0; s->after[j]; j++)
            json_array_append_new(e->after, json_string(s->after[j]));
    }
    e->run_anyway = s->run_anyway;
    e->waiting = waits;
    e->batch = xstrdup(s->batch);
    e->traceparent = xstrdup(s->traceparent);
    e->tracestate = xstrdup(s->tracestate);
    return e;
}

/* The cancellation of a new item whose parent has ended (dead or cancelled). */
static void parent_ended_event(const char *id, const char *parent, const char *status, int64_t now,
                               EventList *out)
{
    Event *c = eventlist_push(out);
    c->type = EV_CANCELLED;
    c->at = now;
    c->work_id = xstrdup(id);
    char why[300];
    snprintf(why, sizeof why, "parent %s is %s", parent, status);
    c->reason = xstrdup(why);
}

int ws_decide_submit_in(const WorkState *ws, const SubmitItem *items, size_t n,
                        const KnownWork *known, size_t n_known, const BatchOpen *batch, int64_t now,
                        EventList *out, SubmitResult *results, Err *err)
{
    size_t first = out->len, created = 0, new_edges = 0;
    double avail = ws->cfg.edge_rate > 0 ? edge_tokens(ws, now) : 0;
    HMap seen; /* ids accepted earlier in this same request */
    hmap_init(&seen);
    EventList late; /* cancellations of items whose parent has ended: after every accepted */
    eventlist_init(&late);
    bool opening = batch && !hmap_get(&ws->batches, batch->id);
    if (opening)
        batch_opened_event(batch, now, out);
    for (size_t i = 0; i < n; i++) {
        const SubmitItem *s = &items[i];
        const WorkItem *open = hmap_get(&ws->items, s->id);
        const SubmitItem *twin = hmap_get(&seen, s->id);
        const KnownWork *k = open || twin ? NULL : find_known(known, n_known, s->id);
        json_t *existing = open ? open->payload : twin ? twin->payload : k ? k->payload : NULL;
        if (open || twin || k) {
            if (!json_equal(existing, s->payload)) {
                err_set(err, 409, "conflict",
                        "work '%s' already exists with a different payload; use another id", s->id);
                goto cleanup;
            }
            results[i].created = false;
            results[i].status = open   ? ws_item_status(open, now)
                                : twin ? results[(const SubmitItem *)twin - items].status
                                       : status_static(k->status);
            continue;
        }
        if (ws->items.len + created + 1 > (size_t)ws->cfg.max_open) {
            err_set(err, 429, "queue-full",
                    "the limit of open work items (--max-open) is %lld and %zu are open; this "
                    "request adds at least %zu; retry later",
                    (long long)ws->cfg.max_open, ws->items.len, created + 1);
            goto cleanup;
        }
        if (s->batch && !hmap_get(&ws->batches, s->batch) &&
            !(opening && !strcmp(s->batch, batch->id))) {
            err_set(err, 404, "batch-not-found",
                    "batch '%s' is not open (it finished, or was never opened)", s->batch);
            goto cleanup;
        }
        bool waits;
        const char *ended, *ended_status = NULL;
        if (check_parents(ws, s, &seen, known, n_known, &waits, &ended, &ended_status, err) != 0)
            goto cleanup;
        if (waits)
            new_edges += strv_len(s->after); /* at most: those still open link */
        /* The rate: refused once the request needs more than the bucket
         * holds, unless it is full (then any request passes, in debt). */
        if (waits && ws->cfg.edge_rate > 0 && (double)new_edges > avail &&
            avail < (double)ws->cfg.edge_rate) {
            double rate = (double)ws->cfg.edge_rate,
                   need = (double)new_edges < rate ? (double)new_edges : rate,
                   wait_s = (need - avail) / rate;
            err_set(err, 429, "dependency-rate-limited",
                    "dependencies are made at most %lld a second (--dependency-rate), and this "
                    "request adds up to %zu with %.0f allowed now; retry in %.1f s, or send "
                    "fewer at a time",
                    (long long)ws->cfg.edge_rate, new_edges, avail < 0 ? 0 : avail,
                    wait_s < 1 ? 1 : wait_s);
            goto cleanup;
        }
        if (waits && ws->cfg.max_edges > 0) {
            if (ws->edges + new_edges > (size_t)ws->cfg.max_edges) {
                err_set(err, 429, "too-many-dependencies",
                        "the limit of dependencies held at once (--max-dependencies) is %lld and "
                        "%zu are held; this request adds up to %zu; retry when parents finish",
                        (long long)ws->cfg.max_edges, ws->edges, new_edges);
                goto cleanup;
            }
        }
        const Event *e = accepted_event(s, waits, now, out);
        results[i].created = true;
        results[i].status = waits ? "waiting" : e->run_at ? "scheduled" : "pending";
        if (ended && !s->run_anyway) {
            parent_ended_event(s->id, ended, ended_status, now, &late);
            results[i].status = "cancelled";
        }
        hmap_put(&seen, s->id, (void *)s);
        created++;
    }
    if (opening && !created) /* every item existed: nothing opens */
        event_clear(&out->items[--out->len]);
    for (size_t i = 0; i < late.len; i++) {
        *eventlist_push(out) = late.items[i];
        memset(&late.items[i], 0, sizeof late.items[i]);
    }
    eventlist_free(&late);
    hmap_free(&seen);
    return 0;
cleanup:
    eventlist_free(&late);
    hmap_free(&seen);
    while (out->len > first)
        event_clear(&out->items[--out->len]);
    return -1;
}

int ws_decide_cancel(const WorkState *ws, const char *work_id, int64_t now, EventList *out,
                     Err *err)
{
    const WorkItem *it = hmap_get(&ws->items, work_id);
    if (!it)
        return err_set(err, 404, "not-found", "no open work '%s'", work_id);
    Event *e = eventlist_push(out);
    e->type = EV_CANCELLED;
    e->at = now;
    e->work_id = xstrdup(work_id);
    /* Running work ends with its attempt: the worker learns it from its next
     * heartbeat's answer, and the attempt's late report is refused. */
    e->attempt = it->status == WORK_RUNNING ? it->attempt : 0;
    return 0;
}

size_t ws_match(const WorkState *ws, const char *queue, const char *key, const char *status,
                int64_t now, const char **ids, size_t max)
{
    size_t n = 0;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&ws->items, &i, &k, &v);) {
        const WorkItem *it = v;
        if ((queue && strcmp(queue, it->queue)) || (key && (!it->key || strcmp(key, it->key))) ||
            (status && strcmp(status, ws_item_status(it, now))))
            continue;
        if (n < max)
            ids[n] = it->id;
        n++;
    }
    return n;
}

int ws_decide_retry(const WorkState *ws, const char *work_id, const KnownWork *known, int64_t now,
                    EventList *out, Err *err)
{
    const WorkItem *it = hmap_get(&ws->items, work_id);
    if (it)
        return err_set(err, 409, "not-retryable", "work '%s' is %s; only dead work can be retried",
                       work_id, ws_item_status(it, now));
    if (!known)
        return err_set(err, 404, "not-found", "no work with id '%s'", work_id);
    if (strcmp(known->status, "dead") != 0)
        return err_set(err, 409, "not-retryable", "work '%s' is %s; only dead work can be retried",
                       work_id, known->status);
    if (ws->items.len + 1 > (size_t)ws->cfg.max_open)
        return err_set(err, 429, "queue-full",
                       "the limit of open work items (--max-open) is %lld and %zu are open; "
                       "retry later",
                       (long long)ws->cfg.max_open, ws->items.len);
    Event *e = eventlist_push(out);
    e->type = EV_RETRIED;
    e->at = now;
    e->work_id = xstrdup(work_id);
    e->queue = xstrdup(known->queue);
    e->key = xstrdup(known->key);
    e->priority = known->priority;
    e->payload = json_incref(known->payload);
    e->timeout_ms = known->timeout_ms;
    e->attempt = known->attempts;
    e->max_attempts = known->attempts + 1;
    e->error = xstrdup(known->last_error);        /* kept, as the projection keeps it */
    e->traceparent = xstrdup(known->traceparent); /* the producer's, for every attempt */
    e->tracestate = xstrdup(known->tracestate);
    /* A member of a batch that is still open rejoins it (as recovery, which
     * reads the reopened row with its batch, would have it); once the batch
     * has finished, the work runs on its own. */
    if (known->batch && hmap_get(&ws->batches, known->batch))
        e->batch = xstrdup(known->batch);
    return 0;
}

void ws_decide_report(const WorkState *ws, const Report *r, const KnownWork *known, int64_t now,
                      EventList *out, ReportResult *res)
{
    res->accepted = false;
    res->status = NULL;
    res->reason = "superseded";
    const WorkItem *it = hmap_get(&ws->items, r->work_id);
    if (!it) {
        /* Finished already: a repeat of the report that finished it is
         * acknowledged; anything else is about an attempt that lost. */
        if (!known) {
            res->reason = "not-found";
        } else if (!strcmp(known->status, "cancelled")) {
            res->reason = "cancelled";
        } else if (known->attempts == r->attempt &&
                   ((r->completed && !strcmp(known->status, "completed")) ||
                    (!r->completed && !strcmp(known->status, "dead")))) {
            res->accepted = true;
            res->status = status_static(known->status);
        }
        return;
    }
    if (!r->completed && it->status == WORK_PENDING && it->attempt == r->attempt) {
        /* The attempt has ended already (this very failure, reported again, or
         * a timeout): nothing to record, and nothing to send again. */
        res->accepted = true;
        res->status = ws_item_status(it, now);
        return;
    }
    if (it->status != WORK_RUNNING || it->attempt != r->attempt)
        return;
    /* The current attempt: only its holder may end it (a report names an
     * attempt, which anyone can read off the work; the holder's instance is
     * its own). */
    const WsWorker *w = hmap_get(&ws->workers, it->worker_id);
    const char *held_by = w ? w->instance : NULL;
    if (!r->worker_id || strcmp(r->worker_id, it->worker_id) != 0 ||
        (held_by && (r->instance ? strcmp(r->instance, held_by) != 0 : !r->claim))) {
        res->reason = "not-holder";
        return;
    }
    if (r->completed) {
        Event *e = eventlist_push(out);
        e->type = EV_COMPLETED;
        e->at = now;
        e->work_id = xstrdup(it->id);
        e->attempt = it->attempt;
        e->result = json_incref(r->result ? r->result : json_null());
        res->status = "completed";
    } else {
        size_t before = out->len;
        end_attempt(ws, it, EV_FAILED, r->error ? r->error : "failed", r->retry, now, out);
        res->status = out->len - before == 2 ? "dead" : "scheduled";
    }
    res->accepted = true;
}

bool ws_decide_start(const WorkState *ws, const char *worker_id, char *const *queues, int64_t now,
                     EventList *out)
{
    const WorkItem *best = NULL;
    if (queues && queues[0]) {
        for (size_t i = 0; queues[i]; i++) {
            const Queue *q = hmap_get(&ws->queues, queues[i]);
            const WorkItem *top = q && queue_open(q, now) ? next_of(q) : NULL;
            if (top && (!best || ready_less(top, best)))
                best = top;
        }
    } else {
        const char *k;
        void *v;
        for (size_t i = 0; hmap_next(&ws->queues, &i, &k, &v);) {
            const WorkItem *top = queue_open(v, now) ? next_of(v) : NULL;
            if (top && (!best || ready_less(top, best)))
                best = top;
        }
    }
    if (!best)
        return false;
    Event *e = eventlist_push(out);
    e->type = EV_STARTED;
    e->at = now;
    e->work_id = xstrdup(best->id);
    e->attempt = best->attempt + 1;
    e->worker_id = xstrdup(worker_id);
    e->deadline = now + best->timeout_ms + ws->cfg.lease_grace_ms;
    return true;
}

static bool worker_expired(const WorkState *ws, const WsWorker *w, int64_t now)
{
    return w->last_seen + ws->cfg.worker_timeout_ms <= now;
}

void ws_decide_timers(const WorkState *ws, int64_t now, EventList *out)
{
    /* Every running item is visited only when something is due: the heap top
     * tells whether any deadline passed; a silent worker is rare. */
    bool any_worker_gone = false;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&ws->workers, &i, &k, &v);)
        if (worker_expired(ws, v, now))
            any_worker_gone = true;
    const WorkItem *top = heap_peek(&ws->running);
    if (!any_worker_gone && (!top || top->deadline > now))
        return;
    for (size_t i = 0; i < ws->running.len; i++) {
        const WorkItem *it = ws->running.items[i];
        if (it->deadline <= now) {
            char msg[256];
            snprintf(msg, sizeof msg, "attempt %d timed out: no result within %lld ms", it->attempt,
                     (long long)(it->deadline - it->started_at));
            end_attempt(ws, it, EV_TIMED_OUT, msg, true, now, out);
            continue;
        }
        const WsWorker *w = hmap_get(&ws->workers, it->worker_id);
        if (!w || worker_expired(ws, w, now)) {
            char msg[256];
            snprintf(msg, sizeof msg, "worker %s lost: no heartbeat for %lld ms", it->worker_id,
                     (long long)ws->cfg.worker_timeout_ms);
            end_attempt(ws, it, EV_FAILED, msg, true, now, out);
        }
    }
}

int ws_decide_queue_set(const WorkState *ws, const char *queue, const QueueLimits *lim, int64_t now,
                        EventList *out, Err *err)
{
    (void)ws;
    if (lim->max_running < 0 || lim->rate_limit < 0 ||
        (lim->rate_limit && lim->rate_period_ms <= 0))
        return err_set(err, 400, "invalid-field", "queue limits must not be negative");
    if (lim->n_weights > QL_MAX_WEIGHTS)
        return err_set(err, 400, "invalid-field", "at most %d keys of a queue may have a weight",
                       QL_MAX_WEIGHTS);
    for (size_t i = 0; i < lim->n_weights; i++)
        if (lim->weights[i].weight < 1 || lim->weights[i].weight > QL_MAX_WEIGHT)
            return err_set(err, 400, "invalid-field", "a key's weight must be from 1 to %d",
                           QL_MAX_WEIGHT);
    Event *e = eventlist_push(out);
    e->type = EV_QUEUE_SET;
    e->at = now;
    e->queue = xstrdup(queue);
    queue_limits_copy(&e->limits, lim);
    queue_limits_sort(&e->limits);
    return 0;
}

bool ws_queue_known(const WorkState *ws, const char *queue)
{
    return hmap_get(&ws->queues, queue) != NULL;
}

QueueLimits ws_queue_limits(const WorkState *ws, const char *queue)
{
    const Queue *q = hmap_get(&ws->queues, queue);
    QueueLimits none = {0};
    return q ? q->lim : none;
}

const char *ws_queue_next(const WorkState *ws, size_t *pos)
{
    const char *name;
    return hmap_next(&ws->queues, pos, &name, NULL) ? name : NULL;
}

double ws_queue_tokens(const WorkState *ws, const char *queue, int64_t now)
{
    const Queue *q = hmap_get(&ws->queues, queue);
    return q && q->lim.rate_limit ? tokens_at(q, now) : -1;
}

void ws_queue_restore(WorkState *ws, const char *queue, const QueueLimits *lim, int64_t now)
{
    Queue *q = queue_get(ws, queue);
    queue_limits_clear(&q->lim);
    queue_limits_copy(&q->lim, lim);
    queue_limits_sort(&q->lim);
    refresh_weights(q);
    q->tokens = 0; /* a new leader's bucket starts empty: no burst after a failover */
    q->tokens_at = now;
}

/* ---- dependencies ---- */

/* Room in it->links for n more links (the parents it names, at most). */
static void links_reserve(WorkItem *it, size_t n)
{
    it->links = xrealloc(it->links, (it->n_links + n + 1) * sizeof *it->links);
}

/* Links waiting work to the parent named `name` if it is open (and not the
 * work itself); a parent named twice links once. Room is reserved. O(1). */
static void kids_link_one(WorkState *ws, WorkItem *it, const char *name)
{
    WorkItem *p = hmap_get(&ws->items, name);
    if (!p || p == it)
        return;
    Kids *k = p->kids;
    if (!k)
        k = p->kids = xcalloc(1, sizeof *k);
    /* Named twice: its list then ends with this child already (nothing else
     * is linked meanwhile). */
    if (k->n && k->v[k->n - 1].child == it)
        return;
    if (k->n == k->cap) {
        k->cap = k->cap ? k->cap * 2 : 4;
        k->v = xrealloc(k->v, k->cap * sizeof *k->v);
    }
    it->links[it->n_links] = (WsLink){.parent = p, .slot = k->n};
    k->v[k->n++] = (KidRef){.child = it, .link = it->n_links++};
    k->live++;
    ws->edges++;
}

/* Links waiting work to each of the parents of `after` (a JSON array of
 * ids) that is open; returns how many. */
static size_t kids_link_json(WorkState *ws, WorkItem *it, const json_t *after)
{
    links_reserve(it, json_array_size(after));
    size_t i;
    json_t *a;
    json_array_foreach(after, i, a)
    {
        if (json_is_string(a))
            kids_link_one(ws, it, json_string_value(a));
    }
    return it->parents_open = it->n_links;
}

/* The same for work restored with the names of its parents (it->after,
 * which goes once linked). */
static size_t kids_link_names(WorkState *ws, WorkItem *it)
{
    links_reserve(it, strv_len(it->after));
    for (size_t j = 0; it->after && it->after[j]; j++)
        kids_link_one(ws, it, it->after[j]);
    strv_free(it->after);
    it->after = NULL;
    return it->parents_open = it->n_links;
}

/* Closes the holes of a parent's list, order kept, telling each child that
 * moves its new place. */
static void kids_compact(Kids *k)
{
    size_t w = 0;
    for (size_t i = 0; i < k->n; i++) {
        KidRef r = k->v[i];
        if (!r.child)
            continue;
        r.child->links[r.link].slot = w;
        k->v[w++] = r;
    }
    k->n = w;
}

/* Takes waiting work out of its open parents' lists (order kept: children
 * are decided in the order they were accepted). A child whose parents have
 * all finished (one released) has nothing left to take out. */
static void kids_unlink(WorkState *ws, WorkItem *it)
{
    for (size_t j = 0; it->parents_open && j < it->n_links; j++) {
        WsLink *l = &it->links[j];
        if (!l->parent)
            continue;
        Kids *k = l->parent->kids;
        l->parent = NULL;
        it->parents_open--;
        if (!k || l->slot >= k->n || k->v[l->slot].child != it)
            continue;
        k->v[l->slot].child = NULL;
        k->live--;
        ws->edges--;
        if (k->n > 64 && k->live * 2 < k->n)
            kids_compact(k);
    }
    free(it->links);
    it->links = NULL;
    it->n_links = it->parents_open = 0;
}

/* A parent finishes: its children's links to it end (each child learns it
 * has one open parent less), and its list goes. */
static void kids_release(WorkState *ws, WorkItem *parent)
{
    Kids *k = parent->kids;
    if (!k)
        return;
    for (size_t i = 0; i < k->n; i++) {
        KidRef r = k->v[i];
        if (!r.child)
            continue;
        r.child->links[r.link].parent = NULL;
        r.child->parents_open--;
    }
    ws->edges -= k->live;
    free(k->v);
    free(k);
    parent->kids = NULL;
}

/* Whether c waits for an open parent besides the one it is linked to that
 * finishes now. */
static bool other_parent_open(const WorkItem *c)
{
    return c->parents_open > 1;
}

void ws_decide_followups(const WorkState *ws, const Event *e, int64_t now, EventList *out)
{
    if (!event_is_final(e->type))
        return;
    const WorkItem *it = hmap_get(&ws->items, e->work_id);
    if (!it)
        return;
    bool completed = e->type == EV_COMPLETED;
    if (e->type == EV_COMPLETED && (it->status != WORK_RUNNING || it->attempt != e->attempt))
        return; /* ws_apply ignores it */
    const Kids *k = it->kids;
    for (size_t i = 0; k && i < k->n; i++) {
        const WorkItem *c = k->v[i].child;
        if (!c || c->status != WORK_WAITING)
            continue;
        if (completed || c->run_anyway) {
            if (other_parent_open(c))
                continue;
            Event *r = eventlist_push(out);
            r->type = EV_RELEASED;
            r->at = now;
            r->work_id = xstrdup(c->id);
        } else {
            Event *x = eventlist_push(out);
            x->type = EV_CANCELLED;
            x->at = now;
            x->work_id = xstrdup(c->id);
            char why[300];
            snprintf(why, sizeof why, "parent %s is %s", it->id, event_type_name(e->type));
            x->reason = xstrdup(why);
        }
    }
    const Batch *b = it->batch ? hmap_get(&ws->batches, it->batch) : NULL;
    if (!b || b->open != 1)
        return;
    Event *f = eventlist_push(out);
    f->type = EV_BATCH;
    f->at = now;
    f->batch = xstrdup(b->id);
    memcpy(f->counts, b->counts, sizeof f->counts);
    f->counts[completed ? 0 : e->type == EV_DEAD ? 1 : 2]++;
    if (b->callback) {
        char id[ID_MAX + 1];
        ws_callback_id(b->id, id, sizeof id);
        f->callback_id = xstrdup(id);
        Event *a = eventlist_push(out);
        a->type = EV_ACCEPTED;
        a->at = now;
        a->work_id = xstrdup(id);
        a->queue = xstrdup(b->callback->queue);
        a->key = xstrdup(b->callback->key);
        a->priority = b->callback->priority;
        a->payload = json_incref(b->callback->payload);
        a->timeout_ms = b->callback->timeout_ms;
        a->max_attempts = b->callback->max_attempts;
    }
}

bool ws_followup_stale(const WorkState *ws, const Event *e)
{
    const WorkItem *it = e->work_id ? hmap_get(&ws->items, e->work_id) : NULL;
    switch (e->type) {
    case EV_RELEASED:
    case EV_CANCELLED:
        return !it || it->status != WORK_WAITING;
    case EV_BATCH:
        return !hmap_get(&ws->batches, e->batch);
    case EV_ACCEPTED:
        return it != NULL;
    default:
        return false;
    }
}

void ws_callback_id(const char *batch, char *out, size_t len)
{
    snprintf(out, len, "%s%ccallback", batch, SYSTEM_ID_MARK);
}

const Batch *ws_batch(const WorkState *ws, const char *id)
{
    return hmap_get(&ws->batches, id);
}

void ws_batch_restore(WorkState *ws, const char *id, const WorkTemplate *callback,
                      const int counts[3])
{
    if (hmap_get(&ws->batches, id))
        return;
    Batch *b = xcalloc(1, sizeof *b);
    b->id = xstrdup(id);
    if (callback) {
        b->callback = xcalloc(1, sizeof *b->callback);
        template_copy(b->callback, callback);
    }
    memcpy(b->counts, counts, sizeof b->counts);
    hmap_put(&ws->batches, b->id, b);
}

void ws_handed(WorkState *ws, const char *work_id, int attempt, int64_t now)
{
    WorkItem *it = hmap_get(&ws->items, work_id);
    if (it && it->status == WORK_RUNNING && it->attempt == attempt && !it->handed_at)
        it->handed_at = now;
}

void ws_restore_links(WorkState *ws)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&ws->items, &i, &k, &v);) {
        WorkItem *it = v;
        Batch *b = it->batch ? hmap_get(&ws->batches, it->batch) : NULL;
        if (b)
            b->open++;
        if (it->status == WORK_WAITING && !kids_link_names(ws, it))
            place_pending(ws, it); /* no parent open: it was due to run */
    }
}

/* ---- schedules ---- */

static bool item_open(const char *id, const void *ud)
{
    return hmap_get(&((const WorkState *)ud)->items, id) != NULL;
}

void ws_decide_ticks(const WorkState *ws, int64_t now, EventList *out)
{
    size_t max = (size_t)ws->cfg.max_open;
    TickEnv env = {
        .is_open = item_open, .ud = ws, .room = ws->items.len < max ? max - ws->items.len : 0};
    sched_decide_ticks(ws->sched, now, &env, out);
}

void ws_decide_schedule_set(const WorkState *ws, const char *name, const ScheduleSpec *spec,
                            int64_t now, EventList *out)
{
    const Schedule *x = sched_get(ws->sched, name);
    /* A schedule goes on from its last tick unless it is new, resumed, or
     * given another time: then only ticks from now on are due. */
    bool goes_on = x && !(x->spec->paused && !spec->paused) &&
                   !strcmp(x->spec->cron_text, spec->cron_text) && !strcmp(x->spec->tz, spec->tz);
    Event *e = eventlist_push(out);
    e->type = EV_SCHEDULE_SET;
    e->at = now;
    e->schedule = xstrdup(name);
    e->sched = schedspec_dup(spec);
    e->tick = goes_on ? x->last_tick : now;
}

int ws_decide_schedule_delete(const WorkState *ws, const char *name, int64_t now, EventList *out,
                              Err *err)
{
    if (!sched_get(ws->sched, name))
        return err_set(err, 404, "not-found", "no schedule '%s'", name);
    Event *e = eventlist_push(out);
    e->type = EV_SCHEDULE_DELETED;
    e->at = now;
    e->schedule = xstrdup(name);
    return 0;
}

const Schedule *ws_schedule(const WorkState *ws, const char *name)
{
    return sched_get(ws->sched, name);
}

size_t ws_schedule_count(const WorkState *ws)
{
    return sched_count(ws->sched);
}

const SubscriptionSet *ws_subscriptions(const WorkState *ws)
{
    return ws->subs;
}

void ws_subscription_restore(WorkState *ws, const Subscription *sub)
{
    subs_restore(ws->subs, sub);
}

void ws_schedule_restore(WorkState *ws, const char *name, const ScheduleSpec *spec,
                         int64_t last_tick, const char *last_work)
{
    sched_restore(ws->sched, name, spec, last_tick, last_work);
}

/* ---- applying ---- */

/* ---- applying, one function per kind (APPLY below) ----
 * it is the event's open item (NULL: none). An event that does not fit the
 * state (a stale attempt, an id already open) changes nothing: replaying an
 * old log must not fail. */

static void apply_nothing(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)ws;
    (void)e;
    (void)it;
}

static void apply_schedule(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)it;
    sched_apply(ws->sched, e);
}

static void apply_subscription(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)it;
    subs_apply(ws->subs, e);
}

static void apply_batch_opened(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)it;
    if (hmap_get(&ws->batches, e->batch))
        return;
    Batch *b = xcalloc(1, sizeof *b);
    b->id = xstrdup(e->batch);
    if (e->callback) {
        b->callback = xcalloc(1, sizeof *b->callback);
        template_copy(b->callback, e->callback);
    }
    hmap_put(&ws->batches, b->id, b);
}

static void apply_batch(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)it;
    Batch *b = hmap_del(&ws->batches, e->batch);
    if (b)
        batch_free(b);
}

static void apply_released(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)e;
    if (!it || it->status != WORK_WAITING)
        return;
    kids_unlink(ws, it);
    place_pending(ws, it);
}

static void apply_queue_set(WorkState *ws, const Event *e, WorkItem *it)
{
    (void)it;
    Queue *q = queue_get(ws, e->queue);
    bool rate_changed = q->lim.rate_limit != e->limits.rate_limit ||
                        q->lim.rate_period_ms != e->limits.rate_period_ms;
    queue_limits_clear(&q->lim);
    queue_limits_copy(&q->lim, &e->limits);
    refresh_weights(q);
    if (rate_changed) { /* a new bucket starts empty: no burst */
        q->tokens = 0;
        q->tokens_at = e->at;
    }
}

/* accepted, retried: a new open item. */
static void apply_accepted(WorkState *ws, const Event *e, WorkItem *it)
{
    if (it)
        return;
    it = xcalloc(1, sizeof *it);
    it->attempt = e->type == EV_RETRIED ? e->attempt : 0;
    it->last_error = e->type == EV_RETRIED ? xstrdup(e->error) : NULL;
    it->id = xstrdup(e->work_id);
    it->queue = xstrdup(e->queue);
    it->key = xstrdup(e->key);
    it->priority = e->priority;
    it->payload = json_incref(e->payload);
    it->run_at = e->run_at;
    it->timeout_ms = e->timeout_ms;
    it->max_attempts = e->max_attempts;
    it->accepted_seq = e->seq;
    it->created_at = e->at;
    it->traceparent = xstrdup(e->traceparent);
    it->tracestate = xstrdup(e->tracestate);
    it->heap_idx = HEAP_NONE;
    hmap_put(&ws->items, it->id, it);
    if (e->type == EV_RETRIED && e->batch) {
        Batch *b = hmap_get(&ws->batches, e->batch);
        if (b) { /* back among the open members: no longer counted dead */
            it->batch = xstrdup(e->batch);
            b->open++;
            if (b->counts[1] > 0)
                b->counts[1]--;
        }
    }
    if (e->type == EV_ACCEPTED) {
        it->run_anyway = e->run_anyway;
        it->batch = xstrdup(e->batch);
        Batch *b = it->batch ? hmap_get(&ws->batches, it->batch) : NULL;
        if (b)
            b->open++;
        if (e->after && kids_link_json(ws, it, e->after)) {
            take_edges(ws, it->n_links, e->at);
            it->status = WORK_WAITING;
            return;
        }
    }
    place_pending(ws, it);
}

static void apply_started(WorkState *ws, const Event *e, WorkItem *it)
{
    if (!it || it->status != WORK_PENDING)
        return;
    /* One of the key's turns is used: when its round's turns (its weight)
     * are all used, the key after it in the ring goes next. */
    Queue *q = queue_get(ws, it->queue);
    KeyQ *k = it->where == IN_READY ? hmap_get(&q->keys, key_of(it)) : NULL;
    bool stay = k && k->ready.len > 1 && k->turns + 1 < k->weight;
    if (k)
        k->turns = stay ? k->turns + 1 : 0;
    KeyQ *after = stay ? k : k && k->next != k ? k->next : NULL;
    unplace(ws, it);
    it->status = WORK_RUNNING;
    it->attempt = e->attempt;
    free(it->worker_id);
    it->worker_id = xstrdup(e->worker_id);
    it->deadline = e->deadline;
    it->started_at = e->at;
    it->handed_at = 0; /* until this attempt's start is committed (ws_handed) */
    it->run_at = 0;
    run_place(ws, it);
    if (after)
        q->cursor = after;
    take_token(q, e->at);
}

/* failed, timed_out: the attempt ends; retried at retry_at, or dead next. */
static void apply_attempt_ended(WorkState *ws, const Event *e, WorkItem *it)
{
    if (!it || it->status != WORK_RUNNING || it->attempt != e->attempt)
        return;
    unplace(ws, it);
    free(it->last_error);
    it->last_error = xstrdup(e->error);
    free(it->worker_id);
    it->worker_id = NULL;
    it->deadline = 0;
    it->status = WORK_PENDING;
    if (e->retry_at) {
        it->run_at = e->retry_at;
        place_pending(ws, it);
    }
    /* else: a dead event follows in the same commit; the item waits in no heap */
}

/* completed, dead, cancelled: forget the item; the database keeps the
 * record. Its waiting children were decided with this event
 * (ws_decide_followups). */
static void apply_finished(WorkState *ws, const Event *e, WorkItem *it)
{
    if (!it ||
        (e->type == EV_COMPLETED && (it->status != WORK_RUNNING || it->attempt != e->attempt)))
        return;
    if (it->status == WORK_WAITING)
        kids_unlink(ws, it);
    kids_release(ws, it);
    Batch *b = it->batch ? hmap_get(&ws->batches, it->batch) : NULL;
    if (b) {
        b->open--;
        b->counts[e->type == EV_COMPLETED ? 0 : e->type == EV_DEAD ? 1 : 2]++;
    }
    unplace(ws, it);
    hmap_del(&ws->items, it->id);
    item_free(it);
}

typedef void (*Applier)(WorkState *ws, const Event *e, WorkItem *it);

/* What each kind does to the state: a new kind is its entry here. */
static const Applier APPLY[] = {
    [EV_TERM] = apply_nothing,
    [EV_ACCEPTED] = apply_accepted,
    [EV_STARTED] = apply_started,
    [EV_COMPLETED] = apply_finished,
    [EV_FAILED] = apply_attempt_ended,
    [EV_TIMED_OUT] = apply_attempt_ended,
    [EV_DEAD] = apply_finished,
    [EV_CANCELLED] = apply_finished,
    [EV_RETRIED] = apply_accepted,
    [EV_QUEUE_SET] = apply_queue_set,
    [EV_PROGRESS] = apply_nothing, /* published, changes no state */
    [EV_SUBSCRIPTION] = apply_subscription,
    [EV_SUB_CURSOR] = apply_subscription,
    [EV_RELEASED] = apply_released,
    [EV_SCHEDULE_SET] = apply_schedule,
    [EV_SCHEDULE_DELETED] = apply_schedule,
    [EV_TICK] = apply_schedule,
    [EV_BATCH_OPENED] = apply_batch_opened,
    [EV_BATCH] = apply_batch,
};
_Static_assert(sizeof APPLY / sizeof APPLY[0] == EV_LAST + 1, "an applier for every kind");

void ws_apply(WorkState *ws, const Event *e)
{
    if (e->type < EV_TERM || e->type > EV_LAST)
        return;
    APPLY[e->type](ws, e, e->work_id ? hmap_get(&ws->items, e->work_id) : NULL);
}

void ws_advance(WorkState *ws, int64_t now)
{
    const char *k;
    void *v;
    Queue **idle = NULL;
    size_t n_idle = 0, cap_idle = 0;
    for (size_t i = 0; hmap_next(&ws->queues, &i, &k, &v);) {
        Queue *q = v;
        WorkItem *it;
        while ((it = heap_peek(&q->delayed)) && it->run_at <= now) {
            heap_pop(&q->delayed);
            it->run_at = 0;
            ready_push(q, it);
        }
        if (queue_idle(q)) {
            if (n_idle == cap_idle) {
                cap_idle = cap_idle ? cap_idle * 2 : 8;
                idle = xrealloc(idle, cap_idle * sizeof *idle);
            }
            idle[n_idle++] = q;
        }
    }
    /* Queue names are the clients' to choose: a queue without work and
     * without flow control is forgotten (it comes back with its next work),
     * so that names do not pile up in memory and in every round's walk. */
    for (size_t i = 0; i < n_idle; i++) {
        hmap_del(&ws->queues, idle[i]->name);
        queue_free(idle[i]);
    }
    free(idle);
    /* Forget silent workers once their attempts have been ended: collect them
     * first (the map must not change while it is walked), in one pass over
     * the workers and one over the running attempts. */
    WsWorker **gone = NULL;
    size_t n_gone = 0, cap = 0;
    for (size_t i = 0; hmap_next(&ws->workers, &i, &k, &v);) {
        if (!worker_expired(ws, v, now))
            continue;
        if (n_gone == cap) {
            cap = cap ? cap * 2 : 8;
            gone = xrealloc(gone, cap * sizeof *gone);
        }
        gone[n_gone++] = v;
    }
    if (!n_gone)
        return;
    HMap holders; /* worker id -> itself, for every worker holding an attempt */
    hmap_init(&holders);
    for (size_t j = 0; j < ws->running.len; j++) {
        const char *holder = ((WorkItem *)ws->running.items[j])->worker_id;
        hmap_put(&holders, holder, (void *)holder);
    }
    for (size_t i = 0; i < n_gone; i++)
        if (!hmap_get(&holders, gone[i]->id)) {
            hmap_del(&ws->workers, gone[i]->id);
            wsworker_free(gone[i]);
        }
    hmap_free(&holders);
    free(gone);
}

int64_t ws_next_deadline(const WorkState *ws)
{
    int64_t t = INT64_MAX;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&ws->queues, &i, &k, &v);) {
        const Queue *q = v;
        const WorkItem *it = heap_peek(&q->delayed);
        if (it && it->run_at < t)
            t = it->run_at;
        /* A rate-limited queue with ready work: when its next token is due. */
        if (q->lim.rate_limit && q->n_ready && q->tokens < 1.0) {
            int64_t due =
                q->tokens_at +
                (int64_t)((1.0 - q->tokens) * (double)q->lim.rate_period_ms / q->lim.rate_limit) +
                1;
            if (due < t)
                t = due;
        }
    }
    const WorkItem *r = heap_peek(&ws->running);
    if (r && r->deadline < t)
        t = r->deadline;
    int64_t tick = sched_next_deadline(ws->sched);
    if (tick < t)
        t = tick;
    for (size_t i = 0; hmap_next(&ws->workers, &i, &k, &v);) {
        const WsWorker *w = v;
        if (w->last_seen + ws->cfg.worker_timeout_ms < t)
            t = w->last_seen + ws->cfg.worker_timeout_ms;
    }
    return t;
}

/* ---- the worker registry ---- */

/* Fails every attempt held by worker_id (events to out). */
static void fail_attempts_of(const WorkState *ws, const char *worker_id, const char *why,
                             int64_t now, EventList *out)
{
    for (size_t i = 0; i < ws->running.len; i++) {
        const WorkItem *it = ws->running.items[i];
        if (!strcmp(it->worker_id, worker_id))
            end_attempt(ws, it, EV_FAILED, why, true, now, out);
    }
}

static bool lists_attempt(const RunningList *running, const char *work_id, int attempt)
{
    for (size_t i = 0; i < running->n; i++)
        if (!strcmp(running->items[i].work_id, work_id) && running->items[i].attempt == attempt)
            return true;
    return false;
}

RunningList *ws_running_copy(const RunningList *l, size_t max)
{
    if (!l)
        return NULL;
    RunningList *c = xcalloc(1, sizeof *c);
    c->as_of = l->as_of;
    c->n = l->n < max ? l->n : max;
    c->items = xcalloc(c->n + 1, sizeof *c->items);
    for (size_t i = 0; i < c->n; i++) {
        c->items[i].work_id = xstrdup(l->items[i].work_id);
        c->items[i].attempt = l->items[i].attempt;
    }
    return c;
}

void ws_reports_free(Report *reports, size_t n)
{
    for (size_t i = 0; reports && i < n; i++) {
        free((char *)reports[i].work_id);
        free((char *)reports[i].error);
        json_decref(reports[i].result);
    }
    free(reports);
}

void ws_running_free(RunningList *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i].work_id);
    free(l->items);
    free(l);
}

static int64_t unclaimed_grace(const WorkState *ws)
{
    return ws->cfg.unclaimed_grace_ms > 0 ? ws->cfg.unclaimed_grace_ms : ws->cfg.worker_timeout_ms;
}

/* An attempt the worker does not list although it was handed out more than
 * the grace ago never reached it (the answer to its pull was lost: its client
 * went away, or a leader stepped down or died right after committing the
 * start): it is ended now rather than at its deadline. */

static void fail_unclaimed(const WorkState *ws, const char *worker_id, const RunningList *running,
                           int64_t now, EventList *out)
{
    /* The list says what the worker ran when it sent it, which may be well
     * before this round (behind slow commits): the grace counts to then. */
    int64_t as_of = running->as_of && running->as_of < now ? running->as_of : now;
    for (size_t i = 0; i < ws->running.len; i++) {
        const WorkItem *it = ws->running.items[i];
        if (strcmp(it->worker_id, worker_id) != 0 || !it->handed_at ||
            as_of - it->handed_at < unclaimed_grace(ws) ||
            lists_attempt(running, it->id, it->attempt))
            continue;
        char why[256];
        snprintf(why, sizeof why, "worker %s does not run attempt %d: the job never reached it",
                 worker_id, it->attempt);
        end_attempt(ws, it, EV_FAILED, why, true, now, out);
    }
}

void ws_worker_seen(WorkState *ws, const char *worker_id, const char *instance, int capacity,
                    char *const *queues, const RunningList *running, int64_t now, EventList *out)
{
    WsWorker *w = hmap_get(&ws->workers, worker_id);
    bool restarted = false;
    if (!w) {
        w = xcalloc(1, sizeof *w);
        w->id = xstrdup(worker_id);
        hmap_put(&ws->workers, w->id, w);
    } else if (instance && w->instance && strcmp(instance, w->instance) != 0) {
        char why[256];
        snprintf(why, sizeof why, "worker %s restarted: its previous instance is gone", worker_id);
        fail_attempts_of(ws, worker_id, why, now, out);
        restarted = true;
    }
    if (instance && (!w->instance || strcmp(instance, w->instance) != 0)) {
        free(w->instance);
        w->instance = xstrdup(instance);
    }
    if (capacity > 0)
        w->capacity = capacity;
    if (queues) {
        strv_free(w->queues);
        w->queues = strv_copy(queues);
    }
    if (running) {
        ws_running_free(w->running);
        /* Kept for display, bounded: the whole list is only read here. */
        w->running = ws_running_copy(running, WORKER_RUNNING_KEPT);
        /* After a restart every attempt was failed above: not a second time. */
        if (!restarted)
            fail_unclaimed(ws, worker_id, running, now, out);
    }
    w->last_seen = now;
}

int ws_check_worker(const WorkState *ws, const char *worker_id, const char *instance, bool claim,
                    int64_t now, Err *err)
{
    const WsWorker *w = hmap_get(&ws->workers, worker_id);
    if (!w || !w->instance || worker_expired(ws, w, now) || claim ||
        (instance && !strcmp(instance, w->instance)))
        return 0;
    return err_set(err, 409, "worker-id-taken",
                   instance ? "worker '%s' is registered by another instance that is alive; a "
                              "token bound to this worker id may take it over"
                            : "worker '%s' is registered by an instance that is alive: name it "
                              "('instance'), or use a token bound to this worker id",
                   worker_id);
}

void ws_worker_forget(WorkState *ws, const char *worker_id, int64_t now, EventList *out)
{
    WsWorker *w = hmap_del(&ws->workers, worker_id);
    if (!w)
        return;
    char why[256];
    snprintf(why, sizeof why, "worker %s left while running the attempt", worker_id);
    fail_attempts_of(ws, worker_id, why, now, out);
    wsworker_free(w);
}

const WsWorker *ws_worker_get(const WorkState *ws, const char *worker_id)
{
    return hmap_get(&ws->workers, worker_id);
}

size_t ws_worker_count(const WorkState *ws)
{
    return ws->workers.len;
}

const WsWorker *ws_worker_next(const WorkState *ws, size_t *pos)
{
    void *v;
    return hmap_next(&ws->workers, pos, NULL, &v) ? v : NULL;
}

void ws_adopt_running_workers(WorkState *ws, int64_t now)
{
    for (size_t i = 0; i < ws->running.len; i++) {
        WorkItem *it = ws->running.items[i];
        it->handed_at = now; /* its answer, if any, left before the last leader went */
        if (!hmap_get(&ws->workers, it->worker_id)) {
            WsWorker *w = xcalloc(1, sizeof *w);
            w->id = xstrdup(it->worker_id);
            w->last_seen = now;
            hmap_put(&ws->workers, w->id, w);
        }
    }
}

/* ---- reading ---- */

const WorkItem *ws_get(const WorkState *ws, const char *work_id)
{
    return hmap_get(&ws->items, work_id);
}

size_t ws_open_count(const WorkState *ws)
{
    return ws->items.len;
}

WsQueueStats *ws_queue_stats(const WorkState *ws, int64_t now, size_t *n)
{
    WsQueueStats *out = NULL;
    size_t len = 0, cap = 0;
    HMap index; /* queue -> its entry's position + 1 (out moves as it grows) */
    hmap_init(&index);
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&ws->items, &i, &k, &v);) {
        const WorkItem *it = v;
        size_t pos = (size_t)(uintptr_t)hmap_get(&index, it->queue);
        if (!pos) {
            if (len == cap) {
                cap = cap ? cap * 2 : 8;
                out = xrealloc(out, cap * sizeof *out);
            }
            out[len] = (WsQueueStats){.queue = it->queue};
            pos = ++len;
            hmap_put(&index, it->queue, (void *)(uintptr_t)pos);
        }
        WsQueueStats *q = &out[pos - 1];
        const char *st = ws_item_status(it, now);
        if (!strcmp(st, "running"))
            q->running++;
        else if (!strcmp(st, "scheduled"))
            q->scheduled++;
        else if (!strcmp(st, "waiting"))
            q->waiting++;
        else
            q->pending++;
    }
    hmap_free(&index);
    *n = len;
    return out ? out : xcalloc(1, sizeof *out);
}

const WorkItem *ws_item_next(const WorkState *ws, size_t *pos)
{
    const char *k;
    void *v;
    return hmap_next(&ws->items, pos, &k, &v) ? v : NULL;
}

void ws_restore(WorkState *ws, const WorkItem *src)
{
    if (hmap_get(&ws->items, src->id))
        return;
    WorkItem *it = xcalloc(1, sizeof *it);
    *it = *src;
    it->id = xstrdup(src->id);
    it->queue = xstrdup(src->queue);
    it->key = xstrdup(src->key);
    it->payload = json_incref(src->payload);
    it->worker_id = xstrdup(src->worker_id);
    it->last_error = xstrdup(src->last_error);
    /* Its parents' names, until ws_restore_links links it. */
    it->after = src->status == WORK_WAITING ? strv_copy(src->after) : NULL;
    it->batch = xstrdup(src->batch);
    it->traceparent = xstrdup(src->traceparent);
    it->tracestate = xstrdup(src->tracestate);
    it->links = NULL; /* ws_restore_links links it */
    it->n_links = it->parents_open = 0;
    it->kids = NULL;
    it->heap_idx = HEAP_NONE;
    it->where = IN_NONE;
    hmap_put(&ws->items, it->id, it);
    if (it->status == WORK_WAITING)
        return; /* linked to its parents by ws_restore_links */
    if (it->status == WORK_RUNNING) {
        it->run_at = 0;
        run_place(ws, it);
    } else {
        place_pending(ws, it);
    }
}
