"""Relay fixtures: a per-test exchange and queue on the real broker, a consumer, broker control.

The engine fixtures (``db`` on SQLite and PostgreSQL, ``registry``, ``clock``) are shared with
tests/engine. Stopping the broker goes through ``rabbitmqctl stop_app`` / ``start_app`` via the
executable named by OUTBOX_TEST_RMQCTL (scripts/test.sh exports one for the broker it starts),
so a test never kills the broker process itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import EventRegistry, OutboxEventPublisher, TaskContext, unit_of_work
from engine.relay import RabbitMqOutboxPublisher
from engine.writing.publisher import OutboxEvent
from tests.engine.conftest import registry  # noqa: F401 - shared fixture

RMQCTL_ENV = "OUTBOX_TEST_RMQCTL"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
DEFAULT_MAX_MESSAGE_SIZE = 134217728
CTX = TaskContext(tenant_id="acme", actor_id="user-1", request_id="req-1", trace_id=TRACE)


@dataclass(frozen=True)
class Received:
    """One consumed message, copied out of aio-pika so it outlives the connection."""

    routing_key: str | None
    exchange: str | None
    message_id: str | None
    delivery_mode: int
    content_type: str | None
    type: str | None
    app_id: str | None
    timestamp: Any
    body: dict[str, Any]
    raw_body: bytes


class Topology:
    """A per-test topic exchange (the relay declares it) and a durable queue bound to it.

    The queue is durable so that messages survive a ``stop_app``/``start_app`` cycle; the
    consumer opens a fresh connection for each drain because its own dies with the broker.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.exchange = f"outbox.test.{uuid.uuid4().hex}"
        self.queue = f"{self.exchange}.q"
        self.received: list[Received] = []
        self.queue_arguments: dict[str, object] | None = None

    async def bind(
        self, *binding_keys: str, queue_arguments: dict[str, object] | None = None
    ) -> None:
        """Declare the exchange and the queue (with ``queue_arguments``, e.g. a length
        limit) and bind it by each key (default ``#``: everything)."""
        self.queue_arguments = queue_arguments
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel()
            exchange = await channel.declare_exchange(
                self.exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
            queue = await channel.declare_queue(
                self.queue, durable=True, arguments=self.queue_arguments
            )
            for key in binding_keys or ("#",):
                await queue.bind(exchange, key)

    async def drain(self, expected: set[str], wait_seconds: float = 20.0) -> list[Received]:
        """Consume (and ack) until every id in ``expected`` arrived; returns all received so far."""
        deadline = time.monotonic() + wait_seconds
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel()
            queue = await channel.declare_queue(
                self.queue, durable=True, arguments=self.queue_arguments
            )
            while not expected <= {r.message_id for r in self.received}:
                message = await queue.get(fail=False, timeout=10)
                if message is None:
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.02)
                    continue
                self.received.append(
                    Received(
                        message.routing_key,
                        message.exchange,
                        message.message_id,
                        int(message.delivery_mode),
                        message.content_type,
                        message.type,
                        message.app_id,
                        message.timestamp,
                        json.loads(message.body),
                        message.body,
                    )
                )
                await message.ack()
        return self.received

    async def message_count(self) -> int:
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel()
            queue = await channel.declare_queue(
                self.queue, durable=True, arguments=self.queue_arguments
            )
            return queue.declaration_result.message_count or 0

    async def delete(self) -> None:
        async with await aio_pika.connect(self.url, timeout=10) as conn:
            channel = await conn.channel()
            await channel.queue_delete(self.queue)
            await channel.exchange_delete(self.exchange)


@pytest.fixture
async def topology(amqp_url: str) -> AsyncIterator[Topology]:
    topo = Topology(amqp_url)
    yield topo
    await topo.delete()


