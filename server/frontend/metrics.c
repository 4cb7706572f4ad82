/* metrics: see metrics.h. */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "shards.h"
#include "util.h"

void metrics_init(Metrics *m)
{
    for (int i = 0; i < METRICS_ROUTES; i++)
        histogram_init(&m->latency[i], histogram_us_bounds, 1e6);
    m->queues_top = METRICS_QUEUES_TOP;
}

void metrics_observe(Metrics *m, int route, int status, int64_t us)
{
    if (route < 0 || route >= METRICS_ROUTES)
        return;
    int cls = status / 100;
    atomic_fetch_add(&m->status[route][cls >= 1 && cls <= 5 ? cls : 0], 1);
    histogram_observe(&m->latency[route], us);
}

/* ---- which queues have series of their own ---- */

/* The queues of OpenCounts that have series of their own (metrics.h,
 * METRICS_QUEUES_TOP), and how many are added up as queue="(other)". */
typedef struct QueueLabels {
    const OpenCounts *open;     /* NULL: unknown (every queue not set goes to "(other)") */
    const QueueLimitsList *set; /* the queues whose flow control was set; NULL: none known */
    bool *own;                  /* per open->items[i] */
    size_t others;              /* open queues added up as "(other)" */
} QueueLabels;

#define OTHER_QUEUE "(other)" /* queue names cannot hold parentheses */

static int64_t open_total(const OpenCount *o)
{
    return o->waiting + o->pending + o->scheduled + o->running;
}

/* The most open work first, then by name: the same queues every scrape. */
static int by_open_work(const void *a, const void *b)
{
    const OpenCount *x = *(const OpenCount *const *)a, *y = *(const OpenCount *const *)b;
    int64_t tx = open_total(x), ty = open_total(y);
    if (tx != ty)
        return tx > ty ? -1 : 1;
    return strcmp(x->queue, y->queue);
}

/* bsearch keys: a queue's name against a list sorted by it (each entry
 * starts with its queue's name, view.h). */
static int name_vs_entry(const void *key, const void *entry)
{
    return strcmp((const char *)key, *(char *const *)entry);
}

static bool flow_set(const QueueLabels *ql, const char *queue)
{
    return ql->set && bsearch(queue, ql->set->items, ql->set->len, sizeof *ql->set->items,
                              name_vs_entry) != NULL;
}

/* Decides ql's labelled queues: every queue whose flow control was set, and
 * the `top` others with the most open work. Free with queue_labels_clear. */
static void queue_labels(QueueLabels *ql, const OpenCounts *open, const QueueLimitsList *set,
                         int64_t top)
{
    *ql = (QueueLabels){.open = open, .set = set};
    if (!open)
        return;
    ql->own = xcalloc(open->len + 1, sizeof *ql->own);
    const OpenCount **rest = xcalloc(open->len + 1, sizeof *rest);
    size_t n = 0;
    for (size_t i = 0; i < open->len; i++) {
        if (flow_set(ql, open->items[i].queue))
            ql->own[i] = true;
        else
            rest[n++] = &open->items[i];
    }
    size_t keep = top < 0 ? 0 : (size_t)top;
    if (n > keep)
        qsort(rest, n, sizeof *rest, by_open_work);
    for (size_t k = 0; k < n && k < keep; k++)
        ql->own[rest[k] - open->items] = true;
    ql->others = n > keep ? n - keep : 0;
    free(rest);
}

static void queue_labels_clear(QueueLabels *ql)
{
    free(ql->own);
    ql->own = NULL;
}

/* Whether queue has series of its own. */
static bool labelled(const QueueLabels *ql, const char *queue)
{
    if (ql->open) {
        const OpenCount *o =
            bsearch(queue, ql->open->items, ql->open->len, sizeof *ql->open->items, name_vs_entry);
        if (o)
            return ql->own[o - ql->open->items];
    }
    return flow_set(ql, queue); /* not open as of that read: only if set */
}

/* ---- rendering ---- */

static void render_flow(SBuf *b, const QueueLabels *ql, const QueueLimitsList *limits,
                        const KeyBacklogs *backlog, const QueueTokens *tokens, size_t n_tokens);

