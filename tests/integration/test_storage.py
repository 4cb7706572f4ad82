"""The database side: migrations apply once (also when run twice or by several
processes at once), the event table refuses rewrites, a restarted PostgreSQL
loses no accepted work, and what PostgreSQL says beside an answer (NOTICE)
goes through workd's log, so `--log-format json` stays one object per line."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, complete, completions_by_id, expect, get_work, pull,  # noqa: E402
                   refused_as_history, report, submit)


MIGRATIONS = sorted(p.name for p in (REPO_ROOT / "migrations").glob("*.sql"))


def migrate(cluster):
    return subprocess.Popen([str(cluster.bin_dir / "workd-server"), "migrate", "--database-url",
                             cluster.db_url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_migrations_apply_once(cluster):
    first = migrate(cluster)
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 0, out
    assert "applied migration 0001" in out, out
    again = migrate(cluster)
    out, _ = again.communicate(timeout=30)
    assert again.returncode == 0 and "applied migration" not in out, out
    versions = cluster.psql("SELECT string_agg(version::text, ',' ORDER BY version) "
                            "FROM workd_migrations")
    # Every file's version, once (numbers may have gaps: each change of the
    # schema takes the number it was given).
    assert versions == ",".join(str(int(m[:4])) for m in MIGRATIONS), versions


def test_concurrent_migrations_apply_once(cluster):
    procs = [migrate(cluster) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for m in MIGRATIONS:
        applied = sum(o.count(f"applied migration {m}") for o in outs)
        assert applied == 1, f"exactly one process applies {m}, got {applied}: {outs}"
    assert cluster.psql("SELECT count(*) FROM workd_migrations") == str(len(MIGRATIONS))


def test_history_is_append_only(cluster):
    """Within the retention window no record of the log, no finished work row
    and no progress report's row can be changed or deleted, through the parent
    tables or any part."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    submit(s.url, {"payload": 1, "id": "x"})
    submit(s.url, {"payload": 2, "id": "y"})
    assert http("DELETE", s.url + "/work/y").status == 200
    # Parts made ahead of the clock are empty: an UPDATE of one changes no row,
    # and must be refused all the same.
    wait_until(lambda: int(cluster.psql("SELECT count(*) FROM workd_parts")) >= 3, 10,
               what="parts made ahead")
    parts = cluster.psql("SELECT string_agg(part::text, ' ') FROM workd_parts").split()
    assert parts, "no parts"
    change = {"workd_log": "events = ''", "workd_done": "status = status",
              "workd_progress": "seq = seq"}
    for table, what in change.items():
        for t in [table] + [f"{table}_p{p}" for p in parts]:
            refused_as_history(cluster, f"UPDATE {t} SET {what}")
            refused_as_history(cluster, f"DELETE FROM {t}")
            refused_as_history(cluster, f"TRUNCATE {t}")
    assert cluster.psql("SELECT count(*) FROM workd_events WHERE work_id IN ('x', 'y')") == "3"
    assert cluster.psql("SELECT status FROM workd_done WHERE id = 'y'") == "cancelled"


