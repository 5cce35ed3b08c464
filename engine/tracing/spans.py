"""The engine's spans, named and described as OpenTelemetry's messaging conventions say.

- ``publish <event type>`` (PRODUCER): an event written to the outbox, in the caller's
  transaction. Its context is what the row stores (``traceparent``, ``tracestate``).
- ``process <event type>`` (CONSUMER): one delivery of an event to its handlers, a child
  of the stored context, so every attempt, retry and replay joins the producer's trace;
  the handlers run inside it.
- ``publish <exchange>`` (PRODUCER): the relay's send of one event to RabbitMQ, a child of
  the stored context; its own context travels in the message (AMQP headers and the
  CloudEvents ``traceparent``/``tracestate`` extension) to the consuming service.

Attributes: ``messaging.system`` (``outbox``, or ``rabbitmq`` for the relay),
``messaging.operation.type`` / ``.name``, ``messaging.destination.name`` (the event type;
for RabbitMQ the exchange, the event type being the routing key),
``messaging.message.id`` (the event id), and the outbox's own under ``outbox.*``: tenant,
attempt, ordering key, the time waited. Never a payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:  # engine.writing imports this package: no import back at run time
    from engine.writing.envelope import EventEnvelope

SYSTEM = "outbox"
SYSTEM_RABBITMQ = "rabbitmq"
# Attribute names, spelled once.
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
ROUTING_KEY = "messaging.rabbitmq.destination.routing_key"
TENANT = "outbox.tenant_id"
EVENT_VERSION = "outbox.event_version"
ORDERING_KEY = "outbox.ordering_key"
ATTEMPT = "outbox.attempt"
REPLAYS = "outbox.replay_count"
WAITED = "outbox.waited_seconds"
OUTCOME = "outbox.outcome"
ERROR_TYPE = "error.type"


def start_publish(tracer: Tracer, row: Mapping[str, object]) -> Span:
    """The PRODUCER span of one outbox write (``row``: the values being inserted); a child
    of the current span, if any."""
    attributes: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_TYPE: "send",
        OPERATION_NAME: "publish",
        DESTINATION: str(row["event_type"]),
        MESSAGE_ID: str(row["id"]),
        TENANT: str(row["tenant_id"]),
        EVENT_VERSION: int(str(row["event_version"])),
    }
    key = row.get("ordering_key")
    if key is not None:
        attributes[ORDERING_KEY] = str(key)
    return tracer.start_span(
        f"publish {row['event_type']}", kind=SpanKind.PRODUCER, attributes=attributes
    )


def start_process(
    tracer: Tracer, envelope: EventEnvelope, parent: Context | None, started: datetime
) -> Span:
    """The CONSUMER span of one delivery of ``envelope`` to its handlers, under ``parent``
    (the stored context; None starts a trace).

    The conventions ask a ``process`` span to link the message's creation context and let
    one that processes a single message take it as its parent too: it does both, so a
    backend that follows only links (batch views) finds the producer as well.
    """
    attributes = _event_attributes(envelope, SYSTEM, "process", "process")
    attributes[DESTINATION] = envelope.event_type
    attributes[WAITED] = max(0.0, (started - envelope.created_at).total_seconds())
    links = None if parent is None else [Link(trace.get_current_span(parent).get_span_context())]
    return tracer.start_span(
        f"process {envelope.event_type}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
    )


def start_send(
    tracer: Tracer, envelope: EventEnvelope, parent: Context | None, exchange: str
) -> Span:
    """The relay's PRODUCER span of one message to ``exchange``, under ``parent``."""
    attributes = _event_attributes(envelope, SYSTEM_RABBITMQ, "send", "publish")
    attributes[DESTINATION] = exchange
    attributes[ROUTING_KEY] = envelope.event_type
    return tracer.start_span(
        f"publish {exchange}", context=parent, kind=SpanKind.PRODUCER, attributes=attributes
    )


def _event_attributes(
    envelope: EventEnvelope, system: str, operation_type: str, operation_name: str
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: system,
        OPERATION_TYPE: operation_type,
        OPERATION_NAME: operation_name,
        MESSAGE_ID: envelope.event_id,
        TENANT: envelope.tenant_id,
        EVENT_VERSION: envelope.event_version,
        ATTEMPT: envelope.attempt_count,
    }
    if envelope.replay_count:
        attributes[REPLAYS] = envelope.replay_count
    if envelope.ordering_key is not None:
        attributes[ORDERING_KEY] = envelope.ordering_key
    return attributes


def end(span: Span, outcome: str, error: str | None = None) -> None:
    """End ``span`` with the outcome of its work: an error sets its status (an exception
    raised inside it was recorded where it was caught)."""
    span.set_attribute(OUTCOME, outcome)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def record_failure(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` (a no-op on a span that records nothing)."""
    if span.is_recording():
        span.record_exception(exc)
        span.set_attribute(ERROR_TYPE, type(exc).__qualname__)


def record_current_failure(exc: BaseException) -> None:
    """Record ``exc`` on the current span (the event's ``process`` span while its handlers
    run); nothing when no span records."""
    record_failure(trace.get_current_span(), exc)
