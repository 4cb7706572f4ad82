/* shard: which shard of the WorkManager owns a queue. The hash is part of
 * every cluster's data (a queue's work lives in its shard's log), so it can
 * never change: FNV-1a, 32 bits, over the queue name's bytes, modulo the
 * cluster's shard count. The same function is in SQL (workd_shard_of,
 * migration 0019) and in Python (tests/lib/workd.py); test_couplings checks
 * that the three agree. */
#ifndef WORKD_SHARD_H
#define WORKD_SHARD_H

#include <stdint.h>

/* A cluster has 1 to SHARDS_MAX shards (workd_cluster.shards). */
#define SHARDS_MAX 64

/* FNV-1a 32 over the NUL-terminated string s. */
uint32_t shard_hash(const char *s);
/* The shard of queue in a cluster of n shards (n >= 1): 0 when n is 1. */
int shard_of_queue(const char *queue, int n);

#endif
