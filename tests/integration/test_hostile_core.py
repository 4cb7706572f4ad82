"""Hostile clients and workers against the core (issue 13): ids crafted to
collide in the leader's tables, a worker acting for another, a manager that
cannot be reached. Each test sends the hostile requests themselves to real
processes on a private PostgreSQL, and bounds what they may cost."""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import free_port, http, run_tests, wait_leader  # noqa: E402
from workd import JSON, expect  # noqa: E402

# ---- hash flooding (13.2)

M32 = 0xFFFFFFFF
FNV_PRIME_LOW = 1099511628211 & M32
FNV_OFFSET_LOW = 1469598103934665603 & M32
ID_CHARS = b"abcdefghijklmnopqrstuvwxyz0123456789"
TO_ID_CHARS = bytes(ID_CHARS[i % len(ID_CHARS)] for i in range(256))


def fnv_low(h, data):
    """The low 32 bits of FNV-1a (the leader's old, unkeyed table hash) after
    data, from a state whose low 32 bits are h: they depend on nothing else."""
    for c in data:
        h = ((h ^ c) * FNV_PRIME_LOW) & M32
    return h


def colliding_ids(prefix, stages, seed=13):
    """2**stages valid work ids whose FNV-1a hashes share their low 32 bits, so
    that they all fall on one slot of any table the old hash addressed: a
    birthday search finds two 8-character blocks that collide from the current
    state, and every choice of one block per stage gives an id."""
    rnd = random.Random(seed)
    h = fnv_low(FNV_OFFSET_LOW, prefix.encode())
    pairs = []
    for _ in range(stages):
        seen = {}
        while True:
            block = rnd.randbytes(8).translate(TO_ID_CHARS)
            v = fnv_low(h, block)
            if seen.setdefault(v, block) != block:
                pairs.append((seen[v].decode(), block.decode()))
                h = v
                break
    return [prefix + "".join(pairs[i][(n >> i) & 1] for i in range(stages))
            for n in range(1 << stages)]


def test_ids_crafted_to_collide_do_not_stall_the_leader(cluster):
    """32,768 valid ids that collided in the leader's tables made a cancel (and
    everything sent meanwhile) wait about 2 s. With a keyed hash they are ids
    like any others: a cancel and a submission answer as fast as on an empty
    leader, within a bound far under what the collision cost."""
    ids = colliding_ids("flood-", 15)
    assert len({fnv_low(FNV_OFFSET_LOW, i.encode()) for i in ids}) == 1, \
        "the crafted ids should collide under FNV-1a"
    s = cluster.start_server("s1", extra_args=["--max-batch", "2000"])
    wait_leader(s.url)
    for i in range(0, len(ids), 2000):
        batch = [{"id": wid, "payload": 1} for wid in ids[i:i + 2000]]
        expect(http("POST", s.url + "/work", batch, JSON, timeout=120), 202,
               f"submitting crafted ids {i}..{i + len(batch)}")
    # The first id sits at the head of the run the old hash made: deleting it
    # re-placed every other one.
    t0 = time.monotonic()
    expect(http("DELETE", f"{s.url}/work/{ids[0]}"), 200, "cancel of a crafted id")
    cancel_s = time.monotonic() - t0
    t0 = time.monotonic()
    expect(http("POST", s.url + "/work", {"id": ids[1] + "x", "payload": 1}, JSON), 202,
           "a submission after the flood")
    submit_s = time.monotonic() - t0
    assert cancel_s < 0.5 and submit_s < 0.5, (
        f"after {len(ids)} colliding ids a cancel took {cancel_s:.3f}s and a submission "
        f"{submit_s:.3f}s: the leader's tables degrade under crafted ids")


# ---- a worker acting for another (13.3)

ADMIN = "admin-token-hostile-core-01"
SHARED = "worker-token-shared-by-all-02"
BOUND_A = "worker-token-bound-to-wa-03"
BOUND_B = "worker-token-bound-to-wb-04"
TOKENS = f"client,admin:{ADMIN} worker:{SHARED} worker[wa-*]:{BOUND_A} worker[wb]:{BOUND_B}"


