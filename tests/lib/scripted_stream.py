"""A results stream as a cluster of several shards serves it, for the tests
of the clients (the Python library, the CLI, the demo consumer): over real
HTTP, connection n gets a `ready` event at the Last-Event-ID it sent (or its
`after`), then the events of scripts[n], and ends; the last connection stays
open until close(). It keeps the Last-Event-ID and `after` of every request,
so a test sees where each reconnection resumed from."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class ScriptedStream(ThreadingHTTPServer):
    """scripts: one list per connection of (event id, seq). An event's data
    is a ResultCompleted whose `result` is its event id."""

    daemon_threads = True

    def __init__(self, scripts):
        self.scripts, self.requests = scripts, []
        self.lock, self.closing = threading.Lock(), threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self):
        self.closing.set()
        self.shutdown()
        self.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        srv = self.server
        last = self.headers.get("Last-Event-ID")
        after = parse_qs(urlsplit(self.path).query).get("after", [None])[0]
        with srv.lock:
            n = len(srv.requests)
            srv.requests.append((last, after))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        start = last or after or "0"
        blocks = [f"retry: 20\nid: {start}\nevent: ready\ndata: {json.dumps({'after': start})}\n\n"]
        for ev_id, seq in srv.scripts[n] if n < len(srv.scripts) else []:
            data = {"seq": seq, "id": f"w-{n}-{seq}", "queue": "q", "status": "completed",
                    "at": "2026-01-01T00:00:00Z", "result": ev_id, "attempt": 1}
            blocks.append(f"id: {ev_id}\nevent: completed\ndata: {json.dumps(data)}\n\n")
        self.wfile.write("".join(blocks).encode())
        self.wfile.flush()
        if n + 1 >= len(srv.scripts):  # the last connection stays open, idle
            while not srv.closing.is_set():
                srv.closing.wait(0.1)

    def log_message(self, *args):
        pass
