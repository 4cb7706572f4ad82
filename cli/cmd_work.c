/* cmd_work: the sub-commands on work items: submit (one, or JSON lines in
 * bulk), get, list, wait, cancel and retry. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "table.h"
#include "term.h"
#include "util.h"

/* What one bulk request carries at most (the server's --max-batch default). */
#define BULK_MAX 1000

/* ---- submit ---- */

/* Sets on item every field the flags give and the item does not have, and
 * an id when it has none. */
static void fill_item(json_t *item, const ItemFlags *f)
{
    cli_item_fields(item, f);
    /* An id chosen here makes the submission safe to send again when an answer
     * is lost: the same id is never a second job. */
    if (!json_object_get(item, "id")) {
        char id[37];
        id_generate(id);
        json_object_set_new(item, "id", json_string(id));
    }
}

/* Reads all of f into a string (the caller frees it). */
static char *read_all(FILE *f)
{
    SBuf b;
    sbuf_init(&b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        sbuf_append(&b, buf, n);
    return sbuf_steal(&b);
}

/* Prints SubmitResults as the flags ask: ids only, JSON lines, or a table. */
typedef struct SubmitOut {
    Table *table;
    bool quiet, json;
} SubmitOut;

static void submit_out_add(SubmitOut *o, const Cli *cli, const json_t *r)
{
    if (o->quiet) {
        term_line(stdout, "%s", cli_str(r, "id"));
    } else if (o->json) {
        cli_print_json(cli, r, false);
    } else {
        const char *cells[] = {json_string_value(json_object_get(r, "id")),
                               json_string_value(json_object_get(r, "status")),
                               json_is_true(json_object_get(r, "created")) ? "yes" : "no (known)"};
        table_row(o->table, cells);
    }
}

static const char *const submit_heads[] = {"ID", "STATUS", "CREATED", NULL};

static int wait_one(Cli *cli, const char *id, int64_t timeout_ms, json_t **out, Err *err);
static void print_waited(Cli *cli, Table *t, const json_t *w);
static const char *const wait_heads[] = {"ID", "STATUS", "ATTEMPTS", "RESULT OR ERROR", NULL};

/* Submits JSON lines from in, per_request items to a request. */
static int submit_bulk(Cli *cli, const CommandHelp *help, FILE *in, const ItemFlags *f, bool items,
                       int64_t per_request, SubmitOut *o)
{
    int rc = CLI_OK;
    json_t *batch = json_array();
    long line_no = 0, first_line = 0, accepted = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    bool eof = false;
    while (!eof) {
        len = getline(&line, &cap, in);
        eof = len < 0;
        if (!eof) {
            line_no++;
            char *p = line;
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p == '\n' || *p == '\r' || !*p)
                continue;
            json_error_t je;
            json_t *v = json_loads(line, JSON_DECODE_ANY, &je);
            if (!v) {
                rc = cli_usage(cli, help, "line %ld is not JSON: %s", line_no, je.text);
                goto cleanup;
            }
            json_t *item = v;
            if (items && (!json_is_object(v) || !json_object_get(v, "payload"))) {
                json_decref(v);
                rc = cli_usage(cli, help,
                               "line %ld: with --items a line is an object with "
                               "\"payload\" (a SubmitItem)",
                               line_no);
                goto cleanup;
            }
            if (!items) {
                item = json_object();
                json_object_set_new(item, "payload", v);
            }
            fill_item(item, f);
            if (!json_array_size(batch))
                first_line = line_no;
            json_array_append_new(batch, item);
        }
        if (json_array_size(batch) && (eof || (int64_t)json_array_size(batch) >= per_request)) {
            json_t *ans = NULL;
            Err err = {0};
            if (client_call(cli->client, "POST", "/work", batch, true, 0, &ans, &err) != 0) {
                char msg[sizeof err.msg];
                snprintf(msg, sizeof msg, "lines %ld-%ld: %.440s", first_line, line_no, err.msg);
                snprintf(err.msg, sizeof err.msg, "%s", msg);
                if (o->table) {
                    table_print(o->table, stdout, cli->tty);
                    o->table = NULL;
                }
                rc = cli_fail(cli, &err);
                fprintf(stderr, "%s: %ld items before line %ld were accepted, none after\n",
                        cli->prog, accepted, first_line);
                goto cleanup;
            }
            size_t i;
            json_t *r;
            json_array_foreach(json_object_get(ans, "items"), i, r)
            {
                submit_out_add(o, cli, r);
                accepted++;
            }
            fflush(stdout);
            json_decref(ans);
            json_array_clear(batch);
        }
    }
cleanup:
    free(line);
    json_decref(batch);
    return rc;
}

