"""Producer processes for benchmarks/bench.py: the write path and the wake-up latency.

    python -m benchmarks.producers write --schedule outbox,plain,... --seconds S [--gap G]
    python -m benchmarks.producers latency --events N [--min-gap S] [--max-gap S]

Both read ``OUTBOX_DATABASE_URL``, report ready and wait for the go file in
``OUTBOX_BENCH_SYNC_DIR`` (benchmarks/bench_app.py), and write their result as JSON to
``OUTBOX_BENCH_LOG_DIR/result.<pid>.json``.

``write``: one business row per unit of work (``plain``), that row plus one outbox
event published in the same transaction (``outbox``), or that row plus a ``SELECT 1`` on
the transaction's asyncpg connection (``statement``: what one more statement costs
whatever it does, the floor under any event written by a statement of its own),
committed one after another; ``plain-psycopg`` and ``outbox-psycopg`` are the first two
through psycopg 3 (``postgresql+psycopg://``) instead of asyncpg. The schedule is a list
of slots of S seconds each, G seconds apart, counted from the moment written in the go
file, so every producer switches mode at the same instant and the modes alternate every
few seconds without restarting a process.

``latency``: one event per unit of work with the after-commit wake-up
(``enable_commit_notifications``) installed, a random gap between commits; records each
event id with the moment its commit returned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from engine import EventRegistry, OutboxEventPublisher, TaskContext, create_engine, unit_of_work
from engine.clock import uuid7
from engine.running.wakeup import enable_commit_notifications

EVENT_TYPE = "bench.happened"
WRITE_MODES = ("plain", "outbox", "statement", "plain-psycopg", "outbox-psycopg")
PSYCOPG = "-psycopg"
CTX = TaskContext("acme", "bench", "req")
business = MetaData()
orders = Table(
    "bench_orders", business, Column("id", String(36), primary_key=True), Column("n", Integer)
)


def _registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register_event(EVENT_TYPE, 1)
    return registry


async def _wait_for_go() -> float:
    """Wait for the go file; returns the start time written in it (now, if none)."""
    sync = os.environ.get("OUTBOX_BENCH_SYNC_DIR")
    if not sync:
        return time.time()
    (Path(sync) / f"ready.{os.getpid()}").touch()
    go = Path(sync) / "go"
    while True:
        if go.exists():
            text = go.read_text().strip()
            return float(text) if text else time.time()
        await asyncio.sleep(0.002)


def _report(result: dict[str, Any]) -> None:
    out = Path(os.environ.get("OUTBOX_BENCH_LOG_DIR", ".")) / f"result.{os.getpid()}.json"
    out.write_text(json.dumps(result))


async def _one_more_statement(session: AsyncSession) -> None:
    """A ``SELECT 1`` on the session's asyncpg connection, in its transaction, as the
    publisher sends its INSERT there (engine.writing.publisher): a round trip and nothing else."""
    conn = await session.connection()
    raw = await conn.get_raw_connection()
    await raw.driver_connection.fetchval("SELECT 1")


async def write(schedule: list[str], seconds: float, gap: float) -> dict[str, Any]:
    url = make_url(os.environ["OUTBOX_DATABASE_URL"])
    engines = {"asyncpg": create_engine(url, pool_size=2)}
    if any(mode.endswith(PSYCOPG) for mode in schedule):
        psycopg_url = url.set(drivername="postgresql+psycopg")
        engines["psycopg"] = create_engine(psycopg_url, pool_size=2)
    registry = _registry()
    slots = []
    try:
        for engine in engines.values():  # the first connections are not on the clock
            async with engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        start = await _wait_for_go()
        for n, slot_mode in enumerate(schedule):
            engine = engines["psycopg" if slot_mode.endswith(PSYCOPG) else "asyncpg"]
            mode = slot_mode.removesuffix(PSYCOPG)
            slot_start = start + n * (seconds + gap)
            await asyncio.sleep(max(0.0, slot_start - time.time()))
            commits = 0
            while time.time() < slot_start + seconds:
                async with unit_of_work(engine, registry=registry, context=CTX) as session:
                    order_id = uuid7()
                    await session.execute(insert(orders).values(id=order_id, n=commits))
                    if mode == "outbox":
                        await OutboxEventPublisher(session).publish(
                            EVENT_TYPE, {}, aggregate_type="order", aggregate_id=order_id
                        )
                    elif mode == "statement":
                        await _one_more_statement(session)
                commits += 1
            slots.append({"mode": slot_mode, "commits": commits})
    finally:
        for engine in engines.values():
            await engine.dispose()
    return {"slots": slots}


async def latency(events: int, min_gap: float, max_gap: float) -> dict[str, Any]:
    engine = create_engine(os.environ["OUTBOX_DATABASE_URL"], pool_size=2)
    notifier = enable_commit_notifications(engine)
    registry = _registry()
    rng = random.Random(7)
    committed: list[tuple[str, float]] = []
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")
        await _wait_for_go()
        for i in range(events):
            await asyncio.sleep(rng.uniform(min_gap, max_gap))
            async with unit_of_work(engine, registry=registry, context=CTX) as session:
                event_id = await OutboxEventPublisher(session).publish(
                    EVENT_TYPE, {"n": i}, aggregate_type="order", aggregate_id=str(i)
                )
            committed.append((event_id, time.time()))
        await asyncio.sleep(max_gap)  # let the last trailing notification go out
    finally:
        await notifier.aclose()
        await engine.dispose()
    return {"committed": committed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="producers for benchmarks/bench.py")
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write")
    w.add_argument("--schedule", required=True, help="modes, comma-separated")
    w.add_argument("--seconds", type=float, default=3.0)
    w.add_argument("--gap", type=float, default=0.5)
    lat = sub.add_parser("latency")
    lat.add_argument("--events", type=int, default=150)
    lat.add_argument("--min-gap", type=float, default=0.02)
    lat.add_argument("--max-gap", type=float, default=0.2)
    args = parser.parse_args(argv)
    if args.what == "write":
        modes = args.schedule.split(",")
        if not set(modes) <= set(WRITE_MODES):
            parser.error(f"--schedule takes {', '.join(WRITE_MODES)}")
        result = asyncio.run(write(modes, args.seconds, args.gap))
    else:
        result = asyncio.run(latency(args.events, args.min_gap, args.max_gap))
    _report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
