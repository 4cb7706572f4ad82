"""Shards of the manager (issue 31): a cluster made with --shards N runs a
manager per shard, each with its own leader lock, term and log; a queue's
work lives in one shard (FNV-1a of its name), and a client or worker sees
one cluster."""

import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, promtool, run_tests, wait_until  # noqa: E402
from workd import (JSON, complete, expect, get_work, pull, submit,  # noqa: E402
                   pull_in_background, wait_status)

FAST = ["--election-interval", "100ms", "--worker-timeout", "3s", "--lease-grace", "2s",
        "--backoff-base", "50ms", "--backoff-max", "500ms"]


def shard_of(queue, n):
    h = 2166136261
    for b in queue.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return 0 if n <= 1 else h % n


def queues_per_shard(n, per=1):
    """`per` queue names in each of the n shards: {shard: [names]}."""
    out = {s: [] for s in range(n)}
    i = 0
    while any(len(v) < per for v in out.values()):
        q = f"q{i}"
        if len(out[shard_of(q, n)]) < per:
            out[shard_of(q, n)].append(q)
        i += 1
    return out


def all_led(cluster, n):
    rows = cluster.psql("SELECT count(*) FROM workd_shards")
    return int(rows) == n


def test_four_shards_on_one_node_run_every_queue(cluster):
    s = cluster.start_server("s1", extra_args=["--shards", "4", *FAST])
    wait_until(lambda: all_led(cluster, 4), 15, what="every shard to elect a leader")
    assert cluster.psql("SELECT shards FROM workd_cluster") == "4"
    qs = queues_per_shard(4)
    ids = {}
    for shard, (q,) in qs.items():
        ids[q] = submit(s.url, {"queue": q, "payload": {"shard": shard}})["id"]
    for shard, (q,) in qs.items():
        jobs = pull(s.url, f"w-{q}", queues=[q])
        assert [j["id"] for j in jobs] == [ids[q]], f"the worker of {q} got {jobs}"
        complete(s.url, f"w-{q}", jobs[0], {"done": q})
    for q, work_id in ids.items():
        w = wait_status(s.url, work_id, "completed")
        assert w["result"] == {"done": q}
    by_shard = cluster.psql("SELECT string_agg(DISTINCT shard::text, ',' ORDER BY shard::text)"
                            " FROM workd_done")
    assert by_shard == "0,1,2,3", f"finished work should be in every shard, is in {by_shard}"


def test_a_worker_of_every_queue_is_served_by_every_shard(cluster):
    """One worker, no queues named: the node pulls for it from every shard,
    its heartbeats reach every shard (none of its attempts is taken from it
    as silent), and /cluster shows each shard."""
    s = cluster.start_server("s1", extra_args=["--shards", "4", *FAST])
    wait_until(lambda: all_led(cluster, 4), 15, what="every shard to elect a leader")
    qs = queues_per_shard(4, per=2)
    names = [q for v in qs.values() for q in v]
    ids = [submit(s.url, {"queue": names[i % len(names)], "payload": i})["id"]
           for i in range(40)]
    cluster.start_worker("w1", s.url, ["--demo", "--demo-delay", "20ms", "--concurrency", "3"])
    for work_id in ids:
        wait_status(s.url, work_id, "completed", timeout=60)
    done = cluster.psql("SELECT count(*), count(DISTINCT shard), max(attempts) FROM workd_done")
    assert done == "40|4|1", f"40 jobs done once each over 4 shards, got {done}"
    c = expect(http("GET", s.url + "/cluster"), 200, "GET /cluster").json()
    assert [x["shard"] for x in c["shards"]] == [0, 1, 2, 3], c.get("shards")
    assert [w["id"] for w in c["workers"]] == ["w1"], c["workers"]
    # A worker waiting on every shard is woken by work in any of them.
    late = submit(s.url, {"queue": qs[3][0], "payload": 99})["id"]
    wait_status(s.url, late, "completed", timeout=20)


def leaders(cluster):
    """{shard: (url, term)} as workd_shards says."""
    rows = cluster.psql("SELECT shard, url, term FROM workd_shards ORDER BY shard")
    return {int(r.split("|")[0]): (r.split("|")[1], int(r.split("|")[2]))
            for r in rows.splitlines() if r}


def spread(cluster, urls, n):
    got = leaders(cluster)
    per = [sum(1 for u, _ in got.values() if u == url) for url in urls]
    return len(got) == n and sum(per) == n and max(per) - min(per) <= 1


