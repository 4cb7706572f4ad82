"""Signed webhooks: results POSTed to a receiver on loopback that fails its first
attempts, is slow, then is down for 10 s, across a leader killed with SIGKILL:
every result delivered, every signature valid (checked here with hmac),
order per subscription kept, duplicates only with the same webhook-id. A
subscription that keeps failing is paused and says why; the API shows
cursors, lag and errors."""

import base64
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import free_port, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect, leader_of, submit, wait_new_leader  # noqa: E402

FAST = ["--election-interval", "100ms", "--worker-timeout", "3s", "--heartbeat-interval", "500ms",
        "--webhook-backoff-base", "100ms", "--webhook-backoff-max", "1s",
        "--webhook-timeout", "3s",
        # The receivers here listen on loopback, which is refused by default.
        "--webhook-allow-networks", "127.0.0.0/8"]


def new_secret():
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def verify(secret, headers, body):
    """The Standard Webhooks check a receiver makes (docs/webhooks.md)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, sig.split(",", 1)[1])
               for sig in headers["webhook-signature"].split() if sig.startswith("v1,"))


class Receiver:
    """A webhook receiver on loopback. Records every delivery it answers 2xx,
    per path; `fail` answers 500 to the next N, `delay` sleeps before
    answering, down() closes the port and up() opens it again."""

    def __init__(self, secrets_by_path):
        self.port = free_port()
        self.secrets = secrets_by_path
        self.lock = threading.Lock()
        self.accepted = {p: [] for p in secrets_by_path}
        self.refused = 0
        self.bad_signatures = []
        self.fail = 0
        self.delay = 0.0
        self.server = None
        self.up()

    def handler(self):
        rcv = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hdrs = {k.lower(): v for k, v in self.headers.items()}
                secret = rcv.secrets.get(self.path)
                if secret is None or not verify(secret, hdrs, body):
                    with rcv.lock:
                        rcv.bad_signatures.append((self.path, hdrs, body))
                    self.send_response(401)
                    self.end_headers()
                    return
                with rcv.lock:
                    failing = rcv.fail > 0
                    rcv.fail -= failing
                    delay = rcv.delay
                if failing:
                    with rcv.lock:
                        rcv.refused += 1
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"not now")
                    return
                time.sleep(delay)  # a declared delay: a slow receiver, part 2 of the test
                with rcv.lock:
                    rcv.accepted[self.path].append(
                        {"id": hdrs["webhook-id"], "body": body, "msg": json.loads(body)})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass
        return H

    def up(self):
        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()

    def ids(self, path):
        with self.lock:
            return {d["id"] for d in self.accepted[path]}


def put_sub(url, name, body, status=200):
    return expect(http("PUT", f"{url}/subscriptions/{name}", body, JSON), status,
                  f"PUT /subscriptions/{name}").json()


def check_deliveries(rcv, path, want_ids):
    """Everything delivered, signatures valid, order kept, duplicates identical."""
    got = rcv.accepted[path]
    assert {d["id"] for d in got} == want_ids, \
        f"{path}: delivered {sorted(d['id'] for d in got)}, want {sorted(want_ids)}"
    first, seen = [], {}
    for d in got:
        if d["id"] in seen:
            assert seen[d["id"]] == d["body"], f"{path}: a repeat of {d['id']} with another body"
            continue
        seen[d["id"]] = d["body"]
        first.append(d["msg"]["data"]["seq"])
        assert d["id"] == f"msg_{d['msg']['data']['seq']}", d
    assert first == sorted(first), f"{path}: deliveries out of seq order: {first}"
    return len(got) - len(seen)


def test_deliveries_survive_failures_and_a_leader_kill(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST)
    wait_leader(b.url)
    leader = {a.url: a, b.url: b}[leader_of([a.url, b.url])]
    other = b if leader is a else a
    s_all, s_q2 = new_secret(), new_secret()
    rcv = Receiver({"/all": s_all, "/q2": s_q2})
    base = f"http://127.0.0.1:{rcv.port}"
    put_sub(other.url, "all", {"url": base + "/all", "secret": s_all})
    sub = put_sub(leader.url, "q2", {"url": base + "/q2", "secret": s_q2, "queues": ["q2"],
                                     "kinds": ["completed"]})
    assert "secret" not in sub and sub["queues"] == ["q2"] and sub["kinds"] == ["completed"], sub
    cluster.start_worker("wk", other.url, ["--exec", "cat", "--concurrency", "4"])

    ids = []

    def work(n, url):
        for _ in range(n):
            i = len(ids)
            ids.append(f"w{i}")
            submit(url, {"id": f"w{i}", "payload": i, "queue": "q2" if i % 3 == 0 else "q1"})

    # 1. The receiver refuses its first attempts.
    rcv.fail = 4
    work(8, leader.url)
    wait_until(lambda: len(rcv.ids("/all")) >= 8, 30, what="the first results after refusals")
    assert rcv.refused == 4, rcv.refused
    # 2. Slow answers.
    rcv.delay = 0.3
    work(6, other.url)
    wait_until(lambda: len(rcv.ids("/all")) >= 14, 30, what="results from a slow receiver")
    rcv.delay = 0.0
    # 3. Down for 10 s; the leader is killed meanwhile.
    rcv.down()
    down_at = time.monotonic()
    work(6, leader.url)
    wait_until(lambda: expect(http("GET", other.url + "/subscriptions/all"), 200,
                              "GET a subscription").json(), 10,
               until=lambda st: st["last_error"] and st["failures"] >= 1 and st["lag"] > 0,
               what="a failing subscription to show its error and lag")
    leader.kill()
    new_url, _ = wait_new_leader([a.url, b.url], not_url=leader.url)
    work(6, new_url)
    # A declared window: the receiver stays down for 10 s in all, across the failover.
    time.sleep(max(0.0, down_at + 10 - time.monotonic()))
    rcv.up()
    want_all = set()
    want_q2 = set()
    wait_until(lambda: len(rcv.ids("/all")) >= len(ids), 60,
               what="every result at the receiver after it came back")
    # What the log says was published, by subscription.
    rows = json.loads(cluster.psql(
        "SELECT json_agg(json_build_object('seq', seq, 'type', type, 'queue', data->>'queue')) "
        "FROM workd_events WHERE type IN ('completed', 'dead', 'cancelled')"))
    for r in rows:
        want_all.add(f"msg_{r['seq']}")
        if r["queue"] == "q2" and r["type"] == "completed":
            want_q2.add(f"msg_{r['seq']}")
    wait_until(lambda: rcv.ids("/q2") == want_q2, 30, what="every q2 result at /q2")
    assert not rcv.bad_signatures, f"deliveries with a bad signature: {rcv.bad_signatures[:2]}"
    assert len(want_all) == len(ids), f"{len(ids)} submitted, {len(want_all)} finished"
    repeats = check_deliveries(rcv, "/all", want_all)
    check_deliveries(rcv, "/q2", want_q2)
    # A failover repeats at most what the last recorded cursor did not cover.
    assert repeats <= 12, f"{repeats} deliveries repeated after the failover: a flood"
    # The survivor shows the subscriptions caught up.
    wait_until(lambda: http("GET", new_url + "/subscriptions").json()["subscriptions"][0]["lag"]
               == 0, 20, what="the subscription's lag to reach 0")
    listing = http("GET", new_url + "/subscriptions").json()["subscriptions"]
    assert [s["name"] for s in listing] == ["all", "q2"], listing
    assert all(s["last_error"] is None or s["failures"] == 0 for s in listing), listing


def test_failing_subscription_is_paused_and_managed(cluster):
    srv = cluster.start_server("s1", extra_args=FAST + ["--webhook-pause-after", "2s"])
    wait_leader(srv.url)
    secret = new_secret()
    port = free_port()  # nothing listens here yet
    url = f"http://127.0.0.1:{port}/hook"
    # Bad requests are refused with a problem that says what to fix.
    r = http("PUT", srv.url + "/subscriptions/h", {"url": url, "secret": "hunter2"}, JSON)
    assert r.status == 400 and "whsec_" in r.json()["detail"], r.text
    r = http("PUT", srv.url + "/subscriptions/h", {"url": "ftp://x", "secret": secret}, JSON)
    assert r.status == 400 and "url" in r.json()["detail"], r.text
    r = http("PUT", srv.url + "/subscriptions/h", {"url": url, "secret": secret, "kinds": ["x"]},
             JSON)
    assert r.status == 400 and "kinds" in r.json()["detail"], r.text
    expect(http("GET", srv.url + "/subscriptions/nope"), 404, "GET an unknown subscription")
    expect(http("DELETE", srv.url + "/subscriptions/nope"), 404, "DELETE an unknown subscription")

    put_sub(srv.url, "h", {"url": url, "secret": secret, "after": 0})
    submit(srv.url, {"id": "x1", "payload": 1})
    expect(http("DELETE", srv.url + "/work/x1"), 200, "cancel x1")

    def paused():
        s = http("GET", srv.url + "/subscriptions/h").json()
        return s["paused"] and s["paused_reason"]
    wait_until(paused, 20, what="the failing subscription to be paused")
    s = http("GET", srv.url + "/subscriptions/h").json()
    assert "failing since" in s["paused_reason"] and s["last_error"], s
    assert s["cursor"] < s["delivered_upto"] + 1 and s["lag"] > 0, s
    # Recorded: a restart keeps it paused, with its reason.
    srv.stop()
    cluster.restart_server(srv)
    wait_leader(srv.url)
    s = http("GET", srv.url + "/subscriptions/h").json()
    assert s["paused"] and "failing since" in s["paused_reason"], s
    # A receiver comes up; PUT resumes the subscription, which delivers.
    rcv = Receiver({"/hook": secret})
    rcv.down()
    rcv.port = port
    rcv.up()
    put_sub(srv.url, "h", {"url": url, "secret": secret})
    wait_until(lambda: len(rcv.ids("/hook")) == 1, 20, what="the delivery after resuming")
    assert rcv.accepted["/hook"][0]["msg"]["type"] == "work.cancelled", rcv.accepted
    gone = expect(http("DELETE", srv.url + "/subscriptions/h"), 200, "DELETE h").json()
    assert gone["name"] == "h" and gone["deleted"] is True, gone
    expect(http("GET", srv.url + "/subscriptions/h"), 404, "GET a deleted subscription")


if __name__ == "__main__":
    run_tests(globals())
