"""A deterministic traffic generator for demos, screenshots and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import random

from sqlalchemy.ext.asyncio import AsyncEngine

from engine import EventRegistry, TaskContext
from outbox_tui.examples.orders.app import cancel_order, place_order

TENANTS = ("acme", "globex", "initech")
CUSTOMERS = ("ada", "grace", "linus", "margaret", "ken", "barbara")


async def generate_orders(
    engine: AsyncEngine,
    registry: EventRegistry,
    count: int,
    *,
    seed: int = 7,
    cancel_every: int = 5,
    start: int = 0,
) -> list[str]:
    """Place ``count`` orders (and cancel every n-th), deterministically from ``seed``.

    ``start`` numbers the orders on from an earlier call, so tenants keep rotating.
    """
    rng = random.Random(seed)
    placed = []
    for i in range(start, start + count):
        tenant = TENANTS[i % len(TENANTS)]
        context = TaskContext(
            tenant_id=tenant,
            actor_id=f"user-{rng.randint(1, 9)}",
            request_id=f"req-{seed}-{i}",
            trace_id=f"{rng.getrandbits(128):032x}",
        )
        amount = rng.choice((19, 42, 120, 217, 350, 480, 777, 950, 1200, 60))
        order_id = await place_order(engine, registry, context, rng.choice(CUSTOMERS), amount)
        placed.append(order_id)
        if cancel_every and i % cancel_every == cancel_every - 1:
            await cancel_order(engine, registry, context, order_id, "customer changed their mind")
    return placed


async def trickle(
    engine: AsyncEngine,
    registry: EventRegistry,
    stop: asyncio.Event,
    *,
    per_second: float = 3.0,
    seed: int = 11,
    cancel_every: int = 0,
) -> int:
    """Place orders at a steady rate until ``stop`` is set; returns how many.

    ``cancel_every`` cancels every n-th order right after placing it (0: none).
    """
    total = 0
    batch = 0
    while not stop.is_set():
        await generate_orders(
            engine, registry, 1, seed=seed + batch, cancel_every=cancel_every, start=batch
        )
        total += 1
        batch += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0 / per_second)
    return total
