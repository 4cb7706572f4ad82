/* Tests of the WorkState's dependencies, batches and schedules (pure): a
 * child waits until every parent has completed and is released by the event
 * right after the last one; a dead or cancelled parent cancels its
 * descendants, naming it, unless they run anyway; a batch finishes once,
 * after its last member, with its callback; a schedule fires each tick once
 * and catches up on missed ticks by its policy. Each state replays from its
 * log and recovers from its projection. */
#include "ws_testlib.h"

static const WsConfig CFG = {
    .max_open = 1000,
    .lease_grace_ms = 5000,
    .backoff_base_ms = 1000,
    .backoff_max_ms = 60000,
    .worker_timeout_ms = 10000,
};

/* ---- helpers ---- */

static void replayable(Sim *s)
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

static void status_is(Sim *s, const char *id, const char *want)
{
    const WorkItem *it = ws_get(s->ws, id);
    const char *got = it ? ws_item_status(it, s->now) : "finished";
    CHECK(!strcmp(got, want), "'%s' should be %s, not %s", id, want, got);
}

/* Submits items "id" or "id<-p1,p2" (parents), each in the queue of its id;
 * run_anyway for ids starting with '!'. Returns the submission's rc. */
static int submit_graph(Sim *s, const char *const *specs, size_t n, const BatchOpen *bo,
                        const KnownWork *known, size_t n_known, Err *err)
{
    SubmitItem *items = xcalloc(n, sizeof *items);
    SubmitResult *res = xcalloc(n, sizeof *res);
    for (size_t i = 0; i < n; i++) {
        char buf[200];
        snprintf(buf, sizeof buf, "%s", specs[i]);
        char *arrow = strstr(buf, "<-");
        if (arrow)
            *arrow = 0;
        const char *id = buf[0] == '!' ? buf + 1 : buf;
        item_set(&items[i], id, id, 0, "1", 0, 1000, 1);
        items[i].run_anyway = buf[0] == '!';
        if (bo)
            items[i].batch = xstrdup(bo->id);
        if (arrow) {
            items[i].after = xcalloc(8, sizeof *items[i].after);
            size_t k = 0;
            for (char *p = strtok(arrow + 2, ","); p && k < 7; p = strtok(NULL, ","))
                items[i].after[k++] = xstrdup(p);
        }
    }
    int rc = ws_decide_submit_in(s->ws, items, n, known, n_known, bo, s->now, &s->out, res, err);
    items_clear(items, n);
    free(items);
    free(res);
    sim_emit(s);
    return rc;
}

/* Starts work id (the only work of its queue) and ends its attempt. */
static void finish(Sim *s, const char *id, bool ok)
{
    char *const queues[] = {(char *)id, NULL};
    ws_worker_seen(s->ws, "w", "i", 10, NULL, NULL, s->now, &s->out);
    CHECK(ws_decide_start(s->ws, "w", queues, s->now, &s->out), "'%s' should be ready", id);
    sim_emit(s);
    Report r = {.work_id = id,
                .attempt = ws_get(s->ws, id)->attempt,
                .worker_id = "w",
                .instance = "i",
                .completed = ok,
                .result = json_null(),
                .error = "boom",
                .retry = false};
    ReportResult rr;
    ws_decide_report(s->ws, &r, NULL, s->now, &s->out, &rr);
    CHECK(rr.accepted, "the report of '%s' should be accepted", id);
    sim_emit(s);
}

/* The type and work id of log events from index `from`, as "type:id ...". */
static char *log_text(const Sim *s, size_t from)
{
    SBuf b;
    sbuf_init(&b);
    for (size_t i = from; i < s->log.len; i++) {
        const Event *e = &s->log.items[i];
        sbuf_printf(&b, "%s%s:%s", i > from ? " " : "", event_type_name(e->type),
                    e->work_id    ? e->work_id
                    : e->schedule ? e->schedule
                    : e->batch    ? e->batch
                                  : "-");
    }
    return sbuf_steal(&b);
}

