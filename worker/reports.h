/* reports: results waiting for the server's acknowledgement. A reporter thread
 * sends them in batches to POST /workers/{id}/reports and keeps each one until
 * the server accepts it (or answers that its attempt was superseded), retrying
 * with capped backoff and jitter: a result is delivered at least once. */
#ifndef WORKD_REPORTS_H
#define WORKD_REPORTS_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "exec.h"
#include "link.h"
#include "util.h" /* SBuf */

/* ---- the reporter ---- */

/* Thread-safe: every function may be called from any thread. */
typedef struct Reporter Reporter;

/* path is the reports path ("/workers/ID/reports"), sent to the server the link
 * uses, token the bearer token (may be NULL) and instance this worker
 * process's instance, sent with every batch (a URL-safe id); all are copied.
 * link is borrowed and must outlive the reporter. */
Reporter *reporter_new(const char *path, const char *token, const char *instance, Link *link);
/* Starts the sending thread. */
int reporter_start(Reporter *r, Err *err) WARN_UNUSED;
/* Queues the report of attempt (id, attempt) ending as o says: "completed" with
 * o->result, or "failed" with o->error and o->retry. o stays the caller's. */
void reporter_add(Reporter *r, const char *id, int64_t attempt, const ExecOutcome *o);
/* Appends {"id": ..., "attempt": ...} to arr for every report not acknowledged yet. */
void reporter_list(Reporter *r, json_t *arr);
/* Number of reports not acknowledged yet. */
/* Waits until every report is acknowledged or timeout_ms passed; returns the
 * number still unacknowledged. */
size_t reporter_flush(Reporter *r, int64_t timeout_ms);
/* Stops the thread, abandoning a request in flight, and logs every report that
 * was never acknowledged. Idempotent. */
void reporter_stop(Reporter *r);
/* Stops it if needed and frees it. */
void reporter_free(Reporter *r);

/* ---- reading the server's answer (pure, for tests) ---- */

typedef enum {
    REPORT_ACCEPTED,   /* recorded (now or before): forget it */
    REPORT_SUPERSEDED, /* the attempt is no longer current (or not ours): drop it */
    REPORT_RETRY,      /* anything else: send it again later */
} ReportVerdict;

typedef struct ReportKey {
    const char *id;
    int64_t attempt;
} ReportKey;

typedef struct ReportAnswer {
    ReportVerdict verdict;
    char reason[96]; /* for REPORT_RETRY: why, in words */
} ReportAnswer;

/* Reads the answer body to a batch of n reports sent in the order of keys into
 * answers[n]. An entry that is missing, names another attempt or is refused for
 * a reason other than "superseded", "not-found" or "not-holder" is REPORT_RETRY. Returns -1 (err
 * says why) when body is not {"results": [...]}. */
int reports_read_answer(const char *body, const ReportKey *keys, size_t n, ReportAnswer *answers,
                        Err *err) WARN_UNUSED;

/* ---- the worker's exchange: reports a pull carries ---- */
/* *pull_since (the caller's, NULL: none) says when the pull in flight was
 * sent (mono ms; 0: none is, one is about to be): unless a pull has been
 * waiting for a while (a long poll: no job is ready), a new report waits a
 * moment for the next pull to carry it (reporter_take) rather than going in
 * a request of its own. */
void reporter_carrier(Reporter *r, _Atomic int64_t *pull_since);
/* Takes up to max reports that no request carries now, for a pull: appends
 * them to out as JSON objects separated by commas, and their keys to *keys
 * (n of them; hand them back with reporter_settle). Returns n. */
size_t reporter_take(Reporter *r, size_t max, SBuf *out, ReportKey **keys);
/* What the pull's answer said of the n reports reporter_take gave it:
 * accepted or superseded reports are done; the others (answers NULL: the
 * pull got no answer) are sent again. Frees keys. */
void reporter_settle(Reporter *r, ReportKey *keys, size_t n, const ReportAnswer *answers);

#endif
