/* fake_store: everything the manager reaches outside itself — the store's
 * writer (journal.h) and the one read it makes (view.h), the election, the
 * retention and webhooks threads — in memory, with faults a test sets
 * (fake_store.h). Linked in place of server/store and those modules, as
 * beanstalkd's tests swap falloc, so that test_manager runs the real
 * manager's rounds, pipeline and step-downs without a database. */
#include "fake_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "election.h"
#include "journal.h"
#include "retention.h"
#include "util.h"
#include "view.h"
#include "webhooks.h"

#define QUEUE_MAX 64

typedef struct Sent {
    EventList events; /* copies, replayed by a new leader once committed */
    FakeOutcome outcome;
} Sent;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int efd; /* readable while an outcome can be read, or the session ended */
    int session;
    bool lost, failed, hold, standby;
    Sent q[QUEUE_MAX];
    size_t head, len;
    FakeOutcome script[QUEUE_MAX];
    size_t n_script;
    EventList log; /* what was committed, in order, as the database keeps it (no secrets) */
    Subscription subs[SUBS_MAX]; /* workd_subscriptions: secrets included */
    size_t n_subs;
    int64_t term;
    FakeStats stats;
} F = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .efd = -1};

static PGconn *const SESSION = (PGconn *)&F; /* the manager only hands it back */

/* F.lock held: the socket is readable iff the manager has something to read. */
static void signal_socket(void)
{
    uint64_t v;
    while (read(F.efd, &v, sizeof v) > 0) {
    }
    if (F.lost || (F.len && !F.hold)) {
        v = 1;
        if (write(F.efd, &v, sizeof v) < 0) {
        }
    }
}

void fake_reset(void)
{
    pthread_mutex_lock(&F.lock);
    if (F.efd < 0)
        F.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    for (size_t i = 0; i < F.len; i++)
        eventlist_free(&F.q[(F.head + i) % QUEUE_MAX].events);
    F.head = F.len = F.n_script = 0;
    F.lost = F.failed = F.hold = F.standby = false;
    eventlist_free(&F.log);
    eventlist_init(&F.log);
    for (size_t i = 0; i < F.n_subs; i++)
        subscription_clear(&F.subs[i]);
    F.n_subs = 0;
    F.term = 0;
    memset(&F.stats, 0, sizeof F.stats);
    signal_socket();
    pthread_mutex_unlock(&F.lock);
}

void fake_script(const FakeOutcome *outcomes, size_t n)
{
    pthread_mutex_lock(&F.lock);
    memcpy(F.script, outcomes, n * sizeof *outcomes);
    F.n_script = n;
    pthread_mutex_unlock(&F.lock);
}

