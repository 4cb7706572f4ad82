/* subscription: see subscription.h. */
#include "subscription.h"

#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "util.h"

struct SubscriptionSet {
    HMap by_name; /* name -> Subscription (owned) */
};

SubscriptionSet *subs_new(void)
{
    SubscriptionSet *s = xcalloc(1, sizeof *s);
    hmap_init(&s->by_name);
    return s;
}

static void sub_free(Subscription *x)
{
    subscription_clear(x);
    free(x);
}

void subs_free(SubscriptionSet *s)
{
    if (!s)
        return;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&s->by_name, &i, &k, &v);)
        sub_free(v);
    hmap_free(&s->by_name);
    free(s);
}

/* ---- deciding ---- */

static Event *sub_event(EventType type, const char *name, int64_t now, EventList *out)
{
    Event *e = eventlist_push(out);
    e->type = type;
    e->at = now;
    e->sub = xcalloc(1, sizeof *e->sub);
    e->sub->name = xstrdup(name);
    return e;
}

int subs_decide_set(const SubscriptionSet *s, const Subscription *set, bool reset,
                    const Cursor *start, int64_t now, EventList *out, Err *err)
{
    if (!subs_get(s, set->name) && subs_count(s) >= SUBS_MAX)
        return err_set(err, 409, "too-many-subscriptions",
                       "there are %d webhook subscriptions, the limit", SUBS_MAX);
    Event *e = eventlist_push(out);
    e->type = EV_SUBSCRIPTION;
    e->at = now;
    e->sub = xcalloc(1, sizeof *e->sub);
    subscription_copy(e->sub, set);
    e->sub_reset = reset;
    e->sub_start = *start;
    if (!reset)
        cursor_zero(&e->sub->cursor, start->n);
    return 0;
}

int subs_decide_delete(const SubscriptionSet *s, const char *name, const Cursor *start, int64_t now,
                       EventList *out, Err *err)
{
    if (!subs_get(s, name))
        return err_set(err, 404, "not-found", "no webhook subscription with that name");
    Event *e = sub_event(EV_SUBSCRIPTION, name, now, out);
    e->sub_deleted = true;
    e->sub_start = *start;
    return 0;
}

void subs_decide_cursor(const SubscriptionSet *s, const char *name, const Cursor *cursor,
                        int64_t now, EventList *out)
{
    if (subs_get(s, name))
        sub_event(EV_SUB_CURSOR, name, now, out)->sub->cursor = *cursor;
}

bool subs_decide_pause(const SubscriptionSet *s, const char *name, const char *reason,
                       const Cursor *start, int64_t now, EventList *out)
{
    const Subscription *x = subs_get(s, name);
    if (!x || x->paused || !x->secret)
        return false;
    Event *e = eventlist_push(out);
    e->type = EV_SUBSCRIPTION;
    e->at = now;
    e->sub = xcalloc(1, sizeof *e->sub);
    subscription_copy(e->sub, x);
    cursor_zero(&e->sub->cursor, start->n); /* not a reset: it keeps its own */
    e->sub->paused = true;
    free(e->sub->paused_reason);
    e->sub->paused_reason = xstrdup(reason);
    e->sub_start = *start; /* unused: it exists */
    return true;
}

/* ---- applying ---- */

static void apply_set(SubscriptionSet *s, const Event *e)
{
    Subscription *old = hmap_del(&s->by_name, e->sub->name);
    if (e->sub_deleted) {
        if (old)
            sub_free(old);
        return;
    }
    Subscription *x = xmalloc(sizeof *x);
    subscription_copy(x, e->sub);
    /* A cursor moves only with a reset; a new one starts at the log's end. */
    x->cursor = e->sub_reset ? e->sub->cursor : old ? old->cursor : e->sub_start;
    if (!x->secret && old) { /* the log keeps none: the one it has */
        x->secret = old->secret;
        old->secret = NULL;
    }
    if (!x->kinds)
        x->kinds = xcalloc(1, sizeof *x->kinds);
    if (old)
        sub_free(old);
    hmap_put(&s->by_name, x->name, x);
}

void subs_apply(SubscriptionSet *s, const Event *e)
{
    if (!e->sub || !e->sub->name)
        return;
    if (e->type == EV_SUBSCRIPTION) {
        apply_set(s, e);
    } else if (e->type == EV_SUB_CURSOR) {
        /* Cursors only move forward; an operator's reset is a subscription event. */
        Subscription *x = hmap_get(&s->by_name, e->sub->name);
        if (x)
            for (int k = 0; k < e->sub->cursor.n; k++) {
                if (k >= x->cursor.n) /* a cursor of one shard restored, say */
                    x->cursor.seq[x->cursor.n++] = 0;
                cursor_advance(&x->cursor, k, e->sub->cursor.seq[k]);
            }
    }
}

void subs_restore(SubscriptionSet *s, const Subscription *sub)
{
    Subscription *x = hmap_del(&s->by_name, sub->name);
    if (x)
        sub_free(x);
    x = xmalloc(sizeof *x);
    subscription_copy(x, sub);
    if (!x->kinds)
        x->kinds = xcalloc(1, sizeof *x->kinds);
    hmap_put(&s->by_name, x->name, x);
}

/* ---- reading ---- */

const Subscription *subs_get(const SubscriptionSet *s, const char *name)
{
    return name ? hmap_get(&s->by_name, name) : NULL;
}

size_t subs_count(const SubscriptionSet *s)
{
    return s->by_name.len;
}

const Subscription *subs_next(const SubscriptionSet *s, size_t *pos)
{
    const char *k;
    void *v;
    return hmap_next(&s->by_name, pos, &k, &v) ? v : NULL;
}
