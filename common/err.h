/* err: error detail handed back to callers, so that an HTTP handler can turn it
 * into a problem+json body and a log line can say what went wrong. */
#ifndef WORKD_ERR_H
#define WORKD_ERR_H

#define WARN_UNUSED __attribute__((warn_unused_result))

/* Every fallible function in workd returns int: 0 on success, -1 on failure,
 * filling an Err when the caller passed one. */
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
