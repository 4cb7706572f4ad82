"""Byte budgets (issue 13.4): every buffer that input can grow is bounded in
bytes, not only in count. Each test makes a node hold what a hostile client or
worker could make it hold — big results in the ring, subscribers that never
read, heartbeats listing huge `running` lists for invented worker ids, pulls
of big jobs — at a small scale, and bounds the node's resident memory (or the
answer's size) far below what the same input cost before."""

import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect, pull, submit, wait_status  # noqa: E402

MB = 1024 * 1024


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def check_growth(cluster, grown, bound, what):
    """Asserts a node grew by less than bound MB. Under AddressSanitizer
    (make test-asan) memory is not given back (its quarantine alone holds
    256 MB), so there the growth is only reported."""
    print(f"{what}: the node grew by {grown:.0f} MB (bound {bound} MB)")
    exe = cluster.bin_dir / "workd-server"
    if b"__asan_init" in exe.read_bytes():
        return
    assert grown < bound, f"{what} grew the node by {grown:.0f} MB (bound {bound} MB)"


def big_results(url, n, size, queue="big"):
    """n completed work items whose results are `size` bytes each."""
    ids = [w["id"] for w in expect(http("POST", url + "/work", [
        {"id": f"big-{i}", "payload": i, "queue": queue} for i in range(n)], JSON), 202,
        "submit").json()["items"]]
    blob = "x" * size
    done = 0
    while done < n:
        jobs = pull(url, "w-big", max_jobs=10, wait=5, queues=[queue])
        for j in jobs:
            r = http("POST", f"{url}/workers/w-big/reports",
                     {"instance": "i1", "reports": [{"id": j["id"], "attempt": j["attempt"],
                                                     "outcome": "completed", "result": blob}]},
                     JSON)
            assert r.status == 200 and r.json()["results"][0]["accepted"], r.text[:300]
            done += 1
    return ids


def test_results_ring_is_bounded_in_bytes(cluster):
    """150 results of 1 MB raised every node by ~155 MB: the ring held 8,192
    events whatever their size. With --results-ring-bytes 4 MiB it holds
    4 MiB; what it dropped is read from the table by whoever needs it."""
    s = cluster.start_server("s1", extra_args=["--max-body", str(2 * MB),
                                               "--results-ring-bytes", str(4 * MB)])
    wait_leader(s.url)
    base = rss_mb(s.pid)
    ids = big_results(s.url, 100, MB)
    check_growth(cluster, rss_mb(s.pid) - base, 45, "100 results of 1 MB (ring: 4 MiB)")
    # Nothing is lost: a stream from the start gets every one of them.
    with SSEClient(f"{s.url}/results?after=0&queue=big") as sse:
        got = sse.wait_count(len(ids), timeout=60)
        assert [e["data"]["id"] for e in got[:len(ids)]] == ids, "results missing or out of order"


