/* projection: see projection.h. The fold mirrors what migration 0001's trigger
 * did, so rows written before and after the change agree. */
#include "projection.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

void projrow_init(ProjRow *r, const char *id)
{
    memset(r, 0, sizeof *r);
    r->id = xstrdup(id);
}

void projrow_clear(ProjRow *r)
{
    free(r->id);
    free(r->queue);
    free(r->key);
    json_decref(r->payload);
    free(r->worker_id);
    json_decref(r->result);
    free(r->last_error);
    json_decref(r->after);
    free(r->batch);
    free(r->traceparent);
    free(r->tracestate);
    free(r->hist);
    memset(r, 0, sizeof *r);
}

static void set_str(char **dst, const char *src)
{
    free(*dst);
    *dst = xstrdup(src);
}

/* An accepted event: the whole row. */
static void fold_accepted(ProjRow *r, const Event *e)
{
    r->is_new = true;
    set_str(&r->queue, e->queue);
    set_str(&r->key, e->key);
    r->priority = e->priority;
    json_decref(r->payload);
    r->payload = json_incref(e->payload);
    r->status = e->waiting ? "waiting" : "pending";
    json_decref(r->after);
    r->after = json_incref(e->after); /* the event's array: never changed */
    if (e->after)
        r->after_policy = e->run_anyway ? "run" : "cancel";
    set_str(&r->batch, e->batch);
    set_str(&r->traceparent, e->traceparent);
    set_str(&r->tracestate, e->tracestate);
    r->max_attempts = e->max_attempts;
    r->timeout_ms = e->timeout_ms;
    r->run_at = e->run_at;
    r->created_at = e->at;
    r->accepted_seq = e->seq;
}

/* The event's seq, in the row's history. */
static void add_history(ProjRow *r, int64_t seq)
{
    if (r->n_hist == r->cap_hist) {
        r->cap_hist = r->cap_hist ? 2 * r->cap_hist : 4;
        r->hist = xrealloc(r->hist, r->cap_hist * sizeof *r->hist);
    }
    r->hist[r->n_hist++] = seq;
}

void projrow_fold(ProjRow *r, const Event *e)
{
    if (e->type == EV_PROGRESS) /* changes no row: workd_progress finds it */
        return;
    add_history(r, e->seq);
    r->updated_seq = e->seq;
    switch (e->type) {
    case EV_ACCEPTED:
        fold_accepted(r, e);
        return;
    case EV_STARTED:
        r->status = "running";
        r->attempts = e->attempt;
        set_str(&r->worker_id, e->worker_id);
        r->deadline = e->deadline;
        r->started_at = e->at;
        r->changed |= PC_STATUS | PC_ATTEMPTS | PC_WORKER | PC_DEADLINE | PC_STARTED_AT;
        return;
    case EV_COMPLETED:
        r->status = "completed";
        json_decref(r->result);
        r->result = json_incref(e->result ? e->result : json_null());
        r->deadline = 0;
        r->finished_at = e->at;
        r->changed |= PC_STATUS | PC_RESULT | PC_DEADLINE | PC_FINISHED_AT;
        return;
    case EV_FAILED:
    case EV_TIMED_OUT:
        r->status = "pending";
        r->run_at = e->retry_at;
        set_str(&r->last_error, e->error);
        r->deadline = 0;
        r->changed |= PC_STATUS | PC_RUN_AT | PC_LAST_ERROR | PC_DEADLINE;
        return;
    case EV_DEAD:
        r->status = "dead";
        r->finished_at = e->at;
        r->deadline = 0;
        r->changed |= PC_STATUS | PC_FINISHED_AT | PC_DEADLINE;
        if (e->error) {
            set_str(&r->last_error, e->error);
            r->changed |= PC_LAST_ERROR;
        }
        return;
    case EV_CANCELLED:
        r->status = "cancelled";
        r->finished_at = e->at;
        r->deadline = 0;
        r->changed |= PC_STATUS | PC_FINISHED_AT | PC_DEADLINE;
        return;
    case EV_RETRIED:
        /* Reopened work queues behind what is pending now, as the manager orders it. */
        r->status = "pending";
        r->max_attempts = e->max_attempts;
        r->run_at = 0;
        r->finished_at = 0;
        r->deadline = 0;
        r->accepted_seq = e->seq;
        r->changed |= PC_STATUS | PC_MAX_ATTEMPTS | PC_RUN_AT | PC_FINISHED_AT | PC_DEADLINE |
                      PC_ACCEPTED_SEQ;
        if (e->error) {
            set_str(&r->last_error, e->error);
            r->changed |= PC_LAST_ERROR;
        }
        return;
    case EV_RELEASED:
        r->status = "pending";
        r->changed |= PC_STATUS;
        return;
    case EV_TERM:
    case EV_QUEUE_SET:
    case EV_PROGRESS: /* above */
    case EV_SUBSCRIPTION:
    case EV_SUB_CURSOR:
    case EV_SCHEDULE_SET:
    case EV_SCHEDULE_DELETED:
    case EV_TICK:
    case EV_BATCH_OPENED:
    case EV_BATCH:
        return;
    }
}
