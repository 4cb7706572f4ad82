/* drain: N jobs submitted in bulk with no worker running, then timed while the
 * workers (started by the caller once the jobs are in) run them all. The clock
 * starts at the server's first `started` event (the first job submitted is the
 * first handed out: equal priorities go in order of acceptance) and stops when
 * the last result arrives on /results. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc.h"
#include "phases.h"
#include "results.h"

static struct {
    char *server, *queues;
    int64_t jobs, batch, timeout_ms;
    bool sync;
} o;

static const OptSpec options[] = {
    {"server", OPT_STRING, &o.server, "http://127.0.0.1:8080",
     "node to submit to and follow /results on", 0, 0},
    {"jobs", OPT_INT, &o.jobs, "20000", "jobs to submit and drain", 1, 10000000},
    {"batch", OPT_INT, &o.batch, "1000", "jobs per bulk POST /work", 1, 100000},
    {"queues", OPT_STRING, &o.queues, "",
     "queues to spread the jobs over, comma-separated: each gets an equal share, submitted in "
     "batches of one queue taken in turn (none: no queue named, the default queue)",
     0, 0},
    {"timeout", OPT_DURATION, &o.timeout_ms, "120s", "give up when the drain takes longer", 1000,
     3600000},
    {"sync", OPT_BOOL, &o.sync, "false",
     "after submitting, print 'submitted' and read 'go WALL_MS' (when the workers were started) "
     "from stdin",
     0, 0},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] =
    "usage: workd-bench drain [options]\n\n"
    "Bulk-submits --jobs no-op jobs, then waits until /results has shown all of them.\n"
    "Start the workers after the submission (see --sync).";

typedef struct Drain {
    char prefix[24];
    unsigned char *seen;
    size_t n, done, others;
    int64_t last_wall_us, last_at_ms;
} Drain;

static void on_result(const ResultEv *ev, void *ud)
{
    Drain *d = ud;
    size_t plen = strlen(d->prefix);
    char *end;
    unsigned long long i =
        strncmp(ev->id, d->prefix, plen) ? d->n : strtoull(ev->id + plen, &end, 10);
    if (i >= d->n || d->seen[i]) {
        d->others++;
        return;
    }
    d->seen[i] = 1;
    d->done++;
    d->last_wall_us = ev->recv_wall_us;
    if (ev->at_ms > d->last_at_ms)
        d->last_at_ms = ev->at_ms;
}

/* The server's time of the `started` event of work id, or -1. */
static int64_t started_at(Mc *m, const char *server, const char *id)
{
    char url[600], *body = NULL;
    snprintf(url, sizeof url, "%s/work/%s/events", server, id);
    Err err = {0};
    long st = mc_call(m, "GET", url, NULL, 10000, &body, &err);
    int64_t at = -1;
    json_t *j = st == 200 ? json_loads(body, 0, NULL) : NULL;
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(j, "events"), i, ev)
    {
        const char *type = json_string_value(json_object_get(ev, "type"));
        const char *t = json_string_value(json_object_get(ev, "at"));
        if (type && t && !strcmp(type, "started") && time_parse(t, &at, NULL) == 0)
            break;
        at = -1;
    }
    json_decref(j);
    free(body);
    return at;
}

/* Submits d->n jobs, ids PREFIX0.. in the order sent. With queues, queue q
 * gets n / nq jobs (the first n % nq one more), each batch of one queue (a
 * bulk submission may not span shards), the queues taken in turn. */
