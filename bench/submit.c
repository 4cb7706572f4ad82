/* submit: one job per POST /work from a fixed number of concurrent clients
 * (each a keep-alive connection that sends its next job when the answer
 * arrives), no worker running: the acceptance rate and each call's latency.
 * Jobs carry no id unless --ids, as most submissions do. */
#include <stdio.h>

#include "load.h"
#include "phases.h"
#include "stats.h"

static struct {
    char *server, *queues;
    int64_t jobs, clients;
    bool ids;
} o;

static const OptSpec options[] = {
    {"server", OPT_STRING, &o.server, "http://127.0.0.1:8080", "node to submit to", 0, 0},
    {"jobs", OPT_INT, &o.jobs, "5000", "jobs to submit, one per call", 1, 10000000},
    {"clients", OPT_INT, &o.clients, "16", "concurrent clients (connections)", 1, 4096},
    {"ids", OPT_BOOL, &o.ids, "false", "give each job an id of ours (else the server names them)",
     0, 0},
    {"queues", OPT_STRING, &o.queues, "",
     "queues to submit to, comma-separated, job i to the (i mod count)th (none: no queue named)", 0,
     0},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] = "usage: workd-bench submit [options]\n\n"
                               "Submits --jobs jobs, one per POST /work, from --clients "
                               "concurrent keep-alive clients.";

int bench_submit(int argc, char **argv)
{
    int prc = bench_options(synopsis, options, NOPT, argc, argv);
    if (prc != 0) {
        config_free(options, NOPT);
        return prc > 0 ? 0 : 2;
    }
    Mc *m = mc_new((size_t)o.clients * 2);
    Load l;
    load_init(&l, m, o.server, (size_t)o.jobs, 30000);
    l.anonymous = !o.ids;
    char **queues = strv_split(o.queues);
    l.queues = queues;
    l.n_queues = strv_len(queues);
    int64_t t0 = mono_us();
    load_closed_loop(&l, (size_t)o.clients, (size_t)o.jobs);
    double secs = (double)(mono_us() - t0) / 1e6;
    Samples s;
    samples_init(&s);
    for (size_t i = 0; i < l.n; i++)
        if (l.jobs[i].answered_us)
            samples_add(&s, (double)(l.jobs[i].answered_us - l.jobs[i].sent_us) / 1e3);
    printf("bench=submit jobs=%zu clients=%lld seconds=%.3f jobs_per_s=%.0f p50_ms=%.2f "
           "p99_ms=%.2f max_ms=%.2f errors=%zu\n",
           l.accepted, (long long)o.clients, secs, (double)l.accepted / secs, samples_pct(&s, 50),
           samples_pct(&s, 99), samples_max(&s), l.failed);
    fflush(stdout);
    int rc = l.failed ? 1 : 0;
    samples_free(&s);
    load_free(&l);
    strv_free(queues);
    mc_free(m);
    config_free(options, NOPT);
    return rc;
}
