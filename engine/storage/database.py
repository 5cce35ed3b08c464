"""Connecting to the outbox database: URL checks, SQLite tuning, error translation.

SQLite notes: WAL lets readers (the console) run beside one writer; a busy
timeout makes a second writer wait instead of failing with "database is
locked"; and write transactions begin IMMEDIATE so a transaction that read
first can never fail to upgrade to a writer halfway through. Read-only callers
ask for deferred transactions with ``read_only_engine``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    NoSuchModuleError,
    SQLAlchemyError,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from engine.errors import (
    DatabaseAuthenticationError,
    DatabaseUnavailableError,
    DatabaseUrlError,
    SchemaMissingError,
    SchemaOutdatedError,
    StorageError,
)
from engine.storage.aiosqlite_connect import OneTripConnection, connect_aiosqlite
from engine.storage.schema import metadata, outbox_events
from engine.storage.secrets import mask_secrets, mask_url, raw_at_in_password

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./outbox.db"
# The program the engine's hints name (``outbox_tui.PROG`` is the same name; a test keeps
# them equal: the front end's stays import-light for its SIGTERM-first entry point).
PROGRAM = "outbox-tui"
INIT_DB = f"{PROGRAM} init-db"
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
_READ_ONLY_OPTION = "outbox_read_only"
_BUSY_TIMEOUT_OPTION = "outbox_busy_timeout"
# How long a dispatcher's claim and last heartbeat wait for SQLite's write lock: a claim
# that finds it held longer fails as a storage error and the run loop retries after a
# pause that a stop cuts short, so a SIGTERM is obeyed within seconds even while another
# process holds the lock for minutes (SQLite's own wait cannot be interrupted).
DISPATCHER_BUSY_TIMEOUT_SECONDS = 5.0
_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    # SQLAlchemy's two names for psycopg 3's async side: one spelling everywhere.
    "postgresql+psycopg_async": "postgresql+psycopg",
}
_SUPPORTED = ("sqlite+aiosqlite", "postgresql+asyncpg", "postgresql+psycopg")
# What to install for a driver the engine supports but the environment lacks.
_DRIVER_EXTRAS = {"postgresql+psycopg": "psycopg[binary] (pip install 'outbox-tui[psycopg]')"}


def parse_database_url(url: str | URL) -> URL:
    """Parse and normalise a URL to one of the supported async drivers.

    ``postgresql://`` and ``sqlite:///`` are accepted and mapped to asyncpg and
    aiosqlite; ``postgresql+psycopg://`` is psycopg 3 (async); anything else is a
    ``DatabaseUrlError`` naming the problem.
    """
    if isinstance(url, str) and raw_at_in_password(url):
        raise DatabaseUrlError(
            f"invalid database URL {mask_url(url)!r}: its password holds a raw '@'; "
            "percent-encode it (@ as %40)"
        )
    try:
        parsed = make_url(url) if isinstance(url, str) else url
        parsed.port  # noqa: B018 - a non-numeric port only fails when read
    except (ArgumentError, ValueError) as exc:
        detail = mask_secrets(str(exc), str(url))
        raise DatabaseUrlError(f"invalid database URL {mask_url(str(url))!r}: {detail}") from None
    name = parsed.drivername
    if name in _ASYNC_DRIVERS:
        parsed = parsed.set(drivername=_ASYNC_DRIVERS[name])
    if parsed.drivername not in _SUPPORTED:
        raise DatabaseUrlError(
            f"unsupported database URL scheme {name!r} in {mask_url(parsed)!r}: "
            "use sqlite+aiosqlite:///path.db, postgresql+asyncpg://user:pass@host/db "
            "or postgresql+psycopg://user:pass@host/db"
        )
    if parsed.drivername == "postgresql+asyncpg" and "sslmode" in parsed.query:
        # libpq spells it sslmode; asyncpg takes the same values as ssl.
        query = dict(parsed.query)
        query["ssl"] = query.pop("sslmode")
        parsed = parsed.set(query=query)
    if parsed.drivername.startswith("sqlite") and _in_memory(parsed):
        raise DatabaseUrlError(
            "an in-memory SQLite database lasts as long as one connection and no other "
            "process sees it: give a file path, e.g. sqlite+aiosqlite:///./outbox.db"
        )
    return parsed


def _in_memory(url: URL) -> bool:
    """``sqlite://``, ``sqlite:///:memory:`` or a URI with ``mode=memory`` or the name
    ``file::memory:``: a database each connection (each process) makes anew and that
    vanishes with it."""
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        return True
    uri = url.query.get("uri") in ("true", "1")
    return uri and database.startswith("file::memory:")


def same_database(a: URL, b: URL) -> bool:
    """Whether two URLs name one database, whatever the driver, user or password: the
    same server and database name, or the same SQLite file."""
    if a.get_backend_name() != b.get_backend_name():
        return False
    if a.get_backend_name() == "sqlite":
        return Path(a.database or "").resolve() == Path(b.database or "").resolve()
    return (a.host or "localhost", a.port or 5432, a.database) == (
        b.host or "localhost",
        b.port or 5432,
        b.database,
    )


def create_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """Create an ``AsyncEngine`` tuned for the outbox on SQLite or PostgreSQL."""
    parsed = parse_database_url(url)
    if parsed.drivername.startswith("sqlite"):
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_SECONDS)
        connect_args.setdefault("async_creator_fn", connect_aiosqlite)
        try:
            engine = create_async_engine(parsed, connect_args=connect_args, **kwargs)
        except NoSuchModuleError as exc:  # pragma: no cover - driver missing from install
            raise DatabaseUrlError(str(exc)) from None
        _tune_sqlite(engine)
        return engine
    # No pool_pre_ping: a ping per checkout is one more round trip on every business
    # transaction. A connection that died with its server fails once, is invalidated by
    # SQLAlchemy, and the run loop and console retry.
    try:
        return create_async_engine(parsed, **kwargs)
    except ImportError as exc:  # the driver of a supported scheme is not installed
        need = _DRIVER_EXTRAS.get(parsed.drivername, exc.name or "its driver")
        raise DatabaseUrlError(
            f"{parsed.drivername} needs {need}, which is not installed ({exc})"
        ) from None


def read_only_engine(engine: AsyncEngine) -> AsyncEngine:
    """A view of ``engine`` whose transactions never take SQLite's write lock."""
    return engine.execution_options(**{_READ_ONLY_OPTION: True})


