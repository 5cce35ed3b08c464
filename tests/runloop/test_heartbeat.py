"""Heartbeats: one upsert per iteration with details, throttled while busy, stopped on exit."""

from __future__ import annotations

import asyncio

import pytest

from engine.running.build import build_dispatcher
from engine.running.heartbeat import Heartbeat
from engine.running.run_loop import run_dispatcher

from .conftest import fast, heartbeat_row, publish


async def row_once(db, instance_id, condition, what, within=20.0):
    """The heartbeat row once ``condition(row)`` holds (a row or None); fails after ``within``."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        row = await heartbeat_row(db, instance_id)
        if condition(row):
            return row
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"no heartbeat {what} within {within}s; last: {row}")
        await asyncio.sleep(0.02)


async def test_heartbeat_is_upserted_every_iteration_and_marked_stopped(db, registry):
    seen_during_rounds = []

    @registry.handler("orders.placed", key="orders.peek")
    async def peek(envelope):
        row = await heartbeat_row(db, "disp-1")
        seen_during_rounds.append((row["state"], row["details"]["iterations"]))

    await publish(db, registry, count=3)
    settings = fast(batch_size=1)
    dispatcher = build_dispatcher(db, registry, settings, dispatcher_id="d-1")
    summary = await run_dispatcher(
        dispatcher, settings=settings, instance_id="disp-1", max_iterations=4
    )
    # round n sees the heartbeat written after round n-1 (the first one at start-up)
    assert seen_during_rounds == [("running", 0), ("running", 1), ("running", 2)]
    row = await heartbeat_row(db, "disp-1")
    assert row["state"] == "stopped" and row["stopped_at"] is not None
    assert row["kind"] == "dispatcher" and row["pid"] > 0 and row["host"]
    assert row["started_at"] <= row["last_seen_at"]
    details = row["details"]
    assert details["dispatcher_id"] == "d-1"
    assert details["iterations"] == summary.iterations == 4
    assert details["totals"]["published"] == 3 and details["totals"]["claimed"] == 3
    assert details["totals"]["storage_errors"] == 0


async def test_a_restarted_instance_is_running_again_with_a_new_start(db, registry):
    settings = fast()
    for _ in range(2):
        await run_dispatcher(
            build_dispatcher(db, registry, settings), instance_id="disp-1", max_iterations=1
        )
    first = await heartbeat_row(db, "disp-1")
    shutdown = asyncio.Event()
    task = asyncio.create_task(
        run_dispatcher(
            build_dispatcher(db, registry, settings),
            settings=settings,
            instance_id="disp-1",
            shutdown=shutdown,
        )
    )
    try:
        running = await row_once(db, "disp-1", lambda r: r["state"] == "running", "running")
        assert running["stopped_at"] is None
        assert running["started_at"] > first["started_at"]
    finally:
        shutdown.set()
        summary = await task
    assert summary.shutdown_requested
    assert (await heartbeat_row(db, "disp-1"))["state"] == "stopped"


async def test_heartbeat_is_marked_stopped_when_an_exception_escapes(db, registry):
    def broken(summary, result):
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        await run_dispatcher(
            build_dispatcher(db, registry, fast()), instance_id="disp-x", on_iteration=broken
        )
    row = await heartbeat_row(db, "disp-x")
    assert row["state"] == "stopped" and row["details"]["iterations"] == 1


async def test_heartbeat_writes_are_throttled_while_busy(db):
    heartbeat = Heartbeat(db, "disp-2", min_interval=60.0)
    written = [await heartbeat.beat({"iterations": i}) for i in range(50)]
    assert written == [True] + [False] * 49
    assert heartbeat.writes == 1
    assert await heartbeat.beat({"iterations": 50}, force=True)
    assert (await heartbeat_row(db, "disp-2"))["details"] == {"iterations": 50}


async def test_an_idle_loop_still_beats_every_heartbeat_seconds(db, registry):
    settings = fast(idle_sleep_seconds=30, heartbeat_seconds=0.1, wakeup="off")
    shutdown = asyncio.Event()
    task = asyncio.create_task(
        run_dispatcher(
            build_dispatcher(db, registry, settings),
            settings=settings,
            instance_id="disp-3",
            shutdown=shutdown,
        )
    )
    first = (await row_once(db, "disp-3", lambda r: r is not None, "written"))["last_seen_at"]
    beat = await row_once(db, "disp-3", lambda r: r["last_seen_at"] > first, "after the first")
    later = beat["last_seen_at"]
    shutdown.set()
    summary = await task
    assert later > first
    assert summary.iterations == 1  # beats without extra rounds
