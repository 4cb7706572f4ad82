/* progress.c (which progress reports become events, and the per-attempt
 * budgets) and the webhook signature (whsig_key, whsig_sign),
 * without a database or a network. */
#include "ws_testlib.h"

#include "progress.h"
#include "whsig.h"

static const WsConfig CFG = {.max_open = 100,
                             .lease_grace_ms = 5000,
                             .backoff_base_ms = 1000,
                             .backoff_max_ms = 60000,
                             .worker_timeout_ms = 10000};

/* A WorkState where work "a" runs as attempt 1, held by worker w1 (instance i1). */
static WorkState *running_a(void)
{
    WorkState *ws = ws_new(&CFG);
    EventList l;
    eventlist_init(&l);
    ws_worker_seen(ws, "w1", "i1", 2, NULL, NULL, T0, &l);
    Event *e = eventlist_push(&l);
    e->type = EV_ACCEPTED;
    e->seq = 1;
    e->at = T0;
    e->work_id = xstrdup("a");
    e->queue = xstrdup("q1");
    e->payload = json_integer(1);
    e->timeout_ms = 30000;
    e->max_attempts = 3;
    e = eventlist_push(&l);
    e->type = EV_STARTED;
    e->seq = 2;
    e->at = T0;
    e->work_id = xstrdup("a");
    e->attempt = 1;
    e->worker_id = xstrdup("w1");
    e->deadline = T0 + 35000;
    for (size_t i = 0; i < l.len; i++)
        ws_apply(ws, &l.items[i]);
    eventlist_free(&l);
    CHECK(ws_get(ws, "a") && ws_get(ws, "a")->status == WORK_RUNNING, "'a' should be running");
    return ws;
}

static ProgressMsg msg(const char *message, const char *output)
{
    return (ProgressMsg){.work_id = "a",
                         .attempt = 1,
                         .worker_id = "w1",
                         .instance = "i1",
                         .message = message,
                         .output = output};
}

static void expect_refused(ProgressBook *b, WorkState *ws, ProgressMsg m, int64_t now, int status,
                           const char *type, const char *what)
{
    EventList out;
    eventlist_init(&out);
    Err err = {0};
    int rc = progress_decide(b, ws, &m, now, &out, &err);
    CHECK(rc != 0 && err.status == status && !strcmp(err.type, type) && out.len == 0,
          "%s: want %d %s and no event, got rc %d, %d %s, %zu events", what, status, type, rc,
          err.status, err.type, out.len);
    eventlist_free(&out);
}

static void test_only_the_holder_of_the_running_attempt(void **state)
{
    WorkState *ws = running_a();
    ProgressBook *b = progress_new(&(ProgressLimits){.rate = 10, .max_bytes = 1000});
    ProgressMsg m = msg("x", NULL);
    m.work_id = "nope";
    expect_refused(b, ws, m, T0, 404, "not-found", "unknown work");
    m = msg("x", NULL);
    m.attempt = 2;
    expect_refused(b, ws, m, T0, 409, "attempt-superseded", "another attempt");
    m = msg("x", NULL);
    m.worker_id = "w2";
    expect_refused(b, ws, m, T0, 409, "attempt-not-held", "another worker");
    m = msg("x", NULL);
    m.instance = "i2";
    expect_refused(b, ws, m, T0, 409, "attempt-not-held", "another instance");
    m = msg("x", NULL);
    m.instance = NULL;
    expect_refused(b, ws, m, T0, 409, "attempt-not-held", "no instance, no claim");
    m.claim = true;
    EventList out;
    eventlist_init(&out);
    Err err = {0};
    CHECK(progress_decide(b, ws, &m, T0, &out, &err) == 0 && out.len == 1,
          "a token bound to the worker id may report without the instance: %s", err.msg);
    eventlist_free(&out);
    progress_free(b);
    ws_free(ws);
}