def test_shards_spread_over_two_nodes_and_a_kill_moves_only_its_own(cluster):
    a = cluster.start_server("a", extra_args=["--shards", "4", *FAST])
    b = cluster.start_server("b", extra_args=["--shards", "4", *FAST])
    wait_until(lambda: spread(cluster, [a.url, b.url], 4), 40,
               what="the 4 shards to spread 2 and 2 over two nodes",
               until=None)
    before = leaders(cluster)
    mine = {s for s, (u, _) in before.items() if u == b.url}
    # Work in every shard, through either node.
    qs = queues_per_shard(4)
    ids = [submit((a if i % 2 else b).url, {"queue": q, "payload": i})["id"]
           for i, (q,) in enumerate(qs.values())]
    a.kill()
    wait_until(lambda: all(u == b.url for u, _ in leaders(cluster).values()), 10,
               what="the survivor to lead every shard")
    after = leaders(cluster)
    for s in mine:
        assert after[s] == before[s], f"shard {s} of the survivor moved: {before[s]} -> {after[s]}"
    for s in set(before) - mine:
        assert after[s][1] == before[s][1] + 1, f"shard {s} should have a new term: {after[s]}"
    cluster.start_worker("w", b.url, ["--demo", "--demo-delay", "5ms"])
    for work_id in ids:
        wait_status(b.url, work_id, "completed", timeout=30)


def test_ids_and_dependencies_across_shards(cluster):
    """An id is one work item in the whole cluster: resubmitted on a queue
    of another shard it is recognised (or, with another payload, refused).
    A child may wait for a parent of another shard once that parent has
    finished; while the parent is open there, the child is refused."""
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: all_led(cluster, 2), 15, what="both shards to elect a leader")
    qs = queues_per_shard(2)
    q0, q1 = qs[0][0], qs[1][0]
    first = submit(s.url, {"id": "job-1", "queue": q0, "payload": {"n": 1}})
    assert first["created"] is True
    again = submit(s.url, {"id": "job-1", "queue": q1, "payload": {"n": 1}})
    assert again["created"] is False and again["status"] == "pending", again
    r = http("POST", s.url + "/work", {"id": "job-1", "queue": q1, "payload": {"n": 2}}, JSON)
    expect(r, 409, "the id again with another payload, on another shard's queue")
    assert r.json()["type"].endswith("/conflict"), r.text
    # A parent open in shard 0, a child in shard 1: refused, and nothing runs.
    r = http("POST", s.url + "/work",
             {"id": "child", "queue": q1, "payload": 1, "after": ["job-1"]}, JSON)
    expect(r, 409, "a child in another shard than its open parent")
    assert r.json()["type"].endswith("/cross-shard"), r.text
    jobs = pull(s.url, "w", queues=[q0])
    complete(s.url, "w", jobs[0], "parent done")
    wait_status(s.url, "job-1", "completed")
    # Finished, the parent is known for good: the child is accepted and runs.
    child = submit(s.url, {"id": "child", "queue": q1, "payload": 1, "after": ["job-1"]})
    assert child["created"] is True and child["status"] == "pending", child
    jobs = pull(s.url, "w", queues=[q1])
    assert [j["id"] for j in jobs] == ["child"], jobs
    assert int(cluster.psql("SELECT count(*) FROM workd_open WHERE id = 'job-1'")) == 0


def test_metrics_and_cluster_show_each_shard(cluster):
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: all_led(cluster, 2), 15, what="both shards to elect a leader")
    qs = queues_per_shard(2)
    for shard, (q,) in qs.items():
        expect(http("PUT", f"{s.url}/queues/{q}", {"rate": {"limit": 5, "per": 1}}, JSON), 200,
               f"a rate limit on {q}")
        submit(s.url, {"queue": q, "payload": shard})
    text = expect(http("GET", s.url + "/metrics"), 200, "metrics").text
    for shard, (q,) in qs.items():
        assert f'workd_commit_events_count{{shard="{shard}"}}' in text, text[:2000]
        assert f'workd_open_work{{shard="{shard}"}} 1' in text, "each shard's open work"
        assert f'workd_queue_rate_tokens{{queue="{q}"}}' in text, \
            f"the token bucket of {q} (shard {shard}) must be there"
    exe = promtool()
    if exe:
        r = subprocess.run([exe, "check", "metrics"], input=text.encode(), capture_output=True,
                           timeout=30)
        assert r.returncode == 0, f"promtool: {r.stdout.decode()}{r.stderr.decode()}"
    c = expect(http("GET", s.url + "/cluster"), 200, "GET /cluster").json()
    assert [(x["shard"], x["open_total"]) for x in c["shards"]] == [(0, 1), (1, 1)], c["shards"]
    assert c["open_total"] == 2 and set(c["open"]) == {qs[0][0], qs[1][0]}, c


