/* Tests of the validation of untrusted input (server/frontend/parse.c, and
 * head.c for a request's head): every refusal has the right status, names the
 * field in its message, and keeps the message valid UTF-8 (it becomes a
 * problem+json string). */
#include "ws_testlib.h"

#include "config.h"
#include "head.h"
#include "parse.h"

#define NOW T0 /* 2026-01-01T00:00:00Z */
#define HOUR_MS INT64_C(3600000)

static const ParseLimits LIM = {
    .max_batch = 5,
    .max_depth = 8,
    .default_timeout_ms = 60000,
    .default_max_attempts = 3,
};

/* ---- checking refusals ---- */

/* rc must be a refusal with status whose message names `names` (and `also`
 * when not NULL). */
static void expect_refusal(const char *what, int rc, const Err *err, int status, const char *names,
                           const char *also)
{
    CHECK(rc != 0, "%s should be refused with %d but was accepted", what, status);
    CHECK(err->status == status, "%s should be refused with %d, not %d (%s)", what, status,
          err->status, err->msg);
    CHECK(err->type[0], "the refusal of %s has no problem type", what);
    CHECK(strstr(err->msg, names), "refusing %s, the message \"%s\" should name %s", what, err->msg,
          names);
    CHECK(!also || strstr(err->msg, also), "refusing %s, the message \"%s\" should name %s", what,
          err->msg, also);
    json_t *s = json_string(err->msg);
    CHECK(s, "refusing %s, the message is not valid UTF-8, so problem+json cannot carry it", what);
    json_decref(s);
}

/* Parses text as a request body; the test's own bodies must be valid JSON. */
static json_t *body(const char *text)
{
    Err err;
    err_clear(&err);
    json_t *j = parse_json_body(text, strlen(text), LIM.max_depth, &err);
    CHECK(j, "the test body %s should parse but: %s", text, err.msg);
    return j;
}

/* ---- parse_json_body ---- */

/* len SIZE_MAX: the whole string. */
static void expect_body_refused(const char *what, const char *text, size_t len, const char *type,
                                const char *names)
{
    if (len == SIZE_MAX)
        len = strlen(text);
    Err err;
    err_clear(&err);
    json_t *j = parse_json_body(text, len, LIM.max_depth, &err);
    json_decref(j);
    expect_refusal(what, j ? 0 : -1, &err, 400, names, NULL);
    CHECK(!strcmp(err.type, type), "%s should be refused as %s, not %s", what, type, err.type);
}

static void expect_body_ok(const char *what, const char *text, size_t len)
{
    if (len == SIZE_MAX)
        len = strlen(text);
    Err err;
    err_clear(&err);
    json_t *j = parse_json_body(text, len, LIM.max_depth, &err);
    CHECK(j, "%s should parse but: %s", what, err.msg);
    json_decref(j);
}

static char *nested(size_t depth, bool closed)
{
    char *s = xcalloc(2 * depth + 2, 1);
    memset(s, '[', depth);
    s[depth] = '1';
    if (closed)
        memset(s + depth + 1, ']', depth);
    return s;
}

static void test_json_body(void **state)
{
    const size_t ALL = SIZE_MAX;
    expect_body_refused("an empty body", "", 0, "invalid-body", "empty");
    expect_body_refused("a cut body", "{\"payload\": ", ALL, "invalid-json", "not valid JSON");
    expect_body_refused("a trailing comma", "{\"payload\": 1,}", ALL, "invalid-json", "JSON");
    expect_body_refused("a second document", "[1] [2]", ALL, "invalid-json", "JSON");
    static const char *const bad_utf8[] = {
        "{\"payload\": \"\xff\"}",
        "{\"payload\": \"\xc0\xaf\"}",
        "{\"payload\": \"\xed\xa0\x80\"}",
        "{\"payload\": \"\xe2\x82\"}",
        "{\"\xfe\": 1}",
        "\xef\xbb\xbf{\"payload\": 1}",
    };
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof *bad_utf8; i++)
        expect_body_refused("invalid UTF-8", bad_utf8[i], ALL, "invalid-json", "JSON");
    /* jansson quotes the text near the error, and may cut a character in two. */
    expect_body_refused("an escaped multi-byte character", "[\"\\\xc3\xa9\"]", ALL, "invalid-json",
                        "JSON");
    expect_body_refused("a NUL character", "{\"payload\": \"a\\u0000b\"}", ALL, "invalid-json",
                        "JSON");
    /* Numbers jsonb would give back as integers beyond 64 bits (README). */
    expect_body_refused("a real of 2^63", "{\"payload\": 9.3e18}", ALL, "invalid-json",
                        "as a string");
    expect_body_refused("a deep real of -1e300", "[{\"payload\": [0, {\"x\": -1e300}]}]", ALL,
                        "invalid-json", "as a string");
    expect_body_refused("an integer past 64 bits", "{\"payload\": 9223372036854775808}", ALL,
                        "invalid-json", "as a string");
    expect_body_refused("duplicate keys", "{\"payload\": 1, \"payload\": 2}", ALL, "invalid-json",
                        "duplicate");
    expect_body_refused("duplicate keys inside the payload", "{\"payload\": {\"a\": 1, \"a\": 1}}",
                        ALL, "invalid-json", "duplicate");
    expect_body_ok("only the given length", "{\"payload\": 1}garbage", 14);
    expect_body_ok("a bare value", "5", ALL);

    char *s = nested(LIM.max_depth, true);
    expect_body_ok("nesting at the limit", s, ALL);
    free(s);
    s = nested(LIM.max_depth + 1, true);
    expect_body_refused("nesting past the limit", s, ALL, "invalid-body", "nested");
    free(s);
    /* Refused before parsing: the nesting is reported, not the missing brackets. */
    s = nested(100000, false);
    expect_body_refused("deep unclosed nesting", s, ALL, "invalid-body", "nested 100000");
    free(s);
    expect_body_ok("brackets inside strings", "{\"payload\": \"[[[[[[[[[[{{{{{{{{{{\"}", ALL);
    expect_body_ok("escaped quotes before brackets", "{\"payload\": \"\\\"[[[[[[[[[[[[\\\"\"}",
                   ALL);
    expect_body_refused("an escaped backslash before a real quote",
                        "{\"a\": \"\\\\\", \"b\": [[[[[[[[1]]]]]]]]}", ALL, "invalid-body",
                        "nested");
}

