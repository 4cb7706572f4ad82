"""Hostile input against a cluster of several shards (issue 38): names from
which workd makes ids (a batch's callback, a schedule's ticks) are one in the
cluster whichever shard a client sends them to, in one database and with a
database per shard; a lock that another database session holds on an id
neither stalls its submission (a clear 503 at once, naming the session) nor
costs a schedule a tick; the schedule limit is the cluster's; no client input
steps a leader down."""

import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_until  # noqa: E402
from workd import JSON, complete, expect, pull, wait_status  # noqa: E402
from test_shards import FAST, queues_per_shard  # noqa: E402
from test_shard_databases import Layout  # noqa: E402


def one_database(cluster):
    return "one database", Layout(cluster, 2, {})


def database_per_shard(cluster):
    cluster.add_database("pg1")
    return "a database per shard", Layout(cluster, 2, {1: "pg1"})


def batch_body(batch_id, queue, tag):
    return {"items": [{"queue": queue, "payload": {"tag": tag}}],
            "batch": {"id": batch_id, "callback": {"queue": queue, "payload": {"cb": tag}}}}


def problem_type(r):
    return r.json().get("type", "").rsplit("/", 1)[-1] if r.text else ""


def race(send, rounds, ok):
    """Sends send(k, shard) for shards 0 and 1 at once, `rounds` times; returns
    each round's sorted (status, problem type or "") answers. ok: the status
    of success (its problem type is "")."""
    answers = {}

    def one(k, shard):
        r = send(k, shard)
        answers[(k, shard)] = (r.status, problem_type(r) if r.status != ok else "")

    for k in range(rounds):
        ts = [threading.Thread(target=one, args=(k, shard)) for shard in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return [sorted(answers[(k, shard)] for shard in (0, 1)) for k in range(rounds)]


def check_batch_ids(cluster, what, lay):
    """A batch opened in shard 0 cannot be opened again in shard 1 (it would
    make its callback's id twice): 409 batch-exists naming the shard, whether
    sent after or at the same moment; the victim's callback runs once, under
    its own payload; no leader steps down."""
    qs = {shard: q for shard, (q,) in queues_per_shard(2).items()}
    i = 0
    s = cluster.start_server(f"s{i}", extra_args=lay.args())
    lay.wait_led()
    terms = lay.leaders()

    r = http("POST", s.url + "/work", batch_body(f"victim-{i}", qs[0], "victim"), JSON)
    expect(r, 202, f"{what}: the victim's batch in shard 0")
    r = http("POST", s.url + "/work", batch_body(f"victim-{i}", qs[1], "attacker"), JSON)
    expect(r, 409, f"{what}: the same batch id opened in shard 1")
    assert problem_type(r) == "batch-exists" and "shard 0" in r.json()["detail"], r.text

    def send(k, shard):
        return http("POST", s.url + "/work",
                    batch_body(f"race-{i}-{k}", qs[shard], f"s{shard}"), JSON, timeout=60)

    for k, got in enumerate(race(send, 20, 202)):
        assert got == [(202, ""), (409, "batch-exists")], \
            f"{what}: race-{i}-{k} opened at once in both shards: {got}"

    for shard in (0, 1):  # every open batch's member runs; then its callback
        wait_until(lambda: not run_all(s.url, qs[shard]), 30,
                   what=f"{what}: the members and callbacks of {qs[shard]} to be run")
    cb = f"victim-{i}~callback"
    w = wait_status(s.url, cb, "completed", timeout=30)
    assert w["payload"] == {"cb": "victim"} and w["queue"] == qs[0], \
        f"{what}: the victim's callback ran as the attacker's: {w}"
    rows = lay.by_db("SELECT count(*) FROM workd_done WHERE id LIKE '%~callback'")
    assert sum(int(n) for n in rows.values()) == 21, \
        f"{what}: one callback per batch (21), rows per database {rows}"
    twice = lay.by_db("SELECT id FROM workd_done WHERE id LIKE '%~callback'"
                      " GROUP BY id HAVING count(*) > 1")
    assert not any(twice.values()), f"{what}: callbacks twice: {twice}"
    assert lay.leaders() == terms, \
        f"{what}: a leader stepped down: {terms} -> {lay.leaders()}"


def test_a_batch_id_is_one_batch_in_one_database(cluster):
    check_batch_ids(cluster, *one_database(cluster))


def test_a_batch_id_is_one_batch_across_databases(cluster):
    check_batch_ids(cluster, *database_per_shard(cluster))


def run_all(url, queue):
    """Runs what a worker of queue gets now; whether it got anything."""
    jobs = pull(url, f"w-{queue}", queues=[queue], wait=1, max_jobs=50)
    for j in jobs:
        complete(url, f"w-{queue}", j, {"ran": j["id"]})
    return bool(jobs)


def hold_lock(cluster, keys_sql):
    """A psql session (no leader of workd) that takes advisory locks on the
    hashes of keys_sql's ids and keeps them until killed; returns it once
    they are held, with its backend pid."""
    p = subprocess.Popen(
        ["psql", "-X", "-A", "-t", "-d", cluster.db_url, "-c",
         f"SELECT pg_backend_pid(), count(pg_advisory_lock(hashtextextended(k, 0)))"
         f"  FROM unnest({keys_sql}) k", "-c", "SELECT pg_sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert "|" in line, f"the squatting session did not take its locks: {line!r}"
    return p, line.split("|")[0]


def end_session(cluster, squat, pid):
    """Ends the squatting session (its backend too: it sleeps, deaf to its
    client's end)."""
    squat.kill()
    squat.wait()
    cluster.psql(f"SELECT pg_terminate_backend({pid})")


def test_a_lock_held_by_another_session(cluster):
    """A session that is no leader holds an id's claim lock: the id's
    submission answers 503 id-locked at once, naming that session, and is
    accepted once it lets go; schedule ticks whose ids it holds still run."""
    lay = Layout(cluster, 2, {})
    s = cluster.start_server("s1", extra_args=lay.args())
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(2).items()}
    squat, pid = hold_lock(cluster, "ARRAY['squat-1']")
    t0 = time.monotonic()
    r = http("POST", s.url + "/work", {"id": "squat-1", "queue": qs[1], "payload": 1}, JSON,
             timeout=30)
    took = time.monotonic() - t0
    expect(r, 503, "a submission of an id whose lock a session holds")
    assert problem_type(r) == "id-locked" and f"pid {pid}" in r.json()["detail"], r.text
    assert took < 3, f"the refusal took {took:.1f} s: it must not wait for the lock"
    end_session(cluster, squat, pid)
    r = http("POST", s.url + "/work", {"id": "squat-1", "queue": qs[1], "payload": 1}, JSON)
    expect(r, 202, "the id once the session has gone")

    # The next ticks of a schedule that fires every second, locked before it exists.
    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=2)
    ticks = [f"sq~{(start + timedelta(seconds=k)).strftime('%Y-%m-%dT%H:%M:%SZ')}"
             for k in range(5)]
    squat, pid = hold_lock(cluster, "ARRAY[" + ",".join(f"'{t}'" for t in ticks) + "]")
    try:
        expect(http("PUT", s.url + "/schedules/sq", {
            "cron": "* * * * * *", "timezone": "UTC",
            "work": {"queue": qs[1], "payload": {"from": "sq"}}, "overlap": "allow"}, JSON),
               200, "the schedule")
        for t in ticks:
            wait_until(lambda: lay.count("workd_open", f"id = '{t}'") +
                       lay.count("workd_done", f"id = '{t}'") == 1, 15,
                       what=f"the tick {t}, whose lock another session holds, to make its work")
        skipped = cluster.psql("SELECT count(*) FROM workd_log WHERE events LIKE '%\"skipped\":\"%'")
        assert skipped == "0", f"ticks recorded as skipped: {skipped}"
    finally:
        end_session(cluster, squat, pid)


def check_schedules(cluster, what, lay):
    """--max-schedules bounds the cluster's schedules, whichever shards hold
    them; one name made at once in two shards is made once."""
    i = 0
    s = cluster.start_server(f"s{i}", extra_args=lay.args("--max-schedules", "3"))
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(2).items()}
    body = {"cron": "0 0 1 1 *", "timezone": "UTC", "work": {"queue": None, "payload": 1}}

    def put(name, shard):
        b = {**body, "work": {**body["work"], "queue": qs[shard]}}
        return http("PUT", f"{s.url}/schedules/{name}", b, JSON, timeout=60)

    for name, shard in (("a", 0), ("b", 1), ("c", 0)):
        expect(put(f"{name}{i}", shard), 200, f"{what}: schedule {name}{i} in shard {shard}")
    for shard in (0, 1):
        r = put(f"d{i}", shard)
        expect(r, 409, f"{what}: a fourth schedule (in shard {shard}) past a limit of 3")
        assert problem_type(r) == "too-many-schedules", r.text
    expect(put(f"a{i}", 0), 200, f"{what}: replacing a schedule at the limit")
    for name in ("a", "b", "c"):
        expect(http("DELETE", f"{s.url}/schedules/{name}{i}"), 204, f"delete {name}{i}")

    for k, got in enumerate(race(lambda k, shard: put(f"race{i}-{k}", shard), 3, 200)):
        assert got == [(200, ""), (409, "schedule-moves-shard")], \
            f"{what}: schedule race{i}-{k} made at once in two shards: {got}"
    n = lay.count("workd_schedules", f"name LIKE 'race{i}-%'")
    assert n == 3, f"{what}: {n} schedule rows for 3 names"


def test_schedules_are_counted_and_named_in_one_database(cluster):
    check_schedules(cluster, *one_database(cluster))


def test_schedules_are_counted_and_named_across_databases(cluster):
    check_schedules(cluster, *database_per_shard(cluster))


if __name__ == "__main__":
    run_tests(globals())
