/* Tests of how the worker reads the server's answer to a batch of reports
 * (reports.c): what is forgotten, dropped or sent again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "reports.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

static const ReportKey keys[] = {{"job-1", 1}, {"job-2", 3}, {"job-3", 1}, {"job-4", 2}};

static const char *verdict_name(ReportVerdict v)
{
    return v == REPORT_ACCEPTED ? "accepted" : v == REPORT_SUPERSEDED ? "superseded" : "retry";
}

static void expect(const ReportAnswer *a, size_t i, ReportVerdict want, const char *reason)
{
    CHECK(a[i].verdict == want, "report %zu (%s) should be '%s' but is '%s' (%s)", i, keys[i].id,
          verdict_name(want), verdict_name(a[i].verdict), a[i].reason);
    if (reason)
        CHECK(strstr(a[i].reason, reason) != NULL,
              "report %zu should be retried because of '%s', the reason given is '%s'", i, reason,
              a[i].reason);
}

static void test_answer_verdicts(void **state)
{
    const char *body =
        "{\"results\": ["
        "{\"id\": \"job-1\", \"attempt\": 1, \"accepted\": true, \"status\": \"completed\"},"
        "{\"id\": \"job-2\", \"attempt\": 3, \"accepted\": false, \"reason\": \"superseded\"},"
        "{\"id\": \"job-3\", \"attempt\": 1, \"accepted\": false, \"reason\": \"busy\"}"
        "]}";
    ReportAnswer a[4];
    Err err;
    CHECK(reports_read_answer(body, keys, 4, a, &err) == 0, "a valid answer was refused: %s",
          err.msg);
    expect(a, 0, REPORT_ACCEPTED, NULL);
    expect(a, 1, REPORT_SUPERSEDED, NULL);
    expect(a, 2, REPORT_RETRY, "refused: busy");
    expect(a, 3, REPORT_RETRY, "no entry");
}

static void test_answer_for_other_attempts_is_retried(void **state)
{
    const char *body = "{\"results\": ["
                       "{\"id\": \"job-1\", \"attempt\": 2, \"accepted\": true},"
                       "{\"id\": \"job-9\", \"attempt\": 3, \"accepted\": true}"
                       "]}";
    ReportAnswer a[2];
    Err err;
    CHECK(reports_read_answer(body, keys, 2, a, &err) == 0, "a valid answer was refused: %s",
          err.msg);
    expect(a, 0, REPORT_RETRY, "another attempt");
    expect(a, 1, REPORT_RETRY, "another attempt");
}

static void test_bad_answers_are_errors(void **state)
{
    const char *bad[] = {"", "not json", "[]", "{\"results\": 3}", "{\"jobs\": []}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ReportAnswer a[1];
        Err err;
        err_clear(&err);
        CHECK(reports_read_answer(bad[i], keys, 1, a, &err) == -1,
              "the answer '%s' should be refused as not an answer", bad[i]);
        CHECK(err.msg[0], "refusing '%s' should say why", bad[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer_verdicts),
        cmocka_unit_test(test_answer_for_other_attempts_is_retried),
        cmocka_unit_test(test_bad_answers_are_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
