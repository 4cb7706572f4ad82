/* cmd_admin: the operator's sub-commands: queues (statistics, pause, resume,
 * limits, keys), schedules, webhook subscriptions, the cluster and its
 * workers. Each action is one entry of its command's table. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "sse.h"
#include "table.h"
#include "util.h"

/* One action of a command with actions (`workd queues pause NAME`). */
typedef struct Act {
    const char *word;
    bool named; /* takes a NAME */
    int (*fn)(Cli *cli, const char *name, void *flags);
} Act;

/* Calls the API and prints the answer: JSON, or its fields (keys NULL: all). */
static int call_and_show(Cli *cli, const char *method, const char *path, json_t *body, bool again,
                         const char *const *keys)
{
    json_t *ans = NULL;
    Err err = {0};
    if (client_call(cli->client, method, path, body, again, 0, &ans, &err) != 0)
        return cli_fail(cli, &err);
    if (cli->json && ans)
        cli_print_json(cli, ans, true);
    else if (ans)
        cli_print_fields(ans, keys);
    json_decref(ans);
    return CLI_OK;
}

/* METHOD prefix<name>suffix with body (borrowed; NULL: none), and shows the
 * answer's keys (call_and_show). */
static int call_named(Cli *cli, const char *method, const char *prefix, const char *name,
                      const char *suffix, json_t *body, bool again, const char *const *keys)
{
    char path[CLI_PATH_MAX];
    cli_path(prefix, name, suffix, path, sizeof path);
    return call_and_show(cli, method, path, body, again, keys);
}

/* Finds the action named by pos[0] (the first, a listing, when there is no
 * word) and checks that a NAME follows when it needs one. */
static int run_action(Cli *cli, const CommandHelp *help, const Act *acts, size_t nacts,
                      const Strs *pos, void *flags)
{
    const char *word = pos->n ? pos->v[0] : acts[0].word;
    for (size_t i = 0; i < nacts; i++) {
        if (strcmp(acts[i].word, word) != 0)
            continue;
        size_t want = (pos->n ? 1 : 0) + (acts[i].named ? 1 : 0);
        if (pos->n != want && !(pos->n == 0 && !acts[i].named))
            return cli_usage(cli, help, acts[i].named ? "%s takes one NAME" : "%s takes no NAME",
                             word);
        return acts[i].fn(cli, acts[i].named ? pos->v[1] : NULL, flags);
    }
    return cli_usage(cli, help, "unknown action '%s'", word);
}

/* A command with actions: what it takes (its flags into f) and does. refuse,
 * when set, returns why the words in pos do not go with the flags given
 * (NULL: they do). */
typedef struct Actions {
    const CommandHelp *help;
    const Flag *flags;
    size_t nflags;
    const Act *acts;
    size_t nacts;
    const char *(*refuse)(const Strs *pos, const void *f);
} Actions;

/* Parses the command line against c's flags and runs the action it names;
 * returns the exit code. */
static int run_actions(Cli *cli, const Actions *c, int argc, char **argv, void *f)
{
    Strs pos = {0};
    int rc;
    if (!cli_args(cli, c->help, c->flags, c->nflags, argc, argv, &pos, &rc))
        goto cleanup;
    const char *why = c->refuse ? c->refuse(&pos, f) : NULL;
    if (why)
        rc = cli_usage(cli, c->help, "%s", why);
    else
        rc = run_action(cli, c->help, c->acts, c->nacts, &pos, f);
cleanup:
    strs_free(&pos);
    return rc;
}

/* Writes o's integer members named by fields[0..n) as decimal text into num
 * and points cells[0..n) at them. */
static void count_cells(const json_t *o, const char *const *fields, size_t n, char num[][24],
                        const char **cells)
{
    for (size_t k = 0; k < n; k++) {
        snprintf(num[k], sizeof num[k], "%lld",
                 (long long)json_integer_value(json_object_get(o, fields[k])));
        cells[k] = num[k];
    }
}

/* ---- queues ---- */

typedef struct QueueFlags {
    const char *max_running, *max_per_key, *rate;
    Strs weights;
    bool clear_weights;
    OptNum limit;
} QueueFlags;

static bool queue_limits_given(const QueueFlags *f)
{
    return f->max_running || f->max_per_key || f->rate || f->weights.n || f->clear_weights;
}

