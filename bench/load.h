/* load: submissions of one job per POST /work, with ids of our own so that a
 * result on /results can be matched to its submission, and what became of each
 * job: when it was sent, answered and seen finished. Submissions go out at a
 * fixed rate whatever the answers (open loop) or as answers come back (closed
 * loop, a fixed number of clients). */
#ifndef WORKD_BENCH_LOAD_H
#define WORKD_BENCH_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mc.h"
#include "results.h"

typedef struct Job {
    int64_t sent_us;      /* mono_us() just before the call */
    int64_t answered_us;  /* when its answer (or failure) arrived, 0 until then */
    int64_t result_us;    /* when its result frame arrived, 0 until then */
    int64_t result_at_ms; /* the result event's server time */
    long status;          /* HTTP status of the answer, 0: none (transport failure) */
} Job;

typedef struct Load {
    Mc *mc;
    char url[512];   /* SERVER/work */
    char prefix[24]; /* every id is PREFIX + its index */
    Job *jobs;       /* by index, max_jobs of them */
    size_t n, max_jobs;
    size_t answered, accepted, failed, results, stray_results;
    int64_t call_timeout_ms;
    /* closed loop: every answer starts the next submission until `limit` */
    size_t limit;
    bool chain;
    bool anonymous; /* submit without ids (the server names the jobs): no result matching */
    /* job i goes to queues[i % n_queues] (n_queues 0: no queue named); borrowed, set by the
     * caller after load_init and kept alive as long as the Load */
    char *const *queues;
    size_t n_queues;
} Load;

void load_init(Load *l, Mc *m, const char *server, size_t max_jobs, int64_t call_timeout_ms);
void load_free(Load *l);

/* Submits the next job (index l->n) unless max_jobs were; returns false then. */
bool load_submit(Load *l);

/* Sends at `rate` per second on schedule from start_us until end_us (mono_us).
 * hook (may be NULL) runs every loop turn with the time, e.g. to kill a node
 * at a given moment. */
void load_open_loop(Load *l, double rate, int64_t start_us, int64_t end_us,
                    void (*hook)(Load *l, int64_t now_us, void *ud), void *ud);

/* Runs `clients` submissions at once, each answer starting the next, until
 * `total` were answered. */
void load_closed_loop(Load *l, size_t clients, size_t total);

/* A ResultsFn (ud: the Load) that matches results to jobs. */
void load_on_result(const ResultEv *ev, void *ud);

/* Runs the loop until every accepted job has its result or timeout_ms passed;
 * returns how many accepted jobs still have none. */
size_t load_wait_results(Load *l, int64_t timeout_ms);

#endif
