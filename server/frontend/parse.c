/* parse: see parse.h. */
#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "hmap.h"
#include "trace.h"
#include "util.h"

#define MAX_TIMEOUT_MS (7LL * 24 * 3600 * 1000)
#define MAX_DELAY_MS (366LL * 24 * 3600 * 1000)
#define MAX_PARENTS 1000 /* parents one work item may name */

static void submit_items_free_one(SubmitItem *it);

/* Depth of nesting, counted on the raw text (outside strings) before parsing,
 * so that a hostile body never reaches the recursive parser. */
static size_t json_depth(const char *s, size_t len)
{
    size_t depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max)
                max = depth;
        } else if ((c == ']' || c == '}') && depth) {
            depth--;
        }
    }
    return max;
}

static const char *quoted(const char *s, char *out, size_t outlen);

/* Whether every number of v comes back from the store as the same number: a
 * real of 2^63 or more (in magnitude) is written out by jsonb as an integer
 * that jansson cannot read. Recursion is bounded by the body's depth limit. */
static bool numbers_kept(json_t *v)
{
    size_t i;
    const char *k;
    json_t *x;
    switch (json_typeof(v)) {
    case JSON_REAL:
        return fabs(json_real_value(v)) < 9223372036854775808.0;
    case JSON_ARRAY:
        json_array_foreach(v, i, x)
        {
            if (!numbers_kept(x))
                return false;
        }
        return true;
    case JSON_OBJECT:
        json_object_foreach(v, k, x)
        {
            if (!numbers_kept(x))
                return false;
        }
        return true;
    default:
        return true;
    }
}

json_t *parse_json_body(const char *body, size_t len, size_t max_depth, Err *err)
{
    if (len == 0) {
        err_set(err, 400, "invalid-body", "the request body is empty; send JSON");
        return NULL;
    }
    size_t depth = json_depth(body, len);
    if (depth > max_depth) {
        err_set(err, 400, "invalid-body", "the JSON body is nested %zu deep; the limit is %zu",
                depth, max_depth);
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(body, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!v) {
        /* What the store cannot keep is said in words (docs/api-values.md);
         * jansson's own text names its flags. */
        if (strstr(je.text, "JSON_ALLOW_NUL"))
            err_set(err, 400, "invalid-json",
                    "a JSON string holds \\u0000, which workd cannot store (PostgreSQL's jsonb "
                    "refuses it): encode the bytes, e.g. in base64 (line %d, column %d)",
                    je.line, je.column);
        else if (strstr(je.text, "too big"))
            err_set(err, 400, "invalid-json",
                    "a JSON integer is beyond -9223372036854775808..9223372036854775807, which "
                    "workd cannot keep exactly: send it as a string (line %d, column %d)",
                    je.line, je.column);
        else {
            /* jansson's text quotes the body near the error, and can cut a
             * character in two ("invalid escape near '"\<first byte>'"). */
            char text[sizeof je.text];
            err_set(err, 400, "invalid-json", "the body is not valid JSON: %s (line %d, column %d)",
                    quoted(je.text, text, sizeof text), je.line, je.column);
        }
        return NULL;
    }
    if (!numbers_kept(v)) {
        json_decref(v);
        err_set(err, 400, "invalid-json",
                "a JSON number is beyond -9223372036854775808..9223372036854775807, which workd "
                "cannot give back as sent (the database writes it out as a too big integer): "
                "send it as a string");
        return NULL;
    }
    return v;
}

/* Copies untrusted text into out (outlen bytes) for an error message: whole
 * UTF-8 characters only, '?' for any other byte and for control characters.
 * The message becomes a problem+json string, which must be valid UTF-8: a
 * raw header byte or a multi-byte character cut by "%.64s" would not be. */
static const char *quoted(const char *s, char *out, size_t outlen)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = *p < 0x80                  ? 1
                   : *p >= 0xc2 && *p <= 0xdf ? 2
                   : *p >= 0xe0 && *p <= 0xef ? 3
                   : *p >= 0xf0 && *p <= 0xf4 ? 4
                                              : 0;
        for (size_t i = 1; i < n; i++)
            if ((p[i] & 0xc0) != 0x80)
                n = 0;
        if ((n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) ||
            (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))) ||
            (n == 1 && (*p < 0x20 || *p == 0x7f)))
            n = 0;
        size_t w = n ? n : 1;
        if (o + w >= outlen)
            break;
        if (n)
            memcpy(out + o, p, n);
        else
            out[o] = '?';
        o += w;
        p += w;
    }
    out[o] = '\0';
    return out;
}

bool queue_name_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= 64 || !(isalnum(c) || c == '_' || c == '-' || c == '.'))
            return false;
    }
    /* "." and ".." name no resource a URL can address (a client resolves
     * them away): refused as for work ids. */
    return n > 0 && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* where names the item in a bulk submission ("item 3: "), or is "". */
WARN_UNUSED static int seconds_to_ms(json_t *v, const char *where, const char *field,
                                     int64_t max_ms, bool allow_zero, int64_t *out, Err *err)
{
    if (!json_is_number(v))
        return err_set(err, 400, "invalid-field", "%s'%s' must be a number of seconds", where,
                       field);
    double secs = json_number_value(v);
    if (!isfinite(secs) || secs < 0 || (!allow_zero && secs == 0) || secs * 1000 > (double)max_ms)
        return err_set(err, 400, "invalid-field", "%s'%s' must be %s %lld seconds", where, field,
                       allow_zero ? "between 0 and" : "above 0 and at most",
                       (long long)(max_ms / 1000));
    *out = (int64_t)llround(secs * 1000);
    if (!allow_zero && *out == 0)
        *out = 1;
    return 0;
}

