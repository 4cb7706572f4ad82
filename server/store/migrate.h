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

/* Applies what is missing; *applied gets how many were applied now. */
int migrate_run(const char *database_url, int *applied, Err *err) WARN_UNUSED;

#endif
