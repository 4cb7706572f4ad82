"""The client and worker API against one real server and a real PostgreSQL:
submit, read, wait, history, cancel, results stream, retries, leases."""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, abandoned_pull, complete, events_of, expect, get_work,  # noqa: E402
                   heartbeat, pull, pull_in_background, report, submit, wait_status,
                   waiting_pulls)


def server(cluster, *args):
    s = cluster.start_server("s1", extra_args=list(args))
    wait_leader(s.url)
    return s


def test_submit_pull_complete_read(cluster):
    s = server(cluster)
    r = http("POST", s.url + "/work", {"payload": 7}, JSON)
    expect(r, 202, "submit")
    work_id = r.json()["id"]
    assert r.json()["created"] is True and r.json()["status"] == "pending", r.json()
    assert r.headers["Location"] == f"/work/{work_id}", r.headers
    assert get_work(s.url, work_id)["status"] == "pending"

    jobs = pull(s.url, "w1", max_jobs=5)
    assert [j["id"] for j in jobs] == [work_id], f"pull should hand out exactly the one job: {jobs}"
    job = jobs[0]
    assert job["attempt"] == 1 and job["payload"] == 7, job
    running = get_work(s.url, work_id)
    assert running["status"] == "running" and running["worker_id"] == "w1", running

    res = complete(s.url, "w1", job, "7 * 7 = 49")
    assert res["accepted"] is True and res["status"] == "completed", res
    done = get_work(s.url, work_id)
    assert done["status"] == "completed" and done["result"] == "7 * 7 = 49", done
    assert done["attempts"] == 1 and done["finished_at"], done

    # Reporting again is acknowledged (at-least-once delivery) and adds nothing.
    again = complete(s.url, "w1", job, "7 * 7 = 49")
    assert again["accepted"] is True, f"a duplicate completion must be acknowledged: {again}"
    types = [e["type"] for e in events_of(cluster) if e["work_id"] == work_id]
    assert types == ["accepted", "started", "completed"], f"history: {types}"

    hist = http("GET", f"{s.url}/work/{work_id}/events")
    expect(hist, 200, "history")
    assert [e["type"] for e in hist.json()["events"]] == types, hist.json()


def test_get_wait_long_polls_until_finished(cluster):
    s = server(cluster)
    work_id = submit(s.url, {"payload": 3})["id"]

    def finish_later():
        time.sleep(0.7)  # a declared delay: the wait must last until the work ends, 0.7 s in
        job = pull(s.url, "w1")[0]
        complete(s.url, "w1", job, 9)
    t = threading.Thread(target=finish_later)
    t.start()
    t0 = time.monotonic()
    w = get_work(s.url, work_id, wait=20)
    took = time.monotonic() - t0
    t.join()
    assert w["status"] == "completed" and w["result"] == 9, f"wait should return the result: {w}"
    assert 0.5 < took < 10, f"wait returned after {took:.2f}s, not when the work finished"

    # A wait that runs out answers with the current state.
    other = submit(s.url, {"payload": 4})["id"]
    t0 = time.monotonic()
    w = get_work(s.url, other, wait=0.5)
    assert w["status"] == "pending" and 0.4 < time.monotonic() - t0 < 5, w


