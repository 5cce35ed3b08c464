"""Watching one event's delivery: its ``process`` span and what the metrics learn of it.

A round asks once whether anything watches (a tracer is configured, or a delivery
observer such as ``OutboxMetrics`` is attached); when nothing does, the workers call the
handler runner directly and a delivery costs what it did before tracing existed. When
something does, ``Probe.run`` wraps each delivery: the span is the current one while the
handlers run (their own instrumented calls join the trace), and the observers get the
event type, the outcome, the time the event waited (``created_at`` to the start of
processing) and the handlers' duration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Tracer

from engine.clock import Clock
from engine.dispatch.claimed import ClaimedRow, Outcome
from engine.dispatch.handler_timeouts import HandlerTimeouts
from engine.tracing import spans
from engine.tracing.propagation import parent_context
from engine.writing.envelope import EventEnvelope

RunEvent = Callable[
    [
        ClaimedRow,
        EventEnvelope,
        set[tuple[str, str]],
        HandlerTimeouts,
        "asyncio.Task[None] | None",
        datetime,
    ],
    Awaitable[Outcome],
]

# The outcome of one attempt, as metrics and spans name it (an attempt handed back
# unattempted was no attempt: it is not observed).
_LABELS = {
    "published": "published",
    "completed": "published",
    "failed": "failed",
    "dead_letter": "dead_letter",
    "lost": "lost_lease",
}


class DeliveryObserver(Protocol):
    """Told about every attempt at delivering an event (metrics).

    ``outcome``: ``published``, ``failed``, ``dead_letter`` or ``lost_lease``;
    ``lag_seconds``: from the event's ``created_at`` to the start of this attempt;
    ``duration_seconds``: its handlers' time, None for a relay (the broker's confirm
    is timed by the relay itself).
    """

    def observe_delivery(
        self, event_type: str, outcome: str, lag_seconds: float, duration_seconds: float | None
    ) -> None: ...


def delivery_observers(observers: Sequence[object]) -> list[DeliveryObserver]:
    """The observers that want each delivery (those with ``observe_delivery``)."""
    return [o for o in observers if callable(getattr(o, "observe_delivery", None))]  # type: ignore[misc]


def outcome_label(outcome: Outcome, envelope: EventEnvelope) -> str | None:
    """The attempt's outcome; a failure on the event's last attempt is its dead letter
    (unless the broker was away: that never spends the last attempt)."""
    kind = outcome.kind
    if kind == "failed" and not outcome.away and envelope.attempt_count >= envelope.max_attempts:
        return "dead_letter"
    return _LABELS.get(kind)


class Probe:
    """One round's watchers: the tracer (None: no spans) and the delivery observers."""

    def __init__(
        self, tracer: Tracer | None, observers: Sequence[DeliveryObserver], clock: Clock
    ) -> None:
        self.tracer = tracer
        self.observers = observers
        self.clock = clock

    def wrap(self, run_event: RunEvent) -> RunEvent:
        """``run_event``, watched."""

        async def watched(
            row: ClaimedRow,
            envelope: EventEnvelope,
            done: set[tuple[str, str]],
            timeouts: HandlerTimeouts,
            worker: asyncio.Task[None] | None,
            deadline: datetime,
        ) -> Outcome:
            started = self.clock()
            began = time.perf_counter()
            span = token = None
            if self.tracer is not None:
                parent = parent_context(envelope.traceparent, envelope.tracestate)
                span = spans.start_process(self.tracer, envelope, parent, started)
                token = otel_context.attach(trace.set_span_in_context(span))
            try:
                outcome = await run_event(row, envelope, done, timeouts, worker, deadline)
            except BaseException as exc:
                if span is not None:
                    spans.record_failure(span, exc)
                    spans.end(span, "aborted", f"{type(exc).__name__}: {exc}")
                raise
            finally:
                if token is not None:
                    otel_context.detach(token)
            label = outcome_label(outcome, envelope)
            if span is not None:
                failed = label in ("failed", "dead_letter")
                spans.end(span, label or outcome.kind, outcome.error if failed else None)
            if label is not None:
                lag = (started - envelope.created_at).total_seconds()
                duration = time.perf_counter() - began
                for observer in self.observers:
                    observer.observe_delivery(envelope.event_type, label, lag, duration)
            return outcome

        return watched


def observe_relayed(
    observers: Sequence[DeliveryObserver],
    outcomes: Sequence[Outcome],
    envelopes: Mapping[str, EventEnvelope],
    started: datetime,
) -> None:
    """Tell ``observers`` about a batch relayed from ``started`` on."""
    for outcome in outcomes:
        envelope = envelopes[outcome.row.event_id]
        label = outcome_label(outcome, envelope)
        if label is None:
            continue
        lag = (started - envelope.created_at).total_seconds()
        for observer in observers:
            observer.observe_delivery(envelope.event_type, label, lag, None)
