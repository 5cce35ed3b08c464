"""Is the console still responsive with a million outbox rows? Scenario k of make bench.

Usage:
    python -m benchmarks.console_million_rows [--database-url URL] [--rows N] [--rebuild]
        [--measure] [--watch-seconds S]      (the URL also from OUTBOX_DATABASE_URL)

``grow`` adds rows until the outbox holds N (bulk inserted with executemany, 50,000 per
transaction) in a realistic mix: mostly published, some pending, failed, dead-letter and
publishing rows, three tenants, two event types, created over the last 30 days. Without
a URL the table is a SQLite file at ``/tmp/outbox-console-1m.db``, reused unless --rebuild.

``measure`` (``--measure``: one JSON line, what the harness reads from a fresh process so
that its memory is the console's alone) runs the real console headless (``make_app`` +
``run_test``) while a ticker measures how long the event loop is ever blocked, reads its
peak RSS, then times what one console refresh asks (the live overview, paused backlog,
top types, the first page of events) and, apart, the recount of published rows the
console runs every few seconds off its refresh path (``recount_ms``). Without --measure
the script also times paging deep into the table, each filter, a detail and a replay
summary, one line each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select

from engine import create_engine, create_schema
from engine.clock import uuid7
from engine.operating.insights import EventFilter, OutboxInsights
from engine.service import paused_backlog
from engine.settings import DispatcherSettings
from engine.storage.schema import outbox_events

DEFAULT_URL = "sqlite+aiosqlite:////tmp/outbox-console-1m.db"
CHUNK = 50_000
FIRST_SCREEN_LIMIT_SECONDS = 60.0
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


async def _settle(engine: Any) -> None:
    """Vacuum and analyze the grown table, as autovacuum would before long.

    Measured right after a bulk load, PostgreSQL's index-only counts visit the heap for
    every entry (no page is all-visible yet) while autovacuum works beside them: a
    refresh at 1,000,000 rows took 478 ms there and 51 ms once vacuumed. A table that
    has been in service for a while is the one operators look at. SQLite needs only the
    statistics.
    """
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.exec_driver_sql("VACUUM (ANALYZE) outbox_events")
        return
    async with engine.begin() as conn:
        await conn.exec_driver_sql("ANALYZE outbox_events")


async def grow(
    url: str,
    rows: int,
    *,
    rebuild: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Add rows until the outbox holds ``rows``; returns how many were added and how fast."""
    engine = create_engine(url)
    try:
        if rebuild:
            async with engine.begin() as conn:
                await conn.run_sync(outbox_events.metadata.drop_all)
        await create_schema(engine)
        async with engine.connect() as conn:
            present = (await conn.execute(select(func.count()).select_from(outbox_events))).scalar()
        rng = random.Random(present or 1)
        now = datetime.now(UTC)
        started = time.perf_counter()
        done = present or 0
        while done < rows:
            batch = _rows(min(CHUNK, rows - done), now, rng)
            async with engine.begin() as conn:
                await conn.execute(insert(outbox_events), batch)
            done += len(batch)
            if progress is not None:
                progress(done)
        if done > (present or 0):
            await _settle(engine)
        return {
            "rows": done,
            "added": done - (present or 0),
            "seconds": round(time.perf_counter() - started, 1),
        }
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
    insights = _insights(engine)
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


def _insights(engine: Any) -> OutboxInsights:
    return OutboxInsights(engine, retention_seconds=7 * 24 * 3600)


