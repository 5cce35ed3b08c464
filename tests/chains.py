"""A two-event chain for the console and CLI tests: an order whose transactional handler
writes an invoice row and publishes ``invoices.issued`` in its transaction."""

from __future__ import annotations

from sqlalchemy import Column, MetaData, String, Table, insert, select

from engine import (
    EventRegistry,
    OutboxDispatcher,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.storage.schema import outbox_events as t

business = MetaData()
invoices = Table("chain_test_invoices", business, Column("order_id", String(36)))


def chain_registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register_event("orders.placed", 1)
    registry.register_event("invoices.issued", 1)

    @registry.handler("orders.placed", key="billing.invoice", transactional=True)
    async def invoice(envelope, session):  # type: ignore[no-untyped-def]
        await session.execute(insert(invoices).values(order_id=envelope.aggregate_id))
        await OutboxEventPublisher(session).publish(
            "invoices.issued", {}, aggregate_type="invoice", aggregate_id=envelope.aggregate_id
        )

    return registry


async def seed_chain(url: str, registry: EventRegistry) -> tuple[str, str]:
    """The schema, one order, and the round that handles it: (order id, follow-up id)."""
    engine = create_engine(url)
    try:
        await create_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(business.create_all)
        context = TaskContext("acme", "tester", "req-1")
        async with unit_of_work(engine, registry=registry, context=context) as session:
            first = await OutboxEventPublisher(session).publish(
                "orders.placed", {}, aggregate_type="order", aggregate_id="o-1"
            )
        await OutboxDispatcher(engine, registry).dispatch_once()
        async with engine.connect() as conn:
            follow_up = (
                await conn.execute(select(t.c.id).where(t.c.causation_id == first))
            ).scalar_one()
    finally:
        await engine.dispose()
    return first, follow_up
