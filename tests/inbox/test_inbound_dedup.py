"""Dedup by CloudEvents (source, id): a unique index refuses the second copy, even at once."""

from __future__ import annotations

import asyncio
import random

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError

from engine import EventRegistry, OutboxEventPublisher, TaskContext, create_engine, unit_of_work
from engine.inbox import InboxWriter, ReceivedMessage, RowBuilder, decode_message
from engine.storage.schema import outbox_events as t
from engine.writing.publisher import OutboxEvent
from tests.inbox.corpus import LIMIT, STRUCTURED, TYPE, encoded, event

# The writer's statement on every driver: SQLite, asyncpg and psycopg.
pytestmark = pytest.mark.all_drivers


@pytest.fixture
def registry() -> EventRegistry:
    reg = EventRegistry()
    reg.register_event(TYPE, 1)
    return reg


def rows_for(builder: RowBuilder, *bodies: dict[str, object]):
    rows = []
    for body in bodies:
        message = ReceivedMessage(encoded(body), STRUCTURED)
        rows.append(builder.row(message, decode_message(message, max_bytes=LIMIT)))
    return rows


async def count(db, *where) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(t).where(*where))).scalar())


async def test_a_second_delivery_of_one_source_and_id_never_becomes_a_second_row(db, registry):
    builder, writer = RowBuilder(registry, queue="q"), InboxWriter(db)
    first = await writer.write(rows_for(builder, event("e-1"), event("e-2")))
    again = await writer.write(rows_for(builder, event("e-2"), event("e-3")))
    assert (len(first.stored), first.duplicates) == (2, 0)
    assert [r.identity for r in again.stored] == [("/shop/order", "e-3")]
    assert again.duplicates == 1
    assert await count(db) == 3
    assert await count(db, t.c.inbound_id == "e-2") == 1


async def test_copies_within_one_batch_keep_the_first(db, registry):
    builder = RowBuilder(registry, queue="q")
    first = {**event("dup"), "data": {"copy": 1, "tenant_id": "acme"}}
    second = {**event("dup"), "data": {"copy": 2, "tenant_id": "acme"}}
    result = await InboxWriter(db).write(rows_for(builder, first, second))
    assert (len(result.stored), result.duplicates) == (1, 1)
    async with db.connect() as conn:
        payload = (await conn.execute(select(t.c.payload))).scalar_one()
    assert payload["copy"] == 1


async def test_the_same_id_from_another_source_is_another_event(db, registry):
    builder = RowBuilder(registry, queue="q")
    result = await InboxWriter(db).write(
        rows_for(builder, event("same"), {**event("same"), "source": "/billing"})
    )
    assert len(result.stored) == 2 and await count(db) == 2


async def test_local_ids_and_inbound_ids_never_collide(db, registry):
    """An inbound event whose CloudEvents id is a local row's id is a row of its own."""
    async with unit_of_work(db, registry=registry, context=TaskContext("acme", "u", "r")) as s:
        [local_id] = await OutboxEventPublisher(s).publish_many(
            [OutboxEvent(TYPE, {"order_id": "o"}, "order", "o")]
        )
    result = await InboxWriter(db).write(rows_for(RowBuilder(registry, queue="q"), event(local_id)))
    assert len(result.stored) == 1
    assert result.stored[0].event_id != local_id
    assert await count(db, t.c.id == local_id) == 1
    assert await count(db, t.c.inbound_id == local_id) == 1


async def test_the_refusal_is_the_unique_index_not_a_read(db, registry):
    """A plain INSERT of a stored (source, id) fails on uq_outbox_events_inbound; rows
    without an inbound id (local ones, undecodable ones) are not in the index."""
    builder, writer = RowBuilder(registry, queue="q"), InboxWriter(db)
    await writer.write(rows_for(builder, event("indexed")))
    names = "id, tenant_id, event_type, event_version, aggregate_type, aggregate_id, payload"
    sql = text(
        f"INSERT INTO outbox_events ({names}, inbound_source, inbound_id) "
        "VALUES (:id, 'acme', 'x', 1, 'a', 'b', '{}', '/shop/order', 'indexed')"
    )
    with pytest.raises(IntegrityError):
        async with db.begin() as conn:
            await conn.execute(sql, {"id": "plain-copy"})
    async with db.begin() as conn:  # null identities never conflict
        for n in range(2):
            await conn.execute(
                text(
                    f"INSERT INTO outbox_events ({names}) "
                    "VALUES (:id, 'acme', 'x', 1, 'a', 'b', '{}')"
                ),
                {"id": f"local-{n}"},
            )


async def test_writers_racing_on_the_same_events_leave_one_row_each(database_url, db, registry):
    """Eight writers, each on its own connection pool, write the same 40 events in their
    own orders at once: every event is stored once, and every copy is counted once, as
    stored or as a duplicate."""
    events = [event(f"race-{n}") for n in range(40)]
    engines = [create_engine(database_url) for _ in range(8)]
    try:

        async def one(engine, seed: int):
            order = events[:]
            random.Random(seed).shuffle(order)
            builder, writer = RowBuilder(registry, queue="q"), InboxWriter(engine)
            results = []
            for start in range(0, len(order), 10):
                results.append(await writer.write(rows_for(builder, *order[start : start + 10])))
            return results

        everything = await asyncio.gather(*(one(e, n) for n, e in enumerate(engines)))
    finally:
        for engine in engines:
            await engine.dispose()
    stored = sum(len(r.stored) for results in everything for r in results)
    duplicates = sum(r.duplicates for results in everything for r in results)
    assert stored == 40 and duplicates == 7 * 40
    assert await count(db) == 40
    async with db.connect() as conn:
        ids = (
            await conn.execute(select(t.c.inbound_id, func.count()).group_by(t.c.inbound_id))
        ).all()
    assert {n for _, n in ids} == {1}