static void test_events_carry_the_latest_fraction_and_message(void **state)
{
    WorkState *ws = running_a();
    ProgressBook *b = progress_new(&(ProgressLimits){.rate = 10, .max_bytes = 1000});
    EventList out;
    eventlist_init(&out);
    Err err = {0};
    ProgressMsg m = msg("half", NULL);
    m.has_fraction = true;
    m.fraction = 0.5;
    CHECK(progress_decide(b, ws, &m, T0, &out, &err) == 0, "%s", err.msg);
    m = msg(NULL, "chunk");
    CHECK(progress_decide(b, ws, &m, T0 + 1, &out, &err) == 0, "%s", err.msg);
    CHECK(out.len == 2 && out.items[1].type == EV_PROGRESS && out.items[1].attempt == 1 &&
              !strcmp(out.items[1].queue, "q1"),
          "two progress events of attempt 1 in q1");
    const Event *second = &out.items[1];
    CHECK(second->has_fraction && second->fraction == 0.5 && second->message &&
              !strcmp(second->message, "half") && second->output &&
              !strcmp(second->output, "chunk"),
          "the second event (only output sent) should carry fraction 0.5, message 'half' and "
          "output 'chunk'");
    /* Through the table and back: what readers of the log see. */
    Event back;
    CHECK(event_through_table(&out.items[1], &back, &err) == 0, "decode: %s", err.msg);
    json_t *res = event_result_json(&back);
    CHECK(!strcmp(json_string_value(json_object_get(res, "status")), "progress") &&
              json_real_value(json_object_get(res, "fraction")) == 0.5 &&
              !strcmp(json_string_value(json_object_get(res, "output")), "chunk"),
          "the published event: %s", jtext(res));
    json_decref(res);
    event_clear(&back);
    /* Applying it changes nothing; a new attempt starts with a fresh budget. */
    ws_apply(ws, &out.items[0]);
    CHECK(ws_get(ws, "a")->status == WORK_RUNNING, "progress must not change the work");
    eventlist_free(&out);
    progress_free(b);
    ws_free(ws);
}

static void test_rate_and_bytes_are_bounded_per_attempt(void **state)
{
    WorkState *ws = running_a();
    ProgressBook *b = progress_new(&(ProgressLimits){.rate = 3, .max_bytes = 10});
    EventList out;
    eventlist_init(&out);
    Err err = {0};
    for (int i = 0; i < 3; i++) {
        ProgressMsg m = msg(NULL, "a");
        CHECK(progress_decide(b, ws, &m, T0, &out, &err) == 0, "report %d of a burst of 3: %s", i,
              err.msg);
    }
    expect_refused(b, ws, msg(NULL, "a"), T0, 429, "progress-rate-limited", "the 4th at once");
    /* A third of a second later one token is back. */
    ProgressMsg m = msg(NULL, "bcdef");
    CHECK(progress_decide(b, ws, &m, T0 + 334, &out, &err) == 0, "after a refill: %s", err.msg);
    /* 3 + 5 bytes sent: 3 more would pass 10. */
    expect_refused(b, ws, msg("xyz", NULL), T0 + 2000, 413, "progress-too-large",
                   "past --progress-max-bytes");
    m = msg("xy", NULL);
    CHECK(progress_decide(b, ws, &m, T0 + 2000, &out, &err) == 0,
          "exactly the budget is allowed: %s", err.msg);
    CHECK(progress_count(b) == 1, "one attempt has a budget");
    progress_forget(b, "a");
    CHECK(progress_count(b) == 0, "a forgotten attempt has none");
    eventlist_free(&out);
    progress_free(b);
    ws_free(ws);
}