/* ---- parse_submit ---- */

typedef struct Parsed {
    SubmitItem *items;
    size_t n;
    bool bulk;
} Parsed;

static int submit(const char *text, const char *key, Parsed *p, Err *err)
{
    json_t *j = body(text);
    err_clear(err);
    int rc = parse_submit(j, key, NOW, &LIM, &p->items, &p->n, &p->bulk, err);
    json_decref(j);
    return rc;
}

/* Parses a submission that must be accepted with n items. */
static Parsed submit_ok(const char *text, const char *key, size_t n)
{
    Parsed p;
    Err err;
    CHECK(submit(text, key, &p, &err) == 0, "%s should be accepted but: %d %s", text, err.status,
          err.msg);
    CHECK(p.n == n, "%s should give %zu items, not %zu", text, n, p.n);
    return p;
}

static void expect_submit_refused(const char *text, const char *key, int status, const char *names,
                                  const char *also)
{
    Parsed p;
    Err err;
    int rc = submit(text, key, &p, &err);
    if (rc == 0)
        submit_items_free(p.items, p.n);
    expect_refusal(text, rc, &err, status, names, also);
    CHECK(!p.items && p.n == 0, "a refused submission should hand back no items");
}

static bool is_uuid_v4(const char *s)
{
    if (strlen(s) != 36)
        return false;
    for (size_t i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !strchr("0123456789abcdef", s[i]))
            return false;
    }
    return s[14] == '4' && strchr("89ab", s[19]);
}

static void test_submit_single_with_defaults(void **state)
{
    Parsed p = submit_ok("{\"payload\": {\"n\": 7}}", NULL, 1);
    const SubmitItem *it = &p.items[0];
    CHECK(!p.bulk, "a single object is not a bulk submission");
    CHECK(is_uuid_v4(it->id), "a missing id should be generated as a UUIDv4, not '%s'", it->id);
    json_t *want = J("{\"n\": 7}");
    CHECK(json_equal(it->payload, want), "the payload should be kept as given");
    json_decref(want);
    CHECK(!strcmp(it->queue, "default") && it->priority == 0 && it->run_at == 0 &&
              it->timeout_ms == LIM.default_timeout_ms &&
              it->max_attempts == LIM.default_max_attempts,
          "defaults: queue 'default', priority 0, now, the configured timeout and attempts");
    submit_items_free(p.items, p.n);

    p = submit_ok("{\"payload\": null}", NULL, 1);
    CHECK(json_is_null(p.items[0].payload), "a null payload is a payload");
    submit_items_free(p.items, p.n);
}

static void test_submit_with_every_field(void **state)
{
    Parsed p = submit_ok("{\"id\": \"job-1\", \"queue\": \"images.v2\", \"priority\": 5, "
                         "\"payload\": 1, \"run_at\": \"2026-01-01T01:00:00Z\", "
                         "\"timeout\": 2.5, \"max_attempts\": 7}",
                         NULL, 1);
    const SubmitItem *it = &p.items[0];
    CHECK(!strcmp(it->id, "job-1") && !strcmp(it->queue, "images.v2") && it->priority == 5 &&
              it->run_at == NOW + HOUR_MS && it->timeout_ms == 2500 && it->max_attempts == 7,
          "every field should be read as given");
    submit_items_free(p.items, p.n);
}

static void test_submit_bulk(void **state)
{
    Parsed p =
        submit_ok("[{\"payload\": 1}, {\"payload\": 2, \"id\": \"b\", \"delay\": 2}]", NULL, 2);
    CHECK(p.bulk, "an array is a bulk submission");
    CHECK(is_uuid_v4(p.items[0].id) && !strcmp(p.items[1].id, "b"),
          "bulk items keep their ids or get generated ones");
    CHECK(p.items[0].run_at == 0 && p.items[1].run_at == NOW + 2000,
          "each bulk item has its own delay");
    submit_items_free(p.items, p.n);
    expect_submit_refused("[{\"payload\": 1}, {\"payload\": 1, \"priority\": \"x\"}]", NULL, 400,
                          "item 1", "'priority'");
    expect_submit_refused("[{\"payload\": 1}, 5]", NULL, 400, "item 1", "'payload'");
    expect_submit_refused("[]", NULL, 400, "empty", NULL);
    p = submit_ok("[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3}, {\"payload\": 4}, "
                  "{\"payload\": 5}]",
                  NULL, 5);
    submit_items_free(p.items, p.n);
    expect_submit_refused("[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3}, "
                          "{\"payload\": 4}, {\"payload\": 5}, {\"payload\": 6}]",
                          NULL, 413, "limit is 5", NULL);
}

