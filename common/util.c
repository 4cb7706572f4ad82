/* util: see util.h. */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        abort();
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        abort();
    return q;
}

char *xstrdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static void fill_random(void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            abort();
        }
        got += (size_t)r;
    }
}

void id_generate(char out[37])
{
    unsigned char b[16];
    fill_random(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static bool id_chars_valid(const char *s, bool system)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (!(isalnum(c) || c == '.' || c == '_' || c == ':' || c == '@' || c == '-' ||
              (system && c == SYSTEM_ID_MARK)))
            return false;
        if (n >= ID_MAX)
            return false;
    }
    /* "." and ".." are path segments that URL handling resolves away. */
    return n > 0 && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

bool id_valid(const char *s)
{
    return id_chars_valid(s, false);
}

bool work_id_valid(const char *s)
{
    return id_chars_valid(s, true);
}

double rand_unit(void)
{
    uint64_t r;
    fill_random(&r, sizeof r);
    return (double)(r >> 11) / 9007199254740992.0;
}

void sbuf_init(SBuf *b)
{
    b->data = NULL;
    b->len = b->cap = 0;
}

void sbuf_free(SBuf *b)
{
    free(b->data);
    sbuf_init(b);
}

void sbuf_reset(SBuf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

static void sbuf_reserve(SBuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

void sbuf_append(SBuf *b, const void *data, size_t n)
{
    sbuf_reserve(b, n);
    if (n)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sbuf_puts(SBuf *b, const char *s)
{
    sbuf_append(b, s, strlen(s));
}

void sbuf_printf(SBuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0) {
        sbuf_reserve(b, (size_t)n);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

char *sbuf_steal(SBuf *b)
{
    if (!b->data)
        return xstrdup("");
    char *d = b->data;
    sbuf_init(b);
    return d;
}

void time_format(int64_t ms, char *out, size_t outlen)
{
    time_t secs = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
    int frac = (int)(ms - (int64_t)secs * 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    /* Not strftime's %Y: it writes the year 999 as "999", which RFC 3339 (and
     * time_parse) reads as no year at all. */
    snprintf(out, outlen, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
}

WARN_UNUSED static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)**p))
            return -1;
        v = v * 10 + (**p - '0');
        (*p)++;
    }
    *out = v;
    return 0;
}

/* The refusal of every malformed time (time_parse). */
WARN_UNUSED static int not_a_time(const char *s, Err *err)
{
    return err_set(err, 400, "invalid-time",
                   "'%.64s' is not an RFC 3339 time such as 2026-01-02T03:04:05Z", s);
}

int time_parse(const char *s, int64_t *ms_out, Err *err)
{
    const char *p = s;
    int Y, M, D, h, m, sec;
    if (digits(&p, 4, &Y) || *p++ != '-' || digits(&p, 2, &M) || *p++ != '-' || digits(&p, 2, &D) ||
        (*p != 'T' && *p != 't' && *p != ' '))
        return not_a_time(s, err);
    p++;
    if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &m) || *p++ != ':' || digits(&p, 2, &sec))
        return not_a_time(s, err);
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60)
        return not_a_time(s, err);
    int ms = 0;
    if (*p == '.') {
        p++;
        int scale = 100, nd = 0;
        while (isdigit((unsigned char)*p)) {
            if (nd < 3)
                ms += (*p - '0') * scale;
            scale /= 10;
            nd++;
            p++;
        }
        if (nd == 0)
            return not_a_time(s, err);
    }
    int offset_min = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p == '-' ? -1 : 1, oh, om;
        p++;
        if (digits(&p, 2, &oh) || *p++ != ':' || digits(&p, 2, &om) || oh > 23 || om > 59)
            return not_a_time(s, err);
        offset_min = sign * (oh * 60 + om);
    } else {
        return not_a_time(s, err);
    }
    if (*p)
        return not_a_time(s, err);
    struct tm tm = {.tm_year = Y - 1900,
                    .tm_mon = M - 1,
                    .tm_mday = D,
                    .tm_hour = h,
                    .tm_min = m,
                    .tm_sec = sec};
    time_t t = timegm(&tm);
    /* timegm() normalises 2026-02-30 into March: refuse days a month lacks. */
    struct tm back;
    gmtime_r(&t, &back);
    if (back.tm_mday != D || back.tm_mon != M - 1)
        return not_a_time(s, err);
    int64_t v = ((int64_t)t - (int64_t)offset_min * 60) * 1000 + ms;
    /* An offset can carry 0000-01-01 or 9999-12-31 out of the years RFC 3339
     * can write, and time_format could not give it back. */
    if (v < -62167219200000LL || v > 253402300799999LL)
        return not_a_time(s, err);
    *ms_out = v;
    return 0;
}

int duration_parse(const char *s, int64_t *ms_out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return -1;
    double scale;
    if (*end == '\0' || strcmp(end, "s") == 0)
        scale = 1000;
    else if (strcmp(end, "ms") == 0)
        scale = 1;
    else if (strcmp(end, "m") == 0)
        scale = 60000;
    else if (strcmp(end, "h") == 0)
        scale = 3600000;
    else if (strcmp(end, "d") == 0)
        scale = 86400000;
    else
        return -1;
    double ms = v * scale;
    if (ms > 9.0e15)
        return -1;
    *ms_out = (int64_t)llround(ms);
    return 0;
}
