/* hub: fans finished work out to /results subscribers (server-sent events)
 * and to GET /work/{id}?wait long-polls. The listener feeds it each shard's
 * events in that shard's seq order (hub_publish); a ring per shard keeps the
 * newest. A subscriber holds a Cursor (cursor.h): each event's `id:` is the
 * subscriber's cursor after that event, so a stream of one shard's cluster
 * carries the seqs. Shards are merged roughly by arrival, exactly in order
 * within each. Subscribers that fell behind a shard's ring catch up from the
 * table through the read pool. Idle subscribers are suspended connections:
 * they cost no CPU until an event or a keep-alive wakes them. */
#ifndef WORKD_HUB_H
#define WORKD_HUB_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "cursor.h"
#include "dbpool.h"
#include "event.h"
#include "err.h"
#include "metrics.h"
#include "view.h"

typedef struct Hub Hub;

/* ---- lifetime ----
 * Byte budgets (docs/reliability.md): the rings keep at most ring_bytes of
 * formatted events (and 8,192 of them; always each shard's newest one),
 * shared equally between the shards; a subscriber
 * holds at most buffer_bytes of unsent output (at least one event), and reads
 * from the table come in pages of about buffer_bytes. A subscriber that stops
 * reading is cut off by the HTTP daemon's --connection-timeout (its
 * connection makes no progress) and resumes with Last-Event-ID. */
Hub *hub_new(DbPool *pool, Metrics *metrics, int64_t keepalive_ms, int64_t max_subscribers,
             int64_t ring_bytes, int64_t buffer_bytes, const Cursor *last);
/* The cluster's shard count (last->n at hub_new). */
int hub_shards(const Hub *h);
/* Ends every stream and fires every waiter; call before stopping the daemon. */
void hub_shutdown(Hub *h);
void hub_free(Hub *h);

/* ---- feeding (the listener thread) ---- */
/* ev: from view_finished_after or view_result_of, of shard ev->shard. The
 * hub takes its strings when it keeps it (leaving NULL behind); the caller
 * clears ev either way. */
void hub_publish(Hub *h, ResultEvent *ev);
/* The commits of this node's manager of shard `shard`, straight from it:
 * published at once when they continue what the hub has of that shard (else
 * the listener brings them). */
void hub_publish_committed(Hub *h, int shard, const EventList *events);
/* The manager of shard `shard` on this node is about to commit seqs
 * first..last and will publish them: true when they continue what the hub has
 * of the shard (or what it claimed last, still being committed), and then the
 * listener leaves them alone (hub_claimed) instead of reading back, from the
 * database, what this node has just written. hub_unclaim when the commit
 * fails: what it wrote (if it did) comes with the next notification. */
bool hub_claim(Hub *h, int shard, int64_t first, int64_t last);
void hub_unclaim(Hub *h, int shard);
/* Published, or claimed by this node's manager, up to seq of shard. */
bool hub_claimed(Hub *h, int shard, int64_t seq);
/* Everything of shard up to seq has been read (no finished event is missing
 * below it). */
void hub_scanned(Hub *h, int shard, int64_t seq);
int64_t hub_scanned_upto(Hub *h, int shard);
/* Keep-alives, retries and waiter deadlines: call about once a second, and
 * at hub_next_deadline. */
void hub_tick(Hub *h, int64_t now_ms);
/* The earliest deadline of a waiter (GET /work/{id}?wait=), INT64_MAX if none:
 * when hub_tick must run next for a wait to end on time. */
int64_t hub_next_deadline(Hub *h);

/* ---- subscribing (HTTP threads) ---- */
/* A text/event-stream response for events after the cursor `after` (of
 * hub_shards shards, copied; NULL: from now on), optionally filtered, with
 * progress events if progress. A subscriber of one work (work_id) follows its
 * shard alone once it knows it (the other components of its ids stay as
 * `after` had them); an unknown work's, every shard. With until_end (a work's
 * own stream, work_id given) it ends after the work's end (completed, dead,
 * cancelled). NULL with err (503) when the subscriber limit is reached. */
struct MHD_Response *hub_subscribe(Hub *h, struct MHD_Connection *conn, const Cursor *after,
                                   const char *work_id, const char *queue, bool progress,
                                   bool until_end, Err *err) WARN_UNUSED;

/* ---- throughput ---- */
#define HUB_RATE_BUCKETS 60      /* ... of */
#define HUB_RATE_BUCKET_MS 10000 /* each: the last ten minutes */
/* Finished work seen by this node in one queue, per 10-second bucket, oldest
 * first. */
typedef struct QueueRate {
    char *queue;
    int completed[HUB_RATE_BUCKETS], dead[HUB_RATE_BUCKETS], cancelled[HUB_RATE_BUCKETS];
} QueueRate;
typedef struct HubRates {
    QueueRate *items; /* sorted by queue (strcmp) */
    size_t len;
} HubRates;
/* The last HUB_RATE_BUCKETS buckets up to now_ms, every queue the hub has seen
 * (hub_rates_free). */
HubRates *hub_rates(Hub *h, int64_t now_ms);
void hub_rates_free(HubRates *r);

/* ---- waiting for one work item to finish ---- */
/* Calls fn(arg) once, from some thread, as soon as work_id (of shard `shard`)
 * has a finished event after after_seq, or at deadline_ms, or at shutdown. */
void hub_wait(Hub *h, int shard, const char *work_id, int64_t after_seq, int64_t deadline_ms,
              void (*fn)(void *arg), void *arg);

#endif