/* --bulk: the lines of src (a file, or standard input for "-"), submitted
 * per_request at a time. single_only: a flag of a single submission was
 * given (--id, --wait, --string), which --bulk refuses. */
static int submit_bulk_from(Cli *cli, const CommandHelp *help, const char *src, const ItemFlags *f,
                            bool items, int per_request, bool single_only, SubmitOut *out)
{
    if (single_only)
        return cli_usage(cli, help, "--bulk takes no --id, --wait or --string");
    FILE *in = strcmp(src, "-") ? fopen(src, "r") : stdin;
    if (!in)
        return cli_usage(cli, help, "cannot read %s: %m", src);
    int rc = submit_bulk(cli, help, in, f, items, per_request, out);
    if (in != stdin)
        fclose(in);
    return rc;
}

/* The payload of a single submission: src, or standard input's text for
 * "-", as JSON or (as_string) as a JSON string. NULL once the usage error is
 * printed (its code in *rc). */
static json_t *single_payload(Cli *cli, const CommandHelp *help, const char *src, bool as_string,
                              int *rc)
{
    char *text = strcmp(src, "-") ? xstrdup(src) : read_all(stdin);
    json_t *payload;
    if (as_string) {
        size_t n = strlen(text);
        if (!strcmp(src, "-") && n && text[n - 1] == '\n') /* what `echo` adds */
            text[n - 1] = '\0';
        payload = json_string(text);
        if (!payload)
            *rc = cli_usage(cli, help, "the payload is not UTF-8 text");
    } else {
        json_error_t je;
        payload = json_loads(text, JSON_DECODE_ANY, &je);
        if (!payload)
            *rc =
                cli_usage(cli, help, "the payload is not JSON (%s); --string sends text", je.text);
    }
    free(text);
    return payload;
}

/* --wait: waits until the work id finishes and prints it (only its id when
 * quiet). Returns what `workd wait` returns for it. */
static int print_when_done(Cli *cli, const char *id, bool quiet)
{
    json_t *done = NULL;
    Err err = {0};
    int rc = wait_one(cli, id, -1, &done, &err);
    if (rc == -1)
        return cli_fail(cli, &err);
    Table *t = cli->json || quiet ? NULL : table_new(wait_heads);
    if (quiet)
        term_line(stdout, "%s", cli_str(done, "id"));
    else
        print_waited(cli, t, done);
    if (t)
        table_print(t, stdout, cli->tty);
    json_decref(done);
    return rc;
}