def test_sql_submissions_go_to_their_queues_shard(cluster):
    s = cluster.start_server("s1", extra_args=["--shards", "3", *FAST])
    wait_until(lambda: all_led(cluster, 3), 15, what="the shards to elect a leader")
    qs = queues_per_shard(3)
    for shard, (q,) in qs.items():
        cluster.psql(f"SELECT workd.submit('{{\"n\": {shard}}}', id => 'sql-{shard}', "
                     f"queue => '{q}')")
    for shard, (q,) in qs.items():
        w = wait_status(s.url, f"sql-{shard}", "pending")
        assert w["queue"] == q and w["payload"] == {"n": shard}, w
    rows = cluster.psql("SELECT string_agg(id || ':' || shard, ',' ORDER BY id) FROM workd_open")
    assert rows == "sql-0:0,sql-1:1,sql-2:2", f"each taken by its queue's shard: {rows}"
    assert cluster.psql("SELECT count(*) FROM workd_inbox") == "0"


def test_a_schedule_fires_in_its_queues_shard(cluster):
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: all_led(cluster, 2), 15, what="both shards to elect a leader")
    qs = queues_per_shard(2)
    spec = {"cron": "* * * * * *", "overlap": "allow",
            "work": {"queue": qs[1][0], "payload": {"tick": True}}}
    expect(http("PUT", s.url + "/schedules/every-second", spec, JSON), 200, "PUT a schedule")
    assert cluster.psql("SELECT shard FROM workd_schedules WHERE name = 'every-second'") == "1"
    wait_until(lambda: int(cluster.psql("SELECT count(*) FROM workd_open")) >= 2, 10,
               what="two ticks")
    rows = cluster.psql("SELECT count(*), count(DISTINCT id), min(shard), max(shard)"
                        " FROM workd_open")
    n = int(rows.split("|")[0])
    assert rows == f"{n}|{n}|1|1", f"every tick's work once, in shard 1: {rows}"
    # Moved to a queue of the other shard: refused (it would fire in both).
    moved = {**spec, "work": {"queue": qs[0][0], "payload": {}}}
    r = http("PUT", s.url + "/schedules/every-second", moved, JSON)
    expect(r, 409, "a schedule moved to another shard's queue")
    assert r.json()["type"].endswith("/schedule-moves-shard"), r.text
    expect(http("POST", s.url + "/schedules/every-second/pause"), 200, "pause it")
    expect(http("DELETE", s.url + "/schedules/every-second"), 204, "delete it")
    expect(http("PUT", s.url + "/schedules/every-second", moved, JSON), 200, "then move it")
    assert cluster.psql("SELECT shard FROM workd_schedules WHERE name = 'every-second'") == "0"


def test_one_id_submitted_to_two_shards_at_once_is_one_job(cluster):
    """Two shards may take the same new id in the same moment: the database's
    primary key refuses the second, whose leader steps down once, and its
    retry finds the first. Every client gets 202, and each id is one job."""
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: all_led(cluster, 2), 15, what="both shards to elect a leader")
    qs = queues_per_shard(2)
    answers = {}

    def send(i, q):
        r = http("POST", s.url + "/work", {"id": f"twin-{i}", "queue": q, "payload": i}, JSON,
                 timeout=60)
        answers[(i, q)] = (r.status, r.json().get("created") if r.status == 202 else r.text)

    for i in range(30):
        ts = [threading.Thread(target=send, args=(i, q)) for (q,) in qs.values()]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    bad = {k: v for k, v in answers.items() if v[0] != 202}
    assert not bad, f"every submission is accepted (one of each pair as existing): {bad}"
    for i in range(30):
        created = [answers[(i, q)][1] for (q,) in qs.values()]
        assert sorted(created) == [False, True], f"twin-{i}: created {created}"
    rows = cluster.psql("SELECT count(*), count(DISTINCT id) FROM workd_open"
                        " WHERE id LIKE 'twin-%'")
    assert rows == "30|30", f"each id is one job: {rows}"


