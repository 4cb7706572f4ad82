/* cli: see cli.h. */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "term.h"
#include "util.h"

void cli_init(Cli *cli, const char *prog)
{
    cli->prog = prog;
    cli->server = getenv("WORKD_SERVER");
    if (!cli->server || !*cli->server)
        cli->server = "http://127.0.0.1:8080";
    cli->token = getenv("WORKD_TOKEN");
    cli->tty = isatty(STDOUT_FILENO);
    atomic_init(&cli->stop, false);
    cli->globals[0] = (Flag){"server", FLAG_STR, &cli->server, "URL[,URL...]",
                             "servers to ask, in turn when one cannot be reached (env "
                             "WORKD_SERVER, default http://127.0.0.1:8080)"};
    cli->globals[1] = (Flag){"token", FLAG_STR, &cli->token, "TOKEN",
                             "bearer token (env WORKD_TOKEN, which keeps it out of ps)"};
    cli->globals[2] = (Flag){"json", FLAG_BOOL, &cli->json, NULL,
                             "print the API's JSON answers instead of tables"};
    cli->globals[3] = (Flag){"retry-for", FLAG_DUR, &cli->retry_for, "DURATION",
                             "keep trying this long while no server answers or the cluster is "
                             "busy (503, 429; default 15s, 0: once)"};
}

static FlagTable global_flags(Cli *cli)
{
    return (FlagTable){cli->globals, sizeof cli->globals / sizeof cli->globals[0]};
}

void cli_global_usage(Cli *cli, FILE *out)
{
    FlagTable g = global_flags(cli);
    flags_usage(out, "Global flags (before or after the sub-command)", &g);
}

static void show_help(Cli *cli, const CommandHelp *help, const FlagTable *own)
{
    printf("usage: %s\n\n%s\n", help->usage, help->about);
    flags_usage(stdout, "Flags", own);
    cli_global_usage(cli, stdout);
    printf("\nExit codes: 0 ok, 1 work dead or cancelled, 2 usage or invalid request, 3 not "
           "found,\n4 conflict, 5 server unavailable, 6 token refused, 7 wait timed out "
           "(docs/cli.md).\n");
}

bool cli_args(Cli *cli, const CommandHelp *help, const Flag *flags, size_t nflags, int argc,
              char **argv, Strs *pos, int *rc)
{
    FlagTable tables[2] = {{flags, nflags}, global_flags(cli)};
    bool want_help = false;
    Err err = {0};
    if (flags_parse(tables, 2, argc, argv, 1, pos, &want_help, &err) != 0) {
        *rc = cli_usage(cli, help, "%s", err.msg);
        return false;
    }
    if (want_help) {
        show_help(cli, help, &tables[0]);
        *rc = CLI_OK;
        return false;
    }
    ClientConfig cfg = {
        .servers = cli->server,
        .token = cli->token,
        .retry_ms = cli->retry_for.set ? cli->retry_for.i : 15000,
        .stop = &cli->stop,
    };
    cli->client = client_new(&cfg, &err);
    if (!cli->client) {
        *rc = cli_usage(cli, help, "%s", err.msg);
        return false;
    }
    return true;
}

int cli_usage(Cli *cli, const CommandHelp *help, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s %s: ", cli->prog, help->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see %s %s --help)\n", cli->prog, help->name);
    va_end(ap);
    return CLI_USAGE;
}

int cli_exit_for(int status)
{
    if (status == 0)
        return CLI_UNAVAILABLE;
    if (status == 401 || status == 403)
        return CLI_DENIED;
    if (status == 404)
        return CLI_NOT_FOUND;
    if (status == 409)
        return CLI_CONFLICT;
    if (status == 429 || status >= 500)
        return CLI_UNAVAILABLE;
    return CLI_USAGE;
}

int cli_fail(Cli *cli, const Err *err)
{
    if (!strcmp(err->type, "stopped"))
        return CLI_INTERRUPTED;
    /* The message may be a server's problem detail or the start of its body. */
    if (err->status)
        term_line(stderr, "%s: %s (HTTP %d %s)", cli->prog, err->msg, err->status, err->type);
    else
        term_line(stderr, "%s: %s", cli->prog, err->msg);
    return cli_exit_for(err->status);
}

void cli_print_json(const Cli *cli, const json_t *j, bool pretty)
{
    size_t flags = JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | (pretty ? JSON_INDENT(2) : JSON_COMPACT);
    char *s = json_dumps(j, flags);
    if (s)
        printf("%s\n", s);
    free(s);
}

int cli_get_for_table(Cli *cli, const char *path, json_t **ans)
{
    Err err = {0};
    *ans = NULL;
    if (client_call(cli->client, "GET", path, NULL, true, 0, ans, &err) != 0)
        return cli_fail(cli, &err);
    if (cli->json) {
        cli_print_json(cli, *ans, true);
        json_decref(*ans);
        *ans = NULL;
    }
    return CLI_OK;
}

void cli_print_rows(const Cli *cli, const char *const *heads, const json_t *items, CliRowFn row)
{
    Table *t = table_new(heads);
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item)
    {
        row(t, item);
    }
    table_print(t, stdout, cli->tty);
}

