/* Tests of the pure WorkState (server/manager/workstate.c): every transition
 * driven through ws_decide_* and ws_apply as the manager drives them, then a
 * property test of random command sequences checked against invariants, a
 * replay of the log and a recovery from the projection. */
#include "ws_testlib.h"

#include <time.h>

#include "config.h"

static const WsConfig CFG = {
    .max_open = 100,
    .lease_grace_ms = 5000,
    .backoff_base_ms = 1000,
    .backoff_max_ms = 60000,
    .worker_timeout_ms = 10000,
};

/* ---- driving the state as the manager does ---- */

/* One work item to submit; zero fields take the defaults noted. */
typedef struct Spec {
    const char *id;
    const char *queue;   /* NULL: "default" */
    const char *key;     /* NULL: none */
    const char *payload; /* JSON text; NULL: 1 */
    int priority;
    int64_t run_at;
    int64_t timeout_ms; /* 0: 30 s */
    int max_attempts;   /* 0: 3 */
} Spec;

#define MAX_BATCH 16

static void spec_item(const Spec *sp, SubmitItem *it)
{
    item_set(it, sp->id, sp->queue ? sp->queue : "default", sp->priority,
             sp->payload ? sp->payload : "1", sp->run_at, sp->timeout_ms ? sp->timeout_ms : 30000,
             sp->max_attempts ? sp->max_attempts : 3);
    it->key = sp->key ? xstrdup(sp->key) : NULL;
}

/* What the database holds for those of ids that are not open, as the
 * manager's prefetch_known reads it from workd_work. Borrowed from s->proj. */
static size_t known_for(const Sim *s, const char *const *ids, size_t n, KnownWork *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const ProjRow *r = ws_get(s->ws, ids[i]) ? NULL : proj_get(&s->proj, ids[i]);
        bool dup = false;
        for (size_t j = 0; r && j < k; j++)
            dup = dup || !strcmp(out[j].id, r->id);
        if (r && !dup)
            out[k++] = known_of_row(r);
    }
    return k;
}

/* Decides a submission, with what the database knows of its ids, leaving the
 * events in s->out; returns the decision's result. */
static int decide_submit(Sim *s, const Spec *specs, size_t n, SubmitResult *res, Err *err)
{
    SubmitItem items[MAX_BATCH] = {{0}};
    const char *ids[MAX_BATCH];
    KnownWork known[MAX_BATCH];
    assert_true(n <= MAX_BATCH);
    for (size_t i = 0; i < n; i++) {
        spec_item(&specs[i], &items[i]);
        ids[i] = specs[i].id;
    }
    size_t nk = known_for(s, ids, n, known);
    err_clear(err);
    ws_advance(s->ws, s->now);
    int rc = ws_decide_submit(s->ws, items, n, known, nk, s->now, &s->out, res, err);
    items_clear(items, n);
    return rc;
}

/* Decides a submission and emits its events. A refusal must leave no event. */
static int submit_specs(Sim *s, const Spec *specs, size_t n, SubmitResult *res, Err *err)
{
    int rc = decide_submit(s, specs, n, res, err);
    if (rc != 0)
        CHECK(s->out.len == 0, "a refused submission ('%s') left %zu events behind", err->msg,
              s->out.len);
    sim_emit(s);
    return rc;
}

static SubmitResult submit_one(Sim *s, Spec sp)
{
    SubmitResult r = {0};
    Err err;
    CHECK(submit_specs(s, &sp, 1, &r, &err) == 0, "submitting '%s' was refused: %d %s", sp.id,
          err.status, err.msg);
    return r;
}

static void expect_submit_result(const char *what, SubmitResult r, bool created, const char *status)
{
    CHECK(r.created == created, "%s: created should be %s", what, created ? "true" : "false");
    CHECK(r.status && !strcmp(r.status, status), "%s: status should be '%s' but is '%s'", what,
          status, r.status ? r.status : "(null)");
}

/* A submission that must be refused as a whole, with nothing changed. */
static void expect_submit_refused(Sim *s, const char *what, const Spec *specs, size_t n, int status,
                                  const char *type, const char *mention)
{
    size_t events = s->log.len, open = ws_open_count(s->ws);
    SubmitResult res[MAX_BATCH];
    Err err;
    CHECK(submit_specs(s, specs, n, res, &err) != 0, "%s: should be refused with %d %s", what,
          status, type);
    CHECK(err.status == status && !strcmp(err.type, type),
          "%s: should be refused with %d %s, not %d %s (%s)", what, status, type, err.status,
          err.type, err.msg);
    CHECK(strstr(err.msg, mention) != NULL, "%s: the message '%s' should mention '%s'", what,
          err.msg, mention);
    CHECK(s->log.len == events && ws_open_count(s->ws) == open,
          "%s: a refused submission changed the state (%zu new events, %zu open before, %zu now)",
          what, s->log.len - events, open, ws_open_count(s->ws));
}

/* Lets worker pull one job; checks it gets want (NULL: nothing). */
static void expect_start(Sim *s, const char *worker, char *const *queues, const char *want)
{
    ws_advance(s->ws, s->now);
    bool got = ws_decide_start(s->ws, worker, queues, s->now, &s->out);
    const char *id = got && s->out.len ? s->out.items[0].work_id : NULL;
    if (!want) {
        CHECK(!got && s->out.len == 0, "%s should get nothing but got '%s'", worker,
              id ? id : "(no event)");
        return;
    }
    CHECK(got && s->out.len == 1 && s->out.items[0].type == EV_STARTED,
          "%s should get '%s' but got nothing", worker, want);
    CHECK(!strcmp(id, want), "%s should get '%s' but got '%s'", worker, want, id);
    const WorkItem *before = ws_get(s->ws, want);
    const Event *e = &s->out.items[0];
    CHECK(e->attempt == before->attempt + 1 && !strcmp(e->worker_id, worker),
          "starting '%s' should be attempt %d by %s, not attempt %d by %s", want,
          before->attempt + 1, worker, e->attempt, e->worker_id);
    int64_t deadline = s->now + before->timeout_ms + s->cfg.lease_grace_ms;
    CHECK(e->deadline == deadline,
          "the lease of '%s' should end at now + timeout + grace (%lld)"
          ", not %lld",
          want, (long long)deadline, (long long)e->deadline);
    sim_emit(s);
    const WorkItem *it = ws_get(s->ws, want);
    CHECK(it->status == WORK_RUNNING && !strcmp(it->worker_id, worker) &&
              it->deadline == deadline && it->started_at == s->now,
          "after its start '%s' should run on %s until %lld", want, worker, (long long)deadline);
}

/* A heartbeat (which is also the registration). */
static void seen(Sim *s, const char *worker, const char *instance)
{
    ws_worker_seen(s->ws, worker, instance, 4, NULL, NULL, s->now, &s->out);
    sim_emit(s);
}

/* A worker's report, with what the database knows when the work is not open. */
static ReportResult report(Sim *s, const char *id, int attempt, bool completed, bool retry,
                           const char *error)
{
    KnownWork known[1];
    size_t nk = known_for(s, &id, 1, known);
    json_t *result = json_pack("{s:s}", "for", id);
    /* Sent by the worker that holds the work's attempt (w1 when none does),
     * trusted: test_only_the_holder_may_report tests the binding. */
    const WorkItem *open = ws_get(s->ws, id);
    Report r = {.work_id = id,
                .attempt = attempt,
                .worker_id = open && open->worker_id ? open->worker_id : "w1",
                .claim = true,
                .completed = completed,
                .result = result,
                .error = error,
                .retry = retry};
    ReportResult res;
    ws_advance(s->ws, s->now);
    ws_decide_report(s->ws, &r, nk ? &known[0] : NULL, s->now, &s->out, &res);
    sim_emit(s);
    json_decref(result);
    return res;
}

/* The report's outcome: accepted with the work's status, or refused for a
 * reason (NULL: any). */
static void expect_report(const char *what, ReportResult r, bool accepted, const char *status)
{
    CHECK(r.accepted == accepted, "%s: the report should %sbe accepted", what,
          accepted ? "" : "not ");
    const char *got = accepted ? r.status : r.reason;
    CHECK(!status || (got && !strcmp(got, status)), "%s: the %s should be '%s', not '%s'", what,
          accepted ? "status" : "reason", status, got ? got : "(null)");
}

/* Moves the clock, runs the timers as a manager round does; returns the log
 * index of the first event they produced. */
static size_t run_timers(Sim *s, int64_t now)
{
    s->now = now;
    ws_advance(s->ws, now);
    ws_decide_timers(s->ws, now, &s->out);
    size_t first = sim_emit(s);
    ws_advance(s->ws, now);
    return first;
}

static void set_now(Sim *s, int64_t now)
{
    s->now = now;
    ws_advance(s->ws, now);
}

static const Event *last_event(const Sim *s)
{
    assert_true(s->log.len > 0);
    return &s->log.items[s->log.len - 1];
}

static void expect_status(const Sim *s, const char *id, const char *status)
{
    const WorkItem *it = ws_get(s->ws, id);
    if (!status) {
        CHECK(!it, "'%s' should be finished (not open) but is %s", id,
              it ? ws_item_status(it, s->now) : "");
        return;
    }
    CHECK(it, "'%s' should be open and %s but is not open", id, status);
    CHECK(!strcmp(ws_item_status(it, s->now), status), "'%s' should be %s but is %s", id, status,
          ws_item_status(it, s->now));
}

static void expect_contains(const char *what, const char *text, const char *part)
{
    CHECK(text && strstr(text, part), "%s: '%s' should contain '%s'", what, text ? text : "(null)",
          part);
}

/* The log replays into the same state, and the projection recovers it. */
static void expect_replayable(Sim *s)
{
    WorkState *ws = sim_replay(s);
    char *d = state_diff("the state replayed from the log", s, ws);
    ws_free(ws);
    CHECK(!d, "%s", d);
    ws = sim_recover(s);
    d = state_diff("the state recovered from the projection", s, ws);
    ws_free(ws);
    CHECK(!d, "%s", d);
}

/* ---- submit ---- */

static void test_submit_makes_pending(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    SubmitResult r = submit_one(
        &s,
        (Spec){
            .id = "a", .queue = "q1", .priority = 3, .payload = "{\"n\": 7}", .max_attempts = 4});
    expect_submit_result("new work", r, true, "pending");
    check_event_types("submitting new work", &s.log, 0, "accepted");
    const Event *e = &s.log.items[0];
    json_t *want = J("{\"n\": 7}");
    CHECK(!strcmp(e->work_id, "a") && !strcmp(e->queue, "q1") && e->priority == 3 &&
              json_equal(e->payload, want) && e->run_at == 0 && e->timeout_ms == 30000 &&
              e->max_attempts == 4,
          "the accepted event should carry the item as submitted");
    json_decref(want);
    const WorkItem *it = ws_get(s.ws, "a");
    CHECK(it && it->status == WORK_PENDING && it->attempt == 0 && it->accepted_seq == 1 &&
              it->created_at == T0 && !it->worker_id,
          "after acceptance 'a' should be pending, never attempted, accepted at seq 1");
    expect_status(&s, "a", "pending");
    CHECK(ws_open_count(s.ws) == 1, "one item should be open, not %zu", ws_open_count(s.ws));
    json_t *stats = queue_stats_json(s.ws, s.now);
    json_t *want_stats =
        J("{\"q1\": {\"waiting\": 0, \"pending\": 1, \"scheduled\": 0, \"running\": 0}}");
    check_json_equal("the queue stats", want_stats, stats);
    json_decref(stats);
    json_decref(want_stats);
    CHECK(ws_next_deadline(s.ws) == INT64_MAX, "nothing is timed, yet the next deadline is %lld",
          (long long)ws_next_deadline(s.ws));
    expect_replayable(&s);
    sim_free(&s);
}

