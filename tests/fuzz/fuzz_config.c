/* Fuzzes config_parse the way workd-server and workd-worker call it, over a
 * table with one option of every kind taken from theirs. The input is one
 * argument per line; a line "WORKD_NAME=value" is an environment variable
 * instead. String values then go through strv_split, as --roles and --queues
 * do; the list option (--server, repeatable) goes through servers_new, as the
 * worker and the demo clients read it. */
#include "fuzz.h"

#include "config.h"
#include "servers.h"

#define MAX_ARGS 64
#define MAX_ENV 16

static struct {
    char *listen, *roles, *queues, *token, *server;
    int64_t http_threads, max_body, port;
    int64_t election_ms, lease_grace_ms, poll_wait_ms;
    bool demo, noop;
} C;

static const OptSpec specs[] = {
    {"listen", OPT_STRING, &C.listen, "127.0.0.1:8080", "HOST:PORT", 0, 0},
    {"roles", OPT_STRING, &C.roles, "frontend,manager", "roles of this node", 0, 0},
    {"queues", OPT_STRING, &C.queues, "", "queues to take work from", 0, 0},
    {"token", OPT_STRING, &C.token, NULL, "bearer token", 0, 0},
    {"server", OPT_LIST, &C.server, "http://127.0.0.1:8080", "servers, repeatable", 0, 0},
    {"http-threads", OPT_INT, &C.http_threads, "2", "HTTP threads", 1, 64},
    {"max-body", OPT_INT, &C.max_body, "1048576", "largest body", 1024, 1LL << 30},
    {"port", OPT_INT, &C.port, NULL, "unbounded integer", 0, 0},
    {"election-interval", OPT_DURATION, &C.election_ms, "250ms", "election", 10, 60000},
    {"lease-grace", OPT_DURATION, &C.lease_grace_ms, "10s", "lease grace", 0, 3600000},
    {"poll-wait", OPT_DURATION, &C.poll_wait_ms, "20s", "unbounded duration", 0, 0},
    {"demo", OPT_BOOL, &C.demo, "false", "demo jobs", 0, 0},
    {"noop", OPT_BOOL, &C.noop, NULL, "noop jobs", 0, 0},
};
static const size_t nspecs = sizeof specs / sizeof specs[0];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void check_list(const char *s)
{
    char **v = strv_split(s);
    for (size_t i = 0; v[i]; i++) {
        size_t n = strlen(v[i]);
        FUZZ_CHECK(n > 0 && !strchr(v[i], ',') && v[i][0] != ' ' && v[i][n - 1] != ' ',
                   "'%s' split into the element '%s'", s, v[i]);
    }
    strv_free(v);
}

static void check_bounds(void)
{
    for (size_t i = 0; i < nspecs; i++) {
        const OptSpec *o = &specs[i];
        if ((o->type != OPT_INT && o->type != OPT_DURATION) || (!o->min && !o->max))
            continue;
        int64_t v = *(int64_t *)o->target;
        FUZZ_CHECK(v >= o->min && v <= o->max, "--%s is %lld, out of [%lld, %lld]", o->name,
                   (long long)v, (long long)o->min, (long long)o->max);
    }
    FUZZ_CHECK(C.election_ms >= 10 && C.poll_wait_ms >= 0, "a duration is negative");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    char *argv[MAX_ARGS + 1] = {"workd-fuzz"}, *env[MAX_ENV];
    int argc = 1;
    size_t nenv = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *eq = strchr(line, '=');
        if (!strncmp(line, "WORKD_", 6) && eq && nenv < MAX_ENV) {
            *eq = '\0';
            if (setenv(line, eq + 1, 1) == 0)
                env[nenv++] = line;
        } else if (argc < MAX_ARGS) {
            argv[argc++] = line;
        }
    }
    argv[argc] = NULL;
    memset(&C, 0, sizeof C);
    int rest = -1;
    bool help;
    Err err = {0};
    if (config_parse(specs, nspecs, argc, argv, 1, &rest, &help, &err) == 0) {
        FUZZ_CHECK(rest >= 1 && rest <= argc, "the arguments left start at %d of %d", rest, argc);
        check_bounds();
        check_list(C.roles);
        check_list(C.queues);
        check_list(C.token);
        check_list(C.server);
        Err serr = {0};
        Servers *sv = servers_new(C.server, "--server", &serr);
        if (sv) {
            char url[SERVERS_URL_MAX];
            size_t pos = servers_url(sv, "/workers/w/reports", url, sizeof url);
            FUZZ_CHECK(pos < servers_count(sv) && !strncmp(url, "http", 4),
                       "server %zu of %zu is '%s'", pos, servers_count(sv), url);
            servers_unreachable(sv, pos, url, sizeof url);
            servers_free(sv);
        } else {
            FUZZ_CHECK(serr.status == 400 && !strcmp(serr.type, "bad-config"),
                       "a refused server list gives %d '%s'", serr.status, serr.type);
        }
    } else {
        FUZZ_CHECK(err.status == 400 && !strcmp(err.type, "bad-config"),
                   "a refused setting gives %d '%s'", err.status, err.type);
    }
    config_free(specs, nspecs);
    for (size_t i = 0; i < nenv; i++)
        unsetenv(env[i]);
    free(text);
    return 0;
}
