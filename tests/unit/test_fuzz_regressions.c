/* Regression cases for what the fuzz targets of tests/fuzz found. Each input is
 * also a seed of its target (tests/fuzz/corpus/<target>/regress-*), so that
 * the fuzzer starts from it too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "parse.h"
#include "util.h"

/* Fails the test with a sentence when cond is false. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

#define NOW_MS INT64_C(1767225600000) /* 2026-01-01T00:00:00Z */

static const ParseLimits limits = {
    .max_batch = 1000, .max_depth = 32, .default_timeout_ms = 60000, .default_max_attempts = 3};

/* ---- parse_json_body: the message of invalid JSON ---- */

/* jansson quotes the body near the error and cut a character after a
 * backslash in two: the message was not UTF-8, json_pack refused it, and
 * req_finish_problem then crashed the server on strlen(NULL). Found by
 * fuzz_worker_msg and fuzz_submit. */
static void test_invalid_escape_message_stays_utf8(void **state)
{
    static const struct {
        const char *what, *body;
    } cases[] = {
        {"an escaped two-byte character", "\"\\\xd0\x91"},
        {"an escaped three-byte character", "{\"a\": \"\\\xe2\x82\xac\"}"},
        {"an escaped four-byte character", "[\"\\\xf0\x9f\x98\x80\"]"},
        {"fuzz_worker_msg's input", "\"\\\xd0\x91\x8a\x9alh\"\\0"},
        {"fuzz_submit's input", "{\"paqload\": 0, \"rayload\": \"\\u00e9\\ud83d\\ude\xd0\x8a\x91"
                                "\x9d"
                                "at\": \"2026-03-01t20:00:00.5+;02:30\"}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Err err = {0};
        json_t *v = parse_json_body(cases[i].body, strlen(cases[i].body), limits.max_depth, &err);
        CHECK(!v, "a body with %s was accepted as JSON", cases[i].what);
        CHECK(err.status == 400 && !strcmp(err.type, "invalid-json"),
              "a body with %s should be refused as invalid-json (400), not %s (%d)", cases[i].what,
              err.type, err.status);
        /* What req_finish_problem builds from it. */
        json_t *p = json_pack("{s:s, s:s, s:i, s:s}", "type", err.type, "title", "Bad Request",
                              "status", err.status, "detail", err.msg);
        CHECK(p,
              "refusing a body with %s, the message is not UTF-8, so no problem+json "
              "can carry it: %s",
              cases[i].what, err.msg);
        json_decref(p);
    }
}

/* ---- time_parse and time_format ---- */

/* strftime wrote years before 1000 with fewer than four digits, which
 * time_parse cannot read; offsets carried times out of 0000-9999. Found by
 * fuzz_time. */
static void test_times_read_back(void **state)
{
    static const char *const readable[] = {
        "0000-01-01T00:00:00Z",
        "0999-06-15T12:00:00.5Z",
        "0001-02-03T04:05:06+01:00",
        "9999-12-31T23:59:59.999Z",
    };
    for (size_t i = 0; i < sizeof readable / sizeof readable[0]; i++) {
        int64_t ms, again;
        char text[64];
        CHECK(time_parse(readable[i], &ms, NULL) == 0, "'%s' should be a valid time", readable[i]);
        time_format(ms, text, sizeof text);
        CHECK(time_parse(text, &again, NULL) == 0 && again == ms,
              "'%s' formats as '%s', which should read back as the same instant", readable[i],
              text);
    }
    static const char *const outside[] = {
        "0000-01-01T00:00:00+00:01",
        "9999-12-31T23:59:59-00:01",
        "9999-12-31T23:59:60Z",
    };
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        int64_t ms;
        Err err = {0};
        CHECK(time_parse(outside[i], &ms, &err) != 0 && err.status == 400,
              "'%s' is outside the years 0000-9999 and should be refused", outside[i]);
    }
}

/* A follower forwards accepted items to the leader in their normalised form;
 * a run_at in the year 999 came out as "999-01-01T...", which the leader
 * refused. Found by fuzz_submit. */
