"""workd-worker against the real server and a real PostgreSQL: the demo job end
to end, --exec results and failures, crashing and hanging jobs, a worker killed
mid-job, a graceful stop, concurrency, surviving server restarts and failovers,
an idle worker's request rate, and the command line."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, completions_by_id, events_of, expect,  # noqa: E402
                   get_work, heartbeat, leader_of, pull, submit, wait_new_leader, wait_status)

FAST = ["--election-interval", "100ms", "--worker-timeout", "2s", "--lease-grace", "1s",
        "--backoff-base", "50ms", "--backoff-max", "200ms", "--heartbeat-interval", "500ms"]


# ------------------------------------------------------------------ helpers

def start_server(cluster, name="s1", extra=()):
    s = cluster.start_server(name, extra_args=FAST + list(extra))
    wait_leader(s.url)
    return s


def workers_at(url):
    """{worker id: entry} of GET /cluster."""
    r = expect(http("GET", url + "/cluster", timeout=10), 200, "GET /cluster")
    return {w["id"]: w for w in r.json()["workers"]}


def start_worker(cluster, name, url, args=(), env=None, cluster_url=None):
    """Start workd-worker NAME against url; wait until the server lists it."""
    w = cluster.start_worker(name, url, list(args), env=env)

    def registered():
        if not w.alive():
            raise AssertionError(f"worker {name} exited with {w.returncode} before registering:"
                                 f"\n{w.log_tail()}")
        return name in workers_at(cluster_url or url) and "registered with" in w.log_text()
    wait_until(registered, 15, what=f"worker {name} to register (GET /cluster and its log)")
    return w


def write_script(cluster, name, body, **subst):
    """An executable /bin/sh script in the test's directory; @KEY@ is replaced by subst[KEY]."""
    text = "#!/bin/sh\n" + textwrap.dedent(body).lstrip("\n")
    for key, value in subst.items():
        text = text.replace(f"@{key}@", str(value))
    path = cluster.tmp / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def marked_sleep(cluster):
    """(path, marker): a `sleep` whose command line carries a unique marker that
    is in no other process's command line (not the worker's: only scripts name it)."""
    marker = "wdmark" + uuid.uuid4().hex
    link = cluster.tmp / f"sleep-{marker}"
    link.symlink_to(shutil.which("sleep"))
    return str(link), marker


def processes_with(marker):
    """Live processes whose command line contains marker, as 'pid args' lines."""
    r = subprocess.run(["pgrep", "-a", "-f", marker], capture_output=True, text=True, timeout=10)
    return r.stdout.strip().splitlines()


def worker_processes(name):
    """Live processes of workd-worker NAME (the worker and any helper it forked)."""
    return processes_with(f"workd-worker --server [^ ]+ --id {name}( |$)")


def wait_gone(marker, what, timeout=3.0, find=processes_with):
    wait_until(lambda: find(marker), timeout, until=lambda left: not left, what=what)


def history(cluster, work_id):
    """[(type, data)] of one work item's events, oldest first."""
    return [(e["type"], e["data"]) for e in events_of(cluster) if e["work_id"] == work_id]


def story(hist):
    """A history as short lines, for assertion messages."""
    out = []
    for t, d in hist:
        line = t + (f" {d['attempt']}" if "attempt" in d else "")
        if "worker_id" in d:
            line += f" on {d['worker_id']}"
        if d.get("error"):
            line += f": {d['error'][:80]}"
        out.append(line)
    return out


def wait_running(url, work_id, worker, attempt=1, timeout=15):
    return wait_until(lambda: get_work(url, work_id), timeout,
                      until=lambda w: (w["status"], w["worker_id"], w["attempts"])
                      == ("running", worker, attempt),
                      what=f"work {work_id} attempt {attempt} to run on {worker}")


def wait_log(proc, text, timeout=10):
    wait_until(lambda: text in proc.log_text(), timeout,
               what=lambda: f"{proc.name} to log {text!r}; log tail:\n{proc.log_tail(15)}")


def log_index(lines, text, what):
    for i, line in enumerate(lines):
        if text in line:
            return i
    raise AssertionError(f"the log should say {what} ({text!r}); it has:\n" + "\n".join(lines[-20:]))


def requests_total(url, route):
    """workd_http_requests_total of a route, summed over status classes."""
    text = expect(http("GET", url + "/metrics"), 200, "GET /metrics").text
    pat = re.compile(r'^workd_http_requests_total\{route="%s",code="[^"]*"\} (\S+)$'
                     % re.escape(route), re.M)
    return sum(int(float(m.group(1))) for m in pat.finditer(text))


def worker_binary():
    return str(harness.BIN_DIR / "workd-worker")


