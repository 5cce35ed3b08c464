"""Capture at publish from synchronous code: the sync publisher and domain events recorded
in a sync unit of work store their PRODUCER span's context, as the async publisher does."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import SpanKind
from sqlalchemy import select

from engine import (
    OutboxDispatcher,
    SyncOutboxEventPublisher,
    create_engine,
    create_schema,
    create_sync_engine,
    sync_unit_of_work,
)
from engine.storage.schema import outbox_events
from tests.engine.conftest import CTX, order_payload
from tests.engine.test_sync_publish import Base, Order

from .conftest import Spans, parent_id, span_id, trace_id, traceparent_of


@dataclass(frozen=True)
class OrderCancelled:
    order_id: str


async def test_a_sync_publish_and_a_domain_event_store_their_spans(
    tmp_path, registry, clock, spans: Spans
):
    registry.map_domain_event(
        OrderCancelled, event_type="orders.cancelled", aggregate_type="order",
        subject=lambda e: e.order_id,
    )  # fmt: skip
    url = f"sqlite+aiosqlite:///{tmp_path}/outbox.db"
    await create_schema(url)
    producer = create_sync_engine(f"sqlite:///{tmp_path}/outbox.db")
    Base.metadata.create_all(producer)
    try:
        with (
            spans.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER),
            sync_unit_of_work(producer, registry=registry, context=CTX) as session,
        ):
            SyncOutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
            order = Order(id="o-1")
            session.add(order)
            order.record_event(OrderCancelled("o-1"))
        with producer.connect() as conn:
            query = select(outbox_events.c.event_type, outbox_events.c.traceparent)
            stored = {row[0]: row[1] for row in conn.execute(query)}
    finally:
        producer.dispose()

    request = spans.one("POST /orders")
    for event_type in ("orders.placed", "orders.cancelled"):
        write = spans.one(f"publish {event_type}")
        assert write.kind is SpanKind.PRODUCER
        assert parent_id(write) == span_id(request)
        assert stored[event_type] == traceparent_of(write)

    @registry.handler("orders.placed", key="billing.charge")
    async def charge(envelope):
        pass

    db = create_engine(url)
    try:
        await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    finally:
        await db.dispose()
    process = spans.one("process orders.placed")
    assert parent_id(process) == span_id(spans.one("publish orders.placed"))
    assert trace_id(process) == trace_id(request)
