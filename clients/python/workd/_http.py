"""The HTTP layer of the workd client and worker: several servers tried in
turn, the bearer token, retries with backoff, and errors as exceptions that
carry the server's problem+json fields. Standard library only."""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

DEFAULT_SERVER = "http://127.0.0.1:8080"
USER_AGENT = "workd-python"

# How long the answer to a request may take beyond any wait it asks for.
REQUEST_TIMEOUT = 30.0
# Backoff between rounds over the servers: from BACKOFF_MIN, doubling, at most BACKOFF_MAX.
BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
# The longest pause a Retry-After buys, whatever it says (a date next year):
# the bound of every workd client. A call never waits past its retry_for.
RETRY_AFTER_MAX = 60.0
# The longest answer read (a stream's events have their own bound, _sse.py).
# No workd answer comes near it: the largest, GET /work/{id}, holds a payload
# and a result of at most --max-body each (1 MiB by default), and a node
# refuses to forward a reply over --max-reply-bytes (16 MiB). Past it is a
# broken or hostile server, not a reason to take all the memory.
MAX_ANSWER_BYTES = 64 << 20


class WorkdError(Exception):
    """A refusal by the server, with the fields of its problem+json body.

    ``status`` is the HTTP status, ``type``, ``title`` and ``detail`` are the
    problem's fields (``kind`` is the last part of ``type``, such as
    ``not-found`` or ``conflict``), and ``problem`` is the whole body (a
    problem may carry more members). ``retry_after`` is the ``Retry-After``
    header in seconds, when the answer had one.
    """

    def __init__(self, status: int, problem: Mapping[str, Any],
                 retry_after: Optional[float] = None) -> None:
        self.status = status
        self.problem: Dict[str, Any] = dict(problem)
        self.type: str = str(problem.get("type", "about:blank"))
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        self.retry_after = retry_after
        super().__init__(f"HTTP {status} {self.kind}: {self.detail or self.title}")

    @property
    def kind(self) -> str:
        """The problem's kind: the last path segment of its ``type``."""
        return self.type.rstrip("/").rsplit("/", 1)[-1]


class Unavailable(WorkdError):
    """No server answered (connection refused, reset, timed out, or 503)
    within the time given to retries. ``cause`` is the last failure."""

    def __init__(self, what: str, cause: Optional[BaseException]) -> None:
        detail = f"{what}: no server answered ({cause})"
        super().__init__(503, {"type": "https://workd.dev/problems/unavailable",
                               "title": "Service Unavailable", "status": 503,
                               "detail": detail})
        self.cause = cause


class BadAnswer(WorkdError):
    """An answer that no workd server gives, raised at once, never retried:
    longer than the client reads (``MAX_ANSWER_BYTES``, or an event of a
    stream over ``EVENT_MAX_BYTES``), a body that is not JSON, or a redirect,
    which the client does not follow (a workd server never redirects;
    following one would send the request and its body wherever an answer
    says): ``location`` is where it pointed. ``status`` is the answer's HTTP
    status and ``kind`` is ``bad-answer``."""

    def __init__(self, status: int, detail: str, location: Optional[str] = None) -> None:
        super().__init__(status, {"type": "https://workd.dev/problems/bad-answer",
                                  "title": "Bad answer", "status": status, "detail": detail})
        self.location = location


class Response:
    """An answer: ``status``, ``headers`` (names lower-case) and ``body`` bytes."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        """The body's JSON (None for an empty body); BadAnswer when it is not JSON."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise BadAnswer(self.status, f"the answer is not JSON ({e})") from None


