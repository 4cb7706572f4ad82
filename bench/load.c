/* load: see load.h. */
#include "load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void load_init(Load *l, Mc *m, const char *server, size_t max_jobs, int64_t call_timeout_ms)
{
    memset(l, 0, sizeof *l);
    l->mc = m;
    snprintf(l->url, sizeof l->url, "%s/work", server);
    char rnd[37];
    id_generate(rnd);
    snprintf(l->prefix, sizeof l->prefix, "b%.8s-", rnd);
    l->max_jobs = max_jobs;
    l->jobs = xcalloc(max_jobs ? max_jobs : 1, sizeof *l->jobs);
    l->call_timeout_ms = call_timeout_ms;
}

void load_free(Load *l)
{
    free(l->jobs);
    l->jobs = NULL;
}

static void on_answer(McReq *q)
{
    Load *l = q->ud;
    Job *j = &l->jobs[q->tag];
    j->answered_us = q->done_us;
    j->status = q->result == CURLE_OK ? q->status : 0;
    l->answered++;
    if (j->status == 202) {
        l->accepted++;
    } else {
        if (l->failed < 5)
            fprintf(stderr, "workd-bench: submission %s%lld: %s (HTTP %ld) %.200s\n", l->prefix,
                    (long long)q->tag, curl_easy_strerror(q->result), q->status,
                    q->body.data ? q->body.data : "");
        l->failed++;
    }
    if (l->chain && l->n < l->limit)
        (void)load_submit(l);
}

bool load_submit(Load *l)
{
    if (l->n >= l->max_jobs)
        return false;
    size_t i = l->n++;
    char body[384], queue[256] = "";
    if (l->n_queues)
        snprintf(queue, sizeof queue, ",\"queue\":\"%s\"", l->queues[i % l->n_queues]);
    if (l->anonymous)
        snprintf(body, sizeof body, "{\"payload\":%zu%s}", i, queue);
    else
        snprintf(body, sizeof body, "{\"id\":\"%s%zu\",\"payload\":%zu%s}", l->prefix, i, i, queue);
    l->jobs[i].sent_us = mono_us();
    McReq *q = mc_start(l->mc, "POST", l->url, body, l->call_timeout_ms, on_answer, l);
    q->tag = (int64_t)i;
    return true;
}

void load_open_loop(Load *l, double rate, int64_t start_us, int64_t end_us,
                    void (*hook)(Load *l, int64_t now_us, void *ud), void *ud)
{
    double gap_us = 1e6 / rate;
    size_t first = l->n;
    for (;;) {
        int64_t now = mono_us();
        if (hook)
            hook(l, now, ud);
        if (now >= end_us)
            break;
        int64_t due = start_us + (int64_t)((double)(l->n - first) * gap_us);
        while (due <= now && due < end_us && load_submit(l))
            due = start_us + (int64_t)((double)(l->n - first) * gap_us);
        int64_t wait_us = (due < end_us ? due : end_us) - mono_us();
        int wait_ms = wait_us <= 0 ? 0 : (int)((wait_us + 999) / 1000);
        mc_run(l->mc, wait_ms > 5 ? 5 : wait_ms);
    }
}

void load_closed_loop(Load *l, size_t clients, size_t total)
{
    l->chain = true;
    l->limit = l->n + total;
    size_t target = l->limit;
    for (size_t i = 0; i < clients && l->n < l->limit; i++)
        (void)load_submit(l);
    while (l->answered < target && mc_inflight(l->mc) > 0)
        mc_run(l->mc, 100);
    l->chain = false;
}

void load_on_result(const ResultEv *ev, void *ud)
{
    Load *l = ud;
    size_t plen = strlen(l->prefix);
    if (strncmp(ev->id, l->prefix, plen) != 0) {
        l->stray_results++;
        return;
    }
    char *end;
    unsigned long long i = strtoull(ev->id + plen, &end, 10);
    if (*end || i >= l->n || l->jobs[i].result_us) {
        l->stray_results++;
        return;
    }
    l->jobs[i].result_us = ev->recv_us;
    l->jobs[i].result_at_ms = ev->at_ms;
    l->results++;
}

size_t load_wait_results(Load *l, int64_t timeout_ms)
{
    int64_t deadline = mono_us() + timeout_ms * 1000;
    for (;;) {
        /* Answers still in flight may yet be accepted. */
        if (l->answered == l->n && l->results >= l->accepted)
            break;
        if (mono_us() >= deadline)
            break;
        mc_run(l->mc, 20);
    }
    size_t missing = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->jobs[i].status == 202 && !l->jobs[i].result_us)
            missing++;
    return missing;
}
