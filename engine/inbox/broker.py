"""The consumer's side of RabbitMQ: connect, declare and bind the queue, take deliveries.

One connection and one channel per subscription, with ``prefetch`` unacked messages at
most: while the consumer holds a batch it cannot write (the database is away), the
broker sends no more than that, so the consumer stops taking messages without a cancel.
Deliveries arrive through aiormq's consumer callback straight into a buffer (``taken``),
without aio-pika's per-message object and task; acks go out with ``multiple``, one frame
per batch.

Reconnecting is the consumer's (engine.inbox.consumer): when the connection or the
channel closes, ``lost`` is set and every delivery not yet acked is void (the broker
requeues it). ``open`` raises ``BrokerUnavailableError`` when the broker cannot be
reached and ``ConfigurationError`` when it refuses what it was asked (a queue declared
with other arguments, access refused, a missing queue with ``passive``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.connection import Connection, make_url
from aiormq.abc import AbstractChannel as DriverChannel
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import (
    AuthenticationError,
    ChannelAccessRefused,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
    ProbableAuthenticationError,
)
from pamqp.common import FieldTable

from engine.errors import BrokerUnavailableError, ConfigurationError
from engine.inbox.decoding import ReceivedMessage
from engine.inbox.topics import split_binding
from engine.relay.broker import check_amqp_url, quiet_driver_logs
from engine.storage.secrets import mask_secrets, mask_url

log = logging.getLogger("engine.inbox")

# The exchange a binding names is declared as the relay declares its own (engine.relay)
# when it does not exist yet: durable, of type topic.
EXCHANGE_TYPE = aio_pika.ExchangeType.TOPIC
SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"
# Refusals that mean the broker will not do what it was asked, however often it is asked.
_REFUSALS = (
    ChannelAccessRefused,
    ChannelPreconditionFailed,
    ChannelNotFoundEntity,
    AuthenticationError,
    ProbableAuthenticationError,
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message taken off the queue, not acked yet (``tag``: its delivery tag)."""

    tag: int
    message: ReceivedMessage