def read_answer(r: http.client.HTTPResponse, limit: int = MAX_ANSWER_BYTES,
                deadline: Optional[float] = None) -> Response:
    """The answer ``r`` with its body, reading at most ``limit`` bytes of it:
    BadAnswer for a longer one (told by its Content-Length or found reading),
    or for a redirect. A body still coming at ``deadline`` (time.monotonic())
    raises TimeoutError, as a silent socket does: a server that sends a byte
    now and then is no more patient a wait than one that sends nothing."""
    headers = {k.lower(): v for k, v in r.getheaders()}
    if 300 <= r.status < 400:
        location = headers.get("location")
        raise BadAnswer(r.status, f"the server answered {r.status}, a redirect to "
                        f"{location or '(no Location)'}, which workd does not follow (a workd "
                        "server never redirects: give the URL it names if you trust it)",
                        location)
    length = headers.get("content-length", "")
    if length.strip().isdigit() and int(length) > limit:
        raise BadAnswer(r.status, f"the answer is {int(length)} bytes long, more than the "
                        f"{limit} bytes a workd answer can be; not read")
    chunks: List[bytes] = []
    size = 0
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BadAnswer(r.status, f"the answer is longer than the {limit} bytes a workd "
                            "answer can be; not read further")
        chunks.append(chunk)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("the answer was still coming when its time ran out")
    return Response(r.status, headers, b"".join(chunks))


def server_list(servers: Union[str, Sequence[str], None]) -> List[str]:
    """The servers to try, in order: ``servers`` (a list, or a string of
    comma-separated URLs), else the environment's ``WORKD_SERVER``, else
    ``http://127.0.0.1:8080``."""
    if servers is None:
        servers = os.environ.get("WORKD_SERVER") or DEFAULT_SERVER
    if isinstance(servers, str):
        servers = servers.split(",")
    out = [s.strip().rstrip("/") for s in servers if s.strip()]
    if not out:
        raise ValueError("no server URL given")
    for url in out:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
    return out


def retry_after_seconds(headers: Mapping[str, str]) -> Optional[float]:
    """The ``Retry-After`` header (RFC 9110: delta-seconds, or an HTTP-date)
    as seconds from now, at most RETRY_AFTER_MAX; None when there is none or
    it is neither (a negative number, a fraction, ``nan``)."""
    value = (headers.get("retry-after") or "").strip()
    if value.isascii() and value.isdigit():
        return min(float(value), RETRY_AFTER_MAX) if len(value) < 10 else RETRY_AFTER_MAX
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as an HTTP-date always is
        return None
    return max(0.0, min(when.timestamp() - time.time(), RETRY_AFTER_MAX))