def test_upgrade_from_schema_3(cluster):
    """A database written by schema 3 (one workd_work table, an unpartitioned
    log) upgrades in place with `workd-server migrate` and loses nothing: open
    work runs, dead work can be retried, finished work is readable, its id is
    still idempotent and its result is still in the stream."""
    cluster.psql("CREATE TABLE workd_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                 " applied_at timestamptz NOT NULL DEFAULT now())")
    for m in MIGRATIONS[:3]:
        r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", cluster.db_url,
                            "-1", "-f", str(REPO_ROOT / "migrations" / m)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        cluster.psql(f"INSERT INTO workd_migrations (version, name) VALUES ({int(m[:4])}, '{m}')")
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", cluster.db_url, "-1",
                        "-f", str(REPO_ROOT / "tests" / "fixtures" / "schema3.sql")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    up = migrate(cluster)
    out, _ = up.communicate(timeout=60)
    assert up.returncode == 0 and "applied migration 0004" in out, out
    assert cluster.psql("SELECT count(*) FROM workd_events") == "13", "events lost in the upgrade"

    s = cluster.start_server("s1", extra_args=["--lease-grace", "0"])
    wait_leader(s.url)
    assert get_work(s.url, "old-done")["result"] == "one"
    assert get_work(s.url, "old-cancelled")["status"] == "cancelled"
    assert get_work(s.url, "old-dead")["status"] == "dead"
    again = submit(s.url, {"id": "old-done", "payload": {"n": 1}})
    assert again["created"] is False and again["status"] == "completed", again
    conflict = http("POST", s.url + "/work", {"id": "old-done", "payload": 2}, JSON)
    assert conflict.status == 409, conflict
    # The running attempt's deadline passed long ago: the new leader retries it.
    wait_until(lambda: get_work(s.url, "old-running")["status"] == "pending", 15,
               what="old-running retried")
    assert http("POST", s.url + "/work/old-dead/retry").status == 200
    done = set()
    for _ in range(20):
        for j in pull(s.url, "w1", max_jobs=5, wait=1):
            complete(s.url, "w1", j, "after upgrade")
            done.add(j["id"])
        if done >= {"old-pending", "old-running", "old-dead"}:
            break
    assert done == {"old-pending", "old-running", "old-dead"}, done
    counts = completions_by_id(cluster)
    assert counts == {"old-done": 1, "old-pending": 1, "old-running": 1, "old-dead": 1}, counts
    listed = http("GET", s.url + "/work?limit=10").json()["items"]
    assert {w["id"] for w in listed} == {"old-done", "old-cancelled", "old-dead", "old-pending",
                                         "old-running"}, listed
    with SSEClient(s.url + "/results?after=0") as sse:
        got = sse.wait_count(6, timeout=10)
    first = {(e["data"]["id"], e["data"]["status"], e["data"]["queue"]) for e in got}
    assert ("old-done", "completed", "q1") in first and \
        ("old-cancelled", "cancelled", "q2") in first and ("old-dead", "dead", "q1") in first, got


def test_retention_drops_whole_parts(cluster):
    """Finished work and its events go a whole part at a time once older than
    --retain; open work (however old) and dead work stay; idempotency holds
    within the window."""
    s = cluster.start_server("s1", extra_args=["--retain", "3s", "--backoff-base", "0"])
    wait_leader(s.url)
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    submit(s.url, {"id": "far", "payload": 0, "run_at": later})
    submit(s.url, {"id": "doomed", "payload": 0, "max_attempts": 1})
    submit(s.url, {"id": "early", "payload": 1})
    for j in pull(s.url, "w1", max_jobs=5):
        if j["id"] == "doomed":
            report(s.url, "w1", [{"id": j["id"], "attempt": j["attempt"], "outcome": "failed",
                                  "error": "no"}])
        else:
            complete(s.url, "w1", j, "ok")
    assert get_work(s.url, "early")["status"] == "completed"
    first_parts = cluster.psql("SELECT min(part) FROM workd_parts")
    # Keep the leader writing for longer than the window, so that parts turn over.
    deadline = time.time() + 9
    n = 0
    while time.time() < deadline:
        submit(s.url, {"id": f"t{n}", "payload": n})
        for j in pull(s.url, "w1", max_jobs=5):
            complete(s.url, "w1", j, "ok")
        n += 1
        time.sleep(0.05)  # a declared pace: the load runs for the 9 s above
    wait_until(lambda: http("GET", s.url + "/work/early").status == 404, 10,
               what="early work dropped with its part")
    assert cluster.psql("SELECT count(*) FROM workd_events WHERE work_id = 'early'") == "0"
    assert int(cluster.psql("SELECT min(part) FROM workd_parts")) > int(first_parts)
    assert int(cluster.psql("SELECT count(*) FROM workd_parts")) <= 8, "parts pile up"
    # The finished counts kept per part match the rows of the part (compared
    # in one snapshot, for the parts retention is not dropping at that moment).
    diff = cluster.psql("SELECT string_agg(format('%s: %s counted, %s kept', d.part, c.n, d.rows), "
                        "'; ') FROM (SELECT part, count(*) AS rows FROM workd_done GROUP BY part) d"
                        " JOIN (SELECT part, sum(n) AS n FROM workd_counts GROUP BY part) c"
                        " USING (part) WHERE c.n <> d.rows")
    assert diff == "", f"finished counts differ from the rows: {diff}"
    q = next(q for q in http("GET", s.url + "/queues").json()["queues"] if q["queue"] == "default")
    assert 0 < q["completed"] < n, f"/queues counts only what is kept: {q}"
    assert get_work(s.url, "far")["status"] == "scheduled", "open work was removed"
    assert get_work(s.url, "doomed")["status"] == "dead", "dead work was removed"
    recent = submit(s.url, {"id": f"t{n - 1}", "payload": n - 1})
    assert recent["created"] is False, "idempotency must hold within the window"
    fresh = submit(s.url, {"id": "early", "payload": 1})
    assert fresh["created"] is True, "an id past the window is new work again"
    metrics = http("GET", s.url + "/metrics").text
    for name in ("workd_storage_bytes", "workd_parts ", "workd_retention_last_run_timestamp_seconds",
                 "workd_parts_dropped_total"):
        assert name in metrics, f"/metrics lacks {name}"