static void queue_row(Table *t, const json_t *q)
{
    static const char *const counts[] = {"pending", "scheduled", "running",  "waiting",
                                         "dead",    "completed", "cancelled"};
    char num[7][24], oldest[32];
    const char *cells[10];
    cells[0] = json_string_value(json_object_get(q, "queue"));
    count_cells(q, counts, 7, num, &cells[1]);
    cells[8] = json_is_true(json_object_get(json_object_get(q, "limits"), "paused")) ? "yes" : "no";
    snprintf(oldest, sizeof oldest, "%.1fs",
             json_number_value(json_object_get(q, "oldest_pending_age_s")));
    cells[9] = json_is_null(json_object_get(q, "oldest_pending_at")) ? "-" : oldest;
    table_row(t, cells);
}

/* The limit flags go with `queues limits NAME` only. */
static const char *limit_flags_refused(const Strs *pos, const void *flags)
{
    if (queue_limits_given(flags) && !(pos->n && !strcmp(pos->v[0], "limits")))
        return "limit flags go with `queues limits NAME`";
    return NULL;
}

static int queues_list(Cli *cli, const char *name, void *flags)
{
    static const char *const heads[] = {"QUEUE",   "PENDING", "SCHEDULED", "RUNNING",
                                        "WAITING", "DEAD",    "COMPLETED", "CANCELLED",
                                        "PAUSED",  "OLDEST",  NULL};
    return cli_list(cli, "/queues", "queues", heads, queue_row);
}

static const char *const limit_keys[] = {
    "queue", "paused", "max_running", "max_running_per_key", "rate", "key_weights", NULL};

static int queues_pause(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "POST", "/queues/", name, "/pause", NULL, true, limit_keys);
}

static int queues_resume(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "POST", "/queues/", name, "/resume", NULL, true, limit_keys);
}

/* "none" is JSON null (no limit); otherwise a positive integer. */
static json_t *limit_value(const char *s, bool *ok)
{
    if (!strcmp(s, "none"))
        return json_null();
    char *end;
    long long v = strtoll(s, &end, 10);
    *ok = *ok && end != s && !*end && v > 0;
    return json_integer(v);
}

static int queues_limits(Cli *cli, const char *name, void *flags)
{
    QueueFlags *f = flags;
    if (!queue_limits_given(f)) { /* show them: from the queue statistics */
        json_t *ans = NULL;
        Err err = {0};
        if (client_call(cli->client, "GET", "/queues", NULL, true, 0, &ans, &err) != 0)
            return cli_fail(cli, &err);
        size_t i;
        json_t *q, *found = NULL;
        json_array_foreach(json_object_get(ans, "queues"), i, q)
        {
            const char *queue = json_string_value(json_object_get(q, "queue"));
            if (queue && !strcmp(queue, name))
                found = json_object_get(q, "limits");
        }
        int rc = CLI_OK;
        if (!found) {
            fprintf(stderr, "%s: no queue '%s' with work or limits\n", cli->prog, name);
            rc = CLI_NOT_FOUND;
        } else if (cli->json) {
            cli_print_json(cli, found, true);
        } else {
            cli_print_fields(found, limit_keys);
        }
        json_decref(ans);
        return rc;
    }
    json_t *body = json_object();
    bool ok = true;
    if (f->max_running)
        json_object_set_new(body, "max_running", limit_value(f->max_running, &ok));
    if (f->max_per_key)
        json_object_set_new(body, "max_running_per_key", limit_value(f->max_per_key, &ok));
    if (f->rate) {
        long long limit;
        double per;
        char tail;
        if (!strcmp(f->rate, "none"))
            json_object_set_new(body, "rate", json_null());
        else if (sscanf(f->rate, "%lld/%lf%c", &limit, &per, &tail) == 2)
            json_object_set_new(body, "rate",
                                json_pack("{sIsf}", "limit", (json_int_t)limit, "per", per));
        else
            ok = false;
    }
    if (f->clear_weights)
        json_object_set_new(body, "key_weights", json_null());
    if (f->weights.n) {
        json_t *w = json_object();
        for (size_t i = 0; i < f->weights.n; i++) {
            const char *eq = strrchr(f->weights.v[i], '=');
            char key[160];
            if (!eq || eq == f->weights.v[i] || (size_t)(eq - f->weights.v[i]) >= sizeof key) {
                ok = false;
                break;
            }
            snprintf(key, sizeof key, "%.*s", (int)(eq - f->weights.v[i]), f->weights.v[i]);
            json_object_set_new(w, key, json_integer(atoll(eq + 1)));
        }
        json_object_set_new(body, "key_weights", w);
    }
    if (!ok) {
        json_decref(body);
        fprintf(stderr,
                "%s queues: limits are a positive integer or 'none', --rate LIMIT/SECONDS "
                "(50/1) or 'none', --key-weight KEY=WEIGHT\n",
                cli->prog);
        return CLI_USAGE;
    }
    int rc = call_named(cli, "PUT", "/queues/", name, "", body, true, limit_keys);
    json_decref(body);
    return rc;
}

