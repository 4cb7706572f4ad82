/* parse_hooks: the bodies of progress reports (POST
 * /work/{id}/attempts/{n}/progress, POST /workers/{id}/progress) and webhook subscriptions (PUT
 * /subscriptions/{name}), checked field by field with a message that names
 * what to fix. Untrusted input: fuzzed by tests/fuzz/fuzz_hooks.c. */
#ifndef WORKD_PARSE_HOOKS_H
#define WORKD_PARSE_HOOKS_H

#include <jansson.h>
#include <stdbool.h>

#include "err.h"
#include "event.h"
#include "netpolicy.h"
#include "progress.h"

#define PROGRESS_MESSAGE_MAX 1024 /* bytes of one progress message */
#define SUBSCRIPTION_URL_MAX 2048 /* bytes of a webhook URL */

/* POST /work/{id}/attempts/{n}/progress: {worker_id, instance, fraction
 * (0..1), message, output}, at least one of the last three. On success *u is
 * one update (progress_updates_free) and the strings are the caller's to free
 * (worker_id "anonymous" when absent, instance NULL when absent). */
int parse_progress(json_t *body, const char *work_id, const char *attempt, ProgressUpdate **u,
                   size_t *n, char **worker_id, char **instance, Err *err) WARN_UNUSED;
/* POST /workers/{id}/progress: {"progress": [{id, attempt, fraction, message,
 * output}, ...], instance}: 1 to max_batch updates, each checked as above. */
int parse_progress_batch(json_t *body, size_t max_batch, ProgressUpdate **u, size_t *n,
                         char **instance, Err *err) WARN_UNUSED;

/* A subscription: {url, secret, queues, kinds, paused, after}. On success
 * *out is all of it, named name (its strings the caller's: subscription_clear):
 * queues NULL for every queue, kinds in a fixed order (completed, dead,
 * cancelled), no paused_reason, and cursor "after" when *reset (else at 0), a
 * cursor of the cluster's shards: "after" is a seq when there is one shard,
 * else an event id's text (cursor.h) or a number read as that text. On
 * failure *out is empty. A URL whose host is an address that allow
 * (netpolicy.h; NULL: none beside public ones) refuses is refused at once (a
 * name is checked when a delivery resolves it). */
int parse_subscription(json_t *body, const char *name, int shards, const NetPolicy *allow,
                       Subscription *out, bool *reset, Err *err) WARN_UNUSED;

#endif