int parse_check_fields(json_t *o, const char *const *known, const char *where, Err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        bool ok = false;
        for (size_t i = 0; known[i] && !ok; i++)
            ok = !strcmp(key, known[i]);
        if (ok)
            continue;
        char list[256] = "", text[65];
        for (size_t i = 0; known[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     known[i]);
        return err_set(err, 400, "unknown-field", "%s has an unknown field '%s' (known: %s)", where,
                       quoted(key, text, sizeof text), list);
    }
    return 0;
}

/* An item's trace context: "traceparent" and "tracestate", strings or null.
 * A value that is not a W3C one is ignored, as a receiver of the headers
 * ignores it (trace_keep), so the item takes the request's headers instead;
 * only a value that is not a string at all is refused. */
WARN_UNUSED static int parse_trace(json_t *o, const char *where, SubmitItem *it, Err *err)
{
    json_t *tp = json_object_get(o, "traceparent"), *ts = json_object_get(o, "tracestate");
    if (!tp && !ts)
        return 0; /* most work: nothing to look at */
    if ((tp && !json_is_string(tp) && !json_is_null(tp)) ||
        (ts && !json_is_string(ts) && !json_is_null(ts)))
        return err_set(err, 400, "invalid-field",
                       "%s: 'traceparent' and 'tracestate' must be strings (W3C Trace Context)",
                       where);
    it->traceparent = xstrdup(json_string_value(tp));
    it->tracestate = xstrdup(json_string_value(ts));
    trace_keep(&it->traceparent, &it->tracestate);
    return 0;
}

/* The parts of one item of a submission (parse_item). Each returns 0, or -1
 * with err naming the item (where) and the field. */

WARN_UNUSED static int item_payload(json_t *o, const char *where, const ParseLimits *lim,
                                    SubmitItem *it, Err *err)
{
    json_t *payload = json_object_get(o, "payload");
    if (!payload)
        return err_set(err, 400, "missing-field", "%s lacks 'payload' (any JSON value)", where);
    /* As workd writes it: compact, and a number such as 0.1 written out to
     * 17 digits, so up to several times its size in the request. */
    size_t bytes =
        lim->max_payload_bytes ? json_dumpb(payload, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY) : 0;
    if (lim->max_payload_bytes && bytes > (size_t)lim->max_payload_bytes)
        return err_set(err, 413, "payload-too-large",
                       "%s: 'payload' is %zu bytes as workd writes it (compact JSON); the limit "
                       "is %lld",
                       where, bytes, (long long)lim->max_payload_bytes);
    it->payload = json_incref(payload);
    return 0;
}

/* The item's id: its own, the Idempotency-Key's, or one made here. */
WARN_UNUSED static int item_id(json_t *o, const char *where, const char *idem_key, SubmitItem *it,
                               Err *err)
{
    json_t *id = json_object_get(o, "id");
    if (id) {
        if (!json_is_string(id) || !id_valid(json_string_value(id)))
            return err_set(
                err, 400, "invalid-field",
                "%s: 'id' must be 1-128 characters of A-Z a-z 0-9 . _ : @ -, not . or ..", where);
        if (idem_key && strcmp(idem_key, json_string_value(id)) != 0)
            return err_set(err, 400, "invalid-field",
                           "the Idempotency-Key header and the body's 'id' differ");
        it->id = xstrdup(json_string_value(id));
    } else if (idem_key) {
        if (!id_valid(idem_key))
            return err_set(
                err, 400, "invalid-header",
                "Idempotency-Key must be 1-128 characters of A-Z a-z 0-9 . _ : @ -, not . or ..");
        it->id = xstrdup(idem_key);
    } else {
        char gen[37];
        id_generate(gen);
        it->id = xstrdup(gen);
        it->generated = true;
    }
    return 0;
}

/* Where it runs: its queue, fair-share key and priority. */
WARN_UNUSED static int item_place(json_t *o, const char *where, SubmitItem *it, Err *err)
{
    json_t *q = json_object_get(o, "queue");
    if (q && !(json_is_string(q) && queue_name_valid(json_string_value(q))))
        return err_set(err, 400, "invalid-field",
                       "%s: 'queue' must be 1-64 characters of A-Z a-z 0-9 _ . - (not . or ..)",
                       where);
    it->queue = xstrdup(q ? json_string_value(q) : "default");

    json_t *key = json_object_get(o, "key");
    if (key && !json_is_null(key)) {
        if (!json_is_string(key) || !id_valid(json_string_value(key)))
            return err_set(err, 400, "invalid-field",
                           "%s: 'key' must be 1-128 characters of A-Z a-z 0-9 . _ : @ -", where);
        it->key = xstrdup(json_string_value(key));
    }

    json_t *p = json_object_get(o, "priority");
    if (p) {
        if (!json_is_integer(p) || json_integer_value(p) < -1000000 ||
            json_integer_value(p) > 1000000)
            return err_set(err, 400, "invalid-field",
                           "%s: 'priority' must be an integer from -1000000 to 1000000 "
                           "(higher runs first)",
                           where);
        it->priority = (int)json_integer_value(p);
    }
    return 0;
}

