"""PostgreSQL through psycopg 3 beside asyncpg: URLs, the claim's rows, missing drivers."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
from sqlalchemy.engine import make_url

from engine import DatabaseUrlError, OutboxEventPublisher, create_engine, unit_of_work
from engine.dispatch.claimer import Claimer
from engine.storage.database import parse_database_url
from engine.storage.drivers import connect_timeout_args

from .conftest import CTX

pytestmark = pytest.mark.all_drivers


def test_psycopg_urls_are_taken_and_spelt_one_way():
    assert parse_database_url("postgresql+psycopg://u:p@h/db").drivername == "postgresql+psycopg"
    async_name = parse_database_url("postgresql+psycopg_async://u:p@h/db")
    assert async_name.drivername == "postgresql+psycopg"
    # libpq spells it sslmode, and psycopg is libpq: the query stays as written.
    assert parse_database_url("postgresql+psycopg://u:p@h/db?sslmode=require").query == {
        "sslmode": "require"
    }
    assert parse_database_url("postgresql://u:p@h/db").drivername == "postgresql+asyncpg"
    with pytest.raises(DatabaseUrlError, match="postgresql\\+psycopg://user:pass@host/db"):
        parse_database_url("postgresql+pg8000://u:p@h/db")


def test_the_connect_timeout_is_spelt_as_each_driver_takes_it():
    assert connect_timeout_args(make_url("postgresql+asyncpg://h/db"), 2.5) == {"timeout": 2.5}
    assert connect_timeout_args(make_url("postgresql+psycopg://h/db"), 2.5) == {
        "connect_timeout": 3
    }


def test_a_missing_psycopg_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails
    with pytest.raises(DatabaseUrlError) as caught:
        create_engine("postgresql+psycopg://u:secret@h/db")
    message = str(caught.value)
    assert "outbox-tui[psycopg]" in message and "secret" not in message
    assert "\n" not in message


async def test_claimed_rows_keep_the_payload_as_stored_text(db, registry, clock):
    """The dispatcher decodes payloads itself (strictly) and the relay sends the stored
    text: on every driver the claim hands over the text, numbers as written."""
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        await OutboxEventPublisher(session).publish(
            "orders.cancelled",
            {"total": 12345678901234567.89, "big": 123456789012345678901234567890},
            aggregate_type="order",
            aggregate_id="o-1",
        )
    async with db.begin() as conn:
        batch = await Claimer("d", 10, timedelta(seconds=30)).claim(conn, clock.now)
    (row,) = batch.rows
    assert type(row.raw_payload) is str
    assert "123456789012345678901234567890" in row.raw_payload
    assert row.decoded_payload()["big"] == 123456789012345678901234567890
