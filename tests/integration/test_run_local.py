"""`make run` (scripts/run-local) stopped as a terminal stops it: SIGINT to its
whole process group while jobs run. The workers finish their jobs, report them
and deregister before the servers stop; every line reaches the terminal and the
logs; no work is left `running`. A second SIGINT stops everything at once.
The same through `2>&1 | tee run.log`, whose tee the Ctrl-C ends: nothing is
left running, PostgreSQL included. The demo workers take only the demo's
queue: a job on another queue waits for a worker of one's own, and README's
sample of the story matches what is printed. Each run lives in a temporary
WORKD_RUN_DIR, never in var/."""

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
    """scripts/run-local in a process group of its own, as a terminal's job;
    with tee, as `scripts/run-local 2>&1 | tee FILE` (the tee in the same
    job, so that a Ctrl-C ends it too)."""

    def __init__(self, tmp, tee=False, **env):
        self.dir = Path(tmp)
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.out_path = self.dir / "terminal.txt"
        e = {**os.environ, "WORKD_RUN_DIR": str(self.dir / "run"),
             "WORKD_PORTS": " ".join(map(str, self.ports)),
             "WORKD_BIN_DIR": str(harness.BIN_DIR), **env}
        argv = [str(RUN_LOCAL)]
        out = open(self.out_path, "wb")
        if tee:
            argv = ["bash", "-c", f'"{RUN_LOCAL}" 2>&1 | tee "{self.out_path}"']
            out = subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT,
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
                time.sleep(0.5)  # a declared delay: teardown, then Ctrl-C again (at once)
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        subprocess.run([str(PG_PRIVATE), "stop", str(self.dir / "run" / "pg")],
                       capture_output=True, timeout=60)


def leftovers(run):
    """What of the run is still up: its processes (named by its ports or its
    directory on their command line) and its PostgreSQL."""
    marks = [str(run.dir)] + [f"127.0.0.1:{p}" for p in run.ports]
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in marks):
            left.append(f"{proc.name}: {cmd.strip()}")
    st = subprocess.run([str(PG_PRIVATE), "status", str(run.dir / "run" / "pg")],
                        capture_output=True, timeout=60)
    if st.returncode == 0:
        left.append("PostgreSQL")
    return left


def line_pattern(line):
    """A regular expression for the log line as printed another time: any
    time stamp, demo work id and number."""
    parts = re.split(r"(\d{4}-\d\d-\d\dT\S+Z|demo-[0-9a-f]+-\d+|\d+)", line)
    pattern = ""
    for i, part in enumerate(parts):
        pattern += (re.escape(part) if i % 2 == 0
                    else r"\S+Z" if part.endswith("Z")
                    else r"demo-[0-9a-f]+-\d+" if part.startswith("demo-") else r"\d+")
    return "^" + pattern + "$"


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


def test_ctrl_c_through_a_closed_pipe_stops_everything():
    """`make run 2>&1 | tee run.log`: the Ctrl-C ends the tee too, so every
    later write of the cluster to the pipe fails. One Ctrl-C, or two, must
    still stop every process and PostgreSQL."""
    for presses in (1, 2):
        with tempfile.TemporaryDirectory(prefix="workd-run-local-") as tmp:
            run = RunLocal(tmp, tee=True, WORKD_DEMO_DELAY="3s", WORKD_INTERVAL="300ms")
            try:
                wait_until(lambda: "workd is running" in run.terminal, 60,
                           what="run-local to start the cluster")
                wait_until(lambda: running_jobs(run.log("worker-1")), 30,
                           what="a worker to be running a job")
                run.ctrl_c()
                if presses == 2:
                    wait_until(lambda: "run-local: stopping" in run.log("run-local"), 10,
                               what="the graceful stop to begin (in var/log/run-local.log)")
                    run.ctrl_c()
                rc = run.proc.wait(90)
                # The processes were signalled before the script ended: give
                # the last of them a moment to be gone.
                try:
                    wait_until(lambda: not leftovers(run), 15, interval=0.2, what="")
                except AssertionError:
                    pass
                left = leftovers(run)
                assert not left, f"left running after {presses} Ctrl-C through a closed " \
                    f"pipe:\n" + "\n".join(left)
            finally:
                run.close()
                for left in leftovers(run):  # a failed stop leaves nothing behind here
                    pid = left.split(":")[0]
                    if pid.isdigit():
                        os.kill(int(pid), signal.SIGKILL)
            assert rc in (0, 130), f"run-local through a closed pipe ended {rc}"
            log = run.log("run-local")
            assert "run-local: stopped" in log or presses == 2, \
                f"the stop's lines go to var/log/run-local.log when the terminal is gone:\n{log}"
            for i in (1, 2):
                if presses == 1:
                    assert "deregistered from" in run.log(f"worker-{i}"), \
                        f"worker-{i} did not stop gracefully:\n{run.log(f'worker-{i}')[-2000:]}"


def test_demo_workers_leave_other_queues_alone():
    """A job on a queue of one's own waits for a worker of one's own while the
    demo's jobs complete around it; README's story is what the terminal shows."""
    with tempfile.TemporaryDirectory(prefix="workd-run-local-") as tmp:
        run = RunLocal(tmp, WORKD_DEMO_DELAY="200ms", WORKD_INTERVAL="100ms")
        try:
            wait_until(lambda: "workd is running" in run.terminal, 60,
                       what="run-local to start the cluster")
            url = run.urls[0]
            r = http("POST", url + "/work", {"id": "mine", "queue": "py", "payload": 4})
            assert r.status == 202, r
            r = http("POST", url + "/work", {"id": "squared", "payload": 7})
            assert r.status == 202, r
            before = run.terminal.count("consumed result of demo-")
            wait_until(lambda: run.terminal.count("consumed result of demo-") >= before + 6, 60,
                       what="six more demo jobs to complete")
            r = http("GET", url + "/work/squared?wait=30")
            assert r.json()["status"] == "completed" and r.json()["result"] == "7 * 7 = 49", \
                f"work on the default queue is the demo's: {r.json()}"
            r = http("GET", url + "/work/mine")
            assert r.status == 200 and r.json()["status"] == "pending" \
                and not r.json().get("attempts"), \
                f"a demo worker took the job on queue 'py': {r.json()}"
            out = run.terminal
        finally:
            run.close()
    readme = (REPO_ROOT / "README.md").read_text()
    sample = re.search(r"their logs tell the story:\n\n```\n(.*?)\n```", readme, re.S)
    assert sample, "README.md's sample of make run's story is gone"
    for line in sample.group(1).splitlines():
        assert re.search(line_pattern(line), out, re.M), \
            f"README's sample line is not printed as shown: {line}\n{out[:3000]}"

if __name__ == "__main__":
    run_tests(globals())