/* When it runs: run_at or delay, its timeout and attempts. */
WARN_UNUSED static int item_timing(json_t *o, const char *where, int64_t now,
                                   const ParseLimits *lim, SubmitItem *it, Err *err)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s: ", where);
    json_t *run_at = json_object_get(o, "run_at"), *delay = json_object_get(o, "delay");
    if (run_at && delay)
        return err_set(err, 400, "invalid-field", "%s: give 'run_at' or 'delay', not both", where);
    if (run_at) {
        if (!json_is_string(run_at))
            return err_set(err, 400, "invalid-field",
                           "%s: 'run_at' must be an RFC 3339 time string", where);
        char text[65];
        if (time_parse(json_string_value(run_at), &it->run_at, NULL) != 0)
            return err_set(err, 400, "invalid-field",
                           "%s: 'run_at' must be an RFC 3339 time such as "
                           "2026-01-02T03:04:05Z, not '%s'",
                           where, quoted(json_string_value(run_at), text, sizeof text));
        if (it->run_at - now > MAX_DELAY_MS)
            return err_set(err, 400, "invalid-field", "%s: 'run_at' is more than a year ahead",
                           where);
    } else if (delay) {
        int64_t ms;
        if (seconds_to_ms(delay, prefix, "delay", MAX_DELAY_MS, true, &ms, err) != 0)
            return -1;
        it->run_at = ms ? now + ms : 0;
    }

    it->timeout_ms = lim->default_timeout_ms;
    json_t *t = json_object_get(o, "timeout");
    if (t && seconds_to_ms(t, prefix, "timeout", MAX_TIMEOUT_MS, false, &it->timeout_ms, err) != 0)
        return -1;

    it->max_attempts = lim->default_max_attempts;
    json_t *ma = json_object_get(o, "max_attempts");
    if (ma) {
        if (!json_is_integer(ma) || json_integer_value(ma) < 1 || json_integer_value(ma) > 1000)
            return err_set(err, 400, "invalid-field",
                           "%s: 'max_attempts' must be an integer from 1 to 1000", where);
        it->max_attempts = (int)json_integer_value(ma);
    }
    return 0;
}

/* What it waits for (after, run_anyway) and the batch it joins. */
WARN_UNUSED static int item_graph(json_t *o, const char *where, SubmitItem *it, Err *err)
{
    json_t *after = json_object_get(o, "after");
    if (after && !json_is_null(after)) {
        if (!json_is_array(after) || json_array_size(after) > MAX_PARENTS)
            return err_set(err, 400, "invalid-field",
                           "%s: 'after' must be an array of at most %d work ids", where,
                           MAX_PARENTS);
        it->after = xcalloc(json_array_size(after) + 1, sizeof *it->after);
        HMap seen; /* a parent named twice is one parent: linear in the parents */
        hmap_init(&seen);
        size_t k = 0, i;
        json_t *a;
        json_array_foreach(after, i, a)
        {
            if (!json_is_string(a) || !work_id_valid(json_string_value(a))) {
                hmap_free(&seen);
                return err_set(err, 400, "invalid-field",
                               "%s: 'after' must hold work ids (1-128 characters of A-Z a-z 0-9 "
                               ". _ : @ - ~)",
                               where);
            }
            if (!hmap_put(&seen, json_string_value(a), a))
                it->after[k++] = xstrdup(json_string_value(a));
        }
        hmap_free(&seen);
    }
    json_t *anyway = json_object_get(o, "run_anyway");
    if (anyway && !json_is_boolean(anyway))
        return err_set(err, 400, "invalid-field", "%s: 'run_anyway' must be true or false", where);
    it->run_anyway = json_is_true(anyway);
    json_t *batch = json_object_get(o, "batch");
    if (batch && !json_is_null(batch)) {
        if (!json_is_string(batch) || !batch_id_valid(json_string_value(batch)))
            return err_set(err, 400, "invalid-field",
                           "%s: 'batch' must be a batch id (1-100 characters of A-Z a-z 0-9 . _ "
                           ": @ -)",
                           where);
        it->batch = xstrdup(json_string_value(batch));
    }
    return 0;
}

WARN_UNUSED static int parse_item(json_t *o, const char *where, const char *idem_key, int64_t now,
                                  const ParseLimits *lim, SubmitItem *it, Err *err)
{
    if (!json_is_object(o))
        return err_set(err, 400, "invalid-body", "%s must be a JSON object with a 'payload'",
                       where);
    static const char *const known[] = {"payload",     "id",         "queue", "key",
                                        "priority",    "run_at",     "delay", "max_attempts",
                                        "after",       "run_anyway", "batch", "timeout",
                                        "traceparent", "tracestate", NULL};
    if (parse_check_fields(o, known, where, err) != 0 ||
        item_payload(o, where, lim, it, err) != 0 || item_id(o, where, idem_key, it, err) != 0 ||
        item_place(o, where, it, err) != 0 || item_timing(o, where, now, lim, it, err) != 0 ||
        item_graph(o, where, it, err) != 0)
        return -1;
    return parse_trace(o, where, it, err);
}

bool batch_id_valid(const char *s)
{
    return id_valid(s) && strlen(s) <= 100;
}

void submit_batch_clear(SubmitBatch *b)
{
    free(b->id);
    if (b->callback) {
        template_clear(b->callback);
        free(b->callback);
    }
    memset(b, 0, sizeof *b);
}

/* What a schedule or a batch's callback submits, taken from a parsed item
 * (its strings and payload move; it is left without them). */
static void template_take(SubmitItem *it, WorkTemplate *t)
{
    t->queue = it->queue;
    t->key = it->key;
    t->priority = it->priority;
    t->payload = it->payload;
    t->timeout_ms = it->timeout_ms;
    t->max_attempts = it->max_attempts;
    it->queue = it->key = NULL;
    it->payload = NULL;
}

/* A batch's callback: a work item without id, run_at, after or batch. */
WARN_UNUSED static int parse_callback(json_t *o, int64_t now, const ParseLimits *lim,
                                      WorkTemplate **out, Err *err)
{
    if (json_is_object(o)) {
        static const char *const forbidden[] = {"id",    "run_at",      "delay",      "after",
                                                "batch", "traceparent", "tracestate", NULL};
        for (size_t i = 0; forbidden[i]; i++)
            if (json_object_get(o, forbidden[i]))
                return err_set(err, 400, "invalid-field",
                               "the batch's callback takes no '%s' (its id is "
                               "'<batch>~callback')",
                               forbidden[i]);
    }
    SubmitItem it = {0};
    int rc = parse_item(o, "the batch's callback", NULL, now, lim, &it, err);
    if (rc == 0) {
        *out = xcalloc(1, sizeof **out);
        template_take(&it, *out);
    }
    submit_items_free_one(&it);
    return rc;
}

