"""W3C trace context in and out of an event: the ``traceparent`` and ``tracestate`` columns.

An event stores the context it was published in (the PRODUCER span of its outbox write,
or whatever span was current) so that its processing, in any process and after any
number of retries, continues that trace. Injecting and extracting go through the API's
W3C propagator, so the columns and the broker's headers hold exactly what any other
OpenTelemetry service reads and writes.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

W3C = TraceContextTextMapPropagator()
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


class TraceContext(NamedTuple):
    """An event's stored trace context: the two W3C fields as text."""

    traceparent: str
    tracestate: str | None = None


class TraceParent(NamedTuple):
    """What a ``traceparent`` names: the trace, and the span the event's spans hang under."""

    trace_id: str
    span_id: str  # the parent the event's own spans take
    sampled: bool


def context_of(span: Span) -> TraceContext | None:
    """The W3C fields of ``span``'s context; None when it has none (no span, an invalid one)."""
    carrier: dict[str, str] = {}
    W3C.inject(carrier, trace.set_span_in_context(span))
    parent = carrier.get("traceparent")
    return None if parent is None else TraceContext(parent, carrier.get("tracestate"))


def current_context() -> TraceContext | None:
    """The W3C fields of the current span, if there is a valid one."""
    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    return context_of(span)


def parent_context(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """A context whose current span is the stored one (remote, not recording): what the
    event's own spans take as their parent. None when ``traceparent`` is missing or not a
    valid W3C traceparent (then the event's spans start a trace of their own)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = W3C.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The trace id, parent span id and sampled flag of a valid W3C ``traceparent``."""
    if not value:
        return None
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return None
    version, trace_id, span_id, flags, extra = found.groups()
    if version == "ff" or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    if version == "00" and extra is not None:
        return None
    return TraceParent(trace_id, span_id, bool(int(flags, 16) & 1))
