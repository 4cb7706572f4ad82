"""Integration-test harness for workd (Python 3 standard library only).

A test module defines ``test_*`` functions that take a ``cluster`` argument and
ends with ``run_tests(globals())``::

    from harness import run_tests, http

    def test_submit(cluster):
        srv = cluster.start_server("s1")
        assert http("POST", srv.url + "/work", {"payload": 1}).status == 202

    if __name__ == "__main__":
        run_tests(globals())

Each test gets a fresh Cluster: a private PostgreSQL (scripts/pg-private) in a
temporary directory, plus every workd process the test starts, plus any other
private PostgreSQL the test adds (``cluster.add_database("pg2")``: a shard's
own database). All of it is torn down when the test ends, also on exceptions,
SIGINT/SIGTERM and at exit, and by a watchdog when the test process is killed.
Command line: ``--bin-dir DIR`` (default REPO/build/bin), ``-k SUBSTRING``,
``--keep`` (keep temporary directories and logs).
"""

import argparse
import atexit
import ctypes
import http.client as _httpclient
import inspect
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PG_PRIVATE = REPO_ROOT / "scripts" / "pg-private"
BIN_DIR = Path(os.environ.get("WORKD_BIN_DIR", REPO_ROOT / "build" / "bin"))
KEEP_TMP = os.environ.get("WORKD_TEST_KEEP", "") not in ("", "0")


class Skip(Exception):
    """Raise from a test to skip it (reported as SKIP, not a failure)."""


# ------------------------------------------------------------------ helpers

def promtool():
    """Prometheus's checker (scripts/install-promtool makes tools/promtool), or None."""
    exe = shutil.which("promtool") or str(REPO_ROOT / "tools" / "promtool" / "promtool")
    return exe if os.access(exe, os.X_OK) else None


def free_port():
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WaitTimeout(AssertionError):
    """Raised by wait_until when its time runs out. An AssertionError, so that
    a test fails with it; caught by name where running out of time is an
    answer to be reported (the chaos runs), not a failure."""


