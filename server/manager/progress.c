/* progress: see progress.h. The book holds an entry per attempt that sent
 * progress; the manager forgets it when the attempt ends, so the book follows
 * the running work. */
#include "progress.h"

#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "util.h"

typedef struct Budget {
    char *work_id;
    int attempt;
    double tokens;
    int64_t tokens_at;
    int64_t bytes;
    bool has_fraction;
    double fraction;
    char *message;
} Budget;

struct ProgressBook {
    ProgressLimits lim;
    HMap budgets; /* work id -> Budget */
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
        x->tokens = b->lim.rate;
        x->tokens_at = now;
        hmap_put(&b->budgets, x->work_id, x);
    }
    /* Refill: `rate` tokens a second, at most one second's worth held. */
    if (now > x->tokens_at) {
        x->tokens += (double)(now - x->tokens_at) * b->lim.rate / 1000.0;
        if (x->tokens > b->lim.rate)
            x->tokens = b->lim.rate;
        x->tokens_at = now;
    }
    if (x->tokens < 1.0)
        return err_set(err, 429, "progress-rate-limited",
                       "attempt %d of work '%s' sends more than %d progress updates a second "
                       "(--progress-rate); send less often, merging updates",
                       m->attempt, m->work_id, b->lim.rate);
    int64_t bytes = (int64_t)(m->message ? strlen(m->message) : 0) +
                    (int64_t)(m->output ? strlen(m->output) : 0);
    if (x->bytes + bytes > b->lim.max_bytes)
        return err_set(err, 413, "progress-too-large",
                       "attempt %d of work '%s' has sent %lld bytes of progress messages and "
                       "output; this update would pass the limit of %lld (--progress-max-bytes)",
                       m->attempt, m->work_id, (long long)x->bytes, (long long)b->lim.max_bytes);
    x->tokens -= 1.0;
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
    e->detail = json_object();
    json_object_set_new(e->detail, "fraction",
                        x->has_fraction ? json_real(x->fraction) : json_null());
    json_object_set_new(e->detail, "message", x->message ? json_string(x->message) : json_null());
    if (m->output)
        json_object_set_new(e->detail, "output", json_string(m->output));
    return 0;
}
