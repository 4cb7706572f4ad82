/* idle: what one server node costs while it holds many idle result streams
 * and long-polls. Opens --streams GET /results and --longpolls
 * POST /workers/{id}/pull (one worker id each, renewed when a wait runs out),
 * lets them settle, then reads the node's CPU time (utime + stime from
 * /proc/PID/stat) over --seconds and its resident memory (VmRSS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc.h"
#include "phases.h"

static struct {
    char *server;
    int64_t pid, streams, longpolls, seconds_ms, wait_s, settle_ms;
} o;

static const OptSpec options[] = {
    {"server", OPT_STRING, &o.server, "http://127.0.0.1:8080", "the node to hold connections on", 0,
     0},
    {"pid", OPT_INT, &o.pid, "0", "its process id, for /proc", 0, 4194304},
    {"streams", OPT_INT, &o.streams, "1000", "idle GET /results streams", 0, 100000},
    {"longpolls", OPT_INT, &o.longpolls, "1000", "idle pulls, each from its own worker id", 0,
     100000},
    {"seconds", OPT_DURATION, &o.seconds_ms, "30s", "how long to measure", 1000, 3600000},
    {"wait", OPT_INT, &o.wait_s, "60", "the wait each pull asks for, in seconds", 1, 3600},
    {"settle", OPT_DURATION, &o.settle_ms, "3s", "pause between opening and measuring", 0, 600000},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] = "usage: workd-bench idle --pid PID [options]\n\n"
                               "Holds idle streams and long-polls on one node and reports its CPU "
                               "and memory.";

typedef struct Idle {
    char prefix[24];
    size_t streams_open, streams_ended, repolls, pull_errors;
    bool stopping;
} Idle;

static bool on_stream_data(McReq *q, const char *p, size_t n)
{
    Idle *d = q->ud;
    if (!q->tag && mc_status(q) == 200) {
        q->tag = 1;
        d->streams_open++;
    }
    return true;
}

static void on_stream_done(McReq *q)
{
    Idle *d = q->ud;
    d->streams_ended++;
}

static void start_pull(Mc *m, Idle *d, int64_t i);

static void on_pull(McReq *q)
{
    Idle *d = q->ud;
    if (q->result != CURLE_OK || q->status != 200) {
        if (d->pull_errors++ < 5)
            fprintf(stderr, "workd-bench idle: pull answered %ld (%s) %.200s\n", q->status,
                    curl_easy_strerror(q->result), q->body.data ? q->body.data : "");
        return;
    }
    d->repolls++;
    if (!d->stopping)
        start_pull(q->mc, d, q->tag);
}

static void start_pull(Mc *m, Idle *d, int64_t i)
{
    char url[600], body[128];
    snprintf(url, sizeof url, "%s/workers/%s%lld/pull", o.server, d->prefix, (long long)i);
    snprintf(body, sizeof body, "{\"instance\":\"%s%lld\",\"max\":1,\"wait\":%lld}", d->prefix,
             (long long)i, (long long)o.wait_s);
    McReq *q = mc_start(m, "POST", url, body, (o.wait_s + 60) * 1000, on_pull, d);
    q->tag = i;
}

/* utime + stime of pid in clock ticks, or -1. */
static long long cpu_ticks(long long pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    /* After "(comm)": state is field 3, utime field 14, stime field 15. */
    unsigned long long ut, st;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (long long)(ut + st);
}

/* VmRSS of pid in kB, or -1. */
static long long rss_kb(long long pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%lld/status", pid);
    FILE *f = fopen(path, "r");
    long long kb = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static void run_for(Mc *m, int64_t ms)
{
    int64_t end = mono_us() + ms * 1000;
    while (mono_us() < end)
        mc_run(m, 100);
}

int bench_idle(int argc, char **argv)
{
    int prc = bench_options(synopsis, options, NOPT, argc, argv);
    if (prc == 0 && o.pid <= 1) {
        fprintf(stderr, "workd-bench idle: --pid is required\n");
        prc = -1;
    }
    if (prc != 0) {
        config_free(options, NOPT);
        return prc > 0 ? 0 : 2;
    }
    int rc = 1;
    Mc *m = mc_new((size_t)(o.streams + o.longpolls) + 16);
    Idle d = {0};
    char rnd[37];
    id_generate(rnd);
    snprintf(d.prefix, sizeof d.prefix, "idle-%.8s-", rnd);
    char url[600];
    snprintf(url, sizeof url, "%s/results", o.server);
    /* Open in steps of 100, so that the listen backlog never overflows. */
    for (int64_t i = 0; i < o.streams || i < o.longpolls; i += 100) {
        for (int64_t k = i; k < i + 100; k++) {
            if (k < o.streams)
                mc_stream(m, url, on_stream_data, on_stream_done, &d);
            if (k < o.longpolls)
                start_pull(m, &d, k);
        }
        run_for(m, 50);
    }
    int64_t deadline = mono_us() + 30000000;
    while (d.streams_open < (size_t)o.streams && mono_us() < deadline)
        mc_run(m, 100);
    if (d.streams_open < (size_t)o.streams || d.streams_ended || d.pull_errors) {
        fprintf(stderr, "workd-bench idle: %zu of %lld streams open, %zu ended, %zu pull errors\n",
                d.streams_open, (long long)o.streams, d.streams_ended, d.pull_errors);
        goto out;
    }
    run_for(m, o.settle_ms);
    long long c0 = cpu_ticks(o.pid);
    int64_t t0 = mono_us();
    size_t repolls0 = d.repolls;
    run_for(m, o.seconds_ms);
    long long c1 = cpu_ticks(o.pid);
    double secs = (double)(mono_us() - t0) / 1e6;
    long long rss = rss_kb(o.pid);
    if (c0 < 0 || c1 < 0 || rss < 0) {
        fprintf(stderr, "workd-bench idle: cannot read /proc/%lld\n", (long long)o.pid);
        goto out;
    }
    double cpu_s = (double)(c1 - c0) / (double)sysconf(_SC_CLK_TCK);
    printf("bench=idle streams=%lld longpolls=%lld seconds=%.0f cpu_pct=%.2f rss_mb=%.1f "
           "repolls=%zu streams_lost=%zu pull_errors=%zu\n",
           (long long)o.streams, (long long)o.longpolls, secs, 100.0 * cpu_s / secs,
           (double)rss / 1024.0, d.repolls - repolls0, d.streams_ended, d.pull_errors);
    rc = d.streams_ended || d.pull_errors ? 1 : 0;
out:
    fflush(stdout);
    d.stopping = true;
    mc_free(m);
    config_free(options, NOPT);
    return rc;
}
