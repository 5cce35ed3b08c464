"""The relay's sends, watched: a PRODUCER span per message, and the time to its confirm.

With a tracer, each message is built at send time inside its own ``publish <exchange>``
span, a child of the event's stored context (or of the context derived from the payload's
``trace_id``), and carries that span's context to the consumer; the span ends with the
broker's answer. A confirm observer (``OutboxMetrics``) gets the seconds from each publish
to its answer. With neither, a message is the one built ahead or built now, as before,
and nothing else is done.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Protocol

import aio_pika
from opentelemetry.trace import Span, Tracer

from engine.relay import answers
from engine.relay.cloudevents import trace_context
from engine.relay.messages import MessageBuilder
from engine.tracing import spans
from engine.tracing.propagation import context_of, parent_context
from engine.tracing.tracer import active_tracer
from engine.writing.envelope import EventEnvelope


class ConfirmObserver(Protocol):
    """Told how long the broker took to answer each publish (``outcome``: ``published``
    when it confirmed, else ``failed``)."""

    def observe_confirm(self, event_type: str, outcome: str, seconds: float) -> None: ...


class WatchedSends:
    """One publish call's sends, traced when a tracer is configured and timed for
    ``observer``."""

    def __init__(
        self, observer: ConfirmObserver | None, messages: MessageBuilder, exchange: str
    ) -> None:
        self.tracer: Tracer | None = active_tracer()
        self.observer = observer
        self._watching = self.tracer is not None or observer is not None
        self._messages = messages
        self._exchange = exchange
        self._spans: dict[str, Span] = {}

    def message(
        self, envelope: EventEnvelope, prepared: dict[str, aio_pika.Message]
    ) -> aio_pika.Message:
        """The event's message; with a tracer, built inside its span, carrying its context."""
        if self.tracer is None:
            return prepared.pop(envelope.event_id, None) or self._messages.build(envelope)
        prepared.pop(envelope.event_id, None)  # built with the stored context: not this span's
        stored = trace_context(envelope)
        parent = None if stored is None else parent_context(*stored)
        span = spans.start_send(self.tracer, envelope, parent, self._exchange)
        try:
            message = self._messages.build(envelope, context_of(span))
        except Exception as exc:
            spans.record_failure(span, exc)
            spans.end(span, "failed", f"{type(exc).__name__}: {exc}")
            raise
        self._spans[envelope.event_id] = span
        return message

    def sent(self, envelope: EventEnvelope, task: asyncio.Task[Any]) -> None:
        """The publish of ``envelope`` is out: end its span and time it at the answer."""
        if not self._watching:
            return
        span = self._spans.pop(envelope.event_id, None)
        started = asyncio.get_running_loop().time()
        task.add_done_callback(functools.partial(self._answered, envelope, span, started))

    def _answered(
        self, envelope: EventEnvelope, span: Span | None, started: float, task: asyncio.Task[Any]
    ) -> None:
        problem = None if task.cancelled() else answers.confirmation_problem(task)
        if task.cancelled():
            problem = TimeoutError("no confirm before the call's deadline")
        outcome = "published" if problem is None else "failed"
        if self.observer is not None:
            seconds = asyncio.get_running_loop().time() - started
            self.observer.observe_confirm(envelope.event_type, outcome, seconds)
        if span is not None:
            if problem is not None:
                spans.record_failure(span, problem)
            error = None if problem is None else f"{type(problem).__name__}: {problem}"
            spans.end(span, outcome, error)
