/* leaderinfo: see leaderinfo.h. */
#include "leaderinfo.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct LeaderInfo {
    pthread_mutex_t lock; /* guards url and term */
    char url[256];
    int64_t term;
    atomic_bool suspect;
};

LeaderInfo *leaderinfo_new(void)
{
    LeaderInfo *li = xcalloc(1, sizeof *li);
    pthread_mutex_init(&li->lock, NULL);
    return li;
}

void leaderinfo_free(LeaderInfo *li)
{
    if (!li)
        return;
    pthread_mutex_destroy(&li->lock);
    free(li);
}

bool leaderinfo_set(LeaderInfo *li, const char *url, int64_t term)
{
    pthread_mutex_lock(&li->lock);
    bool changed = term != li->term || strcmp(url, li->url) != 0;
    snprintf(li->url, sizeof li->url, "%s", url);
    li->term = term;
    pthread_mutex_unlock(&li->lock);
    atomic_store(&li->suspect, false);
    return changed;
}

int64_t leaderinfo_get(LeaderInfo *li, char *out, size_t outlen)
{
    pthread_mutex_lock(&li->lock);
    snprintf(out, outlen, "%s", li->url);
    int64_t t = li->term;
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
