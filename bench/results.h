/* results: follows GET /results (server-sent events) over an Mc and hands over
 * each finished work item with the moment its frame arrived. A stream that
 * ends is reopened at once after the last event id seen (?after=), so nothing is
 * missed or seen twice. */
#ifndef WORKD_BENCH_RESULTS_H
#define WORKD_BENCH_RESULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "mc.h"

typedef struct ResultEv {
    int64_t seq;
    const char *id;     /* valid during the callback only */
    const char *status; /* "completed", "dead" or "cancelled" */
    int64_t at_ms;   /* the event's time on the server's clock (ms since the epoch), -1 if absent */
    int64_t recv_us; /* mono_us() when its frame arrived */
    int64_t recv_wall_us;
} ResultEv;

typedef void (*ResultsFn)(const ResultEv *ev, void *ud);

typedef struct Results {
    Mc *mc;
    char url[512];
    ResultsFn fn;
    void *ud;
    McReq *req; /* the stream in flight, NULL when none */
    SBuf buf;   /* bytes of an unfinished frame */
    /* the id of the last result frame, "" until one came: where a reopened stream
     * resumes (?after=). An id is a cursor: the event's seq in a cluster of one
     * shard, each shard's last seq joined by '.' in one of several (up to 64). */
    char cursor[64 * 20 + 1];
    bool open; /* the stream answered 200 and sent its first bytes */
    bool stopping;
    size_t events, reconnects;
    int fails; /* reopenings in a row that never got an answer */
} Results;

/* Starts following server/results from now on (the server's newest seq). fn
 * is called from mc_run() for every event. */
void results_start(Results *r, Mc *m, const char *server, ResultsFn fn, void *ud);
/* Runs m until the stream is open; -1 (err says why) after timeout_ms. */
int results_wait_open(Results *r, int64_t timeout_ms, Err *err) WARN_UNUSED;
/* Closes the stream (no more callbacks) and frees what r holds. */
void results_stop(Results *r);

#endif
