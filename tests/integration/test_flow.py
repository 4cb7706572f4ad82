"""Flow control as events: pausing a queue, its concurrency limit and its rate
limit are set over the API, hold while work is handed out, and survive a
leader's kill -9 (a new leader reads them back)."""

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, complete, events_of, get_work, leader_of, pull, report,  # noqa: E402
                   submit, wait_new_leader, wait_status)

FAST = ["--election-interval", "100ms"]


def put_limits(url, queue, body, status=200):
    r = http("PUT", f"{url}/queues/{queue}", body, JSON)
    assert r.status == status, f"PUT /queues/{queue} {body}: {r.status} {r.text}"
    return r.json()


def limits_of(url, queue):
    qs = http("GET", url + "/queues").json()["queues"]
    return next(q["limits"] for q in qs if q["queue"] == queue)


def two_nodes(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST)
    assert leader_of([a.url, b.url]) == a.url
    return a, b


def test_pause_holds_work_and_survives_failover(cluster):
    a, b = two_nodes(cluster)
    r = http("POST", a.url + "/queues/mail/pause")
    # A queue without work yet: paused all the same, and the answer says it
    # starts the queue (issue 27.8: a misspelt name is noticed).
    assert r.status == 200 and r.json() == {"queue": "mail", "paused": True, "max_running": None,
                                            "max_running_per_key": None, "rate": None,
                                            "key_weights": {}, "warning": (
                                                "the queue 'mail' had no open work and no flow "
                                                "control: these settings start it (check the "
                                                "name)")}, r.text
    ids = [submit(a.url, {"payload": i, "queue": "mail"})["id"] for i in range(3)]
    other = submit(a.url, {"payload": 9, "queue": "other"})["id"]
    got = pull(a.url, "w1", max_jobs=10, wait=1)
    assert [j["id"] for j in got] == [other], f"a paused queue handed out work: {got}"
    a.kill()
    wait_new_leader([b.url], not_url=a.url)
    assert limits_of(b.url, "mail")["paused"] is True
    assert pull(b.url, "w2", max_jobs=10, wait=1) == [], "the new leader forgot the pause"
    assert http("POST", b.url + "/queues/mail/resume").json()["paused"] is False
    got = pull(b.url, "w2", max_jobs=10, wait=2)
    assert sorted(j["id"] for j in got) == sorted(ids), got


def test_concurrency_limit_across_failover(cluster):
    a, b = two_nodes(cluster)
    put_limits(a.url, "q", {"max_running": 2})
    for i in range(6):
        submit(a.url, {"payload": i, "queue": "q"})
    first = pull(a.url, "w1", max_jobs=10, wait=1)
    assert len(first) == 2, f"max_running 2 handed out {len(first)}"
    assert pull(a.url, "w2", max_jobs=10, wait=0) == []
    complete(a.url, "w1", first[0], "ok")
    more = pull(a.url, "w2", max_jobs=10, wait=1)
    assert len(more) == 1, f"one slot freed, {len(more)} handed out"
    a.kill()
    wait_new_leader([b.url], not_url=a.url)
    assert limits_of(b.url, "q")["max_running"] == 2
    # Two attempts still run (first[1] and more[0]): nothing more may start.
    assert pull(b.url, "w3", max_jobs=10, wait=1) == [], "the new leader exceeded max_running"
    put_limits(b.url, "q", {"max_running": None})
    assert len(pull(b.url, "w3", max_jobs=10, wait=1)) == 3


