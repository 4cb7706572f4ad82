"""The worker and the demo clients as a user runs them: they take a list of
servers (repeated --server or a comma list) and move to the next when one
cannot be reached, also when the node they use dies; and a refusal no retry can
mend (a wrong token: 401, a token without the scope: 403) stops them with a
clear error and exit status 1 instead of retrying forever. The demo consumer
resumes from an event id of several shards as it came."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import free_port, http, run_tests, wait_leader, wait_until  # noqa: E402
from scripted_stream import ScriptedStream  # noqa: E402
from workd import JSON, expect  # noqa: E402

CLIENT = "client-token-0123456789"
WORKER = "worker-token-0123456789"
TOKENS = f"client:{CLIENT} worker:{WORKER}"
FAST = ["--election-interval", "100ms"]


def dead_url():
    """A URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


def demo(cluster, name, mode, servers, env=None, extra=()):
    argv = [str(cluster.bin_dir / "workd-demo"), mode, *servers, *extra]
    return cluster.start_process(name, argv, env=env)


def completed(url, wid, headers=None):
    r = http("GET", f"{url}/work/{wid}", headers=headers)
    return r.status == 200 and r.json()["status"] == "completed"


def test_worker_and_clients_skip_a_server_that_is_down(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    down = dead_url()
    # Repeated --server, the dead one first.
    w = cluster.start_worker("w1", down, ["--server", s.url, "--demo", "--demo-delay", "10ms"])
    wait_until(lambda: f"registered with {s.url}" in w.log_text(), 15,
               what="the worker to register through the second server")
    assert f"trying server {s.url}" in w.log_text(), w.log_tail()
    # A comma list, the dead one first.
    prod = demo(cluster, "producer", "produce", ["--server", f"{down},{s.url}"],
                extra=["--interval", "100ms", "--count", "3"])
    cons = demo(cluster, "consumer", "consume", ["--server", f"{down},{s.url}"])
    assert prod.stopped_with(30) == 0, prod.log_tail()
    assert len(re.findall("accepted work", prod.log_text())) == 3, prod.log_tail()
    ids = re.findall(r"accepted work (\S+)", prod.log_text())
    wait_until(lambda: all(completed(s.url, i) for i in ids), 20, what="the demo work to complete")
    # The consumer connected after the work was accepted, maybe after it finished:
    # it reports what finishes from then on, so give it one more.
    expect(http("POST", s.url + "/work", {"id": "late", "payload": 4}, JSON), 202, "submit")
    wait_until(lambda: "consumed result of late" in cons.log_text(), 20,
               what="the consumer to follow results through the second server")
    for p in (w, cons):
        p.stop()
        assert p.returncode == 0, p.log_tail()
    assert "deregistered from " + s.url in w.log_text(), w.log_tail()


def test_clients_move_on_when_their_node_dies(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST)
    wait_leader(b.url)
    both = f"{a.url},{b.url}"
    w = cluster.start_worker("w1", both, ["--demo", "--demo-delay", "10ms"])
    prod = demo(cluster, "producer", "produce", ["--server", both], extra=["--interval", "100ms"])
    cons = demo(cluster, "consumer", "consume", ["--server", both])
    wait_until(lambda: len(re.findall("consumed result", cons.log_text())) >= 3, 30,
               what="results to flow through node a")
    a.kill(signal.SIGKILL)
    t0 = time.monotonic()
    counts = {p: len(re.findall(pat, p.log_text()))
              for p, pat in ((w, "completed: "), (prod, "accepted work"),
                             (cons, "consumed result"))}

    def moved_on():
        return all(len(re.findall(pat, p.log_text())) >= counts[p] + 3
                   for p, pat in ((w, "completed: "), (prod, "accepted work"),
                                  (cons, "consumed result")))
    wait_until(moved_on, 30, what="worker, producer and consumer to go on through node b")
    for p in (w, prod, cons):
        assert f"trying server {b.url}" in p.log_text(), f"{p.name}:\n{p.log_tail()}"
    print(f"clients went on through node b {time.monotonic() - t0:.1f}s after node a died")


def test_wrong_or_unscoped_token_stops_with_an_error(cluster):
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    cases = [
        ("worker-no-token", cluster.start_worker("worker-no-token", s.url, ["--demo"]), 401),
        ("worker-wrong", cluster.start_worker("worker-wrong", s.url, ["--demo"],
                                              env={"WORKD_TOKEN": "wrong-token-0123456789"}),
         401),
        ("worker-client-scope", cluster.start_worker("worker-client-scope", s.url, ["--demo"],
                                                     env={"WORKD_TOKEN": CLIENT}), 403),
        ("producer-wrong", demo(cluster, "producer-wrong", "produce", ["--server", s.url],
                                env={"WORKD_TOKEN": "wrong-token-0123456789"}), 401),
        ("consumer-worker-scope", demo(cluster, "consumer-worker-scope", "consume",
                                       ["--server", s.url], env={"WORKD_TOKEN": WORKER}), 403),
    ]
    for name, proc, status in cases:
        rc = proc.stopped_with(15)
        log = proc.log_text()
        assert rc == 1, f"{name} exited {rc}, not 1:\n{log[-1500:]}"
        assert re.search(rf"error .*HTTP {status}.*token \(--token or WORKD_TOKEN\)", log), \
            f"{name} did not say that its token was refused:\n{log[-1500:]}"
    # The right token still works.
    w = cluster.start_worker("worker-ok", s.url, ["--demo", "--demo-delay", "10ms"],
                             env={"WORKD_TOKEN": WORKER})
    auth = {"Authorization": f"Bearer {CLIENT}"}
    expect(http("POST", s.url + "/work", {"id": "ok-2", "payload": 2}, {**JSON, **auth}), 202,
           "submit")
    wait_until(lambda: completed(s.url, "ok-2", auth), 20, what="the worker with its token")
    w.stop()


def test_demo_consumer_resumes_from_an_event_id_of_every_shard():
    """The consumer keeps an event id of several shards as it came, up to a
    cursor of all 64 shards (1279 bytes), and resumes with it."""
    every_shard = ".".join(str(10**18 + i) for i in range(64))
    next_one = ".".join(str(10**18 + i + (i == 5)) for i in range(64))
    with ScriptedStream([[("3.2", 2), (every_shard, 3)], [(next_one, 4)], []]) as srv:
        consumer = subprocess.Popen([str(harness.BIN_DIR / "workd-demo"), "consume",
                                     "--server", srv.url], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: len(srv.requests) >= 3 or consumer.poll() is not None, 15,
                       what=lambda: f"3 connections of the consumer (have {srv.requests})")
        finally:
            consumer.terminate()
            _, err = consumer.communicate(timeout=10)
    assert srv.requests[:3] == [(None, None), (every_shard, None), (next_one, None)], \
        f"the consumer did not resume from the last event id: {srv.requests}\n{err[-1500:]}"


if __name__ == "__main__":
    run_tests(globals())
