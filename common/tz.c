/* tz: see tz.h. Civil-date arithmetic after Howard Hinnant's days_from_civil. */
#include "tz.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- civil dates ---- */

int64_t tz_days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

void tz_civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static int64_t year_of_days(int64_t z)
{
    int64_t y;
    int m, d;
    tz_civil_from_days(z, &y, &m, &d);
    return y;
}

static int64_t floor_div(int64_t a, int64_t b)
{
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

static bool leap(int64_t y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int month_days(int64_t y, int m)
{
    static const int md[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && leap(y) ? 29 : md[m - 1];
}

/* Local seconds (from the epoch, wall clock as if UTC) of a rule date's change in year y. */
static int64_t rule_local(const TzDate *d, int64_t y)
{
    int64_t day;
    if (d->kind == 'J') {
        day = tz_days_from_civil(y, 1, 1) + d->n - 1;
        if (leap(y) && d->n >= 60)
            day++;
    } else if (d->kind == 'D') {
        day = tz_days_from_civil(y, 1, 1) + d->n;
    } else {
        int64_t first = tz_days_from_civil(y, d->m, 1);
        int wd = (int)((first % 7 + 11) % 7); /* 1970-01-01 was a Thursday (4) */
        int64_t dd = first + (d->d - wd + 7) % 7 + 7 * (d->w - 1);
        while (dd >= first + month_days(y, d->m))
            dd -= 7;
        day = dd;
    }
    return day * 86400 + d->time;
}

/* ---- POSIX TZ rules ---- */

static const char *skip_name(const char *p)
{
    if (*p == '<') {
        const char *e = strchr(p, '>');
        return e ? e + 1 : NULL;
    }
    const char *s = p;
    while (isalpha((unsigned char)*p))
        p++;
    return p - s >= 3 ? p : NULL;
}

/* [+-]hh[:mm[:ss]] into seconds; NULL if malformed. */
static const char *parse_hms(const char *p, int32_t *out)
{
    int sign = 1;
    if (*p == '+' || *p == '-')
        sign = *p++ == '-' ? -1 : 1;
    if (!isdigit((unsigned char)*p))
        return NULL;
    long v[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        if (i && *p != ':')
            break;
        if (i)
            p++;
        if (!isdigit((unsigned char)*p))
            return NULL;
        char *end;
        v[i] = strtol(p, &end, 10);
        if (end - p > 3 || v[i] > 167)
            return NULL;
        p = end;
    }
    *out = (int32_t)(sign * (v[0] * 3600 + v[1] * 60 + v[2]));
    return p;
}

static const char *parse_date(const char *p, TzDate *d)
{
    char *end;
    memset(d, 0, sizeof *d);
    if (*p == 'M') {
        d->kind = 'M';
        d->m = (int)strtol(p + 1, &end, 10);
        if (*end != '.')
            return NULL;
        d->w = (int)strtol(end + 1, &end, 10);
        if (*end != '.')
            return NULL;
        d->d = (int)strtol(end + 1, &end, 10);
        if (d->m < 1 || d->m > 12 || d->w < 1 || d->w > 5 || d->d < 0 || d->d > 6)
            return NULL;
    } else if (*p == 'J') {
        d->kind = 'J';
        d->n = (int)strtol(p + 1, &end, 10);
        if (d->n < 1 || d->n > 365)
            return NULL;
    } else if (isdigit((unsigned char)*p)) {
        d->kind = 'D';
        d->n = (int)strtol(p, &end, 10);
        if (d->n > 365)
            return NULL;
    } else {
        return NULL;
    }
    p = end;
    d->time = 7200;
    if (*p == '/')
        return parse_hms(p + 1, &d->time);
    return p;
}

/* The refusal of a malformed rule (tz_parse_rule). */
WARN_UNUSED static int bad_rule(const char *s, Err *err)
{
    return err_set(err, 400, "invalid-timezone", "malformed TZ rule '%.60s'", s);
}

int tz_parse_rule(const char *s, TzRule *r, Err *err)
{
    memset(r, 0, sizeof *r);
    const char *p = skip_name(s);
    int32_t off;
    if (!p || !(p = parse_hms(p, &off)))
        return bad_rule(s, err);
    r->std_off = -off; /* POSIX counts west of UTC */
    r->dst_off = r->std_off;
    if (!*p)
        return 0;
    if (!(p = skip_name(p)))
        return bad_rule(s, err);
    r->has_dst = true;
    r->dst_off = r->std_off + 3600;
    if (*p && *p != ',') {
        if (!(p = parse_hms(p, &off)))
            return bad_rule(s, err);
        r->dst_off = -off;
    }
    if (*p != ',' || !(p = parse_date(p + 1, &r->start)) || *p != ',' ||
        !(p = parse_date(p + 1, &r->end)) || *p)
        return bad_rule(s, err);
    return 0;
}

static int32_t rule_offset(const TzRule *r, int64_t t)
{
    if (!r->has_dst)
        return r->std_off;
    int64_t y = year_of_days(floor_div(t + r->std_off, 86400));
    int64_t start = rule_local(&r->start, y) - r->std_off;
    int64_t end = rule_local(&r->end, y) - r->dst_off;
    bool dst = start < end ? (t >= start && t < end) : !(t >= end && t < start);
    return dst ? r->dst_off : r->std_off;
}

/* ---- TZif ---- */

static int64_t be(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    if (bytes == 4)
        return (int32_t)(uint32_t)v;
    return (int64_t)v;
}

int tz_parse_tzif(const unsigned char *data, size_t len, TzZone *z, Err *err)
{
    memset(z, 0, sizeof *z);
    const unsigned char *p = data, *end = data + len;
    if (len < 44 || memcmp(p, "TZif", 4) != 0)
        return err_set(err, 400, "invalid-timezone", "not a TZif file");
    int version = p[4] ? p[4] - '0' : 1;
    int tbytes = 4;
    for (int pass = 0; pass < 2; pass++) {
        if (end - p < 44 || memcmp(p, "TZif", 4) != 0)
            return err_set(err, 400, "invalid-timezone", "truncated TZif header");
        int64_t isut = be(p + 20, 4), isstd = be(p + 24, 4), leapc = be(p + 28, 4),
                timec = be(p + 32, 4), typec = be(p + 36, 4), charc = be(p + 40, 4);
        if (isut < 0 || isstd < 0 || leapc < 0 || timec < 0 || typec < 1 || typec > 256 ||
            charc < 0 || timec > 100000 || leapc > 100000 || charc > 100000)
            return err_set(err, 400, "invalid-timezone", "bad TZif counts");
        p += 44;
        size_t need = (size_t)(timec * tbytes + timec + typec * 6 + charc + leapc * (tbytes + 4) +
                               isstd + isut);
        if ((size_t)(end - p) < need)
            return err_set(err, 400, "invalid-timezone", "truncated TZif data");
        if (version >= 2 && pass == 0) {
            p += need; /* the 32-bit block: the 64-bit one follows */
            tbytes = 8;
            continue;
        }
        const unsigned char *times = p, *idx = p + timec * tbytes, *types = idx + timec;
        for (int64_t i = 0; i < timec; i++)
            if (idx[i] >= typec)
                return err_set(err, 400, "invalid-timezone", "bad TZif type index");
        z->n = (size_t)timec;
        z->trans = xcalloc(z->n + 1, sizeof *z->trans);
        z->offs = xcalloc(z->n + 1, sizeof *z->offs);
        for (size_t i = 0; i < z->n; i++) {
            z->trans[i] = be(times + i * (size_t)tbytes, tbytes);
            z->offs[i] = (int32_t)be(types + idx[i] * 6, 4);
        }
        z->off0 = (int32_t)be(types, 4);
        p += need;
        break;
    }
    if (version >= 2 && p < end && *p == '\n') {
        const unsigned char *nl = memchr(p + 1, '\n', (size_t)(end - p - 1));
        if (nl && nl - p - 1 > 0 && nl - p - 1 < 128) {
            char footer[128];
            memcpy(footer, p + 1, (size_t)(nl - p - 1));
            footer[nl - p - 1] = 0;
            Err ignore = {0};
            z->has_rule = tz_parse_rule(footer, &z->rule, &ignore) == 0;
        }
    }
    return 0;
}

int32_t tz_offset(const TzZone *z, int64_t t)
{
    if (!z->n)
        return z->has_rule ? rule_offset(&z->rule, t) : z->off0;
    if (t < z->trans[0])
        return z->off0;
    if (t >= z->trans[z->n - 1] && z->has_rule)
        return rule_offset(&z->rule, t);
    size_t lo = 0, hi = z->n; /* the last transition <= t */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (z->trans[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return z->offs[lo];
}

size_t tz_instants(const TzZone *z, int64_t ls, int64_t out[2])
{
    /* Every offset in effect within a day of ls is a candidate; a candidate
     * o names instant ls - o if the zone has offset o there. */
    int32_t cand[3] = {tz_offset(z, ls - 86400), tz_offset(z, ls), tz_offset(z, ls + 86400)};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        int64_t u = ls - cand[i];
        if (tz_offset(z, u) != cand[i])
            continue;
        bool dup = false;
        for (size_t j = 0; j < n; j++)
            dup = dup || out[j] == u;
        if (!dup && n < 2)
            out[n++] = u;
    }
    if (n == 2 && out[0] > out[1]) {
        int64_t t = out[0];
        out[0] = out[1];
        out[1] = t;
    }
    return n;
}

void tz_clear(TzZone *z)
{
    free(z->trans);
    free(z->offs);
    memset(z, 0, sizeof *z);
}

bool tz_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 63 || name[0] == '/' || strstr(name, ".."))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!(isalnum(c) || c == '_' || c == '+' || c == '-' || c == '/'))
            return false;
    }
    return true;
}

