"""One trace in one process: request span → outbox write → process span → handler's span.

Against SQLite and PostgreSQL, with the SDK's in-memory exporter (tests/tracing/conftest).
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from engine import (
    EventHandlerPermanentError,
    EventValidationError,
    OutboxDispatcher,
    OutboxEventPublisher,
    unit_of_work,
)
from engine.operating.replay import replay_dead_letter
from engine.tracing import TraceContextFilter
from tests.engine.conftest import CTX, order_payload, row

from .conftest import Spans, parent_id, span_id, trace_id, traceparent_of


async def publish_in_request(db, registry, spans: Spans, clock, **kwargs):
    with spans.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER):
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            return await OutboxEventPublisher(session, clock=clock).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1",
                **kwargs,
            )  # fmt: skip


async def test_the_handler_span_is_in_the_request_trace(db, registry, clock, spans, caplog):
    log = logging.getLogger("tests.orders")

    @registry.handler("orders.placed", key="billing.charge")
    async def charge(envelope):
        with spans.tracer.start_as_current_span("charge card"):  # the handler's own call
            log.warning("charging %s", envelope.payload["order_id"])

    caplog.handler.addFilter(TraceContextFilter())
    event_id = await publish_in_request(db, registry, spans, clock, ordering_key="order:o-1")
    request, write = spans.one("POST /orders"), spans.one("publish orders.placed")
    assert write.kind is SpanKind.PRODUCER
    assert parent_id(write) == span_id(request) and trace_id(write) == trace_id(request)
    assert dict(write.attributes or {}) == {
        "messaging.system": "outbox",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "orders.placed",
        "messaging.message.id": event_id,
        "outbox.tenant_id": "acme",
        "outbox.event_version": 1,
        "outbox.ordering_key": "order:o-1",
        "outbox.outcome": "written",
    }
    stored = await row(db, event_id)
    assert stored["traceparent"] == traceparent_of(write)  # its own column ...
    assert "traceparent" not in stored["payload"]  # ... not the business payload
    assert stored["payload"]["trace_id"] == "trace-abc"  # TaskContext's, as before

    clock.advance(7)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, dispatcher_id="d1")
    assert (await dispatcher.dispatch_once()).published == 1
    process, call = spans.one("process orders.placed"), spans.one("charge card")
    assert process.kind is SpanKind.CONSUMER
    assert trace_id(process) == trace_id(request)
    assert parent_id(process) == span_id(write)  # the stored context is its parent
    assert [link.context.span_id for link in process.links] == [span_id(write)]  # and link
    assert parent_id(call) == span_id(process)  # the handler ran inside it
    attributes = dict(process.attributes or {})
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == event_id
    assert attributes["outbox.attempt"] == 1
    assert attributes["outbox.waited_seconds"] == 7.0
    assert attributes["outbox.outcome"] == "published"
    assert process.status.status_code is StatusCode.UNSET
    [record] = [r for r in caplog.records if r.name == "tests.orders"]
    assert record.trace_id == f"{trace_id(request):032x}"
    assert record.span_id == f"{span_id(call):016x}"


async def test_a_retry_a_dead_letter_and_a_replay_stay_in_the_trace(db, registry, clock, spans):
    failures = iter([RuntimeError("card declined"), EventHandlerPermanentError("no such card")])

    @registry.handler("orders.placed", key="billing.charge")
    async def charge(envelope):
        failure = next(failures, None)
        if failure is not None:
            raise failure

    event_id = await publish_in_request(db, registry, spans, clock)
    write = spans.one("publish orders.placed")
    dispatcher = OutboxDispatcher(db, registry, clock=clock, dispatcher_id="d1")
    assert (await dispatcher.dispatch_once()).failed == 1
    clock.advance(3600)  # past the backoff
    assert (await dispatcher.dispatch_once()).dead_lettered == 1
    await replay_dead_letter(db, [event_id], operator="ops", reason="card fixed", now=clock())
    assert (await dispatcher.dispatch_once()).published == 1

    attempts = spans.named("process orders.placed")
    assert [dict(s.attributes or {})["outbox.outcome"] for s in attempts] == [
        "failed",
        "dead_letter",
        "published",
    ]
    assert all(parent_id(s) == span_id(write) for s in attempts)  # one trace, one parent
    assert all(trace_id(s) == trace_id(write) for s in attempts)
    first, dead, replayed = attempts
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "billing.charge: RuntimeError: card declined"
    [exception] = [e for e in first.events if e.name == "exception"]
    assert (exception.attributes or {})["exception.type"] == "RuntimeError"
    assert dead.status.status_code is StatusCode.ERROR
    assert [dict(s.attributes or {})["outbox.attempt"] for s in attempts] == [1, 2, 1]
    assert dict(replayed.attributes or {})["outbox.replay_count"] == 1
    assert replayed.status.status_code is StatusCode.UNSET


async def test_a_failed_write_ends_its_span_with_the_error(db, registry, clock, spans):
    with pytest.raises(EventValidationError):
        await _publish_unserialisable(db, registry, clock)
    write = spans.one("publish orders.cancelled")
    assert write.status.status_code is StatusCode.ERROR
    assert dict(write.attributes or {})["outbox.outcome"] == "not_written"


async def _publish_unserialisable(db, registry, clock):
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        await OutboxEventPublisher(session, clock=clock).publish(
            "orders.cancelled",  # no schema: only the INSERT finds the payload is not JSON
            {"order_id": "o-1", "when": object()},
            aggregate_type="order",
            aggregate_id="o-1",
        )
