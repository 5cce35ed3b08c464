"""PostgreSQL wake-up: LISTEN in idle dispatchers, coalesced NOTIFY after producers' commits."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from engine import create_engine, create_schema, unit_of_work
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher
from engine.running.wakeup import WakeupListener, enable_commit_notifications

from .conftest import CTX, eventually, fast, publish

pytestmark = pytest.mark.postgresql


@pytest.fixture(params=["asyncpg", "psycopg"])
async def pg(request, pg_url):
    """The test's database through asyncpg, and through psycopg 3 (LISTEN differs)."""
    url = make_url(pg_url).set(drivername=f"postgresql+{request.param}")
    engine = create_engine(url)
    await create_schema(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


class Running:
    """A dispatcher running in a task with a 30 s idle sleep, stopped on exit."""

    def __init__(self, engine, registry, **overrides):
        self.settings = fast(idle_sleep_seconds=30, **overrides)
        self.shutdown = asyncio.Event()
        self.snapshots = []
        self.handled = {}
        self.engine, self.registry = engine, registry

        @registry.handler("orders.placed", key="orders.timed")
        async def timed(envelope):
            self.handled[envelope.event_id] = time.monotonic()

    async def __aenter__(self):
        self.task = asyncio.create_task(
            run_dispatcher(
                build_dispatcher(self.engine, self.registry, self.settings),
                settings=self.settings,
                shutdown=self.shutdown,
                on_iteration=lambda s, r: self.snapshots.append(s),
            )
        )
        await eventually(lambda: self.snapshots, within=30)  # listening, first round done, now idle
        return self

    async def __aexit__(self, *exc):
        self.shutdown.set()
        self.summary = await asyncio.wait_for(self.task, timeout=30)


async def test_a_commit_notification_wakes_an_idle_dispatcher(pg, registry):
    async with enable_commit_notifications(pg) as notifier, Running(pg, registry) as running:
        await asyncio.sleep(0.3)  # well into its 30 s idle sleep
        published_at = time.monotonic()
        [event_id] = await publish(pg, registry)
        await eventually(lambda: event_id in running.handled, within=30)
        latency = running.handled[event_id] - published_at
    assert notifier.sent >= 1
    assert running.summary.wakeups >= 1  # woken, not timed out
    assert running.summary.published == 1
    assert latency < 20  # generous (a loaded machine): the idle sleep was 30 s


async def test_a_plain_sql_producer_can_notify_after_its_commit(pg, registry):
    async with Running(pg, registry) as running:
        [event_id] = await publish(pg, registry)  # no notifier installed: nobody wakes it
        await asyncio.sleep(0.5)
        assert event_id not in running.handled
        async with pg.connect() as conn:
            await conn.exec_driver_sql("SELECT pg_notify('outbox_events', '')")
            await conn.commit()
        await eventually(lambda: event_id in running.handled, within=30)
    assert running.summary.wakeups == 1


async def test_wakeup_off_only_polls(pg, registry):
    async with (
        enable_commit_notifications(pg) as notifier,
        Running(pg, registry, wakeup="off") as running,
    ):
        [event_id] = await publish(pg, registry)
        await notifier.flush()
        await asyncio.sleep(0.5)
        assert event_id not in running.handled
    assert notifier.sent == 1 and running.summary.wakeups == 0


async def test_notifications_are_coalesced_and_only_follow_commits_with_events(pg, registry):
    url = make_url(pg.url.render_as_string(hide_password=False))
    received = []
    listener = await asyncpg.connect(**url.translate_connect_args(username="user"))
    await listener.add_listener("outbox_events", lambda *args: received.append(time.monotonic()))
    try:
        async with enable_commit_notifications(pg, interval_ms=200) as notifier:
            started = time.monotonic()
            for i in range(20):
                await publish(pg, registry, prefix=f"burst{i}")
            elapsed = time.monotonic() - started
            await notifier.flush()
            # Delivery to the listener takes a moment; a loaded CI machine has stalled it 5 s.
            await eventually(lambda: len(received) >= notifier.sent, within=30)
            burst = len(received)
            # one at once, then at most one per 200 ms window (the last one trailing)
            assert 2 <= burst <= 2 + int(elapsed / 0.2)
            assert notifier.sent == burst

            with pytest.raises(RuntimeError):  # rolled back: nothing to wake anyone for
                async with unit_of_work(pg, registry=registry, context=CTX):
                    await publish(pg, registry, prefix="rolled-back")
                    raise RuntimeError("business rule")
            async with unit_of_work(pg, registry=registry, context=CTX) as session:
                await session.execute(text("SELECT 1"))
            await asyncio.sleep(0.3)
            assert len(received) == burst
    finally:
        await listener.close()


async def test_a_broken_listener_reconnects(pg):
    listener = WakeupListener(pg, retry_seconds=0.05)
    assert await listener.start()
    try:
        async with pg.connect() as conn:
            await conn.execute(
                # This test's database only: the other xdist worker's listeners live on the
                # same server (ending them lost its notifications: a CI failure). text():
                # psycopg takes a bare % for a placeholder.
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                    " AND datname = current_database()"
                )
            )
            await conn.commit()
        await eventually(lambda: not listener.listening, within=30)
        await asyncio.sleep(0.06)
        await listener.ensure()
        assert listener.listening
        async with pg.connect() as conn:
            await conn.exec_driver_sql("SELECT pg_notify('outbox_events', '')")
            await conn.commit()
        await asyncio.wait_for(listener.event.wait(), timeout=20)
    finally:
        await listener.close()


async def test_the_producer_side_follows_the_settings(pg, sqlite_url):
    from engine.running.wakeup import commit_notifier_for

    notifier = commit_notifier_for(pg, fast(notify_interval_ms=250, wakeup_channel="orders_wake"))
    try:
        assert notifier.interval == 0.25 and notifier.channel == "orders_wake"
    finally:
        await notifier.aclose()
    assert commit_notifier_for(pg, fast(wakeup="off")) is None
    sqlite = create_engine(sqlite_url)
    try:
        assert commit_notifier_for(sqlite, fast()) is None
    finally:
        await sqlite.dispose()