static void log_is(const Sim *s, size_t from, const char *want)
{
    char *got = log_text(s, from);
    CHECK(!strcmp(got, want), "the log should be\n  %s\nbut is\n  %s", want, got);
    free(got);
}

/* ---- dependencies ---- */

static void test_child_waits_for_every_parent(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err = {0};
    const char *const g[] = {"p1", "p2", "c<-p1,p2", "d<-c"};
    CHECK(submit_graph(&s, g, 4, NULL, NULL, 0, &err) == 0, "refused: %s", err.msg);
    status_is(&s, "c", "waiting");
    status_is(&s, "d", "waiting");
    CHECK(ws_next_deadline(s.ws) == INT64_MAX, "waiting work sets no timer");
    replayable(&s);
    finish(&s, "p1", true);
    status_is(&s, "c", "waiting");
    size_t mark = s.log.len;
    finish(&s, "p2", true);
    log_is(&s, mark, "started:p2 completed:p2 released:c");
    status_is(&s, "c", "pending");
    status_is(&s, "d", "waiting");
    const ProjRow *row = proj_get(&s.proj, "c");
    CHECK(row && !strcmp(row->status, "pending"), "the projection shows c pending");
    replayable(&s);
    finish(&s, "c", true);
    status_is(&s, "d", "pending");
    replayable(&s);
    sim_free(&s);
}

static void test_dead_parent_cancels_descendants(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err = {0};
    const char *const g[] = {"a", "b<-a", "c<-b", "!d<-a", "e<-a,c"};
    CHECK(submit_graph(&s, g, 5, NULL, NULL, 0, &err) == 0, "refused: %s", err.msg);
    size_t mark = s.log.len;
    finish(&s, "a", false);
    log_is(&s, mark, "started:a failed:a dead:a cancelled:b cancelled:c cancelled:e released:d");
    for (size_t i = mark; i < s.log.len; i++) {
        const Event *e = &s.log.items[i];
        if (e->type == EV_CANCELLED && !strcmp(e->work_id, "c"))
            CHECK(e->reason && !strcmp(e->reason, "parent b is cancelled"), "c's reason: %s",
                  e->reason);
        if (e->type == EV_CANCELLED && !strcmp(e->work_id, "b"))
            CHECK(e->reason && !strcmp(e->reason, "parent a is dead"), "b's reason: %s", e->reason);
    }
    status_is(&s, "d", "pending");
    replayable(&s);
    sim_free(&s);
}

/* Children cancelled one by one, in no order, leave their parents' lists
 * (through the holes and compactions of Kids); the parent's completion then
 * releases exactly the rest, in the order they were accepted. */
static void test_cancelled_children_leave_their_parents(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err = {0};
    enum { N = 300 };
    char *specs[N + 2];
    specs[0] = xstrdup("p");
    specs[1] = xstrdup("q");
    for (int i = 0; i < N; i++) {
        char b[40];
        snprintf(b, sizeof b, i % 3 ? "c%03d<-p" : "c%03d<-p,q,p", i);
        specs[i + 2] = xstrdup(b);
    }
    CHECK(submit_graph(&s, (const char *const *)specs, N + 2, NULL, NULL, 0, &err) == 0,
          "refused: %s", err.msg);
    /* Cancel every child whose number is not a multiple of 7, in a scrambled order. */
    for (int k = 0; k < N; k++) {
        int i = (k * 37) % N; /* 37 is prime to 300: each once */
        if (i % 7 == 0)
            continue;
        char id[16];
        snprintf(id, sizeof id, "c%03d", i);
        CHECK(ws_decide_cancel(s.ws, id, s.now, &s.out, &err) == 0, "cancel %s: %s", id, err.msg);
        sim_emit(&s);
    }
    finish(&s, "q", true);
    size_t mark = s.log.len;
    finish(&s, "p", true);
    SBuf want;
    sbuf_init(&want);
    sbuf_puts(&want, "started:p completed:p");
    for (int i = 0; i < N; i += 7)
        sbuf_printf(&want, " released:c%03d", i);
    log_is(&s, mark, want.data);
    sbuf_free(&want);
    replayable(&s);
    for (int i = 0; i < N + 2; i++)
        free(specs[i]);
    sim_free(&s);
}

