/* listener: one thread with a direct PostgreSQL session to each database of
 * the cluster (stores.h) that LISTENs there for new events and leader
 * changes of the shards that database keeps, feeds the hub, keeps this
 * node's idea of each shard's leader and its row in workd_nodes (the home
 * database's), and drives the hub's timers. A session that drops is opened
 * again on its own, the others going on meanwhile. */
#ifndef WORKD_LISTENER_H
#define WORKD_LISTENER_H

#include <jansson.h>

#include "err.h"
#include "http.h"
#include "hub.h"
#include "leaderinfo.h"
#include "view.h" /* Stores */

typedef struct Listener Listener;

typedef struct ListenerConfig {
    const Stores *stores; /* borrowed, as the strings are: they outlive the listener */
    const char *node_id, *advertise_url, *roles; /* this node's row in workd_nodes */
    int64_t started_ms;                          /* when this node started (wall clock) */
    int64_t page_bytes;                          /* a read of finished events, about */
    Hub *hub;                                    /* fed with finished events; its timers driven */
    LeaderInfo *leader;                          /* written by the listener alone */
    Http *http; /* its slow-client sweep is driven too (NULL: none) */
} ListenerConfig;

Listener *listener_start(const ListenerConfig *cfg, Err *err) WARN_UNUSED;
/* Stops the thread and closes the sessions; listener_db_ok is false from then
 * on, listener_nodes still answers. listener_free once the HTTP daemon, which
 * asks both, has stopped. */
void listener_stop(Listener *l);
void listener_free(Listener *l);
/* Makes the listener thread look at the hub's timers again now (a new
 * GET ?wait= may end before it would next wake). Any thread. */
void listener_wake(Listener *l);
/* Whether the listener's session to every database is up (any thread; NULL:
 * no). */
bool listener_db_ok(Listener *l);
/* Whether its session to the database of shard `shard` is up (any thread;
 * NULL: no). */
/* Whether the listener's last try to reach database db (stores.h) failed,
 * or its session dropped, and it has not reached it since: a read there
 * would wait on it (any thread). */
bool listener_db_down(Listener *l, int db);
/* listener_db_down, or its probe there has waited half a second for an
 * answer: a read waiting there may give up (any thread). */
bool listener_db_silent(Listener *l, int db);
bool listener_shard_db_ok(Listener *l, int shard);
/* The live server nodes as JSON (a new reference), refreshed every few seconds. */
json_t *listener_nodes(Listener *l);

#endif