static void test_forwarded_run_at_reads_back(void **state)
{
    const char *text = "{\"payload\": 1, \"run_at\": \"0999-01-01T00:00:00Z\"}";
    Err err = {0};
    json_t *body = parse_json_body(text, strlen(text), limits.max_depth, &err);
    SubmitItem *items = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    bool bulk = false, bulk2 = false;
    CHECK(body && parse_submit(body, NULL, NOW_MS, &limits, &items, &n, &bulk, &err) == 0,
          "a run_at in the year 999 should be accepted: %s", err.msg);
    json_t *norm = submit_items_json(items, n, bulk);
    char *fwd = json_dumps(norm, JSON_COMPACT);
    json_t *body2 = parse_json_body(fwd, strlen(fwd), limits.max_depth, &err);
    CHECK(body2 && parse_submit(body2, NULL, NOW_MS, &limits, &again, &n2, &bulk2, &err) == 0,
          "the leader should accept the forwarded %s: %s", fwd, err.msg);
    CHECK(n2 == 1 && again[0].run_at == items[0].run_at, "the forwarded %s should keep run_at %lld",
          fwd, (long long)items[0].run_at);
    submit_items_free(again, n2);
    json_decref(body2);
    free(fwd);
    json_decref(norm);
    submit_items_free(items, n);
    json_decref(body);
}

/* ---- event_decode and event_data_encode ---- */

/* A started event's deadline of 0 was encoded as null, which event_decode
 * refuses (a started event needs one): the event could not be read back.
 * Found by fuzz_event. */
static void test_started_event_with_deadline_zero_reads_back(void **state)
{
    json_t *data = json_loads("{\"attempt\": 1, \"worker_id\": \"w-1\", \"deadline\": 0}", 0, NULL);
    Event e, again;
    Err err = {0};
    CHECK(event_decode(42, 3, NOW_MS, "started", EVENT_VERSION, "job-1", data, &e, &err) == 0,
          "a started event with a deadline of 0 should decode: %s", err.msg);
    json_t *enc = event_data_encode(&e);
    CHECK(event_decode(42, 3, NOW_MS, "started", EVENT_VERSION, "job-1", enc, &again, &err) == 0,
          "a started event should decode from its own encoding: %s", err.msg);
    CHECK(again.deadline == 0 && again.attempt == 1 && !strcmp(again.worker_id, "w-1"),
          "a started event changed on its way through its encoding");
    event_clear(&again);
    event_clear(&e);
    json_decref(enc);
    json_decref(data);
}

/* A queue_set event whose rate allows 0 starts decoded as a rate of 0 per
 * 1000 ms, encoded as no rate (null), and read back without its period: the
 * limits changed on their way through their encoding. Found by fuzz_event
 * (regress-rate-limit-zero) once it compared limits. */
static void test_queue_set_with_a_rate_of_zero_reads_back(void **state)
{
    json_t *data = json_loads("{\"queue\": \"q\", \"paused\": false, "
                              "\"rate\": {\"limit\": 0, \"period_ms\": 1000}}",
                              0, NULL);
    Event e, again;
    Err err = {0};
    CHECK(event_decode(7, 1, NOW_MS, "queue_set", EVENT_VERSION, NULL, data, &e, &err) == 0,
          "the queue_set event should decode: %s", err.msg);
    CHECK(e.limits.rate_limit == 0 && e.limits.rate_period_ms == 0,
          "a rate of 0 starts is no rate, not %d per %lld ms", e.limits.rate_limit,
          (long long)e.limits.rate_period_ms);
    json_t *enc = event_data_encode(&e);
    CHECK(event_decode(7, 1, NOW_MS, "queue_set", EVENT_VERSION, NULL, enc, &again, &err) == 0 &&
              again.limits.rate_limit == 0 && again.limits.rate_period_ms == 0,
          "the event changed on its way through its encoding");
    event_clear(&again);
    event_clear(&e);
    json_decref(enc);
    json_decref(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_escape_message_stays_utf8),
        cmocka_unit_test(test_queue_set_with_a_rate_of_zero_reads_back),
        cmocka_unit_test(test_times_read_back),
        cmocka_unit_test(test_forwarded_run_at_reads_back),
        cmocka_unit_test(test_started_event_with_deadline_zero_reads_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