/* A row of `queues keys`: label, then the counts of c. */
static void key_row(Table *t, const char *label, const json_t *c)
{
    static const char *const fields[] = {"pending", "scheduled", "running"};
    char n[3][24];
    const char *cells[4] = {label};
    count_cells(c, fields, 3, n, &cells[1]);
    table_row(t, cells);
}

static int queues_keys(Cli *cli, const char *name, void *flags)
{
    QueueFlags *f = flags;
    char path[CLI_PATH_MAX], suffix[48];
    snprintf(suffix, sizeof suffix, "/keys?limit=%lld",
             (long long)(f->limit.set ? f->limit.i : 20));
    cli_path("/queues/", name, suffix, path, sizeof path);
    json_t *ans;
    int rc = cli_get_for_table(cli, path, &ans);
    if (!ans)
        return rc;
    static const char *const heads[] = {"KEY", "PENDING", "SCHEDULED", "RUNNING", NULL};
    Table *t = table_new(heads);
    size_t i;
    json_t *k;
    char other[48];
    json_t *o = json_object_get(ans, "other");
    snprintf(other, sizeof other, "(%lld other keys)",
             (long long)json_integer_value(json_object_get(o, "keys")));
    json_array_foreach(json_object_get(ans, "keys"), i, k)
    {
        const char *key = json_string_value(json_object_get(k, "key"));
        key_row(t, key ? key : "(no key)", k);
    }
    if (json_integer_value(json_object_get(o, "keys")))
        key_row(t, other, o);
    table_print(t, stdout, cli->tty);
    json_decref(ans);
    return CLI_OK;
}

int cmd_queues(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "queues",
        "workd queues [list]\n"
        "       workd queues pause NAME | resume NAME\n"
        "       workd queues limits NAME [--max-running N|none] [--max-running-per-key N|none]\n"
        "                    [--rate LIMIT/SECONDS|none] [--key-weight KEY=W]... "
        "[--no-key-weights]\n"
        "       workd queues keys NAME [--limit N]",
        "list: every queue's open and finished counts, whether it is paused and how long\n"
        "its oldest ready work has waited (GET /queues). pause: the queue hands out no\n"
        "work until resumed (running work finishes, submissions are accepted). limits:\n"
        "shows a queue's flow control, or changes what the flags give (PUT\n"
        "/queues/{queue}; 'none' clears a limit). keys: its backlog per fair-share key.\n"
        "Changes need the admin scope."};
    QueueFlags f = {0};
    const Flag flags[] = {
        {"max-running", FLAG_STR, &f.max_running, "N|none", "limits: attempts running at once"},
        {"max-running-per-key", FLAG_STR, &f.max_per_key, "N|none",
         "limits: attempts of one key running at once"},
        {"rate", FLAG_STR, &f.rate, "LIMIT/SECONDS|none", "limits: at most LIMIT starts a period"},
        {"key-weight", FLAG_LIST, &f.weights, "KEY=W",
         "limits: a key's turns (repeat; replaces the whole map)"},
        {"no-key-weights", FLAG_BOOL, &f.clear_weights, NULL, "limits: clear the key weights"},
        {"limit", FLAG_INT, &f.limit, "N", "keys: how many keys to list (default 20)"},
    };
    static const Act acts[] = {
        {"list", false, queues_list},    {"pause", true, queues_pause},
        {"resume", true, queues_resume}, {"limits", true, queues_limits},
        {"keys", true, queues_keys},
    };
    const Actions c = {&help,
                       flags,
                       sizeof flags / sizeof flags[0],
                       acts,
                       sizeof acts / sizeof acts[0],
                       limit_flags_refused};
    int rc = run_actions(cli, &c, argc, argv, &f);
    strs_free(&f.weights);
    return rc;
}

