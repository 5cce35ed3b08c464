"""Topic matching: the catalog's answer to "which types does this binding route to the
queue" is RabbitMQ's. Checked against a real topic exchange, pattern by pattern."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pytest

from engine.inbox.topics import split_binding, topic_matches

KEYS = ("orders.placed", "orders.placed.v2", "orders", "billing.orders.placed", "a.b.c")
PATTERNS = (
    "orders.placed",
    "orders.*",
    "orders.#",
    "#",
    "*.orders.#",
    "#.placed",
    "*",
    "orders.#.v2",
    "#.#",
    "a.*.c",
)


def test_a_binding_splits_at_its_first_colon() -> None:
    assert split_binding("outbox.events:orders.#") == ("outbox.events", "orders.#")
    assert split_binding("ex:key:with:colons") == ("ex", "key:with:colons")
    assert split_binding("ex:") == ("ex", "")


@pytest.mark.parametrize(
    ("pattern", "key", "routed"),
    [
        ("orders.*", "orders.placed", True),
        ("orders.*", "orders.placed.v2", False),
        ("orders.*", "orders", False),
        ("orders.#", "orders", True),
        ("#", "a.b.c", True),
        ("*.orders.#", "billing.orders.placed", True),
        ("#.placed", "billing.orders.placed", True),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
    ],
)
def test_star_is_one_word_and_hash_any_number(pattern: str, key: str, routed: bool) -> None:
    assert topic_matches(pattern, key) is routed


async def test_rabbitmq_routes_exactly_what_topic_matches_says(amqp_url: str) -> None:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        channel = await connection.channel()
        name = f"test.topics.{uuid.uuid4().hex[:8]}"
        exchange = await channel.declare_exchange(
            name, aio_pika.ExchangeType.TOPIC, auto_delete=True
        )
        queues = {}
        for pattern in PATTERNS:
            queue = await channel.declare_queue(exclusive=True)
            await queue.bind(exchange, pattern)
            queues[pattern] = queue
        for key in KEYS:
            await exchange.publish(aio_pika.Message(key.encode()), routing_key=key)
        for pattern, queue in queues.items():
            expected = {key for key in KEYS if topic_matches(pattern, key)}
            got: set[str] = set()
            deadline = asyncio.get_running_loop().time() + 5
            while got != expected and asyncio.get_running_loop().time() < deadline:
                message = await queue.get(fail=False)
                if message is None:
                    await asyncio.sleep(0.05)
                    continue
                await message.ack()
                got.add(message.body.decode())
            await asyncio.sleep(0.1)  # nothing more arrives than the matcher says
            while (message := await queue.get(fail=False)) is not None:
                await message.ack()
                got.add(message.body.decode())
            assert got == expected, pattern
