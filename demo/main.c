/* workd-demo: the sample's producer and consumer, as plain clients of the
 * public API. `produce` submits a number at random intervals and resubmits the
 * same id with backoff until it is accepted; `consume` follows /results and
 * resumes with Last-Event-ID after a disconnect. Both know a list of servers and
 * move to the next when one cannot be reached; both stop with an error when the
 * server refuses their token, which no retry can mend. */
#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "httpc.h"
#include "log.h"
#include "servers.h"
#include "shard.h"
#include "util.h"

static atomic_bool stopping;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stopping, true);
}

/* Sleeps up to ms, waking early when asked to stop. */
static void nap(int64_t ms)
{
    while (ms > 0 && !atomic_load(&stopping)) {
        int64_t step = ms < 100 ? ms : 100;
        sleep_ms(step);
        ms -= step;
    }
}

static struct {
    char *server, *token, *log_level, *log_format;
    int64_t interval_ms, count;
} cfg;
static Servers *servers; /* from cfg.server */

static const OptSpec options[] = {
    {"server", OPT_LIST, &cfg.server, "http://127.0.0.1:8080",
     "workd server or load balancer URL; several (repeated or comma-separated) are tried in "
     "turn when one cannot be reached",
     0, 0},
    {"token", OPT_STRING, &cfg.token, "", "bearer token to send, if the server wants one", 0, 0},
    {"interval", OPT_DURATION, &cfg.interval_ms, "1s", "produce: mean time between submissions", 0,
     3600000},
    {"count", OPT_INT, &cfg.count, "0", "produce: stop after this many accepted (0: never)", 0,
     1000000000},
    {"log-level", OPT_STRING, &cfg.log_level, "info", "debug, info, warn or error", 0, 0},
    {"log-format", OPT_STRING, &cfg.log_format, "text", "text or json", 0, 0},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] =
    "usage: workd-demo produce|consume [options]\n\n"
    "  produce  submit a number at random intervals (the sample's FrontEnd)\n"
    "  consume  print every result from GET /results, resuming after disconnects";

/* The server at pos gave no answer: the next request goes to the next one. */
static void unreachable(size_t pos)
{
    char next[SERVERS_URL_MAX];
    if (servers_unreachable(servers, pos, next, sizeof next))
        log_info("trying server %s", next);
}

/* A refusal no retry can mend: a missing or wrong token (401), or one without
 * the client scope (403). Says so; the caller then exits with an error. */
static bool refused_for_good(long status)
{
    if (status != 401 && status != 403)
        return false;
    log_error("HTTP %ld: the token (--token or WORKD_TOKEN) %s; stopping", status,
              status == 403 ? "lacks the client scope" : "is missing or wrong");
    return true;
}

/* ---- produce ---- */

static int produce(void)
{
    HttpClient *c = httpc_new(cfg.token);
    char boot[37];
    id_generate(boot);
    boot[8] = '\0';
    long long accepted = 0;
    int rc = 0;
    for (long long i = 1; !atomic_load(&stopping) && rc == 0; i++) {
        int n = 1 + (int)(rand_unit() * 20);
        char id[64];
        snprintf(id, sizeof id, "demo-%s-%lld", boot, i);
        char body[160];
        snprintf(body, sizeof body, "{\"id\":\"%s\",\"payload\":%d}", id, n);
        log_info("produced work %s: %d", id, n);
        int64_t backoff = 200;
        while (!atomic_load(&stopping)) {
            HttpResp r;
            Err err = {0};
            char url[SERVERS_URL_MAX];
            size_t pos = servers_url(servers, "/work", url, sizeof url);
            if (httpc_request(c, "POST", url, body, 15000, &r, &err) == 0 && r.status == 202) {
                log_info("accepted work %s", id);
                httpc_resp_free(&r);
                accepted++;
                break;
            }
            if (refused_for_good(r.status)) {
                httpc_resp_free(&r);
                rc = 1;
                break;
            }
            if (r.status == 0)
                unreachable(pos);
            int64_t wait = r.retry_after_ms > 0 ? r.retry_after_ms : backoff;
            if (r.status)
                log_warn("work %s not accepted (HTTP %ld), resubmitting in %lld ms", id, r.status,
                         (long long)wait);
            else
                log_warn("work %s not accepted (%s), resubmitting in %lld ms", id, err.msg,
                         (long long)wait);
            httpc_resp_free(&r);
            nap(wait);
            backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
        }
        if (rc != 0 || (cfg.count && accepted >= cfg.count))
            break;
        nap((int64_t)((0.5 + rand_unit()) * (double)cfg.interval_ms));
    }
    httpc_free(c);
    return rc;
}

/* ---- consume ---- */

/* An event id is an opaque cursor, each shard's last seq joined by '.' ("812"
 * with one shard, "812.0.77.1204" with four): at most SHARDS_MAX numbers of
 * 19 digits and their dots, with the NUL. A longer id is ignored. */
#define EVENT_ID_MAX (SHARDS_MAX * 20 + 1)

typedef struct Stream {
    SBuf line;               /* the line being read */
    SBuf data;               /* the event's data lines */
    char id[EVENT_ID_MAX];   /* the event's id */
    char last[EVENT_ID_MAX]; /* the last id handled, for Last-Event-ID, as it came */
} Stream;