int cmd_submit(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "submit",
        "workd submit [flags] [PAYLOAD | -]\n       workd submit --bulk [flags] [FILE | -]",
        "Submits a work item (POST /work) whose payload is the JSON PAYLOAD, or standard\n"
        "input when it is '-' or absent; --string sends it as a JSON string. With --bulk\n"
        "every line of FILE (or standard input) is a payload, or with --items a whole\n"
        "SubmitItem object; the flags fill in what an item does not say, and the lines go\n"
        "in atomic requests of --per-request items. An item without an id gets a UUID\n"
        "here, so that a request whose answer was lost is sent again safely. Prints each\n"
        "item's id, status and whether it was created (an id already known with the same\n"
        "payload is not)."};
    ItemFlags f = {0};
    bool as_string = false, bulk = false, items = false, quiet = false, wait = false;
    OptNum per_request = {0};
    const Flag flags[] = {
        {"queue", FLAG_STR, &f.queue, "NAME", "queue (default: the server's, \"default\")"},
        {"id", FLAG_STR, &f.id, "ID", "the work's id (submitting it again is idempotent)"},
        {"key", FLAG_STR, &f.key, "KEY", "fair-share key (a tenant, a customer)"},
        {"priority", FLAG_INT, &f.priority, "N", "higher runs first (-1000000..1000000)"},
        {"run-at", FLAG_STR, &f.run_at, "TIME", "do not start before this RFC 3339 time"},
        {"delay", FLAG_DUR, &f.delay, "DURATION", "do not start before this long from now"},
        {"timeout", FLAG_DUR, &f.timeout, "DURATION", "time one attempt may run"},
        {"max-attempts", FLAG_INT, &f.max_attempts, "N", "attempts before the work is dead"},
        {"after", FLAG_LIST, &f.after, "ID[,ID...]", "wait until this work has completed"},
        {"run-anyway", FLAG_BOOL, &f.run_anyway, NULL,
         "run even when a parent (--after) ends dead or cancelled"},
        {"batch", FLAG_STR, &f.batch, "ID", "join this open batch"},
        {"string", FLAG_BOOL, &as_string, NULL, "send PAYLOAD as a JSON string"},
        {"bulk", FLAG_BOOL, &bulk, NULL, "JSON lines: one payload (or item) per line"},
        {"items", FLAG_BOOL, &items, NULL, "with --bulk: each line is a SubmitItem object"},
        {"per-request", FLAG_INT, &per_request, "N",
         "with --bulk: items per request, each request all or nothing (default 500, max 1000)"},
        {"wait", FLAG_BOOL, &wait, NULL, "then wait until the work finishes (as `workd wait`)"},
        {"quiet", FLAG_BOOL, &quiet, NULL, "print only the ids, one a line"},
    };
    Strs pos = {0};
    int rc;
    json_t *item = NULL, *ans = NULL;
    SubmitOut out = {0};
    if (!cli_args(cli, &help, flags, sizeof flags / sizeof flags[0], argc, argv, &pos, &rc))
        goto cleanup;
    out = (SubmitOut){.quiet = quiet, .json = cli->json && !quiet};
    if (!out.quiet && !out.json && !wait)
        out.table = table_new(submit_heads);
    if (pos.n > 1) {
        rc = cli_usage(cli, &help, "one payload at most (quote it: '{\"n\": 1}')");
        goto cleanup;
    }
    if (per_request.set && (per_request.i < 1 || per_request.i > BULK_MAX)) {
        rc = cli_usage(cli, &help, "--per-request: from 1 to %d", BULK_MAX);
        goto cleanup;
    }
    const char *src = pos.n ? pos.v[0] : "-";
    if (bulk) {
        rc = submit_bulk_from(cli, &help, src, &f, items, per_request.set ? per_request.i : 500,
                              f.id || wait || as_string, &out);
        goto cleanup;
    }
    if (items) {
        rc = cli_usage(cli, &help, "--items goes with --bulk");
        goto cleanup;
    }
    if (!pos.n && isatty(STDIN_FILENO)) {
        rc = cli_usage(cli, &help, "give a PAYLOAD, or '-' to type it on standard input");
        goto cleanup;
    }
    json_t *payload = single_payload(cli, &help, src, as_string, &rc);
    if (!payload)
        goto cleanup;
    item = json_object();
    json_object_set_new(item, "payload", payload);
    fill_item(item, &f);
    Err err = {0};
    if (client_call(cli->client, "POST", "/work", item, true, 0, &ans, &err) != 0) {
        rc = cli_fail(cli, &err);
        goto cleanup;
    }
    rc = CLI_OK;
    if (wait)
        rc = print_when_done(cli, json_string_value(json_object_get(ans, "id")), quiet);
    else
        submit_out_add(&out, cli, ans);
