/* parse_hooks: see parse_hooks.h. */
#include "parse_hooks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "util.h"
#include "whsig.h"

/* The fields of one update in o (fraction, message, output: at least one),
 * into u; where names it in a refusal. */
WARN_UNUSED static int update_of(json_t *o, const char *where, ProgressUpdate *u, Err *err)
{
    json_t *f = json_object_get(o, "fraction"), *m = json_object_get(o, "message"),
           *out = json_object_get(o, "output");
    if (f && (!json_is_number(f) || !(json_number_value(f) >= 0.0 && json_number_value(f) <= 1.0)))
        return err_set(err, 400, "invalid-field", "%s: 'fraction' must be a number from 0 to 1",
                       where);
    if (m && (!json_is_string(m) || json_string_length(m) > PROGRESS_MESSAGE_MAX ||
              memchr(json_string_value(m), 0, json_string_length(m))))
        return err_set(err, 400, "invalid-field",
                       "%s: 'message' must be a string of at most %d bytes (no NUL)", where,
                       PROGRESS_MESSAGE_MAX);
    if (out && (!json_is_string(out) || memchr(json_string_value(out), 0, json_string_length(out))))
        return err_set(err, 400, "invalid-field",
                       "%s: 'output' must be a string (a chunk of partial output, no NUL)", where);
    if (!f && !m && !out)
        return err_set(err, 400, "invalid-body",
                       "%s needs at least one of 'fraction', 'message', 'output'", where);
    u->has_fraction = f != NULL;
    u->fraction = f ? json_number_value(f) : 0.0;
    u->message = m ? xstrdup(json_string_value(m)) : NULL;
    u->output = out ? xstrdup(json_string_value(out)) : NULL;
    return 0;
}

int parse_progress(json_t *body, const char *work_id, const char *attempt, ProgressUpdate **u,
                   size_t *n, char **worker_id, char **instance, Err *err)
{
    *u = NULL;
    *n = 0;
    *worker_id = *instance = NULL;
    static const char *const known[] = {"worker_id", "instance", "fraction",
                                        "message",   "output",   NULL};
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body", "the body must be a JSON object");
    if (parse_check_fields(body, known, "the progress report", err) != 0)
        return -1;
    int64_t att;
    if (parse_seq(attempt, &att, err) != 0 || att < 1 || att > 1000000)
        return err_set(err, 400, "invalid-path",
                       "the attempt in the path must be a positive integer");
    json_t *w = json_object_get(body, "worker_id");
    if (w && (!json_is_string(w) || !id_valid(json_string_value(w))))
        return err_set(err, 400, "invalid-field", "'worker_id' must be a worker id");
    ProgressUpdate one = {.work_id = xstrdup(work_id), .attempt = (int)att};
    if (update_of(body, "the progress report", &one, err) != 0 ||
        parse_instance(body, instance, err) != 0) {
        free(one.work_id);
        free(one.message);
        free(one.output);
        return -1;
    }
    *u = xcalloc(1, sizeof **u);
    **u = one;
    *n = 1;
    *worker_id = xstrdup(w ? json_string_value(w) : "anonymous");
    return 0;
}

