"""The database side: migrations apply once (also when run twice or by several
processes at once), the event table refuses rewrites, and a restarted
PostgreSQL loses no accepted work."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, complete, completions_by_id, get_work, pull, submit  # noqa: E402


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
    assert versions == ",".join(str(v) for v in range(1, len(MIGRATIONS) + 1)), versions


def test_concurrent_migrations_apply_once(cluster):
    procs = [migrate(cluster) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for m in MIGRATIONS:
        applied = sum(o.count(f"applied migration {m}") for o in outs)
        assert applied == 1, f"exactly one process applies {m}, got {applied}: {outs}"
    assert cluster.psql("SELECT count(*) FROM workd_migrations") == str(len(MIGRATIONS))


def test_event_table_is_append_only(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    submit(s.url, {"payload": 1, "id": "x"})
    for sql in ("UPDATE workd_events SET type = 'completed'",
                "DELETE FROM workd_events",
                "TRUNCATE workd_events"):
        try:
            cluster.psql(sql)
        except RuntimeError as e:
            assert "append-only" in str(e), f"{sql}: unexpected error {e}"
        else:
            raise AssertionError(f"the database accepted: {sql}")
    # Only the leader's session may append; any other session is fenced by the
    # unique seq and the accepted-id index.
    try:
        cluster.psql("INSERT INTO workd_events (seq, term, at, type, version, work_id, data) "
                     "VALUES (999, 1, now(), 'accepted', 1, 'x', '{}')")
    except RuntimeError as e:
        assert "workd_events_accepted_id" in str(e) or "duplicate" in str(e), e
    else:
        raise AssertionError("a second acceptance of id 'x' was stored")


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


if __name__ == "__main__":
    run_tests(globals())
