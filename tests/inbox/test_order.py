"""Per-key order from A's outbox to B's rows: the relay sends an ordered event's key as
``partitionkey`` and the inbox restores it as ``ordering_key``, in delivery order.

What holds (docs/inbox.md): with one consumer on a queue, B's rows of a key are in A's
order, also after a crash that makes the broker redeliver (the copies are dropped; the
first copy's row keeps its place). With several consumers on one queue the order of a
key's rows is not kept, as two consumers commit their batches in either order; with
``single_active_consumer`` one consumer takes messages at a time and the order is kept
through a failover.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.inbox.consumer import InboxConsumer
from engine.inbox.writer import InboxWriter
from engine.relay import RabbitMqOutboxPublisher
from engine.running.build import build_dispatcher
from engine.settings import DispatcherSettings
from engine.writing.publisher import OutboxEvent
from tests.inbox.conftest import FAST, Inbound, count, eventually, inbound_rows, running
from tests.inbox.corpus import TYPE, event

pytestmark = [pytest.mark.rabbitmq]

KEYS = ("order:a", "order:b", "order:c")


def keyed(count: int, prefix: str = "k") -> list[dict[str, Any]]:
    """``count`` events spread over KEYS in a random interleaving; each key's events are
    numbered in the order they are sent (``data.n``)."""
    rng = random.Random(7)
    sent: dict[str, int] = dict.fromkeys(KEYS, 0)
    found = []
    for i in range(count):
        key = rng.choice(KEYS)
        data = {"n": sent[key], "key": key, "tenant_id": "acme"}
        sent[key] += 1
        found.append(event(f"{prefix}-{i}", partitionkey=key, data=data))
    return found


def per_key_order(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each key's ``data.n`` in the rows' ``seq`` order (rows come sorted by seq)."""
    found: dict[str, list[int]] = {}
    for row in rows:
        if row["ordering_key"] is not None:
            found.setdefault(row["ordering_key"], []).append(int(row["payload"]["n"]))
    return found


def in_order(found: dict[str, list[int]], count: int) -> bool:
    return all(ns == sorted(ns) for ns in found.values()) and sum(map(len, found.values())) == count


async def test_a_relayed_ordered_event_arrives_with_its_key_in_a_s_order(
    tmp_path, db, registry, inbound
):
    """A's outbox relays ordered events; B's rows carry A's keys, each key in A's order."""
    a_registry = EventRegistry()
    a_registry.register_event(TYPE, 1)
    a_registry.set_ordering(TYPE, key=lambda payload: f"customer:{payload['customer']}")
    a = create_engine(f"sqlite+aiosqlite:///{tmp_path}/service-a.db")
    await create_schema(a)
    context = TaskContext("acme", "u-1", "r-1")
    sent: list[tuple[str, int]] = []
    for n in range(30):
        customer = f"c{n % 3}"
        async with unit_of_work(a, registry=a_registry, context=context) as session:
            payload = {"customer": customer, "n": n}
            await OutboxEventPublisher(session).publish_many(
                [OutboxEvent(TYPE, payload, "order", f"o-{n}")]
            )
        sent.append((f"customer:{customer}", n))
    await inbound.declare()
    relay = RabbitMqOutboxPublisher(inbound.url, exchange=inbound.exchange, source_prefix="/a")
    try:
        await relay.connect()
        dispatcher = build_dispatcher(
            a, a_registry, DispatcherSettings(batch_size=10), external_publisher=relay
        )
        published = 0
        for _ in range(100):
            published += (await dispatcher.dispatch_once()).published
            if published == 30:
                break
        assert published == 30
    finally:
        await relay.close()
        await a.dispose()
    async with running(db, registry, inbound.settings(), inbound.url) as run:
        await eventually(lambda: _acked(run, 30), "thirty acks")
    rows = await inbound_rows(db)
    assert {r["ordering_key"] for r in rows} == {"customer:c0", "customer:c1", "customer:c2"}
    for key in ("customer:c0", "customer:c1", "customer:c2"):
        got = [r["payload"]["n"] for r in rows if r["ordering_key"] == key]
        assert got == [n for k, n in sent if k == key]


