/* The manager's rounds against a fake store (fake_store.c, linked in place of
 * server/store): how replies are ordered against the appends in flight, and
 * what every way a pipeline can end answers — a failed flight, an append
 * behind a failed one, a lost session with flights out, shutdown — and the
 * isolation of what the database refuses. The real manager thread runs;
 * only PostgreSQL is replaced. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "config.h"
#include "fake_store.h"
#include "manager.h"
#include "util.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            print_error(__VA_ARGS__);                                                              \
            print_error("\n");                                                                     \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* A command sent and what it was answered. */
typedef struct Sent {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int status;
    char type[48];
    MgrCmd *cmd;
} Sent;

static void on_done(MgrCmd *c, void *ud)
{
    Sent *s = ud;
    pthread_mutex_lock(&s->lock);
    s->done = true;
    s->status = c->status;
    snprintf(s->type, sizeof s->type, "%s", c->status >= 400 ? c->err.type : "");
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* Sends c; its answer comes to the Sent. */
static Sent *send_cmd(Manager *m, MgrCmd *c)
{
    Sent *s = xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    c->done = on_done;
    c->ud = s;
    s->cmd = c;
    manager_send(m, c);
    return s;
}

static Sent *submit(Manager *m, const char *id)
{
    MgrCmd *c = mgrcmd_new(MC_SUBMIT);
    c->items = xcalloc(1, sizeof *c->items);
    c->n_items = 1;
    c->items[0] = (SubmitItem){.id = xstrdup(id),
                               .queue = xstrdup("q"),
                               .payload = json_integer(1),
                               .timeout_ms = 60000,
                               .max_attempts = 3,
                               .generated = true}; /* looked up in nothing: two may be out */
    return send_cmd(m, c);
}

/* Waits up to ms for s's answer; whether it came. */
static bool answered(Sent *s, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->lock);
    while (!s->done && pthread_cond_timedwait(&s->cond, &s->lock, &until) == 0) {
    }
    bool done = s->done;
    pthread_mutex_unlock(&s->lock);
    return done;
}

static void sent_free(Sent *s)
{
    mgrcmd_free(s->cmd);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
}

/* Polls pred until it holds (at most 5 s). */
static bool eventually(bool (*pred)(void *), void *arg)
{
    for (int i = 0; i < 500; i++) {
        if (pred(arg))
            return true;
        sleep_ms(10);
    }
    return false;
}

static bool leads(void *m)
{
    return manager_is_leader(m);
}

static size_t want_out;
static bool out_is(void *unused)
{
    (void)unused;
    return fake_appends_out() == want_out;
}

static bool waits_for_appends(size_t n)
{
    want_out = n;
    return eventually(out_is, NULL);
}

static Manager *start(void)
{
    fake_reset();
    ManagerConfig cfg = {.database_url = "fake",
                         .advertise_url = "http://fake:8080",
                         .election_interval_ms = 20,
                         .heartbeat_interval_ms = 1000,
                         .pull_wait_max_ms = 1000,
                         .max_workers = 100,
                         .max_reply_bytes = 1 << 20,
                         .max_payload_bytes = 1 << 20,
                         .max_json_depth = 64,
                         .max_schedules = 100,
                         .ws = {.max_open = 1000,
                                .lease_grace_ms = 1000,
                                .backoff_base_ms = 10,
                                .backoff_max_ms = 100,
                                .worker_timeout_ms = 5000},
                         .retain_ms = 3600000,
                         .default_timeout_ms = 60000,
                         .default_max_attempts = 3,
                         .progress = {.rate = 10, .max_bytes = 1 << 20}};
    Err err = {0};
    Manager *m = manager_start(&cfg, &err);
    CHECK(m, "manager_start: %s", err.msg);
    CHECK(eventually(leads, m), "the manager should lead (the fake election is won)");
    return m;
}

static void stop(Manager *m)
{
    fake_hold(false);
    manager_stop(m);
    manager_free(m);
}

static void expect_answer(Sent *s, int status, const char *type, const char *what)
{
    CHECK(answered(s, 5000), "%s: no answer", what);
    CHECK(s->status == status && (!type || !strcmp(s->type, type)), "%s: want %d %s, got %d %s",
          what, status, type ? type : "", s->status, s->type);
}