def waiting_at_most(engine: AsyncEngine, seconds: float) -> AsyncEngine:
    """A view of ``engine`` whose SQLite transactions wait at most ``seconds`` for the
    write lock (instead of ``SQLITE_BUSY_TIMEOUT_SECONDS``); PostgreSQL ignores it."""
    return engine.execution_options(**{_BUSY_TIMEOUT_OPTION: seconds})


def configure_sqlite_connection(dbapi_connection: Any, _record: Any = None) -> None:
    """Every SQLite connection, async or sync: WAL, the busy timeout, foreign keys, and
    driver autocommit off so that the engine's "begin" listener emits BEGIN itself."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _tune_sqlite(engine: AsyncEngine) -> None:
    sync_engine = engine.sync_engine

    event.listen(sync_engine, "connect", configure_sqlite_connection)

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        options = connection.get_execution_options()
        if options.get(_READ_ONLY_OPTION):
            mode, wait = "DEFERRED", None
        else:
            # A bounded wait for the write lock.
            mode, wait = "IMMEDIATE", options.get(_BUSY_TIMEOUT_OPTION)
        driver: OneTripConnection = connection.connection.driver_connection
        try:
            await_only(driver.begin(mode, wait, SQLITE_BUSY_TIMEOUT_SECONDS))
        except sqlite3.Error as exc:  # as SQLAlchemy raises a statement's error
            raise DBAPIError.instance(
                f"BEGIN {mode}", None, exc, sqlite3.Error, dialect=connection.dialect
            ) from exc


def is_postgresql(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"


_MISSING_TABLE = re.compile(r"no such table|relation \"?[\w.]+\"? does not exist|UndefinedTable")


def translate_storage_error(exc: BaseException, url: str | URL | None = None) -> StorageError:
    """Turn a driver or SQLAlchemy error into the engine's own one-line error."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = detail[0] if detail else type(exc).__name__
    if url is not None:
        first = mask_secrets(first, url)
    if _MISSING_TABLE.search(str(exc)):
        return SchemaMissingError(
            f"the outbox tables are missing ({first}); create them with `{INIT_DB}`"
        )
    where = f" at {mask_url(url)}" if url is not None else ""
    if _is_authentication_error(exc):
        return DatabaseAuthenticationError(
            f"the database refused the login{where}: {first} (check the user name and password)"
        )
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)) or _is_connection_error(exc):
        return DatabaseUnavailableError(f"cannot reach the database{where}: {first}")
    if "readonly database" in first:  # SQLite: WAL writes beside the file, even to read
        return StorageError(
            f"database error: {first}: this user cannot write the SQLite file or its "
            "directory (in WAL mode even a reader needs the -wal and -shm files beside it)"
        )
    return StorageError(f"database error: {first}")


