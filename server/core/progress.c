/* progress: see progress.h. The book holds an entry per attempt that sent
 * progress; the manager forgets it when the attempt ends, so the book follows
 * the running work. */
#include "progress.h"

#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "util.h"

/* A token bucket of `rate` tokens a second holding at most one second's
 * worth. A full bucket is as good as none (so full ones may be dropped). */
typedef struct Bucket {
    double tokens;
    int64_t at;
} Bucket;

static void bucket_fill(Bucket *t, int rate, int64_t now)
{
    if (now > t->at) {
        t->tokens += (double)(now - t->at) * rate / 1000.0;
        if (t->tokens > rate)
            t->tokens = rate;
        t->at = now;
    }
}

typedef struct Budget {
    char *work_id;
    int attempt;
    Bucket rate;
    int64_t bytes;
    bool has_fraction;
    double fraction;
    char *message;
} Budget;

/* A worker's bucket (the key is its id). */
typedef struct WorkerBucket {
    Bucket rate;
    char id[];
} WorkerBucket;

#define WORKER_BUCKETS_PRUNE 4096 /* past this many, full buckets are dropped */

struct ProgressBook {
    ProgressLimits lim;
    HMap budgets; /* work id -> Budget */
    HMap workers; /* worker id -> WorkerBucket */
    Bucket total;
};

void progress_updates_free(ProgressUpdate *u, size_t n)
{
    for (size_t i = 0; u && i < n; i++) {
        free(u[i].work_id);
        free(u[i].message);
        free(u[i].output);
    }
    free(u);
}

ProgressBook *progress_new(const ProgressLimits *lim)
{
    ProgressBook *b = xcalloc(1, sizeof *b);
    b->lim = *lim;
    hmap_init(&b->budgets);
    hmap_init(&b->workers);
    b->total.tokens = lim->total_rate;
    return b;
}

static void budget_free(Budget *x)
{
    if (!x)
        return;
    free(x->work_id);
    free(x->message);
    free(x);
}

void progress_free(ProgressBook *b)
{
    if (!b)
        return;
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&b->budgets, &i, &k, &v);)
        budget_free(v);
    hmap_free(&b->budgets);
    for (size_t i = 0; hmap_next(&b->workers, &i, &k, &v);)
        free(v);
    hmap_free(&b->workers);
    free(b);
}

void progress_forget(ProgressBook *b, const char *work_id)
{
    if (b->budgets.len)
        budget_free(hmap_del(&b->budgets, work_id));
}

size_t progress_count(const ProgressBook *b)
{
    return b->budgets.len;
}

/* Drops the workers' buckets that are full again (as good as none). */
static void prune_workers(ProgressBook *b, int64_t now)
{
    const char *k;
    void *v;
    size_t n = 0;
    const char **full = xcalloc(b->workers.len + 1, sizeof *full);
    for (size_t i = 0; hmap_next(&b->workers, &i, &k, &v);) {
        WorkerBucket *w = v;
        bucket_fill(&w->rate, b->lim.worker_rate, now);
        if (w->rate.tokens >= b->lim.worker_rate)
            full[n++] = k;
    }
    for (size_t i = 0; i < n; i++)
        free(hmap_del(&b->workers, full[i]));
    free(full);
}

static Bucket *worker_bucket(ProgressBook *b, const char *worker_id, int64_t now)
{
    WorkerBucket *w = hmap_get(&b->workers, worker_id);
    if (w)
        return &w->rate;
    if (b->workers.len >= WORKER_BUCKETS_PRUNE)
        prune_workers(b, now);
    size_t len = strlen(worker_id) + 1;
    w = xcalloc(1, sizeof *w + len);
    memcpy(w->id, worker_id, len);
    w->rate = (Bucket){.tokens = b->lim.worker_rate, .at = now};
    hmap_put(&b->workers, w->id, w);
    return &w->rate;
}

/* Takes a token from the attempt's, the worker's and the cluster's buckets,
 * or from none of them (429). */
