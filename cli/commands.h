/* commands: the sub-commands of `workd`. Each takes the process's Cli and its
 * own argv (argv[0] is its name) and returns the exit code (cli.h). */
#ifndef WORKD_CLI_COMMANDS_H
#define WORKD_CLI_COMMANDS_H

#include "cli.h"

/* ---- work (cmd_work.c) ---- */
int cmd_submit(Cli *cli, int argc, char **argv);
int cmd_get(Cli *cli, int argc, char **argv);
int cmd_list(Cli *cli, int argc, char **argv);
int cmd_wait(Cli *cli, int argc, char **argv);
int cmd_cancel(Cli *cli, int argc, char **argv);
int cmd_retry(Cli *cli, int argc, char **argv);

/* ---- the results stream (cmd_tail.c) ---- */
int cmd_tail(Cli *cli, int argc, char **argv);

/* ---- operations (cmd_admin.c) ---- */
int cmd_queues(Cli *cli, int argc, char **argv);
int cmd_schedules(Cli *cli, int argc, char **argv);
int cmd_subscriptions(Cli *cli, int argc, char **argv);
int cmd_cluster(Cli *cli, int argc, char **argv);
int cmd_workers(Cli *cli, int argc, char **argv);

#endif