def test_idempotent_ids(cluster):
    s = server(cluster)
    first = submit(s.url, {"id": "order-1", "payload": {"n": 1}})
    assert first["created"] is True, first
    again = submit(s.url, {"id": "order-1", "payload": {"n": 1}})
    assert again["created"] is False and again["id"] == "order-1", again
    conflict = http("POST", s.url + "/work", {"id": "order-1", "payload": {"n": 2}}, JSON)
    expect(conflict, 409, "same id, other payload")
    assert conflict.headers["Content-Type"] == "application/problem+json", conflict.headers

    keyed = submit(s.url, {"payload": 5}, headers={"Idempotency-Key": "key-5"})
    assert keyed["id"] == "key-5", keyed
    assert submit(s.url, {"payload": 5}, headers={"Idempotency-Key": "key-5"})["created"] is False

    # Many clients racing with the same id make exactly one job.
    results = []

    def race():
        results.append(http("POST", s.url + "/work", {"id": "race", "payload": 1}, JSON).status)
    threads = [threading.Thread(target=race) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [202] * 16, f"every racer should get 202: {results}"
    accepted = [e for e in events_of(cluster, ["accepted"]) if e["work_id"] == "race"]
    assert len(accepted) == 1, f"one accepted event for 'race', found {len(accepted)}"

    # Finished work keeps its id: resubmitting does not run it again.
    job = pull(s.url, "w1", max_jobs=10)
    for j in job:
        complete(s.url, "w1", j, "ok")
    assert submit(s.url, {"id": "order-1", "payload": {"n": 1}})["status"] == "completed"
    assert pull(s.url, "w1", max_jobs=10) == [], "finished work must not be handed out again"


def test_bulk_submit_is_atomic(cluster):
    s = server(cluster)
    r = http("POST", s.url + "/work", [{"payload": i, "id": f"b{i}"} for i in range(5)], JSON)
    expect(r, 202, "bulk submit")
    assert [i["id"] for i in r.json()["items"]] == [f"b{i}" for i in range(5)], r.json()
    bad = http("POST", s.url + "/work", [{"payload": 1, "id": "new-1"},
                                          {"payload": "other", "id": "b2"}], JSON)
    expect(bad, 409, "bulk with one conflicting item")
    missing = http("GET", s.url + "/work/new-1")
    expect(missing, 404, "an item of a refused bulk request must not exist")


def test_cancel(cluster):
    s = server(cluster)
    pending = submit(s.url, {"payload": 1, "delay": 60})
    assert pending["status"] == "scheduled", pending
    with SSEClient(s.url + "/results?after=0") as sse:
        r = http("DELETE", f"{s.url}/work/{pending['id']}")
        expect(r, 200, "cancel scheduled work")
        assert get_work(s.url, pending["id"])["status"] == "cancelled"
        ev = sse.wait_for(lambda e: e["data"]["id"] == pending["id"], timeout=10)
        assert ev["event"] == "cancelled", ev
    running = submit(s.url, {"payload": 2})["id"]
    pull(s.url, "w1")
    expect(http("DELETE", f"{s.url}/work/{running}"), 200, "cancel running work")
    expect(http("DELETE", f"{s.url}/work/{running}"), 409, "cancel cancelled work")
    expect(http("DELETE", f"{s.url}/work/{pending['id']}"), 409, "cancel finished work")
    expect(http("DELETE", f"{s.url}/work/nope"), 404, "cancel unknown work")


def test_failures_retry_then_dead(cluster):
    s = server(cluster, "--backoff-base", "100ms", "--backoff-max", "200ms")
    work_id = submit(s.url, {"payload": 1, "max_attempts": 2})["id"]
    job = pull(s.url, "w1")[0]
    res = report(s.url, "w1", [{"id": work_id, "attempt": 1, "outcome": "failed",
                                "error": "boom", "retry": True}])[0]
    assert res["accepted"] and res["status"] == "scheduled", res
    # The same failure reported again (its answer was lost) is acknowledged
    # and records nothing more.
    again = report(s.url, "w1", [{"id": work_id, "attempt": 1, "outcome": "failed",
                                  "error": "boom", "retry": True}])[0]
    assert again["accepted"] is True, f"a repeated failure report must be acknowledged: {again}"
    failed = [e for e in events_of(cluster, ["failed"]) if e["work_id"] == work_id]
    assert len(failed) == 1, f"a repeated report recorded a second failure: {failed}"
    w = get_work(s.url, work_id)
    assert w["last_error"] == "boom" and w["status"] in ("scheduled", "pending"), w
    # The stale attempt can no longer report.
    stale = http("POST", f"{s.url}/work/{work_id}/attempts/1/complete", {"result": 1}, JSON)
    expect(stale, 409, "completion of a failed attempt")
    jobs = pull(s.url, "w1", wait=5)
    assert jobs and jobs[0]["attempt"] == 2, f"the retry should come back as attempt 2: {jobs}"
    with SSEClient(f"{s.url}/results?work_id={work_id}&after=0") as sse:
        r = http("POST", f"{s.url}/work/{work_id}/attempts/2/fail",
                 {"error": "boom again", "worker_id": "w1"}, JSON)
        expect(r, 200, "fail the last attempt")
        assert r.json()["status"] == "dead", r.json()
        ev = sse.wait_for(lambda e: e["event"] == "dead", timeout=10)
        assert ev["data"]["error"] == "boom again", ev
    assert get_work(s.url, work_id)["status"] == "dead"
    assert job["id"] == work_id


def test_no_retry_means_dead(cluster):
    s = server(cluster)
    work_id = submit(s.url, {"payload": 1, "max_attempts": 5})["id"]
    pull(s.url, "w1")
    res = report(s.url, "w1", [{"id": work_id, "attempt": 1, "outcome": "failed",
                                "error": "bad input", "retry": False}])[0]
    assert res["status"] == "dead", res


def test_priority_queues_and_schedule(cluster):
    s = server(cluster)
    submit(s.url, {"id": "low", "payload": 1, "priority": -5})
    submit(s.url, {"id": "high", "payload": 1, "priority": 10})
    submit(s.url, {"id": "mid", "payload": 1})
    submit(s.url, {"id": "mail", "payload": 1, "queue": "mail", "priority": 100})
    submit(s.url, {"id": "later", "payload": 1, "delay": 1.0})
    jobs = pull(s.url, "w1", max_jobs=10, queues=["default"])
    assert [j["id"] for j in jobs] == ["high", "mid", "low"], \
        f"default queue by priority, then acceptance: {[j['id'] for j in jobs]}"
    assert pull(s.url, "w2", max_jobs=10, queues=["mail"])[0]["id"] == "mail"
    assert get_work(s.url, "later")["status"] == "scheduled"
    t0 = time.monotonic()
    jobs = pull(s.url, "w3", max_jobs=1, wait=10)
    assert [j["id"] for j in jobs] == ["later"], jobs
    assert time.monotonic() - t0 > 0.5, "scheduled work must wait for its time"


def test_the_pull_names_the_queues(cluster):
    """docs/worker-api.md: a pull takes from the queues it names (none: every
    queue), whatever the heartbeat registered; the registered ones are what
    GET /cluster shows, and a pull that names queues replaces them."""
    s = server(cluster)
    submit(s.url, {"id": "d1", "payload": 1})
    submit(s.url, {"id": "m1", "payload": 1, "queue": "mail"})
    heartbeat(s.url, "w1", capacity=2, queues=["mail"])
    assert [j["id"] for j in pull(s.url, "w1", queues=["default"])] == ["d1"], \
        "a pull's queues win over the heartbeat's"

    def shown():
        ws = http("GET", s.url + "/cluster").json()["workers"]
        return next(w["queues"] for w in ws if w["id"] == "w1")
    assert shown() == ["default"], f"a pull naming queues replaces the registered ones: {shown()}"
    heartbeat(s.url, "w1", capacity=2, queues=["default"])
    assert [j["id"] for j in pull(s.url, "w1")] == ["m1"], \
        "a pull naming no queue takes from every queue"
    assert shown() == ["default"], f"a pull naming no queue keeps the registered ones: {shown()}"
    t0 = time.monotonic()
    assert pull(s.url, "w1", wait=0.25) == [], "'wait' may be fractional"
    assert time.monotonic() - t0 >= 0.2, "a fractional wait is waited"


def test_pull_long_polls_and_wakes(cluster):
    s = server(cluster)
    t, got = pull_in_background(s.url, "w1", max_jobs=2, wait=20)
    wait_until(lambda: waiting_pulls(s.url) == 1, 10, what="the pull to wait")
    submit(s.url, {"id": "wake", "payload": 1})
    t.join(15)
    assert [j["id"] for j in got.get("jobs", [])] == ["wake"], got
    assert got["took"] < 5, f"a waiting pull should wake when work arrives, took {got['took']:.2f}s"
    t0 = time.monotonic()
    assert pull(s.url, "w1", wait=0.5) == []
    assert time.monotonic() - t0 >= 0.4, "an empty pull should wait for its wait time"


def test_lost_worker_and_expired_lease(cluster):
    s = server(cluster, "--worker-timeout", "1s", "--lease-grace", "0",
               "--backoff-base", "50ms", "--backoff-max", "100ms")
    a = submit(s.url, {"id": "a", "payload": 1})["id"]
    heartbeat(s.url, "gone", capacity=1)
    job = pull(s.url, "gone")[0]
    # The worker stops heartbeating: after the timeout its attempt is ended.
    w = wait_status(s.url, a, "pending", timeout=10)
    assert "lost" in (w["last_error"] or ""), w
    job2 = pull(s.url, "w2", wait=5)[0]
    assert job2["attempt"] == 2
    late = complete(s.url, "gone", job, "late")
    assert late["accepted"] is False and late["reason"] == "superseded", late
    assert complete(s.url, "w2", job2, "on time")["accepted"] is True

    # A job that overruns its timeout is retried (lease = timeout + grace).
    b = submit(s.url, {"id": "b", "payload": 1, "timeout": 0.3, "max_attempts": 1})["id"]
    pull(s.url, "w3")
    heartbeat(s.url, "w3")
    w = wait_status(s.url, b, "dead", timeout=10)
    assert "timed out" in w["last_error"], w


def test_restarted_worker_instance_gives_back_its_jobs(cluster):
    s = server(cluster, "--backoff-base", "10ms", "--backoff-max", "10ms")
    work_id = submit(s.url, {"payload": 1})["id"]
    heartbeat(s.url, "w1", instance="first")
    pull(s.url, "w1", instance="first")
    heartbeat(s.url, "w1", instance="second")
    w = wait_status(s.url, work_id, "pending", timeout=5)
    assert "restarted" in w["last_error"], w


def test_results_stream_resumes_exactly_once(cluster):
    s = server(cluster)
    ids = [submit(s.url, {"payload": i})["id"] for i in range(6)]
    jobs = pull(s.url, "w1", max_jobs=10)
    for j in jobs[:3]:
        complete(s.url, "w1", j, j["payload"])
    with SSEClient(s.url + "/results?after=0") as sse:
        sse.wait_count(3, timeout=10)
        last = sse.events[-1]["id"]
    for j in jobs[3:]:
        complete(s.url, "w1", j, j["payload"])
    with SSEClient(s.url + "/results", last_event_id=last) as sse:
        sse.wait_count(3, timeout=10)
        time.sleep(0.3)  # a declared window: a repeated event would arrive here
        got = [e["data"]["id"] for e in sse.events]
    assert got == [j["id"] for j in jobs[3:]], f"resume after {last} must give the rest once: {got}"
    assert sorted(ids) == sorted(j["id"] for j in jobs)
    seqs = [int(e["id"]) for e in sse.events]
    assert seqs == sorted(seqs), "events must come in seq order"
    # A stream says where it starts: a client that reconnects before its first
    # result resumes from there and misses nothing.
    with SSEClient(s.url + "/results") as quiet:
        wait_until(lambda: quiet.last_event_id is not None, 5, what="the opening id")
        start = quiet.last_event_id
    late = submit(s.url, {"payload": 99})["id"]
    complete(s.url, "w1", pull(s.url, "w1")[0], 99)
    with SSEClient(s.url + "/results", last_event_id=start) as sse:
        ev = sse.wait_for(lambda e: e["data"]["id"] == late, timeout=10)
        assert int(ev["id"]) > int(start), (ev, start)


def test_health_cluster_metrics(cluster):
    s = server(cluster)
    expect(http("GET", s.url + "/healthz"), 200, "healthz")
    ready = expect(http("GET", s.url + "/readyz"), 200, "readyz").json()
    assert ready["is_leader"] is True and ready["leader"] == s.url, ready
    heartbeat(s.url, "w1", capacity=3, queues=["default"])
    c = expect(http("GET", s.url + "/cluster"), 200, "cluster").json()
    assert c["leader"] == s.url and c["term"] >= 1, c
    assert [w["id"] for w in c["workers"]] == ["w1"] and c["workers"][0]["capacity"] == 3, c
    wait_until(lambda: http("GET", s.url + "/cluster").json()["nodes"], 10, what="node list")
    submit(s.url, {"payload": 1, "queue": "mail"})
    m = expect(http("GET", s.url + "/metrics"), 200, "metrics").text
    assert 'workd_queue_depth{queue="mail",state="pending"} 1' in m, "the queue depth is exact"
    for name in ("workd_http_requests_total", "workd_leader_term",
                 "workd_commit_duration_seconds_count", "workd_commit_events_bucket",
                 "workd_sse_subscribers", "workd_open_work", 'workd_queue_depth{queue="',
                 "workd_queue_oldest_pending_age_seconds", 'workd_attempts_total{outcome="',
                 "workd_lease_expiries_total", "workd_elections_won_total",
                 "workd_http_request_duration_seconds_bucket", "workd_proxy_retries_total"):
        assert name in m, f"/metrics lacks {name}"


def test_abandoned_pull_gets_no_work(cluster):
    s = server(cluster)
    heartbeat(s.url, "ghost")
    abandoned_pull(s.url, "ghost")
    expect(http("DELETE", s.url + "/workers/ghost"), 204, "deregister")
    abandoned_pull(s.url, "ghost2")
    work_id = submit(s.url, {"payload": 1})["id"]
    time.sleep(0.5)  # a declared window: a handout to a gone pull would happen here
    w = get_work(s.url, work_id)
    assert w["status"] == "pending", f"work went to a pull whose client had gone: {w}"
    workers = [x["id"] for x in http("GET", s.url + "/cluster").json()["workers"]]
    assert "ghost" not in workers, workers


def test_retry_dead_work(cluster):
    s = server(cluster)
    work_id = submit(s.url, {"payload": 1, "max_attempts": 1})["id"]
    job = pull(s.url, "w1")[0]
    report(s.url, "w1", [{"id": work_id, "attempt": 1, "outcome": "failed", "error": "bad"}])
    assert get_work(s.url, work_id)["status"] == "dead"
    expect(http("POST", f"{s.url}/work/{work_id}/retry"), 200, "retry dead work")
    w = get_work(s.url, work_id)
    assert w["status"] == "pending" and w["max_attempts"] == 2, w
    again = pull(s.url, "w1")[0]
    assert again["id"] == work_id and again["attempt"] == 2, again
    late = complete(s.url, "w1", job, "stale")
    assert late["accepted"] is False, "the dead attempt cannot complete the retried work"
    assert complete(s.url, "w1", again, "fixed")["accepted"] is True
    assert get_work(s.url, work_id)["result"] == "fixed"
    types = [e["type"] for e in events_of(cluster) if e["work_id"] == work_id]
    assert types == ["accepted", "started", "failed", "dead", "retried", "started", "completed"], types
    expect(http("POST", f"{s.url}/work/{work_id}/retry"), 409, "retry of completed work")
    expect(http("POST", f"{s.url}/work/nope/retry"), 404, "retry of unknown work")
    # A new leader recovers retried work like any other.
    other = submit(s.url, {"payload": 2, "max_attempts": 1})["id"]
    pull(s.url, "w1")
    report(s.url, "w1", [{"id": other, "attempt": 1, "outcome": "failed", "error": "x"}])
    expect(http("POST", f"{s.url}/work/{other}/retry"), 200, "retry")
    s.kill()
    s2 = cluster.start_server("s2")
    wait_leader(s2.url)
    j = pull(s2.url, "w2", wait=5)
    assert [x["id"] for x in j] == [other] and j[0]["attempt"] == 2, j


def test_list_and_queue_stats(cluster):
    s = server(cluster)
    for i in range(5):
        submit(s.url, {"id": f"q{i}", "payload": i, "queue": "mail" if i % 2 else "default"})
    submit(s.url, {"id": "later", "payload": 0, "delay": 60})
    for j in pull(s.url, "w1", max_jobs=2, queues=["default"]):
        complete(s.url, "w1", j, "ok")
    page = expect(http("GET", s.url + "/work?limit=4"), 200, "list").json()
    assert [i["id"] for i in page["items"]] == ["later", "q4", "q3", "q2"], page
    rest = expect(http("GET", f"{s.url}/work?limit=4&before={page['next_before']}"), 200,
                  "next page").json()
    assert [i["id"] for i in rest["items"]] == ["q1", "q0"] and rest["next_before"] is None, rest
    sched = http("GET", s.url + "/work?status=scheduled").json()["items"]
    assert [i["id"] for i in sched] == ["later"], sched
    mail = http("GET", s.url + "/work?queue=mail&status=pending").json()["items"]
    assert sorted(i["id"] for i in mail) == ["q1", "q3"], mail
    expect(http("GET", s.url + "/work?status=lost"), 400, "bad status filter")
    stats = {q["queue"]: q for q in expect(http("GET", s.url + "/queues"), 200, "queues").json()["queues"]}
    assert stats["default"]["completed"] == 2 and stats["default"]["scheduled"] == 1, stats
    assert stats["default"]["pending"] == 1 and stats["mail"]["pending"] == 2, stats
    assert stats["mail"]["oldest_pending_at"], stats
    assert sum(stats["default"]["throughput"]["completed"]) == 2, stats["default"]



def test_payload_values_are_kept_as_documented(cluster):
    """What openapi.yaml's AnyValue and docs/api-values.md promise: strings and
    integers within 64 bits come back exactly, through the worker, the result,
    the database and a new leader; other numbers come back as the same double;
    what the store cannot keep is refused with a message, never lost."""
    a = cluster.start_server("a")
    wait_leader(a.url)
    b = cluster.start_server("b")
    exact = {"max": 9223372036854775807, "min": -9223372036854775808,
             "text": "é\u2028\U0001F600", "control": "\u0001\u001f",
             "nested": [[], {}, None, True, False, 0, -1],
             "object": {"b": 1, "a": 2}}  # equal as objects: the order of keys is not kept
    doubles = [0.1, 1.1, 3.141592653589793, 1e-300, 1e2, -0.5, 9.2e18, 2.5e-7]
    payload = {**exact, "doubles": doubles}
    w = submit(a.url, {"id": "values", "payload": payload})
    job = pull(a.url, "w1")[0]
    assert job["payload"] == payload, job["payload"]
    complete(a.url, "w1", job, payload)
    a.kill()
    for node in (b,):
        got = wait_status(node.url, w["id"], "completed")
        for field in ("payload", "result"):
            value = got[field]
            assert {k: value[k] for k in exact} == exact, f"{field}: {value}"
            # Each double reads back as the same double (json parses both the same).
            assert value["doubles"] == doubles, f"{field}: {value['doubles']} != {doubles}"
    # Refused, with words: what jsonb cannot hold or give back as sent.
    for raw, words in ((b'{"payload": 18446744073709551616}', "send it as a string"),
                       (b'{"payload": -9223372036854775809}', "send it as a string"),
                       (b'{"payload": 1.5e19}', "send it as a string"),
                       (b'{"payload": [1, {"x": -1e300}]}', "send it as a string"),
                       (b'{"payload": "a\\u0000b"}', "\\u0000")):
        r = http("POST", b.url + "/work", raw, JSON)
        assert r.status == 400 and words in r.json()["detail"], f"{raw}: {r.status} {r.text}"
    r = http("POST", b.url + "/work", b'{"payload": 1}', JSON)
    assert r.status == 202, r.text


if __name__ == "__main__":
    run_tests(globals())
