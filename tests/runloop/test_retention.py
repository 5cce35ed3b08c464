"""Retention: old published rows go in bounded batches; dead letters and recent rows stay."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from engine import EventHandlerPermanentError, run_event_side_effect
from engine.operating.retention import purge_published
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher
from engine.storage.schema import handler_runs, side_effects

from .conftest import fast, publish, statuses


def mixed_handler(registry, *, flaky=False):
    @registry.handler("orders.placed", key="orders.crm")
    async def crm(envelope):
        if envelope.payload["order_id"].startswith("bad"):
            raise EventHandlerPermanentError("no such customer")
        await run_event_side_effect("crm.notify", lambda: {"ok": True})
        if flaky and envelope.attempt_count == 1:
            raise ConnectionError("crm timed out")  # leaves a failed handler-run record


async def count(db, table):
    async with db.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(table))).scalar_one()


async def drain(db, registry, clock):
    settings = fast(batch_size=100, backoff_base_seconds=1, backoff_max_seconds=1, backoff_jitter=0)
    dispatcher = build_dispatcher(db, registry, settings, clock=clock)
    for _ in range(2):  # first attempts, then the retries once they are due
        while (await dispatcher.dispatch_once()).claimed:
            pass
        clock.advance(1)


async def test_purge_deletes_old_published_rows_in_bounded_batches(db, registry, clock):
    mixed_handler(registry, flaky=True)
    old = await publish(db, registry, count=12, prefix="old")
    dead = await publish(db, registry, count=2, prefix="bad")
    await drain(db, registry, clock)
    clock.advance(100)
    recent = await publish(db, registry, count=3, prefix="new")
    await drain(db, registry, clock)
    assert await count(db, handler_runs) == 17 and await count(db, side_effects) == 15

    cutoff = clock.now - timedelta(seconds=60)
    batches = [await purge_published(db, older_than=cutoff, batch_size=5) for _ in range(4)]
    assert batches == [5, 5, 2, 0]
    stored = await statuses(db)
    assert not set(old) & set(stored)
    assert {stored[i] for i in dead} == {"dead_letter"}  # never deleted automatically
    assert {stored[i] for i in recent} == {"published"}  # younger than the retention
    # handler runs of purged events go with them; side-effect records are the audit and stay
    assert await count(db, handler_runs) == 5
    assert await count(db, side_effects) == 15


async def test_the_loop_purges_a_backlog_batch_by_batch(db, registry, clock):
    mixed_handler(registry)
    await publish(db, registry, count=12, prefix="old")
    await publish(db, registry, count=1, prefix="bad")
    await drain(db, registry, clock)
    clock.advance(3600)
    settings = fast(retention_seconds=60, retention_batch_size=5)
    seen = []
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings, clock=clock),
        settings=settings,
        max_iterations=5,
        on_iteration=lambda s, r: seen.append(s.purged),
    )
    # one bounded batch per round; a full batch means "more to do" so the next round purges
    # again; after a partial batch the loop waits housekeeping_seconds before looking again
    assert seen == [5, 10, 12, 12, 12]
    assert summary.purged == 12
    assert set((await statuses(db)).values()) == {"dead_letter"}


async def test_retention_zero_deletes_rows_right_after_they_are_published(db, registry, clock):
    mixed_handler(registry)
    await publish(db, registry, count=4, prefix="ok")
    dead = await publish(db, registry, count=1, prefix="bad")
    settings = fast(retention_seconds=0, batch_size=2)
    seen = []
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings, clock=clock),
        settings=settings,
        max_iterations=3,
        on_iteration=lambda s, r: seen.append((s.published, s.purged)),
    )
    assert seen == [(2, 2), (4, 4), (4, 4)]
    assert summary.purged == 4
    assert await statuses(db) == {dead[0]: "dead_letter"}


async def test_retention_none_keeps_published_rows(db, registry, clock):
    mixed_handler(registry)
    await publish(db, registry, count=2)
    settings = fast(retention_seconds=None)
    clock.advance(10 * 365 * 24 * 3600)
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings, clock=clock), settings=settings, max_iterations=2
    )
    assert summary.purged == 0
    assert set((await statuses(db)).values()) == {"published"}


async def test_the_loop_forgets_processes_not_seen_for_the_heartbeat_retention(db, registry, clock):
    from sqlalchemy import insert

    from engine.storage.schema import process_heartbeats

    async with db.begin() as conn:
        for name, age in (("gone-long-ago", 8 * 86400), ("stopped-yesterday", 86400)):
            seen = clock() - timedelta(seconds=age)
            await conn.execute(
                insert(process_heartbeats).values(
                    instance_id=name,
                    host="h",
                    pid=1,
                    state="stopped",
                    started_at=seen,
                    last_seen_at=seen,
                    details={},
                )
            )
    settings = fast(heartbeat_retention_seconds=7 * 86400)
    await run_dispatcher(
        build_dispatcher(db, registry, settings, clock=clock),
        settings=settings,
        max_iterations=1,
        instance_id="me",
    )
    async with db.connect() as conn:
        names = set((await conn.execute(select(process_heartbeats.c.instance_id))).scalars())
    assert names == {"stopped-yesterday", "me"}
