/* Tests of the worker's executors with real child processes: exec.c (results,
 * failures, signals, timeouts, output bounds, stopping) and demo.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "demo.h"
#include "exec.h"
#include "util.h"

/* Fails the test with a sentence when cond is false. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

/* Runs cmd with input and bounds; the outcome is the caller's to free. */
static void run(const char *cmd, const char *input, int64_t timeout_ms, int64_t kill_grace_ms,
                size_t max_output, ExecCtl *ctl, ExecOutcome *o)
{
    ExecSpec spec = {.cmd = cmd,
                     .input = input,
                     .input_len = input ? strlen(input) : 0,
                     .timeout_ms = timeout_ms,
                     .kill_grace_ms = kill_grace_ms,
                     .max_output = max_output};
    Err err;
    err_clear(&err);
    int rc = exec_run(&spec, ctl, o, &err);
    CHECK(rc == 0, "exec_run('%s') could not run the command: %s", cmd, err.msg);
}

static void run_simple(const char *cmd, const char *input, ExecOutcome *o)
{
    run(cmd, input, 10000, 1000, 1 << 20, NULL, o);
}

static char *dump(const json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    return s ? s : xstrdup("(none)");
}

/* Checks that the outcome is a success whose result equals the JSON text want. */
static void expect_result(const char *cmd, const ExecOutcome *o, const char *want)
{
    CHECK(o->ok, "'%s' should succeed but failed: %s", cmd, o->error ? o->error : "(no error)");
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    CHECK(w, "the test's expected JSON '%s' does not parse", want);
    char *got = dump(o->result);
    CHECK(json_equal(o->result, w), "'%s' should give %s but gave %s", cmd, want, got);
    free(got);
    json_decref(w);
}

static void expect_failure(const char *cmd, const ExecOutcome *o, const char *prefix)
{
    char *got = dump(o->result);
    CHECK(!o->ok, "'%s' should fail but succeeded with %s", cmd, got);
    free(got);
    CHECK(o->error && strncmp(o->error, prefix, strlen(prefix)) == 0,
          "'%s' should fail with an error starting '%s' but the error is '%s'", cmd, prefix,
          o->error ? o->error : "(none)");
    json_t *js = json_string(o->error);
    CHECK(js != NULL, "the error of '%s' is not valid UTF-8 for a report", cmd);
    json_decref(js);
}

static void test_json_on_stdout_is_the_result(void **state)
{
    ExecOutcome o;
    run_simple("cat", "{\"n\": [1, 2.5, \"x\"]}\n", &o);
    expect_result("cat", &o, "{\"n\": [1, 2.5, \"x\"]}");
    CHECK(o.exit_code == 0, "cat should exit 0, got %d", o.exit_code);
    exec_outcome_free(&o);

    run_simple("echo 42", NULL, &o);
    expect_result("echo 42", &o, "42");
    exec_outcome_free(&o);
}

static void test_job_environment_is_passed(void **state)
{
    char *add[] = {"WORKD_WORK_ID=job-7", "WORKD_ATTEMPT=3", "WORKD_QUEUE=q1", "HOME=/nowhere",
                   NULL};
    char *base[] = {"HOME=/root", "PATH=/usr/bin:/bin", "KEEP=yes", NULL};
    char **env = exec_env_merge(base, add);
    CHECK(strv_len(env) == 6, "merging 3 entries with 5 (one replaced) should give 6, got %zu",
          strv_len(env));
    const char *cmd = "printf '[\"%s\",\"%s\",\"%s\",\"%s\",\"%s\"]' \"$WORKD_WORK_ID\" "
                      "\"$WORKD_ATTEMPT\" \"$WORKD_QUEUE\" \"$HOME\" \"$KEEP\"";
    ExecSpec spec = {
        .cmd = cmd, .env = env, .timeout_ms = 10000, .kill_grace_ms = 1000, .max_output = 4096};
    ExecOutcome o;
    Err err;
    CHECK(exec_run(&spec, NULL, &o, &err) == 0, "exec_run failed: %s", err.msg);
    expect_result("printf of the environment", &o, "[\"job-7\",\"3\",\"q1\",\"/nowhere\",\"yes\"]");
    exec_outcome_free(&o);
    strv_free(env);
}

/* What a paced job's progress callback saw: the lines, and how many reads
 * of the pipe brought them (callbacks less than 5 ms apart are one read). */
