"""Graceful stop: SIGTERM mid-batch and during start-up exits 0 and leaves nothing claimed.

Mid-batch: a ``--dispatch`` process has claimed a batch and its handlers are sleeping
(tests/cli/ordered_app.py) when SIGTERM arrives. It must let the handlers in flight
finish and record them, hand the rest of the batch back unattempted, and exit 0 with
its summary line: no row is left in ``publishing`` with its ``locked_by``. During
start-up: SIGTERM at several moments of a start (tests/cli/test_graceful_stop.py).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from engine.writing.publisher import OutboxEvent
from tests.cli import ordered_app
from tests.cli.conftest import (
    ORDERED_APP,
    Cli,
    dispatch_args,
    ordered_app_env,
    seed_orders,
    status_counts,
)
from tests.cli.test_graceful_stop import sigterm_during_start_up
from tests.cli.test_ordered_processes import _rows, _seed
from tests.reliability.faults import (
    database_name,
    held_claims,
    reproduce,
    spawn,
    wait_started,
)
from tests.reliability.results import ScenarioResult, record

EVENTS = 60
BATCH = 20
START_UP_DELAYS = (0.3, 0.9, 1.6)


@pytest.mark.slow
async def test_sigterm_mid_batch_and_during_start_up_exits_zero_claiming_nothing(
    database_url: str, cli: Cli, tmp_path: Path, soak: bool
) -> None:
    payload = {"fail": 0, "permanent": False, "sleep_ms": 3000}
    drafts = [
        OutboxEvent(ordered_app.UNORDERED, payload, "agg", f"free-{n}") for n in range(EVENTS)
    ]
    await _seed(database_url, drafts)
    log = tmp_path / "handled.log"
    env = ordered_app_env(database_url, log, quick_retries=False)
    args = dispatch_args(
        ORDERED_APP,
        "--batch-size",
        str(BATCH),
        "--max-concurrency",
        str(BATCH // 2),  # half the batch waits at the signal
    )
    dispatcher = spawn(cli, "graceful", args, env, tmp_path)
    try:
        await wait_started(dispatcher)
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().count("start ") >= BATCH // 2):
            assert time.monotonic() < deadline, "no handler started"
            await asyncio.sleep(0.02)
        assert await held_claims(database_url, dispatcher.name) > 0
        dispatcher.proc.send_signal(signal.SIGTERM)  # handlers are sleeping (3 s each)
        dispatcher.wait_exit(30)
    finally:
        if dispatcher.proc.poll() is None:
            dispatcher.kill()
    assert dispatcher.proc.returncode == 0, dispatcher.stderr()
    assert "Traceback" not in dispatcher.stderr()
    assert "SIGTERM received" in dispatcher.stderr()
    assert dispatcher.summary() is not None
    assert await held_claims(database_url) == 0  # nothing claimed, by it or anyone

    lines = [line.split() for line in log.read_text().splitlines()]
    started = {event_id for kind, event_id, _pid, _ns in lines if kind == "start"}
    ended = {event_id for kind, event_id, _pid, _ns in lines if kind == "end"}
    assert started == ended  # the handlers in flight finished
    status = {row["id"]: row["status"] for row in await _rows(database_url)}
    assert {i for i, s in status.items() if s == "published"} == started
    assert {i for i, s in status.items() if s == "pending"} == set(status) - started
    summary = dispatcher.summary() or {}
    assert summary["published"] == len(started)

    # SIGTERM during start-up of a dispatcher for the example app's orders, added here.
    await seed_orders(database_url)
    orders = sum((await status_counts(database_url)).values()) - EVENTS
    reached = [await sigterm_during_start_up(cli, database_url, d) for d in START_UP_DELAYS]

    record(
        ScenarioResult(
            scenario="graceful stop",
            database=database_name(database_url),
            runs=1 + len(START_UP_DELAYS),
            events=EVENTS + orders,
            command=reproduce("tests/reliability/test_graceful_stop.py", soak=soak),
            soak=soak,
            notes=[
                f"SIGTERM mid-batch: {len(started)} handlers in flight finished and were "
                f"published, {BATCH - len(started)} of the batch handed back unattempted, "
                "exit 0, nothing left in publishing",
                f"SIGTERM during start-up at {', '.join(f'{d:g}' for d in START_UP_DELAYS)} s: "
                f"exit 0 each; {reached.count(False)} before the started line, "
                f"{reached.count(True)} after it",
            ],
        )
    )
