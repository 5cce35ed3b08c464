"""The billing example: each accepted order invoiced once, however often it is redelivered."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update

from engine import EventRegistry, OutboxDispatcher, create_engine, create_schema
from engine.clock import utc_now
from engine.storage.schema import outbox_events
from outbox_tui.examples import billing, orders
from outbox_tui.examples.billing import Invoice
from outbox_tui.examples.orders.app import CREDIT_LIMIT
from outbox_tui.examples.orders.traffic import generate_orders


async def test_each_accepted_order_gets_one_invoice_and_one_follow_up(database_url):
    engine = create_engine(database_url)
    try:
        await create_schema(engine)
        await orders.create_tables(engine)
        await billing.create_tables(engine)
        registry = EventRegistry()
        orders.register(registry)
        billing.register(registry)
        await generate_orders(engine, registry, 30, seed=3)
        dispatcher = OutboxDispatcher(engine, registry, batch_size=50)
        for _ in range(4):  # the warehouse's retries redeliver orders billing has invoiced
            async with engine.begin() as conn:  # retry now, not after the backoff
                await conn.execute(
                    update(outbox_events)
                    .where(outbox_events.c.status == "failed")
                    .values(next_retry_at=utc_now() - timedelta(seconds=1))
                )
            await dispatcher.dispatch_once()
        async with engine.connect() as conn:
            placed = (
                (
                    await conn.execute(
                        select(outbox_events).where(outbox_events.c.event_type == "orders.placed")
                    )
                )
                .mappings()
                .all()
            )
            invoices = (
                await conn.execute(
                    select(Invoice.order_id, func.count()).group_by(Invoice.order_id)
                )
            ).all()
            issued = (
                (
                    await conn.execute(
                        select(outbox_events).where(outbox_events.c.event_type == "invoices.issued")
                    )
                )
                .mappings()
                .all()
            )
        accepted = {
            row["aggregate_id"]: row["id"]
            for row in placed
            if row["payload"]["amount"] <= CREDIT_LIMIT
        }
        assert any(row["attempt_count"] > 1 for row in placed)  # redeliveries happened
        assert dict(invoices) == dict.fromkeys(accepted, 1)
        assert {row["aggregate_id"]: row["causation_id"] for row in issued} == accepted
        assert all(row["correlation_id"] == row["causation_id"] for row in issued)
    finally:
        await engine.dispose()
