/* parse: validation of untrusted input (request bodies, query parameters,
 * Last-Event-ID) into typed values. Pure functions, no I/O, so they can be
 * unit tested and fuzzed; every refusal is a 400-class Err naming the field. */
#ifndef WORKD_PARSE_H
#define WORKD_PARSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "workstate.h"

typedef struct ParseLimits {
    size_t max_batch;
    size_t max_depth;
    int64_t default_timeout_ms;
    int default_max_attempts;
} ParseLimits;

/* Parses a JSON body; refuses invalid JSON, invalid UTF-8 and nesting deeper
 * than max_depth. Returns a new reference or NULL with err (400). */
json_t *parse_json_body(const char *body, size_t len, size_t max_depth, Err *err);

/* POST /work: one object or an array of them. idem_key (Idempotency-Key
 * header, may be NULL) becomes the id of a single item. Items without id get a
 * generated one. On success *items (caller frees with submit_items_free) and
 * *bulk (whether the body was an array). */
int parse_submit(json_t *body, const char *idem_key, int64_t now, const ParseLimits *lim,
                 SubmitItem **items, size_t *n, bool *bulk, Err *err) WARN_UNUSED;
void submit_items_free(SubmitItem *items, size_t n);
/* The normalised form of items (ids filled in), to forward to the leader. */
json_t *submit_items_json(const SubmitItem *items, size_t n, bool bulk);

/* PUT /workers/{id}: {instance, capacity, queues, running}. */
typedef struct HeartbeatMsg {
    char *instance;
    int capacity;
    char **queues;
    json_t *running;
} HeartbeatMsg;
int parse_heartbeat(json_t *body, HeartbeatMsg *out, Err *err) WARN_UNUSED;

/* POST /workers/{id}/pull: {instance, max, wait, queues}. */
typedef struct PullMsg {
    char *instance;
    int max;
    int64_t wait_ms;
    char **queues;
} PullMsg;
int parse_pull(json_t *body, PullMsg *out, Err *err) WARN_UNUSED;

/* POST /workers/{id}/reports: {"reports": [...]}; returns the validated array
 * (new reference) in *reports. */
int parse_reports(json_t *body, size_t max_batch, json_t **reports, Err *err) WARN_UNUSED;
/* POST /work/{id}/attempts/{n}/complete|fail: builds the one-element reports array. */
int parse_single_report(json_t *body, const char *work_id, const char *attempt, bool completed,
                        json_t **reports, char **worker_id, Err *err) WARN_UNUSED;

/* A non-negative integer such as a Last-Event-ID or ?after=. */
int parse_seq(const char *s, int64_t *out, Err *err) WARN_UNUSED;
/* ?wait=SECONDS: a number of seconds, at most max_ms. */
int parse_wait(const char *s, int64_t max_ms, int64_t *out_ms, Err *err) WARN_UNUSED;
/* A queue name: 1..64 of [A-Za-z0-9_.-]. */
bool queue_name_valid(const char *s);

#endif