/* ---- schedules ---- */

typedef struct ScheduleFlags {
    const char *cron, *timezone, *payload, *overlap, *catch_up;
    ItemFlags work; /* the work template: queue, key, priority, timeout, max_attempts */
    OptNum catch_up_max;
    bool paused;
} ScheduleFlags;

static const char *const schedule_keys[] = {
    "name",         "cron",      "timezone", "paused",   "work",       "overlap", "catch_up",
    "catch_up_max", "last_tick", "next",     "last_run", "updated_at", "error",   NULL};

static void schedule_row(Table *t, const json_t *s)
{
    json_t *last = json_object_get(s, "last_run");
    char run[256] = "-";
    if (json_is_object(last))
        snprintf(run, sizeof run, "%s (%s)", cli_str(last, "id"), cli_str(last, "status"));
    const char *cells[] = {json_string_value(json_object_get(s, "name")),
                           json_string_value(json_object_get(s, "cron")),
                           json_string_value(json_object_get(s, "timezone")),
                           json_is_true(json_object_get(s, "paused")) ? "yes" : "no",
                           json_string_value(json_array_get(json_object_get(s, "next"), 0)),
                           run};
    table_row(t, cells);
}

static int schedules_list(Cli *cli, const char *name, void *flags)
{
    static const char *const heads[] = {"NAME", "CRON",     "TIMEZONE", "PAUSED",
                                        "NEXT", "LAST RUN", NULL};
    return cli_list(cli, "/schedules", "schedules", heads, schedule_row);
}

static int schedules_get(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "GET", "/schedules/", name, "", NULL, true, schedule_keys);
}

static int schedules_set(Cli *cli, const char *name, void *flags)
{
    ScheduleFlags *f = flags;
    if (!f->cron) {
        fprintf(stderr, "%s schedules: set needs --cron EXPR\n", cli->prog);
        return CLI_USAGE;
    }
    json_t *payload = json_null();
    if (f->payload) {
        json_error_t je;
        payload = json_loads(f->payload, JSON_DECODE_ANY, &je);
        if (!payload) {
            fprintf(stderr, "%s schedules: --payload is not JSON: %s\n", cli->prog, je.text);
            return CLI_USAGE;
        }
    }
    json_t *work = json_pack("{so}", "payload", payload);
    cli_item_fields(work, &f->work);
    json_t *body = json_pack("{sssO}", "cron", f->cron, "work", work);
    json_decref(work);
    if (f->timezone)
        json_object_set_new(body, "timezone", json_string(f->timezone));
    if (f->overlap)
        json_object_set_new(body, "overlap", json_string(f->overlap));
    if (f->catch_up)
        json_object_set_new(body, "catch_up", json_string(f->catch_up));
    if (f->catch_up_max.set)
        json_object_set_new(body, "catch_up_max", json_integer(f->catch_up_max.i));
    if (f->paused)
        json_object_set_new(body, "paused", json_true());
    int rc = call_named(cli, "PUT", "/schedules/", name, "", body, true, schedule_keys);
    json_decref(body);
    return rc;
}

static int schedules_pause(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "POST", "/schedules/", name, "/pause", NULL, true, schedule_keys);
}

static int schedules_resume(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "POST", "/schedules/", name, "/resume", NULL, true, schedule_keys);
}

static int schedules_delete(Cli *cli, const char *name, void *flags)
{
    int rc = call_named(cli, "DELETE", "/schedules/", name, "", NULL, false, NULL);
    if (rc == CLI_OK && !cli->json)
        printf("deleted %s\n", name);
    return rc;
}

