/* progress_hub: what running jobs say about themselves, merged per attempt and
 * sent to the server by one thread, all attempts in one request (POST
 * /workers/{id}/progress) at most once per interval. An --exec job writes
 * lines on the descriptor WORKD_PROGRESS_FD names: a JSON object
 * {"fraction", "message", "output"}, a number (0.4) or a percentage (40%), or
 * any other text (a message). Fractions and messages merge to the latest;
 * output chunks are concatenated, in order. One sender per executor slot,
 * used by that slot's thread only; the senders of a worker share one
 * ProgressHub, whose lock guards them. */
#ifndef WORKD_WORKER_PROGRESS_HUB_H
#define WORKD_WORKER_PROGRESS_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "link.h"

#define PROGRESS_PENDING_MAX                                                                       \
    (256 * 1024) /* output held while the server is slow; more is dropped */

typedef struct ProgressHub ProgressHub;
typedef struct ProgressSender ProgressSender;

/* link is borrowed (it must outlive the hub); strings are copied. No thread
 * yet: phub_start starts it (the worker forks its guard before any thread). */
ProgressHub *phub_new(Link *link, const char *token, const char *worker_id, const char *instance,
                      int64_t interval_ms);
int phub_start(ProgressHub *h, Err *err) WARN_UNUSED;
/* Stops the thread (after the slots have ended: what is unsent is dropped). */
void phub_stop(ProgressHub *h);
/* After phub_stop and after every sender is freed. */
void phub_free(ProgressHub *h);

ProgressSender *psend_new(ProgressHub *h);
void psend_free(ProgressSender *p);

/* A job starts: what follows is its progress. */
void psend_begin(ProgressSender *p, const char *work_id, int64_t attempt);
/* ExecSpec.progress: a line the job wrote (line NULL: nothing; the hub sends
 * on its own clock). ud is the sender. */
void psend_line(void *ud, const char *line, size_t len);
/* The job has ended: waits until what it said last has been sent (a few
 * tries when the server is busy or away), so that it goes before its result. */
void psend_end(ProgressSender *p);

#endif
