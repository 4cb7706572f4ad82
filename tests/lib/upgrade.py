"""What an in-place upgrade must keep, as the API shows it, and a webhook
receiver that checks signatures. tests/fixtures/make_schema17.py reads the
snapshot from the database it dumps and writes it as the expectations;
tests/integration/test_upgrade.py reads it again after `workd-server migrate`
(with small pages, so paging is exercised) and compares."""

import base64
import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import SSEClient, free_port, http
from workd import expect

# Fields of a view that follow the clock, not the data: a schedule's next fire
# times; a queue's throughput (what this node's stream saw since it started)
# and the age of its oldest ready work.
VOLATILE = {"schedule": ("next",), "queue": ("throughput", "oldest_pending_age_s")}
# What a subscription is, without the leader's live delivery figures (and
# never the secret, which the API does not show).
SUBSCRIPTION_FIELDS = ("name", "url", "queues", "kinds", "paused", "paused_reason", "cursor")


def _get(url, what):
    return expect(http("GET", url), 200, what).json()


def listing(url, page):
    """GET /work, every page of `page` items, newest first."""
    items, before = [], 0
    while True:
        ans = _get(f"{url}/work?limit={page}&before={before}", f"GET /work before {before}")
        items += ans["items"]
        if ans["next_before"] is None:
            return items
        before = ans["next_before"]


def work_events(url, work_id, page):
    """GET /work/{id}/events, every page of `page` events, oldest first."""
    events, after = [], 0
    while True:
        ans = _get(f"{url}/work/{work_id}/events?after={after}&limit={page}",
                   f"GET /work/{work_id}/events after {after}")
        events += ans["events"]
        if ans["next_after"] is None:
            return events
        assert ans["next_after"] > after, f"{work_id}: events paging does not advance: {ans}"
        after = ans["next_after"]


def results(url, count, progress=False, last_event_id=None, timeout=20):
    """The first `count` events of /results from the beginning of the log (or
    after `last_event_id`), as {id, event, data}."""
    query = "progress=true" if progress else ""
    if last_event_id is None:
        query += ("&" if query else "") + "after=0"
    with SSEClient(f"{url}/results?{query}", last_event_id=last_event_id) as sse:
        got = sse.wait_count(count, timeout=timeout) if count else []
    return [{"id": int(e["id"]), "event": e["event"], "data": e["data"]} for e in got]


def _without(obj, keys):
    return {k: v for k, v in obj.items() if k not in keys}


def snapshot(url, n_results, n_progress, page=1000):
    """Everything a client can read of the data, from one node, pages of `page`."""
    items = listing(url, min(page, 500))
    ids = [w["id"] for w in items]
    work = {i: _get(f"{url}/work/{i}", f"GET /work/{i}") for i in ids}
    batches = sorted({w["batch"] for w in work.values() if w.get("batch")})
    return {
        "listing": items,
        "work": work,
        "events": {i: work_events(url, i, page) for i in ids},
        "results": results(url, n_results),
        "results_with_progress": results(url, n_progress, progress=True),
        "schedules": [_without(s, VOLATILE["schedule"])
                      for s in _get(url + "/schedules", "GET /schedules")["schedules"]],
        "batches": {b: _get(f"{url}/batches/{b}", f"GET /batches/{b}") for b in batches},
        "queues": [_without(q, VOLATILE["queue"])
                   for q in _get(url + "/queues", "GET /queues")["queues"]],
    }


def subscriptions(url):
    """GET /subscriptions (answered by the leader), the settings and the cursor."""
    subs = _get(url + "/subscriptions", "GET /subscriptions")["subscriptions"]
    return [{k: s[k] for k in SUBSCRIPTION_FIELDS} for s in subs]


def signature_valid(secret, headers, body):
    """The Standard Webhooks check a receiver makes (docs/webhooks.md)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(want, sig.split(",", 1)[1])
               for sig in headers.get("webhook-signature", "").split() if sig.startswith("v1,"))


class HookReceiver:
    """A webhook receiver on loopback at `url` (path /hook). While `accepting`
    it answers 204 to a delivery signed with `secret` and records its message;
    otherwise 503. A delivery with a bad signature is answered 401 and kept in
    `bad_signatures`."""

    def __init__(self, secret, accepting=True):
        self.secret, self.accepting = secret, accepting
        self.lock = threading.Lock()
        self.delivered, self.bad_signatures, self.refused = [], [], 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        rcv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hdrs = {k.lower(): v for k, v in self.headers.items()}
                with rcv.lock:
                    if not signature_valid(rcv.secret, hdrs, body):
                        rcv.bad_signatures.append((hdrs, body))
                        code = 401
                    elif not rcv.accepting:
                        rcv.refused += 1
                        code = 503
                    else:
                        rcv.delivered.append({"id": hdrs["webhook-id"], "msg": json.loads(body)})
                        code = 204
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accept(self, on=True):
        with self.lock:
            self.accepting = on

    def seqs(self):
        """The seqs delivered (and answered 204), in the order they came."""
        with self.lock:
            return [d["msg"]["data"]["seq"] for d in self.delivered]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