def test_a_history_that_outlived_its_first_parts_pages_on(cluster):
    """Dead work waits for an operator however long, but its first events
    leave with their part: its events, read a page at a time, go on past the
    seqs whose records are gone instead of ending at them."""
    s = cluster.start_server("s1", extra_args=["--retain", "3s", "--backoff-base", "0"])
    wait_leader(s.url)
    submit(s.url, {"id": "doomed", "payload": 0, "max_attempts": 1})
    job = pull(s.url, "w1")[0]
    report(s.url, "w1", [{"id": job["id"], "attempt": job["attempt"], "outcome": "failed",
                          "error": "no"}])
    assert get_work(s.url, "doomed")["status"] == "dead"
    n = 0

    def first_events_gone():
        nonlocal n
        submit(s.url, {"id": f"t{n}", "payload": n})  # the leader moves on to new parts
        n += 1
        return cluster.psql("SELECT count(*) FROM workd_events WHERE work_id = 'doomed'") == "0"
    wait_until(first_events_gone, 30, what="the dead work's first events dropped with their part")
    assert http("POST", s.url + "/work/doomed/retry").status == 200
    got, after = [], 0
    for _ in range(20):
        page = expect(http("GET", f"{s.url}/work/doomed/events?limit=1&after={after}"), 200,
                      "a page of the dead work's events").json()
        got += page["events"]
        if not page["next_after"]:
            break
        assert page["next_after"] > after, page
        after = page["next_after"]
    assert [e["type"] for e in got] == ["retried"], \
        f"the pages ended before the events that are still kept: {got}"


def test_notices_go_through_the_log(cluster):
    """Migrations and parts made ahead of the clock run DDL that PostgreSQL
    answers with NOTICEs ("trigger ... does not exist, skipping"): each one is
    a line of workd's log (debug), never libpq's raw line on stderr."""
    s = cluster.start_server("s1", extra_args=["--retain", "3s", "--log-format", "json",
                                               "--log-level", "debug"])
    wait_leader(s.url)
    first = int(cluster.psql("SELECT max(part) FROM workd_parts"))
    wait_until(lambda: int(cluster.psql("SELECT max(part) FROM workd_parts")) >= first + 2, 30,
               what="two parts made ahead of the clock")

    def notices():
        lines = [ln for ln in s.log_path.read_text().splitlines()
                 if ln and not ln.startswith("==== harness")]
        for ln in lines:
            try:
                json.loads(ln)
            except ValueError:
                raise AssertionError(f"--log-format json printed a line that is not JSON: {ln}")
        return [json.loads(ln) for ln in lines if "does not exist, skipping" in ln]
    found = wait_until(notices, 10, what="PostgreSQL's notices in the log")
    assert all(n["level"] == "debug" and n["msg"].startswith("PostgreSQL NOTICE (")
               for n in found), f"a notice is a debug line of the log: {found}"


