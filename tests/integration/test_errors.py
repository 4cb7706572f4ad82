"""Every error of the API is problem+json with a clear message, and the limits
hold: bad input is refused and loses nothing."""

import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader  # noqa: E402
from workd import JSON, expect, submit  # noqa: E402


def problem(resp, status, what, detail_has=None):
    expect(resp, status, what)
    assert resp.headers.get("Content-Type") == "application/problem+json", \
        f"{what}: content type {resp.headers.get('Content-Type')}"
    p = resp.json()
    assert p["status"] == status and p["type"].startswith("https://") and p["title"], p
    if detail_has:
        assert detail_has in p["detail"], f"{what}: detail should mention {detail_has!r}: {p}"
    return p


def raw(url, data, headers=None, method="POST", path="/work"):
    return http(method, url + path, data, headers or JSON)


def test_bad_submissions(cluster):
    s = cluster.start_server("s1", extra_args=["--max-body", "4096", "--max-batch", "3",
                                               "--max-json-depth", "8"])
    wait_leader(s.url)
    u = s.url
    problem(raw(u, b"{not json"), 400, "malformed JSON", "not valid JSON")
    problem(raw(u, b""), 400, "empty body", "empty")
    problem(raw(u, {"id": "x"}), 400, "missing payload", "payload")
    problem(raw(u, {"payload": 1, "prio": 3}), 400, "unknown field", "prio")
    problem(raw(u, {"payload": 1, "priority": "high"}), 400, "wrong type", "priority")
    problem(raw(u, {"payload": 1, "max_attempts": 0}), 400, "max_attempts bound", "max_attempts")
    problem(raw(u, {"payload": 1, "timeout": -1}), 400, "negative timeout", "timeout")
    problem(raw(u, {"payload": 1, "queue": "a b"}), 400, "bad queue", "queue")
    problem(raw(u, {"payload": 1, "id": "has space"}), 400, "bad id", "id")
    problem(raw(u, {"payload": 1, "run_at": "tomorrow"}), 400, "bad run_at", "RFC 3339")
    problem(raw(u, {"payload": 1, "run_at": "2030-01-01T00:00:00Z", "delay": 5}), 400,
            "run_at and delay", "not both")
    problem(raw(u, [{"payload": i} for i in range(4)]), 413, "batch over the limit", "limit")
    problem(raw(u, []), 400, "empty batch", "empty")
    problem(raw(u, b'{"payload": "\xff\xfe"}'), 400, "invalid UTF-8")
    problem(raw(u, b"[" * 20 + b"]" * 20), 400, "deep nesting", "nested")
    problem(raw(u, {"payload": "x" * 5000}), 413, "body over the limit", "limit")
    problem(raw(u, b'{"payload": 1}', {"Content-Type": "text/plain"}), 415, "wrong content type",
            "application/json")
    problem(raw(u, {"payload": 1}, {**JSON, "Idempotency-Key": "bad key!"}), 400, "bad key")
    # Nothing of the above was accepted.
    assert cluster.psql("SELECT count(*) FROM workd_events WHERE type = 'accepted'") == "0"
    assert submit(u, {"payload": 1})["created"] is True, "a good request still works"


