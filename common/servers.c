/* servers: see servers.h. */
#include "servers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "util.h"

struct Servers {
    char **urls; /* NULL-terminated, read-only after servers_new */
    size_t n;
    char *text;
    pthread_mutex_t lock;
    size_t current; /* lock: position in use */
};

Servers *servers_new(const char *list, const char *what, Err *err)
{
    char **urls = strv_split(list);
    size_t n = strv_len(urls);
    if (n == 0) {
        err_set(err, 400, "bad-config", "%s: no server URL given", what);
        strv_free(urls);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        char *u = urls[i];
        size_t len = strlen(u);
        while (len && u[len - 1] == '/')
            u[--len] = '\0';
        bool http = strncmp(u, "http://", 7) == 0 && len > 7;
        bool https = strncmp(u, "https://", 8) == 0 && len > 8;
        if (!http && !https) {
            err_set(err, 400, "bad-config", "%s: '%s' is not an http:// or https:// URL", what, u);
            strv_free(urls);
            return NULL;
        }
        if (len > SERVERS_BASE_MAX) {
            err_set(err, 400, "bad-config", "%s: '%.60s...' is longer than %d characters", what, u,
                    SERVERS_BASE_MAX);
            strv_free(urls);
            return NULL;
        }
    }
    Servers *s = xcalloc(1, sizeof *s);
    s->urls = urls;
    s->n = n;
    SBuf t;
    sbuf_init(&t);
    for (size_t i = 0; i < n; i++)
        sbuf_printf(&t, "%s%s", i ? "," : "", urls[i]);
    s->text = sbuf_steal(&t);
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

void servers_free(Servers *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->lock);
    strv_free(s->urls);
    free(s->text);
    free(s);
}

size_t servers_count(const Servers *s)
{
    return s->n;
}

const char *servers_text(const Servers *s)
{
    return s->text;
}

size_t servers_url(Servers *s, const char *path, char *out, size_t outlen)
{
    pthread_mutex_lock(&s->lock);
    size_t pos = s->current;
    pthread_mutex_unlock(&s->lock);
    snprintf(out, outlen, "%s%s", s->urls[pos], path ? path : "");
    return pos;
}

bool servers_unreachable(Servers *s, size_t pos, char *next, size_t nextlen)
{
    if (s->n < 2)
        return false;
    pthread_mutex_lock(&s->lock);
    bool moved = s->current == pos;
    if (moved)
        s->current = (pos + 1) % s->n;
    size_t now = s->current;
    pthread_mutex_unlock(&s->lock);
    if (moved && next)
        snprintf(next, nextlen, "%s", s->urls[now]);
    return moved;
}
