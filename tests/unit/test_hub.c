/* The results hub with one and several shards: each event's `id:` is the
 * subscriber's cursor after it, shards merge by arrival and keep their own
 * order, a stream resumed from any id it gave has no gap and no repeat, and
 * claims, scans and waits are per shard. The hub runs behind a real HTTP
 * daemon on loopback; no table is read (every cursor here is within the
 * rings). */
#include "ws_testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cursor.h"
#include "http.h"
#include "hub.h"
#include "metrics.h"
#include "util.h"

/* ---- a hub behind a daemon ---- */

typedef struct Rig {
    Hub *hub;
    Metrics *metrics;
    Http *http;
    int port;
} Rig;

/* GET /results[?after=<cursor>][&work_id=<id>]: the hub's stream. */
static void h_results(Req *r, char *const *p)
{
    Rig *rig = r->app;
    const char *after = req_query(r, "after"), *work_id = req_query(r, "work_id");
    Cursor c;
    Err err = {0};
    if (after && cursor_parse(after, hub_shards(rig->hub), &c, &err) != 0) {
        req_finish_problem(r, &err);
        return;
    }
    r->stream =
        hub_subscribe(rig->hub, r->conn, after ? &c : NULL, work_id, NULL, false, false, &err);
    if (!r->stream) {
        req_finish_problem(r, &err);
        return;
    }
    r->status = 200;
    r->answered = true;
}

static const Route rig_routes[] = {
    {"GET", "/results", h_results, "results", false, 0, "after work_id"}};

static void rig_start(Rig *rig, int shards)
{
    Cursor last;
    cursor_zero(&last, shards);
    rig->metrics = xcalloc(1, sizeof *rig->metrics);
    metrics_init(rig->metrics);
    rig->hub = hub_new(NULL, rig->metrics, 60000, 16, 1 << 20, 64 * 1024, &last);
    HttpConfig hc = {.listen = "127.0.0.1:0",
                     .threads = 2,
                     .max_connections = 16,
                     .connection_timeout_ms = 10000,
                     .request_timeout_ms = 10000,
                     .max_body = 64};
    static HttpApp app;
    app = (HttpApp){.routes = rig_routes, .n_routes = 1, .ctx = rig};
    rig->http = http_new(&hc);
    Err err = {0};
    CHECK(http_start(rig->http, &app, &err) == 0, "the daemon should start: %s", err.msg);
    rig->port = http_port(rig->http);
}

static void rig_stop(Rig *rig)
{
    hub_shutdown(rig->hub);
    http_stop(rig->http);
    http_free(rig->http);
    hub_free(rig->hub);
    free(rig->metrics);
}

/* Publishes a completed event of work `id` at seq of shard, as the listener
 * would. */
static void publish(Hub *h, int shard, int64_t seq, const char *id)
{
    SBuf b;
    sbuf_init(&b);
    sbuf_printf(&b, "event: completed\ndata: ");
    size_t off = b.len;
    sbuf_printf(&b, "{\"seq\":%lld,\"id\":\"%s\"}", (long long)seq, id);
    size_t data_len = b.len - off;
    sbuf_puts(&b, "\n\n");
    ResultEvent ev = {.shard = shard,
                      .seq = seq,
                      .at = 1000 + seq,
                      .type = EV_COMPLETED,
                      .work_id = xstrdup(id),
                      .queue = xstrdup("q"),
                      .frame_len = b.len,
                      .data_off = off,
                      .data_len = data_len};
    ev.frame = sbuf_steal(&b);
    hub_publish(h, &ev);
    view_result_clear(&ev);
}