async def refresh_figures(url: str, repeat: int = 5) -> dict[str, Any]:
    """Milliseconds of one console refresh (what ``MainScreen._poll`` asks), median of
    ``repeat``, and of each of its parts: the slowest part is what bounds it. The
    recount of published rows (``published_totals``) is timed apart: the console runs
    it beside the refreshes, not in them."""
    engine = create_engine(url)
    insights = _insights(engine)
    totals = await insights.published_totals()
    mark = None

    async def live_overview() -> None:
        nonlocal mark
        mark = (await insights.live_overview(totals, since=mark)).mark

    parts: dict[str, Callable[[], Awaitable[Any]]] = {
        "overview": live_overview,
        "paused_backlog": lambda: paused_backlog(engine),
        "top_types": lambda: insights.top_types(limit=5),
        "first_page": lambda: insights.events_page(limit=100),
    }
    samples: dict[str, list[float]] = {name: [] for name in [*parts, "refresh", "recount"]}
    try:
        await live_overview()  # warm the pool and the statement caches
        for _ in range(repeat):
            total = 0.0
            for name, call in parts.items():
                started = time.perf_counter()
                await call()
                took = (time.perf_counter() - started) * 1000
                samples[name].append(took)
                total += took
            samples["refresh"].append(total)
            started = time.perf_counter()
            await insights.published_totals()
            samples["recount"].append((time.perf_counter() - started) * 1000)
    finally:
        await engine.dispose()
    return {f"{name}_ms": round(statistics.median(v), 1) for name, v in samples.items()}


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def console_figures(url: str, watch_seconds: float = 5.0) -> dict[str, Any]:
    """The real console, headless: first screen, paging, and the longest event-loop stall."""
    from engine.service import load_registry
    from outbox_tui.app import ConsoleConfig, make_app
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
        deadline = time.perf_counter() + FIRST_SCREEN_LIMIT_SECONDS
        while app.main.refreshes == 0:  # polling the app is the measurement
            if time.perf_counter() > deadline:  # a missing table, say: the banner says why
                banner = app.main.query_one("#banner").render()
                raise RuntimeError(
                    f"no console refresh within {FIRST_SCREEN_LIMIT_SECONDS:g} s: {banner}"
                )
            await asyncio.sleep(0.005)
        first_screen = (time.perf_counter() - started) * 1000
        table = app.main.query_one(EventTable)
        before = table.events[-1].id
        # The first refresh is counted before its rows are drawn: let that drawing (the
        # first screen's, which first_screen_ms reports) end, and the ticker report it.
        await asyncio.sleep(0.1)
        stalls.clear()  # from here on: a running console, not its start-up
        started = time.perf_counter()
        app.main.action_older_page()  # what "]" runs (pilot.press would wait for CPU idle)
        while not table.events or table.events[0].id >= before:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        page = (time.perf_counter() - started) * 1000
        paging = len(stalls)  # the stalls so far were the page's, the rest the refreshes'
        seen = app.main.refreshes
        await asyncio.sleep(watch_seconds)  # timed refreshes every 0.5 s
        refreshes = app.main.refreshes - seen
        stop.set()
        await tick
    ordered = sorted(stalls)
    return {
        "first_screen_ms": round(first_screen, 1),
        "older_page_ms": round(page, 1),
        "refreshes": refreshes,
        "watch_seconds": watch_seconds,
        "stall_median_ms": round(statistics.median(ordered), 1),
        "stall_p99_ms": round(ordered[int(len(ordered) * 0.99)], 1),
        "stall_max_ms": round(ordered[-1], 1),
        "stall_paging_max_ms": round(max(stalls[:paging], default=0.0), 1),
        "stall_refresh_max_ms": round(max(stalls[paging:], default=0.0), 1),
        "peak_rss_mb": peak_rss_mb(),
    }


async def measure(url: str, watch_seconds: float = 5.0) -> dict[str, Any]:
    """The console first (its peak RSS must not include the timing loop), then a refresh."""
    figures = await console_figures(url, watch_seconds)
    figures.update(await refresh_figures(url))
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    # From the environment too: a password in argv would show in every process listing.
    parser.add_argument(
        "--database-url", default=os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="grow the outbox to N")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--measure", action="store_true", help="only measure; print JSON")
    parser.add_argument("--watch-seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(await measure(args.database_url, args.watch_seconds)))
        return
    grown = await grow(args.database_url, args.rows, rebuild=args.rebuild)
    print(f"{grown['rows']:,} rows ({grown['added']:,} added in {grown['seconds']:.0f} s)")
    print("insights queries:")
    await query_figures(args.database_url)
    print(json.dumps(await measure(args.database_url, args.watch_seconds), indent=2))


if __name__ == "__main__":
    asyncio.run(main())
