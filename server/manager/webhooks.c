/* webhooks: see webhooks.h. w->lock guards the subscription list and every
 * field of a Sub; curl handles are touched by the webhooks thread only. A Sub
 * that leaves the list (deleted, or leadership lost) while a delivery is in
 * flight goes to the graveyard, which the thread empties. */
#include "webhooks.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "config.h"
#include "cursor.h"
#include "db.h"
#include "journal.h"
#include "log.h"
#include "util.h"
#include "view.h"
#include "whsig.h"

#define READ_PAGE 200             /* events per read from the table */
#define READ_BYTES (1 << 20)      /* ... and about this many bytes */
#define IDLE_POLL_MS 1000         /* the thread wakes at least this often */
#define CURSOR_SKIPPED 10000      /* a cursor moved by this many skipped events only: recorded */
#define RESPONSE_MAX 4096         /* bytes of a receiver's answer read at most (none kept) */
#define WEBHOOKS_DEADLINE_MS 5000 /* a statement's answer, waited for at most */

enum { K_COMPLETED = 1, K_DEAD = 2, K_CANCELLED = 4 };

typedef struct Sub {
    char *name;
    Subscription cfg; /* as recorded, secret included; its cursor unused (the fields below) */
    unsigned char key[WHSIG_KEY_MAX];
    size_t keylen;
    int kinds; /* cfg.kinds as K_* bits */
    bool paused, dead;
    unsigned gen;       /* bumped when the cursor is reset: older reads are dropped */
    Cursor cursor;      /* recorded */
    Cursor done;        /* every event up to here was delivered or skipped */
    Cursor read_upto;   /* every event up to here is in pending or was skipped */
    ResultList pending; /* matching events after done, each shard's oldest first, from
                           pending_at */
    size_t pending_at;
    Cursor flushed;
    int64_t flushed_ms;
    bool delivered_since_flush;
    /* the delivery in flight (thread only) */
    CURL *easy;
    struct curl_slist *hdrs;
    char *body;
    const NetPolicy *allow; /* the addresses it may connect to beside public ones */
    char refused[160];      /* why the last address tried was refused ("": none) */
    size_t resp_bytes;      /* of the answer, read and dropped */
    bool capped;            /* the answer went past RESPONSE_MAX: reading stopped */
    int fly_shard;
    int64_t fly_seq;
    /* failures */
    int failures;
    int64_t failing_since; /* wall ms of the first failure in a row, 0: none */
    int64_t next_try;      /* mono ms */
    char last_error[300];
    int64_t last_error_at, last_delivered_at, delivered;
    bool pause_asked;
    struct Sub *next;
} Sub;

struct Webhooks {
    WebhooksConfig cfg;
    pthread_t thread;
    atomic_bool stopping;
    CURLM *multi;
    pthread_mutex_t lock;
    bool leading;
    /* Every shard's log's end: shard 0's as its manager committed it, the
     * others' as their NOTIFYs said (several shards only). */
    Cursor last;
    Sub *subs;
    Sub *graveyard;
    /* thread only, a session per database (dbs of them); closed while not
     * leading. With several shards each LISTENs for its shards' commits
     * while leading. */
    int dbs;
    PGconn *conn[SHARDS_MAX];
    bool db_down_logged[SHARDS_MAX];
};

/* The database that keeps shard k's events. */
static int db_of(const Webhooks *w, int k)
{
    return w->cfg.stores ? w->cfg.stores->of[k] : 0;
}

static void sessions_close(Webhooks *w)
{
    for (int db = 0; db < w->dbs; db++) {
        PQfinish(w->conn[db]);
        w->conn[db] = NULL;
    }
}

/* c, as a place of the cluster's shards (zero beyond its own). */
static Cursor fit(const Webhooks *w, const Cursor *c)
{
    Cursor out;
    cursor_zero(&out, w->cfg.shards);
    for (int k = 0; k < c->n && k < out.n; k++)
        out.seq[k] = c->seq[k];
    return out;
}

