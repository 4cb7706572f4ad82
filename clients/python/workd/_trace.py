"""W3C trace context across the queue: when OpenTelemetry's API is
importable, a handler runs in a span that continues the producer's trace (the
first attempt as its child, a later attempt as a new span linked to it, as
OpenTelemetry's messaging conventions say). Without it, nothing happens here:
the context is only handed to the handler on the job."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Dict, Iterator, Optional

_trace: Any = None
_propagation: Any = None
try:  # optional: the library never needs it
    _trace = importlib.import_module("opentelemetry.trace")
    _propagation = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
except ImportError:
    _trace = None

TRACER_NAME = "workd"


def available() -> bool:
    """True when OpenTelemetry's API is importable (spans are made)."""
    return _trace is not None


@contextlib.contextmanager
def handler_span(queue: str, work_id: str, attempt: int, traceparent: Optional[str],
                 tracestate: Optional[str]) -> Iterator[Any]:
    """A CONSUMER span around one run of a handler (None without OpenTelemetry).
    An exception raised inside is recorded on the span and passed on."""
    if _trace is None:
        yield None
        return
    carrier: Dict[str, str] = {}
    if traceparent:
        carrier["traceparent"] = traceparent
        if tracestate:
            carrier["tracestate"] = tracestate
    producer = _propagation.TraceContextTextMapPropagator().extract(carrier) if carrier else None
    producer_span = _trace.get_current_span(producer).get_span_context() if producer else None
    attributes = {"messaging.system": "workd", "messaging.operation": "process",
                  "messaging.destination.name": queue, "messaging.message.id": work_id,
                  "workd.attempt": attempt}
    tracer = _trace.get_tracer(TRACER_NAME)
    name = f"process {queue}"
    if producer_span is not None and producer_span.is_valid and attempt == 1:
        with tracer.start_as_current_span(name, context=producer, kind=_trace.SpanKind.CONSUMER,
                                          attributes=attributes) as span:
            yield span
        return
    links = []
    if producer_span is not None and producer_span.is_valid:
        links.append(_trace.Link(producer_span))
    with tracer.start_as_current_span(name, kind=_trace.SpanKind.CONSUMER,
                                      attributes=attributes, links=links) as span:
        yield span
