"""Two dispatcher processes on one outbox: every event handled exactly once, all published."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import select

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.storage.schema import outbox_events
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

EVENTS = 300


async def _seed(url: str) -> None:
    engine = create_engine(url)
    registry = EventRegistry()
    counting_app.register(registry)
    context = TaskContext("acme", "tester", "req-1")
    try:
        await create_schema(engine)
        drafts = [OutboxEvent(counting_app.EVENT_TYPE, {}, "tick", str(i)) for i in range(EVENTS)]
        async with unit_of_work(engine, registry=registry, context=context) as session:
            await OutboxEventPublisher(session).publish_many(drafts)
    finally:
        await engine.dispose()


async def _holders(url: str) -> set[str]:
    """The dispatchers that hold rows in flight."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            held = await conn.execute(select(t.c.locked_by).where(t.c.status == "publishing"))
            return {holder for (holder,) in held}
    finally:
        await engine.dispose()


async def test_two_dispatcher_processes_share_the_work_and_never_double_handle(
    database_url: str, cli: Cli, tmp_path: Path
) -> None:
    await _seed(database_url)
    log, go = tmp_path / "handled.log", tmp_path / "go"
    env = counting_app_env(database_url, log, go)
    args = dispatch_args(
        COUNTING_APP,
        "--batch-size",
        "25",
        "--idle-sleep-seconds",
        "0.05",
    )
    procs = [cli.popen(*args, "--instance-id", f"worker-{n}", env=env) for n in (1, 2)]
    try:
        for proc in procs:  # both are up and dispatching
            assert next(read_json_lines(proc))["event"] == "started"
        deadline = time.monotonic() + 60  # each claims a batch and waits at the barrier
        while len(await _holders(database_url)) < 2:
            assert time.monotonic() < deadline, await _holders(database_url)
            await asyncio.sleep(0.1)
        go.touch()
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
    handled = [line.split() for line in log.read_text().splitlines()]
    per_event = Counter(event_id for event_id, _pid in handled)
    assert len(per_event) == EVENTS
    assert set(per_event.values()) == {1}, per_event.most_common(3)
    per_process = Counter(pid for _event_id, pid in handled)
    assert len(per_process) == 2, per_process  # the work really was shared
    assert await status_counts(database_url) == {"published": EVENTS}
