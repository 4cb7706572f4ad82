/* cmd_tail: `workd tail`, the results stream (GET /results, or one work
 * item's stream) printed as it comes, resumed with Last-Event-ID after a
 * dropped connection so that nothing is missed or shown twice. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "sse.h"
#include "term.h"
#include "util.h"

/* A work id or queue, escaped, and an --after event id of every shard. */
#define PATH_MAX_LEN (1024 + SSE_ID_MAX)
/* Pause before reconnecting, doubled per failure up to the max. */
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 5000

typedef struct Tail {
    Cli *cli;
    SseParser sse;
    const char *work_id; /* --id: stop when it finishes */
    bool progress;       /* show progress events */
    int64_t count, max;  /* events shown; stop at max (0: never) */
    int rc;              /* the exit code once done */
    bool done;
} Tail;

/* The human form of one event: at, status, id, queue and what it says, on
 * one line escaped for a terminal (an error's text is the worker's). */
static void print_event(const json_t *ev)
{
    const char *status = json_string_value(json_object_get(ev, "status"));
    const char *s = status ? status : "?";
    char detail[512] = "";
    char *dump = NULL;
    if (!strcmp(s, "completed")) {
        dump = cli_dump(json_object_get(ev, "result"));
    } else if (!strcmp(s, "dead")) {
        snprintf(detail, sizeof detail, "after %lld attempts: %s",
                 (long long)json_integer_value(json_object_get(ev, "attempts")),
                 json_string_value(json_object_get(ev, "error"))
                     ? json_string_value(json_object_get(ev, "error"))
                     : "");
    } else if (!strcmp(s, "cancelled")) {
        const char *reason = json_string_value(json_object_get(ev, "reason"));
        snprintf(detail, sizeof detail, "%s", reason ? reason : "");
    } else if (!strcmp(s, "progress")) {
        const json_t *f = json_object_get(ev, "fraction");
        const char *msg = json_string_value(json_object_get(ev, "message"));
        const char *out = json_string_value(json_object_get(ev, "output"));
        size_t n = 0;
        if (json_is_number(f))
            n += (size_t)snprintf(detail, sizeof detail, "%.0f%% ", json_number_value(f) * 100);
        if (msg && n < sizeof detail)
            n += (size_t)snprintf(detail + n, sizeof detail - n, "%s ", msg);
        if (out && n < sizeof detail)
            snprintf(detail + n, sizeof detail - n, "output: %s", out);
    } else if (!strcmp(s, "batch")) {
        dump = cli_dump(json_object_get(ev, "counts"));
    }
    const char *queue = json_string_value(json_object_get(ev, "queue"));
    term_line(stdout, "%s  %-9s  %s  %s  %s", cli_str(ev, "at"), s, cli_str(ev, "id"),
              queue && *queue ? queue : "-", dump ? dump : detail);
    free(dump);
}

static bool on_event(const SseEvent *e, void *ud)
{
    Tail *t = ud;
    if (!strcmp(e->event, "ready"))
        return false; /* where the stream starts; its id is kept for resuming */
    json_t *ev = json_loads(e->data, JSON_DECODE_ANY, NULL);
    if (!json_is_object(ev)) {
        json_decref(ev);
        return false;
    }
    const char *status = json_string_value(json_object_get(ev, "status"));
    bool is_progress = status && !strcmp(status, "progress");
    bool stop = false;
    /* No event is shown twice because the stream resumes after the last one
     * (Last-Event-ID), not because of a filter here: tests/integration/test_cli.py
     * checks the stream itself. */
    if (t->progress || !is_progress) {
        if (t->cli->json)
            cli_print_json(t->cli, ev, false);
        else
            print_event(ev);
        fflush(stdout);
        t->count++;
        if (t->max && t->count >= t->max)
            stop = true;
    }
    if (t->work_id && cli_finished(status)) {
        t->rc = cli_exit_for_work(status);
        stop = true;
    }
    json_decref(ev);
    if (stop)
        t->done = true;
    return stop;
}

static bool on_chunk(const char *data, size_t len, void *ud)
{
    Tail *t = ud;
    return sse_feed(&t->sse, data, len, on_event, t);
}

/* The stream to read: work_id's (GET /work/{id}/stream) or the results of
 * queue (NULL: every queue), with progress, after the event id after (NULL:
 * from now). */
static void tail_path(char *path, size_t size, const char *work_id, const char *queue,
                      bool progress, const char *after)
{
    if (work_id) {
        cli_path("/work/", work_id, "/stream?", path, size);
    } else {
        snprintf(path, size, "/results?");
        cli_query_add(path, size, "queue", queue);
        cli_query_add(path, size, "progress", progress ? "true" : NULL);
    }
    cli_query_add(path, size, "after", after);
    size_t n = strlen(path);
    if (path[n - 1] == '?')
        path[n - 1] = '\0';
}

