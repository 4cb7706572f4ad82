"""Two or more servers: the standby takes over from a killed leader with the
same open work, a non-leader forwards to the leader, a submission made while
the leader dies succeeds, and a fenced old leader appends nothing."""

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, abandoned_pull, complete, completions_by_id, events_of,  # noqa: E402
                   expect, get_work, heartbeat, leader_of, pull, submit, wait_new_leader)

FAST = ["--election-interval", "100ms", "--worker-timeout", "2s", "--lease-grace", "1s",
        "--backoff-base", "50ms", "--backoff-max", "200ms"]


def two_servers(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST)
    wait_leader(b.url)
    procs = {a.url: a, b.url: b}
    leader = leader_of(list(procs))
    assert leader, "one of the two servers must lead"
    standby = [u for u in procs if u != leader][0]
    return procs[leader], procs[standby]


def pull_5xx(url):
    """Pulls this node answered 5xx (workd_http_requests_total)."""
    m = re.search(r'^workd_http_requests_total\{route="worker_pull",code="5xx"\} (\S+)$',
                  http("GET", url + "/metrics").text, re.M)
    return int(float(m.group(1))) if m else 0


def test_standby_forwards_and_takes_over(cluster):
    leader, standby = two_servers(cluster)
    # The standby answers every request, forwarding what only the leader can do.
    ids = [submit(standby.url, {"id": f"w{i}", "payload": i})["id"] for i in range(6)]
    r = http("GET", standby.url + "/readyz")
    assert r.json()["is_leader"] is False and r.json()["leader"] == leader.url, r.json()
    heartbeat(standby.url, "wk", capacity=10)
    started = pull(standby.url, "wk", max_jobs=2)
    assert len(started) == 2, started
    complete(standby.url, "wk", started[0], "done before the failover")

    term_before = http("GET", standby.url + "/cluster").json()["term"]
    leader.kill(signal.SIGKILL)
    new_url, took = wait_new_leader([standby.url], timeout=5)
    assert new_url == standby.url
    assert took < 5, f"the standby took {took:.1f}s to take over (bound 5s)"
    c = http("GET", standby.url + "/cluster").json()
    assert c["term"] > term_before, f"a new term must start: {c['term']} vs {term_before}"
    # Same open work: 3 pending + 1 running (its lease carries over).
    assert c["open_total"] == 5, f"open work after failover: {c}"

    # The surviving worker keeps going: its running attempt still completes.
    assert complete(standby.url, "wk", started[1], "done across the failover")["accepted"]
    rest = pull(standby.url, "wk", max_jobs=10)
    assert sorted(j["id"] for j in rest) == sorted(ids[2:]), rest
    for j in rest:
        complete(standby.url, "wk", j, "done after")
    counts = completions_by_id(cluster)
    assert counts == {i: 1 for i in ids}, f"every job completes exactly once: {counts}"


def test_lost_running_attempt_is_retried_after_failover(cluster):
    leader, standby = two_servers(cluster)
    submit(standby.url, {"id": "orphan", "payload": 1})
    heartbeat(standby.url, "dies", capacity=1)
    job = pull(standby.url, "dies")[0]
    leader.kill(signal.SIGKILL)
    wait_new_leader([standby.url], timeout=5)
    # The worker that held it never comes back: after the worker timeout the
    # new leader retries the work.
    again = pull(standby.url, "other", wait=15)
    assert [j["id"] for j in again] == ["orphan"] and again[0]["attempt"] == 2, again
    assert complete(standby.url, "dies", job, "late")["accepted"] is False
    complete(standby.url, "other", again[0], "ok")
    assert completions_by_id(cluster) == {"orphan": 1}


def test_submission_during_failover_is_delayed_not_failed(cluster):
    leader, standby = two_servers(cluster)
    statuses = []
    stop = threading.Event()

    def client():
        i = 0
        while not stop.is_set():
            r = http("POST", standby.url + "/work", {"id": f"c{i}", "payload": i}, JSON,
                     timeout=30)
            statuses.append((f"c{i}", r.status))
            i += 1
    t = threading.Thread(target=client)
    t.start()
    wait_until(lambda: len(statuses) >= 3, 10, what="the client to be submitting")
    leader.kill(signal.SIGKILL)
    wait_new_leader([standby.url], timeout=10)
    n = len(statuses)
    wait_until(lambda: len(statuses) >= n + 3, 30,
               what="submissions answered by the new leader")
    stop.set()
    t.join(30)
    bad = [s for s in statuses if s[1] != 202]
    assert statuses and not bad, f"submissions during failover must succeed: {bad[:5]}"
    accepted = {e["work_id"] for e in events_of(cluster, ["accepted"])}
    missing = [i for i, _ in statuses if i not in accepted]
    assert not missing, f"acknowledged but not in the log: {missing[:5]}"


