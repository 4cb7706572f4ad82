/* shards: the managers of a node, one per shard of the cluster. Each is a
 * Manager (manager.h) standing for its own shard's leader lock. With several
 * shards a placement thread (placement.h) decides every election interval
 * which shards this node stands for and when it hands one over, from the
 * live manager nodes (workd_nodes) and who leads what (workd_shards), so
 * that the shards spread over the manager nodes that are up. */
#ifndef WORKD_SHARDS_H
#define WORKD_SHARDS_H

#include <stdbool.h>

#include "err.h"
#include "manager.h"

typedef struct ShardSet ShardSet;

/* ---- lifetime ---- */
/* Starts n managers from cfg (its shard, shards and database_url are set per
 * manager from cfg->stores, which must be given),
 * and placement when n > 1. */
ShardSet *shards_start(const ManagerConfig *cfg, int n, Err *err) WARN_UNUSED;
/* Stops placement, then manager_stop for each (NULL: nothing). */
void shards_stop(ShardSet *set);
/* After the HTTP daemon has stopped (NULL: nothing). */
void shards_free(ShardSet *set);

/* ---- any thread ---- */
/* How many shards (0 for NULL: no manager role). */
int shards_count(const ShardSet *set);
/* Shard s's manager (NULL for NULL). */
Manager *shards_manager(const ShardSet *set, int s);
/* Whether this node leads shard s now (a hint, as manager_is_leader). */
bool shards_leads(const ShardSet *set, int s);

#endif
