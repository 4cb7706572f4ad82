/* dbpool: see dbpool.h. */
#include "dbpool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "util.h"

typedef struct Task {
    DbTaskFn fn;
    void *arg;
    struct Task *next;
} Task;

struct DbPool {
    const Stores *stores; /* borrowed */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    Task *head, *tail;
    bool stopping;
    bool (*down)(void *ud, int db);   /* dbpool_watch's; under lock */
    bool (*silent)(void *ud, int db); /* ditto */
    void *down_ud;
    int nthreads;
    pthread_t *threads;
};

/* One thread's sessions, a task's ViewDbs (its first member). */
typedef struct Sessions {
    ViewDbs view;
    const DbPool *pool;
    PGconn *conn[SHARDS_MAX]; /* by database; NULL: none yet, or gone */
    uint64_t looked;          /* databases looked at during this task */
    struct At {
        DbPool *pool;
        int db;
    } at[SHARDS_MAX]; /* each session's, for its deadline's give-up (silent) */
    bool stopping;    /* no database for this task */
} Sessions;

/* A statement's give-up (db_set_deadline_or): the watch says that its
 * database went silent. */
static bool silent(void *arg)
{
    const struct At *at = arg;
    DbPool *p = at->pool;
    pthread_mutex_lock(&p->lock);
    bool quiet = p->silent && p->silent(p->down_ud, at->db);
    pthread_mutex_unlock(&p->lock);
    return quiet;
}

static PGconn *session(ViewDbs *d, int db)
{
    Sessions *s = (Sessions *)d;
    if (s->stopping || db < 0 || db >= SHARDS_MAX || db >= s->pool->stores->n)
        return NULL;
    if (s->looked >> db & 1)
        return s->conn[db];
    s->looked |= (uint64_t)1 << db;
    /* Down by the listener's word: no session, without waiting. */
    DbPool *p = (DbPool *)s->pool;
    pthread_mutex_lock(&p->lock);
    bool down = p->down && p->down(p->down_ud, db);
    pthread_mutex_unlock(&p->lock);
    if (down)
        return NULL;
    /* A session whose server went away while it sat idle (a restart, a
     * failover) is replaced before the task uses it, not after it failed. */
    if (db_alive(s->conn[db]))
        return s->conn[db];
    PQfinish(s->conn[db]);
    s->conn[db] = NULL;
    /* A silent database would hold a new session's connect for its whole
     * connect_timeout. */
    s->at[db] = (struct At){p, db};
    if (silent(&s->at[db]))
        return NULL;
    Err err = {0};
    s->conn[db] = db_connect(s->pool->stores->url[db], "frontend", &err);
    if (!s->conn[db])
        log_warn("read pool: %s", err.msg);
    db_set_deadline_or(s->conn[db], DBPOOL_DEADLINE_MS, silent, &s->at[db]);
    return s->conn[db];
}

static void sessions_init(Sessions *s, const DbPool *p, bool stopping)
{
    memset(s, 0, sizeof *s);
    s->view = (ViewDbs){.stores = p->stores, .session = session};
    s->pool = p;
    s->stopping = stopping;
}

static void *pool_main(void *arg)
{
    DbPool *p = arg;
    Sessions s;
    sessions_init(&s, p, false);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->head && !p->stopping)
            pthread_cond_wait(&p->cond, &p->lock);
        Task *t = p->head;
        if (t) {
            p->head = t->next;
            if (!p->head)
                p->tail = NULL;
        }
        bool stop = p->stopping;
        pthread_mutex_unlock(&p->lock);
        if (!t)
            break;
        s.looked = 0;
        s.stopping = stop;
        t->fn(&s.view, t->arg);
        free(t);
    }
    for (int db = 0; db < p->stores->n; db++)
        PQfinish(s.conn[db]);
    return NULL;
}

DbPool *dbpool_start(const Stores *stores, int threads, Err *err)
{
    DbPool *p = xcalloc(1, sizeof *p);
    p->stores = stores;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->threads = xcalloc((size_t)threads, sizeof *p->threads);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, pool_main, p) != 0) {
            err_set(err, 500, "internal", "cannot start read pool threads");
            p->nthreads = i;
            dbpool_stop(p);
            dbpool_free(p);
            return NULL;
        }
        p->nthreads = i + 1;
    }
    return p;
}

void dbpool_stop(DbPool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    p->nthreads = 0;
}

void dbpool_free(DbPool *p)
{
    if (!p)
        return;
    free(p->threads);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p);
}

void dbpool_watch(DbPool *p, bool (*down)(void *ud, int db), bool (*quiet)(void *ud, int db),
                  void *ud)
{
    pthread_mutex_lock(&p->lock);
    p->down = down;
    p->silent = quiet;
    p->down_ud = ud;
    pthread_mutex_unlock(&p->lock);
}

void dbpool_submit(DbPool *p, DbTaskFn fn, void *arg)
{
    Task *t = xcalloc(1, sizeof *t);
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&p->lock);
    if (p->stopping) {
        pthread_mutex_unlock(&p->lock);
        free(t);
        Sessions none;
        sessions_init(&none, p, true);
        fn(&none.view, arg);
        return;
    }
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
}
