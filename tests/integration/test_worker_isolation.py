"""What a job can reach of the worker that runs it (issue 13.7, 13.8): a job
runs as the worker's user and could read its token in /proc/$PPID; a worker
running as PID 1 (a container without an init) must reap what jobs leave
behind. Real workers run real --exec jobs against a real server."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import Skip, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import submit, wait_status  # noqa: E402

CLIENT = "client-token-isolation-0001"
WORKER_ENV = "worker-token-from-the-env-0002"
WORKER_ARG = "worker-token-on-the-argv-0003"
TOKENS = f"client,admin:{CLIENT} worker:{WORKER_ENV} worker:{WORKER_ARG}"
AUTH = {"Authorization": f"Bearer {CLIENT}"}

# The job prints what it can read of its parent (the worker): its environment
# and its command line, NULs turned into spaces.
SNOOP = "tr '\\0' ' ' < /proc/$PPID/environ; echo; tr '\\0' ' ' < /proc/$PPID/cmdline"


def test_a_job_cannot_read_the_worker_token(cluster):
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    cluster.start_worker("w-env", s.url, ["--exec", SNOOP, "--queues", "q-env"],
                         env={"WORKD_TOKEN": WORKER_ENV})
    cluster.start_worker("w-arg", s.url, ["--exec", SNOOP, "--queues", "q-arg",
                                          "--token", WORKER_ARG])
    for queue, token in (("q-env", WORKER_ENV), ("q-arg", WORKER_ARG)):
        wid = submit(s.url, {"queue": queue, "payload": 1}, AUTH)["id"]
        w = wait_until(lambda: _finished(s.url, wid), 20, what=f"the snooping job on {queue}")
        assert w["status"] == "completed", f"the snooping job failed: {w}"
        seen = str(w.get("result"))
        assert "WORKD_SERVER" in seen or "--server" in seen, \
            f"the job should have read its parent's /proc entries: {seen[:300]}"
        at = seen.find(token)
        assert at < 0, (f"a job read the worker's token through /proc/$PPID ({queue}): "
                        f"...{seen[max(0, at - 40):at + len(token) + 10]}...")


def _finished(url, wid):
    r = http("GET", f"{url}/work/{wid}", headers=AUTH)
    body = r.json() if r.status == 200 else {}
    return body if body.get("status") in ("completed", "dead") else None


def children(pid):
    """[(pid, name, state letter)] of the processes whose parent is pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            status = Path(f"/proc/{d}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == str(pid):
            out.append((int(d), fields.get("Name", "").strip(), fields.get("State", "")[:1]))
    return out


def zombies_under(pid):
    """Pids of zombie processes whose parent is pid."""
    return [k for k, _name, state in children(pid) if state == "Z"]


def leftovers_running(pid):
    """What jobs left running under pid (the worker's own workd-* helpers aside)."""
    return [(k, name) for k, name, state in children(pid)
            if state != "Z" and not name.startswith("workd")]


def child_of(pid):
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(kids[0]) if kids else None


def test_a_worker_running_as_pid_1_reaps_what_jobs_leave(cluster):
    """In a container without an init the worker is PID 1: a job's background
    processes, killed with its process group or escaped from it (setsid), are
    re-parented to it when the job's shell exits, and must be reaped."""
    unshare = shutil.which("unshare")
    if not unshare or subprocess.run([unshare, "-pf", "--mount-proc", "true"],
                                     capture_output=True).returncode != 0:
        raise Skip("cannot make a PID namespace here (unshare -pf)")
    s = cluster.start_server("s1")
    wait_leader(s.url)
    job = ("sleep 30 >/dev/null 2>&1 & setsid sleep 1 >/dev/null 2>&1 & "
           "sh -c 'sleep 0.2' >/dev/null 2>&1 & echo done")
    argv = [unshare, "-pf", "--mount-proc", "--kill-child",
            str(cluster.bin_dir / "workd-worker"), "--server", s.url, "--id", "w-pid1",
            "--exec", job]
    proc = cluster.start_process("w-pid1", argv)
    worker = wait_until(lambda: child_of(proc.pid), 10, what="the worker in its PID namespace")
    ids = [submit(s.url, {"payload": i})["id"] for i in range(3)]
    for wid in ids:
        assert wait_status(s.url, wid, "completed")["result"] == "done"
    # Every leftover exits (killed, or its second runs out) and is left a zombie.
    wait_until(lambda: not leftovers_running(worker), 10, what="the jobs' leftovers to exit")
    try:
        wait_until(lambda: not zombies_under(worker), 5,
                   what="the zombies under the worker to be reaped")
    except AssertionError:
        raise AssertionError(f"zombies left under the worker (PID 1 of its namespace): "
                             f"{zombies_under(worker)}") from None


if __name__ == "__main__":
    run_tests(globals())
