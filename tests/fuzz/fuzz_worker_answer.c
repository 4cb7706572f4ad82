/* Fuzzes how the worker reads the server's answers. The first byte picks the
 * answer: 'j' to a pull (worker_read_pull_answer, and demo_square on every
 * job's payload, as a demo worker runs it), 'r' to a batch of reports
 * (reports_read_answer), 'h' to a heartbeat (worker_read_heartbeat_answer),
 * 'e' an error body (link_describe), 'x' a job's stderr (exec_utf8_clean). */
#include "fuzz.h"

#include <jansson.h>

#include "demo.h"
#include "exec.h"
#include "link.h"
#include "reports.h"
#include "worker.h"

static const ReportKey keys[] = {{"job-1", 1}, {"job-2", 2}, {"job-3", 1}, {"job-4", 7}};
#define NKEYS (sizeof keys / sizeof keys[0])

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void pull_answer(const char *body)
{
    size_t n, runnable;
    Err err = {0};
    if (worker_read_pull_answer(body, &n, &runnable, &err) != 0)
        return;
    FUZZ_CHECK(runnable <= n, "%zu runnable jobs of %zu", runnable, n);
    json_t *ans = json_loads(body, 0, NULL);
    size_t i;
    json_t *job;
    json_array_foreach(json_object_get(ans, "jobs"), i, job)
    {
        ExecOutcome o;
        demo_square(json_object_get(job, "payload"), &o);
        FUZZ_CHECK(o.ok ? o.result && !o.error : !o.result && o.error,
                   "a demo outcome has both or neither of result and error");
        exec_outcome_free(&o);
    }
    json_decref(ans);
}

static void reports_answer(const char *body)
{
    ReportAnswer a[NKEYS];
    Err err = {0};
    if (reports_read_answer(body, keys, NKEYS, a, &err) != 0)
        return;
    for (size_t i = 0; i < NKEYS; i++) {
        FUZZ_CHECK(a[i].verdict == REPORT_ACCEPTED || a[i].verdict == REPORT_SUPERSEDED ||
                       a[i].verdict == REPORT_RETRY,
                   "report %zu has the verdict %d", i, (int)a[i].verdict);
        FUZZ_CHECK(memchr(a[i].reason, '\0', sizeof a[i].reason),
                   "the reason of report %zu is not terminated", i);
    }
}

static void heartbeat_answer(const char *body)
{
    int64_t iv = worker_read_heartbeat_answer(body, 1234);
    FUZZ_CHECK(iv == 1234 || (iv >= 100 && iv <= 60000), "the heartbeat interval is %lldms",
               (long long)iv);
}

static void error_body(char *body, size_t len)
{
    HttpResp resp = {.status = 503, .body = body, .len = len, .retry_after_ms = -1};
    char out[600];
    memset(out, 'X', sizeof out);
    link_describe(&resp, NULL, out, sizeof out);
    FUZZ_CHECK(memchr(out, '\0', sizeof out) && !strncmp(out, "HTTP 503", 8),
               "an error body is described as '%.40s'", out);
}

static void stderr_text(const uint8_t *data, size_t size)
{
    char *clean = exec_utf8_clean((const char *)data, size);
    FUZZ_CHECK(strlen(clean) == size, "%zu bytes of stderr became %zu", size, strlen(clean));
    json_t *s = json_string(clean);
    FUZZ_CHECK(s, "cleaned stderr is not valid UTF-8");
    json_decref(s);
    free(clean);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char kinds[] = "jrhex";
    char kind = data[0] && strchr(kinds, data[0]) ? (char)data[0] : kinds[data[0] % 5];
    char *body = fuzz_cstr(data + 1, size - 1);
    switch (kind) {
    case 'j':
        pull_answer(body);
        break;
    case 'r':
        reports_answer(body);
        break;
    case 'h':
        heartbeat_answer(body);
        break;
    case 'e':
        error_body(body, size - 1);
        break;
    default:
        stderr_text(data + 1, size - 1);
        break;
    }
    free(body);
    return 0;
}
