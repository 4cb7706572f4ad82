/* journal: the store's writing face, the leader's log writer. The append (in
 * pipeline mode), the SQL inbox, recovery, the parts and the ids the leader
 * must look up, all through the one session that holds the leader lock.
 * What any node reads is view.h; adding and dropping parts (partitions) is
 * retention.c's. */
#ifndef WORKD_JOURNAL_H
#define WORKD_JOURNAL_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "event.h"
#include "projection.h"
#include "util.h" /* SYSTEM_ID_MARK */
#include "view.h" /* ACTIVITY_*: the append keeps workd_activity */
#include "workstate.h"

/* ---- writing (the leader, through the session holding the leader lock) ---- */

/* Prepares the append statements on the leader's session (once per session,
 * before the first append). notify_apart (a cluster of several shards): each
 * append's NOTIFY goes in a transaction of its own (NOTIFY_SQL in journal.c
 * says why). */
int journal_prepare(PGconn *c, bool notify_apart, Err *err) WARN_UNUSED;

/* The last event of the append sent before, while its outcome is unknown. */
typedef struct AppendAfter {
    int64_t seq;
    int part;
} AppendAfter;

/* Appends events (seq and term already set, in order) into shard `shard`'s
 * log in part `part` and writes the work rows they fold into (projection.h)
 * in one statement, which is one transaction, with its NOTIFY on channel
 * workd_events (journal_notify_payload; with several shards in a transaction
 * of its own right behind, that notifies only if the append committed): open
 * rows are inserted or updated in workd_open; work
 * that finished (completed, cancelled) leaves it for a workd_done row in the same part; the inbox
 * entries (n) the commit took into the log are deleted with it.
 *
 * Sent in pipeline mode without waiting (events non-empty; the rows and
 * events may be freed once this returns): journal_append_recv reads the
 * outcomes in the order the appends were sent, each after its own commit.
 * Until the pipeline is ended (journal_pipeline_end, once every outcome is
 * read) the session runs nothing else. An append sent while another is out
 * names that one's last event in *after: it writes nothing unless that event
 * is in the log, since a pipeline goes on with the statements after a failed
 * one, and this one was decided from the state that one left.
 * Fencing: nothing is written unless this session holds the leader lock;
 * either way journal_append_recv says "fenced" (409). */
int journal_append_send(PGconn *c, int shard, int part, const EventList *events,
                        ProjRow *const *rows, size_t nrows, const int64_t *inbox, size_t n_inbox,
                        const AppendAfter *after, Err *err) WARN_UNUSED;
/* The outcome of the oldest append out, of n_events events (blocks until it
 * has come; at once when PQisBusy says it has). An append the database
 * refused for what it holds (db_refused: it would fail again) has err->type
 * "database-refused". */
/* The payload of the NOTIFY workd_events an append sends: the last seq for
 * shard 0 ("812", as before shards), "<shard>:<seq>" for the others
 * (view_notify_parse reads it back). */
void journal_notify_payload(int shard, int64_t seq, char *out, size_t len);
int journal_append_recv(PGconn *c, size_t n_events, Err *err) WARN_UNUSED;
/* Leaves pipeline mode (every outcome read), so that other statements run. */
int journal_pipeline_end(PGconn *c, Err *err) WARN_UNUSED;

/* ---- the inbox: work submitted in SQL (workd.submit, migration 0005) ---- */
/* One submission waiting in workd_inbox; 0 in timeout_ms / max_attempts:
 * the server's default. Strings and payload are owned. */
typedef struct InboxItem {
    int64_t n; /* its place in the inbox */
    char *id, *queue;
    int priority;
    json_t *payload; /* NULL: the database holds one jansson cannot read (a number of
                        2^63 or more written before schema 12 refused it, or a
                        nesting deeper than jansson reads, before schema 16): why */
    char why[160];
    int64_t run_at, timeout_ms;
    int max_attempts;
    char *traceparent, *tracestate; /* as given to workd.submit, not checked yet; NULL: none */
} InboxItem;
/* The shard's oldest entries, at most limit (caller frees *out and its strings). */
int journal_inbox_read(PGconn *c, int shard, int limit, InboxItem **out, size_t *n,
                       Err *err) WARN_UNUSED;
