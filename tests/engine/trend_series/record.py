"""Record the sample series ``test_trend_series.py`` replays: a real outbox, sampled.

Each scenario runs the example orders app on its own SQLite file: traffic placed by
``generate_orders``, a real ``OutboxDispatcher`` paced to a rate, and one overview a
second (what the console's refresh takes), written as ``NAME.csv`` beside this file:
seconds since the first sample, backlog, oldest pending age, published total, held.

    python -m tests.engine.trend_series.record [NAME ...]

The scenarios run side by side, in real time (about two minutes). The files are kept
in the repository: the tests read them, they do not record.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from engine import OutboxDispatcher, create_engine, create_schema
from engine.dispatch.backoff import BackoffPolicy
from engine.operating.insights import OutboxInsights
from engine.operating.trends import Sample
from engine.writing.registry import EventRegistry
from outbox_tui.apps import load_registry
from outbox_tui.examples.orders import create_tables
from outbox_tui.examples.orders.traffic import generate_orders

HERE = Path(__file__).parent
SECONDS = 120
# Seconds a scenario runs before the first sample: the steady and bursty outboxes are
# recorded in their stride, not from empty.
WARM_UP = {"steady": 20.0, "bursty": 30.0}
FIELDS = ("seconds", "backlog", "oldest_pending_age", "published_total", "held")


class Outbox:
    """One scenario's database, its traffic and its dispatcher."""

    def __init__(self, url: str, registry: EventRegistry) -> None:
        self.engine = create_engine(url)
        self.registry = registry
        self.placed = 0

    async def place(self, orders: int, seed: int) -> None:
        await generate_orders(
            self.engine, self.registry, orders, seed=seed, cancel_every=4, start=self.placed
        )
        self.placed += orders

    def dispatcher(self, batch: int) -> OutboxDispatcher:
        return OutboxDispatcher(
            self.engine,
            self.registry,
            dispatcher_id="recorder",
            batch_size=batch,
            backoff=BackoffPolicy(base_seconds=2, max_seconds=10),
        )


async def traffic(outbox: Outbox, stop: asyncio.Event, per_second: float) -> None:
    """Orders one by one at ``per_second``."""
    seed = 100
    while not stop.is_set():
        await outbox.place(1, seed)
        seed += 1
        await _pause(stop, 1 / per_second)


async def bursts(outbox: Outbox, stop: asyncio.Event, orders: int, every: float) -> None:
    """``orders`` at once every ``every`` seconds."""
    seed = 500
    while not stop.is_set():
        await outbox.place(orders, seed)
        seed += orders
        await _pause(stop, every)


async def dispatching(outbox: Outbox, stop: asyncio.Event, batch: int, every: float) -> None:
    """One round of at most ``batch`` events every ``every`` seconds: a paced dispatcher."""
    dispatcher = outbox.dispatcher(batch)
    while not stop.is_set():
        await dispatcher.dispatch_once()
        await _pause(stop, every)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


Scenario = Callable[[Outbox, asyncio.Event], list[Awaitable[None]]]


async def _steady_start(outbox: Outbox) -> None:
    await outbox.place(20, 7)


SCENARIOS: dict[str, tuple[Callable[[Outbox], Awaitable[None]] | None, Scenario]] = {
    # The demo's pace: two orders a second, a dispatcher that keeps up.
    "steady": (_steady_start, lambda o, s: [traffic(o, s, 2.0), dispatching(o, s, 100, 1.0)]),
    # Six orders a second in, about two events a second out.
    "growing": (None, lambda o, s: [traffic(o, s, 6.0), dispatching(o, s, 2, 1.0)]),
    # A backlog of 1,500 orders and no traffic, drained at about 20 events a second.
    "draining": (
        lambda o: o.place(1_500, 7),
        lambda o, s: [dispatching(o, s, 20, 1.0)],
    ),
    # Traffic goes on, the dispatcher is gone.
    "stalled": (lambda o: o.place(100, 7), lambda o, s: [traffic(o, s, 1.0)]),
    # Forty orders at once every ten seconds; a quick dispatcher empties each burst.
    "bursty": (None, lambda o, s: [bursts(o, s, 40, 10.0), dispatching(o, s, 100, 0.5)]),
}


async def record(name: str, registry: EventRegistry, where: Path) -> None:
    url = f"sqlite+aiosqlite:///{where / name}.db"
    outbox = Outbox(url, registry)
    await create_schema(outbox.engine)
    await create_tables(outbox.engine)
    start, run = SCENARIOS[name]
    if start is not None:
        await start(outbox)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(job) for job in run(outbox, stop)]
    await asyncio.sleep(WARM_UP.get(name, 0))  # the console opened on a running outbox
    insights = OutboxInsights(outbox.engine)
    rows = []
    first = None
    try:
        for _ in range(SECONDS):
            sample = Sample.from_overview(await insights.overview())
            first = first or sample.at
            rows.append(
                (
                    round((sample.at - first).total_seconds(), 3),
                    sample.backlog,
                    "" if sample.oldest_pending_age is None else round(sample.oldest_pending_age),
                    sample.published_total,
                    sample.held,
                )
            )
            await asyncio.sleep(1.0)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await outbox.engine.dispose()
    with (HERE / f"{name}.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(FIELDS)
        writer.writerows(rows)


async def main(names: list[str]) -> None:
    registry = load_registry(["outbox_tui.examples.orders"])
    with tempfile.TemporaryDirectory() as where:
        await asyncio.gather(*(record(name, registry, Path(where)) for name in names))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or list(SCENARIOS)))
