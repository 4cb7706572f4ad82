/* pull: a worker's pull over the queues of several shards. The node it
 * reached takes from each shard in turn (a pull that does not wait, for what
 * is still missing), and when none has work, waits on all of them with
 * peeks (pulls that start nothing and answer once a start is possible), then
 * takes from the shard that said so. The worker gets at most its max, and
 * nothing is started that it is not handed. */
#ifndef WORKD_PULL_H
#define WORKD_PULL_H

#include <jansson.h>
#include <stdint.h>

#include "http.h"

#include "proxy.h"
#include "shard.h"

typedef struct PullSpec {
    const char *instance; /* NULL: none; strings are copied */
    int max;
    int64_t wait_ms;
    int n_shards; /* the cluster's */
    /* The shards to pull from, each with its queues (NULL: every queue of it). */
    int shards[SHARDS_MAX];
    char **queues[SHARDS_MAX]; /* NULL-terminated, borrowed */
    int n;
    json_t *results; /* NULL, or the results of the reports the pull carried (the worker's
                        exchange): the answer carries them (a reference is taken) */
} PullSpec;

/* Answers r (parked by the caller) as POST /workers/{id}/pull would. */
void pull_over_shards(Proxy *p, Req *r, const PullSpec *spec);

#endif
