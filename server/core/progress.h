/* progress: what a worker's progress report for an attempt becomes (an event
 * or a refusal), and the per-attempt budgets that bound it. Pure: no I/O, no
 * clock (time is a parameter). Owned by the manager thread. */
#ifndef WORKD_PROGRESS_H
#define WORKD_PROGRESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "workstate.h"

/* Per attempt: at most `rate` updates a second (a token bucket holding one
 * second's worth, full when the attempt sends its first update) and at most
 * max_bytes of messages and output in all. Per worker id, at most worker_rate
 * updates a second over all its attempts, and over the cluster total_rate:
 * each update is an event in the log, so these bound what progress can cost
 * everyone else (0: no such limit). */
typedef struct ProgressLimits {
    int rate;
    int64_t max_bytes;
    int worker_rate;
    int total_rate;
} ProgressLimits;

/* One update, as the HTTP layer parsed it. Borrowed strings. */
typedef struct ProgressMsg {
    const char *work_id;
    int attempt;
    const char *worker_id, *instance;
    bool claim;        /* may act for worker_id without naming its instance */
    bool has_fraction; /* fraction in [0, 1] */
    double fraction;
    const char *message; /* NULL: keep the last one */
    const char *output;  /* a chunk of partial output; NULL: none */
} ProgressMsg;

/* An update of a worker's progress report (MC_PROGRESS), as the HTTP layer
 * parsed it (owned strings), and once the manager has taken it, its answer:
 * status 200 and the seq of its event, or the refusal in err. */
typedef struct ProgressUpdate {
    char *work_id;
    int attempt;
    bool has_fraction; /* fraction in [0, 1] */
    double fraction;
    char *message; /* NULL: keep the last one */
    char *output;  /* a chunk of partial output; NULL: none */
    int status;
    Err err;
    int64_t seq;
} ProgressUpdate;

void progress_updates_free(ProgressUpdate *u, size_t n);

typedef struct ProgressBook ProgressBook;

/* ---- lifetime ---- */
ProgressBook *progress_new(const ProgressLimits *lim);
void progress_free(ProgressBook *b);

/* ---- deciding (the manager thread) ---- */
/* Appends the progress event m produces to out, or refuses it with err: 404
 * not-found (no open work with that id), 409 attempt-superseded (not the
 * running attempt), 409 attempt-not-held (another worker or instance holds
 * it), 429 progress-rate-limited (the attempt's, its worker's or the cluster's
 * rate), 413 progress-too-large (the attempt's byte
 * budget is spent). The event carries the attempt's latest fraction and
 * message even when m leaves one out, so that the last progress event alone
 * says where the attempt is. */
int progress_decide(ProgressBook *b, const WorkState *ws, const ProgressMsg *m, int64_t now,
                    EventList *out, Err *err) WARN_UNUSED;
/* Forgets what the book keeps for work_id (its attempt ended or finished). */
void progress_forget(ProgressBook *b, const char *work_id);
/* Attempts the book holds budgets for. */
size_t progress_count(const ProgressBook *b);

#endif
