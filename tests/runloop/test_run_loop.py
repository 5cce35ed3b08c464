"""The run loop: totals, max_iterations, idle sleep only when idle, shutdown, callbacks."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine import DispatchResult
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher
from engine.running.summary import RunSummary

from .conftest import eventually, fast, publish, statuses


async def test_totals_over_iterations_and_max_iterations(db, registry):
    handled = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    ids = await publish(db, registry, count=7)
    settings = fast(batch_size=3)
    seen: list[tuple[RunSummary, DispatchResult]] = []
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings),
        settings=settings,
        max_iterations=5,
        on_iteration=lambda s, r: seen.append((s, r)),
    )
    assert (summary.iterations, summary.claimed, summary.published) == (5, 7, 7)
    assert (summary.failed, summary.dead_lettered, summary.lost_leases) == (0, 0, 0)
    assert summary.storage_errors == 0 and not summary.shutdown_requested
    assert handled == ids
    assert set((await statuses(db)).values()) == {"published"}
    # the callback sees every iteration, with cumulative totals
    assert [r.claimed for _, r in seen] == [3, 3, 1, 0, 0]
    assert [s.published for s, _ in seen] == [3, 6, 7, 7, 7]
    assert [s.iterations for s, _ in seen] == [1, 2, 3, 4, 5]
    assert summary.as_dict()["published"] == 7


async def test_sleeps_only_after_a_round_that_claimed_nothing(db, registry):
    @registry.handler("orders.placed", key="orders.noop")
    async def noop(envelope):
        pass

    await publish(db, registry, count=6)
    settings = fast(batch_size=2, idle_sleep_seconds=0.2)
    started = time.monotonic()
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings), settings=settings, max_iterations=6
    )
    elapsed = time.monotonic() - started
    # rounds 1-3 claim (no sleep), 4-6 are idle; the loop sleeps after 4 and 5, not after
    # the last iteration
    assert summary.published == 6
    assert summary.idle_waits == 2
    assert 0.4 <= elapsed < 10  # the upper bound: no 30 s default sleep crept in


async def test_shutdown_lets_handlers_in_flight_finish_and_starts_no_more(db, registry):
    shutdown = asyncio.Event()
    started = []
    finished = []
    release = asyncio.Event()

    @registry.handler("orders.placed", key="orders.slow")
    async def slow(envelope):
        started.append(envelope.event_id)
        if len(started) == 3:
            shutdown.set()  # SIGTERM arrives while three handlers are in flight
            release.set()
        await release.wait()
        finished.append(envelope.event_id)

    ids = await publish(db, registry, count=8)
    settings = fast(batch_size=6, max_concurrency=3)
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings), settings=settings, shutdown=shutdown
    )
    assert summary.shutdown_requested
    assert (summary.iterations, summary.claimed, summary.published) == (1, 6, 3)
    assert sorted(started) == sorted(finished) == ids[:3]
    stored = await statuses(db)
    assert [stored[i] for i in ids] == ["published"] * 3 + ["pending"] * 5
    async with db.connect() as conn:  # handed back without spending an attempt
        attempts = (
            (
                await conn.exec_driver_sql(
                    "SELECT attempt_count FROM outbox_events WHERE status = 'pending'"
                )
            )
            .scalars()
            .all()
        )
    assert attempts == [0] * 5


async def test_shutdown_interrupts_a_long_idle_sleep(db, registry):
    shutdown = asyncio.Event()
    settings = fast(idle_sleep_seconds=30, wakeup="off")
    rounds = []
    task = asyncio.create_task(
        run_dispatcher(
            build_dispatcher(db, registry, settings),
            settings=settings,
            shutdown=shutdown,
            on_iteration=lambda summary, result: rounds.append(result),
        )
    )
    await eventually(lambda: rounds, within=20)
    await asyncio.sleep(0.2)  # into the idle sleep
    started = time.monotonic()
    shutdown.set()
    summary = await asyncio.wait_for(task, timeout=20)
    assert time.monotonic() - started < 10  # not its 30 s sleep (a loaded CI box is slow)
    assert summary.shutdown_requested and summary.iterations == 1 and summary.idle_waits == 1


async def test_a_set_shutdown_event_runs_no_round(db, registry):
    shutdown = asyncio.Event()
    shutdown.set()
    await publish(db, registry)
    summary = await run_dispatcher(build_dispatcher(db, registry, fast()), shutdown=shutdown)
    assert summary.iterations == 0 and summary.shutdown_requested
    assert set((await statuses(db)).values()) == {"pending"}


async def test_a_bug_in_the_callback_propagates(db, registry):
    def broken(summary, result):
        raise RuntimeError("console bug")

    with pytest.raises(RuntimeError, match="console bug"):
        await run_dispatcher(build_dispatcher(db, registry, fast()), on_iteration=broken)


async def test_build_dispatcher_wires_the_settings(db, registry, clock):
    from engine.running.locks import LeaseLock, PostgresAdvisoryLock
    from engine.running.metrics import OutboxMetrics

    metrics = OutboxMetrics()
    settings = fast(
        batch_size=17,
        lease_seconds=12,
        backoff_kind="fixed",
        backoff_base_seconds=3,
        backoff_max_seconds=3,
        backoff_jitter=0,
        use_lock=True,
    )
    dispatcher = build_dispatcher(
        db, registry, settings, dispatcher_id="d-7", metrics=metrics, clock=clock
    )
    assert dispatcher.dispatcher_id == "d-7"
    assert dispatcher.batch_size == 17
    assert dispatcher.lease.total_seconds() == 12
    assert dispatcher.backoff.delay(5).total_seconds() == 3
    assert dispatcher.observers == [metrics]
    expected = PostgresAdvisoryLock if db.dialect.name == "postgresql" else LeaseLock
    assert isinstance(dispatcher.lock_provider, expected)
    assert build_dispatcher(db, registry, fast()).lock_provider is None


async def test_waits_after_a_round_that_moved_nothing_on(db, registry):
    """A broker outage hands rows back every round: the loop must not spin on them."""
    from engine.dispatch import ExternalPublishResult

    class DownBroker:
        calls = 0

        async def publish(self, envelopes):
            DownBroker.calls += 1
            first, *rest = envelopes
            return ExternalPublishResult(
                failed={first.event_id: "broker unavailable: connection refused"},
                unattempted={e.event_id for e in rest},
            )

    await publish(db, registry, count=4)
    settings = fast(idle_sleep_seconds=0.2, wakeup="off")
    dispatcher = build_dispatcher(db, registry, settings, external_publisher=DownBroker())
    started = time.monotonic()
    summary = await run_dispatcher(dispatcher, settings=settings, max_iterations=3)
    assert summary.claimed > 0 and summary.published == 0 and summary.dead_lettered == 0
    assert summary.idle_waits == 2  # after rounds 1 and 2, not after the last
    assert time.monotonic() - started >= 0.4
    assert DownBroker.calls == 3
