"""workd-specific helpers for integration tests: the API calls tests make
over and over, each checking its status and saying what went wrong."""

import json
import re
import threading
import time

from harness import http, wait_until

JSON = {"Content-Type": "application/json"}


def expect(resp, status, what):
    """Assert resp.status == status, showing the body when it is not."""
    assert resp.status == status, f"{what}: expected HTTP {status}, got {resp.status}: {resp.text[:500]}"
    return resp


def submit(url, item, headers=None, status=202):
    r = http("POST", url + "/work", item, {**JSON, **(headers or {})})
    return expect(r, status, f"POST /work {json.dumps(item)[:200]}").json()


def get_work(url, work_id, wait=None):
    q = f"?wait={wait}" if wait is not None else ""
    r = http("GET", f"{url}/work/{work_id}{q}", timeout=(wait or 0) + 30)
    return expect(r, 200, f"GET /work/{work_id}").json()


def heartbeat(url, worker, capacity=1, instance="i1", queues=None, running=()):
    body = {"instance": instance, "capacity": capacity, "running": list(running)}
    if queues is not None:
        body["queues"] = queues
    r = http("PUT", f"{url}/workers/{worker}", body, JSON)
    return expect(r, 200, f"heartbeat of {worker}").json()


def pull(url, worker, max_jobs=1, wait=0, instance="i1", queues=None):
    body = {"instance": instance, "max": max_jobs, "wait": wait}
    if queues is not None:
        body["queues"] = queues
    r = http("POST", f"{url}/workers/{worker}/pull", body, JSON, timeout=wait + 30)
    return expect(r, 200, f"pull by {worker}").json()["jobs"]


def pull_in_background(url, worker, **kw):
    """pull() on a thread of its own: returns (thread, got); once the thread is
    joined, got["jobs"] is its answer and got["took"] how long it took (s)."""
    got = {}

    def run():
        t0 = time.monotonic()
        got["jobs"] = pull(url, worker, **kw)
        got["took"] = time.monotonic() - t0
    t = threading.Thread(target=run)
    t.start()
    return t, got


def report(url, worker, reports):
    r = http("POST", f"{url}/workers/{worker}/reports", {"reports": reports}, JSON)
    return expect(r, 200, f"reports by {worker}").json()["results"]


def complete(url, worker, job, result):
    return report(url, worker, [{"id": job["id"], "attempt": job["attempt"],
                                 "outcome": "completed", "result": result}])[0]


def wait_status(url, work_id, status, timeout=20):
    """Poll GET /work/{id} until its status is `status`; return the work."""
    return wait_until(lambda: get_work(url, work_id), timeout,
                      until=lambda w: w["status"] == status, what=f"work {work_id} to be {status}")


def refused_as_history(cluster, sql):
    """The database refuses sql because history is append-only."""
    try:
        cluster.psql(sql)
    except RuntimeError as e:
        assert "append-only" in str(e), f"{sql}: refused, but not as history: {e}"
    else:
        raise AssertionError(f"the database accepted: {sql}")


def events_of(cluster, types=None):
    """Rows of the event table as dicts, oldest first."""
    where = ""
    if types:
        where = "WHERE type IN (" + ",".join(f"'{t}'" for t in types) + ")"
    out = cluster.psql("SELECT coalesce(json_agg(json_build_object('seq', seq, 'term', term, "
                       "'type', type, 'work_id', work_id, 'data', data) ORDER BY seq), '[]') "
                       f"FROM workd_events {where}")
    return json.loads(out)


def completions_by_id(cluster):
    """{work_id: number of completed events} from the event log."""
    rows = cluster.psql("SELECT work_id, count(*) FROM workd_events WHERE type = 'completed' "
                        "GROUP BY work_id")
    counts = {}
    for line in rows.splitlines():
        wid, n = line.split("|")
        counts[wid] = int(n)
    return counts


def leader_of(urls):
    """The URL among `urls` whose /readyz says it is the leader, or None."""
    for u in urls:
        try:
            r = http("GET", u + "/readyz", timeout=2)
            if r.status == 200 and r.json().get("is_leader"):
                return u
        except OSError:
            pass
    return None


def wait_new_leader(urls, not_url=None, timeout=15):
    t0 = time.monotonic()
    url = wait_until(lambda: leader_of([u for u in urls if u != not_url]), timeout,
                     what="a leader to be elected")
    return url, time.monotonic() - t0


def waiting_pulls(url):
    """The leader's workd_waiting_pulls gauge (None on a node that does not lead)."""
    text = expect(http("GET", url + "/metrics"), 200, "GET /metrics").text
    m = re.search(r"^workd_waiting_pulls (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def abandoned_pull(url, worker, wait=20, leader_url=None):
    """Opens a long-poll pull for `worker` and closes the connection without
    reading the answer, as a worker that dies while waiting does. It is closed
    once the leader (`leader_url`, when `url` is a follower) holds it waiting."""
    import socket
    from urllib.parse import urlparse
    u = urlparse(url)
    body = json.dumps({"instance": "i1", "max": 1, "wait": wait}).encode()
    before = waiting_pulls(leader_url or url)
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(f"POST /workers/{worker}/pull HTTP/1.1\r\nHost: x\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
              + body)
    wait_until(lambda: waiting_pulls(leader_url or url) > before, 10,
               what=f"the pull of {worker} to wait at the leader")
    s.close()


def sql_error(cluster, sql, url=None):
    """Runs sql, which must fail; returns the error text."""
    try:
        cluster.psql(sql, url)
    except RuntimeError as e:
        return str(e)
    raise AssertionError(f"the database accepted: {sql}")


def shard_of(queue: str, n: int) -> int:
    """The shard of `queue` in a cluster of n shards: FNV-1a 32 over the name's
    UTF-8 bytes, modulo n (0 when n <= 1). The Python copy of common/shard.c's
    shard_of_queue() and SQL's workd_shard_of(); test_couplings checks that
    they agree. It can never change: every cluster's data depends on it."""
    if n <= 1:
        return 0
    h = 2166136261
    for b in queue.encode("utf-8"):
        h ^= b
        h = (h * 16777619) & 0xffffffff
    return h % n