def test_rate_limit(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    for i in range(60):
        submit(s.url, {"payload": i, "queue": "r"})
    t0 = time.monotonic()
    ans = put_limits(s.url, "r", {"rate": {"limit": 10, "per": 1}})
    assert ans["rate"] == {"limit": 10, "per": 1.0}, ans
    started = []
    while time.monotonic() - t0 < 3.0:
        for j in pull(s.url, "w1", max_jobs=50, wait=0.5):
            started.append(time.monotonic() - t0)
            complete(s.url, "w1", j, "ok")
    span = time.monotonic() - t0
    # The bucket starts empty when the limit is set and refills 10 per second.
    assert 10 * (span - 0.6) <= len(started) <= 10 * span + 1, \
        f"{len(started)} starts in {span:.2f} s at 10/s"
    for t in started:
        in_window = sum(1 for u in started if t <= u < t + 1.0)
        assert in_window <= 11, f"{in_window} starts within one second at 10/s"


def test_keys_share_a_queue_fairly(cluster):
    """A key with a large backlog cannot starve a key with a few jobs; a
    per-key limit holds across a failover."""
    a, b = two_nodes(cluster)
    backlog = [{"id": f"big-{i}", "payload": i, "queue": "t", "key": "tenant-a"}
               for i in range(300)]
    for i in range(0, len(backlog), 100):
        http("POST", a.url + "/work", backlog[i:i + 100], JSON)
    for i in range(3):
        submit(a.url, {"id": f"small-{i}", "payload": i, "queue": "t", "key": "tenant-b"})
    assert get_work(a.url, "small-0")["key"] == "tenant-b"
    order = []
    while len(order) < 8:
        for j in pull(a.url, "w1", max_jobs=1, wait=1):
            order.append(j["id"])
            complete(a.url, "w1", j, "ok")
    assert order[:6] == ["big-0", "small-0", "big-1", "small-1", "big-2", "small-2"], order
    put_limits(a.url, "t", {"max_running_per_key": 2})
    held = pull(a.url, "w1", max_jobs=10, wait=1)
    assert len(held) == 2, f"max_running_per_key 2 handed out {len(held)}"
    a.kill()
    wait_new_leader([b.url], not_url=a.url)
    assert limits_of(b.url, "t")["max_running_per_key"] == 2
    assert pull(b.url, "w2", max_jobs=10, wait=1) == [], "the new leader exceeded the key's limit"


def test_weighted_keys_across_failover(cluster):
    """A key of weight 3 gets three turns for the others' one; the weights are
    a queue_set event, so a new leader hands out work with the same weights, and
    setting another limit keeps them."""
    a, b = two_nodes(cluster)
    ans = put_limits(a.url, "wq", {"key_weights": {"gold": 3}})
    assert ans["key_weights"] == {"gold": 3}, ans
    items = [{"id": f"{k}-{i}", "payload": i, "queue": "wq", "key": k}
             for k in ("gold", "tin") for i in range(20)]
    http("POST", a.url + "/work", items, JSON)

    def take(url, worker, n):
        got = []
        while len(got) < n:
            for j in pull(url, worker, max_jobs=1, wait=1):
                got.append(j["id"].split("-")[0])
                complete(url, worker, j, "ok")
        return got

    assert take(a.url, "w1", 8) == ["gold"] * 3 + ["tin"] + ["gold"] * 3 + ["tin"], \
        "weight 3 should give gold three turns per round"
    put_limits(a.url, "wq", {"max_running": 5})  # another limit: the weights stay
    assert limits_of(a.url, "wq")["key_weights"] == {"gold": 3}
    a.kill()
    wait_new_leader([b.url], not_url=a.url)
    assert limits_of(b.url, "wq") == {"paused": False, "max_running": 5,
                                      "max_running_per_key": None, "rate": None,
                                      "key_weights": {"gold": 3}}
    order = take(b.url, "w2", 8)
    # The new leader's round starts anew; its turns keep the weights: in any
    # four in a row after its first tin, three are gold.
    first = order.index("tin")
    assert order[first + 1:first + 5] == ["gold"] * 3 + ["tin"], order
    put_limits(b.url, "wq", {"key_weights": None})
    assert limits_of(b.url, "wq")["key_weights"] == {}
    assert take(b.url, "w2", 4) in (["gold", "tin"] * 2, ["tin", "gold"] * 2)


def test_cancel_running_work(cluster):
    """DELETE of running work ends its attempt at once: the worker holding it
    learns it from its next heartbeat's answer and kills the job, the work is
    published as cancelled, and the slot runs the next job."""
    s = cluster.start_server("s1", extra_args=["--heartbeat-interval", "300ms"])
    wait_leader(s.url)
    marker = "wdmark" + uuid.uuid4().hex
    sleep = cluster.tmp / f"sleep-{marker}"
    sleep.symlink_to(shutil.which("sleep"))
    job = cluster.tmp / "job.sh"
    job.write_text(f'input=$(cat)\nif [ "$input" = \'"slow"\' ]; then "{sleep}" 60; fi\n'
                   'echo \'"ok"\'\n')
    w = cluster.start_worker("w1", s.url, ["--exec", f". {job}", "--concurrency", "1",
                                           "--kill-grace", "500ms"])
    submit(s.url, {"id": "slow", "payload": "slow"})
    wait_status(s.url, "slow", "running")
    running = lambda: subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0  # noqa: E731
    wait_until(running, 10, what="the job to be sleeping")
    with SSEClient(s.url + "/results?work_id=slow&after=0") as sse:
        t0 = time.monotonic()
        r = http("DELETE", s.url + "/work/slow")
        assert r.status == 200 and r.json() == {"id": "slow", "status": "cancelled"}, r.text
        wait_until(lambda: not running(), 5, what="the worker to kill the cancelled job")
        took = time.monotonic() - t0
        ev = sse.wait_count(1, timeout=5)[0]["data"]
    assert ev["status"] == "cancelled", ev
    assert took < 0.3 + 0.5 + 1.0, f"the job was stopped {took:.1f}s after the cancel"
    assert "cancelled by the server" in w.log_text()
    # A late report of the cancelled attempt is refused as such.
    late = report(s.url, "w1", [{"id": "slow", "attempt": 1, "outcome": "completed",
                                 "result": 1}])[0]
    assert late["accepted"] is False and late["reason"] == "cancelled", late
    types = [e["type"] for e in events_of(cluster) if e["work_id"] == "slow"]
    assert types == ["accepted", "started", "cancelled"], types
    # The slot is free again and its executor not left stopped.
    submit(s.url, {"id": "next", "payload": "fast"})
    assert wait_status(s.url, "next", "completed")["result"] == "ok"
    assert get_work(s.url, "slow")["status"] == "cancelled"


def test_cancel_in_flight_across_failover(cluster):
    """A cancel of running work committed just before the leader is killed
    (kill -9) still reaches the worker: the new leader, which never saw the
    cancel happen, answers the worker's next heartbeat with it (the attempt is
    not open any more), and the job is killed; the work is cancelled once."""
    hb = ["--heartbeat-interval", "300ms"]
    a = cluster.start_server("a", extra_args=FAST + hb)
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST + hb)
    assert leader_of([a.url, b.url]) == a.url
    marker = "wdmark" + uuid.uuid4().hex
    sleep = cluster.tmp / f"sleep-{marker}"
    sleep.symlink_to(shutil.which("sleep"))
    job = cluster.tmp / "job.sh"
    job.write_text(f'cat >/dev/null\n"{sleep}" 60\necho \'"ok"\'\n')
    w = cluster.start_worker("w1", f"{a.url},{b.url}",
                             ["--exec", f". {job}", "--concurrency", "1", "--kill-grace", "500ms"])
    submit(a.url, {"id": "slow", "payload": 1})
    wait_status(a.url, "slow", "running")
    running = lambda: subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0  # noqa: E731
    wait_until(running, 10, what="the job to be sleeping")
    r = http("DELETE", a.url + "/work/slow")
    assert r.status == 200 and r.json() == {"id": "slow", "status": "cancelled"}, r.text
    a.kill()
    a.popen.wait(5)
    wait_new_leader([b.url], timeout=15)
    wait_until(lambda: not running(), 20, what="the worker to kill the job cancelled before the failover")
    assert "cancelled by the server" in w.log_text()
    assert get_work(b.url, "slow")["status"] == "cancelled"
    late = report(b.url, "w1", [{"id": "slow", "attempt": 1, "outcome": "completed",
                                 "result": 1}])[0]
    assert late["accepted"] is False, late
    types = [e["type"] for e in events_of(cluster) if e["work_id"] == "slow"]
    assert types == ["accepted", "started", "cancelled"], types


