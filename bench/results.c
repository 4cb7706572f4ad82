/* results: see results.h. */
#include "results.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESULTS_MAX_FAILS 50

static void open_stream(Results *r);

/* One frame (without its blank line): id:, event:, data: and comment lines. */
static void frame(Results *r, const char *p, size_t n, int64_t recv_us, int64_t recv_wall)
{
    const char *end = p + n, *id_line = NULL;
    size_t id_len = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        if ((size_t)(eol - p) > 3 && !memcmp(p, "id:", 3)) {
            id_line = p + 3 + (p[3] == ' ');
            id_len = (size_t)(eol - id_line);
        }
        if ((size_t)(eol - p) > 5 && !memcmp(p, "data:", 5)) {
            const char *d = p + 5;
            if (*d == ' ')
                d++;
            json_t *ev = json_loadb(d, (size_t)(eol - d), 0, NULL);
            const char *id = json_string_value(json_object_get(ev, "id"));
            const char *status = json_string_value(json_object_get(ev, "status"));
            const char *at = json_string_value(json_object_get(ev, "at"));
            if (id && status) {
                ResultEv e = {.seq = json_integer_value(json_object_get(ev, "seq")),
                              .id = id,
                              .status = status,
                              .at_ms = -1,
                              .recv_us = recv_us,
                              .recv_wall_us = recv_wall};
                if (at && time_parse(at, &e.at_ms, NULL) != 0)
                    e.at_ms = -1;
                if (id_line && id_len < sizeof r->cursor) {
                    memcpy(r->cursor, id_line, id_len);
                    r->cursor[id_len] = '\0';
                }
                r->events++;
                r->fn(&e, r->ud);
            }
            json_decref(ev);
        }
        p = eol + 1;
    }
}

static bool on_data(McReq *q, const char *p, size_t n)
{
    Results *r = q->ud;
    int64_t now = mono_us(), wall = wall_us();
    if (!r->open && mc_status(q) == 200)
        r->open = true;
    sbuf_append(&r->buf, p, n);
    size_t start = 0;
    for (;;) {
        char *sep = memmem(r->buf.data + start, r->buf.len - start, "\n\n", 2);
        if (!sep)
            break;
        size_t len = (size_t)(sep - (r->buf.data + start));
        frame(r, r->buf.data + start, len, now, wall);
        start += len + 2;
    }
    if (start) {
        memmove(r->buf.data, r->buf.data + start, r->buf.len - start);
        r->buf.len -= start;
        r->buf.data[r->buf.len] = '\0';
    }
    return true;
}

static void on_done(McReq *q)
{
    Results *r = q->ud;
    r->fails = r->open ? 0 : r->fails + 1;
    r->req = NULL;
    r->open = false;
    sbuf_reset(&r->buf);
    if (r->stopping)
        return;
    /* A node that is gone for good must not make this loop spin. */
    if (r->fails > RESULTS_MAX_FAILS) {
        fprintf(stderr, "workd-bench: %s failed %d times in a row; giving up\n", r->url, r->fails);
        return;
    }
    if (q->status != 200 && q->status != 0)
        fprintf(stderr, "workd-bench: /results answered %ld; reopening\n", q->status);
    r->reconnects++;
    open_stream(r);
}

static void open_stream(Results *r)
{
    char url[sizeof r->url + sizeof r->cursor + 8];
    if (r->cursor[0])
        snprintf(url, sizeof url, "%s?after=%s", r->url, r->cursor);
    else
        snprintf(url, sizeof url, "%s", r->url);
    r->req = mc_stream(r->mc, url, on_data, on_done, r);
}

void results_start(Results *r, Mc *m, const char *server, ResultsFn fn, void *ud)
{
    memset(r, 0, sizeof *r);
    r->mc = m;
    r->fn = fn;
    r->ud = ud;
    sbuf_init(&r->buf);
    snprintf(r->url, sizeof r->url, "%s/results", server);
    open_stream(r);
}

int results_wait_open(Results *r, int64_t timeout_ms, Err *err)
{
    int64_t deadline = mono_us() + timeout_ms * 1000;
    while (!r->open) {
        if (mono_us() >= deadline)
            return err_set(err, 504, "timeout", "GET %s did not open within %lld ms", r->url,
                           (long long)timeout_ms);
        mc_run(r->mc, 10);
    }
    return 0;
}

void results_stop(Results *r)
{
    r->stopping = true;
    if (r->req)
        mc_cancel(r->req);
    r->req = NULL;
    sbuf_free(&r->buf);
}