def _together(*calls):
    """Runs the calls at the same moment (so that they land in one manager
    round as often as possible) and returns their results in order."""
    barrier = threading.Barrier(len(calls))
    out = [None] * len(calls)

    def run(i, fn):
        barrier.wait()
        out[i] = fn()
    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_resubmit_in_the_round_that_finishes_work(cluster):
    """A resubmission that lands in the same manager round as the event that
    finishes the same id (cancel, completion) must be answered from what the
    round decided: acknowledged, never a second acceptance, never a step-down."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    for rnd in range(12):
        ids = [f"c{rnd}-{i}" for i in range(8)]
        for w in ids:
            submit(s.url, {"id": w, "payload": w, "run_at": later})
        calls = []
        for w in ids:
            calls.append(lambda w=w: http("DELETE", s.url + "/work/" + w).status)
            calls.append(lambda w=w: http("POST", s.url + "/work",
                                          {"id": w, "payload": w, "run_at": later}, JSON).status)
        statuses = _together(*calls)
        assert all(st in (200, 202, 409) for st in statuses), f"round {rnd}: {statuses}"
    for rnd in range(6):
        ids = [f"d{rnd}-{i}" for i in range(6)]
        for w in ids:
            submit(s.url, {"id": w, "payload": w})
        jobs = pull(s.url, "w1", max_jobs=len(ids))
        calls = []
        for j in jobs:
            calls.append(lambda j=j: complete(s.url, "w1", j, "ok"))
            calls.append(lambda j=j: http("POST", s.url + "/work",
                                          {"id": j["id"], "payload": j["payload"]}, JSON).status)
        _together(*calls)
    accepted = cluster.psql("SELECT count(*) FROM workd_events WHERE type = 'accepted' "
                            "GROUP BY work_id HAVING count(*) > 1")
    assert accepted == "", f"ids accepted twice: {accepted}"
    metrics = http("GET", s.url + "/metrics").text
    assert "workd_step_downs_total 0" in metrics, "the leader stepped down: " + \
        [ln for ln in metrics.splitlines() if ln.startswith("workd_step_downs_total")][0]
    assert s.alive() and http("GET", s.url + "/readyz").status == 200


def test_postgres_restart_loses_nothing(cluster):
    s = cluster.start_server("s1", extra_args=["--election-interval", "100ms"])
    wait_leader(s.url)
    ids = [submit(s.url, {"payload": i})["id"] for i in range(5)]
    job = pull(s.url, "w1")[0]
    cluster.pg_restart()
    # The server notices, steps down, and comes back as leader by itself.
    wait_until(lambda: http("GET", s.url + "/readyz").status == 200, 30, what="ready again")
    more = submit(s.url, {"payload": 99}, )["id"]
    for w in (ids + [more]):
        assert get_work(s.url, w)["status"] in ("pending", "running"), w
    complete(s.url, "w1", job, "after restart")
    for j in pull(s.url, "w1", max_jobs=10):
        complete(s.url, "w1", j, "ok")
    counts = completions_by_id(cluster)
    assert counts == {w: 1 for w in ids + [more]}, counts


def _append_plans(cluster):
    """The plans auto_explain logged for the leader's append statement."""
    plans, cur = [], None
    for line in (cluster.pg_dir / "postgres.log").read_text(errors="replace").splitlines():
        if line.startswith("\t") and cur is not None:
            cur.append(line.strip())
            continue
        if cur and any(ln.startswith("Query Text: WITH lk AS") for ln in cur):
            plans.append(cur)
        cur = [] if "plan:" in line else None
    if cur and any(ln.startswith("Query Text: WITH lk AS") for ln in cur):
        plans.append(cur)
    return plans


