"""``outbox-tui event ID``: one event's detail, with its cause and chain, as text or JSON."""

from __future__ import annotations

import json

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

from .conftest import Cli

business = MetaData()
invoices = Table("event_cmd_invoices", business, Column("order_id", String(36)))


async def a_chain(url: str) -> tuple[str, str]:
    """An order whose transactional handler wrote an invoice and published its follow-up."""
    registry = EventRegistry()
    registry.register_event("orders.placed", 1)
    registry.register_event("invoices.issued", 1)

    @registry.handler("orders.placed", key="billing.invoice", transactional=True)
    async def invoice(envelope, session):
        await session.execute(insert(invoices).values(order_id=envelope.aggregate_id))
        await OutboxEventPublisher(session).publish(
            "invoices.issued", {}, aggregate_type="invoice", aggregate_id=envelope.aggregate_id
        )

    engine = create_engine(url)
    try:
        await create_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(business.create_all)
        context = TaskContext("acme", "tester", "req-1")
        async with unit_of_work(engine, registry=registry, context=context) as session:
            first = await OutboxEventPublisher(session).publish(
                "orders.placed", {"note": "x"}, aggregate_type="order", aggregate_id="o-1"
            )
        await OutboxDispatcher(engine, registry).dispatch_once()
        async with engine.connect() as conn:
            follow_up = (
                await conn.execute(select(t.c.id).where(t.c.causation_id == first))
            ).scalar_one()
    finally:
        await engine.dispose()
    return first, follow_up


async def test_an_event_shows_its_cause_and_chain_as_json_and_as_text(database_url: str, cli: Cli):
    first, follow_up = await a_chain(database_url)
    env = {"OUTBOX_DATABASE_URL": database_url}
    done = cli("event", follow_up, "--json", env=env)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["id"] == follow_up and record["event_type"] == "invoices.issued"
    assert (record["causation_id"], record["correlation_id"]) == (first, first)
    assert record["chain_id"] == first
    assert [(e["id"], e["causation_id"]) for e in record["chain"]] == [
        (first, None),
        (follow_up, first),
    ]
    assert record["payload"]["tenant_id"] == "acme"
    assert record["created_at"].endswith("Z")
    text = cli("event", follow_up, env=env)
    assert text.returncode == 0, text.stderr
    assert "Chain (2 events)" in text.stdout and "◀ this event" in text.stdout
    assert first in text.stdout


async def test_an_unknown_event_is_one_line_and_a_failure(sqlite_url: str, cli: Cli):
    await a_chain(sqlite_url)
    done = cli("event", "no-such-id", env={"OUTBOX_DATABASE_URL": sqlite_url})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "outbox-tui: error: no outbox event with id 'no-such-id'"
    ]
    assert "Traceback" not in done.stderr