static void test_a_reply_waits_for_its_own_commit(void **state)
{
    (void)state;
    Manager *m = start();
    fake_hold(true);
    Sent *a = submit(m, "a");
    CHECK(waits_for_appends(1), "a's append should be out");
    CHECK(!answered(a, 100), "no 202 while its commit is held");
    fake_hold(false);
    expect_answer(a, 202, NULL, "a once committed");
    CHECK(fake_committed(EV_ACCEPTED, "a"), "a's accepted event is in the log");
    sent_free(a);
    stop(m);
}

/* Issue 26: two appends out, a third round lands the oldest to make room;
 * landing it must answer its own replies only. When the next one is lost,
 * the third round's reply is a 503, never a 202 for work not committed. */
static void test_a_third_round_is_answered_after_its_own_commit_only(void **state)
{
    (void)state;
    Manager *m = start();
    fake_script((FakeOutcome[]){FAKE_OK, FAKE_LOST}, 2);
    fake_hold(true);
    Sent *a = submit(m, "a");
    CHECK(waits_for_appends(1), "a out");
    Sent *b = submit(m, "b");
    CHECK(waits_for_appends(2), "a and b out");
    Sent *c = submit(m, "c"); /* its round waits for a's outcome to send its own */
    CHECK(!answered(c, 100), "nothing answered while the commits are held");
    fake_hold(false);
    expect_answer(a, 202, NULL, "a (committed)");
    expect_answer(b, 503, "not-leader", "b (its session was lost)");
    expect_answer(c, 503, "not-leader", "c (behind b, never committed)");
    CHECK(!fake_committed(EV_ACCEPTED, "c") && !fake_committed(EV_ACCEPTED, "b"),
          "neither b nor c is in the log");
    sent_free(a);
    sent_free(b);
    sent_free(c);
    stop(m);
}

static void test_an_append_behind_a_refused_one_is_never_a_success(void **state)
{
    (void)state;
    Manager *m = start();
    fake_script((FakeOutcome[]){FAKE_REFUSED, FAKE_OK}, 2);
    fake_hold(true);
    Sent *a = submit(m, "a");
    CHECK(waits_for_appends(1), "a out");
    Sent *b = submit(m, "b");
    CHECK(waits_for_appends(2), "a and b out");
    fake_hold(false);
    expect_answer(a, 503, "not-leader", "a (refused)");
    expect_answer(b, 503, "not-leader", "b (behind a refused append)");
    CHECK(!fake_committed(EV_ACCEPTED, "b"), "b is not in the log");
    CHECK(eventually(leads, m), "a new term after the step-down");
    Sent *d = submit(m, "d");
    expect_answer(d, 202, NULL, "d, in the next term");
    sent_free(a);
    sent_free(b);
    sent_free(d);
    stop(m);
}

static void test_shutdown_with_appends_out_answers_every_command(void **state)
{
    (void)state;
    Manager *m = start();
    fake_hold(true);
    Sent *a = submit(m, "a");
    CHECK(waits_for_appends(1), "a out");
    Sent *b = submit(m, "b");
    CHECK(waits_for_appends(2), "a and b out");
    stop(m); /* releases the commits, then stops */
    CHECK(a->done && b->done, "every command is answered when the manager stops");
    CHECK(a->status == 202 && b->status == 202, "what was sent is answered as it went: %d %d",
          a->status, b->status);
    sent_free(a);
    sent_free(b);
}

/* A request the database refuses twice (alone the second time) is refused
 * from then on, without stopping the leader again; the one behind it in the
 * pipeline is not blamed and goes through when it comes again (requests that
 * shared one append: test_generated_ids.py). */
