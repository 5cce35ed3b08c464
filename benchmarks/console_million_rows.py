"""Is the console still responsive with a million outbox rows? Times the queries it runs.

Usage:
    python benchmarks/console_million_rows.py [--database-url URL] [--rows N] [--rebuild]

Without a URL it builds (once; reused afterwards unless --rebuild) a SQLite file at
``/tmp/outbox-console-1m.db``. A PostgreSQL URL names a database that is filled when its
outbox is empty. Rows are bulk inserted with executemany, 50,000 per transaction, in a
realistic mix: mostly published, some pending, failed, dead-letter and publishing rows,
three tenants, two event types, created over the last 30 days.

Then it times what one console refresh asks (``overview()`` and the first page of
``events_page``), paging deep into the table, each filter, a detail, a replay summary,
and finally runs the real console headless (``make_app`` + ``run_test``) while measuring
how long the event loop is ever blocked: the figure that says "the UI never waits".
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select

from engine import create_engine, create_schema
from engine.clock import uuid7
from engine.insights import EventFilter, OutboxInsights
from engine.schema import outbox_events
from engine.settings import DispatcherSettings

DEFAULT_URL = "sqlite+aiosqlite:////tmp/outbox-console-1m.db"
CHUNK = 50_000
MIX = (  # status, share
    ("published", 0.90),
    ("pending", 0.05),
    ("failed", 0.02),
    ("dead_letter", 0.02),
    ("publishing", 0.01),
)
TENANTS = ("acme", "globex", "initech")
TYPES = ("orders.placed", "orders.cancelled")


def _rows(count: int, now: datetime, rng: random.Random) -> list[dict[str, Any]]:
    statuses = [s for s, share in MIX for _ in range(int(share * 100))]
    span = 30 * 24 * 3600
    rows = []
    for i in range(count):
        status = rng.choice(statuses)
        created = now - timedelta(seconds=span * (1 - i / count))
        tenant = TENANTS[i % 3]
        order = f"{rng.getrandbits(64):016x}"
        row: dict[str, Any] = {
            "id": uuid7(),
            "tenant_id": tenant,
            "event_type": TYPES[i % 7 == 0],
            "event_version": 1,
            "aggregate_type": "order",
            "aggregate_id": order,
            "payload": {"order_id": order, "amount": rng.randint(1, 1500), "tenant_id": tenant},
            "status": status,
            "attempt_count": 0 if status == "pending" else 1,
            "max_attempts": 10,
            "created_at": created,
            "claim_version": 0 if status == "pending" else 1,
            "published_at": None,
            "next_retry_at": None,
            "locked_by": None,
            "locked_until": None,
            "last_error": None,
            "dead_letter_reason": None,
        }
        if status == "published":
            row["published_at"] = created + timedelta(seconds=2)
        elif status == "failed":
            row["next_retry_at"] = now + timedelta(seconds=rng.randint(5, 300))
            row["last_error"] = "orders.reserve_stock: ConnectionError: warehouse API timed out"
        elif status == "dead_letter":
            row["attempt_count"] = 10
            row["last_error"] = row["dead_letter_reason"] = "permanent: amount over limit"
        elif status == "publishing":
            row["locked_by"] = "bench:1"
            row["locked_until"] = now + timedelta(seconds=rng.choice((-60, 30)))
        rows.append(row)
    return rows


async def fill(url: str, rows: int, rebuild: bool) -> float | None:
    """Create and fill the outbox unless it already holds rows; returns seconds taken."""
    engine = create_engine(url)
    try:
        if rebuild:
            async with engine.begin() as conn:
                await conn.run_sync(outbox_events.metadata.drop_all)
        await create_schema(engine)
        async with engine.connect() as conn:
            present = (await conn.execute(select(func.count()).select_from(outbox_events))).scalar()
        if present:
            print(f"reusing {present:,} rows at {engine.url.render_as_string(hide_password=True)}")
            return None
        rng = random.Random(1)
        now = datetime.now(UTC)
        started = time.perf_counter()
        done = 0
        while done < rows:
            batch = _rows(min(CHUNK, rows - done), now, rng)
            async with engine.begin() as conn:
                await conn.execute(insert(outbox_events), batch)
            done += len(batch)
            print(f"\r  inserted {done:,} rows", end="", flush=True)
        print()
        async with engine.begin() as conn:  # planner statistics, as autovacuum would
            await conn.exec_driver_sql("ANALYZE outbox_events")
        return time.perf_counter() - started
    finally:
        await engine.dispose()


async def timed(name: str, call: Callable[[], Awaitable[Any]], repeat: int = 5) -> Any:
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = await call()
        samples.append((time.perf_counter() - started) * 1000)
    print(f"  {name:<44} median {statistics.median(samples):8.1f} ms   max {max(samples):8.1f} ms")
    return result


async def query_figures(url: str) -> None:
    engine = create_engine(url)
    insights = OutboxInsights(engine, retention_seconds=7 * 24 * 3600)
    try:
        snap = await timed("overview() (one refresh's counts)", insights.overview)
        counts = ", ".join(f"{k}={v:,}" for k, v in snap.counts.items())
        print(f"    {counts}")
        first = await timed(
            "events_page(limit=100), newest", lambda: insights.events_page(limit=100)
        )
        ids = await insights.matching_ids(EventFilter(statuses=("dead_letter",)), limit=1)
        middle = await insights.events_page(
            EventFilter(statuses=("published",)), limit=1, before=first.events[0].id
        )
        cursor = middle.events[0].id if middle.events else first.events[-1].id
        await timed(
            "events_page, 100 older than a cursor",
            lambda: insights.events_page(limit=100, before=cursor),
        )
        for label, flt in (
            ("status=dead_letter", EventFilter(statuses=("dead_letter",))),
            ("status=pending,failed", EventFilter(statuses=("pending", "failed"))),
            ("tenant=globex", EventFilter(tenant_id="globex")),
            ("type=orders.cancelled", EventFilter(event_type="orders.cancelled")),
            ("aggregate id", EventFilter(aggregate_id=first.events[0].aggregate_id)),
        ):
            await timed(
                f"events_page(limit=100) {label}",
                lambda flt=flt: insights.events_page(flt, limit=100),
            )
        await timed("event_detail(id)", lambda: insights.event_detail(ids[0]))
        await timed(
            "match_summary(dead letters) for R",
            lambda: insights.match_summary(EventFilter(statuses=("dead_letter",))),
            repeat=3,
        )
    finally:
        await engine.dispose()


async def console_figures(url: str) -> None:
    """The real console, headless: first screen, paging, and the longest event-loop stall."""
    from outbox_tui.app import ConsoleConfig, make_app
    from outbox_tui.apps import load_registry
    from outbox_tui.widgets.event_table import EventTable

    app = make_app(
        ConsoleConfig(url, refresh_seconds=0.5),
        registry=load_registry([]),
        dispatch_settings=DispatcherSettings(retention_seconds=7 * 24 * 3600),
    )
    stalls: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:  # how late does a 10 ms sleep wake up?
        while not stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            stalls.append((time.perf_counter() - started - 0.01) * 1000)

    started = time.perf_counter()
    async with app.run_test(size=(160, 45)):
        tick = asyncio.create_task(ticker())
        while app.main.refreshes == 0:  # noqa: ASYNC110 - polling the app is the measurement
            await asyncio.sleep(0.005)
        first_screen = (time.perf_counter() - started) * 1000
        table = app.main.query_one(EventTable)
        before = table.events[-1].id
        stalls.clear()  # from here on: a running console, not its start-up
        started = time.perf_counter()
        app.main.action_older_page()  # what "]" runs (pilot.press would wait for CPU idle)
        while not table.events or table.events[0].id >= before:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        page = (time.perf_counter() - started) * 1000
        seen = app.main.refreshes
        await asyncio.sleep(5)  # timed refreshes every 0.5 s
        refreshes = app.main.refreshes - seen
        stop.set()
        await tick
    print(
        f"  console: first screen {first_screen:.0f} ms, older page {page:.0f} ms, "
        f"{refreshes} refreshes in 5 s"
    )
    print(
        f"  console: event loop stalls  median {statistics.median(stalls):.1f} ms, "
        f"p99 {sorted(stalls)[int(len(stalls) * 0.99)]:.1f} ms, max {max(stalls):.1f} ms"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    took = await fill(args.database_url, args.rows, args.rebuild)
    if took is not None:
        print(f"built {args.rows:,} rows in {took:.0f} s")
    print("insights queries:")
    await query_figures(args.database_url)
    await console_figures(args.database_url)


if __name__ == "__main__":
    asyncio.run(main())