int parse_submit(json_t *body, const char *idem_key, int64_t now, const ParseLimits *lim,
                 SubmitItem **items, size_t *n, bool *bulk, Err *err)
{
    SubmitBatch b = {0};
    int rc = parse_submit_batch(body, idem_key, now, lim, items, n, bulk, &b, err);
    submit_batch_clear(&b);
    return rc;
}

int parse_submit_batch(json_t *body, const char *idem_key, int64_t now, const ParseLimits *lim,
                       SubmitItem **items, size_t *n, bool *bulk, SubmitBatch *batch, Err *err)
{
    *items = NULL;
    *n = 0;
    if (batch)
        memset(batch, 0, sizeof *batch);
    if (batch && json_is_object(body) && json_object_get(body, "items")) {
        /* {"items": [...], "batch": {...}}: a bulk submission that opens a batch */
        static const char *const known[] = {"items", "batch", NULL};
        if (parse_check_fields(body, known, "the submission", err) != 0)
            return -1;
        json_t *list = json_object_get(body, "items"), *b = json_object_get(body, "batch");
        if (!json_is_array(list))
            return err_set(err, 400, "invalid-body", "'items' must be an array of work items");
        if (b && !json_is_null(b)) {
            static const char *const bknown[] = {"id", "callback", NULL};
            if (!json_is_object(b) || parse_check_fields(b, bknown, "'batch'", err) != 0)
                return err->status ? -1
                                   : err_set(err, 400, "invalid-field",
                                             "'batch' must be an object {id?, callback?}");
            json_t *id = json_object_get(b, "id");
            if (id && !(json_is_string(id) && batch_id_valid(json_string_value(id))))
                return err_set(err, 400, "invalid-field",
                               "the batch 'id' must be 1-100 characters of A-Z a-z 0-9 . _ : @ -");
            char gen[48];
            if (!id) {
                char uuid[37];
                id_generate(uuid);
                snprintf(gen, sizeof gen, "batch-%s", uuid);
            }
            batch->id = xstrdup(id ? json_string_value(id) : gen);
            json_t *cb = json_object_get(b, "callback");
            if (cb && !json_is_null(cb) &&
                parse_callback(cb, now, lim, &batch->callback, err) != 0) {
                submit_batch_clear(batch);
                return -1;
            }
        }
        if (parse_submit_batch(list, NULL, now, lim, items, n, bulk, NULL, err) != 0) {
            submit_batch_clear(batch);
            return -1;
        }
        for (size_t i = 0; batch->id && i < *n; i++)
            if (!(*items)[i].batch)
                (*items)[i].batch = xstrdup(batch->id);
        return 0;
    }
    *bulk = json_is_array(body);
    size_t count = *bulk ? json_array_size(body) : 1;
    if (*bulk && idem_key)
        return err_set(err, 400, "invalid-header",
                       "Idempotency-Key applies to one work item; give each item an 'id' instead");
    if (count == 0)
        return err_set(err, 400, "invalid-body", "the array of work items is empty");
    if (count > lim->max_batch)
        return err_set(err, 413, "batch-too-large",
                       "%zu work items in one request; the limit is %zu", count, lim->max_batch);
    SubmitItem *out = xcalloc(count, sizeof *out);
    for (size_t i = 0; i < count; i++) {
        char where[48];
        if (*bulk)
            snprintf(where, sizeof where, "item %zu", i);
        else
            snprintf(where, sizeof where, "the work item");
        if (parse_item(*bulk ? json_array_get(body, i) : body, where, idem_key, now, lim, &out[i],
                       err) != 0) {
            submit_items_free(out, count);
            return -1;
        }
    }
    *items = out;
    *n = count;
    return 0;
}

static void submit_items_free_one(SubmitItem *it)
{
    free(it->id);
    free(it->queue);
    free(it->key);
    json_decref(it->payload);
    strv_free(it->after);
    free(it->batch);
    free(it->traceparent);
    free(it->tracestate);
}

void submit_items_free(SubmitItem *items, size_t n)
{
    if (!items)
        return;
    for (size_t i = 0; i < n; i++)
        submit_items_free_one(&items[i]);
    free(items);
}

json_t *submit_json(const SubmitItem *items, size_t n, bool bulk, const char *batch_id,
                    const WorkTemplate *callback)
{
    json_t *arr = submit_items_json(items, n, bulk || batch_id);
    if (!batch_id)
        return arr;
    json_t *b = json_pack("{s:s}", "id", batch_id);
    if (callback) {
        json_t *cb = template_json(callback);
        json_object_set_new(cb, "timeout", json_real((double)callback->timeout_ms / 1000.0));
        json_object_del(cb, "timeout_ms");
        json_object_set_new(b, "callback", cb);
    }
    return json_pack("{s:o, s:o}", "items", arr, "batch", b);
}

json_t *submit_items_json(const SubmitItem *items, size_t n, bool bulk)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const SubmitItem *it = &items[i];
        json_t *o = json_pack("{s:s, s:s, s:i, s:O, s:f, s:i}", "id", it->id, "queue", it->queue,
                              "priority", it->priority, "payload", it->payload, "timeout",
                              (double)it->timeout_ms / 1000.0, "max_attempts", it->max_attempts);
        if (it->run_at) {
            char ts[40];
            time_format(it->run_at, ts, sizeof ts);
            json_object_set_new(o, "run_at", json_string(ts));
        }
        if (it->key)
            json_object_set_new(o, "key", json_string(it->key));
        if (it->after) {
            json_t *a = json_array();
            for (size_t j = 0; it->after[j]; j++)
                json_array_append_new(a, json_string(it->after[j]));
            json_object_set_new(o, "after", a);
        }
        if (it->run_anyway)
            json_object_set_new(o, "run_anyway", json_true());
        if (it->batch)
            json_object_set_new(o, "batch", json_string(it->batch));
        if (it->traceparent)
            json_object_set_new(o, "traceparent", json_string(it->traceparent));
        if (it->tracestate)
            json_object_set_new(o, "tracestate", json_string(it->tracestate));
        json_array_append_new(arr, o);
    }
    if (bulk)
        return arr;
    json_t *one = json_incref(json_array_get(arr, 0));
    json_decref(arr);
    return one;
}

