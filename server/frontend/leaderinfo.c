/* leaderinfo: see leaderinfo.h. */
#include "leaderinfo.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct ShardLeader {
    char url[256];
    int64_t term;
} ShardLeader;

struct LeaderInfo {
    pthread_mutex_t lock; /* guards every shard's url and term */
    int n;
    ShardLeader shard[SHARDS_MAX];
    atomic_bool suspect;
};

LeaderInfo *leaderinfo_new(int shards)
{
    LeaderInfo *li = xcalloc(1, sizeof *li);
    pthread_mutex_init(&li->lock, NULL);
    li->n = shards < 1 ? 1 : shards > SHARDS_MAX ? SHARDS_MAX : shards;
    return li;
}

void leaderinfo_free(LeaderInfo *li)
{
    if (!li)
        return;
    pthread_mutex_destroy(&li->lock);
    free(li);
}

int leaderinfo_shards(const LeaderInfo *li)
{
    return li ? li->n : 1;
}

bool leaderinfo_set(LeaderInfo *li, int shard, const char *url, int64_t term)
{
    if (shard < 0 || shard >= li->n)
        return false;
    ShardLeader *s = &li->shard[shard];
    pthread_mutex_lock(&li->lock);
    bool changed = term != s->term || strcmp(url, s->url) != 0;
    snprintf(s->url, sizeof s->url, "%s", url);
    s->term = term;
    pthread_mutex_unlock(&li->lock);
    atomic_store(&li->suspect, false);
    return changed;
}

int64_t leaderinfo_get(LeaderInfo *li, int shard, char *out, size_t outlen)
{
    if (shard < 0 || shard >= li->n) {
        snprintf(out, outlen, "%s", "");
        return 0;
    }
    pthread_mutex_lock(&li->lock);
    snprintf(out, outlen, "%s", li->shard[shard].url);
    int64_t t = li->shard[shard].term;
    pthread_mutex_unlock(&li->lock);
    return t;
}

void leaderinfo_mark_suspect(LeaderInfo *li)
{
    atomic_store(&li->suspect, true);
}

bool leaderinfo_suspect(LeaderInfo *li)
{
    return atomic_load(&li->suspect);
}
