/* failover: submissions at a fixed rate through a standby node, whose /results
 * is followed, while the leader is killed with SIGKILL. Two gaps, from the
 * kill: until a submission sent after it is accepted (accept_gap_ms), and
 * until a result committed by the new leader arrives (flow_gap_ms: the first
 * result frame whose event time is after the kill). Every accepted job must
 * still get its result. */
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include "load.h"
#include "phases.h"
#include "results.h"
#include "stats.h"

static struct {
    char *server;
    int64_t kill_pid, rate, before_ms, after_ms, settle_ms;
} o;

static const OptSpec options[] = {
    {"server", OPT_STRING, &o.server, "http://127.0.0.1:8081",
     "the standby node: submissions and /results go there", 0, 0},
    {"kill-pid", OPT_INT, &o.kill_pid, "0", "process id of the leader to kill -9", 0, 4194304},
    {"rate", OPT_INT, &o.rate, "500", "submissions per second (open loop)", 1, 100000},
    {"before", OPT_DURATION, &o.before_ms, "3s", "load before the kill", 0, 600000},
    {"after", OPT_DURATION, &o.after_ms, "5s", "load after the kill", 100, 600000},
    {"settle", OPT_DURATION, &o.settle_ms, "30s", "then wait this long at most for every result", 0,
     600000},
};
#define NOPT (sizeof options / sizeof options[0])

static const char synopsis[] = "usage: workd-bench failover --kill-pid PID [options]\n\n"
                               "Kills the leader (PID) under load and measures how long until "
                               "submissions are accepted and results flow again.";

typedef struct Failover {
    Load l;
    int64_t kill_at_us; /* when to kill */
    int64_t kill_us, kill_wall_ms, flow_us;
    bool killed;
} Failover;

static void hook(Load *l, int64_t now, void *ud)
{
    Failover *f = ud;
    if (f->killed || now < f->kill_at_us)
        return;
    f->killed = true;
    f->kill_wall_ms = wall_us() / 1000;
    f->kill_us = mono_us();
    if (kill((pid_t)o.kill_pid, SIGKILL) != 0)
        perror("workd-bench failover: kill");
}

static void on_result(const ResultEv *ev, void *ud)
{
    Failover *f = ud;
    load_on_result(ev, &f->l);
    if (f->killed && !f->flow_us && ev->at_ms > f->kill_wall_ms)
        f->flow_us = ev->recv_us;
}

int bench_failover(int argc, char **argv)
{
    int prc = bench_options(synopsis, options, NOPT, argc, argv);
    if (prc == 0 && o.kill_pid <= 1) {
        fprintf(stderr, "workd-bench failover: --kill-pid is required\n");
        prc = -1;
    }
    if (prc != 0) {
        config_free(options, NOPT);
        return prc > 0 ? 0 : 2;
    }
    int rc = 1;
    Samples sub;
    samples_init(&sub);
    Mc *m = mc_new(4096);
    Failover f = {0};
    size_t total = (size_t)((o.before_ms + o.after_ms) * o.rate / 1000) + 16;
    load_init(&f.l, m, o.server, total, 60000);
    Results res;
    results_start(&res, m, o.server, on_result, &f);
    Err err = {0};
    if (results_wait_open(&res, 10000, &err) != 0) {
        fprintf(stderr, "workd-bench failover: %s\n", err.msg);
        goto out;
    }
    int64_t t0 = mono_us();
    f.kill_at_us = t0 + o.before_ms * 1000;
    load_open_loop(&f.l, (double)o.rate, t0, f.kill_at_us + o.after_ms * 1000, hook, &f);
    size_t missing = load_wait_results(&f.l, o.settle_ms);
    int64_t accept_us = 0;
    for (size_t i = 0; i < f.l.n; i++) {
        const Job *j = &f.l.jobs[i];
        if (j->answered_us)
            samples_add(&sub, (double)(j->answered_us - j->sent_us) / 1e3);
        if (j->status == 202 && j->sent_us >= f.kill_us &&
            (!accept_us || j->answered_us < accept_us))
            accept_us = j->answered_us;
    }
    if (!accept_us || !f.flow_us) {
        printf("bench=failover status=FAILED accepted_after_kill=%s flowed_after_kill=%s "
               "accepted=%zu results=%zu\n",
               accept_us ? "yes" : "no", f.flow_us ? "yes" : "no", f.l.accepted, f.l.results);
        goto out;
    }
    printf("bench=failover accept_gap_ms=%.0f flow_gap_ms=%.0f rate=%lld submitted=%zu "
           "accepted=%zu lost=%zu errors=%zu submit_p50_ms=%.2f submit_max_ms=%.0f\n",
           (double)(accept_us - f.kill_us) / 1e3, (double)(f.flow_us - f.kill_us) / 1e3,
           (long long)o.rate, f.l.n, f.l.accepted, missing, f.l.failed, samples_pct(&sub, 50),
           samples_max(&sub));
    rc = missing || f.l.failed ? 1 : 0;
out:
    fflush(stdout);
    samples_free(&sub);
    results_stop(&res);
    load_free(&f.l);
    mc_free(m);
    config_free(options, NOPT);
    return rc;
}
