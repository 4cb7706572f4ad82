/* cron: cron expressions and their fire times in a time zone, as a pure
 * module (no clock, no I/O, no global state: the zone is handed in).
 *
 * An expression has five fields (minute hour day-of-month month day-of-week)
 * or six with seconds first; each field takes *, numbers, ranges a-b, steps
 * (*, a-b or a followed by /n) and lists; months and weekdays also take
 * names (JAN, MON); weekday 7 is Sunday. @yearly, @monthly, @weekly, @daily,
 * @midnight and @hourly stand for their usual expressions. As in Vixie cron,
 * when both day fields are restricted a day matches either of them.
 *
 * Daylight saving, as a user expects: a wall-clock time that does not exist
 * (the hour skipped in spring) does not fire; a wall-clock time that occurs
 * twice (the hour repeated in autumn) fires once, at its first occurrence.
 * An expression whose hour field is * fires by the clock through the repeated
 * hour (both passes), since it means "every hour". */
#ifndef WORKD_CRON_H
#define WORKD_CRON_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "tz.h"

typedef struct CronExpr {
    uint64_t sec, min; /* bit n: second / minute n */
    uint32_t hour;     /* bit n: hour n */
    uint32_t dom;      /* bit n: day n (1-31) */
    uint16_t mon;      /* bit n: month n (1-12) */
    uint8_t dow;       /* bit n: weekday n (0 Sunday - 6) */
    bool dom_any, dow_any, hour_any, has_seconds;
} CronExpr;

/* Parses an expression (at most 200 characters); err (400) names the field. */
int cron_parse(const char *s, CronExpr *out, Err *err) WARN_UNUSED;

/* The first fire time strictly after `after` (ms since the epoch), in ms, in
 * zone z; INT64_MAX when the expression never fires within the next 8 years
 * (e.g. "0 0 30 2 *"). */
int64_t cron_next(const CronExpr *c, const TzZone *z, int64_t after);

#endif