int cli_list(Cli *cli, const char *path, const char *member, const char *const *heads, CliRowFn row)
{
    json_t *ans;
    int rc = cli_get_for_table(cli, path, &ans);
    if (!ans)
        return rc;
    cli_print_rows(cli, heads, json_object_get(ans, member), row);
    json_decref(ans);
    return CLI_OK;
}

json_t *cli_strs_json(const Strs *s)
{
    json_t *a = json_array();
    for (size_t i = 0; i < s->n; i++)
        json_array_append_new(a, json_string(s->v[i]));
    return a;
}

void cli_item_fields(json_t *item, const ItemFlags *f)
{
#define SET_IF(name, value)                                                                        \
    do {                                                                                           \
        if (!json_object_get(item, name))                                                          \
            json_object_set_new(item, name, value);                                                \
    } while (0)
    if (f->queue)
        SET_IF("queue", json_string(f->queue));
    if (f->id)
        SET_IF("id", json_string(f->id));
    if (f->key)
        SET_IF("key", json_string(f->key));
    if (f->run_at)
        SET_IF("run_at", json_string(f->run_at));
    if (f->batch)
        SET_IF("batch", json_string(f->batch));
    if (f->priority.set)
        SET_IF("priority", json_integer(f->priority.i));
    if (f->delay.set)
        SET_IF("delay", json_real(f->delay.d));
    if (f->timeout.set)
        SET_IF("timeout", json_real(f->timeout.d));
    if (f->max_attempts.set)
        SET_IF("max_attempts", json_integer(f->max_attempts.i));
    if (f->after.n)
        SET_IF("after", cli_strs_json(&f->after));
    if (f->run_anyway)
        SET_IF("run_anyway", json_true());
#undef SET_IF
}

void cli_path(const char *prefix, const char *name, const char *suffix, char *out, size_t len)
{
    snprintf(out, len, "%s", prefix);
    client_escape(name, out, len);
    size_t n = strlen(out);
    snprintf(out + n, len - n, "%s", suffix);
}

void cli_query_add(char *out, size_t len, const char *name, const char *value)
{
    if (!value)
        return;
    size_t n = strlen(out);
    snprintf(out + n, len - n, "%s%s=", n && out[n - 1] == '?' ? "" : "&", name);
    client_escape(value, out, len);
}

char *cli_dump(const json_t *v)
{
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
}

const char *cli_str(const json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    return s ? s : "-";
}

const char *cli_text(const json_t *j, const char *key, char *buf, size_t len)
{
    const json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v))
        return NULL;
    if (json_is_string(v)) {
        snprintf(buf, len, "%s", json_string_value(v));
    } else {
        char *s = cli_dump(v);
        snprintf(buf, len, "%s", s ? s : "?");
        free(s);
    }
    return buf;
}

int cli_exit_for_work(const char *status)
{
    if (status && !strcmp(status, "completed"))
        return CLI_OK;
    if (status && (!strcmp(status, "dead") || !strcmp(status, "cancelled")))
        return CLI_FAILED;
    return CLI_TIMEOUT;
}

bool cli_finished(const char *status)
{
    return status && (!strcmp(status, "completed") || !strcmp(status, "dead") ||
                      !strcmp(status, "cancelled"));
}

/* Prints "key  value": the key padded to width, the value escaped for a
 * terminal. A text of several lines (a stack trace in last_error) keeps its
 * lines, each after the first indented to the value's column so that none
 * can pass for a field of its own. */
static void print_field(const char *key, const json_t *v, int width)
{
    if (!v || json_is_null(v) || (json_is_array(v) && !json_array_size(v)))
        return;
    /* A payload or a result is shown as JSON, so that "7" and 7 differ. */
    bool as_json = !json_is_string(v) || !strcmp(key, "payload") || !strcmp(key, "result");
    char *dump = as_json ? cli_dump(v) : NULL;
    const char *text = as_json ? dump : json_string_value(v);
    if (!text)
        text = "?";
    SBuf k, val, line;
    sbuf_init(&k);
    sbuf_init(&val);
    sbuf_init(&line);
    term_escape(&k, key, strlen(key), TERM_LINE);
    term_escape(&val, text, strlen(text), TERM_LINES);
    sbuf_printf(&line, "%-*s  ", width, k.data ? k.data : "");
    for (size_t i = 0; i < val.len; i++) {
        sbuf_append(&line, &val.data[i], 1);
        if (val.data[i] == '\n')
            sbuf_printf(&line, "%*s", width + 2, "");
    }
    sbuf_puts(&line, "\n");
    fwrite(line.data, 1, line.len, stdout);
    sbuf_free(&k);
    sbuf_free(&val);
    sbuf_free(&line);
    free(dump);
}

void cli_print_fields(const json_t *obj, const char *const *keys)
{
    json_t *o = (json_t *)obj; /* jansson's iteration takes no const */
    const char *key;
    json_t *v;
    int width = 0;
    if (keys) {
        for (const char *const *k = keys; *k; k++)
            if ((int)strlen(*k) > width)
                width = (int)strlen(*k);
        for (const char *const *k = keys; *k; k++)
            print_field(*k, json_object_get(obj, *k), width);
        return;
    }
    json_object_foreach(o, key, v)
    {
        if ((int)strlen(key) > width)
            width = (int)strlen(key);
    }
    json_object_foreach(o, key, v)
    {
        print_field(key, v, width);
    }
}
