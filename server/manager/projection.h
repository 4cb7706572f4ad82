/* projection: how events fold into a workd_work row, as a pure function. The
 * leader folds each commit's events per work item and writes the rows in the
 * same statement as the events (journal_append); reads and recovery use the
 * rows. Set-based writes from C replace a per-row trigger that cost more than
 * the event insert itself. */
#ifndef WORKD_PROJECTION_H
#define WORKD_PROJECTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "event.h"

/* Columns an update sets (ProjRow.changed); a new row sets them all. */
enum {
    PC_STATUS = 1 << 0,
    PC_ATTEMPTS = 1 << 1,
    PC_MAX_ATTEMPTS = 1 << 2,
    PC_RUN_AT = 1 << 3,
    PC_STARTED_AT = 1 << 4,
    PC_FINISHED_AT = 1 << 5,
    PC_WORKER = 1 << 6,
    PC_DEADLINE = 1 << 7,
    PC_RESULT = 1 << 8,
    PC_LAST_ERROR = 1 << 9,
    PC_ACCEPTED_SEQ = 1 << 10,
};

/* One row of workd_work, or the part of it that a run of events changed.
 * Strings and JSON values are owned. Times are ms since the epoch, 0: NULL. */
typedef struct ProjRow {
    char *id;
    bool is_new; /* an accepted event was folded: the whole row is known */
    int changed; /* PC_* columns the folded events set (when not is_new) */
    char *queue;
    char *key; /* NULL: none */
    int priority;
    json_t *payload;
    const char *status; /* static: waiting, pending, running, completed, dead, cancelled */
    int attempts, max_attempts;
    int64_t timeout_ms, run_at, created_at, accepted_seq, started_at, finished_at, deadline;
    char *worker_id;
    json_t *result;
    char *last_error;
    int64_t updated_seq;
    json_t *after;            /* the parents named (a JSON array), NULL: none */
    const char *after_policy; /* static: "cancel" or "run" (run anyway), with after */
    char *batch;              /* NULL: none */
} ProjRow;

/* An empty row for work id (nothing known, nothing changed). */
void projrow_init(ProjRow *r, const char *id);
/* Folds one event of the row's work into it. */
void projrow_fold(ProjRow *r, const Event *e);
void projrow_clear(ProjRow *r);

#endif