static void test_submit_refusals(void **state)
{
    static const struct {
        const char *body, *names, *also;
    } bad[] = {
        {"{\"id\": \"x\"}", "'payload'", NULL},
        {"5", "'payload'", NULL},
        {"{\"payload\": 1, \"colour\": \"red\"}", "'colour'", NULL},
        {"{\"payload\": 1, \"Payload\": 1}", "'Payload'", NULL},
        {"{\"payload\": 1, \"id\": \"\"}", "'id'", NULL},
        {"{\"payload\": 1, \"id\": \"has space\"}", "'id'", NULL},
        {"{\"payload\": 1, \"id\": \"a/b\"}", "'id'", NULL},
        {"{\"payload\": 1, \"id\": 5}", "'id'", NULL},
        {"{\"payload\": 1, \"queue\": \"\"}", "'queue'", NULL},
        {"{\"payload\": 1, \"queue\": \"a b\"}", "'queue'", NULL},
        {"{\"payload\": 1, \"queue\": \"a:b\"}", "'queue'", NULL},
        {"{\"payload\": 1, \"queue\": \"caf\\u00e9\"}", "'queue'", NULL},
        {"{\"payload\": 1, \"queue\": 5}", "'queue'", NULL},
        {"{\"payload\": 1, \"priority\": 1000001}", "'priority'", NULL},
        {"{\"payload\": 1, \"priority\": -1000001}", "'priority'", NULL},
        {"{\"payload\": 1, \"priority\": 1.5}", "'priority'", NULL},
        {"{\"payload\": 1, \"priority\": \"1\"}", "'priority'", NULL},
        {"{\"payload\": 1, \"priority\": true}", "'priority'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T00:00:00\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"tomorrow\"}", "'run_at'", "tomorrow"},
        {"{\"payload\": 1, \"run_at\": \"2026-13-01T00:00:00Z\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T25:00:00Z\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T00:61:00Z\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T00:00:00+0100\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T00:00:00.Z\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T00:00:00Z junk\"}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": 1767225600000}", "'run_at'", NULL},
        {"{\"payload\": 1, \"run_at\": \"2027-01-03T00:00:00Z\"}", "'run_at'", "year"},
        {"{\"payload\": 1, \"delay\": -1}", "'delay'", NULL},
        {"{\"payload\": 1, \"delay\": \"5\"}", "'delay'", NULL},
        {"{\"payload\": 1, \"delay\": 31622401}", "'delay'", NULL},
        {"{\"payload\": 1, \"delay\": 5, \"run_at\": \"2026-01-01T01:00:00Z\"}", "'run_at'",
         "'delay'"},
        {"{\"payload\": 1, \"timeout\": 0}", "'timeout'", NULL},
        {"{\"payload\": 1, \"timeout\": -1}", "'timeout'", NULL},
        {"{\"payload\": 1, \"timeout\": 604801}", "'timeout'", NULL},
        {"{\"payload\": 1, \"timeout\": \"10\"}", "'timeout'", NULL},
        {"{\"payload\": 1, \"timeout\": null}", "'timeout'", NULL},
        {"{\"payload\": 1, \"max_attempts\": 0}", "'max_attempts'", NULL},
        {"{\"payload\": 1, \"max_attempts\": 1001}", "'max_attempts'", NULL},
        {"{\"payload\": 1, \"max_attempts\": 2.0}", "'max_attempts'", NULL},
        {"{\"payload\": 1, \"max_attempts\": \"3\"}", "'max_attempts'", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_submit_refused(bad[i].body, NULL, 400, bad[i].names, bad[i].also);

    char long_id[200];
    snprintf(long_id, sizeof long_id, "{\"payload\": 1, \"id\": \"%0129d\"}", 0);
    expect_submit_refused(long_id, NULL, 400, "'id'", NULL);
    char long_queue[200];
    snprintf(long_queue, sizeof long_queue, "{\"payload\": 1, \"queue\": \"%065d\"}", 0);
    expect_submit_refused(long_queue, NULL, 400, "'queue'", NULL);
}

static void test_submit_bounds_and_times(void **state)
{
    static const struct {
        const char *body;
        int64_t run_at, timeout_ms;
        int priority, max_attempts;
    } good[] = {
        {"{\"payload\": 1, \"priority\": -1000000}", 0, 60000, -1000000, 3},
        {"{\"payload\": 1, \"priority\": 1000000}", 0, 60000, 1000000, 3},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T02:00:00+01:00\"}", NOW + HOUR_MS, 60000, 0, 3},
        {"{\"payload\": 1, \"run_at\": \"2025-12-31T20:00:00-05:00\"}", NOW + HOUR_MS, 60000, 0, 3},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T05:30:00+05:30\"}", NOW, 60000, 0, 3},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01T00:00:00.25Z\"}", NOW + 250, 60000, 0, 3},
        {"{\"payload\": 1, \"run_at\": \"2026-01-01t01:00:00.123456z\"}", NOW + HOUR_MS + 123,
         60000, 0, 3},
        {"{\"payload\": 1, \"run_at\": \"2020-01-01T00:00:00Z\"}", INT64_C(1577836800000), 60000, 0,
         3},
        {"{\"payload\": 1, \"delay\": 0}", 0, 60000, 0, 3},
        {"{\"payload\": 1, \"delay\": 1.5}", NOW + 1500, 60000, 0, 3},
        {"{\"payload\": 1, \"delay\": 31622400}", NOW + 366 * 24 * HOUR_MS, 60000, 0, 3},
        {"{\"payload\": 1, \"timeout\": 604800}", 0, 604800000, 0, 3},
        {"{\"payload\": 1, \"timeout\": 0.0001}", 0, 1, 0, 3},
        {"{\"payload\": 1, \"timeout\": 3}", 0, 3000, 0, 3},
        {"{\"payload\": 1, \"max_attempts\": 1}", 0, 60000, 0, 1},
        {"{\"payload\": 1, \"max_attempts\": 1000}", 0, 60000, 0, 1000},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        Parsed p = submit_ok(good[i].body, NULL, 1);
        const SubmitItem *it = &p.items[0];
        CHECK(it->run_at == good[i].run_at && it->timeout_ms == good[i].timeout_ms &&
                  it->priority == good[i].priority && it->max_attempts == good[i].max_attempts,
              "%s should give run_at %lld, timeout %lld ms, priority %d, %d attempts; "
              "it gives %lld, %lld, %d, %d",
              good[i].body, (long long)good[i].run_at, (long long)good[i].timeout_ms,
              good[i].priority, good[i].max_attempts, (long long)it->run_at,
              (long long)it->timeout_ms, it->priority, it->max_attempts);
        submit_items_free(p.items, p.n);
    }
    char text[300];
    snprintf(text, sizeof text, "{\"payload\": 1, \"id\": \"a%0127d\", \"queue\": \"q%063d\"}", 0,
             0);
    Parsed p = submit_ok(text, NULL, 1);
    CHECK(strlen(p.items[0].id) == 128 && strlen(p.items[0].queue) == 64,
          "a 128-character id and a 64-character queue are allowed");
    submit_items_free(p.items, p.n);
}