int parse_progress_batch(json_t *body, size_t max_batch, ProgressUpdate **u, size_t *n,
                         char **instance, Err *err)
{
    *u = NULL;
    *n = 0;
    *instance = NULL;
    static const char *const known[] = {"progress", "instance", NULL};
    static const char *const known_update[] = {"id",      "attempt", "fraction",
                                               "message", "output",  NULL};
    json_t *arr = json_is_object(body) ? json_object_get(body, "progress") : NULL;
    if (!json_is_array(arr) || !json_array_size(arr))
        return err_set(err, 400, "invalid-body",
                       "the body must be {\"progress\": [...]} with at least one update");
    if (parse_check_fields(body, known, "the body", err) != 0)
        return -1;
    if (json_array_size(arr) > max_batch)
        return err_set(err, 413, "batch-too-large", "%zu updates in one request; the limit is %zu",
                       json_array_size(arr), max_batch);
    ProgressUpdate *out = xcalloc(json_array_size(arr) + 1, sizeof *out);
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o)
    {
        char where[48];
        snprintf(where, sizeof where, "progress[%zu]", i);
        json_t *id = json_object_get(o, "id"), *att = json_object_get(o, "attempt");
        if (!json_is_object(o)) {
            err_set(err, 400, "invalid-field", "%s must be an object", where);
            break;
        }
        if (parse_check_fields(o, known_update, where, err) != 0)
            break;
        if (!json_is_string(id) || !work_id_valid(json_string_value(id))) {
            err_set(err, 400, "invalid-field", "%s: 'id' must be a work id", where);
            break;
        }
        if (!json_is_integer(att) || json_integer_value(att) < 1 ||
            json_integer_value(att) > 1000000) {
            err_set(err, 400, "invalid-field", "%s: 'attempt' must be a positive integer", where);
            break;
        }
        out[i].work_id = xstrdup(json_string_value(id));
        out[i].attempt = (int)json_integer_value(att);
        if (update_of(o, where, &out[i], err) != 0)
            break;
    }
    if (i < json_array_size(arr) || parse_instance(body, instance, err) != 0) {
        progress_updates_free(out, json_array_size(arr));
        return -1;
    }
    *u = out;
    *n = i;
    return 0;
}

static bool url_ok(const char *u)
{
    size_t n = strlen(u);
    if (n > SUBSCRIPTION_URL_MAX)
        return false;
    size_t p = !strncmp(u, "http://", 7) ? 7 : !strncmp(u, "https://", 8) ? 8 : 0;
    if (!p || n == p)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)u[i] <= 0x20 || (unsigned char)u[i] >= 0x7f)
            return false;
    return true;
}

/* The host of an http(s) URL as written (no brackets around IPv6) into
 * host; false if it has none that fits. */
static bool url_host(const char *u, char *host, size_t n)
{
    const char *a = strstr(u, "://");
    if (!a)
        return false;
    a += 3;
    size_t len = strcspn(a, "/?#");
    for (const char *p = a; p < a + len; p++) /* after the user information */
        if (*p == '@') {
            len -= (size_t)(p + 1 - a);
            a = p + 1;
        }
    size_t h;
    if (*a == '[') {
        const char *close = memchr(a, ']', len);
        if (!close)
            return false;
        a++;
        h = (size_t)(close - a);
    } else {
        h = strcspn(a, ":/?#");
        h = h < len ? h : len;
    }
    if (h == 0 || h >= n)
        return false;
    memcpy(host, a, h);
    host[h] = '\0';
    return true;
}

/* 'queues': null or absent (every queue), or 1 to 64 queue names, into *out. */
WARN_UNUSED static int sub_queues(json_t *q, char ***out, Err *err)
{
    *out = NULL;
    if (!q || json_is_null(q))
        return 0;
    if (!json_is_array(q) || json_array_size(q) == 0 || json_array_size(q) > 64)
        return err_set(err, 400, "invalid-field",
                       "'queues' must be a list of 1 to 64 queue names, or null for every "
                       "queue");
    size_t i;
    json_t *v;
    json_array_foreach(q, i, v)
    {
        if (!json_is_string(v) || !queue_name_valid(json_string_value(v)))
            return err_set(err, 400, "invalid-field",
                           "'queues' item %zu is not a queue name (1-64 characters of A-Z "
                           "a-z 0-9 _ . -)",
                           i + 1);
    }
    *out = xcalloc(json_array_size(q) + 1, sizeof **out);
    json_array_foreach(q, i, v)
    {
        (*out)[i] = xstrdup(json_string_value(v));
    }
    return 0;
}

/* 'kinds': absent (all three) or a non-empty list of them, into *out in a
 * fixed order, each once. */
WARN_UNUSED static int sub_kinds(json_t *k, char ***out, Err *err)
{
    static const char *const kinds[] = {"completed", "dead", "cancelled"};
    *out = NULL;
    bool ok = !k || (json_is_array(k) && json_array_size(k) > 0);
    size_t i;
    json_t *v;
    json_array_foreach(k, i, v)
    {
        const char *s = json_string_value(v);
        bool known_kind = false;
        for (size_t j = 0; s && j < 3; j++)
            known_kind = known_kind || !strcmp(s, kinds[j]);
        ok = ok && known_kind;
    }
    if (!ok)
        return err_set(err, 400, "invalid-field",
                       "'kinds' must be a non-empty list of completed, dead, cancelled");
    *out = xcalloc(4, sizeof **out);
    size_t n = 0;
    for (size_t j = 0; j < 3; j++) {
        bool wanted = !k;
        json_array_foreach(k, i, v)
        {
            wanted = wanted || !strcmp(json_string_value(v), kinds[j]);
        }
        if (wanted)
            (*out)[n++] = xstrdup(kinds[j]);
    }
    return 0;
}

