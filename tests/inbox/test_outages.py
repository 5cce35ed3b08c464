"""Outages: the broker killed and restarted, the database away; nothing lost either way.

The broker is one of the test's own (tests/inbox/own_services.py), killed with SIGKILL and
started again on its data directory; the test is ``serial`` because it restarts a broker
and measures nothing but waits on it. The PostgreSQL outage stops and starts a cluster of
the test's own (tests/reliability/test_database_outage.py); SQLite's is another process
holding the database's write lock for longer than the consumer waits for it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from engine import create_engine, create_schema
from engine.operating.insights import OutboxInsights
from engine.storage.schema import outbox_events as t
from tests.inbox.conftest import Inbound, count, events, eventually, running
from tests.inbox.own_services import OwnBroker, own_broker  # noqa: F401 - fixture
from tests.reliability.test_database_outage import OwnPostgres, own_postgres  # noqa: F401

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]


@pytest.mark.serial
async def test_a_broker_killed_and_restarted_is_waited_for_and_loses_nothing(
    db,
    registry,
    own_broker: OwnBroker,  # noqa: F811
):
    inbound = Inbound(own_broker.url)
    await inbound.declare()
    await inbound.publish(*events("before", 100))
    settings = inbound.settings(prefetch=20, max_batch=10)
    async with running(db, registry, settings, own_broker.url, instance_id="c-broker") as run:
        await eventually(lambda: _acked(run, 30), "the first batches")
        own_broker.kill()

        async def named() -> bool:
            beats = await OutboxInsights(db).heartbeats()
            reason = next((b.waiting_for for b in beats if b.instance_id == "c-broker"), None)
            return reason is not None and reason.startswith("broker unavailable: ")

        await eventually(named, "the heartbeat to name the broker", seconds=60)
        assert not run.task.done()
        await own_broker.up()
        await inbound.publish(*events("after", 100))
        await eventually(lambda: _stored(db, 200), "all 200 stored", seconds=120)
        await eventually(lambda: _ready_is(inbound, 0), "the queue emptied", seconds=60)
        summary = await run.stop()
    assert summary.totals.reconnects >= 1
    assert await count(db) == 200  # nothing lost, nothing twice
    assert await count(db, t.c.inbound_id == "before-99") == 1
    assert run.waits[0] is not None and run.waits[0].startswith("broker unavailable")
    assert run.waits[-1] is None  # over


async def test_postgresql_away_stops_the_acks_and_the_intake_then_resumes(
    registry,
    inbound: Inbound,
    own_postgres: OwnPostgres,  # noqa: F811
):
    engine = create_engine(own_postgres.url)
    await create_schema(engine)
    await inbound.declare()
    settings = inbound.settings(prefetch=20, max_batch=10)
    try:
        await inbound.publish(*events("up", 50))
        async with running(engine, registry, settings, inbound.url) as run:
            await eventually(lambda: _acked(run, 50), "the first fifty")
            await own_postgres.down()
            await inbound.publish(*events("down", 100))

            def away() -> bool:
                reason = run.consumer.waiting_for
                return reason is not None and reason.startswith("database unavailable: ")

            await eventually(_async(away), "the consumer to wait for the database", seconds=60)
            await asyncio.sleep(1.0)
            assert run.consumer.totals.acked == 50  # nothing acked while it is away
            assert await inbound.ready() >= 100 - 20  # it holds at most its prefetch
            await own_postgres.up()
            await eventually(lambda: _stored(engine, 150), "all 150 stored", seconds=120)
            await eventually(lambda: _ready_is(inbound, 0), "the queue emptied")
            summary = await run.stop()
        assert summary.totals.storage_errors >= 1 and summary.totals.acked == 150
        assert await count(engine) == 150
    finally:
        await engine.dispose()


async def test_sqlite_locked_by_another_process_stops_the_acks_then_resumes(
    sqlite_url, registry, inbound: Inbound
):
    engine = create_engine(sqlite_url)
    await create_schema(engine)
    await inbound.declare()
    release = threading.Event()
    locked = threading.Event()

    def hold_the_write_lock() -> None:
        path = sqlite_url.split("///", 1)[1]
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(60)
        conn.rollback()
        conn.close()

    try:
        async with running(engine, registry, inbound.settings(), inbound.url) as run:
            holder = threading.Thread(target=hold_the_write_lock)
            holder.start()
            await asyncio.to_thread(locked.wait, 30)
            await inbound.publish(*events("locked", 30))

            def away() -> bool:
                reason = run.consumer.waiting_for
                return reason is not None and reason.startswith("database unavailable: ")

            await eventually(_async(away), "the consumer to wait for the database", seconds=60)
            assert run.consumer.totals.acked == 0 and await count(engine) == 0
            release.set()
            await asyncio.to_thread(holder.join, 30)
            await eventually(lambda: _stored(engine, 30), "all 30 stored", seconds=60)
            await eventually(lambda: _ready_is(inbound, 0), "the queue emptied")
            summary = await run.stop()
        assert summary.totals.storage_errors >= 1 and summary.totals.acked == 30
        assert run.waits[-1] is None
    finally:
        release.set()
        await engine.dispose()


async def _acked(run, n: int) -> bool:  # type: ignore[no-untyped-def]
    if run.task.done():
        run.task.result()
    return bool(run.consumer.totals.acked >= n)


async def _stored(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    try:
        return await count(engine) >= n
    except Exception:  # the database may still be coming back
        return False


async def _ready_is(inbound: Inbound, n: int) -> bool:
    try:
        return await inbound.ready() == n
    except Exception:  # the broker may still be coming back
        return False


def _async(check):  # type: ignore[no-untyped-def]
    async def wrapped() -> bool:
        return bool(check())

    return wrapped
