/* exec: see exec.h. A job is a child in its own process group, watched with one
 * poll() over its pipes, a pidfd for its exit and the ExecCtl's wake pipe. The
 * guard, a process of its own, knows every job's process group while it runs. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "util.h"

/* After the command exits and its leftovers are killed, how long to wait for
 * its pipes to close (a process that left the group could hold them open). */
#define EOF_WAIT_MS 1000
/* Without a pidfd, how often to look whether the child exited. */
#define REAP_POLL_MS 50

/* ---- the guard ---- */

/* More jobs than the worker can run at once (--concurrency is at most 1024). */
#define GUARD_GROUPS 4096

/* Our end of the guard's socket (-1: no guard) and its pid. Set before threads
 * start and cleared after they end, so read without a lock. */
static int guard_fd = -1;
static pid_t guard_pid = -1;

/* ---- reaping what jobs leave behind ---- */

/* Children that their own code reaps (each job's shell, the guard): the orphan
 * reaper must leave them alone. A job's shell is added under owned_lock
 * together with its fork, so the reaper never sees it unlisted. */
static pthread_mutex_t owned_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t *owned;
static size_t n_owned, cap_owned;

static void owned_add_locked(pid_t pid)
{
    if (n_owned == cap_owned) {
        cap_owned = cap_owned ? cap_owned * 2 : 16;
        owned = xrealloc(owned, cap_owned * sizeof *owned);
    }
    owned[n_owned++] = pid;
}

static void owned_remove(pid_t pid)
{
    pthread_mutex_lock(&owned_lock);
    for (size_t i = 0; i < n_owned; i++)
        if (owned[i] == pid) {
            owned[i] = owned[--n_owned];
            break;
        }
    if (!n_owned) {
        free(owned);
        owned = NULL;
        cap_owned = 0;
    }
    pthread_mutex_unlock(&owned_lock);
}

static bool owned_locked(pid_t pid)
{
    for (size_t i = 0; i < n_owned; i++)
        if (owned[i] == pid)
            return true;
    return false;
}

int exec_become_subreaper(Err *err)
{
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return err_set(err, 500, "internal", "prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
    return 0;
}

size_t exec_reap_orphans(void)
{
    size_t n = 0;
    pthread_mutex_lock(&owned_lock);
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        /* Look first (WNOWAIT): the exited child may be one that its own code
         * reaps, and then the rest waits for the next call. */
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid <= 0 ||
            owned_locked(si.si_pid))
            break;
        if (waitpid(si.si_pid, NULL, WNOHANG) != si.si_pid)
            break;
        n++;
    }
    pthread_mutex_unlock(&owned_lock);
    return n;
}

/* The guard: reads records (int32 process group ids: positive when a job
 * starts, negated once it is reaped) until the worker's end closes, which
 * happens however the worker ends, then kills the groups still listed. */
static _Noreturn void guard_main(int fd)
{
    static pid_t groups[GUARD_GROUPS];
    size_t n = 0;
    for (;;) {
        int32_t rec;
        ssize_t r = recv(fd, &rec, sizeof rec, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof rec)
            break; /* 0: the worker is gone */
        if (rec > 0 && n < GUARD_GROUPS) {
            groups[n++] = rec;
        } else if (rec < 0) {
            for (size_t i = 0; i < n; i++)
                if (groups[i] == -rec) {
                    groups[i] = groups[--n];
                    break;
                }
        }
    }
    for (size_t i = 0; i < n; i++)
        kill(-groups[i], SIGKILL);
    _exit(0);
}