def bearer(token):
    return {**JSON, "Authorization": f"Bearer {token}"}


def call(method, url, body=None, token=SHARED):
    return http(method, url, body, bearer(token))


def reports_as(url, worker, token, reports, instance=None):
    body = {"reports": reports}
    if instance:
        body["instance"] = instance
    r = expect(call("POST", f"{url}/workers/{worker}/reports", body, token), 200,
               f"reports sent as {worker}")
    return r.json()["results"]


def problem_type(resp):
    return resp.json().get("type", "").rsplit("/", 1)[-1]


def test_a_worker_cannot_act_for_another(cluster):
    """With a worker token one could complete another worker's attempt with
    any result, or fail it for good, or end all its attempts by registering or
    deregistering its id. Reports are now bound to the worker and instance that
    hold the attempt, a live worker id to its instance, and a token may be
    bound to worker ids."""
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    u = s.url
    wid = expect(call("POST", u + "/work", {"id": "victim", "payload": 1}, ADMIN), 202,
                 "submit").json()["id"]
    expect(call("PUT", u + "/workers/wb", {"instance": "ib-7f3a", "capacity": 1}), 200,
           "wb registers")
    jobs = expect(call("POST", u + "/workers/wb/pull", {"instance": "ib-7f3a", "max": 1}), 200,
                  "wb pulls").json()["jobs"]
    assert [j["id"] for j in jobs] == [wid], f"wb should hold the work: {jobs}"
    done = [{"id": wid, "attempt": 1, "outcome": "completed", "result": "forged"}]
    dead = [{"id": wid, "attempt": 1, "outcome": "failed", "error": "x", "retry": False}]

    # Reports of wb's attempt by anyone else, with the shared token.
    for who, inst, rep in (("wa-1", None, done), ("wa-1", "ia", dead), ("wb", None, done),
                           ("wb", "forged-instance", dead)):
        res = reports_as(u, who, SHARED, rep, inst)[0]
        assert not res["accepted"] and res["reason"] == "not-holder", \
            f"a report of wb's attempt sent as {who} (instance {inst}) should be refused: {res}"
    r = call("POST", f"{u}/work/{wid}/attempts/1/complete", {"worker_id": "wb", "result": 1})
    assert r.status == 409 and problem_type(r) == "attempt-not-held", \
        f"a single-report completion as wb without its instance: {r.status} {r.text}"
    # Taking over or deregistering wb's live id with the shared token.
    r = call("PUT", u + "/workers/wb", {"instance": "evil", "capacity": 1})
    assert r.status == 409 and problem_type(r) == "worker-id-taken", \
        f"re-registering wb as another instance: {r.status} {r.text}"
    r = call("POST", u + "/workers/wb/pull", {"instance": "evil", "max": 1})
    assert r.status == 409 and problem_type(r) == "worker-id-taken", f"pull as wb: {r.text}"
    for q in ("", "?instance=evil"):
        r = call("DELETE", f"{u}/workers/wb{q}")
        assert r.status == 409 and problem_type(r) == "worker-id-taken", \
            f"deregistering wb ({q or 'no instance'}): {r.status} {r.text}"
    w = expect(call("GET", f"{u}/work/{wid}", token=ADMIN), 200, "get").json()
    assert w["status"] == "running" and w["attempts"] == 1, f"wb's attempt was touched: {w}"

    # Tokens bound to worker ids act for those only.
    for method, path, body in (("PUT", "/workers/wb", {"instance": "x", "capacity": 1}),
                               ("POST", "/workers/wb/pull", {"instance": "x", "max": 1}),
                               ("POST", "/workers/wb/reports", {"reports": done}),
                               ("DELETE", "/workers/wb", None),
                               ("POST", f"/work/{wid}/attempts/1/fail",
                                {"worker_id": "wb", "retry": False})):
        r = call(method, u + path, body, BOUND_A)
        assert r.status == 403, f"{method} {path} with a token bound to wa-*: {r.status} {r.text}"
    expect(call("PUT", u + "/workers/wa-2", {"instance": "i", "capacity": 1}, BOUND_A), 200,
           "a token bound to wa-* registers wa-2")

    # The holder's own report stands.
    res = reports_as(u, "wb", SHARED, [{**done[0], "result": "genuine"}], "ib-7f3a")[0]
    assert res["accepted"] and res["status"] == "completed", f"wb's own report: {res}"
    w = expect(call("GET", f"{u}/work/{wid}", token=ADMIN), 200, "get").json()
    assert w["result"] == "genuine", f"the result should be wb's: {w}"

    # A token bound to wb owns the id: a new instance takes over, as a restart.
    wid2 = expect(call("POST", u + "/work", {"id": "second", "payload": 2}, ADMIN), 202,
                  "submit").json()["id"]
    expect(call("POST", u + "/workers/wb/pull", {"instance": "ib-7f3a", "max": 1}, BOUND_B), 200,
           "wb pulls again")
    expect(call("PUT", u + "/workers/wb", {"instance": "ib-restarted", "capacity": 1}, BOUND_B),
           200, "wb restarted, with its bound token")
    w = expect(call("GET", f"{u}/work/{wid2}", token=ADMIN), 200, "get").json()
    assert w["status"] in ("scheduled", "pending") and "restarted" in (w["last_error"] or ""), \
        f"the restart should end the old instance's attempt: {w}"


