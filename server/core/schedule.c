/* schedule: see schedule.h. */
#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hmap.h"
#include "util.h"

struct ScheduleSet {
    HMap by_name; /* name -> Schedule */
};

#define ENUM_MAX 100000 /* ticks looked at in one decision, at most */

ScheduleSet *sched_new(void)
{
    ScheduleSet *s = xcalloc(1, sizeof *s);
    hmap_init(&s->by_name);
    return s;
}

static void schedule_free(Schedule *x)
{
    free(x->name);
    schedspec_free(x->spec);
    free(x->last_work);
    free(x);
}

void sched_free(ScheduleSet *s)
{
    if (!s)
        return;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&s->by_name, &i, &k, &v);)
        schedule_free(v);
    hmap_free(&s->by_name);
    free(s);
}

void sched_tick_id(const char *name, int64_t tick, char *out, size_t len)
{
    time_t secs = (time_t)(tick / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(out, len, "%s%c%04d-%02d-%02dT%02d:%02d:%02dZ", name, SYSTEM_ID_MARK,
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

static void next_of(Schedule *x)
{
    x->next = cron_next(&x->spec->cron, x->spec->zone, x->last_tick);
}

static Schedule *put(ScheduleSet *s, const char *name)
{
    Schedule *x = hmap_get(&s->by_name, name);
    if (!x) {
        x = xcalloc(1, sizeof *x);
        x->name = xstrdup(name);
        hmap_put(&s->by_name, x->name, x);
    }
    return x;
}

void sched_apply(ScheduleSet *s, const Event *e)
{
    Schedule *x;
    switch (e->type) {
    case EV_SCHEDULE_SET:
        x = put(s, e->schedule);
        schedspec_free(x->spec);
        x->spec = schedspec_dup(e->sched);
        x->last_tick = e->tick;
        next_of(x);
        return;
    case EV_SCHEDULE_DELETED:
        x = hmap_del(&s->by_name, e->schedule);
        if (x)
            schedule_free(x);
        return;
    case EV_TICK:
        x = hmap_get(&s->by_name, e->schedule);
        if (!x || e->tick <= x->last_tick)
            return;
        x->last_tick = e->tick;
        if (e->tick_work) {
            free(x->last_work);
            x->last_work = xstrdup(e->tick_work);
        }
        next_of(x);
        return;
    default:
        return;
    }
}

void sched_restore(ScheduleSet *s, const char *name, const ScheduleSpec *spec, int64_t last_tick,
                   const char *last_work)
{
    Schedule *x = put(s, name);
    schedspec_free(x->spec);
    x->spec = schedspec_dup(spec);
    x->last_tick = last_tick;
    free(x->last_work);
    x->last_work = xstrdup(last_work);
    next_of(x);
}

const Schedule *sched_get(const ScheduleSet *s, const char *name)
{
    return hmap_get(&s->by_name, name);
}

size_t sched_count(const ScheduleSet *s)
{
    return s->by_name.len;
}

int64_t sched_next_deadline(const ScheduleSet *s)
{
    int64_t t = INT64_MAX;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&s->by_name, &i, &k, &v);) {
        const Schedule *x = v;
        if (!x->spec->paused && x->next < t)
            t = x->next;
    }
    return t;
}

/* ---- deciding ---- */

static Event *tick_event(const Schedule *x, int64_t tick, int64_t now, EventList *out)
{
    Event *e = eventlist_push(out);
    e->type = EV_TICK;
    e->at = now;
    e->schedule = xstrdup(x->name);
    e->tick = tick;
    return e;
}

static void skip(const Schedule *x, int64_t tick, const char *why, int missed, int64_t now,
                 EventList *out)
{
    Event *e = tick_event(x, tick, now, out);
    e->skipped = xstrdup(why);
    e->missed = missed;
}

/* Fires one tick: its work and its tick event, or a skipped tick event.
 * *open says whether the schedule's last work is open (and becomes true when
 * this tick submits work). */
static void fire(const Schedule *x, int64_t tick, bool *open, size_t *room, int64_t now,
                 EventList *out)
{
    if (x->spec->skip_overlap && *open) {
        skip(x, tick, "overlap", 0, now, out);
        return;
    }
    if (*room == 0) {
        skip(x, tick, "max-open", 0, now, out);
        return;
    }
    (*room)--;
    char id[160];
    sched_tick_id(x->name, tick, id, sizeof id);
    const WorkTemplate *t = &x->spec->work;
    Event *a = eventlist_push(out);
    a->type = EV_ACCEPTED;
    a->at = now;
    a->work_id = xstrdup(id);
    a->queue = xstrdup(t->queue);
    a->key = xstrdup(t->key);
    a->priority = t->priority;
    a->payload = json_incref(t->payload);
    a->timeout_ms = t->timeout_ms;
    a->max_attempts = t->max_attempts;
    Event *e = tick_event(x, tick, now, out);
    e->tick_work = xstrdup(id);
    *open = true;
}

static void decide_one(const Schedule *x, int64_t now, const TickEnv *env, size_t *room,
                       EventList *out)
{
    int64_t from = x->last_tick;
    if (now - from > SCHED_LOOKBACK_MS)
        from = now - SCHED_LOOKBACK_MS;
    int64_t *ticks = NULL;
    size_t n = 0, cap = 0;
    for (int64_t t = cron_next(&x->spec->cron, x->spec->zone, from); t <= now && n < ENUM_MAX;
         t = cron_next(&x->spec->cron, x->spec->zone, t)) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            ticks = xrealloc(ticks, cap * sizeof *ticks);
        }
        ticks[n++] = t;
    }
    size_t missed = 0;
    while (missed < n && ticks[missed] < now - SCHED_GRACE_MS)
        missed++;
    size_t run_missed = x->spec->catch_up == CATCHUP_NONE        ? 0
                        : x->spec->catch_up == CATCHUP_LAST      ? (missed ? 1 : 0)
                        : missed < (size_t)x->spec->catch_up_max ? missed
                                                                 : (size_t)x->spec->catch_up_max;
    size_t skipped = missed - run_missed;
    bool open = x->last_work && env->is_open(x->last_work, env->ud);
    if (skipped)
        skip(x, ticks[skipped - 1], "missed", (int)skipped, now, out);
    for (size_t i = skipped; i < n; i++)
        fire(x, ticks[i], &open, room, now, out);
    free(ticks);
}

void sched_decide_ticks(const ScheduleSet *s, int64_t now, const TickEnv *env, EventList *out)
{
    size_t room = env->room;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&s->by_name, &i, &k, &v);) {
        const Schedule *x = v;
        if (!x->spec->paused && x->next <= now)
            decide_one(x, now, env, &room, out);
    }
}