/* In the guard after fork (the worker has no threads yet). */
static _Noreturn void guard_child(int fd)
{
    /* Only SIGKILL ends it: a terminal's ^C reaches the whole process group,
     * and the jobs must stay guarded while the worker stops gracefully. */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    prctl(PR_SET_NAME, "workd-guard");
    if (fd != 3 && dup2(fd, 3) < 0)
        _exit(1);
    /* Hold nothing of the worker's: not its output (a pipe to a logger) either. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int i = 0; i < 3 && null >= 0; i++)
        if (null != i)
            dup2(null, i);
    if (close_range(4, ~0U, 0) != 0)
        for (int i = 4; i < 65536; i++)
            close(i);
    guard_main(3);
}

int exec_guard_start(Err *err)
{
    if (guard_fd >= 0)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return err_set(err, 500, "internal", "cannot start the job guard: socketpair: %s",
                       strerror(errno));
    pthread_mutex_lock(&owned_lock);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        guard_child(sv[1]);
    }
    pthread_mutex_unlock(&owned_lock);
    int fork_errno = errno;
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return err_set(err, 500, "internal", "cannot start the job guard: fork: %s",
                       strerror(fork_errno));
    }
    guard_fd = sv[0];
    guard_pid = pid;
    pthread_mutex_lock(&owned_lock);
    owned_add_locked(pid);
    pthread_mutex_unlock(&owned_lock);
    return 0;
}

void exec_guard_stop(void)
{
    if (guard_fd < 0)
        return;
    close(guard_fd);
    guard_fd = -1;
    while (waitpid(guard_pid, NULL, 0) < 0 && errno == EINTR) {
    }
    owned_remove(guard_pid);
    guard_pid = -1;
}

/* Tells the guard that process group pgid runs a job (running) or was reaped. */
static void guard_note(pid_t pgid, bool running)
{
    if (guard_fd < 0)
        return;
    int32_t rec = running ? (int32_t)pgid : -(int32_t)pgid;
    while (send(guard_fd, &rec, sizeof rec, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

/* ---- ExecCtl ---- */

int exec_ctl_init(ExecCtl *c, Err *err)
{
    memset(c, 0, sizeof *c);
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        return err_set(err, 500, "internal", "pipe: %s", strerror(errno));
    c->wake_rd = p[0];
    c->wake_wr = p[1];
    pthread_mutex_init(&c->lock, NULL);
    return 0;
}

void exec_ctl_destroy(ExecCtl *c)
{
    close(c->wake_rd);
    close(c->wake_wr);
    pthread_mutex_destroy(&c->lock);
}

static void drain(int fd)
{
    char buf[64];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

void exec_ctl_stop(ExecCtl *c, bool at_once)
{
    int level = at_once ? 2 : 1;
    pthread_mutex_lock(&c->lock);
    if (level > c->level) {
        c->level = level;
        if (at_once && c->pgid > 0)
            kill(-c->pgid, SIGKILL);
        char b = 1;
        if (write(c->wake_wr, &b, 1) < 0) {
            /* full pipe: it is readable already, which is all a waiter needs */
        }
    }
    pthread_mutex_unlock(&c->lock);
}

void exec_ctl_reset(ExecCtl *c)
{
    pthread_mutex_lock(&c->lock);
    c->level = 0;
    drain(c->wake_rd);
    pthread_mutex_unlock(&c->lock);
}

static int ctl_level(ExecCtl *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->lock);
    int level = c->level;
    pthread_mutex_unlock(&c->lock);
    return level;
}

bool exec_ctl_wait_stop(ExecCtl *c, int64_t deadline_ms)
{
    for (;;) {
        if (ctl_level(c))
            return true;
        if (deadline_ms < 0)
            return false;
        int64_t left = deadline_ms - mono_ms();
        if (left <= 0)
            return false;
        struct pollfd p = {.fd = c->wake_rd, .events = POLLIN};
        if (poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left) > 0)
            drain(c->wake_rd); /* the level is the truth; the byte only wakes us */
    }
}

/* ---- outcomes ---- */

void exec_outcome_ok(ExecOutcome *o, json_t *result)
{
    o->ok = true;
    o->result = result ? result : json_null();
    o->error = NULL;
    o->retry = false;
}

void exec_outcome_fail(ExecOutcome *o, bool retry, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    o->ok = false;
    o->result = NULL;
    o->error = exec_utf8_clean(msg, strlen(msg));
    o->retry = retry;
}

void exec_outcome_free(ExecOutcome *o)
{
    json_decref(o->result);
    free(o->error);
    o->result = NULL;
    o->error = NULL;
}

/* ---- helpers ---- */

char **exec_env_merge(char *const *base, char *const *add)
{
    size_t nb = strv_len(base), na = strv_len(add), n = 0;
    char **env = xcalloc(nb + na + 1, sizeof *env);
    for (size_t i = 0; i < nb; i++) {
        const char *eq = strchr(base[i], '=');
        size_t len = eq ? (size_t)(eq - base[i]) : strlen(base[i]);
        bool replaced = false;
        for (size_t j = 0; j < na && !replaced; j++)
            replaced = strncmp(add[j], base[i], len) == 0 && add[j][len] == '=';
        if (!replaced)
            env[n++] = xstrdup(base[i]);
    }
    for (size_t j = 0; j < na; j++)
        env[n++] = xstrdup(add[j]);
    env[n] = NULL;
    return env;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

char *exec_utf8_clean(const char *s, size_t n)
{
    char *out = xmalloc(n + 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, j = 0;
    while (i < n) {
        if (u[i] == 0) {
            out[j++] = '?';
            i++;
        } else if (u[i] < 0x80) {
            out[j++] = (char)u[i++];
        } else {
            size_t len = utf8_seq(u + i, n - i);
            if (len == 0) {
                out[j++] = '?';
                i++;
            } else {
                memcpy(out + j, u + i, len);
                i += len;
                j += len;
            }
        }
    }
    out[j] = '\0';
    return out;
}

/* ---- the child ---- */

/* Between fork and exec only async-signal-safe calls: the parent has threads. */
static void child_exec(char *const argv[], char *const envp[], int in_fd, int out_fd, int err_fd,
                       int prog_fd, int prog_num, pid_t parent, const sigset_t *no_signals)
{
    /* Die with the worker. The check closes the race where it died before prctl. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    setpgid(0, 0);
    /* First move the pipe ends above 2, so that none is overwritten by a dup2
     * below when the worker was started with stdin/out/err closed. */
    int low = prog_num > 2 ? prog_num + 1 : 3; /* above every descriptor we place */
    int a = fcntl(in_fd, F_DUPFD, low), b = fcntl(out_fd, F_DUPFD, low),
        c = fcntl(err_fd, F_DUPFD, low), d = prog_fd >= 0 ? fcntl(prog_fd, F_DUPFD, low) : -1;
    if (a < 0 || b < 0 || c < 0 || dup2(a, 0) < 0 || dup2(b, 1) < 0 || dup2(c, 2) < 0)
        _exit(127);
    if (prog_fd >= 0 && (d < 0 || dup2(d, prog_num) < 0)) /* dup2 clears close-on-exec */
        _exit(127);
    unsigned first = prog_fd >= 0 ? (unsigned)prog_num + 1 : 3;
    if (prog_fd >= 0)
        for (int fd = 3; fd < prog_num; fd++)
            close(fd);
    if (close_range(first, ~0U, 0) != 0)
        for (int fd = (int)first; fd < 65536; fd++)
            close(fd);
    /* Ignored signals stay ignored across exec, and the mask is inherited. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < 32; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL);
    sigprocmask(SIG_SETMASK, no_signals, NULL);
    execve("/bin/sh", argv, envp);
    static const char msg[] = "workd-worker: cannot execute /bin/sh\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(127);
}

/* ---- running ---- */

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* Only for descriptors where it cannot fail (our ends of pipes). */
static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Keeps the last EXEC_STDERR_TAIL bytes of stderr (plus slack, trimmed at the end). */
static void tail_append(SBuf *t, bool *cut, const char *data, size_t n)
{
    sbuf_append(t, data, n);
    if (t->len > 2 * EXEC_STDERR_TAIL) {
        memmove(t->data, t->data + t->len - EXEC_STDERR_TAIL, EXEC_STDERR_TAIL);
        t->len = EXEC_STDERR_TAIL;
        t->data[t->len] = '\0';
        *cut = true;
    }
}

/* Appends ": <tail of stderr>" to msg when stderr said anything. */
static void append_tail(SBuf *msg, const SBuf *err_tail, bool cut)
{
    const char *s = err_tail->data ? err_tail->data : "";
    size_t n = err_tail->len;
    if (n > EXEC_STDERR_TAIL) {
        s += n - EXEC_STDERR_TAIL;
        n = EXEC_STDERR_TAIL;
        cut = true;
    }
    if (cut) /* do not start in the middle of a character */
        for (int k = 0; k < 3 && n && ((unsigned char)*s & 0xC0) == 0x80; k++, s++, n--) {
        }
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (!n)
        return;
    sbuf_puts(msg, cut ? ": \xe2\x80\xa6" : ": "); /* U+2026 when the start is cut off */
    sbuf_append(msg, s, n);
}

static void parse_stdout(ExecOutcome *o, const char *data, size_t len)
{
    json_error_t je;
    json_t *j = len ? json_loadb(data, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je) : NULL;
    if (j) {
        exec_outcome_ok(o, j);
        return;
    }
    size_t n = len;
    while (n && (data[n - 1] == '\n' || data[n - 1] == '\r'))
        n--;
    if (n == 0) {
        exec_outcome_ok(o, json_null());
        return;
    }
    json_t *s = json_stringn(data, n);
    if (!s) {
        exec_outcome_fail(o, true, "output is neither JSON nor UTF-8 text (%zu bytes)", len);
        return;
    }
    exec_outcome_ok(o, s);
}

static const char *sig_name(int sig)
{
    const char *n = sigabbrev_np(sig);
    return n ? n : "?";
}

/* The state of one child while it runs. */
typedef struct Child {
    const ExecSpec *spec;
    ExecCtl *ctl;
    pid_t pid;
    int in_fd, out_fd, err_fd, pidfd;
    size_t in_off;
    bool exited, term_sent, kill_sent, got_epipe, too_large;
    bool killed_by_ctl; /* exec_ctl_stop(at_once) may kill it before the loop looks */
    int status;
    int64_t start, timeout_at, kill_at, eof_deadline;
    SBuf out, err;
    bool err_cut;
    int prog_fd;       /* our end of the progress pipe, -1: none */
    int64_t prog_next; /* mono_ms() before which the pipe is not read (its pace) */
    SBuf prog;         /* a progress line not yet ended */
} Child;

/* Passes on every whole line in ch->prog (and, at the end, the rest). */
static void progress_lines(Child *ch, bool end)
{
    size_t start = 0;
    for (size_t i = 0; i < ch->prog.len; i++)
        if (ch->prog.data[i] == '\n') {
            ch->spec->progress(ch->spec->progress_ud, ch->prog.data + start, i - start);
            start = i + 1;
        }
    size_t rest = ch->prog.len - start;
    if (rest && (end || rest >= EXEC_PROGRESS_LINE)) {
        ch->spec->progress(ch->spec->progress_ud, ch->prog.data + start, rest);
        start = ch->prog.len;
    }
    if (start) {
        memmove(ch->prog.data, ch->prog.data + start, ch->prog.len - start);
        ch->prog.len -= start;
        if (ch->prog.data)
            ch->prog.data[ch->prog.len] = '\0';
    }
}

static void progress_read(Child *ch)
{
    char buf[16384];
    for (;;) {
        ssize_t n = read(ch->prog_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            close_fd(&ch->prog_fd);
            break;
        }
        sbuf_append(&ch->prog, buf, (size_t)n);
        progress_lines(ch, false);
    }
}

static void child_signal(Child *ch, int sig, int64_t now)
{
    kill(-ch->pid, sig);
    if (sig == SIGKILL) {
        ch->kill_sent = true;
    } else {
        ch->term_sent = true;
        ch->kill_at = now + (ch->spec->kill_grace_ms > 0 ? ch->spec->kill_grace_ms : 0);
    }
}

/* Ends the run gently (SIGTERM, SIGKILL after the grace) unless that began already. */
static void child_end(Child *ch, int64_t now)
{
    if (ch->term_sent || ch->kill_sent || ch->exited)
        return;
    if (ch->spec->kill_grace_ms > 0)
        child_signal(ch, SIGTERM, now);
    else
        child_signal(ch, SIGKILL, now);
}

/* Reaps the child if it exited. Under the ctl lock, so that exec_ctl_stop()
 * never signals a process group that is gone; leftovers of the group are killed. */
static void child_try_reap(Child *ch, int64_t now)
{
    if (ch->ctl)
        pthread_mutex_lock(&ch->ctl->lock);
    pid_t r = waitpid(ch->pid, &ch->status, WNOHANG);
    if (r == ch->pid || (r < 0 && errno == ECHILD)) {
        if (r < 0)
            ch->status = -1; /* someone else reaped it (SIGCHLD ignored?) */
        kill(-ch->pid, SIGKILL);
        guard_note(ch->pid, false);
        owned_remove(ch->pid);
        ch->exited = true;
        ch->killed_by_ctl = ch->ctl && ch->ctl->level == 2;
        ch->eof_deadline = now + EOF_WAIT_MS;
        if (ch->ctl)
            ch->ctl->pgid = 0;
    }
    if (ch->ctl)
        pthread_mutex_unlock(&ch->ctl->lock);
    if (ch->exited)
        close_fd(&ch->pidfd);
}

static void child_write_input(Child *ch)
{
    const ExecSpec *s = ch->spec;
    while (ch->in_off < s->input_len) {
        ssize_t n = write(ch->in_fd, s->input + ch->in_off, s->input_len - ch->in_off);
        if (n > 0) {
            ch->in_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0 && errno == EPIPE)
            ch->got_epipe = true; /* it does not read its input: fine */
        break;
    }
    close_fd(&ch->in_fd);
}

static void child_read(Child *ch, int *fd, bool is_out, int64_t now)
{
    char buf[16384];
    for (;;) {
        ssize_t n = read(*fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            close_fd(fd);
            return;
        }
        if (!is_out) {
            tail_append(&ch->err, &ch->err_cut, buf, (size_t)n);
        } else if (ch->out.len + (size_t)n > ch->spec->max_output) {
            /* The attempt has failed: stop reading (the child gets EPIPE) and end it. */
            close_fd(fd);
            ch->too_large = true;
            child_end(ch, now);
            return;
        } else {
            sbuf_append(&ch->out, buf, (size_t)n);
        }
    }
}

/* Builds the outcome from how the child ended. */
static void child_outcome(Child *ch, ExecOutcome *o)
{
    const ExecSpec *s = ch->spec;
    int st = ch->status;
    o->exit_code = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    o->term_signal = st >= 0 && WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    o->output_too_large = ch->too_large;
    if (o->stopped) { /* given back: the next attempt starts afresh, nothing more to say */
        exec_outcome_fail(o, true, "worker stopping");
        return;
    }
    if (o->exit_code == 0 && !o->timed_out && !o->output_too_large) {
        parse_stdout(o, ch->out.data ? ch->out.data : "", ch->out.len);
        return; /* a result, or output that is not even text: stderr does not explain that */
    }
    SBuf msg;
    sbuf_init(&msg);
    if (o->timed_out)
        sbuf_printf(&msg, "timed out after %lldms; ", (long long)s->timeout_ms);
    else if (o->output_too_large)
        sbuf_printf(&msg, "output larger than %zu bytes; ", s->max_output);
    if (o->exit_code >= 0)
        sbuf_printf(&msg, "exit %d", o->exit_code);
    else if (o->term_signal == SIGKILL && ch->kill_sent && ch->term_sent)
        sbuf_printf(&msg, "killed by SIGKILL after ignoring SIGTERM for %lldms",
                    (long long)s->kill_grace_ms);
    else if (o->term_signal)
        sbuf_printf(&msg, "killed by signal %d (SIG%s)%s", o->term_signal, sig_name(o->term_signal),
                    WCOREDUMP(st) ? ", core dumped" : "");
    else
        sbuf_puts(&msg, "exit status unknown");
    append_tail(&msg, &ch->err, ch->err_cut);
    o->ok = false;
    o->retry = true;
    o->error = exec_utf8_clean(msg.data, msg.len);
    sbuf_free(&msg);
}

/* Adds fd (if >= 0) to pfd[*n]; returns its index, or -1. */
WARN_UNUSED static int watch(struct pollfd *pfd, int *n, int fd, short events)
{
    if (fd < 0)
        return -1;
    pfd[*n] = (struct pollfd){.fd = fd, .events = events};
    return (*n)++;
}

static int poll_timeout(const Child *ch, int64_t now)
{
    int64_t t = -1;
#define AT_MOST(deadline)                                                                          \
    do {                                                                                           \
        int64_t d_ = (deadline)-now;                                                               \
        if (d_ < 0)                                                                                \
            d_ = 0;                                                                                \
        if (t < 0 || d_ < t)                                                                       \
            t = d_;                                                                                \
    } while (0)
    if (!ch->exited) {
        if (ch->timeout_at >= 0 && !ch->term_sent && !ch->kill_sent)
            AT_MOST(ch->timeout_at);
        if (ch->term_sent && !ch->kill_sent)
            AT_MOST(ch->kill_at);
        if (ch->pidfd < 0)
            AT_MOST(now + REAP_POLL_MS);
        if (ch->prog_fd >= 0 && ch->prog_next > now)
            AT_MOST(ch->prog_next);
    } else {
        AT_MOST(ch->eof_deadline);
    }
#undef AT_MOST
    return t > INT_MAX ? INT_MAX : (int)t;
}

/* Makes the pipes and forks the job's process (under the ctl lock, so that
 * a stop sees either no child or its group). 1: the worker is stopping and no
 * child was made; -1: e says why. Our ends of the pipes go into ch; p holds
 * what is left to close (in, out, err, progress). */
static int child_spawn(Child *ch, const ExecSpec *spec, ExecCtl *ctl, int p[4][2], ExecOutcome *out,
                       Err *e)
{
    bool with_progress = spec->progress_fd > 2 && spec->progress;
    char *argv[] = {"sh", "-c", (char *)spec->cmd, NULL};
    char *const *envp = spec->env ? spec->env : environ;
    sigset_t no_signals;
    sigemptyset(&no_signals);
    if (pipe2(p[0], O_CLOEXEC) != 0 || pipe2(p[1], O_CLOEXEC) != 0 || pipe2(p[2], O_CLOEXEC) != 0 ||
        (with_progress && pipe2(p[3], O_CLOEXEC) != 0))
        return err_set(e, 500, "exec", "cannot run the job: pipe: %s", strerror(errno));
    if (ctl)
        pthread_mutex_lock(&ctl->lock);
    if (ctl && ctl->level) {
        pthread_mutex_unlock(&ctl->lock);
        out->stopped = true;
        exec_outcome_fail(out, true, "worker stopping");
        return 1;
    }
    pid_t parent = getpid();
    pthread_mutex_lock(&owned_lock);
    pid_t pid = fork();
    if (pid == 0)
        child_exec(argv, envp, p[0][0], p[1][1], p[2][1], p[3][1], spec->progress_fd, parent,
                   &no_signals);
    int fork_errno = errno;
    if (pid > 0)
        owned_add_locked(pid);
    pthread_mutex_unlock(&owned_lock);
    if (pid > 0) {
        setpgid(pid, pid); /* also done by the child: whichever runs first wins */
        guard_note(pid, true);
        if (ctl)
            ctl->pgid = pid;
    }
    if (ctl)
        pthread_mutex_unlock(&ctl->lock);
    if (pid < 0)
        return err_set(e, 500, "exec", "cannot run the job: fork: %s", strerror(fork_errno));
    ch->pid = pid;
    close_fd(&p[0][0]);
    close_fd(&p[1][1]);
    close_fd(&p[2][1]);
    close_fd(&p[3][1]);
    ch->prog_fd = p[3][0];
    p[3][0] = -1;
    if (ch->prog_fd >= 0)
        (void)set_nonblock(ch->prog_fd);
    ch->in_fd = p[0][1];
    ch->out_fd = p[1][0];
    ch->err_fd = p[2][0];
    p[0][1] = p[1][0] = p[2][0] = -1;
    /* Only our ends: the child's must stay blocking. Cannot fail on a pipe. */
    set_nonblock(ch->in_fd);
    set_nonblock(ch->out_fd);
    set_nonblock(ch->err_fd);
    ch->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (spec->input_len == 0)
        close_fd(&ch->in_fd);
    return 0;
}

/* Ends the job when the worker stops (level 1: SIGTERM, 2: SIGKILL) or its
 * timeout passes, and kills it when its SIGTERM grace is over. */
static void child_supervise(Child *ch, ExecCtl *ctl, ExecOutcome *out, int64_t now)
{
    if (ch->exited)
        return;
    int level = ctl_level(ctl);
    if (level == 2 && !ch->kill_sent) {
        out->stopped = true;
        child_signal(ch, SIGKILL, now);
    } else if (level == 1 && !ch->term_sent && !ch->kill_sent) {
        out->stopped = true;
        child_end(ch, now);
    }
    if (ch->timeout_at >= 0 && now >= ch->timeout_at && !ch->term_sent && !ch->kill_sent) {
        out->timed_out = true;
        child_end(ch, now);
    }
    if (ch->term_sent && !ch->kill_sent && now >= ch->kill_at)
        child_signal(ch, SIGKILL, now);
}

/* Waits once for the job's pipes, its exit or the ctl's wake, and serves what
 * came. -1 (e says why): the job could not be watched any more, so it was
 * killed and reaped rather than left unsupervised. */
static int child_wait_once(Child *ch, ExecCtl *ctl, int64_t now, Err *e)
{
    struct pollfd pfd[6];
    int n = 0;
    int i_in = watch(pfd, &n, ch->in_fd, POLLOUT);
    int i_out = watch(pfd, &n, ch->out_fd, POLLIN);
    int i_err = watch(pfd, &n, ch->err_fd, POLLIN);
    int i_pid = watch(pfd, &n, ch->pidfd, POLLIN);
    int i_wake = watch(pfd, &n, ctl && !ch->exited && !ch->kill_sent ? ctl->wake_rd : -1, POLLIN);
    /* Paced while the job runs; at its end, until the pipe's EOF. */
    bool read_prog = ch->exited || now >= ch->prog_next;
    int i_prog = watch(pfd, &n, read_prog ? ch->prog_fd : -1, POLLIN);
    int rc = poll(pfd, (nfds_t)n, poll_timeout(ch, now));
    if (rc < 0 && errno != EINTR) {
        err_set(e, 500, "exec", "cannot watch the job: poll: %s", strerror(errno));
        kill(-ch->pid, SIGKILL);
        if (ctl)
            pthread_mutex_lock(&ctl->lock);
        while (waitpid(ch->pid, &ch->status, 0) < 0 && errno == EINTR) {
        }
        guard_note(ch->pid, false);
        owned_remove(ch->pid);
        if (ctl) {
            ctl->pgid = 0;
            pthread_mutex_unlock(&ctl->lock);
        }
        return -1;
    }
    now = mono_ms();
    if (rc <= 0) {
        if (ch->pidfd < 0 && !ch->exited)
            child_try_reap(ch, now);
        return 0;
    }
    if (i_wake >= 0 && pfd[i_wake].revents)
        drain(ctl->wake_rd);
    if (i_in >= 0 && pfd[i_in].revents)
        child_write_input(ch);
    if (i_out >= 0 && pfd[i_out].revents)
        child_read(ch, &ch->out_fd, true, now);
    if (i_err >= 0 && pfd[i_err].revents)
        child_read(ch, &ch->err_fd, false, now);
    if (i_prog >= 0 && pfd[i_prog].revents) {
        progress_read(ch);
        ch->prog_next = now + ch->spec->progress_pace_ms;
    }
    if ((i_pid >= 0 && pfd[i_pid].revents) || (ch->pidfd < 0 && !ch->exited))
        child_try_reap(ch, now);
    return 0;
}

int exec_run(const ExecSpec *spec, ExecCtl *ctl, ExecOutcome *out, Err *err)
{
    memset(out, 0, sizeof *out);
    out->exit_code = -1;
    Child ch = {.spec = spec,
                .ctl = ctl,
                .pid = -1,
                .in_fd = -1,
                .out_fd = -1,
                .err_fd = -1,
                .pidfd = -1,
                .timeout_at = -1,
                .kill_at = -1,
                .eof_deadline = -1,
                .prog_fd = -1};
    sbuf_init(&ch.out);
    sbuf_init(&ch.err);
    sbuf_init(&ch.prog);
    ch.start = mono_ms();
    Err e;
    err_clear(&e);
    if (spec->timeout_ms > 0)
        ch.timeout_at = ch.start + spec->timeout_ms;
    int pipes[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}}; /* in, out, err, progress */
    sigset_t pipe_set, saved_mask;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    /* Writing to a child that stopped reading must give EPIPE, not kill us. */
    pthread_sigmask(SIG_BLOCK, &pipe_set, &saved_mask);

    int ret = child_spawn(&ch, spec, ctl, pipes, out, &e);
    if (ret == 1)
        ret = 0; /* stopping: no job was started, out says so */
    else if (ret == 0) {
        for (;;) {
            int64_t now = mono_ms();
            child_supervise(&ch, ctl, out, now);
            if (ch.exited &&
                ((ch.out_fd < 0 && ch.err_fd < 0 && ch.prog_fd < 0) || now >= ch.eof_deadline))
                break;
            if ((ret = child_wait_once(&ch, ctl, now, &e)) != 0)
                break;
        }
    }
    if (ret == 0 && ch.pid > 0) {
        out->elapsed_ms = mono_ms() - ch.start;
        if (ch.prog_fd >= 0)
            progress_read(&ch); /* what is left in the pipe */
        if (spec->progress_fd > 2 && spec->progress)
            progress_lines(&ch, true);
        if (ch.killed_by_ctl)
            out->stopped = true;
        child_outcome(&ch, out);
    }
    if (ret != 0) {
        out->elapsed_ms = mono_ms() - ch.start;
        exec_outcome_fail(out, true, "%s", e.msg);
        if (err)
            *err = e;
    }
    close_fd(&ch.in_fd);
    close_fd(&ch.out_fd);
    close_fd(&ch.err_fd);
    close_fd(&ch.pidfd);
    close_fd(&ch.prog_fd);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            close_fd(&pipes[i][j]);
    sbuf_free(&ch.prog);
    sbuf_free(&ch.out);
    sbuf_free(&ch.err);
    if (ch.got_epipe) {
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
    return ret;
}