/* Opens GET path (HTTP/1.0: the body unchunked); returns the socket. */
static int open_stream(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0,
          "cannot connect to the daemon on port %d", port);
    char req[512];
    int len = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: test\r\n\r\n", path);
    CHECK(write(fd, req, (size_t)len) == len, "cannot send GET %s", path);
    return fd;
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Reads from fd into text until it holds `ids` lines "id: " (the ready
 * event's included), or 5 s pass. */
static void read_ids(int fd, char *text, size_t cap, int ids)
{
    size_t got = strlen(text);
    int64_t until = mono_ms() + 5000;
    while (count_of(text, "\nid: ") < ids && mono_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t k = read(fd, text + got, cap - 1 - got);
        if (k <= 0)
            break;
        got += (size_t)k;
        text[got] = '\0';
    }
}

/* The ids in text, in order, into out (at most max); returns how many. */
static int ids_of(const char *text, char out[][CURSOR_TEXT_MAX], int max)
{
    int n = 0;
    for (const char *p = text; n < max && (p = strstr(p, "\nid: ")); n++) {
        p += 5;
        size_t len = strcspn(p, "\r\n");
        snprintf(out[n], CURSOR_TEXT_MAX, "%.*s", (int)len, p);
    }
    return n;
}

/* ---- tests ---- */

/* One shard: the bytes of the stream are those of the hub before shards (the
 * seq as id, the ready event's after a number). */
static void test_one_shard_streams_seqs_as_ids(void **state)
{
    Rig rig;
    rig_start(&rig, 1);
    publish(rig.hub, 0, 5, "a");
    publish(rig.hub, 0, 9, "b");
    int fd = open_stream(rig.port, "/results?after=4");
    char text[8192] = "";
    read_ids(fd, text, sizeof text, 3);
    const char *want = ": workd results stream\nretry: 1000\nid: 4\nevent: ready\ndata: "
                       "{\"after\":4}\n\n"
                       "id: 5\nevent: completed\ndata: {\"seq\":5,\"id\":\"a\"}\n\n"
                       "id: 9\nevent: completed\ndata: {\"seq\":9,\"id\":\"b\"}\n\n";
    const char *body = strstr(text, ": workd");
    CHECK(body && strstr(body, want) == body,
          "a stream of one shard should read, byte for byte,\n%s\nnot\n%s", want, text);
    close(fd);
    rig_stop(&rig);
}

/* Three shards fed interleaved: ids are cursors, events come in the order they
 * arrived, and a resume from any id gives exactly the events after it. */
static void test_shards_merge_by_arrival_and_resume_without_gap_or_repeat(void **state)
{
    Rig rig;
    rig_start(&rig, 3);
    static const struct {
        int shard;
        int64_t seq;
        const char *id;
    } evs[] = {{0, 1, "a"}, {1, 1, "b"}, {2, 5, "c"}, {0, 2, "d"},
               {1, 3, "e"}, {2, 6, "f"}, {2, 9, "g"}, {0, 7, "h"}};
    enum { N = sizeof evs / sizeof evs[0] };
    static const char *const want_ids[N] = {"1.0.0", "1.1.0", "1.1.5", "2.1.5",
                                            "2.3.5", "2.3.6", "2.3.9", "7.3.9"};
    for (int i = 0; i < N; i++)
        publish(rig.hub, evs[i].shard, evs[i].seq, evs[i].id);

    int fd = open_stream(rig.port, "/results?after=0");
    char text[16384] = "", ids[N + 1][CURSOR_TEXT_MAX];
    read_ids(fd, text, sizeof text, N + 1);
    close(fd);
    CHECK(strstr(text, "id: 0.0.0\nevent: ready\ndata: {\"after\":\"0.0.0\"}"),
          "the ready event should say where the stream starts, as a string: %s", text);
    int n = ids_of(text, ids, N + 1);
    CHECK(n == N + 1, "%d events and ready expected, got %d ids in\n%s", N, n, text);
    for (int i = 0; i < N; i++)
        CHECK(!strcmp(ids[i + 1], want_ids[i]), "event %d ('%s'): id '%s', expected '%s'", i,
              evs[i].id, ids[i + 1], want_ids[i]);
    /* In arrival order: each event's data after the previous one's. */
    const char *p = text;
    for (int i = 0; i < N; i++) {
        char data[64];
        snprintf(data, sizeof data, "\"id\":\"%s\"", evs[i].id);
        const char *at = strstr(p, data);
        CHECK(at, "event '%s' should come after '%s' (arrival order)", evs[i].id,
              i ? evs[i - 1].id : "ready");
        p = at;
    }

    /* Resume from every id the stream gave: exactly the events after it. */
    for (int from = 0; from < N; from++) {
        char path[128];
        snprintf(path, sizeof path, "/results?after=%s", want_ids[from]);
        fd = open_stream(rig.port, path);
        char again[16384] = "", got[N + 1][CURSOR_TEXT_MAX];
        int expect = N - 1 - from;
        read_ids(fd, again, sizeof again, expect + 1);
        close(fd);
        int m = ids_of(again, got, N + 1);
        CHECK(m == expect + 1, "resumed after %s: %d events expected, got %d ids in\n%s",
              want_ids[from], expect, m - 1, again);
        CHECK(!strcmp(got[0], want_ids[from]), "resumed after %s: ready says %s", want_ids[from],
              got[0]);
        for (int i = 0; i < expect; i++)
            CHECK(!strcmp(got[i + 1], want_ids[from + 1 + i]),
                  "resumed after %s: event %d has id %s, expected %s (a gap or a repeat)",
                  want_ids[from], i, got[i + 1], want_ids[from + 1 + i]);
    }

    /* A cursor that has one shard ahead: that shard's older events are not
     * sent again, the others' are. */
    fd = open_stream(rig.port, "/results?after=0.3.0");
    char mixed[16384] = "", got[N + 1][CURSOR_TEXT_MAX];
    read_ids(fd, mixed, sizeof mixed, 7);
    close(fd);
    int m = ids_of(mixed, got, N + 1);
    static const char *const want_mixed[] = {"0.3.0", "1.3.0", "1.3.5", "2.3.5",
                                             "2.3.6", "2.3.9", "7.3.9"};
    CHECK(m == 7, "after 0.3.0: 6 events expected (shard 1's two are behind it), got %d in\n%s",
          m - 1, mixed);
    for (int i = 0; i < m; i++)
        CHECK(!strcmp(got[i], want_mixed[i]), "after 0.3.0: id %d is %s, expected %s", i, got[i],
              want_mixed[i]);
    rig_stop(&rig);
}

/* A live subscriber gets events of every shard as they are published, its ids
 * starting from where the hub was. */
static void test_live_subscriber_follows_every_shard(void **state)
{
    Rig rig;
    rig_start(&rig, 3);
    publish(rig.hub, 1, 4, "old");
    hub_scanned(rig.hub, 2, 10); /* shard 2 read up to 10: nothing published */
    int fd = open_stream(rig.port, "/results");
    char text[8192] = "";
    read_ids(fd, text, sizeof text, 1);
    CHECK(strstr(text, "id: 0.4.10\nevent: ready"), "a stream from now on starts at 0.4.10: %s",
          text);
    publish(rig.hub, 2, 11, "x");
    publish(rig.hub, 0, 3, "y");
    read_ids(fd, text, sizeof text, 3);
    close(fd);
    char ids[4][CURSOR_TEXT_MAX];
    int n = ids_of(text, ids, 4);
    CHECK(n == 3 && !strcmp(ids[1], "0.4.11") && !strcmp(ids[2], "3.4.11"),
          "live events should carry ids 0.4.11 then 3.4.11:\n%s", text);
    CHECK(!strstr(text, "\"old\""), "an event before the stream started was sent:\n%s", text);
    rig_stop(&rig);
}

/* A work's subscriber whose shard the hub does not know follows every shard;
 * it gets its work's events and no one else's. */
static void test_work_subscriber_gets_its_work_only(void **state)
{
    Rig rig;
    rig_start(&rig, 2);
    publish(rig.hub, 0, 1, "other");
    publish(rig.hub, 1, 1, "mine");
    publish(rig.hub, 0, 2, "other2");
    int fd = open_stream(rig.port, "/results?after=0.0&work_id=mine");
    char text[8192] = "";
    read_ids(fd, text, sizeof text, 2);
    publish(rig.hub, 1, 2, "mine");
    read_ids(fd, text, sizeof text, 3);
    close(fd);
    char ids[4][CURSOR_TEXT_MAX];
    int n = ids_of(text, ids, 4);
    CHECK(n == 3 && !strcmp(ids[1], "1.1") && !strcmp(ids[2], "2.2"),
          "work 'mine' should get ids 1.1 (shard 0's 'other' skipped) then 2.2:\n%s", text);
    CHECK(!strstr(text, "\"other"), "another work's event was sent:\n%s", text);
    rig_stop(&rig);
}

/* Claims and scans are per shard: one shard's manager committing does not
 * make the listener skip another's. */
static void test_claims_and_scans_are_per_shard(void **state)
{
    Rig rig;
    rig_start(&rig, 3);
    CHECK(hub_claim(rig.hub, 1, 1, 5), "shard 1's first commit continues what the hub has");
    CHECK(hub_claimed(rig.hub, 1, 5) && !hub_claimed(rig.hub, 0, 5) && !hub_claimed(rig.hub, 2, 1),
          "a claim of shard 1 covers shard 1 only");
    CHECK(!hub_claim(rig.hub, 2, 7, 9), "shard 2 has nothing up to 6: a claim of 7..9 is a gap");
    CHECK(hub_claim(rig.hub, 1, 6, 8), "a claim right behind shard 1's last claim is in order");
    hub_unclaim(rig.hub, 1);
    CHECK(!hub_claimed(rig.hub, 1, 1), "unclaimed, shard 1 covers nothing");
    hub_scanned(rig.hub, 0, 12);
    CHECK(hub_scanned_upto(rig.hub, 0) == 12 && hub_scanned_upto(rig.hub, 1) == 0 &&
              hub_scanned_upto(rig.hub, 2) == 0,
          "scanning shard 0 moves shard 0 alone");
    rig_stop(&rig);
}

static void fired(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* A wait ends on its work's finish in its shard, not on a seq of another. */
static void test_wait_is_per_shard(void **state)
{
    Rig rig;
    rig_start(&rig, 2);
    atomic_int n = 0;
    hub_wait(rig.hub, 1, "w", 3, mono_ms() + 60000, fired, &n);
    publish(rig.hub, 0, 10, "other");
    CHECK(atomic_load(&n) == 0, "another work's finish ended the wait");
    publish(rig.hub, 1, 4, "w");
    CHECK(atomic_load(&n) == 1, "the work's finish at seq 4 of shard 1 should end its wait");
    /* Already in the ring: the wait ends at once. */
    hub_wait(rig.hub, 1, "w", 3, mono_ms() + 60000, fired, &n);
    CHECK(atomic_load(&n) == 2, "a finish already in the ring should end a new wait at once");
    hub_wait(rig.hub, 1, "w", 4, mono_ms() + 60000, fired, &n);
    CHECK(atomic_load(&n) == 2, "a wait after the finish it has seen should wait");
    rig_stop(&rig); /* fires it */
    CHECK(atomic_load(&n) == 3, "shutdown should end every wait");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_shard_streams_seqs_as_ids),
        cmocka_unit_test(test_shards_merge_by_arrival_and_resume_without_gap_or_repeat),
        cmocka_unit_test(test_live_subscriber_follows_every_shard),
        cmocka_unit_test(test_work_subscriber_gets_its_work_only),
        cmocka_unit_test(test_claims_and_scans_are_per_shard),
        cmocka_unit_test(test_wait_is_per_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