_UNKNOWN_CONNECT_ARGUMENT = re.compile(r"connect\(\) got an unexpected keyword argument '(\w+)'")


# PostgreSQL's SQLSTATEs for a refused login: invalid_password, and
# invalid_authorization_specification (no such role, or pg_hba.conf rejects it).
_AUTHENTICATION_SQLSTATES = ("28P01", "28000")


def _is_authentication_error(exc: BaseException) -> bool:
    """The server answered, and refused the credentials (not: it could not be reached)."""
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code in _AUTHENTICATION_SQLSTATES:
        return True
    text_ = str(exc).lower()
    return "password authentication failed" in text_ or "no pg_hba.conf entry" in text_


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    text_ = str(exc).lower()
    return any(
        marker in text_
        for marker in (
            "connection refused",
            "connect call failed",
            "unable to open database",
            "could not connect",
            "connection was closed",
            "connection is closed",
            "does not exist",
            "name or service not known",
            "timeout",
        )
    )


@asynccontextmanager
async def storage_errors(url: str | URL | None = None) -> AsyncIterator[None]:
    """Re-raise driver errors inside the block as ``StorageError`` subclasses."""
    try:
        yield
    except StorageError:
        raise
    except (SQLAlchemyError, OSError, ConnectionError, TimeoutError) as exc:
        raise translate_storage_error(exc, url) from exc
    except TypeError as exc:
        # A URL query parameter the driver's connect() does not take (``?bogus=1``).
        unknown = _UNKNOWN_CONNECT_ARGUMENT.search(str(exc))
        if unknown is None:
            raise
        raise DatabaseUrlError(
            f"the database URL has a query parameter its driver does not take: {unknown.group(1)!r}"
        ) from None
    except Exception as exc:  # asyncpg raises its own tree outside SQLAlchemy at connect
        if type(exc).__module__.startswith(("asyncpg", "psycopg", "sqlite3", "aiosqlite")):
            raise translate_storage_error(exc, url) from exc
        raise


async def create_schema(engine_or_url: AsyncEngine | str | URL) -> list[str]:
    """Create the outbox tables and indexes, or upgrade older ones (idempotent).

    Returns the upgrade steps applied to tables an earlier version made (see
    engine.storage.migrations); empty for a new or current database.
    """
    from engine.storage.migrations import missing_tables, upgrade_schema

    if isinstance(engine_or_url, AsyncEngine):
        async with storage_errors(engine_or_url.url), engine_or_url.begin() as conn:
            absent = await conn.run_sync(missing_tables)
            await conn.run_sync(metadata.create_all, checkfirst=True)
            steps = await upgrade_schema(conn)
        if outbox_events.name in absent:
            return steps  # a new database: created, nothing upgraded
        return [f"created table {name}" for name in absent] + steps
    engine = create_engine(engine_or_url)
    try:
        return await create_schema(engine)
    finally:
        await engine.dispose()


async def check_schema(engine: AsyncEngine) -> None:
    """Raise ``SchemaMissingError`` unless the outbox tables exist and answer, or
    ``SchemaOutdatedError`` when an earlier version made them."""
    from engine.storage.migrations import outdated_parts

    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        await conn.execute(text("SELECT 1 FROM outbox_events WHERE 1 = 0"))
        missing = await conn.run_sync(outdated_parts)
    if missing:
        raise SchemaOutdatedError(
            f"the outbox tables are from an earlier version (missing {', '.join(missing)}); "
            f"upgrade them in place with `{INIT_DB}`"
        )
