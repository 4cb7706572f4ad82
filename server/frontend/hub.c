/* hub: see hub.h. One mutex guards the rings, the subscribers and the waiters.
 * A connection is resumed outside the mutex: a suspended connection cannot be
 * closed by libmicrohttpd, so the subscriber stays valid until it is resumed. */
#include "hub.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "view.h"
#include "log.h"
#include "util.h"

#define RING_CAP 8192    /* events in all shards' rings, at most; and at most Hub.ring_bytes */
#define CATCHUP_PAGE 500 /* events per read from the table, at most; and about Hub.buffer_bytes */

typedef struct Entry {
    int64_t seq;
    uint64_t arrival; /* hub-wide: the order the shards' events came in */
    bool progress;    /* a progress event (only subscribers that asked get it) */
    bool ends;        /* the work's end (completed, dead, cancelled): its stream ends here */
    char *work_id;
    char *queue;
    char *frame;
    size_t len;
} Entry;

typedef struct Sub {
    Hub *hub;
    struct MHD_Connection *conn;
    char *work_id, *queue; /* filters, NULL: any */
    bool progress;         /* wants progress events too */
    Cursor cursor;         /* everything up to here was sent or skipped */
    int only;              /* the one shard followed (a work's), or SUB_ALL or SUB_UNKNOWN */
    SBuf out;              /* unsent output: at most Hub.buffer_bytes, or one event */
    size_t out_pos;
    bool suspended, catching_up, closed, keepalive_due;
    bool until_end; /* a work's own stream: ends after the work's end */
    bool ended;     /* ...which is in out: the stream ends once it is sent */
    int64_t last_write_ms, retry_at_ms;
    struct Sub *prev, *next;
} Sub;

/* Sub.only: every shard, or a work's whose shard is not known yet (every
 * shard until it is). */
enum { SUB_ALL = -1, SUB_UNKNOWN = -2 };

typedef struct Waiter {
    int shard;
    char *work_id;
    int64_t after_seq, deadline;
    void (*fn)(void *);
    void *arg;
    struct Waiter *next;
} Waiter;

/* The finished statuses counted per queue: completed, dead, cancelled (as in
 * QueueRate). */
enum { RATE_KINDS = 3 };

/* Finished events per 10-second bucket, for one queue. */
typedef struct Rate {
    char *queue;
    int64_t bucket[HUB_RATE_BUCKETS]; /* which bucket (ms / HUB_RATE_BUCKET_MS) slot i holds */
    int count[RATE_KINDS][HUB_RATE_BUCKETS]; /* completed, dead, cancelled */
    struct Rate *next;
} Rate;

/* One shard's newest events, in its seq order. */
typedef struct HubShard {
    Entry *ring;
    size_t cap;           /* RING_CAP / shards entries */
    int64_t ring_bytes;   /* Hub.ring_bytes / shards */
    size_t head, len;     /* oldest entry at head */
    size_t bytes;         /* of the frames in the ring */
    int64_t covered_from; /* every finished event with seq > this is in the ring... */
    int64_t scanned_upto; /* ...up to this seq */
    int64_t claimed_upto; /* the manager of this node publishes up to this seq */
} HubShard;

struct Hub {
    pthread_mutex_t lock;
    Rate *rates;
    DbPool *pool;
    Metrics *metrics;
    int64_t keepalive_ms, max_subs;
    int64_t ring_bytes, buffer_bytes; /* budgets (hub.h) */
    int n;                            /* shards */
    HubShard *shard;                  /* n of them */
    uint64_t arrivals;                /* events published so far */
    Sub *subs;
    int64_t nsubs;
    Waiter *waiters;
    bool stopping;
};

/* ---- lifetime ---- */