static bool same_place(const Cursor *a, const Cursor *b)
{
    return cursor_le(a, b) && cursor_le(b, a);
}

/* Events of every shard from a to b (0 where b is not ahead). */
static int64_t distance(const Cursor *a, const Cursor *b)
{
    int64_t d = 0;
    for (int k = 0; k < b->n; k++) {
        int64_t x = k < a->n ? a->seq[k] : 0;
        if (b->seq[k] > x)
            d += b->seq[k] - x;
    }
    return d;
}

/* "seq 812" for shard 0's events, "shard 2 seq 77" for the others'. */
static void event_label(int shard, int64_t seq, char *out, size_t len)
{
    if (shard == 0)
        snprintf(out, len, "seq %lld", (long long)seq);
    else
        snprintf(out, len, "shard %d seq %lld", shard, (long long)seq);
}

/* ---- subscriptions (w->lock held) ---- */

static int kinds_of(char *const *kinds)
{
    int k = 0;
    for (size_t i = 0; kinds && kinds[i]; i++)
        k |= !strcmp(kinds[i], "completed")   ? K_COMPLETED
             : !strcmp(kinds[i], "dead")      ? K_DEAD
             : !strcmp(kinds[i], "cancelled") ? K_CANCELLED
                                              : 0;
    return k;
}

/* Takes the settings of set (moved: set is left empty); without a secret,
 * s keeps its own. */
static void sub_configure(Sub *s, Subscription *set)
{
    if (!set->secret) {
        set->secret = s->cfg.secret;
        s->cfg.secret = NULL;
    }
    if (!set->kinds)
        set->kinds = xcalloc(1, sizeof *set->kinds);
    subscription_clear(&s->cfg);
    s->cfg = *set;
    memset(set, 0, sizeof *set);
    if (whsig_key(s->cfg.secret, s->key, &s->keylen) != 0)
        s->keylen = 0; /* the API checks secrets: a bad one here is a bug; deliveries fail */
    s->kinds = kinds_of(s->cfg.kinds);
    s->paused = s->cfg.paused;
}

static size_t pending_count(const Sub *s)
{
    return s->pending.len - s->pending_at;
}

/* The oldest pending event, NULL if none. */
static const ResultEvent *pending_first(const Sub *s)
{
    return pending_count(s) ? &s->pending.items[s->pending_at] : NULL;
}

static void pending_clear(Sub *s)
{
    view_results_clear(&s->pending);
    s->pending_at = 0;
}

static void pending_drop_first(Sub *s)
{
    view_result_clear(&s->pending.items[s->pending_at++]);
    if (s->pending_at == s->pending.len)
        pending_clear(s);
}

/* done, from what was read and what is still to deliver: each shard's
 * oldest pending event (pending is in order per shard) is not done. */
static void sub_settle(Sub *s)
{
    s->done = s->read_upto;
    for (size_t i = s->pending_at; i < s->pending.len; i++) {
        const ResultEvent *ev = &s->pending.items[i];
        if (ev->shard < s->done.n && ev->seq - 1 < s->done.seq[ev->shard])
            s->done.seq[ev->shard] = ev->seq - 1;
    }
}

static void sub_reset_cursor(const Webhooks *w, Sub *s, const Cursor *cursor)
{
    s->gen++;
    s->cursor = s->done = s->read_upto = s->flushed = fit(w, cursor);
    pending_clear(s);
}

/* A subscription of set's settings (moved, as sub_configure), delivering
 * after cursor (which may be set's own: read first). */
static Sub *sub_new(const Webhooks *w, Subscription *set, const Cursor *cursor)
{
    Cursor after = *cursor;
    Sub *s = xcalloc(1, sizeof *s);
    s->name = xstrdup(set->name);
    sub_configure(s, set);
    sub_reset_cursor(w, s, &after);
    s->flushed_ms = mono_ms();
    return s;
}

/* Frees s; its curl handle, if any, must be out of the multi handle already. */
static void sub_free(Sub *s)
{
    if (s->easy)
        curl_easy_cleanup(s->easy);
    curl_slist_free_all(s->hdrs);
    free(s->body);
    free(s->name);
    subscription_clear(&s->cfg);
    pending_clear(s);
    free(s);
}

