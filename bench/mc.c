/* mc: see mc.h. Easy handles are recycled through a free list; connections
 * live in the multi handle's pool, so any request reuses any idle one. At most
 * max_conns transfers run at once; the rest wait here, in order: libcurl would
 * open a new connection for each (and close it after, past the pool's size),
 * so a slow second on the server became a storm of connects and closes that
 * the generator, not the server, then spent its time on. */
#include "mc.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct Mc {
    CURLM *multi;
    struct curl_slist *json_headers, *sse_headers;
    CURL **spare; /* easy handles ready for reuse */
    size_t nspare, spare_cap;
    McReq *live; /* the transfers running in the multi handle */
    size_t running, max_running;
    McReq *wait_head, *wait_tail; /* started, waiting for a running one to end */
    size_t inflight;              /* running + waiting */
};

int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

Mc *mc_new(size_t max_conns)
{
    Mc *m = xcalloc(1, sizeof *m);
    m->multi = curl_multi_init();
    if (!m->multi)
        abort();
    curl_multi_setopt(m->multi, CURLMOPT_MAXCONNECTS, (long)max_conns);
    m->max_running = max_conns ? max_conns : 1;
    /* "Expect:" keeps libcurl from waiting for 100-continue on large bodies. */
    m->json_headers = curl_slist_append(NULL, "Content-Type: application/json");
    m->json_headers = curl_slist_append(m->json_headers, "Expect:");
    m->sse_headers = curl_slist_append(NULL, "Accept: text/event-stream");
    return m;
}

static void unlink_req(McReq **head, McReq **tail, McReq *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        *head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else if (tail)
        *tail = q->prev;
    q->prev = q->next = NULL;
}

static void req_release(McReq *q)
{
    Mc *m = q->mc;
    if (q->waiting) {
        unlink_req(&m->wait_head, &m->wait_tail, q);
    } else {
        curl_multi_remove_handle(m->multi, q->easy);
        unlink_req(&m->live, NULL, q);
        m->running--;
    }
    m->inflight--;
    if (m->nspare == m->spare_cap) {
        m->spare_cap = m->spare_cap ? m->spare_cap * 2 : 64;
        m->spare = xrealloc(m->spare, m->spare_cap * sizeof *m->spare);
    }
    curl_easy_reset(q->easy);
    m->spare[m->nspare++] = q->easy;
    sbuf_free(&q->body);
    free(q->req_body);
    free(q);
}

void mc_free(Mc *m)
{
    if (!m)
        return;
    while (m->live)
        req_release(m->live);
    while (m->wait_head)
        req_release(m->wait_head);
    for (size_t i = 0; i < m->nspare; i++)
        curl_easy_cleanup(m->spare[i]);
    free(m->spare);
    curl_slist_free_all(m->json_headers);
    curl_slist_free_all(m->sse_headers);
    curl_multi_cleanup(m->multi);
    free(m);
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud)
{
    McReq *q = ud;
    size_t n = size * nmemb;
    if (q->on_data)
        return q->on_data(q, p, n) ? n : 0;
    sbuf_append(&q->body, p, n);
    return n;
}

static McReq *req_new(Mc *m, const char *url, McDoneFn on_done, void *ud)
{
    McReq *q = xcalloc(1, sizeof *q);
    q->mc = m;
    q->on_done = on_done;
    q->ud = ud;
    sbuf_init(&q->body);
    q->easy = m->nspare ? m->spare[--m->nspare] : curl_easy_init();
    if (!q->easy)
        abort();
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    q->started_us = mono_us();
    return q;
}

static void req_run(Mc *m, McReq *q)
{
    q->waiting = false;
    q->next = m->live;
    if (m->live)
        m->live->prev = q;
    m->live = q;
    m->running++;
    curl_multi_add_handle(m->multi, q->easy);
}

/* Runs q now if fewer than max_running run, else queues it behind the others. */
static McReq *req_go(Mc *m, McReq *q)
{
    m->inflight++;
    if (m->running < m->max_running) {
        req_run(m, q);
        return q;
    }
    q->waiting = true;
    q->prev = m->wait_tail;
    if (m->wait_tail)
        m->wait_tail->next = q;
    else
        m->wait_head = q;
    m->wait_tail = q;
    return q;
}

/* Moves waiting requests into the multi handle while there is room. Their time
 * limit starts then; the callers measure from when they asked. */
static void admit_waiting(Mc *m)
{
    while (m->wait_head && m->running < m->max_running) {
        McReq *q = m->wait_head;
        unlink_req(&m->wait_head, &m->wait_tail, q);
        req_run(m, q);
    }
}

McReq *mc_start(Mc *m, const char *method, const char *url, const char *json_body,
                int64_t timeout_ms, McDoneFn on_done, void *ud)
{
    McReq *q = req_new(m, url, on_done, ud);
    CURL *e = q->easy;
    if (strcmp(method, "GET") != 0) {
        q->req_body = xstrdup(json_body ? json_body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->req_body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(q->req_body));
        if (strcmp(method, "POST") != 0)
            curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, m->json_headers);
    }
    if (timeout_ms > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    return req_go(m, q);
}

McReq *mc_stream(Mc *m, const char *url, McDataFn on_data, McDoneFn on_done, void *ud)
{
    McReq *q = req_new(m, url, on_done, ud);
    q->on_data = on_data;
    curl_easy_setopt(q->easy, CURLOPT_HTTPHEADER, m->sse_headers);
    return req_go(m, q);
}

void mc_cancel(McReq *q)
{
    req_release(q);
}

size_t mc_run(Mc *m, int timeout_ms)
{
    int running, left;
    curl_multi_poll(m->multi, NULL, 0, timeout_ms < 0 ? 0 : timeout_ms, NULL);
    curl_multi_perform(m->multi, &running);
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(m->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        char *priv = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
        McReq *q = (McReq *)priv;
        q->result = msg->data.result;
        q->done_us = mono_us();
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
        if (q->on_done)
            q->on_done(q);
        req_release(q);
    }
    admit_waiting(m);
    return m->inflight;
}

long mc_status(McReq *q)
{
    long st = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &st);
    return st;
}

size_t mc_inflight(const Mc *m)
{
    return m->inflight;
}

typedef struct CallResult {
    bool done;
    long status;
    CURLcode result;
    char *body;
} CallResult;

static void call_done(McReq *q)
{
    CallResult *c = q->ud;
    c->done = true;
    c->status = q->result == CURLE_OK ? q->status : 0;
    c->result = q->result;
    c->body = sbuf_steal(&q->body);
}

long mc_call(Mc *m, const char *method, const char *url, const char *json_body, int64_t timeout_ms,
             char **body_out, Err *err)
{
    CallResult c = {0};
    mc_start(m, method, url, json_body, timeout_ms, call_done, &c);
    while (!c.done)
        mc_run(m, 50);
    if (c.status == 0)
        err_set(err, 502, "transport", "%s %s: %s", method, url, curl_easy_strerror(c.result));
    if (body_out)
        *body_out = c.body;
    else
        free(c.body);
    return c.status;
}