def test_commit_plans_follow_the_commit_not_the_statistics(cluster):
    """workd_open's statistics swing with the open work: a table of 70 pages
    that held 10 live rows when it was last vacuumed, refilled since, still
    looks nearly empty to the planner. A plan made then that scans it whole
    and joins the commit's rows by filter costs (open rows x commit rows): a
    commit of 2,000 took seconds, and the leader stalled for 30-50 s in soaks.
    Every append plan, made under such statistics, must reach workd_open by
    key only."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    cluster.psql("ALTER TABLE workd_open SET (autovacuum_enabled = false)")  # the stats stay
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    for k in range(3):  # 10 rows kept, spread over the pages of 3,000
        items = [{"id": f"p{k}-{i}", "payload": i, "run_at": later,
                  "queue": "keep" if (k * 1000 + i) % 300 == 0 else "parked"}
                 for i in range(1000)]
        expect(http("POST", s.url + "/work", items, JSON, timeout=60), 202, "bulk submit")
    while expect(http("POST", s.url + "/bulk/cancel", {"queue": "parked"}, JSON, timeout=60),
                 200, "bulk cancel").json().get("more"):
        pass
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_open") == "10", 20,
               what="the cancelled rows to leave workd_open")
    cluster.psql("VACUUM workd_open")
    pages, tuples = cluster.psql("SELECT relpages, reltuples FROM pg_class "
                                 "WHERE relname = 'workd_open'").split("|")
    assert int(pages) >= 30 and float(tuples) <= 20, (pages, tuples)
    cluster.psql("ALTER DATABASE workd SET session_preload_libraries = 'auto_explain'")
    cluster.psql("ALTER DATABASE workd SET auto_explain.log_min_duration = 0")
    # A new leader session (with auto_explain) plans every append shape anew.
    s.stop()
    s = cluster.restart_server(s)
    wait_leader(s.url)
    ids = []
    for k in range(2):
        items = [{"id": f"q{k}-{i}", "payload": i} for i in range(1000)]
        expect(http("POST", s.url + "/work", items, JSON, timeout=60), 202, "bulk submit")
        ids += [it["id"] for it in items]
    jobs = pull(s.url, "w1", max_jobs=2000)
    assert len(jobs) == 2000, len(jobs)
    for k in range(0, 2000, 1000):
        report(s.url, "w1", [{"id": j["id"], "attempt": j["attempt"], "outcome": "completed",
                              "result": 1} for j in jobs[k:k + 1000]])
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_open") == "10", 20,
               what="the finished rows to leave workd_open")
    # No statement is compiled: JIT costs ~250 ms a run, and the leader's
    # disabled join methods inflate the costs that would trigger it.
    assert "JIT:" not in (cluster.pg_dir / "postgres.log").read_text(errors="replace")
    plans = _append_plans(cluster)
    assert any("Update on workd_open w" in " ".join(p) for p in plans), "no plan of an update"
    assert any("Delete on workd_open g" in " ".join(p) for p in plans), "no plan of a delete"
    for plan in plans:
        body = [ln for ln in plan if not ln.startswith("Query Text:")]
        text = "\n".join(body)
        assert "Join Filter" not in text, text
        for i, ln in enumerate(body):
            node = ln.removeprefix("->").strip()
            if " on workd_open " in node and not node.startswith(("Update", "Delete", "Insert")):
                detail = []
                for nxt in body[i + 1:]:
                    if nxt.startswith("->"):
                        break
                    detail.append(nxt)
                assert any("Cond:" in d for d in detail), f"workd_open read not by key:\n{text}"


def test_an_append_behind_a_failed_one_writes_nothing(cluster):
    """The leader sends the next round's append while the one before is being
    committed (pipeline mode), and PostgreSQL runs the statements after a
    failed one. So an append writes nothing unless the one before it is in the
    log: after a failed append, nothing of that term may follow it, and every
    202 is in the log."""
    s = cluster.start_server("s1", extra_args=["--election-interval", "100ms"])
    wait_leader(s.url)
    term = int(cluster.psql("SELECT max(term) FROM workd_events"))
    # One work id whose append fails once, slowly, so that others queue behind
    # it (the sequence is not rolled back with the append).
    cluster.psql("CREATE SEQUENCE test_boom_n")
    cluster.psql("CREATE FUNCTION test_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF nextval('test_boom_n') = 1 THEN "
                 "PERFORM pg_sleep(0.3); RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$")
    cluster.psql("CREATE TRIGGER test_boom BEFORE INSERT ON workd_log FOR EACH ROW "
                 "WHEN (NEW.events LIKE '%\"work_id\":\"boom\"%') EXECUTE FUNCTION test_boom()")
    stop = time.monotonic() + 1.5
    answers = {}

    def submitter(k):
        # Ids the server makes: a round of these needs no read of the database
        # first, so it is sent behind the append out.
        i = 0
        while time.monotonic() < stop:
            i += 1
            try:
                r = http("POST", s.url + "/work", {"payload": i}, JSON, timeout=10)
                answers[r.json()["id"] if r.status == 202 else f"{k}-{i}"] = r.status
            except OSError:
                answers[f"{k}-{i}"] = None
    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    wait_until(lambda: len(answers) >= 8, 10, what="submissions to flow")
    # Answered by the next term (the front-end retries a submission that met a
    # step-down), or refused: not lost either way.
    boom = http("POST", s.url + "/work", {"id": "boom", "payload": 0}, JSON, timeout=10).status
    for t in threads:
        t.join(20)
    assert boom in (202, 503), boom
    metrics = http("GET", s.url + "/metrics").text
    assert "workd_step_downs_total 1" in metrics, "the failed append did not end the term"
    behind = [ln for ln in metrics.splitlines() if ln.startswith("workd_appends_behind_total")]
    assert behind and int(behind[0].split()[1]) > 0, behind
    seqs = [int(x) for x in cluster.psql(f"SELECT seq FROM workd_events WHERE term = {term} "
                                         "ORDER BY seq").split()]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), \
        f"term {term} has a gap: an append after the failed one was committed"
    logged = set(cluster.psql("SELECT work_id FROM workd_events WHERE type = 'accepted'").split())
    lost = [w for w, st in answers.items() if st == 202 and w not in logged]
    assert not lost, f"answered 202, not in the log: {lost[:5]}"
    assert any(st == 202 for st in answers.values())


if __name__ == "__main__":
    run_tests(globals())
