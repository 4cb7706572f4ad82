"""Hostile input at workd's other ways in (issue 27, findings 4-6 and 8): a
payload submitted in SQL past the budgets of HTTP, a job no pull's answer
could carry, a caller's temporary tables standing in for workd's inside
workd.submit, webhooks pointed inside the network (by address and by name),
a receiver's answer echoed or read without end, secrets kept in the log,
names that URLs resolve away, and schedules without number. Each test sends
the hostile request itself to real processes on a private PostgreSQL."""

import base64
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import free_port, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect, pull, sql_error, submit  # noqa: E402

SMALL = 64 * 1024  # --max-body of the budget tests
SMALL_ARGS = ["--max-body", str(SMALL), "--max-reply-bytes", str(2 * SMALL),
              "--max-json-depth", "8"]


def nested(depth):
    return "[" * depth + "]" * depth


def app_role(cluster, name="app"):
    """A login role that may only submit (workd_submitter); its URL."""
    cluster.psql(f"CREATE ROLE {name} LOGIN; GRANT workd_submitter TO {name}")
    return cluster.db_url.replace("postgres@", f"{name}@", 1)


# ------------------------------------------------ 27.4 every way in, one budget

def test_sql_submit_keeps_the_budgets_of_http(cluster):
    """workd.submit took a 40 MB payload (HTTP refuses over --max-body) and
    one nested 5,000 deep, refused only by the leader after the application
    committed. Now both fail the caller's transaction, naming the limit."""
    s = cluster.start_server("s1", extra_args=SMALL_ARGS)
    wait_leader(s.url)
    url = app_role(cluster)
    cluster.psql("CREATE TABLE orders (id int); GRANT INSERT, SELECT ON orders TO app")
    big = json.dumps("x" * (SMALL + 10))
    err = sql_error(cluster, f"BEGIN; INSERT INTO orders VALUES (1);"
                             f" SELECT workd.submit('{big}', id => 'too-big'); COMMIT;", url)
    assert "'payload' is" in err and "--max-body" in err, err
    err = sql_error(cluster, f"SELECT workd.submit('{nested(5000)}', id => 'too-deep')", url)
    assert "nested more than 7" in err and "--max-json-depth" in err, err
    err = sql_error(cluster, f"SELECT workd.submit('{nested(8)}', id => 'deep-8')", url)
    assert "nested more than 7" in err, err
    assert cluster.psql("SELECT count(*) FROM orders") == "0", \
        "the application's transaction must fail with the submission"
    # Over HTTP the same payloads are refused too: the same budget.
    r = http("POST", s.url + "/work", {"id": "too-deep", "payload": json.loads(nested(8))}, JSON)
    assert r.status == 400, r.text
    # Within the budget it goes through, as over HTTP.
    fits = json.dumps("y" * (SMALL - 100))
    assert cluster.psql(f"SELECT workd.submit('{fits}', id => 'fits')", url) == "fits"
    assert cluster.psql(f"SELECT workd.submit('{nested(7)}', id => 'deep-7')", url) == "deep-7"
    for wid in ("fits", "deep-7"):
        wait_until(lambda: http("GET", f"{s.url}/work/{wid}").status == 200, 10,
                   what=f"{wid} taken from the inbox")
    assert cluster.psql("SELECT count(*) FROM workd_inbox") == "0"


