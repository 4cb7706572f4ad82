"""W3C trace context across the queue: a traceparent and tracestate given to
POST /work (headers for the whole request, fields per item, a field winning)
or to workd.submit in SQL reach the worker's pull answer and an --exec job's
environment, come back with the result on /results, in webhook deliveries and
in GET /work/{id}, survive retries (automatic and an operator's), a follower's
forwarding and a leader's restart; values that are not W3C ones are ignored
as the spec tells a receiver, never a reason to refuse the work."""

import http.client
import json
import signal
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SSEClient, http as request, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, complete, expect, get_work, leader_of, pull, submit,  # noqa: E402
                   wait_status)
from test_webhooks import FAST as HOOK_FAST, Receiver, new_secret, put_sub  # noqa: E402

FAST = HOOK_FAST + ["--lease-grace", "1s", "--backoff-base", "50ms", "--backoff-max", "200ms"]

TP1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TS1 = "congo=t61rcWkgMzE"
TP2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
TS2 = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
TP_WORKER = "00-11111111111111111111111111111111-2222222222222222-01"
ZERO_TRACE = "00-00000000000000000000000000000000-b7ad6b7169203331-01"


def trace_of(obj):
    """(traceparent, tracestate) of a job, work or result; None where absent."""
    return obj.get("traceparent"), obj.get("tracestate")


def expect_trace(obj, want, what):
    assert trace_of(obj) == want, f"{what}: trace context {trace_of(obj)}, want {want}: {obj}"


def write_script(cluster, name, body):
    path = cluster.tmp / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body).lstrip("\n"))
    path.chmod(0o755)
    return str(path)


def test_headers_and_fields_reach_the_worker_and_the_results(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST)
    wait_leader(b.url)
    leader = {a.url: a, b.url: b}[leader_of([a.url, b.url])]
    follower = b if leader is a else a
    secret = new_secret()
    rcv = Receiver({"/hook": secret})
    put_sub(leader.url, "hook", {"url": f"http://127.0.0.1:{rcv.port}/hook", "secret": secret})
    results = SSEClient(leader.url + "/results")
    hdrs = {"traceparent": TP1, "tracestate": TS1}

    # Through the follower, which forwards the items to the leader.
    submit(follower.url, {"id": "single", "payload": 1}, headers=hdrs)
    submit(follower.url, [
        {"id": "field", "payload": 2, "traceparent": TP2, "tracestate": TS2},
        {"id": "header", "payload": 3},
        {"id": "bad-field", "payload": 4, "traceparent": ZERO_TRACE, "tracestate": TS2},
        {"id": "state-only", "payload": 5, "tracestate": TS2},
        {"id": "null-field", "payload": 6, "traceparent": None}], headers=hdrs)
    submit(leader.url, {"id": "plain", "payload": 7})
    want = {"single": (TP1, TS1), "field": (TP2, TS2), "header": (TP1, TS1),
            "bad-field": (TP1, TS1), "state-only": (TP1, TS1), "null-field": (TP1, TS1),
            "plain": (None, None)}

    for wid, tc in want.items():
        expect_trace(get_work(leader.url, wid), tc, f"GET /work/{wid} before it ran")
    jobs = {j["id"]: j for j in pull(leader.url, "w1", max_jobs=10)}
    assert set(jobs) == set(want), f"pulled {sorted(jobs)}"
    for wid, tc in want.items():
        expect_trace(jobs[wid], tc, f"the pull answer's job {wid}")
    assert "traceparent" not in jobs["plain"] and "tracestate" not in jobs["plain"], \
        f"a job without trace context has no trace fields: {jobs['plain']}"
    for j in jobs.values():
        complete(leader.url, "w1", j, {"done": j["id"]})

    for wid, tc in want.items():
        ev = results.wait_for(lambda e, wid=wid: e["data"].get("id") == wid, 10)
        assert ev["data"]["status"] == "completed", ev
        expect_trace(ev["data"], tc, f"the result of {wid} on /results")
        expect_trace(get_work(follower.url, wid), tc, f"GET /work/{wid} once completed")
    results.close()
    wait_until(lambda: len(rcv.ids("/hook")) >= len(want), 15, what="every result delivered")
    with rcv.lock:
        delivered = {d["msg"]["data"]["id"]: d["msg"]["data"] for d in rcv.accepted["/hook"]}
    for wid, tc in want.items():
        expect_trace(delivered[wid], tc, f"the webhook delivery of {wid}")


