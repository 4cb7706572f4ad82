"""The compose cluster for real (`make test-compose`): builds the image from the
Dockerfile as it is and runs docker-compose.yml as it is (plus
docker-compose.test.yml, which builds stand-ins for the PostgreSQL and HAProxy
images that cannot be pulled here). First the demo exactly as README.md prints
it (`COMPOSE_PROFILES=demo docker compose up --build --scale worker=3`, in the
foreground): its workers process the demo producer's jobs and the consumer
prints their results; Ctrl-C stops it and README's `down -v` removes it. Then
with tokens of its own and three workers: submits work through the load
balancer, kills the leader's container while work flows, checks that every job
completes exactly once, then `docker-compose down`.

Uses the Docker engine named by DOCKER_HOST, or /var/run/docker.sock; without
one, Debian's podman serving the Docker API (scripts/container-env)."""

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, free_port, http, run_tests, wait_until  # noqa: E402

OVERRIDE = REPO_ROOT / "tests" / "compose" / "docker-compose.test.yml"
README = REPO_ROOT / "README.md"
PROJECT = f"workdtest{os.getpid()}"
WORKERS = 3


STARTED_ENGINE = []


def engine_env():
    """The environment for docker-compose: an existing engine, or podman's
    (started here, and stopped at the end if it was not running before)."""
    env = dict(os.environ)
    if env.get("DOCKER_HOST") or os.path.exists("/var/run/docker.sock"):
        return env
    script = str(REPO_ROOT / "scripts" / "container-env")
    was_running = subprocess.run([script, "status"], capture_output=True).returncode == 0
    out = subprocess.run([script, "start"], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, f"scripts/container-env start failed:\n{out.stderr}"
    if not was_running:
        STARTED_ENGINE.append(script)
    for m in re.finditer(r"(\w+)=(\S+)", out.stdout.replace("export ", "")):
        env[m.group(1)] = m.group(2)
    return env


class Compose:
    def __init__(self, env):
        self.env = env

    def run(self, *args, check=True, timeout=600, capture=True):
        argv = ["docker-compose", "-p", PROJECT, "-f", str(REPO_ROOT / "docker-compose.yml"),
                "-f", str(OVERRIDE), *args]
        r = subprocess.run(argv, cwd=REPO_ROOT, env=self.env, timeout=timeout, text=True,
                           capture_output=capture)
        if check and r.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout}\n{r.stderr}")
        return r

    def states(self):
        """{container name: state column of `docker-compose ps`}."""
        out = self.run("ps").stdout.splitlines()
        states = {}
        for line in out[2:]:
            cols = re.split(r"\s{2,}", line.strip())
            if len(cols) >= 3:
                states[cols[0]] = cols[2]
        return states


def compose_program(env):
    """How compose is run here: `docker compose` (the Docker CLI plugin) when
    it works, else the standalone docker-compose, which takes the same
    arguments (README.md says so)."""
    r = subprocess.run(["docker", "compose", "version"], env=env, capture_output=True)
    return "docker compose" if r.returncode == 0 else "docker-compose"


def readme_command(pattern):
    """The first line of README.md that matches pattern: the command as a
    reader meets it first."""
    found = re.findall(rf"^{pattern}$", README.read_text(), re.M)
    assert found, f"README.md must print a command matching {pattern!r}"
    return found[0]


