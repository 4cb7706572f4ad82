#!/usr/bin/env python3
"""Self-check of tests/lib/harness.py that needs PostgreSQL but no workd binaries.

Run: python3 tests/integration/test_harness_selfcheck.py [-k NAME]
"""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from harness import SSEClient, http, run_tests, wait_until  # noqa: E402


def test_psql_and_restart(cluster):
    assert cluster.db_url.startswith("postgresql://postgres@127.0.0.1:")
    assert cluster.db_url.endswith("/workd")
    assert cluster.psql("SELECT 1") == "1"
    cluster.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
    before = cluster.db_url
    cluster.pg_restart()
    assert cluster.db_url == before, "restart must keep the port"
    assert cluster.psql("SELECT 1") == "1"
    assert cluster.psql("SELECT v FROM t") == "7", "data must survive a restart"
    assert cluster.psql("SHOW fsync") == "on"
    assert cluster.psql("SHOW max_connections") == "300"
    try:
        cluster.psql("SELECT * FROM no_such_table")
    except RuntimeError as e:
        assert "no_such_table" in str(e)
    else:
        raise AssertionError("psql error was not raised")


def test_proc_control(cluster):
    p = cluster.start_process("sleeper", ["sh", "-c", "echo hello; exec sleep 60"])
    wait_until(lambda: "hello" in p.log_text(), 5, what="sleeper output")
    p.suspend()
    p.resume()
    assert p.alive()
    assert p.stop() == -signal.SIGTERM
    q = cluster.start_process("quitter", ["sh", "-c", "exit 3"])
    assert q.stopped_with(5) == 3
    r = cluster.start_process("victim", ["sleep", "60"])
    r.kill()
    assert r.returncode == -signal.SIGKILL
    cluster.start_process("left-running", ["sleep", "60"])  # close() must end it


def test_added_databases(cluster):
    """add_database: another PostgreSQL of the cluster, its own server and
    data; restart keeps its port and data; stop/start; its log in dump_logs."""
    url = cluster.add_database("pg2")
    assert url != cluster.db_url and url.startswith("postgresql://postgres@127.0.0.1:"), url
    assert cluster.database_url("pg2") == url
    cluster.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (2)", url=url)
    assert cluster.psql("SELECT count(*) FROM pg_tables WHERE tablename = 't'") == "0", \
        "the added database is another server, not the home one"
    cluster.db_restart("pg2")
    assert cluster.database_url("pg2") == url, "restart must keep the port"
    assert cluster.psql("SELECT v FROM t", url=url) == "2", "data must survive a restart"
    cluster.db_stop("pg2")
    try:
        cluster.psql("SELECT 1", url=url)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the stopped database still answered")
    assert cluster.psql("SELECT 1") == "1", "stopping pg2 must leave the home database up"
    cluster.db_start("pg2")
    assert cluster.psql("SELECT v FROM t", url=url) == "2"
    import io
    out = io.StringIO()
    cluster.dump_logs(out=out)
    assert "---- postgres.log of pg2" in out.getvalue(), out.getvalue()[-2000:]
    try:
        cluster.add_database("pg2")
    except ValueError:
        pass
    else:
        raise AssertionError("a second database of the same name was accepted")


def test_added_databases_destroyed_when_the_test_is_killed():
    """A test process SIGKILLed (a CTest timeout) leaves no PostgreSQL behind:
    the watchdog destroys the added databases as well as the first."""
    import subprocess
    import time
    lib = str(Path(__file__).resolve().parents[1] / "lib")
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; sys.path.insert(0, sys.argv[1]); import harness\n"
         "c = harness.Cluster().__enter__()\n"
         "u = c.add_database('pg2')\n"
         "print(c.tmp, c.pg_dir / 'data' / 'postmaster.pid',"
         " c.databases['pg2']['dir'] / 'data' / 'postmaster.pid', flush=True)\n"
         "time.sleep(120)\n", lib],
        stdout=subprocess.PIPE, text=True)
    try:
        tmp, *pidfiles = child.stdout.readline().split()
        pids = [int(Path(f).read_text().splitlines()[0]) for f in pidfiles]
    finally:
        child.kill()
        child.wait()

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, owned by the postgres user
            return False
        return False
    wait_until(lambda: all(gone(p) for p in pids) and not Path(tmp).exists(), 30,
               what=f"the watchdog to stop postmasters {pids} and remove {tmp}")


class _Handler(BaseHTTPRequestHandler):
    """POST echoes the request as JSON; GET serves a short SSE stream."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        out = json.dumps({"path": self.path, "body": json.loads(body),
                          "ctype": self.headers["Content-Type"]}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Custom", "yes")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        start = int(self.headers.get("Last-Event-ID") or 0)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [": hello\n\n"]
        for i in range(start + 1, start + 4):
            chunks.append(f"id: {i}\nevent: result\ndata: {{\"n\": {i}}}\n\n")
        chunks.append("id: 99\r\ndata: line one\r\ndata: line two\r\n\r\n")
        if self.path == "/chunked":  # HTTP/1.1 chunked, events split across chunks
            text = "".join(chunks)
            pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
            for c in pieces:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c.encode()))
                self.wfile.flush()
        else:
            for c in chunks:
                self.wfile.write(c.encode())
                self.wfile.flush()
        threading.Event().wait(30)  # keep the stream open until the client closes


def test_http_and_sse():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        r = http("POST", base + "/echo?x=1", {"a": [1, 2]})
        assert r.status == 201 and r.headers["x-CUSTOM"] == "yes"
        assert r.json() == {"path": "/echo?x=1", "body": {"a": [1, 2]},
                            "ctype": "application/json"}
        for path in ("/events", "/chunked"):
            with SSEClient(base + path, last_event_id=10) as sse:
                assert sse.status == 200
                ev = sse.wait_for(lambda e: e["id"] == "99", timeout=5)
                assert ev == {"id": "99", "event": "message", "data": "line one\nline two"}
                assert [e["data"]["n"] for e in sse.events[:3]] == [11, 12, 13]
                assert sse.events[0]["event"] == "result"
                assert sse.comments == 1 and sse.last_event_id == "99"
                assert len(sse.wait_count(4, timeout=1)) == 4
    finally:
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":
    run_tests(globals())