void fake_hold(bool hold)
{
    pthread_mutex_lock(&F.lock);
    F.hold = hold;
    signal_socket();
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

void fake_standby(bool standby)
{
    pthread_mutex_lock(&F.lock);
    F.standby = standby;
    pthread_mutex_unlock(&F.lock);
}

size_t fake_appends_out(void)
{
    pthread_mutex_lock(&F.lock);
    size_t n = F.len;
    pthread_mutex_unlock(&F.lock);
    return n;
}

FakeStats fake_stats(void)
{
    pthread_mutex_lock(&F.lock);
    FakeStats s = F.stats;
    pthread_mutex_unlock(&F.lock);
    return s;
}

bool fake_committed(EventType type, const char *work_id)
{
    pthread_mutex_lock(&F.lock);
    bool found = false;
    for (size_t i = 0; i < F.log.len && !found; i++)
        found = F.log.items[i].type == type && F.log.items[i].work_id &&
                !strcmp(F.log.items[i].work_id, work_id);
    pthread_mutex_unlock(&F.lock);
    return found;
}

/* F.lock held: the row of name in workd_subscriptions, NULL if none. */
static Subscription *sub_row(const char *name)
{
    for (size_t i = 0; i < F.n_subs; i++)
        if (!strcmp(F.subs[i].name, name))
            return &F.subs[i];
    return NULL;
}

bool fake_subscription_is(const char *name, const char *secret, bool paused)
{
    pthread_mutex_lock(&F.lock);
    const Subscription *x = sub_row(name);
    bool is = x && x->secret && !strcmp(x->secret, secret) && x->paused == paused;
    pthread_mutex_unlock(&F.lock);
    return is;
}

/* F.lock held: what migration 0013's trigger (as 0016 and 0018 keep it) does
 * with a subscription event: workd_subscriptions takes all of it, the secret
 * as the event has it, and the log keeps the event without its secret. */
static void fold_subscription(Event *e)
{
    Subscription *x = e->sub ? sub_row(e->sub->name) : NULL;
    if (e->type == EV_SUB_CURSOR) {
        for (int k = 0; x && k < e->sub->cursor.n; k++)
            cursor_advance(&x->cursor, k, e->sub->cursor.seq[k]);
        return;
    }
    if (e->type != EV_SUBSCRIPTION)
        return;
    if (e->sub_deleted) {
        if (x) {
            subscription_clear(x);
            *x = F.subs[--F.n_subs];
        }
        return;
    }
    Cursor cursor = e->sub_reset ? e->sub->cursor : x ? x->cursor : e->sub_start;
    if (x)
        subscription_clear(x);
    else
        x = &F.subs[F.n_subs++];
    subscription_copy(x, e->sub);
    x->cursor = cursor;
    free(e->sub->secret);
    e->sub->secret = NULL;
}

/* ---- the election ---- */

ElectionResult election_try(Election *e, PGconn **conn)
{
    (void)e;
    pthread_mutex_lock(&F.lock);
    ElectionResult r = F.standby ? ELECTION_LOST : ELECTION_WON;
    if (r == ELECTION_WON) {
        F.session++;
        F.lost = F.failed = false;
        for (size_t i = 0; i < F.len; i++)
            eventlist_free(&F.q[(F.head + i) % QUEUE_MAX].events);
        F.head = F.len = 0;
        signal_socket();
        *conn = SESSION;
    }
    pthread_mutex_unlock(&F.lock);
    return r;
}

/* ---- journal.h: recovery ---- */

int journal_prepare(PGconn *c, bool notify_apart, Err *err)
{
    (void)notify_apart;
    (void)c;
    (void)err;
    return 0;
}

int journal_recover(PGconn *c, int shard, int n_shards, WorkState *ws, int64_t now,
                    int64_t *last_seq, int64_t *last_term, int *part, Err *err)
{
    (void)shard;
    (void)n_shards;
    (void)c;
    (void)err;
    pthread_mutex_lock(&F.lock);
    for (size_t i = 0; i < F.log.len; i++)
        ws_apply(ws, &F.log.items[i]);
    *last_seq = F.log.len ? F.log.items[F.log.len - 1].seq : 0;
    *last_term = F.term;
    pthread_mutex_unlock(&F.lock);
    ws_advance(ws, now);
    *part = 1;
    return 0;
}

int journal_parts(PGconn *c, PartList *out, Err *err)
{
    (void)c;
    (void)err;
    out->n = 1;
    out->items[0] = (Part){.part = 1, .starts_at = 0, .ends_at = INT64_MAX};
    return 0;
}

/* ---- journal.h: the append ---- */

int journal_append_send(PGconn *c, int shard, int part, const EventList *events,
                        ProjRow *const *rows, size_t nrows, const int64_t *inbox, size_t n_inbox,
                        const AppendAfter *after, Err *err)
{
    (void)c;
    (void)part;
    (void)rows;
    (void)nrows;
    (void)inbox;
    (void)n_inbox;
    (void)after;
    (void)err;
    pthread_mutex_lock(&F.lock);
    Sent *s = &F.q[(F.head + F.len++) % QUEUE_MAX];
    eventlist_init(&s->events);
    for (size_t i = 0; i < events->len; i++)
        event_copy(eventlist_push(&s->events), &events->items[i]);
    s->outcome = FAKE_OK;
    if (F.n_script) {
        s->outcome = F.script[0];
        memmove(F.script, F.script + 1, --F.n_script * sizeof *F.script);
    }
    F.stats.sent++;
    signal_socket();
    pthread_mutex_unlock(&F.lock);
    return 0;
}

bool journal_busy(PGconn *c)
{
    (void)c;
    pthread_mutex_lock(&F.lock);
    bool busy = F.len && F.hold && !F.lost;
    pthread_mutex_unlock(&F.lock);
    return busy;
}

/* The outcome of the oldest append out: as scripted; an append behind a
 * failed one writes nothing (the real append's guard), and a lost session
 * answers nothing more. */
int journal_append_recv(PGconn *c, size_t n_events, Err *err)
{
    (void)c;
    (void)n_events;
    pthread_mutex_lock(&F.lock);
    while (F.hold && !F.lost)
        pthread_cond_wait(&F.cond, &F.lock);
    int rc = 0;
    if (!F.len || F.lost) {
        rc = err_set(err, 503, "database-unavailable", "fake: the session is gone");
    } else {
        Sent *s = &F.q[F.head];
        F.head = (F.head + 1) % QUEUE_MAX;
        F.len--;
        if (F.failed) {
            rc = err_set(err, 409, "fenced", "fake: the append before this one failed");
        } else if (s->outcome == FAKE_REFUSED) {
            F.failed = true;
            F.stats.refused++;
            rc = err_set(err, 500, "database-refused", "fake: the database refused the append");
        } else if (s->outcome == FAKE_LOST) {
            F.lost = true;
            rc = err_set(err, 503, "database-unavailable", "fake: the session was terminated");
        } else {
            for (size_t i = 0; i < s->events.len; i++) {
                Event *e = eventlist_push(&F.log);
                event_copy(e, &s->events.items[i]);
                if (e->type == EV_TERM)
                    F.term = e->new_term;
                fold_subscription(e);
            }
            F.stats.committed++;
        }
        eventlist_free(&s->events);
    }
    signal_socket();
    pthread_mutex_unlock(&F.lock);
    return rc;
}

int journal_pipeline_end(PGconn *c, Err *err)
{
    (void)c;
    (void)err;
    return 0;
}

/* ---- journal.h: the session ---- */

int journal_socket(PGconn *c)
{
    (void)c;
    return F.efd;
}

int journal_consume(PGconn *c, bool *inbox)
{
    (void)c;
    (void)inbox;
    pthread_mutex_lock(&F.lock);
    int rc = F.lost ? -1 : 0;
    uint64_t v;
    while (read(F.efd, &v, sizeof v) > 0) {
    }
    pthread_mutex_unlock(&F.lock);
    return rc;
}

int journal_listen(PGconn *c, Err *err)
{
    (void)c;
    (void)err;
    return 0;
}

/* One fake session: every claim is this one's (a cluster of one shard never
 * claims; these keep the link whole). */
int journal_claim(PGconn *c, char *const *ids, size_t n, int64_t *keys, bool *busy, Err *err)
{
    (void)c;
    (void)ids;
    (void)err;
    for (size_t i = 0; i < n; i++) {
        keys[i] = (int64_t)i + 1;
        busy[i] = false;
    }
    return 0;
}

int journal_claim_holders(PGconn *c, char *const *ids, size_t n, int *pid, char **foreign, Err *err)
{
    (void)c;
    (void)ids;
    (void)err;
    memset(foreign, 0, n * sizeof *foreign);
    memset(pid, 0, n * sizeof *pid);
    return 0;
}

int journal_release(PGconn *c, const int64_t *keys, size_t n, Err *err)
{
    (void)c;
    (void)keys;
    (void)n;
    (void)err;
    return 0;
}

int journal_ping(PGconn *c, Err *err)
{
    (void)c;
    pthread_mutex_lock(&F.lock);
    int rc = F.lost ? err_set(err, 503, "database-unavailable", "fake: the session is gone") : 0;
    pthread_mutex_unlock(&F.lock);
    return rc;
}

void journal_close(PGconn *c)
{
    (void)c;
    pthread_mutex_lock(&F.lock);
    F.stats.closed++;
    pthread_mutex_unlock(&F.lock);
}

/* ---- journal.h: what the leader looks up (nothing is in the fake's database
 * but the log, which the state already holds) ---- */

int journal_known(PGconn *c, char *const *ids, size_t n, KnownSet *out, Err *err)
{
    (void)c;
    (void)ids;
    (void)n;
    (void)err;
    memset(out, 0, sizeof *out);
    return 0;
}

void journal_known_free(KnownSet *k)
{
    (void)k;
}

/* The fake is one database: a manager never looks elsewhere. */
int journal_peer(JournalPeer *p, const char *url, Err *err)
{
    (void)p;
    (void)url;
    return err_set(err, 500, "internal", "fake: one database only");
}

void journal_peer_close(JournalPeer *p, bool failed)
{
    (void)p;
    (void)failed;
}

int journal_known_elsewhere(PGconn *c, char *const *ids, const bool *claim, size_t n, bool *busy,
                            KnownSet *out, Err *err)
{
    (void)c;
    (void)ids;
    (void)claim;
    (void)n;
    (void)busy;
    (void)out;
    return err_set(err, 500, "internal", "fake: one database only");
}

int journal_dead_matching(PGconn *c, int shard, const char *queue, const char *key, int limit,
                          KnownSet *out, Err *err)
{
    (void)shard;
    (void)queue;
    (void)key;
    (void)limit;
    return journal_known(c, NULL, 0, out, err);
}

int journal_inbox_read(PGconn *c, int shard, int limit, InboxItem **out, size_t *n, Err *err)
{
    (void)shard;
    (void)c;
    (void)limit;
    (void)err;
    *out = NULL;
    *n = 0;
    return 0;
}

int journal_inbox_forget(PGconn *c, int shard, const int64_t *inbox, size_t n, Err *err)
{
    (void)shard;
    (void)c;
    (void)inbox;
    (void)n;
    (void)err;
    return 0;
}

int journal_publish_budgets(PGconn *c, int64_t payload_bytes, int json_depth, Err *err)
{
    (void)c;
    (void)payload_bytes;
    (void)json_depth;
    (void)err;
    return 0;
}

SubscriptionList *view_subscriptions(PGconn *c, int shards, Err *err)
{
    (void)c;
    (void)shards;
    (void)err;
    SubscriptionList *l = xcalloc(1, sizeof *l);
    pthread_mutex_lock(&F.lock);
    l->items = xcalloc(F.n_subs + 1, sizeof *l->items);
    for (size_t i = 0; i < F.n_subs; i++)
        subscription_copy(&l->items[l->len++], &F.subs[i]);
    pthread_mutex_unlock(&F.lock);
    return l;
}

void view_subscriptions_free(SubscriptionList *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->len; i++)
        subscription_clear(&l->items[i]);
    free(l->items);
    free(l);
}

