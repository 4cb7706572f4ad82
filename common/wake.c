/* wake: see wake.h. */
#include "wake.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

int wake_open(Err *err)
{
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        err_set(err, 500, "internal", "eventfd: %s", strerror(errno));
    return fd;
}

void wake_poke(int fd)
{
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof one);
    (void)w; /* the counter cannot overflow in practice; a failed write still leaves it > 0 */
}

void wake_drain(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof v) > 0) {
    }
}

bool wake_wait(int fd, int timeout_ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0)
        return false;
    wake_drain(fd);
    return true;
}

void wake_close(int fd)
{
    if (fd >= 0)
        close(fd);
}
