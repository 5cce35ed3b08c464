"""The real services that `make test` starts answer: these guard the CI setup itself."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

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


SERVICES = Path(__file__).parent.parent / "scripts" / "services.sh"


@pytest.mark.parametrize("port", ["56672", "45536", "0", "5672x"])
def test_rmq_up_refuses_a_port_whose_distribution_port_would_pass_65535(
    tmp_path: Path, port: str
) -> None:
    """Issue 43, defect 8: ``rmq_up DIR 56672`` tried port 76672 for Erlang distribution
    and failed with only ``tail: cannot open …/log/*.log``. (RMQBIN points nowhere: the
    port is checked before anything else, so no broker is needed, and none is started.)"""
    base = tmp_path / "rmq"
    done = subprocess.run(
        ["bash", "-c", f'. "{SERVICES}"; rmq_up "{base}" {port}'],
        capture_output=True,
        text=True,
        env={**os.environ, "RMQBIN": str(tmp_path / "no-rabbitmq")},
        timeout=30,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("services.sh: rmq_up: PORT "), done.stderr
    if port.isdigit():
        assert "out of range" in lines[0] and "from 1 to 45535" in lines[0]
        assert "PORT+20000" in lines[0]
    assert not base.exists()
