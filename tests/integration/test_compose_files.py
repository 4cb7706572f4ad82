"""Every workd service of docker-compose.yml and docker-compose.replicated.yml,
run as its container would run it (the image's entrypoint, the service's
command, the environment the compose file gives it, with and without the demo
profile) gets past its configuration: it starts and logs, rather than refusing
a setting. Runs the built binaries directly, no container engine: the compose
cluster itself is `make test-compose` (tests/compose/test_compose.py)."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import REPO_ROOT, run_tests, wait_until  # noqa: E402

COMPOSE_FILES = [REPO_ROOT / "docker-compose.yml", REPO_ROOT / "docker-compose.replicated.yml"]
ENTRYPOINT = REPO_ROOT / "deploy" / "docker-entrypoint.sh"
# A line of the binaries' log: the configuration was taken.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S+ (debug|info|warn|error) ", re.M)
VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value, env):
    """Compose's ${NAME:-default} and ${NAME}, from env."""
    return VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), str(value))


def workd_services(path, env):
    """(name, command, environment) of each service run from the workd image."""
    doc = yaml.safe_load(path.read_text())
    for name, svc in doc["services"].items():
        if svc.get("image") != "workd:latest":
            continue
        if env.get("COMPOSE_PROFILES", "") == "" and svc.get("profiles"):
            continue
        environment = svc.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(e.split("=", 1) for e in environment)
        yield name, list(svc["command"]), {k: interpolate(v, env).strip()
                                           for k, v in environment.items()}


def starts(name, command, environment):
    """Runs the service's command through the entrypoint until it logs a line,
    and returns None, or what it printed when it exited first."""
    # The servers' listen address becomes a free one here; nothing else changes.
    argv = [a if not re.fullmatch(r"0\.0\.0\.0:\d+", a) else "127.0.0.1:0" for a in command]
    env = {"PATH": f"{harness.BIN_DIR}:{os.environ['PATH']}", **environment}
    p = subprocess.Popen(["sh", str(ENTRYPOINT), *argv], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []

    def started():
        line = p.stdout.readline()
        out.append(line)
        return LOG_LINE.match(line) or (not line and p.poll() is not None) or None
    try:
        wait_until(started, 30, interval=0, what=f"{name} to log or exit")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        p.stdout.close()
    return None if out and LOG_LINE.match(out[-1]) else "".join(out)


def test_every_service_takes_its_environment():
    for profiles in ("demo", ""):
        env = {"COMPOSE_PROFILES": profiles}
        if not profiles:
            # Outside the demo profile the example tokens are refused: give
            # tokens of one's own, as README's .env does.
            env.update({k: f"{k.lower()}-0123456789abcdef" for k in (
                "WORKD_CLIENT_TOKEN", "WORKD_WORKER_TOKEN", "WORKD_ADMIN_TOKEN",
                "WORKD_CLUSTER_SECRET", "WORKD_DB_PASSWORD")})
        for path in COMPOSE_FILES:
            seen = []
            for name, command, environment in workd_services(path, env):
                failed = starts(name, command, environment)
                assert failed is None, \
                    f"{path.name}: service {name} (COMPOSE_PROFILES={profiles!r}) does not " \
                    f"start with its environment {environment}:\n{failed}"
                seen.append(name)
            assert "worker" in seen, f"{path.name}: no worker service found ({seen})"
            if profiles and path.name == "docker-compose.yml":
                assert {"producer", "consumer"} <= set(seen), \
                    f"{path.name}: the demo profile's clients were not run ({seen})"


def test_example_tokens_only_in_the_demo_profile():
    """The entrypoint refuses the public example tokens unless the compose
    file's demo profile is on."""
    for path in COMPOSE_FILES:
        for profiles, refused in (("", True), ("demo", False), ("other,demo", False)):
            env = {"COMPOSE_PROFILES": profiles}
            for name, command, environment in workd_services(path, {**env, "x": ""}):
                if name != "worker":
                    continue
                failed = starts(name, command, environment)
                if refused:
                    assert failed and "REFUSING TO START" in failed, \
                        f"{path.name}: the example tokens must be refused without the demo " \
                        f"profile:\n{failed}"
                else:
                    assert failed is None, \
                        f"{path.name}: COMPOSE_PROFILES={profiles!r} must run with the example " \
                        f"tokens:\n{failed}"


if __name__ == "__main__":
    run_tests(globals())
