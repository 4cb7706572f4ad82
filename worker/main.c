/* workd-worker: reads its settings, starts the worker and turns signals into a
 * graceful stop (first SIGTERM/SIGINT) or an immediate one (the second). */
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config.h"
#include "err.h"
#include "exec.h"
#include "httpc.h"
#include "log.h"
#include "servers.h"
#include "util.h"
#include "worker.h"

#define SYNOPSIS                                                                                   \
    "usage: workd-worker [options] (--exec CMD | --demo | --noop)\n\n"                             \
    "Registers with a workd server, pulls jobs and runs them: with --exec each job is\n"           \
    "`/bin/sh -c CMD` with the payload JSON on stdin and WORKD_WORK_ID, WORKD_ATTEMPT and\n"       \
    "WORKD_QUEUE set (and TRACEPARENT, TRACESTATE when the work has a trace context); exit 0\n"    \
    "with JSON (or text) on stdout is the result. The payload and these variables are the\n"       \
    "producer's: quote them (\"$TRACESTATE\"), never eval them. SIGTERM or SIGINT stops\n"         \
    "gracefully; a second one stops at once."

typedef struct Options {
    char *server, *queues, *id, *exec, *token, *log_level, *log_format;
    int64_t concurrency, max_output, progress_interval;
    int64_t demo_delay, poll_wait, grace, kill_grace;
    bool demo, noop;
} Options;

#define HOUR_MS (3600LL * 1000)

WARN_UNUSED static int check(Options *o, WorkerConfig *cfg, char ***queues, char *id_buf,
                             size_t id_len, LogLevel *level, bool *json, Err *err)
{
    int kinds = (o->exec && *o->exec) + o->demo + o->noop;
    if (kinds != 1)
        return err_set(err, 400, "bad-config",
                       "choose exactly one of --exec CMD, --demo and --noop (see --help)");
    Servers *servers = servers_new(o->server, "--server", err);
    if (!servers)
        return -1;
    servers_free(servers);
    if (o->id && *o->id) {
        if (!id_valid(o->id))
            return err_set(err, 400, "bad-config",
                           "--id: '%s' is not 1-128 characters of [A-Za-z0-9._:@-]", o->id);
        snprintf(id_buf, id_len, "%s", o->id);
    } else {
        char host[256] = "worker";
        if (gethostname(host, sizeof host) != 0 || !host[0])
            snprintf(host, sizeof host, "worker");
        host[100] = '\0';
        for (char *p = host; *p; p++)
            if (!isalnum((unsigned char)*p) && !strchr("._:@-", *p))
                *p = '-';
        /* %.100s: the bound the compiler can see (an id is at most 128). */
        snprintf(id_buf, id_len, "%.100s-%ld", host, (long)getpid());
    }
    *queues = strv_split(o->queues);
    for (char **q = *queues; *q; q++)
        if (!id_valid(*q))
            return err_set(err, 400, "bad-config",
                           "--queues: '%s' is not 1-128 characters of [A-Za-z0-9._:@-]", *q);
    if (log_level_parse(o->log_level, level) != 0)
        return err_set(err, 400, "bad-config",
                       "--log-level: '%s' is not one of debug, info, warn, error", o->log_level);
    if (strcmp(o->log_format, "text") != 0 && strcmp(o->log_format, "json") != 0)
        return err_set(err, 400, "bad-config", "--log-format: '%s' is not text or json",
                       o->log_format);
    *json = strcmp(o->log_format, "json") == 0;
    *cfg = (WorkerConfig){
        .server = o->server,
        .id = id_buf,
        .token = o->token,
        .queues = *queues,
        .concurrency = (int)o->concurrency,
        .kind = o->exec && *o->exec ? WORK_EXEC
                : o->demo           ? WORK_DEMO
                                    : WORK_NOOP,
        .exec_cmd = o->exec,
        .demo_delay_ms = o->demo_delay,
        .poll_wait_ms = o->poll_wait,
        .grace_ms = o->grace,
        .kill_grace_ms = o->kill_grace,
        .max_output = (size_t)o->max_output,
        .progress_interval_ms = o->progress_interval,
    };
    return 0;
}

