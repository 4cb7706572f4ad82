"""Every shell block of README.md and docs/*.md works as printed.

Each ```sh block is preceded by a note that says how it runs:

    <!-- doc-test: cluster [workers=N] [script] [check=NAME] -->
    <!-- doc-test: database | bare [check=NAME] -->
    <!-- doc-test: skip: why -->

`cluster`: a private PostgreSQL under var/pg (as `make run` keeps it) and two
open server nodes on the block's ports 8080 and 8081, with N demo workers
(default 1). `database`: only PostgreSQL, its URL in WORKD_DATABASE_URL.
`bare`: nothing. A block without a note fails the test, so a new block is
either run here or says why not.

The block runs from a scratch directory that looks like a built clone
(scripts/, build/bin/), with 8080, 8081 and 8082 (a port for a program of the
block's own) replaced by free ports and nothing else changed. Commands run in order, as typed in terminals: one that finishes
must exit 0 and print no problem+json error; one that stays up (a server, a
worker, a demo client, `curl -N`, `workd tail` without `--count` or `--id`) is
left running, as in its own terminal, and must still be up at the end
(`curl -N .../work/ID/stream` must instead have ended after the work's end).
Variables set by a command carry over to the next ones. `script` runs the block as one script in its own terminal instead.
`check=NAME` runs check_NAME afterwards, with the processes still up."""

import json
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

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
NOTE = re.compile(r"<!-- doc-test: (.*?) -->\s*\n```(?:sh|bash|shell|console)\n(.*?)\n```", re.S)
FENCE = re.compile(r"^```(?:sh|bash|shell|console)\n", re.M)
# Commands that stay up, as in a terminal of their own.
DAEMON = re.compile(r"workd-server|workd-worker|workd-demo|curl (-\S+ )*-N"
                    r"|workd tail(?!.*--(?:count|id)\b)")
# A work's stream: it stays up until the work ends, then ends.
WORK_STREAM = re.compile(r"curl (-\S+ )*-N \S*/work/[^/\s]+/stream")
PG_PRIVATE = REPO_ROOT / "scripts" / "pg-private"


def blocks():
    """(file name, line, note, text) of every shell block; notes checked."""
    out = []
    for path in DOCS:
        text = path.read_text()
        noted = {m.start(2) for m in NOTE.finditer(text)}
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            assert m.end() in noted, \
                f"{path.name}:{line}: a shell block without a <!-- doc-test: ... --> note"
        for m in NOTE.finditer(text):
            line = text.count("\n", 0, m.start(2))
            out.append((path.name, line, m.group(1).strip(), m.group(2)))
    return out


def commands(block):
    """The block's commands: comment lines dropped, `\\` continuations and
    here-documents kept with their command."""
    lines, cmds, i = block.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cmd = line
        while cmd.endswith("\\") and i < len(lines):
            cmd += "\n" + lines[i]
            i += 1
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)", cmd)
        if heredoc:
            while i < len(lines):
                cmd += "\n" + lines[i]
                i += 1
                if lines[i - 1].strip() == heredoc.group(1):
                    break
        cmds.append(cmd)
    return cmds


def problem(output):
    """The problem+json error in a command's output, if any."""
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and '"status"' in line:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if isinstance(j, dict) and "type" in j and isinstance(j.get("status"), int) \
                    and j["status"] >= 400:
                return line
    return None


