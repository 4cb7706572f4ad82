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
    char *url;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    Task *head, *tail;
    bool stopping;
    int nthreads;
    pthread_t *threads;
};

static void *pool_main(void *arg)
{
    DbPool *p = arg;
    PGconn *conn = NULL;
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
        /* A session whose server went away while it sat idle (a restart, a
         * failover) is replaced before the task sees it, not after it failed. */
        if (!stop && !db_alive(conn)) {
            PQfinish(conn);
            Err err = {0};
            conn = db_connect(p->url, "frontend", &err);
            if (!conn)
                log_warn("read pool: %s", err.msg);
        }
        t->fn(stop ? NULL : conn, t->arg);
        free(t);
    }
    PQfinish(conn);
    return NULL;
}

DbPool *dbpool_start(const char *database_url, int threads, Err *err)
{
    DbPool *p = xcalloc(1, sizeof *p);
    p->url = xstrdup(database_url);
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
    free(p->url);
    free(p);
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
        fn(NULL, arg);
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
