/* projection: how events fold into a work item's row (workd_open while open,
 * workd_done once finished), as a pure function. The leader folds each
 * commit's events per work item and writes the rows in the same statement as
 * the events (journal_append_send); reads and recovery use the rows. Set-based writes from C
 * replace a per-row trigger that cost more than the event insert itself. */
#ifndef WORKD_PROJECTION_H
#define WORKD_PROJECTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "event.h"

/* Columns an update sets (ProjRow.changed); a new row sets them all. Each
 * has a bit; journal.c's column table must give every bit a column (it checks
 * that at compile time against PC_ALL), so add a column here by its bit. */
enum {
    PCB_STATUS,
    PCB_ATTEMPTS,
    PCB_MAX_ATTEMPTS,
    PCB_RUN_AT,
    PCB_STARTED_AT,
    PCB_FINISHED_AT,
    PCB_WORKER,
    PCB_DEADLINE,
    PCB_RESULT,
    PCB_LAST_ERROR,
    PCB_ACCEPTED_SEQ,
    PCB_COUNT
};
enum {
    PC_STATUS = 1 << PCB_STATUS,
    PC_ATTEMPTS = 1 << PCB_ATTEMPTS,
    PC_MAX_ATTEMPTS = 1 << PCB_MAX_ATTEMPTS,
    PC_RUN_AT = 1 << PCB_RUN_AT,
    PC_STARTED_AT = 1 << PCB_STARTED_AT,
    PC_FINISHED_AT = 1 << PCB_FINISHED_AT,
    PC_WORKER = 1 << PCB_WORKER,
    PC_DEADLINE = 1 << PCB_DEADLINE,
    PC_RESULT = 1 << PCB_RESULT,
    PC_LAST_ERROR = 1 << PCB_LAST_ERROR,
    PC_ACCEPTED_SEQ = 1 << PCB_ACCEPTED_SEQ,
    PC_ALL = (1 << PCB_COUNT) - 1,
};

/* One row of workd_open or workd_done, or the part of it that a run of events changed.
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
    /* the producer's trace context; NULL: none */
    char *traceparent, *tracestate;
    /* the seqs of the folded events: added to the row's history, through
     * which its events are read (view_work_events); progress reports are
     * not folded (workd_progress finds them) */
    int64_t *hist;
    size_t n_hist, cap_hist;
} ProjRow;

/* An empty row for work id (nothing known, nothing changed). */
void projrow_init(ProjRow *r, const char *id);
/* Folds one event of the row's work into it. */
void projrow_fold(ProjRow *r, const Event *e);
void projrow_clear(ProjRow *r);

#endif