class Terminals:
    """The commands of one block, each in its own process group."""

    def __init__(self, where, env):
        self.where, self.env, self.up, self.n = where, env, [], 0

    def log(self, n):
        return self.where / f"terminal-{n}.log"

    def run(self, cmd):
        self.n += 1
        n, envfile = self.n, self.where / f"env-{self.n}"
        # set -a: what the command assigns is kept for the next commands.
        script = f"set -a\n{cmd}\nrc=$?\nenv -0 >{envfile}\nexit $rc\n"
        proc = subprocess.Popen(["bash", "-c", script], cwd=self.where, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=open(self.log(n), "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        daemon = DAEMON.search(cmd)
        try:
            proc.wait(2 if daemon else 120)
        except subprocess.TimeoutExpired:
            if not daemon:
                raise AssertionError(f"still running after 120 s: {cmd}") from None
            self.up.append((cmd, proc, n))
            listen = re.search(r"--listen \S+:(\d+)", cmd)
            if listen:
                wait_until(lambda: http("GET", f"http://127.0.0.1:{listen.group(1)}/healthz",
                                        timeout=1).status == 200, 30, ignore=(OSError,),
                           what=f"the server of `{cmd}` to answer")
            return
        out = self.log(n).read_text(errors="replace")
        assert proc.returncode == 0, f"`{cmd}` exited {proc.returncode}:\n{out}"
        err = problem(out)
        assert not err, f"`{cmd}` answered an error: {err}"
        if envfile.exists():
            for item in envfile.read_bytes().split(b"\0"):
                k, _, v = item.decode(errors="replace").partition("=")
                if k and k not in ("PWD", "OLDPWD", "SHLVL", "_"):
                    self.env[k] = v

    def script(self, block):
        self.n += 1
        proc = subprocess.Popen(["bash", "-c", block], cwd=self.where, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=open(self.log(self.n), "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.up.append(("(the block)", proc, self.n))

    def output(self, pattern):
        """The output of the terminal whose command matches pattern."""
        for cmd, _, n in self.up:
            if re.search(pattern, cmd):
                return self.log(n).read_text(errors="replace")
        raise AssertionError(f"no terminal runs {pattern}")

    def kill(self, pattern):
        """kill -9 the terminal whose command matches pattern (no longer up)."""
        for i, (cmd, proc, _) in enumerate(self.up):
            if re.search(pattern, cmd):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                del self.up[i]
                return
        raise AssertionError(f"no terminal runs {pattern}")

    def check_still_up(self):
        for cmd, proc, n in self.up:
            if WORK_STREAM.search(cmd):
                # A work's stream ends after the work's end, as documented.
                try:
                    wait_until(lambda: proc.poll() is not None, 30, what="")
                except AssertionError:
                    pass
                out = self.log(n).read_text(errors="replace")
                assert proc.returncode == 0, \
                    f"`{cmd}` must end after the work's end, not {proc.returncode}:\n{out[-2000:]}"
                last = re.findall(r"^event: (\w+)$", out, re.M)
                assert last and last[-1] in ("completed", "dead", "cancelled"), \
                    f"`{cmd}` ended on another event than the work's end:\n{out[-2000:]}"
                continue
            if proc.poll() is not None:
                out = self.log(n).read_text(errors="replace")
                raise AssertionError(f"`{cmd}` exited {proc.returncode}:\n{out[-3000:]}")
            if cmd.startswith("curl"):
                out = self.log(n).read_text(errors="replace")
                assert "data:" in out, f"`{cmd}` received no event:\n{out[-2000:]}"

    def close(self):
        for _, proc, _ in self.up:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


# ---- checks named by the notes, run while the block's processes are up ----

def count(text, pattern):
    return len(re.findall(pattern, text))


def check_roles(t, urls):
    """The story of "Each role on its own": the results flow, from both workers,
    and go on through node b when node a is killed."""
    def flowing(since):
        consumer = t.output(r"workd-demo consume")
        producer = t.output(r"workd-demo produce")
        return (count(consumer, "consumed result") - since[0] >= 3
                and count(producer, "accepted work") - since[1] >= 3)
    wait_until(lambda: flowing((0, 0)), 60, what="results to flow through the demo clients")
    wait_until(lambda: "completed: " in t.output(r"--exec"), 30,
               what="the --exec worker to complete a job of the producer")
    assert "failed" not in t.output(r"--exec"), \
        f"the --exec worker failed jobs:\n{t.output(r'--exec')[-2000:]}"

    t.kill(r"--node-id a")
    t0 = time.monotonic()
    since = (count(t.output("workd-demo consume"), "consumed result"),
             count(t.output("workd-demo produce"), "accepted work"))
    done = {w: count(t.output(w), "completed: ") for w in ("--demo", "--exec")}
    wait_until(lambda: flowing(since), 60,
               what="the producer and consumer to go on through node b after node a died")
    wait_until(lambda: all(count(t.output(w), "completed: ") > done[w] for w in done), 60,
               what="both workers to complete jobs through node b after node a died")
    print(f"docs: after node a died, work flowed through node b "
          f"within {time.monotonic() - t0:.1f}s", flush=True)


def check_curl_worker(t, urls):
    """The curl worker of docs/worker-api.md completes a job."""
    r = http("POST", urls[0] + "/work", {"id": "api-3", "payload": 3})
    assert r.status == 202, r
    r = http("GET", urls[0] + "/work/api-3?wait=30", timeout=40)
    assert r.status == 200 and r.json()["status"] == "completed", \
        f"the curl worker did not complete api-3: {r.json()}\n{t.output('.')[-2000:]}"
    assert r.json()["result"] == "3 * 3 = 9", r.json()


def check_traced_exec(t, urls):
    """The --exec job of docs/worker-api.md, "Trace context", gets the
    producer's tracestate as text: the `$(id)` in it is not run."""
    r = http("GET", urls[0] + "/work/traced-2?wait=30", timeout=40)
    assert r.status == 200 and r.json()["status"] == "completed", \
        f"the traced job did not complete: {r.json()}\n{t.output('--exec')[-2000:]}"
    assert r.json()["result"] == ("work traced-2 of trace 00-0af7651916cd43dd8448eb211c80319c-"
                                  "b7ad6b7169203331-01 had tracestate congo=$(id)"), r.json()


def check_webhook_receiver(t, urls):
    """The receiver of docs/webhooks.md verifies the delivery of its job."""
    wait_until(lambda: "verified work.completed hooked-6" in t.output("the block"), 30,
               what="the receiver to print a verified delivery")
    sub = http("GET", urls[0] + "/subscriptions/my-app").json()
    wait_until(lambda: http("GET", urls[0] + "/subscriptions/my-app").json()["lag"] == 0, 20,
               what=f"the subscription to catch up: {sub}")


# ---- running one block ----

def run_block(name, line, note, text):
    where = Path(tempfile.mkdtemp(prefix="workd-doc-"))
    os.chmod(where, 0o755)  # the postgres OS user must reach var/pg
    (where / "scripts").symlink_to(REPO_ROOT / "scripts")
    (where / "build").mkdir()
    (where / "build" / "bin").symlink_to(harness.BIN_DIR)
    words = note.split()
    opts = dict(w.split("=", 1) for w in words if "=" in w)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKD_")}
    fixture = []  # processes of the fixture
    pg = where / "var" / "pg"
    t = Terminals(where, env)
    try:
        if words[0] in ("cluster", "database"):
            url = subprocess.run([str(PG_PRIVATE), "start", str(pg)], capture_output=True,
                                 text=True, timeout=180, check=True).stdout.strip()
            env["WORKD_DATABASE_URL"] = url
        # Chosen once PostgreSQL listens: it takes a free port of its own, which
        # a port chosen before could be (a fixture's node then cannot listen).
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        # In one pass: a free port may itself hold "8081" or "8082" (48082).
        chosen = {"8080": str(ports[0]), "8081": str(ports[1]), "8082": str(free_port())}
        text = re.sub(r"808[012]", lambda m: chosen[m.group(0)], text)
        if words[0] == "cluster":
            for i, port in enumerate(ports):
                fixture.append(subprocess.Popen(
                    [str(harness.BIN_DIR / "workd-server"), "--listen", f"127.0.0.1:{port}",
                     "--advertise-url", urls[i], "--node-id", f"server-{i + 1}",
                     "--database-url", url, "--webhook-allow-networks", "127.0.0.0/8"], stdout=open(where / f"server-{i + 1}.log", "wb"),
                    stderr=subprocess.STDOUT, start_new_session=True))
                wait_until(lambda: http("GET", urls[i] + "/readyz", timeout=1).status == 200,
                           30, ignore=(OSError,), what=f"fixture server-{i + 1}")
            for i in range(int(opts.get("workers", "1"))):
                fixture.append(subprocess.Popen(
                    [str(harness.BIN_DIR / "workd-worker"), "--server", ",".join(urls),
                     "--demo", "--demo-delay", "100ms", "--id", f"fixture-{i + 1}"],
                    stdout=open(where / f"worker-{i + 1}.log", "wb"), stderr=subprocess.STDOUT,
                    start_new_session=True))
        if "script" in words:
            t.script(text)
        else:
            for cmd in commands(text):
                t.run(cmd)
        if "check" in opts:
            globals()[f"check_{opts['check']}"](t, urls)
        t.check_still_up()
    except BaseException:
        for log in sorted(where.glob("*.log")):
            print(f"---- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
        raise
    finally:
        t.close()
        for p in fixture:
            p.kill()
            p.wait()
        if pg.exists():
            subprocess.run([str(PG_PRIVATE), "destroy", str(pg)], capture_output=True,
                           timeout=120)
        subprocess.run(["rm", "-rf", str(where)])


def make_test(name, line, note, text):
    def test():
        run_block(name, line, note, text)
    test.__name__ = f"test_{name.replace('.md', '').replace('-', '_').lower()}_line_{line}"
    test.__code__ = test.__code__.replace(co_firstlineno=line)
    return test


def test_every_shell_block_has_a_note():
    blocks()


for _name, _line, _note, _text in blocks() if __name__ == "__main__" else []:
    if not _note.startswith("skip:"):
        _t = make_test(_name, _line, _note, _text)
        globals()[_t.__name__] = _t


if __name__ == "__main__":
    run_tests(globals())