Hub *hub_new(DbPool *pool, Metrics *metrics, int64_t keepalive_ms, int64_t max_subscribers,
             int64_t ring_bytes, int64_t buffer_bytes, const Cursor *last)
{
    Hub *h = xcalloc(1, sizeof *h);
    pthread_mutex_init(&h->lock, NULL);
    h->pool = pool;
    h->metrics = metrics;
    h->keepalive_ms = keepalive_ms;
    h->max_subs = max_subscribers;
    h->ring_bytes = ring_bytes;
    h->buffer_bytes = buffer_bytes;
    h->n = last->n;
    h->shard = xcalloc((size_t)h->n, sizeof *h->shard);
    for (int k = 0; k < h->n; k++) {
        HubShard *hs = &h->shard[k];
        hs->cap = RING_CAP / (size_t)h->n;
        hs->ring = xcalloc(hs->cap, sizeof *hs->ring);
        hs->ring_bytes = ring_bytes / h->n;
        hs->covered_from = hs->scanned_upto = hs->claimed_upto = last->seq[k];
    }
    return h;
}

int hub_shards(const Hub *h)
{
    return h->n;
}

/* Shard k's entry i, oldest first. */
static Entry *entry_at(const Hub *h, int k, size_t i)
{
    const HubShard *hs = &h->shard[k];
    return &hs->ring[(hs->head + i) % hs->cap];
}

static void entry_clear(Entry *e)
{
    free(e->work_id);
    free(e->queue);
    free(e->frame);
    memset(e, 0, sizeof *e);
}

/* Resumes the connections in list (collected under the lock), outside it. */
static void resume_all(struct MHD_Connection **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        MHD_resume_connection(list[i]);
    free(list);
}

typedef struct Fire {
    void (*fn)(void *);
    void *arg;
} Fire;

typedef enum {
    TAKE_NONE,     /* nothing */
    TAKE_ALL,      /* shutting down */
    TAKE_FINISHED, /* work_id has a finished event at seq v */
    TAKE_DUE,      /* the time is v */
} TakeWhy;

/* Takes the waiters that `why` ends off the list, under the lock; the caller
 * fires them with fire_all once it has released the lock. */
static Fire *take_waiters(Hub *h, TakeWhy why, int shard, const char *work_id, int64_t v,
                          size_t *nf)
{
    Fire *fires = NULL;
    *nf = 0;
    for (Waiter **pw = &h->waiters; *pw;) {
        Waiter *w = *pw;
        bool take = why == TAKE_ALL ||
                    (why == TAKE_FINISHED && w->shard == shard && !strcmp(w->work_id, work_id) &&
                     v > w->after_seq) ||
                    (why == TAKE_DUE && w->deadline <= v);
        if (!take) {
            pw = &w->next;
            continue;
        }
        fires = xrealloc(fires, (*nf + 1) * sizeof *fires);
        fires[(*nf)++] = (Fire){w->fn, w->arg};
        *pw = w->next;
        free(w->work_id);
        free(w);
    }
    return fires;
}

static void fire_all(Fire *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i].fn(f[i].arg);
    free(f);
}

/* Called with the lock held: takes the waiters that `why` ends, releases the
 * lock, then resumes the n connections of wake (collected under the lock) and
 * fires those waiters. */
static void unlock_then_wake(Hub *h, struct MHD_Connection **wake, size_t n, TakeWhy why, int shard,
                             const char *work_id, int64_t v)
{
    size_t nf;
    Fire *fires = take_waiters(h, why, shard, work_id, v, &nf);
    pthread_mutex_unlock(&h->lock);
    resume_all(wake, n);
    fire_all(fires, nf);
}

void hub_shutdown(Hub *h)
{
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    size_t n = 0;
    struct MHD_Connection **wake = xcalloc((size_t)h->nsubs + 1, sizeof *wake);
    for (Sub *s = h->subs; s; s = s->next)
        if (s->suspended && !s->catching_up) {
            s->suspended = false;
            wake[n++] = s->conn;
        }
    unlock_then_wake(h, wake, n, TAKE_ALL, 0, NULL, 0);
}