/* A manager's figure, and the families of them. */
typedef long long (*ShardFigure)(const Manager *m);
typedef struct ShardFamily {
    const char *name, *type, *help;
    const char *label; /* a label before the shard's ("outcome=\"failed\""), or NULL */
    ShardFigure figure;
    bool leading; /* only of the shards this node leads */
} ShardFamily;

#define FIGURE(fn, field)                                                                          \
    static long long fn(const Manager *m)                                                          \
    {                                                                                              \
        return (long long)atomic_load(&manager_stats(m)->field);                                   \
    }
FIGURE(fig_completed, events_by_type[EV_COMPLETED])
FIGURE(fig_failed, events_by_type[EV_FAILED])
FIGURE(fig_timed_out, events_by_type[EV_TIMED_OUT])
FIGURE(fig_workers_lost, workers_lost)
FIGURE(fig_elections_won, elections_won)
FIGURE(fig_step_downs, step_downs)
FIGURE(fig_appends_behind, appends_behind)
FIGURE(fig_open_work, open_work)
FIGURE(fig_workers, workers)
FIGURE(fig_waiting_pulls, waiting_pulls)
FIGURE(fig_inbox_refused, inbox_refused)
static long long fig_inbox_taken(const Manager *m)
{
    const ManagerStats *st = manager_stats(m);
    return (long long)(atomic_load(&st->inbox_taken) - atomic_load(&st->inbox_refused));
}

static const ShardFamily families[] = {
    {"workd_attempts_total", "counter", "Attempts ended, by outcome.", "outcome=\"completed\"",
     fig_completed, false},
    {"workd_attempts_total", NULL, NULL, "outcome=\"failed\"", fig_failed, false},
    {"workd_attempts_total", NULL, NULL, "outcome=\"timed_out\"", fig_timed_out, false},
    {"workd_lease_expiries_total", "counter", "Attempts ended because their deadline passed.", NULL,
     fig_timed_out, false},
    {"workd_workers_lost_total", "counter", "Attempts ended because their worker went silent.",
     NULL, fig_workers_lost, false},
    {"workd_elections_won_total", "counter", "Elections this node won.", NULL, fig_elections_won,
     false},
    {"workd_step_downs_total", "counter", "Times this node stopped leading.", NULL, fig_step_downs,
     false},
    {"workd_appends_behind_total", "counter",
     "Appends sent while the one before was being committed.", NULL, fig_appends_behind, false},
    {"workd_open_work", "gauge", "Work not finished (pending, scheduled, running).", NULL,
     fig_open_work, true},
    {"workd_workers", "gauge", "Workers known to the leader.", NULL, fig_workers, true},
    {"workd_waiting_pulls", "gauge", "Workers' pulls waiting for work.", NULL, fig_waiting_pulls,
     true},
    {"workd_sql_submissions_total", "counter",
     "Work submitted in SQL (workd.submit) that this node took from the inbox as leader: taken "
     "into the log, or refused there (an id with another payload).",
     "outcome=\"taken\"", fig_inbox_taken, false},
    {"workd_sql_submissions_total", NULL, NULL, "outcome=\"refused\"", fig_inbox_refused, false},
};

/* `{label,shard="s"}` (no shard label in a cluster of one shard), or "". */
static void shard_labels(char *out, size_t len, const char *label, int shard, int n)
{
    if (n > 1)
        snprintf(out, len, "%s%sshard=\"%d\"", label ? label : "", label ? "," : "", shard);
    else
        snprintf(out, len, "%s", label ? label : "");
}

/* The managers' counters: what each shard's manager on this node did while
 * it led (a sample per shard, labelled by shard when there are several). */