/* Wipes the bytes of `value` from the process's original environment and
 * arguments (what /proc/PID/environ and /proc/PID/cmdline show, whatever
 * environ points to later), and removes WORKD_TOKEN from the environment. */
static void hide_token(int argc, char **argv, const char *value)
{
    size_t n = value ? strlen(value) : 0;
    if (!n)
        return;
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "WORKD_TOKEN=", 12))
            explicit_bzero(*e + 12, strlen(*e + 12));
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "--token") && i + 1 < argc)
            explicit_bzero(argv[i + 1], strlen(argv[i + 1]));
        else if (!strncmp(a, "--token=", 8))
            explicit_bzero(a + 8, strlen(a + 8));
    }
    unsetenv("WORKD_TOKEN");
}

/* Waits for the stop to complete or for signals; returns the exit status.
 * Meanwhile, once a second, collects what jobs left behind (exec.h). */
static int supervise(Worker *w, int sfd)
{
    int signals = 0;
    for (;;) {
        exec_reap_orphans();
        struct pollfd p[2] = {{.fd = sfd, .events = POLLIN},
                              {.fd = worker_done_fd(w), .events = POLLIN}};
        int ready = poll(p, 2, 1000);
        if (ready == 0)
            continue;
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            log_error("cannot wait for signals any more (poll: %s): stopping", strerror(errno));
            worker_stop(w);
            return 0;
        }
        if (p[1].revents)
            return 0;
        if (!p[0].revents)
            continue;
        struct signalfd_siginfo si;
        if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si)
            continue;
        int sig = (int)si.ssi_signo;
        if (++signals == 1) {
            log_info("got SIG%s: stopping gracefully (send it again to stop at once)",
                     sigabbrev_np(sig));
            worker_stop(w);
        } else {
            log_warn("got SIG%s while stopping: killing running jobs, stopping at once",
                     sigabbrev_np(sig));
            worker_kill_jobs(w);
            return 128 + sig;
        }
    }
}

#ifdef WORKD_JEMALLOC
extern const char *malloc_conf;
const char *malloc_conf = WORKD_MALLOC_CONF; /* read by jemalloc at its start */
#endif

/* A job runs as our user unless the operator says otherwise
 * (docs/operations.md): it must not find the token in /proc/$PPID. The token
 * is kept in token only; our /proc entries become readable by root alone (as
 * ssh-agent does), which also covers /proc/$PPID/mem. And this process reaps
 * what jobs leave behind. */
static void keep_from_jobs(int argc, char **argv, const char *token)
{
    Err err = {0};
    hide_token(argc, argv, token);
    if (prctl(PR_SET_DUMPABLE, 0) != 0)
        log_warn("prctl(PR_SET_DUMPABLE, 0): %s: jobs may read this process's memory",
                 strerror(errno));
    if (exec_become_subreaper(&err) != 0)
        log_warn("%s: processes that jobs leave behind are reaped only when this is PID 1",
                 err.msg);
}

/* SIGINT and SIGTERM as a signalfd (-1, logged, on failure); SIGPIPE
 * ignored. Called before any thread exists, so that every thread inherits
 * the mask and only the signalfd receives these. Jobs get a clean mask
 * (exec.c). */
static int signals_fd(void)
{
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (sfd < 0)
        log_error("signalfd: %s", strerror(errno));
    return sfd;
}

