/* tz: IANA time zones read from the system's tzfiles (TZif, RFC 8536), with
 * the POSIX TZ rule of their footer for the times past their last transition.
 * No process-wide TZ switching (setenv/tzset): a zone is a value, so any
 * thread may convert in any zone at once. Parsing and conversion are pure;
 * tz_get alone reads files (TZDIR or /usr/share/zoneinfo), once per zone. */
#ifndef WORKD_TZ_H
#define WORKD_TZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* A POSIX TZ rule ("CET-1CEST,M3.5.0,M10.5.0/3"): offsets east of UTC in
 * seconds; a DST change is a date rule and a local time of day. */
typedef struct TzDate {
    char kind;    /* 'M' month.week.day, 'J' Julian 1-365 without Feb 29, 'D' 0-365 */
    int m, w, d;  /* M: month 1-12, week 1-5 (5: last), weekday 0-6 (Sunday 0) */
    int n;        /* J, D */
    int32_t time; /* seconds after local midnight (may be negative or past 24 h) */
} TzDate;

typedef struct TzRule {
    int32_t std_off, dst_off;
    bool has_dst;
    TzDate start, end; /* DST starts (in standard time), ends (in DST) */
} TzRule;

typedef struct TzZone {
    char name[64];
    int64_t *trans; /* transition instants, seconds since the epoch, ascending */
    int32_t *offs;  /* the offset from trans[i] on */
    size_t n;
    int32_t off0;  /* before the first transition (or always, with no data) */
    bool has_rule; /* past the last transition, rule applies */
    TzRule rule;
} TzZone;

/* ---- pure ---- */
/* Parses a TZif file's bytes into z (owned arrays: tz_clear). */
int tz_parse_tzif(const unsigned char *data, size_t len, TzZone *z, Err *err) WARN_UNUSED;
/* Parses a POSIX TZ string. */
int tz_parse_rule(const char *s, TzRule *r, Err *err) WARN_UNUSED;
/* The offset east of UTC (seconds) in effect at instant t (seconds). */
int32_t tz_offset(const TzZone *z, int64_t t);
/* Days from 1970-01-01 to the civil date y-m-d (proleptic Gregorian). */
int64_t tz_days_from_civil(int64_t y, int m, int d);
/* The civil date (proleptic Gregorian) z days after 1970-01-01. */
void tz_civil_from_days(int64_t z, int64_t *y, int *m, int *d);
/* The instants (seconds, ascending, at most 2) at which the zone's wall clock
 * shows local time ls (seconds since the epoch as if the wall clock were
 * UTC): none in a gap (spring forward), two in an overlap (fall back). */
size_t tz_instants(const TzZone *z, int64_t ls, int64_t out[2]);
void tz_clear(TzZone *z);
/* Whether name may be a zone name (A-Z a-z 0-9 _ + - /, no "..", at most 63). */
bool tz_name_valid(const char *name);

/* ---- loading ---- */
/* The zone named (e.g. "Europe/Berlin"; "UTC" needs no file), loaded once and
 * kept for the life of the process: the pointer stays valid and the zone is
 * never changed. Thread-safe (a mutex private to tz.c guards the cache). NULL
 * with err (400) for an unknown or malformed zone. */
const TzZone *tz_get(const char *name, Err *err) WARN_UNUSED;
/* Frees the cache (debug builds, at exit). */
void tz_cache_free(void);

#endif
