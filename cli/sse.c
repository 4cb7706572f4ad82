/* sse: see sse.h. */
#include "sse.h"

#include <stdio.h>
#include <string.h>

void sse_init(SseParser *p)
{
    memset(p, 0, sizeof *p);
    sbuf_init(&p->line);
    sbuf_init(&p->data);
}

void sse_free(SseParser *p)
{
    sbuf_free(&p->line);
    sbuf_free(&p->data);
}

void sse_reset(SseParser *p)
{
    sbuf_reset(&p->line);
    sbuf_reset(&p->data);
    p->event[0] = '\0';
    p->has_data = p->skip_lf = p->too_long = false;
}

/* A blank line: dispatches the block's event, if it has data. */
static bool dispatch(SseParser *p, SseFn fn, void *ud)
{
    bool stop = false;
    if (p->has_data) {
        SseEvent ev = {.id = p->last_id,
                       .event = p->event[0] ? p->event : "message",
                       .data = p->data.data ? p->data.data : ""};
        stop = fn(&ev, ud);
    }
    sbuf_reset(&p->data);
    p->event[0] = '\0';
    p->has_data = false;
    return stop;
}

static bool on_line(SseParser *p, const char *l, size_t len, SseFn fn, void *ud)
{
    if (len == 0)
        return dispatch(p, fn, ud);
    if (l[0] == ':')
        return false;
    const char *colon = memchr(l, ':', len);
    size_t nlen = colon ? (size_t)(colon - l) : len;
    const char *v = colon ? colon + 1 : l + len;
    if (colon && v < l + len && *v == ' ')
        v++;
    size_t vlen = (size_t)(l + len - v);
    if (nlen == 4 && !memcmp(l, "data", 4)) {
        /* An event's data lines together are bounded as one line is: a
         * server that never sends the blank line ending an event must not
         * grow it without end. */
        if (p->data.len + 1 + vlen > SSE_LINE_MAX) {
            p->too_long = true;
            return true;
        }
        if (p->has_data)
            sbuf_append(&p->data, "\n", 1);
        sbuf_append(&p->data, v, vlen);
        p->has_data = true;
    } else if (nlen == 5 && !memcmp(l, "event", 5)) {
        snprintf(p->event, sizeof p->event, "%.*s", (int)vlen, v);
    } else if (nlen == 2 && !memcmp(l, "id", 2)) {
        /* An id with a NUL is ignored (the spec); one longer than a cursor of
         * SHARDS_MAX shards too. */
        if (!memchr(v, '\0', vlen) && vlen < sizeof p->last_id)
            snprintf(p->last_id, sizeof p->last_id, "%.*s", (int)vlen, v);
    }
    return false;
}

bool sse_feed(SseParser *p, const char *buf, size_t n, SseFn fn, void *ud)
{
    for (size_t i = 0; i < n; i++) {
        char ch = buf[i];
        if (p->skip_lf) {
            p->skip_lf = false;
            if (ch == '\n')
                continue;
        }
        if (ch == '\r' || ch == '\n') {
            p->skip_lf = ch == '\r';
            bool stop = on_line(p, p->line.data ? p->line.data : "", p->line.len, fn, ud);
            sbuf_reset(&p->line);
            if (stop)
                return true;
            continue;
        }
        /* Runs of ordinary bytes are appended at once. */
        size_t j = i;
        while (j < n && buf[j] != '\r' && buf[j] != '\n')
            j++;
        if (p->line.len + (j - i) > SSE_LINE_MAX) {
            p->too_long = true;
            return true;
        }
        sbuf_append(&p->line, buf + i, j - i);
        i = j - 1;
    }
    return false;
}

bool sse_id_valid(const char *s)
{
    int numbers = 0;
    for (;;) {
        size_t digits = strspn(s, "0123456789");
        if (digits < 1 || digits > 19 || ++numbers > SHARDS_MAX)
            return false;
        s += digits;
        if (*s == '\0')
            return true;
        if (*s++ != '.')
            return false;
    }
}