def test_fenced_leader_appends_nothing(cluster):
    leader, standby = two_servers(cluster)
    submit(leader.url, {"id": "before", "payload": 1})
    pid = cluster.psql("SELECT pid FROM pg_stat_activity WHERE application_name = "
                       "'workd-manager' AND query ILIKE '%workd_log%' OR "
                       "(application_name = 'workd-manager' AND pid IN (SELECT pid FROM "
                       "pg_locks WHERE locktype = 'advisory' AND objid = 1 AND granted)) "
                       "LIMIT 1")
    assert pid, "the leader's session should be visible"
    leader.suspend()
    cluster.psql(f"SELECT pg_terminate_backend({pid})")
    new_url, _ = wait_new_leader([standby.url], timeout=10)
    before = len(events_of(cluster))
    new_term = http("GET", standby.url + "/cluster").json()["term"]
    leader.resume()
    # The old leader wakes up believing it leads; whatever it tries must fail.
    r = http("POST", leader.url + "/work", {"id": "after", "payload": 2}, JSON, timeout=30)
    assert r.status == 202, f"the old leader should step down and forward: {r.status} {r.text}"
    terms = {e["term"] for e in events_of(cluster) if e["seq"] > 0}
    old_terms_after = [e for e in events_of(cluster)[before:] if e["term"] != new_term]
    assert not old_terms_after, f"the fenced leader appended: {old_terms_after}"
    assert max(terms) == new_term
    wait_until(lambda: http("GET", leader.url + "/readyz").json().get("is_leader") is False, 10,
               what="the old leader to step down")
    assert "stepping down" in leader.log_text(), "the old leader should log that it stepped down"


def test_answers_wait_for_their_commit(cluster):
    """No answer before its commit. With the event log locked by another
    session, the first submission's commit cannot finish: neither it nor the
    four sent behind it are answered; once the lock is released, all five
    are, and all five are in the log."""
    s = cluster.start_server("a")
    wait_leader(s.url)
    submit(s.url, {"payload": "warm"})  # the statements are prepared
    locker = subprocess.Popen(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                               "-d", cluster.db_url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        locker.stdin.write("BEGIN; LOCK TABLE workd_log IN SHARE MODE; SELECT 'locked';\n")
        locker.stdin.flush()
        assert locker.stdout.readline().strip() == "locked", "the lock was not taken"
        answers = {}

        def post(i):
            answers[i] = http("POST", s.url + "/work", {"payload": i}, JSON, timeout=60)

        threads = [threading.Thread(target=post, args=(0,))]
        threads[0].start()
        # Its commit on the way (blocked): the next four are sent behind it.
        wait_until(lambda: cluster.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'workd-manager' "
            "AND wait_event_type = 'Lock'") == "1", 10, what="the append to wait for the lock")
        for i in range(1, 5):
            threads.append(threading.Thread(target=post, args=(i,)))
            threads[-1].start()
        time.sleep(1.5)  # a declared window: an answer before the commit would come here
        assert not answers, f"answered before their commit: {sorted(answers)}"
        locker.stdin.write("COMMIT;\n")
        locker.stdin.close()
        locker.wait(10)
    finally:
        locker.kill()
    for t in threads:
        t.join(30)
    bad = {i: r.status for i, r in answers.items() if r.status != 202}
    assert len(answers) == 5 and not bad, f"after the lock: {len(answers)} answers, not 202: {bad}"
    accepted = {e["work_id"] for e in events_of(cluster, ["accepted"])}
    missing = [i for i, r in answers.items() if r.json()["id"] not in accepted]
    assert not missing, f"answered 202 but not in the log: {missing}"


def test_fence_admits_only_the_session_of_the_newest_term(cluster):
    """workd_fence (migration 0010), asked by every append: true only in the
    session that opened the newest term, or for the statement opening a newer
    one while no session holds the leader lock."""
    leader, standby = two_servers(cluster)
    term = int(cluster.psql("SELECT term FROM workd_leader"))

    def fence(t, opening):
        return cluster.psql(f"SELECT workd_fence({t}, {opening})")

    # Another session, while the leader holds the lock: never.
    assert fence(term, "false") == "f", "a session that did not open the term wrote"
    assert fence(term + 1, "true") == "f", "a term opened while the leader holds the lock"
    leader.kill()
    standby.kill()
    leader.popen.wait(5)
    standby.popen.wait(5)
    wait_until(lambda: cluster.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                    "AND objid = 1 AND granted") == "0", 10,
               what="the leader lock to be released")
    # Nobody holds the lock: still only an opening of a newer term passes.
    assert fence(term, "false") == "f", "a new session passed as the leader of the term"
    assert fence(term - 1, "false") == "f", "an older term passed"
    assert fence(term, "true") == "f", "a term opened twice"
    assert fence(term + 1, "true") == "t", "the next term could not be opened"
    # Unchanged by all that: a server started now leads the next term.
    s = cluster.start_server("c")
    wait_until(lambda: int(cluster.psql("SELECT term FROM workd_leader")) == term + 1, 15,
               what="a new leader in the next term")
    submit(s.url, {"id": "fenced-after", "payload": 1})


def test_abandoned_forwarded_pull_gets_no_work(cluster):
    leader, standby = two_servers(cluster)
    abandoned_pull(standby.url, "ghost", leader_url=leader.url)
    # The standby notices within about a second and drops its forward,
    # answering it 503 client-gone (to nobody).
    wait_until(lambda: pull_5xx(standby.url) == 1, 10, what="the standby to drop its forward")
    work_id = submit(standby.url, {"payload": 1})["id"]
    time.sleep(0.5)  # a declared window: a handout to the gone pull would happen here
    w = get_work(standby.url, work_id)
    assert w["status"] == "pending", f"work went to a forwarded pull whose client had gone: {w}"


def test_results_stream_on_any_node(cluster):
    leader, standby = two_servers(cluster)
    with SSEClient(standby.url + "/results?after=0") as sse:
        ids = [submit(leader.url, {"payload": i})["id"] for i in range(3)]
        for j in pull(leader.url, "w", max_jobs=3):
            complete(leader.url, "w", j, j["payload"] * 2)
        sse.wait_count(3, timeout=10)
        assert sorted(e["data"]["id"] for e in sse.events) == sorted(ids)
    assert get_work(standby.url, ids[0])["status"] == "completed"


if __name__ == "__main__":
    run_tests(globals())