def clean_env(**extra):
    """Our environment without any WORKD_* setting, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKD_")}
    env.update(extra)
    return env


# -------------------------------------------------------------------- tests

def test_demo_end_to_end(cluster):
    s = start_server(cluster)
    numbers = [0, 1, 7, -12, 46341, 3037000500, 4294967296]
    with SSEClient(s.url + "/results?after=0") as sse:
        w = start_worker(cluster, "demo-1", s.url, ["--demo", "--demo-delay", "50ms"])
        ids = {submit(s.url, {"payload": n})["id"]: n for n in numbers}
        bad = submit(s.url, {"payload": "seven", "max_attempts": 3})["id"]
        for wid, n in ids.items():
            done = wait_status(s.url, wid, "completed", timeout=15)
            assert done["result"] == f"{n} * {n} = {n * n}", \
                f"GET /work of {n}: the demo should square it exactly, got {done['result']!r}"
            assert done["attempts"] == 1 and done["worker_id"] == "demo-1", \
                f"work {n} should be done once by demo-1: {done}"
        dead = wait_status(s.url, bad, "dead", timeout=15)
        assert dead["attempts"] == 1 and "wants a number" in (dead["last_error"] or ""), \
            f"a payload that is not a number fails at once, without retries: {dead}"
        sse.wait_count(len(ids) + 1, timeout=15)
        time.sleep(0.2)  # a declared window: a duplicate event, if any, would arrive here
        by_id = {}
        for ev in sse.events:
            by_id.setdefault(ev["data"]["id"], []).append(ev)
    for wid, n in ids.items():
        evs = by_id.get(wid, [])
        assert len(evs) == 1, f"/results should carry work {n} exactly once: {evs}"
        assert evs[0]["event"] == "completed" and evs[0]["data"]["result"] == f"{n} * {n} = {n * n}" \
            and evs[0]["data"]["attempt"] == 1, f"/results event of {n}: {evs[0]}"
    assert [e["event"] for e in by_id.get(bad, [])] == ["dead"], \
        f"/results should carry the bad payload as dead: {by_id.get(bad)}"

    lines = w.log_text().splitlines()
    reg = log_index(lines, "registered with " + s.url + " as demo-1", "that the worker registered")
    for wid, n in ids.items():
        started = log_index(lines, f"job {wid} attempt 1 started", f"that work {n} started")
        completed = log_index(lines, f'job {wid} attempt 1 completed: "{n} * {n} = {n * n}"',
                              f"that work {n} completed with its result")
        assert reg < started < completed, \
            f"the log of work {n} is out of order: registered {reg}, started {started}, " \
            f"completed {completed}"
    log_index(lines, f"job {bad} attempt 1 failed: demo work wants a number",
              "why the bad payload failed")
    assert w.stop() == 0, f"a graceful stop should exit 0:\n{w.log_tail()}"


def test_exec_results_failures_and_retries(cluster):
    s = start_server(cluster)
    job = write_script(cluster, "job.sh", r"""
        input=$(cat)
        case "$input" in
        '"text"')
            echo "plain words, not JSON" ;;
        '"flaky"')
            if [ "$WORKD_ATTEMPT" -lt 2 ]; then
                echo "flaky: attempt $WORKD_ATTEMPT failed" >&2
                exit 3
            fi
            echo "\"recovered on attempt $WORKD_ATTEMPT\"" ;;
        '"broken"')
            i=0
            while [ $i -lt 100 ]; do
                echo "noise line $i: ..............................................." >&2
                i=$((i + 1))
            done
            echo "broken: final words" >&2
            exit 4 ;;
        *)
            printf '{"input": %s, "work_id": "%s", "attempt": %s, "queue": "%s", "inherited": "%s", "leaked": "%s"}\n' \
                "$input" "$WORKD_WORK_ID" "$WORKD_ATTEMPT" "$WORKD_QUEUE" "${MY_SETTING:-}" \
                "${WORKD_LOG_LEVEL:-}${WORKD_CONCURRENCY:-}" ;;
        esac
        """)
    w = start_worker(cluster, "exec-1", s.url, ["--exec", job],
                     env={"MY_SETTING": "kept", "WORKD_LOG_LEVEL": "info",
                          "WORKD_CONCURRENCY": "2"})
    payload = {"n": 7, "text": "h\u00e9llo w\u00f6rld", "list": [1, 2.5, None, True]}
    submit(s.url, {"id": "echo", "payload": payload})
    submit(s.url, {"id": "echo-q", "payload": [3], "queue": "other"})
    submit(s.url, {"id": "text", "payload": "text"})
    submit(s.url, {"id": "flaky", "payload": "flaky", "max_attempts": 3})
    submit(s.url, {"id": "broken", "payload": "broken", "max_attempts": 2})

    echo = wait_status(s.url, "echo", "completed")
    assert echo["result"] == {"input": payload, "work_id": "echo", "attempt": 1,
                              "queue": "default", "inherited": "kept", "leaked": ""}, \
        "the job should get the payload JSON on stdin, WORKD_WORK_ID/ATTEMPT/QUEUE, our " \
        f"environment but not the worker's own WORKD_* settings; its stdout is the result: {echo}"
    echo_q = wait_status(s.url, "echo-q", "completed")
    assert echo_q["result"]["queue"] == "other" and echo_q["result"]["input"] == [3], echo_q
    text = wait_status(s.url, "text", "completed")
    assert text["result"] == "plain words, not JSON", \
        f"stdout that is not JSON is the result as a string, without the newline: {text}"

    flaky = wait_status(s.url, "flaky", "completed")
    assert flaky["result"] == "recovered on attempt 2" and flaky["attempts"] == 2, \
        f"the flaky job should fail once and succeed on its retry: {flaky}"
    hist = history(cluster, "flaky")
    assert [t for t, _ in hist] == ["accepted", "started", "failed", "started", "completed"], \
        f"history of the flaky job: {hist}"
    failed = hist[2][1]
    assert failed["attempt"] == 1 and failed["error"].startswith("exit 3") \
        and "flaky: attempt 1 failed" in failed["error"], \
        f"the failed attempt should carry the exit status and stderr: {failed}"
    assert hist[4][1]["attempt"] == 2, f"attempt 2 should be the one that completed: {hist[4]}"
    assert completions_by_id(cluster).get("flaky") == 1, "the flaky job must complete once"

    broken = wait_status(s.url, "broken", "dead")
    err = broken["last_error"] or ""
    assert broken["attempts"] == 2, f"broken should be tried max_attempts = 2 times: {broken}"
    assert err.startswith("exit 4: \u2026") and err.endswith("broken: final words"), \
        f"last_error should be the exit status and the (cut) tail of stderr: {err[:200]!r}"
    assert "noise line 0:" not in err and len(err.encode()) < 2200, \
        f"only the tail of stderr should be kept, got {len(err.encode())} bytes"
    assert not [e for e in events_of(cluster, ["completed"]) if e["work_id"] == "broken"]

    lines = w.log_text().splitlines()
    log_index(lines, "job flaky attempt 1 failed: exit 3: flaky: attempt 1 failed",
              "why the flaky job failed")
    log_index(lines, 'job flaky attempt 2 completed: "recovered on attempt 2"',
              "that the retry completed")


def test_crashing_job_is_retried_and_its_slot_reused(cluster):
    s = start_server(cluster)
    # Sourced by the shell the worker starts, so that this shell is the one that dies.
    crash = write_script(cluster, "crash.sh", r"""
        input=$(cat)
        if [ "$WORKD_ATTEMPT" -lt 2 ]; then
            echo "about to die by $input" >&2
            case "$input" in
            '"segv"') kill -SEGV $$ ;;
            '"kill"') kill -KILL $$ ;;
            esac
        fi
        echo "survived on attempt $WORKD_ATTEMPT"
        """)
    w = start_worker(cluster, "crash-1", s.url, ["--exec", ". " + crash, "--concurrency", "1"])
    for sig in ("segv", "kill"):
        submit(s.url, {"id": sig, "payload": sig, "max_attempts": 3})
    for sig, name, num in (("segv", "SIGSEGV", 11), ("kill", "SIGKILL", 9)):
        done = wait_status(s.url, sig, "completed")
        assert done["result"] == "survived on attempt 2" and done["attempts"] == 2, \
            f"the job killed by {name} should be retried and succeed: {done}"
        hist = history(cluster, sig)
        assert [t for t, _ in hist] == ["accepted", "started", "failed", "started", "completed"], \
            f"history of the {name} job: {hist}"
        error = hist[2][1]["error"]
        assert error.startswith(f"killed by signal {num} ({name})") \
            and f'about to die by "{sig}"' in error, \
            f"the failed attempt should say the job died by {name}, with its stderr: {error!r}"
        assert hist[1][1]["worker_id"] == hist[3][1]["worker_id"] == "crash-1"
    # One slot: the work after the crashes ran in the same (reused) slot.
    submit(s.url, {"id": "after", "payload": "ok"})
    after = wait_status(s.url, "after", "completed")
    assert after["result"] == "survived on attempt 1", after
    assert w.alive(), f"the worker must survive its jobs' crashes:\n{w.log_tail()}"
    wait_until(lambda: workers_at(s.url)["crash-1"]["running"] == [], 5,
               what="the worker to report no running job")
    assert completions_by_id(cluster) == {"segv": 1, "kill": 1, "after": 1}


def test_hanging_job_is_killed_at_its_timeout(cluster):
    # A long lease grace: the worker, not the server, must end the attempt.
    s = start_server(cluster, extra=["--lease-grace", "5s"])
    sleep, marker = marked_sleep(cluster)
    hang = write_script(cluster, "hang.sh", r"""
        if [ "$WORKD_ATTEMPT" -ge 2 ]; then
            echo "\"done on attempt $WORKD_ATTEMPT\""
            exit 0
        fi
        input=$(cat)
        if [ "$input" = '"stubborn"' ]; then
            trap '' TERM
        fi
        echo "sleeping" >&2
        "@SLEEP@" 60
        """, SLEEP=sleep)
    # Sourced, so that the shell the worker starts is the one that traps TERM.
    start_worker(cluster, "hang-1", s.url,
                 ["--exec", ". " + hang, "--concurrency", "2", "--kill-grace", "500ms"])
    t0 = time.monotonic()
    for kind in ("plain", "stubborn"):
        submit(s.url, {"id": kind, "payload": kind, "timeout": 1, "max_attempts": 2})
    wait_until(lambda: len(processes_with(marker)) == 2, 10,
               what="both hanging jobs to be sleeping")
    expected = {"plain": "timed out after 1000ms; killed by signal 15 (SIGTERM): sleeping",
                "stubborn": "timed out after 1000ms; killed by SIGKILL after ignoring SIGTERM "
                            "for 500ms: sleeping"}
    for kind, error in expected.items():
        done = wait_status(s.url, kind, "completed", timeout=15)
        assert done["result"] == "done on attempt 2" and done["attempts"] == 2, \
            f"the {kind} hanging job should be retried: {done}"
        hist = history(cluster, kind)
        assert [t for t, _ in hist] == ["accepted", "started", "failed", "started", "completed"], \
            f"the worker should fail the {kind} attempt itself (not the server's lease): {hist}"
        assert hist[2][1]["error"] == error, \
            f"the {kind} attempt's error: {hist[2][1]['error']!r}, expected {error!r}"
    took = time.monotonic() - t0
    assert took < 10, f"the hanging jobs took {took:.1f}s to be ended and retried (timeout 1s)"
    wait_gone(marker, "the killed jobs' processes (sleep 60) should be gone")


def test_killed_worker_job_is_retried_elsewhere(cluster):
    s = start_server(cluster)
    sleep, marker = marked_sleep(cluster)
    job = write_script(cluster, "slow.sh", r"""
        if [ "$WORKD_ATTEMPT" -ge 2 ]; then
            echo "\"done by $WORKER_NAME on attempt $WORKD_ATTEMPT\""
            exit 0
        fi
        "@SLEEP@" 10
        echo "\"done by $WORKER_NAME after sleeping\""
        """, SLEEP=sleep)
    a = start_worker(cluster, "wa", s.url, ["--exec", job], env={"WORKER_NAME": "wa"})
    submit(s.url, {"id": "job", "payload": 1, "max_attempts": 3})
    wait_running(s.url, "job", "wa")
    wait_until(lambda: processes_with(marker), 10, what="worker wa's job to be sleeping")
    start_worker(cluster, "wb", s.url, ["--exec", job], env={"WORKER_NAME": "wb"})
    a.kill(signal.SIGKILL)
    wait_gone(marker, "worker wa's job should die with it (it was killed with SIGKILL)", 2)
    wait_gone("wa", "no process of worker wa should outlive it", 2, find=worker_processes)

    done = wait_status(s.url, "job", "completed", timeout=15)
    told = story(history(cluster, "job"))
    assert told[:3] == ["accepted", "started 1 on wa", "failed 1: worker wa lost: no heartbeat "
                                                          "for 2000 ms"] \
        and told[3:] == ["started 2 on wb", "completed 2"], \
        "after wa's timeout its attempt should fail and the retry go to wb (an attempt started " \
        f"on wa after it died means the server served wa's dead long-poll): {told}"
    assert done["result"] == "done by wb on attempt 2", f"the retry's result: {done}"
    assert completions_by_id(cluster) == {"job": 1}, "the job must complete exactly once"


def test_sigterm_lets_the_running_job_finish(cluster):
    s = start_server(cluster)
    sleep, marker = marked_sleep(cluster)
    job = write_script(cluster, "two-seconds.sh", r"""
        "@SLEEP@" 2
        echo '"finished after 2s"'
        """, SLEEP=sleep)
    w = start_worker(cluster, "term-1", s.url, ["--exec", job, "--concurrency", "2"])
    submit(s.url, {"id": "long", "payload": 1})
    wait_running(s.url, "long", "term-1")
    wait_until(lambda: processes_with(marker), 10, what="the job to be sleeping")
    t0 = time.monotonic()
    w.kill(signal.SIGTERM)
    wait_log(w, "stopping: no new work taken")
    wait_log(w, "waiting up to")  # logged once its long-poll is given up
    # Work submitted now is not taken any more.
    submit(s.url, {"id": "later", "payload": 2})
    rc = w.stopped_with(20)
    took = time.monotonic() - t0
    assert rc == 0, f"a graceful stop should exit 0, not {rc}:\n{w.log_tail()}"
    assert took > 1.0, f"the worker exited {took:.2f}s after SIGTERM: it did not wait for the job"
    assert not worker_processes("term-1"), \
        f"the stopped worker left processes behind: {worker_processes('term-1')}"
    # Reported before exit: no need to wait for any of this.
    long = get_work(s.url, "long")
    assert long["status"] == "completed" and long["result"] == "finished after 2s" \
        and long["attempts"] == 1, f"the running job should finish and be reported: {long}"
    assert "term-1" not in workers_at(s.url), "the stopped worker should have deregistered"
    later = get_work(s.url, "later")
    assert later["status"] == "pending" and later["attempts"] == 0, \
        "work submitted after the worker gave up its long-poll must not be handed to it " \
        f"(the server must not serve a pull whose client has gone): {later}"
    lines = w.log_text().splitlines()
    order = [log_index(lines, "got SIGTERM", "that SIGTERM was received"),
             log_index(lines, "waiting up to", "that it waits for the running job"),
             log_index(lines, "job long attempt 1 completed", "that the job completed"),
             log_index(lines, "deregistered", "that it deregistered"),
             log_index(lines, "stopped", "that it stopped")]
    assert order == sorted(order), f"the stop is logged out of order: {order}"


def test_stop_past_grace_gives_back_and_second_signal_kills(cluster):
    s = start_server(cluster)
    sleep, marker = marked_sleep(cluster)
    job = write_script(cluster, "forever.sh", r"""
        if [ "$WORKD_ATTEMPT" -ge 3 ]; then
            echo '"done at last"'
            exit 0
        fi
        "@SLEEP@" 60
        """, SLEEP=sleep)
    # Graceful stop whose grace runs out: the job is stopped and given back.
    w1 = start_worker(cluster, "grace-1", s.url,
                      ["--exec", job, "--grace", "500ms", "--kill-grace", "300ms"])
    submit(s.url, {"id": "job", "payload": 1, "max_attempts": 5})
    wait_running(s.url, "job", "grace-1")
    wait_until(lambda: processes_with(marker), 10, what="the job to be sleeping")
    w1.kill(signal.SIGTERM)
    assert w1.stopped_with(10) == 0, f"the graceful stop should exit 0:\n{w1.log_tail()}"
    wait_gone(marker, "the job given back at the end of the grace period should be killed", 1)
    told = story(history(cluster, "job"))
    assert told == ["accepted", "started 1 on grace-1", "failed 1: worker stopping"], \
        "the job should be given back as a failed attempt 'worker stopping', and its retry not " \
        f"be handed to grace-1's given-up long-poll after it deregistered: {told}"
    assert "grace-1" not in workers_at(s.url), "grace-1 should have deregistered"
    wait_log(w1, "grace period over: stopping and giving back 1 job(s)", 1)

    # A second signal while waiting for the job: stop at once, killing it.
    w2 = start_worker(cluster, "grace-2", s.url, ["--exec", job])
    wait_running(s.url, "job", "grace-2", attempt=2)
    wait_until(lambda: processes_with(marker), 10, what="the retried job to be sleeping")
    w2.kill(signal.SIGTERM)
    wait_log(w2, "waiting up to")
    t0 = time.monotonic()
    w2.kill(signal.SIGTERM)
    rc = w2.stopped_with(5)
    assert rc == 128 + signal.SIGTERM, f"a second SIGTERM should exit {128 + signal.SIGTERM} " \
                                       f"at once, not {rc}:\n{w2.log_tail()}"
    assert time.monotonic() - t0 < 2, "the second SIGTERM should stop the worker at once"
    wait_gone(marker, "the job of a worker stopped at once should be killed", 1)
    wait_gone("grace-2", "no process of grace-2 should outlive it", 2, find=worker_processes)

    # The work is not lost: after grace-2's timeout another worker finishes it.
    start_worker(cluster, "grace-3", s.url, ["--exec", job])
    done = wait_status(s.url, "job", "completed", timeout=15)
    assert done["attempts"] == 3 and done["worker_id"] == "grace-3", done
    assert completions_by_id(cluster) == {"job": 1}


def peak_concurrency(cluster, slots, jobs, seconds, env_concurrency=False):
    """Runs `jobs` jobs of `seconds` each on one worker of `slots` slots and
    returns the most that ran at once, from the jobs' own start and end marks."""
    s = start_server(cluster)
    timeline = cluster.tmp / f"timeline-{slots}"
    job = write_script(cluster, f"timed-{slots}.sh", r"""
        echo "start $(date +%s%N) $WORKD_WORK_ID" >> "@LOG@"
        sleep @SECONDS@
        echo "end $(date +%s%N) $WORKD_WORK_ID" >> "@LOG@"
        echo '"ok"'
        """, LOG=timeline, SECONDS=seconds)
    name = f"conc-{slots}"
    if env_concurrency:  # as a deployment would set it
        start_worker(cluster, name, s.url, ["--exec", job], env={"WORKD_CONCURRENCY": str(slots)})
    else:
        start_worker(cluster, name, s.url, ["--exec", job, "--concurrency", str(slots)])
    assert workers_at(s.url)[name]["capacity"] == slots, \
        f"concurrency {slots} should give capacity {slots}: {workers_at(s.url)[name]}"
    r = http("POST", s.url + "/work", [{"id": f"j{i}", "payload": i} for i in range(jobs)], JSON)
    expect(r, 202, f"bulk submit of {jobs} jobs")
    for i in range(jobs):
        wait_status(s.url, f"j{i}", "completed", timeout=30)
    marks = []
    for line in timeline.read_text().splitlines():
        kind, ns, wid = line.split()
        marks.append((int(ns), 0 if kind == "end" else 1, wid))
    assert len(marks) == 2 * jobs, f"each of {jobs} jobs should run once: {len(marks)} marks"
    running = peak = 0
    for _, kind, _ in sorted(marks):  # an end and a start at the same ns: end first
        running += 1 if kind else -1
        peak = max(peak, running)
    assert not events_of(cluster, ["failed", "timed_out"]), \
        "no job should be given back or fail (a pull for more than the free slots would)"
    assert completions_by_id(cluster) == {f"j{i}": 1 for i in range(jobs)}
    return peak