class Subscription:
    """One connection consuming ``queue``; deliveries gather in ``taken``."""

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        bindings: Sequence[str] = (),
        prefetch: int = 1000,
        passive: bool = False,
        single_active_consumer: bool = False,
        connect_timeout: float = 10.0,
    ) -> None:
        check_amqp_url(url)
        self.url = url
        self.queue = queue
        self.bindings = [split_binding(b) for b in bindings]
        self.prefetch = prefetch
        self.passive = passive
        self.single_active_consumer = single_active_consumer
        self.connect_timeout = connect_timeout
        self.taken: deque[Delivery] = deque()
        self.arrived = asyncio.Event()  # set when ``taken`` gains a delivery
        self.lost = asyncio.Event()  # set when the connection or the channel closed
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._driver: DriverChannel | None = None
        self._consumer_tag: str | None = None

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    async def open(self) -> None:
        """Connect, declare and bind as asked, and start consuming."""
        quiet_driver_logs()  # aiormq's connection-loss tracebacks: one DEBUG line instead
        connection: AbstractConnection = Connection(make_url(self.url))
        try:
            async with asyncio.timeout(self.connect_timeout):
                await connection.connect(timeout=self.connect_timeout)
                channel = await connection.channel(publisher_confirms=False)
                await channel.set_qos(prefetch_count=self.prefetch)
                await self._declare(connection, channel)
                driver = await channel.get_underlay_channel()
                ok = await driver.basic_consume(self.queue, self._deliver, no_ack=False)
        except _REFUSALS as exc:
            await _close_quietly(connection)
            raise ConfigurationError(
                f"RabbitMQ at {self.masked_url} refused the queue {self.queue!r}: "
                f"{self._detail(exc)}"
            ) from None
        except Exception as exc:  # any other failure here means "not connected"
            await _close_quietly(connection)
            raise BrokerUnavailableError(
                f"cannot reach RabbitMQ at {self.masked_url}: {self._detail(exc)}"
            ) from None
        connection.close_callbacks.add(self._on_closed)
        channel.close_callbacks.add(self._on_closed)
        self._connection, self._channel, self._driver = connection, channel, driver
        self._consumer_tag = ok.consumer_tag
        self.lost.clear()

    async def _declare(self, connection: AbstractConnection, channel: AbstractChannel) -> None:
        if self.passive:
            await channel.declare_queue(self.queue, passive=True)
            return
        arguments: FieldTable | None = (
            {SINGLE_ACTIVE_CONSUMER: True} if self.single_active_consumer else None
        )
        queue = await channel.declare_queue(self.queue, durable=True, arguments=arguments)
        for exchange_name, routing_key in self.bindings:
            exchange = await _exchange(connection, channel, exchange_name)
            await queue.bind(exchange, routing_key)

    async def ack(self, last: Delivery) -> bool:
        """Ack every delivery up to ``last``; False when the channel went meanwhile (the
        broker then requeues them: they arrive again and are dropped as duplicates)."""
        driver = self._driver
        if driver is None or self.lost.is_set():
            return False
        try:
            await driver.basic_ack(last.tag, multiple=True)
        except Exception as exc:
            log.debug("ack of %d failed: %s", last.tag, self._detail(exc))
            return False
        return True

    def take(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` deliveries, oldest first, out of ``taken``."""
        taken = self.taken
        count = min(limit, len(taken))
        batch = [taken.popleft() for _ in range(count)]
        if not taken:
            self.arrived.clear()
        return batch

    async def close(self) -> None:
        """Close the connection: what is not acked goes back to the queue."""
        connection, self._connection = self._connection, None
        self._channel = self._driver = None
        self.taken.clear()
        self.arrived.clear()
        if connection is not None:
            connection.close_callbacks.discard(self._on_closed)
            await _close_quietly(connection)

    async def _deliver(self, message: DeliveredMessage) -> None:
        delivery = message.delivery
        properties = message.header.properties
        self.taken.append(
            Delivery(
                delivery.delivery_tag,  # type: ignore[union-attr, arg-type]
                ReceivedMessage(
                    message.body,
                    properties.content_type,
                    properties.headers or {},
                    properties.message_id,
                    properties.content_encoding,
                    properties.message_type,
                    properties.app_id,
                    _timestamp(properties.timestamp),
                    delivery.routing_key,  # type: ignore[union-attr]
                    delivery.exchange,  # type: ignore[union-attr]
                    bool(getattr(delivery, "redelivered", False)),
                ),
            )
        )
        self.arrived.set()

    def _on_closed(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self._connection or sender is self._channel:
            self.taken.clear()  # void: the broker requeues what was not acked
            self.lost.set()

    def _detail(self, exc: BaseException) -> str:
        text = str(exc).strip() or repr(exc)
        return mask_secrets(f"{type(exc).__name__}: {text}", self.url)


async def _exchange(
    connection: AbstractConnection, channel: AbstractChannel, name: str
) -> aio_pika.abc.AbstractExchange:
    """The exchange ``name``: as it exists, else declared as the relay declares its own.

    A passive declaration that finds nothing closes its channel: it runs on one of its own.
    """
    probe = await connection.channel(publisher_confirms=False)
    try:
        await probe.declare_exchange(name, passive=True)
    except ChannelNotFoundEntity:
        return await channel.declare_exchange(name, EXCHANGE_TYPE, durable=True)
    finally:
        if not probe.is_closed:
            await probe.close()
    return await channel.get_exchange(name, ensure=False)


def _timestamp(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None


async def _close_quietly(connection: AbstractConnection) -> None:
    """Close a connection that may already be dead, without raising."""
    try:
        async with asyncio.timeout(2.0):
            await connection.close()
    except Exception as exc:  # best effort: the connection is being thrown away
        log.debug("closing the RabbitMQ connection: %s", type(exc).__name__)
