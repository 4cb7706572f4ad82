"""The database tier as workd sees it: a multi-host URL finds the server that
takes writes, sessions whose server went away are replaced before use, GET
/cluster says what the database offers a 202, and commits stuck on a missing
synchronous standby are reported in the log and in /readyz."""

import os
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import PG_PRIVATE, free_port, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect, get_work, submit  # noqa: E402


def database_of(url):
    """The `database` object of GET /cluster once the server has checked once."""
    def checked():
        db = expect(http("GET", url + "/cluster"), 200, "GET /cluster").json()["database"]
        return db if db["checked_at"] else None
    return wait_until(checked, 10, what="a database check in GET /cluster")


def port_of(db_url):
    return int(db_url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def test_cluster_says_what_the_database_offers(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    db = database_of(s.url)
    port = port_of(cluster.db_url)
    assert db["reachable"] is True and db["role"] == "primary", db
    assert db["server"] == f"127.0.0.1:{port}", db
    assert db["synchronous_standby_names"] == "" and db["synchronous_commit"] == "on", db
    assert db["standbys"] == 0 and db["sync_standbys"] == 0, db
    assert db["durability"] == "local" and db["stalled"] is False, db
    assert db["version"].startswith("15") or db["version"][:2].isdigit(), db
    wait_until(lambda: "a 202 is on this server only" in s.log_text(), 5,
               what="the start-up log line on the database's durability")

    # Standbys named: a commit returns only once one of them has it.
    cluster.psql("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
    cluster.psql("SELECT pg_reload_conf()")
    db = wait_until(lambda: (d := database_of(s.url))["synchronous_standby_names"] == "ghost"
                    and d, 5, what="the new synchronous_standby_names in GET /cluster")
    assert db["durability"] == "replicated" and db["sync_standbys"] == 0, db
    wait_until(lambda: "synchronous_standby_names='ghost'" in s.log_text(), 5,
               what="the change of synchronous_standby_names in the log")
    cluster.psql("ALTER SYSTEM RESET synchronous_standby_names")
    cluster.psql("SELECT pg_reload_conf()")


def wait_until_commits_wait(cluster, timeout=15.0):
    """Return once a commit waits for a synchronous standby.

    pg_reload_conf() only signals: the checkpointer applies a new
    synchronous_standby_names a moment later, and commits made before that
    do not wait. A probe commit seen waiting on SyncRep shows the setting is
    in effect; it is then cancelled (it stays committed locally, as any
    cancelled wait does). The probe creates a temporary table because only
    a commit that wrote WAL besides its commit record waits for a standby."""
    waiting = ("SELECT pid FROM pg_stat_activity "
               "WHERE application_name = 'sync-probe' AND wait_event = 'SyncRep'")

    def probe_waits():
        probe = subprocess.Popen(
            ["psql", "-X", "-q", "-d", cluster.db_url, "-c", "CREATE TEMP TABLE sync_probe ()"],
            env={**os.environ, "PGAPPNAME": "sync-probe"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            pid = wait_until(lambda: cluster.psql(waiting) or probe.poll() is not None, timeout,
                             what="the probe commit to wait or end")
            if pid is True:
                return False  # it committed without waiting: the setting is not applied yet
            cluster.psql(f"SELECT pg_cancel_backend({pid})")
            probe.wait(10)
            return True
        finally:
            if probe.poll() is None:
                probe.kill()
    wait_until(probe_waits, timeout, interval=0,
               what="commits to wait for a synchronous standby")


def test_commit_stuck_on_a_missing_sync_standby_is_reported(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    submit(s.url, {"id": "before", "payload": 1})
    # A promoted standby left with the old primary's synchronous_standby_names:
    # every commit waits for a standby that will never connect.
    cluster.psql("ALTER SYSTEM SET synchronous_standby_names = 'old_standby'")
    cluster.psql("SELECT pg_reload_conf()")
    wait_until_commits_wait(cluster)
    answer = {}

    def stuck_submit():
        try:
            answer["r"] = http("POST", s.url + "/work", {"id": "stuck", "payload": 2}, JSON,
                               timeout=90)
        except OSError as e:
            answer["r"] = e
    t = threading.Thread(target=stuck_submit, daemon=True)
    t.start()

    def not_ready():
        r = http("GET", s.url + "/readyz")
        return r if r.status == 503 else None
    r = wait_until(not_ready, 15, interval=0.2,
                   what="/readyz to say commits wait for a synchronous standby")
    detail = r.json()["detail"]
    assert "synchronous standby and none is connected" in detail, detail
    assert "old_standby" in detail, detail
    assert "r" not in answer, f"the submission cannot have been committed: {answer}"
    wait_until(lambda: "commits have waited" in s.log_text(), 5,
               what="an error line in the server log about the waiting commits")

    # The operator (or the failover engine) clears the setting: the commit
    # completes, the 202 arrives and the node is ready again.
    cluster.psql("ALTER SYSTEM RESET synchronous_standby_names")
    cluster.psql("SELECT pg_reload_conf()")
    t.join(30)
    assert not t.is_alive(), "the submission still waits after the setting was cleared"
    assert getattr(answer["r"], "status", None) == 202, answer["r"]
    wait_until(lambda: http("GET", s.url + "/readyz").status == 200, 5, interval=0.2,
               what="/readyz back to 200")
    wait_until(lambda: "commits no longer wait" in s.log_text(), 5,
               what="the log saying commits flow again")
    assert get_work(s.url, "stuck")["id"] == "stuck"


def test_multi_host_url_finds_the_writable_server(cluster):
    # A URL listing a server that is down and one that is read-only (what a
    # standby is to libpq) before the primary, without target_session_attrs:
    # workd asks for a read-write session itself.
    ro_dir = cluster.tmp / "ro"
    ro_url = subprocess.run([str(PG_PRIVATE), "start", str(ro_dir)], capture_output=True,
                            text=True, check=True, timeout=180).stdout.strip()
    try:
        cluster.psql("ALTER SYSTEM SET default_transaction_read_only = on", url=ro_url)
        cluster.psql("SELECT pg_reload_conf()", url=ro_url)
        down, ro, rw = free_port(), port_of(ro_url), port_of(cluster.db_url)
        primary_url = cluster.db_url
        cluster.db_url = (f"postgresql://postgres@127.0.0.1:{down},127.0.0.1:{ro},"
                          f"127.0.0.1:{rw}/workd")
        try:
            s = cluster.start_server("s1")
        finally:
            cluster.db_url = primary_url
        wait_leader(s.url)
        submit(s.url, {"id": "multi", "payload": 3})
        assert get_work(s.url, "multi")["id"] == "multi"
        assert database_of(s.url)["server"] == f"127.0.0.1:{rw}"
        apps = set(cluster.psql("SELECT application_name FROM pg_stat_activity "
                                "WHERE application_name LIKE 'workd-%'").split())
        for want in ("workd-manager", "workd-listener", "workd-frontend", "workd-dbwatch"):
            assert want in apps, f"{want} should be connected to the primary: {apps}"
        on_ro = cluster.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name "
                             "LIKE 'workd-%'", url=ro_url)
        assert on_ro == "0", f"{on_ro} workd session(s) on the read-only server"
    finally:
        subprocess.run([str(PG_PRIVATE), "destroy", str(ro_dir)], capture_output=True,
                       timeout=120)


def test_read_sessions_are_replaced_before_use(cluster):
    s = cluster.start_server("s1", extra_args=["--db-pool-size", "3"])
    wait_leader(s.url)
    submit(s.url, {"id": "r1", "payload": 1})
    # Open every read session: concurrent reads spread over the pool threads.
    readers = [threading.Thread(target=lambda: [get_work(s.url, "r1") for _ in range(20)])
               for _ in range(6)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(30)
    n = cluster.psql("SELECT count(*) FROM pg_stat_activity "
                     "WHERE application_name = 'workd-frontend'")
    assert int(n) >= 2, f"expected the read pool's sessions to be open, found {n}"
    # Their server ends them while they are idle (a restart or a failover does).
    cluster.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name = 'workd-frontend'")
    wait_until(lambda: cluster.psql("SELECT count(*) FROM pg_stat_activity "
                                    "WHERE application_name = 'workd-frontend'") == "0", 5,
               what="the read sessions to be gone")
    statuses = [http("GET", s.url + "/work/r1").status for _ in range(12)]
    assert statuses == [200] * 12, f"reads after the sessions ended: {statuses}"


if __name__ == "__main__":
    run_tests(globals())
