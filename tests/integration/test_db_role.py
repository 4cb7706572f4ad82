"""workd under a database role named `workd`, as docker-compose.yml (and many
deployments) have it. PostgreSQL's default search_path starts with "$user":
once migration 5 made the schema `workd`, a new session of that role would
look for (and create) workd's tables there instead of in public, and a second
server node could not start. Found by the compose test."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect  # noqa: E402


def test_servers_under_a_role_named_workd(cluster):
    cluster.psql("CREATE ROLE workd LOGIN SUPERUSER")
    url = cluster.db_url.replace("postgresql://postgres@", "postgresql://workd@")
    assert url != cluster.db_url, cluster.db_url
    a = cluster.start_server("a", extra_args=["--database-url", url])
    wait_leader(a.url)
    # A second node (and a restarted first one) open new sessions after the
    # schema `workd` exists.
    b = cluster.start_server("b", extra_args=["--database-url", url])
    wait_leader(b.url)
    a.stop()
    cluster.restart_server(a)
    wait_leader(a.url)
    w = cluster.start_worker("w", b.url, ["--demo", "--demo-delay", "10ms"])
    expect(http("POST", a.url + "/work", {"id": "role-5", "payload": 5}, JSON), 202, "submit")
    wait_until(lambda: http("GET", b.url + "/work/role-5").json()["status"] == "completed", 20,
               what="the work to complete")
    tables = cluster.psql("SELECT string_agg(DISTINCT table_schema, ',') FROM "
                          "information_schema.tables WHERE table_name LIKE 'workd\\_%'")
    assert tables == "public", f"workd's tables are spread over schemas: {tables}"
    w.stop()


if __name__ == "__main__":
    run_tests(globals())
