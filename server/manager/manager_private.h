/* The manager's private parts, shared by its files: manager.c (the actor:
 * mailbox, rounds, appends in flight, leadership), commands.c (what each
 * kind of command decides: the command table) and suspects.c (isolating what
 * the database refuses). Nothing outside server/manager includes this. */
#ifndef WORKD_MANAGER_PRIVATE_H
#define WORKD_MANAGER_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "election.h"
#include "hmap.h"
#include "journal.h"
#include "manager.h"
#include "progress.h"
#include "projection.h"
#include "webhooks.h"

/* An append sent (pipeline mode) and not yet answered, with what waits for it. */
typedef struct Flight {
    EventList batch;               /* its events, applied to the state */
    int part;                      /* the part it appends into */
    MgrCmd *done_head, *done_tail; /* replies to send once it (and those before) committed */
    struct timespec sent;
    int64_t *claims; /* the ids its round claimed (journal_claim), released once it committed */
    size_t n_claims;
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
    /* Placement (shards.c): whether to stand for leader now, and a request
     * to hand the shard over (step down) at the next round. */
    atomic_bool may_campaign, release_asked;
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
    /* Sessions to the cluster's other databases (cfg.stores), by database,
     * for the looks of ids there (lookup_known): opened when first needed. */
    JournalPeer peer[SHARDS_MAX];
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
    int64_t busy_from_us; /* when the flights out began (the first sent after none) */
    /* the stats window (ManagerStats.window_*): its start, and the figures then */
    int64_t window_us, window_busy_us, window_count, window_sum_us;
    int64_t window_buckets[HISTOGRAM_BUCKETS];
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
    /* Claims of new ids, with several shards (journal_claim): this round's,
     * and those whose appends committed (released at the next lookup or
     * health check); ids another shard's leader holds (key: the id). */
    int64_t *claims, *claims_free;
    size_t n_claims, n_claims_free;
    HMap busy;
    HMap squats; /* id -> Squat: a claim held by a session that is no leader, since when */
};

/* Collects ids that are not open (the database must say what they are). */
typedef struct IdList {
    char **ids;  /* borrowed, but for those also in made */
    bool *claim; /* ids[i] may be created this round: claimed first (several shards) */
    size_t n, cap;
    char **made; /* ids made for the lookup (a batch's callback), owned */
    size_t n_made;
} IdList;

#define SUSPECT_ISOLATE 2 /* refused appends after which a command is not tried again */

/* ---- manager.c: replies, the round's state, appends ---- */
void cmd_fail(MgrCmd *c, int status, const char *type, const char *msg);
void cmd_ok(MgrCmd *c, int status);
void queue_done(Manager *m, MgrCmd *c);
const KnownWork *known_get(const Manager *m, const KnownSet *known, const char *id);
bool id_taken(const Manager *m, const KnownSet *known, const char *id);
void step_down(Manager *m, const char *why);
void emit(Manager *m, EventList *tmp, int64_t now);
int settle(Manager *m) WARN_UNUSED;
void want_known(Manager *m, IdList *l, const char *id);
/* want_known for an id the round may create (a client's, or a reservation,
 * journal.h): claimed first in the cluster (several shards). */
void want_claimed(Manager *m, IdList *l, const char *id);
/* Whether id's claim is held elsewhere now: by another shard's leader, which
 * is creating it (the command waits for that commit: 503 id-busy, retried
 * by the node), or by a session that is no leader (id_squatted). */
bool id_busy(const Manager *m, const char *id);
/* Who holds id's claim when that is no leader of the cluster (a session of
 * some other role or program): nobody waits for it (503 id-locked, naming
 * it). NULL: not busy, or a leader's. Valid until the next round. */
const char *id_squatted(const Manager *m, const char *id);
/* want_known / want_claimed for an id made for the lookup: l owns it. */
void want_known_made(Manager *m, IdList *l, char *id);
void want_claimed_made(Manager *m, IdList *l, char *id);

/* ---- commands.c: the command table ---- */
/* Adds to ids what c needs looked up before its round decides; -1: stepped
 * down (a kind that reads the database itself). */
int cmd_lookup(Manager *m, MgrCmd *c, IdList *ids) WARN_UNUSED;
/* Whether c may have put events into its round's append. */
bool cmd_may_write(const MgrCmd *c);
/* Hands ready jobs to a pull, up to its max; returns how many (-1: the pull
 * is stale or its client gone). */
int fill_pull(Manager *m, MgrCmd *c, int64_t now) WARN_UNUSED;
int take_inbox(Manager *m, MgrCmd **mail) WARN_UNUSED;
/* Decides c by its kind and answers it (or parks it: a pull waiting for work). */
void handle(Manager *m, MgrCmd *c, const KnownSet *known, int64_t now);
/* What c's answer takes once its events are committed, just before it is
 * sent (a subscription's deliveries, known to the webhooks thread then). */
void cmd_landed(Manager *m, MgrCmd *c);
/* Frees the views and all they hold (NULL: nothing). */
void subscription_views_free(SubscriptionViews *v);

/* ---- suspects.c: what the database refused ---- */
void suspects_clear(Manager *m);
void cmd_key(const MgrCmd *c, char out[24]);
unsigned cmd_suspicion(const Manager *m, const MgrCmd *c);
void unsuspect(Manager *m, const char *key);
void suspects_note(Manager *m, const Flight *f, const char *why);
void suspects_cleared(Manager *m, const Flight *f);
bool tick_isolated(const Manager *m, const char *work_id);
bool take_suspect(Manager *m, MgrCmd **mail);

#endif