void hub_free(Hub *h)
{
    if (!h)
        return;
    while (h->rates) {
        Rate *r = h->rates;
        h->rates = r->next;
        free(r->queue);
        free(r);
    }
    for (int k = 0; k < h->n; k++) {
        for (size_t i = 0; i < h->shard[k].cap; i++)
            entry_clear(&h->shard[k].ring[i]);
        free(h->shard[k].ring);
    }
    free(h->shard);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* ---- frames ---- */

static bool wants(const Sub *s, const char *work_id, const char *queue, bool progress)
{
    return (!progress || s->progress) && (!s->work_id || !strcmp(s->work_id, work_id)) &&
           (!s->queue || !strcmp(s->queue, queue));
}

/* The work's end: nothing follows it (bar an operator's retry of dead work,
 * which a client follows by opening the stream again). */
static bool ends_work(const ResultEvent *ev)
{
    return event_is_final(ev->type);
}

/* ---- throughput ---- */

static void count_rate(Hub *h, const char *queue, EventType type, int64_t now)
{
    int kind = type == EV_COMPLETED ? 0 : type == EV_DEAD ? 1 : 2; /* as in QueueRate */
    Rate *r = h->rates;
    while (r && strcmp(r->queue, queue) != 0)
        r = r->next;
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->queue = xstrdup(queue);
        r->next = h->rates;
        h->rates = r;
    }
    int64_t b = now / HUB_RATE_BUCKET_MS;
    int slot = (int)(b % HUB_RATE_BUCKETS);
    if (r->bucket[slot] != b) {
        r->bucket[slot] = b;
        for (int k = 0; k < RATE_KINDS; k++)
            r->count[k][slot] = 0;
    }
    r->count[kind][slot]++;
}

static int rate_by_queue(const void *a, const void *b)
{
    return strcmp(((const QueueRate *)a)->queue, ((const QueueRate *)b)->queue);
}

HubRates *hub_rates(Hub *h, int64_t now)
{
    HubRates *out = xcalloc(1, sizeof *out);
    int64_t last = now / HUB_RATE_BUCKET_MS;
    pthread_mutex_lock(&h->lock);
    for (Rate *r = h->rates; r; r = r->next) {
        out->items = xrealloc(out->items, (out->len + 1) * sizeof *out->items);
        QueueRate *q = &out->items[out->len++];
        q->queue = xstrdup(r->queue);
        int *into[RATE_KINDS] = {q->completed, q->dead, q->cancelled};
        for (int k = 0; k < RATE_KINDS; k++)
            for (int64_t b = last - HUB_RATE_BUCKETS + 1, i = 0; b <= last; b++, i++) {
                int slot = (int)(b % HUB_RATE_BUCKETS);
                into[k][i] = r->bucket[slot] == b ? r->count[k][slot] : 0;
            }
    }
    pthread_mutex_unlock(&h->lock);
    if (out->len > 1)
        qsort(out->items, out->len, sizeof *out->items, rate_by_queue);
    return out;
}

void hub_rates_free(HubRates *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->len; i++)
        free(r->items[i].queue);
    free(r->items);
    free(r);
}

/* ---- feeding ---- */

void hub_publish(Hub *h, ResultEvent *ev)
{
    int64_t seq = ev->seq;
    if (ev->shard < 0 || ev->shard >= h->n)
        return; /* not a shard of this cluster: cannot happen */
    pthread_mutex_lock(&h->lock);
    HubShard *hs = &h->shard[ev->shard];
    if (seq <= hs->scanned_upto) {
        pthread_mutex_unlock(&h->lock);
        return; /* already have it */
    }
    size_t frame_len = ev->frame_len;
    /* Room by count and by bytes; the newest event always fits, alone. */
    while (hs->len && (hs->len == hs->cap || hs->bytes + frame_len > (size_t)hs->ring_bytes)) {
        Entry *old = &hs->ring[hs->head];
        hs->covered_from = old->seq;
        hs->bytes -= old->len;
        entry_clear(old);
        hs->head = (hs->head + 1) % hs->cap;
        hs->len--;
    }
    Entry *e = &hs->ring[(hs->head + hs->len) % hs->cap];
    e->seq = seq;
    e->arrival = h->arrivals++;
    e->progress = ev->type == EV_PROGRESS;
    e->ends = ends_work(ev);
    e->work_id = ev->work_id;
    e->queue = ev->queue;
    e->frame = ev->frame;
    e->len = frame_len;
    ev->work_id = ev->queue = ev->frame = NULL; /* the ring's now */
    hs->bytes += frame_len;
    hs->len++;
    hs->scanned_upto = seq;
    if (!e->progress && ev->type != EV_BATCH) /* a batch's end is not a job's */
        count_rate(h, e->queue, ev->type, wall_ms());

    size_t n = 0;
    struct MHD_Connection **wake = xcalloc((size_t)h->nsubs + 1, sizeof *wake);
    for (Sub *s = h->subs; s; s = s->next)
        if (s->suspended && !s->catching_up && wants(s, e->work_id, e->queue, e->progress)) {
            s->suspended = false;
            wake[n++] = s->conn;
        }
    /* A progress event ends no wait: only the work's finish does. */
    unlock_then_wake(h, wake, n, e->progress ? TAKE_NONE : TAKE_FINISHED, ev->shard, e->work_id,
                     seq);
}

