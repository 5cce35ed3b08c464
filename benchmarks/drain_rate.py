"""Drain rate and write cost of the outbox, as ratios against floors measured in the same run.

Usage: python benchmarks/drain_rate.py [DATABASE_URL ...] [--events N] [--batch N]

1. Drain: the engine's ``OutboxDispatcher`` (no-op handler) against a floor loop that runs the
   same claim and complete statements by hand on one connection, with no engine around it.
   Target: engine / floor >= 0.8.
2. Write cost: a unit of work that inserts a business row and publishes one event, against
   the same transaction with the business insert alone. Target: with / without <= 1.3.

Each measurement alternates engine and floor runs on fresh data (best of 3) so machine noise
hits both alike; a ratio, not a rate, is the result.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from sqlalchemy import Column, Integer, MetaData, String, Table, delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import (
    EventRegistry,
    OutboxDispatcher,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    store,
    unit_of_work,
)
from engine.clock import utc_now, uuid7
from engine.schema import handler_runs, outbox_events

business = MetaData()
orders = Table(
    "bench_orders", business, Column("id", String(36), primary_key=True), Column("n", Integer)
)
CTX = TaskContext("acme", "bench", "req")


def _registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register_event("bench.happened", 1)

    async def noop(envelope: object) -> None:
        return None

    registry.register_handler("bench.happened", noop, key="bench.noop")
    return registry


async def _reset(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(outbox_events))
        await conn.execute(delete(handler_runs))
        await conn.execute(delete(orders))


async def _fill(engine: AsyncEngine, count: int) -> None:
    now = utc_now()
    payload = {"tenant_id": "acme", "actor_id": "bench", "request_id": "req"}
    rows = [
        {
            "id": uuid7(),
            "tenant_id": "acme",
            "event_type": "bench.happened",
            "event_version": 1,
            "aggregate_type": "bench",
            "aggregate_id": str(i),
            "payload": payload,
            "created_at": now,
        }
        for i in range(count)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(outbox_events), rows)


async def drain_engine(engine: AsyncEngine, registry: EventRegistry, batch: int) -> int:
    dispatcher = OutboxDispatcher(engine, registry, batch_size=batch)
    total = 0
    while (result := await dispatcher.dispatch_once()).claimed:
        total += result.published
    return total


async def drain_floor(engine: AsyncEngine, batch: int) -> int:
    """The same claim and completion SQL, by hand, nothing else."""
    total = 0
    lease = timedelta(seconds=30)
    while True:
        now = utc_now()
        async with engine.begin() as conn:
            claimed = await store.claim_batch(
                conn, dispatcher_id="floor", batch_size=batch, lease=lease, now=now
            )
        if not claimed:
            return total
        async with engine.begin() as conn:
            done = await store.mark_published(
                conn,
                [(r.event_id, r.claim_version) for r in claimed],
                store.Fence("floor", utc_now()),
            )
        total += len(done)


async def _timed(fn: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    start = time.perf_counter()
    count = await fn()
    return time.perf_counter() - start, count


async def bench_drain(engine: AsyncEngine, events: int, batch: int) -> tuple[float, float]:
    registry = _registry()
    best_engine = best_floor = 0.0
    for _ in range(3):
        for name in ("floor", "engine"):
            await _reset(engine)
            await _fill(engine, events)
            if name == "floor":
                seconds, count = await _timed(lambda: drain_floor(engine, batch))
                best_floor = max(best_floor, count / seconds)
            else:
                seconds, count = await _timed(lambda: drain_engine(engine, registry, batch))
                best_engine = max(best_engine, count / seconds)
            assert count == events, (name, count)
    return best_engine, best_floor


async def bench_write(engine: AsyncEngine, transactions: int) -> tuple[float, float]:
    registry = _registry()

    async def business_only() -> int:
        for i in range(transactions):
            async with unit_of_work(engine, registry=registry, context=CTX) as session:
                await session.execute(insert(orders).values(id=uuid7(), n=i))
        return transactions

    async def with_outbox() -> int:
        for i in range(transactions):
            async with unit_of_work(engine, registry=registry, context=CTX) as session:
                order_id = uuid7()
                await session.execute(insert(orders).values(id=order_id, n=i))
                await OutboxEventPublisher(session).publish(
                    "bench.happened", {}, aggregate_type="bench", aggregate_id=order_id
                )
        return transactions

    best_plain = best_outbox = 0.0
    for _ in range(3):
        await _reset(engine)
        seconds, count = await _timed(business_only)
        best_plain = max(best_plain, count / seconds)
        await _reset(engine)
        seconds, count = await _timed(with_outbox)
        best_outbox = max(best_outbox, count / seconds)
    return best_plain, best_outbox


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="*", default=["sqlite+aiosqlite:///./bench-outbox.db"])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--transactions", type=int, default=1000)
    args = parser.parse_args()
    for url in args.urls:
        engine = create_engine(url)
        await create_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(business.create_all)
        engine_rate, floor_rate = await bench_drain(engine, args.events, args.batch)
        plain, outboxed = await bench_write(engine, args.transactions)
        print(f"{engine.dialect.name}:")
        print(
            f"  drain   engine {engine_rate:8.0f} ev/s  floor {floor_rate:8.0f} ev/s  "
            f"ratio {engine_rate / floor_rate:.2f} (target >= 0.80)"
        )
        print(
            f"  write   business only {plain:6.0f} tx/s  with outbox {outboxed:6.0f} tx/s  "
            f"cost {plain / outboxed:.2f}x (target <= 1.30)"
        )
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