static void test_submit_with_run_at_is_scheduled(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    int64_t at = T0 + 5000;
    expect_submit_result("future run_at", submit_one(&s, (Spec){.id = "later", .run_at = at}), true,
                         "scheduled");
    CHECK(last_event(&s)->run_at == at, "the accepted event should keep run_at");
    expect_submit_result("past run_at", submit_one(&s, (Spec){.id = "past", .run_at = T0 - 1}),
                         true, "pending");
    CHECK(last_event(&s)->run_at == 0, "a run_at in the past should be stored as 'now' (0)");
    expect_submit_result("run_at now", submit_one(&s, (Spec){.id = "now", .run_at = T0}), true,
                         "pending");
    expect_status(&s, "later", "scheduled");
    CHECK(ws_next_deadline(s.ws) == at, "the next deadline should be the run_at %lld, not %lld",
          (long long)at, (long long)ws_next_deadline(s.ws));

    expect_start(&s, "w1", NULL, "past");
    expect_start(&s, "w1", NULL, "now");
    expect_start(&s, "w1", NULL, NULL);
    set_now(&s, at - 1);
    expect_status(&s, "later", "scheduled");
    expect_start(&s, "w1", NULL, NULL);
    set_now(&s, at);
    expect_status(&s, "later", "pending");
    expect_start(&s, "w1", NULL, "later");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_submit_same_id_is_idempotent(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a", .payload = "{\"x\": 1, \"y\": [1, 2]}"});
    submit_one(&s, (Spec){.id = "sched", .run_at = T0 + 60000});
    size_t events = s.log.len;
    /* Key order does not matter; queue and priority are not compared. */
    SubmitResult r = submit_one(
        &s,
        (Spec){.id = "a", .payload = "{\"y\": [1, 2], \"x\": 1}", .queue = "q2", .priority = 9});
    expect_submit_result("the same id and payload again", r, false, "pending");
    expect_submit_result("a scheduled item again", submit_one(&s, (Spec){.id = "sched"}), false,
                         "scheduled");
    CHECK(s.log.len == events, "resubmitting the same work must not add events (%zu added)",
          s.log.len - events);
    expect_start(&s, "w1", NULL, "a");
    expect_submit_result("running work again",
                         submit_one(&s, (Spec){.id = "a", .payload = "{\"x\": 1, \"y\": [1, 2]}"}),
                         false, "running");

    Spec other = {.id = "a", .payload = "{\"x\": 2}"};
    expect_submit_refused(&s, "the same id with another payload", &other, 1, 409, "conflict",
                          "'a'");
    Spec batch[] = {{.id = "new1"}, {.id = "new2"}, {.id = "a", .payload = "[]"}};
    expect_submit_refused(&s, "a batch with one conflict", batch, 3, 409, "conflict", "'a'");
    expect_status(&s, "new1", NULL);
    Spec fine[] = {{.id = "new1"}, {.id = "a", .payload = "{\"x\": 1, \"y\": [1, 2]}"}};
    SubmitResult res[2];
    Err err;
    CHECK(submit_specs(&s, fine, 2, res, &err) == 0,
          "a batch of new and existing work was refused");
    expect_submit_result("the new item of the batch", res[0], true, "pending");
    expect_submit_result("the existing item of the batch", res[1], false, "running");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_submit_duplicates_in_one_batch(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    Spec twice[] = {{.id = "d"}, {.id = "e", .run_at = T0 + 100}, {.id = "d"}, {.id = "e"}};
    SubmitResult res[4];
    Err err;
    CHECK(submit_specs(&s, twice, 4, res, &err) == 0, "a batch naming ids twice was refused: %s",
          err.msg);
    check_event_types("a batch naming each id twice", &s.log, 0, "accepted accepted");
    expect_submit_result("the first 'd'", res[0], true, "pending");
    expect_submit_result("the first 'e'", res[1], true, "scheduled");
    expect_submit_result("the second 'd'", res[2], false, "pending");
    expect_submit_result("the second 'e'", res[3], false, "scheduled");
    Spec clash[] = {{.id = "f", .payload = "1"}, {.id = "f", .payload = "2"}};
    expect_submit_refused(&s, "one id with two payloads in a batch", clash, 2, 409, "conflict",
                          "'f'");
    expect_status(&s, "f", NULL);
    sim_free(&s);
}

static void test_submit_is_bounded_by_max_open(void **state)
{
    WsConfig cfg = CFG;
    cfg.max_open = 3;
    Sim s;
    sim_init(&s, &cfg, T0);
    submit_one(&s, (Spec){.id = "o1"});
    submit_one(&s, (Spec){.id = "o2"});
    Spec two[] = {{.id = "n1"}, {.id = "n2"}};
    expect_submit_refused(&s, "two new items with room for one", two, 2, 429, "queue-full",
                          "limit");
    expect_status(&s, "n1", NULL);
    Spec one_new[] = {{.id = "o1"}, {.id = "o2"}, {.id = "n1"}};
    SubmitResult res[3];
    Err err;
    CHECK(submit_specs(&s, one_new, 3, res, &err) == 0,
          "existing work must not count against the limit, yet the batch was refused: %s", err.msg);
    Spec full = {.id = "n2"};
    expect_submit_refused(&s, "new work when full", &full, 1, 429, "queue-full", "limit");

    /* Finished work frees room, and resubmitting finished work needs none. */
    expect_start(&s, "w1", NULL, "o1");
    expect_report("completing o1", report(&s, "o1", 1, true, true, NULL), true, "completed");
    submit_one(&s, (Spec){.id = "n2"});
    expect_submit_result("finished work again when full", submit_one(&s, (Spec){.id = "o1"}), false,
                         "completed");
    sim_free(&s);
}

static void test_submit_of_finished_work_is_known(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "done", .payload = "\"p\""});
    submit_one(&s, (Spec){.id = "gone", .payload = "\"q\""});
    submit_one(&s, (Spec){.id = "dead", .payload = "\"r\"", .max_attempts = 1});
    expect_start(&s, "w1", NULL, "done");
    report(&s, "done", 1, true, true, NULL);
    CHECK(ws_decide_cancel(s.ws, "gone", s.now, &s.out, NULL) == 0, "cancelling 'gone' failed");
    sim_emit(&s);
    expect_start(&s, "w1", NULL, "dead");
    report(&s, "dead", 1, false, true, "boom");
    size_t events = s.log.len;
    expect_submit_result("completed work again",
                         submit_one(&s, (Spec){.id = "done", .payload = "\"p\""}), false,
                         "completed");
    expect_submit_result("cancelled work again",
                         submit_one(&s, (Spec){.id = "gone", .payload = "\"q\""}), false,
                         "cancelled");
    expect_submit_result("dead work again",
                         submit_one(&s, (Spec){.id = "dead", .payload = "\"r\""}), false, "dead");
    CHECK(s.log.len == events, "resubmitting finished work must not add events");
    Spec other = {.id = "done", .payload = "\"other\""};
    expect_submit_refused(&s, "finished work with another payload", &other, 1, 409, "conflict",
                          "'done'");
    sim_free(&s);
}

/* ---- start ---- */

static void test_start_by_priority_then_acceptance(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "p0", .priority = 0});
    submit_one(&s, (Spec){.id = "p5a", .priority = 5});
    submit_one(&s, (Spec){.id = "m1", .priority = -1});
    submit_one(&s, (Spec){.id = "p5b", .priority = 5});
    submit_one(&s, (Spec){.id = "x7", .priority = 7, .queue = "other"});
    submit_one(&s, (Spec){.id = "p10", .priority = 10});
    submit_one(&s, (Spec){.id = "y5", .priority = 5, .queue = "other"});
    submit_one(&s, (Spec){.id = "big", .priority = 1000000, .run_at = T0 + 100000});
    const char *order[] = {"p10", "x7", "p5a", "p5b", "y5", "p0", "m1"};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        s.now += 10;
        expect_start(&s, "w1", NULL, order[i]);
    }
    expect_start(&s, "w2", NULL, NULL);
    set_now(&s, T0 + 100000);
    expect_start(&s, "w2", NULL, "big");
    expect_start(&s, "w2", NULL, NULL);
    expect_replayable(&s);
    sim_free(&s);
}

static void test_start_honours_the_workers_queues(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a1", .queue = "a"});
    submit_one(&s, (Spec){.id = "b1", .queue = "b", .priority = 9});
    submit_one(&s, (Spec){.id = "c1", .queue = "c", .priority = 5});
    submit_one(&s, (Spec){.id = "c2", .queue = "c"});
    submit_one(&s, (Spec){.id = "a2", .queue = "a"});
    char *only_a[] = {"a", NULL}, *c_and_b[] = {"c", "b", NULL}, *unknown[] = {"zzz", NULL};
    char *none[] = {NULL};
    expect_start(&s, "wa", only_a, "a1");
    expect_start(&s, "wx", unknown, NULL);
    expect_start(&s, "wcb", c_and_b, "b1");
    expect_start(&s, "wcb", c_and_b, "c1");
    expect_start(&s, "wcb", c_and_b, "c2");
    expect_start(&s, "wcb", c_and_b, NULL);
    expect_start(&s, "wall", none, "a2");
    expect_start(&s, "wa", only_a, NULL);
    sim_free(&s);
}

/* ---- reports ---- */

/* Sets a queue's limits through a decided and applied queue_set event. */
static void set_limits(Sim *s, const char *queue, QueueLimits l)
{
    Err err;
    CHECK(ws_decide_queue_set(s->ws, queue, &l, s->now, &s->out, &err) == 0,
          "setting the limits of '%s' was refused: %s", queue, err.msg);
    sim_emit(s);
}

static void test_queue_limits_hold_back_starts(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "c%d", i);
        submit_one(&s, (Spec){.id = id, .queue = "c"});
    }
    submit_one(&s, (Spec){.id = "free", .queue = "f"});
    set_limits(&s, "c", (QueueLimits){.paused = true});
    expect_start(&s, "w1", NULL, "free");
    expect_start(&s, "w1", NULL, NULL); /* c is paused */
    set_limits(&s, "c", (QueueLimits){.max_running = 2});
    expect_start(&s, "w1", NULL, "c0");
    expect_start(&s, "w2", NULL, "c1");
    expect_start(&s, "w3", NULL, NULL); /* two of c run */
    s.now += 10;
    report(&s, "c0", 1, true, true, NULL);
    expect_start(&s, "w3", NULL, "c2");
    /* A rate of 2 per second: the bucket starts empty and refills evenly. */
    set_limits(&s, "c", (QueueLimits){.rate_limit = 2, .rate_period_ms = 1000});
    report(&s, "c1", 1, true, true, NULL);
    report(&s, "c2", 1, true, true, NULL);
    expect_start(&s, "w1", NULL, NULL);
    int64_t due = ws_next_deadline(s.ws);
    CHECK(due > s.now && due <= s.now + 501, "the next token is due in 500 ms, not %lld ms",
          (long long)(due - s.now));
    s.now += 500;
    expect_start(&s, "w1", NULL, "c3");
    CHECK(ws_queue_limits(s.ws, "c").rate_limit == 2, "the limits are readable");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_keys_take_turns(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    /* Key a has a backlog of high priority; b and c a little work each. */
    for (int i = 0; i < 6; i++) {
        char id[8];
        snprintf(id, sizeof id, "a%d", i);
        submit_one(&s, (Spec){.id = id, .key = "a", .priority = 9});
    }
    submit_one(&s, (Spec){.id = "b0", .key = "b"});
    submit_one(&s, (Spec){.id = "b1", .key = "b", .priority = 5});
    submit_one(&s, (Spec){.id = "c0", .key = "c"});
    submit_one(&s, (Spec){.id = "n0"}); /* no key: a key of its own */
    const char *order[] = {"a0", "b1", "c0", "n0", "a1", "b0", "a2", "a3"};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++)
        expect_start(&s, "w1", NULL, order[i]);
    /* At most one running attempt per key: only a key with none may start. */
    set_limits(&s, "default", (QueueLimits){.max_running_per_key = 1});
    expect_start(&s, "w1", NULL, NULL);
    report(&s, "b0", 1, true, true, NULL);
    expect_start(&s, "w1", NULL, NULL); /* b has nothing left; a still runs four */
    report(&s, "a0", 1, true, true, NULL);
    report(&s, "a1", 1, true, true, NULL);
    report(&s, "a2", 1, true, true, NULL);
    expect_start(&s, "w1", NULL, NULL); /* a3 still runs */
    report(&s, "a3", 1, true, true, NULL);
    expect_start(&s, "w1", NULL, "a4");
    expect_start(&s, "w1", NULL, NULL);
    expect_replayable(&s);
    sim_free(&s);
}

/* Sets the weights of a queue's keys (and nothing else) through a queue_set. */
static void set_weights(Sim *s, const char *queue, const char *const *keys, const int *weights,
                        size_t n)
{
    QueueLimits l = ws_queue_limits(s->ws, queue);
    KeyWeight *w = xcalloc(n + 1, sizeof *w);
    for (size_t i = 0; i < n; i++)
        w[i] = (KeyWeight){.key = (char *)keys[i], .weight = weights[i]};
    l.weights = w;
    l.n_weights = n;
    set_limits(s, queue, l); /* copied into the event */
    free(w);
}

static void test_weighted_keys_take_more_turns(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    const char *keys[] = {"c", "a"};
    const int weights[] = {2, 3};
    set_weights(&s, "default", keys, weights, 2);
    for (int i = 0; i < 9; i++) {
        char id[8];
        snprintf(id, sizeof id, "a%d", i);
        submit_one(&s, (Spec){.id = id, .key = "a"});
    }
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof id, "b%d", i);
        submit_one(&s, (Spec){.id = id, .key = "b", .priority = i}); /* b4 first */
    }
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "c%d", i);
        submit_one(&s, (Spec){.id = id, .key = "c"});
    }
    CHECK(ws_queue_limits(s.ws, "default").n_weights == 2, "the weights are readable");
    /* a: 3 turns a round, b (no weight): 1, c: 2; priority orders within b.
     * A key with nothing left leaves the ring without using its turns. */
    const char *order[] = {"a0", "a1", "a2", "b4", "c0", "c1", "a3", "a4", "a5",
                           "b3", "c2", "a6", "a7", "a8", "b2", "b1", "b0"};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++)
        expect_start(&s, "w1", NULL, order[i]);
    expect_start(&s, "w1", NULL, NULL);
    expect_replayable(&s);
    WorkState *replayed = sim_replay(&s);
    QueueLimits l = ws_queue_limits(replayed, "default");
    CHECK(l.n_weights == 2 && !strcmp(l.weights[0].key, "a") && l.weights[0].weight == 3 &&
              !strcmp(l.weights[1].key, "c") && l.weights[1].weight == 2,
          "replaying the log should give the weights back, sorted by key");
    ws_free(replayed);
    /* Clearing the weights: one turn each again, and the queue, idle and
     * without flow control, is forgotten. */
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "x%d", i);
        submit_one(&s, (Spec){.id = id, .key = i % 2 ? "b" : "a"}); /* a had weight 3 */
    }
    set_weights(&s, "default", NULL, NULL, 0);
    const char *plain[] = {"x0", "x1", "x2", "x3"};
    for (size_t i = 0; i < 4; i++)
        expect_start(&s, "w1", NULL, plain[i]);
    CHECK(ws_queue_limits(s.ws, "default").n_weights == 0, "the weights were cleared");
    sim_free(&s);
}

static void test_weights_are_checked(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err;
    KeyWeight w[QL_MAX_WEIGHTS + 1];
    char names[QL_MAX_WEIGHTS + 1][8];
    for (int i = 0; i <= QL_MAX_WEIGHTS; i++) {
        snprintf(names[i], sizeof names[i], "k%03d", i);
        w[i] = (KeyWeight){.key = names[i], .weight = 2};
    }
    QueueLimits l = {.weights = w, .n_weights = QL_MAX_WEIGHTS + 1};
    CHECK(ws_decide_queue_set(s.ws, "q", &l, s.now, &s.out, &err) != 0 && err.status == 400,
          "more than %d weighted keys should be refused", QL_MAX_WEIGHTS);
    l.n_weights = 1;
    w[0].weight = 0;
    CHECK(ws_decide_queue_set(s.ws, "q", &l, s.now, &s.out, &err) != 0 && err.status == 400,
          "a weight of 0 should be refused");
    w[0].weight = QL_MAX_WEIGHT + 1;
    CHECK(ws_decide_queue_set(s.ws, "q", &l, s.now, &s.out, &err) != 0 && err.status == 400,
          "a weight above %d should be refused", QL_MAX_WEIGHT);
    CHECK(s.out.len == 0, "a refused queue_set decides no event");
    w[0].weight = QL_MAX_WEIGHT;
    l.n_weights = QL_MAX_WEIGHTS;
    set_limits(&s, "q", l);
    CHECK(ws_queue_limits(s.ws, "q").n_weights == QL_MAX_WEIGHTS, "%d weights are kept",
          QL_MAX_WEIGHTS);
    s.now += 1000;
    ws_advance(s.ws, s.now);
    CHECK(ws_queue_limits(s.ws, "q").n_weights == QL_MAX_WEIGHTS,
          "a queue with weights and no work is not forgotten");
    sim_free(&s);
}