/* A waiting child cancelled after one of its parents finished leaves the
 * others' lists (its link to the finished one is gone): the links it held
 * are counted out of --max-dependencies, and the parents finish without it. */
static void test_a_child_leaves_parents_some_of_which_finished(void **state)
{
    (void)state;
    WsConfig cfg = CFG;
    cfg.max_edges = 3;
    Sim s;
    sim_init(&s, &cfg, T0);
    Err err = {0};
    const char *const g[] = {"p1", "p2", "p3", "c<-p1,p2,p3"};
    CHECK(submit_graph(&s, g, 4, NULL, NULL, 0, &err) == 0, "refused: %s", err.msg);
    finish(&s, "p1", true);
    status_is(&s, "c", "waiting");
    CHECK(ws_decide_cancel(s.ws, "c", s.now, &s.out, &err) == 0, "cancel c: %s", err.msg);
    sim_emit(&s);
    const char *const more[] = {"d<-p2,p3", "e<-p2"};
    CHECK(submit_graph(&s, more, 2, NULL, NULL, 0, &err) == 0,
          "c's links should be counted out: %s", err.msg);
    const char *const over[] = {"f<-p3"};
    CHECK(submit_graph(&s, over, 1, NULL, NULL, 0, &err) != 0 && err.status == 429 &&
              !strcmp(err.type, "too-many-dependencies"),
          "three links are held: a fourth is refused");
    finish(&s, "p2", true);
    size_t mark = s.log.len;
    finish(&s, "p3", true);
    log_is(&s, mark, "started:p3 completed:p3 released:d");
    status_is(&s, "e", "pending");
    replayable(&s);
    sim_free(&s);
}

/* Links new waiting work makes are bounded by --dependency-rate a second, a
 * second's worth in hand: a request that needs more than is left is refused
 * whole, one larger than a second's worth passes when the bucket is full
 * (and the bucket goes into debt), work that waits for nothing is never
 * refused. */
static void test_dependencies_are_made_at_most_edge_rate_a_second(void **state)
{
    (void)state;
    WsConfig cfg = CFG;
    cfg.edge_rate = 4;
    Sim s;
    sim_init(&s, &cfg, T0);
    Err err = {0};
    const char *const parents[] = {"p1", "p2", "p3", "p4", "p5", "p6"};
    CHECK(submit_graph(&s, parents, 6, NULL, NULL, 0, &err) == 0, "refused: %s", err.msg);
    const char *const c1[] = {"c1<-p1,p2,p3,p4"}, *const c2[] = {"c2<-p1"},
                      *const c3[] = {"c3<-p1,p2,p3,p4,p5,p6"}, *const c4[] = {"c4<-p1,p2,p3"},
                      *const pair[] = {"c5<-p1,p2", "c6<-p3,p4"}, *const plain[] = {"x"};
    CHECK(submit_graph(&s, c1, 1, NULL, NULL, 0, &err) == 0, "a full bucket: %s", err.msg);
    CHECK(submit_graph(&s, c2, 1, NULL, NULL, 0, &err) != 0 && err.status == 429 &&
              !strcmp(err.type, "dependency-rate-limited") && strstr(err.msg, "--dependency-rate"),
          "an empty bucket refuses a link, naming the setting: %s", err.msg);
    s.now += 250;
    CHECK(submit_graph(&s, c2, 1, NULL, NULL, 0, &err) == 0, "a link a 250 ms: %s", err.msg);
    CHECK(submit_graph(&s, c3, 1, NULL, NULL, 0, &err) != 0 && err.status == 429,
          "six links wait for a full bucket");
    s.now += 1000;
    CHECK(submit_graph(&s, c3, 1, NULL, NULL, 0, &err) == 0,
          "a request larger than a second's worth passes when the bucket is full: %s", err.msg);
    CHECK(submit_graph(&s, plain, 1, NULL, NULL, 0, &err) == 0,
          "work that waits for nothing is not limited: %s", err.msg);
    s.now += 1000; /* two in hand, after the debt of two */
    CHECK(submit_graph(&s, c4, 1, NULL, NULL, 0, &err) != 0 && err.status == 429,
          "three links need three in hand");
    s.now += 250;
    size_t mark = s.log.len;
    CHECK(submit_graph(&s, pair, 2, NULL, NULL, 0, &err) != 0 && err.status == 429,
          "two children of two links each are refused together with three in hand");
    CHECK(s.log.len == mark, "a refused request appends nothing");
    CHECK(submit_graph(&s, c4, 1, NULL, NULL, 0, &err) == 0, "three in hand: %s", err.msg);
    status_is(&s, "c3", "waiting");
    replayable(&s);
    sim_free(&s);
}