async def test_one_consumer_keeps_each_keys_order_through_a_crash_and_redelivery(
    db, registry, inbound
):
    await inbound.declare()
    sent = keyed(120)
    await inbound.publish(*sent)
    batches = 0

    class DiesAfterTheThirdCommit(InboxWriter):
        async def write(self, rows):  # type: ignore[no-untyped-def]
            nonlocal batches
            result = await super().write(rows)
            batches += 1
            if batches == 3:
                await asyncio.Event().wait()  # committed, never acked: the crash
            return result

    settings = inbound.settings(prefetch=50, max_batch=10)
    consumer = InboxConsumer(
        db, registry, settings, amqp_url=inbound.url, options=FAST, instance_id="c-1"
    )
    consumer.writer = DiesAfterTheThirdCommit(db)
    async with running(db, registry, settings, inbound.url, consumer=consumer) as run:
        await eventually(lambda: _batches(lambda: batches, 3), "three commits")
        await run.crash()
    async with running(db, registry, settings, inbound.url, instance_id="c-2") as run:
        await eventually(lambda: _rows(db, 120), "all 120 stored")
        await eventually(lambda: _ready_is(inbound, 0), "the queue emptied")
        summary = await run.stop()
    assert summary.totals.duplicates >= 1  # the third batch came back
    found = per_key_order(await inbound_rows(db))
    assert in_order(found, 120), found


async def test_two_consumers_on_one_queue_do_not_keep_a_keys_order(db, registry, inbound):
    """Consumer 1 takes the key's first event and is slow to commit; consumer 2 takes the
    second and commits first: B's rows of the key are out of order. This is why several
    consumers of one queue need single_active_consumer."""
    await inbound.declare()
    first_taken = asyncio.Event()
    release = asyncio.Event()

    class Slow(InboxWriter):
        async def write(self, rows):  # type: ignore[no-untyped-def]
            first_taken.set()
            await release.wait()
            return await super().write(rows)

    settings = inbound.settings(prefetch=1, max_batch=1)
    slow = InboxConsumer(
        db, registry, settings, amqp_url=inbound.url, options=FAST, instance_id="s"
    )
    slow.writer = Slow(db)
    async with running(db, registry, settings, inbound.url, consumer=slow) as one:
        await eventually(lambda: _declared(inbound), "the queue")
        await inbound.publish(event("first", partitionkey="order:x", data={"n": 0}))
        await asyncio.wait_for(first_taken.wait(), 30)
        async with running(db, registry, settings, inbound.url, instance_id="fast") as two:
            await inbound.publish(event("second", partitionkey="order:x", data={"n": 1}))
            await eventually(lambda: _acked(two, 1), "the second stored by the other")
            release.set()
            await eventually(lambda: _acked(one, 1), "the first stored at last")
    assert per_key_order(await inbound_rows(db)) == {"order:x": [1, 0]}


async def test_with_single_active_consumer_a_standby_takes_over_in_order(db, registry, inbound):
    """Two consumers of an x-single-active-consumer queue: one takes messages, the other
    stands by; the active one dies after a commit, unacked; the standby takes over from
    the redelivered messages, and each key's rows stay in the order sent."""
    settings = inbound.settings(prefetch=20, max_batch=5, single_active_consumer=True)
    batches = 0

    class DiesAfterTheFourthCommit(InboxWriter):
        async def write(self, rows):  # type: ignore[no-untyped-def]
            nonlocal batches
            result = await super().write(rows)
            batches += 1
            if batches == 4:
                await asyncio.Event().wait()
            return result

    first = InboxConsumer(
        db, registry, settings, amqp_url=inbound.url, options=FAST, instance_id="a"
    )
    first.writer = DiesAfterTheFourthCommit(db)
    async with running(db, registry, settings, inbound.url, consumer=first) as active:
        await eventually(lambda: _declared(inbound), "the queue")
        async with running(db, registry, settings, inbound.url, instance_id="b") as standby:
            await asyncio.sleep(0.5)  # both subscribed; the first is the active one
            await inbound.publish(*keyed(100, "sac"))
            await eventually(lambda: _batches(lambda: batches, 4), "four commits")
            assert standby.consumer.totals.received == 0  # it stood by
            await active.crash()
            await eventually(lambda: _rows(db, 100), "all 100 stored")
            await eventually(lambda: _ready_is(inbound, 0), "the queue emptied")
            assert standby.consumer.totals.duplicates >= 1  # the unacked batch came back
    found = per_key_order(await inbound_rows(db))
    assert in_order(found, 100), found


async def _acked(run, n: int) -> bool:  # type: ignore[no-untyped-def]
    if run.task.done():
        run.task.result()
    return bool(run.consumer.totals.acked >= n)


async def _batches(get, n: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(get() >= n)


async def _rows(db, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await count(db) >= n


async def _ready_is(inbound: Inbound, n: int) -> bool:
    return await inbound.ready() == n


async def _declared(inbound: Inbound) -> bool:
    try:
        await inbound.ready()
    except Exception:
        return False
    return True