static void test_complete(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a"});
    expect_start(&s, "w1", NULL, "a");
    s.now += 1500;
    ReportResult r = report(&s, "a", 1, true, true, NULL);
    expect_report("completing the current attempt", r, true, "completed");
    check_event_types("completing 'a'", &s.log, 2, "completed");
    json_t *want = J("{\"for\": \"a\"}");
    CHECK(last_event(&s)->attempt == 1 && json_equal(last_event(&s)->result, want),
          "the completed event should carry attempt 1 and the result");
    json_decref(want);
    expect_status(&s, "a", NULL);
    CHECK(ws_open_count(s.ws) == 0, "nothing should be open after the completion");
    const ProjRow *row = proj_get(&s.proj, "a");
    CHECK(row && !strcmp(row->status, "completed"), "the projection should say completed");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_backoff_is_exponential_capped_and_jittered(void **state)
{
    int distinct = 0;
    int64_t seen_first[64];
    for (int n = 0; n < 64; n++) {
        char id[32];
        snprintf(id, sizeof id, "job-%d", n);
        for (int attempt = 1; attempt <= 12; attempt++) {
            int64_t nominal = CFG.backoff_base_ms;
            for (int i = 1; i < attempt; i++)
                nominal = nominal * 2 < CFG.backoff_max_ms ? nominal * 2 : CFG.backoff_max_ms;
            int64_t d = ws_backoff_ms(&CFG, id, attempt);
            CHECK(d >= nominal / 2 && d <= nominal,
                  "the delay after attempt %d of '%s' should be within [%lld, %lld], not %lld",
                  attempt, id, (long long)nominal / 2, (long long)nominal, (long long)d);
            CHECK(d == ws_backoff_ms(&CFG, id, attempt),
                  "the delay must be the same each time (replay depends on it)");
        }
        seen_first[n] = ws_backoff_ms(&CFG, id, 1);
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup = dup || seen_first[j] == seen_first[n];
        distinct += !dup;
    }
    CHECK(distinct > 32, "the jitter should spread retries: only %d distinct delays for 64 ids",
          distinct);
    int64_t huge = ws_backoff_ms(&CFG, "x", 1000000);
    CHECK(huge >= CFG.backoff_max_ms / 2 && huge <= CFG.backoff_max_ms,
          "a huge attempt number should be capped at %lld, got %lld", (long long)CFG.backoff_max_ms,
          (long long)huge);
    WsConfig small = CFG;
    small.backoff_base_ms = 5000;
    small.backoff_max_ms = 2000;
    int64_t d = ws_backoff_ms(&small, "x", 1);
    CHECK(d >= 1000 && d <= 2000, "a base above the cap should be capped, got %lld", (long long)d);
}

static void test_fail_with_retry_is_scheduled_at_backoff(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a", .max_attempts = 3});
    expect_start(&s, "w1", NULL, "a");
    set_now(&s, T0 + 1000);
    expect_report("a failure with attempts left", report(&s, "a", 1, false, true, "exit 2"), true,
                  "scheduled");
    check_event_types("failing attempt 1 of 3", &s.log, 2, "failed");
    int64_t retry_at = T0 + 1000 + ws_backoff_ms(&CFG, "a", 1);
    const Event *e = last_event(&s);
    CHECK(e->attempt == 1 && e->retry_at == retry_at && !strcmp(e->error, "exit 2"),
          "the failed event should name attempt 1, the error and retry at now + backoff "
          "(%lld), not %lld",
          (long long)retry_at, (long long)e->retry_at);
    const WorkItem *it = ws_get(s.ws, "a");
    CHECK(it->status == WORK_PENDING && it->attempt == 1 && !it->worker_id && it->deadline == 0 &&
              !strcmp(it->last_error, "exit 2") && it->run_at == retry_at,
          "a failed attempt should leave the work waiting for its retry, without worker or "
          "lease, keeping the error");
    expect_status(&s, "a", "scheduled");
    CHECK(ws_next_deadline(s.ws) == retry_at, "the next deadline should be the retry");

    set_now(&s, retry_at - 1);
    expect_start(&s, "w2", NULL, NULL);
    set_now(&s, retry_at);
    expect_start(&s, "w2", NULL, "a");
    CHECK(ws_get(s.ws, "a")->attempt == 2, "the retry should be attempt 2");
    set_now(&s, retry_at + 10);
    expect_report("failing attempt 2 of 3", report(&s, "a", 2, false, true, "exit 3"), true,
                  "scheduled");
    CHECK(last_event(&s)->retry_at == retry_at + 10 + ws_backoff_ms(&CFG, "a", 2),
          "the second retry should wait the backoff of attempt 2");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_fail_on_last_attempt_is_dead(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a", .max_attempts = 2});
    expect_start(&s, "w1", NULL, "a");
    report(&s, "a", 1, false, true, "first");
    set_now(&s, ws_get(s.ws, "a")->run_at);
    expect_start(&s, "w1", NULL, "a");
    size_t first = s.log.len;
    expect_report("failing the last attempt", report(&s, "a", 2, false, true, "second"), true,
                  "dead");
    check_event_types("failing attempt 2 of 2", &s.log, first, "failed dead");
    CHECK(s.log.items[first].retry_at == 0, "the last failure must not schedule a retry");
    CHECK(!strcmp(s.log.items[first + 1].error, "second"), "the dead event should keep the error");
    expect_status(&s, "a", NULL);
    const ProjRow *row = proj_get(&s.proj, "a");
    CHECK(!strcmp(row->status, "dead") && row->attempts == 2 && !strcmp(row->last_error, "second"),
          "the projection should hold 'a' dead after 2 attempts");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_fail_without_retry_is_dead(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a", .max_attempts = 5});
    expect_start(&s, "w1", NULL, "a");
    expect_report("a failure that refuses retries", report(&s, "a", 1, false, false, "bad input"),
                  true, "dead");
    check_event_types("failing with retry=false", &s.log, 2, "failed dead");
    expect_status(&s, "a", NULL);
    sim_free(&s);
}

static void test_stale_reports_are_refused(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a", .max_attempts = 3});
    submit_one(&s, (Spec){.id = "never", .priority = -5});
    expect_start(&s, "w1", NULL, "a");
    report(&s, "a", 1, false, true, "boom");
    size_t events = s.log.len;
    expect_report("completing an attempt that already failed", report(&s, "a", 1, true, true, NULL),
                  false, "superseded");
    expect_report("completing an attempt not started yet", report(&s, "a", 2, true, true, NULL),
                  false, "superseded");
    /* The same failure again (its answer was lost): it is recorded, stop sending. */
    expect_report("failing the failed attempt 1 again", report(&s, "a", 1, false, true, "boom"),
                  true, "scheduled");
    CHECK(s.log.len == events, "these reports must add no events (%zu added)", s.log.len - events);
    set_now(&s, ws_get(s.ws, "a")->run_at);
    expect_start(&s, "w2", NULL, "a");
    events = s.log.len;
    expect_report("completing the superseded attempt 1", report(&s, "a", 1, true, true, NULL),
                  false, "superseded");
    expect_report("failing the superseded attempt 1", report(&s, "a", 1, false, true, "late"),
                  false, "superseded");
    expect_report("completing attempt 3 while 2 runs", report(&s, "a", 3, true, true, NULL), false,
                  "superseded");
    expect_report("completing work that never started", report(&s, "never", 1, true, true, NULL),
                  false, "superseded");
    expect_report("completing unknown work", report(&s, "nope", 1, true, true, NULL), false,
                  "not-found");
    CHECK(s.log.len == events, "refused reports must add no events (%zu added)",
          s.log.len - events);
    expect_status(&s, "a", "running");
    expect_report("completing the current attempt 2", report(&s, "a", 2, true, true, NULL), true,
                  "completed");
    CHECK(ws_decide_cancel(s.ws, "never", s.now, &s.out, NULL) == 0, "cancelling failed");
    sim_emit(&s);
    expect_report("completing cancelled work", report(&s, "never", 1, true, true, NULL), false,
                  "cancelled");
    sim_free(&s);
}

static void test_duplicate_reports_of_finished_work(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "ok"});
    submit_one(&s, (Spec){.id = "bad", .max_attempts = 2});
    expect_start(&s, "w1", NULL, "ok");
    report(&s, "ok", 1, true, true, NULL);
    expect_start(&s, "w1", NULL, "bad");
    report(&s, "bad", 1, false, true, "one");
    set_now(&s, ws_get(s.ws, "bad")->run_at);
    expect_start(&s, "w1", NULL, "bad");
    report(&s, "bad", 2, false, true, "two");
    size_t events = s.log.len;
    expect_report("the same completion again", report(&s, "ok", 1, true, true, NULL), true,
                  "completed");
    expect_report("a completion of another attempt of completed work",
                  report(&s, "ok", 2, true, true, NULL), false, NULL);
    expect_report("a failure of completed work", report(&s, "ok", 1, false, true, "x"), false,
                  NULL);
    expect_report("the same last failure again", report(&s, "bad", 2, false, true, "two"), true,
                  "dead");
    expect_report("a completion of dead work", report(&s, "bad", 2, true, true, NULL), false, NULL);
    expect_report("a failure of an earlier attempt of dead work",
                  report(&s, "bad", 1, false, true, "one"), false, NULL);
    CHECK(s.log.len == events, "duplicate reports must add no events (%zu added)",
          s.log.len - events);
    sim_free(&s);
}

/* ---- cancel ---- */

static void expect_cancel(Sim *s, const char *id, int status, const char *type)
{
    size_t events = s->log.len;
    Err err;
    err_clear(&err);
    int rc = ws_decide_cancel(s->ws, id, s->now, &s->out, &err);
    if (!status) {
        CHECK(rc == 0, "cancelling '%s' should succeed but got %d %s", id, err.status, err.msg);
        sim_emit(s);
        check_event_types("cancelling", &s->log, events, "cancelled");
        expect_status(s, id, NULL);
        return;
    }
    CHECK(rc != 0 && err.status == status && !strcmp(err.type, type),
          "cancelling '%s' should be refused with %d %s, not %d %s", id, status, type,
          rc ? err.status : 0, rc ? err.type : "success");
    expect_contains("the refusal", err.msg, id);
    CHECK(s->out.len == 0, "a refused cancel must decide no events");
}

static void test_cancel(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "run", .priority = 9});
    submit_one(&s, (Spec){.id = "pend"});
    submit_one(&s, (Spec){.id = "sched", .run_at = T0 + 60000});
    expect_start(&s, "w1", NULL, "run");
    expect_cancel(&s, "pend", 0, NULL);
    expect_cancel(&s, "sched", 0, NULL);
    expect_cancel(&s, "nope", 404, "not-found");
    expect_cancel(&s, "pend", 404, "not-found");
    CHECK(!strcmp(proj_get(&s.proj, "sched")->status, "cancelled"),
          "the projection should say cancelled");
    /* Running work ends with its attempt; the attempt's late report is refused. */
    expect_cancel(&s, "run", 0, NULL);
    CHECK(last_event(&s)->attempt == 1, "the cancel of running work names its attempt");
    ReportResult r = report(&s, "run", 1, true, true, NULL);
    CHECK(!r.accepted && !strcmp(r.reason, "cancelled"),
          "a late completion of a cancelled attempt must be refused as cancelled, not %s",
          r.accepted ? "accepted" : r.reason);
    /* Waiting for a retry may be cancelled too. */
    submit_one(&s, (Spec){.id = "again"});
    expect_start(&s, "w1", NULL, "again");
    report(&s, "again", 1, false, true, "boom");
    expect_cancel(&s, "again", 0, NULL);
    expect_replayable(&s);
    sim_free(&s);
}

/* ---- an operator's retry of dead work ---- */

static void expect_retry(Sim *s, const char *id, int status, const char *type)
{
    KnownWork known[1];
    size_t nk = known_for(s, &id, 1, known), events = s->log.len;
    Err err;
    err_clear(&err);
    int rc = ws_decide_retry(s->ws, id, nk ? &known[0] : NULL, s->now, &s->out, &err);
    if (!status) {
        CHECK(rc == 0, "retrying '%s' should succeed but got %d %s", id, err.status, err.msg);
        sim_emit(s);
        check_event_types("retrying dead work", &s->log, events, "retried");
        const Event *e = last_event(s);
        CHECK(e->attempt == known[0].attempts && e->max_attempts == known[0].attempts + 1 &&
                  !strcmp(e->queue, known[0].queue) && e->priority == known[0].priority &&
                  e->timeout_ms == known[0].timeout_ms && json_equal(e->payload, known[0].payload),
              "the retried event should rebuild '%s' with one more attempt", id);
        const WorkItem *it = ws_get(s->ws, id);
        CHECK(it && it->attempt == e->attempt && it->max_attempts == e->max_attempts &&
                  it->accepted_seq == e->seq,
              "a retried '%s' should be open again after its %d attempts, allowing one more", id,
              e->attempt);
        expect_status(s, id, "pending");
        return;
    }
    CHECK(rc != 0 && err.status == status && !strcmp(err.type, type),
          "retrying '%s' should be refused with %d %s, not %d %s", id, status, type,
          rc ? err.status : 0, rc ? err.type : "success");
    if (status != 429)
        expect_contains("the refusal", err.msg, id);
    CHECK(s->out.len == 0, "a refused retry must decide no events");
}

static void test_operator_retries_dead_work(void **state)
{
    WsConfig cfg = CFG;
    cfg.max_open = 2;
    Sim s;
    sim_init(&s, &cfg, T0);
    submit_one(&s, (Spec){.id = "dead", .max_attempts = 2, .priority = 5});
    submit_one(&s, (Spec){.id = "done"});
    expect_start(&s, "w1", NULL, "dead");
    report(&s, "dead", 1, false, false, "bad input");
    expect_start(&s, "w1", NULL, "done");
    report(&s, "done", 1, true, true, NULL);
    submit_one(&s, (Spec){.id = "gone"});
    CHECK(ws_decide_cancel(s.ws, "gone", s.now, &s.out, NULL) == 0, "cancelling failed");
    sim_emit(&s);

    expect_retry(&s, "nope", 404, "not-found");
    expect_retry(&s, "done", 409, "not-retryable");
    expect_retry(&s, "gone", 409, "not-retryable");
    expect_retry(&s, "dead", 0, NULL);
    expect_retry(&s, "dead", 409, "not-retryable");
    expect_replayable(&s);

    /* One more attempt, and dead again when it fails. */
    expect_start(&s, "w1", NULL, "dead");
    CHECK(ws_get(s.ws, "dead")->attempt == 2, "the attempt after a retry should be attempt 2");
    size_t first = s.log.len;
    expect_report("failing the extra attempt", report(&s, "dead", 2, false, true, "again"), true,
                  "dead");
    check_event_types("failing the extra attempt", &s.log, first, "failed dead");

    /* Reopening needs room like any new work. */
    submit_one(&s, (Spec){.id = "o1"});
    submit_one(&s, (Spec){.id = "o2"});
    expect_retry(&s, "dead", 429, "queue-full");
    expect_cancel(&s, "o2", 0, NULL);
    expect_retry(&s, "dead", 0, NULL);
    CHECK(ws_get(s.ws, "dead")->max_attempts == 3, "a second retry allows a third attempt");
    expect_replayable(&s);
    sim_free(&s);
}