static void render_managers(SBuf *b, const ShardSet *set)
{
    int n = shards_count(set);
    char labels[128];
    sbuf_puts(b, "# HELP workd_commit_duration_seconds Time of one group commit of the leader.\n"
                 "# TYPE workd_commit_duration_seconds histogram\n");
    for (int s = 0; s < n; s++) {
        shard_labels(labels, sizeof labels, NULL, s, n);
        histogram_render(b, "workd_commit_duration_seconds", labels,
                         &manager_stats(shards_manager(set, s))->commit_us);
    }
    sbuf_puts(b, "# HELP workd_commit_events Events written by one group commit.\n"
                 "# TYPE workd_commit_events histogram\n");
    for (int s = 0; s < n; s++) {
        shard_labels(labels, sizeof labels, NULL, s, n);
        histogram_render(b, "workd_commit_events", labels,
                         &manager_stats(shards_manager(set, s))->commit_events);
    }
    sbuf_puts(b, "# HELP workd_events_total Events committed by this node as leader, by type.\n"
                 "# TYPE workd_events_total counter\n");
    for (int t = EV_TERM; t <= EV_LAST; t++)
        for (int s = 0; s < n; s++) {
            char type[64];
            snprintf(type, sizeof type, "type=\"%s\"", event_type_name((EventType)t));
            shard_labels(labels, sizeof labels, type, s, n);
            sbuf_printf(
                b, "workd_events_total{%s} %lld\n", labels,
                (long long)atomic_load(&manager_stats(shards_manager(set, s))->events_by_type[t]));
        }
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        const ShardFamily *fam = &families[f];
        bool any = false;
        for (int s = 0; s < n && !any; s++)
            any = !fam->leading || manager_is_leader(shards_manager(set, s));
        if (!any)
            continue;
        if (fam->help)
            sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fam->name, fam->help, fam->name,
                        fam->type);
        for (int s = 0; s < n; s++) {
            const Manager *m = shards_manager(set, s);
            if (fam->leading && !manager_is_leader(m))
                continue;
            shard_labels(labels, sizeof labels, fam->label, s, n);
            sbuf_printf(b, labels[0] ? "%s{%s} %lld\n" : "%s%s %lld\n", fam->name, labels,
                        fam->figure(m));
        }
    }
    sbuf_puts(b, "# HELP workd_writer_busy_seconds_total Time the leader's writer session had a "
                 "commit out (its rate is the writer's busy share).\n"
                 "# TYPE workd_writer_busy_seconds_total counter\n");
    for (int s = 0; s < n; s++) {
        shard_labels(labels, sizeof labels, NULL, s, n);
        sbuf_printf(b,
                    labels[0] ? "workd_writer_busy_seconds_total{%s} %.6f\n"
                              : "workd_writer_busy_seconds_total%s %.6f\n",
                    labels,
                    (double)atomic_load(&manager_stats(shards_manager(set, s))->busy_us) / 1e6);
    }
    /* Retention runs in the manager of each database's first shard: a
     * sample per database this node leads that for (labelled by database
     * when the cluster has several). */
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"workd_storage_bytes", "gauge", "Size of workd's tables with their indexes."},
        {"workd_parts", "gauge", "Parts (partitions) of the history kept."},
        {"workd_oldest_part_timestamp_seconds", "gauge",
         "When the oldest part kept was first "
         "written."},
        {"workd_retention_last_run_timestamp_seconds", "gauge",
         "When retention last completed a pass."},
        {"workd_parts_dropped_total", "counter",
         "Parts dropped by retention since this node "
         "started."},
    };
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        bool head = false;
        for (int s = 0; s < n; s++) {
            const Manager *mgr = shards_manager(set, s);
            const RetentionStats *rs = manager_retention_stats(mgr);
            if (!manager_is_leader(mgr) || !atomic_load(&rs->last_run_ms))
                continue;
            if (!head)
                sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fams[f].name, fams[f].help,
                            fams[f].name, fams[f].type);
            head = true;
            char db[24], label[48] = "";
            if (manager_database(mgr, db, sizeof db) > 1)
                snprintf(label, sizeof label, "database=\"%s\"", db);
            const char *sep = label[0] ? "," : "";
            switch (f) {
            case 0:
                sbuf_printf(b, "%s{table=\"events\"%s%s} %lld\n", fams[f].name, sep, label,
                            (long long)atomic_load(&rs->events_bytes));
                sbuf_printf(b, "%s{table=\"done\"%s%s} %lld\n", fams[f].name, sep, label,
                            (long long)atomic_load(&rs->done_bytes));
                sbuf_printf(b, "%s{table=\"open\"%s%s} %lld\n", fams[f].name, sep, label,
                            (long long)atomic_load(&rs->open_bytes));
                break;
            case 1:
            case 4:
                sbuf_printf(b, label[0] ? "%s{%s} %lld\n" : "%s%s %lld\n", fams[f].name, label,
                            (long long)atomic_load(f == 1 ? &rs->parts : &rs->parts_dropped));
                break;
            default:
                sbuf_printf(b, label[0] ? "%s{%s} %.3f\n" : "%s%s %.3f\n", fams[f].name, label,
                            (double)atomic_load(f == 2 ? &rs->oldest_part_ms : &rs->last_run_ms) /
                                1000.0);
            }
        }
    }
}

