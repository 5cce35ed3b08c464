"""Opening the outbox database for a purpose: one place for pools, timeouts and checks.

Each front end used to build its own engine with its own PostgreSQL connect
timeout and its own "missing SQLite file" message; ``open_engine`` names the
purpose instead:

- ``command``: a one-shot CLI command (a small default pool);
- ``console``: must notice when the database goes away (SQLite opened ``mode=rw``
  so a missing file is an error, never a new empty database, and a pooled
  connection is dropped at checkout once its file was moved, replaced or deleted);
- ``dispatcher``: the run loop (the console's ``s`` and ``outbox-tui dispatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import ConnectionPoolEntry

from engine.errors import DatabaseUnavailableError, SchemaMissingError, SchemaOutdatedError
from engine.service.sqlite_workers import settle_sqlite_workers
from engine.storage.aiosqlite_connect import OneTripConnection, connect_aiosqlite
from engine.storage.database import (
    INIT_DB,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    check_schema,
    create_engine,
    parse_database_url,
    storage_errors,
)
from engine.storage.drivers import connect_timeout_args
from engine.storage.secrets import mask_url

Purpose = Literal["command", "console", "dispatcher"]
# One connect timeout for every purpose: an unreachable server is reported in seconds.
PG_CONNECT_TIMEOUT_SECONDS = 10.0
CHECK_TIMEOUT_SECONDS = 20.0


def sqlite_path(database_url: str | URL) -> Path | None:
    """The absolute file path of a SQLite URL (None for PostgreSQL or in-memory)."""
    url = parse_database_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database:
        return None
    return Path(url.database).absolute()


def require_database_file(database_url: str | URL) -> None:
    """Reading must not create an empty SQLite file as a side effect: say how to create it."""
    path = sqlite_path(database_url)
    if path is None:
        return
    if not path.exists():
        raise SchemaMissingError(
            f"no SQLite database at {path}; create it with "
            f"`{INIT_DB} --database-url {mask_url(database_url)}`"
        )
    if path.is_dir():  # said plainly rather than as the driver's "unable to open database file"
        raise DatabaseUnavailableError(f"{path} is a directory, not a SQLite database file")


def open_engine(database_url: str | URL, purpose: Purpose) -> AsyncEngine:
    """An engine configured for ``purpose``; nothing connects until it is used."""
    url = parse_database_url(database_url)
    if url.get_backend_name() == "sqlite":
        if purpose != "console":
            return create_engine(url)
        path = Path(url.database or "").absolute()
        uri = path.as_uri() + "?mode=rw"

        async def connect() -> OneTripConnection:
            return await connect_aiosqlite(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_SECONDS)

        # Pooled: each new aiosqlite connection starts a thread, and Thread.start() holds
        # the event loop until that thread runs (see decision 0032). A pooled connection
        # would keep reading a file that was moved or deleted, so one whose file is no
        # longer the one it opened is dropped at checkout.
        engine = create_engine(url, pool_size=2, max_overflow=2, async_creator=connect)
        _drop_when_the_file_changes(engine, path)
        return engine
    kwargs: dict[str, Any] = {"connect_args": connect_timeout_args(url, PG_CONNECT_TIMEOUT_SECONDS)}
    if purpose == "console":
        kwargs.update(pool_size=2, max_overflow=2)
    return create_engine(url, **kwargs)


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _drop_when_the_file_changes(engine: AsyncEngine, path: Path) -> None:
    """Check out only connections to the file now at ``path`` (one stat per checkout)."""

    @event.listens_for(engine.sync_engine, "connect")
    def _opened(_dbapi: object, record: ConnectionPoolEntry) -> None:
        record.info["file"] = _file_identity(path)

    @event.listens_for(engine.sync_engine, "checkout")
    def _checkout(_dbapi: object, record: ConnectionPoolEntry, _proxy: object) -> None:
        if record.info.get("file") != _file_identity(path):
            # The pool drops this connection and opens a new one, which fails plainly
            # ("unable to open database file") while the file is gone.
            raise DisconnectionError(f"{path} was moved, replaced or deleted")


async def dispose(engine: AsyncEngine) -> None:
    """Dispose ``engine`` and let aiosqlite's threads end before the event loop closes."""
    with contextlib.suppress(Exception):
        await engine.dispose()
    await settle_sqlite_workers()


async def check_database(engine: AsyncEngine) -> None:
    """The outbox tables answer and are current; otherwise one line saying what to do."""
    masked = mask_url(engine.url)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS), storage_errors(engine.url):
            await check_schema(engine)
    except (SchemaMissingError, SchemaOutdatedError) as exc:
        # The engine's message says `outbox-tui init-db`; name the database it must run on.
        hint = f"`{INIT_DB} --database-url {masked}`"
        raise type(exc)(str(exc).replace(f"`{INIT_DB}`", hint)) from None
    except TimeoutError:
        raise DatabaseUnavailableError(
            f"the database at {masked} did not answer within {CHECK_TIMEOUT_SECONDS:g}s; "
            "check that it is running and reachable"
        ) from None


@contextlib.asynccontextmanager
async def open_database(
    database_url: str | URL, purpose: Purpose, *, need_schema: bool = True
) -> AsyncIterator[AsyncEngine]:
    """An engine for ``purpose``, disposed on exit; with ``need_schema`` the tables must exist."""
    if need_schema:
        require_database_file(database_url)
    engine = open_engine(database_url, purpose)
    try:
        async with storage_errors(engine.url):
            if need_schema:
                await check_database(engine)
            yield engine
    finally:
        await dispose(engine)