/* 'url': http(s), printable, and not inside the network unless allowed. */
WARN_UNUSED static int sub_url(const char *url, const NetPolicy *allow, Err *err)
{
    if (!url || !url_ok(url))
        return err_set(err, 400, "invalid-field",
                       "'url' must be an http:// or https:// URL of at most %d printable ASCII "
                       "characters",
                       SUBSCRIPTION_URL_MAX);
    char host[256], why[160];
    if (url_host(url, host, sizeof host) &&
        netpolicy_allows_text(allow, host, why, sizeof why) == 0)
        return err_set(err, 400, "internal-target",
                       "'url' points inside the network: %s; webhooks reach only public "
                       "addresses unless --webhook-allow-networks lists the network",
                       why);
    return 0;
}

int parse_subscription(json_t *body, const char *name, int shards, const NetPolicy *allow,
                       Subscription *out, bool *reset, Err *err)
{
    memset(out, 0, sizeof *out);
    *reset = false;
    static const char *const known[] = {"url",    "secret", "queues", "kinds",
                                        "paused", "after",  NULL};
    if (!json_is_object(body))
        return err_set(err, 400, "invalid-body", "the body must be a JSON object");
    if (parse_check_fields(body, known, "the subscription", err) != 0)
        return -1;
    const char *url = json_string_value(json_object_get(body, "url"));
    if (sub_url(url, allow, err) != 0)
        return -1;
    const char *secret = json_string_value(json_object_get(body, "secret"));
    unsigned char key[WHSIG_KEY_MAX];
    size_t keylen;
    if (!secret || whsig_key(secret, key, &keylen) != 0)
        return err_set(err, 400, "invalid-field",
                       "'secret' must be 'whsec_' and the base64 of %d to %d random bytes (for "
                       "example: echo whsec_$(openssl rand -base64 32))",
                       WHSIG_KEY_MIN, WHSIG_KEY_MAX);
    json_t *paused = json_object_get(body, "paused");
    json_t *after = json_object_get(body, "after");
    if (sub_queues(json_object_get(body, "queues"), &out->queues, err) != 0 ||
        sub_kinds(json_object_get(body, "kinds"), &out->kinds, err) != 0)
        goto cleanup;
    if (paused && !json_is_boolean(paused)) {
        err_set(err, 400, "invalid-field", "'paused' must be true or false");
        goto cleanup;
    }
    if (after && shards <= 1 && (!json_is_integer(after) || json_integer_value(after) < 0)) {
        err_set(err, 400, "invalid-field",
                "'after' must be an event seq (0: from the start of the kept history)");
        goto cleanup;
    }
    /* With several shards: an event id (a cursor's text), or a number as
     * the text of a cursor of shard 0's alone. */
    char num[24] = "";
    if (after && json_is_integer(after))
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(after));
    Err cerr = {0};
    if (after && shards > 1 &&
        ((!json_is_integer(after) && !json_is_string(after)) ||
         cursor_parse(json_is_string(after) ? json_string_value(after) : num, shards, &out->cursor,
                      &cerr) != 0)) {
        err_set(err, 400, "invalid-field",
                "'after' must be an event id: a seq per shard joined by '.', as GET "
                "/subscriptions shows a cursor (\"0\": from the start of the kept history)");
        goto cleanup;
    }
    out->name = xstrdup(name);
    out->url = xstrdup(url);
    out->secret = xstrdup(secret);
    out->paused = paused && json_is_true(paused);
    *reset = after != NULL;
    if (shards <= 1) {
        cursor_zero(&out->cursor, 1);
        out->cursor.seq[0] = after ? json_integer_value(after) : 0;
    } else if (!after) {
        cursor_zero(&out->cursor, shards);
    }
    return 0;
cleanup:
    subscription_clear(out);
    return -1;
}
