/* link: see link.h. */
#include "link.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "util.h"

static const char *channel_names[LINK_CHANNELS] = {"heartbeat", "pull", "reports"};

void link_init(Link *l, Servers *servers)
{
    memset(l, 0, sizeof *l);
    l->servers = servers;
    pthread_mutex_init(&l->lock, NULL);
}

size_t link_url(Link *l, const char *path, char *out, size_t outlen)
{
    return servers_url(l->servers, path, out, outlen);
}

void link_destroy(Link *l)
{
    pthread_mutex_destroy(&l->lock);
}

/* Any HTTP answer means the server is reachable. l->lock held. */
static void reached(Link *l)
{
    if (l->unreachable) {
        l->unreachable = false;
        log_info("server reachable again");
    }
}

void link_ok(Link *l, LinkChannel ch)
{
    pthread_mutex_lock(&l->lock);
    reached(l);
    if (l->refused[ch]) {
        l->refused[ch] = 0;
        log_info("%s accepted again", channel_names[ch]);
    }
    pthread_mutex_unlock(&l->lock);
}

void link_unreachable(Link *l, LinkChannel ch, size_t pos, const char *why)
{
    char next[SERVERS_URL_MAX];
    /* Under l->lock, so that "unreachable" and "trying" lines keep their order. */
    pthread_mutex_lock(&l->lock);
    bool moved = servers_unreachable(l->servers, pos, next, sizeof next);
    if (!l->unreachable) {
        l->unreachable = true;
        log_warn("server unreachable: %s", why);
    } else {
        log_debug("%s: still unreachable: %s", channel_names[ch], why);
    }
    if (moved)
        log_info("trying server %s", next);
    pthread_mutex_unlock(&l->lock);
}

void link_refused(Link *l, LinkChannel ch, long status, const char *why)
{
    pthread_mutex_lock(&l->lock);
    reached(l);
    if (l->refused[ch] != status) {
        l->refused[ch] = status;
        log_warn("%s refused: %s", channel_names[ch], why);
    } else {
        log_debug("%s still refused: %s", channel_names[ch], why);
    }
    pthread_mutex_unlock(&l->lock);
}

void link_describe(const HttpResp *resp, const Err *err, char *out, size_t outlen)
{
    if (!resp || resp->status == 0) {
        snprintf(out, outlen, "%s", err && err->msg[0] ? err->msg : "no answer");
        return;
    }
    const char *detail = NULL;
    json_t *j = resp->body ? json_loads(resp->body, 0, NULL) : NULL;
    if (json_is_object(j)) {
        detail = json_string_value(json_object_get(j, "detail"));
        if (!detail)
            detail = json_string_value(json_object_get(j, "title"));
    }
    if (detail)
        snprintf(out, outlen, "HTTP %ld: %.300s", resp->status, detail);
    else
        snprintf(out, outlen, "HTTP %ld", resp->status);
    json_decref(j);
}

void backoff_init(Backoff *b, int64_t base_ms, int64_t cap_ms)
{
    b->base_ms = base_ms;
    b->cap_ms = cap_ms;
    b->cur_ms = 0;
}

int64_t backoff_next(Backoff *b)
{
    b->cur_ms = b->cur_ms ? b->cur_ms * 2 : b->base_ms;
    if (b->cur_ms > b->cap_ms)
        b->cur_ms = b->cap_ms;
    return b->cur_ms / 2 + (int64_t)(rand_unit() * (double)(b->cur_ms - b->cur_ms / 2 + 1));
}

void backoff_reset(Backoff *b)
{
    b->cur_ms = 0;
}

void cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

void cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ms)
{
    if (deadline_ms < 0) {
        pthread_cond_wait(c, m);
        return;
    }
    struct timespec ts = {.tv_sec = deadline_ms / 1000,
                          .tv_nsec = (long)(deadline_ms % 1000) * 1000000L};
    pthread_cond_timedwait(c, m, &ts);
}