# ---- a leader nobody can reach (13.10)

def test_a_node_that_can_lead_serves_http(cluster):
    """A node with only the manager role won elections and served no HTTP:
    every forwarded request then failed while the front-ends looked ready. A
    manager must answer at its advertise URL, so the manager role alone is a
    configuration error; a front-end-only node never leads."""
    import subprocess
    front = cluster.start_server("front", extra_args=["--roles", "frontend"])
    port = free_port()
    m = cluster.start_process("manager-only", [
        str(cluster.bin_dir / "workd-server"), "--listen", f"127.0.0.1:{port}",
        "--advertise-url", f"http://127.0.0.1:{port}", "--database-url", cluster.db_url,
        "--node-id", "manager-only", "--roles", "manager"])
    try:
        m.popen.wait(10)
    except subprocess.TimeoutExpired:
        pass
    log = m.log_text()
    assert m.returncode == 2, (f"a manager-only node should refuse to start (exit 2), "
                               f"it is {'running' if m.alive() else m.returncode}; "
                               f"/readyz of the front-end: "
                               f"{http('GET', front.url + '/readyz').text[:200]}")
    assert "--roles" in log and "HTTP" in log, f"the refusal should say why: {log[-500:]}"
    # The front-end-only node never leads; a full node does, and serves.
    r = http("GET", front.url + "/readyz")
    assert r.status == 503, f"no leader yet, the front-end should not be ready: {r.text}"
    full = cluster.start_server("full")
    wait_leader(front.url)
    assert http("GET", front.url + "/readyz").json()["leader"] == full.url
    expect(http("POST", front.url + "/work", {"payload": 1}, JSON), 202,
           "a submission through the front-end-only node")



def test_a_follower_forwards_every_query_argument(cluster):
    """A leader-only route behind a follower sees the query its client sent:
    a deregistration names its instance in the query, and the follower used
    to pass on only the arguments it knew (the instance was dropped, so a
    worker id held by a live instance could not be deregistered through it)."""
    a = cluster.start_server("a", extra_args=["--election-interval", "100ms"])
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=["--election-interval", "100ms"])
    wait_leader(b.url)
    follower = b.url if leader_url(a.url) == a.url else a.url
    expect(http("PUT", follower + "/workers/wq", {"instance": "i-live", "capacity": 1}, JSON),
           200, "register through the follower")
    r = http("DELETE", follower + "/workers/wq?instance=i-other")
    assert r.status == 409, f"another instance, through the follower: {r.status} {r.text}"
    expect(http("DELETE", follower + "/workers/wq?instance=i-live"), 204,
           "deregister the live instance through the follower")


def leader_url(url):
    return http("GET", url + "/cluster").json()["leader"]

if __name__ == "__main__":
    run_tests(globals())
