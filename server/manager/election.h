/* election: standing for leader. A candidate tries the leader lock
 * (pg_try_advisory_lock) on its own direct session; the winner keeps that
 * session and writes every event through it, so that a manager that lost the
 * session, and with it the lock, cannot append anything (fencing). Closing
 * the session resigns. */
#ifndef WORKD_ELECTION_H
#define WORKD_ELECTION_H

#include <libpq-fe.h>
#include <stdbool.h>

#include "err.h"

typedef enum {
    ELECTION_LOST, /* another session holds the lock; try again later */
    ELECTION_WON,  /* the session holds the lock, the journal's statements prepared */
    ELECTION_DOWN, /* the database failed; the session is closed */
} ElectionResult;

/* One candidate: the database it stands in, and whether its being
 * unreachable was logged (logged once, and once when it is back). */
typedef struct Election {
    const char *database_url; /* borrowed */
    int shard;                /* whose leader lock (db_shard_lock) */
    int shards;               /* of the cluster */
    char app[24];             /* the session's application_name suffix: manager, manager-s<k> */
    bool down_logged;
} Election;

/* Tries the lock once on *conn, a session of the caller's: opened (or
 * reopened when broken) here, closed and set NULL here on ELECTION_DOWN. On
 * ELECTION_WON the caller writes through *conn and closes it to resign. */
ElectionResult election_try(Election *e, PGconn **conn) WARN_UNUSED;

#endif
