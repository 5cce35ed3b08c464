"""An event's cause and chain in the detail pane: which event a handler published it for,
and the whole chain from its first event, this one marked."""

from __future__ import annotations

import io

from rich.console import Console
from sqlalchemy import Column, MetaData, String, Table, insert

from engine import (
    EventRegistry,
    OutboxDispatcher,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from outbox_tui.widgets.event_detail import EventDetailPane, render_detail
from outbox_tui.widgets.event_table import EventTable

from .conftest import SIZE, console, started, until

business = MetaData()
invoices = Table("chain_test_invoices", business, Column("order_id", String(36)))


def chain_registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register_event("orders.placed", 1)
    registry.register_event("invoices.issued", 1)

    @registry.handler("orders.placed", key="billing.invoice", transactional=True)
    async def invoice(envelope, session):
        await session.execute(insert(invoices).values(order_id=envelope.aggregate_id))
        await OutboxEventPublisher(session).publish(
            "invoices.issued", {}, aggregate_type="invoice", aggregate_id=envelope.aggregate_id
        )

    return registry


async def test_the_detail_of_a_follow_up_shows_its_cause_and_its_chain(sqlite_url):
    registry = chain_registry()
    engine = create_engine(sqlite_url)
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
    finally:
        await engine.dispose()
    app = console(sqlite_url, registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        follow_up = table.highlighted  # the newest event comes first
        assert follow_up is not None and follow_up.id != first
        await pilot.press("enter")
        pane = app.main.query_one(EventDetailPane)
        await until(pilot, lambda: pane.event_id == follow_up.id, "the follow-up's detail")
        assert pane.detail is not None
        out = Console(width=120, record=True, file=io.StringIO())
        out.print(render_detail(pane.detail, app.clock()))
        text = out.export_text()
    assert f"caused by         {first}" in text
    assert "Chain (2 events)" in text
    chain = text[text.index("Chain (2 events)") :].splitlines()[1:3]
    assert "orders.placed" in chain[0] and first in chain[0]
    assert "└" in chain[1] and "invoices.issued" in chain[1] and "◀ this event" in chain[1]