static Sub *sub_find(Webhooks *w, const char *name)
{
    for (Sub *s = w->subs; s; s = s->next)
        if (!strcmp(s->name, name))
            return s;
    return NULL;
}

/* Unlinks s: freed now, or by the thread once its delivery is out of flight. */
static void sub_bury(Webhooks *w, Sub *s)
{
    for (Sub **p = &w->subs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    if (s->easy) {
        s->dead = true;
        s->next = w->graveyard;
        w->graveyard = s;
    } else {
        sub_free(s);
    }
}

static void bury_all(Webhooks *w)
{
    while (w->subs)
        sub_bury(w, w->subs);
}

static void sub_add(Webhooks *w, Sub *s)
{
    Sub **p = &w->subs;
    while (*p && strcmp((*p)->name, s->name) < 0)
        p = &(*p)->next;
    s->next = *p;
    *p = s;
}

/* ---- the manager thread ---- */

void webhooks_lead(Webhooks *w, SubscriptionList *subs, const Cursor *last)
{
    pthread_mutex_lock(&w->lock);
    bury_all(w);
    w->leading = true;
    Cursor end = fit(w, last);
    for (int k = 0; k < end.n; k++) /* the thread may have heard of later ones */
        cursor_advance(&w->last, k, end.seq[k]);
    w->last.seq[0] = end.seq[0];
    for (size_t i = 0; i < subs->len; i++)
        sub_add(w, sub_new(w, &subs->items[i], &subs->items[i].cursor));
    pthread_mutex_unlock(&w->lock);
    view_subscriptions_free(subs);
    curl_multi_wakeup(w->multi);
}

void webhooks_unlead(Webhooks *w)
{
    pthread_mutex_lock(&w->lock);
    w->leading = false;
    bury_all(w);
    pthread_mutex_unlock(&w->lock);
    curl_multi_wakeup(w->multi);
}

void webhooks_committed(Webhooks *w, const EventList *events)
{
    if (!events->len)
        return;
    bool wake = false;
    pthread_mutex_lock(&w->lock);
    w->last.seq[0] = events->items[events->len - 1].seq;
    for (size_t i = 0; i < events->len; i++) {
        const Event *e = &events->items[i];
        if (event_is_final(e->type)) {
            wake = true;
            continue;
        }
        if (e->type != EV_SUBSCRIPTION && e->type != EV_SUB_CURSOR)
            continue;
        Sub *s = sub_find(w, e->sub->name);
        if (e->type == EV_SUB_CURSOR) {
            for (int k = 0; s && k < e->sub->cursor.n; k++)
                cursor_advance(&s->cursor, k, e->sub->cursor.seq[k]);
            continue;
        }
        wake = true;
        if (e->sub_deleted) {
            if (s)
                sub_bury(w, s);
            continue;
        }
        Subscription set;
        subscription_copy(&set, e->sub);
        if (!s) {
            sub_add(w, sub_new(w, &set, e->sub_reset ? &e->sub->cursor : &e->sub_start));
            continue;
        }
        sub_configure(s, &set);
        if (e->sub_reset)
            sub_reset_cursor(w, s, &e->sub->cursor);
        if (!e->sub->paused_reason) {
            /* An operator's change: a fresh start for the retries. */
            s->failures = 0;
            s->failing_since = 0;
            s->next_try = 0;
            s->pause_asked = false;
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (wake)
        curl_multi_wakeup(w->multi);
}

void webhooks_ends(Webhooks *w, Cursor *end)
{
    pthread_mutex_lock(&w->lock);
    for (int k = 0; k < end->n && k < w->last.n; k++)
        end->seq[k] = w->last.seq[k];
    pthread_mutex_unlock(&w->lock);
}

void webhooks_deliveries(Webhooks *w, SubscriptionViews *l)
{
    pthread_mutex_lock(&w->lock);
    l->last_seq = w->last;
    for (size_t i = 0; i < l->len; i++) {
        Deliveries *d = &l->items[i].deliveries;
        const Sub *s = sub_find(w, l->items[i].sub.name);
        *d = (Deliveries){.delivered_upto = l->items[i].sub.cursor};
        if (s) {
            int64_t wait = s->failures && !s->paused ? s->next_try - mono_ms() : 0;
            *d = (Deliveries){.delivered_upto = s->done,
                              .delivered = s->delivered,
                              .last_delivered_at = s->last_delivered_at,
                              .failures = s->failures,
                              .failing_since = s->failing_since,
                              .last_error_at = s->last_error_at,
                              .next_attempt_at = wait > 0 ? wall_ms() + wait : 0};
            snprintf(d->last_error, sizeof d->last_error, "%s", s->last_error);
        }
        d->lag = distance(&d->delivered_upto, &w->last);
    }
    pthread_mutex_unlock(&w->lock);
}

/* ---- the thread ---- */

/* A receiver's answer is read up to RESPONSE_MAX and dropped: its status is
 * the outcome. Past the cap the transfer stops (curl: CURLE_WRITE_ERROR). */
static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
    (void)data;
    Sub *s = ud;
    s->resp_bytes += size * n;
    if (s->resp_bytes > RESPONSE_MAX) {
        s->capped = true;
        return 0;
    }
    return size * n;
}

/* Creates the socket of a connection only to an address the policy allows:
 * the address is the one resolved for this attempt, so a name that resolves
 * inside is refused like a literal address. */
static curl_socket_t open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    Sub *s = ud;
    char why[160];
    if (purpose != CURLSOCKTYPE_IPCXN) {
        snprintf(s->refused, sizeof s->refused, "not a plain IP connection");
        return CURL_SOCKET_BAD;
    }
    if (!netpolicy_allows(s->allow, &a->addr, why, sizeof why)) {
        snprintf(s->refused, sizeof s->refused, "%s", why);
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

static bool wants(const Sub *s, const ResultEvent *ev)
{
    int k = ev->type == EV_COMPLETED   ? K_COMPLETED
            : ev->type == EV_DEAD      ? K_DEAD
            : ev->type == EV_CANCELLED ? K_CANCELLED
                                       : 0;
    if (!(s->kinds & k))
        return false;
    return !s->cfg.queues || strv_contains(s->cfg.queues, ev->queue);
}

/* The thread's session to database db is up (connected, and with several
 * shards LISTENing for its shards' commits, the ends it missed read again),
 * or NULL. */
static void session_up(Webhooks *w, int db)
{
    if (w->conn[db] && PQstatus(w->conn[db]) == CONNECTION_OK && !db_timed_out(w->conn[db]))
        return;
    PQfinish(w->conn[db]);
    Err err = {0};
    const char *url = w->cfg.stores ? w->cfg.stores->url[db] : w->cfg.database_url;
    w->conn[db] = db_connect(url, "webhooks", &err);
    /* One database that does not answer holds the deliveries of all. */
    db_set_deadline(w->conn[db], WEBHOOKS_DEADLINE_MS);
    Cursor end;
    cursor_zero(&end, w->cfg.shards);
    if (w->conn[db] && w->cfg.shards > 1) {
        /* LISTEN first: a commit after the reads below is heard. */
        int rc = db_command(w->conn[db], "LISTEN workd_events", "listening for commits", &err);
        for (int k = 1; rc == 0 && k < w->cfg.shards; k++)
            if (db_of(w, k) == db)
                rc = view_last_seq(w->conn[db], k, &end.seq[k], &err);
        if (rc != 0) {
            PQfinish(w->conn[db]);
            w->conn[db] = NULL;
        }
    }
    if (!w->conn[db] && !w->db_down_logged[db])
        log_warn("webhooks cannot reach the database%s, retrying: %s",
                 db ? " of a shard with a database of its own" : "", err.msg);
    w->db_down_logged[db] = !w->conn[db];
    if (!w->conn[db])
        return;
    pthread_mutex_lock(&w->lock);
    for (int k = 1; k < w->cfg.shards; k++)
        if (db_of(w, k) == db)
            cursor_advance(&w->last, k, end.seq[k]);
    pthread_mutex_unlock(&w->lock);
}

/* Takes the NOTIFYs of the other shards' commits that came (several shards
 * only), from every database. Returns whether one moved a shard's end. */
static bool hear(Webhooks *w)
{
    if (w->cfg.shards <= 1)
        return false;
    bool moved = false;
    for (int db = 0; db < w->dbs; db++) {
        if (!w->conn[db])
            continue;
        if (!PQconsumeInput(w->conn[db])) {
            PQfinish(w->conn[db]); /* connected again on the next round */
            w->conn[db] = NULL;
            continue;
        }
        PGnotify *n;
        pthread_mutex_lock(&w->lock);
        while ((n = PQnotifies(w->conn[db]))) {
            int k;
            int64_t seq;
            /* Shard 0's end is its manager's (webhooks_committed). */
            if (view_notify_parse(n->extra, w->cfg.shards, &k, &seq) && k > 0 &&
                db_of(w, k) == db && seq > w->last.seq[k]) {
                w->last.seq[k] = seq;
                moved = true;
            }
            PQfreemem(n);
        }
        pthread_mutex_unlock(&w->lock);
    }
    return moved;
}

/* Reads the next page of each shard's events for every subscription that
 * has delivered all it read, on the thread's session (w->lock not held
 * during reads), and merges them into its pending list: each shard's in
 * order, the shards' by time. */
static void read_pages(Webhooks *w)
{
    typedef struct Want {
        char *name;
        unsigned gen;
        Cursor after;
    } Want;
    Want want[WEBHOOKS_MAX];
    size_t n = 0;
    pthread_mutex_lock(&w->lock);
    bool leading = w->leading;
    pthread_mutex_unlock(&w->lock);
    if (!leading) { /* a standby holds no session for this */
        sessions_close(w);
        return;
    }
    if (w->cfg.shards > 1) { /* the other shards' ends come through the sessions */
        for (int db = 0; db < w->dbs; db++)
            session_up(w, db);
        hear(w);
    }
    pthread_mutex_lock(&w->lock);
    Cursor snap = w->last;
    int64_t now = mono_ms();
    for (Sub *s = w->subs; s && n < WEBHOOKS_MAX; s = s->next)
        if (!s->paused && pending_count(s) == 0 && !cursor_le(&snap, &s->read_upto) &&
            now >= s->next_try)
            want[n++] = (Want){xstrdup(s->name), s->gen, s->read_upto};
    pthread_mutex_unlock(&w->lock);
    if (!n)
        return;
    for (int db = 0; db < w->dbs; db++)
        session_up(w, db);
    for (size_t i = 0; i < n; i++) {
        ResultList rows[SHARDS_MAX];
        bool at_end[SHARDS_MAX], ok = true;
        memset(rows, 0, sizeof rows);
        for (int k = 0; k < snap.n; k++) {
            at_end[k] = false;
            PGconn *c = w->conn[db_of(w, k)];
            /* A shard whose database is down waits; the others go on. */
            if (!c || want[i].after.seq[k] >= snap.seq[k])
                continue;
            Err err = {0};
            if (view_finished_after(c, k, want[i].after.seq[k], READ_PAGE, READ_BYTES, false, NULL,
                                    &rows[k], &at_end[k], &err) < 0) {
                char at[48];
                event_label(k, want[i].after.seq[k], at, sizeof at);
                log_warn("webhooks: reading results after %s: %s", at, err.msg);
                ok = false;
            }
        }
        pthread_mutex_lock(&w->lock);
        Sub *s = sub_find(w, want[i].name);
        if (ok && s && s->gen == want[i].gen && same_place(&s->read_upto, &want[i].after)) {
            size_t at[SHARDS_MAX] = {0};
            for (;;) {
                int pick = -1;
                for (int k = 0; k < snap.n; k++)
                    if (at[k] < rows[k].len &&
                        (pick < 0 || rows[k].items[at[k]].at < rows[pick].items[at[pick]].at))
                        pick = k;
                if (pick < 0)
                    break;
                ResultEvent *ev = &rows[pick].items[at[pick]++];
                cursor_advance(&s->read_upto, pick, ev->seq);
                if (wants(s, ev)) { /* moved into pending */
                    *view_results_push(&s->pending) = *ev;
                    memset(ev, 0, sizeof *ev);
                }
            }
            for (int k = 0; k < snap.n; k++)
                if (at_end[k])
                    cursor_advance(&s->read_upto, k, snap.seq[k]);
            sub_settle(s);
        } else if (!ok && s) {
            s->next_try = mono_ms() + 1000;
        }
        pthread_mutex_unlock(&w->lock);
        for (int k = 0; k < snap.n; k++)
            view_results_clear(&rows[k]);
        free(want[i].name);
    }
}

static const char *kind_type(EventType t)
{
    return t == EV_COMPLETED ? "work.completed" : t == EV_DEAD ? "work.dead" : "work.cancelled";
}

/* Starts the delivery of s's oldest pending event (w->lock held): the
 * Standard Webhooks envelope around the event's JSON as /results sends it. */
static void start_delivery(Webhooks *w, Sub *s)
{
    const ResultEvent *ev = pending_first(s);
    int shard = ev->shard;
    int64_t seq = ev->seq;
    char at[40];
    time_format(ev->at, at, sizeof at);
    SBuf body;
    sbuf_init(&body);
    sbuf_printf(&body, "{\"type\":\"%s\",\"timestamp\":\"%s\",\"data\":", kind_type(ev->type), at);
    sbuf_append(&body, ev->frame + ev->data_off, ev->data_len);
    sbuf_puts(&body, "}");
    free(s->body);
    s->body = sbuf_steal(&body);
    char id[40], ts[24], sig[WHSIG_LEN], line[WHSIG_LEN + 32];
    /* Unique per event across the cluster; shard 0's as before shards. */
    if (shard == 0)
        snprintf(id, sizeof id, "msg_%lld", (long long)seq);
    else
        snprintf(id, sizeof id, "msg_%d_%lld", shard, (long long)seq);
    int64_t t = wall_ms() / 1000;
    snprintf(ts, sizeof ts, "%lld", (long long)t);
    if (whsig_sign(s->key, s->keylen, id, t, s->body, strlen(s->body), sig) != 0)
        snprintf(sig, sizeof sig, "v1,");
    curl_slist_free_all(s->hdrs);
    s->hdrs = NULL;
    s->hdrs = curl_slist_append(s->hdrs, "Content-Type: application/json");
    snprintf(line, sizeof line, "webhook-id: %s", id);
    s->hdrs = curl_slist_append(s->hdrs, line);
    snprintf(line, sizeof line, "webhook-timestamp: %s", ts);
    s->hdrs = curl_slist_append(s->hdrs, line);
    snprintf(line, sizeof line, "webhook-signature: %s", sig);
    s->hdrs = curl_slist_append(s->hdrs, line);
    s->hdrs = curl_slist_append(s->hdrs, "Expect:");
    s->resp_bytes = 0;
    s->capped = false;
    s->refused[0] = '\0';
    s->allow = w->cfg.allow;
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, s->cfg.url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, s->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(s->body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, s->hdrs);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "workd-webhooks");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)w->cfg.timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)w->cfg.timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    /* The address check must see the receiver's address: no proxy from the
     * environment may stand between. */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, s);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(e, CURLOPT_PRIVATE, s);
    s->easy = e;
    s->fly_shard = shard;
    s->fly_seq = seq;
    curl_multi_add_handle(w->multi, e);
}