/* ---- timers and workers ---- */

static void test_deadline_times_out(void **state)
{
    WsConfig cfg = CFG;
    cfg.worker_timeout_ms = 3600 * 1000; /* only the lease matters here */
    Sim s;
    sim_init(&s, &cfg, T0);
    seen(&s, "w1", "i1");
    submit_one(&s, (Spec){.id = "a", .timeout_ms = 30000, .max_attempts = 2});
    expect_start(&s, "w1", NULL, "a");
    int64_t deadline = T0 + 30000 + cfg.lease_grace_ms;
    CHECK(ws_next_deadline(s.ws) == deadline, "the next deadline should be the lease end %lld",
          (long long)deadline);
    size_t first = run_timers(&s, deadline - 1);
    check_event_types("timers before the deadline", &s.log, first, "");
    first = run_timers(&s, deadline);
    check_event_types("timers at the deadline", &s.log, first, "timed_out");
    const Event *e = &s.log.items[first];
    CHECK(e->attempt == 1 && e->retry_at == deadline + ws_backoff_ms(&cfg, "a", 1),
          "a timed-out attempt 1 of 2 should be retried after the backoff");
    expect_contains("the timeout error", e->error, "timed out");
    expect_status(&s, "a", "scheduled");

    set_now(&s, e->retry_at);
    expect_start(&s, "w1", NULL, "a");
    first = run_timers(&s, ws_get(s.ws, "a")->deadline);
    check_event_types("the last attempt timing out", &s.log, first, "timed_out dead");
    CHECK(s.log.items[first].retry_at == 0, "no retry after the last attempt");
    expect_status(&s, "a", NULL);
    CHECK(!strcmp(proj_get(&s.proj, "a")->status, "dead"), "the projection should say dead");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_silent_worker_is_lost(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    seen(&s, "idle", "j1");
    submit_one(&s, (Spec){.id = "a", .timeout_ms = 60000});
    submit_one(&s, (Spec){.id = "b", .timeout_ms = 60000, .max_attempts = 1});
    expect_start(&s, "w1", NULL, "a");
    expect_start(&s, "w1", NULL, "b");
    CHECK(ws_next_deadline(s.ws) == T0 + CFG.worker_timeout_ms,
          "the next deadline should be the workers' timeout");
    set_now(&s, T0 + 5000);
    size_t first = s.log.len;
    seen(&s, "w1", "i1");
    check_event_types("a heartbeat from the same instance", &s.log, first, "");
    set_now(&s, T0 + CFG.worker_timeout_ms);
    CHECK(!ws_worker_get(s.ws, "idle"), "a silent worker holding nothing should be forgotten");
    CHECK(ws_worker_get(s.ws, "w1"), "a worker that heartbeats should be kept");

    int64_t lost_at = T0 + 5000 + CFG.worker_timeout_ms;
    first = run_timers(&s, lost_at - 1);
    check_event_types("timers while the worker is alive", &s.log, first, "");
    /* Past its timeout the worker holds attempts: ws_advance keeps it until they end. */
    set_now(&s, lost_at);
    CHECK(ws_worker_get(s.ws, "w1"), "a lost worker must be kept while it holds attempts");
    first = run_timers(&s, lost_at);
    char *types = event_types(&s.log, first);
    CHECK(!strcmp(types, "failed failed dead") || !strcmp(types, "failed dead failed"),
          "the lost worker's attempts should fail (and 'b', with no attempt left, die), "
          "got [%s]",
          types);
    free(types);
    for (size_t i = first; i < s.log.len; i++)
        expect_contains("the failure", s.log.items[i].error, "worker w1 lost");
    expect_status(&s, "a", "scheduled");
    expect_status(&s, "b", NULL);
    CHECK(!ws_worker_get(s.ws, "w1"), "the lost worker should be forgotten once it holds nothing");
    expect_replayable(&s);
    sim_free(&s);
}

static void test_deadline_and_lost_worker_end_the_attempt_once(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    submit_one(&s, (Spec){.id = "a", .timeout_ms = 1000});
    expect_start(&s, "w1", NULL, "a");
    size_t first = run_timers(&s, T0 + 60000);
    check_event_types("a lease and a worker that both ran out", &s.log, first, "timed_out");
    sim_free(&s);
}

static void test_restarted_worker_loses_its_attempts(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    seen(&s, "w2", "j1");
    submit_one(&s, (Spec){.id = "a"});
    submit_one(&s, (Spec){.id = "b"});
    submit_one(&s, (Spec){.id = "c"});
    expect_start(&s, "w1", NULL, "a");
    expect_start(&s, "w2", NULL, "b");
    expect_start(&s, "w1", NULL, "c");
    size_t first = s.log.len;
    seen(&s, "w1", "i1");
    seen(&s, "w1", NULL);
    check_event_types("heartbeats from the same instance", &s.log, first, "");
    seen(&s, "w1", "i2");
    check_event_types("w1 coming back as another instance", &s.log, first, "failed failed");
    for (size_t i = first; i < s.log.len; i++) {
        CHECK(strcmp(s.log.items[i].work_id, "b") != 0, "w2's attempt must not be touched");
        expect_contains("the failure", s.log.items[i].error, "restarted");
    }
    expect_status(&s, "b", "running");
    CHECK(!strcmp(ws_worker_get(s.ws, "w1")->instance, "i2"), "w1 should now be instance i2");
    expect_replayable(&s);
    sim_free(&s);
}

/* A completion of attempt 1 of id, sent as worker (instance, claim). */
static ReportResult report_as(Sim *s, const char *worker, const char *instance, bool claim,
                              const char *id, bool completed, bool retry)
{
    Report r = {.work_id = id,
                .attempt = 1,
                .worker_id = worker,
                .instance = instance,
                .claim = claim,
                .completed = completed,
                .result = json_null(),
                .error = "boom",
                .retry = retry};
    ReportResult res;
    ws_decide_report(s->ws, &r, NULL, s->now, &s->out, &res);
    sim_emit(s);
    return res;
}

/* Issue 13.3: with worker A's token one could complete or kill worker B's
 * attempt. A report of the current attempt is now bound to the worker id that
 * holds it and to that worker's registered instance. */
static void test_only_the_holder_may_report(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    seen(&s, "w2", "j1");
    submit_one(&s, (Spec){.id = "a"});
    expect_start(&s, "w1", NULL, "a");
    size_t first = s.log.len;
    expect_report("w2 completing w1's attempt", report_as(&s, "w2", "j1", true, "a", true, true),
                  false, "not-holder");
    expect_report("w2 killing w1's attempt", report_as(&s, "w2", "j1", true, "a", false, false),
                  false, "not-holder");
    expect_report("a report naming no worker", report_as(&s, NULL, NULL, true, "a", true, true),
                  false, "not-holder");
    expect_report("w1's id with another instance",
                  report_as(&s, "w1", "i-forged", true, "a", true, true), false, "not-holder");
    expect_report("w1's id without its instance, from a sender who may not claim it",
                  report_as(&s, "w1", NULL, false, "a", true, true), false, "not-holder");
    check_event_types("refused reports", &s.log, first, "");
    expect_status(&s, "a", "running");
    expect_report("w1 itself", report_as(&s, "w1", "i1", false, "a", true, true), true,
                  "completed");
    check_event_types("the holder's completion", &s.log, first, "completed");
    /* A sender who may claim the id (a bound token, an open server) need not
     * name the instance. */
    submit_one(&s, (Spec){.id = "b"});
    expect_start(&s, "w2", NULL, "b");
    expect_report("w2 by a bound token", report_as(&s, "w2", NULL, true, "b", true, true), true,
                  "completed");
    expect_replayable(&s);
    sim_free(&s);
}

/* Re-registering or deregistering someone else's live worker id. */
static void test_a_live_worker_id_belongs_to_its_instance(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    Err err;
    err_clear(&err);
    CHECK(ws_check_worker(s.ws, "w1", "i1", false, s.now, &err) == 0,
          "the registered instance may act for its id: %s", err.msg);
    CHECK(ws_check_worker(s.ws, "w-new", "x", false, s.now, &err) == 0,
          "an unknown id is anyone's to register: %s", err.msg);
    CHECK(ws_check_worker(s.ws, "w1", "i2", false, s.now, &err) != 0 && err.status == 409 &&
              !strcmp(err.type, "worker-id-taken"),
          "another instance of a live worker, without a claim, should be refused with 409 "
          "worker-id-taken, not %d %s",
          err.status, err.type);
    CHECK(ws_check_worker(s.ws, "w1", NULL, false, s.now, &err) != 0,
          "a request naming no instance, without a claim, should be refused");
    CHECK(ws_check_worker(s.ws, "w1", "i2", true, s.now, &err) == 0,
          "a claim (a bound token) may take the id over, as after a restart");
    set_now(&s, T0 + CFG.worker_timeout_ms);
    CHECK(ws_check_worker(s.ws, "w1", "i2", false, s.now, &err) == 0,
          "once the registered instance is silent past the timeout, anyone may take the id");
    sim_free(&s);
}

static void test_forgotten_worker_loses_its_attempts(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    submit_one(&s, (Spec){.id = "a", .max_attempts = 1});
    submit_one(&s, (Spec){.id = "b"});
    expect_start(&s, "w1", NULL, "a");
    expect_start(&s, "w1", NULL, "b");
    size_t first = s.log.len;
    ws_worker_forget(s.ws, "w1", s.now, &s.out);
    sim_emit(&s);
    char *types = event_types(&s.log, first);
    CHECK(!strcmp(types, "failed dead failed") || !strcmp(types, "failed failed dead"),
          "forgetting w1 should fail both attempts and kill 'a', got [%s]", types);
    free(types);
    expect_contains("the failure", s.log.items[first].error, "w1");
    CHECK(!ws_worker_get(s.ws, "w1"), "a forgotten worker should be gone");
    expect_status(&s, "b", "scheduled");
    first = s.log.len;
    ws_worker_forget(s.ws, "w1", s.now, &s.out);
    ws_worker_forget(s.ws, "never-seen", s.now, &s.out);
    sim_emit(&s);
    check_event_types("forgetting unknown workers", &s.log, first, "");
    sim_free(&s);
}

static void test_recovered_running_work_keeps_its_lease(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    seen(&s, "w2", "j1");
    submit_one(&s, (Spec){.id = "a", .timeout_ms = 600000});
    submit_one(&s, (Spec){.id = "b", .timeout_ms = 600000});
    submit_one(&s, (Spec){.id = "p"});
    expect_start(&s, "w1", NULL, "a");
    expect_start(&s, "w2", NULL, "b");

    /* A new leader: the open work from the projection, no workers yet. */
    set_now(&s, T0 + 3000);
    WorkState *ws = sim_recover(&s);
    char *d = state_diff("the recovered state", &s, ws);
    CHECK(!d, "%s", d);
    CHECK(!ws_worker_get(ws, "w1"), "recovery alone should not know any worker");
    ws_adopt_running_workers(ws, s.now);
    const WsWorker *w = ws_worker_get(ws, "w1");
    CHECK(w && !w->instance && w->last_seen == s.now,
          "w1, named by a running attempt, should be adopted with no instance, seen now");
    CHECK(ws_worker_get(ws, "w2"), "w2 should be adopted");
    ws_free(s.ws);
    s.ws = ws;

    /* w1 heartbeats (its instance is news, not a restart); w2 stays silent. */
    set_now(&s, T0 + 5000);
    size_t first = s.log.len;
    seen(&s, "w1", "i1");
    check_event_types("the first heartbeat after recovery", &s.log, first, "");
    first = run_timers(&s, T0 + 3000 + CFG.worker_timeout_ms);
    check_event_types("the adopted worker that never came back", &s.log, first, "failed");
    CHECK(!strcmp(s.log.items[first].work_id, "b"), "the silent w2's attempt should fail");
    expect_status(&s, "a", "running");
    expect_start(&s, "w1", NULL, "p");
    expect_replayable(&s);
    sim_free(&s);
}

/* A worker that heartbeats without an attempt it was handed a worker timeout
 * ago never got the job (the answer to its pull was lost): it is retried. */
static void test_attempts_a_worker_does_not_list_fail(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    seen(&s, "w1", "i1");
    submit_one(&s, (Spec){.id = "listed", .timeout_ms = 600000});
    submit_one(&s, (Spec){.id = "lost", .timeout_ms = 600000});
    submit_one(&s, (Spec){.id = "young", .timeout_ms = 600000});
    expect_start(&s, "w1", NULL, "listed");
    expect_start(&s, "w1", NULL, "lost");
    set_now(&s, T0 + CFG.worker_timeout_ms - 1);
    expect_start(&s, "w1", NULL, "young");
    json_t *running_json = J("[{\"id\": \"listed\", \"attempt\": 1}, {\"id\": \"gone\", "
                             "\"attempt\": 4}, {\"id\": \"lost\", \"attempt\": 2}]");
    RunningList *running = running_list(running_json);
    size_t first = s.log.len;
    ws_worker_seen(s.ws, "w1", "i1", 0, NULL, running, s.now, &s.out);
    sim_emit(&s);
    check_event_types("a heartbeat within the worker timeout", &s.log, first, "");
    set_now(&s, T0 + CFG.worker_timeout_ms);
    ws_worker_seen(s.ws, "w1", "i1", 0, NULL, NULL, s.now, &s.out);
    sim_emit(&s);
    check_event_types("a pull (which lists nothing)", &s.log, first, "");
    ws_worker_seen(s.ws, "w1", "i1", 0, NULL, running, s.now, &s.out);
    sim_emit(&s);
    check_event_types("a heartbeat without 'lost' attempt 1", &s.log, first, "failed");
    CHECK(!strcmp(s.log.items[first].work_id, "lost"),
          "only 'lost' (not listed, handed out a worker timeout ago) should fail");
    expect_contains("the failure", s.log.items[first].error, "never reached");
    expect_status(&s, "listed", "running");
    expect_status(&s, "young", "running");

    /* A restarted worker lists nothing: each attempt fails once, as restarted. */
    set_now(&s, T0 + 2 * CFG.worker_timeout_ms);
    first = s.log.len;
    json_t *none_json = json_array();
    RunningList *none = running_list(none_json);
    ws_worker_seen(s.ws, "w1", "i2", 0, NULL, none, s.now, &s.out);
    sim_emit(&s);
    check_event_types("a heartbeat from a restarted worker", &s.log, first, "failed failed");
    for (size_t i = first; i < s.log.len; i++)
        expect_contains("the failure", s.log.items[i].error, "restarted");
    ws_running_free(none);
    json_decref(none_json);
    ws_running_free(running);
    json_decref(running_json);
    expect_replayable(&s);
    sim_free(&s);
}

/* ---- applying and the registry ---- */

/* Applies one hand-made event (stamped with the next seq) to the state alone. */
static void apply_raw(Sim *s, EventType type, const char *id, int attempt)
{
    Event ev = {.seq = ++s->seq, .term = s->term, .at = s->now, .version = EVENT_VERSION};
    Event *e = &ev;
    e->type = type;
    e->work_id = xstrdup(id);
    e->attempt = attempt;
    if (type == EV_ACCEPTED) {
        e->queue = xstrdup("default");
        e->payload = json_string("other");
        e->timeout_ms = 1;
        e->max_attempts = 1;
    } else if (type == EV_STARTED) {
        e->worker_id = xstrdup("intruder");
        e->deadline = s->now + 1;
    } else if (type == EV_FAILED || type == EV_TIMED_OUT) {
        e->error = xstrdup("stale");
        e->retry_at = s->now + 1;
    } else if (type == EV_COMPLETED) {
        e->result = json_null();
    }
    ws_apply(s->ws, e);
    event_clear(e);
}

/* Replaying an old log meets events that no longer fit: they change nothing. */
static void test_apply_ignores_events_that_do_not_fit(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "a", .max_attempts = 3});
    submit_one(&s, (Spec){.id = "p"});
    expect_start(&s, "w1", NULL, "a");
    report(&s, "a", 1, false, true, "boom");
    set_now(&s, ws_get(s.ws, "a")->run_at);
    expect_start(&s, "w1", NULL, "a");
    json_t *before = state_dump(s.ws);
    static const struct {
        EventType type;
        const char *id;
        int attempt;
    } misfits[] = {
        {EV_ACCEPTED, "a", 0}, {EV_STARTED, "a", 3},   {EV_COMPLETED, "a", 1},
        {EV_FAILED, "a", 1},   {EV_TIMED_OUT, "a", 3}, {EV_COMPLETED, "p", 1},
        {EV_FAILED, "p", 0},   {EV_STARTED, "zz", 1},  {EV_COMPLETED, "zz", 1},
        {EV_FAILED, "zz", 1},  {EV_DEAD, "zz", 0},     {EV_CANCELLED, "zz", 0},
    };
    for (size_t i = 0; i < sizeof misfits / sizeof *misfits; i++) {
        apply_raw(&s, misfits[i].type, misfits[i].id, misfits[i].attempt);
        json_t *after = state_dump(s.ws);
        char what[96];
        snprintf(what, sizeof what, "the state after a misfit %s event for '%s' attempt %d",
                 event_type_name(misfits[i].type), misfits[i].id, misfits[i].attempt);
        check_json_equal(what, before, after);
        json_decref(after);
    }
    json_decref(before);
    sim_free(&s);
}

