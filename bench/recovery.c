/* recovery: how long a starting node takes to serve as leader over a large
 * history. From the moment the caller started the server process (--t0-ms),
 * it tries a submission every 10 ms and GET /readyz every 10 ms, and reports
 * when the first submission was accepted and when the node said it leads,
 * with the recovery time the node logged ("recovered in N ms"). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc.h"
#include "phases.h"

static struct {
    char *server, *log;
    int64_t t0_ms, timeout_ms, open, finished;
} o;

static const OptSpec options[] = {
    {"server", OPT_STRING, &o.server, "http://127.0.0.1:8080", "the starting node", 0, 0},
    {"t0-ms", OPT_INT, &o.t0_ms, "0", "wall-clock ms when its process was started (0: now)", 0,
     1LL << 50},
    {"log", OPT_STRING, &o.log, "", "its log, to read 'recovered in N ms' from", 0, 0},
    {"timeout", OPT_DURATION, &o.timeout_ms, "60s", "give up after this", 1000, 600000},
    {"open", OPT_INT, &o.open, "0", "open work loaded (only printed)", 0, 1LL << 40},
    {"finished", OPT_INT, &o.finished, "0", "finished work loaded (only printed)", 0, 1LL << 40},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] = "usage: workd-bench recovery [options]\n\n"
                               "Times a starting node until it accepts work and reports itself "
                               "leader.";

typedef struct Probe {
    char work_url[600], ready_url[600];
    int64_t accepted_wall_us, ready_wall_us;
    size_t posts_inflight;
    bool ready_inflight;
} Probe;

static void on_post(McReq *q)
{
    Probe *p = q->ud;
    p->posts_inflight--;
    if (q->result == CURLE_OK && q->status == 202 && !p->accepted_wall_us)
        p->accepted_wall_us = wall_us() - (mono_us() - q->done_us);
}

static void on_ready(McReq *q)
{
    Probe *p = q->ud;
    p->ready_inflight = false;
    if (q->result != CURLE_OK || q->status != 200 || p->ready_wall_us)
        return;
    json_t *j = json_loads(q->body.data ? q->body.data : "", 0, NULL);
    if (json_is_true(json_object_get(j, "is_leader")))
        p->ready_wall_us = wall_us() - (mono_us() - q->done_us);
    json_decref(j);
}

/* The N of "recovered in N ms" in the log, -1 if absent; *open_out gets the
 * open work count of the same line. */
static long long logged_recovery(const char *path, long long *open_out)
{
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    long long ms = -1;
    *open_out = -1;
    if (!f)
        return -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        const char *e = strstr(line, "elected leader: term ");
        const char *r = strstr(line, " recovered in ");
        if (!e || !r)
            continue;
        long long term, open;
        if (sscanf(e, "elected leader: term %lld, %lld open", &term, &open) == 2)
            *open_out = open;
        ms = atoll(r + strlen(" recovered in "));
    }
    fclose(f);
    return ms;
}

int bench_recovery(int argc, char **argv)
{
    int prc = bench_options(synopsis, options, NOPT, argc, argv);
    if (prc != 0) {
        config_free(options, NOPT);
        return prc > 0 ? 0 : 2;
    }
    int64_t t0_us = o.t0_ms ? o.t0_ms * 1000 : wall_us();
    Mc *m = mc_new(64);
    Probe p = {0};
    snprintf(p.work_url, sizeof p.work_url, "%s/work", o.server);
    snprintf(p.ready_url, sizeof p.ready_url, "%s/readyz", o.server);
    int64_t deadline = mono_us() + o.timeout_ms * 1000, next = 0;
    while ((!p.accepted_wall_us || !p.ready_wall_us) && mono_us() < deadline) {
        int64_t now = mono_us();
        if (now >= next) {
            next = now + 10000;
            if (!p.accepted_wall_us && p.posts_inflight < 20) {
                p.posts_inflight++;
                mc_start(m, "POST", p.work_url, "{\"payload\":0}", 5000, on_post, &p);
            }
            if (!p.ready_wall_us && !p.ready_inflight) {
                p.ready_inflight = true;
                mc_start(m, "GET", p.ready_url, NULL, 1000, on_ready, &p);
            }
        }
        mc_run(m, 2);
    }
    int rc = 1;
    if (!p.accepted_wall_us || !p.ready_wall_us) {
        printf("bench=recovery open=%lld finished=%lld status=TIMEOUT\n", (long long)o.open,
               (long long)o.finished);
    } else {
        long long open;
        long long rec = logged_recovery(o.log, &open);
        printf("bench=recovery open=%lld finished=%lld seconds=%.3f ready_s=%.3f recovered_ms=%lld "
               "recovered_open=%lld\n",
               (long long)o.open, (long long)o.finished, (double)(p.accepted_wall_us - t0_us) / 1e6,
               (double)(p.ready_wall_us - t0_us) / 1e6, rec, open);
        rc = 0;
    }
    fflush(stdout);
    mc_free(m);
    config_free(options, NOPT);
    return rc;
}
