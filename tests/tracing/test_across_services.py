"""One trace across services: A's request → A's outbox → A's relay → RabbitMQ → B's inbox →
B's dispatcher → B's handler. Service A on SQLite, service B on both databases."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import select

from engine import (
    EventRegistry,
    OutboxDispatcher,
    OutboxEventPublisher,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.relay.rabbitmq import RabbitMqOutboxPublisher
from engine.running.build import build_dispatcher
from engine.running.metrics import OutboxMetrics
from engine.settings import DispatcherSettings
from engine.storage.schema import outbox_events as t
from tests.engine.conftest import CTX, ORDER_PLACED, order_payload
from tests.inbox.conftest import eventually, running

from .conftest import Spans, parent_id, span_id, trace_id, traceparent_of

pytestmark = [pytest.mark.rabbitmq]
ROOT = Path(__file__).resolve().parents[2]


def service_a() -> EventRegistry:
    registry = EventRegistry()
    registry.register_event("orders.placed", 1, ORDER_PLACED)
    return registry


async def test_the_consumers_handler_is_in_the_producers_trace(
    db, sqlite_url, amqp_url, inbound, spans: Spans
):
    a_db = create_engine(sqlite_url.replace("outbox.db", "service-a.db"))
    await create_schema(a_db)
    a = service_a()
    b = service_a()  # the consuming service registers the type it handles

    @b.handler("orders.placed", key="shipping.reserve")
    async def reserve(envelope):
        with spans.tracer.start_as_current_span("reserve stock"):
            await asyncio.sleep(0)

    try:
        with spans.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER):
            async with unit_of_work(a_db, registry=a, context=CTX) as session:
                await OutboxEventPublisher(session).publish(
                    "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
                )
        await inbound.declare()
        async with RabbitMqOutboxPublisher(amqp_url, exchange=inbound.exchange) as relay:
            result = await OutboxDispatcher(a_db, a, external_publisher=relay).dispatch_once()
        assert result.published == 1
    finally:
        await a_db.dispose()

    async with running(db, b, inbound.settings(), amqp_url) as run:
        await eventually(lambda: _stored(db), "B's inbox to store the event")
        await run.stop()
    async with db.connect() as conn:
        stored = (await conn.execute(select(t.c.traceparent, t.c.tracestate))).one()
    assert (await OutboxDispatcher(db, b).dispatch_once()).published == 1

    request = spans.one("POST /orders")
    write = spans.one("publish orders.placed")
    send = spans.one(f"publish {inbound.exchange}")
    process = spans.one("process orders.placed")
    handler = spans.one("reserve stock")
    assert {trace_id(s) for s in (request, write, send, process, handler)} == {trace_id(request)}
    assert parent_id(write) == span_id(request)
    assert parent_id(send) == span_id(write)  # the relay continues the stored context
    assert parent_id(process) == span_id(send)  # B continues what the message carried
    assert parent_id(handler) == span_id(process)
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert stored.traceparent == traceparent_of(send)
    attributes = dict(send.attributes or {})
    assert attributes["messaging.system"] == "rabbitmq"
    assert attributes["messaging.destination.name"] == inbound.exchange
    assert attributes["messaging.rabbitmq.destination.routing_key"] == "orders.placed"
    assert attributes["outbox.outcome"] == "published"
    assert send.status.status_code is StatusCode.UNSET
    # The tree docs/tracing.md shows is this one.
    tree = spans.tree(request)
    found = [(depth, name.replace(inbound.exchange, "outbox.events"), k) for depth, name, k in tree]
    assert found == documented_tree()


def documented_tree() -> list[tuple[int, str, str]]:
    """(depth, name, kind) of each line of the span tree in docs/tracing.md."""
    text = (ROOT / "docs" / "tracing.md").read_text()
    block = text.split("## What a trace looks like", 1)[1].split("```", 2)[1]
    tree = []
    for line in block.strip("\n").splitlines():
        label = line.lstrip(" │└─├")
        depth = (len(line) - len(label)) // 3
        name, kind = re.split(r"\s{2,}", label.strip())[:2]
        tree.append((depth, name, kind))
    return tree


async def _stored(db) -> bool:
    async with db.connect() as conn:
        return (await conn.execute(select(t.c.id))).first() is not None


async def test_a_message_the_broker_cannot_route_ends_its_span_in_error(
    sqlite_url, amqp_url, inbound, spans: Spans
):
    a_db = create_engine(sqlite_url)
    await create_schema(a_db)
    a = service_a()
    try:
        async with unit_of_work(a_db, registry=a, context=CTX) as session:
            await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
        # The exchange exists, no queue is bound: the mandatory message comes back.
        async with RabbitMqOutboxPublisher(amqp_url, exchange=inbound.exchange) as relay:
            result = await OutboxDispatcher(a_db, a, external_publisher=relay).dispatch_once()
        assert result.failed == 1
    finally:
        await a_db.dispose()
    send = spans.one(f"publish {inbound.exchange}")
    assert parent_id(send) == span_id(spans.one("publish orders.placed"))
    assert send.status.status_code is StatusCode.ERROR
    assert dict(send.attributes or {})["outbox.outcome"] == "failed"
    assert any(e.name == "exception" for e in send.events)


async def test_the_relay_times_each_publish_to_its_confirm(sqlite_url, amqp_url, inbound):
    """Metrics without tracing: the relay's confirm histogram and the outbox lag."""
    a_db = create_engine(sqlite_url)
    await create_schema(a_db)
    a = service_a()
    metrics = OutboxMetrics()
    try:
        async with unit_of_work(a_db, registry=a, context=CTX) as session:
            for n in range(3):
                await OutboxEventPublisher(session).publish(
                    "orders.placed", order_payload(f"o-{n}"), aggregate_type="order",
                    aggregate_id=f"o-{n}",
                )  # fmt: skip
        await inbound.declare()
        async with RabbitMqOutboxPublisher(
            amqp_url, exchange=inbound.exchange, observer=metrics
        ) as relay:
            dispatcher = build_dispatcher(
                a_db, a, DispatcherSettings(), external_publisher=relay, metrics=metrics
            )
            assert (await dispatcher.dispatch_once()).published == 3
    finally:
        await a_db.dispose()
    labels = {"event_type": "orders.placed", "outcome": "published"}
    confirm = metrics.registry.get_sample_value("outbox_relay_confirm_seconds_count", labels)
    assert confirm == 3
    assert metrics.registry.get_sample_value("outbox_relay_confirm_seconds_sum", labels) > 0
    assert metrics.registry.get_sample_value("outbox_event_lag_seconds_count", labels) == 3
    # A relay has no handlers: no handler time is observed.
    assert metrics.registry.get_sample_value("outbox_handler_duration_seconds_count", labels) in (
        None,
        0,
    )
