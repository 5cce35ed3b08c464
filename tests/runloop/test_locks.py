"""Cross-process dispatch locks: advisory lock on PostgreSQL, lease row on SQLite (and PG)."""

from __future__ import annotations

import asyncio

import pytest

from engine import DispatchResult, create_engine
from engine.running.build import build_dispatcher
from engine.running.locks import LeaseLock, PostgresAdvisoryLock, advisory_key, lock_provider_for

from .conftest import fast, publish, statuses

# pg_locks covers the whole server: other tests' databases share it, and their dispatchers
# may hold a lock of their own at the same moment.
IN_THIS_DATABASE = (
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def test_a_second_holder_is_refused_until_the_first_releases(db, registry, clock):
    other_engine = create_engine(db.url)  # another process, in effect
    try:
        first = lock_provider_for(db, holder="d1", clock=clock)
        second = lock_provider_for(other_engine, holder="d2", clock=clock)
        assert await first.acquire()
        assert not await second.acquire()
        await first.release()
        assert await second.acquire()
        assert not await first.acquire()
        await second.release()
    finally:
        await other_engine.dispose()


async def test_a_round_without_the_lock_claims_nothing(db, registry, clock):
    handled = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    ids = await publish(db, registry, count=3)
    settings = fast(use_lock=True)
    holder = build_dispatcher(db, registry, settings, dispatcher_id="holder", clock=clock)
    waiting = build_dispatcher(db, registry, settings, dispatcher_id="waiting", clock=clock)
    assert await holder.lock_provider.acquire()  # the holder is mid-round
    assert await waiting.dispatch_once() == DispatchResult()
    assert set((await statuses(db)).values()) == {"pending"}
    await holder.lock_provider.release()
    assert await waiting.dispatch_once() == DispatchResult(claimed=3, published=3)
    assert handled == ids
    # released after its round: the other dispatcher can take its turn
    assert await holder.lock_provider.acquire()
    await holder.lock_provider.release()


async def test_an_expired_lease_can_be_taken_over(db, clock):
    first = LeaseLock(db, holder="d1", lease_seconds=30, clock=clock)
    second = LeaseLock(db, holder="d2", lease_seconds=30, clock=clock)
    assert await first.acquire()
    clock.advance(29)
    assert not await second.acquire()
    assert await first.acquire()  # renewing one's own lease
    clock.advance(31)  # the first holder died mid-round
    assert await second.acquire()
    assert not await first.acquire()
    await first.release()  # a late release by the old holder does not free the new lease
    assert not await LeaseLock(db, holder="d3", clock=clock).acquire()
    await second.release()
    assert await LeaseLock(db, holder="d3", clock=clock).acquire()


async def test_holders_with_one_dispatcher_id_still_exclude_each_other(db, clock):
    assert await LeaseLock(db, holder="same", clock=clock).acquire()
    assert not await LeaseLock(db, holder="same", clock=clock).acquire()


@pytest.mark.postgresql
async def test_postgresql_uses_a_session_advisory_lock(pg_url):
    engine = create_engine(pg_url)
    try:
        lock = lock_provider_for(engine)
        assert isinstance(lock, PostgresAdvisoryLock)
        assert lock.key == advisory_key("outbox:dispatch") and -(2**63) <= lock.key < 2**63
        assert await lock.acquire()
        async with engine.connect() as conn:
            held = (
                await conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    + IN_THIS_DATABASE
                )
            ).scalar_one()
        assert held == 1
        await lock.release()
        async with engine.connect() as conn:
            held = (
                await conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'" + IN_THIS_DATABASE
                )
            ).scalar_one()
        assert held == 0  # unlocked before the connection went back to the pool
    finally:
        await engine.dispose()


@pytest.mark.postgresql
async def test_a_holder_whose_session_dies_loses_the_lock(pg_url):
    from engine.running.run_loop import STORAGE_ERRORS

    holder_engine = create_engine(pg_url)
    other_engine = create_engine(pg_url)
    try:
        holder = PostgresAdvisoryLock(holder_engine)
        other = PostgresAdvisoryLock(other_engine)
        assert await holder.acquire()
        assert not await other.acquire()
        async with other_engine.connect() as conn:  # the holder's backend goes away
            await conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                + IN_THIS_DATABASE
            )
        # pg_terminate_backend only signals: the backend exits, and frees the lock, soon after.
        deadline = asyncio.get_running_loop().time() + 20
        while not await other.acquire():
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert other.held
        with pytest.raises(STORAGE_ERRORS):  # the run loop counts this as a storage error
            await holder.release()
        assert not holder.held
        await other.release()
        assert await holder.acquire()  # a fresh connection, the broken one was discarded
        await holder.release()
    finally:
        await holder_engine.dispose()
        await other_engine.dispose()
