"""Shared fixtures: database URLs (SQLite, real PostgreSQL) and the real RabbitMQ URL.

`make test` (scripts/test.sh) starts PostgreSQL and RabbitMQ and exports OUTBOX_TEST_PG_URL
and OUTBOX_TEST_AMQP_URL. Tests that need them fail, never skip, when they are missing, so a
broken CI setup cannot pass silently.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import create_engine, create_schema

PG_URL_ENV = "OUTBOX_TEST_PG_URL"
AMQP_URL_ENV = "OUTBOX_TEST_AMQP_URL"


def _asyncpg_connect_args(url: URL) -> dict[str, object]:
    """asyncpg.connect() keyword arguments for a `postgresql+asyncpg://` SQLAlchemy URL."""
    return url.translate_connect_args(username="user")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/outbox.db"


async def _drop_database(admin: asyncpg.Connection, name: str) -> None:
    """DROP ... WITH (FORCE), retried while an autovacuum worker is inside the database.

    FORCE ends the sessions a test leaked, but a non-superuser may not end an
    autovacuum worker ("must be a member of the role whose process is being
    terminated"); the worker leaves within moments, so try again.
    """
    for attempt in range(50):
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except asyncpg.exceptions.InsufficientPrivilegeError:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for this test, dropped afterwards."""
    server_url = os.environ.get(PG_URL_ENV)
    if not server_url:
        pytest.fail(
            f"{PG_URL_ENV} is not set: run the suite with `make test`, which starts PostgreSQL"
        )
    admin_url = make_url(server_url)
    name = f"t_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(**_asyncpg_connect_args(admin_url))
    try:
        # FILE_COPY (PostgreSQL 15+) copies template0's files, faster than the default
        # WAL_LOG, which writes every page of the copy to the WAL (decision 0034).
        strategy = " STRATEGY FILE_COPY" if admin.get_server_version().major >= 15 else ""
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0{strategy}')
        try:
            yield admin_url.set(database=name).render_as_string(hide_password=False)
        finally:
            await _drop_database(admin, name)
    finally:
        await admin.close()


@pytest.fixture
def psycopg_url(pg_url: str) -> str:
    """The fresh PostgreSQL database of ``pg_url``, reached through psycopg 3."""
    return (
        make_url(pg_url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    )


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("psycopg", marks=pytest.mark.postgresql),
    ]
)
def database_url(request: pytest.FixtureRequest) -> str:
    """The same test body against SQLite and against the real PostgreSQL (asyncpg).

    Tests marked ``all_drivers`` (a module: ``pytestmark = pytest.mark.all_drivers``)
    also run on PostgreSQL through psycopg 3; the others' psycopg variants are
    deselected at collection.
    """
    fixture = {"sqlite": "sqlite_url", "postgresql": "pg_url", "psycopg": "psycopg_url"}
    url: str = request.getfixturevalue(fixture[request.param])
    return url


@pytest.fixture
def amqp_url() -> str:
    url = os.environ.get(AMQP_URL_ENV)
    if not url:
        pytest.fail(
            f"{AMQP_URL_ENV} is not set: run the suite with `make test`, which starts RabbitMQ"
        )
    return url


class FakeClock:
    """A clock tests move by hand, so leases, backoff and retention are exact."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a fresh database (SQLite and PostgreSQL) with the outbox schema."""
    engine = create_engine(database_url)
    await create_schema(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


# Fixtures that stop or restart a service every test shares: such tests run alone, after
# the parallel part of `make test` (scripts/test.sh), never beside a test using it.
SERVICE_CONTROL_FIXTURES = {"broker"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, psycopg_only = [], []
    for item in items:
        if SERVICE_CONTROL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)
        callspec = getattr(item, "callspec", None)
        on_psycopg = callspec is not None and callspec.params.get("database_url") == "psycopg"
        if on_psycopg and item.get_closest_marker("all_drivers") is None:
            psycopg_only.append(item)
        else:
            kept.append(item)
    if psycopg_only:
        config.hook.pytest_deselected(items=psycopg_only)
        items[:] = kept


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the fault suite (tests/reliability) at soak sizes instead of CI sizes",
    )


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    """True under ``--soak``: a fault scenario runs longer, with more events and faults."""
    return bool(request.config.getoption("--soak"))
