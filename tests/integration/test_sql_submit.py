"""Transactional enqueue: work submitted in SQL (workd.submit) exists if and
only if the application's transaction commits, runs exactly as work submitted
over HTTP does, is idempotent by id, refuses bad input naming the argument,
needs no right but the workd_submitter role, and survives a leader killed
between the commit and its ingestion."""

import re
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, complete, completions_by_id, get_work, leader_of, pull,  # noqa: E402
                   sql_error, submit, wait_new_leader)


def accepted_count(cluster, wid):
    return int(cluster.psql(f"SELECT count(*) FROM workd_events WHERE type = 'accepted' "
                            f"AND work_id = '{wid}'"))


def test_commit_runs_rollback_never(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    cluster.psql("BEGIN; SELECT workd.submit('{\"n\": 1}', id => 'sql-1', queue => 'mail',"
                 " priority => 5, timeout => '30 seconds', max_attempts => 2); COMMIT;")
    cluster.psql("BEGIN; SELECT workd.submit('2', id => 'sql-rolled-back'); ROLLBACK;")
    generated = cluster.psql("SELECT workd.submit('3')")
    assert re.fullmatch(r"[0-9a-f-]{36}", generated), generated
    w = wait_until(lambda: http("GET", s.url + "/work/sql-1").status == 200 and
                   get_work(s.url, "sql-1"), 5, what="sql-1 taken into the log")
    assert (w["queue"], w["priority"], w["timeout_ms"], w["max_attempts"], w["payload"]) == \
        ("mail", 5, 30000, 2, {"n": 1}), w
    assert get_work(s.url, generated)["timeout_ms"] == 60000, "the server's default timeout"
    jobs = {j["id"]: j for j in pull(s.url, "w1", max_jobs=5, queues=["mail", "default"])}
    assert set(jobs) == {"sql-1", generated}, jobs
    for j in jobs.values():
        complete(s.url, "w1", j, "done")
    assert http("GET", s.url + "/work/sql-rolled-back").status == 404
    assert cluster.psql("SELECT count(*) FROM workd_inbox") == "0", "the inbox is emptied"
    assert completions_by_id(cluster) == {"sql-1": 1, generated: 1}


def test_idempotent_and_validated(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    for _ in range(2):
        cluster.psql("SELECT workd.submit('{\"a\": 1}', id => 'same')")
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_inbox") == "0", 5,
               what="the inbox emptied")
    assert accepted_count(cluster, "same") == 1
    again = submit(s.url, {"id": "same", "payload": {"a": 1}})
    assert again["created"] is False, again
    err = sql_error(cluster, "SELECT workd.submit('{\"a\": 2}', id => 'same')")
    assert "already exists with a different payload" in err, err
    for call, arg in (("workd.submit('1', queue => 'no spaces')", "queue"),
                      ("workd.submit('1', id => '..')", "id"),
                      ("workd.submit('1', priority => 2000000)", "priority"),
                      ("workd.submit('1', timeout => '8 days')", "timeout"),
                      ("workd.submit('1', max_attempts => 0)", "max_attempts"),
                      ("workd.submit('1', run_at => now() + interval '2 years')", "run_at"),
                      ("workd.submit(NULL)", "payload")):
        err = sql_error(cluster, f"SELECT {call}")
        assert f"'{arg}'" in err, f"{call}: the error does not name {arg}: {err}"
    # A payload submitted over HTTP first, then in SQL with another payload.
    submit(s.url, {"id": "http-first", "payload": 1})
    err = sql_error(cluster, "SELECT workd.submit('2', id => 'http-first')")
    assert "different payload" in err, err
    # What the server could not read back is refused in SQL as over HTTP; an
    # entry that got into the inbox before (schema 11) is refused when taken,
    # never run with a null payload.
    for big in ("[1, {\"x\": 12345678901234567890}]", "1.5e19", "-9223372036854775809"):
        err = sql_error(cluster, f"SELECT workd.submit('{big}')")
        assert "payload_numbers_within_64_bits" in err, f"{big}: {err}"
    cluster.psql("SELECT workd.submit('[9223372036854775807, -9223372036854775808, 0.5]',"
                 " id => 'edge')")
    w = wait_until(lambda: http("GET", s.url + "/work/edge").status == 200 and
                   get_work(s.url, "edge"), 5, what="edge taken into the log")
    assert w["payload"] == [9223372036854775807, -9223372036854775808, 0.5], w
    cluster.psql("ALTER TABLE workd_inbox DROP CONSTRAINT workd_inbox_payload_numbers_within_64_bits;"
                 " INSERT INTO workd_inbox (id, queue, priority, payload)"
                 " VALUES ('too-big', 'default', 0, '{\"n\": 1e30}')")
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_inbox") == "0", 5,
               what="the unreadable entry taken out of the inbox")
    assert http("GET", s.url + "/work/too-big").status == 404, "run with a lost payload"
    assert "cannot read back" in s.log_text(), "the refusal is not logged"


def test_submitter_role_has_no_other_right(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    cluster.psql("CREATE ROLE app LOGIN; GRANT workd_submitter TO app")
    app_url = cluster.db_url.replace("postgres@", "app@", 1)
    assert cluster.psql("SELECT workd.submit('7', id => 'from-app')", app_url) == "from-app"
    wait_until(lambda: http("GET", s.url + "/work/from-app").status == 200, 5,
               what="the app's work accepted")
    for sql in ("SELECT * FROM workd_open", "SELECT * FROM workd_events",
                "INSERT INTO workd_inbox (id, queue, priority, payload) VALUES ('x', 'q', 0, '1')",
                "DELETE FROM workd_inbox"):
        err = sql_error(cluster, sql, app_url)
        assert "permission denied" in err, f"{sql}: {err}"
    cluster.psql("CREATE ROLE stranger LOGIN")
    err = sql_error(cluster, "SELECT workd.submit('1')",
                    cluster.db_url.replace("postgres@", "stranger@", 1))
    assert "permission denied" in err, err


def test_committed_survives_a_leader_kill(cluster):
    """Committed while the leader cannot take it, then the leader is killed:
    the next leader takes it from the inbox, and it runs once. A rolled-back
    submission never appears."""
    a = cluster.start_server("a", extra_args=["--election-interval", "100ms"])
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=["--election-interval", "100ms"])
    assert leader_of([a.url, b.url]) == a.url
    a.popen.send_signal(signal.SIGSTOP)
    cluster.psql("BEGIN; SELECT workd.submit('1', id => 'kept'); COMMIT;")
    cluster.psql("BEGIN; SELECT workd.submit('2', id => 'dropped'); ROLLBACK;")
    a.kill()
    wait_new_leader([b.url], not_url=a.url)
    wait_until(lambda: http("GET", b.url + "/work/kept").status == 200, 10,
               what="the new leader took the committed submission")
    for j in pull(b.url, "w1", max_jobs=5, wait=2):
        complete(b.url, "w1", j, "ok")
    assert completions_by_id(cluster) == {"kept": 1}
    assert accepted_count(cluster, "kept") == 1
    assert accepted_count(cluster, "dropped") == 0
    assert http("GET", b.url + "/work/dropped").status == 404


if __name__ == "__main__":
    run_tests(globals())