typedef struct {
    int lines, reads, out_of_order;
    int64_t last_ms;
} ProgressSeen;

static void saw_progress(void *ud, const char *line, size_t len)
{
    ProgressSeen *p = ud;
    char want[32];
    snprintf(want, sizeof want, "line %d", p->lines + 1);
    if (len != strlen(want) || memcmp(line, want, len) != 0)
        p->out_of_order++;
    p->lines++;
    int64_t now = mono_ms();
    if (p->reads == 0 || now - p->last_ms >= 5)
        p->reads++;
    p->last_ms = now;
}

static void test_progress_is_read_at_its_pace_and_whole(void **state)
{
    /* 40 lines about 20 ms apart, read at most every 300 ms: a few reads
     * bring them all, in order, the last ones after the job's exit. With
     * no pace it is about one read per line. */
    ProgressSeen seen = {0};
    ExecSpec spec = {.cmd = "i=1; while [ $i -le 40 ]; do echo \"line $i\" >&3; sleep 0.02; "
                            "i=$((i + 1)); done; echo null",
                     .timeout_ms = 20000,
                     .kill_grace_ms = 1000,
                     .max_output = 4096,
                     .progress_fd = 3,
                     .progress_pace_ms = 300,
                     .progress = saw_progress,
                     .progress_ud = &seen};
    ExecOutcome o;
    Err err;
    CHECK(exec_run(&spec, NULL, &o, &err) == 0, "exec_run failed: %s", err.msg);
    CHECK(o.ok, "the job should succeed: %s", o.error ? o.error : "");
    CHECK(seen.lines == 40 && seen.out_of_order == 0,
          "all 40 lines should come, in order: %d came, %d out of order", seen.lines,
          seen.out_of_order);
    /* One read per pace and one at the exit, plus slack for a read counted
     * twice when the thread is preempted between its lines. */
    int64_t most = o.elapsed_ms / 300 + 4;
    CHECK(seen.reads <= most, "%d reads in %lld ms at a pace of 300 ms (at most %lld expected)",
          seen.reads, (long long)o.elapsed_ms, (long long)most);
    exec_outcome_free(&o);
}

static void test_text_on_stdout_is_a_string(void **state)
{
    ExecOutcome o;
    run_simple("echo hello world", NULL, &o);
    expect_result("echo hello world", &o, "\"hello world\"");
    exec_outcome_free(&o);

    run_simple("printf 'two\\nlines\\n\\n'", NULL, &o);
    expect_result("printf two lines", &o, "\"two\\nlines\"");
    exec_outcome_free(&o);

    run_simple("printf '{\"half\": '", NULL, &o);
    expect_result("printf of broken JSON", &o, "\"{\\\"half\\\": \"");
    exec_outcome_free(&o);
}

static void test_empty_stdout_is_null(void **state)
{
    ExecOutcome o;
    run_simple("true", NULL, &o);
    expect_result("true", &o, "null");
    exec_outcome_free(&o);

    run_simple("echo", NULL, &o);
    expect_result("echo (a lone newline)", &o, "null");
    exec_outcome_free(&o);
}

static void test_non_utf8_stdout_fails(void **state)
{
    ExecOutcome o;
    run_simple("printf '\\377\\376abc'", NULL, &o);
    expect_failure("printf of bytes that are not UTF-8", &o, "output is neither JSON nor UTF-8");
    exec_outcome_free(&o);
}

static void test_nonzero_exit_fails_with_stderr_tail(void **state)
{
    ExecOutcome o;
    const char *cmd = "echo starting; echo boom >&2; exit 3";
    run_simple(cmd, NULL, &o);
    expect_failure(cmd, &o, "exit 3: boom");
    CHECK(o.exit_code == 3, "exit code should be 3, got %d", o.exit_code);
    CHECK(strcmp(o.error, "exit 3: boom") == 0, "error should be exactly 'exit 3: boom', got '%s'",
          o.error);
    CHECK(o.retry, "a failed command should be retried");
    exec_outcome_free(&o);

    /* 500 lines of noise: only the tail is kept, and it ends with the last line. */
    cmd = "i=0; while [ $i -lt 500 ]; do echo \"line $i of noise\" >&2; i=$((i+1)); done; "
          "printf '\\377 bad byte' >&2; exit 1";
    run_simple(cmd, NULL, &o);
    expect_failure("500 lines on stderr", &o, "exit 1: \xe2\x80\xa6");
    size_t len = strlen(o.error);
    CHECK(len <= EXEC_STDERR_TAIL + 64, "the error should carry only ~%d bytes of stderr, has %zu",
          EXEC_STDERR_TAIL, len);
    CHECK(strstr(o.error, "line 499 of noise\n? bad byte") != NULL,
          "the error should end with the last lines of stderr (bad byte as '?'), got '...%s'",
          o.error + (len > 80 ? len - 80 : 0));
    CHECK(strstr(o.error, "line 1 of noise") == NULL, "the head of stderr should be cut off");
    exec_outcome_free(&o);

    run_simple("exit 2", NULL, &o);
    expect_failure("exit 2", &o, "exit 2");
    CHECK(strcmp(o.error, "exit 2") == 0, "without stderr the error is 'exit 2', got '%s'",
          o.error);
    exec_outcome_free(&o);
}