/* ---- loading ---- */

/* The zones loaded so far: a list that only grows (a handful of zones). */
typedef struct ZoneNode {
    TzZone z;
    struct ZoneNode *next;
} ZoneNode;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static ZoneNode *cache; /* under cache_lock */

WARN_UNUSED static int load(const char *name, TzZone *z, Err *err)
{
    if (!strcmp(name, "UTC") || !strcmp(name, "Etc/UTC")) {
        memset(z, 0, sizeof *z);
        return 0;
    }
    const char *dir = getenv("TZDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "/usr/share/zoneinfo", name);
    FILE *f = fopen(path, "rb");
    if (!f && (errno == ENOENT || errno == ENOTDIR))
        return err_set(err, 400, "invalid-timezone",
                       "unknown time zone '%s': use an IANA name such as Europe/Berlin, "
                       "America/New_York or UTC",
                       name);
    if (!f)
        return err_set(err, 400, "invalid-timezone", "time zone '%s' cannot be read from %s: %s",
                       name, path, strerror(errno));
    unsigned char *buf = xmalloc(1 << 20);
    size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    int rc = tz_parse_tzif(buf, len, z, err);
    free(buf);
    if (rc != 0)
        return err_set(err, 400, "invalid-timezone", "time zone '%s': %s", name, err->msg);
    return 0;
}

const TzZone *tz_get(const char *name, Err *err)
{
    if (!tz_name_valid(name)) {
        err_set(err, 400, "invalid-timezone",
                "'%.63s' is not a time zone name such as Europe/Berlin or UTC", name);
        return NULL;
    }
    pthread_mutex_lock(&cache_lock);
    for (ZoneNode *n = cache; n; n = n->next)
        if (!strcmp(n->z.name, name)) {
            pthread_mutex_unlock(&cache_lock);
            return &n->z;
        }
    ZoneNode *n = xcalloc(1, sizeof *n);
    if (load(name, &n->z, err) != 0) {
        pthread_mutex_unlock(&cache_lock);
        free(n);
        return NULL;
    }
    snprintf(n->z.name, sizeof n->z.name, "%s", name);
    n->next = cache;
    cache = n;
    pthread_mutex_unlock(&cache_lock);
    return &n->z;
}

void tz_cache_free(void)
{
    pthread_mutex_lock(&cache_lock);
    while (cache) {
        ZoneNode *n = cache;
        cache = n->next;
        tz_clear(&n->z);
        free(n);
    }
    pthread_mutex_unlock(&cache_lock);
}
