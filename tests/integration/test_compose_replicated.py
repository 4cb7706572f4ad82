"""docker-compose.replicated.yml and its Patroni image (deploy/patroni): the
compose file through `docker-compose config`, the Patroni configuration through
`patroni --validate-config`, and the bootstrap script against a real
PostgreSQL, with workd running on the role it creates (no superuser)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, Skip, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import expect, submit  # noqa: E402

COMPOSE = REPO_ROOT / "docker-compose.replicated.yml"
PATRONI_DIR = REPO_ROOT / "deploy" / "patroni"


def compose_config():
    exe = shutil.which("docker-compose")
    if not exe:
        raise Skip("docker-compose is not installed")
    r = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True,
                       timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 0, f"docker-compose config failed:\n{r.stderr}"
    return yaml.safe_load(r.stdout)


def test_compose_file_is_valid():
    cfg = compose_config()
    services = cfg["services"]
    for name in ("etcd-1", "etcd-2", "etcd-3", "pg-1", "pg-2", "pg-3", "server-1", "server-2",
                 "lb", "worker"):
        assert name in services, f"{COMPOSE.name} lacks service {name}"
    for name in ("server-1", "server-2"):
        url = services[name]["environment"]["WORKD_DATABASE_URL"]
        assert "@pg-1:5432,pg-2:5432,pg-3:5432/workd" in url, f"{name}: not every node: {url}"
        assert "target_session_attrs=read-write" in url, f"{name}: {url}"
    names = {services[f"pg-{i}"]["environment"]["PATRONI_NAME"] for i in (1, 2, 3)}
    assert names == {"pg-1", "pg-2", "pg-3"}, names
    etcd = " ".join(services["etcd-1"]["command"])
    assert "--initial-cluster=etcd-1=http://etcd-1:2380,etcd-2=" in etcd, etcd


def test_patroni_config_is_valid():
    patroni = shutil.which("patroni")
    if not patroni:
        raise Skip("patroni is not installed")
    cfg = yaml.safe_load((PATRONI_DIR / "patroni.yml").read_text())
    dcs = cfg["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True, dcs
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"], \
        f"Patroni needs loop_wait + 2 * retry_timeout <= ttl: {dcs}"
    env = {**os.environ, "PATRONI_NAME": "pg-1", "PATRONI_RESTAPI_CONNECT_ADDRESS": "pg-1:8008",
           "PATRONI_POSTGRESQL_CONNECT_ADDRESS": "pg-1:5432",
           "PATRONI_SUPERUSER_PASSWORD": "x", "PATRONI_REWIND_PASSWORD": "x",
           "PATRONI_REPLICATION_PASSWORD": "y"}
    r = subprocess.run([patroni, "--validate-config", str(PATRONI_DIR / "patroni.yml")],
                       capture_output=True, text=True, timeout=60, env=env)
    # etcd-1..3 exist inside the compose network only: that is the one
    # complaint allowed here.
    complaints = [ln for ln in (r.stdout + r.stderr).splitlines()
                  if ln.strip() and not ln.startswith("etcd3.hosts ")]
    assert not complaints, "patroni --validate-config:\n" + "\n".join(complaints)


def test_bootstrap_role_runs_workd(cluster):
    # The role and database the image's post_bootstrap creates, made on a
    # fresh database server; workd then runs as that role.
    cluster.psql("DROP DATABASE workd", url=cluster.db_url.replace("/workd", "/postgres"))
    env = {**os.environ, "WORKD_DB_PASSWORD": "pw-for-the-test"}
    with tempfile.TemporaryDirectory() as home:
        r = subprocess.run([str(PATRONI_DIR / "post-bootstrap.sh"),
                            cluster.db_url.replace("/workd", "/postgres")],
                           capture_output=True, text=True, timeout=60, env=env, cwd=home)
    assert r.returncode == 0, f"post-bootstrap.sh failed:\n{r.stderr}"
    owner = cluster.psql("SELECT pg_get_userbyid(datdba) FROM pg_database "
                         "WHERE datname = 'workd'")
    assert owner == "workd", owner
    role = cluster.psql("SELECT rolsuper, pg_has_role('workd', 'pg_monitor', 'MEMBER') "
                        "FROM pg_roles WHERE rolname = 'workd'")
    assert role == "f|t", f"workd must be a plain role with pg_monitor: {role}"
    superuser_url = cluster.db_url
    cluster.db_url = superuser_url.replace("postgres@", "workd:pw-for-the-test@")
    try:
        s = cluster.start_server("s1")
    finally:
        cluster.db_url = superuser_url
    wait_leader(s.url)
    submit(s.url, {"id": "as-workd", "payload": 1})

    def database():
        db = expect(http("GET", s.url + "/cluster"), 200, "GET /cluster").json()["database"]
        return db if db["checked_at"] else None
    db = wait_until(database, 10, what="a database check")
    assert db["sync_standbys"] == 0, f"pg_monitor shows replication states: {db}"
    # Without pg_monitor workd cannot see which standbys are synchronous: it says so.
    cluster.psql("REVOKE pg_monitor FROM workd")
    wait_until(lambda: (d := database()) and d["sync_standbys"] is None, 10,
               what="sync_standbys null without pg_monitor")


if __name__ == "__main__":
    run_tests(globals())
