/* webhooks: the leader's deliveries of results to webhook subscriptions. Each
 * matching finished event is POSTed to the subscription's URL, signed the
 * Standard Webhooks way (webhook-id, webhook-timestamp, webhook-signature:
 * whsig.h), one at a time per subscription in
 * seq order, retried with exponential backoff until it is acknowledged (2xx).
 * The thread follows every shard's log (it runs in shard 0's leader, where
 * the subscriptions live): the order is each shard's, and across shards the
 * events are merged by time, as a results stream merges them.
 *
 * A subscription's place is a Cursor (cursor.h): a seq per shard.
 *
 * A subscription's settings and cursor are events (subscription,
 * subscription_cursor; folded into workd_subscriptions by migration 0013), so
 * a new leader resumes from the last recorded cursor: deliveries are at least
 * once, and a failover repeats at most the last second's, with the same
 * webhook-id (msg_<seq> for shard 0's events, msg_<shard>_<seq> for the
 * others'). One thread drives a curl multi handle and reads events on its own
 * session; the manager thread tells it what shard 0 committed and never waits
 * for a delivery. With several shards that session also LISTENs for every
 * shard's commits (NOTIFY workd_events: journal.h), so that the other shards'
 * events are delivered as promptly as shard 0's, whichever node leads them. */
#ifndef WORKD_WEBHOOKS_H
#define WORKD_WEBHOOKS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "manager.h"
#include "netpolicy.h"
#include "subscription.h"
#include "view.h"

#define WEBHOOKS_MAX SUBS_MAX   /* subscriptions at most */
#define WEBHOOKS_CURSOR_MS 1000 /* a cursor that moved is recorded at most this often */

typedef struct WebhooksConfig {
    const char *database_url; /* for the thread's own session (copied) */
    int shards;               /* of the cluster (1 to SHARDS_MAX) */
    /* Where each shard's events are (borrowed, outlives the thread): a
     * session to each database. NULL: all in database_url's. */
    const Stores *stores;
    int64_t pause_after_ms; /* a subscription failing this long is paused */
    int64_t timeout_ms;     /* one delivery, whole exchange */
    int64_t backoff_base_ms, backoff_max_ms;
    /* Receivers' addresses allowed beside public ones (netpolicy.h), checked
     * on each address connected to; NULL: none. Outlives the thread. */
    const NetPolicy *allow;
    /* Called from the webhooks thread, never under its lock: record that the
     * subscription's deliveries reached cursor, or pause it with a reason.
     * The manager turns them into events. */
    void (*cursor)(void *ud, const char *name, const Cursor *cursor);
    void (*pause)(void *ud, const char *name, const char *reason);
    void *ud;
} WebhooksConfig;

typedef struct Webhooks Webhooks;

/* ---- lifetime ---- */
/* Starts the delivery thread (idle until webhooks_lead). */
Webhooks *webhooks_start(const WebhooksConfig *cfg, Err *err) WARN_UNUSED;
/* Stops and joins the thread (deliveries in flight are abandoned), frees. */
void webhooks_stop(Webhooks *w);

/* ---- the manager thread ---- */
/* This node leads from now on: subs (stolen) is view_subscriptions' list,
 * secrets included, last every shard's log's end. Replaces whatever was there. */
void webhooks_lead(Webhooks *w, SubscriptionList *subs, const Cursor *last);
/* No longer leading: deliveries stop (those in flight are abandoned). */
void webhooks_unlead(Webhooks *w);
/* A commit's events of shard 0, in seq order: subscription changes take
 * effect (the events carry the secret: those the manager decides do), new
 * results wake the deliveries. */
void webhooks_committed(Webhooks *w, const EventList *events);
/* Every shard's log's end as the thread last heard of it, into end's
 * components (end->n set by the caller; shard 0's is the caller's own). */
void webhooks_ends(Webhooks *w, Cursor *end);
/* Fills the deliveries of each view (by its sub.name; one the thread does not
 * hold yet has delivered up to its sub.cursor and nothing else) and
 * l->last_seq, every shard's log's end as the deliveries know it. */
void webhooks_deliveries(Webhooks *w, SubscriptionViews *l);

#endif