static int submit_all(Mc *m, Drain *d, char *const *queues)
{
    char url[600];
    snprintf(url, sizeof url, "%s/work", o.server);
    size_t nq = strv_len(queues), slots = nq ? nq : 1;
    size_t *left = xcalloc(slots, sizeof *left);
    for (size_t q = 0; q < slots; q++)
        left[q] = d->n / slots + (q < d->n % slots);
    SBuf b;
    sbuf_init(&b);
    int rc = -1;
    for (size_t i = 0, q = 0; i < d->n; q = (q + 1) % slots) {
        if (!left[q])
            continue;
        sbuf_reset(&b);
        sbuf_puts(&b, "[");
        for (size_t k = 0; k < (size_t)o.batch && left[q]; k++, i++, left[q]--) {
            sbuf_printf(&b, "%s{\"id\":\"%s%zu\",\"payload\":%zu", k ? "," : "", d->prefix, i, i);
            if (nq)
                sbuf_printf(&b, ",\"queue\":\"%s\"", queues[q]);
            sbuf_puts(&b, "}");
        }
        sbuf_puts(&b, "]");
        Err err = {0};
        char *body = NULL;
        long st = mc_call(m, "POST", url, b.data, 60000, &body, &err);
        if (st != 202) {
            fprintf(stderr, "workd-bench drain: bulk submission answered %ld: %.300s\n", st,
                    st ? body : err.msg);
            free(body);
            goto out;
        }
        free(body);
    }
    rc = 0;
out:
    sbuf_free(&b);
    free(left);
    return rc;
}

int bench_drain(int argc, char **argv)
{
    int prc = bench_options(synopsis, options, NOPT, argc, argv);
    if (prc != 0) {
        config_free(options, NOPT);
        return prc > 0 ? 0 : 2;
    }
    int rc = 1;
    Mc *m = mc_new(64);
    Drain d = {.n = (size_t)o.jobs};
    char rnd[37];
    id_generate(rnd);
    snprintf(d.prefix, sizeof d.prefix, "d%.8s-", rnd);
    d.seen = xcalloc(d.n, 1);
    char **queues = strv_split(o.queues);
    Results res;
    results_start(&res, m, o.server, on_result, &d);
    Err err = {0};
    if (results_wait_open(&res, 10000, &err) != 0) {
        fprintf(stderr, "workd-bench drain: %s\n", err.msg);
        goto out;
    }
    int64_t t0 = mono_us();
    if (submit_all(m, &d, queues) != 0)
        goto out;
    double submit_s = (double)(mono_us() - t0) / 1e6;
    fprintf(stderr, "workd-bench drain: %zu jobs submitted in %.2f s\n", d.n, submit_s);
    int64_t go_ms = -1;
    if (o.sync) {
        printf("submitted jobs=%zu\n", d.n);
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin) || sscanf(line, "go %lld", (long long *)&go_ms) != 1) {
            fprintf(stderr, "workd-bench drain: expected 'go WALL_MS' on stdin\n");
            goto out;
        }
    }
    int64_t deadline = mono_us() + o.timeout_ms * 1000;
    while (d.done < d.n && mono_us() < deadline)
        mc_run(m, 50);
    if (d.done < d.n) {
        printf("bench=drain jobs=%zu status=TIMEOUT done=%zu\n", d.n, d.done);
        goto out;
    }
    char first[64];
    snprintf(first, sizeof first, "%s0", d.prefix);
    int64_t start_ms = started_at(m, o.server, first);
    if (start_ms < 0) {
        fprintf(stderr, "workd-bench drain: no started event for %s\n", first);
        goto out;
    }
    double secs = (double)d.last_wall_us / 1e6 - (double)start_ms / 1e3;
    printf("bench=drain jobs=%zu seconds=%.3f jobs_per_s=%.0f", d.n, secs, (double)d.n / secs);
    if (go_ms >= 0)
        printf(" from_workers_start_s=%.3f", (double)d.last_wall_us / 1e6 - (double)go_ms / 1e3);
    printf(" server_span_s=%.3f submit_s=%.3f\n", (double)(d.last_at_ms - start_ms) / 1e3,
           submit_s);
    rc = 0;
out:
    fflush(stdout);
    results_stop(&res);
    mc_free(m);
    free(d.seen);
    strv_free(queues);
    config_free(options, NOPT);
    return rc;
}
