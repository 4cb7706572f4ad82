/* Fuzzes what workers send to the front-end, as api.c reads it. The first byte
 * picks the message: 'h' PUT /workers/{id} (parse_heartbeat), 'p' its pull
 * (parse_pull), 'r' its reports (parse_reports), 'c' or 'f' POST
 * /work/{id}/attempts/{n}/complete or fail (parse_single_report; the first line
 * is the path's "ID/N"). The rest is the body, through parse_json_body. */
#include "fuzz.h"

#include <jansson.h>

#include "config.h"
#include "parse.h"

#define MAX_BATCH 1000
#define MAX_DEPTH 32

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void check_queues(char **q)
{
    FUZZ_CHECK(strv_len(q) <= 64, "%zu queues accepted", strv_len(q));
    for (size_t i = 0; q && q[i]; i++)
        FUZZ_CHECK(queue_name_valid(q[i]), "the invalid queue '%s' was accepted", q[i]);
}

static void heartbeat(json_t *body)
{
    HeartbeatMsg hb;
    Err err = {0};
    if (parse_heartbeat(body, &hb, &err) != 0) {
        fuzz_check_problem(&err, 400, 400);
        return;
    }
    FUZZ_CHECK(!hb.instance || id_valid(hb.instance), "the invalid instance '%s' was accepted",
               hb.instance);
    FUZZ_CHECK(hb.capacity >= 1 && hb.capacity <= 100000, "capacity %d accepted", hb.capacity);
    for (size_t i = 0; hb.running && i < hb.running->n; i++)
        FUZZ_CHECK(work_id_valid(hb.running->items[i].work_id) && hb.running->items[i].attempt >= 1,
                   "'running' item %zu (%s, %lld) was accepted", i, hb.running->items[i].work_id,
                   (long long)hb.running->items[i].attempt);
    check_queues(hb.queues);
    free(hb.instance);
    strv_free(hb.queues);
    ws_running_free(hb.running);
}

static void check_typed_report(const Report *r);

static void pull(json_t *body)
{
    PullMsg pm;
    Err err = {0};
    if (parse_pull(body, &pm, &err) != 0) {
        fuzz_check_problem(&err, 400, 400);
        return;
    }
    FUZZ_CHECK(!pm.instance || id_valid(pm.instance), "the invalid instance '%s' was accepted",
               pm.instance);
    FUZZ_CHECK(pm.max >= 1 && pm.max <= 10000, "max %d accepted", pm.max);
    FUZZ_CHECK(pm.wait_ms >= 0 && pm.wait_ms <= 3600 * 1000, "wait %lldms accepted",
               (long long)pm.wait_ms);
    check_queues(pm.queues);
    for (size_t i = 0; i < pm.n_reports; i++)
        check_typed_report(&pm.reports[i]);
    free(pm.instance);
    strv_free(pm.queues);
    ws_reports_free(pm.reports, pm.n_reports);
}

/* What the manager relies on in a report it is handed. */
static void check_typed_report(const Report *r)
{
    FUZZ_CHECK(r->work_id && work_id_valid(r->work_id), "a report of the invalid work id '%s'",
               r->work_id ? r->work_id : "(null)");
    FUZZ_CHECK(r->attempt >= 1 && r->attempt <= 1000000, "a report of attempt %d", r->attempt);
    FUZZ_CHECK(!r->worker_id && !r->instance && !r->claim,
               "the parser filled in the sender, which is the manager's to say");
}

static void reports(json_t *body)
{
    Report *reps;
    size_t n;
    char *instance;
    Err err = {0};
    if (parse_reports(body, MAX_BATCH, &reps, &n, &instance, &err) != 0) {
        fuzz_check_problem(&err, 400, 413);
        FUZZ_CHECK(!reps && !n && !instance, "refused reports are handed back");
        return;
    }
    FUZZ_CHECK(!instance || id_valid(instance), "the invalid instance '%s' was accepted", instance);
    free(instance);
    FUZZ_CHECK(n <= MAX_BATCH, "%zu reports accepted", n);
    for (size_t i = 0; i < n; i++)
        check_typed_report(&reps[i]);
    ws_reports_free(reps, n);
}

/* The path's "ID/N" splits at the first '/' (a path segment holds none). */
static void single_report(json_t *body, const char *path, bool completed)
{
    char *id = xstrdup(path);
    char *slash = strchr(id, '/');
    const char *attempt = slash ? slash + 1 : "";
    if (slash)
        *slash = '\0';
    Report *reps;
    size_t n;
    char *worker_id, *instance;
    Err err = {0};
    if (parse_single_report(body, id, attempt, completed, &reps, &n, &worker_id, &instance, &err) !=
        0) {
        fuzz_check_problem(&err, 400, 400);
        FUZZ_CHECK(!reps && !worker_id && !instance, "a refused report hands something back");
        free(id);
        return;
    }
    FUZZ_CHECK(id_valid(worker_id) || !strcmp(worker_id, "anonymous"),
               "the invalid worker id '%s' was accepted", worker_id);
    /* It goes where a batch of reports goes: it must be one of them. */
    FUZZ_CHECK(n == 1, "a single report made %zu reports", n);
    check_typed_report(&reps[0]);
    FUZZ_CHECK(reps[0].completed == completed && !strcmp(reps[0].work_id, id),
               "the report is not the one the path names");
    FUZZ_CHECK(!completed || reps[0].result, "a completion without a result (not even null)");
    FUZZ_CHECK(!instance || id_valid(instance), "the invalid instance '%s' was accepted", instance);
    free(instance);
    ws_reports_free(reps, n);
    free(worker_id);
    free(id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char kinds[] = "hprcf";
    char kind = data[0] && strchr(kinds, data[0]) ? (char)data[0] : kinds[data[0] % 5];
    data++;
    size--;
    char *path = NULL;
    if (kind == 'c' || kind == 'f') {
        const uint8_t *nl = memchr(data, '\n', size);
        size_t plen = nl ? (size_t)(nl - data) : size;
        path = fuzz_cstr(data, plen);
        data += plen + (nl ? 1 : 0);
        size -= plen + (nl ? 1 : 0);
    }
    Err err = {0};
    json_t *body = parse_json_body((const char *)data, size, MAX_DEPTH, &err);
    if (!body) {
        fuzz_check_problem(&err, 400, 400);
        free(path);
        return 0;
    }
    switch (kind) {
    case 'h':
        heartbeat(body);
        break;
    case 'p':
        pull(body);
        break;
    case 'r':
        reports(body);
        break;
    default:
        single_report(body, path, kind == 'c');
        break;
    }
    json_decref(body);
    free(path);
    return 0;
}