int cmd_schedules(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "schedules",
        "workd schedules [list]\n"
        "       workd schedules get NAME\n"
        "       workd schedules set NAME --cron EXPR [--timezone ZONE] [--payload JSON] [...]\n"
        "       workd schedules pause NAME | resume NAME | delete NAME",
        "Work submitted at each tick of a cron expression in a time zone, once per tick\n"
        "across failovers (GET, PUT, DELETE /schedules/{name}). set creates or replaces\n"
        "one; its work template comes from --payload and the work flags. Changes need\n"
        "the admin scope."};
    ScheduleFlags f = {0};
    const Flag flags[] = {
        {"cron", FLAG_STR, &f.cron, "EXPR",
         "set: five fields (six with seconds first), or @hourly, @daily..."},
        {"timezone", FLAG_STR, &f.timezone, "ZONE", "set: an IANA zone (default UTC)"},
        {"payload", FLAG_STR, &f.payload, "JSON", "set: the payload of each tick's work"},
        {"queue", FLAG_STR, &f.work.queue, "NAME", "set: the work's queue"},
        {"key", FLAG_STR, &f.work.key, "KEY", "set: the work's fair-share key"},
        {"priority", FLAG_INT, &f.work.priority, "N", "set: the work's priority"},
        {"timeout", FLAG_DUR, &f.work.timeout, "DURATION", "set: time one attempt may run"},
        {"max-attempts", FLAG_INT, &f.work.max_attempts, "N", "set: attempts before it is dead"},
        {"overlap", FLAG_STR, &f.overlap, "skip|allow",
         "set: skip a tick while the last one's work is open (default skip)"},
        {"catch-up", FLAG_STR, &f.catch_up, "none|last|all",
         "set: which missed ticks run (default last)"},
        {"catch-up-max", FLAG_INT, &f.catch_up_max, "N", "set: at most this many missed ticks"},
        {"paused", FLAG_BOOL, &f.paused, NULL, "set: create it paused"},
    };
    static const Act acts[] = {
        {"list", false, schedules_list},    {"get", true, schedules_get},
        {"set", true, schedules_set},       {"pause", true, schedules_pause},
        {"resume", true, schedules_resume}, {"delete", true, schedules_delete},
    };
    const Actions c = {
        &help, flags, sizeof flags / sizeof flags[0], acts, sizeof acts / sizeof acts[0], NULL};
    return run_actions(cli, &c, argc, argv, &f);
}

/* ---- subscriptions ---- */

typedef struct SubscriptionFlags {
    const char *url, *secret;
    Strs queues, kinds;
    bool paused;
    const char *after; /* an event id, checked by sse_id_valid */
} SubscriptionFlags;

static const char *const subscription_keys[] = {"name",
                                                "url",
                                                "queues",
                                                "kinds",
                                                "paused",
                                                "paused_reason",
                                                "cursor",
                                                "delivered_upto",
                                                "lag",
                                                "delivered",
                                                "last_delivered_at",
                                                "failures",
                                                "failing_since",
                                                "last_error",
                                                "last_error_at",
                                                "next_attempt_at",
                                                "deleted",
                                                NULL};

static void subscription_row(Table *t, const json_t *s)
{
    char b[4][512];
    const char *queues = cli_text(s, "queues", b[0], sizeof b[0]);
    const char *cells[] = {json_string_value(json_object_get(s, "name")),
                           json_string_value(json_object_get(s, "url")),
                           queues ? queues : "(all)",
                           json_is_true(json_object_get(s, "paused")) ? "yes" : "no",
                           cli_text(s, "lag", b[1], sizeof b[1]),
                           cli_text(s, "failures", b[2], sizeof b[2]),
                           cli_text(s, "last_error", b[3], sizeof b[3])};
    table_row(t, cells);
}

static int subscriptions_list(Cli *cli, const char *name, void *flags)
{
    static const char *const heads[] = {"NAME", "URL",      "QUEUES",     "PAUSED",
                                        "LAG",  "FAILURES", "LAST ERROR", NULL};
    return cli_list(cli, "/subscriptions", "subscriptions", heads, subscription_row);
}

static int subscriptions_get(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "GET", "/subscriptions/", name, "", NULL, true, subscription_keys);
}

/* An event id as the API takes it: one seq as a JSON number (a cluster of
 * one shard, as always), a cursor of several shards as its text. */
static json_t *event_id_json(const char *id)
{
    if (!strchr(id, '.')) {
        errno = 0;
        long long seq = strtoll(id, NULL, 10);
        if (errno == 0)
            return json_integer(seq);
    }
    return json_string(id);
}