def test_concurrency_is_exact(cluster):
    peak = peak_concurrency(cluster, slots=3, jobs=9, seconds=0.5, env_concurrency=True)
    assert peak == 3, f"with --concurrency 3, at most and at best 3 jobs should run at once; " \
                      f"the most at once was {peak}"


def test_a_pull_of_long_jobs_fills_every_slot(cluster):
    """The slots take a pull's jobs from one queue, each woken by the one
    before: 16 jobs of 2 s on 16 slots all run at once, none waits behind
    another in a slot."""
    peak = peak_concurrency(cluster, slots=16, jobs=16, seconds=2)
    assert peak == 16, f"16 jobs on 16 slots should all run at once; the most at once was {peak}"


def test_worker_survives_server_restart(cluster):
    s = start_server(cluster)
    gate = cluster.tmp / "gate"
    job = write_script(cluster, "gated.sh", r"""
        while [ ! -e "@GATE@" ]; do sleep 0.05; done
        echo "\"passed the gate on attempt $WORKD_ATTEMPT\""
        """, GATE=gate)
    w = start_worker(cluster, "survivor", s.url, ["--exec", job, "--concurrency", "2"])
    pid = w.pid

    # Killed while a job runs: the job's result is delivered after the restart.
    submit(s.url, {"id": "during", "payload": 1})
    wait_running(s.url, "during", "survivor")
    s.kill(signal.SIGKILL)
    wait_log(w, "server unreachable")
    gate.touch()  # the job finishes while the server is down
    wait_log(w, 'job during attempt 1 completed')
    cluster.restart_server(s)
    wait_leader(s.url)
    done = wait_status(s.url, "during", "completed", timeout=15)
    assert done["attempts"] == 1 and done["result"] == "passed the gate on attempt 1", \
        f"the result of the job that ran across the restart should be delivered: {done}"
    wait_log(w, "server reachable again")

    # Killed while the worker idles (long-polling): new work still gets done.
    wait_until(lambda: "survivor" in workers_at(s.url), 5, what="the worker to heartbeat again")
    s.kill(signal.SIGKILL)
    cluster.restart_server(s)
    wait_leader(s.url)
    for i in range(3):
        submit(s.url, {"id": f"after-{i}", "payload": i})
    for i in range(3):
        done = wait_status(s.url, f"after-{i}", "completed", timeout=20)
        assert done["worker_id"] == "survivor" and done["attempts"] == 1, done
    assert w.alive() and w.pid == pid, "the worker must keep running through server restarts"
    assert not events_of(cluster, ["failed", "timed_out"]), \
        f"no attempt should be lost to the restarts: {events_of(cluster, ['failed', 'timed_out'])}"
    assert completions_by_id(cluster) == {"during": 1, **{f"after-{i}": 1 for i in range(3)}}
    assert w.log_text().count("server unreachable") >= 1


