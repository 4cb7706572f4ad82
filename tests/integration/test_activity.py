"""The dashboard's chart and backlog per key come from the database, not from a
node's memory: GET /activity (work accepted, completed, failed, dead and
cancelled per queue and 10-second bucket, added up by the leader's append in
the same transaction as the events) answers the same on every node and after
a restart of every node; GET /queues/{queue}/keys shows the keys with the
most ready work and adds up the rest. /metrics labels a bounded number of
queues, whatever names clients choose."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, complete, pull, report, submit, wait_status  # noqa: E402

KINDS = ("accepted", "completed", "failed", "dead", "cancelled")


def activity(url, minutes=60):
    r = http("GET", f"{url}/activity?minutes={minutes}")
    assert r.status == 200, f"GET /activity: {r.status} {r.text}"
    return r.json()


def totals(act, queue):
    q = act["queues"].get(queue)
    return {k: sum(q[k]) if q else 0 for k in KINDS}


def by_bucket(act):
    """{(queue, bucket index from the start's time, kind): n} for every count but 0."""
    from datetime import datetime
    start = datetime.fromisoformat(act["start"].replace("Z", "+00:00")).timestamp()
    out = {}
    for q, kinds in act["queues"].items():
        for k, arr in kinds.items():
            for i, n in enumerate(arr):
                if n:
                    out[(q, int(start) + i * act["bucket_seconds"], k)] = n
    return out


def test_activity_survives_a_restart_of_every_node(cluster):
    a = cluster.start_server("a")
    wait_leader(a.url)
    b = cluster.start_server("b")
    for i in range(5):
        submit(a.url, {"id": f"ok-{i}", "payload": i, "queue": "chart"})
    submit(a.url, {"id": "dies", "payload": 0, "queue": "chart", "max_attempts": 2})
    submit(a.url, {"id": "gone", "payload": 0, "queue": "chart"})
    submit(a.url, {"id": "elsewhere", "payload": 0, "queue": "other"})
    assert http("DELETE", a.url + "/work/gone").status == 200
    done = 0
    while done < 7:
        for j in pull(a.url, "w1", max_jobs=10, wait=1, queues=["chart"]):
            done += 1
            if j["id"] == "dies":
                report(a.url, "w1", [{"id": "dies", "attempt": j["attempt"],
                                      "outcome": "failed", "error": "no"}])
            else:
                complete(a.url, "w1", j, "ok")
    wait_status(a.url, "dies", "dead")
    want = {"accepted": 7, "completed": 5, "failed": 2, "dead": 1, "cancelled": 1}
    act = activity(a.url)
    assert act["bucket_seconds"] == 10 and act["buckets"] == 360, act
    assert all(len(arr) == 360 for arr in act["queues"]["chart"].values()), act
    assert totals(act, "chart") == want, totals(act, "chart")
    assert totals(act, "other") == {"accepted": 1, "completed": 0, "failed": 0, "dead": 0,
                                    "cancelled": 0}
    before = by_bucket(act)
    assert by_bucket(activity(b.url)) == before, "a standby answers another chart"
    a.kill()
    b.kill()
    cluster.restart_server(b)
    cluster.restart_server(a)
    wait_leader(b.url)
    for node in (a, b):
        after = activity(node.url)
        got = {k: v for k, v in by_bucket(after).items() if k[0] in ("chart", "other")}
        assert got == before, f"{node.name} after the restart: {got} != {before}"
    small = activity(a.url, minutes=1)
    assert small["buckets"] == 6 and all(len(x) == 6 for q in small["queues"].values()
                                         for x in q.values()), small
    for bad in ("0", "61", "x", "-1"):
        r = http("GET", f"{a.url}/activity?minutes={bad}")
        assert r.status == 400 and "minutes" in r.json()["detail"], r.text


def test_backlog_per_key_is_bounded(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    items = []
    for k in range(6):
        items += [{"payload": i, "queue": "kq", "key": f"k{k}"} for i in range(k + 1)]
    items += [{"payload": 0, "queue": "kq"}, {"payload": 0, "queue": "kq"}]
    r = http("POST", s.url + "/work", items, JSON)
    assert r.status == 202, r.text
    assert len(pull(s.url, "w1", max_jobs=1, queues=["kq"])) == 1  # one running: k0's turn
    r = http("GET", s.url + "/queues/kq/keys?limit=3")
    assert r.status == 200, r.text
    got = r.json()
    assert got["queue"] == "kq", got
    assert [(x["key"], x["pending"]) for x in got["keys"]] == [("k5", 6), ("k4", 5), ("k3", 4)], got
    # The rest: k2 (3), k1 (2), no key (2), k0 (0 ready, 1 running).
    assert got["other"] == {"keys": 4, "pending": 7, "scheduled": 0, "running": 1}, got
    empty = http("GET", s.url + "/queues/nothing/keys").json()
    assert empty == {"queue": "nothing", "keys": [],
                     "other": {"keys": 0, "pending": 0, "scheduled": 0, "running": 0}}, empty
    assert http("GET", s.url + "/queues/kq/keys?limit=0").status == 400
    assert http("GET", s.url + "/queues/kq/keys?limit=101").status == 400

    # Thirteen keys: /metrics shows ten and adds up the rest (x4, x5 and k0).
    http("POST", s.url + "/work", [{"payload": 0, "queue": "kq", "key": f"x{i}"}
                                   for i in range(6)], JSON)

    def metrics():
        return http("GET", s.url + "/metrics").text

    wait_until(lambda: 'workd_queue_key_backlog{queue="kq",key="k5"} 6' in metrics(), 10,
               what="the backlog of k5 in /metrics")
    m = metrics()
    keyed = [line for line in m.splitlines() if line.startswith("workd_queue_key_backlog{")]
    assert len(keyed) <= 11, f"more than 10 keys and other for one queue: {keyed}"
    assert len(keyed) == 11, keyed
    assert 'workd_queue_key_backlog{queue="kq",key="(other)"} 2' in m, keyed
    assert 'workd_queue_key_running{queue="kq",key="(other)"} 1' in m, m
    assert 'workd_queue_key_backlog{queue="kq",key="(none)"} 2' in m, keyed


def test_limit_state_in_metrics(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    assert http("PUT", s.url + "/queues/lim", {"paused": True, "max_running": 3,
                                              "rate": {"limit": 5, "per": 1}}, JSON).status == 200
    m = http("GET", s.url + "/metrics").text
    for line in ('workd_queue_paused{queue="lim"} 1', 'workd_queue_max_running{queue="lim"} 3',
                 'workd_queue_rate_limit_per_second{queue="lim"} 5'):
        assert line in m, f"{line!r} not in /metrics"
    assert 'workd_queue_rate_tokens{queue="lim"}' in m, "the leader's tokens are missing"


def test_metrics_label_a_bounded_number_of_queues(cluster):
    """Each queue name a client submits to would be a label value of every
    queue family: /metrics gives series of their own to the queues whose
    flow control an operator set and to the --metrics-queues (100) others
    with the most open work, and adds up the rest as queue="(other)", so a
    client naming queues by the hundred cannot make it grow without end."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    assert http("PUT", s.url + "/queues/ops", {"paused": False}, JSON).status == 200
    # 150 queues of one job each, "busy" with three, "ops" with one (set).
    items = [{"payload": i, "queue": f"n{i:03d}"} for i in range(150)]
    items += [{"payload": i, "queue": "busy"} for i in range(3)] + [{"payload": 0, "queue": "ops"}]
    r = http("POST", s.url + "/work", items, JSON)
    assert r.status == 202, r.text
    m = http("GET", s.url + "/metrics").text

    def queues(family):
        return set(re.findall(rf'^{family}{{queue="([^"]+)"', m, re.M))

    depth = queues("workd_queue_depth")
    assert len(depth) == 100 + 2, \
        f"100 queues, 'ops' (set) and '(other)' should have series: {len(depth)} do"
    assert {"busy", "ops", "(other)"} <= depth, sorted(depth)[:10]
    assert queues("workd_queue_oldest_pending_age_seconds") == depth
    assert queues("workd_queue_key_backlog") == depth, "the backlog labels the same queues"
    pending = {q: int(n) for q, n in re.findall(
        r'^workd_queue_depth\{queue="([^"]+)",state="pending"\} (\d+)$', m, re.M)}
    assert pending["busy"] == 3 and pending["ops"] == 1, pending
    assert pending["(other)"] == 51 and sum(pending.values()) == 154, \
        f"the 51 queues without series are added up: {pending['(other)']}, {sum(pending.values())}"
    assert re.search(r"^workd_queues_other 51$", m, re.M), "workd_queues_other should say 51"
    backlog = re.findall(r'^workd_queue_key_backlog\{queue="\(other\)",key="\(other\)"\} (\d+)$',
                         m, re.M)
    assert backlog == ["51"], f"the other queues' backlog is one sample: {backlog}"


if __name__ == "__main__":
    run_tests(globals())
