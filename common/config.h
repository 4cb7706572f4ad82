/* config: command-line flags with WORKD_* environment fallbacks, described by a
 * table so that parsing, validation and --help come from one place.
 * Precedence: flag, then environment variable, then the default. */
#ifndef WORKD_CONFIG_H
#define WORKD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"

typedef enum {
    OPT_STRING,   /* char ** (owned by the caller after parsing: free with config_free) */
    OPT_INT,      /* int64_t *, bounded by [min, max] */
    OPT_DURATION, /* int64_t * milliseconds: "2s", "250ms", "1.5" (seconds); bounded in ms */
    OPT_BOOL,     /* bool *: a flag without a value; env accepts 1/0/true/false/yes/no */
    OPT_LIST,     /* char ** as OPT_STRING, a comma-separated list: a flag given several
                     times adds to it ("--server A --server B" is "A,B"); the first one on
                     the command line replaces the environment's or the default's value */
} OptType;

typedef struct OptSpec {
    const char *name; /* long flag without "--"; env var is WORKD_ + NAME_IN_CAPS */
    OptType type;
    void *target;
    const char *def; /* default as text (NULL: no default / empty) */
    const char *help;
    int64_t min, max; /* for OPT_INT and OPT_DURATION; ignored when min == max == 0 */
} OptSpec;

/* Parses argv[first..argc) and the environment into the targets. Stops at the
 * first non-flag argument and stores its index in *rest (argc if none).
 * Sets *help_wanted when --help or -h is given. On a bad value returns -1 and
 * err names the setting. */
int config_parse(const OptSpec *specs, size_t n, int argc, char **argv, int first, int *rest,
                 bool *help_wanted, Err *err) WARN_UNUSED;

/* The command-line front of config_parse for a main(): --help (anywhere, and
 * before any environment value is judged) prints the usage; a bad setting or a
 * stray argument is reported on stderr as "PROG: message"; --version prints
 * "PROG VERSION" (the CMake project's version). Returns 0 to go on, 1 when the
 * usage or the version was shown (exit 0), -1 on a bad setting (exit 2). */
int config_cli(const OptSpec *specs, size_t n, int argc, char **argv, int first, const char *prog,
               const char *synopsis) WARN_UNUSED;

/* Prints a usage text listing every option with its env var and default. */
void config_usage(FILE *out, const char *synopsis, const OptSpec *specs, size_t n);

/* Frees OPT_STRING targets. */
void config_free(const OptSpec *specs, size_t n);

/* Splits a comma-separated list into a NULL-terminated array of trimmed,
 * non-empty strings (caller frees with strv_free). */
char **strv_split(const char *s);
void strv_free(char **v);
size_t strv_len(char *const *v);
/* A copy of v (NULL-terminated), each string copied; NULL for NULL. */
char **strv_copy(char *const *v);
bool strv_contains(char *const *v, const char *s);

#endif
