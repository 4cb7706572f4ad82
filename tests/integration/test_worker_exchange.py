"""The worker's exchange (issue 39): one POST /workers/{id}/pull may carry
the worker's finished reports and ask for its next jobs; the reports are
decided first (in the same commit as the starts they make room for) and
answered in order as `results`, beside `jobs`. Old workers (separate
pulls and reports) and new ones run in one cluster; workd-worker carries
its reports in its pulls; with several shards the reports reach their
work's shard whatever the queues the pull names."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_until  # noqa: E402
from workd import JSON, complete, expect, get_work, pull, submit, wait_status  # noqa: E402
from test_shards import FAST, queues_per_shard  # noqa: E402


def exchange(url, worker, reports, max_jobs=1, wait=0, queues=None, status=200):
    body = {"instance": "i1", "max": max_jobs, "wait": wait, "reports": reports}
    if queues is not None:
        body["queues"] = queues
    r = http("POST", f"{url}/workers/{worker}/pull", body, JSON, timeout=wait + 30)
    return expect(r, status, f"the exchange of {worker}").json()


def done(job, result):
    return {"id": job["id"], "attempt": job["attempt"], "outcome": "completed", "result": result}


def metric(url, name, labels):
    text = expect(http("GET", url + "/metrics"), 200, "/metrics").text
    total = 0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_pull_carries_reports_and_answers_them_in_order(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    ids = [submit(s.url, {"queue": "x", "payload": i})["id"] for i in range(4)]
    jobs = pull(s.url, "w1", max_jobs=2, queues=["x"])
    assert len(jobs) == 2, jobs
    ans = exchange(s.url, "w1", [done(jobs[0], "r0"), done(jobs[1], "r1"),
                                 {"id": "nobody", "attempt": 1, "outcome": "completed"},
                                 {**done(jobs[0], "again")}],
                   max_jobs=2, queues=["x"])
    assert [(r["id"], r["accepted"]) for r in ans["results"]] == \
        [(jobs[0]["id"], True), (jobs[1]["id"], True), ("nobody", False), (jobs[0]["id"], True)], \
        f"the results answer each report in order: {ans['results']}"
    assert ans["results"][2]["reason"] == "not-found", ans["results"][2]
    assert ans["results"][0]["status"] == "completed", ans["results"][0]
    assert sorted(j["id"] for j in ans["jobs"]) == sorted(set(ids) - {j["id"] for j in jobs}), \
        f"the exchange hands out the next jobs: {ans['jobs']}"
    for j, result in zip(jobs, ("r0", "r1")):
        assert get_work(s.url, j["id"])["result"] == result, get_work(s.url, j["id"])
    # A pull without reports answers as before: no results.
    last = exchange(s.url, "w1", [done(j, "r") for j in ans["jobs"]], max_jobs=1, queues=["x"])
    assert last["jobs"] == [] and all(r["accepted"] for r in last["results"]), last
    plain = expect(http("POST", f"{s.url}/workers/w1/pull", {"instance": "i1", "max": 1},
                        JSON), 200, "a plain pull").json()
    assert "results" not in plain, f"a pull without reports has no results: {plain}"
    # A malformed report refuses the whole exchange, naming it; nothing is taken.
    submit(s.url, {"id": "kept", "queue": "x", "payload": 1})
    r = http("POST", f"{s.url}/workers/w1/pull",
             {"instance": "i1", "max": 1, "queues": ["x"],
              "reports": [{"id": "kept", "attempt": 1, "outcome": "done"}]}, JSON)
    expect(r, 400, "an exchange with a bad report")
    assert "report 0" in r.json()["detail"], r.text
    assert get_work(s.url, "kept")["status"] == "pending", "a refused exchange handed a job out"


def test_reports_in_a_waiting_pull_are_recorded_before_it_waits(cluster):
    """A pull that carries reports and then waits for jobs: the work it
    reports is completed (and on /results) at once, not when the wait ends."""
    s = cluster.start_server("s1", extra_args=FAST)
    submit(s.url, {"id": "a", "queue": "y", "payload": 1})
    (job,) = pull(s.url, "w1", queues=["y"])
    import threading
    got = {}
    t = threading.Thread(target=lambda: got.update(
        exchange(s.url, "w1", [done(job, "ok")], max_jobs=1, wait=5, queues=["y"])))
    t.start()
    wait_status(s.url, "a", "completed", timeout=3)
    assert t.is_alive(), "the pull should still wait for a job"
    submit(s.url, {"id": "b", "queue": "y", "payload": 2})
    t.join(10)
    assert [j["id"] for j in got["jobs"]] == ["b"] and got["results"][0]["accepted"], got


def test_old_and_new_workers_in_one_cluster(cluster):
    """workd-worker carries its reports in its pulls (the reports route is
    almost never asked); an old-style worker (separate pulls and reports)
    beside it completes its share; every job completes once."""
    s = cluster.start_server("s1", extra_args=FAST)
    n = 400
    ids = [submit(s.url, {"queue": "new", "payload": i})["id"] for i in range(n)]
    old_ids = [submit(s.url, {"queue": "old", "payload": i})["id"] for i in range(20)]
    cluster.start_worker("w-new", s.url, ["--noop", "--concurrency", "4", "--queues", "new"])
    for i in ids:
        wait_status(s.url, i, "completed", timeout=60)
    for k in range(len(old_ids)):  # the old protocol, by hand
        (job,) = pull(s.url, "w-old", queues=["old"], wait=5)
        complete(s.url, "w-old", job, {"old": k})
    for i in old_ids:
        assert get_work(s.url, i)["status"] == "completed", get_work(s.url, i)
    reports = metric(s.url, "workd_http_requests_total", {"route": "worker_reports"})
    pulls = metric(s.url, "workd_http_requests_total", {"route": "worker_pull"})
    assert reports <= 20 + n // 10, \
        f"workd-worker sent {reports - 20:.0f} report requests for {n} jobs ({pulls:.0f} pulls): " \
        "its reports should ride in its pulls"
    twice = cluster.psql("SELECT count(*) FROM workd_done GROUP BY id HAVING count(*) > 1")
    assert not twice, f"a job completed twice: {twice}"


def test_reports_reach_their_shard_whatever_the_pull_names(cluster):
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_shards") == "2", 15,
               what="both shards to elect a leader")
    qs = {shard: q for shard, (q,) in queues_per_shard(2).items()}
    jobs = []
    for shard in (0, 1):
        submit(s.url, {"id": f"j{shard}", "queue": qs[shard], "payload": shard})
        jobs += pull(s.url, "w1", queues=[qs[shard]])
    submit(s.url, {"id": "next", "queue": qs[0], "payload": 9})
    ans = exchange(s.url, "w1", [done(j, j["id"]) for j in jobs], max_jobs=1, queues=[qs[0]])
    assert [r["accepted"] for r in ans["results"]] == [True, True], ans
    assert [j["id"] for j in ans["jobs"]] == ["next"], ans
    for j in jobs:
        assert get_work(s.url, j["id"])["result"] == j["id"], get_work(s.url, j["id"])
    # Over every shard (no queues named), reports of both.
    (nj,) = ans["jobs"]
    submit(s.url, {"id": "last", "queue": qs[1], "payload": 1})
    ans = exchange(s.url, "w1", [done(nj, "n")], max_jobs=1, wait=5)
    assert ans["results"][0]["accepted"] and [j["id"] for j in ans["jobs"]] == ["last"], ans


def test_the_exchange_is_in_the_contract(cluster):
    spec = (Path(__file__).resolve().parents[2] / "openapi.yaml").read_text()
    assert re.search(r"PullRequest:[\s\S]*reports:", spec), \
        "openapi.yaml's pull body names reports"
    doc = (Path(__file__).resolve().parents[2] / "docs" / "worker-api.md").read_text()
    assert "exchange" in doc and '"reports"' in doc


def test_a_shard_database_down_costs_only_its_reports(cluster):
    """Shard 1's own database stops: an exchange carrying a report of each
    shard records shard 0's, answers shard 1's `unavailable` (to be sent
    again) and hands out shard 0's jobs; a heartbeat is answered in time
    (a worker's heartbeats must not wait for a shard with no leader)."""
    from test_shard_databases import Layout
    cluster.add_database("pg1")
    lay = Layout(cluster, 2, {1: "pg1"})
    s = cluster.start_server("s1", extra_args=lay.args())
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(2).items()}
    jobs = []
    for shard in (0, 1):
        submit(s.url, {"id": f"d{shard}", "queue": qs[shard], "payload": shard})
        jobs += pull(s.url, "w1", queues=[qs[shard]])
    submit(s.url, {"id": "after", "queue": qs[0], "payload": 2})
    cluster.db_stop("pg1")
    import time
    t0 = time.monotonic()
    ans = exchange(s.url, "w1", [done(j, j["id"]) for j in jobs], max_jobs=1, queues=[qs[0]])
    assert [(r["accepted"], r.get("reason")) for r in ans["results"]] == \
        [(True, None), (False, "unavailable")], ans
    assert [j["id"] for j in ans["jobs"]] == ["after"], ans
    assert get_work(s.url, "d0")["status"] == "completed"
    r = http("PUT", f"{s.url}/workers/w1", {"instance": "i1", "capacity": 1,
                                            "running": [{"id": "after", "attempt": 1}]}, JSON,
             timeout=30)
    took = time.monotonic() - t0
    expect(r, 200, "a heartbeat while shard 1 has no leader")
    assert took < 8, f"the exchange and the heartbeat took {took:.1f} s"
    assert "cancel" not in r.json(), f"nothing is stale while a shard cannot say: {r.json()}"
    cluster.db_start("pg1")
    lay.wait_led()
    again = exchange(s.url, "w1", [done(jobs[1], "d1")], max_jobs=1, queues=[qs[0]])
    assert again["results"][0]["accepted"], again


if __name__ == "__main__":
    run_tests(globals())
