"""Bearer tokens with scopes: 401 without a valid token, 403 without the scope,
tokens forwarded to the leader, sent by the worker, never logged; and a loud
warning when the API is open."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect, leader_of  # noqa: E402

CLIENT = "client-token-0123456789"
WORKER = "worker-token-0123456789"
ADMIN = "admin-token-01234567890"
TOKENS = f"client:{CLIENT} worker:{WORKER} admin:{ADMIN}"


def bearer(tok):
    return {**JSON, "Authorization": f"Bearer {tok}"}


def test_scopes(cluster):
    # Tokens through the environment, as in production (flags show in `ps`).
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    u = s.url
    r = http("POST", u + "/work", {"payload": 1}, JSON)
    expect(r, 401, "submit without a token")
    assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), r.headers
    assert r.headers["Content-Type"] == "application/problem+json"
    expect(http("POST", u + "/work", {"payload": 1}, bearer("wrong-token-0123456789")), 401,
           "submit with an unknown token")
    r = expect(http("POST", u + "/work", {"payload": 1}, bearer(CLIENT)), 202, "client submits")
    work_id = r.json()["id"]
    expect(http("GET", f"{u}/work/{work_id}", headers=bearer(CLIENT)), 200, "client reads")
    expect(http("POST", u + "/workers/w/pull", {"max": 1}, bearer(CLIENT)), 403,
           "client on the worker API")
    expect(http("DELETE", f"{u}/work/{work_id}", headers=bearer(CLIENT)), 403, "client cancels")
    expect(http("GET", u + "/cluster", headers=bearer(WORKER)), 403, "worker reads the cluster")
    jobs = expect(http("POST", u + "/workers/w/pull", {"max": 1}, bearer(WORKER)), 200,
                  "worker pulls").json()["jobs"]
    assert [j["id"] for j in jobs] == [work_id], jobs
    expect(http("GET", u + "/cluster", headers=bearer(ADMIN)), 200, "admin reads the cluster")
    expect(http("POST", u + "/work", {"payload": 2}, bearer(ADMIN)), 202, "admin may submit")
    expect(http("GET", u + "/healthz"), 200, "health is open")
    expect(http("GET", u + "/readyz"), 200, "readiness is open")
    expect(http("GET", u + "/metrics"), 401, "metrics want a token")
    # EventSource cannot send headers: the token may come as ?access_token=.
    with SSEClient(f"{u}/results?access_token={CLIENT}") as sse:
        sse.connected.wait(5)
        assert sse.status == 200, sse.status
    assert http("GET", u + "/results").status == 401
    log = s.log_text()
    for tok in (CLIENT, WORKER, ADMIN):
        assert tok not in log, "a token appeared in the log"
    assert "authentication on: 3 token(s)" in log, log[-500:]


def test_forwarded_and_workers_with_tokens(cluster):
    a = cluster.start_server("a", env={"WORKD_TOKENS": TOKENS})
    wait_leader(a.url)
    b = cluster.start_server("b", env={"WORKD_TOKENS": TOKENS})
    wait_leader(b.url)
    standby = b.url if leader_of([a.url, b.url]) == a.url else a.url
    expect(http("POST", standby + "/work", {"payload": 1}, JSON), 401, "the standby checks too")
    r = expect(http("POST", standby + "/work", {"id": "fwd", "payload": 6}, bearer(CLIENT)), 202,
               "forwarded with the token")
    assert r.json()["id"] == "fwd"
    w = cluster.start_worker("w1", standby, ["--demo", "--demo-delay", "10ms"],
                             env={"WORKD_TOKEN": WORKER})
    wait_until(lambda: http("GET", f"{standby}/work/fwd", headers=bearer(CLIENT)).json()["status"]
               == "completed", 20, what="the worker, with its token, to do the work")
    assert WORKER not in w.log_text()
    # A worker without a token is refused and says so.
    bad = cluster.start_worker("w2", standby, ["--demo"])
    wait_until(lambda: "401" in bad.log_text() or "token" in bad.log_text().lower(), 15,
               what="the worker without a token to report the refusal")


def test_open_api_warns(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    assert "AUTHENTICATION IS OFF" in s.log_text(), "an open server must say so at start"


def test_bad_token_configuration(cluster):
    import subprocess
    exe = str(cluster.bin_dir / "workd-server")
    for tokens, why in (("client:short", "16"), ("reader:0123456789abcdef", "scope"),
                        ("0123456789abcdef", "SCOPES:TOKEN")):
        r = subprocess.run([exe, "--database-url", cluster.db_url, "--listen", "127.0.0.1:1",
                            "--tokens", tokens], capture_output=True, text=True, timeout=20)
        assert r.returncode != 0 and why in r.stderr, f"{tokens}: {r.returncode} {r.stderr}"
        assert "0123456789abcdef" not in r.stderr, "a token appeared in an error message"


if __name__ == "__main__":
    run_tests(globals())
