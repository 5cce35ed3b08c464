"""The relay's and the inbox's floors in raw aio-pika, and the broker plumbing both sides use.

    python -m benchmarks.peer_amqp --count N --body-size B [--batch 500]
    python -m benchmarks.peer_amqp --consume QUEUE --count N [--prefetch 1000]

The worker (``OUTBOX_BENCH_AMQP_URL``) opens one confirming channel, declares the relay's
exchange as the relay does (durable topic), reports ready, waits for the go file, then
publishes N persistent, mandatory messages of B bytes with the properties the relay sets,
``asyncio.gather``-ing 500 at a time and awaiting every confirm, and exits.

With ``--consume`` it consumes N messages from QUEUE instead, with ``prefetch`` unacked at
most and a manual ack per message, doing nothing else (the inbox's floor), and exits.

The harness calls ``prepare_queue`` first: a durable queue bound to the exchange with
``#``, so every message is routable, purged before each run; ``queue_depth`` afterwards
checks that N messages arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aio_pika

from engine.settings import DEFAULT_EXCHANGE

QUEUE = "outbox.bench"
ROUTING_KEY = "bench.happened"


async def _declare(channel: aio_pika.abc.AbstractChannel) -> aio_pika.abc.AbstractQueue:
    exchange = await channel.declare_exchange(
        DEFAULT_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
    )
    queue = await channel.declare_queue(QUEUE, durable=True)
    await queue.bind(exchange, routing_key="#")
    return queue


async def prepare_queue(url: str) -> None:
    """Declare and bind the bench queue, and empty it."""
    connection = await aio_pika.connect(url)
    async with connection:
        queue = await _declare(await connection.channel())
        await queue.purge()


async def queue_depth(url: str, name: str | None = None) -> int:
    """Messages ready in the bench queue (or the durable queue ``name``)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await (
            _declare(channel) if name is None else channel.declare_queue(name, durable=True)
        )
        return int(queue.declaration_result.message_count or 0)


async def delete_queue(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(QUEUE)


async def publish(count: int, body_size: int, batch: int) -> None:
    connection = await aio_pika.connect(os.environ["OUTBOX_BENCH_AMQP_URL"])
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.declare_exchange(
            DEFAULT_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        body = b"x" * body_size
        await _wait_for_go()
        for start in range(0, count, batch):
            messages = [
                aio_pika.Message(
                    body,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=str(uuid.uuid4()),
                    content_type="application/cloudevents+json",
                    timestamp=datetime.now(UTC),
                    type=ROUTING_KEY,
                    app_id="/outbox/bench",
                )
                for _ in range(min(batch, count - start))
            ]
            await asyncio.gather(
                *(exchange.publish(m, routing_key=ROUTING_KEY, mandatory=True) for m in messages)
            )


async def consume(queue_name: str, count: int, prefetch: int) -> None:
    """Take ``count`` messages off ``queue_name``, each acked alone, and return."""
    connection = await aio_pika.connect(os.environ["OUTBOX_BENCH_AMQP_URL"])
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.declare_queue(queue_name, durable=True)
        await _wait_for_go()
        done = asyncio.Event()
        taken = 0

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal taken
            await message.ack()
            taken += 1
            if taken >= count:
                done.set()

        await queue.consume(take)
        await done.wait()


async def _wait_for_go() -> None:
    sync = os.environ.get("OUTBOX_BENCH_SYNC_DIR")
    if not sync:
        return
    (Path(sync) / f"ready.{os.getpid()}").touch()
    while True:  # a file, not an event: polled, as bench_app polls it
        if (Path(sync) / "go").exists():
            return
        await asyncio.sleep(0.002)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="raw aio-pika sides for benchmarks/bench.py")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--body-size", type=int, help="publish messages of this size")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--consume", metavar="QUEUE", help="consume from QUEUE instead")
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.consume:
        asyncio.run(consume(args.consume, args.count, args.prefetch))
    elif args.body_size is None:
        parser.error("--body-size is needed to publish")
    else:
        asyncio.run(publish(args.count, args.body_size, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
