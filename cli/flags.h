/* flags: the command line of one workd sub-command, described by a table, so
 * that parsing and --help come from one place. Unlike config.h, a flag here is
 * never read from the environment: `workd submit --id` must not pick up the
 * WORKD_ID a worker's shell may have set. */
#ifndef WORKD_CLI_FLAGS_H
#define WORKD_CLI_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"

typedef enum {
    FLAG_STR,  /* const char ** : points into argv (valid for the whole process) */
    FLAG_LIST, /* Strs * : every occurrence adds a value; a comma-separated value adds each */
    FLAG_BOOL, /* bool * : no value */
    FLAG_INT,  /* OptNum * : a decimal integer, in i */
    FLAG_NUM,  /* OptNum * : a number, in d */
    FLAG_DUR,  /* OptNum * : a duration ("90", "1.5s", "250ms", "5m"), milliseconds in i */
} FlagType;

/* A value that may be absent. */
typedef struct OptNum {
    bool set;
    int64_t i;
    double d;
} OptNum;

/* A growable list of strings pointing into argv; the array is owned (strs_free). */
typedef struct Strs {
    const char **v;
    size_t n, cap;
} Strs;

void strs_add(Strs *s, const char *value);
void strs_free(Strs *s);

typedef struct Flag {
    const char *name; /* without "--" */
    FlagType type;
    void *target;
    const char *metavar; /* shown in --help ("ID", "N"); NULL for FLAG_BOOL */
    const char *help;
} Flag;

typedef struct FlagTable {
    const Flag *flags;
    size_t n;
} FlagTable;

/* Parses argv[first..argc) against the tables (the first one that names a flag
 * wins); flags and positional arguments may come in any order, and after "--"
 * everything is positional. Positional arguments are added to pos. When --help
 * or -h is given, sets *help and returns 0 without parsing anything.
 * Returns -1 (err says which flag and why) on an unknown flag or a bad value. */
int flags_parse(const FlagTable *tables, size_t ntables, int argc, char **argv, int first,
                Strs *pos, bool *help, Err *err) WARN_UNUSED;

/* Prints the flags of a table as --help shows them, under a title. */
void flags_usage(FILE *out, const char *title, const FlagTable *t);

#endif