typedef struct Action {
    char *name;
    Cursor cursor;
    char *reason; /* a pause */
} Action;

/* A delivery ended (w->lock held). Appends a pause to act when the
 * subscription has failed for --webhook-pause-after. */
static void on_done(Webhooks *w, Sub *s, CURLcode rc, Action *acts, size_t *nacts)
{
    long status = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(w->multi, s->easy);
    curl_easy_cleanup(s->easy);
    s->easy = NULL;
    if (s->dead)
        return;
    const ResultEvent *head = pending_first(s);
    bool same = head && head->shard == s->fly_shard && head->seq == s->fly_seq;
    /* An answer cut at RESPONSE_MAX still has its status. */
    bool answered = rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && s->capped);
    if (answered && status >= 200 && status < 300) {
        if (same)
            pending_drop_first(s);
        sub_settle(s);
        s->delivered++;
        s->last_delivered_at = wall_ms();
        s->delivered_since_flush = true;
        s->failures = 0;
        s->failing_since = 0;
        s->next_try = 0;
        return;
    }
    int64_t now = wall_ms();
    /* The status, or a short reason of workd's own or curl's generic words:
     * never the receiver's answer, whose bytes may be another service's. */
    char ev[48];
    event_label(s->fly_shard, s->fly_seq, ev, sizeof ev);
    if (answered && status)
        snprintf(s->last_error, sizeof s->last_error, "%s: HTTP %ld", ev, status);
    else if (s->refused[0])
        snprintf(s->last_error, sizeof s->last_error,
                 "%s: not connected: %s (internal addresses need --webhook-allow-networks)", ev,
                 s->refused);
    else
        snprintf(s->last_error, sizeof s->last_error, "%s: %s", ev, curl_easy_strerror(rc));
    s->last_error_at = now;
    if (!s->failing_since)
        s->failing_since = now;
    s->failures++;
    int64_t d = w->cfg.backoff_base_ms;
    for (int i = 1; i < s->failures && d < w->cfg.backoff_max_ms; i++)
        d *= 2;
    if (d > w->cfg.backoff_max_ms)
        d = w->cfg.backoff_max_ms;
    d = d / 2 + (int64_t)(rand_unit() * (double)(d / 2)); /* jitter: [d/2, d] */
    s->next_try = mono_ms() + d;
    if (now - s->failing_since >= w->cfg.pause_after_ms && !s->pause_asked) {
        s->pause_asked = true;
        char reason[400];
        snprintf(reason, sizeof reason, "failing since %lld ms ago (%d attempts); last error: %s",
                 (long long)(now - s->failing_since), s->failures, s->last_error);
        acts[*nacts] = (Action){.name = xstrdup(s->name), .reason = xstrdup(reason)};
        (*nacts)++;
    }
}

