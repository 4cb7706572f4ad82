/* migrate: applies the SQL migrations compiled into the binary (from
 * migrations/NNNN_name.sql), each once, in order, each in its own transaction, under an
 * advisory lock so that servers starting together do not race. */
#ifndef WORKD_MIGRATE_H
#define WORKD_MIGRATE_H

#include <stddef.h>

#include "err.h"

typedef struct Migration {
    int version;
    const char *name;
    const char *sql;
} Migration;

extern const Migration workd_migrations[];
extern const size_t workd_migrations_count;

/* Applies what is missing; *applied gets how many were applied now. Then the
 * cluster's shard count (workd_cluster): want_shards > 0 grows it to that
 * while no server runs and no work is open (a new database), and otherwise
 * must be the count it has (409 shards-fixed, saying why: see
 * docs/operations.md); 0 takes what the database says. *shards gets the
 * count. */
int migrate_run(const char *database_url, int want_shards, int *shards, int *applied,
                Err *err) WARN_UNUSED;

#endif
