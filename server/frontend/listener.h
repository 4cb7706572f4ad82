/* listener: one thread with its own direct PostgreSQL session that LISTENs for
 * new events and leader changes, feeds the hub, keeps this node's idea of the
 * leader and its row in workd_nodes, and drives the hub's timers. */
#ifndef WORKD_LISTENER_H
#define WORKD_LISTENER_H

#include <jansson.h>

#include "err.h"
#include "http.h"
#include "leaderinfo.h"
#include "hub.h"

typedef struct Listener Listener;

typedef struct ListenerConfig {
    const char *database_url; /* strings are borrowed: they outlive the listener */
    const char *node_id, *advertise_url, *roles; /* this node's row in workd_nodes */
    int64_t started_ms;                          /* when this node started (wall clock) */
    int64_t page_bytes;                          /* a read of finished events, about */
    Hub *hub;                                    /* fed with finished events; its timers driven */
    LeaderInfo *leader;                          /* written by the listener alone */
    Http *http; /* its slow-client sweep is driven too (NULL: none) */
} ListenerConfig;

Listener *listener_start(const ListenerConfig *cfg, Err *err) WARN_UNUSED;
/* Stops the thread and closes the session; listener_db_ok is false from then
 * on, listener_nodes still answers. listener_free once the HTTP daemon, which
 * asks both, has stopped. */
void listener_stop(Listener *l);
void listener_free(Listener *l);
/* Makes the listener thread look at the hub's timers again now (a new
 * GET ?wait= may end before it would next wake). Any thread. */
void listener_wake(Listener *l);
/* Whether the listener's database session is up (any thread; NULL: no). */
bool listener_db_ok(Listener *l);
/* The live server nodes as JSON (a new reference), refreshed every few seconds. */
json_t *listener_nodes(Listener *l);

#endif