static void on_event(Stream *s)
{
    if (s->id[0]) /* also an id with no data: where the stream starts */
        snprintf(s->last, sizeof s->last, "%s", s->id);
    if (s->data.len == 0) {
        s->id[0] = '\0';
        return;
    }
    json_t *ev = json_loads(s->data.data, 0, NULL);
    /* Results carry a status; the stream's first "ready" event does not. */
    if (ev && json_object_get(ev, "status")) {
        const char *status = json_string_value(json_object_get(ev, "status"));
        const char *id = json_string_value(json_object_get(ev, "id"));
        json_t *result = json_object_get(ev, "result");
        char *txt = result ? json_dumps(result, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        if (status && !strcmp(status, "completed"))
            log_info("consumed result of %s: %s", id, txt ? txt : "null");
        else
            log_info("consumed %s work %s: %s", status ? status : "?", id ? id : "?",
                     json_string_value(json_object_get(ev, "error"))
                         ? json_string_value(json_object_get(ev, "error"))
                         : "");
        free(txt);
    }
    json_decref(ev);
    sbuf_reset(&s->data);
    s->id[0] = '\0';
}

static void on_line(Stream *s, const char *l)
{
    if (!*l) {
        on_event(s);
    } else if (!strncmp(l, "data:", 5)) {
        const char *v = l[5] == ' ' ? l + 6 : l + 5;
        if (s->data.len)
            sbuf_puts(&s->data, "\n");
        sbuf_puts(&s->data, v);
    } else if (!strncmp(l, "id:", 3)) {
        const char *v = l[3] == ' ' ? l + 4 : l + 3;
        if (strlen(v) < sizeof s->id) /* never cut: a cut cursor is another place */
            snprintf(s->id, sizeof s->id, "%s", v);
    }
}

static size_t on_bytes(char *p, size_t size, size_t n, void *ud)
{
    Stream *s = ud;
    for (size_t i = 0; i < size * n; i++) {
        if (p[i] == '\n') {
            on_line(s, s->line.data ? s->line.data : "");
            sbuf_reset(&s->line);
        } else if (p[i] != '\r') {
            sbuf_append(&s->line, &p[i], 1);
        }
    }
    return size * n;
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    return atomic_load(&stopping) ? 1 : 0;
}

static int consume(void)
{
    Stream s = {0};
    sbuf_init(&s.line);
    sbuf_init(&s.data);
    CURL *h = curl_easy_init();
    bool was_connected = true;
    int64_t backoff = 200;
    int exit_status = 0;
    while (!atomic_load(&stopping)) {
        char url[SERVERS_URL_MAX];
        size_t pos = servers_url(servers, "/results", url, sizeof url);
        struct curl_slist *hdrs = NULL;
        char hdr[sizeof "Last-Event-ID: " + EVENT_ID_MAX];
        if (s.last[0]) {
            snprintf(hdr, sizeof hdr, "Last-Event-ID: %s", s.last);
            hdrs = curl_slist_append(hdrs, hdr);
        }
        if (cfg.token[0]) {
            char auth[600];
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", cfg.token);
            hdrs = curl_slist_append(hdrs, auth);
        }
        curl_easy_reset(h);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_bytes);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
        /* Keep-alive comments arrive every 15 s; silence for longer is a dead link. */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 45L);
        if (was_connected)
            log_info("following %s%s%s", url, s.last[0] ? " after event " : "", s.last);
        CURLcode rc = curl_easy_perform(h);
        curl_slist_free_all(hdrs);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        sbuf_reset(&s.line);
        sbuf_reset(&s.data);
        if (atomic_load(&stopping))
            break;
        if (refused_for_good(status)) {
            exit_status = 1;
            break;
        }
        if (status == 200)
            backoff = 200;
        else if (status == 0)
            unreachable(pos);
        if (was_connected)
            log_warn("results stream ended (%s), reconnecting",
                     rc == CURLE_OK ? "closed by the server" : curl_easy_strerror(rc));
        was_connected = status == 200;
        nap(backoff);
        backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
    }
    curl_easy_cleanup(h);
    sbuf_free(&s.line);
    sbuf_free(&s.data);
    return exit_status;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "produce") && strcmp(argv[1], "consume"))) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            config_usage(stdout, synopsis, options, NOPT);
            return 0;
        }
        fprintf(stderr, "%s\n", synopsis);
        return 2;
    }
    int cli = config_cli(options, NOPT, argc, argv, 2, "workd-demo", synopsis);
    if (cli != 0) {
        config_free(options, NOPT);
        return cli > 0 ? 0 : 2;
    }
    LogLevel lvl = LOG_INFO;
    if (log_level_parse(cfg.log_level, &lvl) != 0) {
        fprintf(stderr, "workd-demo: --log-level: '%s' is not debug, info, warn or error\n",
                cfg.log_level);
        config_free(options, NOPT);
        return 2;
    }
    Err err = {0};
    servers = servers_new(cfg.server, "--server", &err);
    if (!servers) {
        fprintf(stderr, "workd-demo: %s\n", err.msg);
        config_free(options, NOPT);
        return 2;
    }
    log_setup(argv[1][0] == 'p' ? "producer" : "consumer", "demo", lvl,
              !strcmp(cfg.log_format, "json"));
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    httpc_global_init();
    int rc = argv[1][0] == 'p' ? produce() : consume();
    httpc_global_cleanup();
    servers_free(servers);
    config_free(options, NOPT);
    return rc;
}
