/* pull: a pull over several shards (pull.h). */
#include "pull.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fanout.h"
#include "util.h"

/* Where the next worker starts taking: the shards take turns being first. */
static atomic_uint rotation;

typedef struct Pull {
    pthread_mutex_t lock; /* the fields below: calls answer on the proxy's thread */
    Proxy *p;
    Req *r;
    char *instance;
    int max;
    int64_t deadline; /* ms, monotonic: when the worker's wait ends */
    int n;
    int shards[SHARDS_MAX];
    json_t *queues[SHARDS_MAX]; /* each shard's queues as JSON (NULL: any) */
    json_t *jobs;               /* taken so far */
    int next, tried;            /* taking: the next shard's index, shards asked this turn */
    unsigned generation;        /* of the peeks: answers of older ones are stale */
    int peeks_out;              /* peeks of this generation not answered */
    int out;                    /* calls not answered (of any kind) */
    int busy;                   /* callers in a function of this Pull (a call may answer at once,
                                   inside send_call): it is freed by the outermost */
    bool answered;
    Err first_err;   /* the first refusal, answered when nothing was taken */
    json_t *results; /* of the reports the pull carried (NULL: none), for the answer */
} Pull;

typedef struct Call {
    Pull *pull;
    int i; /* the shard's index */
    bool peek;
    unsigned generation;
} Call;

static void take(Pull *pl);
static void peek_all(Pull *pl);

static void pull_free(Pull *pl)
{
    free(pl->instance);
    for (int i = 0; i < pl->n; i++)
        json_decref(pl->queues[i]);
    json_decref(pl->jobs);
    json_decref(pl->results);
    pthread_mutex_destroy(&pl->lock);
    free(pl);
}

/* Answers the worker (once): the jobs taken, or a refusal when none was. */
static void finish(Pull *pl)
{
    if (pl->answered)
        return;
    pl->answered = true;
    if (!json_array_size(pl->jobs) && pl->first_err.status && !pl->results) {
        req_finish_problem(pl->r, &pl->first_err);
        return;
    }
    json_t *o = json_pack("{s:O}", "jobs", pl->jobs);
    if (pl->results) /* recorded: whatever the pull got, they are answered */
        json_object_set(o, "results", pl->results);
    req_finish_json(pl->r, 200, o);
}