/* ---- webhook subscriptions ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every subscription of ws, by name, one line each (sub_text); without
 * secrets, every secret shown as (null). Caller frees. */
static char *subs_text(const WorkState *ws, bool secrets)
{
    const SubscriptionSet *set = ws_subscriptions(ws);
    size_t n = subs_count(set), j = 0;
    char **lines = xcalloc(n + 1, sizeof *lines);
    const Subscription *x;
    for (size_t i = 0; (x = subs_next(set, &i));) {
        Subscription shown = *x;
        if (!secrets)
            shown.secret = NULL;
        lines[j++] = sub_text(&shown);
    }
    qsort(lines, n, sizeof *lines, cmp_str);
    SBuf b;
    sbuf_init(&b);
    for (size_t i = 0; i < n; i++) {
        sbuf_printf(&b, "%s\n", lines[i]);
        free(lines[i]);
    }
    free(lines);
    return sbuf_steal(&b);
}

static void expect_subs(const char *what, const WorkState *ws, const char *want)
{
    char *got = subs_text(ws, true);
    CHECK(!strcmp(got, want), "%s:\n%s\nshould be:\n%s", what, got, want);
    free(got);
}

/* An operator's PUT of a subscription (reset: with "after"). */
static void sub_put(Sim *s, const char *name, const char *url, const char *secret,
                    const char *queues, const char *kinds, bool paused, int64_t after)
{
    Subscription set = {.name = (char *)name,
                        .url = (char *)url,
                        .secret = (char *)secret,
                        .queues = queues ? strv_split(queues) : NULL,
                        .kinds = strv_split(kinds),
                        .paused = paused,
                        .cursor = at_seq(after < 0 ? 0 : after)};
    Err err = {0};
    Cursor start = at_seq(s->seq);
    CHECK(subs_decide_set(ws_subscriptions(s->ws), &set, after >= 0, &start, s->now, &s->out,
                          &err) == 0,
          "PUT %s refused: %s", name, err.msg);
    strv_free(set.queues);
    strv_free(set.kinds);
    sim_emit(s);
}

#define SECRET_A "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define SECRET_B "whsec_dGhpcnR5LXR3by1ieXRlcy1vZi1zZWNyZXQh"

/* The subscription events fold into the state as the database folds them
 * into workd_subscriptions: a new one starts at the log's end, a PUT keeps
 * the cursor unless it names one, cursors only move forward, workd's pause
 * keeps the settings, a deletion forgets it. */
static void test_subscriptions_follow_their_events(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    submit_one(&s, (Spec){.id = "x"}); /* seq 1: a log that does not start empty */
    const SubscriptionSet *subs = ws_subscriptions(s.ws);
    sub_put(&s, "a", "https://a.example/h", SECRET_A, NULL, "completed,dead", false, -1);
    sub_put(&s, "b", "https://u:p@b.example/h", SECRET_B, "mail,sms", "dead", false, 0);
    expect_subs("after two PUTs", s.ws,
                "a url=https://a.example/h secret=" SECRET_A " queues=(all) kinds=completed,dead "
                "paused=0 reason=(null) cursor=1\n"
                "b url=https://u:p@b.example/h secret=" SECRET_B " queues=mail,sms kinds=dead "
                "paused=0 reason=(null) cursor=0\n");
    subs_decide_cursor(subs, "a", AT(9), s.now, &s.out);
    subs_decide_cursor(subs, "a", AT(4), s.now, &s.out); /* behind: ignored */
    subs_decide_cursor(subs, "gone", AT(4), s.now, &s.out);
    CHECK(s.out.len == 2, "a cursor for a subscription that does not exist decides nothing");
    sim_emit(&s);
    CHECK(subs_decide_pause(subs, "b", "failing since 60000 ms ago", AT(s.seq), s.now, &s.out),
          "the pause of b should be decided");
    sim_emit(&s);
    CHECK(!subs_decide_pause(subs, "b", "again", AT(s.seq), s.now, &s.out) && !s.out.len,
          "a paused subscription is not paused again");
    sub_put(&s, "a", "https://a2.example/h", SECRET_B, "mail", "dead", true, -1);
    expect_subs("after cursors, workd's pause of b and a PUT of a", s.ws,
                "a url=https://a2.example/h secret=" SECRET_B " queues=mail kinds=dead "
                "paused=1 reason=(null) cursor=9\n"
                "b url=https://u:p@b.example/h secret=" SECRET_B " queues=mail,sms kinds=dead "
                "paused=1 reason=failing since 60000 ms ago cursor=0\n");
    Err err = {0};
    CHECK(subs_decide_delete(subs, "nope", AT(s.seq), s.now, &s.out, &err) != 0 &&
              err.status == 404,
          "deleting what does not exist is a 404, not %d", err.status);
    CHECK(subs_decide_delete(subs, "b", AT(s.seq), s.now, &s.out, &err) == 0, "%s", err.msg);
    sim_emit(&s);
    expect_subs("after b's deletion", s.ws,
                "a url=https://a2.example/h secret=" SECRET_B " queues=mail kinds=dead "
                "paused=1 reason=(null) cursor=9\n");
    sim_free(&s);
}

/* Replaying the log rebuilds the subscriptions, and so does replaying it as
 * the database gives it back, without the secrets (migration 0016): then
 * everything but the secrets, which recovery reads from workd_subscriptions. */
static void test_subscriptions_replay_from_the_log(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    const SubscriptionSet *subs = ws_subscriptions(s.ws);
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "hook-%d", i);
        sub_put(&s, name, "https://h.example/x", i % 2 ? SECRET_A : SECRET_B, i % 3 ? "mail" : NULL,
                "completed", false, i == 2 ? 0 : -1);
        subs_decide_cursor(subs, name, AT(s.seq + i), s.now, &s.out);
        sim_emit(&s);
    }
    CHECK(subs_decide_pause(subs, "hook-1", "failing", AT(s.seq), s.now, &s.out), "hook-1's pause");
    sim_emit(&s);
    sub_put(&s, "hook-3", "https://h.example/y", SECRET_B, NULL, "dead", false, 2);
    Err err = {0};
    CHECK(subs_decide_delete(subs, "hook-4", AT(s.seq), s.now, &s.out, &err) == 0, "%s", err.msg);
    sim_emit(&s);
    CHECK(subs_count(subs) == 4, "4 subscriptions should be left, not %zu", subs_count(subs));
    char *live = subs_text(s.ws, true);

    WorkState *replayed = sim_replay(&s);
    char *got = subs_text(replayed, true);
    CHECK(!strcmp(live, got), "replayed from the log:\n%s\nlive:\n%s", got, live);
    free(got);
    ws_free(replayed);

    replayed = ws_new(&CFG);
    for (size_t i = 0; i < s.log.len; i++) {
        json_t *data = event_data_encode(&s.log.items[i]);
        json_object_del(data, "secret"); /* as the database keeps the log */
        Event e;
        CHECK(event_decode(s.log.items[i].seq, 1, T0, event_type_name(s.log.items[i].type), 1,
                           s.log.items[i].work_id, data, &e, &err) == 0,
              "seq %zu: %s", i + 1, err.msg);
        CHECK(!e.sub || !e.sub->secret, "the log as stored holds no secret");
        ws_apply(replayed, &e);
        event_clear(&e);
        json_decref(data);
    }
    char *want = subs_text(s.ws, false);
    got = subs_text(replayed, false);
    CHECK(!strcmp(want, got), "replayed from the stored log (no secrets):\n%s\nlive:\n%s", got,
          want);
    free(got);
    free(want);
    const Subscription *x;
    for (size_t i = 0; (x = subs_next(ws_subscriptions(replayed), &i));)
        CHECK(!x->secret, "a replay cannot know %s's secret", x->name);
    /* What recovery does: the secrets from workd_subscriptions. */
    for (size_t i = 0; (x = subs_next(subs, &i));)
        ws_subscription_restore(replayed, x);
    got = subs_text(replayed, true);
    CHECK(!strcmp(live, got), "with the table's secrets:\n%s\nlive:\n%s", got, live);
    free(got);
    free(live);
    ws_free(replayed);
    sim_free(&s);
}

/* workd's pause must carry the secret (the database takes the one of the
 * last event): without one, nothing is decided. */
static void test_a_pause_needs_the_secret(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    sub_put(&s, "a", "https://a.example/h", SECRET_A, NULL, "completed", false, -1);
    Event *e = eventlist_push(&s.out); /* as the log gives it back: no secret */
    e->type = EV_SUBSCRIPTION;
    e->sub = xcalloc(1, sizeof *e->sub);
    e->sub->name = xstrdup("b");
    e->sub->url = xstrdup("https://b.example/h");
    e->sub->kinds = strv_split("dead");
    sim_emit(&s);
    const SubscriptionSet *subs = ws_subscriptions(s.ws);
    CHECK(!subs_decide_pause(subs, "b", "failing", AT(s.seq), s.now, &s.out) && !s.out.len,
          "a subscription whose secret is not known is not paused");
    CHECK(subs_decide_pause(subs, "a", "failing", AT(s.seq), s.now, &s.out) && s.out.len == 1 &&
              s.out.items[0].sub->secret && !strcmp(s.out.items[0].sub->secret, SECRET_A),
          "a's pause should carry its secret");
    sim_emit(&s);
    sim_free(&s);
}

/* SUBS_MAX subscriptions at most: a new one past it is refused, a change
 * of one that exists is not. */
static void test_subscriptions_are_bounded(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    char name[16];
    for (int i = 0; i < SUBS_MAX; i++) {
        snprintf(name, sizeof name, "h%d", i);
        sub_put(&s, name, "https://h.example/x", SECRET_A, NULL, "dead", false, -1);
    }
    Subscription set = {.name = "one-more",
                        .url = "https://h",
                        .secret = SECRET_A,
                        .kinds = (char *[]){"dead", NULL}};
    Err err = {0};
    CHECK(subs_decide_set(ws_subscriptions(s.ws), &set, false, AT(s.seq), s.now, &s.out, &err) !=
                  0 &&
              err.status == 409 && !strcmp(err.type, "too-many-subscriptions") && !s.out.len,
          "subscription %d should be refused (409 too-many-subscriptions), not %d %s", SUBS_MAX + 1,
          err.status, err.type);
    set.name = "h0";
    CHECK(subs_decide_set(ws_subscriptions(s.ws), &set, false, AT(s.seq), s.now, &s.out, &err) == 0,
          "a change of one that exists is taken: %s", err.msg);
    sim_emit(&s);
    sim_free(&s);
}

static void test_worker_registry(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    char qa[] = "a", qb[] = "b";
    char *queues[] = {qa, qb, NULL};
    json_t *running_json = J("[{\"id\": \"x\", \"attempt\": 1}]");
    RunningList *running = running_list(running_json);
    ws_worker_seen(s.ws, "w1", "i1", 4, queues, running, s.now, &s.out);
    ws_worker_seen(s.ws, "w2", "j1", 1, NULL, NULL, s.now, &s.out);
    qa[0] = 'z'; /* the registry keeps copies of the queues */
    set_now(&s, T0 + 1000);
    ws_worker_seen(s.ws, "w1", NULL, 0, NULL, NULL, s.now, &s.out);
    CHECK(s.out.len == 0, "registering workers decides no events");
    const WsWorker *w = ws_worker_get(s.ws, "w1");
    CHECK(w && !strcmp(w->instance, "i1") && w->capacity == 4 && w->last_seen == T0 + 1000,
          "a heartbeat without instance or capacity keeps them and refreshes last_seen");
    CHECK(w->queues && !strcmp(w->queues[0], "a") && !strcmp(w->queues[1], "b") && !w->queues[2],
          "a heartbeat without queues keeps the worker's copy of its queues");
    CHECK(w->running && w->running->n == 1 && !strcmp(w->running->items[0].work_id, "x") &&
              w->running->items[0].attempt == 1,
          "the registry keeps what the worker runs");
    size_t pos = 0, n = 0;
    while ((w = ws_worker_next(s.ws, &pos)))
        n++;
    CHECK(n == 2, "iterating the registry should visit 2 workers, not %zu", n);
    ws_running_free(running);
    json_decref(running_json);
    sim_free(&s);
}

