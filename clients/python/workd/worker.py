"""A workd worker in Python (the protocol of docs/worker-api.md): it
registers and heartbeats on its own thread, long-polls for as many jobs as it
has free slots, runs each job's handler (chosen by queue) on a thread of its
own, sends progress and reports until the server acknowledges them (a
report rides in the next pull when one is about to go: the worker's
exchange), passes a cancellation on to the handler, and on SIGTERM stops
gracefully."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import secrets
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import _trace
from ._http import Backoff, Transport, WorkdError, abort, quote

log = logging.getLogger("workd.worker")

Key = Tuple[str, int]  # (work id, attempt)
Handler = Callable[["Job"], Any]

MAX_BATCH = 1000  # reports or progress updates per request (the server's --max-batch)
FLUSH_TIMEOUT = 10.0  # graceful stop: how long to try delivering what is left
DEREGISTER_TIMEOUT = 10.0
EMPTY_PULL_MIN = 0.2  # never pull in a tight loop when the server answers at once
# The worker's exchange (docs/worker-api.md): a pull carries up to CARRY_MAX
# finished reports. While a pull is about to be sent (every slot is busy and
# the first to free pulls, or a pull is out that is answered at once: it
# carries reports, or the last one was given all the jobs it asked for;
# another follows its answer), a new report waits up to CARRY seconds for it
# rather than going in a request of its own.
CARRY_MAX = 100
CARRY = 0.02
# Refusals of a report that are final (the reports route's and the exchange's
# results): it is dropped. Any other refusal, or no answer, sends it again.
FINAL_REFUSALS = ("superseded", "cancelled", "not-found", "not-holder")


class Cancelled(Exception):
    """Raised by ``Job.raise_if_cancelled()`` once the attempt must stop."""


class Fail(Exception):
    """Raise from a handler to fail the attempt with ``error``; with
    ``retry=False`` the work is dead at once instead of retried."""

    def __init__(self, error: str, retry: bool = True) -> None:
        super().__init__(error)
        self.error, self.retry = error, retry


class Job:
    """One attempt handed to this worker, as its handler sees it.

    ``id``, ``attempt``, ``queue``, ``priority``, ``payload``, ``timeout_ms``
    and ``deadline`` are the pull answer's fields (``fields`` is all of it);
    ``traceparent`` and ``tracestate`` the producer's W3C trace context, when
    the work carries one. ``cancelled`` is set when the attempt must stop: the
    server cancelled it (an operator's cancel, or its deadline passed) or the
    worker stops and its grace period is over; ``cancel_reason`` says which.
    A cancelled attempt's result is dropped, so return (or raise) soon.
    """

    def __init__(self, worker: "Worker", fields: Dict[str, Any]) -> None:
        self._worker = worker
        self.fields = fields
        self.id: str = str(fields["id"])
        self.attempt: int = int(fields["attempt"])
        self.queue: str = str(fields.get("queue", "default"))
        self.priority: int = int(fields.get("priority", 0))
        self.payload: Any = fields.get("payload")
        self.timeout_ms: Optional[int] = fields.get("timeout_ms")
        self.deadline: Optional[str] = fields.get("deadline")
        self.traceparent: Optional[str] = fields.get("traceparent") or None
        self.tracestate: Optional[str] = fields.get("tracestate") or None
        self.cancelled = threading.Event()
        self.cancel_reason: Optional[str] = None
        self._progress: Dict[str, Any] = {}   # merged, not sent yet (under the worker's lock)
        self._progress_closed = False          # the server takes no more progress for it
        self._dropped = False                  # its outcome is not to be reported

    @property
    def key(self) -> Key:
        return (self.id, self.attempt)

    def progress(self, fraction: Optional[float] = None, message: Optional[str] = None,
                 output: Optional[str] = None) -> None:
        """Says how far the attempt is (``fraction``, 0 to 1), what it does
        (``message``) and/or adds a chunk of partial ``output``. Returns at
        once: updates are merged (the latest fraction and message, output
        appended) and sent by the worker at most every ``progress_interval``."""
        if fraction is None and message is None and output is None:
            return
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress: fraction {fraction} is not between 0 and 1")
        self._worker._add_progress(self, fraction, message, output)

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def raise_if_cancelled(self) -> None:
        """Raises ``Cancelled`` once the attempt must stop."""
        if self.cancelled.is_set():
            raise Cancelled(self.cancel_reason or "cancelled")

    def _cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()

    def __repr__(self) -> str:
        return f"<Job {self.id} attempt {self.attempt} queue {self.queue}>"


def _report_verdict(report: Dict[str, Any], result: Any) -> Optional[str]:
    """What a server's result for a report says (docs/worker-api.md, step 3):
    None when the report is done with (accepted, or refused for good:
    superseded, cancelled, not-found, not-holder), else why it is to be sent
    again (another refusal, or an entry that is not this report's)."""
    if not isinstance(result, dict):
        return "no result for it in the answer"
    if result.get("id") != report["id"] or result.get("attempt") != report["attempt"]:
        return "the answer's entry is of another attempt"
    accepted = result.get("accepted")
    if accepted is True:
        return None
    if accepted is not False:
        return "the answer's entry says nothing of it"
    reason = result.get("reason")
    if reason in FINAL_REFUSALS:
        return None
    return f"refused: {str(reason)[:80] if reason is not None else 'no reason'}"


def default_worker_id() -> str:
    """``<host>-<pid>``, in the characters a worker id may hold."""
    host = re.sub(r"[^A-Za-z0-9._:@-]", "-", socket.gethostname()) or "worker"
    return f"{host[:100]}-{os.getpid()}"


class Worker:
    """Runs handlers for jobs of a workd cluster.

    ``servers`` and ``token`` as for ``Client`` (``WORKD_SERVER``,
    ``WORKD_TOKEN``). ``worker_id``: stable for this worker (default
    ``<host>-<pid>``). ``capacity``: jobs run at once (each on a thread).
    ``grace``: on ``stop()`` or SIGTERM, how long running jobs may still
    take before they are given back (retried elsewhere). ``pull_wait``: how
    long one pull waits for work (the server caps it, 30 s by default).

    Handlers are registered per queue with ``@worker.handler("queue")``
    (``@worker.handler()`` takes every other queue). A handler gets the
    ``Job`` and returns the result (any JSON value); an exception fails the
    attempt with its text as the error (``Fail(error, retry=False)`` makes
    the work dead at once).
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None, *,
                 worker_id: Optional[str] = None, token: Optional[str] = None,
                 capacity: int = 1, grace: float = 30.0, pull_wait: float = 30.0,
                 progress_interval: float = 0.2) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.transport = Transport(servers, token, retry_for=0)
        self.worker_id = worker_id or default_worker_id()
        if not re.fullmatch(r"[A-Za-z0-9._:@-]{1,128}", self.worker_id):
            raise ValueError(f"worker id {self.worker_id!r}: 1-128 of [A-Za-z0-9._:@-]")
        self.instance = secrets.token_hex(16)
        self.capacity = capacity
        self.grace = grace
        self.pull_wait = pull_wait
        self.progress_interval = progress_interval
        self._handlers: Dict[Optional[str], Handler] = {}
        self._path = f"/workers/{quote(self.worker_id)}"

        # Reentrant: a signal handler (stop()) may run while the main thread holds it.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)    # slots, stop requests, reports
        self._running: Dict[Key, Job] = {}
        self._progressing: Dict[Key, Job] = {}          # jobs with progress not sent yet
        self._progress_sending: Set[Key] = set()        # jobs whose progress is being sent
        self._reports: Dict[Key, Dict[str, Any]] = {}   # sent until acknowledged
        self._report_at: Dict[Key, float] = {}          # when each was added (monotonic)
        self._in_flight: Set[Key] = set()               # in a pull's or the sender's request
        self._own_route: Set[Key] = set()               # not to be carried: the reports route
        self._warned: Set[Key] = set()                  # a refusal of it was logged already
        self._exchange = True                           # the server takes reports in a pull
        self._pull_coming = False                       # a pull is about to be sent
        self._interval = 2.0
        self._stop_at: Optional[float] = None           # monotonic deadline of a graceful stop
        self._pull_stopped = False
        self._quit_control = False                      # heartbeats and sender end
        self._pull_conn: Optional[http.client.HTTPConnection] = None
        self._threads: List[threading.Thread] = []
        self._done = threading.Event()
        self.error: Optional[WorkdError] = None        # why the worker stopped by itself

    # -- handlers

    def handler(self, queue: Optional[str] = None) -> Callable[[Handler], Handler]:
        """Decorator: ``fn(job)`` runs the jobs of ``queue`` (None: of every
        queue without a handler of its own)."""
        def register(fn: Handler) -> Handler:
            if queue in self._handlers:
                raise ValueError(f"a handler for queue {queue!r} is registered already")
            self._handlers[queue] = fn
            return fn
        return register

    def queues(self) -> List[str]:
        """The queues pulled from ([] for every queue, when a catch-all handler exists)."""
        if None in self._handlers:
            return []
        return sorted(q for q in self._handlers if q is not None)

    # -- life

    def run(self, install_signals: bool = True) -> None:
        """Starts the worker and returns once it has stopped. With
        ``install_signals`` (in the main thread), SIGTERM and SIGINT stop it
        gracefully, a second one at once. Raises the error that stopped it,
        if one did (a refused token, a worker id taken)."""
        old: Dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            while not self._done.wait(0.5):
                pass
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        if self.error is not None:
            raise self.error

    def start(self) -> None:
        """Registers (retrying until a server answers), then starts the
        heartbeat, pull, sender and stopper threads and returns. Raises
        WorkdError when the server refuses the worker for good."""
        if not self._handlers:
            raise ValueError("no handler registered (use @worker.handler(queue))")
        self._register()
        for name, target in (("heartbeat", self._heartbeat_main), ("pull", self._pull_main),
                             ("sender", self._sender_main), ("stopper", self._stopper_main)):
            t = threading.Thread(target=target, name=f"workd-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, grace: Optional[float] = None) -> None:
        """Asks the worker to stop: no new work is taken, running jobs have
        ``grace`` seconds (default: the worker's) to finish, then they are
        cancelled and given back; reports are delivered, then the worker
        deregisters. Returns at once (``join()`` waits). A second call may
        shorten the grace period."""
        at = time.monotonic() + (self.grace if grace is None else grace)
        with self._cond:
            if self._stop_at is None or at < self._stop_at:
                self._stop_at = at
            self._cond.notify_all()
        abort(self._pull_conn)

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits until the worker has stopped; False if ``timeout`` ran out."""
        return self._done.wait(timeout)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._stop_at is None:
            log.info("got signal %d: stopping gracefully (again to stop at once)", signum)
            self.stop()
        else:
            log.info("got signal %d again: stopping now", signum)
            self.stop(0)

    def _fatal(self, error: WorkdError) -> None:
        if self.error is None:
            log.error("the server refuses this worker: %s; stopping", error)
            self.error = error
        self.stop(0)

    # -- registration and heartbeats

    def _heartbeat_body(self) -> Dict[str, Any]:
        with self._lock:
            keys = list(self._running) + [k for k in self._reports if k not in self._running]
        return {"instance": self.instance, "capacity": self.capacity, "queues": self.queues(),
                "running": [{"id": i, "attempt": a} for i, a in keys]}

    def _heartbeat(self) -> None:
        answer = self.transport.request("PUT", self._path, self._heartbeat_body()).json()
        interval = answer.get("heartbeat_interval_ms", 2000) / 1000.0
        with self._lock:
            self._interval = min(60.0, max(0.1, interval))
            for c in answer.get("cancel") or []:
                job = self._running.get((c.get("id"), c.get("attempt")))
                if job is not None and not job.cancelled.is_set():
                    log.info("job %s attempt %d cancelled by the server", job.id, job.attempt)
                    job._dropped = True
                    job._cancel("cancelled by the server")

    def _register(self) -> None:
        backoff = Backoff()
        while True:
            try:
                self._heartbeat()
                log.info("registered with %s as %s (capacity %d)", self.transport.server()[1],
                         self.worker_id, self.capacity)
                return
            except WorkdError as e:
                if e.status in (400, 401, 403, 409):
                    raise
                log.warning("cannot register yet: %s", e)
            with self._cond:
                if self._stop_at is not None:
                    raise WorkdError(503, {"title": "stopped", "detail": "stopped before registering"})
                self._cond.wait(backoff.delay())

    def _heartbeat_main(self) -> None:
        backoff = Backoff()
        pause = self._interval
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._quit_control, pause)
                if self._quit_control:
                    return
            try:
                self._heartbeat()
                backoff.reset()
                pause = self._interval
            except WorkdError as e:
                if e.status in (401, 403, 409):
                    self._fatal(e)
                log.warning("heartbeat failed: %s", e)
                pause = min(backoff.delay(e.retry_after), self._interval)

    # -- pulling

    def _free_slots(self) -> int:
        return self.capacity - len(self._running)

    def _pull_main(self) -> None:
        backoff = Backoff()
        flowing = False  # the last pull was given all it asked for: the next is answered soon
        while True:
            with self._cond:
                # Every slot busy: the first to free pulls at once, so its
                # report (and any other just finished) waits to ride along.
                self._pull_coming = True
                self._cond.wait_for(lambda: self._stop_at is not None or self._free_slots() > 0)
                if self._stop_at is not None:
                    break
                free = self._free_slots()
                carried = self._take_for_pull()
                # A pull that carries reports is answered at once, as one is
                # while work flows, and another follows: reports finished
                # meanwhile wait for that one.
                self._pull_coming = bool(carried) or flowing
                self._cond.notify_all()
            t0 = time.monotonic()
            # A pull that carries reports does not wait for jobs: their
            # results would be held until it answers.
            wait = 0 if carried else self.pull_wait
            body: Dict[str, Any] = {"instance": self.instance, "max": free, "wait": wait,
                                    "queues": self.queues()}
            if carried:
                body["reports"] = carried
            try:
                answer = self.transport.request(
                    "POST", self._path + "/pull", body, idempotent=True,
                    timeout=wait + self.transport.timeout,
                    on_conn=self._pulling).json()
                backoff.reset()
            except WorkdError as e:
                self._pull_conn = None
                flowing = False
                if carried and self._carry_refused(carried, e):
                    continue  # pull again at once, without those reports
                self._settle(carried, None)  # no answer: sent again
                if self._stop_at is not None:
                    break
                if e.status in (400, 401, 403, 409):
                    self._fatal(e)
                    break
                log.warning("pull failed: %s", e)
                with self._cond:
                    self._pull_coming = False
                    self._cond.wait_for(lambda: self._stop_at is not None,
                                        backoff.delay(e.retry_after))
                continue
            except BaseException:
                self._pull_conn = None
                self._settle(carried, None)  # they are not lost with this thread
                raise
            self._pull_conn = None
            if not isinstance(answer, dict):
                answer = {}
            if carried:
                results = answer.get("results")
                if not isinstance(results, list):
                    with self._lock:
                        if self._exchange:
                            log.info("the server answered a pull that carried reports without "
                                     "their results: reports go on their own")
                        self._exchange = False
                    results = None
                self._settle(carried, results, pulled=True)
            jobs = answer.get("jobs") or []
            flowing = 0 < free <= len(jobs)
            self._dispatch(jobs)
            if not jobs and not carried:
                left = EMPTY_PULL_MIN - (time.monotonic() - t0)
                if left > 0:
                    with self._cond:
                        self._pull_coming = False
                        self._cond.wait_for(lambda: self._stop_at is not None, left)
        with self._cond:
            self._pull_coming = False
            self._pull_stopped = True
            self._cond.notify_all()

    def _take_for_pull(self) -> List[Dict[str, Any]]:
        """The reports the next pull carries (lock held): those no request
        carries now, whose job's last progress is sent, up to CARRY_MAX."""
        if not self._exchange:
            return []
        taken = []
        for key, report in self._reports.items():
            if key in self._in_flight or key in self._own_route or self._saying(key):
                continue
            self._in_flight.add(key)
            taken.append(report)
            if len(taken) >= CARRY_MAX:
                break
        return taken

    def _carry_refused(self, carried: List[Dict[str, Any]], e: WorkdError) -> bool:
        """A pull that carried reports was refused as a whole with e. True
        when that was for its reports, which then go on their own: a server
        older than the exchange names the field 'reports' (400); a newer one
        refuses a malformed report (400) or too many (413)."""
        if e.status not in (400, 413):
            return False
        with self._cond:
            if "'reports'" in e.detail:
                if self._exchange:
                    log.info("the server takes no reports in a pull (an older version): "
                             "reports go on their own")
                self._exchange = False
            else:
                log.warning("a pull carrying %d report(s) was refused (%s): they go on their "
                            "own", len(carried), e)
                self._own_route.update((r["id"], r["attempt"]) for r in carried)
            self._pull_coming = False
            for r in carried:
                self._in_flight.discard((r["id"], r["attempt"]))
            self._cond.notify_all()
        return True

    def _pulling(self, conn: http.client.HTTPConnection) -> None:
        """The pull's connection, once connected: stop() aborts it."""
        self._pull_conn = conn
        if self._stop_at is not None:  # stop() came before it could see the connection
            abort(conn)

    def _dispatch(self, jobs: List[Dict[str, Any]]) -> None:
        for fields in jobs:
            job = Job(self, fields)
            with self._cond:
                take = self._stop_at is None and self._free_slots() > 0
                if take:
                    self._running[job.key] = job
            if not take:
                self._give_back(job, "worker stopping" if self._stop_at else "no free slot")
                continue
            log.info("job %s attempt %d started", job.id, job.attempt)
            threading.Thread(target=self._run_job, args=(job,), name=f"workd-job-{job.id}",
                             daemon=True).start()

    # -- running jobs

    def _run_job(self, job: Job) -> None:
        handler = self._handlers.get(job.queue, self._handlers.get(None))
        report: Dict[str, Any]
        try:
            if handler is None:
                raise Fail(f"no handler for queue {job.queue!r} in this worker")
            with _trace.handler_span(job.queue, job.id, job.attempt, job.traceparent,
                                     job.tracestate):
                result = handler(job)
            report = {"outcome": "completed", "result": result}
            try:
                json.dumps(result)
            except (TypeError, ValueError) as e:
                report = {"outcome": "failed", "error": f"the result is not JSON: {e}",
                          "retry": False}
        except Fail as e:
            report = {"outcome": "failed", "error": e.error or "failed", "retry": e.retry}
        except Cancelled as e:
            report = {"outcome": "failed", "error": f"cancelled: {e}", "retry": True}
        except Exception as e:  # noqa: BLE001 - a failing handler is a failed attempt
            report = {"outcome": "failed", "error": f"{type(e).__name__}: {e}", "retry": True}
        with self._cond:
            if self._running.get(job.key) is job:
                del self._running[job.key]
                if not job._dropped:
                    self._add_report({"id": job.id, "attempt": job.attempt, **report})
                self._cond.notify_all()
        if job._dropped:
            log.info("job %s attempt %d ended (%s): not reported", job.id, job.attempt,
                     job.cancel_reason)
        elif report["outcome"] == "completed":
            log.info("job %s attempt %d completed", job.id, job.attempt)
        else:
            log.info("job %s attempt %d failed: %s", job.id, job.attempt, report["error"])

    def _give_back(self, job: Job, why: str) -> None:
        """Reports an attempt that will not run (or not finish here) as failed, to be retried."""
        with self._cond:
            self._running.pop(job.key, None)
            job._dropped = True
            self._add_report({"id": job.id, "attempt": job.attempt,
                              "outcome": "failed", "error": why, "retry": True})
            self._cond.notify_all()
        log.info("job %s attempt %d given back: %s", job.id, job.attempt, why)

    def _add_progress(self, job: Job, fraction: Optional[float], message: Optional[str],
                      output: Optional[str]) -> None:
        with self._lock:
            if job._progress_closed or job._dropped:
                return
            p = job._progress
            if fraction is not None:
                p["fraction"] = float(fraction)
            if message is not None:
                p["message"] = message.encode("utf-8")[:1024].decode("utf-8", "ignore")
            if output:
                p["output"] = p.get("output", "") + output
            self._progressing[job.key] = job

    # -- progress and reports

    def _sender_main(self) -> None:
        """Sends progress every progress_interval, and each report as soon as
        it is due (at once, or once a pull about to be sent had CARRY to
        carry it), with capped backoff while the server does not take them."""
        backoff = Backoff()
        next_progress = time.monotonic() + self.progress_interval
        retry_at = 0.0
        while True:
            with self._cond:
                while not self._quit_control:
                    now = time.monotonic()
                    if now >= next_progress:
                        break
                    due = self._report_due()
                    if due is not None:
                        due = max(due, retry_at)
                        if due <= now:
                            break
                    self._cond.wait((next_progress if due is None else min(next_progress, due))
                                    - now)
                quit_now = self._quit_control
            now = time.monotonic()
            if quit_now or now >= next_progress:
                self._send_progress()
                next_progress = time.monotonic() + self.progress_interval
            if quit_now or now >= retry_at:
                ok = self._send_reports(everything=quit_now)
                if ok is True:
                    backoff.reset()
                    retry_at = 0.0
                elif ok is False:
                    retry_at = time.monotonic() + backoff.delay()
            if quit_now:
                return

    def _add_report(self, report: Dict[str, Any]) -> None:
        """Queues a report (lock held): a pull carries it, or the sender sends it."""
        key = (report["id"], report["attempt"])
        self._reports[key] = report
        self._report_at[key] = time.monotonic()
        self._cond.notify_all()

    def _due_at(self, key: Key) -> float:
        """When the sender may send this report (lock held): at once, or once
        a pull about to be sent has had CARRY to carry it."""
        at = self._report_at.get(key, 0.0)
        if self._pull_coming and self._exchange and key not in self._own_route:
            at += CARRY
        return at

    def _report_due(self) -> Optional[float]:
        """When the first report the sender may send is due (lock held); None: none."""
        due = None
        for key in self._reports:
            if key in self._in_flight or self._saying(key):
                continue
            at = self._due_at(key)
            if due is None or at < due:
                due = at
        return due

    def _settle(self, sent: List[Dict[str, Any]], results: Optional[List[Any]],
                pulled: bool = False) -> bool:
        """What an answer said of the reports sent (results None: no answer,
        or none for them). Accepted ones, and ones refused for good, are done;
        the others are sent again (by the reports route, when a pull carried
        them: no pull waits on a report the server will not take yet).
        Returns True when every one is done."""
        all_done = True
        with self._cond:
            for i, r in enumerate(sent):
                key = (r["id"], r["attempt"])
                self._in_flight.discard(key)
                why = "no answer" if results is None else _report_verdict(
                    r, results[i] if i < len(results) else None)
                if why is not None:
                    all_done = False
                    if results is not None:
                        if key not in self._warned:  # said once per report
                            self._warned.add(key)
                            log.warning("report of %s attempt %d not accepted (%s); will retry",
                                        r["id"], r["attempt"], why)
                        if pulled:
                            self._own_route.add(key)
                    continue
                res = results[i]  # type: ignore[index]
                if not res.get("accepted"):
                    log.info("report of %s attempt %d dropped: %s", r["id"], r["attempt"],
                             res.get("reason"))
                if self._reports.get(key) is r:
                    self._drop_report(key)
            self._cond.notify_all()
        return all_done

    def _saying(self, key: Key) -> bool:
        """Whether the job's last progress is still to be sent (lock held): its
        report waits, as a result must not overtake what the job said last."""
        return key in self._progressing or key in self._progress_sending

    def _drop_report(self, key: Key) -> None:
        self._reports.pop(key, None)
        self._report_at.pop(key, None)
        self._own_route.discard(key)
        self._warned.discard(key)

    def _send_progress(self) -> bool:
        with self._lock:
            # Also the last words of jobs that just ended: this goes before their report.
            updates = []
            for key in list(self._progressing)[:MAX_BATCH]:
                j = self._progressing.pop(key)
                if j._progress and not j._progress_closed:
                    updates.append((j, j._progress))
                j._progress = {}
            self._progress_sending = {j.key for j, _ in updates}
        if not updates:
            return True
        try:
            return self._send_progress_batch(updates)
        finally:
            with self._cond:
                self._progress_sending = set()
                self._cond.notify_all()

    def _send_progress_batch(self, updates: List[Tuple[Job, Dict[str, Any]]]) -> bool:
        body = {"instance": self.instance,
                "progress": [{"id": j.id, "attempt": j.attempt, **p} for j, p in updates]}
        try:
            results = self.transport.request("POST", self._path + "/progress", body,
                                             idempotent=True).json()["results"]
        except WorkdError as e:
            log.warning("progress not sent: %s", e)
            if e.status in (401, 403):
                self._fatal(e)
            # Unavailable (503) or busy: send it again later; anything else: drop it.
            again = e.status >= 500 or e.status == 429
            results = [{"accepted": False,
                        "reason": "progress-rate-limited" if again else e.kind}] * len(updates)
        with self._lock:
            for (job, sent), res in zip(updates, results):
                if res.get("accepted"):
                    continue
                if res.get("reason") == "progress-rate-limited":  # merge it back, send later
                    newer = job._progress
                    merged = {**sent, **newer}
                    if "output" in sent or "output" in newer:
                        merged["output"] = sent.get("output", "") + newer.get("output", "")
                    job._progress = merged
                    self._progressing[job.key] = job
                else:
                    job._progress_closed = True
        return True

    def _send_reports(self, everything: bool = False) -> Optional[bool]:
        """Sends the reports that are due (``everything``: all of them) on the
        reports route. None: nothing to send; False: send again later."""
        with self._lock:
            # A job's last progress goes first: its report waits while that is pending.
            now = time.monotonic()
            batch = [r for k, r in self._reports.items()
                     if k not in self._in_flight and not self._saying(k)
                     and (everything or self._due_at(k) <= now)][:MAX_BATCH]
            self._in_flight.update((r["id"], r["attempt"]) for r in batch)
        if not batch:
            return None
        try:
            answer = self.transport.request("POST", self._path + "/reports",
                                            {"instance": self.instance, "reports": batch},
                                            idempotent=True).json()
        except WorkdError as e:
            if e.status in (401, 403):
                self._fatal(e)
            elif 400 <= e.status < 500 and e.status != 429:
                log.error("reports refused, dropped: %s", e)
                with self._cond:
                    for r in batch:
                        key = (r["id"], r["attempt"])
                        self._in_flight.discard(key)
                        if self._reports.get(key) is r:
                            self._drop_report(key)
                    self._cond.notify_all()
                return True
            log.warning("reports not delivered yet: %s", e)
            self._settle(batch, None)
            return False
        results = answer.get("results") if isinstance(answer, dict) else None
        return self._settle(batch, results if isinstance(results, list) else [])

    # -- stopping

    def _stopper_main(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stop_at is not None)
            log.info("stopping: no new work taken")
        abort(self._pull_conn)
        with self._cond:
            # Running jobs have until the deadline (which a second stop may bring forward).
            while self._running or not self._pull_stopped:
                left = (self._stop_at or 0) - time.monotonic()
                if left <= 0:
                    break
                if self._running:
                    log.info("waiting up to %.1fs for %d running job(s)", left,
                             len(self._running))
                self._cond.wait(min(left, 1.0))
            late = list(self._running.values())
        for job in late:
            job._cancel("the worker is stopping")
            self._give_back(job, "worker stopping: grace period over")
        with self._cond:
            self._cond.wait_for(lambda: not self._reports, FLUSH_TIMEOUT)
            if self._reports:
                log.warning("gave up delivering %d report(s)", len(self._reports))
            self._quit_control = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread() and t.name != "workd-pull":
                t.join()
        self._deregister()
        log.info("stopped")
        self._done.set()

    def _deregister(self) -> None:
        deadline = time.monotonic() + DEREGISTER_TIMEOUT
        backoff = Backoff()
        while True:
            try:
                self.transport.request("DELETE", self._path + f"?instance={self.instance}")
                log.info("deregistered from %s", self.transport.server()[1])
                return
            except WorkdError as e:
                if e.status < 500 or time.monotonic() >= deadline:
                    log.warning("could not deregister: %s", e)
                    return
            time.sleep(backoff.delay())
