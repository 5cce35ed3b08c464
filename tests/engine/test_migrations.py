"""init-db upgrades tables an earlier version made; other entry points refuse them in one line."""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData, Table, inspect, text

from engine import DispatchResult, OutboxDispatcher, create_schema
from engine.database import check_schema
from engine.errors import SchemaOutdatedError
from engine.schema import metadata

from .conftest import rows

OLD_ROW = (
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type, "
    "aggregate_id, payload) VALUES (:id, 'acme', 'orders.cancelled', 1, 'order', '1', "
    """'{"tenant_id": "acme", "actor_id": "u", "request_id": "r"}')"""
)


def _previous_metadata() -> MetaData:
    """The tables as version 0.1 made them: no ordering_key, seq, skipped_at or action."""
    old = MetaData()
    added = {("outbox_events", c) for c in ("ordering_key", "seq", "skipped_at")}
    added.add(("outbox_replay_log", "action"))
    for table in metadata.sorted_tables:
        columns = [c._copy() for c in table.c if (table.name, c.name) not in added]
        Table(table.name, old, *columns)
    return old


async def make_previous_schema(db) -> None:
    async with db.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        if conn.dialect.name == "sqlite":
            await conn.execute(text("DROP TRIGGER IF EXISTS outbox_events_seq"))
        await conn.run_sync(_previous_metadata().create_all)
        await conn.execute(
            text(
                "CREATE INDEX ix_outbox_events_active ON outbox_events (id) "
                "WHERE status IN ('pending', 'publishing', 'failed')"
            )
        )
        for event_id in ("old-2", "old-1"):
            await conn.execute(text(OLD_ROW), {"id": event_id})


async def test_an_outdated_schema_is_refused_with_the_command_that_upgrades_it(db):
    await make_previous_schema(db)
    with pytest.raises(SchemaOutdatedError, match="outbox-tui init-db") as caught:
        await check_schema(db)
    assert "outbox_events.ordering_key" in str(caught.value)


async def test_init_db_upgrades_in_place_and_keeps_the_rows(db, registry, clock):
    await make_previous_schema(db)
    steps = await create_schema(db)
    assert "added outbox_events.seq" in steps
    assert "dropped index ix_outbox_events_active" in steps
    await check_schema(db)
    assert await create_schema(db) == []  # idempotent
    stored = {r["id"]: r for r in await rows(db)}
    assert stored["old-2"]["seq"] is not None and stored["old-1"]["seq"] is not None
    assert stored["old-2"]["ordering_key"] is None

    async with db.connect() as conn:
        indexes = await conn.run_sync(
            lambda sync: {i["name"] for i in inspect(sync).get_indexes("outbox_events")}
        )
    assert {"ix_outbox_events_unordered", "ix_outbox_events_key_order"} <= indexes
    assert "ix_outbox_events_active" not in indexes

    seen = []

    @registry.handler("orders.cancelled", key="orders.audit")
    async def audit(envelope):
        seen.append(envelope.event_id)

    worker = OutboxDispatcher(db, registry, clock=clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=2, published=2)
    async with db.begin() as conn:  # new rows get a seq after the old ones
        await conn.execute(text(OLD_ROW), {"id": "new-1"})
        seqs = dict((await conn.execute(text("SELECT id, seq FROM outbox_events"))).all())
    assert seqs["new-1"] > max(seqs["old-1"], seqs["old-2"])