char *metrics_render(Metrics *m, const MetricsNode *node, size_t *len)
{
    SBuf b;
    sbuf_init(&b);
    sbuf_puts(
        &b, "# HELP workd_http_requests_total HTTP requests answered, by route and status class.\n"
            "# TYPE workd_http_requests_total counter\n");
    /* Requests that matched no route (404, 405, early 413) count as "unmatched". */
    for (size_t i = 0; i < METRICS_ROUTES; i++) {
        if (i >= node->n_routes && i != METRICS_ROUTES - 1)
            continue;
        const char *name = i < node->n_routes ? node->routes[i] : "unmatched";
        for (int c = 1; c <= 5; c++) {
            long long v = atomic_load(&m->status[i][c]);
            if (v)
                sbuf_printf(&b, "workd_http_requests_total{route=\"%s\",code=\"%dxx\"} %lld\n",
                            name, c, v);
        }
    }
    sbuf_puts(&b, "# HELP workd_http_request_duration_seconds Time to answer, by route.\n"
                  "# TYPE workd_http_request_duration_seconds histogram\n");
    for (size_t i = 0; i < node->n_routes; i++) {
        if (!atomic_load(&m->latency[i].count))
            continue;
        char labels[96];
        snprintf(labels, sizeof labels, "route=\"%s\"", node->routes[i]);
        histogram_render(&b, "workd_http_request_duration_seconds", labels, &m->latency[i]);
    }
    /* Each shard's (no label in a cluster of one shard). */
    int n = node->shards > 1 ? node->shards : 1;
    char labels[48];
    sbuf_puts(&b, "# HELP workd_leader_term The term of the leader this node knows.\n"
                  "# TYPE workd_leader_term gauge\n");
    for (int s = 0; s < n; s++) {
        shard_labels(labels, sizeof labels, NULL, s, n);
        sbuf_printf(&b, labels[0] ? "workd_leader_term{%s} %lld\n" : "workd_leader_term%s %lld\n",
                    labels, (long long)node->leader_terms[s]);
    }
    sbuf_puts(&b, "# HELP workd_is_leader 1 while this node leads.\n"
                  "# TYPE workd_is_leader gauge\n");
    for (int s = 0; s < n; s++) {
        shard_labels(labels, sizeof labels, NULL, s, n);
        sbuf_printf(&b, labels[0] ? "workd_is_leader{%s} %d\n" : "workd_is_leader%s %d\n", labels,
                    shards_leads(node->mgrs, s) ? 1 : 0);
    }
    sbuf_printf(&b,
                "# HELP workd_database_up 1 while this node's listener sessions (to every "
                "database) are up.\n"
                "# TYPE workd_database_up gauge\nworkd_database_up %d\n"
                "# HELP workd_sse_subscribers Open result streams on this node.\n"
                "# TYPE workd_sse_subscribers gauge\nworkd_sse_subscribers %lld\n"
                "# HELP workd_sse_events_sent_total Results sent to streams by this node.\n"
                "# TYPE workd_sse_events_sent_total counter\nworkd_sse_events_sent_total %lld\n"
                "# HELP workd_get_waits_total GET /work/{id}?wait= that waited.\n"
                "# TYPE workd_get_waits_total counter\nworkd_get_waits_total %lld\n"
                "# HELP workd_proxy_requests_total Requests forwarded to the leader.\n"
                "# TYPE workd_proxy_requests_total counter\nworkd_proxy_requests_total %lld\n"
                "# HELP workd_proxy_retries_total Retries of forwards (leader unknown or moving).\n"
                "# TYPE workd_proxy_retries_total counter\nworkd_proxy_retries_total %lld\n"
                "# HELP workd_proxy_failures_total Forwards that no leader answered in time.\n"
                "# TYPE workd_proxy_failures_total counter\nworkd_proxy_failures_total %lld\n",
                node->database_up ? 1 : 0, (long long)atomic_load(&m->sse_subscribers),
                (long long)atomic_load(&m->sse_events_sent), (long long)atomic_load(&m->get_waits),
                (long long)atomic_load(&m->proxied), (long long)atomic_load(&m->proxy_retries),
                (long long)atomic_load(&m->proxy_failures));
    QueueLabels ql;
    queue_labels(&ql, node->open_counts, node->limits, m->queues_top);
    const OpenCounts *open = node->open_counts;
    if (open) {
        OpenCount other = {.queue = OTHER_QUEUE};
        sbuf_puts(&b, "# HELP workd_queue_depth Open work by queue and state (queues past "
                      "--metrics-queues added up as queue=\"(other)\").\n"
                      "# TYPE workd_queue_depth gauge\n");
        for (size_t i = 0; i <= open->len; i++) {
            const OpenCount *o = i < open->len ? &open->items[i] : ql.others ? &other : NULL;
            if (!o)
                break;
            if (i < open->len && !ql.own[i]) {
                other.waiting += o->waiting;
                other.pending += o->pending;
                other.scheduled += o->scheduled;
                other.running += o->running;
                if (o->oldest_pending_age_s > other.oldest_pending_age_s)
                    other.oldest_pending_age_s = o->oldest_pending_age_s;
                continue;
            }
            const char *q = o->queue;
            sbuf_printf(&b,
                        "workd_queue_depth{queue=\"%s\",state=\"waiting\"} %lld\n"
                        "workd_queue_depth{queue=\"%s\",state=\"pending\"} %lld\n"
                        "workd_queue_depth{queue=\"%s\",state=\"scheduled\"} %lld\n"
                        "workd_queue_depth{queue=\"%s\",state=\"running\"} %lld\n",
                        q, (long long)o->waiting, q, (long long)o->pending, q,
                        (long long)o->scheduled, q, (long long)o->running);
        }
        sbuf_puts(&b, "# HELP workd_queue_oldest_pending_age_seconds Age of the oldest ready job.\n"
                      "# TYPE workd_queue_oldest_pending_age_seconds gauge\n");
        for (size_t i = 0; i < open->len; i++)
            if (ql.own[i])
                sbuf_printf(&b, "workd_queue_oldest_pending_age_seconds{queue=\"%s\"} %g\n",
                            open->items[i].queue, open->items[i].oldest_pending_age_s);
        if (ql.others)
            sbuf_printf(&b,
                        "workd_queue_oldest_pending_age_seconds{queue=\"" OTHER_QUEUE "\"} %g\n",
                        other.oldest_pending_age_s);
        sbuf_printf(&b,
                    "# HELP workd_queues_other Queues with open work added up as "
                    "queue=\"(other)\" (past --metrics-queues).\n"
                    "# TYPE workd_queues_other gauge\nworkd_queues_other %zu\n",
                    ql.others);
    }
    render_flow(&b, &ql, node->limits, node->backlog, node->tokens, node->n_tokens);
    queue_labels_clear(&ql);
    if (node->mgrs)
        render_managers(&b, node->mgrs);
    *len = b.len;
    return sbuf_steal(&b);
}