static void test_idempotency_key(void **state)
{
    Parsed p = submit_ok("{\"payload\": 1}", "order-42", 1);
    CHECK(!strcmp(p.items[0].id, "order-42"), "the Idempotency-Key should become the id, not '%s'",
          p.items[0].id);
    submit_items_free(p.items, p.n);
    p = submit_ok("{\"payload\": 1, \"id\": \"order-42\"}", "order-42", 1);
    submit_items_free(p.items, p.n);
    expect_submit_refused("{\"payload\": 1, \"id\": \"order-42\"}", "order-43", 400,
                          "Idempotency-Key", "'id'");
    expect_submit_refused("{\"payload\": 1}", "bad key", 400, "Idempotency-Key", NULL);
    expect_submit_refused("{\"payload\": 1}", "", 400, "Idempotency-Key", NULL);
    expect_submit_refused("[{\"payload\": 1}]", "order-42", 400, "Idempotency-Key", NULL);
}

static void test_generated_ids_are_unique(void **state)
{
    enum { N = 200 };
    char *ids[N];
    for (size_t i = 0; i < N; i++) {
        Parsed p = submit_ok("{\"payload\": 1}", NULL, 1);
        ids[i] = xstrdup(p.items[0].id);
        submit_items_free(p.items, p.n);
    }
    Parsed bulk = submit_ok("[{\"payload\": 1}, {\"payload\": 1}, {\"payload\": 1}]", NULL, 3);
    for (size_t i = 0; i < N + 3; i++) {
        const char *a = i < N ? ids[i] : bulk.items[i - N].id;
        CHECK(is_uuid_v4(a), "generated id '%s' is not a UUIDv4", a);
        for (size_t j = 0; j < i; j++) {
            const char *b = j < N ? ids[j] : bulk.items[j - N].id;
            CHECK(strcmp(a, b) != 0, "the id '%s' was generated twice", a);
        }
    }
    for (size_t i = 0; i < N; i++)
        free(ids[i]);
    submit_items_free(bulk.items, bulk.n);
}

/* submit_items_json is what a front-end forwards to the leader: parsing it
 * again must give the same items. */
static void expect_forwarded_same(const char *text)
{
    Parsed a, b;
    Err err;
    CHECK(submit(text, NULL, &a, &err) == 0, "%s should be accepted but: %s", text, err.msg);
    json_t *fwd = submit_items_json(a.items, a.n, a.bulk);
    CHECK(a.bulk ? json_is_array(fwd) : json_is_object(fwd),
          "the forwarded form of %s should keep its shape (object or array)", text);
    char *fwd_text = jtext(fwd);
    json_decref(fwd);
    CHECK(submit(fwd_text, NULL, &b, &err) == 0, "the forwarded form %s is refused: %s", fwd_text,
          err.msg);
    CHECK(a.n == b.n && a.bulk == b.bulk, "forwarding %s changed the number of items", text);
    for (size_t i = 0; i < a.n; i++) {
        const SubmitItem *x = &a.items[i], *y = &b.items[i];
        CHECK(!strcmp(x->id, y->id) && !strcmp(x->queue, y->queue) && x->priority == y->priority &&
                  json_equal(x->payload, y->payload) && x->run_at == y->run_at &&
                  x->timeout_ms == y->timeout_ms && x->max_attempts == y->max_attempts,
              "item %zu of %s changed when forwarded as %s (run_at %lld vs %lld, timeout %lld vs "
              "%lld)",
              i, text, fwd_text, (long long)x->run_at, (long long)y->run_at,
              (long long)x->timeout_ms, (long long)y->timeout_ms);
    }
    free(fwd_text);
    submit_items_free(a.items, a.n);
    submit_items_free(b.items, b.n);
}

static void test_forwarded_items_parse_the_same(void **state)
{
    expect_forwarded_same("{\"id\": \"a\", \"queue\": \"q\", \"priority\": -7, "
                          "\"payload\": {\"x\": [1, \"y\", 2.5, null]}, "
                          "\"run_at\": \"2026-01-01T00:00:01.234Z\", \"timeout\": 1.234, "
                          "\"max_attempts\": 9}");
    expect_forwarded_same("{\"payload\": \"plain\"}");
    expect_forwarded_same("[{\"payload\": 1, \"delay\": 0.001}, {\"payload\": 2, \"timeout\": "
                          "0.001}, {\"payload\": 3, \"timeout\": 604800, \"delay\": 31622400}, "
                          "{\"payload\": 4, \"run_at\": \"2020-02-29T23:59:59.999Z\"}, "
                          "{\"payload\": 5, \"timeout\": 1234.567}]");
}

