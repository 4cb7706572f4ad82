/* Tests of front-end parts that link without server/main.c: the leader
 * information (one writer, many readers), the proxy's answers when no leader
 * can be reached, the HTTP daemon serving a table of its caller's, the
 * invariants of api.c's route table, and the rendering of /metrics. */
#include "ws_testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
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
    LeaderInfo *li = leaderinfo_new(1);
    char url[256];
    CHECK(leaderinfo_get(li, 0, url, sizeof url) == 0 && url[0] == '\0',
          "a new LeaderInfo should know no leader, but says '%s'", url);
    CHECK(!leaderinfo_suspect(li), "a new LeaderInfo should not be suspect");
    CHECK(leaderinfo_set(li, 0, "http://a:1", 3),
          "setting the first leader should count as a change");
    CHECK(!leaderinfo_set(li, 0, "http://a:1", 3), "setting the same leader again is not a change");
    CHECK(leaderinfo_set(li, 0, "http://a:1", 4), "a new term is a change");
    CHECK(leaderinfo_set(li, 0, "http://b:2", 4), "a new URL is a change");
    CHECK(leaderinfo_get(li, 0, url, sizeof url) == 4 && !strcmp(url, "http://b:2"),
          "the leader should be http://b:2 in term 4, not '%s'", url);
    leaderinfo_mark_suspect(li);
    CHECK(leaderinfo_suspect(li), "a reader marked the leader suspect; the mark was lost");
    leaderinfo_set(li, 0, "http://b:2", 4);
    CHECK(!leaderinfo_suspect(li), "re-reading the leader should clear the suspicion");
    char small[8];
    leaderinfo_get(li, 0, small, sizeof small);
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
        int64_t t = leaderinfo_get(r->li, 0, url, sizeof url);
        snprintf(want, sizeof want, "http://n%lld", (long long)t);
        if (t && strcmp(url, want))
            r->torn++;
        r->reads++;
    }
    return NULL;
}

static void test_leaderinfo_readers_never_see_a_torn_pair(void **state)
{
    LeaderInfo *li = leaderinfo_new(1);
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
        leaderinfo_set(li, 0, url, t);
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
    LeaderInfo *li = leaderinfo_new(1);
    Metrics *m = xcalloc(1, sizeof *m);
    metrics_init(m);
    ProxyConfig pc = proxy_config(li, m);
    Err err = {0};
    Proxy *p = proxy_start(&pc, &err);
    CHECK(p, "the proxy should start: %s", err.msg);
    Req *r = fake_req("POST", "/work");
    proxy_forward(p, 0, r, xstrdup("{\"payload\":1}"));
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
    proxy_forward(p, 0, r, NULL);
    CHECK(answered(r) && r->status == 503 && strstr(r->resp_body, "shutting-down"),
          "a forward to a stopped proxy should be answered 503 shutting-down at once (%d %s)",
          r->status, r->resp_body ? r->resp_body : "(no body)");
    free_req(r);
    proxy_free(p);
    free(m);
    leaderinfo_free(li);
}

/* ---- http.c with a caller of its own: it knows nothing of the server ---- */

typedef struct Seen {
    atomic_int answers, vouched, last_route, last_status;
} Seen;

/* GET /hello/:who answers who; POST /secret answers how many bytes it got. */
static void h_hello(Req *r, char *const *p)
{
    Seen *seen = r->app;
    atomic_store(&seen->vouched, r->forwarded);
    char *text = xstrdup(p[0] ? p[0] : "");
    if (!p[0]) {
        free(text);
        text = xmalloc(24);
        snprintf(text, 24, "%zu bytes", r->body.len);
    }
    req_finish_raw(r, 200, "text/plain", text, strlen(text));
}

static int t_vouch(void *ctx, Req *r, Err *err)
{
    const char *v = req_header(r, "X-Test-Node");
    if (v && strcmp(v, "friend"))
        return err_set(err, 403, "forwarding-refused", "not a friend");
    r->forwarded = v != NULL;
    return r->forwarded;
}

static int t_authorize(void *ctx, Req *r, Err *err)
{
    if (!r->rt->scope || req_header(r, "Authorization"))
        return 0;
    snprintf(r->location, sizeof r->location, "%s", "Bearer realm=\"test\"");
    return err_set(err, 401, "unauthorized", "say who you are");
}

static void t_observe(void *ctx, int route, int status, int64_t us)
{
    Seen *seen = ctx;
    atomic_store(&seen->last_route, route);
    atomic_store(&seen->last_status, status);
    atomic_fetch_add(&seen->answers, 1);
}

/* Sends a request (head lines after the request line, then body) on a new
 * connection and reads the whole answer into text; waits until the daemon
 * has observed it (the hook may run after the client has the answer).
 * Returns the status, or 0 if none came. */