def _shown(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def wait_until(pred, timeout=10.0, interval=0.05, what="condition", ignore=(), until=None,
               each=None):
    """Poll ``pred()`` until its value is truthy (or ``until(value)`` is, when
    ``until`` is given), and return that value. Every test waits with this:
    a test never sleeps for a condition it can poll.

    Exceptions of the types in ``ignore`` count as "not yet". ``each``, when
    given, is called before every try (to run what is due meanwhile, or to
    raise at once when waiting is futile, as when a process died). ``what``
    names the condition: a string, or a function called at the timeout (to
    show the state then). Raises WaitTimeout (an AssertionError) when
    ``timeout`` seconds pass, showing the last value ``pred`` returned or
    the last exception it raised, unless that was None or a bare bool.
    """
    deadline = time.monotonic() + timeout
    last = None
    while True:
        if each is not None:
            each()
        try:
            last = pred()
            if until(last) if until is not None else last:
                return last
        except ignore as e:
            last = e
        if time.monotonic() >= deadline:
            name = what() if callable(what) else what
            seen = "" if last is None or isinstance(last, bool) else f" (last: {_shown(last)})"
            raise WaitTimeout(f"timed out after {timeout}s waiting for {name}{seen}")
        time.sleep(interval)


class Headers(dict):
    """Case-insensitive header map (keys stored lower-case)."""

    def __init__(self, items=()):
        super().__init__()
        for k, v in items:
            k = k.lower()
            self[k] = f"{self[k]}, {v}" if k in self else v

    def __getitem__(self, key):
        return super().__getitem__(key.lower())

    def __contains__(self, key):
        return super().__contains__(key.lower())

    def get(self, key, default=None):
        return super().get(key.lower(), default)


class Response:
    """An HTTP response: ``status``, ``headers`` (case-insensitive), ``body`` bytes."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<Response {self.status} {self.body[:200]!r}>"


def _connection(url, timeout):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"only http:// URLs are supported: {url}")
    conn = _httpclient.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return conn, path


def http(method, url, body=None, headers=None, timeout=30):
    """Send one request and return a Response. dict/list bodies are sent as JSON."""
    headers = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    conn, path = _connection(url, timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return Response(resp.status, Headers(resp.getheaders()), resp.read())
    finally:
        conn.close()


def _status(url, timeout=2.0):
    """Status code of GET url, or None if the request fails."""
    try:
        return http("GET", url, timeout=timeout).status
    except (OSError, _httpclient.HTTPException):
        return None


def wait_leader(url, timeout=15.0):
    """Wait until GET url/readyz answers 200 (a leader is known)."""
    wait_until(lambda: _status(url + "/readyz") == 200, timeout, what=f"{url}/readyz == 200")


class SSEClient:
    """Reads a text/event-stream in a background thread.

    ``events`` collects dicts {id, event, data} (data parsed as JSON when
    possible), except the stream's opening "ready" event; ``comments`` counts comment lines; ``status``/``headers`` are set
    once the response arrives; ``done`` is set when the stream ends.
    """

    def __init__(self, url, last_event_id=None, headers=None, connect_timeout=10.0):
        self.url = url
        self.events, self.comments = [], 0
        self.status, self.headers, self.error = None, None, None
        self.last_event_id = last_event_id
        self.connected, self.done = threading.Event(), threading.Event()
        self._cond = threading.Condition()
        self._closing, self._sock = False, None
        hdrs = {"Accept": "text/event-stream", **(headers or {})}
        if last_event_id is not None:
            hdrs["Last-Event-ID"] = str(last_event_id)
        self._conn, path = _connection(url, connect_timeout)
        self._thread = threading.Thread(target=self._run, args=(path, hdrs), daemon=True)
        self._thread.start()
        if not self.connected.wait(connect_timeout + 1):
            self.close()
            raise AssertionError(f"SSE {url}: no response within {connect_timeout}s")
        if self.error is not None and self.status is None:
            raise self.error

    def _run(self, path, hdrs):
        try:
            self._conn.request("GET", path, headers=hdrs)
            # Keep our own reference: http.client drops conn.sock once a
            # response that ends at connection close has started.
            self._sock = self._conn.sock
            resp = self._conn.getresponse()
            self.status, self.headers = resp.status, Headers(resp.getheaders())
            self._sock.settimeout(None)  # idle streams may be quiet a long time
            self.connected.set()
            if resp.status == 200:
                self._read(resp)
        except Exception as e:  # noqa: BLE001 - reported through .error
            if not self._closing:
                self.error = e
        finally:
            self.connected.set()
            self.done.set()
            with self._cond:
                self._cond.notify_all()

    def _read(self, resp):
        data, ev_id, ev_type = [], None, None
        while True:
            raw = resp.readline()
            if not raw:
                return
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data and ev_type == "ready":
                    # The stream's first block: where it starts (its id is
                    # already the last event id), not a result.
                    data, ev_type = [], None
                    continue
                if data:
                    text = "\n".join(data)
                    try:
                        parsed = json.loads(text)
                    except ValueError:
                        parsed = text
                    with self._cond:
                        self.events.append({"id": ev_id, "event": ev_type or "message",
                                            "data": parsed})
                        self._cond.notify_all()
                data, ev_type = [], None
                continue
            if line.startswith(":"):
                with self._cond:
                    self.comments += 1
                    self._cond.notify_all()
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                ev_type = value
            elif field == "id":
                ev_id = self.last_event_id = value

    def wait_for(self, pred, timeout=10.0):
        """Return the first event (old or new) for which ``pred(event)`` is true."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for ev in self.events[seen:]:
                    if pred(ev):
                        return ev
                seen = len(self.events)
                left = deadline - time.monotonic()
                if left <= 0 or self.done.is_set():
                    raise AssertionError(
                        f"SSE {self.url}: no matching event after {timeout}s "
                        f"({len(self.events)} events, done={self.done.is_set()}, "
                        f"error={self.error!r})")
                self._cond.wait(min(left, 0.5))

    def wait_count(self, n, timeout=10.0):
        """Wait until at least ``n`` events arrived; return a copy of the list."""
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.events) >= n or self.done.is_set(),
                                     timeout)
            if not ok or len(self.events) < n:
                raise AssertionError(f"SSE {self.url}: {len(self.events)} of {n} events "
                                     f"after {timeout}s")
            return list(self.events)

    def close(self):
        """Stop reading and close the connection."""
        self._closing = True
        sock = self._sock or self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()
        self._thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- processes

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent():
    """preexec_fn: SIGKILL the child if the harness dies (PR_SET_PDEATHSIG)."""
    _LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)