cleanup:
    if (out.table)
        table_print(out.table, stdout, cli->tty);
    json_decref(item);
    json_decref(ans);
    strs_free(&f.after);
    strs_free(&pos);
    return rc;
}

/* ---- get ---- */

/* The fields of a Work shown by `get`, in order. */
static const char *const work_fields[] = {
    "id",           "status",     "queue",      "key",         "priority",   "attempts",
    "max_attempts", "timeout_ms", "payload",    "result",      "last_error", "progress",
    "created_at",   "run_at",     "started_at", "finished_at", "deadline",   "worker_id",
    "after",        "children",   "batch",      NULL};

static void event_row(Table *t, const json_t *e)
{
    char seq[32];
    char *data = cli_dump(json_object_get(e, "data"));
    const char *cells[] = {cli_text(e, "seq", seq, sizeof seq),
                           json_string_value(json_object_get(e, "at")),
                           json_string_value(json_object_get(e, "type")), data};
    table_row(t, cells);
    free(data);
}

int cmd_get(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "get", "workd get [flags] ID...",
        "Shows work items (GET /work/{id}): status, attempts, payload, result, last\n"
        "error, progress, times. --events shows each one's history instead."};
    bool events = false;
    const Flag flags[] = {
        {"events", FLAG_BOOL, &events, NULL, "its history from the event log (first 1000)"},
    };
    Strs pos = {0};
    int rc;
    if (!cli_args(cli, &help, flags, 1, argc, argv, &pos, &rc))
        goto cleanup;
    if (!pos.n) {
        rc = cli_usage(cli, &help, "which work? (an ID)");
        goto cleanup;
    }
    rc = CLI_OK;
    for (size_t i = 0; i < pos.n && rc == CLI_OK; i++) {
        char path[CLI_PATH_MAX];
        cli_path("/work/", pos.v[i], events ? "/events" : "", path, sizeof path);
        json_t *w = NULL;
        Err err = {0};
        if (client_call(cli->client, "GET", path, NULL, true, 0, &w, &err) != 0) {
            rc = cli_fail(cli, &err);
            break;
        }
        if (cli->json) {
            cli_print_json(cli, w, true);
        } else if (events) {
            static const char *const heads[] = {"SEQ", "AT", "TYPE", "DATA", NULL};
            cli_print_rows(cli, heads, json_object_get(w, "events"), event_row);
        } else {
            if (i)
                printf("\n");
            cli_print_fields(w, work_fields);
        }
        json_decref(w);
    }
cleanup:
    strs_free(&pos);
    return rc;
}

/* ---- list ---- */

/* "attempts/max_attempts" of a work item into buf. */
static const char *attempts_text(const json_t *w, char *buf, size_t len)
{
    snprintf(buf, len, "%lld/%lld", (long long)json_integer_value(json_object_get(w, "attempts")),
             (long long)json_integer_value(json_object_get(w, "max_attempts")));
    return buf;
}

static void work_row(Table *t, const json_t *w)
{
    char att[48], b[3][256];
    const char *cells[] = {cli_text(w, "id", b[0], sizeof b[0]),
                           json_string_value(json_object_get(w, "queue")),
                           json_string_value(json_object_get(w, "status")),
                           attempts_text(w, att, sizeof att),
                           json_string_value(json_object_get(w, "created_at")),
                           cli_text(w, "worker_id", b[1], sizeof b[1]),
                           cli_text(w, "last_error", b[2], sizeof b[2])};
    table_row(t, cells);
}