static void test_parents_must_exist(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err = {0};
    const char *const later[] = {"c<-p", "p"};
    CHECK(submit_graph(&s, later, 2, NULL, NULL, 0, &err) != 0 && err.status == 404 &&
              !strcmp(err.type, "parent-not-found"),
          "a parent must come before its child");
    CHECK(s.log.len == 0, "a refused submission appends nothing");
    const char *const self[] = {"x<-x"};
    CHECK(submit_graph(&s, self, 1, NULL, NULL, 0, &err) != 0 && err.status == 400,
          "work cannot wait for itself");
    /* Finished parents, as the database knows them. */
    KnownWork known[] = {{.id = "done", .status = "completed", .payload = json_null()},
                         {.id = "gone", .status = "dead", .payload = json_null()}};
    const char *const kids[] = {"k1<-done", "k2<-gone", "!k3<-gone", "k4<-k2"};
    CHECK(submit_graph(&s, kids, 4, NULL, known, 2, &err) == 0, "refused: %s", err.msg);
    log_is(&s, 0, "accepted:k1 accepted:k2 accepted:k3 accepted:k4 cancelled:k2 cancelled:k4");
    status_is(&s, "k1", "pending");
    status_is(&s, "k3", "pending");
    status_is(&s, "k4", "finished");
    replayable(&s);
    sim_free(&s);
}

/* ---- batches ---- */

static void test_batch_finishes_once_after_its_last_member(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err = {0};
    WorkTemplate cb = {
        .queue = "cb", .payload = json_null(), .timeout_ms = 1000, .max_attempts = 1};
    BatchOpen bo = {.id = "b1", .callback = &cb};
    const char *const g[] = {"m1", "m2", "m3<-m1"};
    CHECK(submit_graph(&s, g, 3, &bo, NULL, 0, &err) == 0, "refused: %s", err.msg);
    log_is(&s, 0, "batch_opened:b1 accepted:m1 accepted:m2 accepted:m3");
    CHECK(ws_batch(s.ws, "b1") && ws_batch(s.ws, "b1")->open == 3, "three members open");
    finish(&s, "m2", true);
    size_t mark = s.log.len;
    CHECK(ws_decide_cancel(s.ws, "m1", s.now, &s.out, &err) == 0, "cancel: %s", err.msg);
    sim_emit(&s);
    log_is(&s, mark, "cancelled:m1 cancelled:m3 batch:b1 accepted:b1~callback");
    const Event *b = &s.log.items[s.log.len - 2];
    CHECK(b->counts[0] == 1 && b->counts[1] == 0 && b->counts[2] == 2,
          "counts: %d completed, %d dead, %d cancelled", b->counts[0], b->counts[1], b->counts[2]);
    CHECK(b->callback_id && !strcmp(b->callback_id, "b1~callback"), "the batch names its callback");
    CHECK(!ws_batch(s.ws, "b1"), "a finished batch is not open");
    status_is(&s, "b1~callback", "pending");
    /* Joining it now is refused; opening it again with new work is a new batch. */
    const char *const late[] = {"m4"};
    BatchOpen join = {.id = "b1"};
    SubmitItem it = {0};
    item_set(&it, "m5", "q", 0, "1", 0, 1000, 1);
    it.batch = xstrdup("b1");
    SubmitResult res;
    CHECK(ws_decide_submit(s.ws, &it, 1, NULL, 0, s.now, &s.out, &res, &err) != 0 &&
              !strcmp(err.type, "batch-not-found"),
          "joining a finished batch is refused");
    items_clear(&it, 1);
    CHECK(submit_graph(&s, late, 1, &join, NULL, 0, &err) == 0, "reopening: %s", err.msg);
    replayable(&s);
    sim_free(&s);
}

