"""The reconnecting broker connection on its own, with a channel set up by its user (here a
consumer's queue, as an inbox would have), not the relay's exchange."""

from __future__ import annotations

import uuid

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue

from engine.errors import BrokerUnavailableError, ConfigurationError
from engine.relay.broker import BrokerConnection
from tests.relay.test_rabbitmq import closed_port


def queue_setup(name: str):
    opened: list[AbstractChannel] = []

    async def setup(connection: AbstractConnection) -> tuple[AbstractChannel, AbstractQueue]:
        channel = await connection.channel()
        opened.append(channel)
        queue = await channel.declare_queue(name, auto_delete=True)
        return channel, queue

    return setup, opened


@pytest.mark.rabbitmq
async def test_a_broken_channel_is_set_up_again_on_the_next_ensure(amqp_url: str) -> None:
    setup, opened = queue_setup(f"test-broker-connection-{uuid.uuid4().hex}")
    connection = BrokerConnection(amqp_url, setup, connect_timeout=5)
    try:
        queue = await connection.open()
        assert connection.is_open and len(opened) == 1
        assert await connection.ensure() is queue  # live: nothing set up again

        await opened[0].close()  # the channel goes (as when the broker closes it)
        assert not connection.is_open
        again = await connection.ensure()
        assert connection.is_open and len(opened) == 2 and again is not queue
        await again.channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=again.name)
        message = await again.get(timeout=5, fail=False)
        assert message is not None and message.body == b"x"
    finally:
        await connection.close()
    assert connection.closed and not connection.is_open
    with pytest.raises(BrokerUnavailableError):
        await connection.reopen()  # closed by its user: no fresh channel


async def test_an_unreachable_broker_is_one_masked_error() -> None:
    setup, opened = queue_setup("never-declared")
    port = closed_port()
    url = f"amqp://inbox:s3cr3t-pw@127.0.0.1:{port}/"
    connection = BrokerConnection(url, setup, connect_timeout=2)
    with pytest.raises(BrokerUnavailableError) as info:
        await connection.ensure()
    assert str(info.value).startswith(
        f"cannot reach RabbitMQ at amqp://inbox:***@127.0.0.1:{port}/: "
    )
    assert "s3cr3t" not in str(info.value) and opened == []
    await connection.close()


def test_a_url_that_is_not_amqp_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="amqp:// or amqps://"):
        BrokerConnection("http://u:pw@host/", queue_setup("q")[0], connect_timeout=1)