/* ---- workers ---- */

static void heartbeat_free(HeartbeatMsg *m)
{
    free(m->instance);
    strv_free(m->queues);
    ws_running_free(m->running);
}

static int heartbeat(const char *text, HeartbeatMsg *m, Err *err)
{
    json_t *j = body(text);
    err_clear(err);
    int rc = parse_heartbeat(j, m, err);
    json_decref(j);
    return rc;
}

static void test_heartbeat(void **state)
{
    HeartbeatMsg m;
    Err err;
    CHECK(heartbeat("{\"instance\": \"i-1\", \"capacity\": 4, \"queues\": [\"a\", \"b\"], "
                    "\"running\": [{\"id\": \"x\", \"attempt\": 1}]}",
                    &m, &err) == 0,
          "a full heartbeat was refused: %s", err.msg);
    CHECK(!strcmp(m.instance, "i-1") && m.capacity == 4 && strv_len(m.queues) == 2 &&
              !strcmp(m.queues[1], "b") && m.running && m.running->n == 1 &&
              !strcmp(m.running->items[0].work_id, "x") && m.running->items[0].attempt == 1,
          "a heartbeat should carry instance, capacity, queues and running");
    heartbeat_free(&m);
    CHECK(heartbeat("{}", &m, &err) == 0, "an empty heartbeat was refused: %s", err.msg);
    CHECK(!m.instance && m.capacity == 1 && !m.queues && !m.running,
          "heartbeat defaults: no instance, capacity 1, every queue, and no 'running' (not "
          "said, so nothing is reconciled)");
    heartbeat_free(&m);
    CHECK(heartbeat("{\"running\": []}", &m, &err) == 0 && m.running && m.running->n == 0,
          "an empty 'running' says the worker runs nothing");
    heartbeat_free(&m);
    CHECK(heartbeat("{\"queues\": []}", &m, &err) == 0 && m.queues && !m.queues[0],
          "an empty queue list means every queue");
    heartbeat_free(&m);

    static const struct {
        const char *body, *names;
    } bad[] = {
        {"[]", "object"},
        {"{\"instance\": \"\"}", "'instance'"},
        {"{\"instance\": 5}", "'instance'"},
        {"{\"instance\": \"a b\"}", "'instance'"},
        {"{\"instance\": \"i\", \"capacity\": 0}", "'capacity'"},
        {"{\"instance\": \"i\", \"capacity\": 100001}", "'capacity'"},
        {"{\"instance\": \"i\", \"capacity\": \"2\"}", "'capacity'"},
        {"{\"instance\": \"i\", \"capacity\": 1.5}", "'capacity'"},
        {"{\"instance\": \"i\", \"queues\": \"a\"}", "'queues'"},
        {"{\"instance\": \"i\", \"queues\": [1]}", "'queues'"},
        {"{\"instance\": \"i\", \"queues\": [\"a\", \"a b\"]}", "'queues'"},
        {"{\"instance\": \"i\", \"queues\": [\"a\"], \"running\": {}}", "'running'"},
        {"{\"running\": [5]}", "'running'"},
        {"{\"running\": [{\"id\": \"x\"}]}", "'running'"},
        {"{\"running\": [{\"id\": \"x\", \"attempt\": 0}]}", "'running'"},
        {"{\"running\": [{\"id\": \"x y\", \"attempt\": 1}]}", "'running'"},
        {"{\"running\": [{\"id\": \"x\", \"attempt\": \"1\"}]}", "'running'"},
        {"{\"instance\": \"i\", \"capacty\": 2}", "'capacty'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_refusal(bad[i].body, heartbeat(bad[i].body, &m, &err), &err, 400, bad[i].names,
                       NULL);
    SBuf many;
    sbuf_init(&many);
    sbuf_puts(&many, "{\"queues\": [");
    for (int i = 0; i < 65; i++)
        sbuf_printf(&many, "%s\"q%d\"", i ? ", " : "", i);
    sbuf_puts(&many, "]}");
    expect_refusal("65 queues", heartbeat(many.data, &m, &err), &err, 400, "'queues'", NULL);
    sbuf_free(&many);
}

static void pull_free(PullMsg *m)
{
    free(m->instance);
    strv_free(m->queues);
    ws_reports_free(m->reports, m->n_reports);
}

static int pull(const char *text, PullMsg *m, Err *err)
{
    json_t *j = body(text);
    err_clear(err);
    int rc = parse_pull(j, m, err);
    json_decref(j);
    return rc;
}

static void test_pull(void **state)
{
    PullMsg m;
    Err err;
    CHECK(pull("{\"instance\": \"i\", \"max\": 4, \"wait\": 2.5, \"queues\": [\"a\"]}", &m, &err) ==
              0,
          "a full pull was refused: %s", err.msg);
    CHECK(!strcmp(m.instance, "i") && m.max == 4 && m.wait_ms == 2500 && strv_len(m.queues) == 1,
          "a pull should carry instance, max, wait and queues");
    CHECK(m.n_reports == 0 && !m.reports, "a pull without reports carries none");
    pull_free(&m);
    CHECK(pull("{\"max\": 2, \"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": "
               "\"completed\", \"result\": 7}, {\"id\": \"b\", \"attempt\": 2, \"outcome\": "
               "\"failed\", \"error\": \"boom\", \"retry\": false}]}",
               &m, &err) == 0,
          "a pull carrying reports was refused: %s", err.msg);
    CHECK(m.n_reports == 2 && !strcmp(m.reports[0].work_id, "a") && m.reports[1].attempt == 2 &&
              !m.reports[1].retry,
          "the exchange's reports should be read as the reports route reads them");
    pull_free(&m);
    CHECK(pull("{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"done\"}]}", &m,
               &err) != 0 &&
              err.status == 400 && strstr(err.msg, "report 0"),
          "a bad report in a pull should be refused naming it, got %d %s", err.status, err.msg);
    CHECK(pull("{\"reports\": {}}", &m, &err) != 0 && err.status == 400,
          "'reports' that is not an array should be refused");
    CHECK(pull("{}", &m, &err) == 0, "an empty pull was refused: %s", err.msg);
    CHECK(!m.instance && m.max == 1 && m.wait_ms == 0 && !m.queues,
          "pull defaults: no instance, one job, no wait, every queue");
    pull_free(&m);
    CHECK(pull("{\"max\": 10000, \"wait\": 3600}", &m, &err) == 0 && m.max == 10000 &&
              m.wait_ms == 3600000,
          "the largest pull (10000 jobs, an hour) is allowed");
    pull_free(&m);
    static const struct {
        const char *body, *names;
    } bad[] = {
        {"5", "object"},
        {"{\"max\": 0}", "'max'"},
        {"{\"max\": 10001}", "'max'"},
        {"{\"max\": \"1\"}", "'max'"},
        {"{\"wait\": -1}", "'wait'"},
        {"{\"wait\": 3601}", "'wait'"},
        {"{\"wait\": \"5\"}", "'wait'"},
        {"{\"instance\": \"a/b\"}", "'instance'"},
        {"{\"instance\": \"i\", \"queues\": [\"\"]}", "'queues'"},
        {"{\"instance\": \"i\", \"queues\": {}}", "'queues'"},
        {"{\"max\": 1, \"wiat\": 5}", "'wiat'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_refusal(bad[i].body, pull(bad[i].body, &m, &err), &err, 400, bad[i].names, NULL);
}

/* ---- reports ---- */

/* Typed reports as the JSON a worker would send for them (NULL for none):
 * "result" and "error" when set, "retry" when false. */
static json_t *reports_json(const Report *reps, size_t n)
{
    if (!reps)
        return NULL;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const Report *r = &reps[i];
        json_t *o = json_pack("{s:s, s:i, s:s}", "id", r->work_id, "attempt", r->attempt, "outcome",
                              r->completed ? "completed" : "failed");
        if (r->result)
            json_object_set(o, "result", r->result);
        if (r->error)
            json_object_set_new(o, "error", json_string(r->error));
        if (!r->retry)
            json_object_set_new(o, "retry", json_false());
        json_array_append_new(arr, o);
    }
    return arr;
}

/* parse_reports, its typed reports seen as JSON in *out (NULL when refused). */
static int reports(const char *text, json_t **out, Err *err)
{
    json_t *j = body(text);
    err_clear(err);
    char *instance = NULL;
    Report *reps = NULL;
    size_t n = 0;
    int rc = parse_reports(j, LIM.max_batch, &reps, &n, &instance, err);
    *out = reports_json(reps, n);
    ws_reports_free(reps, n);
    free(instance);
    json_decref(j);
    return rc;
}

static void test_reports(void **state)
{
    const char *text = "{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"completed\", "
                       "\"result\": {\"x\": 1}}, {\"id\": \"b\", \"attempt\": 2, \"outcome\": "
                       "\"failed\", \"error\": \"boom\", \"retry\": false}]}";
    json_t *out;
    Err err;
    CHECK(reports(text, &out, &err) == 0, "valid reports were refused: %s", err.msg);
    json_t *want = J(text);
    check_json_equal("the validated reports", json_object_get(want, "reports"), out);
    json_decref(want);
    json_decref(out);
    CHECK(reports("{\"reports\": []}", &out, &err) == 0 && json_array_size(out) == 0,
          "an empty list of reports is fine");
    json_decref(out);

    static const struct {
        const char *body, *names, *also;
        int status;
    } bad[] = {
        {"[]", "reports", NULL, 400},
        {"{}", "reports", NULL, 400},
        {"{\"reports\": {}}", "reports", NULL, 400},
        {"{\"reports\": [5]}", "report 0", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"completed\"}, "
         "{\"id\": \"b c\", \"attempt\": 1, \"outcome\": \"completed\"}]}",
         "report 1", "'id'", 400},
        {"{\"reports\": [{\"attempt\": 1, \"outcome\": \"completed\"}]}", "'id'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 0, \"outcome\": \"completed\"}]}",
         "'attempt'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": \"1\", \"outcome\": \"completed\"}]}",
         "'attempt'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1000001, \"outcome\": \"failed\"}]}",
         "'attempt'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"done\"}]}", "'outcome'",
         NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1}]}", "'outcome'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"failed\", \"error\": 5}]}",
         "'error'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"failed\", "
         "\"retry\": \"yes\"}]}",
         "'retry'", NULL, 400},
        {"{\"reports\": [{\"id\": \"a\", \"attempt\": 1, \"outcome\": \"completed\", "
         "\"reslt\": 1}]}",
         "report 0", "'reslt'", 400},
        {"{\"reports\": [], \"worker\": \"w\"}", "'worker'", NULL, 400},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_refusal(bad[i].body, reports(bad[i].body, &out, &err), &err, bad[i].status,
                       bad[i].names, bad[i].also);
    SBuf many;
    sbuf_init(&many);
    sbuf_puts(&many, "{\"reports\": [");
    for (int i = 0; i < 6; i++)
        sbuf_printf(&many, "%s{\"id\": \"j%d\", \"attempt\": 1, \"outcome\": \"completed\"}",
                    i ? ", " : "", i);
    sbuf_puts(&many, "]}");
    expect_refusal("6 reports", reports(many.data, &out, &err), &err, 413, "limit is 5", NULL);
    sbuf_free(&many);
}

