"""A database per shard, as the front-end reads it: a cluster of four shards
whose shards 2 and 3 keep their rows in a second PostgreSQL. Every read of
the API (by id, lists and their cursors, counts, the chart, /metrics, the
results stream) answers from whichever database holds the rows; while the
shard database is down, the home database's reads go on, the reads that
need it answer 503 and /readyz says which; once it is back the results
stream goes on without missing anything."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_until  # noqa: E402
from workd import JSON, complete, expect, pull, shard_of, submit, wait_status  # noqa: E402

FAST = ["--election-interval", "100ms", "--worker-timeout", "3s", "--lease-grace", "2s"]


def one_queue_per_shard(n):
    out, i = {}, 0
    while len(out) < n:
        out.setdefault(shard_of(f"q{i}", n), f"q{i}")
        i += 1
    return out


def start(cluster):
    """A node of four shards, 2 and 3 in the database 'other'; {shard: queue}."""
    other = cluster.add_database("other")
    s = cluster.start_server("s1", extra_args=[
        "--shards", "4", "--shard-databases", f"2={other} 3={other}", *FAST])
    wait_until(lambda: http("GET", s.url + "/readyz").status == 200, 20,
               what="every shard to have a leader")
    return s, other, one_queue_per_shard(4)


def shards_in(cluster, url, table):
    return cluster.psql(f"SELECT string_agg(DISTINCT shard::text, ',' ORDER BY shard::text)"
                        f" FROM {table}", url=url)


def metric_queues(url, family):
    text = expect(http("GET", url + "/metrics"), 200, "GET /metrics").text
    return {line.split('queue="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith(family + "{") and 'queue="' in line}


def test_every_read_finds_rows_in_either_database(cluster):
    s, other, qs = start(cluster)
    ids = {k: submit(s.url, {"queue": q, "payload": {"shard": k}})["id"] for k, q in qs.items()}
    assert shards_in(cluster, None, "workd_open") == "0,1", "home keeps shards 0 and 1"
    assert shards_in(cluster, other, "workd_open") == "2,3", "the other keeps shards 2 and 3"
    for k, work_id in ids.items():
        w = expect(http("GET", f"{s.url}/work/{work_id}"), 200, f"GET the work of shard {k}")
        assert w.json()["queue"] == qs[k], w.json()
        e = expect(http("GET", f"{s.url}/work/{work_id}/events"), 200, f"events of shard {k}")
        assert [x["type"] for x in e.json()["events"]] == ["accepted"], e.json()
    expect(http("GET", f"{s.url}/work/nowhere"), 404, "an id in no database")
    shards = expect(http("GET", f"{s.url}/cluster"), 200, "GET /cluster").json()["shards"]
    where = {x["shard"]: x["database"] for x in shards}
    assert where == {0: "home", 1: "home", 2: "shard-2", 3: "shard-2"}, (
        f"/cluster names each shard's database: {where}")

    def parts():  # each database's retention keeps its own parts
        return [int(cluster.psql("SELECT count(*) FROM workd_parts", url=u))
                for u in (None, other)]

    def storage_parts():
        return expect(http("GET", f"{s.url}/cluster"), 200, "GET /cluster").json()[
            "storage"]["parts"]
    def parts_metrics():
        text = expect(http("GET", f"{s.url}/metrics"), 200, "GET /metrics").text
        return {line.split()[0]: int(line.split()[1]) for line in text.splitlines()
                if line.startswith("workd_parts{")}
    wait_until(lambda: parts_metrics() == {'workd_parts{database="home"}': parts()[0],
                                           'workd_parts{database="shard-2"}': parts()[1]}, 10,
               what=lambda: f"workd_parts of each database {parts()}: {parts_metrics()}")
    wait_until(lambda: storage_parts() == sum(parts()), 10,
               what=lambda: f"/cluster's storage to count both databases' parts {parts()} "
                            f"(it says {storage_parts()})")
    # The list: newest first over both databases, paged by its cursor.
    everything = expect(http("GET", f"{s.url}/work?limit=10"), 200, "GET /work").json()
    listed = [w["id"] for w in everything["items"]]
    created = [w["created_at"] for w in everything["items"]]
    assert sorted(listed) == sorted(ids.values()), f"every work once: {everything}"
    assert created == sorted(created, reverse=True), f"newest first: {everything}"
    seen, before = [], None
    while True:
        page = expect(http("GET", f"{s.url}/work?limit=1" + (f"&before={before}" if before else "")),
                      200, "a page of GET /work").json()
        seen += [w["id"] for w in page["items"]]
        before = page.get("next_before")
        if not before:
            break
    assert seen == listed, f"pages of one should give each work once, in order: {seen}"
    pending = expect(http("GET", f"{s.url}/work?status=pending&queue={qs[3]}"), 200, "filter")
    assert [w["id"] for w in pending.json()["items"]] == [ids[3]], pending.json()
    # Counts, limits and backlog from both databases.
    queues = expect(http("GET", f"{s.url}/queues"), 200, "GET /queues").json()["queues"]
    assert {q["queue"]: q["pending"] for q in queues} == {q: 1 for q in qs.values()}, queues
    keys = expect(http("GET", f"{s.url}/queues/{qs[2]}/keys"), 200, "keys of shard 2").json()
    assert keys["keys"][0]["pending"] == 1, keys
    assert metric_queues(s.url, "workd_queue_depth") >= set(qs.values())
    # Schedules and batches by name, wherever their queue's shard lives.
    sched = {"cron": "0 3 * * *", "work": {"queue": qs[2], "payload": 1}}
    expect(http("PUT", f"{s.url}/schedules/nightly", sched, JSON), 200, "PUT a schedule")
    expect(http("GET", f"{s.url}/schedules/nightly"), 200, "GET a schedule of shard 2")
    names = [x["name"] for x in expect(http("GET", f"{s.url}/schedules"), 200, "all").json()
             ["schedules"]]
    assert names == ["nightly"], names
    r = expect(http("POST", f"{s.url}/work", {"items": [{"queue": qs[3], "payload": 1}],
                                              "batch": {}}, JSON), 202, "a batch in shard 3")
    expect(http("GET", f"{s.url}/batches/{r.json()['batch']}"), 200, "GET the batch")
    # Results, a wait and a cancel routed by id, and the chart.
    waited = {}
    waiter = threading.Thread(target=lambda: waited.setdefault(
        "r", http("GET", f"{s.url}/work/{ids[3]}?wait=20", timeout=30)))
    waiter.start()
    with SSEClient(s.url + "/results?after=0") as stream:
        for k in (2, 3, 0):
            jobs = pull(s.url, f"w{k}", queues=[qs[k]])
            complete(s.url, f"w{k}", jobs[0], {"done": k})
        expect(http("DELETE", f"{s.url}/work/{ids[1]}"), 200, "cancel in shard 1")
        wait_until(lambda: {e["data"]["id"] for e in stream.events} >= set(ids.values()), 15,
                   what="the results of every shard on the stream")
    waiter.join(30)
    assert waited["r"].json()["status"] == "completed", waited["r"].json()
    assert wait_status(s.url, ids[3], "completed")["result"] == {"done": 3}
    chart = expect(http("GET", f"{s.url}/activity?minutes=5"), 200, "GET /activity").json()
    assert {q: sum(chart["queues"][q]["accepted"]) for q in qs.values()} == \
        {q: 2 if q == qs[3] else 1 for q in qs.values()}, chart
    assert sum(chart["queues"][qs[2]]["completed"]) == 1, chart


def test_a_shard_database_down_fails_only_what_needs_it(cluster):
    s, other, qs = start(cluster)
    ids = {k: submit(s.url, {"queue": q, "payload": k})["id"] for k, q in qs.items()}
    with SSEClient(s.url + "/results") as stream:
        cluster.db_stop("other")
        ready = wait_until(lambda: (r := http("GET", s.url + "/readyz")).status == 503 and r, 10,
                           what="/readyz to see the shard database down")
        assert "shard 2" in ready.json()["detail"], ready.json()
        expect(http("GET", f"{s.url}/work/{ids[0]}"), 200, "work of a home shard")
        expect(http("GET", f"{s.url}/work/{ids[2]}"), 503, "work of the shard down")
        expect(http("GET", f"{s.url}/work/nowhere"), 503, "an id maybe in the database down")
        expect(http("GET", f"{s.url}/work"), 503, "a list over every shard")
        cluster.db_start("other")
        wait_until(lambda: http("GET", s.url + "/readyz").status == 200, 20,
                   what="/readyz once the shard database is back")
        for k in (3, 0, 2):
            jobs = wait_until(lambda: pull(s.url, f"w{k}", queues=[qs[k]]), 20,
                              what=f"the work of shard {k}", ignore=(AssertionError,))
            complete(s.url, f"w{k}", jobs[0], {"done": k})
        wait_until(lambda: {e["data"]["id"] for e in stream.events} >= {ids[3], ids[0], ids[2]},
                   15, what="the results of both databases' shards on the stream")
    expect(http("GET", f"{s.url}/work?limit=10"), 200, "the list again")



def test_a_leader_refuses_only_what_needs_the_database_that_is_down(cluster):
    """While shard 2's database is down, shard 0's leader cannot look a
    client-chosen id up there and refuses it (503); the pulls, reports and
    generated-id submissions that reach it in the same rounds need no look
    and are served."""
    s, other, qs = start(cluster)
    cluster.db_stop("other")
    wait_until(lambda: http("GET", s.url + "/readyz").status == 503, 10,
               what="/readyz to see the shard database down")
    stop, refused = threading.Event(), []

    def chosen_ids():  # a client that names its ids, as fast as answers come
        i = 0
        while not stop.is_set():
            r = http("POST", s.url + "/work", {"id": f"chosen-{i}", "queue": qs[0],
                                               "payload": i}, JSON)
            refused.append(r.status)
            i += 1
    t = threading.Thread(target=chosen_ids)
    t.start()
    try:
        for i in range(30):
            r = http("POST", s.url + "/work", {"queue": qs[0], "payload": i}, JSON)
            expect(r, 202, f"a generated id beside ids that need a look ({i})")
            r = http("POST", s.url + "/workers/w0/pull",
                     {"instance": "i1", "max": 1, "wait": 5, "queues": [qs[0]]}, JSON)
            jobs = expect(r, 200, f"a pull beside ids that need a look ({i})").json()["jobs"]
            assert jobs, f"pull {i} got nothing"
            r = http("POST", s.url + "/workers/w0/reports", {"reports": [
                {"id": jobs[0]["id"], "attempt": jobs[0]["attempt"], "outcome": "completed",
                 "result": i}]}, JSON)
            expect(r, 200, f"a report beside ids that need a look ({i})")
    finally:
        stop.set()
        t.join(10)
    assert refused and set(refused) == {503}, (
        f"client-chosen ids while the database is down: {sorted(set(refused))}")
    cluster.db_start("other")


def test_a_shard_database_that_does_not_answer_holds_up_nothing_else(cluster):
    """A shard database whose host takes connections and never answers them
    (its postmaster stopped: the kernel still accepts, nothing replies): a
    front-end node opens its sessions there without blocking, so the other
    shards' results still reach its streams at once, and reads that need the
    silent database answer 503 at once, not after a connect timeout; so do a
    leader's looks of ids there, and its other work goes on."""
    s, other, qs = start(cluster)
    f = cluster.start_server("f1", extra_args=[
        "--roles", "frontend", "--shards", "4", "--shard-databases", f"2={other} 3={other}",
        *FAST])
    wait_until(lambda: http("GET", f.url + "/readyz").status == 200, 20, what="f1 ready")
    # Shard 1's leader opens its session for looks of ids in the other database.
    submit(s.url, {"id": "before", "queue": qs[1], "payload": 0})
    pid_file = cluster.databases["other"]["dir"] / "data" / "postmaster.pid"
    postmaster = int(pid_file.read_text().split()[0])
    sessions = cluster.psql("SELECT pid FROM pg_stat_activity WHERE application_name IN"
                            " ('workd-listener', 'workd-frontend', 'workd-manager-peer')",
                            url=other).split()
    with SSEClient(f.url + "/results") as sse:
        os.kill(postmaster, signal.SIGSTOP)
        try:
            for pid in sessions:  # as pg_terminate_backend would, without the postmaster
                os.kill(int(pid), signal.SIGTERM)
            wait_until(lambda: http("GET", f.url + "/readyz").status == 503, 10,
                       what="f1 to see that it lost the shard database")
            t = time.monotonic()
            r = http("GET", f.url + "/work?limit=5")
            took = time.monotonic() - t
            assert r.status == 503 and took < 2, (
                f"a list needing the silent database answered {r.status} after {took:.1f}s: "
                "it should be 503 at once")
            for i in range(3):
                t = time.monotonic()
                r = http("POST", s.url + "/work", {"id": f"chosen-{i}", "queue": qs[1],
                                                   "payload": i}, headers=JSON)
                took = time.monotonic() - t
                assert r.status == 503 and took < 1, (
                    f"a client-chosen id (looked up in every database) answered {r.status} "
                    f"after {took:.1f}s: it should be 503 at once")
            for i in range(6):
                work_id = submit(s.url, {"queue": qs[0], "payload": {"i": i}})["id"]
                t = time.monotonic()
                jobs = pull(s.url, "w0", queues=[qs[0]])
                complete(s.url, "w0", jobs[0], {"i": i})
                sse.wait_for(lambda e, w=work_id: e["data"]["id"] == w, 10)
                took = time.monotonic() - t
                assert took < 1.5, (
                    f"a result of shard 0 took {took:.1f}s to reach f1's stream while shard 2's "
                    "database did not answer: its listener waited on that database")
                time.sleep(0.5)  # spread over more than one of the listener's tries
        finally:
            os.kill(postmaster, signal.SIGCONT)
    wait_until(lambda: http("GET", f.url + "/readyz").status == 200, 20,
               what="f1 ready again once the shard database answers")
    expect(http("GET", f.url + "/work?limit=5"), 200, "the list once both databases answer")


if __name__ == "__main__":
    run_tests(globals())
