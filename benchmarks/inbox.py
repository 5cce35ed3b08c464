"""The inbox's rows of ``make bench``: consuming into the outbox, and the chain end to end.

- ``consume``: ``outbox-tui consume`` takes N CloudEvents off a full queue into the
  outbox (batches committed, then acked), against raw aio-pika consuming the same queue
  with manual acks and doing nothing else (benchmarks.peer_amqp ``--consume``). Each side
  gets its own N messages, published beforehand as the relay publishes them.
- ``end_to_end``: service A's outbox, relayed by ``outbox-tui --dispatch --amqp-url``,
  through the exchange to service B's queue, into B's outbox by ``outbox-tui consume``,
  delivered by B's ``outbox-tui --dispatch`` to the benchmark handler; timed until B's
  outbox holds N published rows (the handler's call log, flushed at exit, then says that
  each ran once). Compared with A's relay alone (row g's side).

Every process waits for the go file in its installed app's ready hook (the consumer
awaits the hooks as the run loop does), so no start-up is on the clock. B's outbox lives
in a database of its own on the same server (``<database>_inbox_b``), made once.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

import aio_pika
from sqlalchemy.engine import make_url

from benchmarks import drains, peer_amqp, support
from benchmarks.support import Context, WorkerFailed
from engine import create_engine, create_schema
from engine.clock import uuid7
from engine.relay.cloudevents import encode_cloudevent, to_cloudevent
from engine.settings import DEFAULT_EXCHANGE
from engine.writing.envelope import EventEnvelope

INBOX_QUEUE = "outbox.bench.inbox"
B_QUEUE = "outbox.bench.b"
PREFETCH = 1000
PUBLISH_BATCH = 500


def _cloudevent(i: int) -> bytes:
    """What the relay sends for a preloaded benchmark event (support.cloudevent_size)."""
    envelope = EventEnvelope(
        uuid7(),
        "acme",
        support.EVENT_TYPE,
        1,
        "bench",
        str(i),
        json.loads(support.payload(i)),
        datetime.now(UTC),
    )
    return encode_cloudevent(to_cloudevent(envelope))


async def fill(url: str, count: int) -> None:
    """Empty the inbox queue and publish ``count`` CloudEvents into it, confirmed."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(INBOX_QUEUE, durable=True)
        await queue.purge()
        exchange = channel.default_exchange
        for start in range(0, count, PUBLISH_BATCH):
            messages = [
                aio_pika.Message(
                    _cloudevent(i),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    content_type="application/cloudevents+json",
                )
                for i in range(start, min(count, start + PUBLISH_BATCH))
            ]
            await asyncio.gather(*(exchange.publish(m, routing_key=INBOX_QUEUE) for m in messages))