void hub_publish_committed(Hub *h, int shard, const EventList *events)
{
    if (!events->len)
        return;
    int64_t first = events->items[0].seq, last = events->items[events->len - 1].seq;
    if (hub_scanned_upto(h, shard) < first - 1)
        return; /* a gap before this commit: the listener reads it all in order */
    for (size_t i = 0; i < events->len; i++)
        if (event_is_published(events->items[i].type)) {
            ResultEvent ev;
            view_result_of(&events->items[i], &ev);
            ev.shard = shard;
            hub_publish(h, &ev);
            view_result_clear(&ev);
        }
    hub_scanned(h, shard, last);
}

bool hub_claim(Hub *h, int shard, int64_t first, int64_t last)
{
    if (shard < 0 || shard >= h->n)
        return false;
    pthread_mutex_lock(&h->lock);
    HubShard *hs = &h->shard[shard];
    /* Right after what the hub has, or after the claim of an append still
     * out (the manager sends one behind another). */
    bool in_order = hs->scanned_upto == first - 1 ||
                    (hs->claimed_upto > hs->scanned_upto && hs->claimed_upto == first - 1);
    if (in_order)
        hs->claimed_upto = last;
    pthread_mutex_unlock(&h->lock);
    return in_order;
}

void hub_unclaim(Hub *h, int shard)
{
    if (shard < 0 || shard >= h->n)
        return;
    pthread_mutex_lock(&h->lock);
    h->shard[shard].claimed_upto = h->shard[shard].scanned_upto;
    pthread_mutex_unlock(&h->lock);
}

bool hub_claimed(Hub *h, int shard, int64_t seq)
{
    pthread_mutex_lock(&h->lock);
    const HubShard *hs = &h->shard[shard];
    bool covered = seq <= hs->scanned_upto || seq <= hs->claimed_upto;
    pthread_mutex_unlock(&h->lock);
    return covered;
}

void hub_scanned(Hub *h, int shard, int64_t seq)
{
    pthread_mutex_lock(&h->lock);
    if (seq > h->shard[shard].scanned_upto)
        h->shard[shard].scanned_upto = seq;
    pthread_mutex_unlock(&h->lock);
}

int64_t hub_scanned_upto(Hub *h, int shard)
{
    pthread_mutex_lock(&h->lock);
    int64_t v = h->shard[shard].scanned_upto;
    pthread_mutex_unlock(&h->lock);
    return v;
}

void hub_tick(Hub *h, int64_t now)
{
    pthread_mutex_lock(&h->lock);
    size_t n = 0;
    struct MHD_Connection **wake = xcalloc((size_t)h->nsubs + 1, sizeof *wake);
    for (Sub *s = h->subs; s; s = s->next) {
        if (!s->suspended || s->catching_up)
            continue;
        bool keepalive = now - s->last_write_ms >= h->keepalive_ms;
        bool retry = s->retry_at_ms && now >= s->retry_at_ms;
        if (keepalive || retry) {
            s->keepalive_due = s->keepalive_due || keepalive;
            s->suspended = false;
            wake[n++] = s->conn;
        }
    }
    unlock_then_wake(h, wake, n, TAKE_DUE, 0, NULL, now);
}

int64_t hub_next_deadline(Hub *h)
{
    int64_t next = INT64_MAX;
    pthread_mutex_lock(&h->lock);
    for (const Waiter *w = h->waiters; w; w = w->next)
        if (w->deadline < next)
            next = w->deadline;
    pthread_mutex_unlock(&h->lock);
    return next;
}