static int subscriptions_set(Cli *cli, const char *name, void *flags)
{
    SubscriptionFlags *f = flags;
    if (!f->url || !f->secret) {
        fprintf(stderr, "%s subscriptions: set needs --url and --secret\n", cli->prog);
        return CLI_USAGE;
    }
    if (f->after && !sse_id_valid(f->after)) {
        fprintf(stderr, "%s subscriptions: --after is an event id: 0, or seqs joined by '.'\n",
                cli->prog);
        return CLI_USAGE;
    }
    json_t *body = json_pack("{ssss}", "url", f->url, "secret", f->secret);
    if (f->queues.n)
        json_object_set_new(body, "queues", cli_strs_json(&f->queues));
    if (f->kinds.n)
        json_object_set_new(body, "kinds", cli_strs_json(&f->kinds));
    if (f->paused)
        json_object_set_new(body, "paused", json_true());
    if (f->after)
        json_object_set_new(body, "after", event_id_json(f->after));
    int rc = call_named(cli, "PUT", "/subscriptions/", name, "", body, true, subscription_keys);
    json_decref(body);
    return rc;
}

static int subscriptions_delete(Cli *cli, const char *name, void *flags)
{
    return call_named(cli, "DELETE", "/subscriptions/", name, "", NULL, false, subscription_keys);
}

int cmd_subscriptions(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "subscriptions",
        "workd subscriptions [list]\n"
        "       workd subscriptions get NAME | delete NAME\n"
        "       workd subscriptions set NAME --url URL --secret whsec_... [--queues Q,...]\n"
        "                                    [--kinds completed,dead,cancelled] [--paused] "
        "[--after ID]",
        "Webhook subscriptions: finished work POSTed to a URL, signed the Standard\n"
        "Webhooks way (docs/webhooks.md). list shows each one's lag, failures and last\n"
        "error; set creates or replaces one (and resumes a paused one). Admin scope."};
    SubscriptionFlags f = {0};
    const Flag flags[] = {
        {"url", FLAG_STR, &f.url, "URL", "set: where deliveries are POSTed"},
        {"secret", FLAG_STR, &f.secret, "whsec_...", "set: the signing key"},
        {"queues", FLAG_LIST, &f.queues, "Q[,Q...]", "set: only work of these queues"},
        {"kinds", FLAG_LIST, &f.kinds, "KIND[,KIND...]",
         "set: completed, dead, cancelled (default all three)"},
        {"paused", FLAG_BOOL, &f.paused, NULL, "set: deliver nothing for now"},
        {"after", FLAG_STR, &f.after, "ID",
         "set: deliver events after this event id (a seq; with shards, seqs joined by '.')"},
    };
    static const Act acts[] = {
        {"list", false, subscriptions_list},
        {"get", true, subscriptions_get},
        {"set", true, subscriptions_set},
        {"delete", true, subscriptions_delete},
    };
    const Actions c = {
        &help, flags, sizeof flags / sizeof flags[0], acts, sizeof acts / sizeof acts[0], NULL};
    int rc = run_actions(cli, &c, argc, argv, &f);
    strs_free(&f.queues);
    strs_free(&f.kinds);
    return rc;
}

/* ---- cluster and workers ---- */

/* GET /cluster. With --json prints it (or only its member json_member) and
 * leaves *out NULL; else *out is the answer for the caller to render and free.
 * Returns the exit code. */
static int get_cluster(Cli *cli, const CommandHelp *help, int argc, char **argv,
                       const char *json_member, json_t **out)
{
    Strs pos = {0};
    int rc;
    *out = NULL;
    if (!cli_args(cli, help, NULL, 0, argc, argv, &pos, &rc))
        goto cleanup;
    if (pos.n) {
        rc = cli_usage(cli, help, "unexpected argument '%s'", pos.v[0]);
        goto cleanup;
    }
    Err err = {0};
    rc = client_call(cli->client, "GET", "/cluster", NULL, true, 0, out, &err) == 0
             ? CLI_OK
             : cli_fail(cli, &err);
    if (rc == CLI_OK && cli->json && *out) {
        cli_print_json(cli, json_member ? json_object_get(*out, json_member) : *out, true);
        json_decref(*out);
        *out = NULL;
    }
cleanup:
    strs_free(&pos);
    return rc;
}