WARN_UNUSED static int parse_queues(json_t *v, char ***out, Err *err)
{
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) > 64)
        return err_set(err, 400, "invalid-field", "'queues' must be an array of queue names");
    char **q = xcalloc(json_array_size(v) + 1, sizeof *q);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e) || !queue_name_valid(json_string_value(e))) {
            strv_free(q);
            return err_set(
                err, 400, "invalid-field",
                "'queues' must hold queue names (1-64 of A-Z a-z 0-9 _ . -, not . or ..)");
        }
        q[i] = xstrdup(json_string_value(e));
    }
    *out = q;
    return 0;
}

int parse_instance(json_t *body, char **out, Err *err)
{
    json_t *v = json_object_get(body, "instance");
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v) || !id_valid(json_string_value(v)))
        return err_set(err, 400, "invalid-field",
                       "'instance' must be 1-128 characters of A-Z a-z 0-9 . _ : @ -, not . or ..");
    *out = xstrdup(json_string_value(v));
    return 0;
}

int parse_heartbeat(json_t *body, HeartbeatMsg *out, Err *err)
{
    memset(out, 0, sizeof *out);
    static const char *const known[] = {"instance", "capacity", "queues", "running", NULL};
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body", "the heartbeat must be a JSON object");
    if (parse_check_fields(body, known, "the heartbeat", err) != 0 ||
        parse_instance(body, &out->instance, err) != 0)
        return -1;
    json_t *cap = json_object_get(body, "capacity");
    if (cap && (!json_is_integer(cap) || json_integer_value(cap) < 1 ||
                json_integer_value(cap) > 100000)) {
        free(out->instance);
        return err_set(err, 400, "invalid-field", "'capacity' must be an integer from 1 to 100000");
    }
    out->capacity = cap ? (int)json_integer_value(cap) : 1;
    if (parse_queues(json_object_get(body, "queues"), &out->queues, err) != 0) {
        free(out->instance);
        return -1;
    }
    /* Absent means "not said" (no reconciliation), not "runs nothing". */
    json_t *running = json_object_get(body, "running");
    bool ok = !running || (json_is_array(running) && json_array_size(running) <= 100000);
    size_t i;
    json_t *r;
    json_array_foreach(running, i, r)
    {
        json_t *id = json_object_get(r, "id"), *att = json_object_get(r, "attempt");
        ok = ok && json_is_object(r) && json_object_size(r) == 2 && json_is_string(id) &&
             work_id_valid(json_string_value(id)) && json_is_integer(att) &&
             json_integer_value(att) >= 1;
    }
    if (!ok) {
        free(out->instance);
        strv_free(out->queues);
        return err_set(err, 400, "invalid-field",
                       "'running' must be an array of {\"id\": WORK_ID, \"attempt\": N}");
    }
    if (running) {
        out->running = xcalloc(1, sizeof *out->running);
        out->running->as_of = wall_ms(); /* received now: it says what ran until now */
        out->running->n = json_array_size(running);
        out->running->items = xcalloc(out->running->n + 1, sizeof *out->running->items);
        json_array_foreach(running, i, r)
        {
            out->running->items[i].work_id = xstrdup(json_string_value(json_object_get(r, "id")));
            out->running->items[i].attempt = json_integer_value(json_object_get(r, "attempt"));
        }
    }
    return 0;
}

WARN_UNUSED static int reports_of(json_t *arr, size_t max_batch, Report **reports, size_t *n,
                                  Err *err);

int parse_pull(json_t *body, PullMsg *out, Err *err)
{
    memset(out, 0, sizeof *out);
    static const char *const known[] = {"instance", "max",     "wait", "queues",
                                        "peek",     "reports", NULL};
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body", "the pull must be a JSON object");
    if (parse_check_fields(body, known, "the pull", err) != 0)
        return -1;
    json_t *max = json_object_get(body, "max");
    if (max &&
        (!json_is_integer(max) || json_integer_value(max) < 1 || json_integer_value(max) > 10000))
        return err_set(err, 400, "invalid-field", "'max' must be an integer from 1 to 10000");
    out->max = max ? (int)json_integer_value(max) : 1;
    json_t *peek = json_object_get(body, "peek");
    if (peek && !json_is_boolean(peek))
        return err_set(err, 400, "invalid-field", "'peek' must be true or false");
    out->peek = json_is_true(peek);
    json_t *wait = json_object_get(body, "wait");
    if (wait && seconds_to_ms(wait, "", "wait", 3600 * 1000, true, &out->wait_ms, err) != 0)
        return -1;
    if (parse_instance(body, &out->instance, err) != 0)
        return -1;
    json_t *reports = json_object_get(body, "reports");
    if ((reports && !json_is_array(reports) &&
         err_set(err, 400, "invalid-field", "'reports' must be an array of reports") != 0) ||
        (reports && reports_of(reports, SIZE_MAX, &out->reports, &out->n_reports, err) != 0) ||
        parse_queues(json_object_get(body, "queues"), &out->queues, err) != 0) {
        free(out->instance);
        ws_reports_free(out->reports, out->n_reports);
        out->reports = NULL;
        out->n_reports = 0;
        return -1;
    }
    return 0;
}