/* The fake holds one shard's log. */
int view_last_seq(PGconn *c, int shard, int64_t *seq, Err *err)
{
    (void)c;
    (void)err;
    pthread_mutex_lock(&F.lock);
    *seq = shard == 0 && F.log.len ? F.log.items[F.log.len - 1].seq : 0;
    pthread_mutex_unlock(&F.lock);
    return 0;
}

/* ---- the leader's other threads: not started ---- */

static char dummy;

int64_t retention_span(int64_t retain_ms)
{
    return retain_ms;
}

Retention *retention_start(const RetentionConfig *cfg, Err *err)
{
    (void)cfg;
    (void)err;
    return (Retention *)&dummy;
}

void retention_stop(Retention *r)
{
    (void)r;
}

const RetentionStats *retention_stats(const Retention *r)
{
    (void)r;
    static const RetentionStats none;
    return &none;
}

Webhooks *webhooks_start(const WebhooksConfig *cfg, Err *err)
{
    (void)cfg;
    (void)err;
    return (Webhooks *)&dummy;
}

void webhooks_stop(Webhooks *w)
{
    (void)w;
}

void webhooks_lead(Webhooks *w, SubscriptionList *subs, const Cursor *last)
{
    (void)w;
    (void)last;
    view_subscriptions_free(subs);
}

void webhooks_unlead(Webhooks *w)
{
    (void)w;
}

void webhooks_committed(Webhooks *w, const EventList *events)
{
    (void)w;
    (void)events;
}

void webhooks_ends(Webhooks *w, Cursor *end)
{
    (void)w;
    (void)end;
}

void webhooks_deliveries(Webhooks *w, SubscriptionViews *l)
{
    (void)w;
    cursor_zero(&l->last_seq, 1);
    for (size_t i = 0; i < l->len; i++)
        l->items[i].deliveries = (Deliveries){.delivered_upto = l->items[i].sub.cursor};
}
