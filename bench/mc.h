/* mc: many HTTP requests from one thread over one libcurl multi handle. Every
 * request shares the multi's pool of keep-alive connections; a response body is
 * either kept whole or handed over piece by piece as it arrives (SSE). One Mc
 * per thread: nothing here is thread-safe. */
#ifndef WORKD_BENCH_MC_H
#define WORKD_BENCH_MC_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "util.h"

typedef struct Mc Mc;
typedef struct McReq McReq;

/* Called once when a request ends (answered, failed or timed out). The request
 * is freed when the callback returns; the callback may start new requests. */
typedef void (*McDoneFn)(McReq *q);
/* Called with each piece of a streamed body as it arrives (p is not
 * NUL-terminated). Returning false aborts the request (result CURLE_WRITE_ERROR). */
typedef bool (*McDataFn)(McReq *q, const char *p, size_t n);

struct McReq {
    /* ---- read by the callbacks ---- */
    long status;        /* HTTP status, 0 if no answer arrived */
    CURLcode result;    /* CURLE_OK, or why the transfer failed */
    SBuf body;          /* the whole body (not kept for streamed requests) */
    int64_t started_us; /* mono_us() when mc_start/mc_stream was called */
    int64_t done_us;    /* mono_us() when the end was seen */
    void *ud;           /* the caller's, untouched */
    int64_t tag;        /* the caller's, untouched */
    /* ---- private ---- */
    Mc *mc;
    CURL *easy;
    McDoneFn on_done;
    McDataFn on_data;
    char *req_body;
    bool waiting; /* queued behind max_conns running transfers */
    McReq *prev, *next;
};

/* Monotonic microseconds, and wall-clock microseconds since the epoch. */
int64_t mono_us(void);
int64_t wall_us(void);

/* ---- lifetime ---- */
/* max_conns bounds the transfers that run at once, and so the connections
 * (kept alive for reuse); requests started past it wait, in order. */
Mc *mc_new(size_t max_conns);
/* Aborts whatever is in flight (no callbacks) and frees everything. */
void mc_free(Mc *m);

/* ---- requests ---- */
/* Starts METHOD url with an optional JSON body (copied; NULL: none) that must
 * end within timeout_ms (0: no limit). on_done may be NULL. Returns the
 * request, valid until its on_done returns (or mc_cancel). */
McReq *mc_start(Mc *m, const char *method, const char *url, const char *json_body,
                int64_t timeout_ms, McDoneFn on_done, void *ud);
/* Starts GET url as a stream without a time limit: on_data sees the body. */
McReq *mc_stream(Mc *m, const char *url, McDataFn on_data, McDoneFn on_done, void *ud);
/* The HTTP status of a request in flight (0 until its headers arrived). */
long mc_status(McReq *q);
/* Ends a request at once (running or waiting), without calling its on_done,
 * and frees it. */
void mc_cancel(McReq *q);

/* Performs one request and runs m (other requests' callbacks too) until it
 * ends. Returns its HTTP status, or 0 when none arrived (err says why).
 * *body_out (may be NULL) gets the body, which the caller frees. */
long mc_call(Mc *m, const char *method, const char *url, const char *json_body, int64_t timeout_ms,
             char **body_out, Err *err);

/* ---- running ---- */
/* Drives every transfer: waits at most timeout_ms for socket activity (less if
 * libcurl has a timer due), then calls the callbacks of what happened. Returns
 * the number of requests still in flight. */
size_t mc_run(Mc *m, int timeout_ms);
size_t mc_inflight(const Mc *m);

#endif
