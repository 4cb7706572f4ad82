/* progress: see progress.h. */
#include "progress.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "httpc.h"
#include "log.h"
#include "util.h"

#define SEND_TIMEOUT_MS 5000
#define MESSAGE_MAX 1024 /* the server's limit (parse_hooks.h) */

struct ProgressSender {
    Link *link;
    HttpClient *http;
    char *worker_id, *instance;
    int64_t interval_ms;
    /* the job */
    char *work_id;
    int64_t attempt;
    bool stopped; /* the server refused for good (413, 404, 409): nothing more is sent */
    bool has_fraction, fraction_new;
    double fraction;
    char *message; /* latest, not yet sent (NULL: none new) */
    SBuf output;   /* not yet sent */
    size_t dropped;
    int64_t next_send; /* mono ms */
};

ProgressSender *psend_new(Link *link, const char *token, const char *worker_id,
                          const char *instance, int64_t interval_ms)
{
    ProgressSender *p = xcalloc(1, sizeof *p);
    p->link = link;
    p->http = httpc_new(token);
    p->worker_id = xstrdup(worker_id);
    p->instance = xstrdup(instance);
    p->interval_ms = interval_ms;
    sbuf_init(&p->output);
    return p;
}

static void reset(ProgressSender *p)
{
    free(p->work_id);
    p->work_id = NULL;
    free(p->message);
    p->message = NULL;
    sbuf_reset(&p->output);
    p->has_fraction = p->fraction_new = p->stopped = false;
    p->dropped = 0;
    p->next_send = 0;
}

void psend_free(ProgressSender *p)
{
    if (!p)
        return;
    reset(p);
    sbuf_free(&p->output);
    httpc_free(p->http);
    free(p->worker_id);
    free(p->instance);
    free(p);
}

void psend_begin(ProgressSender *p, const char *work_id, int64_t attempt)
{
    reset(p);
    p->work_id = xstrdup(work_id);
    p->attempt = attempt;
}

static bool pending(const ProgressSender *p)
{
    return p->fraction_new || p->message || p->output.len;
}

static void set_message(ProgressSender *p, const char *s, size_t n)
{
    if (n > MESSAGE_MAX) {
        n = MESSAGE_MAX;
        while (n && ((unsigned char)s[n] & 0xC0) == 0x80) /* not inside a character */
            n--;
    }
    free(p->message);
    p->message = exec_utf8_clean(s, n);
}

static void add_output(ProgressSender *p, const char *s, size_t n)
{
    if (p->output.len + n > PROGRESS_PENDING_MAX) {
        if (!p->dropped)
            log_warn("job %s attempt %lld: progress output comes faster than it can be sent; "
                     "dropping some",
                     p->work_id, (long long)p->attempt);
        p->dropped += n;
        return;
    }
    sbuf_append(&p->output, s, n);
}

static void set_fraction(ProgressSender *p, double f)
{
    if (!(f >= 0.0 && f <= 1.0))
        return;
    p->has_fraction = p->fraction_new = true;
    p->fraction = f;
}

/* One line from the job. */
static void take_line(ProgressSender *p, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    if (!len)
        return;
    if (line[0] == '{') {
        json_t *j = json_loadb(line, len, 0, NULL);
        if (json_is_object(j)) {
            json_t *f = json_object_get(j, "fraction"), *m = json_object_get(j, "message"),
                   *o = json_object_get(j, "output");
            if (json_is_number(f))
                set_fraction(p, json_number_value(f));
            if (json_is_string(m))
                set_message(p, json_string_value(m), json_string_length(m));
            if (json_is_string(o))
                add_output(p, json_string_value(o), json_string_length(o));
            json_decref(j);
            return;
        }
        json_decref(j);
    }
    char buf[32];
    if (len < sizeof buf) {
        memcpy(buf, line, len);
        buf[len] = '\0';
        char *end;
        double v = strtod(buf, &end);
        if (end != buf && *end == '%' && end[1] == '\0') {
            set_fraction(p, v / 100.0);
            return;
        }
        if (end != buf && *end == '\0') {
            set_fraction(p, v);
            return;
        }
    }
    set_message(p, line, len);
}

/* Sends what is gathered; keeps it for the next try when the server is busy.
 * Returns whether that is worth trying again (busy, or no answer). */
static bool send_now(ProgressSender *p)
{
    json_t *body = json_pack("{s:s}", "worker_id", p->worker_id);
    if (p->instance)
        json_object_set_new(body, "instance", json_string(p->instance));
    if (p->has_fraction)
        json_object_set_new(body, "fraction", json_real(p->fraction));
    if (p->message)
        json_object_set_new(body, "message", json_string(p->message));
    if (p->output.len) {
        char *clean = exec_utf8_clean(p->output.data, p->output.len);
        json_object_set_new(body, "output", json_string(clean));
        free(clean);
    }
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    char path[400], url[SERVERS_URL_MAX];
    snprintf(path, sizeof path, "/work/%s/attempts/%lld/progress", p->work_id,
             (long long)p->attempt);
    link_url(p->link, path, url, sizeof url);
    HttpResp resp;
    Err err;
    err_clear(&err);
    int rc = httpc_request(p->http, "POST", url, text, SEND_TIMEOUT_MS, &resp, &err);
    free(text);
    int64_t now = mono_ms();
    p->next_send = now + p->interval_ms;
    bool again = false;
    if (rc != 0 || resp.status == 0) {
        again = true;
        log_debug("job %s: progress not sent, kept for the next try: %s", p->work_id, err.msg);
    } else if (resp.status == 200) {
        p->fraction_new = false;
        free(p->message);
        p->message = NULL;
        sbuf_reset(&p->output);
    } else if (resp.status == 429 || resp.status >= 500) {
        again = true;
        if (resp.retry_after_ms > 0)
            p->next_send = now + resp.retry_after_ms;
    } else {
        char why[300];
        link_describe(&resp, &err, why, sizeof why);
        log_warn("job %s attempt %lld: progress refused, sending no more for this attempt: %s",
                 p->work_id, (long long)p->attempt, why);
        p->stopped = true;
    }
    httpc_resp_free(&resp);
    return again;
}

void psend_line(void *ud, const char *line, size_t len)
{
    ProgressSender *p = ud;
    if (!p->work_id || p->stopped)
        return;
    if (line)
        take_line(p, line, len);
    if (pending(p) && mono_ms() >= p->next_send)
        (void)send_now(p);
}

void psend_end(ProgressSender *p)
{
    /* What the job said last goes before its result: a few tries, a second
     * apart at most, when the server is busy (its rate limit) or away. */
    for (int i = 0; i < 3 && p->work_id && !p->stopped && pending(p); i++) {
        int64_t wait = p->next_send - mono_ms();
        if (i > 0 && wait > 0)
            sleep_ms(wait > 1000 ? 1000 : wait);
        if (!send_now(p))
            break;
    }
    reset(p);
}