WARN_UNUSED static int take_rate(ProgressBook *b, Budget *x, const ProgressMsg *m, int64_t now,
                                 Err *err)
{
    bucket_fill(&x->rate, b->lim.rate, now);
    if (x->rate.tokens < 1.0)
        return err_set(err, 429, "progress-rate-limited",
                       "attempt %d of work '%s' sends more than %d progress updates a second "
                       "(--progress-rate); send less often, merging updates",
                       m->attempt, m->work_id, b->lim.rate);
    Bucket *w = NULL;
    if (b->lim.worker_rate > 0) {
        w = worker_bucket(b, m->worker_id, now);
        bucket_fill(w, b->lim.worker_rate, now);
        if (w->tokens < 1.0)
            return err_set(err, 429, "progress-rate-limited",
                           "worker '%s' sends more than %d progress updates a second over all its "
                           "attempts (--progress-rate-worker); send less often, merging updates",
                           m->worker_id, b->lim.worker_rate);
    }
    if (b->lim.total_rate > 0) {
        bucket_fill(&b->total, b->lim.total_rate, now);
        if (b->total.tokens < 1.0)
            return err_set(err, 429, "progress-rate-limited",
                           "the cluster records at most %d progress updates a second "
                           "(--progress-rate-total); send less often, merging updates",
                           b->lim.total_rate);
        b->total.tokens -= 1.0;
    }
    if (w)
        w->tokens -= 1.0;
    x->rate.tokens -= 1.0;
    return 0;
}

int progress_decide(ProgressBook *b, const WorkState *ws, const ProgressMsg *m, int64_t now,
                    EventList *out, Err *err)
{
    const WorkItem *it = ws_get(ws, m->work_id);
    if (!it)
        return err_set(err, 404, "not-found", "no open work with id '%s'", m->work_id);
    if (it->status != WORK_RUNNING || it->attempt != m->attempt)
        return err_set(err, 409, "attempt-superseded",
                       "attempt %d of work '%s' is not running; its progress was not recorded",
                       m->attempt, m->work_id);
    const WsWorker *w = ws_worker_get(ws, it->worker_id);
    const char *held_by = w ? w->instance : NULL;
    if (!m->worker_id || strcmp(m->worker_id, it->worker_id) != 0 ||
        (held_by && (m->instance ? strcmp(m->instance, held_by) != 0 : !m->claim)))
        return err_set(err, 409, "attempt-not-held",
                       "attempt %d of work '%s' is held by another worker (or instance); its "
                       "progress was not recorded",
                       m->attempt, m->work_id);
    Budget *x = hmap_get(&b->budgets, m->work_id);
    if (x && x->attempt != m->attempt) {
        hmap_del(&b->budgets, m->work_id);
        budget_free(x);
        x = NULL;
    }
    if (!x) {
        x = xcalloc(1, sizeof *x);
        x->work_id = xstrdup(m->work_id);
        x->attempt = m->attempt;
        x->rate = (Bucket){.tokens = b->lim.rate, .at = now};
        hmap_put(&b->budgets, x->work_id, x);
    }
    int64_t bytes = (int64_t)(m->message ? strlen(m->message) : 0) +
                    (int64_t)(m->output ? strlen(m->output) : 0);
    if (x->bytes + bytes > b->lim.max_bytes)
        return err_set(err, 413, "progress-too-large",
                       "attempt %d of work '%s' has sent %lld bytes of progress messages and "
                       "output; this update would pass the limit of %lld (--progress-max-bytes)",
                       m->attempt, m->work_id, (long long)x->bytes, (long long)b->lim.max_bytes);
    if (take_rate(b, x, m, now, err) != 0)
        return -1;
    x->bytes += bytes;
    if (m->has_fraction) {
        x->has_fraction = true;
        x->fraction = m->fraction;
    }
    if (m->message) {
        free(x->message);
        x->message = xstrdup(m->message);
    }
    Event *e = eventlist_push(out);
    e->type = EV_PROGRESS;
    e->at = now;
    e->work_id = xstrdup(it->id);
    e->queue = xstrdup(it->queue);
    e->attempt = it->attempt;
    e->has_fraction = x->has_fraction;
    e->fraction = x->fraction;
    e->message = xstrdup(x->message);
    e->output = xstrdup(m->output);
    return 0;
}