/* Publishes the leader's budgets for workd.submit (workd_budgets): a
 * payload's bytes as JSON text, and a body's nesting. */
int journal_publish_budgets(PGconn *c, int64_t payload_bytes, int json_depth, Err *err) WARN_UNUSED;
/* Deletes entries taken into the log without an event of their own (an id
 * that exists already); the append deletes the others with their events.
 * Fenced like the append. */
int journal_inbox_forget(PGconn *c, int shard, const int64_t *inbox, size_t n,
                         Err *err) WARN_UNUSED;

/* ---- recovery ---- */

/* Rebuilds shard `shard` (of n_shards) into ws: its open work from workd_open, and the queues'
 * limits from workd_queues (as of now), and reads the last event's seq, term and part. Cost depends
 * on the open work only. */
int journal_recover(PGconn *c, int shard, int n_shards, WorkState *ws, int64_t now,
                    int64_t *last_seq, int64_t *last_term, int *last_part, Err *err) WARN_UNUSED;

/* The parts (workd_parts), oldest first. */
#define PARTS_MAX 256
typedef struct Part {
    int part;
    int64_t starts_at, ends_at; /* ms (part 0, made by the upgrade: from the epoch) */
    int64_t first_at;           /* ms of its first event; 0: nothing written into it yet */
} Part;
typedef struct PartList {
    Part items[PARTS_MAX];
    size_t n;
} PartList;
int journal_parts(PGconn *c, PartList *out, Err *err) WARN_UNUSED;

/* ---- reading (any node) ---- */

/* What the database holds about these ids (finished or not). Returns an array
 * of n_out KnownWork whose strings point into *res (keep res until done; then
 * journal_known_free). */
typedef struct KnownSet {
    PGresult *res;
    PGresult **more; /* the results of other databases' looks (journal_known_elsewhere) */
    size_t n_more;
    KnownWork *items;
    size_t n;
} KnownSet;
int journal_known(PGconn *c, char *const *ids, size_t n, KnownSet *out, Err *err) WARN_UNUSED;

/* ---- reservations: names from which ids are made, looked up as ids ---- */
/* A name from which workd makes ids is reserved in the whole cluster under
 * an id no client can choose (SYSTEM_ID_MARK): "B~callback" while batch B is
 * open (its callback's id, ws_callback_id), "S~schedule" while schedule S
 * exists (its ticks' ids are "S~<time>"). journal_known answers for each a
 * row of status "reserved" (RESERVED) whose shard holds the name. Claimed as
 * new ids are (journal_claim), two shards cannot take one name at once, so
 * every id made from it is made by one shard alone. RESERVE_SCHEDULES
 * answers one row per database whose attempts is the count of its
 * schedules: claimed by every new schedule, so that schedules are made one
 * at a time in the cluster and its limit holds. */
#define RESERVED "reserved"
#define RESERVE_CALLBACK_SQL "~callback"
#define RESERVE_CALLBACK_LEN "9"
#define RESERVE_SCHEDULE_SQL "~schedule"
#define RESERVE_SCHEDULE_LEN "9"
#define RESERVE_SCHEDULES "~schedules"
_Static_assert(SYSTEM_ID_MARK == '~', "the reservations' SQL spells the mark");
_Static_assert(sizeof RESERVE_CALLBACK_SQL - 1 == 9 && sizeof RESERVE_SCHEDULE_SQL - 1 == 9,
               "the reservations' lengths");
/* The reservation of a schedule's name (RESERVE_SCHEDULE_SQL), in out. */
static inline void journal_schedule_reservation(const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s" RESERVE_SCHEDULE_SQL, name);
}

/* ---- claims of new ids (a cluster of several shards) ---- */
/* Two shards' leaders may take the same new id at once, and the database's
 * primary key would refuse the second append, after its leader had applied
 * it. So with several shards a leader claims the ids it may create before it
 * looks them up: a session advisory lock on each id's hash (keys[i]; 0 when
 * busy[i]: another session holds it), held until its append has committed.
 * A leader that finds one busy waits for the other's commit and looks again. */
int journal_claim(PGconn *c, char *const *ids, size_t n, int64_t *keys, bool *busy,
                  Err *err) WARN_UNUSED;