def test_worker_on_standby_survives_leader_failover(cluster):
    a = start_server(cluster, "a")
    b = start_server(cluster, "b")
    procs = {a.url: a, b.url: b}
    leader_url = leader_of(list(procs))
    assert leader_url, "one of the two servers must lead"
    leader = procs[leader_url]
    standby = procs[b.url if leader is a else a.url]
    gate = cluster.tmp / "gate"
    job = write_script(cluster, "gated.sh", r"""
        while [ ! -e "@GATE@" ]; do sleep 0.05; done
        echo "\"passed the gate on attempt $WORKD_ATTEMPT\""
        """, GATE=gate)
    w = start_worker(cluster, "follower", standby.url, ["--exec", job, "--concurrency", "2"],
                     cluster_url=leader.url)
    submit(standby.url, {"id": "across", "payload": 1})
    wait_running(standby.url, "across", "follower")
    leader.kill(signal.SIGKILL)
    wait_new_leader([standby.url], timeout=10)
    gate.touch()
    done = wait_status(standby.url, "across", "completed", timeout=15)
    assert done["attempts"] == 1 and done["worker_id"] == "follower", \
        f"the attempt running during the failover should complete: {done}"
    for i in range(3):
        submit(standby.url, {"id": f"after-{i}", "payload": i})
    for i in range(3):
        done = wait_status(standby.url, f"after-{i}", "completed", timeout=20)
        assert done["worker_id"] == "follower", done
    assert w.alive(), f"the worker must keep running through a failover:\n{w.log_tail()}"
    assert not events_of(cluster, ["failed", "timed_out"]), \
        f"no attempt should be lost to the failover: {events_of(cluster, ['failed', 'timed_out'])}"
    assert completions_by_id(cluster) == {"across": 1, **{f"after-{i}": 1 for i in range(3)}}


