/* workd-bench: the load generator of `make bench`. Each sub-command measures
 * one figure against servers that scripts/bench started, from one process and
 * one thread (libcurl multi: many connections at once), and prints one
 * key=value line named by its first field. */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "phases.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *what;
} commands[] = {
    {"drain", bench_drain, "bulk-submit N jobs, then time the workers draining them"},
    {"submit", bench_submit, "one job per POST from C concurrent clients: rate and latency"},
    {"latency", bench_latency, "open loop at R jobs/s: submit-to-result latency on /results"},
    {"failover", bench_failover, "kill -9 the leader under load: gaps until accepting and flowing"},
    {"recovery", bench_recovery, "a starting leader with a big history: time until it serves"},
    {"idle", bench_idle, "CPU and memory of a node holding idle streams and long-polls"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: workd-bench COMMAND [options]   (COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].what);
}

int bench_options(const char *synopsis, const OptSpec *specs, size_t n, int argc, char **argv)
{
    char prog[64];
    snprintf(prog, sizeof prog, "workd-bench %s", argv[0]);
    int cli = config_cli(specs, n, argc, argv, 1, prog, synopsis);
    if (cli != 0)
        return cli;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* Thousands of connections from one process: lift the descriptor limit. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            curl_global_init(CURL_GLOBAL_DEFAULT);
            int rc = commands[i].fn(argc - 1, argv + 1);
            curl_global_cleanup();
            return rc;
        }
    fprintf(stderr, "workd-bench: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
