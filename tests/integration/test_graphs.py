"""Dependencies and batches across failover: a graph of 200 work items with
fan-out and fan-in runs in dependency order (from the log's start and
completion events), across a leader kill; a parent that ends dead cancels its
descendants, naming it, while a run-anyway child runs; a batch of 1,000
publishes its batch event once, after its last member, across a leader kill,
and submits its callback; dependencies are bounded in number held and in
rate made."""

import random
import signal
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, complete, completions_by_id, events_of, expect, get_work,  # noqa: E402
                   heartbeat, leader_of, pull, report, submit, wait_new_leader, wait_status)

FAST = ["--election-interval", "100ms", "--worker-timeout", "3s", "--lease-grace", "1s"]


def two_servers(cluster):
    servers = {}
    for name in ("a", "b"):
        p = cluster.start_server(name, extra_args=FAST)
        wait_leader(p.url)
        servers[p.url] = p
    return servers


def kill_leader(cluster, servers):
    urls = list(servers)
    leader = leader_of(urls)
    assert leader, "a leader must be known"
    servers[leader].kill(signal.SIGKILL)
    new, _ = wait_new_leader(urls, not_url=leader, timeout=10)
    cluster.restart_server(servers[leader])
    return new


def graph_200(seed=15):
    """A root fanning out to 49, each of 100 waiting for 3 of those, 49 waiting
    for 4 of the 100, and one waiting for all 49 (fan-in)."""
    rnd = random.Random(seed)
    nodes = [("g0", [])]
    nodes += [(f"g{i}", ["g0"]) for i in range(1, 50)]
    nodes += [(f"g{i}", [f"g{j}" for j in rnd.sample(range(1, 50), 3)]) for i in range(50, 150)]
    nodes += [(f"g{i}", [f"g{j}" for j in rnd.sample(range(50, 150), 4)])
              for i in range(150, 199)]
    nodes.append(("g199", [f"g{i}" for i in range(150, 199)]))
    return nodes


def test_graph_runs_in_dependency_order_across_a_kill(cluster):
    servers = two_servers(cluster)
    urls = list(servers)
    nodes = graph_200()
    items = [{"id": i, "payload": n, "queue": "graph", **({"after": ps} if ps else {})}
             for n, (i, ps) in enumerate(nodes)]
    got = expect(http("POST", urls[1] + "/work", items, JSON), 202, "the graph").json()["items"]
    statuses = Counter(x["status"] for x in got)
    assert statuses == {"pending": 1, "waiting": 199}, f"only the root is ready: {statuses}"
    q = next(q for q in expect(http("GET", urls[1] + "/queues"), 200, "queues").json()["queues"]
             if q["queue"] == "graph")
    assert (q["waiting"], q["pending"]) == (199, 1), f"/queues counts the waiting work: {q}"
    m = http("GET", urls[1] + "/metrics").text
    assert 'workd_queue_depth{queue="graph",state="waiting"} 199' in m, "the metric counts it too"
    done, killed = 0, False
    while done < len(nodes):
        url = leader_of(urls) or urls[0]
        try:
            jobs = pull(url, "gw", max_jobs=8, wait=2)
        except (AssertionError, OSError):
            continue  # the leader is moving
        for j in jobs:
            assert complete(url, "gw", j, j["payload"])["accepted"], j
            done += 1
        if done >= 80 and not killed:
            kill_leader(cluster, servers)
            killed = True
    assert killed, "the leader should have been killed half way"
    log = events_of(cluster, ["started", "completed"])
    first_start = {}
    completed_at = {}
    for e in log:
        if e["type"] == "started":
            first_start.setdefault(e["work_id"], e["seq"])
        else:
            completed_at[e["work_id"]] = e["seq"]
    early = [(p, c) for c, ps in nodes for p in ps if first_start[c] < completed_at[p]]
    assert not early, f"children started before a parent completed (parent, child): {early[:5]}"
    assert completions_by_id(cluster) == {i: 1 for i, _ in nodes}, "each runs exactly once"
    root, sink = get_work(urls[0], "g0"), get_work(urls[1], "g199")
    assert len(root["children"]) == 49 and root["after"] == [], root
    assert sorted(sink["after"]) == sorted(f"g{i}" for i in range(150, 199)), sink["after"]
    assert sink["children"] == [] and sink["status"] == "completed", sink


