"""Per-key order across dispatcher processes, under random transient and permanent failures.

Several ``outbox-tui --dispatch`` processes drain one backlog of ordered and unordered
events (2 on one SQLite file, 3 on PostgreSQL). Every handler start and end is logged with
a system-wide clock; afterwards, for every key: handler starts follow write order (seq), no
two executions overlap, an event starts only after every earlier event of its key was
published, and nothing is lost: everything is published, dead-lettered by fate, or waiting
behind a dead letter of a blocking key. Unordered events are all delivered.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.storage.schema import outbox_events as t
from engine.writing.publisher import OutboxEvent
from tests.cli import ordered_app
from tests.cli.conftest import (
    ORDERED_APP,
    Cli,
    dispatch_args,
    ordered_app_env,
    read_json_lines,
    status_counts,
)

KEYS = 40
EVENTS_PER_KEY = 8
UNORDERED = 80


def _fates(
    rng: random.Random,
    *,
    keys: int = KEYS,
    per_key: int = EVENTS_PER_KEY,
    unordered: int = UNORDERED,
    permanent: float = 0.04,
    sleep_ms: tuple[int, int] = (0, 4),
    effects: float = 0.0,
) -> list[OutboxEvent]:
    """The backlog, written in interleaved order across keys, with each event's fate.

    ``effects``: the share of events whose handler makes a guarded external call
    (ordered_app's ``effect``).
    """
    drafts = []
    slots = [(k, n) for k in range(keys) for n in range(per_key)]
    slots += [(None, n) for n in range(unordered)]
    rng.shuffle(slots)
    written: dict[int, int] = defaultdict(int)
    for key, _n in slots:
        if key is None:
            event_type, aggregate = ordered_app.UNORDERED, f"free-{len(drafts)}"
        else:
            event_type = ordered_app.BLOCKING if key % 2 == 0 else ordered_app.SKIPPING
            aggregate = f"k{key}"
            written[key] += 1
        payload = {
            "fail": rng.choice([0, 0, 0, 0, 1, 2]),
            "permanent": rng.random() < permanent,
            "sleep_ms": rng.randint(*sleep_ms),
        }
        if effects:
            payload["effect"] = rng.random() < effects
        drafts.append(OutboxEvent(event_type, payload, "agg", aggregate))
    return drafts


async def _seed(url: str, drafts: list[OutboxEvent]) -> None:
    engine = create_engine(url)
    registry = EventRegistry()
    ordered_app.register(registry)
    try:
        await create_schema(engine)
        for start in range(0, len(drafts), 37):  # many producer transactions
            context = TaskContext("acme", "tester", f"req-{start}")
            async with unit_of_work(engine, registry=registry, context=context) as session:
                await OutboxEventPublisher(session).publish_many(drafts[start : start + 37])
    finally:
        await engine.dispose()


async def _rows(url: str) -> list[dict]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                select(
                    t.c.id,
                    t.c.seq,
                    t.c.ordering_key,
                    t.c.status,
                    t.c.event_type,
                    t.c.payload,
                    t.c.claim_version,
                )
            )
            return [dict(r) for r in result.mappings()]
    finally:
        await engine.dispose()


def _expected(rows: list[dict]) -> dict[str, str]:
    """The status every event must end in, from the fates alone."""
    expected = {}
    by_key: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row["ordering_key"] is None:
            expected[row["id"]] = "dead_letter" if row["payload"]["permanent"] else "published"
        else:
            by_key[row["ordering_key"]].append(row)
    for events in by_key.values():
        blocked = False
        for row in sorted(events, key=lambda r: r["seq"]):
            if blocked:
                expected[row["id"]] = "pending"
            elif row["payload"]["permanent"]:
                expected[row["id"]] = "dead_letter"
                blocked = row["event_type"] == ordered_app.BLOCKING
            else:
                expected[row["id"]] = "published"
    return expected


@pytest.mark.slow
async def test_dispatcher_processes_keep_per_key_order_under_random_failures(
    database_url: str, cli: Cli, tmp_path: Path
) -> None:
    rng = random.Random(20261201)
    await _seed(database_url, [])  # the schema; the backlog once every process is up
    log = tmp_path / "handled.log"
    processes = 3 if database_url.startswith("postgresql") else 2
    env = ordered_app_env(database_url, log) | {"ORDERED_APP_MEET": str(processes)}
    args = dispatch_args(ORDERED_APP, "--batch-size", "16", "--idle-sleep-seconds", "0.05")
    procs = [cli.popen(*args, "--instance-id", f"w{n}", env=env) for n in range(processes)]
    try:
        for proc in procs:
            assert next(read_json_lines(proc))["event"] == "started"
        # Written now, so a process that started seconds after the first (a loaded
        # machine) does not find the backlog drained already.
        await _seed(database_url, _fates(rng))
        expected = _expected(await _rows(database_url))  # from the fates, not the statuses
        want = {s: list(expected.values()).count(s) for s in set(expected.values())}
        deadline = time.monotonic() + 120
        while (counts := await status_counts(database_url)) != want:
            assert time.monotonic() < deadline, (counts, want)
            await asyncio.sleep(0.1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
    assert [proc.returncode for proc in procs] == [0] * processes

    after = {row["id"]: row for row in await _rows(database_url)}
    assert {i: r["status"] for i, r in after.items()} == expected  # nothing lost or extra

    executions, pids = _key_executions(log, after)
    assert len(pids) == processes  # the work was shared (ORDERED_APP_MEET)
    _assert_key_order(executions, after)
    assert len(executions) == KEYS


Run = tuple[int, int, str]  # (start ns, end ns, event id) of one handler execution


def _key_executions(
    log: Path, after: Mapping[str, Mapping[str, Any]], killed: Mapping[str, int] | None = None
) -> tuple[dict[str, list[Run]], set[str]]:
    """Handler executions per ordering key from ordered_app's log, and the pids seen.

    ``killed`` maps the pid of a process killed with SIGKILL to the monotonic ns when it
    was gone: its unfinished executions end there. Any other start must have an end.
    """
    killed = killed or {}
    executions: dict[str, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[str, str], int] = {}
    pids = set()
    for line in log.read_text().splitlines():
        kind, event_id, pid, ns = line.split()
        if kind in ("effect", "recorded"):
            continue
        pids.add(pid)
        if kind == "start":
            open_runs[(event_id, pid)] = int(ns)
            continue
        started = open_runs.pop((event_id, pid))
        key = after[event_id]["ordering_key"]
        if key is not None:
            executions[key].append((started, int(ns), event_id))
    for (event_id, pid), started in open_runs.items():
        assert pid in killed, f"{event_id} started in {pid} and never ended"
        key = after[event_id]["ordering_key"]
        if key is not None:
            executions[key].append((started, killed[pid], event_id))
    return executions, pids


def _assert_key_order(
    executions: Mapping[str, list[Run]], after: Mapping[str, Mapping[str, Any]]
) -> None:
    """Per key: starts follow write order (seq), no two executions overlap, and an event
    starts only once every earlier event of its key is published or dead-lettered."""
    by_key: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in after.values():
        if row["ordering_key"] is not None:
            by_key[row["ordering_key"]].append(row)
    for key, runs in executions.items():
        runs.sort()
        seqs = [after[event_id]["seq"] for _start, _end, event_id in runs]
        assert seqs == sorted(seqs), f"{key}: started out of write order"
        for (_s1, end1, id1), (start2, _e2, id2) in itertools.pairwise(runs):
            assert end1 <= start2, f"{key}: {id1} and {id2} ran at the same time"
        for _start, _end, event_id in runs:
            earlier = [r for r in by_key[key] if r["seq"] < after[event_id]["seq"]]
            assert all(r["status"] in ("published", "dead_letter") for r in earlier)