/* ---- property test ---- */

typedef struct Rng {
    uint64_t s;
} Rng;

static uint64_t rng_next(Rng *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int rng_below(Rng *r, int n)
{
    return (int)(rng_next(r) % (uint64_t)n);
}

static bool rng_chance(Rng *r, int percent)
{
    return rng_below(r, 100) < percent;
}

#define N_WORKERS 3

typedef struct PropWorker {
    char id[8];
    char instance[32];
    int restarts;
    char *queues[4]; /* NULL-terminated; borrowed literals */
} PropWorker;

/* How often the random commands reached each outcome, over all sequences: a
 * generator that stops reaching one no longer tests it. */
enum {
    COV_EXISTING,
    COV_CONFLICT,
    COV_FULL,
    COV_STALE_REPORT,
    COV_DUP_REPORT,
    COV_CANCELLED,
    COV_CANCEL_RUNNING,
    COV_CANCEL_UNKNOWN,
    COV_COMPLETED,
    COV_RETRIED,
    COV_DEAD,
    COV_TIMED_OUT,
    COV_LOST,
    COV_RESTARTED,
    COV_LEFT,
    COV_UNCLAIMED,
    COV_REOPENED,
    COV_RETRY_REFUSED,
    COV_FAILOVER,
    COV_N
};

static const char *const COV_NAMES[COV_N] = {
    "resubmitted work",
    "conflicting resubmissions",
    "full queues",
    "stale reports",
    "duplicate final reports",
    "cancellations",
    "cancelling running work",
    "cancelling unknown work",
    "completions",
    "retries",
    "dead work",
    "timeouts",
    "lost workers",
    "restarted workers",
    "forgotten workers",
    "jobs that never reached their worker",
    "retries of dead work",
    "refused retries",
    "failovers",
};

typedef struct Coverage {
    long n[COV_N];
} Coverage;

typedef struct Prop {
    Coverage *cov;
    Sim s;
    Rng rng;
    uint64_t seed;
    int step;
    char what[160]; /* the command being checked, for messages */
    char **ids;     /* every id ever submitted (owned) */
    size_t n_ids, cap_ids;
    int next_id;
    HMap finished; /* id -> final status, from the events (keys borrowed from the log);
                      a retry of dead work takes it out again */
    HMap accepted; /* id -> id, from the events */
    PropWorker workers[N_WORKERS];
    int64_t failover_at; /* the last failover: a recovered attempt's grace starts there */
} Prop;

static void prop_fail(const Prop *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void prop_fail(const Prop *p, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_msg("property test, sequence seed %llu, step %d, %s: %s\n"
             "  reproduce with WORKD_TEST_SEED=%llu WORKD_TEST_SEQUENCES=1",
             (unsigned long long)p->seed, p->step, p->what, msg, (unsigned long long)p->seed);
}

#define PCHECK(p, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            prop_fail(p, __VA_ARGS__);                                                             \
    } while (0)

static const char *const QUEUES[] = {"a", "b", "c"};

static const char *pick_id(Prop *p)
{
    if (p->n_ids == 0 || rng_chance(&p->rng, 45)) {
        char id[32];
        snprintf(id, sizeof id, "id%d", p->next_id++);
        if (p->n_ids == p->cap_ids) {
            p->cap_ids = p->cap_ids ? p->cap_ids * 2 : 64;
            p->ids = xrealloc(p->ids, p->cap_ids * sizeof *p->ids);
        }
        p->ids[p->n_ids++] = xstrdup(id);
        return p->ids[p->n_ids - 1];
    }
    return p->ids[rng_below(&p->rng, (int)p->n_ids)];
}

/* The open items as the state shows them (new reference). */
static json_t *open_items(const Prop *p)
{
    return state_dump(p->s.ws);
}

static const char *jstr(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static int64_t jint(json_t *o, const char *key)
{
    return json_integer_value(json_object_get(o, key));
}

/* A random open item (borrowed from items), or NULL; running only if asked. */
static json_t *pick_open(Prop *p, json_t *items, bool running_only)
{
    json_t *cand[256] = {0};
    size_t n = 0, i;
    json_t *it;
    json_array_foreach(items, i, it)
    {
        if (n < 256 && (!running_only || !strcmp(jstr(it, "status"), "running")))
            cand[n++] = it;
    }
    return n ? cand[rng_below(&p->rng, (int)n)] : NULL;
}

/* Checks the events just decided (in p->s.out) against rules that hold for
 * every command, then emits them and records what they finish. */
static void prop_emit(Prop *p)
{
    Sim *s = &p->s;
    for (size_t i = 0; i < s->out.len; i++) {
        const Event *e = &s->out.items[i];
        const char *id = e->work_id;
        if (e->type == EV_TERM)
            continue;
        const char *was = hmap_get(&p->finished, id);
        if (e->type == EV_RETRIED) {
            PCHECK(p, was && !strcmp(was, "dead") && !ws_get(s->ws, id),
                   "'%s' is reopened by a retry, but it is %s", id, was ? was : "not finished");
            continue;
        }
        PCHECK(p, !was, "a %s event for '%s', which is already %s", event_type_name(e->type), id,
               was);
        if (e->type == EV_ACCEPTED) {
            PCHECK(p, !hmap_get(&p->accepted, id),
                   "'%s' accepted a second time (the database refuses that)", id);
            continue;
        }
        PCHECK(p, ws_get(s->ws, id), "a %s event for '%s', which is not open",
               event_type_name(e->type), id);
        /* One command ends an attempt once: only dead follows its failure. */
        int before = 0;
        for (size_t k = 0; k < i; k++) {
            const Event *f = &s->out.items[k];
            before += f->work_id && !strcmp(f->work_id, id) && f->type != EV_STARTED;
        }
        PCHECK(p, before == (e->type == EV_DEAD),
               "'%s' gets a %s event after %d others in one batch: an attempt ends once", id,
               event_type_name(e->type), before);
        if (e->type == EV_FAILED || e->type == EV_TIMED_OUT) {
            const WorkItem *it = ws_get(s->ws, id);
            PCHECK(p, it->status == WORK_RUNNING && e->attempt == it->attempt,
                   "%s for '%s' attempt %d, which is not the running attempt %d",
                   event_type_name(e->type), id, e->attempt, it->attempt);
            bool last = i + 1 < s->out.len && s->out.items[i + 1].type == EV_DEAD &&
                        !strcmp(s->out.items[i + 1].work_id, id);
            if (e->retry_at) {
                int64_t want = s->now + ws_backoff_ms(&s->cfg, id, e->attempt);
                PCHECK(p, e->retry_at == want && !last,
                       "'%s' attempt %d should retry at now + backoff = %lld, not %lld%s", id,
                       e->attempt, (long long)want, (long long)e->retry_at,
                       last ? " and must not die" : "");
            } else {
                PCHECK(p, last, "'%s' has no retry after attempt %d, so dead must follow", id,
                       e->attempt);
            }
        }
        if (e->type == EV_DEAD)
            PCHECK(p,
                   i > 0 && !strcmp(s->out.items[i - 1].work_id, id) &&
                       (s->out.items[i - 1].type == EV_FAILED ||
                        s->out.items[i - 1].type == EV_TIMED_OUT),
                   "dead for '%s' does not follow the failure of its last attempt", id);
    }
    size_t first = sim_emit(s);
    for (size_t i = first; i < s->log.len; i++) {
        const Event *e = &s->log.items[i];
        if (e->type == EV_ACCEPTED)
            hmap_put(&p->accepted, e->work_id, e->work_id);
        else if (event_is_final(e->type))
            hmap_put(&p->finished, e->work_id, (void *)event_type_name(e->type));
        else if (e->type == EV_RETRIED)
            hmap_del(&p->finished, e->work_id);
        Coverage *c = p->cov;
        c->n[COV_COMPLETED] += e->type == EV_COMPLETED;
        c->n[COV_CANCELLED] += e->type == EV_CANCELLED;
        c->n[COV_DEAD] += e->type == EV_DEAD;
        c->n[COV_TIMED_OUT] += e->type == EV_TIMED_OUT;
        c->n[COV_RETRIED] += (e->type == EV_FAILED || e->type == EV_TIMED_OUT) && e->retry_at;
        if (e->type == EV_FAILED) {
            c->n[COV_LOST] += strstr(e->error, " lost") != NULL;
            c->n[COV_RESTARTED] += strstr(e->error, " restarted") != NULL;
            c->n[COV_LEFT] += strstr(e->error, " left") != NULL;
            c->n[COV_UNCLAIMED] += strstr(e->error, "never reached") != NULL;
        }
    }
}

/* ---- commands, each with its expected outcome ---- */

static void cmd_submit(Prop *p)
{
    Sim *s = &p->s;
    size_t n = 1 + (size_t)rng_below(&p->rng, 4);
    static const char *const payloads[] = {"0", "1", "{\"v\": 1}"};
    static const int64_t timeouts[] = {100, 1000, 4000, 10000};
    Spec specs[4];
    for (size_t i = 0; i < n; i++) {
        int64_t run_at = 0;
        if (rng_chance(&p->rng, 30))
            run_at = s->now + 1 + rng_below(&p->rng, 4000);
        else if (rng_chance(&p->rng, 5))
            run_at = s->now - rng_below(&p->rng, 1000);
        specs[i] = (Spec){.id = pick_id(p),
                          .queue = QUEUES[rng_below(&p->rng, 3)],
                          .payload = payloads[rng_below(&p->rng, 3)],
                          .priority = rng_below(&p->rng, 4) - 1,
                          .run_at = run_at,
                          .timeout_ms = timeouts[rng_below(&p->rng, 4)],
                          .max_attempts = 1 + rng_below(&p->rng, 3)};
    }
    snprintf(p->what, sizeof p->what, "submitting %zu items (first '%s')", n, specs[0].id);

    /* Expected: the first conflict or overflow, in order, refuses everything. */
    int want_status = 0;
    size_t created = 0;
    json_t *payload[4] = {0};
    const char *want_res[4] = {0};
    bool want_new[4] = {0};
    for (size_t i = 0; i < n && !want_status; i++) {
        payload[i] = J(specs[i].payload);
        const WorkItem *open = ws_get(s->ws, specs[i].id);
        const ProjRow *row = open ? NULL : proj_get(&s->proj, specs[i].id);
        json_t *existing = open ? open->payload : row ? row->payload : NULL;
        const char *status = open ? ws_item_status(open, s->now) : row ? row->status : NULL;
        for (size_t j = 0; j < i && !existing; j++)
            if (want_new[j] && !strcmp(specs[j].id, specs[i].id)) {
                existing = payload[j];
                status = want_res[j];
            }
        if (existing) {
            if (!json_equal(existing, payload[i]))
                want_status = 409;
            want_res[i] = status;
        } else if (ws_open_count(s->ws) + created + 1 > (size_t)s->cfg.max_open) {
            want_status = 429;
        } else {
            created++;
            want_new[i] = true;
            want_res[i] = specs[i].run_at > s->now ? "scheduled" : "pending";
        }
    }
    SubmitResult res[4];
    Err err;
    int rc = decide_submit(s, specs, n, res, &err);
    p->cov->n[COV_CONFLICT] += want_status == 409;
    p->cov->n[COV_FULL] += want_status == 429;
    for (size_t i = 0; !want_status && i < n; i++)
        p->cov->n[COV_EXISTING] += !want_new[i];
    if (want_status) {
        PCHECK(p, rc != 0 && err.status == want_status && s->out.len == 0,
               "should be refused with %d and no events, got rc %d, status %d, %zu events",
               want_status, rc, err.status, s->out.len);
    } else {
        PCHECK(p, rc == 0, "should be accepted but was refused: %d %s", err.status, err.msg);
        PCHECK(p, s->out.len == created, "%zu items are new but %zu events were decided", created,
               s->out.len);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            PCHECK(p, res[i].created == want_new[i] && !strcmp(res[i].status, want_res[i]),
                   "item %zu ('%s') should be created=%d %s, not created=%d %s", i, specs[i].id,
                   want_new[i], want_res[i], res[i].created, res[i].status);
            if (!want_new[i])
                continue;
            const Event *e = &s->out.items[k++];
            PCHECK(p,
                   e->type == EV_ACCEPTED && !strcmp(e->work_id, specs[i].id) &&
                       e->run_at == (specs[i].run_at > s->now ? specs[i].run_at : 0) &&
                       e->max_attempts == specs[i].max_attempts &&
                       e->timeout_ms == specs[i].timeout_ms && json_equal(e->payload, payload[i]),
                   "the accepted event for item %zu does not match it", i);
        }
    }
    for (size_t i = 0; i < n; i++)
        json_decref(payload[i]);
    prop_emit(p);
}

/* The ready item a worker with queues should get: highest priority, then
 * earliest accepted (borrowed from items), or NULL. */
static json_t *best_ready(json_t *items, char *const *queues, int64_t now)
{
    json_t *best = NULL, *it;
    size_t i;
    json_array_foreach(items, i, it)
    {
        if (strcmp(jstr(it, "status"), "pending") != 0 || jint(it, "run_at") > now)
            continue;
        if (queues && queues[0] && !strv_contains(queues, jstr(it, "queue")))
            continue;
        if (!best || jint(it, "priority") > jint(best, "priority") ||
            (jint(it, "priority") == jint(best, "priority") &&
             jint(it, "accepted_seq") < jint(best, "accepted_seq")))
            best = it;
    }
    return best;
}

/* Why an attempt held by the worker should fail (NULL: it should not). */
typedef const char *(*WhyFn)(const Prop *p, json_t *item, const void *arg);

/* Every attempt fails for the reason given as arg (a string; NULL: none). */
static const char *why_always(const Prop *p, json_t *item, const void *arg)
{
    return arg;
}

/* Checks that p->s.out holds exactly one failure of each attempt of worker
 * that why_of says fails (the items as they were before), with its reason,
 * plus the death of those with no attempt left, and nothing else. */
static void expect_attempts_failed(Prop *p, json_t *items, const char *worker, WhyFn why_of,
                                   const void *arg)
{
    size_t want = 0, i;
    json_t *it;
    json_array_foreach(items, i, it)
    {
        if (strcmp(jstr(it, "status"), "running") != 0 ||
            strcmp(jstr(it, "worker_id"), worker) != 0)
            continue;
        const char *why = why_of(p, it, arg);
        if (!why)
            continue;
        want += jint(it, "attempt") >= jint(it, "max_attempts") ? 2 : 1; /* and die */
        int found = 0;
        for (size_t k = 0; k < p->s.out.len; k++) {
            const Event *e = &p->s.out.items[k];
            found += e->type == EV_FAILED && !strcmp(e->work_id, jstr(it, "id")) &&
                     e->attempt == jint(it, "attempt") && strstr(e->error, why);
        }
        PCHECK(p, found == 1,
               "the attempt of '%s' held by %s should fail once ('%s'), not %d times",
               jstr(it, "id"), worker, why, found);
    }
    if (p->s.out.len != want) {
        SBuf b;
        sbuf_init(&b);
        for (size_t k = 0; k < p->s.out.len; k++) {
            const Event *e = &p->s.out.items[k];
            sbuf_printf(&b, "\n    %s '%s' attempt %d: %s", event_type_name(e->type), e->work_id,
                        e->attempt, e->error ? e->error : "");
        }
        prop_fail(p, "%zu events expected, %zu decided:%s", want, p->s.out.len, b.data);
    }
}

/* Sometimes the worker's process restarts: it comes back as a new instance. */
static void maybe_restart(Prop *p, PropWorker *w, int percent)
{
    if (!rng_chance(&p->rng, percent))
        return;
    char instance[sizeof w->instance];
    snprintf(instance, sizeof instance, "%s-i%d", w->id, ++w->restarts);
    memcpy(w->instance, instance, sizeof instance);
}

static void cmd_pull(Prop *p)
{
    Sim *s = &p->s;
    PropWorker *w = &p->workers[rng_below(&p->rng, N_WORKERS)];
    maybe_restart(p, w, 5);
    int max = 1 + rng_below(&p->rng, 3);
    snprintf(p->what, sizeof p->what, "a pull of %d by %s", max, w->id);
    json_t *items = open_items(p);
    const WsWorker *reg = ws_worker_get(s->ws, w->id);
    bool restarted = reg && reg->instance && strcmp(reg->instance, w->instance) != 0;
    ws_worker_seen(s->ws, w->id, w->instance, reg ? 0 : max, w->queues, NULL, s->now, &s->out);
    expect_attempts_failed(p, items, w->id, why_always, restarted ? "restarted" : NULL);
    json_decref(items);
    prop_emit(p);
    for (int n = 0; n < max; n++) {
        items = open_items(p);
        json_t *want = best_ready(items, w->queues, s->now);
        bool got = ws_decide_start(s->ws, w->id, w->queues, s->now, &s->out);
        if (!want) {
            PCHECK(p, !got && s->out.len == 0, "nothing is ready for %s, yet it got '%s'", w->id,
                   s->out.len ? s->out.items[0].work_id : "(no event)");
            json_decref(items);
            break;
        }
        PCHECK(p, got && s->out.len == 1, "'%s' is ready for %s, yet it got nothing",
               jstr(want, "id"), w->id);
        const Event *e = &s->out.items[0];
        PCHECK(p,
               e->type == EV_STARTED && !strcmp(e->work_id, jstr(want, "id")) &&
                   e->attempt == jint(want, "attempt") + 1 &&
                   e->deadline == s->now + jint(want, "timeout_ms") + s->cfg.lease_grace_ms,
               "%s should start '%s' attempt %lld, but started '%s' attempt %d", w->id,
               jstr(want, "id"), (long long)jint(want, "attempt") + 1, e->work_id, e->attempt);
        json_decref(items);
        prop_emit(p);
    }
}

static void cmd_report(Prop *p)
{
    Sim *s = &p->s;
    json_t *items = open_items(p);
    int c = rng_below(&p->rng, 100);
    json_t *pick = c < 65 ? pick_open(p, items, true) : c < 85 ? pick_open(p, items, false) : NULL;
    const char *id = pick       ? jstr(pick, "id")
                     : p->n_ids ? p->ids[rng_below(&p->rng, (int)p->n_ids)]
                                : "none";
    int attempt =
        pick && rng_chance(&p->rng, 90) ? (int)jint(pick, "attempt") : 1 + rng_below(&p->rng, 3);
    bool completed = rng_chance(&p->rng, 50), retry = rng_chance(&p->rng, 80);
    char error[48];
    snprintf(error, sizeof error, "boom at step %d", p->step);
    snprintf(p->what, sizeof p->what, "a report that '%s' attempt %d %s", id, attempt,
             completed ? "completed"
             : retry   ? "failed"
                       : "failed for good");
    json_t *result = json_pack("{s:i}", "step", p->step);
    /* Mostly from the worker that holds the attempt; sometimes from another. */
    const char *holder = pick ? json_string_value(json_object_get(pick, "worker_id")) : NULL;
    const char *sender =
        holder && rng_chance(&p->rng, 85) ? holder : p->workers[rng_below(&p->rng, N_WORKERS)].id;
    Report r = {.work_id = id,
                .attempt = attempt,
                .worker_id = sender,
                .claim = true,
                .completed = completed,
                .result = result,
                .error = error,
                .retry = retry};
    KnownWork known[1];
    size_t nk = known_for(s, &id, 1, known);
    const WorkItem *open = ws_get(s->ws, id);
    bool want = false;
    const char *want_status = NULL, *want_reason = open ? "superseded"
                                                   : nk && !strcmp(known[0].status, "cancelled")
                                                       ? "cancelled"
                                                   : nk ? "superseded"
                                                        : "not-found";
    size_t want_events = 0;
    if (open && open->status == WORK_RUNNING && open->attempt == attempt &&
        strcmp(sender, open->worker_id) != 0) {
        want_reason = "not-holder";
    } else if (open && open->status == WORK_RUNNING && open->attempt == attempt) {
        want = true;
        bool again = retry && attempt < open->max_attempts;
        want_status = completed ? "completed" : again ? "scheduled" : "dead";
        want_events = completed || again ? 1 : 2;
    } else if (open && !completed && open->attempt == attempt) {
        want = true; /* that attempt has failed already: nothing more to record */
        want_status = ws_item_status(open, s->now);
    } else if (!open && nk && known[0].attempts == attempt &&
               !strcmp(known[0].status, completed ? "completed" : "dead")) {
        want = true;
        want_status = known[0].status;
    }
    p->cov->n[COV_STALE_REPORT] += !want;
    p->cov->n[COV_DUP_REPORT] += want && !want_events;
    ReportResult res;
    ws_decide_report(s->ws, &r, nk ? &known[0] : NULL, s->now, &s->out, &res);
    PCHECK(p,
           res.accepted == want &&
               !strcmp(want ? res.status : res.reason, want ? want_status : want_reason),
           "should be %s %s, but is %s %s", want ? "accepted as" : "refused as",
           want ? want_status : want_reason, res.accepted ? "accepted as" : "refused as",
           res.accepted ? res.status : res.reason);
    PCHECK(p, s->out.len == want_events, "%zu events expected, %zu decided", want_events,
           s->out.len);
    if (want_events) {
        const Event *e = &s->out.items[0];
        PCHECK(p,
               e->type == (completed ? EV_COMPLETED : EV_FAILED) && e->attempt == attempt &&
                   (completed ? json_equal(e->result, result) : !strcmp(e->error, error)),
               "the %s event does not carry the report", event_type_name(e->type));
    }
    json_decref(result);
    json_decref(items);
    prop_emit(p);
}

static void cmd_cancel(Prop *p)
{
    Sim *s = &p->s;
    json_t *items = open_items(p);
    json_t *pick = rng_chance(&p->rng, 60) ? pick_open(p, items, false) : NULL;
    const char *id = pick       ? jstr(pick, "id")
                     : p->n_ids ? p->ids[rng_below(&p->rng, (int)p->n_ids)]
                                : "none";
    snprintf(p->what, sizeof p->what, "cancelling '%s'", id);
    const WorkItem *it = ws_get(s->ws, id);
    int want = !it ? 404 : 0;
    p->cov->n[COV_CANCEL_RUNNING] += it && it->status == WORK_RUNNING;
    p->cov->n[COV_CANCEL_UNKNOWN] += want == 404;
    Err err;
    err_clear(&err);
    int rc = ws_decide_cancel(s->ws, id, s->now, &s->out, &err);
    PCHECK(p,
           want ? rc != 0 && err.status == want && s->out.len == 0
                : rc == 0 && s->out.len == 1 && s->out.items[0].type == EV_CANCELLED,
           "expected %d, got rc %d status %d with %zu events", want, rc, err.status, s->out.len);
    json_decref(items);
    prop_emit(p);
}

/* A heartbeat: the worker's instance and the attempts it says it runs. */
typedef struct Beat {
    bool restarted;
    json_t *running;
} Beat;

static bool lists_attempt(json_t *running, const char *id, json_int_t attempt)
{
    size_t i;
    json_t *r;
    json_array_foreach(running, i, r)
    {
        if (!strcmp(jstr(r, "id"), id) && jint(r, "attempt") == attempt)
            return true;
    }
    return false;
}

/* A restarted worker's attempts fail; otherwise those it does not list fail
 * once they were handed out a worker timeout ago (the job never reached it). */
static const char *why_heartbeat(const Prop *p, json_t *item, const void *arg)
{
    const Beat *b = arg;
    if (b->restarted)
        return "restarted";
    if (lists_attempt(b->running, jstr(item, "id"), jint(item, "attempt")))
        return NULL;
    const WorkItem *it = ws_get(p->s.ws, jstr(item, "id"));
    int64_t handed = it->started_at > p->failover_at ? it->started_at : p->failover_at;
    return p->s.now - handed >= p->s.cfg.worker_timeout_ms ? "never reached" : NULL;
}

static void cmd_heartbeat(Prop *p)
{
    Sim *s = &p->s;
    PropWorker *w = &p->workers[rng_below(&p->rng, N_WORKERS)];
    maybe_restart(p, w, 20);
    if (rng_chance(&p->rng, 20)) {
        int n = rng_below(&p->rng, 3);
        for (int i = 0; i < n; i++)
            w->queues[i] = (char *)QUEUES[(i + p->step) % 3];
        w->queues[n] = NULL;
    }
    snprintf(p->what, sizeof p->what, "a heartbeat of %s as %s", w->id, w->instance);
    json_t *items = open_items(p), *it;
    const WsWorker *reg = ws_worker_get(s->ws, w->id);
    Beat beat = {.restarted = reg && reg->instance && strcmp(reg->instance, w->instance) != 0,
                 .running = json_array()};
    /* It lists what it runs (a new process runs nothing), but a job whose
     * hand-out was lost never reached it; and it may list one it finished. */
    size_t i;
    json_array_foreach(items, i, it)
    {
        if (!beat.restarted && !strcmp(jstr(it, "status"), "running") &&
            !strcmp(jstr(it, "worker_id"), w->id) && !rng_chance(&p->rng, 15))
            json_array_append_new(beat.running, json_pack("{s:s, s:I}", "id", jstr(it, "id"),
                                                          "attempt", jint(it, "attempt")));
    }
    if (p->n_ids && rng_chance(&p->rng, 10))
        json_array_append_new(
            beat.running,
            json_pack("{s:s, s:i}", "id", p->ids[rng_below(&p->rng, (int)p->n_ids)], "attempt", 1));
    RunningList *running = running_list(beat.running);
    ws_worker_seen(s->ws, w->id, w->instance, 2, w->queues, running, s->now, &s->out);
    ws_running_free(running);
    expect_attempts_failed(p, items, w->id, why_heartbeat, &beat);
    json_decref(beat.running);
    json_decref(items);
    prop_emit(p);
    reg = ws_worker_get(s->ws, w->id);
    PCHECK(p, reg && reg->last_seen == s->now && !strcmp(reg->instance, w->instance),
           "the heartbeat should register %s as %s, seen now", w->id, w->instance);
}

static void cmd_forget(Prop *p)
{
    Sim *s = &p->s;
    PropWorker *w = &p->workers[rng_below(&p->rng, N_WORKERS)];
    snprintf(p->what, sizeof p->what, "forgetting %s", w->id);
    json_t *items = open_items(p);
    bool known = ws_worker_get(s->ws, w->id) != NULL;
    ws_worker_forget(s->ws, w->id, s->now, &s->out);
    expect_attempts_failed(p, items, w->id, why_always, known ? "left" : NULL);
    json_decref(items);
    prop_emit(p);
    PCHECK(p, !ws_worker_get(s->ws, w->id), "%s should be forgotten", w->id);
}

static void cmd_time(Prop *p)
{
    Sim *s = &p->s;
    /* Mostly short steps, so that leases and workers live through several;
     * now and then one past the worker timeout, which loses every worker. */
    static const int64_t steps[] = {1, 20, 300, 300, 800, 800, 800, 1500, 1500, 4000};
    s->now += steps[rng_below(&p->rng, 10)];
    snprintf(p->what, sizeof p->what, "the timers at +%lld ms", (long long)(s->now - T0));
    ws_advance(s->ws, s->now);
    json_t *items = open_items(p), *it;
    ws_decide_timers(s->ws, s->now, &s->out);
    size_t want = 0, i;
    json_array_foreach(items, i, it)
    {
        if (strcmp(jstr(it, "status"), "running") != 0)
            continue;
        const WsWorker *w = ws_worker_get(s->ws, jstr(it, "worker_id"));
        bool timed_out = jint(it, "deadline") <= s->now;
        bool lost = !w || w->last_seen + s->cfg.worker_timeout_ms <= s->now;
        if (!timed_out && !lost)
            continue;
        want += jint(it, "attempt") >= jint(it, "max_attempts") ? 2 : 1;
        EventType type = timed_out ? EV_TIMED_OUT : EV_FAILED;
        bool found = false;
        for (size_t k = 0; k < s->out.len && !found; k++) {
            const Event *e = &s->out.items[k];
            found = e->type == type && !strcmp(e->work_id, jstr(it, "id")) &&
                    e->attempt == jint(it, "attempt") &&
                    strstr(e->error, timed_out ? "timed out" : "lost");
        }
        PCHECK(p, found, "'%s' attempt %lld should be %s", jstr(it, "id"),
               (long long)jint(it, "attempt"), timed_out ? "timed out" : "failed: worker lost");
    }
    PCHECK(p, s->out.len == want, "%zu timer events expected, %zu decided", want, s->out.len);
    json_decref(items);
    prop_emit(p);
    ws_advance(s->ws, s->now);
    size_t pos = 0;
    const WsWorker *w;
    while ((w = ws_worker_next(s->ws, &pos)))
        PCHECK(p, w->last_seen + s->cfg.worker_timeout_ms > s->now,
               "%s is silent past the timeout yet still registered after the timers", w->id);
}

/* An operator retries work: mostly dead work, sometimes anything. */
static void cmd_retry(Prop *p)
{
    Sim *s = &p->s;
    const char *dead[64], *k, *id = NULL;
    size_t n = 0;
    void *v;
    for (size_t pos = 0; n < 64 && hmap_next(&p->finished, &pos, &k, &v);)
        if (!strcmp(v, "dead"))
            dead[n++] = k;
    if (n && rng_chance(&p->rng, 70))
        id = dead[rng_below(&p->rng, (int)n)];
    else
        id = p->n_ids ? p->ids[rng_below(&p->rng, (int)p->n_ids)] : "none";
    snprintf(p->what, sizeof p->what, "an operator's retry of '%s'", id);
    KnownWork known[1];
    size_t nk = known_for(s, &id, 1, known);
    int want = ws_get(s->ws, id)                                    ? 409
               : !nk                                                ? 404
               : strcmp(known[0].status, "dead") != 0               ? 409
               : ws_open_count(s->ws) + 1 > (size_t)s->cfg.max_open ? 429
                                                                    : 0;
    Err err;
    err_clear(&err);
    int rc = ws_decide_retry(s->ws, id, nk ? &known[0] : NULL, s->now, &s->out, &err);
    p->cov->n[want ? COV_RETRY_REFUSED : COV_REOPENED]++;
    if (want) {
        PCHECK(p, rc != 0 && err.status == want && s->out.len == 0,
               "should be refused with %d and no events, got rc %d, status %d, %zu events", want,
               rc, err.status, s->out.len);
    } else {
        const Event *e = s->out.len == 1 ? &s->out.items[0] : NULL;
        PCHECK(p,
               rc == 0 && e && e->type == EV_RETRIED && e->attempt == known[0].attempts &&
                   e->max_attempts == known[0].attempts + 1 && e->run_at == 0 &&
                   !strcmp(e->queue, known[0].queue) && e->priority == known[0].priority &&
                   e->timeout_ms == known[0].timeout_ms && json_equal(e->payload, known[0].payload),
               "should decide one retried event rebuilding the dead work with one more attempt "
               "(rc %d: %s)",
               rc, err.msg);
    }
    prop_emit(p);
}

/* A new leader: recovers from the projection, adopts the workers of running
 * attempts and opens a term. */
static void cmd_failover(Prop *p)
{
    Sim *s = &p->s;
    snprintf(p->what, sizeof p->what, "a failover to term %lld", (long long)s->term + 1);
    p->cov->n[COV_FAILOVER]++;
    WorkState *ws = sim_recover(s);
    char *d = state_diff("the state recovered from the projection", s, ws);
    PCHECK(p, !d, "%s", d);
    ws_adopt_running_workers(ws, s->now);
    p->failover_at = s->now;
    ws_free(s->ws);
    s->ws = ws;
    s->term++;
    Event *e = eventlist_push(&s->out);
    e->type = EV_TERM;
    e->new_term = s->term;
    e->leader_url = xstrdup("http://node:8080");
    prop_emit(p);
}

/* ---- invariants ---- */

static void check_invariants(Prop *p)
{
    Sim *s = &p->s;
    json_t *items = open_items(p), *it;
    size_t i, n = json_array_size(items);
    size_t implied = p->accepted.len - p->finished.len;
    PCHECK(p, n == ws_open_count(s->ws) && n == implied,
           "%zu items dumped, %zu counted open, %zu open by the events", n, ws_open_count(s->ws),
           implied);
    PCHECK(p, n <= (size_t)s->cfg.max_open, "%zu open items exceed the limit", n);
    json_t *want_stats = json_object();
    int64_t next = INT64_MAX;
    json_array_foreach(items, i, it)
    {
        const char *id = jstr(it, "id"), *status = jstr(it, "status");
        int64_t run_at = jint(it, "run_at"), where = jint(it, "where");
        int64_t attempt = jint(it, "attempt");
        PCHECK(p, !hmap_get(&p->finished, id), "'%s' is open but was %s", id,
               (const char *)hmap_get(&p->finished, id));
        PCHECK(p, attempt >= 0 && attempt <= jint(it, "max_attempts"),
               "'%s' is at attempt %lld of %lld", id, (long long)attempt,
               (long long)jint(it, "max_attempts"));
        /* "where" is the private heap tag state_dump exposes: 1 ready, 2 delayed, 3 running. */
        const char *shown;
        if (!strcmp(status, "running")) {
            const char *w = jstr(it, "worker_id");
            PCHECK(p, where == 3 && attempt >= 1 && jint(it, "deadline") > 0 && w && run_at == 0,
                   "running '%s' should hold a lease in the running heap", id);
            PCHECK(p, ws_worker_get(s->ws, w), "'%s' runs on %s, which is not registered", id, w);
            shown = "running";
            if (jint(it, "deadline") < next)
                next = jint(it, "deadline");
        } else {
            PCHECK(p,
                   !strcmp(status, "pending") && !jstr(it, "worker_id") &&
                       jint(it, "deadline") == 0,
                   "'%s' is %s, with worker %s", id, status,
                   jstr(it, "worker_id") ? jstr(it, "worker_id") : "none");
            PCHECK(p, (where == 1 && run_at == 0) || (where == 2 && run_at > s->now),
                   "pending '%s' (run_at %+lld ms from now) is in heap %lld", id,
                   (long long)(run_at - s->now), (long long)where);
            shown = run_at > s->now ? "scheduled" : "pending";
            if (run_at && run_at < next)
                next = run_at;
        }
        PCHECK(p, !strcmp(ws_item_status(ws_get(s->ws, id), s->now), shown),
               "'%s' should show as %s", id, shown);
        json_t *q = json_object_get(want_stats, jstr(it, "queue"));
        if (!q) {
            q = json_pack("{s:i, s:i, s:i, s:i}", "waiting", 0, "pending", 0, "scheduled", 0,
                          "running", 0);
            json_object_set_new(want_stats, jstr(it, "queue"), q);
        }
        json_object_set_new(q, shown, json_integer(jint(q, shown) + 1));
    }
    json_t *stats = queue_stats_json(s->ws, s->now);
    char *d = json_diff("the queue stats", want_stats, stats);
    PCHECK(p, !d, "%s", d);
    json_decref(stats);
    json_decref(want_stats);
    size_t pos = 0;
    const WsWorker *w;
    while ((w = ws_worker_next(s->ws, &pos)))
        if (w->last_seen + s->cfg.worker_timeout_ms < next)
            next = w->last_seen + s->cfg.worker_timeout_ms;
    PCHECK(p, ws_next_deadline(s->ws) == next, "the next deadline should be %+lld ms, not %+lld",
           (long long)(next - s->now), (long long)(ws_next_deadline(s->ws) - s->now));
    json_decref(items);
}

/* The log replays into the live state, in memory and through the event
 * table's JSON; the projection recovers it. */
static void check_replay(Prop *p, bool through_json)
{
    Sim *s = &p->s;
    WorkState *ws = sim_replay(s);
    char *d = state_diff("the state replayed from the log", s, ws);
    ws_free(ws);
    PCHECK(p, !d, "%s", d);
    ws = sim_recover(s);
    d = state_diff("the state recovered from the projection", s, ws);
    ws_free(ws);
    PCHECK(p, !d, "%s", d);
    if (!through_json)
        return;
    ws = ws_new(&s->cfg);
    for (size_t i = 0; i < s->log.len; i++) {
        Event e;
        Err err;
        PCHECK(p, event_through_table(&s->log.items[i], &e, &err) == 0,
               "event seq %zu does not decode: %s", i + 1, err.msg);
        d = event_diff(&s->log.items[i], &e);
        PCHECK(p, !d, "the %s event at seq %zu changes through the event table:%s",
               event_type_name(e.type), i + 1, d);
        ws_apply(ws, &e);
        event_clear(&e);
    }
    ws_advance(ws, s->now);
    d = state_diff("the state replayed from the encoded log", s, ws);
    ws_free(ws);
    PCHECK(p, !d, "%s", d);
}

static void run_sequence(uint64_t seed, int steps, Coverage *cov)
{
    WsConfig cfg = {.max_open = 12,
                    .lease_grace_ms = 50,
                    .backoff_base_ms = 100,
                    .backoff_max_ms = 2000,
                    .worker_timeout_ms = 3000};
    Prop *p = xcalloc(1, sizeof *p);
    p->cov = cov;
    p->seed = seed;
    p->rng.s = seed;
    sim_init(&p->s, &cfg, T0);
    hmap_init(&p->finished);
    hmap_init(&p->accepted);
    for (int i = 0; i < N_WORKERS; i++) {
        PropWorker *w = &p->workers[i];
        snprintf(w->id, sizeof w->id, "w%d", i);
        snprintf(w->instance, sizeof w->instance, "w%d-i0", i);
        if (i == 1)
            w->queues[0] = (char *)QUEUES[0];
    }
    for (p->step = 1; p->step <= steps; p->step++) {
        ws_advance(p->s.ws, p->s.now); /* as each manager round begins */
        int c = rng_below(&p->rng, 100);
        if (c < 24)
            cmd_submit(p);
        else if (c < 44)
            cmd_pull(p);
        else if (c < 63)
            cmd_report(p);
        else if (c < 70)
            cmd_cancel(p);
        else if (c < 73)
            cmd_retry(p);
        else if (c < 82)
            cmd_heartbeat(p);
        else if (c < 85)
            cmd_forget(p);
        else if (c < 99)
            cmd_time(p);
        else
            cmd_failover(p);
        check_invariants(p);
        if (p->step % 50 == 0)
            check_replay(p, false);
    }
    snprintf(p->what, sizeof p->what, "the end of the sequence");
    check_replay(p, true);
    for (size_t i = 0; i < p->n_ids; i++)
        free(p->ids[i]);
    free(p->ids);
    hmap_free(&p->finished);
    hmap_free(&p->accepted);
    sim_free(&p->s);
    free(p);
}

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 0) : def;
}

