/* workd: the command line of workd. Submits, reads, waits for, cancels and
 * retries work, follows the results stream, and runs the operator's commands
 * (queues, schedules, subscriptions, cluster, workers) over the public HTTP
 * API. main() picks the sub-command from a table and returns its exit code. */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

#ifndef WORKD_VERSION
#define WORKD_VERSION "unknown"
#endif

typedef struct Command {
    const char *name;
    int (*fn)(Cli *cli, int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"submit", cmd_submit, "submit work: a payload, or JSON lines with --bulk"},
    {"get", cmd_get, "show work items (status, attempts, result), or their history"},
    {"list", cmd_list, "list work, newest first, by status and queue"},
    {"wait", cmd_wait, "wait until work finishes; exit 0 completed, 1 dead or cancelled"},
    {"cancel", cmd_cancel, "cancel open work, by id or in bulk"},
    {"retry", cmd_retry, "reopen dead work, by id or in bulk"},
    {"tail", cmd_tail, "follow the results stream, resuming after a dropped connection"},
    {"queues", cmd_queues, "queue statistics; pause, resume, limits, keys"},
    {"schedules", cmd_schedules, "cron schedules: list, get, set, pause, resume, delete"},
    {"subscriptions", cmd_subscriptions, "webhook subscriptions: list, get, set, delete"},
    {"cluster", cmd_cluster, "the leader's view: nodes, database, open work"},
    {"workers", cmd_workers, "the workers, their capacity and running attempts"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(Cli *cli, FILE *out)
{
    fprintf(out, "usage: workd [global flags] COMMAND [flags] [arguments]\n\n"
                 "The command line of workd, a distributed work queue: it speaks the HTTP API\n"
                 "of the servers named by --server or WORKD_SERVER, with the token in\n"
                 "WORKD_TOKEN.\n\nCommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    cli_global_usage(cli, out);
    fprintf(out, "\n`workd COMMAND --help` shows a command's flags; docs/cli.md has examples.\n"
                 "Exit codes: 0 ok, 1 work dead or cancelled, 2 usage or invalid request, 3 not "
                 "found,\n4 conflict, 5 server unavailable, 6 token refused, 7 wait timed "
                 "out.\n");
}

static Cli *signal_cli; /* for the handler only: the one Cli of the process */

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&signal_cli->stop, true);
}

int main(int argc, char **argv)
{
    Cli cli = {0};
    cli_init(&cli, "workd");
    /* Global flags may come before the command: find the command's word. */
    int at = 1;
    while (at < argc && argv[at][0] == '-') {
        const char *a = argv[at];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(&cli, stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--version")) {
            printf("workd %s\n", WORKD_VERSION);
            return CLI_OK;
        }
        bool takes_value =
            !strcmp(a, "--server") || !strcmp(a, "--token") || !strcmp(a, "--retry-for");
        at += takes_value ? 2 : 1;
    }
    if (at >= argc) {
        usage(&cli, stderr);
        return CLI_USAGE;
    }
    const Command *cmd = NULL;
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[at], commands[i].name))
            cmd = &commands[i];
    if (!cmd) {
        fprintf(stderr, "workd: unknown command '%s' (see workd --help)\n", argv[at]);
        return CLI_USAGE;
    }
    /* The command sees its own name first, then the global flags given before
     * it and its own arguments: one parser takes them all. */
    char *args[argc];
    int n = 0;
    args[n++] = argv[at];
    for (int i = 1; i < at; i++)
        args[n++] = argv[i];
    for (int i = at + 1; i < argc; i++)
        args[n++] = argv[i];

    signal_cli = &cli;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = cmd->fn(&cli, n, args);
    client_free(cli.client);
    curl_global_cleanup();
    if (fflush(stdout) != 0 && rc == CLI_OK)
        rc = CLI_UNAVAILABLE; /* nothing sensible to print to */
    return rc;
}