async def prepare_b_queue(url: str) -> None:
    """B's queue, bound before A's relay publishes (an unroutable publish is a failure)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            DEFAULT_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(B_QUEUE, durable=True)
        await queue.bind(exchange, routing_key=peer_amqp.ROUTING_KEY)
        await queue.purge()


async def delete_queues(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in (INBOX_QUEUE, B_QUEUE):
            await channel.queue_delete(name)


def _consume_argv(ctx: Context, queue: str, *extra: str) -> list[str]:
    assert ctx.amqp_url is not None
    argv = [*support.outbox_cli(), "consume", "--installed-app", drains.OURS_APP]
    argv += ["--amqp-url", ctx.amqp_url, "--queue", queue, "--prefetch", str(PREFETCH)]
    return [*argv, *extra]


async def _exited(fleet: support.Fleet) -> bool:
    return all(p.poll() is not None for p in fleet.procs)


async def ours_consume(ctx: Context, events: int) -> dict[str, Any]:
    """``outbox-tui consume --max-messages N`` emptying a queue of N into the outbox."""
    assert ctx.amqp_url is not None
    await support.reset_outbox(ctx.conn)
    await fill(ctx.amqp_url, events)
    fleet = drains.new_fleet(ctx)
    argv = _consume_argv(ctx, INBOX_QUEUE, "--max-messages", str(events))
    fleet.start(argv, drains.ours_env(ctx, fleet))

    async def left() -> int:
        return events - int(await ctx.conn.fetchval("SELECT count(*) FROM outbox_events"))

    run = await drains._timed(
        ctx,
        fleet,
        label="ours: consume",
        total=events,
        empty=lambda: _exited(fleet),
        remaining=left,
        handler_calls=False,
    )
    stored = events - await left()
    if stored != events:
        raise WorkerFailed(f"consume: {stored} rows stored for {events} messages")
    return run


async def raw_consume(ctx: Context, events: int) -> dict[str, Any]:
    """aio-pika alone: the same queue, prefetch and count, one manual ack per message."""
    assert ctx.amqp_url is not None
    await fill(ctx.amqp_url, events)
    fleet = drains.new_fleet(ctx)
    env = fleet.env({"OUTBOX_BENCH_AMQP_URL": ctx.amqp_url})
    argv = [sys.executable, "-m", "benchmarks.peer_amqp", "--consume", INBOX_QUEUE]
    argv += ["--count", str(events), "--prefetch", str(PREFETCH)]
    fleet.start(argv, env)

    async def unknown() -> int:
        return events

    run = await drains._timed(
        ctx,
        fleet,
        label="aio-pika: consume",
        total=events,
        empty=lambda: _exited(fleet),
        remaining=unknown,
        handler_calls=False,
    )
    if await peer_amqp.queue_depth(ctx.amqp_url, INBOX_QUEUE):
        raise WorkerFailed("aio-pika: messages left in the queue")
    return run


async def b_database(ctx: Context) -> str:
    """Service B's database on the same server (made once), its outbox empty."""
    url = make_url(ctx.url)
    name = f"{url.database}_inbox_b"
    if not await ctx.conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
        await ctx.conn.execute(f'CREATE DATABASE "{name}"')
    b_url = url.set(database=name).render_as_string(hide_password=False)
    engine = create_engine(b_url)
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()
    conn = await support.connect(b_url)
    try:
        await support.reset_outbox(conn)
    finally:
        await conn.close()
    return b_url


async def end_to_end(ctx: Context, events: int) -> dict[str, Any]:
    """A's relay, B's consumer and B's dispatcher, until B's handler ran ``events`` times."""
    assert ctx.amqp_url is not None
    b_url = await b_database(ctx)
    await peer_amqp.delete_queue(ctx.amqp_url)  # bound to "#" on the exchange, it would fill
    await prepare_b_queue(ctx.amqp_url)
    await drains.load_outbox(ctx, events)
    fleet = drains.new_fleet(ctx)
    relay_env = drains.ours_env(ctx, fleet)
    relay_env["OUTBOX_AMQP_URL"] = ctx.amqp_url
    fleet.start(drains.ours_argv(ctx), relay_env)
    b_env = fleet.env({"OUTBOX_DATABASE_URL": b_url, "OUTBOX_LOG_LEVEL": "WARNING"})
    bind = f"{DEFAULT_EXCHANGE}:{peer_amqp.ROUTING_KEY}"
    fleet.start(_consume_argv(ctx, B_QUEUE, "--bind", bind), b_env)
    fleet.start(drains.ours_argv(ctx), b_env)

    b_conn = await support.connect(b_url)

    async def left() -> int:
        published = "SELECT count(*) FROM outbox_events WHERE status = 'published'"
        return events - int(await b_conn.fetchval(published))

    async def handled() -> bool:  # the handler's call log is flushed at exit: B's rows say
        return await left() <= 0

    try:
        return await drains._timed(
            ctx,
            fleet,
            label="ours: A → RabbitMQ → B",
            total=events,
            empty=handled,
            remaining=left,
        )
    finally:
        await b_conn.close()
