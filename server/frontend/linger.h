/* linger: the lingering close of a connection answered before its body was
 * read. Closing a socket with unread data makes the kernel send a reset,
 * which can destroy the answer on its way (the client, or a balancer in
 * between, sees the connection drop instead of the 413 or 401). A socket
 * handed here has had its answer sent and its write side shut; it is read
 * and the data thrown away until the peer closes or a bounded time passes,
 * then closed. One thread serves every socket; it is guarded by a mutex. */
#ifndef WORKD_LINGER_H
#define WORKD_LINGER_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "util.h"

typedef struct Linger Linger;

/* ---- lifetime ---- */
/* At most max_sockets at once, each for at most max_ms; NULL with err if its
 * thread cannot be started. */
Linger *linger_new(int max_sockets, int64_t max_ms, Err *err) WARN_UNUSED;
/* Stops the thread and closes every socket still held. */
void linger_free(Linger *l);

/* ---- any thread ---- */
/* Takes a duplicate of fd (the caller closes its own as usual). Returns false,
 * taking nothing, when max_sockets are already lingering or fd cannot be
 * duplicated: the caller's close then resets the connection, as without this. */
bool linger_take(Linger *l, int fd);
/* Sockets lingering now. */

#endif