int cmd_list(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "list", "workd list [flags]",
        "Lists work, newest first (GET /work), with filters. --before pages: pass the\n"
        "`next_before` that --json shows (or that the last line names)."};
    const char *status = NULL, *queue = NULL, *before = NULL;
    OptNum limit = {0};
    const Flag flags[] = {
        {"status", FLAG_STR, &status, "STATUS",
         "waiting, pending, scheduled, running, completed, dead or cancelled"},
        {"queue", FLAG_STR, &queue, "NAME", "only this queue"},
        {"limit", FLAG_INT, &limit, "N", "items at most (default 50, max 500)"},
        {"before", FLAG_STR, &before, "CURSOR",
         "the page after the one that named this (a seq, or a seq per shard joined by '.')"},
    };
    Strs pos = {0};
    int rc;
    json_t *ans = NULL;
    if (!cli_args(cli, &help, flags, 4, argc, argv, &pos, &rc))
        goto cleanup;
    if (pos.n) {
        rc = cli_usage(cli, &help, "unexpected argument '%s'", pos.v[0]);
        goto cleanup;
    }
    char path[CLI_PATH_MAX] = "/work?", num[24];
    snprintf(num, sizeof num, "%lld", (long long)(limit.set ? limit.i : 50));
    cli_query_add(path, sizeof path, "status", status);
    cli_query_add(path, sizeof path, "queue", queue);
    cli_query_add(path, sizeof path, "limit", num);
    cli_query_add(path, sizeof path, "before", before);
    rc = cli_get_for_table(cli, path, &ans);
    if (!ans)
        goto cleanup;
    static const char *const heads[] = {"ID",      "QUEUE",  "STATUS", "ATTEMPTS",
                                        "CREATED", "WORKER", "ERROR",  NULL};
    cli_print_rows(cli, heads, json_object_get(ans, "items"), work_row);
    json_t *next = json_object_get(ans, "next_before");
    if (json_is_integer(next)) /* a cluster of one shard: a seq */
        printf("(more: workd list --before %lld)\n", (long long)json_integer_value(next));
    else if (json_is_string(next)) /* of several: a cursor */
        term_line(stdout, "(more: workd list --before %s)", json_string_value(next));
cleanup:
    json_decref(ans);
    strs_free(&pos);
    return rc;
}

/* ---- wait ---- */

/* The pause after a long poll that came back early with open work: doubled
 * while they keep coming back early, up to the max. A server answers early
 * when the work changes (pending, then running); one that always does (a
 * broken one, a proxy that does not hold a long poll) is not asked again as
 * fast as it answers. */
#define EARLY_PAUSE_MIN_MS 100
#define EARLY_PAUSE_MAX_MS 2000

/* Waits for work id to finish, long-polling GET /work/{id}?wait= (timeout_ms < 0:
 * as long as it takes). Returns the exit code of its status (CLI_TIMEOUT if it
 * was still open when the time ran out) with *out the work, or -1 with err. */
static int wait_one(Cli *cli, const char *id, int64_t timeout_ms, json_t **out, Err *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
    int64_t pause = 0;
    *out = NULL;
    for (;;) {
        int64_t left = deadline < 0 ? 30000 : deadline - mono_ms();
        if (left < 0)
            left = 0;
        if (left > 30000)
            left = 30000;
        char suffix[48], path[CLI_PATH_MAX];
        snprintf(suffix, sizeof suffix, "?wait=%.3f", (double)left / 1000.0);
        cli_path("/work/", id, suffix, path, sizeof path);
        json_t *w = NULL;
        int64_t asked = mono_ms();
        if (client_call(cli->client, "GET", path, NULL, true, left, &w, err) != 0) {
            json_decref(*out);
            *out = NULL;
            return -1;
        }
        json_decref(*out);
        *out = w;
        const char *status = json_string_value(json_object_get(w, "status"));
        if (cli_finished(status) || (deadline >= 0 && mono_ms() >= deadline))
            return cli_exit_for_work(status);
        if (mono_ms() - asked >= left / 2) {
            pause = 0;
            continue;
        }
        pause = pause ? pause * 2 : EARLY_PAUSE_MIN_MS;
        if (pause > EARLY_PAUSE_MAX_MS)
            pause = EARLY_PAUSE_MAX_MS;
        int64_t nap = deadline >= 0 && deadline - mono_ms() < pause ? deadline - mono_ms() : pause;
        for (; nap > 0 && !atomic_load(&cli->stop); nap -= 100)
            sleep_ms(nap < 100 ? nap : 100);
        if (atomic_load(&cli->stop)) {
            err_set(err, 0, "stopped", "GET %s: stopped", path);
            json_decref(*out);
            *out = NULL;
            return -1;
        }
    }
}

