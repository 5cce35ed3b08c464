"""The stored context: rows written by plain SQL, and a process with no tracer configured."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import text

from engine import OutboxDispatcher, OutboxEventPublisher, unit_of_work
from engine.tracing import set_tracer_provider
from tests.engine.conftest import CTX, order_payload, row

from .conftest import Spans, parent_id

SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
SENDER = f"00-{SENDER_TRACE}-{SENDER_SPAN}-01"
PAYLOAD = (
    '{"order_id": "o-9", "amount": 1, "tenant_id": "acme", "actor_id": "svc", "request_id": "r"}'
)


async def insert_by_hand(db, event_id: str, traceparent=None, tracestate=None) -> None:
    """What a service in another language writes: the contract's columns, nothing more."""
    columns = "id, tenant_id, event_type, event_version, aggregate_type, aggregate_id, payload"
    values = ":id, 'acme', 'orders.placed', 1, 'order', 'o-9', :payload"
    if traceparent is not None:
        columns += ", traceparent, tracestate"
        values += ", :traceparent, :tracestate"
    async with db.begin() as conn:
        await conn.execute(
            text(f"INSERT INTO outbox_events ({columns}) VALUES ({values})"),
            dict(id=event_id, payload=PAYLOAD, traceparent=traceparent, tracestate=tracestate),
        )


def served(registry):
    @registry.handler("orders.placed", key="billing.charge")
    async def charge(envelope):
        pass

    return registry


async def test_a_plain_sql_row_with_a_traceparent_continues_that_trace(db, registry, clock, spans):
    await insert_by_hand(db, "0190a8e0-0000-7000-8000-000000000001", SENDER, "vendor=abc")
    await OutboxDispatcher(db, served(registry), clock=clock).dispatch_once()
    process = spans.one("process orders.placed")
    context = process.get_span_context()
    assert f"{context.trace_id:032x}" == SENDER_TRACE
    assert parent_id(process) == int(SENDER_SPAN, 16)
    assert process.parent is not None and process.parent.is_remote
    assert process.parent.trace_state.to_header() == "vendor=abc"  # tracestate carried


async def test_a_plain_sql_row_without_one_starts_a_trace(db, registry, clock, spans: Spans):
    await insert_by_hand(db, "0190a8e0-0000-7000-8000-000000000002")
    await insert_by_hand(db, "0190a8e0-0000-7000-8000-000000000003", "not-a-traceparent")
    await OutboxDispatcher(db, served(registry), clock=clock).dispatch_once()
    processes = spans.named("process orders.placed")
    assert len(processes) == 2
    assert all(p.parent is None for p in processes)  # roots: new traces, not a crash
    assert all(not p.links for p in processes)
    assert processes[0].context.trace_id != processes[1].context.trace_id


async def test_without_a_tracer_nothing_is_traced_or_stored(db, registry, clock):
    set_tracer_provider(NoOpTracerProvider())  # as if the SDK were not installed
    try:
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            event_id = await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
        stored = await row(db, event_id)
        assert (stored["traceparent"], stored["tracestate"]) == (None, None)
        assert stored["payload"]["trace_id"] == "trace-abc"  # TaskContext's trace id, as before
        dispatcher = OutboxDispatcher(db, served(registry), clock=clock)
        runner = dispatcher.rounds.local.runner
        assert runner.for_round() == runner.run  # the workers call the runner itself
        assert (await dispatcher.dispatch_once()).published == 1
    finally:
        set_tracer_provider(None)


async def test_without_a_tracer_a_context_the_service_extracted_is_stored(db, registry):
    set_tracer_provider(NoOpTracerProvider())
    incoming = TraceContextTextMapPropagator().extract({"traceparent": SENDER})
    token = otel_context.attach(incoming)  # what an API-only service does with a request
    try:
        assert trace.get_current_span().get_span_context().is_valid
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            event_id = await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
    finally:
        otel_context.detach(token)
        set_tracer_provider(None)
    assert (await row(db, event_id))["traceparent"] == SENDER
