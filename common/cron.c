/* cron: see cron.h. Matching is done on wall-clock "labels" (local seconds:
 * the wall clock read as if it were UTC), which have no gaps or repeats; the
 * zone then turns a label into zero, one or two instants. */
#include "cron.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- parsing ---- */

typedef struct FieldSpec {
    const char *name;
    int lo, hi;
    const char *const *names; /* names[i] stands for lo + i (NULL: none) */
} FieldSpec;

static const char *const mon_names[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL",
                                        "AUG", "SEP", "OCT", "NOV", "DEC", NULL};
static const char *const dow_names[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", NULL};

static const FieldSpec specs[] = {
    {"second", 0, 59, NULL},       {"minute", 0, 59, NULL},     {"hour", 0, 23, NULL},
    {"day of month", 1, 31, NULL}, {"month", 1, 12, mon_names}, {"day of week", 0, 7, dow_names},
};

WARN_UNUSED static int number(const char **p, const FieldSpec *f, int *out)
{
    if (isdigit((unsigned char)**p)) {
        char *end;
        long v = strtol(*p, &end, 10);
        if (end - *p > 2)
            return -1;
        *p = end;
        *out = (int)v;
        return 0;
    }
    for (int i = 0; f->names && f->names[i]; i++)
        if (!strncasecmp(*p, f->names[i], 3)) {
            *p += 3;
            *out = f->lo + i;
            return 0;
        }
    return -1;
}

/* One field: a comma-separated list of *, n, a-b, each with an optional /step. */
/* The refusal of a malformed field (parse_field). */
WARN_UNUSED static int bad_field(const char *s, size_t len, const FieldSpec *f, Err *err)
{
    return err_set(err, 400, "invalid-cron",
                   "the %s field '%.*s' is not valid (%d-%d, *, a-b, /n, lists)", f->name,
                   (int)(len < 40 ? len : 40), s, f->lo, f->hi);
}

WARN_UNUSED static int parse_field(const char *s, size_t len, const FieldSpec *f, uint64_t *bits,
                                   bool *any, Err *err)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return bad_field(s, len, f, err);
    memcpy(buf, s, len);
    buf[len] = 0;
    *bits = 0;
    *any = !strcmp(buf, "*") || !strcmp(buf, "?");
    const char *p = buf;
    for (;;) {
        int a, b, step = 1;
        bool single = false;
        if (*p == '*' || *p == '?') {
            a = f->lo;
            b = f->hi == 7 ? 6 : f->hi;
            p++;
        } else {
            if (number(&p, f, &a) != 0)
                return bad_field(s, len, f, err);
            b = a;
            single = *p != '-';
            if (*p == '-') {
                p++;
                if (number(&p, f, &b) != 0)
                    return bad_field(s, len, f, err);
            }
        }
        if (*p == '/') {
            p++;
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > f->hi + 1)
                return bad_field(s, len, f, err);
            step = (int)v;
            p = end;
            if (single) /* "n/s": from n to the end of the range */
                b = f->hi == 7 ? 6 : f->hi;
        }
        if (a < f->lo || b > f->hi || a > b)
            return bad_field(s, len, f, err);
        for (int v = a; v <= b; v += step)
            *bits |= 1ULL << (f->hi == 7 && v == 7 ? 0 : v);
        if (!*p)
            break;
        if (*p++ != ',')
            return bad_field(s, len, f, err);
    }
    return 0;
}

