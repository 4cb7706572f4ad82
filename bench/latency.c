/* latency: jobs submitted one per call at a fixed rate, on schedule whatever
 * the answers (open loop), while the workers wait in long-polls; each job's
 * latency runs from just before its POST to the arrival of its result frame on
 * /results (matched by id). */
#include <stdio.h>

#include "load.h"
#include "phases.h"
#include "results.h"
#include "stats.h"

static struct {
    char *server, *queues;
    int64_t rate, seconds_ms, warmup_ms;
} o;

static const OptSpec options[] = {
    {"server", OPT_STRING, &o.server, "http://127.0.0.1:8080",
     "node to submit to and follow /results on", 0, 0},
    {"rate", OPT_INT, &o.rate, "200", "jobs per second", 1, 100000},
    {"seconds", OPT_DURATION, &o.seconds_ms, "10s", "how long to send (all of it measured)", 100,
     3600000},
    {"warmup", OPT_DURATION, &o.warmup_ms, "0s", "send this long first, unmeasured", 0, 600000},
    {"queues", OPT_STRING, &o.queues, "",
     "queues to submit to, comma-separated, job i to the (i mod count)th (none: no queue named)", 0,
     0},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] = "usage: workd-bench latency [options]\n\n"
                               "Submits --rate jobs/s for --seconds (open loop) and measures "
                               "submit-to-result latency on /results.";

int bench_latency(int argc, char **argv)
{
    int prc = bench_options(synopsis, options, NOPT, argc, argv);
    if (prc != 0) {
        config_free(options, NOPT);
        return prc > 0 ? 0 : 2;
    }
    int rc = 1;
    Mc *m = mc_new(256);
    Load l;
    size_t total = (size_t)((o.seconds_ms + o.warmup_ms) * o.rate / 1000) + 16;
    load_init(&l, m, o.server, total, 30000);
    char **queues = strv_split(o.queues);
    l.queues = queues;
    l.n_queues = strv_len(queues);
    Results res;
    results_start(&res, m, o.server, load_on_result, &l);
    Err err = {0};
    if (results_wait_open(&res, 10000, &err) != 0) {
        fprintf(stderr, "workd-bench latency: %s\n", err.msg);
        goto out;
    }
    int64_t t0 = mono_us();
    load_open_loop(&l, (double)o.rate, t0, t0 + o.warmup_ms * 1000, NULL, NULL);
    size_t first = l.n;
    int64_t t1 = mono_us();
    load_open_loop(&l, (double)o.rate, t1, t1 + o.seconds_ms * 1000, NULL, NULL);
    size_t missing = load_wait_results(&l, 10000);
    Samples lat, sub;
    samples_init(&lat);
    samples_init(&sub);
    size_t measured = 0;
    for (size_t i = first; i < l.n; i++) {
        const Job *j = &l.jobs[i];
        measured++;
        if (j->answered_us)
            samples_add(&sub, (double)(j->answered_us - j->sent_us) / 1e3);
        if (j->result_us)
            samples_add(&lat, (double)(j->result_us - j->sent_us) / 1e3);
    }
    printf("bench=latency rate=%lld seconds=%g p50_ms=%.2f p99_ms=%.2f max_ms=%.2f jobs=%zu "
           "missing=%zu errors=%zu submit_p50_ms=%.2f submit_p99_ms=%.2f\n",
           (long long)o.rate, (double)o.seconds_ms / 1000, samples_pct(&lat, 50),
           samples_pct(&lat, 99), samples_max(&lat), measured, missing, l.failed,
           samples_pct(&sub, 50), samples_pct(&sub, 99));
    rc = missing || l.failed ? 1 : 0;
    samples_free(&lat);
    samples_free(&sub);
out:
    fflush(stdout);
    results_stop(&res);
    load_free(&l);
    strv_free(queues);
    mc_free(m);
    config_free(options, NOPT);
    return rc;
}
