"""``outbox-tui --demo``: a living console within seconds, on a local SQLite file.

The demo database (``./outbox-demo.db`` unless another URL is given) gets the
outbox schema and the example orders and billing apps' tables, and a head start of orders
when it is empty. While the console runs, ``DemoTraffic`` places a few orders a
second (cancelling every fourth) and the console's own dispatcher delivers them
to the example handlers, some of which fail transiently (retries) and some
permanently (dead letters). The example orders each order's events, so a
dead-lettered ``orders.placed`` with a cancellation behind it shows up as a
blocked key within seconds (the generator's seeds make sure of it). Billing invoices
each accepted order in a transactional handler, so every ``invoices.issued`` shows its
cause and chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.operating.insights import OutboxInsights
from engine.storage.database import create_engine, create_schema
from engine.writing.registry import EventRegistry
from outbox_tui.examples import billing, orders
from outbox_tui.examples.orders.traffic import generate_orders, trickle

DEMO_DATABASE_URL = "sqlite+aiosqlite:///./outbox-demo.db"
DEMO_APPS = ("outbox_tui.examples.orders", "outbox_tui.examples.billing")
HEAD_START_ORDERS = 40
# Every n-th order of the live traffic is cancelled at once: with the seeds below, the
# fourth order (over the credit limit) is cancelled, so its key blocks in the first seconds.
CANCEL_EVERY = 4

# Under the header while the demo runs, longest first: a newcomer sees dead letters and
# blocked keys climb, and must know at once that the example app fails on purpose.
DEMO_NOTE = (
    " demo · failures on purpose: amounts ending in 7 fail twice, then pass; over 900 "
    "are refused (dead letters), holding back their cancellation (blocked keys)",
    " demo · failures on purpose: amounts ending in 7 fail twice, then go through; over 900 "
    "are refused (dead letters)",
    " demo · on purpose: amounts ending in 7 fail twice; over 900 are dead-lettered",
)

log = logging.getLogger("outbox_tui.demo")


async def prepare_demo_database(database_url: str, registry: EventRegistry) -> None:
    """Create the outbox and example tables (idempotent); seed orders into an empty outbox."""
    engine = create_engine(database_url)
    try:
        await create_schema(engine)
        await orders.create_tables(engine)
        await billing.create_tables(engine)
        snapshot = await OutboxInsights(engine).overview()
        if sum(snapshot.counts.values()) == 0:
            await generate_orders(engine, registry, HEAD_START_ORDERS, seed=7)
    finally:
        await engine.dispose()


class DemoTraffic:
    """Places orders at a steady rate in the background until stopped."""

    def __init__(
        self,
        database_url: str,
        registry: EventRegistry,
        *,
        per_second: float = 2.0,
        cancel_every: int = CANCEL_EVERY,
    ) -> None:
        self.database_url = database_url
        self.registry = registry
        self.per_second = per_second
        self.cancel_every = cancel_every
        self.placed = 0
        self._engine: AsyncEngine | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._engine = create_engine(self.database_url)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(self._engine), name="demo traffic")

    async def _run(self, engine: AsyncEngine) -> None:
        seed = 11
        while not self._stop.is_set():
            try:
                self.placed += await trickle(
                    engine,
                    self.registry,
                    self._stop,
                    per_second=self.per_second,
                    seed=seed,
                    cancel_every=self.cancel_every,
                )
            except Exception as exc:  # the database went away or is busy: wait, carry on
                log.warning("demo traffic paused: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=2.0)
            seed += 10_000

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stop.set()
        with contextlib.suppress(Exception):
            await self._task
        self._task = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