int cron_parse(const char *s, CronExpr *out, Err *err)
{
    static const struct {
        const char *name, *expr;
    } macros[] = {{"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
                  {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
                  {"@hourly", "0 * * * *"}};
    memset(out, 0, sizeof *out);
    if (strlen(s) > 200)
        return err_set(err, 400, "invalid-cron",
                       "the cron expression is longer than 200 characters");
    for (size_t i = 0; i < sizeof macros / sizeof macros[0]; i++)
        if (!strcasecmp(s, macros[i].name))
            s = macros[i].expr;
    const char *start[7];
    size_t len[7], n = 0;
    for (const char *p = s; *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        if (n == 7)
            break;
        start[n] = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
        len[n] = (size_t)(p - start[n]);
        n++;
    }
    if (n != 5 && n != 6)
        return err_set(err, 400, "invalid-cron",
                       "a cron expression has 5 fields (minute hour day month weekday) or 6 "
                       "(seconds first), not %zu",
                       n);
    out->has_seconds = n == 6;
    size_t k = 0;
    uint64_t bits[6];
    bool any[6];
    if (!out->has_seconds) {
        bits[0] = 1; /* second 0 */
        any[0] = false;
    }
    for (size_t f = out->has_seconds ? 0 : 1; f < 6; f++, k++)
        if (parse_field(start[k], len[k], &specs[f], &bits[f], &any[f], err) != 0)
            return -1;
    out->sec = bits[0];
    out->min = bits[1];
    out->hour = (uint32_t)bits[2];
    out->hour_any = any[2];
    out->dom = (uint32_t)bits[3];
    out->dom_any = any[3];
    out->mon = (uint16_t)bits[4];
    out->dow = (uint8_t)bits[5];
    out->dow_any = any[5];
    return 0;
}

/* ---- matching labels ---- */

static int64_t fdiv(int64_t a, int64_t b)
{
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

static bool day_matches(const CronExpr *c, int64_t days, int d)
{
    int wd = (int)(((days % 7) + 11) % 7);
    bool dom = c->dom >> d & 1, dow = c->dow >> wd & 1;
    if (c->dom_any || c->dow_any)
        return dom && dow;
    return dom || dow;
}

/* The first matching label > ls, or INT64_MAX past `limit`. */
static int64_t next_label(const CronExpr *c, int64_t ls, int64_t limit)
{
    int64_t t = ls + 1;
    while (t <= limit) {
        int64_t days = fdiv(t, 86400), y;
        int64_t sod = t - days * 86400;
        int m, d;
        tz_civil_from_days(days, &y, &m, &d);
        int h = (int)(sod / 3600), mi = (int)(sod / 60 % 60), s = (int)(sod % 60);
        if (!(c->mon >> m & 1)) {
            t = tz_days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) * 86400;
            continue;
        }
        if (!day_matches(c, days, d)) {
            t = (days + 1) * 86400;
            continue;
        }
        if (!(c->hour >> h & 1)) {
            t = days * 86400 + (h + 1) * 3600;
            continue;
        }
        if (!(c->min >> mi & 1)) {
            t = days * 86400 + h * 3600 + (mi + 1) * 60;
            continue;
        }
        if (!(c->sec >> s & 1)) {
            t++;
            continue;
        }
        return t;
    }
    return INT64_MAX;
}

/* ---- fire times ---- */

#define WINDOW (3 * 3600) /* larger than any DST shift */
#define HORIZON (8LL * 366 * 86400)

/* Whether the zone keeps one offset from t - WINDOW to t + WINDOW (no change
 * of offset near t: labels and instants then differ by a constant). */
static bool steady(const TzZone *z, int64_t t)
{
    int32_t o = tz_offset(z, t);
    return tz_offset(z, t - WINDOW) == o && tz_offset(z, t + WINDOW) == o;
}

int64_t cron_next(const CronExpr *c, const TzZone *z, int64_t after)
{
    int64_t a = fdiv(after, 1000); /* an instant u fires after `after` iff u > a */
    int64_t limit = a + tz_offset(z, a) + HORIZON;
    int64_t label = a + tz_offset(z, a);
    if (!steady(z, a))
        label -= WINDOW; /* after a fall-back, later instants may have earlier labels */
    int64_t best = INT64_MAX, best_label = 0;
    for (;;) {
        label = next_label(c, label, limit);
        if (label == INT64_MAX || (best != INT64_MAX && label > best_label + WINDOW))
            break;
        int64_t inst[2];
        size_t n = tz_instants(z, label, inst);
        if (n == 2 && !c->hour_any)
            n = 1; /* a repeated wall-clock time fires once */
        for (size_t i = 0; i < n; i++)
            if (inst[i] > a && inst[i] < best) {
                best = inst[i];
                best_label = label;
            }
        if (best != INT64_MAX && steady(z, best))
            break;
    }
    return best == INT64_MAX ? INT64_MAX : best * 1000;
}
