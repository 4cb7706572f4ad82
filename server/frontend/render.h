/* render: the API's JSON, written from the store's typed reads (view.h) and
 * the manager's typed answers (manager.h), one function per type, as redis's
 * addReply* write typed values straight to the reply. Nothing here reads a
 * tree back: payloads, results, progress output
 * and event data are the only JSON that comes in, and go out as they are.
 * Every function returns a new reference and only reads its argument. */
#ifndef WORKD_RENDER_H
#define WORKD_RENDER_H

#include <jansson.h>

#include "hub.h"
#include "manager.h"
#include "schedule.h"
#include "view.h"

/* ---- work ---- */
/* A time (ms since the epoch) as the API shows it: an RFC 3339 string, or
 * null for 0 (a new reference). */
json_t *render_time(int64_t ms);
/* The flow control a queue has, as the API shows it: {"queue", "paused",
 * "max_running", "max_running_per_key", "rate", "key_weights"} (a new
 * reference). */
json_t *render_queue_limits(const char *queue, const QueueLimits *l);
/* GET /work/{id}: the Work schema of openapi.yaml. */
json_t *render_work(const WorkView *w);
/* GET /work/{id}/events: {id, events, next_after}. */
json_t *render_work_events(const WorkEvents *e);
/* GET /work: {items, next_before}. */
json_t *render_work_list(const WorkList *l);

/* ---- queues ---- */
/* GET /queues: every queue that any of the lists names, by name, with its
 * open and finished counts, its throughput on this node and its limits;
 * finished_age_s is how old the finished counts may be. */
json_t *render_queues(const OpenCounts *open, const FinishedCounts *finished,
                      const QueueLimitsList *limits, const HubRates *rates, int finished_age_s);
/* GET /queues/{queue}/keys: the queue's entry of k (empty when absent). */
json_t *render_key_backlog(const char *queue, const KeyBacklogs *k);
/* GET /activity. */
json_t *render_activity(const Activity *a);

/* ---- schedules and batches ---- */
/* A schedule's definition (the Schedule schema without last_run and
 * updated_at): its spec, name, last_tick and the next five fire times after
 * max(now, last_tick) (none while paused). The answer to PUT
 * /schedules/{name} and the start of render_schedule. */
json_t *render_schedule_spec(const char *name, const ScheduleSpec *spec, int64_t last_tick,
                             int64_t now);
/* GET /schedules/{name}: one schedule, its next fire times after now. */
json_t *render_schedule(const ScheduleView *v, int64_t now);
/* GET /schedules: {"schedules": [...]}. */
json_t *render_schedules(const ScheduleList *l, int64_t now);
/* GET /batches/{id}. */
json_t *render_batch(const BatchView *b);

/* ---- webhook subscriptions (the manager's answers: manager.h) ---- */
/* One subscription (the Subscription schema), its URL's credentials shown as
 * ***; with deleted, the answer to its DELETE. */
json_t *render_subscription(const SubscriptionView *v, bool deleted);
/* GET /subscriptions: {subscriptions, last_seq}. */
json_t *render_subscriptions(const SubscriptionViews *l);

#endif
