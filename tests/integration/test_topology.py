"""The docker-compose topology as plain processes on loopback: PostgreSQL, two
server nodes, HAProxy from Debian with the project's own config (the file the
compose file mounts), workers and clients that know only the balancer. Also
validates docker-compose.yml and the HAProxy config with the real tools."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import (REPO_ROOT, SSEClient, Skip, free_port, http, run_tests,  # noqa: E402
                     wait_leader, wait_until)
from workd import JSON, completions_by_id, expect, leader_of  # noqa: E402

HAPROXY_CFG = REPO_ROOT / "deploy" / "haproxy.cfg"
FAST = ["--election-interval", "100ms", "--worker-timeout", "3s", "--lease-grace", "2s",
        "--backoff-base", "50ms", "--backoff-max", "500ms"]


def test_compose_file_is_valid():
    exe = shutil.which("docker-compose")
    if not exe:
        raise Skip("docker-compose is not installed")
    r = subprocess.run([exe, "-f", str(REPO_ROOT / "docker-compose.yml"), "config"],
                       capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 0, f"docker-compose config failed:\n{r.stderr}"
    for service in ("postgres", "server-1", "server-2", "lb", "worker", "producer", "consumer"):
        assert f"  {service}:" in r.stdout, f"compose file lacks service {service}"
    assert "/usr/local/etc/haproxy/haproxy.cfg" in r.stdout
    assert "WORKD_TOKENS" in r.stdout and "WORKD_TOKEN:" in r.stdout, "authentication must be on"


def haproxy_env(bind, s1, s2):
    return {**os.environ, "WORKD_LB_BIND": bind, "WORKD_SERVER_1": s1, "WORKD_SERVER_2": s2}


def test_haproxy_config_is_valid():
    r = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True,
                       timeout=30, env=haproxy_env("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"))
    assert r.returncode == 0, f"haproxy -c: {r.stdout}{r.stderr}"


class Follower:
    """An SSE client that, like a real consumer, reconnects with Last-Event-ID."""

    def __init__(self, url):
        self.url, self.seen, self.last = url, [], None
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                with SSEClient(self.url, last_event_id=self.last) as sse:
                    i = 0
                    while not self.stop.is_set() and not sse.done.is_set():
                        while i < len(sse.events):
                            ev = sse.events[i]
                            self.seen.append(ev["data"]["id"])
                            self.last = ev["id"]
                            i += 1
                        time.sleep(0.02)  # a pace: copy what the reader has got
                    while i < len(sse.events):
                        self.seen.append(sse.events[i]["data"]["id"])
                        self.last = sse.events[i]["id"]
                        i += 1
            except Exception:  # noqa: BLE001 - the balancer may refuse while a node dies
                time.sleep(0.2)  # a declared delay: a consumer's pause before it reconnects

    def close(self):
        self.stop.set()
        self.t.join(10)


def test_cluster_behind_haproxy(cluster):
    s1 = cluster.start_server("server-1", extra_args=FAST)
    wait_leader(s1.url)
    s2 = cluster.start_server("server-2", extra_args=FAST)
    wait_leader(s2.url)
    lb_port = free_port()
    lb = f"http://127.0.0.1:{lb_port}"
    cluster.start_process("haproxy", ["haproxy", "-db", "-f", str(HAPROXY_CFG)],
                          env=haproxy_env(f"127.0.0.1:{lb_port}", f"127.0.0.1:{s1.port}",
                                          f"127.0.0.1:{s2.port}"))
    wait_until(lambda: http("GET", lb + "/readyz", timeout=2).status == 200, 15,
               what="the balancer to answer", ignore=(OSError,))
    workers = [cluster.start_worker(f"worker-{i}", lb, ["--concurrency", "4", "--demo",
                                                        "--demo-delay", "30ms",
                                                        "--poll-wait", "5s"])
               for i in range(1, 4)]
    follower = Follower(lb + "/results?after=0")
    ids = []
    for batch in range(3):
        items = [{"id": f"job-{batch}-{i}", "payload": i} for i in range(50)]
        r = http("POST", lb + "/work", items, JSON)
        expect(r, 202, f"bulk submit {batch} through the balancer")
        ids += [it["id"] for it in items]
    wait_until(lambda: len(completions_by_id(cluster)) >= 60, 60, what="work to flow")

    # Kill the leader behind the balancer while work flows and clients submit.
    leader_url = leader_of([s1.url, s2.url])
    leader = s1 if leader_url == s1.url else s2
    statuses, retried = [], []

    def client():
        # Like a real producer: a request cut off with its node (HAProxy answers
        # 502 for a request in flight on a killed node) is resubmitted with the
        # same id, which cannot create a second job.
        for i in range(100):
            for _ in range(20):
                r = http("POST", lb + "/work", {"id": f"single-{i}", "payload": i}, JSON,
                         timeout=30)
                if r.status == 202:
                    break
                retried.append(r.status)
                time.sleep(0.2)  # a declared delay: a producer's pause before it resubmits
            statuses.append(r.status)
            if r.status == 202:
                ids.append(f"single-{i}")
    t = threading.Thread(target=client)
    t.start()
    wait_until(lambda: len(statuses) >= 3, 15, what="the client to be submitting")
    leader.kill(signal.SIGKILL)
    # Scale: a fourth worker joins, one of the first three leaves.
    workers.append(cluster.start_worker("worker-4", lb, ["--concurrency", "4", "--demo",
                                                         "--demo-delay", "30ms"]))
    workers[0].stop()
    t.join(120)
    assert statuses.count(202) == len(statuses) == 100, \
        f"every submission through the balancer must be accepted: {statuses}"
    assert len(retried) <= 5, f"only requests in flight on the killed node may fail: {retried}"

    def all_done():
        return set(completions_by_id(cluster)) >= set(ids)
    try:
        wait_until(all_done, 60, what="every job to complete")
    except AssertionError:
        missing = sorted(set(ids) - set(completions_by_id(cluster)))
        history = cluster.psql("SELECT seq, term, type, work_id, data FROM workd_events WHERE "
                               "work_id = ANY('{" + ",".join(missing) + "}') ORDER BY seq")
        raise AssertionError(f"not completed within 60s: {missing}\n{history}") from None
    counts = completions_by_id(cluster)
    dup = {k: v for k, v in counts.items() if v != 1}
    assert not dup, f"jobs completed more than once: {dup}"
    wait_until(lambda: set(follower.seen) >= set(ids), 60,
               what="the results stream through the balancer to deliver every result")
    follower.close()
    seen_twice = len(follower.seen) - len(set(follower.seen))
    assert seen_twice == 0, f"{seen_twice} results were delivered twice through reconnects"
    assert workers[0].returncode == 0, "a stopped worker exits 0"


if __name__ == "__main__":
    run_tests(globals())