/* Reads path's events into t until it is done, stopped, or the stream is
 * refused for good (or away past --retry-for); a dropped stream is resumed
 * after the last event, with a backoff. Returns the exit code. */
static int follow(Tail *t, const char *path)
{
    Cli *cli = t->cli;
    int64_t backoff = BACKOFF_MIN_MS, last_open = mono_ms();
    bool quiet = false; /* said already that the stream is away */
    for (;;) {
        Err err = {0};
        int r = client_stream(cli->client, path, t->sse.last_id, on_chunk, t, &err);
        if (t->done)
            return t->rc;
        if (atomic_load(&cli->stop))
            return CLI_INTERRUPTED;
        if (t->sse.too_long) {
            fprintf(stderr, "%s: an event longer than %u bytes; stopping\n", cli->prog,
                    SSE_LINE_MAX);
            return CLI_UNAVAILABLE;
        }
        sse_reset(&t->sse);
        bool lasting =
            r == -1 && err.status && err.status != 503 && err.status != 429 && err.status < 500;
        if (lasting) /* a refusal that asking again does not mend (401, 404...) */
            return cli_fail(cli, &err);
        if (r == 0) {
            last_open = mono_ms();
            backoff = BACKOFF_MIN_MS;
        }
        if (cli->retry_for.set && mono_ms() - last_open > cli->retry_for.i)
            return cli_fail(cli, &err);
        if (!quiet || r == 0)
            term_line(stderr, "%s: the stream %s (%s); resuming after event %s", cli->prog,
                      r == 0 ? "ended" : "is away", r == 0 ? client_server(cli->client) : err.msg,
                      t->sse.last_id[0] ? t->sse.last_id : "(none yet)");
        quiet = r != 0;
        int64_t wait = backoff;
        while (wait > 0 && !atomic_load(&cli->stop)) {
            sleep_ms(wait < 100 ? wait : 100);
            wait -= 100;
        }
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
}

int cmd_tail(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "tail", "workd tail [flags]",
        "Prints finished work as it finishes (GET /results, server-sent events): when,\n"
        "status, id, queue, and the result or error; with --json each event's JSON on a\n"
        "line. Without --after it starts now; an event id is a seq, or with shards each\n"
        "shard's seq joined by '.' (812.0.77.1204). A dropped connection (a server\n"
        "restarted, a node gone) is resumed after the last event shown, on the next\n"
        "server when one cannot be reached: nothing is missed, nothing shown twice.\n"
        "With --id it follows one work item's stream from its start\n"
        "(GET /work/{id}/stream) and exits when the work finishes, with wait's exit\n"
        "codes. Ctrl-C stops it (exit 130)."};
    const char *queue = NULL, *work_id = NULL;
    bool progress = false;
    const char *after = NULL;
    OptNum count = {0};
    const Flag flags[] = {
        {"queue", FLAG_STR, &queue, "NAME", "only work of this queue"},
        {"id", FLAG_STR, &work_id, "ID", "follow this work item until it finishes"},
        {"progress", FLAG_BOOL, &progress, NULL,
         "progress events of running work too (with --id: the per-work stream's)"},
        {"after", FLAG_STR, &after, "ID", "start after this event id (0: the log's beginning)"},
        {"count", FLAG_INT, &count, "N", "exit after showing N events"},
    };
    Strs pos = {0};
    int rc;
    Tail t = {.cli = cli, .rc = CLI_OK};
    sse_init(&t.sse);
    if (!cli_args(cli, &help, flags, sizeof flags / sizeof flags[0], argc, argv, &pos, &rc))
        goto cleanup;
    if (pos.n) {
        rc = cli_usage(cli, &help, "unexpected argument '%s'", pos.v[0]);
        goto cleanup;
    }
    if (after && !sse_id_valid(after)) {
        rc = cli_usage(cli, &help,
                       "--after is an event id: 0, or seqs joined by '.' (812.0.77.1204)");
        goto cleanup;
    }
    if (count.set && count.i < 1) {
        rc = cli_usage(cli, &help, "--count is 1 or more");
        goto cleanup;
    }
    t.work_id = work_id;
    t.progress = progress;
    t.max = count.set ? count.i : 0;
    char path[PATH_MAX_LEN];
    tail_path(path, sizeof path, work_id, queue, progress, after);
    rc = follow(&t, path);
cleanup:
    sse_free(&t.sse);
    strs_free(&pos);
    return rc;
}
