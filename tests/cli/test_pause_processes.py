"""A pause made while two dispatcher processes run: from their next round nothing of the
paused type is claimed (it stays pending, no attempt spent), and after the resume it drains."""

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
from engine.insights import OutboxInsights
from engine.publisher import OutboxEvent
from engine.schema import PENDING, outbox_events
from tests.cli import counting_app
from tests.cli.conftest import Cli, read_json_lines, status_counts

REPO = Path(__file__).resolve().parents[2]
EVENTS = 40
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


async def test_a_pause_holds_every_dispatcher_from_its_next_round_until_resumed(
    database_url: str, cli: Cli, tmp_path: Path
) -> None:
    engine = create_engine(database_url)
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()
    log, go = tmp_path / "handled.log", tmp_path / "go"
    go.touch()  # handlers do not wait
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "COUNTING_APP_LOG": str(log),
        "COUNTING_APP_GO": str(go),
        "PYTHONPATH": str(REPO),
    }
    args = (
        "--dispatch",
        "--installed-app",
        "tests.cli.counting_app",
        "--idle-sleep-seconds",
        "0.05",
        "--heartbeat-seconds",
        "0.05",
        "--json",
    )
    procs = [cli.popen(*args, "--instance-id", w, env=env) for w in WORKERS]
    try:
        for proc in procs:
            assert next(read_json_lines(proc))["event"] == "started"
        await _rounds_later(database_url, 1)  # both are in their loop

        paused = cli(
            "pause",
            "--event-type",
            counting_app.EVENT_TYPE,
            "--reason",
            "vendor down",
            "--yes",
            env={"OUTBOX_DATABASE_URL": database_url},
        )
        assert paused.returncode == 0, paused
        await _rounds_later(database_url, 1)  # the round that read the pause
        await _publish(database_url, EVENTS)
        await _rounds_later(database_url, 3)  # each has claimed three times since

        assert await status_counts(database_url) == {PENDING: EVENTS}
        assert await _attempts(database_url) == 0
        assert not log.exists() or log.read_text() == ""

        resumed = cli(
            "resume",
            "--event-type",
            counting_app.EVENT_TYPE,
            "--yes",
            env={"OUTBOX_DATABASE_URL": database_url},
        )
        assert resumed.returncode == 0, resumed
        deadline = time.monotonic() + 60
        while (await status_counts(database_url)).get("published", 0) < EVENTS:
            assert time.monotonic() < deadline, await status_counts(database_url)
            await asyncio.sleep(0.1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert await status_counts(database_url) == {"published": EVENTS}
    assert len(log.read_text().splitlines()) == EVENTS
