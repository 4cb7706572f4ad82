/* stores: which database keeps each shard's rows. The home database
 * (--database-url) keeps the cluster's own tables (nodes, subscriptions, the
 * shard count) and every shard not given a database of its own; a shard
 * given one (--shard-databases "2=URL 3=URL") keeps its leader lock, term,
 * log, work, inbox, schedules and batches there (migration 0021). Shard 0
 * always lives at home. A Stores is filled once at start and then only read,
 * by any thread. */
#ifndef WORKD_STORES_H
#define WORKD_STORES_H

#include <stdbool.h>

#include "err.h"
#include "shard.h"

/* The databases of a cluster: db 0 is home. */
typedef struct Stores {
    int shards;            /* of the cluster (0 until stores_prepare) */
    int n;                 /* databases, home included */
    char *url[SHARDS_MAX]; /* by database; owned */
    int of[SHARDS_MAX];    /* shard -> its database */
} Stores;

/* ---- start ---- */
/* Reads home_url and spec ("S=URL S=URL", S from 1; several shards may name
 * one URL: they share that database). 400 bad-setting, saying what is wrong. */
int stores_parse(Stores *st, const char *home_url, const char *spec, Err *err) WARN_UNUSED;
/* Migrates every database (migrate_run; want_shards as there, the home
 * database's count wins), then checks each shard's database against what the
 * databases record, and records a shard's database the first time (before
 * its first leader). Sets st->shards and *applied (migrations applied at
 * home). 409 shards-fixed or 409 shard-database saying why; 503 while a
 * database cannot be reached. */
int stores_prepare(Stores *st, int want_shards, int *applied, Err *err) WARN_UNUSED;
void stores_free(Stores *st);

/* ---- any thread ---- */
/* The URL of the database that keeps shard s's rows. */
const char *stores_url(const Stores *st, int s);
/* The shards database db keeps as a PostgreSQL array literal ("{0,1}") in
 * out (STORES_KEEPS_LEN bytes). */
#define STORES_KEEPS_LEN (4 * SHARDS_MAX)
void stores_keeps_array(const Stores *st, int db, char *out);
/* Whether database db keeps shard s's rows. */
static inline bool stores_keeps(const Stores *st, int db, int s)
{
    return st->of[s] == db;
}
/* The first shard database db keeps (the one that names it in messages:
 * "the database of shard N"); 0 for home. */
static inline int stores_first_shard(const Stores *st, int db)
{
    for (int s = 0; s < st->shards && s < SHARDS_MAX; s++)
        if (st->of[s] == db)
            return s;
    return 0;
}

#endif