class Proc:
    """A process started by a Cluster; output goes to ``log_path``."""

    def __init__(self, name, argv, log_path, env=None, url=None, port=None):
        self.name, self.argv, self.log_path = name, list(argv), Path(log_path)
        self.env, self.url, self.port = env, url, port
        self.popen = None
        self.start()

    def start(self):
        """(Re)start the process with the same command line, appending to its log."""
        if self.alive():
            raise RuntimeError(f"{self.name} is still running")
        # Parent-death signals fire when the forking *thread* exits, so only
        # use them for processes started from the main thread.
        main = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            log.write(f"==== harness: starting {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
                preexec_fn=_die_with_parent if (main and _LIBC) else None)
        return self

    @property
    def pid(self):
        return self.popen.pid

    @property
    def returncode(self):
        """Exit status (negative: killed by that signal), or None while running."""
        return self.popen.poll()

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        """Send ``sig``; for SIGKILL also reap the process."""
        if self.alive():
            self.popen.send_signal(sig)
            if sig == signal.SIGKILL:
                self.popen.wait()

    def stop(self, timeout=10.0):
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit status."""
        if self.alive():
            self.resume()
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.wait()

    def stopped_with(self, timeout=10.0):
        """Wait up to ``timeout`` s for the process to exit by itself; return its status."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout}s") from None

    def suspend(self):
        self.kill(signal.SIGSTOP)

    def resume(self):
        self.kill(signal.SIGCONT)

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=40):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __repr__(self):
        return f"<Proc {self.name} pid={self.popen.pid} rc={self.returncode}>"


# ------------------------------------------------------------------ cluster

_live_clusters = []
_cleaning = False


def _on_signal(signum, _frame):
    """Turn SIGINT/SIGTERM/SIGHUP into exceptions so `with` blocks clean up."""
    if _cleaning:
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _install_signal_handlers():
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, _on_signal)


@atexit.register
def _close_all():
    for c in list(_live_clusters):
        c.close()


