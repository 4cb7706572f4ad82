/* record: the log's records (workd_log, migration 0018). A commit's events
 * are written as lines of JSON text, in seq order, cut into records of about
 * RECORD_BYTES, so that a drained job's events cost a share of one row and
 * no index entry of their own. Each line begins
 *   {"seq":N,"at":MS,"type":"T","v":V,"work_id":...,"data":{...}}
 * with exactly that prefix (the migration's workd_log_line writes the same),
 * so a reader finds a line's seq and type without parsing the rest. */
#ifndef WORKD_RECORD_H
#define WORKD_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "util.h"

/* A record is cut after the line that takes it past this many bytes: it then
 * stays on its heap page (toast_tuple_target 8160), uncompressed. */
#define RECORD_BYTES 7000

/* True for the events the database keeps a table for (the leader, queues,
 * schedules, batches, subscriptions): a record holding one is marked
 * control, and migration 0018's trigger folds it. */
bool record_is_control(EventType t);

/* Appends e's line to b (no newline). */
void record_line(SBuf *b, const Event *e);

/* One line of a record, as the reader meets it: seq, time and type from its
 * prefix, and where the whole line is (in the record's text). */
typedef struct LogLine {
    int64_t seq, at;
    char type[32];
    const char *text;
    size_t len;
} LogLine;

/* The next line of a record's text from *p (up to end), moving *p past it.
 * Returns 1 with *out filled, 0 at the end, -1 on a line that is not a
 * record line. */
int record_next(const char **p, const char *end, LogLine *out, Err *err) WARN_UNUSED;

/* The whole of line l as an event of term `term` (event_clear frees it). */
int record_decode(const LogLine *l, int64_t term, Event *out, Err *err) WARN_UNUSED;

/* The line's version, work id (NULL: none; owned) and data (a new reference). */
int record_parts(const LogLine *l, int *version, char **work_id, json_t **data,
                 Err *err) WARN_UNUSED;

#endif
