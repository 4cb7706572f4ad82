/* wake: an eventfd by which any thread wakes one that sleeps in poll(), the
 * way the manager, the listener and retention threads are woken (a new
 * command, a new wait, a stop). The sleeping thread owns the descriptor. */
#ifndef WORKD_WAKE_H
#define WORKD_WAKE_H

#include <stdbool.h>

#include "err.h"

/* A new descriptor (non-blocking, close-on-exec), or -1 with err. */
int wake_open(Err *err) WARN_UNUSED;
/* Wakes the thread that polls fd (any thread; never blocks). */
void wake_poke(int fd);
/* Clears the pokes so far (the owning thread, after poll() saw fd readable). */
void wake_drain(int fd);
/* Sleeps until fd is poked or timeout_ms pass (-1: no timeout); whether it was
 * poked. Clears the pokes. */
bool wake_wait(int fd, int timeout_ms);
/* Closes fd (-1: nothing). */
void wake_close(int fd);

#endif