static void test_killed_by_signal_fails(void **state)
{
    ExecOutcome o;
    run_simple("echo about to die >&2; kill -KILL $$", NULL, &o);
    expect_failure("kill -KILL $$", &o, "killed by signal 9 (SIGKILL)");
    CHECK(o.term_signal == SIGKILL, "the signal should be SIGKILL (9), got %d", o.term_signal);
    CHECK(o.exit_code == -1, "a killed child has no exit code, got %d", o.exit_code);
    CHECK(strstr(o.error, ": about to die") != NULL, "the stderr tail is missing from '%s'",
          o.error);
    exec_outcome_free(&o);

    run_simple("kill -SEGV $$", NULL, &o);
    expect_failure("kill -SEGV $$", &o, "killed by signal 11 (SIGSEGV)");
    exec_outcome_free(&o);
}

static void test_timeout_ends_with_sigterm(void **state)
{
    ExecOutcome o;
    int64_t t0 = mono_ms();
    run("sleep 10", NULL, 200, 5000, 1 << 20, NULL, &o);
    int64_t took = mono_ms() - t0;
    expect_failure("sleep 10 with a 200ms timeout", &o,
                   "timed out after 200ms; killed by signal 15 (SIGTERM)");
    CHECK(o.timed_out, "the outcome should say timed out");
    CHECK(took >= 200 && took < 3000, "it should end soon after 200ms, took %lldms",
          (long long)took);
    exec_outcome_free(&o);
}

static void test_timeout_kills_a_child_that_ignores_sigterm(void **state)
{
    ExecOutcome o;
    const char *cmd = "trap '' TERM; echo trapped >&2; while :; do sleep 0.05; done";
    int64_t t0 = mono_ms();
    run(cmd, NULL, 200, 300, 1 << 20, NULL, &o);
    int64_t took = mono_ms() - t0;
    expect_failure(cmd, &o,
                   "timed out after 200ms; killed by SIGKILL after ignoring SIGTERM for 300ms");
    CHECK(o.term_signal == SIGKILL, "the child should end by SIGKILL, got signal %d",
          o.term_signal);
    CHECK(took >= 500 && took < 3000,
          "SIGKILL should come 300ms after the 200ms timeout, took %lldms", (long long)took);
    CHECK(strstr(o.error, ": trapped") != NULL, "the stderr tail is missing from '%s'", o.error);
    exec_outcome_free(&o);
}

static void test_too_much_output_fails(void **state)
{
    ExecOutcome o;
    run("head -c 5000 /dev/zero | tr '\\0' x", NULL, 10000, 1000, 1000, NULL, &o);
    expect_failure("5000 bytes with a 1000-byte limit", &o, "output larger than 1000 bytes");
    CHECK(o.output_too_large, "the outcome should say the output was too large");
    exec_outcome_free(&o);

    /* Endless output: the child is ended, not left to fill memory or run forever. */
    int64_t t0 = mono_ms();
    run("yes", NULL, 10000, 1000, 1000, NULL, &o);
    expect_failure("yes with a 1000-byte limit", &o, "output larger than 1000 bytes");
    CHECK(mono_ms() - t0 < 3000, "yes should be stopped at once, took %lldms",
          (long long)(mono_ms() - t0));
    exec_outcome_free(&o);

    run("head -c 1000 /dev/zero | tr '\\0' x", NULL, 10000, 1000, 1000, NULL, &o);
    CHECK(o.ok, "exactly max-output bytes is allowed, but it failed: %s", o.error);
    exec_outcome_free(&o);
}