def test_no_attempt_starts_that_cannot_be_delivered(cluster):
    """A pull through a follower answered 502 reply-too-large after the leader
    had started the attempt: the job could never reach such a worker and
    ended dead. Every way in now keeps a payload, as workd writes it, within
    --max-body, and --max-reply-bytes must hold one such job: an entry left in
    the inbox by an older schema, and a payload of numbers that grow when
    written out, are refused before they start."""
    leader = cluster.start_server("a", extra_args=SMALL_ARGS)
    wait_leader(leader.url)
    follower = cluster.start_server("b", extra_args=SMALL_ARGS)
    wait_leader(follower.url)
    # Written as an application on schema 15 could (the function refuses it now).
    cluster.psql(f"INSERT INTO workd_inbox (id, queue, priority, payload)"
                 f" VALUES ('legacy-big', 'big', 0, to_jsonb(repeat('z', {3 * SMALL})));"
                 f" NOTIFY workd_inbox")
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_inbox") == "0", 10,
               what="the inbox entry taken (refused)")
    assert http("GET", leader.url + "/work/legacy-big").status == 404, \
        "an entry no pull could carry was accepted"
    assert "legacy-big submitted in SQL is refused" in leader.log_text()
    # 0.1 is 3 bytes in the request and 19 as workd writes it.
    growing = [0.1] * (SMALL // 6)
    r = http("POST", follower.url + "/work", {"id": "growing", "payload": growing,
                                              "queue": "big"}, JSON)
    assert r.status == 413 and r.json()["type"].endswith("/payload-too-large"), r.text
    # Nothing was started that the follower cannot carry.
    r = http("POST", follower.url + "/workers/w1/pull",
             {"instance": "i1", "max": 5, "queues": ["big"]}, JSON)
    assert r.status == 200 and r.json()["jobs"] == [], r.text
    started = cluster.psql("SELECT count(*) FROM workd_events WHERE type = 'started'")
    assert started == "0", f"{started} attempts started"
    # Work accepted under a larger --max-body than the leader has now: no
    # pull's answer could carry it, so it is cancelled, never started.
    leader.stop()
    follower.stop()
    roomy = cluster.start_server("c", extra_args=["--max-body", str(4 * SMALL),
                                                  "--max-reply-bytes", str(8 * SMALL)])
    wait_leader(roomy.url)
    submit(roomy.url, {"id": "old-big", "payload": "o" * (3 * SMALL), "queue": "old"})
    roomy.stop()
    tight = cluster.start_server("d", extra_args=SMALL_ARGS)
    wait_leader(tight.url)
    assert pull(tight.url, "w2", max_jobs=5, queues=["old"]) == []
    w = http("GET", tight.url + "/work/old-big").json()
    assert w["status"] == "cancelled" and not w.get("attempts"), {k: v for k, v in w.items() if k != "payload"}
    assert "old-big is cancelled" in tight.log_text()


# ---------------------------------------------------- 27.6 the SQL function

def test_sql_submit_resolves_no_name_through_the_caller(cluster):
    """workd.submit's search path put the caller's temporary tables first: a
    temporary workd_inbox took the row (the work never existed), a temporary
    workd_open answered the conflict check. Now they are never consulted."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    url = app_role(cluster)
    out = cluster.psql(
        "CREATE TEMP TABLE workd_inbox (n bigserial, id text, queue text, priority int,"
        " payload jsonb, run_at timestamptz, timeout_ms bigint, max_attempts int,"
        " at timestamptz DEFAULT now());"
        " CREATE TEMP TABLE workd_open (id text, payload jsonb);"
        " INSERT INTO pg_temp.workd_open VALUES ('shadowed', '\"other\"');"
        " SELECT workd.submit('1', id => 'shadowed');"
        " SELECT count(*) FROM pg_temp.workd_inbox;", url)
    assert out.split()[-1] == "0", f"the caller's temporary workd_inbox took the row: {out}"
    wait_until(lambda: http("GET", s.url + "/work/shadowed").status == 200, 10,
               what="the work taken into workd's own inbox")
    assert cluster.psql("SELECT DISTINCT proconfig::text FROM pg_proc WHERE proname = 'submit'") == \
        '{"search_path=pg_catalog, pg_temp"}'
    # A conflict says what POST /work says to a client, nothing of the work.
    err = sql_error(cluster, "SELECT workd.submit('{\"secret\": 2}', id => 'shadowed')", url)
    r = http("POST", s.url + "/work", {"id": "shadowed", "payload": {"secret": 2}}, JSON)
    assert r.status == 409, r.text
    assert r.json()["detail"] in err and "DETAIL" not in err, \
        f"SQL: {err!r}; HTTP: {r.json()['detail']!r}"


# --------------------------------------------------------- 27.5 webhooks

class Receiver:
    """An HTTP server on loopback that records what it is sent and answers
    with `status` and `body_bytes` bytes of `fill` (streamed)."""

    def __init__(self, status=204, body_bytes=0, fill=b"x"):
        self.port = free_port()
        self.status, self.body_bytes, self.fill = status, body_bytes, fill
        self.got, self.sent, self.broken = [], 0, threading.Event()
        rcv = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                rcv.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(rcv.status)
                self.send_header("Content-Length", str(rcv.body_bytes))
                self.end_headers()
                chunk = (rcv.fill * 65536)[:65536]
                try:
                    left = rcv.body_bytes
                    while left > 0:
                        self.wfile.write(chunk[:left])
                        rcv.sent += min(left, len(chunk))
                        left -= len(chunk)
                except OSError:
                    rcv.broken.set()

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def new_secret():
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def put_sub(url, name, target, secret=None, status=200):
    return expect(http("PUT", f"{url}/subscriptions/{name}",
                       {"url": target, "secret": secret or new_secret(), "after": 0}, JSON),
                  status, f"PUT /subscriptions/{name} -> {target}")


def test_webhooks_refuse_internal_targets(cluster):
    """Loopback, private, link-local (cloud metadata), [::1] and 0.0.0.0
    targets were accepted, and a subscription to the node's own admin API was
    delivered. By default an address inside is refused at the PUT, and a
    name that resolves inside is refused when a delivery connects."""
    s = cluster.start_server("s1", extra_args=["--webhook-backoff-base", "100ms",
                                               "--webhook-backoff-max", "200ms"])
    wait_leader(s.url)
    rcv = Receiver()
    for target in (f"http://127.0.0.1:{rcv.port}/", "http://10.1.2.3/", "http://192.168.0.1/",
                   "http://172.16.0.1/", "http://169.254.169.254/latest/meta-data/",
                   "http://[::1]:8080/", "http://0.0.0.0:8080/", "http://[fd00::1]/",
                   "http://[::ffff:127.0.0.1]/", f"http://user:pw@127.0.0.1:{rcv.port}/",
                   f"{s.url}/queues/default/pause"):
        r = put_sub(s.url, "inside", target, status=400)
        assert r.json()["type"].endswith("/internal-target"), f"{target}: {r.text}"
    # A name that resolves to loopback passes the PUT, never the connection.
    put_sub(s.url, "by-name", f"http://localhost:{rcv.port}/hook")
    submit(s.url, {"id": "n1", "payload": 1})
    expect(http("DELETE", s.url + "/work/n1"), 200, "cancel n1")

    def refused():
        e = http("GET", s.url + "/subscriptions/by-name").json()["last_error"]
        return e and "loopback" in e and e
    err = wait_until(refused, 10, what="a delivery refused for its address")
    assert "--webhook-allow-networks" in err, err
    assert rcv.got == [], "the receiver inside was reached"
    rcv.close()


def test_webhook_answers_are_not_echoed_or_read_to_the_end(cluster):
    """Up to 4 KiB of the receiver's answer went into last_error (another
    service's data, for whoever reads /subscriptions), and a 200 MB answer
    was read in full. Now last_error holds the status only, and reading stops
    at a few KiB."""
    s = cluster.start_server("s1", extra_args=["--webhook-allow-networks", "127.0.0.1/32",
                                               "--webhook-backoff-base", "100ms",
                                               "--webhook-backoff-max", "200ms"])
    wait_leader(s.url)
    leaky = Receiver(status=500, body_bytes=3000, fill=b"INTERNAL-DATA ")
    put_sub(s.url, "leaky", f"http://127.0.0.1:{leaky.port}/")
    huge = Receiver(status=200, body_bytes=200 * 1024 * 1024)
    put_sub(s.url, "huge", f"http://127.0.0.1:{huge.port}/")
    submit(s.url, {"id": "a1", "payload": 1})
    expect(http("DELETE", s.url + "/work/a1"), 200, "cancel a1")
    err = wait_until(lambda: http("GET", s.url + "/subscriptions/leaky").json()["last_error"],
                     10, what="the leaky receiver's failure")
    assert err.endswith(": HTTP 500") and "INTERNAL" not in err, err
    assert huge.broken.wait(10), "the node kept reading a 200 MB answer"
    assert huge.sent < 32 * 1024 * 1024, f"{huge.sent} bytes of the answer were read"
    wait_until(lambda: http("GET", s.url + "/subscriptions/huge").json()["delivered"] >= 1, 10,
               what="a 2xx cut short still counts as delivered")
    sub = http("GET", s.url + "/subscriptions/huge").json()
    assert sub["last_error"] is None, sub
    leaky.close()
    huge.close()


def test_webhook_secrets_stay_out_of_the_log(cluster):
    """The signing secret was in the subscription event, kept for --retain and
    after the subscription was deleted, and GET /subscriptions showed the
    URL's credentials. Now the log keeps neither; deliveries still use both,
    across a restart."""
    s = cluster.start_server("s1", extra_args=["--webhook-allow-networks", "127.0.0.0/8"])
    wait_leader(s.url)
    rcv = Receiver()
    secret = new_secret()
    target = f"http://hook-user:hook-pass-42@127.0.0.1:{rcv.port}/in"
    shown = put_sub(s.url, "creds", target, secret).json()
    assert shown["url"] == f"http://***@127.0.0.1:{rcv.port}/in", shown
    listed = http("GET", s.url + "/subscriptions").json()["subscriptions"][0]
    assert "hook-pass-42" not in json.dumps(listed), listed
    logged = cluster.psql("SELECT string_agg(data::text, ' ') FROM workd_events"
                          " WHERE type = 'subscription'")
    assert logged and secret[6:] not in logged and "hook-pass-42" not in logged, logged
    s.stop()
    cluster.restart_server(s)
    wait_leader(s.url)
    submit(s.url, {"id": "c1", "payload": 1})
    expect(http("DELETE", s.url + "/work/c1"), 200, "cancel c1")
    wait_until(lambda: rcv.got, 10, what="a delivery after the restart")
    headers, body = rcv.got[0]
    assert headers.get("authorization") == "Basic " + base64.b64encode(
        b"hook-user:hook-pass-42").decode(), headers
    import hashlib
    import hmac
    key = base64.b64decode(secret[6:])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    mine = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == "v1," + mine, "signed with another key"
    expect(http("DELETE", s.url + "/subscriptions/creds"), 200, "DELETE creds")
    assert cluster.psql("SELECT count(*) FROM workd_subscriptions") == "0"
    rcv.close()


# ---------------------------------------------------------------- 27.8 names

def raw(port, method, path, body=b""):
    """The status of one request sent as written (no client resolves '..')."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    return int(data.split(b" ", 2)[1])


def test_dot_names_and_schedules_without_number(cluster):
    """'.' and '..' were valid schedule, subscription and queue names
    (PUT /queues/.. paused a queue no browser can address), the number of
    schedules was unbounded, and pausing a queue never seen made it without
    a word."""
    s = cluster.start_server("s1", extra_args=["--max-schedules", "2"])
    wait_leader(s.url)
    sched = json.dumps({"cron": "0 0 * * *", "work": {"payload": 1}}).encode()
    hook = json.dumps({"url": "https://example.com/", "secret": new_secret()}).encode()
    for name in (".", "..", "%2e", "%2E%2E"):
        for method, path, body in (("PUT", f"/queues/{name}", b'{"paused": true}'),
                                   ("POST", f"/queues/{name}/pause", b""),
                                   ("PUT", f"/schedules/{name}", sched),
                                   ("PUT", f"/subscriptions/{name}", hook)):
            status = raw(s.port, method, path, body)
            assert status in (400, 404), f"{method} {path}: {status}"
    r = http("POST", s.url + "/work", {"payload": 1, "queue": ".."}, JSON)
    assert r.status == 400 and "not . or .." in r.json()["detail"], r.text
    assert cluster.psql("SELECT count(*) FROM workd_queues WHERE queue IN ('.', '..')") == "0", \
        "a queue named . or .. was made"
    # Schedules: --max-schedules new ones, then 409; replacing one is fine.
    for name in ("s-1", "s-2"):
        expect(http("PUT", f"{s.url}/schedules/{name}", json.loads(sched), JSON), 200, name)
    r = http("PUT", s.url + "/schedules/s-3", json.loads(sched), JSON)
    assert r.status == 409 and r.json()["type"].endswith("/too-many-schedules") and \
        "--max-schedules" in r.json()["detail"], r.text
    expect(http("PUT", s.url + "/schedules/s-2", json.loads(sched), JSON), 200, "replace s-2")
    expect(http("DELETE", s.url + "/schedules/s-1"), 204, "delete s-1")
    expect(http("PUT", s.url + "/schedules/s-3", json.loads(sched), JSON), 200, "s-3 after")
    # A queue the leader does not hold: done, and the answer says so.
    r = expect(http("POST", s.url + "/queues/emials/pause"), 200, "pause a new queue").json()
    assert r["paused"] and "emials" in r.get("warning", ""), r
    submit(s.url, {"id": "m1", "payload": 1, "queue": "mails"})
    r = expect(http("POST", s.url + "/queues/mails/pause"), 200, "pause a queue with work").json()
    assert r["paused"] and "warning" not in r, r
    r = expect(http("POST", s.url + "/queues/emials/resume"), 200, "resume").json()
    assert "warning" not in r, f"a paused queue is held: {r}"


if __name__ == "__main__":
    run_tests(globals())