def run_readme_demo(c, env, lb, log_path):
    """README's compose demo, as printed, in the foreground as in a terminal;
    its workers must process the producer's jobs. Ctrl-C, then README's down."""
    up = readme_command(r"COMPOSE_PROFILES=demo docker[ -]compose up .*--scale worker=\d+")
    down = readme_command(r"docker[ -]compose down -v")
    workers = int(re.search(r"worker=(\d+)", up).group(1))
    program = compose_program(env)
    denv = {k: v for k, v in env.items() if not k.startswith("WORKD_") or k == "WORKD_LB_PORT"}
    # The project and files as the `-p`/`-f` of the rest of the test, given
    # through compose's own variables so that the command stays as printed.
    denv.update(COMPOSE_PROJECT_NAME=PROJECT, COMPOSE_FILE=f"docker-compose.yml:{OVERRIDE}")
    denv.pop("COMPOSE_PROFILES", None)
    print(f"compose: README's demo: {up}", flush=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["sh", "-c", re.sub(r"docker[ -]compose", program, up)],
                                cwd=REPO_ROOT, env=denv, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    client = {"Authorization": "Bearer change-me-client-token"}
    try:
        wait_until(lambda: http("GET", lb + "/readyz", timeout=3).status == 200, 300,
                   interval=0.5, what="the demo's balancer to answer /readyz", ignore=(OSError,))

        def demo_done():
            assert proc.poll() is None, f"README's demo command exited {proc.returncode}"
            r = http("GET", lb + "/work?status=completed&limit=100", headers=client, timeout=5)
            done = [w for w in r.json()["items"] if w["id"].startswith("demo-")]
            return len(done) >= 10 and done
        done = wait_until(demo_done, 180, interval=1, ignore=(OSError,),
                          what="the demo producer's jobs to be completed by the workers")
        logs = c.run("logs", "--no-color", "worker", "consumer").stdout
        completed = re.findall(r"job (demo-\S+) attempt \d+ completed", logs)
        consumed = re.findall(r"consumed result of (demo-\S+):", logs)
        assert len(completed) >= 10 and len(consumed) >= 10, \
            f"the demo's workers and consumer must log the jobs:\n{logs[-3000:]}"
        states = c.states()
        running = [n for n, s in states.items()
                   if re.search(r"[_-]worker[_-]", n) and s.startswith("Up")]
        assert len(running) == workers, f"{workers} demo workers must stay up: {states}"
        print(f"compose: README's demo completed {len(done)} jobs "
              f"{time.monotonic() - t0:.0f}s after up", flush=True)
    finally:
        # Ctrl-C in the terminal of `up`: compose stops the containers.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        r = subprocess.run(["sh", "-c", re.sub(r"docker[ -]compose", program, down)],
                           cwd=REPO_ROOT, env=denv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README's `{down}` failed:\n{r.stdout}{r.stderr}"
    left = c.run("ps", "-q", check=False).stdout.strip()
    assert not left, f"README's `{down}` left containers: {left}"


def test_compose_cluster():
    env = engine_env()
    port = free_port()
    tokens = {k: secrets.token_hex(16) for k in ("CLIENT", "WORKER", "ADMIN")}
    env.update({f"WORKD_{k}_TOKEN": v for k, v in tokens.items()})
    env["WORKD_CLUSTER_SECRET"] = secrets.token_hex(16)
    env["WORKD_LB_PORT"] = str(port)
    env["WORKD_SHARDS"] = "2"  # two writers, one on each server node
    env.pop("COMPOSE_PROFILES", None)
    c = Compose(env)
    lb = f"http://127.0.0.1:{port}"
    client = {"Authorization": f"Bearer {tokens['CLIENT']}"}
    admin = {"Authorization": f"Bearer {tokens['ADMIN']}"}

    t0 = time.monotonic()
    c.run("build", timeout=1800, capture=False)
    print(f"compose: images built in {time.monotonic() - t0:.0f}s", flush=True)
    try:
        run_readme_demo(c, env, lb, Path(os.environ.get("TMPDIR", "/tmp")) / f"{PROJECT}-up.log")

        # The example tokens of the compose file are refused outside the demo
        # profile, and accepted (with a warning) in it.
        example = ["-e", "WORKD_TOKENS=client:change-me-client-token"]
        r = c.run("run", "--rm", "--no-deps", *example, "-e", "COMPOSE_PROFILES=", "server-1",
                  "workd-server", "--help", check=False)
        assert r.returncode == 78 and "REFUSING TO START" in r.stderr + r.stdout, \
            f"the example tokens must be refused outside the demo profile: {r.returncode} " \
            f"{r.stdout}{r.stderr}"
        r = c.run("run", "--rm", "--no-deps", *example, "-e", "COMPOSE_PROFILES=demo", "server-1",
                  "workd-server", "--help", check=False)
        assert r.returncode == 0 and "WARNING" in r.stderr + r.stdout, \
            f"the demo profile runs with the example tokens: {r.returncode} {r.stdout}{r.stderr}"

        # The runtime image carries no compiler.
        r = c.run("run", "--rm", "--no-deps", "--entrypoint", "sh", "worker", "-c",
                  "command -v cc gcc cmake make || true")
        assert not r.stdout.strip(), f"the runtime image has build tools: {r.stdout}"

        t1 = time.monotonic()
        c.run("up", "-d", "--scale", f"worker={WORKERS}", timeout=600)
        wait_until(lambda: http("GET", lb + "/readyz", timeout=3).status == 200, 180,
                   interval=0.5, what="the balancer to answer /readyz", ignore=(OSError,))

        def all_healthy():
            s = c.states()
            return len(s) == 4 + WORKERS and all("healthy" in v and "unhealthy" not in v
                                                 for v in s.values()) and s
        states = wait_until(all_healthy, 180, interval=1,
                            what=f"every service to be healthy ({c.states()})")
        print(f"compose: cluster healthy in {time.monotonic() - t1:.0f}s: {states}", flush=True)

        def workers_registered():
            r = http("GET", lb + "/cluster", headers=admin, timeout=5)
            return r.status == 200 and len(r.json()["workers"]) >= WORKERS and r.json()
        cluster = wait_until(workers_registered, 60, interval=0.5, ignore=(OSError,),
                             what=f"{WORKERS} workers to register")

        def shards_spread():
            r = http("GET", lb + "/cluster", headers=admin, timeout=5)
            leaders = [x["leader"] for x in r.json().get("shards", [])] if r.status == 200 else []
            return len(leaders) == 2 and len(set(leaders)) == 2 and r.json()
        cluster = wait_until(shards_spread, 90, interval=1, ignore=(OSError,),
                             what="the two shards to be led by the two server nodes")

        ids = []
        items = [{"id": f"bulk-{i}", "payload": i % 20} for i in range(60)]
        r = http("POST", lb + "/work", items, headers=client)
        assert r.status == 202, f"bulk submission through the balancer: {r.status} {r.text}"
        ids += [it["id"] for it in items]

        # Singles keep coming while the leader's container is killed; a request
        # cut off with its node is resubmitted with the same id, as a producer does.
        statuses = []

        def producer():
            for i in range(40):
                for _ in range(50):
                    try:
                        r = http("POST", lb + "/work", {"id": f"single-{i}", "payload": i},
                                 headers=client, timeout=30)
                        if r.status == 202:
                            break
                    except OSError:
                        pass
                    time.sleep(0.2)
                statuses.append(r.status)
                ids.append(f"single-{i}")
                time.sleep(0.05)
        t = threading.Thread(target=producer)
        t.start()
        time.sleep(1)
        leader = cluster["leader"]
        victim = "server-1" if "server-1" in leader else "server-2"
        print(f"compose: killing the leader {victim} ({leader})", flush=True)
        c.run("kill", "-s", "SIGKILL", victim)
        t.join(180)
        assert statuses.count(202) == len(statuses) == 40, \
            f"every submission through the balancer must be accepted: {statuses}"

        def unfinished():
            left = []
            for wid in ids:
                r = http("GET", f"{lb}/work/{wid}", headers=client, timeout=10)
                if r.status != 200 or r.json()["status"] != "completed":
                    left.append((wid, r.status, r.json().get("status")))
            return left
        wait_until(lambda: not unfinished(), 120, interval=1, ignore=(OSError,),
                   what=f"every job to complete through the new leader (left: {unfinished()})")
        for wid in ids:
            r = http("GET", f"{lb}/work/{wid}/events", headers=client, timeout=10)
            assert r.status == 200, f"events of {wid}: {r.status}"
            done = [e for e in r.json()["events"] if e["type"] == "completed"]
            assert len(done) == 1, f"{wid} completed {len(done)} times: {r.json()}"
        r = http("GET", lb + "/cluster", headers=admin, timeout=5)
        assert victim not in r.json()["leader"], f"a new leader must have taken over: {r.json()}"
        print(f"compose: {len(ids)} jobs completed exactly once {time.monotonic() - t1:.0f}s "
              f"after up; leader now "
              f"{r.json()['leader']}", flush=True)

        # `docker-compose stop` reaches the workers (through init) as SIGTERM:
        # each one stops gracefully and deregisters.
        t2 = time.monotonic()
        c.run("stop", "worker", timeout=120)
        logs = c.run("logs", "--no-color", "worker").stdout
        print(f"compose: workers stopped in {time.monotonic() - t2:.1f}s", flush=True)
        assert logs.count("deregistered from http://lb:8080") == WORKERS, \
            f"every worker deregisters when stopped:\n{logs[-3000:]}"
    except BaseException:
        print(c.run("ps", check=False).stdout)
        print(c.run("logs", "--no-color", "--tail", "40", check=False).stdout[-20000:])
        raise
    finally:
        c.run("down", "-v", "--remove-orphans", check=False, timeout=300)
        after = c.run("ps", "-q", check=False).stdout.strip()
        for script in STARTED_ENGINE:
            subprocess.run([script, "stop"], timeout=60)
    assert not after, f"docker-compose down left containers: {after}"


if __name__ == "__main__":
    run_tests(globals())