static void test_unread_input_does_not_hurt(void **state)
{
    /* More than a pipe holds, to a child that never reads: EPIPE, not SIGPIPE. */
    size_t n = 1 << 20;
    char *big = xmalloc(n + 1);
    memset(big, ' ', n);
    big[n] = '\0';
    big[0] = '1';
    ExecOutcome o;
    run_simple("exit 0", big, &o);
    expect_result("exit 0 with 1 MiB of input", &o, "null");
    exec_outcome_free(&o);

    run_simple("wc -c", big, &o);
    expect_result("wc -c of 1 MiB", &o, "1048576");
    exec_outcome_free(&o);
    free(big);
}

static bool gone_or_zombie(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *p = strrchr(buf, ')');
    return p && (p[2] == 'Z' || p[2] == 'X');
}

static void test_leftovers_are_killed(void **state)
{
    ExecOutcome o;
    int64_t t0 = mono_ms();
    run_simple("sleep 30 & echo $!", NULL, &o);
    CHECK(mono_ms() - t0 < 3000,
          "a background process holding stdout should not delay the "
          "result, took %lldms",
          (long long)(mono_ms() - t0));
    CHECK(o.ok && json_is_integer(o.result), "the result should be the pid of sleep, got %s",
          o.error ? o.error : "something else");
    pid_t pid = (pid_t)json_integer_value(o.result);
    int64_t until = mono_ms() + 2000;
    while (!gone_or_zombie(pid) && mono_ms() < until)
        sleep_ms(10);
    CHECK(gone_or_zombie(pid), "the background sleep (pid %ld) should have been killed", (long)pid);
    exec_outcome_free(&o);
}

typedef struct Stopper {
    ExecCtl *ctl;
    int64_t after_ms;
    bool at_once;
} Stopper;

static void *stop_later(void *arg)
{
    Stopper *s = arg;
    sleep_ms(s->after_ms);
    exec_ctl_stop(s->ctl, s->at_once);
    return NULL;
}

static void test_stop_from_another_thread(void **state)
{
    ExecCtl ctl;
    Err err;
    CHECK(exec_ctl_init(&ctl, &err) == 0, "exec_ctl_init: %s", err.msg);
    ExecOutcome o;

    /* A gentle stop: SIGTERM. */
    Stopper s = {.ctl = &ctl, .after_ms = 200, .at_once = false};
    pthread_t t;
    pthread_create(&t, NULL, stop_later, &s);
    int64_t t0 = mono_ms();
    run("sleep 10", NULL, 0, 5000, 1 << 20, &ctl, &o);
    pthread_join(t, NULL);
    expect_failure("sleep 10, stopped", &o, "worker stopping");
    CHECK(o.stopped && o.retry, "a stopped job should say stopped and be retried");
    CHECK(mono_ms() - t0 < 3000, "the stop should end it at once, took %lldms",
          (long long)(mono_ms() - t0));
    exec_outcome_free(&o);

    /* Sticky: the next job does not even start. */
    run("echo should not run", NULL, 0, 5000, 1 << 20, &ctl, &o);
    expect_failure("a job after the stop", &o, "worker stopping");
    exec_outcome_free(&o);

    /* At once: SIGKILL, even for a child that ignores SIGTERM. */
    exec_ctl_reset(&ctl);
    s.at_once = true;
    pthread_create(&t, NULL, stop_later, &s);
    t0 = mono_ms();
    run("trap '' TERM; while :; do sleep 0.05; done", NULL, 0, 5000, 1 << 20, &ctl, &o);
    pthread_join(t, NULL);
    expect_failure("a TERM-proof loop, killed at once", &o, "worker stopping");
    CHECK(o.term_signal == SIGKILL, "it should end by SIGKILL, got signal %d", o.term_signal);
    CHECK(mono_ms() - t0 < 3000, "the kill should not wait for the kill grace, took %lldms",
          (long long)(mono_ms() - t0));
    exec_outcome_free(&o);

    exec_ctl_reset(&ctl);
    run("echo 1", NULL, 0, 5000, 1 << 20, &ctl, &o);
    expect_result("echo 1 after a reset", &o, "1");
    exec_outcome_free(&o);
    exec_ctl_destroy(&ctl);
}

static void test_utf8_clean(void **state)
{
    const char in[] = "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 bad:\xff\xc3(\xed\xa0\x80|\0|";
    char *s = exec_utf8_clean(in, sizeof in - 1);
    CHECK(strcmp(s, "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 bad:?\?(?\?\?|?|") == 0,
          "valid characters should stay and every bad byte become '?', got '%s'", s);
    free(s);
}

