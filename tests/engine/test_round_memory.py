"""A finished round is freed at once, by reference counting, not left to the collector.

A round holds its rows, their envelopes and its worker tasks. Left in a reference cycle,
all of it outlived the round until the cyclic collector found it, and with hundreds of
handlers in flight those collections became a large share of a dispatcher's CPU.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter

import pytest

from engine import OutboxDispatcher
from engine.dispatch.claimed import ClaimedRow
from engine.writing.envelope import EventEnvelope

from .test_relay_prefetch import publish

ROUND_OBJECTS = (EventEnvelope, ClaimedRow, asyncio.Task)


@pytest.mark.parametrize("handler_waits", [False, True], ids=["quick", "waits"])
async def test_a_delivered_round_leaves_nothing_for_the_cyclic_collector(
    db, registry, clock, handler_waits
):
    async def handler(envelope):
        if handler_waits:
            await asyncio.sleep(0.001)  # suspends: the round starts more workers

    registry.register_handler("orders.placed", handler, key="memory-test")
    dispatcher = OutboxDispatcher(db, registry, batch_size=30, max_concurrency=8, clock=clock)
    await publish(db, registry, 30)
    assert (await dispatcher.dispatch_once()).published == 30  # warm caches, pools
    await publish(db, registry, 30)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds, to look at it
    try:
        result = await dispatcher.dispatch_once()
        gc.collect()
        left = Counter(type(o).__name__ for o in gc.garbage if isinstance(o, ROUND_OBJECTS))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert result.published == 30
    assert not left, f"the round's objects waited for the cyclic collector: {dict(left)}"