class BrokerControl:
    """Stops/starts the test broker's app and raises/clears a memory alarm, through rabbitmqctl.

    ``stop_app`` closes every connection and the AMQP listener (the Erlang node stays up, so
    ``start_app`` takes about a second); a memory high watermark of 0 raises a resource alarm,
    under which the broker stops reading from publishing connections, so confirms never come.
    Teardown undoes whatever the test left behind.
    """

    def __init__(self, ctl: str, amqp_url: str) -> None:
        self.ctl = ctl
        url = make_url(amqp_url)
        self.host, self.port = url.host or "127.0.0.1", url.port or 5672
        self.stopped = False
        self.blocked = False
        self.limited = False
        self.users: list[str] = []

    async def _run(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.ctl,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            pytest.fail(f"{self.ctl} {' '.join(args)} did not finish within 60 s")
        if proc.returncode != 0:
            pytest.fail(f"{self.ctl} {' '.join(args)} exited {proc.returncode}: {out.decode()}")
        return out.decode()

    async def open_channels(self) -> int:
        """How many channels are open on the broker, over all connections."""
        out = await self._run("-q", "list_channels", "--no-table-headers", "pid")
        return sum(1 for line in out.splitlines() if line.strip())

    async def stop(self) -> None:
        self.stopped = True
        await self._run("-q", "stop_app")

    async def start(self) -> None:
        await self._run("-q", "start_app")
        deadline = time.monotonic() + 30
        while True:  # the AMQP listener opens last
            try:
                _, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"RabbitMQ did not listen on {self.port} within 30 s")
                await asyncio.sleep(0.05)
            else:
                writer.close()
                await writer.wait_closed()
                break
        self.stopped = False

    async def block_publishers(self) -> None:
        self.blocked = True
        await self._run("-q", "set_vm_memory_high_watermark", "0")

    async def limit_message_size(self, size: int | None) -> None:
        """Set the broker's max_message_size (None: its default, 128 MiB)."""
        self.limited = size is not None
        value = DEFAULT_MAX_MESSAGE_SIZE if size is None else size
        await self._run("-q", "eval", f"application:set_env(rabbit, max_message_size, {value}).")

    async def add_user(self, name: str, password: str, *, write: str) -> str:
        """A user of the default vhost that may configure and read everything and write
        what ``write`` (a regular expression of resource names) matches; its AMQP URL."""
        self.users.append(name)
        await self._run("-q", "add_user", name, password)
        await self.set_write_permission(name, write)
        return f"amqp://{name}:{password}@{self.host}:{self.port}/"

    async def set_write_permission(self, name: str, write: str) -> None:
        await self._run("-q", "set_permissions", "-p", "/", name, ".*", write, ".*")

    async def set_topic_write_permission(self, name: str, exchange: str, write: str) -> None:
        """Topic permissions: on ``exchange`` the user may publish only with routing keys
        that ``write`` matches."""
        await self._run("-q", "set_topic_permissions", "-p", "/", name, exchange, write, ".*")

    async def unblock_publishers(self) -> None:
        await self._run("-q", "set_vm_memory_high_watermark", "0.4")  # the default
        self.blocked = False


@pytest.fixture
async def broker(amqp_url: str, topology: Topology) -> AsyncIterator[BrokerControl]:
    """Broker control; needs OUTBOX_TEST_RMQCTL (fails, never skips, when it is missing)."""
    ctl = os.environ.get(RMQCTL_ENV)
    if not ctl:
        pytest.fail(
            f"{RMQCTL_ENV} is not set: it must name an executable that runs rabbitmqctl against "
            "the broker of OUTBOX_TEST_AMQP_URL (`make test` provides one)"
        )
    if not os.access(ctl, os.X_OK):
        pytest.fail(f"{RMQCTL_ENV}={ctl} is not an executable file")
    control = BrokerControl(ctl, amqp_url)
    try:
        yield control
    finally:
        if control.stopped:
            await control.start()
        if control.blocked:
            await control.unblock_publishers()
        if control.limited:
            await control.limit_message_size(None)
        for user in control.users:
            await control._run("-q", "delete_user", user)


@pytest.fixture
async def relay(amqp_url: str, topology: Topology) -> AsyncIterator[RabbitMqOutboxPublisher]:
    async with RabbitMqOutboxPublisher(
        amqp_url, exchange=topology.exchange, source_prefix="/shop", probe_interval=0.05
    ) as publisher:
        yield publisher


async def add_events(
    engine: AsyncEngine,
    events: EventRegistry,
    count: int = 1,
    *,
    event_type: str = "orders.placed",
    max_attempts: int | None = None,
    prefix: str = "o",
    context: TaskContext = CTX,
) -> list[str]:
    """Write ``count`` events through the engine's unit of work; returns their ids."""
    drafts: Sequence[OutboxEvent] = [
        OutboxEvent(
            event_type,
            {"order_id": f"{prefix}-{i}", "amount": i} if event_type == "orders.placed" else {},
            "order",
            f"{prefix}-{i}",
            max_attempts=max_attempts,
        )
        for i in range(count)
    ]
    async with unit_of_work(engine, registry=events, context=context) as session:
        return await OutboxEventPublisher(session).publish_many(drafts)
