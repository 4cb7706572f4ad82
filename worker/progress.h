/* progress: what a running job says about itself, merged and sent to the
 * server (POST /work/{id}/attempts/{n}/progress) at most once per interval.
 * An --exec job writes lines on the descriptor WORKD_PROGRESS_FD names:
 * a JSON object {"fraction", "message", "output"}, a number (0.4) or a
 * percentage (40%), or any other text (a message). Fractions and messages
 * merge to the latest; output chunks are concatenated, in order. One sender
 * per executor slot, used by that slot's thread only. */
#ifndef WORKD_WORKER_PROGRESS_H
#define WORKD_WORKER_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "link.h"

#define PROGRESS_PENDING_MAX                                                                       \
    (256 * 1024) /* output held while the server is slow; more is dropped */

typedef struct ProgressSender ProgressSender;

/* link is borrowed (it must outlive the sender); strings are copied. */
ProgressSender *psend_new(Link *link, const char *token, const char *worker_id,
                          const char *instance, int64_t interval_ms);
void psend_free(ProgressSender *p);

/* A job starts: what follows is its progress. */
void psend_begin(ProgressSender *p, const char *work_id, int64_t attempt);
/* ExecSpec.progress: a line the job wrote, or (line NULL) a tick, when what
 * was gathered is sent if the interval has passed. ud is the sender. */
void psend_line(void *ud, const char *line, size_t len);
/* The job has ended: sends what is left (once; before its result is reported). */
void psend_end(ProgressSender *p);

#endif
