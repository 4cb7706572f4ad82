/* schedule: the schedules the WorkManager fires, as a pure module (no I/O, no
 * clock: time comes in as `now`; cron and zones are resolved in the spec).
 * Owned by the WorkState, which hands it the schedule events (ws_apply) and
 * asks it for due ticks (ws_decide_ticks).
 *
 * Exactly once per tick: a tick's work has the id "<name>@<tick, UTC>", and
 * the tick event that records it (and moves last_tick on) is committed with
 * the work's accepted event; a new leader reads last_tick back
 * (workd_schedules), so it neither fires a tick again nor skips one. A tick
 * more than SCHED_GRACE_MS late was missed (no leader ran, or it was stuck):
 * the schedule's catch-up policy says whether it still runs. */
#ifndef WORKD_SCHEDULE_H
#define WORKD_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "event.h"

#define SCHED_GRACE_MS 10000       /* a tick later than this was missed */
#define SCHED_LOOKBACK_MS 86400000 /* missed ticks older than a day are dropped, uncounted */
#define SCHED_CATCH_UP_MAX 1000    /* CATCHUP_ALL: the bound an operator may set */

typedef struct Schedule {
    char *name;
    ScheduleSpec *spec;
    int64_t last_tick; /* ticks after this one are due (ms) */
    char *last_work;   /* the work of the last tick that ran; NULL: none yet */
    int64_t next;      /* the first tick after last_tick; INT64_MAX: none */
} Schedule;

typedef struct ScheduleSet ScheduleSet;

/* What deciding a tick needs to know of the work: whether an id is open
 * (overlap), and how many more items may be opened (--max-open). */
typedef struct TickEnv {
    bool (*is_open)(const char *work_id, const void *ud);
    const void *ud;
    size_t room;
} TickEnv;

/* ---- lifetime ---- */
ScheduleSet *sched_new(void);
void sched_free(ScheduleSet *s);

/* ---- deciding ---- */
/* The events of the ticks due at now (tick events, each fired one after the
 * accepted event of its work), in tick order. */
void sched_decide_ticks(const ScheduleSet *s, int64_t now, const TickEnv *env, EventList *out);
/* The id of a tick's work: "<name>@YYYY-MM-DDThh:mm:ssZ" (out: at least 96 bytes). */
void sched_tick_id(const char *name, int64_t tick, char *out, size_t len);

/* ---- applying ---- */
/* schedule_set, schedule_deleted and tick events; others are ignored. */
void sched_apply(ScheduleSet *s, const Event *e);
/* Recovery: a schedule as workd_schedules holds it (spec copied). */
void sched_restore(ScheduleSet *s, const char *name, const ScheduleSpec *spec, int64_t last_tick,
                   const char *last_work);

/* ---- reading ---- */
const Schedule *sched_get(const ScheduleSet *s, const char *name);
size_t sched_count(const ScheduleSet *s); /* for --max-schedules */

/* The earliest tick of a schedule that is not paused (INT64_MAX: none). */
int64_t sched_next_deadline(const ScheduleSet *s);

#endif