static void node_row(Table *t, const json_t *n)
{
    const char *cells[] = {json_string_value(json_object_get(n, "id")),
                           json_string_value(json_object_get(n, "url")),
                           json_string_value(json_object_get(n, "roles")),
                           json_string_value(json_object_get(n, "last_seen"))};
    table_row(t, cells);
}

int cmd_cluster(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "cluster", "workd cluster",
        "The leader's view of the cluster (GET /cluster, admin scope): leader and term,\n"
        "the database's durability, the server nodes, open work by queue, workers."};
    json_t *c = NULL;
    int rc = get_cluster(cli, &help, argc, argv, NULL, &c);
    if (!c)
        return rc;
    json_t *db = json_object_get(c, "database");
    char dbtext[256];
    snprintf(dbtext, sizeof dbtext, "%s%s%s", cli_str(db, "durability"),
             json_is_true(json_object_get(db, "stalled")) ? ", stalled" : "",
             json_is_true(json_object_get(db, "reachable")) ? "" : ", unreachable");
    json_t *summary = json_pack("{sO?sO?sssO?sI}", "leader", json_object_get(c, "leader"), "term",
                                json_object_get(c, "term"), "database", dbtext, "open_total",
                                json_object_get(c, "open_total"), "workers",
                                (json_int_t)json_array_size(json_object_get(c, "workers")));
    static const char *const keys[] = {"leader", "term", "database", "open_total", "workers", NULL};
    cli_print_fields(summary, keys);
    json_decref(summary);

    static const char *const node_heads[] = {"NODE", "URL", "ROLES", "LAST SEEN", NULL};
    printf("\n");
    cli_print_rows(cli, node_heads, json_object_get(c, "nodes"), node_row);

    json_t *open = json_object_get(c, "open");
    if (json_object_size(open)) {
        static const char *const heads[] = {"QUEUE",   "PENDING", "SCHEDULED",
                                            "RUNNING", "WAITING", NULL};
        Table *t = table_new(heads);
        const char *q;
        json_t *counts;
        json_object_foreach(open, q, counts)
        {
            char b[4][24];
            const char *cells[] = {q, cli_text(counts, "pending", b[0], sizeof b[0]),
                                   cli_text(counts, "scheduled", b[1], sizeof b[1]),
                                   cli_text(counts, "running", b[2], sizeof b[2]),
                                   cli_text(counts, "waiting", b[3], sizeof b[3])};
            table_row(t, cells);
        }
        printf("\n");
        table_print(t, stdout, cli->tty);
    }
    json_decref(c);
    return CLI_OK;
}

static void worker_row(Table *t, const json_t *w)
{
    char cap[24], running[24], silent[32], queues[512];
    snprintf(cap, sizeof cap, "%lld",
             (long long)json_integer_value(json_object_get(w, "capacity")));
    snprintf(running, sizeof running, "%zu", json_array_size(json_object_get(w, "running")));
    snprintf(silent, sizeof silent, "%.1fs",
             (double)json_integer_value(json_object_get(w, "silent_ms")) / 1000.0);
    const char *q = json_array_size(json_object_get(w, "queues"))
                        ? cli_text(w, "queues", queues, sizeof queues)
                        : "(all)";
    const char *cells[] = {json_string_value(json_object_get(w, "id")),
                           cap,
                           running,
                           q,
                           json_string_value(json_object_get(w, "last_heartbeat")),
                           silent};
    table_row(t, cells);
}

int cmd_workers(Cli *cli, int argc, char **argv)
{
    static const CommandHelp help = {
        "workers", "workd workers",
        "The workers the leader knows (from GET /cluster, admin scope): capacity, the\n"
        "attempts each runs, its queues and when it was last heard from. --json prints\n"
        "the array of workers."};
    json_t *c = NULL;
    int rc = get_cluster(cli, &help, argc, argv, "workers", &c);
    if (!c)
        return rc;
    static const char *const heads[] = {"WORKER",         "CAPACITY", "RUNNING", "QUEUES",
                                        "LAST HEARTBEAT", "SILENT",   NULL};
    cli_print_rows(cli, heads, json_object_get(c, "workers"), worker_row);
    json_decref(c);
    return CLI_OK;
}
