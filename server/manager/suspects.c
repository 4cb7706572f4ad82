/* suspects: what the database refused for what it held (db_refused), and
 * how the manager finds the command at fault. The commands of a refused
 * append are suspects, by fingerprint; a suspect is decided alone in its
 * round the next time it comes (take_suspect), so that a second refusal is
 * its own; a command refused twice is isolated (409 append-refused), a tick's
 * work skipped. A commit clears what it held. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "manager_private.h"
#include "util.h"
#include "wake.h"

#define SUSPECTS_MAX 10000 /* remembered; past it the memory starts again */

typedef struct Suspect {
    unsigned refused; /* appends the database refused that held it */
    char key[];
} Suspect;

void suspects_clear(Manager *m)
{
    const char *k;
    void *v;
    for (size_t i = 0; hmap_next(&m->suspects, &i, &k, &v);)
        free(v);
    hmap_free(&m->suspects);
    hmap_init(&m->suspects);
}

static uint64_t fp_str(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL; /* FNV-1a */
    return (h ^ 0xff) * 1099511628211ULL;               /* an end, so "ab"+"c" != "a"+"bc" */
}

static uint64_t fp_int(uint64_t h, long long v)
{
    char b[24];
    snprintf(b, sizeof b, "%lld", v);
    return fp_str(h, b);
}

/* A command's fingerprint: its type and what it names, so that the same
 * request sent again (a client retrying after a 503) has the same one. */
void cmd_key(const MgrCmd *c, char out[24])
{
    uint64_t h = fp_int(14695981039346656037ULL, c->type);
    for (size_t i = 0; i < c->n_items; i++)
        h = fp_str(h, c->items[i].id);
    for (size_t i = 0; i < c->n_reports; i++)
        h = fp_int(fp_str(h, c->reports[i].work_id), c->reports[i].attempt);
    for (size_t i = 0; i < c->n_updates; i++)
        h = fp_int(fp_str(h, c->updates[i].work_id), c->updates[i].attempt);
    h = fp_str(fp_str(fp_str(h, c->work_id), c->worker_id), c->queue);
    h = fp_str(fp_str(h, c->name), c->batch_id);
    snprintf(out, 24, "c:%016llx", (unsigned long long)h);
}

static unsigned suspicion(const Manager *m, const char *key)
{
    const Suspect *x = hmap_get(&m->suspects, key);
    return x ? x->refused : 0;
}

unsigned cmd_suspicion(const Manager *m, const MgrCmd *c)
{
    if (!m->suspects.len)
        return 0;
    char key[24];
    cmd_key(c, key);
    return suspicion(m, key);
}

static void suspect(Manager *m, const char *key, const char *what, const char *why)
{
    Suspect *x = hmap_get(&m->suspects, key);
    if (!x) {
        if (m->suspects.len >= SUSPECTS_MAX)
            suspects_clear(m);
        size_t len = strlen(key) + 1;
        x = xcalloc(1, sizeof *x + len);
        memcpy(x->key, key, len);
        hmap_put(&m->suspects, x->key, x);
    }
    if (++x->refused == SUSPECT_ISOLATE)
        log_error("%s: the database refused twice the append that held it (%s): it is not tried "
                  "again",
                  what, why);
}

void unsuspect(Manager *m, const char *key)
{
    free(hmap_del(&m->suspects, key));
}

/* The database refused f for what it held: every command that may have
 * written to it becomes suspect (the one at fault among them is found by
 * deciding each alone next time); the work ids workd made (ticks) only when
 * no command was in it. */
void suspects_note(Manager *m, const Flight *f, const char *why)
{
    size_t n = 0;
    char key[ID_MAX + 8];
    for (const MgrCmd *c = f->done_head; c; c = c->next)
        if (cmd_may_write(c)) {
            cmd_key(c, key);
            suspect(m, key, "a command", why);
            n++;
        }
    for (size_t i = 0; !n && i < f->batch.len; i++) {
        const Event *e = &f->batch.items[i];
        if (e->type == EV_ACCEPTED && strchr(e->work_id, SYSTEM_ID_MARK)) {
            snprintf(key, sizeof key, "w:%s", e->work_id);
            suspect(m, key, e->work_id, why);
        }
    }
}

/* f committed: nothing it held is suspect. */
void suspects_cleared(Manager *m, const Flight *f)
{
    if (!m->suspects.len)
        return;
    char key[ID_MAX + 8];
    for (const MgrCmd *c = f->done_head; c; c = c->next) {
        cmd_key(c, key);
        unsuspect(m, key);
    }
    for (size_t i = 0; i < f->batch.len; i++)
        if (f->batch.items[i].type == EV_ACCEPTED) {
            snprintf(key, sizeof key, "w:%s", f->batch.items[i].work_id);
            unsuspect(m, key);
        }
}

bool tick_isolated(const Manager *m, const char *work_id)
{
    char key[ID_MAX + 8];
    snprintf(key, sizeof key, "w:%s", work_id);
    return suspicion(m, key) >= SUSPECT_ISOLATE;
}

/* Puts list back at the head of the mailbox, in order, for the next round. */
static void requeue(Manager *m, MgrCmd *list)
{
    if (!list)
        return;
    MgrCmd *tail = list;
    while (tail->next)
        tail = tail->next;
    pthread_mutex_lock(&m->lock);
    tail->next = m->head;
    m->head = list;
    if (!m->tail)
        m->tail = tail;
    pthread_mutex_unlock(&m->lock);
    wake_poke(m->efd);
}

/* When *mail holds a suspect that is not isolated yet, leaves it alone in
 * *mail (the rest goes back to the mailbox) and returns true. */
bool take_suspect(Manager *m, MgrCmd **mail)
{
    if (!m->suspects.len)
        return false;
    for (MgrCmd **p = mail; *p; p = &(*p)->next) {
        unsigned n = cmd_suspicion(m, *p);
        if (n == 0 || n >= SUSPECT_ISOLATE)
            continue;
        MgrCmd *c = *p;
        *p = c->next;
        c->next = NULL;
        requeue(m, *mail);
        *mail = c;
        return true;
    }
    return false;
}
