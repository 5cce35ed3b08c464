"""A pause made while two dispatcher processes work a backlog: the batches in flight finish,
from the next round nothing of the paused type is claimed (it stays pending, no attempt
spent), and after the resume it drains.

Each process's handlers wait, so on PostgreSQL each has two rounds delivering (the first
finishes behind the second: ``overlap_rounds``) and a third batch claimed ahead when the
pause is made; on SQLite (no claim ahead) one round.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from sqlalchemy import func, select

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.operating.insights import OutboxInsights
from engine.storage.schema import PENDING, PUBLISHING, outbox_events
from engine.writing.publisher import OutboxEvent
from tests.cli import counting_app
from tests.cli.conftest import (
    COUNTING_APP,
    Cli,
    counting_app_env,
    dispatch_args,
    read_json_lines,
    status_counts,
)

EVENTS = 40
BATCH = 5
WORKERS = ("worker-1", "worker-2")


async def _publish(url: str, count: int) -> None:
    engine = create_engine(url)
    registry = EventRegistry()
    counting_app.register(registry)
    try:
        drafts = [OutboxEvent(counting_app.EVENT_TYPE, {}, "tick", str(i)) for i in range(count)]
        context = TaskContext("acme", "tester", "req-1")
        async with unit_of_work(engine, registry=registry, context=context) as session:
            await OutboxEventPublisher(session).publish_many(drafts)
    finally:
        await engine.dispose()


async def _iterations(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        beats = await OutboxInsights(engine).heartbeats()
    finally:
        await engine.dispose()
    return {hb.instance_id: hb.iterations for hb in beats}


async def _rounds_later(url: str, rounds: int) -> None:
    """Wait until every worker has finished ``rounds`` more rounds (a condition, not a time)."""
    start = await _iterations(url)
    deadline = time.monotonic() + 60
    while True:
        now = await _iterations(url)
        if all(now.get(w, 0) >= start.get(w, 0) + rounds for w in WORKERS):
            return
        assert time.monotonic() < deadline, (start, now)
        await asyncio.sleep(0.05)


async def _attempts(url: str) -> int:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            return int((await conn.execute(select(func.sum(t.c.attempt_count)))).scalar() or 0)
    finally:
        await engine.dispose()


async def _held_by(url: str) -> dict[str, int]:
    """How many rows each dispatcher holds in publishing."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            rows = await conn.execute(
                select(t.c.locked_by, func.count())
                .where(t.c.status == PUBLISHING)
                .group_by(t.c.locked_by)
            )
            return {str(holder): int(n) for holder, n in rows}
    finally:
        await engine.dispose()


async def _claimed(url: str) -> dict[str, tuple[str, int]]:
    """Every row that has been claimed at least once: ``{id: (status, attempts)}``."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            rows = await conn.execute(
                select(t.c.id, t.c.status, t.c.attempt_count).where(t.c.attempt_count > 0)
            )
            return {r.id: (r.status, r.attempt_count) for r in rows}
    finally:
        await engine.dispose()


async def _until(what: str, check, seconds: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_pause_holds_every_dispatcher_from_its_next_round_until_resumed(
    database_url: str, cli: Cli, tmp_path: Path
) -> None:
    """A backlog is being worked by two processes when the pause is made: the batches in
    flight finish, and from the next round nothing more of the type is claimed."""
    # per process when the pause is made: the events started, and the rows held (with the
    # batch claimed ahead, which goes back)
    delivering, held = (2 * BATCH, 3 * BATCH) if "postgresql" in database_url else (BATCH, BATCH)
    engine = create_engine(database_url)
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()
    await _publish(database_url, EVENTS)  # the backlog is there before the pause
    log, go = tmp_path / "handled.log", tmp_path / "go"  # handlers wait until go exists
    env = counting_app_env(database_url, log, go)
    args = dispatch_args(
        COUNTING_APP,
        "--batch-size",
        str(BATCH),
        # two rounds' calls at most: waiting handlers would otherwise let rounds start
        # beside them until the whole backlog is in flight
        "--max-concurrency",
        str(2 * BATCH),
        # the handlers are held while the pause is made (a CLI process): on a loaded machine
        # that can take longer than the default 10 s timeout, which would fail them
        "--handler-timeout-seconds",
        "60",
        "--lease-seconds",
        "120",
        "--idle-sleep-seconds",
        "0.05",
        "--heartbeat-seconds",
        "0.05",
    )
    procs = [cli.popen(*args, "--instance-id", w, env=env) for w in WORKERS]
    db = {"OUTBOX_DATABASE_URL": database_url}
    try:
        for proc in procs:
            assert next(read_json_lines(proc))["event"] == "started"

        async def both_hold_their_batches() -> bool:
            # two batches in each one's (waiting) handlers, the next claimed ahead
            holding = await _held_by(database_url)
            return all(holding.get(w, 0) >= held for w in WORKERS)

        await _until("both dispatchers holding their batches", both_hold_their_batches)
        paused = cli(
            "pause",
            "--event-type",
            counting_app.EVENT_TYPE,
            "--reason",
            "vendor down",
            "--yes",
            env=db,
        )
        assert paused.returncode == 0, paused
        go.touch()  # the batches in flight finish as usual
        # The rounds after them read the pause and handed back what was claimed ahead (the
        # first may end with the heartbeat of the batch's own round).
        await _rounds_later(database_url, 2)
        in_flight = await _claimed(database_url)
        assert len(in_flight) == 2 * delivering
        assert {status for status, _ in in_flight.values()} == {"published"}
        await _rounds_later(database_url, 3)  # each has claimed three more times since

        assert await _claimed(database_url) == in_flight  # nothing more claimed
        assert await status_counts(database_url) == {
            "published": 2 * delivering,
            PENDING: EVENTS - 2 * delivering,
        }
        assert await _attempts(database_url) == 2 * delivering
        assert len(log.read_text().splitlines()) == 2 * delivering

        resumed = cli("resume", "--event-type", counting_app.EVENT_TYPE, "--yes", env=db)
        assert resumed.returncode == 0, resumed

        async def drained() -> bool:
            return (await status_counts(database_url)).get("published", 0) == EVENTS

        await _until("the backlog drained after the resume", drained)
    finally:
        go.touch()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert await status_counts(database_url) == {"published": EVENTS}
    assert len(log.read_text().splitlines()) == EVENTS
    assert await _attempts(database_url) == EVENTS  # one attempt each: no retry, no loss
