/* fanout: one request's command sent to several shards' leaders at once,
 * each a call through the proxy (this node's own shards too, over its own
 * HTTP), and their answers merged into the request's one. Used where a
 * command concerns every shard (a worker's heartbeat, /cluster, a bulk
 * action without a queue) or a request's parts live in several. */
#ifndef WORKD_FANOUT_H
#define WORKD_FANOUT_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"
#include "http.h"
#include "proxy.h"

/* One shard's answer. */
typedef struct FanReply {
    int shard;
    int status;
    json_t *body; /* the answer's JSON (NULL: none, or not JSON); owned by the fan-out */
    Err err;      /* status >= 400: the problem its body (or the proxy) gave */
} FanReply;

/* Finishes r from the n replies, in the order the shards were asked (any
 * thread: the last reply's). ud is the fanout caller's. */
typedef void (*FanMerge)(Req *r, FanReply *replies, size_t n, void *ud);

/* Sends r (parked by the caller) to the leader of each of shards[0..n),
 * with bodies[i] (NULL: the request's own; taken), then merges. ud is
 * handed to merge, which owns it from then on. */
void fanout(Proxy *p, Req *r, const int *shards, char **bodies, size_t n, FanMerge merge, void *ud);
/* As fanout, each call bounded (proxy_call_within): a shard whose leader
 * does not answer within within_ms replies 504 shard-unavailable. */
void fanout_within(Proxy *p, Req *r, const int *shards, char **bodies, size_t n, int64_t within_ms,
                   FanMerge merge, void *ud);

/* A shard leader's problem+json answer (NULL: none) as an Err, its type
 * taken from "https://workd.dev/problems/TYPE". */
void fan_problem(const json_t *body, int status, Err *err);

/* The first reply that is an error (status >= 400), or NULL. */
const FanReply *fan_first_error(const FanReply *replies, size_t n);

#endif
