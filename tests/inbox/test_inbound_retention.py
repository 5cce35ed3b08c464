"""Inbound rows have their own retention, the dedup window: a duplicate is refused as long as
the row of its first copy is kept, and becomes a new event once it is purged."""

from __future__ import annotations

from engine import EventRegistry
from engine.inbox import InboxWriter, ReceivedMessage, RowBuilder, decode_message
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher
from engine.settings import DispatcherSettings, load_settings
from engine.storage.schema import outbox_events as t
from tests.inbox.conftest import count
from tests.inbox.corpus import LIMIT, STRUCTURED, TYPE, encoded, event
from tests.runloop.conftest import publish

HOUR = 3600.0


def registry_with_handler() -> EventRegistry:
    registry = EventRegistry()
    registry.register_event(TYPE, 1)

    @registry.handler(TYPE, key="noop")
    async def noop(envelope):  # type: ignore[no-untyped-def]
        return None

    return registry


async def receive(db, registry, clock, *event_ids: str):
    builder = RowBuilder(registry, queue="q", clock=clock)
    rows = []
    for event_id in event_ids:
        message = ReceivedMessage(encoded(event(event_id)), STRUCTURED)
        rows.append(builder.row(message, decode_message(message, max_bytes=LIMIT)))
    return await InboxWriter(db).write(rows)


def settings(**values: object) -> DispatcherSettings:
    return DispatcherSettings.model_validate(
        {"idle_sleep_seconds": 0.01, "heartbeat_min_interval_seconds": 0, **values}
    )


async def rounds(db, registry, clock, config: DispatcherSettings, n: int = 3) -> int:
    dispatcher = build_dispatcher(db, registry, config, clock=clock)
    summary = await run_dispatcher(dispatcher, settings=config, max_iterations=n)
    return summary.purged


async def test_inbound_rows_outlive_a_shorter_local_retention(db, clock):
    """Local rows deleted on publish; inbound rows kept for the dedup window, refusing
    copies all along, then purged; a copy after that is a new event."""
    registry = registry_with_handler()
    await publish(db, registry, count=3, prefix="local")
    await receive(db, registry, clock, "in-1", "in-2")
    config = settings(retention_seconds=0, inbound_retention_seconds=HOUR)
    await rounds(db, registry, clock, config)
    assert await count(db, t.c.inbound_id.is_(None)) == 0  # local rows gone at once
    assert await count(db, t.c.inbound_id.is_not(None), t.c.status == "published") == 2

    clock.advance(HOUR - 60)
    await rounds(db, registry, clock, config)
    assert await count(db) == 2
    again = await receive(db, registry, clock, "in-1")
    assert again.duplicates == 1  # still inside the window

    clock.advance(120)
    assert await rounds(db, registry, clock, config) == 2
    assert await count(db) == 0
    late = await receive(db, registry, clock, "in-1")  # after the window: a new event
    assert len(late.stored) == 1 and late.duplicates == 0


async def test_inbound_rows_go_after_a_window_shorter_than_the_local_retention(db, clock):
    registry = registry_with_handler()
    await publish(db, registry, count=3, prefix="local")
    await receive(db, registry, clock, "in-1", "in-2")
    config = settings(retention_seconds=7 * 24 * HOUR, inbound_retention_seconds=60)
    await rounds(db, registry, clock, config)
    clock.advance(61)
    assert await rounds(db, registry, clock, config) == 2
    assert await count(db, t.c.inbound_id.is_not(None)) == 0
    assert await count(db, t.c.inbound_id.is_(None), t.c.status == "published") == 3


async def test_inbound_rows_are_purged_even_when_local_rows_are_kept(db, clock):
    registry = registry_with_handler()
    await publish(db, registry, count=2, prefix="local")
    await receive(db, registry, clock, "in-1")
    config = settings(retention_seconds=None, inbound_retention_seconds=60)
    await rounds(db, registry, clock, config)
    clock.advance(61)
    assert await rounds(db, registry, clock, config) == 1
    assert await count(db) == 2


async def test_pending_and_dead_inbound_rows_are_never_purged(db, clock):
    registry = EventRegistry()
    registry.register_event(TYPE, 1)
    await receive(db, registry, clock, "waits")  # no dispatcher below serves its type
    bad = ReceivedMessage(b"not json", STRUCTURED)
    rows = RowBuilder(registry, queue="q", clock=clock)
    await InboxWriter(db).write([rows.row(bad, decode_message(bad, max_bytes=LIMIT))])
    other = EventRegistry()
    other.register_event("other.type", 1)

    @other.handler("other.type", key="other")
    async def handle(envelope):  # type: ignore[no-untyped-def]
        return None

    clock.advance(30 * 24 * HOUR)
    await rounds(db, other, clock, settings(retention_seconds=0, inbound_retention_seconds=60))
    assert await count(db, t.c.status == "pending") == 1
    assert await count(db, t.c.status == "dead_letter") == 1


def test_the_inbound_window_is_the_dedup_window_unless_set(monkeypatch):
    assert load_settings().dispatcher.inbound_retention_seconds == 7 * 24 * HOUR
    monkeypatch.setenv("OUTBOX_DEDUP_WINDOW_SECONDS", "600")
    assert load_settings().dispatcher.inbound_retention_seconds == 600
    monkeypatch.setenv("OUTBOX_DISPATCHER__INBOUND_RETENTION_SECONDS", "90")
    assert load_settings().dispatcher.inbound_retention_seconds == 90
    assert load_settings(inbound_retention_seconds=30).dispatcher.inbound_retention_seconds == 30