class Cluster:
    """A private PostgreSQL plus the workd processes of one test, and any
    other private PostgreSQL servers the test adds (add_database)."""

    def __init__(self, bin_dir=None, keep=None):
        self.bin_dir = Path(bin_dir or BIN_DIR)
        self.keep = KEEP_TMP if keep is None else keep
        self.tmp = self.pg_dir = self.db_url = self._watchdog = None
        self.procs = []
        # The added PostgreSQL servers: {name: {"dir": TMP/pg-NAME, "url": URL}}.
        self.databases = {}
        # What the nodes of this cluster prove forwarded requests with
        # (--cluster-secret); start_server passes it through the environment.
        self.secret = secrets.token_hex(16)

    def __enter__(self):
        _install_signal_handlers()
        self.tmp = Path(tempfile.mkdtemp(prefix="workd-test-"))
        os.chmod(self.tmp, 0o755)  # the postgres OS user must traverse it
        self.pg_dir = self.tmp / "pg"
        _live_clusters.append(self)
        # Watchdog for when this process is SIGKILLed (e.g. a CTest timeout):
        # it waits for EOF on a pipe only we hold, then destroys the cluster,
        # the PostgreSQL servers added later (TMP/pg-*) too. Workd processes
        # die with us through PR_SET_PDEATHSIG.
        script = ('cat >/dev/null; for d in "$1" "$3"/pg-*; do [ -d "$d" ] && '
                  '"$0" destroy "$d" >/dev/null 2>&1; done; [ -n "$2" ] || rm -rf "$3"')
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script, str(PG_PRIVATE), str(self.pg_dir), "1" if self.keep else "",
             str(self.tmp)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self.db_url = self._pg("start")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _pg(self, command, pg_dir=None):
        r = subprocess.run([str(PG_PRIVATE), command, str(pg_dir or self.pg_dir)],
                           capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"pg-private {command} {pg_dir or self.pg_dir} failed "
                               f"({r.returncode}):\n{r.stderr}")
        return r.stdout.strip()

    def pg_restart(self):
        """Fast-restart PostgreSQL on the same port."""
        self.db_url = self._pg("restart")

    def pg_stop(self):
        self._pg("stop")

    def pg_start(self):
        self.db_url = self._pg("start")

    def add_database(self, name):
        """Start another private PostgreSQL of this cluster (TMP/pg-NAME: its
        own server, port and database, as a shard's own database would be on
        a PostgreSQL of its own) and return its URL. It is destroyed with the
        cluster, and by the watchdog when the test process is killed."""
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name in self.databases:
            raise ValueError(f"add_database: {name!r} is taken or not a plain name")
        pg_dir = self.tmp / f"pg-{name}"
        self.databases[name] = {"dir": pg_dir, "url": None}
        self.databases[name]["url"] = self._pg("start", pg_dir)
        return self.databases[name]["url"]

    def _added(self, name):
        if name not in self.databases:
            raise KeyError(f"no database {name!r} was added (add_database)")
        return self.databases[name]

    def database_url(self, name):
        """The URL of the added database NAME (the same across its restarts)."""
        return self._added(name)["url"]

    def db_restart(self, name):
        """Fast-restart the added database NAME on the same port."""
        db = self._added(name)
        db["url"] = self._pg("restart", db["dir"])

    def db_stop(self, name):
        """Fast-stop the added database NAME."""
        self._pg("stop", self._added(name)["dir"])

    def db_start(self, name):
        """Start the added database NAME again (same port, same data)."""
        db = self._added(name)
        db["url"] = self._pg("start", db["dir"])

    def db_freeze(self, name):
        """Freeze the added database NAME (SIGSTOP to its postmaster and every
        backend): the kernel still answers TCP for it, so only deadlines
        notice. Returns the pids frozen; db_thaw(name) lets them go on."""
        pids = self._pg_pids(self._added(name)["dir"])
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self._added(name)["frozen"] = pids
        return pids

    def db_thaw(self, name):
        for pid in self._added(name).pop("frozen", []):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    @staticmethod
    def _pg_pids(pg_dir):
        """The postmaster of the private PostgreSQL in pg_dir and its children."""
        pm = int((Path(pg_dir) / "data" / "postmaster.pid").read_text().split()[0])
        kids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pm:
                    kids.append(int(d.name))
        return [pm, *kids]

    def psql(self, sql, url=None):
        """Run SQL with psql; return its unaligned, tuples-only output, stripped."""
        r = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                            "-d", url or self.db_url, "-c", sql],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
        if r.returncode != 0:
            raise RuntimeError(f"psql failed ({r.returncode}): {sql}\n{r.stderr.strip()}")
        return r.stdout.strip()

    def start_process(self, name, argv, env=None, **attrs):
        """Start any command as a managed Proc logging to TMP/NAME.log."""
        full_env = {**os.environ, **(env or {})}
        proc = Proc(name, argv, self.tmp / f"{name}.log", full_env, **attrs)
        self.procs.append(proc)
        return proc

    def start_server(self, name, port=0, extra_args=(), env=None, wait_ready=True,
                     timeout=15.0):
        """Start workd-server NAME on 127.0.0.1:PORT (0: a free port); see Proc.url."""
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [str(self.bin_dir / "workd-server"), "--listen", f"127.0.0.1:{port}",
                "--advertise-url", url, "--database-url", self.db_url, "--node-id", name,
                *extra_args]
        env = {"WORKD_CLUSTER_SECRET": self.secret, **(env or {})}
        proc = self.start_process(name, argv, env, url=url, port=port)
        if wait_ready:
            self.wait_healthy(proc, timeout)
        return proc

    def restart_server(self, proc, wait_ready=True, timeout=15.0):
        """Start a stopped/killed server again with the same arguments and port."""
        proc.start()
        if wait_ready:
            self.wait_healthy(proc, timeout)
        return proc

    @staticmethod
    def wait_healthy(proc, timeout=15.0):
        """Poll GET /healthz every 50 ms until 200; fail if the process exits."""
        def still_running():
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited with {proc.returncode} before "
                                   f"becoming healthy; log tail:\n{proc.log_tail()}")
        try:
            wait_until(lambda: _status(proc.url + "/healthz", timeout=1.0) == 200, timeout,
                       each=still_running)
        except WaitTimeout:
            raise RuntimeError(f"{proc.name} not healthy after {timeout}s; "
                               f"log tail:\n{proc.log_tail()}") from None

    def start_worker(self, name, server_url, args=(), env=None):
        """Start workd-worker NAME against ``server_url``."""
        argv = [str(self.bin_dir / "workd-worker"), "--server", server_url, "--id", name,
                *args]
        return self.start_process(name, argv, env)

    def dump_logs(self, lines=40, out=sys.stdout):
        """Print the tail of every process log (used when a test fails)."""
        for p in self.procs:
            print(f"---- {p.name} (pid {p.pid}, rc {p.returncode}) {p.log_path}", file=out)
            print(p.log_tail(lines), file=out)
        pgs = [("postgres.log", self.pg_dir)] if self.pg_dir else []
        pgs += [(f"postgres.log of {name}", db["dir"]) for name, db in self.databases.items()]
        for title, pg_dir in pgs:
            if (pg_dir / "postgres.log").exists():
                tail = (pg_dir / "postgres.log").read_text(errors="replace").splitlines()
                print(f"---- {title}", file=out)
                print("\n".join(tail[-lines:]), file=out)

    def close(self):
        """Kill all processes, destroy PostgreSQL, remove the temp dir. Idempotent."""
        global _cleaning
        if self not in _live_clusters:
            return
        _cleaning = True
        try:
            for p in self.procs:
                if p.alive():
                    p.resume()
                    p.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 3
            for p in self.procs:
                try:
                    p.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
            for pg_dir in [self.pg_dir, *(db["dir"] for db in self.databases.values())]:
                try:
                    self._pg("destroy", pg_dir)
                except Exception as e:  # noqa: BLE001 - cleanup must go on
                    print(f"harness: {e}", file=sys.stderr)
            if self.keep:
                print(f"harness: kept {self.tmp}", file=sys.stderr)
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)
            if self._watchdog is not None:
                self._watchdog.stdin.close()
                self._watchdog.wait(10)
        finally:
            _live_clusters.remove(self)
            _cleaning = False