def test_exec_environment_and_retries_keep_the_producers_context(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    out = cluster.tmp / "env"
    out.mkdir()
    job = write_script(cluster, "job.sh", f"""
        cat >/dev/null
        printf '%s|%s\\n' "${{TRACEPARENT-unset}}" "${{TRACESTATE-unset}}" \\
            > "{out}/$WORKD_WORK_ID.$WORKD_ATTEMPT"
        if [ "$WORKD_WORK_ID" != untraced ] && [ "$WORKD_ATTEMPT" -lt 2 ]; then
            echo "attempt $WORKD_ATTEMPT fails" >&2
            exit 3
        fi
        echo '"ok"'
        """)
    # The worker's own trace context (it was started inside some trace) is
    # not any job's.
    cluster.start_worker("w1", s.url, ["--exec", job],
                         env={"TRACEPARENT": TP_WORKER, "TRACESTATE": "worker=1"})
    submit(s.url, {"id": "flaky", "payload": 1, "max_attempts": 3},
           headers={"traceparent": TP1, "tracestate": TS1})
    submit(s.url, {"id": "dies", "payload": 2, "max_attempts": 1, "traceparent": TP2})
    submit(s.url, {"id": "untraced", "payload": 3})

    flaky = wait_status(s.url, "flaky", "completed")
    assert flaky["attempts"] == 2, flaky
    expect_trace(flaky, (TP1, TS1), "GET /work/flaky after a retry")
    wait_status(s.url, "dies", "dead")
    expect(request("POST", s.url + "/work/dies/retry", None, JSON), 200, "an operator's retry")
    dies = wait_status(s.url, "dies", "completed")
    assert dies["attempts"] == 2, dies
    wait_status(s.url, "untraced", "completed")

    def env_of(name):
        return (out / name).read_text().strip()
    for name, want in (("flaky.1", f"{TP1}|{TS1}"), ("flaky.2", f"{TP1}|{TS1}"),
                       ("dies.1", f"{TP2}|unset"), ("dies.2", f"{TP2}|unset"),
                       ("untraced.1", "unset|unset")):
        assert env_of(name) == want, \
            f"the environment of attempt {name}: TRACEPARENT|TRACESTATE {env_of(name)!r}, " \
            f"want {want!r} (every attempt gets the producer's context, none the worker's)"


def test_sql_submit_carries_it_across_a_restart(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    cluster.psql(f"BEGIN; SELECT workd.submit('1', id => 'sql-traced', traceparent => '{TP1}',"
                 f" tracestate => '{TS1}'); COMMIT;")
    cluster.psql(f"SELECT workd.submit('2', id => 'sql-bad', traceparent => '{ZERO_TRACE}',"
                 f" tracestate => '{TS1}')")
    cluster.psql(f"SELECT workd.submit('3', id => 'sql-bad-state', traceparent => '{TP2}',"
                 " tracestate => 'Upper=1')")
    cluster.psql("SELECT workd.submit('4', 'sql-positional')")  # calls written before still work
    cluster.psql("CREATE ROLE app LOGIN; GRANT workd_submitter TO app")
    app_url = cluster.db_url.replace("postgres@", "app@", 1)
    cluster.psql(f"SELECT workd.submit('5', id => 'sql-app', traceparent => '{TP2}')", app_url)
    try:
        cluster.psql("SELECT workd_internal.submit('6'::jsonb)", app_url)
        raise AssertionError("the submitter role may call workd.submit only")
    except RuntimeError as e:
        assert "permission denied" in str(e), e
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_inbox") == "0", 10,
               what="the inbox taken into the log")
    # The next leader rebuilds the open work from its rows: the context too.
    s.kill(signal.SIGKILL)
    cluster.restart_server(s)
    wait_leader(s.url)
    want = {"sql-traced": (TP1, TS1), "sql-bad": (None, None), "sql-bad-state": (TP2, None),
            "sql-positional": (None, None), "sql-app": (TP2, None)}
    jobs = {j["id"]: j for j in pull(s.url, "w1", max_jobs=10)}
    assert set(jobs) == set(want), f"pulled {sorted(jobs)}"
    for wid, tc in want.items():
        expect_trace(jobs[wid], tc, f"the pulled job {wid}, submitted in SQL")
        expect_trace(get_work(s.url, wid), tc, f"GET /work/{wid}, submitted in SQL")


def post_raw(url, headers, body):
    """POST /work with headers as a list of pairs (a name may repeat)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest("POST", "/work")
        data = json.dumps(body).encode()
        for k, v in [("Content-Type", "application/json"),
                     ("Content-Length", str(len(data)))] + headers:
            conn.putheader(k, v)
        conn.endheaders(data)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_invalid_values_are_ignored_not_refused(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future-fields"
    cases = [  # (headers, what GET /work shows, why)
        ([("traceparent", ZERO_TRACE), ("tracestate", TS1)], (None, None),
         "an all-zero trace-id: the traceparent, and its tracestate, ignored"),
        ([("traceparent", TP1.upper())], (None, None), "upper-case hex"),
        ([("traceparent", "ff" + TP1[2:])], (None, None), "version ff"),
        ([("traceparent", TP1 + "-extra")], (None, None), "version 00 with more fields"),
        ([("traceparent", TP1), ("tracestate", "a=1,a=2")], (TP1, None),
         "a key twice: the tracestate dropped, the traceparent kept"),
        ([("traceparent", TP1), ("tracestate", "k=" + "v" * 600)], (TP1, None),
         "a tracestate over 512 bytes"),
        ([("traceparent", later)], (TP1, None),
         "a later version: read as version 00 and kept as one"),
        ([("traceparent", TP1), ("traceparent", TP2)], (None, None),
         "two traceparents: which one is meant is unknown"),
        ([("TraceParent", TP1), ("tracestate", "a=1"), ("Tracestate", "b=2")], (TP1, "a=1,b=2"),
         "header names in any case; several tracestate fields joined"),
    ]
    for i, (headers, want, why) in enumerate(cases):
        status, body = post_raw(s.url, headers, {"id": f"case-{i}", "payload": i})
        assert status == 202, f"{why}: POST /work answered {status}: {body[:300]}"
        expect_trace(get_work(s.url, f"case-{i}"), want, why)

    # Fields of the wrong type are an error in the request, as for any field.
    for bad in ({"traceparent": 5}, {"tracestate": ["a=1"]}):
        r = request("POST", s.url + "/work", {"payload": 1, **bad}, JSON)
        assert r.status == 400 and r.json()["type"].endswith("/invalid-field"), \
            f"{bad}: {r.status} {r.text[:300]}"
    # A schedule's ticks and a batch's callback start traces of their own.
    r = request("PUT", s.url + "/schedules/nightly",
                {"cron": "0 3 * * *", "work": {"payload": 1, "traceparent": TP1}}, JSON)
    assert r.status == 400 and "traceparent" in r.text, f"{r.status} {r.text[:300]}"
    r = request("POST", s.url + "/work", {"items": [{"payload": 1}],
                                          "batch": {"callback": {"payload": 1,
                                                                 "traceparent": TP1}}}, JSON)
    assert r.status == 400 and "traceparent" in r.text, f"{r.status} {r.text[:300]}"


if __name__ == "__main__":
    run_tests(globals())