def test_messages_read_as_sentences(cluster):
    """Messages a user reads: a sentence about what they sent, not a system
    call's errno or a broken agreement."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    p = problem(http("PUT", s.url + "/queues/default", {"max_runing": 2}, JSON), 400,
                "unknown field of a queue update", "'max_runing'")
    assert p["detail"].startswith("the queue update has an unknown field 'max_runing'"), p
    body = {"cron": "0 3 * * *", "timezone": "Europe/Berlim", "work": {"payload": 1}}
    p = problem(http("PUT", s.url + "/schedules/nightly", body, JSON), 400, "unknown time zone",
                "'Europe/Berlim'")
    assert "No such file" not in p["detail"] and "IANA" in p["detail"], p


def test_routes_methods_and_lookups(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    u = s.url
    p = problem(http("PUT", u + "/work"), 405, "wrong method")
    r = http("PATCH", u + "/work/abc")
    problem(r, 405, "PATCH on a work item")
    assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "DELETE"}, r.headers
    problem(http("GET", u + "/nowhere"), 404, "unknown route")
    problem(http("GET", u + "/work/unknown-id"), 404, "unknown work", "unknown-id")
    problem(http("GET", u + "/work/unknown-id/events"), 404, "unknown work history")
    problem(http("GET", u + "/work/x?wait=soon"), 400, "bad wait", "wait")
    problem(http("GET", u + "/results", headers={"Last-Event-ID": "abc"}), 400, "bad Last-Event-ID")
    problem(http("GET", u + "/results?queue=no%20spaces"), 400, "bad queue filter")
    problem(http("POST", u + "/workers/w1/pull", {"max": 0}, JSON), 400, "pull max 0", "max")
    problem(http("POST", u + "/workers/w1/reports", {"reports": [{"id": "x"}]}, JSON), 400,
            "report without attempt", "attempt")
    problem(http("PUT", u + "/workers/w1", {"capacity": "lots"}, JSON), 400, "bad capacity")
    problem(http("POST", u + "/work/x/attempts/zero/complete", {}, JSON), 400, "bad attempt")
    assert p["detail"], p


def test_queue_full_is_429_with_retry_after(cluster):
    s = cluster.start_server("s1", extra_args=["--max-open", "2"])
    wait_leader(s.url)
    submit(s.url, {"id": "a", "payload": 1})
    submit(s.url, {"id": "b", "payload": 2})
    r = http("POST", s.url + "/work", {"payload": 3}, JSON)
    problem(r, 429, "queue full", "limit")
    assert int(r.headers["Retry-After"]) >= 1, r.headers
    # Resubmitting existing work is still acknowledged when the queue is full.
    assert submit(s.url, {"id": "a", "payload": 1})["created"] is False


def test_slow_and_oversized_clients_do_not_hurt_others(cluster):
    s = cluster.start_server("s1", extra_args=["--connection-timeout", "2s"])
    wait_leader(s.url)
    slow = socket.create_connection(("127.0.0.1", s.port))
    slow.sendall(b"POST /work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{")
    # Others are served meanwhile.
    assert submit(s.url, {"payload": 1})["created"]
    # A header section over the limit is refused, not buffered forever.
    r = http("GET", s.url + "/healthz", headers={"X-Big": "a" * 100000})
    assert r.status in (413, 431), f"oversized headers: {r.status}"
    # The slow client is cut off after the connection timeout.
    slow.settimeout(10)
    t0 = time.monotonic()
    data = slow.recv(100)
    assert time.monotonic() - t0 < 8 and not data.startswith(b"HTTP/1.1 2"), data
    slow.close()
    expect(http("GET", s.url + "/healthz"), 200, "still healthy")


def test_version(cluster):
    """`workd-server --version` and `workd-worker --version` print the
    project's version (CMakeLists.txt), even beside a bad setting."""
    import re
    import subprocess
    from harness import REPO_ROOT
    version = re.search(r"project\(workd VERSION (\S+)",
                        (REPO_ROOT / "CMakeLists.txt").read_text()).group(1)
    for exe in ("workd-server", "workd-worker"):
        for args in (["--version"], ["--version", "--bogus"]):
            r = subprocess.run([str(cluster.bin_dir / exe), *args], capture_output=True,
                               text=True, timeout=10)
            assert r.returncode == 0 and r.stdout == f"{exe} {version}\n", \
                f"{exe} {' '.join(args)}: exit {r.returncode}, {r.stdout!r} {r.stderr!r}"


def test_bad_configuration_is_a_clear_error(cluster):
    import subprocess
    exe = str(cluster.bin_dir / "workd-server")
    cases = [
        (["--database-url", cluster.db_url, "--max-body", "lots"], "--max-body"),
        (["--database-url", cluster.db_url, "--roles", "frontend,cook"], "--roles"),
        (["--database-url", cluster.db_url, "--election-interval", "fast"], "--election-interval"),
        (["--database-url", cluster.db_url, "--listen", "nowhere"], "--listen"),
        ([], "--database-url"),
        (["--bogus"], "--bogus"),
    ]
    for args, names in cases:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, f"{args}: exit {r.returncode}, stderr {r.stderr}"
        assert names in r.stderr, f"{args}: the error should name {names}: {r.stderr}"
    env_case = subprocess.run([exe, "--database-url", cluster.db_url], capture_output=True,
                              text=True, timeout=10, env={"WORKD_MAX_BATCH": "0", "PATH": "/usr/bin"})
    assert env_case.returncode == 2 and "WORKD_MAX_BATCH" in env_case.stderr, env_case.stderr
    h = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    assert h.returncode == 0 and "WORKD_DATABASE_URL" in h.stdout and "--listen" in h.stdout


if __name__ == "__main__":
    run_tests(globals())
