"""Server-sent events of workd (GET /results, GET /work/{id}/stream): an
iterator that reconnects with Last-Event-ID, to the next server when one is
gone, and never yields an event twice.

An event id is an opaque cursor: each shard's last seq, in shard order,
joined by '.' ("812" in a cluster of one shard, "812.0.77.1204" in one of
four). Order holds per shard only, so ids compare component by component."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._http import BadAnswer, Backoff, Transport, problem_of, read_answer

FINISHED = ("completed", "dead", "cancelled")
# The longest line read, and the longest data of one event (its data lines
# joined): a result's data line is as large as a result the server accepts
# (a few MiB). A longer one, or a stream that never sends a newline, ends the
# iteration with BadAnswer instead of taking all the memory.
EVENT_MAX_BYTES = 16 << 20


def _components(cursor: str) -> Optional[Tuple[int, ...]]:
    """The seqs of a cursor's text; None when it is not numbers joined by dots."""
    parts = cursor.split(".")
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def cursor_le(a: str, b: str) -> bool:
    """Whether the event id (cursor) ``a`` is nothing new after ``b``: every
    shard's seq of ``a`` is at or below ``b``'s, a missing trailing one
    counting as 0. An id that is not numbers joined by dots is never below
    anything (it is taken as new)."""
    ca, cb = _components(a), _components(b)
    if ca is None or cb is None:
        return False
    width = max(len(ca), len(cb))
    ca += (0,) * (width - len(ca))
    cb += (0,) * (width - len(cb))
    return all(x <= y for x, y in zip(ca, cb))


@dataclass(frozen=True)
class Event:
    """One event of a results stream: ``seq`` (the event's seq in its
    shard's log: in commit order within a shard, the stream's id in a
    cluster of one shard), ``event`` (``completed``, ``dead``,
    ``cancelled``, ``progress`` or ``batch``), ``data`` (the ResultEvent
    object of openapi.yaml) and ``event_id`` (the stream's cursor after this
    event, an opaque string to resume after it with ``after=``)."""

    seq: int
    event: str
    data: Dict[str, Any]
    event_id: str = ""

    @property
    def work_id(self) -> str:
        return str(self.data.get("id", ""))