/* One finished (or timed-out) work item as wait prints it. */
static void print_waited(Cli *cli, Table *t, const json_t *w)
{
    if (cli->json) {
        cli_print_json(cli, w, true);
        return;
    }
    char att[48], buf[4096];
    attempts_text(w, att, sizeof att);
    const char *status = json_string_value(json_object_get(w, "status"));
    char *result = NULL;
    const char *what;
    if (status && !strcmp(status, "completed"))
        what = result = cli_dump(json_object_get(w, "result"));
    else
        what = cli_text(w, "last_error", buf, sizeof buf);
    const char *cells[] = {json_string_value(json_object_get(w, "id")), status, att, what};
    table_row(t, cells);
    free(result);
}

int cmd_wait(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "wait", "workd wait [flags] ID...",
        "Waits until each work item has finished (long-polling GET /work/{id}?wait=) and\n"
        "shows its result or last error. Exits 0 when all completed, 1 when one ended\n"
        "dead or cancelled, 7 when --timeout ran out first."};
    OptNum timeout = {0};
    const Flag flags[] = {
        {"timeout", FLAG_DUR, &timeout, "DURATION",
         "give up after this long in all (default: wait as long as it takes)"},
    };
    Strs pos = {0};
    int rc;
    Table *t = NULL;
    if (!cli_args(cli, &help, flags, 1, argc, argv, &pos, &rc))
        goto cleanup;
    if (!pos.n) {
        rc = cli_usage(cli, &help, "which work? (an ID)");
        goto cleanup;
    }
    t = cli->json ? NULL : table_new(wait_heads);
    int64_t deadline = timeout.set ? mono_ms() + timeout.i : -1;
    rc = CLI_OK;
    for (size_t i = 0; i < pos.n; i++) {
        json_t *w = NULL;
        Err err = {0};
        int64_t left = deadline < 0 ? -1 : deadline - mono_ms();
        int r = wait_one(cli, pos.v[i], left < 0 && deadline >= 0 ? 0 : left, &w, &err);
        if (r == -1) {
            rc = cli_fail(cli, &err);
            break;
        }
        print_waited(cli, t, w);
        json_decref(w);
        /* The worst outcome decides: timed out, then failed. */
        if (r == CLI_TIMEOUT || (r == CLI_FAILED && rc == CLI_OK))
            rc = r;
    }
cleanup:
    if (t)
        table_print(t, stdout, cli->tty);
    strs_free(&pos);
    return rc;
}

/* ---- cancel and retry ---- */

/* cancel and retry: per id, or in bulk by a filter. */
typedef struct Action {
    const char *method, *suffix; /* on /work/{id}: "DELETE" "", "POST" "/retry" */
    const char *bulk_path;       /* "/bulk/cancel" */
    const char *count_field;     /* "cancelled" in the bulk answer */
} Action;

