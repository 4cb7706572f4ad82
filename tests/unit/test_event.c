/* Tests of the event encoding (server/manager/event.c): every type survives
 * the event table, decoding tolerates what later versions add and refuses
 * what is missing, and tests/fixtures/events_v1.json, a log as version-1
 * servers write it, still replays into the open work it implies. */
#include "ws_testlib.h"

#include "progress.h"

#include <libgen.h>

/* Types are numbered from EV_TERM up to the last one event_type_name knows:
 * a type added later is covered by the loops below without editing them. */
#define MAX_TYPES 64
#define FOR_EACH_TYPE(t)                                                                           \
    for (int t = EV_TERM; t < MAX_TYPES && strcmp(event_type_name((EventType)t), "unknown"); t++)

/* The types version 1 had: the fixture, written by version-1 servers, holds these. */
#define V1_LAST EV_CANCELLED

static const WsConfig CFG = {
    .max_open = 1000,
    .lease_grace_ms = 5000,
    .backoff_base_ms = 1000,
    .backoff_max_ms = 60000,
    .worker_timeout_ms = 10000,
};

/* A trace context as a producer sends it; the tracestate's value holds the
 * characters JSON must escape. */
#define EX_TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#define EX_TRACESTATE "rojo=00f067aa0ba902b7,congo=a\"b\\c"

/* Fails unless e survives encoding and decoding unchanged. */
static void expect_round_trip(const char *what, const Event *e)
{
    Event back;
    Err err;
    err_clear(&err);
    CHECK(event_through_table(e, &back, &err) == 0, "%s: the %s event does not decode: %s", what,
          event_type_name(e->type), err.msg);
    char *d = event_diff(e, &back);
    CHECK(!d, "%s: the %s event changed through the table:%s", what, event_type_name(e->type), d);
    event_clear(&back);
}

/* An event of each type with every field its type carries set, and the
 * variants whose optional times are absent. */
