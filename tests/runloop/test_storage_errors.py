"""Storage failures during a round are logged, counted and survived; bugs propagate."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from engine import create_engine
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher

from .conftest import eventually, fast, heartbeat_row, publish


async def test_a_missing_table_mid_run_is_survived_and_counted(db, registry, caplog):
    handled = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    caplog.set_level(logging.WARNING, logger="engine.runner")
    settings = fast(idle_sleep_seconds=0.02)
    shutdown = asyncio.Event()
    snapshots = []
    task = asyncio.create_task(
        run_dispatcher(
            build_dispatcher(db, registry, settings),
            settings=settings,
            shutdown=shutdown,
            instance_id="disp-s",
            on_iteration=lambda summary, result: snapshots.append(summary),
        )
    )
    try:
        await eventually(lambda: len(snapshots) >= 2)
        async with db.begin() as conn:  # the outage: every round now fails
            await conn.exec_driver_sql("ALTER TABLE outbox_events RENAME TO outbox_events_away")
        await eventually(lambda: snapshots[-1].storage_errors >= 3)
        async with db.begin() as conn:
            await conn.exec_driver_sql("ALTER TABLE outbox_events_away RENAME TO outbox_events")
        ids = await publish(db, registry, count=2)
        await eventually(lambda: snapshots[-1].published == 2)
    finally:
        shutdown.set()
        summary = await asyncio.wait_for(task, timeout=30)
    assert summary.storage_errors >= 3 and summary.published == 2
    assert handled == ids
    assert "outbox tables are missing" in summary.last_error
    failures = [r.getMessage() for r in caplog.records if "storage error" in r.getMessage()]
    assert len(failures) == summary.storage_errors
    assert all("\n" not in line for line in failures)
    row = await heartbeat_row(db, "disp-s")
    assert row["state"] == "stopped"
    assert row["details"]["totals"]["storage_errors"] == summary.storage_errors


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def dead_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/outbox.db"
    return "postgresql+asyncpg://outbox:s3cret-pw@127.0.0.1:1/outbox"  # nothing listens on 1


async def test_an_unreachable_database_is_retried_with_capped_backoff(dead_url, registry, caplog):
    caplog.set_level(logging.WARNING)
    engine = create_engine(dead_url)
    settings = fast(storage_retry_initial_seconds=0.01, storage_retry_max_seconds=0.04)
    try:
        summary = await run_dispatcher(
            build_dispatcher(engine, registry, settings),
            settings=settings,
            max_iterations=5,
            instance_id="disp-dead",
        )
    finally:
        await engine.dispose()
    assert summary.iterations == 5 and summary.storage_errors >= 5
    assert summary.published == 0
    assert "cannot reach the database" in summary.last_error
    delays = [
        m.group(1)
        for r in caplog.records
        if r.name == "engine.runner"
        and (m := re.search(r"dispatch round failed .*retrying in ([\d.]+)s", r.getMessage()))
    ]
    assert delays == ["0.01", "0.02", "0.04", "0.04", "0.04"]
    assert "s3cret-pw" not in caplog.text  # passwords are masked in every line
    # the stopped heartbeat could not be written either: logged, not raised
    assert "could not mark heartbeat disp-dead stopped" in caplog.text


async def test_a_bug_in_a_round_propagates(db, registry):
    dispatcher = build_dispatcher(db, registry, fast())

    async def broken(stop=None):
        raise ZeroDivisionError("bug")

    dispatcher.dispatch_once = broken
    with pytest.raises(ZeroDivisionError):
        await run_dispatcher(dispatcher, max_iterations=3)