def problem_of(resp: Response) -> WorkdError:
    """The exception for a refusal: its problem+json, or what the body says."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = resp.body.decode("utf-8", "replace").strip()[:500]
        body = {"title": http.client.responses.get(resp.status, ""), "status": resp.status,
                "detail": text or http.client.responses.get(resp.status, "")}
    return WorkdError(resp.status, body, retry_after_seconds(resp.headers))


class Backoff:
    """Capped exponential backoff with jitter."""

    def __init__(self, low: float = BACKOFF_MIN, high: float = BACKOFF_MAX) -> None:
        self.low, self.high, self.next = low, high, low

    def reset(self) -> None:
        self.next = self.low

    def delay(self, at_least: Optional[float] = None) -> float:
        """The next pause: the backoff's, or ``at_least`` (a Retry-After) when
        that is longer, up to RETRY_AFTER_MAX."""
        d = self.next * (0.5 + random.random() / 2)
        self.next = min(self.high, self.next * 2)
        if at_least is not None:
            d = max(d, min(at_least, RETRY_AFTER_MAX))
        return d


class Transport:
    """Sends requests to the first server that answers, moving on to the next
    one when a server cannot be reached or answers 503; shared by threads.

    ``retry_for`` bounds how long one call keeps retrying (seconds; None:
    for ever). Connection failures before the request was sent, and 503s,
    are always retried, after the backoff or the answer's ``Retry-After``
    (whichever is longer, that at most RETRY_AFTER_MAX); a failure after
    sending only for requests marked idempotent (a repeat does no harm).
    An answer longer than ``max_answer`` bytes, one that is not JSON, and a
    redirect raise BadAnswer at once.
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None,
                 token: Optional[str] = None, retry_for: Optional[float] = 30.0,
                 timeout: float = REQUEST_TIMEOUT,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 max_answer: int = MAX_ANSWER_BYTES) -> None:
        self.servers = server_list(servers)
        self.max_answer = max_answer
        self.token = token if token is not None else os.environ.get("WORKD_TOKEN") or None
        self.retry_for = retry_for
        self.timeout = timeout
        self.ssl_context = ssl_context
        self._lock = threading.Lock()
        self._current = 0

    # -- servers

    def server(self) -> Tuple[int, str]:
        """The index and URL of the server to use now."""
        with self._lock:
            return self._current, self.servers[self._current]

    def failed(self, index: int) -> None:
        """Server ``index`` failed: use the next one (unless another thread moved on already)."""
        with self._lock:
            if self._current == index:
                self._current = (index + 1) % len(self.servers)

    def headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(extra or {})
        return h

    def connect(self, base: str, timeout: float) -> Tuple[http.client.HTTPConnection, str]:
        """A new connection to ``base`` and the path prefix of its URL."""
        parts = urllib.parse.urlsplit(base)
        host, port = parts.hostname or "127.0.0.1", parts.port
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(host, port or 443, timeout=timeout,
                                               context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(host, port or 80, timeout=timeout)
        return conn, parts.path.rstrip("/")

    # -- requests

    def request(self, method: str, path: str, body: Any = None, *,
                headers: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                idempotent: Optional[bool] = None, retry_for: Optional[float] = None,
                on_conn: Optional[Callable[[http.client.HTTPConnection], None]] = None
                ) -> Response:
        """Send ``method path`` (``body``, if not None, as JSON) and return a
        2xx answer; raise WorkdError for any other, Unavailable when retries
        run out. ``idempotent`` defaults to true for every method but POST.
        ``on_conn(conn)`` is called with each connection once it is open,
        before the request is sent (the worker aborts a long-poll with it)."""
        if idempotent is None:
            idempotent = method != "POST"
        limit = self.retry_for if retry_for is None else retry_for
        deadline = None if limit is None else time.monotonic() + limit
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        hdrs = self.headers(headers)
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        backoff, tried = Backoff(), 0
        last_error: Optional[Exception] = None
        while True:
            index, base = self.server()
            sent = False
            try:
                conn, prefix = self.connect(base, timeout or self.timeout)
                try:
                    conn.connect()
                    sent = True
                    if on_conn is not None:
                        on_conn(conn)
                    answer_by = time.monotonic() + (timeout or self.timeout)
                    conn.request(method, prefix + path, body=data, headers=hdrs)
                    resp = read_answer(conn.getresponse(), self.max_answer, answer_by)
                finally:
                    conn.close()
            except (OSError, http.client.HTTPException) as e:
                last_error, retry_after = e, None
                if sent and not idempotent:
                    raise Unavailable(f"{method} {path}", e) from e
            else:
                if 200 <= resp.status < 300:
                    return resp
                if resp.status != 503:
                    raise problem_of(resp)
                last_error, retry_after = problem_of(resp), retry_after_seconds(resp.headers)
            self.failed(index)
            tried += 1
            if deadline is not None and time.monotonic() >= deadline \
                    and tried >= len(self.servers):
                if isinstance(last_error, WorkdError):
                    raise last_error
                raise Unavailable(f"{method} {path}", last_error)
            if tried % len(self.servers) == 0:  # a whole round failed: wait a little
                pause = backoff.delay(retry_after)
                if deadline is not None:
                    pause = max(0.0, min(pause, deadline - time.monotonic()))
                time.sleep(pause)


def quote(segment: str) -> str:
    """``segment`` escaped for a URL path."""
    return urllib.parse.quote(str(segment), safe="")


def query(params: Mapping[str, Any]) -> str:
    """``?a=1&b=x`` of the params that are not None (``""`` if none)."""
    items = []
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        items.append((k, str(v)))
    return "?" + urllib.parse.urlencode(items) if items else ""


def abort(conn: Optional[http.client.HTTPConnection]) -> None:
    """Breaks a request that another thread is waiting on (its socket is shut down)."""
    sock = getattr(conn, "sock", None) if conn is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