/* Which value of a queue's limits a gauge family shows. */
typedef enum { LIM_PAUSED, LIM_MAX_RUNNING, LIM_MAX_PER_KEY, LIM_RATE } LimitField;

/* One gauge family: HELP, TYPE, then a sample per queue whose limits set the
 * field (paused always; a limit only when there is one). */
static void limit_family(SBuf *b, const QueueLimitsList *limits, const char *name, const char *help,
                         LimitField field)
{
    sbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (size_t i = 0; i < limits->len; i++) {
        const QueueLimits *l = &limits->items[i].limits;
        const char *q = limits->items[i].queue;
        if (field == LIM_PAUSED)
            sbuf_printf(b, "%s{queue=\"%s\"} %d\n", name, q, l->paused ? 1 : 0);
        else if (field == LIM_MAX_RUNNING && l->max_running)
            sbuf_printf(b, "%s{queue=\"%s\"} %g\n", name, q, (double)l->max_running);
        else if (field == LIM_MAX_PER_KEY && l->max_running_per_key)
            sbuf_printf(b, "%s{queue=\"%s\"} %g\n", name, q, (double)l->max_running_per_key);
        else if (field == LIM_RATE && l->rate_limit && l->rate_period_ms > 0)
            sbuf_printf(b, "%s{queue=\"%s\"} %g\n", name, q,
                        (double)l->rate_limit / ((double)l->rate_period_ms / 1000.0));
    }
}

