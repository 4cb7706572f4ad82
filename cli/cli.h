/* cli: what every sub-command of `workd` shares: its exit codes, the global
 * flags, the client they make, and the ways an answer is printed. */
#ifndef WORKD_CLI_CLI_H
#define WORKD_CLI_CLI_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "client.h"
#include "err.h"
#include "flags.h"
#include "table.h"

/* The longest path a command builds: a route, an escaped name and a query. */
#define CLI_PATH_MAX 1024

/* The exit codes scripts can rely on (docs/cli.md lists them). */
typedef enum {
    CLI_OK = 0,
    CLI_FAILED = 1,      /* the work ended dead or cancelled (wait, submit --wait, tail --id) */
    CLI_USAGE = 2,       /* a bad command line, or a request the server refused as invalid */
    CLI_NOT_FOUND = 3,   /* 404: no such work, schedule, subscription... */
    CLI_CONFLICT = 4,    /* 409: an id with another payload, not cancellable, not retryable */
    CLI_UNAVAILABLE = 5, /* no server answered, or 503/429/5xx until --retry-for ran out */
    CLI_DENIED = 6,      /* 401/403: no token, a wrong one, or one without the scope */
    CLI_TIMEOUT = 7,     /* wait --timeout ran out before the work finished */
    CLI_INTERRUPTED = 130,
} CliExit;

typedef struct Cli {
    const char *prog; /* "workd" */
    /* global flags */
    const char *server, *token;
    bool json;
    OptNum retry_for;
    bool tty;         /* stdout is a terminal */
    Client *client;   /* made by cli_args */
    atomic_bool stop; /* SIGINT or SIGTERM */
    Flag globals[4];  /* the global flags' table, aimed at the fields above */
} Cli;

/* Sets up cli: the defaults of the global flags from the environment
 * (WORKD_SERVER, WORKD_TOKEN) and their table. */
void cli_init(Cli *cli, const char *prog);

/* The help of one sub-command: its usage line(s) and a paragraph about it. */
typedef struct CommandHelp {
    const char *name;  /* "submit", "queues" */
    const char *usage; /* "workd submit [flags] [PAYLOAD]" (lines joined by \n) */
    const char *about;
} CommandHelp;

/* Parses a sub-command's flags and the global ones from argv[1..argc) (argv[0]
 * is the sub-command's name), fills pos with its positional arguments and
 * makes cli->client. Returns true to go on; false when the command is done:
 * *rc is then 0 (--help was shown) or CLI_USAGE (a message was printed). */
bool cli_args(Cli *cli, const CommandHelp *help, const Flag *flags, size_t nflags, int argc,
              char **argv, Strs *pos, int *rc) WARN_UNUSED;

/* Prints "workd NAME: message" on stderr; returns CLI_USAGE. */
int cli_usage(Cli *cli, const CommandHelp *help, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prints what went wrong on stderr (escaped for a terminal: the message may
 * be a server's) and returns the exit code it maps to. */
int cli_fail(Cli *cli, const Err *err);

/* The exit code of an HTTP status (0: no server answered). */
int cli_exit_for(int status);

/* Prints j as JSON on stdout: indented when pretty, else one line. */
void cli_print_json(const Cli *cli, const json_t *j, bool pretty);

/* GETs path (retried like any read). With --json the answer is printed and
 * *ans left NULL; on a failure it is said and *ans left NULL. Returns the exit
 * code; when *ans is set the caller renders it (and frees it). */
int cli_get_for_table(Cli *cli, const char *path, json_t **ans);

/* Adds to t the row of one element of an answer's array (calls table_row). */
typedef void (*CliRowFn)(Table *t, const json_t *item);

/* Prints a table of heads with one row, made by row, per element of the array
 * items (borrowed; NULL: none); nothing when there is no element. */
void cli_print_rows(const Cli *cli, const char *const *heads, const json_t *items, CliRowFn row);

/* A listing: GETs path as cli_get_for_table does and prints the answer's
 * array member as rows of heads (cli_print_rows). Returns the exit code. */
int cli_list(Cli *cli, const char *path, const char *member, const char *const *heads,
             CliRowFn row);

/* ---- work items ---- */
/* The fields of a work item that flags give (POST /work's SubmitItem; a
 * schedule's work template gives queue, key, priority, timeout and
 * max_attempts). The strings point into argv; after is owned (strs_free). */
typedef struct ItemFlags {
    const char *queue, *id, *key, *run_at, *batch;
    OptNum priority, delay, timeout, max_attempts;
    Strs after;
    bool run_anyway;
} ItemFlags;

/* Sets on item every field the flags give and the item does not have. */
void cli_item_fields(json_t *item, const ItemFlags *f);
/* s as a JSON array of strings (a new reference, the caller's). */
json_t *cli_strs_json(const Strs *s);

/* ---- paths ---- */
/* Writes prefix, name escaped as a path segment (client_escape) and suffix
 * into out (always NUL-terminated). */
void cli_path(const char *prefix, const char *name, const char *suffix, char *out, size_t len);
/* Appends name=value (value escaped) to the path and query in out, after a '&'
 * unless out ends with the '?'. Does nothing when value is NULL. */
void cli_query_add(char *out, size_t len, const char *name, const char *value);

/* The global flags, for the top-level --help. */
void cli_global_usage(Cli *cli, FILE *out);

/* The exit code of a work item's status: 0 completed, 1 dead or cancelled,
 * CLI_TIMEOUT for one still open. */
int cli_exit_for_work(const char *status);
/* Whether a work status is final (completed, dead, cancelled). */
bool cli_finished(const char *status);

/* ---- reading answers ----
 * What these print for people is escaped for a terminal (term.h); so are the
 * rows of a table (table.h) and cli_fail's message. */
/* j's string member key, or "-" when it is absent or not a string. */
const char *cli_str(const json_t *j, const char *key);
/* j's member as text for a table cell: strings as they are, null as NULL,
 * anything else as compact JSON. Written into buf (always NUL-terminated);
 * returns buf, or NULL when the member is absent or null. */
const char *cli_text(const json_t *j, const char *key, char *buf, size_t len);
/* Prints obj's members as aligned "name  value" lines: those named by keys
 * (NULL-terminated) in that order, or all of them when keys is NULL. Absent,
 * null and empty-array members are left out. Values are escaped for a
 * terminal; a text of several lines keeps them, indented under its value. */
void cli_print_fields(const json_t *obj, const char *const *keys);
/* A JSON value as compact JSON text (the caller frees it). */
char *cli_dump(const json_t *v);

#endif
