/* shards: a manager per shard (shards.h). */
#include "shards.h"

#include <stdlib.h>

#include "util.h"

struct ShardSet {
    int n;
    Manager **mgr;
};

ShardSet *shards_start(const ManagerConfig *cfg, int n, Err *err)
{
    ShardSet *set = xcalloc(1, sizeof *set);
    set->mgr = xcalloc((size_t)n, sizeof *set->mgr);
    for (int s = 0; s < n; s++) {
        ManagerConfig mc = *cfg;
        mc.shard = s;
        mc.shards = n;
        if (!(set->mgr[s] = manager_start(&mc, err))) {
            set->n = s;
            shards_stop(set);
            shards_free(set);
            return NULL;
        }
    }
    set->n = n;
    return set;
}

void shards_stop(ShardSet *set)
{
    for (int s = 0; set && s < set->n; s++)
        manager_stop(set->mgr[s]);
}

void shards_free(ShardSet *set)
{
    if (!set)
        return;
    for (int s = 0; s < set->n; s++)
        manager_free(set->mgr[s]);
    free(set->mgr);
    free(set);
}

int shards_count(const ShardSet *set)
{
    return set ? set->n : 0;
}

Manager *shards_manager(const ShardSet *set, int s)
{
    return set && s >= 0 && s < set->n ? set->mgr[s] : NULL;
}

bool shards_leads(const ShardSet *set, int s)
{
    Manager *m = shards_manager(set, s);
    return m && manager_is_leader(m);
}
