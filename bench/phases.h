/* phases: the figures workd-bench measures, one sub-command each. Every one
 * prints a single line of key=value pairs on stdout whose first field names
 * the figure (bench=drain ...) and returns the process exit status. */
#ifndef WORKD_BENCH_PHASES_H
#define WORKD_BENCH_PHASES_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/* ---- the sub-commands (argv[0] is the sub-command's name) ---- */
int bench_drain(int argc, char **argv);
int bench_submit(int argc, char **argv);
int bench_latency(int argc, char **argv);
int bench_failover(int argc, char **argv);
int bench_recovery(int argc, char **argv);
int bench_idle(int argc, char **argv);

/* ---- shared by them ---- */
/* Parses a sub-command's options (argv[1..]). Returns 0 to go on, 1 when help
 * was printed (exit 0), -1 after printing why the options are wrong (exit 2). */
int bench_options(const char *synopsis, const OptSpec *specs, size_t n, int argc, char **argv);

#endif
