"""The workd client: submit work, read and wait for it, cancel and retry it,
follow results and progress as server-sent events, and manage queues and
schedules (openapi.yaml is the contract)."""

from __future__ import annotations

import datetime as _dt
import ssl
import time
import uuid
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._http import REQUEST_TIMEOUT, Transport, quote, query
from ._sse import FINISHED, EventStream

Seconds = Union[float, int, _dt.timedelta]
Json = Dict[str, Any]

# GET /work/{id}?wait= is capped by the server (--get-wait-max, 60 s by default).
WAIT_STEP = 60.0
# The pause after a long poll that came back early with the work open:
# doubled while they keep coming back early. A server answers early when the
# work changes; one that always does (a broken one, a proxy that does not
# hold long polls) is not asked again as fast as it answers.
EARLY_PAUSE_MIN, EARLY_PAUSE_MAX = 0.1, 2.0


def _seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, _dt.timedelta) else float(value)


def _timestamp(value: Union[str, _dt.datetime]) -> str:
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError("run_at: a datetime needs a time zone (e.g. datetime.timezone.utc)")
    return value.astimezone(_dt.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def work_item(payload: Any, *, id: Optional[str] = None, queue: Optional[str] = None,
              key: Optional[str] = None, priority: Optional[int] = None,
              run_at: Union[str, _dt.datetime, None] = None, delay: Optional[Seconds] = None,
              timeout: Optional[Seconds] = None, max_attempts: Optional[int] = None,
              after: Optional[Sequence[str]] = None, run_anyway: Optional[bool] = None,
              batch: Optional[str] = None, **more: Any) -> Json:
    """One item of ``POST /work`` (openapi.yaml's SubmitItem), without the
    fields left None. ``delay`` and ``timeout`` are seconds (or timedeltas);
    ``run_at`` an RFC 3339 string or an aware datetime. Fields this library
    does not name yet may be given as keywords (``more``)."""
    item: Json = {"payload": payload}
    fields: Dict[str, Any] = {
        "id": id, "queue": queue, "key": key, "priority": priority,
        "run_at": None if run_at is None else _timestamp(run_at),
        "delay": None if delay is None else _seconds(delay),
        "timeout": None if timeout is None else _seconds(timeout),
        "max_attempts": max_attempts, "after": None if after is None else list(after),
        "run_anyway": run_anyway, "batch": batch, **more}
    item.update({k: v for k, v in fields.items() if v is not None})
    return item


class Client:
    """A client of a workd cluster.

    ``servers``: a URL, a list of URLs or a comma-separated string, tried in
    turn (default: ``WORKD_SERVER``, else ``http://127.0.0.1:8080``).
    ``token``: the bearer token (default: ``WORKD_TOKEN``). A call that finds
    no server, or only 503 answers, retries with backoff for ``retry_for``
    seconds (None: for ever) and then raises ``Unavailable``; any other
    refusal raises ``WorkdError`` with the problem's fields at once.
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None, *,
                 token: Optional[str] = None, retry_for: Optional[float] = 30.0,
                 timeout: float = REQUEST_TIMEOUT,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.transport = Transport(servers, token, retry_for, timeout, ssl_context)

    @property
    def servers(self) -> List[str]:
        return list(self.transport.servers)

    def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Json:
        answer = self.transport.request(method, path, body, **kw).json()
        return answer if isinstance(answer, dict) else {}

    # -- work

    def submit(self, payload: Any, *, id: Optional[str] = None, queue: Optional[str] = None,
               key: Optional[str] = None, priority: Optional[int] = None,
               run_at: Union[str, _dt.datetime, None] = None, delay: Optional[Seconds] = None,
               timeout: Optional[Seconds] = None, max_attempts: Optional[int] = None,
               after: Optional[Sequence[str]] = None, run_anyway: Optional[bool] = None,
               batch: Optional[str] = None, traceparent: Optional[str] = None,
               tracestate: Optional[str] = None, **more: Any) -> Json:
        """Submits one work item (the fields of ``work_item``) and returns
        its SubmitResult: ``{"id", "status", "created"}``.

        An item without ``id`` gets a random UUID here, so that a submission
        retried after a lost answer is recognised by the server and never
        runs twice. ``traceparent``/``tracestate`` (W3C trace context) are
        sent as headers: the worker's handler continues that trace.
        """
        item = work_item(payload, id=id, queue=queue, key=key, priority=priority, run_at=run_at,
                         delay=delay, timeout=timeout, max_attempts=max_attempts, after=after,
                         run_anyway=run_anyway, batch=batch, **more)
        item.setdefault("id", str(uuid.uuid4()))
        return self._call("POST", "/work", item, idempotent=True,
                          headers=_trace_headers(traceparent, tracestate))

    def submit_many(self, items: Iterable[Mapping[str, Any]], *,
                    batch: Optional[Mapping[str, Any]] = None,
                    traceparent: Optional[str] = None,
                    tracestate: Optional[str] = None) -> Json:
        """Submits items (dicts as ``work_item`` makes) atomically: all or
        none. Returns ``{"items": [SubmitResult, ...]}`` in the same order.
        ``batch`` (``{"id"?, "callback"?}``) opens a batch that every item
        joins; the answer then names it in ``"batch"``. Items without ``id``
        get a UUID, as with ``submit``."""
        body_items: List[Json] = []
        for it in items:
            item = dict(it)
            if "payload" not in item:
                raise ValueError(f"item {len(body_items)}: no 'payload'")
            item.setdefault("id", str(uuid.uuid4()))
            body_items.append(item)
        body: Any = body_items if batch is None else {"items": body_items, "batch": dict(batch)}
        return self._call("POST", "/work", body, idempotent=True,
                          headers=_trace_headers(traceparent, tracestate))

    def get(self, work_id: str) -> Json:
        """The work item (openapi.yaml's Work): status, attempts, result, last_error…"""
        return self._call("GET", f"/work/{quote(work_id)}")

    def wait(self, work_id: str, timeout: Optional[float] = None) -> Json:
        """Waits until the work is finished (completed, dead or cancelled)
        with long polls, and returns it; after ``timeout`` seconds (None: no
        limit) returns it as it is then: check its ``status``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0
        while True:
            step = WAIT_STEP
            if deadline is not None:
                step = max(0.0, min(step, deadline - time.monotonic()))
            asked = time.monotonic()
            work = self._call("GET", f"/work/{quote(work_id)}" + query({"wait": round(step, 3)}),
                              timeout=step + self.transport.timeout)
            if work["status"] in FINISHED:
                return work
            if deadline is not None and time.monotonic() >= deadline:
                return work
            if time.monotonic() - asked >= step / 2:
                pause = 0.0
                continue
            pause = min(EARLY_PAUSE_MAX, pause * 2 if pause else EARLY_PAUSE_MIN)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)

    def cancel(self, work_id: str) -> Json:
        """Cancels open work (running work too: its worker is told to stop)."""
        return self._call("DELETE", f"/work/{quote(work_id)}")

    def retry(self, work_id: str) -> Json:
        """Reopens dead work for one more attempt."""
        return self._call("POST", f"/work/{quote(work_id)}/retry")

    def list_work(self, *, status: Optional[str] = None, queue: Optional[str] = None,
                  limit: Optional[int] = None, before: Union[int, str, None] = None) -> Json:
        """One page of work, newest first (pass ``next_before`` as ``before`` for the next)."""
        return self._call("GET", "/work" + query({"status": status, "queue": queue,
                                                  "limit": limit, "before": before}))

    def events(self, work_id: str) -> Json:
        """The history of one work item from the event log."""
        return self._call("GET", f"/work/{quote(work_id)}/events")

    # -- streams

    def results(self, *, after: Union[int, str, None] = None, queue: Optional[str] = None,
                work_id: Optional[str] = None, progress: bool = False,
                idle_timeout: float = 45.0) -> EventStream:
        """The results stream (``GET /results``) as an iterator of ``Event``:
        work finished from now on, or after the event id ``after`` (an
        ``event_id`` or ``last_event_id``, opaque; 0: from the beginning of
        the log), optionally of one queue or work item, with
        ``progress`` events when asked. It reconnects after a dropped
        connection or a dead node without losing or repeating an event."""
        path = "/results" + query({"queue": queue, "work_id": work_id,
                                   "progress": "true" if progress else None})
        return EventStream(self.transport, path, after, idle_timeout)

    def stream(self, work_id: str, *, after: Union[int, str, None] = None,
               idle_timeout: float = 45.0) -> EventStream:
        """One work item's events from its start (``GET /work/{id}/stream``):
        its progress, then its end (``completed``, ``dead`` or
        ``cancelled``), after which the iteration stops."""
        return EventStream(self.transport, f"/work/{quote(work_id)}/stream", after,
                           idle_timeout, stop_on_finish=True)

    # -- queues

    def queues(self) -> List[Json]:
        """Every queue's counts, oldest ready job, throughput and limits."""
        return list(self._call("GET", "/queues")["queues"])

    def pause_queue(self, queue_name: str) -> Json:
        """Pauses a queue: it hands out no work until resumed. Returns its limits."""
        return self._call("POST", f"/queues/{quote(queue_name)}/pause", idempotent=True)

    def resume_queue(self, queue_name: str) -> Json:
        """Resumes a paused queue. Returns its limits."""
        return self._call("POST", f"/queues/{quote(queue_name)}/resume", idempotent=True)

    def set_queue_limits(self, queue_name: str, **limits: Any) -> Json:
        """Sets a queue's flow control: any of ``paused``, ``max_running``,
        ``max_running_per_key``, ``rate`` (``{"limit", "per"}``) and
        ``key_weights``; those not given are kept, ``None`` clears one."""
        if not limits:
            raise ValueError("set_queue_limits: give at least one limit")
        return self._call("PUT", f"/queues/{quote(queue_name)}", limits)

    # -- schedules

    def schedules(self) -> List[Json]:
        """Every schedule, with its next fire times and last run."""
        return list(self._call("GET", "/schedules")["schedules"])

    def get_schedule(self, name: str) -> Json:
        return self._call("GET", f"/schedules/{quote(name)}")

    def put_schedule(self, name: str, cron: str, work: Mapping[str, Any], **options: Any) -> Json:
        """Creates or replaces a schedule: each tick of ``cron`` submits
        ``work`` (a template: payload, queue, key, priority, timeout,
        max_attempts, run_anyway). ``options``: ``timezone``, ``overlap``,
        ``catch_up``, ``catch_up_max``, ``paused``."""
        return self._call("PUT", f"/schedules/{quote(name)}",
                          {"cron": cron, "work": dict(work), **options})

    def delete_schedule(self, name: str) -> None:
        self._call("DELETE", f"/schedules/{quote(name)}")

    def pause_schedule(self, name: str) -> Json:
        return self._call("POST", f"/schedules/{quote(name)}/pause", idempotent=True)

    def resume_schedule(self, name: str) -> Json:
        return self._call("POST", f"/schedules/{quote(name)}/resume", idempotent=True)

    # -- the cluster

    def cluster(self) -> Json:
        """The leader, its term, the nodes and the workers."""
        return self._call("GET", "/cluster")


def _trace_headers(traceparent: Optional[str], tracestate: Optional[str]) -> Dict[str, str]:
    headers = {}
    if traceparent:
        headers["traceparent"] = traceparent
        if tracestate:
            headers["tracestate"] = tracestate
    return headers