static void fill_examples(EventList *l)
{
    Event *e = eventlist_push(l);
    e->type = EV_TERM;
    e->new_term = 7;
    e->leader_url = xstrdup("http://10.0.0.7:8080");

    e = eventlist_push(l);
    e->type = EV_ACCEPTED;
    e->queue = xstrdup("images");
    e->priority = -4;
    e->payload = J("{\"a\": [1, 2.5, \"x\", null, {\"b\": false}]}");
    e->run_at = T0 + 5000;
    e->timeout_ms = 1234;
    e->max_attempts = 9;

    e = eventlist_push(l);
    e->type = EV_ACCEPTED;
    e->queue = xstrdup("default");
    e->payload = json_null();
    e->timeout_ms = 30000;
    e->max_attempts = 1;

    e = eventlist_push(l);
    e->type = EV_STARTED;
    e->attempt = 2;
    e->worker_id = xstrdup("worker-1@host:9");
    e->deadline = T0 + 99000;

    e = eventlist_push(l);
    e->type = EV_COMPLETED;
    e->attempt = 3;
    e->result = J("{\"r\": 1}");

    e = eventlist_push(l);
    e->type = EV_COMPLETED;
    e->attempt = 1;
    e->result = json_null();

    for (EventType t = EV_FAILED; t <= EV_TIMED_OUT; t++) {
        e = eventlist_push(l);
        e->type = t;
        e->attempt = 4;
        e->error = xstrdup("exit 2: \"quoted\" \xc3\xa9");
        e->retry_at = T0 + 7000;
        e = eventlist_push(l);
        e->type = t;
        e->attempt = 5;
        e->error = xstrdup("the last one");
    }

    e = eventlist_push(l);
    e->type = EV_DEAD;
    e->error = xstrdup("no attempt left");

    e = eventlist_push(l);
    e->type = EV_CANCELLED;

    e = eventlist_push(l);
    e->type = EV_CANCELLED; /* running work: the attempt it ended */
    e->attempt = 2;

    e = eventlist_push(l);
    e->type = EV_QUEUE_SET;
    e->queue = xstrdup("mail");
    e->limits =
        (QueueLimits){.paused = true, .max_running = 4, .rate_limit = 50, .rate_period_ms = 1000};
    e->limits.weights = xcalloc(2, sizeof *e->limits.weights);
    e->limits.weights[0] = (KeyWeight){.key = xstrdup("tenant-a"), .weight = 3};
    e->limits.weights[1] = (KeyWeight){.key = xstrdup("tenant-b"), .weight = 1000};
    e->limits.n_weights = 2;

    e = eventlist_push(l);
    e->type = EV_QUEUE_SET;
    e->queue = xstrdup("other"); /* every limit cleared */

    e = eventlist_push(l);
    e->type = EV_RETRIED;
    e->attempt = 3;
    e->key = xstrdup("tenant-7");
    e->queue = xstrdup("images");
    e->priority = 2;
    e->payload = J("[\"again\"]");
    e->timeout_ms = 2000;
    e->max_attempts = 4;

    e = eventlist_push(l);
    e->type = EV_PROGRESS;
    e->attempt = 2;
    e->queue = xstrdup("images");
    e->has_fraction = true;
    e->fraction = 0.25;
    e->message = xstrdup("a quarter");
    e->output = xstrdup("line 1\n");

    e = eventlist_push(l);
    e->type = EV_PROGRESS; /* no fraction or message yet, no output */
    e->attempt = 1;
    e->queue = xstrdup("mail");
    /* has_fraction false, message and output NULL */

    e = eventlist_push(l);
    e->type = EV_SUBSCRIPTION; /* an operator's, with its secret, from seq 99 */
    e->sub = xcalloc(1, sizeof *e->sub);
    e->sub->name = xstrdup("billing");
    e->sub->url = xstrdup("https://example.com/hooks");
    e->sub->secret = xstrdup("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    e->sub->queues = strv_split("mail");
    e->sub->kinds = strv_split("completed");
    e->sub->cursor = at_seq(0); /* not a reset: none, of the cluster's shards */
    e->sub_start = at_seq(99);

    e = eventlist_push(l);
    e->type = EV_SUBSCRIPTION; /* workd's pause, for every queue, restarting after seq 7 */
    e->sub = xcalloc(1, sizeof *e->sub);
    e->sub->name = xstrdup("billing");
    e->sub->url = xstrdup("https://***@example.com/hooks");
    e->sub->kinds = strv_split("dead,cancelled");
    e->sub->paused = true;
    e->sub->paused_reason = xstrdup("failing since 60000 ms ago");
    e->sub->cursor = at_seq(7);
    e->sub_reset = true;
    e->sub_start = at_seq(110);

    e = eventlist_push(l);
    e->type = EV_SUBSCRIPTION;
    e->sub = xcalloc(1, sizeof *e->sub);
    e->sub->name = xstrdup("billing");
    e->sub_deleted = true;
    e->sub_start = at_seq(120);

    e = eventlist_push(l);
    e->type = EV_SUB_CURSOR;
    e->sub = xcalloc(1, sizeof *e->sub);
    e->sub->name = xstrdup("billing");
    e->sub->cursor = at_seq(118);

    e = eventlist_push(l);
    e->type = EV_ACCEPTED; /* a child of two parents, in a batch */
    e->queue = xstrdup("default");
    e->payload = json_null();
    e->timeout_ms = 1000;
    e->max_attempts = 2;
    e->after = json_pack("[ss]", "p1", "p2");
    e->run_anyway = true;
    e->waiting = true;
    e->batch = xstrdup("batch-1");

    e = eventlist_push(l);
    e->type = EV_RELEASED;

    e = eventlist_push(l);
    e->type = EV_CANCELLED; /* because a parent ended */
    e->reason = xstrdup("parent p1 is dead");

    ScheduleSpec spec = {.cron_text = xstrdup("*/5 * * * * *"),
                         .tz = xstrdup("Europe/Berlin"),
                         .work = {.queue = xstrdup("reports"),
                                  .key = xstrdup("k"),
                                  .priority = 3,
                                  .payload = J("{\"r\": 1}"),
                                  .timeout_ms = 5000,
                                  .max_attempts = 2},
                         .skip_overlap = true,
                         .catch_up = CATCHUP_ALL,
                         .catch_up_max = 7,
                         .paused = true};
    Err err = {0};
    CHECK(cron_parse(spec.cron_text, &spec.cron, &err) == 0, "cron: %s", err.msg);
    spec.zone = tz_get(spec.tz, &err);
    CHECK(spec.zone, "zone: %s", err.msg);
    e = eventlist_push(l);
    e->type = EV_SCHEDULE_SET;
    e->schedule = xstrdup("nightly");
    e->sched = schedspec_dup(&spec);
    e->tick = T0 - 1000;
    free(spec.cron_text);
    free(spec.tz);
    template_clear(&spec.work);

    e = eventlist_push(l);
    e->type = EV_SCHEDULE_DELETED;
    e->schedule = xstrdup("nightly");

    e = eventlist_push(l);
    e->type = EV_TICK;
    e->schedule = xstrdup("nightly");
    e->tick = T0 + 5000;
    e->tick_work = xstrdup("nightly~2026-01-01T00:00:05Z");

    e = eventlist_push(l);
    e->type = EV_TICK; /* skipped, with the missed ticks before it */
    e->schedule = xstrdup("nightly");
    e->tick = T0 + 10000;
    e->skipped = xstrdup("missed");
    e->missed = 4;

    e = eventlist_push(l);
    e->type = EV_BATCH_OPENED;
    e->batch = xstrdup("batch-1");
    e->callback = xcalloc(1, sizeof *e->callback);
    e->callback->queue = xstrdup("done");
    e->callback->payload = J("[1]");
    e->callback->timeout_ms = 1000;
    e->callback->max_attempts = 1;

    e = eventlist_push(l);
    e->type = EV_BATCH_OPENED;
    e->batch = xstrdup("batch-2"); /* no callback */

    e = eventlist_push(l);
    e->type = EV_BATCH;
    e->batch = xstrdup("batch-1");
    e->counts[0] = 998;
    e->counts[1] = 1;
    e->counts[2] = 1;
    e->callback_id = xstrdup("batch-1~callback");

    /* With the producer's trace context (schema 17): accepted and retried
     * carry it, and so do the final events, for /results and webhooks. */
    e = eventlist_push(l);
    e->type = EV_ACCEPTED;
    e->queue = xstrdup("default");
    e->payload = json_null();
    e->timeout_ms = 1000;
    e->max_attempts = 2;
    e->traceparent = xstrdup(EX_TRACEPARENT);
    e->tracestate = xstrdup(EX_TRACESTATE);

    e = eventlist_push(l);
    e->type = EV_RETRIED;
    e->attempt = 2;
    e->queue = xstrdup("default");
    e->payload = json_null();
    e->timeout_ms = 1000;
    e->max_attempts = 3;
    e->traceparent = xstrdup(EX_TRACEPARENT); /* no tracestate */

    EventType finals[] = {EV_COMPLETED, EV_DEAD, EV_CANCELLED};
    for (size_t i = 0; i < sizeof finals / sizeof finals[0]; i++) {
        e = eventlist_push(l);
        e->type = finals[i];
        e->attempt = 1;
        e->result = finals[i] == EV_COMPLETED ? J("{\"r\": 2}") : NULL;
        e->error = finals[i] == EV_DEAD ? xstrdup("no attempt left") : NULL;
        e->traceparent = xstrdup(EX_TRACEPARENT);
        e->tracestate = xstrdup(EX_TRACESTATE);
    }

    for (size_t i = 0; i < l->len; i++) {
        e = &l->items[i];
        e->seq = 100 + (int64_t)i;
        e->term = 3;
        e->at = T0 + (int64_t)i;
        if (e->type != EV_TERM && e->type != EV_QUEUE_SET && e->type != EV_SUBSCRIPTION &&
            e->type != EV_SUB_CURSOR && e->type != EV_SCHEDULE_SET &&
            e->type != EV_SCHEDULE_DELETED && e->type != EV_TICK && e->type != EV_BATCH_OPENED &&
            e->type != EV_BATCH)
            e->work_id = xstrdup("job-1");
    }
}

static void test_every_type_round_trips(void **state)
{
    EventList l;
    eventlist_init(&l);
    fill_examples(&l);
    bool seen[MAX_TYPES] = {0};
    for (size_t i = 0; i < l.len; i++) {
        expect_round_trip("an example event", &l.items[i]);
        seen[l.items[i].type] = true;
    }
    FOR_EACH_TYPE(t)
    CHECK(seen[t], "no example of the %s event: add one to fill_examples",
          event_type_name((EventType)t));
    eventlist_free(&l);
}

/* A log record holds many lines; a reader walks them in order, reads each
 * one's seq and type from its prefix, and decodes any of them whole. The
 * migration's SQL (workd_log_line) writes jsonb's text for the data, with
 * spaces, and a work id escaped by to_json: both read back alike. */
static void test_a_record_of_many_lines_reads_back(void **state)
{
    EventList l;
    eventlist_init(&l);
    fill_examples(&l);
    SBuf rec;
    sbuf_init(&rec);
    for (size_t i = 0; i < l.len; i++) {
        l.items[i].seq = 100 + (int64_t)i;
        if (i)
            sbuf_puts(&rec, "\n");
        record_line(&rec, &l.items[i]);
    }
    sbuf_puts(&rec, "\n{\"seq\":900,\"at\":5,\"type\":\"released\",\"v\":1,"
                    "\"work_id\":\"a\\\"b\\u0001\",\"data\": {\"x\": [1, 2]}}");
    const char *p = rec.data, *end = rec.data + rec.len;
    LogLine line;
    Err err;
    size_t n = 0;
    int rc;
    while ((rc = record_next(&p, end, &line, &err)) == 1) {
        Event back;
        CHECK(record_decode(&line, 7, &back, &err) == 0, "line %zu does not decode: %s", n,
              err.msg);
        if (n < l.len) {
            CHECK(back.seq == 100 + (int64_t)n && back.type == l.items[n].type && back.term == 7,
                  "line %zu reads back as seq %lld, a %s", n, (long long)back.seq,
                  event_type_name(back.type));
        } else {
            CHECK(back.seq == 900 && back.at == 5 && back.type == EV_RELEASED &&
                      !strcmp(back.work_id, "a\"b\x01"),
                  "the SQL-written line reads back as seq %lld, work '%s'", (long long)back.seq,
                  back.work_id);
        }
        event_clear(&back);
        n++;
    }
    CHECK(rc == 0 && n == l.len + 1, "read %zu of %zu lines (rc %d: %s)", n, l.len + 1, rc,
          err.msg);
    /* A line that is not an event is an error, not a skipped line. */
    const char *bad = "{\"seq\":1,\"type\":\"term\"}";
    p = bad;
    CHECK(record_next(&p, bad + strlen(bad), &line, &err) == -1, "a line without at was read");
    sbuf_free(&rec);
    eventlist_free(&l);
}

/* The results stream (and webhooks) show a finished work's trace context
 * when it has one, and no field when it has none. */
static void test_result_json_carries_the_trace_context(void **state)
{
    EventList l;
    eventlist_init(&l);
    fill_examples(&l);
    int traced = 0;
    for (size_t i = 0; i < l.len; i++) {
        const Event *e = &l.items[i];
        if (!event_is_final(e->type))
            continue;
        Event back;
        Err err;
        CHECK(event_through_table(e, &back, &err) == 0, "a %s event does not decode: %s",
              event_type_name(e->type), err.msg);
        json_t *o = event_result_json(&back);
        const char *tp = json_string_value(json_object_get(o, "traceparent"));
        const char *ts = json_string_value(json_object_get(o, "tracestate"));
        if (e->traceparent) {
            traced++;
            CHECK(tp && !strcmp(tp, e->traceparent) && ts && !strcmp(ts, e->tracestate),
                  "a traced %s event should publish its traceparent and tracestate",
                  event_type_name(e->type));
        } else {
            CHECK(!json_object_get(o, "traceparent") && !json_object_get(o, "tracestate"),
                  "a %s event without trace context should publish no trace fields",
                  event_type_name(e->type));
        }
        json_decref(o);
        event_clear(&back);
    }
    CHECK(traced == 3, "fill_examples should hold 3 traced final events, not %d", traced);
    eventlist_free(&l);
}

static void test_type_names(void **state)
{
    FOR_EACH_TYPE(t)
    {
        EventType back;
        const char *name = event_type_name((EventType)t);
        CHECK(event_type_parse(name, &back) == 0 && back == (EventType)t,
              "the name '%s' of type %d does not parse back", name, t);
        bool final = t == EV_COMPLETED || t == EV_DEAD || t == EV_CANCELLED;
        CHECK(!event_is_final((EventType)t) == !final, "%s should %sbe final", name,
              final ? "" : "not ");
    }
    /* The list C and SQL are made from names each type as the log does, and
     * every final event is published. */
#define NAME_MATCHES_(type, name)                                                                  \
    CHECK(!strcmp(event_type_name(type), name), "EVENTS_PUBLISHED names %s '%s'",                  \
          event_type_name(type), name);
    EVENTS_PUBLISHED(NAME_MATCHES_)
#undef NAME_MATCHES_
    FOR_EACH_TYPE(t)
    {
        if (event_is_final((EventType)t))
            CHECK(event_is_published((EventType)t), "final %s must be published",
                  event_type_name((EventType)t));
    }
    CHECK(!strcmp(SQL_PUBLISHED_TYPES, "'completed', 'dead', 'cancelled', 'batch', ''"),
          "the SQL list: %s", SQL_PUBLISHED_TYPES);
    EventType x;
    CHECK(event_type_parse("TERM", &x) != 0 && event_type_parse("", &x) != 0,
          "type names are exact and lower case");
    CHECK(!strcmp(event_type_name((EventType)0), "unknown") &&
              !strcmp(event_type_name((EventType)99), "unknown"),
          "an out-of-range type should be named 'unknown'");
}

/* Every event the WorkState decides, in a run that produces every type,
 * survives the table: what the leader applied is what a replay applies. */
static void test_decided_events_round_trip(void **state)
{
    Sim s;
    sim_init(&s, &CFG, T0);
    Event *e = eventlist_push(&s.out);
    e->type = EV_TERM;
    e->new_term = 1;
    e->leader_url = xstrdup("http://127.0.0.1:8080");
    sim_emit(&s);
    SubmitItem items[4] = {{0}};
    item_set(&items[0], "ok", "default", 5, "{\"n\": 7}", 0, 1000, 3);
    item_set(&items[1], "bad", "default", 4, "[1]", 0, 1000, 1);
    item_set(&items[2], "slow", "default", 3, "\"s\"", 0, 1000, 2);
    item_set(&items[3], "later", "other", 0, "null", T0 + 500, 1000, 3);
    items[1].traceparent = xstrdup(EX_TRACEPARENT); /* kept through death and a retry */
    items[1].tracestate = xstrdup(EX_TRACESTATE);
    SubmitResult res[4];
    Err err;
    CHECK(ws_decide_submit(s.ws, items, 4, NULL, 0, s.now, &s.out, res, &err) == 0,
          "the submission was refused: %s", err.msg);
    items_clear(items, 4);
    sim_emit(&s);
    ws_worker_seen(s.ws, "w1", "i1", 4, NULL, NULL, s.now, &s.out);
    sim_emit(&s);
    for (int i = 0; i < 3; i++) {
        CHECK(ws_decide_start(s.ws, "w1", NULL, s.now, &s.out), "start %d found nothing", i);
        sim_emit(&s);
    }
    /* Progress of the running "slow", as the manager decides it (progress.c). */
    ProgressBook *pb = progress_new(&(ProgressLimits){.rate = 10, .max_bytes = 1000});
    ProgressMsg pm = {.work_id = "slow",
                      .attempt = 2,
                      .worker_id = "w1",
                      .instance = "i1",
                      .has_fraction = true,
                      .fraction = 0.5,
                      .output = "half"};
    const WorkItem *slow = ws_get(s.ws, "slow");
    CHECK(slow && slow->status == WORK_RUNNING, "'slow' should be running");
    pm.attempt = slow->attempt;
    CHECK(progress_decide(pb, s.ws, &pm, s.now, &s.out, &err) == 0, "progress refused: %s",
          err.msg);
    progress_free(pb);
    sim_emit(&s);
    json_t *result = J("{\"sq\": 49}");
    Report done = {.work_id = "ok",
                   .attempt = 1,
                   .worker_id = "w1",
                   .instance = "i1",
                   .completed = true,
                   .result = result};
    Report failed = {.work_id = "bad",
                     .attempt = 1,
                     .worker_id = "w1",
                     .instance = "i1",
                     .error = "boom",
                     .retry = true};
    ReportResult rr;
    ws_decide_report(s.ws, &done, NULL, s.now, &s.out, &rr);
    ws_decide_report(s.ws, &failed, NULL, s.now, &s.out, &rr);
    json_decref(result);
    sim_emit(&s);
    CHECK(ws_decide_cancel(s.ws, "later", s.now, &s.out, &err) == 0, "cancel refused: %s", err.msg);
    sim_emit(&s);
    s.now += 6000; /* past the lease of "slow", and w1 stays alive */
    ws_worker_seen(s.ws, "w1", "i1", 4, NULL, NULL, s.now, &s.out);
    ws_decide_timers(s.ws, s.now, &s.out);
    sim_emit(&s);
    /* An operator reopens the dead "bad", as the manager does, from its row. */
    const ProjRow *row = proj_get(&s.proj, "bad");
    CHECK(row && !strcmp(row->status, "dead"), "'bad' should be dead by now");
    KnownWork dead = known_of_row(row);
    CHECK(ws_decide_retry(s.ws, "bad", &dead, s.now, &s.out, &err) == 0, "retry refused: %s",
          err.msg);
    sim_emit(&s);
    const WorkItem *again = ws_get(s.ws, "bad");
    CHECK(again && again->traceparent && !strcmp(again->traceparent, EX_TRACEPARENT) &&
              again->tracestate && !strcmp(again->tracestate, EX_TRACESTATE),
          "work retried by an operator should keep its producer's trace context");
    QueueLimits lim = {.max_running = 2, .rate_limit = 10, .rate_period_ms = 500};
    CHECK(ws_decide_queue_set(s.ws, "default", &lim, s.now, &s.out, &err) == 0,
          "queue_set refused: %s", err.msg);
    sim_emit(&s);
    /* A batch of a parent and its child, with a callback; a schedule that
     * ticks once and is deleted. */
    SubmitItem graph[2] = {{0}};
    item_set(&graph[0], "parent", "graph", 0, "1", 0, 1000, 1);
    item_set(&graph[1], "child", "graph", 0, "2", 0, 1000, 1);
    graph[1].after = xcalloc(2, sizeof *graph[1].after);
    graph[1].after[0] = xstrdup("parent");
    graph[0].batch = xstrdup("b1");
    graph[1].batch = xstrdup("b1");
    WorkTemplate cb = {
        .queue = "graph", .payload = json_null(), .timeout_ms = 1000, .max_attempts = 1};
    BatchOpen bo = {.id = "b1", .callback = &cb};
    SubmitResult gres[2];
    CHECK(ws_decide_submit_in(s.ws, graph, 2, NULL, 0, &bo, s.now, &s.out, gres, &err) == 0,
          "the graph was refused: %s", err.msg);
    items_clear(graph, 2);
    sim_emit(&s);
    for (const char *id = "parent"; id; id = strcmp(id, "parent") ? NULL : "child") {
        char *const graph_q[] = {"graph", NULL};
        CHECK(ws_decide_start(s.ws, "w1", graph_q, s.now, &s.out), "%s was not started", id);
        sim_emit(&s);
        Report r = {.work_id = id,
                    .attempt = 1,
                    .worker_id = "w1",
                    .instance = "i1",
                    .completed = true,
                    .result = json_null()};
        ws_decide_report(s.ws, &r, NULL, s.now, &s.out, &rr);
        sim_emit(&s);
    }
    ScheduleSpec spec = {
        .cron_text = "* * * * * *",
        .tz = "UTC",
        .work = {
            .queue = "default", .payload = json_null(), .timeout_ms = 1000, .max_attempts = 1}};
    CHECK(cron_parse(spec.cron_text, &spec.cron, &err) == 0, "cron: %s", err.msg);
    spec.zone = tz_get("UTC", &err);
    ws_decide_schedule_set(s.ws, "every-second", &spec, s.now, &s.out);
    sim_emit(&s);
    s.now += 1000;
    ws_decide_ticks(s.ws, s.now, &s.out);
    sim_emit(&s);
    CHECK(ws_decide_schedule_delete(s.ws, "every-second", s.now, &s.out, &err) == 0,
          "delete refused: %s", err.msg);
    sim_emit(&s);

    Subscription sub = {.name = "billing",
                        .url = "https://example.com/hooks",
                        .secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                        .kinds = (char *[]){"completed", "dead", NULL}};
    const SubscriptionSet *subs = ws_subscriptions(s.ws);
    Cursor start = at_seq(s.seq);
    CHECK(subs_decide_set(subs, &sub, false, &start, s.now, &s.out, &err) == 0,
          "the subscription was refused: %s", err.msg);
    sim_emit(&s);
    start = at_seq(s.seq);
    subs_decide_cursor(subs, "billing", &start, s.now, &s.out);
    CHECK(subs_decide_pause(subs, "billing", "failing", &start, s.now, &s.out),
          "the pause should be decided");
    sim_emit(&s);
    start = at_seq(s.seq);
    CHECK(subs_decide_delete(subs, "billing", &start, s.now, &s.out, &err) == 0,
          "the deletion was refused: %s", err.msg);
    sim_emit(&s);

    bool seen[MAX_TYPES] = {0};
    for (size_t i = 0; i < s.log.len; i++) {
        char what[64];
        snprintf(what, sizeof what, "the decided event at seq %lld", (long long)s.log.items[i].seq);
        expect_round_trip(what, &s.log.items[i]);
        seen[s.log.items[i].type] = true;
    }
    FOR_EACH_TYPE(t)
    CHECK(seen[t], "the scenario should decide a %s event", event_type_name((EventType)t));
    sim_free(&s);
}

static void test_decoding_ignores_unknown_fields(void **state)
{
    EventList l;
    eventlist_init(&l);
    fill_examples(&l);
    for (size_t i = 0; i < l.len; i++) {
        const Event *e = &l.items[i];
        json_t *data = event_data_encode(e);
        json_object_set_new(data, "added_in_v9", J("{\"x\": [1, 2]}"));
        json_object_set_new(data, "note", json_string("from a later server"));
        Event back;
        Err err;
        CHECK(event_decode(e->seq, e->term, e->at, event_type_name(e->type), 9, e->work_id, data,
                           &back, &err) == 0,
              "a %s event with fields from a later version is refused: %s",
              event_type_name(e->type), err.msg);
        CHECK(back.version == 9, "the row's version should be kept");
        back.version = e->version;
        char *d = event_diff(e, &back);
        CHECK(!d, "unknown fields changed the decoded %s event:%s", event_type_name(e->type), d);
        event_clear(&back);
        json_decref(data);
    }
    eventlist_free(&l);
}

/* Fails unless the row is refused with a message naming `names`. */
static void expect_bad_row(const char *type, const char *work_id, const char *data_text,
                           const char *names)
{
    json_t *data = J(data_text);
    Event out;
    Err err;
    err_clear(&err);
    int rc = event_decode(42, 1, T0, type, 1, work_id, data, &out, &err);
    if (rc == 0)
        event_clear(&out);
    json_decref(data);
    CHECK(rc != 0, "a %s event with data %s should be refused", type, data_text);
    CHECK(err.status == 500 && !strcmp(err.type, "bad-event"),
          "a bad %s event should be a 500 bad-event, not %d %s", type, err.status, err.type);
    CHECK(strstr(err.msg, names), "refusing the %s event %s, the message '%s' should name '%s'",
          type, data_text, err.msg, names);
}

static void test_missing_required_fields_are_errors(void **state)
{
    static const struct {
        const char *type, *data, *names;
    } bad[] = {
        {"term", "{\"leader\": \"http://a\"}", "'term'"},
        {"term", "{\"term\": null}", "'term'"},
        {"term", "{\"term\": \"2\"}", "'term'"},
        {"accepted", "{\"priority\": 0, \"payload\": 1, \"timeout_ms\": 1, \"max_attempts\": 1}",
         "'queue'"},
        {"accepted", "{\"queue\": \"q\", \"payload\": 1, \"max_attempts\": 1}", "'timeout_ms'"},
        {"accepted", "{\"queue\": \"q\", \"payload\": 1, \"timeout_ms\": 1}", "'max_attempts'"},
        {"accepted", "{\"queue\": \"q\", \"payload\": 1, \"timeout_ms\": 1.5, \"max_attempts\": 1}",
         "'timeout_ms'"},
        {"accepted",
         "{\"queue\": \"q\", \"priority\": \"high\", \"timeout_ms\": 1, \"max_attempts\": 1}",
         "'priority'"},
        {"started", "{\"worker_id\": \"w\", \"deadline\": 5}", "'attempt'"},
        {"started", "{\"attempt\": 1, \"worker_id\": \"w\"}", "'deadline'"},
        {"started", "{\"attempt\": 1, \"deadline\": 5}", "'worker_id'"},
        {"completed", "{\"result\": 1}", "'attempt'"},
        {"failed", "{\"error\": \"x\", \"retry_at\": 5}", "'attempt'"},
        {"failed", "{\"attempt\": 1, \"retry_at\": \"soon\"}", "'retry_at'"},
        {"timed_out", "{\"error\": \"x\"}", "'attempt'"},
        {"retried", "{\"queue\": \"q\", \"payload\": 1, \"timeout_ms\": 1, \"max_attempts\": 2}",
         "'attempt'"},
        {"retried", "{\"attempt\": 1, \"payload\": 1, \"timeout_ms\": 1, \"max_attempts\": 2}",
         "'queue'"},
        {"progress", "{\"queue\": \"q\", \"fraction\": 0.5}", "'attempt'"},
        {"subscription", "{\"url\": \"https://a\", \"kinds\": [], \"start\": 1}", "'name'"},
        {"subscription", "{\"name\": \"a\", \"kinds\": [], \"start\": 1}", "'url'"},
        {"subscription", "{\"name\": \"a\", \"deleted\": true, \"start\": \"1\"}", "'start'"},
        {"subscription_cursor", "{\"cursor\": 3}", "'name'"},
        {"subscription_cursor", "{\"name\": \"a\"}", "'cursor'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_bad_row(bad[i].type, "job-1", bad[i].data, bad[i].names);
    expect_bad_row("cancelled", NULL, "{}", "work id");
    expect_bad_row("dead", NULL, "{\"error\": \"x\"}", "work id");
}

/* The data of progress and subscription events as servers wrote them when
 * those events carried it as a JSON object (and as the database keeps it:
 * migration 0016 strips the secret and the URL's credentials): each decodes
 * into the typed fields and encodes back to the same data. */
static void test_typed_kinds_encode_as_before(void **state)
{
    static const struct {
        const char *type, *data;
    } rows[] = {
        {"progress", "{\"attempt\": 2, \"queue\": \"images\", \"fraction\": 0.25, "
                     "\"message\": \"a quarter\", \"output\": \"line 1\\n\"}"},
        {"progress", "{\"attempt\": 1, \"queue\": \"mail\", \"fraction\": null, "
                     "\"message\": null}"},
        {"progress", "{\"attempt\": 1, \"queue\": \"mail\", \"fraction\": 1.0, "
                     "\"message\": null, \"output\": \"\"}"},
        /* an operator's PUT, as written (secret) and as logged (none) */
        {"subscription",
         "{\"name\": \"billing\", \"url\": \"https://u:p@example.com/h\", \"secret\": "
         "\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"queues\": [\"mail\", \"sms\"], "
         "\"kinds\": [\"completed\"], \"paused\": false, \"paused_reason\": null, "
         "\"deleted\": false, \"start\": 99}"},
        {"subscription", "{\"name\": \"billing\", \"url\": \"https://***@example.com/h\", "
                         "\"queues\": null, \"kinds\": [\"dead\", \"cancelled\"], "
                         "\"paused\": true, \"paused_reason\": null, \"deleted\": false, "
                         "\"start\": 99, \"cursor\": 5}"},
        {"subscription", "{\"name\": \"billing\", \"deleted\": true, \"start\": 120}"},
        {"subscription_cursor", "{\"name\": \"billing\", \"cursor\": 118}"},
        /* with several shards: each shard's place beside shard 0's */
        {"subscription", "{\"name\": \"billing\", \"url\": \"https://example.com/h\", "
                         "\"queues\": null, \"kinds\": [\"dead\"], \"paused\": false, "
                         "\"paused_reason\": null, \"deleted\": false, \"start\": 99, "
                         "\"starts\": [99, 0, 41]}"},
        {"subscription", "{\"name\": \"billing\", \"url\": \"https://example.com/h\", "
                         "\"queues\": null, \"kinds\": [\"dead\"], \"paused\": false, "
                         "\"paused_reason\": null, \"deleted\": false, \"start\": 99, "
                         "\"starts\": [99, 7], \"cursor\": 5, \"cursors\": [5, 3]}"},
        {"subscription", "{\"name\": \"billing\", \"deleted\": true, \"start\": 120, "
                         "\"starts\": [120, 8]}"},
        {"subscription_cursor", "{\"name\": \"billing\", \"cursor\": 118, "
                                "\"cursors\": [118, 0, 77]}"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        json_t *data = J(rows[i].data);
        Event e;
        Err err;
        CHECK(event_decode(7, 1, T0, rows[i].type, 1,
                           !strcmp(rows[i].type, "progress") ? "w" : NULL, data, &e, &err) == 0,
              "row %zu (%s) no longer decodes: %s", i, rows[i].type, err.msg);
        json_t *again = event_data_encode(&e);
        char *want = jtext(data), *got = jtext(again);
        CHECK(json_equal(data, again), "row %zu (%s) encodes as %s, not as it was: %s", i,
              rows[i].type, got, want);
        free(want);
        free(got);
        json_decref(again);
        json_decref(data);
        event_clear(&e);
    }
    /* workd's pause before this version had no "deleted"; it reads as not
     * deleted and is written back with "deleted": false. */
    json_t *data = J("{\"name\": \"b\", \"url\": \"https://h\", \"queues\": null, \"kinds\": "
                     "[\"dead\"], \"paused\": true, \"paused_reason\": \"failing\", \"start\": 3}");
    Event e;
    Err err;
    CHECK(event_decode(8, 1, T0, "subscription", 1, NULL, data, &e, &err) == 0, "%s", err.msg);
    CHECK(!e.sub_deleted && !e.sub_reset && e.sub_start.n == 1 && e.sub_start.seq[0] == 3 &&
              e.sub->paused && !strcmp(e.sub->paused_reason, "failing") && !e.sub->queues &&
              !e.sub->secret,
          "an old pause decodes as %s", sub_text(e.sub));
    json_object_set_new(data, "deleted", json_false());
    json_t *again = event_data_encode(&e);
    CHECK(json_equal(data, again), "an old pause encodes back with deleted: false only");
    json_decref(again);
    json_decref(data);
    event_clear(&e);
}

static void test_unknown_type_is_an_error(void **state)
{
    expect_bad_row("exploded", "job-1", "{}", "'exploded'");
    expect_bad_row("Completed", "job-1", "{\"attempt\": 1}", "'Completed'");
    expect_bad_row("", "job-1", "{}", "seq 42");
}

static void test_copy_is_deep(void **state)
{
    EventList l;
    eventlist_init(&l);
    fill_examples(&l);
    for (size_t i = 0; i < l.len; i++) {
        Event copy;
        event_copy(&copy, &l.items[i]);
        char *d = event_diff(&l.items[i], &copy);
        CHECK(!d, "the copy of a %s event differs:%s", event_type_name(copy.type), d);
        event_clear(&l.items[i]); /* the copy must not share what this frees */
        CHECK(copy.type == EV_TERM || copy.type == EV_QUEUE_SET || copy.type == EV_SUBSCRIPTION ||
                  copy.type == EV_SUB_CURSOR || copy.schedule || copy.batch ||
                  (copy.work_id && !strcmp(copy.work_id, "job-1")),
              "the copy lost its work id when the original was cleared");
        event_clear(&copy);
    }
    eventlist_clear(&l);
    CHECK(l.len == 0 && l.cap > 0, "eventlist_clear should empty the list and keep capacity");
    eventlist_free(&l);
}

/* ---- the version-1 fixture ---- */

/* Reads the fixture from $WORKD_SOURCE_DIR, or next to this source file. */
static json_t *load_fixture(const char *name)
{
    char path[4096];
    const char *root = getenv("WORKD_SOURCE_DIR");
    if (root && *root) {
        snprintf(path, sizeof path, "%s/tests/fixtures/%s", root, name);
    } else {
        char here[4096];
        snprintf(here, sizeof here, "%s", __FILE__);
        snprintf(path, sizeof path, "%s/../fixtures/%s", dirname(here), name);
    }
    json_error_t je;
    json_t *rows = json_load_file(path, 0, &je);
    CHECK(rows, "cannot read the fixture %s: %s (line %d); is WORKD_SOURCE_DIR the repo root?",
          path, je.text, je.line);
    CHECK(json_is_array(rows), "the fixture %s should be an array of event rows", path);
    return rows;
}

/* Decodes row i of the fixture into out. */
static void decode_row(json_t *row, size_t i, Event *out)
{
    json_int_t seq, term, at;
    const char *type;
    int version;
    json_t *work_id, *data;
    json_error_t je;
    CHECK(json_unpack_ex(row, &je, JSON_STRICT, "{s:I, s:I, s:I, s:s, s:i, s:o, s:o}", "seq", &seq,
                         "term", &term, "at", &at, "type", &type, "version", &version, "work_id",
                         &work_id, "data", &data) == 0,
          "row %zu of the fixture is not {seq, term, at, type, version, work_id, data}: %s", i,
          je.text);
    Err err;
    CHECK(event_decode(seq, term, at, type, version, json_string_value(work_id), data, out, &err) ==
              0,
          "row %zu (seq %lld, %s) of the version-1 fixture no longer decodes: %s", i,
          (long long)seq, type, err.msg);
}

/* Fails unless every key of each expected item equals the dump's (the dump
 * may grow fields; the fixture only speaks for these). */
static void expect_open_work(json_t *want, json_t *dump)
{
    size_t i;
    json_t *w;
    CHECK(json_array_size(dump) == json_array_size(want),
          "the fixture leaves %zu items open, the replay %zu", json_array_size(want),
          json_array_size(dump));
    json_array_foreach(want, i, w)
    {
        json_t *got = json_array_get(dump, i), *v;
        const char *key;
        json_object_foreach(w, key, v)
        {
            char *a = jtext(v), *b = jtext(json_object_get(got, key));
            CHECK(json_equal(v, json_object_get(got, key)),
                  "open item %zu ('%s') after replaying the fixture: '%s' should be %s, not %s", i,
                  json_string_value(json_object_get(w, "id")), key, a, b);
            free(a);
            free(b);
        }
    }
}

static void test_version_1_log_replays(void **state)
{
    json_t *rows = load_fixture("events_v1.json");
    WorkState *ws = ws_new(&CFG);
    Proj proj;
    proj_init(&proj);
    int finals[MAX_TYPES] = {0};
    int64_t last_seq = 0, now = T0 + 90000;
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
    {
        Event e;
        decode_row(row, i, &e);
        CHECK(e.version == 1 && e.seq > last_seq && e.type <= V1_LAST,
              "row %zu: a version-1 log has version 1, increasing seq and version-1 types", i);
        last_seq = e.seq;
        ws_apply(ws, &e);
        proj_apply(&proj, &e);
        finals[e.type]++;
        event_clear(&e);
    }
    for (int t = EV_TERM; t <= V1_LAST; t++)
        CHECK(finals[t] >= (event_is_final((EventType)t) ? 3 : 1),
              "the fixture should hold %s events (for several items if final), it has %d",
              event_type_name((EventType)t), finals[t]);
    ws_advance(ws, now);

    json_t *want =
        json_pack("[{s:s, s:s, s:i, s:{s:i}, s:I, s:I, s:i, s:I, s:s, s:i, s:n, s:I, s:n},"
                  " {s:s, s:s, s:i, s:{s:s}, s:I, s:I, s:i, s:I, s:s, s:i, s:n, s:I, s:n},"
                  " {s:s, s:s, s:i, s:s, s:I, s:I, s:i, s:I, s:s, s:i, s:s, s:I, s:n},"
                  " {s:s, s:s, s:i, s:b, s:I, s:I, s:i, s:I, s:s, s:i, s:n, s:I, s:s}]",
                  "id", "open-pending", "queue", "default", "priority", 0, "payload", "n", 1,
                  "run_at", (json_int_t)0, "timeout_ms", (json_int_t)30000, "max_attempts", 3,
                  "accepted_seq", (json_int_t)33, "status", "pending", "attempt", 0, "worker_id",
                  "deadline", (json_int_t)0, "last_error",
                  /* */
                  "id", "open-scheduled", "queue", "reports", "priority", -3, "payload", "day",
                  "2026-01-02", "run_at", (json_int_t)(T0 + 86400000), "timeout_ms",
                  (json_int_t)30000, "max_attempts", 3, "accepted_seq", (json_int_t)34, "status",
                  "pending", "attempt", 0, "worker_id", "deadline", (json_int_t)0, "last_error",
                  /* */
                  "id", "open-running", "queue", "images", "priority", 10, "payload", "b.png",
                  "run_at", (json_int_t)0, "timeout_ms", (json_int_t)60000, "max_attempts", 3,
                  "accepted_seq", (json_int_t)35, "status", "running", "attempt", 1, "worker_id",
                  "w3", "deadline", (json_int_t)(T0 + 126000), "last_error",
                  /* */
                  "id", "open-retry", "queue", "default", "priority", 2, "payload", 1, "run_at",
                  (json_int_t)0, "timeout_ms", (json_int_t)20000, "max_attempts", 4, "accepted_seq",
                  (json_int_t)37, "status", "pending", "attempt", 1, "worker_id", "deadline",
                  (json_int_t)0, "last_error", "worker w4 lost: no heartbeat for 10000 ms");
    CHECK(want, "the test's expected open work does not pack");
    json_t *dump = state_dump(ws);
    expect_open_work(want, dump);
    CHECK(!strcmp(ws_item_status(ws_get(ws, "open-scheduled"), now), "scheduled"),
          "open-scheduled should show as scheduled");
    json_t *stats = queue_stats_json(ws, now);
    json_t *want_stats =
        J("{\"default\": {\"waiting\": 0, \"pending\": 2, \"scheduled\": 0, \"running\": 0},"
          " \"reports\": {\"waiting\": 0, \"pending\": 0, \"scheduled\": 1, \"running\": 0},"
          " \"images\": {\"waiting\": 0, \"pending\": 0, \"scheduled\": 0, \"running\": 1}}");
    check_json_equal("the queue stats after the fixture", want_stats, stats);

    /* The projection the same log leaves recovers the same state. */
    WorkState *recovered = ws_new(&CFG);
    proj_restore(&proj, recovered);
    ws_advance(recovered, now);
    json_t *rdump = state_dump(recovered);
    check_json_equal("the state recovered from the fixture's projection", dump, rdump);
    static const char *const final[][2] = {
        {"done-1", "completed"},
        {"done-2", "completed"},
        {"done-3", "completed"},
        {"retry-then-done", "completed"},
        {"dead-refused", "dead"},
        {"exhausted", "dead"},
        {"timeout-dead", "dead"},
        {"dead-left", "dead"},
        {"cancel-1", "cancelled"},
        {"cancel-sched", "cancelled"},
        {"cancel-after-fail", "cancelled"},
    };
    for (size_t k = 0; k < sizeof final / sizeof *final; k++) {
        const ProjRow *r = proj_get(&proj, final[k][0]);
        CHECK(!ws_get(ws, final[k][0]) && r && !strcmp(r->status, final[k][1]),
              "'%s' should be %s after the fixture", final[k][0], final[k][1]);
    }

    /* The replayed state goes on working: the oldest best work is handed out next. */
    ws_adopt_running_workers(ws, now);
    CHECK(ws_worker_get(ws, "w3"), "w3 holds open-running and should be adopted");
    EventList out;
    eventlist_init(&out);
    CHECK(ws_decide_start(ws, "w9", NULL, now, &out) &&
              !strcmp(out.items[0].work_id, "open-retry") && out.items[0].attempt == 2,
          "after the fixture, open-retry (priority 2) should start next as attempt 2");
    eventlist_free(&out);

    json_decref(rdump);
    ws_free(recovered);
    json_decref(stats);
    json_decref(want_stats);
    json_decref(dump);
    json_decref(want);
    proj_free(&proj);
    ws_free(ws);
    json_decref(rows);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_round_trips),
        cmocka_unit_test(test_a_record_of_many_lines_reads_back),
        cmocka_unit_test(test_result_json_carries_the_trace_context),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_decided_events_round_trip),
        cmocka_unit_test(test_decoding_ignores_unknown_fields),
        cmocka_unit_test(test_missing_required_fields_are_errors),
        cmocka_unit_test(test_typed_kinds_encode_as_before),
        cmocka_unit_test(test_unknown_type_is_an_error),
        cmocka_unit_test(test_copy_is_deep),
        cmocka_unit_test(test_version_1_log_replays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