static void *webhooks_main(void *arg)
{
    Webhooks *w = arg;
    while (!atomic_load(&w->stopping)) {
        read_pages(w);
        Action acts[2 * WEBHOOKS_MAX];
        size_t nacts = 0;
        int64_t now = mono_ms(), wake = now + IDLE_POLL_MS;
        pthread_mutex_lock(&w->lock);
        /* The graveyard: deliveries of subscriptions that are gone. */
        while (w->graveyard) {
            Sub *s = w->graveyard;
            w->graveyard = s->next;
            curl_multi_remove_handle(w->multi, s->easy);
            sub_free(s);
        }
        for (Sub *s = w->subs; s; s = s->next) {
            if (s->paused || s->easy)
                continue;
            if (pending_count(s) && now >= s->next_try)
                start_delivery(w, s);
            else if (s->next_try > now && s->next_try < wake)
                wake = s->next_try;
            /* Record the cursor soon after deliveries, after skips only when
             * they are many: re-reading skipped events after a failover costs
             * a read, and recording a cursor is itself an event to skip. */
            if (!cursor_le(&s->done, &s->flushed) && nacts < WEBHOOKS_MAX &&
                ((s->delivered_since_flush && now - s->flushed_ms >= WEBHOOKS_CURSOR_MS) ||
                 distance(&s->flushed, &s->done) >= CURSOR_SKIPPED)) {
                acts[nacts++] = (Action){xstrdup(s->name), s->done, NULL};
                s->flushed = s->done;
                s->flushed_ms = now;
                s->delivered_since_flush = false;
            }
            if (s->delivered_since_flush && s->flushed_ms + WEBHOOKS_CURSOR_MS < wake)
                wake = s->flushed_ms + WEBHOOKS_CURSOR_MS;
        }
        pthread_mutex_unlock(&w->lock);
        int running = 0;
        curl_multi_perform(w->multi, &running);
        CURLMsg *msg;
        int left;
        pthread_mutex_lock(&w->lock);
        while ((msg = curl_multi_info_read(w->multi, &left)))
            if (msg->msg == CURLMSG_DONE) {
                Sub *s = NULL;
                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
                on_done(w, s, msg->data.result, acts, &nacts);
                if (s->dead) {
                    for (Sub **p = &w->graveyard; *p; p = &(*p)->next)
                        if (*p == s) {
                            *p = s->next;
                            break;
                        }
                    sub_free(s);
                }
                wake = mono_ms(); /* the next one at once */
            }
        pthread_mutex_unlock(&w->lock);
        for (size_t i = 0; i < nacts; i++) {
            if (acts[i].reason) {
                log_warn("webhook subscription %s paused: %s", acts[i].name, acts[i].reason);
                w->cfg.pause(w->cfg.ud, acts[i].name, acts[i].reason);
            } else {
                w->cfg.cursor(w->cfg.ud, acts[i].name, &acts[i].cursor);
            }
            free(acts[i].name);
            free(acts[i].reason);
        }
        int timeout = (int)(wake - mono_ms());
        if (timeout < 0 || hear(w)) /* heard during the reads: at once */
            timeout = 0;
        if (timeout > IDLE_POLL_MS)
            timeout = IDLE_POLL_MS;
        /* Another shard's commit wakes the thread through its session. */
        struct curl_waitfd dbs[SHARDS_MAX];
        unsigned listening = 0;
        for (int db = 0; w->cfg.shards > 1 && db < w->dbs; db++)
            if (w->conn[db] && PQsocket(w->conn[db]) >= 0)
                dbs[listening++] =
                    (struct curl_waitfd){.fd = PQsocket(w->conn[db]), .events = CURL_WAIT_POLLIN};
        curl_multi_poll(w->multi, listening ? dbs : NULL, listening, timeout, NULL);
    }
    return NULL;
}