WARN_UNUSED static int check_report(json_t *r, size_t i, Err *err)
{
    static const char *const known[] = {"id",    "attempt", "outcome", "result",
                                        "error", "retry",   NULL};
    if (!json_is_object(r))
        return err_set(err, 400, "invalid-body", "report %zu must be an object", i);
    char where[32];
    snprintf(where, sizeof where, "report %zu", i);
    if (parse_check_fields(r, known, where, err) != 0)
        return -1;
    json_t *id = json_object_get(r, "id"), *att = json_object_get(r, "attempt"),
           *outcome = json_object_get(r, "outcome");
    if (!json_is_string(id) || !work_id_valid(json_string_value(id)))
        return err_set(err, 400, "invalid-field", "report %zu: 'id' must be a work id", i);
    if (!json_is_integer(att) || json_integer_value(att) < 1 || json_integer_value(att) > 1000000)
        return err_set(err, 400, "invalid-field",
                       "report %zu: 'attempt' must be a positive integer", i);
    const char *o = json_string_value(outcome);
    if (!o || (strcmp(o, "completed") != 0 && strcmp(o, "failed") != 0))
        return err_set(err, 400, "invalid-field",
                       "report %zu: 'outcome' must be \"completed\" or \"failed\"", i);
    json_t *e = json_object_get(r, "error");
    if (e && !json_is_string(e))
        return err_set(err, 400, "invalid-field", "report %zu: 'error' must be a string", i);
    json_t *retry = json_object_get(r, "retry");
    if (retry && !json_is_boolean(retry))
        return err_set(err, 400, "invalid-field", "report %zu: 'retry' must be true or false", i);
    return 0;
}

/* A report checked by check_report, typed; its strings and result are new. */
static void report_of(json_t *r, Report *out)
{
    json_t *res = json_object_get(r, "result"), *e = json_object_get(r, "error"),
           *retry = json_object_get(r, "retry");
    *out = (Report){
        .work_id = xstrdup(json_string_value(json_object_get(r, "id"))),
        .attempt = (int)json_integer_value(json_object_get(r, "attempt")),
        .completed = !strcmp(json_string_value(json_object_get(r, "outcome")), "completed"),
        .result = res ? json_incref(res) : NULL,
        .error = e ? xstrdup(json_string_value(e)) : NULL,
        .retry = !retry || json_is_true(retry),
    };
}

/* The reports of arr (an array, at most max_batch), checked, as typed reports. */
WARN_UNUSED static int reports_of(json_t *arr, size_t max_batch, Report **reports, size_t *n,
                                  Err *err)
{
    if (json_array_size(arr) > max_batch)
        return err_set(err, 413, "batch-too-large", "%zu reports in one request; the limit is %zu",
                       json_array_size(arr), max_batch);
    size_t i;
    json_t *r;
    json_array_foreach(arr, i, r)
    {
        if (check_report(r, i, err) != 0)
            return -1;
    }
    *n = json_array_size(arr);
    *reports = xcalloc(*n + 1, sizeof **reports);
    json_array_foreach(arr, i, r)
    {
        report_of(r, &(*reports)[i]);
    }
    return 0;
}

int parse_reports(json_t *body, size_t max_batch, Report **reports, size_t *n, char **instance,
                  Err *err)
{
    *reports = NULL;
    *n = 0;
    *instance = NULL;
    static const char *const known[] = {"reports", "instance", NULL};
    json_t *arr = json_is_object(body) ? json_object_get(body, "reports") : NULL;
    if (!json_is_array(arr))
        return err_set(err, 400, "invalid-body", "the body must be {\"reports\": [...]}");
    if (parse_check_fields(body, known, "the body", err) != 0)
        return -1;
    if (reports_of(arr, max_batch, reports, n, err) != 0)
        return -1;
    if (parse_instance(body, instance, err) != 0) {
        ws_reports_free(*reports, *n);
        *reports = NULL;
        *n = 0;
        return -1;
    }
    return 0;
}

int parse_single_report(json_t *body, const char *work_id, const char *attempt, bool completed,
                        Report **reports, size_t *n, char **worker_id, char **instance, Err *err)
{
    *reports = NULL;
    *n = 0;
    *worker_id = NULL;
    *instance = NULL;
    static const char *const known_done[] = {"worker_id", "instance", "result", NULL};
    static const char *const known_fail[] = {"worker_id", "instance", "error", "retry", NULL};
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body", "the body must be a JSON object");
    if (parse_check_fields(body, completed ? known_done : known_fail, "the report", err) != 0)
        return -1;
    int64_t att;
    if (parse_seq(attempt, &att, err) != 0 || att < 1 || att > 1000000)
        return err_set(err, 400, "invalid-path",
                       "the attempt in the path must be a positive integer");
    json_t *w = json_object_get(body, "worker_id");
    if (w && (!json_is_string(w) || !id_valid(json_string_value(w))))
        return err_set(err, 400, "invalid-field", "'worker_id' must be a worker id");
    char *inst = NULL;
    if (parse_instance(body, &inst, err) != 0)
        return -1;
    /* Checked as one report of a batch would be, so that both read alike. */
    json_t *r = json_pack("{s:s, s:I, s:s}", "id", work_id, "attempt", (json_int_t)att, "outcome",
                          completed ? "completed" : "failed");
    if (completed) {
        json_t *res = json_object_get(body, "result");
        json_object_set(r, "result", res ? res : json_null());
    } else {
        json_t *e = json_object_get(body, "error"), *retry = json_object_get(body, "retry");
        if (e)
            json_object_set(r, "error", e);
        if (retry)
            json_object_set(r, "retry", retry);
    }
    if (check_report(r, 0, err) != 0) {
        json_decref(r);
        free(inst);
        return -1;
    }
    *reports = xcalloc(2, sizeof **reports);
    report_of(r, &(*reports)[0]);
    *n = 1;
    json_decref(r);
    *worker_id = xstrdup(w ? json_string_value(w) : "anonymous");
    *instance = inst;
    return 0;
}