/* ---- demo ---- */

static void expect_demo(const char *payload, const char *want)
{
    json_t *p = json_loads(payload, JSON_DECODE_ANY, NULL);
    ExecOutcome o;
    demo_square(p, &o);
    CHECK(o.ok, "the demo of %s should succeed, failed: %s", payload, o.error);
    CHECK(json_is_string(o.result) && strcmp(json_string_value(o.result), want) == 0,
          "the demo of %s should give \"%s\", gave \"%s\"", payload, want,
          json_string_value(o.result) ? json_string_value(o.result) : "(not a string)");
    exec_outcome_free(&o);
    json_decref(p);
}

static void test_demo_squares_numbers(void **state)
{
    expect_demo("3", "3 * 3 = 9");
    expect_demo("-4", "-4 * -4 = 16");
    expect_demo("0", "0 * 0 = 0");
    expect_demo("1.5", "1.5 * 1.5 = 2.25");
    expect_demo("3037000500", "3037000500 * 3037000500 = 9223372037000250000");
    expect_demo(
        "-9223372036854775808",
        "-9223372036854775808 * -9223372036854775808 = 85070591730234615865843651857942052864");
}

static void test_demo_refuses_what_is_not_a_number(void **state)
{
    const char *bad[] = {"\"3\"", "null", "[3]", "{\"n\": 3}", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *p = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        ExecOutcome o;
        demo_square(p, &o);
        expect_failure(bad[i], &o, "demo work wants a number");
        CHECK(!o.retry, "a payload that is not a number will never work: retry must be false");
        exec_outcome_free(&o);
        json_decref(p);
    }
}

static void test_demo_run_waits_and_stops(void **state)
{
    json_t *p = json_integer(7);
    ExecOutcome o;
    int64_t t0 = mono_ms();
    demo_run(p, 0, NULL, &o);
    CHECK(o.ok && mono_ms() - t0 < 100, "with no delay the demo should answer at once");
    exec_outcome_free(&o);

    ExecCtl ctl;
    Err err;
    CHECK(exec_ctl_init(&ctl, &err) == 0, "exec_ctl_init: %s", err.msg);
    Stopper s = {.ctl = &ctl, .after_ms = 100, .at_once = false};
    pthread_t t;
    pthread_create(&t, NULL, stop_later, &s);
    t0 = mono_ms();
    /* Up to an hour of delay: only the stop can end it in time. Retry until the
     * random delay is long enough for the stop to land (almost always at once). */
    demo_run(p, 3600 * 1000, &ctl, &o);
    pthread_join(t, NULL);
    if (o.ok) {
        exec_outcome_free(&o);
        demo_run(p, 3600 * 1000, &ctl, &o);
    }
    CHECK(o.stopped && !o.ok, "a stopped demo job should be given back");
    CHECK(mono_ms() - t0 < 3000, "the stop should end the delay at once, took %lldms",
          (long long)(mono_ms() - t0));
    exec_outcome_free(&o);
    exec_ctl_destroy(&ctl);
    json_decref(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_on_stdout_is_the_result),
        cmocka_unit_test(test_job_environment_is_passed),
        cmocka_unit_test(test_progress_is_read_at_its_pace_and_whole),
        cmocka_unit_test(test_text_on_stdout_is_a_string),
        cmocka_unit_test(test_empty_stdout_is_null),
        cmocka_unit_test(test_non_utf8_stdout_fails),
        cmocka_unit_test(test_nonzero_exit_fails_with_stderr_tail),
        cmocka_unit_test(test_killed_by_signal_fails),
        cmocka_unit_test(test_timeout_ends_with_sigterm),
        cmocka_unit_test(test_timeout_kills_a_child_that_ignores_sigterm),
        cmocka_unit_test(test_too_much_output_fails),
        cmocka_unit_test(test_unread_input_does_not_hurt),
        cmocka_unit_test(test_leftovers_are_killed),
        cmocka_unit_test(test_stop_from_another_thread),
        cmocka_unit_test(test_utf8_clean),
        cmocka_unit_test(test_demo_squares_numbers),
        cmocka_unit_test(test_demo_refuses_what_is_not_a_number),
        cmocka_unit_test(test_demo_run_waits_and_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
