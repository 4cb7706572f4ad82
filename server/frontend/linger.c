/* linger: see linger.h. The thread polls the lingering sockets and a wake
 * descriptor; a new socket or a stop pokes it. */
#include "linger.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "wake.h"

typedef struct Held {
    int fd;
    int64_t until_ms;
} Held;

struct Linger {
    int max;
    int64_t max_ms;
    int wake;
    pthread_t thread;
    pthread_mutex_t lock; /* guards held, n and stop */
    Held *held;
    int n;
    bool stop;
};

/* Reads and drops what has arrived; whether the socket is done (the peer
 * closed, or an error). */
static bool drained(int fd)
{
    char buf[16384];
    for (int i = 0; i < 64; i++) {
        ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0)
            continue;
        return got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false; /* more to come: the next poll says so */
}

static void *linger_main(void *arg)
{
    Linger *l = arg;
    struct pollfd *pfd = xcalloc((size_t)l->max + 1, sizeof *pfd);
    Held *mine = xcalloc((size_t)l->max, sizeof *mine);
    for (;;) {
        pthread_mutex_lock(&l->lock);
        bool stop = l->stop;
        int n = l->n;
        for (int i = 0; i < n; i++)
            mine[i] = l->held[i];
        pthread_mutex_unlock(&l->lock);
        if (stop)
            break;
        int64_t now = mono_ms(), next = now + 1000;
        pfd[0] = (struct pollfd){.fd = l->wake, .events = POLLIN};
        for (int i = 0; i < n; i++) {
            pfd[i + 1] = (struct pollfd){.fd = mine[i].fd, .events = POLLIN};
            if (mine[i].until_ms < next)
                next = mine[i].until_ms;
        }
        int timeout = next > now ? (int)(next - now) : 0;
        if (poll(pfd, (nfds_t)n + 1, timeout) < 0 && errno != EINTR)
            log_warn("linger: poll: %s", strerror(errno));
        if (pfd[0].revents)
            wake_drain(l->wake);
        now = mono_ms();
        /* Only this thread removes; linger_take appends after mine[n - 1]. */
        pthread_mutex_lock(&l->lock);
        for (int i = n - 1; i >= 0; i--) {
            bool done = (pfd[i + 1].revents && drained(mine[i].fd)) || now >= mine[i].until_ms;
            if (!done)
                continue;
            close(mine[i].fd);
            l->held[i] = l->held[--l->n];
        }
        pthread_mutex_unlock(&l->lock);
    }
    free(pfd);
    free(mine);
    return NULL;
}

Linger *linger_new(int max_sockets, int64_t max_ms, Err *err)
{
    Linger *l = xcalloc(1, sizeof *l);
    l->max = max_sockets > 0 ? max_sockets : 1;
    l->max_ms = max_ms;
    l->held = xcalloc((size_t)l->max, sizeof *l->held);
    pthread_mutex_init(&l->lock, NULL);
    l->wake = wake_open(err);
    if (l->wake < 0 || pthread_create(&l->thread, NULL, linger_main, l) != 0) {
        if (l->wake >= 0)
            err_set(err, 500, "internal", "cannot start the lingering-close thread");
        wake_close(l->wake);
        pthread_mutex_destroy(&l->lock);
        free(l->held);
        free(l);
        return NULL;
    }
    return l;
}

void linger_free(Linger *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->stop = true;
    pthread_mutex_unlock(&l->lock);
    wake_poke(l->wake);
    pthread_join(l->thread, NULL);
    for (int i = 0; i < l->n; i++)
        close(l->held[i].fd);
    wake_close(l->wake);
    pthread_mutex_destroy(&l->lock);
    free(l->held);
    free(l);
}

bool linger_take(Linger *l, int fd)
{
    if (!l || fd < 0)
        return false;
    pthread_mutex_lock(&l->lock);
    bool room = !l->stop && l->n < l->max;
    int dup_fd = room ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (dup_fd >= 0)
        l->held[l->n++] = (Held){.fd = dup_fd, .until_ms = mono_ms() + l->max_ms};
    pthread_mutex_unlock(&l->lock);
    if (dup_fd < 0)
        return false;
    wake_poke(l->wake);
    return true;
}