/* One backlog family: a sample per key of each labelled queue, and its
 * other keys; the queues without series of their own added up as
 * queue="(other)",key="(other)". */
static void backlog_family(SBuf *b, const QueueLabels *ql, const KeyBacklogs *backlog,
                           const char *name, const char *help, bool running)
{
    sbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    bool others = false;
    long long other = 0;
    for (size_t i = 0; i < backlog->len; i++) {
        const KeyBacklog *q = &backlog->items[i];
        bool own = labelled(ql, q->queue);
        for (size_t j = 0; j < q->n_keys; j++) {
            const KeyCount *k = &q->keys[j];
            if (own)
                sbuf_printf(b, "%s{queue=\"%s\",key=\"%s\"} %lld\n", name, q->queue,
                            k->key ? k->key : "(none)",
                            (long long)(running ? k->running : k->pending));
            else
                other += (long long)(running ? k->running : k->pending);
        }
        if (q->other_keys && own)
            sbuf_printf(b, "%s{queue=\"%s\",key=\"(other)\"} %lld\n", name, q->queue,
                        (long long)(running ? q->other.running : q->other.pending));
        else if (q->other_keys)
            other += (long long)(running ? q->other.running : q->other.pending);
        others = others || !own;
    }
    if (others)
        sbuf_printf(b, "%s{queue=\"" OTHER_QUEUE "\",key=\"(other)\"} %lld\n", name, other);
}

/* The queues' flow control: limits (view_queue_limits), backlog per key
 * (view_key_backlog with METRICS_KEYS_TOP), and the leader's rate tokens
 * (n_tokens, MC_QUEUE_FLOW). Any of them may be NULL: its families are left
 * out. All borrowed. */
static void render_flow(SBuf *b, const QueueLabels *ql, const QueueLimitsList *limits,
                        const KeyBacklogs *backlog, const QueueTokens *tokens, size_t n_tokens)
{
    if (limits) {
        limit_family(b, limits, "workd_queue_paused",
                     "1 while the queue is paused (it hands out no work).", LIM_PAUSED);
        limit_family(b, limits, "workd_queue_max_running",
                     "The queue's limit of attempts running at once (absent: none).",
                     LIM_MAX_RUNNING);
        limit_family(b, limits, "workd_queue_max_running_per_key",
                     "The queue's limit of attempts of one key running at once (absent: none).",
                     LIM_MAX_PER_KEY);
        limit_family(b, limits, "workd_queue_rate_limit_per_second",
                     "The queue's rate limit, in starts per second (absent: none).", LIM_RATE);
    }
    if (tokens) {
        sbuf_puts(b, "# HELP workd_queue_rate_tokens Starts the queue's rate limit allows now "
                     "(the leader's token bucket).\n"
                     "# TYPE workd_queue_rate_tokens gauge\n");
        for (size_t i = 0; i < n_tokens; i++)
            sbuf_printf(b, "workd_queue_rate_tokens{queue=\"%s\"} %g\n", tokens[i].queue,
                        tokens[i].tokens);
    }
    if (backlog) {
        backlog_family(b, ql, backlog, "workd_queue_key_backlog",
                       "Ready work by queue and key: the keys with the most, the rest as "
                       "key=\"(other)\", work without a key as key=\"(none)\".",
                       false);
        backlog_family(b, ql, backlog, "workd_queue_key_running",
                       "Running attempts by queue and key, for the keys of "
                       "workd_queue_key_backlog.",
                       true);
    }
}