def test_a_pull_answer_that_never_arrived_is_retried_within_a_heartbeat(cluster):
    """The start is committed, but its answer never reaches the worker (a proxy
    or the network lost it, or the leader stepped down before sending it: to
    the leader all look alike, and like this pull whose answer the test drops).
    The worker's next heartbeats do not list the attempt: once it was handed
    out more than one heartbeat interval ago it is ended and retried, long
    before the worker timeout (30 s here) would have noticed."""
    s = cluster.start_server("s1", extra_args=["--election-interval", "100ms",
                                               "--worker-timeout", "30s",
                                               "--heartbeat-interval", "500ms",
                                               "--backoff-base", "50ms", "--backoff-max", "100ms"])
    wait_leader(s.url)
    heartbeat(s.url, "lossy")
    wid = submit(s.url, {"payload": 1})["id"]
    assert [j["id"] for j in pull(s.url, "lossy")] == [wid]  # and then "lost"
    t0 = time.monotonic()

    def retried():
        heartbeat(s.url, "lossy", running=())  # what a worker that never got it says
        return get_work(s.url, wid)["status"] in ("pending", "scheduled")
    wait_until(retried, 20, interval=0.2, what="the unreceived attempt to be retried")
    took = time.monotonic() - t0
    failed = events_of(cluster, ["failed"])
    assert any("never reached" in (e["data"].get("error") or "") for e in failed), failed
    assert took < 15, f"retried after {took:.1f}s: that is the worker timeout's bound, not " \
                      "the heartbeat interval's"
    jobs = pull(s.url, "lossy", wait=5)  # after its backoff
    assert [(j["id"], j["attempt"]) for j in jobs] == [(wid, 2)], jobs