static char *call_body(Pull *pl, int i, int max, int64_t wait_ms, bool peek)
{
    json_t *b = json_pack("{s:i, s:f}", "max", max, "wait", (double)wait_ms / 1000.0);
    if (pl->instance)
        json_object_set_new(b, "instance", json_string(pl->instance));
    if (pl->queues[i])
        json_object_set(b, "queues", pl->queues[i]);
    if (peek)
        json_object_set_new(b, "peek", json_true());
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void call_done(void *ud, const ProxyReply *reply);

/* Each call is bounded (proxy_call_within): a shard whose leader does not
 * answer (stuck on a database that is frozen) holds a worker's pull this
 * much past the call's own wait, once; then it is passed over while the
 * proxy says it is stuck, and what the other shards have is answered. */
#define CALL_GRACE_MS 2000

static void send_call(Pull *pl, int i, int max, int64_t wait_ms, bool peek)
{
    Call *c = xcalloc(1, sizeof *c);
    c->pull = pl;
    c->i = i;
    c->peek = peek;
    c->generation = pl->generation;
    pl->out++;
    /* Sent with the lock held: a call that fails at once (the proxy
     * stopping) answers on this thread, inside this call (the lock is
     * recursive, and `busy` keeps the Pull until the outermost returns). */
    proxy_call_within(pl->p, pl->shards[i], pl->r, call_body(pl, i, max, wait_ms, peek),
                      wait_ms + CALL_GRACE_MS, call_done, c);
}

/* Takes from the next shard whose turn it is, for what is still missing;
 * after every shard's turn: the answer, or the peeks. */
static void take(Pull *pl)
{
    int missing = pl->max - (int)json_array_size(pl->jobs);
    if (missing <= 0 || pl->tried == pl->n) {
        if (json_array_size(pl->jobs) || mono_ms() >= pl->deadline)
            finish(pl);
        else
            peek_all(pl);
        return;
    }
    int i = pl->next;
    pl->next = (pl->next + 1) % pl->n;
    pl->tried++;
    if (proxy_shard_stuck(pl->p, pl->shards[i])) {
        take(pl); /* its peek asks it again */
        return;
    }
    send_call(pl, i, missing, 0, false);
}

/* A peek waits this long at most, and is sent again while the worker's wait
 * lasts: the peeks of a turn that another shard answered first stay parked at
 * their leaders until they end, and this bounds how many a worker leaves
 * behind (one a shard a second). */
#define PEEK_MS 1000

/* Waits on every shard at once until one says a start is possible. */
static void peek_all(Pull *pl)
{
    pl->generation++;
    pl->peeks_out = pl->n;
    int64_t left = pl->deadline - mono_ms();
    int64_t wait = left < 0 ? 0 : left < PEEK_MS ? left : PEEK_MS;
    for (int i = 0; i < pl->n; i++)
        send_call(pl, i, 1, wait, true);
}

static void call_done(void *ud, const ProxyReply *reply)
{
    Call *c = ud;
    Pull *pl = c->pull;
    pthread_mutex_lock(&pl->lock);
    pl->busy++;
    pl->out--;
    json_t *body = !reply->err && reply->len ? json_loadb(reply->body, reply->len, 0, NULL) : NULL;
    bool ok = !reply->err && reply->status == 200 && json_is_object(body);
    /* A shard that did not answer in time has nothing for this pull. */
    bool stuck = reply->err && !strcmp(reply->err->type, "shard-unavailable");
    if (!ok && !stuck && !pl->first_err.status) {
        if (reply->err)
            pl->first_err = *reply->err;
        else
            fan_problem(body, reply->status ? reply->status : 502, &pl->first_err);
    }
    if (pl->answered) {
        /* a late peek: nothing to do */
    } else if (!c->peek) {
        json_array_extend(pl->jobs, json_object_get(body, "jobs"));
        take(pl);
    } else if (c->generation == pl->generation) {
        pl->peeks_out--;
        if (ok && json_is_true(json_object_get(body, "ready"))) {
            pl->generation++; /* the other peeks of this turn are stale now */
            pl->next = c->i;
            pl->tried = 0;
            take(pl);
        } else if (pl->peeks_out == 0) {
            if (mono_ms() < pl->deadline && !pl->first_err.status)
                peek_all(pl);
            else
                finish(pl);
        }
    }
    json_decref(body);
    pl->busy--;
    bool done = pl->answered && pl->out == 0 && pl->busy == 0;
    pthread_mutex_unlock(&pl->lock);
    free(c);
    if (done)
        pull_free(pl);
}

void pull_over_shards(Proxy *p, Req *r, const PullSpec *spec)
{
    Pull *pl = xcalloc(1, sizeof *pl);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    /* A call that fails at once calls back on the sender's thread, lock held. */
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&pl->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    pl->p = p;
    pl->r = r;
    pl->instance = xstrdup(spec->instance);
    pl->max = spec->max;
    pl->deadline = mono_ms() + spec->wait_ms;
    pl->results = spec->results ? json_incref(spec->results) : NULL;
    pl->n = spec->n;
    pl->jobs = json_array();
    for (int i = 0; i < spec->n; i++) {
        pl->shards[i] = spec->shards[i];
        if (spec->queues[i]) {
            pl->queues[i] = json_array();
            for (size_t q = 0; spec->queues[i][q]; q++)
                json_array_append_new(pl->queues[i], json_string(spec->queues[i][q]));
        }
    }
    pl->next = (int)(atomic_fetch_add(&rotation, 1) % (unsigned)spec->n);
    pthread_mutex_lock(&pl->lock);
    pl->busy++;
    take(pl);
    pl->busy--;
    bool done = pl->answered && pl->out == 0 && pl->busy == 0;
    pthread_mutex_unlock(&pl->lock);
    if (done)
        pull_free(pl);
}