static int single(const char *text, const char *id, const char *attempt, bool completed,
                  json_t **out, char **worker, Err *err)
{
    json_t *j = body(text);
    err_clear(err);
    char *instance = NULL;
    Report *reps = NULL;
    size_t n = 0;
    int rc = parse_single_report(j, id, attempt, completed, &reps, &n, worker, &instance, err);
    *out = reports_json(reps, n);
    ws_reports_free(reps, n);
    free(instance);
    json_decref(j);
    return rc;
}

static void expect_single(const char *text, bool completed, const char *want_reports,
                          const char *want_worker)
{
    json_t *out;
    char *worker;
    Err err;
    CHECK(single(text, "job-1", "3", completed, &out, &worker, &err) == 0,
          "the single report %s was refused: %s", text, err.msg);
    json_t *want = J(want_reports);
    check_json_equal(text, want, out);
    CHECK(!strcmp(worker, want_worker), "the report %s should come from %s, not %s", text,
          want_worker, worker);
    json_decref(want);
    json_decref(out);
    free(worker);
}

static void test_single_report(void **state)
{
    expect_single("{\"worker_id\": \"w1\", \"result\": {\"sq\": 49}}", true,
                  "[{\"id\": \"job-1\", \"attempt\": 3, \"outcome\": \"completed\", "
                  "\"result\": {\"sq\": 49}}]",
                  "w1");
    expect_single("{}", true,
                  "[{\"id\": \"job-1\", \"attempt\": 3, \"outcome\": \"completed\", "
                  "\"result\": null}]",
                  "anonymous");
    expect_single("{\"worker_id\": \"w1\", \"error\": \"boom\", \"retry\": false}", false,
                  "[{\"id\": \"job-1\", \"attempt\": 3, \"outcome\": \"failed\", "
                  "\"error\": \"boom\", \"retry\": false}]",
                  "w1");
    expect_single("{}", false, "[{\"id\": \"job-1\", \"attempt\": 3, \"outcome\": \"failed\"}]",
                  "anonymous");

    static const struct {
        const char *body, *id, *attempt, *names;
        bool completed;
    } bad[] = {
        {"[]", "job-1", "1", "object", true},
        {"{}", "job-1", "0", "attempt", true},
        {"{}", "job-1", "abc", "attempt", true},
        {"{}", "job-1", "", "attempt", false},
        {"{}", "job-1", "-1", "attempt", false},
        {"{}", "job-1", "1000001", "attempt", true},
        {"{\"worker_id\": \"bad id\"}", "job-1", "1", "'worker_id'", true},
        {"{\"worker_id\": 5}", "job-1", "1", "'worker_id'", false},
        {"{\"error\": 5}", "job-1", "1", "'error'", false},
        {"{\"retry\": \"x\"}", "job-1", "1", "'retry'", false},
        {"{}", "bad id", "1", "'id'", true},
        {"{\"error\": \"x\"}", "job-1", "1", "'error'", true},
        {"{\"result\": 1}", "job-1", "1", "'result'", false},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *out;
        char *worker;
        Err err;
        char what[160];
        snprintf(what, sizeof what, "%s for work '%s' attempt '%s'", bad[i].body, bad[i].id,
                 bad[i].attempt);
        int rc =
            single(bad[i].body, bad[i].id, bad[i].attempt, bad[i].completed, &out, &worker, &err);
        expect_refusal(what, rc, &err, 400, bad[i].names, NULL);
        CHECK(!out && !worker, "a refused report should hand back nothing");
    }
}