def test_a_slow_commit_is_not_a_lost_answer(cluster):
    """Each append takes longer than a heartbeat interval: a pull's answer
    leaves only after its start commits, so the grace for an unreceived job
    counts from the commit, and no job that reached its worker is failed as
    'never reached'."""
    s = cluster.start_server("s1")  # heartbeat interval 2 s
    wait_leader(s.url)
    cluster.psql("""
        CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
          $$ BEGIN PERFORM pg_sleep(2.5); RETURN NULL; END $$;
        CREATE TRIGGER zz_slow_commit AFTER INSERT ON workd_log
          FOR EACH STATEMENT EXECUTE FUNCTION slow_commit();""")
    cluster.start_worker("w1", s.url, ["--noop", "--concurrency", "4"])
    ids = [submit(s.url, {"payload": i, "max_attempts": 3})["id"] for i in range(3)]
    wait_until(lambda: all(i in completions_by_id(cluster) for i in ids), 90,
               what="the jobs to complete through slow commits")
    lost = [e for e in events_of(cluster, ["failed"])
            if "never reached" in (e["data"].get("error") or "")]
    assert not lost, lost


def test_idle_worker_is_quiet(cluster):
    s = start_server(cluster)
    w = start_worker(cluster, "idle-1", s.url, ["--demo", "--poll-wait", "2s"])
    log_before = len(w.log_text().splitlines())
    pulls0, beats0 = requests_total(s.url, "worker_pull"), requests_total(s.url, "worker_heartbeat")
    window = 5.0
    time.sleep(window)  # the measurement window itself, not a wait for readiness
    pulls = requests_total(s.url, "worker_pull") - pulls0
    beats = requests_total(s.url, "worker_heartbeat") - beats0
    assert 1 <= pulls <= 5, \
        f"an idle worker with --poll-wait 2s should long-poll ~once per 2s: {pulls} pulls in {window}s"
    assert beats <= window / 0.5 + 3, \
        f"heartbeats should follow the 500ms interval: {beats} in {window}s"
    new_lines = w.log_text().splitlines()[log_before:]
    assert not new_lines, f"an idle worker should log nothing: {new_lines}"
    # And it is still awake: work is taken at once, not after the poll wait.
    t0 = time.monotonic()
    wid = submit(s.url, {"payload": 3})["id"]
    wait_status(s.url, wid, "completed", timeout=10)
    assert time.monotonic() - t0 < 1.9, "a long-polling worker should get new work at once"