int parse_seq(const char *s, int64_t *out, Err *err)
{
    char q[33];
    if (!s || !*s || strlen(s) > 19)
        return err_set(err, 400, "invalid-parameter", "'%s' is not a sequence number",
                       quoted(s ? s : "", q, sizeof q));
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p))
            return err_set(err, 400, "invalid-parameter", "'%s' is not a sequence number",
                           quoted(s, q, sizeof q));
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno)
        return err_set(err, 400, "invalid-parameter", "'%s' is out of range", s);
    *out = v;
    return 0;
}

int parse_wait(const char *s, int64_t max_ms, int64_t *out_ms, Err *err)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < 0)
        return err_set(err, 400, "invalid-parameter", "'wait' must be a number of seconds");
    double ms = v * 1000;
    *out_ms = ms > (double)max_ms ? max_ms : (int64_t)ms;
    return 0;
}

int parse_queue_limits(json_t *body, QueueLimits *out, int *set, Err *err)
{
    *set = 0;
    memset(out, 0, sizeof *out);
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body",
                       "the queue's limits must be a JSON object: {\"paused\", \"max_running\", "
                       "\"rate\": {\"limit\", \"per\"}}");
    static const char *const known[] = {"paused", "max_running", "max_running_per_key",
                                        "rate",   "key_weights", NULL};
    if (parse_check_fields(body, known, "the queue update", err) != 0)
        return -1;
    json_t *v = json_object_get(body, "paused");
    if (v) {
        if (!json_is_boolean(v))
            return err_set(err, 400, "invalid-field", "'paused' must be true or false");
        out->paused = json_is_true(v);
        *set |= QL_PAUSED;
    }
    v = json_object_get(body, "max_running");
    if (v) {
        if (!json_is_null(v) &&
            (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000))
            return err_set(err, 400, "invalid-field",
                           "'max_running' must be an integer from 1 to 1000000, or null for "
                           "no limit");
        out->max_running = json_is_null(v) ? 0 : (int)json_integer_value(v);
        *set |= QL_MAX_RUNNING;
    }
    v = json_object_get(body, "max_running_per_key");
    if (v) {
        if (!json_is_null(v) &&
            (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000))
            return err_set(err, 400, "invalid-field",
                           "'max_running_per_key' must be an integer from 1 to 1000000, or null "
                           "for no limit");
        out->max_running_per_key = json_is_null(v) ? 0 : (int)json_integer_value(v);
        *set |= QL_MAX_PER_KEY;
    }
    v = json_object_get(body, "rate");
    if (v) {
        if (!json_is_null(v)) {
            json_t *limit = json_object_get(v, "limit"), *per = json_object_get(v, "per");
            if (!json_is_object(v) || json_object_size(v) != 2 || !json_is_integer(limit) ||
                json_integer_value(limit) < 1 || json_integer_value(limit) > 1000000 ||
                !json_is_number(per) || json_number_value(per) < 0.001 ||
                json_number_value(per) > 86400)
                return err_set(err, 400, "invalid-field",
                               "'rate' must be {\"limit\": starts (1-1000000), \"per\": seconds "
                               "(0.001-86400)}, or null for no limit");
            out->rate_limit = (int)json_integer_value(limit);
            out->rate_period_ms = (int64_t)(json_number_value(per) * 1000.0 + 0.5);
        }
        *set |= QL_RATE;
    }
    v = json_object_get(body, "key_weights");
    if (v) {
        if (!json_is_null(v) && (!json_is_object(v) || json_object_size(v) > QL_MAX_WEIGHTS))
            return err_set(err, 400, "invalid-field",
                           "'key_weights' must be an object of at most %d keys and their "
                           "weights, or null for none",
                           QL_MAX_WEIGHTS);
        const char *k;
        json_t *w;
        json_object_foreach(v, k, w)
        {
            if (!id_valid(k))
                return err_set(err, 400, "invalid-field",
                               "'key_weights': a key must be 1-128 characters of A-Z a-z 0-9 . _ "
                               ": @ -");
            if (!json_is_integer(w) || json_integer_value(w) < 1 ||
                json_integer_value(w) > QL_MAX_WEIGHT)
                return err_set(err, 400, "invalid-field",
                               "'key_weights': the weight of '%s' must be an integer from 1 to %d",
                               k, QL_MAX_WEIGHT);
        }
        if (json_object_size(v)) {
            out->weights = xcalloc(json_object_size(v), sizeof *out->weights);
            json_object_foreach(v, k, w)
            {
                out->weights[out->n_weights].key = xstrdup(k);
                out->weights[out->n_weights++].weight = (int)json_integer_value(w);
            }
            queue_limits_sort(out);
        }
        *set |= QL_WEIGHTS;
    }
    if (!*set)
        return err_set(err, 400, "invalid-body",
                       "nothing to set: give 'paused', 'max_running', 'max_running_per_key', "
                       "'rate' or 'key_weights'");
    return 0;
}

int parse_bulk_filter(json_t *body, bool with_status, char **queue, char **key, char **status,
                      int *limit, Err *err)
{
    *queue = *key = *status = NULL;
    *limit = 1000;
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body",
                       "the filter must be a JSON object: {\"queue\", \"key\"%s, \"limit\"}",
                       with_status ? ", \"status\"" : "");
    static const char *const with[] = {"queue", "key", "status", "limit", NULL};
    static const char *const without[] = {"queue", "key", "limit", NULL};
    if (parse_check_fields(body, with_status ? with : without, "the filter", err) != 0)
        return -1;
    json_t *q = json_object_get(body, "queue"), *k = json_object_get(body, "key"),
           *st = json_object_get(body, "status"), *l = json_object_get(body, "limit");
    if (q && !(json_is_string(q) && queue_name_valid(json_string_value(q))))
        return err_set(err, 400, "invalid-field",
                       "'queue' must be 1-64 characters of A-Z a-z 0-9 _ . - (not . or ..)");
    if (k && !(json_is_string(k) && id_valid(json_string_value(k))))
        return err_set(err, 400, "invalid-field",
                       "'key' must be 1-128 characters of A-Z a-z 0-9 . _ : @ -");
    const char *sv = json_string_value(st);
    if (st &&
        !(sv && (!strcmp(sv, "pending") || !strcmp(sv, "scheduled") || !strcmp(sv, "running"))))
        return err_set(err, 400, "invalid-field",
                       "'status' must be pending, scheduled or running (open work)");
    if (l && (!json_is_integer(l) || json_integer_value(l) < 1 || json_integer_value(l) > 10000))
        return err_set(err, 400, "invalid-field", "'limit' must be an integer from 1 to 10000");
    *queue = q ? xstrdup(json_string_value(q)) : NULL;
    *key = k ? xstrdup(json_string_value(k)) : NULL;
    *status = sv ? xstrdup(sv) : NULL;
    *limit = l ? (int)json_integer_value(l) : 1000;
    return 0;
}