/* ---- query parameters ---- */

static void test_seq(void **state)
{
    static const struct {
        const char *s;
        int64_t v;
    } good[] = {{"0", 0}, {"42", 42}, {"0007", 7}, {"9223372036854775807", INT64_MAX}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        int64_t v = -1;
        Err err;
        CHECK(parse_seq(good[i].s, &v, &err) == 0 && v == good[i].v,
              "'%s' should read as %lld, got %lld", good[i].s, (long long)good[i].v, (long long)v);
    }
    static const struct {
        const char *s, *names;
    } bad[] = {
        {"", "''"},
        {"-1", "'-1'"},
        {"+1", "'+1'"},
        {"1a", "'1a'"},
        {" 1", "' 1'"},
        {"1.5", "'1.5'"},
        {"9223372036854775808", "out of range"},
        {"12345678901234567890", "'12345678901234567890'"},
        {"\xff\xfe", "'?\?'"},
        {"1\xc3", "'1?'"},
        {"x\x01y", "'x?y'"},
        {"\xc3\xa9t\xc3\xa9", "'\xc3\xa9t\xc3\xa9'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t v;
        Err err;
        err_clear(&err);
        char what[64];
        snprintf(what, sizeof what, "the sequence number #%zu", i);
        expect_refusal(what, parse_seq(bad[i].s, &v, &err), &err, 400, bad[i].names, NULL);
    }
    int64_t v;
    Err err;
    err_clear(&err);
    expect_refusal("a missing sequence number", parse_seq(NULL, &v, &err), &err, 400, "''", NULL);
}

static void test_wait(void **state)
{
    static const struct {
        const char *s;
        int64_t max, want;
    } good[] = {
        {"0", 30000, 0},       {"1.5", 30000, 1500},    {"20", 30000, 20000}, {"60", 30000, 30000},
        {"1e3", 30000, 30000}, {"1e300", 30000, 30000}, {"0.0001", 30000, 0},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        int64_t ms = -1;
        Err err;
        CHECK(parse_wait(good[i].s, good[i].max, &ms, &err) == 0 && ms == good[i].want,
              "wait=%s (at most %lld ms) should be %lld ms, got %lld", good[i].s,
              (long long)good[i].max, (long long)good[i].want, (long long)ms);
    }
    static const char *const bad[] = {"", "abc", "-1", "inf", "nan", "1s", "5 ", "-0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t ms;
        Err err;
        err_clear(&err);
        char what[64];
        snprintf(what, sizeof what, "wait='%s'", bad[i]);
        expect_refusal(what, parse_wait(bad[i], 30000, &ms, &err), &err, 400, "'wait'", NULL);
    }
}

/* Refusals quote what the client sent; cut or raw, it must stay valid UTF-8. */
static void test_messages_quoting_input_stay_utf8(void **state)
{
    char text[400];
    /* 63 ASCII characters, then a 2-byte one across the 64-byte quoting limit. */
    snprintf(text, sizeof text, "{\"payload\": 1, \"%063d\xc3\xa9\": 1}", 0);
    expect_submit_refused(text, NULL, 400, "unknown field", NULL);
    SBuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "{\"payload\": 1, \"run_at\": \"x");
    for (int i = 0; i < 40; i++)
        sbuf_puts(&b, "\xe2\x82\xac");
    sbuf_puts(&b, "\"}");
    expect_submit_refused(b.data, NULL, 400, "'run_at'", NULL);
    sbuf_free(&b);
    CHECK(queue_name_valid("a.b_c-9") && !queue_name_valid("") && !queue_name_valid("a/b"),
          "queue names are 1-64 of A-Z a-z 0-9 _ . -");
}