def test_help_and_bad_settings():
    flags = ["server", "concurrency", "queues", "id", "exec", "demo", "noop", "demo-delay",
             "poll-wait", "grace", "kill-grace", "max-output", "token", "log-level", "log-format"]
    r = subprocess.run([worker_binary(), "--help"], capture_output=True, text=True, timeout=10,
                       env=clean_env())
    assert r.returncode == 0, f"--help should exit 0, not {r.returncode}: {r.stderr}"
    text = r.stdout
    listed = re.findall(r"^  --([a-z-]+)", text, re.M)
    for flag in flags:
        assert flag in listed, f"--help does not list --{flag}"
    for flag in listed:
        if flag in ("help", "version"):  # no setting: nothing in the environment
            continue
        env = "WORKD_" + flag.upper().replace("-", "_")
        block = text.split(f"  --{flag}", 1)[1].split("\n  --", 1)[0]
        assert f"env {env}" in block, f"--help should name {env} for --{flag}: {block!r}"

    cases = [
        (["--demo", "--concurrency", "0"], {}, "--concurrency: 0 is out of range"),
        (["--demo", "--concurrency", "many"], {}, "--concurrency: 'many' is not an integer"),
        (["--demo", "--poll-wait", "soon"], {}, "--poll-wait: 'soon' is not a duration"),
        (["--demo", "--kill-grace", "2h"], {}, "--kill-grace: '2h' is out of range"),
        (["--demo", "--max-output", "0"], {}, "--max-output"),
        (["--demo", "--log-level", "loud"], {}, "--log-level: 'loud'"),
        (["--demo", "--log-format", "xml"], {}, "--log-format: 'xml'"),
        (["--demo", "--server", "ftp://example"], {}, "--server: 'ftp://example'"),
        (["--demo", "--id", "bad id!"], {}, "--id: 'bad id!'"),
        (["--demo", "--queues", "a,b c"], {}, "--queues: 'b c'"),
        (["--demo", "--exec", "true"], {}, "exactly one of --exec CMD, --demo and --noop"),
        ([], {}, "exactly one of --exec CMD, --demo and --noop"),
        (["--demo", "--bogus"], {}, "unknown option '--bogus'"),
        (["--demo", "stray"], {}, "unexpected argument 'stray'"),
        (["--demo"], {"WORKD_CONCURRENCY": "0"}, "WORKD_CONCURRENCY: 0 is out of range"),
        ([], {"WORKD_DEMO": "maybe"}, "WORKD_DEMO: 'maybe' is not a boolean"),
        (["--demo"], {"WORKD_POLL_WAIT": "forever"}, "WORKD_POLL_WAIT: 'forever'"),
    ]
    for args, env, says in cases:
        argv = [worker_binary(), "--server", "http://127.0.0.1:9", *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=clean_env(**env))
        shown = f"{' '.join(f'{k}={v}' for k, v in env.items())} workd-worker {' '.join(args)}"
        assert r.returncode == 2, f"{shown}: should exit 2, not {r.returncode} ({r.stderr!r})"
        assert says in r.stderr, f"{shown}: stderr should say {says!r}, it says {r.stderr!r}"
        assert r.stderr.startswith("workd-worker: ") and r.stderr.count("\n") == 1, \
            f"{shown}: one line on stderr, not {r.stderr!r}"


if __name__ == "__main__":
    run_tests(globals())
