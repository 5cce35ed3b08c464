"""The real services that `make test` starts answer: these guard the CI setup itself."""

from __future__ import annotations

import uuid

import aio_pika
import asyncpg
import pytest
from pamqp.commands import Basic
from sqlalchemy.engine import make_url


@pytest.mark.postgresql
async def test_postgresql_answers_in_a_fresh_database(pg_url: str) -> None:
    url = make_url(pg_url)
    conn = await asyncpg.connect(**url.translate_connect_args(username="user"))
    try:
        assert await conn.fetchval("select 1") == 1
        assert await conn.fetchval("select current_database()") == url.database
        tables = await conn.fetchval("select count(*) from pg_tables where schemaname = 'public'")
        assert tables == 0
    finally:
        await conn.close()


@pytest.mark.rabbitmq
async def test_rabbitmq_confirms_and_returns_a_message(amqp_url: str) -> None:
    connection = await aio_pika.connect(amqp_url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(exclusive=True)  # server-named, gone on close
        body = uuid.uuid4().bytes
        confirmation = await channel.default_exchange.publish(
            aio_pika.Message(body, message_id=body.hex()),
            routing_key=queue.name,
            mandatory=True,
            timeout=10,
        )
        assert isinstance(confirmation, Basic.Ack)

        incoming = await queue.get(timeout=10, fail=True)
        assert incoming is not None
        await incoming.ack()
        assert incoming.body == body
        assert incoming.message_id == body.hex()