/* Who holds the claims of ids that journal_claim (or a look's) found busy:
 * pid[i] 0 and foreign[i] NULL when a workd leader's session holds it, or
 * nobody by now; else the holder's backend pid and a description of it
 * (pid, role, application; the caller frees it). Such a holder is another
 * leader's look at this database (for a moment) or a session that is no
 * part of workd; the caller tells them apart by how long it holds. */
int journal_claim_holders(PGconn *c, char *const *ids, size_t n, int *pid, char **foreign,
                          Err *err) WARN_UNUSED;
/* Releases claims of this session (their appends committed, or wrote nothing). */
int journal_release(PGconn *c, const int64_t *keys, size_t n, Err *err) WARN_UNUSED;
void journal_known_free(KnownSet *k);

/* ---- the cluster's other databases (shards with databases of their own, stores.h) ---- */
/* A leader looks ids up in every database of the cluster: its own session
 * (journal_known, journal_claim) and one to each other database. That one
 * is opened without holding the manager's rounds (a host that does not
 * answer must not stop the shard): a try waits at most JOURNAL_PEER_WAIT_MS
 * in the round that begins it (none when the last try failed), then goes
 * on in later rounds without waiting, and is given up after
 * JOURNAL_PEER_OPEN_MS; after a failure the next try begins
 * JOURNAL_PEER_RETRY_MS later. Owned by the manager thread. */
#define JOURNAL_PEER_WAIT_MS 100
/* Each statement of a look waits at most this long (db_set_deadline): a
 * frozen database costs the round that finds it so, once; then, as one
 * that cannot be reached, rounds go on without waiting for it. */
#define JOURNAL_PEER_DEADLINE_MS 500
#define JOURNAL_PEER_OPEN_MS 5000
#define JOURNAL_PEER_RETRY_MS 1000
typedef struct JournalPeer {
    PGconn *conn;               /* open; NULL: none */
    PGconn *opening;            /* being opened */
    bool write;                 /* what opening's socket waits for */
    int64_t until_ms, retry_ms; /* mono: give opening up; no new try before */
    bool down_logged;           /* the caller's: it said that it cannot be reached */
} JournalPeer;
/* p's session to url, open: 0 and p->conn, or -1 (503 database-unavailable:
 * not open yet, or it failed: err says which). */
int journal_peer(JournalPeer *p, const char *url, Err *err) WARN_UNUSED;
/* Closes p's sessions; a failure (failed: the next try waits) or the end. */
void journal_peer_close(JournalPeer *p, bool failed);
/* What another database holds of these ids, added to *out (rows as
 * journal_known's). The ids claim[i] marks are claimed there for the look
 * alone: each takes that database's claim lock (the one journal_claim takes,
 * which its leader holds until its append commits), then the rows are read,
 * then the claims are released, so a look never misses an append that
 * committed before it and never runs beside one that has not; one whose lock
 * another session holds is busy[i] (look again once that append has landed).
 * Why that is enough: docs/architecture.md, "Ids across databases". On
 * failure the caller closes c (claims may be held). */
int journal_known_elsewhere(PGconn *c, char *const *ids, const bool *claim, size_t n, bool *busy,
                            KnownSet *out, Err *err) WARN_UNUSED;

/* Dead work of a queue and key (NULL: any), oldest first, at most limit. */
int journal_dead_matching(PGconn *c, int shard, const char *queue, const char *key, int limit,
                          KnownSet *out, Err *err) WARN_UNUSED;

/* ---- the leader's session, as the manager's round watches it ---- */
/* The manager reaches PostgreSQL only through this header (and view.h's
 * reads): a unit test links a fake store in its place (tests/unit). */

/* The socket to poll for the outcome of an append, a notification, or the
 * session's end. */
int journal_socket(PGconn *c);
/* True while the oldest append out has no outcome read yet. */
bool journal_busy(PGconn *c);
/* Reads what the socket holds; *inbox is set when workd_inbox was notified.
 * -1: the session is gone. */
int journal_consume(PGconn *c, bool *inbox) WARN_UNUSED;
/* Starts listening for workd_inbox's notifications. */
int journal_listen(PGconn *c, Err *err) WARN_UNUSED;
/* A round trip, to learn that an idle session is still there. */
int journal_ping(PGconn *c, Err *err) WARN_UNUSED;
/* Ends the session (NULL: nothing), which releases the leader lock. */
void journal_close(PGconn *c);

#endif
