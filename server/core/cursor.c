/* cursor: places in the shards' logs, and their text (cursor.h). */
#include "cursor.h"

#include <stdio.h>
#include <string.h>

void cursor_zero(Cursor *c, int n)
{
    memset(c, 0, sizeof *c);
    c->n = n;
}

int cursor_parse(const char *text, int n, Cursor *out, Err *err)
{
    cursor_zero(out, n);
    const char *p = text ? text : "";
    int k = 0;
    for (;;) {
        int digits = 0;
        int64_t v = 0;
        while (*p >= '0' && *p <= '9' && digits < 20) {
            if (v > (INT64_MAX - (*p - '0')) / 10)
                digits = 20; /* out of range: refused below */
            else
                v = v * 10 + (*p - '0');
            digits++;
            p++;
        }
        if (digits == 0 || digits > 19 || k == n)
            break;
        out->seq[k++] = v;
        if (*p == '\0')
            return 0;
        if (*p != '.')
            break;
        p++;
    }
    cursor_zero(out, n);
    return err_set(err, 400, "invalid-cursor",
                   "an event id is %s seq%s joined by '.' (as an event's id gives it)",
                   n == 1 ? "a" : "up to one", n == 1 ? "" : " per shard");
}

size_t cursor_format(const Cursor *c, char *out, size_t len)
{
    size_t at = 0;
    if (len)
        out[0] = '\0';
    for (int s = 0; s < c->n && at < len; s++) {
        int w = snprintf(out + at, len - at, s ? ".%lld" : "%lld", (long long)c->seq[s]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
    return at < len ? at : len ? len - 1 : 0;
}

bool cursor_covers(const Cursor *c, int s, int64_t seq)
{
    return s < c->n && seq <= c->seq[s];
}

void cursor_advance(Cursor *c, int s, int64_t seq)
{
    if (s < c->n && seq > c->seq[s])
        c->seq[s] = seq;
}

bool cursor_le(const Cursor *a, const Cursor *b)
{
    int n = a->n > b->n ? a->n : b->n;
    for (int s = 0; s < n; s++) {
        int64_t x = s < a->n ? a->seq[s] : 0, y = s < b->n ? b->seq[s] : 0;
        if (x > y)
            return false;
    }
    return true;
}