# ------------------------------------------------------------------- runner

def run_tests(namespace, argv=None):
    """Run the ``test_*`` functions of ``namespace`` (a module's globals()) and exit.

    A test taking a ``cluster`` parameter gets a fresh Cluster. Exit status: 0 if
    all selected tests passed, 1 if any failed or none was selected, 77 if all
    were skipped.
    """
    global BIN_DIR, KEEP_TMP
    ap = argparse.ArgumentParser(description="workd integration tests")
    ap.add_argument("--bin-dir", default=str(BIN_DIR), help="directory of workd binaries")
    ap.add_argument("-k", dest="select", default="", help="run tests whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep temp dirs and logs")
    args = ap.parse_args(argv)
    BIN_DIR = Path(args.bin_dir).resolve()
    KEEP_TMP = KEEP_TMP or args.keep
    _install_signal_handlers()

    tests = [f for name, f in namespace.items()
             if name.startswith("test_") and callable(f) and args.select in name]
    tests.sort(key=lambda f: getattr(getattr(f, "__code__", None), "co_firstlineno", 0))
    if not tests:
        print(f"no tests selected (-k {args.select!r})")
        sys.exit(1)

    passed, failed, skipped = [], [], []
    for fn in tests:
        name, t0 = fn.__name__, time.monotonic()
        try:
            if "cluster" in inspect.signature(fn).parameters:
                with Cluster() as cluster:
                    try:
                        fn(cluster)
                    except (Exception, KeyboardInterrupt):
                        cluster.dump_logs()
                        raise
            else:
                fn()
        except (KeyboardInterrupt, SystemExit) as e:
            print(f"ABORT {name}: {type(e).__name__} {e}".rstrip(), flush=True)
            raise
        except Skip as e:
            skipped.append(name)
            print(f"SKIP {name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stdout)
        else:
            passed.append(name)
            print(f"PASS {name} ({time.monotonic() - t0:.2f}s)", flush=True)
        sys.stdout.flush()
    print(f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped"
          + (f": {', '.join(failed)}" if failed else ""), flush=True)
    if failed:
        sys.exit(1)
    sys.exit(77 if skipped and not passed else 0)