/* ---- the request head ---- */

/* Runs head_check over "Name: value" lines (NULL-terminated). */
static int head_of(bool http11, const char *const *lines, Err *err)
{
    HeadCheck h = {0};
    for (size_t i = 0; lines[i]; i++) {
        const char *colon = strchr(lines[i], ':');
        const char *v = colon + 1 + strspn(colon + 1, " ");
        head_line(&h, lines[i], (size_t)(colon - lines[i]), v, strlen(v));
    }
    return head_check(&h, http11, err);
}

static void test_head_framing(void **state)
{
    static const struct {
        const char *what;
        bool http11;
        const char *lines[4];
        int status; /* 0: accepted */
        const char *names;
    } cases[] = {
        {"one of each", true, {"Host: a:80", "Content-Length: 5"}, 0, NULL},
        {"chunked alone", true, {"Host: a", "transfer-encoding:  Chunked"}, 0, NULL},
        /* libmicrohttpd does not frame "chunked " as chunked (issue 27.7). */
        {"chunked with a space after it",
         true,
         {"Host: a", "Transfer-Encoding: chunked "},
         400,
         "without whitespace"},
        {"a control byte in a value",
         true,
         {"Host: a", "X-A: b\001c"},
         400,
         "'X-A' holds a control"},
        {"HTTP/1.0 without Host", false, {"Content-Length: 1"}, 0, NULL},
        {"no Host", true, {"Content-Length: 1"}, 400, "Host"},
        {"two Hosts", true, {"Host: a", "host: a"}, 400, "2 Host"},
        {"a Host with a slash", true, {"Host: a/b"}, 400, "Host"},
        {"Host with a space before the colon", true, {"Host : a"}, 400, "'Host?'"},
        {"two equal Content-Lengths",
         true,
         {"Host: a", "Content-Length: 1", "Content-Length: 1"},
         400,
         "2 Content-Length headers; send one"},
        {"two different Content-Lengths",
         true,
         {"Host: a", "Content-Length: 1", "Content-Length: 2"},
         400,
         "differ"},
        {"Content-Length and chunked",
         true,
         {"Host: a", "Content-Length: 1", "Transfer-Encoding: chunked"},
         400,
         "both"},
        {"chunked in HTTP/1.0", false, {"Transfer-Encoding: chunked"}, 400, "HTTP/1.0"},
        {"gzip, chunked", true, {"Host: a", "Transfer-Encoding: gzip, chunked"}, 501, "chunked"},
        {"chunked twice",
         true,
         {"Host: a", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"},
         501,
         "chunked"},
        {"chunked, gzip", true, {"Host: a", "Transfer-Encoding: chunked, gzip"}, 400, "end with"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Err err = {0};
        int rc = head_of(cases[i].http11, cases[i].lines, &err);
        if (!cases[i].status)
            CHECK(rc == 0, "%s should be accepted: %s", cases[i].what, err.msg);
        else
            expect_refusal(cases[i].what, rc, &err, cases[i].status, cases[i].names, NULL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_framing),
        cmocka_unit_test(test_json_body),
        cmocka_unit_test(test_submit_single_with_defaults),
        cmocka_unit_test(test_submit_with_every_field),
        cmocka_unit_test(test_submit_bulk),
        cmocka_unit_test(test_submit_refusals),
        cmocka_unit_test(test_submit_bounds_and_times),
        cmocka_unit_test(test_idempotency_key),
        cmocka_unit_test(test_generated_ids_are_unique),
        cmocka_unit_test(test_forwarded_items_parse_the_same),
        cmocka_unit_test(test_heartbeat),
        cmocka_unit_test(test_pull),
        cmocka_unit_test(test_reports),
        cmocka_unit_test(test_single_report),
        cmocka_unit_test(test_seq),
        cmocka_unit_test(test_wait),
        cmocka_unit_test(test_messages_quoting_input_stay_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