/* A dead member retried while its batch is open rejoins it: the batch waits
 * for it and counts its new end, live as after a replay or a recovery. */
static void test_retried_member_rejoins_its_open_batch(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    Err err = {0};
    BatchOpen bo = {.id = "b2"};
    const char *const g[] = {"r1", "r2"};
    CHECK(submit_graph(&s, g, 2, &bo, NULL, 0, &err) == 0, "refused: %s", err.msg);
    finish(&s, "r1", false);
    status_is(&s, "r1", "finished");
    CHECK(ws_batch(s.ws, "b2")->open == 1 && ws_batch(s.ws, "b2")->counts[1] == 1,
          "r1 counted dead, r2 open");
    const ProjRow *row = proj_get(&s.proj, "r1");
    KnownWork k = known_of_row(row);
    CHECK(ws_decide_retry(s.ws, "r1", &k, s.now, &s.out, &err) == 0, "retry: %s", err.msg);
    sim_emit(&s);
    CHECK(ws_batch(s.ws, "b2")->open == 2 && ws_batch(s.ws, "b2")->counts[1] == 0,
          "r1 is an open member again");
    replayable(&s);
    size_t mark = s.log.len;
    finish(&s, "r2", true);
    log_is(&s, mark, "started:r2 completed:r2");
    finish(&s, "r1", true);
    const Event *b = &s.log.items[s.log.len - 1];
    CHECK(b->type == EV_BATCH && b->counts[0] == 2 && b->counts[1] == 0,
          "the batch finishes after r1's new end: %s, %d completed, %d dead",
          event_type_name(b->type), b->counts[0], b->counts[1]);
    replayable(&s);
    sim_free(&s);
}

/* ---- schedules ---- */

static ScheduleSpec every_second(CatchUp cu, int max, bool skip_overlap)
{
    ScheduleSpec s = {
        .cron_text = "* * * * * *",
        .tz = "UTC",
        .work = {.queue = "ticks", .payload = json_null(), .timeout_ms = 1000, .max_attempts = 1},
        .skip_overlap = skip_overlap,
        .catch_up = cu,
        .catch_up_max = max};
    Err err = {0};
    CHECK(cron_parse(s.cron_text, &s.cron, &err) == 0, "cron: %s", err.msg);
    s.zone = tz_get("UTC", &err);
    return s;
}

static size_t count(const Sim *s, size_t from, EventType t, bool fired)
{
    size_t n = 0;
    for (size_t i = from; i < s->log.len; i++)
        if (s->log.items[i].type == t && (t != EV_TICK || !!s->log.items[i].tick_work == fired))
            n++;
    return n;
}

static void test_ticks_fire_once(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    ScheduleSpec spec = every_second(CATCHUP_ALL, 100, false);
    ws_decide_schedule_set(s.ws, "sec", &spec, s.now, &s.out);
    sim_emit(&s);
    CHECK(ws_next_deadline(s.ws) == T0 + 1000, "the next tick is the next second");
    s.now = T0 + 3500;
    ws_decide_ticks(s.ws, s.now, &s.out);
    sim_emit(&s);
    log_is(&s, 1,
           "accepted:sec~2026-01-01T00:00:01Z tick:sec accepted:sec~2026-01-01T00:00:02Z tick:sec "
           "accepted:sec~2026-01-01T00:00:03Z tick:sec");
    size_t mark = s.log.len;
    ws_decide_ticks(s.ws, s.now, &s.out);
    sim_emit(&s);
    CHECK(s.log.len == mark, "a tick is never fired twice");
    /* A replayed log goes on from the same tick. */
    WorkState *ws = sim_replay(&s);
    CHECK(ws_schedule(ws, "sec")->last_tick == T0 + 3000, "the replay's last tick");
    ws_free(ws);
    replayable(&s);
    sim_free(&s);
}

