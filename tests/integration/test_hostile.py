"""Hostile clients at the HTTP layer (issue 13): request framing that a
smuggling attack needs, bodies sent before (or without) a token, a forged
forwarding header, slow requests on a kept-alive connection, tokens in URLs,
ids that URL handling would resolve away, Expect: 100-continue without a
token, and what a client learns while the database is down. Every case is
sent as raw bytes on a socket to real processes, and bounded in time."""

import json
import re
import shutil
import socket
import subprocess
from http.client import HTTPException
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import (REPO_ROOT, SSEClient, free_port, http, run_tests,  # noqa: E402
                     wait_leader, wait_until)
from workd import JSON, expect, leader_of, submit  # noqa: E402

CLIENT = "client-token-0123456789"
WORKER = "worker-token-0123456789"
ADMIN = "admin-token-01234567890"
TOKENS = f"client:{CLIENT} worker:{WORKER} admin:{ADMIN}"
HAPROXY_CFG = REPO_ROOT / "deploy" / "haproxy.cfg"


# ------------------------------------------------------------------ helpers

class Answer:
    """What came back on a raw connection: the answers' status lines, the
    first answer's headers and body, and whether the server closed."""

    def __init__(self, data, closed):
        self.data, self.closed = data, closed
        self.statuses = [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", data)]
        head, _, rest = data.partition(b"\r\n\r\n")
        self.headers = {}
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.decode("latin-1").partition(":")
            self.headers[k.strip().lower()] = v.strip()
        n = int(self.headers.get("content-length", "0") or 0)
        self.body = rest[:n]

    @property
    def status(self):
        return self.statuses[0] if self.statuses else None

    def problem(self):
        assert self.headers.get("content-type") == "application/problem+json", \
            f"not a problem+json answer: {self.data[:300]!r}"
        return json.loads(self.body)

    def __repr__(self):
        return f"<Answer {self.statuses} closed={self.closed} {self.data[:300]!r}>"


def exchange(port, data, wait=5.0, after=None):
    """Sends data (bytes, or a list of byte chunks sent with `after` seconds
    between them) and reads until the server closes or `wait` seconds pass."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    got, closed = b"", False
    try:
        for chunk in data if isinstance(data, list) else [data]:
            try:
                s.sendall(chunk)
            except OSError:
                break
            if after:
                time.sleep(after)  # a declared delay: a slow client's pace
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not b:
                closed = True
                break
            got += b
    finally:
        s.close()
    return Answer(got, closed)


def head(lines, body=b""):
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def bearer(tok):
    return {**JSON, "Authorization": f"Bearer {tok}"}


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -------------------------------------------------------------- 13.13 framing

def test_framing_that_smuggling_needs(cluster):
    """RFC 9112: each ambiguous head is refused with a problem and the
    connection closed, and nothing after it is read as another request."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    body = b'{"payload": 1}'
    smuggled = b"GET /work/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    post = ["POST /work HTTP/1.1", "Host: x", "Content-Type: application/json"]
    cases = [
        ("two different Content-Lengths (short first)",
         head(post + ["Content-Length: 14", f"Content-Length: {14 + len(smuggled)}"],
              body + smuggled), 400),
        ("two different Content-Lengths (long first)",
         head(post + [f"Content-Length: {14 + len(smuggled)}", "Content-Length: 14"],
              body + smuggled), 400),
        ("the same Content-Length twice",
         head(post + ["Content-Length: 14", "Content-Length: 14"], body), 400),
        ("Content-Length and Transfer-Encoding",
         head(post + ["Content-Length: 3", "Transfer-Encoding: chunked"],
              b"e\r\n" + body + b"\r\n0\r\n\r\n" + smuggled), 400),
        ("no Host", head(["GET /healthz HTTP/1.1"]) + smuggled, 400),
        ("two Host lines", head(["GET /healthz HTTP/1.1", "Host: a", "Host: b"]) + smuggled, 400),
        ("'Host :' (space before the colon)",
         head(["GET /healthz HTTP/1.1", "Host : x"]) + smuggled, 400),
        ("a header name with a space",
         head(["GET /healthz HTTP/1.1", "Host: x", "Transfer-Encoding : chunked"]) + smuggled,
         400),
        ("Transfer-Encoding: gzip, chunked",
         head(post + ["Transfer-Encoding: gzip, chunked"], b"e\r\n" + body + b"\r\n0\r\n\r\n"),
         501),
        ("Transfer-Encoding: chunked, gzip",
         head(post + ["Transfer-Encoding: chunked, gzip"], b"e\r\n" + body + b"\r\n0\r\n\r\n"),
         400),
        ("two Transfer-Encoding lines",
         head(post + ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
              b"e\r\n" + body + b"\r\n0\r\n\r\n"), 501),
        ("Transfer-Encoding in HTTP/1.0",
         head(["POST /work HTTP/1.0", "Content-Type: application/json",
               "Transfer-Encoding: chunked"], b"e\r\n" + body + b"\r\n0\r\n\r\n"), 400),
        # Issue 27.7: libmicrohttpd frames "chunked " as no body at all and
        # waited for the request timeout, then swallowed what followed.
        ("'Transfer-Encoding: chunked ' (trailing space)",
         head(post + ["Transfer-Encoding: chunked "], b"e\r\n" + body + b"\r\n0\r\n\r\n")
         + smuggled, 400),
        ("'Transfer-Encoding: chunked' with a tab after it",
         head(post + ["Transfer-Encoding: chunked\t"], b"e\r\n" + body + b"\r\n0\r\n\r\n"),
         400),
        ("bare LF line endings",
         b"POST /work HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 14\n\n"
         + body + smuggled, 400),
        ("one bare LF among CRLFs",
         b"GET /healthz HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n" + smuggled, 400),
        ("a bare LF after the request line",
         b"GET /healthz HTTP/1.1\nHost: x\r\n\r\n" + smuggled, 400),
        ("a bare LF ending the head",
         b"POST /work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: 14\r\n\n" + body, 400),
        ("obs-fold (a header continued on the next line)",
         b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n" + smuggled, 400),
        ("obs-fold of Transfer-Encoding",
         b"POST /work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Transfer-Encoding:\r\n chunked\r\n\r\ne\r\n" + body + b"\r\n0\r\n\r\n", 400),
        ("a NUL in a header value",
         b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: b\x00c\r\n\r\n" + smuggled, 400),
        ("a bare CR in a header value",
         b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: b\rc\r\n\r\n" + smuggled, 400),
    ]
    for what, data, status in cases:
        t0 = time.monotonic()
        a = exchange(s.port, data, wait=5)
        took = time.monotonic() - t0
        assert a.statuses == [status], f"{what}: expected one {status} answer, got {a!r}"
        assert a.closed and took < 3, f"{what}: the connection must be closed at once ({a!r}, " \
                                      f"{took:.1f}s)"
        assert a.headers.get("connection") == "close", f"{what}: {a.headers}"
        p = a.problem()
        assert p["status"] == status and p["detail"], f"{what}: {p}"
    # Nothing was smuggled through, and the node serves as before.
    assert "smuggled" not in s.log_text()
    expect(http("GET", s.url + "/work/smuggled"), 404, "no work was made by a smuggled request")
    # The plain forms still work: one Content-Length, chunked alone, HTTP/1.0
    # without Host.
    a = exchange(s.port, head(post + ["Content-Length: 14"], body), wait=2)
    assert a.status == 202 and not a.closed, a
    a = exchange(s.port, head(post + ["Transfer-Encoding: chunked"],
                              b"e\r\n" + body + b"\r\n0\r\n\r\n"), wait=2)
    assert a.status == 202 and not a.closed, a
    a = exchange(s.port, head(["GET /healthz HTTP/1.0"]), wait=2)
    assert a.status == 200, a


# ------------------------------------- 13.5 / 13.14 the head decides, not the body

def test_no_body_is_read_before_the_token(cluster):
    """A request without a valid token is refused from its head: its body is
    never read or held, Expect: 100-continue gets no 100, and 16 such
    connections cost the node nothing."""
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    big = 1000 * 1000
    post = ["POST /work HTTP/1.1", "Host: x", "Content-Type: application/json",
            f"Content-Length: {big}"]
    # Expect: 100-continue without a token: the 401 comes first, no 100.
    a = exchange(s.port, head(post + ["Expect: 100-continue"]), wait=3)
    assert a.statuses == [401], f"expected the 401 without 100 Continue, got {a!r}"
    assert a.closed, a
    # With a token the client is asked to continue, and the body is read.
    body = json.dumps({"payload": 7}).encode()
    s2 = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    s2.sendall(head(["POST /work HTTP/1.1", "Host: x", "Content-Type: application/json",
                     f"Authorization: Bearer {CLIENT}", f"Content-Length: {len(body)}",
                     "Expect: 100-continue"]))
    first = s2.recv(100)
    assert first.startswith(b"HTTP/1.1 100"), f"with a token: {first!r}"
    s2.sendall(body)
    rest = b""
    while b"\r\n\r\n" not in rest:
        rest += s2.recv(4096)
    s2.close()
    assert b" 202 " in rest.split(b"\r\n")[0], rest[:200]
    # A wrong token, a token without the scope, a token in the URL: the same.
    for extra, status in ((["Authorization: Bearer wrong-token-0123456789"], 401),
                          ([f"Authorization: Bearer {WORKER}"], 403)):
        a = exchange(s.port, head(post + extra + ["Expect: 100-continue"]), wait=3)
        assert a.statuses == [status], (extra, a)
    # 16 connections without a token send most of a 1 MB body: each is
    # answered from its head and closed; the node holds none of it.
    base = rss_mb(s.pid)
    socks = []
    for _ in range(16):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(head(post))
        socks.append(c)
    chunk = b" " * 65536
    for c in socks:
        try:
            for _ in range(14):
                c.sendall(chunk)
        except OSError:
            pass  # closed by the server: that is the point
    grown = rss_mb(s.pid) - base
    for c in socks:
        c.settimeout(3)
        try:
            got = c.recv(200)
        except OSError:
            got = b""
        assert got.startswith(b"HTTP/1.1 401"), f"a tokenless upload got {got!r}"
        c.close()
    assert grown < 6, f"16 tokenless uploads of 900 kB grew the node by {grown:.1f} MB"


def test_forwarding_header_cannot_be_forged(cluster):
    """X-Workd-Forwarded is believed only with the cluster secret: a client
    that sends it gets 403 (not four times the body limit, nor a leader's
    'not forwarded again'); the nodes' own forwards still work."""
    limit = 8192
    a = cluster.start_server("a", extra_args=["--max-body", str(limit)])
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=["--max-body", str(limit)])
    wait_leader(b.url)
    leader = leader_of([a.url, b.url])
    follower = b.url if leader == a.url else a.url
    # Twice the limit in all; each payload within it (a payload's own budget
    # is --max-body, forwarded or not).
    item = {"items": [{"id": f"forged-{i}", "payload": "x" * (limit * 2 // 3)} for i in range(3)]}
    for fwd in ("node=evil", "secret=wrong-secret-0123456789; node=evil",
                f"secret={cluster.secret[:-1]}; node=evil", "secret=; node=evil"):
        r = http("POST", leader + "/work", item, {**JSON, "X-Workd-Forwarded": fwd})
        expect(r, 403, f"a forged X-Workd-Forwarded: {fwd}")
        assert r.json()["type"].endswith("/forwarding-refused"), r.text
    expect(http("GET", leader + "/work/forged-0"), 404, "nothing was accepted")
    # The real secret (what a node sends) is believed.
    real = {**JSON, "X-Workd-Forwarded": f"secret={cluster.secret}; node=test"}
    expect(http("POST", leader + "/work", item, real), 202, "a node's forward of 2x the limit")
    expect(http("POST", follower + "/work", {"payload": 1}, real), 503,
           "a forward that reaches a follower is not forwarded again")
    # A follower forwards with the secret: near-limit submissions go through.
    big = {"payload": "y" * (limit - 200)}
    expect(http("POST", follower + "/work", big, JSON), 202, "a forwarded near-limit submission")
    # A node without the secret cannot forward to nodes that have one.
    c = cluster.start_server("c", extra_args=["--max-body", str(limit)],
                             env={"WORKD_CLUSTER_SECRET": ""})
    wait_leader(c.url)
    r = http("POST", c.url + "/work", {"payload": 2}, JSON)
    expect(r, 503, "a forward by a node without the cluster secret")
    assert "cluster secrets differ" in r.json()["detail"], r.text
    assert "cluster-secret" in c.log_text(), "the node's log must say what is wrong"


def test_request_timeout_on_every_request(cluster):
    """--request-timeout holds for each request of a kept-alive connection:
    a second request sent a byte at a time is cut off like a first one."""
    s = cluster.start_server("s1", extra_args=["--request-timeout", "2s",
                                               "--connection-timeout", "30s"])
    wait_leader(s.url)
    c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    c.sendall(head(["GET /healthz HTTP/1.1", "Host: x"]))
    first = c.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first
    second = head(["GET /healthz HTTP/1.1", "Host: x", "X-Slow: " + "a" * 40])
    t0, cut = time.monotonic(), None
    c.settimeout(0.5)
    for ch in second:
        try:
            c.sendall(bytes([ch]))
            if c.recv(1) == b"":
                cut = time.monotonic() - t0
                break
        except socket.timeout:
            pass
        except OSError:
            cut = time.monotonic() - t0
            break
        if time.monotonic() - t0 > 12:
            break
    c.close()
    assert cut is not None, "a second request sent a byte at a time was never cut off"
    assert 1.5 < cut < 6, f"cut off after {cut:.1f}s, expected about the 2s request timeout"
    # The same for a body trickling in on a kept-alive connection.
    c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    c.sendall(head(["GET /healthz HTTP/1.1", "Host: x"]))
    assert c.recv(4096).startswith(b"HTTP/1.1 200")
    c.sendall(head(["POST /work HTTP/1.1", "Host: x", "Content-Type: application/json",
                    "Content-Length: 40"], b"{"))
    t0, got = time.monotonic(), None
    c.settimeout(0.5)
    while time.monotonic() - t0 < 12:
        try:
            c.sendall(b" ")
            if c.recv(100) == b"":
                got = time.monotonic() - t0
                break
        except socket.timeout:
            continue
        except OSError:
            got = time.monotonic() - t0
            break
    c.close()
    assert got is not None and got < 6, f"a trickling body on a kept-alive connection: {got}"
    # A client that sends its requests at once is served on and on.
    c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    for _ in range(3):
        c.sendall(head(["GET /healthz HTTP/1.1", "Host: x"]))
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)  # a declared delay: the requests come 0.5 s apart
    c.close()


# ------------------------------------------------------------ 13.9 tokens in URLs

def test_tokens_in_urls(cluster):
    """?access_token= counts on GET /results only; elsewhere it is refused
    with a problem that says why; no token reaches a log."""
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    for method, path, tok in (("GET", "/work", CLIENT), ("GET", "/cluster", ADMIN),
                              ("GET", "/metrics", ADMIN), ("DELETE", "/work/x", ADMIN),
                              ("POST", "/workers/w/pull", WORKER), ("GET", "/queues", CLIENT)):
        body = {} if method == "POST" else None
        r = http(method, f"{s.url}{path}?access_token={tok}", body, JSON if body is not None else {})
        expect(r, 400, f"{method} {path} with the token in the URL")
        p = r.json()
        assert p["type"].endswith("/token-in-url") and "Authorization" in p["detail"], p
        # ...also together with a valid header.
        r = http(method, f"{s.url}{path}?access_token={tok}", body,
                 {**JSON, "Authorization": f"Bearer {tok}"})
        expect(r, 400, f"{method} {path} with the token in the URL and a header")
    with SSEClient(f"{s.url}/results?access_token={CLIENT}") as sse:
        assert sse.status == 200, sse.status
    expect(http("GET", f"{s.url}/results?access_token=wrong-token-0123456789"), 401,
           "a wrong token in the URL of /results")
    for tok in (CLIENT, WORKER, ADMIN):
        assert tok not in s.log_text(), "a token reached the node's log"


def start_haproxy(cluster, s):
    """The shipped HAProxy config in front of node s: (its URL, the process)."""
    port = free_port()
    lb = f"http://127.0.0.1:{port}"
    env = {"WORKD_LB_BIND": f"127.0.0.1:{port}", "WORKD_SERVER_1": f"127.0.0.1:{s.port}",
           "WORKD_SERVER_2": f"127.0.0.1:{s.port}"}
    h = cluster.start_process("haproxy", ["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=env)
    wait_until(lambda: http("GET", lb + "/readyz", timeout=2).status == 200, 15,
               what="the balancer to answer", ignore=(OSError,))
    return lb, h


def test_haproxy_strips_forwarding_and_logs_no_token(cluster):
    """The shipped HAProxy config: a client's X-Workd-Forwarded never reaches
    a node, and its log lines carry the path without the query."""
    if not shutil.which("haproxy"):
        from harness import Skip
        raise Skip("haproxy is not installed")
    limit = 8192
    # HAProxy logs a stream when it ends: a keep-alive comment soon after the
    # client left ends it.
    s = cluster.start_server("s1", extra_args=["--max-body", str(limit), "--sse-keepalive", "300ms"],
                             env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    lb, h = start_haproxy(cluster, s)
    # Even the real secret is removed at the public entry: the node sees an
    # ordinary request (its own limit, forwarded again if need be).
    for fwd in ("node=evil", f"secret={cluster.secret}; node=evil"):
        r = http("POST", lb + "/work", {"payload": "x" * (2 * limit)},
                 {**bearer(CLIENT), "X-Workd-Forwarded": fwd})
        expect(r, 413, f"through the balancer with X-Workd-Forwarded: {fwd[:12]}")
        r = http("POST", lb + "/work", {"payload": 1},
                 {**bearer(CLIENT), "X-Workd-Forwarded": fwd})
        expect(r, 202, "a small submission through the balancer with the header")
    with SSEClient(f"{lb}/results?access_token={CLIENT}") as sse:
        assert sse.status == 200, sse.status
    expect(http("GET", f"{lb}/work?access_token={ADMIN}"), 400, "a token in the URL of /work")
    wait_until(lambda: "/results" in h.log_text(), 10, what="HAProxy to log the stream")
    log = h.log_text()
    for tok in (CLIENT, ADMIN):
        assert tok not in log, f"a token in HAProxy's log:\n{log[-800:]}"
    assert "access_token" not in log, f"the query string reached HAProxy's log:\n{log[-800:]}"


def test_early_answers_arrive_whole(cluster):
    """A request refused from its head (413, 401) is answered before its body
    is read. The node then reads and drops the body until the client is done
    (a lingering close), so the answer arrives, directly and through HAProxy,
    instead of the reset a close with unread data sends; and a client that
    never stops sending is cut off after a bounded time."""
    limit = 8192
    s = cluster.start_server("s1", extra_args=["--max-body", str(limit)],
                             env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    urls = {"directly": s.url}
    if shutil.which("haproxy"):
        urls["through HAProxy"] = start_haproxy(cluster, s)[0]
    cases = (("a body 200 times the limit", "x" * (200 * limit), CLIENT, 413),
             ("a body under the limit with a wrong token", "x" * (limit - 100),
              "wrong-token-0123456789", 401))
    for where, url in urls.items():
        for what, payload, tok, status in cases:
            got = {}
            for _ in range(20):
                try:
                    k = http("POST", url + "/work", {"payload": payload}, bearer(tok)).status
                except (OSError, HTTPException) as e:
                    k = type(e).__name__
                got[k] = got.get(k, 0) + 1
            assert got == {status: 20}, f"{what}, {where}: 20 requests got {got}, not {status}s"
    # A client that keeps sending: answered at once, read for a while, then
    # closed (its next send fails).
    c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    c.sendall(head(["POST /work HTTP/1.1", "Host: x", "Content-Type: application/json",
                    f"Authorization: Bearer {CLIENT}", "Content-Length: 100000000"]))
    t0 = time.monotonic()
    answer = c.recv(200)
    assert answer.startswith(b"HTTP/1.1 413"), f"the endless upload got {answer!r}"
    sent_for = None
    while time.monotonic() - t0 < 20:
        try:
            c.sendall(b" " * 1024)
        except OSError:
            sent_for = time.monotonic() - t0
            break
        time.sleep(0.1)  # a declared pace: an upload that never ends
    c.close()
    assert sent_for is not None, "an endless upload was still read after 20 s"
    assert 3 < sent_for < 12, f"an endless upload was cut off after {sent_for:.1f} s, not ~5 s"


# --------------------------------------------------- 13.11 ids a URL resolves away

def test_dot_ids_through_a_follower(cluster):
    """'.' and '..' are not ids: refused where they are given (body, path,
    header), by the follower itself, never forwarded as another route."""
    a = cluster.start_server("a")
    wait_leader(a.url)
    b = cluster.start_server("b")
    wait_leader(b.url)
    follower = b.url if leader_of([a.url, b.url]) == a.url else a.url
    for dot in (".", ".."):
        r = http("POST", follower + "/work", {"id": dot, "payload": 1}, JSON)
        expect(r, 400, f"submitting id {dot!r}")
        assert "not . or .." in r.json()["detail"], r.text
        expect(http("POST", follower + "/work", {"payload": 1},
                    {**JSON, "Idempotency-Key": dot}), 400, f"Idempotency-Key {dot!r}")
        expect(http("POST", follower + "/work", [{"payload": 1}, {"id": dot, "payload": 2}], JSON),
               400, f"a bulk item with id {dot!r}")
    ports = {u: int(u.rsplit(":", 1)[1]) for u in (follower,)}
    for raw_path in ("/work/..", "/work/.", "/work/%2e%2e", "/work/%2E", "/workers/..",
                     "/work/../retry", "/work/%2e%2e/attempts/1/fail", "/workers/%2e/pull",
                     "/work/./events"):
        for method in ("GET", "DELETE", "POST", "PUT"):
            a_ = exchange(ports[follower], head([f"{method} {raw_path} HTTP/1.1", "Host: x",
                                                 "Content-Type: application/json",
                                                 "Content-Length: 0", "Connection: close"]), wait=2)
            assert a_.status in (400, 404, 405), f"{method} {raw_path}: {a_!r}"
            if a_.status == 400:
                assert a_.problem()["type"].endswith("/invalid-path"), a_
    # Nothing was created or changed by any of it.
    expect(http("GET", follower + "/work?limit=10"), 200, "listing")
    assert http("GET", follower + "/work?limit=10").json()["items"] == []


# ------------------------------------------------------------ 13.14 smaller ones

def test_429_names_the_limit(cluster):
    s = cluster.start_server("s1", extra_args=["--max-open", "5"])
    wait_leader(s.url)
    for i in range(3):
        submit(s.url, {"id": f"o{i}", "payload": i})
    r = http("POST", s.url + "/work", [{"payload": i} for i in range(4)], JSON)
    expect(r, 429, "a bulk past --max-open")
    d = r.json()["detail"]
    assert "is 5" in d and "3 are open" in d and "--max-open" in d, d
    assert r.headers.get("Retry-After") == "1", r.headers


def test_database_errors_stay_in_the_log(cluster):
    """While PostgreSQL is down a client gets a problem it can act on; the
    node's log has libpq's words."""
    # One read session, in use before the stop: its next query fails midway,
    # with libpq's own words.
    s = cluster.start_server("s1", extra_args=["--db-pool-size", "1"])
    wait_leader(s.url)
    work = submit(s.url, {"payload": 1})
    expect(http("GET", s.url + "/work?limit=1"), 200, "a read before the stop")
    cluster.pg_stop()
    leak = re.compile(r"server closed|connection to server|PGRES|libpq|SQL|FATAL|socket|"
                      r"terminat|Connection refused|127\.0\.0\.1", re.I)
    seen, first = set(), None
    deadline = time.monotonic() + 20
    # Some reads find no session (refused at once), others lose theirs in the
    # middle of a query (libpq's message): a few seconds of both.
    while time.monotonic() < deadline and (first is None or time.monotonic() - first < 3):
        for path in (f"/work/{work['id']}", f"/work/{work['id']}/events", "/work?limit=1",
                     "/queues"):
            r = http("GET", s.url + path)
            if r.status >= 500:
                p = r.json()
                assert not leak.search(p["detail"]), f"GET {path} told the client: {p['detail']}"
                assert r.headers["Content-Type"] == "application/problem+json"
                seen.add(p["detail"])
                first = first or time.monotonic()
        time.sleep(0.2)  # a declared pace: reads over a few seconds of the outage
    assert seen, "no read failed while PostgreSQL was down"
    assert "server closed" in s.log_text() or "terminat" in s.log_text(), \
        "the node's log should have what libpq said"


def test_events_come_in_pages(cluster):
    s = cluster.start_server("s1")
    wait_leader(s.url)
    w = submit(s.url, {"id": "paged", "payload": 1})
    expect(http("DELETE", s.url + "/work/paged"), 200, "cancel")
    page = expect(http("GET", s.url + "/work/paged/events?limit=1"), 200, "page 1").json()
    assert len(page["events"]) == 1 and page["next_after"], page
    rest = expect(http("GET", f"{s.url}/work/paged/events?after={page['next_after']}"), 200,
                  "page 2").json()
    assert [e["type"] for e in page["events"] + rest["events"]] == ["accepted", "cancelled"]
    assert rest["next_after"] is None, rest
    whole = expect(http("GET", s.url + "/work/paged/events"), 200, "all").json()
    assert whole["events"] == page["events"] + rest["events"]
    for q in ("limit=0", "limit=1001", "after=-1", "limit=x"):
        expect(http("GET", f"{s.url}/work/paged/events?{q}"), 400, q)
    assert w["id"] == "paged"


def test_errors_the_library_answers_itself(cluster):
    """What docs/reliability.md says libmicrohttpd answers before workd's
    code runs: the status, a closed connection, and a node that goes on."""
    s = cluster.start_server("s1")
    wait_leader(s.url)
    cases = [
        ("a 40 kB header", head(["GET /healthz HTTP/1.1", "Host: x", "X-Big: " + "a" * 40000]),
         [431]),
        ("a 40 kB request line", head(["GET /" + "a" * 40000 + " HTTP/1.1", "Host: x"]), [414]),
        ("HTTP/2.0", head(["GET /healthz HTTP/2.0", "Host: x"]), [505]),
        ("no version", b"GET /healthz\r\nHost: x\r\n\r\n", [400]),
        ("a header line without a colon", head(["GET /healthz HTTP/1.1", "Host: x", "NoColon"]),
         [400]),
        ("not a request line", b"GARBAGE\r\n\r\n", []),
        ("a bad chunk size", head(["POST /work HTTP/1.1", "Host: x",
                                   "Content-Type: application/json",
                                   "Transfer-Encoding: chunked"], b"zz\r\nabc\r\n0\r\n\r\n"),
         [400]),
    ]
    for what, data, statuses in cases:
        a = exchange(s.port, data, wait=5)
        assert a.statuses[:1] == statuses[:1] and a.closed, f"{what}: {a!r}"
        assert a.headers.get("content-type") in (None, "application/problem+json"), \
            f"{what}: {a.headers}"
    expect(http("GET", s.url + "/healthz"), 200, "the node after the library's refusals")


if __name__ == "__main__":
    run_tests(globals())
