/* Tests of front-end parts that link without server/main.c: the leader
 * information (one writer, many readers), the proxy's answers when no leader
 * can be reached, the invariants of api.c's route table, and the rendering of
 * /metrics. */
#include "ws_testlib.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "http.h"
#include "leaderinfo.h"
#include "metrics.h"
#include "proxy.h"

/* ---- LeaderInfo ---- */

static void test_leaderinfo_set_get_suspect(void **state)
{
    LeaderInfo *li = leaderinfo_new();
    char url[256];
    CHECK(leaderinfo_get(li, url, sizeof url) == 0 && url[0] == '\0',
          "a new LeaderInfo should know no leader, but says '%s'", url);
    CHECK(!leaderinfo_suspect(li), "a new LeaderInfo should not be suspect");
    CHECK(leaderinfo_set(li, "http://a:1", 3), "setting the first leader should count as a change");
    CHECK(!leaderinfo_set(li, "http://a:1", 3), "setting the same leader again is not a change");
    CHECK(leaderinfo_set(li, "http://a:1", 4), "a new term is a change");
    CHECK(leaderinfo_set(li, "http://b:2", 4), "a new URL is a change");
    CHECK(leaderinfo_get(li, url, sizeof url) == 4 && !strcmp(url, "http://b:2"),
          "the leader should be http://b:2 in term 4, not '%s'", url);
    leaderinfo_mark_suspect(li);
    CHECK(leaderinfo_suspect(li), "a reader marked the leader suspect; the mark was lost");
    leaderinfo_set(li, "http://b:2", 4);
    CHECK(!leaderinfo_suspect(li), "re-reading the leader should clear the suspicion");
    char small[8];
    leaderinfo_get(li, small, sizeof small);
    CHECK(strlen(small) == sizeof small - 1, "a short buffer should get a truncated URL");
    leaderinfo_free(li);
}

typedef struct Reader {
    LeaderInfo *li;
    atomic_bool *stop;
    long reads, torn;
} Reader;

/* Reads until told to stop, counting answers whose URL is not the one the
 * writer set with that term ("http://n<term>"). */
static void *reader_main(void *arg)
{
    Reader *r = arg;
    while (!atomic_load(r->stop)) {
        char url[256], want[64];
        int64_t t = leaderinfo_get(r->li, url, sizeof url);
        snprintf(want, sizeof want, "http://n%lld", (long long)t);
        if (t && strcmp(url, want))
            r->torn++;
        r->reads++;
    }
    return NULL;
}

static void test_leaderinfo_readers_never_see_a_torn_pair(void **state)
{
    LeaderInfo *li = leaderinfo_new();
    atomic_bool stop = false;
    Reader rd[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        rd[i] = (Reader){.li = li, .stop = &stop};
        pthread_create(&th[i], NULL, reader_main, &rd[i]);
    }
    for (int64_t t = 1; t <= 20000; t++) {
        char url[64];
        /* URLs of changing length, so that a torn copy would show. */
        snprintf(url, sizeof url, "http://n%lld", (long long)t);
        leaderinfo_set(li, url, t);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(rd[i].torn == 0, "reader %d saw %ld of %ld answers whose URL was not its term's", i,
              rd[i].torn, rd[i].reads);
    }
    leaderinfo_free(li);
}

/* ---- the proxy, with no leader to reach ---- */

static bool answered(Req *r)
{
    return __atomic_load_n(&r->answered, __ATOMIC_ACQUIRE);
}

/* A request as the HTTP layer hands it to the proxy, without a connection: the
 * proxy reads no header or query then, and answers by setting r's answer. */
static Req *fake_req(const char *method, const char *path)
{
    Req *r = xcalloc(1, sizeof *r);
    r->method = xstrdup(method);
    r->path = xstrdup(path);
    sbuf_init(&r->body);
    return r;
}

static void free_req(Req *r)
{
    free(r->method);
    free(r->path);
    free(r->resp_body);
    sbuf_free(&r->body);
    free(r);
}

static ProxyConfig proxy_config(LeaderInfo *li, Metrics *m)
{
    return (ProxyConfig){.leader = li,
                         .metrics = m,
                         .deadline_ms = 300,
                         .pull_wait_max_ms = 1000,
                         .max_reply_bytes = 65536,
                         .cluster_secret = "",
                         .node_id = "test-node"};
}

static void test_proxy_without_leader_marks_it_suspect_and_answers_503(void **state)
{
    LeaderInfo *li = leaderinfo_new();
    Metrics *m = xcalloc(1, sizeof *m);
    metrics_init(m);
    ProxyConfig pc = proxy_config(li, m);
    Err err = {0};
    Proxy *p = proxy_start(&pc, &err);
    CHECK(p, "the proxy should start: %s", err.msg);
    Req *r = fake_req("POST", "/work");
    proxy_forward(p, r, xstrdup("{\"payload\":1}"));
    /* It retries until its deadline (300 ms), then gives up: wait for that
     * without a bound that load could break, but not forever. */
    for (int i = 0; i < 60000 && !answered(r); i++)
        usleep(1000);
    CHECK(answered(r), "the proxy never answered a forward that no leader could take");
    CHECK(leaderinfo_suspect(li), "with no leader known, the proxy should ask the listener to "
                                  "re-read the leader (mark it suspect)");
    CHECK(r->status == 503, "a forward with no leader should end in 503, not %d", r->status);
    CHECK(r->resp_body && strstr(r->resp_body, "leader-unavailable") &&
              strstr(r->resp_body, "no leader known"),
          "the 503 should say leader-unavailable and why, not: %s",
          r->resp_body ? r->resp_body : "(no body)");
    CHECK(atomic_load(&m->proxied) == 1 && atomic_load(&m->proxy_failures) == 1,
          "one forward that failed should count proxied 1, failures 1, not %lld, %lld",
          (long long)atomic_load(&m->proxied), (long long)atomic_load(&m->proxy_failures));
    free_req(r);

    /* Once stopping, a forward is answered at once: this node shuts down. */
    proxy_stop(p);
    r = fake_req("GET", "/cluster");
    proxy_forward(p, r, NULL);
    CHECK(answered(r) && r->status == 503 && strstr(r->resp_body, "shutting-down"),
          "a forward to a stopped proxy should be answered 503 shutting-down at once (%d %s)",
          r->status, r->resp_body ? r->resp_body : "(no body)");
    free_req(r);
    proxy_free(p);
    free(m);
    leaderinfo_free(li);
}