static void test_what_the_database_refuses_is_found_and_isolated(void **state)
{
    (void)state;
    Manager *m = start();
    fake_script((FakeOutcome[]){FAKE_REFUSED}, 1);
    fake_hold(true);
    Sent *p = submit(m, "poison");
    CHECK(waits_for_appends(1), "poison's append out");
    Sent *i = submit(m, "innocent");
    CHECK(waits_for_appends(2), "innocent's append behind it");
    fake_hold(false);
    expect_answer(p, 503, NULL, "poison, first time");
    expect_answer(i, 503, NULL, "innocent, behind the refused append");
    CHECK(eventually(leads, m), "leading again");
    fake_script((FakeOutcome[]){FAKE_REFUSED}, 1); /* the next append: poison's, alone */
    Sent *p2 = submit(m, "poison");
    expect_answer(p2, 503, NULL, "poison, decided alone, refused again");
    CHECK(fake_stats().refused == 2, "refused twice: %zu", fake_stats().refused);
    CHECK(eventually(leads, m), "leading again");
    size_t sent = fake_stats().sent;
    Sent *p3 = submit(m, "poison");
    expect_answer(p3, 409, "append-refused", "poison, a third time");
    CHECK(fake_stats().sent == sent, "an isolated request is not appended");
    Sent *i2 = submit(m, "innocent");
    expect_answer(i2, 202, NULL, "innocent, alone, committed");
    CHECK(fake_committed(EV_ACCEPTED, "innocent") && !fake_committed(EV_ACCEPTED, "poison"),
          "innocent is in the log, poison is not");
    sent_free(p);
    sent_free(i);
    sent_free(p2);
    sent_free(p3);
    sent_free(i2);
    stop(m);
}

#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

static Sent *put_subscription(Manager *m, const char *name)
{
    MgrCmd *c = mgrcmd_new(MC_SUBSCRIPTION_SET);
    c->name = xstrdup(name);
    c->sub = xcalloc(1, sizeof *c->sub);
    *c->sub = (Subscription){.name = xstrdup(name),
                             .url = xstrdup("https://u:p@h.example/x"),
                             .secret = xstrdup(SECRET),
                             .kinds = strv_split("completed,dead")};
    return send_cmd(m, c);
}

/* Subscriptions are the core's state: a PUT is answered from it (without the
 * secret); a new term rebuilds them from the log, which keeps no secret, and
 * takes the secrets from workd_subscriptions, so that workd's pause of a
 * failing subscription still carries its secret into the table. */
static void test_a_new_term_rebuilds_the_subscriptions(void **state)
{
    (void)state;
    Manager *m = start();
    Sent *put = put_subscription(m, "hook");
    expect_answer(put, 200, NULL, "the PUT");
    const SubscriptionViews *v = put->cmd->subs;
    CHECK(v && v->len == 1 && !strcmp(v->items[0].sub.name, "hook") &&
              !strcmp(v->items[0].sub.url, "https://u:p@h.example/x") && !v->items[0].sub.secret,
          "the PUT is answered with the subscription, without its secret");
    CHECK(fake_subscription_is("hook", SECRET, false), "the table holds hook and its secret");

    fake_script((FakeOutcome[]){FAKE_LOST}, 1);
    Sent *x = submit(m, "x");
    expect_answer(x, 503, "not-leader", "x (its session was lost)");
    CHECK(eventually(leads, m), "a new term after the step-down");
    Sent *get = send_cmd(m, mgrcmd_new(MC_SUBSCRIPTION_GET));
    expect_answer(get, 200, NULL, "GET /subscriptions in the new term");
    v = get->cmd->subs;
    CHECK(v && v->len == 1 && !strcmp(v->items[0].sub.name, "hook") &&
              !strcmp(v->items[0].sub.kinds[1], "dead"),
          "the new term knows the subscription (%zu)", v ? v->len : 0);
    MgrCmd *c = mgrcmd_new(MC_SUB_PAUSE);
    c->name = xstrdup("hook");
    c->reason = xstrdup("failing");
    Sent *pause = send_cmd(m, c);
    expect_answer(pause, 204, NULL, "workd's pause");
    CHECK(fake_subscription_is("hook", SECRET, true),
          "the pause should be in the table with the secret the new term read back");
    sent_free(put);
    sent_free(x);
    sent_free(get);
    sent_free(pause);
    stop(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_reply_waits_for_its_own_commit),
        cmocka_unit_test(test_a_third_round_is_answered_after_its_own_commit_only),
        cmocka_unit_test(test_an_append_behind_a_refused_one_is_never_a_success),
        cmocka_unit_test(test_shutdown_with_appends_out_answers_every_command),
        cmocka_unit_test(test_what_the_database_refuses_is_found_and_isolated),
        cmocka_unit_test(test_a_new_term_rebuilds_the_subscriptions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