static int act(Cli *cli, const CommandHelp *help, const Action *a, int argc, char **argv,
               bool with_status)
{
    const char *queue = NULL, *key = NULL, *status = NULL;
    bool all = false;
    Flag flags[] = {
        {"all", FLAG_BOOL, &all, NULL, "in bulk: all the work that the filters match"},
        {"queue", FLAG_STR, &queue, "NAME", "in bulk: only this queue's work"},
        {"key", FLAG_STR, &key, "KEY", "in bulk: only work of this key"},
        {"status", FLAG_STR, &status, "STATUS", "in bulk: only pending, scheduled or running"},
    };
    Strs pos = {0};
    int rc;
    Table *t = NULL;
    json_t *filter = NULL;
    if (!cli_args(cli, help, flags, with_status ? 4 : 3, argc, argv, &pos, &rc))
        goto cleanup;
    bool bulk = all || queue || key || status;
    if (bulk == (pos.n > 0)) {
        rc = cli_usage(cli, help,
                       bulk ? "either IDs or filters, not both"
                            : "which work? (IDs, or --all with filters)");
        goto cleanup;
    }
    rc = CLI_OK;
    Err err = {0};
    if (bulk) {
        filter = json_object();
        if (queue)
            json_object_set_new(filter, "queue", json_string(queue));
        if (key)
            json_object_set_new(filter, "key", json_string(key));
        if (status)
            json_object_set_new(filter, "status", json_string(status));
        long long total = 0;
        bool more = true;
        while (more) { /* the server does at most `limit` a request: repeat while more */
            json_t *ans = NULL;
            if (client_call(cli->client, "POST", a->bulk_path, filter, true, 0, &ans, &err) != 0) {
                rc = cli_fail(cli, &err);
                break;
            }
            total += json_integer_value(json_object_get(ans, a->count_field));
            more = json_is_true(json_object_get(ans, "more"));
            json_decref(ans);
        }
        if (cli->json) {
            json_t *j = json_pack("{sI}", a->count_field, (json_int_t)total);
            cli_print_json(cli, j, false);
            json_decref(j);
        } else {
            printf("%s: %lld\n", a->count_field, total);
        }
        goto cleanup;
    }
    static const char *const heads[] = {"ID", "STATUS", NULL};
    t = cli->json ? NULL : table_new(heads);
    for (size_t i = 0; i < pos.n; i++) {
        char path[CLI_PATH_MAX];
        cli_path("/work/", pos.v[i], a->suffix, path, sizeof path);
        json_t *ans = NULL;
        /* Not sent again after a broken exchange: a cancel or retry that was
         * done would then be refused with 409 and look like a failure. */
        if (client_call(cli->client, a->method, path, NULL, false, 0, &ans, &err) != 0) {
            rc = cli_fail(cli, &err);
            break;
        }
        if (cli->json) {
            cli_print_json(cli, ans, false);
        } else {
            const char *cells[] = {json_string_value(json_object_get(ans, "id")),
                                   json_string_value(json_object_get(ans, "status"))};
            table_row(t, cells);
        }
        json_decref(ans);
    }
cleanup:
    if (t)
        table_print(t, stdout, cli->tty);
    json_decref(filter);
    strs_free(&pos);
    return rc;
}

int cmd_cancel(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "cancel",
        "workd cancel ID...\n       workd cancel --all [--queue NAME] [--key KEY] "
        "[--status STATUS]",
        "Cancels open work (DELETE /work/{id}): pending and scheduled work at once,\n"
        "running work too (its worker stops it within a heartbeat). With --all and\n"
        "filters, all the open work they match (POST /bulk/cancel, repeated until done).\n"
        "Work that has finished already is a conflict (exit 4)."};
    static const Action a = {"DELETE", "", "/bulk/cancel", "cancelled"};
    return act(cli, &help, &a, argc, argv, true);
}

int cmd_retry(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "retry", "workd retry ID...\n       workd retry --all [--queue NAME] [--key KEY]",
        "Reopens dead work for one more attempt (POST /work/{id}/retry). With --all and\n"
        "filters, all the dead work they match (POST /bulk/retry, repeated until done).\n"
        "Work that is not dead is a conflict (exit 4)."};
    static const Action a = {"POST", "/retry", "/bulk/retry", "retried"};
    return act(cli, &help, &a, argc, argv, false);
}