static void test_missed_ticks_follow_the_catch_up_policy(void **state)
{
    (void)state;
    static const struct {
        CatchUp cu;
        int max;
        size_t fired, skip_events;
    } cases[] = {{CATCHUP_NONE, 100, 10, 1},
                 {CATCHUP_LAST, 100, 11, 1},
                 {CATCHUP_ALL, 5, 15, 1},
                 {CATCHUP_ALL, 100, 60, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Sim s;
        sim_init(&s, &CFG, T0);
        ScheduleSpec spec = every_second(cases[c].cu, cases[c].max, false);
        ws_decide_schedule_set(s.ws, "sec", &spec, s.now, &s.out);
        sim_emit(&s);
        /* No leader for a minute: 60 ticks are due, 50 more than 10 s late. */
        s.now = T0 + 60500;
        ws_decide_ticks(s.ws, s.now, &s.out);
        sim_emit(&s);
        CHECK(count(&s, 0, EV_TICK, true) == cases[c].fired &&
                  count(&s, 0, EV_TICK, false) == cases[c].skip_events,
              "case %zu: %zu fired and %zu skip events, not %zu and %zu", c,
              count(&s, 0, EV_TICK, true), count(&s, 0, EV_TICK, false), cases[c].fired,
              cases[c].skip_events);
        CHECK(ws_schedule(s.ws, "sec")->last_tick == T0 + 60000, "case %zu: caught up", c);
        sim_free(&s);
    }
}

static void test_overlap_skips_while_the_last_run_is_open(void **state)
{
    (void)state;
    Sim s;
    sim_init(&s, &CFG, T0);
    ScheduleSpec spec = every_second(CATCHUP_ALL, 100, true);
    ws_decide_schedule_set(s.ws, "sec", &spec, s.now, &s.out);
    sim_emit(&s);
    s.now = T0 + 2000;
    ws_decide_ticks(s.ws, s.now, &s.out);
    sim_emit(&s);
    CHECK(count(&s, 0, EV_TICK, true) == 1 && count(&s, 0, EV_TICK, false) == 1,
          "the second tick is skipped while the first run is open");
    CHECK(!strcmp(s.log.items[s.log.len - 1].skipped, "overlap"), "skipped for overlap");
    spec.paused = true;
    ws_decide_schedule_set(s.ws, "sec", &spec, s.now, &s.out);
    sim_emit(&s);
    CHECK(ws_next_deadline(s.ws) == INT64_MAX, "a paused schedule sets no timer");
    s.now = T0 + 9000;
    spec.paused = false;
    ws_decide_schedule_set(s.ws, "sec", &spec, s.now, &s.out);
    sim_emit(&s);
    CHECK(ws_schedule(s.ws, "sec")->last_tick == T0 + 9000, "resumed: ticks from now on");
    Err err = {0};
    CHECK(ws_decide_schedule_delete(s.ws, "sec", s.now, &s.out, &err) == 0, "delete");
    sim_emit(&s);
    CHECK(!ws_schedule(s.ws, "sec") &&
              ws_decide_schedule_delete(s.ws, "sec", s.now, &s.out, &err) != 0 && err.status == 404,
          "a deleted schedule is gone");
    sim_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_child_waits_for_every_parent),
        cmocka_unit_test(test_dead_parent_cancels_descendants),
        cmocka_unit_test(test_cancelled_children_leave_their_parents),
        cmocka_unit_test(test_a_child_leaves_parents_some_of_which_finished),
        cmocka_unit_test(test_dependencies_are_made_at_most_edge_rate_a_second),
        cmocka_unit_test(test_parents_must_exist),
        cmocka_unit_test(test_batch_finishes_once_after_its_last_member),
        cmocka_unit_test(test_retried_member_rejoins_its_open_batch),
        cmocka_unit_test(test_ticks_fire_once),
        cmocka_unit_test(test_missed_ticks_follow_the_catch_up_policy),
        cmocka_unit_test(test_overlap_skips_while_the_last_run_is_open),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tz_cache_free();
    return rc;
}