int main(int argc, char **argv)
{
    Options o = {0};
    OptSpec specs[] = {
        {"server", OPT_LIST, &o.server, "http://127.0.0.1:8080",
         "base URL of a workd server or of a load balancer; several (repeated or "
         "comma-separated) are tried in turn when one cannot be reached",
         0, 0},
        {"concurrency", OPT_INT, &o.concurrency, "2", "jobs run at once (1..1024)", 1, 1024},
        {"queues", OPT_STRING, &o.queues, "",
         "comma-separated queues to take work from (empty: all)", 0, 0},
        {"id", OPT_STRING, &o.id, NULL, "worker id, stable across restarts (default: hostname-pid)",
         0, 0},
        {"exec", OPT_STRING, &o.exec, NULL,
         "run each job as /bin/sh -c CMD (payload on stdin, result on stdout)", 0, 0},
        {"demo", OPT_BOOL, &o.demo, "false", "run the built-in demo job (squares a number)", 0, 0},
        {"noop", OPT_BOOL, &o.noop, "false", "complete every job at once with result null", 0, 0},
        {"demo-delay", OPT_DURATION, &o.demo_delay, "1s",
         "longest random delay of a demo job (0: none)", 0, HOUR_MS},
        {"poll-wait", OPT_DURATION, &o.poll_wait, "20s",
         "how long a pull may wait for work at the server (whole seconds)", 0, HOUR_MS},
        {"grace", OPT_DURATION, &o.grace, "30s",
         "on SIGTERM, how long running jobs may still take before they are given back", 0,
         24 * HOUR_MS},
        {"kill-grace", OPT_DURATION, &o.kill_grace, "5s",
         "how long a job that must end has between SIGTERM and SIGKILL", 0, HOUR_MS},
        {"max-output", OPT_INT, &o.max_output, "1048576",
         "bytes a job may write to stdout; more fails the attempt", 1, 1LL << 30},
        {"progress-interval", OPT_DURATION, &o.progress_interval, "200ms",
         "an --exec job's progress (lines on descriptor 3) is sent at most this often, merged", 10,
         HOUR_MS},
        {"token", OPT_STRING, &o.token, NULL, "bearer token for the server (optional)", 0, 0},
        {"log-level", OPT_STRING, &o.log_level, "info", "debug, info, warn or error", 0, 0},
        {"log-format", OPT_STRING, &o.log_format, "text", "text or json", 0, 0},
    };
    const size_t nspecs = sizeof specs / sizeof specs[0];

    int status = 2, sfd = -1;
    bool json = false, curl_ready = false;
    char **queues = NULL;
    char id[ID_MAX + 1];
    LogLevel level = LOG_INFO;
    WorkerConfig cfg;
    Worker *w = NULL;
    Err err;
    err_clear(&err);

    int cli = config_cli(specs, nspecs, argc, argv, 1, "workd-worker", SYNOPSIS);
    if (cli != 0) {
        status = cli > 0 ? 0 : 2;
        goto cleanup;
    }
    if (check(&o, &cfg, &queues, id, sizeof id, &level, &json, &err) != 0) {
        fprintf(stderr, "workd-worker: %s\n", err.msg);
        status = 2;
        goto cleanup;
    }
    log_setup(id, "worker", level, json);

    keep_from_jobs(argc, argv, o.token);
    if ((sfd = signals_fd()) < 0) {
        status = 1;
        goto cleanup;
    }

    httpc_global_init();
    curl_ready = true;
    w = worker_new(&cfg, &err);
    if (!w || worker_start(w, &err) != 0) {
        log_error("cannot start: %s", err.msg);
        status = 1;
        goto cleanup;
    }
    status = supervise(w, sfd);
    if (status != 0) {
        /* The immediate stop: children are dead; threads may be in the middle of
         * requests, so leave without unwinding them. */
        _exit(status);
    }
    worker_join(w);
    if (worker_failed(w))
        status = 1;
cleanup:
    worker_free(w);
    if (curl_ready)
        httpc_global_cleanup();
    if (sfd >= 0)
        close(sfd);
    strv_free(queues);
    config_free(specs, nspecs);
    return status;
}
