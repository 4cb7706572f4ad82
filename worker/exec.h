/* exec: runs one job as a child process (`/bin/sh -c CMD`) with the payload on
 * stdin, a timeout, a bound on its output and a way to stop it from another
 * thread, and turns what happened into an outcome. Knows nothing of HTTP. */
#ifndef WORKD_EXEC_H
#define WORKD_EXEC_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

/* How much of the end of stderr an error message carries. */
#define EXEC_STDERR_TAIL 2048

/* ---- stopping a job from another thread ---- */

/* One per executor slot. The executor's thread runs jobs with it; any other
 * thread may call exec_ctl_stop(). The lock guards level and pgid. */
typedef struct ExecCtl {
    pthread_mutex_t lock;
    int level;  /* 0 run; 1 stop (SIGTERM, SIGKILL after the kill grace); 2 kill at once */
    pid_t pgid; /* process group of the running child, 0 when none */
    int wake_rd, wake_wr; /* self-pipe: readable once level has risen */
} ExecCtl;

int exec_ctl_init(ExecCtl *c, Err *err) WARN_UNUSED;
void exec_ctl_destroy(ExecCtl *c);
/* Asks the job running (or the next one started) with c to stop. With at_once
 * its process group gets SIGKILL before this returns; otherwise SIGTERM, then
 * SIGKILL after the kill grace. Sticky until exec_ctl_reset(). Thread-safe
 * (not async-signal-safe). */
void exec_ctl_stop(ExecCtl *c, bool at_once);
/* Back to "run". Only while no job runs with c. */
void exec_ctl_reset(ExecCtl *c);
/* True once exec_ctl_stop() was called; if deadline_ms >= 0, waits (without
 * spinning) until that mono_ms() time for it to happen. For jobs run in a thread. */
bool exec_ctl_wait_stop(ExecCtl *c, int64_t deadline_ms);

/* ---- running a command ---- */

typedef struct ExecSpec {
    const char *cmd;   /* shell command, run as /bin/sh -c cmd */
    const char *input; /* bytes for stdin (may be NULL when input_len is 0) */
    size_t input_len;
    char *const *env;      /* whole environment, NULL-terminated; NULL: inherit ours */
    int64_t timeout_ms;    /* <= 0: none */
    int64_t kill_grace_ms; /* SIGTERM -> SIGKILL delay, after a timeout or a stop */
    size_t max_output;     /* bytes of stdout allowed; more fails the job */
    /* Progress (0: none): the child gets the write end of a pipe as this
     * descriptor number (3 and up); each line it writes there goes to
     * progress(ud, line, len) (without its newline, cut at EXEC_PROGRESS_LINE
     * bytes). On the calling thread. The pipe is read at most every
     * progress_pace_ms (0: whenever the child writes): what a job writes in
     * between waits in the pipe and is read in one wake-up, not one per line
     * (a full pipe, 64 KiB, makes the job's write wait). */
    int progress_fd;
    int64_t progress_pace_ms;
    void (*progress)(void *ud, const char *line, size_t len);
    void *progress_ud;
} ExecSpec;

/* The longest progress line passed on whole; longer ones come in pieces. */
#define EXEC_PROGRESS_LINE 65536

/* What became of one job. Exactly one of result (ok) and error (!ok) is set. */
typedef struct ExecOutcome {
    bool ok;
    json_t *result;        /* ok: the result (a reference owned by the outcome) */
    char *error;           /* !ok: one line saying why, then the stderr tail (owned) */
    bool retry;            /* !ok: whether another attempt could do better */
    int exit_code;         /* -1 unless the child exited */
    int term_signal;       /* 0 unless the child was killed by a signal */
    bool timed_out;        /* overran timeout_ms */
    bool output_too_large; /* stdout passed max_output */
    bool stopped;          /* stopped through the ExecCtl (or never started because of it) */
    int64_t elapsed_ms;
} ExecOutcome;

/* ---- jobs do not outlive the worker ---- */

/* Starts the guard: a small process that holds the other end of a socket and,
 * when the worker dies in any way (even SIGKILL), kills the process group of
 * every job still running. PR_SET_PDEATHSIG alone reaches only the shell the
 * worker forks, not the commands that shell starts. Call it once, before any
 * thread starts; without it exec_run works the same, minus that guarantee. */
int exec_guard_start(Err *err) WARN_UNUSED;
/* Ends the guard (it kills nothing that is no longer running) and reaps it.
 * Only while no job runs. Idempotent. */
void exec_guard_stop(void);

/* ---- what jobs leave behind ---- */

/* A job's processes that outlive its shell are re-parented to the nearest
 * "subreaper" ancestor, or to PID 1, which the worker is in a container
 * without an init: their exit status must then be collected here, or they
 * stay zombies. exec_become_subreaper() makes the worker that reaper in any
 * case (PR_SET_CHILD_SUBREAPER), so the behaviour does not depend on where it
 * runs; call it once at start. */
int exec_become_subreaper(Err *err) WARN_UNUSED;
/* Collects every exited child except the ones exec_run and the guard reap
 * themselves (a job's shell, the guard). Returns how many. Call it regularly
 * (about once a second) from one thread; thread-safe with exec_run. */
size_t exec_reap_orphans(void);

/* Runs spec->cmd in a new process group and waits for it, enforcing the timeout
 * and output bound and obeying ctl (may be NULL). The child gets
 * PR_SET_PDEATHSIG(SIGKILL) tied to the calling thread, so the thread must not
 * exit while a job runs (executor threads are long-lived), and its process
 * group is known to the guard (if started) until it is reaped. When the command
 * exits, anything it left running in its process group is killed.
 *
 * Exit 0: stdout parsed as JSON, or taken as a JSON string (trailing newlines
 * trimmed), empty stdout is null. Anything else is a failed outcome.
 * Returns -1 only when the job could not be run at all (pipes, fork): err says
 * why and *out is a failed outcome too. On return *out is filled either way;
 * free it with exec_outcome_free(). Safe to call from several threads at once. */
int exec_run(const ExecSpec *spec, ExecCtl *ctl, ExecOutcome *out, Err *err) WARN_UNUSED;

/* Helpers that fill *o (any previous content is not freed). */
void exec_outcome_ok(ExecOutcome *o, json_t *result /* stolen; NULL means null */);
void exec_outcome_fail(ExecOutcome *o, bool retry, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void exec_outcome_free(ExecOutcome *o);

/* Returns a new environment: the entries of base (NULL-terminated, may be NULL)
 * whose names are not in add, then add. Entries are "NAME=value". The caller
 * frees it with strv_free(). */
char **exec_env_merge(char *const *base, char *const *add);

/* Copies at most n bytes of s into a new string that is valid UTF-8 without NUL
 * bytes (anything else becomes '?'), so it can go into a JSON string. Free it. */
char *exec_utf8_clean(const char *s, size_t n);

#endif