class EventStream:
    """Iterates over the events of a stream, in order within each shard, for
    as long as it is open. A dropped connection, a node that dies or a
    silence longer than ``idle_timeout`` (the server sends a comment every
    15 s by default) reconnects, with ``Last-Event-ID`` set to the id of the
    last event seen (the stream's start when none was), so no event is lost;
    an event whose id is at or below that one in every shard (``cursor_le``)
    is never yielded again.

    A connection that ends without giving an event is followed by a pause
    (the backoff, 0.1 s doubling up to 5 s), so that a server that keeps
    closing at once is not asked again and again without end. An event
    longer than EVENT_MAX_BYTES, or a redirect, raises BadAnswer.

    ``close()`` ends the iteration, also from another thread; the stream is
    a context manager. ``last_event_id`` (an opaque string) is where a new
    stream would resume (``after=``). ``stop_on_finish`` ends the iteration
    after the first ``completed``, ``dead`` or ``cancelled`` event (for one
    work item's stream).
    """

    def __init__(self, transport: Transport, path: str, after: Union[int, str, None] = None,
                 idle_timeout: float = 45.0, stop_on_finish: bool = False) -> None:
        self._transport = transport
        self._path = path
        self.last_event_id: Optional[str] = None if after is None else str(after)
        self._idle_timeout = idle_timeout
        self._stop_on_finish = stop_on_finish
        self._closed = threading.Event()
        self._conn: Optional[http.client.HTTPConnection] = None
        # http.client lets go of conn.sock once a response that ends with the
        # connection has begun: the stream keeps its own reference, to set the
        # idle timeout on and to shut down from close().
        self._sock: Optional[socket.socket] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self._backoff = Backoff()
        self._finished = False
        self.reconnects = 0

    @property
    def last_seq(self) -> Union[int, str, None]:
        """Deprecated: ``last_event_id``. An int while the id is one number
        (a cluster of one shard), the id's text otherwise."""
        warnings.warn("EventStream.last_seq is deprecated: use last_event_id, an opaque string",
                      DeprecationWarning, stacklevel=2)
        last = self.last_event_id
        return int(last) if last is not None and last.isascii() and last.isdigit() else last

    # -- the iterator

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while not self._closed.is_set() and not self._finished:
            if self._resp is None:
                self._open()
                continue
            try:
                ev = self._read_event(self._resp)
            except (OSError, http.client.HTTPException, ValueError):
                ev = None
            except BadAnswer:
                self._closed.set()
                self._drop()
                raise
            if ev is None:  # the connection ended: come back after the last event
                self._drop()
                if not self._closed.is_set():
                    self.reconnects += 1
                    self._closed.wait(self._backoff.delay())
                continue
            last = self.last_event_id
            if last is not None and cursor_le(ev.event_id, last):
                continue  # already given, or behind where the stream starts
            self.last_event_id = ev.event_id
            if ev.event == "ready":  # where the stream starts: no event
                continue
            self._backoff.reset()
            if self._stop_on_finish and ev.event in FINISHED:
                self._finished = True
            return ev
        self._drop()
        raise StopIteration

    def close(self) -> None:
        """Ends the iteration (a blocked ``next()`` returns at once)."""
        self._closed.set()
        sock = self._sock  # (the iterating thread may drop it meanwhile)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._drop()

    # -- connections

    def _open(self) -> None:
        index, base = self._transport.server()
        headers = self._transport.headers({"Accept": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        conn, prefix = self._transport.connect(base, self._transport.timeout)
        self._conn = conn
        retry_after = None
        try:
            conn.connect()
            self._sock = conn.sock
            if self._closed.is_set():  # close() came before it could see the socket
                raise OSError("closed")
            conn.request("GET", prefix + self._path, headers=headers)
            resp = conn.getresponse()
            if resp.status == 200:
                if self._sock is not None:
                    self._sock.settimeout(self._idle_timeout)
                self._resp = resp
                return
            try:
                answer = read_answer(resp, self._transport.max_answer,
                                     time.monotonic() + self._transport.timeout)
            except BadAnswer:
                conn.close()
                self._closed.set()
                raise
            conn.close()
            error = problem_of(answer)
            if answer.status != 503:
                self._closed.set()
                raise error
            retry_after = error.retry_after
        except (OSError, http.client.HTTPException):
            conn.close()
            if self._closed.is_set():
                return
        self._conn, self._sock = None, None
        self._transport.failed(index)
        pause = self._backoff.delay(retry_after)
        self._closed.wait(pause)

    def _drop(self) -> None:
        if self._resp is not None:
            self._resp.close()
        if self._conn is not None:
            self._conn.close()
        if self._sock is not None:
            self._sock.close()
        self._conn, self._resp, self._sock = None, None, None

    @staticmethod
    def _read_event(resp: http.client.HTTPResponse) -> Optional[Event]:
        """The next event with an id and data; None at the end of the stream;
        BadAnswer for a line or an event over EVENT_MAX_BYTES."""
        data: List[str] = []
        size = 0
        ev_id: Optional[str] = None
        ev_type: Optional[str] = None
        while True:
            raw = resp.readline(EVENT_MAX_BYTES + 1)
            if not raw:
                return None
            if len(raw) > EVENT_MAX_BYTES:
                raise _too_long()
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data and ev_id is not None:
                    parsed = json.loads("\n".join(data))
                    if not isinstance(parsed, dict):
                        parsed = {"value": parsed}
                    return Event(_seq_of(parsed, ev_id), ev_type or "message", parsed, ev_id)
                data, size, ev_id, ev_type = [], 0, None, None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                size += len(value) + 1
                if size > EVENT_MAX_BYTES:
                    raise _too_long()
                data.append(value)
            elif field == "event":
                ev_type = value
            elif field == "id" and "\0" not in value:  # the spec ignores such an id
                ev_id = value


def _too_long() -> BadAnswer:
    return BadAnswer(200, f"the stream sent an event longer than {EVENT_MAX_BYTES} bytes, or "
                     "a line that does not end; no workd event is")


def _seq_of(data: Dict[str, Any], ev_id: str) -> int:
    """An event's own seq: its data's ``seq``, else its id when that is one
    number (a cluster of one shard, the ``ready`` event), else 0."""
    seq = data.get("seq")
    if isinstance(seq, int) and not isinstance(seq, bool):
        return seq
    return int(ev_id) if ev_id.isascii() and ev_id.isdigit() else 0