/* Runs WORKD_TEST_SEQUENCES sequences (default 200) of WORKD_TEST_STEPS
 * commands (default 300), seeded from WORKD_TEST_SEED + i (default: the
 * clock, printed first so a crash can be reproduced), within
 * WORKD_TEST_BUDGET_MS (default 10 s, which bounds slow sanitizer builds). */
static void test_random_sequences_keep_the_invariants(void **state)
{
    uint64_t base = (uint64_t)env_long("WORKD_TEST_SEED", (long)time(NULL));
    long sequences = env_long("WORKD_TEST_SEQUENCES", 200);
    long steps = env_long("WORKD_TEST_STEPS", 300);
    long budget_ms = env_long("WORKD_TEST_BUDGET_MS", 10000);
    print_message("property test: seeds %llu.., %ld sequences of %ld steps\n",
                  (unsigned long long)base, sequences, steps);
    Coverage cov = {{0}};
    int64_t start = mono_ms();
    long done = 0;
    for (; done < sequences && mono_ms() - start < budget_ms; done++)
        run_sequence(base + (uint64_t)done, (int)steps, &cov);
    SBuf b;
    sbuf_init(&b);
    for (int i = 0; i < COV_N; i++)
        sbuf_printf(&b, "%s%s %ld", i ? ", " : "", COV_NAMES[i], cov.n[i]);
    print_message("property test: %ld sequences in %lld ms: %s\n", done,
                  (long long)(mono_ms() - start), b.data);
    sbuf_free(&b);
    if (done * steps < 10000)
        return; /* a reproduction run: too short to reach everything */
    for (int i = 0; i < COV_N; i++)
        CHECK(cov.n[i] > 0,
              "%ld random sequences never produced %s: the property test no longer covers them",
              done, COV_NAMES[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_makes_pending),
        cmocka_unit_test(test_submit_with_run_at_is_scheduled),
        cmocka_unit_test(test_submit_same_id_is_idempotent),
        cmocka_unit_test(test_submit_duplicates_in_one_batch),
        cmocka_unit_test(test_submit_is_bounded_by_max_open),
        cmocka_unit_test(test_submit_of_finished_work_is_known),
        cmocka_unit_test(test_start_by_priority_then_acceptance),
        cmocka_unit_test(test_start_honours_the_workers_queues),
        cmocka_unit_test(test_queue_limits_hold_back_starts),
        cmocka_unit_test(test_keys_take_turns),
        cmocka_unit_test(test_complete),
        cmocka_unit_test(test_backoff_is_exponential_capped_and_jittered),
        cmocka_unit_test(test_fail_with_retry_is_scheduled_at_backoff),
        cmocka_unit_test(test_fail_on_last_attempt_is_dead),
        cmocka_unit_test(test_fail_without_retry_is_dead),
        cmocka_unit_test(test_stale_reports_are_refused),
        cmocka_unit_test(test_duplicate_reports_of_finished_work),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_weighted_keys_take_more_turns),
        cmocka_unit_test(test_weights_are_checked),
        cmocka_unit_test(test_operator_retries_dead_work),
        cmocka_unit_test(test_deadline_times_out),
        cmocka_unit_test(test_silent_worker_is_lost),
        cmocka_unit_test(test_deadline_and_lost_worker_end_the_attempt_once),
        cmocka_unit_test(test_restarted_worker_loses_its_attempts),
        cmocka_unit_test(test_only_the_holder_may_report),
        cmocka_unit_test(test_a_live_worker_id_belongs_to_its_instance),
        cmocka_unit_test(test_forgotten_worker_loses_its_attempts),
        cmocka_unit_test(test_recovered_running_work_keeps_its_lease),
        cmocka_unit_test(test_attempts_a_worker_does_not_list_fail),
        cmocka_unit_test(test_apply_ignores_events_that_do_not_fit),
        cmocka_unit_test(test_subscriptions_follow_their_events),
        cmocka_unit_test(test_subscriptions_replay_from_the_log),
        cmocka_unit_test(test_a_pause_needs_the_secret),
        cmocka_unit_test(test_subscriptions_are_bounded),
        cmocka_unit_test(test_worker_registry),
        cmocka_unit_test(test_random_sequences_keep_the_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
