/* listener: one thread with its own direct PostgreSQL session that LISTENs for
 * new events and leader changes, feeds the hub, keeps this node's idea of the
 * leader and its row in workd_nodes, and drives the hub's timers. */
#ifndef WORKD_LISTENER_H
#define WORKD_LISTENER_H

#include <jansson.h>

#include "err.h"
#include "server.h"

typedef struct Listener Listener;

Listener *listener_start(Server *s, Err *err);
void listener_stop(Listener *l);
/* Makes the listener thread look at the hub's timers again now (a new
 * GET ?wait= may end before it would next wake). Any thread. */
void listener_wake(Listener *l);
/* The live server nodes as JSON (a new reference), refreshed every few seconds. */
json_t *listener_nodes(Listener *l);

#endif