def test_a_waiting_pull_over_shards_gets_work_that_comes_later(cluster):
    """A pull over the queues of several shards waits on all of them (with
    peeks sent again every second): work submitted to any shard seconds later
    is handed to it, and nothing more than its max."""
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: all_led(cluster, 2), 15, what="both shards to elect a leader")
    qs = queues_per_shard(2)
    t, got = pull_in_background(s.url, "w", max_jobs=1, wait=8)
    time.sleep(2.5)  # a declared delay: past two peeks' turns
    ids = [submit(s.url, {"queue": qs[1][0], "payload": i})["id"] for i in range(3)]
    t.join(15)
    assert [j["id"] for j in got["jobs"]] == ids[:1], got
    assert 2.0 < got["took"] < 7.5, f"handed when the work came, not at the wait's end: {got}"
    started = cluster.psql("SELECT count(*) FROM workd_open WHERE status = 'running'")
    assert started == "1", f"one job started for a pull of max 1, not {started}"


def test_a_submission_across_shards_is_refused(cluster):
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    qs = queues_per_shard(2)
    r = http("POST", s.url + "/work",
             {"items": [{"queue": qs[0][0], "payload": 1}, {"queue": qs[1][0], "payload": 2}]},
             JSON)
    expect(r, 409, "a bulk submission over two shards")
    assert r.json()["type"].endswith("/cross-shard"), r.text


def refused_start(cluster, name, shards, why):
    """A server asked for `shards` must not start, and must say `why`."""
    p = cluster.start_server(name, extra_args=["--shards", str(shards), *FAST],
                             wait_ready=False)
    assert p.stopped_with(20) != 0, f"--shards {shards} should have been refused"
    assert "the shard count" in p.log_text() and why in p.log_text(), p.log_tail()


def test_the_shard_count_grows_only_when_drained_and_stopped(cluster):
    """The documented procedure (docs/operations.md, "Shards"): stop every
    server, drain the open work, start with a larger --shards. Anything else
    is refused with a clear error, and nothing is lost."""
    a = cluster.start_server("a", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: all_led(cluster, 2), 15, what="both shards to elect a leader")
    qs = queues_per_shard(2)
    done = [submit(a.url, {"queue": q, "payload": q})["id"] for (q,) in qs.values()]
    for q, work_id in zip([q for (q,) in qs.values()], done):
        complete(a.url, "w", pull(a.url, "w", queues=[q])[0], "ok")
    put = http("PUT", a.url + "/schedules/nightly",
               {"cron": "0 3 * * *", "work": {"queue": qs[1][0], "payload": {}}}, JSON)
    expect(put, 200, "PUT a schedule")
    waiting = submit(a.url, {"queue": qs[0][0], "payload": "open"})["id"]
    refused_start(cluster, "grow-while-running", 4, "is running")
    a.stop()
    refused_start(cluster, "grow-with-open-work", 4, "open work")
    refused_start(cluster, "shrink", 1, "can grow, not shrink")
    # Drained: the open item runs to its end, then the cluster grows.
    a = cluster.restart_server(a)
    complete(a.url, "w", pull(a.url, "w", queues=[qs[0][0]])[0], "ok")
    wait_status(a.url, waiting, "completed")
    a.stop()
    b = cluster.start_server("b", extra_args=["--shards", "4", *FAST])
    wait_until(lambda: all_led(cluster, 4), 15, what="the four shards to elect a leader")
    assert cluster.psql("SELECT shards FROM workd_cluster") == "4"
    for work_id in done + [waiting]:
        assert get_work(b.url, work_id)["status"] == "completed"
    new_shard = shard_of(qs[1][0], 4)
    assert cluster.psql("SELECT shard FROM workd_schedules WHERE name = 'nightly'") == \
        str(new_shard), "the schedule moves to its queue's shard"
    later = {}
    for shard, (q,) in queues_per_shard(4).items():
        later[q] = submit(b.url, {"queue": q, "payload": shard})["id"]
        complete(b.url, "w", pull(b.url, "w", queues=[q])[0], "ok")
    for work_id in later.values():
        wait_status(b.url, work_id, "completed")
    assert cluster.psql("SELECT count(DISTINCT shard) FROM workd_done") == "4"


if __name__ == "__main__":
    run_tests(globals())
