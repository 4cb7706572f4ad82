/* err: error detail handed back to callers, so that an HTTP handler can turn it
 * into a problem+json body and a log line can say what went wrong. */
#ifndef WORKD_ERR_H
#define WORKD_ERR_H

/* The error convention of workd. A fallible function has one of two forms:
 *
 *   int f(..., Err *err) WARN_UNUSED;    0 on success, -1 on failure
 *   T  *f(..., Err *err) WARN_UNUSED;    the new object, or NULL on failure
 *
 * and on failure fills *err when the caller passed one (err may be NULL). A
 * few return a count or -1 (journal_finished_after) or an enum of outcomes
 * (election_try); their header says so. Every fallible function, public or
 * static, is marked WARN_UNUSED: the compiler (-Werror) refuses a caller that
 * ignores the outcome, and a (void) cast does not silence it.
 *
 * A function that answers yes or no returns bool, never int. A function that
 * frees what it made on its way out does so after one label, `cleanup` (a
 * flag or rc says what there is to undo), never a ladder of labels. */
#define WARN_UNUSED __attribute__((warn_unused_result))

typedef struct Err {
    int status;    /* HTTP status the failure maps to (400, 404, 409, 503...); 500 if unknown */
    char type[48]; /* short machine-readable kind, e.g. "conflict", "queue-full" */
    char msg[512]; /* a sentence a person can act on */
} Err;

/* Sets *e (if e is not NULL) and returns -1, so callers can `return err_set(...)`. */
int err_set(Err *e, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Clears *e. */
void err_clear(Err *e);

#endif
