/* record: see record.h. */
#include "record.h"

#include <stdlib.h>
#include <string.h>

bool record_is_control(EventType t)
{
    switch (t) {
    case EV_TERM:
    case EV_QUEUE_SET:
    case EV_SCHEDULE_SET:
    case EV_SCHEDULE_DELETED:
    case EV_TICK:
    case EV_BATCH_OPENED:
    case EV_BATCH:
    case EV_SUBSCRIPTION:
    case EV_SUB_CURSOR:
        return true;
    default:
        return false;
    }
}

static int sbuf_dump(const char *buf, size_t size, void *b)
{
    sbuf_append(b, buf, size);
    return 0;
}

/* s as a JSON string. Work ids are plain (id_valid), but ids taken from
 * workd.submit are checked by the leader only after they are logged. */
static void put_json_string(SBuf *b, const char *s)
{
    sbuf_puts(b, "\"");
    for (const char *p = s; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"' || ch == '\\')
            sbuf_printf(b, "\\%c", ch);
        else if (ch < 0x20)
            sbuf_printf(b, "\\u%04x", ch);
        else
            sbuf_append(b, p, 1);
    }
    sbuf_puts(b, "\"");
}

void record_line(SBuf *b, const Event *e)
{
    sbuf_printf(b, "{\"seq\":%lld,\"at\":%lld,\"type\":\"%s\",\"v\":%d,\"work_id\":",
                (long long)e->seq, (long long)e->at, event_type_name(e->type), e->version);
    if (e->work_id)
        put_json_string(b, e->work_id);
    else
        sbuf_puts(b, "null");
    sbuf_puts(b, ",\"data\":");
    json_t *d = event_data_encode(e);
    if (json_dump_callback(d, sbuf_dump, b, JSON_COMPACT) != 0)
        sbuf_puts(b, "{}"); /* cannot happen: jansson's own tree */
    json_decref(d);
    sbuf_puts(b, "}");
}

/* Reads "<name>" followed by a decimal integer at *p; false if not there. */
static bool take_int(const char **p, const char *end, const char *name, int64_t *out)
{
    size_t n = strlen(name);
    if ((size_t)(end - *p) < n || memcmp(*p, name, n) != 0)
        return false;
    const char *q = *p + n;
    bool neg = q < end && *q == '-';
    q += neg;
    int64_t v = 0;
    const char *digits = q;
    while (q < end && *q >= '0' && *q <= '9' && q - digits < 19)
        v = v * 10 + (*q++ - '0');
    if (q == digits)
        return false;
    *out = neg ? -v : v;
    *p = q;
    return true;
}

int record_next(const char **p, const char *end, LogLine *out, Err *err)
{
    while (*p < end && **p == '\n')
        (*p)++;
    if (*p >= end)
        return 0;
    const char *nl = memchr(*p, '\n', (size_t)(end - *p));
    const char *stop = nl ? nl : end;
    memset(out, 0, sizeof *out);
    out->text = *p;
    out->len = (size_t)(stop - *p);
    *p = stop;
    const char *q = out->text;
    if (!take_int(&q, stop, "{\"seq\":", &out->seq) || !take_int(&q, stop, ",\"at\":", &out->at) ||
        (size_t)(stop - q) < 9 || memcmp(q, ",\"type\":\"", 9) != 0)
        return err_set(err, 500, "bad-event", "a log record holds a line that is not an event");
    q += 9;
    const char *close = memchr(q, '"', (size_t)(stop - q));
    if (!close || (size_t)(close - q) >= sizeof out->type)
        return err_set(err, 500, "bad-event", "a log record's line at seq %lld has no type",
                       (long long)out->seq);
    memcpy(out->type, q, (size_t)(close - q));
    return 1;
}

int record_parts(const LogLine *l, int *version, char **work_id, json_t **data, Err *err)
{
    json_error_t jerr;
    json_t *o = json_loadb(l->text, l->len, 0, &jerr);
    if (!json_is_object(o)) {
        json_decref(o);
        return err_set(err, 500, "bad-event", "the log's event at seq %lld does not parse: %s",
                       (long long)l->seq, jerr.text);
    }
    *version = (int)json_integer_value(json_object_get(o, "v"));
    const char *w = json_string_value(json_object_get(o, "work_id"));
    *work_id = w ? xstrdup(w) : NULL;
    json_t *d = json_object_get(o, "data");
    *data = d ? json_incref(d) : json_object();
    json_decref(o);
    return 0;
}

int record_decode(const LogLine *l, int64_t term, Event *out, Err *err)
{
    int version;
    char *work_id;
    json_t *data;
    if (record_parts(l, &version, &work_id, &data, err) != 0)
        return -1;
    int rc = event_decode(l->seq, term, l->at, l->type, version, work_id, data, out, err);
    free(work_id);
    json_decref(data);
    return rc;
}
