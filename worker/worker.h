/* worker: the worker's control loop. It registers and heartbeats, long-polls
 * for as many jobs as it has free slots, runs each job in an executor slot and
 * hands the outcome to the reporter; it stops gracefully on request. The
 * control threads never wait on a job. */
#ifndef WORKD_WORKER_H
#define WORKD_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef enum {
    WORK_EXEC, /* /bin/sh -c exec_cmd, as a child process per job */
    WORK_DEMO, /* the built-in demo job, in the slot's thread */
    WORK_NOOP, /* completes at once with result null (benchmarks) */
} WorkKind;

/* Everything the worker needs to know. worker_new() copies it. */
typedef struct WorkerConfig {
    const char *server;  /* base URLs, comma-separated: http://127.0.0.1:8080,http://... */
    const char *id;      /* worker id, valid per id_valid() */
    const char *token;   /* bearer token, NULL or "" for none */
    char *const *queues; /* NULL-terminated; NULL or empty: every queue */
    int concurrency;     /* executor slots, >= 1 */
    WorkKind kind;
    const char *exec_cmd; /* WORK_EXEC only */
    int64_t demo_delay_ms;
    int64_t poll_wait_ms;         /* long-poll wait asked for (sent in whole seconds, rounded up) */
    int64_t grace_ms;             /* graceful stop: how long running jobs may still take */
    int64_t kill_grace_ms;        /* SIGTERM -> SIGKILL for jobs that overrun or must stop */
    size_t max_output;            /* bytes of stdout a job may write */
    int64_t progress_interval_ms; /* WORK_EXEC: a job's progress is sent at most this often */
} WorkerConfig;

typedef struct Worker Worker;

/* ---- life cycle (call these from one thread, in this order) ---- */

/* Copies cfg and prepares the worker; no thread runs yet. Reads the
 * environment (for the jobs' environment) and, for WORK_EXEC, forks the job
 * guard (exec_guard_start), so call it before threads start. */
Worker *worker_new(const WorkerConfig *cfg, Err *err) WARN_UNUSED;
/* Starts the threads: reporter, executor slots, heartbeat (which registers),
 * pull and the one that carries out a stop. On failure nothing is left running. */
int worker_start(Worker *w, Err *err) WARN_UNUSED;
/* Waits until a graceful stop is complete (see worker_stop). */
void worker_join(Worker *w);
/* Frees the worker; after worker_join, or after a failed worker_start. */
void worker_free(Worker *w);

/* ---- from any thread ---- */

/* Begins a graceful stop and returns at once: stop pulling, let running jobs
 * finish within the grace period, give back the rest (killing their children),
 * flush the reports for a bounded time, deregister. Idempotent. */
void worker_stop(Worker *w);
/* A descriptor that becomes readable when the graceful stop is complete. */
int worker_done_fd(const Worker *w);
/* Whether the worker stopped by itself because the server refused it for good
 * (a wrong token): its process should exit with an error. */
bool worker_failed(Worker *w);
/* Sends SIGKILL to every running job's process group now, for a stop that
 * cannot wait; jobs started afterwards are killed at once too. */
void worker_kill_jobs(Worker *w);

/* ---- reading the server's answers (no network: for tests and fuzzing) ---- */

/* Reads the answer body to a pull as the pull thread does: *n is the length of
 * its "jobs" array and *runnable how many of those the worker would run (the
 * others, without a valid id and attempt, are ignored). Returns -1 (err says
 * why) when body is not {"jobs": [...]}. */
int worker_read_pull_answer(const char *body, size_t *n, size_t *runnable, Err *err) WARN_UNUSED;
/* The heartbeat interval an answer to PUT /workers/{id} asks for, bounded to
 * [100, 60000] ms; interval when it asks for none. */
int64_t worker_read_heartbeat_answer(const char *body, int64_t interval);

#endif
