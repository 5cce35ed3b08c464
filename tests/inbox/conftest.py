"""Inbox fixtures: a per-test exchange and queue on the real broker, and consumers to run.

``Inbound`` publishes messages as a producer would (structured CloudEvents, binary mode,
anything at all) to an exchange of the test's own and reads the queue's ready count; the
consumer under test declares and binds the queue itself. ``running`` starts an
``InboxConsumer`` in this process and stops it (or abandons it, as a crash would).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import EventRegistry
from engine.inbox.consumer import ConsumerOptions, InboxConsumer
from engine.inbox.heartbeat import ConsumerSummary
from engine.settings import ConsumerSettings
from engine.storage.database import read_only_engine
from engine.storage.schema import outbox_events as t
from tests.inbox.corpus import STRUCTURED, TYPE, encoded, event

FAST = ConsumerOptions(
    heartbeat_seconds=0.2,
    heartbeat_min_interval_seconds=0.05,
    storage_retry_initial_seconds=0.05,
    storage_retry_max_seconds=0.2,
    probe_seconds=0.1,
    max_probe_seconds=0.5,
    connect_timeout_seconds=5.0,
)


@pytest.fixture
def registry() -> EventRegistry:
    reg = EventRegistry()
    reg.register_event(TYPE, 1)
    return reg


class Inbound:
    """An exchange and a queue name of one test on the broker at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.exchange = f"inbox.test.{uuid.uuid4().hex}"
        self.queue = f"{self.exchange}.q"

    @property
    def binding(self) -> str:
        return f"{self.exchange}:#"

    def settings(self, **overrides: Any) -> ConsumerSettings:
        return ConsumerSettings(queue=self.queue, bindings=(self.binding,), **overrides)

    async def declare(self, **arguments: Any) -> None:
        """The exchange and the bound queue, before a consumer first runs (messages
        published before it then wait in the queue)."""
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel()
            exchange = await channel.declare_exchange(
                self.exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
            queue = await channel.declare_queue(
                self.queue, durable=True, arguments=arguments or None
            )
            await queue.bind(exchange, "#")

    async def publish(
        self, *messages: aio_pika.Message | dict[str, Any], routing_key: str = TYPE
    ) -> None:
        """Publish each (a dict: a structured CloudEvent), in order, with confirms."""
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel(publisher_confirms=True)
            exchange = await channel.declare_exchange(
                self.exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
            for message in messages:
                if isinstance(message, dict):
                    message = structured(message)
                await exchange.publish(message, routing_key=routing_key)

    async def ready(self) -> int:
        """Messages in the queue that no consumer holds."""
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel()
            queue = await channel.declare_queue(self.queue, passive=True)
            return int(queue.declaration_result.message_count or 0)

    async def delete(self) -> None:
        with contextlib.suppress(Exception):
            async with await aio_pika.connect(self.url, timeout=10) as conn:
                channel = await conn.channel()
                await channel.queue_delete(self.queue)
                await channel.exchange_delete(self.exchange)


def structured(body: dict[str, Any], **properties: Any) -> aio_pika.Message:
    return aio_pika.Message(
        encoded(body),
        content_type=STRUCTURED,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        **properties,
    )


def events(prefix: str, count: int, **extra: Any) -> list[dict[str, Any]]:
    return [event(f"{prefix}-{n}", **extra) for n in range(count)]


@pytest.fixture
async def inbound(amqp_url: str) -> AsyncIterator[Inbound]:
    found = Inbound(amqp_url)
    yield found
    await found.delete()


@dataclass
class Running:
    """A consumer running in this process, and how it ended."""

    consumer: InboxConsumer
    shutdown: asyncio.Event
    task: asyncio.Task[ConsumerSummary]
    waits: list[str | None] = field(default_factory=list)

    async def stop(self, seconds: float = 30.0) -> ConsumerSummary:
        self.shutdown.set()
        return await asyncio.wait_for(self.task, seconds)

    async def crash(self) -> None:
        """Gone without another word to the broker or the database: cancelled wherever it
        was, its connection dropped (the broker requeues what it did not ack)."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def running(
    engine: AsyncEngine,
    registry: EventRegistry,
    settings: ConsumerSettings,
    amqp_url: str,
    *,
    instance_id: str = "consumer-1",
    options: ConsumerOptions = FAST,
    consumer: InboxConsumer | None = None,
    **run: Any,
) -> AsyncIterator[Running]:
    consumer = consumer or InboxConsumer(
        engine, registry, settings, amqp_url=amqp_url, options=options, instance_id=instance_id
    )
    shutdown = asyncio.Event()
    waits: list[str | None] = []
    task = asyncio.create_task(consumer.run(shutdown, on_waiting=waits.append, **run))
    handle = Running(consumer, shutdown, task, waits)
    try:
        yield handle
    finally:
        if not task.done():
            shutdown.set()
            try:
                await asyncio.wait_for(task, 30)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, *, seconds: float = 30.0
) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {seconds:g} s")
        await asyncio.sleep(0.05)


async def count(engine: AsyncEngine, *where: Any) -> int:
    """Rows matching ``where``, read without SQLite's write lock (another process may hold it)."""
    async with read_only_engine(engine).connect() as conn:
        stmt = select(func.count()).select_from(t).where(*where)
        return int((await conn.execute(stmt)).scalar_one())


async def inbound_rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        result = await conn.execute(select(t).order_by(t.c.seq))
        return [dict(r) for r in result.mappings()]