/* ---- lifetime ---- */

Webhooks *webhooks_start(const WebhooksConfig *cfg, Err *err)
{
    Webhooks *w = xcalloc(1, sizeof *w);
    w->cfg = *cfg;
    w->cfg.database_url = xstrdup(cfg->database_url);
    if (w->cfg.shards < 1 || w->cfg.shards > SHARDS_MAX)
        w->cfg.shards = 1;
    w->dbs = cfg->stores ? cfg->stores->n : 1;
    cursor_zero(&w->last, w->cfg.shards);
    pthread_mutex_init(&w->lock, NULL);
    w->multi = curl_multi_init();
    if (!w->multi || pthread_create(&w->thread, NULL, webhooks_main, w) != 0) {
        if (w->multi)
            curl_multi_cleanup(w->multi);
        pthread_mutex_destroy(&w->lock);
        free((char *)w->cfg.database_url);
        free(w);
        err_set(err, 500, "internal", "cannot start the webhooks thread");
        return NULL;
    }
    return w;
}

void webhooks_stop(Webhooks *w)
{
    if (!w)
        return;
    atomic_store(&w->stopping, true);
    curl_multi_wakeup(w->multi);
    pthread_join(w->thread, NULL);
    pthread_mutex_lock(&w->lock);
    bury_all(w);
    while (w->graveyard) {
        Sub *s = w->graveyard;
        w->graveyard = s->next;
        curl_multi_remove_handle(w->multi, s->easy);
        sub_free(s);
    }
    pthread_mutex_unlock(&w->lock);
    curl_multi_cleanup(w->multi);
    sessions_close(w);
    pthread_mutex_destroy(&w->lock);
    free((char *)w->cfg.database_url);
    free(w);
}