def open_stalled_stream(port, after=0):
    """A subscriber that asks for everything and never reads."""
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect(("127.0.0.1", port))
    c.sendall(f"GET /results?after={after} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return c


def test_slow_subscribers_are_bounded_and_cut_off(cluster):
    """Three subscribers that never read, resuming from after=0 over 150
    results of 1 MB, raised one node to 466 MB: a catch-up page of 500 events
    went into each one's buffer. Now each holds at most --sse-buffer-bytes (or
    one event), and one that makes no progress for --connection-timeout is cut
    off; it resumes with Last-Event-ID and misses nothing."""
    a = cluster.start_server("a", extra_args=["--max-body", str(2 * MB)])
    wait_leader(a.url)
    ids = big_results(a.url, 40, MB)
    # A node started afterwards has none of them in its ring: every stream from
    # after=0 catches up from the table.
    s = cluster.start_server("s1", extra_args=["--sse-buffer-bytes", str(256 * 1024),
                                               "--connection-timeout", "4s"])
    wait_leader(s.url)
    base = rss_mb(s.pid)
    stalled = [open_stalled_stream(s.port) for _ in range(3)]
    time.sleep(3)  # a declared window: catch-up reads run meanwhile, memory is measured
    check_growth(cluster, rss_mb(s.pid) - base, 40, "3 stalled subscribers")
    # Cut off: without reading anything more, wait past the connection
    # timeout; the server has then closed them, so what is left to read ends
    # (a stream still open would go on sending megabytes, and never end).
    time.sleep(6)  # a declared window: a stall past the 4 s --connection-timeout
    last = 0
    for c in stalled:
        c.settimeout(5)
        data, ended = b"", False
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            try:
                chunk = c.recv(1 << 20)
            except socket.timeout:
                break
            except ConnectionResetError:
                ended = True
                break
            if not chunk:
                ended = True
                break
            data += chunk
        c.close()
        assert ended, (f"a subscriber that read nothing for 9 s (timeout 4 s) was not cut off: "
                       f"{len(data)} bytes so far and counting")
        seen = [int(line[4:]) for line in data.decode(errors="replace").split("\n")
                if line.startswith("id: ")]
        last = max(seen) if seen else 0
    # It resumes where it was cut off, with nothing missing and nothing twice.
    with SSEClient(f"{s.url}/results?queue=big", last_event_id=str(last)) as sse:
        got = sse.wait_for(lambda e: e["data"]["id"] == ids[-1], timeout=60)
        seqs = [e["data"]["seq"] for e in sse.events if e.get("data")]
        assert seqs and min(seqs) > last and len(seqs) == len(set(seqs)), \
            f"the resumed stream after {last}: {seqs[:5]}..."
        assert got


def test_heartbeats_of_invented_workers_are_bounded(cluster):
    """Ten heartbeats listing 100,000 running attempts, for worker ids anyone
    with a worker token may invent, raised the leader by 476 MB: each list was
    kept whole. Now a worker keeps the first 100 (for display), and past
    --max-workers a new worker id gets 429."""
    # A long --worker-timeout: under a sanitizer the 25 big heartbeats take
    # longer than the default 10 s, and a worker forgotten meanwhile would
    # free a place under the limit.
    s = cluster.start_server("s1", extra_args=["--max-workers", "25", "--worker-timeout", "600s"])
    wait_leader(s.url)
    running = [{"id": f"attempt-{i:08d}", "attempt": 1} for i in range(27000)]
    body = json.dumps({"instance": "i1", "capacity": 1, "running": running},
                      separators=(",", ":"))
    assert len(body) < MB
    base = rss_mb(s.pid)
    for i in range(25):
        expect(http("PUT", f"{s.url}/workers/invented-{i}", body, JSON), 200, f"heartbeat {i}")
    check_growth(cluster, rss_mb(s.pid) - base, 100, "25 heartbeats of 27,000 running attempts")
    r = http("PUT", f"{s.url}/workers/one-too-many", {"instance": "i1"}, JSON)
    assert r.status == 429 and r.json()["type"].endswith("/too-many-workers"), r.text
    assert "Retry-After" in r.headers, r.headers
    r = http("POST", f"{s.url}/workers/one-too-many/pull", {"instance": "i1", "max": 1}, JSON)
    assert r.status == 429, f"a pull registering a new worker past the limit: {r.text}"
    expect(http("PUT", f"{s.url}/workers/invented-3", {"instance": "i1"}, JSON), 200,
           "a registered worker keeps heartbeating")
    cl = expect(http("GET", s.url + "/cluster"), 200, "cluster").json()
    shown = max(len(w["running"] or []) for w in cl["workers"])
    assert shown <= 100, f"the registry kept {shown} running attempts of one worker"


def test_pull_answers_are_bounded_in_bytes(cluster):
    """A pull of max=N took N jobs whatever their payloads: N MB of answer.
    Now it stops at --max-reply-bytes (always one job); the rest stays ready.
    --max-reply-bytes must exceed --max-body by a job's envelope, so that any
    job fits an answer alone (issue 27.4)."""
    s = cluster.start_server("s1", extra_args=["--max-reply-bytes", str(64 * 1024),
                                               "--max-body", str(48 * 1024)])
    wait_leader(s.url)
    payload = "p" * (30 * 1024)
    for i in range(5):
        submit(s.url, {"id": f"fat-{i}", "payload": payload, "queue": "fat"})
    r = http("POST", f"{s.url}/workers/w1/pull", {"instance": "i1", "max": 5, "queues": ["fat"]},
             JSON)
    assert r.status == 200 and len(r.body) <= 64 * 1024, f"{r.status}: {len(r.body)} bytes"
    first = r.json()["jobs"]
    assert 1 <= len(first) < 5, f"{len(first)} jobs of 30 KB in a 64 KiB answer"
    rest = []
    while len(first) + len(rest) < 5:
        jobs = pull(s.url, "w1", max_jobs=5, queues=["fat"])
        assert jobs, "jobs left behind by a full answer are never handed out"
        rest += jobs
    # The largest job a body may carry fits an answer within the budget.
    submit(s.url, {"id": "huge", "payload": "h" * (47 * 1024), "queue": "huge"})
    submit(s.url, {"id": "huge-2", "payload": 1, "queue": "huge"})
    r = http("POST", f"{s.url}/workers/w1/pull", {"instance": "i1", "max": 5, "queues": ["huge"]},
             JSON)
    assert r.status == 200 and len(r.body) <= 64 * 1024, f"{r.status}: {len(r.body)} bytes"
    assert "huge" in [j["id"] for j in r.json()["jobs"]], [j["id"] for j in r.json()["jobs"]]
    # A configuration where one could not is refused at start.
    bad = cluster.start_server("bad", extra_args=["--max-reply-bytes", str(64 * 1024)],
                               wait_ready=False)
    assert bad.stopped_with(10) != 0 and "--max-reply-bytes" in bad.log_text(), bad.log_tail()


def test_forwarded_replies_are_bounded_in_bytes(cluster):
    """A node forwarding to the leader buffered the whole reply. Past
    --max-reply-bytes it now answers 502 reply-too-large and keeps nothing."""
    leader = cluster.start_server("a")
    wait_leader(leader.url)
    follower = cluster.start_server("b", extra_args=["--max-reply-bytes", str(64 * 1024),
                                                     "--max-body", str(32 * 1024)])
    wait_leader(follower.url)
    running = [{"id": f"r-{i:05d}", "attempt": 1} for i in range(100)]
    for i in range(40):
        expect(http("PUT", f"{leader.url}/workers/wide-{i}",
                    {"instance": "i1", "running": running}, JSON), 200, "heartbeat")
    direct = expect(http("GET", leader.url + "/cluster"), 200, "cluster from the leader")
    assert len(direct.body) > 64 * 1024, len(direct.body)
    r = http("GET", follower.url + "/cluster")
    assert r.status == 502 and r.json()["type"].endswith("/reply-too-large"), \
        f"a {len(direct.body)}-byte reply through a node allowing 64 KiB: {r.status} {r.text[:200]}"
    expect(http("GET", follower.url + "/healthz"), 200, "the follower is fine")


if __name__ == "__main__":
    run_tests(globals())
