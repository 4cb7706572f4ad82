"""`make run` (scripts/run-local) stopped as a terminal stops it: SIGINT to its
whole process group while jobs run. The workers finish their jobs, report them
and deregister before the servers stop; every line reaches the terminal and the
logs; no work is left `running`. A second SIGINT stops everything at once.
Each run lives in a temporary WORKD_RUN_DIR, never in var/."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import REPO_ROOT, free_port, http, run_tests, wait_until  # noqa: E402

RUN_LOCAL = REPO_ROOT / "scripts" / "run-local"
PG_PRIVATE = REPO_ROOT / "scripts" / "pg-private"


def ignore_nothing():
    # As from a terminal: the test runner may have been started with SIGINT
    # ignored, which a shell script could then not trap.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RunLocal:
    """scripts/run-local in a process group of its own, as a terminal's job."""

    def __init__(self, tmp, **env):
        self.dir = Path(tmp)
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.out_path = self.dir / "terminal.txt"
        e = {**os.environ, "WORKD_RUN_DIR": str(self.dir / "run"),
             "WORKD_PORTS": " ".join(map(str, self.ports)),
             "WORKD_BIN_DIR": str(harness.BIN_DIR), **env}
        self.proc = subprocess.Popen([str(RUN_LOCAL)], env=e, stdin=subprocess.DEVNULL,
                                     stdout=open(self.out_path, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=ignore_nothing)

    @property
    def terminal(self):
        return self.out_path.read_text(errors="replace")

    def log(self, name):
        p = self.dir / "run" / "log" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def ctrl_c(self):
        os.killpg(self.proc.pid, signal.SIGINT)

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                time.sleep(0.5)
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        subprocess.run([str(PG_PRIVATE), "stop", str(self.dir / "run" / "pg")],
                       capture_output=True, timeout=60)


def running_jobs(log):
    """Attempts a worker log says started and not (yet) completed."""
    started = set(re.findall(r"job (\S+ attempt \d+) started", log))
    ended = set(re.findall(r"job (\S+ attempt \d+) (?:completed|failed|given back)", log))
    return started - ended


def test_ctrl_c_finishes_running_jobs_then_stops_servers():
    with tempfile.TemporaryDirectory(prefix="workd-run-local-") as tmp:
        # Jobs of up to 3 s, submitted every ~300 ms: some run at the Ctrl-C.
        run = RunLocal(tmp, WORKD_DEMO_DELAY="3s", WORKD_INTERVAL="300ms")
        try:
            wait_until(lambda: "workd is running" in run.terminal, 60,
                       what="run-local to start the cluster")
            wait_until(lambda: all(len(running_jobs(run.log(f"worker-{i}"))) >= 1
                                   for i in (1, 2)), 60,
                       what="both workers to be running jobs")
            run.ctrl_c()
            rc = run.proc.wait(90)
        finally:
            run.close()
        out = run.terminal
        assert rc == 0, f"run-local exited {rc} after one Ctrl-C:\n{out[-3000:]}"
        for i in (1, 2):
            log = run.log(f"worker-{i}")
            assert "deregistered from" in log, f"worker-{i} did not deregister:\n{log[-2000:]}"
            assert not running_jobs(log), \
                f"worker-{i} left jobs without an outcome: {running_jobs(log)}\n{log[-2000:]}"
            assert "given back" not in log, f"worker-{i} gave jobs back:\n{log[-2000:]}"
            # Every line of the log reached the terminal too, the last ones included.
            for line in log.splitlines():
                assert line in out, f"worker-{i}'s line missing from the terminal: {line}"
        for name in ("server-1", "server-2", "producer", "consumer"):
            for line in run.log(name).splitlines():
                assert line in out, f"{name}'s line missing from the terminal: {line}"
        # Workers deregistered before any server began to stop.
        last_dereg = max(out.rfind(f"[worker-{i} worker] deregistered") for i in (1, 2))
        first_server_stop = min(i for i in (out.find("[server-1"), out.find("[server-2"))
                                if i >= 0)
        server_stops = [m.start() for m in re.finditer(r"\[server-\d[^\]]*\][^\n]*stopping", out)]
        assert server_stops and first_server_stop >= 0, f"no server stop in:\n{out[-3000:]}"
        assert last_dereg < min(server_stops), \
            f"a server stopped before the workers deregistered:\n{out[-4000:]}"
        assert "run-local: stopped" in out

        # Nothing is left running in the database: ask a server started on it.
        url = subprocess.run([str(PG_PRIVATE), "start", str(Path(tmp) / "run" / "pg")],
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        port = free_port()
        srv = subprocess.Popen([str(harness.BIN_DIR / "workd-server"), "--listen",
                                f"127.0.0.1:{port}", "--database-url", url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: http("GET", base + "/readyz", timeout=2).status == 200, 30,
                       what="a server on the stopped cluster's database", ignore=(OSError,))
            r = http("GET", base + "/work?status=running")
            assert r.status == 200, r
            assert r.json()["items"] == [], f"work left running: {r.json()['items']}"
        finally:
            srv.terminate()
            srv.wait(30)
            subprocess.run([str(PG_PRIVATE), "stop", str(Path(tmp) / "run" / "pg")],
                           capture_output=True, timeout=60)


def test_second_ctrl_c_stops_at_once():
    with tempfile.TemporaryDirectory(prefix="workd-run-local-") as tmp:
        run = RunLocal(tmp, WORKD_DEMO_DELAY="20s", WORKD_INTERVAL="200ms")
        try:
            wait_until(lambda: "workd is running" in run.terminal, 60,
                       what="run-local to start the cluster")
            wait_until(lambda: running_jobs(run.log("worker-1")), 30,
                       what="a worker to be running a job")
            run.ctrl_c()
            wait_until(lambda: "run-local: stopping" in run.terminal, 10,
                       what="the graceful stop to begin")
            t0 = time.monotonic()
            run.ctrl_c()
            rc = run.proc.wait(15)
            took = time.monotonic() - t0
        finally:
            run.close()
        assert rc == 130, f"a second Ctrl-C exits 130, not {rc}:\n{run.terminal[-2000:]}"
        assert took < 8, f"the second Ctrl-C took {took:.1f}s to stop everything"
        for url in run.urls:
            try:
                http("GET", url + "/healthz", timeout=1)
                raise AssertionError(f"{url} still answers after the second Ctrl-C")
            except OSError:
                pass


if __name__ == "__main__":
    run_tests(globals())