/* A schedule's 'work' (an object) into t: a work item without what each tick
 * decides itself (its id, time, parents, batch, trace context). */
WARN_UNUSED static int schedule_work(json_t *work, const ParseLimits *lim, WorkTemplate *t,
                                     Err *err)
{
    static const char *const forbidden[] = {"id",    "run_at",      "delay",      "after",
                                            "batch", "traceparent", "tracestate", NULL};
    for (size_t i = 0; forbidden[i]; i++)
        if (json_object_get(work, forbidden[i]))
            return err_set(err, 400, "invalid-field",
                           "a schedule's work takes no '%s' (each tick's id is '<name>~<tick>')",
                           forbidden[i]);
    SubmitItem it = {0};
    if (parse_item(work, "the schedule's work", NULL, 0, lim, &it, err) != 0) {
        submit_items_free_one(&it);
        return -1;
    }
    template_take(&it, t);
    submit_items_free_one(&it);
    return 0;
}

/* 'catch_up' (default last) and 'catch_up_max' (default 100) into s. */
WARN_UNUSED static int schedule_catch_up(json_t *body, ScheduleSpec *s, Err *err)
{
    json_t *cu = json_object_get(body, "catch_up");
    const char *cus = json_string_value(cu);
    s->catch_up = CATCHUP_LAST;
    if (cu) {
        if (cus && !strcmp(cus, "none"))
            s->catch_up = CATCHUP_NONE;
        else if (cus && !strcmp(cus, "last"))
            s->catch_up = CATCHUP_LAST;
        else if (cus && !strcmp(cus, "all"))
            s->catch_up = CATCHUP_ALL;
        else
            return err_set(err, 400, "invalid-field",
                           "'catch_up' must be \"none\", \"last\" or \"all\"");
    }
    s->catch_up_max = 100;
    json_t *cm = json_object_get(body, "catch_up_max");
    if (cm) {
        if (!json_is_integer(cm) || json_integer_value(cm) < 1 ||
            json_integer_value(cm) > SCHED_CATCH_UP_MAX)
            return err_set(err, 400, "invalid-field",
                           "'catch_up_max' must be an integer from 1 to %d", SCHED_CATCH_UP_MAX);
        s->catch_up_max = (int)json_integer_value(cm);
    }
    return 0;
}

ScheduleSpec *parse_schedule(json_t *body, const ParseLimits *lim, Err *err)
{
    if (!json_is_object(body)) {
        err_set(err, 400, "invalid-body", "a schedule is a JSON object with 'cron' and 'work'");
        return NULL;
    }
    static const char *const known[] = {"cron",     "timezone",     "work",   "overlap",
                                        "catch_up", "catch_up_max", "paused", NULL};
    if (parse_check_fields(body, known, "the schedule", err) != 0)
        return NULL;
    ScheduleSpec *s = xcalloc(1, sizeof *s);
    const char *cron = json_string_value(json_object_get(body, "cron"));
    json_t *tz = json_object_get(body, "timezone");
    json_t *work = json_object_get(body, "work");
    if (!cron) {
        err_set(err, 400, "missing-field", "the schedule lacks 'cron' (e.g. \"0 3 * * *\")");
        goto cleanup;
    }
    if (tz && !json_is_string(tz)) {
        err_set(err, 400, "invalid-field",
                "'timezone' must be an IANA zone name such as "
                "Europe/Berlin");
        goto cleanup;
    }
    if (cron_parse(cron, &s->cron, err) != 0 ||
        !(s->zone = tz_get(tz ? json_string_value(tz) : "UTC", err)))
        goto cleanup;
    s->cron_text = xstrdup(cron);
    s->tz = xstrdup(tz ? json_string_value(tz) : "UTC");
    if (!json_is_object(work)) {
        err_set(err, 400, "missing-field",
                "the schedule lacks 'work': the work item each tick submits (queue, payload, "
                "priority, key, timeout, max_attempts)");
        goto cleanup;
    }
    if (schedule_work(work, lim, &s->work, err) != 0)
        goto cleanup;
    const char *overlap = json_string_value(json_object_get(body, "overlap"));
    json_t *ov = json_object_get(body, "overlap");
    if (ov && !(overlap && (!strcmp(overlap, "skip") || !strcmp(overlap, "allow")))) {
        err_set(err, 400, "invalid-field", "'overlap' must be \"skip\" or \"allow\"");
        goto cleanup;
    }
    s->skip_overlap = !overlap || !strcmp(overlap, "skip");
    if (schedule_catch_up(body, s, err) != 0)
        goto cleanup;
    json_t *paused = json_object_get(body, "paused");
    if (paused && !json_is_boolean(paused)) {
        err_set(err, 400, "invalid-field", "'paused' must be true or false");
        goto cleanup;
    }
    s->paused = json_is_true(paused);
    return s;
cleanup:
    schedspec_free(s);
    return NULL;
}
