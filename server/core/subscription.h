/* subscription: the webhook subscriptions the WorkState holds (pure). The
 * subscription events fold into them as the database folds them into
 * workd_subscriptions (migration 0013), so that replaying the log rebuilds
 * them; the webhooks thread (webhooks.h) delivers by what was committed. */
#ifndef WORKD_SUBSCRIPTION_H
#define WORKD_SUBSCRIPTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"

#define SUBS_MAX 64 /* subscriptions at most */

typedef struct SubscriptionSet SubscriptionSet;

/* ---- lifetime ---- */
SubscriptionSet *subs_new(void);
void subs_free(SubscriptionSet *s);

/* ---- deciding (pure: the set is not changed) ----
 * start is every shard's log's end as the manager has it: where a new
 * subscription starts unless it names a cursor (copied into the event). */
/* Creates or replaces a subscription: all of set (copied, secret included;
 * set->cursor only with reset: its deliveries restart after it). Refusal: 409
 * "too-many-subscriptions" for a new one past SUBS_MAX. */
int subs_decide_set(const SubscriptionSet *s, const Subscription *set, bool reset,
                    const Cursor *start, int64_t now, EventList *out, Err *err) WARN_UNUSED;
/* Refusal: 404 "not-found". */
int subs_decide_delete(const SubscriptionSet *s, const char *name, const Cursor *start, int64_t now,
                       EventList *out, Err *err) WARN_UNUSED;
/* The deliveries of name reached cursor, every shard's (nothing once it is
 * gone). */
void subs_decide_cursor(const SubscriptionSet *s, const char *name, const Cursor *cursor,
                        int64_t now, EventList *out);
/* workd pauses name for reason (its deliveries keep failing): its settings as
 * they are, paused. Nothing when it is gone or paused already, or when its
 * secret is not known: the event must carry it, as workd_subscriptions takes
 * the secret of the last event. Returns whether it decided the pause. */
bool subs_decide_pause(const SubscriptionSet *s, const char *name, const char *reason,
                       const Cursor *start, int64_t now, EventList *out);

/* ---- applying ---- */
/* subscription and subscription_cursor events (a cursor moves each shard
 * forward only); others are ignored. An event without a secret (as the log gives them back) keeps
 * the one the subscription has. */
void subs_apply(SubscriptionSet *s, const Event *e);
/* Recovery: a subscription as workd_subscriptions holds it (copied, secret
 * and cursor included). */
void subs_restore(SubscriptionSet *s, const Subscription *sub);

/* ---- reading ---- */
/* NULL when there is none; valid until the set changes. */
const Subscription *subs_get(const SubscriptionSet *s, const char *name);
size_t subs_count(const SubscriptionSet *s);
/* Iteration, in no particular order:
 * for (size_t i = 0; (sub = subs_next(s, &i));) */
const Subscription *subs_next(const SubscriptionSet *s, size_t *pos);

#endif