/* ---- api.c's route table ---- */

static void test_routes_are_distinct_and_fit_the_metrics(void **state)
{
    CHECK(api_routes_count + 1 <= METRICS_ROUTES,
          "%zu routes need %zu metrics slots (one for unmatched), METRICS_ROUTES is %d",
          api_routes_count, api_routes_count + 1, METRICS_ROUTES);
    for (size_t i = 0; i < api_routes_count; i++) {
        const Route *a = &api_routes[i];
        CHECK(a->pattern[0] == '/', "route %s: the pattern '%s' does not start with /", a->name,
              a->pattern);
        size_t segs = 0;
        for (const char *c = a->pattern; *c; c++)
            segs += *c == '/';
        CHECK(segs <= HTTP_MAX_SEGMENTS, "route %s has %zu segments, more than %d", a->name, segs,
              HTTP_MAX_SEGMENTS);
        CHECK(!a->json_body || !strcmp(a->method, "POST") || !strcmp(a->method, "PUT"),
              "route %s takes a JSON body but is a %s", a->name, a->method);
        for (size_t j = 0; j < i; j++) {
            const Route *b = &api_routes[j];
            CHECK(strcmp(a->name, b->name), "two routes are named %s: their metrics would mix",
                  a->name);
            CHECK(strcmp(a->method, b->method) || strcmp(a->pattern, b->pattern),
                  "%s %s is routed twice (%s and %s)", a->method, a->pattern, b->name, a->name);
        }
    }
}

/* ---- metrics.c's rendering ---- */

static void expect_line(const char *text, const char *line)
{
    CHECK(strstr(text, line), "/metrics should have the line '%s'; it has:\n%s", line, text);
}

static void test_metrics_render_names_routes_and_the_unmatched(void **state)
{
    Metrics *m = xcalloc(1, sizeof *m);
    metrics_init(m);
    metrics_observe(m, 1, 202, 1500);
    metrics_observe(m, 1, 202, 2500);
    metrics_observe(m, METRICS_ROUTES - 1, 404, 10);
    metrics_observe(m, METRICS_ROUTES, 500, 10); /* out of range: not counted */
    const char *routes[] = {"first", "second"};
    OpenCount q = {.queue = "q",
                   .pending = 3,
                   .scheduled = 1,
                   .running = 2,
                   .oldest_pending_at = VIEW_NO_TIME,
                   .oldest_pending_age_s = 1.5};
    OpenCounts open = {.items = &q, .len = 1};
    MetricsNode node = {.routes = routes,
                        .n_routes = 2,
                        .leader_term = 7,
                        .is_leader = false,
                        .database_up = true,
                        .open_counts = &open,
                        .mgr = NULL};
    size_t len;
    char *text = metrics_render(m, &node, &len);
    CHECK(text && strlen(text) == len, "metrics_render should return its text and its length");
    expect_line(text, "workd_http_requests_total{route=\"second\",code=\"2xx\"} 2\n");
    expect_line(text, "workd_http_requests_total{route=\"unmatched\",code=\"4xx\"} 1\n");
    CHECK(!strstr(text, "route=\"first\""), "a route with no request has no line:\n%s", text);
    CHECK(!strstr(text, "5xx"), "an observation past the last slot must not count:\n%s", text);
    expect_line(text, "workd_http_request_duration_seconds_count{route=\"second\"} 2\n");
    expect_line(text, "workd_leader_term 7\n");
    expect_line(text, "workd_is_leader 0\n");
    expect_line(text, "workd_database_up 1\n");
    expect_line(text, "workd_queue_depth{queue=\"q\",state=\"running\"} 2\n");
    expect_line(text, "workd_queue_oldest_pending_age_seconds{queue=\"q\"} 1.5\n");
    CHECK(!strstr(text, "workd_commit_duration_seconds"),
          "a node without the manager role shows no leader counters");
    free(text);
    free(m);
}

static void test_api_state_lives_and_dies(void **state)
{
    Api *a = api_new();
    CHECK(a, "api_new returned NULL");
    api_free(a);
    api_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leaderinfo_set_get_suspect),
        cmocka_unit_test(test_leaderinfo_readers_never_see_a_torn_pair),
        cmocka_unit_test(test_proxy_without_leader_marks_it_suspect_and_answers_503),
        cmocka_unit_test(test_routes_are_distinct_and_fit_the_metrics),
        cmocka_unit_test(test_metrics_render_names_routes_and_the_unmatched),
        cmocka_unit_test(test_api_state_lives_and_dies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