def test_dead_parent_cancels_descendants(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    got = expect(http("POST", a.url + "/work", [
        {"id": "A", "payload": 1, "max_attempts": 1},
        {"id": "B", "payload": 2, "after": ["A"]},
        {"id": "C", "payload": 3, "after": ["B"]},
        {"id": "D", "payload": 4, "after": ["A"], "run_anyway": True}], JSON), 202, "graph")
    assert [x["status"] for x in got.json()["items"]] == ["pending"] + ["waiting"] * 3
    missing = expect(http("POST", a.url + "/work", {"payload": 1, "after": ["nobody"]}, JSON),
                     404, "a child of nothing").json()
    assert missing["type"].endswith("parent-not-found"), missing
    with SSEClient(a.url + "/results?after=0") as sse:
        job = pull(a.url, "w")[0]
        assert job["id"] == "A", job
        report(a.url, "w", [{"id": "A", "attempt": 1, "outcome": "failed", "error": "boom",
                             "retry": False}])
        sse.wait_count(3, timeout=10)
        results = {e["data"]["id"]: e["data"] for e in sse.events}
    assert results["A"]["status"] == "dead", results
    assert results["B"]["status"] == "cancelled" and "parent A is dead" in results["B"]["reason"]
    assert results["C"]["status"] == "cancelled" and "parent B" in results["C"]["reason"]
    d = wait_status(a.url, "D", "pending")
    assert d["after"] == ["A"] and d["run_anyway"] is True, d
    b = get_work(a.url, "B")
    assert b["status"] == "cancelled" and b["children"] == ["C"], b
    # A child submitted after its parent died is cancelled at once.
    late = submit(a.url, {"id": "E", "payload": 5, "after": ["A"]})
    assert late["status"] == "cancelled", late


def test_batch_of_1000_finishes_once_across_a_kill(cluster):
    servers = two_servers(cluster)
    urls = list(servers)
    # Half of the batch waits in a paused queue, so that the leader is killed
    # while the batch is half done, whatever the machine's speed.
    expect(http("POST", urls[0] + "/queues/late/pause"), 200, "pause")
    items = [{"id": f"m{i}", "payload": i, "queue": "early" if i < 500 else "late"}
             for i in range(1000)]
    body = {"items": items, "batch": {"callback": {"queue": "cb", "payload": {"all": "done"}}}}
    r = expect(http("POST", urls[1] + "/work", body, JSON), 202, "the batch").json()
    batch = r["batch"]
    assert len(r["items"]) == 1000 and batch.startswith("batch-"), r["batch"]
    cluster.start_worker("w", ",".join(urls), ["--noop", "--concurrency", "8"])
    wait_until(lambda: get_batch(urls[0], batch)["counts"]["completed"] == 500, 30,
               what="the first half of the batch to complete")
    b = get_batch(urls[1], batch)
    assert not b["finished"] and b["counts"]["pending"] == 500, b
    kill_leader(cluster, servers)
    expect(http("POST", urls[0] + "/queues/late/resume"), 200, "resume")
    wait_until(lambda: get_batch(urls[0], batch)["finished"], 60, what="the batch to finish")
    b = get_batch(urls[1], batch)
    assert b["counts"]["completed"] == 1000 and b["total"] == 1000, b
    assert b["callback_id"] == f"{batch}~callback", b
    wait_status(urls[0], b["callback_id"], "completed")
    log = events_of(cluster, ["completed", "batch"])
    ends = [e for e in log if e["type"] == "batch"]
    assert len(ends) == 1, f"one batch event, not {len(ends)}"
    assert ends[0]["data"]["completed"] == 1000, ends[0]
    last_member = max(e["seq"] for e in log if e["type"] == "completed" and
                      e["work_id"].startswith("m"))
    assert ends[0]["seq"] > last_member, "the batch event comes after its last member"
    # On /results, from the start and resumed just before it: once each time.
    for after in (0, ends[0]["seq"] - 1):
        with SSEClient(f"{urls[1]}/results?after={after}") as sse:
            sse.wait_for(lambda e: e["data"]["status"] == "batch", 20)
            seen = [e for e in sse.events if e["data"]["status"] == "batch"]
            assert len(seen) == 1 and seen[0]["data"]["batch"] == batch, seen
            assert seen[0]["id"] == str(ends[0]["seq"]), seen[0]
    joined = http("POST", urls[0] + "/work", {"payload": 1, "batch": batch}, JSON)
    assert expect(joined, 404, "joining a finished batch").json()["type"].endswith(
        "batch-not-found")


def get_batch(url, batch):
    return expect(http("GET", f"{url}/batches/{batch}"), 200, f"GET /batches/{batch}").json()



def test_dependencies_are_bounded_in_total_and_released_once_all_parents_complete(cluster):
    """Each link of a waiting item to an open parent is one dependency; the
    cluster holds at most --max-dependencies (a parent named twice is one),
    and a child is released when its last open parent completes, counted,
    not found by rescanning its parents."""
    s = cluster.start_server("s1", extra_args=FAST + ["--max-dependencies", "10"])
    wait_leader(s.url)
    parents = [f"p{i}" for i in range(5)]
    for p in parents:
        submit(s.url, {"id": p, "payload": 1})
    submit(s.url, {"id": "c1", "payload": 1, "after": parents})
    submit(s.url, {"id": "c2", "payload": 1, "after": parents + ["p0", "p1"]})
    r = http("POST", s.url + "/work", {"id": "c3", "payload": 1, "after": ["p0"]}, JSON)
    assert r.status == 429 and r.json()["type"].endswith("too-many-dependencies"), r.text
    assert "--max-dependencies" in r.json()["detail"] and r.headers.get("Retry-After"), r.text
    heartbeat(s.url, "w", capacity=5)
    jobs = {j["id"]: j for j in pull(s.url, "w", max_jobs=5)}
    assert set(jobs) == set(parents), jobs
    for p in parents[:4]:
        complete(s.url, "w", jobs[p], "ok")
    assert get_work(s.url, "c1")["status"] == "waiting"
    assert get_work(s.url, "c2")["status"] == "waiting"
    complete(s.url, "w", jobs["p4"], "ok")
    assert get_work(s.url, "c1")["status"] == "pending"
    assert get_work(s.url, "c2")["status"] == "pending"
    released = [e["work_id"] for e in events_of(cluster, ["released"])]
    assert sorted(released) == ["c1", "c2"], released
    # The links ended with their parents: there is room again.
    submit(s.url, {"id": "c3", "payload": 1, "after": ["c1"]})


def test_dependencies_are_made_at_most_dependency_rate_a_second(cluster):
    """New links of waiting work to open parents are made at most
    --dependency-rate a second (a second's worth in hand), so that one
    client's fan-in cannot hold up the others' commits: past it 429
    dependency-rate-limited, saying when to retry, and accepted once the
    rate allows; work that waits for nothing is never held back."""
    s = cluster.start_server("s1", extra_args=FAST + ["--dependency-rate", "5"])
    wait_leader(s.url)
    parents = [f"p{i}" for i in range(5)]
    for p in parents:
        submit(s.url, {"id": p, "payload": 1})
    submit(s.url, {"id": "c1", "payload": 1, "after": parents})
    r = http("POST", s.url + "/work", {"id": "c2", "payload": 1, "after": parents}, JSON)
    assert r.status == 429 and r.json()["type"].endswith("dependency-rate-limited"), r.text
    assert "--dependency-rate" in r.json()["detail"] and r.headers.get("Retry-After"), r.text
    submit(s.url, {"id": "free", "payload": 1})
    wait_until(lambda: http("POST", s.url + "/work", {"id": "c2", "payload": 1,
                                                      "after": parents}, JSON).status, 10,
               until=lambda st: st == 202, what="c2 accepted once the rate allows it")
    assert get_work(s.url, "c2")["status"] == "waiting"

if __name__ == "__main__":
    run_tests(globals())