def test_bulk_cancel_and_retry(cluster):
    """An operator cancels or retries work by filter, in bounded chunks ("more"
    says to ask again); each item gets its own event."""
    s = cluster.start_server("s1", extra_args=["--backoff-base", "0"])
    wait_leader(s.url)
    items = [{"id": f"k{i}", "payload": i, "queue": "bulk", "key": "t1" if i % 2 else "t2"}
             for i in range(30)]
    http("POST", s.url + "/work", items, JSON)
    submit(s.url, {"id": "other-q", "payload": 0, "queue": "elsewhere"})
    r = http("POST", s.url + "/bulk/cancel", {"queue": "bulk", "key": "t1", "limit": 10}, JSON)
    assert r.status == 200 and r.json() == {"cancelled": 10, "more": True}, r.text
    r = http("POST", s.url + "/bulk/cancel", {"queue": "bulk", "key": "t1"}, JSON)
    assert r.json() == {"cancelled": 5, "more": False}, r.text
    left = {w["id"] for w in http("GET", s.url + "/work?status=pending&limit=100").json()["items"]}
    assert left == {f"k{i}" for i in range(0, 30, 2)} | {"other-q"}, left
    # Make some dead, then reopen those of one key.
    for j in pull(s.url, "w1", max_jobs=20, queues=["bulk"]):
        report(s.url, "w1", [{"id": j["id"], "attempt": j["attempt"], "outcome": "failed",
                              "error": "x", "retry": False}])
    r = http("POST", s.url + "/bulk/retry", {"queue": "bulk", "key": "t2", "limit": 100}, JSON)
    assert r.status == 200 and r.json() == {"retried": 15, "more": False}, r.text
    assert get_work(s.url, "k0")["status"] == "pending"
    assert get_work(s.url, "other-q")["status"] == "pending", "another queue was touched"
    r = http("POST", s.url + "/bulk/cancel", {"status": "finished"}, JSON)
    assert r.status == 400, r.text
    cancelled = [e for e in events_of(cluster, ["cancelled"]) if e["work_id"].startswith("k")]
    assert len(cancelled) == 15, len(cancelled)


def test_bad_limits_are_refused(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    for body in ({}, {"max_running": 0}, {"max_running": "2"}, {"rate": {"limit": 5}},
                 {"rate": {"limit": 0, "per": 1}}, {"paused": "yes"}, {"other": 1},
                 {"key_weights": {"a": 0}}, {"key_weights": {"a": 1001}},
                 {"key_weights": {"a b": 2}}, {"key_weights": [1]},
                 {"key_weights": {f"k{i}": 2 for i in range(101)}}):
        r = http("PUT", s.url + "/queues/q", body, JSON)
        assert r.status == 400, f"{body}: {r.status} {r.text}"
        assert r.json()["detail"], r.text
    r = http("PUT", s.url + "/queues/bad%20name", {"paused": True}, JSON)
    assert r.status == 400, r.text


if __name__ == "__main__":
    run_tests(globals())
