"""A server on loopback that answers as a test scripts it, for the tests of
the clients (the CLI, the Python and TypeScript libraries) against a server
that is broken or hostile: answers without end, redirects, Retry-After
abuse, event streams that break the rules, text made to drive a terminal.
It is the network peer under test, over real HTTP, not a mock of workd.

    with HostileServer({"GET /queues": json_answer({"queues": []}),
                        "GET /work/x": endless()}) as srv:
        ... srv.url ..., srv.requests

A route is "METHOD /path" (the path without its query); its answer is a
function of the request handler that writes the whole answer (the request's
body is the handler's ``body``, bytes). A request of no route gets 404.
Every request is kept in ``requests`` as (method, path with query,
headers)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, routes):
        self.routes, self.requests = dict(routes), []
        self.lock, self.closing = threading.Lock(), threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def count(self, method, path):
        """How many requests of METHOD to path (without query) came."""
        with self.lock:
            return sum(1 for m, p, _ in self.requests if m == method and urlsplit(p).path == path)

    def close(self):
        self.closing.set()
        self.shutdown()
        self.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _any(self):
        srv = self.server
        with srv.lock:
            srv.requests.append((self.command, self.path, dict(self.headers)))
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""  # a route may read it
        route = srv.routes.get(f"{self.command} {urlsplit(self.path).path}")
        try:
            (route or answer(404, b'{"type": "https://workd.dev/problems/not-found", '
                                  b'"title": "Not Found", "status": 404, "detail": "no route"}',
                             content_type="application/problem+json"))(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away, as it should from what never ends
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = _any  # noqa: N815 - http.server's names

    def log_message(self, *args):
        pass


def answer(status=200, body=b"", headers=(), content_type="application/json"):
    """A whole answer: status, body (bytes or str) and extra headers."""
    data = body.encode() if isinstance(body, str) else body

    def write(h):
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
    return write


def json_answer(obj, status=200, headers=()):
    return answer(status, json.dumps(obj), headers)


def problem(status, detail, kind="invalid-field"):
    """A problem+json refusal with the given detail."""
    return answer(status, json.dumps({"type": f"https://workd.dev/problems/{kind}",
                                      "title": "Refused", "status": status, "detail": detail}),
                  content_type="application/problem+json")


def endless(status=200, content_type="application/json", prefix=b'{"x": "', length=None):
    """An answer that never ends: prefix, then bytes without end (no
    Content-Length, the end of the connection would end it), until the client
    goes away. With length, a Content-Length that says so (and the same)."""
    chunk = b"x" * 65536

    def write(h):
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        if length is not None:
            h.send_header("Content-Length", str(length))
        h.end_headers()
        h.wfile.write(prefix)
        while not h.server.closing.is_set():
            h.wfile.write(chunk)
    return write


def drip(interval, status=200, content_type="application/json"):
    """An answer that never ends and never stops either: one byte every
    interval seconds (no Content-Length), until the client goes away."""
    def write(h):
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.end_headers()
        while not h.server.closing.wait(interval):
            h.wfile.write(b" ")
            h.wfile.flush()
    return write


def event_stream(text, then_hold=False):
    """200 text/event-stream with text, then the end of the connection (or,
    then_hold, a connection held open and silent until the server closes)."""
    def write(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(text.encode() if isinstance(text, str) else text)
        h.wfile.flush()
        while then_hold and not h.server.closing.is_set():
            time.sleep(0.05)
    return write


def endless_stream(head, chunk):
    """200 text/event-stream with head, then chunk again and again until the
    client goes away."""
    def write(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(head.encode())
        data = chunk.encode() if isinstance(chunk, str) else chunk
        while not h.server.closing.is_set():
            h.wfile.write(data)
    return write