/* A WorkState where works "a0".."a<n-1>" run as attempt 1, held by w1 (i1). */
static WorkState *running_n(int n)
{
    WorkState *ws = ws_new(&CFG);
    EventList l;
    eventlist_init(&l);
    ws_worker_seen(ws, "w1", "i1", n, NULL, NULL, T0, &l);
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "a%d", i);
        Event *e = eventlist_push(&l);
        e->type = EV_ACCEPTED;
        e->seq = 2 * i + 1;
        e->at = T0;
        e->work_id = xstrdup(id);
        e->queue = xstrdup("q1");
        e->payload = json_integer(i);
        e->timeout_ms = 30000;
        e->max_attempts = 3;
        e = eventlist_push(&l);
        e->type = EV_STARTED;
        e->seq = 2 * i + 2;
        e->at = T0;
        e->work_id = xstrdup(id);
        e->attempt = 1;
        e->worker_id = xstrdup("w1");
        e->deadline = T0 + 35000;
    }
    for (size_t i = 0; i < l.len; i++)
        ws_apply(ws, &l.items[i]);
    eventlist_free(&l);
    return ws;
}

/* One update for each of n attempts at time now; returns how many were taken,
 * and the last refusal in *err. */
static int one_each(ProgressBook *b, WorkState *ws, int n, int64_t now, Err *err)
{
    EventList out;
    eventlist_init(&out);
    int taken = 0;
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "a%d", i);
        ProgressMsg m = msg("m", NULL);
        m.work_id = id;
        Err e = {0};
        if (progress_decide(b, ws, &m, now, &out, &e) == 0)
            taken++;
        else
            *err = e;
    }
    eventlist_free(&out);
    return taken;
}

static void test_rate_is_bounded_per_worker_and_in_total(void **state)
{
    /* Each attempt is well within its own rate; its worker is not. */
    WorkState *ws = running_n(30);
    ProgressBook *b = progress_new(
        &(ProgressLimits){.rate = 10, .max_bytes = 1000, .worker_rate = 20, .total_rate = 1000});
    Err err = {0};
    CHECK(one_each(b, ws, 30, T0, &err) == 20, "a worker's burst is its one second's worth");
    CHECK(err.status == 429 && strstr(err.msg, "--progress-rate-worker"),
          "refused by the worker's rate: %s", err.msg);
    /* Half a second later half of it is back. */
    CHECK(one_each(b, ws, 30, T0 + 500, &err) == 10, "the worker's bucket refills at its rate");
    progress_free(b);
    /* And over the cluster. */
    b = progress_new(
        &(ProgressLimits){.rate = 10, .max_bytes = 1000, .worker_rate = 100, .total_rate = 7});
    err = (Err){0};
    CHECK(one_each(b, ws, 30, T0, &err) == 7, "the cluster records its rate at most");
    CHECK(err.status == 429 && strstr(err.msg, "--progress-rate-total"),
          "refused by the total rate: %s", err.msg);
    /* A refusal by the total takes no token of the attempt's or the worker's. */
    CHECK(one_each(b, ws, 1, T0 + 1000, &err) == 1, "after a second the total is back");
    progress_free(b);
    ws_free(ws);
}

static void test_webhook_signature(void **state)
{
    unsigned char key[WHSIG_KEY_MAX];
    size_t len = 0;
    CHECK(whsig_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, &len) == 0 && len == 24,
          "a 24-byte secret, got %zu bytes", len);
    char sig[WHSIG_LEN];
    const char body[] = "{\"test\": 2432232314}";
    CHECK(whsig_sign(key, len, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body, sizeof body - 1,
                     sig) == 0,
          "signing failed");
    /* base64(HMAC-SHA256(key, "msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330." body)), as
     * Python's hmac module computes it. */
    CHECK(!strcmp(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="), "signature %s", sig);
    static const char *bad[] = {"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                                "whsec_",
                                "whsec_AAAA",
                                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS!",
                                "whsec_A=AA",
                                "whsec_"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD"
                                "QUJD",
                                NULL};
    for (size_t i = 0; bad[i]; i++)
        CHECK(whsig_key(bad[i], key, &len) != 0, "'%s' is not a secret", bad[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_the_holder_of_the_running_attempt),
        cmocka_unit_test(test_events_carry_the_latest_fraction_and_message),
        cmocka_unit_test(test_rate_and_bytes_are_bounded_per_attempt),
        cmocka_unit_test(test_rate_is_bounded_per_worker_and_in_total),
        cmocka_unit_test(test_webhook_signature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