static int send_one(int port, Seen *seen, const char *line, const char *headers, const char *body,
                    char *text, size_t n)
{
    int before = atomic_load(&seen->answers);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    text[0] = '\0';
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    char req[1024];
    int len = snprintf(req, sizeof req,
                       "%s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n%sContent-Length: "
                       "%zu\r\n%s\r\n%s",
                       line, headers, strlen(body),
                       body[0] ? "Content-Type: application/json\r\n" : "", body);
    if (write(fd, req, (size_t)len) != len) {
        close(fd);
        return 0;
    }
    size_t got = 0;
    ssize_t k;
    while (got + 1 < n && (k = read(fd, text + got, n - 1 - got)) > 0)
        got += (size_t)k;
    text[got] = '\0';
    close(fd);
    for (int i = 0; i < 5000 && atomic_load(&seen->answers) == before; i++)
        usleep(1000);
    int status = 0;
    return sscanf(text, "HTTP/1.1 %d", &status) == 1 ? status : 0;
}

static void test_http_serves_its_callers_table_through_its_hooks(void **state)
{
    static const Route routes[] = {
        {"GET", "/hello/:who", h_hello, "hello", false, 0, ""},
        {"POST", "/secret", h_hello, "secret", true, 1, ""},
    };
    Seen seen = {0};
    HttpConfig hc = {.listen = "127.0.0.1:0",
                     .threads = 2,
                     .max_connections = 16,
                     .connection_timeout_ms = 10000,
                     .request_timeout_ms = 10000,
                     .max_body = 64};
    HttpApp app = {.routes = routes,
                   .n_routes = 2,
                   .ctx = &seen,
                   .vouch = t_vouch,
                   .authorize = t_authorize,
                   .observe = t_observe};
    Http *h = http_new(&hc);
    Err err = {0};
    CHECK(http_start(h, &app, &err) == 0, "the daemon should start on port 0: %s", err.msg);
    int port = http_port(h);
    CHECK(port > 0, "the daemon should say the port it chose, not %d", port);
    char text[2048];

    int st = send_one(port, &seen, "GET /hello/world", "", "", text, sizeof text);
    CHECK(st == 200 && strstr(text, "\r\n\r\nworld"), "GET /hello/world: %d '%s'", st, text);
    CHECK(atomic_load(&seen.last_route) == 0 && atomic_load(&seen.last_status) == 200,
          "observe should see route 0 answered 200, not route %d, %d",
          atomic_load(&seen.last_route), atomic_load(&seen.last_status));
    CHECK(!atomic_load(&seen.vouched), "a request without the node header was vouched for");

    st = send_one(port, &seen, "GET /nowhere", "", "", text, sizeof text);
    CHECK(st == 404 && strstr(text, "no-route"), "GET /nowhere: %d '%s'", st, text);
    CHECK(atomic_load(&seen.last_route) == -1 && atomic_load(&seen.last_status) == 404,
          "observe should see no route (-1) answered 404, not route %d, %d",
          atomic_load(&seen.last_route), atomic_load(&seen.last_status));

    st = send_one(port, &seen, "PUT /secret", "", "", text, sizeof text);
    CHECK(st == 405 && strstr(text, "Allow: POST"), "PUT /secret: %d '%s'", st, text);
    st = send_one(port, &seen, "POST /secret", "", "{}", text, sizeof text);
    CHECK(st == 401 && strstr(text, "say who you are") && strstr(text, "realm=\"test\""),
          "POST /secret without a token: authorize should refuse it, %d '%s'", st, text);
    CHECK(atomic_load(&seen.last_route) == 1, "a refused request still counts for its route");

    /* A body over max_body; the same body from a node that vouch trusts (up
     * to HTTP_VOUCHED_BODY times larger); a node it refuses. */
    char big[160];
    snprintf(big, sizeof big, "{\"x\":\"%0*d\"}", 100, 0);
    st = send_one(port, &seen, "POST /secret", "Authorization: Bearer t\r\n", big, text,
                  sizeof text);
    CHECK(st == 413, "%zu bytes over max_body 64 should be 413, not %d '%s'", strlen(big), st,
          text);
    st = send_one(port, &seen, "POST /secret", "Authorization: Bearer t\r\nX-Test-Node: friend\r\n",
                  big, text, sizeof text);
    CHECK(st == 200 && strstr(text, "108 bytes") && atomic_load(&seen.vouched),
          "a vouched request may send up to %d bytes: %d '%s'", 64 * HTTP_VOUCHED_BODY, st, text);
    st = send_one(port, &seen, "GET /hello/x", "X-Test-Node: stranger\r\n", "", text, sizeof text);
    CHECK(st == 403 && strstr(text, "not a friend"), "vouch refused: %d '%s'", st, text);
    http_stop(h);
    http_free(h);
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
                        .leader_terms = {7},
                        .database_up = true,
                        .open_counts = &open,
                        .mgrs = NULL};
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
    Api *a = api_new(&(ApiConfig){.node_id = "test-node", .cluster_secret = ""}, &(ApiParts){0});
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
        cmocka_unit_test(test_http_serves_its_callers_table_through_its_hooks),
        cmocka_unit_test(test_routes_are_distinct_and_fit_the_metrics),
        cmocka_unit_test(test_metrics_render_names_routes_and_the_unmatched),
        cmocka_unit_test(test_api_state_lives_and_dies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