/* ---- subscribers ---- */

static void catch_up(ViewDbs *db, void *arg);

/* Index of the first entry of shard k's ring with seq > cursor (len if
 * none). */
static size_t ring_after(const Hub *h, int k, int64_t cursor)
{
    size_t lo = 0, hi = h->shard[k].len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (entry_at(h, k, mid)->seq <= cursor)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool follows(const Sub *s, int k)
{
    return s->only < 0 || s->only == k;
}

/* Appends an event's frame to s->out behind its id: the subscriber's cursor
 * once it has this event, seq of shard k (the seq itself in a cluster of one
 * shard). */
static void put_event(Hub *h, Sub *s, int k, int64_t seq, const char *frame, size_t len)
{
    char id[CURSOR_TEXT_MAX];
    Cursor after = s->cursor;
    cursor_advance(&after, k, seq);
    cursor_format(&after, id, sizeof id);
    sbuf_printf(&s->out, "id: %s\n", id);
    sbuf_append(&s->out, frame, len);
    atomic_fetch_add(&h->metrics->sse_events_sent, 1);
}

/* Moves what the subscriber may send next into s->out (hub locked): the
 * rings' events past its cursor, the shards merged by arrival. Returns true
 * if a catch-up read from the table must be started (a shard it follows has
 * dropped events it has not had). */
static bool fill(Hub *h, Sub *s)
{
    size_t at[SHARDS_MAX];
    for (int k = 0; k < h->n; k++) {
        if (!follows(s, k))
            continue;
        if (s->cursor.seq[k] < h->shard[k].covered_from)
            return true;
        at[k] = ring_after(h, k, s->cursor.seq[k]);
    }
    size_t budget = (size_t)h->buffer_bytes;
    for (;;) {
        int pick = -1;
        for (int k = 0; k < h->n; k++)
            if (follows(s, k) && at[k] < h->shard[k].len &&
                (pick < 0 || entry_at(h, k, at[k])->arrival < entry_at(h, pick, at[pick])->arrival))
                pick = k;
        if (pick < 0)
            break;
        const Entry *e = entry_at(h, pick, at[pick]);
        if (wants(s, e->work_id, e->queue, e->progress)) {
            if (s->out.len && s->out.len + e->len > budget)
                break; /* the rest when this is sent */
            put_event(h, s, pick, e->seq, e->frame, e->len);
            s->ended = s->until_end && e->ends;
        }
        s->cursor.seq[pick] = e->seq;
        at[pick]++;
        if (s->ended)
            return false;
    }
    /* A shard whose ring it has read to the end: nothing more of it up to
     * what the hub has scanned. */
    for (int k = 0; k < h->n; k++)
        if (follows(s, k) && at[k] == h->shard[k].len)
            cursor_advance(&s->cursor, k, h->shard[k].scanned_upto);
    if (s->keepalive_due && s->out.len == 0)
        sbuf_puts(&s->out, ": keep-alive\n\n");
    s->keepalive_due = false;
    return false;
}

static ssize_t sub_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    Sub *s = cls;
    Hub *h = s->hub;
    bool start_catch_up = false;
    pthread_mutex_lock(&h->lock);
    if (s->out_pos == s->out.len) {
        /* Sent: a buffer grown past the budget by one large event goes back. */
        if (s->out.cap > 2 * (size_t)h->buffer_bytes)
            sbuf_free(&s->out);
        else
            sbuf_reset(&s->out);
        s->out_pos = 0;
        if (h->stopping || s->ended) {
            pthread_mutex_unlock(&h->lock);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        int64_t now = mono_ms();
        if (!s->catching_up && (!s->retry_at_ms || now >= s->retry_at_ms)) {
            s->retry_at_ms = 0;
            start_catch_up = fill(h, s);
            if (start_catch_up)
                s->catching_up = true;
        }
    }
    size_t avail = s->out.len - s->out_pos;
    if (avail == 0) {
        s->suspended = true;
        http_suspend_stream(s->conn);
        pthread_mutex_unlock(&h->lock);
        if (start_catch_up)
            dbpool_submit(h->pool, catch_up, s);
        return 0;
    }
    size_t n = avail < max ? avail : max;
    memcpy(buf, s->out.data + s->out_pos, n);
    s->out_pos += n;
    s->last_write_ms = mono_ms();
    pthread_mutex_unlock(&h->lock);
    return (ssize_t)n;
}

/* Reads a page of finished events after the subscriber's cursor from the
 * table, of each shard it follows whose ring has dropped what it has not had
 * (read-pool thread; each shard from its database), then wakes the
 * subscriber. The pages are merged by the events' time: roughly
 * chronological, exactly in order within a shard. A shard whose database
 * cannot be read is tried again a second later; the others go on. */
static void catch_up(ViewDbs *db, void *arg)
{
    Sub *s = arg;
    Hub *h = s->hub;
    pthread_mutex_lock(&h->lock);
    Cursor cursor = s->cursor, covered = s->cursor;
    for (int k = 0; k < h->n; k++)
        covered.seq[k] = h->shard[k].covered_from;
    int only = s->only;
    pthread_mutex_unlock(&h->lock);
    ResultList rows[SHARDS_MAX] = {{0}};
    bool at_end[SHARDS_MAX] = {0}, read[SHARDS_MAX] = {0};
    Err err = {0};
    bool failed = false, lookup_failed = false;
    /* work_id and progress are the subscriber's own, never changed after it
     * was made: read without the lock. A work's events are all in its
     * shard's log: which one, the table says (none yet: nothing to read). */
    if (s->work_id && only == SUB_UNKNOWN) {
        int shard = -1;
        lookup_failed = failed = view_work_shard(db, s->work_id, &shard, &err) != 0;
        if (!failed && shard >= 0 && shard < h->n)
            only = shard;
    }
    int behind = 0;
    for (int k = 0; k < h->n; k++)
        behind += (only < 0 || only == k) && cursor.seq[k] < covered.seq[k];
    for (int k = 0; k < h->n && !lookup_failed; k++) {
        if (!((only < 0 || only == k) && cursor.seq[k] < covered.seq[k]))
            continue;
        if (s->work_id && only == SUB_UNKNOWN) {
            read[k] = at_end[k] = true; /* no such work as of the read */
            continue;
        }
        Err e = {0};
        PGconn *c = view_shard_db(db, k, &e);
        if (!c || view_finished_after(c, k, cursor.seq[k], CATCHUP_PAGE,
                                      h->buffer_bytes / (behind ? behind : 1), s->progress,
                                      s->work_id, &rows[k], &at_end[k], &e) < 0) {
            view_results_clear(&rows[k]);
            if (c && !failed) /* a session that went away says so when it is replaced */
                err = e;
            failed = true;
            continue;
        }
        read[k] = true;
    }
    pthread_mutex_lock(&h->lock);
    if (failed) {
        if (err.status)
            log_warn("results stream catch-up failed, retrying: %s", err.msg);
        s->retry_at_ms = mono_ms() + 1000;
    }
    if (!lookup_failed) {
        s->only = only;
        size_t at[SHARDS_MAX] = {0};
        for (;;) {
            int pick = -1;
            for (int k = 0; k < h->n; k++)
                if (at[k] < rows[k].len &&
                    (pick < 0 || rows[k].items[at[k]].at < rows[pick].items[at[pick]].at))
                    pick = k;
            if (pick < 0)
                break;
            const ResultEvent *ev = &rows[pick].items[at[pick]++];
            if (wants(s, ev->work_id, ev->queue, ev->type == EV_PROGRESS)) {
                put_event(h, s, pick, ev->seq, ev->frame, ev->frame_len);
                s->ended = s->until_end && ends_work(ev);
            }
            s->cursor.seq[pick] = ev->seq;
            if (s->ended)
                break;
        }
        /* A last page saw every finished event committed before it started,
         * including all that the ring had already dropped. */
        for (int k = 0; k < h->n; k++)
            if (read[k] && at_end[k] && at[k] == rows[k].len)
                cursor_advance(&s->cursor, k, covered.seq[k]);
    }
    for (int k = 0; k < h->n; k++)
        view_results_clear(&rows[k]);
    s->catching_up = false;
    bool wake = s->suspended;
    s->suspended = false;
    pthread_mutex_unlock(&h->lock);
    if (wake)
        MHD_resume_connection(s->conn);
}

static void sub_free(void *cls)
{
    Sub *s = cls;
    Hub *h = s->hub;
    pthread_mutex_lock(&h->lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        h->subs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    h->nsubs--;
    atomic_fetch_sub(&h->metrics->sse_subscribers, 1);
    pthread_mutex_unlock(&h->lock);
    sbuf_free(&s->out);
    free(s->work_id);
    free(s->queue);
    free(s);
}

struct MHD_Response *hub_subscribe(Hub *h, struct MHD_Connection *conn, const Cursor *after,
                                   const char *work_id, const char *queue, bool progress,
                                   bool until_end, Err *err)
{
    pthread_mutex_lock(&h->lock);
    if (h->nsubs >= h->max_subs || h->stopping) {
        pthread_mutex_unlock(&h->lock);
        err_set(err, 503, "too-many-subscribers",
                "this node serves its limit of %lld result streams; try another node or later",
                (long long)h->max_subs);
        return NULL;
    }
    Sub *s = xcalloc(1, sizeof *s);
    s->hub = h;
    s->conn = conn;
    s->work_id = xstrdup(work_id);
    s->queue = xstrdup(queue);
    s->progress = progress;
    s->until_end = until_end && work_id;
    s->only = !work_id ? SUB_ALL : h->n == 1 ? 0 : SUB_UNKNOWN;
    cursor_zero(&s->cursor, h->n);
    for (int k = 0; k < h->n; k++)
        s->cursor.seq[k] = after ? after->seq[k] : h->shard[k].scanned_upto;
    sbuf_init(&s->out);
    /* The first bytes tell proxies and clients the stream is open, and where it
     * starts: its id becomes the client's Last-Event-ID, so a client that
     * reconnects before any result resumes from here, without a gap. A block
     * with an id and no data is dispatched by browsers but dropped, id and
     * all, by some clients (npm's eventsource 2): a "ready" event with data
     * is honoured by every client, and ignored by handlers of results. */
    char id[CURSOR_TEXT_MAX];
    cursor_format(&s->cursor, id, sizeof id);
    /* "after" is the id: a number in a cluster of one shard, else a string. */
    sbuf_printf(&s->out,
                ": workd results stream\nretry: 1000\nid: %s\nevent: ready\ndata: "
                "{\"after\":%s%s%s}\n\n",
                id, h->n > 1 ? "\"" : "", id, h->n > 1 ? "\"" : "");
    s->last_write_ms = mono_ms();
    s->next = h->subs;
    if (h->subs)
        h->subs->prev = s;
    h->subs = s;
    h->nsubs++;
    atomic_fetch_add(&h->metrics->sse_subscribers, 1);
    pthread_mutex_unlock(&h->lock);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sub_read, s, sub_free);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return r;
}

/* ---- waiters ---- */

void hub_wait(Hub *h, int shard, const char *work_id, int64_t after_seq, int64_t deadline_ms,
              void (*fn)(void *arg), void *arg)
{
    if (shard < 0 || shard >= h->n)
        shard = 0; /* not a shard of this cluster: cannot happen */
    pthread_mutex_lock(&h->lock);
    bool now = h->stopping;
    for (size_t i = ring_after(h, shard, after_seq); i < h->shard[shard].len && !now; i++) {
        const Entry *e = entry_at(h, shard, i);
        now = !e->progress && !strcmp(e->work_id, work_id);
    }
    if (!now) {
        Waiter *w = xcalloc(1, sizeof *w);
        w->shard = shard;
        w->work_id = xstrdup(work_id);
        w->after_seq = after_seq;
        w->deadline = deadline_ms;
        w->fn = fn;
        w->arg = arg;
        w->next = h->waiters;
        h->waiters = w;
        atomic_fetch_add(&h->metrics->get_waits, 1);
    }
    pthread_mutex_unlock(&h->lock);
    if (now)
        fn(arg);
}
