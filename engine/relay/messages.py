"""The AMQP message of an outbox event: a persistent CloudEvent whose body is encoded once.

Its trace context travels twice: in the CloudEvent (the distributed-tracing extension) and
as the AMQP headers ``traceparent`` and ``tracestate``, where OpenTelemetry's own AMQP
instrumentations look for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import aio_pika

from engine.relay.cloudevents import CONTENT_TYPE, encode_cloudevent, to_cloudevent
from engine.tracing.propagation import TraceContext
from engine.tracing.tracer import active_tracer
from engine.writing.envelope import EventEnvelope

# build_ahead() yields to the event loop after this many messages built.
_PREPARE_CHUNK = 50


class MessageBuilder:
    """Builds each event's message: ``source_prefix`` names the CloudEvents ``source``
    (``<prefix>/<aggregate_type>``, also the AMQP ``app_id``)."""

    def __init__(self, source_prefix: str, new_span_id: Callable[[], str]) -> None:
        self.source_prefix = source_prefix
        self._new_span_id = new_span_id

    def build(self, envelope: EventEnvelope, trace: TraceContext | None = None) -> aio_pika.Message:
        """The persistent AMQP message of one event; its body is encoded once, here.
        ``trace``: the relay's span's context (default: the event's own, if any)."""
        raw = envelope.raw_payload  # sent as stored, not decoded and encoded again
        event = to_cloudevent(
            envelope,
            source_prefix=self.source_prefix,
            new_span_id=self._new_span_id,
            data=raw is None,
            trace=trace,
        )
        headers: dict[str, aio_pika.abc.FieldValue] | None = None
        if "traceparent" in event:
            headers = {"traceparent": event["traceparent"]}
            if "tracestate" in event:
                headers["tracestate"] = event["tracestate"]
        return aio_pika.Message(
            encode_cloudevent(event, raw),
            headers=headers,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=envelope.event_id,
            content_type=CONTENT_TYPE,
            timestamp=envelope.created_at,
            type=envelope.event_type,
            app_id=event["source"],
        )

    async def build_ahead(self, envelopes: Sequence[EventEnvelope]) -> dict[str, aio_pika.Message]:
        """The messages of ``envelopes`` by event id, yielding to the event loop now and
        then; an event whose message cannot be built is left out (its publish builds it
        again and reports the error). None while tracing: each message is built inside its
        own span then (engine.relay.watching)."""
        built: dict[str, aio_pika.Message] = {}
        if active_tracer() is not None:
            return built
        for index, envelope in enumerate(envelopes, 1):
            try:
                built[envelope.event_id] = self.build(envelope)
            except Exception:
                continue
            if index % _PREPARE_CHUNK == 0:
                await asyncio.sleep(0)  # let the database round trip go out meanwhile
        return built
